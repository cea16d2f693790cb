"""The study's built-in base model: a small Llama pre-trained here, from scratch, with its own tokenizer.

The controlled study (paper 002's protocol at laptop scale) needs one base model that every method
starts from, and it must exist offline on a 2-core CPU. :func:`pretrain_base` builds it:

1. a byte-level BPE tokenizer (``tokenizers``; digits split one per token, as Llama's) trained on the
   training text below;
2. a 4-layer Llama (GQA 4/2 heads, head size 32, RoPE base 10,000) trained at a 256-token window on
   the *training* split of the Python standard-library sources (:mod:`ropekit.data.local_text`; their
   docstrings are its English) and on synthetic retrieval documents — the passkey prompt of
   :mod:`ropekit.eval.passkey` (Landmark/YaRN/PoSE's) with its answer — meant to make the base model
   retrieve *within* its window, so that retrieval beyond it measures the method. Within the 5-minute
   budget it learns the format but not the copying (see :func:`pretrain_base`). The held-out
   split and the language-reference prose, which make up the built-in evaluation corpus
   (:mod:`ropekit.data.corpora`), are never trained on;
3. the result is cached under ``$ROPEKIT_CACHE`` (default ``~/.cache/ropekit``) as ``base-llama-<hash>``,
   the hash covering every setting and a fingerprint of the corpus: a normal ``save_pretrained`` directory
   with its tokenizer, loadable by ``ropekit.load_model(path)`` or any transformers code.

Deterministic for a seed on a given machine (fixed threads, deterministic kernels).
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from ..data.local_text import corpus_digest, stdlib_documents
from ..demo import (
    _lr_at,
    _progress,
    _save_atomically,
    _settings_key,
    cache_root,
    default_threads,
    deterministic,
    pretrain_step,
)
from ..eval.passkey import KEY_RANGE, build_prompt

#: Bump when training changes in a way SETTINGS does not capture (invalidates cached models).
CACHE_FORMAT = 2
#: File in the model directory recording how it was trained.
META_FILE = "ropekit_base.json"
#: The end-of-text token (also padding); the tokenizer's only special token.
EOS = "<|endoftext|>"

#: Everything that defines the base model; with the corpus fingerprint its hash names the cache entry.
SETTINGS: dict[str, Any] = {
    "format": CACHE_FORMAT,
    "vocab_size": 2048,
    "model": {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "rope_theta": 10000.0},
    "window": 256,
    "steps": 700,
    "batch_size": 16,
    "lr": 2e-3,
    # rows of each batch packed with passkey documents (the rest is natural text)
    "retrieval_rows": 4,
    "train_bytes": 3_000_000,
}


def passkey_document(rng: random.Random, max_sentences: int) -> str:
    """One passkey prompt of :mod:`ropekit.eval.passkey` with the answer after it, at a random size and depth."""
    key = rng.randint(*KEY_RANGE)
    n_garbage = rng.randint(0, max_sentences)
    return build_prompt(n_garbage, rng.randint(0, n_garbage), key) + f" {key}."


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE trained on ``texts`` (digits one per token), as a ``PreTrainedTokenizerFast`` with EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    # no model_max_length: evaluations go far past the training window on purpose
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   clean_up_tokenization_spaces=False, model_max_length=10**9)


def _settings(seed: int, steps: int | None) -> tuple[dict[str, Any], list[str]]:
    documents = stdlib_documents(SETTINGS["train_bytes"], "train")
    settings = dict(SETTINGS, seed=int(seed),
                    corpus={"name": "python-stdlib-train", "bytes": sum(map(len, documents)),
                            "digest": corpus_digest(documents)})
    if steps is not None:
        settings["steps"] = int(steps)
    return settings, [d.decode("ascii") for d in documents]


def base_model_path(seed: int = 0, cache_dir=None, *, steps: int | None = None) -> Path:
    """Where :func:`pretrain_base` keeps (or will keep) the model for these settings."""
    settings, _ = _settings(seed, steps)
    return cache_root(cache_dir) / f"base-llama-{_settings_key(settings)}"


def is_cached(path: Path) -> bool:
    return (path / META_FILE).is_file() and (path / "config.json").is_file() and (path / "tokenizer.json").is_file()


def pretrain_base(seed: int = 0, cache_dir=None, *, steps: int | None = None, use_cache: bool = True,
                  progress: bool = True, threads: int | None = None, on_step=None) -> Path:
    """Train (or find cached) the built-in base model; returns its directory (model + tokenizer + meta).

    Each step is a batch of ``batch_size`` rows of ``window`` tokens: ``retrieval_rows`` rows are passkey
    documents packed back to back (EOS between them), the rest are random windows of the training stream.

    Known limit (measured, see the README): within this budget the model learns the passkey *format*
    (it answers with a 5-digit number) but not to copy the key — that needs induction heads, whose
    content-matching half did not form in 950 steps even on pure repeated-random-span data
    (fixed-offset copying, by contrast, is learned in about 100 steps).

    AdamW (β 0.9/0.95), warm-up then cosine decay, gradient clipping at 1.
    ``on_step(done, total)`` is called after every step (a study's progress bar).
    """
    settings, texts = _settings(seed, steps)
    path = cache_root(cache_dir) / f"base-llama-{_settings_key(settings)}"
    if use_cache and is_cached(path):
        return path
    from .tiny import build_tiny_model

    rng = random.Random(f"ropekit-base|{seed}")
    window, batch_size, total = settings["window"], settings["batch_size"], settings["steps"]
    retrieval = [passkey_document(rng, max_sentences=window // 8) for _ in range(8000)]
    tokenizer = train_tokenizer(texts + retrieval[:200], settings["vocab_size"])
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for ids in tokenizer(texts).input_ids:
        stream.extend(ids + [eos])
    natural = torch.tensor(stream)
    retrieval_ids = [ids[:window] for ids in tokenizer(retrieval).input_ids]
    n_retrieval = settings["retrieval_rows"]
    threads = threads or default_threads()
    started = time.perf_counter()
    losses: list[float] = []
    with deterministic(threads):
        model = build_tiny_model("llama", seed=seed, vocab_size=len(tokenizer), window=window, **settings["model"])
        model.config.eos_token_id = model.config.pad_token_id = model.config.bos_token_id = eos
        model.generation_config.eos_token_id = model.generation_config.pad_token_id = eos
        model.train()
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=settings["lr"], betas=(0.9, 0.95), weight_decay=0.01)
        offsets = torch.arange(window)
        bar = _progress() if progress else contextlib.nullcontext()
        with bar:
            job = bar.add_task("pre-training the base model", total=total, info="") if progress else None
            for step in range(total):
                starts = torch.randint(0, len(natural) - window, (batch_size,), generator=gen)
                ids = natural[starts[:, None] + offsets]
                for row in range(n_retrieval):  # passkey documents back to back, the last one cut at the window
                    packed: list[int] = []
                    while len(packed) < window:
                        packed += retrieval_ids[int(torch.randint(0, len(retrieval_ids), (1,), generator=gen))] + [eos]
                    ids[row] = torch.tensor(packed[:window])
                losses.append(pretrain_step(model, opt, ids, _lr_at(step, total, settings["lr"]),
                                            attention_mask=torch.ones_like(ids)))
                if progress:
                    recent = sum(losses[-20:]) / len(losses[-20:])
                    bar.update(job, advance=1, info=f"loss {recent:.3f}")
                if on_step is not None:
                    on_step(step + 1, total)
        model.eval()
    meta = {
        "settings": settings,
        "train_seconds": round(time.perf_counter() - started, 1),
        "threads": threads,
        "initial_loss": losses[0],
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "corpus_note": "python-stdlib training split (sources and their docstrings) + synthetic passkey documents",
    }
    return _save_atomically(model, path, meta, extra=tokenizer.save_pretrained, meta_file=META_FILE)


def load_base(seed: int = 0, cache_dir=None, **kwargs):
    """``(model, tokenizer)`` of the built-in base model, pre-training it first when it is not cached."""
    from ..models.loading import load_model

    path = pretrain_base(seed, cache_dir, **kwargs)
    loaded = load_model(str(path))
    return loaded.model, loaded.tokenizer


def describe(path: Path) -> dict[str, Any]:
    """The recorded training facts of a base model directory."""
    return json.loads((Path(path) / META_FILE).read_text())
