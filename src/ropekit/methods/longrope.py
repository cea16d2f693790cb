"""LongRoPE's per-pair rescale factors as a ropekit method (transformers' ``longrope`` rope type)."""

from __future__ import annotations

from typing import Any

import torch

from ..core.rope import longrope_attention_factor, longrope_inv_freq
from ..errors import InvalidParameterError
from .base import ORIGINAL_WINDOW, ROPE_THETA, Method, Param, combine_length_dependence, register


@register
class LongRoPE(Method):
    """LongRoPE (Ding et al. 2024, arXiv 2402.13753; transformers' ``longrope``; Phi-3/3.5/4-mini).

    One rescale factor per rotary pair: ``θ'_i = θ_i / λ_i`` with ``λ = short_factor`` for inputs up to
    ``original_max_position_embeddings`` tokens and ``λ = long_factor`` beyond (transformers switches on the
    input length; its KV cache then holds keys of the other set, the known Phi-3 behaviour). cos/sin are
    multiplied by ``attention_factor``, default ``√(1 + ln s / ln C)`` with ``s = factor``. The factors usually
    come from LongRoPE's evolutionary search; ``short_factor`` defaults to all ones (the model's own RoPE
    inside its window).

    Composition: ``θ'_i = θ^eff_i / λ_i`` on the effective frequencies; attention factors multiply.
    """

    name = "longrope"
    title = "LongRoPE factors"
    summary = "One rescale factor per rotary pair (short/long sets), as Phi-3 ships it; from LongRoPE's search."
    reference = "Ding et al. 2024, arXiv 2402.13753 (LongRoPE); transformers rope_type 'longrope'"
    params = (
        Param("long_factor", list, None, "λ_i for inputs longer than the original window: one value ≥ 1 per rotary pair"),
        Param("short_factor", list, None, "λ_i for inputs up to the original window (default: all 1, the model's own RoPE)"),
        Param("factor", float, None, "s = target / original window: sets the default attention factor (default: "
              "max(long_factor))", minimum=1.0),
        Param("attention_factor", float, None, "cos/sin multiplier; default √(1 + ln s / ln C)", minimum=0,
              exclusive_minimum=True),
        ORIGINAL_WINDOW,
        ROPE_THETA,
    )
    changes = ("frequencies", "length_dependent", "attention_factor")
    needs_training = False
    composition = "θ'_i = θ^eff_i / λ_i (short set up to the original window, long beyond); attention factors multiply"

    def resolve(self, info, given):
        params = super().resolve(info, given)
        pairs = info.rotary_dim // 2
        if params["long_factor"] is None:
            raise InvalidParameterError("longrope: long_factor is required (one rescale factor per rotary pair)",
                                        f"pass --param long_factor=λ_0,…,λ_{pairs - 1} ({pairs} values)")
        if params["short_factor"] is None:
            params["short_factor"] = [1.0] * pairs
        for key in ("short_factor", "long_factor"):
            values = params[key]
            if len(values) != pairs:
                raise InvalidParameterError(f"longrope: {key} has {len(values)} values, this model has {pairs} rotary pairs",
                                            f"pass {pairs} values, one per rotary pair")
            if any(v <= 0 for v in values):
                raise InvalidParameterError(f"longrope: every {key} value must be positive", "pass rescale factors ≥ 1")
        if params["factor"] is None:
            params["factor"] = max(1.0, max(params["long_factor"]))
        if params["attention_factor"] is None:
            params["attention_factor"] = longrope_attention_factor(params["factor"], params["original_max_position_embeddings"])
        return params

    def example_params(self, info):
        return {"long_factor": [2.0] * (info.rotary_dim // 2)}

    def length_dependence(self, info, params):
        own = (("static", None) if params["short_factor"] == params["long_factor"]
               else ("switch", params["original_max_position_embeddings"]))
        return combine_length_dependence(super().length_dependence(info, params), own)

    def max_position_embeddings(self, info, params):
        return int(round(params["original_max_position_embeddings"] * params["factor"]))

    def _rescale(self, params: dict[str, Any], seq_len: int | None) -> list[float]:
        longer = seq_len is not None and seq_len > params["original_max_position_embeddings"]
        return params["long_factor"] if longer else params["short_factor"]

    def inv_freq(self, info, params, seq_len=None, device=None):
        rescale = self._rescale(params, seq_len)
        if info.is_scaled:
            base, attention_factor = self.base(info, seq_len, device)
            divisor = torch.tensor(rescale, dtype=base.dtype, device=base.device)
            return base / divisor, attention_factor * float(params["attention_factor"])
        return (longrope_inv_freq(params["rope_theta"], info.rotary_dim, rescale, device),
                float(params["attention_factor"]))

    def transformers_rope(self, info, params):
        if info.is_scaled:
            return None
        return {
            "rope_type": "longrope",
            "short_factor": list(params["short_factor"]),
            "long_factor": list(params["long_factor"]),
            "factor": params["factor"],
            "attention_factor": params["attention_factor"],
            "original_max_position_embeddings": params["original_max_position_embeddings"],
            "rope_theta": params["rope_theta"],
        }

    def exports_to(self, params=None):
        return ["transformers", "vllm"]
