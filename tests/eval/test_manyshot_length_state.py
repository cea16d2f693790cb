"""Many-shot label likelihoods on methods whose frequencies depend on the input length: each label scored as alone.

* A label whose tokens are a prefix of another label's was read from the longer label's row, right-filled to the
  longest: the input was longer than ``prompt + label[:-1]``, so Dynamic YaRN (and Dynamic NTK, LongRoPE near its
  switch) computed it at other frequencies than lm-evaluation-harness's request for it alone.
* Dynamic NTK keeps the frequencies of the longest input seen: a query scored after a longer one got the longer
  one's frequencies.

The reference: a freshly installed model per label, one unbatched, unpadded forward of ``prompt + label[:-1]``.
"""

from __future__ import annotations

import pytest
import torch

from ropekit.eval import manyshot as ms
from ropekit.eval.common import make_context
from ropekit.models.tiny import build_tiny_model


def installed(method, params):
    """A tiny Llama (window 64) with sharpened query/key/embedding/head weights (a change of frequencies shows well
    above float noise), ``method`` installed as an evaluation installs it."""
    model = build_tiny_model("llama", seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and any(part in name for part in ("q_proj", "k_proj", "lm_head", "embed")):
                p.mul_(6.0)
    return make_context("manyshot", model, None, method=method, params=dict(params or {}), lengths=[256],
                        key_fields=ms.KEY_FIELDS).model


def alone(method, params, prompt, cont) -> float:
    """Σ_j log p(cont[j] | prompt + cont[:j]) from a fresh model and one forward of exactly prompt + cont[:-1]."""
    model = installed(method, params)
    ids = torch.tensor([list(prompt) + list(cont[:-1])])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return sum(float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(cont))


def prompt_of(n, seed=3):
    return torch.randint(2, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


CONTS = [[5], [5, 7, 9, 11, 13, 15, 17, 19], [6, 7], [6, 7, 8]]


@pytest.mark.parametrize("method, params", [("dynamic_yarn", {"factor": 4.0}), ("dynamic_ntk", {"factor": 4.0})])
def test_a_label_that_is_a_prefix_of_another_scores_as_alone(method, params, monkeypatch):
    prompt = prompt_of(100)
    expected = [alone(method, params, prompt, c) for c in CONTS]
    model = installed(method, params)
    assert ms.length_dependent(model)
    widths = []
    real = ms._forward_rows
    monkeypatch.setattr(ms, "_forward_rows", lambda m, p, ext, longest, pad: widths.append(
        sorted({len(e) for e in ext}) + [longest]) or real(m, p, ext, longest, pad))
    assert ms.label_logprobs(model, prompt, CONTS) == pytest.approx(expected, abs=1e-5)
    # one row per distinct prefix, each exactly its own length (no filler), rows of one width together
    assert widths == [[7, 7], [2, 2], [1, 1], [0, 0]]


def test_a_query_after_a_longer_one_scores_as_alone():
    method, params = "dynamic_ntk", {"factor": 4.0}
    prompt = prompt_of(100)
    conts = [[5], [6]]
    expected = [alone(method, params, prompt, c) for c in conts]
    model = installed(method, params)
    ms.label_logprobs(model, prompt * 2, conts)  # another query, 200 tokens
    assert ms.label_logprobs(model, prompt, conts) == pytest.approx(expected, abs=1e-5)


def test_a_length_independent_model_keeps_the_shared_rows(monkeypatch):
    """Plain RoPE and PI: filler and longer rows change nothing, so prefixes still share one right-filled forward."""
    rows = []
    real = ms._forward_rows
    monkeypatch.setattr(ms, "_forward_rows", lambda m, p, ext, longest, pad: rows.append(list(ext))
                        or real(m, p, ext, longest, pad))
    for method, params in ((None, None), ("pi", {"factor": 4.0})):
        model = installed(method, params)
        assert not ms.length_dependent(model)
        prompt = prompt_of(60)
        expected = [alone(method, params, prompt, c) for c in CONTS]
        rows.clear()
        assert ms.label_logprobs(model, prompt, CONTS) == pytest.approx(expected, abs=1e-5)
        assert rows == [[(5, 7, 9, 11, 13, 15, 17), (6, 7)]]
