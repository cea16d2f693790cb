"""Results as JSON lines: one record per scored sample, appended as it is produced, resumable.

A run writes each finished record immediately (flushed and fsynced), so a crash loses at most the piece
in flight; ``--resume`` reads the file back and skips every record whose key is already there.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable

from ..core.schema import MAX_POSITIONS
from ..errors import RopekitError
from ..runtime.atomic import atomic_file


def parse_lengths(text: str) -> list[int]:
    """``"4k,8k,12000"`` → ``[4096, 8192, 12000]`` (k = 1024); one-line error on anything else."""
    lengths = []
    for part in text.split(","):
        item = part.strip().lower()
        if not item:
            continue
        scale = 1024 if item.endswith("k") else 1
        number = item[:-1] if item.endswith("k") else item
        try:
            value = float(number) * scale
        except ValueError:
            raise RopekitError(f"--lengths entry '{part.strip()}' is not a length", "pass e.g. --lengths 4k,8k,16000") from None
        if not math.isfinite(value) or value < 1 or value != int(value):
            raise RopekitError(f"--lengths entry '{part.strip()}' is not a positive whole number of tokens", "pass e.g. --lengths 4k,8k")
        if value > MAX_POSITIONS:
            raise RopekitError(f"--lengths entry '{part.strip()}' is past {MAX_POSITIONS:,} tokens, the most positions "
                               "a float32 rotary angle tells apart", "pass lengths up to 16M tokens, e.g. --lengths 128k")
        lengths.append(int(value))
    if not lengths:
        raise RopekitError("--lengths is empty", "pass e.g. --lengths 4k,8k")
    return lengths


class RecordWriter:
    """Append-only JSONL results file with resume support."""

    def __init__(self, path: str | Path | None, *, resume: bool, key_fields: tuple[str, ...]):
        self.path = Path(path) if path else None
        self.key_fields = key_fields
        self.done: dict[tuple, dict[str, Any]] = {}
        #: The file's last record lacks its newline (a crash between the two writes): the next write starts one.
        self._unterminated = False
        if self.path is None:
            return
        if self.path.is_dir():
            raise RopekitError(f"--out '{self.path}' is a directory", "pass a results file path, e.g. results.jsonl")
        if self.path.exists() and self.path.stat().st_size > 0 and not resume:
            raise RopekitError(
                f"results file '{self.path}' already holds records",
                "pass --resume to continue it, or another --out",
            )
        if resume and self.path.exists():
            try:
                text = self.path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise RopekitError(f"'{self.path}' is not a JSON-lines results file (not UTF-8 text)",
                                   "pass the results file a run wrote, or another --out") from None
            lines = text.splitlines()
            cut = False
            if lines and not text.endswith("\n"):
                try:
                    json.loads(lines[-1])
                except json.JSONDecodeError:  # the line a crash cut short: dropped (that piece is redone)
                    if lines[-1].lstrip().startswith("{"):  # else not the start of a record: refused below
                        lines, cut = lines[:-1], True
                else:  # a whole record whose newline was not written: the next record must not join its line
                    self._unterminated = True
            records = []
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    raise RopekitError(f"'{self.path}' line {number} is not JSON", "fix or remove that line") from None
                if not isinstance(record, dict):
                    raise RopekitError(f"'{self.path}' line {number} is not a results record", "fix or remove that line")
                missing = [f for f in self.required_fields() if f not in record]
                if missing or not isinstance(record.get("task"), str):
                    # another program's JSON lines (a training run's metrics.jsonl): refused before anything is written
                    lacks = ", ".join(repr(f) for f in missing or ["task"])
                    raise RopekitError(f"'{self.path}' line {number} is not a ropekit results record (it lacks {lacks})",
                                       "pass --resume only with a results file `ropekit eval` wrote, or another --out")
                records.append(record)
            if cut:  # only a file that is otherwise a results file is rewritten
                with atomic_file(self.path, overwrite=True, what="results file") as tmp:
                    tmp.write_text("".join(line + "\n" for line in lines))
            for record in records:
                self.done[self.key(record)] = record

    def required_fields(self) -> tuple[str, ...]:
        """The fields every record of a resumed file must carry: ``task``, and those of the fields every evaluation
        record carries (``method``, ``params``, ``length``) that this writer keys its records by."""
        return ("task",) + tuple(f for f in ("method", "params", "length") if f in self.key_fields)

    def key(self, record: dict[str, Any]) -> tuple:
        return tuple(json.dumps(record.get(f), sort_keys=True) for f in self.key_fields)

    def has(self, record_key: dict[str, Any]) -> bool:
        return self.key(record_key) in self.done

    def write(self, record: dict[str, Any]) -> None:
        self.done[self.key(record)] = record
        if self.path is None:
            return
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        # the folder appears with the first record, so a run refused before it leaves nothing behind
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            # the missing newline goes in with the first record, so a resume that is then refused leaves the file as it was
            fh.write(("\n" if self._unterminated else "") + line)
            fh.flush()
            os.fsync(fh.fileno())
        self._unterminated = False

    def records(self) -> Iterable[dict[str, Any]]:
        return self.done.values()
