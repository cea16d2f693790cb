"""Refusals before any work, found by a sweep of malformed command lines: a command that would replace or write
over files it did not make, or would take a value it cannot use, says so in one line (exit 2), loads nothing and
writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _one_line(code, err, words):
    assert code == 2 and words in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_recommend_overwrite_never_replaces_a_directory_it_did_not_write(run_cli, tmp_path):
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    code, _, err = run_cli("recommend", "tiny", "--target-length", "128", "--out", str(occupied), "--budget", "5s",
                           "--methods", "yarn", "--overwrite")
    _one_line(code, err, "not a ropekit recommendation")
    assert [p.name for p in occupied.iterdir()] == ["keep.txt"] and (occupied / "keep.txt").read_text() == "mine"


def test_search_refuses_a_model_directory_of_another_run_before_searching(run_cli, tmp_path):
    out = tmp_path / "s"
    (out / "model").mkdir(parents=True)
    (out / "model" / "notes.txt").write_text("mine")
    code, _, err = run_cli("search", "tiny", "--target-length", "128", "--out", str(out), "--evaluations", "4",
                           "--documents", "1")
    _one_line(code, err, "is not the model of an earlier search")
    assert sorted(p.name for p in out.iterdir()) == ["model"] and not (out / "search.sqlite").exists()


def test_search_max_factor_must_be_a_finite_number(run_cli, tmp_path):
    for value in ("inf", "nan"):
        code, _, err = run_cli("search", "tiny", "--target-length", "256", "--out", str(tmp_path / "s"),
                               "--max-factor", value)
        _one_line(code, err, "is not a finite number")
        assert not (tmp_path / "s").exists()


def test_train_plan_takes_only_a_finite_memory(run_cli):
    code, _, err = run_cli("train", "plan", str(REPO / "configs/train/llama2-7b-yarn-64k.yaml"), "--gpu-memory", "inf")
    _one_line(code, err, "not a finite number of GiB")


def test_eval_short_refuses_lengths_it_would_not_use(run_cli, tmp_path):
    code, _, err = run_cli("eval", "short", "tiny", "--lengths", "4k", "--out", str(tmp_path / "r.jsonl"))
    _one_line(code, err, "--lengths does not apply")
    assert not (tmp_path / "r.jsonl").exists()


# ---- flags that were silently ignored, and directories of someone else's files (a second sweep) --------------------
def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _train_config(run_cli, path: Path) -> Path:
    """The tiny-pose example recipe written to ``path``."""
    code, text, err = run_cli("train", "--example", "tiny-pose")
    assert code == 0, err
    path.write_text(text)
    return path


TINY_STUDY = """name: NAME
model: tiny
target_length: 128
variants: [base]
evals:
  ppl: {lengths: [64]}
"""


@pytest.mark.parametrize("args, words", [
    (["export", "DIR", "--format", "vllm", "--outtype", "bf16"], "--outtype applies to --format gguf"),
    (["export", "tiny", "--format", "gguf"], "'tiny' is not a directory to write the GGUF into"),
    (["extend", "tiny", "-m", "yarn", "-f", "2", "--format", "gguf", "--rope-format", "native", "--out", "OUT"],
     "a GGUF file has llama.cpp's keys"),
    (["extend", "tiny", "-m", "yarn", "-f", "2", "--layer-types", ",", "--out", "OUT"], "names no layer type"),
    (["recommend", "tiny", "-t", "128", "--out", "OUT", "--plan", "--workers", "2"], "--workers apply to the run"),
    (["recommend", "tiny", "-t", "128", "--out", "OUT", "--plan", "--overwrite"], "--overwrite apply to the run"),
    (["eval", "ppl", "tiny", "--lengths", "64", "--resume"], "--resume continues the results file given with --out"),
    (["eval", "speed", "tiny", "--lengths", "64", "--resume"], "--resume continues the results file given with --out"),
    (["pose-coverage", "--scheme", "randpos", "--chunks", "2"], "--scheme randpos draws no chunks"),
    (["study", "--preset", "quick", "--show", "--workers", "2"], "--workers does not apply to --show"),
    (["study", "--preset", "quick", "--show", "--out", "OUT"], "--out does not apply to --show"),
    (["study", "status", "OUT", "--preset", "quick"], "--preset does not apply to `ropekit study status`"),
    (["study", "--preset", "quick", "--out", "OUT", "--address", "auto"], "--address names a Ray cluster"),
    (["study", "CONFIG"], "cannot name the default directory study-NAME"),
    (["study", "--preset", "quick", "--out", "OUT", "--backend", "ray", "--workers", "2"], "--workers sets the local"),
    (["train", "--example", "tiny-pose", "--json"], "--json applies to `--example list`"),
    # from a sweep of export/verify/report: --out replaced the source's weights; an empty --outtype meant f16
    (["export", "DIR", "--format", "gguf", "-o", "DIR/model.safetensors", "--overwrite"], "is not a .gguf file name"),
    (["export", "DIR", "--format", "gguf", "-o", "OUT/"], "is not a .gguf file name"),
    (["export", "DIR", "--format", "gguf", "--outtype", "", "-o", "OUT.gguf"], "--outtype '' is not one of"),
    (["export", "/nonexistent/model", "--format", "gguf"], "does not exist"),
    (["verify", "tiny", "--engine", "transformers"], "'tiny' does not exist"),
    (["verify", "DIR", "--engine", "transformers", "--tolerance", "inf"], "--tolerance inf is not a finite number"),
    (["pretrain-base", "--seed", "99999999999999999999"], "is outside 0 … 2³² − 1"),  # was an internal error
    # /proc passes permission checks as root; the error named ropekit's temporary file, after the work
    (["export", "tiny", "--format", "gguf", "-o", "/proc/x.gguf"], "cannot create files in '/proc'"),
    (["pretrain-base", "--threads", "4"], "--threads sets the pre-training's threads"),  # the shipped model: unused
])
def test_a_flag_the_command_would_not_use_is_refused(run_cli, tmp_path, monkeypatch, args, words):
    """Each of these was accepted and silently unused (or, for ``export tiny``, wrote ./tiny/model-f16.gguf; for a
    study named ``../../escape`` without --out, a directory two levels up): one line, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "escape.yaml"
    config.write_text(TINY_STUDY.replace("NAME", '"../../escape"'))
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "config.json").write_text("{}")
    before = _files(tmp_path)
    swap = {"OUT": str(tmp_path / "out"), "DIR": str(tmp_path / "dir"), "CONFIG": str(config)}
    code, _, err = run_cli(*[swap.get(a, a) if a in swap else a.replace("DIR/", swap["DIR"] + "/").replace(
        "OUT", swap["OUT"]) for a in args])
    _one_line(code, err, words)
    assert _files(tmp_path) == before


@pytest.mark.parametrize("command", [
    ["study", "CONFIG", "--out", "OCCUPIED"],
    ["search", "tiny", "--target-length", "128", "--out", "OCCUPIED", "--evaluations", "4", "--documents", "1"],
    ["train", "CONFIG", "--out", "OCCUPIED", "--max-steps", "1"],
])
def test_a_directory_of_someone_elses_files_is_refused(run_cli, tmp_path, command):
    """A study, a search or a training run wrote its database and models among unrelated files (and a later resume
    would take the directory for its own). A new or empty directory, or one of an earlier run, is still used."""
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    config = tmp_path / "c.yaml"
    if command[0] == "study":
        config.write_text(TINY_STUDY.replace("NAME", "tiny-study"))
    else:
        _train_config(run_cli, config)
    swap = {"OCCUPIED": str(occupied), "CONFIG": str(config)}
    code, _, err = run_cli(*[swap.get(a, a) for a in command])
    _one_line(code, err, "holds files")
    assert _files(occupied) == ["keep.txt"]


def test_a_dry_run_refuses_what_the_run_would(run_cli, tmp_path):
    config = _train_config(run_cli, tmp_path / "c.yaml")
    text = config.read_text()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    code, _, err = run_cli("train", str(config), "--dry-run", "--out", str(a_file))
    _one_line(code, err, "exists and is a file")
    config.write_text(text.replace("name: tiny\n", "name: /nonexistent/model\n", 1))
    code, _, err = run_cli("train", str(config), "--dry-run", "--out", str(tmp_path / "new"))
    _one_line(code, err, "'/nonexistent/model' does not exist")
    assert not (tmp_path / "new").exists()


def test_a_run_may_keep_its_own_config_in_its_directory(run_cli, tmp_path):
    """The guard against someone else's files exempts the config the run was given, there (and an earlier study's
    name that is not a short name still runs where --out says)."""
    study_dir = tmp_path / "exp"
    study_dir.mkdir()
    config = study_dir / "study.yaml"
    config.write_text(TINY_STUDY.replace("NAME", '"my study"').replace("[64]", "[16]"))
    code, _, err = run_cli("study", str(config), "--out", str(study_dir), "--no-report")
    assert code == 0, err
    assert (study_dir / "study.sqlite").is_file()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _train_config(run_cli, run_dir / "train.yaml")
    code, _, err = run_cli("train", str(run_dir / "train.yaml"), "--out", str(run_dir), "--max-steps", "1")
    assert code == 0, err
    assert (run_dir / "final").is_dir()


@pytest.mark.parametrize("flags", [["--resume"], ["--dry-run"], ["--dry-run", "--resume"]])
def test_train_refuses_someone_elses_directory_also_on_resume_and_dry_run(run_cli, tmp_path, flags):
    """``--resume`` into a directory of unrelated files (no checkpoint) trained beside them, and ``--dry-run``
    accepted what the run refuses."""
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    config = _train_config(run_cli, tmp_path / "c.yaml")
    code, _, err = run_cli("train", str(config), "--out", str(occupied), "--max-steps", "1", *flags)
    _one_line(code, err, "holds files no training run wrote (keep.txt)")
    assert _files(occupied) == ["keep.txt"]


def test_a_dry_run_refuses_an_earlier_run_without_resume(run_cli, tmp_path):
    config = _train_config(run_cli, tmp_path / "c.yaml")
    assert run_cli("train", str(config), "--out", str(tmp_path / "run"), "--max-steps", "1")[0] == 0
    code, _, err = run_cli("train", str(config), "--out", str(tmp_path / "run"), "--dry-run")
    _one_line(code, err, "already holds an earlier run")
    # resumed with the run's own settings (its --max-steps too: a resume with another length is refused, by the run
    # and by its dry run alike)
    assert run_cli("train", str(config), "--out", str(tmp_path / "run"), "--max-steps", "1", "--dry-run", "--resume")[0] == 0


def test_ropekit_warnings_are_one_line(run_cli):
    """A warning of ropekit's own (here: shot counts that do not fit) is one ``warning:`` line, not Python's
    ``file:line: UserWarning`` and the source line under it."""
    code, _, err = run_cli("eval", "manyshot", "tiny", "--shots", "0,2", "--lengths", "64,300", "--samples", "1")
    assert code == 0, err
    warned = [line for line in err.splitlines() if "do not fit" in line]
    assert warned == ["warning: ropekit manyshot: 0, 2 shots do not fit in 64 tokens; skipped"], err
    assert "UserWarning" not in err and ".py:" not in err


def test_verify_refuses_an_export_its_engine_cannot_load(run_cli, tmp_path):
    """A Self-Extend export is in ropekit's own format: `verify -e transformers` ended in "KeyError:
    'ropekit_self_extend'" from inside the engine. Now refused before anything starts."""
    assert run_cli("extend", "tiny", "-m", "self_extend", "-o", str(tmp_path / "se"))[0] == 0
    code, _, err = run_cli("verify", str(tmp_path / "se"), "--engine", "transformers")
    _one_line(code, err, "holds self_extend in ropekit's own format, which transformers cannot load")


def test_shipping_the_shipped_model_leaves_it_as_it_is(tmp_path):
    """`pretrain-base --ship` when the shipped model matched copied each file onto itself (SameFileError)."""
    from ropekit.train.builtin_base import ship_model

    (tmp_path / "config.json").write_text("{}")
    assert ship_model(tmp_path, shipped_dir=tmp_path) == tmp_path
    assert _files(tmp_path) == ["config.json"]
