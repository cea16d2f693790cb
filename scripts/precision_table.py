"""float32 against bfloat16 on identical documents and prompts: the precision table of docs/results/precision.

    python scripts/precision_table.py FP32_STUDY_DIR BF16_STUDY_DIR [--train FP32_RUN BF16_RUN] > table.md

Perplexity: the bf16/fp32 ratio of exp(Σ NLL / Σ tokens) over the same documents, with a 95 % paired percentile
bootstrap over documents; passkey: accuracy in each dtype and their difference, paired bootstrap over prompts, or
Tango's paired score interval where both dtypes found exactly the same prompts (the same statistics as the study
report: ropekit.study.stats, 2,000 resamples, fixed seed). With --train, the
loss curves of two runs of one recipe (metrics.jsonl) step by step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from ropekit.study.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, no_discordance_interval, percentile_interval
from ropekit.study.store import StudyStore


def _by_unit(study: Path, task: str) -> dict[tuple, dict]:
    store = StudyStore(study / "study.sqlite")
    out = {}
    for r in store.samples(task=task):
        unit = (r["method"], r["length"], r.get("doc", r.get("depth")), r.get("trial"))
        out[unit] = r
    return out


def _draws(n: int) -> np.ndarray:
    return np.random.default_rng(BOOTSTRAP_SEED).integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))


def _fmt(ci) -> str:
    return "—" if ci is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def perplexity_rows(fp32: Path, bf16: Path) -> list[str]:
    a, b = _by_unit(fp32, "ppl-same-targets"), _by_unit(bf16, "ppl-same-targets")
    cells: dict[tuple, list[tuple]] = {}
    for unit in sorted(set(a) & set(b), key=str):
        cells.setdefault(unit[:2], []).append((a[unit]["nll_sum"], b[unit]["nll_sum"], a[unit]["tokens_scored"]))
    rows = ["| method | length | n docs | ppl float32 | ppl bfloat16 | bf16 ÷ fp32 [95 % CI] |", "|---|---:|---:|---:|---:|---:|"]
    for (method, length), values in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        x = np.array(values, dtype=float)
        ppl32, ppl16 = np.exp(x[:, 0].sum() / x[:, 2].sum()), np.exp(x[:, 1].sum() / x[:, 2].sum())
        idx = _draws(len(x))
        tok = x[idx, 2].sum(1)
        ratios = np.exp((x[idx, 1].sum(1) - x[idx, 0].sum(1)) / tok)
        rows.append(f"| {method} | {length} | {len(x)} | {ppl32:.3f} | {ppl16:.3f} | {ppl16 / ppl32:.4f} "
                    f"{_fmt(percentile_interval(ratios))} |")
    return rows


def passkey_rows(fp32: Path, bf16: Path) -> list[str]:
    """Accuracy in each dtype with the paired difference; how many prompts got another answer (the first integer
    of the reply) and how many another reply at all (beyond the window the replies are not numbers, and rounding
    can change them without changing any answer)."""
    a, b = _by_unit(fp32, "passkey"), _by_unit(bf16, "passkey")
    cells: dict[tuple, list[tuple]] = {}
    for unit in sorted(set(a) & set(b), key=str):
        cells.setdefault(unit[:2], []).append((a[unit]["score"], b[unit]["score"], a[unit].get("answer") != b[unit].get("answer"),
                                               a[unit].get("prediction") != b[unit].get("prediction")))
    rows = ["| method | length | n prompts | passkey float32 | passkey bfloat16 | bf16 − fp32 (points) [95 % CI] | "
            "answers differ | replies differ |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (method, length), values in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        x = np.array([v[:2] for v in values], dtype=float)
        idx = _draws(len(x))
        diff = (x[idx, 1] - x[idx, 0]).mean(1) * 100
        ci = percentile_interval(diff)
        if np.array_equal(x[:, 0], x[:, 1]) and np.isin(x, (0.0, 1.0)).all() and len(x) >= 2:
            # the same prompts found in both dtypes: every resample is 0 again, a point; Tango's paired score interval
            ci = tuple(100 * end for end in no_discordance_interval(len(x)))
        rows.append(f"| {method} | {length} | {len(x)} | {x[:, 0].mean():.0%} | {x[:, 1].mean():.0%} | "
                    f"{(x[:, 1].mean() - x[:, 0].mean()) * 100:+.1f} {'—' if ci is None else f'[{ci[0]:+.1f}, {ci[1]:+.1f}]'} | "
                    f"{sum(v[2] for v in values)} | {sum(v[3] for v in values)} |")
    return rows


def train_rows(fp32_run: Path, bf16_run: Path) -> list[str]:
    def losses(run: Path) -> dict[int, float]:
        out = {}
        for line in (run / "metrics.jsonl").read_text().splitlines():
            if line.strip():
                m = json.loads(line)
                if m.get("loss") is not None and m.get("step") is not None:
                    out[int(m["step"])] = float(m["loss"])
        return out

    a, b = losses(fp32_run), losses(bf16_run)
    steps = sorted(set(a) & set(b))
    rows = ["| step | loss fp32 | loss bf16 autocast | difference |", "|---:|---:|---:|---:|"]
    rows += [f"| {s} | {a[s]:.4f} | {b[s]:.4f} | {b[s] - a[s]:+.4f} |" for s in steps]
    if steps:
        worst = max(abs(b[s] - a[s]) for s in steps)
        rows.append(f"\nlargest |difference| over {len(steps)} steps: {worst:.4f}")
    return rows


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 5) or (len(argv) == 5 and argv[2] != "--train"):
        sys.exit(__doc__)
    fp32, bf16 = Path(argv[0]), Path(argv[1])
    print("\n".join(perplexity_rows(fp32, bf16)) + "\n")
    print("\n".join(passkey_rows(fp32, bf16)) + "\n")
    if len(argv) == 5:
        print("\n".join(train_rows(Path(argv[3]), Path(argv[4]))))


if __name__ == "__main__":
    main(sys.argv[1:])
