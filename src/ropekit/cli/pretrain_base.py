"""``ropekit pretrain-base``: the study's built-in base model — shipped in the package, rebuilt here on demand."""

from __future__ import annotations

from typing import Optional

import typer

from .common import out, print_json


def pretrain_base_cmd(
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the tokenizer sample, the weights and the batches."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, help="Optimizer steps (default: the built-in setting)."),
    force: bool = typer.Option(False, "--force", help="Train again from scratch even when the shipped or a cached model "
                                                      "matches the settings (the result replaces the cache entry)."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="CPU threads (default: 2, fewer when other "
                                                                          "work keeps the cores busy)."),
    ship: bool = typer.Option(False, "--ship", help="Copy the result into the package's shipped base model folder "
                                                    "(for maintainers re-shipping it after a settings change)."),
    json_out: bool = typer.Option(False, "--json", help="Print the model directory and its training facts as JSON."),
):
    """Print the study's built-in base model directory: the shipped model when it matches the settings, else a
    cached one, else pre-trained here now (--force always pre-trains, deterministically). An interrupted
    pre-training resumes from its last resume point (every 100 steps) to the same weights."""
    from ..errors import RopekitError
    from ..runtime import quiet_transformers as quiet
    from ..train.builtin_base import base_model_path, describe, is_cached, pretrain_base, ship_model

    if not 0 <= seed < 2**32:  # the seed reaches numpy's and torch's generators
        raise RopekitError(f"--seed {seed} is outside 0 … 2³² − 1", "pass e.g. --seed 0")
    if threads is not None and not force:
        if is_cached(base_model_path(seed, steps=steps)):
            # nothing is trained: the shipped (or cached) model is returned, and --threads would be silently unused
            raise RopekitError("--threads sets the pre-training's threads, and this model is already there (nothing "
                               "is trained)", "drop --threads, or add --force to train it again")
    with quiet():
        path = pretrain_base(seed, steps=steps, use_cache=not force, threads=threads)
    if ship:
        path = ship_model(path)
    meta = describe(path)
    if json_out:
        print_json({"path": str(path), **meta})
        return
    out.print(f"base model: {path}  (trained in {meta['train_seconds']:.0f} s on {meta['threads']} threads; "
              f"final loss {meta['final_loss']:.3f})")
