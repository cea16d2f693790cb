"""ropekit: extend, train and measure the context window of RoPE language models.

>>> import ropekit
>>> model = ropekit.extend(model, "yarn", factor=4)          # or target_length=32768
>>> ropekit.save_pretrained(model, "out/")                   # plain transformers loads it where it can
>>> model = ropekit.load("out/")                             # every method restored
"""

__version__ = "0.1.0"

from .errors import RopekitError  # noqa: E402
from .methods import get_method, list_methods  # noqa: E402
from .patching import extend, inspect_model, installed, load, rope_info, save_pretrained  # noqa: E402

__all__ = [
    "RopekitError",
    "extend",
    "get_method",
    "inspect_model",
    "installed",
    "list_methods",
    "load",
    "rope_info",
    "save_pretrained",
]
