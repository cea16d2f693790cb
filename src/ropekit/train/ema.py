"""Exponential moving average (EMA) of the trained weights.

After every ``every``-th optimizer step ``t`` (``t`` divisible by ``every``; skipped steps do not count
because they change nothing), each trainable tensor's average moves towards the current weights::

    ema_t = decay · ema_{t−every} + (1 − decay) · θ_t,        ema_0 = θ_0 (the weights before training)

with no bias correction — the average starts at the initial weights, as ``torch.optim.swa_utils``'
``get_ema_multi_avg_fn`` and Lightning's EMA do. The average is kept in float32 whatever the training
dtype (bf16 weights would round the small ``(1 − decay)·θ`` increments away).

Sharding (docs/methods-reference.md §11): the update is elementwise, so it is exact
when applied to each process's *local* piece of a parameter, as long as the average is partitioned like
the parameter. The EMA therefore holds, per parameter, a copy of what this process owns:

* single process and DDP: the whole tensor (identical on every rank; rank 0 saves it);
* FSDP2 (``DTensor`` parameters): ``param.to_local()``, the rank's shard (every rank saves its own file);
* DeepSpeed ZeRO-3: ``param.ds_tensor``, the rank's partition (every rank saves its own file).

Exporting EMA weights swaps them into the parameters (:meth:`EMA.swap`) and uses the ordinary export,
which gathers shards where needed, then swaps the trained weights back.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch


def local_tensor(param: torch.Tensor) -> torch.Tensor:
    """The part of ``param`` this process owns (the whole tensor unless it is sharded)."""
    if hasattr(param, "ds_tensor"):  # DeepSpeed ZeRO-3 partition
        return param.ds_tensor
    if hasattr(param, "to_local"):  # torch DTensor (FSDP2, tensor parallel)
        return param.to_local()
    return param


def is_sharded(params) -> bool:
    return any(hasattr(p, "ds_tensor") or hasattr(p, "to_local") for p in params)


class EMA:
    """EMA of ``named_params`` (``[(name, parameter), …]``, normally the trainable ones); see the module doc."""

    def __init__(self, named_params, decay: float, every: int = 1):
        if not 0.0 <= decay < 1.0:
            raise ValueError("decay must be in [0, 1)")
        if every < 1:
            raise ValueError("every must be ≥ 1")
        self.decay = float(decay)
        self.every = int(every)
        self.names = [name for name, _ in named_params]
        self.params = [p for _, p in named_params]
        self.sharded = is_sharded(self.params)
        with torch.no_grad():
            self.shadow = [local_tensor(p).detach().float().clone() for p in self.params]
        self.updates = 0
        self._backup: list[torch.Tensor] | None = None

    @torch.no_grad()
    def update(self, step: int) -> bool:
        """Fold the current weights in if ``step`` (1-based optimizer step) is an EMA step; returns whether it was."""
        if step % self.every:
            return False
        current = [local_tensor(p).detach().float() for p in self.params]
        # lerp: shadow + w·(θ − shadow) = (1 − w)·shadow + w·θ with w = 1 − decay
        torch._foreach_lerp_(self.shadow, current, 1.0 - self.decay)
        self.updates += 1
        return True

    def averaged(self) -> dict[str, torch.Tensor]:
        """``{name: average}`` (this process's pieces; float32)."""
        return dict(zip(self.names, self.shadow))

    # ---- using the average -----------------------------------------------------------------------------
    @torch.no_grad()
    def copy_to(self) -> None:
        """Overwrite the parameters with the average (in their own dtype)."""
        for p, avg in zip(self.params, self.shadow):
            local = local_tensor(p)
            local.copy_(avg.to(local.dtype))

    @contextlib.contextmanager
    def swap(self):
        """Context: the parameters hold the average inside, their trained values again after."""
        with torch.no_grad():
            backup = [local_tensor(p).detach().clone() for p in self.params]
        self.copy_to()
        try:
            yield
        finally:
            with torch.no_grad():
                for p, saved in zip(self.params, backup):
                    local_tensor(p).copy_(saved)

    # ---- checkpoints ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "decay": self.decay,
            "every": self.every,
            "updates": self.updates,
            "names": list(self.names),
            "shadow": [t.detach().cpu() for t in self.shadow],
        }

    def load_state_dict(self, state: dict) -> None:
        if list(state["names"]) != self.names:
            raise ValueError("the EMA in the checkpoint tracks different parameters than this model")
        if [tuple(t.shape) for t in state["shadow"]] != [tuple(t.shape) for t in self.shadow]:
            raise ValueError("the EMA in the checkpoint has different shapes (another sharding or model?)")
        with torch.no_grad():
            for mine, saved in zip(self.shadow, state["shadow"]):
                mine.copy_(saved.to(mine.device))
        self.decay = float(state["decay"])
        self.every = int(state["every"])
        self.updates = int(state["updates"])

    def file_name(self, rank: int) -> str:
        return f"ema-rank{rank}.pt" if self.sharded else "ema.pt"

    def save(self, directory: Path, rank: int, is_main: bool) -> None:
        """Write this process's average into ``directory`` (every rank when sharded, else the main one)."""
        if self.sharded or is_main:
            torch.save(self.state_dict(), Path(directory) / self.file_name(rank))

    def load(self, directory: Path, rank: int) -> None:
        self.load_state_dict(torch.load(Path(directory) / self.file_name(rank), map_location="cpu", weights_only=True))
