"""Self-Extend attention (Jin et al. 2024, "LLM Maybe LongLM", arXiv 2401.01325; LCEG paper 002 Eq. 13).

A query at position ``i`` sees a key at position ``j ≤ i``

* at its true relative position ``i − j`` when ``i − j < W`` (the *neighbour* part), and
* otherwise at the grouped relative position ``(⌊i/G⌋ + W − ⌊W/G⌋) − ⌊j/G⌋`` (the *group* part):
  the query sits at ``⌊i/G⌋ + W − ⌊W/G⌋`` and the key at ``⌊j/G⌋``.

Floor division everywhere — the paper's definition. LongLM's transformers-4.38 code computed the group
query position with ``/`` (notes §5), which differs when ``G ∤ W``.

Queries and keys arrive already rotated at their true positions (keys include the KV cache). RoPE
rotations compose, so the group part only rotates them further by ``p_group − p_true`` (``rotate_by``);
the unrotated vectors are never needed. Both parts run through :func:`attention_with_lse` and are merged
exactly with :func:`merge_attention`; no n × n matrix is built. Queries are processed in chunks of
:data:`QUERY_CHUNK` rows, so memory is O(chunk × keys). When position distance equals index distance
(no padding, left/right padding, KV cache, chunked prefill) the split is structural and only O(n · chunk)
logits go through masks; otherwise every pair is decided from its positions (exact, slower).

Positions: queries use ``position_ids``; keys use :func:`~ropekit.attention.masks.key_positions` (the
queries' own positions without a cache, else the consecutive positions ending at the last query — what
``generate`` with a dynamic cache and chunked prefill produce). Keys of padding get meaningless positions
but are masked. Which pairs exist comes from :class:`~ropekit.attention.masks.AttentionMask` (every mask
format transformers passes: none, 2-D flash padding, 4-D bool, 4-D additive, flex ``BlockMask``). Static
caches (keys past the written slots) are not supported. Inference only: attention dropout is not applied.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from ..core.rope_info import RopeInfo
from ..core.rope import rotate
from .interface import PairLogits
from .kernels import attention_with_lse, expand_kv, merge_attention, pair_scores, rotate_by
from .masks import AttentionMask, query_key_positions

#: Query rows per chunk: memory is O(QUERY_CHUNK × keys) per head, masked work O(n × QUERY_CHUNK). 256 was the
#: fastest of 128–1024 for SmolLM2-like heads at 8k tokens on CPU.
QUERY_CHUNK = 256


def group_query_position(pos: torch.Tensor, group_size: int, window_size: int) -> torch.Tensor:
    """Self-Extend Eq. (LCEG Eq. 13): the grouped query position ``⌊i/G⌋ + W − ⌊W/G⌋`` (floor division)."""
    return torch.div(pos, group_size, rounding_mode="floor") + (window_size - window_size // group_size)


def group_key_position(pos: torch.Tensor, group_size: int) -> torch.Tensor:
    """Self-Extend Eq. (LCEG Eq. 13): the grouped key position ``⌊j/G⌋``."""
    return torch.div(pos, group_size, rounding_mode="floor")


def self_extend_reach(window: int, group_size: int, window_size: int) -> int:
    """The longest input Self-Extend keeps inside the pretrained window: ``(C − W)·G + W`` (LongLM README)."""
    return (window - window_size) * group_size + window_size


class SelfExtendAttention:
    """One layer's Self-Extend attention (LayerAttention protocol of :mod:`ropekit.attention.interface`).

    Implements the two-part attention of Jin et al. 2024 §3 / LCEG Eq. 13 exactly: logits of pairs with
    ``i − j < W`` use the true positions, the others the grouped positions; one softmax over both, computed
    as two restricted softmaxes merged by log-sum-exp. When no allowed pair in this call is ``W`` or more
    apart, the plain kernel runs instead (bit-identical to the unmodified model).
    """

    def __init__(
        self,
        inv_freq: Callable[[], torch.Tensor],
        group_size: int,
        window_size: int,
        reach: int | None = None,
        warn_past_reach: bool = False,
        chunk: int = QUERY_CHUNK,
    ):
        self.inv_freq = inv_freq
        self.group_size = int(group_size)
        self.window_size = int(window_size)
        self.reach = reach
        self.warn_past_reach = warn_past_reach
        self.chunk = int(chunk)
        self._warned = False
        self._key_table: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (inv_freq, cos, sin)

    def __repr__(self) -> str:
        return f"SelfExtendAttention(group_size={self.group_size}, window_size={self.window_size})"

    def _maybe_warn(self, q_pos: torch.Tensor) -> None:
        """Warn once (per installed model: only layer 0's instance warns) when an input runs past the reach."""
        if not self.warn_past_reach or self._warned or self.reach is None:
            return
        longest = int(q_pos.max().item()) + 1
        if longest > self.reach:
            self._warned = True
            warnings.warn(
                f"self_extend: input of {longest} tokens is past the reach {self.reach} = (C−W)·G+W of "
                f"group_size={self.group_size}, window_size={self.window_size}; "
                "re-extend with a larger group_size (or target_length) to cover it",
                stacklevel=2,
            )

    def __call__(self, module, query, key, value, attention_mask, *, scaling, dropout=0.0, kernel, **kwargs):
        """Self-Extend attention over rotated ``query`` (B, H, Lq, D) and ``key``/``value`` (B, H_kv, Lk, D).

        Returns ``(out (B, Lq, H, D), None)`` like transformers' kernels.
        """
        q_len = query.shape[2]
        k_len = key.shape[2]
        device = query.device
        q_pos, k_pos = query_key_positions(kwargs.get("position_ids"), q_len, k_len, device)  # (B|1, Lq), (B|1, Lk)
        self._maybe_warn(q_pos)

        mask = AttentionMask.for_call(attention_mask, query, key, kwargs)
        seen_keys = mask.seen_keys()  # (B|1, Lk): keys some query attends to
        active = mask.active_queries()  # (B|1, Lq): queries that attend to something
        big = torch.iinfo(torch.long).max
        oldest = torch.where(seen_keys, k_pos, big).min(dim=-1).values
        # Degenerate case (LCEG Eq. 13 with every allowed pair closer than W): plain attention, exactly.
        if bool((q_pos.max(dim=-1).values - oldest < self.window_size).all()):
            return kernel(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)

        # Fast path when position distance = index distance for every pair that matters (one offset per row
        # over the attended keys and attending queries: no padding, left/right padding, KV cache, chunked
        # prefill). Otherwise (e.g. position jumps) the exact general path decides every pair by position.
        shift_k = k_pos - torch.arange(k_len, device=device)
        shift_q = q_pos - torch.arange(k_len - q_len, k_len, device=device)
        lo_k = torch.where(seen_keys, shift_k, big).min(-1).values
        hi_k = torch.where(seen_keys, shift_k, -big).max(-1).values
        lo_q = torch.where(active, shift_q, big).min(-1).values
        hi_q = torch.where(active, shift_q, -big).max(-1).values
        consecutive = bool(((lo_k == hi_k) & (lo_q == hi_q) & (lo_k == lo_q)).all())
        if consecutive and q_len == 1:
            out = self._attend_decode(query, key, value, mask, q_pos, k_pos, scaling)
        else:
            attend = self._attend_banded if consecutive else self._attend_general
            out = attend(query, key, value, mask, q_pos, k_pos, scaling)
        return out.transpose(1, 2).contiguous(), None

    def pair_logits(self, module, query, key, attention_mask, *, scaling, rows, **kwargs) -> PairLogits:
        """LCEG Eq. 13 pair by pair (:class:`~ropekit.attention.interface.PairRule`): the logit of query ``i``
        and key ``j`` at their true positions when ``i − j < W``, else with the query at
        ``⌊i/G⌋ + W − ⌊W/G⌋`` and the key at ``⌊j/G⌋`` — reached by rotating the already-rotated vectors
        further (RoPE rotations compose); every pair the mask allows is kept."""
        G, W = self.group_size, self.window_size
        mask = AttentionMask.for_call(attention_mask, query, key, kwargs)
        q_pos, k_pos = query_key_positions(kwargs.get("position_ids"), query.shape[2], key.shape[2], query.device)
        inv_freq = self.inv_freq().to(query.device)
        qp = q_pos[:, rows]
        q = query[:, :, rows]
        q_group = rotate_by(q, group_query_position(qp, G, W) - qp, inv_freq)
        k_group = rotate_by(key, group_key_position(k_pos, G) - k_pos, inv_freq)
        near = (qp[:, :, None] - k_pos[:, None, :] < W)[:, None]
        scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        logits = torch.where(near, pair_scores(q, key), pair_scores(q_group, k_group)) * scale
        return PairLogits(logits, mask.rows(rows))

    def _group_rotated(self, query, key, value, q_pos, k_pos):
        """Queries moved to ``⌊i/G⌋ + W − ⌊W/G⌋`` and keys to ``⌊j/G⌋`` (LCEG Eq. 13) by extra rotations
        ``p_group − p_true``; keys and values expanded to the query heads (GQA) once."""
        G, W = self.group_size, self.window_size
        heads = query.shape[1]
        inv_freq = self.inv_freq().to(query.device)
        q_group = rotate_by(query, group_query_position(q_pos, G, W) - q_pos, inv_freq)
        k_group = self._rotate_keys_to_groups(key, k_pos, inv_freq)
        return q_group, expand_kv(key, heads), expand_kv(k_group, heads), expand_kv(value, heads)

    def _rotate_keys_to_groups(self, key, k_pos, inv_freq):
        """Keys rotated from ``j`` to ``⌊j/G⌋``: the same as ``rotate_by(key, ⌊j/G⌋ − j, inv_freq)``.

        The rotation of a key depends only on its position, so its cos/sin come from a table kept per layer
        (grown by doubling) instead of being recomputed for every cached key at every decoding step — the
        trigonometry was most of Self-Extend's per-token decoding cost.
        """
        if k_pos.numel() == 0 or int(k_pos.min()) < 0:
            return rotate_by(key, group_key_position(k_pos, self.group_size) - k_pos, inv_freq)
        need = int(k_pos.max()) + 1
        table = self._key_table
        if table is None or table[1].shape[0] < need or table[1].device != key.device or not torch.equal(table[0], inv_freq):
            size = max(need, 2 * table[1].shape[0] if table is not None else 1024)
            pos = torch.arange(size, device=key.device)
            offsets = (group_key_position(pos, self.group_size) - pos).to(torch.float32)
            freqs = offsets[:, None] * inv_freq.to(device=key.device, dtype=torch.float32)
            emb = torch.cat((freqs, freqs), dim=-1)
            table = self._key_table = (inv_freq.clone(), emb.cos(), emb.sin())
        cos = table[1][k_pos][:, None].to(key.dtype)  # (B or 1, 1, Lk, rot)
        sin = table[2][k_pos][:, None].to(key.dtype)
        return rotate(key, cos, sin)

    def _attend_decode(self, query, key, value, mask, q_pos, k_pos, scaling) -> torch.Tensor:
        """LCEG Eq. 13 for one new query per sequence (cached decoding), positions consecutive.

        The query (key index ``s = Lk − 1``) sees keys ``[0, s − W]`` in the group part and ``(s − W, s]`` in
        the neighbour part. Grouped-query heads are folded into rows — query head ``h`` uses KV head
        ``h // g`` — so keys and values are never copied per query head.
        """
        W = self.window_size
        batch, heads, _, dim = query.shape
        kv_heads, k_len = key.shape[1], key.shape[2]
        g = heads // kv_heads
        s = k_len - 1
        lo = max(0, s - W + 1)
        inv_freq = self.inv_freq().to(query.device)
        fold = lambda t: t.reshape(batch, kv_heads, g, dim)  # noqa: E731 - (B, H, 1, D) → (B, H_kv, g, D)

        def visible(k0, k1):
            if mask.is_causal:  # the one query is the last key: it sees them all
                return None
            ok = mask.block(0, 1, k0, k1)
            return None if bool(ok.all()) else ok

        parts = [attention_with_lse(fold(query), key[:, :, lo:], value[:, :, lo:], visible(lo, k_len), scale=scaling)]
        if lo > 0:
            q_group = rotate_by(query, group_query_position(q_pos, self.group_size, W) - q_pos, inv_freq)
            k_group = self._rotate_keys_to_groups(key[:, :, :lo], k_pos[:, :lo], inv_freq)
            parts.append(attention_with_lse(fold(q_group), k_group, value[:, :, :lo], visible(0, lo), scale=scaling))
        out = merge_attention(parts)[0] if len(parts) > 1 else parts[0][0]
        return out.reshape(batch, heads, 1, dim)

    def _attend_banded(self, query, key, value, mask, q_pos, k_pos, scaling) -> torch.Tensor:
        """LCEG Eq. 13 when position distance equals index distance, by structure instead of by pair.

        Query row ``r`` has key index ``R = r + off`` (``off = Lk − Lq``); its neighbours are the keys
        ``R − W < t ≤ R`` and its group keys ``t ≤ R − W``. For a chunk of rows ``[a, b)``, ``s = a + off``,
        ``e = b + off`` (``lo = s − W + 1``):

        * keys ``[0, lo)``: group keys of every row — group part, unmasked;
        * keys ``[lo, e − W)``: a c × c staircase, group keys below it and neighbours above it — one masked
          group part and one masked neighbour part;
        * keys ``[e − W, s]``: neighbours of every row — neighbour part, unmasked;
        * keys ``(s, e)``: the causal c × c triangle — masked neighbour part.

        All parts are merged exactly by log-sum-exp. Masked work is O(n · chunk), the rest runs unmasked
        (the padding mask, when there is one, is applied everywhere).
        """
        W = self.window_size
        q_len, k_len = query.shape[2], key.shape[2]
        off = k_len - q_len
        device = query.device
        q_group, key, k_group, value = self._group_rotated(query, key, value, q_pos, k_pos)

        outs = []
        for a in range(0, q_len, self.chunk):
            b = min(a + self.chunk, q_len)
            s, e = a + off, b + off
            rows = torch.arange(s, e, device=device)[:, None]
            lo = max(0, s - W + 1)
            mid_lo, mid_hi = max(lo, e - W), s + 1
            if mid_hi <= mid_lo:  # chunk wider than W: one masked band
                mid_lo = mid_hi = e

            def part(q_src, k_src, k0, k1, pattern, a=a, b=b):
                if k1 <= k0:
                    return None
                ok = None if pattern is None else pattern(torch.arange(k0, k1, device=device)[None, :])[None, None]
                if not mask.is_causal:
                    pad = mask.block(a, b, k0, k1)
                    if pattern is not None:
                        ok = ok & pad
                    elif not bool(pad.all()):
                        ok = pad
                return attention_with_lse(q_src[:, :, a:b], k_src[:, :, k0:k1], value[:, :, k0:k1], ok,
                                          scale=scaling)

            def group(t, rows=rows):
                return t <= rows - W

            def near(t, rows=rows):
                return (t > rows - W) & (t <= rows)

            parts = [
                part(q_group, k_group, 0, lo, None),
                part(q_group, k_group, lo, min(mid_lo, e - W), group),
                part(query, key, lo, mid_lo, near),
                part(query, key, mid_lo, mid_hi, None),
                part(query, key, mid_hi, e, near),
            ]
            parts = [p for p in parts if p is not None]
            outs.append(merge_attention(parts)[0] if len(parts) > 1 else parts[0][0])
        return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]

    def _attend_general(self, query, key, value, mask, q_pos, k_pos, scaling) -> torch.Tensor:
        """LCEG Eq. 13 pair by pair from positions (any position pattern): per chunk of query rows, the
        neighbour part (``i − j < W``) and the group part (``i − j ≥ W``) over all keys up to the chunk's
        last key index, merged by log-sum-exp. Memory O(chunk × Lk)."""
        W = self.window_size
        q_len, k_len = query.shape[2], key.shape[2]
        off = k_len - q_len
        q_group, key, k_group, value = self._group_rotated(query, key, value, q_pos, k_pos)

        outs = []
        for a in range(0, q_len, self.chunk):
            b = min(a + self.chunk, q_len)
            hi = min(k_len, b + off)  # causal by index: no chunk row attends past key index hi − 1
            near = (q_pos[:, a:b, None] - k_pos[:, None, :hi] < W)[:, None]  # (B or 1, 1, c, hi)
            ok = mask.block(a, b, 0, hi)
            parts = [attention_with_lse(query[:, :, a:b], key[:, :, :hi], value[:, :, :hi], ok & near, scale=scaling)]
            group_ok = ok & ~near
            if bool(group_ok.any()):
                parts.append(attention_with_lse(q_group[:, :, a:b], k_group[:, :, :hi], value[:, :, :hi], group_ok,
                                                scale=scaling))
            outs.append(merge_attention(parts)[0] if len(parts) > 1 else parts[0][0])
        return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def make_self_extend(info: RopeInfo, inv_freq: Callable[[], torch.Tensor], layer_idx: int, *, group_size: int,
                     window_size: int, reach: int | None = None, chunk: int = QUERY_CHUNK) -> SelfExtendAttention:
    """Layer-attention factory for Self-Extend (LCEG Eq. 13), named by the method's :class:`AttentionSpec`.

    Only layer 0 warns when an input runs past ``reach``, so the warning fires once per installed model.
    """
    if reach is None:
        reach = self_extend_reach(info.window, group_size, window_size)
    return SelfExtendAttention(inv_freq, group_size, window_size, reach=reach, warn_past_reach=layer_idx == 0,
                               chunk=chunk)

