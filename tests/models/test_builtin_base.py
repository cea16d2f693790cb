"""The study's built-in base model: tokenizer, retrieval documents, caching and determinism (small settings)."""

from __future__ import annotations

import random

import pytest
import torch

from ropekit.eval.passkey import FINAL_QUESTION, INFORMATION_LINE, KEY_RANGE
from ropekit.models import builtin_base


def test_tokenizer_splits_digits_and_round_trips():
    texts = ["The pass key is 12345. Remember it.", "def f(x):\n    return x + 1\n"] * 50
    tok = builtin_base.train_tokenizer(texts, 300)
    ids = tok("key 40213").input_ids
    pieces = [tok.decode([i]) for i in ids]
    assert pieces[-5:] == ["4", "0", "2", "1", "3"]  # one token per digit, as Llama's tokenizer
    for text in ("The pass key is 98765.", "unseen wörds ✓ and\ttabs"):
        assert tok.decode(tok(text).input_ids) == text
    assert tok.eos_token == builtin_base.EOS and tok.pad_token_id == tok.eos_token_id
    assert tok.model_max_length >= 10**9  # evaluations go far past the training window


def test_passkey_documents_are_the_eval_prompt_with_its_answer():
    rng = random.Random(0)
    for _ in range(50):
        doc = builtin_base.passkey_document(rng, max_sentences=30)
        head, answer = doc.rsplit(FINAL_QUESTION, 1)
        key = int(answer.strip().rstrip("."))
        assert KEY_RANGE[0] <= key <= KEY_RANGE[1]
        assert INFORMATION_LINE.format(k=key) in head


@pytest.fixture()
def small_settings(monkeypatch):
    monkeypatch.setitem(builtin_base.SETTINGS, "train_bytes", 150_000)
    monkeypatch.setitem(builtin_base.SETTINGS, "vocab_size", 400)
    monkeypatch.setitem(builtin_base.SETTINGS, "batch_size", 4)
    monkeypatch.setitem(builtin_base.SETTINGS, "retrieval_rows", 1)
    monkeypatch.setitem(builtin_base.SETTINGS, "window", 64)
    monkeypatch.setitem(builtin_base.SETTINGS, "model", {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                                                          "num_kv_heads": 1, "rope_theta": 10000.0})


def test_pretrain_is_cached_deterministic_and_loadable(small_settings, tmp_path):
    steps_seen = []
    path = builtin_base.pretrain_base(0, tmp_path / "a", steps=4, progress=False, threads=1,
                                      on_step=lambda n, total: steps_seen.append((n, total)))
    assert steps_seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert builtin_base.is_cached(path) and path.name.startswith("base-llama-")
    assert path == builtin_base.base_model_path(0, tmp_path / "a", steps=4)
    meta = builtin_base.describe(path)
    assert meta["settings"]["steps"] == 4 and meta["settings"]["corpus"]["name"] == "python-stdlib-train"
    # a second call finds the cache (no training: on_step is not called)
    again = builtin_base.pretrain_base(0, tmp_path / "a", steps=4, progress=False, on_step=lambda *a: pytest.fail("retrained"))
    assert again == path
    # the same settings elsewhere give the same weights; another seed gives other weights and another entry
    other = builtin_base.pretrain_base(0, tmp_path / "b", steps=4, progress=False, threads=1)
    seeded = builtin_base.pretrain_base(1, tmp_path / "b", steps=4, progress=False, threads=1)
    assert seeded.name != other.name
    from ropekit.models.loading import load_model

    a, b, c = (load_model(str(p)) for p in (path, other, seeded))
    for (name, x), (_, y), (_, z) in zip(a.model.state_dict().items(), b.model.state_dict().items(), c.model.state_dict().items()):
        assert torch.equal(x, y), name
    assert any(not torch.equal(x, z) for x, z in zip(a.model.state_dict().values(), c.model.state_dict().values()))
    assert a.tokenizer is not None and a.model.config.max_position_embeddings == 64
    assert a.model.config.eos_token_id == a.tokenizer.eos_token_id
