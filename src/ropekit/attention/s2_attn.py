"""LongLoRA's shifted sparse attention, S²-Attn (Chen et al. 2024, ICLR; notes §7) — without wrap-around.

Training-time attention pattern for a sequence of ``n`` tokens with group size ``g = ⌈n·r⌉``
(``r = group_size_ratio``, the paper's 1/4) and half-group shift ``s = ⌊g/2⌋``:

* *unshifted* heads attend within the groups ``[0, g), [g, 2g), …``;
* *shifted* heads attend within ``[0, s), [s, s + g), [s + g, s + 2g), …``;
* causal inside every group; the last group of either kind may be shorter (see below).

Unlike the eager reference (``torch.roll`` by ``−g/2`` on half the heads, which puts the *last*
half-group into the same group as the first one, so that early tokens see the end of the sequence —
LongLoRA issues #15/#90), the first half-group of the shifted heads attends only within ``[0, s)`` and the
tail within its own partial group: no token ever sees a later token. This is the pattern of the
reference's flash-attention path (cu_seqlens offset by ``g/2``).

Lengths that ``g`` does not divide are allowed: the last group is partial. This equals padding the
sequence at its end to a multiple of ``g`` (the padding is after every real token, so causality keeps it
invisible) — ropekit pads internally instead of raising.

Heads: query heads ``h < H//2`` are unshifted and ``h ≥ H//2`` shifted — the reference's split
(``qkv[..., nheads//2:]`` after ``repeat_kv``). With grouped-query attention and an even number of KV heads
this is a split of whole KV groups (KV head ``k`` serves query heads ``k·H/H_kv …``, so all queries of a
KV head share one pattern). With one or an odd number of KV heads, the middle KV group serves both
patterns; that is harmless here because the shift is a mask on each query head's logits — keys and values
are never rolled, so a shared KV head needs no second, shifted copy.

The pattern applies only in training mode (``module.training``) and without cached keys (query length =
key length). At inference, and for any cached step, LongLoRA uses full attention: the model's own kernel
runs unchanged. Padding / packed-sequence masks from transformers are respected inside each group.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .kernels import expand_kv


def group_size(length: int, ratio: float) -> int:
    """``g = ⌈n·r⌉`` (at least 1): LongLoRA's ``group_size = q_len · group_size_ratio``."""
    return max(1, math.ceil(length * ratio - 1e-9))


def group_ids(length: int, size: int, shifted: bool, device=None) -> torch.Tensor:
    """The group of every token: ``⌊t/g⌋`` (unshifted) or ``⌊(t + g − s)/g⌋`` with ``s = ⌊g/2⌋`` (shifted)."""
    t = torch.arange(length, device=device)
    lead = size - size // 2 if shifted else 0
    return (t + lead) // size


class ShiftedSparseAttention:
    """One layer's S²-Attn; see the module docstring for the definition.

    Group attention is computed block-wise with ``torch.nn.functional.scaled_dot_product_attention`` on
    (batch, groups, heads, g, d) tensors, so cost and memory are O(n·g), never O(n²).
    """

    def __init__(self, group_size_ratio: float = 0.25):
        if not 0 < group_size_ratio <= 1:
            raise ValueError("group_size_ratio must be in (0, 1]")
        self.group_size_ratio = float(group_size_ratio)

    def __repr__(self) -> str:
        return f"ShiftedSparseAttention(group_size_ratio={self.group_size_ratio})"

    def __call__(self, module, query, key, value, attention_mask, *, scaling=None, dropout=0.0, kernel, **kwargs):
        _, heads, length, dim = query.shape
        if not getattr(module, "training", False) or key.shape[2] != length or length < 2:
            return kernel(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        size = group_size(length, self.group_size_ratio)
        mask = _bool_mask(attention_mask, length)
        key, value = expand_kv(key, heads), expand_kv(value, heads)
        split = heads // 2
        scale = scaling if scaling is not None else 1.0 / math.sqrt(dim)
        halves = []
        for sl, shifted in ((slice(0, split), False), (slice(split, heads), True)):
            if sl.stop > sl.start:
                lead = size // 2 if shifted else size  # tokens in the first group
                halves.append(_grouped(query[:, sl], key[:, sl], value[:, sl], mask, size, lead, scale, dropout))
        out = torch.cat(halves, dim=1) if len(halves) > 1 else halves[0]
        return out.transpose(1, 2).contiguous(), None


def _bool_mask(attention_mask, length: int):
    """transformers' mask as (B|1, 1, n, n) bool, ``True = may attend``; ``None`` = plain causal."""
    if attention_mask is None:
        return None
    if attention_mask.dim() == 2:  # flash kernels: (B, n) padding
        causal = torch.ones(length, length, dtype=torch.bool, device=attention_mask.device).tril()
        return causal[None, None] & attention_mask[:, None, None, -length:].bool()
    if attention_mask.dtype != torch.bool:  # eager: additive float mask
        attention_mask = attention_mask > torch.finfo(attention_mask.dtype).min / 2
    return attention_mask[..., -length:, :length]


def _grouped(q, k, v, mask, size: int, lead: int, scale: float, dropout: float) -> torch.Tensor:
    """Causal attention within groups of ``size`` tokens, the first group holding ``lead`` tokens.

    The sequence is padded with ``size − lead`` dummies in front and to a multiple of ``size`` at the end,
    viewed as (B, groups, h, size, d), attended with a per-group mask that hides the dummies, and cut back.
    """
    batch, heads, length, dim = q.shape
    front = size - lead
    n_groups = -(-(length + front) // size)
    back = n_groups * size - length - front

    def blocks(x):
        return F.pad(x, (0, 0, front, back)).view(batch, heads, n_groups, size, dim).transpose(1, 2)

    token = torch.arange(n_groups * size, device=q.device).view(n_groups, size) - front
    real = (token >= 0) & (token < length)
    causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    allowed = causal[None] & real[:, None, :]  # (groups, size, size): query row, key column
    if mask is not None:
        t = token.clamp(0, length - 1)
        allowed = allowed & mask[:, 0][:, t[:, :, None], t[:, None, :]]  # (B|1, groups, size, size)
    else:
        allowed = allowed[None]
    # A row that sees nothing (a dummy, or a padding query) attends to itself: no NaN, and it is discarded.
    eye = torch.eye(size, dtype=torch.bool, device=q.device)
    allowed = allowed | (eye & ~allowed.any(dim=-1, keepdim=True))
    out = F.scaled_dot_product_attention(
        blocks(q), blocks(k), blocks(v), attn_mask=allowed[:, :, None], dropout_p=dropout, scale=scale
    )  # (B, groups, h, size, d)
    out = out.transpose(1, 2).reshape(batch, heads, n_groups * size, dim)
    return out[:, :, front:front + length]


def make_s2_attn(info, inv_freq: Callable[[], torch.Tensor], layer_idx: int, *,
                 group_size_ratio: float = 0.25) -> ShiftedSparseAttention:
    """Layer-attention factory for S²-Attn, named by LongLoRA's :class:`AttentionSpec`."""
    return ShiftedSparseAttention(group_size_ratio)

