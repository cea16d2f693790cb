"""``ropekit train``: run a training config, print a ready one (``--example``), plan it (``--dry-run``), or
time PoSE against full-length training steps (``ropekit train bench``)."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from ..errors import RopekitError
from .common import err, int_list, out, print_json


def _world_size() -> int:
    """Processes of the launch (``accelerate launch`` sets WORLD_SIZE); the plan's batch sizes scale with it."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def _examples(name: str, json_out: bool) -> None:
    from ..train.examples import EXAMPLES, example_yaml

    if name.strip().lower() == "list":
        if json_out:
            print_json([{"name": n, "description": d} for n, (d, _) in EXAMPLES.items()])
            return
        table = Table(title="ropekit train --example NAME")
        table.add_column("name", style="bold cyan", no_wrap=True)
        table.add_column("what it trains")
        for n, (d, _) in EXAMPLES.items():
            table.add_row(n, d)
        out.print(table)
        return
    sys.stdout.write(example_yaml(name))  # raw: the YAML is meant to be redirected into a file


def _plan_rows(cfg) -> list[dict[str, Any]]:
    """One row per stage: the steps it covers (after --max-steps), its sequence length, method and batch."""
    world = _world_size()
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


def _human(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def _print_plan(config: Path, cfg, rows: list[dict[str, Any]]) -> None:
    table = Table(title=f"{config} — {cfg.model.name} — {cfg.last_step} steps",
                  caption=f"batch sizes for {_world_size()} process(es) (set WORLD_SIZE=N to plan an N-GPU launch)")
    for col in ("stage", "steps", "seq len", "method", "lr", "seqs", "tok/step", "tokens"):
        table.add_column(col, justify="left" if col in ("stage", "method") else "right", no_wrap=col != "method")
    for r in rows:
        params = " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in json.loads(r["params"]).items())
        table.add_row(r["stage"], r["steps"], f"{r['seq_len']:,}", f"{r['method']} {params}".strip(), f"{r['lr']:g}",
                      str(r["sequences/step"]), _human(r["tokens/step"]), _human(r["tokens"]))
    out.print(table)


def _refuse_unused(subcommand: Optional[str], flags: dict, hint: str = "drop it") -> None:
    """One line for the first flag given (not None) that ``subcommand`` (None: a training run) would ignore."""
    where = f"`ropekit train {subcommand}`" if subcommand else "a training run"
    for flag, value in flags.items():
        if value is not None:
            raise RopekitError(f"{flag} does not apply to {where}", hint)


def _bench(model: Optional[str], multiples: Optional[str], steps: Optional[int], json_out: bool, others: dict) -> None:
    from ..train.bench import pose_vs_full

    _refuse_unused("bench", others)
    mult = int_list(multiples, "--multiples") if multiples is not None else [2, 4, 8]
    with err.status("timing PoSE and full-length training steps…"):
        rows = pose_vs_full(model or "tiny", mult, steps=3 if steps is None else steps)
    if json_out:
        print_json(rows)
        return
    cuda = any(r["peak_mib"] for r in rows)  # CPU tensors have no allocator peak: the column would be all zeros
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


def _plan(config: Optional[Path], gpus: int, gpu_memory: float, strategy: str, context_parallel: Optional[int],
          json_out: bool) -> None:
    from ..train import load_config
    from ..train.plan import GIB, plan_memory

    if config is None:
        raise RopekitError("`ropekit train plan` needs a training config", "run `ropekit train plan CONFIG.yaml --gpus 8 --gpu-memory 80`")
    if not math.isfinite(gpu_memory):
        raise RopekitError(f"--gpu-memory {gpu_memory} is not a finite number of GiB", "pass e.g. --gpu-memory 80")
    cfg = load_config(config)
    # the recipe's own split (train.context_parallel) unless --context-parallel asks for another
    split = context_parallel if context_parallel is not None else cfg.train.context_parallel
    plan = plan_memory(cfg, gpus=gpus, gpu_memory_gib=gpu_memory, strategy=strategy, context_parallel=split)
    if json_out:
        print_json(plan.as_dict())
        return
    gib = lambda n: f"{n / GIB:,.2f}"  # noqa: E731
    table = Table(title=f"{config} — {plan.model}: {plan.parameters / 1e9:.2f}B parameters "
                        f"({plan.trainable / 1e9:.3g}B trained), {plan.gpus} GPU(s), {plan.strategy}"
                        + (f", context parallel {plan.context_parallel}" if plan.context_parallel > 1 else ""))
    table.add_column("per GPU")
    table.add_column("GiB", justify="right")
    mode = "checkpointed" if plan.checkpointing else "not checkpointed"
    if cfg.model.gradient_checkpointing == "auto":
        mode += " (auto)"
    rows = [("weights", plan.weights), ("gradients", plan.gradients), ("optimizer (AdamW)", plan.optimizer),
            ("activations, saved for backward", plan.activations),
            ("activations, checkpointed", plan.activations_checkpointed)]
    if plan.checkpointing:
        rows.append(("one layer recomputed in backward", plan.recompute))
    rows += [("logits, forward (logits + float32 log-softmax)", plan.logits_forward),
             ("logits, backward (3 float32 buffers)", plan.logits_backward),
             (f"forward peak (activations {mode} + logits)", plan.forward),
             (f"backward peak (activations {mode} + logits' backward)", plan.backward)]
    for name, value in rows:
        table.add_row(name, gib(value))
    table.add_row(f"[bold]total[/] = weights + gradients + optimizer + {plan.peak_phase} peak", f"[bold]{gib(plan.total)}[/]")
    verdict = "[green]fits[/]" if plan.fits else "[red]does not fit[/]"
    table.caption = f"{plan.tokens_per_gpu:,} tokens per GPU; {verdict} in {gib(plan.gpu_bytes)} GiB"
    out.print(table)


def train_cmd(
    config: Optional[Path] = typer.Argument(None, help="Training config (YAML). Print one with --example NAME."),
    plan_config: Optional[Path] = typer.Argument(None, hidden=True),
    out_dir: Optional[Path] = typer.Option(None, "--out", "-o", help="Run directory (overrides output.dir)."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Optimizer steps (overrides train.max_steps; with stages: stop after N steps)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in the run directory."),
    example: Optional[str] = typer.Option(None, "--example", help="Print a ready config: NAME, or `list`."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate the config and print the plan; train nothing (data files are checked to exist and hold something, not read: a malformed record is found when training reads it)."),
    json_out: bool = typer.Option(False, "--json", help="Print the plan / result (or --example list) as JSON."),
    bench_model: Optional[str] = typer.Option(None, "--model", help="bench: the model (default tiny)."),
    multiples: Optional[str] = typer.Option(None, "--multiples", help="bench: targets as multiples of the window (default 2,4,8)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", min=1, help="plan: number of GPUs (default 1)."),
    gpu_memory: Optional[float] = typer.Option(None, "--gpu-memory", min=1.0, help="plan: memory per GPU in GiB (default 80)."),
    strategy: Optional[str] = typer.Option(None, "--strategy", help="plan: ddp, fsdp (default), zero1, zero2 or zero3."),
    context_parallel: Optional[int] = typer.Option(None, "--context-parallel", min=1,
                                                   help="plan: GPUs one sequence is split across (default: the recipe's train.context_parallel)."),
):
    """Train a model for a longer context: method + data + optimizer from a YAML config.

    Runs on Accelerate: one process, or under `accelerate launch` for DDP (on CPUs `accelerate launch
    --multi_gpu --num_processes N`), FSDP2 or DeepSpeed ZeRO-2/3 (`--config_file
    configs/train/accelerate-{fsdp2,zero2,zero3}.yaml`; on CPUs float32 only).

    `ropekit train bench` instead times one PoSE training step at the window against full-length training at
    2×, 4×, 8× the window (--model, --multiples, --max-steps = timed steps). `ropekit train plan CONFIG --gpus N
    --gpu-memory GiB` prints the bytes per GPU (weights, gradients, optimizer, activations, logits in the forward and backward
    passes, the peak) and whether they fit."""
    planning = {"--gpus": gpus, "--gpu-memory": gpu_memory, "--strategy": strategy, "--context-parallel": context_parallel}
    if config is not None and str(config) == "plan":
        _refuse_unused("plan", {"--out": out_dir, "--max-steps": max_steps, "--resume": resume or None,
                                "--example": example, "--dry-run": dry_run or None, "--model": bench_model,
                                "--multiples": multiples})
        _plan(plan_config, gpus or 1, gpu_memory or 80.0, strategy or "fsdp", context_parallel, json_out)
        return
    # the planner's flags change nothing in a training run, so a user who reads them as "train on 8 GPUs"
    # must be told, not left with a one-process run
    _refuse_unused(None, planning, hint="those flags size `ropekit train plan CONFIG`; to train on N GPUs, run "
                   "`accelerate launch --num_processes N -m ropekit.cli train CONFIG` (FSDP or ZeRO: "
                   "--config_file configs/train/accelerate-{fsdp2,zero2,zero3}.yaml)")
    if plan_config is not None:
        raise RopekitError(f"unexpected argument '{plan_config}'", "pass one training config")
    if config is not None and str(config) == "bench":
        _bench(bench_model, multiples, max_steps, json_out,
               others={"--out": out_dir, "--resume": resume or None, "--example": example, "--dry-run": dry_run or None})
        return
    if bench_model is not None or multiples is not None:
        raise RopekitError("--model and --multiples apply only to `ropekit train bench`",
                           "the training config names the model (model.name)")
    if example is not None:
        if config is not None or resume or dry_run or out_dir is not None or max_steps is not None:
            raise RopekitError("--example prints a config and takes no other argument",
                               "run `ropekit train --example NAME > my.yaml`, then `ropekit train my.yaml`")
        if json_out and example.strip().lower() != "list":  # a config is printed as YAML, the file to train from
            raise RopekitError("--json applies to `--example list`; --example NAME prints the config as YAML",
                               "drop --json, or pass --example list")
        _examples(example, json_out)
        return
    if config is None:
        raise RopekitError("no training config given", "pass CONFIG.yaml, e.g. from `ropekit train --example tiny-full > tiny.yaml`")
    from ..train import load_config, train

    cfg = load_config(config).with_overrides(out_dir=out_dir, max_steps=max_steps)
    warmup = cfg.train.warmup_steps
    notes = []
    if max_steps is not None and cfg.train.schedule != "constant" and warmup >= min(s.steps for s in cfg.stages):
        # a config with these numbers is refused; a shortened run (a smoke test) is allowed, but not silently
        notes.append(f"note: --max-steps {max_steps} ends before the {warmup}-step warm-up does: the learning rate "
                     f"stays below its peak {cfg.train.lr:g} for the whole run")
    from ..models.loading import require_reachable
    from ..runtime.atomic import check_target

    # what the run would refuse before training, the dry run refuses too: it validates, then plans
    if cfg.output.dir or not dry_run:  # a dry run may plan a config that leaves output.dir to --out
        from ..train.trainer import check_resume

        check_target(cfg.require_output(), what="output.dir", kind="dir")  # a file, a read-only place: one line
        # an earlier run, someone else's files; with --resume, a checkpoint made with another config
        check_resume(cfg.require_output(), cfg, resume, own_files=[config])
    from ..train.data import require_local_sources

    require_local_sources(cfg)
    if cfg.model.name != "tiny-pretrained":  # built here on first use
        require_reachable(cfg.model.name)  # a missing path, or a hub id not cached on an offline machine
    if dry_run:
        for note in notes:
            err.print(note, highlight=False, soft_wrap=True)
        rows = _plan_rows(cfg)
        if json_out:
            print_json({"config": cfg.to_dict(), "plan": rows})
        else:
            _print_plan(config, cfg, rows)
        return
    result = train(cfg, resume=resume, console=err, notes=notes, own_files=[config])  # said after the run's own checks
    if int(os.environ.get("RANK", "0") or 0) != 0:
        return  # under a multi-process launch only rank 0 reports
    last = result.losses[-1][1] if result.losses else None
    summary = {
        "out_dir": str(result.out_dir), "step": result.step, "resumed_from": result.resumed_from,
        "final_loss": last, "skipped_steps": result.skipped, "seconds": round(result.seconds, 2),
        "final": str(result.final_dir) if result.final_dir else None, "final_ema": str(result.ema_dir) if result.ema_dir else None,
    }
    if json_out:
        print_json(summary)
        return
    loss = f", last loss {last:.4f}" if last is not None else ""
    out.print(f"[green]trained[/] {result.out_dir} to step {result.step}{loss} in {result.seconds:.1f}s"
              + (f"; model: {result.final_dir}" if result.final_dir else "")
              + (f"; EMA model: {result.ema_dir}" if result.ema_dir else ""), highlight=False)
