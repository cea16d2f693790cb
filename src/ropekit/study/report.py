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

The work is split by job: :mod:`.report_format` (number formats, colours, manifest settings),
:mod:`.report_figures` (the PNGs), :mod:`.report_tables` (tables, header, Markdown); this module gathers
them into the page and writes the files. The formatting helpers stay importable from here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import RopekitError
from . import stats
from .report_figures import _figure, _Figures
from .report_format import (
    _FIGURE_NAME,
    BREAKDOWN,
    DASH,
    HEATMAP_TASKS,
    TASK_TITLES,
    _cell,
    _int_or_none,
    _preferred_methods,
    _setting,
    _slug,
    _table,
    fmt_duration,
    fmt_num,
    fmt_pct,
    fmt_ppl,
    fmt_ratio,
    length_label,
    score_color,
)
from .report_tables import (
    _breakdown_table,
    _header,
    _headline,
    _heatmaps,
    _kendall_table,
    _kinds,
    _length_table,
    _md_escape,
    _md_table,
    _pieces_table,
    _speed_table,
)
from .store import DB_NAME, StudyStore

__all__ = ["BREAKDOWN", "DASH", "HEATMAP_TASKS", "TASK_TITLES", "build_report", "fmt_duration", "fmt_num", "fmt_pct",
           "fmt_ppl", "fmt_ratio", "length_label", "render_html", "score_color", "write_report"]


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
