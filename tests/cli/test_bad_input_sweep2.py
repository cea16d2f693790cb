"""Bad input, second sweep: one line on stderr, exit 2, nothing written, no traceback.

nan/inf in list-valued method parameters (they reached config.json as a bare NaN), a NaN layer index for
entropy_abf (an internal error), ``study --only ,``/``--retrain ,`` (naming no label ran everything / did
nothing), ``extend --format gguf --overwrite`` over a file that is not a GGUF, and repeated ``--chunks`` in
``pose-coverage`` (the same curve twice). Every case fails before any model is loaded.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from ropekit.core.params import Param
from ropekit.errors import InvalidParameterError

STUDY = {"name": "sweep2", "model": "tiny", "target_length": 256, "variants": [{"label": "base"}],
         "evals": {"ppl": {"lengths": [64], "samples": 1, "score_mode": "truncate"}}}


def _one_error_line(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    return lines[0]


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "NaN"])
def test_list_param_refuses_non_finite(bad):
    p = Param("bases", list, None, "bases")
    with pytest.raises(InvalidParameterError, match="must be a list of numbers"):
        p.coerce("harpe", f"1e6,{bad}")
    with pytest.raises(InvalidParameterError, match="must be a list of numbers"):
        p.coerce("harpe", [1e6, float(bad)])
    with pytest.raises(InvalidParameterError, match="must be a list of numbers"):
        p.coerce("harpe", [True, 2.0])
    assert p.coerce("harpe", "1e6, 2e6") == [1e6, 2e6]


@pytest.mark.parametrize("method, params, match", [
    ("longrope", {"long_factor": "nan"}, "must be positive"),
    ("longrope", {"long_factor": "one", "short_factor": "nan"}, "must be positive"),
    ("harpe", {"strategy": "explicit", "bases": "nan"}, "above 1"),
])
def test_method_checks_are_nan_safe(monkeypatch, method, params, match):
    """The methods' own range checks refuse NaN too, not only the conversion (``not v > 0``, not ``v <= 0``)."""
    import ropekit
    from ropekit.models.tiny import build_tiny_model

    model = build_tiny_model("llama", num_layers=2)
    cfg = model.config
    pairs = (cfg.hidden_size // cfg.num_attention_heads) // 2
    n = cfg.num_key_value_heads
    values = {"nan": [1.0] * (pairs - 1) + [math.nan], "one": [1.0] * pairs}
    if method == "harpe":
        values["nan"] = [math.nan] + [1e6] * (n - 1)
    monkeypatch.setattr(Param, "coerce", lambda self, m, value: value)  # bypass the conversion's own check
    given = {k: values.get(v, v) for k, v in params.items()}
    with pytest.raises(InvalidParameterError, match=match):
        ropekit.extend(model, method, factor=2.0, **given)


@pytest.mark.parametrize("args", [
    ["-m", "longrope", "-t", "256", "-p", "long_factor=1,1,1,1,1,1,1,nan"],
    ["-m", "longrope", "-t", "256", "-p", "long_factor=1,1,1,1,1,1,1,inf"],
    ["-m", "longrope", "-t", "256", "-p", "long_factor=1,1,1,1,1,1,1,1", "-p", "short_factor=1,1,1,1,1,1,1,nan"],
    ["-m", "harpe", "-f", "2", "-p", "bases=nan,1e6"],
    ["-m", "harpe", "-f", "2", "-p", "bases=inf,1e6"],
    ["-m", "entropy_abf", "-f", "2", "-p", "skip_layers=nan"],
])
def test_extend_non_finite_list_param(run_cli, tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("extend", "tiny", *args, "-o", "o")
    line = _one_error_line(code, err)
    assert "must be a list of numbers" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag", ["--only", "--retrain"])
@pytest.mark.parametrize("value", [",", " , ,"])
def test_study_label_list_naming_nothing(run_cli, tmp_path, monkeypatch, flag, value):
    monkeypatch.chdir(tmp_path)
    Path("s.yaml").write_text(yaml.safe_dump(STUDY))
    code, _, err = run_cli("study", "s.yaml", flag, value, "--out", "st")
    line = _one_error_line(code, err)
    assert flag in line and "names no" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


@pytest.mark.parametrize("command", ["extend", "export"])
def test_gguf_overwrite_refuses_a_non_gguf_file(run_cli, tmp_path, monkeypatch, command):
    """``--overwrite`` replaces a GGUF, never a user's file that happens to end in .gguf (extend and export alike)."""
    monkeypatch.chdir(tmp_path)
    if command == "export":
        code, _, err = run_cli("extend", "tiny", "-m", "pi", "-f", "4", "-o", "model")
        assert code == 0, err
    Path("x.gguf").write_bytes(b"notgguf\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    args = (["extend", "tiny", "-m", "pi", "-f", "4", "-o", "x.gguf", "--format", "gguf", "--overwrite"]
            if command == "extend" else ["export", "model", "--format", "gguf", "-o", "x.gguf", "--overwrite"])
    code, _, err = run_cli(*args)
    line = _one_error_line(code, err)
    assert "x.gguf" in line and "not a GGUF" in line
    assert Path("x.gguf").read_bytes() == b"notgguf\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("chunks", ["2,2", "3,2,3"])
def test_pose_coverage_repeated_chunks(run_cli, tmp_path, monkeypatch, chunks):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli("pose-coverage", "-w", "64", "-t", "256", "--chunks", chunks, "--steps", "10",
                             "--plot", "fig.png")
    line = _one_error_line(code, err)
    assert "--chunks" in line and "distinct" in line
    assert out.strip() == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out", [".", "", "../here"])
def test_extend_into_the_current_directory_is_refused_before_anything_is_written(run_cli, tmp_path, monkeypatch, out):
    """The extended model replaces its --out directory whole (one rename): the current directory, or one holding
    it, would be swapped from under the process, which then reported its own successful write as a refusal."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    code, _, err = run_cli("extend", "tiny", "-m", "yarn", "-f", "2", "-o", out)
    line = _one_error_line(code, err)
    assert "is the current directory or holds it" in line
    assert list(here.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["here"]


#: One edit of a saved tiny Llama's config.json → what the single error line must say. Before: a base of NaN, 0 or
#: -5 and a window of 0 or -1 were extended (exit 0, a model of NaN frequencies written) or crashed `inspect`; no
#: layers was extended by PI and refused by Self-Extend as "every layer attends within a sliding window"; a
#: 'ropekit' entry that is not a mapping and an unloadable architecture were internal errors or said nothing.
BROKEN_CONFIGS = {
    "theta nan": (("rope_parameters", "rope_theta"), float("nan"), "rope_theta nan, which is not a RoPE base"),
    "theta zero": (("rope_parameters", "rope_theta"), 0, "rope_theta 0, which is not a RoPE base"),
    "theta negative": (("rope_parameters", "rope_theta"), -5, "rope_theta -5, which is not a RoPE base"),
    "window zero": (("max_position_embeddings",), 0, "max_position_embeddings 0, which is not a window"),
    "window negative": (("max_position_embeddings",), -1, "max_position_embeddings -1, which is not a window"),
    "no layers": (("num_hidden_layers",), 0, "num_hidden_layers 0, which is not a number of layers"),
    "record not a mapping": (("ropekit",), "garbage", "has a 'ropekit' entry that is not ropekit's record"),
    "hidden size": (("hidden_size",), 33, "The hidden size (33) is not a multiple of the number of attention heads"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_CONFIGS))
def test_a_broken_config_is_one_line_for_inspect_and_extend(run_cli, tmp_path, monkeypatch, case):
    import json

    from ropekit.models.tiny import build_tiny_model

    monkeypatch.chdir(tmp_path)
    build_tiny_model("llama").save_pretrained("model")
    keys, value, words = BROKEN_CONFIGS[case]
    config = json.loads(Path("model/config.json").read_text())
    node = config
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    Path("model/config.json").write_text(json.dumps(config))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for args in (["inspect", "model"], ["extend", "model", "-m", "pi", "-f", "2", "-o", "out"]):
        code, _, err = run_cli(*args)
        assert words in _one_error_line(code, err), (args, err)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_refused_evaluation_leaves_no_folder_for_its_results(run_cli, tmp_path, monkeypatch):
    """--out in folders that do not exist yet: they appear with the first record, not for a run refused before it."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("eval", "passkey", "tiny", "--lengths", "64", "--out", "new/sub/passkey.jsonl")
    assert "too short for the passkey prompt" in _one_error_line(code, err)
    assert list(tmp_path.iterdir()) == []


def test_an_empty_longbench_file_is_refused_not_scored_zero_of_zero(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("lb").mkdir()
    Path("lb/hotpotqa.jsonl").write_text("")
    code, _, err = run_cli("eval", "longbench", "tiny", "--lengths", "256", "--data", "lb", "--out", "lb.jsonl")
    assert "no items in hotpotqa.jsonl" in _one_error_line(code, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lb"]


def test_search_with_an_empty_data_file_says_so_before_announcing_the_search(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("empty.jsonl").write_text("")
    code, out, err = run_cli("search", "tiny", "--target-length", "512", "--data", "empty.jsonl", "--out", "srch")
    assert "--data 'empty.jsonl' is empty" in _one_error_line(code, err) and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl"]


@pytest.mark.parametrize("args, words", [
    (["train", "."], "is a directory, not a YAML file"),  # was "not found" for a directory that exists
    (["extend", "tiny", "-m", "dual_chunk", "--param", "chunk_size=10", "--param", "local_size=100", "-o", "dc"],
     "local_size 100 must be below half of chunk_size 10 (chunks are chunk_size − local_size tokens long)"),
])
def test_messages_say_what_is_wrong(run_cli, tmp_path, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(*args)
    line = _one_error_line(code, err)
    assert words in line and "-90" not in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [
    ("eval", "passkey", "tiny", "--lengths", "300"),
    ("eval", "short", "tiny"),
    ("search", "tiny", "--target-length", "256"),
    ("pose-coverage", "--window", "64", "--target", "256"),
])
def test_a_negative_seed_is_refused_as_the_yaml_seed_is(run_cli, args, tmp_path, monkeypatch):
    """``--seed -1`` was accepted (``eval short`` then died inside numpy's seeding); training and study YAML already
    required seed ≥ 0."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(*args, "--seed", "-1")
    assert "--seed" in _one_error_line(code, err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, flag", [
    (("--window", "-5"), "--window"),
    (("--target", "-3"), "--target"),
    (("--steps", "0"), "--steps"),
    (("--window", "300", "--target", "256"), "--window 300"),
])
def test_pose_coverage_names_the_flag_it_refuses(run_cli, args, flag):
    """``--window -5`` was refused as "the train length -5": a name the command line does not have."""
    code, out, err = run_cli("pose-coverage", *args)
    assert flag in _one_error_line(code, err) and out == ""
