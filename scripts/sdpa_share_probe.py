"""How much of a SmolLM2 prefill PyTorch's fused causal attention alone costs on this CPU.

    python scripts/sdpa_share_probe.py [--lengths 4096,16384] [--threads 2] [--dtype bfloat16]

Times ``scaled_dot_product_attention`` (causal, grouped-query: 9 query heads, 3 KV heads, head size 64 — one
SmolLM2-135M layer) and a 2048² matmul in the same dtype, and prints each length's attention rate, the time the
model's 30 layers spend in it, and what is left of the budget that issue 25's 5x target allows when the float32
prefill time is passed (``--float32-seconds LENGTH=SECONDS``). docs/speed.md quotes its output; it writes nothing.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

LAYERS, HEADS, KV_HEADS, HEAD_DIM = 30, 9, 3, 64


def best_of(fn, repeats: int) -> float:
    fn()  # warm-up: oneDNN builds its kernels on the first call
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="4096,16384")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--float32-seconds", default="16384=88.9",
                        help="LENGTH=SECONDS,…: the float32 eager prefill times the 5x budget is taken from")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    budgets = {int(k): float(v) / 5 for k, v in (item.split("=") for item in args.float32_seconds.split(",") if item)}
    a, b = torch.randn(2048, 2048).to(dtype), torch.randn(2048, 2048).to(dtype)
    peak = 2 * 2048 ** 3 / best_of(lambda: a @ b, 5) / 1e12
    print(f"{args.dtype} matmul 2048²: {peak:.3f} TFLOP/s ({args.threads} threads)")
    for n in (int(x) for x in args.lengths.split(",")):
        q = torch.randn(1, HEADS, n, HEAD_DIM).to(dtype)
        k, v = (torch.randn(1, KV_HEADS, n, HEAD_DIM).to(dtype) for _ in range(2))
        seconds = best_of(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                          args.repeats)
        flops = 4 * n * n * HEAD_DIM * HEADS / 2  # QK^T and PV over the causal half
        line = (f"{n:>6} tokens: one layer's attention {seconds:.3f} s ({flops / seconds / 1e12:.3f} TFLOP/s, "
                f"{flops / seconds / 1e12 / peak:.0%} of the matmul), {LAYERS} layers {LAYERS * seconds:.1f} s")
        if n in budgets:
            line += f"; the 5x budget is {budgets[n]:.1f} s"
        print(line, flush=True)


if __name__ == "__main__":
    main()
