"""Passkey retrieval (Mohtashami & Jaggi's Landmark Attention, Fig. 2a; as re-run by YaRN and PoSE).

The prompt is the one the three original repositories share (strings verbatim; docs/methods-reference.md §10)::

    "\\n".join([TASK_DESCRIPTION, garbage_prefix, "The pass key is {k}. Remember it. {k} is the pass key.",
               garbage_suffix, "What is the pass key? The pass key is"])

with ``k = randint(1, 50000)``. The model continues greedily for 10 tokens; only the continuation is scored,
and a sample is correct iff the first run of digits in it equals ``k`` (a continuation without digits is
wrong, as the originals' fallback to the first 20 characters never equals an integer).

**Filler variant implemented: whole garbage sentences, separated by a space.** The garbage paragraph is
cut into its five sentences, which are cycled: ``n`` sentences of filler are the first ``n`` of
"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. The grass…".
This is Landmark/YaRN's ``" ".join([garbage] * N)`` cut at a sentence boundary instead of at a character
(the originals slice characters and can cut mid-word), and PoSE's whole-sentence count made one sentence
finer (PoSE repeats the whole five-sentence paragraph with no separator). As in the originals, the prefix
and the suffix are both taken from the *start* of the cycle (``prefix = filler[:k]``, ``suffix =
filler[:n−k]``).

**Length control, in the model's tokens.** ``n`` is the largest number of filler sentences for which the
whole prompt, encoded as the tokenizer encodes it (BOS included when the tokenizer adds one, as YaRN
counts ``len(tokenizer.encode(prompt))``), is at most the target length; so a prompt falls short of the
target by less than one garbage sentence. The 10 generated tokens come on top, as in the originals. The
real ``prompt_tokens`` is recorded with every sample.

**Depth.** ``depths=None`` is the originals' protocol: the information line goes at a uniformly random
position over the filler (here a uniformly random sentence boundary ``k ∈ {0, …, n}``). Explicit depths
place it after ``k = ⌊d·n + ½⌋`` of the ``n`` sentences. Each record keeps the requested ``depth`` (``None``
for random) and the realised fraction ``depth_actual = k / n``.

Every sample draws its key (and random depth) from its own RNG seeded by ``(seed, length, depth, trial)``,
so a sample is the same whatever else is evaluated or resumed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..data.passkey_text import (  # noqa: F401  (the prompt's strings are part of this task's API)
    FINAL_QUESTION,
    GARBAGE,
    GARBAGE_SENTENCES,
    INFORMATION_LINE,
    KEY_RANGE,
    TASK_DESCRIPTION,
    build_prompt,
    filler,
)
from ..errors import RopekitError
from ..runtime.atomic import check_figure_target
from .common import (
    EvalContext,
    encode,
    eos_ids,
    first_integer,
    greedy_generate,
    require_tokenizer,
    timer,
    token_lengths,
    whole_number,
)

KEY_FIELDS = ("depth", "trial")

#: Greedy continuation length, as Landmark, YaRN and PoSE.
MAX_NEW_TOKENS = 10
#: Depth bins of the heatmap when depths were random (fractions of the filler before the information line).
RANDOM_DEPTH_BINS = 5


def largest_fitting(count: Callable[[int], int], limit: int, guess: int = 0) -> int | None:
    """The largest ``n ≥ 0`` with ``count(n) ≤ limit`` for a nondecreasing ``count``; ``None`` if not even 0 fits.

    Gallops from ``guess`` (doubling steps up or down) and then bisects, so a good guess costs only a few
    evaluations of ``count`` (each one tokenizes a whole prompt).
    """
    seen: dict[int, bool] = {}

    def fits(n: int) -> bool:
        if n not in seen:
            seen[n] = count(n) <= limit
        return seen[n]

    if not fits(0):
        return None
    guess = max(0, int(guess))
    if fits(guess):
        lo, step = guess, 1
        while fits(lo + step):
            lo += step
            step *= 2
        hi = lo + step
    else:
        hi, step = guess, 1
        while True:
            candidate = max(0, hi - step)
            if fits(candidate):
                lo = candidate
                break
            hi, step = candidate, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class PasskeySample:
    """One passkey prompt: its text, key, filler sizes and token count."""

    prompt: str
    key: int
    n_garbage: int
    n_prefix: int
    prompt_tokens: int

    @property
    def depth_actual(self) -> float:
        """Fraction of the filler sentences placed before the information line."""
        return self.n_prefix / self.n_garbage if self.n_garbage else 0.0


def sample_rng(seed: int, length: int, depth: float | None, trial: int) -> random.Random:
    """The sample's own RNG; string seeds are hashed with SHA-512 by :mod:`random`, so it is stable across runs."""
    return random.Random(f"ropekit-passkey|{seed}|{length}|{depth!r}|{trial}")


def make_sample(tokenizer, length: int, depth: float | None, trial: int, seed: int = 0) -> PasskeySample:
    """The prompt of sample ``(length, depth, trial)``: as much filler as fits in ``length`` tokens."""
    rng = sample_rng(seed, length, depth, trial)
    key = rng.randint(*KEY_RANGE)
    if depth is None:
        u = rng.random()

        def prefix_of(n: int) -> int:
            return min(n, int(u * (n + 1)))  # uniform over the n + 1 sentence boundaries
    else:

        def prefix_of(n: int) -> int:
            return min(n, math.floor(depth * n + 0.5))

    def count(n: int) -> int:
        return len(encode(tokenizer, build_prompt(n, prefix_of(n), key)))

    # one step adds exactly one sentence (to the prefix or the suffix), so count() is nondecreasing
    base = count(0)
    per_cycle = len(encode(tokenizer, filler(len(GARBAGE_SENTENCES)) + " ", add_special_tokens=False))
    guess = int((length - base) * len(GARBAGE_SENTENCES) / max(1, per_cycle)) if length > base else 0
    n = largest_fitting(count, length, guess)
    if n is None:
        raise RopekitError(
            f"length {length} is too short for the passkey prompt ({base} tokens with no filler)",
            f"pass --lengths of at least {base} tokens",
        )
    prompt = build_prompt(n, prefix_of(n), key)
    return PasskeySample(prompt=prompt, key=key, n_garbage=n, n_prefix=prefix_of(n), prompt_tokens=len(encode(tokenizer, prompt)))


def score_response(response: str, key: int) -> float:
    """1.0 iff the first integer in ``response`` equals ``key`` (Landmark/YaRN/PoSE scoring), else 0.0."""
    return 1.0 if first_integer(response) == key else 0.0


# ---- options ----------------------------------------------------------------------------------------
def check_lengths(lengths, ctx: EvalContext) -> list[int]:
    """The lengths to evaluate; ``None`` means the window of the model as evaluated (with a method installed, the
    extended one), as for every task's default length."""
    if lengths is None:
        from ..install import rope_info

        return [rope_info(ctx.model).window]
    return token_lengths(lengths)


def check_depths(depths) -> list[float]:
    """Distinct depths, each a fraction in [0, 1]."""
    out: list[float] = []
    for d in depths:
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0.0 <= float(d) <= 1.0:
            raise RopekitError(f"depth {d!r} is not a fraction in [0, 1]", "pass e.g. --depths 0,0.25,0.5,0.75,1")
        if float(d) not in out:
            out.append(float(d))
    if not out:
        raise RopekitError("--depths is empty", "pass e.g. --depths 0,0.5,1, or leave it out")
    return out


def check_options(*, lengths: list[int] | None = None, depths: list[float] | None = None, trials: int = 5,
                  plot: str | None = None) -> None:
    """Refuse what is wrong whatever the model (:mod:`ropekit.eval.common`); NIAH takes the same checks."""
    if lengths is not None:
        token_lengths(lengths)
    if depths is not None:
        check_depths(depths)
    whole_number(trials, "--trials")


# ---- the task ---------------------------------------------------------------------------------------
def run(ctx: EvalContext, *, lengths: list[int] | None = None, depths: list[float] | None = None, trials: int = 5,
        plot: str | None = None) -> None:
    """Score ``trials`` passkey samples per length (and per depth when ``depths`` are given)."""
    tokenizer = require_tokenizer(ctx.tokenizer, "passkey")
    check_options(lengths=lengths, depths=depths, trials=trials, plot=plot)
    lengths = check_lengths(lengths, ctx)
    depth_list: list[float | None] = [None] if depths is None else check_depths(depths)
    if plot is not None:
        check_figure_target(plot)  # before the work, not after it
    ctx.set_total(len(lengths) * len(depth_list) * trials)
    stop = eos_ids(tokenizer, ctx.model)
    for length in lengths:
        for depth in depth_list:
            for trial in range(trials):
                key = ctx.key(length, depth=depth, trial=trial)
                if ctx.done(key):
                    continue
                sample = make_sample(tokenizer, length, depth, trial, ctx.seed)
                ids = encode(tokenizer, sample.prompt)
                with timer() as elapsed:
                    new = greedy_generate(ctx.model, ids, MAX_NEW_TOKENS, eos_token_ids=stop)
                    seconds = elapsed()
                text = tokenizer.decode(new, skip_special_tokens=True)
                ctx.write(
                    key,
                    prediction=text,
                    answer=first_integer(text),
                    passkey=sample.key,
                    score=score_response(text, sample.key),
                    depth_actual=sample.depth_actual,
                    garbage_sentences=sample.n_garbage,
                    prompt_tokens=len(ids),
                    seconds=seconds,
                )
    if plot:
        from .plots import method_label, model_windows

        own = ctx.own_records()
        label = method_label(ctx.method, ctx.params)
        plot_records(own, plot, title=f"passkey retrieval — {label}", windows=model_windows(ctx.model))


def plot_grid(records: list[dict[str, Any]]) -> dict[tuple[float, int], float]:
    """``{(depth, length): accuracy}``: by requested depth, or, for random depths, by binned ``depth_actual``.

    Random depths fall in :data:`RANDOM_DEPTH_BINS` equal bins of the filler, each labelled by its centre.
    """
    requested = [r for r in records if r.get("depth") is not None]
    cells: dict[tuple[float, int], list[float]] = {}
    if requested:
        for r in requested:
            cells.setdefault((float(r["depth"]), int(r["length"])), []).append(float(r["score"]))
    else:
        for r in records:
            b = min(int(float(r["depth_actual"]) * RANDOM_DEPTH_BINS), RANDOM_DEPTH_BINS - 1)
            cells.setdefault(((b + 0.5) / RANDOM_DEPTH_BINS, int(r["length"])), []).append(float(r["score"]))
    return {k: sum(v) / len(v) for k, v in cells.items()}


def plot_records(records: list[dict[str, Any]], path: str, *, title: str = "passkey retrieval", windows=None):
    """The depth × length accuracy heatmap of passkey ``records`` (see :func:`ropekit.eval.plots.heatmap`)."""
    from .plots import heatmap

    return heatmap(plot_grid(records), path, title, windows=windows, value_label="Accuracy")


def plot(records: list[dict[str, Any]], path: str, *, windows=None, title: str = "passkey retrieval"):
    """The task's figure (registry contract ``plot(records, path)``): :func:`plot_records`."""
    return plot_records(records, path, title=title, windows=windows)


def _config_label(record: dict[str, Any]) -> str:
    params = record.get("params") or {}
    return str(record.get("method")) + (" " + ", ".join(f"{k}={v}" for k, v in sorted(params.items())) if params else "")


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Accuracy and sample count per length; with requested depths, also per (length, depth).

    Rows per (length, depth) come first within a length, then the length's row over all its depths
    (``depth: "all"``). A ``method`` column is added when the records mix several methods or parameters.
    """
    configs = list(dict.fromkeys(_config_label(r) for r in records))
    by_depth = any(r.get("depth") is not None for r in records)
    groups: dict[tuple, list[float]] = {}
    for r in records:
        cfg = _config_label(r)
        groups.setdefault((cfg, r["length"], "all"), []).append(float(r["score"]))
        if by_depth and r.get("depth") is not None:
            groups.setdefault((cfg, r["length"], float(r["depth"])), []).append(float(r["score"]))
    rows = []
    for (cfg, length, depth), scores in sorted(
        groups.items(), key=lambda kv: (configs.index(kv[0][0]), kv[0][1], kv[0][2] == "all", 0.0 if kv[0][2] == "all" else kv[0][2])
    ):
        row: dict[str, Any] = {"method": cfg} if len(configs) > 1 else {}
        row["length"] = length
        if by_depth:
            row["depth"] = depth
        row.update(accuracy=sum(scores) / len(scores), n=len(scores))
        rows.append(row)
    return rows
