"""`ropekit eval manyshot`: prompts, demonstration draws, batched label likelihoods vs a naive loop, fit, data, end to end."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from ropekit.errors import RopekitError
from ropekit.eval import manyshot as ms
from ropekit.eval.common import make_context
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def model():
    return build_tiny_model("llama", seed=0).eval()


def naive_logprob(model, prompt_ids, cont) -> float:
    """Σ_j log p(cont[j] | prompt + cont[:j]) from one unbatched, unpadded forward of prompt + cont."""
    ids = torch.tensor([list(prompt_ids) + list(cont)])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    p = len(prompt_ids)
    return sum(float(logp[p - 1 + j, t]) for j, t in enumerate(cont))


# ---- prompt and demonstrations --------------------------------------------------------------------------
def test_prompt_layout():
    demos = [ms.Example("1", "Who wrote Hamlet?", "Human"), ms.Example("2", "Where is Rome?", "Location")]
    assert ms.build_prompt(demos, "How tall is Big Ben?") == (
        "Please determine the type of the question below. Here are some examples of questions.\n\n"
        "Question: Who wrote Hamlet?\nType: Human\n\n"
        "Question: Where is Rome?\nType: Location\n\n"
        "Question: How tall is Big Ben?\nType:")
    tok = byte_tokenizer()
    assert ms.continuation_ids(tok, "x\nType:", "Human") == list(b" Human")


def test_demonstration_draws_are_seeded_balanced_and_exclude_the_query():
    pool = [ms.Example(str(i), f"q{i}", "ABC"[i % 3]) for i in range(30)]
    query = pool[4]
    a = ms.draw_demos(pool, query, 8, seed=0, leave_one_out=True)
    assert a == ms.draw_demos(pool, query, 8, seed=0, leave_one_out=True)
    assert a != ms.draw_demos(pool, query, 8, seed=1, leave_one_out=True)
    assert query not in a and len(set(a)) == 8
    counts = Counter(e.label for e in a)
    assert max(counts.values()) - min(counts.values()) <= 1 and len(counts) == 3
    two = ms.draw_demos(pool, query, 2, seed=0)
    assert len({e.label for e in two}) == 2  # below the number of labels: distinct labels
    r = ms.draw_demos(pool, query, 8, seed=0, sampling="random", leave_one_out=True)
    assert len(set(r)) == 8 and query not in r
    with pytest.raises(ValueError):
        ms.draw_demos(pool, query, 30, seed=0, leave_one_out=True)


def test_synthetic_set_is_deterministic_disjoint_and_labelled():
    train, test = ms.synthetic_items()
    assert (train, test) == ms.synthetic_items()
    labels = Counter(e.label for e in test)
    assert labels == {y: 20 for y in ("Abbreviation", "Description", "Entity", "Human", "Location", "Numeric")}
    assert not {e.text for e in train} & {e.text for e in test}
    assert len({e.id for e in train + test}) == len(train) + len(test)
    assert min(Counter(e.label for e in train).values()) >= 40
    assert "synthetic" in ms.SYNTHETIC_SOURCE and "not TREC" in ms.SYNTHETIC_SOURCE


# ---- label likelihoods ----------------------------------------------------------------------------------
def test_batched_label_logprobs_equal_naive_per_label_sums(model, monkeypatch):
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(1, 256, (40,), generator=gen).tolist()
    conts = [[5], [6], [5, 7], [5, 7, 9], [8, 9], [5, 7, 9, 11, 13]]
    expected = [naive_logprob(model, prompt, c) for c in conts]
    rows_seen = []
    real = ms._forward_rows

    def spy(model_, prompt_ids, extensions, longest, pad_id):
        rows_seen.append(list(extensions))
        return real(model_, prompt_ids, extensions, longest, pad_id)

    monkeypatch.setattr(ms, "_forward_rows", spy)
    got = ms.label_logprobs(model, prompt, conts)
    assert got == pytest.approx(expected, abs=1e-4)
    # heads (), (5,), (5,7), (5,7,9), (8,), (5,7,9,11): only (5,7,9,11) and (8,) are not prefixes of another
    assert rows_seen == [[(5, 7, 9, 11), (8,)]]
    rows_seen.clear()
    assert ms.label_logprobs(model, prompt, conts, max_batch_tokens=1) == pytest.approx(expected, abs=1e-4)
    assert len(rows_seen) == 2  # one row per forward when the token budget is tiny
    rows_seen.clear()
    singles = [[1], [2], [3]]
    assert ms.label_logprobs(model, prompt, singles) == pytest.approx([naive_logprob(model, prompt, c) for c in singles], abs=1e-4)
    assert rows_seen == [[()]]  # single-token labels: one forward of the prompt alone


def test_ranking_by_sum_and_per_character_as_lm_eval():
    best, best_norm = ms.rank_labels({"A": -3.0, "Bbbbbb": -4.0, "C": -3.0})
    assert best == "A"  # tie with C goes to the first label
    assert best_norm == "Bbbbbb"  # -4/6 > -3/1
    # lm-eval's acc_norm: argmax(lls / [len(choice) for choice in choices]), the choice without its " " delimiter
    # (lm_eval/api/task.py). Counting the space as well would pick Human here: -5.5/6 > -8.6/9, but -5.5/5 < -8.6/8.
    lls = {"Human": -5.5, "Location": -8.6}
    assert ms.rank_labels(lls)[1] == max(lls, key=lambda c: lls[c] / len(c)) == "Location"


# ---- runs -----------------------------------------------------------------------------------------------
def test_end_to_end_on_synthetic_data_with_skips_and_resume(tmp_path, model):
    tok = byte_tokenizer()
    out = tmp_path / "ms.jsonl"
    ctx = make_context("manyshot", model, tok, method=None, params=None, lengths=[256, 512], key_fields=ms.KEY_FIELDS,
                       out=str(out))
    with pytest.warns(UserWarning, match="2, 64 shots do not fit in 256 tokens; 64 shots do not fit in 512 tokens"):
        ms.run(ctx, lengths=[256, 512], shots=[1, 2, 64], samples=3)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    plan = sorted({(r["length"], r["shots"]) for r in records})
    assert (256, 1) in plan and (512, 2) in plan and all(k != 64 for _, k in plan)
    assert len(records) == 3 * len(plan)
    train, test = ms.synthetic_items()
    by_id = {e.id: e for e in train + test}
    labels = sorted({e.label for e in train + test})
    longest_label = max(len((" " + y).encode()) for y in labels)
    queries = sorted({r["sample"] for r in records})
    for length in (256, 512):
        for k in (1, 2, 64):
            # independent fit check: redraw each query's demonstrations and measure prompt + longest label
            needed = max(len(ms.build_prompt(ms.draw_demos(train, by_id[q], k, seed=0), by_id[q].text).encode())
                         + longest_label for q in queries)
            assert ((length, k) in plan) == (needed <= length), (length, k, needed)
    for r in records:
        query = by_id[r["sample"]]
        demos = [by_id[i] for i in r["demo_ids"]]
        assert len(demos) == r["shots"] and all(d in train for d in demos)
        prompt = ms.build_prompt(demos, query.text)
        ids = list(prompt.encode())
        assert r["prompt_tokens"] == len(ids)
        assert r["label"] == query.label and r["score"] == float(r["prediction"] == query.label)
        assert r["data_source"] == ms.SYNTHETIC_SOURCE
    for r in records[:3]:
        ids = list(ms.build_prompt([by_id[i] for i in r["demo_ids"]], by_id[r["sample"]].text).encode())
        naive = {y: naive_logprob(model, ids, list((" " + y).encode())) for y in labels}
        assert r["logprobs"] == pytest.approx(naive, abs=1e-4)
        assert r["prediction"] == max(labels, key=lambda y: naive[y])
    rows = ms.summarize(records)
    assert [(r["length"], r["shots"]) for r in rows] == plan
    for row in rows:
        same = [r for r in records if (r["length"], r["shots"]) == (row["length"], row["shots"])]
        assert row["accuracy"] == pytest.approx(sum(r["score"] for r in same) / len(same))
        assert row["accuracy_norm"] == pytest.approx(sum(r["score_norm"] for r in same) / len(same))
    again = make_context("manyshot", model, tok, method=None, params=None, lengths=[256, 512], key_fields=ms.KEY_FIELDS,
                         out=str(out), resume=True)
    with pytest.warns(UserWarning):
        ms.run(again, lengths=[256, 512], shots=[1, 2, 64], samples=3)
    assert ms.summarize(list(again.writer.records())) == rows
    assert len(out.read_text().splitlines()) == len(records)


def test_user_data_formats_and_errors(tmp_path, model):
    tok = byte_tokenizer()
    lines = [{"text": f"item {i}", "label": "yes" if i % 2 else "no"} for i in range(6)]
    flat = tmp_path / "flat.jsonl"
    flat.write_text("".join(json.dumps(x) + "\n" for x in lines))
    pool, queries, loo, source = ms.load_data(flat)
    assert loo and pool == queries and [e.id for e in pool] == ["0", "1", "2", "3", "4", "5"] and source == str(flat)
    ctx = make_context("manyshot", model, tok, method=None, params=None, lengths=[256], key_fields=ms.KEY_FIELDS)
    with pytest.warns(UserWarning, match="8 shots exceed the 5 demonstrations"):
        ms.run(ctx, lengths=[256], shots=[2, 8], samples=2, data=str(flat), sampling="random")
    recs = list(ctx.writer.records())
    assert len(recs) == 2 and all(r["sample"] not in r["demo_ids"] for r in recs)
    assert set(recs[0]["logprobs"]) == {"no", "yes"}

    split = tmp_path / "split.jsonl"
    split.write_text("".join(json.dumps({**x, "split": "test" if i < 2 else "train"}) + "\n" for i, x in enumerate(lines)))
    pool, queries, loo, _ = ms.load_data(split)
    assert not loo and [e.id for e in queries] == ["test-0", "test-1"] and len(pool) == 4
    folder = tmp_path / "dir"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[2:]))
    (folder / "test.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[:2]))
    pool, queries, loo, _ = ms.load_data(folder)
    assert [e.text for e in queries] == ["item 0", "item 1"] and len(pool) == 4 and not loo

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n')
    with pytest.raises(RopekitError, match="line 1 lacks"):
        ms.load_data(bad)
    bad.write_text(json.dumps({**lines[0], "split": "train"}) + "\n" + json.dumps(lines[1]) + "\n")
    with pytest.raises(RopekitError, match="mixes lines"):
        ms.load_data(bad)
    with pytest.raises(RopekitError, match="does not exist"):
        ms.load_data(tmp_path / "nope.jsonl")
    with pytest.raises(RopekitError, match="lacks train.jsonl"):
        ms.load_data(tmp_path)
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"text": "a", "label": "x"}) + "\n" + json.dumps({"text": "b", "label": "x"}) + "\n")
    with pytest.raises(RopekitError, match="single label"):
        ms.run(ctx, lengths=[256], shots=[1], data=str(one))
    with pytest.raises(RopekitError, match="sampling"):
        ms.run(ctx, lengths=[256], shots=[1], sampling="stratified")
    with pytest.raises(RopekitError, match=r"--shots -1 is not a count"):
        ms.run(ctx, lengths=[256], shots=[-1, 1])
    zero = make_context("manyshot", model, tok, method=None, params=None, lengths=[256], key_fields=ms.KEY_FIELDS)
    ms.run(zero, lengths=[256], shots=[0], samples=2, data=str(flat))
    assert [r["demo_ids"] for r in zero.writer.records()] == [[], []]  # zero-shot: header and query only


def test_cli_manyshot_json(run_cli):
    code, out, err = run_cli("eval", "manyshot", "tiny", "--lengths", "512", "--shots", "1,2", "--samples", "2", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [(r["length"], r["shots"], r["n"]) for r in rows] == [(512, 1, 2), (512, 2, 2)]
