"""Metrics to TensorBoard: every step's loss, learning rate and gradient norm equal metrics.jsonl's, and a run
killed and resumed logs each step once (the resumed writer purges the steps after the checkpoint).

tensorboard is part of the ``test`` extra, so this runs wherever the suite does; it is not skipped when missing.
"""

from __future__ import annotations

import json

import pytest

from ropekit.train import train
from step_kill import Killed, kill_at


def scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in the run's event files, as TensorBoard itself reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_killed_and_resumed_run_logs_each_step_once_with_the_jsonl_values(make_config):
    cfg = make_config("tb", steps=6, train={"max_grad_norm": 1.0},
                      output={"tensorboard": True, "save_every": 3, "keep_last": None})
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(5)], progress=False)
    out = cfg.require_output()
    assert [s for s, _ in scalars(out / "tensorboard")["train/loss"]] == [1, 2, 3, 4, 5]
    train(cfg, resume=True, progress=False)  # continues from step 3: steps 4 and 5 are trained again
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    series = scalars(out / "tensorboard")
    assert set(series) == {"train/loss", "train/lr", "train/grad_norm"}
    for key in ("loss", "lr", "grad_norm"):
        logged = series[f"train/{key}"]
        assert [s for s, _ in logged] == [1, 2, 3, 4, 5, 6]  # as TensorBoard shows it: each step once
        # event files store float32
        assert [v for _, v in logged] == pytest.approx([r[key] for r in rows], rel=1e-6)
