"""``ropekit report DIR``: the study's results as one self-contained HTML page, Markdown, JSON and PNGs.

Reads ``DIR/study.sqlite`` (:mod:`ropekit.study.store`) and writes into ``DIR/report/``:

* ``index.html`` — one page with no external assets: CSS inline, every figure embedded as a base64 PNG,
  all text HTML-escaped (jinja2 autoescape). At the top the manifest (model, pretrained window → target
  length, machine, versions, wall time) and the ranked headline table; then one section per task that has
  results (a task without results has no section): perplexity vs length and the per-position NLL curves
  (LCEG Fig. 3), passkey and needle heatmaps per method (depth × length, the red → yellow → green
  convention of gkamradt's needle notebook and LCEG, drawn by :func:`ropekit.eval.plots.heatmap`),
  accuracy vs length and method × length tables for every accuracy task with a per-subtask breakdown for
  RULER, LongBench and many-shot, attention entropy, the speed/memory table (LCEG Table 8), Kendall τ
  between perplexity and each downstream accuracy across methods (LCEG Table 6), training loss curves,
  and the state of the study's pieces;
* ``summary.json`` — the manifest, every aggregate ``{"method", "task", "length", "metric", "value", "n"}``
  (:func:`ropekit.study.stats.aggregate`), the ranking, the Kendall rows and the piece counts;
* ``summary.md`` — the same tables in Markdown;
* the PNG figures the page embeds.

Manifest keys read (top level, or inside ``config``): ``name``, ``model``, ``window`` (the base model's
pretrained context, tokens), ``target_length`` (the length the study extends to), ``methods`` (display
order), ``machine``, ``versions``, ``seeds``, ``created``/``updated``. Figures draw dashed vertical lines at
``window`` and ``target_length`` where they are known.
"""

from __future__ import annotations

import base64
import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import RopekitError
from . import stats
from .store import DB_NAME, StudyStore

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


# ---- figures ----------------------------------------------------------------------------------------------
def _mpl(text: Any) -> str:
    """A label matplotlib draws as written: ``$`` would start mathtext (and may fail to parse), a leading
    ``_`` hides a legend entry."""
    text = str(text).replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def _plain_log_labels(axis) -> None:
    """Ticks of a log axis at 1, 2, 3, 5 × 10^k labelled as plain numbers (``20``, not ``2×10¹``)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


class _Figures:
    """Draws the report's PNGs with matplotlib's object API and the Agg canvas (no pyplot, headless)."""

    def __init__(self, out: Path, methods: Sequence[str], window: int | None, target: int | None):
        from matplotlib import colormaps

        self.out = out
        self.window, self.target = window, target
        palette = colormaps["tab10" if len(methods) <= 10 else "tab20"]
        others = [m for m in methods if m != stats.PLAIN]
        self.colors = {m: palette(i % palette.N) for i, m in enumerate(others)}
        self.colors[stats.PLAIN] = (0.1, 0.1, 0.1, 1.0)
        self.paths: list[Path] = []

    def color(self, method: str):
        return self.colors.get(method, (0.5, 0.5, 0.5, 1.0))

    def new(self, width: float = 6.4, height: float = 4.0, ncols: int = 1):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(width, height))
        FigureCanvasAgg(fig)
        axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]  # ncols=0: the caller adds its own
        for ax in axes:
            ax.grid(alpha=0.3)
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
        return fig, axes

    def save(self, fig, name: str, *, tight: bool = True) -> Path:
        path = self.out / name
        if tight:
            fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
        self.paths.append(path)
        return path

    def windows(self, ax, lengths: Sequence[int]) -> None:
        """Dashed vertical lines at the pretrained window and the target length (when in the x range)."""
        if not lengths:
            return
        lo, hi = min(lengths), max(lengths)
        for value, label, color in ((self.window, "pretrained window", "#555555"), (self.target, "target length", "#1B1B3A")):
            if value is not None and lo / 1.5 <= value <= hi * 1.5:
                ax.axvline(value, linestyle="--", color=color, linewidth=1.2, label=f"{label} ({length_label(value)})")

    def length_axis(self, ax, lengths: Sequence[int]) -> None:
        from matplotlib.ticker import FixedLocator, NullLocator

        if len(lengths) > 1:
            ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(list(lengths)))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([length_label(L) for L in lengths])
        ax.set_xlabel("context length (tokens)")

    def legend(self, ax, n: int) -> None:
        """Inside the axes for a few lines; beside them (right) for many, where it would hide the data."""
        if n > 6:
            ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, ncol=1 if n <= 18 else 2, frameon=False)
        else:
            ax.legend(fontsize=8, frameon=False)

    def width(self, n: int, base: float = 6.4) -> float:
        return base + (1.5 if n > 6 else 0.0)

    def metric_vs_length(self, table: stats.Table, task: str, metric: str, methods: Sequence[str], name: str,
                         ylabel: str, *, log: bool = False, percent: bool = False) -> Path | None:
        lengths = table.lengths(task)
        fig, (ax,) = self.new(width=self.width(len(methods)))
        drawn = 0
        for m in methods:
            pts = [(L, table.get(m, task, L, metric)) for L in lengths]
            pts = [(L, v) for L, v in pts if v is not None and math.isfinite(v)]
            if not pts:
                continue
            ys = [100 * v for _, v in pts] if percent else [v for _, v in pts]
            ax.plot([L for L, _ in pts], ys, marker="o", markersize=4, color=self.color(m), label=_mpl(m),
                    linestyle="--" if m == stats.PLAIN else "-", linewidth=1.6)
            drawn += 1
        if not drawn:
            return None
        if log:
            ax.set_yscale("log")
            _plain_log_labels(ax.yaxis)
        if percent:
            ax.set_ylim(-3, 103)
        self.windows(ax, lengths)
        self.length_axis(ax, lengths)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{TASK_TITLES.get(task, task)}: {ylabel} by length", fontsize=10)
        self.legend(ax, drawn)
        return self.save(fig, name)

    def curves(self, curves: list[dict[str, Any]], methods: Sequence[str], name: str) -> Path | None:
        lengths = sorted({c["length"] for c in curves})
        if not lengths:
            return None
        shown = lengths[-4:]  # the longest four lengths: where methods differ
        fig, axes = self.new(width=min(16.0, 4.2 * len(shown) + 0.6) + (1.5 if len(methods) > 6 else 0), height=3.8, ncols=len(shown))
        order = {m: i for i, m in enumerate(methods)}
        for ax, L in zip(axes, shown):
            for c in sorted((c for c in curves if c["length"] == L), key=lambda c: order.get(c["method"], 99)):
                pts = [(p, v) for p, v in zip(c["positions"], c["mean_nll"]) if v is not None]
                ax.plot([p for p, _ in pts], [v for _, v in pts], color=self.color(c["method"]), linewidth=1.3,
                        label=_mpl(c["method"]), linestyle="--" if c["method"] == stats.PLAIN else "-")
            if self.window is not None and self.window < L:
                ax.axvline(self.window, linestyle="--", color="#555555", linewidth=1.2, label=f"pretrained window ({length_label(self.window)})")
            ax.set_title(f"L = {length_label(L)}", fontsize=10)
            ax.set_xlabel("position in the window")
        axes[0].set_ylabel("mean NLL (nats)")
        self.legend(axes[-1], len(methods))
        return self.save(fig, name)

    def scatter(self, table: stats.Table, kendall: list[dict[str, Any]], name: str) -> Path | None:
        rows = [k for k in kendall if k["mode"] == "target" and len(k["methods"]) >= 2]
        if not rows:
            return None
        fig, axes = self.new(width=min(16.0, 4.0 * len(rows) + 0.6), height=3.6, ncols=len(rows))
        for ax, k in zip(axes, rows):
            L = k["lengths"][0]
            for m in k["methods"]:
                x, y = table.get(m, "ppl", L, "ppl"), table.get(m, k["task"], L, "accuracy")
                ax.scatter([x], [100 * y], color=self.color(m), s=28, zorder=3)
                ax.annotate(_mpl(m), (x, 100 * y), fontsize=7, xytext=(3, 3), textcoords="offset points")
            ax.set_xscale("log")
            _plain_log_labels(ax.xaxis)
            tau = "undefined" if k["tau"] is None else f"{k['tau']:.2f}"
            ax.set_title(f"{TASK_TITLES.get(k['task'], k['task'])} @ {length_label(L)} (τ = {tau})", fontsize=9)
            ax.set_xlabel("perplexity")
        axes[0].set_ylabel("accuracy (%)")
        return self.save(fig, name)

    def heatmap_grid(self, grids: Mapping[str, Mapping[tuple[float, int], float]], name: str, title: str) -> Path:
        """Depth × length heatmaps, one panel per method, drawn as :func:`ropekit.eval.plots.heatmap` draws
        one (gkamradt/LCEG convention: depth 0 at the top, categorical lengths left to right, the
        red → yellow → green map over a fixed 0..1, cell values printed when the figure is small enough to
        read them) with the pretrained window (white dashed) and the target length (dark dashed) on the
        column boundaries of :func:`ropekit.eval.plots.window_position`. Panels share one figure and one
        colour bar so methods compare at a glance — and so a 15-method study draws one figure, not 15."""
        import numpy as np
        from matplotlib.colors import LinearSegmentedColormap

        from ..eval.plots import HEATMAP_COLORS, window_position

        cmap = LinearSegmentedColormap.from_list("ropekit_niah", list(HEATMAP_COLORS)).with_extremes(bad="#D9D9D9")
        n = len(grids)
        ncols = min(4, n)
        nrows = -(-n // ncols)
        total_cells = sum(len(g) for g in grids.values())
        annotate = total_cells <= 400
        fig, _ = self.new(width=3.3 * ncols + 1.3, height=2.7 * nrows + 0.9, ncols=0)
        mesh = None
        for i, (method, cells) in enumerate(grids.items()):
            ax = fig.add_subplot(nrows, ncols, i + 1)
            rows = sorted({r for r, _ in cells})
            columns = sorted({c for _, c in cells})
            matrix = np.array([[cells.get((r, c), np.nan) for c in columns] for r in rows], dtype=float)
            mesh = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto",
                             interpolation="nearest", extent=(0, len(columns), len(rows), 0))
            for x in range(1, len(columns)):
                ax.axvline(x, color="grey", linestyle="--", linewidth=0.4)
            if annotate:
                for a, r in enumerate(rows):
                    for b, c in enumerate(columns):
                        if not np.isnan(matrix[a, b]):
                            ax.text(b + 0.5, a + 0.5, f"{matrix[a, b]:.2f}", ha="center", va="center", fontsize=6, color="#202020")
            for value, style in ((self.window, {"color": "white", "linewidth": 2.2}), (self.target, {"color": "#1B1B3A", "linewidth": 1.6})):
                x = window_position(columns, value)
                if x is not None and 0 < x < len(columns):
                    ax.axvline(x, linestyle="--", **style)
            ax.set_xticks([j + 0.5 for j in range(len(columns))])
            ax.set_xticklabels([length_label(c) for c in columns], fontsize=7)
            step = max(1, -(-len(rows) // 11))
            ax.set_yticks([a + 0.5 for a in range(0, len(rows), step)])
            ax.set_yticklabels([f"{rows[a] * 100:.0f}" for a in range(0, len(rows), step)], fontsize=7)
            ax.set_title(_mpl(method), fontsize=9)
            ax.grid(False)
            if i % ncols == 0:
                ax.set_ylabel("depth (%)", fontsize=8)
            if i >= n - ncols:
                ax.set_xlabel("length (tokens)", fontsize=8)
        fig.subplots_adjust(left=0.9 / fig.get_figwidth(), right=1 - 1.2 / fig.get_figwidth(), bottom=0.6 / fig.get_figheight(),
                            top=1 - 0.55 / fig.get_figheight(), wspace=0.25, hspace=0.5)
        cax = fig.add_axes([1 - 0.95 / fig.get_figwidth(), 0.15, 0.18 / fig.get_figwidth(), 0.7])
        fig.colorbar(mesh, cax=cax, label="accuracy")
        lines = []
        if self.window is not None:
            lines.append(f"white dashed: pretrained window ({length_label(self.window)})")
        if self.target is not None:
            lines.append(f"dark dashed: target length ({length_label(self.target)})")
        fig.suptitle(_mpl(title) + (" — " + "; ".join(lines) if lines else ""), fontsize=10)
        return self.save(fig, name, tight=False)

    def training(self, metrics: list[dict[str, Any]], name: str) -> Path | None:
        series: dict[str, list[tuple[int, float]]] = {}
        for m in metrics:
            if isinstance(m.get("loss"), (int, float)) and math.isfinite(m["loss"]):
                series.setdefault(m.get("method") or m["piece"], []).append((m["step"], float(m["loss"])))
        if not series:
            return None
        fig, (ax,) = self.new(width=self.width(len(series)))
        for method, pts in series.items():
            ax.plot([s for s, _ in pts], [v for _, v in pts], color=self.color(method), linewidth=1.3, label=_mpl(method))
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.set_title("Training loss", fontsize=10)
        self.legend(ax, len(series))
        return self.save(fig, name)


# ---- the sections -----------------------------------------------------------------------------------------
def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _figure(path: Path | None, caption: str, *, wide: bool = False) -> dict[str, Any] | None:
    if path is None:
        return None
    return {"src": _data_uri(path), "caption": caption, "file": path.name, "wide": wide}


def _length_table(table: stats.Table, task: str, metric: str, methods: Sequence[str], caption: str, *,
                  kind: str, window: int | None) -> dict[str, Any]:
    """Method × length table of one metric; scores coloured on the heatmap scale, the best ppl in bold."""
    lengths = table.lengths(task)
    best = {}
    if kind == "ppl":
        for L in lengths:
            values = [table.get(m, task, L, metric) for m in methods]
            values = [v for v in values if v is not None and math.isfinite(v)]
            best[L] = min(values) if values else None
    rows = []
    for m in methods:
        if m not in table.methods(task):
            continue
        cells = [_cell(m, cls="method")]
        for L in lengths:
            v = table.get(m, task, L, metric)
            if kind == "ppl":
                cells.append(_cell(fmt_ppl(v), cls="num best" if v is not None and v == best.get(L) else "num"))
            elif kind == "pct":
                cells.append(_cell(fmt_pct(v), cls="num", style=score_color(v)))
            else:
                cells.append(_cell(fmt_num(v, 4), cls="num"))
        rows.append(cells)
    columns = ["Method"] + [length_label(L) + (" ▸" if window is not None and L > window else "") for L in lengths]
    note = "▸ marks lengths beyond the pretrained window." if window is not None and any(L > window for L in lengths) else ""
    return _table(caption, columns, rows, note)


def _breakdown_table(records: list[dict[str, Any]], task: str, field: str, methods: Sequence[str],
                     length: int) -> dict[str, Any] | None:
    recs = [r for r in records if r.get("task") == task and r.get("length") == length and r.get(field) is not None
            and isinstance(r.get("score"), (int, float))]
    if not recs:
        return None
    parts = sorted({r[field] for r in recs}, key=lambda v: (isinstance(v, str), v))
    groups: dict[tuple, list[float]] = {}
    for r in recs:
        groups.setdefault((r["method"], r[field]), []).append(float(r["score"]))
    rows = []
    for m in methods:
        if not any((m, p) in groups for p in parts):
            continue
        cells = [_cell(m, cls="method")]
        for p in parts:
            scores = groups.get((m, p))
            v = statistics.fmean(scores) if scores else None
            cells.append(_cell(fmt_pct(v), cls="num", style=score_color(v)))
        rows.append(cells)
    return _table(f"{TASK_TITLES.get(task, task)} by {field} at {length_label(length)} tokens (accuracy, %)",
                  ["Method"] + [str(p) for p in parts], rows)


def _heatmaps(records: list[dict[str, Any]], task: str, methods: Sequence[str], figs: _Figures) -> list[dict[str, Any]]:
    """One figure per task with a depth × length heatmap panel per method (see :meth:`_Figures.heatmap_grid`)."""
    from ..eval.plots import grid_from

    grids = {}
    for m in methods:
        recs = [r for r in records if r.get("task") == task and r.get("method") == m
                and isinstance(r.get("depth"), (int, float)) and isinstance(r.get("score"), (int, float))]
        if recs:
            grids[m] = grid_from(recs)
    if not grids:
        return []
    path = figs.heatmap_grid(grids, f"{task}_heatmaps.png", TASK_TITLES[task])
    return [_figure(path, f"{TASK_TITLES[task]}: accuracy by needle depth (rows, % of the context) and length (columns), "
                          "one panel per method", wide=True)]


def _speed_table(table: stats.Table, methods: Sequence[str]) -> dict[str, Any]:
    rows = []
    for L in table.lengths("speed"):
        for m in methods:
            if table.get(m, "speed", L, "prefill_s") is None:
                continue
            def g(metric, m=m, L=L):
                return table.get(m, "speed", L, metric)

            dec = g("decode_s_per_token")
            mem = g("peak_mem_bytes")
            rows.append([
                _cell(m, cls="method"), _cell(length_label(L), cls="num"),
                _cell(fmt_num(g("prefill_s")), cls="num"), _cell(fmt_ratio(g("prefill_ratio")), cls="num"),
                _cell(fmt_num(dec * 1000 if dec is not None else None), cls="num"), _cell(fmt_ratio(g("decode_ratio")), cls="num"),
                _cell(DASH if mem is None else f"{mem / 2**20:.1f}", cls="num"), _cell(fmt_ratio(g("memory_ratio")), cls="num"),
            ])
    return _table("Speed and memory (medians over repeats; × = relative to plain at the same length)",
                  ["Method", "Length", "Prefill (s)", "× plain", "Decode (ms/token)", "× plain", "Peak memory (MiB)", "× plain"],
                  rows, "Peak memory is the extra memory of the call above the resident model (CUDA allocator or process RSS).")


def _kendall_table(kendall: list[dict[str, Any]]) -> dict[str, Any]:
    rows = []
    for k in kendall:
        basis = (f"at {length_label(k['lengths'][0])}" if k["mode"] == "target"
                 else "mean over " + ", ".join(length_label(L) for L in k["lengths"]))
        rows.append([
            _cell(TASK_TITLES.get(k["task"], k["task"]), cls="method"), _cell(basis),
            _cell(DASH if k["tau"] is None else f"{k['tau']:+.4f}", cls="num"),
            _cell(DASH if k["p_value"] is None else f"{k['p_value']:.4f}", cls="num"),
            _cell(k["n"], cls="num"), _cell(k["interpretation"]),
        ])
    return _table("Kendall τ-b between perplexity and downstream accuracy across methods",
                  ["Task", "Basis", "Kendall's τ", "p-value", "Methods", "Interpretation"], rows,
                  "“at L”: perplexity and accuracy at one length, the target length when both were evaluated there, "
                  "else the longest shared length. “mean”: mean log-perplexity and mean accuracy over the lengths both "
                  "share. Negative τ: lower perplexity goes with higher accuracy (LCEG Table 6).")


def _headline(table: stats.Table, ranking: dict[str, Any], methods: Sequence[str], kinds: Mapping[str, str],
              window: int | None, target: int | None) -> dict[str, Any] | None:
    if not ranking["rows"]:
        return None
    acc_tasks = [t for t in stats.ACCURACY_TASKS if t in table.tasks()] + [
        t for t in table.tasks() if t not in stats.ACCURACY_TASKS and any(r["task"] == t and r["metric"] == "accuracy" for r in table.rows)]
    ppl_at = ranking["ppl_length"]
    speed_lengths = table.lengths("speed")
    speed_at = (target if target in speed_lengths else speed_lengths[-1]) if speed_lengths else None
    columns = ["Rank", "Method", "Type"]
    if ppl_at is not None:
        columns.append(f"ppl @ {length_label(ppl_at)}")
    spans = {}
    for t in acc_tasks:
        lengths = table.lengths(t)
        beyond = [L for L in lengths if window is not None and L > window]
        spans[t] = beyond or lengths
        columns.append(f"{TASK_TITLES.get(t, t)} {'> window' if beyond else 'mean'} (%)")
    if speed_at is not None:
        columns.append(f"prefill × plain @ {length_label(speed_at)}")
    best_ppl = min((r["ppl"] for r in ranking["rows"] if r["ppl"] is not None and math.isfinite(r["ppl"])), default=None)
    rows = []
    for r in ranking["rows"]:
        m = r["method"]
        cells = [_cell(r["rank"], cls="num rank"), _cell(m, cls="method"), _cell(kinds.get(m, "frozen"), cls="kind")]
        if ppl_at is not None:
            cells.append(_cell(fmt_ppl(r["ppl"]), cls="num best" if r["ppl"] is not None and r["ppl"] == best_ppl else "num"))
        for t in acc_tasks:
            values = [table.get(m, t, L, "accuracy") for L in spans[t]]
            v = statistics.fmean(values) if values and all(x is not None for x in values) else None
            cells.append(_cell(fmt_pct(v), cls="num", style=score_color(v)))
        if speed_at is not None:
            cells.append(_cell(fmt_ratio(table.get(m, "speed", speed_at, "prefill_ratio")), cls="num"))
        rows.append(cells)
    note = ranking["rule"]
    if window is not None:
        note += f" “> window”: mean over the lengths beyond the pretrained window of {window} tokens (“mean”: over all lengths, when none lies beyond)."
    return _table("Methods ranked", columns, rows, note)


def _pieces_table(pieces: list[dict[str, Any]], status: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for kind, counts in sorted(status["by_kind"].items()):
        rows.append([_cell(kind, cls="method")] + [_cell(counts[s], cls="num") for s in ("done", "running", "pending", "failed")]
                    + [_cell(fmt_duration(sum(p["seconds"] or 0 for p in pieces if p["kind"] == kind)), cls="num")])
    return _table("Pieces of work", ["Kind", "Done", "Running", "Pending", "Failed", "Compute time"], rows)


# ---- Markdown ---------------------------------------------------------------------------------------------
def _md_escape(text: str) -> str:
    """Text safe in a Markdown table cell: no raw HTML tag can open (``<``), no cell break (``|``), one line."""
    return str(text).replace("<", "&lt;").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _md_table(t: dict[str, Any]) -> str:
    lines = [f"**{_md_escape(t['caption'])}**", "", "| " + " | ".join(_md_escape(c) for c in t["columns"]) + " |",
             "|" + "|".join("---:" if all("num" in row[i]["cls"] for row in t["rows"]) and t["rows"] else "---"
                            for i in range(len(t["columns"]))) + "|"]
    for row in t["rows"]:
        lines.append("| " + " | ".join(_md_escape(c["text"]) for c in row) + " |")
    if t.get("note"):
        lines += ["", _md_escape(t["note"])]
    return "\n".join(lines) + "\n"


# ---- the report -------------------------------------------------------------------------------------------
def _kinds(pieces: list[dict[str, Any]]) -> dict[str, str]:
    kinds = {stats.PLAIN: "base"}
    for p in pieces:
        if p["kind"] == "train" and p["method"] and p["method"] != stats.PLAIN:
            kinds[p["method"]] = "fine-tuned"
        elif p["kind"] == "search" and p["method"]:
            kinds[p["method"]] = "searched"  # LongRoPE factors found by search, evaluated frozen
    return kinds


def _header(manifest: Mapping[str, Any], pieces: list[dict[str, Any]], window: int | None, target: int | None) -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    model = _setting(manifest, "model")
    if model is not None:
        items.append(("Model", model if isinstance(model, str) else json.dumps(model, sort_keys=True)))
    if window is not None or target is not None:
        items.append(("Context", f"{window if window is not None else '?'} → {target if target is not None else '?'} tokens"))
    machine = manifest.get("machine") or {}
    if machine:
        parts = [machine.get("cpu") or "CPU"]
        if machine.get("cores"):
            parts.append(f"{machine['cores']} cores" + (f" ({machine['usable_cores']} usable)"
                                                        if machine.get("usable_cores") not in (None, machine["cores"]) else ""))
        if machine.get("ram_bytes"):
            parts.append(f"{machine['ram_bytes'] / 2**30:.0f} GiB RAM")
        parts.append(", ".join(machine.get("gpus") or []) or "no GPU")
        items.append(("Machine", " · ".join(str(p) for p in parts)))
        if machine.get("os"):
            items.append(("System", f"{machine['os']} · Python {machine.get('python', '?')}"))
    versions = manifest.get("versions") or {}
    if versions:
        items.append(("Versions", " · ".join(f"{k} {v}" for k, v in versions.items() if v)))
    if manifest.get("seeds") is not None:
        items.append(("Seeds", json.dumps(manifest["seeds"], sort_keys=True)))
    compute = sum(p["seconds"] or 0 for p in pieces if p["status"] == "done")
    started = [p["started"] for p in pieces if p["started"]]
    finished = [p["finished"] for p in pieces if p["finished"]]
    elapsed = None
    if started and finished:
        elapsed = (datetime.fromisoformat(max(finished)) - datetime.fromisoformat(min(started))).total_seconds()
    items.append(("Wall time", f"{fmt_duration(elapsed)} elapsed · {fmt_duration(compute)} of finished pieces"))
    if manifest.get("created"):
        items.append(("Created", f"{manifest['created']} · updated {manifest.get('updated', DASH)}"))
    return items


def build_report(study_dir: str | Path, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Compute everything the report shows and draw its figures; returns the page's context (see
    :func:`write_report`, which also renders and writes the files)."""
    study_dir = Path(study_dir)
    db = study_dir / DB_NAME if study_dir.is_dir() or not study_dir.exists() else study_dir
    if not db.exists():
        raise RopekitError(f"no study database at '{db}'", "pass the directory `ropekit study` wrote")
    out = Path(out_dir) if out_dir is not None else db.parent / "report"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):  # figures of an earlier report that this one may not redraw (only ours)
        if _FIGURE_NAME.fullmatch(old.name):
            old.unlink()
    with StudyStore(db, create=False) as store:
        manifest = store.get_manifest()
        records = store.samples()
        pieces = store.pieces()
        metrics = store.train_metrics()
        status = store.status()

    window = _int_or_none(_setting(manifest, "window"))
    target = _int_or_none(_setting(manifest, "target_length"))
    methods = stats.method_order([r.get("method") for r in records] + [p["method"] for p in pieces if p["method"]],
                                 _preferred_methods(manifest))
    rows = stats.aggregate(records, methods)
    table = stats.Table(rows)
    kendall = stats.perplexity_correlations(table, target)
    ranking = stats.rank_methods(table, window, target, methods)
    kinds = _kinds(pieces)
    figs = _Figures(out, methods, window, target)
    sections: list[dict[str, Any]] = []
    tables_md: list[dict[str, Any]] = []

    def section(key, title, intro="", figures=(), tables=()):
        figures = [f for f in figures if f]
        tables = [t for t in tables if t and t["rows"]]
        if figures or tables:
            sections.append({"id": key, "title": title, "intro": intro, "figures": figures, "tables": tables})
            tables_md.extend(tables)

    headline = _headline(table, ranking, methods, kinds, window, target)
    if headline:
        tables_md.append(headline)
    tasks = table.tasks()
    if "ppl" in tasks:
        first = next(r for r in records if r.get("task") == "ppl")
        protocol = ", ".join(f"{f} {first.get(f)}" for f in stats.PPL_PROTOCOL if first.get(f) is not None)
        how = ("exp of the mean over windows of each window's mean NLL (YaRN's weighting)" if first.get("weighting") == "window"
               else "exp of the token-weighted mean NLL over the evaluation documents")
        section("ppl", "Perplexity", how + (f" ({protocol})" if protocol else "") + ".",
                [_figure(figs.metric_vs_length(table, "ppl", "ppl", methods, "ppl_vs_length.png", "perplexity", log=True),
                         "Perplexity by length (log scale)"),
                 _figure(figs.curves(stats.nll_curves(records), methods, "nll_by_position.png"),
                         "Mean NLL by position in the window (LCEG Fig. 3)", wide=True)],
                [_length_table(table, "ppl", "ppl", methods, "Perplexity (lower is better; best per length in bold)",
                               kind="ppl", window=window)])
    acc_tasks = [t for t in stats.ACCURACY_TASKS if t in tasks] + [
        t for t in tasks if t not in stats.ACCURACY_TASKS and any(r["task"] == t and r["metric"] == "accuracy" for r in rows)]
    for t in acc_tasks:
        title = TASK_TITLES.get(t, t)
        figures = [_figure(figs.metric_vs_length(table, t, "accuracy", methods, f"{_slug(t)}_vs_length.png", "accuracy (%)",
                                                 percent=True), f"{title}: accuracy by length")]
        if t in HEATMAP_TASKS:
            figures += _heatmaps(records, t, methods, figs)
        tabs = [_length_table(table, t, "accuracy", methods, f"{title}: accuracy (%) by length", kind="pct", window=window)]
        if t in BREAKDOWN and table.lengths(t):
            ref = target if target in table.lengths(t) else table.lengths(t)[-1]
            tabs.append(_breakdown_table(records, t, BREAKDOWN[t], methods, ref))
        intro = {"ruler": "Accuracy is the mean over RULER's tasks of each task's mean score.",
                 "longbench": "Accuracy is the mean over datasets of each dataset's mean score, as LongBench averages."}.get(t, "")
        section(t, title, intro, figures, tabs)
    if "entropy" in tasks:
        section("entropy", TASK_TITLES["entropy"],
                "Attention entropy at the last position, mean over samples, layers and heads (nats).",
                [_figure(figs.metric_vs_length(table, "entropy", "entropy_last", methods, "entropy_vs_length.png", "entropy (nats)"),
                         "Attention entropy at the last position by length")],
                [_length_table(table, "entropy", "entropy_last", methods, "Entropy at the last position (nats)", kind="num", window=window),
                 _length_table(table, "entropy", "normalised_last", methods, "Normalised entropy at the last position", kind="num", window=window)])
    if "speed" in tasks:
        section("speed", TASK_TITLES["speed"], "", [], [_speed_table(table, methods)])
    if kendall:
        section("kendall", "Perplexity vs downstream accuracy",
                "Kendall τ-b across methods, with two-sided p-values (scipy), as in LCEG Table 6.",
                [_figure(figs.scatter(table, kendall, "ppl_vs_accuracy.png"), "Perplexity and accuracy per method", wide=True)],
                [_kendall_table(kendall)])
    if metrics:
        train_rows = []
        for p in pieces:
            if p["kind"] not in ("train", "pretrain"):
                continue
            mine = [m for m in metrics if m["piece"] == p["id"]]
            last = next((m for m in reversed(mine) if isinstance(m.get("loss"), (int, float))), None)
            train_rows.append([_cell(p["method"] or p["id"], cls="method"), _cell(p["status"]),
                               _cell(mine[-1]["step"] if mine else DASH, cls="num"),
                               _cell(fmt_num(last["loss"], 4) if last else DASH, cls="num"), _cell(fmt_duration(p["seconds"]), cls="num")])
        section("training", "Training", "", [_figure(figs.training(metrics, "train_loss.png"), "Training loss by step")],
                [_table("Training runs", ["Method", "Status", "Last step", "Last loss", "Time"], train_rows)])
    section("pieces", "Study progress", "", [], [_pieces_table(pieces, status)])

    name = _setting(manifest, "name") or db.parent.name
    return {
        "name": str(name),
        "header": _header(manifest, pieces, window, target),
        "headline": headline,
        "ranking": ranking,
        "sections": sections,
        "failed": status["failed"],
        "status": status,
        "empty": not records,
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "version": (manifest.get("versions") or {}).get("ropekit"),
        "manifest": manifest,
        "aggregates": rows,
        "kendall": kendall,
        "figures": figs.paths,
        "tables_md": tables_md,
        "out": out,
    }


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def render_html(context: Mapping[str, Any]) -> str:
    """The page from ``templates/report.html.j2``, every value escaped (autoescape)."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(str(Path(__file__).parent / "templates")), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template("report.html.j2").render(**context)


def write_report(study_dir: str | Path, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Write ``index.html``, ``summary.json``, ``summary.md`` and the PNGs into ``DIR/report`` (or ``out_dir``).

    Returns ``{"dir", "html", "json", "markdown", "figures": [paths]}`` (strings).
    """
    ctx = build_report(study_dir, out_dir)
    out: Path = ctx["out"]
    html_path, json_path, md_path = out / "index.html", out / "summary.json", out / "summary.md"
    html_path.write_text(render_html(ctx), encoding="utf-8")
    summary = {
        "study": ctx["name"],
        "generated": ctx["generated"],
        "manifest": ctx["manifest"],
        "aggregates": ctx["aggregates"],
        "ranking": {k: v for k, v in ctx["ranking"].items()},
        "kendall": ctx["kendall"],
        "pieces": ctx["status"],
    }
    json_path.write_text(json.dumps(_json_safe(summary), indent=2, sort_keys=False, allow_nan=False) + "\n", encoding="utf-8")
    md = [f"# Study report: {_md_escape(ctx['name'])}", ""]
    md += [f"- **{_md_escape(k)}**: {_md_escape(v)}" for k, v in ctx["header"]]
    md.append("")
    for t in ctx["tables_md"]:
        md += [_md_table(t), ""]
    md.append("Figures: " + ", ".join(f"[{p.name}]({p.name})" for p in ctx["figures"]) if ctx["figures"] else "")
    md_path.write_text("\n".join(md).rstrip() + "\n", encoding="utf-8")
    return {"dir": str(out), "html": str(html_path), "json": str(json_path), "markdown": str(md_path),
            "figures": [str(p) for p in ctx["figures"]]}
