"""Self-Extend (Jin et al. 2024 §3, per-position floors; LCEG's Eq. 13 writes ⌊(i − j)/G⌋) against a naive O(n²)
reference written out here.

The reference takes the rotated queries/keys/values each layer's attention receives, undoes the RoPE
rotation with explicit per-pair angles, and recomputes every logit from the definition

    rel(i, j) = i − j                                  if i − j < W
              = (⌊i/G⌋ + W − ⌊W/G⌋) − ⌊j/G⌋            otherwise

with the rotated-dot-product identity ``(R_a q)·(R_b k) = cos((a−b)θ)(q₁k₁+q₂k₂) + sin((a−b)θ)(q₁k₂−q₂k₁)``
per frequency pair, a full masked softmax in float64, and compares the layer's attention output. The
model-level tests (padding, KV cache, chunked prefill, generate) check consistency end to end.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from pair_reference import turn
from layer_records import record_layers
from layer_records import sharpen as sharpen_qk
from transformers import DynamicCache

import ropekit
from ropekit.attention.interface import attention_modules
from ropekit.core.hf_compat import cache_argument
from ropekit.errors import RopekitError
from ropekit.models.tiny import build_tiny_model

ATOL = 1e-5
TEETH = 1e-3  # a wrong position rule must miss the layer output by far more than the tolerance


# ---------------------------------------------------------------- naive reference
def _angles(pos: torch.Tensor, theta32: torch.Tensor) -> torch.Tensor:
    """RoPE angle p·θ_f formed in float32 as transformers forms it, then widened to float64."""
    return (pos.to(torch.float32)[..., None] * theta32).double()


def naive_self_extend(q, k, v, q_pos, k_pos, allowed, G, W, theta32, scale, floor=True):
    """softmax(mask(scale · (R_a q̃_i)·(R_b k̃_j))) · v with (a, b) = (i, j) if i − j < W else
    (⌊i/G⌋ + W − ⌊W/G⌋, ⌊j/G⌋) — Jin et al. 2024 §3. ``floor=False`` is LongLM 4.38's ``/`` for the query.

    q (B, H, Lq, D), k/v (B, H_kv, Lk, D) rotated at q_pos (B, Lq) / k_pos (B, Lk); allowed (B, Lq, Lk).
    Returns (B, Lq, H, D) in float64.
    """
    F = theta32.numel()
    rot = 2 * F
    heads = q.shape[1]
    q, k, v = q.double(), k.double(), v.double()

    def unrotate(x, pos):
        a = _angles(pos, theta32)[:, None]  # (B, 1, L, F)
        c, s = a.cos(), a.sin()
        x1, x2 = x[..., :F], x[..., F:rot]
        return x1 * c + x2 * s, x2 * c - x1 * s, x[..., rot:]

    q1, q2, qp = unrotate(q, q_pos)
    groups = heads // k.shape[1]
    k1, k2, kp = (t.repeat_interleave(groups, dim=1) for t in unrotate(k, k_pos))
    v = v.repeat_interleave(groups, dim=1)

    i, j = q_pos[:, :, None], k_pos[:, None, :]
    if floor:
        gq, gk = i // G + W - W // G, j // G
    else:
        gq, gk = i / G + W - W / G, j // G
    near = (i - j) < W
    a = torch.where(near, i.to(torch.float64), gq.to(torch.float64))
    b = torch.where(near, j.to(torch.float64), gk.to(torch.float64))
    angle = (_angles(a, theta32) - _angles(b, theta32))[:, None]  # (B, 1, Lq, Lk, F)
    dot = torch.einsum("bhqf,bhkf->bhqkf", q1, k1) + torch.einsum("bhqf,bhkf->bhqkf", q2, k2)
    cross = torch.einsum("bhqf,bhkf->bhqkf", q1, k2) - torch.einsum("bhqf,bhkf->bhqkf", q2, k1)
    logits = (angle.cos() * dot).sum(-1) + (angle.sin() * cross).sum(-1) + qp @ kp.transpose(-1, -2)
    logits = (logits * scale).masked_fill(~allowed[:, None], float("-inf"))
    probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    return (probs @ v).transpose(1, 2)


# ---------------------------------------------------------------- helpers
def _theta32(model) -> torch.Tensor:
    info = ropekit.rope_info(model)
    return (info.rope_theta ** (-torch.arange(0, info.rotary_dim, 2, dtype=torch.int64).float() / info.rotary_dim))


def _ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def _extended(family="llama", kernel="sdpa", sharpen=True, **params):
    kwargs = {"num_kv_heads": None} if family == "llama-mha" else {}
    model = build_tiny_model("llama" if family == "llama-mha" else family, **kwargs)
    if sharpen:
        sharpen_qk(model)
    if kernel != "sdpa":
        model.set_attn_implementation(kernel)
    ropekit.extend(model, "self_extend", **params)
    return model


def _set_chunk(model, chunk: int) -> None:
    for attn in attention_modules(model):
        attn.ropekit_attend.chunk = chunk


def _check_layers(model, records, q_pos, allowed, rows, G, W, *, teeth=True):
    """Each layer's attention output equals the naive reference on the real query ``rows`` (B, Lq)."""
    theta = _theta32(model)
    for layer, calls in records.items():
        (rec,) = calls
        want = naive_self_extend(rec["q"], rec["k"], rec["v"], q_pos, q_pos, allowed, G, W, theta, rec["scaling"])
        got = rec["out"].double()
        err = (got - want)[rows].abs().max().item()
        assert err <= ATOL, f"layer {layer}: max error {err:.3g}"
        if teeth:
            plain = naive_self_extend(rec["q"], rec["k"], rec["v"], q_pos, q_pos, allowed, 1, 10**9, theta,
                                      rec["scaling"])
            assert (got - plain)[rows].abs().max().item() > TEETH, f"layer {layer}: Self-Extend is invisible"


# ---------------------------------------------------------------- naive attention, one sequence
CASES = {
    # name: (family, kernel, params, length, chunk)
    "llama-gqa": ("llama", "sdpa", {"group_size": 4, "window_size": 16}, 200, None),
    "llama-gqa-chunked-rows": ("llama", "sdpa", {"group_size": 4, "window_size": 16}, 200, 23),
    "llama-mha": ("llama-mha", "sdpa", {"group_size": 4, "window_size": 16}, 200, None),
    "llama-eager": ("llama", "eager", {"group_size": 4, "window_size": 16}, 200, 50),
    "qwen3": ("qwen3", "sdpa", {"group_size": 8, "window_size": 24}, 220, None),
    "gpt_neox-partial-rotary": ("gpt_neox", "sdpa", {"group_size": 3, "window_size": 10}, 160, 40),
}


@pytest.mark.parametrize("case", list(CASES))
def test_naive_reference_per_layer(case):
    family, kernel, params, n, chunk = CASES[case]
    model = _extended(family, kernel, **params)
    if chunk:
        _set_chunk(model, chunk)
    records = record_layers(model)
    with torch.no_grad():
        model(_ids(1, n))
    pos = torch.arange(n)[None]
    allowed = torch.ones(n, n, dtype=torch.bool).tril()[None]
    _check_layers(model, records, pos, allowed, (slice(None),), params["group_size"], params["window_size"])


def test_group_size_not_dividing_window_uses_floor_division():
    """G = 3 ∤ W = 5: the paper's ⌊W/G⌋ (= 1), not LongLM 4.38's W/G (= 1.67)."""
    model = _extended("llama", group_size=3, window_size=5)
    records = record_layers(model)
    n = 150
    with torch.no_grad():
        model(_ids(1, n, seed=4))
    pos = torch.arange(n)[None]
    allowed = torch.ones(n, n, dtype=torch.bool).tril()[None]
    _check_layers(model, records, pos, allowed, (slice(None),), 3, 5)
    theta = _theta32(model)
    for layer, (rec,) in records.items():
        buggy = naive_self_extend(rec["q"], rec["k"], rec["v"], pos, pos, allowed, 3, 5, theta, rec["scaling"],
                                  floor=False)
        assert (rec["out"].double() - buggy).abs().max() > TEETH, f"layer {layer}: '/' and '//' agree"


# ---------------------------------------------------------------- padding
def _padded(side: str, lengths=(180, 130), total=180, seed=5):
    ids = _ids(len(lengths), total, seed)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for b, n in enumerate(lengths):
        if side == "left":
            mask[b, total - n:] = 1
        else:
            mask[b, :n] = 1
    ids = ids.masked_fill(mask == 0, 0)
    if side == "left":  # as generate builds them
        pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    else:
        pos = torch.arange(total)[None].expand(len(lengths), -1)
    return ids, mask, pos


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_padded_batch_matches_naive_and_single_sequences(side, kernel):
    G, W = 4, 16
    model = _extended("llama", kernel, group_size=G, window_size=W)
    _set_chunk(model, 64)
    ids, mask, pos = _padded(side)
    records = record_layers(model)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, position_ids=pos).logits
    L = ids.shape[1]
    allowed = torch.ones(L, L, dtype=torch.bool).tril()[None] & mask.bool()[:, None, :]
    _check_layers(model, records, pos, allowed, mask.bool(), G, W)
    # Every real token's logits equal those of its sequence run alone, unpadded.
    for b in range(ids.shape[0]):
        real = mask[b].bool()
        with torch.no_grad():
            alone = model(ids[b:b + 1, real]).logits[0]
        torch.testing.assert_close(logits[b, real], alone, rtol=0, atol=ATOL)


# ---------------------------------------------------------------- KV cache
@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_chunked_prefill_and_decoding_equal_one_pass(family):
    model = _extended(family, group_size=4, window_size=16)
    _set_chunk(model, 32)
    ids = _ids(1, 200, seed=6)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        cache = DynamicCache(config=model.config)
        steps = [(0, 70), (70, 130), (130, 180)] + [(i, i + 1) for i in range(180, 200)]
        for start, end in steps:
            got = model(ids[:, start:end], **{cache_argument(model): cache}, use_cache=True,
                        position_ids=torch.arange(start, end)[None]).logits
            torch.testing.assert_close(got, full[:, start:end], rtol=0, atol=ATOL,
                                       msg=lambda m, start=start, end=end: f"tokens {start}:{end}: {m}")


def _greedy_uncached(model, ids, mask, new_tokens):
    """Greedy decoding by full uncached forwards, with generate's position ids (cumsum of the mask − 1)."""
    ids, mask = ids.clone(), mask.clone()
    for _ in range(new_tokens):
        pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        with torch.no_grad():
            logits = model(ids, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return ids


@pytest.mark.parametrize("batch", [1, 2])
def test_generate_with_cache_equals_uncached_greedy_loop(batch):
    model = _extended("llama", group_size=4, window_size=16)
    if batch == 1:
        ids, mask = _ids(1, 90, seed=7), torch.ones(1, 90, dtype=torch.long)
    else:
        ids, mask, _ = _padded("left", lengths=(90, 60), total=90, seed=7)
    new = 30
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, pad_token_id=0)
    want = _greedy_uncached(model, ids, mask, new)
    assert torch.equal(out, want), (out[:, -new:], want[:, -new:])


# ---------------------------------------------------------------- degenerate case, parameters, warnings, export
@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_window_covering_the_input_is_the_plain_model_exactly(kernel):
    base = build_tiny_model("llama")
    model = build_tiny_model("llama")
    if kernel != "sdpa":
        base.set_attn_implementation(kernel)
        model.set_attn_implementation(kernel)
    ropekit.extend(model, "self_extend", group_size=4, window_size=63)
    ids = _ids(1, 60, seed=8)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, base(ids).logits)
        # ... also with padding and a cache
        pids, pmask, _ = _padded("left", lengths=(50, 35), total=50, seed=8)
        a = model.generate(input_ids=pids, attention_mask=pmask, max_new_tokens=8, min_new_tokens=8,
                           do_sample=False, pad_token_id=0)
        b = base.generate(input_ids=pids, attention_mask=pmask, max_new_tokens=8, min_new_tokens=8,
                          do_sample=False, pad_token_id=0)
    assert torch.equal(a, b)


def test_defaults_target_and_reach():
    info = ropekit.rope_info(build_tiny_model("llama"))  # window 64
    m = ropekit.get_method("self_extend")
    assert m.changes == ("attention_pattern",) and not m.needs_training
    params = m.resolve(info, {})
    assert params["window_size"] == 16 and params["group_size"] == 32  # C/4 on a 64-token window; README G
    assert m.reach(info, params) == 32 * (64 - 16 + 0)  # G > W: ⌊W/G⌋ = 0, the README's form says 1,552
    # A target picks the smallest group size whose reach G·(C − W + ⌊W/G⌋) covers it.
    params = m.resolve(info, {"factor": 4.0})  # G = 5 reaches 5·(48 + 3) = 255 < 256 (the README's form: 256)
    assert params["group_size"] == 6 and m.reach(info, params) == 300
    params = m.resolve(info, {"factor": 8.0})
    assert params["group_size"] == 11 and m.reach(info, params) == 11 * (48 + 1)
    model = ropekit.extend(build_tiny_model("llama"), "self_extend", target_length=300, window_size=20)
    assert model.config.rope_parameters["group_size"] == 7  # 7·(44 + 2) = 322 ≥ 300 > 6·(44 + 3) = 282
    assert model.config.max_position_embeddings == 322
    assert m.transformers_rope(info, params) is None and m.exports_to() == []


@pytest.mark.parametrize("window,window_size,group_size", [
    (64, 16, 2), (64, 16, 5), (64, 16, 32), (64, 20, 7), (64, 63, 4), (64, 1, 3), (256, 64, 12), (8192, 1024, 5),
])
def test_the_reach_is_the_longest_input_whose_pairs_stay_inside_the_window(window, window_size, group_size):
    """Brute force over input lengths: the largest relative position of an input of n tokens, taken over every
    (query, key) pair by the paper's rule, written out here; the reach is the largest n that keeps it below C."""
    def farthest(n):
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        grouped = i // group_size + window_size - window_size // group_size - j // group_size
        rel = torch.where(i - j < window_size, i - j, grouped)
        return int(rel[j <= i].max())

    reach = ropekit.get_method("self_extend").reach(
        ropekit.rope_info(build_tiny_model("llama", window=window)), {"group_size": group_size, "window_size": window_size})
    if window <= 256:
        assert farthest(reach) <= window - 1 < farthest(reach + 1)
    else:  # the farthest pair is query n − 1 against key 0 (the rule grows with i and falls with j)
        last = lambda n: (n - 1) // group_size + window_size - window_size // group_size  # noqa: E731
        assert last(reach) <= window - 1 < last(reach + 1)


@pytest.mark.parametrize("params", [
    {"window_size": 64},
    {"window_size": 100},
    {"group_size": 0},
    {"window_size": 0},
    {"group_size": 2.5},
    {"group_sise": 4},
    {"group_size": 2, "factor": 4.0},
])
def test_bad_parameters_raise_one_line(params):
    model = build_tiny_model("llama")
    with pytest.raises(RopekitError) as err:
        ropekit.extend(model, "self_extend", **params)
    assert "\n" not in str(err.value)
    assert getattr(model.config, "ropekit", None) is None  # the model is left unchanged


def test_warns_once_past_the_reach():
    model = _extended("llama", sharpen=False, group_size=2, window_size=16)  # reach (64 − 16)·2 + 16 = 112
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with torch.no_grad():
            model(_ids(1, 100))
        assert not [w for w in seen if "self_extend" in str(w.message)]
        with torch.no_grad():
            model(_ids(1, 130))
            model(_ids(1, 140))
    hits = [str(w.message) for w in seen if "self_extend" in str(w.message)]
    assert len(hits) == 1, hits
    assert "112" in hits[0] and "\n" not in hits[0]


def test_save_load_round_trip(tmp_path):
    model = _extended("llama", group_size=3, window_size=10)
    report = ropekit.save_pretrained(model, tmp_path / "se")
    assert report["method"] == "self_extend" and report["transformers"] is False and report["vllm"] is False
    loaded = ropekit.load(tmp_path / "se")
    assert ropekit.installed(loaded)["params"] == ropekit.installed(model)["params"]
    assert loaded.config.rope_parameters["rope_type"] == "ropekit_self_extend"
    ids = _ids(1, 150, seed=9)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_rope_is_plain():
    """Self-Extend leaves the frequencies alone: the rebuilt rotary embedding equals the base one bit for bit."""
    base = build_tiny_model("gpt_neox")
    model = ropekit.extend(build_tiny_model("gpt_neox"), "self_extend", factor=2)
    assert torch.equal(model.gpt_neox.rotary_emb.inv_freq, base.gpt_neox.rotary_emb.inv_freq)
    assert math.isclose(model.gpt_neox.rotary_emb.attention_scaling, 1.0)


def test_position_jumps_take_the_general_path_and_match_naive(monkeypatch):
    """Positions that are not consecutive (a PoSE-style jump) are decided pair by pair from positions."""
    from ropekit.methods.self_extend_attention import SelfExtendAttention

    G, W = 5, 16  # reach (64 − 16)·5 + 16 = 256 covers position 249
    model = _extended("llama", group_size=G, window_size=W)
    _set_chunk(model, 40)
    calls = []
    general = SelfExtendAttention._attend_general
    monkeypatch.setattr(SelfExtendAttention, "_attend_general",
                        lambda self, *a, **k: calls.append(1) or general(self, *a, **k))
    pos = torch.cat([torch.arange(80), torch.arange(150, 250)])[None]
    n = pos.shape[1]
    records = record_layers(model)
    with torch.no_grad():  # an explicit mask: without one transformers splits at the jump (docs/methods-reference.md §9)
        model(_ids(1, n, seed=10), attention_mask=torch.ones(1, n, dtype=torch.long), position_ids=pos)
    assert calls, "the general path did not run"
    allowed = torch.ones(n, n, dtype=torch.bool).tril()[None]
    _check_layers(model, records, pos, allowed, (slice(None),), G, W)


@pytest.mark.parametrize("path", ["causal", "banded", "general"])
def test_each_structural_path_equals_the_rule_over_offsets_windows_and_chunks(path):
    """Every way Self-Extend splits its work — the causal-triangle path (plain causal mask on CPU), the banded path
    (padding) and the pair-by-pair path — equals Self-Extend's grouped positions computed naively, for prefills and for queries after
    cached keys (``Lk > Lq``), windows from 1 to past the input, and row chunks narrower and wider than ``W``."""
    from ropekit.attention.masks import AttentionMask
    from ropekit.methods.self_extend_attention import SelfExtendAttention

    gen = torch.Generator().manual_seed(21)
    theta = 100.0 ** (-torch.arange(0, 8, 2).float() / 8)
    worst = 0.0
    for q_len, off, G, W, chunk in [(1, 0, 2, 1, 1), (7, 5, 3, 4, 8), (40, 0, 2, 16, 8), (40, 50, 3, 16, 64),
                                    (133, 0, 3, 37, 8), (133, 5, 2, 37, 64), (96, 0, 4, 16, 16), (60, 9, 2, 200, 8)]:
        k_len = q_len + off
        q = torch.randn(1, 6, q_len, 8, generator=gen, dtype=torch.float64)
        k, v = torch.randn(2, 1, 2, k_len, 8, generator=gen, dtype=torch.float64).unbind(0)
        q_pos, k_pos = torch.arange(off, k_len)[None], torch.arange(k_len)[None]
        allowed = (q_pos[:, :, None] >= k_pos[:, None, :])
        want = naive_self_extend(q, k, v, q_pos, k_pos, allowed, G, W, theta, 0.3).transpose(1, 2)
        attend = SelfExtendAttention(lambda: theta, G, W, chunk=chunk)
        got = getattr(attend, f"_attend_{path}")(q, k, v, AttentionMask(None, q_len, k_len), q_pos, k_pos, 0.3)
        worst = max(worst, (got - want).abs().max().item())
    assert worst <= ATOL, f"{path}: max error {worst:.3g}"


def test_an_unpadded_prefill_takes_the_causal_triangle_path(monkeypatch):
    """Under the plain causal mask on CPU neither the banded nor the pair-by-pair path runs: the parts are causal
    triangles and unmasked blocks (ropekit.methods.self_extend_attention, ``_attend_causal``)."""
    from ropekit.methods.self_extend_attention import SelfExtendAttention

    def fail(*args, **kwargs):
        raise AssertionError("the causal prefill left the causal-triangle path")

    calls = []
    causal = SelfExtendAttention._attend_causal
    monkeypatch.setattr(SelfExtendAttention, "_attend_causal",
                        lambda self, *a, **k: calls.append(1) or causal(self, *a, **k))
    monkeypatch.setattr(SelfExtendAttention, "_attend_banded", fail)
    monkeypatch.setattr(SelfExtendAttention, "_attend_general", fail)
    model = _extended("llama", group_size=4, window_size=16)
    records = record_layers(model)
    with torch.no_grad():
        model(_ids(1, 120, seed=22))
    assert len(calls) == model.config.num_hidden_layers
    pos = torch.arange(120)[None]
    _check_layers(model, records, pos, torch.ones(120, 120, dtype=torch.bool).tril()[None], (slice(None),), 4, 16)


def test_padding_and_cache_take_the_banded_path(monkeypatch):
    from ropekit.methods.self_extend_attention import SelfExtendAttention

    def fail(*args, **kwargs):
        raise AssertionError("general path used")

    monkeypatch.setattr(SelfExtendAttention, "_attend_general", fail)
    model = _extended("llama", group_size=4, window_size=16)
    ids, mask, _ = _padded("left", lengths=(90, 60), total=90, seed=11)
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, min_new_tokens=5, do_sample=False,
                       pad_token_id=0)
        ids, mask, pos = _padded("right", lengths=(90, 60), total=90, seed=11)
        model(ids, attention_mask=mask, position_ids=pos)


def test_single_token_decoding_takes_the_folded_decode_path(monkeypatch):
    """Cached decoding (one query) runs ``_attend_decode`` — GQA heads folded, key rotations from the
    per-layer table — and its tokens equal the uncached loop (checked above); here: it is really used,
    and the table gives the same rotations as computing them afresh."""
    from ropekit.attention.kernels import rotate_to
    from ropekit.methods.self_extend_attention import SelfExtendAttention, group_key_position

    calls = []
    decode = SelfExtendAttention._attend_decode
    monkeypatch.setattr(SelfExtendAttention, "_attend_decode",
                        lambda self, *a, **k: calls.append(1) or decode(self, *a, **k))
    model = _extended("llama", group_size=4, window_size=16)
    ids, mask = _ids(1, 60, seed=12), torch.ones(1, 60, dtype=torch.long)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6,
                             do_sample=False, pad_token_id=0)
    assert len(calls) == 5 * model.config.num_hidden_layers  # every step after the prefill, every layer
    assert torch.equal(out, _greedy_uncached(model, ids, mask, 6))

    attend = SelfExtendAttention(lambda: torch.tensor([1.0, 0.3, 0.01]), group_size=3, window_size=5)
    key = torch.randn(2, 2, 40, 6, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(40)[None]
    want = rotate_to(key, pos, group_key_position(pos, 3), torch.tensor([1.0, 0.3, 0.01]))
    assert torch.allclose(attend._rotate_keys_to_groups(key, pos, torch.tensor([1.0, 0.3, 0.01])), want, atol=1e-6)


# ---------------------------------------------------------------- the rule itself (pair_logits)
def test_rule_is_lceg_eq13_pair_by_pair():
    """``pair_logits`` against the paper written out with Python ints: the pair (i, j) is seen at (i, j) when
    i − j < W, else at (⌊i/G⌋ + W − ⌊W/G⌋, ⌊j/G⌋); G = 3 ∤ W = 5, a left-padded row and a position jump."""
    from ropekit.methods.self_extend_attention import SelfExtendAttention

    G, W, D, n, scale = 3, 5, 8, 40, 0.4
    theta = [10000.0 ** (-2 * f / D) for f in range(D // 2)]
    gen = torch.Generator().manual_seed(21)
    q_raw = torch.randn(2, 2, n, D, generator=gen, dtype=torch.float64)
    k_raw = torch.randn(2, 1, n, D, generator=gen, dtype=torch.float64)
    real = [[0] * 3 + [1] * (n - 3), [1] * n]
    pos = [[t - 3 if t >= 3 else 1 for t in range(n)], list(range(12)) + list(range(30, 30 + n - 12))]
    q = torch.tensor([[[turn(q_raw[b, h, t].tolist(), pos[b][t], theta) for t in range(n)] for h in range(2)]
                      for b in range(2)], dtype=torch.float64)
    k = torch.tensor([[[turn(k_raw[b, 0, t].tolist(), pos[b][t], theta) for t in range(n)]] for b in range(2)],
                     dtype=torch.float64)
    attend = SelfExtendAttention(lambda: torch.tensor(theta), group_size=G, window_size=W)
    rows = torch.tensor([n - 1, 0, 17, 25, 9])
    got = attend.pair_logits(torch.nn.Module(), q, k, torch.tensor(real), scaling=scale, rows=rows,
                             position_ids=torch.tensor(pos))
    far_diff = 0.0
    for b in range(2):
        for h in range(2):
            for r, i in enumerate(rows.tolist()):
                for j in range(n):
                    keep = j <= i and real[b][j] == 1
                    assert bool(got.kept.expand(2, 2, len(rows), n)[b, h, r, j]) == keep, (b, h, i, j)
                    if not keep:
                        continue
                    pi, pj = pos[b][i], pos[b][j]
                    a, c = (pi, pj) if pi - pj < W else (pi // G + W - W // G, pj // G)
                    want = scale * sum(x * y for x, y in zip(turn(q_raw[b, h, i].tolist(), a, theta),
                                                             turn(k_raw[b, 0, j].tolist(), c, theta)))
                    assert abs(float(got.logits[b, h, r, j]) - want) < 1e-4, (b, h, i, j)
                    if pi - pj >= W:  # LongLM 4.38's "/" for the query: another logit
                        slash = scale * sum(x * y for x, y in zip(turn(q_raw[b, h, i].tolist(), pi / G + W - W / G, theta),
                                                                  turn(k_raw[b, 0, j].tolist(), c, theta)))
                        far_diff = max(far_diff, abs(want - slash))
    assert got.log_normaliser is None and far_diff > 1e-2


def test_beam_search_with_the_cache_equals_beam_search_without_it():
    """Beam search reorders the KV cache's rows between steps: the group-rotated keys kept for decoding must
    notice and be rebuilt (without that check, seed 1 below picks other sequences: scores differ by 0.03)."""
    model = _extended("llama", group_size=4, window_size=8)
    model.eval()
    for seed in range(4):
        ids = _ids(2, 60, seed=seed)
        kw = dict(max_new_tokens=25, do_sample=False, num_beams=4, num_return_sequences=4, pad_token_id=0,
                  length_penalty=0.0, attention_mask=torch.ones_like(ids), output_scores=True,
                  return_dict_in_generate=True)
        with torch.no_grad():
            cached = model.generate(ids, use_cache=True, **kw)
            uncached = model.generate(ids, use_cache=False, **kw)
        assert torch.equal(cached.sequences, uncached.sequences), seed
        torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, rtol=0, atol=1e-4)


@pytest.mark.parametrize("method, params", [("self_extend", {"group_size": 4, "window_size": 8}),
                                            ("lm_infinite", {"factor": 2}), ("dual_chunk", {"factor": 2})])
def test_the_inference_methods_apply_no_attention_dropout_at_any_length(method, params):
    """They drop no attention weights past the window; their exact fallback inside it (plain attention) dropped
    them, so one training's short and long inputs were treated differently. Now neither does, said once."""
    from ropekit.attention import interface

    interface._NO_DROPOUT_SAID.discard(method)
    model = build_tiny_model("llama")
    model.config.attention_dropout = 0.5
    for module in attention_modules(model):
        module.attention_dropout = 0.5  # what a config with attention_dropout 0.5 builds
    ropekit.extend(model, method, **params)
    ids = _ids(1, 20, seed=2)  # inside every window: the plain fallback
    with torch.no_grad():
        want = model(ids).logits
        model.train()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.manual_seed(0)
            first = model(ids).logits
            torch.manual_seed(1)
            second = model(ids).logits
    assert torch.equal(first, want) and torch.equal(second, want)
    said = [w for w in caught if "applies no attention dropout" in str(w.message)]
    assert len(said) == 1 and method in str(said[0].message)


def test_a_reorder_between_rows_that_share_their_latest_tokens_rebuilds_the_group_keys():
    """Two rows equal in their last 20 tokens, different before, swapped in the cache between decoding steps (as
    beam search does): the first layer's keys at the newest covered index are the same in both rows (a key there
    depends on its token and position alone), so a check of that one key kept the other row's group keys in
    every layer (logits off by ~0.06). Reference: one uncached pass over each final sequence."""
    model = _extended("llama", group_size=3, window_size=8)
    model.eval()
    gen = torch.Generator().manual_seed(0)
    first = torch.randint(3, 200, (40,), generator=gen)
    second = first.clone()
    second[:20] = torch.randint(3, 200, (20,), generator=gen)
    new = torch.randint(3, 200, (5,), generator=gen)
    cache = DynamicCache(config=model.config)
    rows = torch.stack([first, second])
    got = []
    with torch.no_grad():
        model(rows, **{cache_argument(model): cache}, use_cache=True)
        for step, token in enumerate(new):
            if step == 2:
                cache.reorder_cache(torch.tensor([1, 0]))
                rows = rows[[1, 0]]
            rows = torch.cat([rows, token.expand(2, 1)], dim=1)
            got.append(model(token.expand(2, 1), **{cache_argument(model): cache}, use_cache=True).logits[:, -1])
        want = model(rows, use_cache=False).logits[:, -len(new):]
    for step in range(2, len(new)):  # after the swap the rows are the final sequences' in order
        torch.testing.assert_close(got[step], want[:, step], rtol=0, atol=2e-5)


@pytest.mark.parametrize("method, params", [("self_extend", {"group_size": 4, "window_size": 8}),
                                            ("lm_infinite", {"factor": 2}), ("dual_chunk", {"factor": 2})])
def test_inference_mode_generation_equals_no_grad(method, params):
    """Under torch.inference_mode() tensors keep no version counter: the per-forward decisions must not need one."""
    model = build_tiny_model("llama", seed=1)
    ropekit.extend(model, method, **params)
    model.eval()
    ids = _ids(2, 90, seed=3)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, attention_mask=mask)
    with torch.no_grad():
        want = model.generate(ids, **kw)
    with torch.inference_mode():
        got = model.generate(ids, **kw)
    assert torch.equal(got, want)
