"""ropekit's methods as transformers rope types, and whether a model family's own config accepts a rope type.

Every registered method becomes rope type ``ropekit_<name>`` in transformers' ``ROPE_INIT_FUNCTIONS``, so a
model's rotary-embedding module computes its frequencies through the method (transformers' own
``@dynamic_rope_update`` recomputes the length-dependent ones). Nothing is registered on import:
:func:`register_rope_types` does it, through :mod:`ropekit.adapters.transformers`, when ``ropekit.register()``
is called (``extend`` and ``load`` call it).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from transformers import CONFIG_MAPPING

from ..adapters import transformers as hf
from ..errors import InvalidParameterError, UnsupportedModelError
from ..methods import Method, list_methods
from .model_rope import base_info

ROPE_TYPE_PREFIX = "ropekit_"


def rope_type(method: Method) -> str:
    """The transformers rope type under which ``method`` is registered: ``ropekit_<name>``."""
    return ROPE_TYPE_PREFIX + method.name


def _params_from_rope(method: Method, rope: dict[str, Any]) -> dict[str, Any]:
    names = {p.name for p in method.params}
    return {k: v for k, v in rope.items() if k in names}


def _make_rope_init(method: Method):
    def rope_init(config, device=None, seq_len=None, layer_type=None):
        rope = config.rope_parameters if layer_type is None else config.rope_parameters[layer_type]
        info = base_info(config, layer_type)  # the model before the method: its own RoPE, scaled or plain
        # a scaled base gets the length as transformers passed it (a tensor from its dynamic update): its own
        # rope function then computes in the same precision as for the unextended model
        seq = seq_len if info.is_scaled or seq_len is None else int(seq_len)
        params = _params_from_rope(method, rope)
        if seq_len is None and not hf.rotary_driven_by_ropekit():  # transformers building the module on its own
            _refuse_plain_build(method, info, params)
        return method.inv_freq(info, params, seq_len=seq, device=device)

    rope_init.__name__ = f"compute_{method.name}_rope_parameters"
    rope_init.__doc__ = f"ropekit's '{method.name}' frequencies (transformers rope-init contract)."
    return rope_init


def _refuse_plain_build(method: Method, info, params: dict[str, Any]) -> None:
    """Refuse a model that transformers builds on its own from a ``ropekit_<name>`` rope type (``from_pretrained``
    after ``ropekit.register()``) where the rope-init function is not all of the method, so that the model built
    would be another one, silently: an attention-side change or per-position rotation that ``extend``/``load``
    attach to the attention, a method's own modules (CLEX's ODE) that they restore, or frequencies that change with
    the input length by a hook they attach — transformers' own update follows only its ``dynamic`` rule, the one
    Dynamic NTK installs."""
    why = ""
    if not method.frequencies_only or method.position_dependent_rotation(params):
        why = "changes the attention, which the rope type cannot carry"
    elif "weights" in method.changes:
        why = "computes its frequencies with modules of its own that only ropekit restores"
    else:
        kind, length = method.length_dependence(info, params)
        if kind != "static" and not (kind == "continuous" and "dynamic" in rope_type(method)):
            why = (f"has frequencies that change with the input length beyond {length} tokens, which plain "
                   "transformers would not follow (it would keep the short-input set)")
    if why:
        raise UnsupportedModelError(f"rope type '{rope_type(method)}' {why}",
                                    "load the directory with ropekit.load(DIR), which installs the whole method")


def _make_validator(method: Method):
    def validate(rope_parameters, ignore_keys=None):
        known = {p.name for p in method.params} | {"rope_type", "rope_theta", "partial_rotary_factor"}
        unknown = set(rope_parameters) - known - set(ignore_keys or ())
        if unknown:
            raise InvalidParameterError(
                f"rope_parameters of type '{rope_type(method)}' has unknown keys {sorted(unknown)}",
                "fix config.json or re-export the model with ropekit",
            )

    return validate


#: rope type → (method, rope-init function, validator) as registered in this process.
_REGISTERED: dict[str, tuple[Method, Any, Any]] = {}


def register_rope_types() -> tuple[str, ...]:
    """Register every method as a transformers rope type and return the rope types ropekit has registered.

    Idempotent: a method already registered (the same method object, its functions still in transformers'
    registries) is left alone, so a second call changes nothing; a method registered since the last call, or an
    entry something removed, is (re-)registered.
    """
    for method in list_methods():
        name = rope_type(method)
        known = _REGISTERED.get(name)
        if (known is not None and known[0] is method and hf.rope_init_function(name) is known[1]
                and hf.rope_validator(name) is known[2]):
            continue
        init, validate = _make_rope_init(method), _make_validator(method)
        hf.register_rope_init(name, init)
        hf.register_rope_validator(name, validate)
        _REGISTERED[name] = (method, init, validate)
    return tuple(_REGISTERED)


def transformers_builds(data: dict[str, Any], rope: dict[str, Any]) -> bool:
    """Whether this model family's own config class accepts ``rope`` unchanged.

    Families validate rope types differently (Phi-3 accepts only ``default`` and ``longrope`` and renames
    ``yarn``), so the only reliable test is to build the config the way plain transformers would.
    """
    # a deep copy: building a config fills defaults into the dicts it is given (rope_scaling, rope_parameters)
    register_rope_types()  # a ropekit_<name> rope type is built like any other
    trial = copy.deepcopy({k: v for k, v in data.items() if k != "ropekit"})
    trial["rope_parameters"] = copy.deepcopy(rope)
    with_top_level_original(trial, rope)
    try:
        with _quiet_transformers():  # its warnings about keys other readers need (vLLM's short_mscale) are not ours
            built = CONFIG_MAPPING[data["model_type"]].from_dict(trial)
    except Exception:  # any refusal means plain transformers cannot build it
        return False
    return _holds(built.rope_parameters or {}, rope)


def with_top_level_original(saved: dict[str, Any], rope: dict[str, Any]) -> None:
    """Phi-3's config class overwrites ``rope_parameters["original_max_position_embeddings"]`` with its own top-level
    key (default 4096): where the saved config has that key, it is written with the RoPE's value, in place."""
    if "original_max_position_embeddings" in saved and "original_max_position_embeddings" in rope:
        saved["original_max_position_embeddings"] = rope["original_max_position_embeddings"]


@contextlib.contextmanager
def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _holds(got: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Every key of ``wanted`` has its value in ``got`` (recursing into RoPE per layer type)."""
    for key, value in wanted.items():
        if isinstance(value, dict):
            if not isinstance(got.get(key), dict) or not _holds(got[key], value):
                return False
        elif got.get(key) != value:
            return False
    return True
