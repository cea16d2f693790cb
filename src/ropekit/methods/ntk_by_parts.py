"""NTK-by-parts: interpolate low frequencies, keep high ones, ramp in between (YaRN without temperature)."""

from __future__ import annotations

from ..core.base_rope import wavelengths
from ..core.rope import blend_inv_freq, default_inv_freq, keep_fraction, keep_fraction_from_ratios
from ..errors import InvalidParameterError
from .base import FACTOR, ORIGINAL_WINDOW, ROPE_THETA, Method, Param, register

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
        """``(θ', the model's own attention factor)``: YaRN Eq. 17–18 on plain RoPE, the composition rule on a
        scaled one."""
        if info.is_scaled:
            base, attention_factor = self.base(info, seq_len, device)
            if params["factor"] == 1.0:
                return base, attention_factor
            ratios = params["original_max_position_embeddings"] / wavelengths(base)
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
    """NTK-by-parts (bloc97 2023, as defined in the YaRN paper §3.2, Eq. 17–18).

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
    reference = "bloc97 2023; YaRN paper (Peng et al. 2023) §3.2 Eq. 17–18"
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
            return ["transformers"]
        return []
