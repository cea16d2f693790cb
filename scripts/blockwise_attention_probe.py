"""Whether a causal attention other than PyTorch's fused CPU kernel is faster in bfloat16 on this CPU.

    python scripts/blockwise_attention_probe.py [--lengths 8192] [--threads 2] [--block 1024] [--repeats 2]

At one SmolLM2-135M layer's shapes (9 query heads on 3 KV heads, head size 64), bfloat16 inputs, it times three
causal attentions and prints each one's seconds and its largest difference from the first:

* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``, what ropekit's plain attention
  runs on CPU;
* ``blockwise``: query blocks of ``--block`` rows, the two products as bfloat16 matmuls (the logits accumulated
  and kept in float32 through oneDNN's bf16 math mode for float32 matmuls, whose inputs are bf16 values here, so
  the products are exact), a float32 softmax per block, and the probabilities rounded to bf16 for the second
  product — the bf16 path a fused kernel takes, written in eager PyTorch;
* ``flex``: ``torch.compile(flex_attention)`` with a causal block mask (the compile is timed apart).

docs/speed.md quotes its output; it writes nothing.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def blockwise(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int) -> torch.Tensor:
    """Causal grouped-query attention, one query block at a time over the keys up to its end (the query heads of
    one KV head folded into the rows of one matmul)."""
    _, heads, n, dim = q.shape
    kv = k.shape[1]
    group = heads // kv
    folded = q.view(kv, group, n, dim)
    keys = k[0].float()  # bf16 values held in float32: oneDNN multiplies them as bf16 and accumulates in float32
    values = v[0]
    out = torch.empty(kv, group, n, dim, dtype=q.dtype)
    for start in range(0, n, block):
        end = min(n, start + block)
        rows = folded[:, :, start:end].reshape(kv, group * (end - start), dim).float()
        logits = torch.bmm(rows, keys[:, :end].transpose(1, 2)).mul_(dim ** -0.5).view(kv, group, end - start, end)
        future = torch.ones(end - start, end - start, dtype=torch.bool).triu_(1)
        logits[..., start:end].masked_fill_(future, float("-inf"))
        logits.sub_(logits.amax(-1, keepdim=True)).exp_()
        total = logits.sum(-1, keepdim=True)
        probs = logits.to(q.dtype).view(kv, group * (end - start), end)
        part = torch.bmm(probs, values[:, :end]).view(kv, group, end - start, dim).float() / total
        out[:, :, start:end] = part.to(q.dtype)
    return out.view(1, heads, n, dim)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="8192")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    compiled = torch.compile(flex_attention)
    for n in (int(x) for x in args.lengths.split(",")):
        generator = torch.Generator().manual_seed(0)
        q = torch.randn(1, HEADS, n, HEAD_DIM, generator=generator).bfloat16()
        k, v = (torch.randn(1, KV_HEADS, n, HEAD_DIM, generator=generator).bfloat16() for _ in range(2))
        mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device="cpu")
        start = time.perf_counter()
        compiled(q, k, v, block_mask=mask, enable_gqa=True)
        compile_s = time.perf_counter() - start
        runs = {
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
            "blockwise": lambda: blockwise(q, k, v, args.block),
            "flex": lambda: compiled(q, k, v, block_mask=mask, enable_gqa=True),
        }
        reference = runs["sdpa"]().float()
        for name, fn in runs.items():
            seconds = best_of(fn, args.repeats)
            diff = (fn().float() - reference).abs().max().item()
            extra = f", compile {compile_s:.1f} s" if name == "flex" else ""
            print(f"{n:>6} tokens, {name:>9}: {seconds:.3f} s (max |Δ| from sdpa {diff:.4f}{extra})", flush=True)


if __name__ == "__main__":
    main()
