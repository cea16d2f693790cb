"""The naive per-pair reference every layer attention is compared with: its own rule
(``pair_logits``, :class:`ropekit.attention.interface.PairRule`) turned into weights over every query row,
in float64, times the values. Adding a method needs no new reference here; each method's test module
checks the rule itself against the paper's formula written out by hand."""

from __future__ import annotations

import math

import torch


def rule_weights(attend, module, query, key, attention_mask, *, scaling, **kwargs) -> torch.Tensor:
    """(B, H, Lq, Lk) float64 attention weights stated by ``attend.pair_logits`` for every query row:
    ``exp(s − Z)`` over the kept keys, ``Z`` the log-sum-exp of the kept logits unless the rule gives it."""
    rows = torch.arange(query.shape[2])
    logits, kept, norm = attend.pair_logits(module, query, key, attention_mask, scaling=scaling, rows=rows, **kwargs)
    logits = logits.double()
    kept = kept.expand_as(logits)
    s = logits.masked_fill(~kept, float("-inf"))
    norm = torch.logsumexp(s, dim=-1) if norm is None else norm.double()
    return torch.exp(s - norm.masked_fill(torch.isinf(norm), 0.0)[..., None]).masked_fill(~kept, 0.0)


def rule_attention(attend, module, query, key, value, attention_mask, *, scaling, **kwargs) -> torch.Tensor:
    """(B, Lq, H, D) float64: the rule's weights times the values (query head ``h`` uses KV head ``h // g``)."""
    weights = rule_weights(attend, module, query, key, attention_mask, scaling=scaling, **kwargs)
    v = value.double().repeat_interleave(query.shape[1] // value.shape[1], dim=1)
    return (weights @ v).transpose(1, 2)


def turn(x: list[float], p: float, theta: list[float]) -> list[float]:
    """RoPE of one vector at position ``p`` (half-split layout), with Python floats."""
    half = len(theta)
    out = list(x)
    for f, t in enumerate(theta):
        c, s = math.cos(p * t), math.sin(p * t)
        out[f], out[f + half] = x[f] * c - x[f + half] * s, x[f + half] * c + x[f] * s
    return out
