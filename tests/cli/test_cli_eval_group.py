"""``ropekit eval``: one command per task, and the command line of the single command it replaced — options
before the task name, another task's flag refused in one line, the registry's error for an unknown task."""

from __future__ import annotations

import inspect
import json
import re

import pytest
import typer

from ropekit import cli
from ropekit.eval import TASKS, get_task

#: Options every task command takes (the runner, not the task's run(), consumes them).
COMMON = {"model", "lengths", "method", "param", "seed", "out_file", "resume", "json_out", "device", "dtype", "attn", "device_map"}

EVAL = typer.main.get_command(cli.app).commands["eval"]


#: The options each task took when ``eval`` was one command with every flag (beyond COMMON); none is lost.
OPTIONS_BEFORE_THE_SPLIT = {
    "ppl": {"data", "samples", "stride", "score_mode", "weighting", "add_bos", "plot"},
    "passkey": {"depths", "trials", "plot"},
    "niah": {"depths", "trials", "chat", "plot"},
    "ruler": {"tasks", "samples", "data", "chat"},
    "longbench": {"tasks", "samples", "data", "chat"},
    "manyshot": {"shots", "samples", "data"},
    "entropy": {"samples", "plot"},
    "short": {"tasks", "data", "samples", "chat"},
    "speed": {"methods", "decode_tokens", "repeats"},
}
#: Options added since, per task.
OPTIONS_ADDED_SINCE = {"speed": {"plot"}, "ruler": {"tokens_to_generate"}}


@pytest.mark.parametrize("task", sorted(OPTIONS_BEFORE_THE_SPLIT))
def test_every_task_keeps_its_options(task):
    offered = {p.name for p in EVAL.commands[task].params}
    assert offered == COMMON | OPTIONS_BEFORE_THE_SPLIT[task] | OPTIONS_ADDED_SINCE.get(task, set())


@pytest.mark.parametrize("task", sorted(set(TASKS) - {"speed"}))
def test_a_task_command_offers_only_what_its_run_takes(task):
    offered = {p.name for p in EVAL.commands[task].params} - COMMON
    assert offered <= set(inspect.signature(get_task(task).run).parameters), offered


@pytest.mark.parametrize("task", sorted(set(TASKS) - {"speed"}))
def test_a_tasks_option_check_takes_what_its_run_takes(task):
    """``check_options`` (run before a model loads, and on a study's config) sees every option ``run`` gets."""
    module = get_task(task)
    run = inspect.signature(module.run).parameters
    check = inspect.signature(module.check_options).parameters
    assert [(n, p.default) for n, p in run.items() if n != "ctx"] == [(n, p.default) for n, p in check.items()]


@pytest.mark.parametrize(("args", "words"), [
    (["passkey", "tiny", "--depths", "1.5"], "depth 1.5 is not a fraction in [0, 1]"),
    (["niah", "tiny", "--depths", "0.5,2"], "depth 2.0 is not a fraction in [0, 1]"),
    (["ppl", "tiny", "--lengths", "64", "--score-mode", "bogus"], "--score-mode 'bogus' is not known"),
    (["ppl", "tiny", "--lengths", "64", "--stride", "64"], "--stride 64 is larger than 63"),
    (["ruler", "tiny", "--tasks", "niah_single_1", "--data", "q.json"], "--data feeds only RULER's qa tasks"),
    (["longbench", "tiny", "--tasks", "hotpotqa_x"], "unknown LongBench dataset 'hotpotqa_x'"),
])
def test_options_wrong_for_any_model_are_refused_before_it_loads(run_cli, monkeypatch, args, words):
    import ropekit.models.loading as loading

    def no_load(*_, **__):
        raise AssertionError("a model was loaded")

    for name in ("_load_tiny", "_load_dir", "_load_gguf", "_load_hub"):
        monkeypatch.setattr(loading, name, no_load)
    assert words in _one_line_error(run_cli, "eval", *args)


def test_an_option_given_as_its_default_resumes_the_same_run(run_cli, tmp_path):
    """Writing ``--score-mode last_stride`` (the default) on a resume of a file made without it was refused as
    another run; a different value still is."""
    data = tmp_path / "doc.txt"
    data.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    out = tmp_path / "ppl.jsonl"
    common = ["eval", "ppl", "tiny", "--lengths", "64", "--data", str(data), "--out", str(out), "--json"]
    assert run_cli(*common)[0] == 0
    code, _, stderr = run_cli(*common, "--resume", "--score-mode", "last_stride", "--weighting", "token")
    assert code == 0, stderr
    assert "score_mode='full_window'" in _one_line_error(run_cli, *common, "--resume", "--score-mode", "full_window")
    # NIAH without --chat uses the plain prompt, as --no-chat does
    out = tmp_path / "niah.jsonl"
    common = ["eval", "niah", "tiny", "--lengths", "300", "--depths", "0.5", "--out", str(out), "--json"]
    assert run_cli(*common)[0] == 0
    code, _, stderr = run_cli(*common, "--resume", "--no-chat")
    assert code == 0, stderr


def test_a_manyshot_run_that_fits_no_shot_count_is_refused(run_cli, tmp_path):
    """The tiny model's 64-token window holds no prompt: the run evaluated nothing and exited 0 with Python's raw
    UserWarning. Now one line, exit 2, and no results file."""
    out = tmp_path / "m.jsonl"
    line = _one_line_error(run_cli, "eval", "manyshot", "tiny", "--shots", "0,0", "--samples", "2", "--out", str(out))
    assert "no shot count fits in 64 tokens" in line, line
    assert not out.exists()
    # shot counts beyond the demonstrations: refused in one line (the "skipped" warning is not said before it)
    line = _one_line_error(run_cli, "eval", "manyshot", "tiny", "--shots", "100000", "--samples", "1")
    assert "exceeds the" in line and "demonstrations available" in line, line


@pytest.mark.parametrize("flags", [["--methods", ""], ["--methods", "yarn,"], ["--method", ""]])
def test_speed_refuses_an_empty_method_name(run_cli, flags):
    assert "has an empty name" in _one_line_error(run_cli, "eval", "speed", "tiny", "--lengths", "64", *flags)


def test_speed_offers_what_run_speed_takes():
    from ropekit.eval.speed import run_speed

    # --plot is drawn by the command from run_speed's rows (ropekit.eval.speed.plot_cost), not by run_speed itself
    offered = {p.name for p in EVAL.commands["speed"].params} - COMMON - {"plot"}
    assert offered <= set(inspect.signature(run_speed).parameters)


def _one_line_error(run_cli, *args) -> str:
    code, out, err = run_cli(*args)
    assert code == 2, (code, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    return lines[0]


@pytest.mark.parametrize(("args", "owners"), [
    (["passkey", "tiny", "--stride", "4"], "ppl"),
    (["passkey", "tiny", "--stride=4"], "ppl"),
    (["ppl", "tiny", "--trials", "0"], "passkey, niah"),
    (["ppl", "tiny", "--no-chat"], "niah, ruler, longbench, short"),
    (["niah", "tiny", "--methods", "yarn"], "speed"),
    (["speed", "tiny", "--lengths", "64", "--depths", "0.5"], "passkey, niah"),
])
def test_another_tasks_flag_is_one_line_exit_2(run_cli, args, owners):
    line = _one_line_error(run_cli, "eval", *args)
    flag = next(a for a in args if a.startswith("--") and a != "--lengths").split("=")[0]
    assert f"{flag} does not apply to the '{args[0]}' evaluation (only to {owners})" in line, line


def test_speed_refuses_method_and_methods_together(run_cli):
    assert "--method and --methods both given" in _one_line_error(run_cli, "eval", "speed", "tiny", "--lengths", "64",
                                                                  "-m", "yarn", "--methods", "pi")


def test_clicks_own_messages_stay_for_other_mistakes(run_cli):
    assert "No such option: --strid" in _one_line_error(run_cli, "eval", "ppl", "tiny", "--strid", "4")
    assert "'--lengths' requires an argument" in _one_line_error(run_cli, "eval", "ppl", "tiny", "--lengths")


def test_unknown_and_missing_task(run_cli):
    assert "unknown evaluation task 'pll'" in _one_line_error(run_cli, "eval", "pll", "tiny")
    assert "unknown evaluation task 'pll'" in _one_line_error(run_cli, "eval", "--json", "pll", "tiny")
    assert "no evaluation task given" in _one_line_error(run_cli, "eval", "--lengths", "64")
    assert "Missing argument" in _one_line_error(run_cli, "eval", "ppl")


def test_options_may_come_before_the_task(run_cli, tmp_path):
    data = tmp_path / "doc.txt"
    data.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    options = ["--lengths", "64", "--data", str(data), "--json"]
    code, first, err = run_cli("eval", *options, "ppl", "tiny")
    assert code == 0, err
    code, last, err = run_cli("eval", "ppl", "tiny", *options)
    assert code == 0, err
    rows = json.loads(first)
    assert rows == json.loads(last) and [r["length"] for r in rows] == [64]
    # the task name is found past an option's value, and short options with attached values are one token
    line = _one_line_error(run_cli, "eval", "-l64", "--seed", "3", "passkey", "tiny", "--stride", "4")
    assert "'passkey' evaluation" in line


def test_in_a_log_an_evaluation_prints_plain_progress_lines_and_a_refusal_is_one_line(run_cli):
    """Without a terminal (a pipe, a CI log) a rich bar shows nothing until it stops, then leaves an empty line: the
    evaluations print timestamped lines instead, and a refusal after the model has loaded stays one line."""
    code, _, err = run_cli("eval", "passkey", "tiny", "--lengths", "512", "--depths", "0.5", "--trials", "2")
    assert code == 0
    lines = err.splitlines()
    assert "" not in lines and any(re.fullmatch(r"\[\d+:\d\d:\d\d\] passkey: 2/2", line) for line in lines), err

    code, _, err = run_cli("eval", "speed", "tiny", "--lengths", "128,256", "--methods", "yarn")
    assert code == 0 and "" not in err.splitlines()
    assert any(re.fullmatch(r"\[\d+:\d\d:\d\d\] speed: 4  measured", line) for line in err.splitlines()), err  # 2 methods × 2 lengths

    code, out, err = run_cli("eval", "passkey", "tiny", "--lengths", "512", "--depths", "1.5")
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: depth 1.5"), repr(err)


def test_a_summary_counts_only_this_runs_method(run_cli, tmp_path):
    """A results file resumed with a second method holds both; the RULER summary (grouped by length and task) is
    this run's alone, as its title says — it pooled both methods' samples before."""
    import json

    out = str(tmp_path / "ruler.jsonl")
    common = ["eval", "ruler", "tiny", "--lengths", "400", "--tasks", "niah_single_1", "--samples", "2",
              "--tokens-to-generate", "4", "--out", out, "--json"]
    code, stdout, _ = run_cli(*common)
    assert code == 0
    code, stdout, _ = run_cli(*common, "--resume", "--method", "pi", "--param", "factor=2")
    assert code == 0
    rows = json.loads(stdout)
    assert [r["n"] for r in rows if r["subtask"] == "niah_single_1"] == [2]
    with open(out) as f:
        assert sorted({json.loads(line)["method"] for line in f if line.strip()}) == ["pi", "plain"]


def test_a_resume_with_other_options_is_refused_in_one_line(run_cli, tmp_path):
    """--seed changes every passkey prompt without being part of a sample's key: resuming a seed-0 file with seed 1
    kept the seed-0 samples and reported them as seed 1's. Now one line, exit 2, and the file is left as it was;
    options that only choose samples (more lengths) may change."""
    import json

    out = tmp_path / "passkey.jsonl"
    common = ["eval", "passkey", "tiny", "--trials", "1", "--out", str(out), "--json"]
    assert run_cli(*common, "--lengths", "256")[0] == 0
    before = out.read_text()
    assert all(json.loads(line)["options"]["seed"] == 0 for line in before.splitlines())
    code, stdout, stderr = run_cli(*common, "--lengths", "256", "--resume", "--seed", "1")
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "seed=0" in lines[0] and "seed=1" in lines[0], stderr
    assert out.read_text() == before
    assert run_cli(*common, "--lengths", "256,300", "--resume")[0] == 0  # more lengths, same options: fine
    # another model: its samples would be the first model's
    before = out.read_text()
    code, _, stderr = run_cli("eval", "passkey", "tiny-qwen2", "--trials", "1", "--out", str(out), "--json",
                              "--lengths", "256", "--resume")
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "model='tiny'" in lines[0] and "model='tiny-qwen2'" in lines[0], stderr
    assert out.read_text() == before


def test_a_resume_in_another_dtype_is_refused_in_one_line(run_cli, tmp_path):
    """The options checked on resume did not include the dtype: a float32 file resumed with --dtype bfloat16 mixed
    the two in one summary (records carried computed_on, and nothing read it)."""
    out = tmp_path / "ppl.jsonl"
    common = ["eval", "ppl", "tiny", "--lengths", "64", "--out", str(out), "--json"]
    assert run_cli(*common, "--dtype", "float32")[0] == 0
    before = out.read_text()
    code, _, stderr = run_cli(*common, "--dtype", "bfloat16", "--resume")
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "computed in float32" in lines[0] and "bfloat16" in lines[0], stderr
    assert out.read_text() == before


@pytest.mark.parametrize("task", ["ppl", "entropy", "passkey", "speed"])
def test_a_plot_path_that_is_not_a_png_is_refused_before_any_work(run_cli, tmp_path, task):
    """A --plot without .png replaced the user's file with a PNG (ppl) or failed with matplotlib's error after the
    whole evaluation (entropy): now one line, exit 2, before the model loads, and the file is as it was."""
    notes = tmp_path / "notes"
    notes.write_text("keep me")
    for target in (notes, tmp_path / "figure.txt"):
        code, _, stderr = run_cli("eval", task, "tiny", "--lengths", "64", "--out", str(tmp_path / "r.jsonl"),
                                  "--plot", str(target))
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and "not a .png path" in lines[0], stderr
    assert notes.read_text() == "keep me" and not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("task", ["passkey", "niah", "entropy"])
def test_the_default_length_is_the_window_of_the_model_as_evaluated(run_cli, task):
    """Passkey and NIAH defaulted to the pretrained window (64 on the tiny model) and entropy to the extended one: a
    YaRN ×4 model was probed for retrieval only inside its old window. Every task's default is now the window of the
    model as evaluated — 64 for the tiny model, 4 × 64 with YaRN ×4."""
    extra = ["--trials", "1"] if task != "entropy" else ["--samples", "1"]
    for method, window in (([], 64), (["-m", "yarn", "-p", "factor=4"], 256)):
        code, out, err = run_cli("eval", task, "tiny", *method, *extra, "--json")
        if code == 0:
            assert {r["length"] for r in json.loads(out)} == {window}, out
        else:  # the byte-level tiny model's prompt may not fit: the refusal names the length tried
            assert code == 2 and f"length {window} is too short" in err, err


def test_a_ppl_resume_with_another_longest_length_is_refused_in_one_line(run_cli, tmp_path):
    """--lengths only chooses samples, but ppl's longest length chooses the documents of every length (and where
    same_targets' targets end): a resume with a longer one kept the earlier records next to records of other documents.
    Now one line, exit 2, the file as it was; lengths under the same longest resume."""
    data = tmp_path / "doc.txt"
    data.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    out = tmp_path / "ppl.jsonl"
    common = ["eval", "ppl", "tiny", "--data", str(data), "--out", str(out), "--json", "--score-mode", "same_targets",
              "--stride", "32"]
    assert run_cli(*common, "--lengths", "64,128")[0] == 0
    before = out.read_text()
    line = _one_line_error(run_cli, *common, "--lengths", "64,128,256", "--resume")
    assert "longest length of 128" in line and "256" in line and "another --out" in line
    assert out.read_text() == before
    code, stdout, stderr = run_cli(*common, "--lengths", "96,128", "--resume")
    assert code == 0, stderr
    assert [r["length"] for r in json.loads(stdout)] == [64, 96, 128]
