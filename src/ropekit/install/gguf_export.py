"""Writing an extended Llama, Mistral, Qwen2 or Qwen3 model as a GGUF file that llama.cpp runs as ropekit computes it.

The file is written with the PyPI ``gguf`` package (``GGUFWriter``; ``gguf.quants`` for bf16 and q8_0). What
llama.cpp does with the RoPE keys of ``general.architecture = llama`` (read from its source, ``src/llama-model.cpp``,
``src/llama-context.cpp``, ``src/models/llama.cpp`` and ``ggml-cpu/ops.cpp``):

* ``llama.rope.freq_base`` b and ``llama.rope.dimension_count`` d give ``θ_i = b^(−2i/d)``;
* a tensor ``rope_freqs.weight`` (one float per rotary pair) divides ``θ_i`` by its entry — for the Llama
  architecture whatever the scaling type, unless the type is ``longrope``;
* ``llama.rope.scaling.type`` ``linear`` with ``.factor`` s multiplies every frequency by 1/s; ``none`` never
  scales;
* ``yarn`` mixes ``θ_i/s`` and ``θ_i`` with a ramp between the correction dimensions of β_fast = 32 and
  β_slow = 1 (the Llama architecture does not read ``rope.scaling.yarn_beta_*`` from the file: those are
  llama.cpp's context defaults) over ``.original_context_length``, floored/ceiled in float32, and multiplies
  cos/sin by ``(0.1·ln s + 1) · rope.scaling.attn_factor``: the context replaces any ``yarn_attn_factor`` by
  ``0.1·ln s + 1`` and cancels the kernel's own ``1 + 0.1·ln(1/freq_scale)``, then multiplies by
  ``rope.scaling.attn_factor`` (llama.cpp PR 17945);
* with any other type, cos/sin are multiplied by ``rope.scaling.attn_factor`` alone.

So every method whose result at inference is one static set of frequencies and one attention factor is written
exactly: PI as ``linear``, NTK and ABF as a new ``freq_base``, YaRN with llama.cpp's own betas as ``yarn`` (with
``attn_factor = A/(0.1·ln s + 1)`` for ropekit's attention factor A), and everything else — NTK-by-parts with any
ramp, YaRN with other betas or ``truncate=false``, llama3, LongRoPE with one factor set, Dynamic NTK and CLEX
frozen at a length, compositions on pre-scaled models — as ``rope_freqs = θ_i/θ'_i`` with the model's own base.
Each chosen form is checked numerically against the frequencies ropekit's installed model uses (llama.cpp's
computation replayed, float32 where llama.cpp rounds decisions in float32); a form that does not reproduce them
falls back to ``rope_freqs``. Methods that change attention itself, or whose frequencies follow the input length
with no freeze length, are refused in one line naming the method and the reason.

q and k projections are permuted from transformers' rotate-half layout (pairs ``(j, j + d/2)``) to ggml's
adjacent-pair layout (pairs ``(2j, 2j + 1)``) head by head, as llama.cpp's converter does for ``LLM_ARCH_LLAMA``.

Qwen2 and Qwen3 models are written as llama.cpp's ``qwen2`` / ``qwen3`` architectures (``src/models/qwen2.cpp``:
q/k/v biases; ``src/models/qwen3.cpp``: RMS norms of q and k per head before RoPE). Both rotate with
``LLAMA_ROPE_TYPE_NEOX`` — transformers' own rotate-half pairs — so q/k are written unpermuted, as the converter's
``Qwen2Model`` does; both read the same ``freq_base``/``linear``/``yarn`` keys through the same context code, but
pass ``nullptr`` as ``ggml_rope_ext``'s frequency factors and list no ``rope_freqs`` tensor: a form that needs it is
refused there in one line instead of falling back.
The file is written to a temporary name beside the target and renamed (:func:`ropekit.runtime.atomic_file`): an
error or a kill leaves nothing behind but a hidden ``.part`` file, which the next write removes.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.base_rope import base_frequencies, length_dependence
from ..core.rope import pair_exponents
from ..errors import InvalidParameterError, RopekitError, UnsupportedModelError
from ..methods import get_method
from ..methods.base import CHANGES, LLAMACPP_YARN_BETAS
from ..runtime.atomic import atomic_file, check_target
from .freeze import check_freeze_length
from .gguf_vocab import GGUFVocab, gguf_vocabulary
from .model_rope import base_info, installed, rotary_modules, text_config

#: GGUF weight types ``write_gguf`` writes.
OUTTYPES = ("f32", "f16", "bf16", "q8_0")

#: transformers ``model_type`` → the GGUF architecture it is written as. Mistral's decoder is Llama's (the same
#: weights, norms and RoPE; llama.cpp's converter writes ``MistralForCausalLM`` as ``llama``) unless its sliding
#: window is on, which llama.cpp's Llama graph does not apply. Qwen2 (biased q/k/v) and Qwen3 (RMS-normed q and k
#: per head) have llama.cpp architectures of their own.
ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

#: GGUF architectures whose llama.cpp graph reads ``rope_freqs.weight`` (per-pair divisors). llama.cpp's
#: ``src/models/qwen2.cpp`` and ``src/models/qwen3.cpp`` pass ``nullptr`` as the frequency factors of
#: ``ggml_rope_ext`` (and their tensor lists create no ``rope_freqs``): there only the named forms exist.
PER_PAIR_ARCHITECTURES = ("llama",)

#: GGUF architectures whose q/k rows are permuted to ggml's adjacent pairs (``LLAMA_ROPE_TYPE_NORM``); the others
#: rotate in transformers' own rotate-half layout (``LLAMA_ROPE_TYPE_NEOX``), and llama.cpp's converter copies
#: their q/k as they are.
ADJACENT_PAIR_ARCHITECTURES = ("llama",)

#: llama.cpp's YaRN correction betas for the Llama architecture (context defaults; not read from the file).
LLAMACPP_BETA_FAST, LLAMACPP_BETA_SLOW = LLAMACPP_YARN_BETAS

#: Relative agreement a named RoPE form must reach with the installed frequencies (float32 frequencies carry
#: about 6e-8 relative rounding); otherwise the exact per-pair form is written.
_FORM_RTOL = 2e-6

#: Attention-side changes llama.cpp's graph has no place for.
_ALLOWED_CHANGES = {"frequencies", "length_dependent", "attention_factor", "weights"}


@dataclass
class GGUFRope:
    """The RoPE keys a GGUF gets, and what they stand for.

    ``form``: ``none`` (plain RoPE with ``freq_base``), ``linear``, ``yarn`` or ``rope_freqs`` (plain base with
    a per-pair divisor tensor). ``architecture``: the GGUF architecture (``llama``, ``qwen2``, ``qwen3``). ``inv_freq``/``attention_factor``: the frequencies and cos/sin multiplier
    ropekit's installed model uses (what the keys must reproduce). ``frozen_at``: the input length the
    frequencies were taken at, for a length-dependent method.
    """

    form: str
    scaling_type: str
    architecture: str
    freq_base: float
    rotary_dim: int
    context_length: int
    inv_freq: np.ndarray
    attention_factor: float
    factor: float | None = None
    original_context_length: int | None = None
    attn_factor: float = 1.0
    rope_freqs: np.ndarray | None = None
    frozen_at: int | None = None
    method: str | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """One line: the keys written."""
        if self.form == "linear":
            text = f"rope.scaling.type linear, factor {self.factor:g}, freq_base {self.freq_base:g}"
        elif self.form == "yarn":
            text = (f"rope.scaling.type yarn, factor {self.factor:g}, original_context_length "
                    f"{self.original_context_length}, freq_base {self.freq_base:g}")
        elif self.form == "rope_freqs":
            text = f"rope_freqs.weight (θ_i/θ'_i per pair), freq_base {self.freq_base:g}"
        else:
            text = f"freq_base {self.freq_base:g}"
        if self.attn_factor != 1.0 or self.form == "yarn":
            text += f", rope.scaling.attn_factor {self.attn_factor:.6g}"
        if self.frozen_at is not None:
            text += f" (frequencies as at {self.frozen_at} tokens)"
        return text


# ------------------------------------------------------------------------------------------------------------
# What llama.cpp computes from the keys
# ------------------------------------------------------------------------------------------------------------


def _f32(x: float) -> np.float32:
    return np.float32(x)


def llamacpp_yarn_corr_dims(rotary_dim: int, original: int, base: float, beta_fast: float = LLAMACPP_BETA_FAST,
                            beta_slow: float = LLAMACPP_BETA_SLOW) -> tuple[float, float]:
    """ggml's YaRN correction range, in float32 as ggml computes it: ``floor``/``ceil`` of
    ``d·ln(C/(2π β))/(2 ln b)`` for β_fast and β_slow, clipped to ``[0, d − 1]``."""
    def dim(rotations: float) -> np.float32:
        inner = _f32(original) / (_f32(rotations) * _f32(2.0) * _f32(math.pi))
        return _f32(rotary_dim) * np.log(inner, dtype=np.float32) / (_f32(2.0) * np.log(_f32(base), dtype=np.float32))

    start, end = math.floor(float(dim(beta_fast))), math.ceil(float(dim(beta_slow)))
    return float(max(0, start)), float(min(rotary_dim - 1, end))


def llamacpp_frequencies(rope: GGUFRope) -> tuple[np.ndarray, float]:
    """``(θ'_i, cos/sin multiplier)`` llama.cpp derives from ``rope``'s keys (float64, except the YaRN correction
    range, whose floor/ceil llama.cpp takes in float32)."""
    d = rope.rotary_dim

    def stored(value) -> float:  # the file holds float32 numbers
        return float(_f32(value))

    theta = stored(rope.freq_base) ** (-pair_exponents(d).numpy())
    if rope.rope_freqs is not None:
        theta = theta / rope.rope_freqs.astype(np.float64)
    if rope.scaling_type == "linear":
        return theta / stored(rope.factor), stored(rope.attn_factor)
    if rope.scaling_type == "yarn":
        s = stored(rope.factor)
        low, high = llamacpp_yarn_corr_dims(d, int(rope.original_context_length), rope.freq_base)
        pairs = np.arange(d // 2, dtype=np.float64)
        ramp = 1.0 - np.clip((pairs - low) / max(0.001, high - low), 0.0, 1.0)
        mixed = (theta / s) * (1.0 - ramp) + theta * ramp
        return mixed, (0.1 * math.log(s) + 1.0) * stored(rope.attn_factor)
    return theta, stored(rope.attn_factor)


def _reproduces(rope: GGUFRope) -> bool:
    theta, factor = llamacpp_frequencies(rope)
    close = np.allclose(theta, rope.inv_freq, rtol=_FORM_RTOL, atol=0.0)
    return bool(close) and abs(factor - rope.attention_factor) <= 1e-6 * abs(rope.attention_factor)


# ------------------------------------------------------------------------------------------------------------
# Choosing the keys
# ------------------------------------------------------------------------------------------------------------


def _refuse_a_sliding_window_within(config, context: int) -> None:
    """transformers' Mistral applies ``sliding_window`` at every length past it; llama.cpp's Llama graph never does.
    The file declares ``context`` tokens (a frozen length may lie past ``max_position_embeddings``, which Dynamic
    NTK leaves at the original window), so a window shorter than that would make the two models differ."""
    window = getattr(config, "sliding_window", None)
    if getattr(config, "model_type", None) == "mistral" and window is not None and int(window) < int(context):
        raise UnsupportedModelError(
            f"this Mistral model attends within a sliding window of {window} tokens, shorter than the {context} "
            "tokens the GGUF would declare, and llama.cpp's Llama graph does not apply it",
            "export a Mistral model without a sliding window (v0.2 and later), or a freeze length within the window")


def _check_architecture(model) -> tuple[Any, str]:
    """``(text config, GGUF architecture)``, or a one-line refusal of what llama.cpp's graph for it does not do."""
    config = text_config(model)
    model_type = getattr(config, "model_type", "unknown")
    if model_type not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF export writes Llama, Mistral, Qwen2 and Qwen3 models; this model's architecture is "
            f"'{model_type}'",
            "export one of those (e.g. tiny or smollm2), or serve this one with vLLM or transformers")
    arch = ARCHITECTURES[model_type]
    window = getattr(config, "sliding_window", None)
    if arch in ("qwen2", "qwen3"):
        # transformers applies the window where layer_types says so (use_sliding_window fills it in); llama.cpp's
        # qwen2/qwen3 graphs attend to the whole context
        sliding = "sliding_attention" in (getattr(config, "layer_types", None) or ())
        if getattr(config, "use_sliding_window", False) or sliding:
            raise UnsupportedModelError(
                f"this {model_type} model attends within a sliding window ({window} tokens), which llama.cpp's "
                f"{arch} graph does not apply", "export it with use_sliding_window false, or serve it with vLLM")
    if arch == "qwen3" and getattr(config, "attention_bias", False):
        raise UnsupportedModelError("this qwen3 model has q/k/v/o biases (attention_bias true), which llama.cpp's "
                                    "qwen3 graph does not add", "serve it with vLLM or transformers")
    return config, arch


#: Why an attention-side change has no place in llama.cpp's llama, qwen2 and qwen3 graphs, per :data:`ropekit.methods.base.CHANGES` key.
_WHY_NOT = {
    "frequencies_per_head": "it rotates each attention head with its own RoPE base",
    "logit_scale_per_position": "it scales attention logits by the query position",
    "attention_pattern": "it changes which keys a query sees, or at which relative positions",
}


def _refuse_attention_side(m) -> None:
    if m.frequencies_only:  # LongLoRA's S²-Attn is training-only: at inference it is its frequencies
        return
    other = next((c for c in m.changes if c not in _ALLOWED_CHANGES), "")
    why = _WHY_NOT.get(other, f"it changes {CHANGES.get(other, other)}")
    raise UnsupportedModelError(
        f"{m.name} cannot be written as a GGUF: {why}, and llama.cpp's graphs apply only RoPE frequencies and "
        "one attention factor", "serve it with ropekit itself (ropekit.load), or export a frequency method")


def _installed_frequencies(model, m, info, params, freeze_length: int | None, original: int):
    """``(θ', attention factor, frozen_at)`` of an installed method, or a one-line refusal."""
    kind, length = m.length_dependence(info, params)
    rotary = rotary_modules(model)[0][2]
    if freeze_length is not None:
        check_freeze_length(model, m, info, params, freeze_length)
        at = int(freeze_length)
    elif kind == "static":
        at = None
    elif kind == "continuous" and length is not None and length > original:
        at = int(length)  # frozen below `length` (LCEG's Dynamic NTK with trained_length): one set up to it
    else:
        what = {"switch": f"switch to another set past {length} tokens (llama.cpp picks a set from the configured "
                          "context size, not the input length)",
                "continuous": f"are recomputed from the input length past {length} tokens",
                "per_input": f"follow each input's length past {length} tokens"}.get(kind, "depend on the input length")
        raise UnsupportedModelError(
            f"{m.name} cannot be written as a GGUF: its frequencies {what}, and a GGUF holds one set",
            "pass --freeze-length N to write them as they are at N tokens")
    inv_freq, attention_factor = m.frequencies_at(rotary, at, info.layer_type)
    return inv_freq, float(attention_factor), at


def _base_frequencies(info, freeze_length: int | None):
    """The un-extended model's own RoPE, frozen at ``freeze_length`` when it depends on the length."""
    kind, length = length_dependence(info)
    if kind != "static" and freeze_length is None:
        raise UnsupportedModelError(
            f"this model's own RoPE ('{info.rope_type}') depends on the input length past {length} tokens, and a "
            "GGUF holds one set of frequencies", "pass --freeze-length N to write them as they are at N tokens")
    if kind == "static" and freeze_length is not None and freeze_length > info.window:
        # the frequencies are the same at every length: the file would only declare a context past the window
        raise InvalidParameterError(
            f"freeze_length {freeze_length} changes nothing for this model's own RoPE ('{info.rope_type}'): its "
            f"frequencies do not depend on the input length, and its window is {info.window} tokens",
            "leave the freeze length out (--freeze-length, or freeze_length in Python)")
    inv_freq, attention_factor = base_frequencies(info, freeze_length)
    return inv_freq, float(attention_factor), freeze_length


def gguf_rope(model, freeze_length: int | None = None) -> GGUFRope:
    """The RoPE keys that make llama.cpp compute ``model``'s installed frequencies and attention factor.

    Raises a one-line :class:`~ropekit.errors.RopekitError` for a model of another architecture (:data:`ARCHITECTURES`),
    frequencies only the per-pair form holds on an architecture whose graph does not read it, a method
    that changes attention itself, and length-dependent frequencies without ``freeze_length`` (Dynamic NTK with
    ``trained_length`` above the window is frozen there by itself).
    """
    if freeze_length is not None and (isinstance(freeze_length, bool) or not isinstance(freeze_length, int)
                                      or freeze_length < 1):
        raise InvalidParameterError(f"freeze_length must be a positive number of tokens, got {freeze_length!r}",
                                    "pass e.g. --freeze-length 16384")
    config, arch = _check_architecture(model)
    record = installed(model)
    info = base_info(config)
    if info.rotary_dim != info.head_dim:
        raise UnsupportedModelError(
            f"this model rotates {info.rotary_dim} of {info.head_dim} channels per head; llama.cpp's {arch} "
            "architecture rotates whole heads", "export a model with full rotary heads")
    window = int(config.max_position_embeddings)
    method, params, m = None, {}, None
    if record:
        m = get_method(record["method"])
        _refuse_attention_side(m)
        params = dict(record["params"])
        per_position = m.position_dependent_rotation(params)
        if per_position:
            raise UnsupportedModelError(f"{m.name} cannot be written as a GGUF: {per_position}",
                                        "search or install it with start_tokens 0, or serve it with ropekit itself")
        method = m.name
        original = int(record["base"]["max_position_embeddings"])
        inv_freq, attention_factor, frozen = _installed_frequencies(model, m, info, params, freeze_length, original)
    else:
        inv_freq, attention_factor, frozen = _base_frequencies(info, freeze_length)
    theta = inv_freq.detach().to(torch.float64).cpu().numpy()
    context = frozen if frozen is not None else window
    _refuse_a_sliding_window_within(config, context)
    common = {"architecture": arch, "rotary_dim": info.rotary_dim, "context_length": int(context), "inv_freq": theta,
              "attention_factor": attention_factor, "frozen_at": frozen, "method": method, "params": params}

    for candidate in _named_forms(info, m, params, attention_factor, frozen, common):
        if _reproduces(candidate):
            return candidate
    if arch not in PER_PAIR_ARCHITECTURES:
        for candidate in _fitted_forms(info, theta, original if record else info.window, attention_factor, common):
            if _reproduces(candidate):
                return candidate
        what = method or f"this model's own RoPE ('{info.rope_type}')"
        raise UnsupportedModelError(
            f"{what} cannot be written as a {arch} GGUF: its frequencies are none of llama.cpp's linear, yarn "
            f"(betas 32/1) or freq_base forms, and llama.cpp's {arch} graph does not read per-pair rope_freqs",
            "export PI, NTK, ABF or YaRN with the default betas, or serve it with vLLM or transformers")
    base = float(_f32(info.rope_theta))  # the divisors are relative to the base as the file stores it
    divisor = (base ** (-pair_exponents(info.rotary_dim).numpy())) / theta
    exact = GGUFRope(form="rope_freqs", scaling_type="none", freq_base=base, attn_factor=attention_factor,
                     rope_freqs=divisor.astype(np.float32), **common)
    if not _reproduces(exact):  # cannot happen for finite positive frequencies; kept as a guard
        raise UnsupportedModelError(f"the installed frequencies of {method or 'this model'} cannot be written as "
                                    "a GGUF rope_freqs tensor", "report this as a bug")
    return exact


def _named_forms(info, m, params: dict[str, Any], attention_factor: float, frozen, common):
    """llama.cpp's own RoPE keys for the installation, when they may be the same math (checked by the caller): the
    base model's by its transformers rope type, an installed method's from its ``gguf_rope`` hook."""
    plain = not info.is_scaled
    if m is None:
        rope = info.rope_parameters or {}
        if plain:
            yield GGUFRope(form="none", scaling_type="none", freq_base=info.rope_theta,
                           attn_factor=attention_factor, **common)
        elif info.rope_type == "linear":
            yield GGUFRope(form="linear", scaling_type="linear", freq_base=info.rope_theta,
                           factor=float(rope["factor"]), attn_factor=attention_factor, **common)
        elif info.rope_type == "yarn" and rope.get("beta_fast", 32.0) == LLAMACPP_BETA_FAST \
                and rope.get("beta_slow", 1.0) == LLAMACPP_BETA_SLOW and rope.get("truncate", True):
            yield _yarn_form(info.rope_theta, float(rope["factor"]), int(rope.get("original_max_position_embeddings")
                             or info.window), attention_factor, common)
        return
    if not plain:
        return  # compositions on a pre-scaled base: the per-pair form
    keys = m.gguf_rope(info, params)
    if keys is None:
        return
    if keys.scaling_type == "yarn":
        yield _yarn_form(keys.freq_base, keys.factor, keys.original_context_length, attention_factor, common)
    else:
        yield GGUFRope(form=keys.scaling_type, scaling_type=keys.scaling_type, freq_base=keys.freq_base,
                       factor=keys.factor, attn_factor=attention_factor, **common)


def _fitted_forms(info, theta: np.ndarray, original: int, attention_factor: float, common):
    """llama.cpp's forms read off the installed frequencies themselves, for graphs without per-pair ``rope_freqs``
    (qwen2, qwen3), where a method without a ``gguf_rope`` hook or a composition may still be one of them:

    * ``θ'_i = b'^(−2i/d) / s`` — RoPE at another base (frozen Dynamic NTK: b' = b·(s·L/C − (s − 1))^(d/(d−2))),
      divided by one factor (PI on a ``linear`` base): ``log θ'_i`` is linear in ``2i/d``, slope ``−log b'`` and
      intercept ``−log s``, fitted by least squares over every pair (one pair would amplify float32 rounding by d/2);
    * YaRN with llama.cpp's betas 32/1 over the base model's frequencies and window ``original`` (NTK-by-parts with
      the code ramp, ``ramp='dim'``): its lowest pair is divided by the whole factor, ``s = b^(−(d−2)/d) / θ'_last``.

    Each candidate is only a guess; the caller keeps it only where llama.cpp's own arithmetic reproduces every
    frequency and the attention factor (:func:`_reproduces`)."""
    exponents = pair_exponents(info.rotary_dim).numpy().astype(np.float64)
    if len(theta) > 1:
        slope, intercept = np.polyfit(exponents, np.log(theta), 1)
        base, fitted = math.exp(-slope), math.exp(-intercept)
        for factor in _readable(fitted):
            if factor == 1.0:
                yield GGUFRope(form="none", scaling_type="none", freq_base=base, attn_factor=attention_factor, **common)
            else:
                yield GGUFRope(form="linear", scaling_type="linear", freq_base=base, factor=factor,
                               attn_factor=attention_factor, **common)
    fitted = float(_f32(info.rope_theta)) ** (-exponents[-1]) / theta[-1]
    for factor in _readable(fitted) if fitted > 1.0 else ():
        yield _yarn_form(info.rope_theta, factor, int(original), attention_factor, common)


def _readable(value: float) -> list[float]:
    """A fitted factor as a reader would write it (six significant digits: 2.0, not 1.9999999), then as fitted."""
    short = float(f"{value:.6g}")
    return [short] if short == value else [short, value]


def _yarn_form(base: float, factor: float, original: int, attention_factor: float, common) -> GGUFRope:
    # llama.cpp multiplies cos/sin by (0.1·ln s + 1)·attn_factor: attn_factor carries the rest of ropekit's factor
    return GGUFRope(form="yarn", scaling_type="yarn", freq_base=base, factor=factor,
                    original_context_length=original, attn_factor=attention_factor / (0.1 * math.log(factor) + 1.0),
                    **common)


# ------------------------------------------------------------------------------------------------------------
# Tensors
# ------------------------------------------------------------------------------------------------------------


def rotate_half_to_adjacent(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Rows of a q or k projection (``n_heads`` heads of ``d`` rows each, or a bias) reordered from the rotate-half
    layout — channel ``j`` pairs with ``j + d/2`` — to ggml's adjacent layout, where they are rows ``2j, 2j+1``."""
    rows = weight.shape[0]
    d = rows // n_heads
    order = np.empty(rows, dtype=np.int64)
    for h in range(n_heads):
        first = h * d
        order[first:first + d:2] = first + np.arange(d // 2)
        order[first + 1:first + d:2] = first + d // 2 + np.arange(d // 2)
    return weight[order]


def _tensor_for(name: str, data: np.ndarray, outtype: str):
    """``(array, raw_dtype)`` of one tensor in ``outtype``: 1-D tensors stay float32 (llama.cpp's converter does the
    same); q8_0 needs rows that are whole 32-value blocks, else the tensor is written f16."""
    import gguf

    data = np.ascontiguousarray(data, dtype=np.float32)
    if data.ndim < 2 or outtype == "f32":
        return data, None
    if outtype == "f16":
        return data.astype(np.float16), None
    if outtype == "bf16":
        return gguf.quants.quantize(data, gguf.GGMLQuantizationType.BF16), gguf.GGMLQuantizationType.BF16
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]
    if data.shape[-1] % block:
        return data.astype(np.float16), None
    return gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0


def _weights(model, config, arch: str) -> list[tuple[str, np.ndarray, int | None]]:
    """``(gguf name, float32 array, heads to permute for)`` for every weight of GGUF architecture ``arch``, or a
    one-line refusal."""
    import gguf

    layers = int(config.num_hidden_layers)
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), layers)
    permuted = arch in ADJACENT_PAIR_ARCHITECTURES
    heads, kv_heads = int(config.num_attention_heads), int(getattr(config, "num_key_value_heads", None) or
                                                          config.num_attention_heads)
    state = model.state_dict()
    embeddings, head = state.get("model.embed_tokens.weight"), state.get("lm_head.weight")
    # tied as transformers runs it: a config saying tied over a checkpoint with two different matrices is loaded
    # untied (transformers warns and keeps both), and then output.weight must be written
    tied = (bool(getattr(config, "tie_word_embeddings", False)) and embeddings is not None and head is not None
            and torch.equal(embeddings, head))
    out = []
    for key, tensor in state.items():
        if key == "lm_head.weight" and tied:
            continue  # llama.cpp's llama/qwen2/qwen3 loaders use token_embd when output.weight is absent
        if key.endswith("inv_freq") or "rotary_emb" in key:
            continue
        found = names.get_type_and_name(key, try_suffixes=(".weight", ".bias"))
        if found is None:
            raise UnsupportedModelError(f"weight '{key}' has no GGUF tensor of the {arch} architecture",
                                        "export the plain model (a method that adds weights cannot go to llama.cpp)")
        kind, gguf_name = found
        permute = None if not permuted else heads if kind == gguf.MODEL_TENSOR.ATTN_Q else kv_heads if kind == gguf.MODEL_TENSOR.ATTN_K else None
        out.append((gguf_name, tensor.detach().to(torch.float32).cpu().numpy(), permute))
    return out


# ------------------------------------------------------------------------------------------------------------
# Tokenizer
# ------------------------------------------------------------------------------------------------------------


def _vocab_from_gguf(path: Path, vocab_size: int) -> GGUFVocab:
    """Every ``tokenizer.*`` key of a GGUF (the model's own vocabulary as llama.cpp's converter wrote it)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    keys = []
    for name, fld in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        main = fld.types[0]
        sub = fld.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        value = fld.contents()
        if main == gguf.GGUFValueType.ARRAY and sub != gguf.GGUFValueType.STRING:
            value = [v.item() if hasattr(v, "item") else v for v in value]
        keys.append((name, value, main, sub))
    tokens = next((v for k, v, _, _ in keys if k == "tokenizer.ggml.tokens"), None)
    if tokens is None:
        raise UnsupportedModelError(f"GGUF '{path}' has no tokenizer.ggml.tokens", "pass a GGUF with a vocabulary")
    if len(tokens) != vocab_size:
        raise UnsupportedModelError(f"GGUF '{path}' has {len(tokens)} tokens, the model {vocab_size}",
                                    "pass the GGUF the model was loaded from")
    return GGUFVocab(source=f"copied from {path.name}", keys=keys)


# ------------------------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------------------------


def saved_freeze_length(directory: str | Path, given: int | None = None) -> int | None:
    """The freeze length a directory was saved with (``save_pretrained(…, freeze_length=N)``, recorded under
    ``ropekit.export`` in ``config.json``), or ``given`` when it was not frozen. A frozen directory holds the
    frequencies as they were at that length (``ropekit.load`` gives them back as they are, as transformers does), so
    a GGUF of it is written at the same length, and ``given`` another length is refused in one line: the file would
    declare that length with the frequencies of the saved one."""
    try:
        saved = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return given
    value = ((saved.get("ropekit") or {}).get("export") or {}).get("freeze_length") if isinstance(saved, dict) else None
    if not value:
        return given
    if given is not None and int(given) != int(value):
        raise InvalidParameterError(
            f"'{directory}' was saved with its frequencies frozen at {int(value)} tokens; --freeze-length {given} "
            "would declare that length with those frequencies",
            f"leave --freeze-length out, or extend the original model again with --freeze-length {given}")
    return int(value)

_FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}


def write_gguf(model, tokenizer, path: str | Path, *, outtype: str = "f16", freeze_length: int | None = None,
               tokenizer_gguf: str | Path | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Write ``model`` (a transformers Llama, Mistral, Qwen2 or Qwen3, extended by ropekit or not) to the GGUF file ``path``.

    ``outtype``: f32, f16, bf16 or q8_0 for the 2-D weights (norms and ``rope_freqs`` stay f32).
    ``freeze_length``: write a length-dependent method's frequencies as they are at that many tokens.
    ``tokenizer_gguf``: copy the ``tokenizer.*`` keys of that GGUF (the file the model was loaded from) instead of
    converting ``tokenizer``. Everything that can be refused is checked before the file is opened; the file is
    written under a temporary name in the same directory and renamed. Returns a report (path, outtype, the RoPE
    keys, the vocabulary).
    """
    import gguf

    if outtype not in OUTTYPES:
        raise InvalidParameterError(f"GGUF outtype '{outtype}' is not one of {', '.join(OUTTYPES)}",
                                    "pass e.g. --outtype f16")
    target = check_target(path, kind="file")
    if os.path.lexists(target) and not overwrite:
        raise RopekitError(f"'{path}' exists", "pass another path, or --overwrite")
    rope = gguf_rope(model, freeze_length)
    config = text_config(model)
    vocab_size = int(config.vocab_size)
    if tokenizer_gguf is not None:
        vocab = _vocab_from_gguf(Path(tokenizer_gguf), vocab_size)
    elif tokenizer is not None:
        vocab = gguf_vocabulary(tokenizer, vocab_size)
    else:
        raise UnsupportedModelError("the model has no tokenizer, and llama.cpp needs a vocabulary",
                                    "save the model with its tokenizer")
    weights = _weights(model, config, rope.architecture)

    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    with atomic_file(target, overwrite=overwrite) as tmp:
        writer = gguf.GGUFWriter(tmp, rope.architecture)
        writer.add_name(str(getattr(config, "_name_or_path", "") or "ropekit export"))
        writer.add_type("model")
        writer.add_file_type(int(getattr(gguf.LlamaFileType, _FILE_TYPES[outtype])))
        writer.add_vocab_size(vocab_size)
        writer.add_context_length(rope.context_length)
        writer.add_embedding_length(int(config.hidden_size))
        writer.add_block_count(int(config.num_hidden_layers))
        writer.add_feed_forward_length(int(config.intermediate_size))
        writer.add_head_count(heads)
        writer.add_head_count_kv(int(getattr(config, "num_key_value_heads", None) or heads))
        writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
        # Qwen3's head_dim is its own setting (readers such as transformers' GGUF loader take it from key_length,
        # not from embedding_length / head_count), so it is written for every architecture but the Llama one
        if head_dim != config.hidden_size // heads or rope.architecture != "llama":
            writer.add_key_length(head_dim)
            writer.add_value_length(head_dim)
        writer.add_rope_dimension_count(rope.rotary_dim)
        writer.add_rope_freq_base(rope.freq_base)
        writer.add_rope_scaling_type(gguf.RopeScalingType(rope.scaling_type))
        if rope.factor is not None:
            writer.add_rope_scaling_factor(rope.factor)
        if rope.scaling_type == "yarn":
            writer.add_rope_scaling_orig_ctx_len(int(rope.original_context_length))
            writer.add_rope_scaling_yarn_beta_fast(LLAMACPP_BETA_FAST)  # what llama.cpp uses (for readers)
            writer.add_rope_scaling_yarn_beta_slow(LLAMACPP_BETA_SLOW)
        if rope.scaling_type == "yarn" or rope.attn_factor != 1.0:
            writer.add_rope_scaling_attn_factors(rope.attn_factor)
        if rope.method is not None:
            writer.add_string("ropekit.method", rope.method)
            writer.add_string("ropekit.params", json.dumps(rope.params, sort_keys=True, default=str))
        writer.add_string("ropekit.rope_form", rope.form)
        if rope.frozen_at is not None:
            writer.add_uint32("ropekit.frozen_at", int(rope.frozen_at))
        if outtype == "q8_0":
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        vocab.write(writer)
        if rope.rope_freqs is not None:
            writer.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", rope.rope_freqs)
        for name, data, permute_heads in weights:
            if permute_heads is not None:
                data = rotate_half_to_adjacent(data, permute_heads)
            array, raw = _tensor_for(name, data, outtype)
            writer.add_tensor(name, array, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file(progress=False)
        writer.close()
    return {"path": str(target), "outtype": outtype, "rope": rope.describe(), "rope_form": rope.form,
            "context_length": rope.context_length, "vocabulary": vocab.source, "method": rope.method,
            "frozen_at": rope.frozen_at}
