"""``ropekit report DIR``: the HTML report, summaries and figures of a study."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import err, out, print_json


def warn_figure_overlaps(paths: dict) -> None:
    """One warning line per figure whose texts overlap or leave the canvas (the report's own check)."""
    for name, pairs in paths.get("figure_overlaps", {}).items():
        first = " / ".join(repr(t) for t in pairs[0])
        err.print(f"[yellow]warning[/] figure {name}: {len(pairs)} overlapping text(s), e.g. {first}")


def report_cmd(
    study_dir: Path = typer.Argument(..., help="A study directory (holding study.sqlite)."),
    out_dir: Path = typer.Option(None, "--out", "-o", help="Where to write the report (default DIR/report); a "
                                 "study on a read-only filesystem is read in place."),
    json_out: bool = typer.Option(False, "--json", help="Print the written paths as JSON."),
):
    """Write DIR/report/index.html (self-contained), summary.json, summary.md and figures from a study (--out:
    elsewhere)."""
    from ..study import write_report

    paths = write_report(study_dir, out_dir)
    warn_figure_overlaps(paths)
    if json_out:
        print_json(paths)
        return
    out.print(f"[green]wrote[/] {paths['html']} (+ summary.json, summary.md, {len(paths['figures'])} figures)")
