"""ropekit: extend, train and measure the context window of RoPE language models.

>>> import ropekit
>>> model = ropekit.extend(model, "yarn", factor=4)          # or target_length=32768
>>> ropekit.save_pretrained(model, "out/")                   # plain transformers loads it where it can
>>> model = ropekit.load("out/")                             # every method restored
>>> loaded = ropekit.load_model("smollm2")                   # built-ins, directories, .gguf files, hub ids
>>> ropekit.register()        # before AutoModelForCausalLM.from_pretrained("out/") of a ropekit-only export

The public names are imported on first use, so ``import ropekit`` (and ``ropekit --help``) does not load
torch or transformers until something needs them. Nothing is registered with transformers on import:
``ropekit.register()`` does (``extend`` and ``load`` call it).
"""

from __future__ import annotations

import importlib

from ._version import __version__ as __version__  # re-exported: ropekit.__version__

#: Public name → the module that defines it.
_PUBLIC = {
    "RopekitError": "ropekit.errors",
    "get_method": "ropekit.methods",
    "list_methods": "ropekit.methods",
    "extend": "ropekit.install",
    "uninstall": "ropekit.install",
    "inspect_model": "ropekit.install",
    "installed": "ropekit.install",
    "load": "ropekit.install",
    "load_model": "ropekit.models.loading",
    "register": "ropekit.install",
    "rope_info": "ropekit.install",
    "save_pretrained": "ropekit.install",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'ropekit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
