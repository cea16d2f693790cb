"""Tiny RoPE models built from configs in code.

They are what the tests, the default demo and the quick study run on: small enough for a 2-core CPU,
but real transformers models of each supported family, so every code path is the production one.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers import (
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

from ..errors import RopekitError

#: Families ropekit supports, mapped to their config class.
FAMILIES = {
    "llama": LlamaConfig,
    "mistral": MistralConfig,
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
    "phi3": Phi3Config,
    "gpt_neox": GPTNeoXConfig,
}

#: Window (max_position_embeddings) of the built-in tiny model.
TINY_WINDOW = 64


def tiny_config(
    family: str = "llama",
    *,
    vocab_size: int = 256,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = 2,
    window: int = TINY_WINDOW,
    rope_theta: float = 10000.0,
    partial_rotary_factor: float | None = None,
    rope_scaling: dict | None = None,
):
    """A small config of ``family`` with RoPE base ``rope_theta`` and a ``window``-token context.

    ``rope_scaling`` makes the RoPE already scaled, as shipped checkpoints are (e.g. ``{"rope_type": "llama3",
    "factor": 4, …}``): its keys go into ``rope_parameters``. GPT-NeoX defaults to partial rotary (a quarter of
    each head, as the Pythia models) and always has MHA, since it has no key/value-head setting.
    """
    if family not in FAMILIES:
        raise RopekitError(f"unknown model family '{family}'", f"choose one of {', '.join(FAMILIES)}")
    rope: dict = {"rope_type": "default", "rope_theta": float(rope_theta), **(rope_scaling or {})}
    if family == "gpt_neox":
        rope["partial_rotary_factor"] = 0.25 if partial_rotary_factor is None else partial_rotary_factor
        return GPTNeoXConfig(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            intermediate_size=4 * hidden_size,
            max_position_embeddings=window,
            rope_parameters=rope,
            use_parallel_residual=True,
            tie_word_embeddings=False,
        )
    if partial_rotary_factor is not None:
        rope["partial_rotary_factor"] = partial_rotary_factor
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        max_position_embeddings=window,
        rope_parameters=rope,
        tie_word_embeddings=False,
    )
    if family in ("mistral", "qwen2", "qwen3"):
        kwargs["sliding_window"] = None
    if family == "qwen3":
        kwargs["head_dim"] = hidden_size // num_heads
    if family == "phi3":
        kwargs["original_max_position_embeddings"] = window
        kwargs.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config = FAMILIES[family](**kwargs)
    return config


def build_tiny_model(family: str = "llama", *, seed: int = 0, **config_kwargs) -> PreTrainedModel:
    """A randomly initialised tiny causal LM of ``family``, deterministic for a given ``seed``, in eval mode."""
    config = tiny_config(family, **config_kwargs)
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.eval()
    return model
