"""Keeping third-party output out of ropekit's own display."""

from __future__ import annotations

import contextlib
import logging


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


def silence_transformers_when_loaded() -> None:
    """:func:`silence_transformers` without importing transformers (about 2 s): at once when it is loaded already,
    else through the settings it reads when it loads (``TRANSFORMERS_VERBOSITY``, ``HF_HUB_DISABLE_PROGRESS_BARS``;
    a value the user set is kept). A command that never loads transformers then never pays for it."""
    import os
    import sys

    if "transformers" in sys.modules:
        silence_transformers()
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if "huggingface_hub" in sys.modules:  # it read its settings already
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    else:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


class _DeepSpeedImportToStderr:
    """A meta-path finder that lets ``import deepspeed`` run with stdout pointed at stderr (and then leaves).

    DeepSpeed's logger writes to the ``sys.stdout`` of the moment it is created, at import, and importing it
    already logs which accelerator it found. Accelerate imports it whenever it is installed (``unwrap_model``
    does, on one CPU process too), which would put that line into ``--json`` output; rebinding the logger at
    import keeps stdout for ropekit's results without importing DeepSpeed where nothing needs it.
    """

    _searching = False

    def find_spec(self, name, path=None, target=None):
        if name != "deepspeed" or self._searching:
            return None
        import importlib.machinery
        import sys

        # ask the other finders (availability probes call this too: stay in place until the real import)
        self._searching = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
        finally:
            self._searching = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        finder = self

        def exec_with_stdout_on_stderr(module):
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            # its import announces "Setting accelerator to CPU…" on every machine without CUDA, a second line under
            # each of ropekit's one-line messages; the logger object is the one DeepSpeed configures by name
            logging.getLogger("DeepSpeed").addFilter(_drop_cpu_accelerator_notice)
            with contextlib.redirect_stdout(sys.__stderr__ or sys.stderr):
                exec_module(module)

        spec.loader.exec_module = exec_with_stdout_on_stderr  # this spec's loader only
        return spec


def _drop_cpu_accelerator_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Setting accelerator to CPU")


def route_deepspeed_logs_to_stderr() -> None:
    """Make a later ``import deepspeed`` (by accelerate, transformers or us) log to stderr, not stdout."""
    import sys

    if "deepspeed" in sys.modules or any(isinstance(f, _DeepSpeedImportToStderr) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _DeepSpeedImportToStderr())
