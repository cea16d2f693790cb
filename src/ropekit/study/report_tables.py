"""The study report's tables: method × length, breakdowns, heatmap grids, speed, Kendall τ, headline ranking,
pieces, the page header, and their Markdown form."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from . import stats
from .report_figures import _figure, _Figures
from .report_format import (
    DASH,
    TASK_TITLES,
    _cell,
    _setting,
    _table,
    fmt_duration,
    fmt_num,
    fmt_pct,
    fmt_ppl,
    fmt_ratio,
    length_label,
    score_color,
)


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
