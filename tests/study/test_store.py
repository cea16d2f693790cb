"""The study's SQLite store: round trip, atomic pieces under a real crash, concurrent writers, status counts,
claims, schema checks, and the RecordWriter adapter an evaluation task writes through."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import sqlite3

import pytest

from ropekit.errors import RopekitError
from ropekit.eval.common import EvalContext
from ropekit.study.store import (
    Piece,
    StoreRecordWriter,
    StudyStore,
    key_fields_for,
    parse_piece_id,
    placement_groups,
    placement_label,
    placement_text,
    sample_key,
)

PASSKEY_KEYS = ("task", "method", "params", "length", "depth", "trial")


def passkey_record(method="plain", length=64, depth=0.5, trial=0, score=1.0, **extra):
    return {"task": "passkey", "method": method, "params": {}, "length": length, "depth": depth, "trial": trial,
            "score": score, "prediction": "123", "seconds": 0.01, **extra}


@pytest.fixture
def store(tmp_path):
    with StudyStore(tmp_path / "s" / "study.sqlite") as st:
        yield st


def test_round_trip_manifest_pieces_samples_metrics_artifacts(store, tmp_path):
    assert store.journal_mode == "wal"
    store.initialize("demo", {"methods": ["yarn"], "lengths": [64]}, seeds=[0, 1], window=64, target_length=256)
    m = store.get_manifest()
    assert m["name"] == "demo" and m["config"] == {"methods": ["yarn"], "lengths": [64]} and m["seeds"] == [0, 1]
    assert m["window"] == 64 and m["target_length"] == 256 and m["schema_version"] == 1
    assert set(m["versions"]) == {"ropekit", "torch", "transformers"} and m["versions"]["ropekit"]
    assert isinstance(m["machine"]["cores"], int) and m["machine"]["python"] and m["machine"]["os"]
    assert m["created"] <= m["updated"]
    assert store.get_manifest("missing", 7) == 7
    store.initialize("demo", {"methods": ["yarn"], "lengths": [64]})  # same config: fine
    with pytest.raises(RopekitError, match="another configuration"):
        store.initialize("demo", {"methods": ["pi"]})

    assert store.begin_piece("eval:passkey:yarn", params={"factor": 4}) is True
    records = [passkey_record("yarn", depth=d, trial=t, score=float(t == 0), params={"factor": 4.0})
               for d in (0.0, 1.0) for t in (0, 1)]
    assert store.finish_piece("eval:passkey:yarn", records) == 4  # key fields from the passkey module
    assert store.is_done("eval:passkey:yarn")
    assert store.samples(task="passkey") == records
    assert store.samples(method="yarn", task="ppl") == []
    piece = store.pieces()[0]
    assert (piece["kind"], piece["method"], piece["task"], piece["params"], piece["status"]) == \
        ("eval", "yarn", "passkey", {"factor": 4}, "done")
    assert piece["seconds"] >= 0 and piece["attempts"] == 1 and piece["worker"].endswith(f":{os.getpid()}")
    scores = [r[0] for r in sqlite3.connect(store.path).execute("SELECT score FROM samples ORDER BY id")]
    assert scores == [1.0, 0.0, 1.0, 0.0]

    store.begin_piece("train:yarn")
    store.add_metrics("train:yarn", [{"step": 0, "loss": 5.0, "lr": 1e-3}, {"step": 10, "loss": 4.0, "lr": 1e-3}])
    store.finish_piece("train:yarn", metrics=[{"step": 10, "loss": 3.5, "lr": 5e-4, "tokens": 640}],
                       artifacts={"checkpoint": tmp_path / "ckpt"})
    steps = store.train_metrics("train:yarn")
    assert [(s["step"], s["loss"], s["method"]) for s in steps] == [(0, 5.0, "yarn"), (10, 3.5, "yarn")]  # step 10 replaced
    assert store.artifacts() == [{"piece": "train:yarn", "name": "checkpoint", "path": str(tmp_path / "ckpt"),
                                  "created": store.artifacts()[0]["created"]}]


def test_piece_ids_and_key_fields():
    assert parse_piece_id("eval:passkey:yarn") == Piece("eval:passkey:yarn", "eval", "yarn", {}, "passkey")
    assert parse_piece_id("eval:speed") == Piece("eval:speed", "eval", None, {}, "speed")
    assert parse_piece_id("train:yarn:v2") == Piece("train:yarn:v2", "train", "yarn:v2", {}, None)
    for bad in ("yarn", "fit:yarn", "train:"):
        with pytest.raises(RopekitError):
            parse_piece_id(bad)
    assert key_fields_for("passkey") == PASSKEY_KEYS
    assert key_fields_for("speed") == ("task", "method", "params", "length", "repeat")
    # the key is what identifies the sample, not its measurements
    assert sample_key(passkey_record(score=1.0), PASSKEY_KEYS) == sample_key(passkey_record(score=0.0), PASSKEY_KEYS)
    assert sample_key(passkey_record(trial=0), PASSKEY_KEYS) != sample_key(passkey_record(trial=1), PASSKEY_KEYS)


def test_method_label_of_the_piece_names_the_samples(store):
    store.begin_piece("eval:passkey:yarn-ft", method="yarn-ft")
    store.finish_piece("eval:passkey:yarn-ft", [passkey_record("yarn")], key_fields=PASSKEY_KEYS)
    got = store.samples(method="yarn-ft")
    assert got[0]["method"] == "yarn-ft" and got[0]["eval_method"] == "yarn"
    assert store.samples(raw=True)[0]["method"] == "yarn"
    # one speed piece holds every method: the records' own labels
    store.begin_piece("eval:speed")
    store.finish_piece("eval:speed", [{"task": "speed", "method": m, "params": {}, "length": 64, "repeat": 0, "prefill_s": 1.0}
                                      for m in ("plain", "yarn")])
    assert [r["method"] for r in store.samples(task="speed")] == ["plain", "yarn"]


def test_invalid_records_roll_back_the_whole_call(store):
    store.begin_piece("eval:passkey:plain")
    bad = [passkey_record(trial=0), passkey_record(trial=1, score=1.5), passkey_record(trial=2)]
    with pytest.raises(RopekitError, match="not a number in \\[0, 1\\]"):
        store.finish_piece("eval:passkey:plain", bad, key_fields=PASSKEY_KEYS)
    assert store.samples() == [] and not store.is_done("eval:passkey:plain")
    with pytest.raises(RopekitError, match="of task 'passkey'"):
        store.add_samples("eval:passkey:plain", [{**passkey_record(), "task": "niah"}], key_fields=PASSKEY_KEYS)
    with pytest.raises(RopekitError, match="not in the study"):
        store.finish_piece("eval:passkey:nobody", [])


def _crash_in_finish(path, records):
    """Child: stream two samples, then die (os._exit, no cleanup) halfway through finish_piece's transaction."""
    st = StudyStore(path)
    st.begin_piece("eval:passkey:plain")
    st.add_samples("eval:passkey:plain", records[:2], key_fields=PASSKEY_KEYS)

    def stream():
        yield from records[2:4]
        os._exit(3)

    st.finish_piece("eval:passkey:plain", stream(), key_fields=PASSKEY_KEYS)


def test_crash_between_sample_writes_and_finish_leaves_piece_resumable(store):
    records = [passkey_record(trial=t, score=float(t % 2)) for t in range(5)]
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_crash_in_finish, args=(str(store.path), records))
    child.start()
    child.join(30)
    assert child.exitcode == 3
    reopened = StudyStore(store.path)
    assert not reopened.is_done("eval:passkey:plain")
    assert reopened.status()["by_status"]["running"] == 1
    # the streamed samples survived, the half-written finish did not
    assert reopened.done_keys("eval:passkey:plain") == {sample_key(r, PASSKEY_KEYS) for r in records[:2]}
    # the dead worker's claim is taken over; the resumed run writes only what is missing, then finishes
    assert reopened.begin_piece("eval:passkey:plain") is True
    todo = [r for r in records if sample_key(r, PASSKEY_KEYS) not in reopened.done_keys("eval:passkey:plain")]
    assert todo == records[2:]
    reopened.finish_piece("eval:passkey:plain", todo, key_fields=PASSKEY_KEYS)
    assert reopened.is_done("eval:passkey:plain") and reopened.samples() == records
    # a done piece is not claimed again, and writing its samples again never duplicates them
    assert reopened.begin_piece("eval:passkey:plain") is False
    reopened.finish_piece("eval:passkey:plain", records, key_fields=PASSKEY_KEYS)
    reopened.add_samples("eval:passkey:plain", records[:3], key_fields=PASSKEY_KEYS)
    assert len(reopened.samples()) == 5
    assert reopened.pieces()[0]["attempts"] == 2
    reopened.close()


def _writer(path, name, n, barrier, claims):
    barrier.wait()
    fresh = StudyStore(os.path.join(os.path.dirname(path), "fresh", "study.sqlite"))  # both create it at once
    fresh.register(f"eval:passkey:{name}")
    fresh.close()
    st = StudyStore(path, timeout=30)
    own = f"eval:passkey:{name}"
    st.begin_piece(own)
    barrier.wait()
    claims.put((name, st.begin_piece("eval:niah:contested")))
    for t in range(n):  # interleaved single-sample transactions into one's own piece and a shared one
        st.add_samples(own, [passkey_record(name, trial=t)], key_fields=PASSKEY_KEYS)
        st.add_samples("eval:passkey:shared", [passkey_record("shared", trial=t, score=float(name == "a"))], key_fields=PASSKEY_KEYS)
    st.finish_piece(own)
    barrier.wait()  # stay alive until both claims were made, so the loser saw a live owner
    st.close()


def test_two_processes_write_concurrently_without_loss(store):
    store.register("eval:passkey:shared")
    store.close()
    ctx = multiprocessing.get_context("fork")
    barrier, claims = ctx.Barrier(2), ctx.Queue()
    n = 40
    procs = [ctx.Process(target=_writer, args=(str(store.path), name, n, barrier, claims)) for name in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    won = dict(claims.get(timeout=5) for _ in procs)
    assert sorted(won.values()) == [False, True]  # exactly one worker claimed the contested piece
    st = StudyStore(store.path)
    assert len(st.samples(method="a")) == n and len(st.samples(method="b")) == n
    assert [r["trial"] for r in st.samples(method="a")] == list(range(n))
    assert len(st.samples(method="shared")) == n  # both wrote the same keys: stored once each
    assert st.is_done("eval:passkey:a") and st.is_done("eval:passkey:b")
    st.close()
    with StudyStore(store.path.parent / "fresh") as fresh:
        assert sorted(p["id"] for p in fresh.pieces()) == ["eval:passkey:a", "eval:passkey:b"]


def test_status_counts_and_pending(store):
    specs = [Piece("train:yarn", "train", "yarn"), Piece("train:pi", "train", "pi"),
             Piece("eval:passkey:yarn", "eval", "yarn", {}, "passkey"), Piece("eval:passkey:pi", "eval", "pi", {}, "passkey"),
             Piece("eval:ppl:yarn", "eval", "yarn", {}, "ppl")]
    assert store.pending(specs) == [s.id for s in specs]
    store.begin_piece("train:yarn")
    store.finish_piece("train:yarn", metrics=[{"step": 1, "loss": 2.0}])
    store.begin_piece("train:pi")
    store.fail_piece("train:pi", ValueError("loss is nan"))
    store.begin_piece("eval:passkey:yarn")
    store.add_samples("eval:passkey:yarn", [passkey_record("yarn")], key_fields=PASSKEY_KEYS)
    st = store.status()
    assert st["pieces"] == 5
    assert st["by_status"] == {"pending": 2, "running": 1, "done": 1, "failed": 1}
    assert st["by_kind"] == {"train": {"pending": 0, "running": 0, "done": 1, "failed": 1},
                             "eval": {"pending": 2, "running": 1, "done": 0, "failed": 0}}
    assert st["failed"] == [{"piece": "train:pi", "error": "ValueError: loss is nan"}]
    assert [r["piece"] for r in st["running"]] == ["eval:passkey:yarn"]
    assert st["samples"] == 1 and st["train_steps"] == 1
    assert store.pending(s.id for s in specs) == [s.id for s in specs if s.id != "train:yarn"]
    with pytest.raises(RopekitError, match="already in the study"):
        store.pending([Piece("train:yarn", "train", "yarn", {"factor": 2})])
    # a failed piece is claimed again; reset forgets a piece's results
    assert store.begin_piece("train:pi") is True
    store.reset_piece("eval:passkey:yarn")
    assert store.samples() == [] and store.status()["by_status"]["pending"] == 3


def test_live_worker_keeps_its_claim(store):
    from ropekit.study.store import _this_machine

    assert store.journal_mode == "wal"
    store.begin_piece("eval:ppl:yarn", worker=f"{_this_machine()}:{os.getppid()}")  # a live process on this machine
    assert store.begin_piece("eval:ppl:yarn") is False
    assert store.begin_piece("eval:ppl:yarn", force=True) is True
    store.begin_piece("eval:ppl:ntk", worker=f"{socket.gethostname()}:{os.getppid()}")  # the form before boot ids
    assert store.begin_piece("eval:ppl:ntk") is False


@pytest.mark.parametrize("worker", [
    "some-other-host:1",                                   # another machine: it cannot write a WAL database here
    "{host}@00000000:{ppid}",                               # this host name, another boot (a clone, or a reboot)
])
def test_a_claim_from_another_machine_is_taken_over(store, worker):
    # a study copied from the machine that ran it (a lent GPU) resumes here: its "running" pieces are not waited on
    worker = worker.format(host=socket.gethostname(), ppid=os.getppid())
    store.begin_piece("eval:ppl:pi", worker=worker)
    assert store.begin_piece("eval:ppl:pi") is True
    assert store.pieces()[0]["worker"].endswith(f":{os.getpid()}")  # now ours


def test_a_claim_older_than_this_boot_is_taken_over(store, tmp_path):
    # the form before boot ids, with a pid that is alive here now: begun before this machine booted, so gone
    store.begin_piece("eval:ppl:pi", worker=f"{socket.gethostname()}:{os.getppid()}")
    db = sqlite3.connect(store.path)
    db.execute("UPDATE pieces SET started = '2000-01-01T00:00:00.000+00:00' WHERE id = 'eval:ppl:pi'")
    db.commit()
    db.close()
    assert store.release_abandoned() == ["eval:ppl:pi"]


def test_opening_checks(tmp_path):
    with pytest.raises(RopekitError, match="no study database"):
        StudyStore(tmp_path / "nothing" / "study.sqlite", create=False)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(RopekitError, match="not a ropekit study database"):
        StudyStore(junk)
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(RopekitError, match="not a ropekit study"):
        StudyStore(other)
    newer = tmp_path / "newer" / "study.sqlite"
    StudyStore(newer).close()
    con = sqlite3.connect(newer)
    con.execute("PRAGMA user_version = 99")
    con.close()
    with pytest.raises(RopekitError, match="newer than this ropekit"):
        StudyStore(newer)
    fresh = StudyStore(tmp_path / "fresh")  # a directory opens (creates) its study.sqlite
    assert fresh.path == tmp_path / "fresh" / "study.sqlite" and fresh.path.exists()
    fresh.close()


def test_record_writer_adapter_resumes_an_evaluation(store):
    store.begin_piece("eval:passkey:plain")

    def context():
        writer = StoreRecordWriter(store, "eval:passkey:plain", PASSKEY_KEYS)
        return EvalContext(task="passkey", model=None, tokenizer=None, method="plain", params={}, writer=writer)

    ctx = context()
    keys = [ctx.key(64, depth=0.5, trial=t) for t in range(3)]
    for key in keys[:2]:
        assert not ctx.done(key)
        ctx.write(key, prediction="1", score=1.0, seconds=0.0)
    resumed = context()  # a new run after a kill: the stored samples are done, the third is not
    assert [resumed.done(k) for k in keys] == [True, True, False]
    resumed.write(keys[2], prediction="2", score=0.0, seconds=0.0)
    assert [json.loads(k)["trial"] for k in sorted(store.done_keys("eval:passkey:plain"))] == [0, 1, 2]
    assert [r["score"] for r in store.samples()] == [1.0, 1.0, 0.0]


def test_a_piece_records_where_it_computed_with_its_results(store):
    gpu = {"device": "cuda:0", "dtype": "bfloat16", "attn": "sdpa", "hardware": "NVIDIA H200"}
    cpu = {"device": "cpu", "dtype": "float32", "attn": "sdpa", "hardware": "AMD EPYC, no native bfloat16 matmul"}
    for piece, where in (("eval:ppl:yarn", gpu), ("eval:ppl:pi", gpu), ("eval:ppl:landmark", cpu), ("eval:ppl:ntk", None)):
        assert store.begin_piece(piece)
        store.finish_piece(piece, [], placement=where)
    assert store.begin_piece("eval:passkey:abf")  # running: no placement yet
    assert store.placements() == {"eval:ppl:yarn": gpu, "eval:ppl:pi": gpu, "eval:ppl:landmark": cpu}
    assert not any(k.startswith("placement:") for k in store.get_manifest())  # the study's own keys only
    # an unfinished piece with samples (a partial cell in the report) counts where its samples say they ran
    running = placement_groups(store.pieces(), store.placements(), {"eval:passkey:abf": [(cpu, 2), (None, 1)]})
    assert {g["where"]: (g["pieces"], g["samples"]) for g in running}[placement_label(cpu)] == (
        ["eval:ppl:landmark", "eval:passkey:abf"], 2)
    groups = placement_groups(store.pieces(), store.placements())
    assert [(g["where"], g["pieces"], g["methods"]) for g in groups] == [
        ("bfloat16, sdpa attention, on NVIDIA H200", ["eval:ppl:yarn", "eval:ppl:pi"], ["yarn", "pi"]),
        ("float32, sdpa attention, on AMD EPYC, no native bfloat16 matmul", ["eval:ppl:landmark"], ["landmark"]),
        (None, ["eval:ppl:ntk"], ["ntk"]),  # finished without a record: said, not guessed
    ]
    # a piece resumed elsewhere: its samples say where each was computed, and it counts in both places
    resumed = [passkey_record("abf", trial=0, computed_on=gpu), passkey_record("abf", trial=1, computed_on=cpu),
               passkey_record("abf", trial=2, computed_on=cpu), passkey_record("abf", trial=3)]
    store.finish_piece("eval:passkey:abf", resumed, key_fields=PASSKEY_KEYS, placement=cpu)
    assert sorted(store.sample_placements()["eval:passkey:abf"], key=str) == sorted([(gpu, 1), (cpu, 2), (None, 1)], key=str)
    groups = placement_groups(store.pieces(), store.placements(), store.sample_placements())
    abf = {g["where"]: g["samples"] for g in groups if "eval:passkey:abf" in g["pieces"]}
    # the unstamped sample takes its piece's placement (where the piece finished)
    assert abf == {placement_label(gpu): 1, placement_label(cpu): 3}
    assert placement_text(groups[:2]).startswith("bfloat16, sdpa attention, on NVIDIA H200: 3 pieces (1 sample; ")
    store.reset_piece("eval:ppl:yarn")  # redone later, maybe elsewhere: its old placement goes with its results
    assert "eval:ppl:yarn" not in store.placements()
    assert placement_label({"device": "cuda:0", "dtype": "float32", "precision": "bf16", "hardware": "H"}) == (
        "float32 weights, trained in bf16 autocast, on H")


def test_a_sample_with_a_non_finite_value_keeps_its_placement(store):
    """Python writes a diverged value (an fp16 overflow's nll) as NaN/Infinity, which SQLite's JSON functions
    refuse: the placements of such samples are read all the same (the report said the database was damaged)."""
    cpu = {"device": "cpu", "dtype": "float32", "attn": "sdpa", "hardware": "X"}
    gpu = {"device": "cuda:0", "dtype": "bfloat16", "attn": "sdpa", "hardware": "H"}
    records = [{**passkey_record("abf", trial=0, computed_on=cpu), "nll_sum": float("inf")},
               passkey_record("abf", trial=1, computed_on=cpu), passkey_record("abf", trial=2, computed_on=gpu),
               {**passkey_record("abf", trial=3), "nll_sum": float("nan")}]
    assert store.begin_piece("eval:passkey:abf")
    store.finish_piece("eval:passkey:abf", records, key_fields=PASSKEY_KEYS, placement=cpu)
    got = store.sample_placements()["eval:passkey:abf"]
    assert sorted(got, key=str) == sorted([(cpu, 2), (gpu, 1), (None, 1)], key=str)


def test_a_study_may_add_or_drop_variants_but_not_redefine_one(store):
    v = lambda label, factor: {"label": label, "method": "pi", "params": {"factor": factor}}
    base = {"evals": {"ppl": {"lengths": [64]}}, "variants": [v("a", 2), v("b", 4)]}
    store.initialize("s", base)
    for piece in ("eval:ppl:a", "eval:ppl:b"):
        store.begin_piece(piece)
    store.finish_piece("eval:ppl:a", [])
    store.initialize("s", {**base, "variants": [v("a", 2), v("c", 8)]})  # b dropped, c added: the same protocol
    assert store.get_manifest("config")["variants"] == [v("a", 2), v("c", 8)]
    assert [p["id"] for p in store.pieces()] == ["eval:ppl:a", "eval:ppl:b"]  # b's piece stays in the file
    counted = store.status(only=["eval:ppl:a"])
    assert counted["pieces"] == 1 and counted["by_status"]["done"] == 1 and counted["running"] == []
    assert store.status()["by_status"]["running"] == 1
    # the refusal names what differs: a redefined variant by its label, another setting by its key
    with pytest.raises(RopekitError, match=r"another configuration: variant 'a'.params.factor \(2 in the study, 3 now\)"):
        store.initialize("s", {**base, "variants": [v("a", 3)]})  # a redefined
    with pytest.raises(RopekitError, match=r"another configuration: evals.ppl.lengths\[0\] \(64 in the study, 128 now\)"):
        store.initialize("s", {**base, "evals": {"ppl": {"lengths": [128]}}})  # another protocol


def _read_only(monkeypatch, directory):
    """Make ``directory`` read-only: by its mode, which binds a normal user, and (root ignores modes) by what
    ``os.access`` tells the store, which is how the store learns it on a read-only filesystem."""
    directory.chmod(0o555)
    real = os.access
    monkeypatch.setattr("ropekit.study.store.os.access",
                        lambda path, mode, **kw: False if os.path.samefile(path, directory) and mode & os.W_OK
                        else real(path, mode, **kw))


def test_a_study_in_a_read_only_place_is_read_without_writing_there(tmp_path, monkeypatch, run_cli):
    """`study status` and `report --out` read a published study where SQLite could create no -wal/-shm file
    (before: "not a ropekit study database (unable to open database file)"); a log still holding committed
    pages is refused, since reading without it would show an older study."""
    directory = tmp_path / "published"
    with StudyStore(directory) as st:
        st.initialize("demo", {"methods": ["yarn"]}, window=64, target_length=256)
        st.begin_piece("eval:passkey:yarn")
        st.finish_piece("eval:passkey:yarn", [passkey_record("yarn", trial=t) for t in range(3)])
    before = sorted(p.name for p in directory.iterdir())
    assert before == ["study.sqlite"]  # the last close merged the log
    _read_only(monkeypatch, directory)
    try:
        with StudyStore(directory, create=False) as st:
            assert st.read_only and st.is_done("eval:passkey:yarn") and len(st.samples()) == 3
            with pytest.raises(sqlite3.OperationalError, match="readonly"):
                st.set_manifest(note="x")
        code, out, err = run_cli("study", "status", str(directory), "--json")
        assert code == 0, err
        assert json.loads(out)["by_status"]["done"] == 1
        code, _, err = run_cli("report", str(directory), "--out", str(tmp_path / "report"))
        assert code == 0, err
        assert (tmp_path / "report" / "index.html").is_file()
        assert sorted(p.name for p in directory.iterdir()) == before  # nothing written beside the database
        directory.chmod(0o755)  # a writer elsewhere (say, before the copy was published) left its log
        writer = sqlite3.connect(directory / "study.sqlite")
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("INSERT INTO manifest (key, value) VALUES ('late', '1')")
        writer.commit()  # committed, but only in the log while this connection stays open
        with pytest.raises(RopekitError, match="writes still in its log"):
            StudyStore(directory, create=False)
        writer.close()
    finally:
        directory.chmod(0o755)


def test_a_file_that_is_not_a_study_is_refused_without_being_changed(tmp_path):
    """Opening another program's SQLite file (or an empty one) read-write switched it to WAL mode — header bytes
    18–19 from 1 to 2 — before saying it was not a study. Now it is checked through a read-only connection first."""
    import hashlib
    import sqlite3

    from ropekit.study.store import open_study

    foreign, empty = tmp_path / "foreign", tmp_path / "empty"
    foreign.mkdir()
    empty.mkdir()
    db = sqlite3.connect(foreign / "study.sqlite")
    db.execute("CREATE TABLE foo (x)")
    db.commit()
    db.close()
    (empty / "study.sqlite").write_bytes(b"")
    before = hashlib.sha256((foreign / "study.sqlite").read_bytes()).hexdigest()
    for directory, words in ((foreign, "an SQLite file but not a ropekit study"), (empty, "an empty database")):
        with pytest.raises(RopekitError, match=words):
            open_study(directory)
    assert hashlib.sha256((foreign / "study.sqlite").read_bytes()).hexdigest() == before
    assert (foreign / "study.sqlite").read_bytes()[18:20] == b"\x01\x01"  # still a rollback-journal file
    assert (empty / "study.sqlite").stat().st_size == 0
    assert sorted(p.name for p in foreign.iterdir()) == ["study.sqlite"]


@pytest.mark.parametrize("create", [True, False])
def test_a_damaged_database_is_refused_and_left_as_it_was_found(tmp_path, create):
    """A study database cut short (a copy interrupted): SQLite makes the -wal and -shm files of a WAL database as
    it opens it, even read-only, and kept them after the refusal; the directory and the file stay as they were."""
    path = tmp_path / "study" / "study.sqlite"
    path.parent.mkdir()
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("CREATE TABLE filler (x BLOB)")
    db.executemany("INSERT INTO filler VALUES (?)", [(os.urandom(1000),) for _ in range(200)])
    db.commit()
    db.close()
    path.write_bytes(path.read_bytes()[:20_000])
    before = path.read_bytes()
    with pytest.raises(RopekitError, match="not a ropekit study database"):
        StudyStore(path, create=create)
    assert sorted(p.name for p in path.parent.iterdir()) == ["study.sqlite"]
    assert path.read_bytes() == before
