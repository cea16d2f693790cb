"""Local SQuAD v2 and HotpotQA files for RULER's qa_1 / qa_2, read as RULER's ``scripts/data/synthetic/qa.py`` does.

* SQuAD v2 dev (``dev-v2.0.json``): the documents are the sorted set of every paragraph context; a question
  is kept only when answerable (``is_impossible`` false); its gold document is its own paragraph, its
  "more context" the article's other paragraphs, and its references every answer text.
* HotpotQA dev, distractor setting (``hotpot_dev_distractor_v1.json``): a document is
  ``title + "\\n" + "".join(sentences)``; the documents are the sorted set over all questions; a question's
  gold documents are all ten of its paragraphs and its reference is ``[answer]``.

Nothing is downloaded: the files must already be in the ``--data`` directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ...errors import RopekitError

#: RULER task → (file name in --data, what it is, label recorded as the haystack).
QA_FILES = {
    "qa_1": ("dev-v2.0.json", "SQuAD v2 dev", "squad-v2-dev"),
    "qa_2": ("hotpot_dev_distractor_v1.json", "HotpotQA dev distractor", "hotpotqa-dev-distractor"),
}


@dataclass(frozen=True)
class QAItem:
    query: str
    references: tuple[str, ...]
    gold: tuple[int, ...]  # indices into QAData.documents
    more: tuple[int, ...]  # same-article documents (SQuAD only)


@dataclass(frozen=True)
class QAData:
    name: str
    path: str
    documents: tuple[str, ...]
    items: tuple[QAItem, ...]


def _bad(path: Path, what: str, detail: str) -> RopekitError:
    return RopekitError(f"'{path}' is not a {what} file ({detail})", f"put the official {path.name} in the --data directory")


def _read_squad(path: Path, data) -> QAData:
    try:
        articles = data["data"]
        docs = sorted({p["context"] for d in articles for p in d["paragraphs"]})
        index = {c: i for i, c in enumerate(docs)}
        items = []
        for d in articles:
            article_docs = [index[p["context"]] for p in d["paragraphs"]]
            for p in d["paragraphs"]:
                own = index[p["context"]]
                for qa in p["qas"]:
                    if qa.get("is_impossible", False):
                        continue
                    answers = tuple(a["text"] for a in qa["answers"])
                    if not answers:
                        continue
                    items.append(QAItem(qa["question"], answers, (own,), tuple(i for i in article_docs if i != own)))
    except (KeyError, TypeError) as e:
        raise _bad(path, "SQuAD v2", f"missing field {e}") from None
    return QAData("qa_1", str(path), tuple(docs), tuple(items))


def _read_hotpot(path: Path, data) -> QAData:
    try:
        def doc(title, sentences):
            return f"{title}\n{''.join(sentences)}"

        docs = sorted({doc(t, s) for d in data for t, s in d["context"]})
        index = {c: i for i, c in enumerate(docs)}
        items = tuple(
            QAItem(d["question"], (d["answer"],), tuple(index[doc(t, s)] for t, s in d["context"]), ()) for d in data
        )
    except (KeyError, TypeError, ValueError) as e:
        raise _bad(path, "HotpotQA", f"unexpected structure: {e}") from None
    return QAData("qa_2", str(path), tuple(docs), items)


@lru_cache(maxsize=4)
def _load(task: str, path: str, mtime: float) -> QAData:
    p = Path(path)
    _, what, _ = QA_FILES[task]
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(p, what, f"unreadable JSON: {e}") from None
    qa = _read_squad(p, data) if task == "qa_1" else _read_hotpot(p, data)
    if not qa.items:
        raise _bad(p, what, "no answerable question")
    return qa


def find_qa_data(task: str, data_dir: str | None) -> tuple[QAData | None, str | None]:
    """``(data, None)`` when ``task``'s file is in ``data_dir``, else ``(None, reason)`` (one line, for the skip note)."""
    name, what, _ = QA_FILES[task]
    if data_dir is None:
        return None, f"no --data directory given (it needs {name}, {what})"
    root = Path(data_dir)
    if not root.exists():
        raise RopekitError(f"--data '{root}' does not exist", f"pass a directory holding {QA_FILES['qa_1'][0]} and/or {QA_FILES['qa_2'][0]}")
    path = root / name if root.is_dir() else root
    if root.is_file() and root.name != name:
        return None, f"--data is a file, not a directory holding {name} ({what})"
    if not path.is_file():
        return None, f"{name} ({what}) is not in --data {root}"
    return _load(task, str(path.resolve()), path.stat().st_mtime), None
