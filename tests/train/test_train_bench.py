"""`ropekit train bench`: the activation counter on a hand-computed case, and PoSE's flat cost vs full length."""

from __future__ import annotations

import json

import pytest
import torch

from ropekit.errors import RopekitError
from ropekit.train.bench import _activation_bytes, pose_vs_full


def test_activation_bytes_counts_saved_tensors_once_without_parameters():
    layer = torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    # y = x Wᵀ saves x (for ∂/∂W) and W (a parameter: not counted); (y²).sum() saves y once
    out, saved = _activation_bytes(layer, lambda: (layer(x) ** 2).sum())
    assert saved == x.numel() * 4 + 3 * 4 * 4
    out.backward()
    assert layer.weight.grad is not None


def test_pose_steps_cost_the_window_not_the_target(run_cli):
    rows = pose_vs_full("tiny", [2, 4], steps=2, threads=1)
    assert [(r["multiple"], r["mode"], r["seq_len"], r["tokens_per_step"]) for r in rows] == [
        (1, "window", 64, 64), (2, "pose", 64, 64), (2, "full", 128, 128), (4, "pose", 64, 64), (4, "full", 256, 256)]
    window = rows[0]
    assert window["ratio_step"] == 1.0 and window["ratio_activation"] == 1.0
    for r in rows:
        assert r["rounds"] == 2 and r["step_s"] > 0
        assert r["ratio_step"] == pytest.approx(r["step_s"] / window["step_s"])
        if r["mode"] == "pose":  # PoSE keeps exactly the activations of training at the window
            assert r["activation_mib"] == window["activation_mib"]
        if r["mode"] == "full":  # full-length activations grow with the length (linearly for this tiny model)
            assert 0.9 * r["multiple"] <= r["ratio_activation"] <= 1.2 * r["multiple"]
    code, out, err = run_cli("train", "bench", "--multiples", "2", "--max-steps", "1", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert [r["mode"] for r in data] == ["window", "pose", "full"]


@pytest.mark.parametrize("kwargs, needle", [
    ({"multiples": [1, 2]}, "multiples"), ({"multiples": [2, 2]}, "multiples"), ({"multiples": []}, "multiples"),
    ({"steps": 0}, "steps"), ({"batch_size": 0}, "batch size"),
])
def test_bad_bench_arguments_are_refused_before_loading(kwargs, needle):
    with pytest.raises(RopekitError, match=needle):
        pose_vs_full("no-such-model", **kwargs)
