"""RULER's scoring (NVIDIA/RULER ``scripts/eval/synthetic/constants.py`` and ``eval/evaluate.py``), per sample.

RULER reports each metric as a percentage averaged over a task's samples; here each function scores *one*
sample as a fraction in [0, 1] (the record's ``score``), so the mean of the records equals RULER's number / 100.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    """RULER's ``postprocess_pred``: strip, turn every control character (``\\x00``–``\\x1f``) into ``\\n``, strip again."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, references: list[str]) -> float:
    """Fraction of the references found in the prediction, case-insensitively (partial credit).

    RULER's ``string_match_all`` for one sample: ``sum(r.lower() in pred.lower() for r in refs) / len(refs)``.
    Used by the niah family, vt, cwe and fwe.
    """
    if not references:
        raise ValueError("a RULER sample needs at least one reference")
    text = prediction.lower()
    return sum(1.0 for r in references if r.lower() in text) / len(references)


def string_match_part(prediction: str, references: list[str]) -> float:
    """1.0 when *any* reference occurs in the prediction (case-insensitive), else 0.0.

    RULER's ``string_match_part`` for one sample (``max`` over the gold aliases), used by qa_1 and qa_2.
    lm-evaluation-harness's port returns the fraction of aliases found instead, which scores lower; this
    follows RULER.
    """
    if not references:
        raise ValueError("a RULER sample needs at least one reference")
    text = prediction.lower()
    return 1.0 if any(r.lower() in text for r in references) else 0.0


METRICS = {"string_match_all": string_match_all, "string_match_part": string_match_part}
