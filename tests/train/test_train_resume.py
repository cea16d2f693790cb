"""Checkpoints and --resume: an interrupted run continued from its checkpoint reproduces the uninterrupted run."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import ropekit
from ropekit.errors import RopekitError
from ropekit.train import train
from ropekit.train.checkpoint import list_checkpoints, read_state
from step_kill import Killed, kill_at


def metrics(out_dir) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def resume_config(make_config, name, tmp_path, **train_extra):
    """PoSE data from the real data builder (3 passes over 4 documents, so the epoch changes mid-run and
    after the resume), YaRN, EMA, accumulation 2: every piece of state that must survive a resume."""
    return make_config(
        name, steps=6,
        method={"name": "yarn", "params": {"factor": 4, "beta_fast": 4}},
        data={"sources": [{"path": "builtin", "max_documents": 4}], "pose": {"target_length": 256},
              "cache_dir": str(tmp_path / "cache")},
        train={"micro_batch_size": 1, "grad_accum": 2, "lr": 3e-3, "warmup_steps": 2, "schedule": "cosine",
               "ema": {"decay": 0.7}, **train_extra},
        output={"save_every": 3, "keep_last": None},
    )


def test_resume_reproduces_the_uninterrupted_run(make_config, tmp_path):
    full_cfg = resume_config(make_config, "full", tmp_path)
    full = train(full_cfg, progress=False)
    assert [s for s, _ in full.losses] == [1, 2, 3, 4, 5, 6]

    cfg = resume_config(make_config, "killed", tmp_path)
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(4)], progress=False)
    out = cfg.require_output()
    assert [s for s, _ in list_checkpoints(out)] == [3]
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4]  # step 4 was logged before the "kill"
    state = read_state(out / "checkpoints" / "step-3")
    assert state["step"] == 3 and state["data"]["samples_consumed"] == 6 and state["ema_updates"] == 3

    resumed = train(cfg, resume=True, progress=False)
    assert resumed.resumed_from == 3
    assert [s for s, _ in resumed.losses] == [4, 5, 6]
    assert [x for _, x in resumed.losses] == pytest.approx([x for _, x in full.losses[3:]], rel=1e-6, abs=1e-7)
    rows, want = metrics(out), metrics(full_cfg.require_output())
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # each step once
    for got, ref in zip(rows, want):
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-6) and got["lr"] == ref["lr"]
        assert got["total_tokens"] == ref["total_tokens"]
    for sub in ("final", "final-ema"):
        a = load_file(full_cfg.require_output() / sub / "model.safetensors")
        b = load_file(out / sub / "model.safetensors")
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-6, atol=1e-7)
    assert [s for s, _ in list_checkpoints(out)] == [3, 6]
    # the exported model carries its method
    model = ropekit.load(out / "final")
    assert ropekit.installed(model)["method"] == "yarn"

    # --resume on a finished run trains nothing and reports the run's last loss (from metrics.jsonl)
    again = train(cfg, resume=True, progress=False)
    assert again.losses == [(6, metrics(out)[-1]["loss"])] and again.step == 6


def test_resume_with_dropout_reproduces_the_uninterrupted_run(make_config, tmp_path):
    """With dropout on (LoRA's, 0.3) the masks after a resume are the uninterrupted run's: the data loader draws its
    base seed from a generator of its own, not from the global RNG the checkpoint restores (from it, the resumed
    loader's draw shifted every later mask: step 4's loss moved by 2e-3)."""
    def config(name):
        return resume_config(make_config, name, tmp_path, lora={"r": 4, "alpha": 8, "dropout": 0.3})

    full = train(config("full"), progress=False)
    cfg = config("killed")
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(4)], progress=False)
    resumed = train(cfg, resume=True, progress=False)
    assert resumed.resumed_from == 3
    assert [x for _, x in resumed.losses] == pytest.approx([x for _, x in full.losses[3:]], rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("method", [{"name": "dynamic_ntk", "params": {"factor": 4}},
                                    {"name": "dynamic_yarn", "params": {"factor": 4, "beta_fast": 4}}])
def test_a_resumed_dynamic_schedule_starts_from_the_frequencies_it_had_grown_to(make_config, tmp_path, method):
    """Dynamic NTK and Dynamic YaRN recompute their frequencies at the longest input seen since the last reset
    (transformers' rule), so a run's frequencies depend on its history. The checkpoint keeps that length and
    the resumed run grows to it again: its losses equal the uninterrupted run's exactly (a fresh schedule
    started at the original window measured 2.4e-7 off)."""
    def config(name):
        return make_config(name, steps=6, method=method,
                           data={"sources": [{"path": "builtin", "max_documents": 4}], "pose": {"target_length": 256},
                                 "cache_dir": str(tmp_path / "cache")},
                           train={"micro_batch_size": 2, "grad_accum": 1, "lr": 3e-3},
                           output={"save_every": 3, "keep_last": None})

    full = train(config("full"), progress=False)
    cfg = config("killed")
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(4)], progress=False)
    state = read_state(cfg.require_output() / "checkpoints" / "step-3")
    assert state["rotary_longest"] and all(64 < n <= 256 for n in state["rotary_longest"])
    resumed = train(cfg, resume=True, progress=False)
    assert resumed.losses == full.losses[3:]


def test_run_directory_guards(make_config, tmp_path, text_dataset):
    data = text_dataset(64, 8)
    cfg = make_config("guarded", steps=2, output={"save_every": 1})
    train(cfg, dataset=data, progress=False)
    with pytest.raises(RopekitError, match="already holds checkpoints up to step 2.*--resume"):
        train(cfg, dataset=data, progress=False)
    changed = make_config("guarded", steps=2, train={"lr": 1e-2}, output={"save_every": 1})
    with pytest.raises(RopekitError, match=r"config differs.*train\.lr"):
        train(changed, dataset=data, resume=True, progress=False)
    # output settings may change on resume
    relaxed = make_config("guarded", steps=2, output={"save_every": 1, "log_every": 7})
    assert train(relaxed, dataset=data, resume=True, progress=False).step == 2
    # --resume without any checkpoint starts at step 0
    fresh = make_config("fresh", steps=1)
    assert train(fresh, dataset=data, resume=True, progress=False).resumed_from is None
    file_out = tmp_path / "a-file"
    file_out.write_text("x")
    with pytest.raises(RopekitError, match="is a file"):
        train(make_config("a-file", steps=1), dataset=data, progress=False)


def test_keep_last_prunes_and_leftovers_are_ignored(make_config, text_dataset):
    data = text_dataset(64, 8)
    cfg = make_config("prune", steps=4, output={"save_every": 1, "keep_last": 2})
    out = cfg.require_output()
    (out / "checkpoints" / ".tmp-step-9").mkdir(parents=True)  # a write that was killed half-way
    (out / "checkpoints" / "step-8").mkdir()  # no trainer_state.json: incomplete, never resumed from
    train(cfg, dataset=data, resume=True, progress=False)
    assert [s for s, _ in list_checkpoints(out)] == [3, 4]
    assert not (out / "checkpoints" / ".tmp-step-9").exists()


def test_checkpoints_never_exceed_keep_last_between_publishing_and_pruning(make_config, text_dataset, monkeypatch):
    """save() makes room before it publishes: counted at every boundary of both steps (where a kill can land),
    the complete checkpoints never exceed keep_last."""
    from ropekit.train import checkpoint as ckpt

    data = text_dataset(64, 8)
    cfg = make_config("bounded", steps=5, output={"save_every": 1, "keep_last": 2})
    out = cfg.require_output()
    counts = []

    def watched(fn):
        def wrapped(*args, **kwargs):
            counts.append(len(list_checkpoints(out)))
            result = fn(*args, **kwargs)
            counts.append(len(list_checkpoints(out)))
            return result
        return wrapped

    monkeypatch.setattr(ckpt, "replace_dir", watched(ckpt.replace_dir))
    monkeypatch.setattr(ckpt, "prune", watched(ckpt.prune))
    train(cfg, dataset=data, progress=False)
    assert len(counts) >= 16 and max(counts) == 2, counts
    assert [s for s, _ in list_checkpoints(out)] == [4, 5]


def test_a_checkpoint_killed_before_its_rename_is_published_on_resume(make_config, text_dataset, monkeypatch):
    from ropekit.train import checkpoint as ckpt

    data = text_dataset(64, 8)
    cfg = make_config("unpublished", steps=4, output={"save_every": 1, "keep_last": 2})
    out = cfg.require_output()
    real = ckpt.replace_dir

    def killed_at_step_3(tmp, final):
        if final.name == "step-3":
            raise Killed(3)
        return real(tmp, final)

    monkeypatch.setattr(ckpt, "replace_dir", killed_at_step_3)
    with pytest.raises(Killed):
        train(cfg, dataset=data, progress=False)
    assert [s for s, _ in list_checkpoints(out)] == [2]  # step 1 pruned to make room, step 3 not yet renamed
    monkeypatch.setattr(ckpt, "replace_dir", real)
    result = train(cfg, dataset=data, resume=True, progress=False)
    assert result.resumed_from == 3 and [s for s, _ in list_checkpoints(out)] == [3, 4]


def test_resuming_a_finished_run_reports_its_final_loss(make_config, text_dataset):
    data = text_dataset(64, 8)
    cfg = make_config("finished", steps=2)
    first = train(cfg, dataset=data, progress=False)
    again = train(cfg, dataset=data, resume=True, progress=False)
    assert again.losses == first.losses[-1:] and again.losses[0][0] == 2


@pytest.mark.parametrize("method,said", [({"name": "yarn", "params": {"factor": 2}}, True),
                                         ({"name": "yarn", "params": {"factor": 4}}, False)])
def test_pose_positions_past_the_declared_window_are_said_in_one_line(make_config, tmp_path, method, said):
    """PoSE to 256 positions on the 64-token model: YaRN ×2 declares 128 tokens, and one line says so with the
    factor that would cover them; YaRN ×4 declares 256 and nothing is said."""
    import io

    from rich.console import Console

    cfg = make_config(f"pose-{method['params']['factor']}", steps=1, method=method,
                      data={"sources": [{"path": "builtin", "max_documents": 4}], "pose": {"target_length": 256},
                            "cache_dir": str(tmp_path / "cache")})
    text = io.StringIO()
    train(cfg, progress=False, console=Console(file=text, width=400))
    lines = [line for line in text.getvalue().splitlines() if "positions reach" in line]
    assert len(lines) == int(said)
    if said:
        assert "pose positions reach 256, past the 128-token window" in lines[0] and "factor ≥ 2" in lines[0]


@pytest.mark.parametrize("dtype,said", [("bfloat16", True), ("float32", False)])
def test_weights_trained_in_16_bits_are_said_in_one_line(make_config, dtype, said):
    """AdamW on bfloat16 weights rounds most small updates away; one line names the float32-weights recipe."""
    import io

    from rich.console import Console

    text = io.StringIO()
    train(make_config(f"w-{dtype}", steps=1, model={"name": "tiny", "dtype": dtype}), progress=False,
          console=Console(file=text, width=400))
    lines = [line for line in text.getvalue().splitlines() if "trainable weights are held in" in line]
    assert len(lines) == int(said)
    if said:
        assert "bfloat16" in lines[0] and "train.precision: bf16" in lines[0]


def test_a_run_killed_while_exporting_resumes_and_exports_again(make_config, tmp_path, monkeypatch):
    """Killed after the model was written into DIR/.tmp-final but before the rename (the longest write of a run):
    --resume refused the directory as holding files no run wrote. Now it clears the half-built export, continues
    from the last checkpoint and exports the model the uninterrupted run exports."""
    from ropekit.train import checkpoint as ckpt

    full = train(resume_config(make_config, "full", tmp_path), progress=False)
    cfg = resume_config(make_config, "killed", tmp_path)
    real = ckpt.replace_dir

    def killed_before_the_rename(tmp, final):
        raise Killed("export")

    monkeypatch.setattr(ckpt, "replace_dir", killed_before_the_rename)
    with pytest.raises(Killed):
        train(cfg, progress=False)
    out = cfg.require_output()
    # what os._exit would leave: the half-built export (the finally that removes it never ran) and a half JSON
    (out / ".tmp-final").mkdir(exist_ok=True)
    (out / ".tmp-final" / "model.safetensors").write_bytes(b"partial")
    (out / "metrics.jsonl.tmp").write_text("{")
    assert not (out / "final").exists()
    monkeypatch.setattr(ckpt, "replace_dir", real)
    resumed = train(cfg, resume=True, progress=False)
    assert not (out / ".tmp-final").exists() and not (out / "metrics.jsonl.tmp").exists()
    a, b = load_file(full.final_dir / "model.safetensors"), load_file(resumed.final_dir / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_weight_decay_reads_a_zero3_partitioned_parameters_own_shape():
    """Under ZeRO-3 with zero3_init_flag every parameter is built as an empty 1-D placeholder (its shape in
    ds_shape): all of them went to the no-decay group, and train.weight_decay was silently ignored."""
    from ropekit.train.trainer import no_decay

    matrix = torch.nn.Parameter(torch.empty(0))
    matrix.ds_shape = torch.Size([64, 64])
    norm = torch.nn.Parameter(torch.empty(0))
    norm.ds_shape = torch.Size([64])
    assert not no_decay("model.layers.0.self_attn.q_proj.weight", matrix)
    assert no_decay("model.layers.0.input_layernorm.weight", norm)
    assert no_decay("model.layers.0.self_attn.q_proj.bias", torch.nn.Parameter(torch.empty(64)))
    assert not no_decay("lm_head.weight", torch.nn.Parameter(torch.empty(8, 8)))


def test_a_bf16_run_hands_the_callers_model_back_without_autocast(tmp_path):
    """accelerate's mixed-precision prepare wraps the model's forward in bf16 autocast; after train() the caller's
    model kept it, so its logits differed from DIR/final's (same weights) by ~3e-3."""
    from ropekit.data.local_text import stdlib_documents
    from ropekit.models.byte_tokenizer import byte_tokenizer
    from ropekit.models.tiny import build_tiny_model
    from ropekit.train.config import parse_config
    from ropekit.train.data import packed_dataset

    dataset = packed_dataset(stdlib_documents(20_000, "train"), 64)
    cfg = parse_config({"model": "tiny", "data": {"seq_len": 64},
                        "train": {"max_steps": 2, "micro_batch_size": 2, "threads": 1, "precision": "bf16"},
                        "output": {"dir": str(tmp_path / "run"), "log_every": 1000}})
    model = build_tiny_model("llama")
    result = train(cfg, dataset=dataset, model=model, tokenizer=byte_tokenizer(), progress=False)
    final = ropekit.load(result.final_dir).eval()
    model.eval()
    ids = dataset.tokens[:1]
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, final(input_ids=ids).logits)
    assert "_original_forward" not in model.__dict__
