"""A deterministic byte-level corpus built from the Python standard library's own source files.

**This is a substitute corpus made on the machine, not a published data set.** ropekit's default demo must
run on a fresh CPU machine without internet, so it cannot download text. Every machine that runs ropekit
has Python, and CPython ships its standard library as ``.py`` source: code, comments and docstrings,
several megabytes of ASCII English and Python. That is what the built-in tiny model is pre-trained on and
measured with. Numbers obtained on it say how methods compare on *this* text; they are not comparable
with results on natural-language benchmarks, and they can differ slightly between Python versions (whose
standard libraries differ), which is why callers fingerprint the corpus with :func:`corpus_digest`.

How it is made (all deterministic for a given Python installation):

1. every ``*.py`` file under ``sysconfig.get_paths()['stdlib']``, as a path relative to that directory,
   sorted; third-party packages (``site-packages``), test suites, IDLE, lib2to3, codec tables and other
   generated or vendored files are skipped (:data:`SKIP_DIRS`, :func:`is_corpus_file`);
2. each file becomes one *document*: decoded as UTF-8, newlines normalised, and every line that is not
   printable ASCII (plus tab) dropped, so that a byte is a character; documents are cut to
   :data:`MAX_DOC_BYTES` at a line boundary (so no single large module dominates) and very short ones
   (empty ``__init__.py``) are skipped;
3. each file belongs to the held-out split or the training split by a hash of its path (about one file in
   :data:`HELDOUT_EVERY` is held out): the split is by file, so no held-out text is ever trained on;
4. :func:`stdlib_documents` takes documents in a fixed pseudo-random order (another hash of the path, so
   that a small budget still samples the whole library rather than its alphabetical start) until
   ``max_bytes`` is reached, and returns them sorted by path.

Tokens are bytes: :class:`ByteTokenizer` has a vocabulary of 256 and ``id == byte``. Byte 0 never occurs
in the cleaned text and separates documents.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from pathlib import Path

from ..errors import InvalidParameterError, RopekitError

#: Directory names (anywhere in the path) whose files are not part of the corpus.
SKIP_DIRS = frozenset(
    {
        "site-packages",  # third-party code, differs between machines
        "dist-packages",
        "test",  # CPython's test suite: huge, repetitive, full of odd bytes
        "tests",
        "idle_test",
        "idlelib",
        "lib2to3",
        "turtledemo",
        "ensurepip",  # vendored wheels and bootstrap code
        "encodings",  # codec tables: mostly hex literals
        "pydoc_data",  # one generated module of documentation strings
        "__pycache__",
        "__phello__",
    }
)

#: About one file in this many is held out (chosen by a hash of its path).
HELDOUT_EVERY = 10
#: Longest document, in bytes: longer files are cut at a line boundary.
MAX_DOC_BYTES = 32 * 1024
#: Shortest document kept, in bytes.
MIN_DOC_BYTES = 256

SPLITS = ("train", "heldout")
_SPLIT_ALIASES = {"train": "train", "heldout": "heldout", "held_out": "heldout", "held-out": "heldout"}

_PRINTABLE = frozenset(range(0x20, 0x7F)) | {0x09}


def stdlib_root() -> Path:
    """The directory of the running Python's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_corpus_file(relpath: str) -> bool:
    """Whether the stdlib file at ``relpath`` (POSIX, relative to the stdlib root) belongs to the corpus."""
    parts = relpath.split("/")
    name = parts[-1]
    if not name.endswith(".py"):
        return False
    if any(p in SKIP_DIRS or p.startswith("config-") for p in parts[:-1]):
        return False
    if name.startswith(("test_", "_sysconfigdata")) or name.endswith("_test.py"):
        return False  # tests, and the build configuration of this particular machine
    return True


@functools.lru_cache(maxsize=4)
def _files(root: str) -> tuple[str, ...]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Prune skipped directories (site-packages alone can hold tens of thousands of files).
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith("config-")]
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if is_corpus_file(rel) and os.path.isfile(os.path.join(dirpath, name)):
                found.append(rel)
    return tuple(sorted(found))


def stdlib_files() -> list[str]:
    """Corpus files of this Python, relative to :func:`stdlib_root`, sorted by path."""
    return list(_files(str(stdlib_root())))


def _hash(tag: str, relpath: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{tag}:{relpath}".encode(), digest_size=8).digest(), "big")


def split_of(relpath: str) -> str:
    """``'heldout'`` or ``'train'``: the split a file belongs to (a hash of its path, so stable everywhere)."""
    return "heldout" if _hash("split", relpath) % HELDOUT_EVERY == 0 else "train"


def clean_text(raw: bytes) -> bytes:
    """One document from a file's bytes: UTF-8 text, ``\\n`` newlines, only printable-ASCII lines, ≤ MAX_DOC_BYTES."""
    text = raw.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    kept, size = [], 0
    for line in text.split("\n"):
        if not line.isascii():
            continue
        data = line.rstrip().encode("ascii")
        if not _PRINTABLE.issuperset(data):
            continue
        if size + len(data) + 1 > MAX_DOC_BYTES:
            break
        kept.append(data)
        size += len(data) + 1
    return b"\n".join(kept).strip(b"\n") + b"\n"


@functools.lru_cache(maxsize=16)
def _documents(root: str, max_bytes: int, split: str) -> tuple[bytes, ...]:
    files = [f for f in _files(root) if split_of(f) == split]
    if not files:
        raise RopekitError(
            f"no Python standard-library sources found under '{root}'",
            "ropekit's offline corpus is made from the stdlib .py files; install Python's full standard library",
        )
    chosen: dict[str, bytes] = {}
    total = 0
    for rel in sorted(files, key=lambda f: (_hash("order", f), f)):
        if total >= max_bytes:
            break
        doc = clean_text((Path(root) / rel).read_bytes())
        if len(doc) < MIN_DOC_BYTES:
            continue
        room = max_bytes - total
        if len(doc) > room:
            if room < MIN_DOC_BYTES:
                break
            doc = doc[:room]
        chosen[rel] = doc
        total += len(doc)
    return tuple(chosen[rel] for rel in sorted(chosen))


def stdlib_documents(max_bytes: int, split: str) -> list[bytes]:
    """Up to ``max_bytes`` of cleaned standard-library documents of ``split`` (``'train'`` or ``'heldout'``).

    The same Python installation always gives the same bytes. A budget above what the split holds returns
    the whole split (the training split is several megabytes, the held-out split about a tenth of that).
    """
    key = _SPLIT_ALIASES.get(str(split).strip().lower())
    if key is None:
        raise InvalidParameterError(f"unknown corpus split '{split}'", f"choose one of {', '.join(SPLITS)}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise InvalidParameterError(f"max_bytes must be a positive integer, got {max_bytes!r}", "pass e.g. 4_000_000")
    return list(_documents(str(stdlib_root()), max_bytes, key))


def corpus_digest(documents: list[bytes]) -> str:
    """A short fingerprint of ``documents`` (changes when the Python installation's stdlib does)."""
    h = hashlib.sha256()
    for doc in documents:
        h.update(len(doc).to_bytes(8, "big"))
        h.update(doc)
    return h.hexdigest()[:16]


class ByteTokenizer:
    """Bytes as tokens: vocabulary 256, ``id == byte``; id 0 (never in the corpus) separates documents."""

    vocab_size = 256
    separator_id = 0

    def encode(self, text: str | bytes) -> list[int]:
        """Token ids of ``text`` (a ``str`` is encoded as UTF-8 first)."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return list(data)

    def decode(self, ids) -> str:
        """The text of ``ids`` (invalid UTF-8 is replaced, separators become newlines)."""
        data = bytes(int(i) for i in ids).replace(bytes([self.separator_id]), b"\n")
        return data.decode("utf-8", errors="replace")

    def join(self, documents: list[bytes]) -> bytes:
        """One byte stream of ``documents``, each followed by the separator."""
        sep = bytes([self.separator_id])
        return b"".join(doc + sep for doc in documents)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=256)"
