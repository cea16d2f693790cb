"""Attention entropy per layer, head and query position (``ropekit eval entropy``).

For layer ``l``, head ``h`` and query position ``i`` the entropy of the attention distribution the model
actually uses is

    ``H_{l,h}(i) = −Σ_j p_ij ln p_ij``,   ``p_i = softmax(s_i)`` over the keys query ``i`` may attend to,

in nats, with ``s_ij`` the logits after everything the installed method does to them: RoPE at the true
positions (so YaRN's attention factor, folded into cos/sin, is inside), ropekit's per-layer query/key
transforms (Entropy-ABF's logit scale ``max(log_c(i+1), 1)``, HARPE's per-KV-group rotation), and for
methods that replace the attention itself the rule that attention states pair by pair
(:class:`~ropekit.attention.interface.PairRule`): Self-Extend's grouped positions past the neighbour
window (Jin et al. 2024 §3), LM-Infinite's Λ mask with the distance ceiling for the global tokens, LongLoRA's
S²-Attn groups in training mode (full attention in eval mode), Landmark's grouped softmax. A rule may give
the weights as ``p_ij = exp(s_ij − Z_i)`` with its own normaliser ``Z_i`` (Landmark: a gated block with no
visible token loses its share, so ``Σ_j p_ij < 1``); then ``H = −Σ_j p_ij ln p_ij`` of those weights. A
replacement attention that states no rule raises a one-line error rather than reporting numbers for a
distribution that is not the one used.

Under Landmark attention (Mohtashami & Jaggi 2023, arXiv 2305.16300 §3) the model's decoder inserts a
landmark token after every ``mem_freq`` tokens of the input (:func:`ropekit.methods.landmark_layout.landmark_layout`),
so every layer sees ``n + ⌊n/mem_freq⌋`` queries and keys. Query position ``i`` is then the row of input token
``i`` in that longer sequence — the query of token ``i`` itself (the landmark rows are no input token and are not
measured, not even the landmark after a block's last token, whose output the model reads that token's next-token
prediction from) — and its distribution is Landmark's grouped softmax (over every block in training mode, over
the local window and the retrieved blocks at inference), whose weights lie on text keys only (a landmark gates
its block and gets no weight itself). The method is recognised by the state its installation leaves on the decoder
(:data:`ropekit.methods.landmark_stream.SETTINGS_ATTR`); ids that already hold the landmark token are refused,
and a layer that receives another number of queries than the input makes is refused rather than measured at
the wrong rows.

The normalised entropy divides by the uniform ceiling ``ln(k)`` of each layer, head and query: ``k = k_{l,h}(i)``
the number of keys query ``i`` attends with nonzero weight in that head (the pairs the rule keeps): ``k = i + 1``
for causal attention (the ``H/ln(i+1)`` of docs/methods-reference.md §10), fewer under LM-Infinite's mask, a
sliding window (the local layers of Gemma 3; Gemma Team 2025, arXiv 2503.19786), Landmark's retrieval, or in
the heads of S²-Attn whose shifted groups start elsewhere than the unshifted ones (Chen et al. 2024, LongLoRA
§3.2) — a count per head, since the mask may differ between heads. A query that sees one key (position 0) has
``H = 0`` and its normalised entropy is defined as 0.

How it is measured: a temporary attention function is registered with transformers'
``AttentionInterface`` and the model is switched to it for one forward pass; it receives the queries
and keys after RoPE, computes the statistics, and delegates to the implementation the model was using
(sdpa, eager, ``ropekit_<kernel>``…) with the unchanged arguments, so the forward continues exactly as
before. No model file is copied. Logits are formed only for the measured query rows, in chunks of rows
against all keys (``rows × n`` per head, never ``n × n``), in float32, and per row
``H = logsumexp(s) − Σ softmax(s)·s`` (after subtracting the row maximum, which leaves ``H`` unchanged
and keeps the difference small). Long inputs are measured at about 64 query positions on a logarithmic
grid that always contains the first and the last position (:func:`log_positions`).

Entropy-ABF's released ``retrieve_attn.py`` (GAIR-NLP/Entropy-ABF; docs/methods-reference.md §3) takes ``output_attentions`` — already
probabilities — and applies ``softmax`` to them a second time before computing the entropy, which
flattens every distribution towards uniform. That double softmax is *not* reproduced here: the
probabilities are formed once, from the logits. (It also reported head 0 only and the entropy of the
document-averaged distribution; here every head is kept and averages are taken over entropies.)

Inputs: the English prose of :mod:`ropekit.data.prose` (``python-docs-prose``, the Paul Graham essay
substitute), tokenised with the model's tokenizer (its BOS included) and cut to ``length`` tokens.
Sample ``s`` starts at a paragraph drawn from ``random.Random`` seeded by (seed, s) — the same for every
length, so the inputs of one sample at different lengths are prefixes of one text, as in Entropy-ABF's
entropy-vs-length curves. A model without a tokenizer is refused (random token ids would measure a
different input distribution without saying so).

Records (one per length × sample): ``positions`` and the nested lists ``entropy``, ``normalised`` and ``keys``
(the ``k`` of each entropy) indexed ``[layer][head][position]`` (5 significant digits), the means over layers and
heads at the last position (``entropy_last``, ``normalised_last``) and per layer (``layer_entropy_last``, and
``layer_uniform_last``: the mean over heads of ``ln k``, the layer's entropy if each head attended uniformly to
the keys it sees — its ceiling), and ``uniform_last``, the largest layer ceiling (``ln n`` for causal attention;
on Gemma 3 that of the global layers, while the sliding-window layers' ``ln(window)`` stays in
``layer_uniform_last``): no entropy at the last position, of a layer or of the mean, exceeds it. The figure follows Entropy-ABF (Entropy-ABF, Zhang et al. 2024) Fig. 1: entropy at the last
position vs context length per layer, plus entropy vs query position.
"""

from __future__ import annotations

import math
import random
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from ..adapters import transformers as hf
from ..attention.interface import PREFIX, PairLogits, PairRule, attention_modules, plain_pair_logits
from ..attention.masks import AttentionMask
from ..errors import RopekitError
from ..methods.landmark_attention import LANDMARKS_KWARG
from ..methods.landmark_layout import landmark_layout
from ..methods.landmark_stream import SETTINGS_ATTR as LANDMARK_SETTINGS_ATTR
from ..runtime.atomic import save_figure
from .common import EvalContext, encode, mean, require_tokenizer, timer, token_lengths, whole_number

KEY_FIELDS = ("sample",)

#: Query positions measured per input when it is longer (log grid, first and last always included).
QUERY_POSITIONS = 64

#: Logit elements per chunk (rows × heads × keys): 2^22 float32 values = 16 MiB per temporary.
CHUNK_ELEMENTS = 1 << 22

#: Prefix of the temporary attention implementations; the wrapped implementation's name follows it.
PROBE_PREFIX = "ropekit_entropy_"

#: Significant digits kept in the records' nested lists.
DIGITS = 5


# ---- query positions ------------------------------------------------------------------------------
def log_positions(n: int, count: int = QUERY_POSITIONS) -> list[int]:
    """``count`` distinct query positions in ``[0, n)`` on a logarithmic grid, or all ``n`` when ``n ≤ count``.

    Position ``k`` of the grid is ``round(n^(k/(count−1))) − 1`` (so 0 and ``n − 1`` are always there),
    raised to one past the previous position where the grid is denser than one token (the start); the
    result is strictly increasing and has exactly ``min(n, count)`` entries.
    """
    if n < 1:
        raise RopekitError(f"length {n} is not positive", "pass lengths of at least 1 token")
    if count < 2:
        raise RopekitError(f"{count} query positions cannot span an input", "measure at least 2 positions")
    if n <= count:
        return list(range(n))
    out: list[int] = []
    for k in range(count):
        target = int(round(math.exp(math.log(n) * k / (count - 1)))) - 1
        # the last count−k positions must still fit below n
        pos = min(max(target, out[-1] + 1 if out else 0), n - (count - k))
        out.append(pos)
    return out


# ---- the logits a layer really uses -----------------------------------------------------------------
class LayerLogits:
    """The logits one attention layer really computes, for any block of query rows.

    Built from what the attention function receives (rotated queries and keys, mask, scaling, kwargs) and
    the implementation the model runs: for ``ropekit_<kernel>`` the module's ``ropekit_transforms`` are
    applied first and its ``ropekit_attend`` (if any) states the logit rule (``pair_logits``). The mask is
    read once, in whatever format the kernel got, with the ``sliding_window`` a flash kernel applies itself.
    ``block(rows)`` returns the :class:`~ropekit.attention.interface.PairLogits` of those query rows.
    """

    def __init__(self, module, query, key, attention_mask, scaling, kwargs: dict, implementation: str):
        attend = None
        if implementation.startswith(PREFIX):
            position_ids = kwargs.get("position_ids")
            for transform in getattr(module, "ropekit_transforms", ()) or ():
                query, key = transform(module, query, key, position_ids)
            attend = getattr(module, "ropekit_attend", None)
        for name in ("softcap", "s_aux", "sinks"):
            if kwargs.get(name) is not None:
                raise RopekitError(
                    f"attention entropy does not model the '{name}' argument of this model's attention yet",
                    "measure a Llama, Mistral, Qwen2/3, Phi-3 or GPT-NeoX model",
                )
        if attend is not None and not isinstance(attend, PairRule):
            raise RopekitError(
                f"attention entropy is not available for {type(attend).__name__}: it states no pair rule (pair_logits)",
                "measure the plain model, a frequency method, or an attention method of ropekit",
            )
        self.module, self.attend = module, attend
        self.query, self.key = query, key
        self.kwargs = kwargs
        self.q_len, self.k_len = query.shape[2], key.shape[2]
        self.scale = float(scaling) if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        self.mask = AttentionMask.for_call(attention_mask, query, key, kwargs)

    def block(self, rows: torch.Tensor) -> PairLogits:
        if self.attend is None:
            return plain_pair_logits(self.query, self.key, self.mask, scaling=self.scale, rows=rows, **self.kwargs)
        return self.attend.pair_logits(self.module, self.query, self.key, self.mask, scaling=self.scale, rows=rows,
                                       **self.kwargs)


def row_entropy(logits: torch.Tensor, allowed: torch.Tensor,
                log_normaliser: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(H, k)`` of each row of ``logits`` over its ``allowed`` keys: ``H = lse(s) − Σ softmax(s)·s`` (nats)
    and ``k`` the number of allowed keys. With ``log_normaliser`` ``Z`` (B, H, R) the weights are
    ``p = exp(s − Z)`` as given (they may sum to less than one) and ``H = −Σ p·(s − Z)``. Rows with no allowed
    key get ``H = 0``."""
    allowed = allowed.expand_as(logits)
    s = logits.masked_fill(~allowed, float("-inf"))
    if log_normaliser is None:
        top = s.amax(dim=-1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        z = s - top  # H is shift-invariant; the shift keeps lse and Σp·z small and close
        lse = torch.logsumexp(z, dim=-1)
        p = torch.exp(z - lse.unsqueeze(-1).masked_fill(torch.isinf(lse).unsqueeze(-1), 0.0))
        h = lse - (p * z.masked_fill(~allowed, 0.0)).sum(dim=-1)
    else:
        norm = log_normaliser.to(s.dtype).unsqueeze(-1)
        z = (s - norm.masked_fill(torch.isinf(norm), 0.0)).masked_fill(~allowed, float("-inf"))
        h = -(torch.exp(z) * z.masked_fill(~allowed, 0.0)).sum(dim=-1)
    count = allowed.sum(dim=-1)
    h = torch.where(count > 0, h, torch.zeros_like(h)).clamp_min(0.0)
    return h, count


# ---- the probe ------------------------------------------------------------------------------------
class _Probe:
    """Collects per-layer entropies of the query rows ``rows`` (of the ``queries`` every layer must receive)
    during one forward pass."""

    def __init__(self, rows: list[int], chunk: int | None, queries: int):
        self.rows = rows
        self.chunk = chunk
        self.queries = queries
        self.entropy: dict[int, torch.Tensor] = {}
        self.keys: dict[int, torch.Tensor] = {}

    def observe(self, module, query, key, attention_mask, scaling, kwargs, implementation: str) -> None:
        q_len = query.shape[2]
        if q_len != self.queries:  # the rows would not be the input positions they stand for
            raise RopekitError(
                f"attention layer {module.layer_idx} received {q_len} queries where the input makes {self.queries}, "
                "so the measured rows would not be the requested positions",
                "measure the model without hooks that add or drop tokens inside its forward",
            )
        landmarks = kwargs.get(LANDMARKS_KWARG)
        if landmarks is not None and self.rows:
            flags = landmarks.is_landmark[:, -q_len:][:, torch.tensor(self.rows, device=landmarks.is_landmark.device)]
            if bool(flags.any()):
                raise RopekitError(
                    f"attention layer {module.layer_idx} holds landmark tokens at rows measured as input tokens",
                    "pass plain ids and no KV cache, so that the landmarks follow the model's own layout",
                )
        logits = LayerLogits(module, query, key, attention_mask, scaling, kwargs, implementation)
        rows = torch.tensor(self.rows, device=query.device, dtype=torch.long)
        b, heads, _, _ = logits.query.shape
        chunk = self.chunk or max(1, CHUNK_ELEMENTS // max(1, b * heads * logits.k_len))
        hs, ks = [], []
        for start in range(0, len(self.rows), chunk):
            pair = logits.block(rows[start:start + chunk])
            h, k = row_entropy(pair.logits, pair.kept, pair.log_normaliser)
            hs.append(h)
            ks.append(k)
        self.entropy[module.layer_idx] = torch.cat(hs, dim=-1).detach().cpu()
        self.keys[module.layer_idx] = torch.cat(ks, dim=-1).detach().cpu()


def _delegate(module, implementation: str) -> Callable:
    return hf.attention_kernel(module, implementation)


def _probe_attention(implementation: str) -> Callable:
    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        probe = getattr(module, "_ropekit_entropy_probe", None)
        if probe is not None:
            with torch.no_grad():
                probe.observe(module, query, key, attention_mask, scaling, kwargs, implementation)
        return _delegate(module, implementation)(module, query, key, value, attention_mask, scaling=scaling,
                                                  dropout=dropout, **kwargs)

    attention.__name__ = f"{PROBE_PREFIX}{implementation}"
    attention.__doc__ = f"Measure attention entropy, then run '{implementation}' unchanged."
    return attention


def _register_probe(implementation: str) -> str:
    """Register (once) the probing attention wrapping ``implementation``, with that implementation's mask."""
    name = PROBE_PREFIX + implementation
    if hf.registered_attention(name) is None:
        if not hf.has_attention_kernel(implementation):
            raise RopekitError(
                f"attention entropy cannot wrap the attention implementation '{implementation}'",
                "load the model with the sdpa or eager attention implementation",
            )
        # with the wrapped implementation's mask builder: without one transformers would pass no mask at all
        hf.register_attention(name, _probe_attention(implementation), mask_like=implementation)
    return name


@contextmanager
def _probing(model, rows: list[int], chunk: int | None, queries: int) -> Iterator[_Probe]:
    implementation = hf.attn_implementation(model.config) or "sdpa"
    if implementation.startswith(PROBE_PREFIX):
        raise RuntimeError("attention entropy is already being measured on this model")
    modules = attention_modules(model)
    if not modules:
        raise RopekitError("found no attention layers to measure in this model", "measure a transformers RoPE model")
    probe = _Probe(rows, chunk, queries)
    model.set_attn_implementation(_register_probe(implementation))
    for module in modules:
        module._ropekit_entropy_probe = probe
    try:
        yield probe
    finally:
        for module in modules:
            del module._ropekit_entropy_probe
        model.set_attn_implementation(implementation)


def attention_entropy(
    model, input_ids: torch.Tensor, *, positions: list[int] | None = None, chunk: int | None = None
) -> dict[str, Any]:
    """Entropy of every layer's and head's attention at query ``positions`` of one input (batch of one).

    ``positions`` defaults to :func:`log_positions` of the input length; ``chunk`` is the number of query
    rows whose logits are formed at once (default: as many as fit in :data:`CHUNK_ELEMENTS`). Returns
    ``positions``, ``entropy`` and ``normalised`` (float64 tensors ``(layers, heads, positions)``, nats and
    fraction of ``ln k``) and ``keys`` (``(layers, heads, positions)``, the keys each query attends in that
    layer and head: the ``k`` of ``normalised``). Positions are positions of ``input_ids``, also where the
    model inserts tokens of its own (Landmark; module docstring).
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError("attention_entropy measures one input: pass input_ids of shape (1, n)")
    n = input_ids.shape[1]
    rows = list(positions) if positions is not None else log_positions(n)
    if not rows or min(rows) < 0 or max(rows) >= n or rows != sorted(set(rows)):
        raise RopekitError(f"query positions must be increasing and within [0, {n})", "pass positions inside the input")
    if chunk is not None and chunk < 1:
        raise RopekitError(f"chunk {chunk} is not positive", "pass chunk ≥ 1 (query rows per block)")
    internal, queries = _query_rows(model, input_ids, rows)
    device = next(model.parameters()).device
    ids = input_ids.to(device)
    with _probing(model, internal, chunk, queries) as probe, torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, logits_to_keep=1)
    layers = sorted(probe.entropy)
    expected = len(attention_modules(model))
    if len(layers) != expected:  # a layer that bypasses AttentionInterface would silently be missing
        raise RopekitError(
            f"only {len(layers)} of {expected} attention layers went through transformers' attention function",
            "measure a model whose layers all use AttentionInterface (Llama, Mistral, Qwen2/3, Phi-3, GPT-NeoX)",
        )
    entropy = torch.stack([probe.entropy[l][0] for l in layers]).double()  # (layers, heads, positions)
    keys = torch.stack([probe.keys[l][0] for l in layers])  # (layers, heads, positions): per head, per query
    ceiling = torch.log(keys.double().clamp_min(1))
    normalised = torch.where(ceiling > 0, entropy / ceiling.clamp_min(1e-300), torch.zeros_like(entropy))
    return {"positions": rows, "entropy": entropy, "normalised": normalised, "keys": keys}


def _query_rows(model, input_ids: torch.Tensor, rows: list[int]) -> tuple[list[int], int]:
    """The query rows the attention layers give input positions ``rows``, and how many queries they receive.

    The input's own positions, except under Landmark attention (module docstring): its decoder hook inserts a
    landmark after every ``mem_freq`` tokens (Mohtashami & Jaggi 2023 §3), so input token ``t`` is the row of
    :func:`~ropekit.methods.landmark_layout.landmark_layout` whose source is ``t`` and that is no landmark.
    """
    n = input_ids.shape[1]
    settings = getattr(getattr(model, "base_model", model), LANDMARK_SETTINGS_ATTR, None)
    if settings is None:
        return rows, n
    mem_freq, token_id = settings
    if bool((input_ids == token_id).any()):
        raise RopekitError(
            f"the input already holds the landmark token (id {token_id}), so its positions are not text positions",
            "pass plain token ids: the model inserts the landmarks itself",
        )
    source, is_landmark, _ = landmark_layout(n, mem_freq)
    text_row = torch.empty(n, dtype=torch.long)
    text_row[source[~is_landmark]] = torch.nonzero(~is_landmark).flatten()
    return [int(text_row[t]) for t in rows], int(source.numel())


# ---- inputs ---------------------------------------------------------------------------------------
def document_ids(tokenizer, length: int, sample: int, seed: int) -> tuple[list[int], int]:
    """``length`` token ids of prose sample ``sample`` and the index of its first paragraph.

    The start paragraph is drawn with ``random.Random`` seeded by ``(seed, sample)`` — independent of the
    length, so the inputs of one sample are prefixes of one text; paragraphs follow in order (cycling the
    corpus) until the text holds ``length`` tokens. The tokenizer's BOS, if any, comes first.
    """
    from ..data.prose import prose_paragraphs

    paragraphs = prose_paragraphs()
    start = random.Random(f"entropy-{seed}-{sample}").randrange(len(paragraphs))
    chars = 4 * length + 64
    while True:
        parts, total, i = [], 0, start
        while total < chars:
            parts.append(paragraphs[i % len(paragraphs)])
            total += len(parts[-1]) + 1
            i += 1
        ids = encode(tokenizer, " ".join(parts), add_special_tokens=True)
        if len(ids) >= length:
            return ids[:length], start
        chars *= 2


def _rounded(t: torch.Tensor) -> list:
    return [_rounded(x) for x in t] if t.dim() > 0 else float(f"{float(t):.{DIGITS}g}")


# ---- the task ---------------------------------------------------------------------------------------
def check_options(*, lengths: list[int] | None = None, samples: int = 4, plot: str | None = None,
                  positions: int = QUERY_POSITIONS, chunk: int | None = None) -> None:
    """Refuse what is wrong whatever the model (:mod:`ropekit.eval.common`)."""
    whole_number(samples, "--samples")
    whole_number(positions, "positions", minimum=2, example="P")
    if chunk is not None:
        whole_number(chunk, "chunk", example="C")
    if lengths is not None:
        token_lengths(lengths)


def run(
    ctx: EvalContext,
    *,
    lengths: list[int] | None = None,
    samples: int = 4,
    plot: str | None = None,
    positions: int = QUERY_POSITIONS,
    chunk: int | None = None,
) -> None:
    """Measure ``samples`` prose inputs at every length (default: the model's window); optionally plot.

    ``positions`` is the number of query positions per input (a log grid when the input is longer),
    ``chunk`` the query rows per logit block (API only; the CLI uses the defaults).
    """
    from ..data.prose import PROSE_SOURCE, prose_digest

    tokenizer = require_tokenizer(ctx.tokenizer, "entropy")
    check_options(lengths=lengths, samples=samples, plot=plot, positions=positions, chunk=chunk)
    if lengths is None:  # the window of the model as evaluated, the extended one with a method installed
        from ..install import rope_info

        lengths = [rope_info(ctx.model).window]
    ctx.set_total(len(lengths) * samples)
    digest = prose_digest()
    for length in lengths:
        grid = log_positions(length, positions)
        for sample in range(samples):
            key = ctx.key(length, sample=sample)
            if ctx.done(key):
                continue
            with timer() as elapsed:
                ids, paragraph = document_ids(tokenizer, length, sample, ctx.seed)
                got = attention_entropy(ctx.model, torch.tensor([ids]), positions=grid, chunk=chunk)
            entropy, normalised = got["entropy"], got["normalised"]
            uniform = torch.log(got["keys"].double().clamp_min(1))  # ln k: each entropy's uniform ceiling
            ctx.write(
                key,
                positions=grid,
                entropy=_rounded(entropy),
                normalised=_rounded(normalised),
                keys=got["keys"].tolist(),
                entropy_last=float(entropy[:, :, -1].mean()),
                normalised_last=float(normalised[:, :, -1].mean()),
                uniform_last=float(uniform[:, :, -1].mean(dim=1).max()),
                layer_entropy_last=[float(x) for x in entropy[:, :, -1].mean(dim=1)],
                layer_uniform_last=[float(x) for x in uniform[:, :, -1].mean(dim=1)],
                tokens=len(ids),
                paragraph=paragraph,
                source=PROSE_SOURCE,
                prose_digest=digest,
                seconds=elapsed(),
            )
    if plot:
        plot_entropy([r for r in ctx.writer.records() if r.get("task") == ctx.task], plot)


def _groups(records: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        label = r.get("method", "plain") + (f" {r['params']}" if r.get("params") else "")
        groups.setdefault((label, r["length"]), []).append(r)
    return groups


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per length (per method too when the records hold several): mean over samples, layers and
    heads of the entropy and the normalised entropy at the last position, the mean over samples of the records'
    ``uniform_last`` (the largest per-layer uniform ceiling ``ln k`` at the last position, ``k`` per head: no
    entropy of the row exceeds it — ``ln n`` for causal attention, the global layers' on Gemma 3; ``None`` when a
    record predates the field), then the mean over heads and samples at the last position of at most five
    layers (``layer_0``, ``layer_1``, evenly spaced ones, the last — :func:`shown_layers`; every layer, and its
    own ceiling, is in the records' ``layer_entropy_last`` and ``layer_uniform_last``), and the number of
    samples."""
    groups = _groups(records)
    several = len({label for label, _ in groups}) > 1
    rows = []
    for (label, length), recs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        row: dict[str, Any] = {"method": label} if several else {}
        row["length"] = length
        row["entropy_last"] = mean(r["entropy_last"] for r in recs)
        row["normalised_last"] = mean(r["normalised_last"] for r in recs)
        ceilings = [r.get("uniform_last") for r in recs]
        row["uniform_last"] = mean(ceilings) if all(c is not None for c in ceilings) else None
        per_layer = [r["layer_entropy_last"] for r in recs]
        for layer in shown_layers(min(len(p) for p in per_layer)):
            row[f"layer_{layer}"] = mean(p[layer] for p in per_layer)
        row["n"] = len(recs)
        rows.append(row)
    return rows


def shown_layers(n_layers: int, most: int = 5) -> list[int]:
    """The layers a summary or figure shows: all when there are at most ``most``, else 0 and 1 (where
    Entropy-ABF sees near-uniform attention), the last, and evenly spaced ones between."""
    if n_layers <= most:
        return list(range(n_layers))
    inner = most - 3
    picked = {0, 1, n_layers - 1}
    picked.update(int(round(1 + k * (n_layers - 2) / (inner + 1))) for k in range(1, inner + 1))
    return sorted(picked)


def plot_entropy(records: list[dict[str, Any]], path: str) -> str:
    """Entropy-ABF (Entropy-ABF, Zhang et al. 2024) Fig. 1 style: (a) entropy at the last query position vs context length, one
    line per shown layer, mean over heads and samples, with the uniform ceiling ``ln n``; (b) entropy vs
    query position at the longest length, same layers, with ``ln(i+1)``. Written as PNG to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    if not records:
        raise RopekitError("no entropy records to plot", "run the evaluation first (or check --out)")
    labels = sorted({r.get("method", "plain") + (f" {r['params']}" if r.get("params") else "") for r in records})
    label = labels[0]
    recs = [r for r in records if r.get("method", "plain") + (f" {r['params']}" if r.get("params") else "") == label]
    lengths = sorted({r["length"] for r in recs})
    n_layers = min(len(r["entropy"]) for r in recs)
    shown = shown_layers(n_layers, most=6)

    fig, (ax_len, ax_pos) = plt.subplots(1, 2, figsize=(11, 4.2))
    for layer in shown:
        ys = [np.mean([np.mean([head[-1] for head in r["entropy"][layer]]) for r in recs if r["length"] == n])
              for n in lengths]
        ax_len.plot(lengths, ys, marker="o", label=f"layer {layer}")
    ax_len.plot(lengths, [math.log(n) for n in lengths], color="grey", linestyle="--", label="uniform (ln n)")
    ax_len.set_xscale("log", base=2)
    ax_len.set_xlabel("context length (tokens)")
    ax_len.set_ylabel("attention entropy at the last position (nats)")
    ax_len.set_title("entropy vs context length")
    ax_len.legend(fontsize=8)

    longest = [r for r in recs if r["length"] == lengths[-1]]
    positions = longest[0]["positions"]
    xs = [p + 1 for p in positions]
    for layer in shown:
        curve = np.mean([np.mean(np.array(r["entropy"][layer]), axis=0) for r in longest], axis=0)
        ax_pos.plot(xs, curve, label=f"layer {layer}")
    ax_pos.plot(xs, [math.log(x) for x in xs], color="grey", linestyle="--", label="uniform (ln(i+1))")
    ax_pos.set_xscale("log", base=2)
    ax_pos.set_xlabel("query position i + 1")
    ax_pos.set_ylabel("attention entropy (nats)")
    ax_pos.set_title(f"entropy vs query position ({lengths[-1]} tokens)")
    ax_pos.legend(fontsize=8)
    fig.suptitle(f"attention entropy — {label} (mean over heads and samples; {len(longest)} at {lengths[-1]} tokens)")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path


#: The task's figure under the name the task registry expects (``run``'s ``plot`` option shadows it there).
plot = plot_entropy
