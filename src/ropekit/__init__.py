"""ropekit: extend, train and measure the context window of RoPE language models."""

__version__ = "0.1.0"
