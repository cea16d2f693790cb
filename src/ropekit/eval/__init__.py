"""Evaluations: each task is a registered unit (``ropekit eval TASK MODEL …``); results are JSON lines.

A task module (see :mod:`ropekit.eval.common`) has ``KEY_FIELDS``, ``check_options(*, lengths, …options)``,
``run(ctx, *, lengths, …options)`` and ``summarize(records)``; tasks that draw a figure also have ``plot(records, path)``. ``speed`` is the
exception: it measures several methods against the plain model in one run (``--methods``).
"""

from __future__ import annotations

import importlib

from ..errors import RopekitError

#: Task name → (module, one-line description); ``ropekit eval`` accepts exactly these.
_REGISTRY = {
    "ppl": ("perplexity", "sliding-window perplexity with explicit protocol, and the per-position NLL curve"),
    "passkey": ("passkey", "passkey retrieval (Landmark/YaRN prompt): lengths × depths × trials, first-integer scoring"),
    "niah": ("niah", "needle-in-a-haystack grid with sentence-boundary insertion, recall scoring and a heatmap"),
    "ruler": ("ruler", "RULER's 13 synthetic tasks with their templates, budgets and metrics"),
    "longbench": ("longbench", "LongBench / LongBench-E from local JSONL files, middle truncation, official metrics"),
    "manyshot": ("manyshot", "many-shot in-context learning: accuracy vs number of examples"),
    "entropy": ("entropy", "attention entropy per layer, head and query position, raw and normalised"),
    "speed": ("speed", "prefill time, decode time per token and peak memory per length, several methods interleaved"),
    "short": ("short", "short-context regression with lm-evaluation-harness (optional extra)"),
}

TASKS = {name: description for name, (_, description) in _REGISTRY.items()}


def get_task(name: str):
    """The module implementing task ``name``; a one-line error for an unknown name."""
    if name not in _REGISTRY:
        raise RopekitError(f"unknown evaluation task '{name}'", f"choose one of: {', '.join(_REGISTRY)}")
    return importlib.import_module(f"{__name__}.{_REGISTRY[name][0]}")


def check_task_options(name: str, options: dict) -> None:
    """Refuse, before any model loads, the options of task ``name`` that are wrong whatever the model (one line)."""
    get_task(name).check_options(**options)
