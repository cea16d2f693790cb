"""Test helpers shared by the entropy tests: a tiny model with sharpened attention, and every layer's attention
matrix read back from the layer's own replacement attention (``ropekit_attend``) with one-hot values."""

from __future__ import annotations

import copy

import torch

from ropekit.attention.interface import attention_modules
from ropekit.models.tiny import build_tiny_model


def sharpened(family: str, gain: float = 6.0, **config):
    """A tiny model whose query/key projections are scaled up, so that attention is far from uniform
    (random init gives almost uniform attention, where a wrong logit barely moves the entropy)."""
    model = build_tiny_model(family, **config)
    with torch.no_grad():
        for module in attention_modules(model):
            for name in ("q_proj", "k_proj", "query_key_value", "qkv_proj"):
                if hasattr(module, name):
                    getattr(module, name).weight.mul_(gain)
    return model


def attend_probabilities(model, ids) -> torch.Tensor:
    """Reference for methods that replace the attention (no attention weights to output): each layer's own
    ``ropekit_attend`` is run again on the queries/keys it received with one-hot values, so its output *is*
    its attention matrix. Runs a copy of ``model`` once; returns ``(layers, heads, rows, keys)`` in float64
    (rows include any tokens the method inserts, e.g. Landmark's)."""
    ref = copy.deepcopy(model)
    found = {}
    for module in attention_modules(ref):
        inner = module.ropekit_attend

        def recorder(mod, q, k, v, mask, *, _inner=inner, **kw):
            n, d = k.shape[2], v.shape[-1]
            blocks = []
            for start in range(0, n, d):
                cols = torch.arange(start, min(start + d, n))
                onehot = torch.zeros_like(v)
                onehot[:, :, cols, cols - start] = 1.0
                out, _ = _inner(mod, q, k, onehot, mask, **kw)
                blocks.append(out[..., : len(cols)])
            found[mod.layer_idx] = torch.cat(blocks, dim=-1).transpose(1, 2)[0]  # (heads, rows, keys)
            return _inner(mod, q, k, v, mask, **kw)

        module.ropekit_attend = recorder
    with torch.no_grad():
        ref(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return torch.stack([found[i] for i in sorted(found)]).double()


def entropy_of(p: torch.Tensor) -> torch.Tensor:
    """``−Σ p ln p`` over the last dimension, with ``0 ln 0 = 0``."""
    p = p.clamp_min(0)
    return -(p * torch.log(torch.where(p > 0, p, torch.ones_like(p)))).sum(-1)
