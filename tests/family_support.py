"""Which method each model family takes, written out by hand from the families' features — the reference the
capability check (``ropekit.install.capabilities``), ``inspect`` and the README's family table are tested against.

``REFUSED[family]`` maps a method to a word its one-line refusal must contain (the feature that rules it out).
Every other (family, method) pair must install.
"""

from __future__ import annotations

FREQUENCY = ["pi", "ntk", "dynamic_ntk", "ntk_by_parts", "yarn", "dynamic_yarn", "llama3", "longrope", "abf",
             "entropy_abf", "clex"]
# re-rotate queries/keys in the rotary layout
ROTATING = ["harpe", "self_extend", "lm_infinite", "dual_chunk", "landmark"]
OWN_ATTENTION = ["self_extend", "lm_infinite", "dual_chunk", "landmark", "longlora"]  # compute attention themselves
METHODS = FREQUENCY + ["harpe", "self_extend", "lm_infinite", "dual_chunk", "longlora", "landmark"]

_interleaved = {**{m: "interleaved" for m in ROTATING}, "clex": "form of its own"}
_mla = {m: "latent attention" for m in ROTATING}
_softcap = {m: "softcap" for m in OWN_ATTENTION}
_sinks = {**{m: "sinks" for m in OWN_ATTENTION}, "clex": "form of its own"}
# frequencies that change with the length (and one RoPE for all layers) are not composed per layer type
_per_layer = {m: "per layer type" for m in ("harpe", "clex", "dynamic_ntk", "dynamic_yarn", "longrope")}
_scaled = {"harpe": "already scaled"}
# Phi-3.5's RoPE switches at its original window: LongRoPE would switch at another length, Dynamic YaRN recomputes
# at each input's length
_length = {"dynamic_ntk": "length", "clex": "length", "harpe": "length", "longrope": "another length",
           "dynamic_yarn": "each input's own length"}

REFUSED: dict[str, dict[str, str]] = {
    "llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {}, "phi3": {}, "gpt_neox": {}, "olmo2": {}, "granite": {},
    "gemma2": _softcap,
    "gemma3_text": _per_layer,
    "cohere": _interleaved,
    "gpt_oss": _sinks,
    "deepseek_v2": {**_mla, "clex": "form of its own"},  # V2's rotary returns complex numbers
    "deepseek_v3": _mla,
    # as shipped: the family's own features plus its RoPE scaling
    "llama3": _scaled,
    "qwen2.5-yarn": _scaled,
    "qwen3-yarn": _scaled,
    "phi3.5": _length,
    "phi4-mini": _length,  # Phi-3.5's switching LongRoPE on a partial rotary (three quarters of each head)
    "llama3.2": _scaled,
    "gpt-oss": {**_sinks, **_scaled},
    "deepseek-v3": {**_mla, **_scaled},
}


def applies(family: str, method: str) -> bool:
    return method not in REFUSED[family]


def pairs(methods=METHODS, families=None):
    """``(family, method)`` pairs that must install."""
    return [(f, m) for f in (families or REFUSED) for m in methods if applies(f, m)]
