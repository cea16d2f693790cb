"""--device/--dtype/--attn/--device-map resolution (ropekit.runtime.devices) against faked machines."""

from __future__ import annotations

import pytest
import torch

from ropekit.errors import RopekitError
from ropekit.runtime import devices


@pytest.fixture
def machine(monkeypatch):
    """``machine(gpus, bf16=True, flash=False, mps=False)``: fake what torch and the installed packages report."""

    def set_machine(gpus: int, bf16: bool = True, flash: bool = False, mps: bool = False, accelerate: bool = True,
                    cpu_bf16: str | None = None):
        monkeypatch.setattr(devices, "native_cpu_bf16", lambda: cpu_bf16)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
        # torch's own answer: with emulation (its default) every CUDA GPU says yes; natively only 8.0+ (Ampere)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True: (including_emulation and bf16 is not None) or bool(bf16))
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0) if bf16 else (7, 5))
        # bf16=None: no bfloat16 at all, not even emulated
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(devices, "mps_available", lambda: mps)
        monkeypatch.setattr(devices, "flash_attn_installed", lambda: flash)
        real = devices.importlib.util.find_spec
        monkeypatch.setattr(devices.importlib.util, "find_spec",
                            lambda name, *a: (object() if accelerate else None) if name == "accelerate" else real(name, *a))

    return set_machine


RESOLUTION = [
    # (gpus, flash, device, dtype, attn, map) → (device, dtype, attn, map)
    ((0, False, "auto", "auto", "auto", None), ("cpu", "float32", "sdpa", None)),
    ((1, False, "auto", "auto", "auto", None), ("cuda:0", "bfloat16", "sdpa", None)),
    ((1, True, "auto", "auto", "auto", None), ("cuda:0", "bfloat16", "flash_attention_2", None)),
    ((2, True, "cuda:1", "float16", "auto", None), ("cuda:1", "float16", "flash_attention_2", None)),
    ((1, True, "auto", "float32", "auto", None), ("cuda:0", "float32", "sdpa", None)),  # FA2 needs half precision
    ((1, True, "cpu", "auto", "auto", None), ("cpu", "float32", "sdpa", None)),
    ((0, False, "cpu", "bf16", "eager", None), ("cpu", "bfloat16", "eager", None)),
    ((1, False, "cuda", "auto", "flex_attention", None), ("cuda:0", "bfloat16", "flex_attention", None)),
    ((4, False, "auto", "auto", "auto", "auto"), ("cuda:0", "bfloat16", "sdpa", "auto")),
]


@pytest.mark.parametrize("given, expected", RESOLUTION, ids=[str(g) for g, _ in RESOLUTION])
def test_resolution_table(machine, given, expected):
    gpus, flash, device, dtype, attn, device_map = given
    machine(gpus, flash=flash)
    plan = devices.resolve_devices(device, dtype, attn, device_map)
    assert (plan.device, plan.dtype, plan.attn, plan.device_map) == expected


def test_auto_uses_float16_on_gpus_without_bfloat16(machine):
    """A T4 (compute capability 7.5): torch.cuda.is_bf16_supported() says True there (emulated bfloat16, slower
    than float16), and auto chose bfloat16 as "a GPU with bfloat16"."""
    machine(1, bf16=False)
    assert torch.cuda.is_bf16_supported()  # the emulation torch counts
    plan = devices.resolve_devices()
    assert plan.dtype == "float16" and "no native bfloat16" in plan.describe()
    asked = devices.resolve_devices("cuda", "bfloat16")  # asked for: it runs, and the line says it is emulated
    assert asked.dtype == "bfloat16" and "emulates bfloat16" in asked.describe()


SMOLLM2_PARAMETERS = 134_515_008
BUILTIN_PARAMETERS = 1_100_000


@pytest.mark.parametrize("gpus, cpu_bf16, parameters, expected", [
    (0, None, SMOLLM2_PARAMETERS, "float32"),          # AVX2-only CPU: bf16 is emulated there, slower than float32
    (0, "AMX-BF16", SMOLLM2_PARAMETERS, "bfloat16"),   # AMX: bf16 GEMMs in the tile unit
    (0, "AVX512-BF16", None, "bfloat16"),              # unknown size counts as a real model
    (0, "AMX-BF16", BUILTIN_PARAMETERS, "float32"),    # the built-in base model stays exact
    (1, None, BUILTIN_PARAMETERS, "float32"),          # ... on a GPU too
    (1, None, SMOLLM2_PARAMETERS, "bfloat16"),
])
def test_auto_dtype_follows_hardware_and_model_size(machine, gpus, cpu_bf16, parameters, expected):
    machine(gpus, cpu_bf16=cpu_bf16)
    plan = devices.resolve_devices(model_parameters=parameters)
    assert plan.dtype == expected
    # the one line every run prints names the dtype and why
    line = plan.describe()
    assert expected in line and "auto" in line
    if cpu_bf16 and gpus == 0 and expected == "bfloat16":
        assert cpu_bf16 in line
    if parameters == BUILTIN_PARAMETERS:
        assert "1.1M parameters" in line


def test_explicit_dtype_is_kept_whatever_the_hardware(machine):
    machine(0, cpu_bf16=None)
    plan = devices.resolve_devices("cpu", "bfloat16", model_parameters=BUILTIN_PARAMETERS)
    assert plan.dtype == "bfloat16" and plan.reason == "asked for"


def test_native_cpu_bf16_reads_torch_probes_then_cpu_flags(monkeypatch, tmp_path):
    """Detection, not a guess: torch's CPUID probes first, then the kernel's flags (Arm has no torch probe)."""
    import builtins

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert devices.native_cpu_bf16() == "AMX-BF16"
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    real_open = builtins.open

    def cpuinfo(text):
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        return lambda name, *a, **k: real_open(path if name == "/proc/cpuinfo" else name, *a, **k)

    monkeypatch.setattr(builtins, "open", cpuinfo("processor : 0\nflags : fpu sse avx2 fma\n"))
    assert devices.native_cpu_bf16() is None
    monkeypatch.setattr(builtins, "open", cpuinfo("processor : 0\nFeatures : fp asimd sve bf16 i8mm\n"))
    assert devices.native_cpu_bf16() == "Arm BF16"


def test_parameter_count_matches_the_loaded_model():
    """The count ``auto`` decides on, from config alone, equals the parameters of the model actually loaded."""
    from ropekit.models.loading import load_model, parameter_count

    loaded = load_model("tiny")
    assert parameter_count("tiny") == sum(p.numel() for p in loaded.model.parameters())


def test_mps_when_present(machine):
    machine(0, mps=True)
    assert devices.resolve_devices("mps").device == "mps"


REFUSALS = [
    (dict(gpus=0), ("cuda", "auto", "auto", None), "no CUDA GPU"),
    (dict(gpus=0), ("cuda:0", "auto", "auto", None), "no CUDA GPU"),
    (dict(gpus=1), ("cuda:3", "auto", "auto", None), "has 1 GPU"),
    (dict(gpus=0), ("mps", "auto", "auto", None), "MPS"),
    (dict(gpus=0), ("tpu", "auto", "auto", None), "not one of"),
    (dict(gpus=1), ("cuda:x", "auto", "auto", None), "not a device"),
    (dict(gpus=0), ("cpu", "float16", "auto", None), "float16 on CPU"),
    (dict(gpus=0), ("auto", "float64", "auto", None), "not one of"),
    (dict(gpus=1, bf16=None), ("cuda", "bfloat16", "auto", None), "no bfloat16"),
    (dict(gpus=1, flash=False), ("cuda", "bfloat16", "flash_attention_2", None), "not installed"),
    (dict(gpus=0, flash=True), ("cpu", "auto", "flash_attention_2", None), "CUDA GPUs only"),
    (dict(gpus=1, flash=True), ("cuda", "float32", "flash_attention_2", None), "bfloat16 or float16"),
    (dict(gpus=1), ("cuda", "auto", "paged", None), "not one of"),
    (dict(gpus=0), ("auto", "auto", "auto", "auto"), "no"),
    (dict(gpus=2), ("cuda:1", "auto", "auto", "auto"), "contradict"),
    (dict(gpus=2, accelerate=False), ("auto", "auto", "auto", "auto"), "accelerate"),
    (dict(gpus=2), ("auto", "auto", "auto", "balanced"), "not supported"),
]


@pytest.mark.parametrize("machine_kw, given, words", REFUSALS, ids=[f"{g}-{m}" for m, g, _ in REFUSALS])
def test_refusals_are_one_line(machine, machine_kw, given, words):
    machine(**machine_kw)
    with pytest.raises(RopekitError) as info:
        devices.resolve_devices(*given)
    text = str(info.value)
    assert "\n" not in text and words in text and info.value.fix


def test_worker_devices_spread_over_gpus(machine):
    machine(3)
    assert [devices.worker_device("auto", i) for i in range(5)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:0", "cuda:1"]
    assert devices.worker_device("cuda", 4) == "cuda:1"
    assert devices.worker_device("cuda:2", 0) == "cuda:2"  # an explicit GPU is kept
    assert devices.worker_device("cpu", 1) == "cpu"
    machine(1)
    assert devices.worker_device("auto", 3) == "auto"


def test_free_memory_on_the_cpu_is_the_kernels_available_memory():
    """The CPU's free memory is what /proc/meminfo calls MemAvailable (read here directly), not MemFree."""
    from pathlib import Path

    meminfo = Path("/proc/meminfo")
    if not meminfo.is_file():
        pytest.skip("no /proc/meminfo (not Linux)")
    fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo.read_text().splitlines()}
    free = devices.free_memory("cpu")
    assert abs(free - fields["MemAvailable"]) < 0.05 * fields["MemTotal"]
    assert devices.free_memory("meta") is None
