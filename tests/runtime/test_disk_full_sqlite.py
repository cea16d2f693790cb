"""A full disk under a study's SQLite store is the user's "no space left on the device" line (exit 2), as a full disk
under a training's files is: SQLite says "database or disk is full" (SQLITE_FULL) and gives no errno."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap

import pytest
import yaml

from ropekit.runtime.atomic import filesystem_error
from ropekit.study.pieces import piece_error

NO_SPACE = "cannot write: no space left on the device"
STUDY = {"name": "full-disk", "model": "tiny", "seed": 0, "target_length": 256, "device": "cpu", "dtype": "float32",
         "variants": [{"label": "pi", "method": "pi", "params": {"factor": 4}}],
         "evals": {"ppl": {"lengths": [64], "samples": 1, "score_mode": "truncate"}}}


def _real_sqlite_full(tmp_path) -> sqlite3.OperationalError:
    """What a store's write transaction raises on a full disk, made by SQLite itself: a database allowed no more
    pages (``max_page_count``) refuses a row that needs one with SQLITE_FULL and rolls the transaction back, so the
    store's ``ROLLBACK`` then fails with "no transaction is active" (the full disk is that error's context)."""
    with contextlib.closing(sqlite3.connect(tmp_path / "full.sqlite", isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("CREATE TABLE samples (record TEXT)")
        db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
        db.execute("BEGIN IMMEDIATE")
        try:
            try:
                db.execute("INSERT INTO samples VALUES (?)", ("x" * 100_000,))
            except sqlite3.OperationalError as full:
                assert str(full) == "database or disk is full"
                db.execute("ROLLBACK")
        except sqlite3.OperationalError as masked:
            return masked
    raise AssertionError("SQLite did not report the full database")


def test_sqlite_full_is_the_no_space_line():
    user = filesystem_error(sqlite3.OperationalError("database or disk is full"))
    assert user is not None and user.exit_code == 2
    assert user.one_line().startswith(NO_SPACE) and "\n" not in user.one_line()


def test_sqlite_full_behind_a_failed_rollback_is_the_no_space_line_and_other_errors_are_not(tmp_path):
    masked = _real_sqlite_full(tmp_path)
    assert "no transaction is active" in str(masked)
    assert filesystem_error(masked).one_line().startswith(NO_SPACE)
    # SQLite's other errors are ropekit's to explain (or bugs), and so is another exception raised after a full disk
    assert filesystem_error(sqlite3.OperationalError("database is locked")) is None
    assert filesystem_error(sqlite3.OperationalError("no such table: samples")) is None
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError:
            raise KeyError("a bug in a handler")  # noqa: B904 - the implicit context is what is tested
    except KeyError as bug:
        assert filesystem_error(bug) is None


def test_a_piece_that_filled_the_disk_records_the_no_space_line(tmp_path):
    recorded = piece_error(_real_sqlite_full(tmp_path))
    assert isinstance(recorded, str) and recorded.startswith(NO_SPACE) and "free space" in recorded


def test_the_cli_says_no_space_in_one_line_and_exits_2(run_cli, tmp_path, monkeypatch):
    """A full disk while the study's store writes (here the whole run, failing as SQLite fails) is one line, exit 2,
    not an internal error."""
    from ropekit.study import runner

    def full(*args, **kwargs):
        raise _real_sqlite_full(tmp_path)

    monkeypatch.setattr(runner, "run_study", full)
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(STUDY))
    code, _, stderr = run_cli("study", str(config), "--out", str(tmp_path / "study"), "--no-report")
    assert code == 2, stderr
    last = stderr.strip().splitlines()[-1]
    assert NO_SPACE in last and "internal error" not in stderr and "OperationalError" not in stderr, stderr


#: Run inside a user and mount namespace on a 1 MiB tmpfs: every study store, once open (its write-ahead log's
#: shared index allocated), fills the disk, so the study's first write meets a real ENOSPC under SQLite.
_FILL_AFTER_OPEN = textwrap.dedent("""
    import sys
    from ropekit.study.store import StudyStore

    disk, opened = sys.argv[1], StudyStore.__init__

    def open_then_fill(self, *args, **kwargs):
        opened(self, *args, **kwargs)
        try:
            with open(disk + "/filler", "ab") as fh:
                while True:
                    fh.write(b"x" * 4096)
                    fh.flush()
        except OSError:
            pass

    StudyStore.__init__ = open_then_fill
    sys.argv = ["ropekit", "study", sys.argv[2], "--out", disk + "/study", "--no-report"]
    from ropekit.cli import main
    main()
""")


def test_a_study_on_a_full_disk_ends_with_the_no_space_line(tmp_path):
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--user", "--map-root-user", "--mount", "true"],
                                         capture_output=True).returncode != 0:
        pytest.skip("needs unshare and unprivileged user namespaces (a small tmpfs to fill, without root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    script, config = tmp_path / "fill.py", tmp_path / "study.yaml"
    script.write_text(_FILL_AFTER_OPEN)
    config.write_text(yaml.safe_dump(STUDY))
    shell = 'mount -t tmpfs -o size=1m tmpfs "$1" && exec "$2" "$3" "$1" "$4"'
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROPEKIT_DEBUG": ""}
    proc = subprocess.run([unshare, "--user", "--map-root-user", "--mount", "sh", "-c", shell, "sh", str(disk),
                           sys.executable, str(script), str(config)], capture_output=True, text=True, env=env,
                          timeout=300)
    if "mount" in proc.stderr and proc.returncode not in (1, 2):
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert NO_SPACE in last and "internal error" not in proc.stderr, proc.stderr
