"""Did a fine-tuned variant converge under the study's training budget? Its in-window retrieval against the control.

A fine-tuned variant that retrieves clearly less *inside* the pretrained window than the control (plain RoPE,
the same recipe, data and steps) has not re-learned its own positions within the budget — its failures beyond
the window then measure the recipe, not the method. LCEG fine-tunes PI for 1,000 steps at lr 2e-5 (Lu et al.
2024, §3); a toy recipe of 40 steps may not get there. Rule: a fine-tuned variant *converged* when its in-window
passkey accuracy (mean over the evaluated lengths ≤ the window, paired over the prompts it shares with the
control) is within :data:`RETENTION_POINTS` points of the control's; otherwise it "did not converge under this
budget", and the report keeps it out of the claims and the ranking's verdicts. RULER's in-window retention is
reported beside it, not judged.

A study still running (or one with a failed piece) may lack a variant's cell at some in-window length: the variant
is then judged over the in-window lengths both it and the control have, paired over the prompts they share there —
as every paired comparison of a running study is (docs/study.md) — and the row names the lengths it used
(``lengths``) and those it lacked (``missing_lengths``). Only a variant that shares no in-window length with the
control is left without a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: How far below the control's in-window passkey accuracy a converged variant may be (percentage points).
RETENTION_POINTS = 10.0
JUDGED_TASK = "passkey"


def in_window_retention(analysis, control: str, finetuned: Sequence[str], window: int) -> list[dict[str, Any]]:
    """One row per (fine-tuned variant, retrieval task): the variant's and the control's in-window accuracy (%),
    their paired difference in points with its 95 % interval and n, and — on :data:`JUDGED_TASK` —
    ``converged`` (True/False). ``analysis`` is a :class:`ropekit.study.stats.Analysis` of the study's records.
    ``lengths``: the in-window lengths judged, those where both the variant and the control have prompts in
    common; ``missing_lengths``: the task's other in-window lengths (module docstring)."""
    table = analysis.table
    rows: list[dict[str, Any]] = []
    for task in table.accuracy_tasks():
        lengths = [length for length in table.lengths(task) if length is not None and length <= window]
        if not lengths or control not in table.methods(task):
            continue
        for variant in finetuned:
            if variant == control or variant not in table.methods(task):
                continue
            # the in-window lengths both sides have, each paired over the prompts they share there
            shared = [length for length in lengths
                      if analysis.compare(variant, control, task, length, "accuracy") is not None]
            if not shared:
                continue
            compared = analysis.compare(variant, control, task, shared, "accuracy")
            mine = [table.get(variant, task, length, "accuracy") for length in shared]
            theirs = [table.get(control, task, length, "accuracy") for length in shared]
            row = {
                "method": variant, "task": task, "lengths": shared,
                "missing_lengths": [length for length in lengths if length not in shared],
                "accuracy": 100 * sum(mine) / len(mine) if None not in mine else None,
                "control_accuracy": 100 * sum(theirs) / len(theirs) if None not in theirs else None,
                "difference": 100 * compared["estimate"],
                "ci95": [100 * x for x in compared["ci95"]] if compared["ci95"] else None,
                "n": compared["n"],
            }
            if task == JUDGED_TASK:
                row["converged"] = row["difference"] >= -RETENTION_POINTS
            rows.append(row)
    return rows


def unconverged(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The variants :func:`in_window_retention` judged as not converged, in row order."""
    return list(dict.fromkeys(r["method"] for r in rows if r.get("converged") is False))
