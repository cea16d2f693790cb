"""Searches over a method's parameters that end in an exported model: LongRoPE's evolutionary factor search."""

from .longrope import SearchSettings, run_search

__all__ = ["SearchSettings", "run_search"]
