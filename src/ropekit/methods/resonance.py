"""Resonance RoPE: every rotary wavelength rounded to a whole number of tokens."""

from __future__ import annotations

import math

import torch

from .abf import DECLARED_FACTOR
from .base import Method, register


@register
class Resonance(Method):
    """Resonance RoPE (Wang et al. 2024, arXiv 2403.00071, Findings of ACL 2024, Algorithm 1).

    Pair ``i`` rotates with wavelength ``λ_i = 2π/θ_i`` tokens, which is rarely a whole number, so a pair whose
    wavelength is shorter than the training window meets, beyond the window, phases it never saw in training.
    Resonance RoPE rounds every wavelength to the nearest integer, ``θ̃_i = 2π / round(2π/θ_i)``: pair ``i`` then
    repeats exactly every ``round(λ_i)`` tokens, and each of its phases past the window is one it was trained on.
    No parameters: ``factor`` only declares the extended window; it is trained (or fine-tuned) with. The paper
    combines it with YaRN ("Resonance YaRN") — on a model whose RoPE is already yarn-scaled this is that rule.

    Composition: ``θ'_i = 2π / round(2π/θ^eff_i)`` — the model's effective wavelengths rounded; the model's
    attention factor kept.
    """

    name = "resonance"
    title = "Resonance RoPE"
    summary = "Round every rotary wavelength to a whole number of tokens, so each pair repeats its trained phases."
    reference = "Wang et al. 2024, arXiv 2403.00071 (Resonance RoPE, Findings of ACL 2024) Algorithm 1"
    params = (DECLARED_FACTOR,)
    needs_training = True
    uses_factor = False
    composition = "θ'_i = 2π / round(2π/θ^eff_i) (the effective wavelengths rounded); the model's attention factor kept"

    def inv_freq(self, info, params, seq_len=None, device=None):
        base, attention_factor = self.base(info, seq_len, device)
        wavelength = (2 * math.pi) / base.to(torch.float64)
        # θ ≤ 1 for any base b > 1, so every wavelength is at least 2π and rounds to 6 or more
        return ((2 * math.pi) / torch.round(wavelength)).to(base.dtype), attention_factor

    def settings_line(self, info, params, requested=None):
        return "each wavelength 2π/θ_i rounded to whole tokens"
