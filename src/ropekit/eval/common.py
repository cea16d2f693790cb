"""What every evaluation task shares: the prepared model, the record stream, generation and progress.

A task is a module with ``KEY_FIELDS`` (what identifies one scored sample besides the common fields),
``check_options(**options)`` (refuse, before any model loads, every option that is wrong whatever the model:
the CLI calls it before loading, a study when it reads its config, and ``run`` again), ``run(ctx, **options)``
(score every sample not yet in ``ctx``'s results and write one record each) and ``summarize(records) -> rows``
(one row per length, or per length and depth, with the task's aggregate).
:class:`EvalContext` carries what is common: the model with the method installed, its tokenizer, the
seed, the resumable :class:`~ropekit.eval.records.RecordWriter`, and a progress bar.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import RopekitError
from ..install import extend, rope_info
from ..methods import get_method
from .records import RecordWriter
from ..install.installer import reset_length_state
from ..runtime.devices import computed_on

#: Fields every record carries; with a task's own KEY_FIELDS they identify a sample for ``--resume``.
COMMON_KEY_FIELDS = ("task", "method", "params", "length")


def prepare_model(model, method: str | None, params: dict[str, Any] | None, lengths: list[int]):
    """``(model_to_evaluate, resolved_params)``: a copy of ``model`` with ``method`` installed, or ``model`` itself.

    A factor-based method given neither ``factor`` nor ``target_length`` is sized to the longest length
    evaluated. Raises a one-line error when a length lies beyond the method's hard reach (e.g. Self-Extend's
    G·(C − W + ⌊W/G⌋)), naming the parameter to change.
    """
    if method is None or method in ("plain", "base", "none"):
        if params:
            raise RopekitError(f"--param {', '.join(params)} given without --method", "add --method NAME, or drop --param")
        return model, {}
    spec = get_method(method)
    info = rope_info(model)
    kwargs = dict(params or {})
    longest = max(lengths)
    if spec.sized_by_target(kwargs):
        if longest <= info.window:
            raise RopekitError(
                f"{spec.name} needs a factor, and the lengths evaluated (up to {longest}) are within the "
                f"model's {info.window}-token window, so none can be inferred",
                f"pass --param factor=F (e.g. 2) or --param target_length=N with N > {info.window}",
            )
        kwargs["target_length"] = longest
    variant = extend(copy.deepcopy(model), spec, **kwargs)
    resolved = dict(variant.config.ropekit["params"])
    reach = spec.reach(info, resolved)  # the base model's window C: the extended one is the reach itself
    if reach is not None and longest > reach:
        raise RopekitError(
            f"length {longest} exceeds what {spec.name} supports with {resolved} (reach {reach} tokens)",
            "lower --lengths or enlarge the method's parameters (see `ropekit inspect`)",
        )
    return variant, resolved


def whole_number(value, flag: str, *, minimum: int = 1, example: str = "N") -> int:
    """``value`` when it is a whole number ≥ ``minimum`` (a bool is not); a one-line error naming ``flag`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = {0: "a count (a whole number ≥ 0)", 1: "a positive whole number"}.get(minimum, f"a whole number ≥ {minimum}")
        raise RopekitError(f"{flag} {value!r} is not {what}", f"pass {flag} {example} with {example} ≥ {minimum}")
    return value


def token_lengths(lengths, *, minimum: int = 1, why: str = "") -> list[int]:
    """Distinct ``lengths`` in their order, each a whole number of tokens ≥ ``minimum``; one line otherwise."""
    out: list[int] = []
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, int) or length < minimum:
            raise RopekitError(f"length {length!r} is too short or not a whole number: at least {minimum} tokens{why}",
                               f"pass lengths of at least {minimum} tokens, e.g. --lengths 4k,8k")
        if length not in out:
            out.append(length)
    if not out:
        raise RopekitError("--lengths is empty", "pass e.g. --lengths 4k,8k")
    return out


def require_tokenizer(tokenizer, task: str):
    if tokenizer is None:
        raise RopekitError(
            f"the '{task}' evaluation needs a tokenizer and this model has none",
            "pass a model directory that includes tokenizer files, a GGUF with a vocabulary, or a built-in name",
        )
    return tokenizer


def encode(tokenizer, text: str, *, add_special_tokens: bool = True) -> list[int]:
    """Token ids of ``text``; ``add_special_tokens`` adds the tokenizer's BOS (if it has one)."""
    return list(tokenizer(text, add_special_tokens=add_special_tokens).input_ids)


def greedy_generate(model, input_ids: list[int], max_new_tokens: int, *, eos_token_ids: list[int] | None = None,
                    min_new_tokens: int = 0) -> list[int]:
    """Greedy continuation of one prompt (the new token ids only, cut at the first end token), with an explicit
    attention mask. ``min_new_tokens``: end tokens are suppressed until that many tokens are out.

    The mask matters: transformers reads position_ids without one as packed sequences (methods.md §9). The model's
    length-dependent RoPE state is reset first (:func:`~ropekit.install.installer.reset_length_state`): Dynamic NTK
    would otherwise keep the frequencies of the longest prompt generated before this one.
    """
    reset_length_state(model)
    device = next(model.parameters()).device
    ids = torch.tensor([input_ids], device=device)
    eos = [int(e) for e in (eos_token_ids or []) if e is not None]
    pad = eos[0] if eos else 0
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens or None,
            do_sample=False,
            num_beams=1,
            temperature=None,
            top_p=None,
            top_k=None,
            eos_token_id=eos or None,
            pad_token_id=pad,
        )
    new = out[0, ids.shape[1]:].tolist()
    if eos:  # generate pads finished rows with pad_token_id; cut at the first EOS
        for i, t in enumerate(new):
            if t in eos:
                return new[:i]
    return new


#: End-of-turn tokens of the common chat formats (ChatML, Llama 3, Phi-3).
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>")


def eos_ids(tokenizer, model=None, *, chat: bool = False) -> list[int]:
    """The ids that end a generation: the tokenizer's EOS plus every end token of ``model``'s generation config —
    what ``generate`` stops on by itself, and what the benchmarks' own scripts (LongBench ``pred.py``) stop on:
    Qwen2.5-Instruct's ``<|endoftext|>``, Llama 3.1's ``<|end_of_text|>`` and Gemma's ``<end_of_turn>`` are there
    and not in the tokenizer's EOS. ``chat`` (the prompt is wrapped in the chat template): also the end-of-turn
    token of the vocabulary's chat format (:data:`END_OF_TURN`), where the answer's turn ends even when a
    checkpoint's generation config does not list it. A plain prompt does not stop there: a base model whose
    vocabulary holds ``<|im_end|>`` (Qwen2.5) may write it mid-answer, and ``generate`` goes on past it."""
    ids = []
    for tok in (getattr(tokenizer, "eos_token", None), *(END_OF_TURN if chat else ())):
        if tok is None:
            continue
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != getattr(tokenizer, "unk_token_id", None) and tid not in ids:
            ids.append(tid)
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for tid in configured if isinstance(configured, (list, tuple)) else [configured]:
        if isinstance(tid, int) and not isinstance(tid, bool) and tid >= 0 and tid not in ids:
            ids.append(tid)
    return ids


_INT = re.compile(r"\d+")


def first_integer(text: str) -> int | None:
    """The first run of digits in ``text`` as an int (passkey scoring), or None."""
    m = _INT.search(text)
    return int(m.group()) if m else None


class ProgressSink:
    """Where a task reports progress; the CLI passes its progress display (a bar on a terminal, log lines
    otherwise), the API nothing."""

    def set_total(self, total: int) -> None:  # pragma: no cover - interface
        pass

    def advance(self, n: int = 1, description: str | None = None) -> None:  # pragma: no cover - interface
        pass


@dataclass
class EvalContext:
    """Everything a task needs besides its own options."""

    task: str
    model: Any
    tokenizer: Any
    method: str
    params: dict[str, Any]
    seed: int = 0
    writer: RecordWriter = field(default_factory=lambda: RecordWriter(None, resume=False, key_fields=COMMON_KEY_FIELDS))
    progress: ProgressSink | None = None
    #: Fields added to every record this context writes (not part of a sample's identity), e.g. a study's
    #: training seed.
    tags: dict[str, Any] = field(default_factory=dict)

    def key(self, length: int, **fields: Any) -> dict[str, Any]:
        """The identity of one sample: common fields plus the task's own (depth, trial, sample id…)."""
        return {"task": self.task, "method": self.method, "params": self.params, "length": length, **fields}

    def done(self, key: dict[str, Any]) -> bool:
        """True (and the bar advances) when this sample was already scored, by this run or a resumed one."""
        if self.writer.has(key):
            self.advance(1)
            return True
        return False

    def write(self, key: dict[str, Any], **fields: Any) -> dict[str, Any]:
        """Write one finished sample (``score`` in [0, 1] where the task has one) and advance the bar."""
        record = {**key, **fields, **self.tags}
        self.writer.write(record)
        self.advance(1)
        return record

    def set_total(self, total: int) -> None:
        """How many samples this run scores in all (finished ones included), for the progress bar."""
        if self.progress:
            self.progress.set_total(total)

    def advance(self, n: int = 1, description: str | None = None) -> None:
        if self.progress:
            self.progress.advance(n, description)

    def own_records(self) -> list[dict[str, Any]]:
        """The records of this task, method and parameters (a results file may hold other runs too)."""
        return [r for r in self.writer.records()
                if r.get("task") == self.task and r.get("method") == self.method and r.get("params") == self.params]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


@contextmanager
def timer() -> Iterator[Callable[[], float]]:
    """``with timer() as elapsed: …; elapsed()`` → seconds since entering."""
    start = time.perf_counter()
    yield lambda: time.perf_counter() - start


def make_context(
    task: str,
    model,
    tokenizer,
    *,
    method: str | None,
    params: dict[str, Any] | None,
    lengths: list[int],
    key_fields: tuple[str, ...],
    seed: int = 0,
    out: str | None = None,
    resume: bool = False,
    progress: ProgressSink | None = None,
    options: dict[str, Any] | None = None,
) -> EvalContext:
    """Install the method, open the results file (checking resume) and build the context.

    ``options``: the run's settings that change a sample without being part of its key (the seed, a chat template,
    a generation budget, a data file…). Every record carries them, and a resume whose options differ from those
    its file's samples of the same task, method and parameters were made with is refused in one line: the samples
    already there would otherwise be kept and reported as this run's.
    """
    variant, resolved = prepare_model(model, method, params, lengths)
    writer = RecordWriter(out, resume=resume, key_fields=COMMON_KEY_FIELDS + tuple(key_fields))
    the_method = method if method not in (None, "base", "none") else "plain"
    if options is not None:
        options = json.loads(json.dumps({"seed": seed, **options}, sort_keys=True, default=str))
        _check_resumed_options(writer, task, the_method, resolved, options, out)
    where = computed_on(variant)
    _check_resumed_dtype(writer, task, the_method, resolved, where["dtype"], out)
    variant.eval()
    return EvalContext(
        task=task,
        model=variant,
        tokenizer=tokenizer,
        method=the_method,
        params=resolved,
        seed=seed,
        writer=writer,
        progress=progress,
        # every record says where it was computed (device, dtype, attention, hardware): numbers from a GPU's bfloat16
        # and a CPU's float32 differ in their last digits, and a results file may be resumed on another machine
        tags={"computed_on": where, **({"options": options} if options is not None else {})},
    )


def _run_defaults(task: str) -> dict[str, Any]:
    """The options task ``task`` takes when they are not given: an option given as its default is the same run."""
    import inspect

    from . import TASKS, get_task

    if task not in TASKS:
        return {}
    module = get_task(task)
    signature = inspect.signature(module.run)
    defaults = {name: p.default for name, p in signature.parameters.items()
                if p.default is not inspect.Parameter.empty and p.default is not None}
    # an option whose None default computes what one given value does (NIAH's chat=None is chat=False)
    defaults.update(getattr(module, "SAME_AS_NOT_GIVEN", {}))
    return json.loads(json.dumps(defaults))


def _check_resumed_options(writer: RecordWriter, task: str, method: str, params: dict, options: dict, out) -> None:
    defaults = _run_defaults(task)
    for record in writer.records():
        if (record.get("task"), record.get("method"), record.get("params")) != (task, method, params):
            continue
        before = record.get("options")
        if before is None or before == options:
            continue  # a file written before options were recorded cannot be checked
        # an option left to a default that depends on the sample (ppl's stride, L/2) is compared as resolved: the
        # record says what the default came to, and an explicit value equal to it is the same run
        was_, now_ = ({k: _resolved_option(task, k, opts.get(k, defaults.get(k)), record)
                       for k in set(before) | set(options)} for opts in (before, options))
        changed = sorted(k for k in was_ if was_[k] != now_[k])
        if not changed:
            continue
        was = ", ".join(_said_option(k, before.get(k, defaults.get(k)), was_[k], record) for k in changed)
        now = ", ".join(_said_option(k, options.get(k, defaults.get(k)), now_[k], record) for k in changed)
        raise RopekitError(
            f"{out} holds {task} samples of {method} made with {was}; this run asks {now}, and resuming would report "
            "those samples as this run's",
            "pass another --out, or the options the file was made with")


#: The stride of PI, YaRN, PoSE and LongLoRA; perplexity's default at L ≥ 512 (:mod:`ropekit.eval.perplexity`).
PAPER_STRIDE = 256


def default_stride(length: int) -> int:
    """Perplexity's default stride, ``min(256, L // 2)`` (the module docstring of :mod:`ropekit.eval.perplexity`);
    here because a resume compares a stride left to it with the one a file's samples were made with."""
    return max(1, min(PAPER_STRIDE, length // 2))


def _resolved_option(task: str, name: str, value, record: dict):
    """What option ``name`` given as ``value`` (None: not given) came to in ``record``'s sample."""
    if value is not None:
        return value
    if task == "ppl" and name == "stride" and isinstance(record.get("length"), int) \
            and (record.get("options") or {}).get("score_mode", "last_stride") in ("last_stride", "full_window"):
        return default_stride(record["length"])
    return None


def _said_option(name: str, value, resolved, record: dict) -> str:
    """``name=value`` for a message; an option not given is said as its default, with what it came to."""
    if value is not None:
        return f"{name}={value!r}"
    if resolved is None:
        return f"{name} left to its default"
    length = record.get("length")
    how = f"L/2 = {resolved}" if isinstance(length, int) and resolved == length // 2 else f"{resolved}"
    return f"{name}=the default ({how})"


def _check_resumed_dtype(writer: RecordWriter, task: str, method: str, params: dict, dtype: str, out) -> None:
    """A resume computes in the dtype its file's samples (same task, method, parameters) were computed in: bfloat16
    and float32 scores of one model differ by about what separates methods. Another device or machine is fine."""
    for record in writer.records():
        if (record.get("task"), record.get("method"), record.get("params")) != (task, method, params):
            continue
        before = (record.get("computed_on") or {}).get("dtype")
        if before is not None and before != dtype:
            raise RopekitError(
                f"{out} holds {task} samples of {method} computed in {before}; this run computes in {dtype}, and "
                "resuming would mix the two in one summary", f"pass --dtype {before} to continue it, or another --out")


def mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def accuracy_by(records, *fields: str) -> list[dict[str, Any]]:
    """Mean ``score`` of the records grouped by ``fields`` (e.g. ``"length"``), as rows with ``accuracy`` and ``n``."""
    groups: dict[tuple, list[float]] = {}
    for r in records:
        groups.setdefault(tuple(r.get(f) for f in fields), []).append(float(r["score"]))
    rows = [{**dict(zip(fields, k)), "accuracy": mean(v), "n": len(v)} for k, v in groups.items()]
    rows.sort(key=lambda row: tuple((row[f] is None, row[f]) for f in fields))
    return rows
