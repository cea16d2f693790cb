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
    from .install import inspect_model

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
    from .install import extend, resolve_params, save_pretrained

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
def _task_options(task_name: str, run, given: dict[str, Any]) -> dict[str, Any]:
    """The options the user gave that ``run`` accepts; a one-line error for one that does not apply."""
    import inspect

    accepted = set(inspect.signature(run).parameters)
    for name in given:
        if name not in accepted:
            flag = "--" + name.replace("_", "-")
            raise RopekitError(f"{flag} does not apply to the '{task_name}' evaluation", "drop it (see `ropekit eval --help`)")
    return given


class _RichProgress:
    """A rich progress bar as :class:`ropekit.eval.common.ProgressSink`."""

    def __init__(self, bar, job):
        self.bar, self.job = bar, job

    def set_total(self, total: int) -> None:
        self.bar.update(self.job, total=total)

    def advance(self, n: int = 1, description: str | None = None) -> None:
        self.bar.update(self.job, advance=n, **({"description": description} if description else {}))


def _split_list(text: Optional[str]) -> Optional[list[str]]:
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def _float_list(text: Optional[str], flag: str) -> Optional[list[float]]:
    items = _split_list(text)
    if items is None:
        return None
    try:
        return [float(t) for t in items]
    except ValueError:
        raise RopekitError(f"{flag} '{text}' is not a comma-separated list of numbers", f"pass e.g. {flag} 0.1,0.5,0.9") from None


def _int_list(text: Optional[str], flag: str, minimum: int = 1) -> Optional[list[int]]:
    values = _float_list(text, flag)
    if values is None:
        return None
    if any(v != int(v) or v < minimum for v in values):
        raise RopekitError(f"{flag} '{text}' must be whole numbers ≥ {minimum}", f"pass e.g. {flag} {minimum},2,4,8")
    return [int(v) for v in values]


@app.command("eval")
def eval_cmd(
    task: str = typer.Argument(..., help="Evaluation task: ppl, passkey, niah, ruler, longbench, manyshot, entropy, speed, short."),
    model: str = typer.Argument(..., help="Local transformers directory, .gguf file, hub id, or a built-in name."),
    lengths: Optional[str] = typer.Option(None, "--lengths", "-l", help="Comma-separated lengths in tokens, e.g. 4k,16k."),
    method: Optional[str] = typer.Option(None, "--method", "-m", help="Method installed before evaluating (default: the model as it is)."),
    methods: Optional[str] = typer.Option(None, "--methods", help="speed: comma-separated methods, measured interleaved."),
    param: Optional[list[str]] = typer.Option(None, "--param", "-p", help="key=value for --method (speed: METHOD.key=value); repeatable."),
    depths: Optional[str] = typer.Option(None, "--depths", help="passkey/niah: needle depths in [0,1], e.g. 0.1,0.5,0.9."),
    trials: Optional[int] = typer.Option(None, "--trials", min=1, help="passkey/niah: trials per (length, depth)."),
    samples: Optional[int] = typer.Option(None, "--samples", min=1, help="ruler/longbench/manyshot/entropy/ppl: samples per length (or per task)."),
    subtasks: Optional[str] = typer.Option(None, "--tasks", help="ruler: task names; longbench: dataset names (comma-separated)."),
    data: Optional[Path] = typer.Option(None, "--data", help="ppl: corpus file/dir; longbench: directory of JSONL files; manyshot: labelled JSONL; ruler: dir with SQuAD/HotpotQA."),
    stride: Optional[int] = typer.Option(None, "--stride", min=1, help="ppl: how far the window advances (tokens)."),
    score_mode: Optional[str] = typer.Option(None, "--score-mode", help="ppl: last_stride | full_window | disjoint | truncate."),
    weighting: Optional[str] = typer.Option(None, "--weighting", help="ppl: token | window."),
    add_bos: Optional[bool] = typer.Option(None, "--add-bos/--no-add-bos", help="ppl: prepend BOS to every window."),
    shots: Optional[str] = typer.Option(None, "--shots", help="manyshot: numbers of in-context examples, e.g. 1,2,4,8,16."),
    chat: Optional[bool] = typer.Option(None, "--chat/--no-chat", help="ruler/longbench/niah: wrap prompts in the tokenizer's chat template (ruler: on by default when it has one; --no-chat forces the plain template)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="passkey/niah/entropy/ppl: write the figure (PNG) here."),
    decode_tokens: Optional[int] = typer.Option(None, "--decode-tokens", min=0, help="speed: decode steps timed after prefill."),
    repeats: Optional[int] = typer.Option(None, "--repeats", min=1, help="speed: repeats per (method, length); the median is reported."),
    seed: int = typer.Option(0, "--seed", help="Seed of every generated sample."),
    out_file: Optional[Path] = typer.Option(None, "--out", "-o", help="JSONL file: one record per scored sample, written as it finishes."),
    resume: bool = typer.Option(False, "--resume", help="Skip samples already in --out."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
):
    """Run an evaluation task and print its summary (records go to --out as they finish)."""
    from .eval import get_task
    from .eval.records import parse_lengths

    module = get_task(task)
    params = parse_params(param)
    if task == "speed":
        _eval_speed(model, lengths, method, methods, params, decode_tokens, repeats, seed, out_file, resume, json_out,
                    others={"depths": depths, "trials": trials, "samples": samples, "tasks": subtasks, "data": data,
                            "stride": stride, "score_mode": score_mode, "weighting": weighting, "add_bos": add_bos,
                            "shots": shots, "chat": chat, "plot": plot})
        return
    if methods is not None or decode_tokens is not None or repeats is not None:
        flag = "--methods" if methods is not None else "--decode-tokens" if decode_tokens is not None else "--repeats"
        raise RopekitError(f"{flag} applies only to the 'speed' evaluation", "use --method NAME for the other tasks")
    given = {
        "lengths": parse_lengths(lengths) if lengths is not None else None,
        "depths": _float_list(depths, "--depths"),
        "trials": trials,
        "samples": samples,
        "tasks": _split_list(subtasks),
        "data": str(data) if data is not None else None,
        "stride": stride,
        "score_mode": score_mode,
        "weighting": weighting,
        "add_bos": add_bos,
        "shots": _int_list(shots, "--shots", minimum=0),  # 0 = the zero-shot baseline
        "chat": chat,
        "plot": str(plot) if plot is not None else None,
    }
    given = _task_options(task, module.run, {k: v for k, v in given.items() if v is not None})
    if method is not None:
        from .methods import get_method

        get_method(method)  # an unknown name fails before the model loads
    loaded = _load(model)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from .eval.common import make_context

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=err, transient=True) as bar:
        job = bar.add_task(task, total=None)
        ctx = make_context(
            task, loaded.model, loaded.tokenizer, method=method, params=params,
            lengths=given.get("lengths") or getattr(module, "DEFAULT_LENGTHS", [loaded.model.config.max_position_embeddings]),
            key_fields=module.KEY_FIELDS, seed=seed, out=str(out_file) if out_file else None, resume=resume,
            progress=_RichProgress(bar, job),
        )
        module.run(ctx, **given)
    rows = module.summarize(list(ctx.writer.records()))
    if json_out:
        _print_json(rows)
        return
    label = ctx.method + (f" {json.dumps(ctx.params)}" if ctx.params else "")
    _print_rows(rows, title=f"{task} — {model} — {label}")
    if out_file:
        err.print(f"records: {out_file}")


def _print_rows(rows: list[dict[str, Any]], title: str) -> None:
    """A summary table whose columns are the rows' keys (numbers right-aligned, floats to 4 significant digits)."""
    table = Table(title=title)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    for col in columns:
        numeric = all(isinstance(r.get(col), (int, float)) or r.get(col) is None for r in rows)
        table.add_column(col, justify="right" if numeric else "left")
    for r in rows:
        table.add_row(*("—" if r.get(c) is None else f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in columns))
    out.print(table)


def _eval_speed(model, lengths, method, methods, params, decode_tokens, repeats, seed, out_file, resume, json_out, others):
    from .eval.records import parse_lengths
    from .eval.speed import parse_method_specs, run_speed

    for name, value in others.items():
        if value is not None:
            raise RopekitError(f"--{name.replace('_', '-')} does not apply to the 'speed' evaluation", "drop it")
    if lengths is None:
        raise RopekitError("the 'speed' evaluation needs --lengths", "pass e.g. --lengths 4k,16k")
    lengths_list = parse_lengths(lengths)
    method_list = (methods or method or "plain").split(",")
    parse_method_specs(method_list, params)  # validate names before loading anything
    loaded = _load(model)
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                  transient=True) as bar:
        job = bar.add_task("speed", total=None)
        rows = run_speed(
            loaded.model, methods=method_list, lengths=lengths_list, params=params, decode_tokens=8 if decode_tokens is None else decode_tokens,
            repeats=repeats or 1, seed=seed, out=str(out_file) if out_file else None, resume=resume,
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


# ---- train -----------------------------------------------------------------------------------------
def _train_examples(name: str, json_out: bool) -> None:
    from .train.examples import EXAMPLES, example_yaml

    if name.strip().lower() == "list":
        if json_out:
            _print_json([{"name": n, "description": d} for n, (d, _) in EXAMPLES.items()])
            return
        table = Table(title="ropekit train --example NAME")
        table.add_column("name", style="bold cyan", no_wrap=True)
        table.add_column("what it trains")
        for n, (d, _) in EXAMPLES.items():
            table.add_row(n, d)
        out.print(table)
        return
    sys.stdout.write(example_yaml(name))


def _train_plan_rows(cfg) -> list[dict[str, Any]]:
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    rows, start = [], 0
    for stage in cfg.stages:
        steps = stage.steps if cfg.stop_at is None else max(0, min(stage.steps, cfg.stop_at - start))
        batch = stage.micro_batch_size * stage.grad_accum * world
        rows.append({
            "stage": stage.name, "steps": f"{start + 1}–{start + steps}" if steps else "—", "seq_len": stage.seq_len,
            "method": stage.method.name or "none", "params": json.dumps(stage.method.params), "lr": stage.lr,
            "sequences/step": batch, "tokens/step": batch * stage.seq_len, "tokens": batch * stage.seq_len * steps,
        })
        start += stage.steps
    return rows


def _train_bench(model: Optional[str], multiples: Optional[str], steps: Optional[int], json_out: bool, others: dict) -> None:
    from .train.bench import pose_vs_full

    for flag, value in others.items():
        if value is not None:
            raise RopekitError(f"{flag} does not apply to `ropekit train bench`", "drop it")
    mult = _int_list(multiples, "--multiples") if multiples is not None else [2, 4, 8]
    with err.status("timing PoSE and full-length training steps…"):
        rows = pose_vs_full(model or "tiny", mult, steps=3 if steps is None else steps)
    if json_out:
        _print_json(rows)
        return
    cuda = any(r["peak_mib"] for r in rows)
    threads = "" if cuda else f", {rows[0]['threads']} CPU thread(s)"
    table = Table(title=f"PoSE vs full-length training steps — {model or 'tiny'}{threads}, "
                        f"median of {rows[0]['rounds']} interleaved rounds")
    columns = ("target", "mode", "seq len", "step s", "×", "activations MiB", "×") + (("peak MiB",) if cuda else ())
    for col in columns:
        table.add_column(col, justify="left" if col == "mode" else "right", no_wrap=True)
    for r in rows:
        target = str(r["target"]) if r["mode"] == "window" else f"{r['target']} ({r['multiple']}×)"
        table.add_row(target, r["mode"], str(r["seq_len"]), f"{r['step_s']:.4f}",
                      f"{r['ratio_step']:.2f}", f"{r['activation_mib']:.2f}", f"{r['ratio_activation']:.2f}",
                      *((f"{r['peak_mib']:.0f}",) if cuda else ()))
    table.caption = "× = relative to training at the window (first row); activations = tensors kept for backward"
    out.print(table)


@app.command("train")
def train_cmd(
    config: Optional[Path] = typer.Argument(None, help="Training config (YAML). Print one with --example NAME."),
    out_dir: Optional[Path] = typer.Option(None, "--out", "-o", help="Run directory (overrides output.dir)."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Optimizer steps (overrides train.max_steps; with stages: stop after N steps)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in the run directory."),
    example: Optional[str] = typer.Option(None, "--example", help="Print a ready config: NAME, or `list`."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate the config and print the plan; train nothing."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan / result (or --example list) as JSON."),
    bench_model: Optional[str] = typer.Option(None, "--model", help="bench: the model (default tiny)."),
    multiples: Optional[str] = typer.Option(None, "--multiples", help="bench: targets as multiples of the window (default 2,4,8)."),
):
    """Train a model for a longer context: method + data + optimizer from a YAML config (Accelerate; runs under
    `accelerate launch` for DDP/FSDP — on CPUs `accelerate launch --multi_gpu --num_processes N`).

    `ropekit train bench` instead times one PoSE training step at the window against full-length training at
    2×, 4×, 8× the window (--model, --multiples, --max-steps = timed steps)."""
    if config is not None and str(config) == "bench":
        _train_bench(bench_model, multiples, max_steps, json_out,
                     others={"--out": out_dir, "--resume": resume or None, "--example": example, "--dry-run": dry_run or None})
        return
    if bench_model is not None or multiples is not None:
        raise RopekitError("--model and --multiples apply only to `ropekit train bench`",
                           "the training config names the model (model.name)")
    if example is not None:
        if config is not None or resume or dry_run or out_dir is not None or max_steps is not None:
            raise RopekitError("--example prints a config and takes no other argument",
                               "run `ropekit train --example NAME > my.yaml`, then `ropekit train my.yaml`")
        _train_examples(example, json_out)
        return
    if config is None:
        raise RopekitError("no training config given", "pass CONFIG.yaml, e.g. from `ropekit train --example tiny-full > tiny.yaml`")
    from .train import load_config, train

    cfg = load_config(config).with_overrides(out_dir=out_dir, max_steps=max_steps)
    rows = _train_plan_rows(cfg)
    if dry_run:
        if json_out:
            _print_json({"config": cfg.to_dict(), "plan": rows})
            return
        table = Table(title=f"{config} — {cfg.model.name} — {cfg.last_step} steps",
                      caption=f"batch sizes for {int(os.environ.get('WORLD_SIZE', '1') or 1)} process(es) "
                              "(set WORLD_SIZE=N to plan an N-GPU launch)")
        def human(n: int) -> str:
            for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
                if n >= size:
                    return f"{n / size:.3g}{unit}"
            return str(n)

        for col in ("stage", "steps", "seq len", "method", "lr", "seqs", "tok/step", "tokens"):
            table.add_column(col, justify="left" if col in ("stage", "method") else "right", no_wrap=col != "method")
        for r in rows:
            params = " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in json.loads(r["params"]).items())
            table.add_row(r["stage"], r["steps"], f"{r['seq_len']:,}", f"{r['method']} {params}".strip(), f"{r['lr']:g}",
                          str(r["sequences/step"]), human(r["tokens/step"]), human(r["tokens"]))
        out.print(table)
        return
    cfg.require_output()
    result = train(cfg, resume=resume, console=err)
    if int(os.environ.get("RANK", "0") or 0) != 0:
        return
    last = result.losses[-1][1] if result.losses else None
    summary = {
        "out_dir": str(result.out_dir), "step": result.step, "resumed_from": result.resumed_from,
        "final_loss": last, "skipped_steps": result.skipped, "seconds": round(result.seconds, 2),
        "final": str(result.final_dir) if result.final_dir else None, "final_ema": str(result.ema_dir) if result.ema_dir else None,
    }
    if json_out:
        _print_json(summary)
        return
    loss = f", last loss {last:.4f}" if last is not None else ""
    out.print(f"[green]trained[/] {result.out_dir} to step {result.step}{loss} in {result.seconds:.1f}s"
              + (f"; model: {result.final_dir}" if result.final_dir else "")
              + (f"; EMA model: {result.ema_dir}" if result.ema_dir else ""), highlight=False)


# ---- pose-coverage ---------------------------------------------------------------------------------
@app.command("pose-coverage")
def pose_coverage_cmd(
    window: int = typer.Option(2048, "--window", "-w", help="Training window L_c in tokens (the paper's Fig. 5: 2048)."),
    target: int = typer.Option(16384, "--target", "-t", help="Target length L_t in tokens (the paper's Fig. 5: 16384)."),
    chunks: str = typer.Option("2,3", "--chunks", "-n", help="PoSE chunk counts, comma-separated."),
    scheme: str = typer.Option("both", "--scheme", help="pose | randpos | both (RandPos is PoSE's baseline)."),
    steps: int = typer.Option(10_000, "--steps", help="Sampled training examples per curve."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampler (example k is the dataset's item k of epoch 0)."),
    exact: str = typer.Option("auto", "--exact", help="Exact curves: auto (where cheap enough) | always | never."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the figure (PNG) here, as the paper's Fig. 5."),
    json_out: bool = typer.Option(False, "--json", help="Print the whole report (every curve) as JSON."),
):
    """How often each relative distance occurs in one training example: the original window, PoSE with
    N chunks, RandPos (PoSE paper, Appendix B, Fig. 5). Sampled with the training sampler itself, and exact
    where the enumeration is cheap (always for 2 chunks). Content offsets (uniform / zero / aligned) choose
    the text inside each chunk, not its positions, so they do not change coverage."""
    from .data.pose import plot_coverage, pose_coverage_report

    schemes = {"pose": (True, False), "randpos": (False, True), "both": (True, True)}
    if scheme not in schemes:
        raise RopekitError(f"--scheme '{scheme}' is not pose, randpos or both", "pass e.g. --scheme both")
    exact_modes = {"auto": "auto", "always": True, "never": False}
    if exact not in exact_modes:
        raise RopekitError(f"--exact '{exact}' is not auto, always or never", "pass e.g. --exact auto")
    if plot is not None and plot.suffix.lower() != ".png":
        raise RopekitError(f"--plot '{plot}' is not a .png file", "pass a path ending in .png")
    with_pose, with_randpos = schemes[scheme]
    chunk_list = _int_list(chunks, "--chunks") if with_pose else []
    with err.status("computing coverage…"):
        report = pose_coverage_report(window, target, chunks=chunk_list, steps=steps, seed=seed,
                                      randpos=with_randpos, exact=exact_modes[exact], pose=with_pose)
    if plot is not None:
        report["plot"] = plot_coverage(report, plot)
    if json_out:
        _print_json(report)
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


# ---- report ----------------------------------------------------------------------------------------
@app.command("report")
def report_cmd(
    study_dir: Path = typer.Argument(..., help="A study directory (holding study.sqlite)."),
    json_out: bool = typer.Option(False, "--json", help="Print the written paths as JSON."),
):
    """Write DIR/report/index.html (self-contained), summary.json, summary.md and figures from a study."""
    from .study import write_report

    paths = write_report(study_dir)
    if json_out:
        _print_json(paths)
        return
    out.print(f"[green]wrote[/] {paths['html']} (+ summary.json, summary.md, {len(paths['figures'])} figures)")


# ---- study ------------------------------------------------------------------------------------------
def _study_status(study_dir: Path, json_out: bool) -> None:
    from .study.store import DB_NAME, open_study

    if not (study_dir / DB_NAME).is_file():
        raise RopekitError(f"no study in '{study_dir}' (no {DB_NAME})", "pass the --out directory of a `ropekit study` run")
    with open_study(study_dir) as store:
        status = store.status()
        pieces = store.pieces()
        name = store.get_manifest("name")
    if json_out:
        _print_json({"study": name, **status, "pieces_detail": pieces})
        return
    by = status["by_status"]
    out.print(f"[bold]study {name}[/] in {study_dir}: {by['done']}/{status['pieces']} pieces done, "
              f"{by['running']} running, {by['failed']} failed, {by['pending']} pending; "
              f"{status['samples']} samples, {status['train_steps']} training steps, {status['seconds'] / 60:.1f} min of compute")
    table = Table()
    for col in ("piece", "status", "seconds", "note"):
        table.add_column(col, justify="right" if col == "seconds" else "left")
    colors = {"done": "green", "running": "cyan", "failed": "red", "pending": "dim"}
    for p in pieces:
        note = p["error"] or (p["worker"] if p["status"] == "running" else "")
        table.add_row(p["id"], f"[{colors[p['status']]}]{p['status']}[/]",
                      f"{p['seconds']:.1f}" if p["seconds"] is not None else "—", note or "")
    out.print(table)


@app.command("study")
def study_cmd(
    config: Optional[str] = typer.Argument(None, help="A study YAML file — or `status` followed by a study directory."),
    status_dir: Optional[Path] = typer.Argument(None, help="With `status`: the study directory."),
    preset: Optional[str] = typer.Option(None, "--preset", help="A built-in study: quick, smollm2, lceg-llama2-7b."),
    out_dir: Optional[Path] = typer.Option(None, "--out", "-o", help="Study directory (default: study-NAME); holds study.sqlite."),
    workers: int = typer.Option(1, "--workers", "-w", help="Worker processes sharing the pieces (threads split between them)."),
    show: bool = typer.Option(False, "--show", help="Print the config (a preset's YAML) and exit."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write the report when the study finishes."),
    json_out: bool = typer.Option(False, "--json", help="Print the final status (or `status`) as JSON."),
):
    """Run a controlled study (resumable: run it again to continue), then write its report.

    `ropekit study status DIR` shows the progress of a study.
    """
    if config == "status":
        target = status_dir or out_dir
        if target is None:
            raise RopekitError("`ropekit study status` needs the study directory", "run `ropekit study status DIR`")
        _study_status(target, json_out)
        return
    if status_dir is not None:
        raise RopekitError(f"unexpected argument '{status_dir}'", "give one study config (or `status DIR`)")
    from .study.config import load_study_config, preset_text

    if show:
        if preset is None:
            raise RopekitError("--show prints a preset", "add --preset NAME (e.g. --preset quick)")
        typer.echo(preset_text(preset), nl=False)  # raw: rich would wrap long lines and break the YAML
        return
    cfg = load_study_config(config, preset=preset)
    from .study.config import BUILTIN_BASE
    from .study.runner import run_study

    if cfg.model != BUILTIN_BASE:
        from .models.loading import resolve_model

        resolve_model(cfg.model)  # a missing path fails here, in one line, before a study directory exists

    study_dir = out_dir or Path(f"study-{cfg.name}")
    err.print(f"study [bold]{cfg.name}[/]: {len(cfg.variants)} variants × {len(cfg.evals)} evaluations → {study_dir}/study.sqlite")
    status = run_study(cfg, study_dir, workers=workers)
    paths = None
    if report:
        from .study import write_report

        paths = write_report(study_dir)
    if json_out:
        _print_json({"study": cfg.name, "dir": str(study_dir), **status, "report": paths})
    else:
        by = status["by_status"]
        out.print(f"[bold]study {cfg.name}[/]: {by['done']}/{status['pieces']} pieces done, {by['failed']} failed")
        for f in status["failed"]:
            out.print(f"  [red]failed[/] {f['piece']}: {f['error']}")
        if paths:
            out.print(f"report: {paths['html']}")
    if status["by_status"]["failed"]:
        raise typer.Exit(1)


@app.command("pretrain-base")
def pretrain_base_cmd(
    seed: int = typer.Option(0, "--seed", help="Seed of the tokenizer sample, the weights and the batches."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, help="Optimizer steps (default: the built-in setting)."),
    force: bool = typer.Option(False, "--force", help="Train again even when a cached model exists."),
    json_out: bool = typer.Option(False, "--json", help="Print the model directory and its training facts as JSON."),
):
    """Pre-train (or find cached) the study's built-in base model and print its directory."""
    from .runtime import quiet_transformers as quiet
    from .train.builtin_base import describe, pretrain_base

    with quiet():
        path = pretrain_base(seed, steps=steps, use_cache=not force)
    meta = describe(path)
    if json_out:
        _print_json({"path": str(path), **meta})
        return
    out.print(f"base model: {path}  (trained in {meta['train_seconds']:.0f} s on {meta['threads']} threads; "
              f"final loss {meta['final_loss']:.3f})")


# ---- demo ------------------------------------------------------------------------------------------
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


def main() -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2."""
    from .runtime.logs import silence_transformers

    silence_transformers()  # transformers' bars and warnings would bury ropekit's one-line messages
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
