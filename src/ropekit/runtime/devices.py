"""Where a model runs: ``--device``, ``--dtype``, ``--attn`` and ``--device-map`` resolved to what this machine has.

``auto`` picks, in order: CUDA and ``flash_attention_2`` when the ``flash_attn`` package is importable, else
``sdpa`` — when a GPU is present; otherwise CPU and ``sdpa``. The dtype ``auto`` is bfloat16 (float16 on GPUs
without bfloat16) for real models on a GPU *and* on a CPU whose matrix units multiply bfloat16 natively (Intel
AMX-BF16 or AVX512-BF16, as torch itself detects them; Arm's BF16 extension, from the kernel's CPU flags) —
there a bfloat16 matmul runs about 10× faster than float32 — and float32 everywhere else, and for small models
(fewer than :data:`SMALL_MODEL_PARAMETERS` parameters: the built-in base model and the tiny test models), which
are the exactness references of the study and the tests and gain nothing from half precision. Every plan
carries the reason for its dtype in one line (:attr:`DevicePlan.reason`). An explicit choice the machine cannot honour (``cuda`` without a GPU, ``cuda:3`` with one GPU, ``mps``
off a Mac, ``flash_attention_2`` without ``flash_attn`` or off CUDA, float16 on CPU, …) is refused with a
one-line :class:`~ropekit.errors.RopekitError` — :func:`resolve_devices` runs before any model is loaded, so a
mistake costs nothing.

Only the standard library is imported at module level; torch is imported inside the functions.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

from ..errors import RopekitError

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N", "mps")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
ATTN_CHOICES = ("auto", "sdpa", "eager", "flash_attention_2", "flex_attention")
DEVICE_MAP_CHOICES = ("auto",)

_DTYPE_ALIASES = {"float32": "float32", "fp32": "float32", "float": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
                  "float16": "float16", "fp16": "float16", "half": "float16"}


@dataclass(frozen=True)
class DevicePlan:
    """A resolved placement: ``device`` (``cpu``, ``cuda:N`` or ``mps``), ``dtype`` (a name), ``attn`` (a
    transformers attention implementation) and ``device_map`` (None, or ``auto`` to spread the layers over every
    GPU with accelerate — then ``device`` is where the inputs go, the first GPU)."""

    device: str
    dtype: str
    attn: str
    device_map: str | None = None
    #: why this dtype, in words (``auto``'s choice, or "asked for")
    reason: str = ""

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def as_dict(self) -> dict[str, str | None]:
        return {"device": self.device, "dtype": self.dtype, "attn": self.attn, "device_map": self.device_map}

    def describe(self) -> str:
        """The one line every model-loading command prints: where it runs, in which dtype, and why."""
        return f"running on {self.device} in {self.dtype} ({self.reason}), attention {self.attn}"


#: Below this many parameters a model is a toy (the built-in base model has 1.1M, the tiny test models far fewer):
#: ``--dtype auto`` keeps it in float32, where the study's and the tests' exact comparisons are made.
SMALL_MODEL_PARAMETERS = 20_000_000


def native_cpu_bf16() -> str | None:
    """The CPU feature that multiplies bfloat16 matrices in hardware, or None when this CPU only emulates it.

    x86: torch's own CPUID checks (``torch.cpu._is_amx_tile_supported`` for AMX, which oneDNN uses for bf16
    GEMMs, and ``_is_avx512_bf16_supported``); elsewhere the kernel's flags (``/proc/cpuinfo``: ``amx_bf16``,
    ``avx512_bf16``, or Arm's ``bf16`` feature). Without such a unit a bfloat16 matmul is converted to float32
    element by element and runs *slower* than float32, so ``auto`` must not choose it.
    """
    import torch

    cpu = getattr(torch, "cpu", None)
    for probe, name in (("_is_amx_tile_supported", "AMX-BF16"), ("_is_avx512_bf16_supported", "AVX512-BF16")):
        check = getattr(cpu, probe, None)
        try:
            if check is not None and check():
                return name
        except Exception:  # a probe torch cannot run on this CPU says nothing either way
            continue
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    flags.update(value.split())
    except OSError:
        return None
    for flag, name in (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"), ("bf16", "Arm BF16")):
        if flag in flags:
            return name
    return None


def cuda_count() -> int:
    """How many CUDA devices torch sees (0 without CUDA)."""
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def mps_available() -> bool:
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def free_memory(device) -> int | None:
    """Bytes free for new tensors on ``device``: what the CUDA driver reports free on a GPU
    (``torch.cuda.mem_get_info``), the memory the kernel can hand out without swapping on a CPU
    (psutil's ``available``); ``None`` where neither says (MPS, other accelerators)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        import psutil  # accelerate's dependency, so always installed with ropekit

        return int(psutil.virtual_memory().available)
    return None


def flash_attn_installed() -> bool:
    """Whether the ``flash_attn`` package (transformers' ``flash_attention_2``) can be imported."""
    return importlib.util.find_spec("flash_attn") is not None


def _resolve_device(device: str) -> str:
    text = (device or "auto").strip().lower()
    count = cuda_count()
    if text == "auto":
        return "cuda:0" if count else "cpu"
    if text == "cpu":
        return "cpu"
    if text == "mps":
        if not mps_available():
            raise RopekitError("--device mps: no Apple-silicon (MPS) backend on this machine", "pass --device cpu or --device auto")
        return "mps"
    if text == "cuda" or text.startswith("cuda:"):
        index_text = text.partition(":")[2] or "0"
        if not index_text.isdigit():
            raise RopekitError(f"--device {device!r} is not a device", "pass cuda or cuda:N with N a GPU index, e.g. cuda:0")
        if count == 0:
            raise RopekitError(f"--device {device}: torch sees no CUDA GPU on this machine", "pass --device cpu (or auto)")
        index = int(index_text)
        if index >= count:
            raise RopekitError(f"--device {device}: this machine has {count} GPU{'s' if count > 1 else ''} "
                               f"(cuda:0–cuda:{count - 1})", f"pass --device cuda:{count - 1} or lower, or --device auto")
        return f"cuda:{index}"
    raise RopekitError(f"--device {device!r} is not one of {', '.join(DEVICE_CHOICES)}", "pass e.g. --device auto")


def gpu_native_bf16(device: str) -> bool:
    """Whether the GPU ``device`` computes bfloat16 natively: compute capability 8.0 (Ampere) or later on CUDA.
    ``torch.cuda.is_bf16_supported()`` also says yes where bfloat16 is only emulated (a T4 or V100, pytorch#148322),
    which runs slower than float16 there; on ROCm torch's check without emulation is used."""
    import torch

    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    if getattr(torch.version, "hip", None):
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    return torch.cuda.get_device_capability(index)[0] >= 8


def _resolve_dtype(dtype: str, device: str, model_parameters: int | None = None) -> tuple[str, str]:
    """The dtype's name and the reason for it (module docstring)."""
    import torch

    text = (dtype or "auto").strip().lower().removeprefix("torch.")
    if text == "auto":
        small = model_parameters is not None and model_parameters < SMALL_MODEL_PARAMETERS
        if small:
            return "float32", (f"auto: a small model ({model_parameters / 1e6:.1f}M parameters) stays in float32, "
                               f"bfloat16 is for models of {SMALL_MODEL_PARAMETERS // 1_000_000}M or more")
        if device.startswith("cuda"):
            if gpu_native_bf16(device):
                return "bfloat16", "auto: a GPU with bfloat16"
            return "float16", "auto: this GPU has no native bfloat16 (it would emulate it)"
        if device == "cpu":
            unit = native_cpu_bf16()
            if unit is not None:
                return "bfloat16", f"auto: this CPU multiplies bfloat16 natively ({unit})"
            return "float32", "auto: this CPU lacks a native bfloat16 matmul unit, AMX-BF16 or AVX512-BF16"
        return "float32", f"auto: float32 on {device}"
    name = _DTYPE_ALIASES.get(text)
    if name is None:
        raise RopekitError(f"--dtype {dtype!r} is not one of {', '.join(DTYPE_CHOICES)}", "pass e.g. --dtype auto")
    if name == "float16" and device == "cpu":
        raise RopekitError("--dtype float16 on CPU: half-precision matmuls there are slow and lose precision",
                           "pass --dtype float32 (or bfloat16) on CPU")
    if name == "bfloat16" and device.startswith("cuda"):
        if not torch.cuda.is_bf16_supported():
            raise RopekitError(f"--dtype bfloat16: {device} has no bfloat16 support", "pass --dtype float16 on this GPU")
        if not gpu_native_bf16(device):
            return name, "asked for; this GPU emulates bfloat16 (slower than float16)"
    return name, "asked for"


def _resolve_attn(attn: str, device: str, dtype: str) -> str:
    text = (attn or "auto").strip().lower()
    if text == "auto":
        if device.startswith("cuda") and dtype in ("bfloat16", "float16") and flash_attn_installed():
            return "flash_attention_2"
        return "sdpa"
    if text not in ATTN_CHOICES:
        raise RopekitError(f"--attn {attn!r} is not one of {', '.join(ATTN_CHOICES)}", "pass e.g. --attn auto")
    if text == "flash_attention_2":
        if not device.startswith("cuda"):
            raise RopekitError(f"--attn flash_attention_2 runs on CUDA GPUs only, not on {device}", "pass --attn sdpa")
        if not flash_attn_installed():
            raise RopekitError("--attn flash_attention_2: the flash_attn package is not installed",
                               "pip install flash-attn, or pass --attn sdpa")
        if dtype not in ("bfloat16", "float16"):
            raise RopekitError(f"--attn flash_attention_2 needs bfloat16 or float16, not {dtype}",
                               "pass --dtype bfloat16 (or --attn sdpa)")
    if text == "flex_attention":
        try:
            importlib.import_module("torch.nn.attention.flex_attention")
        except ImportError:
            raise RopekitError("--attn flex_attention: this torch has no flex attention", "upgrade torch, or pass --attn sdpa") from None
    return text


def _resolve_device_map(device_map: str | None, requested_device: str, device: str) -> str | None:
    if device_map is None or not str(device_map).strip() or str(device_map).strip().lower() == "none":
        return None
    text = str(device_map).strip().lower()
    if text != "auto":
        raise RopekitError(f"--device-map {device_map!r} is not supported", "pass --device-map auto, or leave it out")
    if not device.startswith("cuda"):
        raise RopekitError("--device-map auto spreads a model over GPUs, and there is none on "
                           f"{'this machine' if requested_device == 'auto' else device}", "leave --device-map out")
    if requested_device.strip().lower().startswith("cuda:"):
        raise RopekitError(f"--device-map auto and --device {requested_device} contradict each other",
                           "pass one of them")
    if importlib.util.find_spec("accelerate") is None:
        raise RopekitError("--device-map auto needs the accelerate package", "pip install accelerate, or leave --device-map out")
    return "auto"


def resolve_devices(device: str = "auto", dtype: str = "auto", attn: str = "auto",
                    device_map: str | None = None, *, model_parameters: int | None = None) -> DevicePlan:
    """Resolve the four options against this machine (module docstring); a one-line RopekitError if impossible.

    ``model_parameters`` (when known: :func:`ropekit.models.loading.parameter_count`) lets ``--dtype auto`` keep
    small models in float32; unknown counts as a real model."""
    resolved = _resolve_device(device)
    name, reason = _resolve_dtype(dtype, resolved, model_parameters)
    kernel = _resolve_attn(attn, resolved, name)
    placement = _resolve_device_map(device_map, device or "auto", resolved)
    return DevicePlan(device=resolved, dtype=name, attn=kernel, device_map=placement, reason=reason)


def worker_device(device: str, worker: int) -> str:
    """The ``--device`` a study worker uses: with ``auto`` or ``cuda`` and several GPUs, worker ``i`` gets
    ``cuda:(i mod n)`` so the workers do not share one GPU; anything else is passed through unchanged."""
    text = (device or "auto").strip().lower()
    if text not in ("auto", "cuda"):
        return device
    count = cuda_count()
    if count <= 1:
        return device
    return f"cuda:{worker % count}"


def hardware_name(device: str) -> str:
    """The hardware behind ``device`` in words: a GPU's own name (``NVIDIA H200``), or the CPU's model with its
    bfloat16 matrix unit when it has one (``Intel(R) Xeon(R) Processor, AMX-BF16``) — what a reader needs to tell
    two machines' numbers apart."""
    import torch

    text = str(device)
    if text.startswith("cuda") and torch.cuda.is_available():
        index = int(text.partition(":")[2] or 0)
        return torch.cuda.get_device_name(index)
    if text == "mps":
        return "Apple GPU (MPS)"
    return _cpu_hardware()


@functools.lru_cache(maxsize=1)
def _cpu_hardware() -> str:
    """The CPU's model and its bfloat16 unit, read once per process (every evaluation record carries it)."""
    unit = native_cpu_bf16()
    return f"{cpu_model()}, " + (unit or "no native bfloat16 matmul")


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), else what ``platform`` knows."""
    import platform

    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def computed_on(model=None, *, device: str | None = None, dtype: str | None = None, **extra) -> dict[str, str]:
    """Where a result was computed, for the record that keeps it: ``device``, ``dtype`` (the weights'), the
    ``attn`` implementation and the ``hardware`` (:func:`hardware_name`), read off ``model`` itself when given
    (what ran, not what was asked for); ``extra`` keys (a training's ``precision``) are added as they are."""
    attn = None
    if model is not None:
        first = next(iter(model.parameters()), None)
        if first is not None:
            device = device or str(first.device)
            dtype = dtype or str(first.dtype).removeprefix("torch.")
        from ..adapters.transformers import attn_implementation

        attn = attn_implementation(getattr(model, "config", None))
    device = device or "cpu"
    out = {"device": device, "dtype": dtype or "float32", "hardware": hardware_name(device)}
    if attn:
        out["attn"] = str(attn)
    out.update({k: str(v) for k, v in extra.items() if v is not None})
    return out
