"""``ropekit methods``: the registry of context-extension methods, as a table or JSON."""

from __future__ import annotations

import typer
from rich.table import Table

from .common import out, print_json


def methods_cmd(json_out: bool = typer.Option(False, "--json", help="Print the registry as JSON.")):
    """List every context-extension method with its parameters and defaults."""
    from ..methods import list_methods

    described = [m.describe() for m in list_methods()]
    if json_out:
        print_json(described)
        return
    table = Table(title="ropekit methods", show_lines=True)
    table.add_column("method", style="bold cyan")
    table.add_column("what it does")
    table.add_column("parameters (default)")
    table.add_column("training", justify="center")
    table.add_column("exports to")
    for d in described:
        params = "\n".join(f"{k} = {v['default']}" for k, v in d["params"].items())
        table.add_row(
            d["name"],
            f"[bold]{d['title']}[/]\n{d['summary']}\n[dim]{d['reference']}[/]",
            params,
            "needed" if d["needs_training"] else "optional",
            ", ".join(d["exports_to"]) or "ropekit only",
        )
    out.print(table)
