"""English prose found on every machine with Python: the haystack of the needle and RULER essay tasks.

RULER and the needle test use Paul Graham's essays, which cannot be shipped or downloaded here. The
substitute is the prose of the Python documentation that CPython installs with itself
(``pydoc_data.topics``: the language reference, ~75k words) followed by the docstrings of the standard
library's top-level modules, classes and functions, cleaned to sentences: code blocks, grammar productions, tables and headings are
dropped. It is labelled ``python-docs-prose`` wherever a result depends on it. It is technical English
rather than essays, so absolute scores differ from the papers'; what a method changes is comparable.

Sentences are split by a deterministic rule (terminal ``.``/``!``/``?`` followed by whitespace and an
uppercase letter or digit, not after a common abbreviation) in place of NLTK's punkt, which RULER
downloads at run time; essay-needle positions therefore differ slightly from RULER's own.
"""

from __future__ import annotations

import ast
import hashlib
import re
from functools import lru_cache
from pathlib import Path

#: Name recorded with every result that uses this haystack.
PROSE_SOURCE = "python-docs-prose"

_ABBREVIATIONS = {"e.g", "i.e", "etc", "vs", "mr", "mrs", "dr", "no", "cf", "fig", "eq", "approx", "st"}
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z0-9\"'(])")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` by the rule in the module docstring; whitespace inside a sentence is collapsed."""
    text = re.sub(r"\s+", " ", text).strip()
    if not text:
        return []
    sentences, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        head = text[start:m.start()].rstrip("\"')]")
        last = head.rsplit(" ", 1)[-1].rstrip(".!?").lower()
        if last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha()):
            continue  # "e.g. Foo", "J. Smith": not a boundary
        sentences.append(text[start:m.start()].strip())
        start = m.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return [s for s in sentences if s]


def _is_prose_line(line: str) -> bool:
    stripped = line.strip()
    if not stripped or line.startswith((" ", "\t")):  # indented: code, grammar, examples
        return False
    if set(stripped) <= set("*=-~^#+|_ ") or stripped.startswith((">>>", "...", "|", "+", "*", "-", "[", "..")):
        return False
    letters = sum(c.isalpha() for c in stripped)
    return letters >= 0.6 * len(stripped)


def _paragraphs(text: str) -> list[str]:
    """Prose paragraphs of reStructuredText-like ``text``: runs of prose lines that end like sentences."""
    paragraphs, current = [], []
    for line in text.splitlines() + [""]:
        if _is_prose_line(line):
            current.append(line.strip())
            continue
        if current:
            para = " ".join(current)
            words = para.split()
            if len(words) >= 8 and para.rstrip().endswith((".", "!", "?")):
                paragraphs.append(para.replace('"', "").replace("`", "").replace("::", ":"))
            current = []
    return paragraphs


@lru_cache(maxsize=1)
def _stdlib_docstring_paragraphs() -> tuple[str, ...]:
    root = Path(ast.__file__).parent
    paragraphs: list[str] = []
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):  # module, class and function docstrings, in source order
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    paragraphs.extend(_paragraphs(doc))
    return tuple(paragraphs)


@lru_cache(maxsize=1)
def prose_paragraphs() -> tuple[str, ...]:
    """Every prose paragraph, in a fixed order (documentation topics by name, then module docstrings)."""
    paragraphs: list[str] = []
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data; the docstrings still give prose
        topics = {}
    for name in sorted(topics):
        paragraphs.extend(_paragraphs(topics[name]))
    paragraphs.extend(_stdlib_docstring_paragraphs())
    if not paragraphs:
        raise RuntimeError("no English prose found in this Python installation")
    return tuple(paragraphs)


@lru_cache(maxsize=1)
def prose_sentences() -> tuple[str, ...]:
    """Every sentence of :func:`prose_paragraphs`, in order."""
    return tuple(s for p in prose_paragraphs() for s in split_sentences(p))


@lru_cache(maxsize=1)
def _prose_words() -> tuple[str, ...]:
    return tuple(" ".join(prose_paragraphs()).split())


def prose_text(n_words: int) -> str:
    """The first ``n_words`` words of the prose, repeating it from the start when more are asked for.

    As RULER's essay haystack: whitespace words of the concatenated text, cycled when the corpus is short.
    """
    words = _prose_words()
    reps, rest = divmod(n_words, len(words))
    return " ".join(words * reps + words[:rest])


def prose_digest() -> str:
    """A short hash of the prose, recorded with results so runs on different Pythons can be told apart."""
    return hashlib.sha256("\n".join(prose_paragraphs()).encode()).hexdigest()[:12]
