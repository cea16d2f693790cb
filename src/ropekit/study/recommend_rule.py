"""The rule ``ropekit recommend`` picks its winner by, on paired intervals (:meth:`ropekit.study.stats.Analysis.
compare`: the same documents and prompts for every candidate, 95 % percentile bootstrap, a difference called only
with at least :data:`~ropekit.study.stats.MIN_PAIRED` shared samples).

1. **In-window guard** (non-inferiority to the unmodified model at its own window ``W``): perplexity ratio
   candidate/base at ``W`` at most :data:`PPL_MARGIN`, and passkey and RULER accuracy at ``W`` at most
   :data:`ACCURACY_MARGIN` below the base model's. A candidate is *shown non-inferior* when every interval lies
   inside its margin, *shown inferior* when one lies wholly beyond it, else *undecided*. Only the best non-empty
   group of (non-inferior, undecided, inferior) competes; a static scaling such as YaRN's attention factor changes
   in-window outputs, and this is where that counts.
2. **Primary metric**: same-token perplexity at the target ``N`` (:mod:`ropekit.eval.perplexity`, ``same_targets``).
   The candidate with the lowest value leads; every candidate whose paired ratio to the leader is not significant
   is tied with it, the others lose.
3. **Retrieval at N**: within the tie, a candidate significantly below another tied one on passkey or RULER
   single-needle accuracy at ``N`` loses — compared with every other candidate left, not only the one of highest
   point accuracy (paired significance is not transitive); passkey first, then RULER among those left.
4. **Tie-break**: the simplest of those left (:func:`ropekit.study.recommend.simplicity`: no searched factors or
   fine-tuned weights, frequencies only, static, served natively by the engine, fewer parameters), then the lower
   perplexity at ``N``.

The runner-up is the winner of the same rule without the winner; every candidate gets the step it lost at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .recommend import BASE_LABEL, Candidate
from .stats import MIN_PAIRED, Analysis

#: In-window perplexity may be at most this ratio of the unmodified model's (5 % worse).
PPL_MARGIN = 1.05
#: In-window retrieval accuracy may be at most this much below the unmodified model's (10 points).
ACCURACY_MARGIN = 0.10
#: The retrieval tasks, as the study names them.
RETRIEVAL = ("passkey", "ruler")
TIERS = ("non-inferior in window", "in-window regression undecided", "in-window regression shown")

RULE = (f"1. in-window guard: perplexity at the original window at most {PPL_MARGIN:g}x the unmodified model's and "
        f"passkey/RULER accuracy there at most {ACCURACY_MARGIN:g} below it (95% paired intervals); only the best "
        "group (shown non-inferior, undecided, shown inferior) competes. 2. lowest same-token perplexity at the "
        "target; candidates not significantly different from the lowest are tied. 3. within the tie, a candidate "
        "significantly below another on passkey or RULER accuracy at the target loses. 4. the simplest left "
        "(no searched factors or fine-tuned weights, frequencies only, static, served natively, fewer parameters), "
        "then the lower perplexity.")


@dataclass
class Verdict:
    """The outcome of the rule."""

    winner: str
    runner_up: str | None
    order: list[str]
    why: dict[str, str]
    tiers: dict[str, int]
    evidence: dict[str, dict[str, Any]] = field(default_factory=dict)


def _fmt(cmp: dict[str, Any] | None) -> str:
    if not cmp:
        return "not measured"
    ci = cmp.get("ci95")
    values = [cmp["estimate"], *(ci or [])]
    # enough digits that the estimate and its interval read apart (a ratio of 1.0004 [1.0001, 1.0007] is not "1 [1, 1]")
    digits = next((d for d in range(3, 8) if len({f"{v:.{d}g}" for v in values}) == len(set(values))), 8)
    band = f" [{ci[0]:.{digits}g}, {ci[1]:.{digits}g}]" if ci else ""
    return f"{cmp['estimate']:.{digits}g}{band} (n={cmp['n']})"


def _cell(analysis: Analysis, label: str, task: str, length: int, metric: str) -> dict[str, Any] | None:
    row = analysis.table.row(label, task, length, metric)
    if row is None:
        return None
    return {"value": row["value"], "ci95": row.get("ci95"), "n": row["n"]}


def evidence(analysis: Analysis, labels: list[str], window: int, target: int) -> dict[str, dict[str, Any]]:
    """Every number of every candidate (and the base model): value, interval, n; and the in-window comparisons."""
    out: dict[str, dict[str, Any]] = {}
    for label in [BASE_LABEL, *labels]:
        cells = {}
        for length in (target, window):
            cells[f"ppl@{length}"] = _cell(analysis, label, "ppl", length, "ppl")
            for task in RETRIEVAL:
                cells[f"{task}@{length}"] = _cell(analysis, label, task, length, "accuracy")
        if label != BASE_LABEL:
            cells["in_window"] = {"ppl_ratio": analysis.compare(label, BASE_LABEL, "ppl", window, "ppl"),
                                  **{f"{task}_difference": analysis.compare(label, BASE_LABEL, task, window, "accuracy")
                                     for task in RETRIEVAL}}
        out[label] = cells
    return out


def _tier(ev: dict[str, Any]) -> tuple[int, str]:
    """``(0 | 1 | 2, words)``: the in-window guard (module doc). A comparison that was not measured (a prompt that
    does not fit in the window) counts for no candidate; with none measured the guard is undecided."""
    checks = [("perplexity ratio", ev["in_window"]["ppl_ratio"], "ratio")]
    checks += [(f"{t} difference", ev["in_window"][f"{t}_difference"], "difference") for t in RETRIEVAL]
    inside, beyond, words = [], [], []
    for name, cmp, kind in checks:
        if not cmp or not cmp.get("ci95"):
            continue
        lo, hi = cmp["ci95"]
        enough = cmp["n"] >= MIN_PAIRED
        if kind == "ratio":
            inside.append(enough and hi <= PPL_MARGIN)
            beyond.append(enough and lo > PPL_MARGIN)
        else:
            inside.append(enough and lo >= -ACCURACY_MARGIN)
            beyond.append(enough and hi < -ACCURACY_MARGIN)
        words.append(f"in-window {name} {_fmt(cmp)}")
    tier = 2 if any(beyond) else 0 if inside and all(inside) else 1
    return tier, "; ".join(words) or "nothing measured in the window"


def _accuracy_at(ev: dict[str, Any], task: str, target: int) -> float:
    cell = ev.get(f"{task}@{target}")
    return cell["value"] if cell and cell["value"] is not None else -1.0


def _ppl_at(ev: dict[str, Any], target: int) -> float:
    cell = ev.get(f"ppl@{target}")
    return cell["value"] if cell and cell["value"] is not None else float("inf")


def _one_round(analysis: Analysis, pool: list[Candidate], ev: dict[str, dict[str, Any]], target: int,
               tiers: dict[str, tuple[int, str]]) -> tuple[Candidate, dict[str, str]]:
    """The rule on ``pool``: the winner and, for every other candidate, the step it lost at."""
    why: dict[str, str] = {}
    best_tier = min(tiers[c.label][0] for c in pool)
    group = [c for c in pool if tiers[c.label][0] == best_tier]
    for c in pool:
        if c not in group:
            why[c.label] = f"step 1: {TIERS[tiers[c.label][0]]} ({tiers[c.label][1]}), others are {TIERS[best_tier]}"
    leader = min(group, key=lambda c: _ppl_at(ev[c.label], target))
    tied = []
    for c in group:
        if c is leader:
            tied.append(c)
            continue
        cmp = analysis.compare(c.label, leader.label, "ppl", target, "ppl")
        if cmp is not None and cmp["direction"] > 0:
            why[c.label] = f"step 2: perplexity at {target} higher than {leader.label}'s, ratio {_fmt(cmp)}"
        else:
            tied.append(c)
    kept = list(tied)
    for task in RETRIEVAL:
        # every remaining candidate against every other one (not only the one of highest point accuracy: paired
        # significance is not transitive, so a candidate may be significantly below one that is itself not the best)
        by_accuracy = sorted(kept, key=lambda c: -_accuracy_at(ev[c.label], task, target))
        losers: dict[str, str] = {}
        for c in kept:
            for other in by_accuracy:
                if other is c:
                    continue
                cmp = analysis.compare(c.label, other.label, task, target, "accuracy")
                if cmp is not None and cmp["direction"] < 0:
                    losers[c.label] = (f"step 3: tied on perplexity, but {task} accuracy at {target} below "
                                       f"{other.label}'s, difference {_fmt(cmp)}")
                    break
        if len(losers) < len(kept):  # with one shared set of prompts the best point accuracy is never below another
            why.update(losers)
            kept = [c for c in kept if c.label not in losers]
    kept.sort(key=lambda c: (c.simplicity, _ppl_at(ev[c.label], target)))
    winner = kept[0]
    for c in kept[1:]:
        if c.simplicity != winner.simplicity:
            why[c.label] = (f"step 4: tied with {winner.label} on perplexity and retrieval; {winner.label} is simpler "
                            f"({winner.simplicity_note} against {c.simplicity_note})")
        else:
            why[c.label] = (f"step 4: tied with {winner.label} and as simple; {winner.label}'s perplexity at {target} "
                            f"is lower ({_ppl_at(ev[winner.label], target):.4g} against {_ppl_at(ev[c.label], target):.4g})")
    return winner, why


def decide(records: list[dict[str, Any]], candidates: list[Candidate], window: int, target: int) -> Verdict:
    """Apply the rule (module doc) to the study's records."""
    analysis = Analysis(records)
    labels = [c.label for c in candidates]
    ev = evidence(analysis, labels, window, target)
    tiers = {c.label: _tier(ev[c.label]) for c in candidates}
    winner, why = _one_round(analysis, candidates, ev, target, tiers)
    order = [winner.label]
    pool = [c for c in candidates if c is not winner]
    while pool:
        nxt, _ = _one_round(analysis, pool, ev, target, tiers)
        order.append(nxt.label)
        pool = [c for c in pool if c is not nxt]
    why[winner.label] = "chosen"
    return Verdict(winner=winner.label, runner_up=order[1] if len(order) > 1 else None, order=order, why=why,
                   tiers={k: v[0] for k, v in tiers.items()}, evidence=ev)
