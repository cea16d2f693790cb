"""Each contact of :mod:`ropekit.adapters.transformers` with transformers' internals, checked against transformers.

Every test below exercises one contact the way ropekit relies on it, with transformers' own objects as the
reference (its model classes, its registries, its rotary modules), and says in its docstring which transformers
release it was checked with. :data:`CHECKED_WITH` is the range of releases these tests were run against; a
transformers outside it fails :func:`test_installed_transformers_is_one_the_contacts_were_checked_with` until
someone re-runs this file against it and widens the range. :data:`CONTACTS` maps every public function of the
adapter to its test, and a test fails when an adapter function has none.

Also here: registration is explicit (nothing on import, in a fresh interpreter), idempotent, done by ``extend``
in a fresh process (as a study worker starts), and no module outside the adapter touches transformers' internals.
"""

from __future__ import annotations

import logging

import ast
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from packaging.version import Version
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.integrations import deepspeed as hf_deepspeed
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RotaryEmbeddingConfigMixin
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama import modeling_llama

import ropekit
from ropekit.adapters import transformers as hf
from ropekit.models.tiny import build_tiny_model, tiny_config

SRC = Path(__file__).resolve().parents[2] / "src" / "ropekit"

#: The transformers releases these contact tests were run against: ``[low, high)``.
CHECKED_WITH = (Version("5.24.0"), Version("5.25"))
CHECKED = "transformers 5.24.0"

#: Adapter function → the test that checks its contact.
CONTACTS = {
    "rope_init_function": "test_rope_init_registry_is_what_rotary_modules_call",
    "register_rope_init": "test_rope_init_registry_is_what_rotary_modules_call",
    "rotary_frequencies": "test_rope_init_with_a_length_gives_what_the_dynamic_update_installs",
    "ropekit_drives_rotary": "test_transformers_builds_rotary_modules_outside_ropekits_block",
    "rotary_driven_by_ropekit": "test_transformers_builds_rotary_modules_outside_ropekits_block",
    "register_rope_validator": "test_validator_hook_is_looked_up_by_rope_type_when_a_config_is_built",
    "rope_validator": "test_validator_hook_is_looked_up_by_rope_type_when_a_config_is_built",
    "register_attention": "test_a_registered_attention_is_called_with_its_kernels_mask",
    "registered_attention": "test_a_registered_attention_is_called_with_its_kernels_mask",
    "registered_mask": "test_a_registered_attention_is_called_with_its_kernels_mask",
    "has_attention_kernel": "test_kernels_are_the_ones_the_model_calls",
    "attention_kernel": "test_kernels_are_the_ones_the_model_calls",
    "model_file_global": "test_kernels_are_the_ones_the_model_calls",
    "global_attention_function": "test_the_global_attention_entry_is_what_the_model_calls",
    "set_global_attention_function": "test_the_global_attention_entry_is_what_the_model_calls",
    "attn_implementation": "test_attn_implementation_is_read_and_preset_on_the_config",
    "preset_attn_implementation": "test_attn_implementation_is_read_and_preset_on_the_config",
    "causal_lm_class": "test_auto_mapping_and_class_flags",
    "is_causal_lm_type": "test_auto_mapping_and_class_flags",
    "supports_sdpa": "test_auto_mapping_and_class_flags",
    "no_split_modules": "test_auto_mapping_and_class_flags",
    "expecting_unexpected_keys": "test_expected_extra_keys_are_not_reported_and_the_class_is_restored",
    "is_rotary": "test_rotary_modules_are_found_read_and_rebuilt",
    "rotary_modules": "test_rotary_modules_are_found_read_and_rebuilt",
    "rotary_inv_freq": "test_rotary_modules_are_found_read_and_rebuilt",
    "rotary_attention_factor": "test_rotary_modules_are_found_read_and_rebuilt",
    "rebuild_rotary": "test_rotary_modules_are_found_read_and_rebuilt",
    "set_rotary_frequencies": "test_set_frequencies_are_what_the_rotary_module_applies",
    "attention_modules": "test_attention_modules_are_one_per_layer",
    "packed_sequence_kwargs": "test_packed_rows_are_found_where_transformers_flash_path_finds_them",
    "gguf_architectures": "test_gguf_loader_globals",
    "gguf_progress_bar_disabled": "test_gguf_loader_globals",
    "unset_deepspeed_config": "test_unset_deepspeed_config_lifts_zero3",
}


def _logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(ids, **kwargs).logits


# ---------------------------------------------------------------- the version and the inventory


def test_installed_transformers_is_one_the_contacts_were_checked_with():
    low, high = CHECKED_WITH
    installed = Version(transformers.__version__)
    assert low <= installed < high, (
        f"transformers {installed} is outside the releases the adapter's contacts were checked with "
        f"[{low}, {high}): run this file against it and widen CHECKED_WITH")


def test_every_adapter_function_has_a_contact_test():
    public = {name for name, obj in vars(hf).items()
              if inspect.isfunction(obj) and obj.__module__ == hf.__name__ and not name.startswith("_")}
    assert public == set(CONTACTS)
    tests = {name for name, obj in globals().items() if name.startswith("test_") and callable(obj)}
    assert set(CONTACTS.values()) <= tests


# ---------------------------------------------------------------- rope-init registry and validator hook


def test_transformers_builds_rotary_modules_outside_ropekits_block(tmp_path):
    """Checked with transformers 5.24.0: ``from_pretrained`` calls a rope type's init function without a length
    when it builds the rotary module (on the meta device) and again when it initialises the non-persistent
    ``inv_freq`` (``_init_weights``), outside :func:`ropekit_drives_rotary`; ``rebuild_rotary`` and
    ``rotary_frequencies`` call it inside, and the block ends with them."""
    seen = []

    def probe(config, device=None, seq_len=None, layer_type=None):
        seen.append((seq_len, hf.rotary_driven_by_ropekit()))
        return torch.linspace(1.0, 0.01, 8), 1.0

    name = "ropekit_contact_probe"
    hf.register_rope_init(name, probe)
    try:
        LlamaForCausalLM(tiny_config("llama", rope_scaling={"rope_type": name})).save_pretrained(tmp_path)
        seen.clear()
        model = AutoModelForCausalLM.from_pretrained(tmp_path)
        assert len(seen) >= 2 and seen == [(None, False)] * len(seen)  # built, then its buffer initialised
        seen.clear()
        hf.rebuild_rotary(model)
        hf.rotary_frequencies(model.model.rotary_emb, 40)
        assert seen == [(None, True), (40, True)]
        assert not hf.rotary_driven_by_ropekit()
        with hf.ropekit_drives_rotary():
            assert hf.rotary_driven_by_ropekit()
        assert not hf.rotary_driven_by_ropekit()
    finally:
        ROPE_INIT_FUNCTIONS.pop(name, None)


def test_rope_init_registry_is_what_rotary_modules_call():
    """Checked with transformers 5.24.0: a rotary module looks its rope type up in ``ROPE_INIT_FUNCTIONS`` when
    built and applies what the function returns; ``rope_init_function`` gives transformers' own functions."""
    calls = []

    def probe(config, device=None, seq_len=None, layer_type=None):
        calls.append((config, device, seq_len, layer_type))
        return torch.linspace(1.0, 0.01, 8), 1.25

    name = "ropekit_contact_probe"
    hf.register_rope_init(name, probe)
    try:
        assert hf.rope_init_function(name) is probe and ROPE_INIT_FUNCTIONS[name] is probe
        config = tiny_config("llama", rope_scaling={"rope_type": name})  # head_dim 16: 8 frequencies
        model = AutoModelForCausalLM.from_config(config)
        rotary = model.model.rotary_emb
        assert calls and calls[0][0] is rotary.config
        torch.testing.assert_close(rotary.inv_freq, torch.linspace(1.0, 0.01, 8))
        assert rotary.attention_scaling == 1.25
        cos, _ = rotary(torch.zeros(1, 3, 16), torch.arange(3)[None])
        angles = torch.arange(3.0)[:, None] * torch.linspace(1.0, 0.01, 8)
        torch.testing.assert_close(cos[0], torch.cat([angles, angles], -1).cos() * 1.25)
    finally:
        ROPE_INIT_FUNCTIONS.pop(name, None)
    yarn = tiny_config("qwen2.5-yarn")
    reference = AutoModelForCausalLM.from_config(yarn).model.rotary_emb
    ours, factor = hf.rope_init_function("yarn")(yarn, None, None)
    torch.testing.assert_close(ours, reference.inv_freq)
    assert factor == reference.attention_scaling
    assert hf.rope_init_function("no_such_rope_type") is None


def test_rope_init_with_a_length_gives_what_the_dynamic_update_installs():
    """Checked with transformers 5.24.0: ``fn(config, device, seq_len)`` of a length-dependent rope type is what
    transformers' ``@dynamic_rope_update`` installs for an input of that length — and that update runs for any
    rope type whose name contains ``dynamic``, ropekit's ``ropekit_dynamic_*`` types included."""
    config = tiny_config("llama", window=32, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    model = AutoModelForCausalLM.from_config(config).eval()
    rotary = model.model.rotary_emb
    rotary(torch.zeros(1, 100, 16), torch.arange(100)[None])  # longer than the 64 declared: transformers recomputes
    expected, factor = hf.rotary_frequencies(rotary, torch.tensor(100))
    torch.testing.assert_close(rotary.inv_freq, expected)
    assert float(rotary.attention_scaling) == float(factor)
    assert not torch.equal(rotary.inv_freq, rotary.original_inv_freq)

    seen = []

    def probe(config, device=None, seq_len=None, layer_type=None):
        seen.append(None if seq_len is None else int(seq_len))
        return ROPE_INIT_FUNCTIONS["dynamic"](config, device, seq_len)

    name = "ropekit_contact_dynamic_probe"
    hf.register_rope_init(name, probe)
    try:
        config = tiny_config("llama", window=32, rope_scaling={"rope_type": name, "factor": 2.0})
        rotary = AutoModelForCausalLM.from_config(config).model.rotary_emb
        rotary(torch.zeros(1, 100, 16), torch.arange(100)[None])
        assert seen[-1] == 100 and set(seen[:-1]) == {None}  # built (maybe re-initialised), then the update
    finally:
        ROPE_INIT_FUNCTIONS.pop(name, None)


@pytest.fixture
def transformers_warnings_reach_caplog():
    """transformers' root logger propagates only where CI is set (its logging._configure_library_root_logger) and
    other tests may lower its verbosity: here its warnings reach pytest's handler whatever ran before."""
    from transformers.utils import logging as hf_logging

    root = logging.getLogger("transformers")
    propagate, level = root.propagate, hf_logging.get_verbosity()
    hf_logging.enable_propagation()
    hf_logging.set_verbosity_warning()
    try:
        yield
    finally:
        root.propagate = propagate
        hf_logging.set_verbosity(level)


def test_validator_hook_is_looked_up_by_rope_type_when_a_config_is_built(caplog, transformers_warnings_reach_caplog):
    """Checked with transformers 5.24.0: building a config calls ``_validate_<rope_type>_rope_parameters`` of
    ``RotaryEmbeddingConfigMixin`` with the parameters and ``ignore_keys`` (warning when there is none), and an
    exception it raises reaches the caller as the cause of the config's validation error."""
    name = "ropekit_contact_validated"
    ROPE_INIT_FUNCTIONS[name] = ROPE_INIT_FUNCTIONS["linear"]
    seen = []

    def validate(rope_parameters, ignore_keys):
        seen.append((dict(rope_parameters), ignore_keys))
        if rope_parameters.get("factor", 1.0) < 1.0:
            raise ValueError("factor below 1")

    try:
        with caplog.at_level("WARNING"):
            LlamaConfig(rope_parameters={"rope_type": name, "rope_theta": 1e4, "factor": 2.0})
        assert f"Missing validation function in 'RotaryEmbeddingConfigMixin' for 'rope_type'='{name}'" in caplog.text
        hf.register_rope_validator(name, validate)
        assert hf.rope_validator(name) is validate
        assert hasattr(RotaryEmbeddingConfigMixin, "_validate_yarn_rope_parameters")  # the naming it follows
        caplog.clear()
        with caplog.at_level("WARNING"):
            LlamaConfig(rope_parameters={"rope_type": name, "rope_theta": 1e4, "factor": 2.0})
        assert "Missing validation function" not in caplog.text
        assert seen and seen[0][0]["factor"] == 2.0 and seen[0][0]["rope_type"] == name
        with pytest.raises(Exception, match="factor below 1") as err:
            LlamaConfig(rope_parameters={"rope_type": name, "rope_theta": 1e4, "factor": 0.5})
        assert isinstance(err.value.__cause__, ValueError) and str(err.value.__cause__) == "factor below 1"
    finally:
        ROPE_INIT_FUNCTIONS.pop(name, None)
        if f"_validate_{name}_rope_parameters" in RotaryEmbeddingConfigMixin.__dict__:
            delattr(RotaryEmbeddingConfigMixin, f"_validate_{name}_rope_parameters")
    assert hf.rope_validator(name) is None


# ---------------------------------------------------------------- attention registries


def test_a_registered_attention_is_called_with_its_kernels_mask(make_ids):
    """Checked with transformers 5.24.0: an implementation registered in ``AttentionInterface`` is what every layer
    calls after ``set_attn_implementation``; it gets a padding mask only when the mask registry has a builder
    under its name — ``register_attention`` copies the kernel's (transformers PR #45811)."""
    masks = []

    def probe(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        masks.append(attention_mask)
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, scaling=scaling,
                                                dropout=dropout, **kwargs)

    ids = make_ids(12)
    padding = torch.ones_like(ids)
    padding[:, :3] = 0
    plain = build_tiny_model("llama", num_layers=2)
    expected = _logits(plain, ids, attention_mask=padding)
    unmasked, masked = "ropekit_contact_no_mask", "ropekit_contact_masked"
    try:
        transformers.AttentionInterface.register(unmasked, probe)  # the bare registry: no mask builder
        hf.register_attention(masked, probe, mask_like="sdpa")
        assert hf.registered_attention(masked) is probe
        assert hf.registered_mask(masked) is ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
        assert hf.registered_mask(unmasked) is None
        model = build_tiny_model("llama", num_layers=2)
        model.set_attn_implementation(unmasked)
        _logits(model, ids, attention_mask=padding)
        assert len(masks) == 2 and all(m is None for m in masks)
        masks.clear()
        model.set_attn_implementation(masked)
        torch.testing.assert_close(_logits(model, ids, attention_mask=padding)[:, 3:], expected[:, 3:])
        assert len(masks) == 2 and all(m is not None for m in masks)
    finally:
        for name in (unmasked, masked):
            transformers.AttentionInterface._global_mapping.pop(name, None)
            transformers.AttentionMaskInterface._global_mapping.pop(name, None)
    assert hf.registered_attention(masked) is None


def test_kernels_are_the_ones_the_model_calls(make_ids):
    """Checked with transformers 5.24.0: "eager" is the model file's own ``eager_attention_forward`` (not in the
    global registry), the other kernels are registry entries, and model files define ``rotate_half``."""
    model = build_tiny_model("llama", num_layers=1, attn_implementation="eager")
    module = model.model.layers[0].self_attn
    assert hf.attention_kernel(module, "eager") is modeling_llama.eager_attention_forward
    assert "eager" not in ALL_ATTENTION_FUNCTIONS.valid_keys()  # why ropekit asks the model file for it
    assert hf.attention_kernel(module, "sdpa") is ALL_ATTENTION_FUNCTIONS["sdpa"]
    assert hf.has_attention_kernel("eager") and hf.has_attention_kernel("sdpa")
    assert hf.has_attention_kernel("flash_attention_2") == ("flash_attention_2" in ALL_ATTENTION_FUNCTIONS.valid_keys())
    assert not hf.has_attention_kernel("no_such_kernel")
    assert hf.model_file_global(model, "rotate_half") is modeling_llama.rotate_half
    assert hf.model_file_global(model, "no_such_function") is None
    # the eager function ropekit would call is the one the model calls: same logits through ropekit_eager
    ids = make_ids(10)
    expected = _logits(model, ids)
    ropekit.register()
    model.set_attn_implementation("ropekit_eager")
    torch.testing.assert_close(_logits(model, ids), expected)


def test_the_global_attention_entry_is_what_the_model_calls(make_ids):
    """Checked with transformers 5.24.0: replacing ``ALL_ATTENTION_FUNCTIONS["sdpa"]`` (as DeepSpeed's Ulysses
    does) changes what an sdpa model calls, and putting the saved function back restores it."""
    calls = []
    original = hf.global_attention_function("sdpa")
    assert original is ALL_ATTENTION_FUNCTIONS["sdpa"]

    def wrapper(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    model = build_tiny_model("llama", num_layers=2, attn_implementation="sdpa")
    try:
        hf.set_global_attention_function("sdpa", wrapper)
        _logits(model, make_ids(8))
        assert len(calls) == 2
    finally:
        hf.set_global_attention_function("sdpa", original)
    _logits(model, make_ids(8))
    assert len(calls) == 2 and ALL_ATTENTION_FUNCTIONS["sdpa"] is original


# ---------------------------------------------------------------- private attributes, auto mappings


def test_attn_implementation_is_read_and_preset_on_the_config():
    """Checked with transformers 5.24.0: the implementation a model runs is ``config._attn_implementation``; set
    on a config before ``from_config`` it is the one the model gets."""
    config = tiny_config("llama")
    hf.preset_attn_implementation(config, "eager")
    model = AutoModelForCausalLM.from_config(config)
    assert hf.attn_implementation(model.config) == "eager" == model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    assert hf.attn_implementation(model.config) == "sdpa"
    assert hf.attn_implementation(object()) is None


def test_auto_mapping_and_class_flags():
    """Checked with transformers 5.24.0: ``MODEL_FOR_CAUSAL_LM_MAPPING`` gives the class ``AutoModelForCausalLM``
    builds; ``_supports_sdpa`` is False exactly where sdpa is refused (Gemma 2's softcap); ``_no_split_modules``
    names the decoder-layer class."""
    config = tiny_config("llama")
    assert hf.causal_lm_class(config) is LlamaForCausalLM is type(AutoModelForCausalLM.from_config(config))
    assert hf.is_causal_lm_type("llama") and hf.is_causal_lm_type("qwen3") and not hf.is_causal_lm_type("vit")
    assert hf.causal_lm_class(transformers.ViTConfig()) is None
    assert hf.supports_sdpa(LlamaForCausalLM)
    gemma2 = tiny_config("gemma2")
    assert not hf.supports_sdpa(hf.causal_lm_class(gemma2))
    with pytest.raises(ValueError, match="does not support an attention implementation through"):
        AutoModelForCausalLM.from_config(gemma2, attn_implementation="sdpa")  # the flag is transformers' rule
    llama = build_tiny_model("llama")
    names = hf.no_split_modules(llama)
    assert names == ["LlamaDecoderLayer"]
    assert any(type(m).__name__ in names for m in llama.modules())


def test_expected_extra_keys_are_not_reported_and_the_class_is_restored(tmp_path):
    """Checked with transformers 5.24.0: checkpoint keys matching ``_keys_to_ignore_on_load_unexpected`` are not
    reported as unexpected; the class attribute is put back (or removed) afterwards."""
    build_tiny_model("llama").save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights["model.rotary_emb.extra.weight"] = torch.zeros(2)
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    _, info = LlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert "model.rotary_emb.extra.weight" in info["unexpected_keys"]
    had = "_keys_to_ignore_on_load_unexpected" in LlamaForCausalLM.__dict__
    before = LlamaForCausalLM.__dict__.get("_keys_to_ignore_on_load_unexpected")
    with hf.expecting_unexpected_keys(LlamaForCausalLM, [r"rotary_emb\.[^.]+\."]):
        _, info = LlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert "model.rotary_emb.extra.weight" not in info["unexpected_keys"]
    assert ("_keys_to_ignore_on_load_unexpected" in LlamaForCausalLM.__dict__) == had
    assert LlamaForCausalLM.__dict__.get("_keys_to_ignore_on_load_unexpected") == before


# ---------------------------------------------------------------- rotary-embedding and attention modules


def test_rotary_modules_are_found_read_and_rebuilt():
    """Checked with transformers 5.24.0: model files hold one rotary module with ``rope_type``, ``config``,
    ``inv_freq`` (``<layer type>_inv_freq`` per layer type on Gemma 3) and ``attention_scaling``, and
    ``type(module)(config=...)`` rebuilds it from the current config."""
    model = build_tiny_model("llama")
    found = hf.rotary_modules(model)
    assert [(parent, attr) for parent, attr, _ in found] == [(model.model, "rotary_emb")]
    rotary = found[0][2]
    assert hf.is_rotary(rotary) and not hf.is_rotary(model.model.layers[0].self_attn)
    naive = 1.0 / 10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)  # RoPE, Su et al. 2021 eq. 15
    torch.testing.assert_close(hf.rotary_inv_freq(rotary).double(), naive)
    assert hf.rotary_attention_factor(rotary) == 1.0
    model.config.rope_parameters = {"rope_type": "default", "rope_theta": 500000.0}
    hf.rebuild_rotary(model)
    rebuilt = hf.rotary_modules(model)[0][2]
    assert rebuilt is not rotary
    torch.testing.assert_close(hf.rotary_inv_freq(rebuilt).double(),
                               1.0 / 500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))
    gemma = build_tiny_model("gemma3_text")
    (_, _, per_type), = hf.rotary_modules(gemma)
    assert isinstance(per_type.rope_type, dict) and hf.is_rotary(per_type)
    sliding, full = hf.rotary_inv_freq(per_type, "sliding_attention"), hf.rotary_inv_freq(per_type, "full_attention")
    assert sliding.shape == full.shape and float(full[1]) < float(sliding[1])  # base 1e6 against 1e4


def test_set_frequencies_are_what_the_rotary_module_applies():
    """Checked with transformers 5.24.0: the rotary module's forward multiplies positions by its ``inv_freq``
    buffer and scales cos/sin by ``attention_scaling``; replacing the buffer leaves ``original_inv_freq`` alone."""
    rotary = hf.rotary_modules(build_tiny_model("llama"))[0][2]
    original = rotary.original_inv_freq.clone()
    new = torch.linspace(0.5, 0.001, 8)
    hf.set_rotary_frequencies(rotary, new, 0.75)
    cos, sin = rotary(torch.zeros(1, 5, 16), torch.arange(5)[None])
    angles = torch.arange(5.0)[:, None] * new
    torch.testing.assert_close(cos[0], torch.cat([angles, angles], -1).cos() * 0.75)
    torch.testing.assert_close(sin[0], torch.cat([angles, angles], -1).sin() * 0.75)
    torch.testing.assert_close(rotary.original_inv_freq, original)


def test_attention_modules_are_one_per_layer():
    """Checked with transformers 5.24.0: each decoder layer's attention class ends in ``Attention`` and carries
    an integer ``layer_idx`` — here for a fused-qkv family and a parallel-residual one too."""
    for family in ("llama", "phi3", "gpt_neox"):
        model = build_tiny_model(family, num_layers=3)
        modules = hf.attention_modules(model)
        assert [m.layer_idx for m in modules] == [0, 1, 2], family


# ---------------------------------------------------------------- GGUF loader globals, DeepSpeed


def test_packed_rows_are_found_where_transformers_flash_path_finds_them():
    """transformers' flash path reads a one-row batch whose positions restart as packed documents and cuts it where
    they restart (cu_seq_lens over the flattened tokens, the longest as max_length); one increasing run is one
    document. The boundaries here are written out by hand."""
    packed = torch.cat([torch.arange(30), torch.arange(42)])[None]
    found = hf.packed_sequence_kwargs(packed, 1)
    assert found["cu_seq_lens_q"].tolist() == found["cu_seq_lens_k"].tolist() == [0, 30, 72]
    assert int(found["max_length_q"]) == int(found["max_length_k"]) == 42
    assert hf.packed_sequence_kwargs(torch.arange(72)[None], 1) is None  # not packed: nothing to add
    assert hf.packed_sequence_kwargs(packed, 2) is None  # transformers reads positions as documents in one row only
    two_rows = torch.cat([torch.arange(40), torch.arange(32), torch.arange(72)])[None]  # a flattened 2 × 72 batch
    assert hf.packed_sequence_kwargs(two_rows, 1, always=True)["cu_seq_lens_k"].tolist() == [0, 40, 72, 144]


def test_gguf_loader_globals():
    """Checked with transformers 5.24.0: the GGUF loader lists its architectures in a module global and draws its
    bar with the module-level ``tqdm`` name, which the context manager replaces and restores."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    architectures = hf.gguf_architectures()
    assert {"llama", "qwen2", "qwen3", "phi3", "mistral"} <= set(architectures)
    assert list(architectures) == list(gguf_utils.GGUF_SUPPORTED_ARCHITECTURES)
    assert "tqdm" in gguf_utils.load_gguf_checkpoint.__code__.co_names
    bar = gguf_utils.tqdm
    with hf.gguf_progress_bar_disabled():
        assert gguf_utils.tqdm is not bar and gguf_utils.tqdm.keywords == {"disable": True}
        assert list(gguf_utils.tqdm(range(3))) == [0, 1, 2]
    assert gguf_utils.tqdm is bar


def test_unset_deepspeed_config_lifts_zero3():
    """Checked with transformers 5.24.0: models are partitioned while transformers holds a ZeRO-3 DeepSpeed config
    (a weak reference); unsetting it turns that off."""

    class ZeroThree:
        config = {}

        def is_zero3(self):
            return True

    holder = ZeroThree()
    hf_deepspeed.set_hf_deepspeed_config(holder)
    try:
        assert hf_deepspeed.is_deepspeed_zero3_enabled()
        hf.unset_deepspeed_config()
        assert not hf_deepspeed.is_deepspeed_zero3_enabled()
    finally:
        hf_deepspeed.unset_hf_deepspeed_config()


# ---------------------------------------------------------------- explicit, idempotent registration


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SRC.parent)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)


def test_importing_ropekit_registers_nothing_and_extend_registers_in_a_fresh_process():
    """A fresh interpreter (as a Ray actor or a spawned study worker starts): importing ropekit, its install
    package and every method changes none of transformers' registries; the first ``extend`` registers."""
    done = _run(
        "from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RotaryEmbeddingConfigMixin\n"
        "from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS\n"
        "from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS\n"
        "def state():\n"
        "    return (sorted(ROPE_INIT_FUNCTIONS), sorted(vars(RotaryEmbeddingConfigMixin)),\n"
        "            sorted(ALL_ATTENTION_FUNCTIONS.valid_keys()), sorted(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping))\n"
        "before = state()\n"
        "import ropekit, ropekit.install, ropekit.methods, ropekit.attention, ropekit.eval.entropy, ropekit.models.loading\n"
        "assert state() == before, 'import registered something'\n"
        "from ropekit.models.tiny import build_tiny_model\n"
        "import torch\n"
        "model = ropekit.extend(build_tiny_model('llama'), 'self_extend', factor=4)\n"
        "assert 'ropekit_yarn' in ROPE_INIT_FUNCTIONS and 'ropekit_sdpa' in ALL_ATTENTION_FUNCTIONS.valid_keys()\n"
        "assert '_validate_ropekit_yarn_rope_parameters' in vars(RotaryEmbeddingConfigMixin)\n"
        "model(torch.arange(3, 40)[None])\n"
        "print('ok')\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_register_is_idempotent_and_says_what_it_registered():
    first = ropekit.register()
    names = {m.name for m in ropekit.list_methods()}
    assert set(first.rope_types) == {f"ropekit_{n}" for n in names}
    assert {"ropekit_sdpa", "ropekit_eager"} <= set(first.attention)
    functions = {t: ROPE_INIT_FUNCTIONS[t] for t in first.rope_types}
    validators = {t: RotaryEmbeddingConfigMixin.__dict__[f"_validate_{t}_rope_parameters"] for t in first.rope_types}
    attention = {a: ALL_ATTENTION_FUNCTIONS[a] for a in first.attention}
    assert ropekit.register() == first
    assert {t: ROPE_INIT_FUNCTIONS[t] for t in first.rope_types} == functions  # the same objects: nothing redone
    assert {t: RotaryEmbeddingConfigMixin.__dict__[f"_validate_{t}_rope_parameters"] for t in first.rope_types} == validators
    assert {a: ALL_ATTENTION_FUNCTIONS[a] for a in first.attention} == attention
    # an entry something removed comes back on the next call
    removed = ROPE_INIT_FUNCTIONS.pop("ropekit_yarn")
    assert ropekit.register() == first and ROPE_INIT_FUNCTIONS["ropekit_yarn"] is not removed
    model = ropekit.extend(build_tiny_model("llama"), "yarn", factor=2.0)
    assert model.model.rotary_emb.rope_type == "ropekit_yarn"


# ---------------------------------------------------------------- nobody else touches the internals

#: Names and attributes of transformers' internals that only the adapter may use.
INTERNAL = {
    "ROPE_INIT_FUNCTIONS", "RotaryEmbeddingConfigMixin", "AttentionInterface", "AttentionMaskInterface",
    "ALL_ATTENTION_FUNCTIONS", "ALL_MASK_ATTENTION_FUNCTIONS", "_global_mapping", "_attn_implementation",
    "_supports_sdpa", "_keys_to_ignore_on_load_unexpected", "_no_split_modules", "eager_attention_forward",
    "MODEL_FOR_CAUSAL_LM_MAPPING", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "GGUF_SUPPORTED_ARCHITECTURES", "unset_hf_deepspeed_config", "dynamic_rope_update",
}
#: Module globals of transformers' model files, read by name (ropekit's core defines its own ``rotate_half``).
MODEL_FILE_GLOBALS = {"eager_attention_forward", "rotate_half"}
#: transformers modules that are not its public API.
INTERNAL_MODULES = ("transformers.modeling_rope_utils", "transformers.masking_utils", "transformers.modeling_utils",
                    "transformers.integrations", "transformers.models.auto", "transformers.modeling_gguf_pytorch_utils")
ADAPTER = "adapters/transformers.py"


def _internal_uses(source: str) -> list[str]:
    """Code (not comments or docstrings) in ``source`` that uses an internal of transformers: an import from an
    internal module or of an internal name, the name or attribute itself, or a string of it given to
    ``getattr``/``setattr``/``hasattr``/``delattr``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = node.module
            if module.startswith(INTERNAL_MODULES) or (module == "transformers" and any(
                    a.name in INTERNAL or f"transformers.{a.name}".startswith(INTERNAL_MODULES) for a in node.names)):
                found.append(f"line {node.lineno}: from {module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.startswith(INTERNAL_MODULES)]
        elif isinstance(node, ast.Name) and node.id in INTERNAL:
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in INTERNAL:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in INTERNAL | MODEL_FILE_GLOBALS):
            found.append(f"line {node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return sorted(found, key=lambda use: int(use.split(":")[0].removeprefix("line ")))


def test_no_module_outside_the_adapter_touches_transformers_internals():
    offenders = {}
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative != ADAPTER:
            uses = _internal_uses(path.read_text(encoding="utf-8"))
            if uses:
                offenders[relative] = uses
    assert offenders == {}


def test_the_internals_scan_finds_each_kind_of_use():
    source = ('"""Docstrings may name ROPE_INIT_FUNCTIONS."""\n'
              "from transformers.modeling_rope_utils import dynamic_rope_update\n"
              "from transformers import AttentionInterface, PreTrainedModel\n"
              "import transformers.masking_utils\n"
              "x = getattr(config, '_attn_implementation', None)\n"
              "y = model._no_split_modules\n"
              "z = getattr(sys.modules[type(m).__module__], 'rotate_half')\n"
              "# ALL_ATTENTION_FUNCTIONS in a comment is fine\n")
    assert _internal_uses(source) == ["line 2: from transformers.modeling_rope_utils import ...",
                                      "line 3: from transformers import ...", "line 4: import transformers.masking_utils",
                                      "line 5: getattr(..., '_attn_implementation')", "line 6: ._no_split_modules",
                                      "line 7: getattr(..., 'rotate_half')"]
