"""The lean core: the wheel installed alone into a fresh virtual environment — torch, transformers, safetensors,
tokenizers, gguf and the CLI libraries, none of the extras' packages — runs ``ropekit extend`` and ``ropekit
export``, and a command of an extra says which extra in one line.

In the default suite, as a user gets it: the wheel is built from this checkout and pip resolves its dependencies
(torch pinned to the build this interpreter runs, so pip takes the same one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Packages only the extras bring (pyproject.toml): the core must run without every one of them.
EXTRA_ONLY = ("accelerate", "peft", "datasets", "scipy", "matplotlib", "jieba", "rouge", "rapidfuzz", "lm_eval", "ray",
              "deepspeed", "tensorboard", "platformdirs")


def _run(args, **kwargs) -> subprocess.CompletedProcess:
    # the fresh environment alone: no PYTHONPATH leading back to this checkout's sources. pip installs without
    # byte-compiling (torch's thousands of modules were most of the install); the first command then writes the
    # bytecode of what it imports, unless PYTHONDONTWRITEBYTECODE stops it, which would make every command
    # compile torch again
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=840, check=False, env=env,
                          **kwargs)


@pytest.mark.timeout(900)
def test_the_core_wheel_alone_extends_and_exports(tmp_path):
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path / "dist", ROOT])
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("ropekit-*.whl"))
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", venv]).returncode == 0
    python, ropekit = venv / "bin" / "python", venv / "bin" / "ropekit"
    installed = _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile", f"torch=={version('torch')}", wheel])
    assert installed.returncode == 0, installed.stderr[-2000:]
    probe = _run([python, "-c", "import importlib.util as u, json, sys; "
                  f"print(json.dumps([m for m in {list(EXTRA_ONLY)!r} if u.find_spec(m)]))"])
    assert json.loads(probe.stdout) == [], probe.stdout  # a lean install: none of the extras' packages

    env_out = tmp_path / "m"
    extended = _run([ropekit, "extend", "tiny", "--method", "yarn", "--factor", "2", "--out", env_out, "--json"], cwd=tmp_path)
    assert extended.returncode == 0, extended.stderr[-2000:]
    assert json.loads(extended.stdout)["rope_parameters"]["rope_type"] == "yarn"
    exported = _run([ropekit, "export", env_out, "--format", "gguf", "--json"], cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert Path(json.loads(exported.stdout)["path"]).stat().st_size > 0

    # a command of an extra: one line naming it, exit 2
    study = _run([ropekit, "study", "--preset", "quick", "--out", tmp_path / "study"], cwd=tmp_path)
    lines = [line for line in study.stderr.splitlines() if line.strip()]
    assert study.returncode == 2 and len(lines) == 1 and "pip install 'ropekit[study]'" in lines[0], study.stderr
