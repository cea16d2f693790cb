"""`ropekit eval ruler`: NVIDIA RULER's 13 synthetic tasks (Hsieh et al., 2024, "RULER: What's the Real
Context Size of Your Long-Context Language Models?"), generated locally with the model's own tokenizer.

Tasks (RULER's ``synthetic.yaml``): niah_single_1/2/3, niah_multikey_1/2/3, niah_multivalue,
niah_multiquery (needle retrieval, 128 generated tokens), vt (variable tracking, 30), cwe (common words, 120),
fwe (frequent words, 50), qa_1 (SQuAD v2) and qa_2 (HotpotQA) (32). Templates, answer prefixes, budgets and
metrics are RULER's (:mod:`ropekit.data.ruler.tasks`, :mod:`.metrics`); length control is in :mod:`.fit`.

Pipeline per task and length: fit the haystack so prompt + ``tokens_to_generate`` ≤ length, then for each
sample build the prompt (chat template around the task text when ``chat`` is on — by default whenever the
tokenizer has one — then RULER's answer prefix), generate greedily, keep only the continuation, post-process
it as RULER does (strip; control characters → ``\\n``; strip) and score it: ``string_match_all``
(fraction of references found, case-insensitive) for niah/vt/cwe/fwe, ``string_match_part`` (1 if any
reference is found) for qa. The per-length score is the unweighted mean over the tasks run (RULER's average).

Haystacks and data: ``noise`` (RULER's grass/sky/sun line), ``essay`` = the Python documentation prose
(:data:`~ropekit.data.prose.PROSE_SOURCE`, a labelled substitute for Paul Graham's essays), ``needle``
(distractor needles); word lists of wonderwords 3.0.1 shipped in :mod:`ropekit.data.words`. qa_1/qa_2 read
``dev-v2.0.json`` / ``hotpot_dev_distractor_v1.json`` from the ``data`` directory; without them they are
skipped, which the progress line says and the summary shows as a row with a ``skipped`` note (left out of
the average); the results file keeps that note as a record with ``sample: null`` and ``skipped`` (no
``score``), so a resumed run's summary still shows it.

Samples use per-sample generators seeded from (seed, task, length, sample) where RULER reuses fixed-seed
shuffles (docs/methods-reference.md §10), so they are not byte-identical to RULER's; the same seed reproduces them exactly.
Token counts include the BOS the model receives. At lengths too short for RULER's fixed parts a task drops
its few-shot example, then fails with the minimum length it needs (:mod:`.fit`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...data.prose import PROSE_SOURCE, prose_digest
from ...data.ruler.qa_data import find_qa_data
from ...data.ruler.tasks import TASKS, TaskSpec
from ...errors import RopekitError
from ..common import EvalContext, eos_ids, greedy_generate, mean, require_tokenizer, timer, token_lengths, whole_number
from .fit import Plan, Renderer, Sample
from .metrics import METRICS, postprocess, string_match_all, string_match_part

__all__ = ["DEFAULT_LENGTHS", "KEY_FIELDS", "TASKS", "Plan", "task_specs", "Renderer", "Sample", "run", "summarize", "resolve_tasks", "resolve_chat",
           "postprocess", "string_match_all", "string_match_part"]

KEY_FIELDS = ("subtask", "sample")

#: Lengths evaluated when none are given: lm-evaluation-harness's RULER default (RULER's own sweep is 4k–128k).
DEFAULT_LENGTHS = [4096]

#: The row that averages a length's tasks in :func:`summarize`.
AVERAGE = "average"


def resolve_tasks(tasks: list[str] | None) -> list[str]:
    """The RULER task names to run, in RULER's order (all 13 when ``tasks`` is None or ``["all"]``)."""
    if tasks is None or [t.strip() for t in tasks] == ["all"]:
        return list(TASKS)
    wanted = []
    for t in (t.strip() for t in tasks):
        if t not in TASKS:
            raise RopekitError(f"unknown RULER task '{t}'", f"choose from: {', '.join(TASKS)}")
        wanted.append(t)
    if not wanted:
        raise RopekitError("--tasks is empty", f"pass some of: {', '.join(TASKS)}")
    return [t for t in TASKS if t in wanted]


def resolve_chat(tokenizer, chat: bool | None) -> bool:
    """Whether prompts are wrapped in the chat template: ``chat``, or by default whether the tokenizer has one."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat is None:
        return has_template
    if chat and not has_template:
        raise RopekitError("--chat was given but this model's tokenizer has no chat template", "drop --chat to use RULER's base (plain) template")
    return bool(chat)


def task_specs(names: list[str], tokens_to_generate: int | None) -> dict[str, TaskSpec]:
    """RULER's spec of each task, with its generation budget replaced by ``tokens_to_generate`` when given.

    The budget counts in the length (prompt + budget ≤ length), so RULER's 128 tokens for a niah answer leave
    little of a short window to the haystack; a 7-digit value needs about ten. The scoring is unchanged, and a
    generation cut short by the budget scores what it found.
    """
    if tokens_to_generate is None:
        return {name: TASKS[name] for name in names}
    if isinstance(tokens_to_generate, bool) or not isinstance(tokens_to_generate, int) or tokens_to_generate < 1:
        raise RopekitError(f"--tokens-to-generate {tokens_to_generate!r} is not a positive whole number",
                           "pass e.g. --tokens-to-generate 16, or leave it out for RULER's budget per task")
    return {name: dataclasses.replace(TASKS[name], tokens_to_generate=tokens_to_generate) for name in names}


def check_options(*, lengths: list[int] | None = None, tasks: list[str] | None = None, samples: int = 10,
                  data: str | None = None, chat: bool | None = None, tokens_to_generate: int | None = None) -> list[str]:
    """Refuse what is wrong whatever the model (:mod:`ropekit.eval.common`); the tasks to run, in RULER's order.

    ``data`` feeds only the qa tasks: given for a run without one, it would be silently unused."""
    whole_number(samples, "--samples")
    names = resolve_tasks(tasks)
    task_specs(names, tokens_to_generate)
    if lengths is not None:
        token_lengths(lengths)
    if chat is not None and not isinstance(chat, bool):
        raise RopekitError(f"chat {chat!r} is not true or false", "pass --chat or --no-chat")
    if data is not None and not any(TASKS[name].family == "qa" for name in names):
        qa = ", ".join(name for name in TASKS if TASKS[name].family == "qa")
        raise RopekitError(f"--data feeds only RULER's qa tasks ({qa}), and none is selected",
                           f"drop --data, or add {qa} to --tasks")
    return names


def prepare(ctx_tokenizer, *, lengths: list[int], tasks: list[str] | None = None, data: str | None = None,
            chat: bool | None = None, seed: int = 0, samples: int = 1, tokens_to_generate: int | None = None,
            progress=None):
    """``(plans, skipped, chat_on)``: a fitted :class:`Plan` per (length, task) and the qa tasks skipped with why.

    Everything that can fail (unknown task, a bad budget, a length too short for a task, malformed QA file,
    too few questions) fails here, before any generation.
    """
    names = check_options(lengths=lengths, tasks=tasks, samples=samples, data=data, chat=chat,
                          tokens_to_generate=tokens_to_generate)
    specs = task_specs(names, tokens_to_generate)
    lengths = list(dict.fromkeys(lengths))
    chat_on = resolve_chat(ctx_tokenizer, chat)
    renderer = Renderer(ctx_tokenizer, chat_on)
    qa_sets, skipped = {}, {}
    for name in names:
        if TASKS[name].family != "qa":
            continue
        found, reason = find_qa_data(name, data)
        if found is None:
            skipped[name] = reason
            continue
        if samples > len(found.items):
            raise RopekitError(f"--samples {samples} exceeds the {len(found.items)} answerable questions in {found.path}",
                               f"pass --samples {len(found.items)} or fewer")
        qa_sets[name] = found
    if len(skipped) == len(names):  # nothing would run: a run of only these tasks is refused, not empty
        name, reason = next(iter(skipped.items()))
        raise RopekitError(f"RULER task {name} cannot run: {reason}", "pass --data with its file, or other --tasks")
    plans = []
    for length in lengths:
        for name in names:
            if name in skipped:
                continue
            if progress:
                progress(f"ruler: preparing {name} @ {length}")
            plans.append(Plan(specs[name], length, renderer, seed, qa_sets.get(name)))
    return plans, skipped, chat_on


def run(ctx: EvalContext, *, lengths: list[int] | None = None, tasks: list[str] | None = None, samples: int = 10,
        data: str | None = None, chat: bool | None = None, tokens_to_generate: int | None = None) -> None:
    """Score ``samples`` samples of each task at each length (default :data:`DEFAULT_LENGTHS`); one record per sample.
    ``tokens_to_generate`` replaces RULER's generation budget of every task (:func:`task_specs`)."""
    tokenizer = require_tokenizer(ctx.tokenizer, "ruler")
    lengths = list(lengths or DEFAULT_LENGTHS)
    plans, skipped, chat_on = prepare(tokenizer, lengths=lengths, tasks=tasks, data=data, chat=chat, seed=ctx.seed,
                                      samples=samples, tokens_to_generate=tokens_to_generate,
                                      progress=lambda text: ctx.advance(0, description=text))
    ctx.set_total(len(plans) * samples)
    for name, reason in skipped.items():
        ctx.advance(0, description=f"ruler: {name} skipped — {reason}")
        for length in lengths:
            marker = ctx.key(length, subtask=name, sample=None)
            if not ctx.writer.has(marker):  # not a sample: no progress step, no score
                ctx.writer.write({**marker, "skipped": reason})
    eos = eos_ids(tokenizer, ctx.model, chat=chat_on)
    essay_digest = None
    for plan in plans:
        spec = plan.spec
        ctx.advance(0, description=f"ruler {spec.name} @ {plan.length}")
        for index in range(samples):
            key = ctx.key(plan.length, subtask=spec.name, sample=index)
            if ctx.done(key):
                continue
            sample = plan.sample(index)
            extra: dict[str, Any] = {}
            if sample.haystack == PROSE_SOURCE:
                essay_digest = essay_digest or prose_digest()
                extra["haystack_digest"] = essay_digest
            with timer() as elapsed:
                new = greedy_generate(ctx.model, sample.ids, spec.tokens_to_generate, eos_token_ids=eos)
                prediction = postprocess(tokenizer.decode(new, skip_special_tokens=True))
                score = METRICS[spec.metric](prediction, sample.references)
                seconds = elapsed()
            ctx.write(
                key,
                prediction=prediction,
                references=sample.references,
                score=score,
                metric=spec.metric,
                prompt_tokens=sample.prompt_tokens,
                tokens_to_generate=spec.tokens_to_generate,
                generated_tokens=len(new),
                seconds=seconds,
                haystack=sample.haystack,
                haystack_size=sample.knob,
                fewshot=sample.fewshot,
                chat=chat_on,
                **extra,
            )


def _fill(records: list[dict[str, Any]]) -> float | None:
    """The mean share of the length its samples use, prompt plus generation budget: RULER shrinks a haystack by
    whole steps (500 essay words) until the prompt fits, so a sample whose key or answer is a few tokens longer
    than the fitted one can use 85 % of a 4k length. Reported beside the accuracy rather than hidden in the label."""
    used = [(r["prompt_tokens"] + r.get("tokens_to_generate", 0)) / r["length"] for r in records
            if r.get("prompt_tokens") is not None and r.get("length")]
    return round(mean(used), 3) if used else None


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (length, task): ``accuracy`` (mean score), ``n``, ``nulls`` (empty predictions, as RULER's
    summary) and ``fill`` (the mean share of the length used, :func:`_fill`); per length an ``average`` row, the
    unweighted mean over the tasks scored (RULER's score). A qa task skipped for want of data shows as a row with
    ``skipped`` and no accuracy, outside the average."""
    order = {name: i for i, name in enumerate(TASKS)}
    scored: dict[tuple[int, str], list[dict[str, Any]]] = {}
    skipped: dict[tuple[int, str], str] = {}
    for r in records:
        if r.get("skipped") is not None and r.get("sample") is None:
            skipped[(r["length"], r["subtask"])] = r["skipped"]
        elif r.get("score") is not None:
            scored.setdefault((r["length"], r["subtask"]), []).append(r)
    rows = []
    for length in sorted({k[0] for k in scored} | {k[0] for k in skipped}):
        task_rows = []
        for (L, name), recs in scored.items():
            if L == length:
                task_rows.append({"length": length, "subtask": name, "accuracy": mean(float(r["score"]) for r in recs),
                                  "n": len(recs), "nulls": sum(1 for r in recs if not r.get("prediction")),
                                  "fill": _fill(recs)})
        notes = [{"length": length, "subtask": name, "accuracy": None, "n": 0, "skipped": reason}
                 for (L, name), reason in skipped.items() if L == length and (L, name) not in scored]
        both = sorted(task_rows + notes, key=lambda row: order.get(row["subtask"], len(order)))
        rows.extend(both)
        if task_rows:
            rows.append({"length": length, "subtask": AVERAGE, "accuracy": mean(r["accuracy"] for r in task_rows),
                         "n": sum(r["n"] for r in task_rows), "tasks": len(task_rows)})
    return rows
