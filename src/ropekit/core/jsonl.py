"""Reading JSON Lines files that users hand in: one line, one JSON value, blank lines skipped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from ..errors import RopekitError


def jsonl_rows(path: Path, fix: str) -> Iterator[tuple[int, object]]:
    """``(line number, value)`` for every non-blank line of ``path``, numbered from 1.

    A line that is not UTF-8 JSON stops the reading with one :class:`~ropekit.errors.RopekitError` naming the file
    and the line; ``fix`` is the error's advice (what the file should hold). Checking the values' fields is the
    caller's, which knows what it needs of them."""
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                yield number, json.loads(raw)
            except json.JSONDecodeError as exc:
                raise RopekitError(f"'{path}' line {number} is not JSON ({exc.msg})", fix) from None
            except UnicodeDecodeError:
                raise RopekitError(f"'{path}' line {number} is not UTF-8 text", fix) from None
            except (ValueError, RecursionError) as exc:  # JSON past the reader's limits: nesting, integer digits
                raise RopekitError(f"'{path}' line {number} is JSON this reader cannot hold "
                                   f"({str(exc).splitlines()[0][:80]})", fix) from None
