"""The pure mathematics of RoPE and its frequency-side extensions.

Notation (shared by every docstring in ``ropekit.methods``):

* ``d``   rotary dimension (head_dim × partial_rotary_factor), always even;
* ``b``   RoPE base (``rope_theta``);
* ``θ_i = b^(−2i/d)`` for ``i = 0 … d/2−1`` — the inverse frequencies (``inv_freq``);
* ``λ_i = 2π/θ_i`` — the wavelength of pair ``i``;
* ``C``   the pretrained window (``original_max_position_embeddings``), ``C'`` a target or trained length;
* ``s``   the scale factor, usually ``C'/C``.

Everything here is a function of numbers and tensors only; nothing touches a model. The methods in this
package turn these into transformers rope types, and the tests compare them with transformers' own
implementation and with the papers' formulas written out independently.

Paper references: LCEG = "A Controlled Study on Long Context Extension and Generalization in LLMs"
(shared LCEG (Lu et al. 2024)), YaRN = Peng et al. 2023 (arXiv 2309.00071), PoSE = shared PoSE (Zhu et al. 2024),
Entropy-ABF = shared Entropy-ABF (Zhang et al. 2024), HARPE = shared HARPE (Lian et al. 2025).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

Ramp = Literal["dim", "ratio"]
Blend = Literal["frequency", "wavelength"]


def default_inv_freq(base: float, dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Plain RoPE: ``θ_i = b^(−2i/d)`` (RoFormer; PoSE Eq. 1; HARPE Eq. 6 with one base).

    Computed in float32 in the same order of operations transformers uses, so that an unmodified model
    stays bit-identical when ropekit re-installs its rotary embedding.
    """
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (base**exponents)


def pi_inv_freq(base: float, dim: int, factor: float, device=None) -> torch.Tensor:
    """Linear position interpolation: positions ``m → m/s``, i.e. ``θ_i/s`` (LCEG Eq. 8, α_j = 1/t)."""
    return default_inv_freq(base, dim, device) / factor


def ntk_exponent(dim: int) -> float:
    """The NTK-aware exponent ``d/(d−2)``: it scales the lowest frequency exactly like PI (LCEG Eq. 9)."""
    if dim <= 2:
        raise ValueError("NTK-aware scaling needs a rotary dimension above 2")
    return dim / (dim - 2)


def ntk_base(base: float, dim: int, alpha: float) -> float:
    """NTK-aware base: ``b' = b·α^(d/(d−2))`` (LCEG Eq. 9 with κ = t^(d/(d−2)); PoSE §3.1 λ = α^(d/(d−2)))."""
    return base * alpha ** ntk_exponent(dim)


def dynamic_ntk_alpha(factor: float, seq_len: float, original: int, trained_length: int | None = None) -> float:
    """The effective NTK ratio of Dynamic NTK.

    ``t = s·max(C', C_test)/C − (s − 1)`` (LCEG §7.8.1, after Fu et al. 2024). ``C_test`` is the longest
    length seen so far (``seq_len``), ``C'`` the trained length. With ``C' = C`` this is transformers'
    ``dynamic`` rule, ``s·max(L, C)/C − (s−1)``: the base stays at ``b`` inside the pretrained window.
    With ``C' > C`` the base is *frozen* at its ``C'`` value for every shorter input (the NTK-32k/64k
    models of LCEG Tables 13–14: s=4, C=4096, C'=32768 gives t = 29, b' ≈ 305,922 for Llama-2).
    """
    floor = original if trained_length is None else trained_length
    return factor * max(float(seq_len), float(floor)) / original - (factor - 1.0)


def dynamic_ntk_base(
    base: float, dim: int, factor: float, seq_len: float, original: int, trained_length: int | None = None
) -> float:
    """Dynamic NTK base ``b·t^(d/(d−2))`` with ``t`` from :func:`dynamic_ntk_alpha`."""
    return ntk_base(base, dim, dynamic_ntk_alpha(factor, seq_len, original, trained_length))


def yarn_correction_dim(num_rotations: float, dim: int, base: float, original: int) -> float:
    """The (fractional) pair index whose wavelength fits ``num_rotations`` times into ``C``.

    Solves ``C/λ_i = r`` for ``i``: ``i = d·ln(C/(2π r)) / (2 ln b)`` (YaRN §3.2, the boundary of the
    ratio ``r(i) = C/λ_i``).
    """
    return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_correction_range(
    beta_fast: float, beta_slow: float, dim: int, base: float, original: int, truncate: bool = True
) -> tuple[float, float]:
    """Pair indices ``[low, high]`` between which YaRN's ramp runs (``low`` from β_fast, ``high`` from β_slow).

    ``truncate`` floors ``low`` and ceils ``high`` as the reference code and transformers do; the result is
    clipped to ``[0, d−1]`` like theirs.
    """
    low = yarn_correction_dim(beta_fast, dim, base, original)
    high = yarn_correction_dim(beta_slow, dim, base, original)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def keep_fraction(
    base: float,
    dim: int,
    original: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    ramp: Ramp = "dim",
    truncate: bool = True,
    device=None,
) -> torch.Tensor:
    """γ_i ∈ [0, 1]: how much of pair ``i`` keeps its original frequency in NTK-by-parts / YaRN.

    γ = 1 for high frequencies (many rotations inside ``C``: ``r(i) = C/λ_i > β_fast``), 0 for low ones
    (``r(i) < β_slow``), and a ramp in between.

    * ``ramp="ratio"`` — the YaRN paper's definition of NTK-by-parts: ``γ(r) = (r − β_slow)/(β_fast − β_slow)``
      clamped to [0, 1], linear in ``r = C/λ_i`` (YaRN Eq. 17–18, α = β_slow, β = β_fast).
    * ``ramp="dim"`` — the reference code's and transformers' form: linear in the pair index between
      :func:`yarn_correction_range` (``1 − clamp((i − low)/(high − low), 0, 1)``).
    """
    half = dim // 2
    if ramp == "ratio":
        inv_freq = default_inv_freq(base, dim, device).to(torch.float64)
        ratio = original * inv_freq / (2 * math.pi)
        gamma = ((ratio - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)
        return gamma.to(torch.float32)
    if ramp != "dim":
        raise ValueError(f"unknown ramp '{ramp}'")
    low, high = yarn_correction_range(beta_fast, beta_slow, dim, base, original, truncate)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero; same guard as the reference code
    linear = (torch.arange(half, dtype=torch.float32) - low) / (high - low)
    return (1.0 - linear.clamp(0.0, 1.0)).to(device=device)


def blend_inv_freq(
    inv_freq: torch.Tensor, factor: float, gamma: torch.Tensor, blend: Blend = "frequency"
) -> torch.Tensor:
    """Mix interpolated (``θ/s``) and original (``θ``) frequencies with keep-fraction γ.

    * ``"frequency"``: ``θ'_i = (1 − γ_i)·θ_i/s + γ_i·θ_i`` — YaRN's Eq. (LCEG Eq. 10 without the
      temperature), used by the reference code and transformers.
    * ``"wavelength"`` ("harmonic"): ``θ'_i = θ_i / ((1 − γ_i)·s + γ_i)``, i.e. the *wavelengths* are
      mixed linearly — the revision the PoSE authors use (jquesnelle/yarn#24).
    Both agree wherever γ ∈ {0, 1}.
    """
    if blend == "frequency":
        return (inv_freq / factor) * (1 - gamma) + inv_freq * gamma
    if blend == "wavelength":
        return inv_freq / ((1 - gamma) * factor + gamma)
    raise ValueError(f"unknown blend '{blend}'")


def yarn_mscale(factor: float) -> float:
    """YaRN's attention factor ``√(1/t) = 0.1·ln s + 1`` (YaRN Eq. 22; 1 when s ≤ 1).

    It multiplies cos and sin, so the attention logits are scaled by its square.
    """
    if factor <= 1:
        return 1.0
    return 0.1 * math.log(factor) + 1.0


def entropy_logit_scale(positions: torch.Tensor, context: int) -> torch.Tensor:
    """Entropy-aware ABF's logit scale ``t = max(log_c i, 1)`` (Entropy-ABF paper, Eq. 5).

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


def ntk_ratio(dim: int, factor: float, device=None) -> torch.Tensor:
    """``θ'_i/θ_i = s^(−2i/(d−2))`` of NTK-aware scaling: the base change ``b → b·s^(d/(d−2))`` as a per-pair
    ratio (LCEG Eq. 9), so that it applies to any frequencies."""
    return torch.exp(-pair_exponents(dim, device) * ntk_exponent(dim) * math.log(factor))


def base_change_ratio(dim: int, old_base: float, new_base: float, device=None) -> torch.Tensor:
    """``θ'_i/θ_i = (b/b')^(2i/d)``: replacing the base ``b`` by ``b'`` (ABF) as a per-pair ratio."""
    return torch.exp(pair_exponents(dim, device) * (math.log(old_base) - math.log(new_base)))


def scale_pairs(inv_freq: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """``inv_freq · ratio`` computed in float64 and returned in ``inv_freq``'s dtype."""
    return (inv_freq.to(torch.float64) * ratio.to(inv_freq.device)).to(inv_freq.dtype)


def _crossing_index(log_ratio: torch.Tensor, target: float) -> float:
    """The fractional pair index where ``log r_i`` (decreasing in ``i``) equals ``log target``, linear in ``i``
    between neighbouring pairs and along the end segments outside them. For plain RoPE ``log r_i`` is linear in
    ``i``, so this is exactly YaRN's closed-form correction dimension."""
    values = log_ratio.tolist()
    goal = math.log(target)
    n = len(values)
    if n == 1:
        return 0.0
    k = 0
    while k < n - 2 and values[k + 1] >= goal:
        k += 1
    left, right = values[k], values[k + 1]
    if left == right:
        return float(k)
    return k + (left - goal) / (left - right)


def keep_fraction_from_ratios(
    ratios: torch.Tensor, beta_fast: float, beta_slow: float, ramp: Ramp = "dim", truncate: bool = True
) -> torch.Tensor:
    """γ_i for NTK-by-parts / YaRN on any frequencies, from ``r_i = C/λ_i`` (float64, decreasing in ``i``).

    * ``ramp="ratio"``: ``γ(r) = clamp((r − β_slow)/(β_fast − β_slow), 0, 1)`` (YaRN Eq. 17–18).
    * ``ramp="dim"``: linear in the pair index between the (fractional) pairs where ``r`` crosses β_fast and
      β_slow, floored/ceiled with ``truncate`` and clipped to ``[0, d−1]`` like :func:`yarn_correction_range` —
      which it equals on plain RoPE, where ``log r_i`` is linear in ``i``.
    """
    if ramp == "ratio":
        return ((ratios - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0).to(torch.float32)
    if ramp != "dim":
        raise ValueError(f"unknown ramp '{ramp}'")
    half = ratios.numel()
    log_ratio = torch.log(ratios)
    low, high = _crossing_index(log_ratio, beta_fast), _crossing_index(log_ratio, beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, 2 * half - 1)
    if low == high:
        high += 0.001  # the same guard as the plain ramp
    linear = (torch.arange(half, dtype=torch.float32) - low) / (high - low)
    return (1.0 - linear.clamp(0.0, 1.0)).to(device=ratios.device)


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


def longrope_inv_freq(base: float, dim: int, rescale: list[float], device=None) -> torch.Tensor:
    """LongRoPE (Ding et al. 2024, arXiv 2402.13753): ``θ'_i = 1/(λ_i·b^(2i/d))`` — one rescale factor
    ``λ_i`` per rotary pair (``short_factor`` or ``long_factor``)."""
    factors = torch.tensor(rescale, dtype=torch.float32, device=device)
    shape = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    return 1.0 / (factors * base**shape)


def longrope_attention_factor(factor: float, original: int) -> float:
    """LongRoPE's default attention factor ``√(1 + ln s / ln C)`` (1 when s ≤ 1)."""
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original))
