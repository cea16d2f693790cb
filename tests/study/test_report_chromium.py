"""The study report in a real browser: Debian's headless ``chromium`` opens ``report/index.html`` of a
synthetic study whose study name, model, method labels and error texts carry HTML/script fragments.

Asserted on the rendered page: no console error and no page error; every ``<img>`` loaded (``complete``
and ``naturalWidth > 0``) and every figure the report wrote is on the page; no dialog opened (each
fragment would call ``alert``); no request left the page (it is self-contained); the fragments appear
verbatim in ``document.body.innerText``, and no element they would inject exists (no ``<script>``, no
``on*`` attribute, no ``<img>`` outside the figures, no ``<b>``).

Driver: Playwright for Python (``pip install playwright``: the driver only, no browser download — it is
never asked to install one) launching the system browser with
``executable_path=shutil.which("chromium")``; it works offline. ``scripts/test.sh`` installs the
``chromium`` package when apt-get is usable; without the browser or playwright the test skips and says
which is missing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, build_study):
    """The report of the hostile study, loaded once in headless Chromium: the page's facts and events."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("the `chromium` browser is not on PATH (Debian package `chromium`; scripts/test.sh installs it "
                    "when apt-get is usable)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")

    directory = tmp_path_factory.mktemp("hostile_study")
    build_study(directory, methods=METHODS, name=STUDY_NAME, model=MODEL, failures=FAILURES)
    paths = write_report(directory)
    events: dict[str, list[str]] = {"console_errors": [], "page_errors": [], "dialogs": [], "requests": []}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium)
        try:
            page = browser.new_page()
            page.on("console", lambda m: m.type == "error" and events["console_errors"].append(m.text))
            page.on("pageerror", lambda e: events["page_errors"].append(str(e)))
            page.on("dialog", lambda d: (events["dialogs"].append(d.message), d.dismiss()))
            page.on("request", lambda r: None if r.url.startswith(("data:", "file:")) else events["requests"].append(r.url))
            page.goto(Path(paths["html"]).as_uri(), wait_until="load")
            facts = page.evaluate(_PAGE_FACTS)
        finally:
            browser.close()
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
