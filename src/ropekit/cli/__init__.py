"""The ``ropekit`` command line: the typer app, the registration of its commands, and :func:`main`.

Each command lives in its own module (``ropekit.cli.methods``, ``…inspect``, ``…extend``, ``…eval``,
``…train``, ``…recommend``, ``…pose_coverage``, ``…report``, ``…study``, ``…pretrain_base``, ``…demo``); what several share
is in :mod:`ropekit.cli.common`. None of them imports torch, transformers or the heavy ropekit modules at
module level — each command imports what it needs when it runs — so ``ropekit --help`` answers at once.

Every user mistake ends as one line on stderr (``error: <problem>. <fix>.``) and exit code 2, before
anything is written. ``--json`` prints machine-readable output on stdout.
"""

from __future__ import annotations

import os
import signal
import threading
import warnings
from pathlib import Path

import typer
from rich.markup import escape
from typer.core import TyperGroup
from typer.exceptions import TyperException

from ..errors import RopekitError
from .common import Command, err, parse_params
from .demo import demo_cmd
from .engines import engines_app
from .eval import eval_app
from .extend import extend_cmd
from .inspect import inspect_cmd
from .methods import methods_cmd
from .pose_coverage import pose_coverage_cmd
from .pretrain_base import pretrain_base_cmd
from .recommend import recommend_cmd
from .report import report_cmd
from .search import search_cmd
from .export import export_cmd
from .study import study_cmd
from .train import train_cmd
from .verify import verify_cmd

__all__ = ["COMMANDS", "app", "main", "parse_params"]

#: Every command, in the order ``ropekit --help`` lists them: its function, or a typer app for a group.
COMMANDS = {
    "methods": methods_cmd,
    "inspect": inspect_cmd,
    "extend": extend_cmd,
    "search": search_cmd,
    "export": export_cmd,
    "verify": verify_cmd,
    "recommend": recommend_cmd,
    "engines": engines_app,
    "eval": eval_app,
    "train": train_cmd,
    "pose-coverage": pose_coverage_cmd,
    "report": report_cmd,
    "study": study_cmd,
    "pretrain-base": pretrain_base_cmd,
    "demo": demo_cmd,
}


class _Root(TyperGroup):
    """The top-level group: commands listed in :data:`COMMANDS` order (typer lists groups after commands)."""

    def list_commands(self, ctx):
        order = list(COMMANDS)
        return sorted(super().list_commands(ctx), key=lambda name: order.index(name) if name in order else len(order))


app = typer.Typer(
    cls=_Root,
    add_completion=False,
    no_args_is_help=True,
    help="Extend, train and measure the context window of RoPE language models.",
    rich_markup_mode="rich",
)
def _version(value: bool) -> None:
    if value:
        from .._version import __version__

        typer.echo(f"ropekit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print ropekit's version and exit.")) -> None:
    """Extend, train and measure the context window of RoPE language models."""


for _name, _target in COMMANDS.items():
    if isinstance(_target, typer.Typer):
        app.add_typer(_target, name=_name)
    else:
        app.command(_name, cls=Command)(_target)


def _error_line(problem: str) -> None:
    # the message is text, not markup: "pip install 'ropekit[ray]'" must keep its brackets
    err.print(f"[bold red]error:[/] {escape(problem)}", highlight=False, soft_wrap=True)


#: Where ropekit's own code lies: a warning raised there (``stacklevel`` may point at the CLI) is ropekit's to word.
_PACKAGE = str(Path(__file__).resolve().parent.parent)


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """Show ropekit's own warnings as one ``warning:`` line (not Python's file:line and source echo); others as usual."""
    if str(Path(filename).resolve()).startswith(_PACKAGE):
        err.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


_python_showwarning = warnings.showwarning

#: The exit code of a command stopped by Ctrl-C (128 + SIGINT, as the shell reports it).
_INTERRUPTED = 130
#: ... and by SIGTERM (128 + 15): what a batch scheduler or ``kill`` sends before SIGKILL.
_TERMINATED = 143
_signal_received = {"term": False}


def _terminate(signum, frame) -> None:
    # SIGTERM takes Ctrl-C's path: a study puts its running pieces back and stops its workers, a training keeps
    # what it has saved, instead of leaving pieces marked running and semaphores behind
    _signal_received["term"] = True
    raise KeyboardInterrupt


def _interrupted() -> int:
    """Say how the command was stopped; the exit code for it."""
    if _signal_received["term"]:
        err.print("terminated", highlight=False)
        return _TERMINATED
    err.print("interrupted", highlight=False)
    return _INTERRUPTED


def main() -> None:
    """Entry point: run the app; exit 0 only when everything asked for succeeded.

    User errors (a :class:`RopekitError`, a usage error, a path the filesystem refuses) are one line and exit 2;
    a command that finished with failures (``verify`` FAIL, a study with failed pieces) exits with its own
    non-zero code; Ctrl-C is one line and 130, the shell's code for SIGINT; SIGTERM takes the same path and exits
    143.
    """
    if threading.current_thread() is not threading.main_thread():  # signal handlers can only be set there
        return _main()
    previous = signal.signal(signal.SIGTERM, _terminate)
    _signal_received["term"] = False
    try:
        return _main()
    finally:
        signal.signal(signal.SIGTERM, previous)  # an in-process caller (a test) gets its own handler back


def _main() -> None:
    from ..runtime import route_deepspeed_logs_to_stderr

    route_deepspeed_logs_to_stderr()  # stdout is for results (--json): DeepSpeed logs there when imported
    shown_by, warnings.showwarning = warnings.showwarning, _warning_line
    try:
        return _run_app()
    finally:
        warnings.showwarning = shown_by  # an in-process caller (a test) gets Python's display back


def _run_app() -> None:
    from ..runtime.atomic import filesystem_error

    try:
        # standalone_mode=False returns typer.Exit's code instead of raising it: the code must not be dropped
        code = app(standalone_mode=False)
    except RopekitError as e:
        _error_line(e.one_line())
        raise SystemExit(e.exit_code) from None
    except typer.Exit as e:
        if e.exit_code == _INTERRUPTED:
            raise SystemExit(_interrupted()) from None
        raise SystemExit(e.exit_code) from None
    except (typer.Abort, KeyboardInterrupt):
        raise SystemExit(_interrupted()) from None
    except Exception as e:  # click usage errors and anything unexpected
        if type(e).__name__ == "NoArgsIsHelpError":
            # bare `ropekit` (or `ropekit eval`) asked for the help that was just printed: as --help, that is success
            raise SystemExit(0) from None
        if isinstance(e, TyperException) or hasattr(e, "format_message"):  # typer's vendored click errors
            message = e.format_message().strip()
            if message:
                _error_line(message)
            raise SystemExit(getattr(e, "exit_code", 2) or 2) from None
        user = filesystem_error(e)
        if user is not None and not os.environ.get("ROPEKIT_DEBUG"):
            _error_line(user.one_line())
            raise SystemExit(user.exit_code) from None
        if os.environ.get("ROPEKIT_DEBUG"):
            raise
        err.print(f"[bold red]internal error:[/] {escape(f'{type(e).__name__}: {e}')} (set ROPEKIT_DEBUG=1 for the traceback)",
                  highlight=False, soft_wrap=True)
        raise SystemExit(1) from None
    if isinstance(code, int) and code:
        if code == _INTERRUPTED:  # typer turns KeyboardInterrupt into a silent Exit(130)
            code = _interrupted()
        raise SystemExit(code)
