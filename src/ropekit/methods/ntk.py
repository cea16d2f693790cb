"""NTK-aware scaling: a larger RoPE base that stretches low frequencies like PI and keeps high ones."""

from __future__ import annotations

import math

import torch

from .base import FACTOR, ROPE_THETA, GGUFKeys, Method, register, short_number
from ..core.rope import default_inv_freq, pair_exponents, scale_pairs


def ntk_exponent(dim: int) -> float:
    """The NTK-aware exponent ``d/(d−2)``: it scales the lowest frequency exactly like PI (LCEG Eq. 9)."""
    if dim <= 2:
        raise ValueError("NTK-aware scaling needs a rotary dimension above 2")
    return dim / (dim - 2)


def ntk_base(base: float, dim: int, alpha: float) -> float:
    """NTK-aware base: ``b' = b·α^(d/(d−2))`` (LCEG Eq. 9 with κ = t^(d/(d−2)); PoSE §3.1 λ = α^(d/(d−2)))."""
    return base * alpha ** ntk_exponent(dim)


def ntk_ratio(dim: int, factor: float, device=None) -> torch.Tensor:
    """``θ'_i/θ_i = s^(−2i/(d−2))`` of NTK-aware scaling: the base change ``b → b·s^(d/(d−2))`` as a per-pair
    ratio (LCEG Eq. 9), so that it applies to any frequencies."""
    return torch.exp(-pair_exponents(dim, device) * ntk_exponent(dim) * math.log(factor))


@register
class NTKAware(Method):
    """NTK-aware RoPE (bloc97 2023): static base ``b' = b·α^(d/(d−2))`` with ``α = s``.

    LCEG Eq. 9 (``κ = t^(d/(d−2))``) and PoSE §3.1 (``λ = α^(d/(d−2))``): the lowest frequency is scaled
    exactly like PI, the highest is unchanged. The exported config is a plain ``rope_theta`` change.

    Composition: the base change as a per-pair ratio on the effective frequencies,
    ``θ'_i = θ^eff_i · s^(−2i/(d−2))``, the model's own attention factor kept.
    """

    name = "ntk"
    title = "NTK-aware scaling"
    summary = "Raise the base to b·s^(d/(d−2)): low frequencies interpolated, high ones kept; works without training."
    reference = "bloc97 2023 (reddit r/LocalLLaMA); LCEG (Lu et al. 2024, arXiv 2409.12181) Eq. 9; PoSE (Zhu et al. 2024, arXiv 2309.10400) §3.1"
    params = (FACTOR, ROPE_THETA)
    composition = "θ'_i = θ^eff_i · s^(−2i/(d−2)) (the base change as a per-pair ratio); the model's attention factor kept"

    family = "NTK & base frequency"

    def settings_line(self, info, params, requested=None):
        s = params.get("factor", 1.0)
        return f"s={s:g} (b'={short_number(self.new_base(info, params))})"

    def new_base(self, info, params) -> float:
        if params["factor"] == 1.0:
            return params["rope_theta"]
        return ntk_base(params["rope_theta"], info.rotary_dim, params["factor"])

    def inv_freq(self, info, params, seq_len=None, device=None):
        if info.is_scaled:
            base, attention_factor = self.base(info, seq_len, device)
            if params["factor"] == 1.0:
                return base, attention_factor
            return scale_pairs(base, ntk_ratio(info.rotary_dim, params["factor"], device)), attention_factor
        return default_inv_freq(self.new_base(info, params), info.rotary_dim, device), 1.0

    def transformers_rope(self, info, params):
        if info.is_scaled:
            return None
        return {"rope_type": "default", "rope_theta": self.new_base(info, params)}

    def exports_to(self, params=None):
        return ["transformers", "vllm"]

    def gguf_rope(self, info, params):
        return GGUFKeys("none", float(self.new_base(info, params)))  # a new freq_base
