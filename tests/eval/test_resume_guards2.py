"""``eval --resume`` guards: a file ropekit did not write is refused and left byte for byte as it was; an explicit
option equal to what the file's default resolved to resumes."""

from __future__ import annotations

import json

import pytest

METRICS = ('{"loss": 5.61, "lr": 0.003, "step": 1, "tokens": 1024}\n'
           '{"loss": 5.42, "lr": 0.003, "step": 2, "tokens": 2048}\n')


def _ppl(run_cli, out, *extra):
    return run_cli("eval", "ppl", "tiny", "-l", "64", "--samples", "1", "-o", str(out), *extra)


@pytest.mark.parametrize("text", [METRICS, '{"a":1}\n', '{"a":1}', METRICS + '{"loss": 5.3, "st'])
def test_resume_refuses_a_jsonl_file_ropekit_did_not_write(run_cli, tmp_path, text):
    path = tmp_path / "metrics.jsonl"
    path.write_text(text)
    code, out, err = _ppl(run_cli, path, "--resume")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "not a ropekit results record" in err
    assert path.read_text() == text


def test_resume_of_a_ropekit_records_file_still_continues(run_cli, tmp_path):
    path = tmp_path / "r.jsonl"
    code, _, err = _ppl(run_cli, path)
    assert code == 0, err
    first = path.read_text()
    path.write_text(first + '{"add_bos": false, "bos')  # a crash cut the next record short
    code, _, err = run_cli("eval", "ppl", "tiny", "-l", "64", "--samples", "2", "-o", str(path), "--resume")
    assert code == 0, err
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and path.read_text().startswith(first) and all(json.loads(x)["task"] == "ppl" for x in lines)


def test_resume_with_the_default_stride_given_explicitly(run_cli, tmp_path):
    path = tmp_path / "r.jsonl"
    code, _, err = _ppl(run_cli, path)
    assert code == 0, err
    assert json.loads(path.read_text())["stride"] == 32
    before = path.read_bytes()
    code, _, err = _ppl(run_cli, path, "--stride", "32", "--resume")  # L/2: the default the file was made with
    assert code == 0, err
    assert path.read_bytes() == before  # its one sample was already there
    code, out, err = _ppl(run_cli, path, "--stride", "16", "--resume")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "stride=the default (L/2 = 32)" in err and "stride=16" in err and "None" not in err
    assert path.read_bytes() == before
    # the other way round: made with --stride 16, resumed with the default (32)
    other = tmp_path / "s.jsonl"
    code, _, err = _ppl(run_cli, other, "--stride", "16")
    assert code == 0, err
    before = other.read_bytes()
    code, out, err = _ppl(run_cli, other, "--resume")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "None" not in err and "stride=16" in err, err
    assert other.read_bytes() == before
