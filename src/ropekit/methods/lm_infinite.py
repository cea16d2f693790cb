"""LM-Infinite: Λ-shaped attention with a distance ceiling, training-free length generalisation."""

from __future__ import annotations

from .lm_infinite_attention import make_lm_infinite
from .abf import DECLARED_FACTOR
from ..errors import InvalidParameterError
from .base import AttentionSpec, Method, Param, original_window, register


@register
class LMInfinite(Method):
    """LM-Infinite (Han et al. 2024, NAACL; LCEG (Lu et al. 2024) §3): a Λ-shaped mask plus a distance ceiling.

    For query position ``i`` and key position ``j ≤ i``, with ``G = global_tokens`` and
    ``L = local_window``:

    * ``i − j < L``: the ordinary RoPE logit ``⟨R_i q, R_j k⟩``;
    * else if ``j < G``: the logit at relative distance clamped to ``L``, ``⟨R_L q, R_0 k⟩`` (the paper's
      "distance ceiling": the query rotated to ``L`` against the unrotated key);
    * else: masked.

    Defaults are the paper's: ``G = 10`` starting tokens and ``L = C``, the pretrained window (Llama-2:
    local 4096, global 10, distance clamp 4096; docs/methods-reference.md §1 and §5). Frequencies stay the model's own RoPE; no
    training. ``factor`` / ``target_length`` only declare the extended window (``max_position_embeddings``).
    The attention runs in ropekit's attention function in O(n·(L + G)) time and memory
    (:mod:`ropekit.methods.lm_infinite_attention`); plain transformers has no such pattern, so the export is
    ropekit-only.

    Composition: the frequencies are the model's own scaled ones ``θ^eff`` (and its attention factor), and the
    distance ceiling re-rotates queries and keys with the same ``θ^eff`` at every length (on a switching
    LongRoPE base, the set of the current length); ``L`` defaults to the effective window.
    """

    name = "lm_infinite"
    title = "LM-Infinite"
    summary = "Λ-shaped attention: the first G tokens plus a local window of L, distances clamped to L; no training."
    reference = "Han et al. 2024, NAACL, arXiv 2308.16137 (LM-Infinite)"
    params = (
        Param("global_tokens", int, 10, "G: number of starting tokens every query keeps seeing", minimum=0),
        Param("local_window", int, original_window, "L_local: local window and distance ceiling", minimum=1),
        DECLARED_FACTOR,
    )
    changes = ("attention_pattern",)
    attention_access = ("rotates", "logits")
    needs_training = False
    composition = "frequencies kept (the model's scaled ones, which the attention rotates with); window = the effective window"
    uses_factor = False

    family = "Attention-side"

    def settings_line(self, info, params, requested=None):
        return f"{params['global_tokens']} global tokens + local window {params['local_window']}"

    def check(self, info, params):
        window = params["local_window"]
        if window > info.window:
            raise InvalidParameterError(
                f"lm_infinite: local_window {window} is beyond the model's window {info.window}, so the band and the "
                "distance ceiling would reach distances it was never trained on (the paper sets L = the pretrained window)",
                f"pass local_window ≤ {info.window}",
            )

    def inv_freq(self, info, params, seq_len=None, device=None):
        """The model's own frequencies: LM-Infinite changes only attention."""
        return self.base(info, seq_len, device)

    def attention(self, info, params):
        return AttentionSpec(
            layer_attention=make_lm_infinite,
            layer_attention_args={"local_window": int(params["local_window"]), "global_tokens": int(params["global_tokens"])},
        )

    def transformers_rope(self, info, params):
        return None

    def exports_to(self, params=None):
        return []
