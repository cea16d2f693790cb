"""A `ropekit study --backend ray` driver killed with SIGKILL at a chosen moment, for the Ray resume tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml


def study_command(config: dict, tmp_path: Path, out: Path) -> list[str]:
    """The CLI command that runs ``config`` (written to ``tmp_path``) into ``out`` on the Ray backend."""
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    return [sys.executable, "-m", "ropekit.cli", "study", str(path), "--out", str(out), "--no-report",
            "--backend", "ray"]


def kill_driver_when(cmd: list[str], ready: Callable[[], bool], timeout: float) -> bool:
    """Start ``cmd`` in its own session, poll ``ready()`` until it holds, then SIGKILL the whole group (the driver
    and the local Ray cluster it started). Returns whether the driver was still running when it was killed (False:
    it ended, or ``timeout`` seconds passed, before ``ready()`` held)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    held = False
    while proc.poll() is None and time.monotonic() < deadline:
        if ready():
            held = True
            break
        time.sleep(0.05)
    alive = proc.poll() is None
    if alive:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return alive and held
