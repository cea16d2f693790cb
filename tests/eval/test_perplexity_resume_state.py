"""`ropekit eval ppl` gives each record what a run of that length alone gives, and a resume keeps one document set.

* Methods whose frequencies follow the longest input seen (Dynamic NTK through transformers' dynamic update, PI on a
  Dynamic-NTK checkpoint through ropekit's continuous schedule) scored a length after a longer one at the longer
  one's frequencies: ``--lengths 256,128`` gave another perplexity at 128 than ``--lengths 128``.
* The longest length chooses the documents (and, in same_targets mode, where the targets end) but was not part of
  what a resume checks: a resume with another longest length kept the earlier records next to records of other
  documents or targets.
"""

from __future__ import annotations

import json

import pytest
import torch

from ropekit.errors import RopekitError
from ropekit.eval import perplexity as P
from ropekit.eval.common import make_context
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model

TEXT = " ".join(P.__doc__.encode("ascii", "ignore").decode().split())


def sharp_model(**config):
    """The tiny Llama (window 64) with larger query, key, embedding and head weights: attention depends more on the
    rotation, so a change of frequencies shows well above float noise."""
    model = build_tiny_model("llama", seed=0, **config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and any(part in name for part in ("q_proj", "k_proj", "lm_head", "embed")):
                p.mul_(6.0)
    return model.eval()


#: (model config, method, params): transformers' own dynamic update, and ropekit's continuous LengthSchedule.
LENGTH_DEPENDENT = [
    pytest.param({}, "dynamic_ntk", {"factor": 4.0}, id="dynamic_ntk"),
    pytest.param({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "pi", {"factor": 2.0}, id="pi-on-dynamic"),
]


def corpus(tmp_path, sizes, name="docs.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps({"text": TEXT[i * 300:i * 300 + n]}) + "\n" for i, n in enumerate(sizes)))
    return str(path)


def evaluate(model, data, lengths, *, method=None, params=None, out=None, resume=False, **options):
    ctx = make_context("ppl", model, byte_tokenizer(), method=method, params=params, lengths=lengths,
                       key_fields=P.KEY_FIELDS, out=out, resume=resume)
    P.run(ctx, data=data, lengths=lengths, **options)
    return list(ctx.writer.records())


def naive_nll_sum(model, ids, length, stride):
    """Σ NLL of a document under last_stride without BOS, every window run in order through one model, log-softmax in
    float64: what a process that evaluates this one length computes."""
    total, prev_end = 0.0, 0
    for start in range(0, len(ids), stride):
        end = min(start + length, len(ids))
        window = torch.tensor([ids[start:end]])
        with torch.no_grad():
            logits = model(input_ids=window, attention_mask=torch.ones_like(window)).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        first = prev_end - start if start else 1
        total -= sum(float(logp[j - 1, ids[start + j]]) for j in range(first, end - start))
        prev_end = end
        if end == len(ids):
            break
    return total


@pytest.mark.parametrize("config, method, params", LENGTH_DEPENDENT)
def test_a_length_after_a_longer_one_scores_as_that_length_alone(tmp_path, config, method, params):
    data = corpus(tmp_path, (420, 400))  # both documents long enough for 256: the same documents at every length
    alone = {r["doc"]: r for r in evaluate(sharp_model(**config), data, [128], method=method, params={**params})}
    after = {(r["length"], r["doc"]): r for r in evaluate(sharp_model(**config), data, [256, 128], method=method,
                                                          params={**params})}
    fresh = {}
    for doc, text in enumerate(TEXT[i * 300:i * 300 + n] for i, n in enumerate((420, 400))):
        model = make_context("ppl", sharp_model(**config), None, method=method, params={**params}, lengths=[256],
                             key_fields=P.KEY_FIELDS).model  # installed exactly as the runs above install it
        fresh[doc] = naive_nll_sum(model, list(text.encode()), 128, 64)
    for doc, r in alone.items():
        assert after[(128, doc)]["nll_sum"] == r["nll_sum"], (method, doc)  # the 256 windows before change nothing
        assert r["nll_sum"] == pytest.approx(fresh[doc], rel=1e-6)


def test_an_interrupted_dynamic_run_resumes_to_the_uninterrupted_records(tmp_path, monkeypatch):
    data = corpus(tmp_path, (420, 400))
    full = tmp_path / "full.jsonl"
    evaluate(sharp_model(), data, [256, 128], method="dynamic_ntk", params={"factor": 4.0}, out=str(full))
    cut = tmp_path / "cut.jsonl"
    real = P.score_document
    calls = []

    def crash_on_third(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed after both 256 records, before the first 128 one
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(P, "score_document", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        evaluate(sharp_model(), data, [256, 128], method="dynamic_ntk", params={"factor": 4.0}, out=str(cut))
    monkeypatch.setattr(P, "score_document", real)
    evaluate(sharp_model(), data, [256, 128], method="dynamic_ntk", params={"factor": 4.0}, out=str(cut), resume=True)

    def values(path):
        return sorted((r["length"], r["doc"], r["nll_sum"]) for r in map(json.loads, path.read_text().splitlines()))

    assert values(cut) == values(full)


# ---- resume: one longest length per results file ------------------------------------------------------
def test_same_targets_resume_with_a_longer_longest_length_is_refused(tmp_path):
    """The reviewer's scenario: same_targets at 64,128 then resumed at 64,128,256 kept the targets ending at token 128
    next to new ones ending at 256; the summary then compared different targets."""
    model = build_tiny_model("llama", seed=0)
    data = corpus(tmp_path, (600, 520))
    out = tmp_path / "st.jsonl"
    first = evaluate(model, data, [64, 128], out=str(out), score_mode="same_targets", stride=32)
    assert {r["longest_length"] for r in first} == {128}
    before = out.read_text()
    with pytest.raises(RopekitError, match="longest length of 128; this run's longest length is 256") as err:
        evaluate(model, data, [64, 128, 256], out=str(out), resume=True, score_mode="same_targets", stride=32)
    assert "\n" not in str(err.value) and "another --out" in str(err.value)
    assert out.read_text() == before  # nothing written
    # the same longest length resumes; the new length's targets end where the old ones do, as a fresh run's
    resumed = evaluate(model, data, [96, 128], out=str(out), resume=True, score_mode="same_targets", stride=32)
    fresh = evaluate(model, data, [64, 96, 128], score_mode="same_targets", stride=32)
    key = lambda r: (r["length"], r["doc"])  # noqa: E731
    assert sorted((key(r), r["nll_sum"]) for r in resumed) == sorted((key(r), r["nll_sum"]) for r in fresh)


def test_a_resume_that_would_change_the_document_set_is_refused(tmp_path):
    """The reviewer's scenario: 64,128 on documents of 600 and 200 tokens (both used), then resumed with 256 (only the
    first is long enough): the 64 and 128 rows kept both documents while 256 had one."""
    model = build_tiny_model("llama", seed=0)
    data = corpus(tmp_path, (600, 200))
    out = tmp_path / "ls.jsonl"
    first = evaluate(model, data, [64, 128], out=str(out))
    assert sorted({r["doc"] for r in first}) == [0, 1]
    before = out.read_text()
    for lengths in ([64, 128, 256], [64]):  # longer, or shorter: either chooses other documents in general
        with pytest.raises(RopekitError, match="whose documents were chosen for a longest length of 128") as err:
            evaluate(model, data, lengths, out=str(out), resume=True)
        assert "\n" not in str(err.value) and "--lengths whose longest is 128" in str(err.value)
        assert out.read_text() == before
    # another protocol, corpus or file is another set: not refused
    assert len(evaluate(model, data, [64, 256], out=str(out), resume=True, score_mode="truncate")) == 4 + 2
    other = corpus(tmp_path, (600, 200), name="other.jsonl")
    assert len(evaluate(model, other, [256], out=str(out), resume=True)) == 6 + 1
    assert len(evaluate(model, data, [64, 128, 256], out=str(tmp_path / "new.jsonl"))) == 3
