"""Every mainstream family, plain and as shipped (pre-scaled), against the support table written by hand in
``tests/family_support.py``: the capability check, ``inspect`` and ``extend`` agree with it; refusals are one
line naming the family and the feature; what installs gives the model's own logits at identity settings, and
attention-side methods at their degenerate settings equal the plain model (softcap, sinks and sliding windows
honoured or refused)."""

from __future__ import annotations

import copy
import functools

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
    "longrope": {"long_factor": "ones", "attention_factor": 1.0, "factor": 1.0}, "clex": {}, "harpe": {"bases": "theta"},
    "self_extend": {"group_size": 2, "window_size": 60}, "lm_infinite": {"local_window": "window"},
    "landmark": {"mem_freq": 10_000}, "dynamic_yarn": {"factor": 1.0},
    "dual_chunk": {"chunk_size": "window", "local_size": 1},  # one chunk of window − 1 ≥ 63 tokens
}


def _identity(method, model):
    info = ropekit.rope_info(model)
    out = {}
    for key, value in IDENTITY[method].items():
        if value == "theta":
            value = [info.rope_theta] * info.num_kv_heads if key == "bases" else info.rope_theta
        elif value == "ones":
            value = [1.0] * (info.rotary_dim // 2)
        elif value == "window":
            value = info.window
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


def _yarn(factor, truncate=None, attention_factor=None):
    def rope(info):
        out = {"rope_type": "yarn", "factor": factor, "rope_theta": info.rope_theta,
               "original_max_position_embeddings": info.window, "beta_fast": 32.0, "beta_slow": 1.0}
        if truncate is not None:
            out["truncate"] = truncate
        if attention_factor is not None:
            out["attention_factor"] = attention_factor
        return out
    return rope


PAIRS = 8  # head size 16 on every tiny family used below
LONG = [1.0, 1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0]
SHORT = [1.0, 1.0, 1.0, 1.05, 1.1, 1.15, 1.2, 1.25]

#: case → (method, parameters, transformers' own rope_parameters for the same model from its RopeInfo)
FREQUENCY_REFERENCE = {
    "pi": ("pi", {"factor": 2.0}, lambda i: {"rope_type": "linear", "factor": 2.0, "rope_theta": i.rope_theta}),
    "yarn": ("yarn", {"factor": 2.0}, _yarn(2.0)),
    "llama3": ("llama3", {"factor": 4.0}, lambda i: {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0, "rope_theta": i.rope_theta,
                                                     "original_max_position_embeddings": i.window}),
    # NTK: the base b·s^(d/(d−2)) with d the rotary dimension (LCEG Eq. 9) as a plain rope_theta
    "ntk": ("ntk", {"factor": 2.0}, lambda i: {"rope_type": "default",
                                               "rope_theta": i.rope_theta * 2.0 ** (i.rotary_dim / (i.rotary_dim - 2))}),
    # Dynamic NTK with transformers' rule = transformers' dynamic (recomputed past the declared window)
    "dynamic_ntk": ("dynamic_ntk", {"factor": 2.0}, lambda i: {"rope_type": "dynamic", "factor": 2.0,
                                                               "rope_theta": i.rope_theta}),
    # NTK-by-parts with the dimension ramp = YaRN's frequencies without temperature
    "ntk_by_parts-dim": ("ntk_by_parts", {"factor": 2.0, "ramp": "dim"}, _yarn(2.0, attention_factor=1.0)),
    # gpt-oss's YaRN keeps the ramp's end dimensions fractional
    "yarn-untruncated": ("yarn", {"factor": 4.0, "truncate": False}, _yarn(4.0, truncate=False)),
    "longrope": ("longrope", {"long_factor": LONG, "short_factor": SHORT, "factor": 4.0},
                 lambda i: {"rope_type": "longrope", "long_factor": LONG, "short_factor": SHORT, "factor": 4.0,
                            "rope_theta": i.rope_theta, "original_max_position_embeddings": i.window}),
}
PLAIN = ["llama", "mistral", "qwen2", "qwen3", "gpt_neox", "olmo2", "granite", "gemma2", "cohere", "deepseek_v2",
         "deepseek_v3"]
_EVERYWHERE = ["pi", "yarn", "llama3", "ntk", "dynamic_ntk", "ntk_by_parts-dim"]
REFERENCE_CASES = (
    [(f, c) for f in PLAIN for c in ["pi", "yarn", "llama3", "ntk"]]
    + [(f, c) for f in ("llama", "qwen3", "gpt_neox", "cohere", "deepseek_v3") for c in ("dynamic_ntk", "ntk_by_parts-dim")]
    # (not yarn-untruncated: transformers 5.x reads yarn's truncate from the top of a per-layer-type
    # rope_parameters and truncates anyway — the export test below)
    + [("gemma3_text", c) for c in ("pi", "yarn", "llama3", "ntk", "ntk_by_parts-dim")]
    + [("gpt_oss", c) for c in _EVERYWHERE + ["yarn-untruncated"]]
    + [("phi3", "longrope"), ("phi3", "ntk"), ("llama", "longrope"), ("qwen2", "yarn-untruncated")]
)


def _transformers_reference(model, rope_of_layer):
    """The same weights under plain transformers' own rope type: ``rope_of_layer(info)`` for the full-attention
    layers (every layer on a model with one RoPE), the model's other layer types as they are."""
    config = model.config.to_dict()
    config.pop("ropekit", None)
    types = ropekit.rope_info(model).layer_type
    base = model.config.rope_parameters
    if types is None:
        rope = rope_of_layer(ropekit.rope_info(model))
        if "partial_rotary_factor" in base:
            rope["partial_rotary_factor"] = base["partial_rotary_factor"]
    else:
        rope = {**{k: dict(v) for k, v in base.items()}, types: rope_of_layer(ropekit.rope_info(model))}
    config["rope_parameters"] = rope
    if rope.get("rope_type") == "longrope" and "original_max_position_embeddings" in config:  # Phi-3's own field
        config["original_max_position_embeddings"] = rope["original_max_position_embeddings"]
        config["max_position_embeddings"] = int(rope["original_max_position_embeddings"] * rope["factor"])
    reference = type(model)(type(model.config).from_dict(config)).eval()
    reference.load_state_dict(model.state_dict())
    return reference


@pytest.mark.parametrize("family,case", REFERENCE_CASES)
def test_frequency_methods_equal_transformers_own_rope_types(family, case, make_ids):
    method, params, hf_rope = FREQUENCY_REFERENCE[case]
    model = model_of(family)
    reference = _transformers_reference(model, hf_rope)
    ropekit.extend(model, method, **params)
    for length in (40, 150):  # inside the window (LongRoPE's short set) and past it (its long set, dynamic's growth)
        ids = make_ids(length)
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-5)


# ---- Gemma 3: RoPE per layer type ------------------------------------------------------------------------------
def _gemma3_inv_freq(model, layer_type):
    return getattr(model.model.rotary_emb, f"{layer_type}_inv_freq").double()


@pytest.mark.parametrize("layer_types", [None, ["sliding_attention", "full_attention"]])
def test_gemma3_extends_the_global_layers_and_the_local_ones_only_when_named(layer_types, make_ids):
    """By default only the full-attention (global, base 1e6) layers' RoPE is extended and the sliding (local,
    base 1e4) layers keep theirs; naming the layer types extends the local ones too. Frequencies against
    b^(−2i/d)/s written out here, logits against transformers' own linear type per layer type."""
    model = model_of("gemma3_text")
    d = 2 * PAIRS
    plain = {t: b ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
             for t, b in (("sliding_attention", 1e4), ("full_attention", 1e6))}
    for t, want in plain.items():
        torch.testing.assert_close(_gemma3_inv_freq(model, t), want, rtol=1e-6, atol=0)
    config = model.config.to_dict()
    config["rope_parameters"] = {t: {"rope_type": "linear", "factor": 2.0, "rope_theta": v["rope_theta"]}
                                 if t in (layer_types or ["full_attention"]) else dict(v)
                                 for t, v in model.config.rope_parameters.items()}
    reference = type(model)(type(model.config).from_dict(config)).eval()
    reference.load_state_dict(model.state_dict())
    before = {t: _gemma3_inv_freq(model, t).clone() for t in plain}
    ropekit.extend(model, "pi", factor=2.0, **({"layer_types": layer_types} if layer_types else {}))
    torch.testing.assert_close(_gemma3_inv_freq(model, "full_attention"), plain["full_attention"] / 2, rtol=1e-6, atol=0)
    if layer_types is None:
        assert torch.equal(_gemma3_inv_freq(model, "sliding_attention"), before["sliding_attention"])
    else:
        torch.testing.assert_close(_gemma3_inv_freq(model, "sliding_attention"), plain["sliding_attention"] / 2,
                                   rtol=1e-6, atol=0)
    ids = make_ids(100)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer_types", [None, ["sliding_attention", "full_attention"]])
def test_gemma3_untruncated_yarn_is_not_exported_as_a_yarn_transformers_would_truncate(layer_types, tmp_path, make_ids):
    """transformers 5.x's yarn reads ``truncate`` from the top level of ``rope_parameters``, never from a layer
    type's entry: a native per-layer-type ``yarn`` with ``truncate: false`` would load as another model. The
    export writes the per-pair ``longrope`` form instead, which plain transformers computes exactly."""
    from transformers import AutoModelForCausalLM

    model = model_of("gemma3_text")
    ropekit.extend(model, "yarn", factor=4.0, truncate=False, **({"layer_types": layer_types} if layer_types else {}))
    report = ropekit.save_pretrained(model, tmp_path / "out")
    assert report["format"] == "longrope" and report["transformers"], report
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    for length in (40, 150):
        ids = make_ids(length)
        with torch.no_grad():
            torch.testing.assert_close(plain(ids).logits, model(ids).logits, rtol=2e-5, atol=2e-5)


def test_gemma3_layer_types_from_the_command_line(run_cli, tmp_path):
    out = tmp_path / "g3"
    code, _, err = run_cli("extend", "tiny-gemma3_text", "--method", "pi", "--factor", "2",
                           "--layer-types", "sliding_attention,full_attention", "--out", str(out))
    assert code == 0, err
    model = ropekit.load(out)
    d = 2 * PAIRS
    for t, b in (("sliding_attention", 1e4), ("full_attention", 1e6)):
        want = b ** (-torch.arange(0, d, 2, dtype=torch.float64) / d) / 2
        torch.testing.assert_close(_gemma3_inv_freq(model, t), want, rtol=1e-6, atol=0)


ATTENTION_SIDE = ["self_extend", "lm_infinite", "dual_chunk", "landmark"]


@pytest.mark.parametrize("family,method", pairs(ATTENTION_SIDE))
def test_attention_side_methods_really_act_and_leave_sliding_layers_alone(family, method, make_ids):
    """Past their degenerate setting they change the output; on models with sliding-window layers only the
    full-attention layers get the method (a sliding layer keeps its own window and plain attention)."""
    model = model_of(family)
    plain = model_of(family)
    settings = {"self_extend": {"group_size": 4, "window_size": 8}, "lm_infinite": {"local_window": 16, "global_tokens": 2},
                "dual_chunk": {"chunk_size": 16, "local_size": 2}, "landmark": {"mem_freq": 7}}[method]
    ropekit.extend(model, method, **settings)
    types = getattr(model.config, "layer_types", None) or ["full_attention"] * LAYERS
    from ropekit.attention.interface import attention_modules

    for module in attention_modules(model):
        assert (module.ropekit_attend is None) == (types[module.layer_idx] == "sliding_attention"), module.layer_idx
    ids = make_ids(60)
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits[..., :256], plain(ids).logits)


# ---- half precision ------------------------------------------------------------------------------------------
HALF_LAYERS = 2  # one sliding and one full layer on Gemma 3 / gpt-oss; Entropy-ABF scales layer 1 (below)
HALF_LENGTH = 40
#: settings at which every method really changes the model at 40 tokens (identity settings would test nothing):
#: length-dependent methods count from a 16-token window, attention-side ones use small windows/blocks
ACTING = {
    "self_extend": {"group_size": 4, "window_size": 8}, "lm_infinite": {"local_window": 16},
    "dual_chunk": {"chunk_size": 16, "local_size": 2}, "landmark": {"mem_freq": 7},
    "dynamic_ntk": {"factor": 2.0, "original_max_position_embeddings": 16},
    "dynamic_yarn": {"factor": 4.0, "original_max_position_embeddings": 16},
    "clex": {"max_factor": 4, "original_max_position_embeddings": 16},
    "entropy_abf": {"rope_theta": 1e7, "scale_context": 8, "skip_layers": [0]},  # above every family's base
}
HALF = {torch.bfloat16: "bf16", torch.float16: "fp16"}
#: Half a unit in the last place of a logit below 1 in magnitude (bf16 keeps 8 significant bits, fp16 11): the
#: error one more rounding of the output adds. Every tiny model's logits stay below 1 (asserted), so a method's
#: error may exceed twice the plain model's by at most one such rounding — about 2.1–2.4× the plain model's own
#: bf16/fp16 error in all (the former floor, 8 format resolutions, allowed 10–30×). Measured on these settings
#: (2 layers, 40 tokens): at most 1.64× the plain model's largest error (Landmark, which inserts tokens) and
#: 1.22× its RMS error, which is the steadier statistic. Random tiny models are nearly insensitive to positions
#: (tripling every position moves the 2-layer Llama's logits by under 0.01), so this bounds precision loss in
#: the attention and logit path; the rotation itself is checked exactly against references elsewhere.
HALF_ULP = {torch.bfloat16: 2.0**-9, torch.float16: 2.0**-12}
_HALF_IDS = torch.randint(3, 256, (1, HALF_LENGTH), generator=torch.Generator().manual_seed(0))


@functools.cache
def _half_base(family):
    return build_tiny_model(family, num_layers=HALF_LAYERS)


def _half_errors(model, dtype):
    """``(float32 logits, largest |half − float32|, RMS of half − float32)`` of ``model`` (converted to ``dtype``)."""
    vocab = _half_base(model.ropekit_family).config.vocab_size
    with torch.no_grad():
        full = model(_HALF_IDS).logits.float()[..., :vocab]  # Landmark adds a token whose logit is −∞ in every precision
        half = model.to(dtype)(_HALF_IDS).logits.float()[..., :vocab]
    diff = half - full
    return full, diff.abs().max().item(), diff.pow(2).mean().sqrt().item()


def _half_model(family):
    model = copy.deepcopy(_half_base(family))
    model.ropekit_family = family
    return model


@functools.cache
def _plain_half(family, dtype):
    return _half_errors(_half_model(family), dtype)


def _half_cases():
    return [pytest.param(f, m, d, id=f"{f}-{m}-{HALF[d]}") for f in FAMILIES for m in METHODS if applies(f, m)
            for d in HALF]


@pytest.mark.parametrize("family,method,dtype", _half_cases())
def test_half_precision_stays_within_the_plain_models_own_error(family, method, dtype):
    """Every method on every family row, in bf16/fp16 on CPU against its own float32 logits: at most twice the
    plain model's half-precision error plus half an ulp (largest error), and 1.5× its RMS error."""
    full_plain, plain_max, plain_rms = _plain_half(family, dtype)
    assert full_plain.abs().max() < 1.0  # what HALF_ULP assumes
    model = _half_model(family)
    params = ACTING.get(method) or _example(method, model)
    ropekit.extend(model, method, **params)
    full, err_max, err_rms = _half_errors(model, dtype)
    assert not torch.equal(full, full_plain), "the settings must change the model"
    assert full.abs().max() < 1.0
    assert err_max <= 2 * plain_max + HALF_ULP[dtype], (err_max, plain_max)
    assert err_rms <= 1.5 * plain_rms, (err_rms, plain_rms)


@pytest.mark.parametrize("name,rope_type,factor", [("llama3", "llama3", 8.0), ("llama3.2", "llama3", 32.0),
                                                   ("qwen3-yarn", "yarn", 4.0), ("phi3.5", "longrope", 4.0),
                                                   ("phi4-mini", "longrope", 4.0)])
def test_inspect_prints_the_existing_scaling_and_the_effective_window(name, rope_type, factor, run_cli, monkeypatch):
    """``ropekit inspect tiny-<shipped>``: the RoPE scaling the checkpoint ships, its original window (the tiny
    models' 64 tokens) and the effective window methods extend from (factor × 64), in the table and in --json."""
    import json

    from ropekit.cli import common

    monkeypatch.setattr(common.out, "_width", 400)  # one table row per line
    code, out, err = run_cli("inspect", f"tiny-{name}")
    assert code == 0, err
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) == 4:  # "│ key │ value │"
            rows[cells[1]] = cells[2]
    window = int(factor * 64)
    scaling = json.loads(rows["existing scaling"])
    assert scaling["rope_type"] == rope_type and scaling["factor"] == factor
    assert scaling["original_max_position_embeddings"] == 64
    assert rows["effective window"].startswith(f"{window:,} tokens")
    assert rows["original_window"] == "64" and rows["window"] == str(window)

    code, out, err = run_cli("inspect", f"tiny-{name}", "--json")
    facts = json.loads(out)
    assert (facts["effective_window"], facts["original_window"], facts["rope_type"]) == (window, 64, rope_type)
    assert all(facts["rope_scaling"][key] == value for key, value in scaling.items())  # the table omits factor lists


def test_inspect_of_plain_rope_prints_no_existing_scaling(run_cli, monkeypatch):
    from ropekit.cli import common

    monkeypatch.setattr(common.out, "_width", 400)
    code, out, _ = run_cli("inspect", "tiny")
    assert code == 0 and "existing scaling" not in out and "effective window" not in out


# ---- families whose attention ropekit cannot reach everywhere ------------------------------------------------
def _from_config(model_type, **extra):
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(CONFIG_MAPPING[model_type](**{**common, **extra})).eval()


ATTENTION_SIDE = ["harpe", "self_extend", "lm_infinite", "dual_chunk", "landmark"]


@pytest.mark.parametrize("model_type, extra, nope", [
    ("smollm3", {"no_rope_layer_interval": 2}, (1, 3)),  # no_rope_layers [1, 0, 1, 0]: 1 = RoPE
    ("exaone4", {"sliding_window": 32, "sliding_window_pattern": 2}, (1, 3)),  # global layers are NoPE
    ("cohere2", {"sliding_window": 32, "layer_types": ["sliding_attention", "full_attention"] * 2}, (1, 3)),
])
def test_layers_without_rope_refuse_the_methods_that_re_rotate_them(model_type, extra, nope):
    """Self-Extend, HARPE, Dual Chunk… re-rotate queries and keys in each layer they change: on a layer that applies
    no RoPE that rotates vectors the model never rotated (EXAONE 4 got Self-Extend only on its NoPE layers). The
    NoPE layers here are read off the model files' own conditions, written out by hand."""
    from ropekit.install.capabilities import model_features

    model = _from_config(model_type, **extra)
    assert model_features(model).nope_layers == nope
    ids = torch.randint(3, 120, (1, 40))
    with torch.no_grad():
        plain = model(ids).logits
    for method in ATTENTION_SIDE:
        with pytest.raises(RopekitError) as err:
            ropekit.extend(model, method, **_example(method, model))
        assert "apply no RoPE" in str(err.value) and "\n" not in str(err.value), method
    with torch.no_grad():
        assert torch.equal(model(ids).logits, plain)  # all or nothing
    ropekit.extend(model, "yarn", factor=2.0)  # a frequency method changes only the layers with RoPE


def test_a_family_whose_attention_bypasses_the_attention_interface_refuses_attention_side_methods():
    """Falcon's attention does not dispatch through AttentionInterface: ropekit's attention was recorded and saved
    but never ran (Self-Extend gave the plain model's logits; HARPE, whose per-head rotation is that attention,
    left a model with no positions at all)."""
    model = _from_config("falcon", new_decoder_architecture=True, num_kv_heads=2, alibi=False)
    ids = torch.randint(3, 120, (1, 40))
    with torch.no_grad():
        plain = model(ids).logits
    for method in ATTENTION_SIDE + ["entropy_abf", "longlora"]:
        with pytest.raises(RopekitError) as err:
            ropekit.extend(model, method, **_example(method, model))
        assert "AttentionInterface" in str(err.value), method
    with torch.no_grad():
        assert torch.equal(model(ids).logits, plain)
    ropekit.extend(model, "pi", factor=2.0)  # frequencies live in the rotary module, which Falcon does use
    assert ropekit.installed(model)["method"] == "pi"


def test_switching_to_ropekits_attention_is_checked_not_assumed(monkeypatch):
    """The last guard: when a model does not take ropekit's attention implementation (transformers only logs it),
    installing refuses in one line and the model is left as it was."""
    model = build_tiny_model("llama", num_layers=2)
    monkeypatch.setattr(type(model), "set_attn_implementation", lambda self, impl: None)
    with pytest.raises(RopekitError) as err:
        ropekit.extend(model, "self_extend", **_example("self_extend", model))
    assert "did not take ropekit's attention" in str(err.value)
    assert ropekit.installed(model) is None


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen3_vl"])
def test_multimodal_rope_is_refused_before_anything_changes(model_type):
    """Qwen2-VL's M-RoPE splits the rotary channels among (time, height, width) positions, and the vision tower has a
    rotary module of its own, which rope_info read (rotary_dim 8 of the text's 16); extend then broke the forward."""
    from transformers import CONFIG_MAPPING, AutoModelForImageTextToText

    text = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    vision = {"depth": 1, "hidden_size": 32, "embed_dim": 32, "num_heads": 2, "out_hidden_size": 64, "intermediate_size": 32}
    config = CONFIG_MAPPING[model_type](text_config=text, vision_config=vision)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config).eval()
    before = {k: v.clone() for k, v in model.state_dict().items() if "inv_freq" in k}
    with pytest.raises(RopekitError) as err:
        ropekit.extend(model, "pi", factor=2.0)
    assert "multimodal RoPE (mrope_section" in str(err.value) and "\n" not in str(err.value)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    with pytest.raises(RopekitError):
        ropekit.rope_info(model)


def test_llama4_nope_layers_and_its_interleaved_rotation_are_read_off_its_model_file():
    """Llama 4 rotates under ``if self.use_rope:  # <comment>`` with ``apply_rotary_emb`` (not
    ``apply_rotary_pos_emb``) and pairs adjacent channels as complex numbers (no ``rotate_half``): neither was
    detected, and Self-Extend was accepted — re-rotating its NoPE layer and rotating the others in the half-split
    layout. The reference: the config's ``no_rope_layers`` (1 = RoPE) and the model file's complex rotation applied
    to a probe, written out."""
    from transformers.models.llama4 import modeling_llama4

    from ropekit.install.capabilities import model_features

    model = _from_config("llama4_text", head_dim=16, intermediate_size_mlp=96, num_local_experts=2)
    want_nope = tuple(i for i, use in enumerate(model.config.no_rope_layers) if not use)
    assert want_nope == (3,)  # every 4th layer by default
    features = model_features(model)
    assert features.nope_layers == want_nope
    # the model file's rotation of [0, 1, 2, 3] by a quarter turn: (0, 1) and (2, 3) pair up
    quarter = torch.polar(torch.ones(1, 1, 2), torch.full((1, 1, 2), torch.pi / 2))
    probe = torch.arange(4.0).view(1, 1, 1, 4)
    rotated, _ = modeling_llama4.apply_rotary_emb(probe, probe, quarter)
    assert torch.allclose(rotated.flatten(), torch.tensor([-1.0, 0.0, -3.0, 2.0]), atol=1e-6)  # adjacent pairs
    assert features.rotary_layout == "interleaved"
    for method in ("self_extend", "lm_infinite", "dual_chunk"):
        with pytest.raises(RopekitError, match="apply no RoPE|interleaved") as err:
            ropekit.extend(model, method, **_example(method, model))
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("model_type, extra, rope_on", [
    ("afmoe", {"layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 32,
               "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32, "num_dense_layers": 1}, "sliding"),
])
def test_afmoe_global_layers_are_nope(model_type, extra, rope_on):
    """AFMoE rotates only ``if self.is_local_attention``: its full-attention layers are NoPE, and the attention-side
    methods — installed on exactly those layers — re-rotated them (logits moved by 0.29). The reference: the
    config's layer types."""
    from ropekit.install.capabilities import model_features

    model = _from_config(model_type, **extra)
    want = tuple(i for i, t in enumerate(model.config.layer_types) if t == "full_attention")
    assert model_features(model).nope_layers == want == (1, 3)
    for method in ("self_extend", "dual_chunk"):
        with pytest.raises(RopekitError, match="apply no RoPE"):
            ropekit.extend(model, method, **_example(method, model))


def test_a_decoder_that_decides_which_layers_rotate_refuses_the_re_rotating_methods():
    """LaraMini's attention rotates ``if position_embeddings is not None`` and its decoder passes none to the
    full-attention layers: which layers are NoPE is not the attention module's to say, and Self-Extend was installed
    on exactly those layers (logits moved by 0.22). Refused; a frequency method still applies."""
    from ropekit.install.capabilities import model_features

    model = _from_config("lara_mini", layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=32)
    features = model_features(model)
    assert features.rope_layers_unknown and features.describe()["layers_without_rope"] is None
    for method in ("self_extend", "dual_chunk", "lm_infinite"):
        with pytest.raises(RopekitError, match="only where the decoder passes position embeddings"):
            ropekit.extend(model, method, **_example(method, model))
    ropekit.extend(model, "pi", factor=2.0)


@pytest.mark.parametrize("model_type, extra, why", [
    ("granite_swa", {"layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 32},
     "copies of the config"),
    ("phimoe", {"num_local_experts": 2, "num_experts_per_tok": 1}, "recomputes its frequencies"),
])
def test_rotary_modules_a_config_rope_type_does_not_reach_refuse_frequency_methods(model_type, extra, why):
    """Granite SWA runs rotary modules built from deep copies of the config, so PI ×4 gave the plain model's logits
    exactly (transformers' own `linear` ×4 differs by 2e-2); PhiMoE recomputes its frequencies from the config at
    every call and reads long/short mscale keys ropekit's rope types lack (KeyError at the first forward). Both
    refused in one line, the model left as it was."""
    model = _from_config(model_type, **extra)
    ids = torch.randint(3, 120, (1, 24))
    with torch.no_grad():
        plain = model(ids).logits
    for method in ("pi", "yarn", "dynamic_ntk"):
        with pytest.raises(RopekitError, match=why) as err:
            ropekit.extend(model, method, factor=4.0)
        assert "\n" not in str(err.value)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, plain)


def test_inspect_agrees_with_extend_on_a_hybrid_model():
    """Qwen3-Next puts linear-attention layers between its attention layers: ``inspect`` listed Self-Extend, HARPE,
    Entropy-ABF… as applicable and ``extend`` refused them (its attention transforms follow every layer). Each
    method ``inspect`` lists installs, and each one it rules out is refused by ``extend`` with the same line."""
    model = _from_config("qwen3_next", num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                         head_dim=16, linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8,
                         linear_value_head_dim=8, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                         shared_expert_intermediate_size=16)
    report = ropekit.inspect_model(model)
    verdicts = {row["name"]: row["applies"] for row in report["methods"]}
    for method in ATTENTION_SIDE + ["entropy_abf", "longlora"]:
        assert verdicts[method] is False, method
        with pytest.raises(RopekitError, match="1 attention modules for 2 layers"):
            ropekit.extend(copy.deepcopy(model), method, **_example(method, model))
    for method in ("pi", "yarn"):
        assert verdicts[method] is True
        ropekit.extend(copy.deepcopy(model), method, factor=2.0)


def test_a_text_model_whose_mrope_sections_see_one_position_takes_frequency_methods():
    """Qwen3.5's language model (what AutoModelForCausalLM builds from a Qwen3.5 checkpoint) carries M-RoPE sections
    in its config, but expands 1-D positions to three identical streams: its RoPE is plain 1-D RoPE, and YaRN ×4 on
    it was refused as multimodal. Now it installs, and equals transformers' own yarn on the same weights exactly (a
    model with a vision tower is still refused: test_multimodal_rope_is_refused_before_anything_changes)."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    shape = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128, head_dim=16,
                 layer_types=["linear_attention", "full_attention"], linear_num_value_heads=2, linear_num_key_heads=2,
                 linear_key_head_dim=8, linear_value_head_dim=8)
    base = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1],
            "mrope_interleaved": True}

    def build(rope):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(CONFIG_MAPPING["qwen3_5_text"](**shape, rope_parameters=rope)).eval()

    model = build(base)
    ropekit.extend(model, "yarn", factor=4.0)
    reference = build({**base, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128})
    ids = torch.randint(3, 120, (1, 300))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)


def test_a_config_with_per_layer_attention_shapes_is_refused_in_one_line():
    """Gemma 4's config refuses a global ``head_dim`` (transformers' heterogeneous per-layer configs); ropekit read it
    and crashed with transformers' AmbiguousGlobalPerLayerAttributeError. One line now, by extend and inspect."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    config = CONFIG_MAPPING["gemma4_text"](vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                           max_position_embeddings=128)
    model = AutoModelForCausalLM.from_config(config).eval()
    for call in (lambda: ropekit.extend(model, "yarn", factor=2.0), lambda: ropekit.inspect_model(model)):
        with pytest.raises(RopekitError, match="sets its attention shape per layer") as err:
            call()
        assert "\n" not in str(err.value)


def test_a_rope_entry_for_a_layer_type_no_layer_has_is_not_the_one_extended():
    """A Gemma 3 config whose layers all slide still carries a ``full_attention`` RoPE entry, for which the model
    builds no frequencies: ropekit picked it as the type to extend and crashed with AttributeError (extend and
    inspect). The types are the layers' own now: YaRN ×2 goes to the sliding layers, equal to transformers' own yarn
    written into that entry."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    def build(sliding_rope):
        config = CONFIG_MAPPING["gemma3_text"](
            vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=128, sliding_window=32,
            layer_types=["sliding_attention"] * 2,
            rope_parameters={"sliding_attention": sliding_rope,
                             "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}})
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config).eval()

    plain = {"rope_type": "default", "rope_theta": 10000.0}
    model = build(plain)
    report = ropekit.inspect_model(model)  # it raised AttributeError
    assert any(row["name"] == "yarn" and row["applies"] for row in report["methods"])
    ropekit.extend(model, "yarn", factor=2.0)
    reference = build({**plain, "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128})
    ids = torch.randint(3, 120, (1, 200))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=1e-6)
