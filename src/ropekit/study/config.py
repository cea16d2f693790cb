"""A study's configuration: one base model, its variants (methods), one shared training recipe, the evaluations.

A study config is a YAML mapping (``ropekit study CONFIG.yaml``, or a preset: ``ropekit study --preset quick``;
``ropekit study --preset quick --show`` prints it)::

    name: quick
    model: builtin-base        # the built-in base model (pre-trained on first use), or any model ropekit loads
    seed: 0
    target_length: 1024        # the length every method extends to (factors are set for it)
    recipe:                    # the ONE training recipe of every fine-tuned variant: a [train] config
      data: {seq_len: 1024, sources: [{path: builtin}]}     #   without model/method/output
      train: {max_steps: 60, lr: 5.0e-4, micro_batch_size: 2}
    variants:                  # evaluated in this order; label is what the report shows
      - {label: base}
      - {label: ntk, method: ntk, params: {factor: 4}}                      # frozen: evaluated as installed
      - {label: yarn-ft, method: yarn, params: {factor: 4}, finetune: true} # trained with the recipe
      - label: pose-yarn                                                    # recipe + overrides
        method: yarn
        params: {factor: 4}
        finetune: {data: {seq_len: 256, pose: {target_length: 1024}}}
      - {label: lr-search, search: {evaluations: 64}}  # LongRoPE factors searched for target_length (ropekit search;
                                                       #   evaluations, documents, population, fixed_pairs)
    device: auto               # auto | cpu | cuda | cuda:N | mps (dtype: auto | float32 | bfloat16 | float16;
                               #   attn: auto | sdpa | eager | flash_attention_2 | flex_attention)
    resources: {train: {gpus: 8}, eval: {gpus: 1}}   # what each piece kind asks Ray for (--backend ray)
    evals:                     # task → options of that task's run() (see `ropekit eval --help`)
      ppl: {lengths: [256, 512, 1024, 2048], samples: 4, score_mode: truncate}
      passkey: {lengths: [256, 1024, 2048], depths: [0.1, 0.5, 0.9], trials: 2}

Every problem is one line naming the key and the fix (:class:`StudyConfigError`). The parsed config is
:class:`StudyConfig`; :meth:`StudyConfig.as_dict` is what the results database records as the study's
configuration (a study directory refuses a different one).
"""

from __future__ import annotations

import copy
import difflib
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import RopekitError

TOP_KEYS = ("name", "model", "seed", "target_length", "window", "recipe", "variants", "evals", "description",
            "device", "dtype", "attn", "resources")
#: Piece kinds a ``resources:`` entry may name, and the resources each may ask for (``--backend ray``).
RESOURCE_KINDS = ("pretrain", "train", "search", "eval")
RESOURCE_KEYS = ("cpus", "gpus")
VARIANT_KEYS = ("label", "method", "params", "finetune", "search", "note")
#: Keys of a variant's ``search:`` (LongRoPE's factor search, :mod:`ropekit.search`), with their minimum.
SEARCH_KEYS = {"evaluations": 4, "documents": 1, "population": 4, "fixed_pairs": 0}
#: Keys the recipe may not set: the study decides them per variant.
RECIPE_FORBIDDEN = ("method", "stages")
#: The built-in base model's name in a study config.
BUILTIN_BASE = "builtin-base"
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


class StudyConfigError(RopekitError):
    """A study config key is unknown, missing or has a bad value."""


def _fail(key: str, problem: str, fix: str):
    raise StudyConfigError(f"study config: {key} {problem}", fix)


def _unknown(where: str, raw: dict, known) -> None:
    from ..train.config import ConfigError
    from ..train.config import _unknown as unknown_keys

    try:
        unknown_keys(where.rstrip("."), raw, known)
    except ConfigError as err:
        raise StudyConfigError(f"study config: {err.problem}", err.fix) from None


def _mapping(value, key: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        _fail(key, f"must be a mapping, got {type(value).__name__}", f"write `{key}:` followed by indented `name: value` lines")
    return value


def _positive_int(value, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _fail(key, f"must be a positive whole number, got {value!r}", f"write e.g. `{key}: 1024`")
    return value


@dataclass(frozen=True)
class Variant:
    """One row of the comparison: a method with its parameters, frozen or fine-tuned with the recipe."""

    label: str
    method: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    #: None: evaluated as installed (frozen); a dict: fine-tuned with the recipe deep-merged with these overrides.
    finetune: dict[str, Any] | None = None
    note: str | None = None
    #: None, or the settings of a LongRoPE factor search (``method`` is then ``longrope``, its factors the result).
    search: dict[str, Any] | None = None

    @property
    def trained(self) -> bool:
        return self.finetune is not None

    @property
    def produced_by(self) -> str | None:
        """The piece whose model this variant evaluates (its training or its search), or None (frozen)."""
        if self.finetune is not None:
            return f"train:{self.label}"
        if self.search is not None:
            return f"search:{self.label}"
        return None

    def as_dict(self) -> dict[str, Any]:
        out = {"label": self.label, "method": self.method, "params": dict(self.params), "finetune": self.finetune,
               "note": self.note}
        if self.search is not None:  # only when given: the recorded configuration of older studies stays the same
            out["search"] = dict(self.search)
        return out


@dataclass
class StudyConfig:
    name: str
    model: str
    target_length: int
    variants: list[Variant]
    evals: dict[str, dict[str, Any]]
    recipe: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    window: int | None = None
    description: str | None = None
    #: Where evaluations run (``auto``: CUDA with bf16 when a GPU is present, else CPU float32) and with which kernel.
    device: str = "auto"
    dtype: str = "auto"
    attn: str = "auto"
    #: What each piece kind asks Ray for (``--backend ray``): ``{kind: {"cpus": n, "gpus": n}}``.
    resources: dict[str, dict[str, float]] = field(default_factory=dict)

    def as_dict(self, placement: bool = False) -> dict[str, Any]:
        """The study's identity (what the results database records; a directory refuses another one). With
        ``placement``, also where it runs (device, dtype, attn, resources), which may change between runs."""
        out = {"name": self.name, "model": self.model, "seed": self.seed, "target_length": self.target_length,
               "window": self.window, "recipe": copy.deepcopy(self.recipe), "description": self.description,
               "variants": [v.as_dict() for v in self.variants], "evals": copy.deepcopy(self.evals)}
        if placement:
            out.update(device=self.device, dtype=self.dtype, attn=self.attn, resources=copy.deepcopy(self.resources))
        return out

    def variant(self, label: str) -> Variant:
        for v in self.variants:
            if v.label == label:
                return v
        raise StudyConfigError(f"no variant '{label}' in study '{self.name}'",
                               f"choose one of {', '.join(v.label for v in self.variants)}")


def _parse_variant(raw, i: int, recipe: dict) -> Variant:
    key = f"variants[{i}]"
    if isinstance(raw, str):
        raw = {"label": raw, "method": None if raw in ("base", "plain") else raw}
    raw = _mapping(raw, key)
    _unknown(f"{key}.", raw, VARIANT_KEYS)
    label = raw.get("label")
    if not isinstance(label, str) or not _LABEL.match(label):
        _fail(f"{key}.label", f"must be a short name of letters, digits and . _ + -, got {label!r}", "write e.g. `label: yarn-ft`")
    method = raw.get("method")
    params = dict(_mapping(raw.get("params"), f"{key}.params"))
    search = _parse_search(raw.get("search"), key)
    if search is not None:
        if method not in (None, "longrope"):
            _fail(f"{key}.search", f"searches LongRoPE factors, but the variant's method is {method!r}",
                  "drop `method:` (or write method: longrope)")
        if params:
            _fail(f"{key}.params", "given with search: the search finds the factors", "drop params")
        if raw.get("finetune") not in (None, False):
            _fail(f"{key}.search", "and finetune in one variant", "search in one variant, fine-tune in another")
        method = "longrope"
    if method is not None and search is None:
        from ..train.config import check_method_params

        if not isinstance(method, str):
            _fail(f"{key}.method", f"must be a method name, got {method!r}", "run `ropekit methods` to list them")
        try:
            params = check_method_params(method, params, f"{key}.params")
        except RopekitError as err:
            raise StudyConfigError(f"study config: {err.problem}", err.fix) from None
    elif params:
        _fail(f"{key}.params", "given without a method", "add `method: NAME` or drop params")
    finetune = raw.get("finetune", False)
    if finetune is True:
        finetune = {}
    elif finetune is False or finetune is None:
        finetune = None
    else:
        finetune = copy.deepcopy(_mapping(finetune, f"{key}.finetune"))
        for bad in RECIPE_FORBIDDEN:
            if bad in finetune:
                _fail(f"{key}.finetune.{bad}", "is set by the study itself", "drop it (the variant's method is its own key)")
    if finetune is not None and not recipe:
        _fail(f"{key}.finetune", "asks for training but the study has no recipe", "add a `recipe:` section (data + train)")
    note = raw.get("note")
    return Variant(label=label, method=method, params=params, finetune=finetune, note=str(note) if note else None,
                   search=search)


def _parse_search(raw, key: str) -> dict[str, Any] | None:
    """A variant's ``search:`` — ``true`` or a mapping of :data:`SEARCH_KEYS` (whole numbers) — or None."""
    if raw is None or raw is False:
        return None
    raw = {} if raw is True else _mapping(raw, f"{key}.search")
    _unknown(f"{key}.search.", raw, tuple(SEARCH_KEYS))
    out = {}
    for name, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < SEARCH_KEYS[name]:
            _fail(f"{key}.search.{name}", f"must be a whole number ≥ {SEARCH_KEYS[name]}, got {value!r}",
                  f"write e.g. `{name}: {max(SEARCH_KEYS[name], 4)}`")
        out[name] = value
    return out


def _check_evals(raw) -> dict[str, dict[str, Any]]:
    from ..eval import TASKS

    evals = _mapping(raw, "evals")
    if not evals:
        _fail("evals", "is missing or empty", "add e.g. `evals: {ppl: {lengths: [256, 512]}}`")
    out = {}
    for task, options in evals.items():
        if task not in TASKS:
            close = difflib.get_close_matches(str(task), list(TASKS), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            _fail(f"evals.{task}", "is not an evaluation task", f"{hint}choose from {', '.join(TASKS)}")
        options = copy.deepcopy(_mapping(options, f"evals.{task}"))
        if task == "speed":
            _fail("evals.speed", "is not run by studies yet", "measure speed with `ropekit eval speed --methods …`")
        if "lengths" not in options:
            _fail(f"evals.{task}.lengths", "is missing", "add e.g. `lengths: [256, 512, 1024]`")
        lengths = options["lengths"]
        if not isinstance(lengths, list) or not lengths:
            _fail(f"evals.{task}.lengths", f"must be a list of token counts, got {lengths!r}", "write e.g. `lengths: [256, 512]`")
        options["lengths"] = [_positive_int(n, f"evals.{task}.lengths[{j}]") for j, n in enumerate(lengths)]
        for forbidden in ("plot", "out", "resume"):
            if forbidden in options:
                _fail(f"evals.{task}.{forbidden}", "is decided by the study", "drop it (figures come from `ropekit report`)")
        import inspect

        from ..eval import get_task

        accepted = set(inspect.signature(get_task(task).run).parameters) - {"ctx"}
        for opt in options:
            if opt not in accepted:
                _fail(f"evals.{task}.{opt}", "is not an option of this task", f"options: {', '.join(sorted(accepted - {'plot'}))}")
        out[task] = options
    return out


def parse_study(raw: Any, source: str = "study config") -> StudyConfig:
    """Validate a study config mapping into a :class:`StudyConfig`."""
    if not isinstance(raw, dict):
        raise StudyConfigError(f"{source} is not a YAML mapping", "start from `ropekit study --preset quick --show`")
    _unknown("", raw, TOP_KEYS)
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        _fail("name", "is missing", "add e.g. `name: my-study`")
    model = raw.get("model")
    if not isinstance(model, str) or not model.strip():
        _fail("model", "is missing", f"add `model: {BUILTIN_BASE}` (the built-in base) or a model path/name")
    if "target_length" not in raw:
        _fail("target_length", "is missing", "add e.g. `target_length: 1024` (the length methods extend to)")
    target = _positive_int(raw["target_length"], "target_length")
    window = _positive_int(raw["window"], "window") if raw.get("window") is not None else None
    if window is not None and target <= window:
        _fail("target_length", f"{target} is not beyond the window {window}", "choose a target length larger than the window")
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        _fail("seed", f"must be a whole number ≥ 0, got {seed!r}", "write e.g. `seed: 0`")
    recipe = copy.deepcopy(_mapping(raw.get("recipe"), "recipe"))
    for bad in RECIPE_FORBIDDEN:
        if bad in recipe:
            _fail(f"recipe.{bad}", "is set by the study itself", "drop it: each variant brings its own method")
    if "name" in _mapping(recipe.get("model"), "recipe.model"):
        _fail("recipe.model.name", "is set by the study itself", "drop it: the study's `model:` is every variant's base")
    if "dir" in _mapping(recipe.get("output"), "recipe.output"):
        _fail("recipe.output.dir", "is set by the study itself", "drop it: runs go to DIR/runs/LABEL")
    variants_raw = raw.get("variants")
    if not isinstance(variants_raw, list) or not variants_raw:
        _fail("variants", "is missing or empty", "add a list, e.g. `variants: [{label: base}, {label: pi, method: pi, params: {factor: 4}}]`")
    variants = [_parse_variant(v, i, recipe) for i, v in enumerate(variants_raw)]
    labels = [v.label for v in variants]
    for label in labels:
        if labels.count(label) > 1:
            _fail("variants", f"use the label '{label}' twice", "give every variant its own label")
    config = StudyConfig(name=name.strip(), model=model.strip(), target_length=target, variants=variants,
                         evals=_check_evals(raw.get("evals")), recipe=recipe, seed=seed, window=window,
                         description=raw.get("description"), resources=_parse_resources(raw.get("resources")),
                         **_placement_keys(raw))
    if recipe:
        _check_recipe(config)
    return config


def _placement_keys(raw: dict) -> dict[str, str]:
    """``device``/``dtype``/``attn`` (default ``auto``), checked against the choices; whether this machine has
    the device is checked when the study starts (:func:`ropekit.runtime.devices.resolve_devices`)."""
    from ..runtime.devices import ATTN_CHOICES, DTYPE_CHOICES

    out = {}
    for key, choices in (("dtype", DTYPE_CHOICES), ("attn", ATTN_CHOICES)):
        value = raw.get(key, "auto")
        if value not in choices:
            _fail(key, f"must be one of {', '.join(choices)}, got {value!r}", f"write e.g. `{key}: auto`")
        out[key] = value
    device = raw.get("device", "auto")
    if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", device):
        _fail("device", f"must be auto, cpu, cuda, cuda:N or mps, got {device!r}", "write e.g. `device: auto`")
    out["device"] = device
    return out


def _parse_resources(raw) -> dict[str, dict[str, float]]:
    """``resources: {train: {gpus: 8}, eval: {gpus: 1, cpus: 4}}``: what each piece kind asks Ray for."""
    resources = _mapping(raw, "resources")
    _unknown("resources.", resources, RESOURCE_KINDS)
    out: dict[str, dict[str, float]] = {}
    for kind, wanted in resources.items():
        wanted = _mapping(wanted, f"resources.{kind}")
        _unknown(f"resources.{kind}.", wanted, RESOURCE_KEYS)
        for name, value in wanted.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                _fail(f"resources.{kind}.{name}", f"must be a number ≥ 0, got {value!r}", f"write e.g. `{name}: 1`")
        out[kind] = {k: float(v) for k, v in wanted.items()}
    return out


def train_config_for(config: StudyConfig, variant: Variant, model_path: str, out_dir: str | Path):
    """The [train] config of ``variant``: the recipe, the variant's overrides, its method and output."""
    from ..train.config import deep_merge, parse_config

    raw = deep_merge(copy.deepcopy(config.recipe), copy.deepcopy(variant.finetune or {}))
    raw["model"] = {**raw.get("model", {}), "name": model_path}
    raw["method"] = {"name": variant.method, "params": dict(variant.params)} if variant.method else None
    if raw["method"] is None:
        del raw["method"]
    train = dict(raw.get("train") or {})
    train.setdefault("seed", config.seed)
    raw["train"] = train
    raw["output"] = {"save_every": 20, "keep_last": 1, **raw.get("output", {}), "dir": str(out_dir), "log_every": 1}
    return parse_config(raw, f"study recipe for '{variant.label}'")


def _check_recipe(config: StudyConfig) -> None:
    """Parse every fine-tuned variant's training config now, so a bad recipe fails before hours of work."""
    try:
        for v in config.variants:
            if v.trained:
                train_config_for(config, v, "tiny", "unused")
    except RopekitError as err:
        raise StudyConfigError(err.problem, err.fix) from None


# ---- presets ------------------------------------------------------------------------------------------------
def preset_names() -> list[str]:
    folder = resources.files("ropekit.study") / "presets"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def preset_text(name: str) -> str:
    names = preset_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise StudyConfigError(f"unknown study preset '{name}'", f"{hint}choose one of: {', '.join(names)}")
    return (resources.files("ropekit.study") / "presets" / f"{name}.yaml").read_text(encoding="utf-8")


def _yaml(text: str, source: str):
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise StudyConfigError(f"{source} is not valid YAML ({getattr(err, 'problem', None) or 'syntax'}{where})",
                               "fix the YAML syntax") from None


def load_study_config(path: str | Path | None = None, *, preset: str | None = None) -> StudyConfig:
    """A study config from a YAML file or a named preset (exactly one of them)."""
    if (path is None) == (preset is None):
        raise StudyConfigError("give a study config file or --preset NAME (exactly one)",
                               f"e.g. `ropekit study --preset quick` (presets: {', '.join(preset_names())})")
    if preset is not None:
        return parse_study(_yaml(preset_text(preset), f"preset '{preset}'"), f"preset '{preset}'")
    p = Path(path).expanduser()
    if not p.is_file():
        raise StudyConfigError(f"study config '{p}' not found",
                               "pass a YAML file, e.g. from `ropekit study --preset quick --show > my.yaml`")
    return parse_study(_yaml(p.read_text(encoding="utf-8"), f"'{p}'"), f"'{p}'")
