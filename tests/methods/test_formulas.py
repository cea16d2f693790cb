"""Every method against its paper's formula, written out here (never via ``ropekit.core.rope``).

* NTK, Dynamic NTK (LCEG's frozen variant included), NTK-by-parts, YaRN and ABF: inverse frequencies
  against the closed forms in float64, with the Llama-2 reference numbers of docs/methods-reference.md §1.
* Entropy-aware ABF and HARPE change attention, so their check is a naive eager attention computed here
  from the module's own projection weights — RoPE as explicit rotations, the causal mask, the logit scale
  and the softmax all written out — compared with what the installed model computes.
"""

from __future__ import annotations

import math

import pytest
import torch

from ropekit.core.hf_compat import cache_argument
from transformers import DynamicCache, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import ropekit
from ropekit.errors import InvalidParameterError
from ropekit.methods import RopeInfo
from ropekit.models.tiny import build_tiny_model

RTOL = 1e-6


def _info(d: int = 128, b: float = 1e4, window: int = 4096, heads: int = 1, kv: int = 1, layers: int = 1) -> RopeInfo:
    return RopeInfo(
        model_type="llama",
        rope_type="default",
        rope_theta=float(b),
        head_dim=d,
        rotary_dim=d,
        partial_rotary_factor=1.0,
        window=window,
        num_heads=heads,
        num_kv_heads=kv,
        num_layers=layers,
    )


def _theta(b: float, d: int) -> torch.Tensor:
    """θ_i = b^(−2i/d), i = 0 … d/2−1, in float64."""
    i = torch.arange(d // 2, dtype=torch.float64)
    return b ** (-2.0 * i / d)


def _assert_rel(ours: torch.Tensor, expected: torch.Tensor, rtol: float = RTOL, what: str = "") -> None:
    assert ours.shape == expected.shape, (ours.shape, expected.shape)
    rel = ((ours.double() - expected).abs() / expected.abs()).max().item()
    assert rel <= rtol, f"{what}: max relative error {rel:.3g} > {rtol:g}"


def _inv(method: str, info: RopeInfo, given: dict, seq_len=None):
    m = ropekit.get_method(method)
    params = m.resolve(info, given)
    inv, att = m.inv_freq(info, params, seq_len=seq_len)
    return inv, att, params


def _base_from_inv_freq(inv: torch.Tensor, d: int) -> float:
    """Recover b' from θ_1 = b'^(−2/d)."""
    return float(inv[1].double() ** (-d / 2.0))


# ================================================================ NTK-aware
@pytest.mark.parametrize("d", [16, 64, 128])
@pytest.mark.parametrize("b", [1e4, 5e5])
@pytest.mark.parametrize("s", [1.5, 2.0, 4.0, 8.0, 32.0])
def test_ntk_base(d, b, s):
    inv, att, _ = _inv("ntk", _info(d, b), {"factor": s})
    b_new = b * s ** (d / (d - 2))
    _assert_rel(inv, _theta(b_new, d), what="θ_i = (b·s^(d/(d−2)))^(−2i/d)")
    assert att == 1.0
    # What the exponent is for: the lowest frequency is scaled exactly like PI, the highest is unchanged.
    _assert_rel(inv[-1:], _theta(b, d)[-1:] / s, what="lowest frequency = θ/s")
    assert inv[0].item() == 1.0


# ================================================================ Dynamic NTK
def _t(s, length, trained, original):
    return s * max(length, trained) / original - (s - 1)


@pytest.mark.parametrize("seq_len", [None, 1, 2048, 4096, 8192, 16384, 32768])
def test_dynamic_ntk_lceg_ntk32k_frozen_base(seq_len):
    """LCEG NTK-32k (s=4, C=4096, C'=32768, Llama-2 d=128 b=1e4): b' ≈ 305,922 for every length ≤ 32k."""
    info = _info(128, 1e4, 4096)
    inv, att, params = _inv("dynamic_ntk", info, {"factor": 4, "trained_length": 32768}, seq_len)
    assert _t(4, 32768, 32768, 4096) == 29
    expected = 1e4 * 29 ** (128 / 126)
    base = _base_from_inv_freq(inv, 128)
    assert base == pytest.approx(expected, rel=1e-5)
    assert base == pytest.approx(305_922, rel=1e-5)  # LCEG NTK-32k, docs/methods-reference.md §1
    _assert_rel(inv, _theta(expected, 128), what="frozen NTK-32k")
    assert att == 1.0
    assert ropekit.get_method("dynamic_ntk").max_position_embeddings(info, params) == 32768


def test_dynamic_ntk_grows_above_trained_length():
    info = _info(128, 1e4, 4096)
    given = {"factor": 4, "trained_length": 32768}
    frozen = _base_from_inv_freq(_inv("dynamic_ntk", info, given, 32768)[0], 128)
    above = _base_from_inv_freq(_inv("dynamic_ntk", info, given, 40000)[0], 128)
    inv, _, _ = _inv("dynamic_ntk", info, given, 65536)
    assert _t(4, 65536, 32768, 4096) == 61
    assert _base_from_inv_freq(inv, 128) == pytest.approx(1e4 * 61 ** (128 / 126), rel=1e-5)
    assert frozen < above < _base_from_inv_freq(inv, 128)


@pytest.mark.parametrize("seq_len", [None, 4096, 65536])
def test_dynamic_ntk_lceg_ntk64k(seq_len):
    inv, _, _ = _inv("dynamic_ntk", _info(128, 1e4, 4096), {"factor": 8, "trained_length": 65536}, seq_len)
    assert _t(8, 65536, 65536, 4096) == 121
    base = _base_from_inv_freq(inv, 128)
    assert base == pytest.approx(1e4 * 121 ** (128 / 126), rel=1e-5)
    assert base == pytest.approx(1_305_706, rel=1e-5)  # LCEG NTK-64k, docs/methods-reference.md §1


def test_dynamic_ntk_frozen_variant_ntk_frozen_at_32k():
    """LCEG 'NTK-frozen': transformers' rule with s=2 on base Llama-2, evaluated at 32k: b' ≈ 156,588."""
    info = _info(128, 1e4, 4096)
    inv, _, params = _inv("dynamic_ntk", info, {"factor": 2}, 32768)
    assert params["trained_length"] == 4096  # trained = original: transformers' rule
    base = _base_from_inv_freq(inv, 128)
    assert base == pytest.approx(1e4 * 15 ** (128 / 126), rel=1e-5)
    assert base == pytest.approx(156_588, rel=1e-5)  # LCEG NTK-frozen, docs/methods-reference.md §1
    # ... and plain RoPE inside the window.
    inside, _, _ = _inv("dynamic_ntk", info, {"factor": 2}, 4096)
    _assert_rel(inside, _theta(1e4, 128), what="inside the window")


def test_dynamic_ntk_frozen_in_a_model(make_ids):
    """Installed: the base stays frozen at its C' value below C', grows above it and comes back."""
    model = build_tiny_model("llama")  # window 64, d = 16, b = 1e4
    ropekit.extend(model, "dynamic_ntk", factor=4, trained_length=128)
    assert model.config.max_position_embeddings == 128
    rotary = model.model.rotary_emb
    d = 16

    def base_after(length):
        with torch.no_grad():
            model(make_ids(length))
        return rotary.inv_freq

    frozen = 1e4 * _t(4, 128, 128, 64) ** (d / (d - 2))
    _assert_rel(base_after(100), _theta(frozen, d), rtol=2e-6, what="frozen below C'")
    grown = 1e4 * _t(4, 200, 128, 64) ** (d / (d - 2))
    _assert_rel(base_after(200), _theta(grown, d), rtol=2e-6, what="dynamic above C'")
    _assert_rel(base_after(100), _theta(frozen, d), rtol=2e-6, what="reset below C'")


# ================================================================ NTK-by-parts and YaRN
def _ratio_gamma(b, d, C, beta_fast=32.0, beta_slow=1.0):
    """YaRN paper §3.2: r_i = C/λ_i, γ = clamp((r − α)/(β − α), 0, 1), α = β_slow, β = β_fast."""
    lam = 2 * math.pi / _theta(b, d)
    r = C / lam
    return ((r - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)


def _dim_gamma(b, d, C, beta_fast=32.0, beta_slow=1.0):
    """The reference code's ramp, linear in the pair index between the correction dims of β_fast and β_slow."""

    def corr(rot):
        return d * math.log(C / (rot * 2 * math.pi)) / (2 * math.log(b))

    low = max(math.floor(corr(beta_fast)), 0)
    high = min(math.ceil(corr(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    i = torch.arange(d // 2, dtype=torch.float64)
    return 1.0 - ((i - low) / (high - low)).clamp(0.0, 1.0)


GRID = [
    (d, b, C, s)
    for d in (16, 64, 128)
    for b in (1e4, 5e5)
    for C in (64, 4096)
    for s in (2.0, 8.0)
]


@pytest.mark.parametrize("d,b,C,s", GRID)
def test_ntk_by_parts_ratio_is_yarn_paper_formula(d, b, C, s):
    inv, att, params = _inv("ntk_by_parts", _info(d, b, C), {"factor": s})
    assert params["ramp"] == "ratio" and params["blend"] == "frequency"
    theta = _theta(b, d)
    gamma = _ratio_gamma(b, d, C)
    _assert_rel(inv, (1 - gamma) * theta / s + gamma * theta, what="θ' = (1−γ)θ/s + γθ")
    assert att == 1.0


def test_ntk_by_parts_custom_betas():
    d, b, C, s = 128, 1e4, 4096, 8.0
    inv, _, _ = _inv("ntk_by_parts", _info(d, b, C), {"factor": s, "beta_fast": 16, "beta_slow": 2})
    theta, gamma = _theta(b, d), _ratio_gamma(b, d, C, 16.0, 2.0)
    _assert_rel(inv, (1 - gamma) * theta / s + gamma * theta, what="β=16, α=2")


def test_ntk_by_parts_ratio_and_dim_ramps_differ():
    """The two ramps are different functions (so the tests above and below can tell them apart)."""
    info = _info(128, 1e4, 4096)
    ratio, _, _ = _inv("ntk_by_parts", info, {"factor": 8})
    dim, _, _ = _inv("ntk_by_parts", info, {"factor": 8, "ramp": "dim"})
    assert ((ratio - dim).abs() / dim).max() > 1e-2


@pytest.mark.parametrize("d,b,C,s", GRID)
def test_ntk_by_parts_dim_equals_transformers_yarn(d, b, C, s):
    inv, att, _ = _inv("ntk_by_parts", _info(d, b, C), {"factor": s, "ramp": "dim"})
    cfg = LlamaConfig(
        hidden_size=d, num_attention_heads=1, num_key_value_heads=1, num_hidden_layers=1, intermediate_size=8,
        vocab_size=8, max_position_embeddings=int(C * s),
        rope_parameters={"rope_type": "yarn", "rope_theta": b, "factor": s, "original_max_position_embeddings": C},
    )
    ref, _ = ROPE_INIT_FUNCTIONS["yarn"](cfg, None)
    _assert_rel(inv, ref.double(), what="transformers yarn inv_freq")
    assert att == 1.0  # NTK-by-parts has no temperature
    # Also the formula written out here.
    theta, gamma = _theta(b, d), _dim_gamma(b, d, C)
    _assert_rel(inv, (1 - gamma) * theta / s + gamma * theta, what="dim ramp formula")


@pytest.mark.parametrize("d,b,C,s", GRID)
def test_yarn_wavelength_blend(d, b, C, s):
    inv, att, _ = _inv("yarn", _info(d, b, C), {"factor": s, "blend": "wavelength"})
    theta, gamma = _theta(b, d), _dim_gamma(b, d, C)
    _assert_rel(inv, theta / ((1 - gamma) * s + gamma), what="θ' = θ/((1−γ)s+γ)")
    assert att == pytest.approx(0.1 * math.log(s) + 1, rel=1e-12)
    freq, _, _ = _inv("yarn", _info(d, b, C), {"factor": s})
    _assert_rel(freq, (1 - gamma) * theta / s + gamma * theta, what="default frequency blend")
    ramp = (gamma > 0) & (gamma < 1)
    if ramp.any():  # inside the ramp the two blends really differ
        assert ((inv - freq).abs()[ramp] / freq[ramp]).max() > 1e-3


def test_yarn_llama2_cheat_sheet():
    """Llama-2 (d=128, b=1e4, C=4096), s=8: ramp dims [20, 46], attention factor 1.2079 (logits × 1.4591)."""
    d, b, C, s = 128, 1e4, 4096, 8.0
    inv, att, _ = _inv("yarn", _info(d, b, C), {"factor": s})
    low = math.floor(d * math.log(C / (32 * 2 * math.pi)) / (2 * math.log(b)))
    high = math.ceil(d * math.log(C / (1 * 2 * math.pi)) / (2 * math.log(b)))
    assert (low, high) == (20, 46)
    theta = _theta(b, d)
    _assert_rel(inv[: low + 1], theta[: low + 1], what="pairs 0–20 keep θ")
    _assert_rel(inv[high:], theta[high:] / s, what="pairs ≥ 46 are θ/8")
    mid = inv[low + 1 : high].double()
    assert torch.all(mid < theta[low + 1 : high]) and torch.all(mid > theta[low + 1 : high] / s)
    assert round(att, 4) == 1.2079
    assert round(att**2, 4) == 1.4591


def test_yarn_attention_factor_override():
    _, att, _ = _inv("yarn", _info(), {"factor": 8, "attention_factor": 1.0})
    assert att == 1.0


# ================================================================ ABF
@pytest.mark.parametrize("d", [16, 128])
def test_abf_default_base(d):
    inv, att, params = _inv("abf", _info(d, 1e4), {})
    assert params["rope_theta"] == 500000.0
    _assert_rel(inv, _theta(500000.0, d), what="θ_i = 500000^(−2i/d)")
    assert att == 1.0


def test_abf_explicit_base_and_declared_factor():
    info = _info(64, 1e4, 4096)
    inv, _, params = _inv("abf", info, {"rope_theta": 5e6, "factor": 4})
    _assert_rel(inv, _theta(5e6, 64), what="b' = 5e6")
    # factor only declares the window; it does not touch the frequencies
    assert ropekit.get_method("abf").max_position_embeddings(info, params) == 4 * 4096


@pytest.mark.parametrize("method", ["abf", "entropy_abf"])
@pytest.mark.parametrize("model_base,given", [(1e6, {}), (5e5, {}), (1e6, {"rope_theta": 5e5}),
                                              (1e4, {"rope_theta": 5e3})])
def test_abf_refuses_a_base_that_does_not_raise_the_models(method, model_base, given):
    """Qwen's 1,000,000 with the default 500,000 would halve every long wavelength; Llama 3's 500,000 would not
    change; an explicit smaller base shrinks the window: one line naming a larger base."""
    with pytest.raises(InvalidParameterError, match="does not raise this model's RoPE base") as err:
        ropekit.get_method(method).resolve(_info(64, model_base, 4096, layers=4), given)
    assert "\n" not in str(err.value) and f"{50 * model_base:,.0f}" in str(err.value)


def test_abf_keeps_an_explicit_base_equal_to_the_models():
    inv, _, params = _inv("abf", _info(64, 5e5), {"rope_theta": 5e5})
    _assert_rel(inv, _theta(5e5, 64), what="b' = b: the model itself")


def test_entropy_abf_shares_abf_frequencies():
    inv, att, params = _inv("entropy_abf", _info(64, 1e4, 4096, layers=4), {})
    _assert_rel(inv, _theta(500000.0, 64), what="entropy_abf frequencies")
    assert params["scale_context"] == 4096 and params["skip_layers"] == [0, 1]


# ================================================================ naive attention (Entropy-ABF, HARPE)
def _projections(attn, x):
    """q (L, H, d), k and v (L, KV, d) in float64 from the module's own weights."""
    cfg = attn.config
    d = attn.head_dim
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    x = x[0].double()
    if hasattr(attn, "qkv_proj"):  # phi3
        qkv = x @ attn.qkv_proj.weight.double().T
        q, k, v = qkv.split([heads * d, kv * d, kv * d], dim=-1)
    else:
        def lin(layer):
            y = x @ layer.weight.double().T
            return y + layer.bias.double() if layer.bias is not None else y

        q, k, v = lin(attn.q_proj), lin(attn.k_proj), lin(attn.v_proj)
    L = x.shape[0]
    return q.view(L, heads, d), k.view(L, kv, d), v.view(L, kv, d)


def _rotations(base: float, positions: torch.Tensor, d: int, rot: int) -> torch.Tensor:
    """Explicit (L, d, d) RoPE rotation matrices, half-split layout: pair i is channels (i, i + rot/2).

    The angle m·θ_i is formed in float32 as the model does (position × float32 θ); only then cos/sin in
    float64. Channels ≥ rot pass through (partial rotary).
    """
    half = rot // 2
    theta = (base ** (-2.0 * torch.arange(half, dtype=torch.float64) / rot)).float()
    angle = (positions.float()[:, None] * theta[None, :]).double()  # (L, half)
    R = torch.eye(d, dtype=torch.float64).repeat(len(positions), 1, 1)
    idx = torch.arange(half)
    R[:, idx, idx] = angle.cos()
    R[:, idx, idx + half] = -angle.sin()
    R[:, idx + half, idx] = angle.sin()
    R[:, idx + half, idx + half] = angle.cos()
    return R


def _naive_attention(attn, x, bases, rot, row_scale=None):
    """softmax(mask(scale_m · (R_m q_m)·(R_n k_n)/√d)) · v, per query head with its KV group's base; then o_proj."""
    q, k, v = _projections(attn, x)
    L, heads, d = q.shape
    kv = k.shape[1]
    positions = torch.arange(L)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    rots = {b: _rotations(b, positions, d, rot) for b in set(bases)}
    out = torch.empty(L, heads, d, dtype=torch.float64)
    for h in range(heads):
        g = h // (heads // kv)
        R = rots[bases[g]]
        qh = torch.einsum("lij,lj->li", R, q[:, h])
        kh = torch.einsum("lij,lj->li", R, k[:, g])
        logits = qh @ kh.T / math.sqrt(d)
        if row_scale is not None:
            logits = logits * row_scale[:, None]
        logits = logits.masked_fill(~causal, float("-inf"))
        out[:, h] = torch.softmax(logits, dim=-1) @ v[:, g]
    flat = out.reshape(L, heads * d)
    o = attn.o_proj
    y = flat @ o.weight.double().T
    return y + o.bias.double() if o.bias is not None else y


def _sharpen(model, k: float = 4.0) -> None:
    """Scale query/key projections so attention logits are O(1–10): position and temperature then matter."""
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            if hasattr(attn, "qkv_proj"):
                n = (attn.config.num_attention_heads + attn.config.num_key_value_heads) * attn.head_dim
                attn.qkv_proj.weight[:n] *= k
            else:
                attn.q_proj.weight *= k
                attn.k_proj.weight *= k


def _capture(model, ids):
    """Per layer: (hidden_states entering self_attn, self_attn output)."""
    seen = {}
    handles = []
    for i, layer in enumerate(model.model.layers):
        def hook(module, args, kwargs, output, i=i):
            x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            seen[i] = (x.detach().clone(), output[0].detach().clone())

        handles.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            logits = model(ids).logits
    finally:
        for h in handles:
            h.remove()
    return seen, logits


ATOL = 1e-6  # float32 model vs float64 naive agree to ~2e-8 on these sizes
TEETH = 2e-4  # a wrong rotation / missing scale must be off by far more than the tolerance (observed ≥ 1e-3)
CACHE_ATOL = 1e-5


def _entropy_scale(L: int, c: int) -> torch.Tensor:
    """Entropy-ABF Eq. 5: t = max(ln i / ln c, 1), i = position + 1."""
    i = torch.arange(1, L + 1, dtype=torch.float64)
    return torch.clamp(torch.log(i) / math.log(c), min=1.0)


@pytest.fixture(scope="module")
def entropy_runs():
    ids = torch.randint(3, 256, (1, 200), generator=torch.Generator().manual_seed(1))
    runs = {}
    for name in ("abf", "entropy_abf"):
        model = build_tiny_model("llama", num_layers=4)
        _sharpen(model)
        ropekit.extend(model, name)  # same rope_theta (500,000) for both
        runs[name] = _capture(model, ids) + (model,)
    return runs


def test_entropy_abf_layers_0_1_bit_identical_to_abf(entropy_runs):
    abf, ent = entropy_runs["abf"][0], entropy_runs["entropy_abf"][0]
    for layer in (0, 1):
        assert torch.equal(abf[layer][0], ent[layer][0]), f"layer {layer} input"
        assert torch.equal(abf[layer][1], ent[layer][1]), f"layer {layer} attention output"
    assert not torch.equal(abf[2][1], ent[2][1])
    # Within the window (positions 0..63, scale 1) layer 2 still sees the same inputs and gives the same rows.
    assert torch.equal(abf[2][0], ent[2][0])
    torch.testing.assert_close(abf[2][1][:, :64], ent[2][1][:, :64], rtol=0, atol=ATOL)


def test_entropy_abf_naive_attention_per_layer(entropy_runs):
    seen, _, model = entropy_runs["entropy_abf"]
    scale = _entropy_scale(200, 64)
    assert scale[63] == 1.0 and scale[64] > 1.0
    for layer, (x, out) in seen.items():
        attn = model.model.layers[layer].self_attn
        scaled = layer >= 2
        naive = _naive_attention(attn, x, [500000.0] * 2, 16, scale if scaled else None)
        torch.testing.assert_close(out[0].double(), naive, rtol=0, atol=ATOL, msg=lambda m: f"layer {layer}: {m}")
        other = _naive_attention(attn, x, [500000.0] * 2, 16, None if scaled else scale)
        assert (out[0].double() - other).abs().max() > TEETH, f"layer {layer}: the scale choice is not visible"


def test_entropy_abf_plain_abf_naive(entropy_runs):
    """Plain ABF is plain RoPE attention with b = 500,000 on every layer (the reference itself is sound)."""
    seen, _, model = entropy_runs["abf"]
    for layer, (x, out) in seen.items():
        naive = _naive_attention(model.model.layers[layer].self_attn, x, [500000.0] * 2, 16)
        torch.testing.assert_close(out[0].double(), naive, rtol=0, atol=ATOL)


def test_entropy_abf_custom_skip_layers_and_context(make_ids):
    model = build_tiny_model("llama", num_layers=4)
    _sharpen(model)
    ropekit.extend(model, "entropy_abf", scale_context=32, skip_layers=[3], rope_theta=1e5)
    seen, _ = _capture(model, make_ids(150))
    scale = _entropy_scale(150, 32)
    for layer, (x, out) in seen.items():
        naive = _naive_attention(model.model.layers[layer].self_attn, x, [1e5] * 2, 16, None if layer == 3 else scale)
        torch.testing.assert_close(out[0].double(), naive, rtol=0, atol=ATOL, msg=lambda m: f"layer {layer}: {m}")


# ---------------------------------------------------------------- HARPE
HARPE_CASES = {
    # family, build kwargs, bases (one per KV group / head), rotary dim
    "llama-gqa": ("llama", {}, [500.0, 1e6], 16),
    "llama-mha": ("llama", {"num_kv_heads": None}, [300.0, 3e3, 3e4, 3e6], 16),
    "phi3-gqa-partial": ("phi3", {"partial_rotary_factor": 0.5}, [200.0, 2e5], 8),
}


@pytest.mark.parametrize("case", list(HARPE_CASES))
def test_harpe_naive_per_head_attention(case, make_ids):
    family, kwargs, bases, rot = HARPE_CASES[case]
    model = build_tiny_model(family, **kwargs)
    _sharpen(model)
    ropekit.extend(model, "harpe", bases=bases)
    seen, _ = _capture(model, make_ids(160))
    for layer, (x, out) in seen.items():
        attn = model.model.layers[layer].self_attn
        naive = _naive_attention(attn, x, bases, rot)
        torch.testing.assert_close(out[0].double(), naive, rtol=0, atol=ATOL, msg=lambda m: f"layer {layer}: {m}")
        shared = _naive_attention(attn, x, [bases[0]] * len(bases), rot)
        assert (out[0].double() - shared).abs().max() > TEETH  # the heads really use different bases
        reversed_groups = _naive_attention(attn, x, bases[::-1], rot)
        assert (out[0].double() - reversed_groups).abs().max() > TEETH  # ... in the documented order


@pytest.mark.parametrize("family,kwargs,bases", [
    ("llama", {}, [500.0, 1e6]),
    ("qwen3", {}, [2e3, 5e5]),
    ("gpt_neox", {}, [300.0, 3e3, 3e4, 3e6]),
])
def test_harpe_kv_cache_decoding_equals_uncached(family, kwargs, bases, make_ids):
    model = build_tiny_model(family, **kwargs)
    ropekit.extend(model, "harpe", bases=bases)
    ids = make_ids(150, seed=3)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        cache = DynamicCache(config=model.config)
        chunks = [(0, 100), (100, 120)] + [(i, i + 1) for i in range(120, 150)]  # prefill, a chunk, then token by token
        for start, end in chunks:
            step = model(ids[:, start:end], **{cache_argument(model): cache}, use_cache=True,
                         position_ids=torch.arange(start, end)[None]).logits
            torch.testing.assert_close(step, full[:, start:end], rtol=0, atol=CACHE_ATOL,
                                       msg=lambda m: f"tokens {start}:{end}: {m}")
