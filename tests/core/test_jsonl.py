"""ropekit.core.jsonl: the one reader of users' JSON Lines files."""

from __future__ import annotations

import pytest

from ropekit.core.jsonl import jsonl_rows
from ropekit.errors import RopekitError


def test_rows_are_numbered_by_file_line_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"text": "one"}\n\n   \n["two"]\n"\xc3\xa9"\n')
    assert list(jsonl_rows(path, "fix")) == [(1, {"text": "one"}), (4, ["two"]), (5, "é")]


@pytest.mark.parametrize("line, said", [(b"{oops", "line 2 is not JSON (Expecting property name"),
                                        (b'"\xff\xfe"', "line 2 is not UTF-8 text")])
def test_a_bad_line_is_one_error_naming_file_line_and_the_fix(tmp_path, line, said):
    path = tmp_path / "b.jsonl"
    path.write_bytes(b'{"text": "fine"}\n' + line + b"\n")
    rows = jsonl_rows(path, "write one JSON object per line")
    assert next(rows) == (1, {"text": "fine"})
    with pytest.raises(RopekitError) as info:
        next(rows)
    assert said in str(info.value) and str(path) in str(info.value)
    assert "write one JSON object per line" in str(info.value) + str(getattr(info.value, "fix", ""))
