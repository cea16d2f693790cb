"""Tiny RoPE models built from configs in code.

They are what the tests, the default demo and the quick study run on: small enough for a 2-core CPU,
but real transformers models of each supported family, so every code path is the production one.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers import CONFIG_MAPPING

from ..adapters.transformers import preset_attn_implementation
from ..errors import RopekitError

#: Model families ropekit builds tiny models of (transformers ``model_type`` → what sets it apart).
FAMILIES = {
    "llama": "plain RoPE, GQA",
    "mistral": "plain RoPE (sliding window off, as Mistral 7B v0.2+)",
    "qwen2": "plain RoPE, biased q/k/v",
    "qwen3": "plain RoPE, q/k norms, explicit head_dim",
    "phi3": "fused qkv, validates rope types (default and longrope only)",
    "gpt_neox": "partial rotary (a quarter of each head), MHA, parallel residual",
    "gemma2": "attention-logit softcap, sliding window on alternate layers",
    "gemma3_text": "per-layer-type RoPE: sliding (local) layers base 1e4, full (global) layers base 1e6",
    "olmo2": "q/k norms over all heads",
    "granite": "attention multiplier instead of 1/√d",
    "cohere": "interleaved rotary layout (adjacent channels pair up)",
    "gpt_oss": "attention sinks, sliding window on alternate layers, mixture of experts",
    "deepseek_v2": "multi-head latent attention (RoPE on a separate slice at the end of q/k), mixture of experts",
    "deepseek_v3": "multi-head latent attention, mixture of experts",
}

#: Checkpoints as people bring them: a family with the RoPE scaling its releases ship (over a tiny window).
#: name → (family, rope scaling as a function of the original window, declared window as a multiple of it).
SHIPPED = {
    "llama3": ("llama", lambda w: {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": w}, 8),
    "qwen2.5-yarn": ("qwen2", lambda w: {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": w}, 4),
    "qwen3-yarn": ("qwen3", lambda w: {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": w}, 4),
    "phi3.5": ("phi3", lambda w: {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": w,
                                  "short_factor": None, "long_factor": None}, 4),
    # Phi-4-mini: LongRoPE on three quarters of each head (partial rotary), short and long factors
    "phi4-mini": ("phi3", lambda w: {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": w,
                                     "short_factor": None, "long_factor": None, "partial_rotary_factor": 0.75}, 4),
    # Llama 3.2 (1B/3B): llama3 scaling with factor 32 (8,192 → 131,072 tokens)
    "llama3.2": ("llama", lambda w: {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": w}, 32),
    "gpt-oss": ("gpt_oss", lambda w: {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "truncate": False, "original_max_position_embeddings": w}, 4),
    "deepseek-v3": ("deepseek_v3", lambda w: {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": w,
                                              "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0,
                                              "beta_slow": 1.0}, 4),
}

#: Window (max_position_embeddings) of the built-in tiny model.
TINY_WINDOW = 64


def _longrope_factors(pairs: int, top: float, short: bool) -> list[float]:
    """Non-decreasing per-pair factors in [1, top] (the shape LongRoPE's search gives Phi-3.5), short ones milder."""
    top = 1.0 + (top - 1.0) * (0.25 if short else 1.0)
    return [round(1.0 + (top - 1.0) * (i / max(1, pairs - 1)) ** 2, 4) for i in range(pairs)]


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
    """A small config of ``family`` (:data:`FAMILIES`, or a shipped variant of :data:`SHIPPED`) with RoPE base
    ``rope_theta`` and a ``window``-token context.

    ``rope_scaling`` makes the RoPE already scaled, as shipped checkpoints are (e.g. ``{"rope_type": "llama3",
    "factor": 4, …}``): its keys go into ``rope_parameters``. A :data:`SHIPPED` name brings its own scaling over
    ``window`` and declares the scaled window. GPT-NeoX defaults to partial rotary (a quarter of each head, as the
    Pythia models) and always has MHA, since it has no key/value-head setting.
    """
    declared = window
    if family in SHIPPED:
        family, scaling, multiple = SHIPPED[family]
        rope_scaling = {**scaling(window), **(rope_scaling or {})}
        declared = window * multiple
    if family not in FAMILIES:
        known = list(FAMILIES) + list(SHIPPED)
        raise RopekitError(f"unknown model family '{family}'", f"choose one of {', '.join(known)}")
    head_dim = hidden_size // num_heads
    rope: dict = {"rope_type": "default", "rope_theta": float(rope_theta), **(rope_scaling or {})}
    if rope["rope_type"] == "longrope":
        prf = float(rope.get("partial_rotary_factor") or partial_rotary_factor or 1.0)
        pairs = int(head_dim * prf) // 2  # one factor per rotary pair
        for key in ("short_factor", "long_factor"):
            if rope.get(key) is None:
                rope[key] = _longrope_factors(pairs, float(rope.get("factor", 4.0)), key == "short_factor")
    kv = num_kv_heads or num_heads
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                  num_attention_heads=num_heads, max_position_embeddings=declared, tie_word_embeddings=False,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "gpt_neox":
        rope["partial_rotary_factor"] = 0.25 if partial_rotary_factor is None else partial_rotary_factor
        return CONFIG_MAPPING[family](intermediate_size=4 * hidden_size, rope_parameters=rope,
                                      use_parallel_residual=True, **common)
    if partial_rotary_factor is not None:
        rope["partial_rotary_factor"] = partial_rotary_factor
    kwargs = dict(common, intermediate_size=2 * hidden_size, num_key_value_heads=kv, rope_parameters=rope)
    if family in ("mistral", "qwen2", "qwen3"):
        kwargs["sliding_window"] = None
    if family in ("qwen3", "gemma2", "gemma3_text", "cohere", "gpt_oss", "granite", "olmo2", "mistral"):
        kwargs["head_dim"] = head_dim
    if family == "phi3":
        kwargs["original_max_position_embeddings"] = rope.get("original_max_position_embeddings", window)
    if family == "gemma2":
        # alternate sliding and full layers; the window is a quarter of the context so that it matters
        kwargs.update(sliding_window=max(4, window // 4), attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                      query_pre_attn_scalar=head_dim)
    if family == "gemma3_text":
        kwargs.update(sliding_window=max(4, window // 4), query_pre_attn_scalar=head_dim,
                      layer_types=["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)])
        local = {"rope_type": "default", "rope_theta": float(rope_theta)}
        kwargs["rope_parameters"] = {"sliding_attention": local, "full_attention": {**rope, "rope_theta": 100 * float(rope_theta)}}
    if family == "granite":
        kwargs.update(attention_multiplier=1.0 / head_dim, embedding_multiplier=2.0, residual_multiplier=0.5,
                      logits_scaling=2.0)
    if family == "gpt_oss":
        # every expert routed to every token: the router's choice is continuous, so the tiny model's outputs do not
        # jump with the last bit of a logit (real checkpoints pick the top few)
        kwargs.update(sliding_window=max(4, window // 4), num_local_experts=4, num_experts_per_tok=4,
                      layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)])
    if family in ("deepseek_v2", "deepseek_v3"):
        rope_dim = head_dim // 2
        kwargs.update(q_lora_rank=None, kv_lora_rank=2 * head_dim, qk_rope_head_dim=rope_dim,
                      qk_nope_head_dim=head_dim - rope_dim, v_head_dim=head_dim, head_dim=rope_dim,
                      n_routed_experts=4, num_experts_per_tok=4, n_shared_experts=1, moe_intermediate_size=hidden_size,
                      first_k_dense_replace=1, n_group=1, topk_group=1, num_key_value_heads=num_heads)
        if family == "deepseek_v2":
            kwargs.pop("n_group"), kwargs.pop("topk_group")
    return CONFIG_MAPPING[family](**kwargs)


def default_attention(config) -> str:
    """``sdpa`` where the family supports it, else ``eager`` (Gemma 2 and gpt-oss: softcap and sinks)."""
    from ..adapters.transformers import causal_lm_class, supports_sdpa

    return "sdpa" if supports_sdpa(causal_lm_class(config)) else "eager"


def build_tiny_model(family: str = "llama", *, seed: int = 0, attn_implementation: str | None = None,
                     **config_kwargs) -> PreTrainedModel:
    """A randomly initialised tiny causal LM of ``family`` (or a :data:`SHIPPED` variant), deterministic for a
    given ``seed``, in eval mode, with ``attn_implementation`` (default: sdpa where the family has it)."""
    config = tiny_config(family, **config_kwargs)
    attn = attn_implementation or default_attention(config)
    preset_attn_implementation(config, attn)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    model.eval()
    return model
