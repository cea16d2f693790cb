"""scripts/speed_table.py against records whose ratios are worked out by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "speed_table.py"


def _write(path: Path, dtype: str, rows: list[tuple[str, int, float, float, float]]) -> Path:
    with path.open("w") as f:
        for method, length, seconds, tflops, peak in rows:
            f.write(json.dumps({"method": method, "length": length, "dtype": dtype, "prefill_s": seconds,
                                "prefill_tflops": tflops, "peak_tflops": peak, "repeat": 0}) + "\n")
    return path


def test_speed_up_and_fraction_of_peak(tmp_path):
    base = _write(tmp_path / "fp32.jsonl", "float32", [("plain", 16384, 30.0, 0.4, 0.6), ("plain", 16384, 40.0, 0.3, 0.6)])
    new = _write(tmp_path / "bf16.jsonl", "bfloat16", [("plain", 16384, 12.0, 1.0, 2.0), ("self_extend", 16384, 18.0, 0.6, 2.0)])
    out = subprocess.run([sys.executable, str(SCRIPT), str(base), str(new)], capture_output=True, text=True, check=True).stdout
    # the fastest float32 repeat (30 s) over 12 s is 2.50x; 1.0 of a 2.0 TFLOP/s peak is 50 %; 18 / 12 = 1.50x
    assert "| 16,384 | 30.0 | 12.0 | 2.50× | 1.00 | 2.00 | 50% |" in out
    assert "| 16,384 | self_extend | 18.0 | 1.50× |" in out


def test_a_missing_file_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "nope.jsonl"), str(tmp_path / "x.jsonl")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no file" in done.stderr


def test_overhead_pairs_each_method_with_plain_of_the_same_repeat(tmp_path):
    def write(path, rows):
        with path.open("w") as f:
            for method, repeat, seconds in rows:
                f.write(json.dumps({"method": method, "length": 8192, "dtype": "float32", "prefill_s": seconds,
                                    "repeat": repeat}) + "\n")
        return path

    # before: 12/10, 26/20, 13/10 -> median 1.30 of [1.20, 1.30, 1.30]; after: 11/10, 22/20 -> 1.10 of two
    before = write(tmp_path / "before.jsonl", [("plain", 0, 10.0), ("self_extend", 0, 12.0), ("plain", 1, 20.0),
                                               ("self_extend", 1, 26.0), ("plain", 2, 10.0), ("self_extend", 2, 13.0)])
    after = write(tmp_path / "after.jsonl", [("plain", 0, 10.0), ("self_extend", 0, 11.0), ("plain", 1, 20.0),
                                             ("self_extend", 1, 22.0), ("dual_chunk", 1, 30.0)])
    out = subprocess.run([sys.executable, str(SCRIPT), "--overhead", str(before), str(after)], capture_output=True,
                         text=True, check=True).stdout
    assert "| 8,192 | self_extend | 1.30× [1.20, 1.30] (3 repeats) | 1.10× [1.10, 1.10] (2 repeats) |" in out
    assert "| 8,192 | dual_chunk | — | 1.50× (1 repeat) |" in out


def test_the_readme_speed_rows_are_what_the_committed_records_give():
    """The README's speed table quotes scripts/speed_table.py on the committed records, cell for cell."""
    root = SCRIPT.parents[1]
    readme = (root / "README.md").read_text()
    for folder, base, new in [("speed-amx", "speed-cpu-float32", "speed-cpu-auto"),
                              ("speed-amx-2core", "plain-fp32", "plain-auto")]:
        records = root / "docs" / "results" / folder
        out = subprocess.run([sys.executable, str(SCRIPT), str(records / f"{base}.jsonl"), str(records / f"{new}.jsonl")],
                             capture_output=True, text=True, check=True).stdout
        rows = [line.strip("|").split("|") for line in out.splitlines()
                if line.startswith(("| 16,384", "| 32,768")) and line.count("|") == 8]  # the plain rows, not the methods'
        assert len(rows) == 2
        for length, fp32, auto, speed_up, tflops, peak, share in ([c.strip() for c in row] for row in rows):
            quoted = f"| {length} | {fp32} s | {auto} s | {speed_up} | {tflops} | {share.replace('%', ' %')} (of {peak}"
            assert quoted in readme, quoted
