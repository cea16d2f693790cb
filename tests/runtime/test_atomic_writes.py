"""``ropekit.runtime.atomic``: a target appears whole or not at all, what dead writers left is cleaned up, and a
target ropekit cannot write whole is refused in one line before any work."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from ropekit.errors import RopekitError
from ropekit.runtime import atomic
from ropekit.runtime.atomic import atomic_dir, atomic_file, check_figure_target, check_target, clean_leftovers


def _dead_pid() -> int:
    """The pid of a process that has ended (a leftover's owner)."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(proc.stdout)


def test_a_file_appears_only_when_the_block_ends_and_with_the_umask_mode(tmp_path):
    target = tmp_path / "model.gguf"
    old = os.umask(0o027)
    try:
        with atomic_file(target) as tmp:
            tmp.write_bytes(b"abc")
            os.chmod(tmp, 0o600)  # what mkstemp and some writers leave
            assert not target.exists()
    finally:
        os.umask(old)
    assert target.read_bytes() == b"abc"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["model.gguf"]


def test_a_failing_block_leaves_nothing_and_keeps_the_old_target(tmp_path):
    target = tmp_path / "out.gguf"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_file(target, overwrite=True) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.gguf"]
    with pytest.raises(KeyboardInterrupt), atomic_dir(tmp_path / "d") as building:
        (building / "config.json").write_text("{}")
        raise KeyboardInterrupt
    assert sorted(os.listdir(tmp_path)) == ["out.gguf"]


def test_a_directory_is_renamed_in_whole_and_replaces_only_when_asked(tmp_path):
    target = tmp_path / "model"
    with atomic_dir(target) as building:
        (building / "a").write_text("1")
        assert not target.exists()
    assert sorted(os.listdir(target)) == ["a"]
    with pytest.raises(RopekitError, match="exists and is not empty"), atomic_dir(target):
        pass
    with atomic_dir(target, replace=True) as building:
        (building / "b").write_text("2")
    assert sorted(os.listdir(target)) == ["b"] and sorted(os.listdir(tmp_path)) == ["model"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with atomic_dir(empty) as building:
        (building / "c").write_text("3")
    assert os.listdir(empty) == ["c"]


def test_leftovers_of_dead_writers_are_removed_and_a_moved_aside_target_is_restored(tmp_path):
    dead = _dead_pid()
    target = tmp_path / "model"
    (tmp_path / f".model.{dead}-aaaaaaaaaaaa.part").mkdir()
    (tmp_path / f".model.{dead}-aaaaaaaaaaaa.part" / "weights").write_text("half")
    (tmp_path / f".model.gguf.{dead}-bbbbbbbbbbbb.part").write_text("another target's")
    live = tmp_path / f".model.{os.getppid()}-cccccccccccc.part"  # a writer still running: left alone
    live.mkdir()
    old = tmp_path / f".model.{dead}-dddddddddddd.old.part"  # killed between moving the old target aside and renaming
    old.mkdir()
    (old / "config.json").write_text("{}")
    clean_leftovers(target)
    assert sorted(os.listdir(tmp_path)) == sorted(["model", f".model.gguf.{dead}-bbbbbbbbbbbb.part", live.name])
    assert os.listdir(target) == ["config.json"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_fifos_files_on_the_path_and_long_names_are_refused_before_any_work(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(RopekitError, match="is a FIFO"):
        check_target(fifo)
    with pytest.raises(RopekitError, match="is a FIFO"), atomic_file(fifo, overwrite=True):
        pytest.fail("the block must not run")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RopekitError, match="which is a file, not a directory"):
        check_target(tmp_path / "file" / "sub" / "out")
    with pytest.raises(RopekitError, match="longer than this filesystem"):
        check_target(tmp_path / ("x" * 300))
    with pytest.raises(RopekitError, match="exists and is a file"):
        check_target(tmp_path / "file", kind="dir")
    # a name the filesystem takes but that leaves no room for the temporary suffix still works (hashed prefix)
    long_ok = tmp_path / ("y" * 250)
    with atomic_file(long_ok) as tmp:
        tmp.write_text("ok")
    assert long_ok.read_text() == "ok"


def test_a_figure_target_must_be_a_writable_png_file_and_nothing_is_touched(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    with pytest.raises(RopekitError, match=r"--plot '.*notes.txt' is not a .png path"):
        check_figure_target(notes)
    assert notes.read_text() == "keep me"
    (tmp_path / "figs.png").mkdir()
    with pytest.raises(RopekitError, match="is a directory"):
        check_figure_target(tmp_path / "figs.png")
    with pytest.raises(RopekitError, match="plot path .* which is a file"):
        check_figure_target(notes / "fig.PNG", what="plot path")
    assert check_figure_target(tmp_path / "new" / "fig.PNG") == tmp_path / "new" / "fig.PNG"
    assert not (tmp_path / "new").exists()  # a check, not a write
    # a .png name holding something else is kept; an earlier figure (a real PNG, written by matplotlib) is replaced
    text = tmp_path / "exist.png"
    text.write_text("not a png")
    with pytest.raises(RopekitError, match="exists and is not a PNG image"):
        check_figure_target(text)
    assert text.read_text() == "not a png"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(1, 1))
    fig.savefig(tmp_path / "earlier.png")
    plt.close(fig)
    assert check_figure_target(tmp_path / "earlier.png") == tmp_path / "earlier.png"


def test_a_read_only_filesystem_is_refused(tmp_path, monkeypatch):
    real = os.statvfs

    class ReadOnly:
        def __init__(self, result):
            self.result = result

        def __getattr__(self, name):
            return getattr(self.result, name)

        @property
        def f_flag(self):
            return self.result.f_flag | os.ST_RDONLY

    monkeypatch.setattr(atomic.os, "statvfs", lambda path: ReadOnly(real(path)))
    with pytest.raises(RopekitError, match="read-only filesystem"):
        check_target(tmp_path / "out")
    assert os.listdir(tmp_path) == []
