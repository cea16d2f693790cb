"""LongLoRA's shifted sparse attention, S²-Attn (Chen et al. 2024, ICLR; summarised in LCEG (Lu et al. 2024) §3) — without wrap-around.

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
runs unchanged. Padding / packed-sequence masks from transformers, in any kernel's format
(:class:`~ropekit.attention.masks.AttentionMask`), are respected inside each group.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..attention.interface import PairLogits, plain_pair_logits
from ..attention.kernels import pair_scores
from ..attention.masks import AttentionMask


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

    @staticmethod
    def _active(module, query, key) -> bool:
        """Whether the S²-Attn pattern applies: training mode and no cached keys."""
        length = query.shape[2]
        return bool(getattr(module, "training", False)) and key.shape[2] == length and length >= 2

    def __call__(self, module, query, key, value, attention_mask, *, scaling=None, dropout=0.0, kernel, **kwargs):
        _, heads, length, dim = query.shape
        if not self._active(module, query, key):
            return kernel(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        size = group_size(length, self.group_size_ratio)
        mask = AttentionMask.for_call(attention_mask, query, key, kwargs)
        g = heads // key.shape[1]
        split = heads // 2
        scale = scaling if scaling is not None else 1.0 / math.sqrt(dim)
        pieces = []
        for start, stop, shifted in ((0, split, False), (split, heads, True)):
            lead = size // 2 if shifted else size  # tokens in the first group
            for h0, h1, k0, k1 in _kv_runs(start, stop, g):  # query heads [h0, h1) use KV heads [k0, k1)
                pieces.append(_grouped(query[:, h0:h1], key[:, k0:k1], value[:, k0:k1], mask, size, lead, scale,
                                       dropout))
        out = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]
        return out.transpose(1, 2).contiguous(), None

    def pair_logits(self, module, query, key, attention_mask, *, scaling=None, rows, **kwargs) -> PairLogits:
        """S²-Attn pair by pair (:class:`~ropekit.attention.interface.PairRule`): in training mode query
        head ``h`` keeps the keys of its own group — ``⌊t/g⌋`` for ``h < H//2``, ``⌊(t + g − ⌊g/2⌋)/g⌋`` for
        the shifted heads (:func:`group_ids`) — that the mask allows; logits are the plain ``scale · q·k``.
        Otherwise (eval mode, cached keys) plain attention."""
        if not self._active(module, query, key):
            return plain_pair_logits(query, key, attention_mask, scaling=scaling, rows=rows, **kwargs)
        heads, length = query.shape[1], query.shape[2]
        mask = AttentionMask.for_call(attention_mask, query, key, kwargs)
        size = group_size(length, self.group_size_ratio)
        plain_ids = group_ids(length, size, shifted=False, device=query.device)
        shifted_ids = group_ids(length, size, shifted=True, device=query.device)
        rows = rows.to(query.device)
        same_plain = plain_ids[rows][:, None] == plain_ids[None, :]  # (R, Lk)
        same_shifted = shifted_ids[rows][:, None] == shifted_ids[None, :]
        shifted_head = (torch.arange(heads, device=query.device) >= heads // 2)[:, None, None]
        same_group = torch.where(shifted_head, same_shifted, same_plain)[None]  # (1, H, R, Lk)
        scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        return PairLogits(pair_scores(query[:, :, rows], key) * scale, mask.rows(rows) & same_group)


def _kv_runs(start: int, stop: int, g: int) -> list[tuple[int, int, int, int]]:
    """Query heads ``[start, stop)`` cut into runs ``(h0, h1, k0, k1)`` whose query heads use exactly the KV heads
    ``[k0, k1)`` (query head ``h`` uses KV head ``h // g``), each KV head serving the same number of them: a
    partial group at either end is a run of its own. Keys and values are sliced, never copied per query head."""
    runs = []
    h = start
    while h < stop:
        if h % g or stop - h < g:  # a partial group: the heads of one KV head
            end = min(stop, (h // g + 1) * g)
        else:  # whole groups
            end = stop - (stop - h) % g
        runs.append((h, end, h // g, (end - 1) // g + 1))
        h = end
    return runs


def _group_masks(mask: AttentionMask, n_groups: int, size: int, front: int, length: int) -> torch.Tensor:
    """The mask's diagonal blocks, one per group: bool (B|1, groups, size, size), False for the dummies.

    Group ``p`` holds the tokens ``[p·size − front, (p+1)·size − front)`` clipped to ``[0, length)``; only
    these ``groups × size²`` pairs are read, never the whole ``length²`` mask.
    """
    out = torch.zeros(mask.batch, n_groups, size, size, dtype=torch.bool, device=mask.device)
    for p in range(n_groups):
        lo, hi = max(0, p * size - front), min(length, (p + 1) * size - front)
        if hi > lo:
            at = lo - (p * size - front)  # first real slot of the group
            out[:, p, at:at + hi - lo, at:at + hi - lo] = mask.block(lo, hi, lo, hi)[:, 0]
    return out


def _grouped(q, k, v, mask: AttentionMask, size: int, lead: int, scale: float, dropout: float) -> torch.Tensor:
    """Causal attention within groups of ``size`` tokens, the first group holding ``lead`` tokens.

    The sequence is padded with ``size − lead`` dummies in front and to a multiple of ``size`` at the end,
    viewed as (B, groups, h, size, d), attended with a per-group mask that hides the dummies, and cut back.
    Grouped-query heads (``q`` with ``m`` heads per KV head of ``k``/``v``) are folded into rows of their KV
    head's blocks, ``(B, groups, h_kv, m·size, d)``, so keys and values are never copied per query head.
    """
    batch, heads, length, dim = q.shape
    kv_heads = k.shape[1]
    m = heads // kv_heads
    front = size - lead
    n_groups = -(-(length + front) // size)
    back = n_groups * size - length - front

    def blocks(x):
        h = x.shape[1]
        return F.pad(x, (0, 0, front, back)).view(batch, h, n_groups, size, dim).transpose(1, 2)

    token = torch.arange(n_groups * size, device=q.device).view(n_groups, size) - front
    real = (token >= 0) & (token < length)
    causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    allowed = (causal[None] & real[:, None, :])[None]  # (1, groups, size, size): query row, key column
    if not mask.is_causal:
        allowed = allowed & _group_masks(mask, n_groups, size, front, length)
    # A row that sees nothing (a dummy, or a padding query) attends to itself: no NaN, and it is discarded.
    eye = torch.eye(size, dtype=torch.bool, device=q.device)
    allowed = allowed | (eye & ~allowed.any(dim=-1, keepdim=True))
    q_blocks = blocks(q).reshape(batch, n_groups, kv_heads, m * size, dim)  # query head h = k·m + i → KV head k
    rows_allowed = allowed[:, :, None, None].expand(allowed.shape[0], n_groups, 1, m, size, size)
    out = F.scaled_dot_product_attention(
        q_blocks, blocks(k), blocks(v), attn_mask=rows_allowed.reshape(allowed.shape[0], n_groups, 1, m * size, size),
        dropout_p=dropout, scale=scale,
    )  # (B, groups, h_kv, m·size, d)
    out = out.reshape(batch, n_groups, heads, size, dim).transpose(1, 2).reshape(batch, heads, n_groups * size, dim)
    return out[:, :, front:front + length]


def make_s2_attn(info, inv_freq: Callable[[], torch.Tensor], layer_idx: int, *,
                 group_size_ratio: float = 0.25) -> ShiftedSparseAttention:
    """Layer-attention factory for S²-Attn, named by LongLoRA's :class:`AttentionSpec`."""
    return ShiftedSparseAttention(group_size_ratio)

