"""The RoPE mathematics every layer shares: plain RoPE's frequencies, the rotation, per-pair scaling.

Each method's own formulas (PI, NTK-aware, NTK-by-parts/YaRN, Dynamic NTK, llama3, LongRoPE, ABF) live in its unit,
``ropekit.methods.<name>``; this module keeps what the attention layer, the model's own RoPE and several methods use.

Notation (shared by every docstring in ``ropekit.methods``):

* ``d``   rotary dimension (head_dim × partial_rotary_factor), always even;
* ``b``   RoPE base (``rope_theta``);
* ``θ_i = b^(−2i/d)`` for ``i = 0 … d/2−1`` — the inverse frequencies (``inv_freq``);
* ``λ_i = 2π/θ_i`` — the wavelength of pair ``i``;
* ``C``   the pretrained window (``original_max_position_embeddings``), ``C'`` a target or trained length;
* ``s``   the scale factor, usually ``C'/C``.

Everything here is a function of numbers and tensors only; nothing touches a model.

Paper references: LCEG = "A Controlled Study on Long Context Extension and Generalization in LLMs"
(shared LCEG (Lu et al. 2024)), YaRN = Peng et al. 2023 (arXiv 2309.00071), PoSE = shared PoSE (Zhu et al. 2024),
Entropy-ABF = shared Entropy-ABF (Zhang et al. 2024), HARPE = shared HARPE (Lian et al. 2025).
"""

from __future__ import annotations

import math

import torch


def default_inv_freq(base: float, dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Plain RoPE: ``θ_i = b^(−2i/d)`` (RoFormer; PoSE Eq. 1; HARPE Eq. 6 with one base).

    Computed in float32 in the same order of operations transformers uses, so that an unmodified model
    stays bit-identical when ropekit re-installs its rotary embedding.
    """
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (base**exponents)


def entropy_logit_scale(positions: torch.Tensor, context: int) -> torch.Tensor:
    """Entropy-aware ABF's logit scale ``t = max(log_c i, 1)`` (Entropy-ABF paper §3.2, the unnumbered equation after Eq. 4).

    ``i`` is the 1-based index of the query token (``position_id + 1``: the number of tokens it can see)
    and ``c`` the pretrained window; the scale is 1 inside the window and grows logarithmically beyond it.
    """
    i = positions.to(torch.float32) + 1.0
    return torch.clamp(torch.log(i) / math.log(context), min=1.0)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] → [−x2, x1]`` over the last dimension: the half-split RoPE layout all supported families use."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply RoPE (half-split layout) to the first ``cos.shape[-1]`` channels of ``x``; the rest pass through.

    The pass-through covers partial-rotary models (GPT-NeoX, Phi-3 with ``partial_rotary_factor < 1``).
    """
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)


# ---- composition on a model whose RoPE is already scaled ------------------------------------------------------
# A pre-scaled model (Llama 3.1's llama3, Phi-3.5's longrope, …) has effective frequencies θ^eff_i that are not
# b^(−2i/d). The rules below apply a method to θ^eff; on plain RoPE each reduces to the method's own formula.
def pair_exponents(dim: int, device=None) -> torch.Tensor:
    """``2i/d`` for every rotary pair ``i`` (float64): the exponent of the base in ``θ_i = b^(−2i/d)``."""
    return torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float64) / dim


def scale_pairs(inv_freq: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """``inv_freq · ratio`` computed in float64 and returned in ``inv_freq``'s dtype."""
    return (inv_freq.to(torch.float64) * ratio.to(inv_freq.device)).to(inv_freq.dtype)


