"""Landmark retrieval (§3.2) on float32 inputs computes in float32 — no float64 tensor, which GPUs run slowly
or not at all — and still equals the naive float64 definition, also far from position 0 (where a rotation's
angle error would grow with the position if it were not cancelled)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ropekit.methods.landmark_attention import retrieval_attention
from ropekit.core.rope import default_inv_freq
from test_landmark_attention import mask_of, naive_retrieval, random_inputs


class _Dtypes(TorchDispatchMode):
    """Records the dtype of every tensor an aten op returns."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.seen.add(t.dtype)
        return out


@pytest.mark.parametrize("start", [0, 3000])
@pytest.mark.parametrize("top_k", [1, 2])
def test_float32_retrieval_has_no_float64_and_matches_the_definition(start, top_k):
    block, k_len, q_len = 4, 36, 30
    q, k, v, _ = random_inputs(11 + top_k, q_len=q_len, k_len=k_len)
    inv_freq = default_inv_freq(100.0, 8)
    pos = torch.arange(k_len)[None].expand(2, -1) - torch.tensor([[0], [5]]) + start
    padding = torch.ones(2, k_len, dtype=torch.long)
    padding[1, :5] = 0
    mask, allowed = mask_of(padding, q_len, k_len)
    # the model's own rotation: float32 angles p·θ, as transformers computes them
    angles = pos[:, None, :, None].float() * inv_freq.float()
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)

    def model_rope(x, c, s):
        half = x.shape[-1] // 2
        return x * c + torch.cat([-x[..., half:], x[..., :half]], -1) * s

    q_rot = model_rope(q.float(), cos[:, :, -q_len:], sin[:, :, -q_len:])
    k_rot = model_rope(k.float(), cos, sin)
    with _Dtypes() as seen:
        got = retrieval_attention(q_rot, k_rot, v.float(), mask, pos[:, -q_len:], pos, block=block, top_k=top_k,
                                  local_blocks=1, inv_freq=inv_freq.float(), scaling=0.4, chunk=7)
    assert torch.float64 not in seen.seen, seen.seen
    assert got.dtype == torch.float32
    ref = naive_retrieval(q, k, v, allowed, pos[:, -q_len:], pos, block=block, top_k=top_k, local_blocks=1,
                          inv_freq=inv_freq, scale=0.4)
    torch.testing.assert_close(got.double(), ref, atol=2e-4, rtol=2e-4)
