"""Plain progress lines (output not a terminal): at most one per interval, the finished state exactly once."""

from __future__ import annotations

import io
import re

from rich.console import Console

from ropekit.runtime.progress import progress


def plain_console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=False, width=200), buffer


def lines(buffer: io.StringIO) -> list[str]:
    return [re.sub(r"^\[\d+:\d\d:\d\d\] ", "", l) for l in buffer.getvalue().splitlines()]


def test_the_finished_state_is_printed_once_however_often_it_is_reported():
    console, buffer = plain_console()
    with progress("study", total=3, console=console, interval=3600) as task:
        task.update(completed=1)
        task.update(advance=1, info="piece b")
        task.log("done: piece b")
        for _ in range(4):  # a polling caller reports the final count at every tick
            task.update(completed=3)
    assert lines(buffer) == ["done: piece b", "study: 3/3  piece b"]


def test_a_line_per_interval_and_the_last_state_on_exit():
    console, buffer = plain_console()
    with progress("train", total=10, console=console, interval=0) as task:
        task.update(advance=1)
        task.update(advance=1)
    assert lines(buffer) == ["train: 1/10", "train: 2/10"]
    console, buffer = plain_console()
    with progress("train", total=10, console=console, interval=3600) as task:
        task.update(advance=4)
    assert lines(buffer) == ["train: 4/10"]  # not printed during the interval, printed at the end
