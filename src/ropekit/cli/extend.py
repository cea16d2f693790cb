"""``ropekit extend MODEL --method NAME --out DIR``: install a method and save the model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..errors import RopekitError
from .common import (MODEL_HELP, AttnOpt, DeviceMapOpt, DeviceOpt, DtypeOpt, check_gguf_replacement, load_model, out,
                     parse_params, print_json)


def _check_out_dir(path: Path, overwrite: bool) -> None:
    from ..runtime.atomic import check_target

    # a FIFO, a read-only filesystem, a parent that is a file, the current directory: before loading
    check_target(path, kind="dir", whole=True)
    if path.exists() and not path.is_dir():
        raise RopekitError(f"--out '{path}' exists and is a file", "pass a directory path")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise RopekitError(f"--out '{path}' exists and is not empty", "pass a new directory, or --overwrite")


FORMATS = ("transformers", "gguf")
GGUF_OUTTYPES = ("f32", "f16", "bf16", "q8_0")


def _gguf_target(out: Path, outtype: str, overwrite: bool) -> Path:
    """``--out`` as a GGUF file: the path itself when it ends in .gguf, else DIR/model-OUTTYPE.gguf."""
    target = out if out.suffix.lower() == ".gguf" else out / f"model-{outtype}.gguf"
    if out.suffix.lower() != ".gguf" and out.exists() and not out.is_dir():
        raise RopekitError(f"--out '{out}' exists and is a file", "pass a .gguf path or a directory")
    if target.is_dir():
        raise RopekitError(f"--out '{target}' is a directory", "pass a .gguf file path")
    check_gguf_replacement(target, overwrite)
    from ..runtime.atomic import check_target

    check_target(target, kind="file")
    return target


def _extend_to_gguf(model, method, out_dir, factor, target_length, params, types, freeze_length, outtype, overwrite,
                    json_out, device, dtype, attn, device_map) -> None:
    """``extend --format gguf``: install the method and write one GGUF (nothing else; nothing at all on error)."""
    from ..install import extend
    from ..install.gguf_export import write_gguf
    from .export import print_gguf_report

    if outtype not in GGUF_OUTTYPES:
        raise RopekitError(f"--outtype {outtype!r} is not one of {', '.join(GGUF_OUTTYPES)}", "pass e.g. --outtype f16")
    target = _gguf_target(out_dir, outtype, overwrite)
    loaded = load_model(model, device, dtype, attn, device_map)
    extend(loaded.model, method, factor=factor, target_length=target_length, layer_types=types, **params)
    # a model loaded from a GGUF keeps that file's own vocabulary (llama.cpp's converter wrote it)
    source = loaded.path if loaded.source in ("gguf", "smollm2") else None
    report = write_gguf(loaded.model, loaded.tokenizer, target, outtype=outtype, freeze_length=freeze_length,
                        tokenizer_gguf=source, overwrite=overwrite)
    report["params"] = loaded.model.config.ropekit["params"]
    print_gguf_report(report, json_out)


def extend_cmd(
    model: str = typer.Argument(..., help=MODEL_HELP),
    method: str = typer.Option(..., "--method", "-m", help="Method name (see `ropekit methods`)."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="Directory to write the extended model to (with --format "
                                 "gguf: the .gguf file, or a directory that gets model-OUTTYPE.gguf)."),
    factor: Optional[float] = typer.Option(None, "--factor", "-f", help="Scale factor s (target = s × window)."),
    target_length: Optional[int] = typer.Option(None, "--target-length", "-t", help="Target context length in tokens."),
    param: Optional[list[str]] = typer.Option(None, "--param", "-p", help="Method parameter key=value (repeatable)."),
    rope_format: Optional[str] = typer.Option(None, "--rope-format", help="How config.json writes the RoPE: auto (the "
                                              "default: the first exact one of native, longrope, ropekit), native, "
                                              "longrope or ropekit."),
    freeze_length: Optional[int] = typer.Option(None, "--freeze-length", min=1, help="Write a length-dependent "
                                                "method's frequencies as they are at this many tokens (longrope)."),
    layer_types: Optional[str] = typer.Option(None, "--layer-types", help="Models with RoPE per layer type "
                                              "(Gemma 3): the layer types to extend, comma-separated (default: the "
                                              "full-attention layers)."),
    fmt: str = typer.Option("transformers", "--format", help="transformers (a model directory) or gguf (one file "
                            "for llama.cpp; Llama, Mistral, Qwen2 and Qwen3 models)."),
    outtype: Optional[str] = typer.Option(None, "--outtype", help="GGUF weight type: f32, f16 (default), bf16 or q8_0 "
                                          "(--format gguf)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing model directory at --out, all of its contents (a non-empty directory "
                                   "without config.json is never replaced)."),
    json_out: bool = typer.Option(False, "--json", help="Print the export report as JSON."),
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
):
    """Install a method into a model and save it (plain-transformers loadable wherever possible)."""
    from .catalog import check as check_method

    params = parse_params(param)
    if "target_length" in params:  # `--param target_length=N`, as `ropekit eval` and training YAML take it
        if target_length is not None:
            raise RopekitError("target length given twice (--target-length and --param target_length)",
                               "pass only one of them")
        target_length = params.pop("target_length")  # still text: converted (and checked) where the factor is set
    check_method(method, params)  # a typo is one line, before torch and the model load
    if "factor" in params:  # `--param factor=S` names the method's own parameter: the same as `--factor S`
        if factor is not None:
            raise RopekitError("factor given twice (--factor and --param factor)", "pass only one of them")
        factor = params.pop("factor")  # still a string: the method's Param converts it like any --param
    from ..install import ROPE_FORMATS, extend, save_pretrained

    if rope_format is not None and rope_format not in ROPE_FORMATS:
        raise RopekitError(f"--rope-format {rope_format!r} is not one of {', '.join(ROPE_FORMATS)}", "pass e.g. --rope-format auto")
    types = None
    if layer_types is not None:
        types = [t.strip() for t in layer_types.split(",") if t.strip()]
        if not types:
            raise RopekitError(f"--layer-types {layer_types!r} names no layer type",
                               "pass e.g. --layer-types full_attention, or leave it out")
    if fmt not in FORMATS:
        raise RopekitError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}", "pass --format transformers or gguf")
    if fmt == "gguf":
        if rope_format is not None:  # it would be silently unused
            raise RopekitError("--rope-format says how config.json writes the RoPE; a GGUF file has llama.cpp's keys",
                               "drop --rope-format, or pass --format transformers")
        _extend_to_gguf(model, method, out_dir, factor, target_length, params, types, freeze_length, outtype or "f16",
                        overwrite, json_out, device, dtype, attn, device_map)
        return
    if outtype is not None:  # a model directory's weights would silently keep another type
        raise RopekitError("--outtype is the GGUF weight type and applies only to --format gguf",
                           "for a transformers directory pass --dtype float16 (or bfloat16, float32)")
    _check_out_dir(out_dir, overwrite)
    loaded = load_model(model, device, dtype, attn, device_map)
    # extend is all or nothing and save_pretrained refuses a format before writing: a mistake leaves no --out
    extend(loaded.model, method, factor=factor, target_length=target_length, layer_types=types, **params)
    # the weights in the dtype asked for, else the source's precision (a GGUF's class: ropekit.install.weights)
    if dtype == "auto" and loaded.source in ("gguf", "smollm2"):
        from ..install.weights import GGUF_FILE_TYPE_ATTR

        setattr(loaded.model, GGUF_FILE_TYPE_ATTR, loaded.info.get("gguf_file_type"))
    report = save_pretrained(loaded.model, out_dir, tokenizer=loaded.tokenizer, rope_format=rope_format or "auto",
                             freeze_length=freeze_length, dtype=None if dtype == "auto" else dtype,
                             base_model=loaded.path if loaded.source in ("hub", "gguf", "smollm2") else None)
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
