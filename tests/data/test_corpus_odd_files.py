"""Corpus files that are valid in their format yet odd: each is one RopekitError naming the file (the CLI's one
line and exit 2), or read as the same text without the oddity. Before: a deeply nested or huge-integer JSON line
(RecursionError, ValueError), a lone surrogate escape in "text" (the tokenizer's TypeError), a parquet file with a
corrupt page (OSError), a saved DatasetDict with no splits (IndexError) were internal errors; a .txt file's
byte-order mark was scored as three tokens of text."""

from __future__ import annotations

import pytest

from ropekit.data.corpora import iter_named_texts
from ropekit.errors import RopekitError


def _texts(path):
    return [text for _, text in iter_named_texts(path)]


@pytest.mark.parametrize("line, said", [
    ("[" * 100_000 + "]" * 100_000, "line 2 is JSON this reader cannot hold"),
    ('{"text": "a", "n": ' + "9" * 5_000 + "}", "line 2 is JSON this reader cannot hold"),
    ('{"text": "hello \\ud800 world"}', "unpaired surrogate"),
])
def test_json_lines_past_the_readers_limits_are_one_error(tmp_path, line, said):
    path = tmp_path / "odd.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(RopekitError, match=said) as refused:
        _texts(path)
    assert str(path) in str(refused.value)


def test_a_paired_surrogate_escape_is_the_character_it_encodes(tmp_path):
    path = tmp_path / "emoji.jsonl"
    path.write_text('{"text": "smile \\ud83d\\ude00"}\n')
    assert _texts(path) == ["smile \U0001F600"]


def test_a_byte_order_mark_is_not_text(tmp_path):
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_bytes("hello world\n".encode())
    marked.write_bytes(b"\xef\xbb\xbf" + "hello world\n".encode())
    assert _texts(marked) == _texts(plain) == ["hello world\n"]


def test_a_parquet_file_with_a_corrupt_page_is_one_error(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": ["some document text " * 50] * 4}), path, compression="snappy")
    data = bytearray(path.read_bytes())
    data[20:60] = bytes(b ^ 0xFF for b in data[20:60])  # inside the first data page; the footer stays readable
    path.write_bytes(bytes(data))
    pq.ParquetFile(path)  # the footer still opens: the damage is only found reading the pages
    with pytest.raises(RopekitError, match="is not a readable parquet file"):
        _texts(path)


def test_a_saved_dataset_dict_with_no_splits_is_one_error(tmp_path):
    import datasets

    datasets.DatasetDict({}).save_to_disk(str(tmp_path / "empty"))
    with pytest.raises(RopekitError, match="has no splits"):
        _texts(tmp_path / "empty")


def test_the_cli_says_it_in_one_line(run_cli, tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    code, out, err = run_cli("eval", "ppl", "tiny", "--lengths", "64", "--samples", "1", "--data", str(path))
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("running on")]
    assert code == 2 and len(lines) == 1 and "cannot hold" in lines[0] and "internal error" not in err, err
