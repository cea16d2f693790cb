"""DeepSpeed logs to the stdout of the moment it is imported (accelerate imports it whenever it is installed):
ropekit's commands keep stdout for their results (--json), so the import is routed to stderr."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")

PROBE = """
import importlib.util, sys
from ropekit.runtime import route_deepspeed_logs_to_stderr
route_deepspeed_logs_to_stderr()
assert importlib.util.find_spec("deepspeed") is not None   # an availability probe first, as libraries do
from accelerate.utils.other import extract_model_from_parallel   # accelerate's own import path
import torch
extract_model_from_parallel(torch.nn.Linear(2, 2))
assert "deepspeed" in sys.modules
import logging
print(__import__("json").dumps({"handlers": [getattr(h.stream, "name", "?") for h in logging.getLogger("DeepSpeed").handlers]}))
"""


def test_importing_deepspeed_after_routing_leaves_stdout_to_the_caller():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"handlers": ["<stderr>"]}  # nothing else on stdout, and it logs to stderr
