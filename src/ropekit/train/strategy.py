"""How a training step's gradient is made and applied: the distribution strategy of :mod:`ropekit.train.loop`.

Two strategies share one interface (``place``, ``reduce_sum``, ``accumulate``, ``backward``, ``update``):

* :class:`LocalStrategy`: one process, plain torch; the built-in models' pre-training
  (:mod:`ropekit.train.pretrain`, :mod:`ropekit.train.builtin_base`);
* :class:`AccelerateStrategy`: Accelerate's single CPU process, DDP, FSDP2 and DeepSpeed ZeRO under
  ``accelerate launch`` (on a CPU-only machine ``accelerate launch --multi_gpu --num_processes 2`` starts two
  gloo processes, and the FSDP2/ZeRO configs run there too, see :func:`sharded_on_cpu`; accelerate's
  ``--cpu`` flag selects its single-process launcher), with DeepSpeed-Ulysses context parallelism
  (:mod:`ropekit.train.context_parallel`) on top.

``update`` clips the gradients (the total norm is returned either way), asks the loss guard's verdict and
steps the optimizer unless the verdict is a skip. DeepSpeed's engine clips and updates inside ``step()`` and
decides its own skip (non-finite gradients), so a skip on the loss alone is refused under it
(:meth:`AccelerateStrategy.configure_deepspeed`).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .. import runtime
from ..errors import RopekitError
from . import context_parallel as cp

#: ``verdict(grad_norm) -> skip reason or None``: the loss guard's decision on a step (see loss_guard).
Verdict = Callable[[float], "str | None"]


class LocalStrategy:
    """One process, plain torch: ``loss.backward()``, ``clip_grad_norm_``, ``optimizer.step()``."""

    world = 1
    is_main = True
    deepspeed = False

    def place(self, micro: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        return micro

    def reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def accumulate(self, model, last: bool):
        return contextlib.nullcontext()

    def backward(self, model, loss: torch.Tensor) -> None:
        loss.backward()

    def update(self, model, optimizer, max_norm: float | None, n_labels: int, verdict: Verdict) -> tuple[float, str | None]:
        limit = max_norm if max_norm is not None else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), limit)) if n_labels > 0 else float("nan")
        skipped = verdict(grad_norm)
        if skipped is None:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, skipped


class AccelerateStrategy:
    """Accelerate (single process, DDP, FSDP2, DeepSpeed ZeRO) with optional context parallelism.

    With context parallelism, groups of ``cp_size`` processes share their samples and split each sequence:
    ``data_world``/``data_rank`` say which samples this process reads, ``cp_index`` which part of each.
    """

    def __init__(self, accelerator, cp_size: int = 1):
        self.acc = accelerator
        self.world = accelerator.num_processes
        self.rank = accelerator.process_index
        self.is_main = accelerator.is_main_process
        self.device = accelerator.device
        self.cp_size = cp_size
        self.data_world, self.data_rank, self.cp_index = cp.data_layout(self.world, self.rank, cp_size)
        self._cp_disable = None
        self._cp_group = None
        self._cp_hooks: list = []

    @property
    def deepspeed(self) -> bool:
        return self.acc.distributed_type.name == "DEEPSPEED"

    @property
    def gathers_on_export(self) -> bool:
        """FSDP and ZeRO-3 shard the weights: the export gathers them into a fresh copy on the main process."""
        from accelerate.utils import DistributedType

        zero3 = self.deepspeed and self.acc.state.deepspeed_plugin.zero_stage == 3
        return self.acc.distributed_type == DistributedType.FSDP or zero3

    # ---- setup ---------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def model_construction(self, may_partition: bool = True):
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

    def configure_deepspeed(self, plan, train_cfg) -> None:
        """Fill the DeepSpeed config from the recipe, which stays the one source of the batch and clipping.

        ropekit keeps its own optimizer (torch AdamW, a ZeRO "client optimizer"), learning-rate schedule and
        loss normalisation; DeepSpeed partitions the optimizer state and gradients (ZeRO-2) and the weights
        (ZeRO-3), clips by ``max_grad_norm`` and skips a step whose gradients are not finite — its update
        happens inside ``engine.step()``, so a skip decided on the loss alone (the spike guard) is refused.
        """
        shapes = {(s.config.micro_batch_size, s.config.grad_accum) for s in plan}
        if len(shapes) > 1:
            raise RopekitError("under DeepSpeed every stage must keep micro_batch_size and grad_accum (its engine "
                               "fixes the batch at start)", "use the same batch in every stage, or FSDP")
        if any(s.config.reset_optimizer for s in plan):
            raise RopekitError("reset_optimizer is not available under DeepSpeed (its ZeRO optimizer owns the Adam "
                               "moments)", "drop reset_optimizer from the stages, or train with FSDP")
        if train_cfg.guard.spike_factor is not None:
            raise RopekitError("train.guard.spike_factor is not available under DeepSpeed: its engine updates the "
                               "weights inside step() and cannot skip on the loss",
                               "set train.guard.spike_factor: null (DeepSpeed still skips non-finite gradients)")
        if not train_cfg.guard.skip_nonfinite:
            raise RopekitError("train.guard.skip_nonfinite: false is not available under DeepSpeed: its engine always "
                               "skips a step with non-finite gradients", "set train.guard.skip_nonfinite: true")
        micro, accum = shapes.pop()
        ds = self.acc.state.deepspeed_plugin.deepspeed_config
        ds["train_micro_batch_size_per_gpu"] = micro
        ds["gradient_accumulation_steps"] = accum
        # DeepSpeed's own bookkeeping: it averages gradients over every process (with context parallelism too,
        # as DDP and FSDP do), which the trainer's loss normalisation expects
        ds["train_batch_size"] = micro * accum * self.world
        ds["gradient_clipping"] = float(train_cfg.max_grad_norm) if train_cfg.max_grad_norm is not None else 0.0
        zero = ds.setdefault("zero_optimization", {})
        if int(zero.get("stage", 0)) == 3:
            zero["stage3_gather_16bit_weights_on_model_save"] = True  # the final export gathers the full weights
        if isinstance(ds.get("bf16"), dict) and ds["bf16"].get("enabled") in (True, "true", "auto"):
            ds["bf16"]["check_grad_overflow"] = True  # otherwise ZeRO-1/2 in bf16 would apply non-finite steps

    def check_context_parallel(self, model, methods) -> None:
        """Refuse, before anything runs, a model or any stage's method that Ulysses cannot split."""
        if self.cp_size > 1:
            cp.check_model(model, self.cp_size)
            for method in methods:
                cp.check_method(model, method, self.cp_size)

    def enable_context_parallel(self, model, inner, micro_batch_sizes: set[int]) -> None:
        """Wrap attention in Ulysses and split the rotary embedding of ``inner`` (the base model)."""
        if self.cp_size == 1:
            return
        if len(micro_batch_sizes) > 1:
            raise RopekitError("with context parallelism every stage must keep micro_batch_size (Ulysses fixes it "
                               "at start)", "use the same micro_batch_size in every stage")
        self._cp_disable, self._cp_group = cp.enable(model, self.cp_size, next(iter(micro_batch_sizes)))
        self._cp_hooks = cp.split_rotary(inner, self._cp_group, self.cp_index, self.cp_size)

    def rotary_rebuilt(self, inner) -> None:
        """A method switch built new rotary modules: split them too."""
        if self._cp_disable is not None:
            self._cp_hooks += cp.split_rotary(inner, self._cp_group, self.cp_index, self.cp_size)

    def prepare(self, model, optimizer):
        """``(wrapped model, wrapped optimizer, unwrapped model)``."""
        model, optimizer = self.acc.prepare(model, optimizer)
        return model, optimizer, self.acc.unwrap_model(model)

    def close(self) -> None:
        """The model and the sdpa kernel are whole again (export, later use)."""
        if self._cp_disable is not None:
            for handle in self._cp_hooks:
                handle.remove()
            self._cp_hooks = []
            self._cp_disable()
            self._cp_disable = None

    # ---- one step ------------------------------------------------------------------------------------------
    def place(self, micro: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        """The micro-batches on this process's device, cut to its part of each sequence under context parallelism."""
        micro = [{k: v.to(self.device, non_blocking=True) for k, v in b.items()} for b in micro]
        if self.cp_size > 1:
            micro = [cp.shard(b, self.cp_index, self.cp_size) for b in micro]
        return micro

    def reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        return self.acc.reduce(value, "sum") if self.world > 1 else value

    @contextlib.contextmanager
    def accumulate(self, model, last: bool):
        """Gradients are synchronised across processes only at the last micro-batch of a step."""
        if self.deepspeed:  # the engine reduces gradients at the boundary
            model.set_gradient_accumulation_boundary(last)
            yield
        elif last:
            yield
        else:
            with self.acc.no_sync(model):
                yield

    def backward(self, model, loss: torch.Tensor) -> None:
        if self.deepspeed:  # the loss is already normalised over the whole step
            model.backward(loss, scale_wrt_gas=False)
        else:
            self.acc.backward(loss)

    def update(self, model, optimizer, max_norm: float | None, n_labels: int, verdict: Verdict) -> tuple[float, str | None]:
        if self.deepspeed:  # the engine clips, updates and zeroes its gradients inside step(), or skips
            if n_labels == 0:
                return float("nan"), "no_label_tokens"
            model.step()
            norm = model.get_global_grad_norm()
            norm = float(norm) if norm is not None else float("nan")
            return norm, (None if model.was_step_applied() else "nonfinite")
        limit = max_norm if max_norm is not None else float("inf")
        grad_norm = self.acc.clip_grad_norm_(model.parameters(), limit) if n_labels > 0 else None
        grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
        skipped = verdict(grad_norm)
        if skipped is None:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, skipped


# ---- the Accelerator --------------------------------------------------------------------------------------------
def has_accelerator_device() -> bool:
    xpu = getattr(torch, "xpu", None)
    mps = getattr(torch.backends, "mps", None)
    return bool(torch.cuda.is_available() or (xpu is not None and xpu.is_available())
                or (mps is not None and mps.is_available()))


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def sharded_on_cpu(kind: str, mixed_precision: str):
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


def ddp_options():
    """How a multi-process run wraps the model in DDP: the gradients are views of DDP's all-reduce buckets
    (``gradient_as_bucket_view``). PyTorch's default keeps the buckets beside the gradients, a second copy of every
    trainable parameter's gradient on each GPU that ``ropekit train plan`` does not count (measured in
    tests/train/test_plan.py); with views the gradients are the buckets, as the plan counts them."""
    from accelerate.utils import DistributedDataParallelKwargs

    return DistributedDataParallelKwargs(gradient_as_bucket_view=True)


def make_accelerator(precision_setting: str):
    """The Accelerator of a run whose ``train.precision`` is ``precision_setting``, as the launch set it up."""
    from accelerate import Accelerator

    runtime.route_deepspeed_logs_to_stderr()  # accelerate imports it: its log lines would land on stdout
    steps = os.environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "").strip()
    if steps and steps != "1":
        # set by a DeepSpeed launch's config (or by hand): the engine's accumulation is ropekit's train.grad_accum,
        # which would silently replace it, and without DeepSpeed accelerate's backward() would divide the
        # step-normalised loss by it once more (gradients, their logged norm and the clipping all scaled by 1/N)
        raise RopekitError(f"accelerate was launched with gradient_accumulation_steps {steps}, but ropekit accumulates "
                           "by itself (train.grad_accum) and normalises each step's loss over all its micro-batches",
                           "launch without --gradient_accumulation_steps (and without it in the accelerate config); "
                           "set train.grad_accum instead")
    on_cpu = not has_accelerator_device()
    precision = "bf16" if precision_setting == "bf16" else "no"
    if on_cpu and precision == "bf16":
        from ..runtime.devices import native_cpu_bf16

        if native_cpu_bf16() is None:  # measured here: 2 steps of SmolLM2 at 256 tokens took 12 min, not seconds
            warnings.warn("train.precision bf16 on this CPU: it has no native bfloat16 matmul (AMX-BF16, AVX512-BF16), "
                          "so autocast emulates it, far slower than fp32; set train.precision: fp32 here", stacklevel=2)
    if on_cpu and _env_flag("ACCELERATE_USE_FSDP"):
        accelerator = sharded_on_cpu("FSDP", precision)
    elif on_cpu and _env_flag("ACCELERATE_USE_DEEPSPEED"):
        accelerator = sharded_on_cpu("DeepSpeed", precision)
    else:
        # Without a GPU, accelerate sets up torch.distributed (gloo) only when told to run on the CPU;
        # otherwise every process of a multi-process launch would train alone.
        accelerator = Accelerator(mixed_precision=precision, cpu=on_cpu, kwargs_handlers=[ddp_options()])
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world != accelerator.num_processes:
        raise RopekitError(f"launched as {world} processes but accelerate set up {accelerator.num_processes}",
                           "launch with `accelerate launch --multi_gpu --num_processes N` (or torchrun)")
    return accelerator


def reset_accelerate(accelerator, *, destroy_group: bool = False) -> None:
    """Forget accelerate's process-wide state after a run, so a later run in the same process may use another
    precision. ``destroy_group``: the run set up a torch.distributed group (a multi-process launch) and it is
    destroyed here. Left to the interpreter's exit, the group's C++ threads were torn down in no fixed order, and
    one rank of a finished FSDP2 run on gloo aborted with "terminate called without an active exception"
    (exit -6, once in CI). A group set up by the caller is kept, and with it accelerate's state."""
    import torch.distributed as dist

    if accelerator.num_processes > 1 and not destroy_group:
        return
    if accelerator.num_processes > 1 and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def device_ids() -> list[Any]:
    """The CUDA devices whose generators a run forks (none on a CPU machine)."""
    return [torch.cuda.current_device()] if torch.cuda.is_available() else []
