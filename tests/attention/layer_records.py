"""Helpers the layer-attention tests share: sharper query/key projections, so that positions visibly matter,
and a recorder of what each layer's ropekit attention receives and returns (the naive references' inputs)."""

from __future__ import annotations

import torch

from ropekit.attention.interface import attention_modules


def sharpen(model, k: float = 3.0) -> None:
    """Scale query/key projections so logits are O(1–10): positions then matter."""
    with torch.no_grad():
        for attn in attention_modules(model):
            if hasattr(attn, "query_key_value"):  # gpt_neox: fused (q, k, v) per head
                w = attn.query_key_value.weight.view(attn.config.num_attention_heads, 3, attn.head_size, -1)
                w[:, :2] *= k
            else:
                attn.q_proj.weight *= k
                attn.k_proj.weight *= k


def record_layers(model) -> dict[int, list[dict]]:
    """Wrap each layer's ropekit attention to record its q, k, v, output and scaling, call by call."""
    records: dict[int, list[dict]] = {}
    for attn in attention_modules(model):
        inner = attn.ropekit_attend

        def wrapped(module, query, key, value, attention_mask, *, inner=inner, **kw):
            out = inner(module, query, key, value, attention_mask, **kw)
            records.setdefault(module.layer_idx, []).append(
                {"q": query.detach().clone(), "k": key.detach().clone(), "v": value.detach().clone(),
                 "out": out[0].detach().clone(), "scaling": kw["scaling"]}
            )
            return out

        attn.ropekit_attend = wrapped
    return records
