"""Methods on models whose RoPE is already scaled (``linear``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``).

References: the pre-scaled model itself (an identity setting must give its logits bit for bit), and each
method's composition rule computed by hand here from the model's effective frequencies — which come from
transformers' own implementation of the model's rope type.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import ropekit
from ropekit import RopekitError
from ropekit.models.tiny import build_tiny_model

PAIRS = 8  # head size 16
LONG = [1.0, 1.2, 1.6, 2.2, 3.0, 3.6, 4.0, 4.0]
SHORT = [1.0, 1.0, 1.05, 1.1, 1.2, 1.25, 1.3, 1.3]
#: name → (rope_scaling over base 1e4, max_position_embeddings). Original windows are 32 tokens.
BASES = {
    "linear": ({"rope_type": "linear", "factor": 2.0}, 128),
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, 64),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}, 128),
    "yarn-underdeclared": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}, 40),
    "yarn-gptoss": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "truncate": False}, 128),
    "llama3": ({"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32}, 128),
    "longrope-static": ({"rope_type": "longrope", "short_factor": LONG, "long_factor": LONG, "factor": 4.0,
                         "original_max_position_embeddings": 32}, 128),
    "longrope": ({"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG, "factor": 4.0,
                  "original_max_position_embeddings": 32}, 128),
}
LENGTH_DEPENDENT = {"dynamic", "longrope"}


def prescaled(name: str, family: str = "llama", layers: int = 2):
    rope, window = BASES[name]
    return build_tiny_model(family, window=window, rope_scaling=rope, num_layers=layers)


def effective(model, seq_len=None):
    """The pre-scaled model's frequencies and attention factor, from transformers' own rope function."""
    config = model.config
    return ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, None, seq_len=seq_len)


#: method → identity parameters (on the 2-layer tiny Llama); ``theta`` means the model's own base.
IDENTITY = {
    "pi": {"factor": 1.0},
    "ntk": {"factor": 1.0},
    "dynamic_ntk": {"factor": 1.0},
    "ntk_by_parts": {"factor": 1.0},
    "yarn": {"factor": 1.0},
    "llama3": {"factor": 1.0},
    "longrope": {"long_factor": [1.0] * PAIRS, "attention_factor": 1.0, "factor": 1.0},
    "abf": {"rope_theta": "theta"},
    "entropy_abf": {"rope_theta": "theta", "scale_context": 1000},
    "self_extend": {"window_size": 120, "group_size": 2},
    "lm_infinite": {"local_window": "window"},  # identity while every input fits the window
    "longlora": {"factor": 1.0},
    "clex": {},
    "landmark": {"mem_freq": 500},
    "dynamic_yarn": {"factor": 1.0},
    "dual_chunk": {"chunk_size": "window", "local_size": 1},  # one chunk covers every input below
}


def _cases():
    for base in BASES:
        for method in IDENTITY:
            if base in LENGTH_DEPENDENT and method in ("dynamic_ntk", "clex"):
                continue  # refused (test below)
            yield base, method


@pytest.mark.parametrize("base,method", list(_cases()))
def test_identity_settings_give_the_prescaled_model_bit_for_bit(base, method, make_ids):
    model = prescaled(base)
    reference = prescaled(base)
    window = ropekit.rope_info(model).window
    params = {k: {"theta": 10000.0, "window": window}.get(v, v) if isinstance(v, str) else v
              for k, v in IDENTITY[method].items()}
    if method == "self_extend" and BASES[base][1] <= 120:
        params["window_size"] = BASES[base][1] - 4
    ropekit.extend(model, method, **params)
    lengths = (20, 100, 30)  # longer, then shorter: a length-dependent base switches back
    if method == "self_extend":  # degenerate only while every pair is closer than W (< the window)
        lengths = tuple(min(n, params["window_size"]) for n in lengths)
    if method == "lm_infinite":  # degenerate only while every pair is closer than L = the window
        lengths = tuple(min(n, window) for n in lengths)
    if method == "dual_chunk":  # degenerate only while the input fits one chunk of chunk_size − local_size tokens
        lengths = tuple(min(n, params["chunk_size"] - params["local_size"]) for n in lengths)
    for length in lengths:
        ids = make_ids(length)
        with torch.no_grad():
            ours, ref = model(ids).logits, reference(ids).logits
        assert torch.equal(ours[..., : ref.shape[-1]], ref), (base, method, length)


@pytest.mark.parametrize("base", ["dynamic", "longrope"])
@pytest.mark.parametrize("method", ["dynamic_ntk", "clex"])
def test_length_dependent_methods_on_a_length_dependent_base_are_refused(base, method):
    model = prescaled(base)
    with pytest.raises(RopekitError) as err:
        ropekit.extend(model, method, factor=2.0)
    line = str(err.value)
    assert "\n" not in line and method in line and "length" in line and "use a method" in line
    assert ropekit.installed(model) is None


def test_changing_rope_theta_under_a_scaled_rope_is_refused():
    with pytest.raises(RopekitError, match="rope_theta cannot change.*llama3.*use abf"):
        ropekit.extend(prescaled("llama3"), "pi", factor=2.0, rope_theta=5e4)


# ---- each rule against a hand computation --------------------------------------------------------------------
def _pairs() -> torch.Tensor:
    return torch.arange(PAIRS, dtype=torch.float64)


def _hand(method: str, params: dict, theta: torch.Tensor, factor_eff: float, window: int) -> tuple[torch.Tensor, float]:
    """The composition rule written out: ``theta`` are the effective frequencies (float64), returns θ' and the
    attention factor to multiply with the model's own."""
    d = 2 * PAIRS
    i = _pairs()
    s = params.get("factor", 1.0)
    if method in ("pi", "longlora"):
        return theta / s, 1.0
    if method == "ntk":
        return theta * s ** (-2 * i / (d - 2)), 1.0
    if method == "abf":
        return theta * (1e4 / params["rope_theta"]) ** (2 * i / d), 1.0
    if method in ("ntk_by_parts", "yarn"):
        r = window / (2 * math.pi / theta)
        if params.get("ramp", "ratio" if method == "ntk_by_parts" else "dim") == "ratio":
            gamma = ((r - 1.0) / (32.0 - 1.0)).clamp(0, 1)
        else:  # the pair index where log r crosses log β, linear between neighbours, floor/ceil, clipped
            def cross(beta):
                lr = torch.log(r)
                for k in range(PAIRS - 1):
                    if lr[k + 1] < math.log(beta) or k == PAIRS - 2:
                        return k + (lr[k] - math.log(beta)).item() / (lr[k] - lr[k + 1]).item()
            low, high = max(math.floor(cross(32.0)), 0), min(math.ceil(cross(1.0)), d - 1)
            gamma = 1 - ((i - low) / (high - low)).clamp(0, 1)
        out = (1 - gamma) * theta / s + gamma * theta
        return out, (0.1 * math.log(s) + 1 if method == "yarn" else 1.0)
    if method == "llama3":
        lam = 2 * math.pi / theta
        lo, hi = window / 1.0, window / 4.0
        kappa = (window / lam - 1.0) / (4.0 - 1.0)
        out = torch.where(lam > lo, theta / s, torch.where(lam < hi, theta, (1 - kappa) * theta / s + kappa * theta))
        return out, 1.0
    if method == "longrope":  # at installation (no input yet): the short set
        return theta / torch.tensor(params["short_factor"], dtype=torch.float64), params["attention_factor"]
    raise AssertionError(method)


RULES = [
    ("pi", {"factor": 2.0}),
    ("ntk", {"factor": 4.0}),
    ("abf", {"rope_theta": 2e5}),
    ("ntk_by_parts", {"factor": 4.0}),
    ("yarn", {"factor": 4.0}),
    ("yarn", {"factor": 2.0, "ramp": "ratio"}),
    ("llama3", {"factor": 4.0}),
    ("longrope", {"long_factor": [1.0, 1.0, 1.5, 2.0, 2.0, 3.0, 4.0, 4.0], "short_factor": [1.0, 1.1, 1.1, 1.2, 1.2, 1.3, 1.3, 1.4],
                  "attention_factor": 1.2, "factor": 4.0}),
    ("longlora", {"factor": 2.0}),
]


@pytest.mark.parametrize("base", ["linear", "yarn", "yarn-gptoss", "llama3", "longrope-static"])
@pytest.mark.parametrize("method,params", RULES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(RULES)])
def test_each_rule_equals_its_hand_computation(base, method, params):
    model = prescaled(base)
    theta, af = effective(model)
    window = ropekit.rope_info(model).window
    ropekit.extend(model, method, **params)
    rotary = model.model.rotary_emb
    want, own_factor = _hand(method, params, theta.double(), 1.0, window)
    torch.testing.assert_close(rotary.inv_freq.double(), want, rtol=2e-6, atol=0)
    assert math.isclose(rotary.attention_scaling, af * own_factor, rel_tol=1e-9)


def test_effective_window_of_an_underdeclared_yarn_model():
    # Qwen's documented recipe: yarn factor 4 over 32,768 tokens, max_position_embeddings left at 40,960
    info = ropekit.rope_info(prescaled("yarn-underdeclared"))
    assert info.window == 128 and info.original_window == 32


def test_a_switching_base_keeps_switching_under_a_static_method(make_ids):
    """PI on a LongRoPE model with different short and long factors: short set up to 32 tokens, long beyond —
    in the order long, short, long, as transformers switches the pre-scaled model."""
    model = prescaled("longrope")
    ropekit.extend(model, "pi", factor=2.0)
    rotary = model.model.rotary_emb
    for length, seq_len in ((100, 33), (20, None), (33, 33), (32, None)):
        with torch.no_grad():
            model(make_ids(length))
        theta, af = effective(prescaled("longrope"), seq_len=seq_len)
        torch.testing.assert_close(rotary.inv_freq, theta / 2.0, rtol=0, atol=0)
        assert rotary.attention_scaling == af


def test_a_dynamic_base_recomputes_as_transformers_does(make_ids):
    model, reference = prescaled("dynamic"), prescaled("dynamic")
    ropekit.extend(model, "ntk", factor=2.0)
    d = 2 * PAIRS
    for length in (50, 90, 150, 40, 120):  # inside, growing past 64, shrinking back below it
        ids = make_ids(length)
        with torch.no_grad():
            model(ids)
            reference(ids)
        want = reference.model.rotary_emb.inv_freq.double() * 2.0 ** (-2 * _pairs() / (d - 2))
        torch.testing.assert_close(model.model.rotary_emb.inv_freq.double(), want, rtol=2e-6, atol=0)


@pytest.mark.parametrize("base", ["llama3", "longrope"])
@pytest.mark.parametrize("method,params", [("self_extend", {"window_size": 16, "group_size": 4}),
                                           ("lm_infinite", {"local_window": 24})])
def test_attention_side_methods_rotate_with_the_scaled_frequencies(base, method, params, make_ids):
    """Beyond their degenerate setting the attention methods still see the model's scaled frequencies: the
    rotary module of the extended model is the pre-scaled model's, and so are the frequencies the attention
    function itself rotates queries and keys with (``ropekit_attend.inv_freq()``), at every length — the short
    set up to the original window and the long one beyond it on a switching LongRoPE base."""
    model, reference = prescaled(base), prescaled(base)
    ropekit.extend(model, method, **params)
    attends = [layer.self_attn.ropekit_attend for layer in model.model.layers]
    assert all(attend is not None for attend in attends)
    for length in (20, 100, 25):
        with torch.no_grad():
            model(make_ids(length))
            reference(make_ids(length))
        assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)
        assert model.model.rotary_emb.attention_scaling == reference.model.rotary_emb.attention_scaling
        theta, _ = effective(prescaled(base), seq_len=length)  # transformers' own rope function at this length
        for attend in attends:
            torch.testing.assert_close(attend.inv_freq().float(), theta.float(), rtol=0, atol=0)


@pytest.mark.parametrize("method,params", [("longrope", {"long_factor": [2.0] * PAIRS, "factor": 2.0,
                                                          "original_max_position_embeddings": 32}),
                                           ("pi", {"factor": 2.0}), ("yarn", {"factor": 2.0})])
def test_a_scaled_base_extended_twice_declares_twice_its_window(method, params):
    """On a LongRoPE base (window 128 over an original 32) every method with factor 2 declares 256 tokens: the
    factor divides the base's effective frequencies. (LongRoPE declared 32 × 2 = 64, half the base's own window,
    from the original window it must share with the base to switch sets at the same length.)"""
    model = prescaled("longrope")
    assert ropekit.rope_info(model).window == 128
    ropekit.extend(model, method, **params)
    assert model.config.max_position_embeddings == 256


def test_llama31_shaped_config_has_the_scaled_effective_window():
    """Llama 3.1's shipped RoPE: llama3 factor 8 over 8,192 tokens, max_position_embeddings 131,072."""
    from transformers import LlamaConfig

    from ropekit.core.base_rope import base_frequencies

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=131072,
                         rope_parameters=rope)
    info = ropekit.rope_info(config)
    assert (info.window, info.original_window, info.rope_type, info.is_scaled) == (131072, 8192, "llama3", True)
    # the effective frequencies: Meta's apply_scaling written out here on θ_i = b^(−2i/d)
    d = 16
    theta = 500000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    lam = 2 * math.pi / theta
    smooth = (8192 / lam - 1.0) / (4.0 - 1.0)
    want = torch.where(lam < 8192 / 4.0, theta,
                       torch.where(lam > 8192 / 1.0, theta / 8.0, (1 - smooth) * theta / 8.0 + smooth * theta))
    got, factor = base_frequencies(info)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    assert factor == 1.0


# ---- the length-dependent and attention-side rules against a hand computation ----------------------------------
STATIC_BASES = ["linear", "yarn", "yarn-gptoss", "llama3", "longrope-static"]


def _ntk_by_ratio(theta: torch.Tensor, alpha: float) -> torch.Tensor:
    """NTK's base change b → b·α^(d/(d−2)) as the per-pair ratio α^(−2i/(d−2)) (LCEG Eq. 9)."""
    d = 2 * PAIRS
    return theta * alpha ** (-2 * _pairs() / (d - 2))


@pytest.mark.parametrize("base", STATIC_BASES)
def test_dynamic_ntk_on_a_prescaled_base_equals_its_hand_computation(base, make_ids):
    """θ'_i(L) = θ^eff_i · α(L)^(−2i/(d−2)) with α(L) = s·max(W, L)/W − (s − 1), W the effective window and L
    the longest input seen (transformers' dynamic rule): the model's own frequencies inside W."""
    model = prescaled(base)
    theta, af = effective(model)
    window = ropekit.rope_info(model).window
    s = 2.0
    ropekit.extend(model, "dynamic_ntk", factor=s)
    rotary = model.model.rotary_emb
    longest = 0
    for length in (100, window, 200, 320, 150):
        with torch.no_grad():
            model(make_ids(length))
        longest = max(longest, length)
        alpha = s * max(window, longest) / window - (s - 1)
        torch.testing.assert_close(rotary.inv_freq.double(), _ntk_by_ratio(theta.double(), alpha), rtol=2e-6, atol=0)
        assert math.isclose(rotary.attention_scaling, af, rel_tol=1e-9), (length, rotary.attention_scaling, af)


@pytest.mark.parametrize("base", STATIC_BASES)
def test_dynamic_yarn_on_a_prescaled_base_equals_its_hand_computation(base, make_ids):
    """YaRN's rule on the effective frequencies at s(L) = min(max(1, L/W), factor) for each input of L tokens, W
    the effective window: θ^eff itself inside W, and temperature (0.1·ln s(L) + 1) times the model's own factor.
    (On a switching LongRoPE base, which switches at its original window, dynamic_yarn is refused.)"""
    model = prescaled(base)
    window = ropekit.rope_info(model).window
    ropekit.extend(model, "dynamic_yarn", factor=4.0)
    rotary = model.model.rotary_emb
    for length in (100, 200, 320, 40, 700, window):  # every input gets its own factor, in any order
        with torch.no_grad():
            model(make_ids(length))
        s = min(max(1.0, length / window), 4.0)
        theta, af = effective(prescaled(base), seq_len=length)
        want, own = _hand("yarn", {"factor": s}, theta.double(), 1.0, window)
        torch.testing.assert_close(rotary.inv_freq.double(), want, rtol=2e-6, atol=0)
        assert math.isclose(rotary.attention_scaling, af * own, rel_tol=1e-6), (length, s)
        if s == 1.0:
            assert own == 1.0 and torch.equal(rotary.inv_freq, theta.to(rotary.inv_freq.dtype))


@pytest.mark.parametrize("base", STATIC_BASES)
def test_untrained_clex_on_a_prescaled_base_is_ntk_with_alpha_2t_minus_1(base):
    """With W_down = 0 CLEX's ODE integrates ∂_t log ξ(t) exactly: NTK's per-pair ratio at α = 2t − 1 on the
    effective frequencies, t = n/W (W the effective window), and the model's own frequencies inside W. Checked on
    the rotary module's own cos/sin output (CLEX computes it)."""
    model = prescaled(base)
    theta, af = effective(model)
    window = ropekit.rope_info(model).window
    ropekit.extend(model, "clex", max_factor=4)
    rotary = model.model.rotary_emb
    x = torch.zeros(1, 1, 2 * PAIRS)
    for n in (window // 2, window, 200, 320, 700):
        t = min(max(1.0, n / window), 4.0)
        want = _ntk_by_ratio(theta.double(), 2 * t - 1)
        angles = torch.arange(n, dtype=torch.float64)[:, None] * want[None, :]
        with torch.no_grad():
            cos, sin = rotary(x, torch.arange(n)[None])
        tol = 1e-4 if t > 1 else 2e-5  # float32 angles up to 700 rad; RK4 at step 0.01 beyond the window
        torch.testing.assert_close(cos[0, :, :PAIRS].double(), torch.cos(angles) * af, rtol=0, atol=tol)
        torch.testing.assert_close(sin[0, :, PAIRS:].double(), torch.sin(angles) * af, rtol=0, atol=tol)


def _logit_scaled_attention(context: int, skip: set[int]):
    """An attention function written here: sdpa with each query row m multiplied by max(log_c(m+1), 1)
    (Entropy-ABF Eq. 5) on the layers not in ``skip``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module, query, key, value, attention_mask, **kwargs):
        if module.layer_idx not in skip:
            pos = kwargs["position_ids"].to(torch.float64)
            t = torch.clamp(torch.log(pos + 1) / math.log(context), min=1.0)
            query = query * t[:, None, :, None].to(query.dtype)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    return attention


@pytest.mark.parametrize("base", ["llama3", "yarn-gptoss", "longrope"])
def test_entropy_abf_on_a_prescaled_base_scales_logits_with_the_effective_window(base, make_ids):
    """Entropy-ABF = ABF's per-pair rule (checked above) plus the logit scale max(log_c i, 1) with c = the
    effective window: the same model with ABF alone and the scale written out in its attention gives its logits."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    model, reference = prescaled(base, layers=3), prescaled(base, layers=3)
    window = ropekit.rope_info(model).window
    assert window == 128 and ropekit.rope_info(model).original_window == 32  # c is W, not the original 32
    ropekit.extend(model, "entropy_abf", rope_theta=2e5)
    assert ropekit.installed(model)["params"]["scale_context"] == window
    ropekit.extend(reference, "abf", rope_theta=2e5)
    name = f"test_entropy_logits_{window}"
    AttentionInterface.register(name, _logit_scaled_attention(window, {0, 1}))
    AttentionMaskInterface.register(name, sdpa_mask)
    reference.set_attn_implementation(name)
    for length in (100, 200, 30):  # the scale only starts past c = 128 tokens
        ids = make_ids(length)
        with torch.no_grad():
            ours, ref = model(ids).logits, reference(ids).logits
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    ids = make_ids(200)
    with torch.no_grad():  # and the scale is really there: without it the logits past c differ
        plain = prescaled(base, layers=3)
        ropekit.extend(plain, "abf", rope_theta=2e5)
        assert not torch.allclose(model(ids).logits[:, 150:], plain(ids).logits[:, 150:], atol=1e-4)
        torch.testing.assert_close(model(ids).logits[:, :128], plain(ids).logits[:, :128], rtol=1e-5, atol=1e-5)


# ---- every method states its composition rule ------------------------------------------------------------------
@pytest.mark.parametrize("method", [m.name for m in ropekit.list_methods()])
def test_every_method_states_its_composition_rule(method, run_cli):
    """The ``composition`` attribute (what ``ropekit methods`` prints) and a "Composition:" paragraph in the
    method's docstring, for every registered method."""
    import json

    from ropekit.methods import get_method

    m = get_method(method)
    assert m.composition.strip(), method
    assert "Composition" in (type(m).__doc__ or ""), f"{method}: no Composition paragraph in its docstring"
    code, out, _ = run_cli("methods", "--json")
    assert code == 0
    listed = {d["name"]: d for d in json.loads(out)}
    assert listed[method]["composition"] == m.composition


def test_longrope_on_a_switching_base_is_refused_with_the_switch_that_fits_and_that_setting_installs():
    """LongRoPE's switch defaults to the effective window (128), the switching base's to its original one (32): the
    refusal names original_max_position_embeddings=32, and with it both switch together, the model's frequencies
    at every length those of one LongRoPE switch (short set up to 32 tokens, long beyond). Methods that follow the
    length on their own schedule get no such hint (no setting of theirs fits)."""
    from ropekit.errors import UnsupportedModelError

    long_factor = [2.0] * PAIRS
    with pytest.raises(UnsupportedModelError) as refused:
        ropekit.extend(prescaled("longrope"), "longrope", long_factor=long_factor, factor=2.0)
    assert "pass --param original_max_position_embeddings=32 to switch where this model's RoPE does" in str(refused.value)
    with pytest.raises(UnsupportedModelError) as refused:
        ropekit.extend(prescaled("longrope"), "dynamic_ntk", factor=2.0)
    assert "original_max_position_embeddings" not in str(refused.value)

    model = prescaled("longrope")
    ropekit.extend(model, "longrope", long_factor=long_factor, factor=2.0, original_max_position_embeddings=32)
    for length in (20, 32, 33, 100):
        theta, _ = effective(prescaled("longrope"), seq_len=length)  # the base's own set at this length
        want = theta.double() / (torch.tensor(long_factor, dtype=torch.float64) if length > 32 else 1.0)
        with torch.no_grad():
            model(torch.zeros(1, length, dtype=torch.long))
        torch.testing.assert_close(model.model.rotary_emb.inv_freq.double(), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("params, said", [
    ({"factor": -1.0}, "parameter 'factor' must be ≥ 1"),
    ({"long_factor": [2.0] * (PAIRS + 1)}, f"this model has {PAIRS} rotary pairs"),
    ({"bogus": 1}, "unknown parameter 'bogus'"),
])
def test_a_parameter_error_is_not_hidden_by_a_refusal_of_the_example_setting(params, said):
    """LongRoPE on a switching base with the switch that fits already given (original_max_position_embeddings=32)
    and one bad parameter: the bad parameter is what is said. Asked with the example setting (switching at the
    effective window) the capability check would refuse, and that refusal told the user to pass what they had."""
    from ropekit.errors import InvalidParameterError

    given = {"long_factor": [2.0] * PAIRS, "factor": 2.0, "original_max_position_embeddings": 32, **params}
    with pytest.raises(InvalidParameterError, match=re.escape(said)) as refused:
        ropekit.extend(prescaled("longrope"), "longrope", **given)
    assert "switch where this model's RoPE does" not in str(refused.value)


def test_a_model_the_method_cannot_serve_is_named_before_a_parameter_it_lacks():
    """HARPE asked without a factor on an already scaled model: the refusal is the model's ('already scaled'), not
    the peak-valley search's request for a factor that could never make it install; on a plain model the missing
    parameter is still what is said."""
    from ropekit.errors import RopekitError, UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="already scaled"):
        ropekit.extend(prescaled("llama3"), "harpe")
    with pytest.raises(RopekitError, match="factor") as plain:
        ropekit.extend(build_tiny_model("llama", window=512), "harpe")
    assert "already scaled" not in str(plain.value)
