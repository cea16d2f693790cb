"""The study runner: planning, config errors, a small end-to-end study, and resume after SIGKILL."""

from __future__ import annotations

import copy

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from ropekit.errors import RopekitError
from ropekit.study.config import load_study_config, parse_study, preset_names
from ropekit.study.runner import plan, run_study

SMALL = {
    "name": "small",
    "model": "tiny",
    "seed": 0,
    "target_length": 256,
    "recipe": {
        "data": {"seq_len": 128, "sources": [{"path": "builtin", "max_documents": 20}]},
        "train": {"max_steps": 6, "lr": 1.0e-3, "warmup_steps": 1, "micro_batch_size": 2},
        "output": {"save_every": 2},
    },
    "variants": [
        {"label": "base"},
        {"label": "pi", "method": "pi", "params": {"factor": 4}},
        {"label": "pi-ft", "method": "pi", "params": {"factor": 4}, "finetune": True},
    ],
    "evals": {
        "ppl": {"lengths": [64, 128], "samples": 2, "score_mode": "truncate"},
        "passkey": {"lengths": [256], "depths": [0.5], "trials": 2},
    },
}
#: Record fields that measure time: they differ between runs by nature.
_TIMING = ("seconds", "time", "elapsed")


def _stable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not any(t in k for t in _TIMING)}


def _dump(db_path: Path) -> dict:
    """What must be equal between two runs of the same study: pieces, samples (minus timings), training losses."""
    db = sqlite3.connect(db_path)
    db.row_factory = sqlite3.Row
    pieces = {r["id"]: (r["kind"], r["method"], r["task"], r["status"]) for r in db.execute("SELECT * FROM pieces")}
    pieces_status = [p[3] for p in pieces.values()]
    samples = {}
    for r in db.execute("SELECT piece, sample_key, score, record FROM samples"):
        key = (r["piece"], r["sample_key"])
        assert key not in samples, f"duplicate sample {key}"
        samples[key] = (r["score"], _stable(json.loads(r["record"])))
    metrics = {(r["piece"], r["step"]): r["loss"] for r in db.execute("SELECT piece, step, loss FROM train_metrics")}
    db.close()
    return {"pieces": pieces, "samples": samples, "metrics": metrics, "pieces_status": pieces_status}


def _assert_same(a: dict, b: dict) -> None:
    assert a["pieces"] == b["pieces"]
    assert a["samples"].keys() == b["samples"].keys()
    for key, (score, record) in a["samples"].items():
        other_score, other = b["samples"][key]
        assert score == pytest.approx(other_score, abs=1e-6) if score is not None else other_score is None, key
        assert record.keys() == other.keys(), key
        for field, value in record.items():
            if isinstance(value, float):
                assert value == pytest.approx(other[field], rel=1e-5, abs=1e-6), (key, field)
            elif field not in ("curve_nll_sum",):
                assert value == other[field], (key, field)
    assert a["metrics"].keys() == b["metrics"].keys()
    for key, loss in a["metrics"].items():
        assert loss == pytest.approx(b["metrics"][key], rel=1e-5), key


# ---- config ----------------------------------------------------------------------------------------------
def test_plan_orders_pieces_by_variant_with_prerequisites():
    cfg = parse_study({**SMALL, "model": "builtin-base", "target_length": 512})
    pieces = plan(cfg)
    ids = [p.id for p in pieces]
    assert ids == ["pretrain:base", "eval:ppl:base", "eval:passkey:base", "eval:ppl:pi", "eval:passkey:pi",
                   "train:pi-ft", "eval:ppl:pi-ft", "eval:passkey:pi-ft"]
    needs = {p.id: p.needs for p in pieces}
    assert needs["train:pi-ft"] == ("pretrain:base",)
    assert needs["eval:ppl:pi-ft"] == ("train:pi-ft",)
    assert needs["eval:ppl:pi"] == ("pretrain:base",)
    assert plan(parse_study(SMALL))[0].id == "eval:ppl:base"  # a given model needs no pre-training


@pytest.mark.parametrize("change, words", [
    ({"colour": 1}, "colour: unknown key"),
    ({"variants": [{"label": "x", "metod": "pi"}]}, "variants[0].metod: unknown key"),
    ({"target_length": 0}, "target_length must be a positive whole number"),
    ({"variants": []}, "variants is missing or empty"),
    ({"variants": [{"label": "x", "method": "nope"}]}, "unknown method"),
    ({"variants": [{"label": "x", "method": "pi", "params": {"factr": 2}}]}, "factr"),
    ({"variants": [{"label": "x", "method": "pi", "params": {"factor": 0.5}}]}, "factor"),
    ({"variants": [{"label": "a"}, {"label": "a"}]}, "label 'a' twice"),
    ({"variants": [{"label": "bad label"}]}, "label must be"),
    ({"evals": {"pplx": {"lengths": [64]}}}, "not an evaluation task"),
    ({"evals": {"ppl": {"samples": 2}}}, "evals.ppl.lengths is missing"),
    ({"evals": {"ppl": {"lengths": [1, 64]}}}, "evals.ppl.lengths[0] must be a whole number of tokens from 2"),
    ({"evals": {"ppl": {"lengths": [64], "depths": [0.5]}}}, "evals.ppl.depths is not an option"),
    # what `ropekit eval` refuses before loading a model is refused when the config is read, not when a piece runs
    ({"evals": {"passkey": {"lengths": [64], "depths": [1.5]}}}, "evals.passkey depth 1.5 is not a fraction in [0, 1]"),
    ({"evals": {"ppl": {"lengths": [64], "score_mode": "bogus"}}}, "evals.ppl `score_mode:` 'bogus' is not known"),
    ({"evals": {"ppl": {"lengths": [64], "score_mode": "disjoint", "stride": 8}}}, "`stride:` does not apply"),
    ({"evals": {"ppl": {"lengths": [64], "stride": 64}}}, "`stride:` 64 is larger than 63"),
    ({"evals": {"niah": {"lengths": [64], "depths": [0.5, -0.1]}}}, "evals.niah depth -0.1 is not a fraction"),
    ({"evals": {"niah": {"lengths": [64], "chat": 1}}}, "pass `chat:` or `chat: false`"),
    ({"evals": {"ruler": {"lengths": [64], "tasks": ["niah_single_9"]}}}, "unknown RULER task 'niah_single_9'"),
    ({"evals": {"ruler": {"lengths": [64], "tasks": ["niah_single_1"], "data": "q.json"}}}, "feeds only RULER's qa"),
    ({"evals": {"manyshot": {"lengths": [64], "shots": [-1]}}}, "`shots:` -1 is not a count"),
    ({"evals": {"manyshot": {"lengths": [64], "sampling": "stratified"}}}, "sampling 'stratified' is unknown"),
    ({"evals": {"longbench": {"lengths": [64], "tasks": ["hotpotqa_x"]}}}, "unknown LongBench dataset 'hotpotqa_x'"),
    ({"evals": {"entropy": {"lengths": [64], "positions": 1}}}, "evals.entropy positions 1 is not a whole number ≥ 2"),
    ({"recipe": {"model": {"name": "tiny"}}}, "recipe.model.name is set by the study"),
    ({"recipe": {"output": {"dir": "x"}}}, "recipe.output.dir is set by the study"),
    ({"recipe": {"data": {"seq_len": 128}, "train": {"max_stepz": 3}}}, "max_stepz"),
])
def test_config_errors_are_one_line_and_name_the_key(change, words):
    with pytest.raises(RopekitError) as err:
        parse_study({**SMALL, **change})
    text = str(err.value)
    assert words in text and "\n" not in text


def test_finetune_without_recipe_and_unknown_preset():
    raw = {k: v for k, v in SMALL.items() if k != "recipe"}
    with pytest.raises(RopekitError, match="no recipe"):
        parse_study(raw)
    with pytest.raises(RopekitError, match="unknown study preset 'quik'.*did you mean 'quick'"):
        load_study_config(preset="quik")
    with pytest.raises(RopekitError, match="not found"):
        load_study_config("/nonexistent/study.yaml")


def test_every_preset_parses_and_quick_has_the_issue_s_methods():
    assert {"quick", "smollm2", "lceg-llama2-7b"} <= set(preset_names())
    for name in preset_names():
        cfg = load_study_config(preset=name)
        assert cfg.variants and cfg.evals
    quick = load_study_config(preset="quick")
    methods = {(v.method, v.trained) for v in quick.variants}
    for wanted in [(None, False), ("pi", True), ("ntk", False), ("ntk", True), ("dynamic_ntk", False),
                   ("dynamic_yarn", False), ("longrope", False), ("ntk_by_parts", True), ("yarn", True), ("abf", True), ("entropy_abf", True), ("harpe", True),
                   ("self_extend", False), ("lm_infinite", False), ("longlora", True), ("clex", True),
                   ("landmark", True)]:
        assert wanted in methods, wanted
    pose = [v for v in quick.variants if v.finetune and "pose" in v.finetune.get("data", {})]
    assert {v.method for v in pose} == {"pi", "yarn"}
    assert quick.model == "builtin-base" and quick.target_length == 1024


# ---- running ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference_study(tmp_path_factory):
    out = tmp_path_factory.mktemp("study-ref")
    status = run_study(parse_study(SMALL), out, progress=False)
    return out, status


def test_small_study_runs_every_piece_once_and_writes_samples(reference_study):
    out, status = reference_study
    assert status["by_status"]["done"] == 7 and status["by_status"]["failed"] == 0
    dump = _dump(out / "study.sqlite")
    per_piece = {}
    for piece, _ in dump["samples"]:
        per_piece[piece] = per_piece.get(piece, 0) + 1
    for label in ("base", "pi", "pi-ft"):
        assert per_piece[f"eval:ppl:{label}"] == 2 * 2  # lengths × documents
        assert per_piece[f"eval:passkey:{label}"] == 2  # one length × one depth × two trials
    assert sorted(step for piece, step in dump["metrics"]) == [1, 2, 3, 4, 5, 6]
    # the frozen PI variant was evaluated with PI installed, the fine-tuned one with its trained weights
    pi = [r for (p, _), (_, r) in dump["samples"].items() if p == "eval:ppl:pi"]
    assert all(r["method"] == "pi" and r["params"]["factor"] == 4 for r in pi)
    ft = [r for (p, _), (_, r) in dump["samples"].items() if p == "eval:ppl:pi-ft"]
    assert all(r["method"] == "pi" for r in ft)
    base_nll = {r["length"]: r["nll_sum"] for (p, _), (_, r) in dump["samples"].items() if p == "eval:ppl:base"}
    ft_nll = {r["length"]: r["nll_sum"] for r in ft}
    assert base_nll != ft_nll  # training changed the model


def _cpu_model_name() -> str:
    """The CPU's model as the kernel reports it (the reference the recorded hardware name must start with)."""
    import platform

    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.lower().startswith(("model name", "hardware", "cpu model")):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def test_every_finished_piece_records_where_it_computed(reference_study):
    # one study can be finished on several machines (a GPU lease, then this CPU): each piece says where it ran
    out, _ = reference_study
    db = sqlite3.connect(out / "study.sqlite")
    rows = dict(db.execute("SELECT key, value FROM manifest WHERE key LIKE 'placement:%'").fetchall())
    done = [r[0] for r in db.execute("SELECT id FROM pieces WHERE status = 'done'")]
    kinds = dict(db.execute("SELECT id, kind FROM pieces").fetchall())
    db.close()
    assert sorted(k.removeprefix("placement:") for k in rows) == sorted(done)
    for key, value in rows.items():
        where = json.loads(value)
        piece = key.removeprefix("placement:")
        assert where["device"] == "cpu" and where["dtype"] == "float32", (piece, where)  # a tiny model, no GPU
        assert where["hardware"].startswith(_cpu_model_name())
        if kinds[piece] == "eval":
            assert where["attn"] == "sdpa"  # the study's attn auto on a CPU
        if kinds[piece] == "train":
            assert where["precision"] == "fp32" and "attn" not in where
    # the report's header says it, and the manifest the report reads carries no per-piece keys
    from ropekit.study.store import StudyStore

    with StudyStore(out / "study.sqlite", create=False) as store:
        assert not any(k.startswith("placement:") for k in store.get_manifest())
    from ropekit.study.report import write_report

    report = tmp = out / "report-placement"
    write_report(out, tmp)
    md = (report / "summary.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("- **Computed in**"))
    evals, trains = sum(kinds[p] == "eval" for p in done), sum(kinds[p] == "train" for p in done)
    assert f"float32, sdpa attention, on {_cpu_model_name()}" in line and f": {evals} pieces (" in line
    # every evaluation sample carries it too (a piece resumed on another machine holds samples of both)
    db = sqlite3.connect(out / "study.sqlite")
    stamps = {r[0] for r in db.execute("SELECT json_extract(record, '$.computed_on') FROM samples")}
    db.close()
    assert len(stamps) == 1 and json.loads(stamps.pop())["dtype"] == "float32"
    assert f"float32 weights, trained in fp32, on {_cpu_model_name()}" in line and f": {trains} piece (pi-ft)" in line


def test_running_a_finished_study_again_recomputes_nothing(reference_study):
    out, _ = reference_study
    before = _dump(out / "study.sqlite")
    db = sqlite3.connect(out / "study.sqlite")
    finished = dict(db.execute("SELECT id, finished FROM pieces").fetchall())
    db.close()
    status = run_study(parse_study(SMALL), out, progress=False)
    assert status["by_status"]["done"] == 7
    db = sqlite3.connect(out / "study.sqlite")
    assert dict(db.execute("SELECT id, finished FROM pieces").fetchall()) == finished
    db.close()
    _assert_same(before, _dump(out / "study.sqlite"))


def test_two_worker_processes_give_the_same_database(reference_study, tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    ref_dir, _ = reference_study
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # as every CLI command does: the workers follow it
    try:
        status = run_study(parse_study(SMALL), tmp_path, workers=2, progress=False)
    finally:
        hf_logging.set_verbosity(before)
    # the tiny model's 64-token window is passed at 256 tokens: transformers' warning would say so, once per worker
    assert "maximum length" not in capfd.readouterr().err
    assert status["by_status"]["done"] == 7
    db = sqlite3.connect(tmp_path / "study.sqlite")
    workers = {w for (w,) in db.execute("SELECT worker FROM pieces")}
    db.close()
    # which process claims what depends on timing; no piece may have run twice or been lost
    assert 1 <= len(workers) <= 2 and None not in workers
    _assert_same(_dump(ref_dir / "study.sqlite"), _dump(tmp_path / "study.sqlite"))


def test_another_config_in_the_same_directory_is_refused(reference_study, run_cli, tmp_path):
    out, _ = reference_study
    other = {**SMALL, "evals": {"ppl": {"lengths": [64], "samples": 1}}}
    with pytest.raises(RopekitError, match="another configuration"):
        run_study(parse_study(other), out, progress=False)
    # from the command line: one line, before the study is announced, and the database is as it was
    config = tmp_path / "other.yaml"
    config.write_text(yaml.safe_dump(other))
    before = (out / "study.sqlite").read_bytes()
    code, _, stderr = run_cli("study", str(config), "--out", str(out))
    assert code == 2 and stderr.strip().count("\n") == 0 and "another configuration" in stderr, stderr
    assert (out / "study.sqlite").read_bytes() == before


def test_a_failing_piece_is_recorded_and_the_rest_goes_on(tmp_path):
    raw = {**SMALL, "variants": [{"label": "base"}, {"label": "se", "method": "self_extend", "params": {"group_size": 2, "window_size": 16}}],
           "evals": {"ppl": {"lengths": [64, 256], "samples": 1, "score_mode": "truncate"}}}
    raw.pop("recipe")
    status = run_study(parse_study(raw), tmp_path, progress=False)
    assert status["by_status"] == {"pending": 0, "running": 0, "done": 1, "failed": 1}
    # G·(C − W + ⌊W/G⌋) = 2·(64 − 16 + 8) = 112 on the 64-token window, below the 256 evaluated
    assert "length 256 exceeds what self_extend supports" in status["failed"][0]["error"]
    assert "(reach 112 tokens)" in status["failed"][0]["error"]


def _done_pieces(path) -> int | None:
    """Finished pieces in a study database being written by another process (None before it exists or while locked)."""
    if not path.is_file():
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.2)
        try:
            return db.execute("SELECT COUNT(*) FROM pieces WHERE status = 'done'").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return None


def _finished_pieces(path) -> int | None:
    """Finished pieces in a study database nobody is writing, recovering a killed writer's journal first."""
    if not path.is_file():
        return None
    db = sqlite3.connect(path, timeout=5)
    try:
        return db.execute("SELECT COUNT(*) FROM pieces WHERE status = 'done'").fetchone()[0]
    except sqlite3.OperationalError:  # killed before the schema was written
        return None
    finally:
        db.close()


def test_study_killed_at_random_moments_resumes_to_the_uninterrupted_result(reference_study, tmp_path):
    """SIGKILL the CLI at random moments until it finishes on its own; the database equals an uninterrupted run's."""
    ref_dir, _ = reference_study
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump(SMALL))
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "ropekit.cli", "study", str(config), "--out", str(out), "--no-report"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    rng = random.Random(1234)
    kills, mid_study = 0, 0
    for _attempt in range(12):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
        if kills < 6:
            # kill a moment after a random number of pieces is done (0: during start-up or the first piece), so
            # the kills land mid-study however fast this machine is
            target, extra = rng.randint(0, 6), rng.uniform(0.0, 0.4)
            deadline = time.monotonic() + 300
            while proc.poll() is None and time.monotonic() < deadline:
                done = _done_pieces(out / "study.sqlite")
                if done is not None and done >= target:
                    time.sleep(extra)
                    break
                time.sleep(0.05)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                kills += 1
                # the writer is dead: a plain connection rolls back its hot journal (a read-only one cannot)
                done = _finished_pieces(out / "study.sqlite")
                mid_study += done is not None and 0 < done < 7
                continue
        proc.wait(timeout=300)
        stderr = proc.stderr.read().decode()
        assert proc.returncode == 0, stderr[-2000:]
        break
    else:
        pytest.fail("the study never finished")
    assert mid_study >= 1, f"no kill landed between pieces' completion ({kills} kills): adjust the delays"
    _assert_same(_dump(ref_dir / "study.sqlite"), _dump(out / "study.sqlite"))


def _running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "\nState:\tZ" not in status


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads process states from /proc (Linux)")
def _study_with_claimed_pieces(tmp_path, stderr=subprocess.DEVNULL):
    """``ropekit study --workers 2`` of SMALL in its own session, once its workers have claimed pieces:
    ``(process, study dir, worker pids)``."""
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump(SMALL))
    out = tmp_path / "s"
    cmd = [sys.executable, "-m", "ropekit.cli", "study", str(config), "--out", str(out), "--no-report", "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, text=True, start_new_session=True)
    pids: set[int] = set()
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and not pids:
        if (out / "study.sqlite").exists():
            db = sqlite3.connect(out / "study.sqlite", timeout=10)
            try:
                workers = [w for (w,) in db.execute("SELECT worker FROM pieces WHERE status = 'running'")]
            except sqlite3.OperationalError:  # the store is being created
                workers = []
            db.close()
            pids = {int(w.rsplit(":", 1)[1]) for w in workers} - {proc.pid}
        time.sleep(0.05)
    return proc, out, pids


def test_worker_processes_stop_when_the_study_process_is_killed(tmp_path):
    """SIGKILL `ropekit study --workers 2` alone (not its process group): its workers stop too. Left running they
    went on claiming pieces and writing into the study directory beside the workers of the next run."""
    proc, out, pids = _study_with_claimed_pieces(tmp_path)
    try:
        assert pids and proc.poll() is None, "no worker claimed a piece"
        proc.kill()
        proc.wait()
        done = _finished_pieces(out / "study.sqlite")
        # the rest of the study takes several seconds more: workers that outlived their parent would still run
        # and finish pieces; stopped ones leave the store as it was
        time.sleep(3)
        assert not [p for p in pids if _running(p)], "workers outlived the study process"
        assert _finished_pieces(out / "study.sqlite") == done < 7
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group when the test failed
        except ProcessLookupError:
            pass


def test_sigterm_puts_the_running_pieces_back_and_stops_the_workers(tmp_path):
    """SIGTERM (a batch scheduler's stop, `kill`) takes Ctrl-C's path: the workers stop, their pieces are put back
    (none is left 'running'), the command says 'terminated' and exits 143 (resuming from there is the SIGKILL
    test's)."""
    proc, out, pids = _study_with_claimed_pieces(tmp_path, stderr=subprocess.PIPE)
    try:
        assert pids and proc.poll() is None, "no worker claimed a piece"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 143, stderr
        assert stderr.strip().splitlines()[-1] == "terminated" and "Traceback" not in stderr, stderr
        assert not [p for p in pids if _running(p)], "workers outlived the study process"
        db = sqlite3.connect(out / "study.sqlite")
        assert db.execute("SELECT COUNT(*) FROM pieces WHERE status = 'running'").fetchone()[0] == 0
        db.close()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_cli_study_status_show_and_errors(run_cli, reference_study, tmp_path):
    out, _ = reference_study
    code, stdout, _ = run_cli("study", "status", str(out))
    assert code == 0 and "7/7 pieces done" in stdout and "eval:passkey:pi-ft" in stdout
    code, stdout, _ = run_cli("study", "status", str(out), "--json")
    assert code == 0 and json.loads(stdout)["by_status"]["done"] == 7
    # what each piece stored, against the database counted directly
    db = sqlite3.connect(out / "study.sqlite")
    samples = dict(db.execute("SELECT piece, COUNT(*) FROM samples GROUP BY piece").fetchall())
    steps = dict(db.execute("SELECT piece, COUNT(*) FROM train_metrics GROUP BY piece").fetchall())
    ids = [i for (i,) in db.execute("SELECT id FROM pieces")]
    db.close()
    stored = json.loads(stdout)["stored"]
    assert stored == {i: {"samples": samples.get(i, 0), "train_steps": steps.get(i, 0)} for i in ids}
    assert any(v["samples"] for v in stored.values()) and any(v["train_steps"] for v in stored.values())
    code, stdout, _ = run_cli("study", "status", str(out))
    assert all(f"{v['samples']} samples" in stdout for v in stored.values() if v["samples"] and not v["train_steps"])
    assert all(f"{v['train_steps']} steps" in stdout for v in stored.values() if v["train_steps"])
    code, stdout, _ = run_cli("study", "--preset", "quick", "--show")
    assert code == 0 and yaml.safe_load(stdout)["name"] == "quick"
    code, _, stderr = run_cli("study", "status", str(tmp_path))
    assert code != 0 and "no study in" in stderr and "Traceback" not in stderr
    code, _, stderr = run_cli("study", "--preset", "nope")
    assert code != 0 and "unknown study preset" in stderr
    code, _, stderr = run_cli("study")
    assert code != 0 and "exactly one" in stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**SMALL, "model": str(tmp_path / "no-such-model")}))
    code, _, stderr = run_cli("study", str(bad), "--out", str(tmp_path / "never"))
    assert code != 0 and "does not exist" in stderr and not (tmp_path / "never").exists()


def test_a_search_variant_runs_longrope_search_and_evaluates_its_export(tmp_path):
    raw = {**SMALL, "variants": [{"label": "lr-search", "search": {"evaluations": 6, "documents": 1}}],
           "evals": {"ppl": {"lengths": [256], "samples": 1, "score_mode": "truncate"}}}
    raw.pop("recipe")
    cfg = parse_study(raw)
    assert [p.id for p in plan(cfg)] == ["search:lr-search", "eval:ppl:lr-search"]
    status = run_study(cfg, tmp_path, progress=False)
    assert status["by_status"]["done"] == 2, status["failed"]
    result = json.loads((tmp_path / "search" / "lr-search" / "result.json").read_text())
    assert result["evaluations"] == 6
    db = sqlite3.connect(tmp_path / "study.sqlite")
    (record,) = [json.loads(r) for (r,) in db.execute("SELECT record FROM samples")]
    seconds = db.execute("SELECT seconds FROM pieces WHERE id = 'search:lr-search'").fetchone()[0]
    db.close()
    assert record["method"] == "longrope" and record["params"]["long_factor"] == result["best"]["long_factor"]
    assert seconds > 0  # the search's cost is the piece's compute time


def test_a_search_runs_in_the_dtype_of_the_studys_evaluations(tmp_path):
    # the search's objective is the perplexity the study's evaluations measure: in a bfloat16 study (a GPU's
    # default for real models) it must search in bfloat16, not in a float32 copy on the CPU
    raw = {**SMALL, "dtype": "bfloat16",
           "variants": [{"label": "lr-search", "search": {"evaluations": 4, "documents": 1}}],
           "evals": {"ppl": {"lengths": [256], "samples": 1, "score_mode": "truncate"}}}
    raw.pop("recipe")
    status = run_study(parse_study(raw), tmp_path, progress=False)
    assert status["by_status"]["done"] == 2, status["failed"]
    saved = json.loads((tmp_path / "search" / "lr-search" / "model" / "config.json").read_text())
    assert saved["dtype"] == "bfloat16"


def test_a_search_variant_searches_start_tokens_among_the_given_values(tmp_path):
    raw = {**SMALL, "variants": [{"label": "lr-n", "search": {"evaluations": 6, "documents": 1,
                                                              "start_tokens": [0, 4, 16]}}],
           "evals": {"ppl": {"lengths": [256], "samples": 1, "score_mode": "truncate"}}}
    raw.pop("recipe")
    status = run_study(parse_study(raw), tmp_path, progress=False)
    assert status["by_status"]["done"] == 2, status["failed"]
    search = tmp_path / "search" / "lr-n"
    db = sqlite3.connect(search / "search.sqlite")
    (settings,) = db.execute("SELECT value FROM meta WHERE key = 'objective'").fetchone()
    candidates = [json.loads(r) for (r,) in db.execute("SELECT factors FROM candidates")]
    db.close()
    assert json.loads(settings)["start_tokens"] == [0, 4, 16]
    assert {c[-1] for c in candidates} <= {0, 4, 16}  # n̂ is every candidate's last gene, drawn from the list
    best = json.loads((search / "result.json").read_text())["best"]
    assert best["start_tokens"] in (0, 4, 16)


@pytest.mark.parametrize("variant, words", [
    ({"label": "s", "search": {"start_tokens": -1}}, "search.start_tokens"),
    ({"label": "s", "search": {"start_tokens": "some"}}, "search.start_tokens"),
    ({"label": "s", "search": {"start_tokens": [0, 4096]}}, "not fewer than target_length"),
    ({"label": "s", "method": "yarn", "search": True}, "searches LongRoPE factors"),
    ({"label": "s", "search": True, "params": {"factor": 2}}, "the search finds the factors"),
    ({"label": "s", "search": {"evaluations": 2}}, "search.evaluations"),
    ({"label": "s", "search": {"budget": 8}}, "unknown key"),
])
def test_bad_search_variants_are_one_line(variant, words):
    with pytest.raises(RopekitError, match=words):
        parse_study({**SMALL, "variants": [variant]})


def test_placement_and_resources_are_checked_and_not_part_of_the_studys_identity():
    cfg = parse_study({**SMALL, "device": "cuda:1", "dtype": "bfloat16", "attn": "sdpa",
                       "resources": {"train": {"gpus": 8}, "eval": {"gpus": 1, "cpus": 4}}})
    assert (cfg.device, cfg.dtype, cfg.attn) == ("cuda:1", "bfloat16", "sdpa")
    assert cfg.resources == {"train": {"gpus": 8.0}, "eval": {"gpus": 1.0, "cpus": 4.0}}
    assert cfg.as_dict() == parse_study(SMALL).as_dict()  # moving a study to a GPU does not make it another study
    assert parse_study(cfg.as_dict(placement=True)).resources == cfg.resources
    for key, value, words in (("device", "gpu", "device"), ("dtype", "fp8", "dtype"), ("attn", "flash", "attn"),
                              ("resources", {"training": {"gpus": 1}}, "unknown key"),
                              ("resources", {"eval": {"gpus": -1}}, "resources.eval.gpus")):
        with pytest.raises(RopekitError, match=words):
            parse_study({**SMALL, key: value})


def test_base_model_is_loaded_once_per_process_and_each_piece_gets_a_private_copy(tmp_path, monkeypatch):
    """Pieces share one load of the base model; a method installed into one piece's copy never reaches the next."""
    import torch

    import ropekit
    from ropekit.models.loading import load_model
    from ropekit.study import pieces
    from ropekit.study.store import StudyStore

    config = parse_study(SMALL)
    store = StudyStore(tmp_path / "study.sqlite")
    loads = []
    real = pieces.load_model
    monkeypatch.setattr(pieces, "load_model", lambda *a, **k: loads.append(a) or real(*a, **k))
    pieces._BASE_MODELS.clear()
    first, _ = pieces._load_base(config, store)
    ropekit.extend(first, "yarn", factor=4)
    second, _ = pieces._load_base(config, store)
    assert len(loads) == 1 and first is not second
    fresh = load_model("tiny", device="cpu").model
    ids = torch.arange(200).unsqueeze(0) % fresh.config.vocab_size
    with torch.no_grad():
        assert torch.equal(second(input_ids=ids).logits, fresh(input_ids=ids).logits)
        assert not torch.equal(first(input_ids=ids).logits, fresh(input_ids=ids).logits)


def test_an_uncached_hub_model_offline_is_refused_before_the_study_directory_exists(run_cli, tmp_path, monkeypatch):
    """Offline, a hub id that is not in the local cache is one line and exit 2 before anything is written (the study
    directory used to be created and every piece marked failed)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    raw = {**SMALL, "model": "ropekit-tests/certainly-not-cached-model-0", "variants": [{"label": "base"}],
           "evals": {"passkey": {"lengths": [64], "trials": 1, "depths": [0.5]}}}
    raw.pop("recipe")
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(raw))
    code, _, stderr = run_cli("study", str(config), "--out", str(tmp_path / "never"))
    assert code == 2 and stderr.strip().count("\n") == 0 and "offline" in stderr, stderr
    assert "certainly-not-cached-model-0" in stderr and not (tmp_path / "never").exists()


def test_a_missing_eval_data_file_is_refused_up_front_unless_its_pieces_are_done(run_cli, tmp_path):
    """An evaluation whose data file is missing is refused before anything is written (one line, exit 2), not
    failed when its piece's turn comes; once its pieces are done the file is no longer needed."""
    data = tmp_path / "docs.jsonl"
    raw = {**SMALL, "variants": [{"label": "base"}, {"label": "pi", "method": "pi", "params": {"factor": 4}}],
           "evals": {"ppl": {"lengths": [64], "samples": 2, "score_mode": "truncate", "data": str(data)}}}
    raw.pop("recipe")
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(raw))
    code, stdout, stderr = run_cli("study", str(config), "--out", str(tmp_path / "never"))
    assert code == 2 and stderr.strip().count("\n") == 0 and "Traceback" not in stderr
    assert f"evaluation 'ppl' reads '{data}', which does not exist" in stderr and not (tmp_path / "never").exists()
    data.write_text("")  # an empty file could only fail its pieces: refused the same way
    code, stdout, stderr = run_cli("study", str(config), "--out", str(tmp_path / "never"))
    assert code == 2 and stderr.strip().count("\n") == 0 and "Traceback" not in stderr
    assert f"evaluation 'ppl' reads '{data}', which is empty" in stderr and not (tmp_path / "never").exists()
    data.write_text("".join(json.dumps({"text": f"document {i}: " + "the quick brown fox jumps. " * 40}) + "\n"
                            for i in range(2)))
    pieces = len(plan(parse_study(raw)))  # the base model's and PI's ppl
    status = run_study(parse_study(raw), tmp_path / "out", progress=False)
    assert pieces == 2 and status["by_status"]["done"] == pieces and status["by_status"]["failed"] == 0
    data.unlink()
    again = run_study(parse_study(raw), tmp_path / "out", progress=False)  # every ppl piece is done: accepted
    assert again["by_status"]["done"] == pieces


def test_a_missing_training_data_file_is_refused_up_front_naming_the_variant(run_cli, tmp_path):
    """A variant's fine-tuning data that does not exist is one line before anything is written (it was a failed
    piece, exit 1, after the other pieces had run), as `ropekit train` refuses it."""
    raw = copy.deepcopy(SMALL)
    raw["variants"] = [{"label": "base"}, {"label": "pi-ft", "method": "pi", "params": {"factor": 4},
                                           "finetune": {"data": {"sources": [{"path": str(tmp_path / "nope.txt")}]}}}]
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(raw))
    code, _, stderr = run_cli("study", str(config), "--out", str(tmp_path / "never"))
    assert code == 2 and "Traceback" not in stderr and not (tmp_path / "never").exists()
    assert f"variant 'pi-ft': data source '{tmp_path / 'nope.txt'}' does not exist" in stderr


def test_a_trained_model_missing_on_this_machine_is_refused_found_when_moved_and_retrained_on_request(run_cli, tmp_path):
    """A study continued elsewhere from its database alone: a finished training whose model is not here, with an
    evaluation of it unfinished, is refused up front (one line, exit 2, the database untouched) instead of failing
    that piece hours in; a study directory moved with its runs finds the model at its new place; --retrain LABEL
    trains it again and redoes every evaluation of it, so no variant mixes two trainings."""
    import shutil

    from ropekit.study.store import open_study

    raw = {**SMALL, "variants": [{"label": "base"}, {"label": "pi-ft", "method": "pi", "params": {"factor": 4},
                                                     "finetune": True}],
           "evals": {"ppl": {"lengths": [64], "samples": 2, "score_mode": "truncate"},
                     "passkey": {"lengths": [256], "depths": [0.5], "trials": 1}}}
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(raw))
    first = tmp_path / "first"
    status = run_study(parse_study(raw), first, progress=False)
    assert status["by_status"]["done"] == 5 and status["by_status"]["failed"] == 0
    reference = _dump(first / "study.sqlite")
    store = open_study(first)
    store.reset_piece("eval:passkey:pi-ft")  # the run stopped before this evaluation
    store.close()

    # "another machine": the whole directory moved (runs included), or the database alone
    moved, elsewhere = tmp_path / "moved", tmp_path / "elsewhere"
    shutil.copytree(first, moved)
    elsewhere.mkdir()
    shutil.copy(first / "study.sqlite", elsewhere / "study.sqlite")
    shutil.rmtree(first)  # the recorded path of the trained model is gone

    # the database alone: refused before anything is written
    before = _dump(elsewhere / "study.sqlite")
    code, stdout, stderr = run_cli("study", str(config), "--out", str(elsewhere), "--no-report")
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, stderr
    assert "the model 'train:pi-ft' produced" in lines[0] and "1 of its 2 evaluations is unfinished" in lines[0]
    assert "--retrain pi-ft" in lines[0] and "its finished evaluation is redone" in lines[0]
    assert _dump(elsewhere / "study.sqlite") == before and sorted(p.name for p in elsewhere.iterdir()) == ["study.sqlite"]
    # an unknown or frozen variant is one line too
    for label, words in (("base", "not a fine-tuned or searched variant"), ("nope", "choose among: pi-ft")):
        code, _, stderr = run_cli("study", str(config), "--out", str(elsewhere), "--retrain", label, "--no-report")
        assert code == 2 and len(stderr.strip().splitlines()) == 1 and words in stderr, stderr
    assert _dump(elsewhere / "study.sqlite") == before

    # the directory moved with its runs: the model is found in its new place
    status = run_study(parse_study(raw), moved, progress=False)
    assert status["by_status"]["done"] == 5 and status["by_status"]["failed"] == 0
    _assert_same(_dump(moved / "study.sqlite"), reference)  # the same trained model scored the passkey

    # --retrain: the training and both of its evaluations start again; the same seed trains the same model here
    code, stdout, stderr = run_cli("study", str(config), "--out", str(elsewhere), "--retrain", "pi-ft", "--no-report")
    assert code == 0, stderr
    assert "retrain pi-ft: train:pi-ft, eval:passkey:pi-ft, eval:ppl:pi-ft start again (2 samples forgotten)" in stderr
    again = _dump(elsewhere / "study.sqlite")
    assert set(again["pieces_status"]) == {"done"}
    _assert_same(again, reference)
    store = open_study(elsewhere)
    assert [a["path"] for a in store.artifacts("train:pi-ft")] == [str(elsewhere / "runs" / "pi-ft" / "final")]
    store.close()
    # the same command again (after an interruption, say): the model is here now, so nothing is redone
    code, _, stderr = run_cli("study", str(config), "--out", str(elsewhere), "--retrain", "pi-ft", "--no-report")
    assert code == 0 and "retrain pi-ft: nothing to redo" in stderr, stderr
    _assert_same(_dump(elsewhere / "study.sqlite"), again)


def test_only_runs_the_pieces_of_some_variants_now_and_the_rest_later(reference_study, run_cli, tmp_path, monkeypatch):
    """--only LABEL: that variant's training and evaluations (and the base model they start from) run now, in two
    worker processes too; the rest waits for a later run, and the two runs together give the uninterrupted result."""
    ref_dir, _ = reference_study
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump(SMALL))
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("study", str(config), "--out", str(out), "--only", "pi-ft", "--workers", "2",
                                   "--no-report", "--json")
    assert code == 0, stderr
    assert "(now only: pi-ft)" in stderr
    status = json.loads(stdout)
    assert status["pieces"] == 3 and status["by_status"]["done"] == 3  # train:pi-ft and its two evaluations
    db = sqlite3.connect(out / "study.sqlite")
    done = {i for (i,) in db.execute("SELECT id FROM pieces WHERE status = 'done'")}
    db.close()
    assert done == {"train:pi-ft", "eval:ppl:pi-ft", "eval:passkey:pi-ft"}
    # a piece left "running" by a worker that has ended (a run killed with SIGTERM) is released when a run starts,
    # even outside its selection: no display shows it running
    from ropekit.study.store import _this_worker, open_study

    store = open_study(out)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert store.begin_piece("eval:ppl:base", worker=f"{_this_worker().rpartition(':')[0]}:{dead.pid}")
    store.close()
    code, stdout, _ = run_cli("study", "status", str(out))  # status reads, never writes: it says so
    assert code == 0 and "1 running (of them 1 with no live worker)" in " ".join(stdout.split())
    # a piece whose worker lives (this process) says how long it has been running
    from ropekit.cli.common import out as console
    from ropekit.study import store as store_module

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    worker = f"{_this_worker().rpartition(':')[0]}:{live.pid}"
    try:
        store = open_study(out)
        assert store.begin_piece("eval:passkey:base", worker=worker)
        store.close()
        later = datetime.now(timezone.utc) + timedelta(hours=2, minutes=3)  # the clock when status is asked
        monkeypatch.setattr(store_module, "now_iso", lambda: later.isoformat(timespec="milliseconds"))
        monkeypatch.setattr(console, "width", 200)  # one table row a line
        code, stdout, _ = run_cli("study", "status", str(out))
    finally:
        live.kill()
        live.wait()
    row = next(line for line in stdout.splitlines() if "eval:passkey:base" in line)
    assert code == 0 and f"{worker}, running for 2h 03m" in row, row
    monkeypatch.undo()
    store = open_study(out)
    store.release_piece("eval:passkey:base")
    store.close()
    code, stdout, _ = run_cli("study", "status", str(out), "--json")
    assert json.loads(stdout)["abandoned"] == ["eval:ppl:base"]
    run_study(parse_study(SMALL), out, progress=False, only=["pi-ft"])
    db = sqlite3.connect(out / "study.sqlite")
    assert db.execute("SELECT status FROM pieces WHERE id = 'eval:ppl:base'").fetchone()[0] == "pending"
    db.close()
    status = run_study(parse_study(SMALL), out, progress=False, only=["base", "pi"])
    assert status["pieces"] == 4 and status["by_status"]["done"] == 4
    _assert_same(_dump(ref_dir / "study.sqlite"), _dump(out / "study.sqlite"))
    # an unknown label: one line before anything is written
    code, _, stderr = run_cli("study", str(config), "--out", str(tmp_path / "never"), "--only", "pi,nope")
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "--only nope" in stderr
    assert "choose among: base, pi, pi-ft" in stderr and not (tmp_path / "never").exists()


def _trained_pi_ft(run_cli, tmp_path, *more_variants):
    """A SMALL study of base, pi-ft and ``more_variants`` with pi-ft alone run (trained and evaluated):
    ``(its config dict, the config file, the study directory, the run's stderr)``."""
    raw = {**SMALL, "variants": [{"label": "base"},
                                 {"label": "pi-ft", "method": "pi", "params": {"factor": 4}, "finetune": True},
                                 *more_variants],
           "evals": {"ppl": {"lengths": [64], "samples": 1, "score_mode": "truncate"}}}
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    code, _, stderr = run_cli("study", str(config), "--out", str(out), "--only", "pi-ft", "--no-report")
    assert code == 0, stderr
    return raw, config, out, stderr


def test_a_training_found_finished_after_a_crash_keeps_its_placement_and_cost(run_cli, tmp_path):
    """A study killed after a training exported its model but before the store recorded it: the rerun finds the run
    finished and records where it trained from the run's own record (not this machine), and its cost from the
    steps' logged time (not the seconds the rerun spent finding it)."""
    from ropekit.train.export import FINAL_DIR, TRAIN_INFO

    raw, config, out, stderr = _trained_pi_ft(run_cli, tmp_path)
    db = sqlite3.connect(out / "study.sqlite")
    (first,) = db.execute("SELECT value FROM manifest WHERE key = 'placement:train:pi-ft'").fetchone()
    assert json.loads(first)["hardware"].startswith(_cpu_model_name())
    # the crash: the export is on disk, the store never heard of it; the run trained on another machine
    info_path = next(out.rglob(f"pi-ft*/{FINAL_DIR}/{TRAIN_INFO}"))
    info = json.loads(info_path.read_text())
    assert info["trained_on"]["device"] == "cpu"
    info_path.write_text(json.dumps({**info, "trained_on": {"device": "cuda:0", "hardware": "NVIDIA H200"}}))
    db.execute("UPDATE pieces SET status = 'pending', started = NULL, finished = NULL, seconds = NULL "
               "WHERE id = 'train:pi-ft'")
    db.execute("DELETE FROM manifest WHERE key = 'placement:train:pi-ft'")
    db.execute("DELETE FROM train_metrics WHERE piece = 'train:pi-ft'")
    db.commit()
    db.close()
    steps = [json.loads(line) for line in (info_path.parent.parent / "metrics.jsonl").read_text().splitlines() if line]
    code, _, stderr = run_cli("study", str(config), "--out", str(out), "--only", "pi-ft", "--no-report")
    assert code == 0, stderr
    db = sqlite3.connect(out / "study.sqlite")
    (value,) = db.execute("SELECT value FROM manifest WHERE key = 'placement:train:pi-ft'").fetchone()
    (status, seconds) = db.execute("SELECT status, seconds FROM pieces WHERE id = 'train:pi-ft'").fetchone()
    (logged,) = db.execute("SELECT count(*) FROM train_metrics WHERE piece = 'train:pi-ft'").fetchone()
    db.close()
    where = json.loads(value)
    assert status == "done" and where["device"] == "cuda:0" and where["hardware"] == "NVIDIA H200"
    assert where["dtype"] == "float32" and where["precision"] == "fp32"
    assert logged == len(steps) == raw["recipe"]["train"]["max_steps"]
    assert seconds >= sum(row["seconds"] for row in steps) > 0


def test_trainings_on_another_pythons_builtin_corpus_are_called_out(run_cli, tmp_path):
    """The built-in training split is the running Python's standard library: a training records which one it read,
    and a study continued where the trainings still to run would read another says so in one line (the comparison
    would mix two data sets); on the same machine nothing is said."""
    from ropekit.data.local_text import corpus_digest, stdlib_documents
    from ropekit.data.training_data import BUILTIN_MAX_BYTES
    from ropekit.study.store import open_study

    _, config, out, stderr = _trained_pi_ft(run_cli, tmp_path, {"label": "yarn-ft", "method": "yarn",
                                                                 "params": {"factor": 4}, "finetune": True})
    assert "warning" not in stderr, stderr
    store = open_study(out)
    recorded = store.placements()["train:pi-ft"]["corpus"]
    store.close()
    assert recorded == corpus_digest(stdlib_documents(BUILTIN_MAX_BYTES, "train"))
    # pi-ft trained on another machine's Python: its recorded corpus differs from this one's
    db = sqlite3.connect(out / "study.sqlite")
    key = "placement:train:pi-ft"
    (value,) = db.execute("SELECT value FROM manifest WHERE key = ?", (key,)).fetchone()
    db.execute("UPDATE manifest SET value = ? WHERE key = ?", (json.dumps({**json.loads(value), "corpus": "0123456789abcdef"}), key))
    db.commit()
    db.close()
    code, _, stderr = run_cli("study", str(config), "--out", str(out), "--no-report")
    warned = [line for line in stderr.splitlines() if "warning" in line]
    assert code == 0 and len(warned) == 1, stderr
    assert "train:pi-ft trained on (0123456789abcdef)" in warned[0] and f"corpus {recorded}" in warned[0]
    assert "yarn-ft will train on other documents" in warned[0]
    # nothing left to train: nothing to say
    code, _, stderr = run_cli("study", str(config), "--out", str(out), "--no-report")
    assert code == 0 and "warning" not in stderr, stderr


def test_several_workers_show_each_running_piece_with_its_count(tmp_path):
    """With worker processes the study's line names every running piece with the sample (or step) count its
    worker sends, so a piece that takes hours does not show its name alone; a worker sends at most one count a
    second, and always the last."""
    import multiprocessing

    from ropekit.study import runner

    config = parse_study(SMALL)
    store = runner.initialize(tmp_path, config)
    first, second = [p for p in plan(config) if p.kind == "eval"][:2]
    for piece in (first, second):
        assert store.begin_piece(piece.id, kind=piece.kind, method=piece.label, params=piece.params, task=piece.task)
    queue = multiprocessing.get_context("spawn").Queue()
    on_piece, on_progress = runner._progress_sender(queue, every=60.0)
    on_piece(first)
    for n in (1, 2, 3):  # within the minute only the first count goes out
        on_progress(n, 8)
    on_progress(8, 8)  # the last one always does
    on_piece(second)
    on_progress(5, None)

    class Proc:  # alive for two polls of the display
        exitcode = None  # as multiprocessing.Process's while it runs

        def __init__(self):
            self.polls = iter([True, True, False])

        def is_alive(self):
            return next(self.polls, False)

        def join(self):
            pass

    class Bar:
        def __init__(self):
            self.infos = []

        def update(self, **fields):
            self.infos.append(fields.get("info"))

        def log(self, text):
            pass

    time.sleep(0.5)  # the queue's feeder thread delivers
    bar = Bar()
    runner._watch_workers([Proc()], store, bar, config, lambda: 0, queue)
    store.close()
    assert bar.infos[-1] == f"{first.id} 8/8, {second.id} 5/?"
    assert runner.running_text([first.id], {}) == first.id  # nothing sent yet: the name alone
    # what went through the queue: the first count of the minute and the last, not the ones between
    import queue as queue_module

    sent = multiprocessing.get_context("spawn").Queue()
    on_piece, on_progress = runner._progress_sender(sent, every=60.0)
    on_piece(first)
    for n in (1, 2, 3, 8):
        on_progress(n, 8)
    assert [sent.get(timeout=5) for _ in range(2)] == [(first.id, 1, 8), (first.id, 8, 8)]
    with pytest.raises(queue_module.Empty):
        sent.get(timeout=0.5)


def test_a_count_held_back_is_sent_when_its_second_is_over():
    """A resumed evaluation skips its finished samples in a burst, then computes one sample for minutes: the
    burst's last count reaches the display a second later, not when that sample ends."""
    import multiprocessing
    import queue as queue_module

    from ropekit.study import runner

    piece = next(p for p in plan(parse_study(SMALL)) if p.kind == "eval")
    sent = multiprocessing.get_context("spawn").Queue()
    on_piece, on_progress = runner._progress_sender(sent, every=0.4)
    on_piece(piece)
    for n in range(72):  # 0 (the total is set) then 71 finished samples skipped at once
        on_progress(n, 80)
    assert sent.get(timeout=5) == (piece.id, 0, 80)
    start = time.monotonic()
    assert sent.get(timeout=5) == (piece.id, 71, 80)  # nothing else is called: the timer sent it
    assert 0.2 < time.monotonic() - start < 3.0
    with pytest.raises(queue_module.Empty):
        sent.get(timeout=0.8)  # once
    on_progress(72, 80)  # a second later: at once
    assert sent.get(timeout=5) == (piece.id, 72, 80)
    on_progress(73, 80)  # held, then the next piece begins: the old piece's count is dropped
    on_piece(piece)
    with pytest.raises(queue_module.Empty):
        sent.get(timeout=0.8)


def test_a_recipe_with_an_ema_has_its_variants_evaluated_with_the_averaged_weights(run_cli, tmp_path):
    """``train.ema`` in the recipe: the EMA model (``runs/LABEL/final-ema``) is the one the study records and scores,
    checked against ``ropekit eval ppl`` run on each exported model; a directory moved with its runs finds it."""
    import shutil

    from ropekit.study.store import open_study

    recipe = copy.deepcopy(SMALL["recipe"])
    recipe["train"]["ema"] = {"decay": 0.5, "every": 1}  # far from the last step's weights after 6 steps
    raw = {**SMALL, "recipe": recipe,
           "variants": [{"label": "pi-ft", "method": "pi", "params": {"factor": 4}, "finetune": True}],
           "evals": {"ppl": {"lengths": [64], "samples": 2, "score_mode": "truncate"}}}
    first = tmp_path / "first"
    status = run_study(parse_study(raw), first, progress=False)
    assert status["by_status"]["done"] == 2 and status["by_status"]["failed"] == 0
    store = open_study(first)
    assert [a["path"] for a in store.artifacts("train:pi-ft")] == [str(first / "runs" / "pi-ft" / "final-ema")]
    studied = sorted(s["ppl"] for s in store.samples(piece="eval:ppl:pi-ft"))
    store.close()

    def scores(model_dir):
        out = tmp_path / f"{model_dir.name}.jsonl"
        code, _, stderr = run_cli("eval", "ppl", str(model_dir), "--lengths", "64", "--samples", "2",
                                  "--score-mode", "truncate", "--dtype", "float32", "--out", str(out))
        assert code == 0, stderr
        return sorted(json.loads(line)["ppl"] for line in out.read_text().splitlines() if line.strip())

    averaged, last = scores(first / "runs" / "pi-ft" / "final-ema"), scores(first / "runs" / "pi-ft" / "final")
    assert max(abs(a - b) for a, b in zip(averaged, last)) > 1e-3  # the two models do differ
    assert studied == pytest.approx(averaged, rel=1e-5)

    # moved with its runs, the evaluation redone: the EMA model is found at its new place
    moved = tmp_path / "moved"
    shutil.copytree(first, moved)
    shutil.rmtree(first)
    store = open_study(moved)
    store.reset_piece("eval:ppl:pi-ft")
    store.close()
    status = run_study(parse_study(raw), moved, progress=False)
    assert status["by_status"]["done"] == 2 and status["by_status"]["failed"] == 0
    store = open_study(moved)
    assert sorted(s["ppl"] for s in store.samples(piece="eval:ppl:pi-ft")) == pytest.approx(averaged, rel=1e-5)
    store.close()
