"""``ropekit report DIR``: the study's results as one self-contained HTML page, Markdown, JSON and PNGs.

Reads ``DIR/study.sqlite`` (:mod:`ropekit.study.store`) and writes into ``DIR/report/``:

* ``index.html`` — one page with no external assets: CSS inline, every figure embedded as a base64 PNG drawn
  at 2× (200 dpi, shown at its natural size, half its pixels, never scaled up), all text HTML-escaped
  (jinja2 autoescape). From the top: the manifest (model, pretrained window → target length, machine,
  versions, wall time); **Findings** — a headline generated from the data and, for each claim of LCEG
  (Lu et al. 2024, arXiv:2409.12181) and PoSE (Zhu et al., arXiv:2309.10400), the claim, its verdict
  (holds / does not hold / inconclusive at this scale / not measured in this study), the rule that decided
  it and the numbers with their intervals (:mod:`.report_findings`), how the statistics are computed, and
  the papers; the **ranking** with ties; the **effect relative to the control** ``base-ft`` (the plain model
  fine-tuned with the same recipe), when the study has it: per method and length the perplexity ratio and
  the accuracy difference with paired-bootstrap intervals, marked significant or not; one section per task
  that has results (a task without results has no section): perplexity vs length, perplexity relative to
  the control (else the base model) and the per-position NLL curves (LCEG Fig. 3), passkey and needle
  heatmaps per method (depth × length, the red → yellow → green convention of gkamradt's needle notebook
  and LCEG, drawn as :func:`ropekit.eval.plots.heatmap` draws one), accuracy vs length and method × length
  tables for every accuracy task with a per-subtask breakdown for RULER, LongBench and many-shot, attention
  entropy, the speed/memory table (LCEG Table 8), Kendall τ between perplexity and each downstream
  accuracy, and pooled over the tasks, across methods with its interval (LCEG Table 6); a **method card**
  per variant (method, parameters, type, recipe — steps, learning rate, sequence length, PoSE and LoRA
  settings — and its cost: seconds of its training, LongRoPE factor search and evaluations); training loss
  curves; the state of the study's pieces;
* ``summary.json`` — the manifest; ``placements`` (where each finished piece computed); ``statistics`` (how intervals are computed: resamples, seed, level);
  ``findings`` (headline and claims); every aggregate ``{"method", "task", "length", "metric", "value",
  "ci95": [low, high], "n", …}`` (:class:`ropekit.study.stats.Analysis`; with several seeds also ``seeds``,
  ``seed_values``, ``seed_min``, ``seed_max``, ``seed_sd``); the ranking (``rank``, ``tied``, intervals);
  the Kendall rows with ``ci95``; ``control`` (every method × task × length comparison with the control);
  ``method_cards``; ``papers``; the piece counts;
* ``summary.md`` — the findings and the same tables in Markdown (CommonMark/GFM: text that could open an
  HTML tag is backslash-escaped, nothing is HTML-escaped);
* the PNG figures the page embeds.

Every table cell shows its value with its 95 % bootstrap interval (and the spread over seeds where there
are several), every table says how many documents or prompts stand behind a cell, and every plotted value
has an error bar or band (:mod:`ropekit.study.stats` documents the bootstrap: documents resampled for
perplexity, prompts for accuracy — within subtasks for RULER and LongBench — paired across methods and
lengths). Bold in a method × length table marks the best value and every value not significantly
different from it, and only where some method is significantly worse; ranks are 1 + the number of
methods significantly better, so methods inside each other's noise share a rank (``2=``).

Figures (:mod:`.report_figures`) use small multiples — one panel per method family with the base model
and the control as grey references — a palette distinct within each panel, solid lines for frozen and
searched variants and dashed ones for fine-tuned variants (dash-dotted for PoSE); matplotlib's
constrained layout keeps titles, labels and legends apart, and every figure is checked for overlapping
or cut-off text (``figure_overlaps`` in :func:`write_report`'s result).

Manifest keys read (top level, or inside ``config``): ``name``, ``model``, ``window`` (the base model's
pretrained context, tokens), ``target_length`` (the length the study extends to), ``methods`` (display
order), ``machine``, ``versions``, ``seeds``, ``created``/``updated``; from ``config`` also ``variants``
(label, method, params, finetune — with PoSE under ``finetune.data.pose`` —, search) and ``recipe``, for
the variants' kinds and the method cards (without them, kinds come from the pieces: a ``train:`` piece
means fine-tuned, ``search:`` searched; ``base``/``plain`` is the base model, ``base-ft`` the control).
Figures draw dashed vertical lines at ``window`` and ``target_length`` where they are known.

The work is split by job: :mod:`.report_format` (number formats, colours, manifest settings),
:mod:`.report_figures` (the PNGs), :mod:`.report_tables` (tables, header, Markdown), :mod:`.report_findings`
(variants, claims, control effects, method cards); this module gathers them into the page and writes the
files. The formatting helpers stay importable from here.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import RopekitError
from . import convergence
from . import report_findings as findings
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
    _cards_table,
    _control_tables,
    _header,
    _headline,
    _heatmaps,
    _kendall_table,
    _length_table,
    _md_escape,
    _md_table,
    _pieces_table,
    _speed_table,
)
from ..runtime.atomic import atomic_dir
from .store import DB_NAME, StudyStore, placement_groups

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
    try:
        with StudyStore(db, create=False) as store:
            manifest = store.get_manifest()
            records = store.samples()
            pieces = store.pieces()
            placements = store.placements()
            sample_placements = store.sample_placements()
            metrics = store.train_metrics()
            status = store.status()
    except sqlite3.DatabaseError as err:  # damaged past its header: the reads fail, not the opening
        raise RopekitError(f"'{db}' is damaged ({err})", "restore the study database, or rerun the study") from None

    window = _int_or_none(_setting(manifest, "window"))
    target = _int_or_none(_setting(manifest, "target_length"))
    methods = stats.method_order([r.get("method") for r in records] + [p["method"] for p in pieces if p["method"]],
                                 _preferred_methods(manifest))
    analysis = stats.Analysis(records, methods)
    rows = analysis.rows
    table = analysis.table
    # cells of pieces not done (pending, running, failed) short of their planned samples: every table marks them
    # ("3 of 8, unfinished"; summary.json's "partial"), and the findings never read them — the headline, the claims,
    # the correlations, the retention check and the ranking see the analysis without them (``complete``)
    partial = findings.partial_cells(pieces, records, manifest)
    for r in rows:
        info = partial.get((r["method"], r["task"], r["length"]))
        if info is not None:
            r["partial"] = info
    complete = analysis.without(partial)
    open_evals = {(p["method"], p["task"]) for p in pieces if p["kind"] == "eval" and p["status"] != "done"}
    methods = [m for m in methods if m in table.methods() or any(p["method"] == m for p in pieces)]
    declared = findings.study_claims(manifest)
    infos = findings.variants(manifest, pieces, records, methods, declared)
    control = findings.control_label(infos, declared.get("control"))
    # fine-tuned variants that did not recover their in-window retrieval measure the recipe, not the method: they
    # stay in the tables, but out of the claims, the correlations and the ranking (ropekit.study.convergence)
    finetuned = [m for m, i in infos.items() if i.kind == "fine-tuned"]
    retention = (convergence.in_window_retention(complete, control, finetuned, window)
                 if control and window is not None else [])
    # judged on the in-window lengths finished so far, a verdict could still go either way: a variant whose in-window
    # passkey (or the control's) is unfinished at some length waits, out of the claims and the ranking, unjudged
    waiting = _retention_waiting(retention, finetuned, control, table, window, partial, open_evals)
    excluded = convergence.unconverged(retention)
    held = excluded + waiting
    judged_table = (stats.Table([r for r in complete.rows if r["method"] not in held], analysis=complete) if held
                    else complete.table)
    judged_infos = {m: i for m, i in infos.items() if m not in held}
    kendall = stats.perplexity_correlations(judged_table, target)
    ranked = [m for m in methods if m not in held]
    ranking = stats.rank_methods(judged_table, window, target, ranked)
    # a method whose ranking cells are partial, or missing while its piece runs, is not ranked on what it has so far
    unfinished = [m for m in ranked if _unfinished_basis(m, ranking, table, partial, open_evals)]
    if unfinished:
        ranked = [m for m in ranked if m not in unfinished]
        ranking = stats.rank_methods(stats.Table([r for r in judged_table.rows if r["method"] not in unfinished],
                                                 analysis=complete), window, target, ranked)
    ranking["rows"] += [_unranked_row(table, m, ranking.get("ppl_length")) for m in excluded]
    unfinished += waiting
    ranking["rows"] += [_unranked_row(table, m, ranking.get("ppl_length"), unfinished=True) for m in unfinished]
    held_why = {**{m: "its in-window convergence check waits for unfinished pieces" for m in waiting},
                **{m: "it did not converge under this budget" for m in excluded}}
    claims = findings.evaluate_claims(judged_table, judged_infos, window, target, kendall, declared, held=held_why)
    left_out = [{"method": m, "task": t, "length": L, **info} for (m, t, L), info in partial.items()]
    _note_left_out(claims, left_out, declared, window)
    effects = findings.control_effects(table, infos, control) if control else []
    for e in effects:  # a side from an unfinished piece: marked in the table and in summary.json's "control"
        marks = {k: partial[(k, e["task"], e["length"])] for k in (e["method"], control) if (k, e["task"], e["length"]) in partial}
        if marks:
            e["partial"] = marks
    cards = findings.method_cards(infos, pieces, records)
    figs = _Figures(out, methods, window, target, infos)
    sections: list[dict[str, Any]] = []
    tables_md: list[dict[str, Any]] = []

    def section(key, title, intro="", figures=(), tables=(), **extra):
        figures = [f for f in figures if f]
        tables = [t for t in tables if t and t["rows"]]
        if figures or tables or extra:
            sections.append({"id": key, "title": title, "intro": intro, "figures": figures, "tables": tables, **extra})
            tables_md.extend(tables)

    headline = _headline(table, ranking, methods, infos, window, target)
    summary_text = findings.headline(complete.table, ranking, claims, window, target) if records else ""
    if excluded and summary_text:
        summary_text += (f" Left out of the claims, the correlations and the ranking as not converged under this budget "
                         f"(in-window passkey more than {convergence.RETENTION_POINTS:.0f} points below {control}): "
                         f"{', '.join(excluded)}.")
    if waiting and summary_text:
        summary_text += (f" Left out of the claims and the ranking until their in-window passkey pieces finish (the "
                         f"convergence check, against {control}, waits for them): {', '.join(waiting)}.")
    if left_out and summary_text:
        summary_text += " " + _left_out_text(left_out)
    if unfinished and summary_text:
        summary_text += f" Not ranked until their pieces finish: {', '.join(unfinished)}."
    if headline:
        tables_md.append(headline)
    tasks = table.tasks()
    if control and effects:
        section("control", f"Effect relative to the control ({control})",
                f"{control} is the plain model fine-tuned with the same recipe as every fine-tuned method: the difference between a "
                f"fine-tuned method and {control} is the method's own effect, with the training held equal.",
                [_figure(figs.ratio_vs_length(table, methods, control, f"{_slug(t)}_ratio_vs_length.png", task=t),
                         f"{'Perplexity' if t == 'ppl' else t + ': perplexity'} relative to {control} by length, paired "
                         "95 % intervals", wide=True) for t in tasks if stats.is_perplexity(t)],
                _control_tables(effects, table, methods, control, window))
    if retention:
        section("retention", "In-window retention of the fine-tuned variants",
                f"Retrieval inside the pretrained window after fine-tuning, against the control ({control}): a variant more "
                f"than {convergence.RETENTION_POINTS:.0f} points below it on passkey did not converge under this budget — "
                "its results measure the recipe, not the method, and it is kept out of the claims, the correlations and "
                "the ranking.", (), [_retention_table(retention, control)])
    if "ppl" in tasks:
        first = next(r for r in records if r.get("task") == "ppl")
        protocol = ", ".join(f"{f} {first.get(f)}" for f in stats.PPL_PROTOCOL if first.get(f) is not None)
        how = ("exp of the mean over windows of each window's mean NLL (YaRN's weighting)" if first.get("weighting") == "window"
               else "exp of the token-weighted mean NLL over the evaluation documents")
        base = findings.base_label(infos, declared.get("base"))
        ratio_fig = None
        if not (control and effects) and base:
            ratio_fig = _figure(figs.ratio_vs_length(table, methods, base, "ppl_ratio_vs_length.png"),
                                f"Perplexity relative to {base} by length, paired 95 % intervals", wide=True)
        section("ppl", "Perplexity", how + (f" ({protocol})" if protocol else "") + ".",
                [_figure(figs.metric_vs_length(table, "ppl", "ppl", methods, "ppl_vs_length.png", "perplexity", log=True),
                         "Perplexity by length (log scale), one panel per method family", wide=True),
                 ratio_fig,
                 _figure(figs.curves(stats.nll_curves(records, analysis), methods, "nll_by_position.png"),
                         "Mean NLL by position in the window (LCEG Fig. 3)", wide=True)],
                [_length_table(table, "ppl", "ppl", methods, "Perplexity (lower is better)", kind="ppl", window=window, best="low")])
    for t in [t for t in tasks if t != "ppl" and stats.is_perplexity(t)]:
        first = next(r for r in records if r.get("task") == t)
        protocol = ", ".join(f"{f} {first.get(f)}" for f in stats.PPL_PROTOCOL if first.get(f) is not None)
        intro = ("The same final tokens of each document scored with a prefix of every length: a change with length is "
                 "the context's alone" if first.get("score_mode") == "same_targets" else "A second perplexity protocol")
        section(_slug(t), f"Perplexity: {t}", intro + (f" ({protocol})" if protocol else "") + ".",
                [_figure(figs.metric_vs_length(table, t, "ppl", methods, f"{_slug(t)}_vs_length.png", "perplexity", log=True),
                         f"{t}: perplexity by length (log scale), one panel per method family", wide=True)],
                [_length_table(table, t, "ppl", methods, f"{t}: perplexity (lower is better)", kind="ppl", window=window,
                               best="low")])
    for t in table.accuracy_tasks():
        title = TASK_TITLES.get(t, t)
        figures = [_figure(figs.metric_vs_length(table, t, "accuracy", methods, f"{_slug(t)}_vs_length.png", "accuracy (%)",
                                                 percent=True), f"{title}: accuracy by length, one panel per method family", wide=True)]
        if t in HEATMAP_TASKS:
            figures += _heatmaps(records, t, methods, figs)
        tabs = [_length_table(table, t, "accuracy", methods, f"{title}: accuracy (%) by length", kind="pct", window=window, best="high")]
        if t in BREAKDOWN and table.lengths(t):
            ref = target if target in table.lengths(t) else table.lengths(t)[-1]
            tabs.append(_breakdown_table(records, t, BREAKDOWN[t], methods, ref, partial))
        intro = {"ruler": "Accuracy is the mean over RULER's tasks of each task's mean score; intervals resample prompts within each task.",
                 "longbench": "Accuracy is the mean over datasets of each dataset's mean score (LongBench's leaderboard "
                              "averages task categories per language: `ropekit eval longbench` reports that as "
                              "average_en/average_zh); intervals resample prompts within each dataset."}.get(t, "")
        section(t, title, intro, figures, tabs)
    if "entropy" in tasks:
        section("entropy", TASK_TITLES["entropy"],
                "Attention entropy at the last position, mean over samples, layers and heads (nats).",
                [_figure(figs.metric_vs_length(table, "entropy", "entropy_last", methods, "entropy_vs_length.png", "entropy (nats)"),
                         "Attention entropy at the last position by length", wide=True)],
                [_length_table(table, "entropy", "entropy_last", methods, "Entropy at the last position (nats)", kind="num", window=window),
                 _length_table(table, "entropy", "normalised_last", methods, "Normalised entropy at the last position", kind="num", window=window)])
    if "speed" in tasks:
        section("speed", TASK_TITLES["speed"], "", [], [_speed_table(table, methods)])
    if kendall:
        section("kendall", "Perplexity vs downstream accuracy",
                "Kendall τ-b across methods with its 95 % bootstrap interval and scipy's two-sided p-value, as in LCEG Table 6.",
                [_figure(figs.scatter(table, kendall, "ppl_vs_accuracy.png"),
                         "Perplexity and accuracy per method at one length; bars: 95 % intervals; numbers: the legend's methods", wide=True)],
                [_kendall_table(kendall)])
    if cards:
        cards_table = _cards_table(cards)
        sections.append({"id": "cards", "title": "Method cards", "intro": cards_table["note"], "figures": [], "tables": [],
                         "cards": cards})
        tables_md.append(cards_table)
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
        path = figs.training(metrics, "train_loss.png")
        note = figs.notes.get("train_loss.png", "")
        section("training", "Training", note, [_figure(path, "Training loss by step of each run", wide=True)],
                [_table("Training runs", ["Method", "Status", "Last step", "Last loss", "Time"], train_rows)])
    section("pieces", "Study progress", "", [], [_pieces_table(pieces, status)])
    # the figures draw every stored value; where some come from unfinished pieces, their captions say so
    partial_sections = ({_slug(t) for _, t, _ in partial} | {t for _, t, _ in partial}
                        | ({"control"} if any(stats.is_perplexity(t) for _, t, _ in partial) else set()))
    for s in sections:
        if s["id"] in partial_sections:
            for f in s["figures"]:
                f["caption"] += " (includes values of pieces that have not finished: the tables mark them “k of N”)"

    name = _setting(manifest, "name") or db.parent.name
    return {
        "name": str(name),
        "header": _header(manifest, pieces, window, target, placements, sample_placements),
        "headline": headline,
        "summary": summary_text,
        "claims": claims if records else [],
        "left_out": left_out,
        "papers": findings.PAPERS,
        "statistics": STATISTICS_NOTE,
        "ranking": ranking,
        "sections": sections,
        "failed": status["failed"],
        "status": status,
        "empty": not records,
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "version": (manifest.get("versions") or {}).get("ropekit"),
        "manifest": manifest,
        "placements": placements,
        "computed_in": placement_groups(pieces, placements, sample_placements),
        "aggregates": rows,
        "kendall": kendall,
        "control": {"label": control, "effects": effects} if control else None,
        "cards": cards,
        "figures": figs.paths,
        "figure_overlaps": {k: v for k, v in figs.overlaps.items() if v},
        "tables_md": tables_md,
        "out": out,
    }


#: How the report's numbers are computed, shown on the page and in the Markdown.
STATISTICS_NOTE = (
    f"Every value carries a 95 % percentile-bootstrap interval ({stats.BOOTSTRAP_RESAMPLES} resamples, fixed seed "
    f"{stats.BOOTSTRAP_SEED}: the same data give the same intervals): perplexity resamples documents and recomputes "
    "exp(Σ NLL / Σ tokens); accuracy resamples prompts (within each subtask for RULER and LongBench). Resamples are shared "
    "by all methods and lengths, so comparisons are paired over the documents or prompts both have. A difference is "
    f"significant when its paired 95 % interval excludes 0 (a perplexity ratio: 1) with at least {stats.MIN_PAIRED} shared "
    "samples; ranks and bold values follow that rule, so methods inside each other's noise are tied. With several seeds a "
    "cell is the mean over seeds (perplexity: geometric mean) with the range of the per-seed values; its interval is over "
    "the evaluation samples with the seeds held fixed."
)


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


def _md_findings(ctx: Mapping[str, Any]) -> list[str]:
    md = ["## Findings", "", _md_escape(ctx["summary"]), ""]
    for c in ctx["claims"]:
        md.append(f"- **({c['id']}) {_md_escape(c['claim'])}** — *{c['verdict']}* ({_md_escape(c['source'])}). "
                  f"Rule: {_md_escape(c['rule'])}.")
        md += [f"  - {_md_escape(e)}" for e in c["evidence"]]
    md += ["", f"Statistics: {_md_escape(ctx['statistics'])}", "", "Papers:", ""]
    md += [f"- {_md_escape(findings.paper_line(p))}" for p in ctx["papers"]]
    return md + [""]


def write_report(study_dir: str | Path, out_dir: str | Path | None = None) -> dict[str, Any]:
    """Write ``index.html``, ``summary.json``, ``summary.md`` and the PNGs into ``DIR/report`` (or ``out_dir``).

    Returns ``{"dir", "html", "json", "markdown", "figures": [paths], "figure_overlaps": {name: [(text, text)]}}``
    (strings; ``figure_overlaps`` names the figures in which texts overlap or leave the figure, normally none).
    """
    study_dir = Path(study_dir)
    db = study_dir / DB_NAME if study_dir.is_dir() or not study_dir.exists() else study_dir
    if not db.exists():
        raise RopekitError(f"no study database at '{db}'", "pass the directory `ropekit study` wrote")
    target = Path(out_dir) if out_dir is not None else db.parent / "report"
    if target.is_dir():
        foreign = sorted(p.name for p in target.iterdir() if p.name not in _REPORT_FILES and not _FIGURE_NAME.fullmatch(p.name))
        if foreign:
            raise RopekitError(f"'{target}' holds files the report did not write ({', '.join(foreign[:3])})",
                               "move them elsewhere: the report directory is replaced as a whole")
    # built beside the old report and swapped in whole: a failure (a damaged study.sqlite) or a kill leaves the
    # previous report, or none, never a half-written one
    with atomic_dir(target, replace=True, what="report directory") as building:
        written = _write_report_files(study_dir, building)
    final = {k: str(target / Path(v).name) if k in ("html", "json", "markdown") else v for k, v in written.items()}
    final["dir"] = str(target)
    final["figures"] = [str(target / Path(p).name) for p in written["figures"]]
    return final


#: The files a report directory holds besides its figures.
_REPORT_FILES = ("index.html", "summary.json", "summary.md")


def _write_report_files(study_dir: Path, out_dir: Path) -> dict[str, Any]:
    ctx = build_report(study_dir, out_dir)
    out: Path = ctx["out"]
    html_path, json_path, md_path = out / "index.html", out / "summary.json", out / "summary.md"
    html_path.write_text(render_html(ctx), encoding="utf-8")
    summary = {
        "study": ctx["name"],
        "generated": ctx["generated"],
        "manifest": ctx["manifest"],
        "statistics": {"method": ctx["statistics"], "resamples": stats.BOOTSTRAP_RESAMPLES, "seed": stats.BOOTSTRAP_SEED,
                       "level": 0.95, "min_paired": stats.MIN_PAIRED},
        # the cells of unfinished pieces the findings leave out (each also marked "partial" in the aggregates)
        "findings": {"headline": ctx["summary"], "claims": ctx["claims"], "left_out": ctx["left_out"]},
        "aggregates": ctx["aggregates"],
        "ranking": {k: v for k, v in ctx["ranking"].items()},
        "kendall": ctx["kendall"],
        "control": ctx["control"],
        "method_cards": ctx["cards"],
        "papers": list(ctx["papers"]),
        "pieces": ctx["status"],
        # where each finished piece computed (device, dtype, attention, hardware), by piece id, and grouped
        "placements": ctx["placements"],
        "computed_in": ctx["computed_in"],
    }
    json_path.write_text(json.dumps(_json_safe(summary), indent=2, sort_keys=False, allow_nan=False) + "\n", encoding="utf-8")
    md = [f"# Study report: {_md_escape(ctx['name'])}", ""]
    md += [f"- **{_md_escape(k)}**: {_md_escape(v)}" for k, v in ctx["header"]]
    md.append("")
    if ctx["claims"]:
        md += _md_findings(ctx)
    for t in ctx["tables_md"]:
        md += [_md_table(t), ""]
    md.append("Figures: " + ", ".join(f"[{p.name}]({p.name})" for p in ctx["figures"]) if ctx["figures"] else "")
    if ctx["failed"]:  # as the page lists them: why a cell is missing
        md += ["", "## Failed pieces", ""] + [f"- {_md_escape(f['piece'])}: {_md_escape(str(f['error']))}"
                                               for f in ctx["failed"]]
    md_path.write_text("\n".join(md).rstrip() + "\n", encoding="utf-8")
    return {"dir": str(out), "html": str(html_path), "json": str(json_path), "markdown": str(md_path),
            "figures": [str(p) for p in ctx["figures"]], "figure_overlaps": ctx["figure_overlaps"]}


def _retention_waiting(retention: list[dict[str, Any]], finetuned: list[str], control: str | None, table: stats.Table,
                       window: int | None, partial: Mapping[tuple, Any], open_evals: set) -> list[str]:
    """The fine-tuned variants whose convergence verdict waits: at some in-window length of the judged task their cell
    or the control's is partial, or missing while that side's piece has not finished. Their retention rows'
    ``converged`` becomes ``None``."""
    task = convergence.JUDGED_TASK
    if control is None or window is None or task not in table.tasks():
        return []
    lengths = [L for L in table.lengths(task) if L is not None and L <= window]

    def unfinished(side: str, length: int) -> bool:
        return (side, task, length) in partial or (
            (side, task) in open_evals and table.get(side, task, length, "accuracy") is None)

    waiting = [m for m in finetuned if m != control
               and any(unfinished(side, L) for L in lengths for side in (m, control))]
    for r in retention:
        if r["method"] in waiting and "converged" in r:
            r["converged"] = None
    judged = {r["method"] for r in retention if r["task"] == task}
    retention += [{"method": m, "task": task, "lengths": [], "missing_lengths": lengths, "accuracy": None,
                   "control_accuracy": None, "difference": None, "ci95": None, "n": 0, "converged": None}
                  for m in waiting if m not in judged]  # nothing finished in the window yet: a row that says so
    return waiting


def _unranked_row(table: stats.Table, method: str, ppl_at: int | None, *, unfinished: bool = False) -> dict[str, Any]:
    """A ranking row for a variant kept out of the ranking: no rank, its perplexity shown (marked where partial).
    ``unfinished``: kept out as its pieces have not finished, else as it did not converge."""
    ppl = table.perplexity_task()
    row = table.row(method, ppl, ppl_at, "ppl") if ppl_at is not None and ppl else None
    return {"rank": None, "method": method, "primary": None, "primary_ci95": None, "ppl": row["value"] if row else None,
            "ppl_ci95": row.get("ci95") if row else None, "tied": False,
            **({"unfinished": True} if unfinished else {"unconverged": True})}


def _unfinished_basis(method: str, ranking: Mapping[str, Any], table: stats.Table, partial: Mapping[tuple, Any],
                      open_evals: set) -> bool:
    """Whether a cell the ranking reads for ``method`` (its task at its lengths, perplexity at its length) is partial,
    or missing while the method's piece of that task has not finished."""
    cells = [(ranking.get("task"), L, "accuracy") for L in ranking.get("lengths") or []]
    if ranking.get("ppl_length") is not None:
        cells.append((ranking.get("ppl_task") or "ppl", ranking["ppl_length"], "ppl"))
    for task, length, metric in cells:
        if task is None:
            continue
        if (method, task, length) in partial:
            return True
        if table.row(method, task, length, metric) is None and (method, task) in open_evals:
            return True
    return False


def _left_out_text(left_out: list[dict[str, Any]]) -> str:
    """The headline's sentence on the cells of unfinished pieces that the findings leave out."""
    from .report_format import unit_noun

    parts = [f"{c['method']} {findings._task_name(c['task'])} at {length_label(c['length'])} "
             f"({findings.partial_text(c, unit_noun(c['task']))})" for c in left_out]
    return ("Left out of this headline, the claims, the correlations and the ranking as their pieces have not finished "
            "(marked in the tables): " + "; ".join(parts) + ".")


def _claim_reads(item: Mapping[str, Any] | None, task: str, length: int | None, window: int | None) -> bool:
    """Whether a claim (its declared ``item``) reads the cell of ``task`` at ``length``: perplexity for the ratio
    claims (and the retrieval beside it, beyond the window), the named task or tasks for the others, any cell for a
    correlation."""
    if item is None or item.get("compare") == "correlation":
        return True
    if item.get("compare") in ("length_ratio", "pair_ratio"):
        beyond = window is None or length is None or length > window
        return (stats.is_perplexity(task) or task == item.get("task")
                or (task in (item.get("with_retrieval") or []) and beyond))
    return task == item.get("task") or task in (item.get("tasks") or [])


def _note_left_out(claims: list[dict[str, Any]], left_out: list[dict[str, Any]], declared: Mapping[str, Any],
                   window: int | None) -> None:
    """Add to each claim whose evidence names a variant with left-out cells of a task the claim reads one line
    saying which and why: a part "not measured" may be measured in part, and the claim is judged without it."""
    import re

    from .report_format import unit_noun

    items = {i.get("id"): i for i in declared.get("items") or []}
    for c in claims:
        text = " ".join(c["evidence"])
        named = [x for x in left_out if _claim_reads(items.get(c["id"]), x["task"], x["length"], window)
                 and re.search(rf"(?<![\w-]){re.escape(str(x['method']))}(?![\w-])", text)]
        if named:
            c["evidence"].append("left out as their pieces have not finished: " + "; ".join(
                f"{x['method']} {findings._task_name(x['task'])} at {length_label(x['length'])} "
                f"({findings.partial_text(x, unit_noun(x['task']))})" for x in named))


def _retention_table(rows: list[dict[str, Any]], control: str) -> dict[str, Any]:
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    columns = ["Method"]
    for t in tasks:
        title = TASK_TITLES.get(t, t)
        columns += [f"{title} in window (%)", f"− {control} (points)"]
    columns.append("Verdict")
    table_rows = []
    for method in dict.fromkeys(r["method"] for r in rows):
        cells = [_cell(method, cls="method")]
        verdict = ""
        for t in tasks:
            r = next((x for x in rows if x["method"] == method and x["task"] == t), None)
            cells.append(_cell(fmt_pct(r["accuracy"] / 100 if r and r["accuracy"] is not None else None), cls="num"))
            missing = (f"; not at {', '.join(map(str, r['missing_lengths']))}" if r and r.get("missing_lengths")
                       else "")
            cells.append(_cell(f"{r['difference']:+.1f}" if r and r["difference"] is not None else "–", cls="num",
                               sub=(f"[{r['ci95'][0]:+.0f}, {r['ci95'][1]:+.0f}] n = {r['n']}{missing}"
                                    if r and r["ci95"] else missing.removeprefix("; "))))
            if r and "converged" in r:
                verdict = ("not judged until its pieces finish" if r["converged"] is None else
                           "converged" if r["converged"] else "did not converge under this budget")
        cells.append(_cell(verdict))
        table_rows.append(cells)
    note = (f"In window: mean over the lengths up to the pretrained window that the variant and the control both have "
            f"(“not at”: in-window lengths the variant lacks, e.g. a study still running); differences paired over the "
            f"prompts both share, 95 % bootstrap intervals. Judged on passkey retrieval (within {convergence.RETENTION_POINTS:.0f} "
            "points of the control); the other tasks are shown beside it.")
    return _table(f"In-window retention against the control ({control})", columns, table_rows, note)
