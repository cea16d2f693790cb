"""PoSE / RandPos sampling (PoSE, Zhu et al. 2024, arXiv 2309.10400, §3.2, App. A/B) and the attention-mask trap, against naive references."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from ropekit.data import pose
from ropekit.errors import RopekitError


def _naive_distances(position_ids, target_length: int) -> np.ndarray:
    """Boolean [target_length]: which |p − q| occur among the positions (O(n²))."""
    seen = np.zeros(target_length, dtype=bool)
    pos = [int(p) for p in position_ids]
    for a in pos:
        for b in pos:
            if a >= b:
                seen[a - b] = True
    return seen


@pytest.mark.parametrize("n_chunks", [1, 2, 3, 4])
def test_pose_positions_structure(n_chunks):
    Lc, Lt = 24, 200
    for index in range(60):
        s = pose.pose_sample(Lc, Lt, n_chunks=n_chunks, generator=pose.item_generator(7, 0, index))
        pos = s.position_ids.tolist()
        assert len(pos) == Lc and sum(s.chunk_lengths) == Lc and min(s.chunk_lengths) >= 1
        assert len(s.chunk_lengths) == n_chunks
        assert s.skips[0] == 0 and list(s.skips) == sorted(s.skips) and s.skips[-1] <= Lt - Lc
        assert 0 <= pos[0] and max(pos) < Lt
        for st, length, u in zip(s.chunk_starts, s.chunk_lengths, s.skips):
            assert pos[st:st + length] == list(range(u + st, u + st + length))  # Eq. 4, continuous inside
        assert all(b > a for a, b in itertools.pairwise(pos))  # strictly increasing across chunks
        jumps = {t for t in range(1, Lc) if pos[t] - pos[t - 1] != 1}
        assert jumps <= set(s.chunk_starts[1:])


def test_pose_is_seeded():
    a = pose.pose_sample(32, 256, n_chunks=3, doc_length=400, generator=pose.item_generator(1, 2, 3))
    b = pose.pose_sample(32, 256, n_chunks=3, doc_length=400, generator=pose.item_generator(1, 2, 3))
    assert torch.equal(a.position_ids, b.position_ids) and torch.equal(a.content_index, b.content_index)
    others = {pose.pose_sample(32, 256, generator=pose.item_generator(1, e, i)).skips for e in range(3) for i in range(10)}
    assert len(others) > 20  # fresh skips per (epoch, index)


def test_chunk_lengths_and_skips_are_uniform():
    """2 chunks: l0 ~ U{1..Lc−1}, u1 ~ U{0..Lt−Lc} (paper Fig. 6); chi-square-free check via means and ranges."""
    Lc, Lt, n = 10, 30, 3000
    l0s, u1s = [], []
    for k in range(n):
        s = pose.pose_sample(Lc, Lt, generator=pose.item_generator(0, 0, k))
        l0s.append(s.chunk_lengths[0])
        u1s.append(s.skips[1])
    assert set(l0s) == set(range(1, Lc)) and set(u1s) == set(range(Lt - Lc + 1))
    # means of discrete uniforms, within 5 standard errors
    for values, lo, hi in ((l0s, 1, Lc - 1), (u1s, 0, Lt - Lc)):
        m = hi - lo + 1
        sd = math.sqrt((m * m - 1) / 12)
        assert abs(np.mean(values) - (lo + hi) / 2) < 5 * sd / math.sqrt(n)


def test_content_offsets_per_mode():
    Lc, Lt = 20, 120
    def g():  # the same draw for every mode
        return pose.item_generator(3, 0, index)

    for index in range(40):
        zero = pose.pose_sample(Lc, Lt, n_chunks=3, doc_length=500, offset="zero", generator=g())
        assert zero.content_index.tolist() == list(range(Lc))
        aligned = pose.pose_sample(Lc, Lt, n_chunks=3, doc_length=Lt, offset="aligned", generator=g())
        assert torch.equal(aligned.content_index, aligned.position_ids)  # v_i = u_i: text at its true offset
        short = pose.pose_sample(Lc, Lt, n_chunks=3, doc_length=50, offset="aligned", generator=g())
        assert list(short.content_offsets) == [min(u, 50 - Lc) for u in short.skips]
        uni = pose.pose_sample(Lc, Lt, n_chunks=3, doc_length=70, offset="uniform", generator=g())
        v = uni.content_offsets
        assert v[0] == 0 and list(v) == sorted(v) and v[-1] <= 70 - Lc
        # Eq. 5: chunk i holds x[v_i + st_i : v_i + st_i + l_i]
        for st, length, vi in zip(uni.chunk_starts, uni.chunk_lengths, v):
            assert uni.content_index[st:st + length].tolist() == list(range(vi + st, vi + st + length))
        assert max(uni.content_index.tolist()) < 70
        # same chunk lengths and skips whatever the content mode (content is drawn last)
        assert zero.skips == aligned.skips == uni.skips and zero.chunk_lengths == uni.chunk_lengths
    with pytest.raises(RopekitError):
        pose.pose_sample(Lc, Lt, doc_length=Lc - 1, generator=g())
    with pytest.raises(RopekitError):
        pose.pose_sample(Lc, Lt, offset="middle", generator=g())


def test_sampled_coverage_reaches_every_distance_and_matches_pairwise():
    Lc, Lt, steps = 16, 64, 1500
    emp = pose.coverage(Lc, Lt, 2, steps=steps, seed=5)
    assert (emp > 0).all()  # every relative distance < L_t was trained at least once
    # the interval bookkeeping equals naive pairwise differences of the very same examples
    naive = np.zeros(Lt)
    for k in range(steps):
        s = pose.pose_sample(Lc, Lt, generator=pose.item_generator(5, 0, k))
        naive += _naive_distances(s.position_ids, Lt)
    np.testing.assert_allclose(emp, naive / steps)


def _enumerate_pose(Lc, Lt, n_chunks):
    """Exact coverage by brute force over the sampler's tree of choices, with naive pairwise distances."""
    out = np.zeros(Lt)

    def lengths(prefix, left, prob):
        if len(prefix) == n_chunks - 1:
            yield prefix + [left], prob
            return
        top = left - (n_chunks - 1 - len(prefix))
        for length in range(1, top + 1):
            yield from lengths(prefix + [length], left - length, prob / top)

    def skips(prefix, prob):
        if len(prefix) == n_chunks:
            yield prefix, prob
            return
        choices = list(range(prefix[-1], Lt - Lc + 1))
        for u in choices:
            yield from skips(prefix + [u], prob / len(choices))

    for ls, p1 in lengths([], Lc, 1.0):
        for us, p2 in skips([0], 1.0):
            pos, st = [], 0
            for length, u in zip(ls, us):
                pos.extend(range(u + st, u + st + length))
                st += length
            out += p1 * p2 * _naive_distances(pos, Lt)
    return out


@pytest.mark.parametrize("n_chunks,Lc,Lt", [(2, 8, 24), (3, 7, 16)])
def test_exact_coverage_equals_brute_force(n_chunks, Lc, Lt):
    np.testing.assert_allclose(pose.exact_coverage(Lc, Lt, n_chunks), _enumerate_pose(Lc, Lt, n_chunks), atol=1e-12)


def test_exact_closed_form_and_sampling_agree_at_size():
    Lc, Lt, steps = 32, 128, 2000
    exact = pose.exact_coverage(Lc, Lt, 2)
    n_u = Lt - Lc + 1
    # hand-computed points: d = 0 always; d = Lc needs the cross pair with u in [1, Lc − 1] (no chunk is
    # Lc long); d = Lt − 1 needs u = Lt − Lc; d = 1 is inside any chunk of ≥ 2 tokens (always, Lc ≥ 3)
    assert exact[0] == 1.0 and exact[1] == pytest.approx(1.0)
    assert exact[Lc] == pytest.approx((Lc - 1) / n_u)
    assert exact[Lt - 1] == pytest.approx(1 / n_u)
    # d = Lc − 1: inside a chunk impossible (longest ≤ Lc − 1 gives distances ≤ Lc − 2); cross: u ∈ [0, Lc − 2]
    assert exact[Lc - 1] == pytest.approx((Lc - 1) / n_u)
    emp = pose.coverage(Lc, Lt, 2, steps=steps, seed=11)
    tol = 5 * np.sqrt(exact * (1 - exact) / steps) + 1e-9
    assert (np.abs(emp - exact) <= tol).all()


def test_randpos_exact_equals_brute_force_and_sampling():
    Lc, Lt = 4, 11
    counts = np.zeros(Lt)
    subsets = list(itertools.combinations(range(Lt), Lc))
    for sub in subsets:
        counts += _naive_distances(sub, Lt)
    brute = counts / len(subsets)
    np.testing.assert_allclose(pose.exact_coverage(Lc, Lt, method="randpos"), brute, atol=1e-12)
    steps = 3000
    emp = pose.coverage(Lc, Lt, steps=steps, seed=2, method="randpos")
    assert (np.abs(emp - brute) <= 5 * np.sqrt(brute * (1 - brute) / steps) + 1e-9).all()


def test_randpos_positions():
    Lc, Lt, n = 8, 40, 2000
    hits = np.zeros(Lt)
    for k in range(n):
        p = pose.randpos_positions(Lc, Lt, pose.item_generator(0, 0, k))
        assert p.tolist() == sorted(set(p.tolist())) and len(p) == Lc and 0 <= p.min() and p.max() < Lt
        hits[p.numpy()] += 1
    # each position is chosen with probability Lc/Lt
    q = Lc / Lt
    assert (np.abs(hits / n - q) < 5 * math.sqrt(q * (1 - q) / n)).all()
    a = pose.randpos_positions(Lc, Lt, pose.item_generator(4, 1, 2))
    assert torch.equal(a, pose.randpos_positions(Lc, Lt, pose.item_generator(4, 1, 2)))


def test_report_and_plot(tmp_path):
    report = pose.pose_coverage_report(16, 64, chunks=[2, 3], steps=300, seed=0)
    names = [c["name"] for c in report["curves"]]
    assert names == ["original window", "PoSE (2 chunks)", "PoSE (3 chunks)", "RandPos"]
    original = report["curves"][0]["exact"]
    assert original == [1.0] * 16 + [0.0] * 48
    for curve in report["curves"][1:]:
        assert curve["exact"] is not None and len(curve["empirical"]) == 64
        assert curve["max_abs_error"] < 0.2
        assert curve["summary"]["never_covered"] == 0
    # more chunks cover long distances more often (paper Fig. 5)
    two, three = report["curves"][1]["summary"], report["curves"][2]["summary"]
    assert three["mean_beyond_train"] > two["mean_beyond_train"]
    out = pose.plot_coverage(report, tmp_path / "coverage.png")
    with open(out, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(RopekitError):
        pose.exact_coverage(2048, 16384, 3)  # enumeration too large: one-line error, use sampling


def test_pose_forward_needs_the_explicit_mask():
    """Later chunks must see earlier ones; without a mask transformers reads the jump as a packed sequence."""
    from ropekit.models.tiny import build_tiny_model

    model = build_tiny_model("llama", seed=0)
    Lc, Lt = 40, 256
    g = pose.item_generator(0, 0, 0)
    sample = pose.pose_sample(Lc, Lt, generator=g)
    while not 8 <= sample.chunk_lengths[0] <= Lc - 8 or sample.skips[1] == 0:
        sample = pose.pose_sample(Lc, Lt, generator=g)
    cut = sample.chunk_lengths[0]
    ids = torch.randint(3, 256, (1, Lc), generator=torch.Generator().manual_seed(1))
    pos = sample.position_ids.unsqueeze(0)
    mask = pose.attention_mask_for(Lc).unsqueeze(0)
    causal4d = torch.ones(Lc, Lc, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        with_mask = model(ids, position_ids=pos, attention_mask=mask, use_cache=False).logits
        explicit = model(ids, position_ids=pos, attention_mask=causal4d, use_cache=False).logits
        torch.testing.assert_close(with_mask, explicit, atol=1e-5, rtol=1e-5)
        perturbed = ids.clone()
        perturbed[0, :cut] = (perturbed[0, :cut] + 1) % 256
        moved = model(perturbed, position_ids=pos, attention_mask=mask, use_cache=False).logits
        assert (moved[0, cut:] - with_mask[0, cut:]).abs().max() > 1e-3  # chunk 2 attends to chunk 1
        # the trap: no mask (training, no cache) → chunk 2 is treated as a separate packed sequence
        no_mask = model(ids, position_ids=pos, use_cache=False).logits
        assert (no_mask[0, cut:] - with_mask[0, cut:]).abs().max() > 1e-3
        alone = model(ids[:, cut:], position_ids=pos[:, cut:], attention_mask=mask[:, cut:], use_cache=False).logits
        torch.testing.assert_close(no_mask[0, cut:], alone[0], atol=1e-5, rtol=1e-5)
