"""A byte-level transformers tokenizer for the tiny models: token id == UTF-8 byte value.

The tiny models (vocabulary 256) have no trained tokenizer, yet every text evaluation (passkey, needle,
RULER, …) needs one with the real ``PreTrainedTokenizerFast`` API: ``encode``/``decode``/``__call__``,
special-token handling and a chat template slot. This builds one from the ``tokenizers`` library with no
learned merges, so lengths in tokens are lengths in bytes and any text round-trips exactly.
"""

from __future__ import annotations

from functools import lru_cache


def _byte_to_char() -> dict[int, str]:
    """GPT-2's reversible byte → printable-character map (what ``ByteLevel`` pre-tokenisation emits)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


@lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in _byte_to_char().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str()


def byte_tokenizer():
    """A fresh ``PreTrainedTokenizerFast`` over bytes; byte 0 doubles as the end-of-text / padding token.

    No BOS is added (the tiny models were never trained with one), so ``len(tok(text).input_ids)`` equals
    ``len(text.encode())``.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_tokenizer_json()), clean_up_tokenization_spaces=False)
    eos = _byte_to_char()[0]
    tok.eos_token = eos
    tok.pad_token = eos
    return tok
