"""``ropekit report DIR``: the HTML report, summaries and figures of a study."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import out, print_json


def report_cmd(
    study_dir: Path = typer.Argument(..., help="A study directory (holding study.sqlite)."),
    json_out: bool = typer.Option(False, "--json", help="Print the written paths as JSON."),
):
    """Write DIR/report/index.html (self-contained), summary.json, summary.md and figures from a study."""
    from ..study import write_report

    paths = write_report(study_dir)
    if json_out:
        print_json(paths)
        return
    out.print(f"[green]wrote[/] {paths['html']} (+ summary.json, summary.md, {len(paths['figures'])} figures)")
