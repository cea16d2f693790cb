"""transformers' own rope types as ropekit methods — ``llama3``, ``longrope`` and YaRN's ``mscale`` /
``mscale_all_dim`` / ``truncate`` keys — against transformers' implementation.

The reference is ``ROPE_INIT_FUNCTIONS[type]`` on a config transformers builds from hand-written
``rope_parameters``; then whole tiny models extended by ropekit against the model transformers builds from the
same ``rope_parameters`` and weights, and the native export loaded by plain transformers.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, GPTNeoXConfig, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import ropekit
from ropekit.methods import RopeInfo
from ropekit.models.tiny import build_tiny_model

RTOL = 1e-6
HEADS = (("llama", 16, 1.0), ("llama", 64, 1.0), ("llama", 128, 1.0), ("gpt_neox", 64, 0.25))
HEAD_IDS = [f"{f}-d{d}-prf{p:g}" for f, d, p in HEADS]


def _config(family, head_dim, prf, window, rope):
    rope = dict(rope)
    if family == "gpt_neox":
        rope["partial_rotary_factor"] = prf
        return GPTNeoXConfig(hidden_size=head_dim, num_attention_heads=1, num_hidden_layers=1, intermediate_size=8,
                             vocab_size=8, max_position_embeddings=window, rope_parameters=rope)
    return LlamaConfig(hidden_size=head_dim, num_attention_heads=1, num_key_value_heads=1, num_hidden_layers=1,
                       intermediate_size=8, vocab_size=8, max_position_embeddings=window, rope_parameters=rope)


def _rel(ours, ref) -> float:
    return ((ours.double() - ref.double()).abs() / ref.double().abs()).max().item()


def _longrope_factors(pairs: int, seed: int, top: float) -> list[float]:
    """Non-decreasing factors in [1, top] — the shape LongRoPE's search produces."""
    gen = torch.Generator().manual_seed(seed)
    steps = torch.rand(pairs, generator=gen)
    values = 1 + (top - 1) * torch.cumsum(steps, 0) / steps.sum()
    return [round(float(v), 4) for v in values]


LLAMA3 = [
    {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},  # Llama 3.1
    {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},  # Llama 3.2 1B/3B
    {"factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0},
    {"factor": 1.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
]


@pytest.mark.parametrize("family,head_dim,prf", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("settings", LLAMA3, ids=lambda s: "-".join(f"{v:g}" for v in s.values()))
@pytest.mark.parametrize("base,window", [(5e5, 8192), (1e4, 64), (1e6, 4096)])
def test_llama3_matches_transformers(family, head_dim, prf, settings, base, window):
    plain = _config(family, head_dim, prf, window, {"rope_type": "default", "rope_theta": base})
    info = RopeInfo.from_config(plain)
    m = ropekit.get_method("llama3")
    params = m.resolve(info, dict(settings))
    ours, ours_att = m.inv_freq(info, params)
    rope = {"rope_type": "llama3", "rope_theta": base, "original_max_position_embeddings": window, **settings}
    ref, ref_att = ROPE_INIT_FUNCTIONS["llama3"](_config(family, head_dim, prf, int(window * settings["factor"]), rope), None)
    if settings["factor"] == 1.0:  # ropekit returns plain RoPE exactly; transformers' blend rounds the last bit
        assert _rel(ours, ref) <= RTOL and ours_att == ref_att == 1.0
    else:
        assert torch.equal(ours, ref) and ours_att == ref_att == 1.0
    assert m.transformers_rope(info, params) == {**rope, "factor": settings["factor"]}


@pytest.mark.parametrize("family,head_dim,prf", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("top,attention", [(4.0, None), (16.0, None), (8.0, 1.1), (1.0, None)])
def test_longrope_matches_transformers_in_both_regimes(family, head_dim, prf, top, attention):
    window, base = 4096, 1e4
    plain = _config(family, head_dim, prf, window, {"rope_type": "default", "rope_theta": base})
    info = RopeInfo.from_config(plain)
    pairs = info.rotary_dim // 2
    given = {"long_factor": _longrope_factors(pairs, 1, top), "short_factor": _longrope_factors(pairs, 2, 1.5),
             "factor": top}
    if attention is not None:
        given["attention_factor"] = attention
    m = ropekit.get_method("longrope")
    params = m.resolve(info, given)
    rope = {"rope_type": "longrope", "rope_theta": base, "original_max_position_embeddings": window,
            "short_factor": given["short_factor"], "long_factor": given["long_factor"], "factor": top}
    if attention is not None:
        rope["attention_factor"] = attention
    cfg = _config(family, head_dim, prf, int(window * top), rope)
    for seq_len in (None, 1, window, window + 1, 4 * window):
        ours, ours_att = m.inv_freq(info, params, seq_len=seq_len)
        ref, ref_att = ROPE_INIT_FUNCTIONS["longrope"](cfg, None, seq_len=seq_len)
        assert torch.equal(ours, ref), seq_len
        assert math.isclose(ours_att, ref_att, rel_tol=1e-12), (ours_att, ref_att)
    expected = 1.0 if top <= 1 else math.sqrt(1 + math.log(top) / math.log(window))
    assert math.isclose(params["attention_factor"], attention or expected, rel_tol=1e-12)


@pytest.mark.parametrize("family,head_dim,prf", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("keys", [
    {"mscale": 1.0, "mscale_all_dim": 1.0},          # DeepSeek-V3: factor cancels, attention factor 1
    {"mscale": 0.707, "mscale_all_dim": 0.707},
    {"mscale": 1.0, "mscale_all_dim": 0.5},
    {"truncate": False},                               # gpt-oss
    {"truncate": False, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0},
])
@pytest.mark.parametrize("factor", [4.0, 32.0, 40.0])
def test_yarn_keys_match_transformers(family, head_dim, prf, keys, factor):
    window, base = 4096, 1.5e5
    plain = _config(family, head_dim, prf, window, {"rope_type": "default", "rope_theta": base})
    info = RopeInfo.from_config(plain)
    m = ropekit.get_method("yarn")
    params = m.resolve(info, {"factor": factor, **keys})
    rope = {"rope_type": "yarn", "rope_theta": base, "factor": factor, "original_max_position_embeddings": window, **keys}
    ref, ref_att = ROPE_INIT_FUNCTIONS["yarn"](_config(family, head_dim, prf, int(window * factor), rope), None)
    ours, ours_att = m.inv_freq(info, params)
    assert _rel(ours, ref) <= RTOL
    assert math.isclose(ours_att, ref_att, rel_tol=1e-12), (ours_att, ref_att)
    # DeepSeek's rule by hand: (0.1·m·ln s + 1)/(0.1·m_all·ln s + 1) when both keys are set
    if keys.get("mscale") and keys.get("mscale_all_dim"):
        hand = (0.1 * keys["mscale"] * math.log(factor) + 1) / (0.1 * keys["mscale_all_dim"] * math.log(factor) + 1)
        assert math.isclose(ours_att, hand, rel_tol=1e-12)


def _weights_into(model, reference):
    reference.load_state_dict(model.state_dict(), strict=False)
    return reference.eval()


@pytest.mark.parametrize("method,given,hf_rope", [
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64}),
    ("longrope", {"long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 4.0, 4.0, 4.0], "short_factor": [1.0, 1.0, 1.1, 1.2, 1.2, 1.3, 1.3, 1.3],
                  "factor": 4.0},
     {"rope_type": "longrope", "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 4.0, 4.0, 4.0],
      "short_factor": [1.0, 1.0, 1.1, 1.2, 1.2, 1.3, 1.3, 1.3], "factor": 4.0, "original_max_position_embeddings": 64}),
    ("yarn", {"factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False},
     {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False,
      "original_max_position_embeddings": 64}),
])
def test_extended_models_equal_transformers_own_and_export_natively(method, given, hf_rope, tmp_path, make_ids):
    model = build_tiny_model("llama")  # head size 16: 8 rotary pairs, window 64
    ropekit.extend(model, method, **given)
    rope = {**hf_rope, "rope_theta": 10000.0}
    reference_config = _config_like(model, rope)
    reference = _weights_into(model, AutoModelForCausalLM.from_config(reference_config, attn_implementation="sdpa"))
    for length in (40, 64, 65, 200):  # inside the window, at it, just past it (longrope switches), far past it
        ids = make_ids(length)
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-5)
    report = ropekit.save_pretrained(model, tmp_path / "out")
    assert report["transformers"] and report["rope_parameters"]["rope_type"] == hf_rope["rope_type"]
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="sdpa").eval()
    ids = make_ids(150)
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def _config_like(model, rope):
    data = {k: v for k, v in model.config.to_dict().items() if k != "ropekit"}
    data["rope_parameters"] = rope
    data["max_position_embeddings"] = int(64 * rope["factor"])
    return LlamaConfig.from_dict(data)
