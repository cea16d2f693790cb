"""scripts/backfill_placement.py on a store whose pieces' finishing times are set by hand."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from ropekit.study.store import StudyStore

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "backfill_placement.py"
GPU = ["--device", "cuda:0", "--dtype", "bfloat16", "--attn", "sdpa", "--hardware", "NVIDIA H200",
       "--train-precision", "bf16"]


def _sample(method, doc, **extra):
    return {"task": "ppl", "method": method, "params": {}, "length": 64, "doc": doc, "nll_sum": 1.0,
            "tokens_scored": 10, **extra}


def _study(path: Path) -> Path:
    db = path / "study.sqlite"
    with StudyStore(db) as store:
        for piece, kind in (("train:yarn-ft", "train"), ("eval:ppl:yarn", "eval"), ("eval:ppl:pi", "eval"),
                            ("eval:ppl:ntk", "eval"), ("eval:ppl:abf", "eval")):
            store.begin_piece(piece, kind=kind)
            if piece == "eval:ppl:abf":  # one sample from the lease, one from a later run that stamped its own
                store.add_samples(piece, [_sample("abf", 0), _sample("abf", 1, computed_on={"device": "cpu",
                                                                                          "dtype": "float32"})])
            if piece != "eval:ppl:abf":  # left running
                store.finish_piece(piece, [], placement={"device": "cpu", "dtype": "float32", "hardware": "here"}
                                   if piece == "eval:ppl:pi" else None)
    con = sqlite3.connect(db)
    finished = {"train:yarn-ft": "2026-11-27T16:00:00+00:00", "eval:ppl:yarn": "2026-11-27T22:50:00+00:00",
                "eval:ppl:pi": "2026-11-27T22:51:00+00:00", "eval:ppl:ntk": "2026-11-28T02:00:00+00:00"}
    for piece, when in finished.items():
        con.execute("UPDATE pieces SET finished = ? WHERE id = ?", (when, piece))
    con.commit()
    con.close()
    return db


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_only_unrecorded_pieces_finished_before_the_moment_are_filled(tmp_path):
    db = _study(tmp_path)
    done = _run(db, "--until", "2026-11-27T23:00", *GPU)
    assert done.returncode == 0, done.stderr
    with StudyStore(db, create=False) as store:
        got = store.placements()
    assert got == {
        "train:yarn-ft": {"device": "cuda:0", "dtype": "float32", "hardware": "NVIDIA H200", "precision": "bf16"},
        "eval:ppl:yarn": {"device": "cuda:0", "dtype": "bfloat16", "attn": "sdpa", "hardware": "NVIDIA H200"},
        "eval:ppl:pi": {"device": "cpu", "dtype": "float32", "hardware": "here"},  # its own record is kept
    }  # ntk finished after the moment, abf never finished: neither is given one
    again = _run(db, "--until", "2026-11-27T23:00", *GPU)
    assert again.returncode == 0 and again.stdout == "" and "0 piece(s)" in again.stderr


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    missing = _run(tmp_path / "none.sqlite", "--until", "2026-11-27T23:00", *GPU)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and not (tmp_path / "none.sqlite").exists()
    db = _study(tmp_path)
    bad = _run(db, "--until", "yesterday", *GPU)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "ISO 8601" in bad.stderr


def test_unstamped_samples_are_stamped_only_when_asked(tmp_path):
    db = _study(tmp_path)
    assert _run(db, "--until", "2026-11-27T23:00", *GPU).returncode == 0
    with StudyStore(db, create=False) as store:
        assert store.sample_placements()["eval:ppl:abf"] == [(None, 1), ({"device": "cpu", "dtype": "float32"}, 1)]
    done = _run(db, "--until", "2026-11-27T23:00", *GPU, "--unstamped-samples")
    assert done.returncode == 0 and "1 sample(s) stamped" in done.stderr
    with StudyStore(db, create=False) as store:
        got = sorted(store.sample_placements()["eval:ppl:abf"], key=lambda x: x[0]["device"])
    assert got == [({"device": "cpu", "dtype": "float32"}, 1),  # its own stamp kept
                   ({"device": "cuda:0", "dtype": "bfloat16", "hardware": "NVIDIA H200", "attn": "sdpa"}, 1)]
