"""``ropekit eval TASK MODEL …``: one command per evaluation task, each declaring only the options its task
takes, so ``ropekit eval TASK --help`` shows exactly what applies.

Every task takes MODEL, ``--lengths``, ``--method``, ``--param``, ``--seed``, ``--out``, ``--resume`` and
``--json``; ``speed`` measures several methods against the plain model in one run (``--methods``) and
has its own runner. The tasks are those of :data:`ropekit.eval.TASKS`.

The command line is the one of the single ``eval`` command this group replaced:

* options may come before the task name (``ropekit eval --lengths 4k ppl MODEL``); click groups refuse
  that, so :class:`_EvalGroup` moves the task name to the front before parsing;
* another task's flag is refused as "does not apply to the 'TASK' evaluation" (one line, exit code 2),
  and an unknown task with the registry's own message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table
from typer.core import TyperGroup

from ..errors import RopekitError
from ..runtime.atomic import check_figure_target
from .common import (MODEL_HELP, AttnOpt, Command, DeviceMapOpt, DeviceOpt, DtypeOpt, TaskProgress, err, float_list, int_list, load_model, out, parse_params,
                     print_json, print_rows, split_list)


def _options(command) -> dict[str, bool]:
    """Every spelling of ``command``'s options (``--chat`` and ``--no-chat`` alike) → whether it takes a value."""
    found = {}
    for param in command.params:
        if param.param_type_name == "option":
            for name in (*param.opts, *param.secondary_opts):
                found[name] = not param.is_flag
    return found


class _EvalGroup(TyperGroup):
    """The ``eval`` group: the task name may follow options, and an unknown task gets the registry's error."""

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, self._task_first(list(args)))

    def _task_first(self, args: list[str]) -> list[str]:
        """``args`` with the first positional word (the task) moved to the front, skipping the options before
        it and their values, which the task's command then parses as if they followed it."""
        if not args or not args[0].startswith("-"):
            return args
        takes_value = {name: value for command in self.commands.values() for name, value in _options(command).items()}
        i = 0
        while i < len(args):
            token = args[i]
            if token == "--":
                break
            if not token.startswith("-"):
                return [token, *args[:i], *args[i + 1:]]
            i += 2 if takes_value.get(token, False) else 1  # "--opt=value" and "-l4k" are one token
        if "--help" in args:
            return args
        from ..eval import TASKS

        raise RopekitError("no evaluation task given", f"run `ropekit eval TASK MODEL …` with TASK one of: {', '.join(TASKS)}")

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            from ..eval import get_task

            get_task(args[0])  # an unknown name raises here, naming every task
        return super().resolve_command(ctx, args)


class _TaskCommand(Command):
    """One task's command: a flag that only other tasks take is refused with the tasks it belongs to."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except typer.TyperException as e:
            flag = getattr(e, "option_name", None)  # click's "no such option", but also "--x needs a value"
            siblings = ctx.parent.command.commands if ctx.parent is not None else {}
            owners = [name for name, command in siblings.items() if flag in _options(command)]
            if flag is None or flag in _options(self) or not owners:
                raise
            raise RopekitError(f"{flag} does not apply to the '{ctx.info_name}' evaluation (only to {', '.join(owners)})",
                               f"drop it (see `ropekit eval {ctx.info_name} --help`)") from None


eval_app = typer.Typer(
    cls=_EvalGroup,
    add_completion=False,
    no_args_is_help=True,
    subcommand_metavar="TASK MODEL [OPTIONS]",
    rich_markup_mode="rich",
    help="Run an evaluation task and print its summary (records go to --out as they finish).\n\n"
         "`ropekit eval TASK MODEL --lengths 4k,8k …`; `ropekit eval TASK --help` lists the options of one task.",
)


def _task(name: str):
    """Register the decorated function as the command of task ``name``."""
    return eval_app.command(name, cls=_TaskCommand)


# ---- the options every task takes ------------------------------------------------------------------
Model = Annotated[str, typer.Argument(help=MODEL_HELP)]
Lengths = Annotated[Optional[str], typer.Option("--lengths", "-l", help="Comma-separated lengths in tokens, e.g. 4k,16k.")]
WindowLengths = Annotated[Optional[str], typer.Option("--lengths", "-l", help="Comma-separated lengths in tokens, e.g. "
                                                      "4k,16k (default: the model's window; with --method, the extended one).")]
Method = Annotated[Optional[str], typer.Option("--method", "-m", help="Method installed before evaluating (default: the model as it is).")]
Params = Annotated[Optional[list[str]], typer.Option("--param", "-p", help="key=value for --method; repeatable.")]
Seed = Annotated[int, typer.Option("--seed", min=0, help="Seed of every generated sample (a whole number ≥ 0).")]
Out = Annotated[Optional[Path], typer.Option("--out", "-o", help="JSONL file: one record per scored sample, written as it finishes.")]
Resume = Annotated[bool, typer.Option("--resume", help="Skip samples already in --out.")]
Json = Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")]

# ---- options of several tasks ----------------------------------------------------------------------
Depths = Annotated[Optional[str], typer.Option("--depths", help="Needle depths in [0,1], e.g. 0.1,0.5,0.9.")]
Trials = Annotated[Optional[int], typer.Option("--trials", min=1, help="Trials per (length, depth).")]
Heatmap = Annotated[Optional[Path], typer.Option("--plot", help="Write the heatmap (PNG) here.")]
Chat = Annotated[Optional[bool], typer.Option("--chat/--no-chat", help="Wrap prompts in the tokenizer's chat template.")]

#: How an option's command-line text becomes the value the task's ``run()`` takes (others pass as given).
_CONVERT = {
    "depths": lambda text: float_list(text, "--depths"),
    "tasks": split_list,
    "shots": lambda text: int_list(text, "--shots", minimum=0),  # 0 = the zero-shot baseline
    "data": str,
    "plot": str,
}


#: Options that choose which samples run (each sample's key says which it is) rather than change a sample: a resume
#: may widen or narrow them. The others (chat, generation budget, data, sampling…) are recorded and must match.
_SELECTING = frozenset({"lengths", "samples", "tasks", "trials", "depths", "shots", "plot"})


def _accepted(task: str, run, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` when ``run`` takes every option in it; a one-line error otherwise.

    The commands below declare only their task's options, so this fires only when a task's ``run()`` has
    dropped an option its command still offers: one line instead of a TypeError.
    """
    import inspect

    accepted = set(inspect.signature(run).parameters)
    for name in given:
        if name not in accepted:
            flag = "--" + name.replace("_", "-")
            raise RopekitError(f"{flag} does not apply to the '{task}' evaluation", f"drop it (see `ropekit eval {task} --help`)")
    return given


def _resume_needs_out(resume: bool, out_file: Optional[Path]) -> None:
    if resume and out_file is None:  # nothing to resume from: the run would silently start over
        raise RopekitError("--resume continues the results file given with --out", "add --out FILE.jsonl, or drop --resume")


def _run(task: str, model: str, lengths: Optional[str], method: Optional[str], param: Optional[list[str]], seed: int,
         out_file: Optional[Path], resume: bool, json_out: bool, placement: tuple = ("auto", "auto", "auto", None),
         **options: Any) -> None:
    """Run ``task`` on MODEL with the options given (None = not given: the task's default), then print its summary."""
    from ..eval import get_task
    from ..eval.records import parse_lengths

    module = get_task(task)
    _resume_needs_out(resume, out_file)
    params = parse_params(param)
    given: dict[str, Any] = {"lengths": parse_lengths(lengths) if lengths is not None else None}
    given.update({name: _CONVERT.get(name, lambda value: value)(value) for name, value in options.items() if value is not None})
    given = _accepted(task, module.run, {k: v for k, v in given.items() if v is not None})
    if method is not None:
        from ..methods import get_method

        get_method(method)  # an unknown name fails before the model loads
    module.check_options(**given)  # before the model loads
    if given.get("plot") is not None:
        check_figure_target(given["plot"])  # before the work, not after it
    loaded = load_model(model, *placement)
    from ..eval.common import make_context
    from ..runtime.progress import progress

    with progress(task, console=err) as shown:
        ctx = make_context(
            task, loaded.model, loaded.tokenizer, method=method, params=params,
            lengths=given.get("lengths") or getattr(module, "DEFAULT_LENGTHS", [loaded.model.config.max_position_embeddings]),
            key_fields=module.KEY_FIELDS, seed=seed, out=str(out_file) if out_file else None, resume=resume,
            progress=TaskProgress(shown),
            # the model as named: a results file resumed with another model would report the first one's samples
            options={"model": model, **{k: v for k, v in given.items() if k not in _SELECTING}},
        )
        module.run(ctx, **given)
    # this run's method and parameters only: a results file resumed with several methods holds the others too, and
    # the RULER, LongBench and many-shot summaries group by length and task alone
    rows = module.summarize(ctx.own_records())
    if json_out:
        print_json(rows)
        return
    label = ctx.method + (f" {json.dumps(ctx.params)}" if ctx.params else "")
    print_rows(rows, title=f"{task} — {model} — {label}")
    if out_file:
        err.print(f"records: {out_file}")


# ---- the tasks -------------------------------------------------------------------------------------
@_task("ppl")
def ppl_cmd(
    model: Model,
    lengths: Lengths = None,
    method: Method = None,
    param: Params = None,
    data: Annotated[Optional[Path], typer.Option("--data", help="Corpus: a txt/jsonl/parquet file, a folder, or a saved `datasets` dir (default: the built-in held-out corpus).")] = None,
    samples: Annotated[Optional[int], typer.Option("--samples", min=1, help="Documents per length: the first N long enough (default: all).")] = None,
    stride: Annotated[Optional[int], typer.Option("--stride", min=1, help="How far the window advances (tokens).")] = None,
    score_mode: Annotated[Optional[str], typer.Option("--score-mode", help="last_stride | full_window | disjoint | truncate | same_targets.")] = None,
    weighting: Annotated[Optional[str], typer.Option("--weighting", help="token | window.")] = None,
    add_bos: Annotated[Optional[bool], typer.Option("--add-bos/--no-add-bos", help="Prepend BOS to every window (default: when the tokenizer has one).")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write the per-position NLL curve (PNG) here.")] = None,
    seed: Seed = 0,
    out_file: Out = None,
    resume: Resume = False,
    json_out: Json = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
):
    """Sliding-window perplexity with an explicit protocol, and the per-position NLL curve."""
    _run("ppl", model, lengths, method, param, seed, out_file, resume, json_out, (device, dtype, attn, device_map), data=data, samples=samples,
         stride=stride, score_mode=score_mode, weighting=weighting, add_bos=add_bos, plot=plot)


@_task("passkey")
def passkey_cmd(
    model: Model,
    lengths: WindowLengths = None,
    method: Method = None,
    param: Params = None,
    depths: Depths = None,
    trials: Trials = None,
    plot: Heatmap = None,
    seed: Seed = 0,
    out_file: Out = None,
    resume: Resume = False,
    json_out: Json = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
):
    """Passkey retrieval (the Landmark/YaRN prompt): lengths × depths × trials, first-integer scoring."""
    _run("passkey", model, lengths, method, param, seed, out_file, resume, json_out, (device, dtype, attn, device_map), depths=depths, trials=trials, plot=plot)


@_task("niah")
def niah_cmd(
    model: Model,
    lengths: WindowLengths = None,
    method: Method = None,
    param: Params = None,
    depths: Depths = None,
    trials: Trials = None,
    chat: Chat = None,
    plot: Heatmap = None,
    seed: Seed = 0,
    out_file: Out = None,
    resume: Resume = False,
    json_out: Json = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
):
    """Needle-in-a-haystack grid: sentence-boundary insertion, word-recall scoring, a heatmap."""
    _run("niah", model, lengths, method, param, seed, out_file, resume, json_out, (device, dtype, attn, device_map), depths=depths, trials=trials,
         chat=chat, plot=plot)


@_task("ruler")
def ruler_cmd(
    model: Model,
    lengths: Annotated[Optional[str], typer.Option("--lengths", "-l", help="Comma-separated lengths in tokens, e.g. "
                                                   "4k,16k (default 4k, RULER's shortest).")] = None,
    method: Method = None,
    param: Params = None,
    tasks: Annotated[Optional[str], typer.Option("--tasks", help="RULER task names, comma-separated (default: all 13).")] = None,
    samples: Annotated[Optional[int], typer.Option("--samples", min=1, help="Samples per task and length.")] = None,
    data: Annotated[Optional[Path], typer.Option("--data", help="Folder with dev-v2.0.json (SQuAD) and hotpot_dev_distractor_v1.json for qa_1/qa_2 (skipped without).")] = None,
    chat: Annotated[Optional[bool], typer.Option("--chat/--no-chat", help="Wrap prompts in the tokenizer's chat template (on by default when it has one; --no-chat forces the plain template).")] = None,
    tokens_to_generate: Annotated[Optional[int], typer.Option("--tokens-to-generate", min=1, help="Generation budget of every task, counted in the length (default: RULER's: 128 niah, 30 vt, 120 cwe, 50 fwe, 32 qa); a small one leaves a short window room for the haystack.")] = None,
    seed: Seed = 0,
    out_file: Out = None,
    resume: Resume = False,
    json_out: Json = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
):
    """RULER's 13 synthetic tasks with their templates, budgets and metrics."""
    _run("ruler", model, lengths, method, param, seed, out_file, resume, json_out, (device, dtype, attn, device_map), tasks=tasks, samples=samples,
         data=data, chat=chat, tokens_to_generate=tokens_to_generate)


@_task("longbench")
def longbench_cmd(
    model: Model,
    lengths: Annotated[Optional[str], typer.Option("--lengths", "-l", help="Prompt budgets in tokens for middle truncation, e.g. 3500 (default: the window minus 512).")] = None,
    method: Method = None,
    param: Params = None,
    tasks: Annotated[Optional[str], typer.Option("--tasks", help="Dataset names, comma-separated, e.g. hotpotqa,hotpotqa_e (default: every file in --data).")] = None,
    samples: Annotated[Optional[int], typer.Option("--samples", min=1, help="The first N items of each dataset (default: all).")] = None,
    data: Annotated[Optional[Path], typer.Option("--data", help="Folder of the official LongBench JSONL files.")] = None,
    chat: Chat = None,
    seed: Seed = 0,
    out_file: Out = None,
    resume: Resume = False,
    json_out: Json = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
):
    """LongBench / LongBench-E from local JSONL files: middle truncation, the official metrics."""
    _run("longbench", model, lengths, method, param, seed, out_file, resume, json_out, (device, dtype, attn, device_map), tasks=tasks, samples=samples,
         data=data, chat=chat)


@_task("manyshot")
def manyshot_cmd(
    model: Model,
    lengths: Annotated[Optional[str], typer.Option("--lengths", "-l", help="Prompt caps in tokens, e.g. 4k,16k (default: the model's window; with --method, the extended one).")] = None,
    method: Method = None,
    param: Params = None,
    shots: Annotated[Optional[str], typer.Option("--shots", help="Numbers of in-context examples, e.g. 1,2,4,8,16 (0: zero-shot).")] = None,
    samples: Annotated[Optional[int], typer.Option("--samples", min=1, help="Queries scored.")] = None,
    data: Annotated[Optional[Path], typer.Option("--data", help="Labelled JSONL, or a folder with train/test files (default: a built-in synthetic set).")] = None,
    seed: Seed = 0,
    out_file: Out = None,
    resume: Resume = False,
    json_out: Json = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
):
    """Many-shot in-context learning: accuracy against the number of examples."""
    _run("manyshot", model, lengths, method, param, seed, out_file, resume, json_out, (device, dtype, attn, device_map), shots=shots, samples=samples, data=data)


@_task("entropy")
def entropy_cmd(
    model: Model,
    lengths: WindowLengths = None,
    method: Method = None,
    param: Params = None,
    samples: Annotated[Optional[int], typer.Option("--samples", min=1, help="Prose inputs measured at each length.")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write the figure (PNG) here, as Entropy-ABF's Fig. 1.")] = None,
    seed: Seed = 0,
    out_file: Out = None,
    resume: Resume = False,
    json_out: Json = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
):
    """Attention entropy per layer, head and query position, raw and normalised."""
    _run("entropy", model, lengths, method, param, seed, out_file, resume, json_out, (device, dtype, attn, device_map), samples=samples, plot=plot)


@_task("short")
def short_cmd(
    model: Model,
    lengths: Annotated[Optional[str], typer.Option("--lengths", "-l", help="Not used: lm-eval's tasks set their own lengths (given, it is refused).")] = None,
    method: Method = None,
    param: Params = None,
    tasks: Annotated[Optional[str], typer.Option("--tasks", help="lm-eval task names, comma-separated (default: every task in --data, or the built-in one).")] = None,
    data: Annotated[Optional[Path], typer.Option("--data", help="Folder of local lm-eval task YAMLs.")] = None,
    samples: Annotated[Optional[int], typer.Option("--samples", min=1, help="The first N documents of each task (default: all).")] = None,
    chat: Chat = None,
    seed: Seed = 0,
    out_file: Out = None,
    resume: Resume = False,
    json_out: Json = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
):
    """Short-context regression through lm-evaluation-harness (pip install 'ropekit\\[lmeval]')."""
    if lengths is not None:
        raise RopekitError("`ropekit eval short` runs lm-eval's tasks at their own lengths: --lengths does not apply",
                           "drop --lengths (records use length 0)")
    _run("short", model, lengths, method, param, seed, out_file, resume, json_out, (device, dtype, attn, device_map), tasks=tasks, data=data,
         samples=samples, chat=chat)


@_task("speed")
def speed_cmd(
    model: Model,
    lengths: Annotated[Optional[str], typer.Option("--lengths", "-l", help="Comma-separated lengths in tokens, e.g. 4k,16k (required).")] = None,
    method: Annotated[Optional[str], typer.Option("--method", "-m", help="One method measured against the plain model (--methods for several).")] = None,
    methods: Annotated[Optional[str], typer.Option("--methods", help="Comma-separated methods, measured interleaved (plain always included).")] = None,
    param: Annotated[Optional[list[str]], typer.Option("--param", "-p", help="METHOD.key=value for a measured method; repeatable.")] = None,
    decode_tokens: Annotated[Optional[int], typer.Option("--decode-tokens", min=0, help="Decode steps timed after prefill (default 8).")] = None,
    repeats: Annotated[Optional[int], typer.Option("--repeats", min=1, help="Repeats per (method, length); the median is reported.")] = None,
    seed: Seed = 0,
    out_file: Out = None,
    resume: Resume = False,
    json_out: Json = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="PNG: log-log prefill time and peak memory per "
                                                 "method against length, with each method's fitted slope.")] = None,
):
    """Prefill time, decode time per token and peak memory per length, several methods interleaved."""
    from ..eval.records import parse_lengths
    from ..eval.speed import parse_method_specs, run_speed

    _resume_needs_out(resume, out_file)
    params = parse_params(param)
    if lengths is None:
        raise RopekitError("the 'speed' evaluation needs --lengths", "pass e.g. --lengths 4k,16k")
    lengths_list = parse_lengths(lengths)
    if method is not None and methods is not None:  # one would be dropped
        raise RopekitError("--method and --methods both given", f"pass --methods {methods},{method} (or --method alone)")
    method_list = (methods if methods is not None else method if method is not None else "plain").split(",")
    if not all(name.strip() for name in method_list):
        flag, given = ("--methods", methods) if methods is not None else ("--method", method)
        raise RopekitError(f"{flag} '{given}' has an empty name", f"pass e.g. {flag} yarn")
    parse_method_specs(method_list, params)  # validate names before loading anything
    if plot is not None:
        check_figure_target(plot)  # before the measurements, not after them
    loaded = load_model(model, device, dtype, attn, device_map)
    from itertools import count

    from ..runtime.progress import progress

    with progress("speed", console=err) as shown:
        started = count()  # measurements begun: the count shown beside the one in progress
        rows = run_speed(
            loaded.model, methods=method_list, lengths=lengths_list, params=params,
            decode_tokens=8 if decode_tokens is None else decode_tokens, repeats=repeats or 1, seed=seed,
            out=str(out_file) if out_file else None, resume=resume,
            progress=lambda text: shown.update(completed=next(started), info=text), model_name=model,
        )
        shown.update(completed=next(started), info="measured")
    slopes = None
    if plot is not None or len(set(lengths_list)) > 1:
        from ..eval.speed import cost_slopes, plot_cost
        from ..install import rope_info

        window = rope_info(loaded.model).window
        if plot is not None:
            slopes = plot_cost(rows, plot, window=window, title=f"cost against length — {model}")
            err.print(f"plot: {plot}")
        else:
            slopes = cost_slopes(rows, window)
    if json_out:
        for r in rows if slopes else ():  # each row carries its method's fitted slopes
            fit = slopes.get(r["method"], {})
            r["prefill_slope"], r["memory_slope"] = fit.get("prefill_s"), fit.get("peak_mem_bytes")
        print_json(rows)
        return
    if loaded.model.device.type == "cpu":
        import torch

        title = f"speed — {model} ({torch.get_num_threads()} CPU threads)"
    else:
        title = f"speed — {model}"
    table = Table(title=title)
    for col in ("length", "method", "prefill s", "× plain", "TFLOP/s", "of peak", "decode s/token", "× plain",
                "peak MiB", "× plain"):
        table.add_column(col, justify="left" if col == "method" else "right", no_wrap=col == "method")
    for r in rows:
        table.add_row(
            str(r["length"]), r["method"], f"{r['prefill_s']:.3f}", _ratio(r.get("prefill_ratio")),
            _ratio(r.get("prefill_tflops")), "—" if r.get("peak_fraction") is None else f"{r['peak_fraction']:.0%}",
            f"{r['decode_s_per_token']:.4f}", _ratio(r.get("decode_ratio")),
            f"{r['peak_mem_bytes'] / 2**20:.0f}", _ratio(r.get("memory_ratio")),
        )
    out.print(table)
    if rows and rows[0].get("peak_tflops"):
        out.print(f"measured {rows[0]['dtype']} matmul peak of this machine: {rows[0]['peak_tflops']:.3f} TFLOP/s "
                  "(TFLOP/s: the plain model's prefill FLOPs over each method's time)", highlight=False)
    if slopes:
        fits = Table(title=f"log-log slopes (cost ∝ length^k), over lengths past the {window}-token window")
        for col in ("method", "prefill time k", "peak memory k", "lengths"):
            fits.add_column(col, justify="left" if col in ("method", "lengths") else "right")
        for name, fit in slopes.items():
            fits.add_row(name, _ratio(fit["prefill_s"]), _ratio(fit["peak_mem_bytes"]),
                         ",".join(str(n) for n in fit["lengths"]))
        out.print(fits)


def _ratio(value) -> str:
    return "—" if value is None else f"{value:.2f}"
