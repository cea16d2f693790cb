"""Keeping third-party output out of ropekit's own display."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def quiet_transformers():
    """No transformers progress bars ("Loading weights", "Writing model shards") for the duration: ropekit
    shows its own progress, and two bars fighting over one terminal garble both."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def silence_transformers() -> None:
    """For a whole command: no transformers progress bars and only its errors (the CLI's output is ropekit's)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
