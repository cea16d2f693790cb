"""Registration of the ``ropekit_<kernel>`` attention implementations and their masks.

For every kernel transformers knows (sdpa, eager, flash_attention_2/3/4, flex_attention) ropekit
registers ``ropekit_<kernel>`` in ``AttentionInterface`` *and* the kernel's own mask builder in
``AttentionMaskInterface`` — without the latter transformers silently passes no mask at all
(notes §9, HF PR #45811).
"""

from __future__ import annotations

import sys
from typing import Callable, Protocol

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

PREFIX = "ropekit_"
KERNELS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flash_attention_4", "flex_attention")


class LayerAttention(Protocol):
    """Replaces one layer's attention: gets rotated queries/keys (keys include the cache) and the mask
    transformers built for the kernel, returns ``(out (B, Lq, H, D), weights or None)``; ``kernel`` is the
    function it replaces, for the parts where plain attention is right."""

    def __call__(self, module, query, key, value, attention_mask, *, scaling, dropout, kernel, **kwargs): ...


class QueryKeyTransform(Protocol):
    """Something that changes already-rotated queries/keys of one layer before the kernel runs."""

    def __call__(
        self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, position_ids: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def _kernel_function(module: torch.nn.Module, kernel: str) -> Callable:
    if kernel == "eager":
        # "eager" is each model file's own function, not part of the global registry.
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[kernel]


def _make_attention(kernel: str) -> Callable:
    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        transforms = getattr(module, "ropekit_transforms", ())
        if transforms:
            position_ids = kwargs.get("position_ids")
            for transform in transforms:
                query, key = transform(module, query, key, position_ids)
        kernel_fn = _kernel_function(module, kernel)
        attend = getattr(module, "ropekit_attend", None)
        if attend is not None:  # a method that replaces the attention computation itself
            return attend(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                          kernel=kernel_fn, **kwargs)
        return kernel_fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)

    attention.__name__ = f"{PREFIX}{kernel}_attention"
    attention.__doc__ = f"Apply ropekit's per-layer query/key transforms, then the '{kernel}' kernel."
    return attention


def _register() -> None:
    for kernel in KERNELS:
        if kernel != "eager" and kernel not in ALL_ATTENTION_FUNCTIONS:
            continue
        AttentionInterface.register(PREFIX + kernel, _make_attention(kernel))
        mask_fn = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(kernel)
        if mask_fn is not None:
            AttentionMaskInterface.register(PREFIX + kernel, mask_fn)


_register()


def kernel_of(implementation: str | None) -> str:
    """The underlying kernel of an attention implementation name (``ropekit_sdpa`` → ``sdpa``)."""
    impl = implementation or "sdpa"
    return impl[len(PREFIX):] if impl.startswith(PREFIX) else impl


def attention_implementation_for(kernel: str) -> str:
    return PREFIX + kernel_of(kernel)


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention module of every decoder layer (anything with an integer ``layer_idx`` and projections)."""
    found = []
    for module in model.modules():
        if isinstance(getattr(module, "layer_idx", None), int) and type(module).__name__.endswith("Attention"):
            found.append(module)
    return found


def install_transforms(
    model: torch.nn.Module,
    make: Callable[[int], tuple[QueryKeyTransform, ...]],
    make_attend: Callable[[int], LayerAttention | None] | None = None,
) -> int:
    """Attach ``make(layer_idx)`` (and ``make_attend(layer_idx)``) to every attention module and switch
    the model to ``ropekit_<kernel>``.

    Returns the number of attention modules changed. The current kernel (sdpa, eager, flash…) is kept.
    """
    modules = attention_modules(model)
    for module in modules:
        module.ropekit_transforms = tuple(make(module.layer_idx))
        module.ropekit_attend = make_attend(module.layer_idx) if make_attend is not None else None
    current = getattr(model.config, "_attn_implementation", None)
    model.set_attn_implementation(attention_implementation_for(current))
    return len(modules)
