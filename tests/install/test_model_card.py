"""The exported directory's model card: huggingface_hub reads it back (``base_model``, tags), and the settings it
prints for each stack are the ones config.json and the GGUF writer hold; a stack that cannot compute the model is
named with the alternative. Also: tokenizer_config.json keeps no machine-local loading options, and ``inspect``
shows the standard rope type the file carries."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

import gguf
from huggingface_hub import ModelCard

import ropekit
from ropekit.install.gguf_export import write_gguf
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.loading import load_model
from ropekit.models.tiny import build_tiny_model


def _export(tmp_path, method, **params):
    model = build_tiny_model("llama")
    ropekit.extend(model, method, **params)
    out = tmp_path / method
    ropekit.save_pretrained(model, out, tokenizer=byte_tokenizer(), base_model="HuggingFaceTB/SmolLM2-135M",
                            evaluation={"passkey at 96 tokens": "10/10"})
    return model, out


def _block(text, after, lang):
    return text.split(after, 1)[1].split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def test_the_card_reads_back_and_its_settings_are_the_configs(tmp_path):
    model, out = _export(tmp_path, "yarn", factor=2.0)
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M" and "ropekit" in card.data.tags
    config = json.loads((out / "config.json").read_text())
    text = card.text
    assert "| original window | 64 tokens |" in text and "| effective window | 128 tokens |" in text
    assert "| passkey at 96 tokens | 10/10 |" in text
    assert json.loads(_block(text, "**transformers 5.x**", "json"))["rope_parameters"] == config["rope_parameters"]
    assert json.loads(_block(text, "**transformers 4.51 and later**", "json"))["rope_scaling"] == config["rope_scaling"]
    command = _block(text, "the original model with the same RoPE", "bash")
    overrides = json.loads(re.search(r"--hf-overrides '(.*)'", command).group(1))
    assert command.startswith("vllm serve HuggingFaceTB/SmolLM2-135M --max-model-len 128 ")
    assert overrides == {"rope_parameters": config["rope_parameters"], "max_position_embeddings": 128}
    assert (out / "ROPEKIT.md").read_text().strip() == text.strip()


def test_a_yarn_card_names_the_4x_releases_that_compute_it(tmp_path):
    """transformers 4.45–4.50 ramp YaRN over max_position_embeddings and never read original_max_position_embeddings,
    so an export's extended window moves the correction range. transformers 5 computes that reading when the original
    window is given as the extended one: on SmolLM2's RoPE (head 64, θ 1e5, 8,192 tokens, ×2) the frequencies differ
    from the export's, so the card names 4.51 as the floor; PI's card stays 4.x."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    def yarn(original):
        config = LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                             max_position_embeddings=16384, rope_parameters={
                                 "rope_type": "yarn", "factor": 2.0, "rope_theta": 1e5,
                                 "original_max_position_embeddings": original})
        return ROPE_INIT_FUNCTIONS["yarn"](config, None)[0]

    assert not torch.allclose(yarn(8192), yarn(16384), rtol=1e-3)  # the 4.45–4.50 reading is another model
    _, out = _export(tmp_path, "yarn", factor=2.0)
    text = (out / "README.md").read_text()
    assert "**transformers 4.51 and later**" in text and "4.45–4.50 ramp YaRN over max_position_embeddings" in text
    _, pi = _export(tmp_path, "pi", factor=2.0)
    assert "**transformers 4.x** (and the stacks" in (pi / "README.md").read_text()


def test_llamacpp_flags_are_what_the_gguf_writer_writes(tmp_path):
    """The flags for the original GGUF against the keys ropekit's GGUF writer puts in the file (which the slow
    llama.cpp tests run): scaling type, factor, original context."""
    model, out = _export(tmp_path, "yarn", factor=2.0)
    flags = _block((out / "README.md").read_text(), "**llama.cpp**", "bash")
    assert flags.strip() == "llama-server -m ORIGINAL.gguf --rope-scaling yarn --rope-scale 2 --yarn-orig-ctx 64 -c 128"
    write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf", outtype="f32")
    reader = gguf.GGUFReader(tmp_path / "m.gguf")

    def value(key):
        field = reader.fields[key]
        part = field.parts[field.data[0]]
        return bytes(part).decode() if field.types[0] == gguf.GGUFValueType.STRING else part[0]

    assert value("llama.rope.scaling.type") == "yarn" and value("llama.rope.scaling.factor") == 2.0
    assert value("llama.rope.scaling.original_context_length") == 64 and value("llama.context_length") == 128


def test_flags_keep_every_digit_and_a_changed_base(tmp_path):
    """A factor from a target length (77 / 64 = 1.203125) reads back exactly from the flag, and a method given its own
    RoPE base gets --rope-freq-base (the original GGUF keeps its own), the one the GGUF writer writes; LLaMA-Factory's
    linear option, which cannot change the base, is then not offered."""
    model = build_tiny_model("llama")
    ropekit.extend(model, "pi", factor=2.0, rope_theta=20000.0)
    out = tmp_path / "pi-base"
    ropekit.save_pretrained(model, out, tokenizer=byte_tokenizer())
    text = (out / "README.md").read_text()
    flags = _block(text, "**llama.cpp**", "bash").split()
    assert flags[flags.index("--rope-scale") + 1] == "2" and float(flags[flags.index("--rope-freq-base") + 1]) == 20000.0
    write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf", outtype="f32")
    field = gguf.GGUFReader(tmp_path / "m.gguf").fields["llama.rope.freq_base"]
    assert float(field.parts[field.data[0]][0]) == 20000.0
    assert "rope_scaling: linear" not in text

    model = build_tiny_model("llama")
    ropekit.extend(model, "pi", target_length=77)
    out = tmp_path / "pi-77"
    ropekit.save_pretrained(model, out, tokenizer=byte_tokenizer())
    config = json.loads((out / "config.json").read_text())
    flags = _block((out / "README.md").read_text(), "**llama.cpp**", "bash").split()
    assert float(flags[flags.index("--rope-scale") + 1]) == config["rope_parameters"]["factor"] == 77 / 64
    assert "--rope-freq-base" not in flags


def test_the_cards_vllm_line_for_the_original_deepseek_is_the_serving_plan(tmp_path):
    """vLLM's DeepSeek attention reads no attention_factor (it takes the magnitude from mscale): the original model's
    overrides carry the plan's mscale, not the file's attention_factor."""
    model = build_tiny_model("deepseek_v3")
    ropekit.extend(model, "yarn", factor=2.0, attention_factor=1.3)
    out = tmp_path / "ds"
    ropekit.save_pretrained(model, out, tokenizer=byte_tokenizer())
    text = (out / "README.md").read_text()
    overrides = json.loads(re.search(r"--hf-overrides '(.*)'", _block(text, "the original model with the same RoPE",
                                                                      "bash")).group(1))
    rope = overrides["rope_parameters"]
    assert "attention_factor" not in rope and "mscale" in rope
    # vLLM's magnitude, mscale(s, m)/mscale(s, m_all) with mscale(s, m) = 0.1·m·ln s + 1, is the export's 1.3
    def mscale(m):
        return 0.1 * m * math.log(2.0) + 1.0

    assert mscale(rope["mscale"]) / mscale(rope.get("mscale_all_dim") or 0.0) == pytest.approx(1.3, rel=1e-12)
    # plain yarn with its own magnitude: releases before 0.32 read it as attn_factor × (0.1·ln s + 1)
    _, out = _export(tmp_path, "yarn", factor=2.0, attention_factor=1.3)
    overrides = json.loads(re.search(r"--hf-overrides '(.*)'", _block((out / "README.md").read_text(),
                                     "the original model with the same RoPE", "bash")).group(1))
    assert overrides["rope_parameters"]["attn_factor"] * mscale(1.0) == pytest.approx(1.3, rel=1e-12)


def test_what_a_stack_cannot_compute_is_named_with_the_alternative(tmp_path):
    _, parts = _export(tmp_path, "ntk_by_parts", factor=2.0)  # per-pair frequencies: no llama.cpp flag holds them
    assert "write the GGUF with `ropekit export DIR --format gguf`" in (parts / "README.md").read_text()
    _, only = _export(tmp_path, "self_extend", group_size=4, window_size=16)
    text = (only / "README.md").read_text()
    assert "**transformers 4.x** — not the same model" in text and "**vLLM** — not the same model" in text


def test_tokenizer_config_keeps_no_local_files_only(tmp_path):
    plain = build_tiny_model("llama")
    plain.save_pretrained(tmp_path / "base")
    byte_tokenizer().save_pretrained(tmp_path / "base")
    loaded = load_model(str(tmp_path / "base"))  # loads its tokenizer with local_files_only=True
    ropekit.extend(loaded.model, "pi", factor=2.0)
    ropekit.save_pretrained(loaded.model, tmp_path / "out", tokenizer=loaded.tokenizer)
    assert "local_files_only" not in json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())


def test_inspect_shows_the_standard_rope_type_of_an_export(tmp_path, run_cli):
    _, out = _export(tmp_path, "yarn", factor=2.0)
    code, stdout, err = run_cli("inspect", str(out), "--json")
    assert code == 0, err
    facts = json.loads(stdout)
    assert facts["rope_type"] == "yarn" and facts["installed_rope_type"] == "ropekit_yarn"


def test_a_card_for_rope_per_layer_type(tmp_path):
    model = build_tiny_model("gemma3_text")
    ropekit.extend(model, "yarn", factor=2.0, layer_types=["full_attention", "sliding_attention"])
    ropekit.save_pretrained(model, tmp_path / "g")
    text = (tmp_path / "g" / "README.md").read_text()
    assert "llama.cpp's flags set one RoPE for every layer" in text
    assert "**transformers 4.x** — not the same model" in text and "sliding" in text
