"""`ropekit train`: examples, dry runs, a real run of the tiny-full example, and every bad input as one line + exit 2."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

import ropekit
from ropekit.train import example_names, example_yaml


def test_example_list_and_print(run_cli):
    code, out, _ = run_cli("train", "--example", "list", "--json")
    assert code == 0
    assert [e["name"] for e in json.loads(out)] == example_names()
    assert {"tiny-full", "tiny-pose", "tiny-longlora", "tiny-sft", "abf-curriculum"} <= set(example_names())
    code, out, _ = run_cli("train", "--example", "tiny-pose")
    assert code == 0 and out == example_yaml("tiny-pose")
    assert yaml.safe_load(out)["data"]["pose"]["target_length"] == 256


@pytest.mark.parametrize(
    "args, needle",
    [
        (["train", "--example", "tiny-huge"], "unknown example 'tiny-huge'"),
        (["train"], "no training config given"),
        (["train", "missing.yaml"], "not found"),
        (["train", "--example", "tiny-full", "--resume"], "--example prints a config"),
        # the planner's flags would size nothing in a training run; a training run's flags nothing in a plan
        (["train", "run.yaml", "--gpus", "8"], "--gpus does not apply to a training run"),
        (["train", "run.yaml", "--strategy", "zero3"], "--strategy does not apply to a training run"),
        (["train", "run.yaml", "--gpu-memory", "40", "--dry-run"], "--gpu-memory does not apply to a training run"),
        (["train", "bench", "--context-parallel", "2"], "--context-parallel does not apply to a training run"),
        (["train", "plan", "run.yaml", "--out", "elsewhere"], "--out does not apply to `ropekit train plan`"),
        (["train", "plan", "run.yaml", "--max-steps", "5"], "--max-steps does not apply to `ropekit train plan`"),
    ],
)
def test_bad_invocations_are_one_line(run_cli, monkeypatch, tmp_path, args, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(example_yaml("tiny-full"))
    code, out, err = run_cli(*args)
    assert code == 2 and out == ""
    assert needle in err and err.strip().count("\n") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]  # nothing written


def test_bad_config_values_are_one_line(run_cli, tmp_path):
    raw = yaml.safe_load(example_yaml("tiny-full"))
    raw["train"]["warmup"] = 3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    code, _, err = run_cli("train", str(path))
    assert code == 2 and "train.warmup: unknown key" in err and "warmup_steps" in err
    good = tmp_path / "good.yaml"
    good.write_text(example_yaml("tiny-full"))
    code, _, err = run_cli("train", str(good), "--max-steps", "0")
    assert code == 2 and "--max-steps: must be ≥ 1" in err


def test_dry_run_prints_the_plan(run_cli, tmp_path):
    path = tmp_path / "abf.yaml"
    path.write_text(example_yaml("abf-curriculum"))
    code, out, _ = run_cli("train", str(path), "--dry-run", "--json", "--max-steps", "150")
    assert code == 0
    plan = json.loads(out)["plan"]
    assert [(p["stage"], p["steps"], p["seq_len"], p["tokens/step"]) for p in plan] == [
        ("2x", "1–100", 128, 512), ("4x", "101–150", 256, 512), ("8x", "—", 512, 512)]
    assert not (tmp_path / "runs").exists()


def test_max_steps_inside_the_warmup_is_said(run_cli, tmp_path):
    """tiny-pose warms up over 10 steps (linear schedule): --max-steps 3 would train at lr 1e-4…3e-4 of its 1e-3 peak."""
    path = tmp_path / "pose.yaml"
    path.write_text(example_yaml("tiny-pose"))
    code, _, err = run_cli("train", str(path), "--dry-run", "--max-steps", "3")
    assert code == 0 and "note: --max-steps 3 ends before the 10-step warm-up" in err.splitlines()[0]
    code, _, err = run_cli("train", str(path), "--dry-run", "--max-steps", "40")
    assert code == 0 and "warm-up" not in err
    # a run refused before it starts says only the refusal: the note waits for the run's own checks
    (tmp_path / "afile").write_text("x")
    code, out, err = run_cli("train", str(path), "--max-steps", "3", "--out", str(tmp_path / "afile"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "warm-up" not in err


def _tiny_full(tmp_path, monkeypatch, save_every: int):
    """The tiny-full example on one thread, checkpointing every ``save_every`` steps; its config path."""
    monkeypatch.setenv("ROPEKIT_CACHE", str(tmp_path / "cache"))
    raw = yaml.safe_load(example_yaml("tiny-full"))
    raw["train"]["threads"] = 1
    raw["output"]["save_every"] = save_every
    config = tmp_path / "tiny-full.yaml"
    config.write_text(yaml.safe_dump(raw))
    return config


def test_tiny_full_runs_a_few_steps_and_loads_with_its_method(run_cli, monkeypatch, tmp_path):
    config = _tiny_full(tmp_path, monkeypatch, save_every=1)
    out_dir = tmp_path / "run"
    code, out, err = run_cli("train", str(config), "--out", str(out_dir), "--max-steps", "2", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["step"] == 2 and summary["final"] == str(out_dir / "final")
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["tokens"] == 4 * 256 for r in rows)
    model = ropekit.load(out_dir / "final")
    record = ropekit.installed(model)
    assert record["method"] == "yarn" and record["params"]["factor"] == 4.0
    assert model.config.max_position_embeddings == 256
    assert yaml.safe_load((out_dir / "config.yaml").read_text())["train"]["max_steps"] == 2
    # a second start without --resume refuses; with --resume it is already done
    code, _, err = run_cli("train", str(config), "--out", str(out_dir), "--max-steps", "2")
    assert code == 2 and "--resume" in err
    code, _, err = run_cli("train", str(config), "--out", str(out_dir), "--max-steps", "2", "--resume")
    assert code == 0 and "nothing to do" in err
    # a damaged checkpoint (a truncated optimizer file): one line naming it, the files left as they are
    shutil.rmtree(out_dir / "final")
    shutil.rmtree(out_dir / "final-ema", ignore_errors=True)
    damaged = out_dir / "checkpoints" / "step-2"
    optimizer = next(damaged.glob("optimizer*.bin"))
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    code, _, err = run_cli("train", str(config), "--out", str(out_dir), "--max-steps", "2", "--resume")
    assert code == 2 and f"checkpoint {damaged} cannot be read back" in err and len(err.strip().splitlines()) == 1
    assert optimizer.stat().st_size == 100
    # the same for truncated weights and an unreadable trainer state (safetensors' and json's own errors)
    weights = next(damaged.glob("model*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    state = damaged / "trainer_state.json"
    for broken in (None, b"x", b"[1, 2]"):
        if broken is not None:
            state.write_bytes(broken)
        code, _, err = run_cli("train", str(config), "--out", str(out_dir), "--max-steps", "2", "--resume")
        assert code == 2 and f"checkpoint {damaged} cannot be read back" in err, err
        assert len(err.strip().splitlines()) == 1 and "internal error" not in err
    assert weights.stat().st_size == 100 and state.read_bytes() == b"[1, 2]"


def test_resume_of_a_finished_run_without_checkpoints_keeps_its_model(run_cli, monkeypatch, tmp_path):
    """No checkpoint (save_every 0) and a finished model: --resume with the same length has nothing to do; with another
    length it would have trained from step 0 and replaced the model, so it is refused in one line."""
    config = _tiny_full(tmp_path, monkeypatch, save_every=0)
    out_dir = tmp_path / "run"
    code, _, err = run_cli("train", str(config), "--out", str(out_dir), "--max-steps", "1")
    assert code == 0, err
    weights = (out_dir / "final" / "model.safetensors").read_bytes()
    code, _, err = run_cli("train", str(config), "--out", str(out_dir), "--max-steps", "1", "--resume")
    assert code == 0 and "nothing to do" in err
    code, out, err = run_cli("train", str(config), "--out", str(out_dir), "--max-steps", "2", "--resume")
    assert code == 2 and out == "" and "no checkpoint to continue from" in err and len(err.strip().splitlines()) == 1
    assert (out_dir / "final" / "model.safetensors").read_bytes() == weights


def test_a_missing_data_path_or_an_unwritable_output_is_one_line_before_the_run_directory(run_cli, tmp_path):
    """A data source that does not exist (it failed after writing config.yaml and metrics.jsonl into the run
    directory), and an output directory that is a file: one line, exit 2, nothing written."""
    raw = yaml.safe_load(example_yaml("tiny-full"))
    raw["data"] = {**(raw.get("data") or {}), "sources": [{"path": str(tmp_path / "nonexistent.jsonl")}]}
    config = tmp_path / "nodata.yaml"
    config.write_text(yaml.safe_dump(raw))
    code, _, err = run_cli("train", str(config), "--out", str(tmp_path / "run"))
    assert code == 2 and "nonexistent.jsonl' does not exist" in err and err.strip().count("\n") == 0, err
    assert not (tmp_path / "run").exists()
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    good = tmp_path / "good.yaml"
    good.write_text(example_yaml("tiny-full"))
    code, _, err = run_cli("train", str(good), "--out", str(afile))
    assert code == 2 and "exists and is a file" in err and err.strip().count("\n") == 0, err
    assert afile.read_text() == "keep me"


@pytest.mark.parametrize("source, needle", [
    (lambda p: (p / "empty.txt").write_text(""), "empty.txt' is empty"),
    (lambda p: (p / "blank.txt").write_text("  \n\n"), "holds no text"),
    (lambda p: (p / "wrong.jsonl").write_text('{"body": "a"}\n'), "has no 'text' field"),
])
def test_unusable_training_data_writes_nothing_and_the_fixed_command_runs(run_cli, tmp_path, source, needle):
    """The data is read before the run writes its config copy and metrics file: a bad file is one line, and the
    directory is not left looking like "an earlier run" that the fixed command then refuses."""
    source(tmp_path)
    data = next(p for p in tmp_path.iterdir())
    raw = {"model": "tiny", "data": {"seq_len": 32, "sources": [{"path": str(data)}]}, "train": {"max_steps": 1}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    code, _, err = run_cli("train", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "out"))
    assert code == 2 and needle in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    text = "some text to train on. " * 40
    data.write_text(json.dumps({"text": text}) + "\n" if data.suffix == ".jsonl" else text)
    code, _, err = run_cli("train", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "out"))
    assert code == 0, err


def test_accelerates_own_gradient_accumulation_is_refused(run_cli, monkeypatch, tmp_path):
    """`accelerate launch --gradient_accumulation_steps N` makes accelerate's backward divide each loss by N; ropekit
    already normalises a step's loss over its micro-batches, so gradients, their logged norm and the clipping would all
    be N times too small. Refused in one line, nothing written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    (tmp_path / "run.yaml").write_text(example_yaml("tiny-full"))
    code, out, err = run_cli("train", "run.yaml", "--max-steps", "1")
    assert code == 2 and out == "" and err.strip().count("\n") == 0
    assert "gradient_accumulation_steps 4" in err and "train.grad_accum" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]
