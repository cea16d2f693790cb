"""Names that changed across transformers 5.x releases, read from the installed version instead of assumed.

transformers 5.2x renamed the KV-cache argument of every model's ``forward`` from ``past_key_values`` to
``cache`` (and the output field with it); the old name is accepted with a deprecation warning until its
removal. ropekit supports the whole 5.x range, so it asks the function it calls.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any


@functools.lru_cache(maxsize=None)
def _cache_argument_of(function: Callable) -> str:
    return "cache" if "cache" in inspect.signature(function).parameters else "past_key_values"


def cache_argument(module) -> str:
    """The keyword under which ``module.forward`` takes the KV cache: ``cache`` or ``past_key_values``."""
    return _cache_argument_of(type(module).forward)


def output_cache(output) -> Any:
    """The KV cache a model's forward returned (``output.cache``, or ``past_key_values`` before the rename)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)
