"""Reading a model: its text config, its rotary-embedding modules, its RoPE facts and ropekit's record on it."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from ..core.rope_info import RopeInfo
from ..errors import UnsupportedModelError


def text_config(model_or_config):
    """The config that holds the language model's settings (the text part of a multimodal config)."""
    config = getattr(model_or_config, "config", model_or_config)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _is_rotary(module: torch.nn.Module) -> bool:
    """A transformers rotary-embedding module: a ``rope_type`` and its ``inv_freq`` buffer (one per layer type
    on models with RoPE per layer type: ``full_attention_inv_freq`` …)."""
    if not hasattr(module, "rope_type"):
        return False
    if isinstance(module.rope_type, dict):
        return all(hasattr(module, f"{t}_inv_freq") for t in module.rope_type)
    return hasattr(module, "inv_freq")


def rotary_modules(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """``(parent, attribute, module)`` for every rotary-embedding module of ``model``."""
    found = []
    for parent in model.modules():
        for attr, child in parent.named_children():
            if _is_rotary(child):
                found.append((parent, attr, child))
    return found


def rotary_inv_freq(rotary: torch.nn.Module, layer_type: str | None = None) -> torch.Tensor:
    """The frequencies a rotary module applies now (to ``layer_type``'s layers on a per-layer-type model)."""
    return getattr(rotary, f"{layer_type}_inv_freq") if layer_type else rotary.inv_freq


def rebuild_rotary(model: torch.nn.Module) -> None:
    """Replace every rotary-embedding module by a new one built from the current config (on the same device)."""
    for parent, attr, old in rotary_modules(model):
        device = next(old.buffers()).device
        setattr(parent, attr, type(old)(config=old.config).to(device))


def rope_info(model, layer_type: str | None = None) -> RopeInfo:
    """The RoPE facts of ``model`` (of ``layer_type``'s layers, on a model with RoPE per layer type); a model
    without RoPE raises a one-line :class:`UnsupportedModelError`."""
    config = text_config(model)
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
