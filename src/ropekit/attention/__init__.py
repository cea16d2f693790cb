"""Custom attention functions registered with transformers' ``AttentionInterface``.

ropekit never copies a model file. Attention-side methods attach small *transforms* (per-head rotation,
logit scale) and optionally a *layer attention* (Self-Extend, LM-Infinite, S²-Attn, Landmark) to each
attention module; the ``ropekit_<kernel>`` attention functions apply them to the already-projected queries
and keys, or hand the whole computation to the layer attention, which falls back to the kernel the model
was using (sdpa, eager, flash…) where plain attention is right.
"""

from .interface import KERNELS, attention_implementation_for, install_transforms, kernel_of
from .per_head_rope import PerHeadRotation
from .scaled_logits import QueryLogitScale

__all__ = [
    "KERNELS",
    "PerHeadRotation",
    "QueryLogitScale",
    "attention_implementation_for",
    "install_transforms",
    "kernel_of",
]
