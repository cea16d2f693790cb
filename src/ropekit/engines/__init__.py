"""Running an exported model in the engines people serve with — vLLM, llama.cpp, plain transformers — and
checking that they compute what ropekit computes (``ropekit verify``).

Each engine runs in its own Python environment (their pins clash with ropekit's: ``scripts/engines.sh`` makes
them) through a standalone runner script (:mod:`.runners`); :mod:`.verify` compares its per-token
log-probabilities with ropekit's own model on a text longer than the original window.
"""

from .environments import ENGINES, Engine, engine_python, run_engine
from .verify import VerifyReport, verify

__all__ = ["ENGINES", "Engine", "VerifyReport", "engine_python", "run_engine", "verify"]
