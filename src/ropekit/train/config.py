"""The training config: a YAML file in the style of axolotl / LLaMA-Factory, validated into dataclasses.

Sections (every key is optional unless marked *required*; ``ropekit train --example NAME`` prints complete
files)::

    model:                      # or just `model: tiny`
      name: tiny                # *required*: a MODEL as `ropekit.models.loading.load_model` accepts it
                                #   (tiny, tiny-<family>, a directory, a .gguf, smollm2, org/name), or
                                #   tiny-pretrained: the pre-trained tiny Llama built by ropekit.train.builtin_base
      dtype: float32            # float32 | bfloat16 | float16: the dtype the weights are loaded in
      attn_implementation: sdpa # sdpa | eager | flash_attention_2 | flex_attention …
      gradient_checkpointing: false
    method:                     # or `method: yarn`, or `method: none`
      name: yarn                # a ropekit method (`ropekit methods`), installed with ropekit.extend before training
      params: {factor: 4}       # its parameters (and `target_length`)
    data:
      seq_len: 256              # *required*: tokens per training sequence
      num_workers: 0            # DataLoader worker processes
      shuffle: true             # seeded orders: documents and rows (data builder), a permutation per epoch (trainer)
      cache_dir: null           # tokenisation cache (default $ROPEKIT_CACHE/train-data)
      sources: [{path: builtin}]  # … everything but num_workers/cache_dir is the data spec given to
                                #   ropekit.data.training_data.build_training_data (see its module doc):
                                #   sources, packing, pose, randpos, num_sequences
    train:
      max_steps: 100            # *required* without stages: optimizer steps
      lr: 2.0e-5
      optimizer: adamw
      betas: [0.9, 0.95]
      eps: 1.0e-8
      weight_decay: 0.0         # not applied to biases and normalisation weights
      warmup_steps: 0
      schedule: constant        # constant | linear | cosine (after the linear warm-up)
      min_lr_ratio: 0.0         # floor of linear / cosine decay, as a fraction of lr
      micro_batch_size: 1       # sequences per forward, per process
      grad_accum: 1             # micro-batches per optimizer step, per process
      max_grad_norm: 1.0        # null or 0: no clipping (the norm is still logged)
      precision: fp32           # fp32 | bf16 (autocast; master weights stay in the loaded dtype)
      seed: 0
      threads: null             # CPU threads (null: one CPU process uses ropekit.runtime.threads.default_threads(), 2 or 1
                                #   on a busy machine; under a launcher torch's setting is kept)
      deterministic: true       # torch.use_deterministic_algorithms(True, warn_only=True)
      ema: {decay: 0.999, every: 1}     # or null
      lora: {r: 8, alpha: 16, dropout: 0.0, target_modules: [q_proj, k_proj, v_proj, o_proj],
             trainable: [embed, norm]}  # or null
      guard: {skip_nonfinite: true, spike_factor: null, spike_window: 32, max_skipped: 10}
    output:
      dir: runs/x               # *required* here or with --out
      save_every: 0             # checkpoint every N steps (0: none); a checkpoint is what --resume continues from
      keep_last: 2              # checkpoints kept (null: all)
      log_every: 10             # console lines; metrics.jsonl gets every step
      save_final: true
      tensorboard: false        # needs the tensorboard package
      wandb: false              # or {project: NAME}; needs the wandb package
    stages:                     # optional curriculum; each stage overrides the settings above
      - {name: s1, steps: 100, seq_len: 128, method: {params: {rope_theta: 1.0e5}}}
      - {name: s2, steps: 100, seq_len: 256, method: {params: {rope_theta: 2.0e5}}, lr: 1.0e-5, grad_accum: 2}
                                # a stage may set: name, steps, seq_len, method, data, lr, micro_batch_size,
                                # grad_accum, reset_optimizer (fresh Adam moments); the rest is shared

Every unknown key and bad value is a one-line :class:`~ropekit.errors.RopekitError` that names the key
(``train.lr``) and says what to write instead.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RopekitError


class ConfigError(RopekitError):
    """A training config key is unknown, missing or has a bad value."""


# ---- small typed readers ----------------------------------------------------------------------------
def _fail(key: str, problem: str, fix: str):
    raise ConfigError(f"{key}: {problem}", fix)


def _unknown(section: str, raw: dict, known) -> None:
    for key in raw:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            where = f"{section}.{key}" if section else str(key)
            _fail(where, "unknown key", f"{hint}known keys: {', '.join(known)}")


def _mapping(value, key: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        _fail(key, f"must be a mapping of keys to values, got {value!r}", f"write it as `{key.split('.')[-1]}:` with indented keys")
    return value


def _int(value, key: str, minimum: int | None = None, example: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and (not math.isfinite(value) or value != int(value))):
        _fail(key, f"must be a whole number, got {value!r}", f"write e.g. {key.split('.')[-1]}: {example}")
    value = int(value)
    if minimum is not None and value < minimum:
        _fail(key, f"must be ≥ {minimum}, got {value}", f"write e.g. {key.split('.')[-1]}: {max(example, minimum)}")
    return value


def _float(value, key: str, *, minimum: float | None = None, exclusive: bool = False, maximum: float | None = None,
           example: str = "1.0") -> float:
    if isinstance(value, str):  # YAML reads 2e-5 (without a dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(key, f"must be a number, got {value!r}", f"write e.g. {key.split('.')[-1]}: {example}")
    value = float(value)
    if minimum is not None and (value < minimum or (exclusive and value == minimum)):
        op = ">" if exclusive else "≥"
        _fail(key, f"must be {op} {minimum:g}, got {value:g}", f"write e.g. {key.split('.')[-1]}: {example}")
    if maximum is not None and value > maximum:
        _fail(key, f"must be ≤ {maximum:g}, got {value:g}", f"write e.g. {key.split('.')[-1]}: {example}")
    return value


def _bool(value, key: str) -> bool:
    if not isinstance(value, bool):
        _fail(key, f"must be true or false, got {value!r}", f"write {key.split('.')[-1]}: true or false")
    return value


def _choice(value, key: str, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        _fail(key, f"must be one of {', '.join(choices)}, got {value!r}", f"write e.g. {key.split('.')[-1]}: {choices[0]}")
    return value


def _str(value, key: str, example: str) -> str:
    if not isinstance(value, str) or not value.strip():
        _fail(key, f"must be a non-empty string, got {value!r}", f"write e.g. {key.split('.')[-1]}: {example}")
    return value.strip()


def _str_list(value, key: str, example: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        _fail(key, f"must be a non-empty list of names, got {value!r}", f"write e.g. {key.split('.')[-1]}: {example}")
    return [v.strip() for v in value]


# ---- sections ----------------------------------------------------------------------------------------
DTYPES = ("float32", "bfloat16", "float16")
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
SCHEDULES = ("constant", "linear", "cosine")
PRECISIONS = ("fp32", "bf16")
LORA_EXTRAS = ("embed", "norm")


@dataclass
class ModelConfig:
    name: str
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    gradient_checkpointing: bool = False

    @classmethod
    def parse(cls, raw) -> ModelConfig:
        if raw is None:
            _fail("model", "missing", "add `model: tiny` (or a model directory, .gguf file or hub id)")
        if isinstance(raw, str):
            raw = {"name": raw}
        raw = _mapping(raw, "model")
        _unknown("model", raw, [f.name for f in dataclasses.fields(cls)])
        if "name" not in raw:
            _fail("model.name", "missing", "add e.g. `name: tiny` under model")
        out = cls(name=_str(raw["name"], "model.name", "tiny"))
        if "dtype" in raw:
            dtype = _DTYPE_ALIASES.get(raw["dtype"], raw["dtype"]) if isinstance(raw["dtype"], str) else raw["dtype"]
            out.dtype = _choice(dtype, "model.dtype", DTYPES)
        if "attn_implementation" in raw:
            out.attn_implementation = _str(raw["attn_implementation"], "model.attn_implementation", "sdpa")
        if "gradient_checkpointing" in raw:
            out.gradient_checkpointing = _bool(raw["gradient_checkpointing"], "model.gradient_checkpointing")
        return out


@dataclass
class MethodConfig:
    """``name`` None means the model is trained as it is (no method installed)."""

    name: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw, key: str = "method", inherit: MethodConfig | None = None) -> MethodConfig:
        """A method section; in a stage (``inherit`` given) a section without ``name`` merges its params over
        the top-level method's."""
        if raw is None:
            return copy.deepcopy(inherit) if inherit is not None else cls()
        if isinstance(raw, str):
            raw = {"name": raw}
        raw = _mapping(raw, key)
        _unknown(key, raw, ["name", "params"])
        params = _mapping(raw.get("params"), f"{key}.params")
        if "name" in raw and raw["name"] is not None:
            name = _str(raw["name"], f"{key}.name", "yarn")
        elif inherit is not None:
            name, params = inherit.name, {**inherit.params, **params}
        else:
            name = None
        if name is not None and name.lower() in ("none", "plain", "base"):
            name = None
        if name is None:
            if params:
                _fail(f"{key}.params", "given without a method name", f"add `name:` under {key} (see `ropekit methods`)")
            return cls()
        return cls(name=name, params=check_method_params(name, params, key))


def check_method_params(name: str, params: dict[str, Any], key: str) -> dict[str, Any]:
    """The method exists and every parameter has a known name and a valid value (model-independent checks;
    the model-dependent ones run when the method is installed)."""
    from ..methods import get_method

    try:
        method = get_method(name)
    except RopekitError as err:
        raise ConfigError(f"{key}.name: {err.problem}", err.fix) from None
    out = {}
    for pname, value in params.items():
        if pname == "target_length":
            out[pname] = _int(value, f"{key}.params.target_length", minimum=2, example=4096)
            continue
        try:
            param = method.param(pname)
        except KeyError:
            known = [p.name for p in method.params] + ["target_length"]
            close = difflib.get_close_matches(pname, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            _fail(f"{key}.params.{pname}", f"'{method.name}' has no such parameter", f"{hint}known: {', '.join(known)}")
        try:
            out[pname] = param.coerce(method.name, value)
        except RopekitError as err:
            raise ConfigError(f"{key}.params.{pname}: {err.problem}", err.fix.replace("--param ", "") if err.fix else None) from None
    if "target_length" in out and "factor" in out:
        _fail(f"{key}.params", "both factor and target_length given", "keep only one of them")
    return out


#: Keys of ``data:`` the trainer reads itself; everything else goes to the data builder.
DATA_TRAINER_KEYS = ("seq_len", "num_workers", "shuffle", "cache_dir")


@dataclass
class DataConfig:
    seq_len: int
    spec: dict[str, Any] = field(default_factory=dict)
    num_workers: int = 0
    shuffle: bool = True
    cache_dir: str | None = None

    @classmethod
    def parse(cls, raw, key: str = "data", base: DataConfig | None = None) -> DataConfig:
        raw = _mapping(raw, key)
        if base is None and "seq_len" not in raw:
            _fail(f"{key}.seq_len", "missing", "add e.g. `seq_len: 4096` under data (tokens per training sequence)")
        out = copy.deepcopy(base) if base is not None else cls(seq_len=0)
        spec = {k: copy.deepcopy(v) for k, v in raw.items() if k not in DATA_TRAINER_KEYS}
        out.spec = deep_merge(out.spec, spec) if base is not None else spec
        if "seq_len" in raw:
            out.seq_len = _int(raw["seq_len"], f"{key}.seq_len", minimum=2, example=4096)
        if "num_workers" in raw:
            out.num_workers = _int(raw["num_workers"], f"{key}.num_workers", minimum=0, example=2)
        if "shuffle" in raw:
            out.shuffle = _bool(raw["shuffle"], f"{key}.shuffle")
        if "cache_dir" in raw:
            out.cache_dir = None if raw["cache_dir"] is None else _str(raw["cache_dir"], f"{key}.cache_dir", "~/.cache/ropekit")
        return out


@dataclass
class EMAConfig:
    decay: float = 0.999
    every: int = 1

    @classmethod
    def parse(cls, raw, key: str = "train.ema") -> EMAConfig | None:
        if raw is None or raw is False:
            return None
        if raw is True:
            raw = {}
        raw = _mapping(raw, key)
        _unknown(key, raw, ["decay", "every"])
        out = cls()
        if "decay" in raw:
            out.decay = _float(raw["decay"], f"{key}.decay", minimum=0.0, maximum=1.0, example="0.999")
            if out.decay == 1.0:
                _fail(f"{key}.decay", "1.0 would never move the average", "write a decay below 1, e.g. 0.999")
        if "every" in raw:
            out.every = _int(raw["every"], f"{key}.every", minimum=1, example=1)
        return out


@dataclass
class LoRAConfig:
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    trainable: list[str] = field(default_factory=lambda: ["embed", "norm"])

    @classmethod
    def parse(cls, raw, key: str = "train.lora") -> LoRAConfig | None:
        if raw is None or raw is False:
            return None
        if raw is True:
            raw = {}
        raw = _mapping(raw, key)
        _unknown(key, raw, [f.name for f in dataclasses.fields(cls)])
        out = cls()
        if "r" in raw:
            out.r = _int(raw["r"], f"{key}.r", minimum=1, example=8)
        if "alpha" in raw:
            out.alpha = _float(raw["alpha"], f"{key}.alpha", minimum=0.0, exclusive=True, example="16")
        if "dropout" in raw:
            out.dropout = _float(raw["dropout"], f"{key}.dropout", minimum=0.0, maximum=0.99, example="0.0")
        if "target_modules" in raw:
            out.target_modules = _str_list(raw["target_modules"], f"{key}.target_modules", "[q_proj, v_proj]")
        if "trainable" in raw:
            extras = [] if raw["trainable"] in (None, [], False) else _str_list(raw["trainable"], f"{key}.trainable", "[embed, norm]")
            for extra in extras:
                if extra not in LORA_EXTRAS:
                    _fail(f"{key}.trainable", f"unknown entry '{extra}'", f"use any of {', '.join(LORA_EXTRAS)} (LongLoRA trains both)")
            out.trainable = extras
        return out


@dataclass
class GuardConfig:
    """Loss-spike / NaN guard: a step whose loss or gradient norm is not finite (``skip_nonfinite``), or
    whose loss exceeds ``spike_factor`` × the mean of the last ``spike_window`` applied steps, is skipped
    (no weight update, data consumed); training aborts once more than ``max_skipped`` steps were skipped."""

    skip_nonfinite: bool = True
    spike_factor: float | None = None
    spike_window: int = 32
    max_skipped: int = 10

    @classmethod
    def parse(cls, raw, key: str = "train.guard") -> GuardConfig:
        raw = _mapping(raw, key)
        _unknown(key, raw, [f.name for f in dataclasses.fields(cls)])
        out = cls()
        if "skip_nonfinite" in raw:
            out.skip_nonfinite = _bool(raw["skip_nonfinite"], f"{key}.skip_nonfinite")
        if raw.get("spike_factor") is not None:
            out.spike_factor = _float(raw["spike_factor"], f"{key}.spike_factor", minimum=1.0, exclusive=True, example="3.0")
        if "spike_window" in raw:
            out.spike_window = _int(raw["spike_window"], f"{key}.spike_window", minimum=1, example=32)
        if "max_skipped" in raw:
            out.max_skipped = _int(raw["max_skipped"], f"{key}.max_skipped", minimum=0, example=10)
        return out


@dataclass
class TrainSection:
    max_steps: int | None = None
    lr: float = 2e-5
    optimizer: str = "adamw"
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 0
    schedule: str = "constant"
    min_lr_ratio: float = 0.0
    micro_batch_size: int = 1
    grad_accum: int = 1
    max_grad_norm: float | None = 1.0
    precision: str = "fp32"
    seed: int = 0
    threads: int | None = None
    deterministic: bool = True
    ema: EMAConfig | None = None
    lora: LoRAConfig | None = None
    guard: GuardConfig = field(default_factory=GuardConfig)

    @classmethod
    def parse(cls, raw) -> TrainSection:
        key = "train"
        raw = _mapping(raw, key)
        _unknown(key, raw, [f.name for f in dataclasses.fields(cls)])
        out = cls()
        if raw.get("max_steps") is not None:
            out.max_steps = _int(raw["max_steps"], "train.max_steps", minimum=1, example=1000)
        if "lr" in raw:
            out.lr = _float(raw["lr"], "train.lr", minimum=0.0, exclusive=True, example="2.0e-5")
        if "optimizer" in raw:
            out.optimizer = _choice(raw["optimizer"], "train.optimizer", ("adamw",))
        if "betas" in raw:
            b = raw["betas"]
            if not isinstance(b, (list, tuple)) or len(b) != 2:
                _fail("train.betas", f"must be two numbers, got {b!r}", "write betas: [0.9, 0.95]")
            out.betas = (
                _float(b[0], "train.betas[0]", minimum=0.0, maximum=0.999999, example="0.9"),
                _float(b[1], "train.betas[1]", minimum=0.0, maximum=0.999999, example="0.95"),
            )
        if "eps" in raw:
            out.eps = _float(raw["eps"], "train.eps", minimum=0.0, exclusive=True, example="1.0e-8")
        if "weight_decay" in raw:
            out.weight_decay = _float(raw["weight_decay"], "train.weight_decay", minimum=0.0, example="0.1")
        if "warmup_steps" in raw:
            out.warmup_steps = _int(raw["warmup_steps"], "train.warmup_steps", minimum=0, example=20)
        if "schedule" in raw:
            out.schedule = _choice(raw["schedule"], "train.schedule", SCHEDULES)
        if "min_lr_ratio" in raw:
            out.min_lr_ratio = _float(raw["min_lr_ratio"], "train.min_lr_ratio", minimum=0.0, maximum=1.0, example="0.1")
        if "micro_batch_size" in raw:
            out.micro_batch_size = _int(raw["micro_batch_size"], "train.micro_batch_size", minimum=1, example=1)
        if "grad_accum" in raw:
            out.grad_accum = _int(raw["grad_accum"], "train.grad_accum", minimum=1, example=8)
        if "max_grad_norm" in raw:
            value = raw["max_grad_norm"]
            out.max_grad_norm = None if value in (None, 0, 0.0) else _float(value, "train.max_grad_norm", minimum=0.0, exclusive=True, example="1.0")
        if "precision" in raw:
            out.precision = _choice(raw["precision"], "train.precision", PRECISIONS)
        if "seed" in raw:
            out.seed = _int(raw["seed"], "train.seed", minimum=0, example=0)
        if raw.get("threads") is not None:
            out.threads = _int(raw["threads"], "train.threads", minimum=1, example=2)
        if "deterministic" in raw:
            out.deterministic = _bool(raw["deterministic"], "train.deterministic")
        out.ema = EMAConfig.parse(raw.get("ema"))
        out.lora = LoRAConfig.parse(raw.get("lora"))
        out.guard = GuardConfig.parse(raw.get("guard"))
        return out


@dataclass
class OutputConfig:
    dir: str | None = None
    save_every: int = 0
    keep_last: int | None = 2
    log_every: int = 10
    save_final: bool = True
    tensorboard: bool = False
    wandb: dict[str, Any] | None = None

    @classmethod
    def parse(cls, raw) -> OutputConfig:
        key = "output"
        raw = _mapping(raw, key)
        _unknown(key, raw, [f.name for f in dataclasses.fields(cls)])
        out = cls()
        if raw.get("dir") is not None:
            out.dir = _str(raw["dir"], "output.dir", "runs/my-run")
        if "save_every" in raw:
            out.save_every = _int(raw["save_every"], "output.save_every", minimum=0, example=100)
        if "keep_last" in raw:
            out.keep_last = None if raw["keep_last"] is None else _int(raw["keep_last"], "output.keep_last", minimum=1, example=2)
        if "log_every" in raw:
            out.log_every = _int(raw["log_every"], "output.log_every", minimum=1, example=10)
        if "save_final" in raw:
            out.save_final = _bool(raw["save_final"], "output.save_final")
        if "tensorboard" in raw:
            out.tensorboard = _bool(raw["tensorboard"], "output.tensorboard")
            if out.tensorboard:
                _require_package("tensorboard", "output.tensorboard")
        if raw.get("wandb") not in (None, False):
            value = raw["wandb"]
            value = {} if value is True else _mapping(value, "output.wandb")
            _unknown("output.wandb", value, ["project", "name", "entity"])
            out.wandb = {k: _str(v, f"output.wandb.{k}", "ropekit") for k, v in value.items()}
            _require_package("wandb", "output.wandb")
        return out


def _require_package(name: str, key: str) -> None:
    import importlib.util

    if importlib.util.find_spec(name) is None:
        _fail(key, f"needs the '{name}' package, which is not installed", f"run `pip install {name}` or set {key.split('.')[-1]}: false")


@dataclass
class StageConfig:
    """One curriculum stage after merging its overrides over the top-level sections."""

    name: str
    steps: int
    method: MethodConfig
    data: DataConfig
    lr: float
    micro_batch_size: int = 1
    grad_accum: int = 1
    reset_optimizer: bool = False

    @property
    def seq_len(self) -> int:
        return self.data.seq_len


STAGE_KEYS = ("name", "steps", "seq_len", "method", "data", "lr", "micro_batch_size", "grad_accum", "reset_optimizer")


@dataclass
class TrainConfig:
    model: ModelConfig
    method: MethodConfig
    data: DataConfig
    train: TrainSection
    output: OutputConfig
    stages: list[StageConfig]
    #: Whether ``stages:`` was given (else one stage built from the top-level sections).
    curriculum: bool = False
    #: Stop after this many optimizer steps in total without changing the schedule (``--max-steps`` with stages).
    stop_at: int | None = None

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    @property
    def last_step(self) -> int:
        return min(self.total_steps, self.stop_at) if self.stop_at else self.total_steps

    def to_dict(self) -> dict[str, Any]:
        """The resolved config (what ``config.yaml`` in the run directory holds; YAML/JSON-ready)."""
        data = dataclasses.asdict(self)
        data["train"]["betas"] = list(self.train.betas)
        return _plain(data)

    def with_overrides(self, *, out_dir: str | Path | None = None, max_steps: int | None = None) -> TrainConfig:
        """A copy with the CLI overrides applied: ``--out`` sets ``output.dir``; ``--max-steps`` sets
        ``train.max_steps`` (the schedule follows) or, with stages, stops the curriculum after that many steps."""
        cfg = copy.deepcopy(self)
        if out_dir is not None:
            cfg.output.dir = str(out_dir)
        if max_steps is not None:
            max_steps = _int(max_steps, "--max-steps", minimum=1, example=10)
            if cfg.curriculum:
                cfg.stop_at = max_steps
            else:
                cfg.train.max_steps = max_steps
                cfg.stages[0].steps = max_steps
        return cfg

    def require_output(self) -> Path:
        if not self.output.dir:
            raise ConfigError("output.dir: missing", "add `dir: runs/NAME` under output, or pass --out DIR")
        return Path(self.output.dir).expanduser()


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def deep_merge(base: dict, override: dict) -> dict:
    """``override`` merged into a copy of ``base``; nested mappings merge, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


TOP_KEYS = ("model", "method", "data", "train", "output", "stages")


def parse_config(raw: Any, source: str = "config") -> TrainConfig:
    """Validate a config mapping (as read from YAML) into a :class:`TrainConfig`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source} is not a YAML mapping of sections", "start from `ropekit train --example tiny-full`")
    _unknown("", raw, TOP_KEYS)
    model = ModelConfig.parse(raw.get("model"))
    method = MethodConfig.parse(raw.get("method"))
    if raw.get("data") is None:
        _fail("data", "missing", "add a data section with at least `seq_len:` (see `ropekit train --example tiny-full`)")
    data = DataConfig.parse(raw["data"])
    train = TrainSection.parse(raw.get("train"))
    output = OutputConfig.parse(raw.get("output"))
    stages_raw = raw.get("stages")
    if stages_raw is None:
        if train.max_steps is None:
            _fail("train.max_steps", "missing", "add e.g. `max_steps: 1000` under train (or a stages: list)")
        stages = [StageConfig(name="main", steps=train.max_steps, method=method, data=data, lr=train.lr,
                              micro_batch_size=train.micro_batch_size, grad_accum=train.grad_accum)]
        curriculum = False
    else:
        stages = _parse_stages(stages_raw, method, data, train)
        total = sum(s.steps for s in stages)
        if train.max_steps is not None and train.max_steps != total:
            _fail("train.max_steps", f"is {train.max_steps} but the stages add up to {total} steps",
                  "drop train.max_steps (the stages define it) or make them agree")
        train.max_steps = total
        curriculum = True
    if train.warmup_steps >= min(s.steps for s in stages) and train.schedule != "constant":
        shortest = min(s.steps for s in stages)
        _fail("train.warmup_steps", f"{train.warmup_steps} leaves no decay in a {shortest}-step stage",
              f"write warmup_steps below {shortest}")
    from .data import validate_spec

    for i, stage in enumerate(stages):
        try:
            validate_spec(stage.data.spec, stage.seq_len, stage.data.shuffle)
        except ConfigError:
            raise
        except RopekitError as err:
            where = f"stages[{i}] ({stage.name}): " if curriculum else ""
            raise ConfigError(f"{where}{err.problem}", err.fix) from None
    return TrainConfig(model=model, method=method, data=data, train=train, output=output, stages=stages, curriculum=curriculum)


def _parse_stages(raw, method: MethodConfig, data: DataConfig, train: TrainSection) -> list[StageConfig]:
    if not isinstance(raw, list) or not raw:
        _fail("stages", f"must be a non-empty list of stages, got {raw!r}", "write `stages:` followed by `- {steps: 100, seq_len: 4096}` items")
    stages, names = [], set()
    for i, item in enumerate(raw):
        key = f"stages[{i}]"
        item = _mapping(item, key)
        _unknown(key, item, STAGE_KEYS)
        if "steps" not in item:
            _fail(f"{key}.steps", "missing", "give every stage its number of optimizer steps, e.g. steps: 1000")
        name = _str(item["name"], f"{key}.name", f"stage{i + 1}") if "name" in item else f"stage{i + 1}"
        if name in names:
            _fail(f"{key}.name", f"'{name}' is used by an earlier stage", "give every stage its own name")
        names.add(name)
        stage_data_raw = dict(_mapping(item.get("data"), f"{key}.data"))
        if "seq_len" in item:
            if "seq_len" in stage_data_raw:
                _fail(f"{key}.seq_len", "given twice (also under data)", "keep one of them")
            stage_data_raw["seq_len"] = item["seq_len"]
        stages.append(StageConfig(
            name=name,
            steps=_int(item["steps"], f"{key}.steps", minimum=1, example=1000),
            method=MethodConfig.parse(item.get("method"), f"{key}.method", inherit=method),
            data=DataConfig.parse(stage_data_raw, f"{key}.data", base=data),
            lr=_float(item["lr"], f"{key}.lr", minimum=0.0, exclusive=True, example="2.0e-5") if "lr" in item else train.lr,
            micro_batch_size=(_int(item["micro_batch_size"], f"{key}.micro_batch_size", minimum=1, example=1)
                              if "micro_batch_size" in item else train.micro_batch_size),
            grad_accum=_int(item["grad_accum"], f"{key}.grad_accum", minimum=1, example=8) if "grad_accum" in item else train.grad_accum,
            reset_optimizer=_bool(item["reset_optimizer"], f"{key}.reset_optimizer") if "reset_optimizer" in item else False,
        ))
    return stages


def load_config(path: str | Path) -> TrainConfig:
    """Read and validate a YAML training config; every problem is one line naming the key."""
    import yaml

    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"config file '{path}' not found", "pass a YAML file, e.g. from `ropekit train --example tiny-full > tiny.yaml`")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise ConfigError(f"'{path}' is not valid YAML ({problem}{where})", "fix the YAML syntax") from None
    return parse_config(raw, f"'{path}'")


def parse_yaml(text: str, source: str = "config") -> TrainConfig:
    """Validate a YAML document given as text."""
    import yaml

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source} is not valid YAML ({getattr(err, 'problem', None) or err})", "fix the YAML syntax") from None
    return parse_config(raw, source)
