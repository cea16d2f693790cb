"""The exported models run in the real engines — vLLM (CPU build) and llama.cpp — each in its own environment
(``bash scripts/engines.sh``), compared with ropekit's own model past the original window.

Marked slow; an engine that is not installed skips its tests with one line saying how to install it. Cases: PI, NTK,
YaRN and NTK-by-parts (exported as longrope) on a tiny Llama (head size 64: vLLM's CPU kernels need one of its
supported sizes) and on SmolLM2-135M past its 8,192-token window (there also Dynamic NTK frozen at twice the
window); on the tiny Llama also llama3, YaRN with β_fast 4 (a 64-token window has at most 10 rotations per pair, so
16 would equal the default 32), and Dynamic NTK and CLEX frozen at one length (written as longrope). Dynamic NTK
itself, which the engines do not compute per input length, is refused with its reason. And one passkey through each
engine: SmolLM2 with YaRN factor 2 retrieves a key at 12k tokens as ropekit does. A tiny DeepSeek-V3 with YaRN runs in
vLLM's MLA (bfloat16 only) with the plan's overrides, against a bare-directory control.
"""

from __future__ import annotations

import json

import pytest
import torch

import ropekit
from ropekit import RopekitError
from ropekit.core.hf_compat import cache_argument  # noqa: F401  (keeps the test module importable alone)
from ropekit.engines import ENGINES, engine_python, run_engine, verify
from ropekit.eval.common import first_integer
from ropekit.eval.passkey import make_sample
from ropekit.models.byte_tokenizer import byte_tokenizer
from ropekit.models.loading import load_model
from ropekit.models.tiny import build_tiny_model

pytestmark = pytest.mark.slow

CASES = {
    "pi": {"factor": 2.0},
    "ntk": {"factor": 2.0},
    "yarn": {"factor": 2.0},
    "ntk_by_parts": {"factor": 2.0},  # no transformers type of its own: written as longrope
}
#: Tiny-model-only cases: ``(method, parameters, save_pretrained keywords)``. The frozen ones are written as
#: longrope at a length the comparison then uses (vLLM needs one position more than the prompt for its token).
TINY_EXTRA = {
    "llama3": ("llama3", {"factor": 2.0}, {}),
    "yarn-beta4": ("yarn", {"factor": 2.0, "beta_fast": 4.0}, {}),
    "dynamic_ntk-frozen": ("dynamic_ntk", {"factor": 2.0}, {"freeze_length": 121}),
    "clex-frozen": ("clex", {"factor": 4.0}, {"freeze_length": 120}),
}


def _engine(name: str) -> None:
    try:
        engine_python(ENGINES[name])
    except RopekitError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def tiny_exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-exports")
    out = {}
    cases = {name: (name, params, {}) for name, params in {**CASES, "dynamic_ntk": {"factor": 2.0}}.items()}
    for name, (method, params, save) in {**cases, **TINY_EXTRA}.items():
        model = build_tiny_model("llama", hidden_size=128, num_heads=2, num_kv_heads=1, window=64)
        ropekit.extend(model, method, **params)
        ropekit.save_pretrained(model, root / name, tokenizer=byte_tokenizer(), **save)
        out[name] = root / name
    return out


@pytest.mark.parametrize("engine", ["vllm"])
@pytest.mark.parametrize("method", list(CASES) + list(TINY_EXTRA))
def test_tiny_llama_in_the_engine_equals_ropekit(engine, method, tiny_exports):
    _engine(engine)
    report = verify(tiny_exports[method], engine, length=120)
    print("engine report:", json.dumps(report.as_dict()))  # the README table's numbers (pytest -s)
    assert report.passed, report.as_dict()
    assert report.details["positions_past_window"] > 50  # the extended positions are compared


@pytest.mark.parametrize("engine", ["vllm"])
def test_dynamic_ntk_is_refused_with_its_reason(engine, tiny_exports):
    _engine(engine)  # verify refuses a missing engine first, before it reads the export
    with pytest.raises(RopekitError) as err:
        verify(tiny_exports["dynamic_ntk"], engine)
    assert "dynamic" in str(err.value) and "\n" not in str(err.value)


@pytest.fixture
def smollm2(smollm2_gguf):
    return "smollm2"


def _smollm2_export(tmp_path, method, params, **save):
    loaded = load_model("smollm2")
    ropekit.extend(loaded.model, method, **params)
    ropekit.save_pretrained(loaded.model, tmp_path / method, tokenizer=loaded.tokenizer, **save)
    return tmp_path / method


#: SmolLM2 cases: the four above, and Dynamic NTK frozen at twice the window (written as longrope)
SMOLLM2_CASES = {**{name: (name, params, {}) for name, params in CASES.items()},
                 "dynamic_ntk-frozen": ("dynamic_ntk", {"factor": 2.0}, {"freeze_length": 16384})}


@pytest.mark.smollm2
@pytest.mark.timeout(900)
@pytest.mark.parametrize("engine", ["vllm"])
@pytest.mark.parametrize("case", list(SMOLLM2_CASES))
def test_smollm2_past_its_window_in_the_engine_equals_ropekit(engine, case, smollm2, tmp_path):
    _engine(engine)
    method, params, save = SMOLLM2_CASES[case]
    report = verify(_smollm2_export(tmp_path, method, params, **save), engine, length=9000)
    print("engine report:", json.dumps(report.as_dict()))  # the README table's numbers (pytest -s)
    assert report.passed and report.details["positions_past_window"] >= 800, report.as_dict()


@pytest.mark.smollm2
@pytest.mark.timeout(900)
@pytest.mark.parametrize("engine", ["vllm"])
def test_a_passkey_at_12k_through_the_engine(engine, smollm2, tmp_path):
    """SmolLM2 fails this key at 12k without extension (README); with YaRN factor 2 ropekit retrieves it — and so
    does the engine serving the export."""
    _engine(engine)
    directory = _smollm2_export(tmp_path, "yarn", {"factor": 2.0})
    loaded = load_model(str(directory))
    sample = make_sample(loaded.tokenizer, 12288, 0.5, 0, seed=0)
    ids = loaded.tokenizer(sample.prompt).input_ids
    with torch.no_grad():
        out = loaded.model.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False,
                                    attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    ours = loaded.tokenizer.decode(out[0, len(ids):])
    assert first_integer(ours) == sample.key, ours
    request = {"model": str(directory), "token_ids": [ids], "n_ctx": 16384, "threads": 2, "dtype": "float32",
               "generate": {"max_new_tokens": 10}}
    response = run_engine(ENGINES[engine], request)
    theirs = loaded.tokenizer.decode(response["generated"][0])
    assert first_integer(theirs) == sample.key, theirs


@pytest.mark.parametrize("engine", ["vllm"])
def test_a_bare_longrope_directory_is_ropekits_model_and_the_keys_are_why(engine, tiny_exports, tmp_path):
    """`vllm serve DIR` with no flag: NTK-by-parts written as longrope carries vLLM's short_mscale/long_mscale in
    config.json, and vLLM computes ropekit's model; the same directory without them gets vLLM's own magnitude
    √(1 + ln s / ln L) and another model (the control)."""
    import shutil

    from ropekit.engines.verify import ropekit_logprobs, text_ids

    _engine(engine)
    loaded = load_model(str(tiny_exports["ntk_by_parts"]), dtype="float32")
    ids = text_ids(loaded.tokenizer, loaded.model.config.vocab_size, 120)
    ours = ropekit_logprobs(loaded.model, ids)
    stripped = tmp_path / "stripped"
    shutil.copytree(tiny_exports["ntk_by_parts"], stripped)
    config = json.loads((stripped / "config.json").read_text())
    for key in ("short_mscale", "long_mscale"):
        del config["rope_parameters"][key], config["rope_scaling"][key]
    (stripped / "config.json").write_text(json.dumps(config))
    diffs = {}
    for name, directory in (("bare", tiny_exports["ntk_by_parts"]), ("stripped", stripped)):
        request = {"model": str(directory), "token_ids": [ids], "n_ctx": 128, "threads": 2, "dtype": "float32",
                   "hf_overrides": {}}
        theirs = run_engine(ENGINES[engine], request)["logprobs"][0]
        diffs[name] = max(abs(a - b) for a, b in zip(ours[1:], theirs[1:]))
    print("bare longrope in vLLM:", json.dumps(diffs))
    # measured: bare 5.8e-7, stripped 2.0e-3 (vLLM's √(1 + ln 2 / ln 64) = 1.08 on a random tiny model): over
    # `verify`'s vLLM tolerance, so the bare directory without the keys fails it
    from ropekit.engines.verify import TOLERANCES

    assert diffs["bare"] <= 1e-4 and diffs["stripped"] > max(TOLERANCES[engine], 100 * diffs["bare"]), diffs


def _sharp_tiny_deepseek(method: str, **params):
    """A tiny DeepSeek-V3 that vLLM's CPU MLA accepts (kv_lora_rank 256 + rope 64 = 320, one of its head sizes; the
    expert bias vLLM loads only with topk_method noaux_tc), attention sharpened ×4 so that the RoPE shows in log p
    above the bfloat16 noise vLLM's MLA computes in."""
    model = build_tiny_model("deepseek_v3", hidden_size=256, num_heads=2, window=64)
    model.config.topk_method = "noaux_tc"
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.kv_a_proj_with_mqa.weight.mul_(4.0)
    ropekit.extend(model, method, **params)
    return model


@pytest.mark.timeout(900)
def test_deepseek_yarn_in_vllm_is_ropekits_model_with_the_plans_overrides(tmp_path):
    """vLLM serves a DeepSeek's YaRN as its own deepseek_yarn, which (in 0.32) never reads attention_factor: with the
    plan's overrides (an mscale that gives the magnitude) vLLM computes ropekit's model within the bfloat16 floor;
    the bare directory gets vLLM's own 0.1·ln s + 1 instead of 1.3 and is far off (the control)."""
    from ropekit.engines.verify import ropekit_logprobs, text_ids
    from ropekit.install.vllm import vllm_serving

    _engine("vllm")
    model = _sharp_tiny_deepseek("yarn", factor=2.0, attention_factor=1.3)
    ropekit.save_pretrained(model, tmp_path / "ds", tokenizer=byte_tokenizer(), rope_format="native")
    ids = text_ids(None, 256, 120)
    ours = ropekit_logprobs(model, ids)
    plan = vllm_serving(tmp_path / "ds")
    assert plan.exact and plan.hf_overrides

    def past_window(overrides):
        request = {"model": str(tmp_path / "ds"), "token_ids": [ids], "n_ctx": 128, "threads": 2,
                   "dtype": "bfloat16", "hf_overrides": overrides}
        theirs = run_engine(ENGINES["vllm"], request)["logprobs"][0]
        return max(abs(a - b) for p, (a, b) in enumerate(zip(ours, theirs)) if p >= 64 and a is not None and b is not None)

    served, bare = past_window(plan.hf_overrides), past_window({})
    print("deepseek yarn in vLLM, max |Δ log p| past the window:", served, "bare:", bare)
    assert served < 0.06  # measured 0.028 (vLLM 0.32.0, CPU)
    assert bare > 0.2  # measured 0.39
