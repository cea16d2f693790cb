"""Fine-tuning and continual pre-training for context extension: a YAML recipe configuring the one loop.

:class:`Trainer` builds the parts of :func:`ropekit.train.loop.train_loop` from a :class:`TrainConfig` and
runs it:

* strategy: :class:`~ropekit.train.strategy.AccelerateStrategy` (one CPU process, DDP, FSDP2, DeepSpeed ZeRO,
  context parallelism), :mod:`ropekit.train.strategy`;
* data: each stage's dataset (:mod:`ropekit.train.data`: the global batch of a step is fixed by the step
  number, whatever the number of processes), the stage's method switched in when the stage begins
  (:mod:`ropekit.train.curriculum`);
* objective: the mean next-token loss over all label tokens of the global batch
  (:class:`~ropekit.train.objective.TokenMeanLoss`);
* schedule: :func:`ropekit.train.curriculum.lr_at`, a pure function of the step;
* the loss guard (:mod:`ropekit.train.loss_guard`) and the EMA (:mod:`ropekit.train.ema`);
* at the end of each step: ``DIR/metrics.jsonl``, the console, TensorBoard / W&B (:mod:`ropekit.train.trackers`),
  callbacks, and a checkpoint every ``save_every`` steps (:mod:`ropekit.train.checkpoint`).

At the end the model is exported (:mod:`ropekit.train.export`) to ``DIR/final`` (LoRA merged first), so
``ropekit.load(DIR/final)`` gives it back with its method, and the EMA weights to ``DIR/final-ema``.

Determinism: the run is seeded (``train.seed``) inside a forked torch RNG (the caller's generator state
is restored afterwards), CPU threads are fixed (``train.threads``; by default, for one CPU process,
:func:`ropekit.runtime.default_threads`), and
``torch.use_deterministic_algorithms(True, warn_only=True)`` is on by default. A resumed run reproduces the
losses of an uninterrupted one (tests/train/test_train_resume.py).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import runtime
from ..core.jsonsafe import json_safe
from ..errors import RopekitError
from ..methods import get_method
from ..models.byte_tokenizer import byte_tokenizer
from ..models.loading import load_model
from ..runtime import cache_root, default_threads
from ..runtime.devices import free_memory, hardware_name
from ..runtime.atomic import PART_SUFFIX, atomic_file
from . import checkpoint as ckpt
from .config import TrainConfig
from .curriculum import StagePlan, check_method, install, locate, lr_at, plan, stage_seed, switch, switch_changes
from .data import SampleOrder, build_dataset, make_loader
from .ema import EMA
from .export import FINAL_DIR, FINAL_EMA_DIR, TRAIN_INFO, export_model
from .lora import apply_lora, base_model
from .loop import Parts, StepRecord, train_loop
from .loss_guard import LossGuard, TrainingAborted
from .objective import TokenMeanLoss
from .pretrain import pretrain_tiny
from .strategy import AccelerateStrategy, device_ids, has_accelerator_device, make_accelerator, reset_accelerate
from .trackers import METRICS_FILE, MetricsFile, console_line, logged_losses, start_trackers

CONFIG_FILE = "config.yaml"


def check_run_dir(out: Path, resume: bool, own_files: Iterable[Path] = ()) -> tuple[int, Path] | None:
    """What a run refuses in its output directory before it starts (a dry run checks the same); the newest
    checkpoint there, or None. Refused: a file; an earlier run without ``resume``; files no training run wrote
    (the run would mix its files with someone else's, and a later ``--resume`` read them as its own), except
    ``own_files`` the user gave this run (its config)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RopekitError(f"output.dir '{out}' exists and is a file", "pass a directory path with --out")
    if not out.is_dir():
        return None
    found = ckpt.latest(out)
    if not resume and any((out / name).exists() for name in (METRICS_FILE, ckpt.CHECKPOINTS, FINAL_DIR)):
        held = f"checkpoints up to step {found[0]}" if found else "an earlier run"
        raise RopekitError(f"output.dir '{out}' already holds {held}", "pass --resume to continue it, or choose a new --out")
    given = {Path(p).resolve() for p in own_files}
    foreign = sorted(p.name for p in out.iterdir() if not _written_by_a_run(p.name) and p.resolve() not in given)
    if foreign:
        shown = ", ".join(foreign[:3]) + (" …" if len(foreign) > 3 else "")
        raise RopekitError(f"output.dir '{out}' holds files no training run wrote ({shown})", "choose a new or empty --out")
    return found


def check_resume(out: Path, cfg, resume: bool, own_files: Iterable[Path] = ()) -> tuple[int, Path] | None:
    """:func:`check_run_dir`, and with ``resume`` what a resume refuses: a checkpoint made with another config, a
    finished run with another config and no checkpoint. The run and its dry run both call this."""
    out = Path(out)
    found = check_run_dir(out, resume, own_files)
    if not resume:
        return None
    if found is None:
        if (out / FINAL_DIR).exists() and not _finished_already(out, cfg):
            # a run that kept no checkpoint: "resuming" it would train from step 0 and replace its model
            raise RopekitError(f"--resume: output.dir '{out}' holds a finished run with another config or length "
                               "and no checkpoint to continue from", "choose a new --out")
        return None
    state = ckpt.read_state(found[1])
    diff = ckpt.config_diff(state.get("config", {}), json_safe(cfg.to_dict()))
    if diff:
        raise RopekitError(f"--resume: the config differs from the run in '{out}': {diff}",
                           "resume with the config file the run started from (DIR/config.yaml lists its resolved "
                           "settings), or start a new --out")
    return found


def _finished_already(out: Path, cfg) -> bool:
    """Whether ``out`` holds the finished run of ``cfg``: every export it owes (``final``, and ``final-ema`` when it
    keeps an EMA) at its last step, with its config. A kill between the two exports leaves a run that is not
    finished, so ``--resume`` trains again from the last checkpoint and writes both."""
    owed = [FINAL_DIR] + ([FINAL_EMA_DIR] if cfg.train.ema is not None else [])
    for name in owed:
        info = Path(out) / name / TRAIN_INFO
        if not info.is_file():
            return False
        try:
            done = json.loads(info.read_text())
        except json.JSONDecodeError:
            return False
        if done.get("step") != cfg.last_step or ckpt.config_diff(done.get("config", {}), json_safe(cfg.to_dict())) is not None:
            return False
    return True


def data_fingerprint(summary: dict[str, Any]) -> str:
    """A digest of what a stage's data read: each source's token digest (the documents as tokenised, in order:
    :func:`~ropekit.data.training_data.build_training_data`). Everything else it builds from them follows from the
    config, which a resume compares on its own. A summary without token digests (a dataset of the caller's) is
    digested whole, less whether the tokenisation cache was hit."""
    sources = summary.get("sources") or []
    if sources and all("tokens_digest" in src for src in sources):
        stable: Any = [src["tokens_digest"] for src in sources]
    else:
        stable = {**summary, "sources": [{k: v for k, v in src.items() if k != "cache"} for src in sources]}
    return hashlib.sha256(json.dumps(json_safe(stable), sort_keys=True).encode()).hexdigest()[:16]


def _written_by_a_run(name: str) -> bool:
    """Whether a run directory's entry ``name`` is one a training run writes (a crash may leave a ``.part``, or
    one of :func:`_leftover`'s)."""
    return (name in (CONFIG_FILE, METRICS_FILE, ckpt.CHECKPOINTS, FINAL_DIR, FINAL_EMA_DIR, "tensorboard", "wandb")
            or (name.startswith("data-") and name.endswith(".json")) or name.endswith(PART_SUFFIX) or _leftover(name))


def _leftover(name: str) -> bool:
    """What a run killed while writing leaves: the export being built (``.tmp-final``) or the one it replaced
    (``.old-final``), a JSON or metrics file half written (``….tmp``). A resumed run deletes them and writes again."""
    return (name in tuple(f"{prefix}{d}" for prefix in (".tmp-", ".old-") for d in (FINAL_DIR, FINAL_EMA_DIR))
            or name == METRICS_FILE + ".tmp" or (name.startswith("data-") and name.endswith(".json.tmp")))


def clear_leftovers(out: Path) -> None:
    """Delete what a killed run left half written in ``out`` (:func:`_leftover`)."""
    import shutil

    for entry in Path(out).iterdir() if Path(out).is_dir() else ():
        if _leftover(entry.name):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)

__all__ = ["CONFIG_FILE", "FINAL_DIR", "FINAL_EMA_DIR", "METRICS_FILE", "TRAIN_INFO", "StepInfo", "TrainResult",
           "Trainer", "TrainingAborted", "load_for_training", "no_decay", "train"]


@dataclass
class StepInfo:
    """What a callback gets after every optimizer step (``model`` is the unwrapped, trainable model)."""

    step: int
    stage: str
    loss: float
    lr: float
    grad_norm: float
    skipped: str | None
    model: Any
    trainer: Trainer


@dataclass
class TrainResult:
    out_dir: Path
    step: int
    #: ``[(step, loss)]`` of the steps this call ran.
    losses: list[tuple[int, float]] = field(default_factory=list)
    skipped: int = 0
    final_dir: Path | None = None
    ema_dir: Path | None = None
    resumed_from: int | None = None
    seconds: float = 0.0
    #: Where this call trained (``cuda:0``, ``cpu``); None when it found the run already finished.
    device: str | None = None
    #: Where the run that exported ``final_dir`` trained: ``{"device", "hardware"}`` as its
    #: ``ropekit_train.json`` records it — also when this call found the run finished (a study killed between a
    #: training's export and its bookkeeping still knows where the model came from); None before ropekit kept it.
    trained_on: dict[str, str] | None = None


def no_decay(name: str, param: torch.Tensor) -> bool:
    """Weight decay is not applied to biases and normalisation weights (every tensor with fewer than two
    dimensions), as in GPT-2/LLaMA training and transformers' Trainer. A parameter DeepSpeed ZeRO-3 built
    partitioned (``zero3_init_flag``) is built as an empty 1-D tensor: its own shape is ``ds_shape``."""
    return len(getattr(param, "ds_shape", param.shape)) < 2 or name.endswith(".bias")


def load_for_training(cfg: TrainConfig, progress: bool = False):
    """``(model, tokenizer)`` for ``cfg.model`` (float32 unless ``model.dtype`` says otherwise)."""
    if cfg.model.name == "tiny-pretrained":
        model = pretrain_tiny(progress=progress)  # trained once (about a minute), then loaded from the cache
        if cfg.model.attn_implementation != "sdpa":
            model.set_attn_implementation(cfg.model.attn_implementation)
        return model.to(getattr(torch, cfg.model.dtype)), byte_tokenizer()
    loaded = load_model(cfg.model.name, dtype=cfg.model.dtype, attn_implementation=cfg.model.attn_implementation)
    return loaded.model, loaded.tokenizer


def _optimizer(model, train_cfg) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters, without weight decay on biases and norms (:func:`no_decay`)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise RopekitError("no parameter is trainable", "check train.lora (target_modules / trainable)")
    groups = [
        {"params": [p for n, p in named if not no_decay(n, p)], "weight_decay": train_cfg.weight_decay},
        {"params": [p for n, p in named if no_decay(n, p)], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    return torch.optim.AdamW(groups, lr=train_cfg.lr, betas=train_cfg.betas, eps=train_cfg.eps)


class Trainer:
    """One training run from a recipe; use :func:`train`."""

    def __init__(self, cfg: TrainConfig, accelerator, *, resume: bool, dataset=None, model=None, tokenizer=None,
                 callbacks: Iterable[Callable[[StepInfo], None]] = (), progress: bool = True, console=None,
                 notes: Iterable[str] = (), own_files: Iterable[Path] = ()):
        self.cfg = cfg
        self.notes = list(notes)
        self._held_note: str | None = None
        #: Each stage's data fingerprint (:func:`data_fingerprint`), and the one the resumed checkpoint recorded.
        self._fingerprints: dict[int, str] = {}
        self._resumed_data: tuple[int, str] | None = None
        self.own_files = list(own_files)
        self.acc = accelerator
        self.strategy = AccelerateStrategy(accelerator, cfg.train.context_parallel)
        self.resume = resume
        self.dataset_source = dataset
        self.given_model, self.given_tokenizer = model, tokenizer
        self.callbacks = list(callbacks)
        self.show_progress = progress
        self.out = cfg.require_output()
        self.plan = plan(cfg)
        self.world = accelerator.num_processes
        self.is_main = accelerator.is_main_process
        if console is None:
            from rich.console import Console

            console = Console(stderr=True, emoji=False)
        self.console = console
        self.guard = LossGuard(cfg.train.guard)
        self.tokens_seen = 0
        self.step = 0
        self.metrics: MetricsFile | None = None
        self._trackers: list = []
        self._closers: list = []
        self._datasets: dict[int, Any] = {}
        self._stage_index: int | None = None  # the stage whose method and batches are in place
        self._checkpointing: bool | None = None  # gradient checkpointing, once decided (model.gradient_checkpointing)
        self._batches = None

    @property
    def skipped(self) -> int:
        return self.guard.skipped

    # ---- the run directory -----------------------------------------------------------------------------
    def _check_out_dir(self) -> tuple[int, Path] | None:
        return check_resume(self.out, self.cfg, self.resume, self.own_files)

    def _trained_on(self) -> dict[str, str]:
        device = str(self.acc.device)
        return {"device": device, "hardware": hardware_name(device)}

    def _recorded_placement(self) -> dict[str, str] | None:
        try:
            recorded = json.loads((self.out / FINAL_DIR / TRAIN_INFO).read_text()).get("trained_on")
        except (OSError, json.JSONDecodeError):
            return None
        return recorded if isinstance(recorded, dict) and recorded.get("device") else None

    def _finished_already(self) -> bool:
        return self.resume and _finished_already(self.out, self.cfg)

    # ---- the parts -------------------------------------------------------------------------------------
    def _load_model(self, *, may_partition: bool = True, progress: bool = False):
        with self.strategy.model_construction(may_partition):
            return load_for_training(self.cfg, progress=progress)

    def _build(self, stage_index: int) -> None:
        """The model with its method (and adapters, checkpointing, context parallelism), the optimizer, the
        strategy's wrapping of both, and the EMA."""
        cfg, strategy = self.cfg, self.strategy
        if self.given_model is not None:
            model, tokenizer = self.given_model, self.given_tokenizer
        else:
            model, tokenizer = self._load_model(progress=self.show_progress and self.is_main)
        self.tokenizer = tokenizer
        for stage in self.plan:  # every stage's parameters are checked against the model before anything runs
            check_method(model, stage.config.method)
        self.installed = self.plan[stage_index].config.method
        install(model, self.installed)
        self._walk_stage_switches(model, stage_index)
        strategy.check_context_parallel(model, [stage.config.method for stage in self.plan])
        if cfg.train.lora is not None:
            model = apply_lora(model, cfg.train.lora, seed=cfg.train.seed, own_weights=self._own_weights(model))
        strategy.enable_context_parallel(model, base_model(model), {s.config.micro_batch_size for s in self.plan})
        if self._checkpointing is None:  # decided once for the run: the longest stage's step
            self._checkpointing = self._choose_checkpointing(model)
        if self._checkpointing:
            inner = base_model(model)
            kwargs = {"use_reentrant": False}  # works with frozen embeddings (LoRA) and DDP
            if hasattr(inner, "activation_checkpointing_enable"):  # transformers ≥ 5.x name
                inner.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            inner.config.use_cache = False
        model.train()
        self._note_half_precision_weights(model)
        optimizer = _optimizer(model, cfg.train)
        if strategy.deepspeed:
            strategy.configure_deepspeed(self.plan, cfg.train)
        self.model, self.optimizer, self.unwrapped = strategy.prepare(model, optimizer)
        self.param_dtype = next(self.unwrapped.parameters()).dtype
        self.trainable_names = [n for n, p in self.unwrapped.named_parameters() if p.requires_grad]
        self.ema = None
        if cfg.train.ema is not None:
            params = [(n, p) for n, p in self.unwrapped.named_parameters() if p.requires_grad]
            self.ema = EMA(params, cfg.train.ema.decay, cfg.train.ema.every)

    def _note_half_precision_weights(self, model) -> None:
        """One line when the weights AdamW updates are held in 16 bits: an update smaller than half a unit in the
        last place of a weight rounds away (bfloat16 keeps 8 significant bits), so at the papers' learning rates most
        steps change few weights; the usual recipe is float32 weights with 16-bit compute."""
        if self.strategy.deepspeed:  # DeepSpeed keeps float32 master weights of its own
            return
        dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
        half = sorted(str(d).replace("torch.", "") for d in dtypes if d in (torch.bfloat16, torch.float16))
        if half:
            self._note(f"the trainable weights are held in {', '.join(half)}, with no float32 copy: AdamW updates "
                       "below half a unit in their last place round away; for 16-bit speed keep model.dtype: float32 "
                       "and set train.precision: bf16 (autocast)")

    def _choose_checkpointing(self, model) -> bool:
        """``model.gradient_checkpointing`` as set, or for ``auto`` from the memory plan of the recipe's largest
        step against what is free on the training device (:func:`ropekit.train.plan.choose_checkpointing`; said in
        one line when it turns checkpointing on). With several processes each decides from its own device's free
        memory and plans as if unsharded (DDP): an upper bound for FSDP and ZeRO."""
        setting = self.cfg.model.gradient_checkpointing
        if setting != "auto":
            return bool(setting)
        from .plan import choose_checkpointing, plan_shape, recipe_shape

        device = self.acc.device
        free = free_memory(device)
        if free is None:
            return False
        inner = base_model(model)
        config = inner.config.get_text_config() if hasattr(inner.config, "get_text_config") else inner.config
        # counted on the model itself (ZeRO-3 keeps a partitioned parameter's full size in ds_numel), with its adapters
        sizes = [(getattr(p, "ds_numel", p.numel()), p.requires_grad) for p in inner.parameters()]
        counts = (sum(n for n, _ in sizes), sum(n for n, trained in sizes if trained))
        shape = dict(recipe_shape(self.cfg), gpus=self.world, strategy="ddp",
                     context_parallel=self.cfg.train.context_parallel, counts=counts)
        try:
            plain, checkpointed = (plan_shape(config, checkpointing=flag, **shape) for flag in (False, True))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a config without a decoder's shape
            self._note(f"gradient checkpointing: auto cannot plan this model's memory ({exc}); left off "
                       "(set model.gradient_checkpointing: true to turn it on)")
            return False
        on_device = [p for p in inner.parameters() if p.device == torch.device(device)]
        resident = sum(p.numel() * p.element_size() for p in on_device)
        choice = choose_checkpointing(plain, checkpointed, free_bytes=free, resident_bytes=resident)
        if choice.on:
            self._note(choice.describe(str(device)))
        return choice.on

    def _check_resumed_data(self, stage: StagePlan, summary: dict[str, Any]) -> None:
        """Refuse a resume whose stage reads other rows than the run trained on: another Python's built-in corpus,
        a data file edited since. Before the stage's data record is written, so the run's record stays."""
        fingerprint = data_fingerprint(summary)
        self._fingerprints[stage.index] = fingerprint
        if self._resumed_data is not None and self._resumed_data[0] == stage.index and self._resumed_data[1] != fingerprint:
            raise RopekitError(f"--resume: the training data of stage {stage.name} differs from what the run in "
                               f"'{self.out}' trained on (fingerprint {self._resumed_data[1]} in its checkpoint, "
                               f"{fingerprint} now; data-{stage.name}.json describes the run's)",
                               "resume where the same data is read (the built-in corpus is the running Python's "
                               "standard library), or start a new --out")

    def _dataset(self, stage: StagePlan, *, hold_note: bool = False):
        """The stage's data (kept while the stage runs). ``hold_note``: its one-line summary is said when the stage
        begins, not now (the run reads its first stage's data before it has set anything up)."""
        if stage.index in self._datasets:
            if not hold_note and self._held_note:
                self._note(self._held_note)
            self._held_note = None
            return self._datasets[stage.index]
        source = self.dataset_source
        if source is None:
            cache = stage.config.data.cache_dir
            if cache is None:
                cache = str(cache_root() / "train-data")
            with self.acc.main_process_first():  # the others then read the tokenisation cache it wrote
                dataset = build_dataset(stage.config.data.spec, self.tokenizer, stage.config.seq_len,
                                        stage_seed(self.cfg.train.seed, stage.index), cache,
                                        shuffle=stage.config.data.shuffle)
            summary = getattr(dataset, "summary", None)
            if summary is not None:
                self._check_resumed_data(stage, summary)
            if self.is_main and summary is not None:
                self.out.mkdir(parents=True, exist_ok=True)
                ckpt.write_json_atomic(self.out / f"data-{stage.name}.json", json_safe(summary))
                said = (f"data for stage {stage.name}: {summary.get('items')} sequences of {stage.config.seq_len} tokens "
                        f"({summary.get('mode')}); details in {self.out / f'data-{stage.name}.json'}")
                if hold_note:
                    self._held_note = said
                else:
                    self._note(said)
        elif callable(source) and not isinstance(source, torch.utils.data.Dataset):
            dataset = source(stage.config, self.tokenizer)
        else:
            dataset = source
        self._datasets = {stage.index: dataset}  # one stage's data in memory at a time
        return dataset

    def _note_positions_past_window(self, stage) -> None:
        """One line when a stage's PoSE or RandPos positions reach past the window the installed method declares:
        PoSE sets its target from the extended window (α = L_t/L_c), so beyond it the positions get angles the method
        was not set up for — what a plain-RoPE control does on purpose, and a too-small factor does by mistake."""
        window = getattr(base_model(self.unwrapped).config, "max_position_embeddings", None)
        for kind in ("pose", "randpos"):
            part = (stage.config.data.spec or {}).get(kind)
            target = part.get("target_length") if isinstance(part, dict) else None
            if window and target and target > window:
                self._note(f"stage {stage.name}: {kind} positions reach {target:,}, past the {window:,}-token window "
                           f"the model declares (method {stage.config.method.name or 'none'}); if this is not a "
                           f"control on purpose, extend with factor ≥ {target / window:g} (or target_length: {target})")

    def _walk_stage_switches(self, model, stage_index: int) -> None:
        """Switch ``model`` through the later stages' methods and back, before anything trains, so that a stage whose
        switch would replace weights is refused now rather than after the stages before it have trained (their work
        would be lost with the run). A walk that replaces nothing leaves every parameter the same object; the random
        state is kept, so the run is the one it would have been."""
        methods = [stage.config.method for stage in self.plan[stage_index:]]
        if not any(switch_changes(a, b) for a, b in zip(methods, methods[1:])):
            return
        before = dict(model.named_parameters())
        with torch.random.fork_rng(devices=[]):
            for old, stage in zip(methods, self.plan[stage_index + 1:]):
                if switch(model, old, stage.config.method):
                    self._refuse_new_trainable_weights(stage, before, model)
            switch(model, methods[-1], methods[0])

    def _refuse_new_trainable_weights(self, stage, before: dict[str, torch.nn.Parameter], model=None) -> None:
        """A stage whose method brings trainable weights of its own (CLEX's ODE, built afresh when its parameters
        change; Landmark's new embedding row) would train nothing of them: the optimizer and the EMA were built over
        the first stage's parameters. Refused in one line rather than exporting untrained weights — at the start of
        the run (:meth:`_walk_stage_switches`, ``model`` given: every parameter compared) and again at the switch
        itself (the trainable ones)."""
        after = {n: p for n, p in (model or self.unwrapped).named_parameters() if model is not None or p.requires_grad}
        changed = sorted(set(before) ^ set(after)) + sorted(n for n in set(before) & set(after) if before[n] is not after[n])
        if changed:
            shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
            raise RopekitError(
                f"stage {stage.name}: method {stage.config.method.name or 'none'} "
                f"{json.dumps(stage.config.method.params)} replaces trainable weights ({shown}) that the optimizer, "
                "built for the first stage, does not hold, so they would not train",
                "train this stage as its own run from the previous stage's output, or give the method the same "
                "parameters in every stage")

    def _begin_stage(self, step: int) -> None:
        """When step ``step`` opens a stage: its method switched in, the optimizer reset if it asks, its batches."""
        stage_index, done = locate(self.plan, step - 1)
        if stage_index == self._stage_index:
            return
        stage = self.plan[stage_index]
        new_method = stage.config.method
        trained = {n: p for n, p in self.unwrapped.named_parameters() if p.requires_grad}
        if switch(base_model(self.unwrapped), self.installed, new_method):
            self._refuse_new_trainable_weights(stage, trained)
            self._note(f"stage {stage.name}: method {new_method.name or 'none'} {json.dumps(new_method.params)}")
            self.strategy.rotary_rebuilt(base_model(self.unwrapped))
        self.installed = new_method
        if done == 0:
            self._note_positions_past_window(stage)
        if done == 0 and stage.index > 0 and stage.config.reset_optimizer:
            getattr(self.optimizer, "optimizer", self.optimizer).state.clear()  # fresh Adam moments
        dataset = self._dataset(stage)
        order = SampleOrder(len(dataset), self.cfg.train.seed, stage.index, stage.config.data.shuffle)
        loader = make_loader(
            dataset, order, start_step=done, steps=min(stage.steps, self.cfg.last_step - stage.start),
            micro_batch_size=stage.config.micro_batch_size, grad_accum=stage.config.grad_accum,
            processes=self.strategy.data_world, rank=self.strategy.data_rank,
            num_workers=stage.config.data.num_workers, pin_memory=self.acc.device.type == "cuda",
        )
        self._stage_index, self._batches = stage_index, iter(loader)

    def _micro_batches(self, step: int) -> list[dict[str, torch.Tensor]]:
        """The next ``grad_accum`` micro-batches of the stage's loader (the loop asks for the steps in order; the
        loader itself started at the stage's first step not yet done)."""
        return [next(self._batches) for _ in range(self.plan[self._stage_index].config.grad_accum)]

    def _lr(self, step: int) -> float:
        stage_index, done = locate(self.plan, step - 1)
        return lr_at(self.cfg.train, self.plan[stage_index].config, done + 1)

    def _method_step(self, step: int) -> None:
        """The method's per-step hook (CLEX draws the step's scale), seeded by (seed, step) for --resume."""
        if self.installed.name is not None:
            generator = torch.Generator().manual_seed(self.cfg.train.seed * 1_000_003 + step)
            get_method(self.installed.name).training_step_hook(base_model(self.unwrapped), step, generator)

    def parts(self, result: TrainResult, bar: runtime.ProgressTask) -> Parts:
        """The loop's parts for this recipe; ``result`` and ``bar`` receive every step."""
        return Parts(
            model=self.model, optimizer=self.optimizer, strategy=self.strategy,
            objective=TokenMeanLoss(self.model, self.unwrapped, self.strategy, self.param_dtype, self.acc.device),
            data=self._micro_batches, schedule=self._lr, max_grad_norm=self.cfg.train.max_grad_norm,
            guard=self.guard, ema=self.ema, begin=[self._begin_stage, self._method_step],
            end=[lambda record: self._after_step(record, result, bar)],
        )

    # ---- state -----------------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        index, done = locate(self.plan, self.step)
        return {
            "step": self.step,
            "stage_index": index,
            "stage": self.plan[index].name,
            "stage_step": done,
            "scheduler": {"stage_step": done, "next_lr_step": done + 1},
            "data": {"stage": index, "samples_consumed": done * self.plan[index].config.micro_batch_size
                     * self.plan[index].config.grad_accum * self.strategy.data_world, "processes": self.world,
                     "context_parallel": self.strategy.cp_size, "fingerprint": self._fingerprints.get(index)},
            "guard": self.guard.state_dict(),
            "tokens_seen": self.tokens_seen,
            "ema_updates": self.ema.updates if self.ema is not None else None,
            "rotary_longest": ckpt.rotary_longest(base_model(self.unwrapped)),
            "config": json_safe(self.cfg.to_dict()),
        }

    def _restore(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.guard.load_state_dict(state["guard"])
        self.tokens_seen = int(state["tokens_seen"])
        longest = state.get("rotary_longest") or []
        ran, _ = locate(self.plan, max(0, self.step - 1))  # the stage whose method the saved frequencies belong to
        now, _ = locate(self.plan, self.step)
        if now != ran and switch_changes(self.plan[ran].config.method, self.plan[now].config.method):
            # saved at the end of a stage whose method the next one replaces: the uninterrupted run switches in a
            # fresh rotary here, which has seen no input yet (Dynamic NTK's longest length starts over)
            longest = []
        ckpt.restore_rotary(base_model(self.unwrapped), longest, self.param_dtype, self.acc.device)
        guard_then = (state.get("config", {}).get("train") or {}).get("guard")
        guard_now = json_safe(self.cfg.to_dict())["train"].get("guard")
        if guard_then != guard_now:
            then, now = guard_then or {}, guard_now or {}
            changed = ", ".join(f"{k} {then.get(k)} → {now.get(k)}" for k in sorted(set(then) | set(now))
                                if then.get(k) != now.get(k))
            self._note(f"train.guard changed on resume: {changed or f'{guard_then} → {guard_now}'}")
        data = state.get("data", {})
        if data.get("fingerprint"):  # checkpoints written before fingerprints were recorded have none to compare
            self._resumed_data = (int(data.get("stage", 0)), str(data["fingerprint"]))
        processes, cp = data.get("processes", self.world), data.get("context_parallel", self.strategy.cp_size)
        if processes != self.world or cp != self.strategy.cp_size:
            # each step's samples are read at stream positions counted in the run's processes: with another count
            # the resumed steps would read samples trained on already, with another global batch
            raise RopekitError(f"--resume: the checkpoint was written by {processes} processes (context parallel "
                               f"{cp}) and this launch has {self.world} (context parallel {self.strategy.cp_size}); "
                               "the data order and the global batch depend on them",
                               f"resume with {processes} processes and the same context parallelism, or start a new --out")

    def _note(self, text: str) -> None:
        if self.is_main:  # one line, also in a log file (rich would wrap it at 80 columns off a terminal)
            self.console.print(text, highlight=False, soft_wrap=True)

    # ---- export ----------------------------------------------------------------------------------------
    def _rebuilt(self):
        """A fresh copy of the model with the run's method and adapters, built whole on the main process."""
        source, _ = self._load_model(may_partition=False)
        install(source, self.installed)
        if self.cfg.train.lora is not None:
            source = apply_lora(source, self.cfg.train.lora, seed=self.cfg.train.seed, own_weights=self._own_weights(source))
        return source

    def _own_weights(self, model) -> list[torch.nn.Parameter]:
        """The installed method's own weights (CLEX's ODE), which train under LoRA as in a full fine-tune."""
        return get_method(self.installed.name).own_weights(model) if self.installed.name else []

    def _export(self, directory: Path) -> None:
        info = {"step": self.step, "stage": self.plan[locate(self.plan, max(0, self.step - 1))[0]].name,
                "tokens_seen": self.tokens_seen, "skipped": self.skipped,
                "ema": directory.name == FINAL_EMA_DIR, "config": json_safe(self.cfg.to_dict()),
                "trained_on": self._trained_on()}
        export_model(directory, strategy=self.strategy, model=self.model, unwrapped=self.unwrapped,
                     rebuild=self._rebuilt, tokenizer=self.tokenizer, info=info)

    def _export_all(self) -> tuple[Path | None, Path | None]:
        if not self.cfg.output.save_final:
            return None, None
        final = self.out / FINAL_DIR
        ema_dir = None
        if self.ema is not None:  # before final: a run whose final exists has written every export it owes
            ema_dir = self.out / FINAL_EMA_DIR
            with self.ema.swap():
                self._export(ema_dir)
        self._export(final)
        self.acc.wait_for_everyone()
        return final, ema_dir

    # ---- the run ---------------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        cfg = self.cfg
        started = time.perf_counter()
        found = self._check_out_dir()
        if self.resume and self.is_main:
            clear_leftovers(self.out)  # a kill during the export: its half-built directory goes, the export is redone
        if self._finished_already():
            self._note(f"{self.out} is already trained to step {cfg.last_step}; nothing to do")
            return TrainResult(out_dir=self.out, step=cfg.last_step, final_dir=self.out / FINAL_DIR,
                               ema_dir=self.out / FINAL_EMA_DIR if cfg.train.ema is not None else None,
                               losses=logged_losses(self.out, cfg.last_step)[-1:], trained_on=self._recorded_placement())
        self.acc.wait_for_everyone()
        start_step = found[0] if found else 0
        stage_index, _ = locate(self.plan, start_step)
        self._build(stage_index)
        resumed_from = None
        if found:
            state = ckpt.load(self.acc, found[1], self.ema)
            self._restore(state)
            resumed_from = self.step
            self._note(f"resuming {self.out} from step {self.step} ({found[1].name})")
        elif self.resume:
            self._note(f"no checkpoint in {self.out}: starting at step 0")
        # the data of the stage it starts in, read before anything is written: a data file that is empty or has no
        # text is one line with the output directory as it was, and the fixed command is not "an earlier run"
        self._dataset(self.plan[stage_index], hold_note=True)
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            import yaml

            with atomic_file(self.out / CONFIG_FILE, overwrite=True, what="the run's config copy") as tmp:
                tmp.write_text(yaml.safe_dump(json_safe(cfg.to_dict()), sort_keys=False))
            self.metrics = MetricsFile(self.out, self.step)
            self._trackers, self._closers = start_trackers(cfg.output, self.out, self.step, cfg.to_dict())
        self.acc.wait_for_everyone()
        result = TrainResult(out_dir=self.out, step=self.step, resumed_from=resumed_from, device=str(self.acc.device),
                             trained_on=self._trained_on())
        for note in self.notes:  # said once the run is set up: a refusal before it stays the one line on stderr
            self._note(note)
        try:
            self._loop(result)
            self._close()
            result.final_dir, result.ema_dir = self._export_all()
        finally:
            self._close()
            self._release_model()
        result.step, result.skipped = self.step, self.skipped
        result.seconds = time.perf_counter() - started
        return result

    def _release_model(self) -> None:
        """The caller's model as it was handed in: accelerate's mixed-precision ``prepare`` wrapped its ``forward``
        in bf16 autocast, which would stay on it (its logits then differed from ``DIR/final``'s by ~3e-3)."""
        acc, model = getattr(self.strategy, "acc", None), getattr(self, "model", None)
        if acc is not None and model is not None:
            acc.unwrap_model(model, keep_fp32_wrapper=False)

    def _close(self) -> None:
        self.strategy.close()
        if self.metrics is not None:
            self.metrics.close()
        for close in self._closers:
            close()
        self._closers = []

    def _loop(self, result: TrainResult) -> None:
        shown = self.show_progress and self.is_main
        with runtime.progress("training", total=self.cfg.last_step, completed=self.step, console=self.console,
                              enabled=shown) as bar:
            train_loop(self.parts(result, bar), self.step, self.cfg.last_step)

    def _after_step(self, record: StepRecord, result: TrainResult, bar: runtime.ProgressTask) -> None:
        cfg = self.cfg
        self.step = record.step
        self.tokens_seen += record.tokens
        row = {
            "step": record.step, "stage": self.plan[self._stage_index].name, "loss": record.loss, "lr": record.lr,
            "grad_norm": record.grad_norm, "tokens": record.tokens, "loss_tokens": record.loss_tokens,
            "total_tokens": self.tokens_seen, "seconds": record.seconds, "skipped": record.skipped,
        }
        if self.is_main:
            self.metrics(row)
            for tracker in self._trackers:
                tracker(row)
        result.losses.append((row["step"], row["loss"]))
        rate = row["tokens"] / row["seconds"] if row["seconds"] > 0 else 0.0
        bar.update(completed=row["step"], info=f"loss {row['loss']:.4f}  lr {row['lr']:.2e}  {rate:,.0f} tok/s  {row['stage']}")
        if self.is_main and (row["step"] % cfg.output.log_every == 0 or row["skipped"]):
            self.console.print(console_line(row, cfg.last_step), highlight=False)
        for callback in self.callbacks:
            callback(StepInfo(step=row["step"], stage=row["stage"], loss=row["loss"], lr=row["lr"],
                              grad_norm=row["grad_norm"], skipped=row["skipped"], model=self.unwrapped, trainer=self))
        self.guard.enforce(row["step"], row["skipped"])
        every = cfg.output.save_every
        if every and row["step"] % every == 0:
            ckpt.save(self.acc, self.out, row["step"], self._state(), self.ema, cfg.output.keep_last)
            if self.is_main:
                self.metrics.sync()


def train(cfg: TrainConfig, *, resume: bool = False, dataset=None, model=None, tokenizer=None,
          callbacks: Iterable[Callable[[StepInfo], None]] = (), progress: bool = True, console=None,
          notes: Iterable[str] = (), own_files: Iterable[Path] = ()) -> TrainResult:
    """Run the training described by ``cfg``.

    ``dataset``: a map-style dataset of training items (see :mod:`ropekit.train.data`), or a callable
    ``(stage_config, tokenizer) -> dataset``; by default each stage's ``data:`` section is built with
    ``build_training_data``. ``model``/``tokenizer`` replace loading ``cfg.model.name``. ``callbacks`` are
    called after every optimizer step with a :class:`StepInfo`. ``resume`` continues from the newest
    checkpoint in ``output.dir`` (or starts at step 0 when there is none). ``notes`` are lines said on the console
    once the run is set up (its checks passed), before the first step. ``own_files``: files the user gave this run
    (its config) that may lie in ``output.dir`` (:func:`check_run_dir`).
    """
    # a process group this call sets up is torn down by it (below); one the caller set up is the caller's
    group_was_up = torch.distributed.is_available() and torch.distributed.is_initialized()
    accelerator = make_accelerator(cfg.train.precision)
    threads = cfg.train.threads
    if threads is None:  # one CPU process: 2, or 1 on a busy machine; under a launcher torch's setting is kept
        single_cpu = accelerator.num_processes == 1 and not has_accelerator_device()
        threads = default_threads() if single_cpu else torch.get_num_threads()
    try:
        with runtime.deterministic(threads, algorithms=cfg.train.deterministic), torch.random.fork_rng(devices=device_ids()):
            torch.manual_seed(cfg.train.seed)
            trainer = Trainer(cfg, accelerator, resume=resume, dataset=dataset, model=model, tokenizer=tokenizer,
                              callbacks=callbacks, progress=progress, console=console, notes=notes,
                              own_files=own_files)
            result = trainer.run()
        if accelerator.num_processes > 1:
            accelerator.wait_for_everyone()  # no rank tears the group down while another still uses it
        return result
    finally:
        reset_accelerate(accelerator, destroy_group=not group_was_up)
