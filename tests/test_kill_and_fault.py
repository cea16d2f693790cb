"""Kill-and-fault tests: every output ropekit writes is absent or complete and equal to an uninterrupted run's.

Each writer (``save_pretrained`` as ``extend`` calls it, the GGUF writer, the study report) runs in a forked
child and is SIGKILLed

* before each of its filesystem operations in turn — an audit hook (``sys.addaudithook``: ``open`` for
  writing, ``os.rename``, ``os.mkdir``, ``os.remove``, ``shutil.rmtree``, …) counts them in an uninterrupted
  run, then kills the child at operation 1, 2, …, N — and
* at random moments (seeded) over the uninterrupted run's duration, which also lands inside the single
  operations the hook cannot see into (safetensors' and gguf's own writes).

After every kill the target must be as it was before the write (absent, or the earlier report it replaces), or
hold exactly the files of the uninterrupted run with the same bytes (the report's timestamp fixed): never a
mix; the next write must succeed and leave no ``.part`` behind. Then the faults that are not kills: a file-size limit (RLIMIT_FSIZE) part-way, a FIFO as
target, and the command line's answers to them.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ropekit.install import extend, save_pretrained
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model
from ropekit.runtime import quiet_transformers
from ropekit.runtime.atomic import filesystem_error, umask_mode

_WRITES = {"os.rename", "os.mkdir", "os.remove", "os.rmdir", "os.chmod", "os.truncate", "os.link", "shutil.rmtree",
           "shutil.copyfile", "os.symlink"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _is_write(event: str, args) -> bool:
    if event in _WRITES:
        return True
    if event == "open" and len(args) >= 3:
        mode, flags = args[1], args[2]
        return bool((isinstance(mode, str) and set(mode) & set("wax+")) or (isinstance(flags, int) and flags & _WRITE_FLAGS))
    return False


def _in_child(write, kill_at: int | None = None, count_to: int | None = None) -> int:
    """Fork; the child runs ``write()`` (killing itself before write operation ``kill_at``, or writing the count
    of its operations to the file ``count_to``) and leaves with ``os._exit``. Returns the child's pid."""
    pid = os.fork()
    if pid:
        return pid
    try:
        seen = [0]

        def hook(event, args):
            if _is_write(event, args):
                seen[0] += 1
                if kill_at is not None and seen[0] == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)

        if kill_at is not None or count_to is not None:
            sys.addaudithook(hook)
        with quiet_transformers():
            write()
        if count_to is not None:
            fd = os.open(count_to, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.write(fd, str(seen[0] - 1).encode())  # less this open itself
            os.close(fd)
        os._exit(0)
    except BaseException:  # noqa: BLE001 - a child must never return into pytest
        import traceback

        traceback.print_exc()
        os._exit(3)


def _wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _snapshot(path: Path) -> dict[str, bytes] | None:
    if not os.path.lexists(path):
        return None
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _leftovers(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".part"))


def _kill_everywhere(write, target: Path, compare, tmp_path: Path, *, random_kills: int, seed: int = 0,
                     prepare=None, last_operations: int | None = None, rewrite_each: bool = True) -> dict:
    """The kill campaign of the module docstring; returns the counts (for the assertion messages).

    ``prepare()`` puts the target back before every write (default: removes it); whatever state it leaves is
    also accepted after a kill (an older report, say). ``last_operations``: kill only before the last N
    operations (where a write publishes its result). ``rewrite_each``: check after every kill that the next
    write succeeds and cleans up (else only after the last)."""
    prepare = prepare or (lambda: _remove(target))
    with quiet_transformers():
        write()  # in this process first: the lazy imports of the first write would dominate every child
    reference = compare(target)
    assert reference is not None
    prepare()
    before = compare(target)
    count_file = tmp_path / "count"
    started = time.perf_counter()
    assert _wait(_in_child(write, count_to=str(count_file))) == 0
    duration = time.perf_counter() - started
    operations = int(count_file.read_text())
    assert compare(target) == reference
    first = 1 if last_operations is None else max(1, operations - last_operations + 1)
    points = [("operation", k) for k in range(first, operations + 1)]
    rng = random.Random(seed)
    points += [("moment", rng.uniform(0.0, duration * 1.2)) for _ in range(random_kills)]
    outcomes = {"before": 0, "complete": 0}
    for kind, at in points:
        prepare()
        if kind == "operation":
            pid = _in_child(write, kill_at=at)
        else:
            pid = _in_child(write)
            time.sleep(at)
            os.kill(pid, signal.SIGKILL)
        _wait(pid)
        state = compare(target)
        assert state in (before, reference), f"killed at {kind} {at}: the target is half-written"
        outcomes["complete" if state == reference else "before"] += 1
        if not rewrite_each and (kind, at) != points[-1]:
            continue
        # the next run cleans up after the dead one and succeeds
        if state == reference:
            prepare()  # (the write refuses to replace a finished target unasked)
        assert _wait(_in_child(write)) == 0, f"after a kill at {kind} {at} the next write failed"
        assert compare(target) == reference
        assert _leftovers(target.parent) == [], f"after a kill at {kind} {at}: {_leftovers(target.parent)}"
    outcomes.update(operations=operations, killed_at_operations=operations - first + 1, moments=random_kills)
    return outcomes


def _remove(target: Path) -> None:
    if target.is_dir():
        shutil.rmtree(target)
    elif os.path.lexists(target):
        target.unlink()


@pytest.fixture
def extended_llama():
    torch.manual_seed(0)
    model = build_tiny_model("llama", num_layers=2).eval()
    extend(model, "yarn", factor=2.0)
    return model


def test_a_killed_extend_leaves_no_model_directory_or_the_whole_one(extended_llama, tmp_path):
    """``extend --out D`` killed anywhere: D absent or equal to an uninterrupted save — never config and tokenizer
    without weights, never weights under the base model's config (which plain transformers loads silently)."""
    target = tmp_path / "work" / "model"
    target.parent.mkdir()
    tokenizer = byte_tokenizer()
    counts = _kill_everywhere(lambda: save_pretrained(extended_llama, target, tokenizer=tokenizer), target,
                              _snapshot, tmp_path, random_kills=8)
    assert counts["operations"] >= 5 and counts["before"] >= 1, counts


def test_a_killed_gguf_export_leaves_no_file_or_the_whole_one(extended_llama, tmp_path):
    from ropekit.install.gguf_export import write_gguf

    target = tmp_path / "work" / "model-f16.gguf"
    target.parent.mkdir()
    tokenizer = byte_tokenizer()
    counts = _kill_everywhere(lambda: write_gguf(extended_llama, tokenizer, target, outtype="f16"), target,
                              _snapshot, tmp_path, random_kills=12)
    assert counts["operations"] >= 2, counts
    # the mode an ordinary open() gives, not mkstemp's 0600
    assert stat.S_IMODE(target.stat().st_mode) == umask_mode()


def _report_campaign(tmp_path, monkeypatch, **kill) -> dict:
    """A report of a study with one more method rewritten over the study's earlier report, killed as ``kill``
    says (:func:`_kill_everywhere`): afterwards the earlier report or the new one, each whole — never a mix."""
    from datetime import datetime, timezone

    from ropekit.study import report as report_module
    from ropekit.study import write_report
    from ropekit.study.store import StudyStore

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 1, 1, tzinfo=timezone.utc)

    monkeypatch.setattr(report_module, "datetime", Frozen)
    study = tmp_path / "study"
    study.mkdir()
    target = study / "report"

    def add(store, i, method):
        records = [{"task": "passkey", "method": method, "params": {}, "length": length, "depth": depth,
                    "trial": trial, "score": float((length + trial + i) % 3 != 0), "prediction": "42"}
                   for length in (64, 128, 256) for depth in (0.0, 0.5, 1.0) for trial in range(2)]
        store.begin_piece(f"eval:passkey:{method}", method=method)
        store.finish_piece(f"eval:passkey:{method}", records,
                           key_fields=("task", "method", "params", "length", "depth", "trial"))

    with StudyStore(study / "study.sqlite") as store:
        store.initialize("killed report", {}, seeds=[0], model="tiny-llama", window=128, target_length=256,
                         methods=["plain", "yarn"])
        add(store, 0, "plain")
    write_report(study)
    earlier = tmp_path / "earlier-report"
    shutil.copytree(target, earlier)
    with StudyStore(study / "study.sqlite") as store:
        add(store, 1, "yarn")

    def restore():
        _remove(target)
        shutil.copytree(earlier, target)

    def state(path: Path):
        files = _snapshot(path)
        if files is None:
            return None
        return sorted(files), json.loads(files["summary.json"]), files["index.html"]

    counts = _kill_everywhere(lambda: write_report(study), target, state, tmp_path, prepare=restore, **kill)
    return counts


def test_a_report_killed_while_it_replaces_the_old_one_leaves_one_of_them_whole(tmp_path, monkeypatch):
    """The last operations of a report rewrite (where the new report is published) and two random moments."""
    _report_campaign(tmp_path, monkeypatch, random_kills=1, last_operations=3, rewrite_each=False)


@pytest.mark.slow
def test_a_report_killed_anywhere_leaves_the_old_report_or_the_new_one(tmp_path, monkeypatch):
    """Every operation of a report rewrite and 8 random moments (~1 min on 2 cores)."""
    _report_campaign(tmp_path, monkeypatch, random_kills=8)


def test_a_file_size_limit_leaves_nothing_half_written(extended_llama, tmp_path):
    """RLIMIT_FSIZE (``ulimit -f``) below the weights: the write fails with EFBIG part-way; nothing is left."""
    target = tmp_path / "model"
    tokenizer = byte_tokenizer()

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
        try:
            save_pretrained(extended_llama, target, tokenizer=tokenizer)
        except Exception as err:  # safetensors reports EFBIG as its own error type
            os._exit(7 if filesystem_error(err) is not None else 8)

    assert _wait(_in_child(limited)) == 7
    assert os.listdir(tmp_path) == []


def _cli(*args: str, cwd: Path, limit_bytes: int | None = None, timeout: float = 240):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}

    def preexec():
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run([sys.executable, "-m", "ropekit", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=preexec)


def test_the_command_line_under_a_file_size_limit_and_with_a_fifo_target(run_cli, tmp_path, monkeypatch):
    """``ropekit extend`` under ``ulimit -f``: one line, exit 2, no directory; a FIFO as GGUF target with
    --overwrite: refused, the FIFO untouched."""
    monkeypatch.chdir(tmp_path)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        code, _, err = run_cli("extend", "tiny", "-m", "yarn", "-f", "2", "--out", "m")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert code == 2, err
    assert err.count("error:") == 1 and "file-size limit" in err and "internal error" not in err, err
    assert os.listdir(tmp_path) == []
    os.mkfifo(tmp_path / "pipe.gguf")
    code, _, err = run_cli("extend", "tiny", "-m", "yarn", "-f", "2", "--format", "gguf", "--out", "pipe.gguf",
                           "--overwrite")
    assert code == 2 and "is a FIFO" in err, err
    os.mkdir(tmp_path / "m")
    run_cli("extend", "tiny", "-m", "yarn", "-f", "2", "--out", "m/x")
    code, _, err = run_cli("export", "m/x", "--format", "gguf", "--out", "pipe.gguf", "--overwrite")
    assert code == 2 and "is a FIFO" in err, err
    assert stat.S_ISFIFO(os.lstat(tmp_path / "pipe.gguf").st_mode) and sorted(os.listdir(tmp_path)) == ["m", "pipe.gguf"]
    assert os.listdir(tmp_path / "m") == ["x"]


@pytest.mark.slow
def test_sigkill_of_the_extend_command_at_random_moments(tmp_path):
    """The real command, killed at 4 moments spread over the second half of its run (loading, extending, writing):
    ``--out`` is absent or equal to an uninterrupted run's; a rerun succeeds and leaves no ``.part``. Bounded: 9
    runs of the command (~1–3 min on 2 busy cores)."""
    started = time.perf_counter()
    assert _cli("extend", "tiny", "-m", "yarn", "-f", "2", "--out", "ref", cwd=tmp_path).returncode == 0
    duration = time.perf_counter() - started
    reference = _snapshot(tmp_path / "ref")
    rng = random.Random(1)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    for i in range(4):
        at = duration * (0.5 + 0.6 * i / 3) + rng.uniform(-0.1, 0.1)  # the write is at the end of the run
        proc = subprocess.Popen([sys.executable, "-m", "ropekit", "extend", "tiny", "-m", "yarn", "-f", "2", "--out", "m"],
                                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(max(0.0, at))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        state = _snapshot(tmp_path / "m")
        assert state is None or state == reference, f"kill {i} at {at:.2f} s: half-written"
        if state is not None:
            shutil.rmtree(tmp_path / "m")
        assert _cli("extend", "tiny", "-m", "yarn", "-f", "2", "--out", "m", cwd=tmp_path).returncode == 0
        assert _snapshot(tmp_path / "m") == reference and _leftovers(tmp_path) == []
        shutil.rmtree(tmp_path / "m")
