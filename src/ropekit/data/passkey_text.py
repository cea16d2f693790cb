"""The passkey prompt's text (Mohtashami & Jaggi's Landmark Attention, Fig. 2a; as re-run by YaRN and PoSE):
the strings the three original repositories share (verbatim; docs/methods-reference.md §10) and how a prompt is put
together. The evaluation (:mod:`ropekit.eval.passkey`) and the built-in base model's training documents
both build their prompts here.
"""

from __future__ import annotations


TASK_DESCRIPTION = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
GARBAGE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
INFORMATION_LINE = "The pass key is {k}. Remember it. {k} is the pass key."
FINAL_QUESTION = "What is the pass key? The pass key is"

#: The garbage paragraph's sentences, cycled to make the filler.
GARBAGE_SENTENCES = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")

#: The key range of the originals (``random.randint(1, 50000)``).
KEY_RANGE = (1, 50000)


def filler(n: int) -> str:
    """The first ``n`` sentences of the cycled garbage paragraph, separated by single spaces."""
    return " ".join(GARBAGE_SENTENCES[i % len(GARBAGE_SENTENCES)] for i in range(n))


def build_prompt(n_garbage: int, n_prefix: int, key: int) -> str:
    """The passkey prompt with ``n_prefix`` filler sentences before the information line and ``n_garbage − n_prefix`` after."""
    if not 0 <= n_prefix <= n_garbage:
        raise ValueError(f"n_prefix {n_prefix} outside [0, {n_garbage}]")
    return "\n".join([TASK_DESCRIPTION, filler(n_prefix), INFORMATION_LINE.format(k=key), filler(n_garbage - n_prefix), FINAL_QUESTION])
