"""Saving an extended model so that plain transformers loads the same model wherever it can.

Where transformers has the method, ``config.json`` holds transformers' own ``rope_parameters``; otherwise
it keeps rope type ``ropekit_<name>``, which plain transformers refuses loudly and :func:`ropekit.load`
restores. ``config.ropekit`` always records the method, its parameters and the base model's RoPE, and a
a model card (``README.md``, huggingface_hub's ``ModelCard``; the same text in ``ROPEKIT.md``) says which case
applies and gives the same model's settings in each stack (:mod:`.card`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from ..core.jsonsafe import json_safe
from ..core.rope import pair_exponents
from ..core.softmax_scale import softmax_scale_changes
from ..errors import InvalidParameterError, UnsupportedModelError
from ..runtime.atomic import atomic_dir
from ..methods import get_method
from ..methods.base import EngineConfig
from .capabilities import model_features
from .card import card_body, write_card
from .legacy import legacy_keys, legacy_releases, with_engine_keys
from .freeze import check_freeze_length
from .model_rope import base_info, rotary_modules, text_config
from .rope_types import transformers_builds, with_top_level_original
from .vllm import engine_keys, vllm_serving
from .weights import cast_state, plan_weights, quantizer_set_aside

def _with_base_rope(config, record):
    """Context: ``config`` temporarily carries the base model's RoPE (so family validators accept it)."""

    class _Swap:
        def __enter__(self):
            self.saved = (config.rope_parameters, config.max_position_embeddings)
            config.rope_parameters = copy.deepcopy(record["base"]["rope_parameters"])
            config.max_position_embeddings = record["base"]["max_position_embeddings"]

        def __exit__(self, *exc):
            config.rope_parameters, config.max_position_embeddings = self.saved
            return False

    return _Swap()


#: What a saved model directory holds (transformers' ``save_pretrained`` of a model, its tokenizer and generation
#: config; ropekit's cards; a training's record): replacing a directory of only these loses nothing else.
_MODEL_FILES = re.compile(
    r"^(config\.json|generation_config\.json|.*\.safetensors|.*\.safetensors\.index\.json|pytorch_model.*\.bin"
    r"|pytorch_model\.bin\.index\.json|tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab\..*"
    r"|merges\.txt|chat_template\..*|spiece\.model|sentencepiece.*\.model|README\.md|ROPEKIT\.md"
    r"|ropekit_train\.json|\.gitattributes)$")


@contextlib.contextmanager
def _whole_directory(out: Path):
    """The directory to save into: built beside ``out`` and renamed to it at the end (:func:`ropekit.runtime.
    atomic_dir`), so an ``out`` that exists is complete — a process killed before the rewritten ``config.json``
    would otherwise leave weights that plain transformers loads as the base model. An existing ``out`` is
    replaced when it is empty or a model directory holding only a model's files (:data:`_MODEL_FILES`); anything
    else in it (a GGUF written beside the model, checkpoints, notes) is named and never deleted."""
    if out.is_dir() and any(out.iterdir()):
        if not (out / "config.json").is_file():
            raise InvalidParameterError(f"'{out}' exists and is not a model directory (no config.json)",
                                        "save into a new or empty directory")
        others = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir()
                        if p.is_dir() or not _MODEL_FILES.match(p.name))
        if others:
            named = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            raise InvalidParameterError(
                f"'{out}' holds files a saved model does not ({named}); replacing the directory would delete them",
                "save into a new directory, or move those files out first")
    with atomic_dir(out, replace=True) as building:
        yield building


#: ``rope_format`` values of :func:`save_pretrained`.
ROPE_FORMATS = ("auto", "native", "longrope", "ropekit")


def _native_rope(m, info, params, base_rope: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """transformers' own rope type for the method, when it is the same math."""
    native = m.transformers_rope(info, params)
    if native is None:
        per_position = m.position_dependent_rotation(params)
        return None, (f"{m.name}: {per_position}" if per_position
                      else f"transformers has no rope type computing {m.name} with these parameters")
    if "partial_rotary_factor" in base_rope or info.partial_rotary_factor != 1.0:
        # what the model really rotates: Llama and Qwen2 ignore a configured factor, transformers' scaled types read it
        native["partial_rotary_factor"] = info.partial_rotary_factor
    return native, ""


def _longrope_rope(model, m, info, params, freeze_length: int | None) -> tuple[dict | None, str]:
    """The installed frequencies written as transformers' ``longrope`` (``λ_i = θ_i/θ'_i`` per pair with the
    attention factor), or ``(None, why not)``.

    Exact whenever the method changes only the frequencies at inference and they are static (one set) or switch
    once (LongRoPE's short/long sets); a length-dependent method is written at ``freeze_length`` tokens when
    one is given — its frequencies frozen there.
    """
    if not m.frequencies_only:
        return None, f"{m.name} changes attention, not only the frequencies"
    per_position = m.position_dependent_rotation(params)
    if per_position:
        return None, f"{m.name}: {per_position}"
    kind, length = m.length_dependence(info, params)
    rotary = rotary_modules(model)[0][2]
    config = text_config(model)
    at = info.layer_type
    if freeze_length is not None:
        short = long = m.frequencies_at(rotary, int(freeze_length), at)
        switch = None
    elif kind == "static":
        short = long = m.frequencies_at(rotary, None, at)
        switch = None
    elif kind == "switch":
        short, long = m.frequencies_at(rotary, None, at), m.frequencies_at(rotary, length + 1, at)
        switch = length
    else:
        return None, f"{m.name}'s frequencies follow the input length (pass freeze_length to write them at one length)"
    if abs(short[1] - long[1]) > 1e-12 * abs(short[1]):
        return None, "the attention factor differs between the short and the long set"
    shape = pair_exponents(info.rotary_dim).to(torch.float64)
    theta = info.rope_theta

    def rescale(inv_freq: torch.Tensor) -> list[float]:
        # transformers' longrope computes 1/(λ_i·b^(2i/d)); so λ_i = 1/(θ'_i·b^(2i/d))
        return [float(v) for v in 1.0 / (inv_freq.detach().to(torch.float64).cpu() * theta ** shape)]

    window = _served_window(config, freeze_length)
    # one set: the switch length does not matter; the model's own original window keeps families that check it happy
    original = switch if switch is not None else info.original_window
    rope = {
        "rope_type": "longrope",
        "rope_theta": theta,
        "short_factor": rescale(short[0]),
        "long_factor": rescale(long[0]),
        "original_max_position_embeddings": original,
        "attention_factor": float(short[1]),
        "factor": window / original,
    }
    if "partial_rotary_factor" in (info.rope_parameters or {}) or info.partial_rotary_factor != 1.0:
        rope["partial_rotary_factor"] = info.partial_rotary_factor
    return rope, ""


def _write_legacy_keys(saved: dict[str, Any]) -> tuple[str, list[str]]:
    """Add transformers 4.x's names of the RoPE to ``saved`` (config.json's dict), in place; returns why 4.x will not
    load the same model (``""`` when it will) and the keys written. Kept only when transformers 5 still builds the
    same RoPE from the file (5.x reads ``rope_scaling`` before ``rope_parameters``)."""
    rope = saved["rope_parameters"]
    keys, why = legacy_keys(saved.get("model_type", ""), rope, saved.get("max_position_embeddings"))
    if not keys:
        return why, []
    if not transformers_builds({**saved, **keys}, rope):
        return "its 4.x names would change what transformers 5 reads, so config.json carries only rope_parameters", []
    added = sorted(k for k in keys if k not in saved or saved[k] != keys[k])  # the family's own (Phi-3's) stay
    saved.update(keys)
    return why, added


def _served_window(config, freeze_length: int | None) -> int:
    """The window an export declares: the extended one, and at least the length a method was frozen at (Dynamic
    NTK sets no target of its own, and an engine refuses inputs longer than the declared window)."""
    return max(int(config.max_position_embeddings), int(freeze_length or 0))


def _without_rotary_weights(model) -> dict[str, torch.Tensor] | None:
    """``model``'s state dict without the parameters of its rotary modules, or ``None`` when they have none."""
    rotary = {id(module) for _, _, module in rotary_modules(model)}
    prefixes = tuple(f"{name}." for name, module in model.named_modules() if id(module) in rotary)
    state = model.state_dict()
    kept = {k: v for k, v in state.items() if not k.startswith(prefixes)}
    return kept if len(kept) < len(state) else None


def _vllm_config(model, m, info, params) -> tuple[EngineConfig | None, str]:
    """``(keys, "")`` with which vLLM computes the method itself (the method's ``vllm_config``: Dual Chunk
    Attention's ``dual_chunk_attention_config``), or ``(None, why not)``; ``(None, "")`` for the methods vLLM can only
    serve through their RoPE."""
    if not m.vllm_keys:
        return None, ""
    engine = m.vllm_config(info, params, sliding_layers=model_features(model).sliding_layers)
    if isinstance(engine, EngineConfig):
        return engine, ""
    return None, engine or ""


def _base_window(config, record) -> int:
    """The window the card calls original: the base model's effective one (a Qwen that declares 40,960 positions
    with YaRN ×4 over 32,768 has 131,072), which the method's factor extends, not its declared
    ``max_position_embeddings``."""
    layer_type = (record.get("layer_types") or [None])[0]
    return int(base_info(config, layer_type).window)


def _encode(model, m, record, data: dict[str, Any], rope_format: str, freeze_length: int | None):
    """``(rope_parameters, "")`` writing the installation in ``rope_format`` (``native`` or ``longrope``), or
    ``(None, why not)``. On a model with RoPE per layer type each extended type gets its own entry, the others
    keep theirs; the family's own config class must accept the result unchanged."""
    config = text_config(model)
    base_rope = record["base"]["rope_parameters"]
    layer_params = record.get("layer_params") or {None: record["params"]}
    pieces = {}
    for layer_type, params in layer_params.items():
        info = base_info(config, layer_type)
        if rope_format == "native":
            piece, why = _native_rope(m, info, params, base_rope[layer_type] if layer_type else base_rope)
        else:
            piece, why = _longrope_rope(model, m, info, params, freeze_length)
        if piece is None:
            return None, why
        if layer_type is not None and piece.get("rope_type") == "yarn" and piece.get("truncate", True) is False:
            # transformers 5.x's yarn reads `truncate` from the top level of rope_parameters, not from the layer
            # type's entry, so it would truncate the ramp: a different model, built without complaint
            return None, "transformers ignores yarn's truncate=false in a per-layer-type RoPE"
        pieces[layer_type] = piece
    rope = pieces[None] if None in pieces else {**copy.deepcopy(base_rope), **pieces}
    if not transformers_builds(data, rope):
        return None, f"model type '{data.get('model_type')}' does not accept that rope_parameters unchanged"
    scale_why = softmax_scale_changes(str(data.get("model_type", "")), base_rope, rope)
    if scale_why:
        return None, scale_why
    return rope, ""


def _export_note(m, rope_format: str, rope: dict[str, Any], freeze_length: int | None) -> str:
    if rope_format == "ropekit":
        return (f"Plain transformers cannot build this model: it refuses rope type `ropekit_{m.name}` (a KeyError, or "
                "the model family's own validation error) instead of silently giving another model. Load it with "
                "`ropekit.load(path)`.")
    if rope_format == "native":
        per_type = ", ".join(f"{t}: {v.get('rope_type')}" for t, v in rope.items() if isinstance(v, dict))
        kind = f"rope type `{rope['rope_type']}`" if "rope_type" in rope else f"rope types per layer type `{per_type}`"
        return f"Plain transformers loads this directory to the same model ({kind})."
    frozen = (f" The method's frequencies depend on the input length; they are written as they are at "
              f"{freeze_length} tokens, frozen." if freeze_length is not None else "")
    return (
        "The frequencies are written as transformers' `longrope` type (one rescale factor per rotary pair, "
        "`short_factor` up to `original_max_position_embeddings` tokens and `long_factor` beyond, with the "
        "attention factor): plain transformers — and engines that read `longrope` — compute the same frequencies "
        f"as ropekit.{frozen}\n\nTrade-off against rope type `ropekit_{m.name}`: `longrope` is portable but "
        f"carries only the numbers; `ropekit.load(path)` restores the method itself (its parameters are under "
        "`ropekit` in config.json), which is what further training or a different target length needs."
    )


def save_pretrained(model: PreTrainedModel, out_dir: str | Path, tokenizer=None, *, rope_format: str = "auto",
                    freeze_length: int | None = None, dtype: str | torch.dtype | None = None,
                    base_model: str | None = None, evaluation: dict[str, Any] | None = None,
                    evidence: dict[str, Any] | None = None) -> dict[str, Any]:
    """Save ``model`` so that plain transformers rebuilds the same model wherever it can.

    ``rope_format`` chooses how ``config.json`` writes the RoPE:

    * ``native`` — transformers' own equivalent of the method (PI → ``linear``, NTK/ABF → ``rope_theta``,
      YaRN → ``yarn``, Dynamic NTK with transformers' rule → ``dynamic``, NTK-by-parts with ``ramp='dim'`` →
      ``yarn`` with attention factor 1, llama3, longrope), when the family's own config accepts it;
    * ``longrope`` — any frequencies that are static (or switch once) written exactly as transformers'
      ``longrope``: NTK-by-parts with its ratio ramp, frozen Dynamic NTK, compositions on pre-scaled models,
      and — with ``freeze_length`` — CLEX or Dynamic NTK frozen at that length;
    * ``ropekit`` — rope type ``ropekit_<name>``: plain transformers refuses to build the model (``KeyError``,
      or the family's validation error) instead of silently giving a different one;
    * ``auto`` (default) — the first of native, longrope, ropekit that is exact: the portable form whenever
      it is the same model.

    ``dtype`` (``float32``, ``bfloat16``, ``float16``) is what the weights are written in; by default a model loaded
    from a GGUF is written in its file's precision class (a quantized GGUF dequantized to float16, an F16/BF16/F32
    file as such: :mod:`.weights`) and any other model as it is. A model whose weights transformers cannot save
    (packed GGUF blocks, another quantizer) is refused in one line before anything is written.

    ``base_model`` (a hub id, or the .gguf file the model came from), ``evaluation`` (metric → value) and ``evidence``
    (a comparison table, :func:`.card.evidence_markdown`) go into the model card; the base model defaults to the
    hub id the model was loaded from, when it was.

    ``ropekit.load`` restores every method from any of them (the method and its parameters are recorded under
    ``ropekit``). A format that cannot represent the model exactly is refused in one line before anything is
    written. Returns a report: method, format, ``transformers`` (plain loading gives the same model), ``vllm``.
    """
    if rope_format not in ROPE_FORMATS:
        raise InvalidParameterError(f"unknown rope format '{rope_format}'", f"choose one of {', '.join(ROPE_FORMATS)}")
    if freeze_length is not None and (isinstance(freeze_length, bool) or not isinstance(freeze_length, int)
                                      or freeze_length < 1):
        raise InvalidParameterError(f"freeze_length must be a positive number of tokens, got {freeze_length!r}",
                                    "pass e.g. freeze_length=16384")
    out = Path(out_dir)
    config = text_config(model)
    record = getattr(config, "ropekit", None)
    weights = plan_weights(model, dtype)  # refuses unsaveable weights before anything is written
    if not record:
        with _whole_directory(out) as building:
            if tokenizer is not None:
                tokenizer.save_pretrained(building)
            _portable_tokenizer_config(building)
            with quantizer_set_aside(model, weights):
                model.save_pretrained(building, state_dict=cast_state(model.state_dict(), weights) if weights.dtype else None)
            _record_dtype(building / "config.json", weights)
        return {"method": None, "path": str(out), "format": "native", "transformers": True, "vllm": True,
                "dtype": _dtype_name(weights, model)}
    m = get_method(record["method"])
    info = base_info(config)
    params = record["params"]
    data = {k: v for k, v in config.to_dict().items() if k != "ropekit"}
    data["rope_parameters"] = copy.deepcopy(record["base"]["rope_parameters"])
    data["max_position_embeddings"] = record["base"]["max_position_embeddings"]
    if freeze_length is not None:
        check_freeze_length(model, m, info, params, freeze_length)
    rope, chosen, why = None, "ropekit", ""
    if rope_format in ("auto", "native") and freeze_length is None:
        rope, why = _encode(model, m, record, data, "native", None)
        chosen = "native" if rope is not None else chosen
    if rope is None and rope_format in ("auto", "longrope"):
        rope, why = _encode(model, m, record, data, "longrope", freeze_length)
        chosen = "longrope" if rope is not None else chosen
    if rope is None and rope_format in ("native", "longrope"):
        what = "transformers' own rope types" if rope_format == "native" else "transformers' longrope"
        raise UnsupportedModelError(f"{m.name} with these parameters cannot be written exactly as {what}"
                                    + (f": {why}" if why else ""), "save with rope_format='auto' or 'ropekit'")
    if freeze_length is not None and chosen != "longrope":
        raise UnsupportedModelError(f"freeze_length applies to the longrope format, which cannot hold {m.name}: {why}",
                                    "leave freeze_length out")

    engine, engine_why = _vllm_config(model, m, info, params)

    with _whole_directory(out) as building:
        if tokenizer is not None:
            m.prepare_tokenizer(tokenizer, params)
            tokenizer.save_pretrained(building)
            _portable_tokenizer_config(building)
        # a native or longrope config describes the rotary embedding completely: its learned parameters (CLEX's
        # ODE) would be unexpected weights to the engines (vLLM refuses to load them)
        state = _without_rotary_weights(model) if rope is not None else None
        if weights.dtype is not None:
            state = cast_state(state if state is not None else model.state_dict(), weights)
        with _with_base_rope(config, record), quantizer_set_aside(model, weights):  # the config is rewritten below
            model.save_pretrained(building, state_dict=state)
        config_path = building / "config.json"
        saved = json.loads(config_path.read_text())
        if rope is not None:
            saved["rope_parameters"] = rope
            with_top_level_original(saved, rope)
            # transformers' `dynamic` reads max_position_embeddings as the original window C of its rule
            saved["max_position_embeddings"] = (int(params["original_max_position_embeddings"])
                                                if rope.get("rope_type") == "dynamic" else _served_window(config, freeze_length))
        else:
            saved["rope_parameters"] = json_safe(dict(config.rope_parameters))
            saved["max_position_embeddings"] = config.max_position_embeddings
        # a loaded Qwen2.5-1M-style config (or an earlier DCA export) must not make vLLM run DCA on another method
        for key in engine_keys():
            saved.pop(key, None)
        if engine is not None:
            saved.update(engine.keys)
        saved["rope_parameters"] = with_engine_keys(saved["rope_parameters"])  # vLLM's own names, beside transformers'
        if rope is not None:
            rope = saved["rope_parameters"]
        legacy_why, legacy = _write_legacy_keys(saved)
        export = {"format": chosen, "freeze_length": freeze_length, **({"vllm_refusal": engine_why} if engine_why else {}),
                  **({"transformers4_refusal": legacy_why} if legacy_why else {})}
        export["legacy_keys"] = legacy  # ropekit.load drops them again: it restores the base model's RoPE
        # engines build some rope types only in the half-split layout (vLLM's longrope): the plan reads it here
        export["rotary_layout"] = model_features(model).rotary_layout
        written = saved["rope_parameters"]
        export["rope_type"] = (written.get("rope_type") if "rope_type" in written else  # the standard type, for inspect
                               {k: v.get("rope_type") for k, v in written.items() if isinstance(v, dict)})
        saved["ropekit"] = json_safe({**record, "export": export})
        saved.pop("quantization_config", None)  # the weights are plain tensors (a GGUF's were dequantized at load)
        if weights.dtype is not None:
            saved["dtype"] = _dtype_name(weights, model)
        config_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
        how = _export_note(m, chosen, rope or {}, freeze_length)
        if engine is not None:
            how += "\n\n" + engine.note
        elif engine_why:
            how += f"\n\nvLLM: not the same model ({engine_why})."
        releases, earlier = legacy_releases(saved["rope_parameters"])
        how += (f"\n\ntransformers {'4.x' if legacy_why else releases}: " + (
            f"not the same model — {legacy_why}." if legacy_why else
            "`config.json` also carries its names (`rope_theta`, `rope_scaling`), the same numbers: it loads the same "
            "model with no flags" + (f" ({earlier})." if earlier else ".")))
        source = base_model or _hub_id(model)
        body = card_body(building, saved, method=m.name, params=json_safe(params), original=_base_window(config, record),
                         note=how, legacy_why=legacy_why, evaluation=evaluation, evidence=evidence,
                         base_model=None if source and source.lower().endswith(".gguf") else source,
                         source_gguf=source if source and source.lower().endswith(".gguf") else None)
        write_card(building, body, method=m.name, base_model=source if source and _HUB_ID.match(source) else None)
    vllm = vllm_serving(out).exact  # the same verdict as the card's and `ropekit verify`'s
    return {
        "method": m.name,
        "path": str(out),
        "format": chosen,
        "transformers": chosen != "ropekit",
        "transformers4": chosen != "ropekit" and not legacy_why,
        "vllm": vllm,
        "rope_parameters": rope or saved["rope_parameters"],
        "dtype": _dtype_name(weights, model),
    }


def _portable_tokenizer_config(out: Path) -> None:
    """tokenizer_config.json without the loading options of this machine (``local_files_only``: a tokenizer
    loaded offline keeps it among its init arguments, and whoever loads the export would inherit it)."""
    path = out / "tokenizer_config.json"
    if not path.is_file():
        return
    data = json.loads(path.read_text())
    if data.pop("local_files_only", None) is not None:
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


#: An ``org/name`` hub id (what a model card's ``base_model`` holds).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _hub_id(model) -> str | None:
    """The hub id ``model`` was loaded from (``name_or_path``), when it is one and not a local path."""
    name = str(getattr(model, "name_or_path", "") or "")
    return name if _HUB_ID.match(name) and not Path(name).exists() else None


def _dtype_name(weights, model) -> str:
    dtype = weights.dtype or next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return str(dtype).removeprefix("torch.")


def _record_dtype(config_path: Path, weights) -> None:
    """config.json of a plain save: the dtype the weights were written in, no quantization_config."""
    if weights.dtype is None and not weights.set_aside_quantizer:
        return
    saved = json.loads(config_path.read_text())
    saved.pop("quantization_config", None)
    if weights.dtype is not None:
        saved["dtype"] = str(weights.dtype).removeprefix("torch.")
    config_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
