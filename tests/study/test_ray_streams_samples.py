"""On the Ray backend an evaluation streams its samples to the driver, which commits them while the piece runs:
a driver killed with SIGKILL mid-piece keeps the samples already scored, and the run started again skips them
(the local backend's guarantee), ending with the local backend's database."""

from __future__ import annotations

import json
import sqlite3
import subprocess

import pytest
from ray_driver import kill_driver_when, study_command
from test_runner import SMALL, _assert_same, _dump

from ropekit.study.config import parse_study
from ropekit.study.runner import run_study

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'ropekit[ray]')")

#: One evaluation piece of 10 documents at three lengths up to 4096 tokens (30 samples, about 0.2 s each on a CPU):
#: it runs for several seconds, several of the driver's drains of the inbox even on a loaded machine.
SLOW = {
    **{k: v for k, v in SMALL.items() if k != "recipe"},
    "variants": [{"label": "pi", "method": "pi", "params": {"factor": 4}}],
    "evals": {"ppl": {"lengths": [2048, 3072, 4096], "samples": 10, "score_mode": "truncate"}},
}
#: Samples a running piece must have in the store before the driver is killed.
K = 3


def _running_samples(db_path) -> int | None:
    """Samples stored for pieces still running (read-only; None while the store is not readable yet)."""
    try:
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1)
        try:
            return db.execute("SELECT COUNT(*) FROM samples s JOIN pieces p ON p.id = s.piece "
                              "WHERE p.status = 'running'").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return None


def test_driver_killed_mid_evaluation_keeps_the_streamed_samples_and_the_rerun_skips_them(tmp_path):
    reference = tmp_path / "local"
    assert run_study(parse_study(SLOW), reference, progress=False)["by_status"]["done"] == 1

    out = tmp_path / "ray"
    cmd = study_command(SLOW, tmp_path, out)

    def scoring():
        n = _running_samples(out / "study.sqlite")
        return n is not None and n >= K

    assert kill_driver_when(cmd, scoring, timeout=300), \
        "no running evaluation piece had samples in the store before the study ended"

    db = sqlite3.connect(out / "study.sqlite")  # writable: recovers the killed writer's WAL
    kept = {(piece, key): (row_id, record) for row_id, piece, key, record in db.execute(
        "SELECT s.id, s.piece, s.sample_key, s.record FROM samples s JOIN pieces p ON p.id = s.piece "
        "WHERE p.status = 'running'")}
    db.close()
    assert len(kept) >= K  # scored before the kill, committed while the piece ran

    again = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    _assert_same(_dump(reference / "study.sqlite"), _dump(out / "study.sqlite"))  # no sample missing or twice
    db = sqlite3.connect(out / "study.sqlite")
    after = {(piece, key): (row_id, record) for row_id, piece, key, record in
             db.execute("SELECT id, piece, sample_key, record FROM samples")}
    db.close()
    for where, (row_id, record) in kept.items():
        # the same row, and the same record to its timing: the rerun skipped the sample instead of scoring it again
        assert after[where][0] == row_id, where
        assert json.loads(after[where][1]) == json.loads(record), where
