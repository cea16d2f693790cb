"""LoRA (LongLoRA recipe): what trains, S²-Attn in training only, the merged export equals the adapted model."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import ropekit
from ropekit.errors import RopekitError
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model
from ropekit.train import train


def test_longlora_trains_adapters_embeddings_norms_and_exports_merged(make_config, text_dataset, make_ids):
    r, alpha = 4, 8.0
    cfg = make_config("longlora", steps=3, seq_len=128, method={"name": "longlora", "params": {"factor": 2}},
                      train={"lr": 2e-2, "lora": {"r": r, "alpha": alpha, "trainable": ["embed", "norm"]}})
    model = build_tiny_model("llama")
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    ids = make_ids(128, seed=3)
    seen = {}

    def look(info):
        m = info.model
        if info.step == 1:
            seen["trainable"] = sorted(n for n, p in m.named_parameters() if p.requires_grad)
        if info.step == 3:
            with torch.no_grad():
                train_logits = m(input_ids=ids).logits  # training mode: S²-Attn
                m.eval()
                seen["logits"] = m(input_ids=ids).logits
                m.train()
            seen["s2_changes_training"] = not torch.allclose(train_logits, seen["logits"], atol=1e-4)
            seen["lora"] = {n: p.detach().clone() for n, p in m.named_parameters() if "lora_" in n}

    result = train(cfg, dataset=text_dataset(128, 16), model=model, tokenizer=byte_tokenizer(), callbacks=[look],
                   progress=False)
    trainable = seen["trainable"]
    assert any("lora_A" in n for n in trainable) and any("lora_B" in n for n in trainable)
    assert any("embed_tokens" in n for n in trainable) and any("norm" in n for n in trainable)
    assert all("lora_" in n or "embed_tokens" in n or "norm" in n for n in trainable)
    assert not any("lm_head" in n or "mlp" in n for n in trainable)
    assert seen["s2_changes_training"]

    loaded = ropekit.load(result.final_dir)
    assert ropekit.installed(loaded)["method"] == "longlora"
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, seen["logits"], rtol=1e-4, atol=1e-5)

    # merged weight = frozen base + (α/r)·B·A, computed by hand from the adapters
    final = load_file(result.final_dir / "model.safetensors")
    for layer in range(2):
        for proj in ("q_proj", "v_proj"):
            key = f"model.layers.{layer}.self_attn.{proj}.weight"
            a = next(v for n, v in seen["lora"].items() if f"layers.{layer}.self_attn.{proj}.lora_A" in n)
            b = next(v for n, v in seen["lora"].items() if f"layers.{layer}.self_attn.{proj}.lora_B" in n)
            want = initial[key] + (alpha / r) * (b @ a)
            torch.testing.assert_close(final[key], want, rtol=1e-5, atol=1e-6)
            assert not torch.equal(final[key], initial[key])
    assert not torch.equal(final["model.embed_tokens.weight"], initial["model.embed_tokens.weight"])
    assert torch.equal(final["model.layers.0.mlp.up_proj.weight"], initial["model.layers.0.mlp.up_proj.weight"])

    # LongLoRA exports as plain PI: transformers alone builds the same (full-attention) model
    plain = AutoModelForCausalLM.from_pretrained(result.final_dir)
    assert plain.config.rope_parameters["rope_type"] == "linear"
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, seen["logits"], rtol=1e-4, atol=1e-5)


def test_lora_without_extras_trains_only_adapters(make_config, text_dataset):
    cfg = make_config("adapters", steps=1, train={"lora": {"r": 2, "trainable": [], "target_modules": ["v_proj"]}})
    names = []
    train(cfg, dataset=text_dataset(64, 4), callbacks=[lambda i: names.extend(
        n for n, p in i.model.named_parameters() if p.requires_grad)], progress=False)
    assert names and all("v_proj.lora_" in n for n in names)


def test_unknown_target_modules_list_the_model_layers(make_config, text_dataset):
    cfg = make_config("neox", steps=1, train={"lora": {"r": 2}})
    with pytest.raises(RopekitError, match=r"q_proj, k_proj, v_proj, o_proj not found.*query_key_value"):
        train(cfg, dataset=text_dataset(64, 4), model=build_tiny_model("gpt_neox"), tokenizer=byte_tokenizer(),
              progress=False)
