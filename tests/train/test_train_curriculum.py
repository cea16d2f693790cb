"""Curricula: each stage installs its method parameters, sequence length and learning rate; resume across a stage
boundary; removing a method restores the base model exactly."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import ropekit
from ropekit.models.tiny import build_tiny_model
from ropekit.install import rotary_modules
from ropekit.train import train
from ropekit.train.config import MethodConfig
from ropekit.install import uninstall
from ropekit.train.curriculum import install, switch


class Killed(Exception):
    pass


def abf_stages(**extra_b):
    return [
        {"name": "a", "steps": 2, "seq_len": 64, "method": {"params": {"rope_theta": 2e4}}},
        {"name": "b", "steps": 2, "seq_len": 128, "method": {"params": {"rope_theta": 5e4, "factor": 2}}, "lr": 1e-3,
         "micro_batch_size": 1, **extra_b},
    ]


def curriculum(make_config, name, **extra_b):
    return make_config(name, method={"name": "abf", "params": {"rope_theta": 2e4}},
                       train={"warmup_steps": 1}, output={"save_every": 2, "keep_last": None},
                       stages=abf_stages(**extra_b))


def per_stage(text_dataset):
    return lambda stage, tokenizer: text_dataset(stage.seq_len, 16)


def abf_inv_freq(theta: float, dim: int) -> torch.Tensor:
    """ABF (Xiong et al. 2023): θ_i = b'^(−2i/d)."""
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def test_stages_switch_method_length_and_lr(make_config, text_dataset):
    cfg = curriculum(make_config, "abf", reset_optimizer=True)
    seen = {}

    def look(info):
        rotary = rotary_modules(info.model)[0][2]
        p = next(q for q in info.model.parameters() if q.requires_grad)
        seen[info.step] = (info.stage, rotary.inv_freq.double().clone(), int(info.trainer.optimizer.state[p]["step"]))

    train(cfg, dataset=per_stage(text_dataset), callbacks=[look], progress=False)
    dim = 2 * seen[1][1].numel()
    for step, (stage, theta) in {1: ("a", 2e4), 2: ("a", 2e4), 3: ("b", 5e4), 4: ("b", 5e4)}.items():
        assert seen[step][0] == stage
        torch.testing.assert_close(seen[step][1], abf_inv_freq(theta, dim), rtol=1e-6, atol=0)
    # Adam moments were reset at the start of stage b: its first step is the optimizer's step 1 again
    assert [seen[s][2] for s in (1, 2, 3, 4)] == [1, 2, 1, 2]
    rows = [json.loads(x) for x in (cfg.require_output() / "metrics.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in rows] == [128, 128, 128, 128]  # 2 × 64, then 1 × 128
    assert [r["lr"] for r in rows] == [3e-3, 3e-3, 1e-3, 1e-3]  # warm-up of 1 step restarts in each stage
    model = ropekit.load(cfg.require_output() / "final")
    assert ropekit.installed(model)["params"]["rope_theta"] == 5e4


def test_resume_across_a_stage_boundary(make_config, text_dataset):
    full = train(curriculum(make_config, "full"), dataset=per_stage(text_dataset), progress=False)
    cfg = curriculum(make_config, "cut")

    def kill(info):
        if info.step == 3:
            raise Killed

    with pytest.raises(Killed):
        train(cfg, dataset=per_stage(text_dataset), callbacks=[kill], progress=False)
    resumed = train(cfg, dataset=per_stage(text_dataset), resume=True, progress=False)
    assert resumed.resumed_from == 2
    assert [x for _, x in resumed.losses] == pytest.approx([x for _, x in full.losses[2:]], rel=1e-6, abs=1e-7)


def test_resume_at_a_boundary_where_a_length_dependent_method_changes(make_config, text_dataset):
    """Dynamic NTK ×4 on 128-token inputs, then Dynamic NTK ×2 on 64: the uninterrupted run switches in a fresh
    rotary at the boundary, so a run resumed from the checkpoint taken there must not carry the first stage's
    longest input (128) into the second (before: its frequencies stayed grown, losses off by ~4e-7 relative)."""
    stages = [{"name": "a", "steps": 2, "seq_len": 128, "method": {"name": "dynamic_ntk", "params": {"factor": 4}}},
              {"name": "b", "steps": 2, "seq_len": 64, "method": {"name": "dynamic_ntk", "params": {"factor": 2}}}]

    def config(name):
        return make_config(name, method={"name": "dynamic_ntk", "params": {"factor": 4}}, train={"warmup_steps": 1},
                           output={"save_every": 2, "keep_last": None}, stages=copy.deepcopy(stages))

    def frequencies(seen):
        return lambda info: seen.setdefault(info.step, rotary_modules(info.model)[0][2].inv_freq.clone())

    straight, resumed_freqs = {}, {}
    full = train(config("full"), dataset=per_stage(text_dataset), callbacks=[frequencies(straight)], progress=False)

    def kill(info):
        if info.step == 3:
            raise Killed

    with pytest.raises(Killed):
        train(config("cut"), dataset=per_stage(text_dataset), callbacks=[kill], progress=False)
    resumed = train(config("cut"), dataset=per_stage(text_dataset), resume=True, callbacks=[frequencies(resumed_freqs)],
                    progress=False)
    assert resumed.resumed_from == 2
    assert [x for _, x in resumed.losses] == [x for _, x in full.losses[2:]]  # exactly
    for step in (3, 4):
        assert torch.equal(resumed_freqs[step], straight[step])


def test_a_curriculum_stopped_by_max_steps_resumes_to_a_later_stop(make_config, text_dataset):
    """``--max-steps`` stops a curriculum without changing its schedule, so the run can go on later: 2 steps, then
    --resume to 4, equals 4 steps straight (before: refused as "the config differs: stop_at")."""
    full = train(curriculum(make_config, "full"), dataset=per_stage(text_dataset), progress=False)
    first = train(curriculum(make_config, "cut").with_overrides(max_steps=2), dataset=per_stage(text_dataset),
                  progress=False)
    assert first.step == 2
    more = train(curriculum(make_config, "cut").with_overrides(max_steps=4), dataset=per_stage(text_dataset),
                 resume=True, progress=False)
    assert more.resumed_from == 2 and more.step == 4
    assert [x for _, x in first.losses + more.losses] == [x for _, x in full.losses]


@pytest.mark.parametrize("first,second", [
    ({"name": "pi", "params": {"factor": 2}}, {"name": "clex", "params": {"max_factor": 4}}),   # CLEX's ODE appears
    ({"name": "clex", "params": {"max_factor": 4}}, {"name": "clex", "params": {"max_factor": 8}}),  # rebuilt afresh
])
def test_a_stage_that_brings_new_trainable_weights_is_refused(make_config, text_dataset, first, second):
    """The optimizer is built over the first stage's parameters: weights a later stage's method creates would stay at
    their initial values (CLEX's ODE at its zero init) and be exported untrained. Refused in one line before the first
    step (stage a's training would otherwise be lost with the run); a switch between methods without weights (the ABF
    curriculum above) goes on."""
    from ropekit.errors import RopekitError

    cfg = make_config(f"{first['name']}-{second['name']}", stages=[
        {"name": "a", "steps": 1, "method": first}, {"name": "b", "steps": 1, "method": second}])
    steps = []
    with pytest.raises(RopekitError, match="stage b: method clex .* replaces trainable weights") as err:
        train(cfg, dataset=per_stage(text_dataset), callbacks=[lambda info: steps.append(info.stage)], progress=False)
    assert "\n" not in str(err.value)
    assert steps == []  # refused before stage a trained
    assert not (cfg.require_output() / "metrics.jsonl").exists()


def test_the_start_of_run_walk_through_the_stages_leaves_the_run_unchanged(make_config, text_dataset):
    """A curriculum whose switches replace no weights: walking through the stages before training (the refusal's
    check) leaves every parameter, the random state and so every loss as they are when the walk is skipped."""
    import ropekit.train.trainer as trainer_module

    stages = [{"name": "a", "steps": 2, "method": {"name": "pi", "params": {"factor": 2}}},
              {"name": "b", "steps": 2, "method": {"name": "ntk", "params": {"factor": 2}}}]
    walked = train(make_config("walked", stages=stages), dataset=per_stage(text_dataset), progress=False)
    skip = pytest.MonkeyPatch()
    skip.setattr(trainer_module, "switch_changes", lambda old, new: False)
    try:
        plain = train(make_config("plain", stages=stages), dataset=per_stage(text_dataset), progress=False)
    finally:
        skip.undo()
    assert [x for _, x in walked.losses] == [x for _, x in plain.losses]


def test_a_later_stage_on_the_same_pose_data_draws_new_examples(make_config, monkeypatch, tmp_path):
    """Each PoSE example is drawn from (seed, epoch, index) and every stage starts at epoch 0: with the run's seed in
    every stage, stage b replayed stage a's examples verbatim (tokens and positions). The trainer now gives each later
    stage its own data seed; the first stage keeps the run's seed (runs and resumes of one stage are unchanged)."""
    import ropekit.train.trainer as trainer_module
    from ropekit.data.training_data import build_training_data
    from ropekit.models.byte_tokenizer import byte_tokenizer

    seeds = []
    real = trainer_module.build_dataset
    monkeypatch.setattr(trainer_module, "build_dataset",
                        lambda spec, tok, seq_len, seed, *a, **k: seeds.append(seed) or real(spec, tok, seq_len, seed, *a, **k))
    data = {"pose": {"target_length": 256}}
    cfg = make_config("pose-stages", data=data, stages=[{"name": "a", "steps": 1}, {"name": "b", "steps": 1}])
    train(cfg, progress=False)
    assert len(seeds) == 2 and seeds[0] == cfg.train.seed and seeds[1] != seeds[0]

    spec = {"sources": [{"path": "builtin", "max_documents": 20}], **data}

    def examples(seed):
        dataset = build_training_data(spec, byte_tokenizer(), 64, seed, str(tmp_path / "cache"))
        dataset.set_epoch(0)
        return {(tuple(x["input_ids"].tolist()), tuple(x["position_ids"].tolist())) for x in (dataset[i] for i in range(len(dataset)))}

    first, second = examples(seeds[0]), examples(seeds[1])
    assert len(first) > 5 and not first & second  # no example of stage a comes back in stage b
    assert examples(seeds[0]) == first  # the control: the same seed replays them all


@pytest.mark.parametrize("method, params", [("yarn", {"factor": 4}), ("entropy_abf", {"rope_theta": 5e4}),
                                            ("longlora", {"factor": 2})])
def test_uninstall_restores_the_base_model(method, params, make_ids):
    base = build_tiny_model("llama")
    model = copy.deepcopy(base)
    ids = make_ids(96, seed=1)
    config_before = copy.deepcopy(base.config.to_dict())
    with torch.no_grad():
        want = base(input_ids=ids).logits
        install(model, MethodConfig(method, params))
        assert not torch.allclose(model(input_ids=ids).logits, want)
        uninstall(model)
        torch.testing.assert_close(model(input_ids=ids).logits, want, rtol=0, atol=0)
    assert ropekit.installed(model) is None
    after = model.config.to_dict()
    assert after["rope_parameters"] == config_before["rope_parameters"]
    assert after["max_position_embeddings"] == config_before["max_position_embeddings"]
    # and the model can take another method (a stage switch)
    assert switch(model, None, MethodConfig("pi", {"factor": 2.0}))
    assert ropekit.installed(model)["method"] == "pi"
    assert not switch(model, MethodConfig("pi", {"factor": 2.0}), MethodConfig("pi", {"factor": 2.0}))
