"""CLEX against independent references.

* Identity: within the window (and at ``max_factor = 1`` everywhere) the extended model's logits equal the
  plain model's.
* The ODE: its frequencies equal (a) the closed-form NTK-aware basis with ``α = 2t − 1`` while ``W_down = 0``
  (the exact solution of the untrained ODE) and (b) with random weights, a naive float64 RK4 integration
  written out here from the CLEX equation (never through ``ropekit.methods.clex_ode``), recomputed from
  ``t = 1`` for every length; and they are continuous in the length (no jump at the window).
* End to end: beyond the window the model equals the plain transformers model whose rotary module is given
  the naive frequencies.
* Training: the positions CLEX trains on, the per-step scale (on every row of a padded batch), gradients into
  the ODE weights.
* Generation past the window: every cached call's logits against transformers' own model decoding with its
  cache, its rotary module given the naive frequencies of each call's length (batches and the cache's
  behaviour against full forwards: ``test_clex_batch.py``).
* Save / load (API and CLI) restores the ODE weights; ``ropekit methods`` lists the method.
"""

from __future__ import annotations

import copy
import json
import math
import sys

import pytest
import torch

import ropekit
from ropekit.errors import InvalidParameterError, ModelLoadError
from ropekit.methods import get_method
from ropekit.methods.clex_ode import CLEXFrequencies, sample_training_positions
from ropekit.models.tiny import TINY_WINDOW, build_tiny_model

C = TINY_WINDOW


def _clex_model(family: str = "llama", *, randomize: float | None = 0.05, seed: int = 1, **params):
    """A tiny model with CLEX; ``randomize`` draws ``W_down`` (zero at init) so that the ODE is not trivial."""
    model = ropekit.extend(build_tiny_model(family), "clex", **{"max_factor": 4, "time_dt": 0.05, **params})
    if randomize is not None:
        module = _ode(model)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            module.down_proj.copy_(torch.randn(module.down_proj.shape, generator=gen) * randomize)
    return model.eval()


def _ode(model) -> CLEXFrequencies:
    (module,) = [m for m in model.modules() if isinstance(m, CLEXFrequencies)]
    return module


def _theta(b: float, d: int) -> torch.Tensor:
    return b ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d)


def naive_clex_log_freq(module: CLEXFrequencies, t: float, dt: float | None = None) -> torch.Tensor:
    """``z(t)`` by classical RK4 in float64 from ``z(1) = log θ``, steps of ``dt`` and a last shorter one.

    The right-hand side is the CLEX equation written out: ``W_down·σ(W_up·(z + log ξ(t))) + d/dt log ξ(t)`` with
    ``ξ_i(t) = (b·α^(d/(d−2)))^(−2i/d)``, ``α = 2t − 1``; ``d/dt log ξ`` by the chain rule through α.
    """
    d, b = module.dim, module.rope_theta
    dt = module.time_dt if dt is None else dt
    up, down = module.up_proj.detach().double(), module.down_proj.detach().double()
    act = torch.tanh if module.act == "tanh" else (lambda x: x * torch.sigmoid(x))
    two_i = torch.arange(0, d, 2, dtype=torch.float64)

    def log_xi(s):
        return -(two_i / d) * math.log(b * (2 * s - 1) ** (d / (d - 2)))

    def dlog_xi(s):
        return -(two_i / (d - 2)) * 2.0 / (2 * s - 1)

    def rhs(s, z):
        return act((z + log_xi(s)) @ up) @ down + dlog_xi(s)

    z, s = torch.log(_theta(b, d)), 1.0
    while t - s > 1e-12:
        h = min(dt, t - s)
        k1 = rhs(s, z)
        k2 = rhs(s + h / 2, z + h / 2 * k1)
        k3 = rhs(s + h / 2, z + h / 2 * k2)
        k4 = rhs(s + h, z + h * k3)
        z, s = z + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4), s + h
    return z


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a.double() - b.double()).abs() / b.double().abs()).max())


# ---- identity ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_within_the_window_clex_is_the_plain_model(family, make_ids):
    plain = build_tiny_model(family)
    model = _clex_model(family)  # trained-looking ODE: inside the window it must not matter
    for n in (5, C - 1, C):
        x = make_ids(n)
        with torch.no_grad():
            assert torch.allclose(model(x).logits, plain(x).logits, rtol=0, atol=1e-6)


def test_max_factor_one_is_the_plain_model_at_every_length(make_ids):
    plain = build_tiny_model("llama")
    model = _clex_model(max_factor=1)
    x = make_ids(3 * C)
    with torch.no_grad():
        assert torch.allclose(model(x).logits, plain(x).logits, rtol=0, atol=1e-6)
        assert not torch.allclose(_clex_model()(x).logits, plain(x).logits, atol=1e-3)  # the check can fail


def test_generation_inside_the_window_matches_the_plain_model(make_ids):
    plain, model = build_tiny_model("llama"), _clex_model()
    x = make_ids(20)
    kwargs = {"max_new_tokens": 30, "do_sample": False, "attention_mask": torch.ones_like(x), "pad_token_id": 0}
    assert torch.equal(model.generate(x, **kwargs), plain.generate(x, **kwargs))


# ---- the ODE -----------------------------------------------------------------------------------------------
def _module(d=128, b=1e4, **kw) -> CLEXFrequencies:
    args = {"rope_theta": b, "window": 4096, "max_factor": 16, "time_dt": 0.01, "param_factor": 1, "act": "silu"}
    args.update(kw)
    return CLEXFrequencies(d, **args).eval()


def test_untrained_ode_is_ntk_scaling_with_alpha_2t_minus_1():
    """With ``W_down = 0`` the ODE is ``dz/dt = d/dt log ξ(t)``: ``θ'(t) = θ·α^(−2i/(d−2))``, α = 2t − 1 — on
    the paper's defaults (d = 128, t_max = 16, dt = 0.01), on and off the integration grid."""
    module = _module()
    theta = _theta(1e4, 128)
    for t in (1.0, 1.37, 2.0, 4.005, 7.5, 16.0):
        alpha = 2 * t - 1
        want = theta * alpha ** (-2.0 * torch.arange(64, dtype=torch.float64) / 126)
        assert _rel(torch.exp(module.cached_log_inv_freq(t, theta.float())), want) < 1e-6, t
    for t in (1.37, 2.0):  # the differentiable path integrates from t = 1 on every call
        want = theta * (2 * t - 1) ** (-2.0 * torch.arange(64, dtype=torch.float64) / 126)
        assert _rel(torch.exp(module.log_inv_freq(t, theta.float())).detach(), want) < 1e-6, t


@pytest.mark.parametrize("act", ["tanh", "silu"])
def test_learned_ode_matches_a_naive_rk4_integration(act):
    module = _module(d=32, b=5e5, max_factor=8, time_dt=0.05, act=act, param_factor=2, init_seed=3)
    with torch.no_grad():
        module.down_proj.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    theta = _theta(5e5, 32).float()
    untrained = _module(d=32, b=5e5, max_factor=8, time_dt=0.05)
    for t in (1.5, 2.0, 3.013, 8.0):
        naive = naive_clex_log_freq(module, t)
        assert (module.cached_log_inv_freq(t, theta).double() - naive).abs().max() < 1e-6, t
        if t < 3:
            assert (module.log_inv_freq(t, theta).detach().double() - naive).abs().max() < 1e-6, t
        # the learned part matters (so the check can fail): far from the untrained (NTK) solution
        assert (naive - naive_clex_log_freq(untrained, t)).abs().max() > 1e-2
    # and RK4 at this step is already accurate: a 10× finer integration agrees
    assert (naive - naive_clex_log_freq(module, 8.0, dt=0.005)).abs().max() < 1e-5


def test_frequencies_are_continuous_in_the_length():
    """Consecutive lengths give frequencies at most ``|dz/dt|·(1/C)`` apart — at the window too — while the
    reference code's ``⌈n/C⌉`` rule jumps there (so the bound can fail)."""
    window = 64
    module = _module(d=32, window=window, max_factor=4, time_dt=0.05)
    with torch.no_grad():
        module.down_proj.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    theta = _theta(1e4, 32).float()
    z = torch.stack([torch.log(module.inv_freq_for_length(n, theta)) for n in range(window - 4, 4 * window + 5)])
    steps = (z[1:] - z[:-1]).abs().max(dim=1).values
    speed = max(float((naive_clex_log_freq(module, t + 1e-6) - naive_clex_log_freq(module, t)).abs().max() / 1e-6)
                for t in (1.0, 1.5, 2.0, 3.0, 4.0))
    assert float(steps.max()) <= 1.2 * speed / window
    assert float(steps[3]) == 0.0 and float(steps[4]) > 0  # n = C−1 → C unchanged, C → C+1 moves a little
    for n in (window + 1, 100, 2 * window + 7, 4 * window):
        assert (torch.log(module.inv_freq_for_length(n, theta)).double()
                - naive_clex_log_freq(module, n / window)).abs().max() < 1e-6
    ceil = _module(d=32, window=window, max_factor=4, time_dt=0.05, inference_scale="ceil")
    ceil.load_state_dict(module.state_dict())
    jump = (torch.log(ceil.inv_freq_for_length(window + 1, theta)) - torch.log(theta)).abs().max()
    assert float(jump) > 20 * speed / window
    assert torch.equal(ceil.inv_freq_for_length(window + 1, theta), module.inv_freq_for_length(2 * window, theta))


def test_the_cache_follows_the_weights():
    module = _module(d=32, max_factor=4, time_dt=0.05)
    theta = _theta(1e4, 32).float()
    before = module.cached_log_inv_freq(3.0, theta).clone()
    with torch.no_grad():
        module.down_proj.add_(0.5)  # an in-place update, as an optimizer step makes
    after = module.cached_log_inv_freq(3.0, theta)
    assert not torch.allclose(before, after)
    assert (after.double() - naive_clex_log_freq(module, 3.0)).abs().max() < 1e-6


def test_beyond_the_window_the_model_is_plain_rope_with_the_ode_frequencies(make_ids):
    """The reference: transformers' own rotary module given the naive frequencies at ``t = n/C``."""
    model = _clex_model()
    for n in (C + 9, 3 * C, 4 * C + 20):  # the last is past t_max·C: t stays at t_max = 4
        x = make_ids(n)
        reference = build_tiny_model("llama")
        t = min(n / C, 4.0)
        reference.model.rotary_emb.inv_freq = torch.exp(naive_clex_log_freq(_ode(model), t)).float()
        with torch.no_grad():
            assert torch.allclose(model(x).logits, reference(x).logits, rtol=0, atol=1e-4), n


def test_deep_copies_keep_clex(make_ids):
    model = _clex_model()
    x = make_ids(2 * C + 3)
    with torch.no_grad():
        assert torch.equal(copy.deepcopy(model)(x).logits, model(x).logits)


def test_uninstall_returns_to_plain_rope(make_ids):
    from ropekit.install import uninstall

    model, plain = _clex_model(), build_tiny_model("llama")
    uninstall(model)
    x = make_ids(2 * C)
    assert not any(isinstance(m, CLEXFrequencies) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(x).logits, plain(x).logits)


# ---- parameters ------------------------------------------------------------------------------------------
def test_parameters_and_declared_window():
    model = ropekit.extend(build_tiny_model("llama"), "clex", target_length=5 * C + 1)
    params = model.config.ropekit["params"]
    assert params["max_factor"] == 6 and params["time_dt"] == 0.01 and params["act"] == "tanh"
    assert model.config.max_position_embeddings == 6 * C
    assert ropekit.extend(build_tiny_model("llama"), "clex").config.ropekit["params"]["max_factor"] == 16
    m = get_method("clex")
    assert {"weights", "length_dependent"} <= set(m.changes)
    with pytest.raises(InvalidParameterError, match="contradicts"):
        ropekit.extend(build_tiny_model("llama"), "clex", factor=4, max_factor=8)
    with pytest.raises(InvalidParameterError, match="act"):
        ropekit.extend(build_tiny_model("llama"), "clex", act="relu")
    with pytest.raises(InvalidParameterError, match="time_dt"):
        ropekit.extend(build_tiny_model("llama"), "clex", time_dt=0)


def test_ode_network_shapes_and_init():
    model = ropekit.extend(build_tiny_model("llama"), "clex", param_factor=2, init_seed=5)
    module = _ode(model)
    d = model.config.hidden_size // model.config.num_attention_heads
    assert module.up_proj.shape == (d // 2, 2 * d) and module.down_proj.shape == (2 * d, d // 2)
    assert float(module.down_proj.detach().abs().max()) == 0.0
    assert float(module.up_proj.detach().abs().max()) <= 1 / math.sqrt(2 * d)
    again = _ode(ropekit.extend(build_tiny_model("llama"), "clex", param_factor=2, init_seed=5))
    assert torch.equal(module.up_proj, again.up_proj)
    assert {k for k in model.state_dict() if "clex" in k} == {
        "model.rotary_emb.clex.up_proj", "model.rotary_emb.clex.down_proj"}


# ---- training --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,t,window", [(64, 1, 64), (64, 3, 64), (50, 16, 64), (256, 4, 64)])
def test_training_positions(n, t, window):
    gen = torch.Generator().manual_seed(0)
    pos = sample_training_positions(n, t, window, gen)
    s = max(1, n // window)
    assert pos.shape == (n,) and pos[0] == 0 and pos[-1] == n * t // s - 1
    assert bool((pos[1:] > pos[:-1]).all())
    inner = pos[1:-1] * s
    assert torch.equal(inner, inner.round()) and inner.min() >= 1 and inner.max() <= n * t - 2
    if t == 1 and s == 1:
        assert torch.equal(pos, torch.arange(n, dtype=torch.float32))
    assert torch.equal(pos, sample_training_positions(n, t, window, torch.Generator().manual_seed(0)))


def test_the_step_hook_draws_seeded_uniform_scales():
    model = _clex_model(max_factor=5)
    hook = get_method("clex").training_step_hook
    drawn = []
    for step in range(400):
        hook(model, step, torch.Generator().manual_seed(step))
        drawn.append(_ode(model).training_scale)
    assert set(drawn) == {1, 2, 3, 4, 5}
    assert all(abs(drawn.count(k) / 400 - 0.2) < 0.07 for k in range(1, 6))
    hook(model, 7, torch.Generator().manual_seed(7))
    assert _ode(model).training_scale == drawn[7]


def test_a_training_forward_uses_the_sampled_scale_and_trains_the_ode(make_ids):
    model = _clex_model()
    module = _ode(model)
    x = make_ids(C)
    model.train()
    module.set_training_scale(3, seed=11)
    out = model(input_ids=x, labels=x)
    out.loss.backward()
    assert module.down_proj.grad is not None and float(module.down_proj.grad.abs().max()) > 0
    assert module.up_proj.grad is not None and float(module.up_proj.grad.abs().max()) > 0
    # the reference: the plain model with positions from the same draw and the naive frequencies at t = 3
    reference = build_tiny_model("llama")
    reference.model.rotary_emb.inv_freq = torch.exp(naive_clex_log_freq(module, 3.0)).float()
    positions = sample_training_positions(C, 3, C, torch.Generator().manual_seed(11))
    with torch.no_grad():
        want = reference(input_ids=x, position_ids=positions[None], attention_mask=torch.ones_like(x)).logits
    assert torch.allclose(out.logits.detach(), want, rtol=0, atol=1e-4)
    # t = 1 keeps the weights in the graph (zero gradient), as DDP needs
    model.zero_grad()
    module.set_training_scale(1, seed=0)
    model(input_ids=x, labels=x).loss.backward()
    assert module.down_proj.grad is not None and float(module.down_proj.grad.abs().max()) == 0.0
    # eval mode ignores the training scale
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x).logits, build_tiny_model("llama")(x).logits)


# ---- save / load / CLI --------------------------------------------------------------------------------
def test_save_and_load_restore_the_ode_weights(tmp_path, make_ids, caplog):
    model = _clex_model()
    report = ropekit.save_pretrained(model, tmp_path / "clex")
    assert report["transformers"] is False and report["rope_parameters"]["rope_type"] == "ropekit_clex"
    caplog.clear()
    loaded = ropekit.load(tmp_path / "clex")
    assert "UNEXPECTED" not in caplog.text
    assert torch.equal(_ode(loaded).down_proj, _ode(model).down_proj)
    assert torch.equal(_ode(loaded).up_proj, _ode(model).up_proj)
    x = make_ids(3 * C)
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, model(x).logits)


def test_load_without_the_ode_weights_is_one_line(tmp_path):
    from safetensors.torch import load_file, save_file

    ropekit.save_pretrained(_clex_model(), tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if ".clex." not in k}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="no saved weights for model.rotary_emb.clex"):
        ropekit.load(tmp_path)


def _cli(monkeypatch, capsys, *args):
    from ropekit import cli

    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["ropekit", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_lists_and_extends(monkeypatch, capsys, tmp_path, make_ids):
    code, out, _ = _cli(monkeypatch, capsys, "methods", "--json")
    assert code == 0
    (clex,) = [d for d in json.loads(out) if d["name"] == "clex"]
    assert clex["params"]["max_factor"]["type"] == "int" and clex["params"]["act"]["choices"] == ["tanh", "silu"]
    assert clex["needs_training"] is True and clex["exports_to"] == []
    code, _, err = _cli(monkeypatch, capsys, "extend", "tiny", "--method", "clex", "--target-length", str(4 * C),
                        "--param", "act=silu", "--out", str(tmp_path / "out"))
    assert code == 0, err
    loaded = ropekit.load(tmp_path / "out")
    assert loaded.config.ropekit["params"]["max_factor"] == 4 and _ode(loaded).act == "silu"
    reference = ropekit.extend(build_tiny_model("llama"), "clex", target_length=4 * C, act="silu")
    x = make_ids(3 * C)
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, reference.eval()(x).logits)
    code, _, err = _cli(monkeypatch, capsys, "extend", "tiny", "--method", "clex", "--param", "act=relu",
                        "--out", str(tmp_path / "bad"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "act" in err


def _reference_greedy(model, x: torch.Tensor, new: int, length_of_call) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Greedy cached decoding by transformers' own model, its rotary module given, before each call, the naive ODE
    frequencies at ``t = min(length_of_call(n)/C, t_max)`` for the call that reaches ``n`` tokens."""
    from ropekit.core.hf_compat import cache_argument, output_cache

    reference = build_tiny_model("llama")
    rotary, ode = reference.model.rotary_emb, _ode(model)

    def call(ids, n, **kw):
        rotary.inv_freq = torch.exp(naive_clex_log_freq(ode, min(length_of_call(n) / C, float(ode.max_factor)))).float()
        return reference(ids, use_cache=True, **kw)

    tokens, logits = x, []
    with torch.no_grad():
        out = call(x, x.shape[1])
        for _ in range(new):
            logits.append(out.logits[0, -1])
            tokens = torch.cat([tokens, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            n = tokens.shape[1]
            out = call(tokens[:, -1:], n, position_ids=torch.tensor([[n - 1]]),
                       **{cache_argument(reference): output_cache(out)})
    return tokens, logits


def test_generation_past_the_window_uses_the_length_scale(make_ids):
    """Every call of cached greedy generation runs at the scale of the length it reaches: the prefill of
    ``n = 2C + 5`` tokens at ``t = n/C`` (like a full forward), decode step ``k`` at ``t = (n + k)/C`` for its new
    query and key, while cached keys keep the rotation of the call that cached them (clex_ode module doc). The
    reference is transformers' model decoding with its own cache, its rotary module given the naive ODE
    frequencies of each call's length; tokens and every step's logits are compared."""
    import warnings

    model = _clex_model()
    x = make_ids(2 * C + 5)
    new = 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the decode past the window warns (tests/methods/test_clex_batch.py)
        out = model.generate(x, max_new_tokens=new, do_sample=False, attention_mask=torch.ones_like(x), pad_token_id=0,
                             output_logits=True, return_dict_in_generate=True)
    tokens, logits = _reference_greedy(model, x, new, lambda n: n)
    assert torch.equal(out.sequences, tokens)
    for k in range(new):
        assert torch.allclose(out.logits[k][0], logits[k], rtol=0, atol=2e-5), k
    with torch.no_grad():  # the prefill is the full forward
        assert torch.allclose(out.logits[0][0], model(x).logits[0, -1], rtol=0, atol=1e-5)
    # the check can fail: decode steps kept at the prefill's scale, or at t = 1 (the new positions only), differ
    for wrong in (lambda n: x.shape[1], lambda n: n if n == x.shape[1] else 1):
        _, other = _reference_greedy(model, x, new, wrong)
        assert max(float((out.logits[k][0] - other[k]).abs().max()) for k in range(1, new)) > 5e-4


def test_a_training_forward_gives_every_row_the_sampled_scale(make_ids):
    """In training the step's scale ``t`` (drawn by ``training_step_hook``) applies to every row of the batch, a
    short (right-padded) row included — not each row's own length, as at inference. Reference: each row alone
    through the plain model with the naive frequencies at ``t = 3`` and the drawn positions."""
    model = _clex_model()
    module = _ode(model)
    ids = torch.cat([make_ids(C, seed=1), make_ids(C, seed=2)])
    mask = torch.ones_like(ids)
    mask[0, 40:] = 0
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    model.train()
    module.set_training_scale(3, seed=5)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    model.eval()
    reference = build_tiny_model("llama")
    reference.model.rotary_emb.inv_freq = torch.exp(naive_clex_log_freq(module, 3.0)).float()
    table = sample_training_positions(C, 3, C, torch.Generator().manual_seed(5))
    for row, n in ((0, 40), (1, C)):
        with torch.no_grad():
            want = reference(input_ids=ids[row:row + 1, :n], position_ids=table[position_ids[row:row + 1, :n]],
                             attention_mask=torch.ones(1, n, dtype=torch.long)).logits[0]
        assert torch.allclose(got[row, :n], want, rtol=0, atol=1e-4), row
