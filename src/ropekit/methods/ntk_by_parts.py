"""NTK-by-parts: interpolate low frequencies, keep high ones, ramp in between (YaRN without temperature)."""

from __future__ import annotations

import math
from typing import Literal

import torch

from ..core.base_rope import wavelengths
from ..core.rope import default_inv_freq
from ..errors import InvalidParameterError
from .base import FACTOR, ORIGINAL_WINDOW, ROPE_THETA, Method, Param, register

Ramp = Literal["dim", "ratio"]
Blend = Literal["frequency", "wavelength"]


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
      clamped to [0, 1], linear in ``r = C/λ_i`` (YaRN §3.2, the ramp γ(r) with α = β_slow, β = β_fast).
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

    * ``ramp="ratio"``: ``γ(r) = clamp((r − β_slow)/(β_fast − β_slow), 0, 1)`` (YaRN §3.2, NTK-by-parts).
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
    linear = (torch.arange(half, dtype=torch.float32, device=ratios.device) - low) / (high - low)
    return 1.0 - linear.clamp(0.0, 1.0)


BETA_FAST = Param("beta_fast", float, 32.0, "β: pairs rotating more than β times in C keep their frequency", minimum=0, exclusive_minimum=True)
BETA_SLOW = Param("beta_slow", float, 1.0, "α: pairs rotating fewer than α times in C are fully interpolated", minimum=0, exclusive_minimum=True)
BLEND = Param(
    "blend", str, "frequency", "mix frequencies (YaRN, transformers) or wavelengths ('harmonic', PoSE's revision)",
    choices=("frequency", "wavelength"),
)
TRUNCATE = Param("truncate", bool, True, "floor/ceil the ramp's end dimensions (ramp='dim' only), as transformers")


def ramp_param(default: str) -> Param:
    return Param(
        "ramp", str, default, "'ratio': γ linear in r = C/λ (YaRN paper); 'dim': linear in the pair index (reference code)",
        choices=("ratio", "dim"),
    )


class _ByParts(Method):
    """Shared machinery of NTK-by-parts and YaRN: ``θ'_i`` from the keep-fraction ``γ_i``.

    Composition: γ from the effective wavelengths ``λ^eff_i = 2π/θ^eff_i`` against the effective window
    (``r_i = C/λ^eff_i``; with ``ramp='dim'`` the ramp's end pairs are where ``r`` crosses β, which is YaRN's
    closed form on plain RoPE), then ``θ' = (1 − γ)·θ^eff/s + γ·θ^eff``; attention factors multiply.
    """

    composition = ("γ from the effective wavelengths λ^eff = 2π/θ^eff against the effective window, "
                   "θ' = (1 − γ)·θ^eff/s + γ·θ^eff; attention factors multiply")

    def check(self, info, params):
        if params["beta_slow"] >= params["beta_fast"]:
            raise InvalidParameterError(
                f"{self.name}: beta_slow ({params['beta_slow']:g}) must be below beta_fast ({params['beta_fast']:g})",
                "pass e.g. beta_fast=32 beta_slow=1",
            )

    def gamma(self, info, params, device=None):
        return keep_fraction(
            params["rope_theta"],
            info.rotary_dim,
            params["original_max_position_embeddings"],
            params["beta_fast"],
            params["beta_slow"],
            ramp=params["ramp"],
            truncate=params["truncate"],
            device=device,
        )

    def scaled_inv_freq(self, info, params, seq_len=None, device=None):
        """``(θ', the model's own attention factor)``: YaRN §3.2 on plain RoPE, the composition rule on a
        scaled one."""
        if info.is_scaled:
            base, attention_factor = self.base(info, seq_len, device)
            if params["factor"] == 1.0:
                return base, attention_factor
            # the ramp's end pairs are read off the frequencies as numbers (ramp='dim'): where transformers builds
            # the model on the meta device first (from_pretrained, a parameter count) they are computed on the CPU
            known = base
            if base.device.type == "meta":
                with torch.device("cpu"):  # transformers' rope functions allocate on the default device
                    known = self.base(info, seq_len, "cpu")[0]
            ratios = params["original_max_position_embeddings"] / wavelengths(known)
            gamma = keep_fraction_from_ratios(ratios, params["beta_fast"], params["beta_slow"], params["ramp"],
                                              params["truncate"]).to(base.device)
            return blend_inv_freq(base, params["factor"], gamma, params["blend"]), attention_factor
        base = default_inv_freq(params["rope_theta"], info.rotary_dim, device)
        if params["factor"] == 1.0:
            return base, 1.0
        return blend_inv_freq(base, params["factor"], self.gamma(info, params, device), params["blend"]), 1.0

    def _matches_transformers_yarn(self, params) -> bool:
        return params["ramp"] == "dim" and params["blend"] == "frequency"

    def _transformers_yarn(self, info, params, attention_factor: float) -> dict | None:
        """transformers' ``yarn`` rope_parameters for this installation, when it is the same math."""
        if info.is_scaled or not self._matches_transformers_yarn(params):
            return None
        return {
            "rope_type": "yarn",
            "factor": params["factor"],
            "original_max_position_embeddings": params["original_max_position_embeddings"],
            "beta_fast": params["beta_fast"],
            "beta_slow": params["beta_slow"],
            "attention_factor": attention_factor,
            "truncate": params["truncate"],
            "rope_theta": params["rope_theta"],
        }


@register
class NTKByParts(_ByParts):
    """NTK-by-parts (bloc97 2023, as defined in the YaRN paper §3.2: r(d) = L/λ_d, the ramp γ(r) and h(θ_d)).

    ``θ'_i = (1 − γ(r_i))·θ_i/s + γ(r_i)·θ_i`` with ``r_i = C/λ_i`` and
    ``γ(r) = clamp((r − α)/(β − α), 0, 1)``, α = ``beta_slow`` = 1, β = ``beta_fast`` = 32 for Llama.
    No attention temperature. With ``ramp='dim'`` the ramp is linear in the pair index as in YaRN's code;
    that form exports to transformers as ``yarn`` with ``attention_factor = 1``.

    Composition: γ from the effective wavelengths ``λ^eff_i = 2π/θ^eff_i`` against the effective window
    (``r_i = C/λ^eff_i``), then ``θ'_i = (1 − γ_i)·θ^eff_i/s + γ_i·θ^eff_i``; the model's own attention factor kept.
    """

    name = "ntk_by_parts"
    title = "NTK-by-parts"
    summary = "Interpolate wavelengths longer than C, keep short ones, linear ramp between (no temperature)."
    reference = "bloc97 2023; YaRN paper (Peng et al. 2023) §3.2 (r(d), γ(r), h(θ_d))"
    params = (FACTOR, ORIGINAL_WINDOW, BETA_FAST, BETA_SLOW, ramp_param("ratio"), BLEND, TRUNCATE, ROPE_THETA)

    family = "NTK & base frequency"

    def demo_params(self, info, factor):
        """Ramp ends β = 4, α = 1 rotations per window: the papers' β = 32 is meant for 4k windows; in a 64-token
        window even the fastest pair rotates only C/2π ≈ 10 times, so β = 32 would interpolate every pair (almost
        PI). β = 4 keeps the pairs whose wavelength is at most a quarter of the window and still fully interpolates
        those longer than the window (α = 1)."""
        return {"factor": factor, "beta_fast": 4.0, "beta_slow": 1.0}

    def settings_line(self, info, params, requested=None):
        s = params.get("factor", 1.0)
        return f"s={s:g}, β={params['beta_fast']:g}, α={params['beta_slow']:g} ({params['ramp']} ramp)"

    def inv_freq(self, info, params, seq_len=None, device=None):
        return self.scaled_inv_freq(info, params, seq_len, device)

    def transformers_rope(self, info, params):
        return self._transformers_yarn(info, params, attention_factor=1.0)

    def exports_to(self, params=None):
        if params is not None and self._matches_transformers_yarn(params):
            return ["transformers", "vllm"]  # transformers' yarn with magnitude 1, which vLLM's plan passes on
        return []
