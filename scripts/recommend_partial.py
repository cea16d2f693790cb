"""Apply `ropekit recommend`'s rule (ropekit.study.recommend_rule) to the candidates whose evidence finished in a
recommendation's study that did not finish (its device time ran out, say), and print the order, why each lost,
and the evidence table. The command's own result needs every candidate; this says what the finished ones show.

    python scripts/recommend_partial.py DIR

DIR is the command's study directory (`.OUT.recommend/<id>/` beside its --out directory: `plan.json` and
`frozen/study.sqlite`), or a folder holding `plan.json` and `study.sqlite` (docs/results/recommend-smollm2-16k/).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ropekit.study.recommend import BASE_LABEL, Candidate
from ropekit.study.recommend_rule import decide
from ropekit.study.store import StudyStore

CELLS = ("ppl@{w}", "ppl@{n}", "passkey@{w}", "passkey@{n}", "ruler@{w}", "ruler@{n}")


def _cell(key: str, c) -> str:
    if not c or c.get("value") is None:
        return "–"
    lo, hi = c["ci95"]
    if key.startswith("ppl"):
        return f"{c['value']:.3g} [{lo:.3g}, {hi:.3g}]"
    return f"{100 * c['value']:.0f} [{100 * lo:.0f}, {100 * hi:.0f}]"  # an accuracy, in %


def main(argv: list[str]) -> int:
    where = Path(argv[0]) if len(argv) == 1 else None
    # the command's own layout (.OUT.recommend/<id>/plan.json beside frozen/study.sqlite) or both in one folder
    db = None if where is None else next((p for p in (where / "study.sqlite", where / "frozen" / "study.sqlite")
                                          if p.is_file()), None)
    if where is None or db is None or not (where / "plan.json").is_file():
        print("usage: python scripts/recommend_partial.py DIR (with plan.json, and study.sqlite or frozen/study.sqlite)",
              file=sys.stderr)
        return 2
    plan = json.loads((where / "plan.json").read_text())
    with StudyStore(db, create=False) as store:
        done = {p["id"] for p in store.pieces() if p["status"] == "done"}
        records = store.samples()
    tasks = [t for t in ("ppl", "passkey", "ruler") if t in plan["evaluations"]]
    finished, missing = [], []
    for raw in plan["candidates"]:
        cand = Candidate(**{**raw, "simplicity": tuple(raw["simplicity"])})
        (finished if all(f"eval:{t}:{cand.label}" in done for t in tasks) else missing).append(cand)
    verdict = decide(records, finished, plan["window"], plan["target_length"])
    w, n = plan["window"], plan["target_length"]
    print(f"{plan['model']} to {n} tokens for {plan['engine']}: {len(finished)} of {len(plan['candidates'])} "
          f"candidates finished" + (f" (not: {', '.join(c.label for c in missing)})" if missing else ""))
    print(f"chosen among them: {verdict.winner}; runner-up: {verdict.runner_up}")
    for label in verdict.order:
        print(f"  {label}: {verdict.why[label]}")
    print()
    print(f"| candidate | ppl {w} | ppl {n} | passkey {w} (%) | passkey {n} (%) | RULER {w} (%) | RULER {n} (%) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label in [BASE_LABEL, *verdict.order]:
        ev = verdict.evidence[label]
        print(f"| {label} | " + " | ".join(_cell(k, ev.get(k.format(w=w, n=n))) for k in CELLS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
