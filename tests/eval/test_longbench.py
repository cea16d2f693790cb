"""`ropekit eval longbench`: official file format, prompts, middle truncation, buckets, end to end, resume, errors, CLI."""

from __future__ import annotations

import json
import re

import pytest
import torch

from ropekit.errors import RopekitError
from ropekit.eval import longbench as lb
from ropekit.eval import text_metrics
from ropekit.eval.common import make_context
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model

HOTPOT_TEMPLATE = (  # quoted from LongBench's dataset2prompt.json, independent of the module's table
    "Answer the question based on the given passages. Only give me the answer and do not output any other words.\n\n"
    "The following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give me "
    "the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"
)


def item(i: int, *, context: str = "Alpha beta gamma. " * 3, question: str = "Which letter?", answers=("beta",),
         length: int = 100, classes=None) -> dict:
    return {"input": question, "context": context, "answers": list(answers), "length": length, "dataset": "x",
            "language": "en", "all_classes": classes, "_id": f"id{i}"}


def write_jsonl(path, items) -> None:
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items), encoding="utf-8")


# ---- tables and prompts ---------------------------------------------------------------------------------
def test_every_dataset_has_prompt_budget_and_metric():
    assert len(lb.DATASETS) == 21 and len(lb.E_DATASETS) == 13 and set(lb.E_DATASETS) <= set(lb.DATASETS)
    for name in lb.DATASETS:
        assert "{context}" in lb.PROMPTS[name], name
        assert name in lb.MAX_NEW_TOKENS and lb.METRIC[name] in lb.text_metrics.METRICS
    assert {k: lb.MAX_NEW_TOKENS[k] for k in ("narrativeqa", "hotpotqa", "gov_report", "trec", "samsum", "lcc")} == {
        "narrativeqa": 128, "hotpotqa": 32, "gov_report": 512, "trec": 64, "samsum": 128, "lcc": 64}
    assert lb.PROMPTS["narrativeqa"].count("asconcisely") == 2  # the original's typo, kept
    assert lb.PROMPTS["lcc"] == "Please complete the code given below. \n{context}Next line of code:\n"


def test_prompt_is_the_template_filled_in():
    x = item(0, context="P1 text.\nP2 text.", question="Who?")
    expected = HOTPOT_TEMPLATE.replace("{context}", "P1 text.\nP2 text.").replace("{input}", "Who?")
    assert lb.format_prompt("hotpotqa", x) == expected
    assert lb.format_prompt("hotpotqa_e", x) == expected  # LongBench-E uses the base dataset's prompt
    code = item(1, context="def f():\n    return {1: 2}\n", question="x = f()\n")
    assert lb.format_prompt("repobench-p", code) == (
        "Please complete the code given below. \ndef f():\n    return {1: 2}\nx = f()\nNext line of code:\n")


# ---- middle truncation ----------------------------------------------------------------------------------
def test_middle_truncation_keeps_both_ends_bytewise():
    tok = byte_tokenizer()  # one token per byte, no BOS
    prompt = "".join(chr(ord("a") + i % 26) for i in range(50))
    assert lb.middle_truncate(tok, prompt, 50) == (prompt, 50, False)
    assert lb.middle_truncate(tok, prompt, 20) == (prompt[:10] + prompt[-10:], 50, True)
    assert lb.middle_truncate(tok, prompt, 21)[0] == prompt[:10] + prompt[-10:]  # half = int(21/2) = 10
    with pytest.raises(RopekitError, match="below 2"):
        lb.middle_truncate(tok, prompt, 1)


class _BosBytes:
    """Bytes plus a BOS id 256 that the default special tokens add and decoding skips (a Llama-like convention)."""

    bos_token = "<s>"

    def __call__(self, text, add_special_tokens=True):
        class Out:
            input_ids = ([256] if add_special_tokens else []) + list(text.encode())
        return Out()

    def decode(self, ids, skip_special_tokens=False):
        body = bytes(i for i in ids if i != 256).decode()
        return body if skip_special_tokens else "<s>" * ids.count(256) + body


def test_middle_truncation_counts_the_bos_and_drops_it_in_decoding():
    prompt = "0123456789" * 5
    # 51 ids; half = 10: the head is BOS + 9 bytes, decoded without the BOS
    assert lb.middle_truncate(_BosBytes(), prompt, 20) == (prompt[:9] + prompt[-10:], 51, True)


def test_chat_template_only_where_pred_py_uses_it():
    tok = byte_tokenizer()
    x = item(0, context="c" * 100, question="q?")
    with pytest.raises(RopekitError, match="no chat template"):
        lb.build_input(tok, "hotpotqa", x, 64, chat=True)
    tok.chat_template = "{% for m in messages %}<u>{{ m['content'] }}</u>{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
    ids, facts = lb.build_input(tok, "hotpotqa", x, 64, chat=True)
    prompt = lb.format_prompt("hotpotqa", x)
    truncated = prompt[:32] + prompt[-32:]  # truncation first, then the template around it
    assert bytes(ids).decode() == "<u>" + truncated + "</u><a>"
    assert facts == {"prompt_tokens_full": len(prompt.encode()), "prompt_tokens": len(ids), "truncated": True}
    trec = item(1, context="Question: a?\nType: Human\n", question="Question: b?\nType:")
    ids, _ = lb.build_input(tok, "trec", trec, 1000, chat=True)
    assert bytes(ids).decode() == lb.format_prompt("trec", trec)  # few-shot datasets stay raw
    ids, _ = lb.build_input(tok, "hotpotqa", x, 1000, chat=False)
    assert bytes(ids).decode() == prompt


def test_chat_template_text_gets_no_second_bos():
    """The rendered template carries its own special tokens: none is added, as RULER and NIAH encode theirs
    and as transformers' apply_chat_template(tokenize=True) does, whether or not it starts with the BOS."""
    tok = _BosBytes()
    x = item(0, context="c" * 10, question="q?")
    prompt = lb.format_prompt("hotpotqa", x)
    tok.apply_chat_template = lambda msgs, tokenize, add_generation_prompt: "<u>" + msgs[0]["content"] + "</u><a>"
    tok.chat_template = "set"
    ids, _ = lb.build_input(tok, "hotpotqa", x, 1000, chat=True)
    assert 256 not in ids and bytes(ids).decode() == "<u>" + prompt + "</u><a>"
    ids, _ = lb.build_input(tok, "hotpotqa", x, 1000, chat=False)  # raw text keeps the tokenizer's BOS
    assert ids[0] == 256 and ids.count(256) == 1


def test_language_averages_are_the_leaderboards():
    """LongBench's leaderboard "Avg" of a language is the mean of its six category means (code in both languages):
    the Llama2-7B-chat-4k scores of THUDM/LongBench's README per dataset give its published 31.0 (English) and 14.3
    (Chinese); the plain mean over all 21 datasets (25.8) is neither."""
    published = {"narrativeqa": 18.7, "qasper": 19.2, "multifieldqa_en": 36.8, "multifieldqa_zh": 11.9,
                 "hotpotqa": 25.4, "2wikimqa": 32.8, "musique": 9.4, "dureader": 5.2, "gov_report": 27.3, "qmsum": 20.8,
                 "multi_news": 25.8, "vcsum": 0.2, "trec": 61.5, "triviaqa": 77.8, "samsum": 40.7, "lsht": 19.8,
                 "passage_count": 2.1, "passage_retrieval_en": 9.8, "passage_retrieval_zh": 0.5, "lcc": 52.4,
                 "repobench-p": 43.8}
    records = [{"length": 3500, "dataset": d, "sample": "0", "score": v / 100} for d, v in published.items()]
    rows = {r["dataset"]: r for r in lb.summarize(records) if r["bucket"] is None}
    assert round(rows["average_en"]["score"], 1) == 31.0 and round(rows["average_zh"]["score"], 1) == 14.3
    assert rows["average_en"]["n"] == 16 and rows["average_zh"]["n"] == 7
    assert rows["average"]["score"] == pytest.approx(sum(published.values()) / 21, abs=0.01)


def test_samsum_also_stops_at_newline():
    tok = byte_tokenizer()
    assert lb.end_tokens(tok, "samsum") == [0, 10] and lb.end_tokens(tok, "samsum_e") == [0, 10]
    assert lb.end_tokens(tok, "hotpotqa") == [0]


# ---- buckets and summary --------------------------------------------------------------------------------
def test_buckets_follow_scorer_e():
    assert [lb.bucket_of(n) for n in (0, 3999, 4000, 7999, 8000, 20000)] == ["0-4k", "0-4k", "4-8k", "4-8k", "8k+", "8k+"]


def test_summary_rows_buckets_and_dataset_average():
    def rec(length, dataset, score, bucket=None):
        return {"length": length, "dataset": dataset, "sample": str(score), "score": score, "bucket": bucket}

    records = [rec(100, "hotpotqa", 1.0), rec(100, "hotpotqa", 0.0), rec(100, "trec", 0.5),
               rec(100, "trec_e", 1.0, "0-4k"), rec(100, "trec_e", 0.25, "8k+"), rec(100, "trec_e", 0.75, "8k+"),
               rec(200, "hotpotqa", 0.2)]
    rows = lb.summarize(records)
    at100 = {(r["dataset"], r["bucket"]): r for r in rows if r["length"] == 100}
    assert at100[("hotpotqa", None)]["accuracy"] == 0.5 and at100[("hotpotqa", None)]["n"] == 2
    assert at100[("trec_e", None)]["accuracy"] == pytest.approx(2 / 3)
    assert at100[("trec_e", "0-4k")]["accuracy"] == 1.0 and at100[("trec_e", "8k+")]["accuracy"] == 0.5
    assert ("trec_e", "4-8k") not in at100  # empty buckets are left out
    # the average is over datasets (0.5, 0.5), not over the 3 items; LongBench-E's datasets have their own
    # (trec_e is trec again, resampled by length: one average over both would count trec twice)
    assert at100[("average", None)]["accuracy"] == pytest.approx((0.5 + 0.5) / 2) and at100[("average", None)]["n"] == 3
    assert at100[("average_e", None)]["accuracy"] == pytest.approx(2 / 3) and at100[("average_e", None)]["n"] == 3
    assert at100[("average_e", None)]["score"] == round(100 * 2 / 3, 2)
    # LongBench-E by length: the mean over its datasets within each bucket
    assert at100[("average_e", "0-4k")]["accuracy"] == 1.0 and at100[("average_e", "8k+")]["accuracy"] == 0.5
    assert [(r["dataset"], r["bucket"]) for r in rows if r["length"] == 100] == [
        ("hotpotqa", None), ("trec", None), ("trec_e", None), ("trec_e", "0-4k"), ("trec_e", "8k+"),
        ("average_en", None), ("average", None), ("average_e", None), ("average_e", "0-4k"), ("average_e", "8k+")]
    assert [r for r in rows if r["length"] == 200][-1]["accuracy"] == pytest.approx(0.2)


# ---- data errors ----------------------------------------------------------------------------------------
def test_missing_or_empty_data_dir_says_how_to_get_the_files(tmp_path):
    for data in (None, tmp_path / "nope", tmp_path):
        with pytest.raises(RopekitError, match="data.zip") as e:
            lb.data_dir(data)
        assert "hotpotqa.jsonl" in str(e.value)
    (tmp_path / "notes.jsonl").write_text("{}\n")
    with pytest.raises(RopekitError, match="none of the LongBench files"):
        lb.data_dir(tmp_path)
    nested = tmp_path / "data"
    nested.mkdir()
    write_jsonl(nested / "trec.jsonl", [item(0)])
    assert lb.data_dir(tmp_path) == nested  # the unzipped archive's data/ folder
    assert lb.select(nested, None) == ["trec"]
    with pytest.raises(RopekitError, match="lacks hotpotqa.jsonl"):
        lb.select(nested, ["hotpotqa"])
    with pytest.raises(RopekitError, match="unknown LongBench dataset 'hotpot'"):
        lb.select(nested, ["hotpot"])
    (nested / "qasper.jsonl").write_text('{"input": "q", "context": "c", "_id": "1"}\n')
    with pytest.raises(RopekitError, match="line 1 lacks answers"):
        lb.load_items(nested / "qasper.jsonl")
    # fields of the wrong type are refused when the file is read, before any generation (once: a scorer's error)
    for bad, says in (({"answers": [42]}, "'answers' that is not a non-empty list of strings"),
                      ({"answers": []}, "'answers' that is not a non-empty list of strings"),
                      ({"length": "5000"}, "'length' '5000' that is not a number"),
                      ({"context": None}, "'context' that is not a string"),
                      ({"all_classes": "A B"}, "'all_classes' that is not a list of strings")):
        write_jsonl(nested / "trec.jsonl", [item(0), {**item(1), **bad}])
        with pytest.raises(RopekitError, match="line 2 has " + re.escape(says)):
            lb.load_items(nested / "trec.jsonl")


# ---- end to end -----------------------------------------------------------------------------------------
@pytest.fixture
def data_dir(tmp_path):
    folder = tmp_path / "lb"
    folder.mkdir()
    write_jsonl(folder / "hotpotqa.jsonl", [item(0, context="Gamma delta. " * 12), item(1), item(2)])
    trec_classes = ["Human", "Location"]
    write_jsonl(folder / "trec.jsonl", [item(0, context="Question: who?\nType: Human\n", question="Question: where?\nType:",
                                             answers=["Location"], classes=trec_classes)])
    write_jsonl(folder / "samsum.jsonl", [item(0, context="Dialogue: hi\nSummary: greeting\n", question="Dialogue: bye\nSummary:",
                                               answers=["farewell"])])
    write_jsonl(folder / "hotpotqa_e.jsonl", [item(0, length=3000), item(1, length=9000)])
    return folder


def test_run_end_to_end_records_scores_and_resume(tmp_path, data_dir):
    model, tok = build_tiny_model("llama"), byte_tokenizer()
    out = tmp_path / "lb.jsonl"
    ctx = make_context("longbench", model, tok, method=None, params=None, lengths=[48, 160],
                       key_fields=lb.KEY_FIELDS, out=str(out))
    lb.run(ctx, lengths=[48, 160], data=str(data_dir), samples=2,
           tasks=["hotpotqa", "trec", "samsum", "hotpotqa_e"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 * (2 + 1 + 1 + 2)  # samples=2 caps hotpotqa at its first two items
    assert {r["sample"] for r in records if r["dataset"] == "hotpotqa"} == {"id0", "id1"}
    items = {(name, x["_id"]): x for name in ("hotpotqa", "trec", "samsum", "hotpotqa_e")
             for x in lb.load_items(data_dir / f"{name}.jsonl")}
    for r in records:
        x = items[(r["dataset"], r["sample"])]
        assert 0.0 <= r["score"] <= 1.0
        if r["dataset"] == "hotpotqa":  # qa_f1 against the best of the gold answers (LongBench eval.py)
            assert r["score"] == max(text_metrics.qa_f1(r["prediction"], a) for a in x["answers"])
        assert r["new_tokens"] <= lb.MAX_NEW_TOKENS[lb.base_name(r["dataset"])]
        full = len(lb.format_prompt(r["dataset"], x).encode())
        assert r["prompt_tokens_full"] == full
        # byte tokens, no BOS: a truncated prompt is exactly 2·int(budget/2) tokens
        assert r["prompt_tokens"] == (full if full <= r["length"] else 2 * (r["length"] // 2))
        assert r["truncated"] == (full > r["length"])
    assert {r["bucket"] for r in records if r["dataset"] == "hotpotqa_e"} == {"0-4k", "8k+"}
    assert all("bucket" not in r for r in records if r["dataset"] == "hotpotqa")
    samsum = [r for r in records if r["dataset"] == "samsum"]
    assert all(r["new_tokens"] >= 1 and "\n" not in r["prediction"] for r in samsum)
    rows = lb.summarize(records)
    assert [r["dataset"] for r in rows if r["length"] == 48 and r["dataset"] != "average_e"] == [
        "hotpotqa", "trec", "samsum", "hotpotqa_e", "hotpotqa_e", "hotpotqa_e", "average_en", "average"]

    # resume: nothing is generated again, and the summary is unchanged
    again = make_context("longbench", model, tok, method=None, params=None, lengths=[48, 160],
                         key_fields=lb.KEY_FIELDS, out=str(out), resume=True)
    lb.run(again, lengths=[48, 160], data=str(data_dir), samples=2, tasks=["hotpotqa", "trec", "samsum", "hotpotqa_e"])
    assert len(out.read_text().splitlines()) == len(records)
    assert lb.summarize(list(again.writer.records())) == rows

    # greedy decoding is deterministic: a fresh run gives the same predictions
    fresh = make_context("longbench", model, tok, method=None, params=None, lengths=[48], key_fields=lb.KEY_FIELDS)
    lb.run(fresh, lengths=[48], data=str(data_dir), samples=2, tasks=["hotpotqa"])
    first = {r["sample"]: r["prediction"] for r in records if r["length"] == 48 and r["dataset"] == "hotpotqa"}
    assert {r["sample"]: r["prediction"] for r in fresh.writer.records()} == first


def test_cli_runs_longbench_from_a_data_dir(run_cli, data_dir):
    code, out, err = run_cli("eval", "longbench", "tiny", "--data", str(data_dir), "--lengths", "256",
                             "--tasks", "hotpotqa", "--samples", "2", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [(r["length"], r["dataset"], r["n"]) for r in rows] == [(256, "hotpotqa", 2), (256, "average_en", 2),
                                                                    (256, "average", 2)]
    assert 0.0 <= rows[0]["accuracy"] <= 1.0 and rows[1]["accuracy"] == rows[2]["accuracy"] == rows[0]["accuracy"]

    code, _, err = run_cli("eval", "longbench", "tiny", "--data", str(data_dir / "missing"), "--lengths", "256")
    assert code == 2 and "data.zip" in err


def test_samsum_gets_one_token_before_an_end_token_can_stop_it():
    """pred.py decodes samsum with min_length = context + 1: a model whose favourite next token is EOS still
    says one token (its second choice) before stopping; the other datasets stop at once."""
    from ropekit.eval.common import greedy_generate

    model = build_tiny_model("llama")
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[0], head.bias[7] = 2.0, 1.0  # EOS first, then token 7
    model.lm_head = head
    assert greedy_generate(model, [3, 4, 5], 8, eos_token_ids=[0]) == []
    assert greedy_generate(model, [3, 4, 5], 8, eos_token_ids=[0], min_new_tokens=1) == [7]


class ScriptedHead(torch.nn.Module):
    """An LM head that makes greedy decoding emit ``script``, one token per call (its last token from then on);
    ``step = 0`` replays it."""

    def __init__(self, script: list[int], vocab: int):
        super().__init__()
        self.script, self.vocab, self.step = script, vocab, 0

    def forward(self, hidden):
        out = torch.full((*hidden.shape[:-1], self.vocab), -1e4)
        out[..., self.script[min(self.step, len(self.script) - 1)]] = 0.0
        self.step += 1
        return out


def test_the_models_own_end_tokens_end_a_generation_as_generate_does():
    """pred.py calls model.generate, which stops on every end token of the model's generation config (Qwen2.5-Instruct:
    <|im_end|> and <|endoftext|>); ropekit stopped on the tokenizer's only and scored the rambling after the answer."""
    from ropekit.eval.common import greedy_generate

    model = build_tiny_model("llama").eval()
    script = [7, 8, 9] + [11] * 20  # answer, the second end token, then rambling

    model.lm_head = ScriptedHead(script, model.config.vocab_size)
    model.generation_config.eos_token_id = [0, 9]
    reference = model.generate(torch.tensor([[3, 4, 5]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
                               max_new_tokens=12, do_sample=False)[0, 3:].tolist()
    assert reference == [7, 8, 9]  # transformers stops at the configured 9 (and keeps it)
    tok = byte_tokenizer()
    assert lb.end_tokens(tok, "hotpotqa", model) == [0, 9] and lb.end_tokens(tok, "samsum", model) == [0, 9, 10]
    model.lm_head.step = 0
    assert greedy_generate(model, [3, 4, 5], 12, eos_token_ids=lb.end_tokens(tok, "hotpotqa", model)) == reference[:-1]


def test_end_of_turn_ends_a_chat_answer_but_not_a_plain_one():
    """pred.py stops where ``model.generate`` stops: the generation config's end tokens. A base model whose vocabulary
    holds a chat end-of-turn token (Qwen2.5's ``<|im_end|>``, eos ``<|endoftext|>``) and writes it inside a plain-
    prompt answer goes on there; ropekit stopped at it on every prompt and scored the cut answer. In a chat-wrapped
    prompt the end of the turn ends the answer."""
    from ropekit.eval.common import greedy_generate

    im_end = 12
    script = [7, im_end, 8, 9] + [0] * 20  # answer, <|im_end|>, more answer, then the model's eos (0)

    class QwenLikeTokenizer:  # the vocabulary facts eos_ids reads: eos "<|endoftext|>" (0), "<|im_end|>" (12)
        eos_token, unk_token_id = "<|endoftext|>", None

        @staticmethod
        def convert_tokens_to_ids(token):
            return {"<|endoftext|>": 0, "<|im_end|>": im_end}.get(token)

    model = build_tiny_model("llama").eval()
    model.lm_head = ScriptedHead(script, model.config.vocab_size)
    model.generation_config.eos_token_id = 0
    reference = model.generate(torch.tensor([[3, 4, 5]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
                               max_new_tokens=12, do_sample=False)[0, 3:].tolist()
    assert reference == [7, im_end, 8, 9, 0]
    tok = QwenLikeTokenizer()
    plain = lb.end_tokens(tok, "hotpotqa", model)
    model.lm_head.step = 0
    assert greedy_generate(model, [3, 4, 5], 12, eos_token_ids=plain) == reference[:-1]
    assert lb.end_tokens(tok, "hotpotqa", model, chat=True) == [0, im_end]
    assert lb.end_tokens(tok, "trec", model, chat=True) == [0]  # pred.py never wraps trec in the chat template
    model.lm_head.step = 0
    assert greedy_generate(model, [3, 4, 5], 12, eos_token_ids=lb.end_tokens(tok, "hotpotqa", model, chat=True)) == [7]


def test_items_past_the_limit_are_not_read(tmp_path):
    """--samples N reads the first N items only: a broken line after them does not stop the run."""
    path = tmp_path / "hotpotqa.jsonl"
    write_jsonl(path, [item(0), item(1)])
    with path.open("a") as fh:
        fh.write("{broken\n")
    assert [i["_id"] for i in lb.load_items(path, limit=2)] == [item(0)["_id"], item(1)["_id"]]
    with pytest.raises(RopekitError):
        lb.load_items(path)
