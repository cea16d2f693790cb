"""Serving an exported model with vLLM exactly as ropekit computes it: which config values vLLM reads under which
names, the context length to ask for, and the command line that does both.

vLLM builds its rotary embedding from ``config.json``'s ``rope_parameters`` (``get_rope``), but not always under
transformers' meaning: its ``longrope`` ignores ``attention_factor`` (it derives the magnitude from
``max_position_embeddings`` unless ``short_mscale``/``long_mscale`` are given) and uses the long factors at every
length once the served context exceeds the original window; its ``dynamic`` computes one base for the whole cache
(Dynamic NTK frozen at factor × window tokens) instead of per input; its ``yarn`` took the magnitude as
``0.1·ln s + 1`` times its own ``attn_factor`` before release 0.32 (which reads ``attention_factor``, as transformers
does); its DeepSeek-V2/V3 attention serves every scaled rope type as its own ``deepseek_yarn``; its gpt-oss
attention (``OAIAttention`` in ``gpt_oss.py``) always builds ``yarn`` from ``factor``, the original window,
``beta_fast``/``beta_slow`` and ``truncate``, with the default magnitude; and its longrope embedding
(``Phi3LongRoPEScaledRotaryEmbedding``) supports only the half-split (NeoX) layout, not the interleaved one some
families (Cohere, GPT-J) rotate in. So an export is exact in vLLM only for the rope types below, some with
overrides that hold in releases on both sides of 0.32.

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
from ..methods.yarn import deepseek_mscale

#: Rope types vLLM computes as transformers does, from the same keys.
_SAME_MATH = ("default", "linear", "llama3")

#: Architectures (and, for a config without ``architectures``, model types) whose vLLM attention — DeepseekV2Attention
#: and DeepseekV2MLAAttention in vLLM's ``deepseek_v2.py`` — renames every rope type but ``default`` to its own
#: ``deepseek_yarn`` before it builds the rotary embedding (DeepseekScalingRotaryEmbedding).
_DEEPSEEK_YARN_ARCHITECTURES = frozenset({"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"})
_DEEPSEEK_YARN_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32"})
#: Architectures (model types) whose vLLM attention builds ``yarn`` whatever the config's rope type (gpt_oss.py).
_GPT_OSS_ARCHITECTURES = frozenset({"GptOssForCausalLM"})
_GPT_OSS_MODEL_TYPES = frozenset({"gpt_oss"})
#: Architectures vLLM rotates in the interleaved layout (``is_neox_style=False``), for exports that predate the
#: recorded layout: Cohere's (commandr.py) and GPT-J's.
_INTERLEAVED_ARCHITECTURES = frozenset({"CohereForCausalLM", "Cohere2ForCausalLM", "GPTJForCausalLM"})


def _yarn_limit(config: dict[str, Any], rope: dict[str, Any], max_len: int) -> int:
    """The longest input vLLM serves this RoPE exactly: ``max_len``, or original window × factor where a yarn below
    it ends there (vLLM's yarn cos/sin cache and its ``--max-model-len`` check stop at that product). YaRN's
    frequencies do not depend on the input's length, so below that product vLLM computes the export exactly: Qwen3
    (window 40,960) with yarn ×4 over an original 32,768 declares 163,840 and is served at 131,072, Qwen's own
    recipe. Under vLLM's DeepSeek and gpt-oss attention every scaled rope dict is served as yarn."""
    as_yarn = serves_rope_as_deepseek_yarn(config) or _is_architecture(config, _GPT_OSS_ARCHITECTURES,
                                                                        _GPT_OSS_MODEL_TYPES)
    dicts = [v for v in rope.values() if isinstance(v, dict)] or [rope]
    limit = max_len
    for d in dicts:
        original = d.get("original_max_position_embeddings")
        if original and (d.get("rope_type") == "yarn" or (as_yarn and d.get("rope_type", "default") != "default")):
            limit = min(limit, int(float(original) * float(d.get("factor") or 1.0)))
    return limit


def _yarn_magnitude(rope: dict[str, Any]) -> float:
    """The cos/sin magnitude transformers' yarn computes: ``attention_factor``, else mscale(s, mscale) /
    mscale(s, mscale_all_dim) when both are set, else 0.1·ln s + 1 (YaRN §3.4)."""
    factor = float(rope.get("factor") or 1.0)
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"])
    mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return deepseek_mscale(factor, float(mscale)) / deepseek_mscale(factor, float(mscale_all_dim))
    return deepseek_mscale(factor, 1.0)


def _yarn_overrides(rope: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``yarn`` before release 0.32 multiplies cos and sin by ``yarn_get_mscale(factor) · attn_factor``
    (``attn_factor`` 1 unless given) and reads neither ``attention_factor`` nor the mscale keys; 0.32 computes the
    magnitude as transformers does. A magnitude other than 0.1·ln s + 1 (an explicit one, DeepSeek's mscale ratio,
    NTK-by-parts' 1) is therefore also passed as ``attn_factor`` = A / (0.1·ln s + 1), which 0.32 ignores."""
    own = deepseek_mscale(float(rope.get("factor") or 1.0), 1.0)
    attention = _yarn_magnitude(rope)
    if abs(attention - own) <= 1e-12 * own:
        return rope
    return {**rope, "attn_factor": attention / own}


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
    #: Why ``max_model_len`` is shorter than the export's window, or "".
    note: str = ""


def _deepseek_yarn_overrides(rope: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The rope dict for vLLM's DeepSeek attention, which serves any scaled RoPE as its own ``deepseek_yarn``.

    That embedding rounds YaRN's ramp bounds to whole dimensions and multiplies cos/sin by
    ``mscale(s, mscale) / mscale(s, mscale_all_dim)`` (``mscale`` 1 and ``mscale_all_dim`` 0 when absent; releases
    before 0.32 also by an ``attn_factor``); the attention multiplies its softmax scale by
    ``mscale(s, mscale_all_dim)²``, as transformers' ``yarn_apply_mscale`` does — except that vLLM 0.32 names the
    rope ``deepseek_llama_scaling`` and skips that factor when ``attention_factor`` is exactly 1. transformers' yarn
    takes ``attention_factor``, else the mscale ratio when both keys are set, else 0.1·ln s + 1.

    So the served dict carries no ``attention_factor`` (nor ``attn_factor``), and, where the magnitudes differ, the
    ``mscale`` m′ with mscale(s, m′) = A · mscale(s, mscale_all_dim): every vLLM release then computes A, and
    ``mscale_all_dim`` — the softmax scale — is left as it is."""
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return rope, ""
    if kind != "yarn":
        return None, (f"vLLM's DeepSeek-V2/V3 attention serves every scaled RoPE as its deepseek_yarn, so this "
                      f"'{kind}' RoPE would be served as YaRN: extend with yarn to serve the model with vLLM")
    if rope.get("truncate") is False:
        return None, ("vLLM's deepseek_yarn always rounds YaRN's ramp bounds to whole dimensions and this export "
                      "does not (truncate: false): leave truncate at its default to serve it with vLLM")
    factor = float(rope.get("factor") or 1.0)
    mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    attention = _yarn_magnitude(rope)
    divisor = deepseek_mscale(factor, 0.0 if mscale_all_dim is None else float(mscale_all_dim))
    served = {k: v for k, v in rope.items() if k not in ("attention_factor", "attn_factor")}
    own = deepseek_mscale(factor, 1.0 if mscale is None else float(mscale)) / divisor
    if abs(own - attention) > 1e-12 * attention:
        if factor <= 1.0:
            return None, f"vLLM's deepseek_yarn has no magnitude at factor {factor:g} and this export's is {attention:.6g}"
        served["mscale"] = (attention * divisor - 1.0) / (0.1 * math.log(factor))
    return served, ""


def _gpt_oss_overrides(rope: dict[str, Any], max_len: int) -> tuple[dict[str, Any] | None, str]:
    """The rope dict for vLLM's gpt-oss attention, which builds ``yarn`` from ``factor``,
    ``original_max_position_embeddings``, ``beta_fast``, ``beta_slow`` and ``truncate`` only (KeyError on a missing
    one), with the magnitude 0.1·ln s + 1. Plain RoPE is YaRN at factor 1 (both ramps then give θ_i, magnitude 1)."""
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return {**rope, "rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": max_len,
                "beta_fast": 32.0, "beta_slow": 1.0}, ""
    if kind != "yarn":
        return None, (f"vLLM's gpt-oss attention builds YaRN from factor, window and betas whatever the rope type, so "
                      f"this '{kind}' RoPE would be served as YaRN: only a single yarn (default attention factor) is "
                      "served exactly; serve this export with transformers")
    if not rope.get("original_max_position_embeddings"):
        return None, "vLLM's gpt-oss attention needs original_max_position_embeddings, which this yarn export lacks"
    factor, attention = float(rope.get("factor") or 1.0), _yarn_magnitude(rope)
    own = deepseek_mscale(factor, 1.0)
    if abs(attention - own) > 1e-12 * own:
        return None, (f"vLLM's gpt-oss attention takes no attention factor (its magnitude is 0.1·ln s + 1 = {own:.6g}) "
                      f"and this export's is {attention:.6g}: extend with yarn's default attention factor")
    # transformers' (and ropekit's) yarn defaults, written out: vLLM reads them without a default
    served = {"beta_fast": 32.0, "beta_slow": 1.0, **rope}
    return {k: v for k, v in served.items() if k not in ("attention_factor", "attn_factor")}, ""


def _rope_overrides(rope: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """``(the rope dict vLLM should read, "")`` or ``(None, why vLLM would compute something else)``."""
    kind = rope.get("rope_type", "default")
    if kind in _SAME_MATH:
        return rope, ""
    if kind == "yarn":  # served up to original window × factor, the limit vllm_serving caps the length at
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
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModelLoadError(f"'{config_path}' cannot be read as JSON ({type(e).__name__}: {str(e).splitlines()[0]})",
                             "pass a directory written by `ropekit extend`, or write it again") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"'{config_path}' is not a JSON object", "pass a directory written by `ropekit extend`")
    rope = config.get("rope_parameters") or {"rope_type": "default"}
    window = int(config.get("max_position_embeddings") or 0)
    max_len = _yarn_limit(config, rope, window) if window else window
    note = (f"vLLM's yarn holds cos/sin for original window × factor = {max_len} positions, fewer than this "
            f"export's {window}: served exactly up to {max_len} tokens") if max_len < window else ""
    engine_key = next((key for key in engine_keys() if config.get(key) is not None), None)
    if engine_key is not None:
        return _engine_serving(path, config, window, engine_key)
    refusal = ((config.get("ropekit") or {}).get("export") or {}).get("vllm_refusal")
    if refusal:  # the export knew why vLLM cannot compute the method itself (the method's vllm_config said)
        return VLLMServing(exact=False, why=refusal, max_model_len=window)
    if any(isinstance(v, dict) for v in rope.values()):  # RoPE per layer type: each one must be exact
        served, whys = {}, []
        for key, value in rope.items():
            if isinstance(value, dict):
                value, why = _rope_overrides(value)
                whys.append(why)
            served[key] = value
        why = next((w for w in whys if w), "")
        served = None if why else served
    elif serves_rope_as_deepseek_yarn(config):
        served, why = _deepseek_yarn_overrides(rope)
    elif _is_architecture(config, _GPT_OSS_ARCHITECTURES, _GPT_OSS_MODEL_TYPES):
        served, why = _gpt_oss_overrides(rope, max_len)
    else:
        served, why = _rope_overrides(rope)
    if served is not None and _rotates_interleaved(config) and any(
            r.get("rope_type") == "longrope" for r in ([served] + [v for v in served.values() if isinstance(v, dict)])):
        served, why = None, ("vLLM's longrope supports only the half-split (NeoX) rotary layout and this family "
                             "rotates interleaved (adjacent channels pair up): serve it with transformers, or extend "
                             "with a method vLLM computes as linear, llama3 or yarn")
    if served is None:
        return VLLMServing(exact=False, why=why, max_model_len=window)
    overrides = {} if served == rope else {"rope_parameters": served}
    parts = ["vllm", "serve", str(path), "--max-model-len", str(max_len)]
    if overrides:
        parts += ["--hf-overrides", json.dumps(overrides, separators=(",", ":"))]
    return VLLMServing(exact=True, why="", max_model_len=max_len, hf_overrides=overrides,
                       command=" ".join(shlex.quote(p) for p in parts), note=note)


def _is_architecture(config: dict[str, Any], architectures: frozenset[str], model_types: frozenset[str]) -> bool:
    """Whether vLLM builds this model with one of ``architectures`` (as vLLM picks the model class; by
    ``model_type`` when a config names none)."""
    names = config.get("architectures") or []
    if names:
        return any(name in architectures for name in names)
    return config.get("model_type") in model_types


def serves_rope_as_deepseek_yarn(config: dict[str, Any]) -> bool:
    """Whether vLLM builds this model with its DeepSeek-V2/V3 attention."""
    return _is_architecture(config, _DEEPSEEK_YARN_ARCHITECTURES, _DEEPSEEK_YARN_MODEL_TYPES)


def _rotates_interleaved(config: dict[str, Any]) -> bool:
    """Whether the model pairs adjacent channels (recorded by the export; else known from its architecture)."""
    layout = ((config.get("ropekit") or {}).get("export") or {}).get("rotary_layout")
    if layout is not None:
        return layout == "interleaved"
    return any(name in _INTERLEAVED_ARCHITECTURES for name in config.get("architectures") or [])


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
