"""Every mainstream family, plain and as shipped (pre-scaled), against the support table written by hand in
``tests/family_support.py``: the capability check, ``inspect`` and ``extend`` agree with it; refusals are one
line naming the family and the feature; what installs gives the model's own logits at identity settings, and
attention-side methods at their degenerate settings equal the plain model (softcap, sinks and sliding windows
honoured or refused)."""

from __future__ import annotations

import pytest
import torch
from family_support import METHODS, REFUSED, applies, pairs

import ropekit
from ropekit import RopekitError
from ropekit.models.tiny import build_tiny_model

FAMILIES = list(REFUSED)
LAYERS = 4  # Entropy-ABF leaves layers 0 and 1 alone; Gemma 3 / gpt-oss alternate sliding and full layers


def model_of(family):
    return build_tiny_model(family, num_layers=LAYERS)


def _example(method, model):
    info = ropekit.rope_info(model)
    return ropekit.get_method(method).example_params(info)


@pytest.mark.parametrize("family", FAMILIES)
def test_inspect_and_extend_agree_with_the_table(family):
    model = model_of(family)
    facts = ropekit.inspect_model(model)
    listed = {m["name"]: m for m in facts["methods"]}
    for method in METHODS:
        assert listed[method]["applies"] == applies(family, method), (family, method, listed[method]["why_not"])
        if not applies(family, method):
            needle = REFUSED[family][method]
            assert needle in listed[method]["why_not"], (family, method, listed[method]["why_not"])
            before = model.config.to_dict()
            with pytest.raises(RopekitError) as err:
                ropekit.extend(model, method, **_example(method, model))
            line = str(err.value)
            assert "\n" not in line and needle in line and facts["model_type"] in line and "use " in line, line
            assert model.config.to_dict() == before and ropekit.installed(model) is None


#: identity parameters: the method installed but changing nothing (``theta``: the model's own base)
IDENTITY = {
    "pi": {"factor": 1.0}, "ntk": {"factor": 1.0}, "dynamic_ntk": {"factor": 1.0}, "ntk_by_parts": {"factor": 1.0},
    "yarn": {"factor": 1.0}, "llama3": {"factor": 1.0}, "abf": {"rope_theta": "theta"},
    "entropy_abf": {"rope_theta": "theta", "scale_context": 10_000}, "longlora": {"factor": 1.0},
    "longrope": {"long_factor": "ones", "attention_factor": 1.0}, "clex": {}, "harpe": {"bases": "theta"},
    "self_extend": {"group_size": 2, "window_size": 60}, "lm_infinite": {"local_window": 10_000},
    "landmark": {"mem_freq": 10_000},
}


def _identity(method, model):
    info = ropekit.rope_info(model)
    out = {}
    for key, value in IDENTITY[method].items():
        if value == "theta":
            value = [info.rope_theta] * info.num_kv_heads if key == "bases" else info.rope_theta
        elif value == "ones":
            value = [1.0] * (info.rotary_dim // 2)
        out[key] = value
    return out


@pytest.mark.parametrize("family,method", pairs())
def test_identity_settings_give_the_models_own_logits(family, method, make_ids):
    if method == "clex" and ropekit.rope_info(model_of(family)).rotary_dim <= 2:
        pytest.skip("rotary dimension too small for CLEX")
    model, reference = model_of(family), model_of(family)
    ropekit.extend(model, method, **_identity(method, model))
    for length in (40, 56):  # inside every degenerate setting (Self-Extend: W = 60 below the 64-token window)
        ids = make_ids(length)
        with torch.no_grad():
            ours, ref = model(ids).logits, reference(ids).logits
        assert torch.equal(ours[..., : ref.shape[-1]], ref), (family, method, length)


FREQUENCY_REFERENCE = {  # method parameters → transformers' own rope type on the same plain model
    "pi": ({"factor": 2.0}, lambda t: {"rope_type": "linear", "factor": 2.0, "rope_theta": t}),
    "yarn": ({"factor": 2.0}, lambda t: {"rope_type": "yarn", "factor": 2.0, "rope_theta": t,
                                         "original_max_position_embeddings": 64}),
    "llama3": ({"factor": 4.0}, lambda t: {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "rope_theta": t,
                                           "original_max_position_embeddings": 64}),
}
PLAIN = ["llama", "mistral", "qwen2", "qwen3", "gpt_neox", "olmo2", "granite", "gemma2", "cohere", "deepseek_v2",
         "deepseek_v3"]


@pytest.mark.parametrize("family", PLAIN)
@pytest.mark.parametrize("method", list(FREQUENCY_REFERENCE))
def test_frequency_methods_equal_transformers_own_rope_types(family, method, make_ids):
    params, hf_rope = FREQUENCY_REFERENCE[method]
    model = model_of(family)
    theta = ropekit.rope_info(model).rope_theta
    config = model.config.to_dict()
    rope = hf_rope(theta)
    if "partial_rotary_factor" in model.config.rope_parameters:
        rope["partial_rotary_factor"] = model.config.rope_parameters["partial_rotary_factor"]
    config["rope_parameters"] = rope
    reference = type(model)(type(model.config).from_dict(config)).eval()
    reference.load_state_dict(model.state_dict())
    ropekit.extend(model, method, **params)
    ids = make_ids(150)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-5)


ATTENTION_SIDE = ["self_extend", "lm_infinite", "landmark"]


@pytest.mark.parametrize("family,method", pairs(ATTENTION_SIDE))
def test_attention_side_methods_really_act_and_leave_sliding_layers_alone(family, method, make_ids):
    """Past their degenerate setting they change the output; on models with sliding-window layers only the
    full-attention layers get the method (a sliding layer keeps its own window and plain attention)."""
    model = model_of(family)
    plain = model_of(family)
    settings = {"self_extend": {"group_size": 4, "window_size": 8}, "lm_infinite": {"local_window": 16, "global_tokens": 2},
                "landmark": {"mem_freq": 7}}[method]
    ropekit.extend(model, method, **settings)
    types = getattr(model.config, "layer_types", None) or ["full_attention"] * LAYERS
    from ropekit.attention.interface import attention_modules

    for module in attention_modules(model):
        assert (module.ropekit_attend is None) == (types[module.layer_idx] == "sliding_attention"), module.layer_idx
    ids = make_ids(60)
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits[..., :256], plain(ids).logits)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma2", "gemma3_text", "gpt_oss", "llama3", "phi3.5", "deepseek-v3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_stays_within_the_plain_models_own_error(family, dtype, make_ids):
    """Every method that applies, in bf16/fp16 on CPU, against its own float32 logits: no worse than the plain
    model's half-precision error (with a margin of 2× and a floor at the format's resolution)."""
    ids = make_ids(48)

    def error(method, params):
        model = model_of(family)
        vocab = model.config.vocab_size  # Landmark adds a token whose logit is −∞ in every precision
        if method is not None:
            ropekit.extend(model, method, **params)
        with torch.no_grad():
            full = model(ids).logits.float()[..., :vocab]
            half = model.to(dtype)(ids).logits.float()[..., :vocab]
        return (half - full).abs().max().item()

    resolution = {torch.bfloat16: 2**-7, torch.float16: 2**-10}[dtype]
    plain = error(None, {})
    for method in METHODS:
        if not applies(family, method):
            continue
        params = {"self_extend": {"group_size": 4, "window_size": 8}, "lm_infinite": {"local_window": 16},
                  "landmark": {"mem_freq": 7}}.get(method) or _example(method, model_of(family))
        assert error(method, params) <= 2 * max(plain, resolution * 8), (family, method, dtype)
