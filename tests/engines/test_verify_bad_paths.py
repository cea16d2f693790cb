"""``ropekit verify`` with a path that is not there or a ``--python`` that is not a Python: one line that says
which, exit 2. Before, a missing directory was "not a model directory (no config.json)", a non-executable file
"permission denied. check … the free space", and an executable text file an internal error (Exec format error)."""

from __future__ import annotations

import ropekit
from ropekit.models.tiny import build_tiny_model


def _line(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "internal error" not in err, err
    return lines[0]


def test_a_missing_directory_is_said_to_be_missing(run_cli, tmp_path):
    code, out, err = run_cli("verify", str(tmp_path / "nope"), "--engine", "transformers")
    assert f"'{tmp_path / 'nope'}' does not exist" in _line(code, err) and out == ""


def test_a_python_that_is_not_one_is_named(run_cli, tmp_path, monkeypatch):
    model = build_tiny_model("llama")
    ropekit.extend(model, "yarn", factor=2.0)
    ropekit.save_pretrained(model, tmp_path / "m")
    text = tmp_path / "notes.txt"
    text.write_text("not a program\n")
    assert "is not an executable file" in _line(*run_cli("verify", str(tmp_path / "m"), "-e", "transformers",
                                                           "--python", str(text))[::2])
    text.chmod(0o755)
    monkeypatch.chdir(tmp_path)  # a bare file name here is this file, not a program looked up on PATH
    line = _line(*run_cli("verify", "m", "-e", "transformers", "--python", "notes.txt")[::2])
    assert f"cannot run '{text}'" in line and "--python" in line
