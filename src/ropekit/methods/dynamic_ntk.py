"""Dynamic NTK: the NTK base recomputed from the input length (transformers' rule or LCEG's frozen variant)."""

from __future__ import annotations

from ..errors import InvalidParameterError
from ..core.rope import default_inv_freq, scale_pairs
from .ntk import ntk_base, ntk_ratio
from .base import FACTOR, ORIGINAL_WINDOW, ROPE_THETA, Method, Param, combine_length_dependence, register


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


def _trained_default(info):
    """the original window (transformers' rule)"""
    return info.window


@register
class DynamicNTK(Method):
    """Dynamic NTK (emozilla 2023; Fu et al. 2024 as used by LCEG §7.8).

    ``b' = b·(s·max(C', C_test)/C − (s − 1))^(d/(d−2))`` where ``C_test`` is the longest length seen so far
    (:func:`dynamic_ntk_alpha`).

    * ``trained_length`` = ``C`` (default): transformers' ``dynamic`` rule — plain RoPE inside the window,
      growing base beyond it. Exports to transformers' ``dynamic`` type.
    * ``trained_length`` = ``C' > C``: LCEG's NTK-32k/64k — the base is *frozen* at its ``C'`` value for
      every shorter input (training and inference), dynamic above ``C'`` (Tables 13–15; s = C'/(2C)).

    The model declares ``max_position_embeddings = C'`` because transformers' ``@dynamic_rope_update``
    recomputes frequencies only past it. Like transformers, keys already in the KV cache keep the rotation
    they were cached with when the base grows during generation (transformers #25104).

    Composition: the ratio ``α(L)`` from the effective window, applied per pair to the effective frequencies
    at the same length, ``θ'_i(L) = θ^eff_i(L) · α(L)^(−2i/(d−2))``.
    """

    name = "dynamic_ntk"
    title = "Dynamic NTK"
    summary = "NTK base recomputed from the input length; optionally frozen below a trained length (LCEG)."
    reference = "emozilla 2023; Fu et al. 2024; LCEG (Lu et al. 2024, arXiv 2409.12181) §7.8, Tables 13–15"
    params = (
        FACTOR,
        ORIGINAL_WINDOW,
        Param(
            "trained_length",
            int,
            _trained_default,
            "C': base frozen at its C' value for shorter inputs (the fine-tuning length); C = transformers' rule",
            minimum=2,
        ),
        ROPE_THETA,
    )
    changes = ("frequencies", "length_dependent")
    schedules_itself = True
    composition = "θ'_i(L) = θ^eff_i(L) · α(L)^(−2i/(d−2)), α(L) from the effective window"

    family = "NTK & base frequency"

    def settings_line(self, info, params, requested=None):
        s = params.get("factor", 1.0)
        return f"s={s:g}, base grows past {params['trained_length']} tokens" if s > 1 else f"s={s:g}"

    def check(self, info, params):
        if params["trained_length"] < params["original_max_position_embeddings"]:
            raise InvalidParameterError(
                f"dynamic_ntk: trained_length {params['trained_length']} is below the original window "
                f"{params['original_max_position_embeddings']}",
                "pass trained_length ≥ the original window (or leave it unset for transformers' rule)",
            )

    def length_dependence(self, info, params):
        own = ("continuous", params["trained_length"]) if params["factor"] > 1.0 else ("static", None)
        return combine_length_dependence(super().length_dependence(info, params), own)

    def inv_freq(self, info, params, seq_len=None, device=None):
        trained = params["trained_length"]
        length = trained if seq_len is None else max(int(seq_len), trained)
        if info.is_scaled:
            base, attention_factor = self.base(info, seq_len, device)
            if params["factor"] == 1.0:
                return base, attention_factor
            alpha = dynamic_ntk_alpha(params["factor"], length, params["original_max_position_embeddings"], trained)
            return scale_pairs(base, ntk_ratio(info.rotary_dim, alpha, device)), attention_factor
        if params["factor"] == 1.0:
            return default_inv_freq(params["rope_theta"], info.rotary_dim, device), 1.0
        base = dynamic_ntk_base(
            params["rope_theta"],
            info.rotary_dim,
            params["factor"],
            length,
            params["original_max_position_embeddings"],
            trained,
        )
        return default_inv_freq(base, info.rotary_dim, device), 1.0

    def max_position_embeddings(self, info, params):
        return params["trained_length"]

    def _is_transformers_rule(self, params) -> bool:
        return params["trained_length"] == params["original_max_position_embeddings"]

    def transformers_rope(self, info, params):
        if info.is_scaled or not self._is_transformers_rule(params):
            return None
        return {"rope_type": "dynamic", "factor": params["factor"], "rope_theta": params["rope_theta"]}

    def exports_to(self, params=None):
        if params is not None and not self._is_transformers_rule(params):
            return []
        return ["transformers"]
