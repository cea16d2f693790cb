"""Freezing a length-dependent method at one input length for an export that holds one set of frequencies
(a config.json written as ``longrope``, a GGUF): the lengths at which a frozen export would not be what was asked."""

from __future__ import annotations

from typing import Any

import torch

from ..core.schema import MAX_POSITIONS
from ..errors import InvalidParameterError
from .model_rope import rotary_modules


def check_freeze_length(model, m, info, params: dict[str, Any], freeze_length: int) -> None:
    """Refuse a ``freeze_length`` that would export something other than what the user meant: one at which the
    installed frequencies are still the base model's (the unextended model, written without a word), and one given
    for a method whose frequencies never depend on the length (a config.json would hold a longrope copy of its exact
    native form, a GGUF the same frequencies with its declared context changed to that length)."""
    kind, _ = m.length_dependence(info, params)
    if freeze_length > MAX_POSITIONS:
        raise InvalidParameterError(f"freeze_length {freeze_length} is past {MAX_POSITIONS:,} tokens, the most positions "
                                    "ropekit computes", "freeze at the target length")
    if kind == "static":
        raise InvalidParameterError(f"freeze_length changes nothing for {m.name} with these parameters: its frequencies "
                                    "do not depend on the input length", "leave the freeze length out (--freeze-length, or "
                                    "freeze_length in Python)")
    rotary = rotary_modules(model)[0][2]
    frozen, frozen_factor = m.frequencies_at(rotary, int(freeze_length), info.layer_type)
    base, base_factor = m.base(info, int(freeze_length), device=frozen.device)
    if frozen_factor == base_factor and torch.equal(frozen.to(torch.float64), base.to(torch.float64)):
        raise InvalidParameterError(f"at {freeze_length} tokens {m.name} computes the base model's own frequencies, so "
                                    "the export would be the model before it", "freeze it at a longer length "
                                    "(--freeze-length, or freeze_length in Python), e.g. the target length")
