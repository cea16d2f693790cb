"""Every contact ropekit has with transformers' internals: its registries, private attributes and module globals.

ropekit never copies a model file; it plugs into extension points transformers has but does not document as
stable API. Each of them is reached through one function of this module and nowhere else, so a transformers
release that moves one breaks one function, and ``tests/adapters/test_transformers_contacts.py`` (one test
per contact, each naming the transformers versions it was checked with) says which.

The contacts:

- **rope-init registry** — ``modeling_rope_utils.ROPE_INIT_FUNCTIONS``: rope type → ``fn(config, device,
  seq_len, layer_type=None) -> (inv_freq, attention_factor)``. Every model's rotary-embedding module looks
  its rope type up there when built (:func:`rope_init_function`, :func:`register_rope_init`).
- **rope-parameter validator hook** — ``RotaryEmbeddingConfigMixin._validate_<type>_rope_parameters``,
  which a config looks up by name when built and warns without (:func:`register_rope_validator`).
- **attention registries** — ``AttentionInterface`` / ``ALL_ATTENTION_FUNCTIONS`` and
  ``AttentionMaskInterface`` / ``ALL_MASK_ATTENTION_FUNCTIONS`` (its private ``_global_mapping``): a new
  implementation name needs the mask builder of its kernel too, or transformers passes no mask at all
  (:func:`register_attention`, :func:`attention_kernel`, :func:`global_attention_function`).
- **a model file's module globals** — ``eager_attention_forward`` ("eager" is not in the global registry) and
  ``rotate_half`` (:func:`model_file_global`, :func:`attention_kernel`).
- **private attributes** — ``config._attn_implementation``, a model class's ``_supports_sdpa``,
  ``_keys_to_ignore_on_load_unexpected`` and ``_no_split_modules``.
- **auto mappings** — ``models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING`` (and ``…_NAMES``).
- **rotary-embedding modules** — what the model files' ``*RotaryEmbedding`` classes hold (``rope_type``,
  ``config``, ``inv_freq`` or ``<layer type>_inv_freq``, ``attention_scaling``) and that they rebuild from
  ``type(module)(config=...)``; attention modules are the ones with an integer ``layer_idx``.
- **GGUF loader globals** — ``modeling_gguf_pytorch_utils.GGUF_SUPPORTED_ARCHITECTURES`` and its module-level
  ``tqdm``.
- **DeepSpeed integration** — ``integrations.unset_hf_deepspeed_config``.

Nothing here registers anything on import: ``ropekit.register()`` (:mod:`ropekit.install.registration`) does,
through these functions, when ``extend``/``load`` (or a caller) asks.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RotaryEmbeddingConfigMixin
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

# ---------------------------------------------------------------- rope-init registry and validator hook


def rope_init_function(rope_type: str) -> Callable | None:
    """transformers' function computing ``(inv_freq, attention_factor)`` for ``rope_type``, or ``None``."""
    return ROPE_INIT_FUNCTIONS.get(rope_type)


def register_rope_init(rope_type: str, function: Callable) -> None:
    """Make rotary-embedding modules built for ``rope_type`` compute their frequencies with ``function``
    (called ``function(config, device, seq_len, layer_type=None)``)."""
    ROPE_INIT_FUNCTIONS[rope_type] = function


def _validator_name(rope_type: str) -> str:
    return f"_validate_{rope_type}_rope_parameters"


def register_rope_validator(rope_type: str, validate: Callable[[dict[str, Any], Iterable[str] | None], None]) -> None:
    """Check ``rope_parameters`` of type ``rope_type`` when a config is built: ``validate(rope_parameters,
    ignore_keys)`` raises on bad parameters. Without a validator transformers warns on every config it builds."""

    def hook(self, rope_parameters, ignore_keys=None):
        validate(rope_parameters, ignore_keys)

    hook.__name__ = _validator_name(rope_type)
    hook.ropekit_validate = validate  # what was registered, for an idempotent registration to compare
    setattr(RotaryEmbeddingConfigMixin, _validator_name(rope_type), hook)


def rope_validator(rope_type: str) -> Callable | None:
    """The ``validate`` function registered for ``rope_type`` through :func:`register_rope_validator`, else ``None``."""
    hook = RotaryEmbeddingConfigMixin.__dict__.get(_validator_name(rope_type))
    return getattr(hook, "ropekit_validate", None)


_ROPEKIT_DRIVES_ROTARY = contextvars.ContextVar("ropekit_drives_rotary", default=False)


@contextlib.contextmanager
def ropekit_drives_rotary() -> Iterator[None]:
    """Rotary modules built or recomputed inside this block are ropekit's own: ropekit attaches what their
    frequencies need beyond the rope-init function (a length schedule) itself. A rope-init function called outside
    such a block is transformers building a model on its own (``from_pretrained``, ``from_config``), which calls
    the function of a model's rope type once when the module is built and again when it initialises the
    non-persistent ``inv_freq`` buffer (``PreTrainedModel._init_weights``)."""
    token = _ROPEKIT_DRIVES_ROTARY.set(True)
    try:
        yield
    finally:
        _ROPEKIT_DRIVES_ROTARY.reset(token)


def rotary_driven_by_ropekit() -> bool:
    """Whether the caller runs inside :func:`ropekit_drives_rotary`."""
    return _ROPEKIT_DRIVES_ROTARY.get()


def rotary_frequencies(rotary: torch.nn.Module, seq_len, layer_type: str | None = None,
                       device=None) -> tuple[torch.Tensor, float]:
    """``(inv_freq, attention factor)`` the rope-init function of ``rotary``'s own rope type gives at ``seq_len``
    (``None``: the set it is built with), for ``layer_type``'s layers on a model with RoPE per layer type."""
    with ropekit_drives_rotary():
        if layer_type is None:
            return ROPE_INIT_FUNCTIONS[rotary.rope_type](rotary.config, device, seq_len)
        return ROPE_INIT_FUNCTIONS[rotary.rope_type[layer_type]](rotary.config, device, seq_len, layer_type=layer_type)


# ---------------------------------------------------------------- attention registries


def register_attention(name: str, function: Callable, *, mask_like: str) -> None:
    """Register attention implementation ``name`` (``model.set_attn_implementation(name)`` then calls
    ``function``) with the mask builder of kernel ``mask_like``: transformers builds masks per implementation
    name and, for a name without one, silently passes no mask (transformers PR #45811)."""
    AttentionInterface.register(name, function)
    mask_fn = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(mask_like)
    if mask_fn is not None:
        AttentionMaskInterface.register(name, mask_fn)


def registered_attention(name: str) -> Callable | None:
    """The function registered under attention implementation ``name``, or ``None``."""
    return ALL_ATTENTION_FUNCTIONS[name] if name in ALL_ATTENTION_FUNCTIONS.valid_keys() else None


def registered_mask(name: str) -> Callable | None:
    """The mask builder transformers uses for attention implementation ``name``, or ``None``."""
    return ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(name)


def has_attention_kernel(kernel: str) -> bool:
    """Whether ``kernel`` can be called through :func:`attention_kernel` in this installation."""
    return kernel == "eager" or kernel in ALL_ATTENTION_FUNCTIONS.valid_keys()


def packed_sequence_kwargs(position_ids: torch.Tensor | None, batch: int, *, always: bool = False) -> dict[str, Any] | None:
    """The varlen kwargs (``cu_seq_lens_q/k``, ``max_length_q/k``) transformers' flash kernels compute themselves for a
    padding-free packed row given no mask (``_flash_attention_forward``: ``_is_packed_sequence`` then
    ``prepare_fa_kwargs_from_position_ids``), or None when the row is not packed (one host read, as in transformers).
    ``always``: the boundaries of ``position_ids`` (one flattened row) whether or not they restart."""
    from transformers import modeling_flash_attention_utils as fa

    if position_ids is None or (not always and not fa._is_packed_sequence(position_ids, batch)):
        return None
    (cu_q, cu_k), (max_q, max_k) = fa.prepare_fa_kwargs_from_position_ids(position_ids)
    return {"cu_seq_lens_q": cu_q, "cu_seq_lens_k": cu_k, "max_length_q": max_q, "max_length_k": max_k}


def model_file_global(obj: Any, name: str) -> Any:
    """The module-level ``name`` of the model file that defines ``obj``'s class (``eager_attention_forward``,
    ``rotate_half``), or ``None``: each model file defines its own."""
    return getattr(sys.modules.get(type(obj).__module__), name, None)


def attention_kernel(module: torch.nn.Module, kernel: str) -> Callable:
    """The function ``module`` would call for ``kernel``: "eager" is each model file's own
    ``eager_attention_forward`` (not in the global registry); the others come from the registry."""
    if kernel == "eager":
        function = model_file_global(module, "eager_attention_forward")
        if function is None:
            raise KeyError(f"{type(module).__module__} defines no eager_attention_forward")
        return function
    return ALL_ATTENTION_FUNCTIONS[kernel]


def global_attention_function(name: str) -> Callable:
    """The function under ``name`` in the global attention registry (to put back after a library replaced it)."""
    return ALL_ATTENTION_FUNCTIONS[name]


def set_global_attention_function(name: str, function: Callable) -> None:
    """Put ``function`` under ``name`` in the global attention registry."""
    ALL_ATTENTION_FUNCTIONS[name] = function


# ---------------------------------------------------------------- private attributes of configs and model classes


def attn_implementation(config) -> str | None:
    """The attention implementation a config (or a model's config) was set to: ``config._attn_implementation``."""
    return getattr(config, "_attn_implementation", None)


def preset_attn_implementation(config, name: str) -> None:
    """Set the attention implementation on a config before a model is built from it."""
    config._attn_implementation = name


def supports_sdpa(model_class) -> bool:
    """Whether a model class runs the sdpa kernel (its ``_supports_sdpa``)."""
    return bool(getattr(model_class, "_supports_sdpa", False))


def no_split_modules(model) -> list[str]:
    """Module classes transformers keeps on one device when spreading a model (``_no_split_modules``)."""
    return list(getattr(model, "_no_split_modules", None) or [])


@contextlib.contextmanager
def expecting_unexpected_keys(model_class, patterns: Iterable[str]) -> Iterator[None]:
    """While loading, tell transformers that checkpoint keys matching ``patterns`` are expected even though the
    model class does not have them (its ``_keys_to_ignore_on_load_unexpected``): no "unexpected keys" report."""
    had = "_keys_to_ignore_on_load_unexpected" in model_class.__dict__
    saved = model_class.__dict__.get("_keys_to_ignore_on_load_unexpected")
    model_class._keys_to_ignore_on_load_unexpected = list(saved or []) + list(patterns)
    try:
        yield
    finally:
        if had:
            model_class._keys_to_ignore_on_load_unexpected = saved
        else:
            del model_class._keys_to_ignore_on_load_unexpected


# ---------------------------------------------------------------- auto mappings


def causal_lm_class(config) -> type | None:
    """The causal-LM model class ``AutoModelForCausalLM`` builds for ``config``, or ``None``."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)


def is_causal_lm_type(model_type: str) -> bool:
    """Whether ``AutoModelForCausalLM`` knows ``model_type`` (a config.json's ``model_type``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


# ---------------------------------------------------------------- rotary-embedding and attention modules


def is_rotary(module: torch.nn.Module) -> bool:
    """A transformers rotary-embedding module: a ``rope_type`` and its ``inv_freq`` buffer (one per layer type
    on models with RoPE per layer type: ``full_attention_inv_freq`` …)."""
    if not hasattr(module, "rope_type"):
        return False
    if isinstance(module.rope_type, dict):
        return all(hasattr(module, f"{t}_inv_freq") for t in module.rope_type)
    return hasattr(module, "inv_freq")


def rotary_modules(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """``(parent, attribute, module)`` for every rotary-embedding module of ``model``."""
    return [(parent, attr, child) for parent in model.modules() for attr, child in parent.named_children()
            if is_rotary(child)]


def rotary_inv_freq(rotary: torch.nn.Module, layer_type: str | None = None) -> torch.Tensor:
    """The frequencies a rotary module applies now (to ``layer_type``'s layers on a per-layer-type model)."""
    return getattr(rotary, f"{layer_type}_inv_freq") if layer_type else rotary.inv_freq


def rotary_attention_factor(rotary: torch.nn.Module) -> float:
    """The factor a rotary module multiplies cos and sin by (``attention_scaling``; 1 when it has none)."""
    return getattr(rotary, "attention_scaling", 1.0)


def rebuild_rotary(model: torch.nn.Module) -> None:
    """Replace every rotary-embedding module by a new one built from the current config (on the same device):
    the module computes its frequencies once, in ``__init__``, from the config's rope type."""
    for parent, attr, old in rotary_modules(model):
        device = next(old.buffers()).device
        with ropekit_drives_rotary():
            setattr(parent, attr, type(old)(config=old.config).to(device))


def set_rotary_frequencies(rotary: torch.nn.Module, inv_freq: torch.Tensor, attention_factor: float) -> None:
    """Make a (single-RoPE) rotary module apply ``inv_freq`` and ``attention_factor`` from its next call.

    A fresh buffer, never an in-place copy: transformers' own dynamic update (rope types named 'dynamic') resets
    by registering ``original_inv_freq`` itself as ``inv_freq``, so the two may share memory, and writing into
    ``inv_freq`` would overwrite the original frequencies every later reset restores.
    """
    current = rotary.inv_freq
    rotary.register_buffer("inv_freq", inv_freq.to(device=current.device, dtype=current.dtype), persistent=False)
    rotary.attention_scaling = attention_factor


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention module of every decoder layer (anything with an integer ``layer_idx`` whose class name
    ends in ``Attention``: the model files' convention)."""
    return [module for module in model.modules()
            if isinstance(getattr(module, "layer_idx", None), int) and type(module).__name__.endswith("Attention")]


# ---------------------------------------------------------------- GGUF loader globals


#: Used when the installed transformers has no list of its GGUF loaders.
_GGUF_FALLBACK = ("llama", "mistral", "qwen2", "qwen3", "phi3")


def gguf_architectures() -> tuple[str, ...]:
    """GGUF ``general.architecture`` values transformers can dequantize into a model."""
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except Exception:  # pragma: no cover - depends on the installed transformers
        return _GGUF_FALLBACK
    return tuple(GGUF_SUPPORTED_ARCHITECTURES)


@contextlib.contextmanager
def gguf_progress_bar_disabled() -> Iterator[None]:
    """transformers' GGUF conversion draws a plain ``tqdm`` bar (a module global of its GGUF loader) that its
    progress-bar switch does not reach: while this is open, that bar is off."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - older transformers
        yield
        return
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is None:
        yield
        return
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


# ---------------------------------------------------------------- DeepSpeed integration


def unset_deepspeed_config() -> None:
    """Lift transformers' global DeepSpeed ZeRO-3 registration, so models built next are not partitioned."""
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
