"""The README's speed table from two `ropekit eval speed --out` files of the same model and machine:
float32 (the baseline) against the default dtype, per length, with the achieved and peak TFLOP/s that
`ropekit eval speed` recorded (its own matmul probe, in the model's dtype, in the same invocation).

    python scripts/speed_table.py BASELINE.jsonl DEFAULT.jsonl [--method plain]
    python scripts/speed_table.py --overhead BEFORE.jsonl AFTER.jsonl

Prints Markdown; a second table compares each other method with plain attention at the lengths both have.
``--overhead`` compares two runs of the same dtype (code before and after a change): each method's prefill time
over plain's *in the same repeat* (`ropekit eval speed` interleaves the methods, so a repeat's ratio is paired
against load drifting between repeats), the median over repeats with the smallest and largest.
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


def paired_ratios(path: Path, reference: str) -> dict[tuple[str, int], list[float]]:
    """(method, length) → method's prefill time ÷ ``reference``'s, one ratio per repeat both have."""
    by_repeat: dict[tuple[str, int, int], float] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            by_repeat[(r["method"], int(r["length"]), int(r.get("repeat", 0)))] = r["prefill_s"]
    ratios: dict[tuple[str, int], list[float]] = {}
    for (method, length, repeat), seconds in sorted(by_repeat.items()):
        base = by_repeat.get((reference, length, repeat))
        if method != reference and base:
            ratios.setdefault((method, length), []).append(seconds / base)
    return ratios


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def overhead_table(before: Path, after: Path, reference: str) -> None:
    old, new = paired_ratios(before, reference), paired_ratios(after, reference)

    def cell(values: list[float] | None) -> str:
        if not values:
            return "—"
        if len(values) == 1:
            return f"{values[0]:.2f}× (1 repeat)"
        return f"{_median(values):.2f}× [{min(values):.2f}, {max(values):.2f}] ({len(values)} repeats)"

    print(f"| length | method | before: × {reference} | after: × {reference} |")
    print("|---:|---|---:|---:|")
    for method, length in sorted(set(old) | set(new), key=lambda k: (k[1], k[0])):
        print(f"| {length:,} | {method} | {cell(old.get((method, length)))} | {cell(new.get((method, length)))} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline", type=Path)
    parser.add_argument("default", type=Path)
    parser.add_argument("--method", default="plain")
    parser.add_argument("--overhead", action="store_true",
                        help="each method over plain per repeat, BASELINE (before) against DEFAULT (after)")
    args = parser.parse_args(argv)
    for path in (args.baseline, args.default):
        if not path.is_file():
            print(f"speed_table: no file '{path}'", file=sys.stderr)
            return 2
    if args.overhead:
        overhead_table(args.baseline, args.default, args.method)
        return 0
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
