"""Bytes each attention method adds over the plain model, computed from the implementations' own allocations.

Each method's layer attention runs for real — the same Python code a model runs — on the ``meta`` device, where
every op produces a tensor of the right shape and dtype but allocates nothing, so Llama-3-8B shapes at 128k tokens
cost no memory. A dispatch mode (:class:`LiveBytes`) follows every tensor the ops create: bytes of each new storage
while some tensor still refers to it, and the peak of their sum. The fused attention kernels run as on a CUDA GPU
(``kernels.FUSED_DEVICES``: PyTorch's memory-efficient kernel, whose meta version allocates its output and
log-sum-exp as the CUDA one does), so the numbers are those of a CUDA run; the plain model's flash/SDPA kernel
allocates its output and an O(n) log-sum-exp, which is what "over plain" subtracts.

What is counted, per method and length (batch 1, bf16, Llama-3-8B: 32 layers, 32 query heads, 8 KV heads, head
128, 8k window):

* **layer peak** — the largest working set of one layer's attention call above its inputs (prefill of ``n``
  tokens), minus the plain kernel's output + log-sum-exp. Layers run one after another, so this is paid once.
* **tables** — tensors kept across layers and calls (Self-Extend's shared cos/sin table of the group-key rotation).
* **decode cache** — what a method keeps beside the KV cache while decoding (Self-Extend's group-rotated keys, one
  buffer per layer, 32 layers) after a prefill of ``n`` tokens and one decoding step.
* **cos/sin** — the model's own RoPE tables for ``n`` positions: ``2 · n · 128`` values; the frequency methods
  (PI, NTK, YaRN, LongRoPE, ABF, …) change their values, not their size, so they add 0 bytes.

Run: ``python scripts/attention_memory_table.py [--lengths 32k,128k] [--check]``. ``--check`` runs the same
measurement on small shapes both on meta and on the CPU with real tensors and compares the persistent buffers
(tests/attention/test_long_context_memory.py does this).
"""

from __future__ import annotations

import argparse
import gc
import weakref
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ropekit.attention import kernels
from ropekit.attention.masks import AttentionMask
from ropekit.methods import dual_chunk_attention as dual_chunk
from ropekit.methods import lm_infinite_attention as lm_infinite
from ropekit.methods import self_extend_attention as self_extend
from ropekit.methods.dual_chunk_attention import DualChunkAttention
from ropekit.methods.landmark_attention import retrieval_attention
from ropekit.methods.lm_infinite_attention import LambdaAttention
from ropekit.methods.self_extend_attention import SelfExtendAttention

LLAMA3_8B = {"layers": 32, "heads": 32, "kv_heads": 8, "head_dim": 128, "window": 8192, "dtype": torch.bfloat16}


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages created inside the mode while a tensor refers to them, and their peak."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, list[int]] = {}  # storage id → [bytes, tensors alive]
        self.now = 0
        self.peak = 0

    def _drop(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self.live[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in self.live:
                self.live[key][1] += 1
            else:
                self.live[key] = [storage.nbytes(), 1]
                self.now += storage.nbytes()
                self.peak = max(self.peak, self.now)
            weakref.finalize(t, self._drop, key)
        return out

    def reset_peak(self) -> None:
        self.peak = self.now


def _decisions():
    """The per-forward host decisions of a plain causal call (consecutive positions, past every window), given
    instead of read — on meta nothing can be read (they are what the first layer reads on a real device)."""
    def se_layout(self, mask, q_pos, k_pos, q_len, k_len, device):
        return False, True

    def lm_layout(self, position_ids, attention_mask, query, key, kwargs):
        q_len, k_len = position_ids.shape[1], key.shape[2]
        hits = [True] * len(range(0, q_len, self.chunk_size))
        unpadded = [True] * len(range(0, q_len, max(1, min(self.chunk_size, self.local_window - 1))))
        return k_len - q_len, k_len - 1, True, min(self.global_tokens, k_len), hits, unpadded

    def dc_layout(self, mask, q_pos, k_pos, q_len, k_len):
        # consecutive positions under the causal mask: blocks cut at chunk boundaries, each part over its own
        # chunks' keys, the earlier chunks' parts without a mask (DualChunkAttention._layout's ordered case)
        L, off, blocks, r = self.chunk_len, k_len - q_len, [], 0
        while r < q_len:
            c = (r + off) // L
            end = min(q_len, (c + 1) * L - off)
            for a in range(r, end, self.chunk):
                b = min(a + self.chunk, end)
                hi = min(k_len, b + off)
                spans = ((c * L, hi, False), (max(0, (c - 1) * L), min(c * L, hi), True),
                         (0, min(max(0, (c - 1) * L), hi), True))
                blocks.append((a, b, tuple(span if span[1] > span[0] else None for span in spans)))
            r = end
        return k_len - 1 < L, blocks, True

    return [
        mock.patch.object(self_extend.SelfExtendAttention, "_layout", se_layout),
        mock.patch.object(self_extend.SelfExtendAttention, "_position_range",
                          staticmethod(lambda k_pos: (0, int(k_pos.shape[-1]) - 1))),
        mock.patch.object(lm_infinite.LambdaAttention, "_layout", lm_layout),
        mock.patch.object(dual_chunk.DualChunkAttention, "_layout", dc_layout),
        mock.patch.object(kernels, "FUSED_DEVICES", ("cuda", "meta")),
        mock.patch.dict(kernels._FUSED_VERIFIED, {("meta", torch.bfloat16): True, ("meta", torch.float32): True}),
    ]


def _layers(shape: dict, inv):
    """The methods' layer attentions with ropekit's default parameters for a model of window ``C``."""
    w = shape["window"]
    return {
        # Self-Extend: W = min(1024, C/4) neighbours, G = 4 (G does not change any buffer's size); LM-Infinite:
        # 10 global tokens + a local window of C; Dual Chunk: chunk_size C, local_size C/32.
        "self_extend": lambda: SelfExtendAttention(lambda: inv, 4, max(1, min(1024, w // 4))),
        "lm_infinite": lambda: LambdaAttention(w, 10, lambda: inv),
        "dual_chunk": lambda: DualChunkAttention(lambda: inv, w, max(1, w // 32)),
        "landmark": None,  # run through retrieval_attention (see measure)
    }


def _landmark_args(shape: dict) -> dict:
    """Landmark's defaults: a landmark every 50 tokens (blocks of 51), top-5 retrieval, and as many local blocks as
    fit the window beside them (``⌊C/51⌋ − 1 − 5``)."""
    from ropekit.methods.landmark import (
        DEFAULT_MEM_FREQ,
        DEFAULT_TOP_K,
        default_local_blocks,
    )

    return {"block": DEFAULT_MEM_FREQ + 1, "top_k": DEFAULT_TOP_K,
            "local_blocks": default_local_blocks(shape["window"], DEFAULT_MEM_FREQ, DEFAULT_TOP_K)}


def measure(method: str, n: int, shape: dict = LLAMA3_8B, device: str = "meta") -> dict[str, int]:
    """``{"layer_peak", "tables", "decode_cache"}`` bytes of ``method`` for ``n`` tokens (batch 1) on ``device``."""
    dtype, heads, kv, dim = shape["dtype"], shape["heads"], shape["kv_heads"], shape["head_dim"]
    kernels._TABLES.clear()
    kernels._MEMO.sig = None
    q = torch.empty(1, heads, n, dim, device=device, dtype=dtype)
    k = torch.empty(1, kv, n, dim, device=device, dtype=dtype)
    v = torch.empty(1, kv, n, dim, device=device, dtype=dtype)
    if device != "meta":
        gen = torch.Generator().manual_seed(0)
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, generator=gen))
    inv = 1.0 / 500000.0 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    pos = torch.arange(n, device=device)[None]
    plain_out = q.numel() * q.element_size() + heads * n * 4  # the plain kernel's output + float32 log-sum-exp
    result = {"layer_peak": 0, "tables": 0, "decode_cache": 0}
    patches = _decisions()
    for p in patches:
        p.start()
    try:
        tracker = LiveBytes()
        with tracker:
            if method == "landmark":
                mask = AttentionMask(None, n, n, device=device)
                out = retrieval_attention(q, k, v, mask, pos, pos, inv_freq=inv, scaling=dim ** -0.5,
                                          **_landmark_args(shape))
                del out
                result["layer_peak"] = tracker.peak - plain_out
            else:
                layer = _layers(shape, inv)[method]()
                out = layer(None, q, k, v, None, scaling=dim ** -0.5, kernel=None, position_ids=pos)[0]
                del out
                gc.collect()
                result["layer_peak"] = tracker.peak - plain_out
                result["tables"] = sum(t.nbytes for e in kernels._TABLES.values() for t in e[1:])
                # one decoding step after the prefill: what the layer keeps beside the KV cache
                k1 = torch.cat([k, k[:, :, -1:]], dim=2)
                v1 = torch.cat([v, v[:, :, -1:]], dim=2)
                kernels._MEMO.sig = None
                out = layer(None, q[:, :, -1:], k1, v1, None, scaling=dim ** -0.5, kernel=None,
                            position_ids=torch.tensor([[n]], device=device))[0]
                del out
                entry = getattr(layer, "_group_keys", None)
                result["decode_cache"] = entry.buffer.nbytes * shape["layers"] if entry is not None else 0
    finally:
        for p in reversed(patches):
            p.stop()
    kernels._TABLES.clear()
    kernels._MEMO.sig = None
    return result


def table(lengths: list[int], shape: dict = LLAMA3_8B) -> str:
    gib = 2 ** 30

    def kv_cache(n):
        return 2 * shape["layers"] * shape["kv_heads"] * n * shape["head_dim"] * 2
    lines = ["| method | " + " | ".join(f"{n // 1024}k: layer peak | tables | decode cache" for n in lengths) + " |",
             "|---|" + "---:|---:|---:|" * len(lengths)]
    lines.append("| plain (flash/SDPA) | " + " | ".join("0 | 0 | 0" for _ in lengths) + " |")
    lines.append("| frequency methods (PI, NTK, YaRN, LongRoPE, ABF, …): cos/sin same size as plain | "
                 + " | ".join("0 | 0 | 0" for _ in lengths) + " |")
    for method in ("self_extend", "lm_infinite", "dual_chunk", "landmark"):
        cells = []
        for n in lengths:
            m = measure(method, n, shape)
            cells.append(f"{m['layer_peak'] / gib:.2f} GiB | {m['tables'] / 2**20:.1f} MiB | "
                         f"{m['decode_cache'] / gib:.2f} GiB")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("For scale: the plain KV cache is " + ", ".join(f"{kv_cache(n) / gib:.1f} GiB at {n // 1024}k"
                                                               for n in lengths) + "; plain cos/sin "
                 + ", ".join(f"{2 * n * shape['head_dim'] * 2 / 2**20:.0f} MiB" for n in lengths) + ".")
    return "\n".join(lines)


def _lengths(text: str) -> list[int]:
    return [int(float(t[:-1]) * 1024) if t.endswith("k") else int(t) for t in text.split(",")]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="32k,128k")
    args = parser.parse_args(argv)
    print(table(_lengths(args.lengths)))


if __name__ == "__main__":
    main()
