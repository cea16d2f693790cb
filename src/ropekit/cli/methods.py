"""``ropekit methods``: the registry of context-extension methods, as a table or JSON; one method's card with what
each parameter means and accepts (``ropekit methods NAME``); and which model family takes which method
(``--families``)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from ..errors import InvalidParameterError
from .common import out, print_json


def methods_cmd(
    name: Annotated[Optional[str], typer.Argument(help="One method (e.g. yarn): its card, with what each parameter "
                                                  "means and which values it accepts.", show_default=False)] = None,
    json_out: bool = typer.Option(False, "--json", help="Print the registry (or the family table) as JSON."),
    families: bool = typer.Option(False, "--families", help="Which model family takes which method, and the feature "
                                  "that rules a method out (the capability check on each family's tiny model)."),
):
    """List every context-extension method with its parameters, defaults and composition rule; with NAME, one
    method's card: what each parameter means and which values it accepts."""
    if families:
        if name is not None:
            raise InvalidParameterError("--families lists every method; it takes no method name",
                                        f"run `ropekit methods {name}` or `ropekit methods --families`")
        _families(json_out)
        return
    from .catalog import check, load

    described = load()  # the registry as data (ropekit.cli.catalog): no torch, answers at once
    if name is not None:
        key = check(name, {})  # an unknown name: one line with the closest names
        _card(next(d for d in described if d["name"] == key), json_out)
        return
    for d in described:
        d.pop("bounds", None)
    if json_out:
        print_json(described)
        return
    table = Table(title="ropekit methods", show_lines=True,
                  caption="`ropekit methods NAME`: one method's card, with what each parameter means and accepts")
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


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def _value(v: Any) -> str:
    """A default as it is written on the command line (``-p truncate=false``)."""
    return str(v).lower() if isinstance(v, bool) else str(v)


def _accepts(bounds: dict[str, Any]) -> str:
    """A parameter's accepted values as a reader writes them: ``> 0``, ``≥ 1``, ``1 ≤ x ≤ 8``, ``ratio | dim``."""
    if bounds.get("choices"):
        return " | ".join(_value(c) for c in bounds["choices"])
    if bounds["type"] == "bool":
        return "true | false"
    if bounds["type"] == "list":
        return "numbers, comma-separated"
    low, high = bounds.get("minimum"), bounds.get("maximum")
    strict = "<" if bounds.get("exclusive_minimum") else "≤"
    if high is None:
        return "any" if low is None else f"{'>' if strict == '<' else '≥'} {_number(low)}"
    return f"{_number(low)} {strict} x ≤ {_number(high)}" if low is not None else f"≤ {_number(high)}"


def _card(entry: dict[str, Any], json_out: bool) -> None:
    """One method: what it changes, where it comes from, how it composes and exports, and every parameter."""
    if json_out:
        print_json(entry)
        return
    from rich.markup import escape

    out.print(f"[bold cyan]{entry['name']}[/] — [bold]{escape(entry['title'])}[/]")
    out.print(escape(entry["summary"]), highlight=False)
    facts = [("training", "needed" if entry["needs_training"] else "optional"),
             ("changes", ", ".join(entry.get("changes") or []) or "—"),
             ("exports to", ", ".join(entry["exports_to"]) or "ropekit only (ropekit.load reads it back)"),
             ("on a pre-scaled model", entry["composition"] or "—"),
             ("source", entry["reference"])]
    for label, value in facts:
        out.print(f"[dim]{label}:[/] {escape(str(value))}", highlight=False)
    table = Table(title="parameters (ropekit extend … -p NAME=VALUE)", title_justify="left")
    table.add_column("parameter", style="bold", overflow="fold")
    table.add_column("default", overflow="fold")
    table.add_column("accepts")
    table.add_column("meaning")
    for pname, spec in entry["params"].items():
        default = spec["default"]
        table.add_row(pname, "unset" if default is None else escape(_value(default)),
                      escape(_accepts(entry["bounds"][pname])), escape(spec.get("help") or ""))
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
