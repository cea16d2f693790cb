"""CPU threads for a job: leave cores that other work keeps busy alone."""

from __future__ import annotations

import pytest

from ropekit.runtime import threads


@pytest.mark.parametrize("cores, busy, expected", [(2, 0.0, 2), (2, 0.4, 2), (2, 1.0, 1), (2, 3.0, 1), (1, 0.0, 1), (8, 1.0, 2)])
def test_default_threads_leave_busy_cores_alone(monkeypatch, cores, busy, expected):
    monkeypatch.setattr(threads.os, "cpu_count", lambda: cores)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(threads, "other_busy_cores", lambda: busy)
    assert threads.default_threads() == expected


def test_threads_stay_within_the_cores_this_process_may_use(monkeypatch):
    """Under taskset/a cpuset, os.cpu_count() still counts the machine: two threads went to one allowed core."""
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {3}, raising=False)
    monkeypatch.setattr(threads, "other_busy_cores", lambda: 0.0)
    assert threads.usable_cores() == 1 and threads.default_threads() == 1


def test_busy_cores_take_the_smaller_of_average_and_running_now(monkeypatch, tmp_path):
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (1.8, 1.0, 1.0))
    real_open = open

    def fake_open(path, *args, **kwargs):
        if path == "/proc/loadavg":
            f = tmp_path / "loadavg"
            f.write_text("1.80 1.00 1.00 1/90 12345\n")  # only this process runs now
            return real_open(f, *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    assert threads.other_busy_cores() == 0  # the average still counts a job that just ended
