"""Sliding-window perplexity with an explicit protocol, and the per-position NLL curve (``ropekit eval ppl``).

"Perplexity at length L with a sliding window of 256" means different computations in different
codebases (docs/methods-reference.md §10). Here every parameter is named and recorded with each result:

* ``context_len`` L: tokens per model input, *counting* a prepended BOS. With ``add_bos`` a window holds
  C = L−1 document tokens after the BOS (as YaRN's ``eval/perplexity.py`` and PoSE's ``eval_ppl.py``, whose
  tokenizers add it), otherwise C = L (the HF "perplexity of fixed-length models" guide, GPT-2 without special
  tokens, and LongLoRA/LCEG feed raw tokens: ``add_bos=False`` reproduces them).
* ``score_mode``: which windows are run and which of their predictions count —

  - ``last_stride`` (Press et al.'s Shortformer/ALiBi evaluation, PI, the HF guide, YaRN, PoSE):
    windows start at 0, S, 2S, … and end at ``min(start + C, n)``; the first window scores all its
    predictions, each later window only the tokens after the previous window's end (its last S, fewer
    at the document's end); the sweep stops at the first window that reaches the end. Every token is
    scored exactly once, each after the first window with at least C−S document tokens of context.
    Without BOS the document's first token has no context and is not scored. This is YaRN's loop exactly.
    The others differ in details that move the number: PoSE truncates each document to its largest
    length (``max_length = max_input_tokens − 1``) where ropekit scores the whole document; the HF guide
    weights each window by ``trg_len − 1``, one prediction too few after the first window (ropekit counts
    the predictions scored); fairseq's ``--context-window`` (Press et al.) scores blocks of S tokens with
    the document's first token predicted from ``</s>``, so contexts match only without BOS and with S
    dividing C.
  - ``full_window`` (LongLoRA ``eval.py``, LCEG ``eval_perplexity``): full windows of C tokens start
    every S tokens while they fit in the document (``start + C ≤ n``) and each is scored on *all* its
    predictions, so tokens are scored several times and some with almost no context. The references
    window differently: they take ``range(0, n − L, S)`` and then ``pop()`` its last start, one or two
    windows fewer than every full window kept here (n = 1024, L = 512, S = 256: 1 window there, 3 here),
    over one token stream of concatenated books (LCEG: the first 10 of PG19), windows crossing book
    boundaries, where ropekit windows each document apart; LongLoRA averages per-batch losses
    (``--batch_size`` 32) where LCEG's scripts pass 1 and average per window.
  - ``disjoint`` (Landmark Attention's ``eval.py``): windows [0, C), [C, 2C), … to the end, all predictions
    scored. Without BOS the first token of each window is not scored (it has no context inside the window);
    with BOS every window starts with it. (lm-eval's ``loglikelihood_rolling`` differs: only its first window
    gets a prefix token, later ones overlap by one token, so every token is scored.)
  - ``truncate`` (YaRN's ``--truncate``): one window per document, its first C tokens, all predictions
    scored; with ``weighting="window"`` the aggregate is YaRN's mean over documents of per-document NLL.
  - ``same_targets`` (how much does more context help, on identical targets): one window per document and
    length, ending at the same token at every length — token C_max of the document, C_max the longest
    length's capacity — and scoring the same last T tokens (T = the stride, default ``min(256, shortest
    length // 2)``, at most the shortest window's predictions). The targets are identical across lengths,
    only the context before them grows, so a difference between lengths is the context's alone (the other
    modes score different tokens at different lengths, mixing content with context).

* ``stride`` S: how far the window start advances (the "256" of all the papers above, which LCEG calls a
  "sliding window" though it is a stride). Default ``min(256, L // 2)``: 256 as PI, YaRN, PoSE and
  LongLoRA use at long lengths, and half the window below 512 tokens so a scored token still sees at
  least half a window. ``last_stride`` needs 1 ≤ S ≤ L−1 (with S = C without BOS the token at each window
  start would have no context), ``full_window`` needs 1 ≤ S ≤ C (no token left unread); ``disjoint`` and
  ``truncate`` take no stride (recorded as C, their advance).
* ``weighting``: ``token`` — exp of the mean NLL over every scored token (Press, PoSE's
  Σ loss·trg_len / Σ trg_len); ``window`` — exp of the unweighted mean over windows of each window's
  mean NLL (YaRN's ``torch.stack(nlls).mean()``, LongLoRA/LCEG's mean of per-window losses).
* ``add_bos``: prepend the tokenizer's BOS to every window; default: when the tokenizer defines one, whether or
  not its own encoding adds it (SmolLM2's BOS is ``<|im_start|>``, which its tokenizer never adds: ppl then reads
  every window after that token, about 1.6 % above the no-BOS value on 512 prose tokens). The choice is recorded
  with every result and is part of the study's perplexity protocol, so methods are compared under one convention.

Documents: the corpus of ``--data`` (see :mod:`ropekit.data.corpora`; default the built-in one),
tokenised without special tokens. Only documents with at least C tokens at the *longest* length
evaluated are used, at every length — as YaRN filters its documents by the largest length — so all
lengths are measured on the same documents (in ``last_stride`` mode on exactly the same tokens) and are
comparable; shorter ones are counted as ``skipped_short``. ``samples`` = N keeps the first N such
documents (corpus order; the built-in corpus is ordered longest first). Every record says which longest length
chose its documents (``longest_length``; in ``same_targets`` mode it also places the targets), and a resume whose
longest length differs from the one of the records already there (same method, corpus and protocol) is refused:
its documents, and its targets, would not be theirs.

Each record is computed from the model's freshly installed RoPE state
(:func:`ropekit.install.installer.reset_length_state`): methods whose frequencies follow the longest input seen
(Dynamic NTK's transformers rule) would otherwise score a length after a longer one at the longer one's
frequencies, and a resumed run would differ from an uninterrupted one. Within one document every protocol starts
with a full window of L tokens, so this is what a run of that length alone computes.

One record per (length, document): ``nll_sum``, ``tokens_scored``, ``windows``, ``forwards`` (batched
model calls), ``window_mean_nll_sum`` (Σ of per-window mean NLLs, for window weighting), the protocol,
and the per-position NLL curve: scored predictions bucketed by the position of the predicted token in
the model input (BOS at 0), ``min(64, L)`` buckets, as sums and counts so that averages over documents
stay exact (LCEG Fig. 3 plots this curve). ``score`` is None: perplexity is not a score in [0, 1].

NLL is computed in float32 from logits with ``cross_entropy(reduction="none")``, on the predictions that
are scored only: for the model families with a plain LM head (:data:`PLAIN_HEAD_TYPES`) the decoder's
last hidden states are multiplied by the head in chunks, so no (positions × vocabulary) tensor larger
than :data:`CHUNK_ELEMENTS` exists; other models go through their ``forward`` with ``logits_to_keep``.
Windows of one document with the same shape are batched (up to :data:`BATCH_TOKENS` tokens per call).
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch
import torch.nn.functional as F

from ..data.corpora import corpus_label, ids_digest, iter_documents
from ..errors import RopekitError
from ..install.installer import reset_length_state
from ..runtime.atomic import save_figure
from .common import EvalContext, default_stride, require_tokenizer, timer, token_lengths, whole_number

KEY_FIELDS = ("corpus", "doc", "doc_sha", "score_mode", "stride", "weighting", "add_bos")
SCORE_MODES = ("last_stride", "full_window", "disjoint", "truncate", "same_targets")
WEIGHTINGS = ("token", "window")
#: Buckets of the per-position NLL curve (fewer when L is smaller).
CURVE_BUCKETS = 64
#: Largest number of tokens in one batched model call.
BATCH_TOKENS = 8192
#: Largest logits chunk (positions × vocabulary elements) materialised at once.
CHUNK_ELEMENTS = 1 << 24
#: model_type values whose causal-LM logits are exactly ``lm_head(decoder last hidden state)``.
PLAIN_HEAD_TYPES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "gpt_neox"})
#: Fields that, with length and method, make one summary row.
_GROUP = ("method", "params", "length", "corpus", "score_mode", "stride", "weighting", "add_bos")


# ---- protocol --------------------------------------------------------------------------------------
def windows_for(n_tokens: int, capacity: int, stride: int, score_mode: str, add_bos: bool) -> list[tuple[int, int, int]]:
    """The windows of a document of ``n_tokens`` tokens as ``(start, end, k)``: the model reads document
    tokens ``[start, end)`` (after a BOS if ``add_bos``) and the last ``k`` of them are scored.

    ``capacity`` is C, the document tokens per window. Windows that would score nothing are left out.
    """
    b = 1 if add_bos else 0
    out: list[tuple[int, int, int]] = []
    if score_mode == "last_stride":
        prev_end = 0
        for start in range(0, n_tokens, stride):
            end = min(start + capacity, n_tokens)
            k = end - prev_end if start else end - start - 1 + b
            if k > 0:
                out.append((start, end, k))
            prev_end = end
            if end == n_tokens:
                break
    elif score_mode == "full_window":
        for start in range(0, n_tokens - capacity + 1, stride):
            if capacity - 1 + b > 0:
                out.append((start, start + capacity, capacity - 1 + b))
    elif score_mode == "disjoint":
        for start in range(0, n_tokens, capacity):
            end = min(start + capacity, n_tokens)
            if end - start - 1 + b > 0:
                out.append((start, end, end - start - 1 + b))
    elif score_mode == "truncate":
        end = min(capacity, n_tokens)
        if end - 1 + b > 0:
            out.append((0, end, end - 1 + b))
    elif score_mode == "same_targets":  # ``n_tokens`` is the common end; ``stride`` the number of targets
        start = max(0, n_tokens - capacity)
        out.append((start, n_tokens, min(stride, n_tokens - start - 1 + b)))
    else:  # pragma: no cover - validated by the caller
        raise ValueError(score_mode)
    return out


def _choice(value: str, allowed: tuple[str, ...], flag: str) -> str:
    norm = str(value).strip().lower().replace("-", "_")
    if norm not in allowed:
        raise RopekitError(f"{flag} '{value}' is not known", f"choose one of {', '.join(allowed)}")
    return norm


def _resolve_stride(stride: int | None, score_mode: str, length: int, add_bos: bool) -> int:
    capacity = length - (1 if add_bos else 0)
    if score_mode in ("disjoint", "truncate"):
        return capacity
    if stride is None:
        return default_stride(length)
    limit = length - 1 if score_mode == "last_stride" else capacity
    if stride > limit:
        why = ("each later window must keep at least one token of context" if score_mode == "last_stride"
               else "larger strides leave tokens between windows unread")
        raise RopekitError(f"--stride {stride} is larger than {limit} for length {length} in {score_mode} mode ({why})",
                           f"pass --stride between 1 and {limit}, or raise --lengths")
    return stride


# ---- scoring ---------------------------------------------------------------------------------------
def _plain_head(model) -> bool:
    return (getattr(model.config, "model_type", None) in PLAIN_HEAD_TYPES
            and model.get_output_embeddings() is not None
            and getattr(model, "base_model", model) is not model)


def _chunked_nll(head, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """NLL (float32) of ``targets`` (N,) under ``head(hidden)`` (N, H), a bounded number of rows at a time."""
    vocab = head.weight.shape[0]
    rows = max(1, CHUNK_ELEMENTS // vocab)
    parts = []
    for i in range(0, hidden.shape[0], rows):
        logits = head(hidden[i:i + rows]).float()
        parts.append(F.cross_entropy(logits, targets[i:i + rows], reduction="none"))
        del logits
    return torch.cat(parts)


def score_windows(model, inputs: torch.Tensor, k: int) -> torch.Tensor:
    """NLL (float32, shape (B, k)) of the last ``k`` tokens of each row of ``inputs`` (B, T), given what precedes
    them in the row: one forward with an explicit all-ones attention mask."""
    mask = torch.ones_like(inputs)
    total = inputs.shape[1]
    targets = inputs[:, total - k:]
    if _plain_head(model):
        out = model.base_model(input_ids=inputs, attention_mask=mask, use_cache=False)
        hidden = out.last_hidden_state[:, total - k - 1:total - 1]
        del out
        nll = _chunked_nll(model.get_output_embeddings(), hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1))
    else:
        logits = model(input_ids=inputs, attention_mask=mask, use_cache=False, logits_to_keep=k + 1).logits[:, :-1]
        nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return nll.reshape(inputs.shape[0], k)


def curve_edges(length: int) -> list[int]:
    """First input position of each curve bucket: position p is in bucket ``p * B // L`` (B = min(64, L))."""
    buckets = min(CURVE_BUCKETS, length)
    return [-(-j * length // buckets) for j in range(buckets)]


def score_document(model, ids: list[int], *, length: int, stride: int, score_mode: str, bos_id: int | None) -> dict[str, Any]:
    """Every window of one document under the protocol: sums of NLL, counts, the position curve."""
    add_bos = bos_id is not None
    capacity = length - (1 if add_bos else 0)
    plan = windows_for(len(ids), capacity, stride, score_mode, add_bos)
    device = next(model.parameters()).device
    doc = torch.tensor(ids, dtype=torch.long)
    buckets = min(CURVE_BUCKETS, length)
    curve_sum = torch.zeros(buckets, dtype=torch.float64)
    curve_n = torch.zeros(buckets, dtype=torch.long)
    nll_sum = 0.0
    window_mean_sum = 0.0
    tokens = 0
    forwards = 0
    i = 0
    with torch.no_grad():
        while i < len(plan):
            start, end, k = plan[i]
            width = end - start
            per_call = max(1, BATCH_TOKENS // (width + (1 if add_bos else 0)))
            group = [plan[i]]
            while (len(group) < per_call and i + len(group) < len(plan)
                   and plan[i + len(group)][1] - plan[i + len(group)][0] == width and plan[i + len(group)][2] == k):
                group.append(plan[i + len(group)])
            rows = torch.stack([doc[s:e] for s, e, _ in group])
            if add_bos:
                rows = torch.cat([torch.full((len(group), 1), bos_id, dtype=torch.long), rows], dim=1)
            nll = score_windows(model, rows.to(device), k).double().cpu()
            forwards += 1
            nll_sum += float(nll.sum())
            window_mean_sum += float(nll.mean(dim=1).sum())
            tokens += nll.numel()
            positions = torch.arange(rows.shape[1] - k, rows.shape[1])  # input positions of the predicted tokens
            bucket = positions * buckets // length
            curve_sum += torch.zeros(buckets, dtype=torch.float64).index_add_(0, bucket, nll.sum(dim=0))
            curve_n += torch.bincount(bucket, minlength=buckets) * len(group)
            i += len(group)
    return {
        "nll_sum": nll_sum,
        "tokens_scored": tokens,
        "windows": len(plan),
        "forwards": forwards,
        "window_mean_nll_sum": window_mean_sum,
        "curve_nll_sum": curve_sum.tolist(),
        "curve_tokens": curve_n.tolist(),
    }


# ---- the task --------------------------------------------------------------------------------------
def _select_documents(data, tokenizer, capacity: int, samples: int | None):
    """The first ``samples`` (all when None) documents with ≥ ``capacity`` tokens, and how many were too short."""
    chosen, short, longest = [], 0, 0
    for doc in iter_documents(data, tokenizer):
        longest = max(longest, len(doc.ids))
        if len(doc.ids) < capacity:
            short += 1
            continue
        chosen.append(doc)
        if samples is not None and len(chosen) == samples:
            break  # the rest of the corpus is neither read nor tokenised
    label = corpus_label(data)
    if not chosen:
        raise RopekitError(
            f"no document of '{label}' has the {capacity} tokens the longest length needs (longest: {longest})",
            "lower --lengths, or pass --data with longer documents",
        )
    if samples is not None and len(chosen) < samples:
        raise RopekitError(f"--samples {samples} but only {len(chosen)} documents of '{label}' have ≥ {capacity} tokens",
                           f"pass --samples {len(chosen)} or lower --lengths")
    return chosen, short, label


def check_options(*, lengths: list[int] | None = None, data: str | None = None, stride: int | None = None,
                  score_mode: str = "last_stride", weighting: str = "token", add_bos: bool | None = None,
                  samples: int | None = None, plot: str | None = None) -> tuple[str, str]:
    """Refuse what is wrong whatever the model (common module doc); ``(score_mode, weighting)`` normalised.

    A stride is checked against every length as far as the model allows without its tokenizer: the BOS a
    tokenizer adds shortens each window by one, which ``run`` checks again."""
    if not lengths:
        raise RopekitError("the 'ppl' evaluation needs --lengths", "pass e.g. --lengths 2k,4k")
    lengths = token_lengths(lengths, minimum=2, why=" (perplexity needs a token to predict)")
    score_mode = _choice(score_mode, SCORE_MODES, "--score-mode")
    weighting = _choice(weighting, WEIGHTINGS, "--weighting")
    if stride is not None:
        whole_number(stride, "--stride")
        if score_mode in ("disjoint", "truncate"):
            raise RopekitError(f"--stride does not apply to score mode {score_mode} (its windows do not overlap)",
                               "drop --stride, or use --score-mode last_stride or full_window")
    if samples is not None:
        whole_number(samples, "--samples")
    if add_bos is not None and not isinstance(add_bos, bool):
        raise RopekitError(f"add_bos {add_bos!r} is not true or false", "pass --add-bos or --no-add-bos")
    if score_mode == "same_targets":
        _same_targets(stride, lengths)
    else:
        for length in lengths:
            _resolve_stride(stride, score_mode, length, bool(add_bos))
    return score_mode, weighting


def _same_targets(stride: int | None, lengths: list[int]) -> int:
    """The number of targets every length scores in same_targets mode (``stride``, or the shortest length's default)."""
    most = min(lengths) - 1  # predictions the shortest window makes (with or without BOS: L − 1)
    targets = default_stride(min(lengths)) if stride is None else stride
    if targets > most:
        raise RopekitError(f"--stride {targets} targets do not fit the shortest length {min(lengths)}",
                           f"pass --stride of at most {most} in same_targets mode")
    return targets


def run(
    ctx: EvalContext,
    *,
    lengths: list[int] | None = None,
    data: str | None = None,
    stride: int | None = None,
    score_mode: str = "last_stride",
    weighting: str = "token",
    add_bos: bool | None = None,
    samples: int | None = None,
    plot: str | None = None,
) -> None:
    """Score every (length, document) not yet in ``ctx``'s results; one record each (module docstring)."""
    tokenizer = require_tokenizer(ctx.tokenizer, "ppl")
    score_mode, weighting = check_options(lengths=lengths, data=data, stride=stride, score_mode=score_mode,
                                          weighting=weighting, add_bos=add_bos, samples=samples, plot=plot)
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if add_bos is None:
        add_bos = bos_id is not None
    elif add_bos and bos_id is None:
        raise RopekitError("--add-bos given but the tokenizer has no BOS token", "drop --add-bos (or pass --no-add-bos)")
    b = 1 if add_bos else 0
    if score_mode == "same_targets":
        targets = _same_targets(stride, lengths)
        strides = {length: targets for length in lengths}
    else:
        strides = {length: _resolve_stride(stride, score_mode, length, add_bos) for length in lengths}
    common_end = max(lengths) - b
    _check_longest(ctx, corpus_label(data), score_mode, weighting, add_bos, max(lengths))
    docs, short, label = _select_documents(data, tokenizer, common_end, samples)
    ctx.set_total(len(lengths) * len(docs))
    mine = []
    for length in lengths:
        for doc in docs:
            sha = ids_digest(doc.ids)
            key = ctx.key(length, corpus=label, doc=doc.index, doc_sha=sha, score_mode=score_mode,
                          stride=strides[length], weighting=weighting, add_bos=add_bos)
            mine.append(key)
            if ctx.done(key):
                continue
            ctx.advance(0, f"ppl {length} · {doc.name}")
            ids = doc.ids[:common_end] if score_mode == "same_targets" else doc.ids
            reset_length_state(ctx.model)  # as a fresh process would: nothing scored before changes this record
            with timer() as elapsed:
                result = score_document(ctx.model, ids, length=length, stride=strides[length],
                                        score_mode=score_mode, bos_id=bos_id if add_bos else None)
            ctx.write(
                key,
                score=None,
                doc_name=doc.name,
                doc_tokens=len(doc.ids),
                context_len=length,
                window_tokens=length - b,
                bos_token_id=bos_id if add_bos else None,
                ppl=_ppl(result, weighting),
                curve_positions=curve_edges(length),
                documents_selected=len(docs),
                skipped_short=short,
                longest_length=max(lengths),
                seconds=elapsed(),
                **result,
            )
    if plot:
        plot_curve([ctx.writer.done[ctx.writer.key(k)] for k in mine], plot)


def _check_longest(ctx: EvalContext, corpus: str, score_mode: str, weighting: str, add_bos: bool, longest: int) -> None:
    """Refuse, before anything is written, to add records chosen for another longest length to those already in the
    results (same task, method, parameters, corpus, score mode, weighting and BOS): the longest length decides which
    documents every length reads and, in ``same_targets`` mode, where the targets end, so the two sets would not
    be measured on the same documents (or targets) and their summary rows would not compare."""
    for r in ctx.writer.records():
        before = r.get("longest_length")
        if before is None or before == longest:
            continue  # a record written before the field was kept cannot be checked
        if (r.get("task"), r.get("method"), r.get("params"), r.get("corpus"), r.get("score_mode"), r.get("weighting"),
                r.get("add_bos")) != (ctx.task, ctx.method, ctx.params, corpus, score_mode, weighting, add_bos):
            continue
        where = f"'{ctx.writer.path}'" if getattr(ctx.writer, "path", None) else "the results"
        targets = " and targets placed" if score_mode == "same_targets" else ""
        raise RopekitError(
            f"{where} holds {ctx.task} records of {ctx.method} whose documents were chosen{targets} for a longest length "
            f"of {before}; this run's longest length is {longest}, and resuming would mix the two sets",
            f"pass --lengths whose longest is {before} to continue it, or another --out")


def _ppl(r: dict[str, Any], weighting: str) -> float | None:
    if weighting == "window":
        return math.exp(r["window_mean_nll_sum"] / r["windows"]) if r["windows"] else None
    return math.exp(r["nll_sum"] / r["tokens_scored"]) if r["tokens_scored"] else None


def _group_key(r: dict[str, Any]) -> tuple:
    return tuple(json.dumps(r.get(f), sort_keys=True) for f in _GROUP)


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per length (and method, corpus, protocol): ``ppl`` by the records' weighting, ``nll`` (its
    logarithm), ``tokens_scored``, ``documents``, ``windows``, ``skipped_short`` and the protocol."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(_group_key(r), []).append(r)
    rows = []
    for recs in groups.values():
        first = recs[0]
        total = {f: sum(r[f] for r in recs) for f in ("nll_sum", "tokens_scored", "windows", "window_mean_nll_sum")}
        if first["weighting"] == "window":
            nll = total["window_mean_nll_sum"] / total["windows"] if total["windows"] else None
        else:
            nll = total["nll_sum"] / total["tokens_scored"] if total["tokens_scored"] else None
        rows.append({
            "method": first["method"],
            "length": first["length"],
            "ppl": math.exp(nll) if nll is not None else None,
            "nll": nll,
            "tokens_scored": total["tokens_scored"],
            "documents": len(recs),
            "windows": total["windows"],
            "skipped_short": first.get("skipped_short"),
            "score_mode": first["score_mode"],
            "stride": first["stride"],
            "weighting": first["weighting"],
            "add_bos": first["add_bos"],
            "corpus": first["corpus"],
        })
    order = {m: i for i, m in enumerate(dict.fromkeys(r["method"] for r in records))}
    rows.sort(key=lambda r: (order[r["method"]], r["length"], r["corpus"], r["score_mode"], r["stride"], r["weighting"], r["add_bos"]))
    return rows


def position_curves(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per summary group: the mean NLL of each curve bucket over all its documents (token-weighted),
    ``positions`` (first input position of each bucket) and ``tokens`` per bucket; empty buckets are None."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(_group_key(r), []).append(r)
    curves = []
    for recs in groups.values():
        first = recs[0]
        sums = [sum(col) for col in zip(*(r["curve_nll_sum"] for r in recs))]
        counts = [sum(col) for col in zip(*(r["curve_tokens"] for r in recs))]
        curves.append({
            **{f: first[f] for f in _GROUP},
            "positions": first["curve_positions"],
            "mean_nll": [s / n if n else None for s, n in zip(sums, counts)],
            "tokens": counts,
        })
    curves.sort(key=lambda c: (str(c["method"]), c["length"]))
    return curves


def plot_curve(records: list[dict[str, Any]], path: str) -> None:
    """A PNG of mean NLL by position in the window, one line per length (and method/protocol if several)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    curves = position_curves(records)
    if not curves:
        raise RopekitError("no perplexity records to plot", "run some lengths first")
    several = len({(c["method"], c["score_mode"], c["stride"], c["weighting"], c["add_bos"], c["corpus"]) for c in curves}) > 1
    fig = Figure(figsize=(7, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for c in curves:
        points = [(p, v) for p, v in zip(c["positions"], c["mean_nll"]) if v is not None]
        label = f"L={c['length']}" + (f" {c['method']} {c['score_mode']} S={c['stride']}" if several else "")
        ax.plot([p for p, _ in points], [v for _, v in points], marker=".", label=label)
    first = curves[0]
    ax.set_xlabel("position in the window (bucket start)")
    ax.set_ylabel("mean NLL (nats)")
    title = f"ppl per position — {first['method']}" + ("" if several else f", {first['score_mode']}, stride {first['stride']}")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=110)
    except OSError as e:
        raise RopekitError(f"cannot write the plot to '{path}' ({e.strerror})", "pass --plot with a writable path") from None


def plot(records: list[dict[str, Any]], path: str) -> None:
    """The task's figure (registry convention): :func:`plot_curve`."""
    plot_curve(records, path)
