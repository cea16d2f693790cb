"""LongRoPE's start tokens n̂ (Ding et al. 2024, §3.2: ``I(λ_i, n̂) = 1`` for ``n < n̂``, ``1/λ_i`` beyond).

The reference is written out here independently of ropekit: per-position cos/sin in float64 from the formula
(positions below n̂: the original RoPE ``m·θ_i`` with no attention factor, as microsoft/LongRoPE's
``MixedLongRoPEScaledRotaryEmbedding`` copies the original embeddings; from n̂ on: ``a·cos(m·θ_i/λ_i)``), and a
tiny model whose rotary module returns exactly those numbers. n̂ = 0 is transformers' own ``longrope``.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropekit
from ropekit import RopekitError
from ropekit.core.hf_compat import cache_argument, output_cache
from ropekit.models.tiny import build_tiny_model

WINDOW = 128
THETA = 10000.0
LONG = [1.0, 1.3, 1.7, 2.2, 2.8, 3.3, 3.8, 4.0]  # one λ per rotary pair of the tiny Llama (head size 16)
SHORT = [1.0, 1.0, 1.0, 1.05, 1.1, 1.2, 1.2, 1.3]
FACTOR = 4.0
ATTENTION = math.sqrt(1 + math.log(FACTOR) / math.log(WINDOW))  # LongRoPE's default magnitude


def _models(start_tokens: int, short=None):
    model = build_tiny_model("llama", seed=3, window=WINDOW)
    plain = copy.deepcopy(model)
    params = {"long_factor": LONG, "factor": FACTOR, **({"short_factor": short} if short else {})}
    if start_tokens is not None:
        params["start_tokens"] = start_tokens
    return ropekit.extend(model, "longrope", **params), plain


def _naive(length: int, start_tokens: int, short=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (1, length, d) of the paper's formula in float64, the set chosen by the input length."""
    rescale = torch.tensor(LONG if length > WINDOW else (short or [1.0] * len(LONG)), dtype=torch.float64)
    d = 2 * len(LONG)
    theta = THETA ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    m = torch.arange(length, dtype=torch.float64)[:, None]
    kept = m < start_tokens
    angles = torch.where(kept, m * theta, m * theta / rescale)
    magnitude = torch.where(kept, torch.ones(()), torch.full((), ATTENTION, dtype=torch.float64))
    emb = torch.cat((angles, angles), dim=-1)
    return (emb.cos() * magnitude)[None], (emb.sin() * magnitude)[None]


class _HandBuiltRotary(torch.nn.Module):
    """A rotary module returning the naive formula's cos/sin (rounded once to float32)."""

    def __init__(self, start_tokens: int, short=None):
        super().__init__()
        self.start_tokens, self.short = start_tokens, short
        self.inv_freq = torch.nn.Buffer(torch.ones(len(LONG)), persistent=False)

    def forward(self, x, position_ids):
        cos, sin = _naive(int(position_ids.max()) + 1, self.start_tokens, self.short)
        index = position_ids[0].long()
        return cos[:, index].to(x.dtype), sin[:, index].to(x.dtype)


def _reference(plain, start_tokens: int, short=None):
    reference = copy.deepcopy(plain)
    reference.model.rotary_emb = _HandBuiltRotary(start_tokens, short)
    return reference


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _ids(length, seed=0):
    return torch.randint(3, 250, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("length", [100, 300])
@pytest.mark.parametrize("start_tokens", [1, 8, 64])
def test_positions_below_n_hat_rotate_unscaled_and_the_rest_scaled(start_tokens, length):
    model, plain = _models(start_tokens, short=SHORT)
    x, positions = torch.zeros(1, length, 16), torch.arange(length)[None]
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(x, positions)
        plain_cos, plain_sin = plain.model.rotary_emb(x, positions)
    naive_cos, naive_sin = _naive(length, start_tokens, SHORT)
    # float32 angles up to 300 rad: about 300·2^-24 of rounding
    torch.testing.assert_close(cos.double(), naive_cos, atol=5e-5, rtol=0)
    torch.testing.assert_close(sin.double(), naive_sin, atol=5e-5, rtol=0)
    # below n̂ it is the plain model's own rotation, bit for bit
    assert torch.equal(cos[:, :start_tokens], plain_cos[:, :start_tokens])
    assert torch.equal(sin[:, :start_tokens], plain_sin[:, :start_tokens])
    # and n̂ changes nothing from n̂ on: the same as longrope without start tokens
    without, _ = _models(0, short=SHORT)
    with torch.no_grad():
        cos0, sin0 = without.model.rotary_emb(x, positions)
    assert torch.equal(cos[:, start_tokens:], cos0[:, start_tokens:])
    assert torch.equal(sin[:, start_tokens:], sin0[:, start_tokens:])


@pytest.mark.parametrize("length", [100, 300])
def test_logits_equal_a_hand_built_reference_model(length):
    model, plain = _models(8, short=SHORT)
    ids = _ids(length, seed=length)
    # measured: 1.8e-7 (100 tokens) and 2.1e-7 (300) — float32 rounding of the angles
    torch.testing.assert_close(_logits(model, ids), _logits(_reference(plain, 8, SHORT), ids), atol=2e-6, rtol=0)
    # n̂ matters: the same model without start tokens differs by 2.4e-3 / 3.2e-3
    without, _ = _models(0, short=SHORT)
    assert (_logits(without, ids) - _logits(model, ids)).abs().max() > 1e-3


def test_n_hat_zero_is_todays_longrope_bit_for_bit_and_transformers_own():
    model, plain = _models(0)
    default, _ = _models(None)  # start_tokens not given
    assert model.config.ropekit["params"]["start_tokens"] == 0
    assert not model.model.rotary_emb._forward_hooks  # no per-position hook at n̂ = 0
    config = copy.deepcopy(plain.config)
    config.rope_parameters = {"rope_type": "longrope", "rope_theta": THETA, "factor": FACTOR, "long_factor": LONG,
                              "short_factor": [1.0] * len(LONG), "original_max_position_embeddings": WINDOW}
    config.max_position_embeddings = int(WINDOW * FACTOR)
    native = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    native.load_state_dict(plain.state_dict())
    for length in (100, 300):
        ids = _ids(length, seed=length)
        got = _logits(model, ids)
        assert torch.equal(got, _logits(default, ids))
        assert torch.equal(got, _logits(native, ids))


@pytest.mark.parametrize("prompt,steps", [(4, 20), (200, 12)])
def test_cached_generation_equals_the_uncached_loop(prompt, steps):
    """Angles depend only on the absolute position: a cache crossing n̂ (4 → 24 with n̂ = 8) or past the window
    (one set throughout) gives the uncached log-probabilities."""
    model, _ = _models(8, short=SHORT)
    ids = _ids(prompt, seed=prompt)
    gaps = []
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        argument = cache_argument(model)
        for _ in range(steps):
            step = out.logits[:, -1:].argmax(-1)
            ids = torch.cat([ids, step], dim=1)
            out = model(input_ids=step, use_cache=True, **{argument: output_cache(out)})
            full = model(input_ids=ids).logits[:, -1]
            gaps.append(float((out.logits[:, -1].log_softmax(-1) - full.log_softmax(-1)).abs().max()))
    assert max(gaps) < 1e-5, gaps


def test_save_load_round_trip_uses_the_ropekit_format_and_refuses_per_pair_formats(tmp_path):
    model, _ = _models(8, short=SHORT)
    report = ropekit.save_pretrained(model, tmp_path / "auto")
    assert report["format"] == "ropekit" and not report["transformers"] and not report["vllm"]
    loaded = ropekit.load(tmp_path / "auto")
    assert loaded.config.ropekit["params"]["start_tokens"] == 8
    for length in (100, 300):
        ids = _ids(length, seed=length)
        assert torch.equal(_logits(loaded, ids), _logits(model, ids))
    for rope_format in ("native", "longrope"):
        with pytest.raises(RopekitError) as err:
            ropekit.save_pretrained(model, tmp_path / rope_format, rope_format=rope_format)
        assert "n̂ = 8" in str(err.value) and "\n" not in str(err.value)
        assert not (tmp_path / rope_format).exists()


def test_a_base_that_switches_keeps_its_own_set_below_n_hat():
    """On Phi-3.5's switching longrope the positions below n̂ take the base model's short or long set."""
    scaling = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG, "factor": 4.0,
               "original_max_position_embeddings": 32}
    model = build_tiny_model("phi3", rope_scaling=scaling, window=32)
    plain = copy.deepcopy(model)
    pairs = model.model.rotary_emb.inv_freq.numel()
    ropekit.extend(model, "longrope", long_factor=[1.5] * pairs, short_factor=[1.1] * pairs, factor=1.5,
                   original_max_position_embeddings=32, start_tokens=6)
    for length in (20, 90):
        x, positions = torch.zeros(1, length, 2 * pairs), torch.arange(length)[None]
        with torch.no_grad():
            cos, _ = model.model.rotary_emb(x, positions)
            plain_cos, _ = plain.model.rotary_emb(x, positions)
        assert torch.equal(cos[:, :6], plain_cos[:, :6])
        assert not torch.equal(cos[:, 6:], plain_cos[:, 6:])


def test_a_rotary_output_of_its_own_form_is_refused_in_one_line():
    model = build_tiny_model("cohere")
    pairs = model.model.rotary_emb.inv_freq.numel()
    with pytest.raises(RopekitError) as err:
        ropekit.extend(model, "longrope", long_factor=[2.0] * pairs, factor=2.0, start_tokens=4)
    assert "cos/sin in a form of its own" in str(err.value) and "\n" not in str(err.value)
    ropekit.extend(model, "longrope", long_factor=[2.0] * pairs, factor=2.0)  # n̂ = 0: a plain per-pair rescale, as before
