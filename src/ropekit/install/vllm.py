"""Serving an exported model with vLLM exactly as ropekit computes it: which config values vLLM reads under which
names, the context length to ask for, and the command line that does both.

vLLM builds its rotary embedding from ``config.json``'s ``rope_parameters`` (``get_rope``), but not always under
transformers' meaning: its ``longrope`` ignores ``attention_factor`` (it derives the magnitude from
``max_position_embeddings`` unless ``short_mscale``/``long_mscale`` are given) and uses the long factors at every
length once the served context exceeds the original window; its ``dynamic`` computes one base for the whole cache
instead of per input. So an export is exact in vLLM only for the rope types below, some with overrides.

**Dual Chunk Attention.** vLLM serves DCA itself (Qwen2.5-1M) from ``config.json``'s ``dual_chunk_attention_config``
(read in vLLM's source, not run here: it needs CUDA). What its code reads and does:

* ``get_rope`` (``model_executor/layers/rotary_embedding/__init__.py``) builds ``DualChunkRotaryEmbedding`` from
  ``chunk_size`` and ``local_size`` *before* looking at any RoPE scaling, with base ``rope_theta`` and
  ``rotary_dim = head_size · partial_rotary_factor``: plain RoPE. Its tables (``dual_chunk_rope.py``), with
  ``L = chunk_size − local_size``: keys at ``j mod L``; queries at ``i mod L`` (intra), ``min(i mod L + L,
  chunk_size)`` (successive) and, for every earlier chunk, the successive table's last row ``min(2L − 1,
  chunk_size)`` — ``chunk_size`` whenever ``2·local_size < chunk_size``, which ropekit requires. That is ropekit's
  ``dual_chunk`` position for position.
* The attention backend ``DUAL_CHUNK_FLASH_ATTN`` (``attention/backends/dual_chunk_flash_attn.py``) reads
  ``chunk_size`` (default 8192), ``local_size`` (default 1024), ``original_max_position_embeddings`` (default 0)
  and ``sparse_attention_enabled`` / ``sparse_attention_config`` / ``_threshold`` / ``_last_q``. When
  ``original_max_position_embeddings > 0`` it multiplies keys and the softmax scale by ``0.1·ln(n/C) + 1`` (a
  temperature ropekit's DCA does not have), and sparse attention drops keys: ropekit writes neither. It requires
  ``L`` to be a multiple of the KV-cache block size, and without chunked prefill (or a prefix-cache hit) a prompt's
  prefill has no block table and runs *plain* causal attention — so the command passes
  ``--enable-chunked-prefill`` and ``--block-size 16``.
* It is a V0-engine backend built on vllm-flash-attn (the rotary tables are allocated on ``cuda``): ``VLLM_USE_V1=0``
  and ``VLLM_ATTENTION_BACKEND=DUAL_CHUNK_FLASH_ATTN`` as in Qwen's Qwen2.5-1M instructions, a CUDA GPU, and a vLLM
  that still has the V0 engine; vLLM's CPU build cannot run it. Such a vLLM reads ``rope_theta`` from the top level
  of the config (transformers 4.x names), hence the ``rope_theta`` override.
* Only the model files of the families in :data:`DUAL_CHUNK_FAMILIES` hand the config to their rotary embedding and
  attention; sliding-window layers are refused by the backend.
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

#: Model types whose vLLM model file passes ``dual_chunk_attention_config`` to ``get_rope`` and ``Attention``.
DUAL_CHUNK_FAMILIES = ("qwen2", "qwen3")
#: The KV-cache block size the serve command sets; vLLM's DCA needs ``chunk_size − local_size`` to be a multiple.
DUAL_CHUNK_BLOCK_SIZE = 16
#: Environment of a vLLM process serving Dual Chunk Attention (its backend exists in the V0 engine only).
DUAL_CHUNK_ENV = {"VLLM_ATTENTION_BACKEND": "DUAL_CHUNK_FLASH_ATTN", "VLLM_USE_V1": "0"}


def dual_chunk_config(model_type: str, info, params: dict[str, Any], sliding_layers=()) -> tuple[dict | None, str]:
    """``(dual_chunk_attention_config, "")`` with which vLLM computes ropekit's ``dual_chunk`` (``params``) on a model
    of ``model_type`` with RoPE ``info``, or ``(None, why not)`` in one line."""
    if model_type not in DUAL_CHUNK_FAMILIES:
        return None, (f"vLLM serves Dual Chunk Attention only for {', '.join(DUAL_CHUNK_FAMILIES)} models "
                      f"(dual_chunk_attention_config), not '{model_type}'")
    if info.is_scaled:
        return None, (f"vLLM's dual-chunk rotary embedding uses plain RoPE (rope_theta), not this model's "
                      f"'{info.rope_type}' scaling that ropekit's dual_chunk rotates with")
    if info.partial_rotary_factor != 1.0:
        return None, "vLLM's dual-chunk RoPE would rotate the whole head, this model rotates part of it"
    if sliding_layers:
        return None, "vLLM's dual-chunk attention backend refuses models with sliding-window layers"
    chunk_len = int(params["chunk_size"]) - int(params["local_size"])
    if chunk_len % DUAL_CHUNK_BLOCK_SIZE:
        return None, (f"vLLM's dual-chunk attention needs chunk_size − local_size ({chunk_len}) to be a multiple of "
                      f"its KV-cache block size {DUAL_CHUNK_BLOCK_SIZE}")
    # no original_max_position_embeddings: vLLM would add its 0.1·ln(n/C) + 1 temperature; no sparse attention
    return {"chunk_size": int(params["chunk_size"]), "local_size": int(params["local_size"]),
            "sparse_attention_enabled": False}, ""


@dataclass(frozen=True)
class VLLMServing:
    """How to serve an exported directory with vLLM: ``exact`` (or ``why`` not), ``hf_overrides`` to pass, the
    ``max_model_len`` (the model's extended window) and the ``command`` that does it."""

    exact: bool
    why: str
    max_model_len: int
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    #: Environment variables the command sets (Dual Chunk Attention's backend).
    env: dict[str, str] = field(default_factory=dict)


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
    if config.get("dual_chunk_attention_config") is not None:
        return _dual_chunk_serving(path, config, max_len)
    refusal = ((config.get("ropekit") or {}).get("export") or {}).get("vllm_refusal")
    if refusal:  # the export knew why vLLM cannot compute the method itself (Dual Chunk Attention's settings)
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


def _dual_chunk_serving(path: Path, config: dict[str, Any], max_len: int) -> VLLMServing:
    """The plan for a directory carrying ``dual_chunk_attention_config`` (module doc)."""
    dca = config["dual_chunk_attention_config"]
    record = config.get("ropekit") or {}
    if record.get("method") != "dual_chunk":
        return VLLMServing(exact=False, why="its dual_chunk_attention_config was not written by ropekit's dual_chunk, "
                           "so ropekit does not compute what vLLM would", max_model_len=max_len)
    if config.get("model_type") not in DUAL_CHUNK_FAMILIES:
        return VLLMServing(exact=False, why=f"vLLM serves Dual Chunk Attention only for "
                           f"{', '.join(DUAL_CHUNK_FAMILIES)} models", max_model_len=max_len)
    if int(dca.get("original_max_position_embeddings") or 0) > 0 or dca.get("sparse_attention_enabled"):
        return VLLMServing(exact=False, why="its dual_chunk_attention_config turns on vLLM's temperature or sparse "
                           "attention, which ropekit's dual_chunk does not compute", max_model_len=max_len)
    base = (record.get("base") or {}).get("rope_parameters") or {}
    theta = base.get("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta"))
    overrides = {"rope_theta": theta}
    parts = [f"{k}={v}" for k, v in DUAL_CHUNK_ENV.items()]
    parts += ["vllm", "serve", str(path), "--max-model-len", str(max_len), "--block-size", str(DUAL_CHUNK_BLOCK_SIZE),
              "--enable-chunked-prefill", "--enforce-eager", "--hf-overrides", json.dumps(overrides, separators=(",", ":"))]
    return VLLMServing(exact=True, why="", max_model_len=max_len, hf_overrides=overrides, env=dict(DUAL_CHUNK_ENV),
                       command=" ".join(shlex.quote(p) for p in parts))
