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

from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .. import __version__
from ..attention import PerHeadRotation, QueryLogitScale, install_transforms
from ..attention.interface import attention_modules, kernel_of
from ..core.base_rope import length_dependence
from ..core.rope_info import RopeInfo
from ..errors import InvalidParameterError, UnsupportedModelError
from ..methods import AttentionSpec, Method, get_method
from .model_rope import rebuild_rotary, rope_info, rotary_modules, text_config
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
        self.attn_implementation = getattr(model.config, "_attn_implementation", None)
        self.rotary = [(parent, attr, module) for parent, attr, module in rotary_modules(model)]
        self.embeddings = (model.get_input_embeddings(), model.get_output_embeddings())
        # resizing may swap a Parameter's data in place (transformers keeps the module for hooks and sharding)
        self.embedding_data = [(module, name, getattr(module, name), getattr(module, name).data,
                                {k: getattr(module, k) for k in _SIZE_ATTRS if hasattr(module, k)})
                               for module in self.embeddings if module is not None
                               for name in ("weight", "bias") if getattr(module, name, None) is not None]
        self.modules = [(m, {a: getattr(m, a, _MISSING) for a in _MODULE_ATTRS}) for m in attention_modules(model)]

    def restore(self) -> None:
        model, config = self.model, self.config
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
        if self.attn_implementation and getattr(model.config, "_attn_implementation", None) != self.attn_implementation:
            model.set_attn_implementation(self.attn_implementation)


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
    before. Raises a one-line :class:`~ropekit.errors.RopekitError` for bad input. All or nothing: when any
    step fails, the model is left exactly as it was.
    """
    config = text_config(model)
    record = getattr(config, "ropekit", None)
    if record:
        raise UnsupportedModelError(
            f"model is already extended with '{record['method']}'", "load the base model and extend that instead"
        )
    m, info, resolved = resolve_params(model, method, factor=factor, target_length=target_length, **params)
    _check_composable(m, info)
    spec = m.attention(info, resolved)
    snapshot = _Snapshot(model)
    try:
        _install(model, config, m, info, resolved, spec)
    except BaseException:
        m.uninstall_model(model, resolved)  # the method's own hooks; safe when none were registered
        snapshot.restore()
        raise
    return model


def _check_composable(m: Method, info: RopeInfo) -> None:
    """Refuse, in one line, a method that cannot be composed exactly with the model's own RoPE."""
    kind, _ = length_dependence(info)
    if kind == "static":
        return
    why = None
    if "length_dependent" in m.changes:
        why = "its frequencies follow the input length on a schedule of their own"
    elif "frequencies_per_head" in m.changes:
        why = "its per-head rotation is fixed at installation"
    if why:
        raise UnsupportedModelError(
            f"{m.name} cannot be composed with this model's length-dependent RoPE ('{info.rope_type}': its "
            f"frequencies change with the input length): {why}",
            "use a method with static frequencies (pi, ntk, yarn, llama3, longrope, abf) or an attention-side method",
        )


class LengthSchedule:
    """Forward pre-hook of a rotary-embedding module whose frequencies depend on the input length.

    ``switch``: one set up to ``length`` tokens and another beyond (LongRoPE's rule, ``seq_len > length``);
    ``continuous``: transformers' Dynamic-NTK schedule — recomputed whenever the input grows past the longest
    length seen, back to the original set below ``length``. The frequencies come from the module's own rope-init
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
        elif seq_len > self.longest:
            self.longest = seq_len
            self._load(module, length)
        elif seq_len < self.length < self.longest:
            self.longest = self.length
            self._load(module, None)
        return None

    @staticmethod
    def _load(module, seq_len: int | None) -> None:
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[module.rope_type](module.config, module.inv_freq.device, seq_len)
        module.inv_freq.copy_(inv_freq.to(module.inv_freq.dtype))
        module.attention_scaling = attention_factor


def _install(model, config, m: Method, info: RopeInfo, resolved: dict[str, Any], spec: AttentionSpec | None) -> None:
    base_rope = copy.deepcopy(dict(config.rope_parameters))
    resolved = m.install_model(model, info, resolved)
    rope = {"rope_type": rope_type(m), "rope_theta": resolved.get("rope_theta", info.rope_theta)}
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
    rebuild_rotary(model)
    kind, length = m.length_dependence(info, resolved)
    for _, _, rotary in rotary_modules(model):
        m.attach(rotary, info, resolved)  # a method's own weights (CLEX's ODE) live on the rotary module
        if kind != "static" and "length_dependent" not in m.changes:
            # the frequencies change with the input length because of the model's own RoPE (LongRoPE's two sets,
            # Dynamic NTK) or the method's switch; transformers recomputes only rope types named like its own
            rotary.register_forward_pre_hook(LengthSchedule(kind, length), with_kwargs=True)
    if spec is not None and not spec.is_empty():
        _install_attention(model, info, spec)


def _install_attention(model, info: RopeInfo, spec: AttentionSpec) -> None:
    def make(layer_idx: int):
        transforms = []
        if spec.head_bases is not None:
            transforms.append(PerHeadRotation(spec.head_bases, info.rotary_dim))
        if spec.logit_scale_context is not None and layer_idx not in spec.skip_layers:
            transforms.append(QueryLogitScale(spec.logit_scale_context))
        return tuple(transforms)

    make_attend = None
    if spec.layer_attention is not None:
        factory = spec.layer_attention
        rotary = rotary_modules(model)[0][2]

        def make_attend(layer_idx: int):
            return factory(info, lambda: rotary.inv_freq, layer_idx, **spec.layer_attention_args)

    if install_transforms(model, make, make_attend) != info.num_layers:
        raise UnsupportedModelError(
            f"found {len(attention_modules(model))} attention modules for {info.num_layers} layers",
            "this architecture's attention layout is not supported for attention-side methods",
        )


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
        current = getattr(model.config, "_attn_implementation", None)
        if current and kernel_of(current) != current:
            model.set_attn_implementation(kernel_of(current))
    except BaseException:
        snapshot.restore()
        raise
    return model
