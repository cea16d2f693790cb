"""A study's evaluation resumed in another dtype is refused: its cells would average float32 and bfloat16 samples.

``ropekit eval --resume`` refuses this (:func:`ropekit.eval.common._check_resumed_dtype`); a study's evaluation
piece builds its own context and has to make the same check, before a sample is written."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

import pytest
import yaml

from ropekit.errors import RopekitError
from ropekit.study.config import parse_study
from ropekit.study.runner import run_study

#: One frozen variant, one evaluation of 2 lengths × 2 documents on the tiny model: a few seconds.
RAW = {
    "name": "dtype-resume",
    "model": "tiny",
    "seed": 0,
    "target_length": 256,
    "device": "cpu",
    "dtype": "float32",
    "variants": [{"label": "pi", "method": "pi", "params": {"factor": 4}}],
    "evals": {"ppl": {"lengths": [64, 128], "samples": 2, "score_mode": "truncate"}},
}
PIECE = "eval:ppl:pi"
REFUSAL = "computed in float32; this run computes in bfloat16, and resuming would mix the two in one summary"


def _sql(db: Path, *statements: tuple) -> list:
    """Run ``(sql, args…)`` statements in one transaction on the study's database; the last one's rows."""
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        rows = [conn.execute(sql, args).fetchall() for sql, *args in statements]
    return rows[-1]


def _samples(db: Path) -> list[tuple]:
    return _sql(db, ("SELECT id, piece, sample_key, record FROM samples ORDER BY id",))


def _half_done(tmp_path: Path) -> tuple[Path, Path]:
    """A float32 study whose evaluation lost its samples at length 128 and waits to be resumed."""
    out = tmp_path / "study"
    status = run_study(parse_study(RAW), out, progress=False)
    assert status["by_status"]["done"] == 1
    db = out / "study.sqlite"
    assert _sql(db, ("SELECT COUNT(*) FROM samples WHERE piece = ?", PIECE)) == [(4,)]
    _sql(db, ("DELETE FROM samples WHERE piece = ? AND length = 128", PIECE),
         ("UPDATE pieces SET status = 'pending', finished = NULL WHERE id = ?", PIECE))
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(RAW))
    return out, config


def test_a_piece_resumed_in_another_dtype_is_refused_and_its_samples_are_kept(run_cli, tmp_path):
    out, config = _half_done(tmp_path)
    before = _samples(out / "study.sqlite")
    assert len(before) == 2
    code, stdout, stderr = run_cli("study", str(config), "--out", str(out), "--dtype", "bfloat16", "--no-report")
    # refused up front (require_same_dtype), before the study starts: exit 2, one line, and no bfloat16 sample joins
    # the float32 ones (a piece started anyway, on Ray, refuses when it starts: a failed piece)
    assert code == 2, (code, stdout, stderr)
    lines = [line for line in (stdout + stderr).splitlines() if REFUSAL in line]
    assert len(lines) == 1 and "pass --dtype float32 to continue it" in lines[0], stdout + stderr
    assert "Traceback" not in stderr and "internal error" not in stderr
    assert _samples(out / "study.sqlite") == before

    # in the dtype its samples were computed in, the piece resumes: the kept samples as they were, the rest added
    status = run_study(parse_study(RAW), out, progress=False)
    assert status["by_status"]["done"] == 1 and status["by_status"]["failed"] == 0
    after = _samples(out / "study.sqlite")
    assert len(after) == 4 and after[:2] == before
    assert {json.loads(r[3])["computed_on"]["dtype"] for r in after} == {"float32"}


def test_the_whole_study_is_checked_up_front_before_anything_is_written(tmp_path):
    from ropekit.study.pieces import require_same_dtype

    out, _ = _half_done(tmp_path)
    before = _samples(out / "study.sqlite")
    require_same_dtype(parse_study(RAW), out)  # the same dtype: accepted
    with pytest.raises(RopekitError) as refused:
        require_same_dtype(parse_study({**RAW, "dtype": "bfloat16"}), out)
    line = refused.value.one_line()
    assert REFUSAL in line and "\n" not in line and str(out / "study.sqlite") in line
    assert _samples(out / "study.sqlite") == before
    # a finished piece is not computed again, whatever the dtype: nothing to refuse
    _sql(out / "study.sqlite", ("UPDATE pieces SET status = 'done' WHERE id = ?", PIECE))
    require_same_dtype(parse_study({**RAW, "dtype": "bfloat16"}), out)
    require_same_dtype(parse_study({**RAW, "dtype": "bfloat16"}), tmp_path / "no-study-yet")
