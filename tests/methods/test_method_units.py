"""A method is one unit: no module outside ``ropekit/methods/`` names a registered method (issue 30, item 1).

The rule, checked on the syntax tree of every module under ``src/ropekit`` except the methods package (a unit
``methods/<name>.py``, the helper modules it imports ``methods/<name>_*.py``, the shared ``methods/base.py`` and
the registry ``methods/__init__.py``):

* no string literal is exactly a method's registry name (``"dual_chunk"``) or its hyphenated form
  (``"dual-chunk"``);
* except where the name is also one of transformers' own rope types (``yarn``, ``llama3``, ``longrope``, …,
  read from transformers' ``ROPE_INIT_FUNCTIONS``): such a literal may describe a *checkpoint's* RoPE (``rope_type
  == "yarn"``), so for those names only their use as a method is refused — ``get_method("yarn")``,
  ``extend(model, "yarn")``, a ``name=``/``method=`` keyword (``MethodConfig(name="yarn")``), and comparisons of a method's name (``m.name == "yarn"``, ``method in ("pi", …)``,
  ``record["method"] == "yarn"``).

Data files (study presets, ``cli/methods.json``, docs) and tests are not checked: they are the registry's output or
its users. Module paths are not checked: a unit is ``methods/<name>.py`` with its helpers ``methods/<name>_*.py`` (its kernel
``<name>_attention.py``, its search ``<name>_search.py``), and modules that import a unit (``from ..methods.longrope
import LongRoPE``) name it through the unit's own ``name``.
A method's knowledge that install, eval, study or the CLI need is a hook on
:class:`ropekit.methods.base.Method` that the unit implements.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ropekit.methods import list_methods

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "ropekit"
METHODS_PACKAGE = PACKAGE / "methods"
#: Calls whose first string argument (after the model, for extend) is a method name.
METHOD_CALLS = {"get_method": 0, "extend": 1}
#: Expressions that hold a method's name when compared with a string.
METHOD_NAME_HOLDERS = ("name", "method", "method_name")


def _names() -> tuple[set[str], set[str]]:
    """(names refused as any literal, names refused only when used as a method)."""
    transformers_types = set(ROPE_INIT_FUNCTIONS) | {"default"}
    names = {m.name for m in list_methods()}
    spelled = {n: {n, n.replace("_", "-")} for n in names}
    anywhere = {s for n in names if n not in transformers_types for s in spelled[n]}
    as_method = {s for n in names if n in transformers_types for s in spelled[n]}
    return anywhere, as_method


def _holds_method_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in METHOD_NAME_HOLDERS
    if isinstance(node, ast.Name):
        return node.id in METHOD_NAME_HOLDERS
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and key.value in METHOD_NAME_HOLDERS
    return False


def _strings(node: ast.AST) -> list[ast.Constant]:
    """The string constants of ``node`` itself, or of a tuple/list/set literal."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [n for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def method_names_in(source: str, anywhere: set[str], as_method: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of every place ``source`` names a method, by the rule of the module docstring."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in anywhere:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.Call):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            position = METHOD_CALLS.get(func)
            if position is not None and len(node.args) > position:
                found += [(c.lineno, c.value) for c in _strings(node.args[position]) if c.value in as_method]
            found += [(c.lineno, c.value) for k in node.keywords if k.arg in METHOD_NAME_HOLDERS
                      for c in _strings(k.value) if c.value in as_method]
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_holds_method_name(o) for o in operands):
                found += [(c.lineno, c.value) for o in operands for c in _strings(o) if c.value in as_method]
    return sorted(set(found))


def _modules_outside_units() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if METHODS_PACKAGE not in p.parents]


def test_no_module_outside_the_methods_names_a_method():
    anywhere, as_method = _names()
    offences = [f"{path.relative_to(PACKAGE)}:{line}: {name!r}"
                for path in _modules_outside_units()
                for line, name in method_names_in(path.read_text(), anywhere, as_method)]
    assert offences == [], "methods named outside their units (add a hook to Method instead):\n" + "\n".join(offences)


def test_every_method_is_declared_in_one_unit():
    # each registered name is spelled as a literal `name = "<name>"` in exactly one module of the methods package
    declared: dict[str, list[str]] = {}
    for path in sorted(METHODS_PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id == "name" and isinstance(node.value, ast.Constant)):
                declared.setdefault(node.value.value, []).append(path.name)
    assert {m.name: len(declared.get(m.name, [])) for m in list_methods()} == {m.name: 1 for m in list_methods()}


@pytest.mark.parametrize("source, expected", [
    ('if m.name == "dual_chunk":\n    pass', [(1, "dual_chunk")]),
    ('x = get_method("ntk")', [(1, "ntk")]),
    ('FORMS = {"pi": 1}', [(1, "pi")]),
    ('label = "self-extend"', [(1, "self-extend")]),
    ('m = get_method("yarn")', [(1, "yarn")]),
    ('extend(model, "longrope", factor=2)', [(1, "longrope")]),
    ('ok = record["method"] in ("llama3", "x")', [(1, "llama3")]),
    ('config = MethodConfig(name="yarn", params={})', [(1, "yarn")]),
    # a checkpoint's rope type, an unrelated string, prose naming a method: not a method reference
    ('if rope.get("rope_type") == "yarn":\n    pass', []),
    ('TYPES = ("default", "linear", "yarn", "llama3", "longrope")', []),
    ('why = "use ntk or yarn instead"', []),
])
def test_the_check_finds_a_method_named_outside_its_unit(source, expected):
    anywhere, as_method = _names()
    assert method_names_in(source, anywhere, as_method) == expected
