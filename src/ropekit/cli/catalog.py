"""The method registry as data, so that the command line answers and checks without importing torch.

``ropekit methods`` prints ``methods.json`` (beside this module) and ``ropekit extend`` checks the method name
and every ``--param`` against it before any model loads (a typo costs a second, not a model load). The file is
generated from :mod:`ropekit.methods` — ``python -m ropekit.cli.catalog`` rewrites it — and a test fails when it
differs from the registry (tests/cli/test_catalog.py).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from ..core.params import Param
from ..errors import InvalidParameterError, UnknownMethodError

CATALOG = Path(__file__).with_name("methods.json")
_TYPES = {"float": float, "int": int, "bool": bool, "str": str, "list": list}


def build() -> list[dict[str, Any]]:
    """Every registered method's description with its parameters' bounds (imports the registry: slow)."""
    from ..methods import list_methods

    out = []
    for m in list_methods():
        entry = m.describe()
        entry["bounds"] = {p.name: {"type": p.type.__name__, "minimum": p.minimum, "exclusive_minimum": p.exclusive_minimum,
                                    "maximum": p.maximum, "choices": list(p.choices) if p.choices else None}
                           for p in m.params}
        out.append(entry)
    return json.loads(json.dumps(out, default=str))


def load() -> list[dict[str, Any]]:
    """The catalog as written (fast)."""
    return json.loads(CATALOG.read_text(encoding="utf-8"))


def check(method: str, params: dict[str, Any]) -> str:
    """The method's registered name; a one-line error for an unknown method, an unknown parameter or a value its
    parameter refuses — the same messages :func:`ropekit.methods.get_method` and ``Method.resolve`` give."""
    methods = {entry["name"]: entry for entry in load()}
    key = method.strip().lower().replace("-", "_")
    if key not in methods:
        close = difflib.get_close_matches(key, methods, n=2)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise UnknownMethodError(f"unknown method '{method}'",
                                 f"{hint}run `ropekit methods` to list them ({', '.join(methods)})")
    bounds = methods[key]["bounds"]
    for name, value in params.items():
        if name not in bounds:
            raise InvalidParameterError(f"{key}: unknown parameter '{name}'",
                                        f"known parameters: {', '.join(sorted(bounds)) or 'none'}")
        spec = bounds[name]
        param = Param(name=name, type=_TYPES[spec["type"]], default=None, help="", minimum=spec["minimum"],
                      exclusive_minimum=spec["exclusive_minimum"], maximum=spec["maximum"],
                      choices=tuple(spec["choices"]) if spec["choices"] else None)
        if value is not None:
            param.coerce(key, value)
    return key


if __name__ == "__main__":
    CATALOG.write_text(json.dumps(build(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {CATALOG}")
