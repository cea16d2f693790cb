"""The import rule of the README's Layout section: each package imports only from the layers below it
(import-linter's ``layers`` contract in pyproject.toml), and no module takes part in an import cycle —
function-level imports included, so a lazy import cannot hide one."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import grimp
import pytest
from importlinter.cli import lint_imports

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), over every import grimp found."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def _lint(tree: Path, monkeypatch) -> int:
    monkeypatch.syspath_prepend(str(tree))
    for name in [m for m in sys.modules if m == "ropekit" or m.startswith("ropekit.")]:
        monkeypatch.delitem(sys.modules, name)
    return lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True)


def test_every_package_imports_only_from_below(monkeypatch):
    assert _lint(SRC, monkeypatch) == 0


def test_an_upward_import_breaks_the_rule(tmp_path, monkeypatch):
    # the check can fail: the same tree with one upward import (core → install) is refused
    shutil.copytree(SRC / "ropekit", tmp_path / "ropekit", ignore=shutil.ignore_patterns("__pycache__"))
    rope = tmp_path / "ropekit" / "core" / "rope.py"
    rope.write_text(rope.read_text() + "\n\ndef _upward():\n    from ..install import extend\n\n    return extend\n")
    assert _lint(tmp_path, monkeypatch) == 1


def test_no_import_cycles_anywhere():
    graph = grimp.build_graph("ropekit")
    assert graph.modules, "grimp found no modules"
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_lazy_cycle():
    graph = grimp.ImportGraph()
    for name in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(name)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.c")
    graph.add_import(importer="pkg.c", imported="pkg.a")  # e.g. inside a function body
    assert _cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


@pytest.mark.parametrize("module", ["ropekit.demo"])
def test_the_demo_is_a_consumer_only_the_cli_imports(module):
    graph = grimp.build_graph("ropekit")
    importers = graph.find_modules_that_directly_import(module)
    assert importers <= {"ropekit.cli", "ropekit.cli.demo"}, importers
