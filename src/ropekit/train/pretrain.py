"""Pre-training small models from scratch, here, offline: the one training loop configured for it, and the
built-in tiny Llama the demo and the ``tiny-pretrained`` training model start from.

:func:`pretrain` is :func:`ropekit.train.loop.train_loop` with the pre-training parts (plain torch on one
process, transformers' mean loss, AdamW, clipping at 1, a schedule given as a function of the step); the
study's base model (:mod:`ropekit.train.builtin_base`) and the tiny Llama both train through it.

:func:`pretrain_tiny` trains the byte-level tiny Llama (:func:`ropekit.models.tiny.build_tiny_model`,
64-token window) on the offline standard-library corpus (:mod:`ropekit.data.local_text`) at its window
length, deterministically, and caches the weights under ``$ROPEKIT_CACHE`` (default ``~/.cache/ropekit``) so
later runs load them in a second."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .. import runtime
from ..data.local_text import ByteTokenizer, corpus_digest, stdlib_documents
from ..models.tiny import TINY_WINDOW, build_tiny_model
from ..runtime import (
    cache_root,
    default_threads,
    deterministic,
    quiet_transformers,
    save_model_atomically,
    settings_key,
)
from .loop import Parts, StepRecord, train_loop
from .objective import BatchMeanLoss
from .strategy import LocalStrategy

#: Bump when training changes in a way the settings below do not capture (invalidates old caches).
CACHE_FORMAT = 1
#: File in a cached model directory that records how it was trained. The name (like ``model.ropekit_demo``)
#: dates from when the demo was a library; it stays, because the cache key does not cover it: a new name would
#: make every cached tiny model unreadable and silently retrain it, and the demo and its tests read the attribute.
META_FILE = "ropekit_demo.json"

#: The tiny model: a 3-layer byte-level Llama (≈0.56M parameters; head size 32). Three layers so that
#: Entropy-ABF (which leaves layers 0 and 1 unscaled) changes something; MHA so that HARPE gets 4 bases.
TINY_MODEL = {"hidden_size": 128, "num_layers": 3, "num_heads": 4, "num_kv_heads": 4, "rope_theta": 10000.0}
#: Its training: 800 steps of 16 × 64 bytes (≈0.8M tokens), sized for about a minute on 2 CPU cores.
TINY_TRAIN = {"steps": 800, "batch_size": 16, "lr": 3e-3, "train_bytes": 4_000_000}


def warmup_cosine_lr(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over the first 5 % of ``steps``, then cosine decay to 10 % of ``peak``."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    fraction = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * fraction)))


def pretrain(model, batch: Callable[[int], dict[str, torch.Tensor | None]], schedule: Callable[[int], float], steps: int,
             *, lr: float, label: str, progress: bool = True, phase: Callable[[int], str] | None = None,
             on_step: Callable[[int, int], None] | None = None, resume: dict[str, Any] | None = None,
             checkpoint: Callable[[int, Any, list[float]], None] | None = None) -> list[float]:
    """Pre-train ``model`` from scratch for ``steps`` steps through the one loop (:func:`ropekit.train.loop.train_loop`)
    and return each step's loss.

    The parts: one process in plain torch (:class:`~ropekit.train.strategy.LocalStrategy`); the batch of step
    ``s`` (0-based) is ``batch(s)`` (``{"input_ids", "attention_mask"}``, the mask may be ``None``), its own labels
    (transformers' mean loss, :class:`~ropekit.train.objective.BatchMeanLoss`); AdamW (β 0.9/0.95, weight decay
    0.01 on every weight) at ``schedule(s)``; gradients clipped at norm 1; no loss guard, no EMA.
    ``phase(s)`` names the step's part of a curriculum on the progress bar; ``on_step(done, steps)`` is called
    after every step. ``checkpoint(done, optimizer, losses)`` too (the caller keeps what a crash must not lose);
    ``resume`` (``{"step", "optimizer", "losses"}``, the model's weights already restored) continues after that step.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    first = 0
    losses: list[float] = []
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        first, losses = int(resume["step"]), list(resume["losses"])
    strategy = LocalStrategy()
    with runtime.progress(label, total=steps, completed=first, enabled=progress) as bar:

        def after(record: StepRecord) -> None:
            losses.append(record.loss)
            recent = sum(losses[-20:]) / len(losses[-20:])
            prefix = f"{phase(record.step - 1)} " if phase is not None else ""
            bar.update(advance=1, info=f"{prefix}loss {recent:.3f}")
            if checkpoint is not None:
                checkpoint(record.step, optimizer, losses)
            if on_step is not None:
                on_step(record.step, steps)

        parts = Parts(model=model, optimizer=optimizer, strategy=strategy, objective=BatchMeanLoss(model, strategy),
                      data=lambda n: [batch(n - 1)], schedule=lambda n: schedule(n - 1), max_grad_norm=1.0, end=[after])
        train_loop(parts, first, steps)
    return losses


def pretrain_step(model, optimizer, ids: torch.Tensor, lr: float, *, attention_mask: torch.Tensor | None = None) -> float:
    """One step of the pre-training loop (:func:`pretrain`'s parts) at learning rate ``lr`` with ``optimizer``;
    returns the loss (``scripts/induction_probe.py`` steps its own curricula with it)."""
    strategy = LocalStrategy()
    losses: list[float] = []
    parts = Parts(model=model, optimizer=optimizer, strategy=strategy, objective=BatchMeanLoss(model, strategy),
                  data=lambda n: [{"input_ids": ids, "attention_mask": attention_mask}], schedule=lambda n: lr,
                  max_grad_norm=1.0, end=[lambda record: losses.append(record.loss)])
    train_loop(parts, 0, 1)
    return losses[0]


def load_cached_model(path: Path, settings: dict[str, Any], meta_file: str = META_FILE):
    """The model cached at ``path`` if it is complete and was trained with ``settings``, else ``None``."""
    meta_path = path / meta_file
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("settings") != settings:
            return None
        from transformers import AutoModelForCausalLM

        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    except Exception:  # a damaged cache entry is retrained, never trusted
        return None
    model.eval()
    model.ropekit_demo = {**meta, "cached": True, "path": str(path)}
    return model


def byte_stream(documents: list[bytes]) -> torch.Tensor:
    """Documents joined as the byte tokenizer joins them, as one tensor of ids."""
    data = ByteTokenizer().join(documents)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def pretrain_tiny(
    seed: int = 0,
    steps: int = TINY_TRAIN["steps"],
    cache_dir: str | os.PathLike | None = None,
    *,
    batch_size: int = TINY_TRAIN["batch_size"],
    lr: float = TINY_TRAIN["lr"],
    train_bytes: int = TINY_TRAIN["train_bytes"],
    threads: int | None = None,
    hidden_size: int = TINY_MODEL["hidden_size"],
    num_layers: int = TINY_MODEL["num_layers"],
    num_heads: int = TINY_MODEL["num_heads"],
    num_kv_heads: int = TINY_MODEL["num_kv_heads"],
    rope_theta: float = TINY_MODEL["rope_theta"],
    use_cache: bool = True,
    progress: bool = True,
):
    """The built-in tiny Llama pre-trained from scratch on the offline stdlib corpus at its 64-token window.

    Byte vocabulary (256), AdamW with warm-up and cosine decay, random 64-byte windows of the training
    split; seeded, ``threads`` CPU threads (default :func:`~ropekit.runtime.default_threads`) and deterministic
    kernels, so the same machine gives the same weights. The result is cached (safetensors) under
    ``cache_root(cache_dir)/tiny-llama-<hash>``, the hash covering every setting and a fingerprint of the
    corpus; a cached entry is loaded instead of training; when the cache cannot be written the model is
    still returned (``cache_error`` says why). ``model.ropekit_demo`` records the settings, the training
    losses and whether it came from the cache (``cached``).
    """
    model_kwargs = {
        "vocab_size": ByteTokenizer.vocab_size,
        "hidden_size": int(hidden_size),
        "num_layers": int(num_layers),
        "num_heads": int(num_heads),
        "num_kv_heads": int(num_kv_heads),
        "window": TINY_WINDOW,
        "rope_theta": float(rope_theta),
    }
    documents = stdlib_documents(int(train_bytes), "train")
    settings = {
        "format": CACHE_FORMAT,
        "family": "llama",
        "model": model_kwargs,
        "seed": int(seed),
        "steps": int(steps),
        "batch_size": int(batch_size),
        "lr": float(lr),
        # not the thread count: CPU kernels give the same bits with 1 or 2 threads (tests/test_demo.py)
        "corpus": {"name": "python-stdlib", "bytes": sum(map(len, documents)), "digest": corpus_digest(documents)},
    }
    path = cache_root(cache_dir) / f"tiny-llama-{settings_key(settings)}"
    if use_cache:
        cached = load_cached_model(path, settings)
        if cached is not None:
            return cached

    stream = byte_stream(documents)
    window = TINY_WINDOW
    threads = threads or default_threads()
    started = time.perf_counter()
    with deterministic(threads):
        model = build_tiny_model("llama", seed=seed, **model_kwargs)
        model.train()
        gen = torch.Generator().manual_seed(seed)
        offsets = torch.arange(window)

        def batch(step: int) -> dict[str, torch.Tensor | None]:
            starts = torch.randint(0, len(stream) - window, (batch_size,), generator=gen)
            return {"input_ids": stream[starts[:, None] + offsets], "attention_mask": None}

        losses = pretrain(model, batch, lambda step: warmup_cosine_lr(step, steps, lr), steps, lr=lr,
                          label="pre-training tiny llama", progress=progress)
        model.eval()
    seconds = time.perf_counter() - started
    tail = losses[-max(1, min(20, steps // 5)) :]
    meta = {
        "settings": settings,
        "initial_loss": losses[0] if losses else None,
        "final_loss": sum(tail) / len(tail) if tail else None,
        "train_seconds": round(seconds, 2),
        "threads": threads,
        "corpus_note": "substitute corpus made on this machine from the Python standard library's .py sources",
    }
    saved, cache_error = None, None
    if use_cache:
        try:
            saved = str(save_model_atomically(model, path, meta, meta_file=META_FILE))
        except OSError as err:  # an unwritable or full cache must not cost the trained model
            cache_error = f"could not cache the model in '{path.parent}': {err}"
    model.ropekit_demo = {**meta, "cached": False, "path": saved, "cache_error": cache_error}
    return model
