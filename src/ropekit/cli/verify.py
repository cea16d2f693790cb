"""``ropekit verify DIR --engine vllm|llamacpp|transformers``: run an export in an engine and compare with ropekit."""

from __future__ import annotations

from typing import Optional

import typer

from .common import err, out, print_json


def verify_cmd(
    directory: str = typer.Argument(..., help="A directory written by `ropekit extend` (or save_pretrained)."),
    engine: str = typer.Option(..., "--engine", "-e", help="vllm, llamacpp, transformers (plain, without ropekit) or transformers4 (4.57, as stacks pinned to 4.x read the directory)."),
    length: Optional[int] = typer.Option(None, "--length", min=2, help="Tokens of text to compare (default: 1.5× "
                                         "the original window, capped at the extended one; with --freeze-length, "
                                         "that length)."),
    tolerance: Optional[float] = typer.Option(None, "--tolerance", min=0.0, help="Largest max |Δ log p| that passes "
                                              "(default per engine: transformers 1e-4, vLLM 1e-3, llama.cpp 1e-2)."),
    python: Optional[str] = typer.Option(None, "--python", help="The engine environment's python (default: the one "
                                         "`ropekit engines install` made; $ROPEKIT_ENGINES moves them)."),
    threads: int = typer.Option(2, "--threads", min=1, help="CPU threads for the engine."),
    freeze_length: Optional[int] = typer.Option(None, "--freeze-length", min=1, help="llama.cpp: write a "
                                                "length-dependent method's frequencies as at this many tokens "
                                                "(default: the export's own)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
):
    """Run an exported model in an engine and compare its per-token log-probabilities with ropekit's own."""
    from ..engines.environments import engine_python, get_engine

    engine_python(get_engine(engine), python)  # an engine that is not installed: one line, before torch loads
    from ..engines.verify import verify  # the function: the package attribute may be the submodule

    report = verify(directory, engine, length=length, tolerance=tolerance, python=python, threads=threads,
                    freeze_length=freeze_length)
    if json_out:
        print_json(report.as_dict())
    else:
        verdict = "[green]PASS[/]" if report.passed else "[red]FAIL[/]"
        out.print(f"{verdict} {report.engine_version}: {report.tokens} tokens (original window {report.original_window}); "
                  f"max |Δ log p| {report.max_abs_diff:.2e}, mean {report.mean_abs_diff:.2e}, tolerance {report.tolerance:.0e}"
                  f" — {report.engine_seconds:.1f} s in the engine")
        if report.details.get("gguf_rope"):
            out.print(f"GGUF RoPE: {report.details['gguf_rope']}", soft_wrap=True, highlight=False)
        if report.details.get("command"):
            out.print(f"serve it with: {report.details['command']}", soft_wrap=True, highlight=False)
    if not report.passed:
        if json_out:  # stdout holds the JSON: the verdict still needs its line for a person or a CI log
            err.print(f"FAIL: max |Δ log p| {report.max_abs_diff:.2e} > tolerance {report.tolerance:.0e}", highlight=False)
        raise typer.Exit(1)
