"""scripts/precision_table.py on two hand-made studies: the pooled perplexities and their ratio, the passkey
accuracies, and the counts of prompts whose answer or whose reply changed with the dtype."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

from ropekit.study.store import StudyStore

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "precision_table.py"


def _study(path: Path, nll: list[float], replies: list[str]) -> Path:
    path.mkdir()
    with StudyStore(path / "study.sqlite") as store:
        store.begin_piece("eval:ppl-same-targets:base", kind="eval", method="base", task="ppl-same-targets")
        store.add_samples("eval:ppl-same-targets:base", [
            {"task": "ppl-same-targets", "method": "base", "params": {}, "length": 8192, "doc": d, "nll_sum": v,
             "tokens_scored": 100} for d, v in enumerate(nll)], key_fields=("task", "method", "params", "length", "doc"))
        store.finish_piece("eval:ppl-same-targets:base", [])
        store.begin_piece("eval:passkey:base", kind="eval", method="base", task="passkey")
        records = []
        for trial, reply in enumerate(replies):
            answer = int(reply) if reply.isdigit() else None
            records.append({"task": "passkey", "method": "base", "params": {}, "length": 16384, "depth": 0.5,
                            "trial": trial, "prediction": reply, "answer": answer, "passkey": 42,
                            "score": float(answer == 42)})
        store.add_samples("eval:passkey:base", records)
        store.finish_piece("eval:passkey:base", [])
    return path


def test_the_table_from_two_studies(tmp_path):
    fp32 = _study(tmp_path / "fp32", [200.0, 300.0], ["42", "42", "7", "the the"])
    bf16 = _study(tmp_path / "bf16", [210.0, 300.0], ["42", "9", "7", "the is"])
    done = subprocess.run([sys.executable, str(SCRIPT), fp32, bf16], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    rows = {line.split("|")[1].strip() + line.split("|")[2].strip(): [c.strip() for c in line.split("|")[3:-1]]
            for line in done.stdout.splitlines() if line.startswith("| base")}
    # perplexity pooled over documents: exp(Σ NLL / Σ tokens) in each dtype
    n, ppl32, ppl16, ratio = rows["base8192"][:4]
    assert n == "2" and float(ppl32) == round(math.exp(500 / 200), 3) and float(ppl16) == round(math.exp(510 / 200), 3)
    assert ratio.startswith(f"{math.exp(10 / 200):.4f}")
    # passkey: 2 of 4 against 1 of 4; one answer changed (42 -> 9), two replies besides (the -> is, 42 -> 9)
    n, acc32, acc16, diff, answers, replies = rows["base16384"]
    assert (n, acc32, acc16, answers, replies) == ("4", "50%", "25%", "1", "2") and diff.startswith("-25.0")


def test_the_same_prompts_found_in_both_dtypes_get_tangos_paired_interval(tmp_path):
    """Both dtypes find the same 2 of 4 passkeys: every paired resample is 0, which the table showed as
    "+0.0 [+0.0, +0.0]"; Tango's paired score interval now, which with no discordant prompt is ±z²/(n + z²) (its
    score statistic −√(nΔ/(1 − Δ)) = −z solved by hand: Δ = z²/(n + z²))."""
    fp32 = _study(tmp_path / "fp32", [200.0, 300.0], ["42", "42", "7", "the the"])
    bf16 = _study(tmp_path / "bf16", [200.0, 300.0], ["42", "42", "8", "the is"])
    done = subprocess.run([sys.executable, str(SCRIPT), fp32, bf16], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("| base | 16384")]
    z2 = 1.959963984540054 ** 2
    bound = 100 * z2 / (4 + z2)
    assert row.split("|")[6].strip() == f"+0.0 [{-bound:+.1f}, {bound:+.1f}]"
