"""The study on Ray: every piece a Ray task, the driver the only writer of the results store.

``ropekit study CONFIG --backend ray [--address auto|HOST:PORT]`` connects to a Ray cluster (or starts a local
one) and runs the pieces of :func:`ropekit.study.pieces.plan` as tasks with the resources the config asks for
(``resources: {train: {gpus: 8}, eval: {gpus: 1}}``; CPUs default to one per task). Order and semantics are the
local backend's:

* the driver claims a piece in the store (:meth:`StudyStore.begin_piece`, as worker ``host@boot:pid`` of the
  driver) only when its prerequisites are done, submits it, and commits what the task returns — metrics and
  artifacts, and an evaluation's last samples in the same transaction that marks it done — so no worker ever
  opens the SQLite file (it may sit on the driver's local disk; a network file system is never written by two
  hosts);
* an evaluation streams each sample it scores to a :class:`SampleInbox` actor of the driver while it runs, and
  the driver commits them (:meth:`StudyStore.add_samples`) as it waits, as the local backend's writer does: a
  driver killed, or a worker that dies, mid-piece loses none of the samples it had committed;
* a task receives what it may read of the store — the artifacts of finished pieces and the samples an
  interrupted evaluation already scored (skipped, as with ``--resume``); a retried task also gets, from the
  inbox, the samples its killed attempts streamed, so it scores none of them again;
* a task whose worker dies is retried by Ray (``max_retries``); a piece that raises is marked failed with its
  one-line error (the samples it streamed stay) and the study goes on without what depends on it;
* a driver killed mid-study leaves its claimed pieces "running" under a dead ``host@boot:pid``: the next run
  reclaims and re-runs them, and never re-runs a finished one.

Checkpoints and trained models are written under the study directory by the tasks, so on a multi-node
cluster that directory must be on storage every node sees (the SQLite file stays the driver's alone).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..errors import RopekitError
from ..eval.records import RecordWriter
from .config import StudyConfig, parse_study
from .pieces import PlannedPiece, blocked, execute_piece, piece_error, piece_seconds, select_pieces
from .store import StudyStore, key_fields_for

#: Ray retries a task this many times when its worker process dies.
MAX_RETRIES = 3
#: The longest a task holds scored samples before it sends them to the driver (one sample sends at once when
#: scoring it took longer: what a killed run can lose is bounded by this, not by the piece's length).
STREAM_SECONDS = 0.5
#: How often, at most, the driver waits before committing what the inbox holds.
DRAIN_SECONDS = 0.5


class SampleInbox:
    """A Ray actor of the driver: the samples evaluation tasks stream while they run, kept per piece.

    ``push`` adds a batch; ``drain`` hands the driver what it has not committed yet; ``streamed`` gives a retried
    task everything its earlier attempts pushed (committed or not), so it skips them; ``close`` forgets a piece
    the driver finished (a push that arrives later is dropped: the task's return value carried it).
    """

    def __init__(self):
        self._all: dict[str, list[dict[str, Any]]] = {}
        self._new: dict[str, list[dict[str, Any]]] = {}
        self._closed: set[str] = set()

    def push(self, piece: str, records: list[dict[str, Any]]) -> None:
        if piece in self._closed or not records:
            return
        self._all.setdefault(piece, []).extend(records)
        self._new.setdefault(piece, []).extend(records)

    def drain(self) -> dict[str, list[dict[str, Any]]]:
        new, self._new = self._new, {}
        return new

    def streamed(self, piece: str) -> list[dict[str, Any]]:
        return list(self._all.get(piece, ()))

    def close(self, piece: str) -> None:
        self._closed.add(piece)
        self._all.pop(piece, None)
        self._new.pop(piece, None)


class ArtifactView:
    """The part of the store a task reads: ``artifacts(piece)`` of the pieces finished before it was submitted."""

    def __init__(self, artifacts: list[dict[str, Any]]):
        self._rows = list(artifacts)

    def artifacts(self, piece: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self._rows if piece is None or r["piece"] == piece]


class CollectingWriter(RecordWriter):
    """An evaluation's record writer inside a task: knows the samples already stored, keeps the new ones and,
    given an ``inbox`` (a :class:`SampleInbox` handle), streams them to the driver as they are scored."""

    def __init__(self, done: list[dict[str, Any]], key_fields, inbox=None, piece: str | None = None):
        super().__init__(None, resume=False, key_fields=tuple(key_fields))
        for record in done:
            self.done[self.key(record)] = record
        self.new: list[dict[str, Any]] = []
        self.inbox, self.piece = inbox, piece
        self._unsent: list[dict[str, Any]] = []
        self._sent_at = time.monotonic()

    def write(self, record: dict[str, Any]) -> None:
        super().write(record)
        self.new.append(record)
        if self.inbox is not None:
            self._unsent.append(record)
            if time.monotonic() - self._sent_at >= STREAM_SECONDS:
                self.flush()

    def flush(self) -> None:
        """Send the samples not sent yet to the driver's inbox (fire and forget: the return value has them all)."""
        self._sent_at = time.monotonic()
        if self.inbox is None or not self._unsent:
            return
        batch, self._unsent = self._unsent, []
        try:
            self.inbox.push.remote(self.piece, batch)
        except Exception:  # noqa: BLE001 - an inbox gone: the samples still come back with the task's result
            self.inbox = None


def _streamed_before(inbox, piece: str) -> list[dict[str, Any]]:
    """The samples earlier attempts of this task streamed (a retry after a worker died); none without an inbox."""
    if inbox is None:
        return []
    import ray

    try:
        return ray.get(inbox.streamed.remote(piece), timeout=60)
    except Exception:  # noqa: BLE001 - an inbox gone: recompute them, the driver's upsert keeps one row each
        return []


def run_remote_piece(config_dict: dict[str, Any], study_dir: str, piece: PlannedPiece, artifacts: list[dict[str, Any]],
                     done_samples: list[dict[str, Any]], threads: int, inbox=None) -> dict[str, Any]:
    """The body of one Ray task: compute ``piece`` and return ``{"out", "samples", "error", "seconds"}``;
    an evaluation also streams its samples to ``inbox`` (:class:`SampleInbox`) as it scores them."""
    from ..runtime import quiet_transformers, torch_threads

    started = time.perf_counter()
    config = parse_study(config_dict)
    writer = None
    if piece.kind == "eval":
        writer = CollectingWriter([*done_samples, *_streamed_before(inbox, piece.id)],
                                  key_fields_for(config.eval_task(piece.task)), inbox=inbox, piece=piece.id)
    try:
        with quiet_transformers(), torch_threads(threads):
            out = execute_piece(config, ArtifactView(artifacts), piece, Path(study_dir), threads=threads, writer=writer)
        error = None
    except Exception as err:  # noqa: BLE001 - returned to the driver, which records it on the piece
        out, error = {}, piece_error(err)
        error = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    if writer is not None:
        writer.flush()
    return {"out": out, "samples": writer.new if writer else [], "error": error, "seconds": piece_seconds(out, started)}


def _resources(config: StudyConfig, kind: str) -> dict[str, float]:
    """``num_cpus``/``num_gpus`` of a piece kind from the config's ``resources`` (one CPU by default)."""
    wanted = dict((getattr(config, "resources", None) or {}).get(kind) or {})
    return {"num_cpus": float(wanted.get("cpus", 1)), "num_gpus": float(wanted.get("gpus", 0))}


def _check_feasible(ray, config: StudyConfig, kinds: set[str]) -> None:
    """Refuse a piece kind no node of the cluster can hold: Ray would queue its tasks forever."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    for kind in sorted(kinds):
        wanted = _resources(config, kind)
        for key, unit in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
            most = max((node.get(unit, 0.0) for node in nodes), default=0.0)
            if wanted[key] > most:
                raise RopekitError(
                    f"resources.{kind} asks for {wanted[key]:g} {unit}s per piece, but the largest node of the Ray "
                    f"cluster has {most:g}", f"lower resources.{kind}.{unit.lower()}s, or add such nodes to the "
                    "cluster before starting the study (an autoscaler's nodes count once they are up)")


def require_ray():
    try:
        import ray
    except ImportError:
        raise RopekitError("--backend ray needs the ray package, which is not installed",
                           "pip install 'ropekit[ray]' (or use the default --backend local)") from None
    return ray


def run_on_ray(config: StudyConfig, study_dir: Path, store: StudyStore, *, address: str | None = None,
               on_done=None, poll: float = 0.2, only=None) -> None:
    """Run every unfinished piece of ``config`` (of the variants ``only``, when given) as Ray tasks;
    ``on_done(piece_id, status)`` after each commit."""
    ray = require_ray()
    started_here = False
    if not ray.is_initialized():
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError) as err:
            raise RopekitError(f"could not reach a Ray cluster at '{address}': {str(err).splitlines()[0]}",
                               "start one (`ray start --head`) or pass --address auto / HOST:PORT of a running head") from None
        started_here = True
    remote = ray.remote(max_retries=MAX_RETRIES)(run_remote_piece)
    pieces = select_pieces(config, only)
    try:
        _check_feasible(ray, config, {p.kind for p in pieces})
    except RopekitError:
        if started_here:
            ray.shutdown()
        raise
    by_id = {p.id: p for p in pieces}
    config_dict = config.as_dict(placement=True)
    in_flight: dict[Any, PlannedPiece] = {}
    failed_now: set[str] = set()
    inbox = ray.remote(num_cpus=0, max_restarts=0)(SampleInbox).remote() if any(p.kind == "eval" for p in pieces) else None

    def commit_streamed() -> None:
        """Commit what evaluations streamed since the last call (the driver stays the store's only writer)."""
        nonlocal inbox
        if inbox is None:
            return
        try:
            streamed = ray.get(inbox.drain.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - the inbox died: tasks' return values still carry every sample
            inbox = None
            return
        running = {p.id: p for p in in_flight.values()}
        for piece_id, records in streamed.items():
            if piece_id in running:
                store.add_samples(piece_id, records, key_fields=key_fields_for(config.eval_task(running[piece_id].task)))

    def close_streamed(piece_id: str) -> None:
        if inbox is not None:
            inbox.close.remote(piece_id)

    try:
        while True:
            status = {p["id"]: p["status"] for p in store.pieces()}
            submitted = {p.id for p in in_flight.values()}
            for p in pieces:
                if p.id in submitted or p.id in failed_now or status.get(p.id) == "done":
                    continue
                if blocked(p, status, by_id, failed_now) or not all(status.get(n) == "done" for n in p.needs):
                    continue
                if not store.begin_piece(p.id, kind=p.kind, method=p.label, params=p.params, task=p.task):
                    continue
                done = store.samples(piece=p.id, raw=True) if p.kind == "eval" else []
                resources = _resources(config, p.kind)
                threads = max(1, int(resources["num_cpus"]))
                ref = remote.options(**resources).remote(config_dict, str(study_dir), p, store.artifacts(), done, threads,
                                                         inbox if p.kind == "eval" else None)
                in_flight[ref] = p
            if not in_flight:
                left = [p for p in pieces if status.get(p.id) != "done" and p.id not in failed_now]
                if all(blocked(p, status, by_id, failed_now) for p in left):
                    return  # done, or only pieces behind a failure of this run are left
                time.sleep(poll)  # a piece claimed by another live worker: wait for it
                continue
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=DRAIN_SECONDS if inbox is not None else None)
            commit_streamed()  # before a ready piece is finished or failed: what it streamed is committed first
            for ref in ready:
                piece = in_flight.pop(ref)
                close_streamed(piece.id)
                try:
                    result = ray.get(ref)
                except Exception as err:  # noqa: BLE001 - the task died past its retries
                    result = {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
                if result.get("error"):
                    if result.get("samples"):  # what it scored before it raised stays, as with the local backend
                        store.add_samples(piece.id, result["samples"], key_fields=key_fields_for(config.eval_task(piece.task)))
                    store.fail_piece(piece.id, result["error"])
                    failed_now.add(piece.id)
                    if on_done:
                        on_done(piece.id, "failed")
                    continue
                out = result["out"]
                store.finish_piece(piece.id, samples=result["samples"], metrics=out.get("metrics", ()),
                                   artifacts=out.get("artifacts"),
                                   key_fields=key_fields_for(config.eval_task(piece.task)) if piece.kind == "eval" else None,
                                   seconds=result["seconds"], placement=out.get("placement"))
                if on_done:
                    on_done(piece.id, "done")
    finally:
        if started_here:
            ray.shutdown()
