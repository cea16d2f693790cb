"""Formatting for the study report: task titles, number/length/duration formats, score colours, table cells
and the manifest settings the report reads."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import RopekitError

TASK_TITLES = {
    "ppl": "Perplexity",
    "passkey": "Passkey retrieval",
    "niah": "Needle in a haystack",
    "ruler": "RULER",
    "longbench": "LongBench",
    "manyshot": "Many-shot in-context learning",
    "short": "Short-context tasks",
    "entropy": "Attention entropy",
    "speed": "Speed and memory",
}
#: Per-subtask breakdown field of a task's table (RULER tasks, LongBench datasets, many-shot shot counts).
BREAKDOWN = {"ruler": "subtask", "longbench": "dataset", "manyshot": "shots"}
HEATMAP_TASKS = ("passkey", "niah")
_GRID_COLORS = ((0xF0, 0x49, 0x6E), (0xEB, 0xB8, 0x39), (0x0C, 0xD7, 0x9F))  # plots.HEATMAP_COLORS as RGB
DASH = "–"
#: File names of the figures a report draws; an earlier report's are removed before a new one is written.
_FIGURE_NAME = re.compile(r"(ppl_vs_length|nll_by_position|ppl_vs_accuracy|train_loss|[A-Za-z0-9._-]+_vs_length|[a-z]+_heatmaps)\.png")


# ---- formatting -------------------------------------------------------------------------------------------
def length_label(length: int | None) -> str:
    """``4096`` → ``4k``; lengths that are not whole multiples of 1024 stay as they are."""
    if length is None:
        return DASH
    return f"{length // 1024}k" if length >= 1024 and length % 1024 == 0 else str(length)


def fmt_ppl(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return DASH
    if math.isinf(v):
        return "∞"
    if v >= 1000:
        return f"{v:,.0f}"
    return f"{v:.1f}" if v >= 100 else f"{v:.2f}"


def fmt_pct(v: float | None) -> str:
    return DASH if v is None else f"{100 * v:.1f}"


def fmt_ratio(v: float | None) -> str:
    return DASH if v is None else f"{v:.2f}×"


def fmt_num(v: float | None, digits: int = 3) -> str:
    return DASH if v is None else f"{v:.{digits}g}"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    seconds = round(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else (f"{m}m {s:02d}s" if m else f"{s}s")


def score_color(v: float | None, alpha: float = 0.55) -> str | None:
    """Background of a cell holding a score in [0, 1], on the heatmaps' red → yellow → green scale."""
    if v is None:
        return None
    v = min(1.0, max(0.0, float(v)))
    lo, hi, t = (_GRID_COLORS[0], _GRID_COLORS[1], v * 2) if v <= 0.5 else (_GRID_COLORS[1], _GRID_COLORS[2], v * 2 - 1)
    r, g, b = (round(a + (b_ - a) * t) for a, b_ in zip(lo, hi))
    return f"background: rgba({r}, {g}, {b}, {alpha})"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-")[:40] or "method"


def _cell(text: Any, *, cls: str = "", style: str | None = None) -> dict[str, Any]:
    return {"text": str(text), "cls": cls, "style": style}


def _table(caption: str, columns: Sequence[str], rows: list[list[dict[str, Any]]], note: str = "") -> dict[str, Any]:
    return {"caption": caption, "columns": list(columns), "rows": rows, "note": note}


# ---- manifest ---------------------------------------------------------------------------------------------
def _setting(manifest: Mapping[str, Any], key: str) -> Any:
    if manifest.get(key) is not None:
        return manifest[key]
    config = manifest.get("config")
    return config.get(key) if isinstance(config, Mapping) else None


def _int_or_none(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise RopekitError(f"the study manifest has a non-integer length {value!r}", "set window/target_length to token counts")
    return int(value)


def _preferred_methods(manifest: Mapping[str, Any]) -> list[str]:
    out = []
    for m in _setting(manifest, "methods") or []:
        if isinstance(m, Mapping):
            m = m.get("label") or m.get("name")
        if m is not None:
            out.append(str(m))
    return out
