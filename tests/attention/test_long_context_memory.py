"""Long-context memory and host syncs of the Self-Extend and LM-Infinite attention paths.

* Both layer attentions trace under ``torch.compile(fullgraph=True)`` — a ``.item()``, ``int(tensor)``,
  ``bool(tensor)`` or a branch on tensor values would break the graph and fail the test — and the compiled
  functions equal naive O(n²) references written out here from the papers' rules (LCEG Eq. 13; LM-Infinite's
  Λ rule), with the RoPE rotations computed from scratch in float64.
* Grouped-query attention never copies keys/values per query head.
* One rotation table is shared by every layer, and cached decoding rotates each key to its group position once.
"""

from __future__ import annotations

import pytest
import torch

from ropekit.attention import kernels
from ropekit.attention.lm_infinite import LambdaAttention
from ropekit.attention.self_extend import SelfExtendAttention

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
    real_rotate_by = kernels.rotate_by

    def counting(x, offsets, inv_freq):
        rotated.append((x.shape[1], x.shape[2]))
        return real_rotate_by(x, offsets, inv_freq)

    import ropekit.attention.self_extend as se

    monkeypatch.setattr(se, "rotate_by", counting)
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
