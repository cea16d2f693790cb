"""The README's speed table from two `ropekit eval speed --out` files of the same model and machine:
float32 (the baseline) against the default dtype, per length, with the achieved and peak TFLOP/s that
`ropekit eval speed` recorded (its own matmul probe, in the model's dtype, in the same invocation).

    python scripts/speed_table.py BASELINE.jsonl DEFAULT.jsonl [--method plain]

Prints Markdown; a second table compares each other method with plain attention at the lengths both have.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def records(path: Path) -> dict[tuple[str, int], dict]:
    """(method, length) → the fastest repeat's record."""
    out: dict[tuple[str, int], dict] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        key = (r["method"], int(r["length"]))
        if key not in out or r["prefill_s"] < out[key]["prefill_s"]:
            out[key] = r
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline", type=Path)
    parser.add_argument("default", type=Path)
    parser.add_argument("--method", default="plain")
    args = parser.parse_args(argv)
    for path in (args.baseline, args.default):
        if not path.is_file():
            print(f"speed_table: no file '{path}'", file=sys.stderr)
            return 2
    base, new = records(args.baseline), records(args.default)
    lengths = sorted(n for (m, n) in new if m == args.method and (m, n) in base)
    b0 = next(iter(base.values()))
    n0 = next(iter(new.values()))
    print(f"| length | {b0['dtype']} (s) | default: {n0['dtype']} (s) | speed-up | {n0['dtype']} TFLOP/s "
          f"| measured {n0['dtype']} matmul peak | of peak |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in lengths:
        b, d = base[(args.method, n)], new[(args.method, n)]
        print(f"| {n:,} | {b['prefill_s']:.1f} | {d['prefill_s']:.1f} | {b['prefill_s'] / d['prefill_s']:.2f}× "
              f"| {d['prefill_tflops']:.2f} | {d['peak_tflops']:.2f} | {d['prefill_tflops'] / d['peak_tflops']:.0%} |")
    others = sorted((m, n) for (m, n) in new if m != args.method and (args.method, n) in new)
    if others:
        print()
        print(f"| length | method | {n0['dtype']} (s) | × {args.method} |")
        print("|---:|---|---:|---:|")
        for m, n in others:
            print(f"| {n:,} | {m} | {new[(m, n)]['prefill_s']:.1f} | "
                  f"{new[(m, n)]['prefill_s'] / new[(args.method, n)]['prefill_s']:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
