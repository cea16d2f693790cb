"""``ropekit methods``: the registry of context-extension methods, as a table or JSON, and which model family takes
which method (``--families``)."""

from __future__ import annotations

import typer
from rich.table import Table

from .common import out, print_json


def methods_cmd(
    json_out: bool = typer.Option(False, "--json", help="Print the registry (or the family table) as JSON."),
    families: bool = typer.Option(False, "--families", help="Which model family takes which method, and the feature "
                                  "that rules a method out (the capability check on each family's tiny model)."),
):
    """List every context-extension method with its parameters, defaults and composition rule."""
    if families:
        _families(json_out)
        return
    from .catalog import load

    described = load()  # the registry as data (ropekit.cli.catalog): no torch, answers at once
    for d in described:
        d.pop("bounds", None)
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
        composition = f"\n[italic]on a pre-scaled model: {d['composition']}[/]" if d["composition"] else ""
        table.add_row(
            d["name"],
            f"[bold]{d['title']}[/]\n{d['summary']}{composition}\n[dim]{d['reference']}[/]",
            params,
            "needed" if d["needs_training"] else "optional",
            ", ".join(d["exports_to"]) or "ropekit only",
        )
    out.print(table)


def _families(json_out: bool) -> None:
    from ..models.families import support_rows

    rows = support_rows()
    if json_out:
        print_json(rows)
        return
    table = Table(title="which family takes which method", show_lines=True, expand=True)
    table.add_column("family", style="bold cyan", ratio=2)
    table.add_column("takes", ratio=3)
    table.add_column("refused (the feature that rules it out)", ratio=3)
    for row in rows:
        takes = [m for m, why in row["methods"].items() if not why]
        refused = [f"{m} ({why})" for m, why in row["methods"].items() if why]
        everything = "[green]every method[/]" if not refused else ", ".join(takes)
        table.add_row(f"{row['family']}\n[dim]{row['features']}[/]", everything, "[red]" + ", ".join(refused) + "[/]" if refused else "")
    out.print(table)
