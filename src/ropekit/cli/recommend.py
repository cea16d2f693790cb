"""``ropekit recommend MODEL --target-length N --out DIR``: the best extension method for this model, length and
engine, chosen on evidence measured on the model, exported and verified (:mod:`ropekit.study.recommend`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from ..errors import RopekitError
from .common import MODEL_HELP, err, load_model, out, print_json, split_list

ENGINES = ("transformers", "vllm", "llamacpp")  # ropekit.study.recommend.ENGINES, without importing torch


def _check_out(path: Path, overwrite: bool) -> None:
    from ..runtime.atomic import check_target
    from ..study.recommend_output import check_replaceable

    check_target(path, kind="dir", whole=True)
    if path.exists() and not path.is_dir():
        raise RopekitError(f"--out '{path}' exists and is a file", "pass a directory path")
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise RopekitError(f"--out '{path}' exists and is not empty", "pass a new directory, or --overwrite")
        check_replaceable(path)


def _print_plan(plan) -> None:
    from .common import print_rows

    # the parameters derived from the window and the target (or given with --params); --json lists all of them
    rows = [{"candidate": c.label, "kind": c.kind, "parameters": ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in c.given.items()) or "searched"
        if c.kind == "search" else ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in c.given.items()) or "defaults",
        "serves as": ", ".join(c.exports) or "ropekit.load",
        "simplicity": c.simplicity_note} for c in plan.candidates]
    print_rows(rows, f"candidates for {plan.engine} at {plan.target_length:,} tokens (window {plan.window:,})")
    for e in plan.excluded:
        out.print(f"[dim]not a candidate:[/] {e['method']} — {e['why']}", soft_wrap=True, highlight=False)
    n_cost, w_cost = (plan.seconds_per_forward[str(k)] for k in (plan.target_length, plan.window))
    costs = (f"{n_cost:.3g} s measured at {plan.target_length} tokens, at most {w_cost:.3g} s at {plan.window} "
             f"(the {plan.window}/{plan.target_length} share)")
    measured = "; ".join(f"{task} at {', '.join(map(str, o['lengths']))} ({o.get('samples', o.get('trials'))} "
                         f"{'documents' if task == 'ppl' else 'prompts'})" for task, o in plan.evaluations.items())
    out.print(f"one forward pass: {costs}; evaluations: {measured}; estimated {plan.estimate_seconds / 60:.1f} min "
              f"of a {plan.budget_seconds / 60:.1f} min budget", soft_wrap=True, highlight=False)
    for note in plan.notes:
        out.print(f"note: {note}", soft_wrap=True, highlight=False)


def recommend_cmd(
    model: str = typer.Argument(..., help=MODEL_HELP),
    target_length: int = typer.Option(..., "--target-length", "-t", min=1, help="The context length to reach, in tokens."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Directory to write the chosen export, its card, "
                                 "recommendation.json and command.txt to (written whole or not at all)."),
    data: Optional[str] = typer.Option(None, "--data", help="Text to measure perplexity on (a file, directory or "
                                       "corpus ropekit eval ppl reads; default: the built-in held-out corpus)."),
    engine: str = typer.Option("transformers", "--engine", "-e", help="transformers, vllm or llamacpp: only methods "
                               "it serves as ropekit computes them are candidates."),
    budget: str = typer.Option("30m", "--budget", help="Time for the evaluations (e.g. 30m, 2h): sets the sample "
                               "counts from a measured forward pass."),
    train: bool = typer.Option(False, "--train", help="Also fine-tune the best frozen candidates with PoSE."),
    search: bool = typer.Option(False, "--search", help="Also search LongRoPE factors for the target length."),
    workers: Optional[int] = typer.Option(None, "--workers", "-w", min=1, help="Worker processes for the evaluations "
                                          "(default 1)."),
    params_file: Optional[Path] = typer.Option(None, "--params", help="YAML mapping METHOD: {param: value} that "
                                               "replaces derived parameters."),
    methods: Optional[str] = typer.Option(None, "--methods", help="Consider only these methods (comma-separated)."),
    plan_only: bool = typer.Option(False, "--plan", "--dry-run", help="Print the candidates, their parameters and "
                                   "the sample counts; evaluate and write nothing."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty --out directory."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan (--plan) or the recommendation as JSON."),
):
    """Choose the best extension method for MODEL at --target-length on evidence, export it for --engine, verify it."""
    if engine not in ENGINES:
        raise RopekitError(f"unknown engine '{engine}'", f"choose one of {', '.join(ENGINES)}")
    from ..study.recommend import parse_budget, read_params_file

    seconds = parse_budget(budget)
    overrides = read_params_file(params_file)
    only = split_list(methods)
    if only is not None and not only:
        raise RopekitError(f"--methods {methods!r} names no method", "name one or more, e.g. --methods yarn,self_extend")
    if only is not None:
        from .catalog import check as check_method

        for name in only:
            check_method(name, {})  # a typo: one line, before the model loads
    if plan_only:
        unused = [flag for flag, given in (("--overwrite", overwrite), ("--workers", workers is not None)) if given]
        if unused:  # --plan writes nothing and runs no evaluation: they would be silently unused
            raise RopekitError(f"{' and '.join(unused)} apply to the run; --plan only prints the candidates "
                               "(reading an earlier run's timing from --out)", f"drop {' and '.join(unused)}, or --plan")
    else:
        _check_out(out_dir, overwrite)
    # timed where the evidence study will run (its placement is "auto": a GPU's bfloat16 for a real model), or the
    # budget's sample counts would come from a float32 CPU forward on a machine that evaluates on its GPU
    loaded = load_model(model, device="auto", dtype="auto", attn="auto")
    from ..study.recommend import (TRAIN_TOP, make_plan, resume_plan, run_evidence, trained_candidates,
                                   work_dir_for)

    with err.status("measuring a forward pass…"):
        plan = make_plan(model, loaded.model, target_length, engine, seconds, data=data, overrides=overrides,
                         only=only, search=search, train=train, tokenizer=loaded.tokenizer,
                         work_root=work_dir_for(out_dir))
    del loaded
    if plan_only:
        if json_out:
            print_json(plan.as_dict())
        else:
            _print_plan(plan)
        return
    if not json_out:
        _print_plan(plan)
    started = time.perf_counter()
    work_root = work_dir_for(out_dir)
    plan, study_dir = resume_plan(plan, work_root)
    err.print(f"evidence study: {study_dir} (a rerun of this command resumes it)", highlight=False, soft_wrap=True)
    from ..study.recommend_output import write_recommendation
    from ..study.recommend_rule import decide

    records = run_evidence(plan, study_dir, workers=workers or 1, console=err)
    candidates = list(plan.candidates)
    verdict = decide(records, candidates, plan.window, plan.target_length)
    if train:
        by_label = {c.label: c for c in candidates}
        top = [by_label[label] for label in verdict.order if by_label[label].kind == "frozen"][:TRAIN_TOP]
        trained = trained_candidates(top)
        records = records + run_evidence(plan, study_dir, workers=workers or 1, console=err, trained=trained)
        candidates += trained
        verdict = decide(records, candidates, plan.window, plan.target_length)
    result = write_recommendation(plan, verdict, candidates, out_dir, study_dir,
                                  seconds=round(time.perf_counter() - started, 1), overwrite=overwrite,
                                  log=lambda text: err.print(text, highlight=False, soft_wrap=True))
    if json_out:
        print_json(result)
    else:
        out.print(f"[green]chosen[/] {result['chosen']} ({result['method']}) — wrote {out_dir}", highlight=False)
        if result["runner_up"]:
            out.print(f"runner-up {result['runner_up']}: {result['why'][result['runner_up']]}", soft_wrap=True,
                      highlight=False)
        out.print(f"serve it with: {result['command']}", soft_wrap=True, highlight=False)
        out.print(result["verify_line"], soft_wrap=True, highlight=False)
    checked = result["verify"]
    if checked.get("ran") and not checked.get("passed"):
        raise typer.Exit(1)
