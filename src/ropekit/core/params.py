"""A method parameter: its type, default, bounds, and the conversion of a value (a CLI string) to it.

Torch-free, so that the command line can check a method's ``--param`` values before anything heavy is imported
(:mod:`ropekit.cli.catalog`); :mod:`ropekit.methods` declares every method's parameters with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidParameterError
from .rope_info import RopeInfo

_TYPE_NAMES = {float: "a number", int: "an integer", bool: "true or false", str: "a string", list: "a list of numbers"}


@dataclass(frozen=True)
class Param:
    """One typed, documented method parameter.

    ``default`` is a value, ``None`` (optional), or a callable ``RopeInfo -> value`` for defaults that
    depend on the model (e.g. the original window). ``minimum``/``maximum`` bound numbers (inclusive unless
    ``exclusive_minimum``); ``choices`` bounds strings.
    """

    name: str
    type: type
    default: Any
    help: str
    minimum: float | None = None
    exclusive_minimum: bool = False
    maximum: float | None = None
    choices: tuple[str, ...] | None = None

    def default_for(self, info: RopeInfo | None) -> Any:
        if callable(self.default):
            return self.default(info) if info is not None else None
        return self.default

    def describe_default(self) -> Any:
        """The default as shown in ``ropekit methods``: model-dependent defaults are described in words."""
        if callable(self.default):
            return getattr(self.default, "__doc__", None) or "from the model"
        return self.default

    def coerce(self, method: str, value: Any) -> Any:
        """Convert ``value`` (a Python value or a CLI string) to this parameter's type, or raise one line."""
        bad = InvalidParameterError(
            f"{method}: parameter '{self.name}' must be {_TYPE_NAMES[self.type]}, got {value!r}",
            f"pass e.g. --param {self.name}={self._example()}",
        )
        if value is None:
            return None
        if self.type is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
            raise bad
        if self.type in (int, float):
            if isinstance(value, bool):
                raise bad
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    raise bad from None
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise bad
            if self.type is int:
                if float(value) != int(value):
                    raise bad
                value = int(value)
            else:
                value = float(value)
            self._check_range(method, value)
            return value
        if self.type is str:
            if not isinstance(value, str):
                raise bad
            if self.choices and value not in self.choices:
                raise InvalidParameterError(
                    f"{method}: parameter '{self.name}' must be one of {', '.join(self.choices)}, got '{value}'",
                    f"pass e.g. --param {self.name}={self.choices[0]}",
                )
            return value
        if self.type is list:
            if isinstance(value, str):
                value = [v for v in value.replace(";", ",").split(",") if v.strip()]
            if not isinstance(value, (list, tuple)):
                raise bad
            out = []
            for v in value:
                if isinstance(v, bool):
                    raise bad
                try:
                    out.append(float(v))
                except (TypeError, ValueError):
                    raise bad from None
                if not math.isfinite(out[-1]):  # nan/inf would reach config.json as a bare NaN/Infinity
                    raise bad
            return out
        raise TypeError(f"unsupported parameter type {self.type}")

    def _check_range(self, method: str, value: float) -> None:
        if self.minimum is not None:
            if value < self.minimum or (self.exclusive_minimum and value == self.minimum):
                op = ">" if self.exclusive_minimum else "≥"
                raise InvalidParameterError(
                    f"{method}: parameter '{self.name}' must be {op} {self.minimum:g}, got {value:g}",
                    f"pass a value {op} {self.minimum:g}",
                )
        if self.maximum is not None and value > self.maximum:
            raise InvalidParameterError(
                f"{method}: parameter '{self.name}' must be ≤ {self.maximum:g}, got {value:g}",
                f"pass a value ≤ {self.maximum:g}",
            )

    def _example(self) -> str:
        return {float: "2.0", int: "4", bool: "true", str: (self.choices or ("x",))[0], list: "1e6,2e6"}[self.type]
