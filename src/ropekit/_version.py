"""The package version: a leaf module that every layer may import (``ropekit.__version__`` re-exports it).

Kept equal to ``version`` in pyproject.toml (tests/test_layers.py checks it)."""

__version__ = "0.1.0"
