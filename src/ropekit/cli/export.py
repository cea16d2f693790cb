"""``ropekit export DIR --format gguf|vllm``: hand an extended model to a serving engine."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import RopekitError
from .common import err, out, print_json

FORMATS = ("gguf", "vllm")
GGUF_DTYPES = ("f32", "f16", "bf16", "q8_0")  # ropekit.install.gguf_export.OUTTYPES, without importing torch


def export_cmd(
    directory: str = typer.Argument(..., help="A directory written by `ropekit extend` (or save_pretrained)."),
    fmt: str = typer.Option(..., "--format", help="gguf (a llama.cpp file) or vllm (how to serve the directory)."),
    out_path: Optional[Path] = typer.Option(None, "--out", "-o", help="GGUF file to write (default: DIR/model-OUTTYPE.gguf)."),
    dtype: Optional[str] = typer.Option(None, "--outtype", "--dtype", help="GGUF weight type: f32, f16 (default), "
                                        "bf16 or q8_0."),
    freeze_length: Optional[int] = typer.Option(None, "--freeze-length", min=1, help="Write a length-dependent "
                                                "method's frequencies as they are at this many tokens (GGUF)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing GGUF file."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
):
    """Write a GGUF for llama.cpp, or print the vLLM command that serves the directory as ropekit computes it."""
    if fmt not in FORMATS:
        raise RopekitError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}", "pass --format gguf or --format vllm")
    if fmt == "vllm":
        given = [flag for flag, value in (("--out", out_path), ("--freeze-length", freeze_length),
                                          ("--overwrite", overwrite), ("--outtype", dtype)) if value]
        if given:  # vLLM serves the directory itself: nothing is written
            hint = (" (a frozen length for vLLM is set when the directory is written: `ropekit extend … "
                    "--freeze-length N`)" if freeze_length else "")
            raise RopekitError(f"{', '.join(given)} applies to --format gguf; --format vllm writes no file",
                               f"drop it, or pass --format gguf{hint}")
        from ..install.vllm import vllm_serving

        serving = vllm_serving(directory)
        refusal = RopekitError(f"vLLM would not serve '{directory}' as ropekit computes it: {serving.why}",
                               "export a method vLLM computes exactly (see docs/methods.md)")
        if json_out:  # the plan on stdout either way; a refusal still exits 2 with its line, as without --json
            print_json({"exact": serving.exact, "why": serving.why, "max_model_len": serving.max_model_len,
                        "hf_overrides": serving.hf_overrides, "env": serving.env, "command": serving.command,
                        "note": serving.note})
        if not serving.exact:
            raise refusal
        if json_out:
            return
        out.print(serving.command, soft_wrap=True, highlight=False)
        if serving.note:
            err.print(f"note: {serving.note}", highlight=False)
        return
    dtype = dtype if dtype is not None else "f16"
    if dtype not in GGUF_DTYPES:
        raise RopekitError(f"--outtype {dtype!r} is not one of {', '.join(GGUF_DTYPES)}", "pass e.g. --outtype f16")
    if out_path is None and not Path(directory).is_dir():  # a built-in name, a .gguf or a hub id: no folder to write in
        from ..models.loading import resolve_model

        resolve_model(directory)  # a path that does not exist: said as such
        raise RopekitError(f"'{directory}' is not a directory to write the GGUF into",
                           f"pass --out FILE.gguf (e.g. --out model-{dtype}.gguf)")
    if out_path is not None and Path(out_path).suffix.lower() != ".gguf":
        # a GGUF is one file named .gguf: any other name (the source's model.safetensors, a directory) is refused
        raise RopekitError(f"--out '{out_path}' is not a .gguf file name", "pass e.g. --out model-f16.gguf")
    target = out_path or Path(directory) / f"model-{dtype}.gguf"
    from ..install.gguf_export import saved_freeze_length, write_gguf
    from ..runtime.atomic import check_target

    check_target(target, kind="file")  # a directory, a FIFO or an unwritable place, before the model loads
    from .common import check_gguf_replacement, load_model

    check_gguf_replacement(target, overwrite)

    freeze_length = saved_freeze_length(directory, freeze_length)  # an export saved frozen keeps its length
    loaded = load_model(directory)
    gguf_source = loaded.path if loaded.source in ("gguf", "smollm2") else None
    report = write_gguf(loaded.model, loaded.tokenizer, target, outtype=dtype, freeze_length=freeze_length,
                        tokenizer_gguf=gguf_source, overwrite=overwrite)
    print_gguf_report(report, json_out)


def print_gguf_report(report: dict, json_out: bool) -> None:
    """What ``write_gguf`` wrote: JSON, or two lines (the file, then its RoPE keys and vocabulary)."""
    if json_out:
        print_json(report)
        return
    out.print(f"[green]wrote[/] {report['path']} ({report['outtype']}, context {report['context_length']})")
    out.print(f"llama.cpp RoPE: {report['rope']}; vocabulary: {report['vocabulary']}", soft_wrap=True, highlight=False)
