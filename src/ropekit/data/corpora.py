"""Text corpora for perplexity (and training): user files in four formats, or a built-in corpus.

A corpus is an ordered list of *documents* (one string each) and a *label* that says where it came from;
every result computed on it records the label. :func:`read_texts` gives the strings,
:func:`load_documents` the token ids (model tokenizer, no special tokens: whether a BOS goes in front of
a window is the evaluator's decision, not the corpus'), and :func:`iter_documents` the same lazily, one
named document at a time, so an evaluation that needs only the first few long documents does not read
or tokenise the rest.

User data (``path``):

* a ``.txt`` file (also ``.text``, ``.md``): the whole file is one document (UTF-8);
* a ``.jsonl`` file: one JSON object per line, its string field ``text`` is one document;
* a ``.parquet`` file: its column ``text``, one document per row (read with pyarrow, in row batches);
* a directory saved by ``datasets.Dataset.save_to_disk`` (it holds ``dataset_info.json`` or
  ``state.json``): column ``text`` via ``datasets.load_from_disk``; a saved ``DatasetDict`` must hold one
  split, or a ``test``/``validation`` split, which is used and named in the label;
* any other directory: every ``.txt``/``.jsonl``/``.parquet`` file under it (recursively, sorted by
  relative path), each read as above.

Empty (whitespace-only) texts are dropped: they hold no token to score or train on. A missing or
malformed file, a record without a string ``text``, an unknown file type, or a corpus without any text
raise :class:`~ropekit.errors.RopekitError` naming the place and the fix.

Built-in corpus (``path`` None or ``"builtin"``), labelled :data:`BUILTIN_LABEL`. Nothing can be
downloaded here, so it is made from text every Python installation carries — a *substitute* for
PG19/Proof-pile, whose numbers are comparable between methods on the same machine, not with papers:

* the **held-out** split of the standard-library sources as :mod:`ropekit.data.local_text` defines it
  (a hash of the path puts ~1 file in 10 there; the built-in tiny model is trained only on the other
  split), each file whole — not cut at ``MAX_DOC_BYTES`` as for training, because perplexity at long
  context needs long documents — with the same line cleaning (only printable-ASCII lines, ``\\n``
  newlines), keeping files of at least :data:`BUILTIN_MIN_BYTES`;
* the prose of the Python language reference (``pydoc_data.topics``, cleaned to paragraphs by
  :mod:`ropekit.data.prose`) as one document. That module's other prose, the stdlib docstrings, is left
  out because the training split contains those files.

``builtin-tests`` is a second built-in corpus: CPython's own test suite (``Lib/test``, every ``.py`` file of at
least :data:`BUILTIN_MIN_BYTES` after the same cleaning), labelled :data:`BUILTIN_TESTS_LABEL`. The training
corpus skips test suites, so it is held out too, and it is large: the held-out split above holds only about 20
documents of 2,048 tokens or more, the test suite hundreds (a study that wants 32 such documents needs it).
Python distributions that ship the test suite separately (Debian's ``libpython3.X-testsuite``) lack it until
it is installed; asking for it then fails in one line.

Documents are ordered longest first (ties by name), so "the first N documents" are the longest ones.
Which stdlib files exist differs between Python versions; record :func:`documents_digest` with results.
Training on the built-in corpus would defeat its purpose (it is the held-out evaluation text).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..core.jsonl import jsonl_rows
from ..errors import RopekitError

#: Label of the built-in corpus, recorded with every result computed on it.
BUILTIN_LABEL = "builtin:python-stdlib-heldout+python-docs-prose"
#: Label of the built-in test-suite corpus (``--data builtin-tests``).
BUILTIN_TESTS_LABEL = "builtin:python-stdlib-tests"
#: The built-in corpora by the name ``--data`` takes.
BUILTIN_CORPORA = {"builtin": BUILTIN_LABEL, "builtin-tests": BUILTIN_TESTS_LABEL}
#: Held-out standard-library files shorter than this (after cleaning) are not built-in documents.
BUILTIN_MIN_BYTES = 8 * 1024
#: Suffixes read as plain text (one document per file).
TEXT_SUFFIXES = (".txt", ".text", ".md")
_DIR_SUFFIXES = TEXT_SUFFIXES + (".jsonl", ".parquet")
_FORMATS_HINT = "pass a .txt/.jsonl/.parquet file, a directory of them, a saved datasets directory, or nothing for the built-in corpus"
_PRINTABLE = frozenset(range(0x20, 0x7F)) | {0x09}


@dataclass(frozen=True)
class Document:
    """One tokenised document: its position in the corpus, a readable name and its token ids."""

    index: int
    name: str
    ids: list[int]


# ---- reading text ----------------------------------------------------------------------------------
def builtin_name(path: str | Path | None) -> str | None:
    """The built-in corpus ``path`` asks for (``None`` or ``""``: ``"builtin"``; ``"builtin-tests"``), else None."""
    name = "" if path is None else str(path).strip().lower()
    name = name or "builtin"
    return name if name in BUILTIN_CORPORA else None


def is_builtin(path: str | Path | None) -> bool:
    """Whether ``path`` asks for a built-in corpus (``None``, ``""``, ``"builtin"`` or ``"builtin-tests"``)."""
    return builtin_name(path) is not None


def corpus_label(path: str | Path | None) -> str:
    """The label a corpus at ``path`` is recorded under (format and absolute path, or a built-in corpus's label)."""
    if is_builtin(path):
        return BUILTIN_CORPORA[builtin_name(path)]
    p = existing_corpus(path)
    if p.is_dir():
        if _is_saved_dataset(p):
            return f"datasets:{p}"
        return f"dir:{p}"
    return f"{_file_kind(p)}:{p}"


def iter_named_texts(path: str | Path | None) -> Iterator[tuple[str, str]]:
    """``(name, text)`` of every non-empty document of the corpus at ``path``, in corpus order, lazily.

    Errors in a file surface when the iteration reaches it. The name says where the text came from
    (``notes.txt``, ``data.jsonl:12`` for line 12, ``part.parquet:row 7``, ``stdlib/tarfile.py``).
    """
    if is_builtin(path):
        yield from _builtin_texts() if builtin_name(path) == "builtin" else _builtin_test_texts()
        return
    p = existing_corpus(path)
    if p.is_dir():
        if _is_saved_dataset(p):
            yield from _dataset_texts(p)
            return
        files = sorted((f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in _DIR_SUFFIXES),
                       key=lambda f: f.relative_to(p).as_posix())
        if not files:
            raise RopekitError(f"directory '{p}' holds no .txt, .jsonl or .parquet files", _FORMATS_HINT)
        for f in files:
            yield from _file_texts(f, f.relative_to(p).as_posix())
        return
    yield from _file_texts(p, p.name)


def read_texts(path: str | Path | None) -> tuple[list[str], str]:
    """``(texts, label)``: every non-empty document of the corpus at ``path`` (see the module docstring)."""
    label = corpus_label(path)
    texts = [text for _, text in iter_named_texts(path)]
    if not texts:
        raise RopekitError(f"the corpus '{label}' holds no text", "pass a corpus with at least one non-empty document")
    return texts, label


def tokenize(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens (a transformers tokenizer, or anything with ``encode``)."""
    if callable(tokenizer):
        # verbose=False: a whole document is longer than the model's window by design; no warning for it
        return list(tokenizer(text, add_special_tokens=False, verbose=False).input_ids)
    return list(tokenizer.encode(text))


def iter_documents(path: str | Path | None, tokenizer) -> Iterator[Document]:
    """Tokenised :class:`Document` s of the corpus at ``path``, lazily, numbered from 0 in corpus order.

    A text that tokenises to nothing is skipped, but keeps its number, so numbers name the same text
    whatever tokenizer is used.
    """
    if tokenizer is None:
        raise RopekitError("reading a corpus for a model needs a tokenizer and this model has none",
                           "pass a model directory that includes tokenizer files, a GGUF with a vocabulary, or a built-in name")
    for index, (name, text) in enumerate(iter_named_texts(path)):
        ids = tokenize(tokenizer, text)
        if ids:
            yield Document(index, name, ids)


def load_documents(path: str | Path | None, tokenizer) -> tuple[list[list[int]], str]:
    """``(documents, label)``: the token ids of every document of the corpus at ``path`` (no special tokens)."""
    label = corpus_label(path)
    docs = [doc.ids for doc in iter_documents(path, tokenizer)]
    if not docs:
        raise RopekitError(f"the corpus '{label}' holds no text", "pass a corpus with at least one non-empty document")
    return docs, label


def documents_digest(documents: list[list[int]]) -> str:
    """A short fingerprint of token-id documents (changes with the text and with the tokenizer)."""
    h = hashlib.sha256()
    for ids in documents:
        h.update(len(ids).to_bytes(8, "big"))
        h.update(ids_digest(ids).encode())
    return h.hexdigest()[:16]


def ids_digest(ids: list[int]) -> str:
    """A short fingerprint of one document's token ids."""
    h = hashlib.sha256()
    h.update(",".join(map(str, ids)).encode())
    return h.hexdigest()[:16]


# ---- formats ---------------------------------------------------------------------------------------
def existing_corpus(path: str | Path) -> Path:
    """``path`` resolved, or a one-line error when nothing is there (checked before any work that reads it)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise RopekitError(f"corpus path '{path}' does not exist", _FORMATS_HINT)
    return p.resolve()


def unreadable_corpus(path: str | Path | None, *, builtins: bool = True) -> str | None:
    """Why the corpus at ``path`` cannot hold a document at all (``"does not exist"``, ``"is empty"``), else None.

    Built-in names are always readable (with ``builtins=False`` every path is a path: training data knows only
    its own built-in name). Callers ask this before they load a model or write anything, so a missing or empty
    data file costs one line instead of a run that fails when it first reads the data."""
    if builtins and is_builtin(path):
        return None
    p = Path(path).expanduser()
    if not p.exists():
        return "does not exist"
    if p.is_file() and p.stat().st_size == 0:
        return "is empty"
    return None


def _is_saved_dataset(p: Path) -> bool:
    return (p / "dataset_info.json").is_file() or (p / "state.json").is_file() or (p / "dataset_dict.json").is_file()


def _file_kind(p: Path) -> str:
    suffix = p.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return "txt"
    if suffix == ".jsonl":
        return "jsonl"
    if suffix == ".parquet":
        return "parquet"
    raise RopekitError(f"corpus file '{p}' has an unknown type '{p.suffix or '(none)'}'", _FORMATS_HINT)


def _file_texts(p: Path, name: str) -> Iterator[tuple[str, str]]:
    kind = _file_kind(p)
    if kind == "txt":
        try:
            text = p.read_text(encoding="utf-8-sig")  # a byte-order mark is not text (JSON Lines drops it too)
        except UnicodeDecodeError as e:
            raise RopekitError(f"'{p}' is not UTF-8 text (byte {e.start})", "convert it to UTF-8") from None
        if text.strip():
            yield name, text
    elif kind == "jsonl":
        yield from _jsonl_texts(p, name)
    else:
        yield from _parquet_texts(p, name)


def _jsonl_texts(p: Path, name: str) -> Iterator[tuple[str, str]]:
    for number, record in jsonl_rows(p, "write one JSON object per line"):
        if not isinstance(record, dict) or "text" not in record:
            raise RopekitError(f"'{p}' line {number} has no 'text' field",
                               'give every line a string field "text" with the document')
        text = record["text"]
        if not isinstance(text, str):
            raise RopekitError(f"'{p}' line {number}: 'text' is a {type(text).__name__}, not a string",
                               'make "text" the document as one string')
        if "\ud800" <= max(text, default="") and any("\ud800" <= c <= "\udfff" for c in text):
            # JSON's \ud800 escape: a lone surrogate half, which is no character and no tokenizer takes
            raise RopekitError(f"'{p}' line {number}: 'text' holds an unpaired surrogate escape (\\ud800–\\udfff)",
                               "write the characters themselves, or both halves of the pair")
        if text.strip():
            yield f"{name}:{number}", text


def _parquet_texts(p: Path, name: str) -> Iterator[tuple[str, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(p)
    except (OSError, ValueError, pa.ArrowException) as e:  # ArrowInvalid for a damaged file
        raise RopekitError(f"'{p}' is not a readable parquet file ({type(e).__name__})", "check the file") from None
    columns = pf.schema_arrow.names
    if "text" not in columns:
        raise RopekitError(f"'{p}' has no column 'text' (columns: {', '.join(columns) or 'none'})",
                           "store the documents in a string column named 'text'")
    row = 0
    for batch in _parquet_batches(pf, p):
        for text in batch.column(0).to_pylist():
            row += 1
            if text is not None and not isinstance(text, str):
                raise RopekitError(f"'{p}' row {row}: 'text' is a {type(text).__name__}, not a string",
                                   "store the documents in a string column named 'text'")
            if text and text.strip():
                yield f"{name}:row {row}", text


def _parquet_batches(pf, p: Path):
    """The 'text' column in batches; a file whose footer reads but whose pages do not (a corrupt compressed page)
    fails here, one batch in, as one line like the footer's own damage."""
    import pyarrow as pa

    batches = pf.iter_batches(columns=["text"], batch_size=256)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (OSError, ValueError, pa.ArrowException) as e:
            raise RopekitError(f"'{p}' is not a readable parquet file ({type(e).__name__}: {str(e)[:80]})",
                               "check the file") from None
        yield batch


def _dataset_texts(p: Path) -> Iterator[tuple[str, str]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(p))
    except (OSError, ValueError, KeyError, TypeError) as e:  # a damaged or foreign directory
        raise RopekitError(f"'{p}' is not a dataset saved by datasets.save_to_disk ({type(e).__name__})",
                           "save it with Dataset.save_to_disk, or pass a .jsonl/.parquet file") from None
    prefix = ""
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds)
        if not splits:
            raise RopekitError(f"saved dataset '{p}' has no splits", "save a dataset that holds the documents")
        chosen = splits[0] if len(splits) == 1 else next((s for s in ("test", "validation") if s in ds), None)
        if chosen is None:
            raise RopekitError(f"saved dataset '{p}' has splits {', '.join(splits)} and none is 'test' or 'validation'",
                               f"pass the directory of one split, e.g. '{p / splits[0]}'")
        ds, prefix = ds[chosen], f"{chosen}:"
    if "text" not in ds.column_names:
        raise RopekitError(f"saved dataset '{p}' has no column 'text' (columns: {', '.join(ds.column_names)})",
                           "rename the document column to 'text'")
    for row, text in enumerate(_column(ds), 1):
        if text is not None and not isinstance(text, str):
            raise RopekitError(f"saved dataset '{p}' row {row}: 'text' is a {type(text).__name__}, not a string",
                               "store the documents in a string column named 'text'")
        if text and text.strip():
            yield f"{prefix}row {row}", text


def _column(ds, batch: int = 256) -> Iterator:
    for start in range(0, len(ds), batch):  # batches: the dataset is memory-mapped, only a batch is decoded
        yield from ds[start:start + batch]["text"]


# ---- the built-in corpus ---------------------------------------------------------------------------
def _clean_lines(text: str) -> str:
    """local_text's cleaning without its length cap: ``\\n`` newlines, printable-ASCII (and tab) lines only."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    kept = []
    for line in text.split("\n"):
        line = line.rstrip()
        if line.isascii() and _PRINTABLE.issuperset(line.encode("ascii")):
            kept.append(line)
    return "\n".join(kept).strip("\n") + "\n"


def _long_files(named_paths: Iterable[tuple[str, Path]]) -> list[tuple[str, str]]:
    """``(name, cleaned text)`` of each file whose cleaned text has at least :data:`BUILTIN_MIN_BYTES`."""
    named = []
    for name, path in named_paths:
        text = _clean_lines(path.read_bytes().decode("utf-8", errors="replace"))
        if len(text) >= BUILTIN_MIN_BYTES:
            named.append((name, text))
    return named


def _longest_first(named: list[tuple[str, str]], problem: str, fix: str) -> Iterator[tuple[str, str]]:
    """A built-in corpus's documents, longest first (ties by name); one error line when there are none."""
    if not named:
        raise RopekitError(problem, fix)
    yield from sorted(named, key=lambda item: (-len(item[1]), item[0]))


def _builtin_texts() -> Iterator[tuple[str, str]]:
    from . import local_text, prose

    root = local_text.stdlib_root()
    named = _long_files((f"stdlib/{rel}", root / rel) for rel in local_text.stdlib_files()
                        if local_text.split_of(rel) == "heldout")
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data; the stdlib part remains
        topics = {}
    paragraphs = [para for key in sorted(topics) for para in prose._paragraphs(topics[key])]
    if paragraphs:
        named.append((prose.PROSE_SOURCE + "/language-reference", _clean_lines("\n\n".join(paragraphs))))
    yield from _longest_first(named, "no built-in corpus text found in this Python installation",
                              "pass --data with a .txt/.jsonl/.parquet corpus")


def _builtin_test_texts() -> Iterator[tuple[str, str]]:
    from . import local_text

    suite = local_text.stdlib_root() / "test"
    if not suite.is_dir():
        raise RopekitError(f"CPython's test suite is not installed with this Python ({suite} is missing)",
                           "install it (Debian: libpython3.X-testsuite), or use --data builtin or a corpus of your own")
    files = (f for f in sorted(suite.rglob("*.py")) if "__pycache__" not in f.parts)
    named = _long_files((f"stdlib/{f.relative_to(suite.parent).as_posix()}", f) for f in files)
    yield from _longest_first(named, f"no test-suite file of {BUILTIN_MIN_BYTES} bytes or more under {suite}",
                              "use --data builtin or a corpus of your own")
