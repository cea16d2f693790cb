"""Install a method into a transformers model, describe a model's RoPE, export and load extended models.

How a method gets in (no model file is copied or patched):

1. Frequencies go through transformers' rope-init registry: every method is registered as rope type
   ``ropekit_<name>`` in ``ROPE_INIT_FUNCTIONS``; ``extend`` writes that type and the resolved
   parameters into ``config.rope_parameters`` and rebuilds the model's rotary-embedding module, which
   calls ropekit's function. Length-dependent methods carry ``dynamic`` in their name so transformers'
   ``@dynamic_rope_update`` recomputes them per forward.
2. Attention-side changes (per-head RoPE, logit scale) attach transforms to each attention module and
   switch the model to the ``ropekit_<kernel>`` attention function (:mod:`ropekit.attention`).
3. ``config.ropekit`` records the method, its resolved parameters and the base model's RoPE, so that
   :func:`save_pretrained` / :func:`load` round-trip exactly.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RotaryEmbeddingConfigMixin

from . import __version__
from .attention import PerHeadRotation, QueryLogitScale, install_transforms
from .attention.interface import attention_modules
from .errors import InvalidParameterError, ModelLoadError, UnsupportedModelError
from .methods import Method, RopeInfo, get_method, list_methods

ROPE_TYPE_PREFIX = "ropekit_"


# ---- registration with transformers ----------------------------------------------------------------
def _rope_type(method: Method) -> str:
    return ROPE_TYPE_PREFIX + method.name


def _params_from_rope(method: Method, rope: dict[str, Any]) -> dict[str, Any]:
    names = {p.name for p in method.params}
    return {k: v for k, v in rope.items() if k in names}


def _make_rope_init(method: Method):
    def rope_init(config, device=None, seq_len=None, layer_type=None):
        rope = config.rope_parameters if layer_type is None else config.rope_parameters[layer_type]
        info = RopeInfo.from_config(config)
        seq = None if seq_len is None else int(seq_len)
        return method.inv_freq(info, _params_from_rope(method, rope), seq_len=seq, device=device)

    rope_init.__name__ = f"compute_{method.name}_rope_parameters"
    rope_init.__doc__ = f"ropekit's '{method.name}' frequencies (transformers rope-init contract)."
    return rope_init


def _make_validator(method: Method):
    def validate(self, rope_parameters, ignore_keys=None):
        known = {p.name for p in method.params} | {"rope_type", "rope_theta", "partial_rotary_factor"}
        unknown = set(rope_parameters) - known - set(ignore_keys or ())
        if unknown:
            raise InvalidParameterError(
                f"rope_parameters of type '{_rope_type(method)}' has unknown keys {sorted(unknown)}",
                "fix config.json or re-export the model with ropekit",
            )

    return validate


def _register_rope_types() -> None:
    for method in list_methods():
        ROPE_INIT_FUNCTIONS[_rope_type(method)] = _make_rope_init(method)
        # transformers looks up `_validate_<type>_rope_parameters` on the config mixin; without one it warns.
        setattr(RotaryEmbeddingConfigMixin, f"_validate_{_rope_type(method)}_rope_parameters", _make_validator(method))


_register_rope_types()


# ---- reading a model ---------------------------------------------------------------------------------
def _text_config(model_or_config):
    config = getattr(model_or_config, "config", model_or_config)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def rotary_modules(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """``(parent, attribute, module)`` for every rotary-embedding module (it has ``inv_freq`` and ``rope_type``)."""
    found = []
    for parent in model.modules():
        for attr, child in parent.named_children():
            if hasattr(child, "inv_freq") and hasattr(child, "rope_type"):
                found.append((parent, attr, child))
    return found


def rope_info(model: PreTrainedModel) -> RopeInfo:
    """The RoPE facts of ``model``; a model without RoPE raises a one-line :class:`UnsupportedModelError`."""
    config = _text_config(model)
    info = RopeInfo.from_config(config)
    if not isinstance(model, torch.nn.Module):
        return info
    modules = rotary_modules(model)
    if not modules:
        raise UnsupportedModelError(
            f"model type '{info.model_type}' has RoPE settings but no rotary-embedding module ropekit can rebuild",
            "use a transformers 5.x Llama, Mistral, Qwen2/3, Phi-3 or GPT-NeoX model",
        )
    if info.rope_type == "default":
        # Some families ignore `partial_rotary_factor` (Llama, Qwen2…): the module's own frequencies are the truth.
        rotary_dim = 2 * modules[0][2].inv_freq.numel()
        if rotary_dim != info.rotary_dim:
            info = dataclasses.replace(info, rotary_dim=rotary_dim, partial_rotary_factor=rotary_dim / info.head_dim)
    return info


def installed(model_or_config) -> dict[str, Any] | None:
    """The ropekit record of an extended model (method, params, base RoPE) or ``None``."""
    return getattr(_text_config(model_or_config), "ropekit", None)


def _base_info(config) -> RopeInfo:
    """RoPE facts of the model *before* extension (from the ropekit record when there is one)."""
    record = getattr(config, "ropekit", None)
    if not record:
        return RopeInfo.from_config(config)
    base = copy.copy(config)
    base.rope_parameters = record["base"]["rope_parameters"]
    base.max_position_embeddings = record["base"]["max_position_embeddings"]
    return RopeInfo.from_config(base)


# ---- extending -------------------------------------------------------------------------------------
def _factor_from(info: RopeInfo, factor: float | None, target_length: int | None) -> float | None:
    if factor is not None and target_length is not None:
        raise InvalidParameterError("both factor and target_length were given", "pass only one of them")
    if target_length is None:
        return factor
    if isinstance(target_length, bool) or not isinstance(target_length, int):
        raise InvalidParameterError(
            f"target_length must be an integer number of tokens, got {target_length!r}", "pass e.g. 32768"
        )
    if target_length <= info.window:
        raise InvalidParameterError(
            f"target length {target_length} is not longer than the model's window ({info.window} tokens)",
            f"pass a target above {info.window}, e.g. {info.window * 4}",
        )
    return target_length / info.window


def resolve_params(
    model: PreTrainedModel, method: str | Method, *, factor=None, target_length=None, **params
) -> tuple[Method, RopeInfo, dict[str, Any]]:
    """Validate a method and its parameters against ``model`` without changing it."""
    info = rope_info(model)
    m = get_method(method) if isinstance(method, str) else method
    f = _factor_from(info, factor, target_length)
    given = dict(params)
    if f is not None:
        given["factor"] = f
    return m, info, m.resolve(info, given)


def extend(
    model: PreTrainedModel,
    method: str | Method,
    *,
    factor: float | None = None,
    target_length: int | None = None,
    **params: Any,
) -> PreTrainedModel:
    """Install ``method`` into ``model`` in place and return it.

    ``factor`` is the scale ``s``; ``target_length`` sets it to ``target_length / window``. Other keyword
    arguments are the method's parameters (``ropekit methods`` lists them; names follow transformers'
    ``rope_parameters`` keys). Weights are never touched: training, ``generate`` and the KV cache work as
    before. Raises a one-line :class:`~ropekit.errors.RopekitError` for bad input; the model is left
    unchanged in that case.
    """
    config = _text_config(model)
    record = getattr(config, "ropekit", None)
    if record:
        raise UnsupportedModelError(
            f"model is already extended with '{record['method']}'", "load the base model and extend that instead"
        )
    m, info, resolved = resolve_params(model, method, factor=factor, target_length=target_length, **params)
    if info.rope_type != "default":
        raise UnsupportedModelError(
            f"model already uses rope_type '{info.rope_type}'",
            "ropekit extends models with plain RoPE (rope_type 'default'); start from the base model",
        )
    spec = m.attention(info, resolved)
    resolved = m.install_model(model, info, resolved)

    base_rope = copy.deepcopy(dict(config.rope_parameters))
    rope = {"rope_type": _rope_type(m), "rope_theta": resolved.get("rope_theta", info.rope_theta)}
    if "partial_rotary_factor" in base_rope or info.partial_rotary_factor != 1.0:
        rope["partial_rotary_factor"] = info.partial_rotary_factor  # what the model really rotates
    rope.update({k: v for k, v in resolved.items() if v is not None})
    config.ropekit = {
        "method": m.name,
        "params": resolved,
        "version": __version__,
        "base": {"rope_parameters": base_rope, "max_position_embeddings": info.window},
    }
    config.rope_parameters = rope
    config.max_position_embeddings = m.max_position_embeddings(info, resolved)
    _rebuild_rotary(model)
    for _, _, rotary in rotary_modules(model):
        m.attach(rotary, info, resolved)  # a method's own weights (CLEX's ODE) live on the rotary module
    if spec is not None and not spec.is_empty():
        _install_attention(model, info, spec)
    return model


def _rebuild_rotary(model: PreTrainedModel) -> None:
    for parent, attr, old in rotary_modules(model):
        device = old.inv_freq.device
        new = type(old)(config=old.config)
        setattr(parent, attr, new.to(device))


def _install_attention(model, info: RopeInfo, spec) -> None:
    def make(layer_idx: int):
        transforms = []
        if spec.head_bases is not None:
            transforms.append(PerHeadRotation(spec.head_bases, info.rotary_dim))
        if spec.logit_scale_context is not None and layer_idx not in spec.skip_layers:
            transforms.append(QueryLogitScale(spec.logit_scale_context))
        return tuple(transforms)

    make_attend = None
    if spec.layer_attention is not None:
        from .attention import LAYER_ATTENTIONS

        factory = LAYER_ATTENTIONS[spec.layer_attention]
        rotary = rotary_modules(model)[0][2]

        def make_attend(layer_idx: int):
            return factory(info, lambda: rotary.inv_freq, layer_idx, **spec.layer_attention_args)

    if install_transforms(model, make, make_attend) != info.num_layers:
        raise UnsupportedModelError(
            f"found {len(attention_modules(model))} attention modules for {info.num_layers} layers",
            "this architecture's attention layout is not supported for attention-side methods",
        )


# ---- describing ---------------------------------------------------------------------------------------
def inspect_model(model: PreTrainedModel) -> dict[str, Any]:
    """Architecture, RoPE settings and applicable methods of ``model`` (what ``ropekit inspect`` shows)."""
    config = _text_config(model)
    record = getattr(config, "ropekit", None)
    info = _base_info(config)
    rope_info(model)  # raises when there is no rotary module
    base_dict = config.to_dict()
    methods = []
    for m in list_methods():
        why = m.not_applicable(info)
        exports = m.exports_to() if why is None else []
        if exports:  # the family's own config class must accept the exported rope type (Phi-3 does not)
            native = m.transformers_rope(info, m.resolve(info, {"factor": 2.0}))
            if native is None or not _transformers_builds(base_dict, native):
                exports = []
        methods.append({"name": m.name, "applies": why is None, "exports_to": exports, "why_not": why or ""})
    return {
        "architecture": type(model).__name__,
        "model_type": info.model_type,
        "rope_type": config.rope_parameters.get("rope_type", "default"),
        "rope_theta": info.rope_theta,
        "window": info.window,
        "max_position_embeddings": int(config.max_position_embeddings),
        "head_dim": info.head_dim,
        "rotary_dim": info.rotary_dim,
        "num_layers": info.num_layers,
        "num_heads": info.num_heads,
        "num_kv_heads": info.num_kv_heads,
        "parameters": sum(p.numel() for p in model.parameters()),
        "attn_implementation": getattr(config, "_attn_implementation", None),
        "extended_with": record and {
            "method": record["method"],
            "params": record["params"],
            # the longest input the method is built for (Self-Extend: (C − W)·G + W), when it has one
            "reach": get_method(record["method"]).reach(info, record["params"]),
        },
        "methods": methods,
    }


# ---- export and load --------------------------------------------------------------------------------
_EXPORT_NOTE = """# Extended with ropekit

Method: `{method}` — parameters in `config.json` under `ropekit`.

{how}
"""


def json_safe(value):
    """``value`` with non-finite floats as strings, so that strict JSON readers accept it."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    return value


def _transformers_builds(data: dict[str, Any], rope: dict[str, Any]) -> bool:
    """Whether this model family's own config class accepts ``rope`` unchanged.

    Families validate rope types differently (Phi-3 accepts only ``default`` and ``longrope`` and renames
    ``yarn``), so the only reliable test is to build the config the way plain transformers would.
    """
    from transformers import CONFIG_MAPPING

    trial = {k: v for k, v in data.items() if k != "ropekit"}
    trial["rope_parameters"] = copy.deepcopy(rope)
    try:
        built = CONFIG_MAPPING[data["model_type"]].from_dict(trial)
    except Exception:  # any refusal means plain transformers cannot build it
        return False
    got = built.rope_parameters or {}
    return all(got.get(key) == value for key, value in rope.items())


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


def save_pretrained(model: PreTrainedModel, out_dir: str | Path, tokenizer=None) -> dict[str, Any]:
    """Save ``model`` so that plain transformers rebuilds the same model wherever it has the method.

    * Methods with an exact transformers equivalent (PI → ``linear``, NTK/ABF → ``rope_theta``, YaRN →
      ``yarn``, Dynamic NTK with transformers' rule → ``dynamic``, NTK-by-parts with ``ramp='dim'`` →
      ``yarn`` with attention factor 1) are written as that equivalent — when the model family's own
      config accepts it (Phi-3's accepts only plain RoPE and LongRoPE).
    * Otherwise the config keeps rope type ``ropekit_<name>``: plain transformers then refuses to build
      the model (``KeyError: 'ropekit_<name>'``, or the family's own validation error) instead of
      silently giving a different one. ``ropekit.load`` restores every method.

    Returns a report: method, ``transformers`` (plain loading gives the same model), ``vllm``.
    """
    out = Path(out_dir)
    config = _text_config(model)
    record = getattr(config, "ropekit", None)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        if record:
            get_method(record["method"]).prepare_tokenizer(tokenizer, record["params"])
        tokenizer.save_pretrained(out)
    if not record:
        model.save_pretrained(out)
        return {"method": None, "path": str(out), "transformers": True, "vllm": True}
    with _with_base_rope(config, record):  # weights are unaffected; the config is rewritten below
        model.save_pretrained(out)
    m = get_method(record["method"])
    info = _base_info(config)
    native = m.transformers_rope(info, record["params"])
    config_path = out / "config.json"
    data = json.loads(config_path.read_text())
    if native is not None:
        base_rope = record["base"]["rope_parameters"]
        if "partial_rotary_factor" in base_rope:
            native["partial_rotary_factor"] = base_rope["partial_rotary_factor"]
        if not _transformers_builds(data, native):
            native = None
    if native is not None:
        data["rope_parameters"] = native
        # transformers' `dynamic` reads max_position_embeddings as the original window
        data["max_position_embeddings"] = info.window if native["rope_type"] == "dynamic" else config.max_position_embeddings
    else:
        data["rope_parameters"] = json_safe(dict(config.rope_parameters))
        data["max_position_embeddings"] = config.max_position_embeddings
    data["ropekit"] = json_safe(record)
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    exports = m.exports_to(record["params"]) if native is not None else []
    how = (
        "Plain transformers loads this directory to the same model (rope type "
        f"`{native['rope_type']}`)." if native is not None else
        f"Plain transformers cannot build this model: it refuses rope type `ropekit_{m.name}` "
        "(a KeyError, or the model family's own validation error). Load it with `ropekit.load(path)`."
    )
    (out / "ROPEKIT.md").write_text(_EXPORT_NOTE.format(method=m.name, how=how))
    return {
        "method": m.name,
        "path": str(out),
        "transformers": native is not None,
        "vllm": "vllm" in exports,
        "rope_parameters": native or data["rope_parameters"],
    }


def load(path: str | Path, *, dtype: torch.dtype | str | None = None, attn_implementation: str = "sdpa"):
    """Load a model saved by :func:`save_pretrained` (or any transformers directory) with its method restored.

    The model is built with the base model's RoPE (recorded at export) and the method is installed again
    with its recorded parameters, so a ropekit-only method comes back exactly.
    """
    from transformers import CONFIG_MAPPING

    path = Path(path)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"no config.json in '{path}'", "pass a directory written by `ropekit extend` or save_pretrained")
    try:
        data = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"'{config_path}' is not valid JSON ({err.msg} at line {err.lineno})", "re-export the model") from None
    record = data.pop("ropekit", None) if isinstance(data, dict) else None
    if record:
        try:
            data["rope_parameters"] = copy.deepcopy(record["base"]["rope_parameters"])
            data["max_position_embeddings"] = record["base"]["max_position_embeddings"]
            m = get_method(record["method"])
            params = m.frozen_params(record["params"])
        except (KeyError, TypeError):
            raise ModelLoadError(f"the 'ropekit' record in '{config_path}' is incomplete", "re-export the model") from None
        if data.get("model_type") not in CONFIG_MAPPING:
            raise ModelLoadError(f"unknown model_type {data.get('model_type')!r} in '{config_path}'", "re-export the model")
        config = CONFIG_MAPPING[data["model_type"]].from_dict(data)
    else:
        config = AutoConfig.from_pretrained(path)
    kwargs: dict[str, Any] = {"config": config, "attn_implementation": attn_implementation}
    if dtype is not None:
        kwargs["dtype"] = dtype
    adds_weights = bool(record) and "weights" in m.changes
    with _expecting_rotary_weights(config) if adds_weights else contextlib.nullcontext():
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if record:
        before = set(model.state_dict())
        extend(model, m, **params)
        _restore_added_weights(model, path, [k for k in model.state_dict() if k not in before])
    model.eval()
    return model


#: Checkpoint keys of modules a method attaches to a rotary embedding (CLEX's ODE): the base model that
#: ``load`` builds first does not have them yet, and ``_restore_added_weights`` reads them after ``extend``.
_ROTARY_CHILD_WEIGHTS = r"rotary_emb\.[^.]+\."


@contextlib.contextmanager
def _expecting_rotary_weights(config):
    """While loading the base model, tell transformers that rotary-module weights in the checkpoint are expected
    (its ``_keys_to_ignore_on_load_unexpected``), so that its load report does not call them unexpected."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    cls = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    if cls is None:
        yield
        return
    had = "_keys_to_ignore_on_load_unexpected" in cls.__dict__
    saved = cls.__dict__.get("_keys_to_ignore_on_load_unexpected")
    cls._keys_to_ignore_on_load_unexpected = list(saved or []) + [_ROTARY_CHILD_WEIGHTS]
    try:
        yield
    finally:
        if had:
            cls._keys_to_ignore_on_load_unexpected = saved
        else:
            del cls._keys_to_ignore_on_load_unexpected


def _restore_added_weights(model, path: Path, keys: list[str]) -> None:
    """Load the weights ``keys`` that ``extend`` added to ``model`` (a method's own modules) from the checkpoint
    in ``path`` (``model.safetensors``, or the shards its index names)."""
    if not keys:
        return
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({weight_map[k] for k in keys if k in weight_map})
    else:
        files = ["model.safetensors"] if (path / "model.safetensors").is_file() else []
    found: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(path / name), framework="pt") as handle:
            present = set(handle.keys())
            found.update({k: handle.get_tensor(k) for k in keys if k in present})
    missing = [k for k in keys if k not in found]
    if missing:
        raise ModelLoadError(
            f"'{path}' has no saved weights for {', '.join(missing)} (the method's own modules)",
            "save the extended model with ropekit.save_pretrained or `ropekit extend --out`",
        )
    model.load_state_dict(found, strict=False)
