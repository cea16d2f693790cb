"""What ``save_pretrained`` writes the weights as: a model loaded from a GGUF saves dequantized, in the dtype asked
for or, by default, in its source's precision class — or is refused in one line before anything is written.

transformers loads a GGUF either dequantized into ordinary float tensors (architectures its legacy GGUF path
handles) or with the weights left packed in GGUF blocks (``GgufHfQuantizer`` with ``dequantize=False`` on the
architectures its newer path supports); either way it keeps the quantizer attached and ``save_pretrained``
refuses the model ("not serializable"). Dequantized weights are plain tensors: they save once the quantizer is set
aside. Packed ones are refused, naming the loading that dequantizes them.

The default precision follows the file (``general.file_type``, llama.cpp's ``LlamaFileType``): F32 → float32,
F16 → float16, BF16 → bfloat16, and a quantized file (Q4_1, Q8_0, …) → float16 — its dequantized values are small
integers times float16 block scales (and offsets), which float16 holds more closely than bfloat16; float32 would
double the size for nothing the file had.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import InvalidParameterError, UnsupportedModelError

#: The dtype names ``save_pretrained(dtype=…)`` accepts.
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

#: Attribute ropekit's GGUF loader sets on the model: the file's ``general.file_type``.
GGUF_FILE_TYPE_ATTR = "_ropekit_gguf_file_type"


@dataclass(frozen=True)
class WeightsPlan:
    """``dtype`` to write the floating-point weights in (``None``: as they are) and whether a GGUF quantizer is set
    aside while saving; ``why`` says where the dtype came from."""

    dtype: torch.dtype | None
    set_aside_quantizer: bool
    why: str


def resolve_dtype(dtype: Any) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key in DTYPES:
        return DTYPES[key]
    raise InvalidParameterError(f"unknown dtype '{dtype}' to save the weights in", "use float32, bfloat16 or float16")


def gguf_precision(file_type: int | None) -> torch.dtype | None:
    """The precision class of a GGUF's ``general.file_type`` (module doc); None when unknown."""
    if file_type is None:
        return None
    from gguf import LlamaFileType

    return {int(LlamaFileType.ALL_F32): torch.float32, int(LlamaFileType.MOSTLY_F16): torch.float16,
            int(LlamaFileType.MOSTLY_BF16): torch.bfloat16}.get(int(file_type), torch.float16)


def _file_type_of(path: str | None) -> int | None:
    """``general.file_type`` of the GGUF at ``path`` (the gguf package's reader), or None."""
    if not path or not Path(path).is_file():
        return None
    try:
        from gguf import GGUFReader

        field = GGUFReader(path).fields.get("general.file_type")
        return int(field.parts[field.data[0]][0]) if field is not None else None
    except Exception:  # an unreadable header: the precision is then unknown, not an error
        return None


def plan_weights(model, dtype: Any = None) -> WeightsPlan:
    """How ``model``'s weights are written; a model that cannot be saved is refused in one line (nothing written)."""
    wanted = resolve_dtype(dtype)
    quantizer = getattr(model, "hf_quantizer", None)
    config = getattr(quantizer, "quantization_config", None)
    method = getattr(getattr(config, "quant_method", None), "value", getattr(config, "quant_method", None))
    is_gguf = str(method).lower() == "gguf"
    if quantizer is not None and not is_gguf and not quantizer.is_serializable():
        raise UnsupportedModelError(f"the model is quantized with {method}, which transformers cannot save",
                                    "load it unquantized (or in a dtype) and extend that")
    if is_gguf and getattr(quantizer, "packed_modules", None):
        raise UnsupportedModelError(
            "the model's weights are packed GGUF blocks (transformers loaded the GGUF without dequantizing)",
            "load it with ropekit.load_model(path), or from_pretrained(..., "
            "quantization_config=GgufConfig(dequantize=True))")
    if wanted is not None:
        return WeightsPlan(wanted, is_gguf, "asked for")
    file_type = getattr(model, GGUF_FILE_TYPE_ATTR, None)
    if file_type is None and is_gguf:  # the file's name, in the directory from_pretrained was given
        name = getattr(config, "gguf_file", None)
        folder = getattr(model, "name_or_path", None) or ""
        file_type = _file_type_of(str(Path(folder) / name) if name and not Path(name).is_absolute() else name)
    source = gguf_precision(file_type)
    if source is not None:
        return WeightsPlan(source, is_gguf, f"the GGUF's precision class (file type {file_type})")
    return WeightsPlan(None, is_gguf, "as loaded")


@contextlib.contextmanager
def quantizer_set_aside(model, plan: WeightsPlan):
    """While saving: no GGUF quantizer on ``model`` (its weights are plain tensors), restored afterwards."""
    if not plan.set_aside_quantizer:
        yield
        return
    saved = model.hf_quantizer
    config = getattr(model, "config", None)
    quantization = getattr(config, "quantization_config", None)
    model.hf_quantizer = None
    if quantization is not None:
        del config.quantization_config
    try:
        yield
    finally:
        model.hf_quantizer = saved
        if quantization is not None:
            config.quantization_config = quantization


def cast_state(state: dict[str, torch.Tensor], plan: WeightsPlan) -> dict[str, torch.Tensor]:
    """``state`` with its floating-point tensors in ``plan.dtype`` (unchanged when it is None)."""
    if plan.dtype is None:
        return state
    return {k: v.to(plan.dtype) if v.is_floating_point() else v for k, v in state.items()}
