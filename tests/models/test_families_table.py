"""The family table of docs/methods.md is the capability check's own output (``ropekit methods --families``)."""

from __future__ import annotations

import re
from pathlib import Path

from ropekit.models.families import support_markdown

README = Path(__file__).resolve().parents[2] / "docs" / "methods.md"


def test_readme_family_table_is_generated_from_the_capability_check():
    block = re.search(r"<!-- families:start -->\n(.*?)\n<!-- families:end -->", README.read_text(), re.S)
    assert block, "docs/methods.md has no families block"
    assert block.group(1) == support_markdown(), (
        "docs/methods.md's family table is out of date: paste the output of "
        "`python -c 'from ropekit.models.families import support_markdown; print(support_markdown())'`")
