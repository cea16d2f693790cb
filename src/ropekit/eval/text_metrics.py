"""LongBench v1 answer metrics, reproducing the official ``LongBench/metrics.py`` and ``eval.py`` (THUDM/LongBench).

Each metric is ``metric(prediction, ground_truth, *, all_classes=None) -> float`` in [0, 1], scoring one
prediction against one gold answer. :func:`best_score` applies LongBench's per-item rule: the few-shot
datasets (trec, triviaqa, samsum, lsht) first cut the prediction to its first line after leading newlines
(:func:`first_line`: ``lstrip("\n").split("\n")[0]``, which may be spaces only), then the item scores the maximum over its gold answers (starting from 0).

Reproduced behaviour of the originals, kept on purpose so that scores match published numbers:

* ``qa_f1``: SQuAD answer normalisation (lower-case, drop ASCII punctuation, drop the articles a/an/the,
  collapse whitespace), whitespace tokens, bag-of-tokens F1 through a multiset intersection.
* ``qa_f1_zh``: jieba tokens (precise mode), each token lower-cased and stripped of ASCII and the original's
  list of Chinese punctuation and of all whitespace, empty tokens dropped, then the same F1.
* ``rouge``: ROUGE-L F of the ``rouge`` PyPI package (summary-level union LCS over "."-split sentences,
  unique-token counts, F = 2PR/(P+R+1e-8)); *any* exception (empty hypothesis or reference, a text of
  only periods, recursion depth on very long texts) scores 0.
* ``rouge_zh``: both texts are jieba-segmented and joined by spaces, then ``rouge``.
* ``classification``: the classes of ``all_classes`` occurring as substrings of the prediction; from that
  list a class that is a substring of the gold but not equal to it is removed *while iterating over the
  same list*, so the element right after a removed one is never examined (the original's list-mutation
  quirk); the score is 1/len(list) when the gold is in the list, else 0. The original's difflib fallback
  sits behind ``if em_match_list != 0`` (a list compared with an int, always true), so it never runs and is
  not reproduced.
* ``retrieval`` / ``retrieval_zh``: the gold paragraph number is the first ``Paragraph (\\d+)``
  (``段落(\\d+)``) of the gold answer; the score is the fraction of the numbers (``\\d+``) in the prediction
  that equal it, 0 for a prediction without numbers.
* ``count``: the same fraction against the gold count itself.
* ``code_sim``: the first line of ``prediction.lstrip("\\n")`` that contains none of `` ` ``, ``#`` and
  ``//`` (the empty string if none does), scored with ``fuzzywuzzy.fuzz.ratio(line, gold) / 100``.
  fuzzywuzzy (with python-Levenshtein, the backend it asks for) returns
  ``int(round(100 * (|a| + |b| − indel(a, b)) / (|a| + |b|)))`` — an *integer* percentage from the
  insertion/deletion distance — with 100 for equal strings and 0 when exactly one is empty. This is
  ``rapidfuzz.fuzz.ratio`` rounded to an integer; difflib's ``SequenceMatcher.ratio`` is a different
  (greedy-block) measure and is not used. It is what fuzzywuzzy falls back to without python-Levenshtein, and
  LongBench's ``requirements.txt`` lists fuzzywuzzy alone, so a setup from that file alone scores code_sim with
  difflib (``'self.b = b; self.a = a'`` against ``'self.a = a; self.b = b'``: 0.45, against 0.82 here; which
  backend the published numbers used is an open question upstream, THUDM/LongBench issue #96).
"""

from __future__ import annotations

import logging
import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from ..errors import RopekitError

#: Datasets whose prediction is cut to its first line before scoring (eval.py: "trec", "triviaqa", "samsum", "lsht").
FIRST_LINE_DATASETS = ("trec", "triviaqa", "samsum", "lsht")

# The original normalize_zh_answer's Chinese punctuation list, character for character (note: "《" is absent
# while "》" is present, and "." is included).
_CN_PUNCTUATION = "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."
_EN_PUNCTUATION = frozenset(string.punctuation)
_ALL_PUNCTUATION = frozenset(string.punctuation + _CN_PUNCTUATION)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUMBER = re.compile(r"\d+")


# ---- normalisation -----------------------------------------------------------------------------------
def normalize_answer(text: str) -> str:
    """SQuAD v1.1 answer normalisation: lower-case, drop punctuation, drop a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _EN_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def normalize_zh_answer(text: str) -> str:
    """LongBench's Chinese normalisation: lower-case, drop ASCII + Chinese punctuation, remove all whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _ALL_PUNCTUATION)
    return "".join(text.split())


_JIEBA_READY = False


def jieba_tokens(text: str) -> list[str]:
    """jieba's precise-mode segmentation (``jieba.cut(text, cut_all=False)``), as LongBench uses it."""
    global _JIEBA_READY
    import jieba

    if not _JIEBA_READY:
        jieba.setLogLevel(logging.WARNING)  # its dictionary-loading chatter would land in every CLI run
        _JIEBA_READY = True
    return list(jieba.cut(text, cut_all=False))


# ---- metrics ------------------------------------------------------------------------------------------
def token_f1(prediction_tokens: Sequence[str], ground_truth_tokens: Sequence[str]) -> float:
    """Bag-of-tokens F1: overlap = size of the multiset intersection; 0 when nothing overlaps."""
    same = sum((Counter(prediction_tokens) & Counter(ground_truth_tokens)).values())
    if same == 0:
        return 0.0
    precision = same / len(prediction_tokens)
    recall = same / len(ground_truth_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_f1(prediction: str, ground_truth: str, **_) -> float:
    """Token F1 after SQuAD normalisation (LongBench ``qa_f1_score``)."""
    return token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def qa_f1_zh(prediction: str, ground_truth: str, **_) -> float:
    """Token F1 over jieba tokens, each normalised, empty ones dropped (LongBench ``qa_f1_zh_score``)."""

    def tokens(text: str) -> list[str]:
        return [t for t in (normalize_zh_answer(tok) for tok in jieba_tokens(text)) if t]

    return token_f1(tokens(prediction), tokens(ground_truth))


def rouge(prediction: str, ground_truth: str, **_) -> float:
    """ROUGE-L F of the ``rouge`` package (LongBench ``rouge_score``); any exception scores 0."""
    from rouge import Rouge

    try:
        scores = Rouge().get_scores([prediction], [ground_truth], avg=True)
    except Exception:  # noqa: BLE001 - the original catches everything (empty texts, RecursionError, …)
        return 0.0
    return float(scores["rouge-l"]["f"])


def rouge_zh(prediction: str, ground_truth: str, **_) -> float:
    """``rouge`` over jieba-segmented, space-joined texts (LongBench ``rouge_zh_score``)."""
    return rouge(" ".join(jieba_tokens(prediction)), " ".join(jieba_tokens(ground_truth)))


def classification(prediction: str, ground_truth: str, *, all_classes: Iterable[str] | None = None, **_) -> float:
    """LongBench ``classification_score`` (trec, lsht), with the original's list-mutation quirk (module doc)."""
    if all_classes is None:
        raise RopekitError(
            "a classification item has no 'all_classes'",
            "use the official LongBench trec/lsht files, whose items list every class",
        )
    matches = [c for c in all_classes if c in prediction]
    # The original removes from the list it is iterating over: the iterator's index still advances after
    # a removal, so the element that slid into the freed slot is skipped. Reproduce exactly that walk.
    i = 0
    while i < len(matches):
        term = matches[i]
        if term in ground_truth and term != ground_truth:
            matches.remove(term)  # removes the first equal element, as list.remove did in the original
        i += 1
    if ground_truth in matches:
        return 1.0 / len(matches)
    return 0.0


def _fraction_equal(prediction: str, target: str) -> float:
    numbers = _NUMBER.findall(prediction)
    if not numbers:
        return 0.0
    return sum(1 for n in numbers if n == target) / len(numbers)


def _gold_paragraph(ground_truth: str, pattern: str, dataset: str) -> str:
    found = re.findall(pattern, ground_truth)
    if not found:
        raise RopekitError(
            f"{dataset} gold answer {ground_truth!r} names no paragraph",
            f"the gold answers must read like {'Paragraph 3' if dataset == 'passage_retrieval_en' else '段落3'}",
        )
    return found[0]


def retrieval(prediction: str, ground_truth: str, **_) -> float:
    """Fraction of the numbers in the prediction equal to the gold ``Paragraph N`` (LongBench ``retrieval_score``)."""
    return _fraction_equal(prediction, _gold_paragraph(ground_truth, r"Paragraph (\d+)", "passage_retrieval_en"))


def retrieval_zh(prediction: str, ground_truth: str, **_) -> float:
    """As :func:`retrieval` with the gold read from ``段落N`` (LongBench ``retrieval_zh_score``)."""
    return _fraction_equal(prediction, _gold_paragraph(ground_truth, r"段落(\d+)", "passage_retrieval_zh"))


def count(prediction: str, ground_truth: str, **_) -> float:
    """Fraction of the numbers in the prediction equal to the gold count (LongBench ``count_score``)."""
    return _fraction_equal(prediction, str(ground_truth))


def fuzz_ratio(a: str, b: str) -> int:
    """``fuzzywuzzy.fuzz.ratio(a, b)`` with python-Levenshtein: integer percentage of the indel similarity.

    100 for equal strings (both empty included), 0 when exactly one is empty, else
    ``round(100 * ((|a|+|b| − indel) / (|a|+|b|)))`` with Python's rounding, as fuzzywuzzy's ``intr``.
    """
    from rapidfuzz.distance import Indel

    if a == b:
        return 100
    if not a or not b:
        return 0
    total = len(a) + len(b)
    return round(100 * ((total - Indel.distance(a, b)) / total))


def first_code_line(prediction: str) -> str:
    """The first line of ``prediction.lstrip('\\n')`` holding none of `` ` ``, ``#``, ``//``; "" if none."""
    for line in prediction.lstrip("\n").split("\n"):
        if "`" not in line and "#" not in line and "//" not in line:
            return line
    return ""


def code_sim(prediction: str, ground_truth: str, **_) -> float:
    """Edit similarity of the first code line to the gold line (LongBench ``code_sim_score``)."""
    return fuzz_ratio(first_code_line(prediction), ground_truth) / 100


#: Metric name → function (the names LongBench's eval.py uses, without the ``_score`` suffix).
METRICS: dict[str, Callable[..., float]] = {
    "qa_f1": qa_f1,
    "qa_f1_zh": qa_f1_zh,
    "rouge": rouge,
    "rouge_zh": rouge_zh,
    "classification": classification,
    "retrieval": retrieval,
    "retrieval_zh": retrieval_zh,
    "count": count,
    "code_sim": code_sim,
}


def first_line(prediction: str) -> str:
    """The few-shot cut of eval.py: ``prediction.lstrip('\\n').split('\\n')[0]``."""
    return prediction.lstrip("\n").split("\n")[0]


def best_score(
    metric: str | Callable[..., float],
    prediction: str,
    answers: Sequence[str],
    *,
    all_classes: Sequence[str] | None = None,
    cut_first_line: bool = False,
) -> float:
    """One item's LongBench score: max over the gold answers of ``metric`` (0 when there are none).

    ``cut_first_line`` applies the few-shot first-line cut first (:data:`FIRST_LINE_DATASETS`).
    """
    fn = METRICS[metric] if isinstance(metric, str) else metric
    if cut_first_line:
        prediction = first_line(prediction)
    score = 0.0
    for gold in answers:
        score = max(score, float(fn(prediction, gold, all_classes=all_classes)))
    return score
