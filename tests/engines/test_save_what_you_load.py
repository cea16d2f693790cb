"""Save what you load: a model loaded from a GGUF — by plain transformers or by ``ropekit.load_model`` — extends and
saves (dequantized, in the dtype asked for, by default in the file's precision class), or is refused in one line
before anything is written; ``ropekit.load_model`` is public.

The reference for the weights is transformers' own GGUF dequantization (the in-memory model it loads), cast with
torch; plain transformers must load the saved directory.
"""

from __future__ import annotations

import json

import pytest
import torch
from bpe_tokenizer import trained_bpe
from transformers import AutoModelForCausalLM

import ropekit
from ropekit import RopekitError
from ropekit.install.gguf_export import write_gguf
from ropekit.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ggufs")
    tokenizer = trained_bpe()
    model = build_tiny_model("llama", vocab_size=len(tokenizer))
    for outtype in ("f32", "f16", "q8_0"):
        write_gguf(model, tokenizer, root / f"m-{outtype}.gguf", outtype=outtype)
    return root


def _plain(path):
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()


@pytest.mark.parametrize("outtype,dtype", [("f32", torch.float32), ("f16", torch.float16), ("q8_0", torch.float16)])
def test_a_gguf_loaded_by_plain_transformers_saves_in_its_precision_class(ggufs, tmp_path, outtype, dtype):
    model = _plain(ggufs / f"m-{outtype}.gguf")
    assert model.hf_quantizer is not None  # transformers' own GGUF loading keeps a quantizer that refuses to save
    reference = {k: v.to(dtype) for k, v in model.state_dict().items()}
    ropekit.extend(model, "yarn", factor=2.0)
    report = ropekit.save_pretrained(model, tmp_path / "out")
    assert report["dtype"] == str(dtype).removeprefix("torch.")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == report["dtype"]
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=dtype)
    assert saved.config.rope_parameters["rope_type"] == "yarn"
    for name, value in saved.state_dict().items():
        assert value.dtype == dtype and torch.equal(value, reference[name]), name
    assert model.hf_quantizer is not None  # the caller's model is left as it was


def test_the_dtype_asked_for_wins(ggufs, tmp_path):
    model = _plain(ggufs / "m-q8_0.gguf")
    ropekit.extend(model, "pi", factor=2.0)
    assert ropekit.save_pretrained(model, tmp_path / "out", dtype="float32")["dtype"] == "float32"
    with pytest.raises(RopekitError) as err:
        ropekit.save_pretrained(model, tmp_path / "bad", dtype="int8")
    assert "unknown dtype 'int8'" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "bad").exists()  # refused before anything was written


def test_load_model_is_public_and_marks_the_gguf_precision(ggufs, tmp_path):
    loaded = ropekit.load_model(str(ggufs / "m-f16.gguf"))
    assert loaded.source == "gguf" and loaded.model.dtype == torch.float32  # computes in float32
    ropekit.extend(loaded.model, "ntk", factor=2.0)
    assert ropekit.save_pretrained(loaded.model, tmp_path / "out", tokenizer=loaded.tokenizer)["dtype"] == "float16"
    asked = ropekit.load_model(str(ggufs / "m-f16.gguf"), dtype="float32")  # a dtype asked for at load is kept
    assert ropekit.save_pretrained(asked.model, tmp_path / "asked")["dtype"] == "float32"
    assert ropekit.load_model("tiny").source == "tiny"


def test_load_of_a_name_says_what_to_do():
    with pytest.raises(RopekitError) as err:
        ropekit.load("smollm2")
    assert "ropekit.load_model('smollm2')" in str(err.value) and "\n" not in str(err.value)


def test_extend_from_a_gguf_on_the_command_line_saves_its_precision_class(ggufs, tmp_path, run_cli):
    code, out, err = run_cli("extend", str(ggufs / "m-q8_0.gguf"), "--method", "yarn", "--factor", "2",
                             "--out", str(tmp_path / "out"), "--json")
    assert code == 0, err
    assert json.loads(out)["dtype"] == "float16"
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "float16"
    card = (tmp_path / "out" / "README.md").read_text()  # the flags name the GGUF the model came from
    assert f"llama-server -m {ggufs / 'm-q8_0.gguf'} --rope-scaling yarn --rope-scale 2 --yarn-orig-ctx 64 -c 128" in card


def test_ropekit_loads_a_gguf_as_plain_float_weights_and_asks_transformers_for_them(ggufs, monkeypatch):
    """transformers 5.24 can keep a GGUF's weights packed (GgufLinear, computed in float32 whatever the dtype); a
    model ropekit loads is always an ordinary one: every projection a torch Linear holding transformers' own
    dequantization in the dtype asked for, and the loader asks for dequantized weights where transformers offers
    the choice."""
    import transformers

    from ropekit.models import loading

    path = ggufs / "m-q8_0.gguf"
    reference = {k: v.to(torch.bfloat16) for k, v in _plain(path).state_dict().items()}
    model = ropekit.load_model(str(path), dtype="bfloat16").model
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is torch.nn.Linear for m in linears)
    for name, value in model.state_dict().items():
        assert value.dtype == torch.bfloat16 and torch.equal(value, reference[name]), name
    asked = {}
    real = loading._from_pretrained
    monkeypatch.setattr(loading, "_from_pretrained", lambda what, loader, *a, **kw: asked.update(kw) or real(what, loader, *a, **kw))
    ropekit.load_model(str(path), dtype="bfloat16", with_tokenizer=False)
    if hasattr(transformers, "GgufConfig"):
        assert asked["quantization_config"].dequantize is True
