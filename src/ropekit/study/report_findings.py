"""What the study's data say about the papers' claims: the variants (what each label is), the findings
(a headline and one verdict per claim, decided by stated rules on paired-bootstrap intervals), the effect
of every method relative to the fine-tuned control, and the method cards.

Claims (LCEG = Lu et al. 2024, arXiv:2409.12181; PoSE = Zhu et al., arXiv:2309.10400), each checked on the
perplexity at the *in-window length* (the pretrained window when evaluated, else the longest length inside
it) and at the *target length* (the study's target when evaluated, else the longest length), with the
paired comparisons of :meth:`ropekit.study.stats.Analysis.compare`:

(a) the base model's perplexity rises past its pretrained window — ratio ppl(longest length)/ppl(window),
    paired by document: *holds* when its 95 % interval lies above 1, *does not hold* when below 1;
(b) fine-tuned NTK-family methods and YaRN keep perplexity at the target length near their in-window value
    — per variant, ratio ppl(target)/ppl(window): *holds* when the interval's upper end is at most
    1 + :data:`NEAR` (within 10 %), *does not hold* when its lower end is above it; all variants must hold;
(c) retrieval (passkey, needle, RULER) beyond the window only with methods that support it — per task of
    :data:`RETRIEVAL_TASKS` evaluated, *holds* when the base model's mean accuracy beyond the window has a 95 %
    upper bound ≤ :data:`NEAR_ZERO` and at least one method is significantly above it (paired over prompts),
    *does not hold* when the base model's lower bound exceeds :data:`NEAR_ZERO` (it retrieves beyond its
    window); every task must hold;
(d) PoSE lands close to full-length fine-tuning of the same method — per pair ``pose-X`` / ``X-ft`` (same
    method), ratio ppl(PoSE)/ppl(full) at the target: *holds* when the interval lies within
    [1/(1 + NEAR), 1 + NEAR], *does not hold* when it lies entirely outside;
(e) perplexity correlates with downstream accuracy — Kendall τ across methods at the target length
    (pooled over the accuracy tasks when there are several): *holds* when τ's 95 % interval lies below 0
    (lower perplexity, higher accuracy), *does not hold* when above 0;
(f) fine-tuning improves on the frozen method — per pair (frozen X, fine-tuned X, same method): ratio
    ppl(fine-tuned)/ppl(frozen) at the target: *holds* when the interval lies below 1, *does not hold* when
    above 1.

Every other outcome is *inconclusive at this scale*; a claim whose variants or lengths the study lacks is
*not measured in this study*. For claims over several variants, one "does not hold" decides, else all must
hold, else inconclusive.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import stats
from .report_format import TASK_TITLES, fmt_ci, fmt_duration, fmt_value, length_label

#: Relative margin of "near" and "close" (perplexity ratios within 10 %).
NEAR = 0.10
#: "≈ 0" for retrieval accuracy: a 95 % upper bound at most 10 %.
NEAR_ZERO = 0.10
HOLDS, FAILS, INCONCLUSIVE, ABSENT = "holds", "does not hold", "inconclusive at this scale", "not measured in this study"
CONTROL = "base-ft"
BASE_LABELS = ("base", stats.PLAIN)

PAPERS = (
    {"key": "LCEG", "authors": "Yi Lu, Jing Nathan Yan, Songlin Yang, Justin T. Chiu, Siyu Ren, Fei Yuan, Wenting Zhao, "
                               "Zhiyong Wu, Alexander M. Rush",
     "title": "A Controlled Study on Long Context Extension and Generalization in LLMs", "venue": "2024",
     "arxiv": "2409.12181"},
    {"key": "PoSE", "authors": "Dawei Zhu, Nan Yang, Liang Wang, Yifan Song, Wenhao Wu, Furu Wei, Sujian Li",
     "title": "PoSE: Efficient Context Window Extension of LLMs via Positional Skip-wise Training", "venue": "ICLR 2024",
     "arxiv": "2309.10400"},
)

#: Method families: the report's small multiples draw one panel per family.
FAMILIES = (
    ("PI & LongLoRA", ("pi", "longlora")),
    ("NTK & base frequency", ("ntk", "dynamic_ntk", "ntk_by_parts", "abf", "entropy_abf", "harpe", "llama3")),
    ("YaRN & LongRoPE", ("yarn", "dynamic_yarn", "longrope")),
    ("Attention-side", ("self_extend", "lm_infinite", "dual_chunk", "landmark")),
    ("Other", ()),
)
#: Claim (c)'s tasks: retrieval beyond the window, each judged on its own.
RETRIEVAL_TASKS = ("passkey", "niah", "ruler")
#: Claim (b)'s methods: the NTK family and YaRN.
NTK_YARN = ("ntk", "dynamic_ntk", "ntk_by_parts", "abf", "entropy_abf", "harpe", "llama3", "yarn", "dynamic_yarn")


# ---- variants ---------------------------------------------------------------------------------------------
@dataclass
class VariantInfo:
    """What one label of the study is: method, parameters, kind, its recipe and costs."""

    label: str
    method: str | None  # None: the plain model (base or control)
    params: dict[str, Any] = field(default_factory=dict)
    kind: str = "frozen"  # base | control | frozen | fine-tuned | searched
    pose: bool = False
    note: str | None = None
    recipe: dict[str, Any] | None = None
    search: dict[str, Any] | None = None

    @property
    def trained(self) -> bool:
        return self.kind in ("fine-tuned", "control")

    @property
    def reference(self) -> bool:
        """The base model or the fine-tuned control: grey reference lines in every panel."""
        return self.kind in ("base", "control")

    @property
    def family(self) -> str:
        for name, members in FAMILIES:
            if self.method in members:
                return name
        return FAMILIES[-1][0]


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else copy.deepcopy(v)
    return out


def variants(manifest: Mapping[str, Any], pieces: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]],
             methods: Sequence[str]) -> dict[str, VariantInfo]:
    """Every label's :class:`VariantInfo`: from the manifest's config (``variants``, ``recipe``) where it has
    them, else from the pieces (a ``train:`` piece: fine-tuned, ``search:``: searched) and the records'
    own method names (``eval_method``); ``base``/``plain`` is the base model, ``base-ft`` the control."""
    config = manifest.get("config") if isinstance(manifest.get("config"), Mapping) else {}
    recipe = config.get("recipe") if isinstance(config.get("recipe"), Mapping) else {}
    declared = {v["label"]: v for v in config.get("variants") or [] if isinstance(v, Mapping) and v.get("label")}
    own_method: dict[str, str] = {}
    for r in records:
        own_method.setdefault(r.get("method"), r.get("eval_method") or r.get("method"))
    trained = {p["method"] for p in pieces if p["kind"] == "train" and p["method"]}
    searched = {p["method"] for p in pieces if p["kind"] == "search" and p["method"]}
    out: dict[str, VariantInfo] = {}
    for label in methods:
        v = declared.get(label)
        if v is not None:
            finetune = v.get("finetune")
            method = v.get("method")
            info = VariantInfo(label, method, dict(v.get("params") or {}), note=v.get("note"), search=v.get("search"))
            if finetune is not None:
                info.recipe = _deep_merge(recipe, finetune)
                info.pose = bool((info.recipe.get("data") or {}).get("pose"))
                info.kind = "control" if method is None else "fine-tuned"
            elif v.get("search") is not None:
                info.kind = "searched"
            elif method is None:
                info.kind = "base"
        else:
            method = own_method.get(label, label)
            method = None if method in (stats.PLAIN, None) else str(method)
            if method is not None and method.replace("-", "_") not in {m for _, ms in FAMILIES for m in ms}:
                stripped = str(label).removesuffix("-ft").removeprefix("pose-").replace("-", "_")
                method = stripped if any(stripped in ms for _, ms in FAMILIES) else method
            info = VariantInfo(label, method)
            if label in trained:
                info.kind = "control" if method is None else "fine-tuned"
                info.pose = str(label).startswith("pose-")
            elif label in searched:
                info.kind = "searched"
            elif method is None or label in BASE_LABELS:
                info.kind = "base"
        if label == CONTROL and info.kind in ("fine-tuned", "control"):
            info.kind = "control"
        out[label] = info
    return out


def kind_label(info: VariantInfo) -> str:
    if info.kind == "fine-tuned" and info.pose:
        return "fine-tuned (PoSE)"
    return {"control": "control (fine-tuned)"}.get(info.kind, info.kind)


def base_label(infos: Mapping[str, VariantInfo]) -> str | None:
    for label in BASE_LABELS:
        if label in infos and infos[label].kind == "base":
            return label
    return next((k for k, v in infos.items() if v.kind == "base"), None)


def control_label(infos: Mapping[str, VariantInfo]) -> str | None:
    if CONTROL in infos and infos[CONTROL].trained:
        return CONTROL
    return next((k for k, v in infos.items() if v.kind == "control"), None)


# ---- lengths ----------------------------------------------------------------------------------------------
def in_window_length(lengths: Sequence[int], window: int | None) -> int | None:
    inside = [L for L in lengths if window is not None and L <= window]
    return max(inside) if inside else None


def target_of(lengths: Sequence[int], target: int | None) -> int | None:
    return target if target in lengths else (max(lengths) if lengths else None)


# ---- wording ----------------------------------------------------------------------------------------------
def _ratio_text(c: Mapping[str, Any] | None) -> str:
    if c is None:
        return "–"
    sig = "significant" if c["significant"] else "not significant"
    return f"{c['estimate']:.3f} {fmt_ci(c['ci95'], 'ratio')} (n = {c['n']}, {sig})"


def _diff_text(c: Mapping[str, Any] | None) -> str:
    if c is None:
        return "–"
    sig = "significant" if c["significant"] else "not significant"
    return f"{100 * c['estimate']:+.1f} points {fmt_ci(c['ci95'], 'diff')} (n = {c['n']}, {sig})"


def _cell_text(table: stats.Table, method: str, task: str, length: int, metric: str, kind: str) -> str:
    row = table.row(method, task, length, metric)
    if row is None:
        return "–"
    return f"{fmt_value(row['value'], kind)} {fmt_ci(row.get('ci95'), kind)}".strip()


def _task_name(task: str) -> str:
    """A task's title inside a sentence: "passkey retrieval", "RULER" (an acronym keeps its capitals)."""
    title = TASK_TITLES.get(task, task)
    return title if title.split()[0].isupper() else title[0].lower() + title[1:]


def _combine(verdicts: Sequence[str]) -> str:
    if not verdicts:
        return ABSENT
    if FAILS in verdicts:
        return FAILS
    if all(v == HOLDS for v in verdicts):
        return HOLDS
    return INCONCLUSIVE


def _claim(key: str, claim: str, source: str, rule: str, verdict: str, evidence: list[str]) -> dict[str, Any]:
    return {"id": key, "claim": claim, "source": source, "rule": rule, "verdict": verdict, "evidence": evidence}


# ---- claims -----------------------------------------------------------------------------------------------
def evaluate_claims(table: stats.Table, infos: Mapping[str, VariantInfo], window: int | None, target: int | None,
                    kendall: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The verdict on each claim (module docstring): ``[{"id", "claim", "source", "rule", "verdict", "evidence"}]``."""
    a = table.analysis
    ppl_lengths = table.lengths("ppl")
    w_len = in_window_length(ppl_lengths, window)
    t_len = target_of(ppl_lengths, target)
    base = base_label(infos)
    claims = []
    near = f"{1 + NEAR:.2f}"

    # (a) base model's perplexity past its window — on identical targets when the study scored them (same_targets)
    pt = next((t for t in table.tasks() if stats.is_perplexity(t) and a is not None
               and any(r.get("task") == t and r.get("score_mode") == "same_targets" for r in a.records)), "ppl")
    a_lengths = table.lengths(pt)
    a_window, a_beyond = in_window_length(a_lengths, window), [L for L in a_lengths if window is not None and L > window]
    rule = (f"ratio ppl(L)/ppl(window) of the base model at the longest length ({pt}), paired over documents: holds when its "
            "95 % interval lies above 1, does not hold when below 1")
    evidence: list[str] = []
    verdict = ABSENT
    if a is not None and base and a_window is not None and a_beyond and table.get(base, pt, a_window, "ppl") is not None:
        comps = {L: a.compare(base, base, pt, L, "ppl", length_b=a_window) for L in a_beyond}
        evidence.append(f"{base} at {length_label(a_window)} (window): {_cell_text(table, base, pt, a_window, 'ppl', 'ppl')}")
        for L, c in comps.items():
            evidence.append(f"at {length_label(L)}: {_cell_text(table, base, pt, L, 'ppl', 'ppl')}; ratio to the window {_ratio_text(c)}")
        last = comps[max(comps)]
        if last is not None:
            verdict = HOLDS if last["direction"] > 0 else FAILS if last["direction"] < 0 else INCONCLUSIVE
        mode = next((r.get("score_mode") for r in a.records if r.get("task") == pt), None)
        if mode and mode != "same_targets":
            evidence.append(f"score mode {mode}: each length scores different tokens (the first L of each document), so a "
                            "change with length mixes content with context; score mode same_targets scores identical tokens at every length")
    claims.append(_claim("a", "The base model's perplexity rises past its pretrained window.", "LCEG §4 (Fig. 3, Table 3)",
                         rule, verdict, evidence))

    # (b) fine-tuned NTK family and YaRN keep perplexity near the in-window value — a comparison across lengths, so
    # on identical targets when the study scored them, as (a): first-L-token perplexity mixes content with context
    b_window, b_target = in_window_length(a_lengths, window), target_of(a_lengths, target)
    rule = (f"per variant, ratio ppl(target)/ppl(window) ({pt}) paired over documents: holds when the 95 % interval's upper end is ≤ {near}, "
            f"does not hold when its lower end is > {near}; every variant must hold")
    chosen = [k for k, v in infos.items() if v.kind == "fine-tuned" and not v.pose and v.method in NTK_YARN]
    evidence, verdicts = [], []
    if a is not None and chosen and b_window is not None and b_target is not None and b_target > (window or 0):
        for label in chosen:
            c = a.compare(label, label, pt, b_target, "ppl", length_b=b_window)
            if c is None:
                continue
            lo, hi = c["ci95"] or (None, None)
            verdicts.append(INCONCLUSIVE if lo is None else HOLDS if hi <= 1 + NEAR else FAILS if lo > 1 + NEAR else INCONCLUSIVE)
            evidence.append(f"{label}: {_cell_text(table, label, pt, b_window, 'ppl', 'ppl')} at {length_label(b_window)} → "
                            f"{_cell_text(table, label, pt, b_target, 'ppl', 'ppl')} at {length_label(b_target)}; ratio {_ratio_text(c)} → {verdicts[-1]}")
        if base:
            c = a.compare(base, base, pt, b_target, "ppl", length_b=b_window)
            if c is not None:
                evidence.append(f"for contrast, {base}: ratio {_ratio_text(c)}")
    claims.append(_claim("b", "Fine-tuned NTK-family methods and YaRN keep perplexity at the target length near their in-window value.",
                         "LCEG §4 (Table 3); PoSE §4", rule, _combine(verdicts), evidence))

    # (c) retrieval beyond the window only with methods that support it — on every retrieval task evaluated
    tasks = [t for t in RETRIEVAL_TASKS if t in table.tasks()]
    rule = (f"per retrieval task, holds when the base model's mean accuracy beyond the window has a 95 % upper bound ≤ "
            f"{100 * NEAR_ZERO:.0f} % and at least one method is significantly above it (paired over prompts); does not hold when "
            f"the base model's lower bound is > {100 * NEAR_ZERO:.0f} %; every task must hold")
    evidence, verdicts = [], []
    for rtask in tasks if a is not None and base and window is not None else []:
        out_lengths = [L for L in table.lengths(rtask) if L > window]
        base_values = [table.get(base, rtask, L, "accuracy") for L in out_lengths]
        if not out_lengths or any(v is None for v in base_values):
            continue
        name = TASK_TITLES.get(rtask, rtask)
        ci = a.mean_interval(base, rtask, out_lengths, "accuracy")
        mean = statistics.fmean(base_values)
        evidence.append(f"{name}: {base}, mean over {', '.join(length_label(L) for L in out_lengths)}: {100 * mean:.1f} % {fmt_ci(ci, 'pct')}")
        above = []
        for label in infos:
            if label == base or table.get(label, rtask, out_lengths[0], "accuracy") is None:
                continue
            c = a.compare(label, base, rtask, out_lengths, "accuracy")
            if c is not None and c["direction"] > 0:
                above.append((c["estimate"], label, c))
        above.sort(reverse=True)
        if above:
            evidence.append(f"{name}, significantly above the base model beyond the window: " + "; ".join(
                f"{label} {_diff_text(c)}" for _, label, c in above))
        else:
            evidence.append(f"{name}: no method is significantly above the base model beyond the window")
        if ci is not None:
            verdicts.append(HOLDS if ci[1] <= NEAR_ZERO and above else FAILS if ci[0] > NEAR_ZERO else INCONCLUSIVE)
    names = " and ".join(_task_name(t) for t in tasks) or "passkey or needle retrieval"
    task = tasks[0] if tasks else None  # the primary retrieval task, which (d) and (f) also report
    claims.append(_claim("c", f"Retrieval beyond the window ({names}) succeeds only "
                         "with methods that support it; the base model is near 0 there.", "LCEG §5 (Fig. 4, needle/passkey)", rule,
                         _combine(verdicts), evidence))

    # (d) PoSE vs full-length fine-tuning of the same method
    rule = (f"per pair, ratio ppl(PoSE)/ppl(full-length fine-tuning) at the target, paired over documents: holds when the 95 % interval "
            f"lies within [{1 / (1 + NEAR):.2f}, {near}], does not hold when it lies entirely outside")
    evidence, verdicts = [], []
    pairs = _pairs(infos, lambda v: v.kind == "fine-tuned" and v.pose, lambda v: v.kind == "fine-tuned" and not v.pose)
    if a is not None and t_len is not None:
        for pose, full in pairs:
            c = a.compare(pose, full, "ppl", t_len, "ppl")
            if c is None or c["ci95"] is None:
                continue
            lo, hi = c["ci95"]
            verdicts.append(HOLDS if lo >= 1 / (1 + NEAR) and hi <= 1 + NEAR else FAILS if lo > 1 + NEAR or hi < 1 / (1 + NEAR) else INCONCLUSIVE)
            line = (f"{pose} vs {full} at {length_label(t_len)}: {_cell_text(table, pose, 'ppl', t_len, 'ppl', 'ppl')} vs "
                    f"{_cell_text(table, full, 'ppl', t_len, 'ppl', 'ppl')}, ratio {_ratio_text(c)} → {verdicts[-1]}")
            if task and window is not None:
                out_lengths = [L for L in table.lengths(task) if L > window]
                d = a.compare(pose, full, task, out_lengths, "accuracy") if out_lengths else None
                if d is not None:
                    line += f"; {_task_name(task)} beyond the window {_diff_text(d)}"
            evidence.append(line)
    claims.append(_claim("d", "PoSE (training at the pretrained window with skipped positions) lands close to full-length fine-tuning "
                         "of the same method.", "PoSE §4 (Table 1, Fig. 3)", rule, _combine(verdicts), evidence))

    # (e) perplexity correlates with downstream accuracy
    rule = "Kendall τ across methods at the target length (pooled over tasks when several): holds when τ's 95 % interval lies below 0, does not hold when above 0"
    evidence, verdict = [], ABSENT
    rows = [k for k in kendall if k["mode"] == "target" and k.get("tau") is not None]
    decisive = next((k for k in rows if k["task"] == "pooled"), rows[0] if rows else None)
    for k in rows:
        name = "pooled over " + ", ".join(k.get("tasks", [])) if k["task"] == "pooled" else TASK_TITLES.get(k["task"], k["task"])
        evidence.append(f"{name} at {length_label(k['lengths'][-1]) if k['task'] != 'pooled' else 'the target'}: τ = {k['tau']:+.2f} "
                        f"{fmt_ci(k.get('ci95'), 'tau')} over {k['n']} methods, p = {k['p_value']:.3g}" if k["p_value"] is not None else
                        f"{name}: τ = {k['tau']:+.2f} {fmt_ci(k.get('ci95'), 'tau')} over {k['n']} methods")
    if decisive is not None:
        lo, hi = decisive.get("ci95") or (None, None)
        verdict = INCONCLUSIVE if lo is None else HOLDS if hi < 0 else FAILS if lo > 0 else INCONCLUSIVE
    claims.append(_claim("e", "Perplexity correlates with downstream accuracy across methods (lower perplexity, higher accuracy).",
                         "LCEG §6 (Table 6)", rule, verdict, evidence))

    # (f) frozen methods vs their fine-tuned versions
    rule = ("per pair (frozen X, fine-tuned X of the same method), ratio ppl(fine-tuned)/ppl(frozen) at the target, paired over documents: "
            "holds when the 95 % interval lies below 1, does not hold when above 1")
    evidence, verdicts = [], []
    pairs = _pairs(infos, lambda v: v.kind == "fine-tuned" and not v.pose, lambda v: v.kind == "frozen")
    if a is not None and t_len is not None:
        for tuned, frozen in pairs:
            c = a.compare(tuned, frozen, "ppl", t_len, "ppl")
            if c is None:
                continue
            verdicts.append(HOLDS if c["direction"] < 0 else FAILS if c["direction"] > 0 else INCONCLUSIVE)
            line = (f"{tuned} vs {frozen} at {length_label(t_len)}: {_cell_text(table, tuned, 'ppl', t_len, 'ppl', 'ppl')} vs "
                    f"{_cell_text(table, frozen, 'ppl', t_len, 'ppl', 'ppl')}, ratio {_ratio_text(c)} → {verdicts[-1]}")
            if task and window is not None:
                out_lengths = [L for L in table.lengths(task) if L > window]
                d = a.compare(tuned, frozen, task, out_lengths, "accuracy") if out_lengths else None
                if d is not None:
                    line += f"; {_task_name(task)} beyond the window {_diff_text(d)}"
            evidence.append(line)
    claims.append(_claim("f", "Fine-tuning a method with the recipe improves on the same method frozen (lower perplexity at the target).",
                         "LCEG §4 (Table 3: frozen NTK vs fine-tuned)", rule, _combine(verdicts), evidence))
    for c in claims:
        if c["verdict"] == ABSENT and not c["evidence"]:
            c["evidence"] = ["the study has no variants or lengths this claim needs"]
    return claims


def _pairs(infos: Mapping[str, VariantInfo], first, second) -> list[tuple[str, str]]:
    """Pairs (a, b) of variants of the same method: a matching ``first``, b matching ``second``; among
    several candidates for b the one with the same parameters, then the first."""
    out = []
    for a_label, a in infos.items():
        if not first(a) or a.method is None:
            continue
        cands = [b_label for b_label, b in infos.items() if b_label != a_label and second(b) and b.method == a.method]
        if cands:
            same = [c for c in cands if infos[c].params == a.params]
            out.append((a_label, (same or cands)[0]))
    return out


# ---- headline ---------------------------------------------------------------------------------------------
def headline(table: stats.Table, ranking: Mapping[str, Any], claims: Sequence[Mapping[str, Any]], window: int | None,
             target: int | None) -> str:
    """One paragraph: the best perplexity at the target with the methods tied with it, the ranking's leaders,
    and the count of claims by verdict."""
    a = table.analysis
    parts = []
    ppl_lengths = table.lengths("ppl")
    t_len = target_of(ppl_lengths, target)
    if t_len is not None and a is not None:
        values = [(table.get(m, "ppl", t_len, "ppl"), m) for m in table.methods("ppl")]
        values = [(v, m) for v, m in values if v is not None and math.isfinite(v)]
        if values:
            _, best = min(values)
            tied = [m for _, m in sorted(values) if m != best and not (a.compare(m, best, "ppl", t_len, "ppl") or {}).get("significant")]
            where = f"{length_label(t_len)} tokens" + (f" ({t_len / window:g}× the {window}-token window)" if window else "")
            text = f"At {where} the lowest perplexity is {best}'s {_cell_text(table, best, 'ppl', t_len, 'ppl', 'ppl')}"
            text += (f", statistically tied with {_join(tied)}" if tied else ", significantly below every other method")
            parts.append(text + " (paired bootstrap over documents).")
    rows = ranking.get("rows") or []
    if ranking.get("task") and rows and rows[0].get("primary") is not None:
        top = [r["method"] for r in rows if r["rank"] == 1]
        r0 = rows[0]
        task = _task_name(ranking["task"])
        span = ", ".join(length_label(L) for L in ranking["lengths"])
        lead = (f"Best {task} beyond the window ({span}): {r0['method']} with {100 * r0['primary']:.0f} % "
                f"{fmt_ci(r0.get('primary_ci95'), 'pct')}")
        others = [m for m in top if m != r0["method"]]
        lead += f", tied with {_join(others)}." if others else ", significantly ahead of every other method."
        parts.append(lead)
    counts = {v: sum(c["verdict"] == v for c in claims) for v in (HOLDS, FAILS, INCONCLUSIVE, ABSENT)}
    parts.append(f"Of the {len(claims)} claims checked below, {counts[HOLDS]} hold, {counts[FAILS]} do not hold, "
                 f"{counts[INCONCLUSIVE]} are inconclusive at this scale and {counts[ABSENT]} are not measured.")
    return " ".join(parts)


def _join(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


# ---- control ----------------------------------------------------------------------------------------------
def control_effects(table: stats.Table, infos: Mapping[str, VariantInfo], control: str) -> list[dict[str, Any]]:
    """Every method against the control at every length: perplexity ratio and accuracy difference with their
    paired-bootstrap intervals (:meth:`~ropekit.study.stats.Analysis.compare`)."""
    a = table.analysis
    out = []
    if a is None:
        return out
    for task, metric in [("ppl", "ppl")] + [(t, "accuracy") for t in table.accuracy_tasks()]:
        if control not in table.methods(task):
            continue
        for m in table.methods(task):
            if m == control:
                continue
            for L in table.lengths(task):
                c = a.compare(m, control, task, L, metric)
                if c is not None:
                    out.append({"method": m, "task": task, "length": L, "metric": metric, **c})
    return out


# ---- method cards -----------------------------------------------------------------------------------------
def method_cards(infos: Mapping[str, VariantInfo], pieces: Sequence[Mapping[str, Any]],
                 records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per variant: ``{"label", "method", "params", "kind", "family", "recipe": [(name, value)], "train_seconds",
    "search_seconds", "eval_seconds": {task: s}, "seeds", "note"}`` — the recipe from the manifest's config
    (steps, learning rate, sequence length, PoSE and LoRA settings), the costs from the pieces' seconds."""
    cards = []
    seeds: dict[str, set] = {}
    for r in records:
        if r.get("seed") is not None:
            seeds.setdefault(r.get("method"), set()).add(r["seed"])
    for label, info in infos.items():
        mine = [p for p in pieces if p["method"] == label]
        train = sum(p["seconds"] or 0 for p in mine if p["kind"] == "train")
        search = sum(p["seconds"] or 0 for p in mine if p["kind"] == "search")
        pretrain = sum(p["seconds"] or 0 for p in mine if p["kind"] == "pretrain")
        evals: dict[str, float] = {}
        for p in mine:
            if p["kind"] == "eval":
                evals[p["task"] or "eval"] = evals.get(p["task"] or "eval", 0.0) + (p["seconds"] or 0)
        recipe = []
        if info.recipe is not None:
            data, train_cfg = info.recipe.get("data") or {}, info.recipe.get("train") or {}
            for name, value in (("steps", train_cfg.get("max_steps")), ("learning rate", train_cfg.get("lr")),
                                ("sequence length", data.get("seq_len")), ("micro-batch", train_cfg.get("micro_batch_size")),
                                ("warm-up steps", train_cfg.get("warmup_steps")), ("schedule", train_cfg.get("schedule"))):
                if value is not None:
                    recipe.append((name, str(value)))
            pose = data.get("pose")
            if pose:
                recipe.append(("PoSE", ", ".join(f"{k} {v}" for k, v in sorted(pose.items())) if isinstance(pose, Mapping) else str(pose)))
            lora = train_cfg.get("lora")
            if lora:
                recipe.append(("LoRA", ", ".join(f"{k} {v}" for k, v in sorted(lora.items()) if k in ("r", "alpha", "target_modules", "trainable"))
                               if isinstance(lora, Mapping) else str(lora)))
        if info.search:
            recipe.append(("search", ", ".join(f"{k} {v}" for k, v in sorted(info.search.items())) or "defaults"))
        cost = []
        if pretrain:
            cost.append(("pre-training", fmt_duration(pretrain)))
        if train:
            cost.append(("training", fmt_duration(train)))
        if search:
            cost.append(("factor search", fmt_duration(search)))
        for t, s in evals.items():
            cost.append((f"eval {t}", fmt_duration(s)))
        cards.append({"label": label, "method": info.method or stats.PLAIN, "params": info.params, "kind": kind_label(info),
                      "family": info.family if not info.reference else "reference", "recipe": recipe, "cost": cost,
                      "train_seconds": train or None, "search_seconds": search or None, "pretrain_seconds": pretrain or None,
                      "eval_seconds": evals, "seeds": sorted(seeds.get(label, []), key=str), "note": info.note})
    return cards


def paper_line(p: Mapping[str, Any]) -> str:
    return f"{p['key']} — {p['authors']}, “{p['title']}”, {p['venue']}, arXiv:{p['arxiv']}"
