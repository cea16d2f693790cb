"""Attention building blocks against naive O(n²) computations written out here."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch

from ropekit.attention.kernels import attention_with_lse, merge_attention, rotate_to


def naive(q, k, v, allowed, scale):
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    logits = (q.double() @ k.double().transpose(-1, -2)) * scale
    logits = logits.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    return probs @ v.double(), lse


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_attention_with_lse_matches_naive_with_empty_rows(kv_heads):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 37, 16, generator=gen)
    k, v = torch.randn(2, 2, kv_heads, 53, 16, generator=gen).unbind(0)
    allowed = torch.rand(2, 1, 37, 53, generator=gen) > 0.6
    allowed[:, :, 3] = False  # a query that sees nothing
    out, lse = attention_with_lse(q, k, v, allowed, scale=0.25)
    want_out, want_lse = naive(q, k, v, allowed, 0.25)
    assert torch.allclose(out.double(), want_out, atol=1e-5)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.allclose(lse.double()[finite], want_lse[finite], atol=1e-5)


def test_merge_of_disjoint_parts_equals_attention_over_their_union():
    gen = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, 1, 2, 29, 8, generator=gen).unbind(0)
    split = torch.rand(1, 1, 29, 29, generator=gen) > 0.5
    causal = torch.ones(29, 29, dtype=torch.bool).tril()
    parts = [attention_with_lse(q, k, v, causal & split), attention_with_lse(q, k, v, causal & ~split)]
    out, lse = merge_attention(parts)
    want_out, want_lse = naive(q, k, v, causal.expand(1, 1, 29, 29), 1 / math.sqrt(8))
    assert torch.allclose(out.double(), want_out, atol=1e-5)
    assert torch.allclose(lse.double(), want_lse, atol=1e-5)


def _explicit_rotation(x, positions, inv_freq):
    """``x`` (1, 1, L, D) rotated at ``positions`` (1, L) with explicit 2×2 rotations in float64 (math.cos/sin), the
    first ``2·len(inv_freq)`` channels in the half-split layout."""
    half = len(inv_freq)
    out = x.clone()
    for t in range(x.shape[2]):
        for i in range(half):
            a = float(positions[0, t]) * float(inv_freq[i])
            x1, x2 = x[0, 0, t, i].item(), x[0, 0, t, i + half].item()
            out[0, 0, t, i] = x1 * math.cos(a) - x2 * math.sin(a)
            out[0, 0, t, i + half] = x2 * math.cos(a) + x1 * math.sin(a)
    return out


def test_rotate_to_composes_rope_rotations():
    """Moving position-i vectors to p equals rotating the raw vectors at p (explicit 2×2 rotations)."""
    gen = torch.Generator().manual_seed(2)
    d, rot = 12, 8  # partial rotary: 4 frequency pairs, 4 channels pass through
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, rot, 2).float() / rot))
    x = torch.randn(1, 1, 5, d, generator=gen, dtype=torch.float64)
    pos = torch.tensor([[0, 3, 7, 20, 21]])
    target = torch.tensor([[5, 1, 7, 0, 40]])

    rotated = _explicit_rotation(x, pos, inv_freq)
    got = rotate_to(rotated, pos, target, inv_freq)
    assert torch.allclose(got, _explicit_rotation(x, target, inv_freq), atol=1e-5)
    assert torch.equal(got[..., rot:], x[..., rot:])


def test_rotate_to_cancels_the_models_float32_angle_rounding_at_long_positions():
    """Keys the model rotated in float32 at ~99k (transformers' float32 product p·θ), moved to ⌊p/8⌋: within 2e-6
    of the raw keys rotated at ⌊p/8⌋ in float64 (math.cos/sin). A float32 move by (t − p)·θ keeps the rounding of
    fl(p·θ) (about 6e-3 rad at θ = 1) and fails the bound; so does a fresh float32 rotation at t (8e-4 here)."""
    gen = torch.Generator().manual_seed(5)
    d = 64
    inv_freq = (1.0 / (1e5 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))).float()
    pos = torch.arange(99_000, 99_064)[None]
    target = pos // 8
    x = torch.randn(1, 1, pos.shape[1], d, generator=gen, dtype=torch.float64)

    def rotate_float32(x, p):  # the model's rotary embedding: float32 angle, float32 cos/sin
        a = (p[..., None].float() * inv_freq)[:, None]
        a = torch.cat((a, a), dim=-1)
        half = x.shape[-1] // 2
        return x * a.cos() + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * a.sin()

    want = _explicit_rotation(x, target, inv_freq)
    by_model = rotate_float32(x.float(), pos)
    got = rotate_to(by_model, pos, target, inv_freq)
    bound = 2e-6 * float(x.abs().max())
    assert float((got.double() - want).abs().max()) < bound
    float32_move = rotate_float32(by_model, target - pos)
    assert float((float32_move.double() - want).abs().max()) > 100 * bound
    assert float((rotate_float32(x.float(), target).double() - want).abs().max()) > 100 * bound


def _block(seed=3):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, 9, 8, generator=gen)
    k, v = torch.randn(2, 1, 2, 11, 8, generator=gen).unbind(0)
    allowed = torch.rand(1, 1, 9, 11, generator=gen) > 0.4
    allowed[..., 0] = True
    bias = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf")).expand(1, 2, 9, 11)
    return q, k, v, allowed, bias


def test_explicit_block_path_matches_naive():
    from ropekit.attention.kernels import _explicit_attention

    q, k, v, allowed, bias = _block()
    out, lse = _explicit_attention(q, k, v, bias, 0.3)
    want_out, want_lse = naive(q, k, v, allowed, 0.3)
    assert torch.allclose(out.double(), want_out, atol=1e-5)
    assert torch.allclose(lse.double(), want_lse, atol=1e-5)


@pytest.mark.parametrize("behaviour", ["agrees", "disagrees", "raises"])
def test_fused_gpu_kernel_is_used_only_after_it_agrees_with_the_explicit_path(monkeypatch, behaviour):
    """The CUDA fast path's guard, exercised on CPU with a stand-in kernel: a wrong or missing kernel is
    dropped after one call (with a warning) and results stay those of the explicit path."""
    from ropekit.attention import kernels

    q, k, v, allowed, bias = _block()
    calls = []

    def fake(query, key, value, bias_, scale):
        calls.append(1)
        if behaviour == "raises":
            raise RuntimeError("no kernel")
        out, lse = kernels._explicit_attention(query, key, value, bias_, scale)
        return (out, lse) if behaviour == "agrees" else (out + 1.0, lse)

    monkeypatch.setattr(kernels, "_cuda_efficient_attention", fake)
    monkeypatch.setattr(kernels, "_FUSED_VERIFIED", {})
    want_out, _ = naive(q, k, v, allowed, 0.3)
    for call in range(3):
        if behaviour == "agrees" or call > 0:
            out, _ = kernels._fused_cuda_or_explicit(q, k, v, bias, 0.3)
        else:
            with pytest.warns(UserWarning, match="fused CUDA attention"):
                out, _ = kernels._fused_cuda_or_explicit(q, k, v, bias, 0.3)
        assert torch.allclose(out.double(), want_out, atol=1e-5)
    assert len(calls) == (3 if behaviour == "agrees" else 1)


# ---- no CPU-only kernel off the CPU ---------------------------------------------------------------------------------
CPU_ONLY = "aten::_scaled_dot_product_flash_attention_for_cpu"


class _OpRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, str]] = []  # (op, device of its first tensor argument)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        first = next((a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)), None)
        self.ops.append((func._schema.name, first.device.type if first is not None else ""))
        return func(*args, **(kwargs or {}))


def _every_attention_call(device: str):
    """Every ropekit attention function on ``device``: the kernels, the Self-Extend / LM-Infinite / Dual Chunk layer
    paths (eager — the forward's shared decisions given, as the first layer would have read them — and traced),
    Landmark's grouped and retrieval attention, and S²-Attn."""
    from ropekit.attention import kernels
    from ropekit.methods.dual_chunk_attention import DualChunkAttention
    from ropekit.methods.landmark_attention import grouped_attention, retrieval_attention
    from ropekit.methods.lm_infinite_attention import LambdaAttention, _causal_lse
    from ropekit.attention.masks import AttentionMask
    from ropekit.methods.longlora_attention import ShiftedSparseAttention
    from ropekit.methods.self_extend_attention import SelfExtendAttention

    n, dim = 40, 16
    q = torch.randn(2, 4, n, dim, device=device)
    k, v = torch.randn(2, 2, 2, n, dim, device=device).unbind(0)
    inv = 1.0 / 10000 ** (torch.arange(0, dim, 2, device=device) / dim)
    pos = torch.arange(n, device=device)[None].expand(2, n)
    allowed = torch.ones(n, n, dtype=torch.bool, device=device).tril()[None, None]
    kernels.attention_with_lse(q, k, v, None)
    kernels.attention_with_lse(q, k, v, allowed)
    kernels.attention_with_lse(q[:, :2], k, v, allowed)
    _causal_lse(q, k, v, dim ** -0.5)

    def sdpa(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        raise AssertionError("the window cases are not under test here")

    attend = dict(scaling=dim ** -0.5, kernel=sdpa, position_ids=pos)
    layers = [SelfExtendAttention(lambda: inv, 3, 8, chunk=16), LambdaAttention(10, 3, lambda: inv, chunk_size=16),
              DualChunkAttention(lambda: inv, 16, 4)]
    for traced in (False, True):
        for layer in layers:
            kernels._MEMO.sig = None
            with mock.patch.object(torch.compiler, "is_compiling", lambda: traced):
                layer(None, q, k, v, None, **attend)  # prefill
                layer(None, q[:, :, -1:], k, v, None, **{**attend, "position_ids": pos[:, -1:]})  # a decoding step
    mask = AttentionMask(None, n, n, device=device)
    grouped_attention(q, k, v, (torch.arange(n, device=device) % 5 == 4)[None].expand(2, n), mask, 0.25)
    retrieval_attention(q, k, v, mask, pos, pos, block=5, top_k=2, local_blocks=1, inv_freq=inv, scaling=0.25)
    ShiftedSparseAttention(0.25)(torch.nn.Module().train(), q, k, v, None, scaling=0.25, kernel=sdpa)


def test_no_cpu_only_kernel_reaches_other_devices(monkeypatch):
    """On a non-CPU device (``meta`` here: every op runs on shapes alone, so nothing can be read back either) no
    ropekit attention function calls the CPU-only fused kernel; on the CPU the same calls do use it (the recorder
    sees it)."""
    from ropekit.attention import kernels
    from ropekit.methods import dual_chunk_attention as dual_chunk
    from ropekit.methods import lm_infinite_attention as lm_infinite
    from ropekit.methods import self_extend_attention as self_extend

    # the eager paths' per-forward decisions (host reads made once by the first layer) are given, as that layer
    # would have read them for a plain causal prefill / decoding step: consecutive positions, past every window
    def se_layout(self, mask, q_pos, k_pos, q_len, k_len, device):
        return False, True

    def lm_layout(self, position_ids, attention_mask, query, key, kwargs):
        q_len, k_len = position_ids.shape[1], key.shape[2]
        hits = [True] * len(range(0, q_len, self.chunk_size))
        unpadded = [True] * len(range(0, q_len, max(1, min(self.chunk_size, self.local_window - 1))))
        return k_len - q_len, k_len - 1, True, min(self.global_tokens, k_len), hits, unpadded

    def dc_layout(self, mask, q_pos, k_pos, q_len, k_len):  # every part over every causal key, with its mask
        return False, [(a, min(a + self.chunk, q_len), ((0, min(k_len, a + self.chunk + k_len - q_len), False),) * 3)
                       for a in range(0, q_len, self.chunk)], False

    monkeypatch.setattr(self_extend.SelfExtendAttention, "_layout", se_layout)
    monkeypatch.setattr(self_extend.SelfExtendAttention, "_position_range", staticmethod(lambda k_pos: (-1, 0)))
    monkeypatch.setattr(lm_infinite.LambdaAttention, "_layout", lm_layout)
    monkeypatch.setattr(dual_chunk.DualChunkAttention, "_layout", dc_layout)

    with _OpRecorder() as meta:
        _every_attention_call("meta")
    assert ("aten::bmm", "meta") in meta.ops or ("aten::matmul", "meta") in meta.ops  # the attention did run
    assert not {op for op, d in meta.ops if d == "cpu"}  # nothing falls back to CPU tensors either
    assert CPU_ONLY not in {op for op, _ in meta.ops}, "a CPU-only kernel was called on a meta tensor"
    with _OpRecorder() as cpu:
        _every_attention_call("cpu")
    assert CPU_ONLY in {op for op, _ in cpu.ops}
    kernels._MEMO.sig = None


def _large_logit_block(dtype):
    """bf16/fp16 queries and keys whose logits reach ±40, as a trained model's do (SmolLM2's, among others)."""
    gen = torch.Generator().manual_seed(7)
    q = (torch.randn(1, 2, 24, 64, generator=gen) * 3.0).to(dtype)
    k = (torch.randn(1, 2, 40, 64, generator=gen) * 3.0).to(dtype)
    v = torch.randn(1, 2, 40, 64, generator=gen).to(dtype)
    allowed = torch.ones(1, 1, 24, 40, dtype=torch.bool)
    return q, k, v, allowed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_explicit_path_keeps_half_precision_logits_in_float32(dtype):
    # the reference is float64 over the same half-precision inputs: only the output's own rounding (and P's, for
    # the product with V) may remain — one unit in the last place of the largest value; logits rounded to bf16
    # before the softmax (the old path) miss this by several units
    from ropekit.attention.kernels import _explicit_attention

    q, k, v, allowed = _large_logit_block(dtype)
    scale = 1 / 8
    assert float((q.double() @ k.double().transpose(-1, -2)).abs().max()) * scale > 20
    out, lse = _explicit_attention(q, k, v, None, scale)
    want_out, want_lse = naive(q, k, v, allowed, scale)
    ulp = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    assert float((out.double() - want_out).abs().max()) <= ulp * float(want_out.abs().max())
    assert float((lse.double() - want_lse).abs().max()) < 1e-4


def test_a_fused_kernel_with_float32_logits_passes_the_bf16_check(monkeypatch):
    # what PyTorch's memory-efficient CUDA kernel computes (float32 logits and softmax, bf16 output), stood in for
    # on the CPU: the first-use check must accept it, not fall back to the explicit path for the whole run
    from ropekit.attention import kernels

    def fused_like(query, key, value, bias_, scale):
        logits = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
        lse = torch.logsumexp(logits, dim=-1)
        out = torch.matmul(torch.softmax(logits, dim=-1), value.float())
        return out.to(query.dtype), lse

    monkeypatch.setattr(kernels, "_cuda_efficient_attention", fused_like)
    monkeypatch.setattr(kernels, "_FUSED_VERIFIED", {})
    q, k, v, _ = _large_logit_block(torch.bfloat16)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernels._fused_cuda_or_explicit(q, k, v, None, 1 / 8)
    assert kernels._FUSED_VERIFIED == {("cpu", torch.bfloat16): True}


@pytest.mark.parametrize("kv_heads", [1, 3, 6])
@pytest.mark.parametrize("path", ["fused", "fused, KV heads copied", "explicit"])
def test_causal_block_is_the_lower_triangle(monkeypatch, kv_heads, path):
    """``causal=True``: query ``i`` sees keys ``j ≤ i`` — through the CPU flash kernel's own causal mode (with
    grouped-query heads passed as they are, or copied per query head for a torch before 2.9), and through the
    explicit triangle mask used on devices without it; each query head keeps its KV head."""
    from ropekit.attention import kernels

    if path == "explicit":
        monkeypatch.setattr(kernels, "runs_cpu_flash", lambda query: False)
    if path == "fused, KV heads copied":
        monkeypatch.setattr(kernels, "CPU_FLASH_TAKES_GQA", False)
    elif path == "fused" and not kernels.CPU_FLASH_TAKES_GQA:
        pytest.skip(f"torch {torch.__version__}'s CPU flash kernel takes no grouped-query heads")
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, 6, 45, 16, generator=gen)
    k, v = torch.randn(2, 2, kv_heads, 45, 16, generator=gen).unbind(0)
    out, lse = attention_with_lse(q, k, v, None, scale=0.3, causal=True)
    want_out, want_lse = naive(q, k, v, torch.ones(45, 45, dtype=torch.bool).tril(), 0.3)
    assert torch.allclose(out.double(), want_out, atol=1e-5)
    assert torch.allclose(lse.double(), want_lse, atol=1e-5)


def test_causal_block_refuses_a_mask_or_a_rectangle():
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="square block"):
        attention_with_lse(q, torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), None, causal=True)
    with pytest.raises(ValueError, match="square block"):
        attention_with_lse(q, q, q, torch.ones(5, 5, dtype=torch.bool), causal=True)


def test_merge_of_bf16_parts_rounds_once():
    """bfloat16 parts are combined in float32 and rounded once: each output is within half a bfloat16 ulp of the
    float64 merge of the same parts (summing in bfloat16 misses it by hundreds of ulps where terms cancel)."""
    gen = torch.Generator().manual_seed(5)
    parts = [(torch.randn(1, 2, 64, 16, generator=gen).bfloat16(), torch.randn(1, 2, 64, generator=gen))
             for _ in range(8)]
    out, lse = merge_attention(parts)
    total = torch.logsumexp(torch.stack([p_lse for _, p_lse in parts]).double(), dim=0)
    exact = sum(o.double() * torch.exp(p_lse.double() - total).unsqueeze(-1) for o, p_lse in parts)
    ulp = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)
    assert out.dtype == torch.bfloat16
    assert ((out.double() - exact).abs() / ulp).max().item() <= 0.5 + 1e-3
    assert torch.allclose(lse.double(), total, atol=1e-6)
