"""``ropekit study``: run a controlled study (resumable) and write its report; ``ropekit study status DIR``
shows how far a study has come."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import RopekitError
from .common import AttnOpt, DtypeOpt, err, out, print_json, resolve_placement

#: Colour of each piece status in the `status` table.
_COLORS = {"done": "green", "running": "cyan", "failed": "red", "pending": "dim"}


def _status(study_dir: Path, json_out: bool) -> None:
    from ..study.report_format import fmt_duration
    from ..study.store import DB_NAME, _seconds_between, now_iso, open_study

    if not (study_dir / DB_NAME).is_file():
        raise RopekitError(f"no study in '{study_dir}' (no {DB_NAME})", "pass the --out directory of a `ropekit study` run")
    with open_study(study_dir) as store:
        status = store.status()
        stored = store.stored_by_piece()
        pieces = store.pieces()
        name = store.get_manifest("name")
        ended = set(store.abandoned())  # "running" in the file, but their worker is gone
    if json_out:
        print_json({"study": name, **status, "stored": stored, "pieces_detail": pieces, "abandoned": sorted(ended)})
        return
    by = status["by_status"]
    stopped = f" (of them {len(ended)} with no live worker)" if ended else ""
    out.print(f"[bold]study {name}[/] in {study_dir}: {by['done']}/{status['pieces']} pieces done, "
              f"{by['running']} running{stopped}, {by['failed']} failed, {by['pending']} pending; "
              f"{status['samples']} samples, {status['train_steps']} training steps, {status['seconds'] / 60:.1f} min of compute")
    table = Table()
    for col in ("piece", "status", "stored", "seconds", "note"):
        # a piece's id is what one looks up and passes on: wrapped in a narrow console, never cut short
        table.add_column(col, justify="right" if col in ("stored", "seconds") else "left", overflow="fold")
    now = now_iso()
    for p in pieces:
        note = p["error"] or ""
        if p["id"] in ended:
            note = f"{p['worker']} has ended: the next run takes it over"
        elif p["status"] == "running":  # a real-model piece runs for hours: how long this one has
            note = f"{p['worker']}, running for {fmt_duration(_seconds_between(p['started'], now))}"
        kept = stored.get(p["id"], {})
        so_far = (f"{kept['train_steps']} steps" if kept.get("train_steps") else
                  f"{kept['samples']} samples" if kept.get("samples") else "—")
        table.add_row(escape(p["id"]), f"[{_COLORS[p['status']]}]{p['status']}[/]", so_far,
                      f"{p['seconds']:.1f}" if p["seconds"] is not None else "—", escape(note or ""))
    out.print(table)


def _refuse_unused(where: str, given: dict[str, bool]) -> None:
    """One line naming the flags given that ``where`` would not use: a flag silently ignored reads as obeyed."""
    unused = [flag for flag, was_given in given.items() if was_given]
    if unused:
        verb = "does" if len(unused) == 1 else "do"
        raise RopekitError(f"{', '.join(unused)} {verb} not apply to {where}", f"drop {', '.join(unused)}")


def study_cmd(
    config: Optional[str] = typer.Argument(None, help="A study YAML file — or `status` followed by a study directory."),
    status_dir: Optional[Path] = typer.Argument(None, help="With `status`: the study directory."),
    preset: Optional[str] = typer.Option(None, "--preset", help="A built-in study: quick, standard, smollm2, lceg-llama2-7b."),
    out_dir: Optional[Path] = typer.Option(None, "--out", "-o", help="Study directory (default: study-NAME); holds study.sqlite."),
    workers: Optional[int] = typer.Option(None, "--workers", "-w", min=1, help="Worker processes sharing the pieces "
                                          "(threads split between them; default 1)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="local (the default: processes on this machine) or "
                                          "ray (every piece a Ray task)."),
    address: Optional[str] = typer.Option(None, "--address", help="ray: the cluster (auto, or HOST:PORT of its head); "
                                          "default: start a local one."),
    show: bool = typer.Option(False, "--show", help="Print the config (a preset's YAML) and exit."),
    pretrain: bool = typer.Option(False, "--pretrain", help="builtin-base: pre-train the base model here (minutes) "
                                  "instead of starting from the one shipped in the package."),
    report: Optional[bool] = typer.Option(None, "--report/--no-report", help="Write the report when the study "
                                          "finishes (the default)."),
    json_out: bool = typer.Option(False, "--json", help="Print the final status (or `status`) as JSON."),
    device: Annotated[Optional[str], typer.Option("--device", help="auto | cpu | cuda | cuda:N | mps (default: the config's `device`, auto; with several GPUs each worker gets its own).")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help=DtypeOpt.__metadata__[0].help + " Default: the config's `dtype`.")] = None,
    attn: Annotated[Optional[str], typer.Option("--attn", help=AttnOpt.__metadata__[0].help + " Default: the config's `attn`.")] = None,
    retrain: Annotated[Optional[list[str]], typer.Option("--retrain", help="A fine-tuned or searched variant (its "
                       "label) whose finished model is not on this machine: produce it again here and redo every "
                       "evaluation of it (comma-separated or repeated for several).")] = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Run only the pieces of these variants (labels, "
                    "comma-separated or repeated) now, and the rest of the study later.")] = None,
):
    """Run a controlled study (resumable: run it again to continue), then write its report.

    `ropekit study status DIR` shows the progress of a study.
    """
    # what a run takes and `status` or --show would silently ignore
    running = {"--preset": preset is not None, "--workers": workers is not None, "--backend": backend is not None,
               "--address": address is not None, "--pretrain": pretrain, "--report/--no-report": report is not None,
               "--device": device is not None, "--dtype": dtype is not None, "--attn": attn is not None,
               "--retrain": bool(retrain), "--only": bool(only)}
    if config == "status":
        target = status_dir or out_dir
        if target is None:
            raise RopekitError("`ropekit study status` needs the study directory", "run `ropekit study status DIR`")
        _refuse_unused("`ropekit study status`", {**running, "--show": show,
                                                   "--out": status_dir is not None and out_dir is not None})
        _status(target, json_out)
        return
    if status_dir is not None:
        raise RopekitError(f"unexpected argument '{status_dir}'", "give one study config (or `status DIR`)")
    from ..study.config import BUILTIN_BASE, load_study_config, preset_text

    if show:
        if preset is None:
            raise RopekitError("--show prints a preset", "add --preset NAME (e.g. --preset quick)")
        _refuse_unused("--show", {**{k: v for k, v in running.items() if k != "--preset"}, "--out": out_dir is not None,
                                  "--json": json_out, "a study config": config is not None})
        typer.echo(preset_text(preset), nl=False)  # raw: rich would wrap long lines and break the YAML
        return
    for flag, given in (("--only", only), ("--retrain", retrain)):
        if given and not any(label.strip() for item in given for label in item.split(",")):
            raise RopekitError(f"{flag} {','.join(given)!r} names no variant", f"name one or more labels, e.g. {flag} base")
    backend = backend or "local"
    if backend not in ("local", "ray"):
        raise RopekitError(f"--backend '{backend}' is not a study backend", "pass --backend local or --backend ray")
    if workers is not None and backend == "ray":
        raise RopekitError("--workers sets the local backend's processes; Ray places the pieces over its cluster",
                           "drop --workers (size the cluster instead), or pass --backend local")
    if address is not None and backend != "ray":
        raise RopekitError("--address names a Ray cluster and applies to --backend ray", "add --backend ray, or drop --address")
    cfg = load_study_config(config, preset=preset)
    if pretrain:
        cfg.pretrain = True
    for key, value in (("device", device), ("dtype", dtype), ("attn", attn)):
        if value is not None:
            setattr(cfg, key, value)
    # an impossible device/dtype/attn fails here, in one line, before a study directory exists
    resolve_placement(getattr(cfg, "device", "auto") or "auto", getattr(cfg, "dtype", "auto") or "auto",
                      getattr(cfg, "attn", "auto") or "auto")
    from ..study.runner import run_study

    if cfg.model != BUILTIN_BASE:
        from ..models.loading import require_reachable

        require_reachable(cfg.model)  # a missing path or an uncached hub id offline: one line, before any directory

    if backend == "ray":
        from ..study.ray_backend import require_ray

        require_ray()  # a missing package is one line before anything is printed or written
    if out_dir is None and ("/" in cfg.name or "\\" in cfg.name or ".." in cfg.name):
        # the default directory is study-NAME: "../../x" or "a/b" would put it somewhere else than ./study-NAME
        raise RopekitError(f"the study name {cfg.name!r} cannot name the default directory study-NAME",
                           "pass --out DIR, or a name without / and ..")
    study_dir = out_dir or Path(f"study-{cfg.name}")
    from ..runtime.atomic import check_target

    check_target(study_dir, kind="dir")  # a file, a FIFO, a read-only place: one line before any work
    from ..study.pieces import placement, select_pieces
    from ..study.runner import (corpus_warning, require_eval_data, require_models, require_same_config,
                                require_study_dir, retrain_variants)

    require_study_dir(study_dir, own=[Path(config)] if config else [])  # someone else's files: before any work

    only, retrain = ([label.strip() for item in given or [] for label in item.split(",") if label.strip()]
                     for given in (only, retrain))
    select_pieces(cfg, only)  # an unknown label: one line, before anything is written
    # another protocol in this directory (a dropped variant brought back changed, too): one line, before the
    # announcement and before anything is written
    require_same_config(cfg, study_dir)
    require_eval_data(cfg, study_dir, only)  # a missing data file that an unfinished piece reads: one line, here
    require_models(cfg, study_dir, retrain, only)  # a trained model not on this machine: one line, here
    for line in retrain_variants(cfg, study_dir, retrain):
        err.print(line, highlight=False, soft_wrap=True)
    warning = corpus_warning(cfg, study_dir, only)
    if warning:
        err.print(warning, highlight=False, soft_wrap=True)
    part = f" (now only: {', '.join(only)})" if only else ""
    err.print(f"study [bold]{cfg.name}[/]: {len(cfg.variants)} variants × {len(cfg.evals)} evaluations{part} → "
              f"{study_dir}/study.sqlite")
    # where the pieces run and in which dtype, and why (each piece also records where it ran: the report says)
    err.print(placement(cfg).describe(), highlight=False, soft_wrap=True)
    status = run_study(cfg, study_dir, workers=workers or 1, backend=backend, address=address, only=only)
    paths = None
    if report is not False:
        from ..study import write_report
        from .report import warn_figure_overlaps

        paths = write_report(study_dir)
        warn_figure_overlaps(paths)
    if json_out:
        print_json({"study": cfg.name, "dir": str(study_dir), **status, "report": paths})
    else:
        by = status["by_status"]
        out.print(f"[bold]study {escape(cfg.name)}[/]: {by['done']}/{status['pieces']} pieces done, {by['failed']} failed")
        for f in status["failed"]:  # error text is text: "[batch, seq]" or "[/tmp/log]" is not markup
            out.print(f"  [red]failed[/] {escape(f['piece'])}: {escape(str(f['error']))}")
        if paths:
            out.print(f"report: {paths['html']}")
    if status["by_status"]["failed"]:
        if json_out:  # stdout holds the JSON: the failure still needs its line
            err.print(f"study {cfg.name}: {status['by_status']['failed']} of {status['pieces']} pieces failed", highlight=False)
        raise typer.Exit(1)
