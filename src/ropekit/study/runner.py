"""``ropekit study``: run a controlled comparison piece by piece into the study's SQLite store.

The study (:mod:`ropekit.study.config`) is cut into pieces (:func:`plan`):

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
depend on it; running the study again retries it. Nothing finished is ever recomputed.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import runtime
from ..errors import RopekitError
from ..eval import get_task
from ..eval.common import EvalContext, prepare_model
from ..install import load, rope_info
from ..models.byte_tokenizer import byte_tokenizer
from ..models.loading import load_model
from ..runtime.devices import worker_device
from ..runtime import default_threads, quiet_transformers, torch_threads
from ..train.builtin_base import describe, pretrain_base
from ..train.trainer import METRICS_FILE, train
from .config import BUILTIN_BASE, StudyConfig, Variant, parse_study, train_config_for
from .store import StoreRecordWriter, StudyStore, key_fields_for, open_study

PRETRAIN = "pretrain:base"
RUNS_DIR = "runs"


@dataclass(frozen=True)
class PlannedPiece:
    id: str
    kind: str
    label: str | None
    task: str | None = None
    needs: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)


def plan(config: StudyConfig) -> list[PlannedPiece]:
    """Every piece of the study in the order one worker runs them: the base model, then variant by variant
    its training and its evaluations (so results of the first methods appear early)."""
    pieces: list[PlannedPiece] = []
    base_needs: tuple[str, ...] = ()
    if config.model == BUILTIN_BASE:
        pieces.append(PlannedPiece(PRETRAIN, "pretrain", "base", params={"seed": config.seed}))
        base_needs = (PRETRAIN,)
    for v in config.variants:
        needs = base_needs
        if v.trained:
            pieces.append(PlannedPiece(f"train:{v.label}", "train", v.label, needs=base_needs,
                                       params={"method": v.method, **v.params}))
            needs = (f"train:{v.label}",)
        for task in config.evals:
            pieces.append(PlannedPiece(f"eval:{task}:{v.label}", "eval", v.label, task=task, needs=needs,
                                       params={"method": v.method, **v.params}))
    return pieces


def _variant_order(config: StudyConfig) -> list[str]:
    return [v.label for v in config.variants]


# ---- models ------------------------------------------------------------------------------------------------
def base_model_path(config: StudyConfig, store: StudyStore) -> str:
    """The base model every variant starts from: the pre-trained built-in model's directory, or the config's model."""
    if config.model != BUILTIN_BASE:
        return config.model
    for a in store.artifacts(PRETRAIN):
        if a["name"] == "model" and Path(a["path"]).is_dir():
            return a["path"]
    return str(pretrain_base(config.seed, progress=False))  # the cache was cleared since: rebuild it


def placement(config: StudyConfig, device: str | None = None):
    """The study's ``device``/``dtype``/``attn`` keys (default ``auto``) resolved against this machine
    (:func:`ropekit.runtime.devices.resolve_devices`); ``device`` overrides the config's (a worker's own GPU)."""
    from ..runtime.devices import resolve_devices

    return resolve_devices(device or getattr(config, "device", "auto") or "auto", getattr(config, "dtype", "auto") or "auto",
                           getattr(config, "attn", "auto") or "auto")


def _load_base(config: StudyConfig, store: StudyStore, device: str | None = None):
    plan_ = placement(config, device)
    loaded = load_model(base_model_path(config, store), device=plan_.device, dtype=plan_.dtype,
                        attn_implementation=plan_.attn)
    return loaded.model, loaded.tokenizer


def _load_trained(path: str | Path, plan_=None):
    from transformers import AutoTokenizer

    with quiet_transformers():
        model = load(path)
        if plan_ is not None:
            model = model.to(device=plan_.device, dtype=plan_.torch_dtype)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True) if (Path(path) / "tokenizer_config.json").is_file() else None
    if tokenizer is None:
        tokenizer = byte_tokenizer()
    return model, tokenizer


# ---- pieces ------------------------------------------------------------------------------------------------
class _Sink:
    """Sample-level progress of the running piece, shown on the study's bar."""

    def __init__(self, report):
        self.report = report
        self.total = None
        self.n = 0

    def set_total(self, total: int) -> None:
        self.total = total
        self.report(self.n, self.total)

    def advance(self, n: int = 1, description: str | None = None) -> None:
        self.n += n
        self.report(self.n, self.total)


def _run_pretrain(config: StudyConfig, store: StudyStore, piece: PlannedPiece, report, threads: int | None) -> dict[str, Any]:
    path = pretrain_base(config.seed, progress=False, threads=threads, on_step=report)
    meta = describe(path)
    return {"artifacts": {"model": str(path)},
            "metrics": [{"step": meta["settings"]["steps"], "loss": meta["final_loss"]}]}


def _run_train(config: StudyConfig, store: StudyStore, piece: PlannedPiece, study_dir: Path, report,
               threads: int | None) -> dict[str, Any]:
    variant = config.variant(piece.label)
    out = study_dir / RUNS_DIR / variant.label
    cfg = train_config_for(config, variant, base_model_path(config, store), out)
    total = cfg.train.max_steps
    if threads is not None:
        cfg.train.threads = threads

    def on_step(info):
        report(info.step, total)

    from rich.console import Console

    # the study's bar shows the step; the trainer's own lines would interleave with it
    result = train(cfg, resume=True, progress=False, callbacks=[on_step], console=Console(file=io.StringIO()))
    metrics = []
    path = out / METRICS_FILE
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                metrics.append(json.loads(line))
    artifacts = {"model": str(result.final_dir)} if result.final_dir else {}
    return {"artifacts": artifacts, "metrics": metrics}


def _eval_model(config: StudyConfig, store: StudyStore, variant: Variant, lengths: list[int], device: str | None = None):
    """``(model, tokenizer, method, params)`` of a variant, ready to evaluate, on the study's device (or ``device``)."""
    if variant.trained:
        trained = [a["path"] for a in store.artifacts(f"train:{variant.label}") if a["name"] == "model"]
        if not trained:
            raise RopekitError(f"the training of '{variant.label}' left no model", "run the study again to retrain it")
        model, tokenizer = _load_trained(trained[0], placement(config, device))
        record = getattr(model.config, "ropekit", None) or {}
        return model, tokenizer, record.get("method") or "plain", dict(record.get("params") or {})
    model, tokenizer = _load_base(config, store, device)
    variant_model, params = prepare_model(model, variant.method, dict(variant.params), lengths)
    return variant_model, tokenizer, variant.method or "plain", params


def _run_eval(config: StudyConfig, store: StudyStore, piece: PlannedPiece, report, device: str | None = None) -> dict[str, Any]:
    variant = config.variant(piece.label)
    options = dict(config.evals[piece.task])
    module = get_task(piece.task)
    model, tokenizer, method, params = _eval_model(config, store, variant, options["lengths"], device)
    model.eval()
    ctx = EvalContext(task=piece.task, model=model, tokenizer=tokenizer, method=method, params=params,
                      seed=config.seed, writer=StoreRecordWriter(store, piece.id, key_fields_for(piece.task)),
                      progress=_Sink(report))
    module.run(ctx, **options)
    return {}


def run_piece(config: StudyConfig, store: StudyStore, piece: PlannedPiece, study_dir: Path, report=lambda n, total: None,
              threads: int | None = None, device: str | None = None) -> None:
    """Run one claimed piece and commit its results; failures are recorded on the piece, never raised.

    ``device`` overrides the study's ``device`` key for evaluations (a worker's own GPU)."""
    started = time.perf_counter()
    try:
        if piece.kind == "pretrain":
            out = _run_pretrain(config, store, piece, report, threads)
        elif piece.kind == "train":
            out = _run_train(config, store, piece, study_dir, report, threads)
        else:
            out = _run_eval(config, store, piece, report, device)
    except (KeyboardInterrupt, SystemExit):
        raise
    except RopekitError as err:
        store.fail_piece(piece.id, f"{err.problem} ({err.fix})" if err.fix else err.problem)
        return
    except Exception as err:  # noqa: BLE001 - a failed piece must not take the rest of the study down
        store.fail_piece(piece.id, err)
        return
    store.finish_piece(piece.id, metrics=out.get("metrics", ()), artifacts=out.get("artifacts"),
                       seconds=time.perf_counter() - started)


# ---- scheduling --------------------------------------------------------------------------------------------
def _statuses(store: StudyStore) -> dict[str, str]:
    return {p["id"]: p["status"] for p in store.pieces()}


def _blocked(piece: PlannedPiece, status: dict[str, str], by_id: dict[str, PlannedPiece], failed_now: set[str]) -> bool:
    """True when a prerequisite failed in this run (directly or through its own prerequisites)."""
    for need in piece.needs:
        if need in failed_now or _blocked(by_id[need], status, by_id, failed_now):
            return True
    return False


def work(study_dir: str | Path, config: StudyConfig, *, report_piece=None, report_progress=None, report_done=None,
         poll: float = 0.5, threads: int | None = None, device: str | None = None) -> None:
    """One worker: claim runnable pieces until none is left (others may still be running pieces).

    ``threads``: CPU threads for every piece; ``None`` chooses them per piece from the machine's load at the
    moment it starts (:func:`~ropekit.runtime.default_threads`), so a momentary load early on does not slow
    the whole study. ``report_done(piece, status, seconds)`` is called after each piece. ``device``: this
    worker's device for evaluations (None: the config's ``device`` key).
    """
    study_dir = Path(study_dir)
    pieces = plan(config)
    by_id = {p.id: p for p in pieces}
    failed_now: set[str] = set()  # pieces that failed during this run (retried only by the next run)
    with open_study(study_dir) as store:
        while True:
            status = _statuses(store)
            runnable, waiting = None, False
            for p in pieces:
                st = status.get(p.id, "pending")
                if st == "done" or p.id in failed_now or _blocked(p, status, by_id, failed_now):
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
            with torch_threads(piece_threads):
                run_piece(config, store, runnable, study_dir, report=report_progress or (lambda n, total: None),
                          threads=piece_threads, device=device)
            outcome = _statuses(store).get(runnable.id)
            if outcome == "failed":
                failed_now.add(runnable.id)
            if report_done:
                report_done(runnable, outcome, time.perf_counter() - started)


def _worker_main(study_dir: str, config_dict: dict[str, Any], threads: int, device: str | None = None,
                 dtype: str = "auto", attn: str = "auto") -> None:
    config = parse_study(config_dict)
    config.dtype, config.attn = dtype, attn  # also when the config dict does not carry them
    with quiet_transformers():
        work(study_dir, config, threads=threads, device=device)


def initialize(study_dir: str | Path, config: StudyConfig) -> StudyStore:
    """Create (or reopen) the study's database, record the manifest and register every piece."""
    study_dir = Path(study_dir)
    study_dir.mkdir(parents=True, exist_ok=True)
    store = open_study(study_dir, create=True)
    window = config.window
    store.initialize(config.name, config.as_dict(), seeds=[config.seed], model=config.model,
                     target_length=config.target_length, methods=_variant_order(config),
                     **({"window": window} if window else {}))
    for p in plan(config):
        store.register(p.id, kind=p.kind, method=p.label, params=p.params, task=p.task)
    return store


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


def run_study(config: StudyConfig, study_dir: str | Path, *, workers: int = 1, progress: bool = True, console=None) -> dict[str, Any]:
    """Run every unfinished piece of ``config`` into ``study_dir/study.sqlite``; returns the store's status.

    ``workers`` processes share the work (each with ``cores // workers`` threads); with one, the work runs in
    this process with threads chosen per piece from the current load. The display (:func:`ropekit.runtime.progress`)
    shows finished pieces, the piece running and its samples, and keeps one line per finished piece.
    """
    study_dir = Path(study_dir)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise RopekitError(f"--workers {workers!r} is not a positive whole number", "pass --workers 1 (or more)")
    placement(config)  # an impossible device/dtype/attn fails here, in one line, before anything loads
    store = initialize(study_dir, config)
    started = time.time()
    pieces = plan(config)

    def done_count() -> int:
        return sum(1 for s in _statuses(store).values() if s == "done")

    try:
        with runtime.progress(f"study {config.name}", total=len(pieces), completed=done_count(), console=console,
                              enabled=progress) as bar, quiet_transformers():
            if workers == 1:
                current = {"id": ""}

                def on_piece(p: PlannedPiece) -> None:
                    current["id"] = p.id
                    bar.update(completed=done_count(), info=p.id)
                    if p.kind != "pretrain" and store.get_manifest("window") is None:
                        _record_window(config, store)

                def on_progress(n: int, total: int | None) -> None:
                    bar.update(info=f"{current['id']} {n}/{total if total is not None else '?'}")

                def on_done(p: PlannedPiece, outcome: str | None, seconds: float) -> None:
                    bar.log(f"{outcome or 'stopped'}: {p.id} ({seconds:.1f} s)")
                    bar.update(completed=done_count())

                work(study_dir, config, report_piece=on_piece, report_progress=on_progress, report_done=on_done)
            else:
                threads = max(1, (os.cpu_count() or 1) // workers)
                ctx = multiprocessing.get_context("spawn")
                # several GPUs: worker i evaluates on cuda:(i mod n) instead of every worker sharing cuda:0
                requested = getattr(config, "device", "auto") or "auto"
                procs = [ctx.Process(target=_worker_main, daemon=False,
                                     args=(str(study_dir), config.as_dict(), threads, worker_device(requested, i),
                                           getattr(config, "dtype", "auto"), getattr(config, "attn", "auto")))
                         for i in range(workers)]
                for proc in procs:
                    proc.start()
                seen = _statuses(store)
                while any(proc.is_alive() for proc in procs):
                    now = _statuses(store)
                    for piece_id, status in now.items():
                        if status in ("done", "failed") and seen.get(piece_id) != status:
                            bar.log(f"{status}: {piece_id}")
                    seen = now
                    running = [r["piece"] for r in store.status()["running"]]
                    bar.update(completed=done_count(), info=", ".join(running))
                    if store.get_manifest("window") is None and now.get(PRETRAIN, "done") == "done":
                        _record_window(config, store)
                    time.sleep(1.0)
                for proc in procs:
                    proc.join()
            _record_window(config, store)
            bar.update(completed=done_count(), info="")
        elapsed = time.time() - started
        previous = store.get_manifest("wall_seconds") or 0.0
        store.set_manifest(wall_seconds=round(float(previous) + elapsed, 1))
        return store.status()
    finally:
        store.close()
