"""Every export form opened *bare* by transformers 4.57 — the release line LLaMA-Factory, axolotl and older vLLM
stacks pin — in its own environment (``ropekit engines install transformers4``), compared with ropekit's own
model past the original window.

The reference is transformers 4.57's own implementation of each rope type, run without ropekit and without any
flag: the directory alone. Where 4.x has the same rope type the log-probabilities match; where it does not (a
ropekit-only method, Phi-3's three-field ``rope_scaling``) 4.x must refuse the directory with an error; the one
case 4.x would read silently as another model (Gemma 3 with extended sliding layers) is flagged by the export and
``verify`` fails it. A control strips the 4.x keys from an export: 4.x then reads another model, so the
comparison can fail. Marked slow; skipped in one line when the environment is not installed.
"""

from __future__ import annotations

import json

import pytest

import ropekit
from ropekit import RopekitError
from ropekit.engines import ENGINES, engine_python, verify
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model

pytestmark = pytest.mark.slow

#: name → (tiny model, method, parameters, extend keywords, save keywords): each rope type transformers 4.57
#: builds, each way ropekit writes one (native, longrope with one set, longrope frozen), on the families whose
#: 4.x config differs (GPT-NeoX's rotary_pct, Gemma 3's rope_local_base_freq, a pre-scaled Llama 3).
SAME = {
    "pi (linear)": ("llama", "pi", {"factor": 2.0}, {}, {}),
    "ntk (default, rope_theta)": ("llama", "ntk", {"factor": 2.0}, {}, {}),
    "yarn": ("llama", "yarn", {"factor": 2.0}, {}, {}),
    "yarn truncate=false (gpt-oss)": ("gpt-oss", "yarn", {"factor": 2.0}, {}, {}),
    "llama3": ("llama", "llama3", {"factor": 2.0}, {}, {}),
    "dynamic_ntk (dynamic)": ("llama", "dynamic_ntk", {"factor": 2.0}, {}, {}),
    "ntk_by_parts (longrope)": ("llama", "ntk_by_parts", {"factor": 2.0}, {}, {}),
    "clex frozen (longrope)": ("llama", "clex", {"factor": 4.0}, {}, {"freeze_length": 120}),
    "yarn on llama3 (longrope)": ("llama3", "yarn", {"factor": 2.0}, {}, {}),
    "pi, partial rotary (gpt_neox)": ("gpt_neox", "pi", {"factor": 2.0}, {}, {}),
    "ntk, rotary_emb_base (gpt_neox)": ("gpt_neox", "ntk", {"factor": 4.0}, {}, {}),
    "pi, type and factor (olmo2)": ("olmo2", "pi", {"factor": 2.0}, {}, {}),
    "dynamic_ntk, type and factor (olmo2)": ("olmo2", "dynamic_ntk", {"factor": 2.0}, {}, {}),
    "yarn, full layers (gemma3)": ("gemma3_text", "yarn", {"factor": 2.0}, {}, {}),
    "ntk_by_parts (qwen3)": ("qwen3", "ntk_by_parts", {"factor": 2.0}, {}, {}),
}


def _installed() -> None:
    try:
        engine_python(ENGINES["transformers4"])
    except RopekitError as err:
        pytest.skip(str(err))


def _export(tmp_path, name, model, method, params, extend, save):
    net = build_tiny_model(model)
    ropekit.extend(net, method, **params, **extend)
    directory = tmp_path / name.split(" ")[0]
    report = ropekit.save_pretrained(net, directory, tokenizer=byte_tokenizer(), **save)
    return directory, report


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(SAME))
def test_transformers4_reads_the_bare_export_as_ropekits_model(case, tmp_path):
    _installed()
    directory, report = _export(tmp_path, case, *SAME[case])
    assert report["transformers4"] is True
    # the default length, 1.5× the original window, compares the extended positions (also for dynamic, whose file
    # declares the original window as max_position_embeddings)
    result = verify(directory, "transformers4")
    print("transformers4 report:", case, json.dumps(result.as_dict()))  # the engine table's numbers (pytest -s)
    assert result.engine_version.startswith("transformers 4.57")
    assert result.passed and result.max_abs_diff <= 1e-5, result.as_dict()
    assert result.details["positions_past_window"] >= 30


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model,method,params,words", [
    ("llama", "self_extend", {"group_size": 4, "window_size": 16}, "ropekit_self_extend"),  # no 4.x type: KeyError
    ("phi3", "yarn", {"factor": 2.0}, "three fields"),  # Phi-3's 4.x config takes no attention_factor: ValueError
    ("olmo2", "yarn", {"factor": 2.0}, "two fields"),  # OLMo 2's takes a linear/dynamic type and factor only
])
def test_transformers4_refuses_what_it_cannot_compute(model, method, params, words, tmp_path):
    _installed()
    directory, report = _export(tmp_path, method, model, method, params, {}, {})
    assert report["transformers4"] is False
    assert json.loads((directory / "config.json").read_text())["ropekit"]["export"]["transformers4_refusal"]
    with pytest.raises(RopekitError) as err:
        verify(directory, "transformers4", length=120)
    assert "transformers 4.57 failed" in str(err.value) and words in str(err.value)


@pytest.mark.timeout(300)
def test_the_one_silent_case_is_flagged_and_fails_verify(tmp_path):
    """Gemma 3 with its sliding layers extended too: 4.x takes rope_local_base_freq alone for them."""
    _installed()
    directory, report = _export(tmp_path, "gemma3", "gemma3_text", "yarn", {"factor": 2.0},
                                {"layer_types": ["full_attention", "sliding_attention"]}, {})
    assert report["transformers4"] is False
    note = (directory / "ROPEKIT.md").read_text()
    assert "transformers 4.x: not the same model" in note and "sliding" in note
    result = verify(directory, "transformers4", length=120)
    assert not result.passed and result.max_abs_diff > 1e-2


@pytest.mark.timeout(300)
def test_control_without_the_4x_keys_transformers4_reads_another_model(tmp_path):
    _installed()
    directory, _ = _export(tmp_path, "pi", "llama", "pi", {"factor": 4.0}, {}, {})
    config = json.loads((directory / "config.json").read_text())
    assert config["ropekit"]["export"]["legacy_keys"] == ["rope_scaling", "rope_theta"]
    for key in config["ropekit"]["export"]["legacy_keys"]:
        del config[key]
    (directory / "config.json").write_text(json.dumps(config))
    result = verify(directory, "transformers4", length=120)
    assert not result.passed and result.max_abs_diff > 10 * result.tolerance, result.as_dict()
