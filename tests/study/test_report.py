"""`ropekit report`: on a synthetic study (3 methods × passkey/ppl/speed × 3 lengths) the page, JSON,
Markdown and PNGs are written, the aggregates equal hand computations from the stored records, text is
escaped, figures are valid embedded PNGs, and sections of absent tasks are left out."""

from __future__ import annotations

import base64
import json
import math
import re
import statistics
import struct
import zlib
from pathlib import Path

import pytest

from ropekit.errors import RopekitError
from ropekit.study.report import write_report
from ropekit.study.store import StudyStore

EVIL = "<script>alert('x')</script>"
METHODS = ("plain", "yarn", EVIL)
LENGTHS = (64, 128, 256)  # around the synthetic study's 128-token window and 256-token target


def is_png(data: bytes) -> bool:
    """PNG signature, a well-formed IHDR chunk with its CRC, and the IEND chunk at the end."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return False
    length, kind = struct.unpack(">I4s", data[8:16])
    if kind != b"IHDR" or length != 13:
        return False
    crc = struct.unpack(">I", data[16 + length:20 + length])[0]
    return crc == zlib.crc32(data[12:16 + length]) and data[-12:-4] == b"\x00\x00\x00\x00IEND"


@pytest.fixture(scope="module")
def report(tmp_path_factory, build_study):
    directory = tmp_path_factory.mktemp("study")
    records = build_study(directory, methods=METHODS, lengths=LENGTHS)
    paths = write_report(directory)
    return directory, records, paths


def value(summary, method, task, length, metric):
    (row,) = [r for r in summary["aggregates"]
              if (r["method"], r["task"], r["length"], r["metric"]) == (method, task, length, metric)]
    return row


def test_files_and_aggregates_match_hand_computation(report):
    directory, records, paths = report
    out = directory / "report"
    assert paths["html"] == str(out / "index.html") and paths["json"] == str(out / "summary.json")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["manifest"]["name"] == "synthetic <study>" and summary["manifest"]["window"] == 128
    for m in METHODS:
        for L in LENGTHS:
            scores = [r["score"] for r in records["passkey"] if r["method"] == m and r["length"] == L]
            row = value(summary, m, "passkey", L, "accuracy")
            assert row["value"] == pytest.approx(sum(scores) / len(scores)) and row["n"] == 6
            docs = [r for r in records["ppl"] if r["method"] == m and r["length"] == L]
            row = value(summary, m, "ppl", L, "ppl")
            expect = math.exp(sum(d["nll_sum"] for d in docs) / sum(d["tokens_scored"] for d in docs))
            assert row["value"] == pytest.approx(expect) and row["n"] == 2 and row["tokens_scored"] == 2 * L - 3
            med = {k: statistics.median(r["prefill_s"] for r in records["speed"] if r["method"] == k and r["length"] == L)
                   for k in METHODS}
            assert value(summary, m, "speed", L, "prefill_s")["value"] == pytest.approx(med[m])
            assert value(summary, m, "speed", L, "prefill_ratio")["value"] == pytest.approx(med[m] / med["plain"])
    # Kendall τ across the three methods at the target length, computed by counting pairs
    (row,) = [k for k in summary["kendall"] if k["task"] == "passkey" and k["mode"] == "target"]
    ppl = [value(summary, m, "ppl", 256, "ppl")["value"] for m in row["methods"]]
    acc = [value(summary, m, "passkey", 256, "accuracy")["value"] for m in row["methods"]]
    s = sum((ppl[i] - ppl[j]) * (acc[i] - acc[j]) > 0 for i in range(3) for j in range(i + 1, 3)) - \
        sum((ppl[i] - ppl[j]) * (acc[i] - acc[j]) < 0 for i in range(3) for j in range(i + 1, 3))
    ties_p = sum(ppl[i] == ppl[j] for i in range(3) for j in range(i + 1, 3))
    ties_a = sum(acc[i] == acc[j] for i in range(3) for j in range(i + 1, 3))
    assert row["tau"] == pytest.approx(s / math.sqrt((3 - ties_p) * (3 - ties_a)))  # τ-b
    assert row["lengths"] == [256] and sorted(row["methods"]) == sorted(METHODS)
    # the ranking follows its stated rule: mean passkey accuracy beyond the window (256 only), then ppl at 256
    keyed = sorted(METHODS, key=lambda m: (-value(summary, m, "passkey", 256, "accuracy")["value"],
                                           value(summary, m, "ppl", 256, "ppl")["value"]))
    assert [r["method"] for r in summary["ranking"]["rows"]] == keyed


def test_page_is_self_contained_escaped_and_embeds_valid_pngs(report):
    directory, _, paths = report
    html = (directory / "report" / "index.html").read_text()
    assert EVIL not in html and "<script" not in html.lower()
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in html and "synthetic &lt;study&gt;" in html
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", html)  # no external asset, no file link
    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == html.count("<img") >= 4
    assert all(is_png(base64.b64decode(b)) for b in images)
    names = {p.rsplit("/", 1)[-1] for p in paths["figures"]}
    assert {"ppl_vs_length.png", "nll_by_position.png", "passkey_heatmaps.png", "passkey_vs_length.png", "train_loss.png"} <= names
    for p in paths["figures"]:
        with open(p, "rb") as fh:
            assert is_png(fh.read())
    md = (directory / "report" / "summary.md").read_text()
    # Markdown, not HTML: nothing is HTML-escaped; a "<" that could open a tag is backslash-escaped, so a
    # CommonMark renderer shows the hostile label as text and creates no element
    assert "&lt;" not in md and "&amp;" not in md and r"\<script>alert('x')\</script>" in md
    assert not re.search(r"(?<!\\)<[A-Za-z/!?]", md)
    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
    assert "<script" not in rendered and "&lt;script&gt;alert(" in rendered
    assert "| Rank | Method |" in md


def test_sections_follow_the_tasks_present(report, tmp_path, build_study):
    directory, _, _ = report
    html = (directory / "report" / "index.html").read_text()
    ids = set(re.findall(r'<section class="card[^"]*" id="([a-z]+)"', html))
    assert {"ranking", "ppl", "passkey", "speed", "kendall", "training", "pieces"} <= ids
    assert not ids & {"niah", "ruler", "longbench", "manyshot", "entropy"}

    only_ppl = tmp_path / "only_ppl"
    only_ppl.mkdir()
    build_study(only_ppl, tasks=("ppl",), methods=METHODS, lengths=LENGTHS)
    paths = write_report(only_ppl)
    html = (only_ppl / "report" / "index.html").read_text()
    ids = set(re.findall(r'<section class="card[^"]*" id="([a-z]+)"', html))
    assert "ppl" in ids and not ids & {"passkey", "speed", "kendall"}
    assert not any("passkey" in p or "heatmap" in p for p in paths["figures"])
    summary = json.loads((only_ppl / "report" / "summary.json").read_text())
    assert {r["task"] for r in summary["aggregates"]} == {"ppl"} and summary["kendall"] == []
    assert "perplexity at 256 tokens" in summary["ranking"]["rule"]


def test_empty_and_missing_studies(tmp_path):
    with pytest.raises(RopekitError, match="no study database"):
        write_report(tmp_path / "nowhere")
    with StudyStore(tmp_path / "empty" / "study.sqlite") as st:
        st.initialize("empty", {})
        st.register("eval:passkey:yarn")
    paths = write_report(tmp_path / "empty")
    html = Path(paths["html"]).read_text()
    assert "No evaluation results" in html and paths["figures"] == []
    assert json.loads(Path(paths["json"]).read_text())["pieces"]["by_status"]["pending"] == 1


def test_other_tasks_get_their_sections_and_breakdowns(tmp_path):
    """niah (heatmaps), RULER and LongBench (macro averages, per-subtask tables), many-shot, entropy."""
    rows = []
    for m in ("plain", "pi"):
        good = 1.0 if m == "pi" else 0.0
        for L in (64, 128):
            rows += [{"task": "niah", "depth": d, "trial": 0, "score": 0.5 + good / 2} for d in (0.0, 1.0)]
            rows += [{"task": "ruler", "subtask": "niah_single_1", "sample": i, "score": float(i < 3)} for i in range(4)]
            rows += [{"task": "ruler", "subtask": "vt", "sample": 0, "score": good}]
            rows += [{"task": "longbench", "dataset": "qasper", "sample": i, "score": 0.2 * i} for i in range(3)]
            rows += [{"task": "manyshot", "shots": s, "sample": 0, "score": good} for s in (1, 4)]
            rows += [{"task": "entropy", "sample": 0, "score": None, "entropy_last": 1.0 + L / 64, "normalised_last": 0.5}]
            for r in rows:
                r.setdefault("method", m)
                r.setdefault("params", {})
                r.setdefault("length", L)
    with StudyStore(tmp_path / "study.sqlite") as st:
        st.initialize("others", {}, window=64, target_length=128)
        for m in ("plain", "pi"):
            mine = [r for r in rows if r["method"] == m]
            for task in ("niah", "ruler", "longbench", "manyshot", "entropy"):
                st.begin_piece(f"eval:{task}:{m}")
                st.finish_piece(f"eval:{task}:{m}", [r for r in mine if r["task"] == task],
                                key_fields=("task", "method", "params", "length", "depth", "subtask", "dataset", "shots", "sample", "trial"))
    paths = write_report(tmp_path)
    html = Path(paths["html"]).read_text()
    ids = set(re.findall(r'<section class="card[^"]*" id="([a-z]+)"', html))
    assert {"niah", "ruler", "longbench", "manyshot", "entropy"} <= ids and not ids & {"passkey", "ppl", "speed", "kendall"}
    summary = json.loads(Path(paths["json"]).read_text())
    assert value(summary, "plain", "ruler", 128, "accuracy")["value"] == pytest.approx((0.75 + 0.0) / 2)  # macro
    assert value(summary, "pi", "ruler", 128, "accuracy")["value"] == pytest.approx((0.75 + 1.0) / 2)
    assert value(summary, "pi", "longbench", 64, "accuracy")["value"] == pytest.approx(0.2)
    assert value(summary, "pi", "entropy", 128, "entropy_last")["value"] == pytest.approx(3.0)
    # the RULER breakdown at the target length: one column per subtask
    table = html[html.index("RULER by subtask at 128 tokens"):]
    table = table[:table.index("</table>")]
    # vt has one prompt per cell here: its value stands without an interval
    assert "<th>niah_single_1</th><th>vt</th>" in table and ">75.0</span>" in table and ">100.0</td>" in table
    assert "Many-shot in-context learning by shots at 128 tokens" in html
    # ranking falls to the first retrieval task present (niah), all lengths beyond the 64-token window
    assert summary["ranking"]["task"] == "niah" and [r["method"] for r in summary["ranking"]["rows"]] == ["pi", "plain"]
    assert any(p.endswith("niah_heatmaps.png") for p in paths["figures"])


def test_report_command_writes_the_report_and_fails_in_one_line_without_a_study(tmp_path, run_cli, build_study):
    build_study(tmp_path, methods=METHODS, lengths=LENGTHS)
    code, out, err = run_cli("report", str(tmp_path), "--json")
    assert code == 0, err
    paths = json.loads(out)
    assert paths["html"] == str(tmp_path / "report" / "index.html") and (tmp_path / "report" / "index.html").is_file()
    code, _, err = run_cli("report", str(tmp_path / "missing"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "study.sqlite" in err


def test_every_cell_has_an_interval_and_every_table_its_counts(report):
    directory, records, _ = report
    summary = json.loads((directory / "report" / "summary.json").read_text())
    for row in summary["aggregates"]:
        assert {"value", "ci95", "n"} <= set(row), row
        lo, hi = row["ci95"]
        assert lo <= hi and row["n"] >= 1, row
    # one cell by hand: passkey of "plain" at 64 tokens, its 6 prompts resampled as the docstring says
    np = pytest.importorskip("numpy")
    from ropekit.study import stats

    keyed = sorted((r for r in records["passkey"] if r["method"] == "plain" and r["length"] == 64), key=lambda r: (r["depth"], r["trial"]))
    scores = [r["score"] for r in keyed]
    draws = np.random.default_rng(stats.BOOTSTRAP_SEED).integers(0, 6, size=(stats.BOOTSTRAP_RESAMPLES, 6))
    means = sorted(sum(scores[i] for i in row) / 6 for row in draws.tolist())
    h = (len(means) - 1) * 0.025
    lo = means[int(h)] + (h - int(h)) * (means[int(h) + 1] - means[int(h)])
    if len(set(scores)) == 1 and scores[0] in (0.0, 1.0):  # all alike: Wilson's score interval, not the point
        z2 = 1.959963984540054 ** 2
        lo = 6 / (6 + z2) if scores[0] == 1.0 else 0.0
    assert value(summary, "plain", "passkey", 64, "accuracy")["ci95"][0] == pytest.approx(lo)
    assert summary["statistics"]["resamples"] == stats.BOOTSTRAP_RESAMPLES and summary["statistics"]["seed"] == stats.BOOTSTRAP_SEED
    html = (directory / "report" / "index.html").read_text()
    for caption in re.findall(r'<p class="caption">(.*?)</p>', html):
        if caption.startswith(("Perplexity", "Passkey", "Methods ranked")):
            assert re.search(r"n = \d", caption), caption
    assert html.count('<span class="ci">') >= 3 * len(METHODS) * len(LENGTHS)
    md = (directory / "report" / "summary.md").read_text()
    assert re.search(r"\| [\d.]+ \[[\d.]+, [\d.]+\] \|", md)  # "value [low, high]" cells
    assert "## Findings" in md and "arXiv:2409.12181" in md and "arXiv:2309.10400" in md


def test_markdown_escape_keeps_text_literal():
    from ropekit.study.report_tables import _md_escape

    assert _md_escape("p < 0.05, a > b, 1 & 2") == "p < 0.05, a > b, 1 & 2"
    assert _md_escape("<b>x</b> &amp; a|b *c* [l](u)") == r"\<b>x\</b> \&amp; a\|b \*c\* [l]\(u)"


def test_report_command_warns_about_figures_with_overlapping_text(tmp_path, run_cli, build_study, monkeypatch):
    import ropekit.study

    build_study(tmp_path, methods=METHODS, lengths=LENGTHS)
    real = ropekit.study.write_report

    def with_an_overlap(study_dir, out_dir=None):
        paths = real(study_dir, out_dir)
        assert paths["figure_overlaps"] == {}  # the synthetic study's figures are clean
        return {**paths, "figure_overlaps": {"ppl_vs_length": [("yarn", "plain")]}}

    monkeypatch.setattr(ropekit.study, "write_report", with_an_overlap)
    code, _, err = run_cli("report", str(tmp_path))
    assert code == 0, err
    (line,) = [l for l in err.splitlines() if "overlapping" in l]
    assert "ppl_vs_length" in line and "'yarn'" in line


def test_wall_time_counts_only_the_time_pieces_ran():
    """A study stopped for an hour and resumed is charged the union of its pieces' intervals, not the gap."""
    from ropekit.study.report_tables import running_seconds

    def piece(start, end):
        return {"started": f"2026-01-01T{start}+00:00", "finished": f"2026-01-01T{end}+00:00"}

    pieces = [piece("10:00:00", "10:10:00"), piece("10:05:00", "10:20:00"),  # two workers, overlapping: 20 min
              piece("10:20:00", "10:21:00"),                                 # touching the previous one: +1 min
              piece("11:30:00", "11:40:00"),                                 # resumed after 69 idle minutes: +10 min
              {"started": "2026-01-01T11:35:00+00:00", "finished": None}]    # still running: not counted
    assert running_seconds(pieces) == (31 * 60.0, 100 * 60.0)
    assert running_seconds([]) == (None, None)
