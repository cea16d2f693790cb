"""``gradient_checkpointing: auto``: on exactly when the step's memory plan would not fit in what is free on the
training device, said in one line; the same losses as an unchecked run; explicit settings left as written."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from transformers import LlamaConfig

from ropekit.train import trainer as trainer_module
from ropekit.train import train
from ropekit.train.lora import base_model
from ropekit.train.plan import AUTO_CHECKPOINTING_SHARE, GIB, choose_checkpointing, plan_shape

# SmolLM2-135M's shape (its GGUF header): the 16k full-length fine-tune of docs/results/smollm2 in bf16 autocast
SMOLLM2 = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)
STEP = dict(element_bytes=4, compute_bytes=2, micro_batch=1, seq_len=16384, gpus=1, strategy="ddp")


def _plans():
    return plan_shape(SMOLLM2, checkpointing=False, **STEP), plan_shape(SMOLLM2, checkpointing=True, **STEP)


def test_the_choice_follows_the_plan_against_the_free_memory():
    plain, checkpointed = _plans()
    assert checkpointed.total < plain.total  # the premise: checkpointing keeps only each layer's input
    roomy = choose_checkpointing(plain, checkpointed, free_bytes=64 * GIB, resident_bytes=0)
    assert not roomy.on and roomy.fits
    # free memory between the two plans (the 24 GiB machine with a study worker beside the training): on, fits
    between = int((plain.total + checkpointed.total) / 2 / AUTO_CHECKPOINTING_SHARE)
    middle = choose_checkpointing(plain, checkpointed, free_bytes=between, resident_bytes=0)
    assert middle.on and middle.fits
    line = middle.describe("cpu")
    assert line.startswith("gradient checkpointing on (auto)") and "\n" not in line and "may not fit" not in line
    assert f"{plain.total / GIB:,.1f} GiB" in line and f"{checkpointed.total / GIB:,.1f} GiB" in line
    # not even checkpointed: still on (the best there is), and the line says what to lower
    short = choose_checkpointing(plain, checkpointed, free_bytes=checkpointed.total // 2, resident_bytes=0)
    assert short.on and not short.fits and "micro_batch_size" in short.describe("cpu")


def test_weights_already_loaded_are_not_counted_twice():
    plain, checkpointed = _plans()
    # room for the step beside the loaded weights, not for a second copy of them
    free = int((plain.total - plain.weights / 2) / AUTO_CHECKPOINTING_SHARE)
    assert choose_checkpointing(plain, checkpointed, free_bytes=free, resident_bytes=0).on
    assert not choose_checkpointing(plain, checkpointed, free_bytes=free, resident_bytes=plain.weights).on


def _checkpointed(model) -> bool:
    if hasattr(type(model), "is_activation_checkpointing"):  # transformers 5.x's name for it
        return model.is_activation_checkpointing
    return model.is_gradient_checkpointing


def _run(make_config, text_dataset, rows_dataset, monkeypatch, name, setting, free):
    monkeypatch.setattr(trainer_module, "free_memory", lambda device: free)
    seen = []
    cfg = make_config(name, steps=3, model={"name": "tiny", "gradient_checkpointing": setting})
    text = io.StringIO()
    result = train(cfg, dataset=rows_dataset(text_dataset(64).tokens[:6].clone()), progress=False, console=Console(file=text),
                   callbacks=[lambda info: seen.append(_checkpointed(base_model(info.model)))])
    return result, seen, text.getvalue()


def test_auto_turns_checkpointing_on_when_the_step_would_not_fit(make_config, text_dataset, rows_dataset, monkeypatch):
    reference, seen, said = _run(make_config, text_dataset, rows_dataset, monkeypatch, "off", False, 1)
    assert seen == [False] * 3 and "checkpointing" not in said  # an explicit false stays off, silently
    tight, seen, said = _run(make_config, text_dataset, rows_dataset, monkeypatch, "tight", "auto", 1)
    assert seen == [True] * 3
    assert [line for line in said.splitlines() if "checkpointing" in line] == [
        line for line in said.splitlines() if line.startswith("gradient checkpointing on (auto)")]
    assert "may not fit" in said  # one byte free: not even checkpointed
    # recomputing each layer in the backward pass gives the unchecked run's losses
    assert [loss for _, loss in tight.losses] == pytest.approx([loss for _, loss in reference.losses], abs=1e-6)


def test_auto_leaves_checkpointing_off_when_the_step_fits(make_config, text_dataset, rows_dataset, monkeypatch):
    _, seen, said = _run(make_config, text_dataset, rows_dataset, monkeypatch, "roomy", "auto", 64 * GIB)
    assert seen == [False] * 3 and "checkpointing" not in said
    _, seen, _ = _run(make_config, text_dataset, rows_dataset, monkeypatch, "asked", True, 64 * GIB)
    assert seen == [True] * 3  # an explicit true stays on


def test_auto_is_the_default_and_the_plan_command_says_what_it_chose():
    from ropekit.train.config import parse_config
    from ropekit.train.plan import plan_memory

    cfg = parse_config({"model": "meta-llama/Llama-3.1-8B", "data": {"seq_len": 32768},
                        "train": {"max_steps": 1, "precision": "bf16"}, "output": {"dir": "unused"}})
    assert cfg.model.gradient_checkpointing == "auto"
    roomy = plan_memory(cfg, gpus=8, gpu_memory_gib=1000.0, strategy="fsdp")
    tight = plan_memory(cfg, gpus=8, gpu_memory_gib=80.0, strategy="fsdp")
    assert not roomy.checkpointing and tight.checkpointing and tight.fits


def test_auto_plans_a_lora_run_from_the_model_at_hand(make_config, text_dataset, rows_dataset, monkeypatch):
    """With adapters the plan counts the model's own parameters, the adapters trainable and the rest frozen (no copy
    is built, which under DeepSpeed ZeRO-3 would be partitioned); a tight budget turns checkpointing on and the
    adapters still train."""
    seen = []
    monkeypatch.setattr(trainer_module, "free_memory", lambda device: 1)
    cfg = make_config("lora", steps=2, train={"lr": 2e-2, "lora": {"r": 4, "alpha": 8}})
    text = io.StringIO()
    result = train(cfg, dataset=rows_dataset(text_dataset(64).tokens[:4].clone()), progress=False,
                   console=Console(file=text), callbacks=[lambda info: seen.append(_checkpointed(base_model(info.model)))])
    assert seen == [True, True] and "gradient checkpointing on (auto)" in text.getvalue()
    assert all(loss == loss and loss < 10 for _, loss in result.losses)
