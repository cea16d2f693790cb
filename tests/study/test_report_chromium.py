"""The study report in a real browser: Debian's headless ``chromium`` opens ``report/index.html`` of a
synthetic study whose study name, model, method labels and error texts carry HTML/script fragments, and of
a synthetic study with every section (findings, control, ranking with ties, method cards, seeds, RULER).

Asserted on the rendered pages: no console error and no page error; every ``<img>`` loaded (``complete``
and ``naturalWidth > 0``) and every figure the report wrote is on the page; every figure is shown at its
natural size — half its pixels in CSS pixels (the PNGs are drawn at 2×), or smaller where the page is
narrower, never scaled up; no two text elements (headings, captions, table cells, intervals, list items,
card fields, figure captions) overlap, and no block of text overflows its box, at a desktop and a narrow
viewport; no dialog opened (each fragment would call ``alert``); no request left the page (it is
self-contained); the fragments appear verbatim in ``document.body.innerText``, and no element they would
inject exists (no ``<script>``, no ``on*`` attribute, no ``<img>`` outside the figures, no ``<b>``).

Driver: Playwright for Python (``pip install playwright``: the driver only, no browser download — it is
never asked to install one) launching the system browser with
``executable_path=shutil.which("chromium")``; it works offline. ``scripts/test.sh`` installs the
``chromium`` package when apt-get is usable; without the browser or playwright the test skips and says
which is missing.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synthetic_study as ss

from ropekit.study.report import write_report

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(2)>"
ENTITY = "&amp;"
STUDY_NAME = f"study {SCRIPT} <b>bold</b> {ENTITY} more"
MODEL = f"tiny {IMG}"
METHODS = ("plain", "yarn", SCRIPT, IMG, f"pi {ENTITY} friends")
FAILURES = {
    "eval:niah:yarn": f"ValueError: {IMG} then {SCRIPT} and {ENTITY}lt; in the error text",
    "eval:ruler:plain": f"RuntimeError: <svg onload=alert(5)> {ENTITY}",
}
FRAGMENTS = (SCRIPT, IMG, ENTITY, STUDY_NAME, MODEL, *METHODS, *FAILURES.values())
#: The variants of the page with every section: base, the control, frozen, fine-tuned, PoSE and searched ones.
FULL_LABELS = ("base", "base-ft", "ntk", "yarn", "self-extend", "longrope-search", "ntk-ft", "yarn-ft", "pose-yarn")

_LAYOUT = """() => {
  const describe = (el) => el.tagName.toLowerCase() + (el.className ? "." + el.className : "") + " «" + el.textContent.trim().slice(0, 40) + "»";
  const text = "h1,h2,h3,th,td,figcaption,p,li,dt,dd,nav a,span.v,span.ci,span.seeds,.verdict,.claim-text,.kind";
  const els = Array.from(document.querySelectorAll(text)).filter((el) => {
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && el.textContent.trim();
  });
  const boxes = els.map((el) => el.getBoundingClientRect());
  const overlaps = [];
  for (let i = 0; i < els.length; i++) {
    for (let j = i + 1; j < els.length; j++) {
      if (els[i].contains(els[j]) || els[j].contains(els[i])) continue;
      const a = boxes[i], b = boxes[j];
      const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (w > 1 && h > 1) overlaps.push([describe(els[i]), describe(els[j])]);
    }
  }
  const blocks = "h1,h2,h3,figcaption,p,li,dt,dd,.claim-text";
  const overflowing = Array.from(document.querySelectorAll(blocks)).filter(
    (el) => el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1).map(describe);
  const images = Array.from(document.images, (img) => {
    const box = getComputedStyle(img.parentElement);
    const room = img.parentElement.clientWidth - parseFloat(box.paddingLeft) - parseFloat(box.paddingRight);
    return {natural: img.naturalWidth, naturalHeight: img.naturalHeight, shown: img.clientWidth, shownHeight: img.clientHeight,
            room: room, file: img.alt.slice(0, 40)};
  });
  return {overlaps, overflowing, images};
}"""

_PAGE_FACTS = """() => ({
  text: document.body.innerText,
  images: Array.from(document.images, (img) => ({
    complete: img.complete, width: img.naturalWidth, src: img.getAttribute("src").slice(0, 22),
    inFigure: img.parentElement.tagName === "FIGURE"})),
  scripts: document.scripts.length,
  bold: document.querySelectorAll("b, svg").length,
  handlers: Array.from(document.querySelectorAll("*")).flatMap(
    (el) => Array.from(el.attributes).filter((a) => a.name.startsWith("on")).map((a) => el.tagName + " " + a.name)),
})"""


def _browser_or_skip():
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("the `chromium` browser is not on PATH (Debian package `chromium`; scripts/test.sh installs it "
                    "when apt-get is usable)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
    return chromium, sync_api


def _load(browser, html: str, width: int = 1280):
    """Open a report page; its facts (text, images, injected elements), layout and events."""
    events: dict[str, list[str]] = {"console_errors": [], "page_errors": [], "dialogs": [], "requests": []}
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.on("console", lambda m: m.type == "error" and events["console_errors"].append(m.text))
    page.on("pageerror", lambda e: events["page_errors"].append(str(e)))
    page.on("dialog", lambda d: (events["dialogs"].append(d.message), d.dismiss()))
    page.on("request", lambda r: None if r.url.startswith(("data:", "file:")) else events["requests"].append(r.url))
    page.goto(Path(html).as_uri(), wait_until="load")
    facts, layout = page.evaluate(_PAGE_FACTS), page.evaluate(_LAYOUT)
    page.close()
    return facts, layout, events


@pytest.fixture(scope="module")
def pages(tmp_path_factory, build_study):
    """The hostile study's report and a report with every section, loaded in headless Chromium at 1280 and
    760 CSS pixels: ``{(name, width): (paths, facts, layout, events)}``."""
    chromium, sync_api = _browser_or_skip()
    hostile = tmp_path_factory.mktemp("hostile_study")
    build_study(hostile, methods=METHODS, name=STUDY_NAME, model=MODEL, failures=FAILURES)
    full = tmp_path_factory.mktemp("full_study")
    ss.build(full, [v for v in ss.QUICK if v["label"] in FULL_LABELS], seeds=[0, 1], tasks=("ppl", "passkey", "ruler"))
    reports = {"hostile": write_report(hostile), "full": write_report(full)}
    out = {}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium)
        try:
            for name, paths in reports.items():
                for width in (1280, 760):
                    out[(name, width)] = (paths, *_load(browser, paths["html"], width))
        finally:
            browser.close()
    return out


@pytest.fixture(scope="module")
def rendered(pages):
    """The hostile study's page at the desktop width: (paths, facts, events)."""
    paths, facts, _, events = pages[("hostile", 1280)]
    return paths, facts, events


def test_no_console_or_page_errors_and_no_outside_request(rendered):
    _, _, events = rendered
    assert events["console_errors"] == [] and events["page_errors"] == []
    assert events["requests"] == []


def test_every_figure_is_an_image_that_loaded(rendered):
    paths, facts, _ = rendered
    images = facts["images"]
    assert len(images) == len(paths["figures"]) >= 4
    for img in images:
        assert img["complete"] and img["width"] > 0, img
        assert img["src"] == "data:image/png;base64," and img["inFigure"], img


def test_hostile_text_shows_as_text_and_runs_nothing(rendered):
    _, facts, events = rendered
    assert events["dialogs"] == []
    for fragment in FRAGMENTS:
        assert fragment in facts["text"], fragment
    assert facts["scripts"] == 0 and facts["bold"] == 0 and facts["handlers"] == []


def test_both_pages_load_cleanly(pages):
    for key, (_, _, _, events) in pages.items():
        assert events["console_errors"] == [] and events["page_errors"] == [], key
        assert events["requests"] == [] and events["dialogs"] == [], key


def test_figures_are_shown_at_their_natural_size_never_upscaled(pages):
    for key, (paths, facts, layout, _) in pages.items():
        images = layout["images"]
        assert len(images) == len(paths["figures"]) >= 4, key
        for img in images:
            natural = img["natural"] / 2  # drawn at 2×: its natural size in CSS pixels
            assert img["shown"] <= natural + 0.5, (key, img)  # never scaled up …
            assert img["shown"] == round(min(natural, img["room"])) or abs(img["shown"] - min(natural, img["room"])) <= 1, (key, img)
            assert abs(img["shownHeight"] / img["shown"] - img["naturalHeight"] / img["natural"]) < 0.01, (key, img)  # … nor distorted
    # at the desktop width the figures that fit are shown at exactly half their pixels (crisp on a 2× screen)
    _, _, layout, _ = pages[("full", 1280)]
    assert sum(img["shown"] * 2 == img["natural"] for img in layout["images"]) >= 3


def test_no_text_overlaps_or_overflows(pages):
    for key, (_, _, layout, _) in pages.items():
        assert layout["overlaps"] == [], (key, layout["overlaps"][:5])
        assert layout["overflowing"] == [], (key, layout["overflowing"][:5])


def test_the_full_page_shows_findings_control_and_cards(pages):
    _, facts, _, _ = pages[("full", 1280)]
    text = facts["text"]
    for words in ("Findings", "holds", "Effect relative to the control (base-ft)", "Method cards", "factor search",
                  "arXiv:2409.12181", "arXiv:2309.10400", "2 seeds:", "n = 8 documents per cell"):
        assert words in text, words
