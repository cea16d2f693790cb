"""CLEX in padded batches and in cached decoding, against independent references.

* Batches: ``t = n/C`` is the row's own length (CLEX, arXiv 2310.16450 §3.3: the scale is derived from the
  sequence length), so every row of a left- or right-padded batch (positions ``cumsum(mask) − 1``, as
  ``generate`` numbers them) equals the same row run alone, and a row inside the window equals the plain
  model, whatever its batch-mates' lengths — for a forward and for batched greedy generation.
* Cached decoding: CLEX's reference code (DAMO-NLP-SG/CLEX, ``modeling_llama_clex.py``) caches keys before
  RoPE and re-rotates them at every step; here the cache holds rotated keys. The documented behaviour, checked
  against full forwards without a cache: decode steps whose scale equals the scale of the cached keys
  (inside the window; ``'ceil'`` between two multiples of ``C``) equal the full forward; a step whose scale
  moved differs, and the first one warns once per process — never inside the window or without a cache.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import ropekit
from ropekit.core.hf_compat import cache_argument, output_cache
from ropekit.methods import clex_ode
from ropekit.methods.clex_ode import CLEXFrequencies
from ropekit.models.tiny import TINY_WINDOW, build_tiny_model

C = TINY_WINDOW
TOL = 2e-5  # float32 noise of a padded batch; the plain model's is ~1e-7


def _clex_model(**params):
    """Tiny Llama with CLEX (t_max = 4) and a random ``W_down`` (zero at init), so that the learned part matters."""
    model = ropekit.extend(build_tiny_model("llama"), "clex", **{"max_factor": 4, "time_dt": 0.05, **params})
    (module,) = [m for m in model.modules() if isinstance(m, CLEXFrequencies)]
    with torch.no_grad():
        module.down_proj.copy_(torch.randn(module.down_proj.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    return model.eval()


def _padded(rows: list[torch.Tensor], side: str):
    """``(ids, mask, position_ids)`` of ``rows`` padded to the longest, positions ``cumsum(mask) − 1`` (pads: 0)."""
    width = max(r.numel() for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        cols = slice(width - r.numel(), width) if side == "left" else slice(0, r.numel())
        ids[i, cols], mask[i, cols] = r, 1
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    return ids, mask, positions


def _real(logits: torch.Tensor, n: int, width: int, side: str) -> torch.Tensor:
    return logits[width - n:] if side == "left" else logits[:n]


@pytest.fixture
def no_warning_yet(monkeypatch):
    """A fresh process as far as the once-per-process warning goes."""
    monkeypatch.setattr(clex_ode, "_STALE_KEYS_WARNED", False, raising=False)


def _clex_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith("clex:")]


# ---- padded batches ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("side", ["left", "right"])
def test_each_row_of_a_padded_batch_equals_the_row_alone(side, make_ids):
    """Rows of 40 (< C), 100 (t = 1.56) and 200 (t = 3.13) tokens batched; the reference for each is the row run
    alone, and for the row inside the window also the plain model."""
    model, plain = _clex_model(), build_tiny_model("llama")
    rows = [make_ids(40, seed=1)[0], make_ids(100, seed=2)[0], make_ids(200, seed=3)[0]]
    ids, mask, positions = _padded(rows, side)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask, position_ids=positions).logits
        alone = [model(r[None]).logits[0] for r in rows]
        plain_short = plain(rows[0][None]).logits[0]
    for i, r in enumerate(rows):
        got = _real(batched[i], r.numel(), ids.shape[1], side)
        assert (got - alone[i]).abs().max() < TOL, (side, r.numel())
    assert (_real(batched[0], 40, ids.shape[1], side) - plain_short).abs().max() < TOL
    # the check can fail: the 100-token row at the 200-token row's scale, and the 40-token row at the 100-token
    # row's, are far from themselves
    assert (_run_at_length(model, rows[1], 200) - alone[1]).abs().max() > 50 * TOL
    assert (_run_at_length(model, rows[0], 100) - alone[0]).abs().max() > 50 * TOL


def _run_at_length(model, row: torch.Tensor, length: int) -> torch.Tensor:
    """``row``'s logits with the rotary module forced to the scale of ``length`` tokens (the reference for "ran at
    another row's scale"): the same ODE frequencies, fixed, through transformers' own rotary module."""
    (module,) = [m for m in model.modules() if isinstance(m, CLEXFrequencies)]
    reference = build_tiny_model("llama")
    reference.model.rotary_emb.inv_freq = module.inv_freq_for_length(length, reference.model.rotary_emb.inv_freq)
    with torch.no_grad():
        return reference(row[None]).logits[0]


def test_batched_generation_equals_each_row_generated_alone(make_ids, no_warning_yet):
    """Left-padded greedy generation of a 40-token and a 100-token prompt: each row's tokens and step logits equal
    that prompt generated alone (each decode step at the row's own length), the short row's those of the plain model."""
    model, plain = _clex_model(), build_tiny_model("llama")
    prompts = [make_ids(40, seed=4)[0], make_ids(100, seed=5)[0]]
    ids, mask, _ = _padded(prompts, "left")
    kwargs = {"max_new_tokens": 30, "do_sample": False, "pad_token_id": 0, "output_logits": True,
              "return_dict_in_generate": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the long row's decode warns (tested below)
        batched = model.generate(ids, attention_mask=mask, **kwargs)
        alone = [model.generate(p[None], attention_mask=torch.ones(1, p.numel(), dtype=torch.long), **kwargs)
                 for p in prompts]
        plain_short = plain.generate(prompts[0][None], attention_mask=torch.ones(1, 40, dtype=torch.long), **kwargs)
    for i, one in enumerate(alone):
        assert torch.equal(batched.sequences[i, ids.shape[1]:], one.sequences[0, prompts[i].numel():]), i
        steps = torch.stack([step[i] for step in batched.logits])
        assert (steps - torch.stack([step[0] for step in one.logits])).abs().max() < TOL, i
    # the short row stays inside the window up to 70 tokens: the plain model's generation
    assert torch.equal(batched.sequences[0, ids.shape[1]:], plain_short.sequences[0, 40:])


# ---- cached decoding --------------------------------------------------------------------------------------
def _decode_against_full(model, ids: torch.Tensor, prefill: int):
    """Per length ``n`` (prefill + 1 … len(ids)): ``(n, max|Δ|)`` between the logits of the cached decode step that
    reaches ``n`` and a full forward of the first ``n`` tokens without a cache, and the ``clex:`` warnings each
    step gave."""
    argument = cache_argument(model)
    rows = []
    with torch.no_grad():
        out = model(ids[:, :prefill], use_cache=True)
        cache = output_cache(out)
        for n in range(prefill + 1, ids.shape[1] + 1):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                step = model(ids[:, n - 1:n], position_ids=torch.tensor([[n - 1]]), use_cache=True,
                             **{argument: cache})
            cache = output_cache(step)
            full = model(ids[:, :n], use_cache=False).logits[0, -1]
            rows.append((n, float((step.logits[0, -1] - full).abs().max()), _clex_warnings(caught)))
    return rows


def _sharp(model):
    """Scale q/k up so that positions weigh more in the logits (a clearer signal of the key rotations)."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4)
            layer.self_attn.k_proj.weight.mul_(4)
    return model


def test_ceil_decoding_is_exact_between_multiples_of_the_window_and_warns_at_the_crossing(make_ids, no_warning_yet):
    """``'ceil'``: prefill of C + 10 tokens runs at t = 2; every step up to 2C equals the full forward; the step to
    2C + 1 moves to t = 3 while the cached keys stay at t = 2 — it differs, and warns, once."""
    model = _sharp(_clex_model(inference_scale="ceil"))
    ids = make_ids(2 * C + 12, seed=6)
    rows = _decode_against_full(model, ids, C + 10)
    for n, delta, said in rows:
        if n <= 2 * C:
            assert delta < TOL and not said, (n, delta, said)
    crossing = [(n, delta, said) for n, delta, said in rows if n > 2 * C]
    assert len(crossing[0][2]) == 1 and "use_cache=False" in crossing[0][2][0] and "ceil" in crossing[0][2][0]
    assert "\n" not in crossing[0][2][0]
    assert all(not said for _, _, said in crossing[1:])  # once per process
    assert all(delta > 50 * TOL for _, delta, _ in crossing)  # the documented difference


def test_continuous_decoding_is_exact_inside_the_window_and_warns_on_the_first_step_past_it(make_ids, no_warning_yet):
    """``'continuous'``: t = n/C moves at every length past C. Steps up to C equal the full forward (plain model)
    and say nothing; the step to C + 1 differs and warns; later steps differ and stay silent."""
    model = _sharp(_clex_model())
    ids = make_ids(C + 12, seed=7)
    rows = _decode_against_full(model, ids, C - 10)
    inside = [r for r in rows if r[0] <= C]
    assert len(inside) == 10 and all(delta < TOL and not said for _, delta, said in inside)
    past = [r for r in rows if r[0] > C]
    assert past[0][0] == C + 1 and len(past[0][2]) == 1 and f"length {C + 1}" in past[0][2][0]
    assert all(not said for _, _, said in past[1:])
    assert max(delta for _, delta, _ in past) > 50 * TOL


def test_no_warning_without_a_cache_or_when_the_scale_does_not_move(make_ids, no_warning_yet):
    """Full forwards past the window, a prefill past t_max·C and its decode steps (t stays at t_max: exact), and
    a fresh prefill never warn."""
    model = _clex_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            model(make_ids(3 * C + 5))
            model(make_ids(C + 1), use_cache=False)
        rows = _decode_against_full(model, make_ids(4 * C + 8, seed=8), 4 * C + 2)  # t = t_max = 4 throughout
    assert not _clex_warnings(caught) and not any(said for *_, said in rows)
    assert all(delta < TOL for _, delta, _ in rows)
    assert clex_ode._STALE_KEYS_WARNED is False
