"""`ropekit eval ppl`: every protocol against a naive reference, forward counts, resume, errors, the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ropekit.errors import RopekitError
from ropekit.eval import perplexity as P
from ropekit.eval.common import make_context
from ropekit.models.byte_tokenizer import _byte_to_char, byte_tokenizer
from ropekit.models.tiny import build_tiny_model

LENGTHS = [24, 40]
STRIDE = 10
DOC_SIZES = (150, 97, 121)  # bytes = tokens with the byte tokenizer
#: Some English, ASCII so that characters are bytes (this module's docstring is long enough and costs nothing).
ENGLISH = P.__doc__.encode("ascii", "ignore").decode()


@pytest.fixture(scope="module")
def model():
    return build_tiny_model("llama", seed=0).eval()


def bos_tokenizer():
    tok = byte_tokenizer()
    tok.bos_token = _byte_to_char()[1]  # byte 1: never in the text
    assert tok.bos_token_id == 1
    return tok


@pytest.fixture(scope="module")
def texts():
    words = " ".join(ENGLISH.split())
    return [words[i * 200:i * 200 + n] for i, n in enumerate(DOC_SIZES)]


@pytest.fixture
def corpus(tmp_path, texts):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def evaluate(model, tokenizer, corpus, out=None, resume=False, **options):
    ctx = make_context("ppl", model, tokenizer, method=None, params=None, lengths=options["lengths"],
                       key_fields=P.KEY_FIELDS, out=out, resume=resume)
    P.run(ctx, data=corpus, **options)
    return list(ctx.writer.records())


# ---- the naive reference -----------------------------------------------------------------------------
def naive_window_nlls(model, ids, length, stride, mode, bos):
    """Per window: the list of ``(input position, NLL)`` of the tokens the protocol scores, each window run
    alone through the full forward, log-softmax in float64, targets picked one by one. ``same_targets``: the
    document cut at the longest length's capacity, one window ending there, its last ``stride`` tokens."""
    c = length - (1 if bos is not None else 0)
    if mode == "same_targets":
        ids = ids[:max(LENGTHS) - (1 if bos is not None else 0)]
    n = len(ids)
    if mode == "last_stride":
        starts = []
        for s in range(0, n, stride):
            starts.append(s)
            if s + c >= n:
                break
    elif mode == "full_window":
        starts = [s for s in range(n) if s % stride == 0 and s + c <= n]
    elif mode == "disjoint":
        starts = list(range(0, n, c))
    elif mode == "same_targets":
        starts = [max(0, n - c)]
    else:
        starts = [0]
    scored_before: set[int] = set()
    windows = []
    for s in starts:
        window = ids[s:min(s + c, n)]
        inputs = ([bos] if bos is not None else []) + window
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([inputs]), attention_mask=torch.ones(1, len(inputs), dtype=torch.long)).logits[0]
        logp = torch.log_softmax(logits.double(), dim=-1)
        offset = 1 if bos is not None else 0
        items = []
        for j in range(len(window)):
            pos = j + offset  # position of document token s+j in the input
            if pos == 0:
                continue  # nothing precedes it: unpredictable
            if mode == "last_stride" and (s + j) in scored_before:
                continue
            if mode == "same_targets" and s + j < n - stride:
                continue  # only the last `stride` tokens of the cut document are targets
            items.append((pos, -float(logp[pos - 1, inputs[pos]])))
            scored_before.add(s + j)
        if items:
            windows.append(items)
    if mode == "last_stride":  # every predictable token exactly once
        assert scored_before == set(range(0 if bos is not None else 1, n))
    return windows


def naive_ppl(window_lists, weighting):
    if weighting == "token":
        values = [v for w in window_lists for _, v in w]
        return math.exp(sum(values) / len(values))
    return math.exp(sum(sum(v for _, v in w) / len(w) for w in window_lists) / len(window_lists))


# ---- the protocols -----------------------------------------------------------------------------------
@pytest.mark.parametrize("with_bos", [False, True])
@pytest.mark.parametrize("mode", P.SCORE_MODES)
def test_every_protocol_equals_the_naive_reference(model, texts, corpus, mode, with_bos):
    tok = bos_tokenizer() if with_bos else byte_tokenizer()
    bos = 1 if with_bos else None
    stride = STRIDE if mode in ("last_stride", "full_window", "same_targets") else None
    naive = {
        length: [naive_window_nlls(model, list(t.encode()), length, stride or length - (bos is not None), mode, bos) for t in texts]
        for length in LENGTHS
    }
    for weighting in P.WEIGHTINGS:
        records = evaluate(model, tok, corpus, lengths=LENGTHS, stride=stride, score_mode=mode, weighting=weighting)
        assert len(records) == len(LENGTHS) * len(texts)
        rows = {r["length"]: r for r in P.summarize(records)}
        for length in LENGTHS:
            windows = [w for doc in naive[length] for w in doc]
            assert rows[length]["ppl"] == pytest.approx(naive_ppl(windows, weighting), rel=1e-5)
            assert rows[length]["tokens_scored"] == sum(len(w) for w in windows)
            assert rows[length]["windows"] == len(windows)
            assert rows[length]["documents"] == len(texts)
            assert (rows[length]["score_mode"], rows[length]["weighting"], rows[length]["add_bos"]) == (mode, weighting, with_bos)
        for r in records:
            ref = naive[r["length"]][r["doc"]]
            assert r["nll_sum"] == pytest.approx(sum(v for w in ref for _, v in w), rel=1e-5)
            assert r["context_len"] == r["length"] and r["score"] is None
            assert r["bos_token_id"] == bos
            # the per-position curve: every scored prediction in the bucket of its input position
            buckets = min(P.CURVE_BUCKETS, r["length"])
            sums, counts = [0.0] * buckets, [0] * buckets
            for w in ref:
                for pos, v in w:
                    sums[pos * buckets // r["length"]] += v
                    counts[pos * buckets // r["length"]] += 1
            assert r["curve_tokens"] == counts
            assert r["curve_nll_sum"] == pytest.approx(sums, rel=1e-5, abs=1e-9)


def test_last_stride_scores_every_token_once_and_defaults(model, texts, corpus):
    records = evaluate(model, byte_tokenizer(), corpus, lengths=LENGTHS)
    for r in records:
        assert r["tokens_scored"] == len(texts[r["doc"]].encode()) - 1  # no BOS: all but the first token
        assert r["stride"] == min(256, r["length"] // 2) and r["add_bos"] is False
        assert r["corpus"] == "jsonl:" + corpus and r["weighting"] == "token" and r["score_mode"] == "last_stride"
    # last_stride scores the same tokens at every length
    rows = P.summarize(records)
    assert rows[0]["tokens_scored"] == rows[1]["tokens_scored"] == sum(len(t) - 1 for t in texts)


def expected_windows(n, c, s, mode, bos):
    if mode == "last_stride":
        return 1 + max(0, math.ceil((n - c) / s))
    if mode == "full_window":
        return (n - c) // s + 1
    if mode == "disjoint":
        return math.ceil(n / c) - (1 if (n % c == 1 and not bos) else 0)
    return 1


@pytest.mark.parametrize("mode", P.SCORE_MODES)
def test_forward_count_is_the_protocols(model, texts, corpus, mode, monkeypatch):
    calls = []  # batch size of every decoder call (both scoring paths go through the decoder once per call)
    handle = model.base_model.register_forward_pre_hook(
        lambda mod, args, kwargs: calls.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    try:
        for batch_tokens, with_bos in ((P.BATCH_TOKENS, False), (1, True)):  # batched, and one window per call
            monkeypatch.setattr(P, "BATCH_TOKENS", batch_tokens)
            tok = bos_tokenizer() if with_bos else byte_tokenizer()
            stride = 7 if mode in ("last_stride", "full_window") else None
            calls.clear()
            records = evaluate(model, tok, corpus, lengths=[33], stride=stride, score_mode=mode)
            c = 33 - with_bos
            for r in records:
                assert r["windows"] == expected_windows(len(texts[r["doc"]]), c, stride or c, mode, with_bos)
            assert sum(calls) == sum(r["windows"] for r in records)  # every window run once, nothing else
            assert len(calls) == sum(r["forwards"] for r in records)
            if batch_tokens == 1:
                assert all(r["forwards"] == r["windows"] for r in records)
    finally:
        handle.remove()


def test_batched_chunked_and_plain_forward_paths_agree(model, corpus, monkeypatch):
    ref = {r["doc"]: r for r in evaluate(model, byte_tokenizer(), corpus, lengths=[40], stride=9)}
    monkeypatch.setattr(P, "CHUNK_ELEMENTS", 256 * 5)  # the head in chunks of 5 positions
    monkeypatch.setattr(P, "BATCH_TOKENS", 1)
    chunked = evaluate(model, byte_tokenizer(), corpus, lengths=[40], stride=9)
    monkeypatch.setattr(P, "PLAIN_HEAD_TYPES", frozenset())  # through forward(logits_to_keep=…)
    plain = evaluate(model, byte_tokenizer(), corpus, lengths=[40], stride=9)
    for records in (chunked, plain):
        for r in records:
            assert r["nll_sum"] == pytest.approx(ref[r["doc"]]["nll_sum"], rel=1e-6)
            assert r["curve_tokens"] == ref[r["doc"]]["curve_tokens"]


def test_gpt_neox_head_path_matches_naive(texts, corpus):
    neox = build_tiny_model("gpt_neox", seed=1).eval()
    records = evaluate(neox, byte_tokenizer(), corpus, lengths=[32], stride=11, score_mode="last_stride")
    for r in records:
        ref = naive_window_nlls(neox, list(texts[r["doc"]].encode()), 32, 11, "last_stride", None)
        assert r["nll_sum"] == pytest.approx(sum(v for w in ref for _, v in w), rel=1e-5)


def test_long_lengths_select_documents_and_samples(model, texts, corpus):
    # 121 tokens needed at the longest length: the 97-token document is skipped at every length
    records = evaluate(model, byte_tokenizer(), corpus, lengths=[40, 121], score_mode="truncate")
    assert sorted({r["doc"] for r in records}) == [0, 2]
    assert all(r["skipped_short"] == 1 and r["documents_selected"] == 2 for r in records)
    assert P.summarize(records)[0]["skipped_short"] == 1
    one = evaluate(model, byte_tokenizer(), corpus, lengths=[40], samples=1)
    assert [r["doc"] for r in one] == [0]
    with pytest.raises(RopekitError, match="only 2 documents"):
        evaluate(model, byte_tokenizer(), corpus, lengths=[100], samples=3)
    with pytest.raises(RopekitError, match="no document"):
        evaluate(model, byte_tokenizer(), corpus, lengths=[500])


# ---- resume ------------------------------------------------------------------------------------------
def strip(records):
    return sorted(json.dumps({k: v for k, v in r.items() if k != "seconds"}, sort_keys=True) for r in records)


def test_resume_after_a_crash_gives_the_uninterrupted_records(model, corpus, tmp_path, monkeypatch):
    full = tmp_path / "full.jsonl"
    evaluate(model, byte_tokenizer(), corpus, out=str(full), lengths=[32], stride=8)
    cut = tmp_path / "cut.jsonl"
    real = P.score_document
    done = []

    def crash_on_second(*args, **kwargs):
        if len(done) == 1:
            raise KeyboardInterrupt  # the run is killed while scoring the second document
        done.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(P, "score_document", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        evaluate(model, byte_tokenizer(), corpus, out=str(cut), lengths=[32], stride=8)
    assert len(cut.read_text().splitlines()) == 1
    monkeypatch.setattr(P, "score_document", real)
    computed = []
    monkeypatch.setattr(P, "score_document", lambda *a, **k: computed.append(1) or real(*a, **k))
    evaluate(model, byte_tokenizer(), corpus, out=str(cut), resume=True, lengths=[32], stride=8)
    assert len(computed) == 2  # only the two missing documents
    lines = cut.read_text().splitlines()
    assert len(lines) == 3
    assert strip(json.loads(line) for line in lines) == strip(json.loads(line) for line in full.read_text().splitlines())
    # a different protocol in the same file is new work, not a resumed one
    again = evaluate(model, byte_tokenizer(), corpus, out=str(cut), resume=True, lengths=[32], stride=9)
    assert len(again) == 6 and len(P.summarize(again)) == 2


# ---- errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options, match",
    [
        ({"stride": 40}, "larger than 39"),  # last_stride: S ≤ L−1
        ({"stride": 41, "score_mode": "full_window"}, "larger than 40"),
        ({"stride": 0}, "not a positive"),
        ({"score_mode": "sliding"}, "not known"),
        ({"weighting": "doc"}, "not known"),
        ({"stride": 4, "score_mode": "disjoint"}, "does not apply"),
        ({"add_bos": True}, "no BOS"),
        ({"samples": 0}, "not a positive"),
        ({"lengths": [1]}, "too short"),
        ({"lengths": []}, "needs --lengths"),
    ],
)
def test_bad_options_are_one_line_errors(model, corpus, options, match):
    options = {"lengths": [40], **options}
    with pytest.raises(RopekitError, match=match) as err:
        ctx = make_context("ppl", model, byte_tokenizer(), method=None, params=None, lengths=options["lengths"] or [40],
                           key_fields=P.KEY_FIELDS)
        P.run(ctx, data=corpus, **options)
    assert "\n" not in str(err.value)


def test_bad_corpora_are_one_line_errors(model, tmp_path):
    no_text = tmp_path / "x.jsonl"
    no_text.write_text('{"content": "abc"}\n')
    for data, match in ((str(tmp_path / "missing.jsonl"), "does not exist"), (str(no_text), "no 'text' field")):
        with pytest.raises(RopekitError, match=match) as err:
            evaluate(model, byte_tokenizer(), data, lengths=[32])
        assert "\n" not in str(err.value)


# ---- summary and plot --------------------------------------------------------------------------------
def test_summary_weightings_by_hand():
    base = {"task": "ppl", "method": "plain", "params": {}, "length": 8, "corpus": "c", "score_mode": "last_stride",
            "stride": 4, "add_bos": False, "skipped_short": 0}
    recs = [
        {**base, "weighting": "token", "doc": 0, "nll_sum": 6.0, "tokens_scored": 3, "windows": 2, "window_mean_nll_sum": 3.5},
        {**base, "weighting": "token", "doc": 1, "nll_sum": 1.0, "tokens_scored": 1, "windows": 1, "window_mean_nll_sum": 1.0},
        {**base, "weighting": "window", "doc": 0, "nll_sum": 6.0, "tokens_scored": 3, "windows": 2, "window_mean_nll_sum": 3.5},
        {**base, "weighting": "window", "doc": 1, "nll_sum": 1.0, "tokens_scored": 1, "windows": 1, "window_mean_nll_sum": 1.0},
    ]
    rows = {r["weighting"]: r for r in P.summarize(recs)}
    assert rows["token"]["ppl"] == pytest.approx(math.exp(7.0 / 4))
    assert rows["window"]["ppl"] == pytest.approx(math.exp(4.5 / 3))
    assert rows["token"]["documents"] == 2 and rows["window"]["tokens_scored"] == 4


def test_cli_end_to_end_with_plot(run_cli, tmp_path, texts):
    data = tmp_path / "doc.txt"
    data.write_text(ENGLISH[:400])
    png = tmp_path / "curve.png"
    out = tmp_path / "r.jsonl"
    code, stdout, stderr = run_cli("eval", "ppl", "tiny", "--lengths", "64,128", "--data", str(data),
                                   "--out", str(out), "--plot", str(png), "--json")
    assert code == 0, stderr
    rows = json.loads(stdout)
    assert [r["length"] for r in rows] == [64, 128]
    assert all(math.isfinite(r["ppl"]) and r["ppl"] > 1 and r["documents"] == 1 for r in rows)
    assert [r["stride"] for r in rows] == [32, 64]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(out.read_text().splitlines()) == 2
    code, _, stderr = run_cli("eval", "ppl", "tiny", "--lengths", "64", "--data", str(data),
                              "--score-mode", "nope")
    assert code == 2 and "not known" in stderr


def test_same_targets_scores_identical_tokens_at_every_length(model, texts, corpus):
    """The targets are the same tokens at every length; only the context before them grows."""
    records = evaluate(model, byte_tokenizer(), corpus, lengths=LENGTHS, stride=STRIDE, score_mode="same_targets")
    by_doc: dict[int, dict[int, dict]] = {}
    for r in records:
        by_doc.setdefault(r["doc"], {})[r["length"]] = r
    for rows in by_doc.values():
        assert {r["tokens_scored"] for r in rows.values()} == {STRIDE}
        assert len({r["nll_sum"] for r in rows.values()}) == len(LENGTHS)  # same targets, different contexts
    with pytest.raises(RopekitError, match="do not fit the shortest length"):
        evaluate(model, byte_tokenizer(), corpus, lengths=LENGTHS, stride=LENGTHS[0], score_mode="same_targets")
