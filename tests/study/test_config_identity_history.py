"""A study's identity across runs: a dropped variant's label stays bound to its definition (its results stay in the
file), a refused config writes nothing, and a variant's note is documentation, not identity."""

from __future__ import annotations

import copy
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml
from test_runner import SMALL

from ropekit.errors import RopekitError
from ropekit.study.config import parse_study
from ropekit.study.runner import run_study
from ropekit.study.store import Piece, StudyStore

#: test_runner's small study (a frozen scaled variant and a fine-tuned one) cut to seconds on the tiny model.
STUDY = {
    **copy.deepcopy(SMALL),
    "name": "history",
    "recipe": {
        "data": {"seq_len": 64, "sources": [{"path": "builtin", "max_documents": 4}]},
        "train": {"max_steps": 2, "lr": 1.0e-3, "warmup_steps": 1, "micro_batch_size": 1},
        "output": {"save_every": 2},
    },
    "evals": {"ppl": {"lengths": [64], "samples": 1, "score_mode": "truncate"}},
}


def _with_variants(*variants: dict) -> dict:
    return {**copy.deepcopy(STUDY), "variants": [copy.deepcopy(v) for v in variants]}


BASE, PI, PI_FT = STUDY["variants"]


def _rows(directory: Path) -> tuple[dict, list]:
    """The manifest (its ``updated`` stamp aside) and the pieces table, as stored."""
    db = sqlite3.connect(directory / "study.sqlite")
    try:
        manifest = dict(db.execute("SELECT key, value FROM manifest WHERE key != 'updated'").fetchall())
        pieces = db.execute("SELECT * FROM pieces ORDER BY rowid").fetchall()
    finally:
        db.close()
    return manifest, pieces


def _finished(directory: Path) -> dict[str, tuple[str, str]]:
    db = sqlite3.connect(directory / "study.sqlite")
    try:
        return {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, status, finished FROM pieces")}
    finally:
        db.close()


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    """A finished run of :data:`STUDY` (copy it; never change it)."""
    out = tmp_path_factory.mktemp("history-ref")
    status = run_study(parse_study(STUDY), out, progress=False)
    assert status["by_status"]["done"] == status["pieces"] == 4, status  # pi-ft's training, 3 evaluations
    return out


def _copy(finished_study: Path, tmp_path: Path) -> Path:
    out = tmp_path / "study"
    shutil.copytree(finished_study, out)
    return out


def _yaml(tmp_path: Path, name: str, raw: dict) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


# ---- 1. a dropped variant keeps its definition ----------------------------------------------------------
def test_a_dropped_variant_brought_back_changed_is_refused_and_unchanged_finds_its_results(finished_study, run_cli,
                                                                                          tmp_path):
    out = _copy(finished_study, tmp_path)
    reference = _finished(out)
    code, _, stderr = run_cli("study", _yaml(tmp_path, "drop", _with_variants(BASE, PI)), "--out", str(out),
                              "--no-report")
    assert code == 0, stderr
    # pi-ft back with another training: its 2-step results must not pass for the 3-step training's
    changed = _with_variants(BASE, PI, {**PI_FT, "finetune": {"train": {"max_steps": 3}}})
    before = (out / "study.sqlite").read_bytes()
    code, _, stderr = run_cli("study", _yaml(tmp_path, "changed", changed), "--out", str(out), "--no-report")
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert "another configuration: variant 'pi-ft'.finetune.train" in stderr and "new label" in stderr, stderr
    assert (out / "study.sqlite").read_bytes() == before
    # through the API too (the runner's own check, after the command line's): refused, nothing written
    with pytest.raises(RopekitError, match=r"variant 'pi-ft'\.finetune\.train .*dropped earlier"):
        run_study(parse_study(changed), out, progress=False)
    assert (out / "study.sqlite").read_bytes() == before
    # back as it was: accepted, and its finished pieces are its results (nothing runs again)
    code, _, stderr = run_cli("study", _yaml(tmp_path, "same", STUDY), "--out", str(out), "--no-report")
    assert code == 0, stderr
    assert _finished(out) == reference


def test_the_store_keeps_every_variant_definition_it_ran(tmp_path):
    """The store's rule without a model: a label dropped two runs ago is still bound, also in a study begun before
    the store kept the definitions (it knows its last config's variants)."""
    v = lambda label, factor, **more: {"label": label, "method": "pi", "params": {"factor": factor}, **more}  # noqa: E731
    base = {"evals": {"ppl": {"lengths": [64]}}}
    with StudyStore(tmp_path / "s") as store:
        store.initialize("s", {**base, "variants": [v("a", 2), v("b", 4)]})
        with store._write() as db:  # as a study written by an earlier ropekit: no record of definitions
            db.execute("DELETE FROM manifest WHERE key = 'variants_recorded'")
        store.initialize("s", {**base, "variants": [v("a", 2)]})  # b dropped
        store.initialize("s", {**base, "variants": [v("a", 2), v("c", 8)]})  # c added, b still dropped
        snapshot = _rows(tmp_path / "s")
        with pytest.raises(RopekitError, match=r"variant 'b'\.params\.factor \(4 in the study, 5 now\)"):
            store.check_config({**base, "variants": [v("a", 2), v("b", 5)]})
        with pytest.raises(RopekitError, match=r"variant 'b'\.params\.factor \(4 in the study, 5 now\)"):
            store.initialize("s", {**base, "variants": [v("a", 2), v("b", 5)]})
        assert _rows(tmp_path / "s") == snapshot
        store.initialize("s", {**base, "variants": [v("b", 4), v("c", 8)]})  # b back as it was
        assert set(store.get_manifest("variants_recorded")) == {"a", "b", "c"}


# ---- 2. a refused config writes nothing -----------------------------------------------------------------
def test_a_refused_config_leaves_the_study_as_it_was_and_the_original_still_runs(finished_study, run_cli, tmp_path):
    out = _copy(finished_study, tmp_path)
    reference = _finished(out)
    assert run_study(parse_study(_with_variants(BASE, PI_FT)), out, progress=False)["by_status"]["failed"] == 0
    before, bytes_before = _rows(out), (out / "study.sqlite").read_bytes()
    readded = _with_variants(BASE, {**PI, "params": {"factor": 8}}, PI_FT)
    with pytest.raises(RopekitError) as refused:
        run_study(parse_study(readded), out, progress=False)
    assert _rows(out) == before and (out / "study.sqlite").read_bytes() == bytes_before  # the manifest too
    assert "variant 'pi'.params.factor (4.0 in the study, 8.0 now)" in str(refused.value)
    code, _, stderr = run_cli("study", _yaml(tmp_path, "readded", readded), "--out", str(out), "--no-report")
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "variant 'pi'" in stderr, stderr
    assert _rows(out) == before
    # the config the study was started with is still its own: it resumes, and nothing runs again
    code, _, stderr = run_cli("study", _yaml(tmp_path, "original", STUDY), "--out", str(out), "--no-report")
    assert code == 0, stderr
    assert _finished(out) == reference


def test_a_refused_piece_rolls_the_whole_initialization_back(tmp_path):
    """A config the protocol check passes whose plan holds a piece registered with another spec: the manifest is
    not written either (it was, and the study then refused its own config)."""
    config = {"evals": {"ppl": {"lengths": [64]}}, "variants": [{"label": "a", "method": "pi", "params": {}}]}
    with StudyStore(tmp_path / "s") as store:
        store.initialize("s", config, pieces=[Piece("eval:ppl:a", "eval", "a", {"factor": 2}, "ppl")])
        snapshot = _rows(tmp_path / "s")
        with pytest.raises(RopekitError, match="piece 'eval:ppl:a' is already in the study"):
            store.initialize("t", config, pieces=[Piece("eval:ppl:b", "eval", "b", {}, "ppl"),
                                                 Piece("eval:ppl:a", "eval", "a", {"factor": 3}, "ppl")])
        assert _rows(tmp_path / "s") == snapshot  # neither the manifest nor eval:ppl:b
        # the command line's check, before anything is announced, refuses it alike
        with pytest.raises(RopekitError, match="piece 'eval:ppl:a' is already in the study"):
            store.check_config(config, [Piece("eval:ppl:a", "eval", "a", {"factor": 3}, "ppl")])
        store.initialize("s", config, pieces=[Piece("eval:ppl:a", "eval", "a", {"factor": 2}, "ppl")])


# ---- 3. a note is documentation -------------------------------------------------------------------------
def test_editing_a_note_resumes_the_study_and_the_report_shows_the_new_note(finished_study, run_cli, tmp_path):
    out = _copy(finished_study, tmp_path)
    reference = _finished(out)
    noted = _with_variants({**BASE, "note": "the model as shipped"}, PI, PI_FT)
    code, _, stderr = run_cli("study", _yaml(tmp_path, "noted", noted), "--out", str(out))
    assert code == 0, stderr
    assert _finished(out) == reference  # nothing ran again
    with StudyStore(out, create=False) as store:
        assert store.get_manifest("config")["variants"][0]["note"] == "the model as shipped"
        assert "note" not in store.get_manifest("variants_recorded")["base"]
    assert "the model as shipped" in (out / "report" / "index.html").read_text()
    # edited again, and another variant's note: still the same study
    noted["variants"][1]["note"] = "frozen PI"
    noted["variants"][0]["note"] = "as shipped"
    code, _, stderr = run_cli("study", _yaml(tmp_path, "renoted", noted), "--out", str(out), "--no-report")
    assert code == 0, stderr
    assert _finished(out) == reference
