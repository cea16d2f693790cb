"""The training config: a YAML file in the style of axolotl / LLaMA-Factory, validated by pydantic models.

Sections (every key is optional unless marked *required*; ``ropekit train --example NAME`` prints complete
files)::

    model:                      # or just `model: tiny`
      name: tiny                # *required*: a MODEL as `ropekit.models.loading.load_model` accepts it
                                #   (tiny, tiny-<family>, a directory, a .gguf, smollm2, org/name), or
                                #   tiny-pretrained: the pre-trained tiny Llama built by ropekit.train.builtin_base
      dtype: float32            # float32 | bfloat16 | float16: the dtype the weights are loaded in
      attn_implementation: sdpa # sdpa | eager | flash_attention_2 | flex_attention …
      gradient_checkpointing: auto  # auto | true | false; auto: on when the step's memory plan would not fit
                                #   in what is free on the training device (ropekit.train.plan.choose_checkpointing)
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
      context_parallel: 1       # processes each sequence is split across (DeepSpeed Ulysses; needs deepspeed)
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

Every section is a :class:`~ropekit.core.schema.StrictModel` (``stages`` items too, as written; a stage's
overrides are then merged over the top-level sections into a :class:`StageConfig`). Every unknown key and bad
value is a one-line :class:`ConfigError` that names the key (``train.lr``) and says what to write instead.
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

from ..core.schema import (
    MAX_POSITIONS,
    ConfigProblem,
    Name,
    Number,
    StrictModel,
    WholeNumber,
    load_yaml,
    read_yaml_file,
    validate,
)
from ..errors import RopekitError


class ConfigError(RopekitError):
    """A training config key is unknown, missing or has a bad value."""


def _validate(model: type[StrictModel], raw: Any, prefix: str = "") -> Any:
    return validate(model, raw, prefix=prefix, error_cls=ConfigError)


def _on_off(value: Any) -> Any:
    """An optional section: ``true`` turns it on with its defaults, ``false`` (or ``null``) off."""
    if value is True:
        return {}
    return None if value is False else value


# ---- sections ----------------------------------------------------------------------------------------
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


class ModelConfig(StrictModel):
    """``model:`` — or just ``model: NAME``."""

    name: Name = Field(examples=["tiny"])
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    attn_implementation: Name = Field(default="sdpa", examples=["sdpa"])
    gradient_checkpointing: Literal["auto"] | bool = "auto"

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, raw: Any) -> Any:
        return {"name": raw} if isinstance(raw, str) else raw

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_alias(cls, value: Any) -> Any:
        return _DTYPE_ALIASES.get(value, value) if isinstance(value, str) else value


class MethodConfig(StrictModel):
    """``method:`` — or ``method: NAME``, or ``method: none``; ``name`` None means the model is trained as it is
    (no method installed). ``params`` are checked against the method (:func:`check_method_params`)."""

    name: Name | None = Field(default=None, examples=["yarn"])
    params: dict[str, Any] = Field(default_factory=dict, examples=["{factor: 4}"])

    def __init__(self, name: str | None = None, params: dict[str, Any] | None = None, **unknown: Any):
        """Positional arguments too: ``MethodConfig("pi", {"factor": 2.0})``. (Validating a section calls this
        too, with the keys as written: ``unknown`` ones are refused by the strict base.)"""
        super().__init__(name=name, params={} if params is None else params, **unknown)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, raw: Any) -> Any:
        if isinstance(raw, str):
            return {"name": raw}
        if isinstance(raw, dict) and "params" in raw and raw["params"] is None:
            return {**raw, "params": {}}
        return raw

    @model_validator(mode="after")
    def _known_method_and_params(self) -> MethodConfig:
        if self.name is not None and self.name.lower() in ("none", "plain", "base"):
            self.name = None
        if self.name is None:
            if self.params:
                raise ConfigProblem("given without a method name", "add `name:` beside params (see `ropekit methods`)",
                                    key="params")
        else:
            self.params = check_method_params(self.name, self.params)
        return self


def check_method_params(name: str, params: dict[str, Any], *, name_key: str = "name") -> dict[str, Any]:
    """``params`` of method ``name``, coerced: the method exists and every parameter has a known name and a valid
    value (model-independent checks; the model-dependent ones run when the method is installed). For validators:
    raises :class:`~ropekit.core.schema.ConfigProblem` naming ``name_key`` or ``params.PARAM``."""
    from ..methods import get_method

    try:
        method = get_method(name)
    except RopekitError as err:
        raise ConfigProblem(err.problem, err.fix, key=name_key) from None
    out = {}
    for pname, value in params.items():
        key = f"params.{pname}"
        if pname == "target_length":
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= MAX_POSITIONS:
                raise ConfigProblem(f"must be a whole number from 2 to {MAX_POSITIONS:,} (2^24, the last position "
                                    f"float32 holds exactly), got {value!r}", "write e.g. target_length: 4096", key=key)
            out[pname] = value
            continue
        try:
            param = method.param(pname)
        except KeyError:
            known = [p.name for p in method.params] + ["target_length"]
            close = difflib.get_close_matches(pname, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ConfigProblem(f"'{method.name}' has no such parameter", f"{hint}known: {', '.join(known)}", key=key) from None
        try:
            out[pname] = param.coerce(method.name, value)
        except RopekitError as err:
            raise ConfigProblem(err.problem, err.fix.replace("--param ", "") if err.fix else None, key=key) from None
    if "target_length" in out and "factor" in out:
        raise ConfigProblem("both factor and target_length given", "keep only one of them", key="params")
    return out


#: Keys of ``data:`` the trainer reads itself; everything else goes to the data builder.
DATA_TRAINER_KEYS = ("seq_len", "num_workers", "shuffle", "cache_dir")


class DataConfig(StrictModel):
    """``data:`` — the keys the trainer reads; ``spec`` is the rest of the section as written (the data builder's
    spec, checked against ``seq_len`` by :func:`ropekit.data.training_data.validate_data_spec`)."""

    seq_len: WholeNumber = Field(ge=2, le=MAX_POSITIONS, examples=[4096])
    spec: dict[str, Any] = Field(default_factory=dict)
    num_workers: WholeNumber = Field(default=0, ge=0, examples=[2])
    shuffle: bool = True
    cache_dir: Name | None = Field(default=None, examples=["~/.cache/ropekit"])


def _data_section(raw: Any) -> Any:
    """A written ``data:`` section as :class:`DataConfig` input: the trainer's keys, and the rest as ``spec``."""
    if not isinstance(raw, dict):
        return raw
    return {**{k: v for k, v in raw.items() if k in DATA_TRAINER_KEYS},
            "spec": {k: copy.deepcopy(v) for k, v in raw.items() if k not in DATA_TRAINER_KEYS}}


class EMAConfig(StrictModel):
    """``train.ema:`` — an exponential moving average of the weights (``true``: these defaults)."""

    decay: Number = Field(default=0.999, ge=0, lt=1, examples=[0.999])
    every: WholeNumber = Field(default=1, ge=1, examples=[1])


class LoRAConfig(StrictModel):
    """``train.lora:`` — low-rank adapters (``true``: these defaults); ``trainable`` parts train in full."""

    r: WholeNumber = Field(default=8, ge=1, examples=[8])
    alpha: Number = Field(default=16.0, gt=0, examples=[16])
    dropout: Number = Field(default=0.0, ge=0, le=0.99, examples=[0.0])
    target_modules: list[Name] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1,
                                       examples=["[q_proj, v_proj]"])
    trainable: list[Literal["embed", "norm"]] = Field(default_factory=lambda: ["embed", "norm"],
                                                      examples=["[embed, norm] (LongLoRA trains both)"])

    @field_validator("target_modules", mode="before")
    @classmethod
    def _one_module(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("trainable", mode="before")
    @classmethod
    def _none_or_one(cls, value: Any) -> Any:
        if value is None or value is False:
            return []
        return [value] if isinstance(value, str) else value


class GuardConfig(StrictModel):
    """Loss-spike / NaN guard: a step whose loss or gradient norm is not finite (``skip_nonfinite``), or
    whose loss exceeds ``spike_factor`` × the mean of the last ``spike_window`` applied steps, is skipped
    (no weight update, data consumed); training aborts once more than ``max_skipped`` steps were skipped."""

    skip_nonfinite: bool = True
    spike_factor: Number | None = Field(default=None, gt=1, examples=["3.0"])
    spike_window: WholeNumber = Field(default=32, ge=1, examples=[32])
    max_skipped: WholeNumber = Field(default=10, ge=0, examples=[10])


#: An Adam beta.
_Beta = Annotated[Number, Field(ge=0, le=0.999999)]


class TrainSection(StrictModel):
    """``train:`` — the optimizer, the schedule and the loop."""

    max_steps: WholeNumber | None = Field(default=None, ge=1, examples=[1000])
    lr: Number = Field(default=2e-5, gt=0, examples=["2.0e-5"])
    optimizer: Literal["adamw"] = "adamw"
    betas: tuple[_Beta, _Beta] = Field(default=(0.9, 0.95), examples=["[0.9, 0.95]"])
    eps: Number = Field(default=1e-8, gt=0, examples=["1.0e-8"])
    weight_decay: Number = Field(default=0.0, ge=0, examples=["0.1"])
    warmup_steps: WholeNumber = Field(default=0, ge=0, examples=[20])
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    min_lr_ratio: Number = Field(default=0.0, ge=0, le=1, examples=["0.1"])
    micro_batch_size: WholeNumber = Field(default=1, ge=1, examples=[1])
    grad_accum: WholeNumber = Field(default=1, ge=1, examples=[8])
    #: processes one sequence is split across (DeepSpeed Ulysses): ropekit.train.context_parallel
    context_parallel: WholeNumber = Field(default=1, ge=1, examples=[2])
    max_grad_norm: Number | None = Field(default=1.0, gt=0, examples=["1.0"])
    precision: Literal["fp32", "bf16"] = "fp32"
    seed: WholeNumber = Field(default=0, ge=0, examples=[0])
    threads: WholeNumber | None = Field(default=None, ge=1, examples=[2])
    deterministic: bool = True
    ema: EMAConfig | None = None
    lora: LoRAConfig | None = None
    guard: GuardConfig = Field(default_factory=GuardConfig)

    @field_validator("betas", mode="before")
    @classmethod
    def _two_numbers(cls, value: Any) -> Any:
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise ConfigProblem(f"must be two numbers, got {value!r}", "write betas: [0.9, 0.95]")
        return tuple(value)

    @field_validator("max_grad_norm", mode="before")
    @classmethod
    def _zero_is_no_clipping(cls, value: Any) -> Any:
        return None if value in (None, False, 0) else value

    @field_validator("ema", "lora", mode="before")
    @classmethod
    def _optional_section(cls, value: Any) -> Any:
        return _on_off(value)

    @field_validator("guard", mode="before")
    @classmethod
    def _guard_defaults(cls, value: Any) -> Any:
        return {} if value is None else value


class WandbConfig(StrictModel):
    """``output.wandb:`` — ``true``, or the run's project (default ``ropekit``), name and entity."""

    project: Name | None = Field(default=None, examples=["ropekit"])
    name: Name | None = Field(default=None, examples=["my-run"])
    entity: Name | None = Field(default=None, examples=["my-team"])


class OutputConfig(StrictModel):
    """``output:`` — the run directory, checkpoints and logs."""

    dir: Name | None = Field(default=None, examples=["runs/my-run"])
    save_every: WholeNumber = Field(default=0, ge=0, examples=[100])
    keep_last: WholeNumber | None = Field(default=2, ge=1, examples=[2])
    log_every: WholeNumber = Field(default=10, ge=1, examples=[10])
    save_final: bool = True
    tensorboard: bool = False
    wandb: WandbConfig | None = None

    @field_validator("wandb", mode="before")
    @classmethod
    def _optional_section(cls, value: Any) -> Any:
        return _on_off(value)

    @field_serializer("wandb")
    def _keys_given(self, wandb: WandbConfig | None) -> dict[str, str] | None:
        return None if wandb is None else wandb.model_dump(exclude_none=True)

    @model_validator(mode="after")
    def _trackers_installed(self) -> OutputConfig:
        for name, wanted in (("tensorboard", self.tensorboard), ("wandb", self.wandb is not None)):
            if wanted and importlib.util.find_spec(name) is None:
                raise ConfigProblem(f"needs the '{name}' package, which is not installed",
                                    f"run `pip install {name}` or set {name}: false", key=name)
        return self


class _Stage(StrictModel):
    """One item of ``stages:`` as written: what the stage overrides (merged by :func:`_resolve_stage`)."""

    name: Name | None = Field(default=None, examples=["stage1"])
    steps: WholeNumber = Field(ge=1, examples=[1000])
    seq_len: WholeNumber | None = Field(default=None, ge=2, le=MAX_POSITIONS, examples=[4096])
    method: dict[str, Any] | None = Field(default=None, examples=["{params: {rope_theta: 2.0e+5}}"])
    data: dict[str, Any] | None = Field(default=None, examples=["{sources: [{path: builtin}]}"])
    lr: Number | None = Field(default=None, gt=0, examples=["2.0e-5"])
    micro_batch_size: WholeNumber | None = Field(default=None, ge=1, examples=[1])
    grad_accum: WholeNumber | None = Field(default=None, ge=1, examples=[8])
    reset_optimizer: bool = False

    @field_validator("method", mode="before")
    @classmethod
    def _shorthand(cls, raw: Any) -> Any:
        return {"name": raw} if isinstance(raw, str) else raw

    @model_validator(mode="after")
    def _seq_len_once(self) -> _Stage:
        if self.seq_len is not None and "seq_len" in (self.data or {}):
            raise ConfigProblem("given twice (also under data)", "keep one of them", key="seq_len")
        return self


class _TrainFile(StrictModel):
    """A training config as written: the sections, and the checks that span them."""

    model: ModelConfig = Field(examples=["tiny"])
    method: MethodConfig = Field(default_factory=MethodConfig)
    data: DataConfig = Field(examples=["{seq_len: 4096}"])
    train: TrainSection = Field(default_factory=TrainSection)
    output: OutputConfig = Field(default_factory=OutputConfig)
    stages: list[_Stage] | None = Field(default=None, min_length=1, examples=["[{steps: 100, seq_len: 4096}]"])

    @field_validator("method", "train", "output", mode="before")
    @classmethod
    def _empty_section(cls, raw: Any) -> Any:
        return {} if raw is None else raw

    @field_validator("data", mode="before")
    @classmethod
    def _spec_apart(cls, raw: Any) -> Any:
        return _data_section(raw)

    @field_validator("stages")
    @classmethod
    def _named_once(cls, stages: list[_Stage] | None) -> list[_Stage] | None:
        names: set[str] = set()
        for i, stage in enumerate(stages or []):
            stage.name = stage.name or f"stage{i + 1}"
            if stage.name in names:
                raise ConfigProblem(f"'{stage.name}' is used by an earlier stage", "give every stage its own name",
                                    key=f"[{i}].name")
            names.add(stage.name)
        return stages

    @model_validator(mode="after")
    def _steps_agree(self) -> _TrainFile:
        train = self.train
        if self.stages is None:
            if train.max_steps is None:
                raise ConfigProblem("missing", "add e.g. `max_steps: 1000` under train (or a stages: list)",
                                    key="train.max_steps")
            steps = [train.max_steps]
        else:
            steps = [stage.steps for stage in self.stages]
            if train.max_steps is not None and train.max_steps != sum(steps):
                raise ConfigProblem(f"is {train.max_steps} but the stages add up to {sum(steps)} steps",
                                    "drop train.max_steps (the stages define it) or make them agree", key="train.max_steps")
        if train.warmup_steps >= min(steps) and train.schedule != "constant":
            raise ConfigProblem(f"{train.warmup_steps} leaves no decay in a {min(steps)}-step stage",
                                f"write warmup_steps below {min(steps)}", key="train.warmup_steps")
        return self


# ---- the resolved config -----------------------------------------------------------------------------
class StageConfig(BaseModel):
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


class TrainConfig(BaseModel):
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
        return _plain(self.model_dump())

    def with_overrides(self, *, out_dir: str | Path | None = None, max_steps: int | None = None) -> TrainConfig:
        """A copy with the CLI overrides applied: ``--out`` sets ``output.dir``; ``--max-steps`` sets
        ``train.max_steps`` (the schedule follows) or, with stages, stops the curriculum after that many steps."""
        cfg = self.model_copy(deep=True)
        if out_dir is not None:
            cfg.output.dir = str(out_dir)
        if max_steps is not None:
            if isinstance(max_steps, bool) or not isinstance(max_steps, int):
                raise ConfigError(f"--max-steps: must be a whole number, got {max_steps!r}", "write e.g. --max-steps 10")
            if max_steps < 1:
                raise ConfigError(f"--max-steps: must be ≥ 1, got {max_steps}", "write e.g. --max-steps 10")
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


def parse_config(raw: Any, source: str = "config") -> TrainConfig:
    """Validate a config mapping (as read from YAML) into a :class:`TrainConfig`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source} is not a YAML mapping of sections", "start from `ropekit train --example tiny-full`")
    written = _validate(_TrainFile, raw)
    train = written.train
    if written.stages is None:
        stages = [StageConfig(name="main", steps=train.max_steps, method=written.method, data=written.data, lr=train.lr,
                              micro_batch_size=train.micro_batch_size, grad_accum=train.grad_accum)]
    else:
        stages = [_resolve_stage(i, stage, raw["data"], written) for i, stage in enumerate(written.stages)]
        train.max_steps = sum(s.steps for s in stages)
    curriculum = written.stages is not None
    from .data import validate_spec

    for i, stage in enumerate(stages):
        try:
            validate_spec(stage.data.spec, stage.seq_len, stage.data.shuffle)
        except ConfigError:
            raise
        except RopekitError as err:
            where = f"stages[{i}] ({stage.name}): " if curriculum else ""
            raise ConfigError(f"{where}{err.problem}", err.fix) from None
        where = f"stages[{i}] ({stage.name}): " if curriculum else ""
        _trainable(stage, where)
        _adapters_reach(stage, train.lora, where)
        _scale_given(stage, where)
    return TrainConfig(model=written.model, method=written.method, data=written.data, train=train,
                       output=written.output, stages=stages, curriculum=curriculum)


def _scale_given(stage: StageConfig, where: str) -> None:
    """A scale method (PI, NTK, YaRN, …) trained without ``factor`` or ``target_length`` would train the model's own
    RoPE under its name (``ropekit.extend`` refuses it too; here before a model loads, for ``--dry-run`` as well)."""
    if not stage.method.name:
        return
    from ..methods import get_method

    method = get_method(stage.method.name)
    if method.scale_only and method.sized_by_target(stage.method.params):
        raise ConfigError(f"{where}method {method.name} needs a scale: without factor or target_length it trains the "
                          "model's own RoPE", f"write e.g. `method: {{name: {method.name}, params: {{factor: 4}}}}`")


def _trainable(stage: StageConfig, where: str) -> None:
    """What the stage's method says cannot train on its sequences (:meth:`~ropekit.methods.base.Method.training_problem`:
    Landmark's blocks longer than the sequence), refused when the config is read."""
    if not stage.method.name:
        return
    from ..methods import get_method

    problem = get_method(stage.method.name).training_problem(stage.method.params, stage.seq_len)
    if problem is not None:
        raise ConfigError(f"{where}{problem[0]}", problem[1])


def _adapters_reach(stage: StageConfig, lora: LoRAConfig | None, where: str) -> None:
    """What the stage's method needs trained that LoRA with these extras would leave frozen
    (:meth:`~ropekit.methods.base.Method.adapter_problem`: Landmark's token embedding), refused when the config is read."""
    if lora is None or not stage.method.name:
        return
    from ..methods import get_method

    problem = get_method(stage.method.name).adapter_problem(stage.method.params, tuple(lora.trainable))
    if problem is not None:
        raise ConfigError(f"{where}{problem[0]}", problem[1])


def _resolve_stage(i: int, stage: _Stage, data: dict, top: _TrainFile) -> StageConfig:
    """Stage ``i`` with its overrides merged over the top-level sections (``data`` as written there): data
    merges key by key; a method without a name adds its params to the top-level method's."""
    key = f"stages[{i}]"
    data = deep_merge(data, stage.data or {})
    if stage.seq_len is not None:
        data["seq_len"] = stage.seq_len
    if stage.method is None:
        method = top.method.model_copy(deep=True)
    else:
        written = stage.method
        if written.get("name") is None and isinstance(written.get("params") or {}, dict):
            written = {**written, "name": top.method.name, "params": {**top.method.params, **(written.get("params") or {})}}
        method = _validate(MethodConfig, written, prefix=f"{key}.method")
    return StageConfig(
        name=stage.name, steps=stage.steps, method=method, data=_validate(DataConfig, _data_section(data), f"{key}.data"),
        lr=top.train.lr if stage.lr is None else stage.lr,
        micro_batch_size=top.train.micro_batch_size if stage.micro_batch_size is None else stage.micro_batch_size,
        grad_accum=top.train.grad_accum if stage.grad_accum is None else stage.grad_accum,
        reset_optimizer=stage.reset_optimizer,
    )


def load_config(path: str | Path) -> TrainConfig:
    """Read and validate a YAML training config; every problem is one line naming the key."""
    path = Path(path).expanduser()
    if not path.is_file():
        what = "is a directory, not a YAML file" if path.is_dir() else "not found"
        raise ConfigError(f"config file '{path}' {what}",
                          "pass a YAML file, e.g. from `ropekit train --example tiny-full > tiny.yaml`")
    return parse_config(read_yaml_file(path, error_cls=ConfigError), f"'{path}'")


def parse_yaml(text: str, source: str = "config") -> TrainConfig:
    """Validate a YAML document given as text."""
    return parse_config(load_yaml(text, source, error_cls=ConfigError), source)
