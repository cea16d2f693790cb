"""LongLoRA: Position Interpolation plus shifted sparse attention (S²-Attn) during fine-tuning."""

from __future__ import annotations

from .longlora_attention import make_s2_attn
from .base import FACTOR, ROPE_THETA, AttentionSpec, Param, register
from .pi import PositionInterpolation

#: LongLoRA's fine-tuning recipe (Chen et al. 2024 §3–4; docs/methods-reference.md §6), for the training code to use.
LORA_RANK = 8
LORA_ALPHA = 16
LORA_DROPOUT = 0.0
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
TRAINABLE_EXTRAS = ("embed", "norm")  # "LoRA+": embeddings and normalisation layers train fully
RECIPE = {
    "lora_rank": LORA_RANK,
    "lora_alpha": LORA_ALPHA,
    "lora_dropout": LORA_DROPOUT,
    "lora_targets": LORA_TARGETS,
    "trainable": TRAINABLE_EXTRAS,
    "learning_rate": 2e-5,
    "schedule": "constant_with_warmup",
    "warmup_steps": 20,
    "steps": 1000,
    "data": "RedPajama-1T-Sample",
    "group_size_ratio": 0.25,
}


@register
class LongLoRA(PositionInterpolation):
    """LongLoRA (Chen et al. 2024, ICLR, arXiv 2309.12307): PI frequencies + S²-Attn for training.

    * Frequencies: Position Interpolation, ``θ_i/s`` (positions ``m → m/s``; LCEG Eq. 8), with
      ``s = factor = target / C`` as in the recipe (the reference rounds it up, ``⌈L'/C⌉``) — the rule and its
      exports are :class:`~ropekit.methods.pi.PositionInterpolation`'s, inherited.
    * Attention during training: S²-Attn with group size ``g = ⌈n·group_size_ratio⌉`` (paper: n/4); half
      the query heads attend within groups ``[0, g), [g, 2g), …``, the other half within groups shifted by
      ``g/2`` — without the eager reference's roll wrap-around (:mod:`ropekit.methods.longlora_attention`).
    * Attention at inference (eval mode, or any cached step): full attention. S²-Attn is a training-time
      pattern only, so the exported model is a plain PI model: ``rope_type='linear'`` in transformers and
      vLLM; ``ropekit.load`` restores S²-Attn for further training.
    * Recipe (built by the training code, not here): LoRA ``r = 8``, ``α = 16``, dropout 0 on
      ``q/k/v/o_proj``, plus fully trainable embeddings and norms; lr 2e-5 constant with 20 warmup steps,
      1000 steps on RedPajama — see :data:`RECIPE`.

    Composition: PI's rule, ``θ'_i = θ^eff_i/s`` on the effective frequencies, the model's own attention factor
    kept; S²-Attn's groups are sized from the training length, not from the RoPE.
    """

    name = "longlora"
    title = "LongLoRA (PI + S²-Attn)"
    summary = "PI frequencies, trained with shifted sparse attention (S²-Attn) and LoRA; full attention at inference."
    reference = "Chen et al. 2024, ICLR, arXiv 2309.12307 (LongLoRA)"
    params = (
        FACTOR,
        Param("group_size_ratio", float, 0.25, "S²-Attn group size as a fraction of the training length",
              minimum=0.0, exclusive_minimum=True, maximum=1.0),
        ROPE_THETA,
    )
    changes = ("frequencies", "attention_pattern")
    attention_access = ("logits",)
    needs_training = True

    composition = "PI's rule: θ'_i = θ^eff_i / s; the model's attention factor kept"

    family = "PI & LongLoRA"

    def settings_line(self, info, params, requested=None):
        s = params.get("factor", 1.0)
        return f"s={s:g}; S²-Attn (groups of {params['group_size_ratio']:g}·n) in training only, so = PI here"

    @property
    def frequencies_only(self) -> bool:
        return True  # S²-Attn runs in training only: at inference LongLoRA is its frequencies

    def attention(self, info, params):
        return AttentionSpec(layer_attention=make_s2_attn,
                             layer_attention_args={"group_size_ratio": float(params["group_size_ratio"])})
