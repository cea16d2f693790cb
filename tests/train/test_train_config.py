"""Training configs: validation (one line naming the key), stage merging, the examples and GPU recipes, the schedule."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from ropekit.errors import RopekitError
from ropekit.train import (
    example_names,
    example_yaml,
    load_config,
    parse_config,
    parse_yaml,
)
from ropekit.train.config import ConfigError
from ropekit.train.curriculum import locate, lr_at, plan

REPO = Path(__file__).resolve().parents[2]


def good() -> dict:
    return {
        "model": {"name": "tiny"},
        "method": {"name": "yarn", "params": {"factor": 4}},
        "data": {"seq_len": 256, "sources": [{"path": "builtin"}]},
        "train": {"max_steps": 10, "lr": 1e-3},
        "output": {"dir": "runs/x"},
    }


def with_(path: str, value):
    raw = good()
    node = raw
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return raw


def test_a_good_config_parses_with_defaults():
    cfg = parse_config(good())
    assert cfg.model.name == "tiny" and cfg.model.dtype == "float32"
    assert cfg.method.name == "yarn" and cfg.method.params == {"factor": 4.0}
    assert cfg.train.betas == (0.9, 0.95) and cfg.train.optimizer == "adamw"
    assert cfg.data.spec == {"sources": [{"path": "builtin"}]} and cfg.data.seq_len == 256
    assert len(cfg.stages) == 1 and cfg.stages[0].steps == 10 and cfg.total_steps == 10
    assert cfg.train.ema is None and cfg.train.lora is None


def test_shorthands_and_yaml_numbers():
    raw = good()
    raw["model"] = "tiny"
    raw["method"] = "none"
    raw["train"]["lr"] = "2e-5"  # YAML reads this as a string
    raw["train"]["ema"] = True
    raw["train"]["lora"] = True
    cfg = parse_config(raw)
    assert cfg.model.name == "tiny" and cfg.method.name is None
    assert cfg.train.lr == 2e-5
    assert cfg.train.ema.decay == 0.999 and cfg.train.lora.r == 8 and cfg.train.lora.trainable == ["embed", "norm"]


@pytest.mark.parametrize(
    "raw, key",
    [
        (with_("train.learning_rate", 1e-3), "train.learning_rate"),
        (with_("modell", "tiny"), "modell"),
        (with_("train.lr", -1), "train.lr"),
        (with_("train.lr", "fast"), "train.lr"),
        (with_("train.max_steps", 0), "train.max_steps"),
        (with_("train.max_steps", 2.5), "train.max_steps"),
        (with_("train.schedule", "exponential"), "train.schedule"),
        (with_("train.precision", "fp16"), "train.precision"),
        (with_("train.betas", [0.9]), "train.betas"),
        (with_("train.ema", {"decay": 1.0}), "train.ema.decay"),
        (with_("train.ema", {"every": 0}), "train.ema.every"),
        (with_("train.lora", {"trainable": ["embed", "heads"]}), "train.lora.trainable"),
        (with_("train.guard", {"spike_factor": 0.5}), "train.guard.spike_factor"),
        (with_("method.name", "yarnn"), "method.name"),
        (with_("method.params", {"factr": 4}), "method.params.factr"),
        (with_("method.params", {"factor": 0.5}), "method.params.factor"),
        (with_("data.seq_len", 1), "data.seq_len"),
        (with_("data.pose", {"target_length": 128}), "data.pose.target_length"),  # not longer than seq_len 256
        (with_("data.packing", {"reset": True}), "reset"),
        (with_("output.save_every", -1), "output.save_every"),
        (with_("output.tensorboard", "yes"), "output.tensorboard"),
    ],
)
def test_bad_keys_and_values_name_the_key_on_one_line(raw, key):
    with pytest.raises(RopekitError) as info:
        parse_config(raw)
    line = info.value.one_line()
    assert key in line and "\n" not in line
    assert info.value.fix  # says what to write instead


def test_missing_sections_and_conflicts():
    raw = good()
    del raw["train"]["max_steps"]
    with pytest.raises(ConfigError, match="train.max_steps"):
        parse_config(raw)
    raw = good()
    del raw["data"]
    with pytest.raises(ConfigError, match="data"):
        parse_config(raw)
    raw = good()
    del raw["model"]
    with pytest.raises(ConfigError, match="model"):
        parse_config(raw)
    with pytest.raises(ConfigError, match="factor and target_length"):
        parse_config(with_("method.params", {"factor": 2, "target_length": 256}))
    with pytest.raises(ConfigError, match="output.dir"):
        cfg = parse_config(good())
        cfg.output.dir = None
        cfg.require_output()


def test_trackers_need_their_packages():
    import importlib.util

    for name in ("tensorboard", "wandb"):
        if importlib.util.find_spec(name) is None:
            with pytest.raises(ConfigError, match=f"output.{name}: needs the '{name}' package.*pip install {name}"):
                parse_config(with_(f"output.{name}", True))
        else:
            assert parse_config(with_(f"output.{name}", True))


def test_yaml_syntax_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: tiny\ntrain: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_stages_inherit_and_override():
    raw = good()
    raw["method"] = {"name": "abf", "params": {"rope_theta": 1e5, "factor": 2}}
    raw["data"]["seq_len"] = 128
    del raw["train"]["max_steps"]
    raw["train"]["micro_batch_size"] = 4
    raw["stages"] = [
        {"name": "a", "steps": 3},
        {"name": "b", "steps": 5, "seq_len": 256, "method": {"params": {"rope_theta": 2e5}}, "lr": 5e-4,
         "micro_batch_size": 2, "data": {"sources": [{"path": "builtin", "max_documents": 3}]}},
        {"name": "c", "steps": 2, "method": {"name": "yarn", "params": {"factor": 8}}, "reset_optimizer": True},
    ]
    cfg = parse_config(raw)
    a, b, c = cfg.stages
    assert (a.steps, a.seq_len, a.method.params, a.lr, a.micro_batch_size) == (3, 128, {"rope_theta": 1e5, "factor": 2.0}, 1e-3, 4)
    assert (b.seq_len, b.method.name, b.method.params, b.lr, b.micro_batch_size) == (256, "abf", {"rope_theta": 2e5, "factor": 2.0}, 5e-4, 2)
    assert b.data.spec["sources"] == [{"path": "builtin", "max_documents": 3}]
    assert (c.method.name, c.method.params, c.seq_len, c.reset_optimizer) == ("yarn", {"factor": 8.0}, 128, True)
    assert cfg.total_steps == 10 and cfg.train.max_steps == 10
    stages = plan(cfg)
    assert [(s.start, s.end) for s in stages] == [(0, 3), (3, 8), (8, 10)]
    assert locate(stages, 0) == (0, 0) and locate(stages, 3) == (1, 0) and locate(stages, 7) == (1, 4)
    assert locate(stages, 10) == (2, 2)
    # --max-steps with stages stops the curriculum without changing it
    short = cfg.with_overrides(max_steps=4)
    assert short.last_step == 4 and short.total_steps == 10
    bad = dict(raw, train=dict(raw["train"], max_steps=7))
    with pytest.raises(ConfigError, match="stages add up to 10"):
        parse_config(bad)
    bad = dict(raw, stages=[{"name": "a", "steps": 1}, {"name": "a", "steps": 1}])
    with pytest.raises(ConfigError, match="stages\\[1\\].name"):
        parse_config(bad)
    bad = dict(raw, stages=[{"steps": 1, "sequence": 5}])
    with pytest.raises(ConfigError, match="stages\\[0\\].sequence"):
        parse_config(bad)


@pytest.mark.parametrize("name", example_names())
def test_every_example_validates(name):
    text = example_yaml(name)
    assert text.startswith("#")
    cfg = parse_yaml(text, name)
    assert cfg.output.dir and cfg.total_steps > 0


def test_unknown_example_is_one_line():
    with pytest.raises(RopekitError, match="unknown example 'tiny-ful'.*did you mean tiny-full"):
        example_yaml("tiny-ful")


def gpu_recipes() -> list[Path]:
    return sorted(p for p in (REPO / "configs" / "train").glob("*.yaml") if not p.name.startswith("accelerate-"))


def test_there_are_gpu_recipes():
    names = [p.name for p in gpu_recipes()]
    assert any("7b" in n for n in names) and any("abf-3stage" in n for n in names)


@pytest.mark.parametrize("path", gpu_recipes(), ids=lambda p: p.name)
def test_gpu_recipes_validate(path):
    cfg = load_config(path)
    assert cfg.model.dtype == "float32" and cfg.train.precision == "bf16" and cfg.model.gradient_checkpointing
    assert cfg.total_steps > 0 and cfg.output.save_every > 0


def test_abf_3stage_recipe_is_paper_004():
    """HARPE §4.2: ABF multi-stage b=1M at 32k, 2M at 64k, 5M at 128k; lr 2e-5, AdamW β=(0.9, 0.95)."""
    cfg = load_config(REPO / "configs" / "train" / "llama2-7b-abf-3stage.yaml")
    assert [(s.method.name, s.method.params["rope_theta"], s.seq_len) for s in cfg.stages] == [
        ("abf", 1e6, 32768), ("abf", 2e6, 65536), ("abf", 5e6, 131072)]
    assert cfg.train.lr == 2e-5 and cfg.train.betas == (0.9, 0.95)
    tokens = [s.steps * s.micro_batch_size * s.grad_accum * 8 * s.seq_len for s in cfg.stages]
    assert sum(tokens) == pytest.approx(6e9, rel=0.05)  # "continually pre-trained with 6B tokens"


def test_accelerate_config_is_fsdp2():
    data = yaml.safe_load((REPO / "configs" / "train" / "accelerate-fsdp2.yaml").read_text())
    assert data["distributed_type"] == "FSDP" and data["fsdp_config"]["fsdp_version"] == 2


# ---- the learning-rate schedule vs transformers' schedulers ---------------------------------------------------
def _hf_lr(kind: str, steps: int, warmup: int, peak: float) -> list[float]:
    from transformers import (
        get_cosine_schedule_with_warmup,
        get_linear_schedule_with_warmup,
    )

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    make = get_cosine_schedule_with_warmup if kind == "cosine" else get_linear_schedule_with_warmup
    sched = make(opt, warmup, steps)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_decay_matches_transformers_after_warmup(kind):
    """After the warm-up, step n uses transformers' rate of its 0-based step n − 1; during it, lr·n/W
    (transformers starts at 0 instead)."""
    cfg = parse_config(with_("train", {"max_steps": 20, "lr": 1e-3, "warmup_steps": 4, "schedule": kind}))
    ours = [lr_at(cfg.train, cfg.stages[0], n) for n in range(1, 21)]
    ref = _hf_lr(kind, 20, 4, 1e-3)
    assert ours[:4] == pytest.approx([1e-3 * n / 4 for n in range(1, 5)], rel=1e-12)
    assert ours[4:] == pytest.approx(ref[4:], rel=1e-9, abs=1e-15)
    assert ours[-1] > 0


def test_min_lr_ratio_and_constant():
    cfg = parse_config(with_("train", {"max_steps": 11, "lr": 1.0, "schedule": "cosine", "min_lr_ratio": 0.1}))
    got = [lr_at(cfg.train, cfg.stages[0], n) for n in range(1, 12)]
    want = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (n - 1) / 11)) for n in range(1, 12)]
    assert got == pytest.approx(want, rel=1e-12)
    cfg = parse_config(with_("train", {"max_steps": 5, "lr": 0.5, "warmup_steps": 2}))
    assert [lr_at(cfg.train, cfg.stages[0], n) for n in range(1, 6)] == [0.25, 0.5, 0.5, 0.5, 0.5]


def test_landmark_sequences_must_hold_a_block_and_tokens_after_it():
    """A landmark after every mem_freq tokens is trained through later tokens retrieving its block: with seq_len ≤
    mem_freq no token follows a block (the run trained, and the landmark embedding stayed as initialised)."""
    raw = good()
    raw["method"] = {"name": "landmark", "params": {"mem_freq": 100}}
    raw["data"]["seq_len"] = 64
    with pytest.raises(ConfigError, match="no token follows a block"):
        parse_config(raw)
    raw["data"]["seq_len"] = 100
    with pytest.raises(ConfigError, match="mem_freq 100 in sequences of 100 tokens"):
        parse_config(raw)
    raw["data"]["seq_len"] = 202
    assert parse_config(raw).stages[0].method.params["mem_freq"] == 100
    # the method's default (50) counts too, and a stage says which
    raw = good()
    raw["method"] = {"name": "landmark"}
    raw["stages"] = [{"steps": 5, "seq_len": 256}, {"name": "short", "steps": 5, "seq_len": 32}]
    del raw["train"]["max_steps"]
    with pytest.raises(ConfigError, match=r"stages\[1\] \(short\): landmark with mem_freq 50"):
        parse_config(raw)


def test_landmark_under_lora_needs_its_token_embedding_trained():
    """LoRA freezes the input embedding unless `embed` is an extra: the landmark token's row (new, the mean of the
    others) stayed as initialised while the run reported Landmark trained."""
    raw = good()
    raw["method"] = {"name": "landmark", "params": {"mem_freq": 20}}
    raw["data"]["seq_len"] = 128
    raw["train"]["lora"] = {"trainable": ["norm"]}
    with pytest.raises(ConfigError, match="landmark token's embedding row would not train"):
        parse_config(raw)
    raw["train"]["lora"] = {"trainable": ["embed"]}
    assert parse_config(raw).train.lora.trainable == ["embed"]
    raw["train"]["lora"] = None
    assert parse_config(raw).train.lora is None


def test_a_scale_method_without_its_scale_is_refused_when_the_config_is_read():
    """`method: yarn` without factor trained YaRN ×1 (the model's own RoPE) under YaRN's name; --dry-run passed it."""
    raw = good()
    raw["method"] = {"name": "yarn"}
    with pytest.raises(ConfigError, match="method yarn needs a scale"):
        parse_config(raw)
    raw["method"] = {"name": "yarn", "params": {"target_length": 1024}}
    assert parse_config(raw).method.params == {"target_length": 1024}
    raw["method"] = {"name": "self_extend"}  # its group size has the paper's default
    assert parse_config(raw).method.name == "self_extend"
