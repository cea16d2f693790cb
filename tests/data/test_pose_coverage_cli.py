"""`ropekit pose-coverage` (PoSE paper App. B, Fig. 5): its numbers against naive enumerations and the
training sampler itself, its options, and bad input as one line with a non-zero exit code."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from ropekit.data import pose

LC, LT = 5, 14  # small enough to enumerate every draw of the sampler and every RandPos subset


def _distances(positions, target_length: int) -> np.ndarray:
    """Boolean [target_length]: which differences p − q (p ≥ q) occur among ``positions`` (O(n²))."""
    seen = np.zeros(target_length, dtype=bool)
    for a in positions:
        for b in positions:
            if a >= b:
                seen[a - b] = True
    return seen


def _naive_pose2(lc: int, lt: int) -> np.ndarray:
    """Exact 2-chunk coverage: average over every (l0, u1) pair, both uniform (paper Fig. 6), of the
    distances the example's positions contain."""
    total = np.zeros(lt)
    draws = [(l0, u1) for l0 in range(1, lc) for u1 in range(lt - lc + 1)]
    for l0, u1 in draws:
        positions = list(range(l0)) + [u1 + k for k in range(l0, lc)]
        total += _distances(positions, lt)
    return total / len(draws)


def _naive_randpos(lc: int, lt: int) -> np.ndarray:
    subsets = list(itertools.combinations(range(lt), lc))
    return sum(_distances(s, lt).astype(float) for s in subsets) / len(subsets)


def _sampled(lc: int, lt: int, steps: int, seed: int, n_chunks: int | None) -> np.ndarray:
    """What the training sampler gives for examples 0 … steps−1 (None = RandPos), counted pair by pair."""
    total = np.zeros(lt)
    for k in range(steps):
        g = pose.item_generator(seed, 0, k)
        positions = (pose.randpos_positions(lc, lt, g) if n_chunks is None
                     else pose.pose_sample(lc, lt, n_chunks=n_chunks, generator=g).position_ids)
        total += _distances([int(p) for p in positions], lt)
    return total / steps


def test_json_curves_equal_naive_enumerations_and_the_sampler(run_cli):
    code, out, err = run_cli("pose-coverage", "--window", str(LC), "--target", str(LT), "--chunks", "2,3",
                             "--steps", "300", "--seed", "4", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["train_length"], report["target_length"], report["steps"], report["seed"]) == (LC, LT, 300, 4)
    curves = {c["name"]: c for c in report["curves"]}
    assert list(curves) == ["original window", "PoSE (2 chunks)", "PoSE (3 chunks)", "RandPos"]
    assert curves["original window"]["exact"] == [1.0] * LC + [0.0] * (LT - LC)
    np.testing.assert_allclose(curves["PoSE (2 chunks)"]["exact"], _naive_pose2(LC, LT), atol=1e-12)
    np.testing.assert_allclose(curves["PoSE (3 chunks)"]["exact"], pose.exact_coverage(LC, LT, 3), atol=1e-12)
    np.testing.assert_allclose(curves["RandPos"]["exact"], _naive_randpos(LC, LT), atol=1e-12)
    for name, n in (("PoSE (2 chunks)", 2), ("PoSE (3 chunks)", 3), ("RandPos", None)):
        sampled = _sampled(LC, LT, 300, 4, n)
        np.testing.assert_allclose(curves[name]["empirical"], sampled, atol=1e-12)  # --steps and --seed reach the sampler
        assert curves[name]["max_abs_error"] == pytest.approx(np.abs(sampled - np.array(curves[name]["exact"])).max())


def test_table_prints_the_summary_of_the_exact_curves(run_cli):
    code, out, err = run_cli("pose-coverage", "--window", str(LC), "--target", str(LT), "--chunks", "2",
                             "--steps", "50")
    assert code == 0, err
    exact = _naive_pose2(LC, LT)
    row = next(line for line in out.splitlines() if "PoSE (2 chunks)" in line).split()
    # curve name (3 words), source, mean P in [1, Lc), mean beyond, min beyond, P(Lt − 1), never covered, error
    assert row[3] == "exact"
    assert row[4:8] == [f"{exact[1:LC].mean():.4f}", f"{exact[LC:].mean():.4f}", f"{exact[LC:].min():.4f}",
                        f"{exact[LT - 1]:.4f}"]
    assert row[8] == str(int((exact[1:] == 0).sum()))
    original = next(line for line in out.splitlines() if "original window" in line).split()
    assert original[2:8] == ["exact", "1.0000", "0.0000", "0.0000", "0.0000", str(LT - LC)]
    assert "RandPos" in out and "PoSE (3 chunks)" not in out


def test_scheme_exact_and_plot_options(run_cli, tmp_path):
    code, out, _ = run_cli("pose-coverage", "-w", "8", "-t", "32", "--scheme", "randpos", "--steps", "20", "--json")
    assert code == 0 and [c["name"] for c in json.loads(out)["curves"]] == ["original window", "RandPos"]
    code, out, _ = run_cli("pose-coverage", "-w", "8", "-t", "32", "--scheme", "pose", "--chunks", "3",
                           "--steps", "20", "--exact", "never", "--json")
    curves = json.loads(out)["curves"]
    assert code == 0 and [c["name"] for c in curves] == ["original window", "PoSE (3 chunks)"]
    assert curves[1]["exact"] is None and curves[1]["max_abs_error"] is None
    np.testing.assert_allclose(curves[1]["empirical"], _sampled(8, 32, 20, 0, 3), atol=1e-12)
    figure = tmp_path / "fig" / "coverage.png"
    code, out, err = run_cli("pose-coverage", "-w", "8", "-t", "32", "--steps", "20", "--plot", str(figure))
    assert code == 0 and str(figure) in err
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, needle", [
    (["--window", "64", "--target", "32"], "--target 32 is below --window 64"),
    (["--window", "0"], "--window"),
    (["--window", "4", "--target", "16", "--chunks", "5"], "do not fit"),
    (["--window", "8", "--target", "16", "--chunks", "0"], "--chunks"),
    (["--window", "8", "--target", "16", "--chunks", "two"], "--chunks"),
    (["--window", "8", "--target", "16", "--steps", "0"], "steps"),
    (["--window", "8", "--target", "16", "--scheme", "ntk"], "--scheme"),
    (["--window", "8", "--target", "16", "--exact", "maybe"], "--exact"),
    (["--window", "8", "--target", "16", "--plot", "coverage.pdf"], ".png"),
    (["--window", "2048", "--target", "16384", "--chunks", "3", "--exact", "always"], "too large"),
    (["--window", "many"], "--window"),
    (["--window", "64", "--target", "100000000000"], "past 16,777,216 tokens"),  # was a 745 GiB MemoryError
])
def test_bad_input_is_one_line_and_nonzero(run_cli, tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("pose-coverage", *args)
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error:") and needle in err
    assert list(tmp_path.iterdir()) == []  # nothing written
