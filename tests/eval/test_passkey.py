"""`ropekit eval passkey`: prompt construction and length control, seeding, scoring, the task end to end,
resume, the heatmap and the CLI.

Three tokenizers: the byte tokenizer (1 token per byte, no BOS), the same with a BOS prepended, and a
small byte-level BPE trained here on the passkey text (multi-byte tokens and a BOS, like a real model's),
which makes room for filler in a ≤ 256-token prompt for the tiny model.
"""

from __future__ import annotations

import json
import re

import pytest
from eval_tokenizers import (  # tests/eval is on sys.path (rootdir-less test dir)
    bos_byte_tokenizer,
    trained_bpe,
)

from ropekit.errors import RopekitError
from ropekit.eval import passkey
from ropekit.eval.common import make_context
from ropekit.eval.plots import model_windows
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model

LANDMARK_TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
LANDMARK_GARBAGE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


# ---- tokenizers -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bpe():
    texts = [LANDMARK_TASK, "What is the pass key? The pass key is"] + [LANDMARK_GARBAGE] * 20
    texts += [f"The pass key is {k}. Remember it. {k} is the pass key." for k in range(0, 50000, 997)]
    return trained_bpe(texts, vocab_size=600)


@pytest.fixture(scope="module")
def bpe_model(bpe):
    return build_tiny_model("llama", vocab_size=len(bpe))


TOKENIZERS = {"byte": byte_tokenizer, "byte+bos": bos_byte_tokenizer}


# ---- prompt construction ----------------------------------------------------------------------------
def test_prompt_is_the_originals_five_lines():
    # Landmark/YaRN: "\n".join([task_description, garbage_prefix, information_line, garbage_suffix, final_question])
    want = "\n".join([  # noqa: FLY002 - the originals join five lines
        LANDMARK_TASK,
        "The grass is green. The sky is blue.",
        "The pass key is 4242. Remember it. 4242 is the pass key.",
        "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. The grass is green.",
        "What is the pass key? The pass key is",
    ])
    assert passkey.build_prompt(8, 2, 4242) == want
    assert passkey.build_prompt(0, 0, 7) == f"{LANDMARK_TASK}\n\nThe pass key is 7. Remember it. 7 is the pass key.\n\nWhat is the pass key? The pass key is"
    assert passkey.filler(5) == LANDMARK_GARBAGE


def _parts(prompt: str):
    lines = prompt.split("\n")
    assert len(lines) == 5 and lines[0] == LANDMARK_TASK and lines[4] == "What is the pass key? The pass key is"
    return lines[1], lines[2], lines[3]


GARBAGE_SENTENCES = re.split(r"(?<=\.) ", LANDMARK_GARBAGE)


def _sentences(filler_text: str) -> list[str]:
    return re.split(r"(?<=\.) ", filler_text) if filler_text else []


@pytest.mark.parametrize("tok_name", list(TOKENIZERS))
@pytest.mark.parametrize("length", [300, 517, 1000, 2048])
@pytest.mark.parametrize("depth", [None, 0.0, 0.25, 0.5, 0.9, 1.0])
def test_prompt_fits_the_length_within_one_sentence_and_places_the_key_at_the_depth(tok_name, length, depth):
    tok = TOKENIZERS[tok_name]()
    s = passkey.make_sample(tok, length, depth, trial=3, seed=11)
    ids = tok(s.prompt).input_ids
    n_bytes = len(s.prompt.encode())
    # the count is the tokenizer's own, BOS included when it adds one
    assert s.prompt_tokens == len(ids) == n_bytes + (1 if tok_name == "byte+bos" else 0)
    assert (ids[0] == 1) == (tok_name == "byte+bos")
    info = f"The pass key is {s.key}. Remember it. {s.key} is the pass key."
    assert s.prompt.count(info) == 1 and s.prompt.count("The pass key is") == 2  # the line, and the question
    assert 1 <= s.key <= 50000
    prefix, line, suffix = _parts(s.prompt)
    assert line == info
    cycle = " ".join([LANDMARK_GARBAGE] * 400)
    pre, suf = _sentences(prefix), _sentences(suffix)
    # both halves are whole sentences from the start of the garbage cycle
    assert cycle.startswith(prefix) and cycle.startswith(suffix)
    assert " ".join(pre) == prefix and " ".join(suf) == suffix
    n = len(pre) + len(suf)
    assert n == s.n_garbage and len(pre) == s.n_prefix
    # as long as possible: one more garbage sentence (the longest, plus its space) would not fit
    longest = max(len(x.encode()) for x in GARBAGE_SENTENCES)
    assert s.prompt_tokens <= length
    assert length - s.prompt_tokens < longest + 1
    if depth is not None:
        assert abs(len(pre) / n - depth) <= 1 / n  # at the requested depth, ± one sentence
        assert s.depth_actual == pytest.approx(len(pre) / n)


@pytest.mark.parametrize("length", [120, 200, 256])
def test_length_control_with_a_bpe_tokenizer(bpe, length):
    for depth in (None, 0.0, 0.5, 1.0):
        s = passkey.make_sample(bpe, length, depth, trial=0)
        ids = bpe(s.prompt).input_ids
        assert ids[0] == 1 and s.prompt_tokens == len(ids) <= length
        # one more sentence, wherever it goes, does not fit: rebuild both candidates independently
        prefix, _, suffix = _parts(s.prompt)
        key_line = f"The pass key is {s.key}. Remember it. {s.key} is the pass key."
        longer = []
        for grow_prefix in (True, False):
            p, q = _sentences(prefix), _sentences(suffix)
            target = p if grow_prefix else q
            target.append(GARBAGE_SENTENCES[len(target) % 5])
            text = "\n".join([LANDMARK_TASK, " ".join(p), key_line, " ".join(q), "What is the pass key? The pass key is"])
            longer.append(len(bpe(text).input_ids))
        assert min(longer) > length


def test_too_short_a_length_is_a_one_line_error():
    with pytest.raises(RopekitError, match="too short for the passkey prompt"):
        passkey.make_sample(byte_tokenizer(), 100, 0.5, 0)


def test_seeds_reproduce_prompts_byte_for_byte():
    tok = byte_tokenizer()
    a = [passkey.make_sample(tok, 700, d, t, seed=5) for d in (None, 0.5) for t in range(4)]
    b = [passkey.make_sample(tok, 700, d, t, seed=5) for d in (None, 0.5) for t in range(4)]
    assert [x.prompt.encode() for x in a] == [x.prompt.encode() for x in b]
    assert len({x.key for x in a}) == len(a)  # trials differ
    c = [passkey.make_sample(tok, 700, d, t, seed=6) for d in (None, 0.5) for t in range(4)]
    assert [x.key for x in c] != [x.key for x in a]


def test_random_depth_is_spread_over_the_filler():
    tok = byte_tokenizer()
    depths = [passkey.make_sample(tok, 600, None, t).depth_actual for t in range(120)]
    n = passkey.make_sample(tok, 600, None, 0).n_garbage
    assert min(depths) == 0.0 and max(depths) == 1.0
    # uniform over n + 1 boundaries: the mean is near 1/2 (std of the mean ≈ 0.29/√120 ≈ 0.026)
    assert abs(sum(depths) / len(depths) - 0.5) < 0.1
    assert len({round(d * n) for d in depths}) > n // 2


def test_largest_fitting_matches_a_linear_scan():
    import random

    rng = random.Random(3)
    for _ in range(300):
        steps = [rng.randint(0, 4) for _ in range(60)]
        values = [sum(steps[: i + 1]) for i in range(60)]
        limit = rng.randint(-2, values[-1] + 5)
        count = lambda n, values=values: values[min(n, 59)] + (10**9 if n >= 60 else 0)
        want = max((n for n in range(60) if values[n] <= limit), default=None)
        assert passkey.largest_fitting(count, limit, rng.randint(0, 80)) == want


# ---- scoring ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("response, key, want", [
    (" 31337. Remember it.", 31337, 1.0),
    ("31337", 31337, 1.0),
    (" 031337", 31337, 1.0),          # int("031337") as the originals parse it
    (" 3133. 31337", 31337, 0.0),     # the first integer decides
    (" is 31 337", 31337, 0.0),
    ("the key", 31337, 0.0),          # no digits: wrong
    ("", 5, 0.0),
    ("key: -5", 5, 1.0),              # digits only; a sign is not part of the run
    ("313370", 31337, 0.0),
])
def test_score_is_first_integer_equals_key(response, key, want):
    assert passkey.score_response(response, key) == want


# ---- the task -----------------------------------------------------------------------------------------
def _run(model, tok, *, out=None, resume=False, method=None, params=None, **options):
    lengths = options.pop("lengths", [120, 200])
    ctx = make_context("passkey", model, tok, method=method, params=params, lengths=lengths,
                       key_fields=passkey.KEY_FIELDS, seed=0, out=out, resume=resume)
    passkey.run(ctx, lengths=lengths, **options)
    return ctx, list(ctx.writer.records())


def test_task_on_a_tiny_model_records_and_summary(bpe, bpe_model):
    _, records = _run(bpe_model, bpe, depths=[0.0, 0.5, 1.0], trials=2)
    assert len(records) == 2 * 3 * 2
    assert {(r["length"], r["depth"], r["trial"]) for r in records} == {
        (L, d, t) for L in (120, 200) for d in (0.0, 0.5, 1.0) for t in (0, 1)}
    for r in records:
        assert r["task"] == "passkey" and r["method"] == "plain" and r["params"] == {}
        assert r["prompt_tokens"] <= r["length"] and r["seconds"] >= 0
        m = re.search(r"\d+", r["prediction"])
        assert r["answer"] == (int(m.group()) if m else None)
        assert r["score"] == (1.0 if r["answer"] == r["passkey"] else 0.0)
        assert abs(r["depth_actual"] - r["depth"]) <= 1 / r["garbage_sentences"]
    rows = passkey.summarize(records)
    assert [(r["length"], r["depth"]) for r in rows] == [
        (120, 0.0), (120, 0.5), (120, 1.0), (120, "all"), (200, 0.0), (200, 0.5), (200, 1.0), (200, "all")]
    for row in rows:
        mine = [r["score"] for r in records if r["length"] == row["length"] and row["depth"] in ("all", r["depth"])]
        assert row["n"] == len(mine) and row["accuracy"] == pytest.approx(sum(mine) / len(mine))


def test_random_depth_summary_is_per_length(bpe, bpe_model):
    _, records = _run(bpe_model, bpe, trials=3)
    assert len(records) == 6 and all(r["depth"] is None for r in records)
    rows = passkey.summarize(records)
    assert [set(r) for r in rows] == [{"length", "accuracy", "n"}] * 2 and [r["n"] for r in rows] == [3, 3]


def _oracle(tok, answer_of):
    """A stand-in for greedy generation that reads the key from the prompt and answers ``answer_of(key)``."""

    def generate(model, ids, max_new_tokens, *, eos_token_ids=None):
        key = int(re.search(r"The pass key is (\d+)\. Remember it\.", tok.decode(ids)).group(1))
        return tok(answer_of(key), add_special_tokens=False).input_ids[:max_new_tokens]

    return generate


@pytest.mark.parametrize("answer_of, want", [
    (lambda k: f" {k}. Remember it.", 1.0),
    (lambda k: f" {k + 1}. Remember it.", 0.0),
    (lambda k: f" 1 and {k}", 0.0),
    (lambda k: " unknown", 0.0),
])
def test_scoring_is_honest_end_to_end(monkeypatch, bpe, bpe_model, answer_of, want):
    monkeypatch.setattr(passkey, "greedy_generate", _oracle(bpe, answer_of))
    _, records = _run(bpe_model, bpe, depths=[0.0, 1.0], trials=2)
    assert len(records) == 8 and all(r["score"] == want for r in records)
    assert all(row["accuracy"] == want for row in passkey.summarize(records))


def test_resume_gives_the_same_records_without_duplicates(tmp_path, bpe, bpe_model):
    out = tmp_path / "pk.jsonl"
    _, first = _run(bpe_model, bpe, out=str(out), depths=[0.5], trials=3)
    lines = out.read_text().splitlines()
    assert len(lines) == 6
    out.write_text("\n".join(lines[:2]) + "\n")  # as if the run had stopped after two samples
    _, second = _run(bpe_model, bpe, out=str(out), resume=True, depths=[0.5], trials=3)
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(again) == 6
    keys = [(r["length"], r["depth"], r["trial"]) for r in again]
    assert len(set(keys)) == 6
    strip = lambda rs: sorted(json.dumps({k: v for k, v in r.items() if k != "seconds"}, sort_keys=True) for r in rs)
    assert strip(again) == strip(first) == strip(second)
    _run(bpe_model, bpe, out=str(out), resume=True, depths=[0.5], trials=3)  # everything done: nothing added
    assert len(out.read_text().splitlines()) == 6


def test_bad_options_are_one_line_errors(bpe, bpe_model):
    with pytest.raises(RopekitError, match="not a fraction"):
        _run(bpe_model, bpe, depths=[1.5])
    with pytest.raises(RopekitError, match="--trials"):
        _run(bpe_model, bpe, trials=0)
    with pytest.raises(RopekitError, match="not a .png"):
        _run(bpe_model, bpe, plot="x.pdf")
    with pytest.raises(RopekitError, match="too short"):
        _run(bpe_model, bpe, lengths=[20])


def test_plot_writes_a_png_with_the_windows(tmp_path, bpe, bpe_model):
    path = tmp_path / "pk.png"
    ctx, records = _run(bpe_model, bpe, method="yarn", depths=[0.0, 1.0], trials=1, plot=str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert records[0]["method"] == "yarn"
    # the lines the run drew: the tiny model's 64-token window and YaRN sized to the longest length
    assert model_windows(ctx.model) == {"pretrained": 64, "trained": 200}
    layout = passkey.plot(records, str(tmp_path / "again.png"), windows={"pretrained": 64, "trained": 200})
    assert layout.rows == [0.0, 1.0] and layout.columns == [120, 200]
    assert layout.window_x == {"pretrained": 0.0, "trained": 2.0}


def test_random_depth_heatmap_bins_the_realised_depth():
    recs = [{"length": 100, "depth": None, "depth_actual": d, "score": s}
            for d, s in [(0.0, 1.0), (0.19, 0.0), (0.2, 1.0), (0.5, 1.0), (0.99, 0.0), (1.0, 1.0)]]
    assert passkey.plot_grid(recs) == {(0.1, 100): 0.5, (0.3, 100): 1.0, (0.5, 100): 1.0, (0.9, 100): 0.5}


def test_cli_json_end_to_end(tmp_path, run_cli, bpe, bpe_model):
    model_dir = tmp_path / "tiny-bpe"
    bpe_model.save_pretrained(model_dir)
    bpe.save_pretrained(model_dir)
    out = tmp_path / "cli.jsonl"
    code, stdout, err = run_cli("eval", "passkey", str(model_dir), "--lengths", "128,192", "--depths", "0,1", "--trials", "2",
                                "--out", str(out), "--json")
    assert code == 0, err
    rows = json.loads(stdout)
    assert [(r["length"], r["depth"], r["n"]) for r in rows] == [
        (128, 0.0, 2), (128, 1.0, 2), (128, "all", 4), (192, 0.0, 2), (192, 1.0, 2), (192, "all", 4)]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 8 and all(0.0 <= r["score"] <= 1.0 for r in records)
    # a flag the task does not take is refused with exit code 2
    code, _, err = run_cli("eval", "passkey", str(model_dir), "--lengths", "128", "--stride", "4")
    assert code == 2 and "--stride" in err
