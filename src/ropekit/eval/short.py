"""Short-context regression with lm-evaluation-harness (``ropekit eval short``; optional extra ``lmeval``).

A context-extension method should not cost the model what it could do inside its original window. This
task runs lm-evaluation-harness (EleutherAI, ``lm_eval.simple_evaluate``) on the evaluated model — the
model with ``--method`` installed, wrapped in lm-eval's ``HFLM`` with its tokenizer — over task files on
disk, offline:

* ``--data DIR``: a directory of lm-eval task YAMLs. Every ``dataset_path`` in them must be local — a
  ``datasets`` builder that reads files (``json``, ``csv``, ``parquet``, ``text``, ``arrow``…) with
  ``dataset_kwargs: {data_files: …}``, or an existing directory; a hub dataset id is refused before
  anything is loaded, since the machine has no network.
* ``--tasks a,b``: task (or group) names from those files; default every task in ``--data``, else the
  built-in task.
* Built in: ``ropekit_prose_cloze`` (:func:`write_builtin_task`), generated on the fly so that
  ``ropekit eval short MODEL`` works without any file: 4-way multiple choice over sentences of the English
  prose of :mod:`ropekit.data.prose` (``python-docs-prose``). The context is the first half of a
  sentence's words; the choices are its true second half and the second halves of three other sentences.
  lm-eval scores each choice by the summed log-likelihood of ``" " + choice`` after the context and
  reports ``acc`` (argmax = gold) and ``acc_norm`` (argmax of the log-likelihood per character).
  Chance is 25 %; a language model that follows the text does better, and a method that damages short
  contexts loses some of that margin.

``data_files`` paths are read as ``datasets`` reads them (relative to the working directory); absolute
paths make a task directory usable from anywhere.

One record per (lm-eval task, document): ``score`` is the document's ``acc`` (or ``exact_match``, or
``acc_norm``, the first that the task reports), ``prediction`` the chosen index for multiple choice (the
filtered response otherwise), ``metrics`` every per-document value lm-eval logged, and
``loglikelihoods`` the choices' scores. ``--resume`` skips documents already in the file: lm-eval is asked
for exactly the missing ones (``samples={task: [doc ids]}``), in calls of at most :data:`CALL_DOCS`
documents so that an interruption loses little. ``--samples N`` takes the first N documents of each task.

Determinism and isolation: each ``HFLM`` runs with batch size 1, so a document's score never depends on
which others share its batch (with right padding and no attention mask, a length-dependent method such
as Dynamic NTK would otherwise see the padded length); the global ``random``/numpy/torch generators are
seeded with ``--seed`` for the call and restored afterwards; the tokenizer is copied, because ``HFLM``
may add a pad token to it. ``lengths`` mean nothing here: records use length 0 (``DEFAULT_LENGTHS``),
and ``--lengths`` only sizes a factor-based method (through ``make_context``).

Few-shot demonstrations are those of one uninterrupted lm-eval run with ``fewshot_random_seed=--seed``,
whatever the calls and resumes. lm-eval draws them in sequence (lm-evaluation-harness 0.4.13,
https://github.com/EleutherAI/lm-evaluation-harness): ``simple_evaluate`` reseeds the task's
generators (``Task.set_fewshot_seed``: ``random.Random(seed)``, ``lm_eval/evaluator.py`` and
``lm_eval/api/task.py``), then ``Task.build_all_requests`` builds the documents' contexts in order, and
``ConfigurableTask.fewshot_context`` takes each one's demonstrations with ``ContextSampler.sample``
(``self.rnd.sample(...)``, ``lm_eval/api/samplers.py``), so a document's demonstrations depend on how many
documents were drawn before it in the same call. Calling lm-eval per :data:`CALL_DOCS` documents, or for the
documents a resume left, would restart that sequence. So :class:`_FewshotReplay` replays the draws of
documents 0, 1, 2… once, in order (``fewshot_context`` itself, on the same task object, freshly seeded),
keeping the generators' states before each document, and during a call :func:`_fewshot_states` puts a
document's state back just before lm-eval builds its context. The same task objects are handed to every call.

Scores are computed in float32, like ropekit's own scorers: ``HFLM`` gets ``softmax_dtype=torch.float32`` (its
documented option, ``HFLM.__init__`` in ``lm_eval/models/huggingface.py``: the dtype of its ``F.log_softmax``), so
that with a bfloat16 or float16 model lm-eval's ``log_softmax`` and the sum over an answer's tokens are not
rounded to the model's dtype (transformers 5 no longer upcasts logits).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import math
import os
import random
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Iterator

from ..core.schema import read_yaml_file
from ..errors import RopekitError
from .common import EvalContext, mean, timer, whole_number

KEY_FIELDS = ("subtask", "sample")

#: The length recorded with every record: short-context results do not depend on a sweep length.
DEFAULT_LENGTHS = [0]

#: The built-in task and its number of documents.
BUILTIN_TASK = "ropekit_prose_cloze"
BUILTIN_DOCS = 200
BUILTIN_CHOICES = 4

#: Documents per lm-eval call (an interruption loses at most one call's documents).
CALL_DOCS = 100

#: ``datasets`` builders that read local files (``dataset_path`` values that need no network).
LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow", "pandas", "imagefolder", "audiofolder", "webdataset")

#: Per-document metrics that are (value, weight) pairs, with lm-eval's aggregation of them.
_PAIR_AGGREGATIONS = {
    "word_perplexity": lambda a, b: math.exp(-a / b),
    "byte_perplexity": lambda a, b: math.exp(-a / b),
    "bits_per_byte": lambda a, b: -a / b / math.log(2),
}

_INSTALL = RopekitError("the 'short' evaluation needs lm-evaluation-harness", "pip install 'ropekit[lmeval]'")


def _require_lm_eval():
    try:
        import lm_eval  # noqa: F401
        from lm_eval.models.huggingface import HFLM  # noqa: F401
        from lm_eval.tasks import TaskManager  # noqa: F401
    except ImportError:
        raise _INSTALL from None
    return lm_eval


def lm_eval_version() -> str | None:
    """The installed lm-evaluation-harness version, or None."""
    try:
        from importlib.metadata import version

        return version("lm_eval")
    except Exception:
        return None


# ---- the built-in task ------------------------------------------------------------------------------
def builtin_documents(seed: int = 0, n_docs: int = BUILTIN_DOCS) -> list[dict[str, Any]]:
    """The documents of ``ropekit_prose_cloze``: sentence halves from ``python-docs-prose``.

    Sentences of 10–30 words are drawn with ``random.Random`` seeded by ``seed``; each keeps its first
    ``⌊words/2⌋`` words as ``context``; ``choices`` are its own second half and the second halves of three
    other drawn sentences (all different), the gold one at a random place (``label``).
    """
    from ..data.prose import PROSE_SOURCE, prose_sentences

    pool = sorted({s for s in prose_sentences() if 10 <= len(s.split()) <= 30})
    rng = random.Random(f"short-{seed}")
    if len(pool) < n_docs + BUILTIN_CHOICES:
        raise RuntimeError(f"the prose has only {len(pool)} usable sentences for {n_docs} documents")
    drawn = rng.sample(pool, n_docs)

    def halves(sentence: str) -> tuple[str, str]:
        words = sentence.split()
        cut = len(words) // 2
        return " ".join(words[:cut]), " ".join(words[cut:])

    endings = [halves(s)[1] for s in pool]
    docs = []
    for sentence in drawn:
        context, gold = halves(sentence)
        distractors: list[str] = []
        while len(distractors) < BUILTIN_CHOICES - 1:
            other = endings[rng.randrange(len(endings))]
            if other != gold and other not in distractors:
                distractors.append(other)
        label = rng.randrange(BUILTIN_CHOICES)
        choices = distractors[:label] + [gold] + distractors[label:]
        docs.append({"context": context, "choices": choices, "label": label, "source": PROSE_SOURCE})
    return docs


def write_builtin_task(directory: str | Path, seed: int = 0, n_docs: int = BUILTIN_DOCS) -> Path:
    """Write ``ropekit_prose_cloze.yaml`` and its JSONL into ``directory`` (lm-eval task format); returns the YAML."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"{BUILTIN_TASK}.jsonl"
    with data.open("w") as fh:
        for doc in builtin_documents(seed, n_docs):
            fh.write(json.dumps(doc) + "\n")
    config = {
        "task": BUILTIN_TASK,
        "dataset_path": "json",
        "dataset_kwargs": {
            "data_files": {"test": str(data.resolve())},
            "cache_dir": str((directory / "cache").resolve()),  # datasets' Arrow cache goes with the scratch dir
        },
        "output_type": "multiple_choice",
        "test_split": "test",
        "doc_to_text": "{{context}}",
        "doc_to_choice": "choices",
        "doc_to_target": "label",
        "target_delimiter": " ",
        "metric_list": [
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
        ],
        "metadata": {"version": 1.0, "seed": seed},
    }
    path = directory / f"{BUILTIN_TASK}.yaml"
    path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    return path


# ---- task files ---------------------------------------------------------------------------------------
def check_local_tasks(directory: str | Path) -> list[Path]:
    """The task YAMLs under ``directory``; a one-line error for a missing directory, one without task files,
    or a file whose ``dataset_path`` is neither a local ``datasets`` builder nor an existing directory."""
    root = Path(directory)
    if not root.is_dir():
        raise RopekitError(f"--data '{directory}' is not a directory", "pass a directory of lm-eval task YAML files")
    files = sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    if not files:
        raise RopekitError(f"no task files (*.yaml) in '{directory}'", "pass a directory of lm-eval task YAML files")
    for path in files:
        config = read_yaml_file(path, f"task file '{path}'", any_tag=True)
        if not isinstance(config, dict) or config.get("dataset_path") is None:
            continue
        source = str(config["dataset_path"])
        if source not in LOCAL_BUILDERS and not Path(source).is_dir() and not (path.parent / source).is_dir():
            raise RopekitError(
                f"task file '{path.name}' reads dataset '{source}' from the Hugging Face hub, and this run is offline",
                "use dataset_path: json (or csv, parquet…) with dataset_kwargs: {data_files: PATH}",
            )
    return files


# ---- running lm-eval --------------------------------------------------------------------------------
@contextlib.contextmanager
def _seeded_and_quiet(seed: int) -> Iterator[None]:
    """Seed the global generators lm-eval may use, restore them afterwards; keep lm-eval's logging to errors and
    its (and datasets') progress bars off: ropekit's own bar counts the documents, and a refusal stays one line."""
    import numpy as np
    import torch

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    loggers = [logging.getLogger(name) for name in ("lm-eval", "lm_eval")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with _stderr_silenced():
            yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """stderr to nowhere for the duration: lm-eval and datasets draw their bars there with their own settings (no
    switch reaches all of them) and lm-eval runs ``git`` outside a repository ("fatal: not a git repository"), so
    both Python's ``sys.stderr`` and file descriptor 2 (which child processes inherit) are redirected. ropekit's own
    progress lines of that moment go too; its bar moves between lm-eval's calls."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no descriptor 2 to redirect (a detached process): Python's stream only
        saved = None
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        if saved is not None:
            os.dup2(devnull, 2)
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        if saved is not None:
            os.dup2(saved, 2)
            os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def _window_assertion(task: str, max_length: int) -> Iterator[None]:
    """lm-eval's HFLM asserts that an answer (a continuation) fits the model's window; that bare assertion becomes
    one line naming the task and the window. Any other assertion passes through."""
    try:
        yield
    except AssertionError as err:
        frames = traceback.extract_tb(err.__traceback__)
        if not frames or "max_length" not in (frames[-1].line or ""):
            raise
        raise RopekitError(f"lm-eval task {task}: an answer is longer than the model's {max_length}-token window",
                           "evaluate a model with a longer window, or extend it with --method") from None


def _fewshot_generators(task) -> tuple[Any, Any]:
    """The ``random.Random`` generators lm-eval draws a task's demonstrations from: the few-shot sampler's
    (``ConfigurableTask.sampler.rnd``) and the task's own (``Task.fewshot_rnd``, used by the base ``Task``)."""
    return getattr(getattr(task, "sampler", None), "rnd", None), getattr(task, "fewshot_rnd", None)


def _get_fewshot_state(task) -> tuple[Any, ...]:
    return tuple(g.getstate() if isinstance(g, random.Random) else None for g in _fewshot_generators(task))


def _set_fewshot_state(task, state: tuple[Any, ...]) -> None:
    for generator, saved in zip(_fewshot_generators(task), state):
        if isinstance(generator, random.Random) and saved is not None:
            generator.setstate(saved)


def _same_doc(a: Any, b: Any) -> bool:
    if a == b:
        return True
    try:  # NaN fields compare unequal to themselves
        return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return False


def _num_fewshot(task) -> int:
    """The shots ``simple_evaluate`` gives a task when no ``num_fewshot`` is passed: its config's, else 0."""
    return int(task.get_config("num_fewshot") or 0)


class _FewshotReplay:
    """The state of a task's few-shot generators before each document, as one uninterrupted lm-eval run with
    ``fewshot_random_seed=seed`` has them: the task is seeded as ``simple_evaluate`` seeds it
    (``set_fewshot_seed``) and ``fewshot_context`` is called for documents 0, 1, 2… in order, as
    ``Task.build_all_requests`` calls it. The replay moves forward only (documents are asked for in increasing
    order) and keeps the states of the documents asked for, not of all: a state is a few kilobytes."""

    def __init__(self, task, docs, seed: int, shots: int):
        self.task, self.docs, self.shots = task, docs, shots
        task.set_fewshot_seed(seed=seed)
        self.next_doc = 0
        self.state = _get_fewshot_state(task)

    def states(self, wanted: list[int]) -> dict[int, tuple[Any, ...]]:
        """``{doc: state before it}`` for ``wanted`` (increasing, none before a document already passed)."""
        if not wanted:
            return {}
        if wanted[0] < self.next_doc or wanted != sorted(wanted):
            raise RuntimeError("few-shot replay: documents must be asked for in increasing order")
        wanted_set, out = set(wanted), {}
        _set_fewshot_state(self.task, self.state)
        for d in range(self.next_doc, wanted[-1] + 1):
            if d in wanted_set:
                out[d] = _get_fewshot_state(self.task)
            self.task.fewshot_context(self.docs[d], num_fewshot=self.shots)
        self.next_doc = wanted[-1] + 1
        self.state = _get_fewshot_state(self.task)
        return out


@contextlib.contextmanager
def _fewshot_states(task, docs, chunk: list[int], states: dict[int, tuple[Any, ...]]) -> Iterator[None]:
    """For one ``simple_evaluate`` call over ``chunk`` (increasing document ids): each call of the task's
    ``fewshot_context`` first sets the few-shot generators to the state its document has in an uninterrupted run.
    ``build_all_requests`` calls it once per document, in the documents' order; the document is checked, so that
    another order in a later lm-eval fails loudly instead of giving the wrong demonstrations."""
    original = task.fewshot_context
    pending = list(chunk)

    def fewshot_context(doc, *args, **kwargs):
        if not pending:
            raise RuntimeError(f"lm-eval built more few-shot contexts than the {len(chunk)} documents asked for")
        d = pending.pop(0)
        if not _same_doc(doc, docs[d]):
            raise RuntimeError(f"lm-eval built few-shot contexts out of document order (expected document {d})")
        _set_fewshot_state(task, states[d])
        return original(doc, *args, **kwargs)

    task.fewshot_context = fewshot_context
    try:
        yield
    finally:
        del task.fewshot_context  # the class's method again
    if pending:
        raise RuntimeError(f"lm-eval built no few-shot context for documents {pending[:5]}")


def _jsonable(value):
    try:
        import numpy as np

        if isinstance(value, np.generic):
            return value.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _sample_fields(logged: dict[str, Any], output_type: str) -> dict[str, Any]:
    """A record's fields from one entry of lm-eval's ``log_samples`` output."""
    metrics = {name: _jsonable(logged[name]) for name in logged.get("metrics", []) if name in logged}
    score = None
    for name in ("acc", "exact_match", "acc_norm"):
        if isinstance(metrics.get(name), (int, float)) and not isinstance(metrics.get(name), bool):
            score = float(metrics[name])
            break
    filtered = logged.get("filtered_resps")
    fields: dict[str, Any] = {"score": score, "metrics": metrics, "target": _jsonable(logged.get("target"))}
    if output_type == "multiple_choice" and filtered:
        lls = [float(r[0]) if isinstance(r, (list, tuple)) else float(r) for r in filtered]
        fields["loglikelihoods"] = lls
        fields["prediction"] = max(range(len(lls)), key=lambda i: lls[i])
    else:
        fields["prediction"] = _jsonable(filtered[0] if isinstance(filtered, list) and len(filtered) == 1 else filtered)
    for name in ("doc_hash", "prompt_hash"):
        if name in logged:
            fields[name] = logged[name]
    return fields


def check_options(*, lengths: list[int] | None = None, tasks: list[str] | None = None, data: str | None = None,
                  samples: int | None = None, chat: bool = False) -> None:
    """Refuse what is wrong whatever the model (:mod:`ropekit.eval.common`). lm-eval, the task files and their
    names are checked by ``run``: a study whose short pieces are done continues on a machine without them."""
    if samples is not None:
        whole_number(samples, "--samples")
    if not isinstance(chat, bool):
        raise RopekitError(f"chat {chat!r} is not true or false", "pass --chat, or leave it out")
    if tasks is not None and not [t for t in tasks if str(t).strip()]:
        raise RopekitError("--tasks is empty", "name lm-eval tasks, or leave it out")


def run(
    ctx: EvalContext,
    *,
    lengths: list[int] | None = None,
    tasks: list[str] | None = None,
    data: str | None = None,
    samples: int | None = None,
    chat: bool = False,
) -> None:
    """Run the lm-eval tasks (``tasks`` from ``data``, or the built-in one) on ``ctx.model``; one record per
    document. ``lengths`` are accepted and ignored (records use length 0)."""
    lm_eval = _require_lm_eval()
    import torch
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    if ctx.tokenizer is None:
        raise RopekitError("the 'short' evaluation needs a tokenizer and this model has none",
                           "pass a model directory that includes tokenizer files, a GGUF with a vocabulary, or a built-in name")
    check_options(lengths=lengths, tasks=tasks, data=data, samples=samples, chat=chat)
    if chat and not getattr(ctx.tokenizer, "chat_template", None):
        raise RopekitError("--chat was given but this tokenizer has no chat template", "drop --chat")
    names = list(tasks) if tasks else ([] if data else [BUILTIN_TASK])
    with tempfile.TemporaryDirectory(prefix="ropekit-short-") as scratch:
        paths: list[str] = []
        if data:
            check_local_tasks(data)
            paths.append(str(Path(data).resolve()))
        if BUILTIN_TASK in names or not data:
            write_builtin_task(scratch, ctx.seed)
            paths.insert(0, scratch)
        with _seeded_and_quiet(ctx.seed):
            manager = TaskManager(include_path=paths, include_defaults=False)
            if not names:  # every task in --data
                names = [n for n in manager.all_subtasks if n != BUILTIN_TASK]
                if not names:
                    raise RopekitError(f"no lm-eval task is defined in '{data}'", "add task YAMLs, or pass --tasks")
            unknown = [n for n in names if n not in manager.all_tasks]
            if unknown:
                known = ", ".join(manager.all_tasks[:12]) + (" …" if len(manager.all_tasks) > 12 else "")
                raise RopekitError(f"unknown lm-eval task {', '.join(unknown)}", f"choose from the task files: {known}")
            leaves = manager.load(names)["tasks"]
        plan: list[tuple[str, list[int]]] = []
        total = 0
        for name, task in leaves.items():
            docs = list(range(len(task.eval_docs)))
            if samples is not None:
                docs = docs[:samples]
            total += len(docs)
            plan.append((name, docs))
        ctx.set_total(total)
        with _seeded_and_quiet(ctx.seed):
            # float32 log_softmax and sums whatever the model's dtype (HFLM's softmax_dtype)
            lm = HFLM(pretrained=ctx.model, tokenizer=copy.deepcopy(ctx.tokenizer), batch_size=1,
                      device=str(ctx.device), softmax_dtype=torch.float32)
        max_length = int(lm.max_length)  # HFLM keeps the last max_length tokens of longer inputs
        version = lm_eval_version()
        for name, docs in plan:
            task = leaves[name]
            todo = [d for d in docs if not ctx.done(ctx.key(0, subtask=name, sample=d))]
            n_shots = _num_fewshot(task)
            replay = eval_docs = None
            if todo and n_shots > 0:
                eval_docs = task.eval_docs
                with _seeded_and_quiet(ctx.seed):
                    replay = _FewshotReplay(task, eval_docs, ctx.seed, n_shots)
            for start in range(0, len(todo), CALL_DOCS):
                chunk = todo[start:start + CALL_DOCS]
                placed = contextlib.nullcontext()
                if replay is not None:
                    with _seeded_and_quiet(ctx.seed):
                        placed = _fewshot_states(task, eval_docs, chunk, replay.states(chunk))
                with timer() as elapsed, _seeded_and_quiet(ctx.seed), _window_assertion(name, max_length), placed:
                    result = lm_eval.simple_evaluate(
                        model=lm, tasks=[task], task_manager=manager, samples={name: chunk}, log_samples=True,
                        apply_chat_template=bool(chat), bootstrap_iters=0, random_seed=None, numpy_random_seed=None,
                        torch_random_seed=None, fewshot_random_seed=ctx.seed,
                    )
                    seconds = elapsed() / max(1, len(chunk))
                output_type = result["configs"][name].get("output_type", "")
                shots = result.get("n-shot", {}).get(name)
                for logged in sorted(result["samples"][name], key=lambda s: s["doc_id"]):
                    key = ctx.key(0, subtask=name, sample=int(logged["doc_id"]))
                    if ctx.writer.has(key):  # a task with repeats/filters logs a document more than once
                        continue
                    ctx.write(key, **_sample_fields(logged, output_type), output_type=output_type, shots=shots,
                              chat=bool(chat), max_length=max_length, lm_eval_version=version, seconds=seconds)


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per lm-eval task (per method too when the records hold several): ``accuracy`` = mean score,
    then every metric lm-eval logged per document aggregated as lm-eval does (mean; the (log-likelihood,
    weight) pairs of the perplexities as ``exp(−Σll/Σw)``, bits per byte as ``−Σll/Σw/ln 2``), and ``n``."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        label = r.get("method", "plain") + (f" {json.dumps(r['params'], sort_keys=True)}" if r.get("params") else "")
        groups.setdefault((label, r["subtask"]), []).append(r)
    several = len({label for label, _ in groups}) > 1
    rows = []
    for (label, subtask), recs in sorted(groups.items()):
        row: dict[str, Any] = {"method": label} if several else {}
        row["task"] = subtask
        scores = [r["score"] for r in recs if isinstance(r.get("score"), (int, float))]
        row["accuracy"] = mean(scores)
        names = list(dict.fromkeys(n for r in recs for n in (r.get("metrics") or {})))
        for name in names:
            values = [r["metrics"][name] for r in recs if name in (r.get("metrics") or {})]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                row[name] = mean(float(v) for v in values)
            elif name in _PAIR_AGGREGATIONS and all(isinstance(v, list) and len(v) == 2 for v in values):
                total, weight = sum(float(v[0]) for v in values), sum(float(v[1]) for v in values)
                row[name] = _PAIR_AGGREGATIONS[name](total, weight) if weight else None
        row["n"] = len(recs)
        rows.append(row)
    return rows
