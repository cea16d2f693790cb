"""Are two runs of a study the same measurements? Compare their databases and reports, timings left out.

Usage: python scripts/compare_studies.py STUDY_DIR_A STUDY_DIR_B

Compares, between the two ``study.sqlite`` files, every sample (score and full record), every piece (kind,
method, parameters, task) and every training step (loss, learning rate, tokens, record), with wall-clock fields
removed; then the report's figures byte for byte and ``summary.json`` field by field, again without timings.
Prints what differs and exits 1 if anything does — used to show that a refactor changes no number
(docs/design.md).
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

#: Record fields that measure time, not results.
TIMING = {"seconds", "elapsed", "time", "duration", "durations", "wall", "wall_seconds", "created", "updated",
          "generated", "tokens_per_second", "step_seconds", "eval_seconds", "train_seconds", "search_seconds",
          "pretrain_seconds", "cost", "machine"}


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _tables(directory: Path) -> dict[str, dict]:
    db = sqlite3.connect(directory / "study.sqlite")
    samples = {(p, k): (s, json.dumps(_strip(json.loads(r)), sort_keys=True))
               for p, k, s, r in db.execute("SELECT piece, sample_key, score, record FROM samples")}
    pieces = {i: rest for i, *rest in db.execute("SELECT id, kind, method, params, task FROM pieces")}
    steps = {(p, s): (loss, lr, tokens, json.dumps(_strip(json.loads(r)), sort_keys=True))
             for p, s, loss, lr, tokens, r in db.execute("SELECT piece, step, loss, lr, tokens, record FROM train_metrics")}
    return {"samples": samples, "pieces": pieces, "train_metrics": steps}


def main() -> int:
    a, b = Path(sys.argv[1]), Path(sys.argv[2])
    differences = 0
    ta, tb = _tables(a), _tables(b)
    for name in ta:
        keys = set(ta[name]) | set(tb[name])
        diff = sorted(str(k) for k in keys if ta[name].get(k) != tb[name].get(k))
        differences += len(diff)
        print(f"{name}: {len(ta[name])} vs {len(tb[name])} rows, {len(diff)} differ" + (f" (first: {diff[0]})" if diff else ""))
    ra, rb = a / "report", b / "report"
    for figure in sorted(p.name for p in ra.glob("*.png")):
        same = (rb / figure).is_file() and (ra / figure).read_bytes() == (rb / figure).read_bytes()
        differences += not same
        print(f"{figure}: {'identical' if same else 'DIFFERS'}")
    if (ra / "summary.json").is_file():
        sa, sb = (_strip(json.loads((r / "summary.json").read_text())) for r in (ra, rb))
        same = sa == sb
        differences += not same
        print(f"summary.json without timings: {'identical' if same else 'DIFFERS'}")
    print("the same measurements" if not differences else f"{differences} differences")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
