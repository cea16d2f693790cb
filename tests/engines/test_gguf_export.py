"""GGUF export for llama.cpp, without running llama.cpp (fast).

Each written file is read back with ``gguf.GGUFReader`` and compared with references computed here, never from
ropekit's own RoPE code: the papers' formulas written out (PI, NTK-aware base, NTK-by-parts' ratio ramp), and
transformers' own rope-init functions (``yarn``, ``llama3``, ``dynamic``). What llama.cpp makes of the keys, read from
its source (``src/llama-model.cpp``, ``src/llama-context.cpp``, ``ggml-cpu/ops.cpp``), is stated where a test relies on
it: ``rope_freqs`` divides ``θ_i``; ``linear`` multiplies by 1/factor; ``yarn`` multiplies cos/sin by
``(0.1·ln s + 1)·rope.scaling.attn_factor``; other types by ``rope.scaling.attn_factor``. The slow tests in
``test_llamacpp_slow.py`` run the files in llama.cpp.
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from bpe_tokenizer import trained_bpe
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import ropekit
from ropekit import RopekitError
from ropekit.install.gguf_export import write_gguf
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model

# the tiny Llama: hidden 64, 4 heads of 16 (8 rotary pairs), 2 KV heads, window 64, base 10,000
D, BASE, WINDOW, HEADS, KV_HEADS = 16, 10000.0, 64, 4, 2


def _plain_theta(base: float = BASE, d: int = D) -> np.ndarray:
    return base ** (-np.arange(0, d, 2, dtype=np.float64) / d)


def _write(tmp_path, method=None, *, outtype="f32", freeze_length=None, family="llama", name="m", **params):
    model = build_tiny_model(family)
    if method:
        ropekit.extend(model, method, **params)
    path = tmp_path / f"{name}.gguf"
    report = write_gguf(model, byte_tokenizer(), path, outtype=outtype, freeze_length=freeze_length)
    return model, gguf.GGUFReader(str(path)), report


def _value(reader, key):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _tensor(reader, name) -> np.ndarray | None:
    found = [t for t in reader.tensors if t.name == name]
    return None if not found else np.array(found[0].data)


def _hf_config(rope: dict, window: int = WINDOW) -> LlamaConfig:
    return LlamaConfig(hidden_size=64, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=D,
                       max_position_embeddings=window, rope_parameters={"rope_theta": BASE, **rope})


# --------------------------------------------------------------------------------------------------------------
# RoPE keys
# --------------------------------------------------------------------------------------------------------------


def test_pi_is_linear_scaling(tmp_path):
    _, reader, report = _write(tmp_path, "pi", factor=2.0)
    assert _value(reader, "general.architecture") == "llama"
    assert _value(reader, "llama.rope.scaling.type") == "linear"
    assert _value(reader, "llama.rope.scaling.factor") == 2.0
    assert _value(reader, "llama.rope.freq_base") == BASE
    assert _value(reader, "llama.rope.dimension_count") == D
    assert _value(reader, "llama.context_length") == 2 * WINDOW
    assert _tensor(reader, "rope_freqs.weight") is None and report["rope_form"] == "linear"


@pytest.mark.parametrize("factor", [2.0, 4.0])
def test_ntk_is_a_new_base(tmp_path, factor):
    _, reader, _ = _write(tmp_path, "ntk", factor=factor)
    expected = BASE * factor ** (D / (D - 2))  # LCEG Eq. 9: b' = b·s^(d/(d−2))
    assert _value(reader, "llama.rope.scaling.type") == "none"
    assert _value(reader, "llama.rope.freq_base") == pytest.approx(expected, rel=1e-7)
    assert _tensor(reader, "rope_freqs.weight") is None


def test_abf_is_a_new_base(tmp_path):
    _, reader, _ = _write(tmp_path, "abf", rope_theta=500000.0)
    assert _value(reader, "llama.rope.freq_base") == 500000.0 and _value(reader, "llama.rope.scaling.type") == "none"


@pytest.mark.parametrize("factor,attention_factor", [(2.0, None), (4.0, None), (4.0, 1.25)])
def test_yarn_keys_make_llamacpps_temperature_ropekits(tmp_path, factor, attention_factor):
    params = {"factor": factor} if attention_factor is None else {"factor": factor, "attention_factor": attention_factor}
    _, reader, _ = _write(tmp_path, "yarn", **params)
    rope = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": WINDOW}
    if attention_factor is not None:
        rope["attention_factor"] = attention_factor
    _, hf_factor = ROPE_INIT_FUNCTIONS["yarn"](_hf_config(rope, int(WINDOW * factor)), None)
    assert _value(reader, "llama.rope.scaling.type") == "yarn"
    assert _value(reader, "llama.rope.scaling.factor") == factor
    assert _value(reader, "llama.rope.scaling.original_context_length") == WINDOW
    assert _value(reader, "llama.rope.freq_base") == BASE
    # llama.cpp multiplies cos/sin by (0.1·ln s + 1)·attn_factor (llama-context.cpp cancels the kernel's own term)
    written = _value(reader, "llama.rope.scaling.attn_factor")
    assert written * (0.1 * math.log(factor) + 1.0) == pytest.approx(hf_factor, rel=1e-6)
    assert _tensor(reader, "rope_freqs.weight") is None
    assert "llama.rope.scaling.yarn_log_multiplier" not in reader.fields  # it would replace the temperature


def test_yarn_with_other_betas_goes_per_pair(tmp_path):
    """llama.cpp's Llama architecture does not read yarn_beta_* from the file (its context defaults 32/1 hold):
    YaRN with β_fast = 16 is written as divisors and the whole attention factor."""
    _, reader, _ = _write(tmp_path, "yarn", factor=4.0, beta_fast=16.0)
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": WINDOW, "beta_fast": 16.0,
            "beta_slow": 1.0}
    inv_freq, hf_factor = ROPE_INIT_FUNCTIONS["yarn"](_hf_config(rope, 4 * WINDOW), None)
    assert _value(reader, "llama.rope.scaling.type") == "none"
    np.testing.assert_allclose(_tensor(reader, "rope_freqs.weight"), _plain_theta() / inv_freq.double().numpy(), rtol=2e-6)
    assert _value(reader, "llama.rope.scaling.attn_factor") == pytest.approx(hf_factor, rel=1e-6)


@pytest.mark.parametrize("factor,beta_fast,beta_slow", [(2.0, 32.0, 1.0), (4.0, 8.0, 2.0)])
def test_ntk_by_parts_ratio_ramp_divisors(tmp_path, factor, beta_fast, beta_slow):
    _, reader, _ = _write(tmp_path, "ntk_by_parts", factor=factor, beta_fast=beta_fast, beta_slow=beta_slow)
    theta = _plain_theta()
    r = WINDOW * theta / (2 * math.pi)  # YaRN §3.2: r(d) = L/λ_d
    gamma = np.clip((r - beta_slow) / (beta_fast - beta_slow), 0.0, 1.0)  # the §3.2 ramp (α = β_slow, β = β_fast)
    scaled = (1 - gamma) * theta / factor + gamma * theta
    assert _value(reader, "llama.rope.scaling.type") == "none"
    assert _value(reader, "llama.rope.freq_base") == BASE
    np.testing.assert_allclose(_tensor(reader, "rope_freqs.weight"), theta / scaled, rtol=2e-6)
    assert "llama.rope.scaling.attn_factor" not in reader.fields  # no temperature: llama.cpp's default 1


def test_ntk_by_parts_dim_ramp_equals_transformers_yarn_without_temperature(tmp_path):
    _, reader, _ = _write(tmp_path, "ntk_by_parts", factor=4.0, ramp="dim")
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": WINDOW, "attention_factor": 1.0}
    inv_freq, _ = ROPE_INIT_FUNCTIONS["yarn"](_hf_config(rope, 4 * WINDOW), None)
    np.testing.assert_allclose(_tensor(reader, "rope_freqs.weight"), _plain_theta() / inv_freq.double().numpy(), rtol=2e-6)


def test_llama3_divisors_equal_transformers(tmp_path):
    _, reader, _ = _write(tmp_path, "llama3", factor=4.0)
    rope = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": WINDOW}
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](_hf_config(rope, 4 * WINDOW), None)
    divisors = _tensor(reader, "rope_freqs.weight")
    np.testing.assert_allclose(divisors, _plain_theta() / inv_freq.double().numpy(), rtol=2e-6)
    assert divisors[0] == pytest.approx(1.0) and divisors[-1] == pytest.approx(4.0)


def test_pi_on_a_llama3_model_composes_into_the_divisors(tmp_path):
    _, reader, _ = _write(tmp_path, "pi", family="llama3", factor=2.0)
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": WINDOW}
    base_inv, _ = ROPE_INIT_FUNCTIONS["llama3"](_hf_config(rope, 8 * WINDOW), None)
    np.testing.assert_allclose(_tensor(reader, "rope_freqs.weight"), 2.0 * _plain_theta() / base_inv.double().numpy(),
                               rtol=2e-6)


def test_frozen_dynamic_ntk(tmp_path):
    """LCEG's Dynamic NTK with trained length C' = 2C is one set of frequencies up to C' (frozen there by itself);
    transformers' `dynamic` at seq_len C' computes the same base."""
    _, reader, report = _write(tmp_path, "dynamic_ntk", factor=2.0, trained_length=2 * WINDOW)
    inv_freq, _ = ROPE_INIT_FUNCTIONS["dynamic"](_hf_config({"rope_type": "dynamic", "factor": 2.0}), None, 2 * WINDOW)
    np.testing.assert_allclose(_tensor(reader, "rope_freqs.weight"), _plain_theta() / inv_freq.double().numpy(), rtol=2e-6)
    assert report["frozen_at"] == 2 * WINDOW and _value(reader, "llama.context_length") == 2 * WINDOW


def test_dynamic_ntk_with_a_freeze_length(tmp_path):
    _, reader, _ = _write(tmp_path, "dynamic_ntk", factor=2.0, freeze_length=100)
    inv_freq, _ = ROPE_INIT_FUNCTIONS["dynamic"](_hf_config({"rope_type": "dynamic", "factor": 2.0}), None, 100)
    np.testing.assert_allclose(_tensor(reader, "rope_freqs.weight"), _plain_theta() / inv_freq.double().numpy(), rtol=2e-6)
    assert _value(reader, "llama.context_length") == 100 and _value(reader, "ropekit.frozen_at") == 100


def test_clex_at_a_fixed_length(tmp_path):
    """Untrained CLEX (zero-initialised ODE) at scale t = L/C: its ODE's time term ∂_t ln θ_i = −(4i/(d−2))/(2t − 1)
    integrates from t = 1 to NTK-aware scaling with α = 2t − 1 (LCEG Eq. 9 at that α), up to RK4's error."""
    _, reader, _ = _write(tmp_path, "clex", factor=4.0, freeze_length=2 * WINDOW)
    alpha = 2 * 2.0 - 1
    ntk = _plain_theta(BASE * alpha ** (D / (D - 2)))
    np.testing.assert_allclose(_tensor(reader, "rope_freqs.weight"), _plain_theta() / ntk, rtol=1e-5)


def test_a_longrope_export_directory_is_written_per_pair(tmp_path, run_cli):
    """NTK-by-parts saved as transformers' longrope (one factor set) and exported from the directory."""
    model = build_tiny_model("llama")
    ropekit.extend(model, "ntk_by_parts", factor=2.0)
    saved = ropekit.save_pretrained(model, tmp_path / "dir", tokenizer=byte_tokenizer())
    assert saved["format"] == "longrope"
    code, out, err = run_cli("export", str(tmp_path / "dir"), "--format", "gguf", "--outtype", "f32")
    assert code == 0, err
    reader = gguf.GGUFReader(str(tmp_path / "dir" / "model-f32.gguf"))
    long_factor = np.array(saved["rope_parameters"]["long_factor"])  # λ_i of transformers' longrope: θ'_i = θ_i/λ_i
    np.testing.assert_allclose(_tensor(reader, "rope_freqs.weight"), long_factor, rtol=2e-6)
    assert "rope_freqs.weight" in out


def test_an_unextended_model_is_plain_rope(tmp_path):
    _, reader, report = _write(tmp_path)
    assert _value(reader, "llama.rope.scaling.type") == "none" and _value(reader, "llama.rope.freq_base") == BASE
    assert _value(reader, "llama.context_length") == WINDOW and report["method"] is None


# --------------------------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------------------------


def _naive_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    d = weight.shape[0] // heads
    out = np.empty_like(weight)
    for h in range(heads):
        for j in range(d // 2):
            out[h * d + 2 * j] = weight[h * d + j]
            out[h * d + 2 * j + 1] = weight[h * d + d // 2 + j]
    return out


def _rope_rotate_half(x, theta, pos):  # transformers' layout: channel j pairs with j + d/2
    d = x.shape[0]
    out = x.copy()
    for j in range(d // 2):
        c, s = math.cos(pos * theta[j]), math.sin(pos * theta[j])
        out[j] = x[j] * c - x[j + d // 2] * s
        out[j + d // 2] = x[j + d // 2] * c + x[j] * s
    return out


def _rope_adjacent(x, theta, pos):  # ggml's LLAMA_ROPE_TYPE_NORM: channels 2j and 2j+1 pair up
    out = x.copy()
    for j in range(x.shape[0] // 2):
        c, s = math.cos(pos * theta[j]), math.sin(pos * theta[j])
        out[2 * j] = x[2 * j] * c - x[2 * j + 1] * s
        out[2 * j + 1] = x[2 * j] * s + x[2 * j + 1] * c
    return out


def test_q_and_k_are_permuted_to_ggmls_layout_and_rotate_alike(tmp_path):
    model, reader, _ = _write(tmp_path, "pi", factor=2.0)
    state = model.state_dict()
    theta = _plain_theta() / 2.0
    x = np.random.default_rng(0).standard_normal(64)
    for layer in range(2):
        for proj, heads, gguf_name in (("q_proj", HEADS, "attn_q"), ("k_proj", KV_HEADS, "attn_k")):
            hf = state[f"model.layers.{layer}.self_attn.{proj}.weight"].numpy().astype(np.float64)
            written = _tensor(reader, f"blk.{layer}.{gguf_name}.weight").astype(np.float64)
            np.testing.assert_array_equal(written, _naive_permute(hf, heads))
            # the rotation llama.cpp applies to the written rows equals transformers' on the original rows
            for head in range(heads):
                rows = slice(head * D, (head + 1) * D)
                ours = _rope_rotate_half(hf[rows] @ x, theta, pos=37)
                theirs = _rope_adjacent(written[rows] @ x, theta, pos=37)
                np.testing.assert_allclose(theirs, _naive_permute(ours[:, None], 1)[:, 0], rtol=1e-12, atol=1e-12)
    for hf_name, gguf_name in (("model.layers.1.self_attn.v_proj.weight", "blk.1.attn_v.weight"),
                               ("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight"),
                               ("model.embed_tokens.weight", "token_embd.weight"),
                               ("lm_head.weight", "output.weight"), ("model.norm.weight", "output_norm.weight")):
        np.testing.assert_array_equal(_tensor(reader, gguf_name), state[hf_name].numpy())


def test_transformers_reads_the_file_back_to_the_same_model(tmp_path):
    """transformers' own GGUF loader (its inverse of llama.cpp's q/k permutation, its tensor-name map, its gpt2
    tokenizer conversion) rebuilds the plain model bit for bit from an f32 file."""
    from ropekit.models.loading import load_model

    tokenizer = trained_bpe()
    model = build_tiny_model("llama", vocab_size=len(tokenizer))
    write_gguf(model, tokenizer, tmp_path / "plain.gguf", outtype="f32")
    loaded = load_model(str(tmp_path / "plain.gguf"))
    text = "the quick brown fox jumps over the lazy dog; def extend(model, method)"
    ids = torch.tensor([tokenizer.encode(text)])
    assert loaded.tokenizer.encode(text) == ids[0].tolist()
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, model(ids).logits)


@pytest.mark.parametrize("outtype,kind,tolerance,tiny", [("f16", "F16", 2 ** -11, 2 ** -25), ("bf16", "BF16", 2 ** -8, 0),
                                                         ("q8_0", "Q8_0", None, 0)])
def test_outtypes(tmp_path, outtype, kind, tolerance, tiny):
    model, reader, _ = _write(tmp_path, "ntk_by_parts", outtype=outtype, factor=2.0)
    assert _value(reader, "general.file_type") == int(getattr(gguf.LlamaFileType, {"f16": "MOSTLY_F16",
                                                     "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}[outtype]))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["rope_freqs.weight"] == "F32" and types["blk.0.attn_norm.weight"] == "F32"
    assert types["blk.0.ffn_up.weight"] == kind and types["token_embd.weight"] == kind
    original = model.state_dict()["model.layers.0.mlp.up_proj.weight"].numpy()
    found = next(t for t in reader.tensors if t.name == "blk.0.ffn_up.weight")
    restored = gguf.quants.dequantize(np.array(found.data), found.tensor_type).reshape(original.shape)
    if tolerance is not None:
        # relative rounding; f16's subnormals (below 2^-14) have a fixed step of 2^-24
        np.testing.assert_allclose(restored, original, rtol=tolerance, atol=tiny)
    else:  # Q8_0: 32-value blocks, one f16 scale max|x|/127 each, values rounded to the nearest step: off by at
        # most half a step plus 127 steps times the scale's f16 rounding (2^-11)
        blocks = original.reshape(-1, 32)
        step = np.abs(blocks).max(axis=1, keepdims=True) / 127
        error = np.abs(restored.reshape(-1, 32) - blocks)
        assert np.all(error <= step * (0.5 + 127 * 2 ** -11) * 1.001)
        assert error.max() > 0  # quantized, not copied


# --------------------------------------------------------------------------------------------------------------
# Vocabularies
# --------------------------------------------------------------------------------------------------------------


def test_the_byte_tokenizer_becomes_a_token_id_model(tmp_path):
    """No merges (ids are bytes) and a GGUF cannot hold an empty merge list, which llama.cpp's gpt2 vocabulary
    requires: the file says tokenizer model `none` and the vocabulary size, which llama.cpp runs on token ids."""
    _, reader, report = _write(tmp_path, "pi", factor=2.0)
    assert _value(reader, "tokenizer.ggml.model") == "none" and _value(reader, "llama.vocab_size") == 256
    assert "tokenizer.ggml.tokens" not in reader.fields and report["vocabulary"].startswith("none")


def test_tokens_beyond_the_embeddings_are_named_with_the_class_that_added_them(tmp_path):
    """transformers 5 loads a saved Qwen2 directory's tokenizer as Qwen2Tokenizer whatever tokenizer_config.json says,
    and that class adds '<|endoftext|>' after the 256 byte ids: the refusal names the token and the class."""
    from transformers import AutoTokenizer

    from ropekit.errors import UnsupportedModelError
    from ropekit.install.gguf_vocab import gguf_vocabulary

    model = build_tiny_model("qwen2")
    model.save_pretrained(tmp_path)
    byte_tokenizer().save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    extra = [i for i in range(len(reloaded)) if i >= model.config.vocab_size]
    assert extra, "transformers no longer adds tokens to this tokenizer: the test needs another case"
    with pytest.raises(UnsupportedModelError) as refused:
        gguf_vocabulary(reloaded, model.config.vocab_size)
    line = refused.value.one_line()
    assert type(reloaded).__name__ in line and repr(reloaded.convert_ids_to_tokens(extra[0])) in line
    assert f"{len(extra)} token(s)" in line and "\n" not in line
    gguf_vocabulary(reloaded, len(reloaded))  # with an embedding per id the same tokenizer is written


def test_a_byte_level_bpe_is_a_gpt2_vocabulary(tmp_path):
    import json

    tokenizer = trained_bpe()
    model = build_tiny_model("llama", vocab_size=len(tokenizer) + 3)  # 3 ids the tokenizer never produces
    ropekit.extend(model, "yarn", factor=2.0)
    write_gguf(model, tokenizer, tmp_path / "bpe.gguf", outtype="f32")
    reader = gguf.GGUFReader(str(tmp_path / "bpe.gguf"))
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    tokens = _value(reader, "tokenizer.ggml.tokens")
    assert _value(reader, "tokenizer.ggml.model") == "gpt2" and _value(reader, "tokenizer.ggml.pre") == "gpt-2"
    assert len(tokens) == len(tokenizer) + 3
    assert all(tokens[i] == t for t, i in vocab.items())
    assert tokens[-3:] == [f"[PAD{i}]" for i in range(len(tokenizer), len(tokenizer) + 3)]
    types = _value(reader, "tokenizer.ggml.token_type")
    eos = tokenizer.eos_token_id
    assert types[eos] == gguf.TokenType.CONTROL and types[-1] == gguf.TokenType.UNUSED
    assert types[vocab["Ġ" if "Ġ" in vocab else "a"]] == gguf.TokenType.NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    assert _value(reader, "tokenizer.ggml.merges") == merges and merges
    assert _value(reader, "tokenizer.ggml.eos_token_id") == eos


# --------------------------------------------------------------------------------------------------------------
# Refusals: one line, exit code 2, nothing written
# --------------------------------------------------------------------------------------------------------------


def _refused(run_cli, tmp_path, *args, must: tuple[str, ...]):
    out = tmp_path / "out"
    code, _, err = run_cli("extend", *args, "--format", "gguf", "--out", str(out))
    assert code == 2, err
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err
    for word in must:
        assert word in err, err
    assert not out.exists() and not any(tmp_path.glob("**/*.gguf*"))
    return err


@pytest.mark.parametrize("method,params,reason", [
    ("self_extend", ["--param", "group_size=4", "--param", "window_size=16"], "which keys a query sees"),
    ("lm_infinite", ["--factor", "2"], "which keys a query sees"),
    ("dual_chunk", ["--factor", "2"], "which keys a query sees"),
    ("landmark", ["--factor", "2"], "which keys a query sees"),
    ("harpe", ["--param", "strategy=uniform", "--param", "b_min=1e4", "--param", "b_max=4e4"], "own RoPE base"),
    ("entropy_abf", ["--factor", "2"], "query position"),
])
def test_attention_side_methods_are_refused(run_cli, tmp_path, method, params, reason):
    _refused(run_cli, tmp_path, "tiny", "--method", method, *params, must=(method, reason))


@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn", "clex"])
def test_length_dependent_methods_need_a_freeze_length(run_cli, tmp_path, method):
    _refused(run_cli, tmp_path, "tiny", "--method", method, "--factor", "2", must=(method, "--freeze-length"))


def test_longrope_with_two_sets_is_refused(run_cli, tmp_path):
    _refused(run_cli, tmp_path, "tiny", "--method", "longrope", "--factor", "2", "--param",
             "long_factor=" + ",".join(["2"] * 8), must=("longrope", "configured context size"))


def test_longrope_with_start_tokens_is_refused(run_cli, tmp_path):
    """Positions below n̂ rotate with other frequencies than the rest: no per-pair rope_freqs tensor holds that."""
    _refused(run_cli, tmp_path, "tiny", "--method", "longrope", "--factor", "2", "--param",
             "long_factor=" + ",".join(["2"] * 8), "--param", "short_factor=" + ",".join(["2"] * 8), "--param", "start_tokens=4",
             must=("longrope", "start_tokens"))


@pytest.mark.parametrize("family", ["gemma3_text", "gpt-neox", "phi3"])
def test_other_architectures_are_refused(run_cli, tmp_path, family):
    arch = family.replace("-", "_")
    _refused(run_cli, tmp_path, f"tiny-{family}", "--method", "pi", "--factor", "2",
             must=(f"'{arch}'", "Llama, Mistral, Qwen2 and Qwen3"))


def test_a_mistral_with_a_sliding_window_is_refused(tmp_path):
    """llama.cpp's Llama graph attends to the whole context; Mistral 7B v0.1's 4096-token window has no place there."""
    model = build_tiny_model("mistral")
    model.config.sliding_window = 16
    with pytest.raises(RopekitError, match="sliding window of 16"):
        write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf")
    assert not any(tmp_path.iterdir())


def test_a_mistral_window_shorter_than_a_frozen_length_is_refused(tmp_path):
    """Dynamic NTK keeps max_position_embeddings at the original window, so a window equal to it passes the plain
    check; frozen at 2× the file declares 128 tokens, and transformers' window then changes the logits (shown here)
    where llama.cpp would attend to everything."""
    model = build_tiny_model("mistral")
    window = int(model.config.max_position_embeddings)
    model.config.sliding_window = window
    ropekit.extend(model, "dynamic_ntk", factor=2.0)
    ids = torch.randint(0, 256, (1, 2 * window))
    with torch.no_grad():
        windowed = model(ids).logits[0, -1]
        model.config.sliding_window = None
        whole = model(ids).logits[0, -1]
        model.config.sliding_window = window
    assert (windowed - whole).abs().max() > 1e-3  # the window matters at this length
    with pytest.raises(RopekitError, match=f"sliding window of {window} tokens, shorter than the {2 * window}"):
        write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf", freeze_length=2 * window)
    assert not any(tmp_path.iterdir())
    model.config.sliding_window = 2 * window  # a window that covers the declared context: written
    write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf", freeze_length=2 * window)


def test_cli_extend_writes_a_gguf_and_refuses_to_overwrite(run_cli, tmp_path):
    target = tmp_path / "yarn.gguf"
    code, out, err = run_cli("extend", "tiny", "--method", "yarn", "--factor", "2", "--format", "gguf",
                             "--outtype", "q8_0", "--out", str(target))
    assert code == 0, err
    assert "rope.scaling.type yarn" in out
    assert _value(gguf.GGUFReader(str(target)), "llama.rope.scaling.type") == "yarn"
    before = target.stat().st_mtime_ns
    code, _, err = run_cli("extend", "tiny", "--method", "pi", "--factor", "2", "--format", "gguf", "--out", str(target))
    assert code == 2 and "exists" in err and target.stat().st_mtime_ns == before
    code, _, err = run_cli("extend", "tiny", "--method", "pi", "--factor", "2", "--format", "gguf", "--outtype", "q4",
                           "--out", str(tmp_path / "x.gguf"))
    assert code == 2 and "outtype" in err and not (tmp_path / "x.gguf").exists()


def test_an_error_while_writing_leaves_nothing(tmp_path, monkeypatch):
    model = build_tiny_model("llama")
    ropekit.extend(model, "pi", factor=2.0)

    def broken(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", broken)
    with pytest.raises(OSError):
        write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf")
    assert list(Path(tmp_path).iterdir()) == []


def test_python_api_refusal_is_one_line(tmp_path):
    model = build_tiny_model("llama")
    ropekit.extend(model, "dynamic_yarn", factor=2.0)
    with pytest.raises(RopekitError) as err:
        write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf")
    assert "\n" not in str(err.value) and "dynamic_yarn" in str(err.value)
    assert not (tmp_path / "m.gguf").exists()
    assert torch.is_tensor(model.model.rotary_emb.inv_freq)  # the model is untouched


def test_the_gguf_conversion_bar_follows_transformers_progress_switch(tmp_path, capfd):
    """transformers draws a plain tqdm bar while converting GGUF tensors, out of reach of its progress-bar switch;
    while ropekit has that switch off (every CLI command does), the bar stays off too."""
    from transformers.utils import logging as hf_logging

    from ropekit.models.loading import load_model

    tokenizer = trained_bpe()
    write_gguf(build_tiny_model("llama", vocab_size=len(tokenizer)), tokenizer, tmp_path / "m.gguf", outtype="f32")
    was = hf_logging.is_progress_bar_enabled()
    try:
        hf_logging.enable_progress_bar()
        capfd.readouterr()
        load_model(str(tmp_path / "m.gguf"))
        assert "de-quantizing GGUF tensors" in capfd.readouterr().err  # the bar exists: what is hidden below
        hf_logging.disable_progress_bar()
        load_model(str(tmp_path / "m.gguf"))
        assert "de-quantizing GGUF tensors" not in capfd.readouterr().err
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def test_a_gguf_of_token_ids_only_reopens_without_a_tokenizer(tmp_path, run_cli):
    """The tiny model's byte-level tokenizer has no merges, so its GGUF says ``tokenizer.ggml.model none``: reopening
    it failed on transformers' GGUF tokenizer. It now loads as a model without a tokenizer, with the same logits as
    the model it was written from (transformers' own GGUF reader doing the decoding), and an evaluation that needs a
    tokenizer says so in one line."""
    from ropekit.models.loading import load_model

    model, reader, _ = _write(tmp_path)
    assert _value(reader, "tokenizer.ggml.model") == "none"
    loaded = load_model(str(tmp_path / "m.gguf"))
    assert loaded.tokenizer is None
    ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = model(ids).logits, loaded.model(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    code, _, err = run_cli("eval", "passkey", str(tmp_path / "m.gguf"), "--lengths", "64")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "needs a tokenizer" in err, err


@pytest.mark.parametrize("method, params, freeze, words", [
    ("yarn", {"factor": 2.0}, None, "rope.scaling.type yarn"),
    ("pi", {"factor": 2.0}, None, "rope.scaling.type linear"),
    ("dynamic_ntk", {"factor": 2.0}, 100, "a rope_freqs tensor"),
])
def test_a_gguf_whose_rope_scaling_transformers_drops_is_refused(tmp_path, method, params, freeze, words):
    """transformers' GGUF loader reads rope.freq_base and nothing else of the RoPE: a YaRN GGUF loaded as plain
    RoPE (its logits the unextended model's) and `inspect` called it rope_type default. Now one line."""
    from ropekit.models.loading import load_model

    _, reader, _ = _write(tmp_path, method, freeze_length=freeze, **params)
    direct = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf")  # what the loader would give
    assert direct.config.rope_parameters.get("rope_type", "default") == "default"
    with pytest.raises(RopekitError, match=f"scales its RoPE .*{words}"):
        load_model(str(tmp_path / "m.gguf"))


def test_a_freeze_length_for_a_static_method_is_refused_in_a_gguf_too(tmp_path):
    """YaRN's frequencies do not depend on the length: --freeze-length 1000 wrote the same tensors with the declared
    context changed to 1000 tokens (eight times the extended window); a huge one was an internal error."""
    for length, words in ((1000, "changes nothing for yarn"), (10**20, "past")):
        with pytest.raises(RopekitError, match=words):
            _write(tmp_path, "yarn", freeze_length=length, factor=2.0)
        assert not (tmp_path / "m.gguf").exists()


def test_a_frozen_export_is_written_at_its_own_freeze_length_and_no_other(run_cli, tmp_path):
    """A directory saved frozen holds the frequencies of that length (ropekit.load gives them back as they are):
    its GGUF declares that length; another --freeze-length would declare a length its frequencies are not of.
    The reference: Dynamic NTK's base at 256 tokens, written directly, has other divisors than the 128 file."""
    frozen = tmp_path / "dn128"
    code, _, err = run_cli("extend", "tiny", "--method", "dynamic_ntk", "--factor", "2", "--freeze-length", "128",
                           "--out", str(frozen))
    assert code == 0, err
    code, _, err = run_cli("export", str(frozen), "--format", "gguf", "--freeze-length", "256", "--outtype", "f32",
                           "--out", str(tmp_path / "at256.gguf"))
    assert code == 2 and "frozen at 128 tokens" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.glob("*.gguf*"))
    code, _, err = run_cli("export", str(frozen), "--format", "gguf", "--outtype", "f32", "--out", str(tmp_path / "a.gguf"))
    assert code == 0, err
    reader = gguf.GGUFReader(str(tmp_path / "a.gguf"))
    assert _value(reader, "llama.context_length") == 128
    inv_freq, _ = ROPE_INIT_FUNCTIONS["dynamic"](_hf_config({"rope_type": "dynamic", "factor": 2.0}), None, 128)
    np.testing.assert_allclose(_tensor(reader, "rope_freqs.weight"), _plain_theta() / inv_freq.double().numpy(), rtol=2e-6)


def test_a_freeze_length_past_a_static_base_window_is_refused(tmp_path):
    """The plain model's frequencies are the same at every length: a freeze length past its window only declared a
    longer context in the file."""
    model = build_tiny_model("llama")
    with pytest.raises(RopekitError, match="changes nothing for this model's own RoPE"):
        write_gguf(model, byte_tokenizer(), tmp_path / "m.gguf", freeze_length=4 * WINDOW)
    assert not any(tmp_path.iterdir())
