"""The study report's figures: matplotlib PNGs (curves, heatmaps, loss) and their embedding as data URIs."""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import stats
from .report_format import TASK_TITLES, length_label


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
