"""docs/walkthrough.md names real code: every ``src/ropekit/…py:Name`` it cites is defined in that file, every
``transformers.…`` name it cites resolves in the installed transformers, and the page is linked from the README
and docs/design.md."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "walkthrough.md"
SOURCE_REF = re.compile(r"`(src/ropekit/[\w/]+\.py):([\w.]+)`")
TRANSFORMERS_REF = re.compile(r"`(transformers(?:\.\w+)+)`")
FILE_REF = re.compile(r"`((?:src|tests)/[\w/]+\.(?:py|yaml|json))(?:::\w+)?`")


def _defines(tree: ast.Module, dotted: str) -> bool:
    """Whether ``tree`` defines ``dotted`` (``f``, ``Class.method``) at module or class level (``NAME = …`` too)."""
    scope: list[ast.stmt] = tree.body
    for part in dotted.split("."):
        found = None
        for node in scope:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == part:
                found = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    found = node
        if found is None:
            return False
        scope = getattr(found, "body", [])
    return True


def _references(pattern: re.Pattern) -> list[tuple[str, ...]]:
    return pattern.findall(PAGE.read_text(encoding="utf-8"))


def test_every_cited_function_exists():
    refs = _references(SOURCE_REF)
    assert len(refs) >= 60  # the page is mostly references: a broken pattern would pass vacuously
    missing = [f"{path}:{name}" for path, name in refs
               if not (REPO / path).is_file() or not _defines(ast.parse((REPO / path).read_text(encoding="utf-8")), name)]
    assert missing == []


def test_every_cited_file_exists():
    refs = _references(FILE_REF)
    assert refs
    assert [path for path in refs if not (REPO / path).is_file()] == []


def test_every_cited_transformers_name_resolves():
    refs = _references(TRANSFORMERS_REF)
    assert len(refs) >= 4
    missing = []
    for dotted in refs:
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                missing.append(dotted)
            break
        else:
            missing.append(dotted)
    assert missing == []


def test_the_reference_check_catches_a_wrong_name():
    tree = ast.parse("X = 1\nclass A:\n    def f(self):\n        pass\ndef g():\n    pass\n")
    assert _defines(tree, "X") and _defines(tree, "A.f") and _defines(tree, "g")
    assert not _defines(tree, "A.g") and not _defines(tree, "h") and not _defines(tree, "g.f")


def test_the_page_is_linked_from_the_readme_and_the_design_notes():
    assert "docs/walkthrough.md" in (REPO / "README.md").read_text(encoding="utf-8")
    assert "walkthrough.md" in (REPO / "docs" / "design.md").read_text(encoding="utf-8")
