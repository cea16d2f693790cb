"""ABF (adjusted base frequency) and Entropy-aware ABF."""

from __future__ import annotations

import math

import torch

from ..core.rope import default_inv_freq, pair_exponents, scale_pairs
from .ntk import ntk_base
from ..errors import InvalidParameterError
from .base import AttentionSpec, GGUFKeys, Method, Param, original_window, register, short_number, two_digits


def base_change_ratio(dim: int, old_base: float, new_base: float, device=None) -> torch.Tensor:
    """``θ'_i/θ_i = (b/b')^(2i/d)``: replacing the base ``b`` by ``b'`` (ABF) as a per-pair ratio."""
    return torch.exp(pair_exponents(dim, device) * (math.log(old_base) - math.log(new_base)))


NEW_BASE = Param("rope_theta", float, 500000.0, "the new RoPE base b'", minimum=1.0, exclusive_minimum=True)
DECLARED_FACTOR = Param(
    "factor", float, 1.0, "declares the extended window (C·factor); the base alone sets the frequencies", minimum=1.0
)


@register
class ABF(Method):
    """Adjusted base frequency (Xiong et al. 2023): replace ``b`` by a larger ``b'``; ``θ_i = b'^(−2i/d)``.

    Default ``b' = 500,000`` as in Entropy-ABF (Zhang et al. 2024, Table 1). Continual pre-training is expected.

    Composition: the base change as a per-pair ratio on the effective frequencies,
    ``θ'_i = θ^eff_i · (b/b')^(2i/d)``, the model's own attention factor kept.
    """

    name = "abf"
    title = "Adjusted base frequency"
    summary = "Replace the RoPE base with a larger one (default 500,000); meant for continual pre-training."
    reference = "Xiong et al. 2023, arXiv 2309.16039; Entropy-ABF (Zhang et al. 2024, arXiv 2401.07004) Table 1"
    params = (NEW_BASE, DECLARED_FACTOR)
    needs_training = True
    uses_factor = False
    composition = "θ'_i = θ^eff_i · (b/b')^(2i/d) (the base change as a per-pair ratio); the model's attention factor kept"

    family = "NTK & base frequency"

    def demo_params(self, info, factor):
        """Base ``b' ≈ 4 ×`` the NTK-aware base for ``factor``, two significant digits (the papers' 500,000 is meant
        for 4k-token Llama-2 models and would be far too large for the 64-token demo model)."""
        ntk = ntk_base(info.rope_theta, info.rotary_dim, factor) if factor > 1 else info.rope_theta
        return {"rope_theta": two_digits(4 * ntk) if factor > 1 else info.rope_theta, "factor": factor}

    def settings_line(self, info, params, requested=None):
        return f"b'={short_number(params['rope_theta'])}"

    def example_params(self, info):
        return self.demo_params(info, 2.0)

    def resolve(self, info, given):
        """Refuse a base that does not raise the model's: a smaller ``b'`` shortens every wavelength (the window
        shrinks), and the default 500,000 — the papers' value for Llama-2's 10,000 — is no change at all on Llama 3
        (500,000) and a cut on Qwen (1,000,000). An explicit ``b' = b`` is kept: it is the model itself."""
        params = super().resolve(info, given)
        new, own = params["rope_theta"], info.rope_theta
        defaulted = given.get("rope_theta") is None
        if new < own or (defaulted and new <= own):
            which = "the default b' = " if defaulted else "b' = "
            suggestion = two_digits(50 * own)  # the papers' 500,000 is 50x Llama-2's 10,000
            raise InvalidParameterError(
                f"{self.name}: {which}{short_number(new)} does not raise this model's RoPE base "
                f"{short_number(own)}; ABF extends the window with a larger base (a smaller one shortens it)",
                f"pass --param rope_theta=B with B above {short_number(own)}, e.g. {short_number(suggestion)} "
                "(50x, as the papers' 500,000 is to Llama-2's 10,000)")
        return params

    def inv_freq(self, info, params, seq_len=None, device=None):
        if info.is_scaled:
            base, attention_factor = self.base(info, seq_len, device)
            if params["rope_theta"] == info.rope_theta:
                return base, attention_factor
            ratio = base_change_ratio(info.rotary_dim, info.rope_theta, params["rope_theta"], device)
            return scale_pairs(base, ratio), attention_factor
        return default_inv_freq(params["rope_theta"], info.rotary_dim, device), 1.0

    def transformers_rope(self, info, params):
        if info.is_scaled:
            return None
        return {"rope_type": "default", "rope_theta": params["rope_theta"]}

    def exports_to(self, params=None):
        return ["transformers", "vllm"]

    def gguf_rope(self, info, params):
        return GGUFKeys("none", float(params["rope_theta"]))  # a new freq_base


@register
class EntropyABF(ABF):
    """Entropy-aware ABF (Zhang et al. 2024, Entropy-ABF §3.2, the unnumbered equation after Eq. 4).

    ABF with ``b' = 500,000`` plus a per-query-position logit scale
    ``t = max(log_c i, 1)`` (``i`` the 1-based query index, ``c`` the pretrained window) on every layer
    except ``skip_layers`` (default 0 and 1, where the paper observes near-uniform attention). This is the
    paper's rule; the released code applies the scale to every layer (docs/methods-reference.md §3). Plain transformers has no
    such scale, so the export is ropekit-only.

    Composition: ABF's rule, and ``c`` defaults to the effective window.
    """

    name = "entropy_abf"
    title = "Entropy-aware ABF"
    summary = "ABF plus logit scale max(log_c i, 1) on layers ≥ 2 to keep attention entropy stable."
    reference = "Zhang et al. 2024, arXiv 2401.07004 (Entropy-ABF) §3.2"
    params = (
        NEW_BASE,
        Param("scale_context", int, original_window, "c in log_c i: the pretrained window", minimum=2),
        Param("skip_layers", list, (0.0, 1.0), "layers left unscaled (the paper: 0 and 1)"),
        DECLARED_FACTOR,
    )
    changes = ("frequencies", "logit_scale_per_position")
    composition = ABF.composition + "; logit scale with c = the effective window"

    def settings_line(self, info, params, requested=None):
        skip = set(params.get("skip_layers") or ())
        scaled = [i for i in range(info.num_layers) if i not in skip]
        where = f"layers {scaled[0]}–{scaled[-1]}" if len(scaled) > 1 else (f"layer {scaled[0]}" if scaled else "no layer")
        return f"b'={short_number(params['rope_theta'])}, logit×max(log_{params['scale_context']} i, 1) on {where}"

    def resolve(self, info, given):
        params = super().resolve(info, given)
        if given.get("skip_layers") is None:  # the paper's default, on models with fewer layers too
            params["skip_layers"] = [i for i in (0, 1) if i < info.num_layers]
            return params
        layers = []
        for v in params["skip_layers"]:
            if not math.isfinite(v) or float(v) != int(v) or not 0 <= int(v) < info.num_layers:
                raise InvalidParameterError(
                    f"entropy_abf: skip_layers entry {v:g} is not a layer index of this {info.num_layers}-layer model",
                    f"pass indices between 0 and {info.num_layers - 1}, e.g. --param skip_layers=0,1",
                )
            layers.append(int(v))
        params["skip_layers"] = sorted(set(layers))
        return params

    def attention(self, info, params):
        return AttentionSpec(logit_scale_context=params["scale_context"], skip_layers=frozenset(params["skip_layers"]))

    def transformers_rope(self, info, params):
        return None

    def gguf_rope(self, info, params):
        return None  # the logit scale has no GGUF key (the writer refuses the method for it)

    def exports_to(self, params=None):
        return []
