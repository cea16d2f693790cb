"""The report's findings, control table, method cards and figures on synthetic studies with known effects
(:mod:`synthetic_study`): a study shaped like the ``quick`` preset where every claim is built to hold, one
where they are built to fail, and one that lacks what most claims need."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synthetic_study as ss

from ropekit.study import report_findings as findings
from ropekit.study.report import write_report
from ropekit.study.report_figures import _Figures, png_size

HOLDS, FAILS, INCONCLUSIVE, ABSENT = findings.HOLDS, findings.FAILS, findings.INCONCLUSIVE, findings.ABSENT


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The 22 variants of the quick preset's shape (seeds for the fine-tuned ones), with its report."""
    directory = tmp_path_factory.mktemp("quick")
    records = ss.build(directory, ss.QUICK, seeds=[0, 1])
    paths = write_report(directory)
    return directory, records, paths, json.loads(Path(paths["json"]).read_text())


def verdicts(summary):
    return {c["id"]: c["verdict"] for c in summary["findings"]["claims"]}


def test_claims_that_hold(quick):
    _, records, _, summary = quick
    got = verdicts(summary)
    assert {k: got[k] for k in "abcdf"} == {k: HOLDS for k in "abcdf"}
    assert got["e"] in (HOLDS, INCONCLUSIVE)
    claims = {c["id"]: c for c in summary["findings"]["claims"]}
    # (a): the base model's 2k/256 ratio, by hand from the records (mean NLL per token, same documents)
    def nll(method, L):
        rs = [r for r in records["ppl"] if r["method"] == method and r["length"] == L]
        return sum(r["nll_sum"] for r in rs) / sum(r["tokens_scored"] for r in rs)
    ratio = math.exp(nll("base", 2048) - nll("base", 256))
    assert f"ratio to the window {ratio:.3f}" in " ".join(claims["a"]["evidence"])
    assert "score mode truncate" in " ".join(claims["a"]["evidence"])  # the caveat of non-same-target scoring
    assert any(e.startswith("pose-yarn vs yarn-ft") for e in claims["d"]["evidence"])
    assert any(e.startswith("pose-pi vs pi-ft") for e in claims["d"]["evidence"])
    assert {e.split(":")[0].split(" vs ")[0] for e in claims["f"]["evidence"]} == {"ntk-ft", "yarn-ft"}
    assert all(c["rule"] and c["source"] for c in claims.values())
    head = summary["findings"]["headline"]
    assert head.startswith("At 1k tokens (4× the 256-token window) the lowest perplexity is") and "claims checked below" in head


def test_control_table_and_its_paired_intervals(quick):
    directory, records, _, summary = quick
    assert summary["control"]["label"] == "base-ft"
    effects = {(e["method"], e["task"], e["length"]): e for e in summary["control"]["effects"]}
    e = effects[("yarn-ft", "ppl", 1024)]
    # fine-tuned variants carry two seeds: the ratio is of the seed-averaged mean NLL, per document
    def mean_nll(method):
        seeds = sorted({r.get("seed") for r in records["ppl"] if r["method"] == method}, key=str)
        per = []
        for s in seeds:
            rs = [r for r in records["ppl"] if r["method"] == method and r["length"] == 1024 and r.get("seed") == s]
            per.append(sum(r["nll_sum"] for r in rs) / sum(r["tokens_scored"] for r in rs))
        return sum(per) / len(per)
    assert e["estimate"] == pytest.approx(math.exp(mean_nll("yarn-ft") - mean_nll("base-ft")))
    assert e["kind"] == "ratio" and e["significant"] and e["ci95"][1] < 1 and e["n"] == 8
    acc = effects[("self-extend", "passkey", 1024)]
    assert acc["kind"] == "difference" and acc["significant"] and acc["ci95"][0] > 0 and acc["n"] == 20
    html = (directory / "report" / "index.html").read_text()
    assert 'id="control"' in html and "Effect relative to the control base-ft" in html
    assert 'class="num sig"' in html


def test_ranking_marks_ties_and_tables_bold_only_outside_the_noise(quick):
    directory, _, _, summary = quick
    rows = summary["ranking"]["rows"]
    ranks = [r["rank"] for r in rows if r["rank"] is not None]
    assert ranks == sorted(ranks) and ranks[0] == 1
    # the variants that did not recover their in-window retrieval come last, unranked (ropekit.study.convergence)
    unranked = [r["method"] for r in rows if r["rank"] is None]
    assert unranked == ["longlora", "landmark-ft"] and [r["method"] for r in rows[-2:]] == unranked
    assert any(r["tied"] for r in rows)  # several methods solve no prompt beyond the window: tied
    zero = [r for r in rows if r["primary"] == 0.0]
    assert len({r["rank"] for r in zero if r["ppl"] and abs(r["ppl"] - zero[0]["ppl"]) < 1e-9}) <= 1
    html = (directory / "report" / "index.html").read_text()
    table = html[html.index('<p class="caption">Methods ranked'):]
    table = table[:table.index("</table>")]
    assert re.search(r'<td class="num rank">\d+=</td>', table)


def test_a_method_card_says_an_evaluation_is_not_finished_instead_of_free():
    """A piece still pending (or running, or failed) has no seconds: its cost read "0s", as if it had run for free."""
    infos = {"yarn": findings.VariantInfo("yarn", "yarn", {"factor": 4})}
    pieces = [{"id": "eval:ppl:yarn", "kind": "eval", "method": "yarn", "task": "ppl", "status": "done", "seconds": 75.0},
              {"id": "eval:passkey:yarn", "kind": "eval", "method": "yarn", "task": "passkey", "status": "pending",
               "seconds": None},
              {"id": "eval:ruler:yarn", "kind": "eval", "method": "yarn", "task": "ruler", "status": "running",
               "seconds": None}]
    (card,) = findings.method_cards(infos, pieces, [])
    cost = dict(card["cost"])
    assert "not finished" not in cost["eval ppl"] and cost["eval ppl"] != "0s"
    assert cost["eval passkey"] == "not finished" and cost["eval ruler"] == "not finished"


def test_a_one_family_study_keeps_its_figure_titles_inside_the_figure(tmp_path):
    """One method family draws one narrow panel under a title written for several: the title is wrapped, so no
    text leaves the figure (the title was cut off on both sides)."""
    spec = [ss.variant("base", None, "base", ppl=(0, 0.02, 0.15, 0.6), acc=(0.9, 0, 0, 0)),
            ss.variant("yarn", "yarn", ppl=(0, -0.01, 0.02, 0.05), acc=(0.85, 0.6, 0.2, 0), params={"factor": 4})]
    ss.build(tmp_path, spec, name="mini", tasks=("passkey",))
    paths = write_report(tmp_path)
    assert paths["figures"] and paths["figure_overlaps"] == {}


def test_method_cards_hold_recipe_and_costs(quick):
    _, _, _, summary = quick
    cards = {c["label"]: c for c in summary["method_cards"]}
    assert cards["longrope-search"]["search_seconds"] == pytest.approx(95.0) and cards["longrope-search"]["kind"] == "searched"
    pose = dict(cards["pose-yarn"]["recipe"])
    assert pose["sequence length"] == "256" and "target_length 1024" in pose["PoSE"] and pose["steps"] == "40"
    assert cards["yarn-ft"]["train_seconds"] > 0 and cards["yarn-ft"]["seeds"] == [0, 1]
    assert cards["base"]["kind"] == "base" and cards["base-ft"]["kind"].startswith("control")
    assert set(cards["ntk"]["eval_seconds"]) == {"ppl", "passkey"}


def test_figures_are_2x_and_free_of_overlapping_text(quick):
    directory, _, paths, _ = quick
    assert paths["figure_overlaps"] == {}  # no two texts of any figure overlap, none is cut off
    names = {Path(p).name for p in paths["figures"]}
    assert {"ppl_vs_length.png", "ppl_ratio_vs_length.png", "nll_by_position.png", "passkey_vs_length.png",
            "passkey_heatmaps.png", "ppl_vs_accuracy.png", "train_loss.png"} <= names
    html = (directory / "report" / "index.html").read_text()
    sizes = re.findall(r'<img src="data:image/png;base64,[^"]+" alt="[^"]*" width="(\d+)" height="(\d+)">', html)
    assert len(sizes) == len(paths["figures"])
    for p, (w, h) in zip(paths["figures"], sizes):
        pw, ph = png_size(Path(p).read_bytes())
        assert (pw, ph) == pytest.approx((2 * int(w), 2 * int(h)), abs=1), p  # 200 dpi shown at 100 CSS px per inch


def test_line_styles_tell_frozen_from_fine_tuned(tmp_path):
    infos = {"base": findings.VariantInfo("base", None, kind="base"),
             "base-ft": findings.VariantInfo("base-ft", None, kind="control"),
             "yarn": findings.VariantInfo("yarn", "yarn"),
             "yarn-ft": findings.VariantInfo("yarn-ft", "yarn", kind="fine-tuned"),
             "pose-yarn": findings.VariantInfo("pose-yarn", "yarn", kind="fine-tuned", pose=True),
             "ntk": findings.VariantInfo("ntk", "ntk")}
    figs = _Figures(tmp_path, list(infos), 256, 1024, infos)
    assert figs.style("yarn")["linestyle"] == "-" and figs.style("ntk")["linestyle"] == "-"
    assert figs.style("yarn-ft")["linestyle"] != "-" and figs.style("pose-yarn")["linestyle"] not in ("-", figs.style("yarn-ft")["linestyle"])
    assert figs.style("base")["linestyle"] == "-" and figs.style("base-ft")["linestyle"] != "-"
    # one panel per family, the references in none of them; colours distinct within a panel
    panels = dict(figs.families(list(infos)))
    assert panels == {"NTK & base frequency": ["ntk"], "YaRN & LongRoPE": ["yarn", "yarn-ft", "pose-yarn"]}
    assert len({figs.color(m) for m in panels["YaRN & LongRoPE"]}) == 3


FAILING = [
    ss.variant("base", None, "base", ppl=(0, -0.05, -0.10, -0.15), acc=(0.9, 0.85, 0.8, 0.8)),
    ss.variant("ntk", "ntk", ppl=(0, -0.05, -0.10, -0.15), acc=(0.9, 0.5, 0.3, 0.1), params={"factor": 4}),
    ss.variant("ntk-ft", "ntk", "ft", ppl=(0, 0.1, 0.2, 0.3), acc=(0.9, 0.5, 0.3, 0.1), params={"factor": 4}),
    ss.variant("yarn-ft", "yarn", "ft", ppl=(0, 0.1, 0.2, 0.3), acc=(0.9, 0.5, 0.3, 0.1), params={"factor": 4}),
    ss.variant("pose-yarn", "yarn", "pose", ppl=(0, 0.3, 0.5, 0.6), acc=(0.9, 0.5, 0.3, 0.1), params={"factor": 4}),
]


def test_claims_that_do_not_hold(tmp_path):
    ss.build(tmp_path, FAILING, tasks=("ppl", "passkey"))
    summary = json.loads(Path(write_report(tmp_path)["json"]).read_text())
    got = verdicts(summary)
    assert {k: got[k] for k in "abcdf"} == {k: FAILS for k in "abcdf"}
    assert summary["control"] is None and "Effect relative to the control" not in Path(tmp_path / "report" / "index.html").read_text()


def test_claims_not_measured(tmp_path):
    spec = [ss.variant("base", None, "base", ppl=(0, 0.1, 0.2, 0.3)), ss.variant("yarn", "yarn", ppl=(0, 0, 0, 0))]
    ss.build(tmp_path, spec, tasks=("ppl",))
    summary = json.loads(Path(write_report(tmp_path)["json"]).read_text())
    got = verdicts(summary)
    assert got["a"] == HOLDS and {k: got[k] for k in "bcdef"} == {k: ABSENT for k in "bcdef"}
    assert all(c["evidence"] for c in summary["findings"]["claims"])


def test_retrieval_and_correlation_claims_cover_every_downstream_task(tmp_path):
    """With RULER beside passkey, claim (c) judges each retrieval task on its own and (e) pools τ over both."""
    ss.build(tmp_path / "both", ss.QUICK, tasks=("ppl", "passkey", "ruler"))
    summary = json.loads(Path(write_report(tmp_path / "both")["json"]).read_text())
    claims = {c["id"]: c for c in summary["findings"]["claims"]}
    assert claims["c"]["verdict"] == HOLDS and "(passkey retrieval and RULER)" in claims["c"]["claim"]
    for name in ("Passkey retrieval", "RULER"):
        assert any(e.startswith(f"{name}: base, mean over 512, 1k, 2k") for e in claims["c"]["evidence"]), name
        assert any(e.startswith(f"{name}, significantly above the base model") for e in claims["c"]["evidence"]), name
    # (d) and (f) add the primary retrieval task's difference beyond the window: passkey's, not the last task's
    assert all("; passkey retrieval beyond the window" in e for e in claims["d"]["evidence"] + claims["f"]["evidence"])
    pooled = [k for k in summary["kendall"] if k["task"] == "pooled" and k["mode"] == "target"]
    assert len(pooled) == 1 and pooled[0]["tasks"] == ["passkey", "ruler"] and pooled[0]["ci95"] is not None
    assert any(e.startswith("pooled over passkey, ruler") for e in claims["e"]["evidence"])

    # a base model that still finds RULER's needles beyond its window fails (c), whatever passkey shows
    spec = [dict(v, ruler_acc=[0.9, 0.8, 0.8, 0.7]) if v["label"] == "base" else v for v in ss.QUICK]
    ss.build(tmp_path / "ruler", spec, tasks=("ppl", "passkey", "ruler"))
    summary = json.loads(Path(write_report(tmp_path / "ruler")["json"]).read_text())
    assert verdicts(summary)["c"] == FAILS


def test_length_claims_compare_identical_targets_when_the_study_scored_them(tmp_path):
    """(a) and (b) compare lengths: with a same-targets perplexity entry beside ``ppl`` they judge on it, so a
    fine-tuned method whose first-L-token perplexity looks flat but whose identical targets get worse fails (b)."""
    spec = [dict(v, same=[0, 0.05, 0.3, 0.5]) if v["label"] == "ntk-ft" else v for v in ss.QUICK]
    ss.build(tmp_path / "first-l", spec, tasks=("ppl", "passkey"))
    ss.build(tmp_path / "same", spec, tasks=("ppl", "ppl-same-targets", "passkey"))
    first_l = json.loads(Path(write_report(tmp_path / "first-l")["json"]).read_text())
    same = json.loads(Path(write_report(tmp_path / "same")["json"]).read_text())
    assert verdicts(first_l)["b"] == HOLDS and verdicts(same)["b"] == FAILS
    (b,) = [c for c in same["findings"]["claims"] if c["id"] == "b"]
    assert "(ppl-same-targets)" in b["rule"]
    (ntk,) = [e for e in b["evidence"] if e.startswith("ntk-ft:")]
    assert ntk.endswith(f"→ {FAILS}") and "ratio 1.3" in ntk  # exp(0.3) = 1.350 on the shared targets
    assert verdicts(same)["a"] == HOLDS


# ---- parts a claim names but the study did not measure; the headline's "ahead of every other" ---------------------
def _ppl(method, length, nll, doc):
    return {"task": "ppl", "method": method, "params": {}, "length": length, "doc": doc, "nll_sum": nll * 10,
            "tokens_scored": 10, "corpus": "c", "score_mode": "same_targets", "stride": 32, "weighting": "token",
            "add_bos": False}


def _judge(records, infos, item, window, target, claims=None):
    from ropekit.study import stats

    item = {"id": "x", "claim": "claim about {tasks}", "source": "test", **item}
    (out,) = findings.evaluate_claims(stats.Analysis(records).table, infos, window, target, [],
                                      {"items": [item], **(claims or {})})
    return out


def test_a_length_ratio_claim_never_holds_on_part_of_the_variants_it_names():
    """yarn-ft's ratio 512/128 is exp(0.02) = 1.020 on every document, under 1.10: that part holds. ntk-ft, also in
    the family, was not scored at 512: its part is not measured, so the claim ("every variant must hold") is
    inconclusive, not "holds"."""
    recs = [_ppl("yarn-ft", L, 3 + 0.3 * (d % 3) + (0.02 if L == 512 else 0), d) for d in range(8) for L in (128, 512)]
    recs += [_ppl("ntk-ft", 128, 3 + 0.3 * (d % 3), d) for d in range(8)]
    infos = {m: findings.VariantInfo(m, m.split("-")[0], kind="fine-tuned") for m in ("yarn-ft", "ntk-ft")}
    claims = {"families": {"fam": ["yarn-ft", "ntk-ft"]}}
    out = _judge(recs, infos, {"compare": "length_ratio", "variants": "fam", "to": "target", "at_most": 1.10}, 128, 512, claims)
    assert out["verdict"] == INCONCLUSIVE
    (yarn,) = [e for e in out["evidence"] if e.startswith("yarn-ft:")]
    assert "ratio 1.020" in yarn and yarn.endswith(f"→ {HOLDS}")
    assert any(e.startswith("ntk-ft: not measured at 512") and e.endswith(ABSENT) for e in out["evidence"])
    # "to: beyond" alike: ntk-ft lacks the longest length, the one the ratio is judged at
    recs2 = recs + [_ppl("ntk-ft", 256, 3 + 0.3 * (d % 3), d) for d in range(8)]
    recs2 += [_ppl("yarn-ft", 256, 3 + 0.3 * (d % 3) + 0.01, d) for d in range(8)]
    out = _judge(recs2, infos, {"compare": "length_ratio", "variants": "fam", "to": "beyond", "at_most": 1.5}, 128, 512, claims)
    assert out["verdict"] == INCONCLUSIVE
    assert any(e.startswith("ntk-ft: not measured at 512") for e in out["evidence"])
    # and a family of which no variant was measured at the window is not measured at all
    out = _judge([r for r in recs if r["length"] == 512], infos,
                 {"compare": "length_ratio", "variants": "fam", "to": "target", "at_most": 1.10}, 128, 512, claims)
    assert out["verdict"] == ABSENT


def test_a_beyond_window_ratio_under_a_bound_states_the_rule_it_applies():
    """``to: beyond`` with ``at_most``: the verdict holds when the interval's upper end is at most the bound (here the
    ratio is exp(0.05) = 1.051 on every document, far under 1.50); the rule said "lies above 1.50", the opposite, and
    read "of per variant"."""
    recs = [_ppl("yarn", L, 3 + 0.3 * (d % 3) + (0.05 if L == 256 else 0), d) for d in range(8) for L in (128, 256)]
    infos = {"yarn": findings.VariantInfo("yarn", "yarn")}
    out = _judge(recs, infos, {"compare": "length_ratio", "variants": ["yarn"], "to": "beyond", "at_most": 1.5}, 128, 256)
    assert out["verdict"] == HOLDS
    assert "upper end is ≤ 1.50" in out["rule"] and "lower end is > 1.50" in out["rule"]
    assert "lies above 1.50" not in out["rule"] and "of per variant" not in out["rule"]
    assert out["rule"].startswith("ratio ppl(L)/ppl(window) of each variant at the longest length")


def test_a_retrieval_claim_naming_a_task_the_base_model_lacks_is_not_held():
    """The base model was not scored on RULER at 512 (a piece failed): passkey alone meets the rule (0 of 40 found,
    every passkey found by yarn), but the claim names RULER too, so it is inconclusive, and the evidence says why."""
    recs = []
    for m, s in (("base", 0.0), ("yarn", 1.0)):
        for L in (128, 256, 512):
            recs += [{"task": "passkey", "method": m, "params": {}, "length": L, "depth": 0.5, "trial": t, "score": s}
                     for t in range(20)]
            if not (m == "base" and L == 512):
                recs += [{"task": "ruler", "method": m, "params": {}, "length": L, "subtask": "niah_single_1", "sample": t,
                          "score": 1.0 if m == "yarn" else float(t < 14)} for t in range(20)]
    infos = {"base": findings.VariantInfo("base", None, kind="base"), "yarn": findings.VariantInfo("yarn", "yarn")}
    item = {"compare": "retrieval_beyond_window", "tasks": ["passkey", "ruler"], "near_zero": 0.1, "beaten": True}
    out = _judge(recs, infos, item, 128, 512)
    assert out["claim"] == "claim about passkey retrieval and RULER"
    assert out["verdict"] == INCONCLUSIVE
    assert any(e.startswith("RULER: base not measured at 512") and e.endswith(ABSENT) for e in out["evidence"])
    # passkey alone: the claim names passkey alone, and holds
    out = _judge(recs, infos, dict(item, tasks=["passkey"]), 128, 512)
    assert out["verdict"] == HOLDS and out["claim"] == "claim about passkey retrieval"


def _headline_of(records, window=64, target=128):
    from ropekit.study import stats

    table = stats.Analysis(records).table
    ranking = stats.rank_methods(table, window=window, target_length=target)
    return ranking, findings.headline(table, ranking, [], window, target)


def _prompts(method, scores, length=128):
    return [{"task": "passkey", "method": method, "params": {}, "length": length, "depth": 0.5, "trial": t,
             "score": float(s)} for t, s in enumerate(scores)]


def test_the_headline_says_significantly_ahead_only_when_each_pairwise_difference_is():
    """A and B find every passkey (10 of 10 each: the difference 0, Newcombe's interval around it); B's perplexity is
    0.2 nats higher on every document, so B ranks 2 — on perplexity. The headline is about passkey, where A is not
    ahead of B: it names B as tied, not "significantly ahead of every other method"."""
    recs = _prompts("A", [1] * 10) + _prompts("B", [1] * 10)
    recs += [_ppl(m, 128, 3 + 0.3 * (d % 3) + (0.2 if m == "B" else 0), d) for d in range(8) for m in ("A", "B")]
    ranking, text = _headline_of(recs)
    assert [(r["method"], r["rank"]) for r in ranking["rows"]] == [("A", 1), ("B", 2)]
    assert "A with 100 %" in text and "statistically tied with B" in text and "significantly ahead" not in text
    # rank 1 by ranking, but B is beaten only by C (see test_stats' non-transitive ranking): A is tied with C and B
    acc = {"A": [0] * 7 + [1] * 12 + [0], "B": [1] * 7 + [0] * 13, "C": [1] * 11 + [0] * 9}
    recs = [r for m, s in acc.items() for r in _prompts(m, s)]
    recs += [_ppl(m, 128, 3 + 0.3 * (d % 3) + (0.2 if m == "C" else 0), d) for d in range(8) for m in acc]
    ranking, text = _headline_of(recs)
    assert [(r["method"], r["rank"]) for r in ranking["rows"]] == [("A", 1), ("C", 2), ("B", 2)]
    assert "A with 60 %" in text and "statistically tied with C and B" in text and "significantly ahead" not in text
    # 20 of 20 against 0 of 20: Newcombe's lower bound 1 − √2·z²/(20 + z²) = 0.772 > 0, ahead of it, one by one
    recs = _prompts("A", [1] * 20) + _prompts("B", [0] * 20)
    ranking, text = _headline_of(recs)
    assert "A with 100 %" in text and "significantly ahead of every other method" in text and "tied" not in text


def test_a_method_first_by_perplexity_is_not_called_best_at_retrieval():
    """B finds 19 of 20 passkeys, A 20 of 20 (not a significant difference); B's perplexity is 0.3 nats lower on every
    document, so B ranks first — on perplexity. The headline said "Best passkey retrieval …: B with 95 %" with A at
    100 %; it says B ranks first on passkey, then perplexity."""
    recs = _prompts("A", [1] * 20) + _prompts("B", [1] * 19 + [0])
    recs += [_ppl(m, 128, 3 + 0.3 * (d % 3) + (0.3 if m == "A" else 0), d) for d in range(8) for m in ("A", "B")]
    ranking, text = _headline_of(recs)
    assert [(r["method"], r["rank"]) for r in ranking["rows"]] == [("B", 1), ("A", 2)]
    assert "Ranked first on passkey retrieval beyond the window (128), then perplexity: B with 95 %" in text
    assert "Best passkey" not in text


def test_a_bound_is_not_decided_on_fewer_shared_samples_than_significance_needs():
    """"Significant" needs 5 shared samples; ``within`` and ``at_most`` decided on any interval (n = 2 held a ±10 %
    band). Below 5 they are inconclusive, at 5 and above judged on the interval as before."""
    from ropekit.study import stats

    inside = {"ci95": [0.95, 1.05], "direction": 0, "significant": False}
    outside = {"ci95": [1.3, 1.5], "direction": 1, "significant": True}
    for n in range(2, stats.MIN_PAIRED):
        assert findings._decide({**inside, "n": n}, within=0.1) == findings.INCONCLUSIVE
        assert findings._decide({**outside, "n": n}, at_most=1.2) == findings.INCONCLUSIVE
    assert findings._decide({**inside, "n": stats.MIN_PAIRED}, within=0.1) == findings.HOLDS
    assert findings._decide({**outside, "n": stats.MIN_PAIRED}, at_most=1.2) == findings.FAILS


def test_a_claim_whose_variant_is_held_back_names_it_as_the_reason():
    """smollm2's claim (d) pairs pose-yarn with yarn-ft-16k, whose convergence check waits: the claim is "not measured"
    and its evidence said "the study has no variants or lengths this claim needs" though both have complete
    perplexity cells; it names the held-back variant and why."""
    from ropekit.study import stats

    recs = [_ppl(m, 512, 3 + 0.3 * (d % 3), d) for d in range(8) for m in ("pose-yarn", "yarn-ft-16k")]
    infos = {"pose-yarn": findings.VariantInfo("pose-yarn", "yarn", kind="fine-tuned")}  # yarn-ft-16k held back
    item = {"id": "d", "claim": "close to full-length", "source": "test", "compare": "pair_ratio",
            "pairs": [["pose-yarn", "yarn-ft-16k"]], "within": 0.1}
    judged = stats.Analysis([r for r in recs if r["method"] == "pose-yarn"]).table
    (out,) = findings.evaluate_claims(judged, infos, 128, 512, [], {"items": [item]},
                                      held={"yarn-ft-16k": "its in-window convergence check waits for unfinished pieces"})
    assert out["verdict"] == ABSENT
    assert out["evidence"] == ["yarn-ft-16k is kept out of the claims: its in-window convergence check waits for "
                               "unfinished pieces"]
    (out,) = findings.evaluate_claims(judged, infos, 128, 512, [], {"items": [item]})
    assert out["evidence"] == ["the study has no variants or lengths this claim needs"]
