"""A small byte-level BPE tokenizer trained on the spot (the tiny models' own tokenizer has no merges, which
llama.cpp's ``gpt2`` vocabulary needs): the GGUF vocabulary tests write and load it."""

from __future__ import annotations


def trained_bpe():
    """A ``PreTrainedTokenizerFast``: GPT-2's byte-level pre-tokenizer, 300 tokens (256 bytes, one special
    ``<|endoftext|>`` used as BOS and EOS, and the merges learned from two short texts)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["the quick brown fox jumps over the lazy dog " * 4, "def extend(model, method): return model\n" * 4]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
