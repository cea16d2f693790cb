"""The ``ropekit`` command line.

Every user mistake ends as one line on stderr (``error: <problem>. <fix>.``) and exit code 2, before
anything is written. ``--json`` prints machine-readable output on stdout.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from typer.exceptions import TyperException
from rich.console import Console
from rich.table import Table

from .errors import InvalidParameterError, RopekitError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Extend, train and measure the context window of RoPE language models.",
    rich_markup_mode="rich",
)
out = Console()
err = Console(stderr=True)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def parse_params(items: list[str] | None) -> dict[str, str]:
    """``["key=value", ...]`` → dict; values stay strings (each method's Param converts and validates them)."""
    params: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not value.strip():
            raise InvalidParameterError(f"--param '{item}' is not of the form key=value", "pass e.g. --param beta_fast=32")
        if key in params:
            raise InvalidParameterError(f"--param '{key}' given twice", "pass each parameter once")
        params[key] = value.strip()
    return params


# ---- methods ---------------------------------------------------------------------------------------
@app.command("methods")
def methods_cmd(json_out: bool = typer.Option(False, "--json", help="Print the registry as JSON.")):
    """List every context-extension method with its parameters and defaults."""
    from .methods import list_methods

    described = [m.describe() for m in list_methods()]
    if json_out:
        _print_json(described)
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


# ---- inspect ---------------------------------------------------------------------------------------
def _load(model: str):
    from .models.loading import load_model

    with err.status(f"loading {model}…"):
        return load_model(model)


@app.command("inspect")
def inspect_cmd(
    model: str = typer.Argument(..., help="Local transformers directory, .gguf file, hub id, or a built-in name (tiny)."),
    json_out: bool = typer.Option(False, "--json", help="Print the facts as JSON."),
):
    """Show a model's architecture, RoPE settings and which methods apply."""
    from .patching import inspect_model

    loaded = _load(model)
    facts = inspect_model(loaded.model)
    facts["source"] = {"kind": loaded.source, "path": str(loaded.path)}
    if json_out:
        _print_json(facts)
        return
    table = Table(title=f"{model}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for key in ("architecture", "model_type", "rope_type", "rope_theta", "window", "head_dim", "rotary_dim",
                "num_layers", "num_heads", "num_kv_heads", "parameters", "attn_implementation"):
        value = facts[key]
        table.add_row(key, f"{value:,}" if isinstance(value, int) and key == "parameters" else str(value))
    if facts["extended_with"]:
        ext = facts["extended_with"]
        table.add_row("extended with", f"{ext['method']} {json.dumps(ext['params'])}")
        if ext.get("reach"):
            table.add_row("reach", f"{ext['reach']:,} tokens (inputs past it are outside what the method covers)")
    out.print(table)
    methods = Table(title="methods")
    methods.add_column("method", style="cyan")
    methods.add_column("applies")
    methods.add_column("exports to")
    for m in facts["methods"]:
        methods.add_row(m["name"], "yes" if m["applies"] else f"no: {m['why_not']}", ", ".join(m["exports_to"]) or "ropekit only")
    out.print(methods)


# ---- extend ----------------------------------------------------------------------------------------
def _check_out_dir(path: Path, overwrite: bool) -> None:
    if path.exists() and not path.is_dir():
        raise RopekitError(f"--out '{path}' exists and is a file", "pass a directory path")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise RopekitError(f"--out '{path}' exists and is not empty", "pass a new directory, or --overwrite")


@app.command("extend")
def extend_cmd(
    model: str = typer.Argument(..., help="Local transformers directory, .gguf file, hub id, or a built-in name (tiny)."),
    method: str = typer.Option(..., "--method", "-m", help="Method name (see `ropekit methods`)."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Directory to write the extended model to."),
    factor: Optional[float] = typer.Option(None, "--factor", "-f", help="Scale factor s (target = s × window)."),
    target_length: Optional[int] = typer.Option(None, "--target-length", "-t", help="Target context length in tokens."),
    param: Optional[list[str]] = typer.Option(None, "--param", "-p", help="Method parameter key=value (repeatable)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Allow writing into a non-empty --out directory."),
    json_out: bool = typer.Option(False, "--json", help="Print the export report as JSON."),
):
    """Install a method into a model and save it (plain-transformers loadable wherever possible)."""
    from .patching import extend, resolve_params, save_pretrained

    params = parse_params(param)
    _check_out_dir(out_dir, overwrite)
    loaded = _load(model)
    # Validate everything before anything is written.
    resolve_params(loaded.model, method, factor=factor, target_length=target_length, **params)
    extend(loaded.model, method, factor=factor, target_length=target_length, **params)
    report = save_pretrained(loaded.model, out_dir, tokenizer=loaded.tokenizer)
    report["source"] = {"kind": loaded.source, "path": str(loaded.path)}
    report["params"] = loaded.model.config.ropekit["params"]
    if json_out:
        _print_json(report)
        return
    out.print(f"[green]wrote[/] {out_dir} — {report['method']} {json.dumps(report['params'])}")
    if report["transformers"]:
        out.print(f"plain transformers loads it as rope_type '{report['rope_parameters']['rope_type']}'"
                  + (" and vLLM can serve it" if report["vllm"] else " (vLLM: not the same model)"))
    else:
        out.print("ropekit-only method: load it with [bold]ropekit.load(path)[/] (plain transformers refuses it loudly)")


# ---- eval ------------------------------------------------------------------------------------------
@app.command("eval")
def eval_cmd(
    task: str = typer.Argument(..., help="Evaluation task (speed)."),
    model: str = typer.Argument(..., help="Local transformers directory, .gguf file, hub id, or a built-in name."),
    lengths: str = typer.Option(..., "--lengths", "-l", help="Comma-separated lengths, e.g. 4k,16k."),
    methods: str = typer.Option("plain", "--methods", help="speed: comma-separated methods, measured interleaved."),
    param: Optional[list[str]] = typer.Option(None, "--param", "-p", help="METHOD.key=value (repeatable)."),
    decode_tokens: int = typer.Option(8, "--decode-tokens", min=0, help="speed: decode steps timed after prefill."),
    repeats: int = typer.Option(1, "--repeats", min=1, help="Repeats per (method, length); the median is reported."),
    seed: int = typer.Option(0, "--seed", help="Seed of the generated inputs."),
    out_file: Optional[Path] = typer.Option(None, "--out", "-o", help="JSONL file: one record per measurement."),
    resume: bool = typer.Option(False, "--resume", help="Skip records already in --out."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
):
    """Run an evaluation task and print its summary (records go to --out as they finish)."""
    from .eval import TASKS
    from .eval.records import parse_lengths

    if task not in TASKS:
        raise RopekitError(f"unknown evaluation task '{task}'", f"choose one of: {', '.join(TASKS)}")
    lengths_list = parse_lengths(lengths)
    params = parse_params(param)
    from .eval.speed import parse_method_specs, run_speed

    parse_method_specs(methods.split(","), params)  # validate names before loading anything
    loaded = _load(model)
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                  transient=True) as bar:
        job = bar.add_task("speed", total=None)
        rows = run_speed(
            loaded.model, methods=methods.split(","), lengths=lengths_list, params=params, decode_tokens=decode_tokens,
            repeats=repeats, seed=seed, out=str(out_file) if out_file else None, resume=resume,
            progress=lambda text: bar.update(job, description=text),
        )
    if json_out:
        _print_json(rows)
        return
    table = Table(title=f"speed — {model} ({torch_threads()} CPU threads)" if loaded.model.device.type == "cpu" else f"speed — {model}")
    for col in ("length", "method", "prefill s", "× plain", "decode s/token", "× plain", "peak MiB", "× plain"):
        table.add_column(col, justify="left" if col == "method" else "right", no_wrap=col == "method")
    for r in rows:
        table.add_row(
            str(r["length"]), r["method"], f"{r['prefill_s']:.3f}", _ratio(r.get("prefill_ratio")),
            f"{r['decode_s_per_token']:.4f}", _ratio(r.get("decode_ratio")),
            f"{r['peak_mem_bytes'] / 2**20:.0f}", _ratio(r.get("memory_ratio")),
        )
    out.print(table)


def _ratio(value) -> str:
    return "—" if value is None else f"{value:.2f}"


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# ---- demo (main job until the study lands) ---------------------------------------------------------
@app.command("demo")
def demo_cmd(
    method: Optional[str] = typer.Option(None, "--method", "-m", help="Only this method (plus the base model)."),
    json_out: bool = typer.Option(False, "--json", help="Print the table as JSON."),
):
    """Train (or load) the built-in tiny Llama and compare next-token loss at 1×, 2×, 4× its window."""
    from .demo import main as demo_main

    rows = demo_main(method=method, json_out=json_out)
    if json_out:
        _print_json(rows)


def _quiet_transformers() -> None:
    """transformers' own progress bars and warnings would bury ropekit's one-line messages."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def main() -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2."""
    _quiet_transformers()
    try:
        app(standalone_mode=False)
    except RopekitError as e:
        err.print(f"[bold red]error:[/] {e.one_line()}", highlight=False, soft_wrap=True)
        raise SystemExit(e.exit_code) from None
    except typer.Exit as e:
        raise SystemExit(e.exit_code) from None
    except typer.Abort:
        err.print("aborted")
        raise SystemExit(130) from None
    except Exception as e:  # click usage errors and anything unexpected
        if isinstance(e, TyperException) or hasattr(e, "format_message"):  # typer's vendored click errors
            message = e.format_message().strip()
            if message:  # empty when help was already printed (no arguments)
                err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
            raise SystemExit(getattr(e, "exit_code", 2) or 2) from None
        if os.environ.get("ROPEKIT_DEBUG"):
            raise
        err.print(f"[bold red]internal error:[/] {type(e).__name__}: {e} (set ROPEKIT_DEBUG=1 for the traceback)",
                  highlight=False, soft_wrap=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
