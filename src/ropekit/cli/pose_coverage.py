"""``ropekit pose-coverage``: the PoSE paper's coverage of relative distances (Appendix B, Fig. 5)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ..errors import RopekitError
from ..runtime.atomic import check_figure_target
from .common import err, int_list, out, print_json

#: --scheme → (PoSE curves, RandPos curve)
_SCHEMES = {"pose": (True, False), "randpos": (False, True), "both": (True, True)}
#: --exact → the ``exact`` argument of :func:`ropekit.data.pose.pose_coverage_report`
_EXACT = {"auto": "auto", "always": True, "never": False}


def pose_coverage_cmd(
    window: int = typer.Option(2048, "--window", "-w", min=1, help="Training window L_c in tokens (the paper's Fig. 5: 2048)."),
    target: int = typer.Option(16384, "--target", "-t", min=1, help="Target length L_t in tokens (the paper's Fig. 5: 16384)."),
    chunks: Optional[str] = typer.Option(None, "--chunks", "-n", help="PoSE chunk counts, comma-separated (default 2,3)."),
    scheme: str = typer.Option("both", "--scheme", help="pose | randpos | both (RandPos is PoSE's baseline)."),
    steps: int = typer.Option(10_000, "--steps", min=1, help="Sampled training examples per curve."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the sampler (example k is the dataset's item k of epoch 0)."),
    exact: str = typer.Option("auto", "--exact", help="Exact curves: auto (where cheap enough) | always | never."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the figure (PNG) here, as the paper's Fig. 5."),
    json_out: bool = typer.Option(False, "--json", help="Print the whole report (every curve) as JSON."),
):
    """How often each relative distance occurs in one training example: original window, PoSE, RandPos.

    The PoSE paper's Appendix B, Fig. 5: the original window, PoSE with N chunks, and RandPos. Sampled with
    the training sampler itself, and exact where the enumeration is cheap (always for 2 chunks). Content
    offsets (uniform / zero / aligned) choose the text inside each chunk, not its positions, so they do not
    change coverage."""
    from ..data.pose import plot_coverage, pose_coverage_report

    if scheme not in _SCHEMES:
        raise RopekitError(f"--scheme '{scheme}' is not pose, randpos or both", "pass e.g. --scheme both")
    if exact not in _EXACT:
        raise RopekitError(f"--exact '{exact}' is not auto, always or never", "pass e.g. --exact auto")
    if target < window:  # said in the flags' names (the library speaks of train and target lengths)
        raise RopekitError(f"--target {target} is below --window {window}",
                           "pass a target length (the context to simulate) of at least the training window")
    if plot is not None:
        check_figure_target(plot)
    with_pose, with_randpos = _SCHEMES[scheme]
    if chunks is not None and not with_pose:  # RandPos has no chunks: they would be silently unused
        raise RopekitError("--chunks sets PoSE's chunk counts and --scheme randpos draws no chunks",
                           "drop --chunks, or pass --scheme pose or both")
    chunk_list = int_list(chunks if chunks is not None else "2,3", "--chunks") if with_pose else []
    if len(set(chunk_list)) != len(chunk_list):  # the same curve twice
        raise RopekitError(f"--chunks '{chunks}' must be distinct whole numbers", "pass e.g. --chunks 2,3")
    with err.status("computing coverage…"):
        report = pose_coverage_report(window, target, chunks=chunk_list, steps=steps, seed=seed,
                                      randpos=with_randpos, exact=_EXACT[exact], pose=with_pose)
    if plot is not None:
        report["plot"] = plot_coverage(report, plot)
    if json_out:
        print_json(report)
        return
    from rich import box

    table = Table(title=f"Coverage of relative distances per training example, {window} → {target} "
                        f"({steps:,} sampled examples, seed {seed})", box=box.SIMPLE_HEAD)
    for col in ("curve", "from", "in", "beyond", "min", "last", "never", "err"):
        table.add_column(col, justify="left" if col in ("curve", "from") else "right", no_wrap=True)
    for curve in report["curves"]:
        s = curve["summary"]
        values = curve["exact"] if curve["exact"] is not None else curve["empirical"]
        table.add_row(curve["name"], "exact" if curve["exact"] is not None else "sampled",
                      *("—" if v is None else f"{v:.4f}" for v in (s["mean_within_train"], s["mean_beyond_train"],
                                                                  s["min_beyond_train"], values[target - 1])),
                      str(s["never_covered"]),
                      "—" if curve["max_abs_error"] is None else f"{curve['max_abs_error']:.4f}")
    table.caption = (f"P(d) = probability that some pair of tokens of one example is d apart. in: mean P(d) "
                     f"over 1 ≤ d < {window}; beyond: mean over d ≥ {window}; min: smallest P(d), d ≥ {window}; "
                     f"last: P({target - 1}); never: distances in [1, {target}) never covered; "
                     "err: largest |sampled − exact|")
    out.print(table)
    if plot is not None:
        err.print(f"figure: {report['plot']}")
