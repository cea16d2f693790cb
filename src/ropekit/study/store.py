"""The results store of one study: a single SQLite file (``DIR/study.sqlite``) that every worker writes.

A study is cut into *pieces* — one training run (``train:yarn``), one evaluation of one method
(``eval:passkey:yarn``), a pretraining step (``pretrain:…``) — each done by one worker. The store keeps

* ``manifest`` — key → JSON value: study name, config, seeds, ropekit/torch/transformers versions, the
  machine (CPU model, cores, RAM, GPU, OS, Python), ``created``/``updated`` timestamps, and what the
  report reads (``model``, ``window``, ``target_length``, ``methods``); under ``variants_recorded`` every variant
  definition the study has ever been run with, by label (a dropped variant's results stay in the file under its
  label, so the label stays bound to that definition: :meth:`StudyStore.check_config`); and under
  ``placement:PIECE`` where each finished piece computed (device, dtype, attention, the hardware's name:
  :meth:`StudyStore.placements`), since one study may be finished on several machines;
* ``pieces`` — one row per piece: kind, method label, params, task, status
  (pending → running → done | failed), start/finish times, seconds, error, worker, attempts;
* ``samples`` — one row per scored evaluation sample (the JSON record an eval task writes, see
  :mod:`ropekit.eval.common`), unique per (piece, sample key);
* ``train_metrics`` — one row per logged training step, unique per (piece, step);
* ``artifacts`` — named files a piece produced (a checkpoint directory, a plot).

Durability and concurrency. The database runs in WAL mode with ``synchronous=FULL``; every write is one
``BEGIN IMMEDIATE`` transaction (the write lock is taken up front, so two writers never deadlock on a
lock upgrade, and the busy timeout makes the second one wait rather than fail). ``finish_piece`` writes a
piece's samples, metrics, artifacts and its ``done`` status in one transaction: a crash anywhere before
the commit leaves the piece not done and none of that call's rows behind. Long evaluations can instead
stream samples with :meth:`StudyStore.add_samples` (each call its own transaction, idempotent by the
UNIQUE key), so a killed run resumes mid-piece from :meth:`StudyStore.done_keys`.

Sample keys are the fields that identify a sample, as in the JSONL resume of
:class:`~ropekit.eval.records.RecordWriter`: ``task, method, params, length`` plus the task module's
``KEY_FIELDS`` (``speed`` records: ``repeat``), serialised as sorted-key JSON.

Method labels. A piece may carry a method *label* (``yarn-ft`` for a fine-tuned YaRN, say) that differs
from the ``method`` field of the records its evaluation writes (``yarn``). The ``samples.method`` column
holds the piece's label when it has one, else the record's own method (one ``speed`` piece measures all
methods); :meth:`StudyStore.samples` returns records whose ``method`` is that label, the record's own
value kept under ``eval_method`` when it differs.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RopekitError
from ..eval.records import RecordWriter

if TYPE_CHECKING:  # Python 3.11's typing.Self, for 3.10 too
    from typing_extensions import Self

#: Version of the table layout below, kept in SQLite's ``user_version`` header field.
SCHEMA_VERSION = 1
#: File name of a study's database inside its directory.
DB_NAME = "study.sqlite"
#: Manifest keys ``placement:PIECE`` hold where that piece computed (:meth:`StudyStore.placements`).
PLACEMENT_KEY = "placement:"
#: Manifest key of every variant definition the study was ever run with, label → definition (:func:`_definition`).
VARIANTS_KEY = "variants_recorded"
#: Keys of a variant that document it rather than say what runs: they may change between runs (the manifest's
#: config, which the report reads, takes the new text) and are no part of the study's identity.
VARIANT_DOCUMENTATION = ("note",)
KINDS = ("train", "eval", "pretrain", "search")
STATUSES = ("pending", "running", "done", "failed")
#: Fields every evaluation record carries (as :data:`ropekit.eval.common.COMMON_KEY_FIELDS`).
COMMON_KEY_FIELDS = ("task", "method", "params", "length")
#: Key fields of tasks whose module declares none (``speed`` keys its records by repeat).
_EXTRA_KEY_FIELDS = {"speed": ("repeat",)}

_SCHEMA = """
CREATE TABLE manifest (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL                       -- JSON
);
CREATE TABLE pieces (
    id       TEXT PRIMARY KEY,                -- "train:yarn", "eval:passkey:yarn"
    kind     TEXT NOT NULL CHECK (kind IN ('train', 'eval', 'pretrain', 'search')),
    method   TEXT,                            -- the study's label of the method variant
    params   TEXT NOT NULL DEFAULT '{}',      -- JSON
    task     TEXT,
    status   TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'done', 'failed')),
    created  TEXT NOT NULL,                   -- ISO 8601, UTC
    started  TEXT,
    finished TEXT,
    seconds  REAL,
    error    TEXT,
    worker   TEXT,                            -- "host@boot:pid" of the last worker that began it
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX pieces_status ON pieces (status, kind);
CREATE TABLE samples (
    id         INTEGER PRIMARY KEY,
    piece      TEXT NOT NULL REFERENCES pieces (id) ON DELETE CASCADE,
    task       TEXT NOT NULL,
    method     TEXT NOT NULL,
    params     TEXT NOT NULL,                 -- JSON
    length     INTEGER,
    sample_key TEXT NOT NULL,                 -- JSON of the key fields
    score      REAL,                          -- in [0, 1], NULL where the task has none (ppl, speed)
    record     TEXT NOT NULL,                 -- the full JSON record
    UNIQUE (piece, sample_key)
);
CREATE INDEX samples_task_method ON samples (task, method, length);
CREATE TABLE train_metrics (
    piece   TEXT NOT NULL REFERENCES pieces (id) ON DELETE CASCADE,
    step    INTEGER NOT NULL,
    loss    REAL,
    lr      REAL,
    tokens  INTEGER,
    seconds REAL,
    record  TEXT NOT NULL,                    -- the full JSON record
    PRIMARY KEY (piece, step)
);
CREATE TABLE artifacts (
    piece   TEXT NOT NULL REFERENCES pieces (id) ON DELETE CASCADE,
    name    TEXT NOT NULL,
    path    TEXT NOT NULL,
    created TEXT NOT NULL,
    PRIMARY KEY (piece, name)
);
"""
_TABLES = {"manifest", "pieces", "samples", "train_metrics", "artifacts"}


def now_iso() -> str:
    """The current UTC time as ISO 8601 with milliseconds (sorts as text, parses with ``fromisoformat``)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _seconds_between(start: str | None, end: str) -> float | None:
    if not start:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


@dataclass(frozen=True)
class Piece:
    """One unit of work of a study; ``id`` is ``kind:…`` (``train:yarn``, ``eval:passkey:yarn``)."""

    id: str
    kind: str
    method: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    task: str | None = None


def parse_piece_id(piece_id: str) -> Piece:
    """The :class:`Piece` a conventional id names: ``train:M``/``pretrain:M`` (method M),
    ``eval:T`` (task T, e.g. one speed piece for all methods) or ``eval:T:M``."""
    if not isinstance(piece_id, str) or ":" not in piece_id:
        raise RopekitError(f"piece id {piece_id!r} is not KIND:…", "name pieces like 'train:yarn' or 'eval:passkey:yarn'")
    kind, rest = piece_id.split(":", 1)
    if kind not in KINDS:
        raise RopekitError(f"piece id '{piece_id}' has kind '{kind}'", f"start it with one of: {', '.join(KINDS)}")
    if not rest:
        raise RopekitError(f"piece id '{piece_id}' names nothing after '{kind}:'", "name pieces like 'train:yarn' or 'eval:passkey:yarn'")
    if kind == "eval":
        task, _, method = rest.partition(":")
        return Piece(piece_id, kind, method or None, {}, task)
    return Piece(piece_id, kind, rest, {}, None)


def key_fields_for(task: str) -> tuple[str, ...]:
    """The fields identifying one sample of ``task``: the common ones plus the task module's ``KEY_FIELDS``."""
    if task in _EXTRA_KEY_FIELDS:
        return COMMON_KEY_FIELDS + _EXTRA_KEY_FIELDS[task]
    from ..eval import get_task

    try:
        module = get_task(task)
    except ImportError:
        module = None
    own = getattr(module, "KEY_FIELDS", None)
    if own is None:
        raise RopekitError(f"cannot tell which fields identify a '{task}' sample", "pass key_fields=(…) to the store call")
    return COMMON_KEY_FIELDS + tuple(own)


def sample_key(record: Mapping[str, Any], key_fields: Iterable[str]) -> str:
    """The JSON text identifying ``record`` among its piece's samples."""
    return _dumps({f: record.get(f) for f in key_fields})


def _check_score(record: Mapping[str, Any]) -> float | None:
    score = record.get("score")
    if score is None:
        return None
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score) or not 0.0 <= score <= 1.0:
        raise RopekitError(
            f"a '{record.get('task')}' record has score {score!r}, not a number in [0, 1]",
            "write scores in [0, 1] (or None for tasks without one)",
        )
    return float(score)


def _read_proc(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _definition(variant: Mapping[str, Any]) -> dict[str, Any]:
    """What a variant of a recorded config runs: everything but its documentation (:data:`VARIANT_DOCUMENTATION`)."""
    return {k: v for k, v in variant.items() if k not in VARIANT_DOCUMENTATION}


def _variants_of(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A recorded config's variants by label, each as its :func:`_definition`."""
    return {v["label"]: _definition(v) for v in config.get("variants") or []
            if isinstance(v, Mapping) and isinstance(v.get("label"), str)}


def _protocol_difference(old: Mapping[str, Any], new: Mapping[str, Any],
                         recorded: Mapping[str, Any] | None = None) -> str | None:
    """The first setting in which ``new`` is another protocol than the study's, in words, or None when it is the
    same one: everything but the variants equal, and every variant of ``new`` defined as the study last ran it
    (``old``) or, for a label it dropped, as ``recorded`` (:data:`VARIANTS_KEY`) keeps it — a dropped variant's
    results stay in the file under its label, and a label brought back with another definition would reuse them
    under the new settings. Variants may be added or dropped, and a note (:data:`VARIANT_DOCUMENTATION`) may change."""
    from ..train.checkpoint import config_diff

    rest_old = {k: v for k, v in old.items() if k != "variants"}
    rest_new = {k: v for k, v in new.items() if k != "variants"}
    if rest_old != rest_new:
        found = config_diff(rest_old, rest_new)
        return (found or "a setting beside the variants").replace(" in the run, ", " in the study, ")
    listed = _variants_of(old)
    before = {**(recorded or {}), **listed}
    for label, variant in _variants_of(new).items():
        if label in before and before[label] != variant:
            found = config_diff(before[label], variant, f"variant '{label}'") or f"variant '{label}'"
            found = found.replace(" in the run, ", " in the study, ")
            if label not in listed:  # dropped by an earlier run: its results are still in the study
                found += ", a variant dropped earlier whose results stay in the study under its label"
            return found
    return None


def placement_label(where: Mapping[str, Any]) -> str:
    """One placement (:func:`ropekit.runtime.devices.computed_on`) in words: ``bfloat16, sdpa attention, on
    NVIDIA H200``; a training's autocast precision is named beside its weights' dtype."""
    what = str(where.get("dtype", "?"))
    if where.get("precision"):
        precision = str(where["precision"])
        what += f" weights, trained in {precision}" + ("" if precision == "fp32" else " autocast")
    if where.get("attn"):
        what += f", {where['attn']} attention"
    return f"{what}, on {where.get('hardware') or where.get('device') or '?'}"


def placement_groups(pieces: Iterable[Mapping[str, Any]], placements: Mapping[str, Mapping[str, Any]],
                     sample_placements: Mapping[str, list[tuple[Mapping[str, Any] | None, int]]] | None = None
                     ) -> list[dict[str, Any]]:
    """The finished pieces, and the samples of unfinished ones (the partial cells a report shows), grouped by where
    they computed: ``[{"where": label or None, "pieces": [ids], "methods": [labels], "samples": n}]``, the most
    pieces first. An evaluation's samples each carry their own placement (``computed_on``,
    :meth:`StudyStore.sample_placements`), so a piece resumed on another machine counts in both groups; a sample
    without one takes its finished piece's. ``where`` None gathers what recorded nothing (finished before ropekit
    kept placements)."""
    groups: dict[str | None, dict[str, Any]] = {}

    def add(where, piece, n):
        key = placement_label(where) if where else None
        g = groups.setdefault(key, {"where": key, "pieces": [], "methods": [], "samples": 0})
        if piece["id"] not in g["pieces"]:
            g["pieces"].append(piece["id"])
        if piece.get("method") and piece["method"] not in g["methods"]:
            g["methods"].append(piece["method"])
        g["samples"] += n

    for p in pieces:
        stamps = (sample_placements or {}).get(p["id"])
        if p.get("status") != "done":
            for where, n in stamps or []:  # an unfinished piece: only what its samples say
                if where:
                    add(where, p, n)
            continue
        for where, n in stamps or [(None, 0)]:
            add(where or placements.get(p["id"]), p, n)
    return sorted(groups.values(), key=lambda g: (g["where"] is None, -len(g["pieces"])))


def placement_text(groups: list[dict[str, Any]], joiner: str = "; ") -> str:
    """:func:`placement_groups` in words: ``WHERE: 51 pieces (1,230 samples) · WHERE: 3 pieces (13 samples;
    landmark)`` — the methods named when there are several places and few methods in one."""
    parts = []
    for g in groups:
        n = len(g["pieces"])
        counts = [f"{g['samples']:,} sample{'s' if g['samples'] != 1 else ''}"] if g.get("samples") else []
        if len(groups) > 1 and len(g["methods"]) <= 4:
            counts.append(", ".join(g["methods"]))
        parts.append(f"{g['where'] or 'not recorded'}: {n} piece{'s' if n != 1 else ''}"
                     + (f" ({'; '.join(counts)})" if counts else ""))
    return joiner.join(parts)


def machine_description() -> dict[str, Any]:
    """What the study ran on: CPU model, logical cores (all and usable), RAM, GPUs, OS, Python."""
    from ..runtime.devices import cpu_model

    ram = None
    for line in _read_proc("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            ram = int(line.split()[1]) * 1024
            break
    if ram is None and hasattr(os, "sysconf"):
        try:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            ram = None
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus: list[str] = []
    try:
        import torch

        if torch.cuda.is_available():
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except (ImportError, RuntimeError, AssertionError):  # no torch, or a broken driver: no GPU to describe
        gpus = []
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "ram_bytes": ram,
        "gpus": gpus,
        "os": platform.platform(),
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
    }


def package_versions() -> dict[str, str | None]:
    """Installed versions of ropekit, torch and transformers (from package metadata, nothing imported)."""
    from importlib import metadata

    out = {}
    for name in ("ropekit", "torch", "transformers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _boot_id() -> str:
    """A short id of this machine's current boot ('' where the system has none): two machines, or one machine
    before and after a reboot, can share a host name (cloned cloud machines are often all called the same)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return ""


def _boot_time() -> float | None:
    """When this machine booted (Unix seconds), or None where that cannot be read."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _this_machine() -> str:
    boot = _boot_id()
    return f"{socket.gethostname()}@{boot}" if boot else socket.gethostname()


def _this_worker() -> str:
    return f"{_this_machine()}:{os.getpid()}"


def _worker_alive(worker: str | None, started: str | None = None, *, one_machine: bool = True) -> bool:
    """Whether the worker that holds a running piece may still be working on it.

    * A piece begun before this machine booted: its worker is gone (a study copied from another machine, or
      one that was running when this machine went down).
    * A worker on another machine (another host name, or another boot id in a ``host@boot:pid`` worker):
      with the store in WAL mode (``one_machine``), whose shared-memory index works only among processes of
      one machine (https://www.sqlite.org/wal.html, "all processes using a database must be on the same host
      computer"), it cannot be writing to this database, so it is gone. In another journal mode it cannot be
      checked and is assumed alive.
    * A process on this machine: alive while its pid exists.
    """
    if not worker or ":" not in worker:
        return False
    machine, _, pid = worker.rpartition(":")
    booted = _boot_time()
    if started and booted is not None:
        try:
            if datetime.fromisoformat(started).timestamp() < booted:
                return False
        except ValueError:
            pass
    host, _, boot = machine.partition("@")
    if host != socket.gethostname() or (boot and boot != _boot_id()):
        return not one_machine
    try:
        pid_n = int(pid)
    except ValueError:
        return False
    if pid_n == os.getpid():
        return False  # ourselves: a re-begin after an exception in this process
    try:
        os.kill(pid_n, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _retry_locked(fn, timeout: float):
    """``fn()``, retried while SQLite reports the database locked or busy, for up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as e:
            text = str(e).lower()
            if ("locked" not in text and "busy" not in text) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


class _DamagedDatabase(RopekitError):
    """A file SQLite cannot read as a database (cut short, overwritten): refused like any other non-study file."""


class StudyStore:
    """Read and write one study's SQLite database (see the module docstring for the layout).

    ``StudyStore(path)`` opens ``path`` — a database file, or a study directory (an existing directory or
    a path without suffix) meaning its ``study.sqlite`` — creating it and its directory unless
    ``create=False``. Each process opens its own store; a store object is not shared between threads.
    """

    def __init__(self, path: str | Path, *, create: bool = True, timeout: float = 60.0):
        self.path = Path(path)
        if self.path.is_dir() or (not self.path.exists() and not self.path.suffix):  # a study directory
            self.path = self.path / DB_NAME
        if not self.path.exists():
            if not create:
                raise RopekitError(f"no study database at '{self.path}'", "run `ropekit study` first, or pass the study's directory")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        #: Opened for reading only: a study published on a read-only filesystem or directory (``status``,
        #: ``report --out elsewhere``), where SQLite cannot create the WAL's ``-shm`` and ``-wal`` files.
        self.read_only = not create and not os.access(self.path.parent, os.W_OK)
        logs = [self.path.with_name(self.path.name + suffix) for suffix in ("-wal", "-shm")]
        new_logs = [log for log in logs if not log.exists()]
        try:
            self._open(create, timeout)
        except _DamagedDatabase:
            # SQLite makes a WAL database's -wal and -shm files on opening it, even read-only, and leaves them when
            # the file then proves damaged: a refused database is left as it was found. Only then: a store refused
            # for a lock may share the directory with a study whose workers have just made their log.
            if not any(log.exists() and log.stat().st_size > 0 for log in new_logs if log.name.endswith("-wal")):
                for log in new_logs:
                    log.unlink(missing_ok=True)
            raise

    def _open(self, create: bool, timeout: float) -> None:
        if not self.read_only:
            self._refuse_another_file(create)  # before the read-write connection turns any file into WAL mode
        if self.read_only:
            self._conn = self._connect_read_only(timeout)
        else:
            self._conn = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            if self.read_only:
                mode = self._conn.execute("PRAGMA journal_mode").fetchone()[0]
            else:
                # switching a new file to WAL takes an exclusive lock without waiting on the busy handler, so
                # workers that open a fresh study together retry it (and the schema set-up) for a while
                mode = _retry_locked(lambda: self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0], timeout)
                self._conn.execute("PRAGMA synchronous = FULL")
            self._conn.execute("PRAGMA foreign_keys = ON")
            _retry_locked(lambda: self._init_schema(create), timeout)
        except sqlite3.DatabaseError as e:
            self._conn.close()
            raise _DamagedDatabase(f"'{self.path}' is not a ropekit study database ({e})",
                                   "pass a study directory or its study.sqlite") from None
        except BaseException:
            self._conn.close()
            raise
        self.journal_mode = mode
        #: Every process that writes this database is on this machine (WAL's shared-memory index needs it).
        self._one_machine = str(mode).lower() == "wal"

    # ---- plumbing ---------------------------------------------------------------------------------------
    def _refuse_another_file(self, create: bool) -> None:
        """Refuse, through a connection that cannot write, a file that is not a study's database (another program's
        SQLite file, an empty file where a study was expected, not SQLite at all): opening it read-write would switch
        it to WAL mode, changing its header, before :meth:`_init_schema` says it is not ours."""
        if not self.path.exists() or (create and self.path.stat().st_size == 0):
            return
        probe = None
        try:
            probe = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
            version = probe.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in probe.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as e:
            raise _DamagedDatabase(f"'{self.path}' is not a ropekit study database ({e})",
                               "pass a study directory or its study.sqlite") from None
        finally:
            if probe is not None:
                probe.close()
        if version == 0 and tables:
            raise RopekitError(f"'{self.path}' is an SQLite file but not a ropekit study", "pass a study directory")
        if version == 0 and not create:
            raise RopekitError(f"'{self.path}' is an empty database", "run `ropekit study` first")

    def _connect_read_only(self, timeout: float) -> sqlite3.Connection:
        """A connection that never writes: ``immutable=1`` (https://sqlite.org/uri.html) reads the file without
        the locks and shared-memory index a read-only place cannot hold. It ignores a write-ahead log, so a
        database whose log still holds committed pages is refused rather than read without them."""
        log = self.path.with_name(self.path.name + "-wal")
        if log.exists() and log.stat().st_size > 0:
            raise RopekitError(f"'{self.path}' sits in a read-only place with writes still in its log '{log.name}'",
                               "copy the study directory somewhere writable and pass that copy")
        return sqlite3.connect(f"{self.path.resolve().as_uri()}?immutable=1", uri=True, timeout=timeout,
                               isolation_level=None)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction holding the database's write lock from its first statement (read only: one
        read transaction; a write in it fails as SQLite's "attempt to write a readonly database")."""
        self._conn.execute("BEGIN" if self.read_only else "BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _init_schema(self, create: bool) -> None:
        with self._write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if version == 0:
                if tables:
                    raise RopekitError(f"'{self.path}' is an SQLite file but not a ropekit study", "pass a study directory")
                if not create:
                    raise RopekitError(f"'{self.path}' is an empty database", "run `ropekit study` first")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                stamp = now_iso()
                db.execute("INSERT INTO manifest (key, value) VALUES ('created', ?), ('updated', ?)", (_dumps(stamp), _dumps(stamp)))
                db.execute("INSERT INTO manifest (key, value) VALUES ('schema_version', ?)", (_dumps(SCHEMA_VERSION),))
            elif version > SCHEMA_VERSION:
                raise RopekitError(
                    f"'{self.path}' has study schema version {version}, newer than this ropekit's {SCHEMA_VERSION}",
                    "upgrade ropekit to read it",
                )
            elif not _TABLES <= tables:
                raise RopekitError(f"'{self.path}' lacks tables {sorted(_TABLES - tables)}", "the file is damaged; start a new study directory")

    @staticmethod
    def _touch(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO manifest (key, value) VALUES ('updated', ?) "
                   "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (_dumps(now_iso()),))

    # ---- manifest ---------------------------------------------------------------------------------------
    @classmethod
    def _put(cls, db: sqlite3.Connection, values: Mapping[str, Any]) -> None:
        for key, value in values.items():
            db.execute("INSERT INTO manifest (key, value) VALUES (?, ?) "
                       "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (str(key), _dumps(value)))
        cls._touch(db)

    def set_manifest(self, items: Mapping[str, Any] | None = None, **more: Any) -> None:
        """Store each key → JSON-serialisable value (replacing earlier values) and stamp ``updated``."""
        with self._write() as db:
            self._put(db, {**(items or {}), **more})

    def get_manifest(self, key: str | None = None, default: Any = None) -> Any:
        """The whole manifest as a dict (the pieces' placements aside: :meth:`placements`), or one key's value
        (``default`` when absent)."""
        if key is not None:
            row = self._conn.execute("SELECT value FROM manifest WHERE key = ?", (key,)).fetchone()
            return json.loads(row[0]) if row else default
        return {r["key"]: json.loads(r["value"]) for r in self._conn.execute(
            "SELECT key, value FROM manifest WHERE key NOT LIKE ? ORDER BY key", (PLACEMENT_KEY + "%",))}

    def sample_placements(self) -> dict[str, list[tuple[dict[str, Any] | None, int]]]:
        """Piece id → ``[(placement or None, samples)]``: where its samples were computed, by their
        ``computed_on`` field (samples written before ropekit kept it have None)."""
        counts: dict[tuple[str, str | None], int] = {}
        # SQLite's JSON functions refuse the NaN/Infinity Python writes for a diverged value: those records are read here
        rows = self._conn.execute("SELECT piece, json_extract(record, '$.computed_on') AS at, COUNT(*) AS n "
                                  "FROM samples WHERE json_valid(record) GROUP BY piece, at")
        for r in rows:
            counts[(r["piece"], r["at"])] = counts.get((r["piece"], r["at"]), 0) + r["n"]
        for r in self._conn.execute("SELECT piece, record FROM samples WHERE NOT json_valid(record)"):
            at = json.loads(r["record"]).get("computed_on")
            key = (r["piece"], json.dumps(at, separators=(",", ":")) if at else None)
            counts[key] = counts.get(key, 0) + 1
        out: dict[str, list[tuple[dict[str, Any] | None, int]]] = {}
        for (piece, at), n in sorted(counts.items(), key=lambda item: (item[0][0], item[0][1] or "")):
            out.setdefault(piece, []).append((json.loads(at) if at else None, n))
        return out

    def placements(self) -> dict[str, dict[str, Any]]:
        """Piece id → where it computed, for every piece that recorded it (:meth:`finish_piece`'s ``placement``;
        pieces finished before ropekit recorded placements have none)."""
        rows = self._conn.execute("SELECT key, value FROM manifest WHERE key LIKE ?", (PLACEMENT_KEY + "%",))
        return {r["key"][len(PLACEMENT_KEY):]: json.loads(r["value"]) for r in rows}

    def _recorded_variants(self) -> dict[str, Any]:
        """:data:`VARIANTS_KEY`; a study begun before ropekit kept it knows the variants of its last config alone."""
        recorded = self.get_manifest(VARIANTS_KEY)
        if recorded is None:
            recorded = _variants_of(self.get_manifest("config") or {})
        return dict(recorded)

    def check_config(self, config: Mapping[str, Any], pieces: Iterable[Piece] = ()) -> None:
        """Refuse, in one line, a config whose protocol differs from the one this study was started with
        (:meth:`initialize`'s rule), or a piece of ``pieces`` (the config's plan) registered here with another
        spec; nothing is written."""
        config = json.loads(_dumps(dict(config)))
        old = self.get_manifest("config")
        if old is not None and old != config:
            found = _protocol_difference(old, config, self._recorded_variants())
            if found:
                redefined = found.startswith("variant '")
                raise RopekitError(
                    f"study '{self.path.parent}' was started with another configuration: {found}",
                    ("give the redefined variant a new label, " if redefined else "")
                    + "use a new study directory, or resume with the same configuration",
                )
        for piece in pieces:
            self._check_piece(self._conn, piece)

    def initialize(self, name: str, config: Mapping[str, Any], *, seeds: Any = None, replace: bool = False,
                   pieces: Iterable[Piece] = (), **extra: Any) -> None:
        """Record a study's identity — name, config, seeds, package versions and the machine (plus ``extra``
        keys such as ``model``, ``window``, ``target_length``, ``methods``) — and register ``pieces`` (its plan),
        in one transaction: a refused config or piece leaves the file as it was, so the study still resumes
        with the config it was started with.

        Re-opening a study with a different config would mix results of two protocols in one file, so it
        is refused unless ``replace`` — except a config that only adds or drops variants (every variant in both
        defined the same, everything else equal): the protocol is the same, so a method joins an existing
        comparison without the others being measured again, and a dropped variant's pieces stay in the file,
        outside the study's plan. Since they stay, a dropped label keeps its definition (:data:`VARIANTS_KEY`):
        brought back changed it is refused, brought back as it was it finds its results. A variant's ``note``
        documents it and may change (:data:`VARIANT_DOCUMENTATION`). ``replace`` starts the record of variant
        definitions over from ``config``.
        """
        config = json.loads(_dumps(dict(config)))
        pieces = list(pieces)
        # gathered before the write lock: describing the machine imports torch
        values = {"name": name, "config": config, "seeds": seeds, "versions": package_versions(),
                  "machine": machine_description(), **extra}
        with self._write() as db:
            if replace:
                recorded = {}
            else:
                self.check_config(config)
                recorded = self._recorded_variants()
            for piece in pieces:
                self._register(db, piece)
            recorded.update(_variants_of(config))
            self._put(db, {**values, VARIANTS_KEY: recorded})

    # ---- pieces -----------------------------------------------------------------------------------------
    @staticmethod
    def _check_piece(db: sqlite3.Connection, piece: Piece) -> bool:
        """Whether ``piece`` is registered; a piece registered with another spec is refused in one line."""
        if piece.kind not in KINDS:
            raise RopekitError(f"piece '{piece.id}' has kind '{piece.kind}'", f"use one of: {', '.join(KINDS)}")
        params = _dumps(piece.params or {})
        row = db.execute("SELECT kind, method, params, task FROM pieces WHERE id = ?", (piece.id,)).fetchone()
        if row is None:
            return False
        if (row["kind"], row["method"], row["params"], row["task"]) != (piece.kind, piece.method, params, piece.task):
            raise RopekitError(
                f"piece '{piece.id}' is already in the study as {row['kind']} {row['method']} {row['params']} {row['task']}",
                "keep each piece's method, params and task fixed, or start a new study directory",
            )
        return True

    def _register(self, db: sqlite3.Connection, piece: Piece) -> None:
        if not self._check_piece(db, piece):
            db.execute("INSERT INTO pieces (id, kind, method, params, task, created) VALUES (?, ?, ?, ?, ?, ?)",
                       (piece.id, piece.kind, piece.method, _dumps(piece.params or {}), piece.task, now_iso()))

    @staticmethod
    def _as_piece(piece: str | Piece, kind=None, method=None, params=None, task=None) -> Piece:
        if isinstance(piece, Piece):
            return piece
        parsed = parse_piece_id(piece) if kind is None else Piece(piece, kind)
        return Piece(
            piece,
            kind or parsed.kind,
            method if method is not None else parsed.method,
            dict(params or {}),
            task if task is not None else parsed.task,
        )

    def register(self, piece: str | Piece, *, kind: str | None = None, method: str | None = None,
                 params: Mapping[str, Any] | None = None, task: str | None = None) -> Piece:
        """Add a piece as pending (no-op when it exists with the same spec; an error when it differs)."""
        spec = self._as_piece(piece, kind, method, params, task)
        with self._write() as db:
            self._register(db, spec)
        return spec

    def pending(self, pieces: Iterable[str | Piece]) -> list[str]:
        """The ids among ``pieces`` that are not done, in the given order; :class:`Piece` specs are registered."""
        pieces = list(pieces)
        ids = [p.id if isinstance(p, Piece) else p for p in pieces]
        with self._write() as db:
            for spec in pieces:
                if isinstance(spec, Piece):
                    self._register(db, spec)
        done = {r[0] for r in self._conn.execute("SELECT id FROM pieces WHERE status = 'done'")}
        return [i for i in ids if i not in done]

    def begin_piece(self, piece: str | Piece, *, kind: str | None = None, method: str | None = None,
                    params: Mapping[str, Any] | None = None, task: str | None = None,
                    worker: str | None = None, force: bool = False) -> bool:
        """Claim a piece for this worker and mark it running; True when claimed.

        Not claimed (False): the piece is done, or another live worker is running it (a running piece whose
        worker process on this host has exited is reclaimed; ``force`` reclaims any running piece).
        Registers the piece first when it is new (fields from the arguments or the id, :func:`parse_piece_id`).
        """
        bare = isinstance(piece, str) and kind is None and method is None and params is None and task is None
        spec = self._as_piece(piece, kind, method, params, task)
        worker = worker or _this_worker()
        with self._write() as db:
            row = db.execute("SELECT status, worker, started FROM pieces WHERE id = ?", (spec.id,)).fetchone()
            if row is None or not bare:  # a bare id of a known piece refers to it as registered
                self._register(db, spec)
                row = db.execute("SELECT status, worker, started FROM pieces WHERE id = ?", (spec.id,)).fetchone()
            if row["status"] == "done":
                return False
            if (row["status"] == "running" and not force and row["worker"] != worker
                    and _worker_alive(row["worker"], row["started"], one_machine=self._one_machine)):
                return False
            db.execute("UPDATE pieces SET status = 'running', started = ?, finished = NULL, seconds = NULL, error = NULL, "
                       "worker = ?, attempts = attempts + 1 WHERE id = ?", (now_iso(), worker, spec.id))
            self._touch(db)
        return True

    def _piece_row(self, db: sqlite3.Connection, piece: str) -> sqlite3.Row:
        row = db.execute("SELECT * FROM pieces WHERE id = ?", (piece,)).fetchone()
        if row is None:
            raise RopekitError(f"piece '{piece}' is not in the study", "call begin_piece first")
        return row

    def finish_piece(self, piece: str, samples: Iterable[Mapping[str, Any]] = (), metrics: Iterable[Mapping[str, Any]] = (),
                     artifacts: Mapping[str, str | Path] | None = None, *, key_fields: Iterable[str] | None = None,
                     seconds: float | None = None, placement: Mapping[str, Any] | None = None) -> int:
        """Write ``samples``, ``metrics``, ``artifacts`` and ``placement`` (where the piece computed) and mark the
        piece done, all in one transaction.

        ``seconds`` defaults to the time since :meth:`begin_piece`. Returns the number of samples written.
        """
        with self._write() as db:
            row = self._piece_row(db, piece)
            n = self._insert_samples(db, row, samples, key_fields)
            self._insert_metrics(db, piece, metrics)
            for name, path in (artifacts or {}).items():
                self._insert_artifact(db, piece, name, path)
            if placement is not None:
                db.execute("INSERT INTO manifest (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET "
                           "value = excluded.value", (PLACEMENT_KEY + piece, _dumps(dict(placement))))
            finished = now_iso()
            took = seconds if seconds is not None else _seconds_between(row["started"], finished)
            db.execute("UPDATE pieces SET status = 'done', finished = ?, seconds = ?, error = NULL WHERE id = ?",
                       (finished, took, piece))
            self._touch(db)
        return n

    def fail_piece(self, piece: str, error: BaseException | str) -> None:
        """Mark a piece failed with its error (one line kept per exception); samples already added stay."""
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        with self._write() as db:
            row = self._piece_row(db, piece)
            finished = now_iso()
            db.execute("UPDATE pieces SET status = 'failed', finished = ?, seconds = ?, error = ? WHERE id = ?",
                       (finished, _seconds_between(row["started"], finished), text[:4000], piece))
            self._touch(db)

    def release_piece(self, piece: str) -> None:
        """Put a piece this run was stopped in (Ctrl-C) back to pending, its samples kept: nothing is left
        "running" for a worker that is gone, and the next run resumes it."""
        with self._write() as db:
            db.execute("UPDATE pieces SET status = 'pending', started = NULL, worker = NULL "
                       "WHERE id = ? AND status = 'running'", (piece,))
            self._touch(db)

    def abandoned(self) -> list[str]:
        """The running pieces whose worker has ended (:func:`_worker_alive`): the next run takes them over."""
        rows = self._conn.execute("SELECT id, worker, started FROM pieces WHERE status = 'running'").fetchall()
        return [r["id"] for r in rows if not _worker_alive(r["worker"], r["started"], one_machine=self._one_machine)]

    def release_abandoned(self) -> list[str]:
        """:meth:`release_piece` every running piece whose worker has ended (:meth:`abandoned`); returns their ids."""
        gone = self.abandoned()
        for piece in gone:
            self.release_piece(piece)
        return gone

    def reset_piece(self, piece: str) -> None:
        """Forget a piece's results (samples, metrics, artifacts) and set it pending, to run it again."""
        with self._write() as db:
            self._piece_row(db, piece)
            for table in ("samples", "train_metrics", "artifacts"):
                db.execute(f"DELETE FROM {table} WHERE piece = ?", (piece,))
            db.execute("DELETE FROM manifest WHERE key = ?", (PLACEMENT_KEY + piece,))
            db.execute("UPDATE pieces SET status = 'pending', started = NULL, finished = NULL, seconds = NULL, "
                       "error = NULL, worker = NULL WHERE id = ?", (piece,))
            self._touch(db)

    def is_done(self, piece: str) -> bool:
        row = self._conn.execute("SELECT status FROM pieces WHERE id = ?", (piece,)).fetchone()
        return bool(row) and row[0] == "done"

    def pieces(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every piece as a dict (``params`` decoded), in registration order."""
        sql, args = "SELECT * FROM pieces", ()
        if kind is not None:
            sql, args = sql + " WHERE kind = ?", (kind,)
        out = []
        for r in self._conn.execute(sql + " ORDER BY rowid", args):
            d = dict(r)
            d["params"] = json.loads(d["params"])
            out.append(d)
        return out

    def status(self, only: Iterable[str] | None = None) -> dict[str, Any]:
        """Counts for ``ropekit study status``: pieces per status and per kind × status, the failed pieces
        with their errors, the running ones with their workers, stored samples and compute seconds. ``only``:
        count these pieces alone (the study's plan, without the pieces of variants it dropped)."""
        keep = None if only is None else set(only)
        rows = [r for r in self._conn.execute("SELECT id, kind, status, error, worker, started, seconds FROM pieces "
                                              "ORDER BY rowid") if keep is None or r["id"] in keep]
        by_status = dict.fromkeys(STATUSES, 0)
        by_kind: dict[str, dict[str, int]] = {}
        for r in rows:
            by_status[r["status"]] += 1
            by_kind.setdefault(r["kind"], dict.fromkeys(STATUSES, 0))[r["status"]] += 1
        failed = [{"piece": r["id"], "error": r["error"]} for r in rows if r["status"] == "failed"]
        running = [{"piece": r["id"], "worker": r["worker"], "started": r["started"]} for r in rows if r["status"] == "running"]
        seconds = sum(r["seconds"] or 0 for r in rows if r["status"] == "done")
        return {
            "pieces": sum(by_status.values()),
            "by_status": by_status,
            "by_kind": by_kind,
            "failed": failed,
            "running": running,
            "samples": self._conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0],
            "train_steps": self._conn.execute("SELECT COUNT(*) FROM train_metrics").fetchone()[0],
            "seconds": float(seconds),
        }

    def stored_by_piece(self) -> dict[str, dict[str, int]]:
        """What each piece has stored so far, ``{piece: {"samples": n, "train_steps": n}}``: a running piece's
        finished samples (or training steps) survive a crash. Scans every sample: for ``ropekit study status``,
        not for :meth:`status`, which the study polls every second."""
        samples = dict(self._conn.execute("SELECT piece, COUNT(*) FROM samples GROUP BY piece").fetchall())
        steps = dict(self._conn.execute("SELECT piece, COUNT(*) FROM train_metrics GROUP BY piece").fetchall())
        return {piece: {"samples": samples.get(piece, 0), "train_steps": steps.get(piece, 0)}
                for (piece,) in self._conn.execute("SELECT id FROM pieces ORDER BY rowid")}

    # ---- samples ----------------------------------------------------------------------------------------
    def _insert_samples(self, db: sqlite3.Connection, piece_row: sqlite3.Row, records: Iterable[Mapping[str, Any]],
                        key_fields: Iterable[str] | None) -> int:
        fields_by_task: dict[str, tuple[str, ...]] = {}
        fixed = tuple(key_fields) if key_fields is not None else None
        n = 0
        for record in records:
            task = record.get("task") or piece_row["task"]
            if not task:
                raise RopekitError(f"a record for piece '{piece_row['id']}' has no task", "write records with a 'task' field")
            if piece_row["task"] and task != piece_row["task"]:
                raise RopekitError(f"a '{task}' record was given to piece '{piece_row['id']}' of task '{piece_row['task']}'",
                                   "store each task's records under its own piece")
            method = piece_row["method"] or record.get("method")
            if not method:
                raise RopekitError(f"a record for piece '{piece_row['id']}' names no method", "write records with a 'method' field")
            if fixed is None and task not in fields_by_task:
                fields_by_task[task] = key_fields_for(task)
            key = sample_key(record, fixed if fixed is not None else fields_by_task[task])
            length = record.get("length")
            db.execute(
                "INSERT INTO samples (piece, task, method, params, length, sample_key, score, record) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (piece, sample_key) DO UPDATE SET "
                "task = excluded.task, method = excluded.method, params = excluded.params, length = excluded.length, "
                "score = excluded.score, record = excluded.record",
                (piece_row["id"], task, method, _dumps(record.get("params") or {}),
                 int(length) if length is not None else None, key, _check_score(record), _dumps(dict(record))),
            )
            n += 1
        return n

    def add_samples(self, piece: str, records: Iterable[Mapping[str, Any]], *, key_fields: Iterable[str] | None = None) -> int:
        """Store finished samples of a running piece in one transaction; a sample already stored under the same
        key is replaced, never duplicated. Returns how many records were written."""
        with self._write() as db:
            n = self._insert_samples(db, self._piece_row(db, piece), records, key_fields)
            self._touch(db)
        return n

    def done_keys(self, piece: str) -> set[str]:
        """The sample keys (:func:`sample_key` JSON) already stored for ``piece``."""
        return {r[0] for r in self._conn.execute("SELECT sample_key FROM samples WHERE piece = ?", (piece,))}

    def samples(self, task: str | None = None, method: str | None = None, *, piece: str | None = None,
                raw: bool = False) -> list[dict[str, Any]]:
        """Stored records (oldest first), filtered by task, method label and/or piece.

        Each record's ``method`` is the study's label (``eval_method`` keeps the record's own when it
        differs) unless ``raw``, which returns records exactly as they were written.
        """
        clauses, args = [], []
        for column, value in (("task", task), ("method", method), ("piece", piece)):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        sql = "SELECT method, record FROM samples" + (" WHERE " + " AND ".join(clauses) if clauses else "") + " ORDER BY id"
        out = []
        for label, text in self._conn.execute(sql, args):
            record = json.loads(text)
            if not raw and record.get("method") != label:
                record["eval_method"] = record.get("method")
                record["method"] = label
            out.append(record)
        return out

    # ---- training metrics and artifacts -----------------------------------------------------------------
    @staticmethod
    def _insert_metrics(db: sqlite3.Connection, piece: str, metrics: Iterable[Mapping[str, Any]]) -> None:
        for m in metrics:
            step = m.get("step")
            if isinstance(step, bool) or not isinstance(step, int):
                raise RopekitError(f"a training metric of '{piece}' has step {step!r}", "log metrics with an integer 'step'")

            def num(name, m=m):
                v = m.get(name)
                return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

            tokens = m.get("tokens")
            db.execute(
                "INSERT INTO train_metrics (piece, step, loss, lr, tokens, seconds, record) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (piece, step) DO UPDATE SET loss = excluded.loss, lr = excluded.lr, tokens = excluded.tokens, "
                "seconds = excluded.seconds, record = excluded.record",
                (piece, step, num("loss"), num("lr"), int(tokens) if isinstance(tokens, int) else None, num("seconds"),
                 _dumps(dict(m))),
            )

    def add_metrics(self, piece: str, metrics: Iterable[Mapping[str, Any]]) -> None:
        """Store logged training steps (each a dict with ``step``, usually ``loss`` and ``lr``) in one transaction."""
        with self._write() as db:
            self._piece_row(db, piece)
            self._insert_metrics(db, piece, metrics)
            self._touch(db)

    def train_metrics(self, piece: str | None = None) -> list[dict[str, Any]]:
        """Logged training steps (each record plus ``piece`` and the piece's ``method`` label), by piece and step."""
        sql = ("SELECT m.piece, p.method, m.record FROM train_metrics m JOIN pieces p ON p.id = m.piece"
               + (" WHERE m.piece = ?" if piece else "") + " ORDER BY p.rowid, m.step")
        return [{**json.loads(r["record"]), "piece": r["piece"], "method": r["method"]}
                for r in self._conn.execute(sql, (piece,) if piece else ())]

    @staticmethod
    def _insert_artifact(db: sqlite3.Connection, piece: str, name: str, path: str | Path) -> None:
        db.execute("INSERT INTO artifacts (piece, name, path, created) VALUES (?, ?, ?, ?) "
                   "ON CONFLICT (piece, name) DO UPDATE SET path = excluded.path, created = excluded.created",
                   (piece, str(name), str(path), now_iso()))

    def add_artifact(self, piece: str, name: str, path: str | Path) -> None:
        """Record a file or directory a piece produced (a checkpoint, a plot), by name."""
        with self._write() as db:
            self._piece_row(db, piece)
            self._insert_artifact(db, piece, name, path)

    def artifacts(self, piece: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT piece, name, path, created FROM artifacts" + (" WHERE piece = ?" if piece else "") + " ORDER BY piece, name"
        return [dict(r) for r in self._conn.execute(sql, (piece,) if piece else ())]


class StoreRecordWriter(RecordWriter):
    """A :class:`~ropekit.eval.records.RecordWriter` that writes each record into a study piece.

    Give it to an :class:`~ropekit.eval.common.EvalContext` (``ctx.writer``) and an evaluation task streams
    its samples into the store, one transaction per sample; on a re-run the samples already stored are
    known (``has``) and skipped, as with ``--resume``.
    """

    def __init__(self, store: StudyStore, piece: str, key_fields: Iterable[str]):
        super().__init__(None, resume=False, key_fields=tuple(key_fields))
        self.store = store
        self.piece = piece
        for record in store.samples(piece=piece, raw=True):
            self.done[self.key(record)] = record

    def write(self, record: dict[str, Any]) -> None:
        self.store.add_samples(self.piece, [record], key_fields=self.key_fields)
        self.done[self.key(record)] = record


def open_study(study_dir: str | Path, *, create: bool = False) -> StudyStore:
    """The store of the study in ``study_dir`` (its ``study.sqlite``)."""
    return StudyStore(Path(study_dir) / DB_NAME, create=create)
