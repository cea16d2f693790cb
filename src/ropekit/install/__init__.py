"""Installing methods into models and getting them out again: extend, uninstall, inspect, save, load.

Importing this package registers nothing with transformers: :func:`register` (``ropekit.register()``) does,
and ``extend`` and ``load`` call it (:mod:`.registration`).
"""

from .export import ROPE_FORMATS, save_pretrained
from .installer import extend, resolve_params, uninstall
from .inspect import inspect_model
from .load import load
from .model_rope import installed, rope_info, rotary_modules, text_config
from .registration import Registration, register
from .rope_types import ROPE_TYPE_PREFIX, register_rope_types, transformers_builds

__all__ = [
    "ROPE_FORMATS",
    "ROPE_TYPE_PREFIX",
    "Registration",
    "extend",
    "inspect_model",
    "installed",
    "load",
    "register",
    "register_rope_types",
    "resolve_params",
    "rope_info",
    "rotary_modules",
    "save_pretrained",
    "text_config",
    "transformers_builds",
    "uninstall",
]
