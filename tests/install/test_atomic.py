"""``extend`` is all or nothing, and ``uninstall`` (the curriculum's stage switch) goes through the same module.

The reference is the model before anything happened: its config, its modules (by identity), its weights,
its hooks and its logits.
"""

from __future__ import annotations

import pytest
import torch

import ropekit
from ropekit.install import installer as extend_module
from ropekit.install import uninstall
from ropekit.models.tiny import build_tiny_model


def _state(model):
    """Everything extend may touch, as comparable values."""
    config = model.config
    return {
        "config": {k: v for k, v in config.to_dict().items() if k != "transformers_version"},
        "ropekit": hasattr(config, "ropekit"),
        "attn": config._attn_implementation,
        "rotary": [id(m) for m in model.modules() if hasattr(m, "inv_freq") and hasattr(m, "rope_type")],
        "embeddings": (id(model.get_input_embeddings()), id(model.get_output_embeddings())),
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
        "module_attrs": [
            (getattr(m, "ropekit_transforms", "absent"), getattr(m, "ropekit_attend", "absent"))
            for m in model.modules() if type(m).__name__.endswith("Attention")
        ],
        "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()),
    }


def _assert_same(before, after):
    assert after["config"] == before["config"]
    for key in ("ropekit", "attn", "rotary", "embeddings", "module_attrs", "hooks"):
        assert after[key] == before[key], key
    assert after["weights"].keys() == before["weights"].keys()
    for name, value in before["weights"].items():
        assert torch.equal(after["weights"][name], value), name


CASES = [
    ("self_extend", {"group_size": 4, "window_size": 16}),
    ("lm_infinite", {}),
    ("harpe", {"bases": [1e4, 2e4]}),
    ("entropy_abf", {}),
    ("longlora", {"factor": 2.0}),
    ("landmark", {"mem_freq": 7}),
]


@pytest.mark.parametrize("method, params", CASES, ids=[c[0] for c in CASES])
def test_a_failing_attention_installation_leaves_the_model_exactly_as_it_was(method, params, monkeypatch, make_ids):
    model = build_tiny_model("llama", num_layers=4).eval()
    ids = make_ids(40)
    with torch.no_grad():
        logits = model(ids).logits
    before = _state(model)
    real = extend_module.install_transforms

    def half_done(model, make, make_attend=None):
        real(model, make, make_attend)  # every module changed and the kernel switched, then a failure
        raise RuntimeError("attention installation failed")

    monkeypatch.setattr(extend_module, "install_transforms", half_done)
    with pytest.raises(RuntimeError, match="attention installation failed"):
        ropekit.extend(model, method, **params)
    _assert_same(before, _state(model))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits)
    monkeypatch.undo()
    ropekit.extend(model, method, **params)  # and the model still takes the method
    assert ropekit.installed(model)["method"] == method


def test_a_failure_after_the_rotary_rebuild_restores_frequencies(monkeypatch, make_ids):
    model = build_tiny_model("qwen3").eval()
    ids = make_ids(30)
    with torch.no_grad():
        logits = model(ids).logits
    before = _state(model)
    monkeypatch.setattr(extend_module, "rebuild_rotary", lambda m: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError):
        ropekit.extend(model, "yarn", factor=4.0)
    _assert_same(before, _state(model))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, logits)


@pytest.mark.parametrize("method, params", CASES + [("yarn", {"factor": 4.0}), ("clex", {"max_factor": 4.0})],
                         ids=[c[0] for c in CASES] + ["yarn", "clex"])
def test_uninstall_returns_to_the_base_model(method, params, make_ids):
    model = build_tiny_model("llama", num_layers=4).eval()
    ids = make_ids(40)
    with torch.no_grad():
        plain = model(ids).logits
    before = _state(model)
    ropekit.extend(model, method, **params)
    uninstall(model)
    after = _state(model)
    assert not after["ropekit"] and after["attn"] == before["attn"] and after["hooks"] == before["hooks"] == 0
    assert all(a in (((), None), ("absent", "absent")) for a in after["module_attrs"])
    with torch.no_grad():
        got = model(ids).logits
    # Landmark's token row stays (removing a method never touches weights); every other logit is the plain model's
    torch.testing.assert_close(got[..., : plain.shape[-1]], plain, rtol=0, atol=0)


def test_landmark_removal_takes_its_input_hooks_away(make_ids):
    model = build_tiny_model("llama").eval()
    ropekit.extend(model, "landmark", mem_freq=5)
    token = ropekit.installed(model)["params"]["landmark_token_id"]
    ids = make_ids(23)
    uninstall(model)
    with torch.no_grad():
        out = model(ids).logits
    # no landmark was inserted (one output per input id) and the landmark logit is no longer masked
    assert out.shape[1] == 23 and torch.isfinite(out[..., token]).all()
    ropekit.extend(model, "landmark", mem_freq=5)  # re-installing reuses the row instead of adding one
    assert ropekit.installed(model)["params"]["landmark_token_id"] == token
