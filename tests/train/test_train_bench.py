"""`ropekit train bench`: the activation counter on a hand-computed case, and PoSE's flat cost vs full length."""

from __future__ import annotations

import json
import sys

import torch

from ropekit import cli
from ropekit.train.bench import _activation_bytes, pose_vs_full


def test_activation_bytes_counts_saved_tensors_once_without_parameters():
    layer = torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    # y = x Wᵀ saves x (for ∂/∂W) and W (a parameter: not counted); (y²).sum() saves y once
    out, saved = _activation_bytes(layer, lambda: (layer(x) ** 2).sum())
    assert saved == x.numel() * 4 + 3 * 4 * 4
    out.backward()
    assert layer.weight.grad is not None


def test_pose_steps_cost_the_window_not_the_target(monkeypatch, capsys):
    rows = pose_vs_full("tiny", [2, 4], steps=1, threads=1)
    assert [(r["multiple"], r["mode"], r["seq_len"]) for r in rows] == [
        (2, "pose", 64), (2, "full", 128), (4, "pose", 64), (4, "full", 256)]
    pose = [r["activation_mib"] for r in rows if r["mode"] == "pose"]
    assert pose[0] == pose[1]  # PoSE keeps the same activations whatever the target
    for r in rows:
        if r["mode"] == "full":  # full-length activations grow with the length (linearly for this tiny model)
            assert 0.9 * r["multiple"] <= r["ratio_activation"] <= 1.2 * r["multiple"]
    monkeypatch.setattr(sys, "argv", ["ropekit", "train", "bench", "--multiples", "2", "--max-steps", "1", "--json"])
    capsys.readouterr()
    cli.main()
    data = json.loads(capsys.readouterr().out)
    assert [r["mode"] for r in data] == ["pose", "full"]
