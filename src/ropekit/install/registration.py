"""``ropekit.register()``: make transformers know ropekit's rope types and attention functions.

Importing ropekit changes nothing in transformers. A model can only be built with rope type ``ropekit_<name>``
or switched to attention ``ropekit_<kernel>`` once these are in transformers' registries, so ``extend`` and
``load`` call :func:`register` themselves; user code that loads a ropekit export with plain
``AutoModelForCausalLM.from_pretrained`` calls it first. Every process registers for itself: a study worker
(a Ray actor or a spawned process) starts empty and registers on its first ``extend``/``load``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..attention.interface import register_attention_functions
from .rope_types import register_rope_types


@dataclass(frozen=True)
class Registration:
    """What ropekit has registered with transformers in this process."""

    #: transformers rope types, ``ropekit_<method>`` (each with its rope-parameter validator)
    rope_types: tuple[str, ...]
    #: attention implementations, ``ropekit_<kernel>`` (each with its kernel's mask builder)
    attention: tuple[str, ...]


def register() -> Registration:
    """Register every method as transformers rope type ``ropekit_<name>`` and ``ropekit_<kernel>`` attention for
    every kernel transformers has, and return what is registered.

    Idempotent: calling it again changes nothing (the same function objects stay in transformers' registries)
    and returns an equal :class:`Registration`; a method added to the registry since is registered then.
    """
    return Registration(rope_types=register_rope_types(), attention=register_attention_functions())
