"""LongRoPE's scale ``s``: the extension ratio ``L'/L``, never guessed from the rescale factors.

transformers' ``_compute_longrope_parameters`` (and microsoft/LongRoPE's ``rope/longrope.py``) take the attention
factor ``√(1 + ln s / ln C)`` from ``s = max_position_embeddings / original_max_position_embeddings``; a searched
``long_factor`` may end above ``s`` (LongRoPE Table 1 searches up to ``1.25·s``), so ``max(long_factor)`` is not
``s``. The references here are transformers' own ``longrope`` model (given the two windows and no ``factor``) and
the formula; the default short set (all ones) keeps the model's frequencies inside the window while cos/sin still
carry the attention factor, as transformers computes it.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropekit
from ropekit.errors import InvalidParameterError
from ropekit.models.tiny import build_tiny_model

WINDOW, TARGET = 64, 256
S = TARGET / WINDOW
# a searched-looking long_factor for s = 4: monotone, inside LongRoPE's space [1, 1.25·s], ending above s
LONG = [1.0, 1.2, 1.6, 2.1, 2.8, 3.4, 4.0, 4.6]


def _ids(length: int) -> torch.Tensor:
    return torch.randint(3, 250, (1, length), generator=torch.Generator().manual_seed(length))


def _transformers_longrope(base) -> torch.nn.Module:
    """Plain transformers' ``longrope`` on ``base``'s weights: the two windows declared, no ``factor``, so
    transformers derives s = max_position_embeddings / original_max_position_embeddings itself."""
    config = copy.deepcopy(base.config)
    config.rope_parameters = {"rope_type": "longrope", "rope_theta": base.config.rope_parameters["rope_theta"],
                              "short_factor": [1.0] * len(LONG), "long_factor": list(LONG),
                              "original_max_position_embeddings": WINDOW}
    config.max_position_embeddings = TARGET
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    model.load_state_dict(base.state_dict())
    return model


def test_long_factor_without_a_scale_is_refused_in_one_line_and_changes_nothing():
    model = build_tiny_model("llama", window=WINDOW)
    before = model.config.to_dict()
    with pytest.raises(InvalidParameterError) as err:
        ropekit.extend(model, "longrope", long_factor=LONG)
    line = str(err.value)
    assert "\n" not in line and "factor" in line and "extension ratio" in line, line
    assert "factor=s" in line and "target_length" in line, line
    assert ropekit.installed(model) is None and model.config.to_dict() == before


@pytest.mark.parametrize("given", [{"factor": S}, {"target_length": TARGET}])
def test_the_scale_is_the_extension_ratio_as_transformers_derives_it(given):
    base = build_tiny_model("llama", seed=5, window=WINDOW)
    ours = ropekit.extend(copy.deepcopy(base), "longrope", long_factor=LONG, **given)
    params = ours.config.ropekit["params"]
    assert params["factor"] == S and ours.config.max_position_embeddings == TARGET
    assert params["attention_factor"] == pytest.approx(math.sqrt(1 + math.log(S) / math.log(WINDOW)), rel=1e-12)
    reference = _transformers_longrope(base)
    for length in (WINDOW, 200):  # the short set (all ones) inside the window, the long set beyond it
        ids = _ids(length)
        with torch.no_grad():
            torch.testing.assert_close(ours(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-5)


def test_inside_the_window_the_default_short_set_still_carries_the_attention_factor():
    """All-ones short factors give the model's own frequencies, but cos/sin × √(1 + ln s / ln C) (transformers,
    Phi-3): not the model's own RoPE."""
    base = build_tiny_model("llama", seed=5, window=WINDOW)
    ours = ropekit.extend(copy.deepcopy(base), "longrope", long_factor=LONG, factor=S)
    x, positions = torch.zeros(1, WINDOW, 2 * len(LONG)), torch.arange(WINDOW)[None]
    with torch.no_grad():
        cos, sin = ours.model.rotary_emb(x, positions)
        plain_cos, plain_sin = base.model.rotary_emb(x, positions)
    a = math.sqrt(1 + math.log(S) / math.log(WINDOW))
    torch.testing.assert_close(cos, plain_cos * a, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sin, plain_sin * a, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(cos, plain_cos)


def test_an_evaluation_given_no_scale_sizes_it_to_its_longest_length():
    """``ropekit eval --method longrope --param long_factor=…`` without a factor: s = longest length / window, as
    for every method sized by a target (not max(long_factor) = 4.6)."""
    from ropekit.eval.common import prepare_model

    base = build_tiny_model("llama", window=WINDOW)
    _, params = prepare_model(base, "longrope", {"long_factor": LONG}, [128, TARGET])
    assert params["factor"] == S
    assert params["attention_factor"] == pytest.approx(math.sqrt(1 + math.log(S) / math.log(WINDOW)), rel=1e-12)
