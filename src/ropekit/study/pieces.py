"""The pieces of a study and how one is computed: the plan (base model, trainings, evaluations, with their
prerequisites), the models each piece loads, and :func:`execute_piece`, which computes a piece without deciding
where its results go — the local scheduler (:mod:`ropekit.study.runner`) commits them to the store as they come,
a Ray task (:mod:`ropekit.study.ray_backend`) returns them to the driver."""

from __future__ import annotations

import copy
import io
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RopekitError
from ..eval import get_task
from ..eval.common import EvalContext, _check_resumed_dtype, prepare_model
from ..install import load
from ..models.byte_tokenizer import byte_tokenizer
from ..models.loading import load_model, parameter_count
from ..runtime import quiet_transformers
from ..runtime.atomic import filesystem_error
from ..runtime.devices import computed_on
from ..train.builtin_base import SHIPPED_DIR, describe, pretrain_base
from ..train.export import FINAL_DIR
from ..train.trainer import METRICS_FILE, train
from .config import BUILTIN_BASE, StudyConfig, Variant, train_config_for
from .store import DB_NAME, StoreRecordWriter, StudyStore, key_fields_for, open_study

PRETRAIN = "pretrain:base"
RUNS_DIR = "runs"
SEARCH_DIR = "search"


@dataclass(frozen=True)
class PlannedPiece:
    id: str
    kind: str
    label: str | None
    task: str | None = None
    needs: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    #: The training seed of a fine-tuned or searched variant's piece when the study has several (else None).
    seed: int | None = None


def seed_suffix(config: StudyConfig, seed: int | None) -> str:
    """``@seedN`` on the pieces (and run directories) of one seed when the study trains several, else ``""``."""
    return f"@seed{seed}" if seed is not None and len(config.training_seeds) > 1 else ""


def plan(config: StudyConfig) -> list[PlannedPiece]:
    """Every piece of the study in the order one worker runs them: the base model, then variant by variant
    its training and its evaluations (so results of the first methods appear early). With several ``seeds``
    a fine-tuned or searched variant is produced and evaluated once per seed (``train:LABEL@seed1``, …);
    frozen variants do not depend on a training seed and are evaluated once."""
    pieces: list[PlannedPiece] = []
    base_needs: tuple[str, ...] = ()
    if config.model == BUILTIN_BASE:
        pieces.append(PlannedPiece(PRETRAIN, "pretrain", "base", params={"seed": config.seed}))
        base_needs = (PRETRAIN,)
    several = len(config.training_seeds) > 1
    for v in config.variants:
        produced = v.trained or v.search is not None
        for seed in (config.training_seeds if produced else [None]):
            suffix = seed_suffix(config, seed)
            seed_params = {"seed": seed} if several and seed is not None else {}
            needs = base_needs
            if v.trained:
                pieces.append(PlannedPiece(f"train:{v.label}{suffix}", "train", v.label, needs=base_needs,
                                           params={"method": v.method, **v.params, **seed_params}, seed=seed))
                needs = (f"train:{v.label}{suffix}",)
            elif v.search is not None:
                pieces.append(PlannedPiece(f"search:{v.label}{suffix}", "search", v.label, needs=base_needs,
                                           params={"method": v.method, "search": dict(v.search), **seed_params},
                                           seed=seed))
                needs = (f"search:{v.label}{suffix}",)
            for task in config.evals:
                pieces.append(PlannedPiece(f"eval:{task}:{v.label}{suffix}", "eval", v.label, task=task, needs=needs,
                                           params={"method": v.method, **v.params, **seed_params}, seed=seed))
    return pieces


def select_pieces(config: StudyConfig, only: Sequence[str] | None = None) -> list[PlannedPiece]:
    """The plan, or with ``only`` (variant labels) the pieces of those variants — their training or search and
    their evaluations — and the base model they start from: a part of the study run now (``--only``), the rest
    later, under the same protocol. An unknown label is one line."""
    pieces = plan(config)
    if not only:
        return pieces
    known = [v.label for v in config.variants]
    for label in only:
        if label not in known:
            raise RopekitError(f"--only {label}: no variant of study '{config.name}' has that label",
                               f"choose among: {', '.join(known)}")
    return [p for p in pieces if p.kind == "pretrain" or p.label in only]


def _variant_order(config: StudyConfig) -> list[str]:
    return [v.label for v in config.variants]


# ---- models ------------------------------------------------------------------------------------------------
def base_model_path(config: StudyConfig, store) -> str:
    """The base model every variant starts from: the pre-trained built-in model's directory, or the config's model.

    ``store`` is anything with the store's ``artifacts(piece)`` (the store itself, or a Ray task's
    :class:`~ropekit.study.ray_backend.ArtifactView`)."""
    if config.model != BUILTIN_BASE:
        return config.model
    for a in store.artifacts(PRETRAIN):
        if a["name"] == "model" and Path(a["path"]).is_dir():
            return a["path"]
    return str(pretrain_base(config.seed, progress=False, shipped=not getattr(config, "pretrain", False)))  # cache cleared: rebuild


def placement(config: StudyConfig, device: str | None = None):
    """The study's ``device``/``dtype``/``attn`` keys (default ``auto``) resolved against this machine
    (:func:`ropekit.runtime.devices.resolve_devices`); ``device`` overrides the config's (a worker's own GPU)."""
    from ..runtime.devices import resolve_devices

    model = getattr(config, "model", None)
    # the built-in base model is small (float32 under auto) wherever it has been built, whatever its seed or
    # steps: its architecture is the shipped one's; others are counted
    parameters = parameter_count(str(SHIPPED_DIR if model in (None, BUILTIN_BASE) else model))
    return resolve_devices(device or getattr(config, "device", "auto") or "auto", getattr(config, "dtype", "auto") or "auto",
                           getattr(config, "attn", "auto") or "auto", model_parameters=parameters)


#: The base model a worker process loaded last, kept for its next pieces: ``(path, mtime, device, dtype, attn) →
#: (model, tokenizer)``. Loading is the slow part of a short piece (a GGUF is dequantized tensor by tensor: about a
#: minute for SmolLM2 on 2 CPU cores), and every piece of a study evaluates the same base model.
_BASE_MODELS: dict[tuple, tuple[Any, Any]] = {}


def _load_base(config: StudyConfig, store, device: str | None = None):
    """The study's base model for one piece: a private copy (methods are installed in place), loaded once per
    process."""
    plan_ = placement(config, device)
    path = base_model_path(config, store)
    built = Path(path).stat().st_mtime_ns if Path(path).exists() else None  # a rebuilt model is loaded again
    key = (path, built, plan_.device, plan_.dtype, plan_.attn)
    if key not in _BASE_MODELS:
        _BASE_MODELS.clear()  # one base model per process: a study has one
        loaded = load_model(path, device=plan_.device, dtype=plan_.dtype, attn_implementation=plan_.attn)
        _BASE_MODELS[key] = (loaded.model, loaded.tokenizer)
    model, tokenizer = _BASE_MODELS[key]
    return copy.deepcopy(model), tokenizer


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
    path = pretrain_base(config.seed, progress=False, threads=threads, on_step=report,
                         shipped=not getattr(config, "pretrain", False))
    meta = describe(path)
    # the built-in base model is pre-trained (or taken as shipped) in float32 on the CPU
    return {"artifacts": {"model": str(path)},
            "metrics": [{"step": meta["settings"]["steps"], "loss": meta["final_loss"]}],
            "placement": computed_on(device="cpu", dtype="float32")}


def _run_train(config: StudyConfig, store, piece: PlannedPiece, study_dir: Path, report,
               threads: int | None) -> dict[str, Any]:
    variant = config.variant(piece.label)
    out = study_dir / RUNS_DIR / f"{variant.label}{seed_suffix(config, piece.seed)}"
    cfg = train_config_for(config, variant, base_model_path(config, store), out, seed=piece.seed)
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
    # a recipe that keeps an EMA of the weights asks for the averaged model: that is the one evaluated
    evaluated = result.ema_dir if cfg.train.ema is not None and result.ema_dir else result.final_dir
    artifacts = {"model": str(evaluated)} if evaluated else {}
    placed = result.trained_on  # the run's own record, also when an earlier process trained and exported it
    where = (computed_on(device=placed["device"], dtype=cfg.model.dtype, precision=cfg.train.precision,
                         corpus=trained_corpus(out), hardware=placed.get("hardware"))
             if placed else None)  # None: exported by a ropekit that recorded no placement
    # a training resumed from a checkpoint, or found finished after a crash, cost more than this call: the step
    # time of the steps earlier processes ran is added to the piece's seconds
    ran_here = {step for step, _ in result.losses} if result.device else set()
    before = sum(float(row.get("seconds") or 0.0) for row in metrics if row.get("step") not in ran_here)
    return {"artifacts": artifacts, "metrics": metrics, "placement": where, "seconds_before": before}


def trained_corpus(run_dir: Path) -> str | None:
    """The built-in corpus digests a training in ``run_dir`` read (its stages' ``data-STAGE.json``), comma-joined;
    None when it read no built-in data. The built-in split is the running Python's standard library, so a study
    trained on two machines can have trained its variants on two corpora (:func:`ropekit.study.runner.corpus_warning`)."""
    digests = set()
    for path in sorted(Path(run_dir).glob("data-*.json")):
        digests.update(src["corpus_digest"] for src in json.loads(path.read_text()).get("sources", [])
                       if src.get("corpus_digest"))
    return ",".join(sorted(digests)) or None


def _run_search(config: StudyConfig, store, piece: PlannedPiece, study_dir: Path, report, threads: int | None,
                device: str | None = None) -> dict[str, Any]:
    """LongRoPE's factor search for the study's target length on the base model (:mod:`ropekit.search`), into
    ``DIR/search/LABEL``; resumable like a training (finished candidates are read back). It runs where and in the
    dtype the study's evaluations run (:func:`placement`): its objective is the perplexity they measure."""
    from ..search import SearchSettings, run_search
    from ..search.longrope import parse_start_tokens

    variant = config.variant(piece.label)
    base = base_model_path(config, store)
    where = placement(config, device)
    loaded = load_model(base, device=where.device, dtype=where.dtype, attn_implementation=where.attn)
    seed = config.seed if piece.seed is None else piece.seed
    given = dict(variant.search)
    if "start_tokens" in given:  # N, [a, b, c] or "paper", as ropekit search's --start-tokens
        starts = given["start_tokens"]
        text = ",".join(map(str, starts)) if isinstance(starts, list) else str(starts)
        given["start_tokens"] = parse_start_tokens(text, config.target_length)
    settings = SearchSettings(model=base, target_length=config.target_length, seed=seed,
                              **{"evaluations": 64, **given})
    out = study_dir / SEARCH_DIR / f"{variant.label}{seed_suffix(config, piece.seed)}"
    result = run_search(loaded.model, loaded.tokenizer, settings, out, progress=False)
    # one metrics row: the search's objective (perplexity at the target on its documents) and its evaluations
    return {"artifacts": {"model": str(out / "model")},
            "metrics": [{"step": result["evaluations"], "loss": math.log(result["best"]["perplexity"])}],
            "placement": computed_on(loaded.model)}


def produced_model_dir(study_dir: Path, producer: str, leaf: str | None = None) -> Path:
    """Where the piece ``producer`` (``train:LABEL[@seedN]`` or ``search:LABEL[@seedN]``) writes its model in
    ``study_dir``: ``runs/LABEL/final`` (:func:`ropekit.train.train`'s final directory; ``leaf`` ``final-ema`` for a
    recipe with an EMA) or ``search/LABEL/model``."""
    kind, _, name = producer.partition(":")
    if kind == "train":
        return study_dir / RUNS_DIR / name / (leaf or FINAL_DIR)
    return study_dir / SEARCH_DIR / name / "model"


def produced_model(store, study_dir: Path | None, producer: str) -> str | None:
    """The model a finished ``producer`` piece left: the directory it recorded, or — when that is gone because the
    study directory was moved or copied to another machine with its runs — the same place in ``study_dir``;
    None when neither exists (the model has to be produced again: ``ropekit study --retrain LABEL``)."""
    recorded = [a["path"] for a in store.artifacts(producer) if a["name"] == "model"]
    leaf = Path(recorded[0]).name if recorded else None  # final, or final-ema
    candidates = [Path(p) for p in recorded] + ([produced_model_dir(study_dir, producer, leaf)] if study_dir else [])
    return next((str(c) for c in candidates if (c / "config.json").is_file()), None)


def _eval_model(config: StudyConfig, store, variant: Variant, lengths: list[int], device: str | None = None,
                producer: str | None = None, study_dir: Path | None = None):
    """``(model, tokenizer, method, params)`` of a variant, ready to evaluate, on the study's device (or ``device``);
    ``producer`` names the piece whose model a fine-tuned or searched variant evaluates (one seed's)."""
    producer = producer or variant.produced_by
    if variant.produced_by is not None:
        trained = produced_model(store, study_dir, producer)
        if trained is None:
            raise RopekitError(f"the model '{producer}' produced is not on this machine",
                               f"run the study again with --retrain {variant.label} (it is produced again and its "
                               "evaluations redone), or copy the study directory's runs with it")
        model, tokenizer = _load_trained(trained, placement(config, device))
        record = getattr(model.config, "ropekit", None) or {}
        return model, tokenizer, record.get("method") or "plain", dict(record.get("params") or {})
    model, tokenizer = _load_base(config, store, device)
    variant_model, params = prepare_model(model, variant.method, dict(variant.params), lengths)
    return variant_model, tokenizer, variant.method or "plain", params


def _run_eval(config: StudyConfig, store, piece: PlannedPiece, report, device: str | None = None, writer=None,
              study_dir: Path | None = None) -> dict[str, Any]:
    variant = config.variant(piece.label)
    options = config.eval_options(piece.task)
    task = config.eval_task(piece.task)
    module = get_task(task)
    producer = piece.needs[0] if variant.produced_by is not None and piece.needs else None
    model, tokenizer, method, params = _eval_model(config, store, variant, options["lengths"], device, producer,
                                                   study_dir)
    model.eval()
    if writer is None:
        writer = StoreRecordWriter(store, piece.id, key_fields_for(task))
    # records carry the evaluation's name (``ppl-same-targets`` next to ``ppl``) and, with several seeds, the seed
    tags = {"seed": piece.seed} if seed_suffix(config, piece.seed) else {}
    # each sample says where it was computed: a piece resumed on another machine holds samples of both, in one dtype
    tags["computed_on"] = computed_on(model)
    _refuse_another_dtype(writer, piece.task, method, params, tags["computed_on"]["dtype"],
                          Path(study_dir) / DB_NAME if study_dir is not None else "the study")
    ctx = EvalContext(task=piece.task, model=model, tokenizer=tokenizer, method=method, params=params,
                      seed=config.seed, writer=writer, progress=_Sink(report), tags=tags)
    module.run(ctx, **options)
    return {"placement": tags["computed_on"]}


def _refuse_another_dtype(writer, task: str, method: str, params: dict[str, Any], dtype: str, where) -> None:
    """Refuse, before a sample is written, to resume an evaluation whose stored samples were computed in another
    dtype than ``dtype`` (``--dtype``, or ``auto`` resolved on another machine): bfloat16 and float32 scores of one
    model differ by about what separates methods, and each cell would average both. ``ropekit eval --resume``'s
    check (:func:`ropekit.eval.common._check_resumed_dtype`); another device or machine in the same dtype is fine."""
    # the store gives records back as JSON: the parameters are compared as it reads them (a tuple is a list there)
    stored = json.loads(json.dumps(params, sort_keys=True, default=str))
    _check_resumed_dtype(writer, task, method, stored, dtype, where)


def require_same_dtype(config: StudyConfig, study_dir: str | Path, only: Sequence[str] | None = None) -> None:
    """Refuse, in one line before anything is written, to resume evaluations whose stored samples were computed in
    another dtype than this run computes in (:func:`placement`): the check each piece makes when it starts
    (:func:`_refuse_another_dtype`), made for every unfinished evaluation at once — the piece's own check records a
    failed piece when its turn comes, after the pieces before it ran. For the local backend: a Ray cluster's workers
    resolve ``auto`` on their own machines. ``only``: :func:`select_pieces`."""
    if not (Path(study_dir) / DB_NAME).is_file():
        return
    dtype = placement(config).dtype
    with open_study(study_dir) as store:
        status = {p["id"]: p["status"] for p in store.pieces()}
        for piece in select_pieces(config, only):
            if piece.kind != "eval" or status.get(piece.id, "done") == "done":
                continue
            writer = StoreRecordWriter(store, piece.id, key_fields_for(config.eval_task(piece.task)))
            first = next(iter(writer.records()), None)
            if first is not None:  # a piece's samples are of one method and parameters (require_same_config)
                _check_resumed_dtype(writer, piece.task, first.get("method"), first.get("params"), dtype, store.path)


def execute_piece(config: StudyConfig, store, piece: PlannedPiece, study_dir: Path, report=lambda n, total: None,
                  threads: int | None = None, device: str | None = None, writer=None) -> dict[str, Any]:
    """Compute one piece: ``{"metrics": …, "artifacts": …, "placement": …}`` (where it computed:
    :func:`ropekit.runtime.devices.computed_on`; evaluation samples go to ``writer``, by default
    straight into ``store``), and for a training ``seconds_before``, the step time earlier processes spent on it
    (:func:`piece_seconds`). ``store`` only needs ``artifacts(piece)`` when ``writer`` is given."""
    if piece.kind == "pretrain":
        return _run_pretrain(config, store, piece, report, threads)
    if piece.kind == "train":
        return _run_train(config, store, piece, study_dir, report, threads)
    if piece.kind == "search":
        return _run_search(config, store, piece, study_dir, report, threads, device)
    return _run_eval(config, store, piece, report, device, writer, study_dir)


def piece_seconds(out: dict[str, Any], started: float) -> float:
    """A finished piece's cost: this process's wall time since ``started`` (``time.perf_counter``) plus what
    earlier processes spent on it (``seconds_before``: a training's steps before the checkpoint it resumed from)."""
    return time.perf_counter() - started + float(out.get("seconds_before") or 0.0)


def piece_error(err: BaseException) -> str | BaseException:
    """What a failed piece records: a RopekitError's one line — a full disk or another filesystem error the user can
    fix as the line the CLI gives it (:func:`ropekit.runtime.atomic.filesystem_error`) — any other exception as it
    is."""
    user = err if isinstance(err, RopekitError) else filesystem_error(err)
    if user is not None:
        return f"{user.problem} ({user.fix})" if user.fix else user.problem
    return err



def blocked(piece: PlannedPiece, status: dict[str, str], by_id: dict[str, PlannedPiece], failed_now: set[str]) -> bool:
    """True when a prerequisite failed in this run (directly or through its own prerequisites)."""
    for need in piece.needs:
        if need in failed_now or blocked(by_id[need], status, by_id, failed_now):
            return True
    return False
