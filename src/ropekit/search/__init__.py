"""Searches that evaluate a model: the driver of LongRoPE's evolutionary factor search (objective, resumable
store, export). Each method's search algorithm lives beside its unit as ``methods/<method>_search.py``
(:mod:`ropekit.methods.longrope_search`, :mod:`ropekit.methods.harpe_search`); this package only runs the searches
that need a model and data to score candidates."""

from .longrope import SearchSettings, run_search

__all__ = ["SearchSettings", "run_search"]
