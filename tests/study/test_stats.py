"""Study statistics against independent references: Kendall τ-b against a naive O(n²) count with ties and its
p-value against the exact permutation distribution and Kendall's tie-corrected normal approximation;
aggregates against hand computations."""

from __future__ import annotations

import itertools
import math

import pytest

from ropekit.errors import RopekitError
from ropekit.study import stats


def naive_tau_b(x, y):
    """τ-b by counting every pair (Kendall 1945): (P − Q) / √((n₀ − n₁)(n₀ − n₂))."""
    n = len(x)
    p = q = tx = ty = 0
    for i, j in itertools.combinations(range(n), 2):
        dx, dy = x[i] - x[j], y[i] - y[j]
        if dx == 0:
            tx += 1
        if dy == 0:
            ty += 1
        if dx * dy > 0:
            p += 1
        elif dx * dy < 0:
            q += 1
    n0 = n * (n - 1) / 2
    return (p - q) / math.sqrt((n0 - tx) * (n0 - ty)), p - q


def tie_groups(values):
    return [values.count(v) for v in set(values)]


def normal_p_with_ties(x, y):
    """Two-sided p of S = P − Q under H0 with the tie-corrected variance (Kendall 1970, Rank Correlation Methods §4)."""
    n = len(x)
    _, s = naive_tau_b(x, y)
    t, u = tie_groups(list(x)), tie_groups(list(y))
    v0 = n * (n - 1) * (2 * n + 5)
    vt = sum(a * (a - 1) * (2 * a + 5) for a in t)
    vu = sum(b * (b - 1) * (2 * b + 5) for b in u)
    v1 = sum(a * (a - 1) for a in t) * sum(b * (b - 1) for b in u) / (2 * n * (n - 1))
    v2 = sum(a * (a - 1) * (a - 2) for a in t) * sum(b * (b - 1) * (b - 2) for b in u) / (9 * n * (n - 1) * (n - 2))
    var = (v0 - vt - vu) / 18 + v1 + v2
    return math.erfc(abs(s) / math.sqrt(var) / math.sqrt(2))


def test_kendall_tau_b_with_ties_matches_naive_count_and_normal_p():
    x = [1, 2, 2, 3, 4, 4, 5, 6, 7, 8]
    y = [2, 1, 3, 3, 5, 4, 4, 7, 6, 8]
    tau, _ = naive_tau_b(x, y)
    got = stats.kendall_tau(x, y)
    assert got.n == 10
    assert got.tau == pytest.approx(tau, abs=1e-12)
    assert got.p_value == pytest.approx(normal_p_with_ties(x, y), rel=1e-9)
    # direction: reversing one list flips the sign only
    assert stats.kendall_tau(x, [-v for v in y]).tau == pytest.approx(-tau, abs=1e-12)


def test_kendall_tau_small_hand_case_and_exact_p_without_ties():
    assert stats.kendall_tau([1, 2, 3], [1, 3, 2]).tau == pytest.approx(1 / 3)  # P = 2, Q = 1
    x = [1.5, 2.0, 3.0, 4.5, 5.0, 6.0]
    y = [0.9, 0.7, 0.8, 0.3, 0.4, 0.1]
    tau, _ = naive_tau_b(x, y)
    # exact two-sided p: the share of the 720 orderings of y at least as extreme as the observed one
    extreme = sum(1 for perm in itertools.permutations(y) if abs(naive_tau_b(x, list(perm))[0]) >= abs(tau) - 1e-12)
    got = stats.kendall_tau(x, y)
    assert got.tau == pytest.approx(tau) and tau == pytest.approx(-11 / 15)
    assert got.p_value == pytest.approx(extreme / 720, rel=1e-9)
    assert 0.05 < extreme / 720 < 0.1 and stats.interpret(got) == "borderline significant (p < 0.1)"


def test_kendall_tau_undefined_and_errors():
    assert stats.kendall_tau([1, 2, 3], [0.5, 0.5, 0.5]).tau is None
    assert stats.kendall_tau([1], [2]).reason == "fewer than two methods"
    with pytest.raises(RopekitError):
        stats.kendall_tau([1, 2], [1])
    with pytest.raises(RopekitError):
        stats.kendall_tau([1, float("nan")], [1, 2])


def ppl_record(method, length, nll_sum, tokens, doc=0, **extra):
    return {"task": "ppl", "method": method, "params": {}, "length": length, "doc": doc, "nll_sum": nll_sum,
            "tokens_scored": tokens, "score": None, "corpus": "c", "score_mode": "last_stride", "stride": 32,
            "weighting": "token", "add_bos": False, **extra}


def test_ppl_is_token_weighted_and_protocols_must_agree():
    recs = [ppl_record("plain", 64, 10.0, 4, 0), ppl_record("plain", 64, 2.0, 4, 1), ppl_record("plain", 64, 3.0, 2, 2)]
    (row,) = stats.aggregate(recs)
    assert (row["metric"], row["n"], row["tokens_scored"]) == ("ppl", 3, 10)
    assert row["value"] == pytest.approx(math.exp(15.0 / 10))  # not the mean of per-document perplexities
    window = [ppl_record("plain", 64, 0, 0, d, weighting="window", windows=w, window_mean_nll_sum=s)
              for d, (w, s) in enumerate([(2, 3.0), (3, 6.0)])]
    assert stats.aggregate(window)[0]["value"] == pytest.approx(math.exp(9.0 / 5))
    with pytest.raises(RopekitError, match="mix protocols"):
        stats.aggregate([ppl_record("plain", 64, 1.0, 1, 0), ppl_record("plain", 64, 1.0, 1, 1, stride=16)])


def test_accuracy_speed_entropy_aggregates():
    recs = [{"task": "passkey", "method": "yarn", "length": 64, "score": s, "depth": 0.5, "trial": i} for i, s in enumerate([1, 0, 1, 1])]
    # RULER: subtask a has 4 samples all right, b one wrong: macro mean 0.5 (the sample mean would be 0.8)
    recs += [{"task": "ruler", "method": "yarn", "length": 64, "subtask": "a", "sample": i, "score": 1.0} for i in range(4)]
    recs += [{"task": "ruler", "method": "yarn", "length": 64, "subtask": "b", "sample": 0, "score": 0.0}]
    for method, prefill in (("plain", [1.0, 3.0, 2.0]), ("yarn", [4.0, 5.0, 9.0])):
        recs += [{"task": "speed", "method": method, "length": 128, "repeat": i, "prefill_s": p,
                  "decode_s_per_token": 0.1 * (i + 1), "peak_mem_bytes": 1000 * (2 if method == "yarn" else 1)}
                 for i, p in enumerate(prefill)]
    recs += [{"task": "entropy", "method": "yarn", "length": 64, "sample": i, "entropy_last": e, "normalised_last": e / 4}
             for i, e in enumerate([1.0, 2.0])]
    table = stats.Table(stats.aggregate(recs))
    assert table.get("yarn", "passkey", 64, "accuracy") == pytest.approx(0.75)
    assert table.get("yarn", "ruler", 64, "accuracy") == pytest.approx(0.5)
    assert table.get("yarn", "speed", 128, "prefill_s") == 5.0
    assert table.get("yarn", "speed", 128, "prefill_ratio") == pytest.approx(5.0 / 2.0)  # medians 5 and 2
    assert table.get("yarn", "speed", 128, "decode_ratio") == pytest.approx(1.0)
    assert table.get("yarn", "speed", 128, "memory_ratio") == pytest.approx(2.0)
    assert table.get("plain", "speed", 128, "prefill_ratio") == pytest.approx(1.0)
    assert table.get("yarn", "entropy", 64, "entropy_last") == pytest.approx(1.5)
    assert table.get("yarn", "entropy", 64, "normalised_last") == pytest.approx(0.375)
    rows = stats.aggregate(recs)
    assert [r["task"] for r in rows] == sorted((r["task"] for r in rows), key=["passkey", "ruler", "entropy", "speed"].index)
    assert all(set(r) >= {"method", "task", "length", "metric", "value", "n"} for r in rows)


def test_nll_curves_exact_from_sums_and_weighted_from_finished_curves():
    a = ppl_record("plain", 8, 0, 0, 0, curve_nll_sum=[4.0, 2.0], curve_tokens=[2, 1], curve_positions=[0, 4])
    b = ppl_record("plain", 8, 0, 0, 1, curve_nll_sum=[2.0, 0.0], curve_tokens=[2, 0], curve_positions=[0, 4])
    (c,) = stats.nll_curves([a, b])
    assert c["positions"] == [0, 4] and c["mean_nll"] == pytest.approx([6.0 / 4, 2.0 / 1])
    g1 = ppl_record("pi", 8, 0, 3, 0, nll_curve=[1.0, 3.0], nll_curve_positions=[0, 4])
    g2 = ppl_record("pi", 8, 0, 1, 1, nll_curve=[2.0, None], nll_curve_positions=[0, 4])
    (c,) = stats.nll_curves([g1, g2])
    assert c["mean_nll"] == pytest.approx([(3 * 1.0 + 2.0) / 4, 3.0])


def test_perplexity_correlations_and_ranking():
    ppl = {"plain": [5.0, 50.0], "pi": [6.0, 8.0], "yarn": [5.5, 7.0], "ntk": [5.2, 12.0]}
    acc = {"plain": [1.0, 0.0], "pi": [1.0, 0.6], "yarn": [0.8, 0.6], "ntk": [1.0, 0.2]}
    recs = []
    for m in ppl:
        for i, L in enumerate((64, 128)):
            recs.append(ppl_record(m, L, math.log(ppl[m][i]) * 10, 10))
            recs.append({"task": "passkey", "method": m, "length": L, "score": acc[m][i], "depth": 0.5, "trial": 0})
    table = stats.Table(stats.aggregate(recs))
    rows = {r["mode"]: r for r in stats.perplexity_correlations(table, 128)}
    methods = ["plain", "pi", "yarn", "ntk"]
    expect, _ = naive_tau_b([ppl[m][1] for m in methods], [acc[m][1] for m in methods])
    assert rows["target"]["lengths"] == [128] and rows["target"]["tau"] == pytest.approx(expect)
    mean_expect, _ = naive_tau_b([sum(math.log(v) for v in ppl[m]) / 2 for m in methods], [sum(acc[m]) / 2 for m in methods])
    assert rows["mean"]["lengths"] == [64, 128] and rows["mean"]["tau"] == pytest.approx(mean_expect)
    assert rows["target"]["tau"] < 0  # lower perplexity, higher accuracy
    # the target was not evaluated: the longest shared length is used
    assert stats.perplexity_correlations(table, 4096)[0]["lengths"] == [128]

    ranking = stats.rank_methods(table, window=64, target_length=128)
    # beyond the window (128 only): pi 0.6 and yarn 0.6 tie, yarn has the lower ppl at 128; ntk 0.2; plain 0
    assert [(r["rank"], r["method"]) for r in ranking["rows"]] == [(1, "yarn"), (2, "pi"), (3, "ntk"), (4, "plain")]
    assert ranking["task"] == "passkey" and ranking["lengths"] == [128] and ranking["ppl_length"] == 128
    assert "beyond the pretrained window of 64" in ranking["rule"]
    # equal keys share a rank; a method without the primary value ranks last
    twin = [r for r in recs if r["method"] == "pi"]
    twin = [{**r, "method": "pi2"} for r in twin] + [ppl_record("lonely", 128, 1.0, 1)]
    ranking = stats.rank_methods(stats.Table(stats.aggregate(recs + twin)), window=64, target_length=128)
    ranks = {r["method"]: r["rank"] for r in ranking["rows"]}
    assert ranks["pi"] == ranks["pi2"] == 2 and ranks["ntk"] == 4 and ranking["rows"][-1]["method"] == "lonely"
