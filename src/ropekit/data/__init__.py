"""Text that ropekit can train and measure on without a network.

:mod:`ropekit.data.local_text` builds a byte-level corpus from the Python standard library's own source
files. It is a *substitute* corpus made on the machine (no download), good enough to pre-train the
built-in tiny model and to show how extension methods behave; it is not a benchmark.
"""

from __future__ import annotations

from .local_text import ByteTokenizer, corpus_digest, stdlib_documents, stdlib_files

__all__ = ["ByteTokenizer", "corpus_digest", "stdlib_documents", "stdlib_files"]
