"""``ropekit extend MODEL --method NAME --out DIR``: install a method and save the model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..errors import RopekitError
from .common import MODEL_HELP, AttnOpt, DeviceMapOpt, DeviceOpt, DtypeOpt, load_model, out, parse_params, print_json


def _check_out_dir(path: Path, overwrite: bool) -> None:
    if path.exists() and not path.is_dir():
        raise RopekitError(f"--out '{path}' exists and is a file", "pass a directory path")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise RopekitError(f"--out '{path}' exists and is not empty", "pass a new directory, or --overwrite")


def extend_cmd(
    model: str = typer.Argument(..., help=MODEL_HELP),
    method: str = typer.Option(..., "--method", "-m", help="Method name (see `ropekit methods`)."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Directory to write the extended model to."),
    factor: Optional[float] = typer.Option(None, "--factor", "-f", help="Scale factor s (target = s × window)."),
    target_length: Optional[int] = typer.Option(None, "--target-length", "-t", help="Target context length in tokens."),
    param: Optional[list[str]] = typer.Option(None, "--param", "-p", help="Method parameter key=value (repeatable)."),
    rope_format: str = typer.Option("auto", "--rope-format", help="How config.json writes the RoPE: auto (the first "
                                    "exact one of native, longrope, ropekit), native, longrope or ropekit."),
    freeze_length: Optional[int] = typer.Option(None, "--freeze-length", min=1, help="Write a length-dependent "
                                                "method's frequencies as they are at this many tokens (longrope)."),
    layer_types: Optional[str] = typer.Option(None, "--layer-types", help="Models with RoPE per layer type "
                                              "(Gemma 3): the layer types to extend, comma-separated (default: the "
                                              "full-attention layers)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Allow writing into a non-empty --out directory."),
    json_out: bool = typer.Option(False, "--json", help="Print the export report as JSON."),
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
):
    """Install a method into a model and save it (plain-transformers loadable wherever possible)."""
    from ..install import ROPE_FORMATS, extend, save_pretrained

    params = parse_params(param)
    if rope_format not in ROPE_FORMATS:
        raise RopekitError(f"--rope-format {rope_format!r} is not one of {', '.join(ROPE_FORMATS)}", "pass e.g. --rope-format auto")
    types = [t.strip() for t in layer_types.split(",") if t.strip()] if layer_types else None
    _check_out_dir(out_dir, overwrite)
    loaded = load_model(model, device, dtype, attn, device_map)
    # extend is all or nothing and save_pretrained refuses a format before writing: a mistake leaves no --out
    extend(loaded.model, method, factor=factor, target_length=target_length, layer_types=types, **params)
    report = save_pretrained(loaded.model, out_dir, tokenizer=loaded.tokenizer, rope_format=rope_format,
                             freeze_length=freeze_length)
    report["source"] = {"kind": loaded.source, "path": str(loaded.path)}
    report["params"] = loaded.model.config.ropekit["params"]
    if json_out:
        print_json(report)
        return
    out.print(f"[green]wrote[/] {out_dir} — {report['method']} {json.dumps(report['params'])}")
    if report["transformers"]:
        kind = report["rope_parameters"].get("rope_type", "per layer type")
        out.print(f"plain transformers loads it as rope_type '{kind}' ({report['format']})"
                  + (" and vLLM can serve it" if report["vllm"] else " (vLLM: not the same model)"))
    else:
        out.print("ropekit-only method: load it with [bold]ropekit.load(path)[/] (plain transformers refuses it loudly)")
