"""LongRoPE's per-pair rescale factors as a ropekit method (transformers' ``longrope`` rope type), with the
paper's un-interpolated start tokens."""

from __future__ import annotations

import math

from typing import Any

import torch

from ..core.base_rope import base_frequencies, length_dependence
from ..core.rope_info import RopeInfo
from ..errors import InvalidParameterError
from .base import ORIGINAL_WINDOW, ROPE_THETA, Method, Param, combine_length_dependence, register


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


class StartTokenRotary:
    """Forward hook of a rotary-embedding module: positions below ``n̂`` get the model's own cos/sin.

    LongRoPE (Ding et al. 2024, §3.2): the first ``n̂`` positions are not interpolated, ``I(λ_i, n̂) = 1`` for
    ``n < n̂`` and ``1/λ_i`` beyond, so position ``m < n̂`` rotates at ``m·θ^eff_i`` and ``m ≥ n̂`` at
    ``m·θ^eff_i/λ_i``. As in the authors' code (``MixedLongRoPEScaledRotaryEmbedding`` in microsoft/LongRoPE's
    ``rope/longrope.py``), those positions take the original embeddings whole: cos/sin of the model before the
    method, i.e. without LongRoPE's attention factor (with the model's own one, 1 for plain RoPE).

    The angles depend only on the absolute position, so a KV cache stays exact. Computed in the rotary module's
    standard form (``cos/sin`` of ``[m·θ, m·θ]`` times the factor, the capability check's ``standard`` output),
    with the same operations as transformers' rotary module, so those positions equal the plain model bit for bit.
    A module-level class (not a closure): ``copy.deepcopy`` of the model keeps a working hook.
    """

    def __init__(self, info: RopeInfo, start_tokens: int):
        self.info, self.start_tokens = info, int(start_tokens)
        self.switches = length_dependence(info)[0] == "switch"  # a LongRoPE base: its own set follows the length

    def original(self, position_ids: torch.Tensor, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's own ``(cos, sin)`` at ``position_ids`` (before any method)."""
        seq_len = int(position_ids.max()) + 1 if self.switches else None
        inv_freq, factor = base_frequencies(self.info, seq_len, device)
        freqs = position_ids[..., None].float() * inv_freq.to(device=device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * factor).to(dtype), (emb.sin() * factor).to(dtype)

    def __call__(self, module, args, kwargs, output):
        position_ids = args[1] if len(args) > 1 else kwargs["position_ids"]
        below = position_ids < self.start_tokens
        if not bool(below.any()):
            return None  # e.g. cached decoding past n̂: nothing to replace
        cos, sin = output
        original_cos, original_sin = self.original(position_ids, cos.device, cos.dtype)
        mask = below[..., None].to(cos.device)
        return torch.where(mask, original_cos, cos), torch.where(mask, original_sin, sin)


@register
class LongRoPE(Method):
    """LongRoPE (Ding et al. 2024, arXiv 2402.13753; transformers' ``longrope``; Phi-3/3.5/4-mini).

    One rescale factor per rotary pair: ``θ'_i = θ_i / λ_i`` with ``λ = short_factor`` for inputs up to
    ``original_max_position_embeddings`` tokens and ``λ = long_factor`` beyond (transformers switches on the
    input length; its KV cache then holds keys of the other set, the known Phi-3 behaviour). cos/sin are
    multiplied by ``attention_factor``, default ``√(1 + ln s / ln C)`` with ``s = factor``, at every input length:
    inside the original window too, as transformers' ``_compute_longrope_parameters`` and Phi-3 apply it. The factors
    usually come from LongRoPE's evolutionary search; ``short_factor`` defaults to all ones, so inside the window the
    frequencies are the model's own while cos/sin still carry the attention factor (not the model's own RoPE unless
    ``attention_factor=1``).

    ``factor`` is the extension ratio ``s = L'/L`` (target length over original window): transformers'
    ``_compute_longrope_parameters`` takes ``factor``, or without it ``max_position_embeddings /
    original_max_position_embeddings``, and microsoft/LongRoPE's ``rope/longrope.py`` computes its ``mscale`` from
    that same ratio. It sets the default attention factor and the declared window. The rescale factors do not
    determine it — LongRoPE's search space reaches ``1.25·s`` (Table 1), and Phi-3.5-mini's shipped ``long_factor``
    ends above 50 at s = 32 — so it is required: ``factor`` or ``target_length`` (an evaluation or a study given
    neither sizes it to its own target length).

    ``start_tokens`` = ``n̂`` (LongRoPE §3.2, ``I(λ_i, n̂)``): positions ``m < n̂`` keep the model's own rotation
    ``m·θ_i`` (and cos/sin, without the attention factor, as the authors' code does), positions ``m ≥ n̂`` rotate
    at ``m·θ_i/λ_i`` — with whichever set (short or long) the input length selects (:class:`StartTokenRotary`).
    The rotation then depends on the position, not only on the pair, so no per-pair format holds it:
    ``n̂ > 0`` exports only as rope type ``ropekit_longrope``; ``n̂ = 0`` (default) is transformers' ``longrope``.

    Composition: ``θ'_i = θ^eff_i / λ_i`` on the effective frequencies; attention factors multiply.
    """

    name = "longrope"
    title = "LongRoPE factors"
    summary = "One rescale factor per rotary pair (short/long sets), as Phi-3 ships it; from LongRoPE's search."
    reference = "Ding et al. 2024, arXiv 2402.13753 (LongRoPE); transformers rope_type 'longrope'"
    params = (
        Param("long_factor", list, None, "λ_i for inputs longer than the original window: one value ≥ 1 per rotary pair"),
        Param("short_factor", list, None, "λ_i for inputs up to the original window (default: all 1, the model's "
              "own frequencies; cos/sin still × the attention factor)"),
        Param("factor", float, None, "s = target / original window (required; or target_length): sets the default "
              "attention factor and the extended window", minimum=1.0),
        Param("attention_factor", float, None, "cos/sin multiplier; default √(1 + ln s / ln C)", minimum=0,
              exclusive_minimum=True),
        ORIGINAL_WINDOW,
        ROPE_THETA,
        Param("start_tokens", int, 0, "n̂: the first n̂ positions keep the model's own RoPE, un-interpolated "
              "(LongRoPE §3.2); 0 = every position rescaled (transformers' longrope)", minimum=0),
    )
    changes = ("frequencies", "length_dependent", "attention_factor")
    needs_training = False
    composition = "θ'_i = θ^eff_i / λ_i (short set up to the original window, long beyond); attention factors multiply"

    family = "YaRN & LongRoPE"

    def sized_by_target(self, params):
        # the rescale factors do not say s (searched ones reach 1.25·s): a target given to an evaluation or a study
        # sets it; extend() with neither factor nor target_length is refused in resolve()
        return "factor" not in params and "target_length" not in params

    def demo_params(self, info, factor):
        """NTK's per-pair factors ``λ_i = s^(2i/(d−2))``, where LongRoPE's search starts."""
        d = info.rotary_dim
        return {"long_factor": [factor ** (2 * i / (d - 2)) for i in range(d // 2)], "factor": factor}

    def settings_line(self, info, params, requested=None):
        s = params.get("factor", 1.0)
        return f"λ_i = {s:g}^(2i/(d−2)) (NTK's factors per pair), attn×{params['attention_factor']:.3f}"

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
            if any(not v > 0 for v in values):  # NaN-safe
                raise InvalidParameterError(f"longrope: every {key} value must be positive", "pass rescale factors ≥ 1")
        if params["factor"] is None:
            raise InvalidParameterError(
                "longrope: factor (s, the extension ratio target length / original window) is missing: it sets the "
                "attention factor √(1 + ln s / ln C) and the extended window, and the rescale factors do not determine "
                "it (searched ones reach 1.25·s)",
                "pass factor=s or target_length=N (on the command line --factor or --target-length, or --param factor=s)")
        if params["attention_factor"] is None:
            params["attention_factor"] = longrope_attention_factor(params["factor"], params["original_max_position_embeddings"])
        if params["start_tokens"] and length_dependence(info)[0] == "continuous":
            raise InvalidParameterError(
                f"longrope: start_tokens on a model whose own RoPE grows with the input length ('{info.rope_type}')",
                "leave start_tokens at 0 on this model")
        return params

    def position_dependent_rotation(self, params):
        n = int(params.get("start_tokens") or 0)
        if n == 0:
            return None
        return (f"its first n̂ = {n} positions rotate with the model's own frequencies and the rest with the "
                "rescaled ones (start_tokens), which one frequency per rotary pair cannot hold")

    def attach(self, rotary, info, params) -> None:
        """With ``start_tokens`` > 0, make the positions below n̂ take the model's own cos/sin (:class:`StartTokenRotary`)."""
        if int(params.get("start_tokens") or 0) > 0:
            rotary.register_forward_hook(StartTokenRotary(info, params["start_tokens"]), with_kwargs=True)

    def example_params(self, info):
        return {"long_factor": [2.0] * (info.rotary_dim // 2), "factor": 2.0}

    def length_dependence(self, info, params):
        own = (("static", None) if params["short_factor"] == params["long_factor"]
               else ("switch", params["original_max_position_embeddings"]))
        return combine_length_dependence(super().length_dependence(info, params), own)

    def max_position_embeddings(self, info, params):
        if info.is_scaled:
            # λ divides the base's effective frequencies (composition), so s extends the base's own window; the
            # original window here is only where the short and long sets switch (the base's, on a LongRoPE base)
            return int(round(info.window * params["factor"]))
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
        if info.is_scaled or self.position_dependent_rotation(params):
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
        if params is not None and self.position_dependent_rotation(params):
            return []
        return ["transformers", "vllm"]
