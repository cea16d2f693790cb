"""Running an exported model in the engines people serve with — vLLM, llama.cpp, plain transformers — and
checking that they compute what ropekit computes (``ropekit verify``).

Each engine runs in its own Python environment (their pins clash with ropekit's: ``ropekit engines install`` makes
them) through a standalone runner script (:mod:`.runners`); :mod:`.verify` compares its per-token
log-probabilities with ropekit's own model on a text longer than the original window.
"""

from .environments import ENGINES, Engine, engine_python, run_engine

__all__ = ["ENGINES", "Engine", "VerifyReport", "engine_python", "run_engine", "verify"]


def __getattr__(name: str):
    # verify imports torch and transformers: loaded on first use, so that a missing engine is refused at once
    if name in ("VerifyReport", "verify"):
        import importlib

        module = importlib.import_module(f"{__name__}.verify")  # sets this package's `verify` to the module …
        globals().update(VerifyReport=module.VerifyReport, verify=module.verify)  # … which the function replaces
        return globals()[name]
    raise AttributeError(f"module 'ropekit.engines' has no attribute {name!r}")
