"""Dual Chunk Attention (An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models", ICML,
arXiv 2402.17463, §3; ChunkLlama — in the form vLLM serves for Qwen2.5-1M, ``dual_chunk_attention_config``).

The positions are cut into chunks of ``L = chunk_size − local_size`` tokens. A key at position ``j`` sits at
``j mod L`` (the paper's key position indices ``P_k``). A query at position ``i`` takes one of three positions,
by how far its chunk ``⌊i/L⌋`` is from the key's chunk ``⌊j/L⌋``:

* **intra-chunk** (same chunk): ``i mod L`` — the relative position is the true ``i − j``;
* **successive-chunk** (the previous chunk): ``min(i mod L + L, chunk_size)`` — the true
  distance for the first ``local_size + 1`` tokens of a chunk (``i mod L ≤ local_size``: at
  ``i mod L = local_size`` the ceiling and the true position coincide), so locality is kept across the
  boundary; the ceiling ``chunk_size − (j mod L)`` after them;
* **inter-chunk** (two or more chunks back): ``chunk_size`` for every query, so every relative
  position is ``chunk_size − (j mod L)``, inside ``(local_size, chunk_size]``.

The paper writes the ceiling as ``c − 1`` (the pretrained length minus one) with ``L + local_size = c − 1``;
vLLM's form takes it as ``chunk_size`` — the same computation with ``chunk_size = c − 1``. No relative position
ever exceeds ``chunk_size``, however long the input: with ``chunk_size ≤ c − 1`` (the paper's setting) the model
never sees a distance it was not trained on; the default ``chunk_size = c`` (what vLLM and Qwen2.5-1M's configs
set) reaches distance ``c``, one past the longest trained one, at the first key of each chunk.

Queries and keys arrive rotated at their true positions (keys include the KV cache); RoPE rotations compose, so
each part only rotates them further to ``p`` (:func:`~ropekit.attention.kernels.rotate_to`). The three parts
are restricted softmaxes over disjoint keys, merged exactly by log-sum-exp; queries go in chunks of
:data:`QUERY_CHUNK` rows, so memory is O(chunk × keys) and no n × n matrix is built. Positions, padding and
every mask format come from :mod:`ropekit.attention.masks`, as for Self-Extend. Inference only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..core.rope_info import RopeInfo
from ..attention.interface import PairLogits
from ..attention.kernels import (
    attention_with_lse,
    forward_memo,
    memoized,
    merge_attention,
    pair_scores,
    rotate_to,
    runs_cpu_flash,
)
from ..attention.masks import AttentionMask, query_key_positions

#: Query rows per block: memory O(QUERY_CHUNK × keys) per head.
QUERY_CHUNK = 256


def chunk_key_position(pos: torch.Tensor, chunk_len: int) -> torch.Tensor:
    """The key (and intra-chunk query) position ``j mod L``."""
    return torch.remainder(pos, chunk_len)


def successive_query_position(pos: torch.Tensor, chunk_len: int, chunk_size: int) -> torch.Tensor:
    """The successive-chunk query position in vLLM's form: ``min(i mod L + L, chunk_size)``."""
    return torch.clamp(torch.remainder(pos, chunk_len) + chunk_len, max=chunk_size)


class DualChunkAttention:
    """One layer's Dual Chunk Attention (LayerAttention and PairRule of :mod:`ropekit.attention.interface`).

    When every attending query lies in the first chunk (``i < L``) all pairs are intra-chunk and the plain
    kernel runs: bit-identical to the unmodified model.
    """

    #: positions are not shift-invariant here: left padding must not be counted in them (interface.py warns)
    reads_positions = "dual_chunk"

    def __init__(self, inv_freq: Callable[[], torch.Tensor], chunk_size: int, local_size: int,
                 chunk: int = QUERY_CHUNK):
        self.inv_freq = inv_freq
        self.chunk_size, self.local_size = int(chunk_size), int(local_size)
        self.chunk_len = self.chunk_size - self.local_size
        self.chunk = int(chunk)

    def __repr__(self) -> str:
        return f"DualChunkAttention(chunk_size={self.chunk_size}, local_size={self.local_size})"

    def _rotated(self, query, key, q_pos, k_pos):
        """``(q_succ, q_inter, k_chunk)``: queries at their successive- and inter-chunk positions, keys at ``j mod L``."""
        L, S = self.chunk_len, self.chunk_size
        inv_freq = self.inv_freq().to(query.device)
        q_succ = rotate_to(query, q_pos, successive_query_position(q_pos, L, S), inv_freq)
        q_inter = rotate_to(query, q_pos, S, inv_freq)
        k_chunk = rotate_to(key, k_pos, chunk_key_position(k_pos, L), inv_freq)
        return q_succ, q_inter, k_chunk

    def _relation(self, q_pos, k_pos):
        """Chunk distance ``⌊i/L⌋ − ⌊j/L⌋`` of every pair, (B|1, 1, Lq, Lk)."""
        L = self.chunk_len
        cq = torch.div(q_pos, L, rounding_mode="floor")
        ck = torch.div(k_pos, L, rounding_mode="floor")
        return (cq[:, :, None] - ck[:, None, :])[:, None]

    def __call__(self, module, query, key, value, attention_mask, *, scaling, dropout=0.0, kernel, **kwargs):
        """DCA over rotated ``query`` (B, H, Lq, D) and ``key``/``value`` (B, H_kv, Lk, D); returns
        ``(out (B, Lq, H, D), None)`` like transformers' kernels."""
        q_len, k_len = query.shape[2], key.shape[2]
        q_pos, k_pos = query_key_positions(kwargs.get("position_ids"), q_len, k_len, query.device)
        # What needs a host read of the mask or the positions is decided once per forward by the first layer and
        # shared by the others (forward_memo): no host sync per layer.
        memo = forward_memo(attention_mask, kwargs.get("position_ids"), q_len, k_len)
        mask = memoized(memo, ("mask", query.shape[0], query.shape[1], kwargs.get("sliding_window")),
                        lambda: AttentionMask.for_call(attention_mask, query, key, kwargs))
        plain, blocks, in_order = memoized(memo, ("chunk layout", self.chunk_len, self.chunk),
                                           lambda: self._layout(mask, q_pos, k_pos, q_len, k_len))
        if plain:  # every pair intra-chunk: the plain model, exactly
            return kernel(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        q_succ, q_inter, k_chunk = self._rotated(query, key, q_pos, k_pos)
        off = k_len - q_len
        # the intra-chunk range is exactly the rows' own chunk only in the in-order layout
        triangles = in_order and mask.is_causal and runs_cpu_flash(query)
        outs = []
        for a, b, ranges in blocks:
            parts = []
            for kind, (q_src, k_src) in enumerate(((query, key), (q_succ, k_chunk), (q_inter, k_chunk))):
                if ranges[kind] is None:
                    continue
                lo, up, whole = ranges[kind]
                if kind == 0 and triangles and lo <= a + off and up >= b + off:
                    # under the plain causal mask, with every key of [lo, b + off) in the rows' chunk: the keys
                    # before the block's first key index (all seen) and the block's own causal triangle
                    s = a + off
                    parts.append(attention_with_lse(query[:, :, a:b], key[:, :, s:b + off], value[:, :, s:b + off],
                                                    None, scale=scaling, causal=True))
                    if s > lo:
                        parts.append(attention_with_lse(query[:, :, a:b], key[:, :, lo:s], value[:, :, lo:s], None,
                                                        scale=scaling))
                    continue
                allowed = None
                if not (whole and kind > 0):
                    relation = self._relation(q_pos[:, a:b], k_pos[:, lo:up])
                    which = relation == 0 if kind == 0 else relation == 1 if kind == 1 else relation >= 2
                    allowed = mask.block(a, b, lo, up) & which
                parts.append(attention_with_lse(q_src[:, :, a:b], k_src[:, :, lo:up], value[:, :, lo:up], allowed,
                                                scale=scaling))
            if not parts:  # rows that attend to nothing (padding): zeros, as the kernels give
                outs.append(torch.zeros_like(query[:, :, a:b]))
                continue
            outs.append(merge_attention(parts)[0] if len(parts) > 1 else parts[0][0])
        out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
        return out.transpose(1, 2).contiguous(), None

    def _layout(self, mask, q_pos, k_pos, q_len: int, k_len: int) -> tuple[bool, list[tuple], bool]:
        """One forward's host-side decisions, read in two syncs by the first layer (the others share them): whether
        every attending query lies in the first chunk (the plain kernel), and the blocks ``(a, b, ranges)`` of
        query rows ``[a, b)`` with the key index range ``(lo, up, whole)`` of their intra-, successive- and
        inter-chunk parts (``None``: the part is skipped; ``whole``: every pair of the part is allowed, so no
        mask is built); and whether the layout is in order (below).

        Keys are causal by index (no row of a block attends past index ``b + Lk − Lq``). When every sequence of
        the batch has the same non-decreasing positions (no padding or packing), the blocks are cut at chunk
        boundaries, and the keys of each chunk relation are a contiguous range found by bisecting the chunk
        numbers: each key is visited by one part, and under the plain causal mask the successive and inter parts
        — keys of earlier chunks, before every row of the block — need no mask. Otherwise blocks are
        :data:`QUERY_CHUNK` rows, every part with an allowed pair spans all causal keys, and relation masks select."""
        L = self.chunk_len
        first = (torch.where(mask.active_queries(), q_pos, -1).max() < L)[None]
        off = k_len - q_len
        chunks = torch.div(k_pos, L, rounding_mode="floor")
        rows = torch.div(q_pos, L, rounding_mode="floor")
        ordered = ((chunks == chunks[:1]).all() & (chunks[0, 1:] >= chunks[0, :-1]).all()
                   & (rows == rows[:1]).all() & (rows[0, 1:] >= rows[0, :-1]).all())
        if bool(ordered):
            starts = torch.cat([rows.new_zeros(1), torch.nonzero(rows[0, 1:] != rows[0, :-1])[:, 0] + 1])
            c = rows[0, starts]  # the chunk of each run of query rows
            # key chunk numbers: intra c, successive c − 1, inter ≤ c − 2 (bisected: first index ≥ the bound)
            found = torch.searchsorted(chunks[0].contiguous(), torch.stack([c, c + 1, c - 1, c, c - 1], dim=1))
            read = torch.cat([first.long(), starts, found.reshape(-1)]).tolist()
            runs = (len(read) - 1) // 6
            starts_h, found_h = read[1:1 + runs] + [q_len], read[1 + runs:]
            blocks = []
            for s in range(runs):
                intra_lo, intra_up, succ_lo, succ_up, inter_up = found_h[5 * s:5 * s + 5]
                for a in range(starts_h[s], starts_h[s + 1], self.chunk):
                    b = min(a + self.chunk, starts_h[s + 1])
                    hi = min(k_len, b + off)
                    spans = ((intra_lo, min(intra_up, hi), False), (succ_lo, min(succ_up, hi), mask.is_causal),
                             (0, min(inter_up, hi), mask.is_causal))
                    blocks.append((a, b, tuple(span if span[1] > span[0] else None for span in spans)))
            return bool(read[0]), blocks, True
        blocks = [(a, min(a + self.chunk, q_len)) for a in range(0, q_len, self.chunk)]
        flags = [first]
        for a, b in blocks:
            hi = min(k_len, b + off)
            ok = mask.block(a, b, 0, hi)
            relation = self._relation(q_pos[:, a:b], k_pos[:, :hi])
            flags.append(torch.stack([(ok & (relation == 0)).any(), (ok & (relation == 1)).any(),
                                      (ok & (relation >= 2)).any()]))
        read = torch.cat(flags).tolist()
        return bool(read[0]), [(a, b, tuple((0, min(k_len, b + off), False) if read[1 + 3 * i + kind] else None
                                            for kind in range(3))) for i, (a, b) in enumerate(blocks)], False

    def pair_logits(self, module, query, key, attention_mask, *, scaling, rows, **kwargs) -> PairLogits:
        """The three chunk rules pair by pair: the logit at the true positions inside a chunk, with the query at
        ``min(i mod L + L, chunk_size)`` against the key at ``j mod L`` from the previous chunk, and at
        ``chunk_size`` against ``j mod L`` from earlier chunks; every pair the mask allows is kept."""
        mask = AttentionMask.for_call(attention_mask, query, key, kwargs)
        q_pos, k_pos = query_key_positions(kwargs.get("position_ids"), query.shape[2], key.shape[2], query.device)
        q_succ, q_inter, k_chunk = self._rotated(query[:, :, rows], key, q_pos[:, rows], k_pos)
        relation = self._relation(q_pos[:, rows], k_pos)
        scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        logits = torch.where(relation == 0, pair_scores(query[:, :, rows], key),
                             torch.where(relation == 1, pair_scores(q_succ, k_chunk), pair_scores(q_inter, k_chunk)))
        return PairLogits(logits * scale, mask.rows(rows))


def make_dual_chunk(info: RopeInfo, inv_freq: Callable[[], torch.Tensor], layer_idx: int, *, chunk_size: int,
                    local_size: int, chunk: int = QUERY_CHUNK) -> DualChunkAttention:
    """Layer-attention factory for Dual Chunk Attention, named by the method's :class:`AttentionSpec`."""
    return DualChunkAttention(inv_freq, chunk_size, local_size, chunk=chunk)
