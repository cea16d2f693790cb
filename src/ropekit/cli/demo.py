"""``ropekit demo``: the frozen methods on the built-in tiny Llama (the only importer of :mod:`ropekit.demo`)."""

from __future__ import annotations

from typing import Optional

import typer

from .common import print_json


def demo_cmd(
    method: Optional[str] = typer.Option(None, "--method", "-m", help="Only this method (plus the base model)."),
    json_out: bool = typer.Option(False, "--json", help="Print the table as JSON."),
):
    """Train (or load) the built-in tiny Llama and compare next-token loss at 1×, 2×, 4× its window."""
    from ..demo import main as demo_main

    rows = demo_main(method=method, json_out=json_out)
    if json_out:
        print_json(rows)
