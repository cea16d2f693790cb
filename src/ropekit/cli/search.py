"""``ropekit search``: LongRoPE's evolutionary search for a model's per-pair rescale factors."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import RopekitError
from .common import MODEL_HELP, AttnOpt, DeviceOpt, DtypeOpt, err, out, print_json, resolve_placement

BUILTIN_BASE = "builtin-base"


def search_cmd(
    model: str = typer.Argument(..., help=MODEL_HELP + f" `{BUILTIN_BASE}`: the study's built-in base model."),
    target_length: int = typer.Option(..., "--target-length", min=2, help="Tokens the searched factors are for."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Search directory (resumable: run again to continue)."),
    data: Optional[str] = typer.Option(None, "--data", help="Search documents (file, folder, dataset); default: the "
                                       "training split of the built-in base model's corpus."),
    evaluations: int = typer.Option(128, "--evaluations", min=1, help="Perplexity evaluations (the paper: about 1,300)."),
    workers: int = typer.Option(1, "--workers", min=1, help="Processes evaluating candidates in parallel."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the document choice and the evolution."),
    documents: int = typer.Option(4, "--documents", min=1, help="Search documents of the target length."),
    fixed_pairs: int = typer.Option(0, "--fixed-pairs", min=0, help="Rotary pairs (highest frequencies) kept at 1."),
    population: Optional[int] = typer.Option(None, "--population", min=4, help="Population (default: budget/4, at most 64)."),
    start_tokens: str = typer.Option("0", "--start-tokens", help="n̂, the first positions kept un-interpolated "
                                     "(LongRoPE §3.2): N (fixed), a,b,c (searched among them) or 'paper' (searched "
                                     "among 0,1,2,4,8,12,16,20,24,28,32,64,128,256 below the target)."),
    max_factor: Optional[float] = typer.Option(None, "--max-factor", help="The largest rescale factor λ tried "
                                               "(default: 1.25·s, LongRoPE's search space; at least s)."),
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
):
    """Search LongRoPE rescale factors for TARGET_LENGTH tokens and export the best as a native longrope model
    (with start tokens n̂ > 0: as rope type ropekit_longrope, which ropekit loads).

    Every evaluated candidate is stored as it finishes in OUT/search.sqlite; run the same command again after an
    interruption to continue (on any device, in the dtype it began in, on the same documents and weights: the
    database records their digests). The result: OUT/model (plain transformers loads it) and OUT/result.json, which
    records where the objectives were computed."""
    from ..models.loading import load_model, parameter_count, resolve_model
    from ..runtime import default_threads, quiet_transformers
    from ..search.longrope import (SearchSettings, SearchStore, check_candidates_install, check_search_dir,
                                   check_settings, parse_start_tokens, pool_evaluator, require_base_model, run_search,
                                   worker_init)

    starts = parse_start_tokens(start_tokens, target_length)  # a malformed value fails before any loading
    from ..data.corpora import unreadable_corpus

    if why := unreadable_corpus(data):
        # read only after the model loads and the search announces itself: said first instead
        raise RopekitError(f"--data '{data}' {why}",
                           "pass a file of documents, or leave --data out for the built-in corpus")
    if model == BUILTIN_BASE:
        from ..train.builtin_base import pretrain_base

        with quiet_transformers():
            path = str(pretrain_base())
    else:
        resolve_model(model)  # a missing path fails in one line before anything is written
        path = model
    from ..runtime.atomic import check_target

    check_target(out_dir, kind="dir")  # a file, a read-only place: one line before the model loads
    check_search_dir(out_dir)  # another run's model or result in the way: before the search, not after it
    settings = SearchSettings(model=model, target_length=target_length, evaluations=evaluations, seed=seed,
                              documents=documents, data=data, fixed_pairs=fixed_pairs, population=population,
                              start_tokens=starts, max_factor=max_factor)
    # the perplexities the search compares are computed where and in the dtype the evaluations would run
    plan = resolve_placement(device, dtype, attn, model_parameters=parameter_count(path) if dtype == "auto" else None)
    where = {"device": plan.device, "dtype": plan.dtype, "attn": plan.attn}
    if (out_dir / "search.sqlite").is_file():  # other settings or another dtype: one line before anything loads
        SearchStore(out_dir / "search.sqlite", settings, dtype=plan.dtype).close()
    with quiet_transformers(), err.status(f"loading {model} ({plan.device}, {plan.dtype}, {plan.attn})…"):
        loaded = load_model(path, device=plan.device, dtype=plan.dtype, attn_implementation=plan.attn)
    from ..install import rope_info

    require_base_model(loaded.model)
    info = rope_info(loaded.model)
    check_settings(settings, info.window, info.rotary_dim // 2)  # before the worker processes start
    check_candidates_install(loaded.model, settings, target_length / info.window)
    err.print(plan.describe(), highlight=False, soft_wrap=True)
    err.print(f"searching LongRoPE factors of {model} for {target_length:,} tokens: {evaluations} evaluations, "
              f"{workers} worker(s) → {out_dir}/search.sqlite")
    if workers == 1:
        result = run_search(loaded.model, loaded.tokenizer, settings, out_dir)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        threads = max(1, default_threads() // workers)
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=worker_init,
                                 initargs=(path, settings, threads, where)) as pool:
            result = run_search(loaded.model, loaded.tokenizer, settings, out_dir, evaluate=pool_evaluator(pool))
    if json_out:
        print_json(result)
        return
    seeds = ", ".join(f"{name} {value:.3f}" for name, value in result["seeds"].items() if value is not None)
    out.print(f"best perplexity at {target_length:,} tokens: {result['best']['perplexity']:.3f} "
              f"(closed forms: {seeds}); {result['evaluations']} candidates, {result['evaluated_here']} evaluated "
              f"in this run, {result['seconds']:.0f} s")
    out.print(f"long_factor: {', '.join(f'{v:g}' for v in result['best']['long_factor'])}")
    n_hat = result["best"]["start_tokens"]
    if n_hat or len(starts) > 1:
        out.print(f"start_tokens: {n_hat}")
    kind = "transformers longrope" if result["export"]["format"] == "native" else "ropekit_longrope: load with ropekit"
    out.print(f"model: {out_dir / 'model'} ({kind}; `ropekit eval ppl {out_dir / 'model'}` to measure it)")
