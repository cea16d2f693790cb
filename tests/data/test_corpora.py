"""Corpora: every file format, the built-in corpus, and every malformed input as a one-line error."""

from __future__ import annotations

import json

import pytest

from ropekit.data import corpora, local_text
from ropekit.errors import RopekitError
from ropekit.models.byte_tokenizer import byte_tokenizer

TEXTS = ["first document.\nwith two lines", "second: caf\u00e9 \u2014 na\u00efve", "third"]


def write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_txt_file_is_one_document(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text(TEXTS[1], encoding="utf-8")
    texts, label = corpora.read_texts(str(f))
    assert texts == [TEXTS[1]] and label == f"txt:{f.resolve()}"
    docs, label2 = corpora.load_documents(f, byte_tokenizer())
    assert docs == [list(TEXTS[1].encode())] and label2 == label  # bytes, no special tokens


def test_jsonl_skips_blank_lines_and_empty_texts(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [{"text": TEXTS[0], "id": 1}, "", {"text": "   "}, {"text": TEXTS[2]}])
    texts, label = corpora.read_texts(f)
    assert texts == [TEXTS[0], TEXTS[2]] and label.startswith("jsonl:")
    assert [name for name, _ in corpora.iter_named_texts(f)] == ["d.jsonl:1", "d.jsonl:4"]


def test_parquet_column_text(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": TEXTS, "n": [1, 2, 3]}), f, row_group_size=2)
    texts, label = corpora.read_texts(f)
    assert texts == TEXTS and label == f"parquet:{f.resolve()}"


def test_saved_datasets_directory_and_dict(tmp_path):
    import datasets

    one = tmp_path / "one"
    datasets.Dataset.from_dict({"text": TEXTS, "meta": ["x", "y", "z"]}).save_to_disk(str(one))
    texts, label = corpora.read_texts(one)
    assert texts == TEXTS and label == f"datasets:{one.resolve()}"
    both = tmp_path / "both"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["t"]}),
                          "test": datasets.Dataset.from_dict({"text": TEXTS[:2]})}).save_to_disk(str(both))
    assert corpora.read_texts(both)[0] == TEXTS[:2]  # the test split
    odd = tmp_path / "odd"
    datasets.DatasetDict({"a": datasets.Dataset.from_dict({"text": ["t"]}),
                          "b": datasets.Dataset.from_dict({"text": ["u"]})}).save_to_disk(str(odd))
    with pytest.raises(RopekitError, match="none is 'test'"):
        corpora.read_texts(odd)
    nocol = tmp_path / "nocol"
    datasets.Dataset.from_dict({"body": TEXTS}).save_to_disk(str(nocol))
    with pytest.raises(RopekitError, match="no column 'text'"):
        corpora.read_texts(nocol)


def test_directory_of_files_in_sorted_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text(TEXTS[2])
    (tmp_path / "a.txt").write_text(TEXTS[0])
    write_jsonl(tmp_path / "b" / "m.jsonl", [{"text": TEXTS[1]}])
    (tmp_path / "ignored.csv").write_text("x,y")
    texts, label = corpora.read_texts(tmp_path)
    assert texts == [TEXTS[0], TEXTS[1], TEXTS[2]] and label == f"dir:{tmp_path.resolve()}"
    assert [n for n, _ in corpora.iter_named_texts(tmp_path)] == ["a.txt", "b/m.jsonl:1", "b/z.txt"]


def test_builtin_corpus_is_long_heldout_text():
    texts, label = corpora.read_texts(None)
    assert label == corpora.BUILTIN_LABEL and corpora.read_texts("builtin") == (texts, label)
    named = list(corpora.iter_named_texts(None))
    assert [t for _, t in named] == texts
    assert len(texts) >= 3 and len(texts[0]) >= 50_000
    assert [len(t) for t in texts] == sorted((len(t) for t in texts), reverse=True)  # longest first
    stdlib = [n[len("stdlib/"):] for n, _ in named if n.startswith("stdlib/")]
    assert stdlib and all(local_text.split_of(rel) == "heldout" for rel in stdlib)  # never trained on
    assert any(n.startswith("python-docs-prose") for n, _ in named)
    for text in texts:
        assert all(0x20 <= ord(c) < 0x7F or c in "\t\n" for c in text)
    # a held-out file is whole here although local_text cuts training documents at MAX_DOC_BYTES
    longest = max(len(t) for n, t in named if n.startswith("stdlib/"))
    assert longest > local_text.MAX_DOC_BYTES
    docs, _ = corpora.load_documents(None, local_text.ByteTokenizer())  # a tokenizer with only .encode
    assert docs == [list(t.encode()) for t in texts]


def test_builtin_tests_corpus_is_the_test_suite_which_training_skips(monkeypatch, tmp_path):
    texts, label = corpora.read_texts("builtin-tests")
    assert label == corpora.BUILTIN_TESTS_LABEL and corpora.is_builtin(" Builtin-Tests ")
    named = list(corpora.iter_named_texts("builtin-tests"))
    assert len(texts) >= 32 and all(len(t) >= corpora.BUILTIN_MIN_BYTES for t in texts)
    assert [len(t) for t in texts] == sorted((len(t) for t in texts), reverse=True)  # longest first
    rels = [n[len("stdlib/"):] for n, _ in named]
    assert all(r.startswith("test/") for r in rels)
    assert not set(rels) & set(local_text.stdlib_files())  # nothing of it is in the training corpus
    for text in texts[:5]:
        assert all(0x20 <= ord(c) < 0x7F or c in "\t\n" for c in text)
    # a Python without its test suite (Debian ships it separately): one line saying how to get it
    monkeypatch.setattr(local_text, "stdlib_root", lambda: tmp_path)
    with pytest.raises(RopekitError, match="test suite is not installed.*libpython3.X-testsuite"):
        corpora.read_texts("builtin-tests")


def test_iter_documents_is_lazy(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [{"text": "ok"}, "{broken"])
    docs = corpora.iter_documents(f, byte_tokenizer())
    assert next(docs).ids == [111, 107]  # the first document is read before the broken line is reached
    with pytest.raises(RopekitError, match="line 2"):
        next(docs)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda p: p / "missing.jsonl", "does not exist"),
        (lambda p: (p / "x.csv").write_text("a") and p / "x.csv", "unknown type"),
        (lambda p: write_jsonl(p / "x.jsonl", [{"text": "a"}, "{oops"]), "line 2 is not JSON"),
        (lambda p: write_jsonl(p / "x.jsonl", [{"body": "a"}]), "line 1 has no 'text' field"),
        (lambda p: write_jsonl(p / "x.jsonl", [{"text": 3}]), "not a string"),
        (lambda p: write_jsonl(p / "x.jsonl", ["", {"text": " "}]), "holds no text"),
        (lambda p: (p / "sub").mkdir() or p / "sub", "holds no .txt"),
        (lambda p: (p / "x.txt").write_bytes(b"\xff\xfe") and p / "x.txt", "not UTF-8"),
        (lambda p: (p / "state.json").write_text("{bad") and p, "not a dataset saved"),
    ],
)
def test_bad_corpora_are_one_line_errors(tmp_path, make, match):
    path = make(tmp_path)
    with pytest.raises(RopekitError, match=match) as err:
        corpora.load_documents(path, byte_tokenizer())
    assert "\n" not in str(err.value) and err.value.fix


def test_parquet_without_text_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "d.parquet"
    pq.write_table(pa.table({"body": TEXTS}), f)
    with pytest.raises(RopekitError, match="no column 'text'"):
        corpora.read_texts(f)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(RopekitError, match="not a readable parquet"):
        corpora.read_texts(tmp_path / "bad.parquet")


def test_no_tokenizer_is_an_error():
    with pytest.raises(RopekitError, match="needs a tokenizer"):
        corpora.load_documents(None, None)
