"""``ropekit train plan``: bytes per GPU against independent references — hand arithmetic on Llama-2-7B's
published parameter count for weights, gradients and optimizer state, and measured saved-for-backward bytes of
small CPU runs (saved-tensor hooks) for activations, on shapes the coefficients were not read from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, AutoModelForCausalLM

from ropekit.train import load_config
from ropekit.train.bench import _activation_bytes
from ropekit.train.plan import GIB, activation_bytes_per_token, head_bytes_per_token, plan_memory

REPO = Path(__file__).resolve().parents[2]
LLAMA2_7B = 6_738_415_616  # the published parameter count of Llama-2-7B


def test_llama2_7b_weights_gradients_optimizer_by_hand():
    cfg = load_config(REPO / "configs/train/llama2-7b-yarn-64k.yaml")  # float32 master weights, bf16 compute, FSDP
    plan = plan_memory(cfg, gpus=8, gpu_memory_gib=80)
    assert plan.parameters == plan.trainable == LLAMA2_7B
    assert plan.weights == LLAMA2_7B * 4 // 8 == 3_369_207_808
    assert plan.gradients == plan.weights
    assert plan.optimizer == 2 * LLAMA2_7B * 4 // 8  # AdamW's two moments in the parameters' float32
    # 64k tokens of bf16 compute: per layer 20·4096 + 4·4096 + 8·11008 + 4·32 + 8 = 186,504 bytes per token
    per_layer = 20 * 4096 + 4 * 4096 + 8 * 11008 + 4 * 32 + 8
    head = 9 * 4096 + 20  # final norm and LM-head input outside the layers, token ids and labels
    assert plan.activations == 65536 * (32 * per_layer + head)
    assert plan.activations_checkpointed == 65536 * (32 * 4096 * 2 + per_layer + head)
    assert plan.logits == 65536 * 32000 * (2 + 4)
    ddp = plan_memory(cfg, gpus=8, gpu_memory_gib=80, strategy="ddp")
    assert ddp.weights == LLAMA2_7B * 4 and ddp.optimizer == 2 * LLAMA2_7B * 4  # nothing sharded
    zero2 = plan_memory(cfg, gpus=8, gpu_memory_gib=80, strategy="zero2")
    assert zero2.weights == LLAMA2_7B * 4 and zero2.gradients == LLAMA2_7B * 4 // 8


def test_context_parallel_splits_the_tokens_and_lora_shrinks_the_trained_state():
    cfg = load_config(REPO / "configs/train/llama2-7b-abf-3stage.yaml")
    alone, split = (plan_memory(cfg, gpus=8, gpu_memory_gib=80, context_parallel=cp) for cp in (1, 2))
    assert alone.tokens_per_gpu == 131072 and split.tokens_per_gpu == 65536
    assert split.activations * 2 == alone.activations and split.logits * 2 == alone.logits
    assert not alone.fits and split.fits  # the 128k stage needs its sequence split across two GPUs
    lora = plan_memory(load_config(REPO / "configs/train/llama2-7b-longlora-32k.yaml"), gpus=8, gpu_memory_gib=80)
    # r = 8 on q/k/v/o: 4 projections × 32 layers × 8 × (4096 + 4096), plus embeddings and norms trained fully
    adapters = 4 * 32 * 8 * (4096 + 4096)
    extras = 32000 * 4096 + (2 * 32 + 1) * 4096
    assert lora.trainable == adapters + extras


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(96, 3, 1, 200), (256, 4, 4, 512), (128, 8, 2, 352)])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_activations_equal_the_saved_tensors_of_a_cpu_run(dtype, shape, checkpointing):
    hidden, heads, kv, inner = shape
    measured = []
    for layers in (1, 3):
        config = LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=inner, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=512,
                             tie_word_embeddings=False, use_cache=False)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(dtype).train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        ids = torch.randint(3, 60, (1, 80))
        measured.append(_activation_bytes(model, lambda: model(input_ids=ids, labels=ids).loss)[1])
    per_layer_token = (measured[1] - measured[0]) / 80 / 2
    element = 4 if dtype == torch.float32 else 2
    # what the plan counts per layer: everything without checkpointing, only the layer input with it
    if checkpointing:
        planned = hidden * element
    else:
        planned = activation_bytes_per_token(config, element, checkpointing=False) / 3
    assert per_layer_token == planned


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [96, 192])
def test_everything_saved_against_a_cpu_run_with_a_real_vocabulary(dtype, hidden):
    config = LlamaConfig(vocab_size=8192, hidden_size=hidden, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, use_cache=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(dtype).train()
    ids = torch.randint(3, 8000, (1, 64))
    measured = _activation_bytes(model, lambda: model(input_ids=ids, labels=ids).loss)[1]
    # saved for backward: the layers' activations, what lies outside them, and the float32 log-softmax (the plan's
    # logits term adds the logits tensor itself, alive until the loss returns, which saved-tensor hooks do not see)
    element = 4 if dtype == torch.float32 else 2
    per_token = activation_bytes_per_token(config, element, checkpointing=False) + head_bytes_per_token(config, element)
    saved = 64 * (per_token + 8192 * 4)
    assert abs(measured - saved) <= 16  # a few scalars (the loss, its normaliser)


def test_cli_plan(run_cli):
    code, out, err = run_cli("train", "plan", str(REPO / "configs/train/llama2-7b-yarn-64k.yaml"), "--gpus", "8",
                             "--gpu-memory", "80", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["fits"] and data["total"] < 80 * GIB and data["parameters"] == LLAMA2_7B
    code, _, err = run_cli("train", "plan", str(REPO / "configs/train/llama2-7b-yarn-64k.yaml"), "--gpus", "3",
                           "--context-parallel", "2")
    assert code == 2 and "context-parallel" in err
