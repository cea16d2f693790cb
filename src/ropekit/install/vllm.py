"""Serving an exported model with vLLM exactly as ropekit computes it: which config values vLLM reads under which
names, the context length to ask for, and the command line that does both.

vLLM builds its rotary embedding from ``config.json``'s ``rope_parameters`` (``get_rope``), but not always under
transformers' meaning: its ``longrope`` ignores ``attention_factor`` (it derives the magnitude from
``max_position_embeddings`` unless ``short_mscale``/``long_mscale`` are given) and uses the long factors at every
length once the served context exceeds the original window; its ``dynamic`` computes one base for the whole cache
(Dynamic NTK frozen at factor × window tokens) instead of per input; its ``yarn`` takes the magnitude as
``0.1·ln s + 1`` times its own ``attn_factor``, never transformers' ``attention_factor``. So an export is exact in
vLLM only for the rope types below, some with overrides.

**Methods vLLM computes itself.** A method may write ``config.json`` keys with which vLLM computes it rather than through
its RoPE (:attr:`ropekit.methods.base.Method.vllm_keys`: Dual Chunk Attention's ``dual_chunk_attention_config``); the
export writes them (:meth:`~ropekit.methods.base.Method.vllm_config`) and the method says how vLLM serves them
(:meth:`~ropekit.methods.base.Method.vllm_serve`).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from ..methods import list_methods
from ..methods.base import EngineServing

#: Rope types vLLM computes as transformers does, from the same keys.
_SAME_MATH = ("default", "linear", "llama3")


def _yarn_overrides(rope: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``yarn`` multiplies cos and sin by ``yarn_get_mscale(factor) · attn_factor`` (``attn_factor`` 1 unless
    given) and never reads transformers' ``attention_factor``: an attention factor other than 0.1·ln s + 1 (an
    explicit one, DeepSeek's mscale ratio, NTK-by-parts' 1) reaches vLLM as ``attn_factor`` = A / (0.1·ln s + 1)."""
    factor = float(rope.get("factor") or 1.0)
    own = 0.1 * math.log(factor) + 1.0 if factor > 1.0 else 1.0
    attention = rope.get("attention_factor")
    if attention is None or abs(float(attention) - own) <= 1e-12 * own:
        return rope
    return {**rope, "attn_factor": float(attention) / own}


@dataclass(frozen=True)
class VLLMServing:
    """How to serve an exported directory with vLLM: ``exact`` (or ``why`` not), ``hf_overrides`` to pass, the
    ``max_model_len`` (the model's extended window) and the ``command`` that does it."""

    exact: bool
    why: str
    max_model_len: int
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    #: Environment variables the command sets (an engine-computed method's backend: Dual Chunk Attention's).
    env: dict[str, str] = field(default_factory=dict)


def _rope_overrides(rope: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """``(the rope dict vLLM should read, "")`` or ``(None, why vLLM would compute something else)``."""
    kind = rope.get("rope_type", "default")
    if kind in _SAME_MATH:
        return rope, ""
    if kind == "yarn":
        return _yarn_overrides(rope), ""
    if kind == "longrope":
        if list(rope.get("short_factor") or []) != list(rope.get("long_factor") or []):
            return None, ("vLLM's longrope applies the long factors at every length once the served context exceeds "
                          "the original window, while transformers and ropekit switch by input length")
        if rope.get("attention_factor") is None:
            return rope, ""
        # vLLM reads the magnitude from short_mscale/long_mscale, not from attention_factor
        return {**rope, "short_mscale": rope["attention_factor"], "long_mscale": rope["attention_factor"]}, ""
    if kind == "dynamic":
        return None, ("vLLM's dynamic computes one base for its whole context, Dynamic NTK frozen at factor × window "
                      "tokens, instead of per input: export with --freeze-length (factor × window gives vLLM's numbers)")
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
    engine_key = next((key for key in engine_keys() if config.get(key) is not None), None)
    if engine_key is not None:
        return _engine_serving(path, config, max_len, engine_key)
    refusal = ((config.get("ropekit") or {}).get("export") or {}).get("vllm_refusal")
    if refusal:  # the export knew why vLLM cannot compute the method itself (the method's vllm_config said)
        return VLLMServing(exact=False, why=refusal, max_model_len=max_len)
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


def engine_keys() -> tuple[str, ...]:
    """Every ``config.json`` key through which vLLM computes some method itself (the methods' ``vllm_keys``)."""
    return tuple(key for m in list_methods() for key in m.vllm_keys)


def _engine_serving(path: Path, config: dict[str, Any], max_len: int, key: str) -> VLLMServing:
    """The plan for a directory carrying ``key``, a method's :attr:`~ropekit.methods.base.Method.vllm_keys`: served
    only when ropekit's method that writes the key wrote it (its ``vllm_serve`` says how)."""
    owner = next(m for m in list_methods() if key in m.vllm_keys)
    record = config.get("ropekit") or {}
    if record.get("method") != owner.name:
        return VLLMServing(exact=False, why=f"its {key} was not written by ropekit's {owner.name}, "
                           "so ropekit does not compute what vLLM would", max_model_len=max_len)
    serving = owner.vllm_serve(config)
    if not isinstance(serving, EngineServing):
        return VLLMServing(exact=False, why=serving, max_model_len=max_len)
    parts = [f"{k}={v}" for k, v in serving.env.items()]
    parts += ["vllm", "serve", str(path), "--max-model-len", str(max_len), *serving.args,
              "--hf-overrides", json.dumps(serving.hf_overrides, separators=(",", ":"))]
    return VLLMServing(exact=True, why="", max_model_len=max_len, hf_overrides=serving.hf_overrides,
                       env=dict(serving.env), command=" ".join(shlex.quote(p) for p in parts))
