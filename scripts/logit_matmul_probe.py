"""Would oneDNN's bf16 math mode make the float32 logits of bf16 queries and keys cheaper on this CPU?

    python scripts/logit_matmul_probe.py [--rows 6144] [--keys 8192] [--threads 2]

The attention-side kernels multiply bf16 queries and keys as float32 copies (``ropekit.attention.kernels.
pair_scores``), so every logit keeps 24 bits. ``torch.backends.mkldnn.matmul.fp32_precision = "bf16"`` lets oneDNN
run such a float32 product on the bf16 unit (AMX) with float32 accumulation and output; the inputs being bf16
values, the result is the same product up to the order of the sums. This times one product at one layer's
shapes (3 KV heads, the query heads folded into rows, 64 dimensions) in both modes, alternating, and prints the
largest difference from a float64 product. docs/speed.md quotes its output; it writes nothing.
"""

from __future__ import annotations

import argparse
import time

import torch


def timed(q: torch.Tensor, k: torch.Tensor, mode: str, repeats: int = 3) -> tuple[torch.Tensor, float]:
    torch.backends.mkldnn.matmul.fp32_precision = mode
    out = torch.matmul(q, k)  # warm-up: oneDNN builds its kernel on the first call
    start = time.perf_counter()
    for _ in range(repeats):
        out = torch.matmul(q, k)
    return out, (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=6144, help="query rows per KV head (3 query heads × 2,048)")
    parser.add_argument("--keys", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    q = torch.randn(1, 3, args.rows, 64).bfloat16()
    k = torch.randn(1, 3, args.keys, 64).bfloat16()
    exact = torch.matmul(q.double(), k.double().transpose(-1, -2))
    qf, kf = q.float(), k.float().transpose(-1, -2)
    before = torch.backends.mkldnn.matmul.fp32_precision
    try:
        for mode in ("ieee", "bf16", "ieee", "bf16"):
            out, seconds = timed(qf, kf, mode)
            print(f"float32 product, mode {mode}: {seconds * 1e3:.1f} ms, "
                  f"max |Δ| against float64 {(out.double() - exact).abs().max().item():.2e}")
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = before
    rounded = torch.matmul(q, k.transpose(-1, -2))
    print(f"bf16 product (bf16 output): max |Δ| against float64 {(rounded.double() - exact).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
