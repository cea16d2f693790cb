"""Curricula: the stage plan of a run, the learning-rate schedule, and switching methods between stages.

A run is a list of stages (``stages:`` in the config, or one stage built from the top-level sections).
Stage ``k`` covers the global optimizer steps ``start_k + 1 … start_k + steps_k``; each stage may change the
method's parameters (e.g. the RoPE base of ABF), the sequence length, the data and the peak learning rate.
The multi-stage ABF recipe of HARPE (Lian et al. 2025) (HARPE, §4.2 "ABF Multi-Stage": b = 1M at 32k → 2M at 64k → 5M at
128k on Llama-2-7B) is ``configs/train/llama2-7b-abf-3stage.yaml``; EasyContext ran the same kind of schedule
as separate shell-script launches with hand-edited ``config.json`` files (jzhang38/EasyContext ``train_scripts/``; docs/methods-reference.md §11).

The schedule restarts in every stage (warm-up, then decay over the stage's steps): each stage is a
continual-pretraining phase of its own, as in EasyContext's and the paper's stage-by-stage runs. Optimizer
moments carry over unless the stage sets ``reset_optimizer: true``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..install import extend, resolve_params, uninstall
from .config import MethodConfig, StageConfig, TrainConfig, TrainSection


@dataclass(frozen=True)
class StagePlan:
    """Stage ``index`` with its global step range: steps ``start + 1 … start + steps`` (1-based)."""

    index: int
    start: int
    config: StageConfig

    @property
    def steps(self) -> int:
        return self.config.steps

    @property
    def end(self) -> int:
        return self.start + self.config.steps

    @property
    def name(self) -> str:
        return self.config.name


def plan(cfg: TrainConfig) -> list[StagePlan]:
    out, start = [], 0
    for i, stage in enumerate(cfg.stages):
        out.append(StagePlan(index=i, start=start, config=stage))
        start += stage.steps
    return out


def locate(stages: list[StagePlan], completed: int) -> tuple[int, int]:
    """``(stage index, steps completed in it)`` for the step after ``completed`` global steps; past the end,
    the last stage with all its steps completed."""
    for stage in stages:
        if completed < stage.end:
            return stage.index, completed - stage.start
    last = stages[-1]
    return last.index, last.steps


def lr_at(train: TrainSection, stage: StageConfig, n: int) -> float:
    """Learning rate of the ``n``-th optimizer step (1-based) of ``stage``.

    Linear warm-up ``lr·n/W`` for ``n ≤ W`` (W = ``warmup_steps``; the first step already moves, unlike a
    warm-up that starts at 0), then with ``p = (n − 1 − W)/(T − W) ∈ [0, 1)`` over the stage's ``T`` steps
    and floor ``r = min_lr_ratio``: ``constant`` → lr; ``linear`` → ``lr·(r + (1 − r)(1 − p))``;
    ``cosine`` → ``lr·(r + (1 − r)(1 + cos πp)/2)``. ``p`` is the fraction of decay steps already taken, as
    in transformers' ``get_linear_schedule_with_warmup`` / ``get_cosine_schedule_with_warmup``, so the
    last step still has a non-zero rate when ``r = 0``.
    """
    peak = stage.lr
    warmup = train.warmup_steps
    if warmup > 0 and n <= warmup:
        return peak * n / warmup
    if train.schedule == "constant":
        return peak
    p = min(1.0, max(0.0, (n - 1 - warmup) / max(1, stage.steps - warmup)))
    floor = train.min_lr_ratio
    if train.schedule == "linear":
        return peak * (floor + (1.0 - floor) * (1.0 - p))
    return peak * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * p)))


def stage_seed(seed: int, index: int) -> int:
    """The data seed of stage ``index``: the run's own for the first stage, a derived one for each later stage, so a
    later stage on the same data draws new PoSE/RandPos positions and document orders instead of replaying the first
    stage's examples (each example is drawn from ``(seed, epoch, index)`` and every stage starts at epoch 0)."""
    from ..data.training_data import hash_seed

    return int(seed) if index == 0 else hash_seed(seed, "stage", index)


# ---- methods -------------------------------------------------------------------------------------------
def check_method(model, method: MethodConfig) -> None:
    """Validate ``method`` against ``model`` (model-dependent parameter checks) without changing it."""
    if method.name is not None:
        resolve_params(model, method.name, **method.params)


def install(model, method: MethodConfig) -> None:
    """Install ``method`` into ``model`` (a transformers model, not a wrapper) with :func:`ropekit.extend`."""
    if method.name is not None:
        extend(model, method.name, **method.params)


def switch_changes(old: MethodConfig | None, new: MethodConfig) -> bool:
    """Whether going from ``old`` to ``new`` re-installs the method (:func:`switch` does something)."""
    return old is None or old.name != new.name or old.params != new.params


def switch(model, old: MethodConfig | None, new: MethodConfig) -> bool:
    """Make ``model`` carry ``new`` instead of ``old`` (:func:`ropekit.install.uninstall`, then :func:`install`);
    returns whether anything changed. The model's own weights are untouched, so a stage can change a method's
    parameters; a method with trainable weights of its own builds them afresh (the trainer refuses such a switch)."""
    if not switch_changes(old, new):
        return False
    uninstall(model)
    install(model, new)
    return True
