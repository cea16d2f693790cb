"""--resume at the edges of a run: a kill between the final exports, another process count, data that changed
since the checkpoint, and a run the loss guard aborted. Each is measured against an uninterrupted run or against
the record the run wrote before the resume."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import ropekit.train.trainer as trainer_module
from ropekit.errors import RopekitError
from ropekit.train import TrainingAborted, train
from ropekit.train.checkpoint import list_checkpoints
from step_kill import Killed, kill_at


def ema_config(make_config, name, tmp_path, **output):
    """YaRN with PoSE data, an EMA, 6 steps and a checkpoint at step 4 only: the EMA average at step 6 exists nowhere
    on disk but in the exports."""
    return make_config(
        name, steps=6, method={"name": "yarn", "params": {"factor": 4, "beta_fast": 4}},
        data={"sources": [{"path": "builtin", "max_documents": 4}], "pose": {"target_length": 256},
              "cache_dir": str(tmp_path / "cache")},
        train={"micro_batch_size": 1, "grad_accum": 2, "lr": 3e-3, "ema": {"decay": 0.7}},
        output={"save_every": 4, "keep_last": None, **output},
    )


def same_weights(a_dir, b_dir):
    a, b = load_file(a_dir / "model.safetensors"), load_file(b_dir / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0)


def test_a_kill_between_the_final_exports_is_finished_by_resume(make_config, tmp_path, monkeypatch):
    """The EMA export comes first, so a run whose ``final`` exists has every export. A run killed after ``final`` but
    before ``final-ema`` (the order before, or a directory deleted) is not finished: --resume trains again from the
    last checkpoint (step 4) and writes both, equal to the uninterrupted run's. It said "nothing to do" and the
    EMA weights at step 6 were lost."""
    full = train(ema_config(make_config, "full", tmp_path), progress=False)
    full_out = full.out_dir
    assert full.ema_dir == full_out / "final-ema"

    # killed during the last export: the EMA model is in place, final is not
    cfg = ema_config(make_config, "killed", tmp_path)
    real_export = trainer_module.export_model

    def export_then_die(directory, **kwargs):
        if directory.name == "final":
            raise Killed("export")
        return real_export(directory, **kwargs)

    monkeypatch.setattr(trainer_module, "export_model", export_then_die)
    with pytest.raises(Killed):
        train(cfg, progress=False)
    out = cfg.require_output()
    assert (out / "final-ema" / "model.safetensors").is_file() and not (out / "final").exists()
    monkeypatch.setattr(trainer_module, "export_model", real_export)
    resumed = train(cfg, resume=True, progress=False)
    assert resumed.resumed_from == 4
    for sub in ("final", "final-ema"):
        same_weights(full_out / sub, out / sub)

    # a finished run whose final-ema went missing: trained again from step 4, not "nothing to do"
    shutil.rmtree(out / "final-ema")
    again = train(cfg, resume=True, progress=False)
    assert again.resumed_from == 4 and again.ema_dir == out / "final-ema"
    same_weights(full_out / "final-ema", out / "final-ema")
    # and a finished run found finished names both of its exports
    done = train(cfg, resume=True, progress=False)
    assert done.resumed_from is None and done.final_dir == out / "final" and done.ema_dir == out / "final-ema"


def resumable(make_config, tmp_path, name, sources, **train_extra):
    cfg = make_config(name, steps=6, data={"sources": sources, "cache_dir": str(tmp_path / "cache")},
                      train={"micro_batch_size": 1, "grad_accum": 1, "lr": 3e-3, **train_extra},
                      output={"save_every": 3, "keep_last": None})
    return cfg


def test_resume_with_another_process_count_is_refused(make_config, tmp_path):
    """Each step's samples are read at stream positions counted in the run's processes: a checkpoint of 2 processes
    resumed by 1 re-read samples already trained on, at half the global batch, with a note only."""
    cfg = resumable(make_config, tmp_path, "procs", [{"path": "builtin", "max_documents": 4}])
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(4)], progress=False)
    out = cfg.require_output()
    state_file = list_checkpoints(out)[-1][1] / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert state["data"]["processes"] == 1
    state["data"]["processes"] = 2
    state_file.write_text(json.dumps(state))
    metrics_before = (out / "metrics.jsonl").read_bytes()
    with pytest.raises(RopekitError, match=r"written by 2 processes .* this launch has 1") as info:
        train(cfg, resume=True, progress=False)
    assert "resume with 2 processes" in info.value.fix
    assert (out / "metrics.jsonl").read_bytes() == metrics_before


def test_resume_over_changed_data_is_refused_and_keeps_the_runs_record(make_config, tmp_path):
    """A data file edited between the kill and --resume (or another Python's built-in corpus): the resumed steps
    trained on other rows with no message, and data-main.json was rewritten with the new corpus. Refused now, the
    record kept; the unchanged file resumes to the uninterrupted run's losses."""
    text = tmp_path / "corpus.txt"
    original = "\n\n".join(f"Paragraph {i}: " + " ".join(f"word{(i * 7 + j) % 53}" for j in range(120))
                           for i in range(12))
    text.write_text(original)
    sources = [{"path": str(text)}]
    full = train(resumable(make_config, tmp_path, "full", sources), progress=False)
    cfg = resumable(make_config, tmp_path, "edited", sources)
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(4)], progress=False)
    out = cfg.require_output()
    record = (out / "data-main.json").read_bytes()

    text.write_text(original.replace("word3 ", "word4 "))  # same size in tokens, other tokens
    with pytest.raises(RopekitError, match=r"training data of stage main differs") as info:
        train(cfg, resume=True, progress=False)
    assert "start a new --out" in info.value.fix
    assert (out / "data-main.json").read_bytes() == record
    state = json.loads((list_checkpoints(out)[-1][1] / "trainer_state.json").read_text())
    assert len(state["data"]["fingerprint"]) == 16

    text.write_text(original)
    resumed = train(cfg, resume=True, progress=False)
    assert resumed.resumed_from == 3 and resumed.losses == full.losses[3:]


def test_a_run_the_loss_guard_aborted_goes_on_with_a_raised_limit(make_config, tmp_path, capsys):
    """A resume replays the run exactly, so the same guard aborts at the same step again; its advice (raise
    max_skipped) was refused by --resume as a config change. The guard's settings may change on resume now, with a
    note; the steps before the checkpoint are the run's."""
    def config(max_skipped):
        return make_config("guarded", steps=14,
                           method={"name": "yarn", "params": {"factor": 4, "beta_fast": 4}},
                           data={"sources": [{"path": "builtin", "max_documents": 4}], "pose": {"target_length": 256},
                                 "cache_dir": str(tmp_path / "cache")},
                           train={"micro_batch_size": 1, "grad_accum": 2, "lr": 3e-3, "warmup_steps": 2,
                                  "guard": {"spike_factor": 1.0001, "spike_window": 3, "max_skipped": max_skipped}},
                           output={"save_every": 2, "keep_last": None})

    with pytest.raises(TrainingAborted) as first:
        train(config(0), progress=False)
    assert "--resume" in first.value.fix and "same settings replay the same abort" in first.value.fix
    aborted_at = int(str(first.value).split("step ")[1].split(":")[0])
    with pytest.raises(TrainingAborted) as again:
        train(config(0), resume=True, progress=False)
    assert int(str(again.value).split("step ")[1].split(":")[0]) == aborted_at
    capsys.readouterr()
    done = train(config(20), resume=True, progress=False)
    assert done.step == 14 and done.resumed_from is not None and done.resumed_from < aborted_at
    assert "train.guard changed on resume: max_skipped 0 → 20" in capsys.readouterr().err
