"""The one training loop: every ropekit training run is :func:`train_loop` over a set of :class:`Parts`.

A step, in order:

1. ``begin(step)`` hooks (a curriculum's stage switch, a method's per-step draw such as CLEX's scale);
2. the step's micro-batches are read (``data``) and its learning rate set (``schedule``; a pure function of
   the step, so a resumed run needs no scheduler state);
3. the ``objective`` runs forward and backward through the ``strategy`` and returns the step's loss;
4. the ``strategy`` clips the gradients and, unless the loss ``guard`` skips the step, updates the weights;
5. an applied step updates the ``ema``;
6. ``end(record)`` hooks get the step's :class:`StepRecord` (metrics, trackers, checkpoints, progress).

Who configures it: :mod:`ropekit.train.trainer` (fine-tuning and continual pre-training from a YAML recipe,
on Accelerate, with checkpoints, trackers and an export at the end) and :mod:`ropekit.train.pretrain` (the
built-in models' pre-training from scratch: a plain-torch strategy, transformers' own mean loss, a warm-up
cosine schedule, no guard).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

#: ``objective(micro_batches) -> (loss, label tokens, tokens)``, having run the backward pass.
Objective = Callable[[list[dict[str, torch.Tensor]]], tuple[float, int, int]]


@dataclass
class StepRecord:
    """What one optimizer step did (``step`` counts from 1)."""

    step: int
    loss: float
    lr: float
    grad_norm: float
    tokens: int
    loss_tokens: int
    seconds: float
    skipped: str | None


@dataclass
class Parts:
    """The small parts one training run is made of."""

    model: Any  # what the strategy steps (wrapped by it, if it wraps)
    optimizer: torch.optim.Optimizer
    strategy: Any  # a LocalStrategy or an AccelerateStrategy (ropekit.train.strategy)
    objective: Objective
    data: Callable[[int], list[dict[str, torch.Tensor]]]  # the micro-batches of step n
    schedule: Callable[[int], float]  # the learning rate of step n
    max_grad_norm: float | None = None
    guard: Any = None  # a LossGuard (ropekit.train.loss_guard), or None: every step is applied
    ema: Any = None  # an EMA (ropekit.train.ema), or None
    begin: list[Callable[[int], None]] = field(default_factory=list)
    end: list[Callable[[StepRecord], None]] = field(default_factory=list)


def train_loop(parts: Parts, first: int, last: int) -> None:
    """Run steps ``first + 1`` to ``last`` (the weights are after step ``first`` when it starts)."""
    for step in range(first + 1, last + 1):
        started = time.perf_counter()
        for hook in parts.begin:
            hook(step)
        micro = parts.data(step)
        lr = parts.schedule(step)
        for group in parts.optimizer.param_groups:
            group["lr"] = lr
        loss, n_labels, n_tokens = parts.objective(micro)

        def verdict(grad_norm: float) -> str | None:
            return parts.guard.verdict(loss, grad_norm, n_labels) if parts.guard is not None else None

        grad_norm, skipped = parts.strategy.update(parts.model, parts.optimizer, parts.max_grad_norm, n_labels, verdict)
        if skipped is None and parts.ema is not None:
            parts.ema.update(step)
        if parts.guard is not None:
            parts.guard.record(loss, skipped)
        record = StepRecord(step=step, loss=loss, lr=lr, grad_norm=grad_norm, tokens=n_tokens, loss_tokens=n_labels,
                            seconds=round(time.perf_counter() - started, 6), skipped=skipped)
        for hook in parts.end:
            hook(record)
