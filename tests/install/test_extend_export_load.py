"""``ropekit.extend`` / ``save_pretrained`` / ``load`` / ``inspect_model`` on tiny models of every family.

References here are transformers itself (plain ``from_pretrained``, a fresh interpreter without ropekit),
naive uncached forwards, and the model before it was extended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

import ropekit
from ropekit import RopekitError
from family_support import applies
from ropekit.models.tiny import FAMILIES, build_tiny_model

#: every family with one plain RoPE at base 10,000 (Gemma 3's per-layer-type RoPE: tests/install/test_model_families.py)
ALL_FAMILIES = [f for f in FAMILIES if f != "gemma3_text"]
WINDOW = 64


def _kv_heads(model) -> int:
    return ropekit.rope_info(model).num_kv_heads


def _harpe_bases(model) -> list[float]:
    return [300.0 * 10**i for i in range(_kv_heads(model))]


#: name → (method, kwargs); ``None`` kwargs for HARPE means one distinct base per KV group of the model.
CASES = {
    "pi": ("pi", {"factor": 4.0}),
    "ntk": ("ntk", {"factor": 4.0}),
    "dynamic_ntk": ("dynamic_ntk", {"factor": 4.0}),
    "dynamic_ntk_trained": ("dynamic_ntk", {"factor": 4.0, "trained_length": 128}),
    "ntk_by_parts": ("ntk_by_parts", {"factor": 4.0}),
    "ntk_by_parts_dim": ("ntk_by_parts", {"factor": 4.0, "ramp": "dim"}),
    "yarn": ("yarn", {"factor": 4.0}),
    "abf": ("abf", {}),
    "entropy_abf": ("entropy_abf", {}),
    "harpe": ("harpe", None),
}
#: Entropy-ABF leaves layers 0 and 1 alone: its models need more than two layers for the scale to act.
LAYERS = {"entropy_abf": 4}
NATIVE = ["pi", "ntk", "abf", "yarn", "dynamic_ntk", "ntk_by_parts_dim"]
#: no transformers type of its own, but static frequencies: written exactly as transformers' longrope by default
LONGROPE = ["ntk_by_parts"]
ROPEKIT_ONLY = ["entropy_abf", "harpe", "dynamic_ntk_trained"]
assert set(NATIVE) | set(LONGROPE) | set(ROPEKIT_ONLY) == set(CASES)


def _supported(cases, table) -> list[tuple[str, str]]:
    """``(family, case)`` for every case whose method the family takes (tests/family_support.py)."""
    return [(f, c) for f in ALL_FAMILIES for c in cases if applies(f, table[c][0])]


def _extend(model, case: str):
    method, kwargs = CASES[case]
    if kwargs is None:
        kwargs = {"bases": _harpe_bases(model)}
    return ropekit.extend(model, method, **kwargs)


def _extended(family: str, case: str, **build):
    build.setdefault("num_layers", LAYERS.get(case, 2))
    return _extend(build_tiny_model(family, **build), case)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _q_weight(model) -> torch.nn.Parameter:
    layer = model.base_model.layers[0]
    attn = getattr(layer, "self_attn", None) or layer.attention  # gpt_neox: .attention
    for name in ("q_proj", "qkv_proj", "query_key_value"):
        if hasattr(attn, name):
            return getattr(attn, name).weight
    raise AssertionError(type(attn))


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert isinstance(err.value, RopekitError)
    assert msg and "\n" not in msg, repr(msg)
    return msg


# ================================================================ extend
@pytest.mark.parametrize("method", ["yarn", "pi", "ntk_by_parts"])
@pytest.mark.parametrize("target,factor", [(256, 4.0), (100, 100 / 64), (1000, 1000 / 64)])
def test_target_length_sets_factor(method, target, factor):
    model = ropekit.extend(build_tiny_model("llama"), method, target_length=target)
    rope = model.config.rope_parameters
    assert rope["rope_type"] == f"ropekit_{method}"
    assert rope["factor"] == pytest.approx(factor, rel=1e-12)
    assert model.config.max_position_embeddings == target
    record = ropekit.installed(model)
    assert record["method"] == method and record["params"]["factor"] == pytest.approx(factor, rel=1e-12)
    assert record["base"]["max_position_embeddings"] == WINDOW


@pytest.mark.parametrize("family,case", _supported(["pi", "yarn", "entropy_abf", "harpe"], CASES))
def test_cached_generate_equals_uncached_loop(family, case, make_ids):
    model = _extended(family, case)
    prompt = make_ids(100, seed=7)  # beyond the 64-token window: the extension is active
    out = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=5, do_sample=False,
        output_logits=True, return_dict_in_generate=True, pad_token_id=0,
    )
    seq = prompt
    for step in range(5):
        with torch.no_grad():
            last = model(seq, use_cache=False).logits[:, -1]
        torch.testing.assert_close(out.logits[step], last, rtol=0, atol=1e-5, msg=lambda m: f"step {step}: {m}")
        seq = torch.cat([seq, last.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out.sequences, seq)


@pytest.mark.parametrize("case", ["yarn", "entropy_abf", "harpe"])
def test_left_padded_batch_generates_like_single_prompts(case, make_ids):
    """Batch of two prompts, the shorter left-padded: each row decodes exactly as it does alone."""
    model = _extended("llama", case)
    a, b = make_ids(90, seed=1), make_ids(70, seed=2)
    batch = torch.cat([a, torch.cat([torch.zeros(1, 20, dtype=torch.long), b], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :20] = 0
    kwargs = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    both = model.generate(batch, attention_mask=mask, **kwargs)
    alone_a = model.generate(a, attention_mask=torch.ones_like(a), **kwargs)
    alone_b = model.generate(b, attention_mask=torch.ones_like(b), **kwargs)
    assert torch.equal(both.sequences[0, 90:], alone_a.sequences[0, 90:])
    assert torch.equal(both.sequences[1, 90:], alone_b.sequences[0, 70:])
    for step in range(5):
        torch.testing.assert_close(both.logits[step][0], alone_a.logits[step][0], rtol=0, atol=1e-5)
        torch.testing.assert_close(both.logits[step][1], alone_b.logits[step][0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family,case", _supported(list(CASES), CASES))
def test_extend_leaves_weights_untouched_and_changes_the_model(family, case, make_ids):
    model = build_tiny_model(family, num_layers=LAYERS.get(case, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = make_ids(150)
    plain = _logits(model, ids)
    _extend(model, case)
    after = model.state_dict()
    assert set(after) == set(before)
    for key, value in before.items():
        assert torch.equal(after[key], value), key
    # Every case is a real extension: at 150 tokens (> window) the model computes something else.
    assert (_logits(model, ids) - plain).abs().max() > 1e-5


@pytest.mark.parametrize("family,case", _supported(list(CASES), CASES))
def test_gradients_flow(family, case, make_ids):
    model = _extended(family, case)
    model.train()
    ids = make_ids(100)
    loss = model(ids, labels=ids).loss
    loss.backward()
    grad = _q_weight(model).grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().max() > 0
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


# ================================================================ identity settings
#: name → (method, kwargs, length): every method at its identity setting. Frequency methods at factor 1 are
#: checked beyond the window (200 > 64); Entropy-ABF only inside it, where its scale is 1.
IDENTITY = {
    "pi": ("pi", {"factor": 1.0}, 200),
    "ntk": ("ntk", {"factor": 1.0}, 200),
    "dynamic_ntk": ("dynamic_ntk", {"factor": 1.0}, 200),
    "dynamic_ntk_trained": ("dynamic_ntk", {"factor": 1.0, "trained_length": 128}, 200),
    "ntk_by_parts": ("ntk_by_parts", {"factor": 1.0}, 200),
    "ntk_by_parts_dim": ("ntk_by_parts", {"factor": 1.0, "ramp": "dim"}, 200),
    "yarn": ("yarn", {"factor": 1.0}, 200),
    "yarn_wavelength": ("yarn", {"factor": 1.0, "blend": "wavelength"}, 200),
    "abf": ("abf", {"rope_theta": 10000.0}, 200),
    "entropy_abf": ("entropy_abf", {"rope_theta": 10000.0}, WINDOW),
    "harpe": ("harpe", "theta", 200),
}


@pytest.mark.parametrize("family,case", _supported(list(IDENTITY), IDENTITY))
def test_identity_setting_is_bit_identical(family, case, make_ids):
    method, kwargs, length = IDENTITY[case]
    plain = build_tiny_model(family, num_layers=LAYERS.get(case, 2))
    model = build_tiny_model(family, num_layers=LAYERS.get(case, 2))
    if kwargs == "theta":
        kwargs = {"bases": [10000.0] * _kv_heads(model)}
    ropekit.extend(model, method, **kwargs)
    assert ropekit.installed(model)["method"] == method
    ids = make_ids(length)
    assert torch.equal(_logits(model, ids), _logits(plain, ids))


@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3"])
def test_harpe_identity_mha_and_gqa(family, make_ids):
    """HARPE with every base = the model's θ is the plain model, on MHA and on GQA layouts."""
    for kv in (None, 2, 1):  # MHA (4 heads), GQA (2 groups), MQA (1 group)
        plain = build_tiny_model(family, num_kv_heads=kv)
        model = build_tiny_model(family, num_kv_heads=kv)
        n = _kv_heads(model)
        assert n == (kv or 4)
        ropekit.extend(model, "harpe", bases=[10000.0] * n)
        ids = make_ids(200)
        assert torch.equal(_logits(model, ids), _logits(plain, ids)), f"num_kv_heads={kv}"


def test_entropy_abf_identity_ends_at_the_window(make_ids):
    """The identity setting of Entropy-ABF holds inside the window only: beyond it the scale is > 1."""
    plain = build_tiny_model("llama", num_layers=4)
    model = ropekit.extend(build_tiny_model("llama", num_layers=4), "entropy_abf", rope_theta=10000.0)
    ids = make_ids(200)
    got, want = _logits(model, ids), _logits(plain, ids)
    assert torch.equal(got[:, :WINDOW], want[:, :WINDOW])
    assert (got[:, WINDOW:] - want[:, WINDOW:]).abs().max() > 1e-4


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_partial_rotary_factor_ignored_by_the_family(family, make_ids):
    """Llama/Mistral/Qwen2/Qwen3 in transformers 5.x rotate the whole head even when rope_parameters carries a
    partial_rotary_factor (their rotary module ignores it). ropekit must follow the model — or refuse with a
    one-line error — not install a half-width rotation that crashes at the first forward."""
    plain = build_tiny_model(family, partial_rotary_factor=0.5)
    assert plain.base_model.rotary_emb.inv_freq.shape[0] * 2 == 16  # transformers: full rotary
    model = build_tiny_model(family, partial_rotary_factor=0.5)
    try:
        ropekit.extend(model, "pi", factor=1.0)
    except RopekitError:
        return
    ids = make_ids(100)
    assert torch.equal(_logits(model, ids), _logits(plain, ids))


@pytest.mark.parametrize("method,params", [("pi", {"factor": 2.0}), ("yarn", {"factor": 2.0})])
def test_native_export_writes_the_rotary_fraction_the_model_rotates(method, params, tmp_path, make_ids):
    """A Llama config carrying partial_rotary_factor 0.5 rotates the whole head (the family ignores it), while
    transformers' linear and yarn types read the factor: the export must say 1.0, or plain transformers builds
    a half-width rotation that fails at the first forward."""
    model = build_tiny_model("llama", partial_rotary_factor=0.5)
    ropekit.extend(model, method, **params)
    report = ropekit.save_pretrained(model, tmp_path)
    assert report["format"] == "native"
    plain = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = make_ids(150)
    assert torch.allclose(_logits(plain, ids), _logits(model, ids), atol=1e-5)


def test_dynamic_ntk_native_export_declares_the_original_window_of_its_rule(tmp_path, make_ids):
    """transformers' `dynamic` takes max_position_embeddings as the window C of s·L/C − (s − 1); with
    original_max_position_embeddings below the model's window ropekit's C is that parameter, and plain
    transformers must compute the same frequencies at every length."""
    model = build_tiny_model("llama")
    window = model.config.max_position_embeddings
    ropekit.extend(model, "dynamic_ntk", factor=2.0, original_max_position_embeddings=window // 2, trained_length=window // 2)
    report = ropekit.save_pretrained(model, tmp_path)
    assert report["format"] == "native"
    plain = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    for length in (window // 2 + 20, window + 40, 3 * window):
        ids = make_ids(length)
        assert torch.allclose(_logits(plain, ids), _logits(model, ids), atol=1e-5), f"length {length}"


def test_yarn_export_names_the_transformers_4_releases_that_recompute_its_factor(tmp_path):
    """transformers 4.51–4.55's _compute_yarn_parameters replaces rope_scaling's factor by max_position_embeddings /
    original_max_position_embeddings (checked in the 4.54.1 wheel; 4.56 reads it as written). A factor whose
    extended window is not an integer multiple (1.3 × 64 → 83 positions, read back as 83/64 = 1.296875) is not
    the same model there; factor 2 (128/64) is."""
    model = build_tiny_model("llama")
    window = model.config.max_position_embeddings
    ropekit.extend(model, "yarn", factor=1.3)
    report = ropekit.save_pretrained(model, tmp_path / "odd")
    config = json.loads((tmp_path / "odd" / "config.json").read_text())
    implied = config["max_position_embeddings"] / window
    assert implied != 1.3 and report["transformers"] and not report["transformers4"]
    why = config["ropekit"]["export"]["transformers4_refusal"]
    assert "4.51–4.55" in why and f"{implied:.6g}" in why and "\n" not in why
    model = build_tiny_model("llama")
    ropekit.extend(model, "yarn", factor=2.0)
    assert ropekit.save_pretrained(model, tmp_path / "even")["transformers4"]


def test_saving_over_a_model_directory_never_deletes_what_a_model_does_not_hold(tmp_path):
    """A second save replaces a model directory (its config, weights, tokenizer and cards) whole; a file the export
    does not write — a GGUF `ropekit export DIR --format gguf` put beside the weights, notes, checkpoints — makes it
    refuse in one line, naming the file, and the directory stays as it was."""
    from ropekit.models.byte_tokenizer import byte_tokenizer

    out = tmp_path / "model"
    model = build_tiny_model("llama")
    ropekit.extend(model, "yarn", factor=2.0)
    ropekit.save_pretrained(model, out, tokenizer=byte_tokenizer())
    other = build_tiny_model("llama")
    ropekit.extend(other, "pi", factor=2.0)
    ropekit.save_pretrained(other, out, tokenizer=byte_tokenizer())  # only model files: replaced
    assert json.loads((out / "config.json").read_text())["ropekit"]["method"] == "pi"
    (out / "model-f16.gguf").write_bytes(b"GGUF")
    (out / "checkpoints").mkdir()
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(RopekitError) as refused:
        ropekit.save_pretrained(model, out, tokenizer=byte_tokenizer())
    line = refused.value.one_line()
    assert "checkpoints/" in line and "model-f16.gguf" in line and "\n" not in line
    assert sorted(p.name for p in out.iterdir()) == before
    assert json.loads((out / "config.json").read_text())["ropekit"]["method"] == "pi"


#: The rope types transformers 4.57.1 builds: its modeling_rope_utils.ROPE_INIT_FUNCTIONS (read in the wheel).
TRANSFORMERS_457_ROPE_TYPES = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"}


def test_a_gemma3_export_4x_cannot_compute_names_its_type_where_4x_reads_it(tmp_path, make_ids):
    """transformers 4.57's Gemma 3 config defaults rope_theta 1e6, rope_local_base_freq 1e4 and no rope_scaling: a
    directory without those keys loads there as the *unextended* model, silently. A full-attention type 4.x lacks
    (ropekit_pi) is written under rope_scaling, so 4.x fails building it (KeyError), as for one RoPE; transformers 5
    still builds the same model from the file."""
    model = build_tiny_model("gemma3_text")
    ropekit.extend(model, "pi", factor=2.0)
    ids = make_ids(3 * model.config.max_position_embeddings)
    expected = _logits(model, ids)
    report = ropekit.save_pretrained(model, tmp_path / "g", rope_format="ropekit")
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    assert config["rope_parameters"]["full_attention"]["rope_type"] == "ropekit_pi"
    assert config["rope_scaling"]["rope_type"] not in TRANSFORMERS_457_ROPE_TYPES  # 4.x: KeyError, not a model
    assert config["rope_theta"] == config["rope_parameters"]["full_attention"]["rope_theta"]
    assert config["rope_local_base_freq"] == config["rope_parameters"]["sliding_attention"]["rope_theta"]
    assert not report["transformers4"] and "KeyError 'ropekit_pi'" in config["ropekit"]["export"]["transformers4_refusal"]
    loaded = ropekit.load(tmp_path / "g")
    torch.testing.assert_close(_logits(loaded, ids), expected, rtol=0, atol=1e-5)


def test_deepseek_softmax_scale_is_never_changed_by_an_install_or_an_export(tmp_path, make_ids):
    """DeepSeek-V3's attention multiplies its softmax scale by (0.1·mscale_all_dim·ln s + 1)² when rope_parameters
    carry mscale_all_dim (transformers' yarn_apply_mscale), fixed when the model is built; an installed method
    changes the rotary embedding only. So YaRN's mscale_all_dim is refused there in one line, and an export form
    that would make the family build another scale is not written: PI on a DeepSeek that ships yarn with
    mscale_all_dim keeps the ropekit form (longrope would drop the base's scale), which ropekit.load restores."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_get_mscale

    model = build_tiny_model("deepseek_v3")
    with pytest.raises(RopekitError, match="mscale_all_dim also scales the attention softmax") as err:
        ropekit.extend(model, "yarn", factor=2.0, mscale=1.0, mscale_all_dim=1.0)
    assert "\n" not in str(err.value) and ropekit.installed(model) is None
    ropekit.extend(build_tiny_model("llama"), "yarn", factor=2.0, mscale=1.0, mscale_all_dim=1.0)  # Llama: rotary only

    shipped = build_tiny_model("deepseek-v3")
    plain_scale = build_tiny_model("deepseek_v3").model.layers[0].self_attn.scaling
    assert shipped.model.layers[0].self_attn.scaling == pytest.approx(plain_scale * yarn_get_mscale(4.0, 1.0) ** 2)
    ropekit.extend(shipped, "pi", factor=2.0)
    report = ropekit.save_pretrained(shipped, tmp_path / "pi")
    assert report["format"] == "ropekit"
    loaded = ropekit.load(tmp_path / "pi")
    ids = make_ids(150)
    assert torch.equal(_logits(loaded, ids), _logits(shipped, ids))
    with pytest.raises(RopekitError, match="softmax scale"):
        ropekit.save_pretrained(shipped, tmp_path / "pi-longrope", rope_format="longrope")


# ================================================================ save → load
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every case on llama, saved once: {case: (directory, report, model)}."""
    out = {}
    for case in CASES:
        model = _extended("llama", case)
        path = tmp_path_factory.mktemp(case)
        out[case] = (path, ropekit.save_pretrained(model, path), model)
    return out


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt_neox"])
@pytest.mark.parametrize("case", list(CASES))
def test_save_load_round_trip(family, case, tmp_path, make_ids):
    model = _extended(family, case)
    report = ropekit.save_pretrained(model, tmp_path)
    assert report["method"] == CASES[case][0]
    assert report["transformers"] == (case in NATIVE or case in LONGROPE)
    assert report["format"] == ("native" if case in NATIVE else "longrope" if case in LONGROPE else "ropekit")
    loaded = ropekit.load(tmp_path)
    assert ropekit.installed(loaded)["method"] == CASES[case][0]
    assert ropekit.installed(loaded)["params"] == ropekit.installed(model)["params"]
    for length in (150, 40):
        ids = make_ids(length)
        assert torch.equal(_logits(loaded, ids), _logits(model, ids)), f"length {length}"


@pytest.mark.parametrize("case", ["pi", "abf", "entropy_abf"])
def test_save_load_round_trip_phi3(case, tmp_path, make_ids):
    """Phi-3 too (its config validates rope_type: only 'default'/'longrope' are accepted)."""
    model = _extended("phi3", case)
    ropekit.save_pretrained(model, tmp_path)
    loaded = ropekit.load(tmp_path)
    ids = make_ids(150)
    assert torch.equal(_logits(loaded, ids), _logits(model, ids))


EXPECTED_NATIVE_TYPE = {
    "pi": "linear", "ntk": "default", "abf": "default", "yarn": "yarn", "dynamic_ntk": "dynamic",
    "ntk_by_parts_dim": "yarn",
}


@pytest.mark.parametrize("case", NATIVE)
def test_plain_transformers_loads_native_exports(case, saved, make_ids):
    path, report, model = saved[case]
    assert report["transformers"] is True
    config = json.loads((path / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == EXPECTED_NATIVE_TYPE[case]
    plain = AutoModelForCausalLM.from_pretrained(path)
    plain.eval()
    assert plain.base_model.rotary_emb.rope_type == EXPECTED_NATIVE_TYPE[case]  # transformers' own code path
    for length in (150, 40):
        ids = make_ids(length)
        assert torch.equal(_logits(plain, ids), _logits(model, ids)), f"length {length}"


_PLAIN_LOADER = r"""
import json, os, sys, traceback
from transformers import AutoModelForCausalLM  # imported once; each load runs in a forked child
import transformers.models.llama.modeling_llama  # noqa: F401  (warm the lazy import the children need)

results = {}
for path in sys.argv[1:]:
    err_file = path + ".plain-load.err"
    pid = os.fork()
    if pid == 0:  # child: what `python -c "AutoModelForCausalLM.from_pretrained(path)"` does, exit status included
        fd = os.open(err_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        try:
            AutoModelForCausalLM.from_pretrained(path)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    results[path] = {"exit": os.waitstatus_to_exitcode(status), "stderr": open(err_file).read()}
results["ropekit_imported"] = "ropekit" in sys.modules
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def plain_load_attempts(saved):
    """Each ropekit-only export opened by plain transformers in a fresh interpreter that never imports ropekit.

    One interpreter imports transformers once and forks a child per directory (four separate interpreters
    cost ~4× the import time on a 2-core runner); each child's exit status and stderr are reported.
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    paths = [str(saved[case][0]) for case in ROPEKIT_ONLY]
    proc = subprocess.run(
        [sys.executable, "-c", _PLAIN_LOADER, *paths], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results.pop("ropekit_imported") is False
    return {case: (results[p]["exit"], results[p]["stderr"]) for case, p in zip(ROPEKIT_ONLY, paths)}


@pytest.mark.parametrize("case", ROPEKIT_ONLY)
def test_plain_transformers_fails_loudly_on_ropekit_only_exports(case, saved, plain_load_attempts):
    path, report, _ = saved[case]
    assert report["transformers"] is False
    assert json.loads((path / "config.json").read_text())["rope_parameters"]["rope_type"] == f"ropekit_{CASES[case][0]}"
    code, err = plain_load_attempts[case]
    assert code != 0, err
    assert "ropekit_" in err, err
    assert f"ropekit_{CASES[case][0]}" in err, err.splitlines()[-1:]


# ================================================================ bad input
@pytest.fixture
def llama():
    return build_tiny_model("llama")


BAD_CALLS = {
    "unknown method": (("yran",), {"factor": 2.0}, "unknown method 'yran'"),
    "unknown parameter": (("yarn",), {"factor": 2.0, "bogus": 1}, "unknown parameter 'bogus'"),
    "factor below 1": (("pi",), {"factor": 0.5}, "factor"),
    "target not beyond window": (("yarn",), {"target_length": 64}, "64"),
    "target below window": (("yarn",), {"target_length": 32}, "32"),
    "factor and target": (("yarn",), {"factor": 2.0, "target_length": 256}, "both factor and target_length"),
    "factor of wrong type": (("pi",), {"factor": "abc"}, "'abc'"),
    "target of wrong type": (("pi",), {"target_length": "abc"}, "target_length"),
    "harpe too few bases": (("harpe",), {"bases": [1e4]}, "1 bases"),
    "harpe too many bases": (("harpe",), {"bases": [1e4, 2e4, 3e4]}, "3 bases"),
    "beta order": (("yarn",), {"factor": 2.0, "beta_fast": 1.0, "beta_slow": 32.0}, "beta_slow"),
    "bad choice": (("yarn",), {"factor": 2.0, "ramp": "cubic"}, "ramp"),
    # a scale method given no scale computed the model's own RoPE (factor 1) and called it extended
    "yarn without a scale": (("yarn",), {}, "yarn needs a scale"),
    "pi without a scale": (("pi",), {}, "pi needs a scale"),
    "dynamic_ntk without a scale": (("dynamic_ntk",), {}, "dynamic_ntk needs a scale"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_input_raises_one_line_and_leaves_model_alone(name, llama, make_ids):
    args, kwargs, needle = BAD_CALLS[name]
    rope_before = dict(llama.config.rope_parameters)
    ids = make_ids(100)
    plain = _logits(llama, ids)
    with pytest.raises(RopekitError) as err:
        ropekit.extend(llama, *args, **kwargs)
    assert needle in _one_line(err)
    assert llama.config.rope_parameters == rope_before
    assert ropekit.installed(llama) is None
    assert llama.config.max_position_embeddings == WINDOW
    assert torch.equal(_logits(llama, ids), plain)


def test_a_factor_of_one_written_out_is_accepted_as_a_control(llama, make_ids):
    """Only a scale left out is refused: factor=1 written out is the model's own RoPE, on purpose."""
    ids = make_ids(100)
    plain = _logits(llama, ids)
    ropekit.extend(llama, "yarn", factor=1.0)
    assert ropekit.installed(llama)["params"]["factor"] == 1.0
    assert torch.allclose(_logits(llama, ids), plain, atol=1e-6)


def test_unknown_method_suggests_the_near_miss(llama):
    with pytest.raises(RopekitError) as err:
        ropekit.extend(llama, "yran", factor=2.0)
    assert "did you mean yarn" in _one_line(err)
    with pytest.raises(RopekitError) as err:
        ropekit.get_method("dynamic-ntc")
    assert "dynamic_ntk" in _one_line(err)


def test_extending_twice_raises(llama, make_ids):
    ropekit.extend(llama, "yarn", factor=2.0)
    ids = make_ids(100)
    once = _logits(llama, ids)
    rope = dict(llama.config.rope_parameters)
    with pytest.raises(RopekitError) as err:
        ropekit.extend(llama, "pi", factor=2.0)
    assert "already extended" in _one_line(err) and "yarn" in str(err.value)
    assert llama.config.rope_parameters == rope
    assert torch.equal(_logits(llama, ids), once)


def test_model_without_rope_raises():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(RopekitError) as err:
        ropekit.extend(gpt2, "yarn", factor=2.0)
    assert "RoPE" in _one_line(err) and "gpt2" in str(err.value)
    with pytest.raises(RopekitError):
        ropekit.inspect_model(gpt2)


def test_harpe_wrong_bases_on_mha_names_heads():
    model = build_tiny_model("gpt_neox")  # MHA: one base per head
    with pytest.raises(RopekitError) as err:
        ropekit.extend(model, "harpe", bases=[1e4, 2e4])
    assert "2 bases" in _one_line(err) and "4 head" in str(err.value)


# ================================================================ inspect_model
@pytest.mark.parametrize("family,expected", [
    ("llama", dict(model_type="llama", head_dim=16, rotary_dim=16, num_heads=4, num_kv_heads=2)),
    ("gpt_neox", dict(model_type="gpt_neox", head_dim=16, rotary_dim=4, num_heads=4, num_kv_heads=4)),
    ("phi3", dict(model_type="phi3", head_dim=16, rotary_dim=16, num_heads=4, num_kv_heads=2)),
])
def test_inspect_model_reports_facts(family, expected):
    model = build_tiny_model(family)
    facts = ropekit.inspect_model(model)
    assert facts["architecture"] == type(model).__name__
    for key, value in expected.items():
        assert facts[key] == value, key
    assert facts["rope_type"] == "default"
    assert facts["rope_theta"] == 10000.0
    assert facts["window"] == WINDOW and facts["max_position_embeddings"] == WINDOW
    assert facts["num_layers"] == 2
    assert facts["parameters"] == sum(p.numel() for p in model.parameters())
    assert facts["extended_with"] is None
    names = [m["name"] for m in facts["methods"]]
    assert names == [m.name for m in ropekit.list_methods()]
    assert {"pi", "ntk", "dynamic_ntk", "ntk_by_parts", "yarn", "abf", "entropy_abf", "harpe"} <= set(names)
    json.dumps(facts)  # JSON-ready


def test_inspect_model_after_extend():
    model = ropekit.extend(build_tiny_model("llama"), "yarn", factor=4.0)
    facts = ropekit.inspect_model(model)
    assert facts["rope_type"] == "ropekit_yarn"
    assert facts["window"] == WINDOW  # the pretrained window, from the record
    assert facts["max_position_embeddings"] == 4 * WINDOW
    assert facts["rope_theta"] == 10000.0
    assert facts["extended_with"]["method"] == "yarn"
    assert facts["extended_with"]["params"]["factor"] == 4.0
