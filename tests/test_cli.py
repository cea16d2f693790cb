"""The command line: JSON outputs, a real extend → load round trip, and every bad input as exit 2 + one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, GPTJConfig, GPTJForCausalLM, StableLmConfig,
                          StableLmForCausalLM)

import ropekit
from ropekit.models.tiny import TINY_WINDOW, build_tiny_model


def test_methods_json_lists_every_method_with_defaults(run_cli):
    code, out, _ = run_cli("methods", "--json")
    assert code == 0
    data = json.loads(out)
    names = [d["name"] for d in data]
    assert names == [m.name for m in ropekit.list_methods()]
    for want in ("pi", "ntk", "dynamic_ntk", "ntk_by_parts", "yarn", "abf", "entropy_abf", "harpe"):
        assert want in names
    yarn = data[names.index("yarn")]
    assert yarn["params"]["beta_fast"]["default"] == 32.0
    assert yarn["params"]["beta_slow"]["default"] == 1.0
    assert yarn["exports_to"] == ["transformers", "vllm"]
    assert data[names.index("entropy_abf")]["params"]["rope_theta"]["default"] == 500000.0
    assert data[names.index("entropy_abf")]["exports_to"] == []
    assert all(isinstance(d["needs_training"], bool) for d in data)


def test_methods_name_prints_one_card_with_what_each_parameter_accepts(run_cli, monkeypatch):
    from ropekit.cli import common

    monkeypatch.setattr(common.out, "width", 240)  # one table row per parameter, nothing folded
    code, out, err = run_cli("methods", "yarn")
    assert code == 0 and err == ""
    assert out.startswith("yarn — YaRN") and "arXiv 2309.00071" in out and "exports to: transformers, vllm" in out
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in out.splitlines() if line.startswith("│")}
    assert list(rows) == [p.name for p in ropekit.get_method("yarn").params]  # every parameter, in order
    # default, accepted values, meaning: the values YaRN's parameters are declared with
    assert rows["factor"][:2] == ["1.0", "1 ≤ x ≤ 16,777,216"]
    assert rows["beta_fast"][:2] == ["32.0", "> 0"] and rows["beta_slow"][:2] == ["1.0", "> 0"]
    assert rows["original_max_position_embeddings"][1] == "≥ 2"
    assert rows["ramp"][1] == "ratio | dim" and rows["blend"][1] == "frequency | wavelength"
    assert rows["truncate"][:2] == ["true", "true | false"] and rows["attention_factor"][0] == "unset"
    assert rows["beta_fast"][2] == ropekit.get_method("yarn").param("beta_fast").help

    code, out, _ = run_cli("methods", "longrope")
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in out.splitlines() if line.startswith("│")}
    assert rows["long_factor"][1] == "numbers, comma-separated" and rows["start_tokens"][:2] == ["0", "≥ 0"]

    code, out, _ = run_cli("methods", "Self-Extend", "--json")  # the names extend accepts, as JSON
    card = json.loads(out)
    assert code == 0 and card["name"] == "self_extend" and set(card["params"]) == {p.name for p in ropekit.get_method("self_extend").params}


@pytest.mark.parametrize("args, says", [(("methods", "yarm"), "did you mean yarn?"),
                                        (("methods", "yarn", "--families"), "takes no method name")])
def test_methods_name_refusals_are_one_line(run_cli, args, says):
    code, out, err = run_cli(*args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and says in err


def test_inspect_tiny_json(run_cli):
    code, out, _ = run_cli("inspect", "tiny", "--json")
    assert code == 0
    facts = json.loads(out)
    model = build_tiny_model("llama")
    assert facts["window"] == TINY_WINDOW
    assert facts["num_heads"] == model.config.num_attention_heads
    assert facts["num_kv_heads"] == model.config.num_key_value_heads
    assert facts["rope_theta"] == model.config.rope_parameters["rope_theta"]
    assert {m["name"] for m in facts["methods"] if m["applies"]} >= {"pi", "yarn", "harpe"}


def test_extend_writes_a_model_plain_transformers_and_ropekit_load(run_cli, tmp_path):
    out_dir = tmp_path / "yarn4"
    code, out, err = run_cli(
        "extend", "tiny", "--method", "yarn", "--factor", "4", "--param", "beta_fast=16",
        "--out", str(out_dir), "--json",
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["transformers"] is True and report["params"]["beta_fast"] == 16.0
    reference = ropekit.extend(build_tiny_model("llama"), "yarn", factor=4, beta_fast=16)
    x = torch.randint(0, 256, (1, 3 * TINY_WINDOW), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = reference(x).logits
        plain = AutoModelForCausalLM.from_pretrained(out_dir).eval()
        assert plain.config.rope_parameters["rope_type"] == "yarn"
        assert torch.equal(plain(x).logits, want)
        assert torch.equal(ropekit.load(out_dir)(x).logits, want)


def test_param_factor_is_the_factor_option(run_cli, tmp_path):
    """``--param factor=4`` (docs/walkthrough.md) writes the model ``--factor 4`` writes."""
    written = {}
    for name, args in (("option", ["--factor", "4"]), ("param", ["--param", "factor=4"])):
        code, _, err = run_cli("extend", "tiny", "--method", "yarn", *args, "--out", str(tmp_path / name))
        assert code == 0, err
        written[name] = json.loads((tmp_path / name / "config.json").read_text())
    assert written["param"]["rope_parameters"] == written["option"]["rope_parameters"]
    assert written["param"]["rope_parameters"]["factor"] == 4.0
    assert written["param"]["ropekit"]["params"] == written["option"]["ropekit"]["params"]


def _gpt2_dir(tmp_path):
    path = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64)).save_pretrained(path)
    return path


def _gptj_dir(tmp_path):
    """GPT-J rotates q/k, but with a sinusoid table its attention builds itself (no rope_parameters)."""
    path = tmp_path / "gptj"
    config = GPTJConfig(n_layer=1, n_embd=32, n_head=2, rotary_dim=8, vocab_size=64, n_positions=64)
    GPTJForCausalLM(config).save_pretrained(path)
    return path


def _odd_rotary_dir(tmp_path):
    """StableLM rotating 7 of 16 channels: transformers accepts it (rounding up to 8, exponents over 7)."""
    path = tmp_path / "odd"
    config = StableLmConfig(vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                            num_key_value_heads=4, intermediate_size=64, max_position_embeddings=64,
                            partial_rotary_factor=0.4375)
    StableLmForCausalLM(config).save_pretrained(path)
    return path


BAD_INPUTS = {
    "odd rotary dimension": (lambda tmp: ["extend", str(_odd_rotary_dir(tmp)), "--method", "pi", "--factor", "2"],
                             "rotates an odd number of channels (head_dim 16 × partial_rotary_factor 0.4375 = 7)"),
    "model without RoPE": (lambda tmp: ["extend", str(_gpt2_dir(tmp)), "--method", "pi", "--factor", "2"], "no rotary position embedding"),
    "model with its own rotary table": (lambda tmp: ["extend", str(_gptj_dir(tmp)), "--method", "yarn", "--factor", "2"],
                                        "rotates q/k with a table its attention module builds itself (rotary_dim 8)"),
    "factor below 1": (lambda tmp: ["extend", "tiny", "--method", "pi", "--factor", "0.5"], "factor"),
    "target not above the window": (lambda tmp: ["extend", "tiny", "--method", "yarn", "--target-length", str(TINY_WINDOW)], "not longer than the model's window"),
    "factor given twice": (lambda tmp: ["extend", "tiny", "--method", "yarn", "--factor", "2", "--param", "factor=2"], "factor given twice"),
    "both factor and target": (lambda tmp: ["extend", "tiny", "--method", "yarn", "--factor", "2", "--target-length", "256"], "both factor and target_length"),
    "unknown method": (lambda tmp: ["extend", "tiny", "--method", "rope-magic", "--factor", "2"], "unknown method 'rope-magic'"),
    "unknown parameter": (lambda tmp: ["extend", "tiny", "--method", "yarn", "--factor", "2", "--param", "beta_fats=3"], "unknown parameter 'beta_fats'"),
    "wrong parameter type": (lambda tmp: ["extend", "tiny", "--method", "yarn", "--factor", "2", "--param", "beta_fast=fast"], "must be a number"),
    "wrong option type": (lambda tmp: ["extend", "tiny", "--method", "yarn", "--factor", "abc"], "--factor"),
    "malformed --param": (lambda tmp: ["extend", "tiny", "--method", "yarn", "--factor", "2", "--param", "beta_fast"], "key=value"),
    "missing path": (lambda tmp: ["inspect", str(tmp / "does-not-exist")], "does-not-exist"),
    "missing gguf": (lambda tmp: ["extend", str(tmp / "model.gguf"), "--method", "pi", "--factor", "2"], "model.gguf"),
    "GGUF weight type for a model directory": (lambda tmp: ["extend", "tiny", "--method", "pi", "--factor", "2", "--outtype", "q8_0"], "applies only to --format gguf"),
    "harpe bases count": (lambda tmp: ["extend", "tiny", "--method", "harpe", "--param", "bases=1e4,2e4,3e4"], "bases given"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(run_cli, tmp_path, case):
    make_args, needle = BAD_INPUTS[case]
    args = make_args(tmp_path)
    out_dir = tmp_path / "out"
    if args[0] == "extend":
        args += ["--out", str(out_dir)]
    code, out, err = run_cli(*args)
    assert code == 2, (code, out, err)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error:"), err
    assert needle.lower() in lines[0].lower(), err
    assert "Traceback" not in err + out
    assert not out_dir.exists()


def test_unsupported_gguf_architecture(run_cli, tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "bert.gguf"
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    code, _, err = run_cli("extend", str(path), "--method", "pi", "--factor", "2", "--out", str(tmp_path / "o"))
    assert code == 2 and "bert" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_refuses_to_overwrite_results(run_cli, tmp_path):
    out_dir = tmp_path / "keep"
    out_dir.mkdir()
    (out_dir / "results.jsonl").write_text("precious\n")
    code, _, err = run_cli("extend", "tiny", "--method", "pi", "--factor", "2", "--out", str(out_dir))
    assert code == 2 and "not empty" in err
    assert (out_dir / "results.jsonl").read_text() == "precious\n"


def test_real_process_exit_code_and_no_traceback(tmp_path):
    """The installed console script itself: exit status 2 and a single stderr line."""
    proc = subprocess.run(
        [sys.executable, "-m", "ropekit.cli", "extend", "tiny", "--method", "pi", "--factor", "0.5", "--out", str(tmp_path / "o")],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "factor" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_inspect_and_export_respect_the_family(run_cli, tmp_path, make_ids):
    """Phi-3's config accepts only plain RoPE and LongRoPE: PI/YaRN cannot be exported natively there, so their
    static frequencies are written as longrope (which Phi-3 accepts); Dynamic NTK follows the length: ropekit only."""
    code, out, _ = run_cli("inspect", "tiny-phi3", "--json")
    assert code == 0
    exports = {m["name"]: m["exports_to"] for m in json.loads(out)["methods"]}
    assert exports["pi"] == exports["yarn"] == ["transformers (longrope)", "vllm (longrope)"]
    assert exports["dynamic_ntk"] == []
    assert exports["ntk"] == ["transformers", "vllm"] and exports["abf"] == ["transformers", "vllm"]
    code, out, err = run_cli("extend", "tiny-phi3", "--method", "pi", "--factor", "2", "--out", str(tmp_path / "p"), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["transformers"] is True and report["format"] == "longrope" and report["vllm"] is True
    assert json.loads((tmp_path / "p" / "config.json").read_text())["rope_parameters"]["rope_type"] == "longrope"
    from transformers import AutoModelForCausalLM

    import ropekit

    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "p").eval()
    ours = ropekit.load(tmp_path / "p")
    ids = make_ids(100)
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, ours(ids).logits, rtol=2e-5, atol=2e-5)
    code, _, err = run_cli("extend", "tiny-phi3", "--method", "pi", "--factor", "2", "--rope-format", "native",
                           "--out", str(tmp_path / "n"))
    assert code == 2 and "cannot be written exactly as transformers' own rope types" in err and not (tmp_path / "n").exists()


def test_inspect_reports_self_extend_reach(run_cli, tmp_path):
    out_dir = tmp_path / "se"
    code, _, err = run_cli("extend", "tiny", "--method", "self_extend", "--param", "group_size=3",
                           "--param", "window_size=8", "--out", str(out_dir))
    assert code == 0, err
    code, out, err = run_cli("inspect", str(out_dir), "--json")
    assert code == 0, err
    ext = json.loads(out)["extended_with"]
    assert ext["method"] == "self_extend" and ext["reach"] == 3 * (TINY_WINDOW - 8 + 8 // 3)


def test_whole_number_lists_refuse_words_and_infinities_in_one_line():
    """--chunks/--shots/--trials lists: a word was answered with a hint of decimals, and 'inf' was an internal
    OverflowError."""
    from ropekit.cli.common import int_list
    from ropekit.errors import RopekitError

    assert int_list("2, 3", "--chunks") == [2, 3]
    for text, said in (("a,b", "not a comma-separated list of whole numbers"), ("inf", "must be whole numbers"),
                       ("2,nan", "must be whole numbers"), ("1.5", "must be whole numbers"), ("0", "≥ 1")):
        with pytest.raises(RopekitError, match=said) as err:
            int_list(text, "--chunks")
        assert "0.1" not in str(err.value) and "\n" not in str(err.value)
