"""The study report's tables: method × length, breakdowns, heatmap grids, speed, Kendall τ, headline ranking,
pieces, the page header, and their Markdown form."""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from . import stats
from .store import placement_groups, placement_text
from .report_figures import _figure, _Figures
from .report_format import (
    DASH,
    TASK_TITLES,
    _cell,
    _setting,
    _table,
    fmt_ci,
    fmt_counts,
    fmt_duration,
    fmt_num,
    fmt_pct,
    fmt_ppl,
    fmt_ratio,
    fmt_seeds,
    fmt_value,
    length_label,
    score_color,
    unit_noun,
)


def partial_flag(row: Mapping[str, Any] | None) -> str:
    """The mark of a cell computed from a piece that has not finished (``3 of 8, unfinished``), else ``""``."""
    from .report_findings import partial_text

    return partial_text(row.get("partial")) if row else ""


def partial_note(unit: str) -> str:
    """The table note that explains :func:`partial_flag`'s marks."""
    return (f"“(k of N, unfinished)” (or running, failed): a cell whose piece has not finished — k of the N planned {unit} "
            "are stored, so its value is not the study's; it is never bold, and the headline, the claims, the correlations "
            "and the ranking leave it out.")


def _best_group(table: stats.Table, task: str, metric: str, length: int, methods: Sequence[str], lower: bool) -> set[str]:
    """The best value's method and every method not significantly different from it (paired bootstrap), or
    nothing when no method is significantly worse than the best (then no difference is worth marking). A cell
    of a piece that has not finished (``partial``) takes no part: neither best nor a worse one."""
    a = table.analysis
    values = [(table.get(m, task, length, metric), m) for m in methods
              if not (table.row(m, task, length, metric) or {}).get("partial")]
    values = [(v, m) for v, m in values if v is not None and math.isfinite(v)]
    if a is None or len(values) < 2:
        return set()
    best = (min if lower else max)(values)[1]
    group, worse = {best}, 0
    for _, m in values:
        if m == best:
            continue
        c = a.compare(m, best, task, length, metric)
        if c is not None and c["significant"]:
            worse += 1
        else:
            group.add(m)
    return group if worse else set()


def _length_table(table: stats.Table, task: str, metric: str, methods: Sequence[str], caption: str, *,
                  kind: str, window: int | None, best: str | None = None) -> dict[str, Any]:
    """Method × length table of one metric, each cell with its 95 % interval (and the spread over seeds);
    scores coloured on the heatmap scale. ``best`` = "low"/"high": bold marks, per length, the best value and
    those not significantly different from it — only when some method is significantly worse."""
    lengths = table.lengths(task)
    bold = {L: _best_group(table, task, metric, L, methods, best == "low") for L in lengths} if best else {}
    rows, ns, partial = [], [], False
    for m in methods:
        if m not in table.methods(task):
            continue
        cells = [_cell(m, cls="method")]
        for L in lengths:
            row = table.row(m, task, L, metric)
            v = row["value"] if row else None
            if row:
                ns.append(row["n"])
            cls = "num best" if m in bold.get(L, ()) else "num"
            sub, extra, flag = fmt_ci(row.get("ci95") if row else None, kind), fmt_seeds(row, kind), partial_flag(row)
            partial = partial or bool(flag)
            if kind == "pct":
                cells.append(_cell(fmt_pct(v), cls=cls, style=score_color(v), sub=sub, extra=extra, flag=flag))
            else:
                cells.append(_cell(fmt_value(v, kind), cls=cls, sub=sub, extra=extra, flag=flag))
        rows.append(cells)
    columns = ["Method"] + [length_label(L) + (" ▸" if window is not None and L > window else "") for L in lengths]
    notes = []
    if window is not None and any(L > window for L in lengths):
        notes.append("▸ marks lengths beyond the pretrained window.")
    notes.append(f"Each cell: value [95 % bootstrap interval over {unit_noun(task)}]"
                 + ("; with several seeds, the mean over seeds and the range of the per-seed values" if any(
                     (table.row(m, task, L, metric) or {}).get("seeds", 1) > 1 for m in methods for L in lengths) else "") + ".")
    if best:
        notes.append(f"Bold: the {'lowest' if best == 'low' else 'highest'} value at each length and every value not significantly "
                     f"different from it (paired bootstrap over the shared {unit_noun(task)}), shown only where some method is "
                     "significantly worse. A cell's interval includes the variation between "
                     f"{unit_noun(task)} that all methods share, so overlapping intervals can still differ significantly when paired.")
    if partial:
        notes.append(partial_note(unit_noun(task)))
    counts = fmt_counts(ns, task)
    return _table(caption + (f" — {counts}" if counts else ""), columns, rows, " ".join(notes))


def _breakdown_table(records: list[dict[str, Any]], task: str, field: str, methods: Sequence[str],
                     length: int, partial: Mapping[tuple, Mapping[str, Any]] | None = None) -> dict[str, Any] | None:
    """Per-subtask (dataset, shot count) accuracy at one length, each with its bootstrap interval over prompts;
    ``partial`` (:func:`ropekit.study.report_findings.partial_cells`) marks the cells of unfinished pieces."""
    from .report_findings import partial_text

    recs = [r for r in records if r.get("task") == task and r.get("length") == length and r.get(field) is not None
            and isinstance(r.get("score"), (int, float))]
    if not recs:
        return None
    parts = sorted({r[field] for r in recs}, key=lambda v: (isinstance(v, str), v))
    # each part as its own task, so each gets its own units and resamples
    sub = stats.Analysis([{**r, "task": f"{task}/{r[field]}"} for r in recs], methods)
    rows, ns, flagged = [], [], False
    for m in methods:
        if not any(sub.table.row(m, f"{task}/{p}", length, "accuracy") for p in parts):
            continue
        cells = [_cell(m, cls="method")]
        flag = partial_text((partial or {}).get((m, task, length)))
        for p in parts:
            row = sub.table.row(m, f"{task}/{p}", length, "accuracy")
            v = row["value"] if row else None
            if row:
                ns.append(row["n"])
            cells.append(_cell(fmt_pct(v), cls="num", style=score_color(v), sub=fmt_ci(row.get("ci95") if row else None, "pct"),
                               extra=fmt_seeds(row, "pct"), flag=flag if row else ""))
            flagged = flagged or bool(flag and row)
        rows.append(cells)
    counts = fmt_counts(ns, task)
    return _table(f"{TASK_TITLES.get(task, task)} by {field} at {length_label(length)} tokens (accuracy, %)"
                  + (f" — {counts}" if counts else ""), ["Method"] + [str(p) for p in parts], rows,
                  "Each cell: value [95 % bootstrap interval over prompts]."
                  + (" “(k of N, unfinished)”: k of the method's N planned prompts at this length are stored (all its "
                     "subtasks together); its piece has not finished." if flagged else ""))


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
    per_cell = {}
    for r in records:
        if r.get("task") == task and isinstance(r.get("depth"), (int, float)) and isinstance(r.get("score"), (int, float)):
            key = (r.get("method"), float(r["depth"]), r.get("length"), r.get("seed"))  # prompts per cell and seed
            per_cell[key] = per_cell.get(key, 0) + 1
    path = figs.heatmap_grid(grids, f"{task}_heatmaps.png", TASK_TITLES[task])
    counts = fmt_counts(list(per_cell.values()), task)
    return [_figure(path, f"{TASK_TITLES[task]}: accuracy (%) by needle depth (rows, % of the context) and length (columns), "
                          f"one panel per method" + (f"; {counts}" if counts else ""), wide=True)]


def _speed_table(table: stats.Table, methods: Sequence[str]) -> dict[str, Any]:
    rows, ns, flagged = [], [], []
    for L in table.lengths("speed"):
        for m in methods:
            if table.get(m, "speed", L, "prefill_s") is None:
                continue

            def cell(metric, fmt, scale=1.0, m=m, L=L):
                row = table.row(m, "speed", L, metric)
                if row is None:
                    return _cell(DASH, cls="num")
                ns.append(row["n"])
                ci = row.get("ci95")
                sub = f"[{fmt(ci[0] * scale)}, {fmt(ci[1] * scale)}]" if ci else ""
                flag = partial_flag(row)
                flagged.append(bool(flag))
                return _cell(fmt(row["value"] * scale), cls="num", sub=sub, flag=flag)

            rows.append([
                _cell(m, cls="method"), _cell(length_label(L), cls="num"),
                cell("prefill_s", fmt_num), cell("prefill_ratio", fmt_ratio),
                cell("decode_s_per_token", fmt_num, 1000.0), cell("decode_ratio", fmt_ratio),
                cell("peak_mem_bytes", lambda v: f"{v:.1f}", 1 / 2**20), cell("memory_ratio", fmt_ratio),
            ])
    counts = fmt_counts(ns, "speed")
    return _table("Speed and memory (medians over repeats; × = relative to plain at the same length)" + (f" — {counts}" if counts else ""),
                  ["Method", "Length", "Prefill (s)", "× plain", "Decode (ms/token)", "× plain", "Peak memory (MiB)", "× plain"],
                  rows, "Peak memory is the extra memory of the call above the resident model (CUDA allocator or process RSS). "
                        "Brackets: 95 % bootstrap intervals of the median over repeats (ratios: paired by repeat)."
                        + (" " + partial_note("repeats") if any(flagged) else ""))


def _kendall_table(kendall: list[dict[str, Any]]) -> dict[str, Any]:
    rows = []
    for k in kendall:
        basis = (f"at {length_label(k['lengths'][0])}" if k["mode"] == "target" and k["task"] != "pooled"
                 else "at the target" if k["mode"] == "target"
                 else "mean over " + ", ".join(length_label(L) for L in k["lengths"]))
        task = ("pooled: " + ", ".join(TASK_TITLES.get(t, t) for t in k.get("tasks", []))) if k["task"] == "pooled" else TASK_TITLES.get(k["task"], k["task"])
        rows.append([
            _cell(task, cls="method"), _cell(basis),
            _cell(DASH if k["tau"] is None else f"{k['tau']:+.3f}", cls="num", sub=fmt_ci(k.get("ci95"), "tau")),
            _cell(DASH if k["p_value"] is None else f"{k['p_value']:.4f}", cls="num"),
            _cell(k["n"], cls="num"), _cell(k["interpretation"]),
        ])
    return _table("Kendall τ-b between perplexity and downstream accuracy across methods",
                  ["Task", "Basis", "Kendall's τ [95 % interval]", "p-value", "Methods", "Interpretation"], rows,
                  "“at L”: perplexity and accuracy at one length, the target length when both were evaluated there, "
                  "else the longest shared length. “mean”: mean log-perplexity and mean accuracy over the lengths both "
                  "share. “pooled”: per method, the mean over the tasks of the per-task log-perplexity and accuracy. "
                  "Negative τ: lower perplexity goes with higher accuracy (LCEG Table 6). Interval: two-level bootstrap — "
                  "the methods resampled with replacement, each method's values taken from a resample of its documents "
                  "and prompts; p-value: scipy's test of τ = 0 on the point values.")


def _headline(table: stats.Table, ranking: dict[str, Any], methods: Sequence[str], infos: Mapping[str, Any],
              window: int | None, target: int | None) -> dict[str, Any] | None:
    """The ranking (:func:`ropekit.study.stats.rank_methods`) with every value's 95 % interval; a shared rank
    (``2=``) marks methods tied within the noise."""
    if not ranking["rows"]:
        return None
    from .report_findings import kind_label

    a = table.analysis
    acc_tasks = table.accuracy_tasks()
    ppl_at = ranking["ppl_length"]
    ppl = ranking.get("ppl_task") or "ppl"
    speed_lengths = table.lengths("speed")
    speed_at = (target if target in speed_lengths else speed_lengths[-1]) if speed_lengths else None
    columns = ["Rank", "Method", "Type"]
    if ppl_at is not None:
        columns.append(f"{ppl} @ {length_label(ppl_at)}")
    spans = {}
    for t in acc_tasks:
        lengths = table.lengths(t)
        beyond = [L for L in lengths if window is not None and L > window]
        spans[t] = beyond or lengths
        columns.append(f"{TASK_TITLES.get(t, t)} {'> window' if beyond else 'mean'} (%)")
    if speed_at is not None:
        columns.append(f"prefill × plain @ {length_label(speed_at)}")
    rows, partial = [], False
    ns: dict[str, list[int]] = {}
    for r in ranking["rows"]:
        m = r["method"]
        info = infos.get(m)
        rank = "—" if r.get("rank") is None else f"{r['rank']}=" if r.get("tied") else str(r["rank"])
        kind = kind_label(info) if info else "frozen"
        if r.get("unconverged"):
            kind += ", did not converge under this budget (unranked)"
        if r.get("unfinished"):
            kind += ", pieces not finished (unranked)"
        cells = [_cell(rank, cls="num rank"), _cell(m, cls="method"), _cell(kind, cls="kind")]
        if ppl_at is not None:
            row = table.row(m, ppl, ppl_at, "ppl")
            if row:
                ns.setdefault(ppl, []).append(row["n"])
            flag = partial_flag(row)
            partial = partial or bool(flag)
            if flag:  # the ranking read none of it (r["ppl"] is None): the table's value, marked
                cells.append(_cell(fmt_ppl(row["value"]), cls="num", sub=fmt_ci(row.get("ci95"), "ppl"),
                                   extra=fmt_seeds(row, "ppl"), flag=flag))
            else:
                cells.append(_cell(fmt_ppl(r["ppl"]), cls="num", sub=fmt_ci(r.get("ppl_ci95"), "ppl"), extra=fmt_seeds(row, "ppl")))
        for t in acc_tasks:
            values = [table.get(m, t, L, "accuracy") for L in spans[t]]
            v = statistics.fmean(values) if values and all(x is not None for x in values) else None
            ci = a.mean_interval(m, t, spans[t], "accuracy") if a is not None and v is not None else None
            flags = []
            for L in spans[t]:
                row = table.row(m, t, L, "accuracy")
                if row:
                    ns.setdefault(t, []).append(row["n"])
                    if partial_flag(row):
                        flags.append(f"{length_label(L)}: {partial_flag(row)}")
            partial = partial or bool(flags and v is not None)
            cells.append(_cell(fmt_pct(v), cls="num", style=score_color(v), sub=fmt_ci(ci, "pct"),
                               flag="; ".join(flags) if v is not None else ""))
        if speed_at is not None:
            row = table.row(m, "speed", speed_at, "prefill_ratio")
            cells.append(_cell(fmt_ratio(row["value"] if row else None), cls="num", sub=fmt_ci(row.get("ci95") if row else None, "ratio")))
        rows.append(cells)
    note = ranking["rule"]
    if window is not None:
        note += f" “> window”: mean over the lengths beyond the pretrained window of {window} tokens (“mean”: over all lengths, when none lies beyond)."
    note += " Brackets: 95 % bootstrap intervals."
    if partial:
        note += (" “(k of N, unfinished)”: a value over the k samples stored so far of the N planned (a piece not finished, "
                 "or failed); the ranking reads none of it.")
    counts = "; ".join(f"{TASK_TITLES.get(t, t).lower()}: {fmt_counts(v, t).replace(' per cell', '')} per length"
                       for t, v in ns.items() if v)
    return _table("Methods ranked" + (f" — {counts}" if counts else ""), columns, rows, note)


def _control_tables(effects: list[dict[str, Any]], table: stats.Table, methods: Sequence[str], control: str,
                    window: int | None) -> list[dict[str, Any]]:
    """Effect of each method relative to the control: perplexity ratio and accuracy difference per length with
    the paired-bootstrap interval; ``*`` (and bold) where the interval excludes no effect; an effect's ``partial``
    (``{label: partial cell}``) is marked."""
    from .report_findings import partial_text

    out = []
    for task in [t for t in table.tasks() if stats.is_perplexity(t)] + table.accuracy_tasks():
        mine = [e for e in effects if e["task"] == task]
        if not mine:
            continue
        lengths = sorted({e["length"] for e in mine})
        index = {(e["method"], e["length"]): e for e in mine}
        kind = "ratio" if stats.is_perplexity(task) else "diff"
        rows, ns, flagged = [], [], False
        for m in methods:
            if not any((m, L) in index for L in lengths):
                continue
            cells = [_cell(m, cls="method")]
            for L in lengths:
                e = index.get((m, L))
                if e is None:
                    cells.append(_cell(DASH, cls="num"))
                    continue
                ns.append(e["n"])
                text = fmt_value(e["estimate"], kind) + ("*" if e["significant"] else "")
                flag = "; ".join(f"{who} {partial_text(info)}" for who, info in (e.get("partial") or {}).items())
                flagged = flagged or bool(flag)
                cells.append(_cell(text, cls="num sig" if e["significant"] else "num", sub=fmt_ci(e["ci95"], kind), flag=flag))
            rows.append(cells)
        columns = ["Method"] + [length_label(L) + (" ▸" if window is not None and L > window else "") for L in lengths]
        what = (f"{'' if task == 'ppl' else task + ': '}perplexity ratio (method ÷ {control}; below 1: lower perplexity "
                "than the control)" if stats.is_perplexity(task) else f"{TASK_TITLES.get(task, task)}: accuracy difference (method − {control}, percentage points)")
        counts = fmt_counts(ns, task).replace("per cell", "shared per cell")
        out.append(_table(f"Effect relative to the control {control}: {what}" + (f" — {counts}" if counts else ""), columns, rows,
                          f"Each cell: estimate [paired 95 % bootstrap interval over the {unit_noun(task)} both share]; "
                          f"* and bold: significant (the interval excludes {'1' if stats.is_perplexity(task) else '0'}, "
                          f"at least {stats.MIN_PAIRED} shared {unit_noun(task)})."
                          + (f" “(label k of N, unfinished)”: that side's piece has not finished — k of its N planned "
                             f"{unit_noun(task)} are stored, and the comparison is over those alone; the findings do not use it."
                             if flagged else "")))
    return out


def _cards_table(cards: list[dict[str, Any]]) -> dict[str, Any]:
    """The method cards as one table (the Markdown form of the page's cards)."""
    rows = []
    for c in cards:
        params = ", ".join(f"{k}={v}" for k, v in sorted(c["params"].items())) or DASH
        rows.append([_cell(c["label"], cls="method"), _cell(c["method"]), _cell(c["kind"]), _cell(params),
                     _cell("; ".join(f"{k} {v}" for k, v in c["recipe"]) or DASH),
                     _cell("; ".join(f"{k} {v}" for k, v in c["cost"]) or DASH),
                     _cell(", ".join(map(str, c["seeds"])) or DASH)])
    return _table("Method cards", ["Variant", "Method", "Type", "Parameters", "Recipe", "Cost (compute time)", "Seeds"], rows,
                  "Recipe: the study's shared training recipe with the variant's overrides; cost: seconds of the study's pieces "
                  "(training, LongRoPE factor search, each evaluation).")


def _pieces_table(pieces: list[dict[str, Any]], status: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for kind, counts in sorted(status["by_kind"].items()):
        rows.append([_cell(kind, cls="method")] + [_cell(counts[s], cls="num") for s in ("done", "running", "pending", "failed")]
                    + [_cell(fmt_duration(sum(p["seconds"] or 0 for p in pieces if p["kind"] == kind)), cls="num")])
    return _table("Pieces of work", ["Kind", "Done", "Running", "Pending", "Failed", "Compute time"], rows)


# ---- Markdown ---------------------------------------------------------------------------------------------
_MD_TAG = re.compile(r"<(?=[A-Za-z/!?])")
_MD_ENTITY = re.compile(r"&(?=#?[A-Za-z0-9]+;)")


def _md_escape(text: Any) -> str:
    """Text safe and literal in Markdown (CommonMark/GFM): a ``<`` that could open an HTML tag and an ``&``
    that could start an entity are backslash-escaped (rendered as themselves, never as HTML), as are the
    backslash, ``*``, the backtick, the cell separator ``|`` and the ``(`` of a link's ``](``; one line.
    Nothing is HTML-escaped: ``p < 0.05`` stays as it is."""
    text = str(text).replace("\\", "\\\\")
    for ch in ("*", "`", "|"):
        text = text.replace(ch, "\\" + ch)
    text = _MD_ENTITY.sub(r"\\&", _MD_TAG.sub(r"\\<", text)).replace("](", "]\\(")
    return text.replace("\r", " ").replace("\n", " ")


def _md_cell(c: Mapping[str, Any]) -> str:
    return " ".join(_md_escape(part) for part in (c["text"], c.get("sub") or "", f"({c['extra']})" if c.get("extra") else "",
                                                  f"({c['flag']})" if c.get("flag") else "") if part)


def _md_table(t: dict[str, Any]) -> str:
    lines = [f"**{_md_escape(t['caption'])}**", "", "| " + " | ".join(_md_escape(c) for c in t["columns"]) + " |",
             "|" + "|".join("---:" if all("num" in row[i]["cls"] for row in t["rows"]) and t["rows"] else "---"
                            for i in range(len(t["columns"]))) + "|"]
    for row in t["rows"]:
        lines.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
    if t.get("note"):
        lines += ["", _md_escape(t["note"])]
    return "\n".join(lines) + "\n"


# ---- the report -------------------------------------------------------------------------------------------
def running_seconds(pieces: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """``(seconds during which at least one finished piece was running, first start to last finish)``.

    The union of the pieces' [started, finished] intervals: a study that was stopped and resumed later (or
    crashed and was re-run) is not charged for the hours nothing ran, which first-start-to-last-finish would be.
    """
    spans = sorted((datetime.fromisoformat(p["started"]), datetime.fromisoformat(p["finished"]))
                   for p in pieces if p.get("started") and p.get("finished"))
    if not spans:
        return None, None
    total, (lo, hi) = 0.0, spans[0]
    for start, end in spans[1:]:
        if start > hi:
            total += (hi - lo).total_seconds()
            lo, hi = start, end
        else:
            hi = max(hi, end)
    total += (hi - lo).total_seconds()
    return total, (max(e for _, e in spans) - spans[0][0]).total_seconds()


def _header(manifest: Mapping[str, Any], pieces: list[dict[str, Any]], window: int | None, target: int | None,
            placements: Mapping[str, Mapping[str, Any]] | None = None,
            sample_placements: Mapping[str, list] | None = None) -> list[tuple[str, str]]:
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
    groups = placement_groups(pieces, placements or {}, sample_placements)
    if groups and not (len(groups) == 1 and groups[0]["where"] is None):
        items.append(("Computed in", placement_text(groups, " · ")))
    versions = manifest.get("versions") or {}
    if versions:
        items.append(("Versions", " · ".join(f"{k} {v}" for k, v in versions.items() if v)))
    if manifest.get("seeds") is not None:
        items.append(("Seeds", json.dumps(manifest["seeds"], sort_keys=True)))
    compute = sum(p["seconds"] or 0 for p in pieces if p["status"] == "done")
    running, span = running_seconds(pieces)
    wall = f"{fmt_duration(running)} with pieces running"
    if span is not None and running is not None and span - running >= 60:
        wall += f" (first start to last finish {fmt_duration(span)})"
    items.append(("Wall time", f"{wall} · {fmt_duration(compute)} of finished pieces"))
    if manifest.get("created"):
        items.append(("Created", f"{manifest['created']} · updated {manifest.get('updated', DASH)}"))
    return items
