"""Static per-frequency results written as transformers' ``longrope`` (``save_pretrained(rope_format=…)``).

The reference is plain transformers loading the directory (no ropekit in the loop): its logits must be the
extended model's, inside the window and past it; and ``ropekit.load`` must still restore the method itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropekit
from ropekit import RopekitError
from ropekit.models.tiny import build_tiny_model

LONG = [1.0, 1.2, 1.6, 2.2, 3.0, 3.6, 4.0, 4.0]
SHORT = [1.0, 1.0, 1.05, 1.1, 1.2, 1.25, 1.3, 1.3]


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _plain(path):
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()


def _same(a, b, make_ids, lengths):
    for length in lengths:
        ids = make_ids(length)
        torch.testing.assert_close(_logits(a, ids), _logits(b, ids), rtol=2e-5, atol=2e-5)


CASES = {
    # name: (family, rope_scaling of the base or None, method, params, lengths)
    "ntk_by_parts-ratio": ("llama", None, "ntk_by_parts", {"factor": 4.0}, (40, 200)),
    "yarn-wavelength-blend": ("qwen3", None, "yarn", {"factor": 4.0, "blend": "wavelength"}, (40, 200)),
    "pi-on-llama3": ("llama", {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 16}, "pi", {"factor": 2.0}, (40, 200)),
    "yarn-on-yarn": ("qwen3", {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32},
                     "yarn", {"factor": 2.0}, (40, 200)),
    "ntk-on-switching-longrope": ("phi3", {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                                           "factor": 4.0, "original_max_position_embeddings": 16},
                                  "ntk", {"factor": 2.0}, (12, 16, 17, 200, 12)),
    "gpt_neox-partial-ntk_by_parts": ("gpt_neox", None, "ntk_by_parts", {"factor": 2.0}, (40, 150)),
}


TRADE_OFF = ("Trade-off against rope type `ropekit_{method}`: `longrope` is portable but carries only the numbers; "
             "`ropekit.load(path)` restores the method itself")


def _states_the_trade_off(path, method):
    text = " ".join((path / "ROPEKIT.md").read_text().split())
    assert TRADE_OFF.format(method=method) in text, text


#: the RoPE scalings checkpoints ship, over an original window of 16 tokens scaled to 64
PRESCALED = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "longrope-static": {"rope_type": "longrope", "short_factor": LONG, "long_factor": LONG, "factor": 4.0,
                        "original_max_position_embeddings": 16},
    "longrope-switching": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG, "factor": 4.0,
                           "original_max_position_embeddings": 16},
}
ON_PRESCALED = {"abf": {"rope_theta": 1e5}, "pi": {"factor": 2.0}, "ntk": {"factor": 2.0}}


@pytest.mark.parametrize("base", list(PRESCALED))
@pytest.mark.parametrize("method", list(ON_PRESCALED))
def test_frequency_methods_on_every_prescaled_base_export_as_longrope(method, base, tmp_path, make_ids):
    """abf / pi / ntk composed on each pre-scaled RoPE: ``auto`` writes transformers' ``longrope`` (no native type
    holds a composition), and plain transformers gives the extended model's logits inside the original window, past
    it and past the scaled window — on the switching base in the order short, long, short."""
    model = build_tiny_model("llama", window=64, rope_scaling=PRESCALED[base])
    ropekit.extend(model, method, **ON_PRESCALED[method])
    report = ropekit.save_pretrained(model, tmp_path / "out")
    assert report["format"] == "longrope" and report["transformers"], report
    _states_the_trade_off(tmp_path / "out", method)
    _same(_plain(tmp_path / "out"), model, make_ids, (12, 17, 40, 200, 12))


@pytest.mark.parametrize("case", list(CASES))
def test_auto_writes_static_results_as_longrope_that_plain_transformers_runs(case, tmp_path, make_ids):
    family, scaling, method, params, lengths = CASES[case]
    model = build_tiny_model(family, rope_scaling=scaling, **({"window": 64} if scaling is None else {"window": 64}))
    ropekit.extend(model, method, **params)
    report = ropekit.save_pretrained(model, tmp_path / "out")
    assert report["format"] == "longrope" and report["transformers"], report
    rope = json.loads((tmp_path / "out" / "config.json").read_text())["rope_parameters"]
    assert rope["rope_type"] == "longrope" and len(rope["long_factor"]) == ropekit.rope_info(model).rotary_dim // 2
    _states_the_trade_off(tmp_path / "out", method)
    _same(_plain(tmp_path / "out"), model, make_ids, lengths)
    restored = ropekit.load(tmp_path / "out")  # ropekit restores the method itself, not the numbers
    assert ropekit.installed(restored)["method"] == method
    _same(restored, model, make_ids, lengths[:2])


def test_only_static_single_sets_are_vllm_exact(tmp_path):
    scaling = CASES["ntk-on-switching-longrope"][1]
    switching = build_tiny_model("phi3", window=64, rope_scaling=scaling)
    ropekit.extend(switching, "ntk", factor=2.0)
    assert ropekit.save_pretrained(switching, tmp_path / "a")["vllm"] is False
    static = build_tiny_model("llama")
    ropekit.extend(static, "ntk_by_parts", factor=2.0)
    assert ropekit.save_pretrained(static, tmp_path / "b")["vllm"] is True


def test_frozen_dynamic_ntk_and_clex_at_a_length(tmp_path, make_ids):
    model = build_tiny_model("llama")
    ropekit.extend(model, "dynamic_ntk", factor=2.0, trained_length=128)
    assert ropekit.save_pretrained(model, tmp_path / "auto")["format"] == "ropekit"  # continuous: not by default
    ropekit.save_pretrained(model, tmp_path / "frozen", rope_format="longrope", freeze_length=128)
    assert "frozen" in (tmp_path / "frozen" / "ROPEKIT.md").read_text()
    _same(_plain(tmp_path / "frozen"), model, make_ids, (40, 128))  # the frozen base holds up to C' = 128

    clex = build_tiny_model("llama")
    ropekit.extend(clex, "clex", max_factor=4)
    ropekit.save_pretrained(clex, tmp_path / "clex", rope_format="longrope", freeze_length=160)
    _same(_plain(tmp_path / "clex"), clex, make_ids, (160,))  # t = 160/64 at exactly that length


def test_a_frozen_export_declares_its_length_and_holds_no_rotary_weights(tmp_path, make_ids):
    """Dynamic NTK has no target window of its own: frozen at 120 tokens, the export must declare at least 120 (an
    engine refuses longer inputs than max_position_embeddings). CLEX's ODE weights are not part of a frozen export
    (vLLM refuses unexpected weights), and ropekit loads the frozen export as the static model it is."""
    from safetensors import safe_open

    model = build_tiny_model("llama", window=64)
    ropekit.extend(model, "dynamic_ntk", factor=2.0)
    ropekit.save_pretrained(model, tmp_path / "dntk", freeze_length=120)
    saved = json.loads((tmp_path / "dntk" / "config.json").read_text())
    assert saved["max_position_embeddings"] == 120 and saved["rope_parameters"]["factor"] == 120 / 64

    clex = build_tiny_model("llama", window=64)
    ropekit.extend(clex, "clex", max_factor=4)
    assert any("rotary" in k for k in clex.state_dict())
    ropekit.save_pretrained(clex, tmp_path / "clex", freeze_length=160)
    with safe_open(str(tmp_path / "clex" / "model.safetensors"), framework="pt") as handle:
        assert not [k for k in handle.keys() if "rotary" in k]
    restored = ropekit.load(tmp_path / "clex")
    assert ropekit.installed(restored) is None
    _same(restored, clex, make_ids, (160,))


@pytest.mark.parametrize("method,params,fmt,needle", [
    ("self_extend", {"group_size": 4, "window_size": 16}, "longrope", "changes attention"),
    ("entropy_abf", {}, "longrope", "changes attention"),
    ("ntk_by_parts", {"factor": 2.0}, "native", "transformers' own rope types"),
    ("dynamic_ntk", {"factor": 2.0, "trained_length": 128}, "longrope", "freeze_length"),
])
def test_a_format_that_cannot_hold_the_model_is_refused_before_writing(method, params, fmt, needle, tmp_path):
    model = build_tiny_model("llama", num_layers=3)
    ropekit.extend(model, method, **params)
    with pytest.raises(RopekitError) as err:
        ropekit.save_pretrained(model, tmp_path / "out", rope_format=fmt)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_ropekit_format_still_refuses_loudly_in_plain_transformers(tmp_path):
    model = build_tiny_model("llama")
    ropekit.extend(model, "ntk_by_parts", factor=2.0)
    report = ropekit.save_pretrained(model, tmp_path / "out", rope_format="ropekit")
    assert report["format"] == "ropekit" and not report["transformers"]
    # a process without ropekit: transformers alone, in a fresh interpreter
    script = ("import sys\nfrom transformers import AutoModelForCausalLM\n"
              "AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
              "assert 'ropekit' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode != 0
    assert "KeyError: 'ropekit_ntk_by_parts'" in done.stderr


def test_bad_format_arguments_are_one_line(tmp_path):
    model = build_tiny_model("llama")
    ropekit.extend(model, "pi", factor=2.0)
    with pytest.raises(RopekitError, match="unknown rope format 'gguf'"):
        ropekit.save_pretrained(model, tmp_path / "a", rope_format="gguf")
    with pytest.raises(RopekitError, match="freeze_length must be a positive"):
        ropekit.save_pretrained(model, tmp_path / "b", freeze_length=0)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("method, params, length, words", [
    ("yarn", {"factor": 4.0}, 128, "changes nothing for yarn"),  # was written as longrope instead of native yarn
    ("dynamic_ntk", {"factor": 2.0}, 64, "the base model's own frequencies"),  # was the unextended model, silently
    ("clex", {"max_factor": 4}, 50, "the base model's own frequencies"),
])
def test_a_freeze_length_that_would_export_something_else_is_refused(tmp_path, method, params, length, words):
    model = build_tiny_model("llama")
    ropekit.extend(model, method, **params)
    with pytest.raises(RopekitError, match=words):
        ropekit.save_pretrained(model, tmp_path / "x", freeze_length=length)
    assert not (tmp_path / "x").exists()
    if method == "dynamic_ntk":  # one token past the window Dynamic NTK has moved from the base: written
        assert ropekit.save_pretrained(model, tmp_path / "y", freeze_length=65)["format"] == "longrope"
        rope = json.loads((tmp_path / "y" / "config.json").read_text())["rope_parameters"]
        # Dynamic NTK (bloc97's rule as transformers computes it): b' = b·((s·n/C) − (s − 1))^(d/(d−2)) at n = 65
        d, b = 16, 10000.0
        b_new = b * ((2.0 * 65 / 64) - 1.0) ** (d / (d - 2))
        expected = [(b_new / b) ** (2 * i / d) for i in range(d // 2)]  # λ_i = θ_i / θ'_i
        assert rope["long_factor"] == pytest.approx(expected, rel=1e-6)


def test_phi3_whose_top_level_original_window_differs_is_written_as_longrope_that_transformers_reads(tmp_path):
    """Phi3Config overwrites the RoPE's original_max_position_embeddings with its own top-level key (default 4096):
    a Phi-3 whose window is not 4096 (a fine-tune, a tiny one) was written ropekit-only although inspect promised
    longrope. The export writes the top-level key too, and plain transformers computes the extended model."""
    from transformers import Phi3Config

    config = Phi3Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    assert config.original_max_position_embeddings == 4096  # the family's default, unlike its window
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    ropekit.extend(model, "yarn", factor=2.0)
    ropekit.save_pretrained(model, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["rope_parameters"]["rope_type"] == "longrope" and saved["original_max_position_embeddings"] == 128
    plain = _plain(tmp_path / "out")
    for length in (100, 250):  # inside the window and past it
        ids = torch.randint(3, 120, (1, length), generator=torch.Generator().manual_seed(length))
        torch.testing.assert_close(_logits(model, ids), _logits(plain, ids), rtol=2e-5, atol=2e-5)
