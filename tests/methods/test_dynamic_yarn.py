"""Dynamic YaRN against transformers' own static ``yarn`` at the factor of each input's length, the plain model
inside the window, independence from what ran before, and the KV-cache limitation measured."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropekit
from ropekit.core.hf_compat import cache_argument, output_cache
from ropekit.models.tiny import build_tiny_model

WINDOW = 128  # the tiny model's window; factor cap 2


def _extended():
    model = build_tiny_model("llama", seed=3, window=WINDOW)
    plain = copy.deepcopy(model)
    return ropekit.extend(model, "dynamic_yarn", factor=2.0), plain


def _static_yarn(plain, factor: float):
    """Plain transformers' YaRN at ``factor`` (no ropekit rope type): the independent reference."""
    config = copy.deepcopy(plain.config)
    config.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": factor,
                              "original_max_position_embeddings": WINDOW}
    config.max_position_embeddings = int(WINDOW * factor)
    reference = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    reference.load_state_dict(plain.state_dict())
    return reference


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def models():
    return _extended()


@pytest.mark.parametrize("length,factor", [(192, 1.5), (256, 2.0), (320, 2.0)])
def test_each_length_gets_static_yarn_at_its_own_factor(models, length, factor):
    model, plain = models
    ids = torch.randint(3, 250, (1, length), generator=torch.Generator().manual_seed(length))
    torch.testing.assert_close(_logits(model, ids), _logits(_static_yarn(plain, factor), ids), atol=2e-5, rtol=1e-5)


def test_inside_the_window_it_is_the_plain_model_bit_for_bit_whatever_ran_before(models):
    model, plain = models
    short = torch.randint(3, 250, (2, 100), generator=torch.Generator().manual_seed(0))
    longer = torch.randint(3, 250, (1, 320), generator=torch.Generator().manual_seed(1))
    middle = torch.randint(3, 250, (1, 192), generator=torch.Generator().manual_seed(2))
    _logits(model, longer)  # a long input first: transformers' dynamic rule would keep its factor
    assert torch.equal(_logits(model, short), _logits(plain, short))
    _logits(model, longer)
    torch.testing.assert_close(_logits(model, middle), _logits(_static_yarn(plain, 1.5), middle), atol=2e-5, rtol=1e-5)


def test_cached_generation_inside_the_window_equals_the_uncached_loop_and_past_it_drifts(models):
    """The stated limitation: cached keys keep the factor they were computed with."""
    model, _ = models
    prompt = torch.randint(3, 250, (1, 120), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        ids, argument = prompt, cache_argument(model)
        gaps = []
        for _ in range(24):  # from 120 to 144 tokens: crosses the 128-token window
            step = out.logits[:, -1:].argmax(-1)
            ids = torch.cat([ids, step], dim=1)
            out = model(input_ids=step, use_cache=True, **{argument: output_cache(out)})
            full = model(input_ids=ids).logits[:, -1]
            gaps.append((ids.shape[1], float((out.logits[:, -1].log_softmax(-1) - full.log_softmax(-1)).abs().max())))
    inside = [gap for length, gap in gaps if length <= WINDOW]
    beyond = [gap for length, gap in gaps if length > WINDOW]
    assert max(inside) < 1e-4
    assert max(beyond) > 1e-3  # the keys cached at s = 1 no longer match queries at s = L/C


def test_frozen_at_a_length_it_exports_as_longrope_that_plain_transformers_runs_as_static_yarn(tmp_path):
    model, plain = _extended()
    report = ropekit.save_pretrained(model, tmp_path, rope_format="longrope", freeze_length=256)
    assert report["format"] == "longrope"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()  # plain transformers, no ropekit rope type
    ids = torch.randint(3, 250, (1, 300), generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(_logits(loaded, ids), _logits(_static_yarn(plain, 2.0), ids), atol=2e-5, rtol=1e-5)
