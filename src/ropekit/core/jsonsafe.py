"""JSON that strict readers accept."""

from __future__ import annotations

import math


def json_safe(value):
    """``value`` with non-finite floats as strings (``"inf"``, ``"nan"``), so that strict JSON readers accept it."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    return value
