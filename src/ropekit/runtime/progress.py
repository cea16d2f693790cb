"""Progress of long work: a rich bar on a terminal, plain timestamped log lines otherwise.

Every long job in ropekit (pre-training, training, an evaluation, a study) shows its progress through
:func:`progress`. On a terminal it is a rich progress bar; when the output goes to a file or a CI log, a bar
would print nothing readable (or thousands of carriage returns), so the same calls print one line at most
every ``interval`` seconds, one when the total is reached, and every :meth:`ProgressTask.log` line. One step can
take many minutes (a 32k-token prompt on a CPU), so a log that has been silent for ``heartbeat`` seconds gets
the current line again, its clock moved on: a reader of the log can tell a slow step from a hung one.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressTask:
    """One job's progress: ``update`` it as work is done, ``log`` lines that should stay in the output."""

    def __init__(self, description: str, total: int | None, completed: int, console, interval: float, rich: bool,
                 heartbeat: float | None = None):
        self.description, self.total, self.completed, self.info = description, total, completed, ""
        self.console, self.interval = console, interval
        self._started = self._printed = time.monotonic()
        self._shown: tuple | None = None  # (completed, total) of the last plain line
        self._bar = self._job = None
        # plain lines only: the heartbeat thread and the caller both print, one at a time
        self._lock = threading.Lock()
        self._heartbeat = heartbeat if not rich and heartbeat is not None and heartbeat > 0 else None
        self._stop = threading.Event()
        self._beat_thread: threading.Thread | None = None
        if rich:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=console, transient=False)

    def __enter__(self) -> "ProgressTask":
        if self._bar is not None:
            self._bar.start()
            self._job = self._bar.add_task(self.description, total=self.total, completed=self.completed, info="")
        elif self._heartbeat is not None:
            self._beat_thread = threading.Thread(target=self._beat, name="ropekit-progress", daemon=True)
            self._beat_thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._beat_thread is not None:
            self._stop.set()
            self._beat_thread.join()  # no line may follow the block's own
        if self._bar is not None:
            self._bar.stop()
        elif exc[0] is None and self._shown != (self.completed, self.total):
            with self._lock:
                self._line()  # the final state, unless it was the last line printed

    def _beat(self) -> None:
        while True:
            with self._lock:
                wait = self._printed + self._heartbeat - time.monotonic()
                if wait <= 0:
                    try:
                        self._line()
                    except (OSError, ValueError):  # the stream went away (a closed pipe): the job itself goes on
                        return
                    continue
            if self._stop.wait(wait):
                return

    def update(self, *, completed: int | None = None, advance: int = 0, total: int | None = None,
               info: str | None = None, description: str | None = None) -> None:
        """Set or advance the finished count, the total, the one-line status (``info``) or the description."""
        if total is not None:
            self.total = total
        if completed is not None:
            self.completed = completed
        self.completed += advance
        if info is not None:
            self.info = info
        if description is not None:
            self.description = description
        if self._bar is not None:
            self._bar.update(self._job, completed=self.completed, total=self.total, info=self.info,
                             description=self.description)
            return
        with self._lock:
            now = time.monotonic()
            finished = self.total is not None and self.completed >= self.total
            if now - self._printed >= self.interval or (finished and self._shown != (self.completed, self.total)):
                self._line()  # the finished state once, however often a caller reports it

    def log(self, line: str) -> None:
        """A line that stays in the output (above the bar on a terminal)."""
        if self._bar is not None:
            self._bar.console.print(line, highlight=False, markup=False)  # labels and paths are not markup
        else:
            with self._lock:
                self._printed = time.monotonic()  # the log is not silent: the heartbeat waits again
                self._write(f"[{_clock(self._printed - self._started)}] {line}")

    def _line(self) -> None:
        self._printed = time.monotonic()
        self._shown = (self.completed, self.total)
        count = f"{self.completed}/{self.total}" if self.total is not None else f"{self.completed}"
        info = f"  {self.info}" if self.info else ""
        self._write(f"[{_clock(self._printed - self._started)}] {self.description}: {count}{info}")

    def _write(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text, highlight=False, markup=False, soft_wrap=True)
        else:
            print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def progress(description: str, total: int | None = None, *, completed: int = 0, console=None,
             interval: float = 30.0, heartbeat: float | None = 300.0, enabled: bool = True) -> Iterator[ProgressTask]:
    """Show the progress of one job for the duration of the ``with`` block.

    ``console`` is a rich console (default: standard error); the display is a rich bar when it is a terminal,
    else plain lines (at most one per ``interval`` seconds, plus the last, and the current one again after
    ``heartbeat`` seconds without a line; None: never). ``enabled=False`` shows nothing but still returns a task,
    so callers need no second code path.
    """
    if console is None and enabled:
        from rich.console import Console

        console = Console(stderr=True, emoji=False)
    rich = enabled and console is not None and console.is_terminal
    task = ProgressTask(description, total, completed, console, interval, rich, heartbeat if enabled else None)
    if not enabled:
        task._write = lambda text: None
    with task:
        yield task
