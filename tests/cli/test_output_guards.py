"""Refusals before any work, found by a sweep of malformed command lines: a command that would replace or write
over files it did not make, or would take a value it cannot use, says so in one line (exit 2), loads nothing and
writes nothing."""

from __future__ import annotations

from pathlib import Path

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
