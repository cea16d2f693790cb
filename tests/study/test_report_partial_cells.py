"""`ropekit report` on a study with unfinished pieces: a cell computed from a piece that is not done (pending,
running or failed) and short of its planned samples is marked in every table — Markdown, HTML and summary.json's
``partial`` — and the findings (headline, claims, ranking) leave it out and say so; a complete cell, even one of
an unfinished piece, stays unmarked."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

import synthetic_study as ss
from ropekit.study.report import write_report
from ropekit.study.report_format import fmt_ppl

SPEC = [v for v in ss.QUICK if v["label"] in ("base", "base-ft", "ntk", "yarn", "yarn-ft", "ntk-ft")]
TARGET = ss.TARGET  # 1024: the target length, where the headline compares perplexities
BEYOND = 2048  # beyond the 256-token window: the ranking's passkey lengths


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    directory = tmp_path_factory.mktemp("partial")
    out = ss.build(directory, SPEC, name="partial study", docs=8, trials=4)
    # yarn-ft's perplexity evaluation stopped after its 3 easiest documents at the target: pending, and on those 3
    # documents its value is the lowest of all (the old report called it the best perplexity at the target)
    docs = sorted((r["nll_sum"], r["doc"]) for r in out["ppl"] if r["method"] == "yarn-ft" and r["length"] == TARGET)
    gone = [doc for _, doc in docs[3:]]
    with sqlite3.connect(directory / "study.sqlite") as db:
        db.executemany("DELETE FROM samples WHERE piece = 'eval:ppl:yarn-ft' AND length = ? AND json_extract(record, '$.doc') = ?",
                       [(TARGET, d) for d in gone])
        db.execute("UPDATE pieces SET status = 'pending', finished = NULL, seconds = NULL WHERE id = 'eval:ppl:yarn-ft'")
        # yarn's passkey evaluation failed after 6 of its 20 prompts at 2048
        ids = [i for (i,) in db.execute("SELECT id FROM samples WHERE piece = 'eval:passkey:yarn' AND length = ? ORDER BY id",
                                        (BEYOND,))]
        db.executemany("DELETE FROM samples WHERE id = ?", [(i,) for i in ids[6:]])
        db.execute("UPDATE pieces SET status = 'failed', error = 'CUDA out of memory' WHERE id = 'eval:passkey:yarn'")
    write_report(directory)
    summary = json.loads((directory / "report" / "summary.json").read_text())
    md = (directory / "report" / "summary.md").read_text()
    html = (directory / "report" / "index.html").read_text()
    return summary, md, html


def row(summary, method, task, length, metric):
    (r,) = [r for r in summary["aggregates"] if (r["method"], r["task"], r["length"], r["metric"]) == (method, task, length, metric)]
    return r


def md_row(md, caption_start, method):
    """The Markdown table row of ``method`` in the first table whose caption starts with ``caption_start``."""
    block = md.split(f"**{caption_start}", 1)[1].split("\n\n\n", 1)[0]
    (line,) = [ln for ln in block.splitlines()  # the method in the first column, or the second (after the rank)
               if ln.startswith("|") and method in [c.strip() for c in ln.strip("|").split(" | ")[:2]]]
    return line


def test_summary_json_marks_partial_cells_and_only_those(report):
    summary, _, _ = report
    pending = row(summary, "yarn-ft", "ppl", TARGET, "ppl")
    assert pending["n"] == 3
    assert {k: pending["partial"][k] for k in ("done", "planned", "status")} == {"done": 3, "planned": 8, "status": "pending"}
    failed = row(summary, "yarn", "passkey", BEYOND, "accuracy")
    assert {k: failed["partial"][k] for k in ("done", "planned", "status")} == {"done": 6, "planned": 20, "status": "failed"}
    # complete cells, including the complete lengths of the two unfinished pieces, carry no mark
    for key in [("base", "ppl", TARGET, "ppl"), ("yarn-ft", "ppl", 512, "ppl"), ("yarn", "passkey", 1024, "accuracy"),
                ("ntk", "passkey", BEYOND, "accuracy")]:
        assert "partial" not in row(summary, *key), key
    assert sum("partial" in r for r in summary["aggregates"]) == 2
    left = {(c["method"], c["task"], c["length"], c["status"]) for c in summary["findings"]["left_out"]}
    assert left == {("yarn-ft", "ppl", TARGET, "pending"), ("yarn", "passkey", BEYOND, "failed")}


def test_markdown_and_html_tables_mark_partial_cells(report):
    summary, md, html = report
    ppl_row = md_row(md, "Perplexity (lower is better)", "yarn-ft")
    value = fmt_ppl(row(summary, "yarn-ft", "ppl", TARGET, "ppl")["value"])
    assert re.search(re.escape(value) + r" \[[^]]+\] \(3 of 8, unfinished\)", ppl_row), ppl_row
    assert ppl_row.count("unfinished") == 1  # 256, 512 and 2048 of the same piece are complete
    assert "(6 of 20, failed)" in md_row(md, "Passkey retrieval: accuracy", "yarn")
    for method in ("base", "ntk", "base-ft"):
        assert "unfinished" not in md_row(md, "Perplexity (lower is better)", method)
        assert "failed" not in md_row(md, "Passkey retrieval: accuracy", method)
    assert "k of the N planned documents are stored" in md
    # a partial cell is never bold: its value is not the study's
    assert f"**{value}" not in ppl_row
    assert '<span class="flag">(3 of 8, unfinished)</span>' in html
    assert '<span class="flag">(6 of 20, failed)</span>' in html
    cells = re.findall(r'<td class="([^"]*)"[^>]*><span class="v">' + re.escape(value) + "</span>", html)
    assert cells and all("partial" in c and "best" not in c for c in cells)
    # the control's table marks the comparisons with a partial side
    assert "(yarn-ft 3 of 8, unfinished)" in md


def test_findings_leave_partial_cells_out_and_say_so(report):
    summary, md, html = report
    headline = summary["findings"]["headline"]
    value = fmt_ppl(row(summary, "yarn-ft", "ppl", TARGET, "ppl")["value"])
    first = headline.split(". ")[0]
    assert "lowest perplexity is" in first and "yarn-ft's" not in first and value not in first
    assert "yarn-ft perplexity at 1k (3 of 8 documents, unfinished)" in headline
    assert "yarn passkey retrieval at 2k (6 of 20 prompts, failed)" in headline
    assert "Left out of this headline, the claims, the correlations and the ranking" in headline
    for c in summary["findings"]["claims"]:
        for e in c["evidence"]:
            assert f"{value} [" not in e, (c["id"], e)  # the partial value is no evidence
    # the ranking reads passkey beyond the window and perplexity at the target: it does not rank yarn on 6 of 20
    # prompts nor yarn-ft on 3 of 8 documents — both unranked, marked, and named in the headline
    ranks = {r["method"]: r for r in summary["ranking"]["rows"]}
    for m in ("yarn", "yarn-ft"):
        assert ranks[m]["rank"] is None and ranks[m].get("unfinished"), m
    assert all(r["rank"] is not None for m, r in ranks.items() if m not in ("yarn", "yarn-ft"))
    assert "Not ranked until their pieces finish: yarn, yarn-ft." in headline
    rank_row = md_row(md, "Methods ranked", "yarn")
    assert "pieces not finished (unranked)" in rank_row and "2k: 6 of 20, failed" in rank_row
    assert "(3 of 8, unfinished)" in md_row(md, "Methods ranked", "yarn-ft")
    assert summary["findings"]["headline"] in html.replace("&#39;", "'")


def test_complete_study_has_no_marks(tmp_path):
    ss.build(tmp_path, SPEC[:3], name="complete", docs=4, trials=2)
    write_report(tmp_path)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    md = (tmp_path / "report" / "summary.md").read_text()
    assert not any("partial" in r for r in summary["aggregates"]) and summary["findings"]["left_out"] == []
    assert "unfinished" not in md and "Left out of this headline" not in md


@pytest.fixture(scope="module")
def waiting_report(tmp_path_factory):
    """yarn-ft's passkey evaluation stopped after 4 of its 20 prompts at 256 tokens, its only in-window length:
    the convergence check has nothing finished to judge it on."""
    directory = tmp_path_factory.mktemp("waiting")
    ss.build(directory, SPEC, name="waiting study", docs=8, trials=4)
    with sqlite3.connect(directory / "study.sqlite") as db:
        ids = [i for (i,) in db.execute("SELECT id FROM samples WHERE piece = 'eval:passkey:yarn-ft' AND length = ? "
                                        "ORDER BY id", (ss.WINDOW,))]
        db.executemany("DELETE FROM samples WHERE id = ?", [(i,) for i in ids[4:]])
        db.execute("UPDATE pieces SET status = 'pending', finished = NULL, seconds = NULL "
                   "WHERE id = 'eval:passkey:yarn-ft'")
    write_report(directory)
    summary = json.loads((directory / "report" / "summary.json").read_text())
    md = (directory / "report" / "summary.md").read_text()
    return summary, md


def test_a_convergence_verdict_waits_for_unfinished_in_window_pieces(waiting_report):
    """Judged on what has finished in the window, the verdict could still go either way: the variant is neither
    called converged nor unconverged, and stays out of the claims and the ranking until its pieces finish."""
    summary, md = waiting_report
    (ranked,) = [r for r in summary["ranking"]["rows"] if r["method"] == "yarn-ft"]
    assert ranked["rank"] is None and ranked.get("unfinished") and not ranked.get("unconverged")
    headline = summary["findings"]["headline"]
    assert "until their in-window passkey pieces finish" in headline and "yarn-ft" in headline.split("finish")[1]
    assert not any("yarn-ft" in json.dumps(c.get("variants", c.get("methods", ""))) for c in summary["findings"]["claims"]
                   if c.get("verdict") in ("holds", "does not hold"))
    assert "not judged until its pieces finish" in md_row(md, "In-window retention", "yarn-ft")
    # the other fine-tuned variants, finished in the window, are judged as before
    assert "converged" in md_row(md, "In-window retention", "ntk-ft")
