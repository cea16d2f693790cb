"""Figures shared by the evaluations and the study report: the depth × length retrieval heatmap.

The heatmap follows the convention of gkamradt's LLMTest_NeedleInAHaystack visualisation notebook and
of LCEG's needle plots (docs/methods-reference.md §10): rows are the needle depth in percent with 0 at the top, columns
are the context length in tokens, the colour map runs red → yellow → green (``#F0496E``, ``#EBB839``,
``#0CD79F``) over a fixed range 0..1, every cell is annotated with its value, cells are separated by grey
dashed lines, and vertical dashed lines mark the model's windows (LCEG draws one at the pretraining
length; here also the window a method extends or training reaches).

Columns are categorical (one per evaluated length, left to right in increasing order): column ``i``
spans ``x ∈ [i, i+1]``. A window line is drawn on the boundary after the last column whose length is
within the window, so that every cell left of the line was evaluated inside it (see
:func:`window_position`).

Drawing uses matplotlib's object API with the Agg canvas directly (no ``pyplot``, no global backend
switch, no seaborn), so it works headless and never disturbs an interactive session that imports ropekit.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

from ..errors import RopekitError
from ..runtime.atomic import check_figure_target, save_figure

#: The red → yellow → green colours of the needle-in-a-haystack heatmaps (gkamradt, LCEG).
HEATMAP_COLORS = ("#F0496E", "#EBB839", "#0CD79F")

#: Line style of each named window; names not listed here get the last style.
_WINDOW_STYLES = {
    "pretrained": {"color": "white", "linestyle": "--", "linewidth": 2.5},
    "trained": {"color": "#1B1B3A", "linestyle": "--", "linewidth": 2.0},
}
_OTHER_WINDOW_STYLE = {"color": "#5A5A5A", "linestyle": ":", "linewidth": 2.0}


@dataclass
class HeatmapLayout:
    """What :func:`heatmap` drew: the grid in drawing order and where each window line went.

    ``values[i][j]`` is the cell of ``rows[i]`` (top to bottom) and ``columns[j]`` (left to right), ``None``
    where no sample exists; ``window_x`` maps each window name to its line's x in cell units (column ``j``
    spans ``[j, j+1]``), or ``None`` when that window was not given.
    """

    rows: list[float]
    columns: list[int]
    values: list[list[float | None]]
    window_x: dict[str, float | None] = field(default_factory=dict)
    path: str | None = None


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(float(value))


def grid_from(
    data: Iterable[Mapping[str, Any]] | Mapping[tuple[float, int], float],
    *,
    row: str = "depth",
    column: str = "length",
    value: str = "score",
) -> dict[tuple[float, int], float]:
    """``{(depth, length): mean value}`` from records (or summary rows) or from such a mapping.

    Records are grouped by their ``row`` and ``column`` fields and ``value`` is averaged per cell. Entries
    whose row or column is not a number are aggregates (a summary's ``depth: "all"`` rows, or a random-depth
    passkey's ``depth: None``) and are left out; a cell value outside [0, 1] is an error, since the colour
    scale is fixed to that range.
    """
    cells: dict[tuple[float, int], list[float]] = {}
    if isinstance(data, Mapping):
        items = []
        for k, v in data.items():
            if not (isinstance(k, tuple) and len(k) == 2):
                raise RopekitError(f"heatmap key {k!r} is not a (depth, length) pair", "pass {(depth, length): score}")
            items.append((k[0], k[1], v))
    else:
        items = []
        for record in data:
            if value not in record:
                raise RopekitError(f"a record has no '{value}' field to plot", f"pass records that carry '{value}'")
            items.append((record.get(row), record.get(column), record[value]))
    for r, c, v in items:
        if not (_is_number(r) and _is_number(c)):
            continue
        if v is None:
            continue
        v = float(v)
        if not 0.0 <= v <= 1.0:
            raise RopekitError(f"heatmap value {v} at ({r}, {c}) lies outside [0, 1]", "plot scores or accuracies in [0, 1]")
        cells.setdefault((float(r), int(c)), []).append(v)
    return {k: sum(vs) / len(vs) for k, vs in cells.items()}


def window_position(columns: list[int], window: int | None) -> float | None:
    """x (cell units) of the line marking ``window`` over sorted categorical ``columns``.

    The line is the boundary after the last column whose length is ``≤ window``: 0 when every column lies
    beyond the window, ``len(columns)`` when every column lies within it. ``None`` for no window.
    """
    if window is None:
        return None
    return float(sum(1 for c in columns if c <= window))


def method_label(method: str, params: Mapping[str, Any] | None = None) -> str:
    """``"yarn (factor=9.375, beta_fast=32, …)"``: a method and its parameters for a figure title."""
    if not params:
        return str(method)
    parts = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()]
    return f"{method} ({', '.join(parts)})"


def model_windows(model) -> dict[str, int]:
    """``{"pretrained": C, "trained": T}`` of a model, for the heatmap's window lines.

    With a ropekit method installed (``config.ropekit``, see :func:`ropekit.extend`), C is the base
    model's ``max_position_embeddings`` recorded there and T the method's (the config's current value);
    without one, only ``pretrained`` is known and it is the config's ``max_position_embeddings``.
    """
    from ..install import installed

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    record = installed(model)
    if record:
        return {"pretrained": int(record["base"]["max_position_embeddings"]), "trained": int(config.max_position_embeddings)}
    return {"pretrained": int(config.max_position_embeddings)}


def heatmap(
    grid: Iterable[Mapping[str, Any]] | Mapping[tuple[float, int], float],
    path: str | Path,
    title: str = "",
    *,
    windows: Mapping[str, int | None] | None = None,
    value: str = "score",
    value_label: str = "Score",
    row_label: str = "Depth Percent",
    column_label: str = "Token Limit",
) -> HeatmapLayout:
    """Draw the depth × length heatmap of ``grid`` into the PNG ``path`` and return its :class:`HeatmapLayout`.

    ``grid`` is a list of records (or summary rows; ``value`` names the field to average, ``"score"`` for
    per-sample records, ``"accuracy"`` for summary rows) with ``depth`` as a fraction in [0, 1] and
    ``length`` in tokens, or a ``{(depth, length): value}`` mapping. ``windows`` maps a name to a window in
    tokens (``{"pretrained": 4096, "trained": 16384}``; ``None`` values are skipped), each drawn as a
    labelled vertical dashed line at :func:`window_position`.
    """
    path = check_figure_target(path)
    cells = grid_from(grid, value=value)
    if not cells:
        raise RopekitError("there is nothing to plot: no record has a numeric depth and length", "evaluate some samples first")
    rows = sorted({r for r, _ in cells})
    columns = sorted({c for _, c in cells})
    values = [[cells.get((r, c)) for c in columns] for r in rows]
    window_x = {name: window_position(columns, w) for name, w in (windows or {}).items()}

    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.figure import Figure

    n_rows, n_cols = len(rows), len(columns)
    # the notebook's figure is 17.5 × 8 for 35 × 35 cells; small grids get a proportionally smaller one
    width = min(17.5, max(6.0, 1.0 * n_cols + 3.5))
    height = min(8.0, max(3.5, 0.45 * n_rows + 1.8))
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    cmap = LinearSegmentedColormap.from_list("ropekit_niah", list(HEATMAP_COLORS)).with_extremes(bad="#D9D9D9")
    matrix = np.ma.masked_invalid(np.array([[np.nan if v is None else v for v in row] for row in values], dtype=float))
    mesh = ax.pcolormesh(np.arange(n_cols + 1), np.arange(n_rows + 1), matrix, cmap=cmap, vmin=0.0, vmax=1.0)
    ax.set_xlim(0, n_cols)
    ax.set_ylim(n_rows, 0)  # depth 0 at the top
    for x in range(1, n_cols):
        ax.axvline(x, color="grey", linestyle="--", linewidth=0.6)
    for y in range(1, n_rows):
        ax.axhline(y, color="grey", linestyle="--", linewidth=0.6)
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            if v is not None:
                ax.text(j + 0.5, i + 0.5, f"{v:.2f}", ha="center", va="center", fontsize=8, color="#202020")
    ax.set_xticks([j + 0.5 for j in range(n_cols)])
    ax.set_xticklabels([str(c) for c in columns], rotation=45, ha="right")
    ax.set_yticks([i + 0.5 for i in range(n_rows)])
    ax.set_yticklabels([f"{r * 100:.0f}" if abs(r * 100 - round(r * 100)) < 1e-9 else f"{r * 100:.1f}" for r in rows])
    ax.set_xlabel(column_label)
    ax.set_ylabel(row_label)
    if title:
        ax.set_title(textwrap.fill(title, width=max(40, int(width * 9))), fontsize=10)
    drawn = {}
    for name, x in window_x.items():
        if x is None:
            continue
        tokens = windows[name]
        style = _WINDOW_STYLES.get(name, _OTHER_WINDOW_STYLE)
        if x in drawn.values() and tokens in [windows[n] for n in drawn]:
            style = {**style, "linewidth": style["linewidth"] * 0.6}  # the same window twice: keep both visible
        ax.axvline(x, label=f"{name} window ({tokens} tokens)", clip_on=False, **style)  # visible on the edge too
        drawn[name] = x
    fig.colorbar(mesh, ax=ax, label=value_label)
    if drawn:
        legend = fig.legend(loc="outside lower center", ncol=len(drawn), fontsize=8, frameon=True)
        legend.get_frame().set_facecolor("#9A9A9A")  # white lines stay readable
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, format="png", dpi=110)
    return HeatmapLayout(rows=rows, columns=columns, values=values, window_x=window_x, path=str(path))
