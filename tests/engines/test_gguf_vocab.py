"""GGUF vocabularies of the tokenizers users bring, checked against the tokenizers' own ids (fast).

The independent reader is transformers' GGUF tokenizer loader (``AutoTokenizer.from_pretrained(dir,
gguf_file=...)``): it rebuilds a tokenizer from the file's metadata alone: the byte-level BPE from
``tokens``/``merges`` with the split regex it keeps per ``tokenizer.ggml.pre`` name, the SentencePiece-style BPE from
``tokens`` and ``scores`` (it derives the merges from the scores, as llama.cpp's score-driven merging uses them; ropekit
writes no merges for it). Each family's ids for a set of probe strings (unicode, digits, whitespace runs,
contractions, code, CRLF, byte fallback) must equal the source tokenizer's.

What llama.cpp expects of each family's keys is read from its source (``src/llama-vocab.cpp``: ``llama-bpe`` and
``tekken`` set ``ignore_merges`` and add BOS; ``qwen2`` and ``smollm`` keep the BPE default of no BOS; the
``llama`` (SentencePiece) model adds BOS and a space prefix unless the file says otherwise) and from its converter
(``convert_hf_to_gguf.py``: Mistral is written as architecture ``llama``, Qwen2/Qwen3 and Gemma as their own).
"""

from __future__ import annotations

import gguf
import pytest
import torch
from family_tokenizers import PROBES, family_tokenizer

import ropekit
from ropekit import RopekitError
from ropekit.install.gguf_export import write_gguf
from ropekit.install.gguf_vocab import gguf_vocabulary
from ropekit.models.tiny import build_tiny_model

#: family -> (tokenizer family, GGUF architecture llama.cpp's converter writes, tokenizer.ggml.model, .pre,
#: add_bos, add_space_prefix)
FAMILIES = {
    "llama3": ("llama3", "llama", "gpt2", "llama-bpe", True, None),
    "qwen2": ("qwen2", "qwen2", "gpt2", "qwen2", False, None),
    "qwen3": ("qwen2", "qwen3", "gpt2", "qwen2", False, None),  # Qwen3 ships Qwen2's tokenizer
    "mistral-nemo": ("tekken", "llama", "gpt2", "tekken", True, None),
    "mistral": ("mistral", "llama", "llama", "default", True, True),
    "llama2": ("llama2", "llama", "llama", "default", True, True),
    "gemma": ("gemma", "gemma3", "llama", "default", True, False),
}


def _value(reader, key):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _vocab_only_gguf(tokenizer, arch: str, path, extra: int = 2):
    """The vocabulary ropekit writes, alone in a GGUF of ``arch`` (the architecture llama.cpp's converter gives the
    family), for a model with ``extra`` embeddings past the tokenizer."""
    vocab = gguf_vocabulary(tokenizer, len(tokenizer) + extra)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_vocab_size(len(tokenizer) + extra)
    vocab.write(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    return vocab


def _probes(family: str) -> list[str]:
    if family == "llama2":
        # the Prepend("▁") normalizer puts ▁ before text that starts with a space too, as llama.cpp's
        # add_space_prefix does; transformers' reader rebuilds a Metaspace, which does not: it cannot judge those
        return [p for p in PROBES if not p[:1].isspace()]
    return PROBES


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_gguf_tokenizes_as_the_source(tmp_path, family):
    kind, arch, model, pre, add_bos, space_prefix = FAMILIES[family]
    from transformers import AutoTokenizer

    source = family_tokenizer(kind)
    _vocab_only_gguf(source, arch, tmp_path / "v.gguf")
    back = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="v.gguf")
    for text in _probes(kind):
        assert back.encode(text) == source.encode(text), text
        assert back.encode(text, add_special_tokens=False) == source.encode(text, add_special_tokens=False), text
    assert len(source.encode("a", add_special_tokens=False)) < len(source.encode("x" * 40, add_special_tokens=False))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_keys_are_what_llamacpp_expects(tmp_path, family):
    kind, arch, model, pre, add_bos, space_prefix = FAMILIES[family]
    source = family_tokenizer(kind)
    _vocab_only_gguf(source, arch, tmp_path / "v.gguf")
    reader = gguf.GGUFReader(str(tmp_path / "v.gguf"))
    assert _value(reader, "tokenizer.ggml.model") == model and _value(reader, "tokenizer.ggml.pre") == pre
    assert _value(reader, "tokenizer.ggml.add_bos_token") is add_bos
    assert _value(reader, "tokenizer.ggml.add_eos_token") is False
    assert _value(reader, "tokenizer.ggml.add_space_prefix") == space_prefix
    assert _value(reader, "tokenizer.ggml.eos_token_id") == source.eos_token_id
    assert _value(reader, "tokenizer.ggml.bos_token_id") == source.bos_token_id
    tokens, types = _value(reader, "tokenizer.ggml.tokens"), _value(reader, "tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == len(source) + 2
    assert tokens[-2:] == [f"[PAD{len(source)}]", f"[PAD{len(source) + 1}]"]
    assert types[-1] == gguf.TokenType.UNUSED
    for token_id in {source.eos_token_id, source.bos_token_id} - {None}:
        assert types[token_id] == gguf.TokenType.CONTROL
    if model == "gpt2":
        assert "tokenizer.ggml.scores" not in reader.fields and _value(reader, "tokenizer.ggml.merges")
    else:
        assert "tokenizer.ggml.merges" not in reader.fields  # llama.cpp merges by score; the reader must too
        assert types[source.convert_tokens_to_ids("<0x0A>")] == gguf.TokenType.BYTE
        assert len(_value(reader, "tokenizer.ggml.scores")) == len(tokens)


def test_a_plain_added_token_stays_user_defined(tmp_path):
    """Qwen3's ``<think>`` is an added token the tokenizer does not call special: llama.cpp's converter types it
    user-defined (matched whole, printed as text), the special ones control."""
    source = family_tokenizer("qwen2")
    _vocab_only_gguf(source, "qwen3", tmp_path / "v.gguf")
    types = _value(gguf.GGUFReader(str(tmp_path / "v.gguf")), "tokenizer.ggml.token_type")
    assert types[source.convert_tokens_to_ids("<think>")] == gguf.TokenType.USER_DEFINED
    assert types[source.convert_tokens_to_ids("<|im_start|>")] == gguf.TokenType.CONTROL


def test_sentencepiece_scores_follow_the_merge_ranks(tmp_path):
    """llama.cpp merges the adjacent pair whose joined piece scores highest: a piece made by an earlier merge must
    score higher (gguf's LlamaHfVocab alone gives every piece -1000)."""
    import json

    source = family_tokenizer("mistral")
    _vocab_only_gguf(source, "llama", tmp_path / "v.gguf")
    reader = gguf.GGUFReader(str(tmp_path / "v.gguf"))
    scores = dict(zip(_value(reader, "tokenizer.ggml.tokens"), _value(reader, "tokenizer.ggml.scores")))
    merges = json.loads(source.backend_tokenizer.to_str())["model"]["merges"]
    made = []
    for left, right in merges:
        if left + right not in made:
            made.append(left + right)
    ranked = [scores[piece] for piece in made]
    assert ranked == sorted(ranked, reverse=True) and len(set(ranked)) == len(ranked)


@pytest.mark.parametrize("family,model_family", [("llama3", "llama"), ("mistral", "mistral"), ("tekken", "mistral")])
def test_a_model_with_the_tokenizer_round_trips_through_transformers(tmp_path, family, model_family):
    """The whole file (RoPE keys, weights, vocabulary) read back by transformers: same ids, same logits."""
    from ropekit.models.loading import load_model

    tokenizer = family_tokenizer(family)
    model = build_tiny_model(model_family, vocab_size=len(tokenizer))
    report = write_gguf(model, tokenizer, tmp_path / "m.gguf", outtype="f32")
    assert report["vocabulary"].startswith("llama" if family == "mistral" else "gpt2")
    loaded = load_model(str(tmp_path / "m.gguf"))
    text = "It's 2024: def f(x): return x ** 12345  # Über café"
    ids = tokenizer.encode(text)
    assert loaded.tokenizer.encode(text) == ids
    with torch.no_grad():
        assert torch.equal(loaded.model(torch.tensor([ids])).logits, model(torch.tensor([ids])).logits)


def test_a_saved_directory_exports_from_the_cli(tmp_path, run_cli):
    """``ropekit export DIR --format gguf`` on a directory holding a Llama 3 style tokenizer."""
    tokenizer = family_tokenizer("llama3")
    model = build_tiny_model("llama", vocab_size=len(tokenizer))
    ropekit.extend(model, "yarn", factor=2.0)
    ropekit.save_pretrained(model, tmp_path / "dir", tokenizer=tokenizer)
    code, out, err = run_cli("export", str(tmp_path / "dir"), "--format", "gguf", "--outtype", "f32")
    assert code == 0, err
    reader = gguf.GGUFReader(str(tmp_path / "dir" / "model-f32.gguf"))
    assert _value(reader, "tokenizer.ggml.pre") == "llama-bpe" and "llama-bpe" in out


# --------------------------------------------------------------------------------------------------------------
# Refusals: one line naming llama.cpp's converter, nothing written
# --------------------------------------------------------------------------------------------------------------

def _gpt4o_like():
    """A byte-level BPE whose split regex (GPT-4o's case-aware words) ropekit does not map to a llama.cpp name."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    regex = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|\p{N}{1,3}|\s+"
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["some text 123"] * 3, trainers.BpeTrainer(
        vocab_size=270, special_tokens=["<|end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>")


def _wordpiece():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["some text here"] * 3, trainers.WordPieceTrainer(
        vocab_size=60, special_tokens=["[UNK]", "[SEP]"], show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[SEP]")


def _with(family: str, edit):
    """``family``'s tokenizer with its tokenizer.json changed by ``edit(spec)``."""
    import json

    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    source = family_tokenizer(family)
    spec = json.loads(source.backend_tokenizer.to_str())
    edit(spec)
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                   bos_token=source.bos_token, eos_token=source.eos_token)


@pytest.mark.parametrize("make,why", [
    (_gpt4o_like, "split regex"),
    (_wordpiece, "WordPiece"),
    (lambda: _with("llama3", lambda s: s["model"].update(ignore_merges=False)), "ignore_merges"),
    (lambda: _with("llama3", lambda s: s.update(normalizer={"type": "NFKC"})), "normalizer NFKC"),
    (lambda: _with("mistral", lambda s: s.update(normalizer={"type": "Lowercase"})), "Lowercase"),
])
def test_other_tokenizers_are_refused_naming_llamacpps_converter(tmp_path, run_cli, make, why):
    tokenizer = make()
    with pytest.raises(RopekitError) as caught:
        gguf_vocabulary(tokenizer, len(tokenizer))
    line = str(caught.value)
    assert "\n" not in line and why in line and "convert_hf_to_gguf.py" in line, line

    model = build_tiny_model("llama", vocab_size=len(tokenizer))
    ropekit.save_pretrained(model, tmp_path / "dir", tokenizer=tokenizer)
    before = sorted(p.name for p in (tmp_path / "dir").iterdir())
    code, out, err = run_cli("export", str(tmp_path / "dir"), "--format", "gguf")
    assert code == 2 and len([x for x in err.splitlines() if x.strip()]) == 1, err
    assert "convert_hf_to_gguf.py" in err
    assert sorted(p.name for p in (tmp_path / "dir").iterdir()) == before
