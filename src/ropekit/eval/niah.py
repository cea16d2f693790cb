"""Needle in a haystack (gkamradt's LLMTest_NeedleInAHaystack, in the open-model form LCEG uses).

Needle, question, depth grid and heatmap follow gkamradt's repository; prompt, answer budget and score
follow LCEG's ``needle/`` variant used by RoPE-extension papers (Leooyii/LCEG ``needle/``;
docs/methods-reference.md §10), with the changes below.

**Haystack.** The Paul Graham essays cannot be shipped, so the haystack is :mod:`ropekit.data.prose`
(English prose of the Python documentation), recorded as ``haystack: "python-docs-prose"`` with its digest
on every sample. Its sentences are taken in order, cycling at the end, from a start offset: sentence 0 for
trial 0 (the original always starts at its first essay) and a seeded random sentence for each further
trial, the same for every length and depth of that trial so that a row of the heatmap differs only in
where the needle is.

**Length.** ``length`` bounds everything the model sees *and* writes: the prompt (BOS, template, question
and needle counted exactly by encoding it) is the longest whole-sentence haystack prefix with
``prompt_tokens ≤ length − 50``, and the 50 tokens are the answer budget. This replaces the original's
fixed 200-token ``final_context_length_buffer`` with an exact count. The real ``prompt_tokens`` is recorded.

**Insertion (sentence boundary by token position).** Each haystack sentence is tokenized on its own to get
its token count; the needle goes at the last sentence boundary whose token offset is at or before
``depth × haystack tokens`` — gkamradt's "insertion point moved back to the preceding period token", done
on whole sentences so no tokenizer-specific period id is needed (LCEG hard-codes LLaMA's). Depth 1 appends
the needle after the last sentence, depth 0 puts it first. The needle keeps the original's surrounding
newlines. ``depth_actual`` records the realised fraction of haystack tokens before the needle.

**Prompt.** LCEG's base-model prompt without its Qwen ``<|im_start|>`` prefix::

    This is a very long story book: <book> {context} </book>.
     Based on the content of the book, Question: {question}
    Answer:

With ``chat=True`` (and only if the tokenizer has a chat template) the same text goes in one user turn
through the template, with the generation prompt added; ``chat=None`` (the default) uses the plain prompt
and warns when the tokenizer has a template, since instruction-tuned models (SmolLM2-Instruct, checked)
end their turn at once on it. Greedy decoding, 50 new tokens.

**Score: word recall**, deterministic, in place of the original's GPT judge. LCEG plots
``|set(response.lower().split()) ∩ set(expected)| / len(expected)`` with expected = "eat a sandwich and sit
in dolores park on a sunny day." split on spaces: 12 words of which 11 are distinct ("a" twice), so a
perfect answer scores 11/12, and "day." only matches with its period. Here both sides are lower-cased
and cut into words without punctuation, and the denominator counts the *distinct* expected words, so a
perfect answer scores 1.0 (:func:`recall`; LCEG's number is kept as ``recall_lceg``, :func:`lceg_recall`).
``exact`` is 1.0 when every expected word is present. Recall credits stop words ("a", "in", "on"), so
even an unrelated answer can score above 0: compare methods, not absolute values.
"""

from __future__ import annotations

import random
import re
import warnings
from dataclasses import dataclass
from typing import Any

from ..data.prose import PROSE_SOURCE, prose_digest, prose_sentences
from ..errors import RopekitError
from ..runtime.atomic import check_figure_target
from .common import (
    EvalContext,
    encode,
    eos_ids,
    greedy_generate,
    require_tokenizer,
    timer,
)
from .passkey import _config_label, check_depths, check_lengths, largest_fitting
from .passkey import check_options as check_passkey_options

KEY_FIELDS = ("depth", "trial")
#: Option values that score the same samples as leaving the option out (a resume may give them or not).
SAME_AS_NOT_GIVEN = {"chat": False}  # chat=None uses the plain prompt too (and warns when a template exists)

NEEDLE = "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
QUESTION = "What is the best thing to do in San Francisco?"
#: The reference answer the recall is measured against (LCEG's ``expected_answer``).
EXPECTED_ANSWER = "eat a sandwich and sit in dolores park on a sunny day."
PROMPT_TEMPLATE = (
    "This is a very long story book: <book> {context} </book>.\n"
    " Based on the content of the book, Question: {question}\nAnswer:"
)
#: Greedy answer budget (LCEG), reserved inside each length.
MAX_NEW_TOKENS = 50
#: Eleven depths, 0 to 100 % in steps of 10 (ropekit's choice; gkamradt's harness defaults to 35 depths).
DEFAULT_DEPTHS = tuple(round(100 * i / 10) / 100 for i in range(11))


# ---- scoring ----------------------------------------------------------------------------------------
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")


def words(text: str) -> list[str]:
    """Lower-cased words of ``text`` without punctuation ("Park," → "park", "day." → "day")."""
    return _WORD.findall(text.lower())


def recall(response: str, expected: str = EXPECTED_ANSWER) -> float:
    """Share of the distinct expected words present in ``response`` (1.0 for a perfect answer)."""
    want = set(words(expected))
    if not want:
        raise ValueError("the expected answer has no words")
    return len(want & set(words(response))) / len(want)


def exact(response: str, expected: str = EXPECTED_ANSWER) -> float:
    """1.0 when every expected word is in ``response``, else 0.0."""
    return 1.0 if set(words(expected)) <= set(words(response)) else 0.0


def lceg_recall(response: str, expected: str = EXPECTED_ANSWER) -> float:
    """LCEG's plotted score as it computes it: whitespace words, punctuation kept, 12 in the denominator."""
    want = expected.lower().split()
    return len(set(response.lower().split()) & set(want)) / len(want)


# ---- haystack and prompt ----------------------------------------------------------------------------
class Haystack:
    """The prose sentences and, counted on demand, each one's token count under one tokenizer.

    Counts are taken in batches as the samples reach further into the corpus, so a short evaluation
    tokenizes only the sentences it uses.
    """

    _BATCH = 256

    def __init__(self, tokenizer, sentences: tuple[str, ...] | None = None):
        self.tokenizer = tokenizer
        self.sentences = tuple(sentences if sentences is not None else prose_sentences())
        if not self.sentences:
            raise RopekitError("the haystack has no sentences", "check the Python installation's documentation prose")
        self._counts: dict[int, int] = {}

    def count(self, i: int) -> int:
        """Tokens of sentence ``i`` with the space that joins it to the previous one (no special tokens)."""
        if i not in self._counts:
            chunk = [j for j in range(i, min(i + self._BATCH, len(self.sentences))) if j not in self._counts]
            batch = self.tokenizer([" " + self.sentences[j] for j in chunk], add_special_tokens=False).input_ids
            for j, ids in zip(chunk, batch):
                self._counts[j] = max(1, len(ids))
        return self._counts[i]

    def start(self, seed: int, trial: int) -> int:
        """First sentence of ``trial``'s haystack: 0 for trial 0, else a seeded random sentence."""
        if trial == 0:
            return 0
        return random.Random(f"ropekit-niah|{seed}|{trial}").randrange(len(self.sentences))

    def take(self, start: int, m: int) -> list[int]:
        """Indices of ``m`` sentences from ``start``, cycling."""
        n = len(self.sentences)
        return [(start + i) % n for i in range(m)]


def build_prompt(tokenizer, context: str, *, chat: bool = False) -> tuple[str, bool]:
    """``(text, add_special_tokens)`` of the question prompt around ``context``.

    Chat templates carry their own special tokens, so their text is encoded without adding any.
    """
    text = PROMPT_TEMPLATE.format(context=context, question=QUESTION)
    if not chat:
        return text, True
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return rendered, False


@dataclass(frozen=True)
class NeedleSample:
    """One needle prompt: its text, how it is encoded, where the needle sits and its token count."""

    prompt: str
    add_special_tokens: bool
    start: int
    n_sentences: int
    n_before: int
    depth_actual: float
    prompt_tokens: int

    def ids(self, tokenizer) -> list[int]:
        return encode(tokenizer, self.prompt, add_special_tokens=self.add_special_tokens)


def _context(hay: Haystack, idx: list[int], n_before: int) -> str:
    before = " ".join(hay.sentences[i] for i in idx[:n_before])
    after = " ".join(hay.sentences[i] for i in idx[n_before:])
    return before + NEEDLE + after


def _split_point(counts: list[int], depth: float) -> tuple[int, float]:
    """``(j, fraction)``: the last boundary ``j`` whose token offset is ≤ depth × total, and offset_j / total."""
    total = sum(counts)
    if total == 0:
        return 0, 0.0
    target = depth * total
    offset, j = 0, 0
    for c in counts:
        if offset + c > target + 1e-9:
            break
        offset += c
        j += 1
    return j, offset / total


def make_sample(hay: Haystack, length: int, depth: float, trial: int, seed: int = 0, *, chat: bool = False) -> NeedleSample:
    """The needle prompt of ``(length, depth, trial)``: the longest haystack with ``prompt_tokens ≤ length − 50``."""
    tok = hay.tokenizer
    start = hay.start(seed, trial)
    budget = length - MAX_NEW_TOKENS

    def text_of(m: int) -> tuple[str, bool, int, float]:
        idx = hay.take(start, m)
        j, fraction = _split_point([hay.count(i) for i in idx], depth)
        text, special = build_prompt(tok, _context(hay, idx, j), chat=chat)
        return text, special, j, fraction

    def count(m: int) -> int:
        text, special, _, _ = text_of(m)
        return len(encode(tok, text, add_special_tokens=special))

    # the haystack grows by one sentence per step and the needle only moves, so count() is nondecreasing
    base = count(0)
    guess, used = 0, base
    while True:  # per-sentence counts give a close first guess; exact counts settle it
        c = hay.count((start + guess) % len(hay.sentences))
        if used + c > budget:
            break
        used += c
        guess += 1
    m = largest_fitting(count, budget, guess)
    if m is None:
        raise RopekitError(
            f"length {length} is too short for the needle prompt ({base} tokens with no haystack, plus "
            f"{MAX_NEW_TOKENS} for the answer)",
            f"pass --lengths of at least {base + MAX_NEW_TOKENS} tokens",
        )
    text, special, j, fraction = text_of(m)
    return NeedleSample(
        prompt=text, add_special_tokens=special, start=start, n_sentences=m, n_before=j, depth_actual=fraction,
        prompt_tokens=len(encode(tok, text, add_special_tokens=special)),
    )


# ---- the task ---------------------------------------------------------------------------------------
def check_options(*, lengths: list[int] | None = None, depths: list[float] | None = None, trials: int = 1,
                  chat: bool | None = None, plot: str | None = None) -> None:
    """Refuse what is wrong whatever the model (:mod:`ropekit.eval.common`): the passkey's checks, and ``chat``."""
    check_passkey_options(lengths=lengths, depths=depths, trials=trials, plot=plot)
    if chat is not None and not isinstance(chat, bool):
        raise RopekitError(f"chat {chat!r} is not true or false", "pass --chat or --no-chat")


def run(ctx: EvalContext, *, lengths: list[int] | None = None, depths: list[float] | None = None, trials: int = 1,
        chat: bool | None = None, plot: str | None = None) -> None:
    """Score every (length, depth, trial) of the needle grid; ``depths`` default to 0, 0.1, …, 1."""
    tokenizer = require_tokenizer(ctx.tokenizer, "niah")
    check_options(lengths=lengths, depths=depths, trials=trials, chat=chat, plot=plot)
    lengths = check_lengths(lengths, ctx)
    depth_list = list(DEFAULT_DEPTHS) if depths is None else check_depths(depths)
    use_chat = bool(chat)
    if use_chat and not getattr(tokenizer, "chat_template", None):
        raise RopekitError("--chat was given but this tokenizer has no chat template", "drop --chat for a base model")
    if chat is None and getattr(tokenizer, "chat_template", None):
        # an instruction-tuned model given the plain prompt tends to close its turn at once (SmolLM2-Instruct
        # answers "<|im_end|>" and scores 0); say so rather than let the grid read as a retrieval failure
        warnings.warn("niah: this tokenizer has a chat template but the plain base-model prompt is used; "
                      "pass --chat (chat=True) for an instruction-tuned model", stacklevel=2)
    if plot is not None:
        check_figure_target(plot)  # before the work, not after it
    ctx.set_total(len(lengths) * len(depth_list) * trials)
    hay: Haystack | None = None
    digest = prose_digest()
    stop = eos_ids(tokenizer, ctx.model, chat=use_chat)
    for length in lengths:
        for depth in depth_list:
            for trial in range(trials):
                key = ctx.key(length, depth=depth, trial=trial)
                if ctx.done(key):
                    continue
                if hay is None:  # tokenizing the corpus is skipped entirely when everything is resumed
                    hay = Haystack(tokenizer)
                sample = make_sample(hay, length, depth, trial, ctx.seed, chat=use_chat)
                ids = sample.ids(tokenizer)
                with timer() as elapsed:
                    new = greedy_generate(ctx.model, ids, MAX_NEW_TOKENS, eos_token_ids=stop)
                    seconds = elapsed()
                text = tokenizer.decode(new, skip_special_tokens=True)
                ctx.write(
                    key,
                    prediction=text,
                    score=recall(text),
                    exact=exact(text),
                    recall_lceg=lceg_recall(text),
                    depth_actual=sample.depth_actual,
                    prompt_tokens=len(ids),
                    haystack=PROSE_SOURCE,
                    haystack_digest=digest,
                    haystack_start=sample.start,
                    chat=use_chat,
                    seconds=seconds,
                )
    if plot:
        from .plots import method_label, model_windows

        own = ctx.own_records()
        label = method_label(ctx.method, ctx.params)
        plot_records(own, plot, title=f"needle in a haystack ({PROSE_SOURCE}) — {label}", windows=model_windows(ctx.model))


def plot_records(records: list[dict[str, Any]], path: str, *, title: str = "needle in a haystack", windows=None):
    """The depth × length mean-recall heatmap of needle ``records`` (see :func:`ropekit.eval.plots.heatmap`)."""
    from .plots import heatmap

    return heatmap(records, path, title, windows=windows, value_label="Word recall")


def plot(records: list[dict[str, Any]], path: str, *, windows=None, title: str = "needle in a haystack"):
    """The task's figure (registry contract ``plot(records, path)``): :func:`plot_records`."""
    return plot_records(records, path, title=title, windows=windows)


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean recall (``accuracy``), mean ``exact`` and count per (length, depth), then per length (``depth: "all"``).

    A ``method`` column is added when the records mix several methods or parameters.
    """
    configs = list(dict.fromkeys(_config_label(r) for r in records))
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        cfg = _config_label(r)
        groups.setdefault((cfg, r["length"], float(r["depth"])), []).append(r)
        groups.setdefault((cfg, r["length"], "all"), []).append(r)

    def order(item):
        (cfg, length, depth), _ = item
        return configs.index(cfg), length, depth == "all", 0.0 if depth == "all" else depth

    rows = []
    for (cfg, length, depth), recs in sorted(groups.items(), key=order):
        row: dict[str, Any] = {"method": cfg} if len(configs) > 1 else {}
        row.update(
            length=length,
            depth=depth,
            accuracy=sum(float(r["score"]) for r in recs) / len(recs),
            exact=sum(float(r.get("exact", 0.0)) for r in recs) / len(recs),
            n=len(recs),
        )
        rows.append(row)
    return rows
