"""Every evaluation task that applies to a frozen method, end to end through ``ropekit eval`` on the built-in ``tiny``
model (64-token window) with Dynamic YaRN, Dual Chunk Attention and LongRoPE (explicit factors): results come
back for every length, and where it is cheap the numbers are checked against what the method must give.
"""

from __future__ import annotations

import json
import math

import pytest

#: The tiny model rotates 16 channels: 8 rescale factors, non-decreasing in [1, s] as LongRoPE's search keeps them.
LONG_FACTOR = "1.0,1.1,1.25,1.4,1.6,1.8,1.9,2.0"
METHODS = {
    "dynamic_yarn": ["--param", "factor=2"],
    "dual_chunk": ["--param", "chunk_size=64", "--param", "local_size=16"],  # chunks of 48: the 128-token inputs span 3
    "longrope": ["--param", f"long_factor={LONG_FACTOR}", "--param", "factor=2"],
}
TEXT = ("The quick brown fox jumps over the lazy dog while the river keeps running past the old mill. "
        "Every evening the miller counts the sacks, writes the number in a ledger and closes the heavy door. ") * 3


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("e2e") / "doc.txt"
    path.write_text(TEXT)
    return path


def _eval(run_cli, *args):
    code, out, err = run_cli("eval", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def _task_args(task, data):
    return {
        "ppl": ["--lengths", "64,128", "--data", str(data)],
        "passkey": ["--lengths", "256", "--depths", "0.5", "--trials", "1"],  # the prompt alone is 245 bytes
        "niah": ["--lengths", "320", "--depths", "0.5", "--trials", "1", "--no-chat"],  # 245 + 50 at least
        "entropy": ["--lengths", "64,128", "--samples", "1"],
        "ruler": ["--lengths", "520", "--tasks", "niah_single_1", "--samples", "1", "--no-chat"],  # 519 at least
        "manyshot": ["--lengths", "512", "--shots", "1,2", "--samples", "2"],
    }[task]


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("task", ["ppl", "passkey", "niah", "entropy", "ruler", "manyshot"])
def test_each_task_runs_with_the_method(run_cli, data, task, method):
    rows = _eval(run_cli, task, "tiny", "--method", method, *METHODS[method], *_task_args(task, data))
    assert rows and all(r.get("method") in (None, method) for r in rows)
    lengths = {r["length"] for r in rows if "length" in r}
    wanted = {int(v) for v in _task_args(task, data)[1].split(",")}
    assert lengths == wanted, rows
    for r in rows:
        for key in ("ppl", "accuracy", "recall", "score"):
            if r.get(key) is not None:
                assert math.isfinite(r[key]), r


@pytest.mark.parametrize("method,params", [
    ("dynamic_yarn", ["--param", "factor=2"]),  # inside the window s(L) = 1: the plain model
    ("dual_chunk", ["--param", "chunk_size=64", "--param", "local_size=0"]),  # one 64-token chunk covers the input
])
def test_where_the_method_is_the_plain_model_its_perplexity_is_the_plain_models_exactly(run_cli, data, method, params):
    plain = _eval(run_cli, "ppl", "tiny", "--lengths", "64", "--data", str(data))
    extended = _eval(run_cli, "ppl", "tiny", "--method", method, *params, "--lengths", "64", "--data", str(data))
    assert extended[0]["ppl"] == plain[0]["ppl"] and extended[0]["tokens_scored"] == plain[0]["tokens_scored"]


def test_past_the_window_the_methods_differ_from_each_other_and_from_the_plain_model(run_cli, data):
    ppl = {m: _eval(run_cli, "ppl", "tiny", "--method", m, *METHODS[m], "--lengths", "128", "--data", str(data))[0]["ppl"]
           for m in METHODS}
    ppl["plain"] = _eval(run_cli, "ppl", "tiny", "--lengths", "128", "--data", str(data))[0]["ppl"]
    assert len(set(ppl.values())) == 4, ppl


def test_speed_measures_the_three_methods_against_the_plain_model(run_cli):
    params = [arg if arg.startswith("--") else f"{method}.{arg}" for method, args in METHODS.items() for arg in args]
    rows = _eval(run_cli, "speed", "tiny", "--methods", ",".join(METHODS), *params, "--lengths", "128",
                 "--repeats", "1", "--decode-tokens", "2")
    measured = {r["method"] for r in rows}
    assert set(METHODS) <= measured and "plain" in measured
    assert all(r["prefill_s"] > 0 for r in rows), rows


def test_a_method_installed_for_evaluation_is_held_to_its_reach_on_the_base_window():
    """Self-Extend's reach G·(C − W + ⌊W/G⌋) is on the pretrained window C = 64: 2·(64 − 16 + 8) = 112. Read off
    the extended model (whose window is already 112) it came to 208, and a 120-token evaluation ran past the reach.
    A group size given is the method's size: no target is inferred from the lengths."""
    import ropekit
    from ropekit.errors import RopekitError
    from ropekit.eval.common import prepare_model
    from ropekit.models.tiny import build_tiny_model

    model = build_tiny_model("llama")
    assert ropekit.rope_info(model).window == 64
    variant, params = prepare_model(model, "self_extend", {"group_size": 2, "window_size": 16}, [100])
    assert params["group_size"] == 2 and params["factor"] is None
    with pytest.raises(RopekitError, match=r"length 120 exceeds what self_extend supports .*\(reach 112 tokens\)"):
        prepare_model(model, "self_extend", {"group_size": 2, "window_size": 16}, [120])
