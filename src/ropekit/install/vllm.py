"""Serving an exported model with vLLM exactly as ropekit computes it: which config values vLLM reads under which
names, the context length to ask for, and the command line that does both.

vLLM builds its rotary embedding from ``config.json``'s ``rope_parameters`` (``get_rope``), but not always under
transformers' meaning: its ``longrope`` ignores ``attention_factor`` (it derives the magnitude from
``max_position_embeddings`` unless ``short_mscale``/``long_mscale`` are given) and uses the long factors at every
length once the served context exceeds the original window; its ``dynamic`` computes one base for the whole cache
instead of per input. So an export is exact in vLLM only for the rope types below, some with overrides.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError

#: Rope types vLLM computes as transformers does, from the same keys.
_SAME_MATH = ("default", "linear", "yarn", "llama3")


@dataclass(frozen=True)
class VLLMServing:
    """How to serve an exported directory with vLLM: ``exact`` (or ``why`` not), ``hf_overrides`` to pass, the
    ``max_model_len`` (the model's extended window) and the ``command`` that does it."""

    exact: bool
    why: str
    max_model_len: int
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    command: str = ""


def _rope_overrides(rope: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """``(the rope dict vLLM should read, "")`` or ``(None, why vLLM would compute something else)``."""
    kind = rope.get("rope_type", "default")
    if kind in _SAME_MATH:
        return rope, ""
    if kind == "longrope":
        if list(rope.get("short_factor") or []) != list(rope.get("long_factor") or []):
            return None, ("vLLM's longrope applies the long factors at every length once the served context exceeds "
                          "the original window, while transformers and ropekit switch by input length")
        if rope.get("attention_factor") is None:
            return rope, ""
        # vLLM reads the magnitude from short_mscale/long_mscale, not from attention_factor
        return {**rope, "short_mscale": rope["attention_factor"], "long_mscale": rope["attention_factor"]}, ""
    if kind == "dynamic":
        return None, "vLLM's dynamic computes one base for its whole context instead of per input (it serves plain RoPE)"
    return None, f"vLLM has no rope type '{kind}' (a ropekit-only method: export it with rope_format longrope if it is static)"


def vllm_serving(directory: str | Path) -> VLLMServing:
    """The vLLM serving plan for a directory written by ``ropekit.save_pretrained``."""
    path = Path(directory)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"no config.json in '{path}'", "pass a directory written by `ropekit extend`")
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters") or {"rope_type": "default"}
    max_len = int(config.get("max_position_embeddings") or 0)
    if any(isinstance(v, dict) for v in rope.values()):  # RoPE per layer type: each one must be exact
        served, whys = {}, []
        for key, value in rope.items():
            if isinstance(value, dict):
                value, why = _rope_overrides(value)
                whys.append(why)
            served[key] = value
        why = next((w for w in whys if w), "")
        served = None if why else served
    else:
        served, why = _rope_overrides(rope)
    if served is None:
        return VLLMServing(exact=False, why=why, max_model_len=max_len)
    overrides = {} if served == rope else {"rope_parameters": served}
    parts = ["vllm", "serve", str(path), "--max-model-len", str(max_len)]
    if overrides:
        parts += ["--hf-overrides", json.dumps(overrides, separators=(",", ":"))]
    return VLLMServing(exact=True, why="", max_model_len=max_len, hf_overrides=overrides,
                       command=" ".join(shlex.quote(p) for p in parts))
