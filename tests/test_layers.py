"""The import rule of docs/design.md: each package imports only from the layers below it
(import-linter's ``layers`` contract in pyproject.toml), and no module takes part in an import cycle —
function-level imports included, so a lazy import cannot hide one. Nor does the root package's lazy
``__getattr__``: no module below it imports a name from ``ropekit`` itself."""

from __future__ import annotations

import ast
import logging
import re
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
    # import-linter configures logging with disable_existing_loggers: every logger created before it (transformers')
    # would stay disabled for the rest of this test process, and later tests that read its warnings fail
    loggers = [logging.getLogger()] + [v for v in logging.root.manager.loggerDict.values() if isinstance(v, logging.Logger)]
    disabled = {logger: logger.disabled for logger in loggers}
    try:
        return lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True)
    finally:
        for logger, was in disabled.items():
            logger.disabled = was


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


# ---- nothing below the root imports the root ----------------------------------------------------------------
#: Modules that may import public names from ``ropekit``: the root itself, and the demo — a consumer written
#: against the public API like user code, which only the CLI imports (test above), so nothing the root's names
#: lead to comes back to it. The CLI gets no exception: it imports what it runs from the modules that define it.
ROOT_IMPORTERS = {"ropekit/__init__.py", "ropekit/demo.py"}


def _root_imports(path: Path, package: str) -> list[str]:
    """The imports in ``path`` (a module of ``package``; function bodies included) that take a name from the
    root package rather than a module below it: ``import ropekit``, ``from ropekit import NAME`` and
    ``from .. import NAME`` resolving to the root. ``from .. import runtime`` (a subpackage) is fine."""
    root = SRC / "ropekit"
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import ropekit" for alias in node.names if alias.name == "ropekit"]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            if ".".join(parts + ([node.module] if node.module else [])) != "ropekit":
                continue
            source = "." * node.level + (node.module or "")
            found += [f"line {node.lineno}: from {source} import {alias.name}" for alias in node.names
                      if not (root / f"{alias.name}.py").is_file() and not (root / alias.name / "__init__.py").is_file()]
    return found


def _modules():
    """``(path under src/, path, package)`` of every module of the source tree."""
    for path in sorted((SRC / "ropekit").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        yield path.relative_to(SRC).as_posix(), path, ".".join(parts[:-1])


def test_no_module_below_the_root_imports_the_root():
    """``from .. import __version__`` in ropekit.install made root → (lazy public name) → install → root a cycle
    that grimp cannot see, because the root reaches its public names through importlib."""
    offenders = {relative: found for relative, path, package in _modules() if relative not in ROOT_IMPORTERS
                 for found in [_root_imports(path, package)] if found}
    assert offenders == {}


def test_the_root_import_scan_finds_one(tmp_path):
    module = tmp_path / "x.py"
    module.write_text("from .. import runtime\nfrom .. import __version__\n\ndef f():\n    import ropekit\n"
                      "    from ropekit import extend\n    from ropekit import data\n")
    assert _root_imports(module, "ropekit.install") == ["line 2: from .. import __version__", "line 5: import ropekit",
                                                         "line 6: from ropekit import extend"]
    assert _root_imports(module, "ropekit.install.sub") == ["line 5: import ropekit", "line 6: from ropekit import extend"]


def test_the_version_is_the_one_of_pyproject():
    import ropekit
    from ropekit._version import __version__

    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE).group(1) == __version__ == ropekit.__version__
