"""The model's own RoPE, before any ropekit method: its *effective* frequencies and attention factor.

Most checkpoints people bring are already scaled (Llama 3.1's ``llama3``, Phi-3.5's ``longrope``, Qwen with
``yarn``). ropekit extends them from what they really compute, so these frequencies come from transformers'
own implementation of the model's rope type (its rope-init registry, :mod:`ropekit.adapters.transformers`), fed the same fields the model's
rotary-embedding module feeds it — bit-identical to the model.
"""

from __future__ import annotations

import math

import torch

from ..adapters.transformers import rope_init_function
from ..errors import UnsupportedModelError
from .rope import default_inv_freq
from .rope_info import RopeInfo

#: Rope types whose frequencies depend on the input length, and how: ``switch`` changes once, at the original
#: window (LongRoPE's short/long factors); ``continuous`` grows with the length (Dynamic NTK).
_LENGTH_DEPENDENT = {"dynamic": "continuous"}


class _RopeFields:
    """The config fields transformers' rope-init functions read, and nothing else."""

    def __init__(self, info: RopeInfo):
        self.rope_parameters = dict(info.rope_parameters or {})
        self.head_dim = info.head_dim
        self.num_attention_heads = info.num_heads
        self.hidden_size = info.head_dim * info.num_heads
        self.max_position_embeddings = info.config_window or info.window

    def standardize_rope_params(self) -> None:
        """The parameters are already in transformers 5.x form."""


def base_frequencies(info: RopeInfo, seq_len: int | None = None, device=None) -> tuple[torch.Tensor, float]:
    """``(θ^eff, attention factor)`` of the model described by ``info`` at input length ``seq_len``.

    Plain RoPE: ``θ_i = b^(−2i/d)`` and factor 1. A scaled rope type: transformers' own function for it.
    """
    if not info.is_scaled:
        return default_inv_freq(info.rope_theta, info.rotary_dim, device), 1.0
    compute = rope_init_function(info.rope_type)
    if compute is None:
        raise UnsupportedModelError(
            f"model type '{info.model_type}' uses rope_type '{info.rope_type}', which transformers does not compute",
            "extend a model with a transformers rope type (default, linear, dynamic, yarn, llama3, longrope)",
        )
    inv_freq, attention_factor = compute(_RopeFields(info), device, seq_len)
    return inv_freq, float(attention_factor)


def length_dependence(info: RopeInfo) -> tuple[str, int | None]:
    """How the model's own frequencies depend on the input length: ``("static", None)``, ``("switch", L)``
    (one set up to ``L`` tokens, another beyond: LongRoPE with different short and long factors) or
    ``("continuous", L)`` (recomputed from the length beyond ``L``: transformers' ``dynamic``)."""
    if info.rope_type == "longrope":
        params = info.rope_parameters or {}
        if list(params.get("short_factor") or []) != list(params.get("long_factor") or []):
            return "switch", info.original_window
        return "static", None
    kind = _LENGTH_DEPENDENT.get(info.rope_type)
    return ("static", None) if kind is None else (kind, info.window)


def wavelengths(inv_freq: torch.Tensor) -> torch.Tensor:
    """``λ_i = 2π/θ_i`` in float64 (the ramps of NTK-by-parts, YaRN and llama3 compare them with the window)."""
    return 2 * math.pi / inv_freq.to(torch.float64)
