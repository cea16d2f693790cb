"""GGUF exports run in llama.cpp (llama-cpp-python from ``.engines/llamacpp``, ``bash scripts/engines.sh llamacpp``)
and compared with ropekit's own model past the original window.

Marked slow and bounded; skipped in one line when llama.cpp is not installed. The tiny Llama (window 64, compared
on 120 tokens) runs PI (``linear``), NTK (``freq_base``), YaRN (``yarn``), YaRN with other betas, NTK-by-parts (saved
as transformers' ``longrope`` and written as ``rope_freqs``), llama3, Dynamic NTK frozen at its trained length and at a
freeze length, and CLEX at a fixed length. Tiny Qwen2 and Qwen3 models (llama.cpp's qwen2/qwen3 graphs: NeoX rotation,
q/k/v biases, q/k norms) run plain RoPE, PI, NTK and YaRN, and Qwen2.5's/Qwen3's own YaRN (Qwen2.5 with tied
embeddings); a per-pair form is refused for them, since llama.cpp's qwen2 loader does not even load a rope_freqs tensor. A trained byte-level BPE checks the ``gpt2`` vocabulary: llama.cpp splits
text into the same ids as the transformers tokenizer, and so do the Llama 3, Qwen2, Tekken, Mistral, Llama 2 and Gemma
style tokenizers of ``family_tokenizers.py``. SmolLM2-135M: YaRN factor 2 past its 8,192-token window, and one
passkey at 12k tokens retrieved by llama.cpp from the GGUF ``ropekit extend smollm2 --format gguf`` writes.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from bpe_tokenizer import trained_bpe

import ropekit
from ropekit import RopekitError
from ropekit.engines import ENGINES, engine_python, run_engine, verify
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model

pytestmark = pytest.mark.slow

#: The tiny model's tolerance: measured max |Δ log p| is about 3e-7 (float32 everywhere, 120 tokens), and a wrong RoPE
#: moves log p by more than 1e-3 on this model (test_the_comparison_sees_a_wrong_rope).
TINY_TOLERANCE = 1e-4

CASES = {
    "pi": ({"factor": 2.0}, {}, "linear"),
    "ntk": ({"factor": 2.0}, {}, "freq_base"),
    "yarn": ({"factor": 2.0}, {}, "yarn"),
    "yarn-beta4": ({"factor": 2.0, "beta_fast": 4.0}, {}, "rope_freqs"),  # 16 would equal 32 here: ≤ 10 rotations
    "ntk_by_parts": ({"factor": 2.0}, {}, "rope_freqs"),
    "llama3": ({"factor": 2.0}, {}, "rope_freqs"),
    "dynamic_ntk-trained": ({"factor": 2.0, "trained_length": 128}, {}, "rope_freqs"),
    "dynamic_ntk-frozen": ({"factor": 2.0}, {"freeze_length": 120}, "rope_freqs"),
    "clex-frozen": ({"factor": 4.0}, {"freeze_length": 120}, "rope_freqs"),
}


@pytest.fixture(scope="module")
def llamacpp():
    try:
        return engine_python(ENGINES["llamacpp"])
    except RopekitError as err:
        pytest.skip(str(err))


def _tiny_export(root, case):
    params, save, _ = CASES[case]
    method = case.split("-")[0]
    model = build_tiny_model("llama", hidden_size=128, num_heads=2, num_kv_heads=1, window=64)
    ropekit.extend(model, method, **params)
    ropekit.save_pretrained(model, root / case, tokenizer=byte_tokenizer(), **save)
    return root / case


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES))
def test_tiny_llama_in_llamacpp_equals_ropekit(llamacpp, tmp_path, case):
    report = verify(_tiny_export(tmp_path, case), "llamacpp", length=120, tolerance=TINY_TOLERANCE)
    print("engine report:", json.dumps(report.as_dict()))  # the README table's numbers (pytest -s)
    assert report.passed, report.as_dict()
    assert report.details["positions_past_window"] > 50
    form = CASES[case][2]
    assert (f"type {form}" if form in ("linear", "yarn") else form) in report.details["gguf_rope"]
    print(f"{case}: max |Δ log p| {report.max_abs_diff:.2e}, mean {report.mean_abs_diff:.2e} ({report.details['gguf_rope']})")


@pytest.mark.timeout(300)
def test_the_comparison_sees_a_wrong_rope(llamacpp, tmp_path):
    """llama.cpp on the PI GGUF against ropekit's YaRN model: far outside the tolerance."""
    from ropekit.engines.verify import ropekit_logprobs, text_ids
    from ropekit.install.gguf_export import write_gguf

    models = {}
    for method in ("pi", "yarn"):
        models[method] = build_tiny_model("llama", hidden_size=128, num_heads=2, num_kv_heads=1, window=64)
        ropekit.extend(models[method], method, factor=2.0)
    write_gguf(models["pi"], byte_tokenizer(), tmp_path / "pi.gguf", outtype="f32")
    ids = text_ids(byte_tokenizer(), 256, 120)
    theirs = run_engine(ENGINES["llamacpp"], {"model": str(tmp_path / "pi.gguf"), "token_ids": [ids], "n_ctx": 128,
                                              "threads": 2})["logprobs"][0]
    ours = ropekit_logprobs(models["yarn"], ids)
    assert max(abs(a - b) for a, b in zip(ours[1:], theirs[1:])) > 10 * TINY_TOLERANCE


_TOKENIZE = """
import json, sys, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
texts = json.loads(open(sys.argv[2]).read())
print(json.dumps([llm.tokenize(t.encode(), add_bos=False, special=False) for t in texts]))
"""


@pytest.mark.timeout(300)
def test_a_gpt2_vocabulary_tokenizes_as_transformers(llamacpp, tmp_path):
    from ropekit.install.gguf_export import write_gguf

    tokenizer = trained_bpe()
    model = build_tiny_model("llama", vocab_size=len(tokenizer))
    ropekit.extend(model, "yarn", factor=2.0)
    write_gguf(model, tokenizer, tmp_path / "bpe.gguf", outtype="f32")
    texts = ["the quick brown fox jumps over the lazy dog", "def extend(model, method): return 42\n\tx = 'it's'"]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    (tmp_path / "tok.py").write_text(_TOKENIZE)
    done = subprocess.run([str(llamacpp), str(tmp_path / "tok.py"), str(tmp_path / "bpe.gguf"), str(tmp_path / "texts.json")],
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs == [tokenizer.encode(t, add_special_tokens=False) for t in texts]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family,model_family", [("llama3", "llama"), ("qwen2", "llama"), ("tekken", "mistral"),
                                                 ("mistral", "mistral"), ("llama2", "llama"), ("gemma", "llama")])
def test_the_families_vocabularies_tokenize_as_transformers(llamacpp, tmp_path, family, model_family):
    """Each family's tokenizer (tests/engines/family_tokenizers.py) written by ``write_gguf`` and tokenized by
    llama.cpp itself: the same ids as the tokenizer for every probe string. llama.cpp puts a ▁ before SentencePiece
    text even when the text starts with a space; a ``Metaspace`` tokenizer (mistral here) does not, so those probes
    are left out for it (the ``Prepend`` normalizer of llama2 does the same as llama.cpp and keeps them)."""
    from family_tokenizers import PROBES, family_tokenizer

    from ropekit.install.gguf_export import write_gguf

    tokenizer = family_tokenizer(family)
    model = build_tiny_model(model_family, vocab_size=len(tokenizer))
    write_gguf(model, tokenizer, tmp_path / "v.gguf", outtype="f32")
    texts = [t for t in PROBES if t and not (family == "mistral" and t[:1].isspace())]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    (tmp_path / "tok.py").write_text(_TOKENIZE)
    done = subprocess.run([str(llamacpp), str(tmp_path / "tok.py"), str(tmp_path / "v.gguf"), str(tmp_path / "texts.json")],
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs == [tokenizer.encode(t, add_special_tokens=False) for t in texts]


# ---- SmolLM2-135M ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_yarn(tmp_path_factory):
    from ropekit.models.loading import load_model

    directory = tmp_path_factory.mktemp("smollm2") / "yarn"
    loaded = load_model("smollm2")
    ropekit.extend(loaded.model, "yarn", factor=2.0)
    ropekit.save_pretrained(loaded.model, directory, tokenizer=loaded.tokenizer)
    return directory


@pytest.mark.smollm2
@pytest.mark.timeout(2400)
def test_smollm2_yarn_past_its_window_in_llamacpp(llamacpp, smollm2_yarn):
    report = verify(smollm2_yarn, "llamacpp", length=9000)
    print("engine report:", json.dumps(report.as_dict()))  # the README table's numbers (pytest -s)
    assert report.passed and report.details["positions_past_window"] >= 800, report.as_dict()
    print(f"smollm2 yarn: max |Δ log p| {report.max_abs_diff:.2e}, mean {report.mean_abs_diff:.2e}")


@pytest.mark.smollm2
@pytest.mark.timeout(2400)
def test_a_passkey_at_12k_through_llamacpp(llamacpp, tmp_path, run_cli):
    """SmolLM2 fails this key at 12k without extension (README); the GGUF of its YaRN factor-2 extension, with the
    vocabulary copied from the original GGUF, retrieves it in llama.cpp."""
    from ropekit.eval.common import first_integer
    from ropekit.eval.passkey import make_sample
    from ropekit.models.loading import load_model

    target = tmp_path / "smollm2-yarn.gguf"
    code, out, err = run_cli("extend", "smollm2", "--method", "yarn", "--factor", "2", "--format", "gguf",
                             "--outtype", "f32", "--out", str(target))
    assert code == 0, err
    assert "copied from" in out
    tokenizer = load_model("smollm2").tokenizer
    sample = make_sample(tokenizer, 12288, 0.5, 0, seed=0)
    ids = tokenizer(sample.prompt).input_ids
    response = run_engine(ENGINES["llamacpp"], {"model": str(target), "token_ids": [ids], "n_ctx": len(ids) + 16,
                                                "threads": 2, "logprobs": False, "generate": {"max_new_tokens": 10}})
    answer = tokenizer.decode(response["generated"][0])
    assert first_integer(answer) == sample.key, answer


# ---- Qwen2 / Qwen3 ----------------------------------------------------------------------------------------------

#: family → vocabulary size of the tiny Qwen. transformers 5 loads a saved qwen2 directory's tokenizer as
#: Qwen2Tokenizer, which appends <|endoftext|> (id 256) to the byte vocabulary; qwen3's stays at 256.
QWEN_VOCAB = {"qwen2": 257, "qwen3": 256}

QWEN_CASES = {  # method (None: the model's own RoPE), parameters, the form written
    "plain": (None, {}, "freq_base"),
    "pi": ("pi", {"factor": 2.0}, "linear"),
    "yarn": ("yarn", {"factor": 2.0}, "yarn"),
    "ntk": ("ntk", {"factor": 2.0}, "freq_base"),
}


def _tiny_qwen(family: str, *, tied: bool = False, shipped: str | None = None):
    from transformers import AutoModelForCausalLM

    from ropekit.models.tiny import tiny_config

    config = tiny_config(shipped or family, hidden_size=128, num_heads=2, num_kv_heads=1, window=64,
                         vocab_size=QWEN_VOCAB[family])
    config.tie_word_embeddings = tied
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("case", list(QWEN_CASES))
def test_tiny_qwen_in_llamacpp_equals_ropekit(llamacpp, tmp_path, family, case):
    method, params, form = QWEN_CASES[case]
    model = _tiny_qwen(family)
    if method:
        ropekit.extend(model, method, **params)
    ropekit.save_pretrained(model, tmp_path / case, tokenizer=byte_tokenizer())
    report = verify(tmp_path / case, "llamacpp", length=120, tolerance=TINY_TOLERANCE)
    print("engine report:", json.dumps(report.as_dict()))
    assert report.passed, report.as_dict()
    assert report.details["positions_past_window"] > 50
    assert (f"type {form}" if form in ("linear", "yarn") else form) in report.details["gguf_rope"]
    print(f"{family} {case}: max |Δ log p| {report.max_abs_diff:.2e}, mean {report.mean_abs_diff:.2e}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family,shipped,tied", [("qwen2", "qwen2.5-yarn", True), ("qwen3", "qwen3-yarn", False)])
def test_a_shipped_yarn_qwen_in_llamacpp_equals_ropekit(llamacpp, tmp_path, family, shipped, tied):
    """Qwen2.5's and Qwen3's own YaRN factor 4 (written as llama.cpp's yarn), Qwen2.5-0.5B's tied embeddings (no
    output.weight: llama.cpp uses token_embd), compared at 200 tokens past the 64-token original window."""
    model = _tiny_qwen(family, tied=tied, shipped=shipped)
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight) == tied
    ropekit.save_pretrained(model, tmp_path / shipped, tokenizer=byte_tokenizer())
    report = verify(tmp_path / shipped, "llamacpp", length=200, tolerance=TINY_TOLERANCE)
    print("engine report:", json.dumps(report.as_dict()))
    assert report.passed, report.as_dict()
    assert "type yarn, factor 4" in report.details["gguf_rope"]
    print(f"{shipped}: max |Δ log p| {report.max_abs_diff:.2e}, mean {report.mean_abs_diff:.2e}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_a_per_pair_method_on_qwen_is_refused_by_verify(llamacpp, tmp_path, run_cli, family):
    model = _tiny_qwen(family)
    ropekit.extend(model, "llama3", factor=2.0)
    ropekit.save_pretrained(model, tmp_path / "l3", tokenizer=byte_tokenizer())
    code, _, err = run_cli("verify", str(tmp_path / "l3"), "--engine", "llamacpp", "--length", "120")
    assert code == 2 and len([line for line in err.splitlines() if line.strip()]) == 1, err
    assert f"{family} GGUF" in err and "rope_freqs" in err


_LOAD = """
import sys, llama_cpp
try:
    llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, verbose=True)
    print("LOADED")
except ValueError:
    print("FAILED")
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch,loads", [("qwen2", False), ("llama", True)])
def test_llamacpp_reads_rope_freqs_for_llama_only(llamacpp, tmp_path, monkeypatch, arch, loads):
    """Why per-pair forms are refused for qwen2: llama.cpp's qwen2 loader creates no rope_freqs tensor, so a
    file carrying one fails its tensor count; the Llama loader takes it (control)."""
    import dataclasses

    import numpy as np

    from ropekit.install import gguf_export

    model = _tiny_qwen("qwen2") if arch == "qwen2" else build_tiny_model("llama", window=64)
    if arch == "qwen2":  # the 257th token is the Qwen2Tokenizer's; the byte vocabulary alone has 256
        model.resize_token_embeddings(256)
    written = gguf_export.gguf_rope

    def with_divisors(m, freeze_length=None):
        rope = written(m, freeze_length)
        return dataclasses.replace(rope, rope_freqs=np.full(rope.rotary_dim // 2, 2.0, dtype=np.float32))

    monkeypatch.setattr(gguf_export, "gguf_rope", with_divisors)
    gguf_export.write_gguf(model, byte_tokenizer(), tmp_path / "f.gguf", outtype="f32")
    (tmp_path / "load.py").write_text(_LOAD)
    done = subprocess.run([str(llamacpp), str(tmp_path / "load.py"), str(tmp_path / "f.gguf")], check=False,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == ("LOADED" if loads else "FAILED"), done.stderr[-2000:]
    if not loads:
        assert "wrong number of tensors" in done.stderr, done.stderr[-2000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_the_qwen_comparison_sees_a_wrong_rope(llamacpp, tmp_path, family):
    """llama.cpp on a Qwen PI GGUF against ropekit's YaRN model of the same weights: far outside the tolerance."""
    from ropekit.engines.verify import ropekit_logprobs, text_ids
    from ropekit.install.gguf_export import write_gguf

    models = {}
    for method in ("pi", "yarn"):
        models[method] = _tiny_qwen(family)
        if family == "qwen2":
            models[method].resize_token_embeddings(256)  # the byte vocabulary alone (no Qwen2Tokenizer here)
        ropekit.extend(models[method], method, factor=2.0)
    write_gguf(models["pi"], byte_tokenizer(), tmp_path / "pi.gguf", outtype="f32")
    ids = text_ids(byte_tokenizer(), 256, 120)
    theirs = run_engine(ENGINES["llamacpp"], {"model": str(tmp_path / "pi.gguf"), "token_ids": [ids], "n_ctx": 128,
                                              "threads": 2, "kv_type": "f32"})["logprobs"][0]
    assert max(abs(a - b) for a, b in zip(ropekit_logprobs(models["pi"], ids)[1:], theirs[1:])) < TINY_TOLERANCE
    assert max(abs(a - b) for a, b in zip(ropekit_logprobs(models["yarn"], ids)[1:], theirs[1:])) > 10 * TINY_TOLERANCE
