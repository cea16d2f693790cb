"""Long-context memory and host syncs of the Self-Extend and LM-Infinite attention paths.

* Both layer attentions trace under ``torch.compile(fullgraph=True)`` — a ``.item()``, ``int(tensor)``,
  ``bool(tensor)`` or a branch on tensor values would break the graph and fail the test — and the compiled
  functions equal naive O(n²) references written out here from the papers' rules (Self-Extend's per-position floors, Jin et al. 2024 §3; LM-Infinite's
  Λ rule), with the RoPE rotations computed from scratch in float64.
* Grouped-query attention never copies keys/values per query head.
* One rotation table is shared by every layer, and cached decoding rotates each key to its group position once.
"""

from __future__ import annotations

import pytest
import torch

from ropekit.attention import kernels
from ropekit.methods.lm_infinite_attention import LambdaAttention
from ropekit.methods.self_extend_attention import SelfExtendAttention

DIM = 16
INV_FREQ = 1.0 / (10000.0 ** (torch.arange(0, DIM, 2, dtype=torch.float64) / DIM))


def _rot(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """RoPE (half-split) of ``x`` (…, L, D) at ``pos`` (L,) in float64, from the definition."""
    ang = pos.double()[:, None] * INV_FREQ[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    half = x.shape[-1] // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x.double() * cos + rotated_half.double() * sin


def _inputs(batch=2, heads=4, kv_heads=2, q_len=40, k_len=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, DIM, generator=g) * 2
    k = torch.randn(batch, kv_heads, k_len, DIM, generator=g) * 2
    v = torch.randn(batch, kv_heads, k_len, DIM, generator=g)
    return q, k, v


def _naive(q_raw, k_raw, v, q_pos, k_pos, allowed, rule):
    """(B, Lq, H, D) float64: softmax over allowed pairs of the logit ``rule(i, j)`` gives as (query position,
    key position) to rotate to, or None to drop the pair; GQA: query head h uses KV head h // g."""
    b, h, lq, _ = q_raw.shape
    lk, g = k_raw.shape[2], h // k_raw.shape[1]
    out = torch.zeros(b, lq, h, v.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for r in range(lq):
                logits, vals = [], []
                for c in range(lk):
                    if not allowed[bi, r, c]:
                        continue
                    where = rule(int(q_pos[bi, r]), int(k_pos[bi, c]))
                    if where is None:
                        continue
                    qp, kp = where
                    qv = _rot(q_raw[bi, hi, r][None], torch.tensor([qp]))[0]
                    kv = _rot(k_raw[bi, hi // g, c][None], torch.tensor([kp]))[0]
                    logits.append((qv * kv).sum() / DIM ** 0.5)
                    vals.append(v[bi, hi // g, c].double())
                if logits:
                    w = torch.softmax(torch.stack(logits), 0)
                    out[bi, r, hi] = (w[:, None] * torch.stack(vals)).sum(0)
    return out


def _self_extend_rule(G, W):
    def rule(i, j):
        if i - j < W:
            return i, j
        return i // G + W - W // G, j // G
    return rule


def _lambda_rule(L, n_global):
    def rule(i, j):
        if i - j < L:
            return i, j
        if j < n_global:
            return L, 0
        return None
    return rule


def _compiled(attend):
    torch._dynamo.reset()

    def call(query, key, value, attention_mask, position_ids):
        return attend(None, query, key, value, attention_mask, scaling=DIM ** -0.5, kernel=None,
                      position_ids=position_ids)[0]

    return torch.compile(call, fullgraph=True, backend="aot_eager", dynamic=False)


CASES = ["prefill", "padded_prefill", "decode", "chunked"]


def _case(name):
    """(q_raw, k_raw, v, attention_mask or None, position_ids (B, Lq), q_pos, k_pos, allowed (B, Lq, Lk))."""
    batch, n = 2, 40
    q_len = {"prefill": n, "padded_prefill": n, "decode": 1, "chunked": 7}[name]
    q, k, v = _inputs(batch=batch, q_len=q_len, k_len=n)
    k_idx = torch.arange(n)
    pad = torch.zeros(batch, dtype=torch.long)
    if name == "padded_prefill":
        pad = torch.tensor([0, 9])  # row 1 left-padded by 9: its real tokens start at position 0
    k_pos = (k_idx[None, :] - pad[:, None]).clamp(min=0)
    q_pos = k_pos[:, n - q_len:]
    real = k_idx[None, :] >= pad[:, None]
    causal = k_idx[None, :] <= (k_idx[n - q_len:])[:, None]
    allowed = causal[None] & real[:, None, :]
    # transformers' 4-D bool (sdpa) mask where it builds one (padding; a chunk after cached keys)
    mask = None if name in ("prefill", "decode") else allowed[:, None]
    q_rot = torch.stack([_rot(q[b], q_pos[b]) for b in range(batch)]).float()
    k_rot = torch.stack([_rot(k[b], k_pos[b]) for b in range(batch)]).float()
    return q, k, v, q_rot, k_rot, mask, q_pos, k_pos, allowed


@pytest.mark.parametrize("case", CASES)
def test_self_extend_traces_without_host_sync_and_matches_naive(case):
    G, W = 3, 8
    q, k, v, q_rot, k_rot, mask, q_pos, k_pos, allowed = _case(case)
    attend = SelfExtendAttention(lambda: INV_FREQ.float(), G, W, chunk=16)
    got = _compiled(attend)(q_rot, k_rot, v, mask, q_pos)
    want = _naive(q, k, v, q_pos, k_pos, allowed, _self_extend_rule(G, W))
    real_rows = allowed.any(-1)
    torch.testing.assert_close(got.double()[real_rows], want[real_rows], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", CASES)
def test_lm_infinite_traces_without_host_sync_and_matches_naive(case):
    L, n_global = 10, 3
    q, k, v, q_rot, k_rot, mask, q_pos, k_pos, allowed = _case(case)
    attend = LambdaAttention(L, n_global, lambda: INV_FREQ.float(), chunk_size=16)
    got = _compiled(attend)(q_rot, k_rot, v, mask, q_pos)
    want = _naive(q, k, v, q_pos, k_pos, allowed, _lambda_rule(L, n_global))
    real_rows = allowed.any(-1)
    torch.testing.assert_close(got.double()[real_rows], want[real_rows], rtol=1e-4, atol=1e-4)


def test_eager_paths_match_the_same_naive_references():
    """The eager (fast, branching) paths give what the traced ones give: the naive rule."""
    for case in CASES:
        q, k, v, q_rot, k_rot, mask, q_pos, k_pos, allowed = _case(case)
        real_rows = allowed.any(-1)
        for attend, rule in ((SelfExtendAttention(lambda: INV_FREQ.float(), 3, 8, chunk=16), _self_extend_rule(3, 8)),
                             (LambdaAttention(10, 3, lambda: INV_FREQ.float(), chunk_size=16), _lambda_rule(10, 3))):
            got = attend(None, q_rot, k_rot, v, mask, scaling=DIM ** -0.5, kernel=_sdpa_kernel, position_ids=q_pos)[0]
            want = _naive(q, k, v, q_pos, k_pos, allowed, rule)
            torch.testing.assert_close(got.double()[real_rows], want[real_rows], rtol=1e-4, atol=1e-4, msg=case)


def _sdpa_kernel(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    g = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)
    causal = attention_mask is None and query.shape[2] > 1
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           is_causal=causal, scale=scaling)
    return out.transpose(1, 2), None


def test_gqa_never_copies_keys_per_query_head(monkeypatch):
    """attention_with_lse folds grouped query heads into rows: no repeat_interleave of keys/values, and the
    result equals plain attention over keys repeated per head (torch's sdpa)."""
    q, k, v = _inputs(batch=2, heads=8, kv_heads=2, q_len=12, k_len=30)
    allowed = torch.rand(2, 1, 12, 30, generator=torch.Generator().manual_seed(1)) > 0.3
    want = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1),
                                                            attn_mask=allowed)
    monkeypatch.setattr(torch.Tensor, "repeat_interleave",
                        lambda *a, **kw: (_ for _ in ()).throw(AssertionError("keys copied per query head")))
    out, lse = kernels.attention_with_lse(q, k, v, allowed)
    assert out.shape == (2, 8, 12, DIM) and lse.shape == (2, 8, 12)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_one_rotation_table_for_all_layers():
    """Every layer's Self-Extend shares one cos/sin table per (rule, device, dtype, frequencies), grown by
    doubling; its rotations equal computing them from the definition."""
    kernels._TABLES.clear()
    inv = INV_FREQ.float()
    layers = [SelfExtendAttention(lambda: inv, 4, 8) for _ in range(6)]
    key = torch.randn(1, 2, 3000, DIM, generator=torch.Generator().manual_seed(3))
    pos = torch.arange(3000)[None]
    outs = [layer._rotate_keys_to_groups(key, pos, inv) for layer in layers]
    tables = [t for tag, t in kernels._TABLES.items() if tag[0] == "group_key"]
    assert len(tables) == 1 and tables[0][1].shape[0] == 4096  # 1024 → doubled past 3000
    want = torch.stack([_rot(key[0, h], pos[0] // 4 - pos[0]) for h in range(2)])[None]
    # float32 angles of offsets up to ~2250 rad are off by ~1e-4 rad from float64's: errors ~|k|·1e-4
    torch.testing.assert_close(outs[3].double(), want, rtol=0, atol=1e-3)
    bf = layers[0]._rotate_keys_to_groups(key.bfloat16(), pos, inv)  # a bfloat16 model gets a bfloat16 table
    assert bf.dtype == torch.bfloat16 and any(t[1].dtype == torch.bfloat16 for t in kernels._TABLES.values())


def test_decoding_rotates_each_key_to_its_group_once(monkeypatch):
    """Cached decoding keeps the group-rotated keys (ropekit's entry beside the KV cache): each step rotates
    only the keys that just became group keys, and the outputs equal the naive rule at every step — also when
    a second, different prompt reuses the layer (the stale entry is rebuilt)."""
    G, W, n = 3, 8, 30
    attend = SelfExtendAttention(lambda: INV_FREQ.float(), G, W)
    rotated = []
    real_rotate_to = kernels.rotate_to

    def counting(x, positions, targets, inv_freq):
        rotated.append((x.shape[1], x.shape[2]))
        return real_rotate_to(x, positions, targets, inv_freq)

    import ropekit.methods.self_extend_attention as se

    monkeypatch.setattr(se, "rotate_to", counting)
    for seed in (0, 1):
        q, k, v = _inputs(batch=1, q_len=n, k_len=n, seed=seed)
        k_rot = _rot(k[0], torch.arange(n))[None].float()
        rotated.clear()
        for t in range(W + 2, n):
            q_rot = _rot(q[0, :, t:t + 1], torch.tensor([t]))[None].float()
            got = attend(None, q_rot, k_rot[:, :, :t + 1], v[:, :, :t + 1], None, scaling=DIM ** -0.5,
                         kernel=_sdpa_kernel, position_ids=torch.tensor([[t]]))[0]
            allowed = torch.ones(1, 1, t + 1, dtype=torch.bool)
            want = _naive(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], torch.tensor([[t]]),
                          torch.arange(t + 1)[None], allowed, _self_extend_rule(G, W))
            torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
        key_rotations = [n_rows for heads, n_rows in rotated if heads == k.shape[1]]  # not the query's rotation
        assert key_rotations[0] == (W + 2) - W + 1 and all(r == 1 for r in key_rotations[1:]), key_rotations
        assert sum(key_rotations) == n - W  # every group key rotated exactly once per prompt


def _forbid_per_head_copies(monkeypatch):
    """Any repeat_interleave / repeat (how K/V get copied per query head) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("keys/values copied per query head")

    monkeypatch.setattr(torch.Tensor, "repeat_interleave", refuse)
    monkeypatch.setattr(torch, "repeat_interleave", refuse)
    monkeypatch.setattr(torch.Tensor, "repeat", refuse)
    monkeypatch.setattr(kernels, "expand_kv", refuse)


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (6, 3), (4, 1)])
def test_s2_attn_never_copies_keys_per_query_head(monkeypatch, heads, kv_heads):
    """S²-Attn folds grouped query heads into its group blocks (also when an odd number of KV heads puts one KV
    head on both sides of the shifted/unshifted split) and equals the naive definition: per query head, causal
    attention within ``⌊t/g⌋`` (first half of the heads) or ``⌊(t + g − ⌊g/2⌋)/g⌋`` (second half), over keys
    repeated per head."""
    from ropekit.methods.longlora_attention import ShiftedSparseAttention

    n, ratio = 22, 0.25
    q, k, v = _inputs(batch=2, heads=heads, kv_heads=kv_heads, q_len=n, k_len=n, seed=4)
    g = -(-n // 4)  # ⌈n·r⌉
    t = torch.arange(n)
    causal = t[None, :] <= t[:, None]
    want = torch.empty(2, heads, n, DIM, dtype=torch.float64)
    for h in range(heads):
        ids = (t + (g - g // 2)) // g if h >= heads // 2 else t // g
        allowed = causal & (ids[:, None] == ids[None, :])
        kv = h // (heads // kv_heads)
        logits = (q[:, h].double() @ k[:, kv].double().transpose(-1, -2)) * DIM ** -0.5
        want[:, h] = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1) @ v[:, kv].double()
    _forbid_per_head_copies(monkeypatch)
    module = torch.nn.Module().train()
    got = ShiftedSparseAttention(ratio)(module, q, k, v, None, scaling=DIM ** -0.5, kernel=None)[0]
    torch.testing.assert_close(got.transpose(1, 2).double(), want, rtol=1e-5, atol=1e-5)


def test_landmark_never_copies_keys_per_query_head(monkeypatch):
    """Landmark's grouped softmax (training) and top-k retrieval (inference) score grouped query heads against
    their KV head without copying K/V per query head, and still equal the naive definitions (the reference
    tests' own, computed with keys repeated per head before the copies are forbidden)."""
    from test_landmark_attention import aligned, mask_of, naive_grouped, naive_retrieval, random_inputs, rope

    from ropekit.methods.landmark_attention import grouped_attention, retrieval_attention
    from ropekit.core.rope import default_inv_freq

    q, k, v, gen = random_inputs(0, heads=8, kv_heads=2, q_len=23, k_len=23)
    is_landmark = torch.rand(2, 23, generator=gen) < 0.25
    mask, allowed = mask_of(None, 23, 23)
    want_grouped = naive_grouped(q, k, v, is_landmark, allowed, 0.35)

    block, k_len, q_len = 4, 36, 30
    q2, k2, v2, _ = random_inputs(7, heads=8, kv_heads=2, q_len=q_len, k_len=k_len)
    inv_freq = default_inv_freq(100.0, 8)
    pos = torch.arange(k_len)[None].expand(2, -1)
    mask2, allowed2 = mask_of(None, q_len, k_len)
    want_retrieval = naive_retrieval(q2, k2, v2, allowed2, pos[:, -q_len:], pos, block=block, top_k=2,
                                     local_blocks=1, inv_freq=inv_freq, scale=0.4)
    q_rot, k_rot = rope(q2, pos[:, None, -q_len:], inv_freq), rope(k2, pos[:, None], inv_freq)
    assert aligned(k_len, block).shape == (2, k_len)

    _forbid_per_head_copies(monkeypatch)
    got = grouped_attention(q, k, v, is_landmark, mask, 0.35, chunk=5)
    torch.testing.assert_close(got, want_grouped, atol=1e-10, rtol=1e-10)
    got = retrieval_attention(q_rot, k_rot, v2, mask2, pos[:, -q_len:], pos, block=block, top_k=2, local_blocks=1,
                              inv_freq=inv_freq, scaling=0.4, chunk=7)
    torch.testing.assert_close(got, want_retrieval, atol=1e-9, rtol=1e-9)


# ---- host syncs of the eager per-layer path ----------------------------------------------------------------------
class _SyncCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts host reads of tensor values: the ops behind ``.item()``, ``int(t)``, ``bool(t)`` and ``torch.equal``
    (each a device→host sync on an accelerator); ``.tolist()`` is counted by a patch (it reads without an op)."""

    SYNC_OPS = ("aten::_local_scalar_dense", "aten::equal", "aten::is_nonzero")

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in self.SYNC_OPS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _count_syncs(monkeypatch, fn) -> int:
    counter = _SyncCounter()
    real_tolist = torch.Tensor.tolist

    def tolist(self):
        counter.count += 1
        return real_tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    with counter:
        fn()
    monkeypatch.setattr(torch.Tensor, "tolist", real_tolist)
    return counter.count


#: Host syncs one eager forward may make, whatever the number of layers: the first layer's shared decisions
#: (kernels.forward_memo) — at most two reads per method plus transformers' own (the same for the plain model).
SYNCS_PER_FORWARD = 6


@pytest.mark.parametrize("method", ["self_extend", "lm_infinite", "dual_chunk"])
def test_eager_forward_makes_no_host_sync_per_layer(monkeypatch, method):
    """An eager forward (prefill, padded prefill, cached decoding steps) of a 2-layer and an 8-layer model makes the
    same number of host syncs — 0 per layer — and at most :data:`SYNCS_PER_FORWARD` per forward; the outputs are
    the ones the checked paths give (the 8-layer model's padded row equals the row alone)."""
    import ropekit
    from ropekit.models.tiny import build_tiny_model

    params = {"self_extend": dict(factor=4), "lm_infinite": dict(factor=4), "dual_chunk": dict(factor=4)}[method]
    n = 150  # past the 64-token window
    ids = torch.randint(3, 256, (2, n), generator=torch.Generator().manual_seed(0))
    pad = torch.ones(2, n, dtype=torch.long)
    pad[1, :11] = 0
    counts = {}
    for layers in (2, 8):
        model = ropekit.extend(build_tiny_model("llama", seed=0, num_layers=layers), method, **params)

        def prefill_and_decode(model=model):
            with torch.no_grad():
                out = model(ids[:1], use_cache=True)
                cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
                for _ in range(3):  # cached decoding, consecutive positions
                    out = model(nxt, cache=cache, use_cache=True)
                    cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
                positions = (pad.cumsum(-1) - 1).clamp(min=0)
                return model(ids, attention_mask=pad, position_ids=positions).logits

        per_forward = {}
        for name, fn in (("all", prefill_and_decode),):
            per_forward[name] = _count_syncs(monkeypatch, fn)
        counts[layers] = per_forward["all"]
        if layers == 8:
            with torch.no_grad():
                positions = (pad.cumsum(-1) - 1).clamp(min=0)
                batch = model(ids, attention_mask=pad, position_ids=positions).logits
                alone = model(ids[1:, 11:], position_ids=positions[1:, 11:]).logits
            torch.testing.assert_close(batch[1, 11:], alone[0], rtol=1e-4, atol=1e-4)
    assert counts[2] == counts[8], counts  # nothing per layer
    assert counts[8] <= 5 * SYNCS_PER_FORWARD, counts  # 5 forwards


def test_memory_table_counts_the_buffers_a_real_run_allocates():
    """scripts/attention_memory_table.py measures on meta what a run allocates: its Self-Extend table and decoding
    cache equal those of the same run on the CPU with real tensors and the formulas from their definitions (cos +
    sin of the table rows, TABLE_MIN doubled past n; one group-key buffer of n − W + 1 keys per layer)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "attention_memory_table.py"
    spec = importlib.util.spec_from_file_location("attention_memory_table", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shape = dict(layers=3, heads=4, kv_heads=2, head_dim=16, window=64, dtype=torch.float32)
    n = 300
    meta = script.measure("self_extend", n, shape, "meta")
    cpu = script.measure("self_extend", n, shape, "cpu")
    W = shape["window"] // 4
    assert meta["tables"] == cpu["tables"] == 2 * 1024 * 16 * 4  # cos + sin, 1024 rows ≥ n, float32
    assert meta["decode_cache"] == cpu["decode_cache"] == 3 * 2 * (n + 1 - W) * 16 * 4
    for method in ("lm_infinite", "dual_chunk", "landmark"):
        assert script.measure(method, n, shape, "meta")["decode_cache"] == 0
    # the layer peak is above the output for every method (Self-Extend keeps its rotated queries/keys for the call)
    assert meta["layer_peak"] >= 4 * n * 16 * 4 + 2 * n * 16 * 4
    assert "| self_extend |" in script.table([n], shape)
