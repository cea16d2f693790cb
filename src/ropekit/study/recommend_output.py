"""What ``ropekit recommend`` leaves in its output directory, written whole or not at all
(:func:`ropekit.runtime.atomic.atomic_dir`): the chosen method's export for the engine
(:func:`ropekit.install.save_pretrained`; with llama.cpp also the GGUF, :func:`ropekit.install.gguf_export.write_gguf`),
the model card with the evidence table (:func:`ropekit.install.card.evidence_markdown`), ``recommendation.json``
(every candidate, every number with its interval and n) and ``command.txt`` (the engine's command line); then
``ropekit verify`` in the engine when it is installed (:func:`ropekit.engines.verify`), its verdict in the card."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

from ..core.jsonsafe import json_safe
from ..errors import RopekitError
from .recommend import BASE_LABEL, Candidate, Plan
from .recommend_rule import RETRIEVAL, RULE, TIERS, Verdict
from .store import placement_text

#: The files of the output directory besides the export itself.
RECOMMENDATION_FILE = "recommendation.json"
COMMAND_FILE = "command.txt"
#: The GGUF a llama.cpp recommendation writes into the directory.
GGUF_NAME = "model-f16.gguf"
#: ``ropekit verify``'s name of each engine.
VERIFY_ENGINE = {"transformers": "transformers", "vllm": "vllm", "llamacpp": "llamacpp"}


def _interval(cell: dict[str, Any] | None, digits: int = 4) -> str:
    if not cell or cell.get("value") is None:
        return "—"
    ci = cell.get("ci95")
    band = f" [{ci[0]:.{digits}g}, {ci[1]:.{digits}g}]" if ci else ""
    return f"{cell['value']:.{digits}g}{band} (n={cell['n']})"


def _comparison(cmp: dict[str, Any] | None) -> str:
    if not cmp:
        return "—"
    ci = cmp.get("ci95")
    band = f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else ""
    return f"{cmp['estimate']:.3g}{band} (n={cmp['n']})"


def computed_in(work_dir: Path) -> list[dict[str, Any]]:
    """Where the evidence was computed: the finished pieces of the command's studies grouped by device, dtype and
    hardware (:func:`ropekit.study.store.placement_groups`) — a resumed run may have finished on another machine."""
    from .store import DB_NAME, open_study, placement_groups

    groups: list[dict[str, Any]] = []
    for part in ("frozen", "trained"):
        if (Path(work_dir) / part / DB_NAME).is_file():
            with open_study(Path(work_dir) / part) as store:
                groups += placement_groups(store.pieces(), store.placements(), store.sample_placements())
    return groups


def evidence_table(plan: Plan, verdict: Verdict, candidates: list[Candidate], verified: str,
                   excluded_at_export: list[dict[str, str]], computed: str | None = None) -> dict[str, Any]:
    """The card's evidence section (:func:`ropekit.install.card.evidence_markdown`)."""
    n, w = plan.target_length, plan.window
    by_label = {c.label: c for c in candidates}
    columns = ["candidate", "method", "parameters", f"perplexity @ {n}", f"passkey @ {n}", f"RULER niah @ {n}",
               f"perplexity ratio to base @ {w}", f"passkey Δ @ {w}", f"RULER Δ @ {w}", "in-window guard", "outcome"]
    rows = []
    base = verdict.evidence[BASE_LABEL]
    rows.append([f"{BASE_LABEL} (unmodified)", "—", "—", _interval(base.get(f"ppl@{n}")),
                 _interval(base.get(f"passkey@{n}"), 3), _interval(base.get(f"ruler@{n}"), 3), "1", "0", "0", "—",
                 "reference"])
    for label in verdict.order:
        c, ev = by_label[label], verdict.evidence[label]
        shown = {k: v for k, v in c.params.items() if k in c.given or k == "factor"}
        rows.append([label + ("" if c.kind == "frozen" else f" ({c.kind})"), c.method,
                     ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()) or "defaults",
                     _interval(ev.get(f"ppl@{n}")), _interval(ev.get(f"passkey@{n}"), 3), _interval(ev.get(f"ruler@{n}"), 3),
                     _comparison(ev["in_window"]["ppl_ratio"]), _comparison(ev["in_window"]["passkey_difference"]),
                     _comparison(ev["in_window"]["ruler_difference"]), TIERS[verdict.tiers[label]],
                     verdict.why.get(label, "")])
    runner = verdict.runner_up
    intro = [f"**Chosen: {verdict.winner}** for {plan.engine} at {n:,} tokens (window {w:,}), on {plan.samples} samples "
             f"per evaluation and length (95% paired bootstrap intervals; perplexity on the same target tokens at "
             f"both lengths; RULER single-needle `niah_single_1`).",
             f"Rule: {RULE}"]
    if runner:
        intro.append(f"Runner-up: **{runner}** — {verdict.why.get(runner, '')}")
    notes = [f"Verification: {verified}"]
    if computed:
        notes.append(f"Computed in: {computed}.")
    for item in excluded_at_export:
        notes.append(f"Passed over at export: {item['label']} — {item['why']}")
    if plan.excluded:
        notes.append("Not candidates: " + "; ".join(f"{e['method']} ({e['why']})" for e in plan.excluded) + ".")
    return {"title": "Why this method (ropekit recommend)", "intro": intro, "columns": columns, "rows": rows,
            "notes": notes}


def engine_command(engine: str, building: Path, out: Path, report: dict[str, Any], target: int) -> str:
    """The command line that serves the export in ``engine`` as ropekit computes it (paths as they will be)."""
    from ..install.vllm import vllm_serving

    if engine == "vllm":
        serving = vllm_serving(building)
        if not serving.exact:
            raise RopekitError(f"vLLM would not serve the export as ropekit computes it: {serving.why}",
                               "choose another candidate")
        return serving.command.replace(str(building), str(out))
    if engine == "llamacpp":
        return f"llama-server -m {shlex.quote(str(out / GGUF_NAME))} -c {target}"
    if report.get("transformers"):
        code = f"from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained({str(out)!r})"
    else:
        code = f"import ropekit; ropekit.load({str(out)!r})"
    return f"python -c {shlex.quote(code)}"


def round_trip(model, tokenizer, directory: Path, weights_dtype: str | None = None) -> dict[str, Any]:
    """What serves a ropekit-only export in transformers — ``ropekit.load(DIR)`` — against the model the evidence
    measured (the method installed in memory), on the text ``ropekit verify`` uses: 1.5× the original window
    of the built-in held-out corpus, so the positions where the method acts are compared. Same kernels and dtype
    on both sides, so the tolerance is transformers' own (:data:`ropekit.engines.verify.TOLERANCES`).

    ``weights_dtype``: what the export's weights were written in (a quantized GGUF's are float16,
    :func:`ropekit.install.save_pretrained`); the model in memory is rounded through it first (in place: it has
    been exported), so that the check is of the method restored, not of that stated rounding."""
    import time

    import torch

    from ..engines.verify import TOLERANCES, logprob_differences, ropekit_logprobs, text_ids
    from ..install import load
    from ..install.model_rope import installed

    started = time.perf_counter()
    compute = next(model.parameters()).dtype
    written = getattr(torch, weights_dtype) if weights_dtype else compute
    if written != compute:
        with torch.no_grad():  # what the file holds: the state dict (not recomputed buffers such as inv_freq)
            for tensor in model.state_dict().values():
                if tensor.is_floating_point() and tensor.dtype == compute:
                    tensor.copy_(tensor.to(written).to(compute))
    reloaded = load(directory, dtype=compute).eval()
    record = installed(reloaded) or {}
    original = int((record.get("base") or {}).get("max_position_embeddings") or reloaded.config.max_position_embeddings)
    length = min(int(reloaded.config.max_position_embeddings), int(original * 1.5))
    ids = text_ids(tokenizer, int(reloaded.config.vocab_size), length)
    ours, theirs = ropekit_logprobs(model.eval(), ids), ropekit_logprobs(reloaded, ids)
    diffs = logprob_differences(ours, theirs)
    limit = TOLERANCES["transformers"]
    return {"ran": True, "passed": max(diffs) <= limit, "engine_version": "ropekit.load round trip",
            "tokens": len(ids), "max_abs_diff": max(diffs), "mean_abs_diff": sum(diffs) / len(diffs),
            "tolerance": limit, "round_trip": True, "weights": str(written).removeprefix("torch."),
            "details": {"seconds": round(time.perf_counter() - started, 1)}}


def run_verify(engine: str, directory: Path, report: dict[str, Any], model=None, tokenizer=None) -> dict[str, Any]:
    """``ropekit verify`` of the export in ``engine``: its report, or why it did not run (one line). A ropekit-only
    export for transformers (no rope type of plain transformers computes it) is checked by :func:`round_trip`."""
    from ..engines.environments import engine_python, get_engine

    name = VERIFY_ENGINE[engine]
    if engine == "transformers" and not report.get("transformers"):
        if model is None:
            return {"ran": False, "why": "plain transformers refuses a ropekit-only rope type by design; "
                                         "ropekit.load(DIR) loads it"}
        return round_trip(model, tokenizer, directory, report.get("dtype"))
    try:
        python = engine_python(get_engine(name))
    except RopekitError as err:
        return {"ran": False, "why": f"{err.problem} ({err.fix})"}
    from ..engines.verify import engine_cannot_run, verify

    cannot = engine_cannot_run(name, model, python) if model is not None else ""
    if cannot:  # the engine cannot run this model at all: not a verdict on the export
        return {"ran": False, "why": cannot}

    try:
        result = verify(directory, name)
    except RopekitError as err:
        return {"ran": True, "passed": False, "why": err.one_line()}
    return {"ran": True, "passed": bool(result.passed), "engine_version": result.engine_version,
            "tokens": result.tokens, "max_abs_diff": result.max_abs_diff, "mean_abs_diff": result.mean_abs_diff,
            "tolerance": result.tolerance, "details": result.as_dict().get("details", {})}


def verify_line(engine: str, verdict: dict[str, Any] | None) -> str:
    if verdict is None:
        return "pending"
    if not verdict["ran"]:
        return f"`ropekit verify --engine {VERIFY_ENGINE[engine]}` did not run: {verdict['why']}."
    if "max_abs_diff" not in verdict:
        return f"`ropekit verify --engine {VERIFY_ENGINE[engine]}` FAILED: {verdict['why']}."
    word = "PASS" if verdict["passed"] else "FAIL"
    if verdict.get("round_trip"):
        return (f"plain transformers has no rope type for this method, so `ropekit.load(DIR)` serves it; reloaded "
                f"from DIR it computes what the method installed in memory computes on the same "
                f"{verdict.get('weights', '')} weights: {word}, {verdict['tokens']} tokens, max "
                f"|Δ log p| {verdict['max_abs_diff']:.2e} (tolerance {verdict['tolerance']:.0e}), mean "
                f"{verdict['mean_abs_diff']:.2e}.")
    return (f"`ropekit verify --engine {VERIFY_ENGINE[engine]}` {word} ({verdict['engine_version']}): "
            f"{verdict['tokens']} tokens, max |Δ log p| {verdict['max_abs_diff']:.2e} (tolerance "
            f"{verdict['tolerance']:.0e}), mean {verdict['mean_abs_diff']:.2e}.")


def _model_for(c: Candidate, spec: str, work_dir: Path):
    """``(model with the candidate installed, tokenizer, loaded base)``: a frozen candidate installed on a fresh
    load of the model; a searched or trained one loaded from the study's artifact."""
    from ..install import extend, load
    from ..models.loading import load_model
    from .store import open_study

    loaded = load_model(spec)
    if c.kind == "frozen":
        extend(loaded.model, c.method, **c.given)
        return loaded.model, loaded.tokenizer, loaded
    where, piece = (work_dir / "trained", f"train:{c.label}") if c.kind == "trained" else (work_dir / "frozen",
                                                                                           f"search:{c.label}")
    with open_study(where) as store:
        paths = [a["path"] for a in store.artifacts(piece) if a["name"] == "model"]
    if not paths:
        raise RopekitError(f"the study left no model for '{c.label}'", "run the same command again to redo it")
    return load(paths[0]), loaded.tokenizer, loaded


def check_replaceable(out: Path) -> None:
    """``--overwrite`` replaces an earlier recommendation (it holds :data:`RECOMMENDATION_FILE`) or an empty
    directory, never a directory of other files."""
    out = Path(out)
    if out.is_dir() and any(out.iterdir()) and not (out / RECOMMENDATION_FILE).is_file():
        raise RopekitError(f"--out '{out}' holds files that are not a ropekit recommendation (no {RECOMMENDATION_FILE})",
                           "pass a new directory: --overwrite replaces only an earlier recommendation")


def write_recommendation(plan: Plan, verdict: Verdict, candidates: list[Candidate], out: Path, work_dir: Path,
                         *, verify_engine: bool = True, seconds: float | None = None, log=None,
                         overwrite: bool = False) -> dict[str, Any]:
    """Export the winner (or, when its export is not served by the engine as ropekit computes it, the next in the
    rule's order) into ``out`` with its card, ``recommendation.json`` and the command line; verify it."""
    from ..install import save_pretrained
    from ..install.card import replace_evidence
    from ..runtime.atomic import atomic_dir

    by_label = {c.label: c for c in candidates}
    passed_over: list[dict[str, str]] = []
    groups = computed_in(work_dir)
    computed = placement_text(groups)
    if overwrite:
        check_replaceable(out)
    with atomic_dir(out, replace=overwrite, what="--out") as building:
        for label in verdict.order:
            c = by_label[label]
            model, tokenizer, loaded = _model_for(c, plan.model, work_dir)
            base_model = loaded.path if loaded.source in ("hub", "gguf", "smollm2") else None
            table = evidence_table(plan, verdict, candidates, "pending", passed_over, computed)
            target = building / "model"
            report = save_pretrained(model, target, tokenizer=tokenizer, base_model=base_model, evidence=table)
            try:
                command = engine_command(plan.engine, target, out, report, plan.target_length)
            except RopekitError as err:
                passed_over.append({"label": label, "why": err.problem})
                shutil.rmtree(target)
                continue
            break
        else:
            raise RopekitError(f"no candidate's export is served by {plan.engine} as ropekit computes it",
                               "choose another --engine")
        report["path"] = str(out)
        # the export is the directory itself: move its files up (the card and config.json at the top)
        for item in list(target.iterdir()):
            item.rename(building / item.name)
        target.rmdir()
        if plan.engine == "llamacpp":
            from ..install.gguf_export import write_gguf

            source = loaded.path if loaded.source in ("gguf", "smollm2") else None
            write_gguf(model, tokenizer, building / GGUF_NAME, outtype="f16", tokenizer_gguf=source)
        if log:
            log(f"exported {label} into {out}; verifying in {plan.engine}…")
        checked = (run_verify(plan.engine, building, report, model, tokenizer) if verify_engine
                   else {"ran": False, "why": "not asked"})
        line = verify_line(plan.engine, checked)
        replace_evidence(building, evidence_table(plan, verdict, candidates, line, passed_over, computed))
        result = {
            "model": plan.model, "target_length": plan.target_length, "window": plan.window, "engine": plan.engine,
            "chosen": label, "method": by_label[label].method, "params": by_label[label].params,
            "runner_up": verdict.runner_up, "rule": RULE,
            "why": verdict.why, "order": verdict.order, "in_window_guard": {k: TIERS[v] for k, v in verdict.tiers.items()},
            "passed_over_at_export": passed_over,
            "candidates": [{**c.as_dict(), "evidence": verdict.evidence[c.label]} for c in candidates],
            "base": verdict.evidence[BASE_LABEL], "excluded": plan.excluded,
            "plan": {k: v for k, v in plan.as_dict().items() if k not in ("candidates", "excluded")},
            "retrieval_tasks": list(RETRIEVAL),
            "export": report, "command": command, "verify": checked, "verify_line": line,
            "work_dir": str(work_dir), "seconds": seconds,
            "computed_in": [{"where": g["where"], "pieces": len(g["pieces"]), "samples": g["samples"],
                             "methods": g["methods"]} for g in groups],
        }
        (building / RECOMMENDATION_FILE).write_text(json.dumps(json_safe(result), indent=2, default=str) + "\n")
        (building / COMMAND_FILE).write_text(command + "\n")
    return result
