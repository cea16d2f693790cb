"""`ropekit eval niah`: recall scoring, haystack and needle placement, length control, trials, chat
template, the task end to end, resume, the heatmap (plots.py) and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from eval_tokenizers import (  # tests/eval is on sys.path (rootdir-less test dir)
    bos_byte_tokenizer,
    trained_bpe,
)

from ropekit.data.prose import PROSE_SOURCE, prose_paragraphs, prose_sentences
from ropekit.errors import RopekitError
from ropekit.eval import niah
from ropekit.eval.common import make_context
from ropekit.eval.plots import grid_from, heatmap, model_windows, window_position
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model
from ropekit.install import extend

GKAMRADT_NEEDLE = "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
HEAD = "This is a very long story book: <book> "
TAIL = " </book>.\n Based on the content of the book, Question: What is the best thing to do in San Francisco?\nAnswer:"
PNG = b"\x89PNG\r\n\x1a\n"


# ---- tokenizers -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bpe():
    # the template and needle repeated so that BPE learns them: ~65 tokens, leaving room for haystack in 256
    return trained_bpe(list(prose_paragraphs()[:1500]) + [HEAD + TAIL, GKAMRADT_NEEDLE] * 100)


@pytest.fixture(scope="module")
def bpe_model(bpe):
    return build_tiny_model("llama", vocab_size=len(bpe))


@pytest.fixture(scope="module")
def hay_byte():
    return niah.Haystack(byte_tokenizer())


@pytest.fixture(scope="module")
def hay_bos():
    return niah.Haystack(bos_byte_tokenizer())


# ---- scoring ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("response, want_recall, want_exact, want_lceg", [
    # a perfect answer: 11 distinct words of 11 here; LCEG divides by 12 words ("a" twice) → 11/12
    ("eat a sandwich and sit in dolores park on a sunny day.", 1.0, 1.0, 11 / 12),
    # case and punctuation do not matter here; in LCEG's split "Park," ≠ "park" and "day!" ≠ "day."
    ("Eat a sandwich, and sit in Dolores Park, on a SUNNY day!", 1.0, 1.0, 8 / 12),
    (" The best thing is to eat a sandwich and sit in Dolores Park on a sunny day. It is", 1.0, 1.0, 11 / 12),
    ("Dolores Park.", 2 / 11, 0.0, 1 / 12),
    ("dolores park", 2 / 11, 0.0, 2 / 12),
    ("Eat a sandwich", 3 / 11, 0.0, 3 / 12),
    ("Go to the beach", 0.0, 0.0, 0.0),
    ("", 0.0, 0.0, 0.0),
    ("a a a a", 1 / 11, 0.0, 1 / 12),   # repeated words count once
])
def test_recall_exact_and_lceg_score(response, want_recall, want_exact, want_lceg):
    assert niah.recall(response) == pytest.approx(want_recall)
    assert niah.exact(response) == want_exact
    assert niah.lceg_recall(response) == pytest.approx(want_lceg)


def test_default_depths_are_eleven_in_steps_of_ten():
    assert list(niah.DEFAULT_DEPTHS) == [float(x) / 100 for x in np.round(np.linspace(0, 100, 11))]


def test_needle_and_question_strings():
    assert niah.NEEDLE == GKAMRADT_NEEDLE
    assert niah.QUESTION == "What is the best thing to do in San Francisco?"
    assert not any("San Francisco" in s or "Dolores" in s for s in prose_sentences())


# ---- prompt construction ----------------------------------------------------------------------------
def _expected_sentences(start: int, m: int) -> list[str]:
    sentences = prose_sentences()
    return [sentences[(start + i) % len(sentences)] for i in range(m)]


@pytest.mark.parametrize("tok_name", ["byte", "byte+bos"])
@pytest.mark.parametrize("length", [400, 700, 1500])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("trial", [0, 2])
def test_prompt_holds_the_needle_once_at_the_depth_and_fits(hay_byte, hay_bos, tok_name, length, depth, trial):
    hay = hay_byte if tok_name == "byte" else hay_bos
    s = niah.make_sample(hay, length, depth, trial, seed=4)
    assert s.prompt.startswith(HEAD) and s.prompt.endswith(TAIL)
    context = s.prompt[len(HEAD):-len(TAIL)]
    assert context.count(GKAMRADT_NEEDLE) == 1
    before, after = context.split(GKAMRADT_NEEDLE)
    # the haystack is consecutive prose sentences from the trial's start, cut into whole sentences
    expected = _expected_sentences(s.start, s.n_sentences)
    j = s.n_before
    assert before == " ".join(expected[:j]) and after == " ".join(expected[j:])
    # token count: BOS included when the tokenizer adds one; answer budget of 50 kept free
    bos = 1 if tok_name == "byte+bos" else 0
    assert s.prompt_tokens == len(s.prompt.encode()) + bos <= length - 50
    # as long as possible: the next sentence (with its space) would not fit
    nxt = _expected_sentences(s.start, s.n_sentences + 1)[-1]
    assert s.prompt_tokens + len((" " + nxt).encode()) > length - 50
    # the needle sits at the last sentence boundary at or before depth × haystack tokens (bytes here)
    sizes = [len((" " + x).encode()) for x in expected]
    offsets = np.cumsum([0] + sizes)
    total = offsets[-1]
    assert offsets[j] <= depth * total + 1e-9
    if j < len(expected):
        assert offsets[j + 1] > depth * total
    assert s.depth_actual == pytest.approx(offsets[j] / total if total else 0.0)
    if depth == 1.0:
        assert context.endswith(GKAMRADT_NEEDLE)
    if depth == 0.0:
        assert context.startswith(GKAMRADT_NEEDLE)


def test_length_control_with_a_bpe_tokenizer(bpe):
    hay = niah.Haystack(bpe)
    for length in (200, 256, 1000):
        for depth in (0.0, 0.5, 1.0):
            s = niah.make_sample(hay, length, depth, 0)
            ids = bpe(s.prompt).input_ids
            assert ids[0] == 1 and s.prompt_tokens == len(ids) <= length - 50
            # one more sentence does not fit: rebuild that prompt independently
            expected = _expected_sentences(0, s.n_sentences + 1)
            sizes = [len(bpe(" " + x, add_special_tokens=False).input_ids) for x in expected]
            j = max(k for k in range(len(expected) + 1) if sum(sizes[:k]) <= depth * sum(sizes) + 1e-9)
            context = " ".join(expected[:j]) + GKAMRADT_NEEDLE + " ".join(expected[j:])
            assert len(bpe(HEAD + context + TAIL).input_ids) > length - 50


def test_trials_move_the_haystack_start_by_seed(hay_byte):
    starts = {(L, d, t): niah.make_sample(hay_byte, L, d, t, seed=9).start for L in (500, 900) for d in (0.0, 0.7) for t in range(4)}
    for t in range(4):  # the same haystack for every length and depth of a trial
        assert len({v for (L, d, tt), v in starts.items() if tt == t}) == 1
    per_trial = [starts[(500, 0.0, t)] for t in range(4)]
    assert per_trial[0] == 0 and len(set(per_trial)) == 4
    again = [niah.make_sample(hay_byte, 500, 0.0, t, seed=9).prompt.encode() for t in range(4)]
    assert again == [niah.make_sample(hay_byte, 500, 0.0, t, seed=9).prompt.encode() for t in range(4)]
    assert [niah.make_sample(hay_byte, 500, 0.0, t, seed=10).start for t in range(1, 4)] != per_trial[1:]


def test_too_short_a_length_is_a_one_line_error(hay_byte):
    with pytest.raises(RopekitError, match="too short for the needle prompt"):
        niah.make_sample(hay_byte, 200, 0.5, 0)


def test_chat_template_is_used_only_when_asked(monkeypatch, bpe_model):
    tok = byte_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<|user|>{{ m['content'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    hay = niah.Haystack(tok)
    plain = niah.make_sample(hay, 600, 0.5, 0)
    templated = niah.make_sample(hay, 600, 0.5, 0, chat=True)
    assert plain.prompt.startswith(HEAD) and plain.add_special_tokens
    assert templated.prompt.startswith("<|user|>" + HEAD) and templated.prompt.endswith(TAIL + "<|end|><|assistant|>")
    assert not templated.add_special_tokens and templated.prompt_tokens == len(templated.prompt.encode()) <= 550
    ctx = make_context("niah", bpe_model, byte_tokenizer(), method=None, params=None, lengths=[300],
                       key_fields=niah.KEY_FIELDS)
    with pytest.raises(RopekitError, match="no chat template"):
        niah.run(ctx, lengths=[300], chat=True)
    # a template and no choice: the plain prompt, with a warning; chat=True: the template
    monkeypatch.setattr(niah, "greedy_generate", _oracle(tok, " eat a sandwich"))
    for chat, warns in ((None, True), (False, False), (True, False)):
        ctx = make_context("niah", bpe_model, tok, method=None, params=None, lengths=[600], key_fields=niah.KEY_FIELDS)
        with pytest.warns(UserWarning, match="pass --chat") if warns else _no_warning():
            niah.run(ctx, lengths=[600], depths=[0.5], chat=chat)
        (record,) = ctx.writer.records()
        assert record["chat"] is bool(chat) and record["score"] == pytest.approx(3 / 11)
        assert record["prompt_tokens"] == (templated if chat else plain).prompt_tokens


def _no_warning():
    import warnings
    from contextlib import contextmanager

    @contextmanager
    def check():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            yield

    return check()


# ---- the task -----------------------------------------------------------------------------------------
def _run(model, tok, *, out=None, resume=False, method=None, params=None, **options):
    lengths = options.pop("lengths", [200, 256])
    ctx = make_context("niah", model, tok, method=method, params=params, lengths=lengths,
                       key_fields=niah.KEY_FIELDS, seed=0, out=out, resume=resume)
    niah.run(ctx, lengths=lengths, **options)
    return ctx, list(ctx.writer.records())


def _recall(response: str) -> float:
    import re

    got = set(re.findall(r"[a-z0-9']+", response.lower()))
    want = {"eat", "a", "sandwich", "and", "sit", "in", "dolores", "park", "on", "sunny", "day"}
    return len(got & want) / len(want)


def test_task_on_a_tiny_model_records_and_summary(bpe, bpe_model):
    _, records = _run(bpe_model, bpe, depths=[0.0, 0.5, 1.0])
    assert len(records) == 6
    assert {(r["length"], r["depth"], r["trial"]) for r in records} == {(L, d, 0) for L in (200, 256) for d in (0.0, 0.5, 1.0)}
    for r in records:
        assert r["task"] == "niah" and r["haystack"] == PROSE_SOURCE and r["chat"] is False
        assert r["prompt_tokens"] <= r["length"] - 50 and r["seconds"] >= 0
        assert r["score"] == pytest.approx(_recall(r["prediction"]))
        assert r["exact"] == (1.0 if r["score"] == 1.0 else 0.0)
    rows = niah.summarize(records)
    assert [(r["length"], r["depth"], r["n"]) for r in rows] == [
        (200, 0.0, 1), (200, 0.5, 1), (200, 1.0, 1), (200, "all", 3), (256, 0.0, 1), (256, 0.5, 1), (256, 1.0, 1), (256, "all", 3)]
    for row in rows:
        mine = [r for r in records if r["length"] == row["length"] and row["depth"] in ("all", r["depth"])]
        assert row["accuracy"] == pytest.approx(sum(r["score"] for r in mine) / len(mine))
        assert row["exact"] == pytest.approx(sum(r["exact"] for r in mine) / len(mine))


def _oracle(tok, answer: str):
    """A stand-in for greedy generation: ``answer`` when the needle is in the prompt, else nothing."""

    def generate(model, ids, max_new_tokens, *, eos_token_ids=None):
        if GKAMRADT_NEEDLE.strip() not in tok.decode(ids):
            return []
        return tok(answer, add_special_tokens=False).input_ids[:max_new_tokens]

    return generate


@pytest.mark.parametrize("answer, score, exact, lceg", [
    (" The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.", 1.0, 1.0, 11 / 12),
    (" Sit in Dolores Park.", 4 / 11, 0.0, 3 / 12),   # LCEG: "park." matches, "sit" matches, "Sit" lower-cased
    (" Visit the Golden Gate Bridge.", 0.0, 0.0, 0.0),
])
def test_scoring_is_honest_end_to_end(monkeypatch, bpe, bpe_model, answer, score, exact, lceg):
    monkeypatch.setattr(niah, "greedy_generate", _oracle(bpe, answer))
    _, records = _run(bpe_model, bpe, depths=[0.0, 1.0])
    assert len(records) == 4
    for r in records:
        assert r["score"] == pytest.approx(score) and r["exact"] == exact and r["recall_lceg"] == pytest.approx(lceg)
    assert all(row["accuracy"] == pytest.approx(score) for row in niah.summarize(records))


def test_resume_gives_the_same_records_without_duplicates(tmp_path, bpe, bpe_model):
    out = tmp_path / "niah.jsonl"
    _, first = _run(bpe_model, bpe, out=str(out), depths=[0.2, 0.8], lengths=[200], trials=2)
    lines = out.read_text().splitlines()
    assert len(lines) == 4
    out.write_text(lines[0] + "\n")
    _run(bpe_model, bpe, out=str(out), resume=True, depths=[0.2, 0.8], lengths=[200], trials=2)
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(again) == 4 and len({(r["length"], r["depth"], r["trial"]) for r in again}) == 4
    strip = lambda rs: sorted(json.dumps({k: v for k, v in r.items() if k != "seconds"}, sort_keys=True) for r in rs)
    assert strip(again) == strip(first)


def test_plot_from_the_task_uses_the_model_windows(tmp_path, monkeypatch, bpe, bpe_model):
    seen = {}
    real = heatmap

    def spy(grid, path, title="", **kw):
        seen.update(kw, grid=list(grid))
        return real(grid, path, title, **kw)

    from ropekit.eval import plots

    monkeypatch.setattr(plots, "heatmap", spy)
    monkeypatch.setattr(niah, "greedy_generate", _oracle(bpe, " eat a sandwich"))  # generation is not under test here
    path = tmp_path / "niah.png"
    _, records = _run(bpe_model, bpe, method="yarn", depths=[0.0, 1.0], plot=str(path))
    assert path.read_bytes()[:8] == PNG
    assert seen["windows"] == {"pretrained": 64, "trained": 256}
    assert len(seen["grid"]) == 4
    layout = niah.plot(records, str(tmp_path / "again.png"))  # the registry's plot(records, path)
    assert layout.rows == [0.0, 1.0] and layout.columns == [200, 256] and layout.window_x == {}


# ---- plots.py ---------------------------------------------------------------------------------------
def test_window_position_is_the_boundary_after_the_last_column_inside():
    cols = [64, 128, 256, 512]
    assert window_position(cols, 64) == 1.0
    assert window_position(cols, 100) == 1.0
    assert window_position(cols, 256) == 3.0
    assert window_position(cols, 32) == 0.0
    assert window_position(cols, 4096) == 4.0
    assert window_position(cols, None) is None


def test_heatmap_averages_cells_and_draws_the_windows(tmp_path):
    records = [
        {"depth": 0.0, "length": 128, "score": 1.0}, {"depth": 0.0, "length": 128, "score": 0.0},
        {"depth": 0.0, "length": 64, "score": 0.25}, {"depth": 0.5, "length": 256, "score": 0.75},
        {"depth": "all", "length": 64, "score": 0.3},  # an aggregate row: not a cell
    ]
    path = tmp_path / "sub" / "h.png"
    layout = heatmap(records, path, "t", windows={"pretrained": 64, "trained": 256, "other": None})
    assert path.read_bytes()[:8] == PNG
    assert layout.rows == [0.0, 0.5] and layout.columns == [64, 128, 256]
    assert layout.values == [[0.25, 0.5, None], [None, None, 0.75]]
    assert layout.window_x == {"pretrained": 1.0, "trained": 3.0, "other": None}
    # the same grid as a mapping, and summary rows by their accuracy
    again = heatmap({(0.0, 64): 0.25, (0.0, 128): 0.5, (0.5, 256): 0.75}, tmp_path / "m.png")
    assert again.values == layout.values
    rows = [{"length": 64, "depth": 0.0, "accuracy": 0.25}, {"length": 64, "depth": "all", "accuracy": 0.25}]
    assert grid_from(rows, value="accuracy") == {(0.0, 64): 0.25}


def test_heatmap_errors(tmp_path):
    with pytest.raises(RopekitError, match="not a .png"):
        heatmap({(0.0, 64): 0.5}, tmp_path / "h.pdf")
    with pytest.raises(RopekitError, match="outside"):
        heatmap({(0.0, 64): 1.5}, tmp_path / "h.png")
    with pytest.raises(RopekitError, match="nothing to plot"):
        heatmap([{"depth": None, "length": 64, "score": 1.0}], tmp_path / "h.png")


def test_model_windows_plain_and_extended():
    model = build_tiny_model("llama")
    assert model_windows(model) == {"pretrained": 64}
    assert model_windows(extend(build_tiny_model("llama"), "yarn", factor=4)) == {"pretrained": 64, "trained": 256}


def test_cli_json_end_to_end_with_plot(tmp_path, run_cli, bpe, bpe_model):
    model_dir = tmp_path / "tiny-bpe"
    bpe_model.save_pretrained(model_dir)
    bpe.save_pretrained(model_dir)
    out, png = tmp_path / "cli.jsonl", tmp_path / "cli.png"
    code, stdout, err = run_cli("eval", "niah", str(model_dir), "--lengths", "200,256", "--depths", "0,1",
                                "--out", str(out), "--plot", str(png), "--json")
    assert code == 0, err
    rows = json.loads(stdout)
    assert [(r["length"], r["depth"], r["n"]) for r in rows] == [
        (200, 0.0, 1), (200, 1.0, 1), (200, "all", 2), (256, 0.0, 1), (256, 1.0, 1), (256, "all", 2)]
    assert len(out.read_text().splitlines()) == 4 and png.read_bytes()[:8] == PNG
