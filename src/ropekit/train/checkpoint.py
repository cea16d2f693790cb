"""Atomic training checkpoints under ``DIR/checkpoints/step-N``.

A checkpoint holds everything an uninterrupted run would still have in memory after step ``N``:

* ``model.safetensors`` (or FSDP shards), ``optimizer.bin``, ``random_states_<rank>.pkl`` (Python, NumPy,
  torch CPU/CUDA generators of every process) — written by ``accelerate.Accelerator.save_state``, which
  knows how to save sharded models and optimizers;
* ``ema.pt`` (``ema-rank<r>.pt`` when sharded), the weight average (:mod:`ropekit.train.ema`);
* ``trainer_state.json``: the global step, the stage and the step inside it, the learning-rate schedule's
  position, the data position (samples consumed: the data order is a pure function of the step, see
  :mod:`ropekit.train.data`), the loss guard's history and counters, tokens seen, and the resolved config.

Atomicity: everything is written into ``checkpoints/.tmp-step-N``, every file is fsynced, and the
directory is renamed to ``step-N`` only then (``trainer_state.json`` last of all). A kill at any moment
leaves either a complete checkpoint or a ``.tmp-*`` directory that is ignored and cleaned up later.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

from ..errors import RopekitError
from ..runtime.atomic import exchange

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoints_root(out_dir: Path) -> Path:
    return Path(out_dir) / CHECKPOINTS


def list_checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints ``[(step, path)]``, oldest first."""
    root = checkpoints_root(out_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and (child / STATE_FILE).is_file():
            found.append((int(m.group(1)), child))
    return sorted(found)


def finish_interrupted_saves(out_dir: Path) -> None:
    """Publish a checkpoint whose save was killed after it was complete (its state file, written last, is
    there) but before its rename: :func:`save` prunes before publishing, so this is the newest one."""
    root = checkpoints_root(out_dir)
    if not root.is_dir():
        return
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name.removeprefix(".tmp-")) if child.name.startswith(".tmp-") else None
        if m and (child / STATE_FILE).is_file() and not (root / m.group(0)).exists():
            with contextlib.suppress(OSError):  # another rank of the same run got there first
                os.replace(child, root / m.group(0))


def latest(out_dir: Path) -> tuple[int, Path] | None:
    finish_interrupted_saves(out_dir)
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def _damaged(path: Path, err: BaseException) -> RopekitError:
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return RopekitError(f"checkpoint {path} cannot be read back ({first})",
                        f"if its files are damaged, move {path} away to resume from the checkpoint before it, or "
                        "train without --resume into a new output.dir")


def read_state(path: Path) -> dict[str, Any]:
    """The trainer state a checkpoint saved; a damaged state file is one line naming the checkpoint."""
    try:
        state = json.loads((Path(path) / STATE_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _damaged(path, err) from None
    if not isinstance(state, dict):
        raise _damaged(path, ValueError(f"{STATE_FILE} holds no trainer state"))
    return state


def _fsync_tree(directory: Path) -> None:
    for root, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(directory)


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not possible on some platforms (Windows); the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def replace_dir(tmp: Path, final: Path) -> None:
    """Rename the finished ``tmp`` directory to ``final``, replacing an older ``final`` (moved aside first)."""
    if final.exists() and exchange(tmp, final):  # one step: never a moment without ``final``
        shutil.rmtree(tmp, ignore_errors=True)
        fsync_dir(final.parent)
        return
    if final.exists():
        trash = final.parent / f".old-{final.name}"
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, final)
    fsync_dir(final.parent)


def save(accelerator, out_dir: Path, step: int, state: dict[str, Any], ema=None, keep_last: int | None = None) -> Path:
    """Write checkpoint ``step`` atomically (collective: every process must call it)."""
    root = checkpoints_root(out_dir)
    tmp = root / f".tmp-step-{step}"
    final = root / f"step-{step}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    if ema is not None:
        ema.save(tmp, accelerator.process_index, accelerator.is_main_process)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _fsync_tree(tmp)
        write_json_atomic(tmp / STATE_FILE, state)
        fsync_dir(tmp)
        # make room first: a kill between publishing and pruning would leave keep_last + 1 checkpoints
        prune(out_dir, None if keep_last is None else keep_last - 1, keep=final)
        replace_dir(tmp, final)
    accelerator.wait_for_everyone()
    return final


def prune(out_dir: Path, keep_last: int | None, keep: Path | None = None) -> None:
    """Delete all but the newest ``keep_last`` checkpoints (besides ``keep``, the one about to be replaced), and
    leftovers of interrupted writes other than ``keep``'s own temporary directory."""
    root = checkpoints_root(out_dir)
    if not root.is_dir():
        return
    building = None if keep is None else f".tmp-{keep.name}"
    for child in root.iterdir():
        if child.name.startswith((".tmp-", ".old-")) and child.name != building:
            shutil.rmtree(child, ignore_errors=True)
    if keep_last is None:
        return
    found = [(step, path) for step, path in list_checkpoints(out_dir) if path != keep]
    for _, path in found[: max(0, len(found) - keep_last)]:
        shutil.rmtree(path, ignore_errors=True)


def load(accelerator, path: Path, ema=None) -> dict[str, Any]:
    """Restore model, optimizer, RNG states (and the EMA) from checkpoint ``path``; return its trainer state. A
    damaged file (torch cannot read it back) is one line naming the checkpoint."""
    from safetensors import SafetensorError

    try:
        accelerator.load_state(str(path))
        if ema is not None:
            ema.load(path, accelerator.process_index)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError, SafetensorError) as err:
        raise _damaged(path, err) from err
    return read_state(path)


#: Entries a resumed run may change: where it writes, where a curriculum cut short by ``--max-steps`` stops
#: (``stop_at`` ends the run early without changing its schedule, so the run may go on to another stop), and the loss
#: guard's limits (a resume replays the run exactly, so one the guard aborted only goes on past the abort with another
#: ``max_skipped`` or spike test; the steps before the checkpoint are unchanged).
_MAY_CHANGE = ("output", "stop_at", "train.guard")


def config_diff(saved, current, prefix: str = "") -> str | None:
    """The first setting whose value differs between a run's saved config and the current one (those of
    :data:`_MAY_CHANGE` may change on resume), or ``None``."""
    if isinstance(saved, dict) and isinstance(current, dict):
        order = ("model", "method", "data", "train", "stages")
        keys = sorted(set(saved) | set(current), key=lambda k: (order.index(k) if k in order else len(order), k))
        for key in keys:
            if (f"{prefix}.{key}" if prefix else key) in _MAY_CHANGE:
                continue
            found = config_diff(saved.get(key), current.get(key), f"{prefix}.{key}" if prefix else key)
            if found:
                return found
        return None
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        for i, (a, b) in enumerate(zip(saved, current)):
            found = config_diff(a, b, f"{prefix}[{i}]")
            if found:
                return found
        return None
    return None if saved == current else f"{prefix} ({saved!r} in the run, {current!r} now)"


def _rotary_modules(model) -> list:
    from ..install import rotary_modules

    return [rotary for _, _, rotary in rotary_modules(model)]


def rotary_longest(model) -> list[int | None]:
    """Per rotary module of ``model`` (the base model), the longest input its frequencies were last grown to,
    or None.

    Dynamic NTK's schedule (transformers' ``max_seq_len_cached``, ropekit's ``continuous`` LengthSchedule)
    remembers the longest input since the last reset: a resumed run must start from the same frequencies
    as the uninterrupted one, not from the original window.
    """
    from ..install.installer import LengthSchedule

    found = []
    for rotary in _rotary_modules(model):
        longest = None
        original = getattr(rotary, "original_max_seq_len", None)
        cached = getattr(rotary, "max_seq_len_cached", None)
        if cached is not None and original is not None and int(cached) > int(original):
            longest = int(cached)
        for hook in rotary._forward_pre_hooks.values():
            if isinstance(hook, LengthSchedule) and hook.kind == "continuous" and hook.longest > hook.length:
                longest = max(longest or 0, int(hook.longest))
        found.append(longest)
    return found


def restore_rotary(model, longest: list[int | None], dtype, device) -> None:
    """Grow each rotary module's frequencies to ``longest`` as the uninterrupted run had (a forward whose
    longest position is ``longest − 1`` takes the schedule's own growth path)."""
    import torch

    rotaries = _rotary_modules(model)
    if len(longest) != len(rotaries):
        return
    for rotary, length in zip(rotaries, longest):
        if length:
            with torch.no_grad():
                rotary(torch.zeros(1, 1, 1, dtype=dtype, device=device),
                       torch.full((1, 1), length - 1, dtype=torch.long, device=device))
