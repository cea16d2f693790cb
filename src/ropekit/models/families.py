"""Which method each model family takes: the capability check run over the tiny model of every family.

The family table in docs/methods.md is :func:`support_markdown`'s output (a test keeps the two equal), and
``ropekit methods --families`` prints the same table.
"""

from __future__ import annotations

from ..install.capabilities import model_features, why_not
from ..install.model_rope import rope_info
from ..methods import list_methods
from .tiny import FAMILIES, SHIPPED, build_tiny_model


def support_rows() -> list[dict]:
    """One row per family (plain, then as shipped): its features and, per method, ``""`` (applies) or the feature
    that rules it out."""
    rows = []
    for name in list(FAMILIES) + list(SHIPPED):
        model = build_tiny_model(name, num_layers=4)
        features = model_features(model)
        info = rope_info(model)
        cells = {}
        for method in list_methods():
            refusal = why_not(method, info, features)
            cells[method.name] = refusal.feature if refusal else ""
        what = FAMILIES.get(name) or f"{SHIPPED[name][0]} with its shipped '{features.rope_type}' scaling"
        rows.append({"family": name, "features": what, "methods": cells})
    return rows


def support_markdown() -> str:
    """The support table as Markdown: ✓ where the method applies, else the feature that rules it out."""
    methods = [m.name for m in list_methods()]
    lines = ["| family | " + " | ".join(f"`{m}`" for m in methods) + " |",
             "|---|" + "|".join(":-:" for _ in methods) + "|"]
    for row in support_rows():
        cells = [("✓" if not row["methods"][m] else row["methods"][m]) for m in methods]
        lines.append(f"| `{row['family']}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)
