"""Dual Chunk Attention (An et al. 2024, §3; vLLM's form) against a naive O(n²) reference written out here.

The reference undoes the RoPE rotation of the queries/keys each layer receives with explicit angles and
recomputes every logit from the definition (L = chunk_size − local_size, c(p) = ⌊p/L⌋)::

    key position    b = j mod L
    query position  a = i mod L                          if c(i) = c(j)        (intra-chunk)
                      = min(i mod L + L, chunk_size)     if c(i) = c(j) + 1    (successive-chunk)
                      = chunk_size                       if c(i) ≥ c(j) + 2    (inter-chunk)

with ``(R_a q)·(R_b k) = cos((a−b)θ)(q₁k₁+q₂k₂) + sin((a−b)θ)(q₁k₂−q₂k₁)`` per pair, a float64 softmax, and
compares the layer outputs; model-level tests check the degenerate setting, padding, the KV cache, chunked
prefill and the refusals.
"""

from __future__ import annotations

import copy

import pytest
import torch
from layer_records import record_layers, sharpen
from pair_reference import turn

import ropekit
from ropekit.attention.interface import attention_modules
from ropekit.core.hf_compat import cache_argument, output_cache
from ropekit.errors import RopekitError
from ropekit.models.tiny import build_tiny_model

ATOL = 1e-5
TEETH = 1e-3


def naive_dca(q, k, v, q_pos, k_pos, allowed, chunk_size, local_size, theta32, scale):
    """(B, Lq, H, D) float64 attention of rotated q (B, H, Lq, D), k/v (B, H_kv, Lk, D) under the rule above."""
    F = theta32.numel()
    heads = q.shape[1]
    q, k, v = q.double(), k.double(), v.double()
    L = chunk_size - local_size

    def angles(pos):
        return (pos.to(torch.float32)[..., None] * theta32).double()

    def unrotate(x, pos):
        a = angles(pos)[:, None]
        c, s = a.cos(), a.sin()
        x1, x2 = x[..., :F], x[..., F:2 * F]
        return x1 * c + x2 * s, x2 * c - x1 * s, x[..., 2 * F:]

    q1, q2, qp = unrotate(q, q_pos)
    g = heads // k.shape[1]
    k1, k2, kp = (t.repeat_interleave(g, dim=1) for t in unrotate(k, k_pos))
    v = v.repeat_interleave(g, dim=1)
    i, j = q_pos[:, :, None], k_pos[:, None, :]
    ci, cj = i // L, j // L
    a = torch.where(ci == cj, i % L, torch.where(ci == cj + 1, torch.clamp(i % L + L, max=chunk_size),
                                                 torch.full_like(i % L, chunk_size)))
    b = j % L
    angle = (angles(a) - angles(b))[:, None]
    dot = torch.einsum("bhqf,bhkf->bhqkf", q1, k1) + torch.einsum("bhqf,bhkf->bhqkf", q2, k2)
    cross = torch.einsum("bhqf,bhkf->bhqkf", q1, k2) - torch.einsum("bhqf,bhkf->bhqkf", q2, k1)
    logits = (angle.cos() * dot).sum(-1) + (angle.sin() * cross).sum(-1) + qp @ kp.transpose(-1, -2)
    logits = (logits * scale).masked_fill(~allowed[:, None], float("-inf"))
    return (torch.softmax(logits, dim=-1).nan_to_num(0.0) @ v).transpose(1, 2)


def _ids(batch, length, seed=0):
    return torch.randint(3, 250, (batch, length), generator=torch.Generator().manual_seed(seed))


def _theta32(model):
    info = ropekit.rope_info(model)
    return info.rope_theta ** (-torch.arange(0, info.rotary_dim, 2, dtype=torch.int64).float() / info.rotary_dim)


CASES = {
    # name: (family, kv heads, kernel, chunk_size, local_size, length, query rows per block)
    "llama-gqa": ("llama", 2, "sdpa", 48, 8, 200, None),
    "llama-gqa-row-blocks": ("llama", 2, "sdpa", 48, 8, 200, 37),
    "llama-blocks-inside-chunks": ("llama", 2, "sdpa", 64, 8, 230, 16),  # parts without a mask (whole)
    "llama-mha-eager": ("llama", None, "eager", 40, 0, 170, 64),
    "qwen3": ("qwen3", 2, "sdpa", 64, 12, 230, None),
    "gpt_neox-partial-rotary": ("gpt_neox", None, "sdpa", 30, 5, 150, 40),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_layer_equals_the_naive_reference(case):
    family, kv, kernel, size, local, n, rows = CASES[case]
    model = build_tiny_model(family, seed=2, **({"num_kv_heads": kv} if family != "gpt_neox" else {}))
    sharpen(model)
    if kernel != "sdpa":
        model.set_attn_implementation(kernel)
    ropekit.extend(model, "dual_chunk", chunk_size=size, local_size=local)
    if rows:
        for attn in attention_modules(model):
            attn.ropekit_attend.chunk = rows
    records = record_layers(model)
    with torch.no_grad():
        model(_ids(1, n))
    pos = torch.arange(n)[None]
    allowed = torch.ones(n, n, dtype=torch.bool).tril()[None]
    theta = _theta32(model)
    for layer, (rec,) in records.items():
        want = naive_dca(rec["q"], rec["k"], rec["v"], pos, pos, allowed, size, local, theta, rec["scaling"])
        assert (rec["out"].double() - want).abs().max().item() <= ATOL, f"layer {layer}"
        plain = naive_dca(rec["q"], rec["k"], rec["v"], pos, pos, allowed, 10**6, 0, theta, rec["scaling"])
        assert (rec["out"].double() - plain).abs().max().item() > TEETH, f"layer {layer}: DCA is invisible"


def test_inputs_within_one_chunk_are_the_plain_model_bit_for_bit():
    model = build_tiny_model("llama", seed=1)
    plain = copy.deepcopy(model)
    ropekit.extend(model, "dual_chunk", chunk_size=64, local_size=8)
    ids = _ids(2, 56)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, plain(ids).logits)


def test_kv_cache_chunked_prefill_and_padding_equal_the_full_forward():
    model = build_tiny_model("llama", seed=1)
    sharpen(model)
    ropekit.extend(model, "dual_chunk", chunk_size=48, local_size=6)
    ids = _ids(1, 190, seed=3)
    argument = cache_argument(model)
    with torch.no_grad():
        full = model(ids).logits
        first = model(ids[:, :100], use_cache=True)
        rest = model(ids[:, 100:150], use_cache=True, **{argument: output_cache(first)})
        torch.testing.assert_close(rest.logits, full[:, 100:150], atol=2e-5, rtol=1e-5)
        cache, steps = output_cache(rest), []
        for t in range(150, 190):
            step = model(ids[:, t:t + 1], use_cache=True, **{argument: cache})
            cache = output_cache(step)
            steps.append(step.logits)
        torch.testing.assert_close(torch.cat(steps, dim=1), full[:, 150:], atol=2e-5, rtol=1e-5)
        # a left-padded batch row equals the same tokens alone
        short = _ids(1, 150, seed=4)
        padded = torch.cat([torch.zeros(1, 40, dtype=torch.long), short], dim=1)
        mask = torch.cat([torch.zeros(1, 40, dtype=torch.long), torch.ones(1, 150, dtype=torch.long)], dim=1)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        batch = model(torch.cat([padded, ids]), attention_mask=torch.cat([mask, torch.ones_like(mask)]),
                      position_ids=torch.cat([position_ids, torch.arange(190)[None]])).logits
        torch.testing.assert_close(batch[0, 40:], model(short).logits[0], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(batch[1], full[0], atol=2e-5, rtol=1e-5)


def test_settings_that_break_the_method_are_refused_in_one_line():
    for params, words in (({"chunk_size": 80}, "beyond the model's window"),
                          ({"chunk_size": 32, "local_size": 16}, "below half of chunk_size")):
        model = build_tiny_model("llama")
        with pytest.raises(RopekitError, match=words) as caught:
            ropekit.extend(model, "dual_chunk", **params)
        assert "\n" not in str(caught.value)
        assert ropekit.installed(model) is None  # nothing half-installed


def test_in_order_positions_visit_each_part_only_over_its_own_keys():
    """Without padding or packing each part attends over the contiguous keys of its chunk relation (so a key is
    visited by about one part, not three): every block's ranges are exactly the span of the keys some row of the
    block relates to that way, by brute force over every (row, key) pair."""
    from ropekit.methods.dual_chunk_attention import DualChunkAttention
    from ropekit.attention.masks import AttentionMask

    attend = DualChunkAttention(lambda: torch.ones(4), chunk_size=48, local_size=8, chunk=16)
    n, L = 200, 40
    q = torch.zeros(1, 2, n, 8)
    mask = AttentionMask.for_call(None, q, q, {})
    pos = torch.arange(n)[None]
    plain, blocks, in_order = attend._layout(mask, pos, pos, n, n)
    assert not plain and [a for a, _, _ in blocks] == [a for s in range(0, n, L) for a in range(s, min(s + L, n), 16)]
    for a, b, ranges in blocks:
        assert a // L == (b - 1) // L and b - a <= 16  # blocks cut at chunk boundaries
        i, j = torch.arange(a, b)[:, None], torch.arange(b)[None, :]
        relation = i // L - j // L
        for kind, which in enumerate((relation == 0, relation == 1, relation >= 2)):
            keys = (which & (j <= i)).any(0).nonzero()[:, 0]
            want = (int(keys.min()), int(keys.max()) + 1) if len(keys) else None
            assert (ranges[kind] and ranges[kind][:2]) == want, (a, kind, ranges[kind], want)
            if want:  # under the causal mask the earlier chunks' keys need no mask; the own chunk's do
                assert ranges[kind][2] == (kind > 0)


def test_under_the_causal_mask_no_part_reads_a_mask(monkeypatch):
    """An unpadded prefill on CPU computes every intra-chunk block as unmasked keys plus its causal triangle, and the
    earlier chunks' parts unmasked: no mask reaches the kernel, and the output still equals the naive rule."""
    from ropekit.methods import dual_chunk_attention

    seen = []
    real = dual_chunk_attention.attention_with_lse

    def recording(query, key, value, allowed, scale=None, causal=False):
        seen.append((allowed is not None, causal))
        return real(query, key, value, allowed, scale=scale, causal=causal)

    monkeypatch.setattr(dual_chunk_attention, "attention_with_lse", recording)
    model = build_tiny_model("llama", seed=2, num_kv_heads=2)
    sharpen(model)
    ropekit.extend(model, "dual_chunk", chunk_size=48, local_size=8)
    for attn in attention_modules(model):
        attn.ropekit_attend.chunk = 16
    records = record_layers(model)
    n = 200
    with torch.no_grad():
        model(_ids(1, n))
    assert seen and not any(masked for masked, _ in seen)
    L = 48 - 8  # blocks of 16 rows cut at the chunk boundaries: 16 + 16 + 8 per chunk, one triangle each
    assert sum(causal for _, causal in seen) == model.config.num_hidden_layers * (n // L) * -(-L // 16)
    pos = torch.arange(n)[None]
    allowed = torch.ones(n, n, dtype=torch.bool).tril()[None]
    for layer, (rec,) in records.items():
        want = naive_dca(rec["q"], rec["k"], rec["v"], pos, pos, allowed, 48, 8, _theta32(model), rec["scaling"])
        assert (rec["out"].double() - want).abs().max().item() <= ATOL, f"layer {layer}"


def test_positions_out_of_order_under_an_all_ones_mask_keep_the_chunk_rule():
    """An all-ones attention mask is the plain causal mask, yet positions that restart (two documents side by side)
    are out of chunk order: the intra-chunk part must still be the keys of the row's own chunk, not every earlier key.
    Rows of the first document are checked against the naive rule (later rows also see keys of later chunks, which
    no chunk relation covers)."""
    model = build_tiny_model("llama", seed=2, num_kv_heads=2)
    sharpen(model)
    ropekit.extend(model, "dual_chunk", chunk_size=48, local_size=8)
    records = record_layers(model)
    pos = torch.cat([torch.arange(120), torch.arange(80)])[None]
    n = pos.shape[1]
    with torch.no_grad():
        model(_ids(1, n, seed=4), attention_mask=torch.ones(1, n, dtype=torch.long), position_ids=pos)
    allowed = torch.ones(n, n, dtype=torch.bool).tril()[None]
    for layer, (rec,) in records.items():
        want = naive_dca(rec["q"], rec["k"], rec["v"], pos, pos, allowed, 48, 8, _theta32(model), rec["scaling"])
        err = (rec["out"].double() - want)[:, :120].abs().max().item()
        assert err <= ATOL, f"layer {layer}: max error {err:.3g}"


@pytest.mark.parametrize(("chunk_size", "local_size"), [(48, 8), (40, 0), (30, 5), (64, 31)])
def test_successive_chunk_keeps_true_distances_for_the_first_local_size_plus_one_tokens(chunk_size, local_size):
    """The docstrings' count, against brute force: for each query offset ``i mod L`` in a chunk, does every key of
    the previous chunk get its true distance ``i − j``? Exactly the offsets ``0 … local_size`` do."""
    from ropekit.methods.dual_chunk_attention import chunk_key_position, successive_query_position

    L = chunk_size - local_size
    keep_true = []
    for offset in range(L):
        i = 3 * L + offset
        j = torch.arange(2 * L, 3 * L)
        used = successive_query_position(torch.tensor(i), L, chunk_size) - chunk_key_position(j, L)
        if torch.equal(used, i - j):
            keep_true.append(offset)
        else:  # beyond them every distance is capped: chunk_size at most, and shorter than the true one
            assert int(used.max()) == chunk_size and bool((used < i - j).all())
    assert keep_true == list(range(local_size + 1))


@pytest.mark.parametrize("n_q", [50, 20])
def test_rule_is_the_three_chunk_cases_pair_by_pair(n_q):
    """``pair_logits`` (the rule the mask-format and bf16 tests hold every path to) against the paper's three cases
    written out with Python ints, on what the naive test above does not cover: a left-padded row, and either a row
    whose positions jump (no cache) or 30 cached keys before the queries (their positions consecutive up to the
    last query, as generate and chunked prefill make them)."""
    from ropekit.methods.dual_chunk_attention import DualChunkAttention

    size, local, D, n_keys, scale = 12, 3, 8, 50, 0.4
    L = size - local
    theta = [10000.0 ** (-2 * f / D) for f in range(D // 2)]
    gen = torch.Generator().manual_seed(5)
    q_raw = torch.randn(2, 2, n_q, D, generator=gen, dtype=torch.float64)
    k_raw = torch.randn(2, 1, n_keys, D, generator=gen, dtype=torch.float64)
    real = [[0] * 4 + [1] * (n_keys - 4), [1] * n_keys]
    jump = list(range(15)) + list(range(27, 27 + n_keys - 15)) if n_q == n_keys else list(range(n_keys))
    k_pos = [[t - 4 if t >= 4 else 1 for t in range(n_keys)], jump]
    q_pos = [row[n_keys - n_q:] for row in k_pos]
    q = torch.tensor([[[turn(q_raw[b, h, t].tolist(), q_pos[b][t], theta) for t in range(n_q)] for h in range(2)]
                      for b in range(2)], dtype=torch.float64)
    k = torch.tensor([[[turn(k_raw[b, 0, t].tolist(), k_pos[b][t], theta) for t in range(n_keys)]] for b in range(2)],
                     dtype=torch.float64)
    attend = DualChunkAttention(lambda: torch.tensor(theta), size, local)
    rows = torch.tensor([n_q - 1, 0, 7, 13])
    got = attend.pair_logits(torch.nn.Module(), q, k, torch.tensor(real), scaling=scale, rows=rows,
                             position_ids=torch.tensor(q_pos))
    cases = set()
    for b in range(2):
        for h in range(2):
            for r, t in enumerate(rows.tolist()):
                i_index = t + n_keys - n_q
                for j in range(n_keys):
                    keep = j <= i_index and real[b][j] == 1
                    assert bool(got.kept.expand(2, 2, len(rows), n_keys)[b, h, r, j]) == keep, (b, h, t, j)
                    if not keep:
                        continue
                    i, jp = q_pos[b][t], k_pos[b][j]
                    if i // L == jp // L:
                        a, kind = i % L, "intra"
                    elif i // L == jp // L + 1:
                        a, kind = min(i % L + L, size), "successive"
                    else:
                        a, kind = size, "inter"
                    cases.add(kind)
                    want = scale * sum(x * y for x, y in zip(turn(q_raw[b, h, t].tolist(), a, theta),
                                                             turn(k_raw[b, 0, j].tolist(), jp % L, theta)))
                    assert abs(float(got.logits[b, h, r, j]) - want) < 1e-5, (b, h, t, j, kind)  # angles in float32
    assert cases == {"intra", "successive", "inter"} and got.log_normaliser is None
