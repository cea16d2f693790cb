"""The study report's figures: matplotlib PNGs at twice their display size (200 dpi, shown at 100 CSS px per
inch), and their embedding as data URIs.

Conventions shared by every figure: methods are drawn in *small multiples*, one panel per method family
(:data:`ropekit.study.report_findings.FAMILIES`), with the base model (grey, solid) and the fine-tuned
control ``base-ft`` (grey, dashed) as references in every panel; a method's colour is its place in its
family on the tab10 palette (distinct within a panel, the same in every figure); frozen and searched
variants are solid lines with round markers, fine-tuned ones dashed with square markers (PoSE dash-dotted
with triangles). Every plotted value carries its 95 % bootstrap interval (:mod:`ropekit.study.stats`) as an
error bar or a band; error bars of one panel are dodged sideways so they do not hide each other. Layout is
matplotlib's constrained layout (titles, labels and legends get their own room), and every saved figure is
checked for overlapping text (:func:`text_overlaps`; the overlaps found are kept in ``_Figures.overlaps``).
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import stats
from .report_findings import FAMILIES, VariantInfo, target_of
from .report_format import TASK_TITLES, length_label

DPI = 200
#: CSS pixels per inch of a figure on the page (so a 200 dpi PNG is shown at half its pixel size).
CSS_PER_INCH = 100
GREY_BASE, GREY_CONTROL = "#4d4d4d", "#8c8c8c"
#: The scatter's marker per method family (colours repeat between families, markers do not).
FAMILY_MARKERS = {name: marker for (name, _), marker in zip(FAMILIES, ("v", "s", "D", "^", "P"))}


def _mpl(text: Any) -> str:
    """A label matplotlib draws as written: ``$`` would start mathtext (and may fail to parse), a leading
    ``_`` hides a legend entry."""
    text = str(text).replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def _plain_log_labels(axis, span: float | None = None) -> None:
    """Ticks of a log axis labelled as plain numbers (``20``, not ``2×10¹``), as many per decade as the span leaves
    room for: 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k when the axis spans less than a factor 4 (``span``), 1, 2, 3,
    5 × 10^k up to two decades, 1, 2, 5 × 10^k up to three and 1, 3 × 10^k beyond (``2000`` beside ``3000`` overlapped
    on a panel spanning 3 to 10,000)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if span is not None and span < 4:
        subs: tuple[float, ...] = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
    elif span is None or span <= 1e2:
        subs = (1.0, 2.0, 3.0, 5.0)
    elif span <= 1e3:
        subs = (1.0, 2.0, 5.0)
    else:
        subs = (1.0, 3.0)
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _visible_texts(fig) -> list:
    """The text artists a saved figure shows: titles, axis labels, tick labels in view, legends, annotations."""
    texts = list(fig.texts)
    if getattr(fig, "_suptitle", None) is not None:
        texts.append(fig._suptitle)
    for legend in fig.legends:
        texts += legend.get_texts()
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        texts += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label] + list(ax.texts)
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis._update_ticks():
                texts += [t for t in (tick.label1, tick.label2) if t.get_visible()]
        if ax.get_legend() is not None:
            texts += ax.get_legend().get_texts()
    unique = list({id(t): t for t in texts}.values())  # the suptitle is also one of fig.texts
    return [t for t in unique if t.get_visible() and t.get_text().strip()]


def text_overlaps(fig, tolerance: float = 1.0, *, drawn: bool = False) -> list[tuple[str, str]]:
    """Pairs of visible texts of ``fig`` whose boxes overlap by more than ``tolerance`` pixels each way, and
    ``(text, "(outside the figure)")`` for a text cut off by the figure's edge. ``drawn``: the figure's canvas
    has just been drawn, so its layout is final and is measured as it is."""
    import numpy as np
    from matplotlib.text import Text

    if not drawn:
        fig.draw_without_rendering()  # lays the figure out as savefig will, without rasterising it
    renderer = fig.canvas.get_renderer()
    names, boxes = [], []
    out = []
    page = fig.bbox
    for t in _visible_texts(fig):
        bb = Text.get_window_extent(t, renderer)  # an annotation's text, without its leader line
        if bb.width > 0 and bb.height > 0:
            names.append(t.get_text())
            boxes.append((bb.x0, bb.x1, bb.y0, bb.y1))
            if bb.x0 < page.x0 - tolerance or bb.x1 > page.x1 + tolerance or bb.y0 < page.y0 - tolerance or bb.y1 > page.y1 + tolerance:
                out.append((t.get_text(), "(outside the figure)"))
    if len(boxes) > 1:
        # every pair at once: a heatmap grid has hundreds of cell labels, too many pairs for a Python loop
        x0, x1, y0, y1 = (np.asarray(c)[:, None] for c in zip(*boxes))
        w = np.minimum(x1, x1.T) - np.maximum(x0, x0.T)
        h = np.minimum(y1, y1.T) - np.maximum(y0, y0.T)
        hit = np.triu((w > tolerance) & (h > tolerance), k=1)
        out += [(names[i], names[j]) for i, j in zip(*np.nonzero(hit))]
    return out


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG from its IHDR chunk."""
    return struct.unpack(">II", data[16:24])


def _wrap_title(fig) -> bool:
    """Wrap the figure's suptitle onto as many lines as its width needs (a study with one method family draws one
    narrow panel under a title written for several); whether it changed."""
    import textwrap

    title = getattr(fig, "_suptitle", None)
    if title is None or not title.get_text():
        return False
    width = title.get_window_extent(fig.canvas.get_renderer()).width
    room = fig.bbox.width * 0.96
    if width <= room:
        return False
    text = title.get_text()
    title.set_text(textwrap.fill(text, max(20, int(len(text) * room / width))))
    return True


class _Figures:
    """Draws the report's PNGs with matplotlib's object API and the Agg canvas (no pyplot, headless)."""

    def __init__(self, out: Path, methods: Sequence[str], window: int | None, target: int | None,
                 infos: Mapping[str, VariantInfo] | None = None):
        from matplotlib import colormaps

        self.out = out
        self.window, self.target = window, target
        self.methods = list(methods)
        self.infos = dict(infos or {})
        for m in self.methods:
            self.infos.setdefault(m, VariantInfo(m, None if m == stats.PLAIN else m, kind="base" if m == stats.PLAIN else "frozen"))
        palette = colormaps["tab10"]
        self.colors: dict[str, Any] = {}
        for _, members in self.families(self.methods):
            for i, m in enumerate(members):
                self.colors[m] = palette(i % 10)
        for m, info in self.infos.items():
            if info.kind == "base":
                self.colors[m] = GREY_BASE
            elif info.kind == "control":
                self.colors[m] = GREY_CONTROL
        self.paths: list[Path] = []
        self.overlaps: dict[str, list[tuple[str, str]]] = {}
        self.notes: dict[str, str] = {}

    # ---- styles ----
    def color(self, method: str):
        return self.colors.get(method, (0.5, 0.5, 0.5, 1.0))

    def style(self, method: str) -> dict[str, Any]:
        info = self.infos[method]
        if info.kind == "base":
            return {"color": GREY_BASE, "linestyle": "-", "marker": "o"}
        if info.kind == "control":
            return {"color": GREY_CONTROL, "linestyle": (0, (5, 2)), "marker": "s"}
        if info.trained:
            return {"color": self.color(method), "linestyle": (0, (6, 1.5, 1, 1.5)) if info.pose else (0, (5, 2)),
                    "marker": "^" if info.pose else "s"}
        return {"color": self.color(method), "linestyle": "-", "marker": "D" if info.kind == "searched" else "o"}

    def families(self, methods: Sequence[str]) -> list[tuple[str, list[str]]]:
        """``(family, labels)`` in :data:`FAMILIES` order for the non-reference methods (a single "methods"
        panel of the references alone when there is nothing else)."""
        groups: dict[str, list[str]] = {}
        for m in methods:
            info = self.infos.get(m)
            if info is None or info.reference:
                continue
            groups.setdefault(info.family, []).append(m)
        out = [(name, groups[name]) for name, _ in FAMILIES if name in groups]
        return out or [("methods", [])]

    def references(self, methods: Sequence[str]) -> list[str]:
        return [m for m in methods if self.infos.get(m) is not None and self.infos[m].reference]

    # ---- figure plumbing ----
    def new(self, width: float, height: float, nrows: int = 1, ncols: int = 1, **kw):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(nrows, ncols, squeeze=False, **kw).ravel().tolist() if nrows and ncols else []
        for ax in axes:
            ax.grid(alpha=0.3)
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
        return fig, axes

    def save(self, fig, name: str) -> Path:
        from matplotlib.image import imsave

        # One layout and one rasterisation (savefig after the overlap check's own layout drew every figure twice):
        # the check measures this drawing and the PNG holds its pixels, as savefig at the figure's dpi would.
        fig.canvas.draw()
        if _wrap_title(fig):  # a title wider than a narrow (one-panel) figure: wrapped onto lines, then laid out again
            fig.canvas.draw()
        self.overlaps[name] = text_overlaps(fig, drawn=True)
        path = self.out / name
        imsave(path, fig.canvas.buffer_rgba(), format="png", origin="upper", dpi=fig.dpi)
        self.paths.append(path)
        return path

    def windows(self, ax, lengths: Sequence[int], legend: bool = True) -> None:
        """Dashed vertical lines at the pretrained window and the target length (when in the x range)."""
        if not lengths:
            return
        lo, hi = min(lengths), max(lengths)
        for value, label, color in ((self.window, "pretrained window", "#555555"), (self.target, "target length", "#1B1B3A")):
            if value is not None and lo / 1.5 <= value <= hi * 1.5:
                ax.axvline(value, linestyle=":", color=color, linewidth=1.1, zorder=1,
                           label=f"{label} ({length_label(value)})" if legend else None)

    def length_axis(self, ax, lengths: Sequence[int]) -> None:
        from matplotlib.ticker import FixedLocator, NullLocator

        if len(lengths) > 1:
            ax.set_xscale("log", base=2)
            ax.set_xlim(min(lengths) / 2 ** 0.3, max(lengths) * 2 ** 0.3)
        ax.xaxis.set_major_locator(FixedLocator(list(lengths)))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([length_label(L) for L in lengths])
        ax.set_xlabel("context length (tokens)", fontsize=8)

    @staticmethod
    def panel_legend(ax) -> None:
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False,
                      borderaxespad=0.0, handlelength=2.6)

    def grid(self, n: int, panel_w: float = 3.6, panel_h: float = 2.7, legend_w: float = 1.9, ncols: int = 2):
        ncols = max(1, min(ncols, n))
        nrows = -(-n // ncols)
        fig, axes = self.new(ncols * (panel_w + legend_w), nrows * panel_h + 0.5, nrows, ncols)
        for ax in axes[n:]:
            ax.set_visible(False)
        return fig, axes[:n]

    # ---- the figures ----
    def metric_vs_length(self, table: stats.Table, task: str, metric: str, methods: Sequence[str], name: str,
                         ylabel: str, *, log: bool = False, percent: bool = False) -> Path | None:
        """One panel per method family: the metric by length with its 95 % interval as error bars."""
        lengths = table.lengths(task)
        present = [m for m in methods if any(table.get(m, task, L, metric) is not None for L in lengths)]
        if not present or not lengths:
            return None
        panels = self.families(present)
        refs = self.references(present)
        fig, axes = self.grid(len(panels))
        scale = 100.0 if percent else 1.0
        for ax, (family, members) in zip(axes, panels):
            drawn = refs + members
            for i, m in enumerate(drawn):
                pts = []
                for L in lengths:
                    row = table.row(m, task, L, metric)
                    if row is None or row["value"] is None or not math.isfinite(row["value"]):
                        continue
                    ci = row.get("ci95") or [row["value"], row["value"]]
                    lo = ci[0] if ci[0] is not None and math.isfinite(ci[0]) else row["value"]
                    hi = ci[1] if ci[1] is not None and math.isfinite(ci[1]) else row["value"]
                    pts.append((L, row["value"], lo, hi))
                if not pts:
                    continue
                dodge = 2 ** ((i - (len(drawn) - 1) / 2) * 0.035) if len(lengths) > 1 else 1.0
                st = self.style(m)
                xs = [L * dodge for L, *_ in pts]
                ys = [v * scale for _, v, _, _ in pts]
                err = [[(v - lo) * scale for _, v, lo, _ in pts], [(hi - v) * scale for _, v, _, hi in pts]]
                ax.errorbar(xs, ys, yerr=err, color=st["color"], linestyle=st["linestyle"], marker=st["marker"], markersize=3.5,
                            linewidth=1.4, elinewidth=0.9, capsize=2, alpha=0.95, label=_mpl(m))
            if log:
                ax.set_yscale("log")
                lo, hi = ax.get_ylim()
                _plain_log_labels(ax.yaxis, hi / lo if lo > 0 else None)
            if percent:
                ax.set_ylim(-3, 103)
            self.windows(ax, lengths)
            self.length_axis(ax, lengths)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.set_title(_mpl(family), fontsize=9)
            self.panel_legend(ax)
        fig.suptitle(f"{_mpl(TASK_TITLES.get(task, task))}: {ylabel} by length (error bars: 95 % bootstrap intervals)", fontsize=10)
        return self.save(fig, name)

    def ratio_vs_length(self, table: stats.Table, methods: Sequence[str], reference: str, name: str,
                        task: str = "ppl") -> Path | None:
        """Perplexity of each method divided by the reference's (the control, else the base model) at each
        length, with paired-bootstrap 95 % intervals; filled markers where the interval excludes 1. ``task``: the
        perplexity protocol (``ppl``, or a study's ``ppl-same-targets`` …)."""
        a = table.analysis
        lengths = table.lengths(task)
        if a is None or reference not in table.methods(task):
            return None
        present = [m for m in methods if m != reference and m in table.methods(task)]
        if not present:
            return None
        panels = self.families(present)
        refs = [m for m in self.references(present)]
        fig, axes = self.grid(len(panels))
        drew = False
        spread = []  # every bound drawn: ratios spanning more than 10× are drawn on a log axis (below 1 is visible)
        for ax, (family, members) in zip(axes, panels):
            drawn = refs + members
            ax.axhline(1.0, color=self.style(reference)["color"], linestyle=self.style(reference)["linestyle"], linewidth=1.2,
                       label=f"{_mpl(reference)} (= 1)")
            for i, m in enumerate(drawn):
                pts = []
                for L in lengths:
                    c = a.compare(m, reference, task, L, "ppl")
                    if c is None or c["estimate"] is None or not math.isfinite(c["estimate"]) or not c["ci95"]:
                        continue
                    pts.append((L, c["estimate"], c["ci95"][0], c["ci95"][1], c["significant"]))
                if not pts:
                    continue
                drew = True
                spread += [b for _, _, lo, hi, _ in pts for b in (lo, hi) if b > 0]
                dodge = 2 ** ((i - (len(drawn) - 1) / 2) * 0.035) if len(lengths) > 1 else 1.0
                st = self.style(m)
                xs = [L * dodge for L, *_ in pts]
                ax.errorbar(xs, [v for _, v, *_ in pts], yerr=[[v - lo for _, v, lo, _, _ in pts], [hi - v for _, v, _, hi, _ in pts]],
                            color=st["color"], linestyle=st["linestyle"], marker="none", linewidth=1.4, elinewidth=0.9, capsize=2,
                            label=_mpl(m))
                for x, (_, v, _, _, sig) in zip(xs, pts):
                    ax.plot([x], [v], marker=st["marker"], markersize=4, color=st["color"],
                            markerfacecolor=st["color"] if sig else "white", linestyle="none")
            self.windows(ax, lengths)
            self.length_axis(ax, lengths)
            ax.set_ylabel(f"ppl ÷ ppl of {_mpl(reference)}", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.set_title(_mpl(family), fontsize=9)
            self.panel_legend(ax)
        if not drew:
            return None
        if spread and max(spread) / min(spread) > 10:
            for ax in axes[:len(panels)]:
                ax.set_yscale("log")
        what = "Perplexity" if task == "ppl" else f"{_mpl(task)}: perplexity"
        fig.suptitle(f"{what} relative to {_mpl(reference)} (paired 95 % intervals; filled: significant)", fontsize=10)
        return self.save(fig, name)

    def curves(self, curves: list[dict[str, Any]], methods: Sequence[str], name: str) -> Path | None:
        """Mean NLL by position: rows = method families, columns = the target length and the longest length,
        each curve with its 95 % band over documents."""
        lengths = sorted({c["length"] for c in curves})
        if not lengths:
            return None
        shown = sorted({target_of(lengths, self.target), lengths[-1]})
        present = [m for m in methods if any(c["method"] == m for c in curves)]
        panels = self.families(present)
        refs = self.references(present)
        if len(shown) == 1:  # one length: the families side by side, as the other figures
            fig, axes = self.grid(len(panels))
        else:  # a row per family, a column per length
            fig, axes = self.new(len(shown) * 3.6 + 1.9, len(panels) * 2.4 + 0.5, len(panels), len(shown), sharex="col")
        by_key = {(c["method"], c["length"]): c for c in curves}
        for r, (family, members) in enumerate(panels):
            for col, L in enumerate(shown):
                ax = axes[r * len(shown) + col]
                for m in refs + members:
                    c = by_key.get((m, L))
                    if c is None:
                        continue
                    pts = [(p, v, lo, hi) for p, v, lo, hi in zip(c["positions"], c["mean_nll"], c.get("ci_low") or [None] * len(c["positions"]),
                                                                 c.get("ci_high") or [None] * len(c["positions"])) if v is not None]
                    st = self.style(m)
                    ax.plot([p for p, *_ in pts], [v for _, v, _, _ in pts], color=st["color"], linestyle=st["linestyle"],
                            linewidth=1.1, label=_mpl(m))
                    band = [(p, lo, hi) for p, _, lo, hi in pts if lo is not None and hi is not None]
                    if band:
                        ax.fill_between([p for p, _, _ in band], [lo for _, lo, _ in band], [hi for _, _, hi in band],
                                        color=st["color"], alpha=0.12, linewidth=0)
                if self.window is not None and self.window < L:
                    ax.axvline(self.window, linestyle=":", color="#555555", linewidth=1.1,
                               label=f"pretrained window ({length_label(self.window)})")
                ax.set_title(f"{_mpl(family)} · L = {length_label(L)}", fontsize=9)
                ax.tick_params(labelsize=7)
                if col == 0:
                    ax.set_ylabel("mean NLL (nats)", fontsize=8)
                if r == len(panels) - 1 or len(shown) == 1:
                    ax.set_xlabel("position in the window", fontsize=8)
                if col == len(shown) - 1:
                    self.panel_legend(ax)
        fig.suptitle("Mean NLL by position in the window\n(bands: 95 % bootstrap intervals over documents)", fontsize=10)
        return self.save(fig, name)

    def scatter(self, table: stats.Table, kendall: list[dict[str, Any]], name: str) -> Path | None:
        """Perplexity against accuracy per method at one length, one panel per task (Kendall τ and its interval
        in the title), both intervals as error bars; a method's marker is its family's (:data:`FAMILY_MARKERS`,
        hollow when fine-tuned), its colour its place in the family; points carry their method's number, and a
        legend beside the panels names every number. Numbers are placed where they overlap no other number or
        point."""
        rows = [k for k in kendall if k["mode"] == "target" and k["task"] != "pooled" and len(k["methods"]) >= 2]
        if not rows:
            return None
        number = {m: i + 1 for i, m in enumerate(self.methods)}
        ppl = table.perplexity_task()  # the one perplexity_correlations read
        fig, axes = self.new(min(15.0, (6.5 if len(rows) == 1 else 4.6) * len(rows)) + 2.4, 4.6, 1, len(rows))
        shown: list[str] = []
        for ax, k in zip(axes, rows):
            L = k["lengths"][0]
            for m in k["methods"]:
                x_row, y_row = table.row(m, ppl, L, "ppl"), table.row(m, k["task"], L, "accuracy")
                x, y = x_row["value"], 100 * y_row["value"]
                xci = x_row.get("ci95") or [x, x]
                yci = [100 * v for v in (y_row.get("ci95") or [y_row["value"]] * 2)]
                st = self.style(m)
                info = self.infos[m]
                marker = "o" if info.reference else FAMILY_MARKERS.get(info.family, "o")
                ax.errorbar([x], [y], xerr=[[max(0.0, x - xci[0])], [max(0.0, xci[1] - x)]], yerr=[[max(0.0, y - yci[0])], [max(0.0, yci[1] - y)]],
                            color=st["color"], alpha=0.3, elinewidth=0.7, capsize=0, linestyle="none")
                ax.plot([x], [y], marker=marker, color=st["color"], markersize=5.5, linestyle="none", zorder=3,
                        markerfacecolor="white" if info.trained else st["color"], markeredgewidth=1.3,
                        label=f"{number.get(m, '?')}  {_mpl(m)}" if m not in shown else None)
                if m not in shown:
                    shown.append(m)
            ax.set_xscale("log")
            lo, hi = ax.get_xlim()
            _plain_log_labels(ax.xaxis, hi / lo if lo > 0 else None)
            ax.tick_params(labelsize=7)
            ax.set_ylim(-5, 105)
            tau = "undefined" if k["tau"] is None else f"{k['tau']:+.2f}"
            ci = k.get("ci95")
            ax.set_title(f"{_mpl(TASK_TITLES.get(k['task'], k['task']))} @ {length_label(L)}: τ = {tau}"
                         + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""), fontsize=9)
            ax.set_xlabel("perplexity (log scale)", fontsize=8)
        axes[0].set_ylabel("accuracy (%)", fontsize=8)
        handles, labels = [], []
        for ax in axes:
            h, lab = ax.get_legend_handles_labels()
            handles += h
            labels += lab
        order = sorted(range(len(labels)), key=lambda i: int(labels[i].split()[0]) if labels[i].split()[0].isdigit() else 10**6)
        fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="outside right upper", fontsize=7, frameon=False,
                   ncol=1 if len(labels) <= 16 else 2, handletextpad=0.3, markerscale=0.8)
        fig.draw_without_rendering()  # fix the layout before placing the numbers
        for ax, k in zip(axes, rows):
            L = k["lengths"][0]
            pts = [(m, table.get(m, ppl, L, "ppl"), 100 * table.get(m, k["task"], L, "accuracy")) for m in k["methods"]]
            self._place_numbers(fig, ax, [(str(number.get(m, "?")), x, y) for m, x, y in pts])
        return self.save(fig, name)

    @staticmethod
    def _place_numbers(fig, ax, points: list[tuple[str, float, float]]) -> None:
        """Label each point with its text at the nearest free spot: 16 directions on rings of growing radius
        (with a leader line beyond the first ring), the first whose box overlaps no label placed before and
        no point, and stays inside the axes. Crowded points are labelled first (they have the fewest spots)."""
        from matplotlib.text import Text

        renderer = fig.canvas.get_renderer()
        inside = ax.get_window_extent(renderer)
        px_per_pt = fig.dpi / 72.0
        centres = [tuple(ax.transData.transform((x, y))) for _, x, y in points]
        r = 4.0 * px_per_pt
        marks = [(cx - r, cy - r, cx + r, cy + r) for cx, cy in centres]
        crowd = [sum(math.hypot(cx - ox, cy - oy) < 30 * px_per_pt for ox, oy in centres) for cx, cy in centres]
        placed: list[tuple[float, float, float, float]] = []
        directions = [(math.cos(2 * math.pi * k / 16), math.sin(2 * math.pi * k / 16)) for k in (2, 14, 6, 10, 0, 8, 4, 12, 1, 15, 7, 9, 3, 13, 5, 11)]
        for idx in sorted(range(len(points)), key=lambda i: -crowd[i]):
            text, x, y = points[idx]
            chosen = None
            for radius in (7, 13, 20, 28, 38, 50, 64):
                for dx, dy in directions:
                    ann = ax.annotate(text, (x, y), xytext=(dx * radius, dy * radius), textcoords="offset points", fontsize=6.5,
                                      color="#202020", ha="center", va="center", annotation_clip=False,
                                      arrowprops={"arrowstyle": "-", "color": "#9a9a9a", "linewidth": 0.5,
                                                  "shrinkA": 1, "shrinkB": 3} if radius > 10 else None)
                    ann.set_in_layout(False)
                    ann.update_positions(renderer)
                    bb = Text.get_window_extent(ann, renderer)  # the text alone, not its leader line
                    box = (bb.x0 - 1, bb.y0 - 1, bb.x1 + 1, bb.y1 + 1)
                    if (box[0] >= inside.x0 and box[2] <= inside.x1 and box[1] >= inside.y0 and box[3] <= inside.y1
                            and not any(_hit(box, o) for o in placed + marks)):
                        chosen = box
                        break
                    ann.remove()
                if chosen:
                    break
            if chosen is None:  # nowhere free: the first spot (the overlap check will report it)
                ann = ax.annotate(text, (x, y), xytext=(5, 5), textcoords="offset points", fontsize=6.5, annotation_clip=False)
                ann.set_in_layout(False)
                bb = ann.get_window_extent(renderer)
                chosen = (bb.x0, bb.y0, bb.x1, bb.y1)
            placed.append(chosen)

    def heatmap_grid(self, grids: Mapping[str, Mapping[tuple[float, int], float]], name: str, title: str) -> Path:
        """Depth × length heatmaps, one panel per method, drawn as :func:`ropekit.eval.plots.heatmap` draws
        one (gkamradt/LCEG convention: depth 0 at the top, categorical lengths left to right, the
        red → yellow → green map over a fixed 0..1, cell values printed as percentages) with the pretrained
        window (white dashed) and the target length (dark dashed) on the column boundaries of
        :func:`ropekit.eval.plots.window_position`. Panels share one figure and one colour bar; the title has
        its own row above the panels (constrained layout)."""
        import numpy as np
        from matplotlib.colors import LinearSegmentedColormap

        from ..eval.plots import HEATMAP_COLORS, window_position

        cmap = LinearSegmentedColormap.from_list("ropekit_niah", list(HEATMAP_COLORS)).with_extremes(bad="#D9D9D9")
        n = len(grids)
        ncols = min(4, n)
        nrows = -(-n // ncols)
        fig, axes = self.new(2.9 * ncols + 1.0, 2.35 * nrows + 0.8, nrows, ncols)
        mesh = None
        shown = set()  # the lines some panel draws: a length past a panel's last column has no boundary there
        for i, (ax, (method, cells)) in enumerate(zip(axes, grids.items())):
            rows = sorted({r for r, _ in cells})
            columns = sorted({c for _, c in cells})
            matrix = np.array([[cells.get((r, c), np.nan) for c in columns] for r in rows], dtype=float)
            mesh = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto",
                             interpolation="nearest", extent=(0, len(columns), len(rows), 0))
            for x in range(1, len(columns)):
                ax.axvline(x, color="grey", linestyle="--", linewidth=0.4)
            if len(rows) * len(columns) <= 48:
                for a, _ in enumerate(rows):
                    for b, _ in enumerate(columns):
                        if not np.isnan(matrix[a, b]):
                            ax.text(b + 0.5, a + 0.5, f"{100 * matrix[a, b]:.0f}", ha="center", va="center", fontsize=6, color="#202020")
            for kind, value, style in (("window", self.window, {"color": "white", "linewidth": 2.0}),
                                       ("target", self.target, {"color": "#1B1B3A", "linewidth": 1.4})):
                x = window_position(columns, value)
                if x is not None and 0 < x < len(columns):
                    ax.axvline(x, linestyle="--", **style)
                    shown.add(kind)
            ax.set_xticks([j + 0.5 for j in range(len(columns))])
            ax.set_xticklabels([length_label(c) for c in columns], fontsize=7)
            step = max(1, -(-len(rows) // 8))
            ax.set_yticks([a + 0.5 for a in range(0, len(rows), step)])
            ax.set_yticklabels([f"{rows[a] * 100:.0f}" for a in range(0, len(rows), step)], fontsize=7)
            ax.set_title(_mpl(method), fontsize=8.5)
            ax.grid(False)
            if i % ncols == 0:
                ax.set_ylabel("depth (%)", fontsize=8)
            if i >= n - ncols:
                ax.set_xlabel("length (tokens)", fontsize=8)
        for ax in axes[n:]:
            ax.set_visible(False)
        fig.colorbar(mesh, ax=axes[:n], shrink=0.7, aspect=30, label="accuracy")
        lines = []
        if "window" in shown:
            lines.append(f"white dashed: pretrained window ({length_label(self.window)})")
        if "target" in shown:
            lines.append(f"dark dashed: target length ({length_label(self.target)})")
        fig.suptitle(_mpl(title) + (" — " + "; ".join(lines) if lines else ""), fontsize=10)
        return self.save(fig, name)

    def training(self, metrics: list[dict[str, Any]], name: str) -> Path | None:
        """Training loss by step: the base model's pre-training in its own panel (when it logged more than one
        step), the fine-tunings in one panel per method family with the control in each; x is each run's
        own step. The y range leaves out the first tenth of the steps of runs of 20 steps or more (their
        start-up spike would flatten the rest)."""
        series: dict[str, list[tuple[int, float]]] = {}
        pretrain: dict[str, list[tuple[int, float]]] = {}
        for m in metrics:
            kind = str(m.get("piece", "")).split(":", 1)[0]
            if kind == "search" or not isinstance(m.get("loss"), (int, float)) or not math.isfinite(m["loss"]):
                continue
            target = pretrain if kind == "pretrain" else series
            target.setdefault(m.get("method") or m["piece"], []).append((m["step"], float(m["loss"])))
        single = {k: v for k, v in pretrain.items() if len(v) < 2}
        pretrain = {k: v for k, v in pretrain.items() if len(v) >= 2}
        if single:
            k, v = next(iter(single.items()))
            self.notes[name] = f"Pre-training of {k} logged only its final loss ({v[-1][1]:.3f} at step {v[-1][0]})."
        for m in series:
            self.infos.setdefault(m, VariantInfo(m, m, kind="fine-tuned"))
        panels = self.families(list(series)) if series else []
        refs = self.references(list(series))
        n = len(panels) + (1 if pretrain else 0)
        if n == 0:
            return None
        fig, axes = self.grid(n)
        i = 0
        if pretrain:
            ax = axes[0]
            for m, pts in pretrain.items():
                ax.plot([s for s, _ in pts], [v for _, v in pts], color=GREY_BASE, linewidth=1.1, label=f"{_mpl(m)} (pre-training)")
            ax.set_title("Pre-training", fontsize=9)
            i = 1
        for ax, (family, members) in zip(axes[i:], panels):
            losses, later = [], []
            for m in refs + members:
                pts = sorted(series.get(m, []))
                if not pts:
                    continue
                st = self.style(m)
                ax.plot([s for s, _ in pts], [v for _, v in pts], color=st["color"], linestyle=st["linestyle"], linewidth=1.1, label=_mpl(m))
                losses += [v for _, v in pts]
                skip = len(pts) // 10 if len(pts) >= 20 else 0  # the first tenth of a long run: its start-up spike
                later += [v for _, v in pts[skip:]]
            if len(later) > 4 and len(later) < len(losses):
                lo, hi = min(losses), max(later)
                pad = 0.08 * (hi - lo or 1.0)
                ax.set_ylim(lo - pad, hi + pad)
            ax.set_title(f"Fine-tuning · {_mpl(family)}", fontsize=9)
        for ax in axes:
            ax.set_xlabel("step of the run", fontsize=8)
            ax.set_ylabel("training loss (nats)", fontsize=8)
            ax.tick_params(labelsize=7)
            self.panel_legend(ax)
        fig.suptitle("Training loss by step", fontsize=10)
        return self.save(fig, name)


def _hit(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])


# ---- the sections -----------------------------------------------------------------------------------------
def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _figure(path: Path | None, caption: str, *, wide: bool = False) -> dict[str, Any] | None:
    """A figure of the page: its data URI, caption, file name and display size in CSS pixels (half the
    PNG's pixels: shown at its natural size on a 2× screen, never scaled up)."""
    if path is None:
        return None
    data = path.read_bytes()
    w, h = png_size(data)
    scale = CSS_PER_INCH / DPI
    return {"src": _data_uri(path), "caption": caption, "file": path.name, "wide": wide,
            "width": round(w * scale), "height": round(h * scale)}
