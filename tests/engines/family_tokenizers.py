"""Small tokenizers trained on the spot with the pre-tokenizer pipelines of the checkpoints users bring (no hub
access in the tests): each is the family's ``tokenizer.json`` pipeline as published, over a vocabulary of a few
hundred tokens learned from a short text.

* ``llama3``: byte-level BPE, ``Split`` with Llama 3's regex (digits in runs of up to three), ``ByteLevel`` without
  regex, ``ignore_merges``; ``<|begin_of_text|>`` added in front (TemplateProcessing), specials after the BPE
  vocabulary (ids 128000+ in the real one).
* ``qwen2``: byte-level BPE, ``NFC`` normalizer, ``Split`` with Qwen2's regex (transformers' own
  ``Qwen2Tokenizer`` pattern; single digits), no BOS; ``<|endoftext|>``/``<|im_start|>``/``<|im_end|>`` special and
  ``<think>`` a plain added token, as in Qwen3.
* ``tekken``: byte-level BPE with Mistral NeMo's regex, ``ignore_merges``, the specials at ids 0–2 inside the BPE
  vocabulary (as Tekken's are), ``<s>`` added in front.
* ``mistral``: SentencePiece-style BPE with byte fallback: ``<unk> <s> </s>``, the 256 ``<0xNN>`` byte pieces, then
  the learned pieces; merges derived from the pieces' scores the way transformers converts a SentencePiece model
  (``generate_merges``); ``Metaspace`` prepending ``▁`` to the first section (transformers 5's ``LlamaTokenizer``);
  ``<s>`` added in front.
* ``llama2``: the same vocabulary with the older normalizer form (``Prepend("▁")`` + ``Replace(" ", "▁")``).
* ``gemma``: the same kind of vocabulary with Gemma's layout (``<pad> <eos> <bos> <unk>``) and no space prefix
  (``Replace(" ", "▁")`` normalizer, ``Split(" ")`` pre-tokenizer); ``<bos>`` added in front.
"""

from __future__ import annotations

TEXT = [
    "The quick brown fox jumps over the lazy dog. It's 2024, and we've got 12345 reasons; they'll say I'm right.\n",
    "def extend(model, method='yarn', factor=2.0):\n    return model  # scaled RoPE\n\n",
    "Über naïve café résumé — 東京 の 天気 は 晴れ. Ça va? 3.14159 ≈ π.\n",
    "    indented    with   runs of spaces\t\ttabs\r\nand CRLF lines\n",
]

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

#: The strings the GGUF's tokenizer must split exactly as the source does.
PROBES = [
    "Hello world",
    "  leading spaces and trailing   ",
    "digits 1 12 123 1234 12345678 and 3.14159",
    "I'm sure they'll say it's OK; WE'VE DONE IT",
    "def f(x):\n    return x ** 2  # square\n\n\tpass",
    "Über naïve café — 東京の天気 ✓ 🚀 emoji",
    "a\r\nb\n\n\nc",
    "unseen wordz qwxyzzy",
    "ledom ledsca dohtem nruter kciuq",  # reversed words: pieces the merges reach in a different order
    "",
]


def _byte_level(regex: str, *, nfc: bool, ignore_merges: bool, specials_first: list[str], specials_after: list[str],
                plain_added: list[str], bos: str | None, eos: str, pad: str | None = None):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=specials_first, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT * 3, trainer)
    tok.add_special_tokens(specials_after)
    if plain_added:
        tok.add_tokens(plain_added)
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad)


def _sentencepiece(style: str):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.tokenization_utils_base import generate_merges

    gemma = style == "gemma"
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"] if gemma else ["<unk>", "<s>", "</s>"]
    bos, eos, unk = ("<bos>", "<eos>", "<unk>") if gemma else ("<s>", "</s>", "<unk>")
    # SentencePiece never merges across a word boundary (split_by_whitespace): learn with ▁-initial words
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never" if gemma else "first", split=True)
    learner.train_from_iterator(TEXT * 3, trainers.BpeTrainer(vocab_size=420, show_progress=False))
    learned = sorted(learner.get_vocab().items(), key=lambda kv: kv[1])
    vocab = {t: i for i, t in enumerate(specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in learned:
        vocab.setdefault(piece, len(vocab))
    scores = {piece: -float(vocab[piece]) for piece, _ in learned}  # SentencePiece: learning order
    merges = generate_merges(vocab, scores)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, byte_fallback=True, fuse_unk=True))
    tok.add_special_tokens(specials)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if style == "mistral":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    elif style == "llama2":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    else:
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    if not gemma:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                       special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, unk_token=unk,
                                   pad_token="<pad>" if gemma else None)


def family_tokenizer(family: str):
    """The ``PreTrainedTokenizerFast`` of ``family`` (see the module text)."""
    if family == "llama3":
        return _byte_level(LLAMA3_REGEX, nfc=False, ignore_merges=True, specials_first=[],
                           specials_after=["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], plain_added=[],
                           bos="<|begin_of_text|>", eos="<|end_of_text|>")
    if family == "qwen2":
        from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

        return _byte_level(PRETOKENIZE_REGEX, nfc=True, ignore_merges=False, specials_first=[],
                           specials_after=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], plain_added=["<think>"],
                           bos=None, eos="<|im_end|>", pad="<|endoftext|>")
    if family == "tekken":
        return _byte_level(TEKKEN_REGEX, nfc=False, ignore_merges=True, specials_first=["<unk>", "<s>", "</s>"],
                           specials_after=[], plain_added=[], bos="<s>", eos="</s>")
    if family in ("mistral", "llama2", "gemma"):
        return _sentencepiece(family)
    raise ValueError(family)
