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


def test_a_study_whose_only_perplexity_is_same_targets_ranks_and_correlates_on_it():
    """The smollm2 preset measures perplexity only as ``ppl-same-targets``: the ranking's perplexity tie-break and
    the correlations read it (they read a task named ``ppl`` only, and ranked on accuracy alone)."""
    ppl = {"plain": [5.0, 50.0], "pi": [6.0, 8.0], "yarn": [5.5, 7.0], "ntk": [5.2, 12.0]}
    acc = {"plain": [1.0, 0.0], "pi": [1.0, 0.6], "yarn": [0.8, 0.6], "ntk": [1.0, 0.2]}
    recs = []
    for m in ppl:
        for i, L in enumerate((64, 128)):
            recs.append({**ppl_record(m, L, math.log(ppl[m][i]) * 10, 10), "task": "ppl-same-targets"})
            recs.append({"task": "passkey", "method": m, "length": L, "score": acc[m][i], "depth": 0.5, "trial": 0})
    table = stats.Table(stats.aggregate(recs))
    assert table.perplexity_task() == "ppl-same-targets"
    ranking = stats.rank_methods(table, window=64, target_length=128)
    # pi and yarn tie at 0.6 beyond the window; yarn's perplexity at 128 (7.0 against 8.0) puts it first
    assert [(r["rank"], r["method"]) for r in ranking["rows"]] == [(1, "yarn"), (2, "pi"), (3, "ntk"), (4, "plain")]
    assert ranking["ppl_task"] == "ppl-same-targets" and ranking["ppl_length"] == 128
    assert "ppl-same-targets perplexity at 128 tokens" in ranking["rule"]
    methods = ["plain", "pi", "yarn", "ntk"]
    expect, _ = naive_tau_b([ppl[m][1] for m in methods], [acc[m][1] for m in methods])
    rows = {r["mode"]: r for r in stats.perplexity_correlations(table, 128)}
    assert rows["target"]["tau"] == pytest.approx(expect)


# ---- bootstrap intervals, paired comparisons, seeds, ties --------------------------------------------------
# The references below re-implement the documented resampling by hand: the draws follow the contract of the
# stats module's docstring (numpy Generator with BOOTSTRAP_SEED; per stratum in ascending order,
# integers(0, n_s, size=(B, n_s))), the statistic is recomputed resample by resample in plain Python, and the
# percentiles come from sorting (linear interpolation between order statistics).
np = pytest.importorskip("numpy")
B = stats.BOOTSTRAP_RESAMPLES


def naive_percentile(values, q):
    """The q-th percentile by sorting, linear interpolation between the order statistics (numpy's default)."""
    xs = sorted(values)
    h = (len(xs) - 1) * q / 100
    lo = math.floor(h)
    return xs[lo] + (h - lo) * (xs[min(lo + 1, len(xs) - 1)] - xs[lo])


def draws(sizes, seed=stats.BOOTSTRAP_SEED):
    """The resamples' unit indices, per stratum (sizes in the strata's ascending order)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n, size=(B, n)).tolist() for n in sizes]


def acc_record(method, length, score, trial, **extra):
    return {"task": "passkey", "method": method, "params": {}, "length": length, "depth": 0.5, "trial": trial, "score": score, **extra}


def test_ppl_interval_is_the_document_bootstrap_of_the_pooled_perplexity():
    nll = [310.0, 260.0, 402.0, 280.0, 350.0, 295.0, 330.0]
    tokens = [63, 60, 63, 55, 63, 61, 63]
    recs = [ppl_record("yarn", 64, s, t, d) for d, (s, t) in enumerate(zip(nll, tokens))]
    (row,) = stats.aggregate(recs)
    (idx,) = draws([7])
    reps = [sum(nll[i] for i in row_) / sum(tokens[i] for i in row_) for row_ in idx]  # mean NLL of each resample
    expect = [math.exp(naive_percentile(reps, 2.5)), math.exp(naive_percentile(reps, 97.5))]
    assert row["value"] == pytest.approx(math.exp(sum(nll) / sum(tokens)))
    assert row["ci95"] == pytest.approx(expect, rel=1e-12) and row["n"] == 7
    assert row["ci95"][0] < row["value"] < row["ci95"][1]
    # deterministic: the same records give the same interval
    assert stats.aggregate(list(reversed(recs)))[0]["ci95"] == pytest.approx(row["ci95"], rel=1e-12)


def test_accuracy_interval_matches_the_exact_bootstrap_distribution():
    """Resampling 40 prompts of which 20 are right: the count of right ones in a resample is Binomial(40, 1/2),
    so the bootstrap interval is the binomial's 2.5 % and 97.5 % quantiles over 40 (up to one prompt)."""
    from scipy.stats import binom

    recs = [acc_record("pi", 128, float(i % 2), i) for i in range(40)]
    (row,) = stats.aggregate(recs)
    lo, hi = binom.ppf(0.025, 40, 0.5) / 40, binom.ppf(0.975, 40, 0.5) / 40
    assert (lo, hi) == (14 / 40, 26 / 40)
    assert row["value"] == 0.5 and row["ci95"][0] == pytest.approx(lo, abs=1 / 40) and row["ci95"][1] == pytest.approx(hi, abs=1 / 40)
    # all prompts alike: every resample is the point again; Wilson's score interval instead, written out here
    z = 1.959963984540054
    for score, n in ((1.0, 10), (0.0, 20)):
        (row,) = stats.aggregate([acc_record("pi", 128, score, i) for i in range(n)])
        bound = z * z / (n + z * z)  # Wilson at p̂ = 0: [0, z²/(n + z²)]; at p̂ = 1 its mirror
        assert row["ci95"] == pytest.approx([1 - bound, 1.0] if score else [0.0, bound], abs=1e-12)
    assert stats.aggregate([acc_record("pi", 128, 0.0, i) for i in range(20)])[0]["ci95"][1] == pytest.approx(0.1611, abs=1e-4)
    assert stats.wilson_interval(0, 20)[0] == 0.0 and stats.wilson_interval(20, 20)[1] == 1.0  # exactly, not 3e-18
    # partial credit, the same fraction on every prompt: Wilson's interval at p̂ = 0.5, written out
    (row,) = stats.aggregate([acc_record("pi", 128, 0.5, i) for i in range(20)])
    half = z / (1 + z * z / 20) * (0.25 / 20 + z * z / 1600) ** 0.5
    assert row["value"] == 0.5 and row["ci95"] == pytest.approx([0.5 - half, 0.5 + half], abs=1e-12)
    assert row["ci95"][0] == pytest.approx(0.2993, abs=1e-4)
    # one prompt, or one document: no interval at all
    (row,) = stats.aggregate([acc_record("pi", 128, 1.0, 0)])
    assert row["ci95"] is None and row["n"] == 1
    (row,) = stats.aggregate([ppl_record("yarn", 64, 300.0, 60, 0)])
    assert row["ci95"] is None


def test_a_mean_over_lengths_whose_prompts_all_passed_gets_wilsons_interval():
    """The report's "best beyond the window" pools several lengths: 20 + 20 prompts all found is 100 % with Wilson's
    interval over the 40, not [100, 100]; a mixed pooled cell keeps the bootstrap."""
    recs = [acc_record("dyn", L, 1.0, i) for L in (128, 256) for i in range(20)]
    st = stats.Analysis(recs)
    z2 = 1.959963984540054 ** 2
    assert st.mean_interval("dyn", "passkey", [128, 256], "accuracy") == pytest.approx([40 / (40 + z2), 1.0])
    mixed = stats.Analysis(recs[:20] + [acc_record("dyn", 256, float(i % 2), i) for i in range(20)])
    lo, hi = mixed.mean_interval("dyn", "passkey", [128, 256], "accuracy")
    assert lo < 0.75 < hi < 1.0
    # one partial-credit fraction everywhere: Wilson's interval at p̂ = 0.5 over the 40 (it truncated 0.5 to 0)
    half = stats.Analysis([acc_record("dyn", L, 0.5, i) for L in (128, 256) for i in range(20)])
    w = 1.959963984540054 / (1 + z2 / 40) * (0.25 / 40 + z2 / 6400) ** 0.5
    assert half.mean_interval("dyn", "passkey", [128, 256], "accuracy") == pytest.approx([0.5 - w, 0.5 + w])


def test_manyshot_weighs_each_shot_count_alike():
    """At one length: 10 zero-shot queries right, 2 eight-shot queries wrong — the micro mean (10/12) would be the
    zero-shot score; the macro mean over shot counts is (1 + 0)/2."""
    recs = [{"task": "manyshot", "method": "pi", "params": {}, "length": 256, "shots": k, "sample": f"q{i}",
             "score": 1.0 if k == 0 else 0.0} for k, n in ((0, 10), (8, 2)) for i in range(n)]
    (row,) = stats.aggregate(recs)
    assert row["value"] == pytest.approx(0.5) and row["n"] == 12


def test_manyshot_and_needle_intervals_resample_clusters_not_prompts():
    """Many-shot asks each query at every shot count, and a needle trial keeps its haystack at every depth: their
    scores move together, so the interval resamples queries (trials), each drawn one with all its shot counts
    (depths). Reference: a naive loop over the resamples' drawn queries. Resampling (shots, query) pairs one by one
    gives an interval about half as wide when a query's score is the same at every shot count."""
    right = [1.0 if i % 2 else 0.0 for i in range(20)]  # query i: right at every shot count, or wrong at every one
    shots = (0, 4, 16, 64)
    recs = [{"task": "manyshot", "method": "pi", "params": {}, "length": 256, "shots": k, "sample": i,
             "score": right[i]} for k in shots for i in range(20)]
    (row,) = stats.aggregate(recs)
    (idx,) = draws([20])  # the 20 queries, drawn once per resample for every shot count
    reps = [sum(sum(right[i] for i in row_) / 20 for _ in shots) / len(shots) for row_ in idx]
    want = [naive_percentile(reps, 2.5), naive_percentile(reps, 97.5)]
    assert row["value"] == 0.5 and row["ci95"] == pytest.approx(want, abs=1e-12)
    per_pair = draws([20] * len(shots))  # the old contract: each shot count's queries drawn on their own
    old = [sum(sum(right[i] for i in rows[b]) / 20 for rows in per_pair) / len(shots) for b in range(B)]
    assert want[1] - want[0] > 1.6 * (naive_percentile(old, 97.5) - naive_percentile(old, 2.5))
    # a needle trial's 5 depths share its haystack: trials are the clusters
    found = {t: [1.0, 1.0, 0.0, 1.0, 0.0] if t % 3 else [0.0] * 5 for t in range(9)}
    recs = [{"task": "niah", "method": "pi", "params": {}, "length": 256, "depth": d / 4, "trial": t,
             "score": found[t][d]} for t in range(9) for d in range(5)]
    (row,) = stats.aggregate(recs)
    (idx,) = draws([9])
    reps = [sum(sum(found[t]) for t in row_) / 45 for row_ in idx]
    assert row["ci95"] == pytest.approx([naive_percentile(reps, 2.5), naive_percentile(reps, 97.5)], abs=1e-12)
    # paired comparisons draw the same clusters on both sides
    other = [{**r, "method": "yarn", "score": 1.0} for r in recs]
    c = stats.Analysis(recs + other).compare("yarn", "pi", "niah", 256, "accuracy")
    diffs = [sum(5 - sum(found[t]) for t in row_) / 45 for row_ in idx]
    assert c["ci95"] == pytest.approx([naive_percentile(diffs, 2.5), naive_percentile(diffs, 97.5)], abs=1e-12)
    assert c["n"] == 9  # trials, not the 45 prompts
    # one haystack at 11 depths is one draw: no interval (every resample would repeat it), nothing significant, and a
    # cell whose every prompt passed gets Wilson's interval over its haystacks, not over its prompts
    one = [{"task": "niah", "method": m, "params": {}, "length": 256, "depth": d / 10, "trial": 0,
            "score": float(m == "yarn" or d % 2)} for m in ("pi", "yarn") for d in range(11)]
    analysis = stats.Analysis(one)
    assert analysis.table.row("pi", "niah", 256, "accuracy")["ci95"] is None
    c = analysis.compare("yarn", "pi", "niah", 256, "accuracy")
    assert c["n"] == 1 and not c["significant"]
    three = [{**r, "trial": t} for r in one if r["method"] == "yarn" for t in range(3)]
    z2 = 1.959963984540054 ** 2
    assert stats.Analysis(three).table.row("yarn", "niah", 256, "accuracy")["ci95"] == pytest.approx([3 / (3 + z2), 1.0])


def test_macro_average_resamples_within_subtasks():
    scores = {"a": [1.0, 0.0, 1.0], "b": [0.0, 0.0, 1.0, 0.5, 1.0]}
    recs = [{"task": "ruler", "method": "yarn", "params": {}, "length": 64, "subtask": sub, "sample": i, "score": s}
            for sub, ss in scores.items() for i, s in enumerate(ss)]
    (row,) = stats.aggregate(recs)
    ia, ib = draws([3, 5])  # strata in ascending order: a, b
    reps = [(sum(scores["a"][i] for i in ra) / 3 + sum(scores["b"][i] for i in rb) / 5) / 2 for ra, rb in zip(ia, ib)]
    assert row["value"] == pytest.approx((2 / 3 + 2.5 / 5) / 2)
    assert row["ci95"] == pytest.approx([naive_percentile(reps, 2.5), naive_percentile(reps, 97.5)], rel=1e-12)


def test_subtasks_each_all_alike_get_the_mean_of_their_wilson_intervals():
    """RULER with one subtask all found and one all missed: every stratified resample is 0.5 again, which read
    [50, 50] beside subtask rows of [72, 100] and [0, 28]. Each subtask's Wilson interval, written out, and their
    mean (a macro average weighs subtasks equally) is the cell's interval."""
    z2 = 1.959963984540054 ** 2
    recs = [{"task": "ruler", "method": "ntk", "params": {}, "length": 64, "subtask": sub, "sample": i, "score": score}
            for sub, score, n in (("a", 1.0, 10), ("b", 0.0, 10)) for i in range(n)]
    (row,) = stats.aggregate(recs)
    low_b, high_b = 0.0, z2 / (10 + z2)  # Wilson at 0 of 10; at 10 of 10 its mirror
    low_a, high_a = 1 - high_b, 1.0
    assert row["value"] == 0.5
    assert row["ci95"] == pytest.approx([(low_a + low_b) / 2, (high_a + high_b) / 2], abs=1e-12)
    assert row["ci95"][0] < 0.5 < row["ci95"][1]
    # three subtasks, two of them alike and one mixed: the bootstrap has something to resample, and keeps it
    mixed = recs + [{"task": "ruler", "method": "ntk", "params": {}, "length": 64, "subtask": "c", "sample": i,
                     "score": float(i % 2)} for i in range(10)]
    (row,) = stats.aggregate(mixed)
    assert row["ci95"][0] < row["ci95"][1] and row["value"] == pytest.approx(0.5)


def test_all_found_against_all_missed_gets_newcombes_interval_not_a_point():
    """Every prompt found by one method and missed by the other: every paired resample is +100 points, which read
    "+100 [+100, +100]". Newcombe's hybrid score interval (method 10), written out from the Wilson bounds, instead;
    still significant. A perplexity ratio that is the same on every document stays the point it is."""
    z2 = 1.959963984540054 ** 2
    recs = [acc_record("pose-yarn", 256, 1.0, i) for i in range(20)] + [acc_record("yarn", 256, 0.0, i) for i in range(20)]
    c = stats.Analysis(recs).compare("pose-yarn", "yarn", "passkey", 256, "accuracy")
    upper_of_zero = z2 / (20 + z2)  # Wilson at 0 of 20; at 20 of 20 the lower bound is its mirror
    margin = math.sqrt(upper_of_zero ** 2 + upper_of_zero ** 2)
    assert c["estimate"] == 1.0 and c["ci95"] == pytest.approx([1.0 - margin, 1.0], abs=1e-12)
    assert c["significant"] and c["direction"] == 1 and c["ci95"][0] == pytest.approx(0.772, abs=1e-3)
    # both alike and equal: the difference 0 with an interval around it, not significant
    same = [acc_record(m, 256, 1.0, i) for m in ("a", "b") for i in range(20)]
    c = stats.Analysis(same).compare("a", "b", "passkey", 256, "accuracy")
    assert c["ci95"][0] < 0 < c["ci95"][1] and not c["significant"]


def test_paired_comparison_is_tight_where_cells_are_wide():
    """Documents differ a lot, methods by a constant 2 % per token: each cell's interval is wide, but the paired
    ratio is the same in every resample, and significant."""
    hard = [3.0, 4.5, 3.4, 5.0, 3.9, 4.2]
    recs = [ppl_record("a", 64, h * 50, 50, d) for d, h in enumerate(hard)]
    recs += [ppl_record("b", 64, (h + 0.02) * 50, 50, d) for d, h in enumerate(hard)]
    analysis = stats.Analysis(recs)
    ca, cb = analysis.table.row("a", "ppl", 64, "ppl")["ci95"], analysis.table.row("b", "ppl", 64, "ppl")["ci95"]
    assert ca[1] > cb[0]  # the cells' intervals overlap …
    c = analysis.compare("b", "a", "ppl", 64, "ppl")
    assert c["kind"] == "ratio" and c["estimate"] == pytest.approx(math.exp(0.02))
    assert c["ci95"] == pytest.approx([math.exp(0.02)] * 2) and c["significant"] and c["direction"] == 1 and c["n"] == 6  # … the pair does not


def test_paired_accuracy_difference_against_a_naive_paired_bootstrap():
    a = [1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1]
    b = [0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0]
    recs = [acc_record("a", 64, float(s), i) for i, s in enumerate(a)] + [acc_record("b", 64, float(s), i) for i, s in enumerate(b)]
    c = stats.Analysis(recs).compare("a", "b", "passkey", 64, "accuracy")
    (idx,) = draws([12])
    reps = [sum(a[i] - b[i] for i in row) / 12 for row in idx]
    assert c["kind"] == "difference" and c["estimate"] == pytest.approx(5 / 12) and c["n"] == 12
    assert c["ci95"] == pytest.approx([naive_percentile(reps, 2.5), naive_percentile(reps, 97.5)], abs=1e-12)
    assert c["significant"] == (c["ci95"][0] > 0)
    # with fewer shared prompts than MIN_PAIRED nothing is called significant, whatever the interval
    few = [acc_record("a", 64, 1.0, i) for i in range(3)] + [acc_record("b", 64, 0.0, i) for i in range(3)]
    c = stats.Analysis(few).compare("a", "b", "passkey", 64, "accuracy")
    upper_of_zero = 1.959963984540054 ** 2 / (3 + 1.959963984540054 ** 2)  # Newcombe's interval over 3 prompts
    assert c["ci95"] == pytest.approx([1.0 - math.sqrt(2) * upper_of_zero, 1.0], abs=1e-12)
    assert not c["significant"] and c["direction"] == 0


def test_paired_difference_on_part_of_the_units_resamples_the_shared_ones_alone():
    """Method b was scored on 8 of the 12 prompts: the pair's bootstrap draws 8 of those 8 in every resample
    (the contract applied to the shared units), not 12 of the union with a varying number of shared ones."""
    a = [1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1]
    b = [0, 1, 0, 0, 1, 0, 0, 1]
    recs = [acc_record("a", 64, float(s), i) for i, s in enumerate(a)] + [acc_record("b", 64, float(s), i) for i, s in enumerate(b)]
    c = stats.Analysis(recs).compare("a", "b", "passkey", 64, "accuracy")
    (idx,) = draws([8])
    reps = [sum(a[i] - b[i] for i in row) / 8 for row in idx]
    assert c["n"] == 8 and c["estimate"] == pytest.approx(sum(a[:8]) / 8 - sum(b) / 8)
    assert c["ci95"] == pytest.approx([naive_percentile(reps, 2.5), naive_percentile(reps, 97.5)], abs=1e-12)
    # perplexity over two lengths where b lacks a different document at each: the units shared at either
    # length (all four here, documents 0-3) are resampled, each length paired on its own shared documents
    nll = {0: 3.0, 1: 4.0, 2: 3.5, 3: 5.0}
    recs = [ppl_record("a", L, nll[d] * 10, 10, d) for L in (64, 128) for d in nll]
    recs += [ppl_record("b", 64, (nll[d] + 0.1 * d) * 10, 10, d) for d in (0, 1, 2)]
    recs += [ppl_record("b", 128, (nll[d] + 0.1 * d) * 10, 10, d) for d in (1, 2, 3)]
    recs += [ppl_record("c", 64, 30.0, 10, 4)]  # a unit neither a nor b has: not drawn for their pair
    c = stats.Analysis(recs).compare("b", "a", "ppl", [64, 128], "ppl")
    (idx,) = draws([4])
    shared = {64: (0, 1, 2), 128: (1, 2, 3)}

    def length_diff(row, length):
        drawn = [d for d in row if d in shared[length]]
        return sum(0.1 * d * 10 for d in drawn) / (10 * len(drawn)) if drawn else float("nan")

    reps = [(length_diff(row, 64) + length_diff(row, 128)) / 2 for row in idx]
    finite = [r for r in reps if r == r]
    assert c["kind"] == "ratio" and c["n"] == 3
    assert c["estimate"] == pytest.approx(math.exp((0.1 + 0.2) / 2))
    assert c["ci95"] == pytest.approx([math.exp(naive_percentile(finite, 2.5)), math.exp(naive_percentile(finite, 97.5))],
                                      rel=1e-12)


def test_seeds_are_averaged_and_their_spread_reported():
    recs = []
    for seed, shift in ((0, 0.0), (1, 0.1), (2, 0.3)):
        recs += [ppl_record("yarn-ft", 64, (2.0 + shift + d / 10) * 40, 40, d, seed=seed) for d in range(4)]
        recs += [acc_record("yarn-ft", 64, float(i < 2 + seed), i, seed=seed) for i in range(6)]
    table = stats.Analysis(recs).table
    per_seed = [math.exp(statistics_mean([2.0 + s + d / 10 for d in range(4)])) for s in (0.0, 0.1, 0.3)]
    row = table.row("yarn-ft", "ppl", 64, "ppl")
    assert row["seeds"] == 3 and row["n"] == 4
    assert row["value"] == pytest.approx(math.exp(statistics_mean([math.log(p) for p in per_seed])))  # geometric mean
    assert (row["seed_min"], row["seed_max"]) == pytest.approx((per_seed[0], per_seed[2]))
    row = table.row("yarn-ft", "passkey", 64, "accuracy")
    accs = [2 / 6, 3 / 6, 4 / 6]
    assert row["value"] == pytest.approx(0.5) and row["seed_sd"] == pytest.approx(statistics_stdev(accs))
    assert row["seed_values"] == pytest.approx({"0": accs[0], "1": accs[1], "2": accs[2]})
    # no seed field: one seed, no seed keys
    assert "seeds" not in stats.aggregate([acc_record("x", 64, 1.0, 0)])[0]


def statistics_mean(xs):
    return sum(xs) / len(xs)


def statistics_stdev(xs):
    m = statistics_mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def test_kendall_interval_resamples_methods():
    """Without sample noise (every document and prompt of a method alike) the two-level bootstrap reduces to
    resampling methods: compare with τ-b counted pair by pair on the documented method draws."""
    ppl = {"m0": 5.0, "m1": 6.0, "m2": 7.5, "m3": 8.0, "m4": 9.0, "m5": 12.0}
    acc = {"m0": 0.9, "m1": 0.8, "m2": 0.85, "m3": 0.4, "m4": 0.5, "m5": 0.1}
    recs = []
    for m, p in ppl.items():
        recs += [ppl_record(m, 128, math.log(p) * 10, 10, d) for d in range(3)]
        recs += [acc_record(m, 128, acc[m], t) for t in range(4)]
    table = stats.Analysis(recs).table
    (row,) = [k for k in stats.perplexity_correlations(table, 128) if k["mode"] == "target"]
    names = list(ppl)
    idx = np.random.default_rng(stats.BOOTSTRAP_SEED + 1).integers(0, 6, size=(B, 6)).tolist()
    taus = []
    for r in idx:
        x, y = [ppl[names[i]] for i in r], [acc[names[i]] for i in r]
        if len(set(x)) > 1 and len(set(y)) > 1:
            taus.append(naive_tau_b(x, y)[0])
    assert row["tau"] == pytest.approx(naive_tau_b([ppl[m] for m in names], [acc[m] for m in names])[0])
    assert row["ci95"] == pytest.approx([naive_percentile(taus, 2.5), naive_percentile(taus, 97.5)], abs=1e-12)


def test_pooled_kendall_over_tasks():
    recs = []
    for i, m in enumerate(("a", "b", "c", "d")):
        recs += [ppl_record(m, 128, (2.0 + i / 10) * 10, 10, d) for d in range(2)]
        recs += [acc_record(m, 128, 1.0 - i / 4, t) for t in range(2)]
        recs += [{"task": "niah", "method": m, "params": {}, "length": 128, "depth": 0.5, "trial": t, "score": [0.5, 0.7, 0.2, 0.1][i]}
                 for t in range(2)]
    rows = stats.perplexity_correlations(stats.Analysis(recs).table, 128)
    (pooled,) = [k for k in rows if k["task"] == "pooled" and k["mode"] == "target"]
    mean_acc = [(1.0 - i / 4 + [0.5, 0.7, 0.2, 0.1][i]) / 2 for i in range(4)]
    assert pooled["tasks"] == ["passkey", "niah"] and pooled["methods"] == ["a", "b", "c", "d"]
    assert pooled["tau"] == pytest.approx(naive_tau_b([2.0, 2.1, 2.2, 2.3], mean_acc)[0])


def test_ranking_ties_methods_inside_the_noise():
    """a and b solve the same prompts but one (12 prompts, 1 discordant): tied; c solves far fewer: below both.
    Perplexity 129.0 against 129.1 with document noise does not separate a and b either."""
    a = [1.0] * 10 + [0.0, 1.0]
    b = [1.0] * 10 + [1.0, 0.0]
    c = [1.0, 0.0] * 6
    recs = []
    noise = [0.3, -0.2, 0.1, -0.4, 0.25, 0.0]
    jitter = [0.05, -0.04, 0.03, -0.05, 0.06, -0.05]  # b against a, document by document: no consistent direction
    for m, scores, p in (("a", a, 129.0), ("b", b, 129.1), ("c", c, 129.05)):
        recs += [acc_record(m, 128, s, i) for i, s in enumerate(scores)]
        recs += [ppl_record(m, 128, (math.log(p) + noise[d] + (jitter[d] if m == "b" else 0.0)) * 20, 20, d) for d in range(6)]
    table = stats.Analysis(recs).table
    ranking = stats.rank_methods(table, window=64, target_length=128)
    got = {r["method"]: (r["rank"], r["tied"]) for r in ranking["rows"]}
    assert got == {"a": (1, True), "b": (1, True), "c": (3, False)}
    assert [r["method"] for r in ranking["rows"]][-1] == "c"
    assert "significantly better" in ranking["rule"] and "tied" in ranking["rule"]
    # a consistent shift of b, document by document, is significant however small
    shifted = [r for r in recs if r["task"] != "ppl" or r["method"] != "b"]
    shifted += [ppl_record("b", 128, (math.log(129.0) + noise[d] + 0.002) * 20, 20, d) for d in range(6)]
    ranking = stats.rank_methods(stats.Analysis(shifted).table, window=64, target_length=128)
    assert {r["method"]: r["rank"] for r in ranking["rows"]} == {"a": 1, "b": 2, "c": 3}


# ---- alike prompts, decided on the scores -------------------------------------------------------------------------
Z = 1.959963984540054


def wilson(p, n):
    """Wilson's score interval at p̂ = p over n (Wilson 1927), written out: the centre and half-width of its roots."""
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z / (1 + Z * Z / n) * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe(pa, pb, n):
    """Newcombe's hybrid score interval of pa − pb over n each (Newcombe 1998, method 10), from the Wilson bounds."""
    (la, ua), (lb, ub) = wilson(pa, n), wilson(pb, n)
    d = pa - pb
    return d - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2), d + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)


def test_a_partial_credit_score_alike_on_every_prompt_gets_wilsons_interval_not_a_point():
    """Resampled sums of 0.3 (or 1/3) come back a rounding error apart, so the bootstrap percentiles differ in the
    last bit: a point all the same. Alike is read off the scores, and the cell gets Wilson's interval at p̂ = score
    (statsmodels' ``proportion_confint(6, 20, method="wilson")`` is [0.14548, 0.51897])."""
    for score in (0.3, 1 / 3, 0.7, 2 / 3, 0.1):
        for n in (7, 20, 33):
            (row,) = stats.aggregate([acc_record("pi", 128, score, i) for i in range(n)])
            assert row["ci95"] == pytest.approx(list(wilson(score, n)), abs=1e-12), (score, n)
            assert row["ci95"][1] - row["ci95"][0] > 0.1
    assert wilson(0.3, 20) == pytest.approx((0.14547724486760422, 0.5189728183535234), abs=1e-12)


def test_partial_credit_alike_cells_compare_by_newcombe_not_by_a_point():
    """0.3 on every one of 20 prompts against 0.2 on every one: the paired bootstrap's percentiles came out 1 ulp
    apart around +0.1, which was called significant. Newcombe's interval instead — statsmodels'
    ``confint_proportions_2indep(6, 20, 4, 20, method="newcomb")`` gives [-0.16560, 0.34938] — and not significant."""
    for pa, pb, ref in ((0.3, 0.2, (-0.16559520494618835, 0.34938261502879964)),
                        (0.7, 0.6, (-0.18421852136771144, 0.36348574471989653))):
        recs = [acc_record("a", 64, pa, i) for i in range(20)] + [acc_record("b", 64, pb, i) for i in range(20)]
        c = stats.Analysis(recs).compare("a", "b", "passkey", 64, "accuracy")
        assert c["ci95"] == pytest.approx(list(newcombe(pa, pb, 20)), abs=1e-12)
        assert c["ci95"] == pytest.approx(list(ref), abs=1e-9)
        assert not c["significant"] and c["direction"] == 0
    # RULER subtasks each alike at its own partial-credit fraction: the mean of the subtasks' Wilson bounds
    fractions = {"a": 1 / 3, "b": 2 / 3, "c": 0.1}
    recs = [{"task": "ruler", "method": "m", "params": {}, "length": 64, "subtask": sub, "sample": i, "score": sc}
            for sub, sc in fractions.items() for i in range(15)]
    (row,) = stats.aggregate(recs)
    bounds = [wilson(p, 15) for p in fractions.values()]
    assert row["ci95"] == pytest.approx([sum(lo for lo, _ in bounds) / 3, sum(hi for _, hi in bounds) / 3], abs=1e-12)


def test_a_mean_over_lengths_each_alike_at_its_own_score_is_not_a_point():
    """Every prompt found at 256 and none at 512: every resample of the mean is 0.5 again. Each length's Wilson
    interval over its 20 prompts, and the mean of their bounds (the mean over lengths weighs them equally)."""
    recs = [acc_record("m", L, float(L == 256), t) for L in (256, 512) for t in range(20)]
    st = stats.Analysis(recs)
    (lo1, hi1), (lo0, hi0) = wilson(1.0, 20), wilson(0.0, 20)
    assert (lo0, hi1) == (0.0, 1.0) and hi0 == pytest.approx(0.1611251580528194)  # statsmodels' Wilson at 0 of 20
    got = st.mean_interval("m", "passkey", [256, 512], "accuracy")
    assert got == pytest.approx([(lo1 + lo0) / 2, (hi1 + hi0) / 2], abs=1e-12)
    assert got == pytest.approx([0.4194, 0.5806], abs=1e-4)
    # the paired difference over those lengths against a method that found nothing: per length Newcombe, then the
    # mean of the bounds (a point +0.5 [+0.5, +0.5] before)
    other = [acc_record("z", L, 0.0, t) for L in (256, 512) for t in range(20)]
    c = stats.Analysis(recs + other).compare("m", "z", "passkey", [256, 512], "accuracy")
    (a_lo, a_hi), (b_lo, b_hi) = newcombe(1.0, 0.0, 20), newcombe(0.0, 0.0, 20)
    assert c["estimate"] == pytest.approx(0.5)
    assert c["ci95"] == pytest.approx([(a_lo + b_lo) / 2, (a_hi + b_hi) / 2], abs=1e-12)
    assert c["significant"]  # its lower bound, (0.772 − 0.161) / 2, is still above 0


def test_kendall_interval_depends_on_the_data_not_on_record_order_or_labels():
    """The two-level bootstrap draws methods by position. The positions follow the methods' (log-perplexity,
    accuracy), not the order their records came in: the reference numbers the methods by perplexity and counts τ-b
    pair by pair on the documented draws; the records come in another order, then reversed, then relabelled."""
    ppl = {"q": 5.0, "c": 6.0, "x": 7.5, "a": 8.0, "m": 9.0, "b": 12.0}
    acc = {"q": 0.9, "c": 0.8, "x": 0.85, "a": 0.4, "m": 0.5, "b": 0.1}
    first_seen = ["m", "a", "q", "b", "x", "c"]  # neither perplexity order nor name order

    def records(order, rename=lambda m: m):
        recs = []
        for m in order:
            recs += [ppl_record(rename(m), 128, math.log(ppl[m]) * 10, 10, d) for d in range(3)]
            recs += [acc_record(rename(m), 128, acc[m], t) for t in range(4)]
        return recs

    def interval(recs):
        (row,) = [k for k in stats.perplexity_correlations(stats.Analysis(recs).table, 128) if k["mode"] == "target"]
        return row["ci95"]

    by_ppl = sorted(ppl, key=ppl.get)
    idx = np.random.default_rng(stats.BOOTSTRAP_SEED + 1).integers(0, 6, size=(B, 6)).tolist()
    taus = []
    for r in idx:
        x, y = [ppl[by_ppl[i]] for i in r], [acc[by_ppl[i]] for i in r]
        if len(set(x)) > 1 and len(set(y)) > 1:
            taus.append(naive_tau_b(x, y)[0])
    want = [naive_percentile(taus, 2.5), naive_percentile(taus, 97.5)]
    got = interval(records(first_seen))
    assert got == pytest.approx(want, abs=1e-12)
    assert interval(list(reversed(records(first_seen)))) == pytest.approx(want, abs=1e-12)
    renamed = {"q": "zz", "c": "aa", "x": "mm", "a": "yy", "m": "bb", "b": "cc"}
    assert interval(records(first_seen, renamed.get)) == pytest.approx(want, abs=1e-12)


def test_a_ranking_row_above_another_is_not_a_pairwise_verdict():
    """Significance is not transitive. A and B: accuracy difference inside the noise (naive paired bootstrap below)
    and the same NLL on every document; C beats B on accuracy (C finds 4 prompts more, none fewer: a resample shows no
    difference only when it draws none of the 4, with probability 0.8²⁰ ≈ 1.2 % < 2.5 %) and A beats C on perplexity
    (C's NLL is 0.2 higher on every document). So B ranks 2 behind A although A does not beat it, and C shares rank 2
    with B although it beats B: ``beats`` says which pairs differ, and the rule says a rank is not that."""
    acc = {"A": [0] * 7 + [1] * 12 + [0], "B": [1] * 7 + [0] * 13, "C": [1] * 11 + [0] * 9}
    recs = []
    for m, scores in acc.items():
        recs += [acc_record(m, 128, float(s), t) for t, s in enumerate(scores)]
        recs += [ppl_record(m, 128, (3 + 0.3 * (d % 3) + (0.2 if m == "C" else 0)) * 10, 10, d) for d in range(8)]
    (idx,) = draws([20])

    def naive(x, y):
        reps = [sum(acc[x][i] - acc[y][i] for i in row) / 20 for row in idx]
        return naive_percentile(reps, 2.5), naive_percentile(reps, 97.5)

    assert naive("A", "B")[0] < 0 < naive("A", "B")[1] and naive("A", "C")[0] < 0 < naive("A", "C")[1]
    assert naive("C", "B")[0] > 0 and 0.8 ** 20 < 0.025
    ranking = stats.rank_methods(stats.Analysis(recs).table, window=64, target_length=128)
    got = {r["method"]: (r["rank"], r["beats"]) for r in ranking["rows"]}
    assert got == {"A": (1, ["C"]), "C": (2, ["B"]), "B": (2, [])}
    assert [r["method"] for r in ranking["rows"]] == ["A", "C", "B"]
    assert [r["tied_with_next"] for r in ranking["rows"]] == [False, False, False]
    assert "not transitive" in ranking["rule"] and "not by itself significantly better" in ranking["rule"]


def test_interval_ends_a_few_ulps_off_zero_are_zero():
    """0.1 + 0.2 − 0.3 is 5.6e-17 in floating point, as a difference of two accuracies summed in another order came
    out in the smollm2 report: a lower end of exactly that made a tie "significant" and moved a rank. Such ends are 0,
    so the interval does not exclude 0; a real effect of 1e-6 stays."""
    import numpy as np

    noise = 0.1 + 0.2 - 0.3
    assert noise > 0
    assert stats.percentile_interval(np.array([noise] * 30 + [0.5] * 70)) == (0.0, 0.5)
    assert stats.percentile_interval(np.array([-noise] * 70 + [-0.5] * 30)) == (-0.5, 0.0)
    assert stats.percentile_interval(np.array([1e-6] * 30 + [0.5] * 70)) == (1e-6, 0.5)


def test_subtasks_each_alike_compare_by_the_mean_of_their_newcombe_intervals():
    """RULER at one length: A finds every needle of subtask a and none of b, the control none of either. Every
    stratified paired resample is +50 again, which read "+50 [+50, +50]"; each subtask's Newcombe interval over its
    own prompts, written out, and their mean (a macro average weighs subtasks equally) instead."""
    def ruler(method, scores, sizes):
        return [{"task": "ruler", "method": method, "params": {}, "length": 64, "subtask": sub, "sample": i,
                 "score": scores[sub]} for sub, n in sizes.items() for i in range(n)]

    sizes = {"a": 10, "b": 20}
    recs = ruler("a", {"a": 1.0, "b": 0.0}, sizes) + ruler("ctl", {"a": 0.0, "b": 0.0}, sizes)
    c = stats.Analysis(recs).compare("a", "ctl", "ruler", 64, "accuracy")
    (a_lo, a_hi), (b_lo, b_hi) = newcombe(1.0, 0.0, 10), newcombe(0.0, 0.0, 20)
    assert c["estimate"] == pytest.approx(0.5)
    assert c["ci95"] == pytest.approx([(a_lo + b_lo) / 2, (a_hi + b_hi) / 2], abs=1e-12)
    assert c["ci95"][0] < 0.5 < c["ci95"][1] and c["significant"]
    # the same over two lengths: each length's interval, then the mean of their bounds
    recs2 = recs + [dict(r, length=128) for r in recs]
    c2 = stats.Analysis(recs2).compare("a", "ctl", "ruler", [64, 128], "accuracy")
    assert c2["ci95"] == pytest.approx(c["ci95"], abs=1e-12)
    # a subtask whose prompts differ within it: the bootstrap has something to resample and keeps it
    mixed = recs + [{"task": "ruler", "method": m, "params": {}, "length": 64, "subtask": "c", "sample": i,
                     "score": float(i % 2) if m == "a" else 0.0} for m in ("a", "ctl") for i in range(10)]
    c3 = stats.Analysis(mixed).compare("a", "ctl", "ruler", 64, "accuracy")
    strata_bounds = [newcombe(1.0, 0.0, 10), newcombe(0.0, 0.0, 20)]
    assert c3["ci95"] != pytest.approx([sum(lo for lo, _ in strata_bounds) / 2, sum(hi for _, hi in strata_bounds) / 2])
    assert c3["ci95"][0] < c3["ci95"][1]


def tango_interval(b, c, n, z=Z):
    """Tango's score interval for a paired difference of proportions (Tango 1998, Statistics in Medicine 17:891),
    solved numerically: the Δ where (b − c − nΔ)/√(n(2q̂ + Δ(1 − Δ))) = ∓z, q̂ the constrained maximum-likelihood
    estimate of the (0, 1) cell's probability."""
    def score(delta):
        w = -b - c + (2 * n - b + c) * delta
        q = (math.sqrt(w * w + 8 * n * c * delta * (1 - delta)) - w) / (4 * n)
        return (b - c - n * delta) / math.sqrt(n * (2 * q + delta * (1 - delta)))

    def solve(target, lo, hi):  # score decreases in Δ
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if score(mid) > target else (lo, mid)
        return (lo + hi) / 2

    estimate = (b - c) / n
    return solve(z, -1 + 1e-12, estimate), solve(-z, estimate, 1 - 1e-12)


def test_two_methods_that_find_the_same_prompts_get_tangos_paired_interval_not_a_point():
    """Both find 19 of 20 passkeys, missing the same one: every paired difference is 0, and the bootstrap's
    "+0 [+0, +0]" read as certainty that they retrieve alike (the smollm2 and quick retention tables). Tango's paired
    score interval instead, solved from its score statistic: ±16 points at n = 20, whatever the two find (Newcombe's
    paired method would shrink to a point at 10 of 20); not significant, as before. Over two lengths, the mean of the
    per-length bounds."""
    found = [1.0] * 19 + [0.0]
    recs = [acc_record(m, 64, s, t) for m in ("a", "b") for t, s in enumerate(found)]
    c = stats.Analysis(recs).compare("a", "b", "passkey", 64, "accuracy")
    want = tango_interval(0, 0, 20)
    assert want[1] == pytest.approx(0.1611251580528194, abs=1e-9)  # the Wilson bound of 0 of 20
    assert c["estimate"] == 0 and c["ci95"] == pytest.approx(list(want), abs=1e-9)
    assert not c["significant"]
    # a second length of 30 prompts where both find the same 15
    half = [float(t % 2) for t in range(30)]
    recs2 = recs + [acc_record(m, 128, s, t) for m in ("a", "b") for t, s in enumerate(half)]
    c2 = stats.Analysis(recs2).compare("a", "b", "passkey", [64, 128], "accuracy")
    other = tango_interval(0, 0, 30)
    assert c2["ci95"] == pytest.approx([(want[0] + other[0]) / 2, (want[1] + other[1]) / 2], abs=1e-9)
    # a prompt found by one side only leaves the bootstrap its interval
    moved = [acc_record("a", 64, s, t) for t, s in enumerate(found)] + \
            [acc_record("b", 64, s, t) for t, s in enumerate([0.0] + found[1:])]
    c3 = stats.Analysis(moved).compare("a", "b", "passkey", 64, "accuracy")
    assert c3["ci95"] != pytest.approx(list(want))
