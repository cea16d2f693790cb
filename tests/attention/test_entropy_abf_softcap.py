"""Entropy-ABF on a model with an attention-logit softcap (Gemma 2): the scale t = max(log_c(m+1), 1) of query row
m acts inside the cap, ``cap·tanh(t·s/cap)`` with ``s`` the scaled dot product, on the full-attention layers the
method scales (docs/methods.md). The reference is an eager attention written out here, softcap and sliding window
included, on the same model with ABF alone."""

from __future__ import annotations

import math

import torch

import ropekit
from ropekit.models.tiny import build_tiny_model

CAP = 1.0
SHARPEN = 8.0  # q and k projections × 8: dot products of several units, so tanh saturates and the cap matters
CONTEXT = 16


def _model():
    model = build_tiny_model("gemma2", num_layers=4, attn_implementation="eager")
    model.config.attn_logit_softcapping = CAP
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.attn_logit_softcapping = CAP
            layer.self_attn.q_proj.weight.mul_(SHARPEN)
            layer.self_attn.k_proj.weight.mul_(SHARPEN)
    return model


def _written_out(scaled_layers: set[int], inside: bool):
    """Eager attention with the softcap, the sliding window and the logit scale of Entropy-ABF §3.2 written out."""

    def attention(module, query, key, value, attention_mask, scaling, softcap=None, sliding_window=None, **kwargs):
        q_len, k_len = query.shape[-2], key.shape[-2]
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        logits = (query.double() @ key.double().transpose(-1, -2)) * scaling
        pos = kwargs["position_ids"].to(torch.float64)
        t = torch.clamp(torch.log(pos + 1) / math.log(CONTEXT), min=1.0)[:, None, :, None]
        scaled = module.layer_idx in scaled_layers
        if scaled and inside:
            logits = logits * t
        logits = softcap * torch.tanh(logits / softcap)
        if scaled and not inside:
            logits = logits * t
        i = torch.arange(q_len)[:, None] + (k_len - q_len)
        j = torch.arange(k_len)[None, :]
        allowed = j <= i
        if sliding_window is not None:
            allowed &= i - j < sliding_window
        logits = logits.masked_fill(~allowed, float("-inf"))
        out = torch.softmax(logits, dim=-1) @ value.double()
        return out.to(query.dtype).transpose(1, 2).contiguous(), None

    return attention


def _reference(inside: bool):
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    model = _model()
    ropekit.extend(model, "abf", rope_theta=1e6)
    full = {i for i, kind in enumerate(model.config.layer_types) if kind == "full_attention"}
    name = f"test_entropy_softcap_{'inside' if inside else 'outside'}"
    AttentionInterface.register(name, _written_out(full - {0, 1}, inside))
    AttentionMaskInterface.register(name, eager_mask)
    model.set_attn_implementation(name)
    return model


def test_entropy_abf_scales_inside_the_softcap_on_the_full_layers(make_ids):
    model = _model()
    ropekit.extend(model, "entropy_abf", rope_theta=1e6, scale_context=CONTEXT)
    full = [i for i, kind in enumerate(model.config.layer_types) if kind == "full_attention"]
    assert full == [1, 3]  # layer 3 is scaled, layer 1 is skipped (the paper's layers 0 and 1)
    ids = make_ids(48)
    with torch.no_grad():
        ours = model(ids).logits
        inside, outside = _reference(True)(ids).logits, _reference(False)(ids).logits
    torch.testing.assert_close(ours, inside, rtol=1e-4, atol=1e-5)
    # the placement is measurable at this cap: the scale applied after the cap gives other logits
    assert (ours - outside).abs().max() > 1e-3
