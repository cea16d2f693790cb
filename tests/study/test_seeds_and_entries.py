"""Study configs with several training seeds, the plain-RoPE control and two entries of one task."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from test_runner import SMALL

from ropekit.errors import RopekitError
from ropekit.study.config import parse_study
from ropekit.study.pieces import plan
from ropekit.study.runner import run_study
from ropekit.study.store import open_study


def _seeded(**extra):
    raw = copy.deepcopy(SMALL)
    raw["variants"] = [{"label": "base"}, {"label": "base-ft", "finetune": True},
                       {"label": "pi-ft", "method": "pi", "params": {"factor": 4}, "finetune": True}]
    raw["evals"] = {"ppl": {"lengths": [64, 128], "samples": 2, "score_mode": "truncate"},
                    "ppl-same": {"task": "ppl", "lengths": [64, 128], "samples": 2, "score_mode": "same_targets"}}
    raw["recipe"]["train"]["max_steps"] = 2
    raw.update(extra)
    return raw


def test_every_seed_trains_and_evaluates_the_fine_tuned_variants_once_and_frozen_ones_once():
    config = parse_study(_seeded(seeds=[0, 1]))
    ids = [p.id for p in plan(config)]
    assert ids == ["eval:ppl:base", "eval:ppl-same:base",
                   "train:base-ft@seed0", "eval:ppl:base-ft@seed0", "eval:ppl-same:base-ft@seed0",
                   "train:base-ft@seed1", "eval:ppl:base-ft@seed1", "eval:ppl-same:base-ft@seed1",
                   "train:pi-ft@seed0", "eval:ppl:pi-ft@seed0", "eval:ppl-same:pi-ft@seed0",
                   "train:pi-ft@seed1", "eval:ppl:pi-ft@seed1", "eval:ppl-same:pi-ft@seed1"]
    by_id = {p.id: p for p in plan(config)}
    assert by_id["eval:ppl:pi-ft@seed1"].needs == ("train:pi-ft@seed1",)
    assert by_id["eval:ppl:pi-ft@seed1"].label == "pi-ft"
    assert config.as_dict()["seeds"] == [0, 1]
    # one seed keeps the ids (and the recorded configuration) of a study without `seeds`
    single = parse_study(_seeded(seeds=[0]))
    assert [p.id for p in plan(single)][:3] == ["eval:ppl:base", "eval:ppl-same:base", "train:base-ft"]
    assert "seeds" not in parse_study(_seeded()).as_dict()


@pytest.mark.parametrize("change, words", [
    ({"seeds": []}, "seeds is empty"),
    ({"seeds": [0, 0]}, "repeat a seed"),
    ({"seeds": [-1]}, "seeds[0]"),
    ({"evals": {"ppl-x": {"task": "pplx", "lengths": [64]}}}, "evals.ppl-x.task is not an evaluation task"),
    ({"evals": {"ppl-x": {"task": "ppl", "lengths": [64], "depths": [0.5]}}}, "ppl-x.depths"),
    # a LongBench cell is a mean over datasets: named in the config, from one suite (LongBench-E's are LongBench's)
    ({"evals": {"lb": {"task": "longbench", "lengths": [64]}}}, "evals.lb.tasks is missing"),
    ({"evals": {"lb": {"task": "longbench", "lengths": [64], "tasks": ["trec", "trec_e"]}}},
     "evals.lb.tasks mixes LongBench and LongBench-E"),
    # what the study sets for every training, in a variant's finetune: as in the recipe (it was dropped silently)
    ({"variants": [{"label": "x", "method": "pi", "params": {"factor": 2}, "finetune": {"model": {"name": "tiny"}}}]},
     "variants[0].finetune.model.name is set by the study itself"),
    ({"variants": [{"label": "x", "method": "pi", "params": {"factor": 2}, "finetune": {"output": {"dir": "/tmp/y"}}}]},
     "variants[0].finetune.output.dir is set by the study itself"),
    ({"variants": [{"label": "x", "method": "pi", "params": {"factor": 2}, "finetune": {"output": {"log_every": 7}}}]},
     "output.log_every is set by the study itself"),
    # a bad override names its variant
    ({"variants": [{"label": "x", "method": "pi", "params": {"factor": 2}, "finetune": {"train": {"max_steps": -3}}}]},
     "variant 'x': train.max_steps"),
    # the built-in base model's window is known before anything runs
    ({"model": "builtin-base", "target_length": 200}, "target_length 200 is not beyond the window 256"),
])
def test_bad_seeds_and_entries_are_one_line(change, words):
    with pytest.raises(RopekitError) as err:
        parse_study(_seeded(**change))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_longbench_cell_of_one_suite_is_accepted():
    for datasets in (["trec", "hotpotqa"], ["trec_e"]):
        config = parse_study(_seeded(evals={"lb": {"task": "longbench", "lengths": [64], "tasks": datasets}}))
        assert config.as_dict()["evals"]["lb"]["tasks"] == datasets


def test_a_seeded_study_with_a_control_and_two_perplexity_protocols(tmp_path):
    config = parse_study(_seeded(seeds=[0, 1]))
    summary = run_study(config, tmp_path, progress=False)
    assert not summary.get("failed"), summary
    store = open_study(tmp_path)
    pieces = {p["id"]: p for p in store.pieces()}
    assert all(p["status"] == "done" for p in pieces.values())
    records = store.samples()
    ppl = [r for r in records if r["task"] == "ppl" and r["method"] == "pi-ft"]
    assert sorted({r["seed"] for r in ppl}) == [0, 1]
    assert {r["score_mode"] for r in ppl} == {"truncate"}
    same = [r for r in records if r["task"] == "ppl-same"]
    assert {r["score_mode"] for r in same} == {"same_targets"}
    assert {r["method"] for r in same} == {"base", "base-ft", "pi-ft"}
    assert all("seed" not in r for r in records if r["method"] == "base")
    by_seed = {s: sorted(r["nll_sum"] for r in ppl if r["seed"] == s) for s in (0, 1)}
    assert by_seed[0] != by_seed[1]  # two trainings, two models
    # the control trains without a method: its model carries no ropekit record
    control = [r for r in records if r["method"] == "base-ft"]
    assert control and {r.get("eval_method", r["method"]) for r in control} == {"plain"}
    # identical targets at every length in the same-token protocol
    for method in ("base", "base-ft"):
        rows = [r for r in same if r["method"] == method and r.get("seed") in (None, 0)]
        assert {r["tokens_scored"] for r in rows} and len({(r["doc"], r["tokens_scored"]) for r in rows}) == 2


def test_the_report_keeps_two_perplexity_protocols_apart_and_judges_the_window_on_identical_targets(tmp_path):
    import json
    import math

    from ropekit.study.report import write_report

    raw = _seeded()
    raw["variants"] = [{"label": "base"}, {"label": "pi", "method": "pi", "params": {"factor": 4}}]
    raw["window"] = 64
    raw["target_length"] = 128
    config = parse_study(raw)
    run_study(config, tmp_path, progress=False)
    out = write_report(tmp_path)
    summary = json.loads(Path(out["json"]).read_text())
    rows = [c for c in summary["aggregates"] if c["metric"] == "ppl"]
    by_task = {(r["task"], r["method"], r["length"]): r for r in rows}
    records = open_study(tmp_path).samples()
    for task, mode in (("ppl", "truncate"), ("ppl-same", "same_targets")):
        for length in (64, 128):
            mine = [r for r in records if r["task"] == task and r["method"] == "base" and r["length"] == length]
            assert {r["score_mode"] for r in mine} == {mode}
            # the cell is exp(Σ nll / Σ tokens) over this protocol's documents only
            want = math.exp(sum(r["nll_sum"] for r in mine) / sum(r["tokens_scored"] for r in mine))
            assert by_task[(task, "base", length)]["value"] == pytest.approx(want, rel=1e-9)
    html = Path(out["html"]).read_text()
    assert "Perplexity: ppl-same" in html
    claim = next(c for c in summary["findings"]["claims"] if c["id"] == "a")
    assert "ppl-same" in claim["rule"]


def test_pretrain_asks_for_the_base_model_to_be_rebuilt_without_changing_the_studys_identity(monkeypatch, tmp_path):
    from ropekit.study import pieces

    raw = {**copy.deepcopy(SMALL), "model": "builtin-base", "target_length": 512}
    plain, rebuilt = parse_study(raw), parse_study({**raw, "pretrain": True})
    assert plain.as_dict() == rebuilt.as_dict()  # the same study: where the base model comes from is not its identity
    assert rebuilt.as_dict(placement=True)["pretrain"] is True
    assert parse_study(rebuilt.as_dict(placement=True)).pretrain is True  # what a worker process receives
    asked = []

    def fake_pretrain(seed, **kwargs):
        asked.append(kwargs.get("shipped", True))
        raise RuntimeError("stop here")

    monkeypatch.setattr(pieces, "pretrain_base", fake_pretrain)
    piece = plan(rebuilt)[0]
    assert piece.id == "pretrain:base"
    for config in (plain, rebuilt):
        with pytest.raises(RuntimeError):
            pieces.execute_piece(config, None, piece, tmp_path)
    assert asked == [True, False]  # the shipped model, then a model trained here


def test_a_scale_method_given_no_factor_extends_to_the_studys_target_length_everywhere():
    """Left to each evaluation, YaRN without a factor was sized to that evaluation's longest length (×8 in one
    piece, ×2 in another, under one label); left to training, it was not extended at all (factor 1)."""
    from ropekit.study.config import train_config_for

    config = parse_study(_seeded(variants=[{"label": "yarn", "method": "yarn"},
                                           {"label": "yarn-ft", "method": "yarn", "finetune": True},
                                           {"label": "abf-ft", "method": "abf", "params": {"rope_theta": 5e4},
                                            "finetune": True},
                                           {"label": "pi", "method": "pi", "params": {"factor": 2}},
                                           {"label": "se", "method": "self_extend"},
                                           {"label": "se-g", "method": "self_extend", "params": {"group_size": 4}}]))
    params = {v.label: v.params for v in config.variants}
    assert params["se"] == {"target_length": 256} and params["se-g"] == {"group_size": 4}  # a group size is a size
    assert params["yarn"]["target_length"] == params["yarn-ft"]["target_length"] == config.target_length == 256
    assert "target_length" not in params["abf-ft"] and "target_length" not in params["pi"]  # no scale, or given
    trained = train_config_for(config, config.variant("yarn-ft"), "tiny", "unused")
    assert trained.method.params["target_length"] == 256
