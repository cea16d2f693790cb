"""User-facing errors.

Every problem a user can cause (bad method name, factor below 1, missing file, model without RoPE, ...)
is raised as a :class:`RopekitError` carrying one line that names the problem and the fix. The CLI turns
it into that line on stderr and exit code 2; Python callers can catch it.
"""

from __future__ import annotations


class RopekitError(Exception):
    """A problem with the user's input, reported as ``problem — fix`` on one line."""

    exit_code = 2

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem.rstrip(".")
        self.fix = fix.rstrip(".") if fix else None
        super().__init__(self.one_line())

    def one_line(self) -> str:
        return f"{self.problem}. {self.fix}." if self.fix else f"{self.problem}."


class UnknownMethodError(RopekitError):
    """The method name is not in the registry."""


class InvalidParameterError(RopekitError):
    """A method parameter is unknown, of the wrong type, or out of range."""


class UnsupportedModelError(RopekitError):
    """The model cannot take the requested method (no RoPE, unsupported architecture, ...)."""


class ModelLoadError(RopekitError):
    """A model path is missing or malformed, or a hub id cannot be reached offline."""
