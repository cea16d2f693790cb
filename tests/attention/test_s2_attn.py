"""LongLoRA's S²-Attn (shifted sparse attention) against a naive group-masked reference written out here.

The reference recomputes each layer's attention from the module's own projections (hooks): PI rotations
as explicit 2×2 turns, an explicit allowed-pair matrix per head (same group, causal, real key) and a full
float64 softmax. It also checks the property the eager reference code lacks: no token sees a later token.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropekit
from ropekit import RopekitError
from ropekit.methods.longlora_attention import ShiftedSparseAttention, group_size
from ropekit.models.tiny import build_tiny_model

FACTOR = 2.0
ATOL = 2e-5

MODELS = {
    # name: build kwargs, rotary dim
    "gqa": ({}, 16),  # 4 query heads, 2 KV heads
    "mha": ({"num_kv_heads": None}, 16),
    "odd-kv": ({"hidden_size": 48, "num_heads": 6, "num_kv_heads": 3}, 8),
}


def _sharpen(model, k: float = 3.0) -> None:
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight *= k
            layer.self_attn.k_proj.weight *= k


def _longlora(kwargs, ratio=0.25, sharpen=True):
    model = build_tiny_model("llama", **kwargs)
    if sharpen:
        _sharpen(model)
    return ropekit.extend(model, "longlora", factor=FACTOR, group_size_ratio=ratio)


def _capture(model, ids, **forward):
    """Per layer: unrotated q (B, L, H, d), k, v (B, L, KV, d) and the attention output before o_proj."""
    cfg = model.config
    seen, handles = {}, []
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        store = seen.setdefault(i, {})
        for name, n in (("q", cfg.num_attention_heads), ("k", cfg.num_key_value_heads), ("v", cfg.num_key_value_heads)):
            def hook(mod, args, out, store=store, name=name, n=n):
                store[name] = out.detach().double().view(*out.shape[:2], n, -1)

            handles.append(getattr(attn, f"{name}_proj").register_forward_hook(hook))

        def pre(mod, args, store=store):
            store["out"] = args[0].detach().double()

        handles.append(attn.o_proj.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            logits = model(ids, **forward).logits
    finally:
        for h in handles:
            h.remove()
    return seen, logits


def _rotate_pi(x: torch.Tensor, positions: torch.Tensor, base: float, rot: int, factor: float) -> torch.Tensor:
    """Explicit PI RoPE: pair i = channels (i, i + rot/2) turned by p·θ_i/s, θ_i = b^(−2i/rot)."""
    half = rot // 2
    theta = ((base ** (-2.0 * torch.arange(half, dtype=torch.float64) / rot)) / factor).float()
    angle = (positions.float()[:, None] * theta[None, :]).double()
    out = x.clone()
    for i in range(half):
        c, s = angle[:, i].cos(), angle[:, i].sin()
        x1, x2 = x[:, i], x[:, i + half]
        out[:, i] = c * x1 - s * x2
        out[:, i + half] = s * x1 + c * x2
    return out


def _allowed_pairs(n: int, g: int, shifted: bool) -> torch.Tensor:
    """Explicit (n, n) matrix: query i may see key j iff j ≤ i and both lie in the same group, where groups are
    [0,g), [g,2g), … or, shifted, [0,s), [s,s+g), [s+g,s+2g), … with s = ⌊g/2⌋ (no wrap-around)."""
    s = g // 2
    allowed = torch.zeros(n, n, dtype=torch.bool)
    starts = list(range(0, n, g)) if not shifted else [0] + list(range(s, n, g))
    ends = starts[1:] + [n]
    for a, b in zip(starts, ends):
        for i in range(a, b):
            for j in range(a, i + 1):
                allowed[i, j] = True
    return allowed


def _naive_s2(q, k, v, real, base, rot, g):
    """One row: q (L, H, d), k/v (L, KV, d); heads h ≥ H//2 use the shifted groups."""
    L, H, d = q.shape
    kv = k.shape[1]
    p = torch.arange(L)
    out = torch.zeros(L, H, d, dtype=torch.float64)
    for h in range(H):
        grp = h // (H // kv)
        allowed = _allowed_pairs(L, g, shifted=h >= H // 2) & real[None, :]
        logits = _rotate_pi(q[:, h], p, base, rot, FACTOR) @ _rotate_pi(k[:, grp], p, base, rot, FACTOR).T / math.sqrt(d)
        logits = logits.masked_fill(~allowed, float("-inf"))
        out[:, h] = torch.softmax(logits, dim=-1).nan_to_num(0.0) @ v[:, grp]
    return out


def _roll_reference(q, k, v, g):
    """LongLoRA's eager S²-Attn (``forward_noflashattn``): roll the second half of the heads by −g/2, attend
    causally within groups, roll back. (B, H, L, d) with H == KV. Used only to show its wrap-around leak."""
    B, H, L, d = q.shape
    half = H // 2

    def shift(x):
        return torch.cat([x[:, :half], x[:, half:].roll(-(g // 2), dims=2)], dim=1)

    qs, ks, vs = shift(q), shift(k), shift(v)
    causal = torch.ones(g, g, dtype=torch.bool).tril()
    blocks = lambda x: x.view(B, H, L // g, g, d)
    logits = blocks(qs) @ blocks(ks).transpose(-1, -2) / math.sqrt(d)
    out = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1) @ blocks(vs)
    out = out.reshape(B, H, L, d)
    return torch.cat([out[:, :half], out[:, half:].roll(g // 2, dims=2)], dim=1)


class _Module(torch.nn.Module):
    """Stand-in attention module for calling ShiftedSparseAttention directly."""


def _no_kernel(*args, **kwargs):
    raise AssertionError("the full-attention kernel must not run in training mode")


# ================================================================ against the naive reference
@pytest.mark.parametrize("length", [64, 70])  # 70: g = 18 does not divide it, the last groups are partial
@pytest.mark.parametrize("case", list(MODELS))
def test_matches_naive_group_masked_reference(case, length, make_ids):
    kwargs, rot = MODELS[case]
    model = _longlora(kwargs).train()
    ids = torch.cat([make_ids(length, seed=1), make_ids(length, seed=2)])
    mask = torch.ones_like(ids)
    mask[1, -7:] = 0  # right padding, as in training batches
    seen, _ = _capture(model, ids, attention_mask=mask)
    g = group_size(length, 0.25)
    assert g == math.ceil(length / 4)
    for layer, s in seen.items():
        for b in range(2):
            real = mask[b].bool()
            want = _naive_s2(s["q"][b], s["k"][b], s["v"][b], real, 10000.0, rot, g)
            got = s["out"][b].view_as(want)
            torch.testing.assert_close(got[real], want[real], rtol=0, atol=ATOL,
                                       msg=lambda m: f"layer {layer} row {b}: {m}")
            # Teeth: swapping which half is shifted is far off.
            swapped = _naive_s2(s["q"][b].flip(1), s["k"][b].flip(1), s["v"][b].flip(1), real, 10000.0, rot, g).flip(1)
            assert (got[real] - swapped[real]).abs().max() > 100 * ATOL


@pytest.mark.parametrize("ratio", [0.5, 1.0, 0.3])
def test_other_group_ratios_match_the_reference(ratio, make_ids):
    model = _longlora({}, ratio=ratio).train()
    ids = make_ids(45)
    seen, _ = _capture(model, ids)
    g = group_size(45, ratio)
    s = seen[0]
    want = _naive_s2(s["q"][0], s["k"][0], s["v"][0], torch.ones(45, dtype=torch.bool), 10000.0, 16, g)
    torch.testing.assert_close(s["out"][0].view_as(want), want, rtol=0, atol=ATOL)


# ================================================================ causality, no wrap-around
@pytest.mark.parametrize("case", list(MODELS))
def test_no_token_sees_a_later_token(case, make_ids):
    kwargs, _ = MODELS[case]
    model = _longlora(kwargs).train()
    ids = make_ids(64, seed=3)
    with torch.no_grad():
        ref = model(ids).logits
        for t in (3, 7, 15, 16, 31, 40, 62):
            other = ids.clone()
            other[:, t + 1:] = make_ids(63 - t, seed=100 + t)
            out = model(other).logits
            torch.testing.assert_close(out[:, :t + 1], ref[:, :t + 1], rtol=0, atol=1e-6, msg=lambda m: f"t={t}: {m}")
            assert not torch.allclose(out[:, t + 1:], ref[:, t + 1:])


def test_shifted_heads_first_half_group_does_not_see_the_last_group():
    """Direct check on the attention: change keys/values of the last group only; rows [0, g/2) of the shifted
    heads do not move. The eager reference's roll does move them (the leak of LongLoRA #15/#90)."""
    gen = torch.Generator().manual_seed(0)
    B, H, L, d = 2, 4, 32, 8
    g = group_size(L, 0.25)
    q, k, v = (torch.randn(B, H, L, d, generator=gen) for _ in range(3))
    k2, v2 = k.clone(), v.clone()
    k2[:, :, L - g:] = torch.randn(B, H, g, d, generator=gen)
    v2[:, :, L - g:] = torch.randn(B, H, g, d, generator=gen)
    attn = ShiftedSparseAttention(0.25)
    module = _Module().train()
    a = attn(module, q, k, v, None, scaling=d ** -0.5, kernel=_no_kernel)[0].transpose(1, 2)
    b = attn(module, q, k2, v2, None, scaling=d ** -0.5, kernel=_no_kernel)[0].transpose(1, 2)
    assert torch.equal(a[:, :, : L - g], b[:, :, : L - g])  # nothing before the last group moves, any head
    rolled_a, rolled_b = _roll_reference(q, k, v, g), _roll_reference(q, k2, v2, g)
    assert not torch.allclose(rolled_a[:, H // 2:, : g // 2], rolled_b[:, H // 2:, : g // 2])  # the leak
    # Away from the wrap-around both agree: unshifted heads everywhere, shifted heads after the first half-group.
    torch.testing.assert_close(a[:, : H // 2], rolled_a[:, : H // 2], rtol=0, atol=1e-6)
    torch.testing.assert_close(a[:, H // 2:, g // 2: L - g // 2], rolled_a[:, H // 2:, g // 2: L - g // 2], rtol=0, atol=1e-6)


def test_roll_reference_fails_the_causality_check(make_ids):
    """Teeth for test_no_token_sees_a_later_token: the same model with the eager roll leaks."""
    model = _longlora({"num_kv_heads": None}).train()

    def rolled(module, query, key, value, attention_mask, *, scaling, dropout, kernel, **kwargs):
        return _roll_reference(query, key, value, group_size(query.shape[2], 0.25)).transpose(1, 2), None

    for layer in model.model.layers:
        layer.self_attn.ropekit_attend = rolled
    ids = make_ids(64, seed=3)
    other = ids.clone()
    other[:, 60:] = make_ids(4, seed=9)
    with torch.no_grad():
        assert not torch.allclose(model(other).logits[:, :8], model(ids).logits[:, :8])


# ================================================================ inference = plain PI
@pytest.mark.parametrize("case", ["gqa", "odd-kv"])
def test_eval_mode_is_the_plain_pi_model_exactly(case, make_ids):
    kwargs, _ = MODELS[case]
    model = _longlora(kwargs, sharpen=False)
    pi = ropekit.extend(build_tiny_model("llama", **kwargs), "pi", factor=FACTOR)
    ids = make_ids(96)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, pi(ids).logits)
    gen = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids))
    assert torch.equal(model.generate(ids, **gen), pi.generate(ids, **gen))
    model.train()
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, pi(ids).logits)  # the pattern is active in training


def test_cached_steps_use_full_attention_even_in_training():
    calls = []

    def kernel(module, query, key, value, attention_mask, **kwargs):
        calls.append(key.shape[2])
        return query.transpose(1, 2), None

    attn = ShiftedSparseAttention(0.25)
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 9, 8)
    attn(_Module().train(), q, k, k, None, scaling=None, kernel=kernel)
    attn(_Module().eval(), torch.randn(1, 2, 9, 8), k, k, None, scaling=None, kernel=kernel)
    assert calls == [9, 9]


def test_gradients_flow_in_training(make_ids):
    model = _longlora({}, sharpen=False).train()
    ids = make_ids(64)
    mask = torch.ones_like(ids)
    mask[0, -5:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    loss = model(ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    for layer in model.model.layers:
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            assert getattr(layer.self_attn, proj).weight.grad.abs().sum() > 0


# ================================================================ parameters, export
def test_method_description():
    m = ropekit.get_method("longlora")
    assert m.changes == ("frequencies", "attention_pattern") and m.needs_training
    assert m.exports_to() == ["transformers", "vllm"]
    from ropekit.methods.longlora import RECIPE

    assert RECIPE["lora_rank"] == 8 and RECIPE["lora_alpha"] == 16


@pytest.mark.parametrize("params", [
    {"group_size_ratio": 0.0}, {"group_size_ratio": 1.5}, {"group_size_ratio": "quarter"}, {"factor": 0.5},
    {"group_size": 4},
])
def test_bad_params_raise_one_line(params):
    model = build_tiny_model("llama")
    with pytest.raises(RopekitError) as err:
        ropekit.extend(model, "longlora", **params)
    assert "\n" not in str(err.value) and str(err.value)
    assert ropekit.installed(model) is None


def test_export_is_a_plain_pi_model(tmp_path, make_ids):
    model = _longlora({})
    report = ropekit.save_pretrained(model, tmp_path)
    assert report["transformers"] and report["vllm"]
    assert report["rope_parameters"]["rope_type"] == "linear" and report["rope_parameters"]["factor"] == FACTOR
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    loaded = ropekit.load(tmp_path)
    ids = make_ids(100)
    with torch.no_grad():
        want = model(ids).logits
        assert torch.equal(plain(ids).logits, want)
        assert torch.equal(loaded(ids).logits, want)
    assert ropekit.installed(loaded)["method"] == "longlora"
    loaded.train()
    with torch.no_grad():
        assert not torch.allclose(loaded(ids).logits, want)  # S²-Attn is back for training


# ================================================================ the rule itself (pair_logits)
def test_rule_keeps_exactly_the_group_pairs():
    """``pair_logits`` in training mode keeps the pairs of ``_allowed_pairs`` (written out above) per head —
    unshifted groups for the first half of the heads, shifted ones for the rest — among the real keys; the
    logits are plain ``scale · q·k``. In eval mode it is plain causal attention."""
    gen = torch.Generator().manual_seed(23)
    B, H, KV, n, d = 2, 4, 2, 30, 8
    q = torch.randn(B, H, n, d, generator=gen)
    k = torch.randn(B, KV, n, d, generator=gen)
    real = torch.ones(B, n, dtype=torch.long)
    real[1, -5:] = 0
    attn = ShiftedSparseAttention(0.25)
    rows = torch.arange(n)
    got = attn.pair_logits(_Module().train(), q, k, real, scaling=0.3, rows=rows)
    g = math.ceil(n / 4)
    plain = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double().repeat_interleave(H // KV, dim=1)) * 0.3
    kept = got.kept.expand(B, H, n, n)
    for b in range(B):
        for h in range(H):
            want = _allowed_pairs(n, g, shifted=h >= H // 2) & real[b].bool()[None, :]
            assert torch.equal(kept[b, h], want), (b, h)
    torch.testing.assert_close(got.logits.double()[kept], plain[kept], rtol=0, atol=1e-5)
    evaluated = attn.pair_logits(_Module().eval(), q, k, real, scaling=0.3, rows=rows)
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None] & real.bool()[:, None, None, :]
    assert torch.equal(evaluated.kept.expand(B, H, n, n), causal.expand(B, H, n, n))
