"""Describing a model: architecture, RoPE settings, what it is extended with, and which methods apply."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedModel

from ..adapters.transformers import attn_implementation
from ..methods import get_method, list_methods
from ..methods.base import EngineConfig
from .capabilities import model_features, why_not
from .model_rope import base_info, rope_info, text_config
from .rope_types import transformers_builds


def exports(m, info, base_dict, sliding=(), params=None) -> list[str]:
    """Where the method's export runs without ropekit: its native rope type when transformers has one (and the
    family accepts it: Phi-3 does not take yarn), else transformers' longrope when the frequencies fit it.
    ``params``: the resolved parameters to judge (default: the method's :meth:`~Method.example_params`)."""
    params = m.resolve(info, m.example_params(info)) if params is None else params
    native = m.transformers_rope(info, params)
    if native is not None and transformers_builds(base_dict, native):
        return m.exports_to(params)
    if m.vllm_keys:  # vLLM computes the method itself (Dual Chunk Attention), where its config says it is the same
        engine = m.vllm_config(info, params, sliding_layers=sliding)
        return m.exports_to(params) if isinstance(engine, EngineConfig) else []
    kind = m.length_dependence(info, params)[0]
    if m.frequencies_only and kind in ("static", "switch"):
        return ["transformers (longrope)"] + (["vllm (longrope)"] if kind == "static" else [])
    return []


def inspect_model(model: PreTrainedModel) -> dict[str, Any]:
    """Architecture, RoPE settings and applicable methods of ``model`` (what ``ropekit inspect`` shows)."""
    config = text_config(model)
    record = getattr(config, "ropekit", None)
    info = base_info(config)
    rope_info(model)  # raises when there is no rotary module
    base_dict = config.to_dict()
    features = model_features(model) if not record else None
    methods = []
    for m in list_methods():
        refusal = why_not(m, info, features) if features is not None else None
        why = refusal.problem if refusal else ("already extended" if features is None else None)
        exports_list = exports(m, info, base_dict, features.sliding_layers) if why is None else []
        methods.append({"name": m.name, "applies": why is None, "exports_to": exports_list,
                        "why_not": f"{refusal.problem}; {refusal.fix}" if refusal else (why or ""),
                        "feature": refusal.feature if refusal else ""})
    live = (config.rope_parameters.get(info.layer_type) if info.layer_type else config.rope_parameters).get("rope_type", "default")
    written = getattr(model, "_ropekit_written_rope_type", None) if record else None
    return {
        "architecture": type(model).__name__,
        "model_type": info.model_type,
        # what the saved config.json says (the standard type plain transformers and the engines read), else the
        # type the model computes with now (ropekit_<name> once a method is installed in memory)
        "rope_type": written if written is not None else live,
        "installed_rope_type": live,
        "rope_scaling": info.rope_parameters,  # the scaling the checkpoint already carries (None: plain RoPE)
        "effective_window": info.window,
        "original_window": info.original_window,
        "layer_type": info.layer_type,
        "features": features.describe() if features is not None else None,
        "rope_theta": info.rope_theta,
        "window": info.window,
        "max_position_embeddings": int(config.max_position_embeddings),
        "head_dim": info.head_dim,
        "rotary_dim": info.rotary_dim,
        "num_layers": info.num_layers,
        "num_heads": info.num_heads,
        "num_kv_heads": info.num_kv_heads,
        "parameters": sum(p.numel() for p in model.parameters()),
        "attn_implementation": attn_implementation(config),
        "extended_with": record and {
            "method": record["method"],
            "params": record["params"],
            # the longest input the method is built for (Self-Extend: G·(C − W + ⌊W/G⌋)), when it has one
            "reach": get_method(record["method"]).reach(info, record["params"]),
        },
        "methods": methods,
    }
