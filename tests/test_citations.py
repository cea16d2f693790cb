"""Code cites papers, public sources and the repository's own docs, never private notes.

The project's research notes are not part of the repository, so a citation of them (a section sign after the
word "notes") is one a reader cannot follow. What the code needs of them is in docs/methods-reference.md, which code cites by
section; this test also checks that every section cited there exists.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Spelled in pieces so that this file does not match itself.
FORBIDDEN = re.compile("|".join([r"notes\s+§", "shared/" + "notes", "field " + "notes", r"notes/\w+\.md"]),
                       re.IGNORECASE)
REFERENCE = ROOT / "docs" / "methods-reference.md"
CITED_SECTION = re.compile(r"methods-reference\.md\s+§(\d+)((?:\s*(?:,|and|–)\s*§?\d+)*)")


def _sources():
    for top in ("src", "tests"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in {".py", ".yaml", ".yml", ".md", ".toml", ".txt", ".cfg"}:
                yield path


def test_no_citation_of_private_notes():
    hits = []
    for path in _sources():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "cite the paper and equation, a public source or docs/ instead:\n" + "\n".join(hits)


def test_the_pattern_catches_what_it_is_for():
    caught = ["see notes " + "§12", "(field " + "notes " + "§2, verbatim)", "notes/" + "methods.md §9", "/work/shared/" + "notes/x"]
    assert all(FORBIDDEN.search(text) for text in caught)
    assert not FORBIDDEN.search("docs/methods-reference.md §9; progress, notes and errors go to stderr")


def test_cited_reference_sections_exist():
    headings = {int(m.group(1)) for m in re.finditer(r"^## (\d+)\. ", REFERENCE.read_text(encoding="utf-8"), re.M)}
    assert headings, "docs/methods-reference.md has no numbered sections"
    missing = []
    for path in _sources():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in CITED_SECTION.finditer(text):
            numbers = [int(match.group(1))] + [int(n) for n in re.findall(r"\d+", match.group(2))]
            missing += [f"{path.relative_to(ROOT)}: §{n}" for n in numbers if n not in headings]
    assert not missing, "cited sections absent from docs/methods-reference.md:\n" + "\n".join(missing)
