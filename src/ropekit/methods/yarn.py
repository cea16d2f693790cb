"""YaRN: NTK-by-parts frequencies plus an attention temperature."""

from __future__ import annotations

import math

from ..core.softmax_scale import reads_softmax_scale_from_rope
from ..errors import InvalidParameterError
from .base import FACTOR, LLAMACPP_YARN_BETAS, ORIGINAL_WINDOW, ROPE_THETA, GGUFKeys, Param, register
from .ntk_by_parts import BETA_FAST, BETA_SLOW, BLEND, TRUNCATE, _ByParts, ramp_param


def yarn_mscale(factor: float) -> float:
    """YaRN's attention factor ``√(1/t) = 0.1·ln s + 1`` (YaRN §3.4's recommended temperature; 1 when s ≤ 1).

    It multiplies cos and sin, so the attention logits are scaled by its square.
    """
    if factor <= 1:
        return 1.0
    return 0.1 * math.log(factor) + 1.0


def deepseek_mscale(factor: float, mscale: float) -> float:
    """DeepSeek-V2's ``0.1·m·ln s + 1`` (1 when s ≤ 1): YaRN's temperature with a multiplier ``m``."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@register
class YaRN(_ByParts):
    """YaRN (Peng et al. 2023): NTK-by-parts + temperature.

    Frequencies: ``θ'_i = (1 − γ_i)·θ_i/s + γ_i·θ_i`` (LCEG Eq. 10 without ``√T``), γ linear in the pair
    index between the correction dimensions of β_fast and β_slow (``ramp='dim'``, the reference code and
    transformers); ``blend='wavelength'`` mixes wavelengths instead (the PoSE authors' revision).
    Temperature: cos and sin are multiplied by ``attention_factor``, default ``0.1·ln s + 1`` (YaRN §3.4's recommended temperature),
    so logits scale by its square. The ramp uses ``original_max_position_embeddings`` and the model's own
    ``rope_theta`` (jquesnelle/yarn's Llama code silently used 10000; docs/methods-reference.md §2).

    DeepSeek-V2/V3's keys: with ``mscale`` and ``mscale_all_dim`` both set (and no ``attention_factor``), the
    attention factor is ``(0.1·mscale·ln s + 1)/(0.1·mscale_all_dim·ln s + 1)`` — transformers' rule. On the families
    whose attention also multiplies its softmax scale by ``(0.1·mscale_all_dim·ln s + 1)²`` (DeepSeek's
    ``yarn_apply_mscale``, applied when the model is built) ``mscale_all_dim`` is refused: an installed method
    cannot change that scale.
    ``truncate=false`` (gpt-oss) keeps the ramp's end dimensions fractional.

    Composition: NTK-by-parts' rule on the effective frequencies — γ from ``r_i = C/λ^eff_i`` with ``C`` the
    effective window (with ``ramp='dim'`` the ramp's end pairs are where ``r`` crosses β_fast and β_slow, YaRN's
    closed form on plain RoPE), ``θ'_i = (1 − γ_i)·θ^eff_i/s + γ_i·θ^eff_i`` — and the temperature multiplies
    the model's own attention factor (a Qwen ``yarn`` base's 0.1·ln s₀ + 1 times this one's 0.1·ln s + 1).
    """

    name = "yarn"
    title = "YaRN"
    summary = "NTK-by-parts frequencies plus attention temperature 0.1·ln s + 1; strong with little fine-tuning."
    reference = "Peng et al. 2023, arXiv 2309.00071; LCEG (Lu et al. 2024, arXiv 2409.12181) Eq. 10"
    params = (
        FACTOR,
        ORIGINAL_WINDOW,
        BETA_FAST,
        BETA_SLOW,
        Param("attention_factor", float, None, "cos/sin multiplier (logits × its square); default 0.1·ln s + 1", minimum=0, exclusive_minimum=True),
        Param("mscale", float, None, "DeepSeek: temperature multiplier m in 0.1·m·ln s + 1 (with mscale_all_dim)", minimum=0),
        Param("mscale_all_dim", float, None, "DeepSeek: the divisor's multiplier (attention factor = mscale term / this term)",
              minimum=0),
        BLEND,
        ramp_param("dim"),
        TRUNCATE,
        ROPE_THETA,
    )
    changes = ("frequencies", "attention_factor")

    family = "YaRN & LongRoPE"

    def demo_params(self, info, factor):
        """NTK-by-parts' demo ramp (β = 4, α = 1: the papers' β = 32 would interpolate every pair of a 64-token
        model)."""
        return {"factor": factor, "beta_fast": 4.0, "beta_slow": 1.0}

    def settings_line(self, info, params, requested=None):
        s = params.get("factor", 1.0)
        return (
            f"s={s:g}, β={params['beta_fast']:g}, α={params['beta_slow']:g} ({params['ramp']} ramp), "
            f"attn×{params['attention_factor']:.3f}"
        )

    def check(self, info, params):
        super().check(info, params)
        if params["mscale_all_dim"] and reads_softmax_scale_from_rope(info.model_type):
            # DeepSeek's attention multiplies its softmax scale by (0.1·mscale_all_dim·ln s + 1)², read from
            # rope_parameters when the model is built; an installed method changes the rotary embedding only
            raise InvalidParameterError(
                f"{self.name}: on model type '{info.model_type}' mscale_all_dim also scales the attention softmax, "
                "which is fixed when the model is built and an installed method does not change",
                "leave mscale and mscale_all_dim out (pass attention_factor for the rotary magnitude), or build the "
                "model from a config whose rope_parameters hold that yarn")

    def resolve(self, info, given):
        params = super().resolve(info, given)
        if params["attention_factor"] is None:
            if params["mscale"] and params["mscale_all_dim"]:
                params["attention_factor"] = (deepseek_mscale(params["factor"], params["mscale"])
                                              / deepseek_mscale(params["factor"], params["mscale_all_dim"]))
            else:
                params["attention_factor"] = yarn_mscale(params["factor"])
        return params

    def inv_freq(self, info, params, seq_len=None, device=None):
        inv_freq, model_factor = self.scaled_inv_freq(info, params, seq_len, device)
        return inv_freq, model_factor * float(params["attention_factor"])

    def transformers_rope(self, info, params):
        rope = self._transformers_yarn(info, params, attention_factor=params["attention_factor"])
        if rope is not None:
            rope.update({k: params[k] for k in ("mscale", "mscale_all_dim") if params[k] is not None})
        return rope

    def exports_to(self, params=None):
        if params is None:
            return ["transformers", "vllm"]
        if not self._matches_transformers_yarn(params):
            return []
        # vLLM's yarn reads truncate, and another magnitude reaches it as attention_factor (0.32) and attn_factor
        # (releases before): ropekit.install.vllm's plan passes both, so every transformers yarn serves exactly
        return ["transformers", "vllm"]

    def gguf_rope(self, info, params):
        # llama.cpp's `yarn` is the dim ramp with frequency blending and truncated ends, with its own betas
        if (params.get("factor", 1.0) > 1.0 and params.get("ramp") == "dim" and params.get("blend") == "frequency"
                and params.get("truncate")
                and (params.get("beta_fast"), params.get("beta_slow")) == LLAMACPP_YARN_BETAS):
            return GGUFKeys("yarn", float(params["rope_theta"]), factor=float(params["factor"]),
                            original_context_length=int(params["original_max_position_embeddings"]))
        return None
