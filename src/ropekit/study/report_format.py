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


def fmt_ci(ci: Sequence[float] | None, kind: str = "num") -> str:
    """A 95 % interval as ``[low, high]`` in the format of its value's ``kind`` (ppl, pct, ratio, num, diff
    — a difference of accuracies in percentage points, signed), or ``""`` when there is none."""
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    lo, hi = ci
    if kind == "ppl":  # both ends with the precision of the larger one (not "[92.44, 173.0]")
        if hi is not None and math.isfinite(hi) and 100 <= hi < 1000:
            return f"[{lo:.1f}, {hi:.1f}]"
        return f"[{fmt_ppl(lo)}, {fmt_ppl(hi)}]"
    if kind == "pct":
        return f"[{100 * lo:.0f}, {100 * hi:.0f}]"
    if kind == "diff":
        return f"[{100 * lo:+.0f}, {100 * hi:+.0f}]"
    if kind == "ratio":
        return f"[{lo:.3f}, {hi:.3f}]"
    if kind == "tau":
        return f"[{lo:+.2f}, {hi:+.2f}]"
    return f"[{fmt_num(lo)}, {fmt_num(hi)}]"


def fmt_value(v: float | None, kind: str) -> str:
    """A value in the format of its ``kind`` (see :func:`fmt_ci`)."""
    if kind == "ppl":
        return fmt_ppl(v)
    if kind == "pct":
        return fmt_pct(v)
    if kind == "diff":
        return DASH if v is None else f"{100 * v:+.1f}"
    if kind == "ratio":
        return DASH if v is None else f"{v:.3f}"
    if kind == "tau":
        return DASH if v is None else f"{v:+.2f}"
    return fmt_num(v, 4)


def fmt_seeds(row: Mapping[str, Any] | None, kind: str) -> str:
    """``3 seeds: 128.1–130.2`` (the spread of the per-seed values) for a cell with several seeds, else ``""``."""
    if not row or (row.get("seeds") or 1) < 2:
        return ""
    if row.get("seed_min") is None:
        return f"{row['seeds']} seeds"
    return f"{row['seeds']} seeds: {fmt_value(row['seed_min'], kind)}–{fmt_value(row['seed_max'], kind)}"


#: What one unit of each task is, for "n = …" next to the tables.
UNIT_NOUNS = {"ppl": "documents", "speed": "repeats", "entropy": "samples"}


def unit_noun(task: str) -> str:
    if isinstance(task, str) and task.startswith(("ppl-", "ppl_")):  # a further perplexity entry (stats.is_perplexity)
        return "documents"
    return UNIT_NOUNS.get(task, "prompts")


def fmt_counts(ns: Sequence[int], task: str) -> str:
    """``n = 8 documents per cell`` (or ``n = 6–8 …`` when cells differ)."""
    ns = sorted({int(n) for n in ns if n is not None})
    if not ns:
        return ""
    span = str(ns[0]) if len(ns) == 1 else f"{ns[0]}–{ns[-1]}"
    return f"n = {span} {unit_noun(task)} per cell"


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


def _cell(text: Any, *, cls: str = "", style: str | None = None, sub: str = "", extra: str = "",
          flag: str = "") -> dict[str, Any]:
    """A table cell: ``text``, and optionally ``sub`` (its interval) and ``extra`` (the spread over seeds),
    shown smaller after it (in Markdown: after a space), and ``flag`` — a value computed from a piece that has
    not finished (``3 of 8, unfinished``), marked after the rest (in Markdown in parentheses; on the page
    highlighted, and the cell's class gets ``partial``)."""
    if flag:
        cls = f"{cls} partial".strip()
    return {"text": str(text), "cls": cls, "style": style, "sub": sub, "extra": extra, "flag": flag}


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
