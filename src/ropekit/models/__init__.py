"""Model construction and loading: the built-in tiny models and the MODEL argument (directory, GGUF, hub id)."""
