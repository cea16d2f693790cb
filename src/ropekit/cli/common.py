"""What several commands share: the two consoles, JSON and table printing, loading the MODEL argument,
the progress sink of the evaluations, parsing of list options, and the command class every command uses.

Only typer, rich and the standard library are imported here; anything heavier is imported inside the
function that needs it, so that ``ropekit --help`` never loads torch or transformers.
"""

from __future__ import annotations

import dataclasses

import json
import math
import sys
from typing import Annotated, Any, Optional

import typer

from rich.console import Console
from rich.table import Table
from typer.core import TyperCommand

from ..errors import InvalidParameterError, RopekitError

#: Results (tables, JSON) go to stdout; progress, notes and errors to stderr, so ``--json`` output pipes cleanly.
#: Printed lines are never broken by rich (soft wrap): a path or a status line stays one line in a log or a pipe,
#: where rich would otherwise wrap at 80 columns; a terminal wraps them on screen itself. Tables keep their width.
out = Console(soft_wrap=True, emoji=False)
err = Console(stderr=True, soft_wrap=True, emoji=False)

#: The MODEL argument's help, the same for every command that takes one.
MODEL_HELP = "Local transformers directory, .gguf file, hub id, or a built-in name (tiny)."


class Command(TyperCommand):
    """A typer command that quiets transformers for its body (as transformers loads, if it does).

    Doing it here rather than in ``main()`` keeps ``--help`` and usage errors free of the transformers
    import, while every command that does run sees the same quiet transformers.
    """

    def invoke(self, ctx):
        from ..runtime.logs import silence_transformers_when_loaded

        # transformers' bars and warnings would bury ropekit's one-line messages; quieted as it loads, so that a
        # command answering from data or refusing its input first (a typo'd method, a missing engine) never imports it
        silence_transformers_when_loaded()
        PLACEMENT_NOTES.clear()
        try:
            result = super().invoke(ctx)
        except ModuleNotFoundError as e:  # a package of an extra this installation does not have
            package = (e.name or "").split(".")[0]
            if package not in EXTRAS:
                raise
            command = ctx.command_path.split(" ")[1:] or [""]
            extra = COMMAND_EXTRAS.get(command[0], EXTRAS[package])
            raise RopekitError(f"`ropekit {' '.join(command)}` needs the package {package}, which is not installed",
                               f"pip install 'ropekit[{extra}]'") from None
        # where the model ran and in which dtype, and why: said once the command has done its work, so that a
        # refusal after loading stays one line
        for note in PLACEMENT_NOTES:
            err.print(note, highlight=False, soft_wrap=True)
        PLACEMENT_NOTES.clear()
        return result


#: The placement lines of the models a command loaded (:meth:`ropekit.runtime.devices.DevicePlan.describe`).
PLACEMENT_NOTES: list[str] = []


#: Commands → the extra that brings everything they use (pyproject.toml).
COMMAND_EXTRAS = {"study": "study", "report": "study", "recommend": "study", "demo": "study", "train": "train", "pretrain-base": "train",
                  "eval": "eval", "search": "eval"}
#: Packages of the extras (pyproject.toml) → the extra that brings each: the core is extend, export, load,
#: inspect and verify.
EXTRAS = {"accelerate": "train", "peft": "train", "datasets": "eval", "scipy": "eval", "matplotlib": "eval",
          "jieba": "eval", "rouge": "eval", "rapidfuzz": "eval", "jinja2": "study", "lm_eval": "lmeval",
          "ray": "ray", "deepspeed": "deepspeed", "tensorboard": "tensorboard"}


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout (paths, dates and other objects as their ``str``)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def print_rows(rows: list[dict[str, Any]], title: str) -> None:
    """A summary table whose columns are the rows' keys (numbers right-aligned, floats to 4 significant digits)."""
    table = Table(title=title)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    for col in columns:
        numeric = all(isinstance(r.get(col), (int, float)) or r.get(col) is None for r in rows)
        table.add_column(col, justify="right" if numeric else "left")
    for r in rows:
        table.add_row(*("—" if r.get(c) is None else f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in columns))
    out.print(table)


#: ``--device/--dtype/--attn/--device-map``, shared by every command that loads a model
#: (:mod:`ropekit.runtime.devices` resolves them; an impossible choice fails before the model loads).
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N | mps (auto: the GPU if there is one, else CPU).")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="auto | float32 | bfloat16 | float16 (auto: bfloat16 for real models on a GPU or on a CPU with native bfloat16 matmul — AMX/AVX512-BF16 — else float32; small built-in models stay float32).")]
AttnOpt = Annotated[str, typer.Option("--attn", help="auto | sdpa | eager | flash_attention_2 | flex_attention (auto: flash_attention_2 on a GPU with flash_attn installed, else sdpa).")]
DeviceMapOpt = Annotated[Optional[str], typer.Option("--device-map", help="auto: spread the layers over every GPU (accelerate).")]


def resolve_placement(device: str = "auto", dtype: str = "auto", attn: str = "auto", device_map: Optional[str] = None,
                      model_parameters: Optional[int] = None):
    """The device options checked against this machine (:func:`ropekit.runtime.devices.resolve_devices`)."""
    from ..runtime.devices import resolve_devices

    return resolve_devices(device, dtype, attn, device_map, model_parameters=model_parameters)


def load_model(model: str, device: Optional[str] = None, dtype: Optional[str] = None, attn: Optional[str] = None,
               device_map: Optional[str] = None):
    """The MODEL argument loaded (:func:`ropekit.models.loading.load_model`), with a spinner on stderr.

    With any device option given, the options are resolved first (a one-line error before anything loads) and
    the model is loaded in that dtype with that attention kernel and moved to that device.
    """
    from ..models.loading import load_model as load, parameter_count

    if device is None and dtype is None and attn is None and device_map is None:
        with err.status(f"loading {model}…"):
            return load(model)
    wanted = dtype or "auto"
    plan = resolve_placement(device or "auto", wanted, attn or "auto", device_map,
                             model_parameters=parameter_count(model) if wanted == "auto" else None)
    with err.status(f"loading {model} ({plan.device}, {plan.dtype}, {plan.attn})…"):
        # attn auto is the loader's to settle: sdpa falls back to eager for families without it (Gemma 2, gpt-oss)
        loaded = load(model, device=plan.device if plan.device_map is None else "auto", dtype=plan.dtype,
                      attn_implementation="auto" if (attn or "auto") == "auto" else plan.attn, device_map=plan.device_map)
    attention = (loaded.info.get("placement") or {}).get("attn") or plan.attn
    PLACEMENT_NOTES.append(dataclasses.replace(plan, attn=attention).describe())
    return loaded


class TaskProgress:
    """A :func:`ropekit.runtime.progress.progress` task as :class:`ropekit.eval.common.ProgressSink`: a rich bar on
    a terminal, a plain line at most every 30 s in a log or a pipe (a bar there would show nothing until the end)."""

    def __init__(self, task):
        self.task = task

    def set_total(self, total: int) -> None:
        self.task.update(total=total)

    def advance(self, n: int = 1, description: str | None = None) -> None:
        self.task.update(advance=n, description=description)


def check_gguf_replacement(target, overwrite: bool) -> None:
    """Refuse ``target`` when it exists and ``--overwrite`` was not given, or when it is a file that is not a GGUF:
    ``--overwrite`` replaces a GGUF, never an arbitrary file that happens to end in .gguf."""
    from pathlib import Path

    target = Path(target)
    if target.exists() and not overwrite:
        raise RopekitError(f"'{target}' exists", "pass another --out, or --overwrite")
    if target.is_file():
        try:
            with open(target, "rb") as fh:
                magic = fh.read(4)
        except OSError as e:
            raise RopekitError(f"cannot read '{target}': {e.strerror or e}", "pass another --out") from None
        if magic != b"GGUF":
            raise RopekitError(f"'{target}' exists and is not a GGUF file; --overwrite replaces only a GGUF",
                               "pass another --out, or remove that file yourself")


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


def split_list(text: Optional[str]) -> Optional[list[str]]:
    """``"a, b,,c"`` → ``["a", "b", "c"]``; None stays None (the option was not given)."""
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def float_list(text: Optional[str], flag: str) -> Optional[list[float]]:
    """A comma-separated list of numbers; a one-line error naming ``flag`` otherwise."""
    items = split_list(text)
    if items is None:
        return None
    try:
        return [float(t) for t in items]
    except ValueError:
        raise RopekitError(f"{flag} '{text}' is not a comma-separated list of numbers", f"pass e.g. {flag} 0.1,0.5,0.9") from None


def int_list(text: Optional[str], flag: str, minimum: int = 1) -> Optional[list[int]]:
    """A comma-separated list of whole numbers ≥ ``minimum``; a one-line error naming ``flag`` otherwise."""
    try:
        values = float_list(text, flag)
    except RopekitError:
        raise RopekitError(f"{flag} '{text}' is not a comma-separated list of whole numbers",
                           f"pass e.g. {flag} {minimum},{minimum + 1},{minimum + 3}") from None
    if values is None:
        return None
    if any(not math.isfinite(v) or v != int(v) or v < minimum for v in values):
        raise RopekitError(f"{flag} '{text}' must be whole numbers ≥ {minimum}", f"pass e.g. {flag} {minimum},2,4,8")
    return [int(v) for v in values]
