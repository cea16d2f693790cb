"""Installing a method into a transformers model, and removing it again — each all or nothing.

How a method gets in (no model file is copied or patched):

1. Frequencies go through transformers' rope-init registry (:mod:`.rope_types`): ``extend`` writes rope
   type ``ropekit_<name>`` and the resolved parameters into ``config.rope_parameters`` and rebuilds the
   model's rotary-embedding modules, which then call the method.
2. Attention-side changes (per-head RoPE, logit scale, a layer attention such as Self-Extend) attach to
   each attention module and switch the model to the ``ropekit_<kernel>`` attention function
   (:mod:`ropekit.attention`).
3. Model-level changes of the method itself (Landmark's token and input hooks) go through the method's
   ``install_model`` / ``uninstall_model`` hooks.
4. ``config.ropekit`` records the method, its resolved parameters and the base model's RoPE, so that
   :func:`uninstall`, ``save_pretrained`` and ``load`` restore exactly.

If any step fails, :func:`extend` puts back everything it changed (:class:`_Snapshot`), so the model is
left exactly as it was.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import PreTrainedModel

from .._version import __version__
from ..adapters import transformers as hf
from ..attention import PerHeadRotation, QueryLogitScale, install_transforms
from ..attention.interface import attention_modules, kernel_of
from ..core.rope_info import RopeInfo, layer_rope_types, primary_layer_type
from ..errors import InvalidParameterError, RopekitError, UnsupportedModelError
from ..methods import AttentionSpec, Method, get_method
from .capabilities import model_features, why_not
from .model_rope import rebuild_rotary, rope_info, rotary_inv_freq, rotary_modules, text_config
from .registration import register
from .rope_types import rope_type

_MISSING = object()
#: What ropekit sets on an attention module; a snapshot keeps and restores exactly these.
_MODULE_ATTRS = ("ropekit_transforms", "ropekit_attend")
#: Size attributes of embedding and output-projection modules that a vocabulary resize changes.
_SIZE_ATTRS = ("num_embeddings", "out_features", "in_features")


def _factor_from(info: RopeInfo, factor: float | None, target_length: int | None) -> float | None:
    if factor is not None and target_length is not None:
        raise InvalidParameterError("both factor and target_length were given", "pass only one of them")
    if target_length is None:
        return factor
    if isinstance(target_length, str) and target_length.strip().isdecimal():
        target_length = int(target_length)  # `--param target_length=N` arrives as text, as every --param does
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


def _require_scale(m: Method, given: dict[str, Any]) -> None:
    """A method whose only reach is its scale ``s`` (:attr:`~ropekit.methods.base.Method.scale_only`) computes the
    model's own RoPE when given no factor and no target length; ``factor: 1`` written out is accepted (a control),
    left out it is refused, as a run that would extend nothing."""
    if m.scale_only and m.sized_by_target(given):
        raise InvalidParameterError(
            f"{m.name} needs a scale: without factor or target_length it computes the model's own RoPE",
            "give a factor or the length to reach (factor=4 / target_length=N; on the command line --factor, "
            "--target-length or --param factor=4)")


def resolve_params(
    model: PreTrainedModel, method: str | Method, *, factor=None, target_length=None, **params
) -> tuple[Method, RopeInfo, dict[str, Any]]:
    """Validate a method and its parameters against ``model`` without changing it (the capability check too)."""
    info = rope_info(model)
    m = get_method(method) if isinstance(method, str) else method
    refusal = why_not(m, info, model_features(model))
    if refusal is not None:
        raise UnsupportedModelError(refusal.problem, refusal.fix)
    f = _factor_from(info, factor, target_length)
    given = dict(params)
    if f is not None:
        given["factor"] = f
    _require_scale(m, given)
    return m, info, m.resolve(info, given)


class _Snapshot:
    """Everything :func:`extend` and :func:`uninstall` may change on a model, to put back after a failure.

    Config fields (RoPE, window, vocabulary size, the ropekit record, the attention implementation), the
    rotary-embedding and embedding modules (kept by reference: installing builds new ones), the embedding
    parameters' data and sizes (a vocabulary resize may replace them in place), and ropekit's attributes
    on every attention module. Hooks a method registered are removed by its ``uninstall_model``.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.config = config = text_config(model)
        self.fields = {name: copy.deepcopy(getattr(config, name)) if hasattr(config, name) else _MISSING
                       for name in ("rope_parameters", "max_position_embeddings", "vocab_size", "ropekit")}
        self.attn_implementation = hf.attn_implementation(model.config)
        self.rotary = [(parent, attr, module) for parent, attr, module in rotary_modules(model)]
        self.embeddings = (model.get_input_embeddings(), model.get_output_embeddings())
        # resizing may swap a Parameter's data in place (transformers keeps the module for hooks and sharding)
        self.embedding_data = [(module, name, getattr(module, name), getattr(module, name).data,
                                {k: getattr(module, k) for k in _SIZE_ATTRS if hasattr(module, k)})
                               for module in self.embeddings if module is not None
                               for name in ("weight", "bias") if getattr(module, name, None) is not None]
        self.modules = [(m, {a: getattr(m, a, _MISSING) for a in _MODULE_ATTRS}) for m in attention_modules(model)]
        generation = getattr(model, "generation_config", None)
        self.disable_compile = (generation, getattr(generation, "disable_compile", None))

    def restore(self) -> None:
        model, config = self.model, self.config
        generation, disable_compile = self.disable_compile
        if generation is not None:
            generation.disable_compile = disable_compile
        for name, value in self.fields.items():
            if value is _MISSING:
                if hasattr(config, name):
                    delattr(config, name)
            else:
                setattr(config, name, value)
        for parent, attr, module in self.rotary:
            setattr(parent, attr, module)
        inputs, outputs = self.embeddings
        if model.get_input_embeddings() is not inputs:
            model.set_input_embeddings(inputs)
        if outputs is not None and model.get_output_embeddings() is not outputs:
            model.set_output_embeddings(outputs)
        for module, name, parameter, data, sizes in self.embedding_data:
            parameter.data = data
            setattr(module, name, parameter)
            for key, value in sizes.items():
                setattr(module, key, value)
        for module, attrs in self.modules:
            for attr, value in attrs.items():
                if value is _MISSING:
                    if hasattr(module, attr):
                        delattr(module, attr)
                else:
                    setattr(module, attr, value)
        if self.attn_implementation and hf.attn_implementation(model.config) != self.attn_implementation:
            model.set_attn_implementation(self.attn_implementation)


def extend(
    model: PreTrainedModel,
    method: str | Method,
    *,
    factor: float | None = None,
    target_length: int | None = None,
    layer_types: list[str] | tuple[str, ...] | None = None,
    **params: Any,
) -> PreTrainedModel:
    """Install ``method`` into ``model`` in place and return it.

    ``factor`` is the scale ``s``; ``target_length`` sets it to ``target_length / window``. Other keyword
    arguments are the method's parameters (``ropekit methods`` lists them; names follow transformers'
    ``rope_parameters`` keys). A model whose RoPE is already scaled is extended from its effective RoPE (each
    method's composition rule); on a model with RoPE per layer type (Gemma 3) the method goes into the
    full-attention layers' RoPE, and into other layer types' only when ``layer_types`` names them. Weights are
    never touched: training, ``generate`` and the KV cache work as before. Raises a one-line
    :class:`~ropekit.errors.RopekitError` for bad input or a model the method cannot handle exactly. All or
    nothing: when any step fails, the model is left exactly as it was.
    """
    config = text_config(model)
    record = getattr(config, "ropekit", None)
    if record:
        raise UnsupportedModelError(
            f"model is already extended with '{record['method']}'", "load the base model and extend that instead"
        )
    types = _chosen_layer_types(config, layer_types)
    m = get_method(method) if isinstance(method, str) else method
    given = {}
    for layer_type in types:
        info = rope_info(model, layer_type)
        factor_given = _factor_from(info, factor, target_length)
        given[layer_type] = {**params, **({"factor": factor_given} if factor_given is not None else {})}
        _require_scale(m, given[layer_type])
    return install_resolved(model, m, given)


def _chosen_layer_types(config, layer_types) -> tuple[str | None, ...]:
    """The layer types to extend: the full-attention type by default on a model with RoPE per layer type."""
    available = layer_rope_types(config)
    if not available:
        if layer_types:
            raise InvalidParameterError(f"layer_types {list(layer_types)} given, but this model has one RoPE for every "
                                        "layer", "leave layer_types out")
        return (None,)
    if not layer_types:
        return (primary_layer_type(available),)
    unknown = [t for t in layer_types if t not in available]
    if unknown:
        raise InvalidParameterError(f"unknown layer type(s) {unknown} for this model", f"choose from {', '.join(available)}")
    primary = primary_layer_type(available)
    return tuple(sorted(set(layer_types), key=lambda t: (t != primary, t)))


def install_resolved(model: PreTrainedModel, m: Method, given: dict[str | None, dict[str, Any]]) -> PreTrainedModel:
    """Install ``m`` with parameters ``given[layer_type]`` for each layer type to extend (``None``: the model has
    one RoPE). :func:`extend` and ``ropekit.load`` (with the recorded parameters) both come through here, so this
    is where ropekit's rope types and attention functions are registered with transformers (``ropekit.register``)."""
    register()
    config = text_config(model)
    types = tuple(given)
    resolved = {}
    features = model_features(model)
    for layer_type in types:
        info = rope_info(model, layer_type)
        try:
            resolved[layer_type] = m.resolve(info, given[layer_type])
        except RopekitError:
            # a model the method cannot serve with any parameters is named before a parameter it would have
            # needed (HARPE on an already scaled model, asked without a factor)
            refusal = why_not(m, info, features, example=False)
            if refusal is not None:
                raise UnsupportedModelError(refusal.problem, refusal.fix) from None
            raise
    primary = types[0]
    info = rope_info(model, primary)
    refusal = why_not(m, info, features, resolved[primary])
    if refusal is not None:
        raise UnsupportedModelError(refusal.problem, refusal.fix)
    spec = m.attention(info, resolved[primary])
    snapshot = _Snapshot(model)
    try:
        _install(model, config, m, info, resolved, spec, features)
    except BaseException:
        m.uninstall_model(model, resolved[primary])  # the method's own hooks; safe when none were registered
        snapshot.restore()
        raise
    return model


class LengthSchedule:
    """Forward pre-hook of a rotary-embedding module whose frequencies depend on the input length.

    ``switch``: one set up to ``length`` tokens and another beyond (LongRoPE's rule, ``seq_len > length``);
    ``continuous``: transformers' Dynamic-NTK schedule — recomputed whenever the input grows past the longest
    length seen, back to the original set below ``length``; ``per_input``: recomputed for every input at its own
    length (the original set up to ``length``), so a result never depends on what ran before. The frequencies come from the module's own rope-init
    function at that length, so they equal what the model's own rope type computes.
    """

    def __init__(self, kind: str, length: int):
        self.kind, self.length = kind, int(length)
        self.longest = int(length)
        self.long = False

    def __call__(self, module, args, kwargs):
        position_ids = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        if position_ids is None:
            return None
        length = torch.max(position_ids) + 1  # a tensor, as transformers passes it (its rope math follows the type)
        seq_len = int(length)
        if self.kind == "switch":
            long = seq_len > self.length
            if long != self.long:
                self.long = long
                self._load(module, self.length + 1 if long else None)
        elif self.kind == "per_input":
            wanted = max(seq_len, self.length)
            if wanted != self.longest or not self.long:
                self.longest, self.long = wanted, True
                self._load(module, length if seq_len > self.length else None)
        elif seq_len > self.longest:
            self.longest = seq_len
            self._load(module, length)
        elif seq_len < self.length < self.longest:
            self.longest = self.length
            self._load(module, None)
        return None

    @staticmethod
    def _load(module, seq_len: int | None) -> None:
        inv_freq, attention_factor = hf.rotary_frequencies(module, seq_len, device=module.inv_freq.device)
        hf.set_rotary_frequencies(module, inv_freq, attention_factor)

    def reset(self) -> None:
        """Forget every input seen: the state the hook is registered with (the module's own set loaded)."""
        self.longest, self.long = self.length, False


def reset_length_state(model: torch.nn.Module) -> None:
    """Put every rotary module whose frequencies depend on the input length back to the state it was built in
    (for an extended model: as the method was installed), so that the next input is computed as in a fresh process.

    Two mechanisms remember earlier inputs. transformers' dynamic update (``dynamic_rope_update`` in
    ``transformers/modeling_rope_utils.py``, for every rope type whose name contains "dynamic") recomputes
    ``inv_freq`` and ``attention_scaling`` when an input grows past ``max_seq_len_cached``, keeps them for shorter
    inputs, and goes back to ``original_inv_freq`` only below ``original_max_seq_len``. ropekit's
    :class:`LengthSchedule` keeps the longest length seen (``continuous``) or the last set it loaded. So on one
    model an input scored after a longer one gets the longer one's frequencies (Dynamic NTK, bloc97 2023,
    reddit.com/r/LocalLLaMA "Dynamically Scaled RoPE"; transformers' rule), and a result depends on what ran before
    it. Here ``inv_freq`` becomes a copy of ``original_inv_freq`` (the set ``__init__`` computed), the attention
    factor the module's rope-init function gives without a length (what ``__init__`` computed),
    ``max_seq_len_cached`` goes back to ``original_max_seq_len``, and every :class:`LengthSchedule` forgets its
    inputs. Modules whose frequencies do not depend on the length are left alone.
    """
    for _, _, rotary in rotary_modules(model):
        schedules = [hook for hook in rotary._forward_pre_hooks.values() if isinstance(hook, LengthSchedule)]
        kinds = getattr(rotary, "rope_type", None)
        kinds = dict(kinds) if isinstance(kinds, dict) else {None: kinds}
        dynamic = any(isinstance(kind, str) and "dynamic" in kind for kind in kinds.values())
        if not schedules and not dynamic:
            continue
        for hook in schedules:
            hook.reset()
        for layer_type, kind in kinds.items():
            prefix = "" if layer_type is None else f"{layer_type}_"
            original = getattr(rotary, f"{prefix}original_inv_freq", None)
            if original is None:
                continue
            # a copy: transformers' own reset registers original_inv_freq itself, and an in-place write would then
            # change the set every later reset restores
            rotary.register_buffer(f"{prefix}inv_freq", original.clone(), persistent=False)
            if hasattr(rotary, f"{prefix}max_seq_len_cached") and hasattr(rotary, "original_max_seq_len"):
                setattr(rotary, f"{prefix}max_seq_len_cached", rotary.original_max_seq_len)
            if isinstance(kind, str) and hf.rope_init_function(kind) is not None:
                _, factor = hf.rotary_frequencies(rotary, None, layer_type)
                setattr(rotary, f"{prefix}attention_scaling", factor)


def _rope_dict(m: Method, info: RopeInfo, resolved: dict[str, Any], base_rope: dict[str, Any]) -> dict[str, Any]:
    """``rope_parameters`` of one RoPE under the method: its ropekit rope type and resolved parameters."""
    rope = {"rope_type": rope_type(m), "rope_theta": resolved.get("rope_theta", info.rope_theta)}
    if "partial_rotary_factor" in base_rope or info.partial_rotary_factor != 1.0:
        rope["partial_rotary_factor"] = info.partial_rotary_factor  # what the model really rotates
    rope.update({k: v for k, v in resolved.items() if v is not None})
    return rope


def _install(model, config, m: Method, info: RopeInfo, resolved: dict[str | None, dict[str, Any]],
             spec: AttentionSpec | None, features) -> None:
    base_rope = copy.deepcopy(dict(config.rope_parameters))
    primary = next(iter(resolved))
    resolved[primary] = m.install_model(model, info, resolved[primary])
    record = {
        "method": m.name,
        "params": resolved[primary],
        "version": __version__,
        "base": {"rope_parameters": base_rope, "max_position_embeddings": int(config.max_position_embeddings)},
    }
    if primary is None:
        rope = _rope_dict(m, info, resolved[primary], base_rope)
    else:  # RoPE per layer type: only the chosen types change
        rope = copy.deepcopy(base_rope)
        for layer_type, params in resolved.items():
            rope[layer_type] = _rope_dict(m, rope_info(model, layer_type), params, base_rope[layer_type])
        record["layer_types"] = list(resolved)
        record["layer_params"] = dict(resolved)
    config.ropekit = record
    config.rope_parameters = rope
    config.max_position_embeddings = m.max_position_embeddings(info, resolved[primary])
    rebuild_rotary(model)
    kind, length = m.length_dependence(info, resolved[primary])
    for _, _, rotary in rotary_modules(model):
        m.attach(rotary, info, resolved[primary])  # a method's own weights (CLEX's ODE) live on the rotary module
        if kind != "static" and not m.schedules_itself:
            # the frequencies change with the input length because of the model's own RoPE (LongRoPE's two sets,
            # Dynamic NTK) or the method's switch; transformers recomputes only rope types named like its own
            rotary.register_forward_pre_hook(LengthSchedule(kind, length), with_kwargs=True)
    if spec is not None and not spec.is_empty():
        _install_attention(model, info, spec, features, m.name)


def _install_attention(model, info: RopeInfo, spec: AttentionSpec, features, method_name: str) -> None:
    """Attach the method's transforms and layer attention to the attention modules. On models with sliding-window
    layers, the logit scale and the layer attention go to the full-attention layers only: a sliding layer never
    sees the distances they change, and keeps its own window."""
    config = text_config(model)
    sliding = set(features.sliding_layers)
    layer_types = getattr(config, "layer_types", None) if features.layer_rope_types else None

    scaled = [i for i in range(info.num_layers) if i not in spec.skip_layers and i not in sliding]

    def make(layer_idx: int):
        transforms = []
        if spec.head_bases is not None:
            transforms.append(PerHeadRotation(spec.head_bases, info.rotary_dim))
        if spec.logit_scale_context is not None and layer_idx in scaled:
            # the scale reads absolute query positions; the first scaled layer checks each call for counted padding
            transforms.append(QueryLogitScale(spec.logit_scale_context,
                                              reads_positions=method_name if layer_idx == scaled[0] else None))
        return tuple(transforms)

    make_attend = None
    if spec.layer_attention is not None:
        factory = spec.layer_attention
        rotary = rotary_modules(model)[0][2]

        def make_attend(layer_idx: int):
            if layer_idx in sliding:
                return None
            layer_type = layer_types[layer_idx] if layer_types else None
            return factory(info, lambda: rotary_inv_freq(rotary, layer_type), layer_idx, **spec.layer_attention_args)

    if install_transforms(model, make, make_attend) != info.num_layers:
        raise UnsupportedModelError(
            f"found {len(attention_modules(model))} attention modules for {info.num_layers} layers",
            "this architecture's attention layout is not supported for attention-side methods",
        )
    generation = getattr(model, "generation_config", None)
    if generation is not None and (spec.layer_attention is not None or spec.head_bases is not None):
        # these read key positions off the cache's written slots, which a compiled graph cannot read from a static
        # cache's mask (ropekit.attention.masks.written_keys): generate's automatic compilation (static cache on a
        # GPU) is turned off, so it runs them eagerly, as ropekit computes them
        generation.disable_compile = True


def uninstall(model: PreTrainedModel) -> PreTrainedModel:
    """Return an extended ``model`` to its base RoPE — the reverse of :func:`extend` — and return it.

    The base ``rope_parameters`` and window come from the ``config.ropekit`` record that :func:`extend`
    wrote; the rotary modules are rebuilt from them, every attention-side transform is removed, the kernel
    goes back to the plain one, and the method's own hooks are removed (``Method.uninstall_model``). Weights
    are untouched (a token row Landmark added stays) — which is what lets a curriculum change a method's
    parameters between stages. A model without a record is returned unchanged.
    """
    config = text_config(model)
    record = getattr(config, "ropekit", None)
    if not record:
        return model
    method = get_method(record["method"])
    snapshot = _Snapshot(model)
    try:
        method.uninstall_model(model, record["params"])
        config.rope_parameters = copy.deepcopy(record["base"]["rope_parameters"])
        config.max_position_embeddings = record["base"]["max_position_embeddings"]
        delattr(config, "ropekit")
        rebuild_rotary(model)
        for module in attention_modules(model):
            module.ropekit_transforms = ()
            module.ropekit_attend = None
        current = hf.attn_implementation(model.config)
        if current and kernel_of(current) != current:
            model.set_attn_implementation(kernel_of(current))
    except BaseException:
        snapshot.restore()
        raise
    return model
