"""Llama 3.1's RoPE scaling as a ropekit method (transformers' ``llama3`` rope type)."""

from __future__ import annotations

import math

import torch

from ..core.rope import default_inv_freq
from ..errors import InvalidParameterError
from .base import FACTOR, ORIGINAL_WINDOW, ROPE_THETA, Method, Param, register


def llama3_inv_freq(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original: int) -> torch.Tensor:
    """Llama 3.1's frequency scaling (Meta's ``apply_scaling``; transformers' ``llama3`` rope type).

    With ``λ_i = 2π/θ_i`` and ``L = original``: pairs with ``λ < L/high`` keep ``θ_i``; pairs with ``λ > L/low``
    get ``θ_i/s``; in between ``θ' = (1 − κ)·θ/s + κ·θ`` with ``κ = (L/λ − low)/(high − low)``. Given any
    frequencies (a pre-scaled model's θ^eff), the same rule applies to their wavelengths.
    """
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = original / low_freq_factor, original / high_freq_factor
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


@register
class Llama3(Method):
    """Llama 3.1 frequency scaling (Meta, "The Llama 3 Herd of Models", arXiv 2407.21783; ``apply_scaling`` of the
    reference code; transformers' ``llama3``).

    With ``λ_i = 2π/θ_i`` and ``L = original_max_position_embeddings``: wavelengths shorter than
    ``L/high_freq_factor`` keep ``θ_i``; longer than ``L/low_freq_factor`` become ``θ_i/s``; in between
    ``θ' = (1 − κ)·θ/s + κ·θ`` with ``κ = (L/λ − low)/(high − low)`` — NTK-by-parts with the ramp linear in
    ``L/λ``. No attention factor. Llama 3.1 ships factor 8, low 1, high 4 over L = 8,192.

    Composition: the same rule on the effective wavelengths ``λ^eff = 2π/θ^eff`` with ``L`` = the effective
    window; the model's attention factor kept.
    """

    name = "llama3"
    title = "Llama 3 scaling"
    summary = "Keep short wavelengths, divide long ones by s, smooth ramp between (Llama 3.1's rope_type llama3)."
    reference = "Meta 2024, arXiv 2407.21783 (Llama 3.1); transformers rope_type 'llama3'"
    params = (
        FACTOR,
        Param("low_freq_factor", float, 1.0, "wavelengths above L/low_freq_factor are divided by s", minimum=0,
              exclusive_minimum=True),
        Param("high_freq_factor", float, 4.0, "wavelengths below L/high_freq_factor keep their frequency", minimum=0,
              exclusive_minimum=True),
        ORIGINAL_WINDOW,
        ROPE_THETA,
    )
    needs_training = False
    composition = "the llama3 rule on the effective wavelengths λ^eff = 2π/θ^eff, L = the effective window"

    family = "NTK & base frequency"

    def settings_line(self, info, params, requested=None):
        s = params.get("factor", 1.0)
        return f"s={s:g}, low/high frequency factors {params['low_freq_factor']:g}/{params['high_freq_factor']:g}"

    def check(self, info, params):
        if params["high_freq_factor"] <= params["low_freq_factor"]:
            raise InvalidParameterError(
                f"llama3: high_freq_factor ({params['high_freq_factor']:g}) must be above low_freq_factor "
                f"({params['low_freq_factor']:g})", "pass e.g. low_freq_factor=1 high_freq_factor=4")

    def inv_freq(self, info, params, seq_len=None, device=None):
        if info.is_scaled:
            base, attention_factor = self.base(info, seq_len, device)
        else:
            base, attention_factor = default_inv_freq(params["rope_theta"], info.rotary_dim, device), 1.0
        if params["factor"] == 1.0:  # the identity, exactly (the ramp's blend would round the last bit)
            return base, attention_factor
        scaled = llama3_inv_freq(base, params["factor"], params["low_freq_factor"], params["high_freq_factor"],
                                 params["original_max_position_embeddings"])
        return scaled, attention_factor

    def transformers_rope(self, info, params):
        if info.is_scaled:
            return None
        return {
            "rope_type": "llama3",
            "factor": params["factor"],
            "low_freq_factor": params["low_freq_factor"],
            "high_freq_factor": params["high_freq_factor"],
            "original_max_position_embeddings": params["original_max_position_embeddings"],
            "rope_theta": params["rope_theta"],
        }

    def exports_to(self, params=None):
        return ["transformers", "vllm"]
