"""Landmark attention against naive per-query references written from the paper's definitions (Mohtashami &
Jaggi 2023 §3.1 grouped softmax, §3.2 top-k retrieval): random queries, keys and landmark layouts, GQA,
padding and KV-cache offsets; gradients too."""

from __future__ import annotations

import pytest
import torch

from ropekit.methods.landmark_attention import (
    aligned_layout,
    grouped_attention,
    retrieval_attention,
)
from ropekit.attention.masks import AttentionMask
from ropekit.core.rope import default_inv_freq


# ---- independent references ------------------------------------------------------------------------------
def rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Plain RoPE (half-split layout) of vectors ``x`` (…, D) at positions ``pos`` (…)."""
    angles = pos.to(torch.float64)[..., None] * inv_freq.to(torch.float64)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos.to(x.dtype) + turned * sin.to(x.dtype)


def blocks_of(is_landmark: list[bool]) -> list[int]:
    """Block of each key: landmarks strictly before it."""
    out, seen = [], 0
    for flag in is_landmark:
        out.append(seen)
        seen += int(flag)
    return out


def grouped_weights(logits: dict[int, torch.Tensor], own: list[int], gates: dict[int, int],
                    members: dict[int, list[int]]) -> dict[int, torch.Tensor]:
    """The paper's a_ij for one query: ``own`` regular keys of the query's block, ``gates`` block → its landmark
    key, ``members`` block → its regular keys; ``logits`` key → s_ij. Landmarks get weight 0."""
    main = own + list(gates.values())
    sigma_main = torch.softmax(torch.stack([logits[j] for j in main]), 0)
    weights = {j: sigma_main[n] for n, j in enumerate(own)}
    for block, landmark in gates.items():
        gate = sigma_main[main.index(landmark)]
        group = members.get(block, [])
        if group:
            sigma = torch.softmax(torch.stack([logits[j] for j in group]), 0)
            for n, j in enumerate(group):
                weights[j] = gate * sigma[n]
    return weights


def naive_grouped(q, k, v, is_landmark, allowed, scale):
    """§3.1 pair by pair: groups G_ij, softmax per group, a_ij = σ_main(L_p)·σ_p(j) for earlier blocks."""
    batch, heads, q_len, _ = q.shape
    k_len, g = k.shape[2], heads // k.shape[1]
    out = torch.zeros(batch, heads, q_len, v.shape[-1], dtype=torch.float64)
    rows = []
    for b in range(batch):
        flags = [bool(x) for x in is_landmark[b]]
        block = blocks_of(flags)
        for h in range(heads):
            for t in range(q_len):
                i = k_len - q_len + t
                visible = [j for j in range(k_len) if bool(allowed[min(b, allowed.shape[0] - 1), 0, t, j])]
                logits = {j: (q[b, h, t].double() @ k[b, h // g, j].double()) * scale for j in visible}
                own = [j for j in visible if block[j] == block[i] and not flags[j]]
                gates = {block[j]: j for j in visible if flags[j] and block[j] < block[i]}
                members = {}
                for j in visible:
                    if not flags[j] and block[j] < block[i]:
                        members.setdefault(block[j], []).append(j)
                if not own and not gates:
                    continue
                weights = grouped_weights(logits, own, gates, members)
                rows.append((b, h, t, sum(w * v[b, h // g, j].double() for j, w in weights.items())))
    for b, h, t, value in rows:
        out[b, h, t] = value
    return out


def naive_retrieval(q_raw, k_raw, v, allowed, q_pos, k_pos, *, block, top_k, local_blocks, inv_freq, scale,
                    newest=False):
    """§3.2 from unrotated vectors: candidates scored with their landmark at the farthest kept place, the
    best ``top_k`` kept in original order right before the local window, grouped softmax over all of it.
    ``newest``: all scores tie (identical landmark keys), so the newest candidates are kept."""
    batch, heads, q_len, _ = q_raw.shape
    k_len, g = k_raw.shape[2], heads // k_raw.shape[1]
    out = torch.zeros(batch, heads, q_len, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for t in range(q_len):
                i = k_len - q_len + t
                ok = allowed[min(b, allowed.shape[0] - 1), 0, t]
                own_block = i // block
                first = max(0, own_block - local_blocks)
                qv = rope(q_raw[b, h, t].double(), q_pos[b, t], inv_freq)
                kv = k_raw[b, h // g].double()
                candidates = [p for p in range(first) if bool(ok[p * block + block - 1])]
                keep = min(top_k, len(candidates))
                window_start = int(q_pos[b, t]) - (i - first * block)
                scored_at = window_start - keep * block + block - 1
                score = {p: qv @ rope(kv[p * block + block - 1], torch.tensor(scored_at), inv_freq) for p in candidates}
                ranked = sorted(candidates, key=lambda p: -p)  # ties: newer first (sorted() is stable)
                if not newest:
                    ranked = sorted(ranked, key=lambda p: -float(score[p].detach()))
                chosen = sorted(ranked[:keep])
                position = {j: int(k_pos[b, j]) for j in range(first * block, i + 1)}
                for r, p in enumerate(chosen):
                    start = window_start - (keep - r) * block
                    position.update({p * block + m: start + m for m in range(block)})
                visible = [j for j in sorted(position) if bool(ok[j])]
                logits = {j: (qv @ rope(kv[j], torch.tensor(position[j]), inv_freq)) * scale for j in visible}
                is_lm = {j: j % block == block - 1 for j in visible}
                own = [j for j in visible if j // block == own_block and not is_lm[j]]
                gates = {j // block: j for j in visible if is_lm[j] and j // block < own_block}
                members = {}
                for j in visible:
                    if not is_lm[j] and j // block < own_block:
                        members.setdefault(j // block, []).append(j)
                if not own and not gates:
                    continue
                weights = grouped_weights(logits, own, gates, members)
                out[b, h, t] = sum(w * v[b, h // g, j].double() for j, w in weights.items())
    return out


# ---- helpers ----------------------------------------------------------------------------------------------
def random_inputs(seed, batch=2, heads=4, kv_heads=2, q_len=20, k_len=20, dim=8, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, dim, generator=gen, dtype=dtype)
    k = torch.randn(batch, kv_heads, k_len, dim, generator=gen, dtype=dtype)
    v = torch.randn(batch, kv_heads, k_len, dim, generator=gen, dtype=dtype)
    return q, k, v, gen


def aligned(k_len, block, batch=2):
    return (torch.arange(k_len) % block == block - 1)[None].expand(batch, -1)


def mask_of(attention_mask, q_len, k_len):
    """The mask the attention reads and, for the naive references, its (B|1, 1, Lq, Lk) booleans."""
    mask = AttentionMask(attention_mask, q_len, k_len)
    return mask, mask.block(0, q_len, 0, k_len)


# ---- grouped softmax -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("q_len", [23, 7, 1])
def test_grouped_softmax_equals_the_paper_definition(q_len):
    """Irregular blocks per row, GQA, queries at the end of the keys (a cache), every chunk size."""
    q, k, v, gen = random_inputs(0, q_len=q_len, k_len=23)
    is_landmark = torch.rand(2, 23, generator=gen) < 0.25
    mask, allowed = mask_of(None, q_len, 23)
    ref = naive_grouped(q, k, v, is_landmark, allowed, 0.35)
    for chunk in (None, 3):
        got = grouped_attention(q, k, v, is_landmark, mask, 0.35, chunk=chunk)
        torch.testing.assert_close(got, ref, atol=1e-10, rtol=1e-10)


def test_grouped_softmax_with_padding_and_landmark_queries():
    """Left padding (2-D mask) and a row whose landmarks sit in the padding: a gate that is masked switches
    its block off; a landmark query attends to its own block's tokens, not to itself."""
    q, k, v, _ = random_inputs(1, q_len=18, k_len=18)
    is_landmark = aligned(18, 4).clone()
    padding = torch.ones(2, 18, dtype=torch.long)
    padding[1, :6] = 0
    mask, allowed = mask_of(padding, 18, 18)
    got = grouped_attention(q, k, v, is_landmark, mask, 0.5)
    ref = naive_grouped(q, k, v, is_landmark, allowed, 0.5)
    real = padding[:, None, :, None].bool().expand_as(got)
    torch.testing.assert_close(got[real], ref[real], atol=1e-10, rtol=1e-10)


def test_grouped_softmax_gradients_match_the_reference():
    q, k, v, gen = random_inputs(2, q_len=15, k_len=15)
    is_landmark = aligned(15, 5)
    mask, allowed = mask_of(None, 15, 15)
    weight = torch.randn(2, 4, 15, 8, generator=gen, dtype=torch.float64)
    grads = []
    for fn in (lambda *a: grouped_attention(*a, is_landmark, mask, 0.4),
               lambda *a: naive_grouped(*a, is_landmark, allowed, 0.4)):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        (fn(*leaves) * weight).sum().backward()
        grads.append([t.grad for t in leaves])
    for got, ref in zip(*grads):
        torch.testing.assert_close(got, ref, atol=1e-9, rtol=1e-9)


def test_without_landmarks_the_grouped_softmax_is_plain_attention():
    q, k, v, _ = random_inputs(3, q_len=12, k_len=12, kv_heads=4)
    mask, _ = mask_of(None, 12, 12)
    got = grouped_attention(q, k, v, torch.zeros(2, 12, dtype=torch.bool), mask, 0.3)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("q_len,k_len,block,chunk", [(23, 23, 4, None), (23, 23, 4, 5), (9, 30, 5, 4),
                                                    (1, 26, 6, None), (30, 30, 7, 11)])
def test_aligned_layout_blocks_as_a_dimension_equal_the_paper_definition(q_len, k_len, block, chunk):
    """The aligned layout's path (blocks as a tensor dimension, the logits buffer reused in place): causal mask,
    a cache offset, a last block without its landmark yet, chunks that cut blocks — against the key-by-key
    reference of §3.1."""
    q, k, v, _ = random_inputs(20 + block, q_len=q_len, k_len=k_len)
    is_landmark = aligned(k_len, block)
    mask, allowed = mask_of(None, q_len, k_len)
    ref = naive_grouped(q, k, v, is_landmark, allowed, 0.35)
    with torch.no_grad():
        got = grouped_attention(q, k, v, is_landmark, mask, 0.35, chunk=chunk, block=block)
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=1e-10)


def test_aligned_path_is_the_one_taken(monkeypatch):
    """With ``block`` given and the aligned layout, the key-by-key groups are not built at all; with another
    layout they are."""
    import ropekit.methods.landmark_attention as landmark_attention
    calls = []
    real = landmark_attention.grouped_logits
    monkeypatch.setattr(landmark_attention, "grouped_logits", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v, _ = random_inputs(3, q_len=12, k_len=12)
    mask, _ = mask_of(None, 12, 12)
    grouped_attention(q, k, v, aligned(12, 4), mask, 0.3, block=4)
    assert calls == []
    grouped_attention(q, k, v, torch.roll(aligned(12, 4), 1, dims=1), mask, 0.3, block=4)
    assert calls


@pytest.mark.parametrize("pads", [6, 3])
def test_aligned_path_with_padding_and_gradients(pads):
    """Left padding (the mask read key by key) and gradients through the blocked computation, against the
    reference's. Three pads hide the first block's tokens but not its landmark: the gate still takes its share
    of the main group, which its empty block then loses (§3.1's formula)."""
    q, k, v, gen = random_inputs(21, q_len=17, k_len=17)
    is_landmark = aligned(17, 4)
    padding = torch.ones(2, 17, dtype=torch.long)
    padding[1, :pads] = 0
    mask, allowed = mask_of(padding, 17, 17)
    weight = torch.randn(2, 4, 17, 8, generator=gen, dtype=torch.float64)
    weight[1, :, :pads] = 0  # padded queries: their output is undefined
    grads, outs = [], []
    for fn in (lambda *a: grouped_attention(*a, is_landmark, mask, 0.4, block=4, chunk=5),
               lambda *a: naive_grouped(*a, is_landmark, allowed, 0.4)):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves)
        (out * weight).sum().backward()
        outs.append(out.detach() * (weight != 0))
        grads.append([t.grad for t in leaves])
    torch.testing.assert_close(outs[0], outs[1], atol=1e-10, rtol=1e-10)
    for got, ref in zip(*grads):
        torch.testing.assert_close(got, ref, atol=1e-9, rtol=1e-9)


# ---- retrieval -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("q_len", [40, 9, 1])
def test_retrieval_covering_every_block_equals_full_attention(q_len):
    """top_k ≥ number of older blocks: the kept blocks sit at their true positions, so retrieval is the
    training computation over the same tokens (float32, to 1e-5)."""
    block, k_len = 5, 40
    q, k, v, _ = random_inputs(4, q_len=q_len, k_len=k_len, dtype=torch.float32)
    inv_freq = default_inv_freq(10000.0, 8)
    pos = torch.arange(k_len)[None].expand(2, -1) + torch.tensor([[0], [7]])  # the second row starts at 7
    q_rot, k_rot = rope(q, pos[:, None, -q_len:], inv_freq), rope(k, pos[:, None], inv_freq)
    is_landmark = aligned(k_len, block)
    mask, _ = mask_of(None, q_len, k_len)
    full = grouped_attention(q_rot, k_rot, v, is_landmark, mask, 0.35)
    for local_blocks in (0, 2):
        got = retrieval_attention(q_rot, k_rot, v, mask, pos[:, -q_len:], pos, block=block, top_k=k_len // block,
                                  local_blocks=local_blocks, inv_freq=inv_freq, scaling=0.35, chunk=4)
        torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("top_k,local_blocks", [(1, 0), (2, 1), (3, 2)])
def test_top_k_retrieval_equals_the_naive_definition(top_k, local_blocks):
    """Fewer kept blocks than older ones: selection per query and head, re-positioning, grouped softmax —
    against the reference built from unrotated vectors; with left padding in one row."""
    block, k_len, q_len = 4, 36, 30
    q, k, v, _ = random_inputs(5 + top_k, q_len=q_len, k_len=k_len)
    inv_freq = default_inv_freq(100.0, 8)
    pos = torch.arange(k_len)[None].expand(2, -1) - torch.tensor([[0], [5]])  # row 1: 5 padding keys first
    padding = torch.ones(2, k_len, dtype=torch.long)
    padding[1, :5] = 0
    mask, allowed = mask_of(padding, q_len, k_len)
    q_rot, k_rot = rope(q, pos[:, None, -q_len:], inv_freq), rope(k, pos[:, None], inv_freq)
    got = retrieval_attention(q_rot, k_rot, v, mask, pos[:, -q_len:], pos, block=block, top_k=top_k,
                              local_blocks=local_blocks, inv_freq=inv_freq, scaling=0.4, chunk=7)
    ref = naive_retrieval(q, k, v, allowed, pos[:, -q_len:], pos, block=block, top_k=top_k,
                          local_blocks=local_blocks, inv_freq=inv_freq, scale=0.4)
    torch.testing.assert_close(got, ref, atol=1e-9, rtol=1e-9)


def test_top_k_retrieval_under_the_causal_mask_with_a_cache():
    """The causal mask (no padding: the local window's diagonal masked in place), queries after a cache, the
    last block without its landmark, chunks that cut blocks — against the reference."""
    block, k_len, q_len = 5, 47, 29
    q, k, v, _ = random_inputs(12, q_len=q_len, k_len=k_len)
    inv_freq = default_inv_freq(100.0, 8)
    pos = torch.arange(k_len)[None].expand(2, -1)
    mask, allowed = mask_of(None, q_len, k_len)
    q_rot, k_rot = rope(q, pos[:, None, -q_len:], inv_freq), rope(k, pos[:, None], inv_freq)
    ref = naive_retrieval(q, k, v, allowed, pos[:, -q_len:], pos, block=block, top_k=2, local_blocks=2,
                          inv_freq=inv_freq, scale=0.4)
    for chunk in (None, 7):
        with torch.no_grad():
            got = retrieval_attention(q_rot, k_rot, v, mask, pos[:, -q_len:], pos, block=block, top_k=2,
                                      local_blocks=2, inv_freq=inv_freq, scaling=0.4, chunk=chunk)
        torch.testing.assert_close(got, ref, atol=1e-9, rtol=1e-9)


def test_top_k_retrieval_gradients_match_the_reference():
    """Retrieval with inputs that need gradients (eval mode under autograd): the gathered blocks keep their graph,
    and the gradients equal those of the naive §3.2 reference."""
    block, k_len, q_len = 4, 20, 14
    q, k, v, gen = random_inputs(13, q_len=q_len, k_len=k_len)
    inv_freq = default_inv_freq(100.0, 8)
    pos = torch.arange(k_len)[None].expand(2, -1)
    mask, allowed = mask_of(None, q_len, k_len)
    weight = torch.randn(2, 4, q_len, 8, generator=gen, dtype=torch.float64)
    grads = []
    for use_kernel in (True, False):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        if use_kernel:
            q_rot, k_rot = rope(leaves[0], pos[:, None, -q_len:], inv_freq), rope(leaves[1], pos[:, None], inv_freq)
            out = retrieval_attention(q_rot, k_rot, leaves[2], mask, pos[:, -q_len:], pos, block=block, top_k=1,
                                      local_blocks=1, inv_freq=inv_freq, scaling=0.4, chunk=5)
        else:
            out = naive_retrieval(*leaves, allowed, pos[:, -q_len:], pos, block=block, top_k=1, local_blocks=1,
                                  inv_freq=inv_freq, scale=0.4)
        (out * weight).sum().backward()
        grads.append([t.grad for t in leaves])
    for got, ref in zip(*grads):
        torch.testing.assert_close(got, ref, atol=1e-8, rtol=1e-8)


def test_identical_landmark_keys_keep_the_newest_blocks():
    """The first layer: every landmark key is the landmark embedding's, so all candidates tie and the newest
    ``top_k`` are kept (not whichever rounding favours)."""
    block, k_len, q_len = 4, 32, 20
    q, k, v, _ = random_inputs(11, q_len=q_len, k_len=k_len)
    k[:, :, block - 1::block] = k[:, :, block - 1:block]  # one landmark vector before rotation
    inv_freq = default_inv_freq(100.0, 8)
    pos = torch.arange(k_len)[None].expand(2, -1)
    mask, allowed = mask_of(None, q_len, k_len)
    q_rot, k_rot = rope(q, pos[:, None, -q_len:], inv_freq), rope(k, pos[:, None], inv_freq)
    got = retrieval_attention(q_rot, k_rot, v, mask, pos[:, -q_len:], pos, block=block, top_k=2, local_blocks=1,
                              inv_freq=inv_freq, scaling=0.4, identical_landmarks=True)
    ref = naive_retrieval(q, k, v, allowed, pos[:, -q_len:], pos, block=block, top_k=2, local_blocks=1,
                          inv_freq=inv_freq, scale=0.4, newest=True)
    torch.testing.assert_close(got, ref, atol=1e-9, rtol=1e-9)


def test_retrieval_differs_from_full_attention_when_blocks_are_dropped():
    """The check above is not vacuous: with k = 1 of many blocks the output changes."""
    block, k_len = 4, 32
    q, k, v, _ = random_inputs(9, q_len=k_len, k_len=k_len)
    inv_freq = default_inv_freq(10000.0, 8)
    pos = torch.arange(k_len)[None]
    mask, _ = mask_of(None, k_len, k_len)
    full = grouped_attention(q, k, v, aligned(k_len, block), mask, 0.4)
    got = retrieval_attention(q, k, v, mask, pos, pos, block=block, top_k=1, local_blocks=0, inv_freq=inv_freq,
                              scaling=0.4)
    assert (got - full).abs().max() > 1e-2
    torch.testing.assert_close(got[:, :, :block], full[:, :, :block])  # no older block yet: identical


def test_aligned_layout():
    assert aligned_layout(aligned(12, 4), 4)
    shifted = torch.roll(aligned(12, 4), 1, dims=1)
    assert not aligned_layout(shifted, 4)


# ---- chunk sizes per device ------------------------------------------------------------------------------------
def test_chunk_budget_grows_with_free_accelerator_memory_and_stays_fixed_on_cpu(monkeypatch):
    """A CPU (and the shape-only meta device) keeps 2**24 elements per query chunk; on CUDA a chunk takes 1/16 of
    the free memory in 4-byte elements, never less than the CPU budget nor more than 2**28 (1 GiB of float32)."""
    from ropekit.methods import landmark_attention as L

    free = {"bytes": 0}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 80 << 30))
    assert L.chunk_budget(torch.device("cpu")) == 1 << 24
    assert L.chunk_budget(torch.device("meta")) == 1 << 24
    for free_bytes, expected in ((70 << 30, 1 << 28), (4 << 30, 1 << 26), (100 << 20, 1 << 24)):
        free["bytes"] = free_bytes
        assert L.chunk_budget(torch.device("cuda", 0)) == expected


def test_retrieval_chunks_follow_the_device_budget_without_changing_the_result(monkeypatch):
    """A larger budget means fewer, taller query chunks (what the accelerator budget buys) and the same output."""
    from ropekit.methods import landmark_attention as L

    block, k_len = 4, 96
    q, k, v, _ = random_inputs(21, q_len=k_len, k_len=k_len)
    inv_freq = default_inv_freq(10000.0, 8)
    pos = torch.arange(k_len)[None]
    mask, _ = mask_of(None, k_len, k_len)
    calls = []
    original = L.aligned_grouped_part
    monkeypatch.setattr(L, "aligned_grouped_part", lambda *a, **kw: calls.append(a[5] - a[4]) or original(*a, **kw))
    results = {}
    for budget in (600, 1 << 24):
        monkeypatch.setattr(L, "chunk_budget", lambda device, budget=budget: budget)
        calls.clear()
        results[budget] = (retrieval_attention(q, k, v, mask, pos, pos, block=block, top_k=2, local_blocks=2,
                                               inv_freq=inv_freq, scaling=0.3), list(calls))
    small, large = results[600][1], results[1 << 24][1]
    assert sum(small) == sum(large) == k_len
    assert max(small) < max(large) == 4 * block  # capped at LOCAL_CHUNK_BLOCKS blocks of rows
    torch.testing.assert_close(results[600][0], results[1 << 24][0], rtol=1e-12, atol=1e-12)
