"""Self-Extend attention (Jin et al. 2024, "LLM Maybe LongLM", arXiv 2401.01325 §3).

A query at position ``i`` sees a key at position ``j ≤ i``

* at its true relative position ``i − j`` when ``i − j < W`` (the *neighbour* part), and
* otherwise at the grouped relative position ``(⌊i/G⌋ + W − ⌊W/G⌋) − ⌊j/G⌋`` (the *group* part):
  the query sits at ``⌊i/G⌋ + W − ⌊W/G⌋`` and the key at ``⌊j/G⌋``.

Floor division everywhere — the paper's definition. LongLM's transformers-4.38 code computed the group
query position with ``/`` (``self_extend_patch/Llama.py``, fixed in ``Llama_4_40.py``; docs/methods-reference.md §4), which
differs when ``G ∤ W``.

Queries and keys arrive already rotated at their true positions (keys include the KV cache). RoPE
rotations compose, so the group part only rotates them further to ``p_group`` (``rotate_to``, whose angle
``p_group·θ − fl(p_true·θ)`` cancels the float32 rounding of the model's own rotation, so a key at 100k is not
off by the 6e-3 rad that rounding reaches there); the unrotated vectors are never needed. Both parts run through :func:`attention_with_lse` and are merged
exactly with :func:`merge_attention`; no n × n matrix is built. Queries are processed in chunks of
:data:`QUERY_CHUNK` rows, so memory is O(chunk × keys). When position distance equals index distance
(no padding, left/right padding, KV cache, chunked prefill) the split is structural and only O(n · chunk)
logits go through masks — under the plain causal mask on CPU none but the first ``W / chunk`` blocks' (the parts
are causal triangles the fused kernel computes unmasked, ``_attend_causal``); otherwise every pair is decided from
its positions (exact, slower).

Positions: queries use ``position_ids``; keys use :func:`~ropekit.attention.masks.key_positions` (the
queries' own positions without a cache, else the consecutive positions ending at the last query — what
``generate`` with a dynamic cache and chunked prefill produce). Keys of padding get meaningless positions
but are masked. Which pairs exist comes from :class:`~ropekit.attention.masks.AttentionMask` (every mask
format transformers passes: none, 2-D flash padding, 4-D bool, 4-D additive, flex ``BlockMask``). A static
cache's unwritten slots are cut off before (:func:`~ropekit.attention.masks.without_unwritten_keys`). Inference only: attention dropout is not applied.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from ..core.rope_info import RopeInfo
from ..attention.interface import PairLogits
from ..attention.kernels import (
    attention_with_lse,
    forward_memo,
    memoized,
    merge_attention,
    offset_table,
    pair_scores,
    rotate_from_table,
    rotate_to,
    runs_cpu_flash,
)
from ..attention.masks import AttentionMask, query_key_positions

#: Query rows per chunk: memory is O(QUERY_CHUNK × keys) per head, masked work O(n × QUERY_CHUNK). 256 was the
#: fastest of 128–1024 for SmolLM2-like heads at 8k tokens on CPU.
QUERY_CHUNK = 256


def group_query_position(pos: torch.Tensor, group_size: int, window_size: int) -> torch.Tensor:
    """Self-Extend (Jin et al. 2024 §3): the grouped query position ``⌊i/G⌋ + W − ⌊W/G⌋`` (floor division)."""
    return torch.div(pos, group_size, rounding_mode="floor") + (window_size - window_size // group_size)


def group_key_position(pos: torch.Tensor, group_size: int) -> torch.Tensor:
    """Self-Extend (Jin et al. 2024 §3): the grouped key position ``⌊j/G⌋``."""
    return torch.div(pos, group_size, rounding_mode="floor")


def self_extend_reach(window: int, group_size: int, window_size: int) -> int:
    """The longest input Self-Extend keeps inside the pretrained window: ``G·(C − W + ⌊W/G⌋)``.

    The farthest pair of an input of ``n`` tokens, query ``n − 1`` and key 0, sits at ``⌊(n − 1)/G⌋ + W − ⌊W/G⌋``
    (:func:`group_query_position`), which stays below ``C`` while ``n ≤ G·(C − W + ⌊W/G⌋)``. When ``G`` divides
    ``W`` that is the LongLM README's ``(C − W)·G + W``; otherwise the README's form is ``W mod G`` tokens too long,
    and its last tokens see key 0 at distance ``C``, which the model never saw.
    """
    return group_size * (window - window_size + window_size // group_size)


class SelfExtendAttention:
    """One layer's Self-Extend attention (LayerAttention protocol of :mod:`ropekit.attention.interface`).

    Implements the two-part attention of Jin et al. 2024 §3 exactly: logits of pairs with
    ``i − j < W`` use the true positions, the others the grouped positions; one softmax over both, computed
    as two restricted softmaxes merged by log-sum-exp. When no allowed pair in this call is ``W`` or more
    apart, the plain kernel runs instead (bit-identical to the unmodified model).
    """

    #: positions are not shift-invariant here: left padding must not be counted in them (interface.py warns)
    reads_positions = "self_extend"

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
        #: ropekit's own decoding cache entry, beside transformers' KV cache: the group-rotated keys
        #: (see :meth:`_cached_group_keys`).
        self._group_keys: _GroupKeyCache | None = None
        #: keys of the previous call (the cache entry is continued only by the next decoding step: one key more)
        self._last_k_len: int | None = None
        self._call_memo: dict | None = None  # the current forward's shared decisions (during a call)

    def __repr__(self) -> str:
        return f"SelfExtendAttention(group_size={self.group_size}, window_size={self.window_size})"

    def reset(self) -> None:
        """Forget the decoding entry (the next call starts afresh; a reordered cache is also noticed by itself)."""
        self._group_keys, self._last_k_len = None, None

    def _maybe_warn(self, q_pos: torch.Tensor, memo: dict) -> None:
        """Warn once (per installed model: only layer 0's instance warns) when an input runs past the reach."""
        if not self.warn_past_reach or self._warned or self.reach is None or torch.compiler.is_compiling():
            return
        longest = memoized(memo, "max_position", lambda: int(q_pos.max())) + 1
        if longest > self.reach:
            self._warned = True
            warnings.warn(
                f"self_extend: input of {longest} tokens is past the reach {self.reach} = G·(C − W + ⌊W/G⌋) of "
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
        if torch.compiler.is_compiling():  # traced: no host sync, no branch on tensor values
            mask = AttentionMask.for_call(attention_mask, query, key, kwargs)
            return self._attend_traced(query, key, value, mask, q_pos, k_pos, scaling).transpose(1, 2).contiguous(), None
        # Eager: what needs a host read of the mask or the positions is decided once per forward by the first layer
        # and shared by the others (forward_memo) — no host sync per layer.
        continuing = q_len == 1 and self._last_k_len == k_len - 1
        self._last_k_len = k_len
        if not continuing:  # a new prompt, a prefill, a cropped or replaced cache: the decoding entry is stale
            self._group_keys = None
        memo = forward_memo(attention_mask, kwargs.get("position_ids"), q_len, k_len)
        if self._group_keys is not None:
            # A cache reordered in place between steps (beam search) keeps every shape: whether the cached keys are
            # still the ones the entry rotated is read once per forward, by the first layer, for all of them.
            entry = self._group_keys
            if not memoized(memo, "self_extend_cache_continues", lambda: entry.continues(key, k_pos)):
                self._group_keys = None
        self._maybe_warn(q_pos, memo)
        mask = memoized(memo, ("mask", query.shape[0], query.shape[1], kwargs.get("sliding_window")),
                        lambda: AttentionMask.for_call(attention_mask, query, key, kwargs))
        if q_len == 1 and k_len > 1 and mask.is_causal:
            # cached decoding without padding: key positions are consecutive by construction (key_positions) and
            # the oldest key is k_len − 1 positions away — decided from shapes alone
            if k_len - 1 < self.window_size:
                return kernel(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
            out = self._attend_decode(query, key, value, mask, q_pos, k_pos, scaling)
            return out.transpose(1, 2).contiguous(), None
        degenerate, consecutive = memoized(memo, ("grouped layout", self.window_size),
                                           lambda: self._layout(mask, q_pos, k_pos, q_len, k_len, device))
        # Degenerate case (Self-Extend with every allowed pair closer than W): plain attention, exactly.
        if degenerate:
            return kernel(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        if consecutive and q_len == 1:
            out = self._attend_decode(query, key, value, mask, q_pos, k_pos, scaling)
        else:
            if consecutive and mask.is_causal and runs_cpu_flash(query):
                attend = self._attend_causal
            else:
                attend = self._attend_banded if consecutive else self._attend_general
            self._call_memo = memo
            try:
                out = attend(query, key, value, mask, q_pos, k_pos, scaling)
            finally:
                self._call_memo = None
        return out.transpose(1, 2).contiguous(), None

    def _layout(self, mask, q_pos, k_pos, q_len: int, k_len: int, device) -> tuple[bool, bool]:
        """``(degenerate, consecutive)`` of one forward, read from the host once (two scalars, one sync):
        whether every allowed pair is closer than ``W`` (plain attention), and whether position distance equals
        index distance for every pair that matters — one offset per row over the attended keys and attending
        queries (no padding, left/right padding, KV cache, chunked prefill)."""
        seen_keys = mask.seen_keys()  # (B|1, Lk): keys some query attends to
        active = mask.active_queries()  # (B|1, Lq): queries that attend to something
        big = torch.iinfo(torch.long).max
        oldest = torch.where(seen_keys, k_pos, big).min(dim=-1).values
        degenerate = (q_pos.max(dim=-1).values - oldest < self.window_size).all()
        shift_k = k_pos - torch.arange(k_len, device=device)
        shift_q = q_pos - torch.arange(k_len - q_len, k_len, device=device)
        lo_k = torch.where(seen_keys, shift_k, big).min(-1).values
        hi_k = torch.where(seen_keys, shift_k, -big).max(-1).values
        lo_q = torch.where(active, shift_q, big).min(-1).values
        hi_q = torch.where(active, shift_q, -big).max(-1).values
        consecutive = ((lo_k == hi_k) & (lo_q == hi_q) & (lo_k == lo_q)).all()
        degenerate, consecutive = torch.stack([degenerate, consecutive]).tolist()
        return bool(degenerate), bool(consecutive)

    def pair_logits(self, module, query, key, attention_mask, *, scaling, rows, **kwargs) -> PairLogits:
        """Self-Extend's rule pair by pair (:class:`~ropekit.attention.interface.PairRule`): the logit of query ``i``
        and key ``j`` at their true positions when ``i − j < W``, else with the query at
        ``⌊i/G⌋ + W − ⌊W/G⌋`` and the key at ``⌊j/G⌋`` — reached by rotating the already-rotated vectors
        further (RoPE rotations compose); every pair the mask allows is kept."""
        G, W = self.group_size, self.window_size
        mask = AttentionMask.for_call(attention_mask, query, key, kwargs)
        q_pos, k_pos = query_key_positions(kwargs.get("position_ids"), query.shape[2], key.shape[2], query.device)
        inv_freq = self.inv_freq().to(query.device)
        qp = q_pos[:, rows]
        q = query[:, :, rows]
        q_group = rotate_to(q, qp, group_query_position(qp, G, W), inv_freq)
        k_group = rotate_to(key, k_pos, group_key_position(k_pos, G), inv_freq)
        near = (qp[:, :, None] - k_pos[:, None, :] < W)[:, None]
        scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        logits = torch.where(near, pair_scores(q, key), pair_scores(q_group, k_group)) * scale
        return PairLogits(logits, mask.rows(rows))

    def _group_rotated(self, query, key, value, q_pos, k_pos):
        """Queries moved to ``⌊i/G⌋ + W − ⌊W/G⌋`` and keys to ``⌊j/G⌋`` (Jin et al. 2024 §3) by extra rotations
        ``p_group − p_true``. Keys and values keep their KV heads (the kernels fold grouped query heads)."""
        G, W = self.group_size, self.window_size
        inv_freq = self.inv_freq().to(query.device)
        q_group = rotate_to(query, q_pos, group_query_position(q_pos, G, W), inv_freq)
        k_group = self._rotate_keys_to_groups(key, k_pos, inv_freq, self._call_memo)
        return q_group, key, k_group, value

    @staticmethod
    def _position_range(k_pos) -> tuple[int, int]:
        """``(min, max)`` of the key positions: one host read."""
        lo, hi = torch.stack(list(torch.aminmax(k_pos))).tolist()
        return int(lo), int(hi)

    def _rotate_keys_to_groups(self, key, k_pos, inv_freq, memo: dict | None = None):
        """Keys rotated from ``j`` to ``⌊j/G⌋``: the same as ``rotate_to(key, j, ⌊j/G⌋, inv_freq)``.

        The rotation of a key depends only on its position, so its cos/sin come from one table shared by all
        layers (:func:`~ropekit.attention.kernels.offset_table`, grown by doubling) instead of being recomputed
        per layer.
        """
        if k_pos.numel() == 0 or torch.compiler.is_compiling():
            return rotate_to(key, k_pos, group_key_position(k_pos, self.group_size), inv_freq)
        lo, hi = self._position_range(k_pos) if memo is None else memoized(memo, "key_range",
                                                                            lambda: self._position_range(k_pos))
        if lo < 0:
            return rotate_to(key, k_pos, group_key_position(k_pos, self.group_size), inv_freq)
        table = offset_table("group_key", self.group_size, hi + 1, inv_freq, key.dtype)
        return rotate_from_table(key, k_pos, table)

    def _cached_group_keys(self, key, k_pos, upto: int, inv_freq) -> torch.Tensor:
        """``key[:, :, :upto]`` rotated to the group positions ``⌊j/G⌋`` (Jin et al. 2024 §3), kept between decoding steps.

        Cached decoding would otherwise re-rotate every cached key at every step. This entry, which ropekit owns
        beside transformers' KV cache, keeps the rotated keys in a buffer grown by doubling and rotates only the
        keys that became group keys since the last step. It is reused only by the call that continues the one
        that last used it — one query and exactly one key more than the previous call of this layer (``__call__``
        drops it otherwise: a prefill, a new prompt, a cropped or replaced cache) — with the same
        batch/heads/dtype/device and no more keys than now. Decided from shapes alone: no host sync per step.
        A cache whose rows were reordered in place between steps (beam search) is noticed by comparing the last key
        the entry rotated with the cache's, once per forward (``__call__``), and the entry is rebuilt.
        """
        entry = self._group_keys
        if entry is not None and not entry.matches(key, k_pos, upto):
            entry = None
        start = 0 if entry is None else entry.length
        if entry is None:
            entry = self._group_keys = _GroupKeyCache(key, upto)
        if upto > start:
            new = rotate_to(key[:, :, start:upto], k_pos[:, start:upto],
                            group_key_position(k_pos[:, start:upto], self.group_size), inv_freq)
            entry.append(new, key, k_pos, upto)
        return entry.keys(upto)

    def _attend_decode(self, query, key, value, mask, q_pos, k_pos, scaling) -> torch.Tensor:
        """Self-Extend's grouped positions (Jin et al. 2024 §3) for one new query per sequence (cached decoding), positions consecutive.

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
        fold = lambda t: t.reshape(batch, kv_heads, g, dim)

        def visible(k0, k1):  # the padding mask as it is (checking it for "all visible" would cost a host sync)
            return None if mask.is_causal else mask.block(0, 1, k0, k1)  # causal: the one query sees every key

        parts = [attention_with_lse(fold(query), key[:, :, lo:], value[:, :, lo:], visible(lo, k_len), scale=scaling)]
        if lo > 0:
            q_group = rotate_to(query, q_pos, group_query_position(q_pos, self.group_size, W), inv_freq)
            k_group = self._cached_group_keys(key, k_pos, lo, inv_freq)
            parts.append(attention_with_lse(fold(q_group), k_group, value[:, :, :lo], visible(0, lo), scale=scaling))
        if len(parts) == 1:
            out = parts[0][0]
        else:  # the log-sum-exp merge of two parts in one step: o = o_g + (o_n − o_g)·σ(l_n − l_g)
            (o_n, l_n), (o_g, l_g) = parts
            w = torch.sigmoid(l_n - l_g).nan_to_num_(0.5).unsqueeze(-1).to(o_n.dtype)  # both empty: 0 either way
            out = torch.lerp(o_g, o_n, w)
        return out.reshape(batch, heads, 1, dim)

    def _attend_banded(self, query, key, value, mask, q_pos, k_pos, scaling) -> torch.Tensor:
        """Self-Extend's grouped positions when position distance equals index distance, by structure instead of by pair.

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
                if not mask.is_causal:  # padding: applied as it is (no host read of whether it hides anything)
                    pad = mask.block(a, b, k0, k1)
                    ok = pad if ok is None else ok & pad
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

    def _attend_causal(self, query, key, value, mask, q_pos, k_pos, scaling) -> torch.Tensor:
        """Self-Extend's grouped positions under the plain causal mask (no padding, position distance = index distance) on CPU, where
        both parts are mostly causal triangles that the fused kernel computes without a mask.

        With ``off = Lk − Lq``, query row ``r`` (key index ``R = r + off``) has group keys ``t ≤ R − W`` and
        neighbour keys ``R − W < t ≤ R``.

        * Group part, for all rows at once: with ``d = off − W``, row ``r`` sees keys ``[0, r + d]`` — keys
          ``[0, d)`` (when ``d > 0``) for every row, unmasked, and a causal square of rows ``[max(0, −d), Lq)``
          over keys from ``max(d, 0)``. Rows ``r < −d`` have no group key.
        * Neighbour part, per chunk of ``c ≤ W`` rows ``[a, b)`` (``s = a + off``, ``e = b + off``): keys
          ``[s − W + 1, e − W + 1)`` form a staircase (row ``s + i`` sees the ``j ≥ i`` of them: with rows and
          keys reversed, a causal triangle; a c × c mask where key 0 cuts it),
          keys ``[e − W + 1, s)`` are seen by every row (unmasked) and keys ``[s, e)`` are the causal c × c
          triangle.

        Every pair the formula has is computed once, as the plain causal attention computes its pairs; the parts
        are merged exactly by log-sum-exp in float32.
        """
        W = self.window_size
        q_len, k_len = query.shape[2], key.shape[2]
        off = k_len - q_len
        device = query.device
        q_group, key, k_group, value = self._group_rotated(query, key, value, q_pos, k_pos)

        d = off - W
        first = max(0, -d)  # the first row with a group key
        batch, heads = query.shape[:2]
        group_out = query.new_zeros(batch, heads, q_len, value.shape[-1])
        group_lse = torch.full((batch, heads, q_len), float("-inf"), device=device)
        if first < q_len:
            start = max(d, 0)
            parts = [attention_with_lse(q_group[:, :, first:], k_group[:, :, start:start + q_len - first],
                                        value[:, :, start:start + q_len - first], None, scale=scaling, causal=True)]
            if d > 0:
                parts.append(attention_with_lse(q_group[:, :, first:], k_group[:, :, :d], value[:, :, :d], None,
                                                scale=scaling))
            group_out[:, :, first:], group_lse[:, :, first:] = merge_attention(parts) if len(parts) > 1 else parts[0]

        chunk = max(1, min(self.chunk, W))
        near_out, near_lse = [], []
        for a in range(0, q_len, chunk):
            b = min(a + chunk, q_len)
            s, e = a + off, b + off
            parts = [attention_with_lse(query[:, :, a:b], key[:, :, s:e], value[:, :, s:e], None, scale=scaling,
                                        causal=True)]
            mid_lo, mid_hi = max(0, e - W + 1), s
            if mid_hi > mid_lo:
                parts.append(attention_with_lse(query[:, :, a:b], key[:, :, mid_lo:mid_hi], value[:, :, mid_lo:mid_hi],
                                                None, scale=scaling))
            stair_lo, stair_hi = max(0, s - W + 1), min(max(0, e - W + 1), s)
            if stair_hi - stair_lo == b - a and stair_hi == e - W + 1:
                # the whole staircase, an upper triangle (diagonal included): reversing rows and keys makes it the
                # causal lower one, which the kernel computes without a mask
                out, lse = attention_with_lse(query[:, :, a:b].flip(2), key[:, :, stair_lo:stair_hi].flip(2),
                                              value[:, :, stair_lo:stair_hi].flip(2), None, scale=scaling, causal=True)
                parts.append((out.flip(2), lse.flip(2)))
            elif stair_hi > stair_lo:  # cut by key 0 (the first W / c chunks): a c × c mask
                rows = torch.arange(s, e, device=device)[:, None]
                seen = torch.arange(stair_lo, stair_hi, device=device)[None, :] > rows - W
                parts.append(attention_with_lse(query[:, :, a:b], key[:, :, stair_lo:stair_hi],
                                                value[:, :, stair_lo:stair_hi], seen, scale=scaling))
            out, lse = merge_attention(parts) if len(parts) > 1 else parts[0]
            near_out.append(out)
            near_lse.append(lse)
        near = (torch.cat(near_out, dim=2), torch.cat(near_lse, dim=2)) if len(near_out) > 1 \
            else (near_out[0], near_lse[0])
        if first >= q_len:
            return near[0]
        return merge_attention([near, (group_out, group_lse)])[0]

    def _attend_traced(self, query, key, value, mask, q_pos, k_pos, scaling) -> torch.Tensor:
        """Self-Extend's grouped positions without a host sync or a branch on tensor values (what ``torch.compile(fullgraph=True)``
        traces): per chunk of query rows, the neighbour part (``i − j < W``) and the group part (``i − j ≥ W``)
        over the keys up to the chunk's last key index — both always computed (an empty part has
        ``lse = −∞`` and merges as nothing). Memory O(chunk × Lk); the mask must be one whose reading needs no
        sync (none, or transformers' 4-D boolean mask)."""
        inv_freq = self.inv_freq().to(query.device)
        q_group = rotate_to(query, q_pos, group_query_position(q_pos, self.group_size, self.window_size), inv_freq)
        k_group = rotate_to(key, k_pos, group_key_position(k_pos, self.group_size), inv_freq)
        return self._two_parts_by_chunk(query, key, value, q_group, k_group, mask, q_pos, k_pos, scaling)

    def _attend_general(self, query, key, value, mask, q_pos, k_pos, scaling) -> torch.Tensor:
        """Self-Extend's rule pair by pair from positions (any position pattern): per chunk of query rows, the
        neighbour part (``i − j < W``) and the group part (``i − j ≥ W``) over all keys up to the chunk's
        last key index, merged by log-sum-exp. Memory O(chunk × Lk)."""
        q_group, key, k_group, value = self._group_rotated(query, key, value, q_pos, k_pos)
        return self._two_parts_by_chunk(query, key, value, q_group, k_group, mask, q_pos, k_pos, scaling)

    def _two_parts_by_chunk(self, query, key, value, q_group, k_group, mask, q_pos, k_pos, scaling) -> torch.Tensor:
        """Per chunk of query rows, the neighbour part (``i − j < W``, true positions) and the group part
        (``i − j ≥ W``, the group-rotated ``q_group``/``k_group``) over every key up to the chunk's last key
        index, merged by log-sum-exp (Jin et al. 2024 §3)."""
        W = self.window_size
        q_len, k_len = query.shape[2], key.shape[2]
        off = k_len - q_len
        outs = []
        for a in range(0, q_len, self.chunk):
            b = min(a + self.chunk, q_len)
            hi = min(k_len, b + off)  # causal by index: no chunk row attends past key index hi − 1
            near = (q_pos[:, a:b, None] - k_pos[:, None, :hi] < W)[:, None]  # (B or 1, 1, c, hi)
            ok = mask.block(a, b, 0, hi)
            # both parts always (an empty one has lse = −∞ and merges as nothing): no host read per chunk
            parts = [attention_with_lse(query[:, :, a:b], key[:, :, :hi], value[:, :, :hi], ok & near, scale=scaling),
                     attention_with_lse(q_group[:, :, a:b], k_group[:, :, :hi], value[:, :, :hi], ok & ~near,
                                        scale=scaling)]
            outs.append(merge_attention(parts)[0])
        return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


class _GroupKeyCache:
    """One layer's group-rotated keys ``R_{⌊j/G⌋} k_j`` for key indices ``[0, length)`` (see
    :meth:`SelfExtendAttention._cached_group_keys`), in a buffer whose capacity doubles."""

    def __init__(self, key: torch.Tensor, upto: int):
        batch, heads, _, dim = key.shape
        self.buffer = key.new_empty(batch, heads, max(upto, 64), dim)
        self.length = 0
        self.shift_shape = None  # shape of the key positions' batch dimension (B|1,)
        self.fingerprint = None  # (B, H_kv, D): the sum of the keys rotated, as they were
        self.shift = None  # (B|1,): position − index of the keys

    def matches(self, key: torch.Tensor, k_pos: torch.Tensor, upto: int) -> bool:
        buf = self.buffer
        if (buf.shape[0], buf.shape[1], buf.shape[3]) != (key.shape[0], key.shape[1], key.shape[3]):
            return False
        if buf.dtype != key.dtype or buf.device != key.device or self.length > upto or self.length == 0:
            return False
        return self.shift_shape == tuple(k_pos[:, 0].shape)

    def continues(self, key: torch.Tensor, k_pos: torch.Tensor) -> bool:
        """Whether the cache still holds the keys the entry rotated, with the same position offsets (one host read:
        a beam-search reorder changes the rows, never the shapes). Every covered key counts, through their sum per
        row computed the same way as when they were rotated: the first layer's key at an index depends on that token
        alone, so two beams that share the last token but differ earlier differ only there (comparing the last key
        alone kept the other beam's group keys in every layer)."""
        if self.fingerprint is None or self.length > key.shape[2] or self.shift.shape != k_pos[:, 0].shape \
                or self.fingerprint.shape != key[:, :, 0].shape:
            return False
        same = torch.stack([(self.fingerprint == key[:, :, :self.length].sum(dim=2)).all(),
                            (self.shift == k_pos[:, 0]).all()])
        return bool(same.all())

    def append(self, rotated: torch.Tensor, key: torch.Tensor, k_pos: torch.Tensor, upto: int) -> None:
        if upto > self.buffer.shape[2]:
            grown = self.buffer.new_empty(*self.buffer.shape[:2], max(upto, 2 * self.buffer.shape[2]), self.buffer.shape[3])
            grown[:, :, :self.length] = self.buffer[:, :, :self.length]
            self.buffer = grown
        self.buffer[:, :, self.length:upto] = rotated
        self.length = upto
        self.shift_shape = tuple(k_pos[:, 0].shape)
        self.fingerprint = key[:, :, :upto].sum(dim=2)  # a new tensor: the cache may be written in place later
        self.shift = k_pos[:, 0].clone()

    def keys(self, upto: int) -> torch.Tensor:
        return self.buffer[:, :, :upto]


def make_self_extend(info: RopeInfo, inv_freq: Callable[[], torch.Tensor], layer_idx: int, *, group_size: int,
                     window_size: int, reach: int | None = None, chunk: int = QUERY_CHUNK) -> SelfExtendAttention:
    """Layer-attention factory for Self-Extend (Jin et al. 2024 §3), named by the method's :class:`AttentionSpec`.

    Only layer 0 warns when an input runs past ``reach``, so the warning fires once per installed model.
    """
    if reach is None:
        reach = self_extend_reach(info.window, group_size, window_size)
    return SelfExtendAttention(inv_freq, group_size, window_size, reach=reach, warn_past_reach=layer_idx == 0,
                               chunk=chunk)

