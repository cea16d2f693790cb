"""Building blocks for attention-side methods: attention that also returns its log-sum-exp, exact merging
of attention over disjoint key sets, and extra RoPE rotations of already-rotated queries/keys.

Why log-sum-exp: a method that attends to two key sets under different position rules (Self-Extend's
neighbour and group parts, LM-Infinite's local and global parts) can compute each part with a fast
kernel and merge them *exactly*: with ``o_a, l_a`` and ``o_b, l_b`` the outputs and row log-sum-exps,
``l = logaddexp(l_a, l_b)`` and ``o = e^(l_a−l)·o_a + e^(l_b−l)·o_b`` — no n×n matrix is ever built.
"""

from __future__ import annotations

import math
import warnings
import weakref

import torch

from ..core.rope import rotate


def expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, H_kv, L, D) → (B, heads, L, D) for grouped-query attention (no copy when H_kv == heads)."""
    groups = heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def pair_scores(query: torch.Tensor, key: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``query (B, H, R, D) · key (B, H_kv, Lk, D)ᵀ`` → ``(B, H, R, Lk)`` in float32 (float64 inputs stay float64),
    without copying the keys per query head: query head ``h`` uses KV head ``h // (H / H_kv)``, as ``repeat_kv``.
    ``out``: a contiguous tensor of that dtype with at least ``B·H·R·Lk`` elements, written instead of a new one."""
    b, heads, rows, dim = query.shape
    kv = key.shape[1]
    wide = torch.promote_types(query.dtype, torch.float32)
    q = query.to(wide).reshape(b, kv, (heads // kv) * rows, dim)
    k = key.to(wide).transpose(-1, -2)
    if out is None:
        return torch.matmul(q, k).reshape(b, heads, rows, key.shape[2])
    target = out.view(-1)[:b * heads * rows * key.shape[2]].view(b, kv, (heads // kv) * rows, key.shape[2])
    return torch.matmul(q, k, out=target).view(b, heads, rows, key.shape[2])


def pair_values(probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``probs (B, H, R, Lk) · value (B, H_kv, Lk, D)`` → ``(B, H, R, D)`` in ``value``'s dtype, without copying the
    values per query head: the ``H / H_kv`` query heads of a KV head are folded into rows (as :func:`pair_scores`)."""
    b, heads, rows, k_len = probs.shape
    kv = value.shape[1]
    p = probs.to(value.dtype).reshape(b, kv, (heads // kv) * rows, k_len)
    return torch.matmul(p, value).reshape(b, heads, rows, value.shape[-1])


def _explicit_attention(query, key, value, bias, scale):
    """Reference path: this block's logits in float32, then softmax and its log-sum-exp.

    Half-precision queries and keys are multiplied as float32 copies: a bf16 product would round each logit to
    8 significant bits (±0.125 at a logit of 30, a 13 % change of its probability) before the softmax, where
    the fused kernels keep their logits in float32."""
    if query.dtype in (torch.bfloat16, torch.float16):
        query, key = query.float(), key.float()
    logits = torch.matmul(query, key.transpose(-1, -2)).float() * scale
    if bias is not None:
        logits = logits + bias.float()
    lse = torch.logsumexp(logits, dim=-1)
    probs = torch.exp(logits - lse.unsqueeze(-1).masked_fill(torch.isinf(lse).unsqueeze(-1), 0.0))
    return torch.matmul(probs.to(value.dtype), value), lse


def _cuda_efficient_attention(query, key, value, bias, scale):
    """PyTorch's memory-efficient CUDA kernel, which takes an additive bias and returns the log-sum-exp.

    The kernel wants the bias's last dimension 16-element aligned, so it is allocated padded and sliced.
    Its log-sum-exp comes padded to a multiple of 32 queries; the padding is cut off.
    """
    if bias is not None:
        b, h, lq, lk = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
        padded = torch.zeros(b, h, lq, lk + (-lk) % 16, dtype=query.dtype, device=query.device)
        padded[..., :lk] = bias
        bias = padded[..., :lk]
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        query.contiguous(), key.contiguous(), value.contiguous(), bias, True, 0.0, False, scale=scale
    )
    return out, lse[..., : query.shape[2]].float()


#: Device types that run PyTorch's fused memory-efficient kernel (``meta`` can be added to count a CUDA run's
#: allocations on shapes alone: scripts/attention_memory_table.py).
FUSED_DEVICES: tuple[str, ...] = ("cuda",)

#: (device type, dtype) → whether the fused CUDA kernel agreed with the explicit path on first use.
_FUSED_VERIFIED: dict[tuple[str, torch.dtype], bool] = {}


def _fused_cuda_or_explicit(query, key, value, bias, scale):
    """The fused kernel where it is available and was checked against the explicit path on this device.

    The first call per dtype runs both and compares them (outputs to the dtype's tolerance, log-sum-exps to
    1e-2); a kernel that is missing, raises, or disagrees is not used again and a warning says so — the
    explicit path is exact by construction, so a wrong fast path can only cost speed, never correctness.
    """
    tag = (query.device.type, query.dtype)
    verdict = _FUSED_VERIFIED.get(tag)
    if verdict is False:
        return _explicit_attention(query, key, value, bias, scale)
    try:
        fused = _cuda_efficient_attention(query, key, value, bias, scale)
    except (RuntimeError, NotImplementedError, AttributeError) as exc:
        _FUSED_VERIFIED[tag] = False
        warnings.warn(f"ropekit: fused CUDA attention unavailable ({exc}); using explicit blocks", stacklevel=3)
        return _explicit_attention(query, key, value, bias, scale)
    if verdict is None:
        ref_out, ref_lse = _explicit_attention(query, key, value, bias, scale)
        finite = torch.isfinite(ref_lse)
        tol = 1e-4 if query.dtype == torch.float32 else 2e-2
        ok = bool(
            torch.allclose(fused[0][finite].float(), ref_out[finite].float(), atol=tol, rtol=tol)
            and torch.allclose(fused[1][finite], ref_lse[finite], atol=1e-2, rtol=1e-3)
        )
        _FUSED_VERIFIED[tag] = ok
        if not ok:
            warnings.warn("ropekit: fused CUDA attention disagreed with the explicit path; using explicit blocks", stacklevel=3)
            return ref_out, ref_lse
    return fused


def attention_with_lse(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor | None,
    scale: float | None = None,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention restricted to ``allowed`` (bool, broadcastable to (B, H, Lq, Lk); None = all).

    ``causal=True`` (with ``allowed=None`` and ``Lq == Lk``) restricts query ``i`` to keys ``j ≤ i``: on CPU the
    fused kernel skips the blocks above the diagonal instead of reading a mask (half the work of a square block,
    no n × n mask); elsewhere the triangle is an explicit mask (callers keep such blocks small there).

    Returns ``out`` (B, H, Lq, D) and ``lse`` (B, H, Lq), the natural log of each row's softmax
    denominator; rows with no allowed key get ``out = 0`` and ``lse = −inf`` (they merge as nothing).
    On CPU it runs PyTorch's fused flash kernel, which returns the log-sum-exp; on CUDA the fused
    memory-efficient kernel (checked once per dtype against the explicit path, see
    :func:`_fused_cuda_or_explicit`); elsewhere it computes the logits of this block explicitly (callers
    keep blocks small).

    Grouped-query attention (``H = g · H_kv``) never copies keys or values per query head: the ``g`` query
    heads that share a KV head are folded into rows, ``(B, H, Lq, D) → (B, H_kv, g·Lq, D)`` (query head ``h``
    uses KV head ``h // g``, as transformers' ``repeat_kv``), and unfolded afterwards.
    """
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if causal:
        if allowed is not None or q_len != key.shape[2]:
            raise ValueError("attention_with_lse: causal=True takes a square block and no allowed mask")
        if runs_cpu_flash(query):
            # every row sees its diagonal key: no empty rows. Folding query heads into rows would break the triangle,
            # so grouped-query heads go to the kernel as they are where it takes them, else as copied KV heads.
            if heads != kv_heads and not CPU_FLASH_TAKES_GQA:
                key, value = expand_kv(key, heads), expand_kv(value, heads)
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                query, key, value, 0.0, True, scale=1.0 / math.sqrt(dim) if scale is None else scale)
            return out, lse.to(torch.float32)
        allowed = torch.ones(q_len, q_len, dtype=torch.bool, device=query.device).tril()
    if heads != kv_heads:
        g = heads // kv_heads
        folded_allowed = None
        if allowed is not None:
            a = allowed if allowed.dim() == 4 else allowed.expand(batch, heads, q_len, key.shape[2])
            if a.shape[1] == 1:  # the same for every head: repeat the rows g times
                folded_allowed = a.unsqueeze(2).expand(a.shape[0], 1, g, q_len, a.shape[-1]).reshape(
                    a.shape[0], 1, g * q_len, a.shape[-1])
            else:
                a = a.expand(a.shape[0], heads, q_len, a.shape[-1])
                folded_allowed = a.reshape(a.shape[0], kv_heads, g * q_len, a.shape[-1])
        out, lse = attention_with_lse(query.reshape(batch, kv_heads, g * q_len, dim), key, value, folded_allowed, scale)
        return out.reshape(batch, heads, q_len, out.shape[-1]), lse.reshape(batch, heads, q_len)
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    bias = None
    if allowed is not None:
        bias = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device).masked_fill(~allowed, float("-inf"))
    if runs_cpu_flash(query):
        if bias is not None:
            bias = bias.expand(query.shape[0], heads, query.shape[2], key.shape[2])
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, False, attn_mask=bias, scale=scale
        )
        lse = lse.to(torch.float32)
    elif query.device.type in FUSED_DEVICES and query.dtype in (torch.float32, torch.bfloat16, torch.float16):
        if bias is not None:
            bias = bias.expand(query.shape[0], heads, query.shape[2], key.shape[2])
        out, lse = _fused_cuda_or_explicit(query, key, value, bias, scale)
    else:
        out, lse = _explicit_attention(query, key, value, bias, scale)
    if allowed is not None:
        empty = ~allowed.any(dim=-1).expand(lse.shape)
        lse = lse.masked_fill(empty, float("-inf"))
        out = out.masked_fill(empty.unsqueeze(-1), 0.0)
    return out, lse


def merge_attention(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Exactly combine attention over disjoint key sets from their ``(out, lse)`` pairs.

    Half-precision parts are weighted and summed in float32 and rounded once at the end (the float32 online
    softmax of blockwise attention): summing bfloat16 terms would round every partial sum to 8 significant bits.
    Float32 parts are combined exactly as before."""
    lses = torch.stack([lse for _, lse in parts])
    total = torch.logsumexp(lses, dim=0)
    safe_total = total.masked_fill(torch.isinf(total), 0.0)
    dtype = parts[0][0].dtype
    wide = torch.promote_types(dtype, torch.float32)
    out = None
    for part_out, part_lse in parts:
        weight = torch.exp(part_lse - safe_total).unsqueeze(-1).to(wide)
        term = part_out.to(wide) * weight
        out = term if out is None else out + term
    return out.to(dtype), total


#: PyTorch's CPU flash kernel takes fewer KV heads than query heads from 2.9 on (pytorch/pytorch#157893, "[CPU]
#: Support GQA for flash attention"); before, grouped-query keys and values are copied per query head.
CPU_FLASH_TAKES_GQA = torch.__version__ >= (2, 9)  # a TorchVersion, compared as a version


def runs_cpu_flash(query: torch.Tensor) -> bool:
    """Whether PyTorch's fused CPU flash kernel (which returns the log-sum-exp) runs this block."""
    return query.device.type == "cpu" and query.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16)


#: Shared rotation tables: (kind, group, dtype, frequencies tensor identity) → (inv_freq, cos, sin), cos/sin of
#: shape (size, rot). The entry holds the frequencies tensor, so its storage cannot be reused by another tensor
#: while the entry lives (the identity stays unambiguous without reading its values, i.e. without a host sync).
_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
#: Tables kept at once (the least recently built goes first).
_TABLES_KEPT = 16
#: Smallest table built; tables grow geometrically (doubling) past it.
TABLE_MIN = 1024


def _table_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 tables for float32/float64 vectors; half-precision vectors take their own dtype's table — the
    rotation is then exactly what ``rotate`` in that dtype would compute from a float32 angle."""
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32


def offset_table(kind: str, group: int, size: int, inv_freq: torch.Tensor, dtype: torch.dtype):
    """``(cos, sin)`` of the move of a vector rotated at ``p`` to ``target(p)`` (:func:`move_angles`) for every
    position ``p < size`` — one table per (move rule, device, dtype, frequencies) shared by every layer and every
    layer-attention instance, grown by doubling (so a growing input rebuilds it O(log n) times), its angles computed
    in float64 and stored in the vectors' dtype where that is exact enough (:func:`_table_dtype`).

    ``kind`` names the move: ``"group_key"`` is Self-Extend's key move to ``⌊p/G⌋`` (Jin et al. 2024 §3,
    ``group`` = G); ``"unrotate"`` is the move to 0 (LM-Infinite's ``R_{−j}``). Built outside any traced graph, it is a constant
    to ``torch.compile``.
    """
    store_dtype = _table_dtype(dtype)
    tag = (kind, int(group), store_dtype, inv_freq.device, inv_freq.data_ptr(), inv_freq._version, tuple(inv_freq.shape))
    entry = _TABLES.get(tag)
    if entry is not None and entry[1].shape[0] >= size:
        return entry[1], entry[2]
    grown = 2 * entry[1].shape[0] if entry is not None else TABLE_MIN
    while grown < size:  # powers of two times TABLE_MIN: O(log n) rebuilds as an input grows
        grown *= 2
    pos = torch.arange(grown, device=inv_freq.device)
    if kind == "group_key":
        targets = torch.div(pos, group, rounding_mode="floor")
    elif kind == "unrotate":
        targets = torch.zeros_like(pos)
    else:
        raise ValueError(f"unknown offset table {kind!r}")
    angles = move_angles(pos, targets, inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    table = (emb.cos().to(store_dtype), emb.sin().to(store_dtype))
    _TABLES.pop(tag, None)
    while len(_TABLES) >= _TABLES_KEPT:
        _TABLES.pop(next(iter(_TABLES)))
    _TABLES[tag] = (inv_freq, *table)
    return table


def rotate_from_table(x: torch.Tensor, positions: torch.Tensor, table) -> torch.Tensor:
    """``x`` (B, H, L, D) rotated by the table's offsets at ``positions`` (B|1, L), all ≥ 0 and < table size."""
    cos, sin = table
    return rotate(x, cos[positions][:, None].to(x.dtype), sin[positions][:, None].to(x.dtype))


def _angle_dtype(device: torch.device) -> torch.dtype:
    """float64 for the angle arithmetic of a move, float32 where the device has no float64 (MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def move_angles(positions: torch.Tensor, targets, inv_freq: torch.Tensor) -> torch.Tensor:
    """Angles ``(…, rot/2)`` of the rotation that takes a vector the model rotated at ``positions`` to ``targets``.

    The model's rotary embedding (transformers: ``inv_freq.float() @ positions.float()``) rotated by the
    float32 product ``fl(p·θ)``, whose rounding grows with ``p`` (about ``p·θ·2⁻²⁴`` rad: 6e-3 at 100k for
    θ = 1). A move by ``(t − p)·θ`` in float32 would keep that error and add its own; this one is
    ``t·θ − fl(p·θ)`` in float64, so the moved vector sits at the exact angle ``t·θ`` up to the rounding of
    cos/sin — closer than a fresh float32 rotation to ``t`` would be. ``targets``: a tensor broadcastable
    with ``positions``, or an int.
    """
    theta = inv_freq.to(device=positions.device, dtype=torch.float32)
    applied = positions[..., None].to(torch.float32) * theta  # what the model's rotation used
    wide = _angle_dtype(positions.device)
    if not torch.is_tensor(targets):
        targets = torch.tensor(targets, device=positions.device)
    return targets[..., None].to(wide) * theta.to(wide) - applied.to(wide)


def rotate_to(x: torch.Tensor, positions: torch.Tensor, targets, inv_freq: torch.Tensor) -> torch.Tensor:
    """Move (B, H, L, D) vectors rotated at ``positions`` (B or 1, L) to ``targets`` (same shape, or an int).

    RoPE rotations compose, so a query rotated at its true position ``i`` and rotated again is the query at
    the target — without knowing the unrotated query, and without touching the attention factor already
    folded into it. The angle is :func:`move_angles` (exact target angle). Only the first
    ``2·len(inv_freq)`` channels rotate (half-split layout).
    """
    angles = move_angles(positions, targets, inv_freq)[:, None]
    emb = torch.cat((angles, angles), dim=-1)
    return rotate(x, emb.cos().to(x.dtype), emb.sin().to(x.dtype))


# ---- per-forward decisions ---------------------------------------------------------------------------------------
class _ForwardMemo:
    """What one forward's layers share: every layer of a model gets the same ``attention_mask`` and
    ``position_ids`` objects (transformers builds them once per forward), so decisions that need a host read of
    their values (is anything padded, how far apart are the positions, which query chunks have pairs of a kind)
    are made by the first layer and reused by the others — a constant number of host syncs per forward instead
    of a few per layer. Identified by those objects themselves (weak references, plus their in-place version
    counters) and the query/key lengths: a new forward, a new mask or new positions start a new memo."""

    def __init__(self):
        self.refs: tuple = ()
        self.sig: tuple | None = None
        self.values: dict = {}


_MEMO = _ForwardMemo()


def tensor_version(tensor) -> int:
    """A tensor's in-place version counter; inference-mode tensors keep none (and cannot change outside it): 0."""
    try:
        return tensor._version
    except (AttributeError, RuntimeError):
        return 0


def forward_memo(attention_mask, position_ids, q_len: int, k_len: int) -> dict:
    """The dict of decisions shared by the layers of the current forward (see :class:`_ForwardMemo`).

    With neither a mask nor positions, every decision follows from the lengths alone, and the memo is keyed by them.
    """
    objs = tuple(o for o in (attention_mask, position_ids) if o is not None)
    sig = (tuple((id(o), tensor_version(o)) for o in objs), attention_mask is None, position_ids is None,
           int(q_len), int(k_len))
    memo = _MEMO
    if memo.sig == sig and len(memo.refs) == len(objs) and all(r() is o for r, o in zip(memo.refs, objs)):
        return memo.values
    try:
        refs = tuple(weakref.ref(o) for o in objs)
    except TypeError:  # an object without weak references: no sharing (correct, only slower)
        return {}
    memo.refs, memo.sig, memo.values = refs, sig, {}
    return memo.values


def memoized(memo: dict, key, compute):
    """``memo[key]``, computed once with ``compute()`` per forward."""
    if key not in memo:
        memo[key] = compute()
    return memo[key]
