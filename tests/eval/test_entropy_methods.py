"""`ropekit eval entropy` under methods that change the token sequence or the mask per head, and on a model whose
layers see different numbers of keys — each against a naive O(n²) reference written here:

* Landmark attention (Mohtashami & Jaggi 2023, arXiv 2305.16300 §3): the decoder inserts a landmark after every
  ``mem_freq`` tokens, so input token ``t`` is row ``t + ⌊t/mem_freq⌋`` of every layer; the entropy of that row's
  grouped softmax (§3.1), computed here key by key from the queries and keys the layer received;
* LongLoRA's S²-Attn in training mode (Chen et al. 2024, §3.2): half the heads attend in groups shifted by half a
  group, so each head sees its own number of keys and is normalised by its own ``ln k``;
* Gemma 3 (sliding-window and global layers): each layer's own ceiling, and a summary ceiling no layer exceeds.
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from attention_probe import attend_probabilities, entropy_of, sharpened  # tests/eval is on sys.path

from ropekit.attention.interface import attention_modules
from ropekit.errors import RopekitError
from ropekit.eval import entropy as task
from ropekit.eval.common import make_context
from ropekit.install import extend
from ropekit.methods.landmark_layout import insert_landmarks
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model

LANDMARK = "landmark"
MEM_FREQ = 7


def layer_inputs(model, ids) -> list[dict]:
    """What every layer's replacement attention receives in one plain forward of a copy of ``model``: the rotated
    queries and keys, the scale, and (Landmark) which keys are landmark tokens. No entropy code runs here."""
    ref = copy.deepcopy(model)
    seen: dict[int, dict] = {}
    for module in attention_modules(ref):
        inner = module.ropekit_attend

        def recorder(mod, q, k, v, mask, *, scaling, _inner=inner, **kw):
            marks = next((x for x in kw.values() if hasattr(x, "is_landmark")), None)
            seen[mod.layer_idx] = {
                "q": q[0].double(), "k": k[0].double(), "scale": float(scaling),
                "landmark": None if marks is None else marks.is_landmark[0].tolist(),
            }
            return _inner(mod, q, k, v, mask, scaling=scaling, **kw)

        module.ropekit_attend = recorder
    with torch.no_grad():
        ref(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return [seen[i] for i in sorted(seen)]


def entropy_of_weights(weights: dict[int, float]) -> tuple[float, int]:
    """``−Σ w ln w`` over the keys given a weight, and their number (the uniform ceiling's ``k``)."""
    return -sum(w * math.log(w) for w in weights.values() if w > 0), len(weights)


def softmax_weights(logits: torch.Tensor, keys: list[int]) -> dict[int, float]:
    """Plain softmax over ``keys`` (float64, one row)."""
    s = [float(logits[j]) for j in keys]
    top = max(s)
    e = [math.exp(x - top) for x in s]
    total = sum(e)
    return {j: x / total for j, x in zip(keys, e)}


def logits_row(layer: dict, head: int, row: int) -> torch.Tensor:
    q, k = layer["q"], layer["k"]
    kv = head // (q.shape[0] // k.shape[0])  # grouped-query attention: query heads share KV heads in order
    return (k[kv] @ q[head, row]) * layer["scale"]


# ---- Landmark ---------------------------------------------------------------------------------------------
def grouped_softmax_weights(logits: torch.Tensor, is_landmark: list[bool], row: int) -> dict[int, float]:
    """Landmark's grouped softmax (arXiv 2305.16300 §3.1) for query ``row``, key by key over the keys ``≤ row``:
    the query's own block and the landmarks of earlier blocks share one softmax; each earlier block's landmark
    weight is shared out over that block's tokens by a softmax within the block; landmarks get no weight."""
    block, count = [], 0
    for flag in is_landmark:  # block of a key: landmarks strictly before it
        block.append(count)
        count += int(flag)
    own = block[row]
    main = [j for j in range(row + 1)
            if (block[j] == own and not is_landmark[j]) or (is_landmark[j] and block[j] < own)]
    shares = softmax_weights(logits, main)
    weights = {j: shares[j] for j in main if not is_landmark[j]}
    for gate in (j for j in main if is_landmark[j]):
        members = [j for j in range(row + 1) if block[j] == block[gate] and not is_landmark[j]]
        for j, w in softmax_weights(logits, members).items():
            weights[j] = shares[gate] * w
    return weights


def test_landmark_entropy_is_measured_at_the_rows_of_the_input_tokens(make_ids):
    """Training mode (the grouped softmax over every block): the entropy reported for input position ``t`` is that
    of internal row ``t + ⌊t/mem_freq⌋`` — never a landmark's row — so the last position is the last input token."""
    model = sharpened("llama")
    extend(model, LANDMARK, mem_freq=MEM_FREQ)
    model.train()
    n = 66  # 9 landmarks, the last block partial
    ids = make_ids(n, seed=11)
    got = task.attention_entropy(model, ids, positions=list(range(n)), chunk=13)

    layers = layer_inputs(model, ids)
    inserted = n + n // MEM_FREQ
    assert all(layer["q"].shape[1] == inserted for layer in layers)  # the layers see the landmarks too
    heads = layers[0]["q"].shape[0]
    want_h = torch.zeros(len(layers), heads, n, dtype=torch.float64)
    want_k = torch.zeros(len(layers), heads, n, dtype=torch.long)
    for l, layer in enumerate(layers):
        assert sum(layer["landmark"]) == n // MEM_FREQ
        for h in range(heads):
            for t in range(n):
                row = t + t // MEM_FREQ  # t tokens before it, and a landmark after each MEM_FREQ of them
                assert not layer["landmark"][row]
                weights = grouped_softmax_weights(logits_row(layer, h, row), layer["landmark"], row)
                assert math.isclose(sum(weights.values()), 1.0, rel_tol=1e-9)  # every gate visible: sums to one
                want_h[l, h, t], want_k[l, h, t] = entropy_of_weights(weights)
    assert torch.allclose(got["entropy"], want_h, atol=2e-4), (got["entropy"] - want_h).abs().max()
    assert torch.equal(got["keys"], want_k)
    assert torch.equal(want_k[0, 0], torch.arange(1, n + 1))  # every earlier text token, no landmark
    want_norm = torch.where(want_k > 1, want_h / torch.log(want_k.double()), torch.zeros_like(want_h))
    assert torch.allclose(got["normalised"], want_norm, atol=2e-4)
    # the comparison is a sensitive one: the rows of the longer sequence at the same indices differ
    wrong = torch.tensor([[[entropy_of_weights(grouped_softmax_weights(logits_row(layer, h, t), layer["landmark"], t))[0]
                            for t in range(n)]
                           for h in range(heads)]
                          for layer in layers], dtype=torch.float64)
    assert float((wrong[..., -10:] - want_h[..., -10:]).abs().max()) > 0.05


def test_landmark_retrieval_rows_are_the_input_tokens(make_ids):
    """Eval mode (top-k retrieval, §3.2): the reported positions are the input tokens' rows there too. The reference
    here is the layer's own attention output with one-hot values (its output *is* its attention matrix), read at
    row ``t + ⌊t/mem_freq⌋``; its entropy and support are computed here."""
    model = sharpened("llama", gain=3.0)
    extend(model, LANDMARK, mem_freq=MEM_FREQ, top_k=1, local_blocks=1)
    n = 64
    ids = make_ids(n, seed=12)
    positions = task.log_positions(n, 24)
    got = task.attention_entropy(model, ids, positions=positions)

    rows = [t + t // MEM_FREQ for t in positions]
    probs = attend_probabilities(model, ids)[:, :, rows].clamp_min(0)  # (layers, heads, positions, keys)
    want_h = entropy_of(probs)
    assert torch.allclose(got["entropy"], want_h, atol=2e-4), (got["entropy"] - want_h).abs().max()
    assert torch.equal(got["keys"], (probs > 0).sum(-1))
    # the last input token (63, first of block 9) keeps itself, one local block and one retrieved block: 1 + 7 + 7
    assert got["keys"][:, :, -1].unique().tolist() == [1 + 2 * MEM_FREQ]
    assert float(got["normalised"].max()) <= 1 + 1e-6


def test_landmark_input_holding_the_token_is_refused(make_ids):
    """Ids that already hold landmarks (here in the model's own layout, so the model runs them) are passed through
    by the model as they are: their positions are not text positions, so they are refused in one line."""
    model = build_tiny_model("llama")
    extend(model, LANDMARK, mem_freq=MEM_FREQ)
    token = model.get_input_embeddings().weight.shape[0] - 1  # the row the installation added
    ids = insert_landmarks(make_ids(28, seed=13), MEM_FREQ, token)
    assert ids.shape == (1, 32)
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)  # a valid input for the model itself
    with pytest.raises(RopekitError, match="already holds the landmark token") as info:
        task.attention_entropy(model, ids)
    assert "\n" not in str(info.value)
    assert model.config._attn_implementation.startswith("ropekit_")


def test_a_forward_that_adds_queries_is_refused(make_ids):
    """A layer receiving more queries than the input makes is refused, not measured at shifted rows."""
    plain = build_tiny_model("llama")

    def one_more_token(module, args, kwargs):
        ids = kwargs["input_ids"]
        kwargs["input_ids"] = torch.cat([ids[:, :1], ids], dim=1)
        kwargs["attention_mask"] = torch.ones_like(kwargs["input_ids"])
        return args, kwargs

    handle = plain.model.register_forward_pre_hook(one_more_token, with_kwargs=True)
    try:
        with pytest.raises(RopekitError, match="received 31 queries where the input makes 30") as info:
            task.attention_entropy(plain, make_ids(30, seed=13))
    finally:
        handle.remove()
    assert "\n" not in str(info.value)
    assert plain.config._attn_implementation == "sdpa"  # restored after the error


# ---- per-head key counts: S²-Attn ---------------------------------------------------------------------------
def test_s2_attn_heads_are_normalised_by_their_own_key_counts(make_ids):
    """LongLoRA in training mode: unshifted heads attend within groups ``[0, g), [g, 2g), …``, shifted heads within
    ``[0, g/2), [g/2, 3g/2), …`` (causal inside; Chen et al. 2024 §3.2, without wrap-around) — so a query sees
    different numbers of keys in the two halves of the heads, and each head is normalised by its own."""
    model = sharpened("llama")
    extend(model, "longlora", factor=2.0)
    model.train()
    n = 128
    ids = make_ids(n, seed=14)
    got = task.attention_entropy(model, ids, positions=list(range(n)), chunk=29)

    layers = layer_inputs(model, ids)
    heads = layers[0]["q"].shape[0]
    g = math.ceil(n / 4)
    half = g // 2

    def group(t: int, shifted: bool) -> int:
        if not shifted:
            return t // g
        return -1 if t < half else (t - half) // g

    want_h = torch.zeros(len(layers), heads, n, dtype=torch.float64)
    want_k = torch.zeros(len(layers), heads, n, dtype=torch.long)
    for l, layer in enumerate(layers):
        for h in range(heads):
            shifted = h >= heads // 2
            for i in range(n):
                keys = [j for j in range(i + 1) if group(j, shifted) == group(i, shifted)]
                want_h[l, h, i], want_k[l, h, i] = entropy_of_weights(softmax_weights(logits_row(layer, h, i), keys))
    assert torch.allclose(got["entropy"], want_h, atol=2e-4), (got["entropy"] - want_h).abs().max()
    assert want_k[0, 0, 40] == 40 - g + 1 and want_k[0, -1, 40] == 40 - half + 1  # the halves differ
    want_norm = torch.where(want_k > 1, want_h / torch.log(want_k.double()), torch.zeros_like(want_h))
    assert torch.allclose(got["normalised"], want_norm, atol=2e-4), (got["normalised"] - want_norm).abs().max()
    assert float(got["normalised"].max()) <= 1 + 1e-6
    assert torch.equal(got["keys"], want_k)


# ---- per-layer ceilings: Gemma 3 ----------------------------------------------------------------------------
def test_gemma3_summary_ceiling_covers_the_global_layers(tmp_path):
    """Gemma 3 alternates sliding-window and global layers: each layer's entropy is normalised by its own ``ln k``
    (the window, or the whole prefix), the records keep each layer's ceiling, and the summary's ``uniform_last`` is
    one no layer's entropy exceeds — the global layers' ``ln n``, not the first (sliding) layer's ``ln(window)``."""
    model, tok = build_tiny_model("gemma3_text"), byte_tokenizer()
    kinds, window = model.config.layer_types, model.config.sliding_window
    assert kinds[0] == "sliding_attention" and "full_attention" in kinds
    n = 96
    out = tmp_path / "entropy.jsonl"
    ctx = make_context("entropy", model, tok, method=None, params=None, lengths=[n], key_fields=task.KEY_FIELDS,
                       out=str(out))
    task.run(ctx, lengths=[n], samples=1)
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    [row] = task.summarize([record])
    assert row["uniform_last"] == pytest.approx(math.log(n))  # not ln(window) = ln 16
    assert max(record["layer_entropy_last"]) > math.log(window)  # a global layer is above the sliding window's ceiling
    assert all(h <= row["uniform_last"] + 1e-6 for h in record["layer_entropy_last"] + [row["entropy_last"]])

    # reference: eager attention's own probabilities (one softmax), and the keys each layer's mask admits
    ids, _ = task.document_ids(tok, n, 0, 0)
    ref = copy.deepcopy(model)
    ref.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = ref(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False).attentions
    positions = record["positions"]
    for l, probs in enumerate(attentions):
        p = probs[0].double()[:, positions]  # (heads, positions, keys)
        want_h = -(p * torch.log(torch.where(p > 0, p, torch.ones_like(p)))).sum(-1)
        seen = [min(i + 1, window) if kinds[l] == "sliding_attention" else i + 1 for i in positions]
        assert all(row == seen for row in record["keys"][l]), (l, record["keys"][l][0], seen)
        assert torch.allclose(torch.tensor(record["entropy"][l], dtype=torch.float64), want_h, atol=2e-4)
        want_norm = [float(h) / math.log(k) if k > 1 else 0.0 for h, k in zip(want_h[0], seen)]
        assert record["normalised"][l][0] == pytest.approx(want_norm, abs=2e-4)
        assert record["layer_uniform_last"][l] == pytest.approx(math.log(seen[-1]))
        assert record["layer_entropy_last"][l] <= record["layer_uniform_last"][l] + 1e-6
