"""The loss guard: a training step's update is skipped when it would harm the run.

A step is skipped when it has no label token, when its loss or gradient norm is not finite
(``train.guard.skip_nonfinite``), or when its loss exceeds ``spike_factor`` times the mean of the last
``spike_window`` applied steps' losses (a loss spike; judged once at least ``min(spike_window, 8)`` losses are
known). More than ``max_skipped`` skipped steps abort the run (:class:`TrainingAborted`); ``--resume``
continues it from its last checkpoint, where the guard's history and counter are saved.
"""

from __future__ import annotations

import collections
import math
from typing import Any

from ..errors import RopekitError


class TrainingAborted(RopekitError):
    """The loss guard skipped more steps than ``train.guard.max_skipped`` allows."""


class LossGuard:
    """The guard of ``train.guard`` (its ``skip_nonfinite``, ``spike_factor``, ``spike_window``, ``max_skipped``)."""

    def __init__(self, settings):
        self.settings = settings
        self.history: collections.deque = collections.deque(maxlen=settings.spike_window)
        self.skipped = 0

    def _spike(self, loss: float) -> bool:
        if self.settings.spike_factor is None or len(self.history) < min(self.settings.spike_window, 8):
            return False
        mean = sum(self.history) / len(self.history)
        return loss > self.settings.spike_factor * mean

    def verdict(self, loss: float, grad_norm: float, n_labels: int) -> str | None:
        """Why the step with this loss and gradient norm is skipped, or ``None`` to apply it."""
        if n_labels == 0:
            return "no_label_tokens"
        if self.settings.skip_nonfinite and not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return "nonfinite"
        if self._spike(loss):
            return "spike"
        return None

    def record(self, loss: float, skipped: str | None) -> None:
        """Count a skipped step, or remember an applied step's loss for the spike test."""
        if skipped is None:
            self.history.append(loss)
        else:
            self.skipped += 1

    def enforce(self, step: int, reason: str | None) -> None:
        """Abort the run once more steps were skipped than ``max_skipped`` allows."""
        limit = self.settings.max_skipped
        if self.skipped > limit:
            raise TrainingAborted(
                f"training aborted at step {step}: {self.skipped} steps skipped by the loss guard "
                f"(last: {reason}), more than train.guard.max_skipped={limit}",
                "raise train.guard.max_skipped (or loosen its spike test) and --resume from the last checkpoint (the "
                "same settings replay the same abort), or lower train.lr or check the data in a new --out",
            )

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped = int(state["skipped"])
        self.history.clear()
        self.history.extend(float(x) for x in state["history"])
