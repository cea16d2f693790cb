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


def rotary_modules(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """``(parent, attribute, module)`` for every rotary-embedding module (it has ``inv_freq`` and ``rope_type``)."""
    found = []
    for parent in model.modules():
        for attr, child in parent.named_children():
            if hasattr(child, "inv_freq") and hasattr(child, "rope_type"):
                found.append((parent, attr, child))
    return found


def rebuild_rotary(model: torch.nn.Module) -> None:
    """Replace every rotary-embedding module by a new one built from the current config (on the same device)."""
    for parent, attr, old in rotary_modules(model):
        device = old.inv_freq.device
        setattr(parent, attr, type(old)(config=old.config).to(device))


def rope_info(model) -> RopeInfo:
    """The RoPE facts of ``model``; a model without RoPE raises a one-line :class:`UnsupportedModelError`."""
    config = text_config(model)
    info = RopeInfo.from_config(config)
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
        rotary_dim = 2 * modules[0][2].inv_freq.numel()
        if rotary_dim != info.rotary_dim:
            info = dataclasses.replace(info, rotary_dim=rotary_dim, partial_rotary_factor=rotary_dim / info.head_dim)
    return info


def installed(model_or_config) -> dict[str, Any] | None:
    """The ropekit record of an extended model (method, params, base RoPE) or ``None``."""
    return getattr(text_config(model_or_config), "ropekit", None)


def base_info(config) -> RopeInfo:
    """RoPE facts of the model *before* extension (from the ropekit record when there is one)."""
    record = getattr(config, "ropekit", None)
    if not record:
        return RopeInfo.from_config(config)
    base = copy.copy(config)
    base.rope_parameters = record["base"]["rope_parameters"]
    base.max_position_embeddings = record["base"]["max_position_embeddings"]
    info = RopeInfo.from_config(base)
    rotated = (config.rope_parameters or {}).get("partial_rotary_factor")
    if rotated is not None and float(rotated) != info.partial_rotary_factor:
        # extend recorded what the model really rotates (some families ignore the configured factor)
        info = dataclasses.replace(info, partial_rotary_factor=float(rotated), rotary_dim=int(info.head_dim * float(rotated)))
    return info
