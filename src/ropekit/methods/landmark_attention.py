"""Landmark attention (Mohtashami & Jaggi 2023, arXiv 2305.16300 §3.1–3.2): the grouped softmax for
training and top-k block retrieval for inference.

Notation: keys are cut into blocks, each closed by a landmark token; ``p(j)`` is the block of key ``j``
(the number of landmarks strictly before it, so a landmark belongs to the block it closes) and ``L_p`` the
landmark of block ``p``. For a query ``i`` with logits ``s_ij = q_i·k_j·scale`` (already RoPE-rotated):

**Grouped softmax (§3.1).** Keys are grouped: ``G_ij = main`` for the regular keys of the query's own block
and for the landmarks of earlier blocks, ``G_ij = p(j)`` for the regular keys of an earlier block. The
softmax is taken within each group, ``σ_ij = exp(s_ij) / Σ_{l: G_il = G_ij} exp(s_il)``, and the attention
weight is

* ``a_ij = σ_ij``                 for a regular key of the query's own block,
* ``a_ij = σ_{i,L_p(j)} · σ_ij``   for a regular key of an earlier block (its landmark gates the block),
* ``a_ij = 0``                    for a landmark (it only gates; the own block's landmark, when the query
  is that landmark itself, is not attended at all).

Written with log-sum-exps: ``a_ij = exp(A_ij − Z_i)`` with ``A_ij = s_ij`` (own block),
``A_ij = s_ij + s_{i,L_p} − lse_p`` (earlier block, ``lse_p`` the log-sum-exp of the block's regular
logits), ``A_ij = −∞`` (landmarks), and ``Z_i`` the log-sum-exp of the main group (own-block logits and
gates). Since ``Σ_{j∈p} exp(s_ij + s_{i,L_p} − lse_p) = exp(s_{i,L_p})`` the weights sum to one — except
that a gated block with no visible token loses its share, exactly as in the paper's formula.
:func:`grouped_logits` builds ``A`` and ``Z``; gradients flow through the gates and the block
log-sum-exps as through the formula.

**Inference (§3.2).** With the KV cache holding every key (landmark keys included), each query, per head,
scores the landmarks of the blocks older than its local window (the own block and ``local_blocks``
blocks before it), keeps the ``top_k`` best, and attends to the local window and the kept blocks through
the same grouped softmax — the blocks not kept drop out of the main group. Positions: the kept blocks are
moved, in their original order, to the positions right before the local window, and candidates are
scored as if at the farthest of those places (what the reference implementation does for all but its
most recent blocks), so no relative position exceeds ``(local_blocks + 1 + top_k)`` blocks. When
``top_k`` covers every older block the moved positions are the true ones and the result is the training
computation (tested to 1e-5). The retrieval path needs the regular layout :mod:`~ropekit.methods.landmark`
produces: key ``j`` is a landmark exactly when ``j % (mem_freq + 1) == mem_freq``.

The queries and keys arrive rotated at their true positions; moving a block is one more rotation of the
query (``q·R(δ)k = (R(−δ)q)·k``), and scoring at a fixed position rotates the landmark keys back to 0
(:func:`_raw_landmarks`). Queries go in chunks, so memory is O(chunk × keys). Which
pairs exist (causality, padding) comes from :class:`~ropekit.attention.masks.AttentionMask`, in any mask
format transformers passes.

**Speed.** In the aligned layout (what ropekit's landmark insertion produces, and what retrieval needs) a key's
group is a function of its index, so the logits of a chunk are reshaped to (…, blocks, block) and the grouped
softmax is a softmax within every block rescaled by the block's share of the main group (its gate, or the own
block's log-sum-exp; :func:`aligned_grouped_part`): two matrix products and a few passes over the logits, which are
written into one buffer per call and overwritten in place when no gradient is taken. Other layouts (irregular blocks in a
hand-built batch) go key by key through :func:`grouped_logits`. Retrieved blocks are gathered per query and head
with ``index_select`` from one row per (KV head, block).

**Per pair.** Both computations are one grouped softmax over a set of kept keys with logits at some
positions: the weights are ``exp(A − Z)`` of :func:`grouped_logits`, where for retrieval the kept keys are
the local window and the kept blocks and the logits of a kept block are taken at its moved position.
:meth:`LandmarkAttention.pair_logits` states exactly that, per (query, key) pair.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..core.rope import rotate
from ..core.rope_info import RopeInfo
from ..errors import RopekitError
from ..attention.interface import PairLogits, plain_pair_logits
from ..attention.kernels import merge_attention, pair_scores, pair_values
from ..attention.masks import AttentionMask, query_key_positions

#: Keyword argument through which the model-side hooks hand each layer the landmark layout of its keys.
LANDMARKS_KWARG = "ropekit_landmarks"
#: Largest number of logits (and gathered key elements) a query chunk may hold on a CPU, and the least anywhere.
CHUNK_ELEMENTS = 1 << 24
#: On a CUDA device a chunk may hold up to this share of the free memory (in 4-byte elements), and at most
#: ACCELERATOR_CHUNK_ELEMENTS: a chunk is some fifty small kernels, so at Llama-3-8B's shapes at 32k the CPU
#: budget would cut a layer into thousands of launches of seven query rows each.
ACCELERATOR_FREE_SHARE = 16
ACCELERATOR_CHUNK_ELEMENTS = 1 << 28
#: Query rows of a retrieval chunk, in blocks (at most; fewer when CHUNK_ELEMENTS says so).
LOCAL_CHUNK_BLOCKS = 4
NEG_INF = float("-inf")


@dataclass
class LandmarkInputs:
    """What every layer needs to know about one forward's keys (set by :mod:`~ropekit.attention.landmark_stream`).

    ``is_landmark`` (B, keys): which keys — cached ones first, then this call's tokens — are landmarks.
    ``output_index`` (n,): for plain-id input, the position of each plain token's output among this call's
    positions (``None`` when the caller's ids already held landmarks).
    """

    is_landmark: torch.Tensor
    output_index: torch.Tensor | None = None


# ---- the grouped softmax (§3.1) -------------------------------------------------------------------------------
def block_ids(is_landmark: torch.Tensor) -> torch.Tensor:
    """Block of every key: the number of landmarks strictly before it (a landmark closes its own block)."""
    count = is_landmark.long()
    return torch.cumsum(count, -1) - count


def _closing_landmark(is_landmark: torch.Tensor) -> torch.Tensor:
    """For every key the index of the first landmark at or after it (``Lk`` when there is none)."""
    k_len = is_landmark.shape[-1]
    index = torch.arange(k_len, device=is_landmark.device).expand_as(is_landmark)
    marked = torch.where(is_landmark, index, torch.full_like(index, k_len))
    return torch.flip(torch.cummin(torch.flip(marked, [-1]), dim=-1).values, [-1])


def _segment_logsumexp(values: torch.Tensor, segment: torch.Tensor, segments: int) -> torch.Tensor:
    """Log-sum-exp of ``values`` (…, Lk; −∞ = left out) within each segment id (…, Lk), gathered back to
    every key (−∞ for an empty segment). The maximum used for stability carries no gradient."""
    shape = values.shape[:-1] + (segments,)
    peak = torch.full(shape, NEG_INF, dtype=values.dtype, device=values.device)
    peak = peak.scatter_reduce(-1, segment, values.detach(), reduce="amax", include_self=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    weights = torch.exp(values - peak.gather(-1, segment))
    total = torch.zeros(shape, dtype=values.dtype, device=values.device).scatter_add(-1, segment, weights)
    filled = total > 0
    lse = torch.where(filled, torch.log(torch.where(filled, total, torch.ones_like(total))) + peak,
                      torch.full_like(total, NEG_INF))
    return lse.gather(-1, segment)


def grouped_logits(scores: torch.Tensor, is_landmark: torch.Tensor, allowed: torch.Tensor,
                   query_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Adjusted logits ``A`` (B, H, Lq, Lk) and main-group log-sum-exp ``Z`` (B, H, Lq) of the grouped
    softmax of §3.1: the attention weights are ``exp(A − Z)`` (module docstring).

    ``scores`` (B, H, Lq, Lk) float logits; ``is_landmark`` (B or 1, Lk); ``allowed`` bool broadcastable to
    ``scores`` (causality and padding); ``query_index`` (Lq,) the key index of each query.
    """
    batch, heads, q_len, k_len = scores.shape
    is_landmark = is_landmark.expand(batch, k_len)
    block = block_ids(is_landmark)  # (B, Lk)
    q_block = block[:, query_index]  # (B, Lq)
    same = block[:, None, None, :] == q_block[:, None, :, None]  # (B, 1, Lq, Lk)
    landmark = is_landmark[:, None, None, :]
    ok = allowed & ~(same & landmark)  # a block's own landmark is never attended from inside the block
    own = ok & same
    earlier = ok & ~same & ~landmark
    gates_at_landmarks = torch.where(ok & ~same & landmark, scores, torch.full_like(scores, NEG_INF))
    main = torch.logsumexp(torch.where(own, scores, gates_at_landmarks), dim=-1)
    padded = torch.cat([gates_at_landmarks, scores.new_full((batch, heads, q_len, 1), NEG_INF)], dim=-1)
    closing = _closing_landmark(is_landmark)[:, None, None, :].expand(batch, heads, q_len, k_len)
    gate = padded.gather(-1, closing)  # s_{i, L_p(j)} for every key j (−∞ when the landmark is not visible)
    segments = max(1, k_len)  # block ids are < Lk: a bound from shapes (reading block.max() would sync the host)
    earlier = earlier.expand(batch, heads, q_len, k_len)
    block_lse = _segment_logsumexp(torch.where(earlier, scores, torch.full_like(scores, NEG_INF)),
                                   block[:, None, None, :].expand(batch, heads, q_len, k_len), segments)
    gated = torch.where(earlier, scores + gate - torch.where(earlier, block_lse, torch.zeros_like(block_lse)),
                        torch.full_like(scores, NEG_INF))
    return torch.where(own, scores, gated), main


def _weights(adjusted: torch.Tensor, main: torch.Tensor) -> torch.Tensor:
    """``exp(A − Z)``; a query whose main group is empty attends to nothing (weights 0)."""
    main = torch.where(torch.isinf(main), torch.zeros_like(main), main)
    return torch.exp(adjusted - main[..., None])


def _score_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def chunk_budget(device: torch.device) -> int:
    """Elements a query chunk may hold on ``device``: :data:`CHUNK_ELEMENTS` on a CPU (larger chunks there only
    add first-touch page faults) and on shape-only devices (``meta``, which the memory table counts on); on
    CUDA, 1/:data:`ACCELERATOR_FREE_SHARE` of the memory free now, between :data:`CHUNK_ELEMENTS` and
    :data:`ACCELERATOR_CHUNK_ELEMENTS`."""
    if device.type != "cuda":
        return CHUNK_ELEMENTS
    free, _ = torch.cuda.mem_get_info(device)
    return int(min(max(CHUNK_ELEMENTS, free // (4 * ACCELERATOR_FREE_SHARE)), ACCELERATOR_CHUNK_ELEMENTS))


def _chunk_rows(elements_per_row: int, limit: int = CHUNK_ELEMENTS) -> int:
    return max(1, limit // max(1, elements_per_row))


def grouped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_landmark: torch.Tensor,
                      mask: AttentionMask, scaling: float, *, dropout: float = 0.0, training: bool = False,
                      chunk: int | None = None, block: int | None = None) -> torch.Tensor:
    """Landmark attention with the grouped softmax over every block (§3.1; the training computation).

    ``query`` (B, H, Lq, D), ``key``/``value`` (B, H_kv, Lk, D) rotated, the queries being the last ``Lq``
    keys; ``is_landmark`` (B, Lk); ``mask`` the pairs that exist. Returns (B, H, Lq, D).
    ``block``: when every row has the aligned layout of that block size (:func:`aligned_layout`, what ropekit's
    landmark insertion produces), :func:`aligned_grouped_part` computes it; any other layout goes key by key.
    """
    batch, heads, q_len, _ = query.shape
    k_len = key.shape[2]
    offset = k_len - q_len  # grouped-query heads are folded into rows (pair_scores/pair_values): no K/V copy per head
    if block is not None and aligned_layout(is_landmark, block):
        rows = chunk or _chunk_rows(batch * heads * k_len, chunk_budget(query.device))
        scratch = _scratch(query, min(rows, q_len), k_len)
        outs = []
        for a in range(0, q_len, rows):
            b = min(a + rows, q_len)
            hi = -(-(b + offset) // block) * block  # causal: no row attends past key b + offset − 1
            out, _ = aligned_grouped_part(query, key, value, mask, a, b, 0, hi, block=block, scaling=scaling,
                                          dropout=dropout if training else 0.0, scratch=scratch)
            outs.append(out)
        return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
    rows = chunk or _chunk_rows(batch * heads * k_len * 4, chunk_budget(query.device))
    outs = []
    for a in range(0, q_len, rows):
        b = min(a + rows, q_len)
        hi = b + offset  # causal: no row of the chunk attends past key hi − 1
        scores = pair_scores(query[:, :, a:b], key[:, :, :hi]).to(_score_dtype(query.dtype))
        adjusted, main = grouped_logits(scores * scaling, is_landmark[:, :hi], mask.block(a, b, 0, hi),
                                        torch.arange(a, b, device=query.device) + offset)
        probs = _weights(adjusted, main)
        if training and dropout > 0.0:
            probs = torch.nn.functional.dropout(probs, p=dropout)
        outs.append(pair_values(probs, value[:, :, :hi]))
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


# ---- the grouped softmax in the aligned layout: blocks as a tensor dimension -------------------------------
def _scratch(query: torch.Tensor, rows: int, width: int) -> torch.Tensor | None:
    """One logits buffer for every chunk of a call (``rows`` queries × ``width`` keys at most), where no gradient
    is taken: a fresh tensor of this size per chunk costs about as much again in first-touch page faults on CPU."""
    if torch.is_grad_enabled():
        return None
    batch, heads = query.shape[:2]
    return torch.empty(batch * heads * rows * width, dtype=_score_dtype(query.dtype), device=query.device)


def aligned_grouped_part(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: AttentionMask,
                         a: int, b: int, k0: int, k1: int, *, block: int, scaling: float,
                         first_local: torch.Tensor | None = None, dropout: float = 0.0,
                         scratch: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The grouped softmax (§3.1) of query rows ``[a, b)`` over keys ``[k0, k1)`` in the aligned layout (key ``j`` is a
    landmark exactly when ``j % block == block − 1``), computed with the blocks as a tensor dimension instead of
    the per-key groups of :func:`grouped_logits`.

    Returns ``(out, Z)``: ``out = Σ_j exp(A_ij − Z_i) v_j`` (B, H, c, D) and the main group's log-sum-exp ``Z``
    (B, H, c), ``A`` and ``Z`` as in :func:`grouped_logits`. Per query ``i`` and key block ``p`` (its regular keys
    ``R_p``, landmark ``L_p``), the weights factor into the softmax within the block and the block's share of the
    main group:

        ``a_ij = σ_p(j) · exp(t_ip − Z_i)``,  ``σ_p(j) = exp(s_ij − lse_ip)``,  ``Z_i = log Σ_p exp(t_ip)``,

    with ``t_ip = lse_ip`` (``log Σ_{j∈R_p} exp(s_ij)``) for the query's own block and ``t_ip = s_{i,L_p}`` (the gate)
    for any other — the own block's keys get ``exp(s_ij − Z_i)``, an earlier block's
    ``exp(s_ij − lse_p + s_{i,L_p} − Z_i)`` (§3.1), landmarks 0. So one softmax over each block's ``block`` logits
    (PyTorch's fused kernel: one pass over them) and one rescaling by a (query, block) factor; the log-sum-exp of a
    block is needed only for the own block. Keys the mask hides are set to the dtype's lowest finite value, not
    −∞, so that the softmax of a block with nothing visible stays finite — its factor is 0.

    ``k0`` and ``k1`` are multiples of ``block``; ``k1`` may pass the last key (the last block, whose landmark has
    not come yet): the logits are padded there, the keys and values are not copied.
    ``first_local`` (c,): the first block each row may attend (§3.2's local window); earlier blocks drop out.
    ``dropout``: applied to the weights (training). Without gradients the logits buffer is reused in place on CPU
    (one score matrix per chunk in memory), and it is ``scratch`` when given (:func:`_scratch`).
    """
    batch, heads, rows, _ = query[:, :, a:b].shape
    blocks = (k1 - k0) // block
    device = query.device
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    q = query[:, :, a:b].to(_score_dtype(query.dtype)) * scaling
    real = min(k1, key.shape[2])
    scores = pair_scores(q, key[:, :, k0:real], out=None if grad else scratch)  # (B, H, c, ·)
    hidden = torch.finfo(scores.dtype).min
    key_index = torch.arange(k0, real, device=device)
    row_index = torch.arange(a, b, device=device) + mask.offset
    block_index = torch.arange(k0 // block, k0 // block + blocks, device=device)
    if mask.is_causal:  # only the diagonal corner holds keys some row may not see
        d0 = max(0, a + mask.offset + 1 - k0)
        if d0 < real - k0:
            future = key_index[None, d0:] > row_index[:, None]
            if grad:
                scores = torch.cat([scores[..., :d0], scores[..., d0:].masked_fill(future, hidden)], dim=-1)
            else:
                scores[..., d0:].masked_fill_(future, hidden)
        # a block shows a regular key to a row exactly when its first key is not in the row's future
        filled = (block_index * block)[None, :] <= row_index[:, None]  # (c, blocks)
    else:
        seen = mask.block(a, b, k0, real)
        scores = scores.masked_fill(~seen, hidden)
        seen = torch.nn.functional.pad(seen, (0, k1 - real), value=False) if real < k1 else seen
        filled = seen.unflatten(-1, (blocks, block))[..., :-1].any(-1)  # (B|1, 1|H, c, blocks)
    if real < k1:  # the last, unfinished block (one chunk per call)
        scores = torch.nn.functional.pad(scores, (0, k1 - real), value=hidden)
    tiled = scores.unflatten(-1, (blocks, block))  # (B, H, c, blocks, block)
    gate = tiled[..., -1]  # s_{i, L_p}; a hidden landmark gates nothing
    gate = torch.where(gate > hidden, gate, torch.full_like(gate, NEG_INF))
    if grad:
        tiled = torch.cat([tiled[..., :-1], torch.full_like(tiled[..., -1:], hidden)], dim=-1)
    else:
        tiled[..., -1] = hidden  # a landmark only gates: it is no key of its own block's softmax
    own_block = row_index // block - k0 // block  # (c,) in [0, blocks)
    own_logits = tiled[:, :, torch.arange(rows, device=device), own_block]  # (B, H, c, block)
    own_filled = filled[..., torch.arange(rows, device=device), own_block]  # (B|1, 1|H, c) or (c,)
    own_lse = torch.where(own_filled, torch.logsumexp(own_logits, dim=-1), torch.full_like(own_logits[..., 0], NEG_INF))
    if not grad and tiled.device.type == "cpu":
        # PyTorch's CPU softmax over the last dimension reads each row before it writes it, so in place is exact
        # (tested against the paper's reference) and keeps one logits buffer per chunk
        probs = torch.softmax(tiled, dim=-1, out=tiled)
    else:
        probs = torch.softmax(tiled, dim=-1)

    own = block_index[None, :] == (row_index // block)[:, None]  # (c, blocks)
    # the main group: the own block's keys (together: their lse) and the gates of the other blocks; a gate counts
    # even when its block shows no key (that block's share is lost, as in the paper's formula)
    top = torch.where(own, own_lse[..., None], gate)
    if first_local is not None:
        top = torch.where(block_index[None, :] >= first_local[:, None], top, torch.full_like(top, NEG_INF))
    main = torch.logsumexp(top, dim=-1)  # Z (B, H, c): −∞ when the main group is empty
    live = filled & torch.isfinite(top) & torch.isfinite(main)[..., None]
    zero = torch.zeros_like(top)
    factor = torch.where(live, torch.exp(torch.where(live, top - main[..., None], zero)), zero)[..., None]
    probs = probs * factor if grad else probs.mul_(factor)
    if dropout > 0.0:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    return pair_values(probs.flatten(-2)[..., :real - k0], value[:, :, k0:real]), main


# ---- top-k retrieval (§3.2) ------------------------------------------------------------------------------------
def aligned_layout(is_landmark: torch.Tensor, block: int) -> bool:
    """Whether key ``j`` is a landmark exactly when ``j % block == block − 1`` in every row."""
    k_len = is_landmark.shape[-1]
    expected = torch.arange(k_len, device=is_landmark.device) % block == block - 1
    return bool((is_landmark == expected).all())


def _rotate_per_head(x: torch.Tensor, offsets: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate vectors ``x`` (…, D) by ``offsets`` (…) further positions (half-split layout, partial rotary kept)."""
    wide = _score_dtype(x.dtype)
    freqs = offsets[..., None].to(wide) * inv_freq.to(device=x.device, dtype=wide)
    emb = torch.cat((freqs, freqs), dim=-1)
    return rotate(x, emb.cos().to(x.dtype), emb.sin().to(x.dtype))


def retrieval_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: AttentionMask,
                        q_pos: torch.Tensor, k_pos: torch.Tensor, *, block: int, top_k: int, local_blocks: int,
                        inv_freq: torch.Tensor, scaling: float, chunk: int | None = None,
                        identical_landmarks: bool = False) -> torch.Tensor:
    """Landmark inference (§3.2): per query and head, the local window plus the ``top_k`` best older blocks,
    attended through the grouped softmax with the kept blocks moved next to the local window.

    ``identical_landmarks``: every landmark key is the same vector before rotation (the first layer, whose
    input is the landmark token's embedding), so every candidate scores the same and the tie rule alone
    decides — the newest blocks — without computing scores that would differ only by rounding.

    Shapes as :func:`grouped_attention`; ``q_pos`` (B or 1, Lq) and ``k_pos`` (B or 1, Lk) the positions the
    queries and keys were rotated at; keys in the aligned layout (:func:`aligned_layout`).
    """
    batch, heads, q_len, dim = query.shape
    k_len = key.shape[2]
    device = query.device
    offset = k_len - q_len
    full_blocks = k_len // block
    landmark_index = torch.arange(full_blocks, device=device) * block + block - 1
    rows_b = torch.arange(batch, device=device)[:, None, None, None]
    q_pos = q_pos.expand(batch, q_len)
    k_pos = k_pos.expand(batch, k_len)
    raw_landmarks = _raw_landmarks(key, k_pos, landmark_index, heads, inv_freq)
    # (B, H_kv, blocks, block·D) views, gathered row by row with index_select (4x the speed of advanced indexing on
    # this path's shapes)
    key_blocks = key[:, :, :full_blocks * block].unflatten(2, (full_blocks, block)).flatten(3)
    value_blocks = value[:, :, :full_blocks * block].unflatten(2, (full_blocks, block)).flatten(3)

    picks = max(1, min(top_k, full_blocks))
    per_row = heads * (k_len + full_blocks + picks * block * (dim + 1))
    # a chunk's local part spans its own rows' keys plus the window before them, most of which only the later rows
    # keep: past a few blocks, taller chunks add work no row needs (2.5x the prefill time at 2k tokens, block 32)
    rows = chunk or min(_chunk_rows(batch * per_row, chunk_budget(device)), LOCAL_CHUNK_BLOCKS * block)
    gathered = batch * heads * min(rows, q_len) * picks
    # a chunk's local keys: its rows' own blocks and the `local_blocks` before the first row's
    scratch = _scratch(query, min(rows, q_len), min(k_len, (local_blocks + 2) * block + min(rows, q_len)))
    buffers = (key_blocks.new_empty(gathered, block * dim), value_blocks.new_empty(gathered, block * dim))
    outs = []
    for a in range(0, q_len, rows):
        b = min(a + rows, q_len)
        q = query[:, :, a:b]  # (B, H, c, D)
        # the plain causal mask shows every key before the local window: nothing to read for the older blocks
        allowed = None if mask.is_causal else mask.block(a, b, 0, k_len).expand(batch, 1, b - a, k_len)
        q_index = torch.arange(a, b, device=device) + offset  # key index of each query
        first_local = torch.clamp(q_index // block - local_blocks, min=0)  # first block of the local window
        # from shapes (no host read): first_local grows with the row, so its min/max are the first/last row's
        lo, hi = max(0, (a + offset) // block - local_blocks) * block, b + offset

        # the local window: own block and `local_blocks` before it, at true positions
        local, local_main = aligned_grouped_part(query, key, value, mask, a, b, lo,
                                                 -(-hi // block) * block, block=block, scaling=scaling,
                                                 first_local=first_local, scratch=scratch)

        older = max(0, (b - 1 + offset) // block - local_blocks)  # most older blocks any query of the chunk has
        if top_k > 0 and older > 0:
            mem_logits, mem_gates, mem_values = _retrieved_blocks(
                q, q_index, first_local, allowed, q_pos[:, a:b], k_pos, raw_landmarks, key_blocks,
                value_blocks, landmark_index[:older], rows_b, block=block, top_k=top_k,
                inv_freq=inv_freq, scaling=scaling, identical_landmarks=identical_landmarks, buffers=buffers)
            # the kept blocks as a part of their own: normalised over their gates, then merged with the local part
            # by the two log-sum-exps — the main group of §3.2 is the local window's plus the kept gates
            mem_main = torch.logsumexp(mem_gates, dim=-1)
            probs = _weights(mem_logits.flatten(3), mem_main).to(mem_values.dtype)
            retrieved = torch.einsum("bhck,bhckd->bhcd", probs, mem_values.flatten(3, 4))
            local, _ = merge_attention([(local, local_main), (retrieved, mem_main)])
        outs.append(local)
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def _raw_landmarks(key, k_pos, landmark_index, heads, inv_freq) -> torch.Tensor:
    """Landmark keys rotated back to position 0, per KV head: (B, H_kv, blocks, D) in float32
    (float64 only for float64 inputs; never float64 on an accelerator that runs a half-precision model).

    At position 0 a query can score all of them at one distance. Stable in float32: the angle of the rotation
    back, ``(−p)·θ_i``, is rounded exactly as the model's own rotation ``p·θ_i`` was (one float32 product, the
    sign exact), so the two cancel up to the rounding of cos/sin — the ranking is decided by the keys, not by an
    angle error that would grow with the position ``p``."""
    raw = _rotate_per_head(key[:, :, landmark_index].to(_score_dtype(key.dtype)), -k_pos[:, None, landmark_index],
                           inv_freq)
    return raw  # query head h scores KV head h // g (pair_scores): never copied per query head


def _select_blocks(q, q_index, first_local, allowed, q_pos, k_pos, raw_landmarks, landmark_index, *, block, top_k,
                   inv_freq, identical_landmarks):
    """The §3.2 choice for a block of query rows: ``picked`` block indices, ``kept`` flags and the ``shift``
    that moves each kept block next to the local window, each (B, H, c, k) with ``k = min(top_k, older)``.

    ``allowed`` (B, 1, c, Lk) the rows' mask (None: every key before the window is visible), ``q_pos`` (B, c) their positions, ``landmark_index`` the
    landmarks of the ``older`` blocks that may lie before some row's window."""
    batch, heads, rows, _ = q.shape
    older = landmark_index.numel()
    device = q.device
    # candidates: blocks before the local window whose landmark the query may see (padding)
    candidate = (torch.arange(older, device=device)[None, :] < first_local[:, None])[None]
    candidate = candidate.expand(batch, rows, older) if allowed is None else candidate & allowed[:, 0][..., landmark_index]
    chosen = torch.clamp(candidate.sum(-1), max=top_k)  # (B, c) blocks each query keeps
    picks = min(top_k, older)
    window_offset = q_index - first_local * block  # query's distance from the start of its local window
    # score every candidate as if its landmark sat at the farthest kept place: `chosen` blocks before the window
    score_at = window_offset[None] + chosen * block - (block - 1)  # relative distance query → landmark
    if identical_landmarks:  # every score is the same: only the tie rule is left
        scores = torch.zeros(batch, heads, rows, older, dtype=raw_landmarks.dtype, device=device)
    else:  # the query moved to the relative distance `score_at` (small), landmarks at 0
        q_scoring = _rotate_per_head(q.to(raw_landmarks.dtype), (score_at - q_pos)[:, None], inv_freq)
        scores = pair_scores(q_scoring, raw_landmarks[:, :, :older]).to(raw_landmarks.dtype)
    scores = scores.masked_fill(~candidate[:, None], NEG_INF)
    # the best `picks`; equal scores go to the more recent block (at layer 0 every landmark key is the same
    # token's, so all scores tie there up to rounding)
    newest_first = torch.sort(scores.flip(-1), dim=-1, descending=True, stable=True)
    best = newest_first.values[..., :picks]
    picked = older - 1 - newest_first.indices[..., :picks]  # (B, H, c, k)
    kept = torch.isfinite(best)
    order_key = torch.where(kept, picked, torch.full_like(picked, -1))  # dropped picks first, then block order
    order_key, _ = order_key.sort(dim=-1)
    kept = order_key >= 0
    picked = order_key.clamp(min=0)

    # move kept block s (of k places) so that its landmark sits (k − s) blocks before the local window
    slot = torch.arange(picks, device=device)
    window_start = q_pos - window_offset[None]  # (B, c) position of the window's first token
    target = window_start[:, None, :, None] - (picks - slot) * block + (block - 1)  # (B, 1, c, k)
    landmark_pos = k_pos[:, landmark_index]  # (B, older)
    current = landmark_pos.gather(1, picked.flatten(1)).view_as(picked)  # (B, H, c, k)
    shift = torch.where(kept, target - current, torch.zeros_like(current))
    return picked, kept, shift


def _retrieved_blocks(q, q_index, first_local, allowed, q_pos, k_pos, raw_landmarks, key_blocks, value_blocks,
                      landmark_index, rows_b, *, block, top_k, inv_freq, scaling, identical_landmarks,
                      buffers):
    """Adjusted logits (B, H, c, k, block; the landmark's −∞), gate logits (B, H, c, k) and values (B, H, c, k, block, D)
    of the kept older blocks of one query chunk (§3.2), in the grouped-softmax form of :func:`grouped_logits`.
    ``key_blocks``/``value_blocks`` (B, H_kv, blocks, block·D): one row per block. ``buffers``: two tensors of at
    least ``B·H·c·k`` rows of ``block·D``, which the gathered keys and values are written to."""
    batch, heads, rows, dim = q.shape
    device = q.device
    picked, kept, shift = _select_blocks(q, q_index, first_local, allowed, q_pos, k_pos, raw_landmarks, landmark_index,
                                         block=block, top_k=top_k, inv_freq=inv_freq,
                                         identical_landmarks=identical_landmarks)
    picks = picked.shape[-1]
    q_moved = _rotate_per_head(q[:, :, :, None, :].expand(batch, heads, rows, picks, dim), -shift, inv_freq)

    blocks, group = key_blocks.shape[2], heads // key_blocks.shape[1]
    # into buffers kept across the chunks (a fresh tensor this size costs as much again in first-touch page faults);
    # query heads of one KV head are adjacent, so each (row, KV head) pair fills one contiguous slice
    gathered = batch * heads * rows * picks
    keys = buffers[0][:gathered].view(batch, key_blocks.shape[1], group * rows * picks, block * dim)
    vals = buffers[1][:gathered].view(batch, key_blocks.shape[1], group * rows * picks, block * dim)
    if torch.is_grad_enabled() and (key_blocks.requires_grad or value_blocks.requires_grad):  # out= has no autograd
        keys, vals = ([torch.index_select(table[b, h], 0, picked[b, h * group:(h + 1) * group].flatten())
                       for b in range(batch) for h in range(key_blocks.shape[1])] for table in (key_blocks, value_blocks))
        keys, vals = torch.stack(keys), torch.stack(vals)
    else:
        for b in range(batch):
            for h in range(key_blocks.shape[1]):
                index = picked[b, h * group:(h + 1) * group].flatten()
                torch.index_select(key_blocks[b, h], 0, index, out=keys[b, h])
                torch.index_select(value_blocks[b, h], 0, index, out=vals[b, h])
    keys = keys.view(batch, heads, rows, picks, block, dim)
    vals = vals.view(batch, heads, rows, picks, block, dim)
    logits = torch.einsum("bhckd,bhcktd->bhckt", q_moved, keys).to(_score_dtype(q.dtype)) * scaling
    if allowed is None:
        visible = kept[..., None].expand(*kept.shape, block)
    else:
        visible = allowed[:, 0][..., :blocks * block].reshape(batch, rows, -1, block)  # (B, c, blocks, block)
        visible = visible[rows_b, torch.arange(rows, device=device)[None, None, :, None], picked]  # (B, H, c, k, block)
        visible = visible & kept[..., None]
    gate = torch.where(visible[..., -1], logits[..., -1], torch.full_like(logits[..., -1], NEG_INF))
    regular = torch.where(visible[..., :-1], logits[..., :-1], torch.full_like(logits[..., :-1], NEG_INF))
    lse = torch.logsumexp(regular, dim=-1, keepdim=True)
    lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    adjusted = torch.where(visible[..., :-1], regular + gate[..., None] - lse, torch.full_like(regular, NEG_INF))
    # the landmark's own logit is no weight (−∞): its value, gathered with its block, is multiplied by 0
    adjusted = torch.cat([adjusted, torch.full_like(adjusted[..., :1], NEG_INF)], dim=-1)
    return adjusted, gate, vals


def retrieval_pair_logits(query: torch.Tensor, key: torch.Tensor, is_landmark: torch.Tensor, mask: AttentionMask,
                          rows: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, *, block: int, top_k: int,
                          local_blocks: int, inv_freq: torch.Tensor, scaling: float,
                          identical_landmarks: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """§3.2 pair by pair for the query ``rows``: ``(A, Z)`` of :func:`grouped_logits` over the keys a query keeps
    — its local window (own block and ``local_blocks`` before it) at true positions, and the blocks
    :func:`_select_blocks` keeps, every logit of such a block taken with the query moved by ``−shift``
    (``(R(−δ)q)·k``). Naive: (B, H, rows, Lk) logits, one full pass over the keys per kept slot."""
    batch, heads, q_len, _ = query.shape
    k_len = key.shape[2]
    device = query.device
    rows = rows.to(device)
    q = query[:, :, rows]
    q_index = rows + (k_len - q_len)
    first_local = torch.clamp(q_index // block - local_blocks, min=0)
    allowed = mask.rows(rows).expand(batch, 1, rows.numel(), k_len)
    q_pos, k_pos = q_pos.expand(batch, q_len)[:, rows], k_pos.expand(batch, k_len)
    keys = torch.arange(k_len, device=device)
    logits = pair_scores(q, key) * scaling  # at the true positions
    kept = allowed & (keys[None, :] >= (first_local * block)[:, None])[None, None]  # the local window
    older = int(first_local.max()) if rows.numel() else 0
    if top_k > 0 and older > 0:
        landmark_index = torch.arange(k_len // block, device=device) * block + block - 1
        raw = _raw_landmarks(key, k_pos, landmark_index, heads, inv_freq)
        picked, chosen, shift = _select_blocks(q, q_index, first_local, allowed, q_pos, k_pos, raw,
                                               landmark_index[:older], block=block, top_k=top_k, inv_freq=inv_freq,
                                               identical_landmarks=identical_landmarks)
        kept = kept.expand(batch, heads, rows.numel(), k_len)
        key_block = keys // block
        for slot in range(picked.shape[-1]):
            member = (key_block == picked[..., slot, None]) & chosen[..., slot, None]  # (B, H, c, Lk)
            moved = pair_scores(_rotate_per_head(q, -shift[..., slot], inv_freq), key) * scaling
            logits = torch.where(member, moved, logits)
            kept = kept | (member & allowed)
    return grouped_logits(logits, is_landmark, kept, q_index)


# ---- the layer attention ----------------------------------------------------------------------------------
class LandmarkAttention:
    """One layer's Landmark attention (LayerAttention protocol of :mod:`ropekit.attention.interface`).

    Training mode (or ``top_k = 0``): :func:`grouped_attention`. Eval mode: :func:`retrieval_attention`.
    Keys without any landmark (an input shorter than one block) make the grouped softmax a plain softmax,
    so the model's own kernel runs then — bit-identical to the unmodified model.
    """

    def __init__(self, inv_freq: Callable[[], torch.Tensor], mem_freq: int, top_k: int, local_blocks: int,
                 chunk: int | None = None, first_layer: bool = False):
        self.inv_freq = inv_freq
        self.first_layer = first_layer  # its landmark keys are all the landmark embedding's: retrieval ties
        self.block = int(mem_freq) + 1
        self.top_k = int(top_k)
        self.local_blocks = int(local_blocks)
        self.chunk = chunk

    def __repr__(self) -> str:
        return f"LandmarkAttention(block={self.block}, top_k={self.top_k}, local_blocks={self.local_blocks})"

    def _layout(self, landmarks: LandmarkInputs | None, key: torch.Tensor) -> torch.Tensor | None:
        """The landmark flags of the keys (B, Lk), or None when there is no landmark (plain attention)."""
        if landmarks is None or not bool(landmarks.is_landmark.any()):
            return None
        is_landmark = landmarks.is_landmark.to(key.device)
        if is_landmark.shape[-1] != key.shape[2]:
            raise RopekitError(
                f"landmark attention: {key.shape[2]} keys but a landmark layout for {is_landmark.shape[-1]}",
                "use a dynamic or static KV cache (no sliding window) and call the model itself, not its layers")
        return is_landmark

    def _retrieves(self, module, is_landmark: torch.Tensor) -> bool:
        """Eval mode with ``top_k > 0``: §3.2 retrieval (which needs the aligned layout); else §3.1."""
        if module.training or self.top_k == 0:
            return False
        if not aligned_layout(is_landmark, self.block):
            raise RopekitError(
                f"landmark retrieval needs a landmark after every {self.block - 1} tokens from the first one",
                "pass plain ids (ropekit inserts the landmarks) or ids from ropekit.methods.landmark.insert_landmarks")
        return True

    def __call__(self, module, query, key, value, attention_mask, *, scaling, dropout=0.0, kernel, **kwargs):
        is_landmark = self._layout(kwargs.pop(LANDMARKS_KWARG, None), key)
        if is_landmark is None:
            return kernel(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        mask = AttentionMask.for_call(attention_mask, query, key, kwargs)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        if not self._retrieves(module, is_landmark):
            out = grouped_attention(query, key, value, is_landmark, mask, scale, dropout=dropout,
                                    training=module.training, chunk=self.chunk, block=self.block)
        else:
            q_pos, k_pos = query_key_positions(kwargs.get("position_ids"), query.shape[2], key.shape[2], query.device)
            out = retrieval_attention(query, key, value, mask, q_pos, k_pos, block=self.block, top_k=self.top_k,
                                      local_blocks=self.local_blocks, inv_freq=self.inv_freq().to(query.device),
                                      scaling=scale, chunk=self.chunk, identical_landmarks=self.first_layer)
        return out.to(query.dtype).transpose(1, 2).contiguous(), None

    def pair_logits(self, module, query, key, attention_mask, *, scaling, rows, **kwargs) -> PairLogits:
        """The grouped softmax pair by pair (:class:`~ropekit.attention.interface.PairRule`): the adjusted
        logits ``A`` and the main-group log-sum-exp ``Z`` of :func:`grouped_logits` (weights ``exp(A − Z)``;
        ``Z`` is returned because a gated block with no visible token loses its share, so the weights need
        not sum to one) — over every block in training mode (§3.1), over the local window and the kept
        blocks at their moved positions in eval mode (§3.2, :func:`retrieval_pair_logits`)."""
        is_landmark = self._layout(kwargs.get(LANDMARKS_KWARG), key)
        if is_landmark is None:
            return plain_pair_logits(query, key, attention_mask, scaling=scaling, rows=rows, **kwargs)
        mask = AttentionMask.for_call(attention_mask, query, key, kwargs)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        rows = rows.to(query.device)
        if not self._retrieves(module, is_landmark):
            scores = pair_scores(query[:, :, rows], key) * scale
            adjusted, main = grouped_logits(scores, is_landmark, mask.rows(rows), rows + (key.shape[2] - query.shape[2]))
        else:
            q_pos, k_pos = query_key_positions(kwargs.get("position_ids"), query.shape[2], key.shape[2], query.device)
            adjusted, main = retrieval_pair_logits(query, key, is_landmark, mask, rows, q_pos, k_pos, block=self.block,
                                                   top_k=self.top_k, local_blocks=self.local_blocks,
                                                   inv_freq=self.inv_freq().to(query.device), scaling=scale,
                                                   identical_landmarks=self.first_layer)
        return PairLogits(adjusted, adjusted != NEG_INF, main)


def make_landmark(info: RopeInfo, inv_freq: Callable[[], torch.Tensor], layer_idx: int, *, mem_freq: int, top_k: int,
                  local_blocks: int, chunk: int | None = None) -> LandmarkAttention:
    """Layer-attention factory for Landmark attention, named by the method's :class:`AttentionSpec`."""
    return LandmarkAttention(inv_freq, mem_freq, top_k, local_blocks, chunk=chunk, first_layer=layer_idx == 0)

