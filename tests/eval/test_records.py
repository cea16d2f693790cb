"""Results files and --lengths: bad input is one line and leaves the user's files as they were."""

from __future__ import annotations

import json

import pytest

from ropekit.errors import RopekitError
from ropekit.eval.records import RecordWriter, parse_lengths


def test_lengths_accept_k_and_refuse_what_is_not_a_token_count():
    assert parse_lengths("4k, 8k,12000") == [4096, 8192, 12000]
    for bad, said in (("nan", "positive whole number"), ("inf", "positive whole number"),
                      ("1e400", "positive whole number"), ("-1k", "positive whole number"), ("4q", "not a length"),
                      ("1e9", "past 16,777,216 tokens"), ("16385k", "past 16,777,216 tokens")):
        with pytest.raises(RopekitError, match=said) as err:
            parse_lengths(bad)
        assert "\n" not in str(err.value)
    assert parse_lengths("16384k") == [1 << 24]  # 2^24 itself: float32 still tells its positions apart


def _key_fields():
    return ("task", "sample")


def test_resume_of_a_file_that_is_not_results_changes_nothing(tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("a\nb")  # not JSON, and no newline at the end: a crash's cut-off line looks like this
    with pytest.raises(RopekitError, match="line 1 is not JSON"):
        RecordWriter(notes, resume=True, key_fields=_key_fields())
    assert notes.read_text() == "a\nb"
    binary = tmp_path / "db.jsonl"
    binary.write_bytes(b"SQLite format 3\x00\xf8\xff")
    with pytest.raises(RopekitError, match="not a JSON-lines results file"):
        RecordWriter(binary, resume=True, key_fields=_key_fields())
    listed = tmp_path / "list.jsonl"
    listed.write_text("[1, 2]\n")
    with pytest.raises(RopekitError, match="line 1 is not a results record"):
        RecordWriter(listed, resume=True, key_fields=_key_fields())
    with pytest.raises(RopekitError, match="is a directory"):
        RecordWriter(tmp_path, resume=False, key_fields=_key_fields())


def test_resume_drops_only_the_line_a_crash_cut_short(tmp_path):
    path = tmp_path / "r.jsonl"
    first = {"task": "ppl", "sample": 0, "score": 1.0}
    path.write_text(json.dumps(first) + "\n" + '{"task": "ppl", "sam')
    writer = RecordWriter(path, resume=True, key_fields=_key_fields())
    assert list(writer.records()) == [first]
    assert path.read_text() == json.dumps(first) + "\n"


def test_resume_after_a_record_whose_newline_was_not_written(tmp_path):
    """A crash between a record and its newline left a whole JSON line without "\\n": the resume kept it as it was and
    appended the next record onto the same line, and the resume after that read a line that is not JSON."""
    path = tmp_path / "r.jsonl"
    first = {"task": "ppl", "sample": 0}
    path.write_text(json.dumps(first))
    writer = RecordWriter(path, resume=True, key_fields=_key_fields())
    assert list(writer.records()) == [first]
    assert path.read_text() == json.dumps(first)  # opening it changes nothing (a refused resume leaves it so)
    second = {"task": "ppl", "sample": 1}
    writer.write(second)
    writer.write({"task": "ppl", "sample": 2})
    lines = path.read_text().split("\n")
    assert lines[-1] == "" and [json.loads(line) for line in lines[:-1]] == [first, second, {"task": "ppl", "sample": 2}]
    again = RecordWriter(path, resume=True, key_fields=_key_fields())
    assert [r["sample"] for r in again.records()] == [0, 1, 2]
