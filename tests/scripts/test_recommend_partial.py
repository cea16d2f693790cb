"""scripts/recommend_partial.py against the command itself: on a finished recommendation it picks what
`ropekit recommend` picked, with the same runner-up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "recommend_partial.py"


def test_on_a_finished_run_it_agrees_with_the_command(run_cli, tmp_path):
    out = tmp_path / "rec"
    code, _, stderr = run_cli("recommend", "tiny", "-t", "128", "-o", str(out), "--budget", "1s",
                              "--methods", "yarn,ntk,pi")
    assert code == 0, stderr
    result = json.loads((out / "recommendation.json").read_text())
    (work,) = [p for p in (tmp_path / ".rec.recommend").iterdir() if p.is_dir()]
    done = subprocess.run([sys.executable, str(SCRIPT), str(work)], capture_output=True, text=True, check=True)
    assert "3 of 3 candidates finished" in done.stdout
    assert f"chosen among them: {result['chosen']}; runner-up: {result['runner_up']}" in done.stdout


def test_without_a_study_it_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "usage" in done.stderr
