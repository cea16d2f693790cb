"""Reading a model: its text config, its rotary-embedding modules, its RoPE facts and ropekit's record on it.

The rotary-embedding modules themselves (finding, reading, rebuilding them) are a contact with transformers'
model files: :mod:`ropekit.adapters.transformers` owns it, and this module re-exports its functions.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from ..adapters.transformers import rebuild_rotary as rebuild_rotary
from ..adapters.transformers import rotary_inv_freq as rotary_inv_freq
from ..adapters.transformers import rotary_modules as rotary_modules
from ..core.rope_info import RopeInfo
from ..errors import UnsupportedModelError


def text_config(model_or_config):
    """The config that holds the language model's settings (the text part of a multimodal config)."""
    config = getattr(model_or_config, "config", model_or_config)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def rope_info(model, layer_type: str | None = None) -> RopeInfo:
    """The RoPE facts of ``model`` (of ``layer_type``'s layers, on a model with RoPE per layer type); a model
    without RoPE raises a one-line :class:`UnsupportedModelError`."""
    config = text_config(model)
    rope = getattr(config, "rope_parameters", None) or {}
    if isinstance(rope, dict) and "mrope_section" in rope and not _text_only_mrope(model):
        # Qwen2-VL's M-RoPE (Wang et al. 2024, "Qwen2-VL"): positions are (time, height, width) triples, the rotary
        # channels split among them; a model with a vision tower also has a rotary module of its own there
        raise UnsupportedModelError(
            f"model type '{getattr(config, 'model_type', '?')}' uses multimodal RoPE (mrope_section "
            f"{rope['mrope_section']}): 3-D positions that ropekit's methods do not scale",
            "use a text-only model of the family (Qwen2.5, Qwen3)")
    info = RopeInfo.from_config(config, layer_type)
    if not isinstance(model, torch.nn.Module):
        return info
    modules = rotary_modules(model)
    if not modules:
        raise UnsupportedModelError(
            f"model type '{info.model_type}' has RoPE settings but no rotary-embedding module ropekit can rebuild",
            "use a transformers 5.x Llama, Mistral, Qwen2/3, Phi-3 or GPT-NeoX model",
        )
    if info.rope_type == "default":
        # Some families ignore `partial_rotary_factor` (Llama, Qwen2…): the module's own frequencies are the truth.
        rotary_dim = 2 * rotary_inv_freq(modules[0][2], info.layer_type).numel()
        if rotary_dim != info.rotary_dim:
            info = dataclasses.replace(info, rotary_dim=rotary_dim, partial_rotary_factor=rotary_dim / info.head_dim)
    return info


def _text_only_mrope(model) -> bool:
    """Whether a model whose config names M-RoPE sections computes plain 1-D RoPE: a language model without a vision
    tower (what ``AutoModelForCausalLM`` builds from a Qwen3.5 checkpoint) whose rotary module, given 1-D positions,
    returns cos/sin of ``[θ·m, θ·m]`` — Qwen3.5's expands them to three identical (time, height, width) streams, so
    every section rotates at the same position. Probed on the module, not assumed from the family."""
    if not isinstance(model, torch.nn.Module) or getattr(getattr(model, "config", None), "vision_config", None):
        return False
    modules = rotary_modules(model)
    if len(modules) != 1 or not hasattr(modules[0][2], "inv_freq"):
        return False
    rotary = modules[0][2]
    inv_freq = rotary.inv_freq.float()
    positions = torch.tensor([[0, 1, 7, 4096]], device=inv_freq.device)
    with torch.no_grad():
        out = rotary(torch.zeros(1, 4, 2 * inv_freq.numel(), device=inv_freq.device), positions)
    if not isinstance(out, tuple) or len(out) != 2 or out[0].shape[-1] != 2 * inv_freq.numel():
        return False
    angles = positions[..., None].float() * inv_freq
    scale = getattr(rotary, "attention_scaling", 1.0)
    emb = torch.cat((angles, angles), dim=-1)
    return bool(torch.allclose(out[0].float(), emb.cos() * scale, atol=1e-6)
                and torch.allclose(out[1].float(), emb.sin() * scale, atol=1e-6))


def installed(model_or_config) -> dict[str, Any] | None:
    """The ropekit record of an extended model (method, params, base RoPE) or ``None``."""
    return getattr(text_config(model_or_config), "ropekit", None)


def base_info(config, layer_type: str | None = None) -> RopeInfo:
    """RoPE facts of the model *before* extension (from the ropekit record when there is one)."""
    record = getattr(config, "ropekit", None)
    if not record:
        return RopeInfo.from_config(config, layer_type)
    base = copy.copy(config)
    base.rope_parameters = record["base"]["rope_parameters"]
    base.max_position_embeddings = record["base"]["max_position_embeddings"]
    info = RopeInfo.from_config(base, layer_type)
    current = config.rope_parameters or {}
    rotated = (current.get(info.layer_type, {}) if info.layer_type else current).get("partial_rotary_factor")
    if rotated is not None and float(rotated) != info.partial_rotary_factor:
        # extend recorded what the model really rotates (some families ignore the configured factor)
        info = dataclasses.replace(info, partial_rotary_factor=float(rotated), rotary_dim=int(info.head_dim * float(rotated)))
    return info
