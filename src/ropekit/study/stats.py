"""Statistics of a study: per method × task × length aggregates, Kendall τ, the method ranking.

Aggregates (:func:`aggregate`), one row ``{"method", "task", "length", "metric", "value", "n", …}`` per
method, task, length and metric:

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

Kendall τ (:func:`kendall_tau`) is τ-b (ties in either list corrected for) with its two-sided p-value, from
:func:`scipy.stats.kendalltau` (exact for small samples without ties, the normal approximation with the
tie-corrected variance otherwise). :func:`perplexity_correlations` computes it across methods between
perplexity and each downstream accuracy, as LCEG (paper 002) Table 6 does.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import RopekitError

PLAIN = "plain"
#: Tasks scored per sample in [0, 1], in the order the report shows them.
ACCURACY_TASKS = ("passkey", "niah", "ruler", "longbench", "manyshot", "short")
#: Tasks whose published average is a macro average over this field (RULER's 13 tasks, LongBench's datasets).
MACRO_FIELDS = {"ruler": "subtask", "longbench": "dataset"}
#: Fields that fix a perplexity protocol; records summed into one value must agree on them.
PPL_PROTOCOL = ("corpus", "score_mode", "stride", "weighting", "add_bos")
SPEED_METRICS = ("prefill_s", "decode_s_per_token", "peak_mem_bytes")
SPEED_RATIOS = {"prefill_s": "prefill_ratio", "decode_s_per_token": "decode_ratio", "peak_mem_bytes": "memory_ratio"}
ENTROPY_METRICS = ("entropy_last", "normalised_last")


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


def ppl_value(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"ppl", "nll", "tokens_scored", "n"}`` of one method's documents at one length (module docstring)."""
    protocols = {json.dumps([r.get(f) for f in PPL_PROTOCOL], sort_keys=True, default=str) for r in records}
    if len(protocols) > 1:
        r0 = records[0]
        raise RopekitError(
            f"perplexity records of {r0.get('method')} at length {r0.get('length')} mix protocols {sorted(protocols)}",
            "evaluate every method of a study with one perplexity protocol",
        )
    tokens = sum(int(r.get("tokens_scored") or 0) for r in records)
    if records[0].get("weighting") == "window":
        windows = sum(int(r.get("windows") or 0) for r in records)
        nll = sum(float(r["window_mean_nll_sum"]) for r in records) / windows if windows else None
    else:
        nll = sum(float(r["nll_sum"]) for r in records) / tokens if tokens else None
    ppl = None
    if nll is not None:
        ppl = math.exp(nll) if nll < 709.0 else math.inf  # exp overflows a float past ~709 nats
    return {"ppl": ppl, "nll": nll, "tokens_scored": tokens, "n": len(records)}


def accuracy_value(task: str, records: Sequence[Mapping[str, Any]]) -> tuple[float | None, int]:
    """Mean score (macro over :data:`MACRO_FIELDS` subgroups for RULER and LongBench) and the sample count."""
    scored = [r for r in records if _finite(r.get("score"))]
    if not scored:
        return None, 0
    field = MACRO_FIELDS.get(task)
    if field and any(r.get(field) is not None for r in scored):
        parts = _groups(scored, field)
        means = [statistics.fmean(float(r["score"]) for r in rs) for rs in parts.values()]
        return statistics.fmean(means), len(scored)
    return statistics.fmean(float(r["score"]) for r in scored), len(scored)


def aggregate(records: Iterable[Mapping[str, Any]], preferred: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Aggregate rows per method × task × length × metric (module docstring), ordered by task, method
    (:func:`method_order`), length and metric."""
    records = list(records)
    order = {m: i for i, m in enumerate(method_order((r.get("method") for r in records), preferred))}
    rows: list[dict[str, Any]] = []
    by_task = _groups(records, "task")
    for (task,), task_records in by_task.items():
        if task == "speed":
            rows += _speed_rows(task_records)
            continue
        for (method, length), recs in _groups(task_records, "method", "length").items():
            base = {"method": method, "task": task, "length": length}
            if task == "ppl":
                v = ppl_value(recs)
                rows.append({**base, "metric": "ppl", "value": v["ppl"], "n": v["n"], "nll": v["nll"], "tokens_scored": v["tokens_scored"]})
            elif task == "entropy":
                for metric in ENTROPY_METRICS:
                    values = [float(r[metric]) for r in recs if _finite(r.get(metric))]
                    if values:
                        rows.append({**base, "metric": metric, "value": statistics.fmean(values), "n": len(values)})
            else:
                value, n = accuracy_value(task, recs)
                if n:
                    rows.append({**base, "metric": "accuracy", "value": value, "n": n})
    task_rank = {t: i for i, t in enumerate(("ppl",) + ACCURACY_TASKS + ("entropy", "speed"))}
    metric_rank = {m: i for i, m in enumerate(("ppl", "accuracy") + ENTROPY_METRICS + SPEED_METRICS + tuple(SPEED_RATIOS.values()))}
    rows.sort(key=lambda r: (task_rank.get(r["task"], len(task_rank)), str(r["task"]), order.get(r["method"], len(order)),
                             r["length"] if r["length"] is not None else -1, metric_rank.get(r["metric"], 99)))
    return rows


def _speed_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    medians: dict[tuple, dict[str, tuple[float, int]]] = {}
    for (method, length), recs in _groups(records, "method", "length").items():
        for metric in SPEED_METRICS:
            values = [float(r[metric]) for r in recs if _finite(r.get(metric))]
            if values:
                medians.setdefault((method, length), {})[metric] = (statistics.median(values), len(values))
    rows = []
    for (method, length), metrics in medians.items():
        plain = medians.get((PLAIN, length), {})
        for metric, (value, n) in metrics.items():
            rows.append({"method": method, "task": "speed", "length": length, "metric": metric, "value": value, "n": n})
            base = plain.get(metric)
            if base is not None and base[0] > 0:
                rows.append({"method": method, "task": "speed", "length": length, "metric": SPEED_RATIOS[metric],
                             "value": value / base[0], "n": n})
    return rows


class Table:
    """Lookup of aggregate rows by (method, task, length, metric)."""

    def __init__(self, rows: Iterable[Mapping[str, Any]]):
        self.rows = list(rows)
        self._index = {(r["method"], r["task"], r["length"], r["metric"]): r for r in self.rows}

    def get(self, method: str, task: str, length: int, metric: str) -> float | None:
        row = self._index.get((method, task, length, metric))
        return None if row is None else row["value"]

    def methods(self, task: str | None = None) -> list[str]:
        return list(dict.fromkeys(r["method"] for r in self.rows if task is None or r["task"] == task))

    def lengths(self, task: str) -> list[int]:
        return sorted({r["length"] for r in self.rows if r["task"] == task and r["length"] is not None})

    def tasks(self) -> list[str]:
        return list(dict.fromkeys(r["task"] for r in self.rows))


# ---- per-position NLL curves ------------------------------------------------------------------------------
def nll_curves(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Mean NLL by position in the window per (method, length): ``{"method", "length", "positions", "mean_nll"}``.

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
        curves.append({"method": method, "length": length, "positions": positions, "mean_nll": mean})
    return curves


# ---- perplexity vs downstream ---------------------------------------------------------------------------
def perplexity_correlations(table: Table, target_length: int | None) -> list[dict[str, Any]]:
    """Kendall τ across methods between perplexity and each accuracy task (LCEG Table 6), two ways:

    * ``"target"`` — perplexity and accuracy at one length: the target length when both tasks were
      evaluated there, else the longest length they share;
    * ``"mean"`` — per method, the mean log-perplexity (log of the geometric mean) and the mean accuracy
      over every length both tasks share; methods lacking any of those lengths are left out.

    Negative τ means lower perplexity goes with higher accuracy.
    """
    ppl_lengths = set(table.lengths("ppl"))
    out = []
    for task in [t for t in table.tasks() if any(r["task"] == t and r["metric"] == "accuracy" for r in table.rows)]:
        shared = sorted(ppl_lengths & set(table.lengths(task)))
        if not shared:
            continue
        methods = [m for m in table.methods("ppl") if m in table.methods(task)]
        at = target_length if target_length in shared else shared[-1]
        pairs = [(m, table.get(m, "ppl", at, "ppl"), table.get(m, task, at, "accuracy")) for m in methods]
        pairs = [(m, p, a) for m, p, a in pairs if p is not None and a is not None and _finite(p)]
        result = kendall_tau([p for _, p, _ in pairs], [a for _, _, a in pairs])
        out.append({"task": task, "mode": "target", "lengths": [at], "tau": result.tau, "p_value": result.p_value,
                    "n": result.n, "methods": [m for m, _, _ in pairs], "interpretation": interpret(result)})
        means = []
        for m in methods:
            p = [table.get(m, "ppl", L, "ppl") for L in shared]
            a = [table.get(m, task, L, "accuracy") for L in shared]
            if all(v is not None and _finite(v) and v > 0 for v in p) and all(v is not None for v in a):
                means.append((m, statistics.fmean(math.log(v) for v in p), statistics.fmean(a)))
        result = kendall_tau([p for _, p, _ in means], [a for _, _, a in means])
        out.append({"task": task, "mode": "mean", "lengths": shared, "tau": result.tau, "p_value": result.p_value,
                    "n": result.n, "methods": [m for m, _, _ in means], "interpretation": interpret(result)})
    return out


# ---- ranking ----------------------------------------------------------------------------------------------
#: The accuracy task that ranks methods, first one present wins.
RANK_TASKS = ("passkey", "niah", "ruler", "longbench", "manyshot")


def rank_methods(table: Table, window: int | None, target_length: int | None,
                 preferred: Sequence[str] | None = None) -> dict[str, Any]:
    """Rank the methods: ``{"rule": text, "task", "lengths", "ppl_length", "rows": [{"rank", "method",
    "primary", "ppl"}]}``.

    Primary key: the mean accuracy of the first task of :data:`RANK_TASKS` present, over its lengths
    beyond the pretrained ``window`` (all its lengths when no window is known or none lies beyond),
    higher first; a method must have every one of those lengths to get a value. Tie-break: perplexity
    at the target length (the longest perplexity length when the target was not evaluated), lower first.
    Methods without a primary value come after those with one; equal keys share a rank (1, 2, 2, 4).
    """
    methods = method_order(table.methods(), preferred)
    task = next((t for t in RANK_TASKS if t in table.tasks()), None)
    lengths: list[int] = []
    if task:
        all_lengths = table.lengths(task)
        lengths = [L for L in all_lengths if window is not None and L > window] or all_lengths
    ppl_lengths = table.lengths("ppl")
    ppl_at = (target_length if target_length in ppl_lengths else ppl_lengths[-1]) if ppl_lengths else None
    rows = []
    for m in methods:
        primary = None
        if task:
            values = [table.get(m, task, L, "accuracy") for L in lengths]
            if values and all(v is not None for v in values):
                primary = statistics.fmean(values)
        ppl = table.get(m, "ppl", ppl_at, "ppl") if ppl_at is not None else None
        rows.append({"method": m, "primary": primary, "ppl": ppl})
    if not task and ppl_at is None:
        return {"rule": "", "task": None, "lengths": [], "ppl_length": None, "rows": []}

    def key(row):
        p = row["primary"]
        q = row["ppl"] if row["ppl"] is not None and not math.isnan(row["ppl"]) else math.inf
        return (p is None, -(p or 0.0), q)

    rows.sort(key=key)
    previous, rank = None, 0
    for i, row in enumerate(rows, 1):
        k = key(row)
        if k != previous:
            rank, previous = i, k
        row["rank"] = rank
    parts = []
    if task:
        where = (f"over the lengths beyond the pretrained window of {window} tokens ({', '.join(map(str, lengths))})"
                 if window is not None and all(L > window for L in lengths) else f"over all its lengths ({', '.join(map(str, lengths))})")
        parts.append(f"Methods are ranked by mean {task} accuracy {where}, higher first")
        if ppl_at is not None:
            parts.append(f"ties are broken by perplexity at {ppl_at} tokens, lower first")
        parts.append("methods missing a value rank last; equal keys share a rank")
    else:
        parts.append(f"Methods are ranked by perplexity at {ppl_at} tokens, lower first; methods without it rank last")
    return {"rule": "; ".join(parts) + ".", "task": task, "lengths": lengths, "ppl_length": ppl_at, "rows": rows}
