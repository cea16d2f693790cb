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


def test_a_silent_log_gets_the_current_line_again_and_nothing_after_the_block():
    """A step of many minutes: the heartbeat repeats the current line with its clock moved on (here every 0.2 s);
    the thread stops with the block, so no line follows the block's own."""
    import time

    console, buffer = plain_console()
    with progress("passkey", total=4, console=console, interval=3600, heartbeat=0.2) as task:
        task.update(advance=1)
        time.sleep(1.0)
    beats = lines(buffer)
    assert 2 <= len(beats) <= 7 and set(beats) == {"passkey: 1/4"}, beats
    stamps = [line.split("]")[0] for line in buffer.getvalue().splitlines()]
    assert stamps == sorted(stamps)
    time.sleep(0.4)
    assert lines(buffer) == beats  # nothing once the block has ended

    console, buffer = plain_console()
    with progress("passkey", total=4, console=console, interval=3600, heartbeat=None) as task:
        time.sleep(0.4)
    assert lines(buffer) == ["passkey: 0/4"]  # no heartbeat: the last state only

    console, buffer = plain_console()
    with progress("passkey", total=4, console=console, interval=3600, heartbeat=0.6) as task:
        for _ in range(4):
            time.sleep(0.1)
            task.log("a sample")  # a log that is not silent: no heartbeat between these lines
        task.update(completed=4)
    assert lines(buffer) == ["a sample"] * 4 + ["passkey: 4/4"]


def test_on_a_terminal_there_is_a_bar_and_no_heartbeat_thread():
    import threading

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with progress("train", total=3, console=console, heartbeat=0.05) as task:
        assert not [t for t in threading.enumerate() if t.name == "ropekit-progress"]
        task.update(advance=1)


def test_a_logged_line_on_a_terminal_is_text_not_markup():
    """Study piece ids carry user labels and paths: "[/fold]" raised rich's MarkupError, "[bold]" vanished."""
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=100)
    with progress("study", total=2, console=console) as task:
        task.log("done: eval:ppl:my[/fold]label")
        task.log("weights [bold] kept")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buffer.getvalue())
    assert "done: eval:ppl:my[/fold]label" in text and "weights [bold] kept" in text
