"""``ropekit inspect MODEL``: a model's architecture, RoPE settings, and which methods apply to it."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from .common import MODEL_HELP, AttnOpt, DeviceMapOpt, DeviceOpt, DtypeOpt, load_model, out, print_json

#: The facts shown in the table, in this order (``--json`` prints every fact).
_FACTS = ("architecture", "model_type", "rope_type", "rope_theta", "window", "original_window", "head_dim",
          "rotary_dim", "num_layers", "num_heads", "num_kv_heads", "parameters", "attn_implementation")


def inspect_cmd(
    model: str = typer.Argument(..., help=MODEL_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print the facts as JSON."),
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
):
    """Show a model's architecture, RoPE settings and which methods apply."""
    from ..install import inspect_model

    loaded = load_model(model, device, dtype, attn, device_map)
    facts = inspect_model(loaded.model)
    facts["source"] = {"kind": loaded.source, "path": str(loaded.path)}
    if json_out:
        print_json(facts)
        return
    table = Table(title=f"{model}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for key in _FACTS:
        value = facts[key]
        if key == "rope_type" and isinstance(value, dict):
            value = ", ".join(f"{t}: {v}" for t, v in value.items())
        table.add_row(key, f"{value:,}" if isinstance(value, int) and key == "parameters" else str(value))
    if facts.get("rope_scaling"):
        scaling = {k: v for k, v in facts["rope_scaling"].items() if not isinstance(v, list)}
        table.add_row("existing scaling", json.dumps(scaling))
        table.add_row("effective window", f"{facts['effective_window']:,} tokens (methods extend from here)")
    if facts.get("layer_type"):
        table.add_row("RoPE per layer type", f"extends the '{facts['layer_type']}' layers by default")
    features = facts.get("features") or {}
    notable = {"attention_softcap": features.get("attention_softcap"), "attention_sinks": features.get("attention_sinks"),
               "sliding_window_layers": features.get("sliding_window_layers"),
               "rotary_layout": features.get("rotary_layout") if features.get("rotary_layout") != "half" else None,
               "rotary_position": features.get("rotary_position") if features.get("rotary_position") != "leading" else None}
    for key, value in notable.items():
        if value:
            table.add_row(key.replace("_", " "), str(value))
    if facts["extended_with"]:
        ext = facts["extended_with"]
        table.add_row("extended with", f"{ext['method']} {json.dumps(ext['params'])}")
        if ext.get("reach"):
            table.add_row("reach", f"{ext['reach']:,} tokens (inputs past it are outside what the method covers)")
    out.print(table)
    methods = Table(title="methods")
    methods.add_column("method", style="cyan")
    methods.add_column("applies")
    methods.add_column("exports to")
    for m in facts["methods"]:
        exports = ", ".join(m["exports_to"]) or ("ropekit only" if m["applies"] else "—")
        methods.add_row(m["name"], "yes" if m["applies"] else f"no: {m['why_not']}", exports)
    out.print(methods)
