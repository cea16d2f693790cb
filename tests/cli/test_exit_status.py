"""Exit status: 0 only when everything asked for succeeded; failures exit non-zero with a one-line summary; input
errors (also the filesystem's) exit 2 with a reason and write nothing; Ctrl-C exits 130 in one line and leaves
nothing "running" in a study's store."""

from __future__ import annotations

import importlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import ropekit
from ropekit.errors import ModelLoadError
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model

BOMB = "\n".join(["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
                 + [f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi")])

STUDY = {"name": "exits", "model": "tiny", "target_length": 256, "variants": [{"label": "base"}],
         "evals": {"ppl": {"lengths": [64], "samples": 1, "score_mode": "truncate"}}}


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    return lines[0]


def _export(tmp_path: Path, name: str = "model") -> Path:
    model = build_tiny_model("llama", num_layers=2)
    ropekit.extend(model, "yarn", factor=2.0)
    ropekit.save_pretrained(model, tmp_path / name, tokenizer=byte_tokenizer())
    return tmp_path / name


# ---- failures that are not the user's input ---------------------------------------------------------------------
def test_a_failed_verification_exits_1(run_cli, monkeypatch, tmp_path):
    from ropekit.engines.verify import VerifyReport

    verify_module = importlib.import_module("ropekit.engines.verify")  # the package's `verify` may be this module

    def failing(directory, engine, **_):
        return VerifyReport(engine="transformers", engine_version="x", directory=str(directory), tokens=10,
                            original_window=8, max_abs_diff=0.5, mean_abs_diff=0.1, tolerance=1e-4, passed=False,
                            engine_seconds=0.0, ropekit_seconds=0.0, details={})

    monkeypatch.setattr(verify_module, "verify", failing)
    code, out, _ = run_cli("verify", str(tmp_path), "--engine", "transformers")
    assert code == 1 and "FAIL" in out
    code, out, err = run_cli("verify", str(tmp_path), "--engine", "transformers", "--json")
    assert code == 1 and json.loads(out)["passed"] is False and _one_error_line(err).startswith("FAIL")


def _study_file(tmp_path: Path, **change) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({**STUDY, **change}))
    return path


def test_a_study_with_failed_pieces_exits_1_with_a_summary(run_cli, monkeypatch, tmp_path):
    from ropekit.study import runner

    def broken(*args, **kwargs):
        raise RuntimeError("the evaluation broke")

    monkeypatch.setattr(runner, "execute_piece", broken)
    code, out, err = run_cli("study", str(_study_file(tmp_path)), "--out", str(tmp_path / "s"), "--no-report")
    assert code == 1 and "1 failed" in out and "the evaluation broke" in out
    code, out, err = run_cli("study", str(_study_file(tmp_path)), "--out", str(tmp_path / "s"), "--no-report", "--json")
    assert code == 1 and json.loads(out)["by_status"]["failed"] == 1 and "1 of 1 pieces failed" in err


def test_error_text_with_brackets_is_printed_as_written(run_cli, monkeypatch, tmp_path):
    """A failed piece's error is text: rich read "[batch, seq]" as a style (dropped) and "[/tmp/log]" as a closing
    tag (an internal error from `study status`)."""
    from ropekit.study import runner

    def broken(*args, **kwargs):
        raise ValueError("expected [batch, seq]; see [/tmp/log]")

    monkeypatch.setattr(runner, "execute_piece", broken)
    code, out, _ = run_cli("study", str(_study_file(tmp_path)), "--out", str(tmp_path / "s"), "--no-report")
    assert code == 1 and "expected [batch, seq]; see [/tmp/log]" in out
    code, out, err = run_cli("study", "status", str(tmp_path / "s"))
    assert code == 0 and "internal error" not in err and "[/tmp/log]" in out and "[batch," in out


def test_ctrl_c_in_a_study_exits_130_and_leaves_nothing_running(run_cli, monkeypatch, tmp_path):
    from ropekit.study import runner
    from ropekit.study.store import StudyStore

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "execute_piece", interrupted)
    code, _, err = run_cli("study", str(_study_file(tmp_path)), "--out", str(tmp_path / "s"), "--no-report")
    assert code == 130 and "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted", err
    with StudyStore(tmp_path / "s", create=False) as store:
        assert store.status()["by_status"] == {"pending": 1, "running": 0, "done": 0, "failed": 0}


@pytest.mark.parametrize("command, where", [
    (["extend", "tiny", "-m", "yarn", "-f", "2", "--out", "m"], "ropekit.install.export._without_rotary_weights"),
    (["train", "CONFIG", "--out", "run", "--max-steps", "20"], "ropekit.train.trainer.Trainer._loop"),  # past warm-up
    (["eval", "ppl", "tiny", "--lengths", "64", "--out", "r.jsonl"], "ropekit.models.loading.load_model"),
])
def test_ctrl_c_in_a_long_command_exits_130_in_one_line(run_cli, monkeypatch, tmp_path, command, where):
    """KeyboardInterrupt wherever it lands (here: where each command does its work) is exit 130 and one line;
    extend leaves no directory."""
    from ropekit.train.examples import example_yaml

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(where, interrupted)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(example_yaml("tiny-full"))
    code, _, err = run_cli(*[str(tmp_path / "c.yaml") if part == "CONFIG" else part for part in command])
    assert code == 130 and _one_error_line(err) == "interrupted", err
    assert not (tmp_path / "m").exists() and not [n for n in os.listdir(tmp_path) if n.endswith(".part")]


@pytest.mark.parametrize("args", [(), ("eval",), ("engines",)])
def test_a_bare_command_prints_its_help_and_exits_0(run_cli, args):
    # no arguments asks for the help, as --help does (click 8.2+ calls it a usage error, exit 2)
    code, out, err = run_cli(*args)
    assert code == 0 and "Usage:" in out and err == ""


def test_a_subcommand_missing_its_argument_is_still_exit_2(run_cli):
    code, _, err = run_cli("eval", "passkey")
    assert code == 2 and "Missing argument" in _one_error_line(err)


# ---- input errors: exit 2, one line, nothing written --------------------------------------------------------------
@pytest.mark.parametrize("args, words", [
    (["extend", "tiny", "-m", "yarn", "-f", "1e300", "--out", "m"], "factor"),
    (["extend", "tiny", "-m", "ntk", "-f", "1e300", "--out", "m"], "factor"),
    (["extend", "tiny", "-m", "yarn", "-f", "1e6", "--out", "m"], "past 16,777,216"),
    (["extend", "tiny", "-m", "pi", "-t", "100000000", "--out", "m"], "past 16,777,216"),
    (["extend", "tiny", "-m", "yarn", "-f", "2", "--out", "file/m"], "which is a file"),
    (["extend", "tiny", "-m", "yarn", "-f", "2", "--format", "gguf", "--out", "file/m.gguf"], "which is a file"),
    (["extend", "tiny", "-m", "yarn", "-f", "2", "--out", "x" * 300], "longer than this filesystem"),
    (["inspect", "m" * 20000], "name too long"),
    (["study", "study.yaml", "--out", "file"], "exists and is a file"),
    (["report", "file"], "not a ropekit study database"),
    (["recommend", "tiny", "-t", "256", "-o", "r", "--methods", ",", "--plan"], "names no method"),
])
def test_input_errors_exit_2_with_a_reason_and_write_nothing(run_cli, monkeypatch, tmp_path, args, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("a file\n")
    _study_file(tmp_path)
    before = sorted(os.listdir(tmp_path))
    code, _, err = run_cli(*args)
    assert code == 2 and words in _one_error_line(err), err
    assert sorted(os.listdir(tmp_path)) == before and (tmp_path / "file").read_text() == "a file\n"


def test_a_report_of_a_damaged_study_database_leaves_nothing(run_cli, tmp_path):
    study = tmp_path / "study"
    study.mkdir()
    (study / "study.sqlite").write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 64)
    code, _, err = run_cli("report", str(study))
    assert code == 2 and "study.sqlite" in _one_error_line(err)
    assert os.listdir(study) == ["study.sqlite"]


def test_a_read_only_filesystem_is_exit_2(run_cli, monkeypatch, tmp_path):
    from ropekit.runtime import atomic

    real = os.statvfs

    class ReadOnly:
        def __init__(self, path):
            self.result = real(path)

        def __getattr__(self, name):
            return getattr(self.result, name)

        @property
        def f_flag(self):
            return self.result.f_flag | os.ST_RDONLY

    monkeypatch.setattr(atomic.os, "statvfs", ReadOnly)
    code, _, err = run_cli("extend", "tiny", "-m", "yarn", "-f", "2", "--out", str(tmp_path / "m"))
    assert code == 2 and "read-only filesystem" in _one_error_line(err) and os.listdir(tmp_path) == []


def test_an_oserror_the_user_can_fix_is_exit_2_not_an_internal_error(run_cli, monkeypatch, tmp_path):
    import errno

    from ropekit.install import export

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "m" / "model.safetensors"))

    monkeypatch.setattr(export, "_without_rotary_weights", refuse)
    code, _, err = run_cli("extend", "tiny", "-m", "yarn", "-f", "2", "--out", str(tmp_path / "m"))
    assert code == 2 and "read-only filesystem" in _one_error_line(err) and os.listdir(tmp_path) == []


@pytest.mark.parametrize("text, words", [
    (None, "is not UTF-8"),
    ("model: {name: tiny}\ntrain: {max_steps: 30, max_steps: 5}\n", "duplicate key 'max_steps'"),
    ("train: {max_steps: 3}\nmodel: {name: tiny}\ntrain: {lr: 1.0e-3}\n", "duplicate key 'train' (first at line 1) at line 3"),
    (BOMB + "\nmodel: {name: *i}\n", "aliases expand"),
    ("FULL", "method.params.factor"),
    ("SEQ", "data.seq_len"),
])
def test_bad_train_configs_exit_2_before_anything_is_written(run_cli, monkeypatch, tmp_path, text, words):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "c.yaml"
    from ropekit.train.examples import example_yaml

    full = example_yaml("tiny-full")
    if text is None:
        config.write_bytes(bytes(range(128, 256)) * 8)
    elif text == "FULL":  # a complete config whose factor is out of any physical range
        config.write_text(full.replace("    factor: 4\n", "    factor: 1.0e+300\n", 1))
    elif text == "SEQ":
        config.write_text(full.replace("  seq_len: 256 ", "  seq_len: 1000000000 ", 1))
    else:
        config.write_text(text)
    code, _, err = run_cli("train", str(config), "--out", "run")
    assert code == 2 and words in _one_error_line(err), err
    assert os.listdir(tmp_path) == ["c.yaml"]


@pytest.mark.parametrize("change, words", [
    ({"evals": {"ppl": {"lengths": [64], "samples": -2}}}, "evals.ppl.samples must be a positive whole number"),
    ({"evals": {"passkey": {"lengths": [64], "trials": 0}}}, "evals.passkey.trials"),
    ({"target_length": 1 << 30}, "target_length"),
    ({"variants": [{"label": "y", "method": "yarn", "params": {"factor": 1e300}}]}, "factor"),
])
def test_bad_study_configs_exit_2_before_the_study_directory_exists(run_cli, tmp_path, change, words):
    code, _, err = run_cli("study", str(_study_file(tmp_path, **change)), "--out", str(tmp_path / "s"))
    assert code == 2 and words in _one_error_line(err), err
    assert not (tmp_path / "s").exists()


def test_a_yaml_bomb_in_a_study_note_is_refused_before_the_study_directory_exists(run_cli, tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(BOMB + "\n" + yaml.safe_dump(STUDY) + "description: *i\n")
    started = time.perf_counter()
    code, _, err = run_cli("study", str(path), "--out", str(tmp_path / "s"))
    assert code == 2 and "aliases expand" in _one_error_line(err)
    assert time.perf_counter() - started < 10 and not (tmp_path / "s").exists()


def test_damaged_weights_are_one_line_from_ropekit_load(run_cli, tmp_path):
    directory = _export(tmp_path)
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="cannot load the weights") as err:
        ropekit.load(directory)
    assert "\n" not in str(err.value)
    code, _, err_text = run_cli("inspect", str(directory))
    assert code == 2 and "cannot load the weights" in _one_error_line(err_text)


def test_verify_hands_the_engine_an_absolute_directory(run_cli, monkeypatch, tmp_path):
    """The runner runs in a temporary working directory: a relative DIR must reach it resolved."""
    verify_module = importlib.import_module("ropekit.engines.verify")  # `ropekit.engines.verify` is the function

    _export(tmp_path)
    seen = {}

    def engine(chosen, request, python=None):
        seen["model"] = request["model"]
        raise SystemExit(0)

    monkeypatch.setattr(verify_module, "run_engine", engine)
    monkeypatch.chdir(tmp_path)
    run_cli("verify", "model", "--engine", "transformers")
    assert Path(seen["model"]).is_absolute() and Path(seen["model"]) == (tmp_path / "model").resolve()


def _study_with_two_workers_running(tmp_path: Path, *extra: str):
    """``ropekit study`` with two worker processes, in a session of its own, once a piece is running:
    ``(process, study database)``."""
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump({**STUDY, "variants": [{"label": "base"}, {"label": "pi", "method": "pi",
                                                                                  "params": {"factor": 4}}],
                                      "evals": {"ppl": {"lengths": [64, 128, 256], "samples": 8}}}))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "ropekit", "study", str(config), "--out", str(tmp_path / "s"),
                             "--workers", "2", *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    db = tmp_path / "s" / "study.sqlite"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if db.exists():
            try:
                with sqlite3.connect(db) as conn:
                    if conn.execute("SELECT COUNT(*) FROM pieces WHERE status = 'running'").fetchone()[0]:
                        break
            except sqlite3.Error:
                pass
        time.sleep(0.2)
    return proc, db


@pytest.mark.slow
def test_sigint_of_a_study_with_worker_processes_exits_130_without_tracebacks(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while two worker processes run pieces: exit
    130, one line, no traceback from the parent or the workers, no piece left "running". Bounded: ~1 min."""
    proc, db = _study_with_two_workers_running(tmp_path, "--no-report")
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted", err
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM pieces WHERE status = 'running'").fetchone()[0] == 0


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the worker processes in /proc (Linux)")
def test_sigint_that_reaches_only_the_workers_stops_the_study(tmp_path):
    """A background job ignores SIGINT, so a `kill -INT` of its process group ends the workers and not the study
    process: it must report the study interrupted (exit 130, no report written), not carry on as if its pieces had
    finished — `ropekit recommend` once decided and exported on a study whose last pieces had been put back
    pending this way. Bounded: ~1 min."""
    proc, db = _study_with_two_workers_running(tmp_path)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    workers = [int(pid) for pid in children if "ropekit" in Path(f"/proc/{pid}/cmdline").read_text()
               or "multiprocessing" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert workers, children
    for pid in workers:
        os.kill(pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert not (tmp_path / "s" / "report").exists()
    with sqlite3.connect(db) as conn:  # the interrupted pieces were put back for the next run
        assert conn.execute("SELECT COUNT(*) FROM pieces WHERE status = 'running'").fetchone()[0] == 0


@pytest.mark.slow
def test_sigint_of_a_training_run_exits_130_without_a_traceback(tmp_path):
    """A real `ropekit train` stopped by SIGINT mid-training: exit 130, the last line `interrupted`, no traceback;
    --resume then continues from the last checkpoint. Bounded: ~1 min."""
    from ropekit.train.examples import example_yaml

    config = tmp_path / "c.yaml"
    config.write_text(example_yaml("tiny-full").replace("max_documents: 100", "max_documents: 5"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    # as a terminal's foreground job: SIGINT handled even when this suite was started by a launcher that ignores it
    # (a background job of a script does), which the child would inherit and keep training through
    foreground = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                  "sys.argv[0] = 'ropekit'; runpy.run_module('ropekit', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", foreground, "train", str(config), "--out", str(tmp_path / "run")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted", err


def test_labels_and_ids_are_printed_as_written_not_as_emoji(capsys):
    """Rich reads `:a:` or `:up:` as emoji codes: a study variant labelled `a` printed `train🅰`. Every console
    ropekit prints through keeps such text literal."""
    from ropekit.cli.common import err, out
    from ropekit.runtime.progress import progress

    out.print("failed train:a: and eval:up:x")
    err.print("eval:ok:base")
    with progress("t", total=1, enabled=True) as bar:
        bar.log("done: train:a:")
    captured = capsys.readouterr()
    assert "failed train:a: and eval:up:x" in captured.out
    assert "eval:ok:base" in captured.err and "train:a:" in captured.err
    assert not any(ord(c) > 0x2000 for c in captured.out + captured.err if c not in "━─…→×≈·")
