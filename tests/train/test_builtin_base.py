"""The study's built-in base model: tokenizer, retrieval documents, caching and determinism (small settings)."""

from __future__ import annotations

import itertools
import json
import random
import re

import pytest
import torch

from ropekit.eval.passkey import (
    FINAL_QUESTION,
    INFORMATION_LINE,
    KEY_RANGE,
    TASK_DESCRIPTION,
)
from ropekit.data.ruler import tasks as T
from ropekit.train import builtin_base


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


@pytest.fixture(scope="module")
def stdlib_bpe():
    """A 400-token BPE of 150 kB of the training split, and that text's words (the essay stand-in)."""
    _, texts = builtin_base._settings(0, None, train_bytes=150_000)
    return builtin_base.train_tokenizer(texts, 400), " ".join(texts).split()


NIAH_QUESTION = re.compile(r"\nWhat is the special magic number for (\S+) mentioned in the provided text\? "
                           r"The special magic number for \1 mentioned in the provided text is (\d{7})\.$")


@pytest.mark.parametrize("task", ["niah_single_1", "niah_single_2"])
def test_ruler_documents_are_the_eval_prompt_with_its_answer(task, stdlib_bpe):
    """Read independently of the generator: RULER's question about one key, answered with the value its needle
    gives; the haystack is the noise line or the training text given, never the evaluation's essay."""
    from ropekit.data.prose import prose_sentences

    tok, words = stdlib_bpe
    docs = builtin_base.ruler_documents(task, tok, 256, 40, random.Random(0), words)
    assert len(docs) == 40 and all(len(d) <= 256 for d in docs)
    texts = [tok.decode(d) for d in docs]
    assert len({len(d) for d in docs}) > 5  # haystacks of many sizes
    essay = set(prose_sentences()[:3000])
    for text in texts:
        key, value = NIAH_QUESTION.search(text).groups()
        assert text.count(f"One of the special magic numbers for {key} is: {value}.") == 1
        assert text.startswith("A special magic number is hidden within the following text.")
        haystack = text.split("I will quiz you about the number afterwards.\n", 1)[1].rsplit("\nWhat is", 1)[0]
        haystack = haystack.replace(f"One of the special magic numbers for {key} is: {value}.", "").strip()
        if task == "niah_single_1":
            assert set(filter(None, haystack.split("\n"))) <= {T.NOISE_LINE}
        elif haystack:
            assert all(w in words for w in haystack.split()) and not any(s in haystack for s in essay if len(s) > 40)
    with pytest.raises(ValueError, match="niah_single_1 needs"):
        builtin_base.ruler_documents("niah_single_1", tok, 64, 1, random.Random(0), words)


def test_retrieval_rows_mix_passkey_and_ruler_documents_by_the_share(stdlib_bpe):
    tok, words = stdlib_bpe
    natural = torch.tensor(tok(" ".join(words[:3000])).input_ids)
    passkey = [tok(builtin_base.passkey_document(random.Random(i), 4)).input_ids for i in range(20)]
    ruler = {t: builtin_base.ruler_documents(t, tok, 256, 20, random.Random(1), words) for t in ("niah_single_1", "niah_single_2")}
    for share in (0.0, 0.5, 1.0):
        settings = dict(builtin_base.SETTINGS, window=256, batch_size=4, retrieval_rows=1, passkey_share=share)
        cur = builtin_base.Curriculum(tok, natural, passkey, settings, seed=0, ruler_docs=ruler)
        gen = torch.Generator().manual_seed(4)
        starts = [tok.decode(cur.retrieval_row(gen)[:60]) for _ in range(200)]  # the first document of each row
        passkeys = sum(s.startswith(TASK_DESCRIPTION[:20]) for s in starts) / len(starts)
        rulers = sum(s.startswith("A special magic number") for s in starts) / len(starts)
        assert passkeys + rulers == 1 and abs(passkeys - share) < 0.1


@pytest.fixture()
def small_settings(monkeypatch):
    monkeypatch.setitem(builtin_base.SETTINGS, "train_bytes", 150_000)
    monkeypatch.setitem(builtin_base.SETTINGS, "vocab_size", 400)
    monkeypatch.setitem(builtin_base.SETTINGS, "batch_size", 4)
    monkeypatch.setitem(builtin_base.SETTINGS, "retrieval_rows", 1)
    monkeypatch.setitem(builtin_base.SETTINGS, "ruler_tasks", {})  # RULER's prompts need more than 64 tokens
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


def _curriculum(steps: int = 900, window: int = 64, batch_size: int = 4) -> builtin_base.Curriculum:
    texts = ["The pass key is 12345. Remember it.", "def f(x):\n    return x + 1  # the answer\n"] * 50
    tok = builtin_base.train_tokenizer(texts, 300)
    natural = torch.tensor([i for t in texts for i in tok(t).input_ids + [tok.eos_token_id]])
    docs = [tok(builtin_base.passkey_document(random.Random(i), 4)).input_ids[:window] for i in range(5)]
    settings = dict(builtin_base.SETTINGS, steps=steps, window=window, batch_size=batch_size, retrieval_rows=1)
    return builtin_base.Curriculum(tok, natural, docs, settings, seed=0), tok


def test_curriculum_phases_follow_the_settings():
    cur, _ = _curriculum()
    phases = [cur.phase(s) for s in range(900)]
    plan = builtin_base.SETTINGS["curriculum"]  # phase ends in steps, whatever the total
    assert phases.index("copy") == plan["trigram_until"] and phases.index("text") == plan["copy_until"]
    assert phases[:plan["trigram_until"]] == ["trigram"] * plan["trigram_until"]
    assert set(phases[plan["copy_until"]:]) == {"text"}
    gen = torch.Generator().manual_seed(0)
    for step in (0, 200, 850):  # every phase spends the same tokens per step
        assert cur.batch(step, gen).numel() == 4 * 64


def test_curriculum_alphabet_starts_with_the_digits_and_the_space_before_a_number():
    cur, tok = _curriculum()
    assert [tok.decode([int(t)]) for t in cur.alphabet[:11]] == list("0123456789") + [" "]
    assert len(set(cur.alphabet.tolist())) == len(cur.alphabet) == builtin_base.SETTINGS["curriculum"]["alphabet"]


def test_trigram_rows_follow_their_table_except_for_the_noise():
    cur, _ = _curriculum()
    index = {int(t): i for i, t in enumerate(cur.alphabet)}
    gen = torch.Generator().manual_seed(1)
    rows = [[index[int(t)] for t in cur.trigram_row(gen, 200)] for _ in range(20)]
    hits = [int(cur.table[r[i - 2], r[i - 1]]) == r[i] for r in rows for i in range(2, 200)]
    assert 0.78 <= sum(hits) / len(hits) <= 0.86  # 80 % by rule + 20 % × 1/32 by chance


def test_copy_rows_repeat_spans_of_distinct_alphabet_tokens():
    cur, tok = _curriculum()
    gen = torch.Generator().manual_seed(2)
    alphabet = set(cur.alphabet.tolist())
    for _ in range(20):
        row = cur.copy_row(gen, 256).tolist()
        assert len(row) == 256
        for group in _split(row, tok.eos_token_id)[:-1]:  # the last group is cut at the row's end
            size = next(n for n in range(8, 33) if len(group) % n == 0 and group == group[:n] * (len(group) // n)
                        and len(set(group[:n])) == n)
            assert set(group) <= alphabet and 2 <= len(group) // size <= 4


def test_text_batches_hold_passkey_copy_and_natural_rows():
    cur, tok = _curriculum()
    ids = cur.batch(899, torch.Generator().manual_seed(3))
    assert ids.shape == (4, 64)
    assert tok.decode(ids[0]).startswith(TASK_DESCRIPTION[:30])  # retrieval_rows = 1: a passkey document
    assert set(ids[1].tolist()) <= set(cur.alphabet.tolist()) | {tok.eos_token_id}  # copy_rows = 2
    assert set(ids[2].tolist()) <= set(cur.alphabet.tolist()) | {tok.eos_token_id}
    natural = cur.natural.unfold(0, 64, 1)
    assert (natural == ids[3]).all(dim=1).any()  # the rest: windows of the natural-text stream


def test_learning_rate_warms_up_in_steps_then_decays_to_a_tenth():
    settings = dict(builtin_base.SETTINGS, steps=1000, warmup=40, lr=1.0)
    lrs = [builtin_base.learning_rate(s, settings) for s in range(1000)]
    assert lrs[0] == pytest.approx(1 / 40) and lrs[39] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[39:])) and lrs[-1] == pytest.approx(0.1, abs=1e-4)


# ---- the shipped model ---------------------------------------------------------------------------------------
SHIPPED = builtin_base.SHIPPED_DIR


def _shipped_meta():
    if not builtin_base.is_cached(SHIPPED):
        pytest.fail(f"no shipped base model in {SHIPPED} (ropekit pretrain-base --force --ship)")
    return builtin_base.describe(SHIPPED)


def test_shipped_model_was_trained_with_the_current_settings():
    """A settings change without re-shipping (``ropekit pretrain-base --force --ship``) fails here, on any Python.

    Every setting is compared. The corpus is not a setting: it is the running interpreter's standard library,
    and :func:`builtin_base.shipped_model_path` deliberately ignores it too; its record must still describe the
    training split the settings ask for."""
    recorded = _shipped_meta()["settings"]
    expected, _ = builtin_base._settings(0, None)
    assert {k: v for k, v in recorded.items() if k != "corpus"} == \
        json.loads(json.dumps({k: v for k, v in expected.items() if k != "corpus"}))
    corpus = recorded["corpus"]
    assert corpus["name"] == expected["corpus"]["name"] == "python-stdlib-train"
    assert 0 < corpus["bytes"] <= recorded["train_bytes"] and re.fullmatch(r"[0-9a-f]{16}", corpus["digest"])
    assert builtin_base.shipped_model_path(0) == SHIPPED


def test_shipped_model_corpus_is_this_pythons_training_split():
    """The recorded corpus fingerprint is the training split of the Python that shipped the model.

    This compares data, not code: the split *is* the standard library's source text, which differs between
    Python minor versions, so on another version there is nothing this fingerprint could equal and the test says
    so in one line instead of passing. (The settings test above runs everywhere.)"""
    import platform

    from ropekit.runtime import settings_key

    meta = _shipped_meta()
    shipped_on = meta.get("python", "")
    if shipped_on.rsplit(".", 1)[0] != platform.python_version().rsplit(".", 1)[0]:
        pytest.skip(f"the shipped corpus is Python {shipped_on}'s standard library, this is "
                    f"{platform.python_version()}: no split here can carry its fingerprint")
    expected, _ = builtin_base._settings(0, None)
    assert meta["settings"]["corpus"] == expected["corpus"]
    assert settings_key(meta["settings"]) == settings_key(expected)


def test_pretrain_base_returns_the_shipped_model_without_training(tmp_path):
    _shipped_meta()
    fail = lambda *a: pytest.fail("trained instead of using the shipped model")
    assert builtin_base.pretrain_base(0, tmp_path, progress=False, on_step=fail) == SHIPPED
    assert builtin_base.base_model_path(0, tmp_path) == SHIPPED
    assert not list(tmp_path.iterdir())  # nothing cached
    # other settings, another seed, or shipped=False: not the shipped model
    assert builtin_base.shipped_model_path(1) is None and builtin_base.shipped_model_path(0, steps=7) is None
    assert builtin_base.base_model_path(0, tmp_path, shipped=False).parent == tmp_path


def test_an_unusable_cache_is_refused_before_any_training(tmp_path, run_cli, monkeypatch):
    """A cache that is a file: one line, exit 2, before the first pre-training step (it came after them)."""
    (tmp_path / "afile").write_text("keep")
    monkeypatch.setenv("ROPEKIT_CACHE", str(tmp_path / "afile"))
    steps = []
    monkeypatch.setattr(builtin_base, "pretrain", lambda *a, **k: steps.append(1) or pytest.fail("trained"))
    code, out, err = run_cli("pretrain-base", "--steps", "3", "--force")
    assert code == 2 and out == "" and "model cache" in err and len(err.strip().splitlines()) == 1
    assert steps == [] and (tmp_path / "afile").read_text() == "keep"


def test_shipped_model_loads_offline_and_is_small(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    from ropekit.models.loading import load_model

    meta = _shipped_meta()
    assert (SHIPPED / "model.safetensors").stat().st_size <= 20 * 2**20
    loaded = load_model(str(SHIPPED))
    model, tok = loaded.model, loaded.tokenizer
    cfg, settings = model.config, meta["settings"]
    assert cfg.max_position_embeddings == settings["window"] == 256
    rope_theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", None))
    assert rope_theta == settings["model"]["rope_theta"] and cfg.hidden_size == settings["model"]["hidden_size"]
    assert len(tok) == cfg.vocab_size == settings["vocab_size"] and tok.eos_token == builtin_base.EOS
    ids = torch.tensor([tok("def add(a, b):\n    return a + b\n").input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert torch.isfinite(logits).all() and next(model.parameters()).dtype == torch.float32


def test_a_pre_training_stopped_midway_resumes_to_the_same_weights(small_settings, tmp_path, monkeypatch):
    """Stopped after step 5 of 8 (a resume point every 2 steps), the rerun continues after step 4: its weights and
    its recorded losses equal an uninterrupted run's bit for bit, and no resume point is left behind."""
    from safetensors.torch import load_file

    monkeypatch.setattr(builtin_base, "CHECKPOINT_EVERY", 2)
    whole = builtin_base.pretrain_base(0, tmp_path / "whole", steps=8, progress=False, threads=1)

    def stop_after_5(done, total):
        if done == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        builtin_base.pretrain_base(0, tmp_path / "cut", steps=8, progress=False, threads=1, on_step=stop_after_5)
    (point,) = (tmp_path / "cut").glob("*.resume.pt")
    assert torch.load(point, weights_only=True)["step"] == 4
    seen = []
    resumed = builtin_base.pretrain_base(0, tmp_path / "cut", steps=8, progress=False, threads=1,
                                         on_step=lambda done, total: seen.append(done))
    assert seen == [5, 6, 7, 8]
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ma, mb = builtin_base.describe(whole), builtin_base.describe(resumed)
    assert (ma["initial_loss"], ma["final_loss"]) == (mb["initial_loss"], mb["final_loss"])
    assert not list((tmp_path / "cut").glob("*.resume.pt*"))


def test_ship_model_copies_a_model_that_then_matches(small_settings, tmp_path):
    path = builtin_base.pretrain_base(0, tmp_path / "cache", steps=2, progress=False, threads=1)
    target = builtin_base.ship_model(path, tmp_path / "shipped")
    assert (target / "model.safetensors").is_file() and builtin_base.describe(target)["python"]
    assert builtin_base.shipped_model_path(0, steps=2, shipped_dir=target) == target
    assert builtin_base.shipped_model_path(0, steps=3, shipped_dir=target) is None


def test_an_interrupted_ship_leaves_the_shipped_model_as_it_was(small_settings, tmp_path, monkeypatch):
    """The files were copied over the shipped ones one by one, the record last: a copy that failed half-way left
    new weights under the old record, which shipped_model_path still accepted, and stale files stayed."""
    import shutil

    first = builtin_base.pretrain_base(0, tmp_path / "cache", steps=2, progress=False, threads=1)
    target = builtin_base.ship_model(first, tmp_path / "shipped")
    (target / "stale.json").write_text("{}")
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    second = builtin_base.pretrain_base(1, tmp_path / "cache", steps=2, progress=False, threads=1)
    copies = {"n": 0}
    real = shutil.copyfile

    def fails_on_the_second(src, dst, *args, **kwargs):
        copies["n"] += 1
        if copies["n"] == 2:
            raise OSError("disk full")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", fails_on_the_second)
    with pytest.raises(OSError, match="disk full"):
        builtin_base.ship_model(second, target)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    monkeypatch.setattr(shutil, "copyfile", real)
    builtin_base.ship_model(second, target)  # whole: the new model, its record, no file of the old one
    assert not (target / "stale.json").exists() and builtin_base.describe(target)["settings"]["seed"] == 1


def _split(row: list[int], sep: int) -> list[list[int]]:
    groups, current = [], []
    for t in row:
        if t == sep:
            groups.append(current)
            current = []
        else:
            current.append(t)
    return groups + [current]
