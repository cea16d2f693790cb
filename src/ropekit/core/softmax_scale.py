"""Model families whose attention reads its softmax scale from ``rope_parameters`` (DeepSeek-V2/V3 and their kin).

Their attention multiplies ``1/√d`` by ``mscale(factor, mscale_all_dim)²`` whenever the rope type is not ``default``
and ``mscale_all_dim`` is set (``yarn_apply_mscale`` in transformers' modeling file; DeepSeek-V2's own code does the
same), with ``mscale(s, m) = 0.1·m·ln s + 1`` for s > 1. The scale is fixed when the model is built. ropekit extends
a built model, so its attention keeps the scale of the base configuration; an export whose ``rope_parameters``
would make the family compute another scale is another model, and is not written in that form.
"""

from __future__ import annotations

import importlib
import math
from typing import Any


def reads_softmax_scale_from_rope(model_type: str) -> bool:
    """Whether transformers' modeling file of ``model_type`` scales attention by YaRN's ``mscale_all_dim``."""
    try:
        module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    except Exception:  # a family without its own modeling file (or a remote one) does not
        return False
    return callable(getattr(module, "yarn_apply_mscale", None))


def softmax_scale_factor(rope: dict[str, Any]) -> float:
    """The multiplier such a family applies to ``1/√d`` for ``rope`` (one RoPE's parameters)."""
    mscale_all_dim = rope.get("mscale_all_dim") or 0
    factor = float(rope.get("factor") or 1.0)
    if rope.get("rope_type", "default") == "default" or not mscale_all_dim or factor <= 1.0:
        return 1.0
    return (0.1 * float(mscale_all_dim) * math.log(factor) + 1.0) ** 2


def softmax_scale_changes(model_type: str, base_rope: dict[str, Any], written: dict[str, Any]) -> str:
    """Why a family would build attention with another softmax scale from ``written`` than the extended model keeps
    (the one of ``base_rope``), or ``""``."""
    if not reads_softmax_scale_from_rope(model_type):
        return ""
    if any(isinstance(v, dict) for v in (*base_rope.values(), *written.values())):
        return ""  # RoPE per layer type: none of these families has it
    kept, built = softmax_scale_factor(base_rope), softmax_scale_factor(written)
    if abs(kept - built) <= 1e-12 * kept:
        return ""
    return (f"model type '{model_type}' builds its attention's softmax scale from rope_parameters' factor and "
            f"mscale_all_dim: this form would scale it by {built:.6g} where the extended model keeps {kept:.6g}")
