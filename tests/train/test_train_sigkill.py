"""A real kill: `ropekit train` in its own process is SIGKILLed between two checkpoints (steps after the
last checkpoint already logged, one perhaps half-written), then `--resume` finishes the run; losses, metrics.jsonl and the final weights equal an
uninterrupted run's (tests/train/test_train_resume.py does the same in-process, stopping after a step).

Marked ``slow`` (a second interpreter loads torch + transformers: about 10 s on a 2-core machine):
``python -m pytest -m slow tests/train/test_train_sigkill.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from ropekit.train import load_config, train
from ropekit.train.checkpoint import list_checkpoints

STEPS, SAVE_EVERY = 60, 10


def write_config(path: Path, out_dir: Path, cache: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "model": "tiny",
        "method": {"name": "yarn", "params": {"factor": 4, "beta_fast": 4}},
        "data": {"seq_len": 64, "cache_dir": str(cache), "sources": [{"path": "builtin", "max_documents": 8}],
                 "pose": {"target_length": 256}},
        "train": {"max_steps": STEPS, "lr": 3e-3, "micro_batch_size": 2, "grad_accum": 1, "threads": 1, "seed": 0,
                  "warmup_steps": 5, "schedule": "cosine", "ema": {"decay": 0.9}},
        "output": {"dir": str(out_dir), "save_every": SAVE_EVERY, "keep_last": None, "log_every": 1000},
    }))
    return path


def rows(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def _between_checkpoints(out_dir: Path) -> bool:
    """A checkpoint exists and at least 5 steps after it were logged."""
    found = list_checkpoints(out_dir)
    metrics = out_dir / "metrics.jsonl"
    return bool(found) and metrics.is_file() and metrics.read_text().count("\n") >= found[-1][0] + 5


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkilled_run_resumes_to_the_uninterrupted_result(tmp_path):
    cache = tmp_path / "cache"
    killed_dir = tmp_path / "killed"
    cfg_path = write_config(tmp_path / "killed.yaml", killed_dir, cache)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "ropekit.cli", "train", str(cfg_path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline and not _between_checkpoints(killed_dir):
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, f"the run ended on its own before the kill: {stderr.decode()[-500:]}"
    done = [s for s, _ in list_checkpoints(killed_dir)]
    assert done and done[-1] < STEPS and not (killed_dir / "final").exists()
    logged = (killed_dir / "metrics.jsonl").read_text().count("\n")
    assert logged > done[-1]  # steps past the checkpoint were logged: the resume must drop and redo them

    resumed = train(load_config(cfg_path), resume=True, progress=False)
    assert resumed.resumed_from == done[-1] and resumed.step == STEPS

    full_dir = tmp_path / "full"
    full = train(load_config(write_config(tmp_path / "full.yaml", full_dir, cache)), progress=False)
    got, want = rows(killed_dir), rows(full_dir)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))  # every step once, a half-written line dropped
    assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in want], rel=1e-6, abs=1e-7)
    assert [r["loss"] for r in got[done[-1]:]] == pytest.approx([x for _, x in resumed.losses], rel=1e-12)
    assert [x for _, x in full.losses] == pytest.approx([r["loss"] for r in want], rel=1e-12)
    for sub in ("final", "final-ema"):
        a, b = load_file(full_dir / sub / "model.safetensors"), load_file(killed_dir / sub / "model.safetensors")
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-6, atol=1e-7)
