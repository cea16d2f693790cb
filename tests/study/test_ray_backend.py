"""The study on a local Ray cluster (CPU, 2 workers): the same database as the local backend, also after the
driver is killed with SIGKILL mid-study and run again; the driver is the store's only writer."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import yaml
from ray_driver import kill_driver_when, study_command
from test_runner import SMALL, _assert_same, _done_pieces, _dump

from ropekit.errors import RopekitError
from ropekit.study.config import parse_study
from ropekit.study.runner import run_study

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'ropekit[ray]')")


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("study-local")
    status = run_study(parse_study(SMALL), out, progress=False)
    assert status["by_status"]["done"] == 7
    return out


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_gives_the_local_backends_database_and_only_the_driver_writes(local_reference, ray_cluster, tmp_path):
    status = run_study(parse_study(SMALL), tmp_path, progress=False, backend="ray")
    assert status["by_status"]["done"] == 7
    _assert_same(_dump(local_reference / "study.sqlite"), _dump(tmp_path / "study.sqlite"))
    db = sqlite3.connect(tmp_path / "study.sqlite")
    workers = {w for (w,) in db.execute("SELECT worker FROM pieces")}
    db.close()
    from ropekit.study.store import _this_machine

    assert workers == {f"{_this_machine()}:{os.getpid()}"}  # every claim is the driver's


def test_driver_killed_mid_study_resumes_to_the_same_database(local_reference, tmp_path):
    out = tmp_path / "ray"
    cmd = study_command(SMALL, tmp_path, out)

    def two_done():
        done = _done_pieces(out / "study.sqlite")
        return done is not None and done >= 2

    assert kill_driver_when(cmd, two_done, timeout=300), "the study ended before the driver could be killed"
    db = sqlite3.connect(out / "study.sqlite")  # writable: recovers the killed writer's WAL
    before = db.execute("SELECT COUNT(*) FROM pieces WHERE status = 'done'").fetchone()[0]
    finished = dict(db.execute("SELECT id, finished FROM pieces WHERE status = 'done'").fetchall())
    db.close()
    assert 2 <= before < 7
    again = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    _assert_same(_dump(local_reference / "study.sqlite"), _dump(out / "study.sqlite"))
    db = sqlite3.connect(out / "study.sqlite")
    after = dict(db.execute("SELECT id, finished FROM pieces").fetchall())
    db.close()
    assert all(after[piece] == when for piece, when in finished.items())  # finished pieces were not re-run


def test_a_worker_killed_mid_piece_is_re_run_by_ray_and_the_database_is_the_same(local_reference, ray_cluster, tmp_path):
    """SIGKILL one Ray worker process while it runs a piece: Ray retries the task on a fresh worker (max_retries),
    the piece is committed once, and the database equals the local backend's."""
    import threading

    killed: list[int] = []
    stop = threading.Event()

    def kill_one_worker():
        while not stop.is_set() and not killed:
            ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
            for line in ps.splitlines():
                pid, _, args = line.strip().partition(" ")
                if args.startswith("ray::run_remote_piece"):
                    time.sleep(0.3)  # inside the piece, not at its start
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        break
                    killed.append(int(pid))
                    return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_one_worker, daemon=True)
    killer.start()
    try:
        status = run_study(parse_study(SMALL), tmp_path, progress=False, backend="ray")
    finally:
        stop.set()
        killer.join(timeout=5)
    assert killed, "no Ray worker was seen running a piece"
    assert status["by_status"]["done"] == 7
    _assert_same(_dump(local_reference / "study.sqlite"), _dump(tmp_path / "study.sqlite"))


def test_resources_no_node_can_hold_are_refused_in_one_line_not_queued_forever(ray_cluster, tmp_path):
    config = {**SMALL, "resources": {"train": {"gpus": 8}}}
    out = tmp_path / "study"
    with pytest.raises(RopekitError, match=r"resources.train asks for 8 GPUs per piece, but the largest node") as err:
        run_study(parse_study(config), out, progress=False, backend="ray")
    assert "\n" not in str(err.value)
    assert not out.exists()  # nothing written


def test_workers_with_ray_and_unknown_backends_are_one_line(tmp_path):
    with pytest.raises(RopekitError, match="--workers applies to the local backend"):
        run_study(parse_study(SMALL), tmp_path / "a", workers=2, progress=False, backend="ray")
    with pytest.raises(RopekitError, match="unknown backend"):
        run_study(parse_study(SMALL), tmp_path / "b", progress=False, backend="slurm")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_without_the_ray_package_the_backend_is_one_line_and_exit_2(run_cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray → ImportError, as on a machine without it
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump(SMALL))
    code, _, err = run_cli("study", str(config), "--out", str(tmp_path / "s"), "--backend", "ray")
    assert code == 2 and "pip install 'ropekit[ray]'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()
