"""Registration of the ``ropekit_<kernel>`` attention implementations and their masks.

For every kernel transformers knows (sdpa, eager, flash_attention_2/3/4, flex_attention) ropekit
registers ``ropekit_<kernel>`` in ``AttentionInterface`` *and* the kernel's own mask builder in
``AttentionMaskInterface`` — without the latter transformers silently passes no mask at all
(transformers PR #45811; docs/methods-reference.md §9). Nothing is registered on import:
:func:`register_attention_functions` does it (through :mod:`ropekit.adapters.transformers`), called by
:func:`install_transforms` and by ``ropekit.register()``.
"""

from __future__ import annotations

import warnings
from typing import Callable, NamedTuple, Protocol, runtime_checkable

import torch

from ..adapters import transformers as hf
from ..adapters.transformers import attention_modules
from ..errors import UnsupportedModelError
from .kernels import pair_scores
from .masks import AttentionMask, counts_left_padding, without_unwritten_keys

PREFIX = "ropekit_"
KERNELS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flash_attention_4", "flex_attention")


class LayerAttention(Protocol):
    """Replaces one layer's attention: gets rotated queries/keys (keys include the cache) and the mask
    transformers built for the kernel, returns ``(out (B, Lq, H, D), weights or None)``; ``kernel`` is the
    function it replaces, for the parts where plain attention is right."""

    def __call__(self, module, query, key, value, attention_mask, *, scaling, dropout, kernel, **kwargs): ...


class PairLogits(NamedTuple):
    """What a layer attention does to each (query, key) pair of a block of query rows.

    ``logits`` (B, H, R, Lk): the logits it uses, in float32 (float64 for float64 inputs), scale included.
    ``kept`` bool, broadcastable to ``logits``: the keys that take part. The attention weights are
    ``exp(logits − log_normaliser)`` over the kept keys (0 elsewhere); ``log_normaliser`` (B, H, R) is ``None``
    when it is the log-sum-exp of the kept logits — the weights are then ``softmax`` over the kept keys.
    A row with no kept key has no weight at all.
    """

    logits: torch.Tensor
    kept: torch.Tensor
    log_normaliser: torch.Tensor | None = None


@runtime_checkable
class PairRule(Protocol):
    """A layer attention that can state its rule pair by pair (naive, O(rows × Lk), exact).

    Same arguments as :class:`LayerAttention` less ``value``/``dropout``/``kernel``, plus ``rows`` (int64
    indices into the ``Lq`` queries); ``attention_mask`` may be the kernel's raw mask or an
    :class:`~ropekit.attention.masks.AttentionMask` built for this call. Attention dropout is not part of
    the rule.
    """

    def pair_logits(self, module, query, key, attention_mask, *, scaling, rows, **kwargs) -> PairLogits: ...


def plain_pair_logits(query: torch.Tensor, key: torch.Tensor, attention_mask, *, scaling, rows: torch.Tensor,
                      **kwargs) -> PairLogits:
    """The rule of plain attention: ``scaling · q_i·k_j`` over the keys the mask allows."""
    mask = AttentionMask.for_call(attention_mask, query, key, kwargs)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    return PairLogits(pair_scores(query[:, :, rows], key) * scale, mask.rows(rows))


class QueryKeyTransform(Protocol):
    """Something that changes already-rotated queries/keys of one layer before the kernel runs."""

    def __call__(
        self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, position_ids: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


#: Methods that have said their left-padding warning in this process (once each).
_SAID: set[str] = set()
#: Methods that have said they apply no attention dropout (once each).
_NO_DROPOUT_SAID: set[str] = set()


def _say_if_padding_is_counted(method: str, attention_mask, position_ids, q_len: int, k_len: int) -> None:
    if counts_left_padding(attention_mask, position_ids, q_len, k_len):
        _SAID.add(method)
        warnings.warn(
            f"{method}: a left-padded row counts its padding in its positions (the model was called with an attention "
            "mask and no position_ids), and this method's positions are not shift-invariant, so the row's outputs "
            "differ from the row alone; pass position_ids = attention_mask.cumsum(-1) - 1, as generate does",
            stacklevel=4,
        )


def _make_attention(kernel: str) -> Callable:
    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        transforms = getattr(module, "ropekit_transforms", ())
        attend = getattr(module, "ropekit_attend", None)
        if transforms or attend is not None:
            # the methods read key positions as ending at the last query: a static cache's unwritten slots go
            key, value, attention_mask = without_unwritten_keys(key, value, attention_mask, query.shape[2], kernel)
            if (kernel.startswith("flash") and attention_mask is None and query.shape[0] == 1
                    and kwargs.get("cu_seq_lens_k") is None and query.shape[2] == key.shape[2] > 1):
                # a padding-free packed row: the flash kernel would find its documents itself; the methods' own
                # kernels read them from these kwargs (AttentionMask.for_call), so both attend within documents
                kwargs = {**kwargs, **(hf.packed_sequence_kwargs(kwargs.get("position_ids"), 1) or {})}
        method = getattr(attend, "reads_positions", None)
        if method and method not in _SAID and getattr(module, "layer_idx", 0) == 0:
            _say_if_padding_is_counted(method, attention_mask, kwargs.get("position_ids"), query.shape[2], key.shape[2])
        for transform in transforms:  # a transform that reads absolute positions (one layer checks)
            scaled_by = getattr(transform, "reads_positions", None)
            if scaled_by and scaled_by not in _SAID:
                _say_if_padding_is_counted(scaled_by, attention_mask, kwargs.get("position_ids"), query.shape[2],
                                           key.shape[2])
        if method and dropout:
            # these methods are inference-only and never drop attention weights; their exact fallback (inputs
            # inside the window) must not either, or short and long inputs of one training would differ
            if method not in _NO_DROPOUT_SAID:
                _NO_DROPOUT_SAID.add(method)
                warnings.warn(f"{method} applies no attention dropout (an inference-time method): the model's "
                              f"attention dropout {dropout:g} is not used; train with the plain model or a training "
                              "method", stacklevel=2)
            dropout = 0.0
        if transforms:
            position_ids = kwargs.get("position_ids")
            for transform in transforms:
                query, key = transform(module, query, key, position_ids)
        kernel_fn = hf.attention_kernel(module, kernel)
        if attend is not None:  # a method that replaces the attention computation itself
            return attend(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                          kernel=kernel_fn, **kwargs)
        return kernel_fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)

    attention.__name__ = f"{PREFIX}{kernel}_attention"
    attention.__doc__ = f"Apply ropekit's per-layer query/key transforms, then the '{kernel}' kernel."
    return attention


#: attention implementation name → the function ropekit registered under it in this process.
_REGISTERED: dict[str, Callable] = {}


def register_attention_functions() -> tuple[str, ...]:
    """Register ``ropekit_<kernel>`` (with the kernel's mask builder) for every kernel this transformers has, and
    return the names ropekit has registered. Idempotent: a name whose function is still registered is left alone."""
    for kernel in KERNELS:
        name = PREFIX + kernel
        if not hf.has_attention_kernel(kernel):
            continue
        known = _REGISTERED.get(name)
        if known is not None and hf.registered_attention(name) is known:
            continue
        _REGISTERED[name] = _make_attention(kernel)
        hf.register_attention(name, _REGISTERED[name], mask_like=kernel)
    return tuple(_REGISTERED)


def kernel_of(implementation: str | None) -> str:
    """The underlying kernel of an attention implementation name (``ropekit_sdpa`` → ``sdpa``)."""
    impl = implementation or "sdpa"
    return impl[len(PREFIX):] if impl.startswith(PREFIX) else impl


def attention_implementation_for(kernel: str) -> str:
    return PREFIX + kernel_of(kernel)


def install_transforms(
    model: torch.nn.Module,
    make: Callable[[int], tuple[QueryKeyTransform, ...]],
    make_attend: Callable[[int], LayerAttention | None] | None = None,
) -> int:
    """Attach ``make(layer_idx)`` (and ``make_attend(layer_idx)``) to every attention module and switch
    the model to ``ropekit_<kernel>``.

    Returns the number of attention modules changed. The current kernel (sdpa, eager, flash…) is kept.
    """
    register_attention_functions()
    modules = attention_modules(model)
    for module in modules:
        module.ropekit_transforms = tuple(make(module.layer_idx))
        module.ropekit_attend = make_attend(module.layer_idx) if make_attend is not None else None
    current = hf.attn_implementation(model.config)
    wanted = attention_implementation_for(current)
    model.set_attn_implementation(wanted)
    if hf.attn_implementation(model.config) != wanted:  # transformers only logs when a family cannot switch
        raise UnsupportedModelError(
            f"{type(model).__name__} did not take ropekit's attention ({wanted}): its attention does not run through "
            "transformers' AttentionInterface", "use a method that changes only the RoPE frequencies (pi, ntk, yarn, …)")
    return len(modules)
