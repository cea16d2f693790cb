"""The report's figure plumbing against matplotlib itself: the overlap check finds texts placed on top of each
other and texts cut off by the edge, and a figure saved by the report is, pixel for pixel, what
``Figure.savefig`` writes for the same figure."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from ropekit.study.report_figures import DPI, _Figures, text_overlaps


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    for i, ax in enumerate(axes):
        ax.plot([256, 512, 1024], [3 + i, 1, 2], marker="o", label=f"method {i}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"panel {i}")
        ax.legend(fontsize=6)
    fig.suptitle("a figure")
    return fig


@pytest.mark.parametrize("drawn", [False, True])
def test_overlap_check_finds_stacked_and_cut_off_texts(drawn):
    fig = _figure()
    fig.text(0.5, 0.5, "first", fontsize=20)
    fig.text(0.51, 0.51, "second", fontsize=20)  # a few pixels from the first: the boxes cross
    fig.text(0.1, 0.2, "apart", fontsize=8)
    fig.text(0.98, 0.3, "cut off at the right edge", fontsize=12)
    if drawn:
        fig.canvas.draw()
    found = text_overlaps(fig, drawn=drawn)
    assert ("first", "second") in found
    assert ("cut off at the right edge", "(outside the figure)") in found
    assert not [pair for pair in found if "apart" in pair]
    # the clean figure alone has no overlap: the check does not report every text
    assert text_overlaps(_figure()) == []


def test_overlaps_of_many_texts_are_the_pairs_a_direct_comparison_finds():
    """The pairwise test over thousands of labels (a heatmap grid) equals comparing every two boxes one by one."""
    from matplotlib.text import Text

    fig = _figure()
    rng = np.random.default_rng(0)
    for k in range(120):
        fig.text(*rng.uniform(0.05, 0.85, size=2), f"t{k}", fontsize=7)
    found = set(text_overlaps(fig))
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), Text.get_window_extent(t, renderer)) for t in fig.texts if t.get_text().startswith("t")]
    expected = set()
    for i, (a, ba) in enumerate(boxes):
        for b, bb in boxes[i + 1:]:
            if min(ba.x1, bb.x1) - max(ba.x0, bb.x0) > 1 and min(ba.y1, bb.y1) - max(ba.y0, bb.y0) > 1:
                expected.add((a, b))
    assert expected  # the random labels do collide
    assert {pair for pair in found if pair[0].startswith("t") and pair[1].startswith("t")} == expected


def test_a_saved_figure_is_what_savefig_writes(tmp_path):
    reference = io.BytesIO()
    _figure().savefig(reference, format="png", dpi=DPI)
    figs = _Figures(tmp_path, [], 256, 1024)
    path = figs.save(_figure(), "figure.png")
    assert figs.overlaps["figure.png"] == [] and figs.paths == [path]
    ours, theirs = (Image.open(x) for x in (path, io.BytesIO(reference.getvalue())))
    assert ours.size == theirs.size and ours.info["dpi"] == pytest.approx(theirs.info["dpi"])
    assert np.array_equal(np.asarray(ours), np.asarray(theirs))


@pytest.mark.parametrize("low, high, labels", [
    (3.0, 9000.0, ["3", "10", "30", "100", "300", "1000", "3000", "10000"]),  # 3.8 decades in view: 1 and 3
    (3.0, 400.0, ["5", "10", "20", "50", "100", "200", "500"]),  # two to three decades: 1, 2, 5
    (3.0, 60.0, ["3", "5", "10", "20", "30", "50"]),  # up to two decades: 1, 2, 3, 5
])
def test_a_log_axis_labels_as_many_ticks_as_its_span_has_room_for(low, high, labels):
    """The report's scatter panel (4.6 inches wide, 7-point tick labels) over perplexities from 3 to 9,000 put
    ``2000`` on top of ``3000`` when every decade was labelled at 1, 2, 3 and 5: the labels are the plain numbers of
    the ticks the span leaves room for, and none overlap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ropekit.study.report_figures import _plain_log_labels

    fig = Figure(figsize=(4.6, 4.6), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot([low, high], [0, 100], marker="o", linestyle="none")
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    _plain_log_labels(ax.xaxis, hi / lo)
    ax.tick_params(labelsize=7)
    assert text_overlaps(fig) == []
    shown = [t.get_text() for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi and t.get_text()]
    assert shown == labels
