"""Linear Position Interpolation (PI): squeeze ``C'`` positions into the pretrained ``C``."""

from __future__ import annotations

import torch

from .base import FACTOR, ROPE_THETA, GGUFKeys, Method, register
from ..core.rope import default_inv_freq


def pi_inv_freq(base: float, dim: int, factor: float, device=None) -> torch.Tensor:
    """Linear position interpolation: positions ``m → m/s``, i.e. ``θ_i/s`` (LCEG Eq. 8, α_j = 1/t)."""
    return default_inv_freq(base, dim, device) / factor


@register
class PositionInterpolation(Method):
    """PI (Chen et al. 2023): every frequency divided by ``s`` — LCEG Eq. 8, ``α_j = C/C' = 1/t``.

    Equivalent to feeding position ``m/s``. transformers calls it ``linear``; the exported config is
    plain transformers and vLLM.

    Composition (a model whose RoPE is already scaled): ``θ'_i = θ^eff_i / s`` on the effective frequencies,
    the model's own attention factor kept.
    """

    name = "pi"
    title = "Position Interpolation"
    summary = "Divide every RoPE frequency by s (positions m → m/s); best after fine-tuning at the target length."
    reference = "Chen et al. 2023, arXiv 2306.15595; LCEG (Lu et al. 2024, arXiv 2409.12181) Eq. 8"
    params = (FACTOR, ROPE_THETA)
    needs_training = True
    composition = "θ'_i = θ^eff_i / s; the model's attention factor kept"

    family = "PI & LongLoRA"

    def settings_line(self, info, params, requested=None):
        return f"s={params.get('factor', 1.0):g}"

    def inv_freq(self, info, params, seq_len=None, device=None):
        if info.is_scaled:
            base, attention_factor = self.base(info, seq_len, device)
            return (base if params["factor"] == 1.0 else base / params["factor"]), attention_factor
        if params["factor"] == 1.0:
            return default_inv_freq(params["rope_theta"], info.rotary_dim, device), 1.0
        return pi_inv_freq(params["rope_theta"], info.rotary_dim, params["factor"], device), 1.0

    def transformers_rope(self, info, params):
        if info.is_scaled:
            return None
        return {"rope_type": "linear", "factor": params["factor"], "rope_theta": params["rope_theta"]}

    def exports_to(self, params=None):
        return ["transformers", "vllm"]

    def gguf_rope(self, info, params):
        # llama.cpp's `linear` divides every frequency by the factor: PI's rule
        if params.get("factor", 1.0) > 1.0:
            return GGUFKeys("linear", float(params["rope_theta"]), factor=float(params["factor"]))
        return None
