"""Where a training run's step metrics go: ``DIR/metrics.jsonl`` (one JSON object per optimizer step), the
console, and TensorBoard / Weights & Biases when the recipe's ``output`` asks for them."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.jsonsafe import json_safe

METRICS_FILE = "metrics.jsonl"


def _rows(path: Path, until: int):
    """``(line, row)`` of ``path``'s rows of steps ≤ ``until`` (a line cut by a kill is passed over)."""
    if not path.is_file():
        return
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= until:
            yield line, row


def logged_losses(out: Path, until: int) -> list[tuple[int, float]]:
    """``[(step, loss)]`` of ``metrics.jsonl`` up to step ``until`` (a finished run reports its last loss)."""
    return [(row["step"], float(row["loss"])) for _, row in _rows(Path(out) / METRICS_FILE, until)
            if isinstance(row.get("loss"), (int, float))]


class MetricsFile:
    """``DIR/metrics.jsonl``, keeping only the rows of steps ≤ ``keep_until`` (the resumed checkpoint): the
    steps after it are recomputed, so each step appears once."""

    def __init__(self, out: Path, keep_until: int):
        path = Path(out) / METRICS_FILE
        kept = [line for line, _ in _rows(path, keep_until)] if keep_until > 0 else []
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
        self.file = open(path, "a", encoding="utf-8")

    def __call__(self, row: dict[str, Any]) -> None:
        self.file.write(json.dumps(json_safe(row)) + "\n")
        self.file.flush()

    def sync(self) -> None:
        """On disk before a checkpoint is published, so a resumed run finds every row up to it."""
        os.fsync(self.file.fileno())

    def close(self) -> None:
        if not self.file.closed:
            self.file.close()


def console_line(row: dict[str, Any], last_step: int) -> str:
    note = f"  [yellow]skipped ({row['skipped']})[/]" if row["skipped"] else ""
    return (f"step {row['step']}/{last_step}  loss {row['loss']:.4f}  lr {row['lr']:.3e}  "
            f"|g| {row['grad_norm']:.3f}  tokens {row['total_tokens']:,}  stage {row['stage']}{note}")


def start_trackers(output, out: Path, step: int, config: dict[str, Any]) -> tuple[list[Callable[[dict], None]], list[Callable[[], Any]]]:
    """``(trackers, closers)`` of the TensorBoard writer and the W&B run ``output`` asks for, continuing after
    ``step``."""
    trackers: list[Callable[[dict], None]] = []
    closers: list[Callable[[], Any]] = []
    if output.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=str(out / "tensorboard"), purge_step=step + 1)

        def tb(row):
            for key in ("loss", "lr", "grad_norm"):
                if isinstance(row.get(key), float) and math.isfinite(row[key]):
                    writer.add_scalar(f"train/{key}", row[key], row["step"])
            writer.flush()

        trackers.append(tb)
        closers.append(writer.close)
    if output.wandb is not None:
        import wandb

        # one W&B run per run directory, so that --resume continues it
        run_id = hashlib.sha1(str(out.resolve()).encode()).hexdigest()[:16]
        run = wandb.init(project=output.wandb.project or "ropekit", name=output.wandb.name,
                         entity=output.wandb.entity, dir=str(out), config=json_safe(config), id=run_id, resume="allow")

        def wb(row):
            run.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}, step=row["step"])

        trackers.append(wb)
        closers.append(run.finish)
    return trackers, closers
