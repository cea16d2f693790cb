"""Two CPU processes under `accelerate launch` (DDP over gloo) train exactly like one process with the same global batch.

About 40 s on a 2-core machine (two interpreters start and load torch + transformers), so it is marked ``slow``:
``python -m pytest tests/train/test_train_ddp.py -m slow``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from ropekit.train import load_config, train


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, cache: Path, micro: int, accum: int) -> Path:
    path.write_text(yaml.safe_dump({
        "model": "tiny",
        "method": {"name": "pi", "params": {"factor": 2}},
        "data": {"seq_len": 128, "cache_dir": str(cache),
                 "sources": [{"path": "builtin", "max_documents": 6}], "packing": {"reset_positions": True}},
        "train": {"max_steps": 3, "lr": 3e-3, "eps": 1e-5, "micro_batch_size": micro, "grad_accum": accum,
                  "threads": 1, "seed": 0, "ema": {"decay": 0.8}},
        "output": {"save_every": 3, "log_every": 1000},
    }))
    return path


def losses(out_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_processes_equal_one_process_with_the_same_global_batch(tmp_path):
    cache = tmp_path / "cache"
    one_dir, two_dir = tmp_path / "one", tmp_path / "two"
    # one process: 1 sequence per micro-batch, 2 micro-batches per step (also fills the tokenisation cache)
    one = train(load_config(write_config(tmp_path / "one.yaml", cache, micro=1, accum=2)).with_overrides(out_dir=one_dir),
                progress=False)
    # two processes: 1 sequence each, no accumulation — the same 2 sequences per step
    launcher = Path(sys.executable).with_name("accelerate")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ROPEKIT_DEBUG": "1"}
    proc = subprocess.run(
        [str(launcher), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
         "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
         "-m", "ropekit.cli", "train", str(write_config(tmp_path / "two.yaml", cache, micro=1, accum=1)),
         "--out", str(two_dir), "--json"],
        capture_output=True, text=True, env=env, timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])  # rank 0 prints the summary once
    assert summary["step"] == 3
    assert losses(two_dir) == pytest.approx([x for _, x in one.losses], rel=1e-6)
    state = json.loads((two_dir / "checkpoints" / "step-3" / "trainer_state.json").read_text())
    assert state["data"]["processes"] == 2 and state["data"]["samples_consumed"] == 6
    for sub in ("final", "final-ema"):
        a, b = load_file(one_dir / sub / "model.safetensors"), load_file(two_dir / sub / "model.safetensors")
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flag, name", [("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")])
def test_a_sharded_launch_on_the_cpu_is_refused_not_run_as_ddp(monkeypatch, flag, name):
    """accelerate honours FSDP/DeepSpeed only on GPUs; on the CPU (`cpu=True`) it would quietly train plain DDP."""
    from ropekit.errors import RopekitError
    from ropekit.train import trainer

    if trainer._has_accelerator_device():
        pytest.skip("this machine has an accelerator: the launch is not refused there")
    monkeypatch.setenv(flag, "true")
    with pytest.raises(RopekitError) as err:
        trainer._accelerator(None)
    assert name in str(err.value) and "DDP" in str(err.value) and "\n" not in str(err.value)
