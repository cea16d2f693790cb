"""One training sequence split across processes: DeepSpeed's Ulysses sequence parallelism.

With ``train.context_parallel: N`` every group of ``N`` consecutive processes reads the same micro-batches
and each process keeps one contiguous ``1/N`` of every sequence. Inside attention, DeepSpeed's
``UlyssesSPAttentionHF`` swaps the split from the sequence to the heads with an all-to-all, so each
process attends over the whole sequence for ``heads/N`` heads, and swaps back (Jacobs et al. 2023,
DeepSpeed-Ulysses). Everything outside attention (embeddings, MLPs, norms, the rotary embedding, the
loss) only ever sees the process's own tokens — which is why 64k–128k sequences fit.

What ropekit has to get right around it, and does here:

* **positions are global**: a shard keeps the position ids of its tokens in the whole sequence (PoSE's
  skipped positions included), so the rotary embedding of every token equals the unsplit one;
* **the label shift happens before the split**: the target of a shard's last token is the first token of
  the next shard, so targets are shifted over the whole sequence and then cut (:func:`shard`);
* **the mask is plain causal**: Ulysses drops 4-D masks (they would be O(n²) over the gathered sequence)
  and sdpa then attends causally over the whole sequence, so padding and document masks are refused;
* **the rotary embedding sees the whole sequence**: methods whose frequencies depend on the input's length
  (Dynamic NTK, LongRoPE's switch, CLEX) read it from the position ids, so every rotary module gathers its
  group's position ids (a few integers per token), computes cos/sin as the unsplit model would, and keeps its
  shard's rows (:func:`split_rotary`);
* **attention stays the model's**: methods that replace attention (Self-Extend, LongLoRA's S²-attention, …)
  replace the very kernel Ulysses wraps, so they are refused (:func:`check_method`).

The loss needs nothing new: each process sums its shard's token losses and the trainer's normalisation
by the global label count (summed over all processes) already gives the unsplit mean.
"""

from __future__ import annotations

import torch

from ..adapters.transformers import attn_implementation
from ..errors import RopekitError
from ..install import resolve_params
from .config import MethodConfig

#: The attention kernel Ulysses wraps; the only one every CPU and GPU machine has.
CORE_ATTENTION = "sdpa"


def check_method(model, method: MethodConfig, size: int) -> None:
    """Refuse in one line a method that cannot train with its sequences split across ``size`` processes."""
    if size == 1 or method.name is None:
        return
    m, info, params = resolve_params(model, method.name, **method.params)
    spec = m.attention(info, params)
    if spec is not None and not spec.is_empty():
        raise RopekitError(f"{method.name} changes attention itself, which context parallelism (Ulysses) replaces "
                           "with its own all-to-all around sdpa", "train it with context_parallel: 1")


def check_model(model, size: int) -> None:
    """Refuse in one line a model Ulysses cannot split ``size`` ways."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = config.num_attention_heads
    if heads % size:
        raise RopekitError(f"context_parallel {size} does not divide the model's {heads} attention heads "
                           "(Ulysses gives every process the same number of heads)",
                           f"use a context_parallel that divides {heads}")
    implementation = attn_implementation(config)
    if implementation != CORE_ATTENTION:
        raise RopekitError(f"context parallelism runs on sdpa attention, not {implementation!r}",
                           "set model.attn_implementation: sdpa")


def data_layout(world: int, rank: int, size: int) -> tuple[int, int, int]:
    """``(data-parallel processes, this process's data rank, its place in its sequence group)``."""
    if world % size:
        raise RopekitError(f"context_parallel {size} does not divide the {world} processes",
                           f"launch a multiple of {size} processes")
    return world // size, rank // size, rank % size


def shard(batch: dict[str, torch.Tensor], index: int, size: int) -> dict[str, torch.Tensor]:
    """This process's contiguous ``1/size`` of every sequence in ``batch``, with targets shifted first.

    The result has ``input_ids``, ``position_ids`` (global), ``attention_mask`` (ones) and ``targets``: the
    next-token labels of the shard's tokens over the whole sequence (−100 after the last token).
    """
    mask = batch["attention_mask"]
    if mask.dim() != 2 or not bool(mask.all()):
        what = "a document mask" if mask.dim() != 2 else "padding"
        raise RopekitError(f"this batch has {what}, which context parallelism (Ulysses) cannot apply: it attends "
                           "causally over the whole sequence", "pack without document masks or padding, or use context_parallel: 1")
    length = batch["input_ids"].shape[1]
    if length % size:
        raise RopekitError(f"context_parallel {size} does not divide the sequence length {length}",
                           f"use a seq_len that is a multiple of {size}")
    labels = batch["labels"]
    targets = torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), -100)], dim=1)
    part = slice(index * length // size, (index + 1) * length // size)
    return {"input_ids": batch["input_ids"][:, part], "position_ids": batch["position_ids"][:, part],
            "attention_mask": mask[:, part], "targets": targets[:, part]}


class _GatherPositions:
    """Forward pre-hook + hook of a rotary module: run it on the group's whole position ids, return this shard's
    rows of cos/sin. Registered first, so the length rules (``LengthSchedule``, transformers' dynamic update)
    see the whole sequence's positions."""

    def __init__(self, group, index: int, size: int):
        self.group, self.index, self.size = group, index, size
        self.local = 0

    def before(self, module, args, kwargs):
        position_ids = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        if position_ids is None:
            return None
        parts = [torch.empty_like(position_ids) for _ in range(self.size)]
        torch.distributed.all_gather(parts, position_ids.contiguous(), group=self.group)
        self.local = position_ids.shape[1]
        whole = torch.cat(parts, dim=1)
        if "position_ids" in kwargs:
            return args, {**kwargs, "position_ids": whole}
        return (args[0], whole, *args[2:]), kwargs

    def after(self, module, args, kwargs, output):
        part = slice(self.index * self.local, (self.index + 1) * self.local)
        return tuple(o[:, part] for o in output)


def split_rotary(model, group, index: int, size: int) -> list:
    """Make every rotary module of ``model`` compute on the group's whole sequence; returns the hooks' handles
    (``handle.remove()`` undoes it). Modules already split are skipped, so it may be called again after a stage
    switch has built new rotary modules."""
    from ..install import rotary_modules

    handles = []
    for _, _, rotary in rotary_modules(model):
        if any(isinstance(getattr(h, "__self__", None), _GatherPositions) for h in rotary._forward_pre_hooks.values()):
            continue
        hook = _GatherPositions(group, index, size)
        handles.append(rotary.register_forward_pre_hook(hook.before, with_kwargs=True, prepend=True))
        handles.append(rotary.register_forward_hook(hook.after, with_kwargs=True))
    return handles


def enable(model, size: int, micro_batch_size: int):
    """Put Ulysses around the sdpa kernel for a ``size``-way split; returns ``(the function that takes it off,
    the sequence-parallel process group)``."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        raise RopekitError("context parallelism uses DeepSpeed's Ulysses attention, and deepspeed is not installed",
                           "pip install 'ropekit[deepspeed]', or use context_parallel: 1")
    import deepspeed
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from ..adapters.transformers import global_attention_function, set_global_attention_function

    if not torch.distributed.is_initialized():
        raise RopekitError(f"context_parallel {size} needs {size} processes or more",
                           f"launch with `accelerate launch --num_processes {size}` (or torchrun)")
    deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())  # adopts the running process group
    original = global_attention_function(CORE_ATTENTION)
    groups = UlyssesSPAttentionHF.register_with_transformers(model, CORE_ATTENTION, size, micro_batch_size,
                                                             seq_length_is_variable=True, disable_in_eval=True)

    def disable() -> None:
        set_global_attention_function(CORE_ATTENTION, original)

    return disable, groups.get_sequence_parallel_group()
