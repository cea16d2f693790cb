"""LongBench v1 metrics on hand-computed cases, including the originals' quirks and edge cases."""

from __future__ import annotations

import random

import pytest

from ropekit.errors import RopekitError
from ropekit.eval import text_metrics as tm


def _lcs(a, b) -> int:
    """Longest common subsequence length, the O(n·m) dynamic programme."""
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = table[i - 1][j - 1] + 1 if a[i - 1] == b[j - 1] else max(table[i - 1][j], table[i][j - 1])
    return table[-1][-1]


# ---- qa_f1 ----------------------------------------------------------------------------------------------
def test_normalize_answer_is_squad():
    assert tm.normalize_answer("The  Quick, brown-fox!  an Apple") == "quick brownfox apple"
    assert tm.normalize_answer("A theory of the thing") == "theory of thing"


def test_qa_f1_hand_computed():
    # pred tokens: [paris, france, capital]; gold: [capital, city, is, paris] → overlap 2, P=2/3, R=2/4
    p, r = 2 / 3, 2 / 4
    assert tm.qa_f1("Paris, France capital", "The capital city is Paris.") == pytest.approx(2 * p * r / (p + r))
    assert tm.qa_f1("The Eiffel Tower", "eiffel tower!") == 1.0
    # repeated tokens count as a multiset: pred [a1, a1, b], gold [a1] → overlap 1, P=1/3, R=1
    assert tm.qa_f1("x x y", "x") == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
    assert tm.qa_f1("", "Paris") == 0.0
    assert tm.qa_f1("the", "a") == 0.0  # both normalise to nothing
    assert isinstance(tm.qa_f1("no", "yes"), float)


def test_qa_f1_zh_hand_computed():
    assert tm.jieba_tokens("我爱北京天安门。") == ["我", "爱", "北京", "天安门", "。"]
    assert tm.jieba_tokens("天安门在北京") == ["天安门", "在", "北京"]
    # "。" normalises to "" and is dropped: pred [我, 爱, 北京, 天安门] vs gold [天安门, 在, 北京] → 2 shared
    p, r = 2 / 4, 2 / 3
    assert tm.qa_f1_zh("我爱北京天安门。", "天安门在北京") == pytest.approx(2 * p * r / (p + r))
    assert tm.qa_f1_zh("北京！", "北京") == 1.0
    assert tm.qa_f1_zh("", "北京") == 0.0
    assert tm.normalize_zh_answer("Ａ，北 京》《") == "ａ北京《"  # "《" is absent from the original's list


# ---- rouge ----------------------------------------------------------------------------------------------
def test_rouge_l_hand_computed():
    # distinct words, one sentence: LCS("a b c", "a x c d") = 2, P = 2/3, R = 2/4, F = 2PR/(P+R+1e-8)
    p, r = 2 / 3, 2 / 4
    assert tm.rouge("alpha beta gamma", "alpha xi gamma delta") == pytest.approx(2 * p * r / (p + r + 1e-8), abs=1e-12)
    assert tm.rouge("same words here", "same words here") == pytest.approx(1.0, abs=1e-7)


def test_rouge_exceptions_score_zero():
    assert tm.rouge("", "a reference") == 0.0  # "Hypothesis is empty"
    assert tm.rouge("a hypothesis", "") == 0.0  # "Reference is empty"
    assert tm.rouge("...", "a reference") == 0.0  # only periods: no sentences left


def test_rouge_zh_segments_with_jieba():
    # "我 爱 北京 天安门" vs "天安门 在 北京": LCS over words = 1, P = 1/4, R = 1/3
    p, r = 1 / 4, 1 / 3
    assert tm.rouge_zh("我爱北京天安门", "天安门在北京") == pytest.approx(2 * p * r / (p + r + 1e-8), abs=1e-12)
    assert tm.rouge_zh("", "北京") == 0.0


# ---- classification -------------------------------------------------------------------------------------
def test_classification_rules():
    classes = ["Location", "Human", "Numeric", "Description"]
    assert tm.classification("Type: Location", "Location", all_classes=classes) == 1.0
    assert tm.classification("Human or Location", "Location", all_classes=classes) == 0.5
    assert tm.classification("Numeric", "Location", all_classes=classes) == 0.0
    assert tm.classification("nothing", "Location", all_classes=classes) == 0.0  # no difflib fallback
    # a matched class that is a substring of the gold (but not the gold) is dropped
    sub = ["Other", "Other location", "City"]
    assert tm.classification("Other location", "Other location", all_classes=sub) == 1.0
    with pytest.raises(RopekitError, match="all_classes"):
        tm.classification("x", "y", all_classes=None)


def test_classification_reproduces_the_skip_after_removal():
    # matches = [a, ab, abc] (all in the prediction); gold "abc": "a" is removed, the walk then skips "ab"
    # (it slid into index 0 and the index moved to 1), so matches = [ab, abc] → 1/2, not 1/1.
    classes = ["a", "ab", "abc"]
    assert tm.classification("abc", "abc", all_classes=classes) == 0.5  # filtering every non-gold match would give 1.0


# ---- retrieval / count ----------------------------------------------------------------------------------
def test_retrieval_counts_matching_numbers():
    assert tm.retrieval("Paragraph 12", "Paragraph 12") == 1.0
    assert tm.retrieval("Paragraph 12 or Paragraph 3, maybe 12", "Paragraph 12") == pytest.approx(2 / 3)
    assert tm.retrieval("I do not know", "Paragraph 12") == 0.0
    assert tm.retrieval("Paragraph 112", "Paragraph 12") == 0.0  # whole numbers, not substrings
    assert tm.retrieval_zh("段落5，不是段落7", "段落5") == 0.5
    with pytest.raises(RopekitError, match="names no paragraph"):
        tm.retrieval("1", "the first one")


def test_count_score():
    assert tm.count("There are 7 unique paragraphs", "7") == 1.0
    assert tm.count("7 or 8", "7") == 0.5
    assert tm.count("seven", "7") == 0.0
    assert tm.count("17", 7) == 0.0


# ---- code_sim -------------------------------------------------------------------------------------------
def test_fuzz_ratio_is_the_rounded_indel_ratio():
    """fuzzywuzzy.ratio = round(100·(|a|+|b|−indel)/(|a|+|b|)) with indel = |a|+|b|−2·LCS, checked by hand."""
    rng = random.Random(0)
    pairs = [("return x + 1", "return x+1"), ("cbacb", "abcb"), ("kitten", "sitting"), ("abc", "xyz")]
    pairs += [("".join(rng.choice("abc ") for _ in range(rng.randint(1, 12))),
               "".join(rng.choice("abc ") for _ in range(rng.randint(1, 12)))) for _ in range(40)]
    for a, b in pairs:
        total = len(a) + len(b)
        expected = 100 if a == b else round(100 * (2 * _lcs(a, b) / total))
        assert tm.fuzz_ratio(a, b) == expected, (a, b)
    # hand-computed: LCS("return x + 1", "return x+1") = 10, total 22 → 20/22 → 90.9 → 91
    assert tm.fuzz_ratio("return x + 1", "return x+1") == 91
    # difflib's greedy blocks give a different number on this pair (4/9 = 0.444 vs LCS 6/9)
    import difflib

    assert difflib.SequenceMatcher(None, "cbacb", "abcb").ratio() == pytest.approx(4 / 9)
    assert tm.fuzz_ratio("cbacb", "abcb") == 67
    # fuzzywuzzy's short-cuts: equal strings → 100 (even empty), exactly one empty → 0
    assert tm.fuzz_ratio("", "") == 100 and tm.fuzz_ratio("", "x") == 0 and tm.fuzz_ratio("x", "") == 0


def test_code_sim_uses_first_plain_line():
    pred = "\n\n# a comment\n```python\nreturn x + 1\nfoo()"
    assert tm.first_code_line(pred) == "return x + 1"
    assert tm.code_sim(pred, "return x+1") == 0.91
    assert tm.first_code_line("// only\n# comments") == ""
    assert tm.code_sim("// only\n# comments", "x = 1") == 0.0
    assert tm.code_sim("x = 1", "x = 1") == 1.0


# ---- per-item rule --------------------------------------------------------------------------------------
def test_first_line_cut_and_best_score():
    assert tm.first_line("\n\nLocation\nHuman") == "Location"
    assert tm.first_line("") == ""
    # max over answers, starting from 0
    assert tm.best_score("qa_f1", "Paris", ["London", "Paris"]) == 1.0
    assert tm.best_score("qa_f1", "Paris", []) == 0.0
    # the few-shot cut: without it, the second line's words would count
    pred = "\nParis\nLondon is also nice"
    assert tm.best_score("qa_f1", pred, ["Paris"], cut_first_line=True) == 1.0
    assert tm.best_score("qa_f1", pred, ["Paris"]) < 1.0
    assert tm.best_score("classification", "Human\nLocation", ["Location"], all_classes=["Human", "Location"],
                         cut_first_line=True) == 0.0
    assert set(tm.METRICS) == {"qa_f1", "qa_f1_zh", "rouge", "rouge_zh", "classification", "retrieval",
                               "retrieval_zh", "count", "code_sim"}
