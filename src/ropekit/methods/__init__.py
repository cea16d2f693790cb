"""The method registry: every context-extension method ropekit knows, by name.

Importing this package registers all methods. Use :func:`get_method` / :func:`list_methods`. Adding a method is one
unit, ``methods/<name>.py`` (a :class:`Method` subclass with its hooks, :mod:`.base`), and one import line below.
"""

from __future__ import annotations

import difflib

from ..errors import UnknownMethodError
from .base import AttentionSpec, Method, Param, RopeInfo, registered

# Registration happens on import, in the order ``ropekit methods`` lists them.
from . import pi, ntk, dynamic_ntk, ntk_by_parts, yarn, dynamic_yarn, llama3, longrope, abf, harpe, self_extend, lm_infinite, dual_chunk, longlora, clex, landmark  # noqa: F401,E401
from . import resonance  # noqa: F401


def list_methods() -> list[Method]:
    """Every registered method."""
    return list(registered().values())


def get_method(name: str) -> Method:
    """The method called ``name``; an unknown name raises one line with the closest known names."""
    methods = registered()
    key = name.strip().lower().replace("-", "_")
    if key in methods:
        return methods[key]
    close = difflib.get_close_matches(key, methods, n=2)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise UnknownMethodError(
        f"unknown method '{name}'", f"{hint}run `ropekit methods` to list them ({', '.join(methods)})"
    )


__all__ = ["AttentionSpec", "Method", "Param", "RopeInfo", "get_method", "list_methods"]
