"""``ropekit pretrain-base``: the study's built-in base model, pre-trained here once and then cached."""

from __future__ import annotations

from typing import Optional

import typer

from .common import out, print_json


def pretrain_base_cmd(
    seed: int = typer.Option(0, "--seed", help="Seed of the tokenizer sample, the weights and the batches."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, help="Optimizer steps (default: the built-in setting)."),
    force: bool = typer.Option(False, "--force", help="Train again even when a cached model exists."),
    json_out: bool = typer.Option(False, "--json", help="Print the model directory and its training facts as JSON."),
):
    """Pre-train (or find cached) the study's built-in base model and print its directory."""
    from ..runtime import quiet_transformers as quiet
    from ..train.builtin_base import describe, pretrain_base

    with quiet():
        path = pretrain_base(seed, steps=steps, use_cache=not force)
    meta = describe(path)
    if json_out:
        print_json({"path": str(path), **meta})
        return
    out.print(f"base model: {path}  (trained in {meta['train_seconds']:.0f} s on {meta['threads']} threads; "
              f"final loss {meta['final_loss']:.3f})")
