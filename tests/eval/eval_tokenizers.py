"""Tokenizers the evaluation tests share: the byte tokenizer with a BOS, and a small trained BPE."""

from __future__ import annotations

from ropekit.models.byte_tokenizer import byte_tokenizer


def bos_byte_tokenizer():
    """The byte tokenizer with byte 1 prepended as BOS on every encode (ids stay < 256)."""
    from tokenizers import processors

    tok = byte_tokenizer()
    bos = tok.convert_ids_to_tokens(1)
    tok.add_special_tokens({"bos_token": bos})
    tok._tokenizer.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, 1)])
    return tok


def trained_bpe(texts, vocab_size=2048, *, eos="<eos>", bos="<bos>", pad=True):
    """A byte-level BPE trained on ``texts``: ``eos`` = 0, ``bos`` = 1 prepended to every text, EOS as padding."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[eos, bos],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=bos, pad_token=eos if pad else None,
                                   clean_up_tokenization_spaces=False)
