"""``ropekit train plan CONFIG --gpus N --gpu-memory GiB``: will a recipe fit, and where do the bytes go?

Per GPU, for the recipe's model shape, sequence length, precision, LoRA and parallelism:

* **weights** — parameters × bytes of the loaded dtype (``model.dtype``; ropekit keeps master weights in it),
  divided by the GPUs when sharded (FSDP / ZeRO-3);
* **gradients** — trainable parameters × the same bytes, divided when sharded (FSDP, ZeRO-2/3); under DDP the
  gradients are views of its all-reduce buckets (:func:`ropekit.train.strategy.ddp_options`), so the buckets add
  nothing;
* **optimizer** — AdamW's two moments per trainable parameter in the parameter's dtype (PyTorch keeps them there),
  divided when sharded (FSDP, ZeRO-1/2/3);
* **activations** — the tensors a decoder layer saves for the backward pass, per token:
  ``a_h·h + a_kv·h_kv + a_i·i + a_heads·heads + a_0`` bytes (h hidden size, h_kv = kv heads × head size, i the MLP
  width), counted with saved-tensor hooks on transformers' Llama layer with sdpa (flash/memory-efficient attention:
  no n×n matrix): float32 weights give (32, 8, 16, 4, 8), bf16/fp16 weights (20, 4, 8, 4, 8), float32 weights under
  bf16 autocast (``precision: bf16`` under DDP) (30, 4, 8, 4, 8) plus the bf16 copy of every linear weight (2 bytes per
  weight, the LM head's too), and a checkpointed layer's float32 input there — the two RMSNorms keep
  float32 copies, attention keeps q, k, v (k and v at the kv-head width: no copy per query head), its output and
  log-sum-exp per head, the SwiGLU MLP four i-wide tensors. With gradient checkpointing each layer keeps only its
  input (h values); one layer's full set (``recompute``) is live again while that layer is recomputed in the
  backward pass. Tokens per GPU are the micro-batch × the sequence length, divided by the context-parallel degree
  (one sequence split across GPUs). Outside the layers each token keeps ``b_h·h + b_0`` bytes: the final RMSNorm's
  float32 copies and the LM head's input (float32 weights: b_h = 14, bf16/fp16: 9), and the int64 token ids of the
  embedding and the labels plus a float32 norm scale (b_0 = 20), measured the same way;
* **logits** — the largest single tensors at long context, tokens × vocabulary × bytes, in two phases of the
  trainer's loss (:func:`ropekit.train.objective.token_loss_sum`: ``F.cross_entropy(logits[:, :-1]…
  .float())``):

  - *forward* (``logits_forward``): the logits in the compute dtype, the float32 input of the log-softmax where it
    is a copy (bf16/fp16 logits cast up, or float32 logits of a micro-batch above 1 reshaped from the sliced
    view), and the float32 log-softmax the loss keeps for backward — 8, 10 or 12 bytes per token and vocabulary
    entry;
  - *backward* (``logits_backward``): three float32 buffers at once — the saved log-softmax, the gradient the
    loss hands it and the gradient it hands back to the logits — 12 bytes, whatever the dtype; the logits of the
    forward are gone by then (nothing saves them).

**Peak.** ``total = weights + gradients + optimizer + max(forward, backward)``: gradients are counted whole for
the whole step (they are, from the second micro-batch of an accumulation step on), and the transient part is the
larger of the two phases — ``forward = activations + logits_forward`` at the end of the forward pass, and
``backward = activations + max(logits_backward, recompute)`` at the start of the backward pass (every saved
activation still alive; with checkpointing, later, one layer recomputed instead of the logits' buffers), with the
activations with or without checkpointing as the recipe sets them. Not counted: the backward of a decoder layer's
own short-lived gradient buffers and a weight-sized gradient temporary when gradients accumulate (a few per cent
at small vocabularies, far below the logits' backward at Llama's), AdamW's step temporaries, the allocator's
fragmentation and the CUDA context. The tests measure the live tensor bytes of small CPU runs of the trainer's
loss (``torch.distributed._tools.mem_tracker.MemTracker``) against this peak.

Shapes come from the model's config (a local directory, a built-in tiny model) or, for hub ids on an offline
machine, from :data:`KNOWN_SHAPES`. Parameters are counted exactly by building the model on the meta device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import RopekitError
from .config import TrainConfig

GIB = 1024**3
STRATEGIES = ("ddp", "fsdp", "zero1", "zero2", "zero3")
#: Per-layer, per-token saved-activation bytes ``(a_h, a_kv, a_i, a_heads, a_0)`` by the weights' element size, and
#: for float32 weights computed under bf16 autocast (``AUTOCAST``: the residual stream and the norms stay float32,
#: the projections' inputs and outputs are bf16), measured the same way (an exact least-squares fit over six shapes).
AUTOCAST = "autocast"
ACTIVATION_COEFFICIENTS = {4: (32, 8, 16, 4, 8), 2: (20, 4, 8, 4, 8), AUTOCAST: (30, 4, 8, 4, 8)}
#: Per-token saved bytes outside the decoder layers ``(b_h, b_0)``, keyed the same way.
HEAD_COEFFICIENTS = {4: (14, 20), 2: (9, 20), AUTOCAST: (12, 20)}
#: Bytes of a checkpointed layer's saved input per hidden unit: the residual stream's dtype (float32 under autocast).
CHECKPOINT_BYTES = {4: 4, 2: 2, AUTOCAST: 4}
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

#: Shapes of common checkpoints, for planning without their config.json (the published configs).
KNOWN_SHAPES: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-2-7b-hf": dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                     num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                                     max_position_embeddings=4096, tie_word_embeddings=False),
    "meta-llama/Llama-2-13b-hf": dict(model_type="llama", hidden_size=5120, intermediate_size=13824,
                                      num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=40,
                                      vocab_size=32000, max_position_embeddings=4096, tie_word_embeddings=False),
    "meta-llama/Llama-3.1-8B": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                    num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                    max_position_embeddings=131072, tie_word_embeddings=False),
    "mistralai/Mistral-7B-v0.1": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336,
                                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                      vocab_size=32000, max_position_embeddings=32768, tie_word_embeddings=False),
}


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU (module docstring). ``activations`` / ``activations_checkpointed`` are what the backward pass
    keeps without / with gradient checkpointing, ``recompute`` one layer's full set (checkpointing only),
    ``logits_forward`` / ``logits_backward`` the logits' buffers in each phase; ``forward`` and ``backward`` are the
    phases' transient bytes for the recipe's checkpointing setting, ``total`` weights + gradients + optimizer +
    the larger of the two, and ``fits`` compares it with ``gpu_bytes``."""

    model: str
    parameters: int
    trainable: int
    gpus: int
    strategy: str
    context_parallel: int
    tokens_per_gpu: int
    weights: int
    gradients: int
    optimizer: int
    activations: int
    activations_checkpointed: int
    recompute: int
    logits_forward: int
    logits_backward: int
    checkpointing: bool
    forward: int
    backward: int
    total: int
    gpu_bytes: int
    fits: bool

    @property
    def peak_phase(self) -> str:
        return "backward" if self.backward >= self.forward else "forward"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "peak_phase": self.peak_phase}


def model_config(name: str):
    """The transformers config of ``name``: a local directory or built-in tiny model, else a known hub id's shape."""
    from transformers import CONFIG_MAPPING

    if name in KNOWN_SHAPES:
        shape = dict(KNOWN_SHAPES[name])
        return CONFIG_MAPPING[shape.pop("model_type")](**shape)
    from ..models.loading import resolve_model

    kind, target = resolve_model(name)
    if kind == "tiny":
        from ..models.tiny import tiny_config

        return tiny_config(target)
    if kind == "dir":
        from transformers import AutoConfig

        from ..install import register

        register()  # a ropekit export's config may name a ropekit_<name> rope type
        return AutoConfig.from_pretrained(target, local_files_only=True)
    raise RopekitError(f"no offline shape for '{name}'", f"pass a local model directory, or one of {', '.join(KNOWN_SHAPES)}")


def count_parameters(config, lora=None) -> tuple[int, int]:
    """``(parameters, trainable)``: exact counts from the model built on the meta device (no memory); with LoRA,
    the adapters' ``r·(in + out)`` per targeted projection plus the fully trained extras (embeddings, norms)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..adapters.transformers import ropekit_drives_rotary

    # a count needs no frequencies: a length-dependent ropekit rope type is built as extend builds it
    with torch.device("meta"), ropekit_drives_rotary():
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    if lora is None:
        return total, total
    trainable = 0
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in lora.target_modules and isinstance(module, torch.nn.Linear):
            trainable += lora.r * (module.in_features + module.out_features)
    for name, param in model.named_parameters():
        if ("embed" in lora.trainable and "embed" in name) or ("norm" in lora.trainable and "norm" in name):
            trainable += param.numel()
    return total, trainable


def layer_bytes_per_token(config, element_bytes) -> int:
    """Bytes one decoder layer saves for backward per token (module docstring's coefficients)."""
    a_h, a_kv, a_i, a_heads, a_0 = ACTIVATION_COEFFICIENTS[element_bytes]
    h, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    return a_h * h + a_kv * kv + a_i * config.intermediate_size + a_heads * heads + a_0


def activation_bytes_per_token(config, element_bytes, *, checkpointing: bool) -> int:
    """Bytes the decoder layers keep for backward per token: every layer's set, or with checkpointing every layer's
    input only (the recomputed layer is :func:`layer_bytes_per_token`, counted apart)."""
    if checkpointing:
        return config.num_hidden_layers * config.hidden_size * CHECKPOINT_BYTES[element_bytes]
    return config.num_hidden_layers * layer_bytes_per_token(config, element_bytes)


def autocast_weight_copies(config) -> tuple[int, int]:
    """``(per decoder layer, LM head)`` bytes of the bf16 copies of the linear weights autocast saves for the backward
    pass (float32 weights, bf16 compute): 2 bytes per weight of every projection (measured: exactly that)."""
    h, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    q = heads * head_dim
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    layer = h * q + 2 * h * kv + q * h + 3 * h * config.intermediate_size
    return 2 * layer, 2 * config.vocab_size * h


def head_bytes_per_token(config, element_bytes) -> int:
    """Saved-activation bytes per token outside the decoder layers: embedding ids, final norm, LM-head input, labels."""
    b_h, b_0 = HEAD_COEFFICIENTS[element_bytes]
    return b_h * config.hidden_size + b_0


def logits_bytes_per_token(config, compute_bytes: int, micro_batch: int) -> tuple[int, int]:
    """``(forward, backward)`` bytes of the logits' buffers per token (module docstring): forward the logits, the
    float32 copy the log-softmax reads where there is one, and its float32 output; backward three float32 buffers."""
    copy = 4 if compute_bytes < 4 or micro_batch > 1 else 0
    return config.vocab_size * (compute_bytes + copy + 4), config.vocab_size * 12


def plan_shape(config, *, element_bytes: int, compute_bytes: int, micro_batch: int, seq_len: int, checkpointing: bool,
               gpus: int = 1, gpu_memory_gib: float = 80.0, strategy: str = "fsdp", context_parallel: int = 1,
               lora=None, name: str = "", counts: tuple[int, int] | None = None) -> MemoryPlan:
    """The memory plan of one model shape (a transformers config) at ``micro_batch`` × ``seq_len`` tokens.
    ``counts``: ``(parameters, trainable)`` of a model at hand, instead of counting a copy built on the meta device
    (:func:`count_parameters`; under DeepSpeed ZeRO-3 a model built at all is partitioned)."""
    if strategy not in STRATEGIES:
        raise RopekitError(f"unknown strategy '{strategy}'", f"choose one of {', '.join(STRATEGIES)}")
    if gpus < 1 or context_parallel < 1 or gpus % context_parallel:
        raise RopekitError(f"{gpus} GPUs cannot hold a context-parallel degree of {context_parallel}",
                           "pass --gpus a multiple of --context-parallel")
    parameters, trainable = counts if counts is not None else count_parameters(config, lora)
    shard_weights = strategy in ("fsdp", "zero3")
    shard_grads = strategy in ("fsdp", "zero2", "zero3")
    shard_optimizer = strategy != "ddp"
    weights = parameters * element_bytes // (gpus if shard_weights else 1)
    gradients = trainable * element_bytes // (gpus if shard_grads else 1)
    optimizer = 2 * trainable * element_bytes // (gpus if shard_optimizer else 1)
    tokens = micro_batch * seq_len // context_parallel
    # float32 weights with bf16 compute: under DDP that is autocast (float32 residual stream, bf16 weight copies kept
    # for backward); FSDP2 and DeepSpeed compute in bf16 parameters (accelerate's param_dtype), the bf16 set
    kind = AUTOCAST if (element_bytes == 4 and compute_bytes == 2 and strategy == "ddp") else compute_bytes
    copies_layer, copies_head = autocast_weight_copies(config) if kind == AUTOCAST else (0, 0)
    head = head_bytes_per_token(config, kind)
    full = (tokens * (activation_bytes_per_token(config, kind, checkpointing=False) + head)
            + config.num_hidden_layers * copies_layer + copies_head)
    checkpointed = tokens * (activation_bytes_per_token(config, kind, checkpointing=True) + head) + copies_head
    recompute = tokens * layer_bytes_per_token(config, kind) + copies_layer if checkpointing else 0
    per_token_forward, per_token_backward = logits_bytes_per_token(config, compute_bytes, micro_batch)
    logits_forward, logits_backward = tokens * per_token_forward, tokens * per_token_backward
    kept = checkpointed if checkpointing else full
    forward = kept + logits_forward
    backward = kept + max(logits_backward, recompute)
    total = weights + gradients + optimizer + max(forward, backward)
    gpu_bytes = int(gpu_memory_gib * GIB)
    return MemoryPlan(
        model=name, parameters=parameters, trainable=trainable, gpus=gpus, strategy=strategy,
        context_parallel=context_parallel, tokens_per_gpu=tokens, weights=weights, gradients=gradients,
        optimizer=optimizer, activations=full, activations_checkpointed=checkpointed, recompute=recompute,
        logits_forward=logits_forward, logits_backward=logits_backward, checkpointing=checkpointing,
        forward=forward, backward=backward, total=total, gpu_bytes=gpu_bytes, fits=total <= gpu_bytes,
    )


def recipe_shape(cfg: TrainConfig) -> dict[str, int]:
    """The element sizes and the step shape :func:`plan_shape` needs for ``cfg``: its longest stage (tokens per
    micro-batch), the loaded dtype's bytes and the compute dtype's (bf16 autocast computes in 2 bytes)."""
    element = _BYTES[cfg.model.dtype]
    stage = max(cfg.stages, key=lambda s: s.seq_len * s.micro_batch_size)
    return {"element_bytes": element, "compute_bytes": 2 if cfg.train.precision == "bf16" else element,
            "micro_batch": stage.micro_batch_size, "seq_len": stage.seq_len}


def plan_memory(cfg: TrainConfig, *, gpus: int, gpu_memory_gib: float, strategy: str = "fsdp",
                context_parallel: int = 1) -> MemoryPlan:
    """The memory plan of ``cfg``'s longest stage on ``gpus`` GPUs of ``gpu_memory_gib`` GiB each. With
    ``gradient_checkpointing: auto`` the plan is the one the trainer would choose on such GPUs
    (:func:`choose_checkpointing`, all of each GPU free)."""
    config = model_config(cfg.model.name)
    shape = dict(recipe_shape(cfg), gpus=gpus, gpu_memory_gib=gpu_memory_gib, strategy=strategy,
                 context_parallel=context_parallel, lora=cfg.train.lora, name=cfg.model.name)
    setting = cfg.model.gradient_checkpointing
    if setting == "auto":
        plain = plan_shape(config, checkpointing=False, **shape)
        setting = choose_checkpointing(plain, plan_shape(config, checkpointing=True, **shape),
                                       free_bytes=plain.gpu_bytes, resident_bytes=0).on
    return plan_shape(config, checkpointing=bool(setting), **shape)


#: Share of the free memory a step's plan may fill before ``gradient_checkpointing: auto`` turns checkpointing on.
#: The plan leaves out the allocator's fragmentation and short-lived temporaries (module docstring). Measured on a
#: CPU, where the process's own resident memory (libraries, tokenizer, data) comes on top and is already taken
#: when the free memory is read: SmolLM2-135M in float32 at 4 × 2,048 tokens peaked at 19.6 GB against a plan
#: of 18.0 GB; checkpointed in bf16 autocast at 1 × 16,384 tokens at 14.1 GiB against 11.6 GiB.
AUTO_CHECKPOINTING_SHARE = 0.85


@dataclass(frozen=True)
class CheckpointingChoice:
    """What ``gradient_checkpointing: auto`` decided: ``on``, and the bytes behind it — what a step still needs
    beyond the memory already resident (``resident``, the weights where they are loaded on the training device),
    without and with checkpointing, against ``free``."""

    on: bool
    need: int
    need_checkpointed: int
    free: int

    @property
    def fits(self) -> bool:
        """Whether the chosen setting fits the budget (checkpointing on but not enough: a step may run out)."""
        chosen = self.need_checkpointed if self.on else self.need
        return chosen <= self.free * AUTO_CHECKPOINTING_SHARE

    def describe(self, where: str) -> str:
        gib = lambda n: f"{n / GIB:,.1f} GiB"  # noqa: E731
        text = (f"gradient checkpointing on (auto): a step needs about {gib(self.need)} without it and "
                f"{gib(self.need_checkpointed)} with it; {gib(self.free)} are free on {where}")
        if not self.fits:
            text += ("; even checkpointed it may not fit: lower train.micro_batch_size (raising grad_accum keeps the "
                     "batch) or data.seq_len")
        return text + " (`ropekit train plan` shows the terms)"


def choose_checkpointing(plain: MemoryPlan, checkpointed: MemoryPlan, *, free_bytes: int,
                         resident_bytes: int) -> CheckpointingChoice:
    """``gradient_checkpointing: auto``: on exactly when the step's plan without checkpointing (``plain``) does not
    fit in :data:`AUTO_CHECKPOINTING_SHARE` of ``free_bytes``. ``resident_bytes`` is what the plans count that is
    already in memory (the loaded weights), so it is not counted twice. Checkpointing recomputes each layer's
    forward in the backward pass: the same gradients for about a third more compute."""
    need = max(plain.total - resident_bytes, 0)
    need_checkpointed = max(checkpointed.total - resident_bytes, 0)
    on = need > free_bytes * AUTO_CHECKPOINTING_SHARE
    return CheckpointingChoice(on=on, need=need, need_checkpointed=need_checkpointed, free=free_bytes)
