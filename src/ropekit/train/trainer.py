"""The training loop: continual pre-training / fine-tuning for context extension on Accelerate.

One code path for a single CPU process, DDP, FSDP2 and DeepSpeed ZeRO under ``accelerate launch`` (on a
CPU-only machine ``accelerate launch --multi_gpu --num_processes 2`` starts two gloo processes, and the
FSDP2/ZeRO configs run there too, see :func:`_sharded_on_cpu`; accelerate's ``--cpu`` flag selects its
single-process launcher). What a step does:

1. the learning rate of the step is set (:func:`ropekit.train.curriculum.lr_at`; a pure function of the
   step, so it needs no scheduler state);
2. this process's ``grad_accum`` micro-batches are read (:mod:`ropekit.train.data`: the global batch of a
   step is fixed by the step number, whatever the number of processes);
3. the loss is the mean next-token cross-entropy over **all label tokens of the global batch**: the
   label-token count ``N`` is summed over processes first, each micro-batch backpropagates
   ``sum of its token losses × P / N`` (``P`` processes; DDP averages gradients over processes, which
   cancels ``P``), so 1 process × accumulation 2 and 2 processes × accumulation 1 compute the same
   gradient, and a padded or masked token never weighs more than another;
4. gradients are clipped (``max_grad_norm``; the total norm is logged either way);
5. the loss guard may skip the update (non-finite loss or gradient norm, or a loss spike); otherwise the
   optimizer steps and the EMA is updated;
6. metrics go to ``DIR/metrics.jsonl`` (one JSON object per optimizer step), the console, and
   TensorBoard / W&B when asked; checkpoints every ``save_every`` steps (:mod:`ropekit.train.checkpoint`).

At the end the model is exported with :func:`ropekit.save_pretrained` to ``DIR/final`` (LoRA merged first),
so ``ropekit.load(DIR/final)`` gives it back with its method, and the EMA weights to ``DIR/final-ema``.

Determinism: the run is seeded (``train.seed``) inside a forked torch RNG (the caller's generator state
is restored afterwards), CPU threads are fixed (``train.threads``; by default, for one CPU process,
:func:`ropekit.runtime.default_threads`), and
``torch.use_deterministic_algorithms(True, warn_only=True)`` is on by default. A resumed run reproduces the
losses of an uninterrupted one (tests/train/test_train_resume.py).
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .. import runtime
from ..core.jsonsafe import json_safe
from ..errors import RopekitError
from ..install import installed, save_pretrained
from ..methods import get_method
from ..models.byte_tokenizer import byte_tokenizer
from ..models.loading import load_model
from ..runtime import cache_root, default_threads, quiet_transformers
from ..runtime.atomic import atomic_file
from . import checkpoint as ckpt
from . import context_parallel as cp
from .config import TrainConfig
from .curriculum import StagePlan, check_method, install, locate, lr_at, plan, switch
from .data import SampleOrder, build_dataset, make_loader, model_attention_mask
from .ema import EMA
from .lora import apply_lora, base_model, merged_copy
from .pretrain import pretrain_tiny

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
FINAL_DIR = "final"
FINAL_EMA_DIR = "final-ema"
TRAIN_INFO = "ropekit_train.json"


class TrainingAborted(RopekitError):
    """The loss guard skipped more steps than ``train.guard.max_skipped`` allows."""


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


# ---- helpers ------------------------------------------------------------------------------------------------
def _config_diff(saved, current, prefix: str = "") -> str | None:
    """The first setting whose value differs (``output`` may change on resume), or ``None``."""
    if isinstance(saved, dict) and isinstance(current, dict):
        order = ("model", "method", "data", "train", "stages")
        keys = sorted(set(saved) | set(current), key=lambda k: (order.index(k) if k in order else len(order), k))
        for key in keys:
            if not prefix and key == "output":
                continue
            found = _config_diff(saved.get(key), current.get(key), f"{prefix}.{key}" if prefix else key)
            if found:
                return found
        return None
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        for i, (a, b) in enumerate(zip(saved, current)):
            found = _config_diff(a, b, f"{prefix}[{i}]")
            if found:
                return found
        return None
    return None if saved == current else f"{prefix} ({saved!r} in the run, {current!r} now)"


def _targets(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The next-token labels of ``batch``'s positions that have one."""
    return batch["targets"] if "targets" in batch else batch["labels"][:, 1:]


def no_decay(name: str, param: torch.Tensor) -> bool:
    """Weight decay is not applied to biases and normalisation weights (every tensor with fewer than two
    dimensions), as in GPT-2/LLaMA training and transformers' Trainer."""
    return param.ndim < 2 or name.endswith(".bias")


def load_for_training(cfg: TrainConfig, progress: bool = False):
    """``(model, tokenizer)`` for ``cfg.model`` (float32 unless ``model.dtype`` says otherwise)."""
    if cfg.model.name == "tiny-pretrained":
        model = pretrain_tiny(progress=progress)  # trained once (about a minute), then loaded from the cache
        if cfg.model.attn_implementation != "sdpa":
            model.set_attn_implementation(cfg.model.attn_implementation)
        return model.to(getattr(torch, cfg.model.dtype)), byte_tokenizer()
    loaded = load_model(cfg.model.name, dtype=cfg.model.dtype, attn_implementation=cfg.model.attn_implementation)
    return loaded.model, loaded.tokenizer


# ---- the trainer ----------------------------------------------------------------------------------------------
class Trainer:
    """One training run; use :func:`train`."""

    def __init__(self, cfg: TrainConfig, accelerator, *, resume: bool, dataset=None, model=None, tokenizer=None,
                 callbacks: Iterable[Callable[[StepInfo], None]] = (), progress: bool = True, console=None):
        self.cfg = cfg
        self.acc = accelerator
        self.resume = resume
        self.dataset_source = dataset
        self.given_model, self.given_tokenizer = model, tokenizer
        self.callbacks = list(callbacks)
        self.show_progress = progress
        self.out = cfg.require_output()
        self.plan = plan(cfg)
        self.world = accelerator.num_processes
        self.rank = accelerator.process_index
        # with context parallelism, groups of cp_size processes share their samples and split each sequence
        self.cp_size = cfg.train.context_parallel
        self.data_world, self.data_rank, self.cp_index = cp.data_layout(self.world, self.rank, self.cp_size)
        self._cp_disable = None
        self._cp_hooks: list = []
        self.is_main = accelerator.is_main_process
        if console is None:
            from rich.console import Console

            console = Console(stderr=True)
        self.console = console
        self.guard_history: collections.deque = collections.deque(maxlen=cfg.train.guard.spike_window)
        self.skipped = 0
        self.tokens_seen = 0
        self.step = 0
        self._trackers: list = []
        self._datasets: dict[int, Any] = {}

    # ---- output directory ------------------------------------------------------------------------------
    def _check_out_dir(self) -> tuple[int, Path] | None:
        out = self.out
        if out.exists() and not out.is_dir():
            raise RopekitError(f"output.dir '{out}' exists and is a file", "pass a directory path with --out")
        found = ckpt.latest(out)
        if not self.resume:
            if out.is_dir() and any((out / name).exists() for name in (METRICS_FILE, ckpt.CHECKPOINTS, FINAL_DIR)):
                held = f"checkpoints up to step {found[0]}" if found else "an earlier run"
                raise RopekitError(f"output.dir '{out}' already holds {held}",
                                   "pass --resume to continue it, or choose a new --out")
            return None
        if found is None:
            return None
        state = ckpt.read_state(found[1])
        diff = _config_diff(state.get("config", {}), json_safe(self.cfg.to_dict()))
        if diff:
            raise RopekitError(f"--resume: the config differs from the run in '{out}': {diff}",
                               "resume with the run's config (its copy is DIR/config.yaml), or start a new --out")
        return found

    def _finished_already(self) -> bool:
        info = self.out / FINAL_DIR / TRAIN_INFO
        if not (self.resume and info.is_file()):
            return False
        try:
            done = json.loads(info.read_text())
        except json.JSONDecodeError:
            return False
        return done.get("step") == self.cfg.last_step and _config_diff(done.get("config", {}), json_safe(self.cfg.to_dict())) is None

    # ---- model and optimizer ---------------------------------------------------------------------------
    def _build(self, stage_index: int):
        cfg = self.cfg
        if self.given_model is not None:
            model, tokenizer = self.given_model, self.given_tokenizer
        else:
            with self._model_construction():
                model, tokenizer = load_for_training(cfg, progress=self.show_progress and self.is_main)
        self.tokenizer = tokenizer
        for stage in self.plan:  # every stage's parameters are checked against the model before anything runs
            check_method(model, stage.config.method)
        self.installed = self.plan[stage_index].config.method
        install(model, self.installed)
        if self.cp_size > 1:
            cp.check_model(model, self.cp_size)
            for stage in self.plan:
                cp.check_method(model, stage.config.method, self.cp_size)
        if cfg.train.lora is not None:
            model = apply_lora(model, cfg.train.lora, seed=cfg.train.seed)
        if self.cp_size > 1:
            if len({s.config.micro_batch_size for s in self.plan}) > 1:
                raise RopekitError("with context parallelism every stage must keep micro_batch_size (Ulysses fixes it "
                                   "at start)", "use the same micro_batch_size in every stage")
            self._cp_disable, self._cp_group = cp.enable(model, self.cp_size, self.plan[stage_index].config.micro_batch_size)
            self._cp_hooks = cp.split_rotary(base_model(model), self._cp_group, self.cp_index, self.cp_size)
        if cfg.model.gradient_checkpointing:
            inner = base_model(model)
            kwargs = {"use_reentrant": False}  # works with frozen embeddings (LoRA) and DDP
            if hasattr(inner, "activation_checkpointing_enable"):  # transformers ≥ 5.x name
                inner.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            inner.config.use_cache = False
        model.train()
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise RopekitError("no parameter is trainable", "check train.lora (target_modules / trainable)")
        groups = [
            {"params": [p for n, p in named if not no_decay(n, p)], "weight_decay": cfg.train.weight_decay},
            {"params": [p for n, p in named if no_decay(n, p)], "weight_decay": 0.0},
        ]
        groups = [g for g in groups if g["params"]]
        optimizer = torch.optim.AdamW(groups, lr=cfg.train.lr, betas=cfg.train.betas, eps=cfg.train.eps)
        if self.deepspeed:
            self._configure_deepspeed()
        self.model, self.optimizer = self.acc.prepare(model, optimizer)
        self.unwrapped = self.acc.unwrap_model(self.model)
        self.param_dtype = next(self.unwrapped.parameters()).dtype
        self.trainable_names = [n for n, p in self.unwrapped.named_parameters() if p.requires_grad]
        self.ema = None
        if cfg.train.ema is not None:
            params = [(n, p) for n, p in self.unwrapped.named_parameters() if p.requires_grad]
            self.ema = EMA(params, cfg.train.ema.decay, cfg.train.ema.every)

    def _configure_deepspeed(self) -> None:
        """Fill the DeepSpeed config from the recipe, which stays the one source of the batch and clipping.

        ropekit keeps its own optimizer (torch AdamW, a ZeRO "client optimizer"), learning-rate schedule and
        loss normalisation; DeepSpeed partitions the optimizer state and gradients (ZeRO-2) and the weights
        (ZeRO-3), clips by ``max_grad_norm`` and skips a step whose gradients are not finite — its update
        happens inside ``engine.step()``, so a skip decided on the loss alone (the spike guard) is refused.
        """
        cfg = self.cfg
        shapes = {(s.config.micro_batch_size, s.config.grad_accum) for s in self.plan}
        if len(shapes) > 1:
            raise RopekitError("under DeepSpeed every stage must keep micro_batch_size and grad_accum (its engine "
                               "fixes the batch at start)", "use the same batch in every stage, or FSDP")
        if any(s.config.reset_optimizer for s in self.plan):
            raise RopekitError("reset_optimizer is not available under DeepSpeed (its ZeRO optimizer owns the Adam "
                               "moments)", "drop reset_optimizer from the stages, or train with FSDP")
        if cfg.train.guard.spike_factor is not None:
            raise RopekitError("train.guard.spike_factor is not available under DeepSpeed: its engine updates the "
                               "weights inside step() and cannot skip on the loss",
                               "set train.guard.spike_factor: null (DeepSpeed still skips non-finite gradients)")
        if not cfg.train.guard.skip_nonfinite:
            raise RopekitError("train.guard.skip_nonfinite: false is not available under DeepSpeed: its engine always "
                               "skips a step with non-finite gradients", "set train.guard.skip_nonfinite: true")
        micro, accum = shapes.pop()
        ds = self.acc.state.deepspeed_plugin.deepspeed_config
        ds["train_micro_batch_size_per_gpu"] = micro
        ds["gradient_accumulation_steps"] = accum
        # DeepSpeed's own bookkeeping: it averages gradients over every process (with context parallelism too,
        # as DDP and FSDP do), which the trainer's loss normalisation expects
        ds["train_batch_size"] = micro * accum * self.world
        ds["gradient_clipping"] = float(cfg.train.max_grad_norm) if cfg.train.max_grad_norm is not None else 0.0
        zero = ds.setdefault("zero_optimization", {})
        if int(zero.get("stage", 0)) == 3:
            zero["stage3_gather_16bit_weights_on_model_save"] = True  # the final export gathers the full weights
        if isinstance(ds.get("bf16"), dict) and ds["bf16"].get("enabled") in (True, "true", "auto"):
            ds["bf16"]["check_grad_overflow"] = True  # otherwise ZeRO-1/2 in bf16 would apply non-finite steps

    @contextlib.contextmanager
    def _model_construction(self, may_partition: bool = True):
        """Build the model whole unless the DeepSpeed config asks for ZeRO-3 partitioned construction.

        Accelerate registers the DeepSpeed config with transformers whatever ``zero3_init_flag`` says, and
        transformers then builds every model under ``deepspeed.zero.Init``: the weights are partitioned as
        they are made (a collective), and a randomly initialised model gets other values than the same seed
        gives on one process. With the flag off (the shipped configs), or for the copy the main process alone
        builds at export, the registration is lifted while the model is built.
        """
        plugin = self.acc.state.deepspeed_plugin if self.deepspeed else None
        if plugin is None or (may_partition and plugin.zero3_init_flag):
            yield
            return
        from ..adapters.transformers import unset_deepspeed_config

        unset_deepspeed_config()
        try:
            yield
        finally:
            plugin.set_deepspeed_weakref()

    @property
    def deepspeed(self) -> bool:
        return self.acc.distributed_type.name == "DEEPSPEED"

    def _dataset(self, stage: StagePlan):
        if stage.index in self._datasets:
            return self._datasets[stage.index]
        source = self.dataset_source
        if source is None:
            cache = stage.config.data.cache_dir
            if cache is None:
                cache = str(cache_root() / "train-data")
            with self.acc.main_process_first():  # the others then read the tokenisation cache it wrote
                dataset = build_dataset(stage.config.data.spec, self.tokenizer, stage.config.seq_len, self.cfg.train.seed,
                                        cache, shuffle=stage.config.data.shuffle)
            summary = getattr(dataset, "summary", None)
            if self.is_main and summary is not None:
                self.out.mkdir(parents=True, exist_ok=True)
                ckpt.write_json_atomic(self.out / f"data-{stage.name}.json", json_safe(summary))
                self._note(f"data for stage {stage.name}: {summary.get('items')} sequences of {stage.config.seq_len} tokens "
                           f"({summary.get('mode')}); details in {self.out / f'data-{stage.name}.json'}")
        elif callable(source) and not isinstance(source, torch.utils.data.Dataset):
            dataset = source(stage.config, self.tokenizer)
        else:
            dataset = source
        self._datasets = {stage.index: dataset}  # one stage's data in memory at a time
        return dataset

    # ---- one optimizer step ----------------------------------------------------------------------------
    def _forward_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Sum of next-token cross-entropies over the label tokens of ``batch`` (float32)."""
        record = installed(base_model(self.unwrapped))
        if record:  # the method's own form of a training batch (Landmark inserts its tokens)
            batch = get_method(record["method"]).training_batch(batch, record["params"])
        mask = model_attention_mask(batch["attention_mask"], base_model(self.unwrapped), self.param_dtype,
                                    batch["position_ids"])
        out = self.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask,
                         use_cache=False)
        if "targets" in batch:  # a context-parallel shard: shifted over the whole sequence before the split
            logits, targets = out.logits, batch["targets"]
        else:
            logits, targets = out.logits[:, :-1], batch["labels"][:, 1:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                               ignore_index=-100, reduction="sum")

    def _reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        return self.acc.reduce(value, "sum") if self.world > 1 else value

    def _spike(self, loss: float) -> bool:
        guard = self.cfg.train.guard
        if guard.spike_factor is None or len(self.guard_history) < min(guard.spike_window, 8):
            return False
        mean = sum(self.guard_history) / len(self.guard_history)
        return loss > guard.spike_factor * mean

    def _train_step(self, stage: StagePlan, n_in_stage: int, micro: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
        cfg = self.cfg
        started = time.perf_counter()
        lr = lr_at(cfg.train, stage.config, n_in_stage)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.installed.name is not None:  # e.g. CLEX draws the step's scale; seeded by (seed, step) for --resume
            generator = torch.Generator().manual_seed(cfg.train.seed * 1_000_003 + self.step + 1)
            get_method(self.installed.name).training_step_hook(base_model(self.unwrapped), self.step + 1, generator)
        device = self.acc.device
        micro = [{k: v.to(device, non_blocking=True) for k, v in b.items()} for b in micro]
        if self.cp_size > 1:
            micro = [cp.shard(b, self.cp_index, self.cp_size) for b in micro]
        wide = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
        counts = torch.tensor(
            [sum(int((_targets(b) != -100).sum()) for b in micro), sum(b["input_ids"].numel() for b in micro)],
            device=device, dtype=torch.int64)
        n_labels, n_tokens = (int(x) for x in self._reduce_sum(counts).tolist())
        loss_sum = torch.zeros((), device=device, dtype=wide)
        if n_labels > 0:
            scale = self.world / n_labels
            for j, batch in enumerate(micro):
                sync = j == len(micro) - 1
                if self.deepspeed:  # the engine reduces gradients at the boundary; the loss is already normalised
                    self.model.set_gradient_accumulation_boundary(sync)
                    token_loss = self._forward_loss(batch)
                    self.model.backward(token_loss * scale, scale_wrt_gas=False)
                else:
                    with contextlib.nullcontext() if sync else self.acc.no_sync(self.model):
                        token_loss = self._forward_loss(batch)
                        self.acc.backward(token_loss * scale)
                loss_sum += token_loss.detach().to(wide)
        loss = float(self._reduce_sum(loss_sum)) / n_labels if n_labels > 0 else float("nan")
        step = self.step + 1
        if self.deepspeed:
            skipped, grad_norm = self._deepspeed_update(n_labels)
        else:
            max_norm = cfg.train.max_grad_norm if cfg.train.max_grad_norm is not None else float("inf")
            grad_norm = self.acc.clip_grad_norm_(self.model.parameters(), max_norm) if n_labels > 0 else None
            grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
            skipped = None
            if n_labels == 0:
                skipped = "no_label_tokens"
            elif cfg.train.guard.skip_nonfinite and not (math.isfinite(loss) and math.isfinite(grad_norm)):
                skipped = "nonfinite"
            elif self._spike(loss):
                skipped = "spike"
            if skipped is None:
                self.optimizer.step()
        if skipped is None:
            if self.ema is not None:
                self.ema.update(step)
            self.guard_history.append(loss)
        else:
            self.skipped += 1
        if not self.deepspeed:  # the engine zeroes its own gradients inside step()
            self.optimizer.zero_grad(set_to_none=True)
        self.step = step
        self.tokens_seen += n_tokens
        return {
            "step": step, "stage": stage.name, "loss": loss, "lr": lr, "grad_norm": grad_norm,
            "tokens": n_tokens, "loss_tokens": n_labels, "total_tokens": self.tokens_seen,
            "seconds": round(time.perf_counter() - started, 6), "skipped": skipped,
        }

    def _deepspeed_update(self, n_labels: int) -> tuple[str | None, float]:
        """DeepSpeed's step: clip, update, zero the gradients — or skip when they are not finite."""
        if n_labels == 0:
            return "no_label_tokens", float("nan")
        self.model.step()
        norm = self.model.get_global_grad_norm()
        norm = float(norm) if norm is not None else float("nan")
        return (None if self.model.was_step_applied() else "nonfinite"), norm

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
                     * self.plan[index].config.grad_accum * self.data_world, "processes": self.world,
                     "context_parallel": self.cp_size},
            "guard": {"skipped": self.skipped, "history": list(self.guard_history)},
            "tokens_seen": self.tokens_seen,
            "ema_updates": self.ema.updates if self.ema is not None else None,
            "rotary_longest": self._rotary_longest(),
            "config": json_safe(self.cfg.to_dict()),
        }

    def _rotary_modules(self) -> list:
        from ..install import rotary_modules

        return [rotary for _, _, rotary in rotary_modules(base_model(self.unwrapped))]

    def _rotary_longest(self) -> list[int | None]:
        """Per rotary module, the longest input its frequencies were last grown to, or None.

        Dynamic NTK's schedule (transformers' ``max_seq_len_cached``, ropekit's ``continuous`` LengthSchedule)
        remembers the longest input since the last reset: a resumed run must start from the same frequencies
        as the uninterrupted one, not from the original window.
        """
        from ..install.installer import LengthSchedule

        found = []
        for rotary in self._rotary_modules():
            longest = None
            original = getattr(rotary, "original_max_seq_len", None)
            cached = getattr(rotary, "max_seq_len_cached", None)
            if cached is not None and original is not None and int(cached) > int(original):
                longest = int(cached)
            for hook in rotary._forward_pre_hooks.values():
                if isinstance(hook, LengthSchedule) and hook.kind == "continuous" and hook.longest > hook.length:
                    longest = max(longest or 0, int(hook.longest))
            found.append(longest)
        return found

    def _restore_rotary(self, longest: list[int | None]) -> None:
        """Grow each rotary module's frequencies to ``longest`` as the uninterrupted run had (a forward whose
        longest position is ``longest − 1`` takes the schedule's own growth path)."""
        rotaries = self._rotary_modules()
        if len(longest) != len(rotaries):
            return
        device = self.acc.device
        for rotary, length in zip(rotaries, longest):
            if length:
                with torch.no_grad():
                    rotary(torch.zeros(1, 1, 1, dtype=self.param_dtype, device=device),
                           torch.full((1, 1), length - 1, dtype=torch.long, device=device))

    def _restore(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.skipped = int(state["guard"]["skipped"])
        self.guard_history.clear()
        self.guard_history.extend(float(x) for x in state["guard"]["history"])
        self.tokens_seen = int(state["tokens_seen"])
        self._restore_rotary(state.get("rotary_longest") or [])
        processes = state.get("data", {}).get("processes", self.world)
        if processes != self.world:
            self._note(f"resuming with {self.world} processes (the checkpoint was written by {processes}); the global "
                       "batch keeps its size only if micro_batch_size × grad_accum × processes is unchanged")

    def _note(self, text: str) -> None:
        if self.is_main:
            self.console.print(text, highlight=False)

    # ---- metrics ---------------------------------------------------------------------------------------
    def _open_metrics(self, keep_until: int):
        """``metrics.jsonl`` keeping only the rows of steps ≤ ``keep_until`` (the resumed checkpoint): the
        steps after it are recomputed, so each step appears once."""
        path = self.out / METRICS_FILE
        kept = []
        if path.is_file() and keep_until > 0:
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill
                if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= keep_until:
                    kept.append(line)
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
        return open(path, "a", encoding="utf-8")

    def _logged_losses(self, until: int) -> list[tuple[int, float]]:
        """``[(step, loss)]`` of ``metrics.jsonl`` up to step ``until`` (a finished run reports its last loss)."""
        path = self.out / METRICS_FILE
        found = []
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= until \
                        and isinstance(row.get("loss"), (int, float)):
                    found.append((row["step"], float(row["loss"])))
        return found

    def _log(self, row: dict[str, Any]) -> None:
        if not self.is_main:
            return
        self.metrics.write(json.dumps(json_safe(row)) + "\n")
        self.metrics.flush()
        for tracker in self._trackers:
            tracker(row)

    def _start_trackers(self) -> None:
        if not self.is_main:
            return
        out = self.cfg.output
        if out.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(log_dir=str(self.out / "tensorboard"), purge_step=self.step + 1)

            def tb(row):
                for key in ("loss", "lr", "grad_norm"):
                    if isinstance(row.get(key), float) and math.isfinite(row[key]):
                        writer.add_scalar(f"train/{key}", row[key], row["step"])
                writer.flush()

            self._trackers.append(tb)
            self._closers = getattr(self, "_closers", []) + [writer.close]
        if out.wandb is not None:
            import hashlib

            import wandb

            # one W&B run per run directory, so that --resume continues it
            run_id = hashlib.sha1(str(self.out.resolve()).encode()).hexdigest()[:16]
            run = wandb.init(project=out.wandb.project or "ropekit", name=out.wandb.name,
                             entity=out.wandb.entity, dir=str(self.out), config=json_safe(self.cfg.to_dict()),
                             id=run_id, resume="allow")

            def wb(row):
                run.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}, step=row["step"])

            self._trackers.append(wb)
            self._closers = getattr(self, "_closers", []) + [run.finish]

    # ---- export ----------------------------------------------------------------------------------------
    def _export(self, directory: Path) -> None:
        """Save the current weights as a plain model with its method (LoRA merged) — collective."""
        from accelerate.utils import DistributedType

        zero3 = self.deepspeed and self.acc.state.deepspeed_plugin.zero_stage == 3
        if self.acc.distributed_type == DistributedType.FSDP or zero3:
            # Gather the full weights on the main process and load them into a fresh copy of the model (with
            # the same method and adapters): the sharded modules cannot be saved or merged as they are.
            state = self.acc.get_state_dict(self.model)
            if not self.is_main:
                return
            with self._model_construction(may_partition=False):
                source, _ = load_for_training(self.cfg)
            install(source, self.installed)
            if self.cfg.train.lora is not None:
                source = apply_lora(source, self.cfg.train.lora, seed=self.cfg.train.seed)
            source.load_state_dict(state)
        elif not self.is_main:
            return
        else:
            source = self.unwrapped
        plain = merged_copy(source)
        was_training = plain.training
        plain.eval()
        tmp = directory.parent / f".tmp-{directory.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            with quiet_transformers():
                save_pretrained(plain, tmp, tokenizer=self.tokenizer)
            ckpt.write_json_atomic(tmp / TRAIN_INFO, {
                "step": self.step, "stage": self.plan[locate(self.plan, max(0, self.step - 1))[0]].name,
                "tokens_seen": self.tokens_seen, "skipped": self.skipped,
                "ema": directory.name == FINAL_EMA_DIR, "config": json_safe(self.cfg.to_dict()),
            })
            ckpt.replace_dir(tmp, directory)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if was_training and plain is source:
                plain.train()

    def _export_all(self) -> tuple[Path | None, Path | None]:
        if not self.cfg.output.save_final:
            return None, None
        final = self.out / FINAL_DIR
        self._export(final)
        ema_dir = None
        if self.ema is not None:
            ema_dir = self.out / FINAL_EMA_DIR
            with self.ema.swap():
                self._export(ema_dir)
        self.acc.wait_for_everyone()
        return final, ema_dir

    # ---- the run ---------------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        cfg = self.cfg
        started = time.perf_counter()
        found = self._check_out_dir()
        if self._finished_already():
            self._note(f"{self.out} is already trained to step {cfg.last_step}; nothing to do")
            return TrainResult(out_dir=self.out, step=cfg.last_step, final_dir=self.out / FINAL_DIR,
                               losses=self._logged_losses(cfg.last_step)[-1:])
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
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            import yaml

            with atomic_file(self.out / CONFIG_FILE, overwrite=True, what="the run's config copy") as tmp:
                tmp.write_text(yaml.safe_dump(json_safe(cfg.to_dict()), sort_keys=False))
            self.metrics = self._open_metrics(self.step)
        self.acc.wait_for_everyone()
        self._start_trackers()
        result = TrainResult(out_dir=self.out, step=self.step, resumed_from=resumed_from)
        try:
            self._loop(result)
            self._close()
            result.final_dir, result.ema_dir = self._export_all()
        finally:
            self._close()
        result.step, result.skipped = self.step, self.skipped
        result.seconds = time.perf_counter() - started
        return result

    def _close(self) -> None:
        if self._cp_disable is not None:  # the model and the sdpa kernel are whole again (export, later use)
            for handle in self._cp_hooks:
                handle.remove()
            self._cp_hooks = []
            self._cp_disable()
            self._cp_disable = None
        if self.is_main and getattr(self, "metrics", None) is not None and not self.metrics.closed:
            self.metrics.close()
        for close in getattr(self, "_closers", []):
            close()
        self._closers = []

    def _loop(self, result: TrainResult) -> None:
        cfg = self.cfg
        last = cfg.last_step
        shown = self.show_progress and self.is_main
        with runtime.progress("training", total=last, completed=self.step, console=self.console, enabled=shown) as bar:
            while self.step < last:
                stage_index, done = locate(self.plan, self.step)
                stage = self.plan[stage_index]
                new_method = stage.config.method
                if switch(base_model(self.unwrapped), self.installed, new_method):
                    self._note(f"stage {stage.name}: method {new_method.name or 'none'} {json.dumps(new_method.params)}")
                    if self.cp_size > 1:  # the switch built new rotary modules
                        self._cp_hooks += cp.split_rotary(base_model(self.unwrapped), self._cp_group, self.cp_index,
                                                          self.cp_size)
                self.installed = new_method
                if done == 0 and stage.index > 0 and stage.config.reset_optimizer:
                    getattr(self.optimizer, "optimizer", self.optimizer).state.clear()  # fresh Adam moments
                dataset = self._dataset(stage)
                order = SampleOrder(len(dataset), cfg.train.seed, stage.index, stage.config.data.shuffle)
                stop = min(stage.steps, last - stage.start)
                loader = make_loader(
                    dataset, order, start_step=done, steps=stop, micro_batch_size=stage.config.micro_batch_size,
                    grad_accum=stage.config.grad_accum, processes=self.data_world, rank=self.data_rank,
                    num_workers=stage.config.data.num_workers, pin_memory=self.acc.device.type == "cuda",
                )
                batches = iter(loader)
                for n in range(done + 1, stop + 1):
                    micro = [next(batches) for _ in range(stage.config.grad_accum)]
                    row = self._train_step(stage, n, micro)
                    self._after_step(row, result, bar)

    def _after_step(self, row: dict[str, Any], result: TrainResult, bar: runtime.ProgressTask) -> None:
        cfg = self.cfg
        self._log(row)
        result.losses.append((row["step"], row["loss"]))
        rate = row["tokens"] / row["seconds"] if row["seconds"] > 0 else 0.0
        bar.update(completed=row["step"], info=f"loss {row['loss']:.4f}  lr {row['lr']:.2e}  {rate:,.0f} tok/s  {row['stage']}")
        if self.is_main and (row["step"] % cfg.output.log_every == 0 or row["skipped"]):
            note = f"  [yellow]skipped ({row['skipped']})[/]" if row["skipped"] else ""
            self.console.print(
                f"step {row['step']}/{cfg.last_step}  loss {row['loss']:.4f}  lr {row['lr']:.3e}  "
                f"|g| {row['grad_norm']:.3f}  tokens {row['total_tokens']:,}  stage {row['stage']}{note}",
                highlight=False)
        for callback in self.callbacks:
            callback(StepInfo(step=row["step"], stage=row["stage"], loss=row["loss"], lr=row["lr"],
                              grad_norm=row["grad_norm"], skipped=row["skipped"], model=self.unwrapped, trainer=self))
        if self.skipped > cfg.train.guard.max_skipped:
            raise TrainingAborted(
                f"training aborted at step {row['step']}: {self.skipped} steps skipped by the loss guard "
                f"(last: {row['skipped']}), more than train.guard.max_skipped={cfg.train.guard.max_skipped}",
                "lower train.lr, check the data, or raise train.guard.max_skipped; --resume continues from the last checkpoint",
            )
        every = cfg.output.save_every
        if every and row["step"] % every == 0:
            ckpt.save(self.acc, self.out, row["step"], self._state(), self.ema, cfg.output.keep_last)
            if self.is_main:
                os.fsync(self.metrics.fileno())


# ---- entry point ------------------------------------------------------------------------------------------------
def _has_accelerator_device() -> bool:
    xpu = getattr(torch, "xpu", None)
    mps = getattr(torch.backends, "mps", None)
    return bool(torch.cuda.is_available() or (xpu is not None and xpu.is_available())
                or (mps is not None and mps.is_available()))


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def _sharded_on_cpu(kind: str, mixed_precision: str):
    """An Accelerator running Accelerate's FSDP2 or DeepSpeed path over gloo on CPU processes.

    ``accelerate launch`` with an FSDP or DeepSpeed config exports the plugin's settings (``FSDP_*``,
    ``ACCELERATE_DEEPSPEED_*``), but Accelerate promotes a launch to them only on accelerator devices: with
    ``cpu=True`` it would train plain DDP. torch's FSDP2 (``fully_shard``) and DeepSpeed's ZeRO both run on
    CPU tensors over gloo, so the state is promoted here, after Accelerate has set up the gloo process group;
    everything else (wrapping, sharded checkpoints, gathering full weights, clipping) is the libraries' own.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DeepSpeedPlugin, DistributedType, FullyShardedDataParallelPlugin

    if mixed_precision != "no":
        raise RopekitError(f"{kind} on the CPU trains in float32 only (train.precision is {mixed_precision})",
                           "set train.precision: fp32 for a CPU run, or launch on GPUs")
    if kind == "FSDP":
        plugin = FullyShardedDataParallelPlugin()  # reads the FSDP_* settings accelerate launch exported
        if plugin.fsdp_version != 2:
            raise RopekitError(f"accelerate was launched with FSDP version {plugin.fsdp_version}, which ropekit runs "
                               "on GPUs only; on the CPU it runs FSDP2", "set fsdp_version: 2 in the accelerate config")
        accelerator = Accelerator(mixed_precision="no", cpu=True, fsdp_plugin=plugin)
    else:
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            raise RopekitError("accelerate was launched with DeepSpeed, which is not installed",
                               "pip install deepspeed (or launch with the FSDP2 config)")
        plugin = DeepSpeedPlugin()  # reads the ACCELERATE_DEEPSPEED_* settings (or the DeepSpeed config file)
        accelerator = Accelerator(mixed_precision="no", cpu=True, deepspeed_plugin=plugin)
    if accelerator.num_processes > 1:
        if kind == "FSDP":
            AcceleratorState().fsdp_plugin = plugin
            promoted = DistributedType.FSDP
        else:
            plugin.set_mixed_precision("no")
            plugin.select(_from_accelerator_state=True)
            AcceleratorState().deepspeed_plugins = plugin
            promoted = DistributedType.DEEPSPEED
        for state in (PartialState(), AcceleratorState()):
            state.distributed_type = promoted
    return accelerator


def _accelerator(cfg: TrainConfig):
    from accelerate import Accelerator

    runtime.route_deepspeed_logs_to_stderr()  # accelerate imports it: its log lines would land on stdout
    on_cpu = not _has_accelerator_device()
    precision = "bf16" if cfg.train.precision == "bf16" else "no"
    if on_cpu and precision == "bf16":
        from ..runtime.devices import native_cpu_bf16

        if native_cpu_bf16() is None:  # measured here: 2 steps of SmolLM2 at 256 tokens took 12 min, not seconds
            warnings.warn("train.precision bf16 on this CPU: it has no native bfloat16 matmul (AMX-BF16, AVX512-BF16), "
                          "so autocast emulates it, far slower than fp32; set train.precision: fp32 here", stacklevel=2)
    if on_cpu and _env_flag("ACCELERATE_USE_FSDP"):
        accelerator = _sharded_on_cpu("FSDP", precision)
    elif on_cpu and _env_flag("ACCELERATE_USE_DEEPSPEED"):
        accelerator = _sharded_on_cpu("DeepSpeed", precision)
    else:
        # Without a GPU, accelerate sets up torch.distributed (gloo) only when told to run on the CPU;
        # otherwise every process of a multi-process launch would train alone.
        accelerator = Accelerator(mixed_precision=precision, cpu=on_cpu)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world != accelerator.num_processes:
        raise RopekitError(f"launched as {world} processes but accelerate set up {accelerator.num_processes}",
                           "launch with `accelerate launch --multi_gpu --num_processes N` (or torchrun)")
    return accelerator


def _reset_accelerate(accelerator) -> None:
    """Forget accelerate's process-wide state after a single-process run, so a later run in the same process
    may use another precision (a distributed run keeps it: its process group lives on)."""
    if accelerator.num_processes == 1:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def train(cfg: TrainConfig, *, resume: bool = False, dataset=None, model=None, tokenizer=None,
          callbacks: Iterable[Callable[[StepInfo], None]] = (), progress: bool = True, console=None) -> TrainResult:
    """Run the training described by ``cfg``.

    ``dataset``: a map-style dataset of training items (see :mod:`ropekit.train.data`), or a callable
    ``(stage_config, tokenizer) -> dataset``; by default each stage's ``data:`` section is built with
    ``build_training_data``. ``model``/``tokenizer`` replace loading ``cfg.model.name``. ``callbacks`` are
    called after every optimizer step with a :class:`StepInfo`. ``resume`` continues from the newest
    checkpoint in ``output.dir`` (or starts at step 0 when there is none).
    """
    accelerator = _accelerator(cfg)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    threads = cfg.train.threads
    if threads is None:  # one CPU process: 2, or 1 on a busy machine; under a launcher torch's setting is kept
        single_cpu = accelerator.num_processes == 1 and not _has_accelerator_device()
        threads = default_threads() if single_cpu else torch.get_num_threads()
    try:
        with runtime.deterministic(threads, algorithms=cfg.train.deterministic), torch.random.fork_rng(devices=devices):
            torch.manual_seed(cfg.train.seed)
            trainer = Trainer(cfg, accelerator, resume=resume, dataset=dataset, model=model, tokenizer=tokenizer,
                              callbacks=callbacks, progress=progress, console=console)
            return trainer.run()
    finally:
        _reset_accelerate(accelerator)
