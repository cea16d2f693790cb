"""vLLM serving plans and ``ropekit verify``'s own checks, without running an engine (fast).

The reference for vLLM's behaviour is its own ``get_rope`` as read from its source (notes/engines.md §3); the
slow tests in test_engines_slow.py run it.
"""

from __future__ import annotations

import json

import pytest

import ropekit
from ropekit import RopekitError
from ropekit.engines import ENGINES, engine_python
from ropekit.install.vllm import vllm_serving
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model


def _export(tmp_path, method, rope_format="auto", **params):
    model = build_tiny_model("llama")
    ropekit.extend(model, method, **params)
    ropekit.save_pretrained(model, tmp_path / method, tokenizer=byte_tokenizer(), rope_format=rope_format)
    return tmp_path / method


@pytest.mark.parametrize("method,params,exact", [
    ("pi", {"factor": 2.0}, True),
    ("ntk", {"factor": 2.0}, True),
    ("yarn", {"factor": 4.0}, True),
    ("llama3", {"factor": 4.0}, True),
    ("ntk_by_parts", {"factor": 2.0}, True),           # written as longrope with one set: exact
    ("dynamic_ntk", {"factor": 2.0}, False),           # vLLM's dynamic serves plain RoPE
    ("self_extend", {"group_size": 4, "window_size": 16}, False),
])
def test_which_exports_vllm_serves_exactly(tmp_path, method, params, exact):
    plan = vllm_serving(_export(tmp_path, method, **params))
    assert plan.exact is exact, plan.why
    if exact:
        assert plan.command.startswith(f"vllm serve {tmp_path / method} --max-model-len ")
        assert plan.max_model_len == json.loads((tmp_path / method / "config.json").read_text())["max_position_embeddings"]
    else:
        assert plan.why and "\n" not in plan.why


def test_longrope_magnitude_goes_to_vllms_own_keys(tmp_path):
    directory = _export(tmp_path, "ntk_by_parts", factor=4.0)
    rope = json.loads((directory / "config.json").read_text())["rope_parameters"]
    plan = vllm_serving(directory)
    # vLLM's longrope derives the magnitude from the windows unless short_mscale/long_mscale are given
    served = plan.hf_overrides["rope_parameters"]
    assert served["short_mscale"] == served["long_mscale"] == rope["attention_factor"]
    assert "--hf-overrides" in plan.command and json.dumps(plan.hf_overrides, separators=(",", ":")) in plan.command


def test_a_missing_engine_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("ROPEKIT_ENGINES", str(tmp_path / "none"))
    with pytest.raises(RopekitError) as err:
        engine_python(ENGINES["vllm"])
    assert "scripts/engines.sh vllm" in str(err.value) and "\n" not in str(err.value)


def test_verify_against_plain_transformers(tmp_path, run_cli):
    """The transformers engine runs in a subprocess without ropekit: a native export matches exactly, a
    ropekit-only export is refused by plain transformers and the command says so in one line."""
    native = _export(tmp_path, "yarn", factor=4.0)
    code, out, err = run_cli("verify", str(native), "--engine", "transformers", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["passed"] and report["max_abs_diff"] <= 1e-6 and report["tokens"] == 96
    only = _export(tmp_path, "self_extend", group_size=4, window_size=16)
    code, _, err = run_cli("verify", str(only), "--engine", "transformers")
    assert code == 2 and "transformers failed" in err and "ropekit_self_extend" in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1


def test_vllm_refusal_names_the_reason(tmp_path, run_cli):
    directory = _export(tmp_path, "dynamic_ntk", factor=2.0)
    code, _, err = run_cli("export", str(directory), "--format", "vllm")
    assert code == 2 and "dynamic" in err and "plain RoPE" in err
    code, _, err = run_cli("verify", str(directory), "--engine", "vllm", "--python", "/nonexistent/python")
    assert code == 2 and "\n" not in err.strip()
