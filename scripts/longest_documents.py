"""Write the N longest documents of a built-in corpus (or any corpus ropekit reads) to a JSONL file.

A study that runs on another machine must score the same documents; the built-in corpora are read from the
running Python's standard library, which differs between Python versions (and some distributions leave the
test suite out). Freeze the documents once and point the study's ``data:`` at the file::

    python scripts/longest_documents.py builtin-tests 8 study-data/smollm2-heldout.jsonl

Each line is ``{"text": ..., "name": ...}``; the corpus reader orders documents longest first, so the file holds
the same documents, in the same order, as ``samples: N`` of the corpus itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ropekit.data.corpora import iter_named_texts


def main(corpus: str, count: str, out: str) -> None:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with path.open("w", encoding="utf-8") as fh:
        for name, text in iter_named_texts(corpus):
            fh.write(json.dumps({"text": text, "name": name}) + "\n")
            written += 1
            if written >= int(count):
                break
    print(f"{written} documents of {corpus} -> {path} (Python {sys.version.split()[0]})")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python scripts/longest_documents.py CORPUS N OUT.jsonl")
    main(*sys.argv[1:])
