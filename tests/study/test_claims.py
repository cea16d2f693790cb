"""Claims are data: each preset declares its claims (what is compared, the rule, the bound, the control, the
families) in its YAML, the study config schema validates them, and one engine judges them — with nothing read
from a variant's label."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synthetic_study as ss

from ropekit.study import report_findings as findings
from ropekit.study.config import load_study_config, parse_claims, parse_study, preset_claims, preset_names
from ropekit.study.report import write_report
from ropekit.study.runner import initialize
from ropekit.study.store import StudyStore

HOLDS, FAILS, INCONCLUSIVE, ABSENT = findings.HOLDS, findings.FAILS, findings.INCONCLUSIVE, findings.ABSENT


def _report(directory: Path) -> dict:
    return json.loads(Path(write_report(directory)["json"]).read_text())


def _verdicts(summary) -> dict[str, str]:
    return {c["id"]: c["verdict"] for c in summary["findings"]["claims"]}


def _declare(directory: Path, claims: dict) -> None:
    """Record ``claims`` in a built study's manifest, as ``ropekit study`` does for a config's ``claims:``."""
    with StudyStore(directory / "study.sqlite", create=False) as st:
        st.set_manifest(claims=parse_claims(claims))


def test_presets_declare_their_claims_and_quick_and_standard_share_a_to_f():
    quick, standard, smollm2 = (preset_claims(name) for name in ("quick", "standard", "smollm2"))
    assert [c["id"] for c in quick["items"]] == list("abcdef") and quick == standard
    assert quick["control"] == "base-ft" and quick["base"] == "base"
    assert {c["compare"] for c in quick["items"]} == {"length_ratio", "retrieval_beyond_window", "pair_ratio", "correlation"}
    assert smollm2["control"] == "base-ft" and [c["compare"] for c in smollm2["items"]] == [
        "retrieval_beyond_window", "pair_difference", "length_ratio", "pair_ratio"]
    labels = {v.label for v in load_study_config(preset="smollm2").variants}
    named = {x for item in smollm2["items"] for pair in item.get("pairs", []) for x in pair} | set(
        smollm2["items"][2]["variants"]) | {smollm2["base"], smollm2["control"]}
    assert named - {"control"} <= labels  # the claims name the preset's own variants
    for name in preset_names():  # every preset still parses, its claims included
        load_study_config(preset=name)


def test_claims_are_not_the_study_s_identity_and_are_recorded_beside_it(tmp_path):
    config = load_study_config(preset="quick")
    assert "claims" not in config.as_dict()
    with initialize(tmp_path, config):
        pass
    revised = copy.deepcopy(config)
    revised.claims = {**config.claims, "items": config.claims["items"][:2]}
    with initialize(tmp_path, revised) as store:  # a revised judgement resumes the same study
        assert [c["id"] for c in store.get_manifest("claims")["items"]] == ["a", "b"]
        assert "claims" not in store.get_manifest("config")


@pytest.mark.parametrize(("item", "message"), [
    ({"compare": "length_ratio", "variants": "base", "expect": "above"}, r"items\[0\]\.to is missing for compare: length_ratio"),
    ({"compare": "pair_ratio", "pairs": [["a", "b"]], "expect": "below", "at_most": 1.1},
     r"items\[0\]\.at_most is not a key of compare: pair_ratio"),
    ({"compare": "pair_ratio", "pairs": [["a", "b"]]}, r"items\[0\]\.expect needs exactly one rule"),
    ({"compare": "pair_ratio", "pairs": [["a", "b", "c"]], "expect": "below"}, r"items\[0\]\.pairs"),
    ({"compare": "guess", "expect": "below"}, r"items\[0\]\.compare"),
    ({"compare": "correlation", "expect": "sideways"}, r"items\[0\]\.expect"),
])
def test_a_malformed_claim_is_one_line_naming_its_key(item, message):
    raw = {"name": "s", "model": "tiny", "target_length": 512, "variants": ["base"], "evals": {"ppl": {"lengths": [256]}},
           "claims": {"items": [{"id": "x", "claim": "c", "source": "s", **item}]}}
    with pytest.raises(Exception, match=message) as err:
        parse_study(raw)
    assert "\n" not in str(err.value)


def test_claim_ids_are_unique():
    with pytest.raises(Exception, match="use the id 'a' twice"):
        parse_claims({"items": [{"id": "a", "claim": "c", "source": "s", "compare": "correlation", "expect": "below"}] * 2})


#: QUICK relabelled: no label says what a variant is ("-ft", "pose-" and "base-ft" are gone).
RENAMED = {"base": "as-shipped", "base-ft": "trained-plain", "ntk-ft": "ntk-tuned", "yarn-ft": "yarn-tuned",
           "ntk-by-parts-ft": "parts-tuned", "abf-ft": "abf-tuned", "entropy-abf-ft": "eabf-tuned",
           "harpe-ft": "harpe-tuned", "pi-ft": "pi-tuned", "pose-pi": "pi-skip", "pose-yarn": "yarn-skip"}


def _renamed_claims() -> dict:
    """The quick claims naming the renamed variants (roles such as ``variants: base`` stay roles)."""
    claims = preset_claims("quick")
    rename = lambda label: RENAMED.get(label, label)  # noqa: E731
    claims["base"], claims["control"] = rename(claims["base"]), rename(claims["control"])
    claims["families"] = {name: [rename(m) for m in members] for name, members in claims["families"].items()}
    for item in claims["items"]:
        if "pairs" in item:
            item["pairs"] = [[rename(a), rename(b)] for a, b in item["pairs"]]
    return claims


def test_the_engine_reads_roles_and_families_from_the_claims_not_from_labels(tmp_path):
    """The same study under other labels, with claims naming them, gets the same verdicts and evidence (renamed):
    the control, the base model, the NTK/YaRN family and the pairs come from the claims block alone."""
    ss.build(tmp_path / "plain", ss.QUICK)
    spec = [dict(v, label=RENAMED.get(v["label"], v["label"])) for v in ss.QUICK]
    ss.build(tmp_path / "renamed", spec)
    _declare(tmp_path / "renamed", _renamed_claims())
    plain, renamed = _report(tmp_path / "plain"), _report(tmp_path / "renamed")
    assert _verdicts(renamed) == _verdicts(plain) and set(_verdicts(plain).values()) <= {HOLDS, INCONCLUSIVE}
    assert renamed["control"]["label"] == "trained-plain"
    text = json.dumps(renamed["findings"]["claims"], ensure_ascii=False)
    for old, new in sorted(RENAMED.items(), key=lambda kv: -len(kv[1])):  # longest first: abf-tuned is in eabf-tuned
        text = text.replace(new, old)
    assert json.loads(text) == plain["findings"]["claims"]

    # without the claims that name them, the renamed variants are not the family, pairs or control of the quick claims
    ss.build(tmp_path / "undeclared", spec)
    undeclared = _report(tmp_path / "undeclared")
    assert {k: _verdicts(undeclared)[k] for k in "bdf"} == {k: ABSENT for k in "bdf"}
    assert undeclared["control"]["label"] == "trained-plain"  # still the plain model fine-tuned: by what it is


SMALL = [
    ss.variant("base", None, "base", ppl=(0, 0.3, 0.6, 0.9), acc=(0.9, 0, 0, 0)),
    ss.variant("base-ft", None, "control", ppl=(0, 0.2, 0.4, 0.6), acc=(0.9, 0.05, 0, 0)),
    ss.variant("yarn", "yarn", ppl=(0, 0.05, 0.1, 0.3), acc=(0.9, 0.5, 0.4, 0.1), params={"factor": 4}),
    ss.variant("pose-yarn", "yarn", "pose", ppl=(0, 0.02, 0.05, 0.2), acc=(0.9, 0.9, 0.85, 0.3), params={"factor": 4}),
    ss.variant("yarn-ft-16k", "yarn", "ft", ppl=(0, 0.02, 0.04, 0.2), acc=(0.9, 0.9, 0.8, 0.3), params={"factor": 4}),
]


def test_the_smollm2_claims_judge_a_study_shaped_like_it(tmp_path):
    """pair_difference, a one-variant length_ratio with a bound other than the null and a pair_ratio on the
    same-targets entry: all hold on a study where PoSE-YaRN retrieves at 1k (85 % against 40 % and 0 %), its
    perplexity ratio to the window is exp(0.05) = 1.05 and to full-length fine-tuning exp(0.01); (b), (c) and (d)
    fail when it retrieves nothing there and its perplexity at 1k is exp(0.4) = 1.49 times the window's."""
    tasks = ("ppl", "ppl-same-targets", "passkey")
    ss.build(tmp_path / "good", SMALL, trials=8, tasks=tasks)
    _declare(tmp_path / "good", preset_claims("smollm2"))
    good = _report(tmp_path / "good")
    assert _verdicts(good) == {"a": HOLDS, "b": HOLDS, "c": HOLDS, "d": HOLDS}
    claims = {c["id"]: c for c in good["findings"]["claims"]}
    assert claims["a"]["claim"] == "The base model finds almost no passkey beyond its pretrained window (passkey retrieval)."
    assert [e.split(":")[0] for e in claims["b"]["evidence"]] == ["pose-yarn vs yarn at 1k", "pose-yarn vs base-ft at 1k"]
    assert "upper end is ≤ 1.20" in claims["c"]["rule"] and claims["c"]["evidence"][0].startswith("pose-yarn: ")
    assert "(ppl-same-targets)" in claims["c"]["rule"] and "(ppl-same-targets)" in claims["d"]["rule"]
    assert claims["d"]["evidence"][0].startswith("pose-yarn vs yarn-ft-16k at 1k")

    worse = [dict(v, ppl=(0, 0.1, 0.4, 0.5), same=(0, 0.1, 0.4, 0.5), acc=(0.9, 0.1, 0.0, 0)) if v["label"] == "pose-yarn" else v
             for v in SMALL]
    ss.build(tmp_path / "bad", worse, trials=8, tasks=tasks)
    _declare(tmp_path / "bad", preset_claims("smollm2"))
    assert _verdicts(_report(tmp_path / "bad")) == {"a": HOLDS, "b": FAILS, "c": FAILS, "d": FAILS}


def test_a_study_without_recorded_claims_is_judged_by_the_quick_claims(tmp_path):
    ss.build(tmp_path, SMALL[:3], tasks=("ppl",))
    with StudyStore(tmp_path / "study.sqlite", create=False) as st:
        assert findings.study_claims(st.get_manifest()) == preset_claims("quick")
