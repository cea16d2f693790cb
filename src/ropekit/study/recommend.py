"""``ropekit recommend``: the candidates, their parameters and the evaluation plan for one model, one target length
and one engine — the study that measures them is an ordinary study (:mod:`ropekit.study.runner`), so it resumes
piece by piece; the rule that picks the winner is :mod:`.recommend_rule`, the output :mod:`.recommend_output`.

**Candidates.** Every registered method (:func:`ropekit.methods.list_methods`) that

* is the method when installed without fine-tuning (not so Landmark, whose new landmark token only training gives a
  meaning: :attr:`~ropekit.methods.Method.untrained_note`),
* applies exactly to the model's family (:func:`ropekit.install.capabilities.why_not`, with the parameters below),
* reaches the target length (:meth:`~ropekit.methods.Method.reach`), and
* the engine serves as ropekit computes it (:func:`engine_refusal`): ``transformers`` serves everything
  (``ropekit.load`` restores a method plain transformers has no rope type for); ``vllm`` what vLLM loads natively
  from ``config.json`` — a method whose inference changes only the shared frequencies
  (:attr:`~ropekit.methods.Method.frequencies_only`: no attention-side change at inference) and whose
  export vLLM reads (:func:`ropekit.install.inspect.exports`); ``llamacpp`` what a GGUF carries — one static set of
  frequencies per rotary pair and one attention factor, on a Llama, Mistral, Qwen2 or Qwen3 model — for Qwen only
  the forms with llama.cpp keys of their own (PI, NTK, ABF, YaRN), since its qwen2/qwen3 graphs read no per-pair
  ``rope_freqs`` (:mod:`ropekit.install.gguf_export`).

**Parameters** are derived from the model's window ``W`` and the target ``N`` as ``ropekit extend --target-length N``
does: a method with a ``factor`` parameter gets ``factor = N / W``, every other parameter its default for the model
(:meth:`~ropekit.methods.Method.resolve`). ``--params FILE`` overrides them: a YAML mapping ``METHOD: {param:
value}`` (checked by pydantic, each method's parameters by the method itself).

**Simplicity** (the tie-break, :func:`simplicity`): the model as it is before searched factors before fine-tuned
weights (``--search``, ``--train``), then frequencies-only before attention-side (``Method.changes``),
static frequencies before length-dependent ones (``Method.length_dependence``), a form the engine reads natively
before a generic one (``Method.exports_to``), then fewer parameters (``Method.params``).

**Budget.** One forward pass at ``N`` is timed on the model, and ``W/N`` of it bounds one at ``W`` from above (the
cost grows at least linearly with the length); every candidate (and the unmodified model) is evaluated on ``s``
samples of each evaluation at both lengths, a generated answer counted as :data:`GENERATION_FORWARDS` forwards, and
``s`` is the largest count whose estimate fits the budget (at least :data:`MIN_SAMPLES`: fewer cannot call a paired
difference, :data:`ropekit.study.stats.MIN_PAIRED`; at most :data:`MAX_SAMPLES`). A LongRoPE search costs
:data:`SEARCH_EVALUATIONS` × :data:`SEARCH_DOCUMENTS` forwards at ``N``, a PoSE fine-tuning :data:`TRAIN_STEPS` ×
:data:`TRAIN_STEP_FORWARDS` forwards at ``W`` per candidate; both come off the budget first.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import RootModel, ValidationError

from ..core.schema import config_error, read_yaml_file
from ..errors import RopekitError
from .stats import MIN_PAIRED

#: Engines a recommendation is made for.
ENGINES = ("transformers", "vllm", "llamacpp")
#: The label of the unmodified model in the study (every in-window regression is measured against it).
BASE_LABEL = "base"
#: RULER's single-needle task (RULER ``synthetic.yaml``: one needle in repeated noise).
RULER_SINGLE_NEEDLE = "niah_single_1"
#: Samples per evaluation and length: at least this many (fewer cannot call a paired difference), at most that many.
MIN_SAMPLES = max(MIN_PAIRED, 5)
MAX_SAMPLES = 64
#: The seed of the study recommend runs (its config leaves ``seed`` at the default): RULER's prompts are drawn with it.
STUDY_SEED = 0
#: A generated answer (passkey, RULER) costs about this many forward passes at its length: one prefill and a
#: handful of decoding steps that reuse the cache (each far cheaper than the prefill).
GENERATION_FORWARDS = 1.5
#: LongRoPE search (``--search``): evaluations of the search at most, each one forward at N per document.
SEARCH_EVALUATIONS = 16
SEARCH_DOCUMENTS = 2
#: PoSE fine-tuning (``--train``): how many of the best frozen candidates, and its steps (each ≈ 3 forwards at W).
TRAIN_TOP = 2
TRAIN_STEPS = 20
#: Forward passes one training step costs (forward and the backward's two).
TRAIN_STEP_FORWARDS = 3.0


class RecommendError(RopekitError):
    """Bad input to ``ropekit recommend``."""


# ---- budget --------------------------------------------------------------------------------------------------
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*$", re.IGNORECASE)


def parse_budget(text: str) -> float:
    """``"30m"``, ``"1.5h"``, ``"90s"`` or a number of seconds → seconds; a one-line error otherwise."""
    match = _DURATION.match(str(text))
    if not match or not 0 < float(match.group(1)) < 1e9:  # 1e9 s is 30 years; past it (or inf), no budget at all
        raise RecommendError(f"--budget {text!r} is not a positive duration", "pass e.g. --budget 30m, 2h or 600s")
    unit = (match.group(2) or "s").lower()
    return float(match.group(1)) * {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}[unit]


# ---- the --params file ---------------------------------------------------------------------------------------
class _ParamsFile(RootModel[dict[str, dict[str, Any]]]):
    """``--params FILE``: method name → the parameters that replace the derived ones."""


def read_params_file(path: str | Path | None) -> dict[str, dict[str, Any]]:
    """The overrides of ``--params FILE`` (validated for its shape; the names and values are checked against the
    model once it is loaded, :func:`candidates`)."""
    if path is None:
        return {}
    p = Path(path).expanduser()
    if not p.is_file():
        raise RecommendError(f"--params '{p}' not found", "pass a YAML file mapping methods to parameters")
    raw = read_yaml_file(p, f"--params '{p}'", error_cls=RecommendError)
    if raw is None:
        return {}
    try:
        parsed = _ParamsFile.model_validate(raw).root
    except ValidationError as err:
        problem = config_error(err, _ParamsFile)
        raise RecommendError(f"--params '{p}': {problem.problem}",
                             "write a mapping of method names to parameters, e.g. `yarn: {beta_fast: 16}`") from None
    from ..methods import get_method

    for name in parsed:
        get_method(name)  # an unknown method: one line with the closest names
    return {get_method(name).name: dict(params or {}) for name, params in parsed.items()}


# ---- candidates ----------------------------------------------------------------------------------------------
@dataclass
class Candidate:
    """One method as the recommendation evaluates it."""

    label: str
    method: str
    #: What the study installs (``factor`` and the overrides); ``params`` is what that resolves to on the model.
    given: dict[str, Any]
    params: dict[str, Any]
    #: Where the export runs without ropekit (``Method.exports_to`` as :func:`ropekit.install.inspect.exports`).
    exports: list[str]
    native: bool
    simplicity: tuple[int, ...]
    simplicity_note: str
    #: ``frozen`` (installed as is), ``search`` (LongRoPE factors searched) or ``trained`` (PoSE fine-tuned).
    kind: str = "frozen"
    #: The frozen candidate a trained one starts from.
    origin: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["simplicity"] = list(self.simplicity)
        return out


@dataclass
class ModelFacts:
    """What the recommendation reads from the model once."""

    spec: str
    model_type: str
    window: int
    base_dict: dict[str, Any]
    info: Any
    features: Any
    gguf_refusal: str | None
    gguf_architecture: str | None = None  # llama.cpp's architecture the GGUF is written as


def model_facts(spec: str, model) -> ModelFacts:
    from ..install.capabilities import model_features
    from ..install.gguf_export import ARCHITECTURES
    from ..install.model_rope import base_info, text_config

    config = text_config(model)
    info = base_info(config)
    gguf = None
    arch = ARCHITECTURES.get(getattr(config, "model_type", ""))
    if arch is None:
        gguf = (f"GGUF export writes {', '.join(ARCHITECTURES)} models; this one is "
                f"'{getattr(config, 'model_type', '?')}'")
    elif info.rotary_dim != info.head_dim:
        gguf = f"llama.cpp's {arch} architecture rotates whole heads, this model a part of each"
    return ModelFacts(spec=spec, model_type=info.model_type, window=int(info.window), base_dict=config.to_dict(),
                      info=info, features=model_features(model), gguf_refusal=gguf, gguf_architecture=arch)


def derived_params(m, facts: ModelFacts, target_length: int) -> dict[str, Any]:
    """The parameters ``ropekit extend --target-length N`` gives ``m``: ``factor = N / W`` when it has one."""
    return {"factor": target_length / facts.window} if any(p.name == "factor" for p in m.params) else {}


def engine_refusal(m, params: dict[str, Any], facts: ModelFacts, engine: str, exports: list[str]) -> str | None:
    """Why ``engine`` does not serve ``m`` with ``params`` as ropekit computes it (module doc), or ``None``."""
    if engine == "transformers":
        return None
    if not m.frequencies_only:  # Method.frequencies_only: what it changes at inference (training-only parts aside)
        return f"{m.name} changes attention itself, and {engine} applies only RoPE frequencies from the export"
    if engine == "vllm":
        if not any(e.split(" ")[0] == "vllm" for e in exports):
            return f"vLLM has no rope type computing {m.name} with these parameters"
        return None
    if facts.gguf_refusal:
        return facts.gguf_refusal
    from ..install.gguf_export import PER_PAIR_ARCHITECTURES

    arch = facts.gguf_architecture
    if arch not in PER_PAIR_ARCHITECTURES and (facts.info.is_scaled or m.gguf_rope(facts.info, params) is None):
        # the writer's per-pair rope_freqs form: llama.cpp's qwen2/qwen3 graphs do not read it
        return f"{m.name} needs per-pair rope_freqs here, which llama.cpp's {arch} graph does not read"
    per_position = m.position_dependent_rotation(params)
    if per_position:
        return f"{m.name}: {per_position}"
    kind, length = m.length_dependence(facts.info, params)
    if kind != "static":
        return f"{m.name}'s frequencies change with the input length past {length} tokens, and a GGUF holds one set"
    return None


#: How much a candidate adds to the model beyond the method's parameters: installed as is, searched, fine-tuned.
KINDS = ("frozen", "search", "trained")


def simplicity(m, params: dict[str, Any], facts: ModelFacts, native: bool,
               kind: str = "frozen") -> tuple[tuple[int, ...], str]:
    """The tie-break key (lower is simpler, module doc) and its words."""
    attention_side = int(not m.frequencies_only)
    length_dependent = int(m.length_dependence(facts.info, params)[0] != "static")
    key = (KINDS.index(kind), attention_side, length_dependent, int(not native), len(m.params))
    words = ([] if kind == "frozen" else ["searched factors" if kind == "search" else "fine-tuned weights"]) + [
             ("attention-side" if attention_side else "frequencies only"),
             ("length-dependent" if length_dependent else "static"),
             ("served natively" if native else "served in a generic form"), f"{len(m.params)} parameters"]
    return key, ", ".join(words)


def _native(exports: list[str], engine: str) -> bool:
    """Whether the engine reads the method under its own rope type (an entry without a generic ``(form)``)."""
    wanted = "transformers" if engine == "llamacpp" else engine
    return wanted in exports


def candidates(model, facts: ModelFacts, target_length: int, engine: str,
               overrides: dict[str, dict[str, Any]] | None = None,
               only: list[str] | None = None) -> tuple[list[Candidate], list[dict[str, str]]]:
    """``(candidates, excluded)``: every method that passes the module doc's three checks, each with its derived
    (or overridden) parameters, and every other method with why not. ``only`` restricts to those names."""
    from ..install.capabilities import why_not
    from ..install.inspect import exports as exports_of
    from ..methods import get_method, list_methods

    overrides = dict(overrides or {})
    wanted = None if only is None else {get_method(n).name for n in only}
    chosen: list[Candidate] = []
    excluded: list[dict[str, str]] = []
    for m in list_methods():
        if wanted is not None and m.name not in wanted:
            continue
        if m.untrained_note:  # a frozen candidate must be the method; this one is only after fine-tuning
            if m.name in overrides:
                raise RecommendError(f"--params names {m.name}, which is not a candidate here: {m.untrained_note}",
                                     "drop it from the file; fine-tune it with ropekit train or ropekit study")
            excluded.append({"method": m.name, "why": f"not measured frozen: {m.untrained_note}"})
            continue
        given = {**derived_params(m, facts, target_length), **overrides.get(m.name, {})}
        try:
            params = m.resolve(facts.info, given)
        except RopekitError as err:
            if m.name in overrides:  # the user's own values: a mistake to report, not a method to leave out
                # the method's own advice speaks of --param, which recommend has not: said for the file instead
                raise RecommendError(f"--params {m.name}: {err.problem}",
                                     f"correct the value under '{m.name}:' in the --params file") from None
            excluded.append({"method": m.name, "why": err.problem})
            continue
        refusal = why_not(m, facts.info, facts.features, params)
        if refusal is not None:
            excluded.append({"method": m.name, "why": refusal.problem})
            continue
        reach = m.reach(facts.info, params)
        if reach is not None and reach < target_length:
            excluded.append({"method": m.name, "why": f"{m.name} reaches {reach} tokens with {params}, short of "
                                                      f"{target_length}"})
            continue
        try:
            runs_in = exports_of(m, facts.info, facts.base_dict, facts.features.sliding_layers, params=params)
        except RopekitError:
            runs_in = []
        why = engine_refusal(m, params, facts, engine, runs_in)
        if why is not None:
            excluded.append({"method": m.name, "why": why})
            continue
        native = _native(runs_in, engine)
        key, words = simplicity(m, params, facts, native)
        label = m.name.replace("_", "-")
        if m.name in overrides:  # the user's own parameters: a label of their own in the command's study
            label += "-" + hashlib.sha256(json.dumps(_jsonable(given), sort_keys=True).encode()).hexdigest()[:6]
        chosen.append(Candidate(label=label, method=m.name, given=given, params=_jsonable(params),
                                exports=runs_in, native=native, simplicity=key, simplicity_note=words))
    unused = sorted(set(overrides) - {c.method for c in chosen})
    for name in unused:
        why = next((e["why"] for e in excluded if e["method"] == name), "not among the methods considered")
        raise RecommendError(f"--params names {name}, which is not a candidate here: {why}",
                             "drop it from the file, or choose another --engine")
    return chosen, excluded


def _jsonable(value: Any) -> Any:
    from ..core.jsonsafe import json_safe

    return json_safe(value)


# ---- cost and plan -------------------------------------------------------------------------------------------
def forward_seconds(model, length: int, repeats: int | None = None) -> float:
    """Seconds of one forward pass over ``length`` tokens (after one untimed warm-up at a short length); the best
    of ``repeats`` (default: 1 on a CPU, where one pass can take minutes; 3 on an accelerator, whose first pass at
    a new shape also pays for kernel selection and allocation — 0.88 s against 0.10 s for SmolLM2 at 16k on an
    H200)."""
    import torch

    device = next(model.parameters()).device
    if repeats is None:
        repeats = 1 if device.type == "cpu" else 3
    vocab = int(getattr(model.config, "vocab_size", 256) or 256)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, max(4, vocab), (1, length), generator=gen).to(device)
    model.eval()
    with torch.no_grad():
        model(ids[:, : min(length, 16)])
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            model(ids)
            best = min(best, time.perf_counter() - start)
    return best


@dataclass
class Plan:
    """What ``ropekit recommend`` will run, and why those counts."""

    model: str
    model_type: str
    window: int
    target_length: int
    engine: str
    budget_seconds: float
    seconds_per_forward: dict[str, float]
    samples: int
    estimate_seconds: float
    candidates: list[Candidate]
    excluded: list[dict[str, str]]
    data: str | None
    #: The study's evaluations: task → its options (lengths where it fits, samples).
    evaluations: dict[str, dict[str, Any]] = field(default_factory=dict)
    search: bool = False
    train: bool = False
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "candidates"}
        out["candidates"] = [c.as_dict() for c in self.candidates]
        return out


def sample_count(budget: float, forward_n: float, forward_w: float, variants: int, extra: float = 0.0) -> tuple[int, float]:
    """``(samples, estimated seconds)`` for ``variants`` evaluated on perplexity, passkey and RULER at both lengths
    (module doc); ``extra`` seconds (search, training) come off the budget first."""
    per_sample = variants * (forward_n + forward_w) * (1 + 2 * GENERATION_FORWARDS)
    left = max(0.0, budget - extra)
    samples = int(left // per_sample) if per_sample > 0 else MAX_SAMPLES
    samples = max(MIN_SAMPLES, min(MAX_SAMPLES, samples))
    return samples, samples * per_sample + extra


def _fits(task: str, tokenizer, length: int) -> str | None:
    """Why ``task``'s prompt does not fit in ``length`` tokens under ``tokenizer``, or None when it does (asked of
    the evaluation itself, which refuses such a length in one line)."""
    try:
        if task == "passkey":
            from ..eval.passkey import make_sample

            make_sample(tokenizer, length, None, 0)
        else:
            from ..eval.ruler import prepare

            # a sample whose own draw does not fit fails only when it is generated (RULER shrinks each prompt's
            # haystack to fit, down to the smallest): every prompt the study may draw is built now, with its seed
            for plan in prepare(tokenizer, lengths=[length], tasks=[RULER_SINGLE_NEEDLE], samples=1, seed=STUDY_SEED)[0]:
                for index in range(MAX_SAMPLES):
                    plan.sample(index)
    except RopekitError as err:
        return err.problem
    return None


def documents_with(data: str | None, tokenizer, tokens: int, wanted: int) -> int:
    """How many documents of the corpus (``--data`` or the built-in held-out one) have ``tokens`` tokens, counting
    up to ``wanted``."""
    from ..data.corpora import iter_documents

    found = 0
    for doc in iter_documents(data, tokenizer):
        if len(doc.ids) >= tokens:
            found += 1
            if found >= wanted:
                break
    return found


def measurable(tokenizer, window: int, target_length: int, data: str | None) -> tuple[int, dict[str, list[int]], list[str]]:
    """``(documents with N tokens (up to MAX_SAMPLES), task → the lengths its prompt fits in, notes)``: what can be
    measured, found before anything is timed."""
    notes: list[str] = []
    bos = 1 if getattr(tokenizer, "bos_token_id", None) is not None else 0
    docs = documents_with(data, tokenizer, target_length - bos, MAX_SAMPLES)
    if docs == 0:
        raise RecommendError(f"no document of {data or 'the built-in held-out corpus'} has the {target_length} tokens "
                             "perplexity at the target needs", "pass --data with longer documents")
    fitting: dict[str, list[int]] = {}
    for task in ("passkey", "ruler"):
        for length in (window, target_length):
            why = _fits(task, tokenizer, length)
            if why is None:
                fitting.setdefault(task, []).append(length)
            else:
                notes.append(f"{task} is not measured at {length} tokens: {why}")
    return docs, fitting, notes


def evaluations(window: int, target_length: int, samples: int, docs: int, fitting: dict[str, list[int]],
                data: str | None) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``(the study's evals, notes)``: perplexity (same targets) on ``samples`` documents (at most ``docs``), passkey
    and RULER single needle with ``samples`` prompts, each at the window and the target where its prompt fits."""
    notes = []
    if docs < samples:
        notes.append(f"perplexity: {docs} documents have {target_length} tokens, so {docs} are measured, not {samples}"
                     + (f" (fewer than {MIN_PAIRED}: no perplexity difference can be called)" if docs < MIN_PAIRED else ""))
    out: dict[str, dict[str, Any]] = {"ppl": {"lengths": [window, target_length], "samples": min(samples, docs),
                                              "score_mode": "same_targets", **({"data": data} if data else {})}}
    if "passkey" in fitting:
        out["passkey"] = {"lengths": fitting["passkey"], "trials": samples}
    if "ruler" in fitting:
        out["ruler"] = {"lengths": fitting["ruler"], "tasks": [RULER_SINGLE_NEEDLE], "samples": samples}
    return out, notes


def make_plan(spec: str, model, target_length: int, engine: str, budget: float, *, data: str | None = None,
              overrides: dict[str, dict[str, Any]] | None = None, only: list[str] | None = None,
              search: bool = False, train: bool = False, tokenizer=None, work_root: Path | None = None) -> Plan:
    """Candidates and sample counts for ``model`` (loaded from ``spec``); raises one line for bad input. With
    ``work_root`` (:func:`work_dir_for`) holding an earlier run of the same command, its forward timing is reused
    instead of measured again (minutes for a real model on a CPU)."""
    if engine not in ENGINES:
        raise RecommendError(f"unknown engine '{engine}'", f"choose one of {', '.join(ENGINES)}")
    if tokenizer is None:
        raise RecommendError(f"'{spec}' has no tokenizer, and the evaluations need one",
                             "pass a model directory with tokenizer files, a GGUF with a vocabulary, or a built-in name")
    facts = model_facts(spec, model)
    if target_length <= facts.window:
        raise RecommendError(f"--target-length {target_length} is not beyond the model's window ({facts.window} tokens)",
                             f"pass a target above {facts.window}, e.g. {facts.window * 4}")
    chosen, excluded = candidates(model, facts, target_length, engine, overrides, only)
    if not chosen:
        raise RecommendError(f"no method applies to this {facts.model_type} model and is served by {engine} at "
                             f"{target_length} tokens", "choose another --engine (transformers serves every method)")
    docs, fitting, notes = measurable(tokenizer, facts.window, target_length, data)
    if search:
        searched = search_candidate(facts, target_length, engine)
        if searched is None:
            notes.append(f"--search: {engine} does not serve searched LongRoPE factors on this model; no search")
        else:
            chosen.append(searched)
    searching = any(c.kind == "search" for c in chosen)
    earlier = None if work_root is None else _saved_plan(Path(work_root) / plan_identity(
        spec, target_length, engine, data, budget, searching, train))
    # a rerun resumes the earlier run's study with its counts (resume_plan), so its timing is not measured again
    forward_n = (float(earlier["seconds_per_forward"][str(target_length)]) if earlier is not None
                 else forward_seconds(model, target_length))
    # a forward pass costs at least linearly in its length (attention quadratically), so W/N of the measured one is
    # an upper bound at W — and one forward at N less to wait for (minutes for a real model on a CPU)
    forward_w = forward_n * facts.window / target_length
    extra = 0.0
    if any(c.kind == "search" for c in chosen):
        extra += SEARCH_EVALUATIONS * SEARCH_DOCUMENTS * forward_n
    if train:
        extra += TRAIN_TOP * TRAIN_STEPS * TRAIN_STEP_FORWARDS * forward_w
    variants = len(chosen) + 1 + (TRAIN_TOP if train else 0)
    samples, estimate = sample_count(budget, forward_n, forward_w, variants, extra)
    if estimate > budget * 1.05:
        notes.append(f"the budget allows fewer than {MIN_SAMPLES} samples per evaluation; {MIN_SAMPLES} are run "
                     f"(estimated {estimate / 60:.1f} min)")
    if earlier is not None:
        notes.append("the forward timing is the earlier run's: this command's study resumes")
    evals, ppl_notes = evaluations(facts.window, target_length, samples, docs, fitting, data)
    notes += ppl_notes
    return Plan(model=spec, model_type=facts.model_type, window=facts.window, target_length=target_length,
                engine=engine, budget_seconds=budget, evaluations=evals,
                seconds_per_forward={str(target_length): forward_n, str(facts.window): forward_w},
                samples=samples, estimate_seconds=estimate, candidates=chosen, excluded=excluded, data=data,
                search=searching, train=train, notes=notes)


def search_candidate(facts: ModelFacts, target_length: int, engine: str) -> Candidate | None:
    """The LongRoPE-search candidate (the study's ``search:`` variant decides the method), or None when the engine
    would not serve its result (searched factors are static without start tokens, which GGUF and vLLM need)."""
    from ..install.inspect import exports as exports_of
    from ..methods import get_method
    from .config import parse_study

    probe = parse_study({"name": "probe", "model": "tiny", "target_length": target_length,
                         "variants": [{"label": "search", "search": True}], "evals": {"ppl": {"lengths": [2]}}})
    m = get_method(probe.variants[0].method)
    # the search finds the factors; the method's example stands in for them in the checks (their structure counts)
    given = {"start_tokens": 0} if engine != "transformers" and any(p.name == "start_tokens" for p in m.params) else {}
    try:
        params = m.resolve(facts.info, {**m.example_params(facts.info), **given})
        runs_in = exports_of(m, facts.info, facts.base_dict, facts.features.sliding_layers, params=params)
    except RopekitError:
        return None
    from ..install.capabilities import why_not

    if why_not(m, facts.info, facts.features, params) is not None or engine_refusal(m, params, facts, engine, runs_in):
        return None
    native = _native(runs_in, engine)
    key, words = simplicity(m, params, facts, native, "search")
    return Candidate(label=f"{m.name.replace('_', '-')}-search", method=m.name, given=given, params=_jsonable(params),
                     exports=runs_in, native=native, simplicity=key, simplicity_note=words, kind="search")


# ---- the study -----------------------------------------------------------------------------------------------
def _variant(c: Candidate) -> dict[str, Any]:
    if c.kind == "search":
        settings = {"evaluations": SEARCH_EVALUATIONS, "documents": SEARCH_DOCUMENTS}
        if "start_tokens" in c.given:
            settings["start_tokens"] = c.given["start_tokens"]
        return {"label": c.label, "search": settings}
    return {"label": c.label, "method": c.method, "params": dict(c.given)}


def study_config(plan: Plan, trained: list[Candidate] | None = None):
    """The study that measures ``plan`` (frozen and searched candidates and the unmodified model; with ``trained``,
    only those, fine-tuned with PoSE), validated as any study config is."""
    from .config import parse_study

    recipe: dict[str, Any] = {}
    if trained:
        source = {"path": plan.data} if plan.data else {"path": "builtin"}
        recipe = {"data": {"seq_len": plan.window, "sources": [source],
                           "pose": {"target_length": plan.target_length}},
                  "train": {"max_steps": TRAIN_STEPS, "lr": 1.0e-4, "warmup_steps": 2, "micro_batch_size": 1}}
        variants = [{"label": c.label, "method": c.method, "params": dict(c.given), "finetune": True} for c in trained]
    else:
        variants = [{"label": BASE_LABEL}] + [_variant(c) for c in plan.candidates]
    raw = {"name": "recommend" + ("-trained" if trained else ""), "model": plan.model,
           "target_length": plan.target_length, "window": plan.window, "variants": variants, "evals": plan.evaluations,
           "description": f"ropekit recommend: {plan.model} to {plan.target_length} tokens for {plan.engine}",
           **({"recipe": recipe} if recipe else {})}
    return parse_study(raw, "the recommendation's study")


def trained_candidates(top: list[Candidate]) -> list[Candidate]:
    """PoSE fine-tuned copies of the best frozen candidates (``--train``)."""
    out = []
    for c in top:
        key = (KINDS.index("trained"), *c.simplicity[1:])
        out.append(Candidate(label=f"{c.label}-pose", method=c.method, given=dict(c.given), params=dict(c.params),
                             exports=list(c.exports), native=c.native, simplicity=key,
                             simplicity_note="fine-tuned weights, " + c.simplicity_note, kind="trained", origin=c.label))
    return out


def work_dir_for(out: Path) -> Path:
    """Where the studies of recommendations into ``out`` live: a hidden sibling, so ``out`` only ever holds the
    finished result and a killed run resumes from it (:func:`resume_plan` picks the command's own study)."""
    out = Path(out).expanduser().absolute()
    return out.parent / f".{out.name}.recommend"


def plan_identity(model: str, target_length: int, engine: str, data: str | None, budget: float, search: bool,
                  train: bool) -> str:
    """The name of one command's study directory: a hash of what decides the protocol of its pieces. The
    candidates are not part of it: a candidate is a variant of the study, which a rerun may add or drop (another
    ``--methods``, a method that joined the registry) without the others being measured again
    (:meth:`ropekit.study.store.StudyStore.initialize`); a candidate with parameters of the user's own carries
    them in its label (:func:`candidates`), so it never meets a differently-set namesake."""
    identity = json.dumps([model, target_length, engine, _data_identity(data), budget, search, train], default=str,
                          sort_keys=True)
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


def _data_identity(data: str | None) -> Any:
    """What makes ``--data`` the same corpus again: its absolute path and each file's size and modification time.
    The text as given named another corpus when the command ran from another directory or the file was rewritten,
    and the earlier study's measurements were resumed as if made on this one."""
    from ..data.corpora import is_builtin

    if data is None or is_builtin(data):
        return data
    path = Path(data).expanduser().absolute()
    if not path.exists():
        return str(path)
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())
    return [str(path), [[f.relative_to(path).as_posix() if f != path else "", f.stat().st_size, f.stat().st_mtime_ns]
                        for f in files]]


def _saved_plan(where: Path) -> dict[str, Any] | None:
    saved = Path(where) / "plan.json"
    return json.loads(saved.read_text()) if saved.is_file() else None


def resume_plan(plan: Plan, work_root: Path) -> tuple[Plan, Path]:
    """``(plan, study directory)``: the study directory of this exact command (model, target, engine, data, budget,
    candidates and their parameters, search, train) under ``work_root``; when an earlier run made it, the sample
    counts and timings it measured are kept, so the study it started resumes instead of starting over."""
    where = Path(work_root) / plan_identity(plan.model, plan.target_length, plan.engine, plan.data, plan.budget_seconds,
                                            plan.search, plan.train)
    saved = where / "plan.json"
    earlier = _saved_plan(where)
    if earlier is not None:
        plan.samples = int(earlier["samples"])
        plan.evaluations = dict(earlier["evaluations"])
        plan.seconds_per_forward = dict(earlier["seconds_per_forward"])
        plan.estimate_seconds = float(earlier["estimate_seconds"])
        plan.notes = list(earlier.get("notes", []))
        return plan, where
    from ..runtime.atomic import atomic_file

    where.mkdir(parents=True, exist_ok=True)
    with atomic_file(saved, overwrite=True, what="plan") as tmp:
        Path(tmp).write_text(json.dumps(_jsonable(plan.as_dict()), indent=2) + "\n")
    return plan, where


def run_evidence(plan: Plan, work_dir: Path, *, workers: int = 1, progress: bool = True, console=None,
                 trained: list[Candidate] | None = None) -> list[dict[str, Any]]:
    """Run (or resume) the study of ``plan`` into ``work_dir`` and return its records; each piece that finished in
    an earlier run is kept (:mod:`ropekit.study.runner`)."""
    from .runner import plan as pieces_of, run_study
    from .store import open_study

    config = study_config(plan, trained)
    where = work_dir / ("trained" if trained else "frozen")
    status = run_study(config, where, workers=workers, progress=progress, console=console)
    failed = status.get("failed") or []
    if failed:
        first = failed[0]
        piece = first.get("piece") if isinstance(first, dict) else first
        error = first.get("error") if isinstance(first, dict) else ""
        raise RopekitError(f"{len(failed)} evaluation piece(s) failed, first {piece}: {error}",
                           "run the same command again to retry them (finished pieces are kept)")
    planned = {p.id for p in pieces_of(config)}
    with open_study(where) as store:
        left = [p["id"] for p in store.pieces() if p["status"] in ("pending", "running") and p["id"] in planned]
    if left:
        # workers that ended early (killed, out of memory) leave pieces behind: a decision on part of the evidence
        # would be one the plan did not pay for
        raise RopekitError(f"{len(left)} evidence piece(s) did not finish, first {left[0]}: their worker ended early",
                           "run the same command again to resume them (finished pieces are kept)")
    labels = {c.label for c in plan.candidates} | {BASE_LABEL} | {c.label for c in trained or []}
    with open_study(where) as store:
        return [r for r in store.samples() if r.get("method") in labels]
