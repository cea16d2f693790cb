"""GGUF exports run in llama.cpp (llama-cpp-python from ``.engines/llamacpp``, ``bash scripts/engines.sh llamacpp``)
and compared with ropekit's own model past the original window.

Marked slow and bounded; skipped in one line when llama.cpp is not installed. The tiny Llama (window 64, compared
on 120 tokens) runs PI (``linear``), NTK (``freq_base``), YaRN (``yarn``), YaRN with other betas, NTK-by-parts (saved
as transformers' ``longrope`` and written as ``rope_freqs``), llama3, Dynamic NTK frozen at its trained length and at a
freeze length, and CLEX at a fixed length. A trained byte-level BPE checks the ``gpt2`` vocabulary: llama.cpp splits
text into the same ids as the transformers tokenizer, and so do the Llama 3, Qwen2, Tekken, Mistral, Llama 2 and Gemma
style tokenizers of ``family_tokenizers.py``. SmolLM2-135M: YaRN factor 2 past its 8,192-token window, and one
passkey at 12k tokens retrieved by llama.cpp from the GGUF ``ropekit extend smollm2 --format gguf`` writes.
"""

from __future__ import annotations

import json
import subprocess

import pytest
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
