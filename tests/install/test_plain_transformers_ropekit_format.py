"""What plain transformers builds from a ``ropekit``-format export after ``ropekit.register()``
(docs/export-and-engines.md): the model ropekit has, or — where transformers alone would keep frequencies that
must change with the input length — a one-line refusal naming ``ropekit.load``. And the model card's original
window on a pre-scaled base."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import ropekit
from ropekit.errors import UnsupportedModelError
from ropekit.models.tiny import build_tiny_model
from ropekit.train.plan import count_parameters

#: Llama 3.1's rule on a tiny model: 8 × an original window of 8 = the declared 64.
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8, "rope_theta": 500000.0}
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}


def _ids(n: int) -> torch.Tensor:
    return torch.randint(0, 200, (1, n), generator=torch.Generator().manual_seed(n))


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def _export(tmp_path, base_rope, method, **params):
    model = build_tiny_model("llama", rope_scaling=dict(base_rope), window=64)
    ropekit.extend(model, method, factor=2.0, **params)
    out = tmp_path / method
    ropekit.save_pretrained(model, out, rope_format="ropekit")
    ropekit.register()
    return model, out


@pytest.mark.parametrize(("method", "params"), [("yarn", {}), ("ntk_by_parts", {"ramp": "dim"})])
def test_a_ramp_read_off_scaled_frequencies_builds_on_the_meta_device(tmp_path, method, params):
    """transformers builds a model on the meta device before loading weights, and ropekit counts parameters that
    way: YaRN's ramp on a scaled base reads the crossing pairs as numbers, which a meta tensor has none of."""
    model, out = _export(tmp_path, LLAMA3, method, **params)
    plain = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = _ids(150)  # past the extended window's base (64): the scaled frequencies matter
    assert torch.allclose(_logits(plain, ids), _logits(model, ids), atol=1e-5)
    total, _ = count_parameters(AutoConfig.from_pretrained(out))
    assert total == sum(p.numel() for p in plain.parameters())


@pytest.mark.parametrize(("base", "method"), [(DYNAMIC, "pi"), (DYNAMIC, "yarn"), (None, "dynamic_yarn")])
def test_frequencies_that_follow_the_length_are_refused_by_plain_transformers(tmp_path, base, method):
    """ropekit switches these with a hook only extend/load attach; transformers' own dynamic update follows only
    its dynamic rule. Built by plain transformers they would keep the short-input set: refused in one line."""
    rope = base or {"rope_type": "default", "rope_theta": 10000.0}
    model, out = _export(tmp_path, rope, method)
    with pytest.raises(UnsupportedModelError) as err:
        AutoModelForCausalLM.from_pretrained(out)
    assert "ropekit.load" in str(err.value) and "\n" not in str(err.value)
    ids = _ids(300)
    assert torch.allclose(_logits(ropekit.load(out), ids), _logits(model, ids), atol=1e-5)
    total, _ = count_parameters(AutoConfig.from_pretrained(out))  # a count needs no frequencies
    assert total == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("method", ["self_extend", "lm_infinite", "dual_chunk", "landmark", "clex"])
def test_methods_beyond_their_frequencies_are_refused_by_plain_transformers(tmp_path, method):
    """An attention-side method, or CLEX's ODE, is more than its rope-init function: built by plain transformers
    from the rope type alone the model would be the base model's attention with the method's frequencies (Self-Extend
    4e-3 off, LM-Infinite 0.38, Landmark with no landmark token at all). Refused in one line; ropekit.load is exact."""
    model = build_tiny_model("llama")
    ropekit.extend(model, method)
    out = tmp_path / method
    ropekit.save_pretrained(model, out)
    ropekit.register()
    with pytest.raises(UnsupportedModelError) as err:
        AutoModelForCausalLM.from_pretrained(out)
    assert "ropekit.load" in str(err.value) and "\n" not in str(err.value)
    ids = _ids(150)
    assert torch.allclose(_logits(ropekit.load(out), ids), _logits(model, ids), atol=1e-5)


def test_transformers_own_dynamic_rule_is_built_by_plain_transformers(tmp_path):
    """Dynamic NTK follows the length by transformers' own dynamic update (its rope type's name says 'dynamic'),
    the rule ropekit installs: plain transformers builds it and matches at a length past the window."""
    model, out = _export(tmp_path, {"rope_type": "default", "rope_theta": 10000.0}, "dynamic_ntk")
    plain = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = _ids(300)
    assert torch.allclose(_logits(plain, ids), _logits(model, ids), atol=1e-5)


def test_the_card_calls_the_base_models_effective_window_original(tmp_path):
    """A Qwen-style base declaring 40 positions with YaRN ×4 over 32 has an effective window of 128; YaRN ×2 on
    it gives 256. The card's original window is the 128 the factor extends, not the declared 40."""
    base = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0}
    model = build_tiny_model("qwen2", rope_scaling=base, window=40)
    ropekit.extend(model, "yarn", factor=2.0)
    ropekit.save_pretrained(model, tmp_path / "out")
    card = (tmp_path / "out" / "README.md").read_text()
    original = int(base["factor"] * base["original_max_position_embeddings"])
    assert f"| original window | {original:,} tokens |" in card
    assert f"| effective window | {2 * original:,} tokens |" in card
