"""In-window retention: a fine-tuned variant that retrieves far less than the control inside the window is marked
as not converged under the study's budget; one within 10 points is not."""

from __future__ import annotations

import pytest
from synthetic_study import WINDOW, build, variant

from ropekit.study.convergence import RETENTION_POINTS, in_window_retention, unconverged
from ropekit.study.stats import Analysis
from ropekit.study.store import StudyStore

SPEC = [
    variant("base", None, "base", acc=(0.9, 0, 0, 0)),
    variant("base-ft", None, "control", acc=(0.9, 0.1, 0, 0)),
    variant("yarn-ft", "yarn", "ft", acc=(0.85, 0.6, 0.3, 0), params={"factor": 4}),   # 5 points below: converged
    variant("pi-ft", "pi", "ft", acc=(0.2, 0.2, 0.1, 0), params={"factor": 4}),        # 70 points below: not
]


def test_retention_marks_only_the_variant_far_below_the_control(tmp_path):
    build(tmp_path, SPEC, trials=8)
    analysis = Analysis(StudyStore(tmp_path / "study.sqlite").samples())
    rows = in_window_retention(analysis, "base-ft", ["yarn-ft", "pi-ft"], WINDOW)
    by = {(r["method"], r["task"]): r for r in rows}
    assert by[("yarn-ft", "passkey")]["converged"] is True
    assert by[("pi-ft", "passkey")]["converged"] is False
    assert unconverged(rows) == ["pi-ft"]
    # the numbers are the in-window accuracies of the stored prompts, counted here directly
    store = StudyStore(tmp_path / "study.sqlite")

    def accuracy(label):
        scores = [r["score"] for r in store.samples(task="passkey", method=label) if r["length"] <= WINDOW]
        return 100 * sum(scores) / len(scores)

    pi = by[("pi-ft", "passkey")]
    assert pi["accuracy"] == accuracy("pi-ft") and pi["control_accuracy"] == accuracy("base-ft")
    assert pi["difference"] == accuracy("pi-ft") - accuracy("base-ft")
    assert pi["difference"] < -RETENTION_POINTS and pi["ci95"][1] < 0 and pi["n"] == 5 * 8


def _passkey(method, length, found, n=20):
    """n prompts (5 depths × n/5 trials), the first ``found`` of them found."""
    return [{"task": "passkey", "method": method, "params": {}, "length": length, "depth": d / 4, "trial": t,
             "score": float(t * 5 + d < found)} for t in range(n // 5) for d in range(5)]


def test_a_variant_lacking_an_in_window_length_is_judged_on_the_lengths_it_shares():
    """pi-ft's 256-token cell is missing (a failed or unfinished piece): it is judged at 128, the in-window length it
    shares with the control — 2 of 20 found against 18 of 20, −80 points — and marked, not left unjudged; the row
    names the lengths it used and the one it lacked. A variant sharing no in-window length gets no row."""
    window = 256
    records = _passkey("base-ft", 128, 18) + _passkey("base-ft", 256, 18) + _passkey("pi-ft", 128, 2)
    records += _passkey("ntk-ft", 512, 20)  # evaluated only beyond the window: nothing in-window to judge
    rows = in_window_retention(Analysis(records), "base-ft", ["pi-ft", "ntk-ft"], window)
    (row,) = rows
    assert row["method"] == "pi-ft" and row["lengths"] == [128] and row["missing_lengths"] == [256]
    assert row["accuracy"] == 100 * 2 / 20 and row["control_accuracy"] == 100 * 18 / 20
    assert row["difference"] == pytest.approx(100 * (2 / 20 - 18 / 20)) and row["n"] == 20
    assert row["ci95"][1] < -RETENTION_POINTS and row["converged"] is False
    assert unconverged(rows) == ["pi-ft"]
    # with every in-window length the same verdict, over both lengths, and nothing missing
    full = records + _passkey("pi-ft", 256, 2)
    (row,) = in_window_retention(Analysis(full), "base-ft", ["pi-ft", "ntk-ft"], window)
    assert row["lengths"] == [128, 256] and row["missing_lengths"] == [] and row["converged"] is False


def test_the_report_names_the_in_window_lengths_a_variant_lacks():
    from ropekit.study.report import _retention_table

    records = _passkey("base-ft", 128, 18) + _passkey("base-ft", 256, 18) + _passkey("pi-ft", 128, 2)
    rows = in_window_retention(Analysis(records), "base-ft", ["pi-ft"], 256)
    table = _retention_table(rows, "base-ft")
    text = repr(table)
    assert "not at 256" in text and "n = 20" in text
