"""LM-Infinite's Λ-shaped attention (Han et al. 2024, NAACL; LCEG (Lu et al. 2024) §3), exact and in O(n·(L_local + G)).

For a query at position ``i`` and a key at position ``j ≤ i`` (``G`` global tokens, local window
``L_local``), the logit is

* ``⟨R_i q, R_j k⟩``      if ``i − j < L_local`` — ordinary RoPE attention inside the local band;
* ``⟨R_{L_local} q, k⟩``  else if ``j < G`` — the first ``G`` tokens, seen at a relative distance
  clamped to ``L_local`` ("distance ceiling"; the reference code rotates the query to ``limit_distance``
  and keeps the key unrotated);
* masked otherwise (the Λ shape).

The queries and keys arrive already rotated (``R_i q``, ``R_j k``; cached keys too), so the clamped logit
is formed with extra rotations: ``R_{L−i}(R_i q) = R_L q`` and ``R_{−j}(R_j k) = k``
(:func:`~ropekit.attention.kernels.rotate_to`). The KV cache keeps the ordinary rotated keys, so cached
decoding and chunked prefill need no special cache.

Cost: queries are processed in chunks. Each chunk attends to (a) the keys of its local band and (b) the
global candidates, each with :func:`~ropekit.attention.kernels.attention_with_lse`, and the two partial
results are merged exactly with their log-sum-exps (:func:`~ropekit.attention.kernels.merge_attention`).
The two parts are disjoint per (query, key) pair — the band part takes ``i − j < L_local``, the global part
``i − j ≥ L_local and j < G`` — so a global token inside the band is counted once, in the band part.

Positions and masks: relative distances use positions (``position_ids``; cached keys at the consecutive
positions ending at the last query, :func:`~ropekit.attention.masks.key_positions`), so left padding
produced by ``generate`` (whose real tokens start at position 0) is handled; which keys exist comes from
transformers' mask in any kernel's format, read by :class:`~ropekit.attention.masks.AttentionMask` (none =
plain causal, 2-D flash padding, 4-D bool, 4-D additive float, flex ``BlockMask``). Positions are assumed
to increase along the real tokens of a row (a dynamic KV cache, as ``generate`` and chunked prefill use, or
a static one, whose unwritten slots are cut off first: :func:`~ropekit.attention.masks.without_unwritten_keys`).
Attention dropout is not applied on the Λ path
(LM-Infinite is an inference-time method).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..attention.interface import PairLogits
from ..attention.kernels import (
    attention_with_lse,
    forward_memo,
    memoized,
    merge_attention,
    pair_scores,
    rotate_to,
)
from ..attention.masks import AttentionMask, key_positions

#: Largest number of queries processed together; a chunk costs chunk × (chunk + L_local + globals) logits.
DEFAULT_CHUNK = 512


class LambdaAttention:
    """One layer's LM-Infinite attention; see the module docstring for the definition.

    ``inv_freq()`` returns the model's current shared inverse frequencies (used for the extra rotations
    of the clamped-distance logits). When no query is at a position ``≥ local_window`` no pair can leave
    the band, and the model's own ``kernel`` runs unchanged (bit-identical to the plain model).
    """

    #: positions are not shift-invariant here: left padding must not be counted in them (interface.py warns)
    reads_positions = "lm_infinite"

    def __init__(self, local_window: int, global_tokens: int, inv_freq: Callable[[], torch.Tensor],
                 chunk_size: int | None = None):
        if local_window < 1:
            raise ValueError("local_window must be at least 1")
        if global_tokens < 0:
            raise ValueError("global_tokens must be at least 0")
        self.local_window = int(local_window)
        self.global_tokens = int(global_tokens)
        self.inv_freq = inv_freq
        self.chunk_size = int(chunk_size) if chunk_size else max(64, min(self.local_window, DEFAULT_CHUNK))

    def __repr__(self) -> str:
        return f"LambdaAttention(local_window={self.local_window}, global_tokens={self.global_tokens})"

    # ------------------------------------------------------------------------------------------------
    def __call__(self, module, query, key, value, attention_mask, *, scaling=None, dropout=0.0, kernel, **kwargs):
        batch, _, q_len, _ = query.shape
        k_len = key.shape[2]
        position_ids = kwargs.get("position_ids")
        if position_ids is None:
            position_ids = torch.arange(k_len - q_len, k_len, device=query.device)[None]
        position_ids = position_ids.to(query.device).expand(batch, q_len)
        if torch.compiler.is_compiling():  # traced: no host sync, no branch on tensor values
            key_pos = key_positions(position_ids, k_len)
            mask = AttentionMask.for_call(attention_mask, query, key, kwargs)
            out = self._attend(query, key, value, mask, position_ids, key_pos, scaling, traced=True)
            return out.transpose(1, 2).contiguous(), None
        # Eager: what needs a host read of the positions or the mask is decided once per forward by the first layer
        # and shared by the others (forward_memo) — no host sync per layer.
        memo = forward_memo(attention_mask, kwargs.get("position_ids"), q_len, k_len)
        layout = memoized(memo, ("band layout", self.local_window, self.global_tokens, self.chunk_size),
                          lambda: self._layout(position_ids, attention_mask, query, key, kwargs))
        lo_pos, hi_pos, consecutive, n_global, chunk_hits, unpadded_hits = layout
        # Every real key has a position ≥ 0, so a query below the window cannot have a pair outside the band.
        if hi_pos < self.local_window:
            return kernel(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        mask = memoized(memo, ("mask", query.shape[0], query.shape[1], kwargs.get("sliding_window")),
                        lambda: AttentionMask.for_call(attention_mask, query, key, kwargs))
        if q_len == 1 and k_len > 1 and lo_pos >= k_len - 1 and mask.is_causal:
            out = self._attend_decode(query, key, value, position_ids, k_len, scaling)
            return out.transpose(1, 2).contiguous(), None
        key_pos = key_positions(position_ids, k_len)
        if mask.is_causal and self.local_window >= 2 and consecutive:
            out = self._attend_unpadded(query, key, value, position_ids, key_pos, scaling, n_global, unpadded_hits)
        else:
            out = self._attend(query, key, value, mask, position_ids, key_pos, scaling, n_global=n_global,
                               chunk_hits=chunk_hits)
        return out.transpose(1, 2).contiguous(), None

    def _layout(self, position_ids, attention_mask, query, key, kwargs):
        """One forward's host-side decisions, read in one sync: the smallest and largest query position, whether
        the positions are consecutive along each row, how many leading keys can be global (position < G in some
        row), and for each query chunk of :meth:`_attend` and :meth:`_attend_unpadded` whether its largest
        position reaches the window (only then has it a global part)."""
        q_len, k_len = position_ids.shape[1], key.shape[2]
        L = self.local_window
        steps = torch.arange(q_len, device=position_ids.device)
        k_pos = key_positions(position_ids, k_len)
        chunk_max = position_ids.amax(dim=0)  # (Lq,) largest query position over the batch
        small = chunk_max.new_full((1,), -1)

        def hits(size):
            starts = range(0, q_len, size)
            return torch.stack([torch.cat([chunk_max[a:a + size], small]).max() >= L for a in starts])

        global_keys = (k_pos < self.global_tokens).any(dim=0)
        last_global = torch.where(global_keys, torch.arange(k_len, device=k_pos.device), -1).max() + 1
        values = torch.cat([
            torch.stack([position_ids.min(), position_ids.max(),
                         (position_ids == position_ids[:, :1] + steps).all().long(), last_global.long()]).long(),
            hits(self.chunk_size).long(), hits(max(1, min(self.chunk_size, L - 1))).long(),
        ]).tolist()
        n_chunks = len(range(0, q_len, self.chunk_size))
        lo_pos, hi_pos, consecutive, n_global = values[:4]
        n_global = n_global if self.global_tokens > 0 else 0
        chunk_hits = [bool(v) for v in values[4:4 + n_chunks]]
        unpadded_hits = [bool(v) for v in values[4 + n_chunks:]]
        return lo_pos, hi_pos, bool(consecutive), n_global, chunk_hits, unpadded_hits

    def pair_logits(self, module, query, key, attention_mask, *, scaling=None, rows, **kwargs) -> PairLogits:
        """The Λ rule pair by pair (:class:`~ropekit.attention.interface.PairRule`; module docstring):
        ``⟨R_i q, R_j k⟩`` when ``i − j < L``, else ``⟨R_L q, k⟩`` for ``j < G`` (the distance clamped to
        ``L``), else not kept; only pairs the mask allows are kept."""
        L, G = self.local_window, self.global_tokens
        mask = AttentionMask.for_call(attention_mask, query, key, kwargs)
        batch, q_len, k_len = query.shape[0], query.shape[2], key.shape[2]
        position_ids = kwargs.get("position_ids")
        if position_ids is None:
            position_ids = torch.arange(k_len - q_len, k_len, device=query.device)[None]
        q_pos = position_ids.to(query.device).expand(batch, q_len)
        k_pos = key_positions(q_pos, k_len)
        inv_freq = self.inv_freq().to(query.device)
        qp = q_pos[:, rows]
        q = query[:, :, rows]
        dist = qp[:, :, None] - k_pos[:, None, :]
        band = (dist < L)[:, None]
        far_global = ((dist >= L) & (k_pos[:, None, :] < G))[:, None]
        scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        ceiling = pair_scores(rotate_to(q, qp, L, inv_freq), rotate_to(key, k_pos, 0, inv_freq))
        logits = torch.where(band, pair_scores(q, key), ceiling) * scale
        return PairLogits(logits, mask.rows(rows) & (band | far_global))

    # ------------------------------------------------------------------------------------------------
    def _global_candidates(self, key, value, k_pos, inv_freq, traced: bool = False, causal: bool = False,
                           n: int | None = None):
        """Keys [0, n) that can be global (position < G in some row), un-rotated: R_{−j}(R_j k) = k.

        ``traced`` (no host sync): ``n`` from shapes — ``min(Lk, G)`` when nothing is padded (``causal``: real
        positions never run behind key indices), else every key (the global part masks them by position)."""
        if self.global_tokens <= 0:
            return 0, None, None, None
        if traced:
            n = min(key.shape[2], self.global_tokens) if causal else key.shape[2]
            return n, rotate_to(key[:, :, :n], k_pos[:, :n], 0, inv_freq), value[:, :, :n], k_pos[:, :n]
        if n is None:  # (one host read; __call__ passes the forward's shared count instead)
            hits = (k_pos < self.global_tokens).any(dim=0).nonzero()
            n = int(hits.max()) + 1 if hits.numel() else 0
        if n == 0:
            return 0, None, None, None
        return n, rotate_to(key[:, :, :n], k_pos[:, :n], 0, inv_freq), value[:, :, :n], k_pos[:, :n]

    def _global_part(self, q, qp, key_g, value_g, k_pos_g, mask_block, scale, inv_freq):
        """Attention of a query chunk to the global candidates at the clamped distance: ⟨R_L q, k⟩."""
        L = self.local_window
        allowed = ((qp[:, None, :, None] - k_pos_g[:, None, None, :]) >= L) & (k_pos_g[:, None, None, :] < self.global_tokens)
        if mask_block is not None:  # None: the mask-free path, whose global pairs are all causal
            allowed = allowed & mask_block
        return attention_with_lse(rotate_to(q, qp, L, inv_freq), key_g, value_g, allowed, scale)

    def _attend_decode(self, query, key, value, q_pos, k_len, scale):
        """The Λ rule for one new query per row (cached decoding, nothing padded): keys at consecutive positions
        ending at the query's, so the band is the last ``L`` keys, and — positions being at least their key
        indices here — the global keys lie among the first ``min(G, Lk − L)``, seen at the clamped distance."""
        L = self.local_window
        lo = max(0, k_len - L)
        parts = [attention_with_lse(query, key[:, :, lo:], value[:, :, lo:], None, scale)]
        n_global = min(self.global_tokens, lo)
        if n_global > 0:
            inv_freq = self.inv_freq()
            k_pos = key_positions(q_pos, k_len)[:, :n_global]
            key_g = rotate_to(key[:, :, :n_global], k_pos, 0, inv_freq)
            parts.append(self._global_part(query, q_pos, key_g, value[:, :, :n_global], k_pos, None, scale, inv_freq))
        out = parts[0][0] if len(parts) == 1 else merge_attention(parts)[0]
        return out.to(query.dtype)

    def _attend_unpadded(self, query, key, value, q_pos, k_pos, scale, n_global=None, hits=None):
        """The Λ rule when nothing is padded and positions are consecutive: the band is an index band.

        Each chunk of ``C < L`` queries ``[a, b)`` (keys ``[a', b')`` with ``a' = a + offset``) splits its band
        into three key ranges that need no explicit mask: the *old triangle* ``[a' − L + 1, b' − L + 1)``
        (query ``r`` of the chunk sees its key ``c`` iff ``c ≥ r``: causal after reversing both orders), the
        *dense* block ``[b' − L + 1, a')`` (every query sees every key) and the *new triangle* ``[a', b')``
        (causal). On CPU they run on PyTorch's fused flash kernel, triangles with ``is_causal``.
        """
        q_len, k_len = query.shape[2], key.shape[2]
        L = self.local_window
        offset = k_len - q_len
        inv_freq = self.inv_freq()
        n_global, key_g, value_g, k_pos_g = self._global_candidates(key, value, k_pos, inv_freq, n=n_global)
        chunk = max(1, min(self.chunk_size, L - 1))  # keeps the old triangle [a' − L + 1, b' − L + 1) left of a'
        chunk_max = q_pos.amax(dim=0)
        outs = []
        for index, start in enumerate(range(0, q_len, chunk)):
            stop = min(start + chunk, q_len)
            q = query[:, :, start:stop]
            a, b = start + offset, stop + offset
            old_lo, old_hi = max(0, a - L + 1), max(0, b - L + 1)
            parts = [_causal_lse(q, key[:, :, a:b], value[:, :, a:b], scale)]
            if old_hi > old_lo:
                rev_q = q.flip(2)
                out, lse = _causal_lse(rev_q, key[:, :, old_lo:old_hi].flip(2), value[:, :, old_lo:old_hi].flip(2), scale)
                parts.append((out.flip(2), lse.flip(2)))
            if a > old_hi:
                parts.append(attention_with_lse(q, key[:, :, old_hi:a], value[:, :, old_hi:a], None, scale))
            if n_global and (hits[index] if hits is not None else int(chunk_max[start:stop].max()) >= L):
                g_hi = min(n_global, b)
                parts.append(self._global_part(q, q_pos[:, start:stop], key_g[:, :, :g_hi], value_g[:, :, :g_hi],
                                               k_pos_g[:, :g_hi], None, scale, inv_freq))
            out = parts[0][0] if len(parts) == 1 else merge_attention(parts)[0]
            outs.append(out.to(query.dtype))
        return torch.cat(outs, dim=2)

    # ------------------------------------------------------------------------------------------------
    def _attend(self, query, key, value, mask, q_pos, k_pos, scale, traced: bool = False, n_global=None,
                chunk_hits=None):
        """(B, H, Lq, D) attention output under the Λ rule, query chunk by query chunk.

        ``traced``: nothing depends on tensor values (for ``torch.compile(fullgraph=True)``): the global part of
        every chunk is computed (empty: ``lse = −∞``, merged as nothing)."""
        q_len, k_len = query.shape[2], key.shape[2]
        L = self.local_window
        offset = k_len - q_len  # query t sits at key index t + offset (dynamic cache)
        inv_freq = self.inv_freq()

        # Global candidates: keys [0, n_global) — up to the last key whose position is < G in any row
        # (G tokens plus any left padding before them).
        n_global, key_g, value_g, k_pos_g = self._global_candidates(key, value, k_pos, inv_freq, traced, mask.is_causal,
                                                                    n=n_global)
        chunk_max = q_pos.amax(dim=0)  # (Lq,) largest query position over the batch
        outs = []
        for index, start in enumerate(range(0, q_len, self.chunk_size)):
            stop = min(start + self.chunk_size, q_len)
            qp = q_pos[:, start:stop]
            q = query[:, :, start:stop]
            # (a) local band: key indices whose distance to some query of the chunk can be < L.
            lo, hi = max(0, start + offset - (L - 1)), stop + offset
            dist = qp[:, None, :, None] - k_pos[:, None, None, lo:hi]
            allowed = (dist < L) & mask.block(start, stop, lo, hi)
            parts = [attention_with_lse(q, key[:, :, lo:hi], value[:, :, lo:hi], allowed, scale)]
            # (b) global part: the first G positions, seen at distance L (query rotated to position L).
            reaches = traced or (chunk_hits[index] if chunk_hits is not None else int(chunk_max[start:stop].max()) >= L)
            if n_global and reaches:
                g_hi = min(n_global, hi)
                parts.append(self._global_part(q, qp, key_g[:, :, :g_hi], value_g[:, :, :g_hi], k_pos_g[:, :g_hi],
                                               mask.block(start, stop, 0, g_hi), scale, inv_freq))
            out = parts[0][0] if len(parts) == 1 else merge_attention(parts)[0]
            outs.append(out.to(query.dtype))
        return torch.cat(outs, dim=2)


def _causal_lse(query, key, value, scale):
    """Causal (top-left aligned) attention with its log-sum-exp: query r sees keys 0 … r.

    Grouped-query heads run one fused call per member of a group (query heads ``j, g + j, …`` against the
    KV heads as they are), so keys and values are never copied per query head."""
    if query.device.type == "cpu" and query.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        batch, heads, q_len, dim = query.shape
        kv_heads = key.shape[1]
        g = heads // kv_heads
        grouped = query.reshape(batch, kv_heads, g, q_len, dim)
        outs, lses = [], []
        for j in range(g):
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                grouped[:, :, j], key, value, 0.0, True, scale=scale
            )
            outs.append(out)
            lses.append(lse)
        out = torch.stack(outs, dim=2).reshape(batch, heads, q_len, value.shape[-1])
        return out, torch.stack(lses, dim=2).reshape(batch, heads, q_len).to(torch.float32)
    q_len, k_len = query.shape[2], key.shape[2]
    causal = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril()
    return attention_with_lse(query, key, value, causal, scale)


def make_lm_infinite(info, inv_freq: Callable[[], torch.Tensor], layer_idx: int, *, local_window: int,
                     global_tokens: int, chunk_size: int | None = None) -> LambdaAttention:
    """Layer-attention factory for LM-Infinite (every layer gets the same rule)."""
    return LambdaAttention(local_window, global_tokens, inv_freq, chunk_size)

