"""What the study's data say about its claims: the variants (what each label is), the findings (a headline
and one verdict per claim, decided by stated rules on paired-bootstrap intervals), the effect of every method
relative to the fine-tuned control, and the method cards.

The claims are data: a study's ``claims:`` block (:class:`ropekit.study.config._Claim`; the quick and standard
presets carry LCEG's and PoSE's claims (a)–(f)) names the base model, the control, families of variants and, per
claim, what is compared, the rule and its bound. One engine, :func:`evaluate_claims`, judges every claim by its
``compare:`` kind on the paired comparisons of :meth:`ropekit.study.stats.Analysis.compare`, at the *in-window
length* (the pretrained window when evaluated, else the longest length inside it) and the *target length* (the
study's target when evaluated, else the longest length):

* ``length_ratio`` — a variant's perplexity at the target (or at every length past the window) over its in-window
  value, paired by document, on the same-targets perplexity entry when the study scored one;
* ``retrieval_beyond_window`` — per retrieval task evaluated, the base model's mean accuracy beyond the window
  near 0 (95 % upper bound at most ``near_zero``) and, with ``beaten``, some variant significantly above it;
* ``pair_ratio`` / ``pair_difference`` — declared pairs of variants: perplexity ratio at the target, or accuracy
  difference on a task at the target;
* ``correlation`` — Kendall τ across variants between perplexity and accuracy at the target.

A verdict is *holds*, *does not hold*, *inconclusive at this scale* (the interval straddles the bound), or *not
measured in this study* (the study lacks the variants or lengths). For claims over several variants, pairs or tasks,
one "does not hold" decides, else all must hold, else inconclusive; a variant, pair or task the claim names that the
study did not measure (a piece failed or still running) is a part *not measured*, so the claim never holds on part of
what it names. A study recorded without claims is judged by the
quick preset's (:func:`study_claims`).
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..methods import list_methods
from . import stats
from .config import ROLES
from .report_format import TASK_TITLES, fmt_ci, fmt_duration, fmt_value, length_label

HOLDS, FAILS, INCONCLUSIVE, ABSENT = "holds", "does not hold", "inconclusive at this scale", "not measured in this study"
#: Whose claims judge a study that records none: the LCEG/PoSE claims (a)–(f).
DEFAULT_CLAIMS_PRESET = "quick"

PAPERS = (
    {"key": "LCEG", "authors": "Yi Lu, Jing Nathan Yan, Songlin Yang, Justin T. Chiu, Siyu Ren, Fei Yuan, Wenting Zhao, "
                               "Zhiyong Wu, Alexander M. Rush",
     "title": "A Controlled Study on Long Context Extension and Generalization in LLMs", "venue": "2024",
     "arxiv": "2409.12181"},
    {"key": "PoSE", "authors": "Dawei Zhu, Nan Yang, Liang Wang, Yifan Song, Wenhao Wu, Furu Wei, Sujian Li",
     "title": "PoSE: Efficient Context Window Extension of LLMs via Positional Skip-wise Training", "venue": "ICLR 2024",
     "arxiv": "2309.10400"},
)

#: Method families in the order the report's small multiples draw them (one panel per family); each method names
#: its own (:attr:`ropekit.methods.base.Method.family`), and a family not listed here is drawn under the last.
FAMILY_ORDER = ("PI & LongLoRA", "NTK & base frequency", "YaRN & LongRoPE", "Attention-side", "Other")
#: ``(family, method names)`` in :data:`FAMILY_ORDER`.
FAMILIES = tuple((family, tuple(m.name for m in list_methods() if m.family == family)) for family in FAMILY_ORDER)

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
             methods: Sequence[str], claims: Mapping[str, Any] | None = None) -> dict[str, VariantInfo]:
    """Every label's :class:`VariantInfo`: from the manifest's config (``variants``, ``recipe``) where it has
    them, else from the pieces (a ``train:`` piece: trained, ``search:``: searched) and the records' own method
    names (``eval_method``, else the label). A variant without a method is the base model, or the control when it
    was trained; ``claims``' ``control`` names the control among trained variants. Nothing is read from a label."""
    control = (claims or {}).get("control")
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
        else:  # no config (a store written by hand): what the pieces and records say, PoSE unknown
            method = own_method.get(label, label)
            method = None if method in (stats.PLAIN, None) else str(method)
            info = VariantInfo(label, method)
            if label in trained:
                info.kind = "control" if method is None else "fine-tuned"
            elif label in searched:
                info.kind = "searched"
            elif method is None:
                info.kind = "base"
        if label == control and info.kind in ("fine-tuned", "control"):
            info.kind = "control"
        out[label] = info
    return out


def kind_label(info: VariantInfo) -> str:
    if info.kind == "fine-tuned" and info.pose:
        return "fine-tuned (PoSE)"
    return {"control": "control (fine-tuned)"}.get(info.kind, info.kind)


def base_label(infos: Mapping[str, VariantInfo], declared: str | None = None) -> str | None:
    """The base model: the ``declared`` label (the claims' ``base``) when the study has it as the plain model,
    else the first variant that is the plain model untrained."""
    if declared in infos and infos[declared].kind == "base":
        return declared
    return next((k for k, v in infos.items() if v.kind == "base"), None)


def control_label(infos: Mapping[str, VariantInfo], declared: str | None = None) -> str | None:
    """The control: the ``declared`` label (the claims' ``control``) when the study trained it, else the first
    variant that is the plain model fine-tuned."""
    if declared in infos and infos[declared].trained:
        return declared
    return next((k for k, v in infos.items() if v.kind == "control"), None)


# ---- unfinished pieces -----------------------------------------------------------------------------------
#: How a cell of a piece that is not done reads, by the piece's status.
PARTIAL_WORDS = {"pending": "unfinished", "running": "running", "failed": "failed"}


def _planned_per_piece(config: Mapping[str, Any], task: str) -> int | None:
    """Samples one piece of ``task`` computes per length by the study's config (``evals``), where its options
    say so: perplexity ``samples`` (documents), passkey and needle ``depths`` × ``trials``, RULER ``samples`` ×
    ``tasks``; None otherwise (the count then comes from the pieces that finished)."""
    entry = (config.get("evals") or {}).get(task) if isinstance(config.get("evals"), Mapping) else None
    if not isinstance(entry, Mapping):
        return None
    kind = entry.get("task") or task

    def count(key):
        v = entry.get(key)
        return len(v) if isinstance(v, (list, tuple)) else None

    def number(key):
        v = entry.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    if stats.is_perplexity(kind) or stats.is_perplexity(task):
        return number("samples")
    if kind in ("passkey", "niah") and count("depths") and number("trials"):
        return count("depths") * number("trials")
    if kind == "ruler" and count("tasks") and number("samples"):
        return count("tasks") * number("samples")
    return None


def partial_cells(pieces: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]],
                  manifest: Mapping[str, Any]) -> dict[tuple, dict[str, Any]]:
    """The cells ``(method, task, length)`` computed from an evaluation piece that is not done (pending, running
    or failed) and short of its planned samples: ``{"done", "planned", "status", "pieces"}``.

    A piece is complete when its status is ``done`` — the runner's rule: an evaluation resumed after a crash
    skips the samples it stored and finishes the rest. A cell's pieces are the ``eval`` pieces of its label and
    task (one per training seed; a piece without a label, such as one speed piece for every method, counts for
    all of them). ``planned`` is per piece and length the most samples a finished piece of the same task stored
    at that length, else what the study's config plans (:func:`_planned_per_piece`), times the cell's pieces;
    None when neither says. A cell of an unfinished piece that already has every planned sample is complete and
    not listed; one whose plan is unknown is. ``done`` counts the cell's stored samples, ``status`` is the worst
    of its unfinished pieces (failed, running, pending)."""
    config = manifest.get("config") if isinstance(manifest.get("config"), Mapping) else {}
    evals = [p for p in pieces if p.get("kind") == "eval" and p.get("task")]
    if all(p.get("status") == "done" for p in evals):
        return {}
    counts: dict[tuple, int] = {}  # (method, task, length, seed) → samples stored
    for r in records:
        key = (r.get("method"), r.get("task"), r.get("length"), r.get("seed"))
        counts[key] = counts.get(key, 0) + 1

    def seed_of(p):
        return (p.get("params") or {}).get("seed") if isinstance(p.get("params"), Mapping) else None

    def stored(p, task, length, method):
        seed = seed_of(p)
        return sum(n for (m, t, L, s), n in counts.items()
                   if m == method and t == task and L == length and (seed is None or s == seed))

    cells = {(r.get("method"), r.get("task"), r.get("length")) for r in records}
    finished: dict[tuple, int] = {}  # (task, length) → most samples a finished piece stored there

    def planned_at(task, length):
        if (task, length) not in finished:
            best = 0
            for p in evals:
                if p["task"] == task and p.get("status") == "done":
                    methods = [p["method"]] if p.get("method") else sorted({m for m, t, _ in cells if t == task}, key=str)
                    best = max([best] + [stored(p, task, length, m) for m in methods])
            finished[(task, length)] = best or _planned_per_piece(config, task) or 0
        return finished[(task, length)] or None

    rank = {"failed": 0, "running": 1, "pending": 2}
    out: dict[tuple, dict[str, Any]] = {}
    for method, task, length in sorted(cells, key=lambda c: tuple(map(str, c))):
        mine = [p for p in evals if p["task"] == task and p.get("method") in (method, None)]
        open_ = [p for p in mine if p.get("status") != "done"]
        if not open_:
            continue
        per_piece = planned_at(task, length)
        short = [p for p in open_ if per_piece is None or stored(p, task, length, method) < per_piece]
        if not short:
            continue
        status = min((p.get("status") for p in short), key=lambda s: rank.get(s, 3))
        done = sum(n for (m, t, L, _), n in counts.items() if (m, t, L) == (method, task, length))
        out[(method, task, length)] = {"done": done, "planned": None if per_piece is None else per_piece * len(mine),
                                       "status": status, "pieces": [p["id"] for p in short]}
    return out


def partial_text(info: Mapping[str, Any] | None, unit: str = "") -> str:
    """``3 of 8, unfinished`` (``3 of 8 documents, failed`` with ``unit``; ``3 so far`` when the plan is unknown),
    or ``""`` for a complete cell."""
    if not info:
        return ""
    word = PARTIAL_WORDS.get(info.get("status"), str(info.get("status")))
    count = f"{info['done']} of {info['planned']}" if info.get("planned") else f"{info['done']} so far"
    return f"{count}{' ' + unit if unit else ''}, {word}"


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
    """One verdict of several parts: a part that fails fails the claim; it holds only when every part holds (a
    part not measured leaves it inconclusive — the evidence names that part)."""
    if not verdicts or all(v == ABSENT for v in verdicts):
        return ABSENT
    if FAILS in verdicts:
        return FAILS
    if all(v == HOLDS for v in verdicts):
        return HOLDS
    return INCONCLUSIVE


def _claim(key: str, claim: str, source: str, rule: str, verdict: str, evidence: list[str]) -> dict[str, Any]:
    return {"id": key, "claim": claim, "source": source, "rule": rule, "verdict": verdict, "evidence": evidence}


# ---- claims -----------------------------------------------------------------------------------------------
def study_claims(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The claims a study is judged by: those its manifest records (the config's ``claims:``), else — a study
    recorded before claims were data, or one that states none — the quick preset's, the LCEG/PoSE claims
    (a)–(f) every study was judged by until then."""
    from .config import parse_claims, preset_claims

    recorded = manifest.get("claims")
    if recorded is not None:
        return parse_claims(recorded, "the study's recorded claims")
    return preset_claims(DEFAULT_CLAIMS_PRESET) or {"items": []}


def _role(claims: Mapping[str, Any], infos: Mapping[str, VariantInfo], role: str) -> str | None:
    return base_label(infos, claims.get("base")) if role == "base" else control_label(infos, claims.get("control"))


def _members(claims: Mapping[str, Any], infos: Mapping[str, VariantInfo], names: str | Sequence[str]) -> list[str]:
    """The labels a claim's ``variants:`` names (a role, a family or labels), in the study's variant order."""
    if isinstance(names, str) and names in ROLES:
        label = _role(claims, infos, names)
        return [label] if label else []
    wanted = set((claims.get("families") or {}).get(names, [names]) if isinstance(names, str) else names)
    return [label for label in infos if label in wanted]


def _pair_labels(claims: Mapping[str, Any], infos: Mapping[str, VariantInfo], pairs) -> list[tuple[str, str]]:
    """The declared pairs whose two variants the study has (a role resolved to its label), in declared order."""
    out = []
    for first, second in pairs:
        a, b = (_role(claims, infos, x) if x in ROLES else x for x in (first, second))
        if a in infos and b in infos:
            out.append((a, b))
    return out


def _decide(c: Mapping[str, Any], expect: str | None = None, at_most: float | None = None,
            within: float | None = None) -> str:
    """A verdict from one paired comparison: ``expect`` above/below the null (significance, as the tables mark
    it), ``at_most`` a ratio bound (upper end ≤ bound holds, lower end > bound does not), or ``within`` a ratio
    band [1/(1+M), 1+M] (inside holds, entirely outside does not). A bound is judged on at least
    :data:`~ropekit.study.stats.MIN_PAIRED` shared samples, as significance is: an interval over fewer is inconclusive."""
    if expect is not None:
        sign = 1 if expect == "above" else -1
        return HOLDS if c["direction"] == sign else FAILS if c["direction"] == -sign else INCONCLUSIVE
    lo, hi = c["ci95"] or (None, None)
    if lo is None or c.get("n", 0) < stats.MIN_PAIRED:
        return INCONCLUSIVE
    if at_most is not None:
        return HOLDS if hi <= at_most else FAILS if lo > at_most else INCONCLUSIVE
    low, high = 1 / (1 + within), 1 + within
    return HOLDS if lo >= low and hi <= high else FAILS if lo > high or hi < low else INCONCLUSIVE


def _length_task(table: stats.Table) -> str:
    """The perplexity task length comparisons use: one scored on identical targets at every length when the study
    has it (first-L-token perplexity mixes content with context), else ``ppl``."""
    a = table.analysis
    return next((t for t in table.tasks() if stats.is_perplexity(t) and a is not None
                 and any(r.get("task") == t and r.get("score_mode") == "same_targets" for r in a.records)), "ppl")


def _who(names: str | Sequence[str], claims: Mapping[str, Any]) -> str:
    if names == "base":
        return "the base model"
    if names == "control":
        return "the control"
    return "per variant," if not isinstance(names, str) or names in (claims.get("families") or {}) else str(names)


def _of_whom(names: str | Sequence[str], claims: Mapping[str, Any]) -> str:
    """Whose ratio a rule names, after "of": "the base model", "the control", "each variant", or the one label."""
    who = _who(names, claims)
    return "each variant" if who == "per variant," else who


def _bound_test(item: Mapping[str, Any]) -> str:
    """When a ratio claim holds and when it does not: below/above 1 (``expect``), or under a bound (``at_most``: the
    upper end at most the bound holds, the lower end above it does not, as :func:`_decide` judges it)."""
    if item.get("at_most") is not None:
        near = f"{item['at_most']:.2f}"
        return f"holds when the 95 % interval's upper end is ≤ {near}, does not hold when its lower end is > {near}"
    side = item.get("expect") or "above"
    return f"holds when the 95 % interval lies {side} 1, does not hold when {'below' if side == 'above' else 'above'} 1"


def _length_ratio(item, claims, table, infos, window, target):
    """Every variant the claim names is a part of its verdict: one the study did not measure at the lengths the
    ratio needs is a part *not measured* (so the claim cannot hold on the others alone), as in :func:`_pair_ratio`."""
    a = table.analysis
    pt = _length_task(table)
    lengths = table.lengths(pt)
    w_len = in_window_length(lengths, window)
    labels = _members(claims, infos, item["variants"])
    evidence, verdicts = [], []
    if item["to"] == "beyond":
        rule = (f"ratio ppl(L)/ppl(window) of {_of_whom(item['variants'], claims)} at the longest length ({pt}), "
                f"paired over documents: {_bound_test(item)}" + ("; every variant must hold" if len(labels) > 1 else ""))
        beyond = [L for L in lengths if window is not None and L > window]
        for label in labels if a is not None and w_len is not None and beyond else []:
            if table.get(label, pt, w_len, "ppl") is None:
                verdicts.append(ABSENT)
                evidence.append(f"{label}: not measured at {length_label(w_len)} (the window) → {ABSENT}")
                continue
            comps = {L: a.compare(label, label, pt, L, "ppl", length_b=w_len) for L in beyond}
            evidence.append(f"{label} at {length_label(w_len)} (window): {_cell_text(table, label, pt, w_len, 'ppl', 'ppl')}")
            for L, c in comps.items():
                evidence.append(f"at {length_label(L)}: {_cell_text(table, label, pt, L, 'ppl', 'ppl')}; ratio to the window {_ratio_text(c)}")
            last = comps[max(comps)]
            if last is not None:
                verdicts.append(_decide(last, item.get("expect"), item.get("at_most")))
            else:
                verdicts.append(ABSENT)
                evidence.append(f"{label}: not measured at {length_label(max(comps))}, the longest length → {ABSENT}")
            mode = next((r.get("score_mode") for r in a.records if r.get("task") == pt), None)
            if mode and mode != "same_targets":
                evidence.append(f"score mode {mode}: each length scores different tokens (the first L of each document), so a "
                                "change with length mixes content with context; score mode same_targets scores identical tokens at every length")
        return rule, (verdicts[0] if len(verdicts) == 1 else _combine(verdicts)), evidence
    t_len = target_of(lengths, target)
    rule = (f"{_who(item['variants'], claims)} ratio ppl(target)/ppl(window) ({pt}) paired over documents: "
            f"{_bound_test(item)}; every variant must hold")
    if a is not None and labels and w_len is not None and t_len is not None and t_len > (window or 0):
        for label in labels:
            c = a.compare(label, label, pt, t_len, "ppl", length_b=w_len)
            if c is None:
                verdicts.append(ABSENT)
                missing = [length_label(L) for L in (w_len, t_len) if table.get(label, pt, L, "ppl") is None]
                evidence.append(f"{label}: not measured at {' and '.join(missing) or length_label(t_len)} → {ABSENT}")
                continue
            verdicts.append(_decide(c, item.get("expect"), item.get("at_most")))
            evidence.append(f"{label}: {_cell_text(table, label, pt, w_len, 'ppl', 'ppl')} at {length_label(w_len)} → "
                            f"{_cell_text(table, label, pt, t_len, 'ppl', 'ppl')} at {length_label(t_len)}; ratio {_ratio_text(c)} → {verdicts[-1]}")
        contrast = item.get("contrast")
        other = _role(claims, infos, contrast) if contrast in ROLES else contrast if contrast in infos else None
        if other:
            c = a.compare(other, other, pt, t_len, "ppl", length_b=w_len)
            if c is not None:
                evidence.append(f"for contrast, {other}: ratio {_ratio_text(c)}")
    return rule, _combine(verdicts), evidence


def _retrieval_beyond_window(item, claims, table, infos, window, target):
    a = table.analysis
    base = _role(claims, infos, "base")
    near_zero = item["near_zero"]
    tasks = [t for t in item["tasks"] if t in table.tasks()]
    rule = (f"per retrieval task, holds when the base model's mean accuracy beyond the window has a 95 % upper bound ≤ "
            f"{100 * near_zero:.0f} %" + (" and at least one method is significantly above it (paired over prompts)"
                                           if item.get("beaten") else "") +
            f"; does not hold when the base model's lower bound is > {100 * near_zero:.0f} %; every task must hold")
    evidence, verdicts = [], []
    for rtask in tasks if a is not None and base and window is not None else []:
        out_lengths = [L for L in table.lengths(rtask) if L > window]
        base_values = [table.get(base, rtask, L, "accuracy") for L in out_lengths]
        name = TASK_TITLES.get(rtask, rtask)
        if not out_lengths or any(v is None for v in base_values):
            # the claim names this task, so it is a part of the verdict: not measured, never left out
            missing = [length_label(L) for L, v in zip(out_lengths, base_values) if v is None]
            verdicts.append(ABSENT)
            evidence.append(f"{name}: " + (f"{base} not measured at {', '.join(missing)} beyond the window" if out_lengths
                                           else "not evaluated beyond the window") + f" → {ABSENT}")
            continue
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
            found = bool(above) or not item.get("beaten")
            verdicts.append(HOLDS if ci[1] <= near_zero and found else FAILS if ci[0] > near_zero else INCONCLUSIVE)
        else:  # measured, but no interval (one prompt): nothing can be said either way
            verdicts.append(INCONCLUSIVE)
    names = " and ".join(_task_name(t) for t in tasks) or "passkey or needle retrieval"
    return rule, _combine(verdicts), evidence, item["claim"].replace("{tasks}", names)


def _pair_ratio(item, claims, table, infos, window, target):
    a = table.analysis
    task = item.get("task") or "ppl"
    t_len = target_of(table.lengths(task), target)
    quantity = (item.get("quantity") or "per pair [a, b], ratio ppl(a)/ppl(b)") + (f" ({task})" if item.get("task") else "")
    if item.get("within") is not None:
        m = item["within"]
        rule = (f"{quantity} at the target, paired over documents: holds when the 95 % interval "
                f"lies within [{1 / (1 + m):.2f}, {1 + m:.2f}], does not hold when it lies entirely outside")
    else:
        side, other = item["expect"], "below" if item["expect"] == "above" else "above"
        rule = (f"{quantity} at the target, paired over documents: holds when the 95 % interval lies "
                f"{side} 1, does not hold when {other} 1")
    retrieval = next((t for t in item.get("with_retrieval") or [] if t in table.tasks()), None)
    evidence, verdicts = [], []
    if a is not None and t_len is not None:
        for first, second in _pair_labels(claims, infos, item["pairs"]):
            c = a.compare(first, second, task, t_len, "ppl")
            if c is None or (item.get("within") is not None and c["ci95"] is None):
                verdicts.append(ABSENT)
                evidence.append(f"{first} vs {second} at {length_label(t_len)}: not measured")
                continue
            verdicts.append(_decide(c, item.get("expect"), within=item.get("within")))
            line = (f"{first} vs {second} at {length_label(t_len)}: {_cell_text(table, first, task, t_len, 'ppl', 'ppl')} vs "
                    f"{_cell_text(table, second, task, t_len, 'ppl', 'ppl')}, ratio {_ratio_text(c)} → {verdicts[-1]}")
            if retrieval and window is not None:
                out_lengths = [L for L in table.lengths(retrieval) if L > window]
                d = a.compare(first, second, retrieval, out_lengths, "accuracy") if out_lengths else None
                if d is not None:
                    line += f"; {_task_name(retrieval)} beyond the window {_diff_text(d)}"
            evidence.append(line)
    return rule, _combine(verdicts), evidence


def _pair_difference(item, claims, table, infos, window, target):
    a = table.analysis
    task = item["task"]
    t_len = target_of(table.lengths(task), target)
    side, other = item["expect"], "below" if item["expect"] == "above" else "above"
    quantity = item.get("quantity") or f"per pair [a, b], accuracy difference a − b on {_task_name(task)}"
    rule = (f"{quantity} at the target, paired over prompts: holds when the 95 % interval lies {side} 0, does not "
            f"hold when {other} 0; every pair must hold")
    evidence, verdicts = [], []
    if a is not None and t_len is not None:
        for first, second in _pair_labels(claims, infos, item["pairs"]):
            c = a.compare(first, second, task, t_len, "accuracy")
            if c is None:
                verdicts.append(ABSENT)
                evidence.append(f"{first} vs {second} at {length_label(t_len)}: not measured")
                continue
            verdicts.append(_decide(c, item["expect"]))
            evidence.append(f"{first} vs {second} at {length_label(t_len)}: {_cell_text(table, first, task, t_len, 'accuracy', 'pct')} "
                            f"vs {_cell_text(table, second, task, t_len, 'accuracy', 'pct')}, difference {_diff_text(c)} → {verdicts[-1]}")
    return rule, _combine(verdicts), evidence


def _correlation(item, claims, kendall):
    side, other = item["expect"], "below" if item["expect"] == "above" else "above"
    rule = (f"Kendall τ across methods at the target length (pooled over tasks when several): holds when τ's 95 % interval "
            f"lies {side} 0, does not hold when {other} 0")
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
        if lo is None:
            verdict = INCONCLUSIVE
        else:
            hold, fail = (hi < 0, lo > 0) if side == "below" else (lo > 0, hi < 0)
            verdict = HOLDS if hold else FAILS if fail else INCONCLUSIVE
    return rule, verdict, evidence


def evaluate_claims(table: stats.Table, infos: Mapping[str, VariantInfo], window: int | None, target: int | None,
                    kendall: Sequence[Mapping[str, Any]], claims: Mapping[str, Any] | None = None,
                    held: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The verdict on each of ``claims`` (a validated ``claims:`` block; default: :func:`study_claims` of no
    manifest, the LCEG/PoSE set), in declared order: ``[{"id", "claim", "source", "rule", "verdict", "evidence"}]``.
    ``held``: variants kept out of the claims (label → why), named as the reason where a claim they take part in
    has nothing left to judge."""
    claims = study_claims({}) if claims is None else claims
    out = []
    for item in claims.get("items") or []:
        text = item["claim"]
        kind = item["compare"]
        if kind == "length_ratio":
            rule, verdict, evidence = _length_ratio(item, claims, table, infos, window, target)
        elif kind == "retrieval_beyond_window":
            rule, verdict, evidence, text = _retrieval_beyond_window(item, claims, table, infos, window, target)
        elif kind == "pair_ratio":
            rule, verdict, evidence = _pair_ratio(item, claims, table, infos, window, target)
        elif kind == "pair_difference":
            rule, verdict, evidence = _pair_difference(item, claims, table, infos, window, target)
        else:
            rule, verdict, evidence = _correlation(item, claims, kendall)
        out.append(_claim(item["id"], text, item["source"], rule, verdict, evidence))
    for item, c in zip(claims.get("items") or [], out):
        if c["verdict"] == ABSENT and not c["evidence"]:
            named = {x for pair in item.get("pairs") or [] for x in pair}
            named |= set(item["variants"]) if isinstance(item.get("variants"), list) else {item.get("variants")}
            reasons = [f"{m} is kept out of the claims: {why}" for m, why in (held or {}).items() if m in named]
            c["evidence"] = reasons or ["the study has no variants or lengths this claim needs"]
    return out


# ---- headline ---------------------------------------------------------------------------------------------
def headline(table: stats.Table, ranking: Mapping[str, Any], claims: Sequence[Mapping[str, Any]], window: int | None,
             target: int | None) -> str:
    """One paragraph: the best perplexity at the target with the methods tied with it, the ranking's first method on
    its accuracy task with the methods it is statistically tied with there, and the count of claims by verdict.

    "Significantly ahead of every other method" is said only when the paired accuracy difference of the first
    method against each other ranked method, one by one (:meth:`~ropekit.study.stats.Analysis.compare`), excludes 0
    in its favour: a rank of 2 or more says only that *some* method beats that one (:func:`~ropekit.study.stats.
    rank_methods`), and a method may rank below on perplexity alone. Every other ranked method it is not
    significantly ahead of is named as tied with it."""
    a = table.analysis
    parts = []
    ppl = table.perplexity_task()
    ppl_lengths = table.lengths(ppl) if ppl else []
    t_len = target_of(ppl_lengths, target)
    if t_len is not None and a is not None:
        values = [(table.get(m, ppl, t_len, "ppl"), m) for m in table.methods(ppl)]
        values = [(v, m) for v, m in values if v is not None and math.isfinite(v)]
        if values:
            _, best = min(values)
            tied = [m for _, m in sorted(values) if m != best and not (a.compare(m, best, ppl, t_len, "ppl") or {}).get("significant")]
            where = f"{length_label(t_len)} tokens" + (f" ({t_len / window:g}× the {window}-token window)" if window else "")
            name = "perplexity" if ppl == "ppl" else f"{ppl} perplexity"
            text = f"At {where} the lowest {name} is {best}'s {_cell_text(table, best, ppl, t_len, 'ppl', 'ppl')}"
            text += (f", statistically tied with {_join(tied)}" if tied else ", significantly below every other method")
            parts.append(text + " (paired bootstrap over documents).")
    rows = ranking.get("rows") or []
    if ranking.get("task") and rows and rows[0].get("primary") is not None:
        r0 = rows[0]
        task = _task_name(ranking["task"])
        span = ", ".join(length_label(L) for L in ranking["lengths"])
        # first by the ranking, which may be perplexity's doing: "best" only where no ranked method scores higher
        higher = any(r.get("rank") is not None and (r.get("primary") or 0.0) > r0["primary"] for r in rows[1:])
        lead = ((f"Ranked first on {task} beyond the window ({span}), then perplexity: " if higher else
                 f"Best {task} beyond the window ({span}): ") + f"{r0['method']} with {100 * r0['primary']:.0f} % "
                f"{fmt_ci(r0.get('primary_ci95'), 'pct')}")
        # a rank is not a pairwise verdict (stats.rank_methods): ahead of another method only where the paired
        # accuracy difference over these lengths says so, one method at a time
        ranked = [r for r in rows[1:] if r.get("rank") is not None]
        measured = [r["method"] for r in ranked if r.get("primary") is not None]
        tied = []
        for m in measured if a is not None else []:
            c = a.compare(r0["method"], m, ranking["task"], list(ranking["lengths"]), "accuracy")
            if c is None or c["direction"] <= 0:
                tied.append(m)
        if a is None:  # no resamples behind the table: nothing is significant, equal values share the first place
            others = [r["method"] for r in ranked if r["rank"] == 1]
            lead += f", tied with {_join(others)}." if others else "."
        elif tied:
            lead += f", statistically tied with {_join(tied)} (paired bootstrap over prompts)."
        elif len(measured) < len(ranked):
            lead += ", significantly ahead of every other method measured over these lengths (paired bootstrap over prompts)."
        elif measured:
            lead += ", significantly ahead of every other method (paired bootstrap over prompts)."
        else:
            lead += "."
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
    perplexities = [t for t in table.tasks() if stats.is_perplexity(t)]  # ppl, and ppl-same-targets …
    for task, metric in [(t, "ppl") for t in perplexities] + [(t, "accuracy") for t in table.accuracy_tasks()]:
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
        unfinished: set[str] = set()  # a piece not (yet) done has no cost to show: "0s" read as free
        for p in mine:
            if p["kind"] == "eval":
                task = p["task"] or "eval"
                evals[task] = evals.get(task, 0.0) + (p["seconds"] or 0)
                if p.get("status") != "done":
                    unfinished.add(task)
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
            cost.append((f"eval {t}", (f"{fmt_duration(s)}, not finished" if s else "not finished") if t in unfinished
                         else fmt_duration(s)))
        cards.append({"label": label, "method": info.method or stats.PLAIN, "params": info.params, "kind": kind_label(info),
                      "family": info.family if not info.reference else "reference", "recipe": recipe, "cost": cost,
                      "train_seconds": train or None, "search_seconds": search or None, "pretrain_seconds": pretrain or None,
                      "eval_seconds": evals, "seeds": sorted(seeds.get(label, []), key=str), "note": info.note})
    return cards


def paper_line(p: Mapping[str, Any]) -> str:
    return f"{p['key']} — {p['authors']}, “{p['title']}”, {p['venue']}, arXiv:{p['arxiv']}"
