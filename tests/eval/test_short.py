"""`ropekit eval short`: lm-evaluation-harness on the evaluated model, checked against the same
multiple-choice scoring computed directly with the model; the built-in task, offline task files, records,
resume, the summary, the CLI, and the clear error when lm-eval is not installed."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from ropekit.errors import RopekitError
from ropekit.eval import short
from ropekit.eval.common import make_context
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model


def sharpened_tiny(window: int = 512):
    """A tiny Llama with a 512-token window (every prompt + choice fits: nothing is truncated on either side of
    the check) and scaled-up query/key projections, so that attention — and with it the scores — depends
    clearly on positions (random init attends almost uniformly)."""
    model = build_tiny_model("llama", window=window)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    return model


def tiny_context(tmp_path=None, *, method=None, params=None, resume=False):
    model = sharpened_tiny()
    return make_context("short", model, byte_tokenizer(), method=method, params=params, lengths=short.DEFAULT_LENGTHS,
                        key_fields=short.KEY_FIELDS, out=str(tmp_path / "short.jsonl") if tmp_path else None,
                        resume=resume)


# ---- without lm-eval ----------------------------------------------------------------------------------
def test_missing_lm_eval_is_one_clear_error(monkeypatch):
    for name in ("lm_eval", "lm_eval.models", "lm_eval.models.huggingface", "lm_eval.tasks"):
        monkeypatch.setitem(sys.modules, name, None)  # `import` of a None entry raises ImportError
    ctx = tiny_context()
    with pytest.raises(RopekitError) as err:
        short.run(ctx)
    assert str(err.value) == "the 'short' evaluation needs lm-evaluation-harness. pip install 'ropekit[lmeval]'."


def test_builtin_documents_are_sentence_halves_with_three_distractors():
    from ropekit.data.prose import prose_sentences

    docs = short.builtin_documents(0, 60)
    assert docs == short.builtin_documents(0, 60) and docs != short.builtin_documents(1, 60)
    sentences = set(prose_sentences())
    for doc in docs:
        choices, label = doc["choices"], doc["label"]
        assert len(choices) == 4 == len(set(choices)) and 0 <= label < 4
        assert f"{doc['context']} {choices[label]}" in sentences
        words = f"{doc['context']} {choices[label]}".split()
        assert len(doc["context"].split()) == len(words) // 2 and 10 <= len(words) <= 30
    labels = [d["label"] for d in docs]
    assert all(labels.count(k) >= 5 for k in range(4))  # the gold position is spread over the choices


def test_task_files_must_be_local(tmp_path):
    with pytest.raises(RopekitError, match="is not a directory"):
        short.check_local_tasks(tmp_path / "missing")
    with pytest.raises(RopekitError, match="no task files"):
        short.check_local_tasks(tmp_path)
    (tmp_path / "ok.yaml").write_text("task: ok\ndataset_path: json\ndataset_kwargs:\n  data_files: x.jsonl\n"
                                      "process_results: !function utils.process\n")
    (tmp_path / "group.yaml").write_text("group: g\ntask: [ok]\n")
    assert len(short.check_local_tasks(tmp_path)) == 2
    (tmp_path / "hub.yaml").write_text("task: hub\ndataset_path: allenai/ai2_arc\n")
    with pytest.raises(RopekitError, match="from the Hugging Face hub"):
        short.check_local_tasks(tmp_path)


def test_summary_aggregates_like_lm_eval():
    recs = [
        {"method": "plain", "subtask": "a", "score": 1.0, "metrics": {"acc": 1.0, "acc_norm": 0.0}},
        {"method": "plain", "subtask": "a", "score": 0.0, "metrics": {"acc": 0.0, "acc_norm": 0.0}},
        {"method": "plain", "subtask": "a", "score": 1.0, "metrics": {"acc": 1.0, "acc_norm": 1.0}},
        {"method": "plain", "subtask": "p", "score": None,
         "metrics": {"word_perplexity": [-10.0, 4], "bits_per_byte": [-10.0, 20]}},
        {"method": "plain", "subtask": "p", "score": None,
         "metrics": {"word_perplexity": [-6.0, 4], "bits_per_byte": [-6.0, 12]}},
    ]
    rows = {r["task"]: r for r in short.summarize(recs)}
    assert rows["a"]["accuracy"] == pytest.approx(2 / 3) and rows["a"]["acc_norm"] == pytest.approx(1 / 3)
    assert rows["a"]["n"] == 3 and "method" not in rows["a"]
    assert rows["p"]["accuracy"] is None
    assert rows["p"]["word_perplexity"] == pytest.approx(math.exp(16 / 8))
    assert rows["p"]["bits_per_byte"] == pytest.approx(16 / 32 / math.log(2))


# ---- with lm-eval -------------------------------------------------------------------------------------
def direct_loglikelihoods(model, tokenizer, context: str, choices: list[str]) -> list[float]:
    """Σ log p(" " + choice | context), computed with the model itself: the tokens of the choice are those
    of context + " " + choice after the context's own tokens (the harness's causal split)."""
    out = []
    ctx_ids = tokenizer(context, add_special_tokens=False).input_ids
    for choice in choices:
        whole = tokenizer(context + " " + choice, add_special_tokens=False).input_ids
        assert whole[: len(ctx_ids)] == ctx_ids and len(whole) <= model.config.max_position_embeddings
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([whole[:-1]])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        out.append(sum(float(logp[t - 1, whole[t]]) for t in range(len(ctx_ids), len(whole))))
    return out


def test_builtin_task_end_to_end_equals_direct_scoring_and_resumes(tmp_path):
    pytest.importorskip("lm_eval", exc_type=ImportError)
    n = 12
    ctx = tiny_context(tmp_path, method="yarn", params={"factor": "4"})
    short.run(ctx, samples=n)
    out = tmp_path / "short.jsonl"
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["subtask"], r["sample"], r["length"]) for r in records] == [(short.BUILTIN_TASK, i, 0) for i in range(n)]

    docs = short.builtin_documents(ctx.seed, short.BUILTIN_DOCS)[:n]
    correct = correct_norm = 0
    plain = sharpened_tiny()
    for doc, rec in zip(docs, records):
        lls = direct_loglikelihoods(ctx.model, ctx.tokenizer, doc["context"], doc["choices"])
        assert rec["loglikelihoods"] == pytest.approx(lls, abs=2e-3)
        best = max(range(4), key=lambda i: lls[i])
        best_norm = max(range(4), key=lambda i: lls[i] / len(doc["choices"][i]))
        assert rec["prediction"] == best and rec["target"] == doc["label"]
        assert rec["score"] == float(best == doc["label"]) == rec["metrics"]["acc"]
        assert rec["metrics"]["acc_norm"] == float(best_norm == doc["label"])
        correct += best == doc["label"]
        correct_norm += best_norm == doc["label"]
        # the method is inside the scored model: the plain model gives other numbers
        other = direct_loglikelihoods(plain, ctx.tokenizer, doc["context"], doc["choices"][:1])
        assert abs(other[0] - lls[0]) > 1e-2
    [row] = short.summarize(records)
    assert row["task"] == short.BUILTIN_TASK and row["n"] == n
    assert row["accuracy"] == pytest.approx(correct / n) and row["acc"] == pytest.approx(correct / n)
    assert row["acc_norm"] == pytest.approx(correct_norm / n)

    # resume: nothing is asked of lm-eval again; lost records are scored again, identically
    before = out.read_text()
    short.run(tiny_context(tmp_path, method="yarn", params={"factor": "4"}, resume=True), samples=n)
    assert out.read_text() == before
    out.write_text("".join(line + "\n" for line in before.splitlines()[:-2]))
    short.run(tiny_context(tmp_path, method="yarn", params={"factor": "4"}, resume=True), samples=n)
    redone = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["sample"] for r in redone] == list(range(n))
    for a, b in zip(redone[-2:], records[-2:]):
        assert a["loglikelihoods"] == pytest.approx(b["loglikelihoods"], abs=1e-5) and a["score"] == b["score"]


def test_bf16_model_scores_are_float32_log_softmax_of_its_logits():
    """With a bfloat16 model, lm-eval's log_softmax and the sum over an answer's tokens would be done in bfloat16
    (transformers 5 does not upcast logits): choice scores rounded by up to tenths of a nat. The records hold a
    float32 log_softmax of the same bfloat16 logits, computed here independently of lm-eval."""
    pytest.importorskip("lm_eval", exc_type=ImportError)
    n = 4
    model = sharpened_tiny().to(torch.bfloat16)
    ctx = make_context("short", model, byte_tokenizer(), method=None, params=None, lengths=short.DEFAULT_LENGTHS,
                       key_fields=short.KEY_FIELDS)
    short.run(ctx, samples=n)
    records = sorted(ctx.writer.records(), key=lambda r: r["sample"])
    docs = short.builtin_documents(ctx.seed, short.BUILTIN_DOCS)[:n]
    assert [r["sample"] for r in records] == list(range(n))
    worst_rounding = 0.0
    for doc, rec in zip(docs, records):
        exact = direct_loglikelihoods(model, ctx.tokenizer, doc["context"], doc["choices"])
        assert rec["loglikelihoods"] == pytest.approx(exact, rel=0, abs=1e-4)
        assert rec["prediction"] == max(range(4), key=lambda i: exact[i])
        # what bfloat16 arithmetic gives for the same logits: the check tells the two apart
        ctx_ids = ctx.tokenizer(doc["context"], add_special_tokens=False).input_ids
        for choice, value in zip(doc["choices"], exact):
            whole = ctx.tokenizer(doc["context"] + " " + choice, add_special_tokens=False).input_ids
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([whole[:-1]])).logits[0]
            assert logits.dtype == torch.bfloat16
            logp = torch.log_softmax(logits, dim=-1)[len(ctx_ids) - 1:]
            rounded = float(logp.gather(1, torch.tensor(whole[len(ctx_ids):]).unsqueeze(-1)).sum())
            worst_rounding = max(worst_rounding, abs(rounded - value))
    assert worst_rounding > 1e-2


def test_cli_runs_a_local_task_directory(run_cli, tmp_path):
    pytest.importorskip("lm_eval", exc_type=ImportError)
    data = tmp_path / "tasks"
    data.mkdir()
    pairs = ((1, 2), (3, 4), (5, 6))
    rows = [{"q": f"{a} plus {b} is", "options": [str(a + b), str(a + b + 1)], "gold": 0} for a, b in pairs]
    (data / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "sums.yaml").write_text(
        "task: sums\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data / 'sums.jsonl'}\n"
        "output_type: multiple_choice\ntest_split: test\ndoc_to_text: '{{q}}'\ndoc_to_choice: options\n"
        "doc_to_target: gold\nmetric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    code, out, err = run_cli("eval", "short", "tiny", "--data", str(data), "--tasks", "sums",
                             "--samples", "2", "--json")
    assert code == 0, err
    [row] = json.loads(out)
    assert row["task"] == "sums" and row["n"] == 2 and 0.0 <= row["accuracy"] <= 1.0
    code, _, err = run_cli("eval", "short", "tiny", "--data", str(data), "--tasks", "nope")
    assert code == 2 and "unknown lm-eval task nope" in err
    code, _, err = run_cli("eval", "short", "tiny", "--chat", "--samples", "1")
    assert code == 2 and "has no chat template" in err


def test_an_answer_longer_than_the_window_is_one_line_naming_it(run_cli, tmp_path):
    """The built-in cloze task's answers are whole half-sentences: in bytes, some exceed the tiny model's 64-token
    window, where lm-eval's HFLM stops on a bare assertion. Said as ropekit's one error line, no records written."""
    pytest.importorskip("lm_eval", exc_type=ImportError)
    out = tmp_path / "short.jsonl"
    code, stdout, err = run_cli("eval", "short", "tiny", "--samples", "1", "--out", str(out))
    assert code == 2 and stdout == ""
    # lm-eval's and datasets' progress bars preceded it on stderr: now the refusal is the only line
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "longer than the model's 64-token window" in lines[0], err
    assert not out.exists() or not out.read_text().strip()
