"""LongBench v1 and LongBench-E (Bai et al., 2023) from the official JSONL files, as ``LongBench/pred.py`` + ``eval.py``.

Data: the release's ``data.zip`` unzips to a folder of ``{dataset}.jsonl`` (21 datasets) and
``{dataset}_e.jsonl`` (13 LongBench-E datasets); each line holds ``input``, ``context``, ``answers`` (list),
``length`` (words; characters for Chinese), ``dataset``, ``language``, ``all_classes`` and ``_id``. Nothing is
downloaded: ``data=`` names that folder (or its parent holding ``data/``).

Per item, exactly as pred.py does it:

1. the prompt is the dataset's template of ``config/dataset2prompt.json`` filled with ``context`` and
   ``input`` (:data:`PROMPTS`, verbatim, including narrativeqa's "asconcisely");
2. it is tokenized with the tokenizer's default special tokens; when longer than the budget
   ``max_length`` (here each of ``lengths``), it becomes ``decode(ids[:half]) + decode(ids[-half:])``
   with ``half = int(max_length / 2)`` and special tokens skipped (middle truncation, :func:`middle_truncate`);
3. only with ``chat=True``, the result is wrapped in the tokenizer's chat template, except for trec,
   triviaqa, samsum, lsht, lcc and repobench-p, which stay raw text (:data:`NO_CHAT`); the rendered template
   is encoded without adding special tokens, since it carries its own (pred.py's hand-written templates
   get the tokenizer's BOS added, which the shipped templates spell out themselves);
4. greedy decoding of at most ``dataset2maxlen`` new tokens (:data:`MAX_NEW_TOKENS`); samsum also stops at
   "\\n" and must generate at least one token (pred.py's ``min_length=context_length+1``);
5. the new tokens are decoded with special tokens skipped and scored by the dataset's metric
   (:mod:`ropekit.eval.text_metrics`), max over the gold answers, the few-shot datasets cut to their first
   line first.

LongBench-E items also carry their length bucket: "0-4k" (``length`` < 4000), "4-8k" (< 8000), "8k+".
The budget is a prompt-token budget (pred.py's ``model2maxlen``: 3500 for 4k models, 31500 for 32k
ones), so the model sees up to budget + template + max new tokens positions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.jsonl import jsonl_rows
from ..errors import RopekitError
from ..install import rope_info
from . import text_metrics
from .common import EvalContext, encode, eos_ids, greedy_generate, mean, require_tokenizer, timer, token_lengths, whole_number

KEY_FIELDS = ("dataset", "sample")

#: The release archive; its ``data/`` folder holds the JSONL files this task reads.
DATA_URL = "https://huggingface.co/datasets/THUDM/LongBench/resolve/main/data.zip"

#: The 21 LongBench v1 datasets in the paper's order.
DATASETS = (
    "narrativeqa", "qasper", "multifieldqa_en", "multifieldqa_zh", "hotpotqa", "2wikimqa", "musique",
    "dureader", "gov_report", "qmsum", "multi_news", "vcsum", "trec", "triviaqa", "samsum", "lsht",
    "passage_count", "passage_retrieval_en", "passage_retrieval_zh", "lcc", "repobench-p",
)

#: The 13 English datasets of LongBench-E (files ``{name}_e.jsonl``).
E_DATASETS = (
    "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news", "trec", "triviaqa",
    "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p",
)

#: LongBench's six task categories (Bai et al. 2024, ACL, Table 1) and their datasets per language: the leaderboard's
#: "Avg" of a language is the mean of its category means, and code completion counts in both languages.
CATEGORIES = {
    "en": {"single-doc QA": ("narrativeqa", "qasper", "multifieldqa_en"),
           "multi-doc QA": ("hotpotqa", "2wikimqa", "musique"),
           "summarization": ("gov_report", "qmsum", "multi_news"),
           "few-shot": ("trec", "triviaqa", "samsum"),
           "synthetic": ("passage_count", "passage_retrieval_en"),
           "code": ("lcc", "repobench-p")},
    "zh": {"single-doc QA": ("multifieldqa_zh",), "multi-doc QA": ("dureader",), "summarization": ("vcsum",),
           "few-shot": ("lsht",), "synthetic": ("passage_retrieval_zh",), "code": ("lcc", "repobench-p")},
}

#: Every name ``tasks=`` accepts: the v1 datasets, then the LongBench-E variants.
ALL_NAMES = DATASETS + tuple(f"{d}_e" for d in E_DATASETS)

# config/dataset2prompt.json of THUDM/LongBench (LongBench/ folder, v1), verbatim.
_QA_MULTI = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other words."
    "\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give "
    "me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"
)
PROMPTS: dict[str, str] = {
    "narrativeqa": (
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the question "
        "asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nStory: {context}"
        "\n\nNow, answer the question based on the story asconcisely as you can, using a single phrase if possible. "
        "Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:"
    ),
    "qasper": (
        "You are given a scientific article and a question. Answer the question as concisely as you can, using a "
        "single phrase or sentence if possible. If the question cannot be answered based on the information in the "
        "article, write \"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or "
        "\"unanswerable\". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question based on the "
        "above article as concisely as you can, using a single phrase or sentence if possible. If the question cannot "
        "be answered based on the information in the article, write \"unanswerable\". If the question is a yes/no "
        "question, answer \"yes\", \"no\", or \"unanswerable\". Do not provide any explanation.\n\nQuestion: {input}"
        "\n\nAnswer:"
    ),
    "multifieldqa_en": (
        "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on the "
        "above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "multifieldqa_zh": (
        "阅读以下文字并用中文简短回答：\n\n{context}\n\n现在请基于上面的文章回答下面的问题，只告诉我答案，不要输出任何其他字词。"
        "\n\n问题：{input}\n回答："
    ),
    "hotpotqa": _QA_MULTI,
    "2wikimqa": _QA_MULTI,
    "musique": _QA_MULTI,
    "dureader": "请基于给定的文章回答下述问题。\n\n文章：{context}\n\n请基于上述文章回答下面的问题。\n\n问题：{input}\n回答：",
    "gov_report": (
        "You are given a report by a government agency. Write a one-page summary of the report.\n\nReport:\n{context}"
        "\n\nNow, write a one-page summary of the report.\n\nSummary:"
    ),
    "qmsum": (
        "You are given a meeting transcript and a query containing a question or instruction. Answer the query in one "
        "or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above meeting transcript "
        "in one or more sentences.\n\nQuery: {input}\nAnswer:"
    ),
    "multi_news": (
        "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\nNow, "
        "write a one-page summary of all the news.\n\nSummary:"
    ),
    "vcsum": "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n会议总结：",
    "trec": "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}",
    "triviaqa": (
        "Answer the question based on the given passage. Only give me the answer and do not output any other words. "
        "The following are some examples.\n\n{context}\n\n{input}"
    ),
    "samsum": "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}",
    "lsht": "请判断给定新闻的类别，下面是一些例子。\n\n{context}\n{input}",
    "passage_count": (
        "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully read "
        "these paragraphs and determine how many unique paragraphs there are after removing duplicates. In other "
        "words, how many non-repeating paragraphs are there in total?\n\n{context}\n\nPlease enter the final count of "
        "unique paragraphs after removing duplicates. The output format should only contain the number, such as 1, 2, "
        "3, and so on.\n\nThe final answer is: "
    ),
    "passage_retrieval_en": (
        "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the abstract "
        "is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\nPlease enter the number of the paragraph "
        "that the abstract is from. The answer format must be like \"Paragraph 1\", \"Paragraph 2\", etc.\n\n"
        "The answer is: "
    ),
    "passage_retrieval_zh": (
        "以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n{context}\n\n下面是一个摘要\n\n{input}\n\n"
        "请输入摘要所属段落的编号。答案格式必须是\"段落1\"，\"段落2\"等格式\n\n答案是："
    ),
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}

#: config/dataset2maxlen.json: the new-token budget of each dataset.
MAX_NEW_TOKENS: dict[str, int] = {
    "narrativeqa": 128, "qasper": 128, "multifieldqa_en": 64, "multifieldqa_zh": 64, "hotpotqa": 32,
    "2wikimqa": 32, "musique": 32, "dureader": 128, "gov_report": 512, "qmsum": 512, "multi_news": 512,
    "vcsum": 512, "trec": 64, "triviaqa": 32, "samsum": 128, "lsht": 64, "passage_count": 32,
    "passage_retrieval_en": 32, "passage_retrieval_zh": 32, "lcc": 64, "repobench-p": 64,
}

#: eval.py's dataset2metric (names of :data:`ropekit.eval.text_metrics.METRICS`).
METRIC: dict[str, str] = {
    "narrativeqa": "qa_f1", "qasper": "qa_f1", "multifieldqa_en": "qa_f1", "multifieldqa_zh": "qa_f1_zh",
    "hotpotqa": "qa_f1", "2wikimqa": "qa_f1", "musique": "qa_f1", "dureader": "rouge_zh", "gov_report": "rouge",
    "qmsum": "rouge", "multi_news": "rouge", "vcsum": "rouge_zh", "trec": "classification", "triviaqa": "qa_f1",
    "samsum": "rouge", "lsht": "classification", "passage_count": "count", "passage_retrieval_en": "retrieval",
    "passage_retrieval_zh": "retrieval_zh", "lcc": "code_sim", "repobench-p": "code_sim",
}

#: Datasets pred.py never wraps in a chat template ("chat models are better off without build prompts").
NO_CHAT = ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p")

#: LongBench-E length buckets (eval.py's scorer_e), on the item's ``length`` field.
BUCKETS = ("0-4k", "4-8k", "8k+")

_REQUIRED = ("input", "context", "answers", "_id")
_MAX_NEW_TOKENS_MAX = max(MAX_NEW_TOKENS.values())


def base_name(name: str) -> str:
    """``hotpotqa_e`` → ``hotpotqa``; a v1 name is returned unchanged."""
    return name[:-2] if name.endswith("_e") and name[:-2] in E_DATASETS else name


def bucket_of(length: float) -> str:
    """LongBench-E's bucket of an item ``length``: "0-4k" below 4000, "4-8k" below 8000, else "8k+"."""
    if length < 4000:
        return "0-4k"
    if length < 8000:
        return "4-8k"
    return "8k+"


def format_prompt(dataset: str, item: dict[str, Any]) -> str:
    """The dataset's template filled with the item's ``context`` and ``input`` (pred.py ``prompt_format.format``)."""
    return PROMPTS[base_name(dataset)].format(context=item["context"], input=item["input"])


def middle_truncate(tokenizer, prompt: str, max_length: int) -> tuple[str, int, bool]:
    """pred.py's middle truncation: ``(prompt', tokens before, truncated?)``.

    The prompt is tokenized with the tokenizer's default special tokens; when it has more than
    ``max_length`` tokens it becomes ``decode(ids[:half]) + decode(ids[-half:])`` (special tokens skipped)
    with ``half = int(max_length / 2)``, keeping the instructions at both ends.
    """
    if max_length < 2:
        # half would be 0 and ids[-0:] is the whole list: the original would silently keep everything
        raise RopekitError(f"LongBench budget {max_length} is below 2 tokens", "pass --lengths with budgets ≥ 2, e.g. 3500")
    ids = encode(tokenizer, prompt, add_special_tokens=True)
    if len(ids) <= max_length:
        return prompt, len(ids), False
    half = int(max_length / 2)
    head = tokenizer.decode(ids[:half], skip_special_tokens=True)
    tail = tokenizer.decode(ids[-half:], skip_special_tokens=True)
    return head + tail, len(ids), True


def apply_chat(tokenizer, prompt: str) -> list[int]:
    """Token ids of ``prompt`` as one user turn of the tokenizer's chat template, ready for the answer."""
    if not getattr(tokenizer, "chat_template", None):
        raise RopekitError("--chat was given but the tokenizer has no chat template", "drop --chat for a base model")
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    # the template spells out every special token the model expects (a BOS too, where it wants one), so nothing
    # is added: as transformers' apply_chat_template(tokenize=True) and the RULER and NIAH prompts encode it
    return encode(tokenizer, text, add_special_tokens=False)


def build_input(tokenizer, dataset: str, item: dict[str, Any], max_length: int, *, chat: bool = False) -> tuple[list[int], dict[str, Any]]:
    """The token ids pred.py feeds the model for ``item`` under budget ``max_length``, and facts for the record."""
    prompt, original, truncated = middle_truncate(tokenizer, format_prompt(dataset, item), max_length)
    if chat and base_name(dataset) not in NO_CHAT:
        ids = apply_chat(tokenizer, prompt)
    else:
        ids = encode(tokenizer, prompt, add_special_tokens=True)
    return ids, {"prompt_tokens_full": original, "prompt_tokens": len(ids), "truncated": truncated}


def end_tokens(tokenizer, dataset: str, model=None, *, chat: bool = False) -> list[int]:
    """The ids that end generation: the tokenizer's and ``model``'s end tokens (:func:`eos_ids`; with ``chat``,
    where :func:`build_input` wraps this dataset in the chat template, the end of the turn too), plus the id of
    "\\n" for samsum (pred.py)."""
    ids = eos_ids(tokenizer, model, chat=chat and base_name(dataset) not in NO_CHAT)
    if base_name(dataset) == "samsum":
        newline = encode(tokenizer, "\n", add_special_tokens=False)[-1]
        if newline not in ids:
            ids.append(newline)
    return ids


def score_item(dataset: str, prediction: str, item: dict[str, Any]) -> float:
    """eval.py's item score: the dataset metric, max over ``answers``, few-shot datasets cut to their first line."""
    name = base_name(dataset)
    return text_metrics.best_score(
        METRIC[name], prediction, item["answers"], all_classes=item.get("all_classes"),
        cut_first_line=name in text_metrics.FIRST_LINE_DATASETS,
    )


# ---- data ---------------------------------------------------------------------------------------------
def _missing_data(problem: str) -> RopekitError:
    return RopekitError(
        problem,
        f"download data.zip from the LongBench release ({DATA_URL}), unzip it and pass --data DIR, where DIR holds "
        "files named like hotpotqa.jsonl, narrativeqa.jsonl, …, and hotpotqa_e.jsonl for LongBench-E",
    )


def data_dir(data: str | Path | None) -> Path:
    """The folder holding the JSONL files: ``data`` itself, or its ``data/`` subfolder (the unzipped archive)."""
    if data is None:
        raise _missing_data("the 'longbench' evaluation needs the LongBench data and --data was not given")
    root = Path(data).expanduser()
    if not root.is_dir():
        raise _missing_data(f"LongBench data directory '{root}' does not exist")
    for folder in (root, root / "data"):
        if folder.is_dir() and any((folder / f"{n}.jsonl").is_file() for n in ALL_NAMES):
            return folder
    raise _missing_data(f"'{root}' holds none of the LongBench files ({', '.join(f'{n}.jsonl' for n in DATASETS[:3])}, …)")


def available(folder: Path) -> list[str]:
    """The dataset names whose file is present in ``folder``, in :data:`ALL_NAMES` order."""
    return [n for n in ALL_NAMES if (folder / f"{n}.jsonl").is_file()]


def _malformed(item: Any) -> str | None:
    """What is wrong with one line of a LongBench file for the fields this task reads, or None."""
    if not isinstance(item, dict):
        return "is not a JSON object"
    missing = [f for f in _REQUIRED if f not in item]
    if missing:
        return f"lacks {', '.join(missing)}"
    answers = item["answers"]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        return "has 'answers' that is not a non-empty list of strings"
    for field_ in ("input", "context"):
        if not isinstance(item[field_], str):
            return f"has '{field_}' that is not a string"
    length = item.get("length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, (int, float))):
        return f"has 'length' {length!r} that is not a number"
    classes = item.get("all_classes")
    if classes is not None and (not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)):
        return "has 'all_classes' that is not a list of strings"
    return None


def load_items(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The items of one official JSONL file (the first ``limit`` ones), each checked for the fields used."""
    items: list[dict[str, Any]] = []
    if limit is not None and limit <= 0:
        return items
    for number, item in jsonl_rows(path, "re-extract the file from data.zip"):
        what = _malformed(item)
        if what:  # said before any item is generated, not as a scorer's TypeError after hours of them
            raise RopekitError(f"'{path}' line {number} {what}", "use the official LongBench JSONL files from data.zip")
        items.append(item)
        if limit is not None and len(items) >= limit:
            break  # the lines after the last one used are not read
    return items


def select(folder: Path, tasks: list[str] | None) -> list[str]:
    """The datasets to run: ``tasks`` (each checked), or every recognised file present."""
    if not tasks:
        return available(folder)
    unknown = [t for t in tasks if t not in ALL_NAMES]
    if unknown:
        raise RopekitError(
            f"unknown LongBench dataset {', '.join(repr(t) for t in unknown)}",
            f"choose from: {', '.join(ALL_NAMES)}",
        )
    absent = [t for t in tasks if not (folder / f"{t}.jsonl").is_file()]
    if absent:
        raise _missing_data(f"'{folder}' lacks {', '.join(f'{t}.jsonl' for t in absent)}")
    return list(dict.fromkeys(tasks))


# ---- task ---------------------------------------------------------------------------------------------
def default_budget(model) -> int:
    """The budget used when no ``lengths`` are given: the model's window minus the largest answer budget (512)."""
    return max(2, rope_info(model).window - _MAX_NEW_TOKENS_MAX)


def check_options(*, lengths: list[int] | None = None, tasks: list[str] | None = None, samples: int | None = None,
                  data: str | None = None, chat: bool = False) -> None:
    """Refuse what is wrong whatever the model (:mod:`ropekit.eval.common`). The data folder is checked by ``run``:
    a study whose LongBench pieces are done continues on a machine without it."""
    if samples is not None:
        whole_number(samples, "--samples")
    if lengths is not None:
        token_lengths(lengths, minimum=2, why=" (a LongBench budget)")
    if not isinstance(chat, bool):
        raise RopekitError(f"chat {chat!r} is not true or false", "pass --chat, or leave it out")
    unknown = [t for t in tasks or () if t not in ALL_NAMES]
    if unknown:
        raise RopekitError(f"unknown LongBench dataset {', '.join(repr(t) for t in unknown)}",
                           f"choose from: {', '.join(ALL_NAMES)}")


def run(
    ctx: EvalContext,
    *,
    lengths: list[int] | None = None,
    tasks: list[str] | None = None,
    samples: int | None = None,
    data: str | None = None,
    chat: bool = False,
) -> None:
    """Score every item of the selected datasets at every budget in ``lengths`` (one record per item).

    ``lengths``: prompt-token budgets for middle truncation (default: the window minus 512). ``tasks``:
    dataset names (``hotpotqa``, ``hotpotqa_e``, …; default every file present). ``samples``: the first N
    items of each file (default all). ``data``: the unzipped LongBench folder. ``chat``: wrap prompts in the
    tokenizer's chat template (not the few-shot and code datasets).
    """
    tokenizer = require_tokenizer(ctx.tokenizer, "longbench")
    check_options(lengths=lengths, tasks=tasks, samples=samples, data=data, chat=chat)
    folder = data_dir(data)
    names = select(folder, tasks)
    budgets = list(lengths) if lengths else [default_budget(ctx.model)]
    items = {name: load_items(folder / f"{name}.jsonl", samples) for name in names}
    empty = [name for name, rows in items.items() if not rows and samples != 0]
    if empty:  # a file cut to nothing would score "0/0" and print a results path that was never written
        raise RopekitError(f"'{folder}' has no items in {', '.join(f'{n}.jsonl' for n in empty)}",
                           "re-extract the files from data.zip, or leave those datasets out with --tasks")
    ctx.set_total(len(budgets) * sum(len(v) for v in items.values()))
    for budget in budgets:
        for name in names:
            base = base_name(name)
            stop = end_tokens(tokenizer, name, ctx.model, chat=chat)
            for item in items[name]:
                key = ctx.key(budget, dataset=name, sample=str(item["_id"]))
                if ctx.done(key):
                    continue
                with timer() as elapsed:
                    ids, facts = build_input(tokenizer, name, item, budget, chat=chat)
                    # samsum: pred.py's min_length=context_length+1 — no end token before the first new one
                    new = greedy_generate(ctx.model, ids, MAX_NEW_TOKENS[base], eos_token_ids=stop,
                                          min_new_tokens=1 if base == "samsum" else 0)
                    prediction = tokenizer.decode(new, skip_special_tokens=True)
                    score = score_item(name, prediction, item)
                    seconds = elapsed()
                extra: dict[str, Any] = {"item_length": item.get("length"), "language": item.get("language")}
                if name.endswith("_e"):
                    if item.get("length") is None:
                        raise RopekitError(f"{name} item {item['_id']} has no 'length'", "use the official LongBench-E files")
                    extra["bucket"] = bucket_of(item["length"])
                ctx.write(
                    key, prediction=prediction, score=score, seconds=seconds, answers=item["answers"],
                    metric=METRIC[base], new_tokens=len(new), **facts, **extra,
                )


def _order(name: str) -> int:
    return ALL_NAMES.index(name) if name in ALL_NAMES else len(ALL_NAMES)


def summarize(records: list[dict]) -> list[dict]:
    """Rows per (budget, dataset) with ``accuracy`` (mean item score) and ``score`` (×100, 2 decimals, as
    LongBench reports), per LongBench-E bucket for the ``_e`` datasets, and per budget:

    * ``average_en`` / ``average_zh``: LongBench's "Avg" of a language — the mean over its task categories
      (:data:`CATEGORIES`) of each category's mean dataset score, over the categories run;
    * ``average``: the plain mean over the LongBench datasets run, both languages (not the leaderboard's number);
    * ``average_e``, and ``average_e`` per length bucket: the mean over the LongBench-E datasets of their score
      (in that bucket), LongBench-E's score by length.

    LongBench and LongBench-E are averaged apart: LongBench-E's datasets are LongBench's again, resampled by
    length, and one average over both would count a dataset twice."""
    groups: dict[tuple[int, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["length"], r["dataset"]), []).append(r)
    rows: list[dict] = []

    def row(length, dataset, bucket, acc, n):
        rows.append({"length": length, "dataset": dataset, "bucket": bucket, "accuracy": acc,
                     "score": round(100 * acc, 2), "n": n})

    for length in sorted({k[0] for k in groups}):
        names = sorted((k[1] for k in groups if k[0] == length), key=lambda n: (_order(n), n))
        scores: dict[str, float] = {}
        counts: dict[str, int] = {}
        bucket_scores: dict[str, list[float]] = {b: [] for b in BUCKETS}
        bucket_counts: dict[str, int] = {b: 0 for b in BUCKETS}
        for name in names:
            recs = groups[(length, name)]
            scores[name], counts[name] = mean(float(r["score"]) for r in recs), len(recs)
            row(length, name, None, scores[name], len(recs))
            if name.endswith("_e"):
                for bucket in BUCKETS:
                    inside = [float(r["score"]) for r in recs if r.get("bucket") == bucket]
                    if inside:
                        row(length, name, bucket, mean(inside), len(inside))
                        bucket_scores[bucket].append(mean(inside))
                        bucket_counts[bucket] += len(inside)
        for language, categories in CATEGORIES.items():
            means = [mean(scores[d] for d in datasets if d in scores)
                     for datasets in categories.values() if any(d in scores for d in datasets)]
            if means:
                seen = {d for datasets in categories.values() for d in datasets if d in scores}
                row(length, f"average_{language}", None, mean(means), sum(counts[d] for d in seen))
        for suite, members in (("average", [n for n in names if not n.endswith("_e")]),
                               ("average_e", [n for n in names if n.endswith("_e")])):
            if members:
                row(length, suite, None, mean(scores[n] for n in members), sum(counts[n] for n in members))
        for bucket in BUCKETS:
            if bucket_scores[bucket]:
                row(length, "average_e", bucket, mean(bucket_scores[bucket]), bucket_counts[bucket])
    return rows
