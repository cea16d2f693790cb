"""``ropekit export DIR --format gguf|vllm``: hand an extended model to a serving engine."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import RopekitError
from .common import out, print_json

FORMATS = ("gguf", "vllm")
GGUF_DTYPES = ("f32", "f16", "bf16", "q8_0")


def export_cmd(
    directory: str = typer.Argument(..., help="A directory written by `ropekit extend` (or save_pretrained)."),
    fmt: str = typer.Option(..., "--format", help="gguf (a llama.cpp file) or vllm (how to serve the directory)."),
    out_path: Optional[Path] = typer.Option(None, "--out", "-o", help="GGUF file to write (default: DIR/model-DTYPE.gguf)."),
    dtype: str = typer.Option("f16", "--dtype", help="GGUF weight type: f32, f16, bf16 or q8_0."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing GGUF file."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
):
    """Write a GGUF for llama.cpp, or print the vLLM command that serves the directory as ropekit computes it."""
    if fmt not in FORMATS:
        raise RopekitError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}", "pass --format gguf or --format vllm")
    if fmt == "vllm":
        from ..install.vllm import vllm_serving

        serving = vllm_serving(directory)
        if json_out:
            print_json({"exact": serving.exact, "why": serving.why, "max_model_len": serving.max_model_len,
                        "hf_overrides": serving.hf_overrides, "command": serving.command})
            return
        if not serving.exact:
            raise RopekitError(f"vLLM would not serve '{directory}' as ropekit computes it: {serving.why}",
                               "export a method vLLM computes exactly (see the README's engine table)")
        out.print(serving.command, soft_wrap=True, highlight=False)
        return
    if dtype not in GGUF_DTYPES:
        raise RopekitError(f"--dtype {dtype!r} is not one of {', '.join(GGUF_DTYPES)}", "pass e.g. --dtype f16")
    target = out_path or Path(directory) / f"model-{dtype}.gguf"
    if target.exists() and not overwrite:
        raise RopekitError(f"'{target}' exists", "pass another --out, or --overwrite")
    from ..install.gguf import write_gguf
    from .common import load_model

    loaded = load_model(directory)
    written = write_gguf(loaded.model, loaded.tokenizer, target, dtype=dtype)
    if json_out:
        print_json({"path": str(written), "dtype": dtype})
    else:
        out.print(f"[green]wrote[/] {written}")
