"""In-window retention: a fine-tuned variant that retrieves far less than the control inside the window is marked
as not converged under the study's budget; one within 10 points is not."""

from __future__ import annotations

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
