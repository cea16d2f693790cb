"""Resonance RoPE, added as one unit and one registry line: its frequencies against the paper's Algorithm 1
computed by hand, the resonance property itself, and every export format reached through the generic hooks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import ropekit
from ropekit.install import rotary_modules
from ropekit.install.gguf_export import gguf_rope
from ropekit.install.vllm import vllm_serving
from ropekit.models.tiny import build_tiny_model


def _by_hand(thetas: list[float]) -> list[float]:
    """Wang et al. 2024, Algorithm 1: λ_i = 2π/θ_i, λ̃_i = round(λ_i), θ̃_i = 2π/λ̃_i (plain Python floats)."""
    return [2 * math.pi / round(2 * math.pi / t) for t in thetas]


def _installed(model) -> torch.Tensor:
    return rotary_modules(model)[0][2].inv_freq.double()


def test_frequencies_are_the_papers_rounded_wavelengths():
    model = ropekit.extend(build_tiny_model("llama", rope_theta=10000.0), "resonance", factor=2.0)
    d = 16  # the tiny Llama's head dimension
    plain = [10000.0 ** (-2 * i / d) for i in range(d // 2)]
    expected = _by_hand(plain)
    assert _installed(model).tolist() == pytest.approx(expected, rel=1e-6)
    # whole-token wavelengths, and not the plain ones (2π is not an integer)
    wavelengths = (2 * math.pi / _installed(model)).tolist()
    assert wavelengths == pytest.approx([round(w) for w in wavelengths], rel=1e-6)
    assert expected[0] != pytest.approx(plain[0], rel=1e-3)
    assert model.config.max_position_embeddings == 2 * 64


def test_each_pair_repeats_exactly_every_rounded_wavelength():
    # the property the method exists for: pair i's rotation at position m + λ̃_i equals the one at m
    model = ropekit.extend(build_tiny_model("llama"), "resonance")
    rotary = rotary_modules(model)[0][2]
    wavelengths = [round(w) for w in (2 * math.pi / _installed(model)).tolist()]
    for i, period in enumerate(wavelengths[:5]):  # periods up to ~630 tokens: float32 angles stay exact enough
        positions = torch.tensor([[0, 1, 7, period, period + 1, period + 7]])
        cos, sin = rotary(torch.zeros(1, 6, 64), positions)
        for column in (cos, sin):
            assert torch.allclose(column[0, :3, i], column[0, 3:, i], atol=2e-4)


def test_on_a_scaled_model_the_effective_wavelengths_are_rounded():
    model = build_tiny_model("llama3")
    config = model.config
    effective, factor = ROPE_INIT_FUNCTIONS["llama3"](config, None)  # transformers' own llama3 frequencies
    ropekit.extend(model, "resonance")
    assert _installed(model).tolist() == pytest.approx(_by_hand(effective.double().tolist()), rel=1e-6)
    assert rotary_modules(model)[0][2].attention_scaling == pytest.approx(factor)


def test_exports_hold_it_through_the_generic_formats(tmp_path):
    model = ropekit.extend(build_tiny_model("llama"), "resonance", factor=2.0)
    report = ropekit.save_pretrained(model, tmp_path / "out")
    assert report["format"] == "longrope" and report["transformers"] and report["vllm"]
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "out")  # no ropekit involved
    ids = torch.randint(3, 256, (1, 120))  # past the 64-token window
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, model(ids).logits, atol=1e-5)
    assert vllm_serving(tmp_path / "out").exact
    rope = gguf_rope(model)  # llama.cpp: the exact per-pair form, since no named key rounds wavelengths
    assert rope.form == "rope_freqs"
    assert np.allclose(rope.inv_freq, _installed(model).numpy(), rtol=1e-7)
