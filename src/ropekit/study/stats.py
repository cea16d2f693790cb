"""Statistics of a study: per method × task × length aggregates with 95 % bootstrap intervals, paired
comparisons between methods, Kendall τ with its interval, and the method ranking with ties.

Aggregates (:func:`aggregate`, :class:`Analysis`), one row ``{"method", "task", "length", "metric", "value",
"ci95": [low, high], "n", …}`` per method, task, length and metric:

* ``ppl`` — ``exp(Σ nll_sum / Σ tokens_scored)`` over the length's documents (token-weighted mean NLL,
  as Press et al. and PoSE; :mod:`ropekit.eval.perplexity`), or, for records written with
  ``weighting="window"``, ``exp(Σ window_mean_nll_sum / Σ windows)`` (YaRN's mean over windows). ``n`` is
  the number of documents; ``tokens_scored`` and ``nll`` are carried along. Records of one group must
  share one protocol (corpus, score mode, stride, weighting, BOS): summing NLL over different protocols
  would give a number that is none of them, so that is refused.
* ``accuracy`` — the mean ``score`` of the samples for passkey, niah, manyshot, short and any task whose
  records carry scores; for ``ruler`` and ``longbench`` the unweighted mean over subtasks (datasets) of
  each one's mean score, as RULER's and LongBench's published averages are taken (not over samples).
* ``speed`` — medians over repeats of ``prefill_s``, ``decode_s_per_token`` and ``peak_mem_bytes``, and
  each median divided by the plain model's median at the same length (``prefill_ratio``,
  ``decode_ratio``, ``memory_ratio``), as LCEG Table 8 and :func:`ropekit.eval.speed.summarize`.
* ``entropy`` — means over samples of ``entropy_last`` and ``normalised_last``.

**Seeds.** Records may carry a ``seed`` (one fine-tuning per seed under one method label). A cell's
``value`` is then the mean over seeds of each seed's value — for perplexity the mean of the per-seed mean
NLL, i.e. the geometric mean of the per-seed perplexities — and the row adds ``seeds`` (how many),
``seed_values`` and their spread ``seed_min``, ``seed_max``, ``seed_sd`` (sample standard deviation).
Records without a ``seed`` are one seed. The interval below is over the evaluation samples with the seeds
held fixed; the spread across seeds is reported beside it, not folded into it.

**Intervals (bootstrap).** A *unit* is one evaluation sample as every method sees it: its identifying
fields among :data:`UNIT_FIELDS` (the document — ``doc``/``doc_sha`` — for perplexity; ``depth`` and
``trial`` for passkey and needle prompts; ``subtask``/``dataset``/``shots`` and ``sample`` for RULER,
LongBench, many-shot; ``repeat`` for speed), *not* the method, length or seed. Every task has one list
of units, the union over its methods, lengths and seeds, in ascending order of their fields; the units
are resampled with replacement :data:`BOOTSTRAP_RESAMPLES` times, and the same resamples serve every
method, length and seed of the task — so intervals of differences between methods (or between lengths
of one method: perplexity documents are the same at every length) are *paired*. Resampling contract
(:func:`resample_indices`): ``rng = numpy.random.default_rng(BOOTSTRAP_SEED)``; for each stratum in
ascending order, with ``n_s`` units, ``rng.integers(0, n_s, size=(B, n_s))`` draws resample ``b``'s units
of that stratum. The strata are the subtasks (datasets, shot counts) for the macro-averaged tasks (RULER,
LongBench, many-shot: each keeps its size, as the published averages weigh subtasks equally), else one stratum.
Where the units of a task are not independent draws — many-shot asks the same queries (``sample``) at every shot
count, a needle trial (``trial``) puts the same haystack under every depth (:data:`CLUSTER_FIELDS`) — the
*clusters* are resampled instead (a cluster bootstrap, Davison & Hinkley 1997 §3.8): with ``n_c`` distinct
values of the field, ``rng.integers(0, n_c, size=(B, n_c))`` draws resample ``b``'s clusters and every unit
counts as often as its cluster was drawn, so each shot count (depth) sees the same drawn queries (haystacks). Each
resample recomputes the statistic from the drawn units — perplexity ``exp(Σ nll / Σ tokens)`` over the
drawn documents (a document drawn twice counts twice), accuracy the mean (macro mean) of the drawn
prompts' scores, speed the median of the drawn repeats — and the 95 % interval is the 2.5th and 97.5th
percentile of the resampled values (``numpy.percentile``, linear interpolation); for perplexity the
percentiles are taken of the mean NLL and exponentiated. Deterministic: the same records give the same
intervals. A unit that a method lacks contributes nothing to that method's sums.

**Alike prompts.** Where every prompt of an accuracy cell scored the same (all found, all missed, or one
partial-credit fraction), every resample is that score again and the percentile interval is a point, which would
read as certainty; such a cell gets Wilson's score interval (Wilson 1927) over its independent draws instead, a
stratified cell whose every stratum is alike within itself the weighted mean of its strata's Wilson bounds, a paired
difference whose two sides are each alike Newcombe's hybrid score interval (Newcombe 1998, method 10) — per
stratum, then the weighted mean of the bounds, where each side is alike only within each stratum — two sides that
found and missed exactly the same prompts (every paired difference 0, a point interval again) Tango's score interval
for paired proportions (Tango 1998, Statistics in Medicine 17:891), ±z²/(n + z²) there, and a mean
over lengths whose every cell is alike the pooled Wilson interval (one score everywhere) or the mean of the cells'
intervals (each length at its own score). "Alike" is decided on the scores, equal within :data:`ALIKE_TOLERANCE`,
not on the interval's ends: resampled sums of 0.3 or 1/3 come back a rounding error apart.

**Paired comparisons** (:meth:`Analysis.compare`): perplexity as the ratio A/B (the difference of mean
NLL, exponentiated), every other metric as the difference A − B, computed on the units both methods
have, resample by resample on the same resamples; the interval is its 2.5/97.5 percentiles. Where the
two methods share only some of the task's units, the resamples are drawn by the same contract from the
shared units alone (over several lengths: the units shared at any of them), so that every resample has
as many units as the comparison. A difference
is *significant* when its 95 % interval excludes 0 (ratio 1) and at least :data:`MIN_PAIRED` units are
shared (clusters, where clusters are drawn; the comparison's ``n`` counts them) — below that the percentile
bootstrap cannot tell noise from effect, so no difference is called.
The same rule decides ties in the ranking (:func:`rank_methods`) and the best values of the report's tables.

Kendall τ (:func:`kendall_tau`) is τ-b (ties in either list corrected for) with its two-sided p-value, from
:func:`scipy.stats.kendalltau` (exact for small samples without ties, the normal approximation with the
tie-corrected variance otherwise). :func:`perplexity_correlations` computes it across methods between
perplexity and each downstream accuracy, as LCEG (Lu et al. 2024, arXiv 2409.12181) Table 6 does, and pooled over the accuracy
tasks; its 95 % interval is a two-level bootstrap: resample ``b`` draws the methods with replacement
(``numpy.random.default_rng(BOOTSTRAP_SEED + 1).integers(0, n, size=(B, n))``) and takes each drawn
method's perplexity and accuracy from resample ``b`` of the evaluation samples above, then recomputes τ-b
(resamples where τ is undefined are left out). For these draws the ``n`` methods are numbered in ascending order of
their point (log-perplexity, accuracy), then name, so the interval depends on the data alone: not on the order the
records came in, nor on what the methods are called.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import RopekitError

PLAIN = "plain"
#: Tasks scored per sample in [0, 1], in the order the report shows them.
ACCURACY_TASKS = ("passkey", "niah", "ruler", "longbench", "manyshot", "short")
#: Tasks whose published average is a macro average over this field (RULER's 13 tasks, LongBench's datasets).
#: Many-shot's prompt with k examples is scored at every length it fits, so a length's micro-average would weigh
#: each shot count by how many of them fit; the macro average gives every shot count that fits the same weight.
MACRO_FIELDS = {"ruler": "subtask", "longbench": "dataset", "manyshot": "shots"}
#: Tasks whose units share their draw through this field, resampled as clusters (module docstring): one many-shot
#: query is asked at every shot count, and one needle trial's haystack serves every depth, so the scores of a cluster
#: move together and resampling its units one by one would give intervals too narrow.
CLUSTER_FIELDS = {"manyshot": "sample", "niah": "trial"}
#: Fields that fix a perplexity protocol; records summed into one value must agree on them.
PPL_PROTOCOL = ("corpus", "score_mode", "stride", "weighting", "add_bos")
SPEED_METRICS = ("prefill_s", "decode_s_per_token", "peak_mem_bytes")
SPEED_RATIOS = {"prefill_s": "prefill_ratio", "decode_s_per_token": "decode_ratio", "peak_mem_bytes": "memory_ratio"}
ENTROPY_METRICS = ("entropy_last", "normalised_last")
#: Record fields that identify one evaluation sample across methods, lengths and seeds (module docstring).
UNIT_FIELDS = ("corpus", "doc", "doc_sha", "subtask", "dataset", "shots", "depth", "trial", "sample", "repeat")
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20240917
#: Fewest shared units for a paired difference to be called significant.
MIN_PAIRED = 5


def is_perplexity(task: Any) -> bool:
    """True for the ``ppl`` task and for a study's further perplexity entries (``ppl-same-targets`` …: an ``evals``
    entry naming ``task: ppl`` writes records under its own name, so two protocols never mix in one cell)."""
    return task == "ppl" or (isinstance(task, str) and task.startswith(("ppl-", "ppl_")))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ---- Kendall τ --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KendallResult:
    """τ-b, its two-sided p-value and the number of pairs; ``tau`` is None when undefined (``reason`` says why)."""

    tau: float | None
    p_value: float | None
    n: int
    reason: str | None = None


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> KendallResult:
    """Kendall's τ-b between two paired lists and its two-sided p-value (:func:`scipy.stats.kendalltau`).

    τ-b = (P − Q) / √((n₀ − n₁)(n₀ − n₂)) with P, Q the concordant and discordant pairs, n₀ = n(n−1)/2
    and n₁, n₂ the pairs tied in x and in y (Kendall 1945). Undefined (None) with fewer than two pairs or
    when either list is constant.
    """
    x, y = list(x), list(y)
    if len(x) != len(y):
        raise RopekitError(f"Kendall τ needs paired lists; got {len(x)} and {len(y)} values", "pass one value per method to each list")
    for v in x + y:
        if not _finite(v):
            raise RopekitError(f"Kendall τ got the value {v!r}", "pass finite numbers")
    n = len(x)
    if n < 2:
        return KendallResult(None, None, n, "fewer than two methods")
    if len(set(x)) == 1 or len(set(y)) == 1:
        return KendallResult(None, None, n, "one of the two lists is constant")
    from scipy.stats import kendalltau

    result = kendalltau(x, y, variant="b")
    tau, p = float(result.statistic), float(result.pvalue)
    if not math.isfinite(tau):
        return KendallResult(None, None, n, "undefined for these values")
    return KendallResult(tau, p if math.isfinite(p) else None, n)


def tau_b_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """τ-b of each row pair of two ``(B, n)`` arrays (NaN where undefined), by counting pairs as
    :func:`kendall_tau` defines it."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = x.shape[1]
    if n < 2:
        return np.full(x.shape[0], np.nan)
    i, j = np.triu_indices(n, 1)
    dx, dy = np.sign(x[:, i] - x[:, j]), np.sign(y[:, i] - y[:, j])
    n0 = len(i)
    s = (dx * dy).sum(axis=1)
    denom = np.sqrt((n0 - (dx == 0).sum(axis=1)) * (n0 - (dy == 0).sum(axis=1)).astype(float))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, s / np.where(denom > 0, denom, 1.0), np.nan)


def interpret(result: KendallResult) -> str:
    """A one-line reading of a τ and its p-value in the wording of LCEG Table 6."""
    if result.tau is None:
        return f"undefined ({result.reason})"
    if result.p_value is None:
        return "no p-value"
    if result.p_value < 0.01:
        return "statistically significant (p < 0.01)"
    if result.p_value < 0.05:
        return "statistically significant (p < 0.05)"
    if result.p_value < 0.1:
        return "borderline significant (p < 0.1)"
    return "not significant (p ≥ 0.1)"


# ---- bootstrap primitives ---------------------------------------------------------------------------------
def _sort_value(v: Any) -> tuple:
    if isinstance(v, bool):
        return (1, str(v))
    if isinstance(v, (int, float)):
        return (0, float(v), "")
    return (1, json.dumps(v, sort_keys=True, default=str) if not isinstance(v, str) else v)


def unit_key(record: Mapping[str, Any]) -> tuple:
    """The identity of the evaluation sample a record scored: its :data:`UNIT_FIELDS` that are set."""
    return tuple((f, record[f] if not isinstance(record[f], (list, dict)) else json.dumps(record[f], sort_keys=True))
                 for f in UNIT_FIELDS if record.get(f) is not None)


def _unit_sort(key: tuple) -> tuple:
    return tuple((f, _sort_value(v)) for f, v in key)


def resample_indices(strata: Sequence[int], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """``(resamples, N)`` positions of the units drawn by each resample (module docstring's contract).

    ``strata[j]`` is unit ``j``'s stratum; units of one stratum are drawn only from that stratum, the
    strata in ascending order, each stratum's units in ascending position."""
    strata = np.asarray(strata)
    rng = np.random.default_rng(seed)
    out = np.empty((resamples, len(strata)), dtype=np.int64)
    col = 0
    for s in sorted(set(strata.tolist())):
        positions = np.flatnonzero(strata == s)
        draws = rng.integers(0, len(positions), size=(resamples, len(positions)))
        out[:, col:col + len(positions)] = positions[draws]
        col += len(positions)
    return out


def resample_cluster_counts(clusters: Sequence[int], resamples: int = BOOTSTRAP_RESAMPLES,
                            seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """``(resamples, N)``: how often each unit is drawn when its cluster is (module docstring's contract).

    ``clusters[j]`` is unit ``j``'s cluster, numbered ``0 … n_c − 1`` in ascending order of the field."""
    clusters = np.asarray(clusters, dtype=np.int64)
    n_clusters = int(clusters.max()) + 1 if clusters.size else 0
    draws = np.random.default_rng(seed).integers(0, max(n_clusters, 1), size=(resamples, n_clusters))
    flat = (draws + (np.arange(resamples) * n_clusters)[:, None]).ravel()
    drawn = np.bincount(flat, minlength=resamples * n_clusters).reshape(resamples, n_clusters).astype(float)
    return drawn[:, clusters]


def resample_counts(indices: np.ndarray, n_units: int) -> np.ndarray:
    """How often each unit is drawn in each resample, ``(resamples, n_units)``, from :func:`resample_indices`."""
    b = indices.shape[0]
    flat = (indices + (np.arange(b) * n_units)[:, None]).ravel()
    return np.bincount(flat, minlength=b * n_units).reshape(b, n_units).astype(float)


#: Interval ends closer to 0 than this are 0: a difference of two means of the same scores, summed in another order,
#: comes out a few ulps off 0 (5.6e-17 for two passkey accuracies), and "the interval excludes 0" must not hang on it.
ZERO_END = 1e-12


def percentile_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float] | None:
    """The ``(1−level)/2`` and ``(1+level)/2`` percentiles of the finite values (None when fewer than half are),
    each end within :data:`ZERO_END` of 0 read as 0."""
    values = np.asarray(values, dtype=float)
    finite = values[np.isfinite(values)]
    if finite.size == 0 or finite.size < values.size / 2:
        return None
    lo, hi = (0.0 if abs(end) < ZERO_END else float(end)
              for end in np.percentile(finite, [50 * (1 - level), 50 * (1 + level)]))
    return lo, hi


#: The normal quantile of a two-sided 95 % interval.
Z_95 = 1.959963984540054


def wilson_interval(successes: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval for ``successes`` of ``n`` (Wilson 1927): the proportions ``p`` with
    ``|p̂ − p| ≤ z·√(p(1 − p)/n)``."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # at p̂ = 0 (or 1) the bound is 0 (or 1) exactly; rounding left 3e-18 there
    return (0.0 if p == 0 else max(0.0, centre - half)), (1.0 if p == 1 else min(1.0, centre + half))


#: Scores that differ by at most this (relative to the largest, at least 1) count as alike: a partial-credit score
#: such as 1/3 or 0.3 summed over resampled prompts comes back a rounding error apart, never exactly equal.
ALIKE_TOLERANCE = 1e-12


def _alike_value(scores: np.ndarray) -> float | None:
    """The one score every entry of ``scores`` has (within :data:`ALIKE_TOLERANCE`), else None."""
    scores = np.asarray(scores, dtype=float).ravel()
    if scores.size == 0 or not np.all(np.isfinite(scores)):
        return None
    lo, hi = float(scores.min()), float(scores.max())
    if hi - lo > ALIKE_TOLERANCE * max(1.0, abs(lo), abs(hi)):
        return None
    return float(scores.mean())


def _unit_scores(metric: _Metric, observed: np.ndarray) -> np.ndarray | None:
    """The per-prompt, per-seed scores of a cell on the units ``observed``, or None when they are not one score in
    [0, 1] per prompt and seed (what the intervals of the alike cases below assume)."""
    den = metric.den[:, observed]
    scores = metric.num[:, observed] / np.where(den > 0, den, 1)
    if scores.size == 0 or not np.all(den == 1) or not np.all((scores >= 0) & (scores <= 1)):
        return None
    return scores


def _all_alike_interval(metric: _Metric, observed: np.ndarray, draws: int) -> tuple[float, float] | None:
    """Where every prompt of a cell scored the same, every bootstrap resample is that score again and the
    percentile interval is a point, which reads as certainty. "0 of 20" is then given Wilson's score interval,
    [0, 16 %] for 20 prompts — over ``draws`` independent ones, the clusters where prompts come in clusters (each
    cluster then scored all 0 or all 1). A partial-credit score (RULER's multi-value needles, NIAH recall) that
    came out the same fraction ``p`` on every prompt gets Wilson's interval at ``p̂ = p`` too: a score in [0, 1]
    with mean ``p`` has variance at most ``p(1 − p)`` (Bhatia & Davis 2000), the Bernoulli one, so the interval is
    conservative. Only for scores in [0, 1], one per prompt and seed. "The same" is decided on the scores, within
    :data:`ALIKE_TOLERANCE` (not on the interval's ends, which rounding leaves apart for 0.3 or 1/3)."""
    scores = _unit_scores(metric, observed)
    value = None if scores is None else _alike_value(scores)
    if value is None:
        return None
    return wilson_interval(value * draws, draws)


def _per_stratum(mask: np.ndarray, units: "_Units"):
    """``mask`` cut to each stratum of the task (RULER's subtasks; the one stratum of a task without any), the
    strata it does not reach left out."""
    for columns in units.columns:
        inside = np.zeros_like(mask)
        inside[columns] = mask[columns]
        if inside.any():
            yield inside


def _weighted_bounds(parts: list[tuple[int, tuple[float, float]]], macro: bool) -> tuple[float, float]:
    """The mean of the strata's ``(draws, (low, high))`` bounds with the weights of the statistic: equal for a macro
    average, the strata's draws otherwise."""
    weights = np.array([1.0 if macro else draws for draws, _ in parts])
    weights = weights / weights.sum()
    return (float(sum(w * lo for w, (_, (lo, _)) in zip(weights, parts))),
            float(sum(w * hi for w, (_, (_, hi)) in zip(weights, parts))))


def _strata_alike_interval(metric: _Metric, observed: np.ndarray, units: "_Units") -> tuple[float, float] | None:
    """The stratified counterpart of :func:`_all_alike_interval`: where every stratum's prompts (RULER's subtasks,
    say) scored alike within it — all passed in one, all failed in another — every stratified resample is the same
    mean again, and the bootstrap interval is a point. Each stratum then gets Wilson's interval at its own score
    over its own draws, and the cell the same weighted mean of their bounds as of their scores (equal weights for a
    macro average, the strata's sizes otherwise): the bounds of a mean of proportions that each lie in their own
    interval, so conservative."""
    parts = []
    for inside in _per_stratum(observed, units):
        scores = _unit_scores(metric, inside)
        value = None if scores is None else _alike_value(scores)
        if value is None:
            return None
        draws = units.independent(inside)
        parts.append((draws, wilson_interval(value * draws, draws)))
    return _weighted_bounds(parts, metric.macro) if len(parts) >= 2 else None


def _newcombe(pa: float, pb: float, n: int) -> tuple[float, float]:
    """Newcombe's hybrid score interval for the difference ``pa − pb`` of two proportions over ``n`` each, from their
    Wilson intervals (Newcombe 1998, Statistics in Medicine 17:873, method 10)."""
    (la, ua), (lb, ub) = wilson_interval(pa * n, n), wilson_interval(pb * n, n)
    d = pa - pb
    return (float(d - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2)), float(d + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)))


def _side_values(pairs: list[tuple[_Metric, _Metric]], masks: list[np.ndarray]) -> list[float] | None:
    """The one score each side of a comparison has on every shared prompt of every length, or None."""
    values = []
    for side in (0, 1):
        seen = []
        for pair, mask in zip(pairs, masks):
            scores = _unit_scores(pair[side], mask)
            if scores is None:
                return None
            seen.append(scores.ravel())
        value = _alike_value(np.concatenate(seen))
        if value is None:
            return None
        values.append(value)
    return values


def _strata_difference_interval(pair: tuple[_Metric, _Metric], mask: np.ndarray, units: "_Units"
                                ) -> tuple[float, float] | None:
    """The stratified counterpart of Newcombe's interval at one length: where each side scored alike within every
    stratum (RULER's subtasks) but not with one score across them, every stratified paired resample is the same
    difference and the bootstrap interval is a point ("+50 [+50, +50]"). Each stratum's difference then gets
    Newcombe's interval over its own draws, and the cell the weighted mean of their bounds with the weights of its
    statistic (equal for a macro average, the strata's sizes otherwise), as :func:`_strata_alike_interval` does for
    one cell: the bounds of a mean of differences that each lie in their own interval, so conservative."""
    parts = []
    for inside in _per_stratum(mask, units):
        values = _side_values([pair], [inside])
        draws = units.independent(inside)
        if values is None or draws < 2:
            return None
        parts.append((draws, _newcombe(values[0], values[1], draws)))
    return _weighted_bounds(parts, pair[0].macro) if len(parts) >= 2 else None


def _alike_difference_interval(pairs: list[tuple[_Metric, _Metric]], masks: list[np.ndarray], ns: list[int],
                               units: "_Units") -> tuple[float, float] | None:
    """Where each side of an accuracy comparison scored alike on every shared prompt (all found against all
    missed, say), every paired resample is the same difference and the bootstrap interval is a point ("+100
    [+100, +100]"). The difference of the two proportions then gets Newcombe's hybrid score interval (:func:`_newcombe`)
    over the fewest draws of the compared lengths (``ns``): conservative here, as it ignores the pairing. Where each
    side is alike within each length, or within each stratum of each length (:func:`_strata_difference_interval`),
    but not with one score across them, every resample is again the same (mean) difference: each length then gets
    its own interval over its own draws, and the mean over the lengths the mean of their bounds (as
    :func:`_strata_alike_interval` does for subtasks; conservative, as the bounds add up as if the lengths' errors
    went together)."""
    values = _side_values(pairs, masks)
    if values is not None:
        n = min(ns)
        return _newcombe(values[0], values[1], n) if n >= 2 else None
    parts = []
    for pair, mask, n in zip(pairs, masks, ns):
        values = _side_values([pair], [mask])
        if values is not None:
            if n < 2:
                return None
            parts.append(_newcombe(values[0], values[1], n))
            continue
        strata = _strata_difference_interval(pair, mask, units)
        if strata is None:
            return None
        parts.append(strata)
    return float(np.mean([lo for lo, _ in parts])), float(np.mean([hi for _, hi in parts]))


def no_discordance_interval(n: int, z: float = Z_95) -> tuple[float, float]:
    """Tango's score interval for the difference of two proportions on the same ``n`` prompts (Tango 1998,
    Statistics in Medicine 17:891) where no prompt was found by one side only: the score statistic
    (b − c − nΔ)/√(n(2q̂ + Δ(1 − Δ))), with b = c = 0 and q̂ its constrained estimate (0), equals z at
    Δ = ±z²/(n + z²) — the Wilson bound of 0 discordant prompts of n."""
    bound = z * z / (n + z * z)
    return -bound, bound


def _concordant_interval(pairs: list[tuple[_Metric, _Metric]], masks: list[np.ndarray], units: "_Units"
                         ) -> tuple[float, float] | None:
    """Where two sides found and missed the same prompts — every paired difference 0 — but neither scored alike,
    every paired resample is 0 again and the bootstrap interval is the point "+0 [+0, +0]", read as certainty that
    they do not differ. One seed of found-or-missed prompts then gets Tango's paired score interval per stratum
    (:func:`no_discordance_interval`), weighted as the statistic weighs its strata, and the mean of the bounds over
    the lengths (as :func:`_alike_difference_interval` does). None otherwise (clusters, several seeds, partial credit,
    a prompt found by one side only)."""
    if units.clusters is not None:
        return None
    per_length = []
    for (ma, mb), mask in zip(pairs, masks):
        parts = []
        for inside in _per_stratum(mask, units):
            x, y = _unit_scores(ma, inside), _unit_scores(mb, inside)
            if x is None or y is None or x.shape[0] != 1 or y.shape[0] != 1:
                return None
            x, y = x[0], y[0]
            if not (np.all((x == 0) | (x == 1)) and np.all((y == 0) | (y == 1))):
                return None
            if not np.array_equal(x, y) or x.size < 2:
                return None
            parts.append((x.size, no_discordance_interval(x.size)))
        if not parts:
            return None
        per_length.append(_weighted_bounds(parts, ma.macro))
    return float(np.mean([lo for lo, _ in per_length])), float(np.mean([hi for _, hi in per_length]))


@dataclass
class _Units:
    """One task's units, their strata and the shared resamples."""

    keys: list[tuple]
    strata: np.ndarray
    indices: np.ndarray | None  # the drawn positions; None where clusters are drawn (only counts then)
    counts: np.ndarray
    clusters: np.ndarray | None = None  # each unit's cluster, where clusters are what is drawn
    position: dict[tuple, int] = field(default_factory=dict)

    def __post_init__(self):
        self.position = {k: i for i, k in enumerate(self.keys)}
        self.columns = [np.flatnonzero(self.strata == s) for s in sorted(set(self.strata.tolist()))]

    def independent(self, mask: np.ndarray) -> int:
        """How many independent draws the units in ``mask`` are: the units, or where clusters are drawn the
        clusters they belong to (11 depths of one haystack are one draw: nothing to resample, no interval)."""
        if self.clusters is None:
            return int(np.count_nonzero(mask))
        return len(set(self.clusters[mask].tolist()))


@dataclass
class _Metric:
    """Per-seed sums of one metric of one cell over the task's units: value = Σ num / Σ den (per stratum
    for macro averages; mean NLL for perplexity)."""

    num: np.ndarray  # (seeds, units)
    den: np.ndarray
    macro: bool
    log: bool  # perplexity: the statistic is a mean NLL, shown as exp


@dataclass
class _Cell:
    method: str
    task: str
    length: Any
    seeds: list
    metrics: dict[str, _Metric]


def _ratio(counts: np.ndarray, num: np.ndarray, den: np.ndarray, columns: list[np.ndarray], macro: bool) -> np.ndarray:
    """The statistic for each row of ``counts`` ((B, N) weights): Σ w·num / Σ w·den, or its mean over the
    strata (``columns``) that have any ``den`` for a macro average."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if not macro:
            return (counts @ num) / (counts @ den)
        parts = [(counts[:, c] @ num[c]) / (counts[:, c] @ den[c]) for c in columns if den[c].sum() > 0]
        return np.mean(parts, axis=0) if parts else np.full(counts.shape[0], np.nan)


# ---- aggregates -------------------------------------------------------------------------------------------
def method_order(methods: Iterable[str], preferred: Sequence[str] | None = None) -> list[str]:
    """Distinct methods: those in ``preferred`` first in its order, ``plain`` next, the rest as first seen."""
    seen = list(dict.fromkeys(methods))
    out = [m for m in (preferred or []) if m in seen]
    if PLAIN in seen and PLAIN not in out:
        out.append(PLAIN)
    out += [m for m in seen if m not in out]
    return out


def _groups(records: Iterable[Mapping[str, Any]], *fields: str) -> dict[tuple, list[Mapping[str, Any]]]:
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault(tuple(r.get(f) for f in fields), []).append(r)
    return groups


def _by_seed(records: Sequence[Mapping[str, Any]]) -> dict[Any, list[Mapping[str, Any]]]:
    out: dict[Any, list[Mapping[str, Any]]] = {}
    for r in records:
        out.setdefault(r.get("seed"), []).append(r)
    return dict(sorted(out.items(), key=lambda kv: _sort_value(kv[0])))


def _check_protocol(records: Sequence[Mapping[str, Any]]) -> None:
    protocols = {json.dumps([r.get(f) for f in PPL_PROTOCOL], sort_keys=True, default=str) for r in records}
    if len(protocols) > 1:
        r0 = records[0]
        raise RopekitError(
            f"perplexity records of {r0.get('method')} at length {r0.get('length')} mix protocols {sorted(protocols)}",
            "evaluate every method of a study with one perplexity protocol",
        )


def _ppl_sums(record: Mapping[str, Any]) -> tuple[float, float]:
    if record.get("weighting") == "window":
        return float(record.get("window_mean_nll_sum") or 0.0), float(record.get("windows") or 0)
    return float(record.get("nll_sum") or 0.0), float(record.get("tokens_scored") or 0)


def _exp(nll: float | None) -> float | None:
    if nll is None or not math.isfinite(nll):
        return None if nll is None or math.isnan(nll) else math.inf
    return math.exp(nll) if nll < 709.0 else math.inf  # exp overflows a float past ~709 nats


def ppl_value(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"ppl", "nll", "tokens_scored", "n"}`` of one method's documents at one length (module docstring)."""
    _check_protocol(records)
    tokens = sum(int(r.get("tokens_scored") or 0) for r in records)
    sums = [_ppl_sums(r) for r in records]
    den = sum(d for _, d in sums)
    nll = sum(n for n, _ in sums) / den if den else None
    return {"ppl": _exp(nll), "nll": nll, "tokens_scored": tokens, "n": len(records)}


def accuracy_value(task: str, records: Sequence[Mapping[str, Any]]) -> tuple[float | None, int]:
    """Mean score (macro over :data:`MACRO_FIELDS` subgroups for RULER, LongBench and many-shot) and the sample count."""
    scored = [r for r in records if _finite(r.get("score"))]
    if not scored:
        return None, 0
    field_ = MACRO_FIELDS.get(task)
    if field_ and any(r.get(field_) is not None for r in scored):
        parts = _groups(scored, field_)
        means = [statistics.fmean(float(r["score"]) for r in rs) for rs in parts.values()]
        return statistics.fmean(means), len(scored)
    return statistics.fmean(float(r["score"]) for r in scored), len(scored)


def _seed_fields(per_seed: dict[Any, float | None]) -> dict[str, Any]:
    """``seeds`` and, with several seeds, their values and spread (on the value's own scale)."""
    if list(per_seed) == [None]:
        return {}
    out: dict[str, Any] = {"seeds": len(per_seed)}
    values = [v for v in per_seed.values() if v is not None and math.isfinite(v)]
    if len(per_seed) > 1:
        out["seed_values"] = {str(k): v for k, v in per_seed.items()}
        if values:
            out["seed_min"], out["seed_max"] = min(values), max(values)
            out["seed_sd"] = statistics.stdev(values) if len(values) > 1 else None
    return out


def _mean_over_seeds(values: list[float | None], log: bool) -> float | None:
    if any(v is None for v in values):
        return None
    if log:  # perplexity: the geometric mean (mean NLL)
        if any(v <= 0 or math.isinf(v) for v in values):
            return math.inf if any(math.isinf(v) for v in values) else None
        return math.exp(statistics.fmean(math.log(v) for v in values))
    return statistics.fmean(values)


class Analysis:
    """Every aggregate of a study's records with its bootstrap interval, and paired comparisons
    (module docstring). ``rows`` are :func:`aggregate`'s rows; ``table`` looks them up."""

    def __init__(self, records: Iterable[Mapping[str, Any]], preferred: Sequence[str] | None = None, *,
                 resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED):
        self.records = list(records)
        self.resamples, self.seed = resamples, seed
        self.methods = method_order((r.get("method") for r in self.records), preferred)
        self.units: dict[str, _Units] = {}
        self._order: dict[str, dict[int, int]] = {}  # a task's record → its position (units of records naming none)
        self._cache: dict[tuple, np.ndarray] = {}
        self.cells: dict[tuple, _Cell] = {}
        rows: list[dict[str, Any]] = []
        for (task,), task_records in _groups(self.records, "task").items():
            self.units[task] = self._make_units(task, task_records)
            if task == "speed":
                rows += self._speed_rows(task_records)
                continue
            for (method, length), recs in _groups(task_records, "method", "length").items():
                rows += self._cell_rows(task, method, length, recs)
        order = {m: i for i, m in enumerate(self.methods)}
        task_rank = {t: i for i, t in enumerate(("ppl",) + ACCURACY_TASKS + ("entropy", "speed"))}
        metric_rank = {m: i for i, m in enumerate(("ppl", "accuracy") + ENTROPY_METRICS + SPEED_METRICS + tuple(SPEED_RATIOS.values()))}
        rows.sort(key=lambda r: (task_rank.get(r["task"], len(task_rank)), str(r["task"]), order.get(r["method"], len(order)),
                                 r["length"] if r["length"] is not None else -1, metric_rank.get(r["metric"], 99)))
        self.rows = rows
        self.table = Table(rows, analysis=self)

    def without(self, cells: Iterable[tuple]) -> "Analysis":
        """This analysis with the cells ``(method, task, length)`` left out: their rows, records and resamples are
        gone from the copy (its table, comparisons and intervals never read them), while the units, resamples and
        values of every other cell are shared, so they are exactly this analysis's. ``self`` when none of ``cells``
        is here. (The report keeps the cells of unfinished pieces out of its findings this way.)"""
        hidden = {tuple(c) for c in cells}
        if not any((r["method"], r["task"], r["length"]) in hidden for r in self.rows):
            return self
        view = copy.copy(self)
        view.cells = {k: v for k, v in self.cells.items() if k not in hidden}
        view.records = [r for r in self.records if (r.get("method"), r.get("task"), r.get("length")) not in hidden]
        view.rows = [r for r in self.rows if (r["method"], r["task"], r["length"]) not in hidden]
        view.methods = method_order((r.get("method") for r in view.records), self.methods)
        view.table = Table(view.rows, analysis=view)
        return view

    # ---- construction ----
    def _make_units(self, task: str, records: Sequence[Mapping[str, Any]]) -> _Units:
        self._order[task] = {id(r): i for i, r in enumerate(records)}
        keys = sorted({self._key(r, i) for i, r in enumerate(records)}, key=_unit_sort)
        field_ = MACRO_FIELDS.get(task)
        if field_ and any(r.get(field_) is not None for r in records):
            names = sorted({dict(k).get(field_) for k in keys}, key=_sort_value)
            rank = {n: i for i, n in enumerate(names)}
            strata = np.array([rank[dict(k).get(field_)] for k in keys], dtype=int)
        else:
            strata = np.zeros(len(keys), dtype=int)
        return self._resampled(task, keys, strata)

    def _resampled(self, task: str, keys: list[tuple], strata: np.ndarray) -> _Units:
        """``keys`` with their resamples: by clusters where the task's units share a draw, else by stratum."""
        field_ = CLUSTER_FIELDS.get(task)
        values = [dict(k).get(field_) for k in keys] if field_ else []
        if values and all(v is not None for v in values):
            rank = {v: i for i, v in enumerate(sorted(set(values), key=_sort_value))}
            clusters = np.array([rank[v] for v in values], dtype=np.int64)
            return _Units(keys, strata, None, resample_cluster_counts(clusters, self.resamples, self.seed), clusters)
        indices = resample_indices(strata, self.resamples, self.seed)
        return _Units(keys, strata, indices, resample_counts(indices, len(keys)))

    @staticmethod
    def _key(record: Mapping[str, Any], i: int) -> tuple:
        key = unit_key(record)
        return key if key else (("_record", i),)  # a record naming no unit stands alone (never paired)

    def _cell_rows(self, task: str, method: str, length: Any, recs: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
        units = self.units[task]
        order = self._order[task]
        seeds = _by_seed(recs)
        base = {"method": method, "task": task, "length": length}
        rows: list[dict[str, Any]] = []
        metrics: dict[str, _Metric] = {}

        def arrays(pick, macro=False, log=False):
            num = np.zeros((len(seeds), len(units.keys)))
            den = np.zeros_like(num)
            for s, srecs in enumerate(seeds.values()):
                for r in srecs:
                    got = pick(r)
                    if got is None:
                        continue
                    j = units.position[self._key(r, order[id(r)])]
                    num[s, j] += got[0]
                    den[s, j] += got[1]
            return _Metric(num, den, macro, log)

        if is_perplexity(task):
            per_seed = {}
            for s, srecs in seeds.items():
                per_seed[s] = ppl_value(srecs)
            _check_protocol(recs)
            metrics["ppl"] = arrays(_ppl_sums, log=True)
            values = {s: v["ppl"] for s, v in per_seed.items()}
            value = _mean_over_seeds(list(values.values()), log=True) if len(values) > 1 else next(iter(values.values()))
            nll = statistics.fmean(v["nll"] for v in per_seed.values()) if all(v["nll"] is not None for v in per_seed.values()) else None
            row = {**base, "metric": "ppl", "value": value, "n": max(v["n"] for v in per_seed.values()), "nll": nll,
                   "tokens_scored": sum(v["tokens_scored"] for v in per_seed.values())}
            rows.append(self._finish(row, metrics["ppl"], units, _seed_fields(values)))
        elif task == "entropy":
            for metric in ENTROPY_METRICS:
                per_seed = {s: [float(r[metric]) for r in srecs if _finite(r.get(metric))] for s, srecs in seeds.items()}
                if not any(per_seed.values()):
                    continue
                metrics[metric] = arrays(lambda r, metric=metric: (float(r[metric]), 1.0) if _finite(r.get(metric)) else None)
                values = {s: statistics.fmean(v) if v else None for s, v in per_seed.items()}
                row = {**base, "metric": metric, "value": _mean_over_seeds(list(values.values()), log=False),
                       "n": max(len(v) for v in per_seed.values())}
                rows.append(self._finish(row, metrics[metric], units, _seed_fields(values)))
        else:
            per_seed = {s: accuracy_value(task, srecs) for s, srecs in seeds.items()}
            if any(n for _, n in per_seed.values()):
                field_ = MACRO_FIELDS.get(task)
                macro = bool(field_) and any(r.get(field_) is not None for r in recs if _finite(r.get("score")))
                metrics["accuracy"] = arrays(lambda r: (float(r["score"]), 1.0) if _finite(r.get("score")) else None, macro=macro)
                values = {s: v for s, (v, n) in per_seed.items()}
                row = {**base, "metric": "accuracy", "value": _mean_over_seeds(list(values.values()), log=False),
                       "n": max(n for _, n in per_seed.values())}
                rows.append(self._finish(row, metrics["accuracy"], units, _seed_fields(values)))
        self.cells[(method, task, length)] = _Cell(method, task, length, list(seeds), metrics)
        return rows

    def _finish(self, row: dict[str, Any], metric: _Metric, units: _Units, seed_fields: dict[str, Any]) -> dict[str, Any]:
        reps = self._reps(metric, units)
        ci = percentile_interval(reps)
        if ci is not None and metric.log:
            ci = (_exp(ci[0]), _exp(ci[1]))
        observed = metric.den.sum(axis=0) > 0  # units (documents, prompts) this cell has
        draws = units.independent(observed)
        if draws < 2:
            ci = None  # one unit (one cluster): the bootstrap has nothing to resample, and a point is no interval
        elif row.get("metric") == "accuracy":  # alike prompts: decided on the scores (module docstring)
            ci = _all_alike_interval(metric, observed, draws) or _strata_alike_interval(metric, observed, units) or ci
        row["ci95"] = list(ci) if ci is not None else None
        row.update(seed_fields)
        return row

    def _speed_rows(self, records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Medians over repeats, each with the bootstrap of the median over repeats; ratios to plain's median
        at the same length paired by repeat."""
        units = self.units["speed"]
        order = self._order["speed"]
        vectors: dict[tuple, dict[str, np.ndarray]] = {}
        for (method, length), recs in _groups(records, "method", "length").items():
            for metric in SPEED_METRICS:
                vec = np.full(len(units.keys), np.nan)
                for r in recs:
                    if _finite(r.get(metric)):
                        vec[units.position[self._key(r, order[id(r)])]] = float(r[metric])
                if np.isfinite(vec).any():
                    vectors.setdefault((method, length), {})[metric] = vec
        rows = []
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a resample of only repeats a method lacks
            for (method, length), metrics in vectors.items():
                plain = vectors.get((PLAIN, length), {})
                for metric, vec in metrics.items():
                    values = [float(v) for v in vec[np.isfinite(vec)]]
                    reps = np.nanmedian(vec[units.indices], axis=1) if len(values) > 1 else np.full(self.resamples, values[0])
                    ci = percentile_interval(reps)
                    value = statistics.median(values)
                    rows.append({"method": method, "task": "speed", "length": length, "metric": metric, "value": value,
                                 "ci95": list(ci) if ci else None, "n": len(values)})
                    base = plain.get(metric)
                    if base is not None and statistics.median(base[np.isfinite(base)].tolist()) > 0:
                        base_value = statistics.median(base[np.isfinite(base)].tolist())
                        ratio_reps = reps / np.nanmedian(base[units.indices], axis=1)
                        ci = percentile_interval(ratio_reps)
                        rows.append({"method": method, "task": "speed", "length": length, "metric": SPEED_RATIOS[metric],
                                     "value": value / base_value, "ci95": list(ci) if ci else None, "n": len(values)})
        return rows

    # ---- resamples ----
    def _reps(self, metric: _Metric, units: _Units, mask: np.ndarray | None = None,
              keep: np.ndarray | None = None) -> np.ndarray:
        """Resampled statistic of one cell (mean over its seeds; mean NLL for perplexity), ``(B,)``; cached per
        cell, mask and kept units (the ranking compares every pair of methods, mostly on the same units).
        ``keep`` names the task's units that ``units`` (from :meth:`_shared_units`) resamples."""
        if mask is not None and mask.all():
            mask = None
        key = (id(metric), None if mask is None else mask.tobytes(), None if keep is None else keep.tobytes())
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        num, den = (metric.num, metric.den) if mask is None else (metric.num * mask, metric.den * mask)
        if keep is not None:
            num, den = num[:, keep], den[:, keep]
        per_seed = [_ratio(units.counts, num[s], den[s], units.columns, metric.macro) for s in range(num.shape[0])]
        self._cache[key] = out = np.mean(per_seed, axis=0)
        return out

    def _shared_units(self, task: str, keep: np.ndarray) -> _Units:
        """The task's units ``keep`` alone, resampled by the module docstring's contract over them: a paired
        comparison draws its resamples from the units both sides have, so that every resample holds as many of
        them as the comparison does (drawn from the task's union, the count of shared units in a resample
        varies, and the interval comes out wider than the pair's own)."""
        key = ("units", task, keep.tobytes())
        cached = self._cache.get(key)
        if cached is None:
            units = self.units[task]
            kept = [units.keys[i] for i in np.flatnonzero(keep)]
            self._cache[key] = cached = self._resampled(task, kept, units.strata[keep])
        return cached

    def _point(self, metric: _Metric, units: _Units, mask: np.ndarray | None = None) -> float:
        num, den = (metric.num, metric.den) if mask is None else (metric.num * mask, metric.den * mask)
        ones = np.ones((1, num.shape[1]))
        return float(np.mean([_ratio(ones, num[s], den[s], units.columns, metric.macro)[0] for s in range(num.shape[0])]))

    def _metric(self, method: str, task: str, length: Any, metric: str) -> _Metric | None:
        cell = self.cells.get((method, task, length))
        return None if cell is None else cell.metrics.get(metric)

    @staticmethod
    def _present(metric: _Metric) -> np.ndarray:
        """Units the cell has in every seed."""
        return (metric.den > 0).all(axis=0)

    def replicates(self, method: str, task: str, length: Any, metric: str, *, mask: np.ndarray | None = None) -> np.ndarray | None:
        """The ``(B,)`` resampled values of one cell (mean NLL for perplexity), or None when absent."""
        m = self._metric(method, task, length, metric)
        return None if m is None else self._reps(m, self.units[task], mask)

    def unit_count(self, method: str, task: str, length: Any, metric: str) -> int:
        m = self._metric(method, task, length, metric)
        return 0 if m is None else int(self._present(m).sum())

    def compare(self, a: str, b: str, task: str, lengths: Any, metric: str, *,
                length_b: Any = None) -> dict[str, Any] | None:
        """Paired comparison of method ``a`` against ``b`` (module docstring): ``{"kind": "ratio"|"difference",
        "estimate", "ci95", "n", "significant", "direction"}`` — ``direction`` is +1 when ``a`` is higher,
        −1 when lower, 0 when not significant. ``lengths`` is one length or a list (the statistic is then
        the mean over them, each paired on its own shared units); ``length_b`` compares ``a`` at ``lengths``
        with ``b`` at another length (a method against itself across lengths)."""
        many = isinstance(lengths, (list, tuple))
        la = list(lengths) if many else [lengths]
        lb = la if length_b is None else ([length_b] * len(la))
        units = self.units.get(task)
        if units is None or not la:
            return None
        pairs, masks = [], []
        for x, y in zip(la, lb):
            ma, mb = self._metric(a, task, x, metric), self._metric(b, task, y, metric)
            if ma is None or mb is None:
                return None
            mask = self._present(ma) & self._present(mb)
            if not mask.any():
                return None
            pairs.append((ma, mb))
            masks.append(mask)
        # resample the units the comparison reads (over several lengths, those of any of them)
        keep = np.logical_or.reduce(masks)
        drawn, kept = (units, None) if keep.all() else (self._shared_units(task, keep), keep)
        reps_a, reps_b, pts_a, pts_b = [], [], [], []
        for (ma, mb), mask in zip(pairs, masks):
            reps_a.append(self._reps(ma, drawn, mask, kept))
            reps_b.append(self._reps(mb, drawn, mask, kept))
            pts_a.append(self._point(ma, units, mask))
            pts_b.append(self._point(mb, units, mask))
        log = pairs[0][0].log
        ns = [units.independent(m) for m in masks]  # clusters, where prompts come in clusters
        diff = np.mean(reps_a, axis=0) - np.mean(reps_b, axis=0)
        point = float(np.mean(pts_a) - np.mean(pts_b))
        ci = percentile_interval(diff)
        n = min(ns)
        if not log:  # each side alike on its shared prompts: decided on the scores, not on the interval's ends
            ci = _alike_difference_interval(pairs, masks, ns, units) or ci
            if ci is not None and ci[0] == ci[1] == 0.0:  # the same prompts found and missed on both sides
                ci = _concordant_interval(pairs, masks, units) or ci
        significant = ci is not None and n >= MIN_PAIRED and (ci[0] > 0 or ci[1] < 0)
        direction = (1 if point > 0 else -1) if significant else 0
        if log:
            return {"kind": "ratio", "estimate": _exp(point), "ci95": [_exp(ci[0]), _exp(ci[1])] if ci else None,
                    "n": n, "significant": significant, "direction": direction}
        return {"kind": "difference", "estimate": point, "ci95": list(ci) if ci else None, "n": n,
                "significant": significant, "direction": direction}

    def mean_interval(self, method: str, task: str, lengths: Sequence[Any], metric: str) -> list[float] | None:
        """95 % interval of a method's mean over several lengths (resample by resample; for accuracy cells whose
        prompts all scored alike, :meth:`_all_alike_over`)."""
        reps = [self.replicates(method, task, L, metric) for L in lengths]
        if not reps or any(r is None for r in reps):
            return None
        ci = percentile_interval(np.mean(reps, axis=0))
        if metric == "accuracy":
            ci = self._all_alike_over(method, task, lengths) or ci
        return list(ci) if ci else None

    def _all_alike_over(self, method: str, task: str, lengths: Sequence[Any]) -> tuple[float, float] | None:
        """The interval of a mean over several lengths whose every cell is alike (every bootstrap resample of it is
        the same mean again, a point): with one score on every prompt of every length (all passed, all failed, or one
        partial-credit fraction), Wilson's interval over the prompts of all the lengths pooled — the pooled
        counterpart of :func:`_all_alike_interval`; with each length alike but at its own score (all found at 256,
        all missed at 512), each length's own interval (Wilson's at its score, or its subtasks' as
        :func:`_strata_alike_interval` gives it) and the mean of their bounds, as the mean over lengths weighs the
        lengths equally (the bounds of a mean of proportions each inside its own interval: conservative). None
        when some length is not alike, or with fewer than two draws in all."""
        units = self.units[task]
        n, seen, cells, scores = 0, np.zeros(len(units.keys), dtype=bool), [], []
        for length in lengths:
            m = self._metric(method, task, length, "accuracy")
            if m is None:
                return None
            observed = m.den.sum(axis=0) > 0
            draws = units.independent(observed)
            alike = _all_alike_interval(m, observed, draws) or _strata_alike_interval(m, observed, units)
            if alike is None:
                return None
            cells.append(alike)
            scores.append(_unit_scores(m, observed))
            n += int(observed.sum())
            seen |= observed
        if units.clusters is not None:  # a cluster (one haystack, one query) at several lengths is still one draw
            n = units.independent(seen)
        if not cells or n < 2:
            return None
        value = _alike_value(np.concatenate([s.ravel() for s in scores])) if all(s is not None for s in scores) else None
        if value is not None:
            return wilson_interval(value * n, n)
        return float(np.mean([lo for lo, _ in cells])), float(np.mean([hi for _, hi in cells]))

    def curve_intervals(self, method: str, length: Any) -> tuple[list, list] | None:
        """Per-bucket 95 % intervals of the mean-NLL-by-position curve (documents resampled; first seed's
        records and mean over seeds as for the cell), or None when the records carry no per-bucket sums."""
        recs = [r for r in self.records if r.get("task") == "ppl" and r.get("method") == method and r.get("length") == length
                and r.get("curve_nll_sum") is not None and r.get("curve_tokens") is not None]
        if not recs:
            return None
        units = self.units["ppl"]
        order = self._order["ppl"]
        seeds = _by_seed(recs)
        k = len(recs[0]["curve_nll_sum"])
        if any(len(r["curve_nll_sum"]) != k for r in recs):
            return None
        reps = []
        for srecs in seeds.values():
            num = np.zeros((len(units.keys), k))
            den = np.zeros_like(num)
            for r in srecs:
                j = units.position[self._key(r, order[id(r)])]
                num[j] += np.asarray(r["curve_nll_sum"], dtype=float)
                den[j] += np.asarray(r["curve_tokens"], dtype=float)
            with np.errstate(invalid="ignore", divide="ignore"):
                reps.append((units.counts @ num) / (units.counts @ den))
        reps = np.mean(reps, axis=0)  # (B, k)
        lo, hi = [], []
        for j in range(k):
            ci = percentile_interval(reps[:, j])
            lo.append(ci[0] if ci else None)
            hi.append(ci[1] if ci else None)
        return lo, hi


def aggregate(records: Iterable[Mapping[str, Any]], preferred: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Aggregate rows per method × task × length × metric (module docstring), ordered by task, method
    (:func:`method_order`), length and metric."""
    return Analysis(records, preferred).rows


class Table:
    """Lookup of aggregate rows by (method, task, length, metric); ``analysis`` (when built by
    :class:`Analysis`) gives the resamples behind them."""

    def __init__(self, rows: Iterable[Mapping[str, Any]], analysis: Analysis | None = None):
        self.rows = list(rows)
        self.analysis = analysis
        self._index = {(r["method"], r["task"], r["length"], r["metric"]): r for r in self.rows}

    def get(self, method: str, task: str, length: int, metric: str) -> float | None:
        row = self._index.get((method, task, length, metric))
        return None if row is None else row["value"]

    def row(self, method: str, task: str, length: int, metric: str) -> Mapping[str, Any] | None:
        return self._index.get((method, task, length, metric))

    def methods(self, task: str | None = None) -> list[str]:
        return list(dict.fromkeys(r["method"] for r in self.rows if task is None or r["task"] == task))

    def lengths(self, task: str) -> list[int]:
        return sorted({r["length"] for r in self.rows if r["task"] == task and r["length"] is not None})

    def tasks(self) -> list[str]:
        return list(dict.fromkeys(r["task"] for r in self.rows))

    def perplexity_task(self) -> str | None:
        """The perplexity task the ranking, the correlations and the headline read: ``ppl`` where the study has it,
        else its first other perplexity task (``ppl-same-targets``: a study may measure perplexity only that way)."""
        tasks = [t for t in self.tasks() if is_perplexity(t)]
        return "ppl" if "ppl" in tasks else (tasks[0] if tasks else None)

    def accuracy_tasks(self) -> list[str]:
        """Tasks with an accuracy metric: :data:`ACCURACY_TASKS` order first, then any other."""
        tasks = self.tasks()
        scored = [t for t in tasks if any(r["task"] == t and r["metric"] == "accuracy" for r in self.rows)]
        return [t for t in ACCURACY_TASKS if t in scored] + [t for t in scored if t not in ACCURACY_TASKS]


# ---- per-position NLL curves ------------------------------------------------------------------------------
def nll_curves(records: Iterable[Mapping[str, Any]], analysis: Analysis | None = None) -> list[dict[str, Any]]:
    """Mean NLL by position in the window per (method, length): ``{"method", "length", "positions", "mean_nll"}``
    (with ``analysis``, also ``ci_low``/``ci_high``: per-bucket bootstrap intervals over documents).

    Records of :mod:`ropekit.eval.perplexity` carry per-bucket sums (``curve_nll_sum``, ``curve_tokens``,
    ``curve_positions``): the curve is Σ sums / Σ counts over the documents, exact. Records that carry a
    finished curve instead (``nll_curve`` with ``nll_curve_positions``) are averaged bucket by bucket,
    weighted by each record's ``tokens_scored`` (1 when absent). Buckets without tokens are None.
    """
    curves = []
    for (method, length), recs in _groups((r for r in records if r.get("task") == "ppl"), "method", "length").items():
        with_sums = [r for r in recs if r.get("curve_nll_sum") is not None and r.get("curve_tokens") is not None]
        if with_sums:
            positions = list(with_sums[0].get("curve_positions") or range(len(with_sums[0]["curve_nll_sum"])))
            if any(len(r["curve_nll_sum"]) != len(positions) for r in with_sums):
                raise RopekitError(f"NLL curves of {method} at {length} have different bucket counts", "evaluate with one protocol")
            sums = [sum(col) for col in zip(*(r["curve_nll_sum"] for r in with_sums))]
            counts = [sum(col) for col in zip(*(r["curve_tokens"] for r in with_sums))]
            mean = [s / c if c else None for s, c in zip(sums, counts)]
        else:
            generic = [r for r in recs if r.get("nll_curve") is not None]
            if not generic:
                continue
            positions = list(generic[0].get("nll_curve_positions") or range(len(generic[0]["nll_curve"])))
            if any(len(r["nll_curve"]) != len(positions) for r in generic):
                raise RopekitError(f"NLL curves of {method} at {length} have different bucket counts", "evaluate with one protocol")
            mean = []
            for j in range(len(positions)):
                pairs = [(float(r["nll_curve"][j]), float(r.get("tokens_scored") or 1)) for r in generic if _finite(r["nll_curve"][j])]
                weight = sum(w for _, w in pairs)
                mean.append(sum(v * w for v, w in pairs) / weight if weight else None)
        curve = {"method": method, "length": length, "positions": positions, "mean_nll": mean}
        if analysis is not None and with_sums:
            got = analysis.curve_intervals(method, length)
            if got is not None:
                curve["ci_low"], curve["ci_high"] = got
        curves.append(curve)
    return curves


# ---- perplexity vs downstream ---------------------------------------------------------------------------
def _tau_interval(analysis: Analysis, points: list[tuple[str, float, float, list[tuple[str, Any]], list[tuple[str, Any]]]]
                  ) -> list[float] | None:
    """Two-level bootstrap interval of τ-b (module docstring). ``points``: per method, its point log-perplexity (x)
    and accuracy (y), and the (task, length) cells whose mean is its log-perplexity and whose mean is its accuracy.
    The methods are drawn by their position in ascending order of (x, y, name) — what the data say, not the order the
    records came in nor what the methods are called — so the same study gives the same interval."""
    points = sorted(points, key=lambda p: (p[1], p[2], str(p[0])))
    points = [(m, xcells, ycells) for m, _, _, xcells, ycells in points]
    n = len(points)
    if n < 2:
        return None
    xs, ys = [], []
    for _, xcells, ycells in points:
        xr = [analysis.replicates(m, t, L, "ppl") for m, t, L in xcells]
        yr = [analysis.replicates(m, t, L, "accuracy") for m, t, L in ycells]
        if any(r is None for r in xr + yr):
            return None
        xs.append(np.mean(xr, axis=0))
        ys.append(np.mean(yr, axis=0))
    x, y = np.stack(xs, axis=1), np.stack(ys, axis=1)  # (B, methods)
    draw = np.random.default_rng(analysis.seed + 1).integers(0, n, size=(x.shape[0], n))
    rows = np.arange(x.shape[0])[:, None]
    ci = percentile_interval(tau_b_rows(x[rows, draw], y[rows, draw]))
    return list(ci) if ci else None


def perplexity_correlations(table: Table, target_length: int | None) -> list[dict[str, Any]]:
    """Kendall τ across methods between perplexity and each accuracy task (LCEG Table 6), two ways:

    * ``"target"`` — perplexity and accuracy at one length: the target length when both tasks were
      evaluated there, else the longest length they share;
    * ``"mean"`` — per method, the mean log-perplexity (log of the geometric mean) and the mean accuracy
      over every length both tasks share; methods lacking any of those lengths are left out;

    and, with two or more accuracy tasks, ``task="pooled"`` rows of each mode: per method the mean over the
    tasks of the per-task log-perplexity and of the per-task accuracy (methods with every task). With an
    :class:`Analysis` behind the table each row has ``ci95``, the two-level bootstrap interval of τ
    (module docstring). Negative τ means lower perplexity goes with higher accuracy. The perplexity is
    :meth:`Table.perplexity_task`'s.
    """
    ppl = table.perplexity_task()
    if ppl is None:
        return []
    ppl_lengths = set(table.lengths(ppl))
    analysis = table.analysis
    out = []
    per_task: dict[str, dict[str, dict[str, tuple]]] = {"target": {}, "mean": {}}
    for task in table.accuracy_tasks():
        shared = sorted(ppl_lengths & set(table.lengths(task)))
        if not shared:
            continue
        methods = [m for m in table.methods(ppl) if m in table.methods(task)]
        at = target_length if target_length in shared else shared[-1]
        pairs = [(m, table.get(m, ppl, at, "ppl"), table.get(m, task, at, "accuracy")) for m in methods]
        pairs = [(m, p, a) for m, p, a in pairs if p is not None and a is not None and _finite(p) and p > 0]
        per_task["target"][task] = {m: (math.log(p), a, [(m, ppl, at)], [(m, task, at)]) for m, p, a in pairs}
        means = {}
        for m in methods:
            p = [table.get(m, ppl, L, "ppl") for L in shared]
            a = [table.get(m, task, L, "accuracy") for L in shared]
            if all(v is not None and _finite(v) and v > 0 for v in p) and all(v is not None for v in a):
                means[m] = (statistics.fmean(math.log(v) for v in p), statistics.fmean(a),
                            [(m, ppl, L) for L in shared], [(m, task, L) for L in shared])
        per_task["mean"][task] = means
        for mode, lengths in (("target", [at]), ("mean", shared)):
            out.append(_kendall_row(analysis, task, mode, lengths, per_task[mode][task]))
    tasks = list(per_task["target"])
    if len(tasks) >= 2:
        for mode in ("target", "mean"):
            common = [m for m in table.methods(ppl) if all(m in per_task[mode][t] for t in tasks)]
            pooled = {}
            for m in common:
                vals = [per_task[mode][t][m] for t in tasks]
                pooled[m] = (statistics.fmean(v[0] for v in vals), statistics.fmean(v[1] for v in vals),
                             [c for v in vals for c in v[2]], [c for v in vals for c in v[3]])
            lengths = sorted({L for t in tasks for v in per_task[mode][t].values() for _, _, L in v[2]})
            row = _kendall_row(analysis, "pooled", mode, lengths, pooled)
            row["tasks"] = tasks
            out.append(row)
    return out


def _kendall_row(analysis: Analysis | None, task: str, mode: str, lengths: list, points: dict[str, tuple]) -> dict[str, Any]:
    methods = list(points)
    result = kendall_tau([points[m][0] for m in methods], [points[m][1] for m in methods])
    row = {"task": task, "mode": mode, "lengths": list(lengths), "tau": result.tau, "p_value": result.p_value,
           "n": result.n, "methods": methods, "interpretation": interpret(result)}
    if analysis is not None:
        row["ci95"] = (_tau_interval(analysis, [(m, *points[m]) for m in methods]) if result.tau is not None else None)
    return row


# ---- ranking ----------------------------------------------------------------------------------------------
#: The accuracy task that ranks methods, first one present wins.
RANK_TASKS = ("passkey", "niah", "ruler", "longbench", "manyshot")


def rank_methods(table: Table, window: int | None, target_length: int | None,
                 preferred: Sequence[str] | None = None) -> dict[str, Any]:
    """Rank the methods: ``{"rule": text, "task", "lengths", "ppl_task", "ppl_length", "rows": [{"rank", "method",
    "primary", "primary_ci95", "ppl", "ppl_ci95", "tied", "tied_with_next", "beats"}]}``.

    Order: the mean accuracy of the first task of :data:`RANK_TASKS` present, over its lengths beyond the
    pretrained ``window`` (all its lengths when no window is known or none lies beyond), higher first; a
    method must have every one of those lengths to get a value. Then perplexity (:meth:`Table.perplexity_task`) at
    the target length (the longest perplexity length when the target was not evaluated), lower first. Methods without a primary
    value come after those with one.

    Rank: with an :class:`Analysis` behind the table, 1 + the number of methods *significantly* better —
    B is significantly better than A when its primary accuracy is higher with the paired interval of the
    difference excluding 0, or, when the primary difference is not significant (or neither has one), its
    perplexity is lower with the paired interval of the ratio excluding 1 (:meth:`Analysis.compare`). A method
    no other is significantly better than has rank 1. Without an analysis equal keys share a rank (1, 2, 2, 4).

    The rank summarises each method's own comparisons; it does not order the methods pair by pair. Significance
    is not transitive: A may rank above B with neither significantly better than the other (B ranks lower because
    a third method C beats it, and C does not beat A), and two methods may share a rank while one is
    significantly better than the other. So a row above another does not by itself mean *significantly* better:
    each row's ``beats`` lists the methods it is significantly better than, and ``tied_with_next`` says whether the
    next row is not significantly worse than this one; ``tied``: another method has the same rank.
    """
    methods = method_order(table.methods(), preferred)
    task = next((t for t in RANK_TASKS if t in table.tasks()), None)
    lengths: list[int] = []
    if task:
        all_lengths = table.lengths(task)
        lengths = [L for L in all_lengths if window is not None and L > window] or all_lengths
    ppl = table.perplexity_task()
    ppl_lengths = table.lengths(ppl) if ppl else []
    ppl_at = (target_length if target_length in ppl_lengths else ppl_lengths[-1]) if ppl_lengths else None
    analysis = table.analysis
    rows = []
    for m in methods:
        primary = primary_ci = None
        if task:
            values = [table.get(m, task, L, "accuracy") for L in lengths]
            if values and all(v is not None for v in values):
                primary = statistics.fmean(values)
                if analysis is not None:
                    primary_ci = analysis.mean_interval(m, task, lengths, "accuracy")
        row = table.row(m, ppl, ppl_at, "ppl") if ppl_at is not None else None
        rows.append({"method": m, "primary": primary, "primary_ci95": primary_ci,
                     "ppl": row["value"] if row else None, "ppl_ci95": row.get("ci95") if row else None})
    if not task and ppl_at is None:
        return {"rule": "", "task": None, "lengths": [], "ppl_task": None, "ppl_length": None, "rows": []}

    def key(row):
        p = row["primary"]
        q = row["ppl"] if row["ppl"] is not None and not math.isnan(row["ppl"]) else math.inf
        return (p is None, -(p or 0.0), q)

    rows.sort(key=key)

    def better(b_row, a_row) -> bool:
        """Whether ``b_row`` is significantly better than ``a_row``."""
        if analysis is None:
            return key(b_row) < key(a_row)
        b, a = b_row["method"], a_row["method"]
        if task:
            if (b_row["primary"] is None) != (a_row["primary"] is None):
                return a_row["primary"] is None
            if b_row["primary"] is not None:
                c = analysis.compare(b, a, task, lengths, "accuracy")
                if c is not None and c["significant"]:
                    return c["direction"] > 0
        if ppl_at is None:
            return False
        if (b_row["ppl"] is None) != (a_row["ppl"] is None):
            return a_row["ppl"] is None
        c = analysis.compare(b, a, ppl, ppl_at, "ppl")
        return c is not None and c["significant"] and c["direction"] < 0

    wins = {row["method"]: [other["method"] for other in rows if other is not row and better(row, other)] for row in rows}
    for row in rows:
        row["rank"] = 1 + sum(row["method"] in wins[other["method"]] for other in rows if other is not row)
    rows.sort(key=lambda r: (r["rank"], key(r)))  # a method significantly better only on perplexity moves up
    counts: dict[int, int] = {}
    for row in rows:
        counts[row["rank"]] = counts.get(row["rank"], 0) + 1
    for i, row in enumerate(rows):
        row["tied"] = counts[row["rank"]] > 1
        row["beats"] = [r["method"] for r in rows if r["method"] in wins[row["method"]]]  # in rank order
        row["tied_with_next"] = i + 1 < len(rows) and rows[i + 1]["method"] not in wins[row["method"]]
    ppl_name = "perplexity" if ppl in (None, "ppl") else f"{ppl} perplexity"
    parts = []
    if task:
        where = (f"over the lengths beyond the pretrained window of {window} tokens ({', '.join(map(str, lengths))})"
                 if window is not None and all(L > window for L in lengths) else f"over all its lengths ({', '.join(map(str, lengths))})")
        key_text = f"mean {task} accuracy {where}, higher first" + (f", then {ppl_name} at {ppl_at} tokens, lower first" if ppl_at is not None else "")
    else:
        key_text = f"{ppl_name} at {ppl_at} tokens, lower first"
    if analysis is not None:
        parts.append(f"Rank = 1 + the number of methods significantly better: higher {task} accuracy with the paired 95 % bootstrap "
                     f"interval of the difference (over the shared prompts) excluding 0"
                     + (f", or, where the accuracy difference is inside the noise, lower {ppl_name} at {ppl_at} tokens with the "
                        "paired interval of the ratio excluding 1" if ppl_at is not None else "") if task else
                     f"Rank = 1 + the number of methods with a significantly lower {ppl_name} at {ppl_at} tokens (paired 95 % "
                     "bootstrap interval of the ratio, over the shared documents, excluding 1)")
        parts.append("methods sharing a rank (“2=”) are tied on that count: as many methods are significantly better than "
                     "each. Significance is not transitive, so a rank is a summary, not a pairwise verdict: a method ranked "
                     "above another is not by itself significantly better than it (each may be beaten by different "
                     "methods), and two sharing a rank may differ significantly; only their paired comparison says so")
        parts.append(f"rows in rank order, within a rank by {key_text}; methods missing a value come last")
    else:
        parts.append(f"Methods are ranked by {key_text}; methods missing a value rank last; equal keys share a rank")
    return {"rule": "; ".join(parts) + ".", "task": task, "lengths": lengths, "ppl_task": ppl if ppl_at is not None else None,
            "ppl_length": ppl_at, "rows": rows}
