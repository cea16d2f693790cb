"""Custom attention functions registered with transformers' ``AttentionInterface``.

ropekit never copies a model file. Attention-side methods attach small *transforms* to each attention
module (``module.ropekit_transforms``); the ``ropekit_<kernel>`` attention functions apply them to the
already-projected queries and keys and then call the kernel the model was using (sdpa, eager, flash…).
"""

from .interface import KERNELS, attention_implementation_for, install_transforms, kernel_of

#: Layer-attention factories by name: ``factory(info, rotary, layer_idx, **args) -> LayerAttention``, where
#: ``rotary()`` returns the model's current shared inverse frequencies. Attention-side methods register here.
LAYER_ATTENTIONS: dict = {}
from .per_head_rope import PerHeadRotation
from .scaled_logits import QueryLogitScale

__all__ = [
    "LAYER_ATTENTIONS",
    "KERNELS",
    "PerHeadRotation",
    "QueryLogitScale",
    "attention_implementation_for",
    "install_transforms",
    "kernel_of",
]
