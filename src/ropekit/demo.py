"""The default demo: pre-train the built-in tiny Llama, extend it, and compare next-token loss by length.

``ropekit demo`` (or ``python -c "from ropekit.demo import main; main()"``) runs on a fresh CPU machine
without internet:

1. :func:`ropekit.train.pretrain.pretrain_tiny` trains the built-in tiny Llama (:func:`ropekit.models.tiny.build_tiny_model`,
   byte vocabulary, 64-token window) from scratch on the offline standard-library corpus
   (:mod:`ropekit.data.local_text`) at its window length, deterministically, and caches the weights under
   ``$ROPEKIT_CACHE`` (default ``~/.cache/ropekit``) so later runs load them in a second;
2. :func:`loss_table` measures mean next-token loss (nats per byte) on held-out text at 1×, 2× and 4× the
   window for the base model and for each method installed with :func:`ropekit.extend` — *frozen*: the
   weights are never fine-tuned after extension, so this shows what each method does out of the box,
   not what it reaches after the fine-tuning most of them are meant for;
3. :func:`main` prints the table.

The per-method settings (:func:`demo_settings`) are scaled to a 64-token model: the papers' defaults of
ABF (base 500,000) and HARPE (bases 1e6–5e6) are meant for 4k-token models and would be far too large here.

The demo is a consumer of the library like any user script: it imports only ropekit's public modules, and
nothing in the library imports it (the ``ropekit demo`` command is its front end).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ropekit import extend, get_method, installed, list_methods, rope_info
from ropekit.core.jsonsafe import json_safe
from ropekit.data.local_text import stdlib_documents
from ropekit.methods import Method, RopeInfo
from ropekit.methods.base import short_number
from ropekit.models.tiny import TINY_WINDOW
from ropekit.runtime import deterministic, progress as progress_display
from ropekit.train.pretrain import pretrain_tiny

#: Held-out text used by :func:`loss_table`: this many sequences, the same starts at every length.
EVAL_SEQUENCES = 32
HELDOUT_BYTES = 1_000_000  # more than the held-out split holds: all of it


# ---- data -------------------------------------------------------------------------------------------
def heldout_batch(max_length: int = 4 * TINY_WINDOW, n_sequences: int = EVAL_SEQUENCES) -> torch.Tensor:
    """``(n_sequences, max_length)`` byte ids from held-out documents, the same for every call.

    Each held-out document is cut into non-overlapping ``max_length`` chunks (none crosses a document
    boundary); ``n_sequences`` chunks evenly spaced over all of them are taken. Shorter lengths use the
    prefixes of the same chunks, so every length is measured on the same starts.
    """
    chunks = []
    for doc in stdlib_documents(HELDOUT_BYTES, "heldout"):
        for start in range(0, len(doc) - max_length + 1, max_length):
            chunks.append(doc[start : start + max_length])
    if len(chunks) < n_sequences:
        raise ValueError(f"held-out text has {len(chunks)} sequences of {max_length} bytes, {n_sequences} wanted")
    picks = [chunks[(i * len(chunks)) // n_sequences] for i in range(n_sequences)]
    return torch.tensor([list(c) for c in picks], dtype=torch.long)


@torch.no_grad()
def mean_loss(model, batch: torch.Tensor, length: int, chunk: int = 16) -> float:
    """Mean next-token loss (nats/token) of ``model`` over the first ``length`` tokens of each row of ``batch``."""
    total, count = 0.0, 0
    for i in range(0, batch.shape[0], chunk):
        ids = batch[i : i + chunk, :length]
        logits = model(input_ids=ids).logits.float()
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum")
        total += float(loss)
        count += ids[:, 1:].numel()
    return total / count


# ---- methods and the table --------------------------------------------------------------------------
def demo_settings(info: RopeInfo, factor: float = 4.0) -> dict[str, dict[str, Any]]:
    """Parameters of each registered method for the demo: ``factor`` where the method uses it, else scaled to the
    64-token model — each method's :meth:`~ropekit.methods.base.Method.demo_params` (NTK-by-parts / YaRN: ramp ends
    β = 4, α = 1; ABF / Entropy-ABF: a base ≈ 4 × the NTK-aware one; HARPE: uniform bases up to the NTK-aware base;
    Landmark: 8 blocks per window)."""
    return {m.name: m.demo_params(info, factor) for m in list_methods()}


def describe_settings(
    name: str, params: dict[str, Any], info: RopeInfo, requested: dict[str, Any] | None = None
) -> str:
    """The settings column: the parameters that matter for ``name`` (resolved ``params``), in a few words — the
    method's :meth:`~ropekit.methods.base.Method.settings_line`; ``base`` is the model as it is."""
    if name == "base":
        return f"plain RoPE, b={short_number(info.rope_theta)}, window {info.window}"
    return get_method(name).settings_line(info, params, requested)


def _method_specs(methods, info: RopeInfo, factor: float) -> list[tuple[Method, dict[str, Any]]]:
    defaults = demo_settings(info, factor)
    if methods is None:
        return [(m, dict(defaults.get(m.name, {"factor": factor}))) for m in list_methods()]
    if isinstance(methods, (str, Method)):
        methods = [methods]
    if isinstance(methods, Mapping):
        return [(get_method(name) if isinstance(name, str) else name, dict(params)) for name, params in methods.items()]
    specs = []
    for item in methods:
        m = get_method(item) if isinstance(item, str) else item
        specs.append((m, dict(defaults.get(m.name, {"factor": factor}))))
    return specs


def loss_table(
    model,
    methods: Iterable[str | Method] | Mapping[str, dict[str, Any]] | str | None = None,
    lengths: Iterable[int] | None = None,
    *,
    factor: float = 4.0,
    n_sequences: int = EVAL_SEQUENCES,
    threads: int | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Mean next-token loss on held-out text for the base model and each method, at each length.

    ``methods``: ``None`` (every registered method with :func:`demo_settings` for ``factor``), names, or a
    mapping ``name → parameters`` used as given. ``lengths`` default to 1×, 2× and 4× the model's window.
    Each method is installed with :func:`ropekit.extend` on a fresh copy of ``model`` (never fine-tuned);
    the same ``n_sequences`` held-out sequences (their prefixes, for shorter lengths) are used everywhere.

    Returns one dict per row: ``method`` (``"base"`` first), ``settings`` (text), ``params`` (resolved),
    ``loss`` (``{length: nats per token}``).
    """
    info = rope_info(model)
    lengths = [int(n) for n in (lengths or (info.window, 2 * info.window, 4 * info.window))]
    specs = _method_specs(methods, info, factor)
    batch = heldout_batch(max(lengths), n_sequences)
    rows: list[dict[str, Any]] = []
    total = (1 + len(specs)) * len(lengths)
    with deterministic(threads), progress_display("measuring", total=total, enabled=progress) as bar:
        for name, params in [("base", None)] + [(m.name, p) for m, p in specs]:
            if params is None:
                subject, resolved = model, {}
            else:
                subject = extend(copy.deepcopy(model), get_method(name), **params)
                resolved = installed(subject)["params"]
            bar.update(info=name)
            loss = {}
            for n in lengths:
                loss[n] = mean_loss(subject, batch, n)
                bar.update(advance=1)
            rows.append(
                {
                    "method": name,
                    "settings": describe_settings(name, resolved, info, params),
                    "params": json_safe(resolved),
                    "loss": loss,
                }
            )
            if subject is not model:
                del subject
    return rows


# ---- entry point ------------------------------------------------------------------------------------
CAPTION = (
    "Mean next-token loss (nats/byte, lower is better) on held-out Python-stdlib text at 1×, 2×, 4× the "
    "64-token training window. Methods are frozen: installed without fine-tuning, as most are meant to be used after."
)


def print_table(rows: list[dict[str, Any]], console=None, title: str | None = None) -> None:
    """``rows`` of :func:`loss_table` as a rich table (rows = base + methods, columns = lengths + settings)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(emoji=False)
    lengths = list(rows[0]["loss"]) if rows else []
    base = rows[0]["loss"] if rows and rows[0]["method"] == "base" else None
    table = Table(title=title or "tiny llama: next-token loss by length", caption=CAPTION, caption_justify="left")
    table.add_column("method", style="bold cyan")
    for n in lengths:
        table.add_column(f"{n} tok", justify="right")
    table.add_column("settings")
    for row in rows:
        cells = []
        for n in lengths:
            value = row["loss"][n]
            if base is not None and row["method"] != "base":
                delta = value - base[n]
                style = "green" if delta < -0.005 else ("red" if delta > 0.005 else "")
                cells.append(f"[{style}]{value:.3f}[/]" if style else f"{value:.3f}")
            else:
                cells.append(f"{value:.3f}")
        table.add_row(row["method"], *cells, row["settings"])
    console.print(table)


def main(method: str | None = None, json_out: bool = False) -> list[dict[str, Any]]:
    """Pre-train (or load) the tiny Llama, measure base and methods, print the table; return its rows.

    ``method`` limits the table to that method and the base (an unknown name raises ropekit's one-line
    :class:`~ropekit.errors.UnknownMethodError`). With ``json_out`` nothing is printed on stdout (the
    caller prints the returned rows as JSON); progress goes to stderr either way.
    """
    from rich.console import Console

    chosen = [get_method(method)] if method is not None else None  # unknown names fail before training
    err = Console(stderr=True, soft_wrap=True, emoji=False)  # a path is never broken across lines
    started = time.perf_counter()
    model = pretrain_tiny()
    info = model.ropekit_demo
    if info["cached"]:
        err.print(f"loaded the pre-trained tiny llama from {info['path']} ({time.perf_counter() - started:.1f}s)")
    else:
        where = f"cached at {info['path']}" if info["path"] else f"not cached: {info['cache_error']}"
        err.print(
            f"pre-trained the tiny llama in {info['train_seconds']:.1f}s on {info['threads']} CPU thread(s) "
            f"(training loss {info['initial_loss']:.2f} → {info['final_loss']:.2f}); {where}"
        )
    measured = time.perf_counter()
    rows = loss_table(model, chosen, progress=True)
    err.print(f"measured {len(rows)} rows in {time.perf_counter() - measured:.1f}s")
    if not json_out:
        print_table(rows)
    return rows
