"""``ropekit study``: run a controlled comparison piece by piece into the study's SQLite store.

The study (:mod:`ropekit.study.config`) is cut into pieces (:func:`ropekit.study.pieces.plan`, which also
computes each one):

* ``pretrain:base`` — the built-in base model (:func:`ropekit.train.builtin_base.pretrain_base`; cached,
  so a second study reuses it), when the config's model is ``builtin-base``;
* ``train:LABEL`` — each fine-tuned variant trained with the study's one recipe (:mod:`ropekit.train`) into
  ``DIR/runs/LABEL``; it checkpoints as it goes and a restarted piece resumes from its last checkpoint;
* ``eval:TASK:LABEL`` — one evaluation task of one variant; every scored sample is committed to the store
  as it finishes (:class:`~ropekit.study.store.StoreRecordWriter`), so a restarted piece skips them.

A piece runs once its prerequisites are done (an evaluation needs its variant's training, everything needs
the base model). Workers claim pieces through the store (:meth:`StudyStore.begin_piece`): any number of
processes can work on one study, and a piece whose worker died (killed, crashed) is claimed again. A piece
that raises is marked failed with its one-line error and the study goes on with the pieces that do not
depend on it; running the study again retries it. Nothing finished is ever recomputed. With
``backend="ray"`` the same pieces run as Ray tasks and this process is the store's only writer
(:mod:`ropekit.study.ray_backend`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import runtime
from ..errors import RopekitError
from ..install import rope_info
from ..models.loading import load_model
from ..runtime import default_threads, quiet_transformers, torch_threads
from ..runtime.devices import worker_device
from .config import StudyConfig, parse_study, train_config_for
from .pieces import (
    PRETRAIN,
    RUNS_DIR,
    PlannedPiece,
    _variant_order,
    base_model_path,
    blocked,
    execute_piece,
    piece_error,
    piece_seconds,
    placement,
    plan,
    produced_model,
    produced_model_dir,
    require_same_dtype,
    select_pieces,
)
from .ray_backend import require_ray, run_on_ray
from .store import DB_NAME, Piece, StudyStore, open_study

__all__ = ["BACKENDS", "PRETRAIN", "PlannedPiece", "initialize", "plan", "require_eval_data", "require_models",
           "retrain_variants", "run_piece", "run_study", "select_pieces", "work"]

def run_piece(config: StudyConfig, store: StudyStore, piece: PlannedPiece, study_dir: Path, report=lambda n, total: None,
              threads: int | None = None, device: str | None = None) -> None:
    """Run one claimed piece and commit its results; failures are recorded on the piece, never raised.

    ``device`` overrides the study's ``device`` key for evaluations (a worker's own GPU)."""
    started = time.perf_counter()
    try:
        out = execute_piece(config, store, piece, study_dir, report, threads, device)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as err:  # noqa: BLE001 - a failed piece must not take the rest of the study down
        store.fail_piece(piece.id, piece_error(err))
        return
    store.finish_piece(piece.id, metrics=out.get("metrics", ()), artifacts=out.get("artifacts"),
                       seconds=piece_seconds(out, started), placement=out.get("placement"))


# ---- scheduling --------------------------------------------------------------------------------------------
def _statuses(store: StudyStore) -> dict[str, str]:
    return {p["id"]: p["status"] for p in store.pieces()}


def work(study_dir: str | Path, config: StudyConfig, *, report_piece=None, report_progress=None, report_done=None,
         poll: float = 0.5, threads: int | None = None, device: str | None = None, stop=None,
         only: Sequence[str] | None = None) -> None:
    """One worker: claim runnable pieces until none is left (others may still be running pieces).

    ``threads``: CPU threads for every piece; ``None`` chooses them per piece from the machine's load at the
    moment it starts (:func:`~ropekit.runtime.default_threads`), so a momentary load early on does not slow
    the whole study. ``report_done(piece, status, seconds)`` is called after each piece. ``device``: this
    worker's device for evaluations (None: the config's ``device`` key). ``stop``: an event after which no
    further piece is claimed (Ctrl-C in the parent of worker processes). ``only``: :func:`select_pieces`.
    """
    study_dir = Path(study_dir)
    pieces = select_pieces(config, only)
    by_id = {p.id: p for p in pieces}
    failed_now: set[str] = set()  # pieces that failed during this run (retried only by the next run)
    with open_study(study_dir) as store:
        while True:
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            status = _statuses(store)
            runnable, waiting = None, False
            for p in pieces:
                st = status.get(p.id, "pending")
                if st == "done" or p.id in failed_now or blocked(p, status, by_id, failed_now):
                    continue
                if all(status.get(n) == "done" for n in p.needs) and store.begin_piece(
                        p.id, kind=p.kind, method=p.label, params=p.params, task=p.task):
                    runnable = p
                    break
                waiting = True  # running elsewhere, or prerequisites not done yet
            if runnable is None:
                if not waiting:
                    return
                time.sleep(poll)
                continue
            if report_piece:
                report_piece(runnable)
            started = time.perf_counter()
            piece_threads = threads or default_threads()
            try:
                with torch_threads(piece_threads):
                    run_piece(config, store, runnable, study_dir, report=report_progress or (lambda n, total: None),
                              threads=piece_threads, device=device)
            except (KeyboardInterrupt, SystemExit):
                store.release_piece(runnable.id)  # stopped, not failed: the next run resumes it
                raise
            outcome = _statuses(store).get(runnable.id)
            if outcome == "failed":
                failed_now.add(runnable.id)
            if report_done:
                report_done(runnable, outcome, time.perf_counter() - started)


def _exit_with_parent() -> None:
    """End this worker process as soon as the process that started it is gone (killed, or ended by a signal
    that skips its clean-up): an orphaned worker would go on claiming pieces and writing into the study
    directory, beside the workers of the next run. Its piece in progress is claimed again, as after a crash."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="ropekit-parent-watch", daemon=True).start()


def _progress_sender(queue, every: float = 1.0):
    """``(report_piece, report_progress)`` for :func:`work` in a worker process: the running piece's sample (or
    step) count goes to the parent through ``queue`` as ``(piece, n, total)``, at most once every ``every``
    seconds and always at the last one, for the study's display.

    A count held back by that limit is sent by a timer once the second is over: a resumed evaluation skips its
    finished samples in a burst and then computes one sample for minutes, and without the timer the display
    would show the burst's first count (0 of 80) until that sample ends."""
    lock = threading.Lock()
    current: dict[str, Any] = {"id": None, "sent": 0.0, "held": None, "timer": None}

    def send(message) -> None:
        current["sent"] = time.monotonic()
        current["held"] = None
        queue.put_nowait(message)

    def send_held() -> None:
        with lock:
            current["timer"] = None
            if current["held"] is not None:
                send(current["held"])

    def on_piece(piece: PlannedPiece) -> None:
        with lock:
            current["id"], current["sent"], current["held"] = piece.id, 0.0, None

    def on_progress(n: int, total: int | None) -> None:
        with lock:
            if current["id"] is None:
                return
            wait = every - (time.monotonic() - current["sent"])
            if wait <= 0 or n == total:
                send((current["id"], n, total))
                return
            current["held"] = (current["id"], n, total)
            if current["timer"] is None:
                timer = threading.Timer(wait, send_held)
                timer.daemon = True  # a worker that ends does not wait for its display
                current["timer"] = timer
                timer.start()

    return on_piece, on_progress


def _worker_main(study_dir: str, config_dict: dict[str, Any], threads: int, device: str | None = None,
                 dtype: str = "auto", attn: str = "auto", verbosity: int | None = None, stop=None,
                 only: Sequence[str] | None = None, progress=None) -> None:
    # The worker starts with SIGINT ignored (see _start_workers): Ctrl-C during its imports would print a
    # traceback from multiprocessing's bootstrap. From here on it is a KeyboardInterrupt, ended quietly; ``stop``
    # (set by the parent before it passes SIGINT on) covers a Ctrl-C that arrived while it was still ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        from transformers.utils import logging as hf_logging

        _exit_with_parent()
        if verbosity is not None:  # a spawned process starts with transformers' defaults: take the parent's
            hf_logging.set_verbosity(verbosity)
        config = parse_study(config_dict)
        config.dtype, config.attn = dtype, attn  # also when the config dict does not carry them
        on_piece = on_progress = None
        if progress is not None:
            progress.cancel_join_thread()  # a count not yet sent must never hold up the worker's exit
            on_piece, on_progress = _progress_sender(progress)
        with quiet_transformers():
            work(study_dir, config, threads=threads, device=device, stop=stop, only=only, report_piece=on_piece,
                 report_progress=on_progress)
    except KeyboardInterrupt:  # Ctrl-C reaches every worker: the parent reports it, once, without a traceback
        raise SystemExit(130) from None
    finally:
        # the terminal's SIGINT and the one the parent passes on can arrive one after the other: the second must not
        # interrupt the interpreter's shutdown (a KeyboardInterrupt traceback from threading._shutdown)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start_workers(procs) -> None:
    """Start the worker processes with SIGINT ignored, which a spawned interpreter inherits and keeps until
    :func:`_worker_main` restores it (Python installs its KeyboardInterrupt handler only over SIG_DFL)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for proc in procs:
            proc.start()
    finally:
        signal.signal(signal.SIGINT, previous)


def _piece_specs(config: StudyConfig) -> list[Piece]:
    """The plan's pieces as the store registers them (id, kind, variant label, params, task)."""
    return [Piece(p.id, p.kind, p.label, dict(p.params or {}), p.task) for p in plan(config)]


def initialize(study_dir: str | Path, config: StudyConfig) -> StudyStore:
    """Create (or reopen) the study's database, record the manifest and register every piece — in one
    transaction, so a config or a piece the study refuses writes nothing (the study still resumes as it was)."""
    study_dir = Path(study_dir)
    study_dir.mkdir(parents=True, exist_ok=True)
    store = open_study(study_dir, create=True)
    window = config.window
    try:
        # claims go beside the config, not in it: they say how results are judged, so revising them keeps the study
        store.initialize(config.name, config.as_dict(), seeds=config.training_seeds, model=config.model,
                         target_length=config.target_length, methods=_variant_order(config), claims=config.claims,
                         pieces=_piece_specs(config), **({"window": window} if window else {}))
    except BaseException:
        store.close()
        raise
    return store


def require_eval_data(config: StudyConfig, study_dir: Path, only: Sequence[str] | None = None) -> None:
    """Refuse, before anything is written, an evaluation whose ``data:`` path does not exist while a piece of it is
    unfinished: otherwise that piece fails only when its turn comes, perhaps hours into the run (a study continued
    on a fresh checkout, whose data file is not committed). Finished pieces no longer read their data."""
    from ..data.corpora import unreadable_corpus

    missing = {name: (f"which {why}", Path(options["data"]).expanduser()) for name, options in config.evals.items()
               if isinstance(options.get("data"), (str, Path)) and (why := unreadable_corpus(options["data"]))}
    if not missing:
        return
    done = _done_pieces(study_dir)
    for piece in select_pieces(config, only):
        if piece.kind == "eval" and piece.task in missing and piece.id not in done:
            why, path = missing[piece.task]
            raise RopekitError(f"evaluation '{piece.task}' reads '{path}', {why} "
                               f"(relative paths are read from {Path.cwd()})",
                               "write that file first (the study's YAML may say how it was made), or run the study "
                               "from the directory that holds it")


def require_training_data(config: StudyConfig, study_dir: Path, only: Sequence[str] | None = None) -> None:
    """Refuse, before anything is written, a training whose data file does not exist while its piece is unfinished
    (:func:`require_eval_data`'s rule for the recipe and each variant's ``finetune:`` data)."""
    from ..train.data import require_local_sources

    pending = [p for p in select_pieces(config, only) if p.kind == "train" and p.id not in _done_pieces(study_dir)]
    for label in dict.fromkeys(p.label for p in pending):
        variant = config.variant(label)
        require_local_sources(train_config_for(config, variant, "tiny", "unused"), where=f"variant '{label}': ")


def _done_pieces(study_dir: Path) -> set[str]:
    if not (study_dir / DB_NAME).is_file():
        return set()
    store = open_study(study_dir)
    try:
        return {p["id"] for p in store.pieces() if p["status"] == "done"}
    finally:
        store.close()


def _producers(config: StudyConfig, only: Sequence[str] | None = None) -> dict[str, tuple[PlannedPiece, list[PlannedPiece]]]:
    """Each training or search piece of the plan (of the variants ``only``) with the evaluations that read its model."""
    pieces = select_pieces(config, only)
    return {p.id: (p, [e for e in pieces if p.id in e.needs and e.kind == "eval"])
            for p in pieces if p.kind in ("train", "search")}


def _check_retrain(config: StudyConfig, labels: Sequence[str]) -> dict[str, tuple[PlannedPiece, list[PlannedPiece]]]:
    """One line for a ``--retrain`` label that names no fine-tuned or searched variant; the plan's producers."""
    producers = _producers(config)
    known = sorted({piece.label for piece, _ in producers.values()})
    for label in labels:
        if label not in known:
            raise RopekitError(f"--retrain {label}: not a fine-tuned or searched variant of study '{config.name}'",
                               f"choose among: {', '.join(known)}" if known else "this study trains nothing")
    return producers


def require_study_dir(study_dir: Path, own: Sequence[Path] = ()) -> None:
    """Refuse, before anything is written, a non-empty directory that holds no study: the study's database, runs
    and report would be mixed with someone else's files (a study directory is resumed by its ``study.sqlite``).
    ``own``: files the user gave this run (its config) that may lie there."""
    if not study_dir.is_dir() or (study_dir / DB_NAME).is_file():
        return
    given = {p.resolve() for p in own}
    foreign = sorted(p.name for p in study_dir.iterdir() if p.resolve() not in given)
    if foreign:
        shown = ", ".join(foreign[:3]) + (" …" if len(foreign) > 3 else "")
        raise RopekitError(f"'{study_dir}' holds files and no study ({DB_NAME}): {shown}",
                           "pass a new or empty --out directory")


def require_same_config(config: StudyConfig, study_dir: Path) -> None:
    """Refuse, before anything is printed or written, a config that the study in ``study_dir`` was not started with
    (the store's rule: adding or dropping variants is the same protocol, a dropped variant brought back must be
    defined as it was), or whose plan has a piece the study registered with another spec: what
    :func:`initialize` would refuse, refused here first."""
    if not (study_dir / DB_NAME).is_file():
        return
    store = open_study(study_dir)
    try:
        store.check_config(config.as_dict(), _piece_specs(config))
    finally:
        store.close()


def require_models(config: StudyConfig, study_dir: Path, retrain: Sequence[str] = (),
                   only: Sequence[str] | None = None) -> None:
    """Refuse, before anything is written, a study whose finished training or search left a model that is not on
    this machine while evaluations of it are unfinished (a study continued elsewhere from its database alone):
    they would fail one by one when their turn comes. Variants named in ``retrain`` are produced again."""
    _check_retrain(config, retrain)
    producers = _producers(config, only)
    if not (study_dir / DB_NAME).is_file():
        return
    store = open_study(study_dir)
    try:
        status = {p["id"]: p["status"] for p in store.pieces()}
        for producer, (piece, evals) in producers.items():
            unfinished = [e.id for e in evals if status.get(e.id) != "done"]
            if (status.get(producer) != "done" or not unfinished or piece.label in retrain
                    or produced_model(store, study_dir, producer) is not None):
                continue
            recorded = next((a["path"] for a in store.artifacts(producer) if a["name"] == "model"), None)
            finished = len(evals) - len(unfinished)
            redone = {0: "nothing finished is", 1: "its finished evaluation is"}.get(
                finished, f"its {finished} finished evaluations are")
            raise RopekitError(
                f"the model '{producer}' produced ({recorded or 'not recorded'}) is not on this machine, and "
                f"{len(unfinished)} of its {len(evals)} evaluations {'is' if len(unfinished) == 1 else 'are'} unfinished",
                f"copy it to {produced_model_dir(study_dir, producer, recorded and Path(recorded).name)}, or pass "
                f"--retrain {piece.label} to produce it again here ({redone} redone with the new model)")
    finally:
        store.close()


def corpus_warning(config: StudyConfig, study_dir: Path, only: Sequence[str] | None = None) -> str | None:
    """One line when the trainings about to run read the built-in split and finished trainings of this study
    recorded another built-in corpus (:func:`ropekit.study.pieces.trained_corpus`): the split is the running
    Python's standard library, so a study continued on a machine with another Python would train those variants
    on other documents than the rest, and their comparison would mix two data sets. None otherwise (also when
    the finished trainings recorded no corpus: they ran before ropekit kept it)."""
    from ..data.training_data import builtin_corpus_digest, uses_builtin

    if not (study_dir / DB_NAME).is_file():
        return None
    store = open_study(study_dir)
    try:
        status = {p["id"]: p["status"] for p in store.pieces()}
        placements = store.placements()
    finally:
        store.close()
    pending = []
    for piece in select_pieces(config, only):
        if piece.kind != "train" or status.get(piece.id) == "done":
            continue
        cfg = train_config_for(config, config.variant(piece.label), "tiny", "unused", seed=piece.seed)
        if any(uses_builtin(stage.data.spec, stage.data.seq_len) for stage in cfg.stages):
            pending.append(piece.label)
    if not pending:
        return None
    here = builtin_corpus_digest()
    other = {piece: where["corpus"] for piece, where in placements.items()
             if status.get(piece) == "done" and where.get("corpus") and here not in where["corpus"].split(",")}
    if not other:
        return None
    return (f"warning: the built-in training split here (this Python's standard library, corpus {here}) is not the "
            f"one {', '.join(sorted(other))} trained on ({', '.join(sorted(set(other.values())))}): "
            f"{', '.join(dict.fromkeys(pending))} will train on other documents than that; to compare them on the "
            "same data, train every variant with one Python, or give the recipe a data file (data.sources)")


def retrain_variants(config: StudyConfig, study_dir: Path, labels: Sequence[str]) -> list[str]:
    """Produce again the models of the fine-tuned or searched variants ``labels`` whose finished training (or
    search) left no model on this machine: that piece and every evaluation of the variant start over, so that no
    variant's cells mix two trainings. A training's run directory is cleared; a search keeps its stored candidates
    (it reads them back). Idempotent: a model that is here, or a training under way, is left alone, so the same
    command can be run again after an interruption. Returns one line per variant."""
    producers = _check_retrain(config, labels)
    if not labels or not (study_dir / DB_NAME).is_file():
        return []
    store = open_study(study_dir)
    lines = []
    try:
        status = {p["id"]: p["status"] for p in store.pieces()}
        for label in dict.fromkeys(labels):
            reset, samples, kept = [], 0, []
            for producer, (piece, evals) in producers.items():
                if piece.label != label:
                    continue
                if status.get(producer) != "done" or produced_model(store, study_dir, producer) is not None:
                    kept.append(producer)
                    continue
                if piece.kind == "train":
                    shutil.rmtree(study_dir / RUNS_DIR / producer.partition(":")[2], ignore_errors=True)
                for p in [piece, *evals]:
                    if p.id in status:
                        samples += len(store.samples(piece=p.id, raw=True))
                        store.reset_piece(p.id)
                        reset.append(p.id)
            if reset:
                lines.append(f"retrain {label}: {', '.join(reset)} start again"
                             + (f" ({samples} samples forgotten)" if samples else ""))
            else:
                lines.append(f"retrain {label}: nothing to redo ({', '.join(kept)}: its model is on this machine, "
                             "or it is not finished yet)")
    finally:
        store.close()
    return lines


def _record_window(config: StudyConfig, store: StudyStore) -> None:
    """The base model's pretrained window, for the report's dashed lines (known once the base model exists)."""
    if store.get_manifest("window") is not None:
        return
    path = base_model_path(config, store)
    try:
        info = rope_info(load_model(path).model)
        store.set_manifest(window=info.window)
    except RopekitError:
        pass


def _drain(queue, counts: dict[str, tuple[int, int | None]]) -> None:
    """Take every ``(piece, n, total)`` the workers have sent so far into ``counts``."""
    import queue as queue_module

    while True:
        try:
            piece, n, total = queue.get_nowait()
        except queue_module.Empty:
            return
        counts[piece] = (n, total)


def running_text(running: Sequence[str], counts: dict[str, tuple[int, int | None]]) -> str:
    """The running pieces for the study's display, each with its sample or step count where a worker sent one:
    ``eval:passkey:yarn 72/80, train:pose-yarn 12/100``."""
    parts = []
    for piece in running:
        n, total = counts.get(piece, (None, None))
        parts.append(piece if n is None else f"{piece} {n}/{total if total is not None else '?'}")
    return ", ".join(parts)


def _watch_workers(procs, store: StudyStore, bar, config: StudyConfig, done_count, progress=None) -> None:
    """Show the workers' progress until every one has ended, or one was interrupted (exit 130: the caller stops
    the others at once, rather than wait for a worker that was still starting, and ignoring SIGINT, when the
    signal came, to finish its piece): finished pieces as lines, the running ones with the counts the workers send
    through ``progress`` (a queue of ``(piece, n, total)``)."""
    seen = _statuses(store)
    counts: dict[str, tuple[int, int | None]] = {}
    while any(proc.is_alive() for proc in procs):
        if any(proc.exitcode == 130 for proc in procs):
            return
        now = _statuses(store)
        for piece_id, status in now.items():
            if status in ("done", "failed") and seen.get(piece_id) != status:
                bar.log(f"{status}: {piece_id}")
                counts.pop(piece_id, None)
        seen = now
        if progress is not None:
            _drain(progress, counts)
        running = [r["piece"] for r in store.status()["running"]]  # what runs now, whatever its variant
        bar.update(completed=done_count(), info=running_text(running, counts))
        if store.get_manifest("window") is None and now.get(PRETRAIN, "done") == "done":
            _record_window(config, store)
        time.sleep(1.0)
    for proc in procs:
        proc.join()


def _stop_workers(procs, grace: float = 30.0) -> None:
    """Ctrl-C: pass SIGINT on (a ``kill -INT`` of this process alone does not reach them), give the workers
    ``grace`` seconds to put their pieces back, then end any that remain."""
    for proc in procs:
        if proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()


BACKENDS = ("local", "ray")


def run_study(config: StudyConfig, study_dir: str | Path, *, workers: int = 1, progress: bool = True, console=None,
              backend: str = "local", address: str | None = None, only: Sequence[str] | None = None) -> dict[str, Any]:
    """Run every unfinished piece of ``config`` into ``study_dir/study.sqlite``; returns the store's status.

    ``backend="local"``: ``workers`` processes share the work (each with ``cores // workers`` threads); with one,
    the work runs in this process with threads chosen per piece from the current load. ``backend="ray"``: every
    piece is a Ray task on the cluster at ``address`` (a local one when None) and this process is the only
    writer of the store (:mod:`ropekit.study.ray_backend`). The display (:func:`ropekit.runtime.progress`) shows
    finished pieces, the piece running and its samples, and keeps one line per finished piece. ``only`` runs the
    pieces of some variants (:func:`select_pieces`); the status returned is then theirs.
    """
    study_dir = Path(study_dir)
    select_pieces(config, only)  # an unknown label fails here, in one line, before anything is written
    if backend not in BACKENDS:
        raise RopekitError(f"unknown backend '{backend}'", f"choose one of {', '.join(BACKENDS)}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise RopekitError(f"--workers {workers!r} is not a positive whole number", "pass --workers 1 (or more)")
    if backend == "ray":
        if workers != 1:
            raise RopekitError("--workers applies to the local backend", "drop --workers: Ray runs as many pieces as "
                               "the cluster's resources allow")
        require_ray()  # a missing package fails here, before the study directory exists
    placement(config)  # an impossible device/dtype/attn fails here, in one line, before anything loads
    require_eval_data(config, study_dir, only)
    require_training_data(config, study_dir, only)
    require_models(config, study_dir, only=only)
    if backend == "local":  # a Ray cluster's workers resolve `auto` on their own machines; each piece checks itself
        require_same_dtype(config, study_dir, only)
    fresh = not study_dir.exists()
    store = initialize(study_dir, config)
    # a piece whose worker has ended (a run killed with SIGTERM or SIGKILL) is free again now, not when a worker
    # comes to it: until then the display would show it running
    store.release_abandoned()
    started = time.time()
    pieces = select_pieces(config, only)

    planned = {p.id for p in pieces}  # a study that dropped variants keeps their pieces, outside its plan

    def done_count() -> int:
        return sum(1 for piece, s in _statuses(store).items() if s == "done" and piece in planned)

    try:
        with runtime.progress(f"study {config.name}", total=len(pieces), completed=done_count(), console=console,
                              enabled=progress) as bar, quiet_transformers():
            if backend == "ray":
                def on_ray_done(piece_id: str, outcome: str) -> None:
                    bar.log(f"{outcome}: {piece_id}")
                    bar.update(completed=done_count())
                    if piece_id == PRETRAIN:
                        _record_window(config, store)

                try:
                    run_on_ray(config, study_dir, store, address=address, on_done=on_ray_done, only=only)
                except RopekitError:
                    if fresh and done_count() == 0:  # refused before any work (unreachable or too small cluster)
                        store.close()
                        shutil.rmtree(study_dir, ignore_errors=True)
                    raise
            elif workers == 1:
                current = {"id": ""}

                def on_piece(p: PlannedPiece) -> None:
                    current["id"] = p.id
                    bar.update(completed=done_count(), info=p.id)
                    if p.kind != "pretrain" and store.get_manifest("window") is None:
                        _record_window(config, store)

                def on_progress(n: int, total: int | None) -> None:
                    bar.update(info=running_text([current["id"]], {current["id"]: (n, total)}))

                def on_done(p: PlannedPiece, outcome: str | None, seconds: float) -> None:
                    bar.log(f"{outcome or 'stopped'}: {p.id} ({seconds:.1f} s)")
                    bar.update(completed=done_count())

                work(study_dir, config, report_piece=on_piece, report_progress=on_progress, report_done=on_done,
                     only=only)
            else:
                from transformers.utils import logging as hf_logging

                threads = max(1, runtime.usable_cores() // workers)
                ctx = multiprocessing.get_context("spawn")
                # several GPUs: worker i evaluates on cuda:(i mod n) instead of every worker sharing cuda:0
                requested = getattr(config, "device", "auto") or "auto"
                stop, counts = ctx.Event(), ctx.Queue()
                procs = [ctx.Process(target=_worker_main, daemon=False,
                                     args=(str(study_dir), config.as_dict(placement=True), threads, worker_device(requested, i),
                                           getattr(config, "dtype", "auto"), getattr(config, "attn", "auto"),
                                           hf_logging.get_verbosity(), stop, list(only or ()), counts))
                         for i in range(workers)]
                _start_workers(procs)
                try:
                    _watch_workers(procs, store, bar, config, done_count, counts)
                except KeyboardInterrupt:
                    stop.set()
                    _stop_workers(procs)
                    raise
                if any(proc.exitcode == 130 for proc in procs):
                    # a worker was interrupted (SIGINT that reached the workers and not this process: a background
                    # job ignores it): the study was stopped, not finished, and its caller must not read it as done
                    stop.set()
                    _stop_workers(procs)
                    raise KeyboardInterrupt
            _record_window(config, store)
            bar.update(completed=done_count(), info="")
        elapsed = time.time() - started
        previous = store.get_manifest("wall_seconds") or 0.0
        store.set_manifest(wall_seconds=round(float(previous) + elapsed, 1))
        return store.status(only=planned)
    except KeyboardInterrupt:
        store.release_abandoned()  # pieces of this process, or of a worker killed mid-piece, stay "running" otherwise
        raise
    finally:
        store.close()
