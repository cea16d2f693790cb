"""LongRoPE search: the constraints of LongRoPE Eq. 4–5 on every candidate, the closed-form seeds against their
formulas, determinism, the native export against plain transformers' own ``longrope``, and resumption after
SIGKILL with nothing evaluated twice."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropekit
from ropekit.errors import RopekitError
from ropekit.eval.perplexity import score_windows
from ropekit.models.loading import load_model
from ropekit.models.tiny import build_tiny_model
from ropekit.search import SearchSettings, run_search
from ropekit.methods.longrope_search import PAPER_START_TOKENS, closed_forms, initial_population, next_generation, snap
from ropekit.search.longrope import search_documents


def _valid(c, factor, fixed, ceiling=None):
    top = 1.25 * factor if ceiling is None else ceiling  # LongRoPE Table 1: λ from 1.0 to s×1.25
    assert all(c[i] == 1.0 for i in range(fixed))
    assert all(1.0 <= v <= top + 1e-9 for v in c)
    assert all(a <= b for a, b in zip(c, c[1:]))
    assert all(abs(v * 100 - round(v * 100)) < 1e-9 for v in c)


@pytest.mark.parametrize("factor,fixed", [(4.0, 0), (3.37, 2), (16.0, 5)])
def test_every_candidate_keeps_the_constraints_and_none_repeats(factor, fixed):
    rng = random.Random(7)
    for _ in range(200):
        _valid(snap([rng.uniform(-2, 2 * factor) for _ in range(16)], factor, fixed), factor, fixed)
    forms = closed_forms(16, factor, yarn_gamma=[i / 15 for i in range(16)][::-1])
    population = initial_population(forms, 24, rng, factor, fixed, 0.3)
    assert len(population) == len(set(population)) == 24
    scored = {c: rng.random() for c in population}
    for _ in range(5):
        children = next_generation(scored, rng, parents=8, mutations=6, crossovers=6, factor=factor,
                                   fixed_pairs=fixed, probability=0.3)
        assert children and len(set(children)) == len(children) and not set(children) & set(scored)
        for c in children:
            _valid(c, factor, fixed)
            scored[c] = rng.random()


@pytest.mark.parametrize("factor,ceiling", [(4.0, None), (8.0, None), (8.0, 9.0), (4.0, 4.0)])
def test_the_search_space_reaches_the_papers_ceiling_and_not_beyond(factor, ceiling):
    # LongRoPE Table 1 searches λ up to 1.25·s (shipped LongRoPE factors exceed s: Phi-3.5-mini's reach ~50 at
    # s = 32); a search may set its own ceiling instead (microsoft/LongRoPE's dim_mono: 1 + s)
    top = 1.25 * factor if ceiling is None else ceiling
    rng = random.Random(5)
    assert max(snap([100.0] * 8, factor, ceiling=ceiling)) == pytest.approx(top)
    population = initial_population(closed_forms(16, factor), 16, rng, factor, 0, 0.5, ceiling=ceiling)
    scored = {c: -max(c) for c in population}  # reward large factors, so the search presses on its ceiling
    for _ in range(12):
        for c in next_generation(scored, rng, parents=6, mutations=6, crossovers=6, factor=factor, fixed_pairs=0,
                                 probability=0.5, ceiling=ceiling):
            _valid(c, factor, 0, ceiling)
            scored[c] = -max(c)
    reached = max(max(c) for c in scored)
    assert reached == pytest.approx(top)
    assert (reached > factor) == (top > factor)


def test_closed_forms_are_the_papers_frequencies():
    d, b, s = 32, 10000.0, 4.0
    i = torch.arange(d // 2, dtype=torch.float64)
    theta = b ** (-2 * i / d)
    ntk_theta = (b * s ** (d / (d - 2))) ** (-2 * i / d)  # NTK-aware base b·s^(d/(d−2)) (LCEG Eq. 9)
    forms = closed_forms(d // 2, s)
    torch.testing.assert_close(torch.tensor(forms["ntk"], dtype=torch.float64), theta / ntk_theta)
    assert forms["pi"] == [s] * (d // 2)  # PI: every frequency ÷ s


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


SETTINGS = dict(model="tiny", target_length=256, evaluations=14, documents=2, seed=3)


@pytest.fixture(scope="module")
def searched(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("search")
    return out, run_search(tiny.model, tiny.tokenizer, SearchSettings(**SETTINGS), out, progress=False)


def _rows(path):
    db = sqlite3.connect(path)
    try:
        return dict(db.execute("SELECT factors, objective FROM candidates").fetchall())
    finally:
        db.close()


def test_the_best_is_the_stored_minimum_and_a_rerun_gives_the_same_factors(tiny, searched, tmp_path):
    out, result = searched
    assert result["evaluations"] == result["evaluated_here"] == 14
    # read back with sqlite3, not through the search: the reported best is the lowest stored perplexity, under its
    # own factors, and the closed-form seeds report the values stored under their formulas' factors
    rows = _rows(out / "search.sqlite")
    assert len(rows) == 14
    best_key = json.dumps([round(v, 2) for v in result["best"]["long_factor"]])
    assert rows[best_key] == result["best"]["perplexity"] == min(rows.values())
    s, pairs = result["factor"], len(result["best"]["long_factor"])
    assert s == 256 / result["window"]
    assert result["seeds"]["pi"] == rows[json.dumps([round(s, 2)] * pairs)]  # PI: λ_i = s
    d = 2 * pairs  # NTK-aware: λ_i = s^(2i/(d−2)) on the 0.01 grid
    assert result["seeds"]["ntk"] == rows[json.dumps([round(s ** (2 * i / (d - 2)), 2) for i in range(pairs)])]
    again = run_search(tiny.model, tiny.tokenizer, SearchSettings(**SETTINGS), tmp_path, progress=False)
    assert again["best"] == result["best"]
    assert _rows(tmp_path / "search.sqlite") == _rows(out / "search.sqlite")
    resumed = run_search(tiny.model, tiny.tokenizer, SearchSettings(**SETTINGS), out, progress=False)
    assert resumed["evaluated_here"] == 0 and resumed["best"] == result["best"]


def test_plain_transformers_loads_the_export_and_scores_what_the_search_scored(tiny, searched):
    out, result = searched
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "longrope"
    assert config["rope_parameters"]["long_factor"] == result["best"]["long_factor"]
    plain = AutoModelForCausalLM.from_pretrained(out / "model").eval()  # transformers' own longrope, no ropekit
    nll, count = 0.0, 0
    for doc in search_documents(tiny.tokenizer, SearchSettings(**SETTINGS)):
        with torch.no_grad():
            scores = score_windows(plain, torch.tensor([doc]), len(doc) - 1).double()
        nll, count = nll + float(scores.sum()), count + scores.numel()
    assert math.exp(nll / count) == pytest.approx(result["best"]["perplexity"], rel=1e-5)


def test_other_settings_in_the_same_directory_are_refused(tiny, searched):
    out, _ = searched
    with pytest.raises(Exception, match="other settings"):
        run_search(tiny.model, tiny.tokenizer, SearchSettings(**{**SETTINGS, "seed": 4}), out, progress=False)


def test_a_rerun_that_only_steers_the_search_reuses_stored_values_and_ends_as_a_fresh_search(tiny, searched,
                                                                                            tmp_path):
    import shutil

    out, _ = searched
    steered = {**SETTINGS, "evaluations": 20, "max_factor": 4.5}  # s = 4 here: a ceiling between s and 1.25·s
    continued = tmp_path / "continued"
    shutil.copytree(out, continued)
    before = _rows(continued / "search.sqlite")
    result = run_search(tiny.model, tiny.tokenizer, SearchSettings(**steered), continued, progress=False)
    fresh = run_search(tiny.model, tiny.tokenizer, SearchSettings(**steered), tmp_path / "fresh", progress=False)
    assert result["best"] == fresh["best"] and result["evaluations"] == fresh["evaluations"] == 20
    assert result["settings"]["max_factor"] == 4.5
    after, alone = _rows(continued / "search.sqlite"), _rows(tmp_path / "fresh" / "search.sqlite")
    shared = set(before) & set(alone)
    assert shared and result["evaluated_here"] == 20 - len(shared)  # only what no earlier run evaluated
    assert all(after[k] == v for k, v in alone.items())  # the same values, computed once
    assert all(max(json.loads(k)) <= 4.5 for k in alone)


def test_a_search_stored_before_the_objective_was_recorded_is_continued_by_its_settings(tiny, searched, tmp_path):
    import shutil

    out, result = searched
    legacy = tmp_path / "legacy"
    shutil.copytree(out, legacy)
    db = sqlite3.connect(legacy / "search.sqlite")
    with db:  # as an older ropekit wrote it: every setting under 'settings', no objective row, no digests
        db.execute("DELETE FROM meta WHERE key IN ('objective', 'documents_sha256', 'model_fingerprint')")
        db.execute("INSERT INTO meta VALUES ('settings', ?)", (json.dumps({**SETTINGS, "data": None, "fixed_pairs": 0,
                   "population": None, "mutation_probability": 0.3}, sort_keys=True),))
    db.close()
    again = run_search(tiny.model, tiny.tokenizer, SearchSettings(**SETTINGS), legacy, progress=False)
    assert again["evaluated_here"] == 0 and again["best"] == result["best"]
    adopted, original = _meta(legacy / "search.sqlite"), _meta(out / "search.sqlite")  # this run's digests, adopted
    assert adopted["documents_sha256"] == original["documents_sha256"] == _ids_sha256(
        search_documents(tiny.tokenizer, SearchSettings(**SETTINGS)))
    assert adopted["model_fingerprint"] == original["model_fingerprint"]
    db = sqlite3.connect(legacy / "search.sqlite")
    with db:
        db.execute("DELETE FROM meta WHERE key = 'objective'")
    db.close()
    with pytest.raises(RopekitError, match=r"computed for other settings \(seed 3\)") as err:
        run_search(tiny.model, tiny.tokenizer, SearchSettings(**{**SETTINGS, "seed": 4}), legacy, progress=False)
    assert "\n" not in str(err.value)


def test_a_damaged_search_database_is_refused_in_one_line_and_kept(tiny, searched, tmp_path):
    out, _ = searched
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    raw = (out / "search.sqlite").read_bytes()[:3000]
    (damaged / "search.sqlite").write_bytes(raw)
    with pytest.raises(RopekitError, match="not a ropekit search database") as err:
        run_search(tiny.model, tiny.tokenizer, SearchSettings(**SETTINGS), damaged, progress=False)
    assert "\n" not in str(err.value) and (damaged / "search.sqlite").read_bytes() == raw


def test_bad_input_is_one_line_and_writes_nothing(run_cli, tmp_path):
    for args, words in ((["--data", "builtin"], "held-out evaluation corpus"),
                        (["--data", "builtin-tests"], "builtin-tests is a held-out evaluation corpus"),
                        (["--target-length", "32"], "not beyond"),
                        (["--fixed-pairs", "8"], "fixes every one"),
                        (["--target-length", "99999999999"], "past 16,777,216 tokens"),
                        (["--data", str(tmp_path / "nope")], "does not exist"),
                        (["--max-factor", "3.5"], "below the extension ratio s = 4")):
        argv = ["search", "tiny", "--target-length", "256", "--out", str(tmp_path / "s"), *args]
        code, _, err = run_cli(*argv)
        assert code == 2 and words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "s").exists()
    # an extended model (a ropekit export: frozen, or trained): every candidate would install LongRoPE over the
    # method (an internal RecursionError, and a search.sqlite left behind)
    assert run_cli("extend", "tiny", "--method", "yarn", "--factor", "2", "--out", str(tmp_path / "yarn"))[0] == 0
    code, _, err = run_cli("search", str(tmp_path / "yarn"), "--target-length", "256", "--out", str(tmp_path / "s"))
    assert code == 2 and "already extended with 'yarn'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    code, _, err = run_cli("search", "tiny", "--target-length", "256", "--out", str(afile))
    assert code == 2 and "exists and is a file" in err and len(err.strip().splitlines()) == 1
    assert afile.read_text() == "keep me"


def test_sigkill_mid_search_loses_nothing_and_evaluates_nothing_twice(searched, tmp_path):
    ref_dir, result = searched
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "ropekit.cli", "search", "tiny", "--target-length", "256", "--out", str(out),
           "--evaluations", "14", "--documents", "2", "--seed", "3", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    done, deadline = 0, time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if (out / "search.sqlite").is_file():
            try:
                done = len(_rows(out / "search.sqlite"))
            except sqlite3.Error:
                done = 0
            if done >= 5:
                break
        time.sleep(0.02)
    assert proc.poll() is None, "the search ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = len(_rows(out / "search.sqlite"))
    assert 5 <= before < 14
    finished = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-2000:]
    resumed = json.loads(finished.stdout)
    assert resumed["evaluated_here"] == 14 - before  # what was stored was read back, not evaluated again
    assert resumed["best"] == result["best"]
    assert _rows(out / "search.sqlite") == _rows(ref_dir / "search.sqlite")


# ---- start tokens n̂ (LongRoPE §3.2) ------------------------------------------------------------------------------


def test_searched_start_tokens_stay_in_their_set_and_the_factors_keep_the_constraints():
    rng, factor, starts = random.Random(11), 4.0, PAPER_START_TOKENS
    forms = closed_forms(16, factor, yarn_gamma=[i / 15 for i in range(16)][::-1])
    population = initial_population(forms, 24, rng, factor, 1, 0.3, starts)
    assert len(population) == len(set(population)) == 24
    assert all(c[-1] == 0.0 for c in population[:3])  # the closed forms start at the smallest n̂
    scored = {c: rng.random() for c in population}
    for _ in range(5):
        for c in next_generation(scored, rng, parents=8, mutations=6, crossovers=6, factor=factor, fixed_pairs=1,
                                 probability=0.3, starts=starts):
            assert c not in scored and c[-1] in starts and len(c) == 17
            _valid(c[:-1], factor, 1)
            scored[c] = rng.random()
    assert len({c[-1] for c in scored}) > 3  # n̂ is really searched
    assert snap([1.0] * 16 + [10.0], factor, 0, starts)[-1] == 8.0  # the nearest value of the set (ties: smaller)


def _perplexity(model, settings):
    nll, count = 0.0, 0
    for doc in search_documents(load_model("tiny").tokenizer, settings):
        with torch.no_grad():
            scores = score_windows(model, torch.tensor([doc]), len(doc) - 1).double()
        nll, count = nll + float(scores.sum()), count + scores.numel()
    return math.exp(nll / count)


def test_a_fixed_n_hat_is_used_by_every_candidate_and_exported_as_ropekit_longrope(tiny, searched, tmp_path):
    settings = SearchSettings(**{**SETTINGS, "evaluations": 6, "start_tokens": (4,)})
    result = run_search(tiny.model, tiny.tokenizer, settings, tmp_path, progress=False)
    assert result["best"]["start_tokens"] == 4 and result["export"]["format"] == "ropekit"
    assert not getattr(tiny.model.config, "ropekit", None)  # the search model is left as it was
    loaded = ropekit.load(tmp_path / "model")
    assert loaded.config.ropekit["params"]["start_tokens"] == 4
    assert _perplexity(loaded, settings) == pytest.approx(result["best"]["perplexity"], rel=1e-5)
    # the first candidate is PI's factors in both searches: n̂ = 4 scores differently from n̂ = 0
    _, plain = searched
    assert result["seeds"]["pi"] != plain["seeds"]["pi"]


def test_n_hat_searched_jointly_with_the_factors(tiny, tmp_path):
    settings = SearchSettings(**{**SETTINGS, "evaluations": 10, "start_tokens": (0, 8, 32)})
    result = run_search(tiny.model, tiny.tokenizer, settings, tmp_path, progress=False)
    rows = _rows(tmp_path / "search.sqlite")
    assert len(rows) == 10 and {json.loads(k)[-1] for k in rows} <= {0.0, 8.0, 32.0}
    assert result["best"]["perplexity"] == min(rows.values())
    assert result["best"]["start_tokens"] in (0, 8, 32) and result["settings"]["start_tokens"] == [0, 8, 32]
    expected = "native" if result["best"]["start_tokens"] == 0 else "ropekit"
    assert result["export"]["format"] == expected
    loaded = ropekit.load(tmp_path / "model")
    assert _perplexity(loaded, settings) == pytest.approx(result["best"]["perplexity"], rel=1e-5)


@pytest.mark.parametrize("value,words", [("256", "un-interpolated"), ("4,x", "not a number"), ("4,4", "repeats")])
def test_bad_start_tokens_are_one_line(run_cli, tmp_path, value, words):
    code, _, err = run_cli("search", "tiny", "--target-length", "256", "--out", str(tmp_path / "s"),
                           "--start-tokens", value)
    assert code == 2 and words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_built_in_rows_pack_training_documents_to_a_target_longer_than_any_of_them(tiny):
    # the built-in training split stores text in pieces of at most 32 KiB, so a target past that (SmolLM2's 32k
    # tokens is ~100 KB of code) has no single document long enough: rows are packed from whole documents
    from ropekit.data.local_text import stdlib_documents
    from ropekit.search.longrope import TRAIN_BYTES

    docs = stdlib_documents(TRAIN_BYTES, "train")
    target = max(len(d) for d in docs) + 5_000  # the tiny model's tokenizer is one token per byte
    rows = search_documents(tiny.tokenizer, SearchSettings(**{**SETTINGS, "target_length": target}))
    assert [len(r) for r in rows] == [target, target]
    eos = tiny.tokenizer.eos_token_id
    heads = {tuple(tiny.tokenizer(d.decode("ascii"), add_special_tokens=False).input_ids[:200]) for d in docs}
    assert tuple(rows[0][:200]) in heads  # the stream starts with a whole document (the next row continues it)
    for row in rows:
        # documents in sequence: every separator is followed by the start of another document
        cuts = [i + 1 for i, t in enumerate(row) if t == eos and i + 201 <= len(row)]
        assert cuts and all(tuple(row[i:i + 200]) in heads for i in cuts)
    assert rows[0] != rows[1]


# ---- where the objectives are computed ------------------------------------------------------------------------------


def test_the_result_records_the_dtype_and_a_resume_in_another_dtype_is_refused(run_cli, tmp_path):
    """A bf16 perplexity differs from a float32 one by about what separates neighbouring candidates, so a search
    continues only in the dtype it began in; the refusal is one line, before anything loads, and changes nothing."""
    out = tmp_path / "s"
    args = ["search", "tiny", "--target-length", "256", "--out", str(out), "--evaluations", "4", "--documents", "1"]
    code, stdout, stderr = run_cli(*args, "--json")
    assert code == 0, stderr
    result = json.loads(stdout)
    assert result["computed_on"]["dtype"] == "float32" and result["computed_on"]["device"] == "cpu"
    # --dtype auto keeps a small model in float32, and the run says so in one line
    assert [line for line in stderr.splitlines() if line.startswith("running on ")] == [
        "running on cpu in float32 (auto: a small model (0.1M parameters) stays in float32, bfloat16 is for models "
        "of 20M or more), attention sdpa"]
    before = _rows(out / "search.sqlite")
    code, stdout, stderr = run_cli(*args, "--dtype", "bfloat16")
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "computed in float32" in lines[0] and "--dtype float32" in lines[0], stderr
    assert _rows(out / "search.sqlite") == before and not stdout
    code, stdout, stderr = run_cli(*args, "--dtype", "float32", "--json")  # the same dtype resumes, evaluating nothing
    assert code == 0 and json.loads(stdout)["evaluated_here"] == 0, stderr


def test_a_search_worker_loads_the_model_in_the_parents_dtype():
    from ropekit.search import longrope

    longrope.worker_init("tiny", SearchSettings(**SETTINGS), 1, {"device": "cpu", "dtype": "bfloat16", "attn": "eager"})
    try:
        model = longrope._WORKER["model"]
        assert next(model.parameters()).dtype == torch.bfloat16
        assert model.config._attn_implementation == "eager"
    finally:
        longrope._WORKER.clear()


# ---- what the stored perplexities were computed on, by content ------------------------------------------------------


def _meta(path):
    db = sqlite3.connect(path)
    try:
        return dict(db.execute("SELECT key, value FROM meta").fetchall())
    finally:
        db.close()


def _ids_sha256(documents):
    """The documents' digest as documented: sha256 of each document's length, then its ids, as 8-byte
    little-endian integers, after a fixed tag."""
    h = hashlib.sha256(b"ropekit-search-documents/1")
    for doc in documents:
        h.update(len(doc).to_bytes(8, "little", signed=True))
        h.update(b"".join(t.to_bytes(8, "little", signed=True) for t in doc))
    return h.hexdigest()


def _write_words(path, seed):
    rng = random.Random(seed)
    path.write_text(" ".join(rng.choice(["alpha", "beta", "gamma", "delta", "eps", "zeta"]) for _ in range(3000)))


def test_a_rerun_whose_data_file_changed_is_refused_in_one_line_and_changes_nothing(tiny, tmp_path):
    """The same --data path with other text: the stored perplexities were computed on other documents."""
    data, out = tmp_path / "docs.txt", tmp_path / "run"
    _write_words(data, 1)
    settings = SearchSettings(model="tiny", target_length=256, evaluations=4, documents=1, seed=0, data=str(data))
    documents = search_documents(tiny.tokenizer, settings)
    run_search(tiny.model, tiny.tokenizer, settings, out, progress=False)
    rows, meta, result = _rows(out / "search.sqlite"), _meta(out / "search.sqlite"), (out / "result.json").read_bytes()
    _write_words(data, 2)
    with pytest.raises(RopekitError, match="other search documents") as err:
        run_search(tiny.model, tiny.tokenizer, settings, out, progress=False)
    line = str(err.value)
    assert "\n" not in line and "--data" in line and "another --out" in line, line
    assert _rows(out / "search.sqlite") == rows and _meta(out / "search.sqlite") == meta
    assert (out / "result.json").read_bytes() == result
    assert meta["documents_sha256"] == _ids_sha256(documents)  # what the first run computed on, by content
    fresh = run_search(tiny.model, tiny.tokenizer, settings, tmp_path / "fresh", progress=False)
    assert fresh["evaluated_here"] == 4
    assert _meta(tmp_path / "fresh" / "search.sqlite")["documents_sha256"] == _ids_sha256(
        search_documents(tiny.tokenizer, settings))


def test_a_rerun_whose_default_documents_differ_is_refused(tiny, searched, tmp_path, monkeypatch):
    """The default documents come from the installed Python's standard library: another machine's differ."""
    import shutil

    from ropekit.data.local_text import stdlib_documents
    from ropekit.search import longrope

    out, _ = searched
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    rows = _rows(moved / "search.sqlite")
    monkeypatch.setattr(longrope, "stdlib_documents", lambda n, split: [b"# " + d for d in stdlib_documents(n, split)])
    with pytest.raises(RopekitError, match="standard library") as err:
        run_search(tiny.model, tiny.tokenizer, SearchSettings(**SETTINGS), moved, progress=False)
    assert "\n" not in str(err.value) and "other search documents" in str(err.value)
    assert _rows(moved / "search.sqlite") == rows


def test_a_rerun_with_other_weights_is_refused_and_the_fingerprint_ignores_the_dtype(tiny, searched, tmp_path):
    import copy
    import shutil

    out, _ = searched
    other = copy.deepcopy(tiny.model)
    with torch.no_grad():
        other.get_input_embeddings().weight.add_(0.25)  # a fine-tune, another checkpoint under the same path
    copied = tmp_path / "copied"
    shutil.copytree(out, copied)
    rows, meta = _rows(copied / "search.sqlite"), _meta(copied / "search.sqlite")
    with pytest.raises(RopekitError, match="other model weights") as err:
        run_search(other, tiny.tokenizer, SearchSettings(**SETTINGS), copied, progress=False)
    assert "\n" not in str(err.value) and "'tiny' holds other weights" in str(err.value)
    assert _rows(copied / "search.sqlite") == rows and _meta(copied / "search.sqlite") == meta
    from ropekit.search.longrope import model_fingerprint

    # the same checkpoint in bfloat16 (the store pins the dtype separately) or on another device: the same weights
    assert model_fingerprint(copy.deepcopy(tiny.model).to(torch.bfloat16)) == model_fingerprint(tiny.model)
    assert model_fingerprint(other) != model_fingerprint(tiny.model)


def test_the_committed_smollm2_search_database_adopts_the_digests_and_then_pins_them(tmp_path):
    """docs/results/smollm2's search was stored before the digests existed: it stayed resumable, and the run that
    continued it (2026-11-30) recorded its digests, as it does the dtype; from then on other documents are refused.
    The adoption is replayed on a copy with the two recorded digests taken out again."""
    import shutil
    from pathlib import Path

    from ropekit.search.longrope import SearchStore

    committed = Path(__file__).resolve().parents[2] / "docs/results/smollm2/search-longrope-search.sqlite"
    path = tmp_path / "search.sqlite"
    shutil.copyfile(committed, path)
    recorded = _meta(path)
    assert all(re.fullmatch(r"[0-9a-f]{64}", recorded[key]) for key in ("documents_sha256", "model_fingerprint"))
    db = sqlite3.connect(path)
    with db:
        db.execute("DELETE FROM meta WHERE key IN ('documents_sha256', 'model_fingerprint')")
    db.close()
    assert "documents_sha256" not in _meta(path) and "model_fingerprint" not in _meta(path)
    rows = _rows(path)
    settings = SearchSettings(model="smollm2", target_length=32768, evaluations=48, documents=2, seed=0)
    digests = {"documents_sha256": "a" * 64, "model_fingerprint": "b" * 64}
    SearchStore(path, settings, dtype="bfloat16", digests=digests).close()
    meta = _meta(path)
    assert meta["documents_sha256"] == "a" * 64 and meta["model_fingerprint"] == "b" * 64 and _rows(path) == rows
    with pytest.raises(RopekitError, match="other search documents") as err:
        SearchStore(path, settings, dtype="bfloat16", digests={**digests, "documents_sha256": "c" * 64})
    assert "\n" not in str(err.value) and _meta(path) == meta


# ---- models the search does not take: refused before anything is written ---------------------------------------------


def _tiny_phi35(tokenizer):
    return build_tiny_model("phi3.5", vocab_size=max(len(tokenizer), 256))


def test_a_model_whose_rope_already_switches_is_refused_before_anything_is_written(tiny, tmp_path):
    """Phi-3.5-style switching longrope (short/long factors at original_max_position_embeddings): a search on it
    would be LongRoPE's progressive extension, which ropekit's search does not do."""
    model = _tiny_phi35(tiny.tokenizer)
    info = ropekit.rope_info(model)
    assert info.original_window < info.window
    with pytest.raises(RopekitError) as err:
        run_search(model, tiny.tokenizer, SearchSettings(model="phi3.5-tiny", target_length=4 * info.window,
                                                         evaluations=4, documents=1), tmp_path / "s", progress=False)
    line = str(err.value)
    assert "\n" not in line and "already switches between short and long factors" in line, line
    assert "progressive" in line and f"original {info.original_window}-token window" in line, line
    assert not (tmp_path / "s").exists() and ropekit.installed(model) is None


def test_the_cli_refuses_a_switching_model_in_one_line_and_writes_nothing(tiny, run_cli, tmp_path):
    model = _tiny_phi35(tiny.tokenizer)
    model.save_pretrained(tmp_path / "phi35")
    tiny.tokenizer.save_pretrained(tmp_path / "phi35")
    code, _, err = run_cli("search", str(tmp_path / "phi35"), "--target-length", str(4 * ropekit.rope_info(model).window),
                           "--out", str(tmp_path / "s"), "--evaluations", "4", "--documents", "1")
    assert code == 2 and "already switches between short and long factors" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_candidates_the_model_cannot_take_are_refused_before_the_directory_is_made(tiny, tmp_path):
    """Start tokens on a Dynamic NTK model (its RoPE grows with the length): the first candidate's install fails, so
    the search says so before it makes its directory, not at its first evaluation."""
    model = build_tiny_model("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0},
                             vocab_size=max(len(tiny.tokenizer), 256))
    window = ropekit.rope_info(model).window
    settings = SearchSettings(model="dynamic-tiny", target_length=4 * window, evaluations=4, documents=1,
                              start_tokens=(4,))
    with pytest.raises(RopekitError) as err:
        run_search(model, tiny.tokenizer, settings, tmp_path / "s", progress=False)
    line = str(err.value)
    assert "\n" not in line and "cannot be installed on this model" in line and "start_tokens" in line, line
    assert not (tmp_path / "s").exists() and ropekit.installed(model) is None
