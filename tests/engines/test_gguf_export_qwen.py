"""GGUF export of Qwen2 and Qwen3 models as llama.cpp's ``qwen2`` / ``qwen3`` architectures.

What llama.cpp expects, from its source (ggml-org/llama.cpp): ``src/models/qwen2.cpp`` adds ``bq``/``bk``/``bv`` to
the q/k/v projections, ``src/models/qwen3.cpp`` RMS-normalises q and k per head (``attn_q_norm``/``attn_k_norm``,
``n_embd_head_k`` wide) before RoPE, both rotate with ``LLAMA_ROPE_TYPE_NEOX`` (transformers' rotate-half pairs, so
q/k are copied unpermuted, as ``convert_hf_to_gguf.py``'s Qwen2Model does), both pass ``nullptr`` as the frequency
factors of ``ggml_rope_ext`` (no ``rope_freqs``), and both fall back to ``token_embd`` when ``output.weight`` is
absent. The file is read back with ``gguf.GGUFReader`` and with transformers' own GGUF loader
(``from_pretrained(…, gguf_file=…)``), which must rebuild the model's logits.
"""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import ropekit
from ropekit import RopekitError
from ropekit.install.gguf_export import write_gguf
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import tiny_config
from test_gguf_export import _tensor, _value

#: transformers' GGUF loader sets no head_dim for qwen3 (its config mapping ignores key_length), so Qwen3Config's
#: default of 128 must be the tiny model's: hidden 256 over 2 heads. Qwen2: hidden 64, 4 heads of 16.
SHAPES = {"qwen2": {"hidden_size": 64, "num_heads": 4, "num_kv_heads": 2},
          "qwen3": {"hidden_size": 256, "num_heads": 2, "num_kv_heads": 1}}


def _model(family: str, *, tied: bool = False, seed: int = 0):
    config = tiny_config(family, vocab_size=256, **SHAPES[family])
    config.tie_word_embeddings = tied
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).eval()
    return model




def _expected_names(family: str, layers: int, tied: bool) -> set[str]:
    """The tensors llama.cpp's qwen2/qwen3 loaders create (written out by hand from their tensor lists)."""
    names = {"token_embd.weight", "output_norm.weight"} | (set() if tied else {"output.weight"})
    per_layer = ["attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                 "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]
    per_layer += ["attn_q.bias", "attn_k.bias", "attn_v.bias"] if family == "qwen2" else \
        ["attn_q_norm.weight", "attn_k_norm.weight"]
    return names | {f"blk.{i}.{n}" for i in range(layers) for n in per_layer}


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("tied", [False, True])
def test_metadata_and_tensors_are_llamacpps_qwen(tmp_path, family, tied):
    model = _model(family, tied=tied)
    report = write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf", outtype="f32")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    config = model.config
    head_dim = config.head_dim if family == "qwen3" else config.hidden_size // config.num_attention_heads
    assert _value(reader, "general.architecture") == family
    expected = {"context_length": 64, "embedding_length": config.hidden_size, "block_count": 2,
                "feed_forward_length": config.intermediate_size, "attention.head_count": config.num_attention_heads,
                "attention.head_count_kv": config.num_key_value_heads, "attention.key_length": head_dim,
                "attention.value_length": head_dim, "rope.dimension_count": head_dim, "rope.freq_base": 10000.0,
                "rope.scaling.type": "none", "vocab_size": 256}
    assert {k: _value(reader, f"{family}.{k}") for k in expected} == expected
    assert _value(reader, f"{family}.attention.layer_norm_rms_epsilon") == pytest.approx(config.rms_norm_eps)
    assert not any(k.startswith("llama.") for k in reader.fields)
    assert {t.name for t in reader.tensors} == _expected_names(family, 2, tied)
    assert report["rope_form"] == "none"
    state = model.state_dict()
    # NeoX rotation: q/k rows (and q/k biases) are transformers' own, not permuted to adjacent pairs
    pairs = [("self_attn.q_proj.weight", "attn_q.weight"), ("self_attn.k_proj.weight", "attn_k.weight"),
             ("self_attn.v_proj.weight", "attn_v.weight"), ("self_attn.o_proj.weight", "attn_output.weight")]
    pairs += [("self_attn.q_proj.bias", "attn_q.bias"), ("self_attn.k_proj.bias", "attn_k.bias"),
              ("self_attn.v_proj.bias", "attn_v.bias")] if family == "qwen2" else \
        [("self_attn.q_norm.weight", "attn_q_norm.weight"), ("self_attn.k_norm.weight", "attn_k_norm.weight")]
    for layer in range(2):
        for hf, ours in pairs:
            np.testing.assert_array_equal(_tensor(reader, f"blk.{layer}.{ours}"),
                                          state[f"model.layers.{layer}.{hf}"].numpy())
    if not tied:
        np.testing.assert_array_equal(_tensor(reader, "output.weight"), state["lm_head.weight"].numpy())


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("tied", [False, True])
def test_transformers_gguf_loader_rebuilds_the_logits(tmp_path, family, tied):
    """transformers' GGUF reader for qwen2/qwen3 (its own tensor-name map and config mapping) gives back the
    model bit for bit from an f32 file of the plain-RoPE model."""
    model = _model(family, tied=tied)
    write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf", outtype="f32")
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf", dtype=torch.float32).eval()
    assert loaded.config.model_type == family and loaded.config.tie_word_embeddings == tied
    ids = torch.randint(0, 256, (1, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_a_config_saying_tied_over_two_matrices_keeps_the_output(tmp_path):
    """transformers runs such a checkpoint untied (it warns and keeps both): output.weight must be written, else
    llama.cpp would use the embeddings as the head."""
    model = _model("qwen2")
    model.config.tie_word_embeddings = True  # the two matrices stay different
    write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf", outtype="f32")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    np.testing.assert_array_equal(_tensor(reader, "output.weight"), model.state_dict()["lm_head.weight"].numpy())


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("method,form", [("pi", "linear"), ("yarn", "yarn"), ("ntk", "none")])
def test_named_forms_under_the_qwen_prefix(tmp_path, family, method, form):
    model = _model(family)
    ropekit.extend(model, method, factor=2.0)
    report = write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf", outtype="f32")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    assert report["rope_form"] == form and _value(reader, "ropekit.method") == method
    assert _value(reader, f"{family}.rope.scaling.type") == form
    assert _tensor(reader, "rope_freqs.weight") is None
    if method == "pi":
        assert _value(reader, f"{family}.rope.scaling.factor") == 2.0
    if method == "yarn":  # transformers' YaRN temperature 0.1·ln 2 + 1 is llama.cpp's own: attn_factor 1
        assert _value(reader, f"{family}.rope.scaling.original_context_length") == 64
        assert _value(reader, f"{family}.rope.scaling.attn_factor") == pytest.approx(1.0, abs=1e-7)
    if method == "ntk":  # NTK-aware scaling: b' = b·s^(d/(d−2)) (bloc97), d the rotary dimension
        d = model.config.head_dim if family == "qwen3" else 16
        assert _value(reader, f"{family}.rope.freq_base") == pytest.approx(10000.0 * 2.0 ** (d / (d - 2)), rel=1e-6)


def _rotary_dim(model, family: str) -> int:
    return model.config.head_dim if family == "qwen3" else 16


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_frozen_dynamic_ntk_is_a_freq_base(tmp_path, family):
    """Dynamic NTK frozen at L is plain RoPE at b' = b·(s·L/C − (s − 1))^(d/(d−2)) (transformers' dynamic rule):
    llama.cpp's freq_base, which its qwen graphs read. It was refused as per-pair only."""
    model = _model(family)
    ropekit.extend(model, "dynamic_ntk", factor=2.0)
    report = write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf", outtype="f32", freeze_length=128)
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    d = _rotary_dim(model, family)
    assert report["rope_form"] == "none" and _value(reader, f"{family}.rope.scaling.type") == "none"
    assert _value(reader, f"{family}.rope.freq_base") == pytest.approx(10000.0 * (2 * 128 / 64 - 1) ** (d / (d - 2)),
                                                                       rel=1e-6)
    assert _tensor(reader, "rope_freqs.weight") is None


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_ntk_by_parts_with_the_code_ramp_is_yarn_without_its_temperature(tmp_path, family):
    """NTK-by-parts with YaRN's code ramp (linear in the pair index, β 32/1) is YaRN's frequencies with attention
    magnitude 1: llama.cpp's yarn form with attn_factor 1/(0.1·ln s + 1), cancelling the temperature it applies."""
    model = _model(family)
    ropekit.extend(model, "ntk_by_parts", factor=2.0, ramp="dim")
    report = write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf", outtype="f32")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    assert report["rope_form"] == "yarn" and _value(reader, f"{family}.rope.scaling.factor") == 2.0
    assert _value(reader, f"{family}.rope.scaling.original_context_length") == 64
    assert _value(reader, f"{family}.rope.scaling.attn_factor") == pytest.approx(1 / (0.1 * math.log(2) + 1), rel=1e-6)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_pi_on_a_linear_base_is_one_linear_factor(tmp_path, family):
    """PI ×2 on a checkpoint that already interpolates ×2 (rope_type linear) divides every frequency by 4."""
    config = tiny_config(family, vocab_size=256, rope_scaling={"rope_type": "linear", "factor": 2.0}, **SHAPES[family])
    model = AutoModelForCausalLM.from_config(config).eval()
    ropekit.extend(model, "pi", factor=2.0)
    report = write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf", outtype="f32")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    assert report["rope_form"] == "linear" and _value(reader, f"{family}.rope.scaling.factor") == 4.0
    assert _value(reader, f"{family}.rope.freq_base") == pytest.approx(10000.0, rel=1e-6)


def test_a_shipped_qwen25_yarn_is_written_as_yarn(tmp_path):
    """Qwen2.5's own rope_scaling (yarn, factor 4, transformers' betas 32/1) is llama.cpp's yarn form."""
    from ropekit.models.loading import load_model

    loaded = load_model("tiny-qwen2.5-yarn")
    report = write_gguf(loaded.model, byte_tokenizer(), tmp_path / "m.gguf", outtype="f32")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    assert report["rope_form"] == "yarn" and _value(reader, "qwen2.rope.scaling.factor") == 4.0


# --------------------------------------------------------------------------------------------------------------
# Refusals: one line, exit code 2, nothing written
# --------------------------------------------------------------------------------------------------------------


def _refused(run_cli, tmp_path, *args, must: tuple[str, ...]):
    out = tmp_path / "out.gguf"
    code, _, err = run_cli("extend", *args, "--format", "gguf", "--out", str(out))
    assert code == 2, err
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err
    for word in must:
        assert word in err, err
    assert not any(tmp_path.glob("**/*.gguf*"))


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("method", ["llama3", "ntk_by_parts"])
def test_per_pair_only_frequencies_are_refused(run_cli, tmp_path, family, method):
    """llama.cpp's qwen2/qwen3 graphs pass nullptr freq factors to ggml_rope_ext: there is no per-pair form
    (test_llamacpp_slow: a qwen2 file with rope_freqs does not even load)."""
    _refused(run_cli, tmp_path, f"tiny-{family}", "--method", method, "--factor", "2",
             must=(method, f"{family} GGUF", "rope_freqs"))


def test_pi_on_a_prescaled_qwen_is_refused(run_cli, tmp_path):
    """PI composed on Qwen2.5's YaRN is one set of frequencies llama.cpp's named forms do not compute."""
    _refused(run_cli, tmp_path, "tiny-qwen2.5-yarn", "--method", "pi", "--factor", "2",
             must=("pi", "qwen2 GGUF", "rope_freqs"))


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_a_sliding_window_is_refused(tmp_path, family):
    config = tiny_config(family)
    config.use_sliding_window, config.sliding_window = True, 16
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    model = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(RopekitError) as err:
        write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf")
    assert "sliding window" in str(err.value) and "\n" not in str(err.value)
    assert not any(tmp_path.iterdir())


def test_qwen3_with_attention_biases_is_refused(tmp_path):
    config = tiny_config("qwen3")
    config.attention_bias = True
    model = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(RopekitError, match="attention_bias"):
        write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf")
    assert not any(tmp_path.iterdir())


def test_the_cli_writes_a_qwen3_gguf(run_cli, tmp_path):
    target = tmp_path / "q.gguf"
    code, out, err = run_cli("extend", "tiny-qwen3", "--method", "yarn", "--factor", "2", "--format", "gguf",
                             "--out", str(target))
    assert code == 0, err
    assert "rope.scaling.type yarn" in out
    reader = gguf.GGUFReader(str(target))
    assert _value(reader, "general.architecture") == "qwen3" and _value(reader, "qwen3.rope.scaling.type") == "yarn"


def test_the_card_of_a_per_pair_qwen_export_does_not_send_to_gguf(tmp_path):
    """The model card's llama.cpp line: a Qwen llama3 export has neither flags nor a GGUF llama.cpp computes."""
    from ropekit.models.tiny import build_tiny_model

    model = build_tiny_model("qwen2")
    ropekit.extend(model, "llama3", factor=2.0)
    ropekit.save_pretrained(model, tmp_path / "d", tokenizer=byte_tokenizer())
    line = next(t for t in (tmp_path / "d" / "README.md").read_text().splitlines() if t.startswith("**llama.cpp**"))
    assert "qwen2 graph reads no per-pair" in line and "--format gguf" not in line


@pytest.mark.parametrize("method,refused", [("yarn", False), ("ntk_by_parts", True)])
def test_ropekit_export_of_a_saved_qwen2_directory(run_cli, tmp_path, method, refused):
    """`ropekit export DIR --format gguf` on a saved Qwen2: the directory's tokenizer loads as Qwen2Tokenizer (its
    <|endoftext|> appended at id 256), so the tiny model has 257 embeddings."""
    config = tiny_config("qwen2", vocab_size=257)
    model = AutoModelForCausalLM.from_config(config).eval()
    ropekit.extend(model, method, factor=2.0)
    ropekit.save_pretrained(model, tmp_path / "d", tokenizer=byte_tokenizer())
    target = tmp_path / "q.gguf"
    code, out, err = run_cli("export", str(tmp_path / "d"), "--format", "gguf", "--outtype", "f32", "--out", str(target))
    if refused:
        assert code == 2 and len([t for t in err.splitlines() if t.strip()]) == 1 and "qwen2 GGUF" in err, err
        assert not target.exists()
        return
    assert code == 0, err
    reader = gguf.GGUFReader(str(target))
    assert _value(reader, "general.architecture") == "qwen2" and _value(reader, "qwen2.rope.scaling.type") == "yarn"
    assert _value(reader, "qwen2.vocab_size") == 257
