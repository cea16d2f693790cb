"""The names every reader of ``config.json`` needs, written beside transformers 5.x's ``rope_parameters``.

An export must be the same model for whoever opens the directory alone — a transformers 4.x stack (LLaMA-Factory,
axolotl and vLLM releases pinned to it) or vLLM without flags:

* **transformers 4.x** does not know ``rope_parameters``: it reads ``rope_theta``, ``rope_scaling`` (the scaling
  without the base), ``partial_rotary_factor`` (GPT-NeoX: ``rotary_pct``, and ``rotary_emb_base``, which its 4.x config
  copies over ``rope_theta``), Gemma 3's ``rope_local_base_freq``,
  and for ``longrope`` the switch length ``original_max_position_embeddings`` from the *top level* of the config
  (``_compute_longrope_parameters`` and ``longrope_frequency_update`` in 4.x's ``modeling_rope_utils.py``); Phi-3's
  4.x config accepts a ``rope_scaling`` of exactly ``type``, ``short_factor`` and ``long_factor`` and refuses any
  other (``_rope_scaling_validation``), and OLMo's, OLMo 2's (and a few others') exactly ``type`` and ``factor``,
  linear or dynamic. Its rope types are ``default``, ``linear``,
  ``dynamic``, ``yarn`` (with ``truncate`` since 4.56), ``longrope`` and ``llama3``.
* **transformers 5.x** reads ``rope_scaling`` *instead of* ``rope_parameters`` when a file has both
  (``convert_rope_params_to_dict``; Gemma 3 merges it into the ``full_attention`` entry), so the 4.x keys are
  always the same numbers as ``rope_parameters`` — :func:`legacy_keys` writes them so, and the export checks that
  transformers 5 still builds the same RoPE from the file.
* **vLLM**'s ``longrope`` takes its magnitude from ``short_mscale``/``long_mscale`` and ignores
  ``attention_factor`` (``Phi3LongRoPEScaledRotaryEmbedding``; without them it uses √(1 + ln s / ln L) of the
  served length): :func:`with_engine_keys` adds them, equal to the attention factor.

Where 4.x has no rope type computing the model, the 4.x keys name the 5.x type itself (``ropekit_<name>``, a
type 4.57 lacks): 4.x then fails loudly building the rotary embedding (``KeyError``) instead of loading another
model — Gemma 3's full-attention type too, whose 4.x config would otherwise fall back to its own defaults. Only
RoPE per layer type that 4.x cannot express (Gemma 3 with extended sliding layers or a partial rotary, other
families' per-layer RoPE) stays unreadable by 4.x without an error; the export's card says so and
``ropekit verify --engine transformers4`` fails it.
"""

from __future__ import annotations

import copy
from typing import Any

#: The rope types transformers 4.57 builds (its ``ROPE_INIT_FUNCTIONS``).
LEGACY_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")

#: Families whose 4.x config keeps RoPE per layer type as ``rope_theta`` (full attention, with ``rope_scaling``)
#: and ``rope_local_base_freq`` (sliding layers, never scaled).
_GEMMA3 = ("gemma3", "gemma3_text")

#: Families whose 4.57 config accepts a ``rope_scaling`` of exactly ``type`` and ``factor``, type ``linear`` or
#: ``dynamic``, and raises ValueError on any other (their ``_rope_scaling_validation``).
_TWO_FIELDS = ("olmo", "olmo2", "chameleon", "fuyu", "hunyuan_v1_dense", "hunyuan_v1_moe")

#: Keys 5.x keeps inside ``rope_parameters`` that 4.x reads from the top level.
_TOP_LEVEL = ("rope_theta", "partial_rotary_factor")


def with_engine_keys(rope: dict[str, Any]) -> dict[str, Any]:
    """``rope`` with vLLM's ``short_mscale``/``long_mscale`` beside a ``longrope`` attention factor (per layer type
    too); other rope types unchanged."""
    if any(isinstance(v, dict) for v in rope.values()):
        return {k: with_engine_keys(v) if isinstance(v, dict) else v for k, v in rope.items()}
    if rope.get("rope_type") == "longrope" and rope.get("attention_factor") is not None:
        factor = float(rope["attention_factor"])
        return {**rope, "short_mscale": factor, "long_mscale": factor}
    return rope


def _scaling(rope: dict[str, Any], model_type: str) -> dict[str, Any] | None:
    """4.x's ``rope_scaling``: ``rope`` without the keys 4.x reads at the top level; None for plain RoPE."""
    if rope.get("rope_type", "default") == "default":
        return None
    return {k: copy.deepcopy(v) for k, v in rope.items() if k not in _TOP_LEVEL}


def _family_names(rope: dict[str, Any], model_type: str) -> dict[str, Any]:
    """The family's own 4.x names: GPT-NeoX's 4.x config sets ``rope_theta = rotary_emb_base`` (default 10000) after
    reading the file, so a top-level ``rope_theta`` alone is overwritten (``GPTNeoXConfig.__init__`` in 4.57), and
    its rotary width is ``rotary_pct``; other families read ``partial_rotary_factor``."""
    names: dict[str, Any] = {}
    if model_type == "gpt_neox" and rope.get("rope_theta") is not None:
        names["rotary_emb_base"] = rope["rope_theta"]
    if "partial_rotary_factor" in rope:
        names["rotary_pct" if model_type == "gpt_neox" else "partial_rotary_factor"] = rope["partial_rotary_factor"]
    return names


def _yarn_factor_read_otherwise(rope: dict[str, Any], max_position_embeddings: int | None) -> str:
    """Why transformers 4.51–4.55 compute another yarn than ``rope`` says, or ``""``: their
    ``_compute_yarn_parameters`` replaces ``factor`` by ``max_position_embeddings / original_max_position_embeddings``
    whenever the latter is in ``rope_scaling`` (4.56 reads the factor as written and only warns)."""
    original = rope.get("original_max_position_embeddings")
    if rope.get("rope_type") != "yarn" or not original or not max_position_embeddings:
        return ""
    implied = max_position_embeddings / original
    if abs(implied - float(rope["factor"])) <= 1e-9 * float(rope["factor"]):
        return ""
    return (f"transformers 4.51–4.55 take yarn's factor as max_position_embeddings / original_max_position_embeddings "
            f"= {max_position_embeddings}/{original} = {implied:.6g}, not {float(rope['factor']):g} (4.56 and later read "
            "it as written): load it with 4.56 or later, or extend to a target length that is a multiple of the window")


def legacy_releases(rope: dict[str, Any]) -> tuple[str, str]:
    """``(releases, why not earlier)``: which transformers 4.x releases compute ``rope`` (an export's
    ``rope_parameters``, when :func:`legacy_keys` found no reason they do not) — ``"4.x"``, or a floor where earlier
    releases build the type but compute another model without an error, and why (``""`` for all of 4.x). YaRN:
    4.45–4.50's ``_compute_yarn_parameters`` ramps over ``config.max_position_embeddings`` (the export's extended
    window) and ignores ``original_max_position_embeddings``, so its correction range moves (4.50.3's
    ``modeling_rope_utils.py``); ``truncate`` is read from 4.56 on."""
    if any(isinstance(v, dict) for v in rope.values()):
        full = rope.get("full_attention")
        return legacy_releases(full) if isinstance(full, dict) else ("4.x", "")
    if rope.get("rope_type") != "yarn":
        return "4.x", ""
    if rope.get("truncate", True) is False:
        return "4.56 and later", "earlier releases truncate YaRN's correction range, which this one does not"
    return "4.51 and later", ("4.45–4.50 ramp YaRN over max_position_embeddings, the extended window, instead of "
                              "original_max_position_embeddings")


def legacy_keys(model_type: str, rope: dict[str, Any], max_position_embeddings: int | None = None) -> tuple[dict[str, Any], str]:
    """``(top-level keys, why)``: the transformers 4.x names of ``rope`` (an export's ``rope_parameters``) and, when
    4.x will not compute the same model from them, why in one line (``""`` when it does). ``max_position_embeddings``
    is the export's declared window (what 4.51–4.55 derive yarn's factor from)."""
    if any(isinstance(v, dict) for v in rope.values()):
        keys, why = _per_layer_type(model_type, rope)
        full = rope.get("full_attention")
        if keys and not why and isinstance(full, dict):
            why = _yarn_factor_read_otherwise(full, max_position_embeddings)
        return keys, why
    kind = rope.get("rope_type", "default")
    keys: dict[str, Any] = {"rope_theta": rope.get("rope_theta"), "rope_scaling": _scaling(rope, model_type),
                            **_family_names(rope, model_type)}
    if kind == "longrope":
        # 4.x reads the short/long switch length from the top level (else max_position_embeddings)
        keys["original_max_position_embeddings"] = rope["original_max_position_embeddings"]
        if model_type == "phi3":
            return keys, ("Phi-3's transformers 4.x config takes only type, short_factor and long_factor (no "
                          "attention_factor): it refuses this directory (ValueError); load it with transformers 5")
    if model_type in _TWO_FIELDS and kind != "default":
        if kind in ("linear", "dynamic") and float(rope.get("factor") or 1.0) > 1.0:
            keys["rope_scaling"] = {"type": kind, "factor": float(rope["factor"])}
            return keys, ""
        return keys, (f"the transformers 4.x config of {model_type} takes only a linear or dynamic rope_scaling of "
                      f"type and factor > 1: it refuses this '{kind}' directory (ValueError); load it with "
                      "transformers 5")
    if kind in LEGACY_TYPES:
        return keys, _yarn_factor_read_otherwise(rope, max_position_embeddings)
    return keys, (f"transformers 4.x has no rope type '{kind}': it refuses the directory (KeyError '{kind}'); "
                  "load it with transformers 5 or ropekit.load")


def _per_layer_type(model_type: str, rope: dict[str, Any]) -> tuple[dict[str, Any], str]:
    if model_type not in _GEMMA3 or set(rope) != {"full_attention", "sliding_attention"}:
        return {}, f"transformers 4.x has no RoPE per layer type for model type '{model_type}'"
    full, sliding = rope["full_attention"], rope["sliding_attention"]
    if sliding.get("rope_type", "default") != "default" or set(sliding) - {"rope_type", "rope_theta"}:
        return {}, ("transformers 4.x scales only Gemma 3's full-attention layers (its sliding layers take "
                    "rope_local_base_freq alone): it would load these extended sliding layers unscaled")
    if "partial_rotary_factor" in full:
        return {}, ("transformers 4.x's Gemma 3 rotates whole heads in its full-attention layers: it would load "
                    "this partial rotary unscaled")
    keys = {"rope_theta": full.get("rope_theta"), "rope_local_base_freq": sliding.get("rope_theta"),
            "rope_scaling": _scaling(full, model_type)}
    kind = full.get("rope_type", "default")
    if kind not in LEGACY_TYPES:
        # the 5.x type itself, as for one RoPE: 4.x then fails building the rotary embedding instead of loading
        # Gemma 3's defaults (θ 1e6 / 1e4, no scaling), which its config takes when no key is written
        return keys, (f"transformers 4.x has no rope type '{kind}' for Gemma 3's full-attention layers: it refuses "
                      f"the directory (KeyError '{kind}'); load it with transformers 5 or ropekit.load")
    return keys, ""
