"""Where each engine's Python lives, and running one of the runner scripts under it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RopekitError

RUNNERS = Path(__file__).resolve().parent / "runners"
#: The repository checkout (an editable install): scripts/engines.sh puts the engines under .engines there.
_CHECKOUT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Engine:
    """An engine: its runner script, the model form it reads (a transformers directory or a GGUF file), and the
    virtual environment ``scripts/engines.sh`` makes for it (``None``: ropekit's own Python, without ropekit)."""

    name: str
    title: str
    runner: str
    reads: str  # "directory" | "gguf"
    venv: str | None


ENGINES = {
    "vllm": Engine("vllm", "vLLM", "vllm_logprobs.py", "directory", "vllm"),
    "llamacpp": Engine("llamacpp", "llama.cpp", "llamacpp_logprobs.py", "gguf", "llamacpp"),
    "transformers": Engine("transformers", "transformers", "transformers_logprobs.py", "directory", None),
}


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise RopekitError(f"unknown engine '{name}'", f"choose one of {', '.join(ENGINES)}")
    return ENGINES[name]


def engines_root() -> Path:
    """``$ROPEKIT_ENGINES``, else ``.engines`` in the checkout ropekit runs from (scripts/engines.sh's default)."""
    env = os.environ.get("ROPEKIT_ENGINES")
    return Path(env).expanduser() if env else _CHECKOUT / ".engines"


def engine_python(engine: Engine, python: str | os.PathLike | None = None) -> Path:
    """The Python that runs ``engine``: ``python`` when given, else the one ``scripts/engines.sh`` made; a missing
    one is a one-line error saying how to get it."""
    if python is not None:
        path = Path(python).expanduser()
        if not path.is_file():
            raise RopekitError(f"--python '{path}' does not exist", f"pass the python of an environment with {engine.title}")
        return path
    if engine.venv is None:
        return Path(sys.executable)
    path = engines_root() / engine.venv / "bin" / "python"
    if not path.is_file():
        raise RopekitError(f"{engine.title} is not installed for ropekit (no {path})",
                           f"run `bash scripts/engines.sh {engine.venv}`, or pass --python with an environment that has it")
    return path


def _end_group(proc: subprocess.Popen) -> None:
    """Kill what is left of the runner's process group (worker processes an engine did not take down)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_engine(engine: Engine, request: dict[str, Any], *, python: str | os.PathLike | None = None,
               timeout: float = 1800.0) -> dict[str, Any]:
    """Run ``engine``'s runner on ``request`` under its own Python; returns the runner's response. A failure is one
    line with the engine's last error line (its full output is kept in a log file the line names)."""
    interpreter = engine_python(engine, python)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
           "OMP_NUM_THREADS": str(request.get("threads", 1))}
    env.pop("PYTHONPATH", None)  # the engine's environment, not ropekit's
    with tempfile.TemporaryDirectory(prefix="ropekit-engine-") as tmp:
        request_path, response_path = Path(tmp) / "request.json", Path(tmp) / "response.json"
        request_path.write_text(json.dumps(request))
        log = Path(tempfile.gettempdir()) / f"ropekit-{engine.name}.log"
        with open(log, "w") as out:
            # its own process group: an engine's worker processes (vLLM's) go with it, however the runner ends
            proc = subprocess.Popen([str(interpreter), str(RUNNERS / engine.runner), str(request_path), str(response_path)],
                                    stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp, start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise RopekitError(f"{engine.title} did not finish within {timeout:.0f} s (log: {log})",
                                   "use a shorter text (--length) or a longer timeout") from None
            finally:
                _end_group(proc)
        if not response_path.is_file():  # runners write the response last, in one rename: present means done
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            last = next((line for line in reversed(lines) if "Error" in line or "error" in line), lines[-1] if lines else "")
            raise RopekitError(f"{engine.title} failed: {last.strip()[:300]} (log: {log})",
                               "check that the engine supports this model (see the log)")
        return json.loads(response_path.read_text())
