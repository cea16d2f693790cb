"""Evaluations: each task is a registered unit (``ropekit eval TASK MODEL …``); results are JSON lines."""

from __future__ import annotations

#: Task name → one-line description; ``ropekit eval`` accepts exactly these.
TASKS = {
    "speed": "prefill time, decode time per token and peak memory per length, several methods interleaved",
}
