"""LM-Infinite (Λ-shaped attention with a distance ceiling) against a naive reference written out here.

The reference recomputes every layer's attention from the module's own projections (captured with hooks):
explicit 2×2 RoPE rotations per pair of channels, the Λ rule per (query, key) pair in positions, a full
masked float64 softmax. It never calls ropekit's kernels.
"""

from __future__ import annotations

import math

import pytest
import torch
from pair_reference import turn

from ropekit.core.hf_compat import cache_argument
from transformers import DynamicCache

import ropekit
from ropekit import RopekitError
from ropekit.models.tiny import build_tiny_model
from ropekit.install import resolve_params

L_LOCAL, G = 24, 3
ATOL = 2e-5

MODELS = {
    # name: family, build kwargs, rotary dim
    "llama-gqa": ("llama", {}, 16),
    "llama-mha": ("llama", {"num_kv_heads": None}, 16),
    "gpt_neox-partial": ("gpt_neox", {}, 4),
}


def _attn_modules(model):
    return [getattr(layer, "self_attn", None) or layer.attention for layer in model.base_model.layers]


def _sharpen(model, k: float = 3.0) -> None:
    """Larger q/k projections: logits of O(1–10), so positions and masks visibly matter."""
    with torch.no_grad():
        for attn in _attn_modules(model):
            if hasattr(attn, "query_key_value"):
                attn.query_key_value.weight *= k ** 0.5
            else:
                attn.q_proj.weight *= k
                attn.k_proj.weight *= k


def _capture(model, ids, **forward):
    """Per layer: unrotated q (B, L, H, d), k, v (B, L, KV, d) from the projections, and the attention output
    entering the output projection (B, L, H·d)."""
    cfg = model.config
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    seen, handles = {}, []
    for i, attn in enumerate(_attn_modules(model)):
        store = seen.setdefault(i, {})
        if hasattr(attn, "query_key_value"):  # gpt_neox: per head [q | k | v]
            def qkv_hook(mod, args, out, store=store):
                B, L, _ = out.shape
                q, k, v = out.view(B, L, heads, -1).chunk(3, dim=-1)
                store.update(q=q.detach().double(), k=k.detach().double(), v=v.detach().double())

            handles.append(attn.query_key_value.register_forward_hook(qkv_hook))
            out_proj = attn.dense
        else:
            for name, n in (("q", heads), ("k", kv), ("v", kv)):
                def hook(mod, args, out, store=store, name=name, n=n):
                    B, L, _ = out.shape
                    store[name] = out.detach().double().view(B, L, n, -1)

                handles.append(getattr(attn, f"{name}_proj").register_forward_hook(hook))
            out_proj = attn.o_proj

        def pre(mod, args, store=store):
            store["out"] = args[0].detach().double()

        handles.append(out_proj.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            logits = model(ids, **forward).logits
    finally:
        for h in handles:
            h.remove()
    return seen, logits


def _rotate(x: torch.Tensor, positions: torch.Tensor, base: float, rot: int) -> torch.Tensor:
    """Explicit RoPE, half-split layout: pair i = channels (i, i + rot/2) turned by angle p·θ_i, θ_i = b^(−2i/rot).

    x (L, d) float64, positions (L,). The angle is formed in float32 like the model (position × float32 θ).
    """
    half = rot // 2
    theta = (base ** (-2.0 * torch.arange(half, dtype=torch.float64) / rot)).float()
    angle = (positions.float()[:, None] * theta[None, :]).double()
    out = x.clone()
    for i in range(half):
        c, s = angle[:, i].cos(), angle[:, i].sin()
        x1, x2 = x[:, i], x[:, i + half]
        out[:, i] = c * x1 - s * x2
        out[:, i + half] = s * x1 + c * x2
    return out


def _naive_lambda(q, k, v, positions, real, base, rot, local, n_global):
    """Λ attention of one row. q (L, H, d), k/v (L, KV, d), positions (L,), real (L,) bool (not padding).

    logit(i, j) = ⟨R_{p_i} q_i, R_{p_j} k_j⟩/√d     if j ≤ i and p_i − p_j < local
                = ⟨R_{local} q_i, k_j⟩/√d            elif j ≤ i and p_j < n_global
                = −∞                                  otherwise (also for padding keys)
    """
    L, H, d = q.shape
    kv = k.shape[1]
    out = torch.zeros(L, H, d, dtype=torch.float64)
    p = positions
    idx = torch.arange(L)
    causal = idx[None, :] <= idx[:, None]
    dist = p[:, None] - p[None, :]
    band = causal & (dist < local) & real[None, :]
    glob = causal & ~(dist < local) & (p[None, :] < n_global) & real[None, :]
    for h in range(H):
        g = h // (H // kv)
        q_rot = _rotate(q[:, h], p, base, rot)
        k_rot = _rotate(k[:, g], p, base, rot)
        q_at_local = _rotate(q[:, h], torch.full_like(p, local), base, rot)
        logits = torch.full((L, L), float("-inf"), dtype=torch.float64)
        near = q_rot @ k_rot.T / math.sqrt(d)
        far = q_at_local @ k[:, g].T / math.sqrt(d)
        logits[band] = near[band]
        logits[glob] = far[glob]
        out[:, h] = torch.softmax(logits, dim=-1).nan_to_num(0.0) @ v[:, g]
    return out


def _padded_batch(make_ids):
    """Two rows of 100 tokens: row 0 left-padded by 12, row 1 right-padded by 9; mask and positions as generate."""
    ids = torch.cat([make_ids(100, seed=3), make_ids(100, seed=4)])
    mask = torch.ones_like(ids)
    mask[0, :12] = 0
    mask[1, -9:] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    positions = positions.masked_fill(mask == 0, 1)
    return ids, mask, positions


def _lm_infinite(family, kwargs, local=L_LOCAL, n_global=G, seed=0, sharpen=True):
    model = build_tiny_model(family, seed=seed, **kwargs)
    if sharpen:
        _sharpen(model)
    return ropekit.extend(model, "lm_infinite", local_window=local, global_tokens=n_global)


# ================================================================ against the naive reference
@pytest.mark.parametrize("case", list(MODELS))
def test_matches_naive_lambda_attention_with_padding(case, make_ids):
    family, kwargs, rot = MODELS[case]
    model = _lm_infinite(family, kwargs)
    ids, mask, positions = _padded_batch(make_ids)
    seen, _ = _capture(model, ids, attention_mask=mask, position_ids=positions)
    base = model.config.rope_parameters["rope_theta"]
    worst_plain = 0.0
    for layer, s in seen.items():
        for b in range(2):
            real = mask[b].bool()
            want = _naive_lambda(s["q"][b], s["k"][b], s["v"][b], positions[b], real, base, rot, L_LOCAL, G)
            got = s["out"][b].view_as(want)
            torch.testing.assert_close(got[real], want[real], rtol=0, atol=ATOL,
                                       msg=lambda m: f"layer {layer} row {b}: {m}")
            # Teeth: without the clamp/mask (plain causal RoPE) the reference is far away.
            plain = _naive_lambda(s["q"][b], s["k"][b], s["v"][b], positions[b], real, base, rot, 10**6, 0)
            worst_plain = max(worst_plain, (got[real] - plain[real]).abs().max().item())
            no_global = _naive_lambda(s["q"][b], s["k"][b], s["v"][b], positions[b], real, base, rot, L_LOCAL, 0)
            assert (got[real] - no_global[real]).abs().max() > 100 * ATOL, "global tokens have no effect"
    assert worst_plain > 100 * ATOL


@pytest.mark.parametrize("local,n_global,chunk", [(L_LOCAL, G, None), (L_LOCAL, G, 5), (7, 12, 3), (1, 2, None), (2, 0, None)])
@pytest.mark.parametrize("case", ["llama-gqa", "gpt_neox-partial"])
def test_matches_naive_lambda_attention_unpadded(case, local, n_global, chunk, make_ids):
    """No padding and consecutive positions: the mask-free fast path (index bands, triangles, dense blocks)."""
    family, kwargs, rot = MODELS[case]
    model = _lm_infinite(family, kwargs, local=local, n_global=n_global)
    if chunk is not None:
        for attn in _attn_modules(model):
            attn.ropekit_attend.chunk_size = chunk
    ids = torch.cat([make_ids(90, seed=5), make_ids(90, seed=6)])
    seen, _ = _capture(model, ids)
    base = model.config.rope_parameters["rope_theta"]
    for layer, s in seen.items():
        for b in range(2):
            want = _naive_lambda(s["q"][b], s["k"][b], s["v"][b], torch.arange(90), torch.ones(90, dtype=torch.bool),
                                 base, rot, local, n_global)
            torch.testing.assert_close(s["out"][b].view_as(want), want, rtol=0, atol=ATOL,
                                       msg=lambda m: f"layer {layer} row {b}: {m}")


def test_reference_is_plain_attention_inside_the_window(make_ids):
    """Sanity of the reference itself: with a window beyond the length it is the plain model's attention."""
    model = build_tiny_model("llama")
    _sharpen(model)
    ids = make_ids(50)
    seen, _ = _capture(model, ids)
    s = seen[1]
    want = _naive_lambda(s["q"][0], s["k"][0], s["v"][0], torch.arange(50), torch.ones(50, dtype=torch.bool),
                         10000.0, 16, 10**6, 0)
    torch.testing.assert_close(s["out"][0].view_as(want), want, rtol=0, atol=ATOL)


def test_chunk_size_does_not_change_the_result(make_ids):
    model = _lm_infinite("llama", {})
    ids, mask, positions = _padded_batch(make_ids)
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, position_ids=positions).logits
        ref_unpadded = model(ids).logits
        for attn in _attn_modules(model):
            attn.ropekit_attend.chunk_size = 7
        odd = model(ids, attention_mask=mask, position_ids=positions).logits
        odd_unpadded = model(ids).logits
    real = mask.bool()
    torch.testing.assert_close(odd[real], ref[real], rtol=0, atol=1e-5)
    torch.testing.assert_close(odd_unpadded, ref_unpadded, rtol=0, atol=1e-5)


def test_padded_path_equals_fast_path_on_unpadded_input(make_ids):
    """An all-ones 4D mask forces the general (masked) path; it must agree with the mask-free path."""
    model = _lm_infinite("llama", {})
    ids = make_ids(100, seed=8)
    with torch.no_grad():
        fast = model(ids).logits
        mask = torch.ones(1, 1, 100, 100, dtype=torch.bool).tril()
        general = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(general, fast, rtol=0, atol=1e-5)


def test_eager_kernel_matches_sdpa(make_ids):
    """ropekit_eager hands an additive float mask; the Λ attention reads it like sdpa's bool mask."""
    ids, mask, positions = _padded_batch(make_ids)
    sdpa = _lm_infinite("llama", {})
    eager = build_tiny_model("llama")
    _sharpen(eager)
    eager.set_attn_implementation("eager")
    ropekit.extend(eager, "lm_infinite", local_window=L_LOCAL, global_tokens=G)
    assert eager.config._attn_implementation == "ropekit_eager"
    with torch.no_grad():
        a = sdpa(ids, attention_mask=mask, position_ids=positions).logits
        b = eager(ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    torch.testing.assert_close(a[real], b[real], rtol=0, atol=1e-5)


# ================================================================ identity inside the window
@pytest.mark.parametrize("case", ["llama-gqa", "gpt_neox-partial"])
def test_window_at_least_the_length_is_the_plain_model_exactly(case, make_ids):
    family, kwargs, _ = MODELS[case]
    plain = build_tiny_model(family, window=128, **kwargs)  # L = 120 fits the window (a longer one is refused)
    model = ropekit.extend(build_tiny_model(family, window=128, **kwargs), "lm_infinite", local_window=120)
    ids, mask, positions = _padded_batch(make_ids)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, plain(ids).logits)
        assert torch.equal(model(ids, attention_mask=mask, position_ids=positions).logits,
                           plain(ids, attention_mask=mask, position_ids=positions).logits)
        # and the Λ path is really taken once a query passes the window
        longer = make_ids(130)
        assert not torch.allclose(model(longer).logits, plain(longer).logits)


# ================================================================ cache, chunked prefill, batching
@pytest.mark.parametrize("case", ["llama-gqa", "gpt_neox-partial"])
def test_cached_generate_equals_uncached_loop(case, make_ids):
    family, kwargs, _ = MODELS[case]
    model = _lm_infinite(family, kwargs, sharpen=False)
    prompt = make_ids(70, seed=5)
    steps = 8
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=steps, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    seq = prompt
    for step in range(steps):
        with torch.no_grad():
            last = model(seq, use_cache=False).logits[:, -1]
        torch.testing.assert_close(out.logits[step], last, rtol=0, atol=1e-5, msg=lambda m: f"step {step}: {m}")
        seq = torch.cat([seq, last.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out.sequences, seq)


def test_chunked_prefill_equals_one_pass(make_ids):
    model = _lm_infinite("llama", {})
    ids = make_ids(110, seed=6)
    with torch.no_grad():
        full = model(ids).logits
        cache = DynamicCache(config=model.config)
        pieces = []
        for a, b in ((0, 40), (40, 41), (41, 90), (90, 110)):
            pieces.append(model(ids[:, a:b], **{cache_argument(model): cache}, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-5)


def test_left_padded_batch_generates_like_single_prompts(make_ids):
    model = _lm_infinite("llama", {}, sharpen=False)
    a, b = make_ids(80, seed=1), make_ids(60, seed=2)
    batch = torch.cat([a, torch.cat([torch.zeros(1, 20, dtype=torch.long), b], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :20] = 0
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    both = model.generate(batch, attention_mask=mask, **kwargs)
    alone_a = model.generate(a, attention_mask=torch.ones_like(a), **kwargs)
    alone_b = model.generate(b, attention_mask=torch.ones_like(b), **kwargs)
    assert torch.equal(both.sequences[0, 80:], alone_a.sequences[0, 80:])
    assert torch.equal(both.sequences[1, 80:], alone_b.sequences[0, 60:])
    for step in range(6):
        torch.testing.assert_close(both.logits[step][0], alone_a.logits[step][0], rtol=0, atol=1e-5)
        torch.testing.assert_close(both.logits[step][1], alone_b.logits[step][0], rtol=0, atol=1e-5)


def test_right_padded_row_equals_the_row_alone(make_ids):
    model = _lm_infinite("mistral", {})
    ids, mask, positions = _padded_batch(make_ids)
    with torch.no_grad():
        both = model(ids, attention_mask=mask, position_ids=positions).logits
        alone = model(ids[1:, :91]).logits
    torch.testing.assert_close(both[1, :91], alone[0], rtol=0, atol=1e-5)


# ================================================================ parameters, export
def test_method_description_and_defaults():
    model = build_tiny_model("llama")
    method, info, params = resolve_params(model, "lm_infinite")
    assert params["global_tokens"] == 10 and params["local_window"] == 64
    assert method.changes == ("attention_pattern",) and not method.needs_training
    assert method.transformers_rope(info, params) is None and method.exports_to() == []
    ropekit.extend(model, "lm_infinite", target_length=256)
    assert model.config.max_position_embeddings == 256
    assert model.config.rope_parameters["rope_type"] == "ropekit_lm_infinite"


@pytest.mark.parametrize("params", [
    {"local_window": 0}, {"global_tokens": -1}, {"local_window": 2.5}, {"window": 3}, {"factor": 0.5},
    {"local_window": 65},  # past the 64-token window: distances the model never saw
])
def test_bad_params_raise_one_line_and_leave_the_model_alone(params, make_ids):
    model = build_tiny_model("llama")
    ids = make_ids(80)
    with torch.no_grad():
        before = model(ids).logits
    with pytest.raises(RopekitError) as err:
        ropekit.extend(model, "lm_infinite", **params)
    assert "\n" not in str(err.value) and str(err.value)
    assert ropekit.installed(model) is None
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


def test_save_load_round_trip(tmp_path, make_ids):
    model = _lm_infinite("llama", {})
    report = ropekit.save_pretrained(model, tmp_path)
    assert report["method"] == "lm_infinite" and report["transformers"] is False
    loaded = ropekit.load(tmp_path)
    ids = make_ids(100)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert ropekit.installed(loaded)["params"]["local_window"] == L_LOCAL


# ================================================================ the rule itself (pair_logits)
def test_rule_is_the_lambda_rule_pair_by_pair():
    """``pair_logits`` against the Λ rule written out with Python ints: ⟨R_i q, R_j k⟩ when i − j < L, else
    ⟨R_L q, k⟩ (the distance clamped to L) when j < G, else not kept; a left-padded row included."""
    from ropekit.methods.lm_infinite_attention import LambdaAttention

    L, n_global, D, n, scale = 7, 3, 8, 30, 0.45
    theta = [10000.0 ** (-2 * f / D) for f in range(D // 2)]
    gen = torch.Generator().manual_seed(22)
    q_raw = torch.randn(2, 2, n, D, generator=gen, dtype=torch.float64)
    k_raw = torch.randn(2, 1, n, D, generator=gen, dtype=torch.float64)
    real = [[1] * n, [0] * 4 + [1] * (n - 4)]
    pos = [list(range(n)), [t - 4 if t >= 4 else 1 for t in range(n)]]
    q = torch.tensor([[[turn(q_raw[b, h, t].tolist(), pos[b][t], theta) for t in range(n)] for h in range(2)]
                      for b in range(2)], dtype=torch.float64)
    k = torch.tensor([[[turn(k_raw[b, 0, t].tolist(), pos[b][t], theta) for t in range(n)]] for b in range(2)],
                     dtype=torch.float64)
    attend = LambdaAttention(L, n_global, lambda: torch.tensor(theta))
    rows = torch.tensor([n - 1, 3, 12, 20])
    got = attend.pair_logits(torch.nn.Module(), q, k, torch.tensor(real), scaling=scale, rows=rows,
                             position_ids=torch.tensor(pos))
    kept = got.kept.expand(2, 2, len(rows), n)
    clamped = 0
    for b in range(2):
        for h in range(2):
            for r, i in enumerate(rows.tolist()):
                for j in range(n):
                    pi, pj = pos[b][i], pos[b][j]
                    near = j <= i and real[b][j] == 1 and pi - pj < L
                    far = j <= i and real[b][j] == 1 and pi - pj >= L and pj < n_global
                    assert bool(kept[b, h, r, j]) == (near or far), (b, h, i, j)
                    if near:
                        want = scale * sum(x * y for x, y in zip(turn(q_raw[b, h, i].tolist(), pi, theta),
                                                                 turn(k_raw[b, 0, j].tolist(), pj, theta)))
                    elif far:
                        clamped += 1
                        want = scale * sum(x * y for x, y in zip(turn(q_raw[b, h, i].tolist(), L, theta),
                                                                 k_raw[b, 0, j].tolist()))
                    else:
                        continue
                    assert abs(float(got.logits[b, h, r, j]) - want) < 1e-4, (b, h, i, j)
    assert clamped > 10 and got.log_normaliser is None
