"""CPU threads and deterministic kernels for the duration of a job."""

from __future__ import annotations

import contextlib
import os


def other_busy_cores() -> float:
    """How many cores other work keeps busy: the smaller of the 1-minute load average and the number of
    tasks running right now besides this one (``/proc/loadavg``).

    The average alone lags: for a minute after a finished job (a ``pip install``) it reads busy on an idle
    machine; the instant count alone is noisy. A real competitor shows in both.
    """
    load = os.getloadavg()[0]
    try:
        with open("/proc/loadavg") as fh:
            running = int(fh.read().split()[3].split("/")[0]) - 1  # the reading process counts itself
    except (OSError, ValueError, IndexError):
        return load
    return min(load, max(running, 0))


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, a cgroup cpuset, a Slurm allocation), which
    ``os.cpu_count()`` ignores — two threads on one allowed core run slower than one."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def default_threads(limit: int = 2) -> int:
    """CPU threads for a job: ``limit`` (2: the project's machines have 2 cores), fewer when other work keeps
    cores busy.

    With two threads on two cores and another process running, every parallel operation waits for the
    descheduled thread: training gets several times *slower* than with one thread. The thread count does
    not change results (the CPU kernels give the same bits with 1 or 2 threads; tests/test_demo.py).
    Call it when a piece of work starts, not once per process: the load changes.
    """
    cores = usable_cores()
    threads = min(limit, cores)
    try:
        busy = other_busy_cores()
    except (AttributeError, OSError):  # no load average (Windows)
        return threads
    return max(1, min(threads, int(cores - busy + 0.5)))


@contextlib.contextmanager
def torch_threads(threads: int):
    """``torch.set_num_threads(threads)`` for the duration; the caller's setting comes back after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def deterministic(threads: int | None = None, *, algorithms: bool = True):
    """A fixed thread count (default :func:`default_threads`) and, with ``algorithms``, deterministic kernels
    (``torch.use_deterministic_algorithms(True, warn_only=True)``) for the duration; the caller's settings
    come back after."""
    import torch

    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    with torch_threads(threads or default_threads()):
        if algorithms:
            torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)
