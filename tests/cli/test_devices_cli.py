"""Device options on the CLI: an impossible --device/--dtype/--attn is one line, exit 2, and no model loads."""

from __future__ import annotations

import pytest
import torch

from ropekit.runtime import devices


@pytest.fixture
def cpu_only(monkeypatch):
    """A machine without GPU, MPS or flash_attn; any model load fails the test."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(devices, "mps_available", lambda: False)
    monkeypatch.setattr(devices, "flash_attn_installed", lambda: False)
    import ropekit.models.loading as loading

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    for name in ("_load_tiny", "_load_dir", "_load_gguf", "_load_hub"):
        monkeypatch.setattr(loading, name, no_load)


COMMANDS = [
    ["inspect", "tiny"],
    ["extend", "tiny", "--method", "pi", "--factor", "2", "--out", "OUT"],
    ["eval", "ppl", "tiny", "--lengths", "64"],
    ["eval", "passkey", "tiny", "--lengths", "64"],
    ["eval", "niah", "tiny", "--lengths", "64"],
    ["eval", "ruler", "tiny", "--lengths", "64"],
    ["eval", "longbench", "tiny"],
    ["eval", "manyshot", "tiny"],
    ["eval", "entropy", "tiny", "--lengths", "64"],
    ["eval", "short", "tiny"],
    ["eval", "speed", "tiny", "--lengths", "64"],
    ["study", "--preset", "quick", "--out", "OUT"],
    ["search", "tiny", "--target-length", "256", "--out", "OUT"],
]
BAD = [
    (["--device", "cuda"], "no CUDA GPU"),
    (["--device", "cuda:3"], "no CUDA GPU"),
    (["--device", "mps"], "MPS"),
    (["--dtype", "float16"], "float16 on CPU"),
    (["--attn", "flash_attention_2"], "CUDA GPUs only"),
]


@pytest.mark.parametrize("bad, words", BAD, ids=[b[0][1] for b in BAD])
@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:2]) for c in COMMANDS])
def test_refused_before_loading(run_cli, cpu_only, tmp_path, command, bad, words):
    args = [str(tmp_path / "out") if a == "OUT" else a for a in command]
    code, stdout, stderr = run_cli(*args, *bad)
    assert code == 2, (stdout, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], stderr
    assert not (tmp_path / "out").exists()


def test_device_map_refused_without_gpu(run_cli, cpu_only):
    code, _, stderr = run_cli("inspect", "tiny", "--device-map", "auto")
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "--device-map" in stderr


def test_explicit_cpu_loads_on_cpu(run_cli, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, stdout, stderr = run_cli("inspect", "tiny", "--device", "cpu", "--dtype", "float32", "--attn", "eager", "--json")
    assert code == 0, stderr
    assert '"attn_implementation": "eager"' in stdout


def test_a_run_says_where_it_ran_in_which_dtype_and_why(run_cli, monkeypatch):
    """One placement line on stderr when the command has done its work (a refusal after loading stays one line)."""
    from ropekit.runtime import devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "native_cpu_bf16", lambda: "AMX-BF16")
    code, _, stderr = run_cli("inspect", "tiny", "--json")
    lines = [line for line in stderr.splitlines() if line.startswith("running on ")]
    assert code == 0 and lines == ["running on cpu in float32 (auto: a small model (0.1M parameters) stays in float32, "
                                   "bfloat16 is for models of 20M or more), attention sdpa"], stderr


def test_a_study_says_where_its_pieces_run_before_they_start(run_cli, monkeypatch, tmp_path):
    """A study runs for hours: its placement line comes first, from the model's size (the built-in base model is
    small, so float32 even on a CPU with native bf16)."""
    import ropekit.study.runner as runner

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "native_cpu_bf16", lambda: "AMX-BF16")
    order = []
    monkeypatch.setattr(runner, "run_study", lambda *a, **k: order.append("run") or {
        "pieces": 0, "by_status": {"done": 0, "failed": 0}, "failed": []})
    code, _, stderr = run_cli("study", "--preset", "quick", "--out", str(tmp_path / "s"), "--no-report")
    assert code == 0 and order == ["run"], stderr
    lines = [line for line in stderr.splitlines() if line.startswith("running on ")]
    assert lines == ["running on cpu in float32 (auto: a small model (1.1M parameters) stays in float32, bfloat16 is "
                     "for models of 20M or more), attention sdpa"], stderr


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_attn_auto_falls_back_to_eager_for_a_family_without_sdpa(run_cli, family):
    """`inspect tiny-gemma2` failed with "attention implementation 'sdpa' is not available": --attn auto asked for
    sdpa outright. Now auto is transformers' own pick (sdpa where the family has it), said in the placement line."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ropekit.models.tiny import build_tiny_model

    expected = AutoModelForCausalLM.from_config(AutoConfig.for_model(**build_tiny_model(family).config.to_dict()))
    code, _, err = run_cli("inspect", f"tiny-{family}")
    assert code == 0, err
    assert f"attention {expected.config._attn_implementation}" in err and "attention sdpa" not in err, err
    code, _, err = run_cli("inspect", f"tiny-{family}", "--attn", "sdpa")  # asked for: refused, with the way out
    assert code == 2 and "pass --attn auto (or eager)" in err
