"""`ropekit eval short` on few-shot tasks: every document gets the demonstrations that one uninterrupted
lm-evaluation-harness run with the same seed gives it, however ropekit splits the documents into calls
(:data:`ropekit.eval.short.CALL_DOCS`) and whatever a resume left to score.

The reference is lm-eval itself, run directly (``lm_eval.simple_evaluate`` over all documents at once,
``fewshot_random_seed`` = the run's seed, its own ``HFLM`` around the same model): lm-eval logs each document's
``prompt_hash`` (the hash of the context it built, demonstrations included) and its choices' log-likelihoods."""

from __future__ import annotations

import json

import pytest
import torch

from ropekit.eval import short
from ropekit.eval.common import make_context
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model

N_DOCS = 8


def write_tasks(root):
    """Two local 2-shot multiple-choice tasks: ``sums_train`` draws its demonstrations from a training split,
    ``sums_self`` from its own test split (lm-eval then leaves the evaluated document out of them)."""
    rows = [{"q": f"{a} plus {b} is", "options": [str(a + b), str(a + b + 1)], "gold": (a + b) % 2}
            for a in range(1, 6) for b in range(1, 5)]
    train, test = rows[:12], rows[12:12 + N_DOCS]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test))
    common = (
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    train: {root / 'train.jsonl'}\n    test: {root / 'test.jsonl'}\n"
        f"  cache_dir: {root / 'cache'}\n"
        "output_type: multiple_choice\ntest_split: test\nnum_fewshot: 2\n"
        "doc_to_text: '{{q}}'\ndoc_to_choice: options\ndoc_to_target: gold\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    (root / "sums_train.yaml").write_text("task: sums_train\ntraining_split: train\n" + common)
    (root / "sums_self.yaml").write_text("task: sums_self\nfewshot_split: test\n" + common)
    return test


def reference_run(model, root, names, seed):
    """One uninterrupted lm-eval run over every document: {task: {doc_id: logged sample}}."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=model, tokenizer=byte_tokenizer(), batch_size=1, device="cpu", softmax_dtype=torch.float32)
    manager = TaskManager(include_path=[str(root)], include_defaults=False)
    result = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=manager, log_samples=True, bootstrap_iters=0,
                                     fewshot_random_seed=seed)
    return {name: {int(s["doc_id"]): s for s in result["samples"][name]} for name in names}


def ropekit_run(model, root, names, out, *, resume=False):
    ctx = make_context("short", model, byte_tokenizer(), method=None, params=None, lengths=short.DEFAULT_LENGTHS,
                       key_fields=short.KEY_FIELDS, out=str(out), resume=resume)
    short.run(ctx, data=str(root), tasks=names)
    return ctx


def by_task(path):
    recs: dict[str, dict[int, dict]] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        assert r["sample"] not in recs.get(r["subtask"], {})
        recs.setdefault(r["subtask"], {})[r["sample"]] = r
    return recs


def assert_same_as_reference(recs, reference):
    for name, logged in reference.items():
        assert sorted(recs[name]) == sorted(logged) == list(range(N_DOCS))
        for d, sample in logged.items():
            rec = recs[name][d]
            assert rec["prompt_hash"] == sample["prompt_hash"], (name, d)  # the same demonstrations, in order
            assert rec["doc_hash"] == sample["doc_hash"]
            expected = [float(r[0]) for r in sample["filtered_resps"]]
            assert rec["loglikelihoods"] == pytest.approx(expected, abs=1e-5)
            assert rec["shots"] == 2


def test_fewshot_prompts_equal_one_uninterrupted_lm_eval_run_across_calls_and_resume(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval", exc_type=ImportError)
    root = tmp_path / "tasks"
    root.mkdir()
    test_docs = write_tasks(root)
    names = ["sums_self", "sums_train"]
    model = build_tiny_model("llama", window=512)
    seed = 0

    reference = reference_run(model, root, names, seed)
    # the check means something: the demonstrations vary from document to document, so a sampler restarted at
    # document 3 (calls of 3) or at a resumed document would give other prompts
    for name in names:
        demos = [reference[name][d]["arguments"][0][0][: -len(test_docs[d]["q"])] for d in range(N_DOCS)]
        assert all(demo.count("\n\n") == 2 for demo in demos)  # two demonstrations, then the question
        assert demos[0:3] != demos[3:6]

    # split into calls of 3 documents
    monkeypatch.setattr(short, "CALL_DOCS", 3)
    out = tmp_path / "short.jsonl"
    ctx = ropekit_run(model, root, names, out)
    assert ctx.seed == seed
    assert_same_as_reference(by_task(out), reference)

    # interrupted: records lost in the middle and at the end of each task; resumed with calls of 2 documents
    lost = {("sums_self", 1), ("sums_self", 4), ("sums_self", 5), ("sums_train", 3), ("sums_train", 7)}
    kept = [line for line in out.read_text().splitlines()
            if (json.loads(line)["subtask"], json.loads(line)["sample"]) not in lost]
    out.write_text("".join(line + "\n" for line in kept))
    monkeypatch.setattr(short, "CALL_DOCS", 2)
    ropekit_run(model, root, names, out, resume=True)
    assert_same_as_reference(by_task(out), reference)

    # a fresh run in one call gives them too
    monkeypatch.setattr(short, "CALL_DOCS", 100)
    single = tmp_path / "single.jsonl"
    ropekit_run(model, root, names, single)
    assert_same_as_reference(by_task(single), reference)
