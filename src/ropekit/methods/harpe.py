"""HARPE: a different RoPE base for every attention head (per KV group on GQA models)."""

from __future__ import annotations

from ..errors import InvalidParameterError
from .ntk import ntk_base
from .base import AttentionSpec, Method, Param, register, short_number, two_digits
import torch

from .abf import DECLARED_FACTOR
from .harpe_search import peak_valley_search, uniform_bases


@register
class HARPE(Method):
    """Head-Adaptive RoPE (HARPE, Lian et al. 2025, §3): head ``h`` uses ``θ_{h,i} = b_h^(−2i/d)`` (Eq. 6–8).

    The bases come from one of three strategies:

    * ``explicit`` — the list in ``bases``;
    * ``uniform`` — ``b_h = b_min + h·(b_max − b_min)/(N − 1)`` (Eq. 9);
    * ``peak_valley`` — Algorithm 1 over the candidates ``b_min + i·stride`` (Eq. 10), see
      :mod:`ropekit.methods.harpe_search` for the reconstructed attention waveform. The waveform covers
      the target length (window × ``factor``: pass the factor or target length you train for) and keeps
      wavelengths of at least the pretrained window; a span in which ``b_min``'s waveform has no peak or valley
      (the default factor 1) is refused, since Algorithm 1 would have nothing to complement. The paper's text does not define the waveform
      exactly; the reconstruction matches 10 of its 32 published bases (docs/harpe.md).

    On grouped-query models the keys of a group are shared by its query heads, so a base can only differ
    between KV groups: ``N`` is the number of KV heads and query head ``h`` uses the base of group
    ``h // (heads / kv_heads)``. On MHA models ``N`` is the number of heads. The paper's settings are the
    defaults (b_min 1e6, b_max 5e6, stride 30k). Rotation happens in ropekit's attention function; the
    model's shared rotary embedding becomes the identity.

    Composition: none — refused on a model whose RoPE is already scaled (``llama3``, ``yarn``, ``longrope``, …):
    each head's ``b_h^(−2i/d)`` replaces plain RoPE's ``b^(−2i/d)``, and a scaled RoPE is not one base that a
    per-head base could stand in for without discarding its scaling. Use a frequency method (pi, ntk, yarn,
    llama3, abf), which applies to the effective frequencies.
    """

    name = "harpe"
    title = "HARPE (head-adaptive RoPE)"
    summary = "One RoPE base per attention head (per KV group), chosen by a peak-valley search; train single-stage."
    reference = "Lian et al. 2025, arXiv 2412.07171 (HARPE, COLING 2025) Eq. 6–10, Algorithm 1"
    params = (
        Param("strategy", str, "peak_valley", "how bases are chosen", choices=("peak_valley", "uniform", "explicit")),
        Param("bases", list, None, "explicit bases, one per KV group (strategy=explicit)"),
        Param("b_min", float, 1.0e6, "smallest base", minimum=1.0, exclusive_minimum=True),
        Param("b_max", float, 5.0e6, "largest base", minimum=1.0, exclusive_minimum=True),
        Param("stride", float, 3.0e4, "candidate spacing of the peak-valley search", minimum=0, exclusive_minimum=True),
        DECLARED_FACTOR,
    )
    changes = ("frequencies_per_head",)
    attention_access = ("rotates",)
    needs_training = True
    uses_factor = False
    composition = ("none: refused on an already-scaled RoPE (per-head bases replace plain RoPE's b^(−2i/d)); "
                   "use a frequency method, which applies to θ^eff")

    family = "NTK & base frequency"

    def demo_params(self, info, factor):
        """``uniform`` bases from the model's base ``b`` to the NTK-aware base for ``factor``, one per KV group (the
        paper's 1e6–5e6 is meant for 4k→128k)."""
        ntk = ntk_base(info.rope_theta, info.rotary_dim, factor) if factor > 1 else info.rope_theta
        return {"strategy": "uniform", "b_min": info.rope_theta, "b_max": two_digits(ntk), "factor": factor}

    def example_params(self, info):
        """Uniform bases for 2× the window: the peak-valley search's default grid (1e6–5e6, for 4k → 128k) finds no
        waveform to complement at 2× a small window and is refused there."""
        return self.demo_params(info, 2.0)

    def settings_line(self, info, params, requested=None):
        bases = " / ".join(short_number(b) for b in params.get("bases") or ())
        how = (requested or params).get("strategy")
        return f"per-head bases {bases}" + (f" ({how})" if how and how != "explicit" else "")

    def resolve(self, info, given):
        given = dict(given)
        if given.get("bases") is not None and given.get("strategy") is None:
            given["strategy"] = "explicit"
        params = super().resolve(info, given)
        n = info.num_kv_heads
        if params["strategy"] == "explicit":
            bases = params["bases"]
            if not bases:
                raise InvalidParameterError(
                    "harpe: strategy 'explicit' needs a list of bases", f"pass --param bases=b1,...,b{n}"
                )
            if len(bases) != n:
                what = "KV group" if info.num_kv_heads != info.num_heads else "head"
                raise InvalidParameterError(
                    f"harpe: {len(bases)} bases given but this model has {n} {what}s",
                    f"pass exactly {n} bases, one per {what}",
                )
            if any(not b > 1 for b in bases):  # NaN-safe
                raise InvalidParameterError("harpe: every base must be above 1", "pass bases such as 1e6,2e6")
            return params
        if params["b_max"] < params["b_min"]:
            raise InvalidParameterError(
                f"harpe: b_max ({params['b_max']:g}) is below b_min ({params['b_min']:g})", "swap them"
            )

        if params["strategy"] == "uniform":
            bases = uniform_bases(params["b_min"], params["b_max"], n)
        else:
            candidates = int((params["b_max"] - params["b_min"]) // params["stride"])
            if candidates + 1 < n:
                raise InvalidParameterError(
                    f"harpe: the search range holds {candidates + 1} candidate bases but {n} are needed",
                    "lower the stride or widen b_min..b_max",
                )
            # The waveform spans the target length and keeps wavelengths ≥ the pretrained window — the
            # paper's setting for Llama-2 (4k → 128k, factor 32); see docs/harpe.md.
            try:
                bases = peak_valley_search(
                    params["b_min"],
                    params["b_max"],
                    params["stride"],
                    n,
                    head_dim=info.rotary_dim,
                    max_distance=int(round(info.window * params["factor"])),
                    min_wavelength=float(info.window),
                )
            except ValueError as exc:
                raise InvalidParameterError(
                    f"harpe: the peak-valley search over window × factor = {info.window} × {params['factor']:g} "
                    f"tokens: {exc}",
                    "pass the factor you train for (--param factor=F; the paper's Llama-2 setting is 32, 4k → "
                    "128k), or strategy=uniform",
                ) from None
        # Table 2 assigns the searched bases to heads in ascending order.
        params["bases"] = sorted(float(b) for b in bases)
        return params

    def frozen_params(self, params):
        # The searched bases are stored; reloading must not re-run (or re-tune) the search.
        return {**params, "strategy": "explicit"}

    def inv_freq(self, info, params, seq_len=None, device=None):
        # Identity shared rotation (cos = 1, sin = 0): the per-head rotation is done in attention.
        return torch.zeros(info.rotary_dim // 2, device=device), 1.0

    def attention(self, info, params):
        return AttentionSpec(head_bases=list(params["bases"]))
