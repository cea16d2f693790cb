"""Per-head RoPE base selection for HARPE (Lian et al., COLING 2025, arXiv 2412.07171).

HARPE ("Breaking the Stage Barrier") gives every attention head ``h`` its own RoPE base
``b_h`` and trains once, directly at the target length.  The paper (§3.2) proposes two ways to
choose the ``N`` bases:

* **uniform** (Eq. 9): :func:`uniform_bases`;
* **peak-valley search** (Eq. 10 + Algorithm 1, adopted from Chen et al. 2024b, "Attention
  Buckets"): :func:`candidate_bases` builds the grid, :func:`peak_valley_search` greedily adds the
  candidate whose *attention-waveform* peaks fall onto the valleys of the bases already chosen
  (and vice versa).

The paper never defines the attention waveform precisely, nor how the ``i`` index of
Algorithm 1 pairs the peaks of one base with the valleys of the set.  The choices made here
(documented in ``docs/harpe.md`` together with how close they come to the paper's Table 2) are:

* waveform (:func:`attention_waveform`): the Attention-Buckets curve
  ``g_b(Δ) = (2/d) Σ_i cos(Δ·θ_i)``, ``θ_i = b^(-2i/d)``, i.e. the pre-softmax logit of a query
  and a key whose rotary pairs are all equal, as a function of the relative distance
  ``Δ = 0..max_distance``; by default only the rotary pairs whose wavelength ``2π/θ_i`` is at least
  ``min_wavelength`` (= the 4096-token pre-training window) are kept, i.e. the waveform is
  low-pass filtered.  Without this filter every base shares the fast ``θ_0 = 1`` oscillation and
  all bases have (almost) the same extrema every ~6 tokens, which makes the search degenerate;
* pairing (``pairing="nearest"``, default): every peak of the candidate is matched with the
  nearest valley of the chosen set, and every valley of the candidate with the nearest peak of the
  set.  ``pairing="index"`` is the literal reading of Algorithm 1 (element-wise over the sorted
  lists, truncated to the shorter one).

Everything is plain numpy, deterministic (ties go to the smaller base), and vectorised over the
candidates.
"""

from __future__ import annotations

import math
from typing import Literal, Sequence

import numpy as np

__all__ = [
    "DEFAULT_MIN_WAVELENGTH",
    "PAPER_SETTING",
    "attention_waveform",
    "candidate_bases",
    "complement_distances",
    "peak_valley_search",
    "peaks_and_valleys",
    "uniform_bases",
]

Pairing = Literal["nearest", "index"]

#: Default low-pass cut-off of the waveform: Llama-2's pre-training window (tokens).
DEFAULT_MIN_WAVELENGTH: float = 4096.0

#: The setting of the paper's Table 2 (Llama-2-7B, 32 heads of dim 128, target 128k).
PAPER_SETTING: dict = {
    "b_min": 1.0e6,
    "b_max": 5.0e6,
    "stride": 3.0e4,
    "n": 32,
    "head_dim": 128,
    "max_distance": 131072,
}

# Relative tolerance used when an interval is (nearly) an integer number of strides.
_GRID_EPS = 1e-9


# --------------------------------------------------------------------------------------------
# Eq. 9 and Eq. 10
# --------------------------------------------------------------------------------------------
def uniform_bases(b_min: float, b_max: float, n: int) -> list[float]:
    """Uniform base set of HARPE, Eq. 9.

    ``b_h = b_min + h·(b_max − b_min)/(N − 1)`` for ``h = 0..N−1``; ``n == 1`` gives ``[b_min]``.

    Args:
        b_min: smallest base (head 0).
        b_max: largest base (head N−1); must be ``>= b_min``.
        n: number of heads ``N`` (``>= 1``).

    Returns:
        The ``n`` bases in head order (ascending).
    """
    n = _check_count(n, "n")
    b_min, b_max = _check_range(b_min, b_max)
    if n == 1:
        return [b_min]
    step = (b_max - b_min) / (n - 1)
    return [b_min + h * step for h in range(n)]


def candidate_bases(b_min: float, b_max: float, stride: float) -> list[float]:
    """Candidate base set ``B_c`` of the peak-valley search, Eq. 10.

    ``B_c = {b_min + i·s : i ∈ [1, ⌊(b_max − b_min)/s⌋]}``.  ``b_min`` itself is *not* a candidate
    (Algorithm 1 starts with ``B_s = {b_min}``); when ``b_max − b_min`` is not a multiple of the
    stride the last candidate is the largest grid point ``<= b_max``.

    Args:
        b_min: start of the grid.
        b_max: end of the grid (inclusive when it lies on the grid).
        stride: grid spacing ``s > 0``.

    Returns:
        The candidates in ascending order (empty when ``b_max − b_min < s``).
    """
    b_min, b_max = _check_range(b_min, b_max)
    stride = float(stride)
    if not math.isfinite(stride) or stride <= 0:
        raise ValueError(f"stride must be a positive finite number, got {stride!r}")
    count = math.floor((b_max - b_min) / stride + _GRID_EPS)
    return [b_min + i * stride for i in range(1, count + 1)]


# --------------------------------------------------------------------------------------------
# Attention waveform and its extrema
# --------------------------------------------------------------------------------------------
def attention_waveform(
    base: float,
    head_dim: int = 128,
    max_distance: int = 131072,
    *,
    min_wavelength: float | None = DEFAULT_MIN_WAVELENGTH,
    step: int = 1,
) -> np.ndarray:
    """Attention waveform of one RoPE base (the curve that Algorithm 1's ``f_p``/``f_v`` read).

    Reconstruction of the waveform of Chen et al. 2024b (which HARPE §3.2 adopts without a
    formula): the pre-softmax score of a query/key pair whose 2-D rotary pairs are all equal
    unit vectors, as a function of their relative distance ``Δ``::

        g_b(Δ) = (2/d) · Σ_{i ∈ K} cos(Δ·θ_i),   θ_i = b^(−2i/d),  i = 0..d/2−1   (Eq. 5/6)

    with ``K`` the rotary pairs kept by the low-pass filter: ``K = {i : 2π/θ_i >= min_wavelength}``
    (``min_wavelength=None`` or ``0`` keeps all pairs, giving the unfiltered curve with
    ``g_b(0) = 1``).  The normalisation ``2/d`` only rescales the curve; it does not move extrema.

    Args:
        base: RoPE base ``b > 1``.
        head_dim: rotary dimension ``d`` (even).
        max_distance: largest relative distance evaluated (inclusive).
        min_wavelength: low-pass cut-off in tokens (see above).
        step: sampling step in tokens; sample ``k`` is ``Δ = k·step``.

    Returns:
        ``float64`` array of length ``max_distance // step + 1``: ``g_b(0), g_b(step), ...``.
    """
    thetas = _kept_thetas(float(base), head_dim, min_wavelength)
    distances = _distances(max_distance, step)
    return _waveform_from_thetas(thetas, distances, head_dim)


def peaks_and_valleys(waveform: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the local maxima (peaks) and local minima (valleys) of a sampled curve.

    These are Algorithm 1's ``f_p(b)`` and ``f_v(b)`` (lines 1–2) applied to a waveform.  A sample
    (or a plateau of equal samples) is a peak when it is strictly greater than the samples
    immediately before and after it, a valley when strictly smaller.  A plateau is reported once,
    at its left-most index.  The two end points are never extrema (their outer neighbour is
    unknown).

    Args:
        waveform: 1-D sequence of finite numbers.

    Returns:
        ``(peaks, valleys)``: ascending ``int64`` arrays of sample indices.
    """
    w = np.asarray(waveform, dtype=np.float64)
    if w.ndim != 1:
        raise ValueError(f"waveform must be 1-D, got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError("waveform must be finite")
    empty = np.zeros(0, dtype=np.int64)
    if w.size < 3:
        return empty, empty.copy()
    # Collapse plateaus: keep the first index of every run of equal values.
    starts = np.flatnonzero(np.concatenate(([True], w[1:] != w[:-1])))
    values = w[starts]
    if values.size < 3:
        return empty, empty.copy()
    left, mid, right = values[:-2], values[1:-1], values[2:]
    peaks = starts[1:-1][(mid > left) & (mid > right)]
    valleys = starts[1:-1][(mid < left) & (mid < right)]
    return peaks.astype(np.int64), valleys.astype(np.int64)


# --------------------------------------------------------------------------------------------
# Algorithm 1
# --------------------------------------------------------------------------------------------
def complement_distances(
    cand_peaks: Sequence[np.ndarray],
    cand_valleys: Sequence[np.ndarray],
    set_peaks: np.ndarray,
    set_valleys: np.ndarray,
    pairing: Pairing = "nearest",
) -> np.ndarray:
    """Distance ``d_j = d_j⁺ + d_j⁻`` of Algorithm 1 (lines 8–10) for every candidate ``j``.

    ``d_j⁺ = Σ_i |p_{j,i} − v_{s,i}|`` compares the candidate's peaks with the set's valleys and
    ``d_j⁻ = Σ_i |v_{j,i} − p_{s,i}|`` its valleys with the set's peaks.  The pairing ``i`` is:

    * ``"nearest"``: each candidate peak (valley) is paired with the nearest set valley (peak),
      ``d_j⁺ = Σ_{p ∈ P_j} min_{v ∈ V_s} |p − v|``;
    * ``"index"``: both lists sorted ascending, paired element-wise and truncated to the shorter,
      ``d_j⁺ = Σ_{i < min(|P_j|, |V_s|)} |P_j[i] − V_s[i]|``.

    A term whose reference list (``V_s`` or ``P_s``) is empty contributes 0.

    Args:
        cand_peaks, cand_valleys: per-candidate ascending positions (same length lists).
        set_peaks, set_valleys: ascending positions ``P_s`` and ``V_s`` of the chosen set.
        pairing: ``"nearest"`` or ``"index"``.

    Returns:
        ``float64`` array with one distance per candidate.
    """
    if len(cand_peaks) != len(cand_valleys):
        raise ValueError("cand_peaks and cand_valleys must have the same length")
    if len(cand_peaks) == 0:
        return np.zeros(0, dtype=np.float64)
    p_pad, p_mask = _pad(cand_peaks)
    v_pad, v_mask = _pad(cand_valleys)
    return _distances_padded(
        p_pad, p_mask, v_pad, v_mask,
        np.asarray(set_peaks, dtype=np.float64), np.asarray(set_valleys, dtype=np.float64),
        pairing,
    )


def peak_valley_search(
    b_min: float,
    b_max: float,
    stride: float,
    n: int,
    head_dim: int = 128,
    max_distance: int = 131072,
    *,
    min_wavelength: float | None = DEFAULT_MIN_WAVELENGTH,
    step: int = 1,
    pairing: Pairing = "nearest",
) -> list[float]:
    """HARPE's peak-valley base search, Algorithm 1 over the candidate grid of Eq. 10.

    1. ``B_s ← {b_min}``, ``P_s ← f_p(b_min)``, ``V_s ← f_v(b_min)`` (positions ``Δ`` in tokens of
       the peaks/valleys of :func:`attention_waveform`).
    2. While ``|B_s| < N``: for every candidate ``b_j ∈ B_c`` (Eq. 10, not yet chosen) compute
       ``d_j`` with :func:`complement_distances`; add the arg-min (ties: smaller base) to ``B_s``
       and set ``P_s ← P_s ∪ f_p(b_j)``, ``V_s ← V_s ∪ f_v(b_j)`` (set union: sorted, unique).

    Args:
        b_min, b_max, stride: the grid of Eq. 10 (``b_min`` is always the first base).
        n: number of bases ``N`` (number of heads, or of KV groups on a GQA model).
        head_dim, max_distance, min_wavelength, step: forwarded to :func:`attention_waveform`.
        pairing: see :func:`complement_distances`.

    Returns:
        The ``n`` bases **in selection order** (``result[0] == b_min``); sort them for a table.
    """
    n = _check_count(n, "n")
    if pairing not in ("nearest", "index"):
        raise ValueError(f"pairing must be 'nearest' or 'index', got {pairing!r}")
    candidates = candidate_bases(b_min, b_max, stride)
    if n - 1 > len(candidates):
        raise ValueError(
            f"n={n} bases requested but the grid holds only {len(candidates) + 1} "
            f"(b_min plus {len(candidates)} candidates)"
        )
    chosen = [float(b_min)]
    if n == 1:
        return chosen

    distances = _distances(max_distance, step)
    peaks, valleys = [], []
    for base in [float(b_min), *candidates]:
        wave = _waveform_from_thetas(_kept_thetas(base, head_dim, min_wavelength), distances,
                                     head_dim)
        p_idx, v_idx = peaks_and_valleys(wave)
        peaks.append(distances[p_idx])
        valleys.append(distances[v_idx])

    set_peaks, set_valleys = peaks[0], valleys[0]
    if len(set_peaks) == 0 or len(set_valleys) == 0:
        # Algorithm 1 picks the bases that fill the gaps between b_min's peaks and valleys; without them every
        # distance is empty and the "search" returns arbitrary neighbours of b_min
        raise ValueError(f"the attention waveform of b_min = {b_min:g} has no peak or valley within {max_distance} "
                         "tokens, so the search has nothing to complement")
    p_pad, p_mask = _pad(peaks[1:])
    v_pad, v_mask = _pad(valleys[1:])
    available = np.ones(len(candidates), dtype=bool)
    while len(chosen) < n:
        d = _distances_padded(p_pad, p_mask, v_pad, v_mask, set_peaks, set_valleys, pairing)
        d[~available] = np.inf
        j = int(np.argmin(d))  # first minimum → smallest base on ties
        available[j] = False
        chosen.append(candidates[j])
        set_peaks = np.union1d(set_peaks, peaks[j + 1])
        set_valleys = np.union1d(set_valleys, valleys[j + 1])
    return chosen


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def _check_count(n: int, name: str) -> int:
    if isinstance(n, bool) or int(n) != n or int(n) < 1:
        raise ValueError(f"{name} must be a positive integer, got {n!r}")
    return int(n)


def _check_range(b_min: float, b_max: float) -> tuple[float, float]:
    b_min, b_max = float(b_min), float(b_max)
    if not (math.isfinite(b_min) and math.isfinite(b_max)):
        raise ValueError("b_min and b_max must be finite")
    if b_min <= 1.0:
        raise ValueError(f"b_min must be > 1 (a RoPE base), got {b_min!r}")
    if b_max < b_min:
        raise ValueError(f"b_max ({b_max!r}) must be >= b_min ({b_min!r})")
    return b_min, b_max


def _kept_thetas(base: float, head_dim: int, min_wavelength: float | None) -> np.ndarray:
    if isinstance(head_dim, bool) or int(head_dim) != head_dim or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even integer, got {head_dim!r}")
    if not math.isfinite(base) or base <= 1.0:
        raise ValueError(f"base must be > 1, got {base!r}")
    head_dim = int(head_dim)
    thetas = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if min_wavelength:
        thetas = thetas[2.0 * np.pi / thetas >= float(min_wavelength)]
    return thetas


def _distances(max_distance: int, step: int) -> np.ndarray:
    if isinstance(step, bool) or int(step) != step or step < 1:
        raise ValueError(f"step must be a positive integer, got {step!r}")
    if isinstance(max_distance, bool) or int(max_distance) != max_distance or max_distance < 0:
        raise ValueError(f"max_distance must be a non-negative integer, got {max_distance!r}")
    return np.arange(0, int(max_distance) + 1, int(step), dtype=np.float64)


def _waveform_from_thetas(thetas: np.ndarray, distances: np.ndarray, head_dim: int) -> np.ndarray:
    """``(2/d)·Σ_θ cos(Δ·θ)`` on an arithmetic grid ``Δ_k = k·step``, evaluated as one matmul.

    Writing ``k = a·B + c`` with ``B ≈ √K``, the angle-addition formula gives
    ``cos(θ·step·k) = cos(θ·step·aB)·cos(θ·step·c) − sin(θ·step·aB)·sin(θ·step·c)``, so the sum over
    θ is a real ``(A × 2n_θ) @ (2n_θ × B)`` product: exact up to rounding, and it needs only
    ``O(√K·n_θ)`` trigonometric calls instead of ``K·n_θ``.
    """
    count = distances.size
    if count == 0 or thetas.size == 0:
        return np.zeros(count, dtype=np.float64)
    step = float(distances[1] - distances[0]) if count > 1 else 1.0
    block = math.isqrt(count - 1) + 1
    rows = -(-count // block)
    coarse = np.outer(np.arange(rows, dtype=np.float64) * (block * step), thetas)  # (A, n_θ)
    fine = np.outer(thetas, np.arange(block, dtype=np.float64) * step)  # (n_θ, B)
    left = np.concatenate([np.cos(coarse), -np.sin(coarse)], axis=1)
    right = np.concatenate([np.cos(fine), np.sin(fine)], axis=0)
    out = (left @ right).reshape(-1)[:count]
    return out * (2.0 / head_dim)


def _pad(rows: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Stack ragged ascending rows into a (rows, width) array; mask marks real entries."""
    width = max((len(r) for r in rows), default=0)
    width = max(width, 1)
    padded = np.zeros((len(rows), width), dtype=np.float64)
    mask = np.zeros((len(rows), width), dtype=bool)
    for k, r in enumerate(rows):
        r = np.asarray(r, dtype=np.float64)
        padded[k, : r.size] = r
        mask[k, : r.size] = True
    return padded, mask


def _nearest_gap(x: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|x − nearest element of ascending ``ref``| element-wise (``ref`` non-empty)."""
    idx = np.searchsorted(ref, x)
    lo = ref[np.clip(idx - 1, 0, ref.size - 1)]
    hi = ref[np.clip(idx, 0, ref.size - 1)]
    return np.minimum(np.abs(x - lo), np.abs(x - hi))


def _one_side(pad: np.ndarray, mask: np.ndarray, ref: np.ndarray, pairing: str) -> np.ndarray:
    if ref.size == 0:
        return np.zeros(pad.shape[0], dtype=np.float64)
    if pairing == "nearest":
        gaps = _nearest_gap(pad, ref)
        return np.where(mask, gaps, 0.0).sum(axis=1)
    # "index": element-wise over the sorted lists, truncated to the shorter one.
    width = min(pad.shape[1], ref.size)
    gaps = np.abs(pad[:, :width] - ref[None, :width])
    return np.where(mask[:, :width], gaps, 0.0).sum(axis=1)


def _distances_padded(p_pad, p_mask, v_pad, v_mask, set_peaks, set_valleys, pairing) -> np.ndarray:
    if pairing not in ("nearest", "index"):
        raise ValueError(f"pairing must be 'nearest' or 'index', got {pairing!r}")
    return _one_side(p_pad, p_mask, set_valleys, pairing) + _one_side(v_pad, v_mask, set_peaks,
                                                                        pairing)
