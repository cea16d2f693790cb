"""build_training_data: item contract, cache, PoSE resampling per epoch, mixture, spec validation."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import torch

from ropekit.data.packing import IGNORE_INDEX
from ropekit.data.pose import item_generator, pose_sample
from ropekit.data.training_data import build_training_data, validate_data_spec
from ropekit.errors import RopekitError
from ropekit.models.byte_tokenizer import byte_tokenizer


class CountingTokenizer:
    """Delegates to a real tokenizer and counts every tokenisation it is asked for."""

    def __init__(self, inner):
        self._inner = inner
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._inner(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        self.calls += 1
        return self._inner.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _corpus(tmp_path, name="corpus.jsonl", n=12, seed=0):
    import random

    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "kappa", "omega", "sigma"]
    lines = [json.dumps({"text": " ".join(rng.choice(words) for _ in range(rng.randint(10, 60)))}) for _ in range(n)]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path, [json.loads(x)["text"] for x in lines]


def test_packed_items_contract(tmp_path):
    path, texts = _corpus(tmp_path)
    tok = byte_tokenizer()
    L = 64
    ds = build_training_data({"sources": [{"path": str(path)}], "shuffle": False}, tok, L, seed=0, cache_dir=None)
    stream = b"".join(t.encode() + b"\x00" for t in texts)
    assert len(ds) == len(stream) // L and ds.mode == "packed" and ds.attention_mask_kind == "2d"
    joined = []
    for i in range(len(ds)):
        item = ds[i]
        assert set(item) == {"input_ids", "labels", "position_ids", "attention_mask"}
        for key in item:
            assert item[key].shape == (L,) and item[key].dtype == torch.long
        assert torch.equal(item["labels"], item["input_ids"])
        assert item["position_ids"].tolist() == list(range(L))
        assert item["attention_mask"].tolist() == [1] * L
        joined += item["input_ids"].tolist()
    assert bytes(joined) == stream[: len(ds) * L]  # unshuffled: the stream in order
    batch = torch.utils.data.default_collate([ds[0], ds[1]])
    assert batch["input_ids"].shape == (2, L)


def test_document_mask_items(tmp_path):
    path, _ = _corpus(tmp_path)
    ds = build_training_data({"sources": [{"path": str(path)}],
                              "packing": {"reset_positions": True, "document_mask": True}},
                             byte_tokenizer(), 48, seed=1)
    item = ds[0]
    assert ds.attention_mask_kind == "document_4d"
    assert item["attention_mask"].shape == (1, 48, 48) and item["attention_mask"].dtype == torch.bool
    batch = torch.utils.data.default_collate([ds[0], ds[1]])
    assert batch["attention_mask"].shape == (2, 1, 48, 48)
    # a document start inside the row: position 0, label -100, and nothing before it visible
    starts = [t for t in range(1, 48) if item["position_ids"][t] == 0]
    for t in starts:
        assert item["labels"][t] == IGNORE_INDEX
        assert not item["attention_mask"][0, t, :t].any()


def test_tokenisation_cache_hit(tmp_path):
    path, _ = _corpus(tmp_path)
    conv = tmp_path / "chat.jsonl"
    conv.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                             {"role": "assistant", "content": "Hello there"}]}) + "\n")
    spec = {"sources": [{"path": str(path)}, {"path": str(conv), "kind": "sft"}]}
    cache = tmp_path / "cache"
    first_tok = CountingTokenizer(byte_tokenizer())
    first = build_training_data(spec, first_tok, 128, seed=3, cache_dir=str(cache))
    assert first_tok.calls > 0 and [s["cache"] for s in first.summary["sources"]] == ["miss", "miss"]
    second_tok = CountingTokenizer(byte_tokenizer())
    second = build_training_data(spec, second_tok, 128, seed=3, cache_dir=str(cache))
    assert second_tok.calls == 0  # nothing re-tokenised
    assert [s["cache"] for s in second.summary["sources"]] == ["hit", "hit"]
    assert len(first) == len(second)
    for i in range(len(first)):
        for key in ("input_ids", "labels", "position_ids", "attention_mask"):
            assert torch.equal(first[i][key], second[i][key])
    # an edited file is a new cache entry
    with open(path, "a") as fh:
        fh.write(json.dumps({"text": "one more document " * 5}) + "\n")
    os.utime(path, ns=(1, 1))
    third_tok = CountingTokenizer(byte_tokenizer())
    third = build_training_data(spec, third_tok, 128, seed=3, cache_dir=str(cache))
    assert third_tok.calls > 0 and third.summary["sources"][0]["cache"] == "miss"
    assert third.summary["sources"][1]["cache"] == "hit"


def test_pose_items_resampled_per_epoch_and_reproducible(tmp_path):
    path, texts = _corpus(tmp_path, n=20)
    tok = byte_tokenizer()
    L, target = 32, 256
    spec = {"sources": [{"path": str(path)}], "pose": {"target_length": target, "chunks": 2}}
    ds = build_training_data(spec, tok, L, seed=5)
    docs = [list(t.encode()) + [0] for t in texts]
    assert len(ds) == sum(len(d) >= L for d in docs) and ds.mode == "pose"
    epoch0 = [ds[i] for i in range(len(ds))]
    again = build_training_data(spec, tok, L, seed=5)
    for i, item in enumerate(epoch0):
        assert torch.equal(item["position_ids"], again[i]["position_ids"])  # exact on resume
        assert torch.equal(item["input_ids"], again[i]["input_ids"])
        pos = item["position_ids"]
        assert pos.max() < target and (pos[1:] > pos[:-1]).all()
        assert item["attention_mask"].tolist() == [1] * L  # the explicit mask PoSE needs
        assert torch.equal(item["labels"], item["input_ids"])
        # the text is what the sampler picks from the item's document, with the generator of (seed, 0, i)
        source, row = ds._index[i]
        doc = ds._sources[source][row]
        sample = pose_sample(L, target, n_chunks=2, doc_length=doc.numel(), generator=item_generator(5, 0, i))
        assert torch.equal(item["input_ids"], doc[sample.content_index].long())
        assert torch.equal(pos, sample.position_ids)
        assert doc.tolist() in docs
    ds.set_epoch(1)
    changed = sum(not torch.equal(ds[i]["position_ids"], epoch0[i]["position_ids"]) for i in range(len(ds)))
    assert changed >= len(ds) - 1
    zero = build_training_data({**spec, "pose": {"target_length": target, "offset": "zero"}}, tok, L, seed=5)
    for i in range(len(zero)):  # offset zero: one contiguous span from the document start
        assert zero[i]["input_ids"].tolist() in [d[:L] for d in docs]
    rp = build_training_data({"sources": [{"path": str(path)}], "randpos": {"target_length": target}}, tok, L, seed=5)
    pos = rp[0]["position_ids"]
    assert rp.mode == "randpos" and len(set(pos.tolist())) == L and pos.max() < target


def test_mixture_weights_and_repeats(tmp_path):
    a, _ = _corpus(tmp_path, "a.jsonl", n=30, seed=1)
    b, _ = _corpus(tmp_path, "b.jsonl", n=30, seed=2)
    tok = byte_tokenizer()
    spec = {"sources": [{"path": str(a), "weight": 3}, {"path": str(b), "weight": 1}]}
    ds = build_training_data(spec, tok, 32, seed=0)
    rows = [s["rows"] for s in ds.summary["sources"]]
    items = [s["items"] for s in ds.summary["sources"]]
    # default length: the most items that repeat no row, N = min_s floor(rows_s / share_s); shares 3/4, 1/4
    n = min(int(rows[0] / 0.75), int(rows[1] / 0.25))
    assert len(ds) == sum(items) == n
    assert abs(items[0] - 0.75 * n) < 1 and abs(items[1] - 0.25 * n) < 1
    assert items[0] <= rows[0] and items[1] <= rows[1]
    assert not any(s["repeated"] for s in ds.summary["sources"])
    assert Counter(src for src, _ in ds._index) == {0: items[0], 1: items[1]}
    big = build_training_data({**spec, "num_sequences": 4 * sum(rows)}, tok, 32, seed=0)
    assert len(big) == 4 * sum(rows)
    assert big.summary["sources"][0]["items"] == 3 * sum(rows) and big.summary["sources"][0]["repeated"]


def test_upsampling_in_the_dataset(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"text": ("long " * 40) if i % 5 == 0 else "short one"}) for i in range(50)))
    spec = {"sources": [{"path": str(path), "upsample_long": {"threshold": 100, "factor": 3, "mode": "repeat_long"}}]}
    ds = build_training_data(spec, byte_tokenizer(), 16, seed=0)
    info = ds.summary["sources"][0]
    assert info["documents"] == 50 and info["documents_after_upsampling"] == 40 + 10 * 3


def test_the_builtin_source_says_which_standard_library_it_read(tmp_path):
    """The built-in split is this Python's standard library, so a training's summary names its digest: two
    machines with different Pythons train on different documents, and the summary shows it."""
    import hashlib

    from ropekit.data.local_text import stdlib_documents
    from ropekit.data.training_data import BUILTIN_MAX_BYTES

    spec = {"sources": [{"path": "builtin", "max_documents": 5}]}
    info = build_training_data(spec, byte_tokenizer(), 64, seed=0, cache_dir=str(tmp_path)).summary["sources"][0]
    h = hashlib.sha256()  # the fingerprint written out: length-prefixed documents, SHA-256, 16 hex digits
    for doc in stdlib_documents(BUILTIN_MAX_BYTES, "train"):
        h.update(len(doc).to_bytes(8, "big") + doc)
    assert info["corpus_digest"] == h.hexdigest()[:16]
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"text": "a file source has no corpus digest"}))
    assert "corpus_digest" not in build_training_data({"sources": [{"path": str(path)}]}, byte_tokenizer(), 8,
                                                      seed=0).summary["sources"][0]


def test_sft_source_items(tmp_path):
    conv = tmp_path / "chat.jsonl"
    records = [{"messages": [{"role": "user", "content": f"Question {i}?"},
                             {"role": "assistant", "content": f"Answer {i}."}]} for i in range(6)]
    conv.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    ds = build_training_data({"sources": [{"path": str(conv), "kind": "sft"}], "shuffle": False,
                              "packing": {"document_mask": True, "reset_positions": True}}, byte_tokenizer(), 160, seed=0)
    trained = b""
    for i in range(len(ds)):
        item = ds[i]
        trained += bytes(t for t in item["labels"].tolist() if t != IGNORE_INDEX)
    # each conversation is its own segment, so its first byte ('<') gets no label; the answers do
    assert trained == b"".join(f"Answer {i}.<|im_end|>".encode() for i in range(6))
    assert ds.summary["sources"][0]["sft_default_template"] is True


@pytest.mark.parametrize("spec,needle", [
    ({"sources": [{"path": "builtin"}], "colour": 1}, "^data.colour: unknown key"),
    ({"sources": []}, "sources"),
    ({"sources": [{"path": "builtin", "kind": "video"}]}, "kind"),
    ({"sources": [{"path": "builtin", "weight": 0}]}, "weight"),
    ({"sources": [{"path": "builtin", "upsample_long": {"threshold": 10}}]}, "threshold and factor"),
    ({"sources": [{"path": "builtin"}], "pose": {"target_length": 64}}, "target_length"),
    ({"sources": [{"path": "builtin"}], "pose": {"target_length": 512, "offset": "middle"}}, "offset"),
    ({"sources": [{"path": "builtin"}], "pose": {"target_length": 512}, "randpos": {"target_length": 512}}, "both"),
    ({"sources": [{"path": "builtin"}], "pose": {"target_length": 512}, "packing": {"document_mask": True}}, "cannot"),
    ({"sources": [{"path": "builtin"}], "packing": {"reset_positions": "yes"}}, "true or false"),
    ({"sources": [{"path": "builtin", "kind": "sft"}]}, "conversations"),
])
def test_spec_errors_are_one_line(spec, needle):
    with pytest.raises(RopekitError, match=needle) as err:
        validate_data_spec(spec, 128)
    assert "\n" not in str(err.value)


def test_missing_path_and_default_spec(tmp_path):
    with pytest.raises(RopekitError, match="does not exist"):
        build_training_data({"sources": [{"path": str(tmp_path / "nope.jsonl")}]}, byte_tokenizer(), 32, seed=0)
    spec = validate_data_spec(None, 32)
    assert [s.path for s in spec.sources] == ["builtin"] and spec.positions is None


def test_builtin_training_text_is_the_train_split():
    from ropekit.data.local_text import stdlib_documents

    ds = build_training_data({"sources": [{"path": "builtin", "max_documents": 2}], "shuffle": False},
                             byte_tokenizer(), 256, seed=0)
    docs = stdlib_documents(64 * 1024 * 1024, "train")[:2]
    stream = b"".join(d + b"\x00" for d in docs)
    assert bytes(ds[0]["input_ids"].tolist()) == stream[:256]
    assert ds.summary["sources"][0]["label"] == "builtin:python-stdlib-train"


def test_whole_documents_mode_refuses_a_source_that_is_mostly_too_short(tmp_path):
    # PoSE takes each example from one document: a source of documents shorter than the window would be served
    # by the few long ones, repeated (2,392 of 2,400 retrieval documents dropped, 8 left, each seen ~40 times)
    tok = byte_tokenizer()

    def corpus(name, short, long):
        path = tmp_path / name
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["s" * 9] * short + ["l" * 99] * long))
        return path

    spec = lambda path, **pose: {"sources": [{"path": str(path)}], "pose": {"target_length": 200, **pose}}  # noqa: E731
    mostly_short = corpus("a.jsonl", short=19, long=1)  # 95 % of the documents under the 50-token window
    with pytest.raises(RopekitError, match="19 of 20 documents are shorter than the 50-token pose window") as err:
        build_training_data(spec(mostly_short), tok, 50, seed=0)
    assert "documents: packed" in err.value.fix
    some_short = corpus("b.jsonl", short=17, long=3)  # 85 %: the long ones serve the source, as the paper's setup
    assert len(build_training_data(spec(some_short), tok, 50, seed=0)) == 3
    # windows of the joined text use every token: 19 × 10 + 100 bytes (with separators) make one 200-token window
    assert len(build_training_data(spec(mostly_short, documents="packed"), tok, 50, seed=0)) == 1


def test_a_section_naming_no_source_reads_the_built_in_corpus_with_its_other_keys():
    """`data: {seq_len: 64}` read the built-in corpus, but adding `pose:` or `num_sequences:` made sources
    required: a section without sources is the built-in corpus whatever else it sets."""
    spec = validate_data_spec({"pose": {"target_length": 256}, "num_sequences": 7}, 64)
    assert [s.path for s in spec.sources] == ["builtin"]
    assert spec.positions.method == "pose" and spec.positions.target_length == 256 and spec.num_sequences == 7
    assert validate_data_spec(None, 64).sources == spec.sources
