"""ropekit's PI, Dynamic NTK and YaRN against transformers' own implementation.

The reference is ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS['linear' | 'dynamic' | 'yarn']``
called on a config that transformers itself builds from hand-written ``rope_parameters``. ropekit is
checked twice: through its :class:`~ropekit.methods.Method` objects, and through what ``ropekit.extend``
actually installs in a model (the registered ``ropekit_<name>`` rope-init and the rebuilt rotary module).
Finally whole tiny models extended by ropekit are compared with models transformers builds from the same
``rope_parameters`` and the same weights, at 3× the pretrained window.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, GPTNeoXConfig, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import ropekit
from ropekit.methods import RopeInfo
from ropekit.models.tiny import build_tiny_model, tiny_config

RTOL = 1e-6
FACTORS = (1.5, 2.0, 4.0, 8.0, 16.0)
BASES = (1e4, 1e5, 5e5)
WINDOWS = (64, 2048, 4096)
#: (config family, head_dim, partial_rotary_factor): full rotary at three head sizes, and partial rotary.
HEADS = (
    ("llama", 16, 1.0),
    ("llama", 64, 1.0),
    ("llama", 128, 1.0),
    ("gpt_neox", 64, 0.25),
    ("gpt_neox", 128, 0.5),
)
HEAD_IDS = [f"{fam}-d{d}-prf{p:g}" for fam, d, p in HEADS]


# ---------------------------------------------------------------- helpers
def _config(family: str, head_dim: int, prf: float, window: int, rope: dict):
    """A one-head config built by transformers itself from ``rope`` (validation included)."""
    rope = dict(rope)
    if family == "gpt_neox":
        rope["partial_rotary_factor"] = prf
        return GPTNeoXConfig(
            hidden_size=head_dim,
            num_attention_heads=1,
            num_hidden_layers=1,
            intermediate_size=8,
            vocab_size=8,
            max_position_embeddings=window,
            rope_parameters=rope,
        )
    assert prf == 1.0
    return LlamaConfig(
        hidden_size=head_dim,
        num_attention_heads=1,
        num_key_value_heads=1,
        num_hidden_layers=1,
        intermediate_size=8,
        vocab_size=8,
        max_position_embeddings=window,
        rope_parameters=rope,
    )


def _hf_rope(method: str, base: float, factor: float, window: int) -> tuple[str, dict, int]:
    """transformers' own rope type, parameters and max_position_embeddings for the same extension."""
    if method == "pi":
        return "linear", {"rope_type": "linear", "rope_theta": base, "factor": factor}, window
    if method == "dynamic_ntk":
        # transformers reads max_position_embeddings as the original window for 'dynamic'.
        return "dynamic", {"rope_type": "dynamic", "rope_theta": base, "factor": factor}, window
    if method == "yarn":
        rope = {"rope_type": "yarn", "rope_theta": base, "factor": factor, "original_max_position_embeddings": window}
        return "yarn", rope, int(round(window * factor))
    raise AssertionError(method)


def _hf_reference(method, family, head_dim, prf, window, base, factor, seq_len=None):
    hf_type, rope, max_pos = _hf_rope(method, base, factor, window)
    cfg = _config(family, head_dim, prf, max_pos, rope)
    inv, att = ROPE_INIT_FUNCTIONS[hf_type](cfg, None, seq_len=seq_len)
    assert inv.shape == (int(head_dim * prf) // 2,)
    return inv, float(att)


def _close(ours: torch.Tensor, ref: torch.Tensor) -> str | None:
    if ours.shape != ref.shape:
        return f"shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    rel = ((ours.double() - ref.double()).abs() / ref.double().abs()).max().item()
    return None if rel <= RTOL else f"max relative error {rel:.3g}"


def _base_model(family, head_dim, prf, window, base):
    return build_tiny_model(
        family,
        hidden_size=head_dim,
        num_heads=1,
        num_kv_heads=1,
        num_layers=1,
        vocab_size=8,
        window=window,
        rope_theta=base,
        partial_rotary_factor=prf if family == "gpt_neox" else None,
    )


# ---------------------------------------------------------------- Method objects vs transformers
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("family,head_dim,prf", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("method", ["pi", "dynamic_ntk", "yarn"])
def test_method_inv_freq_matches_transformers(method, family, head_dim, prf, window):
    m = ropekit.get_method(method)
    bad = []
    for base in BASES:
        plain = _config(family, head_dim, prf, window, {"rope_type": "default", "rope_theta": base})
        info = RopeInfo.from_config(plain)
        assert info.rotary_dim == int(head_dim * prf)
        for factor in FACTORS:
            params = m.resolve(info, {"factor": factor})
            seq_lens = [None, 1, window // 2, window, window + 1, 3 * window, 10 * window] if method == "dynamic_ntk" else [None]
            for seq_len in seq_lens:
                ours, ours_att = m.inv_freq(info, params, seq_len=seq_len)
                ref, ref_att = _hf_reference(method, family, head_dim, prf, window, base, factor, seq_len)
                why = _close(ours, ref)
                if why or not math.isclose(ours_att, ref_att, rel_tol=RTOL):
                    bad.append(f"b={base:g} s={factor:g} seq={seq_len}: {why or ''} attention {ours_att} vs {ref_att}")
    assert not bad, "\n".join(bad)


YARN_OPTIONS = [
    {"beta_fast": 16.0, "beta_slow": 2.0},
    {"beta_fast": 128.0, "beta_slow": 2.0},  # the Mistral YaRN defaults (jquesnelle/yarn's Mistral classes)
    {"truncate": False},
    {"attention_factor": 1.0},
    {"attention_factor": 1.3, "truncate": False, "beta_fast": 24.0},
]


@pytest.mark.parametrize("options", YARN_OPTIONS, ids=[",".join(o) for o in YARN_OPTIONS])
@pytest.mark.parametrize("family,head_dim,prf", [HEADS[2], HEADS[3]], ids=[HEAD_IDS[2], HEAD_IDS[3]])
def test_yarn_options_match_transformers(options, family, head_dim, prf):
    window = 4096
    bad = []
    for base in BASES:
        for factor in FACTORS:
            model = _base_model(family, head_dim, prf, window, base)
            ropekit.extend(model, "yarn", factor=factor, **options)
            rope = {"rope_type": "yarn", "rope_theta": base, "factor": factor,
                    "original_max_position_embeddings": window, **options}
            cfg = _config(family, head_dim, prf, int(window * factor), rope)
            ref, ref_att = ROPE_INIT_FUNCTIONS["yarn"](cfg, None)
            rotary = model.base_model.rotary_emb
            why = _close(rotary.inv_freq, ref)
            if why or not math.isclose(float(rotary.attention_scaling), float(ref_att), rel_tol=RTOL):
                bad.append(f"b={base:g} s={factor:g}: {why or ''} attention {rotary.attention_scaling} vs {ref_att}")
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------- what extend installs vs transformers
@pytest.mark.parametrize("window", (64, 4096))
@pytest.mark.parametrize("family,head_dim,prf", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("method", ["pi", "dynamic_ntk", "yarn"])
def test_installed_rope_matches_transformers(method, family, head_dim, prf, window):
    """The rotary module ``extend`` builds (via ``ROPE_INIT_FUNCTIONS['ropekit_<name>']``) equals transformers'."""
    bad = []
    for base in (1e4, 5e5):
        for factor in FACTORS:
            model = _base_model(family, head_dim, prf, window, base)
            ropekit.extend(model, method, factor=factor)
            rotary = model.base_model.rotary_emb
            assert rotary.rope_type == f"ropekit_{method}"
            ref, ref_att = _hf_reference(method, family, head_dim, prf, window, base, factor)
            why = _close(rotary.inv_freq, ref)
            if why or not math.isclose(float(rotary.attention_scaling), ref_att, rel_tol=RTOL):
                bad.append(f"b={base:g} s={factor:g}: {why or ''} attention {rotary.attention_scaling} vs {ref_att}")
            if method == "dynamic_ntk":
                init = ROPE_INIT_FUNCTIONS["ropekit_dynamic_ntk"]
                for seq_len in (window // 2, window + 1, 3 * window):
                    ours, _ = init(model.config, None, seq_len=seq_len)
                    ref, _ = _hf_reference(method, family, head_dim, prf, window, base, factor, seq_len)
                    why = _close(ours, ref)
                    if why:
                        bad.append(f"b={base:g} s={factor:g} seq={seq_len}: {why}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("family,head_dim,prf", [HEADS[1], HEADS[3]], ids=[HEAD_IDS[1], HEAD_IDS[3]])
def test_dynamic_rotary_module_follows_transformers(family, head_dim, prf):
    """Driven by ``@dynamic_rope_update`` (seq_len arrives as a tensor), growth and reset match transformers."""
    window, base, factor = 64, 1e4, 4.0
    ours = _base_model(family, head_dim, prf, window, base)
    ropekit.extend(ours, "dynamic_ntk", factor=factor)
    ref_model = AutoModelForCausalLM.from_config(
        _config(family, head_dim, prf, window, {"rope_type": "dynamic", "rope_theta": base, "factor": factor})
    )
    a, b = ours.base_model.rotary_emb, ref_model.base_model.rotary_emb
    x = torch.zeros(1, 1, dtype=torch.float32)
    seen = []
    for length in (32, 200, 300, 100, 40, 250):
        pos = torch.arange(length)[None]
        cos_a, sin_a = a(x, pos)
        cos_b, sin_b = b(x, pos)
        assert _close(a.inv_freq, b.inv_freq) is None, length
        torch.testing.assert_close(cos_a, cos_b, rtol=0, atol=1e-5)
        torch.testing.assert_close(sin_a, sin_b, rtol=0, atol=1e-5)
        seen.append(a.inv_freq[-1].item())
    # The frequencies really moved (growth) and came back (reset below the window).
    assert seen[1] < seen[0] and seen[2] < seen[1] and seen[4] == seen[0]


# ---------------------------------------------------------------- full models vs transformers-built models
def _reference_model(base_model, family: str, rope: dict, max_pos: int):
    cfg = tiny_config(family)
    data = cfg.to_dict()
    if "partial_rotary_factor" in cfg.rope_parameters:
        rope = {**rope, "partial_rotary_factor": cfg.rope_parameters["partial_rotary_factor"]}
    data["rope_parameters"] = rope
    data["max_position_embeddings"] = max_pos
    ref = AutoModelForCausalLM.from_config(type(cfg).from_dict(data), attn_implementation="sdpa")
    ref.load_state_dict(base_model.state_dict())
    ref.eval()
    assert ref.config.rope_parameters["rope_type"] == rope["rope_type"]
    return ref


def _transformers_rope(method: str, factor: float, window: int, d: int) -> tuple[dict, int]:
    """Hand-written transformers rope_parameters equivalent to the ropekit method (tiny model: b = 1e4)."""
    b = 10000.0
    if method == "pi":
        return {"rope_type": "linear", "rope_theta": b, "factor": factor}, window
    if method == "dynamic_ntk":
        return {"rope_type": "dynamic", "rope_theta": b, "factor": factor}, window
    if method == "yarn":
        return {"rope_type": "yarn", "rope_theta": b, "factor": factor, "original_max_position_embeddings": window}, int(window * factor)
    if method == "ntk_by_parts_dim":
        rope = {"rope_type": "yarn", "rope_theta": b, "factor": factor, "original_max_position_embeddings": window,
                "attention_factor": 1.0}
        return rope, int(window * factor)
    if method == "ntk":
        return {"rope_type": "default", "rope_theta": b * factor ** (d / (d - 2))}, int(window * factor)
    raise AssertionError(method)


# phi3 is absent: transformers' Phi3Config accepts no rope type but 'default'/'longrope', so it cannot be the reference.
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gpt_neox"])
@pytest.mark.parametrize("method", ["pi", "dynamic_ntk", "yarn", "ntk_by_parts_dim", "ntk"])
@pytest.mark.parametrize("factor", [1.5, 4.0])
def test_full_model_logits_match_transformers(method, family, factor, make_ids):
    base = build_tiny_model(family)
    info = ropekit.rope_info(base)
    window = info.window
    ours = build_tiny_model(family)
    if method == "ntk_by_parts_dim":
        ropekit.extend(ours, "ntk_by_parts", factor=factor, ramp="dim")
    else:
        ropekit.extend(ours, method, factor=factor)
    rope, max_pos = _transformers_rope(method, factor, window, info.rotary_dim)
    ref = _reference_model(base, family, rope, max_pos)

    lengths = (3 * window, 40, 100) if method == "dynamic_ntk" else (3 * window,)
    for length in lengths:
        ids = make_ids(length)
        with torch.no_grad():
            got, want, plain = ours(ids).logits, ref(ids).logits, base(ids).logits
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=lambda m: f"length {length}: {m}")
        if length > window:
            # The comparison has teeth: the extension really changes the model at this length.
            assert (got - plain).abs().max() > 1e-4
