"""A study's configuration: one base model, its variants (methods), one shared training recipe, the evaluations.

A study config is a YAML mapping (``ropekit study CONFIG.yaml``, or a preset: ``ropekit study --preset quick``;
``ropekit study --preset quick --show`` prints it)::

    name: quick
    model: builtin-base        # the built-in base model (pre-trained on first use), or any model ropekit loads
    seed: 0
    seeds: [0, 1, 2]           # optional: train (and search) every such variant once per seed; frozen ones once
    target_length: 1024        # the length every method extends to (a scale method without a factor gets it)
    recipe:                    # the ONE training recipe of every fine-tuned variant: a [train] config
      data: {seq_len: 1024, sources: [{path: builtin}]}     #   without model/method/output
      train: {max_steps: 60, lr: 5.0e-4, micro_batch_size: 2}
    variants:                  # evaluated in this order; label is what the report shows
      - {label: base}
      - {label: ntk, method: ntk, params: {factor: 4}}                      # frozen: evaluated as installed
      - {label: base-ft, finetune: true}                                    # the control: plain RoPE, same recipe
      - {label: yarn-ft, method: yarn, params: {factor: 4}, finetune: true} # trained with the recipe
      - label: pose-yarn                                                    # recipe + overrides
        method: yarn
        params: {factor: 4}
        finetune: {data: {seq_len: 256, pose: {target_length: 1024}}}
      - {label: lr-search, search: {evaluations: 64}}  # LongRoPE factors searched for target_length (ropekit search;
                                                       #   evaluations, documents, population, fixed_pairs,
                                                       #   start_tokens: N, [a, b, c] or paper)
    device: auto               # auto | cpu | cuda | cuda:N | mps (dtype: auto | float32 | bfloat16 | float16;
                               #   attn: auto | sdpa | eager | flash_attention_2 | flex_attention)
    resources: {train: {gpus: 8}, eval: {gpus: 1}}   # what each piece kind asks Ray for (--backend ray)
    pretrain: false            # true (or `ropekit study --pretrain`): pre-train builtin-base here, not the shipped one
    evals:                     # task → options of that task's run() (see `ropekit eval --help`)
      ppl: {lengths: [256, 512, 1024, 2048], samples: 4, score_mode: truncate}
      passkey: {lengths: [256, 1024, 2048], depths: [0.1, 0.5, 0.9], trials: 2}
      ppl-same-targets:        # a second entry of one task: `task:` names it; records carry the entry's name
        {task: ppl, lengths: [256, 512, 1024, 2048], samples: 4, score_mode: same_targets}

A study may state what its results should show (``claims:``, below and :class:`_Claims`): the report judges each
claim by its rule (:mod:`ropekit.study.report_findings`). The quick and standard presets carry the LCEG/PoSE
claims (a)–(f)::

    claims:
      base: base                # the model as it is
      control: base-ft          # the plain model fine-tuned with the recipe
      families:                 # named sets of variants a claim can refer to
        ntk-yarn-ft: [ntk-ft, yarn-ft]
      items:
        - {id: b, claim: "…", source: "LCEG §4", compare: length_ratio, variants: ntk-yarn-ft, to: target, at_most: 1.10}
        - {id: f, claim: "…", source: "LCEG §4", compare: pair_ratio, pairs: [[yarn-ft, yarn]], expect: below}

The file is checked by pydantic models (:class:`~ropekit.core.schema.StrictModel`, one per section, the
recipe by :mod:`ropekit.train.config`); every problem is one line naming the key and the fix
(:class:`StudyConfigError`). The parsed config is :class:`StudyConfig`; :meth:`StudyConfig.as_dict` is what the
results database records as the study's configuration (a study directory refuses a different one, except for added
or dropped variants and edited notes: :meth:`ropekit.study.store.StudyStore.initialize`).
"""

from __future__ import annotations

import copy
import difflib
import inspect
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ..core.schema import MAX_POSITIONS, ConfigProblem, Name, Number, StrictModel, config_error, load_yaml, read_yaml_file
from ..errors import RopekitError
from ..runtime.devices import ATTN_CHOICES, DTYPE_CHOICES

#: Keys the recipe may not set: the study decides them per variant.
RECIPE_FORBIDDEN = ("method", "stages")
#: The built-in base model's name in a study config.
BUILTIN_BASE = "builtin-base"
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


class StudyConfigError(RopekitError):
    """A study config key is unknown, missing or has a bad value."""


def _problem(problem: str, fix: str, key: str | None = None) -> ConfigProblem:
    """A problem written with the key as its subject: ``variants is missing or empty``."""
    return ConfigProblem(problem, fix, key=key, sentence=True)


def _as_config_keys(text: str) -> str:
    """An evaluation's one-line error in a config's words: its ``--some-flag`` read as the key ``some_flag:``, and
    a switch's ``--no-some-flag`` as ``some_flag: false``."""
    text = re.sub(r"--no-([a-z][a-z-]*)", lambda m: f"`{m.group(1).replace('-', '_')}: false`", text)
    return re.sub(r"--([a-z][a-z-]*)", lambda m: f"`{m.group(1).replace('-', '_')}:`", text)


def _each_once(names: list[str], what: str, fix: str) -> None:
    """Refuse the first name that appears twice (a label, a claim id)."""
    for name in names:
        if names.count(name) > 1:
            raise _problem(f"use the {what} '{name}' twice", fix)


def _is_token_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_POSITIONS


def _token_count(value: Any) -> int:
    if not _is_token_count(value):
        raise _problem(f"must be a positive whole number of tokens up to {MAX_POSITIONS:,}, got {value!r}",
                       "write a number of tokens, e.g. 1024")
    return value


#: Task options that count something (samples, trials, query positions, tokens): zero or fewer is no measurement.
COUNT_OPTIONS = ("samples", "trials", "positions", "stride", "tokens_to_generate")


#: A length in tokens: a whole number ≥ 1.
TokenCount = Annotated[int, BeforeValidator(_token_count)]


def _on_off(value: Any) -> Any:
    """``true``: on with the defaults (``{}``); ``false`` or ``null``: off."""
    if value is True:
        return {}
    return None if value is False else value


# ---- the parsed config -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """One row of the comparison: a method with its parameters, frozen or fine-tuned with the recipe."""

    label: str
    method: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    #: None: evaluated as installed (frozen); a dict: fine-tuned with the recipe deep-merged with these overrides.
    finetune: dict[str, Any] | None = None
    #: Free text the report's method card shows. It documents the variant rather than defining what runs, so it
    #: is recorded with the config but is no part of the study's identity: editing it resumes the study
    #: (:data:`ropekit.study.store.VARIANT_DOCUMENTATION`).
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
    #: Training seeds: every fine-tuned (and searched) variant is trained once per seed; None means ``[seed]``.
    seeds: list[int] | None = None
    #: Pre-train the built-in base model here instead of starting from the one shipped in the package (how the
    #: study runs, not what it is: not part of its identity).
    pretrain: bool = False
    #: What the results should show (``claims:`` as written, validated), or None. How the results are judged, not
    #: what is run: not part of the study's identity (a study resumes under revised claims); the manifest records
    #: them beside the config, for the report.
    claims: dict[str, Any] | None = None

    @property
    def training_seeds(self) -> list[int]:
        """The seeds each fine-tuned or searched variant is produced with (``seeds``, else just ``seed``)."""
        return list(self.seeds) if self.seeds else [self.seed]

    def eval_task(self, name: str) -> str:
        """The evaluation task an ``evals:`` entry runs: its ``task:`` key, else its name."""
        return str(self.evals[name].get("task", name))

    def eval_options(self, name: str) -> dict[str, Any]:
        """The options an ``evals:`` entry passes to its task's ``run()`` (everything but ``task:``)."""
        return {k: copy.deepcopy(v) for k, v in self.evals[name].items() if k != "task"}

    def as_dict(self, placement: bool = False) -> dict[str, Any]:
        """The study's identity (what the results database records; a directory refuses another one) — each
        variant's ``note`` aside, which is recorded for the report but may change. With ``placement``, also where
        it runs (device, dtype, attn, resources), which may change between runs."""
        out = {"name": self.name, "model": self.model, "seed": self.seed, "target_length": self.target_length,
               "window": self.window, "recipe": copy.deepcopy(self.recipe), "description": self.description,
               "variants": [v.as_dict() for v in self.variants], "evals": copy.deepcopy(self.evals)}
        if self.seeds is not None:  # only when given: the recorded configuration of older studies stays the same
            out["seeds"] = list(self.seeds)
        if placement:
            out.update(device=self.device, dtype=self.dtype, attn=self.attn, resources=copy.deepcopy(self.resources),
                       pretrain=self.pretrain)
        return out

    def variant(self, label: str) -> Variant:
        for v in self.variants:
            if v.label == label:
                return v
        raise StudyConfigError(f"no variant '{label}' in study '{self.name}'",
                               f"choose one of {', '.join(v.label for v in self.variants)}")


# ---- the file, as written ----------------------------------------------------------------------------------
class _Search(StrictModel):
    """A variant's ``search:`` (``true``, or some of these): LongRoPE's factor search, :mod:`ropekit.search`.
    A key left out takes the search's default."""

    evaluations: int | None = Field(default=None, ge=4, examples=[64])
    documents: int | None = Field(default=None, ge=1, examples=[4])
    population: int | None = Field(default=None, ge=4, examples=[16])
    fixed_pairs: int | None = Field(default=None, ge=0, examples=[0])
    #: n̂ (LongRoPE §3.2): one value for every candidate, a list searched among, or ``paper`` (the paper's set).
    start_tokens: Annotated[int, Field(ge=0)] | list[Annotated[int, Field(ge=0)]] | Literal["paper"] | None = Field(
        default=None, examples=[4, "[0, 4, 16]", "paper"])
    #: The largest factor tried (default: LongRoPE Table 1's 1.25·s; at least s).
    max_factor: float | None = Field(default=None, gt=1, examples=[5.0])


class _Variant(StrictModel):
    """One item of ``variants:`` — or just a label (``base``/``plain``: the model as it is; else a method name)."""

    label: str = Field(examples=["yarn-ft"])
    method: str | None = Field(default=None, examples=["yarn"])
    params: dict[str, Any] = Field(default_factory=dict, examples=["{factor: 4}"])
    finetune: dict[str, Any] | None = Field(default=None, examples=["true"])
    search: _Search | None = None
    note: Any = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, raw: Any) -> Any:
        if isinstance(raw, str):
            return {"label": raw, "method": None if raw in ("base", "plain") else raw}
        return raw

    @field_validator("params", mode="before")
    @classmethod
    def _no_params(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("finetune", "search", mode="before")
    @classmethod
    def _optional_section(cls, value: Any) -> Any:
        return _on_off(value)

    @field_validator("label")
    @classmethod
    def _short_name(cls, label: str) -> str:
        if not _LABEL.match(label):
            raise _problem(f"must be a short name of letters, digits and . _ + -, got {label!r}", "write e.g. `label: yarn-ft`")
        return label

    @field_validator("finetune")
    @classmethod
    def _recipe_overrides_only(cls, finetune: dict[str, Any] | None) -> dict[str, Any] | None:
        for key in RECIPE_FORBIDDEN:
            if key in (finetune or {}):
                raise _problem("is set by the study itself", "drop it (the variant's method is its own key)", key=key)
        _study_owned_sections(finetune or {})
        return finetune

    @model_validator(mode="after")
    def _method_and_params(self) -> _Variant:
        if self.search is not None:
            from ..methods.longrope import LongRoPE  # not at the top: the methods import torch

            if self.method not in (None, LongRoPE.name):
                raise _problem(f"searches LongRoPE factors, but the variant's method is {self.method!r}",
                               f"drop `method:` (or write method: {LongRoPE.name})", key="search")
            if self.params:
                raise _problem("given with search: the search finds the factors", "drop params", key="params")
            if self.finetune is not None:
                raise _problem("and finetune in one variant", "search in one variant, fine-tune in another", key="search")
            self.method = LongRoPE.name
        elif self.method is not None:
            from ..train.config import (
                check_method_params,  # not at the top: ropekit.train imports torch
            )

            self.params = check_method_params(self.method, self.params, name_key="method")
        elif self.params:
            raise _problem("given without a method", "add `method: NAME` or drop params", key="params")
        return self

    def parsed(self) -> Variant:
        search = None if self.search is None else self.search.model_dump(exclude_none=True)
        return Variant(label=self.label, method=self.method, params=self.params, finetune=copy.deepcopy(self.finetune),
                       note=str(self.note) if self.note else None, search=search)


def _study_owned_sections(recipe: dict[str, Any]) -> None:
    """The recipe's keys the study sets for every training (the recipe's and each variant's ``finetune:``): the base
    model, where a run goes and that it logs every step (the report reads every step's loss)."""
    for section, key, fix in (("model", "name", "drop it: the study's `model:` is every variant's base"),
                              ("output", "dir", "drop it: runs go to DIR/runs/LABEL"),
                              ("output", "log_every", "drop it: a study records every step's loss")):
        part = recipe.get(section)
        if part is not None and not isinstance(part, dict):
            raise ConfigProblem(f"must be a mapping of keys to values, got {part!r}",
                                f"write it as `{section}:` with indented keys", key=section)
        if key in (part or {}):
            raise _problem("is set by the study itself", fix, key=f"{section}.{key}")


def _scale_to_target(variant: _Variant, target_length: int) -> None:
    """A variant whose method takes its size from a target (PI, NTK, YaRN, Self-Extend without a group size, …) and
    is given none extends to the study's ``target_length``, in training and in every evaluation alike (left to each
    evaluation, it was sized to that evaluation's longest length; left to training, not extended at all)."""
    if variant.method is None or variant.search is not None:
        return
    from ..methods import get_method  # not at the top: the methods import torch

    if get_method(variant.method).sized_by_target(variant.params):
        variant.params["target_length"] = target_length


class _Ask(StrictModel):
    """What one kind of piece asks Ray for."""

    cpus: float | None = Field(default=None, ge=0, examples=[1])
    gpus: float | None = Field(default=None, ge=0, examples=[1])


class _Resources(StrictModel):
    """``resources:`` — what each kind of piece asks Ray for (``--backend ray``)."""

    pretrain: _Ask | None = None
    train: _Ask | None = None
    search: _Ask | None = None
    eval: _Ask | None = None

    def parsed(self) -> dict[str, dict[str, float]]:
        return {kind: ask.model_dump(exclude_none=True) for kind, ask in self if ask is not None}


#: How each claim compares (``compare:``), with the keys it takes: see :class:`_Claim`.
COMPARISONS = ("length_ratio", "retrieval_beyond_window", "pair_ratio", "pair_difference", "correlation")
#: What a claim's ``variants:``, ``contrast:`` or a pair may name besides labels and families.
ROLES = ("base", "control")


class _Claim(StrictModel):
    """One item of ``claims.items``: a statement, where it comes from, and the rule that judges it.

    * ``length_ratio``: each of ``variants`` against itself, perplexity at ``to`` (``target``: the target length;
      ``beyond``: every length past the window, judged at the longest) over the in-window length, paired over
      documents (on the same-targets perplexity entry when the study scored one); ``expect: above``/``below``
      (the interval excludes 1 on that side) or ``at_most: BOUND`` (holds when the interval's upper end is at most
      BOUND, does not hold when its lower end is above it); ``contrast``: a variant shown beside them.
    * ``retrieval_beyond_window``: for each of ``tasks`` evaluated, the base model's mean accuracy beyond the window
      has a 95 % upper bound at most ``near_zero`` (and, with ``beaten: true``, some variant is significantly above
      it); does not hold when its lower bound exceeds ``near_zero``.
    * ``pair_ratio``: for each pair ``[a, b]`` of ``pairs``, perplexity ratio a/b at the target on ``task``
      (default ``ppl``), paired over documents: ``expect: above``/``below``, or ``within: M`` (inside
      ``[1/(1+M), 1+M]``; outside it entirely: does not hold). ``with_retrieval``: also show the first of these tasks
      evaluated, beyond the window.
    * ``pair_difference``: for each pair, accuracy difference a − b on ``task`` at the target, paired over prompts:
      ``expect: above``/``below``.
    * ``correlation``: Kendall τ between perplexity and accuracy across variants at the target (pooled over tasks
      when several): ``expect: below`` (lower perplexity, higher accuracy) or ``above``.

    ``claim`` is the sentence the report shows; in a retrieval claim ``{tasks}`` becomes the tasks evaluated.
    """

    id: Name = Field(examples=["a"])
    claim: Name = Field(examples=["The base model's perplexity rises past its pretrained window."])
    source: Name = Field(examples=["LCEG §4 (Fig. 3, Table 3)"])
    compare: Literal[COMPARISONS]
    variants: Name | list[Name] | None = Field(default=None, examples=["base", "ntk-yarn-ft", "[yarn-ft]"])
    to: Literal["target", "beyond"] | None = None
    contrast: Name | None = None
    pairs: list[Annotated[list[Name], Field(min_length=2, max_length=2)]] | None = Field(
        default=None, examples=["[[pose-yarn, yarn-ft]]"])
    tasks: list[Name] | None = Field(default=None, examples=["[passkey, niah, ruler]"])
    task: Name | None = Field(default=None, examples=["passkey"])
    with_retrieval: list[Name] | None = Field(default=None, examples=["[passkey, niah, ruler]"])
    #: How the rule names what a pair compares (default: "per pair [a, b], ratio ppl(a)/ppl(b)").
    quantity: Name | None = Field(default=None, examples=["per pair, ratio ppl(PoSE)/ppl(full-length fine-tuning)"])
    expect: Literal["above", "below"] | None = None
    at_most: Number | None = Field(default=None, gt=0, examples=[1.1])
    within: Number | None = Field(default=None, gt=0, examples=[0.1])
    near_zero: Number | None = Field(default=None, ge=0, le=1, examples=[0.1])
    beaten: bool = False

    @model_validator(mode="after")
    def _keys_of_its_comparison(self) -> _Claim:
        needs = {"length_ratio": ("variants", "to"), "retrieval_beyond_window": ("tasks", "near_zero"),
                 "pair_ratio": ("pairs",), "pair_difference": ("pairs", "task", "expect"), "correlation": ("expect",)}
        takes = {"length_ratio": {"variants", "to", "contrast", "expect", "at_most"},
                 "retrieval_beyond_window": {"tasks", "near_zero", "beaten"},
                 "pair_ratio": {"pairs", "expect", "within", "with_retrieval", "quantity", "task"},
                 "pair_difference": {"pairs", "task", "expect", "quantity"}, "correlation": {"expect"}}[self.compare]
        for key in needs[self.compare]:
            if getattr(self, key) is None:
                raise _problem(f"is missing for compare: {self.compare}", f"add `{key}:` (e.g. as the quick preset does: `ropekit study --preset quick --show`)", key=key)
        given = {k for k in self.model_fields_set if k not in ("id", "claim", "source", "compare")}
        for key in sorted(given - takes):
            raise _problem(f"is not a key of compare: {self.compare}", f"drop it; {self.compare} takes "
                           f"{', '.join(sorted(takes))}", key=key)
        decided = [k for k in ("expect", "at_most", "within") if getattr(self, k) is not None]
        if self.compare in ("length_ratio", "pair_ratio") and len(decided) != 1:
            raise _problem("needs exactly one rule", "give one of expect, at_most (length_ratio), within (pair_ratio)",
                           key="expect")
        return self


class _Claims(StrictModel):
    """``claims:`` — what the study's results should show, judged by the report (:class:`_Claim`).

    A claim may name variants the study does not have (yet): it is then *not measured* for them, as for a
    study that lacks a length the claim needs, so a preset can state its claims before every variant exists."""

    base: Name | None = Field(default=None, examples=["base"])
    control: Name | None = Field(default=None, examples=["base-ft"])
    families: dict[Name, list[Name]] = Field(default_factory=dict, examples=["{ntk-yarn-ft: [ntk-ft, yarn-ft]}"])
    items: list[_Claim] = Field(min_length=1)

    @field_validator("items")
    @classmethod
    def _ids_once(cls, items: list[_Claim]) -> list[_Claim]:
        _each_once([c.id for c in items], "id", "give every claim its own id")
        return items


def _one_longbench_suite(name: str, datasets: Any) -> None:
    """A study's LongBench cell is the mean over its datasets, so they are named in the config (the files in a
    folder would otherwise decide what a cell means, machine by machine) and come from one suite: LongBench-E's
    ``_e`` datasets are LongBench's resampled by length, and one mean over both counts a dataset twice."""
    if not datasets:
        raise _problem("is missing", "name the datasets of this cell, e.g. `tasks: [hotpotqa, qasper]`",
                       key=f"{name}.tasks")
    suites = {str(d).endswith("_e") for d in datasets}
    if len(suites) > 1:
        raise _problem("mixes LongBench and LongBench-E (_e) datasets, whose mean would count a dataset twice",
                       "make two evaluations, e.g. `longbench-e: {task: longbench, tasks: [hotpotqa_e], lengths: …}`",
                       key=f"{name}.tasks")


class _Study(StrictModel):
    """A study config as written (module doc)."""

    name: Name = Field(examples=["my-study"])
    model: Name = Field(examples=[BUILTIN_BASE])
    seed: int = Field(default=0, ge=0, examples=[0])
    seeds: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, examples=["[0, 1, 2]"])
    target_length: TokenCount = Field(examples=[1024])
    window: TokenCount | None = None
    recipe: dict[str, Any] = Field(default_factory=dict)
    variants: list[_Variant] = Field(default_factory=list, validate_default=True)
    evals: dict[str, dict[str, Any]] = Field(default_factory=dict, validate_default=True)
    description: Any = None
    device: str = Field(default="auto", examples=["auto"])
    dtype: Literal[DTYPE_CHOICES] = "auto"
    attn: Literal[ATTN_CHOICES] = "auto"
    resources: _Resources = Field(default_factory=_Resources)
    pretrain: bool = False
    claims: _Claims | None = None

    @field_validator("recipe", "resources", mode="before")
    @classmethod
    def _empty_section(cls, raw: Any) -> Any:
        return {} if raw is None else raw

    @field_validator("recipe")
    @classmethod
    def _recipe_leaves_the_study_its_keys(cls, recipe: dict[str, Any]) -> dict[str, Any]:
        for key in RECIPE_FORBIDDEN:
            if key in recipe:
                raise _problem("is set by the study itself", "drop it: each variant brings its own method", key=key)
        _study_owned_sections(recipe)
        return recipe

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int] | None) -> list[int] | None:
        if seeds is not None:
            if not seeds:
                raise _problem("is empty", "write e.g. `seeds: [0, 1, 2]`, or drop it for one seed")
            if len(set(seeds)) != len(seeds):
                raise _problem(f"repeat a seed: {seeds}", "list every seed once, e.g. `seeds: [0, 1, 2]`")
        return seeds

    @field_validator("variants", mode="before")
    @classmethod
    def _some_variants(cls, raw: Any) -> Any:
        if not isinstance(raw, list) or not raw:
            raise _problem("is missing or empty",
                           "add a list, e.g. `variants: [{label: base}, {label: pi, method: pi, params: {factor: 4}}]`")
        return raw

    @field_validator("variants")
    @classmethod
    def _labels_once(cls, variants: list[_Variant]) -> list[_Variant]:
        _each_once([v.label for v in variants], "label", "give every variant its own label")
        return variants

    @field_validator("evals", mode="before")
    @classmethod
    def _some_evals(cls, raw: Any) -> Any:
        if raw is None or raw == {}:
            raise _problem("is missing or empty", "add e.g. `evals: {ppl: {lengths: [256, 512]}}`")
        return raw

    @field_validator("evals")
    @classmethod
    def _tasks_and_their_options(cls, evals: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Every task is one ``ropekit eval`` runs, with ``lengths`` and only options of its ``run()``."""
        from ..eval import TASKS, check_task_options, get_task

        for name, options in evals.items():
            if not isinstance(options, dict):
                raise _problem(f"must be a mapping of options, got {options!r}", "write e.g. `ppl: {lengths: [256, 512]}`",
                               key=name)
            task = options.get("task", name)
            if "task" in options and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_+-]*", str(name)):
                raise _problem("must be a short name of letters, digits and _ + -", "write e.g. `ppl-same-targets:`", key=name)
            if task not in TASKS:
                close = difflib.get_close_matches(str(task), list(TASKS), n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                where = f"{name}.task" if "task" in options else name
                raise _problem("is not an evaluation task", f"{hint}choose from {', '.join(TASKS)}", key=where)
            if task == "speed":
                raise _problem("is not run by studies yet", "measure speed with `ropekit eval speed --methods …`", key=name)
            if "lengths" not in options:
                raise _problem("is missing", "add e.g. `lengths: [256, 512, 1024]`", key=f"{name}.lengths")
            lengths = options["lengths"]
            if not isinstance(lengths, list) or not lengths:
                raise _problem(f"must be a list of token counts, got {lengths!r}", "write e.g. `lengths: [256, 512]`",
                               key=f"{name}.lengths")
            for j, length in enumerate(lengths):
                # one token predicts nothing and holds no prompt: every task needs at least two
                if not _is_token_count(length) or length < 2:
                    raise _problem(f"must be a whole number of tokens from 2 to {MAX_POSITIONS:,}, got {length!r}",
                                   "write a number of tokens, e.g. 1024", key=f"{name}.lengths[{j}]")
            for option in COUNT_OPTIONS:
                value = options.get(option)
                if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                    raise _problem(f"must be a positive whole number, got {value!r}", f"write e.g. `{option}: 4`",
                                   key=f"{name}.{option}")
            for decided in ("plot", "out", "resume"):
                if decided in options:
                    raise _problem("is decided by the study", "drop it (figures come from `ropekit report`)",
                                   key=f"{name}.{decided}")
            accepted = (set(inspect.signature(get_task(task).run).parameters) - {"ctx"}) | {"task"}
            for option in options:
                if option not in accepted:
                    raise _problem("is not an option of this task", f"options: {', '.join(sorted(accepted - {'plot', 'task'}))}",
                                   key=f"{name}.{option}")
            try:  # what `ropekit eval` would refuse before loading a model, refused before the study starts
                check_task_options(task, {k: v for k, v in options.items() if k != "task"})
            except RopekitError as err:
                raise _problem(_as_config_keys(err.problem), _as_config_keys(err.fix or "fix the option"),
                               key=name) from None
            if task == "longbench":
                _one_longbench_suite(name, options.get("tasks"))
        return evals

    @field_validator("device")
    @classmethod
    def _device(cls, device: str) -> str:
        """Checked for its form; whether this machine has it is checked when the study starts
        (:func:`ropekit.runtime.devices.resolve_devices`)."""
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", device):
            raise _problem(f"must be auto, cpu, cuda, cuda:N or mps, got {device!r}", "write e.g. `device: auto`")
        return device

    @model_validator(mode="after")
    def _consistent(self) -> _Study:
        window = self.window
        if window is None and self.model == BUILTIN_BASE:
            from ..train.builtin_base import SETTINGS  # not at the top: ropekit.train imports torch

            window = SETTINGS["window"]
        if window is not None and self.target_length <= window:
            raise _problem(f"{self.target_length} is not beyond the window {window}",
                           "choose a target length larger than the window", key="target_length")
        for i, variant in enumerate(self.variants):
            _scale_to_target(variant, self.target_length)
            starts = variant.search.start_tokens if variant.search is not None else None
            if isinstance(starts, int | list) and max(starts if isinstance(starts, list) else [starts],
                                                       default=0) >= self.target_length:
                raise _problem(f"keeps {starts} positions un-interpolated, not fewer than target_length "
                               f"{self.target_length}", "choose start tokens below the target length",
                               key=f"variants[{i}].search.start_tokens")
            if variant.finetune is not None and not self.recipe:
                raise _problem("asks for training but the study has no recipe", "add a `recipe:` section (data + train)",
                               key=f"variants[{i}].finetune")
        return self


def parse_study(raw: Any, source: str = "study config") -> StudyConfig:
    """Validate a study config mapping into a :class:`StudyConfig`."""
    if not isinstance(raw, dict):
        raise StudyConfigError(f"{source} is not a YAML mapping", "start from `ropekit study --preset quick --show`")
    try:
        written = _Study.model_validate(raw)
    except ValidationError as err:
        problem = config_error(err, _Study)
        raise StudyConfigError(f"study config: {problem.problem}", problem.fix) from None
    config = StudyConfig(name=written.name, model=written.model, target_length=written.target_length,
                         variants=[v.parsed() for v in written.variants], evals=copy.deepcopy(written.evals),
                         recipe=copy.deepcopy(written.recipe), seed=written.seed, window=written.window,
                         description=written.description, device=written.device, dtype=written.dtype,
                         attn=written.attn, resources=written.resources.parsed(),
                         seeds=list(written.seeds) if written.seeds is not None else None, pretrain=written.pretrain,
                         claims=None if written.claims is None else claims_as_written(written.claims))
    if config.recipe:
        _check_recipe(config)
    return config


def claims_as_written(claims: _Claims) -> dict[str, Any]:
    """A validated ``claims:`` block as plain data, the keys left out not filled in (what the manifest records)."""
    return claims.model_dump(exclude_unset=True)


def parse_claims(raw: Any, source: str = "claims") -> dict[str, Any]:
    """Validate a ``claims:`` block on its own (the report reads it back from a study's manifest)."""
    try:
        return claims_as_written(_Claims.model_validate(raw))
    except ValidationError as err:
        problem = config_error(err, _Claims)
        raise StudyConfigError(f"{source}: {problem.problem}", problem.fix) from None


def preset_claims(name: str) -> dict[str, Any] | None:
    """The ``claims:`` block of a shipped preset, validated, or None when it has none."""
    raw = _yaml(preset_text(name), f"preset '{name}'")
    return None if raw.get("claims") is None else parse_claims(raw["claims"], f"preset '{name}' claims")


def train_config_for(config: StudyConfig, variant: Variant, model_path: str, out_dir: str | Path, seed: int | None = None):
    """The [train] config of ``variant``: the recipe, the variant's overrides, its method and output; ``seed`` (one
    of the study's ``seeds``) replaces the training seed, which otherwise is the recipe's or the study's."""
    from ..train.config import deep_merge, parse_config

    raw = deep_merge(copy.deepcopy(config.recipe), copy.deepcopy(variant.finetune or {}))
    raw["model"] = {**raw.get("model", {}), "name": model_path}
    raw["method"] = {"name": variant.method, "params": dict(variant.params)} if variant.method else None
    if raw["method"] is None:
        del raw["method"]
    train = dict(raw.get("train") or {})
    train.setdefault("seed", config.seed)
    if seed is not None:
        train["seed"] = seed
    raw["train"] = train
    raw["output"] = {"save_every": 20, "keep_last": 1, **raw.get("output", {}), "dir": str(out_dir), "log_every": 1}
    return parse_config(raw, f"study recipe for '{variant.label}'")


def _check_recipe(config: StudyConfig) -> None:
    """Parse every fine-tuned variant's training config now, so a bad recipe fails before hours of work."""
    for v in config.variants:
        if v.trained:
            try:
                train_config_for(config, v, "tiny", "unused")
            except RopekitError as err:
                # the recipe and the variant's finetune: merged; say which variant's training it is
                raise StudyConfigError(f"variant '{v.label}': {err.problem}", err.fix) from None


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


def _yaml(text: str | bytes, source: str):
    return load_yaml(text, source, error_cls=StudyConfigError)


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
    return parse_study(read_yaml_file(p, error_cls=StudyConfigError), f"'{p}'")
