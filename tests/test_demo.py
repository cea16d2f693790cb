"""The default demo: offline corpus, tiny-model pre-training with its cache, and the loss table."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from ropekit import demo
from ropekit.runtime import cache as runtime_cache
from ropekit.train import pretrain
from ropekit.data import local_text
from ropekit.data.local_text import ByteTokenizer, corpus_digest, split_of, stdlib_documents, stdlib_files
from ropekit.errors import InvalidParameterError, UnknownMethodError
from ropekit.methods import list_methods
from ropekit.methods.ntk import ntk_base
from ropekit.models.tiny import TINY_WINDOW, build_tiny_model

#: A model small enough to train in seconds but long enough (300 steps) to use its context. One thread:
#: the weights are the same as with two (test below), and a busy test machine slows two threads a lot.
SMALL = dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, train_bytes=300_000, batch_size=16, threads=1)
SMALL_STEPS = 300
LENGTHS = (TINY_WINDOW, 2 * TINY_WINDOW, 4 * TINY_WINDOW)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("ropekit-cache")


@pytest.fixture(scope="module")
def trained(cache):
    """The small model, trained once through ``$ROPEKIT_CACHE`` (shared by the tests below)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROPEKIT_CACHE", str(cache))
        return pretrain.pretrain_tiny(seed=0, steps=SMALL_STEPS, progress=False, **SMALL)


# ---- corpus -----------------------------------------------------------------------------------------
def test_corpus_is_deterministic_and_non_trivial():
    first = stdlib_documents(300_000, "train")
    local_text._documents.cache_clear()
    local_text._files.cache_clear()
    second = stdlib_documents(300_000, "train")
    assert first == second and first is not second
    assert corpus_digest(first) == corpus_digest(second)
    assert sum(map(len, first)) == 300_000  # the budget is filled exactly (the stdlib holds megabytes)
    assert len(first) >= 10
    text = b"".join(first)
    assert set(text) <= set(range(0x20, 0x7F)) | {0x09, 0x0A}  # printable ASCII: a byte is a character
    assert b"def " in text and b'"""' in text and b"import " in text  # code and docstrings
    assert len(set(text)) > 80


def test_corpus_split_is_by_file():
    files = stdlib_files()
    assert files == sorted(files) and len(files) > 100
    assert not any("site-packages" in f or f.startswith(("test/", "idlelib/", "lib2to3/")) for f in files)
    held = [f for f in files if split_of(f) == "heldout"]
    assert 0.04 < len(held) / len(files) < 0.2
    train_docs = set(stdlib_documents(10**9, "train"))
    held_docs = stdlib_documents(10**9, "heldout")
    assert sum(map(len, held_docs)) > 100_000
    assert not train_docs & set(held_docs)


def test_corpus_bad_arguments_are_one_line_errors():
    with pytest.raises(InvalidParameterError, match="unknown corpus split 'validation'"):
        stdlib_documents(1000, "validation")
    with pytest.raises(InvalidParameterError):
        stdlib_documents(0, "train")


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    assert tok.vocab_size == len(tok) == 256
    assert tok.encode("def f():") == list(b"def f():")
    assert tok.decode(tok.encode("x = 1\n")) == "x = 1\n"
    assert tok.join([b"a", b"b"]) == b"a\x00b\x00"


# ---- pre-training and cache --------------------------------------------------------------------------
def test_training_lowers_the_loss(trained):
    info = trained.ropekit_demo
    assert info["cached"] is False
    config = {k: SMALL[k] for k in ("hidden_size", "num_layers", "num_heads", "num_kv_heads")}
    untrained = build_tiny_model("llama", seed=0, vocab_size=256, **config)
    batch = demo.heldout_batch(TINY_WINDOW, 8)
    before, after = demo.mean_loss(untrained, batch, TINY_WINDOW), demo.mean_loss(trained, batch, TINY_WINDOW)
    assert before > math.log(256) - 0.1  # an untrained byte model is about uniform
    assert after < before - 2.0, (before, after)
    assert info["final_loss"] < info["initial_loss"] - 2.0
    assert not trained.training


def test_cache_is_reused(trained, cache, monkeypatch):
    monkeypatch.setenv("ROPEKIT_CACHE", str(cache))
    entries = sorted(p.name for p in cache.iterdir())
    assert len(entries) == 1 and entries[0].startswith("tiny-llama-"), entries  # no temporary directory left
    assert (cache / entries[0] / "model.safetensors").is_file()

    def no_training(*args, **kwargs):
        raise AssertionError("pretrain_tiny trained although the cache holds the model")

    monkeypatch.setattr(pretrain, "build_tiny_model", no_training)
    started = time.perf_counter()
    again = pretrain.pretrain_tiny(seed=0, steps=SMALL_STEPS, progress=False, **SMALL)
    assert time.perf_counter() - started < 10
    assert again.ropekit_demo["cached"] is True and again.ropekit_demo["path"] == str(cache / entries[0])
    a, b = trained.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # any other setting is another cache entry: it would train, which the stub above forbids
    with pytest.raises(AssertionError, match="trained although"):
        pretrain.pretrain_tiny(seed=1, steps=SMALL_STEPS, progress=False, **SMALL)


def test_crash_while_caching_leaves_no_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("ROPEKIT_CACHE", str(tmp_path))
    settings = dict(steps=5, progress=False, threads=1, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2,
                    train_bytes=50_000, batch_size=4)
    real_dumps = json.dumps

    def crash(obj, *args, **kwargs):  # the metadata file is written after the weights: crash there
        if isinstance(obj, dict) and "settings" in obj:
            raise OSError("disk full")
        return real_dumps(obj, *args, **kwargs)

    monkeypatch.setattr(runtime_cache.json, "dumps", crash)
    unsaved = pretrain.pretrain_tiny(**settings)  # the demo goes on with the trained model
    assert unsaved.ropekit_demo["path"] is None and "disk full" in unsaved.ropekit_demo["cache_error"]
    monkeypatch.setattr(runtime_cache.json, "dumps", real_dumps)
    assert list(tmp_path.iterdir()) == []  # neither a half-written entry nor a temporary directory

    first = pretrain.pretrain_tiny(**settings)
    (entry,) = tmp_path.iterdir()
    (entry / "model.safetensors").unlink()  # a damaged entry is retrained, not trusted
    second = pretrain.pretrain_tiny(**settings)
    assert second.ropekit_demo["cached"] is False and (entry / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [entry.name]
    for model in (unsaved, second):
        assert all(torch.equal(x, y) for x, y in zip(first.state_dict().values(), model.state_dict().values()))


def test_thread_count_does_not_change_the_weights():
    # why the cache key leaves the thread count out
    settings = dict(steps=6, use_cache=False, progress=False, hidden_size=32, num_layers=1, num_heads=2,
                    num_kv_heads=2, train_bytes=50_000, batch_size=4)
    threads_before = torch.get_num_threads()
    one, two = pretrain.pretrain_tiny(threads=1, **settings), pretrain.pretrain_tiny(threads=2, **settings)
    assert all(torch.equal(x, y) for x, y in zip(one.state_dict().values(), two.state_dict().values()))
    # the caller's settings come back
    assert torch.get_num_threads() == threads_before and not torch.are_deterministic_algorithms_enabled()


# ---- the loss table -----------------------------------------------------------------------------------
def test_factor_one_methods_reproduce_the_base_row(trained):
    theta = float(trained.config.rope_parameters["rope_theta"])
    kv = trained.config.num_key_value_heads
    identity = {
        "pi": {"factor": 1.0},
        "ntk": {"factor": 1.0},
        "dynamic_ntk": {"factor": 1.0},
        "ntk_by_parts": {"factor": 1.0},
        "yarn": {"factor": 1.0},
        "abf": {"rope_theta": theta},
        "harpe": {"bases": [theta] * kv},
        "entropy_abf": {"rope_theta": theta, "skip_layers": [0]},  # this model has 2 layers
    }
    rows = demo.loss_table(trained, identity, LENGTHS, n_sequences=8)
    assert [r["method"] for r in rows] == ["base", *identity]
    base = rows[0]["loss"]
    assert list(base) == list(LENGTHS) and all(0 < v < 10 for v in base.values())
    for row in rows[1:]:
        if row["method"] == "entropy_abf":  # its logit scale is 1 inside the window only
            assert row["loss"][TINY_WINDOW] == base[TINY_WINDOW]
            assert row["loss"][4 * TINY_WINDOW] != base[4 * TINY_WINDOW]
        else:
            assert row["loss"] == base, row["method"]
    json.dumps(rows)  # the CLI prints the rows as JSON
    # the base model was not modified by extending copies of it
    assert trained.config.rope_parameters["rope_type"] == "default" and not hasattr(trained.config, "ropekit")


def test_base_loss_grows_beyond_the_window(trained):
    (row,) = demo.loss_table(trained, [], LENGTHS)
    assert row["loss"][4 * TINY_WINDOW] > row["loss"][TINY_WINDOW] + 0.1, row["loss"]


def test_demo_settings_are_scaled_to_the_tiny_window(trained):
    from ropekit.install import rope_info

    info = rope_info(trained)
    settings = demo.demo_settings(info, 4.0)
    assert set(settings) == {m.name for m in list_methods()}
    ntk = ntk_base(info.rope_theta, info.rotary_dim, 4.0)
    assert settings["abf"]["rope_theta"] == pytest.approx(4 * ntk, rel=0.05)
    assert settings["abf"]["rope_theta"] < 500_000  # not the 4k-model default
    assert settings["harpe"]["strategy"] == "uniform" and settings["harpe"]["b_min"] == info.rope_theta
    assert all(s["factor"] == 4.0 for s in settings.values())
    assert settings["landmark"]["mem_freq"] == info.window // 8 - 1  # 8 blocks per window, not the paper's 50
    for m in list_methods():  # every method installs with its demo settings (the demo runs them all)
        params = m.resolve(info, dict(settings[m.name]))
        m.check(info, params)


def test_main_table_and_json(trained, monkeypatch, capsys):
    monkeypatch.setattr(demo, "pretrain_tiny", lambda: trained)
    rows = demo.main(method="yarn")
    out = capsys.readouterr().out
    assert [r["method"] for r in rows] == ["base", "yarn"]
    assert "yarn" in out and "frozen" in out and "β=4" in out
    rows = demo.main(method="ntk", json_out=True)
    assert capsys.readouterr().out == ""  # the caller prints the JSON
    assert [r["method"] for r in rows] == ["base", "ntk"] and set(rows[1]["loss"]) == set(LENGTHS)


def test_unknown_method_fails_before_training(monkeypatch):
    monkeypatch.setattr(demo, "pretrain_tiny", lambda: pytest.fail("trained before checking the method"))
    with pytest.raises(UnknownMethodError) as err:
        demo.main(method="yarnn")
    assert "\n" not in str(err.value) and "yarn" in str(err.value)
