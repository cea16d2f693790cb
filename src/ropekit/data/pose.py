"""Position ids that simulate a long context inside a short training window: PoSE and RandPos.

**PoSE** (Zhu et al., *PoSE: Efficient Context Window Extension of LLMs via Positional Skip-wise
Training*, ICLR 2024, §3.2). A training window of ``L_c`` tokens is divided into ``N`` chunks
``c_0 … c_{N-1}`` of lengths ``l_i`` (Σ l_i = L_c) with starts ``st_i = Σ_{j<i} l_j`` (Eq. 3); each chunk
gets a skipping bias ``u_i ~ U({u_{i-1}, …, L_t − L_c})`` with ``u_0 = 0`` and its position ids become
``{u_i + st_i, …, u_i + st_i + l_i − 1}`` (Eq. 4). Positions are therefore continuous inside a chunk,
strictly increasing across chunks, and below the target length ``L_t``. Lengths and biases are drawn
afresh for every training example. The text of chunk ``i`` is ``x[v_i + st_i : v_i + st_i + l_i]``
(Eq. 5) where the content offset ``v_i`` is, as in Appendix A / Table 4:

* ``"uniform"`` — ``v_0 = 0``, ``v_i ~ U({v_{i-1}, …, L_x − L_c})`` (the paper's default);
* ``"zero"`` — ``v_i = 0``: the chunks hold one contiguous span of text;
* ``"aligned"`` — ``v_i = u_i``: every token's position id equals its true offset in the document.
  Where the document is shorter than ``u_i + L_c`` this is impossible; ``v_i = min(u_i, L_x − L_c)`` is
  used instead (still non-decreasing, so the chunks never overlap), and documents of at least ``L_t``
  tokens are always exactly aligned.

Chunk lengths are drawn as in the paper's coverage code (Fig. 6): ``l_0 ~ U{1, …, L_c − N + 1}``, then
each next length uniform over what leaves every later chunk at least one token, the last chunk taking
the remainder; for ``N = 2`` that is ``l_0 ~ U{1, …, L_c − 1}``. (The released ``train_pose.py`` draws
the first chunk's length from ``{1, …, ⌈L_c/2⌉}`` instead, samples once per example with an unseeded
``random`` and fixes it for all epochs; here everything is a function of ``(seed, epoch, index)``. It also
truncates each document to five model windows before drawing, so its ``L_x`` and with it the content offsets
``v_i`` stay below that; here ``L_x`` is the whole document, as Eq. 5 reads, and with ``documents: whole`` a
long document's chunks may lie far apart in the text while their positions lie at most ``L_t`` apart.)

**RandPos** (Ruoss et al., ACL 2023; the PoSE paper's baseline, §4.1): ``L_c`` distinct positions drawn
uniformly from ``{0, …, L_t − 1}`` and sorted.

**The attention-mask trap.** transformers 5.x infers *packed sequences* from position ids whenever no
attention mask is passed during training (``masking_utils.find_packed_sequence_indices``): every jump
≠ 1 starts a new "sequence", so PoSE's later chunks would silently not see the earlier ones. Whoever
runs a model on these position ids must pass an explicit attention mask — :func:`attention_mask_for`
gives the 2-D all-ones mask, which keeps ordinary causal attention over the whole window.

**Coverage** (paper Appendix B, Fig. 5/6): the probability that a relative distance ``d`` occurs between
some pair of tokens of one training example. :func:`coverage` estimates it by sampling the very
sampler used for training; :func:`exact_coverage` computes it exactly (closed form for 2 PoSE chunks,
full enumeration of the sampler's distribution for more chunks at small sizes, an inclusion–exclusion
count of independent sets for RandPos). :func:`pose_coverage_report` gathers both and
:func:`plot_coverage` draws Fig. 5.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from ..core.schema import MAX_POSITIONS
from ..errors import RopekitError
from ..runtime.atomic import check_figure_target, save_figure

#: Content-offset modes of PoSE (paper Appendix A).
OFFSET_MODES = ("uniform", "zero", "aligned")
#: Content-offset modes of RandPos (its text is one contiguous span).
RANDPOS_OFFSET_MODES = ("uniform", "zero")
#: Whoever feeds these position ids to a transformers model must pass an explicit attention mask.
NEEDS_EXPLICIT_ATTENTION_MASK = True
#: Largest amount of work (configurations × distances) :func:`exact_coverage` will enumerate.
MAX_EXACT_WORK = 200_000_000


# ---- seeding -----------------------------------------------------------------------------------------
def item_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A CPU generator that depends only on ``(seed, epoch, index)``: resampling per item, exact on resume."""
    digest = hashlib.blake2b(f"ropekit-pose:{int(seed)}:{int(epoch)}:{int(index)}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "big") & ((1 << 63) - 1))


def _randint(generator: torch.Generator, low: int, high: int) -> int:
    """A uniform integer in ``[low, high]`` (both inclusive)."""
    if high <= low:
        return int(low)
    return int(torch.randint(low, high + 1, (1,), generator=generator).item())


# ---- validation --------------------------------------------------------------------------------------
def _check_lengths(train_length: int, target_length: int, n_chunks: int | None = None) -> None:
    for name, value in (("train length", train_length), ("target length", target_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RopekitError(f"the {name} {value!r} is not a positive integer", f"pass the {name} in tokens, e.g. 256")
    if target_length > MAX_POSITIONS:
        raise RopekitError(f"target length {target_length:,} is past {MAX_POSITIONS:,} tokens, the most positions a "
                           "float32 rotary angle tells apart", "pass a target length up to 16M tokens")
    if target_length < train_length:
        raise RopekitError(f"target length {target_length} is below the training length {train_length}",
                           "set the target length (the context to simulate) to at least the training length")
    if n_chunks is not None:
        if isinstance(n_chunks, bool) or not isinstance(n_chunks, int) or n_chunks < 1:
            raise RopekitError(f"chunk count {n_chunks!r} is not a positive integer", "use 2 chunks, as the PoSE paper")
        if n_chunks > train_length:
            raise RopekitError(f"{n_chunks} chunks do not fit in {train_length} tokens",
                               "use at most as many chunks as training tokens (the paper uses 2)")


# ---- PoSE sampling -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PoseSample:
    """One PoSE training example's layout.

    ``position_ids[k]`` is the position of the k-th token of the window and ``content_index[k]`` the
    index in the source document of the token placed there. ``chunk_lengths`` are ``l_i``, ``skips``
    ``u_i`` and ``content_offsets`` ``v_i`` (paper Eq. 3–5).
    """

    position_ids: torch.Tensor
    content_index: torch.Tensor
    chunk_lengths: tuple[int, ...]
    skips: tuple[int, ...]
    content_offsets: tuple[int, ...]

    @property
    def chunk_starts(self) -> tuple[int, ...]:
        """``st_i``: where each chunk starts inside the window."""
        starts, total = [], 0
        for length in self.chunk_lengths:
            starts.append(total)
            total += length
        return tuple(starts)


def sample_chunk_lengths(train_length: int, n_chunks: int, generator: torch.Generator) -> list[int]:
    """``l_0 … l_{N-1}``, each ≥ 1, summing to ``train_length`` (the paper's Fig. 6 scheme, see module doc)."""
    lengths, left = [], train_length
    for i in range(n_chunks - 1):
        later = n_chunks - 1 - i  # chunks still to come, one token each at least
        length = _randint(generator, 1, left - later)
        lengths.append(length)
        left -= length
    lengths.append(left)
    return lengths


def sample_skips(train_length: int, target_length: int, n_chunks: int, generator: torch.Generator) -> list[int]:
    """``u_0 = 0`` and ``u_i ~ U({u_{i-1}, …, L_t − L_c})`` (paper §3.2)."""
    top = target_length - train_length
    skips = [0]
    for _ in range(1, n_chunks):
        skips.append(_randint(generator, skips[-1], top))
    return skips


def sample_content_offsets(doc_length: int, train_length: int, skips: list[int], mode: str,
                           generator: torch.Generator) -> list[int]:
    """``v_0 … v_{N-1}`` for a document of ``doc_length`` tokens (paper Eq. 5 and Appendix A)."""
    top = doc_length - train_length
    if mode == "zero":
        return [0] * len(skips)
    if mode == "aligned":
        return [min(u, top) for u in skips]
    offsets = [0]
    for _ in range(1, len(skips)):
        offsets.append(_randint(generator, offsets[-1], top))
    return offsets


def pose_sample(train_length: int, target_length: int, *, n_chunks: int = 2, doc_length: int | None = None,
                offset: str = "uniform", generator: torch.Generator) -> PoseSample:
    """Draw one PoSE example: chunk lengths, then skips, then content offsets, all from ``generator``.

    ``doc_length`` is the length of the document the text comes from (at least ``train_length``);
    ``None`` means the text is simply the first ``train_length`` tokens (content offsets 0).
    """
    _check_lengths(train_length, target_length, n_chunks)
    if offset not in OFFSET_MODES:
        raise RopekitError(f"unknown PoSE content offset '{offset}'", f"choose one of {', '.join(OFFSET_MODES)}")
    if doc_length is not None and doc_length < train_length:
        raise RopekitError(f"a document of {doc_length} tokens is shorter than the training length {train_length}",
                           "PoSE takes every example from one document of at least the training length")
    lengths = sample_chunk_lengths(train_length, n_chunks, generator)
    skips = sample_skips(train_length, target_length, n_chunks, generator)
    offsets = ([0] * n_chunks if doc_length is None
               else sample_content_offsets(doc_length, train_length, skips, offset, generator))
    position_ids = torch.empty(train_length, dtype=torch.long)
    content_index = torch.empty(train_length, dtype=torch.long)
    start = 0
    for length, u, v in zip(lengths, skips, offsets):
        span = torch.arange(start, start + length, dtype=torch.long)
        position_ids[start:start + length] = span + u
        content_index[start:start + length] = span + v
        start += length
    return PoseSample(position_ids, content_index, tuple(lengths), tuple(skips), tuple(offsets))


# ---- RandPos -----------------------------------------------------------------------------------------
def randpos_positions(train_length: int, target_length: int, generator: torch.Generator) -> torch.Tensor:
    """``train_length`` distinct positions uniform from ``{0, …, target_length − 1}``, ascending (Ruoss et al.)."""
    _check_lengths(train_length, target_length)
    chosen = torch.randperm(target_length, generator=generator)[:train_length]
    return torch.sort(chosen).values.to(torch.long)


def randpos_content_start(doc_length: int, train_length: int, offset: str, generator: torch.Generator) -> int:
    """Where RandPos's contiguous text starts in a document: 0, or uniform over every full window."""
    if offset not in RANDPOS_OFFSET_MODES:
        raise RopekitError(f"unknown RandPos content offset '{offset}'", f"choose one of {', '.join(RANDPOS_OFFSET_MODES)}")
    if doc_length < train_length:
        raise RopekitError(f"a document of {doc_length} tokens is shorter than the training length {train_length}",
                           "RandPos takes every example from one document of at least the training length")
    return 0 if offset == "zero" else _randint(generator, 0, doc_length - train_length)


def attention_mask_for(length: int) -> torch.Tensor:
    """The explicit 2-D attention mask (all ones, ``[length]``) to pass with PoSE/RandPos position ids."""
    return torch.ones(length, dtype=torch.long)


# ---- coverage ----------------------------------------------------------------------------------------
def covered_intervals(chunk_lengths, skips) -> list[tuple[int, int]]:
    """Relative distances present in one PoSE example, as merged inclusive intervals ``(lo, hi)``.

    Inside chunk ``i`` the distances are ``0 … l_i − 1``; between chunks ``i < j`` (both contiguous runs of
    positions) every integer from ``a_j − b_i`` to ``b_j − a_i`` occurs, where ``a``/``b`` are a chunk's first
    and last position.
    """
    firsts, lasts, start = [], [], 0
    for length, u in zip(chunk_lengths, skips):
        firsts.append(u + start)
        lasts.append(u + start + length - 1)
        start += length
    spans = [(0, max(chunk_lengths) - 1)]
    for j in range(len(firsts)):
        for i in range(j):
            spans.append((firsts[j] - lasts[i], lasts[j] - firsts[i]))
    spans.sort()
    merged = [list(spans[0])]
    for lo, hi in spans[1:]:
        if lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def _randpos_distances(positions: np.ndarray, target_length: int) -> np.ndarray:
    """Boolean ``[target_length]``: which differences occur among ``positions`` (autocorrelation by FFT)."""
    size = 1 << (2 * target_length - 1).bit_length()
    indicator = np.zeros(size)
    indicator[positions] = 1.0
    spectrum = np.fft.rfft(indicator)
    counts = np.fft.irfft(spectrum * np.conj(spectrum), n=size)[:target_length]
    return counts > 0.5  # integer pair counts; float error is far below 0.5


def _check_method(method: str) -> str:
    if method not in ("pose", "randpos", "original"):
        raise RopekitError(f"unknown coverage method '{method}'", "choose pose, randpos or original")
    return method


def coverage(train_length: int, target_length: int, n_chunks: int = 2, steps: int = 10_000, seed: int = 0,
             method: str = "pose") -> np.ndarray:
    """Empirical probability that each relative distance ``d ∈ [0, L_t)`` occurs in one training example.

    Draws ``steps`` examples with the training sampler (:func:`pose_sample` / :func:`randpos_positions`,
    example ``k`` from :func:`item_generator` ``(seed, 0, k)``, exactly as the dataset's item ``k`` of epoch 0)
    and counts, per distance, the examples in which some pair of tokens is that far apart (paper Fig. 6).
    ``method="original"`` is the unextended model: distances below ``L_c`` always, none beyond.
    """
    _check_lengths(train_length, target_length, n_chunks if method == "pose" else None)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise RopekitError(f"steps {steps!r} is not a positive integer", "pass the number of sampled examples, e.g. 10000")
    if _check_method(method) == "original":
        return (np.arange(target_length) < train_length).astype(float)
    hits = np.zeros(target_length + 1, dtype=np.int64)
    for k in range(steps):
        g = item_generator(seed, 0, k)
        if method == "pose":
            lengths = sample_chunk_lengths(train_length, n_chunks, g)
            skips = sample_skips(train_length, target_length, n_chunks, g)
            for lo, hi in covered_intervals(lengths, skips):
                hits[lo] += 1
                hits[hi + 1] -= 1
        else:
            seen = _randpos_distances(randpos_positions(train_length, target_length, g).numpy(), target_length)
            hits[:target_length] += seen
    if method == "pose":
        return np.cumsum(hits)[:target_length] / steps
    return hits[:target_length] / steps


def _pose2_exact(train_length: int, target_length: int) -> np.ndarray:
    """Closed form for 2 chunks: ``P = P_in + P_x − P_in·P_x``.

    The example covers ``[0, max(l_0, l_1) − 1]`` (inside the longer chunk) and ``[u + 1, u + L_c − 1]``
    (across the chunks, independent of ``l_0``); ``l_0 ~ U{1..L_c−1}`` and ``u ~ U{0..L_t−L_c}`` are
    independent, so the two events are too.
    """
    lc, lt = train_length, target_length
    d = np.arange(lt)
    if lc == 1:
        return (d == 0).astype(float)
    l0 = np.arange(1, lc)
    longest = np.maximum(l0, lc - l0)
    # P_in(d) = P(max(l0, l1) > d)
    p_in = (longest[None, :] > d[:, None]).mean(axis=1)
    n_u = lt - lc + 1
    lo = np.maximum(d - lc + 1, 0)
    hi = np.minimum(d - 1, lt - lc)
    p_x = np.clip(hi - lo + 1, 0, None) / n_u
    return p_in + p_x - p_in * p_x


def _length_configurations(train_length: int, n_chunks: int):
    """Every chunk-length vector the sampler can draw, with its probability."""
    def walk(prefix, left, prob):
        i = len(prefix)
        if i == n_chunks - 1:
            yield prefix + [left], prob
            return
        top = left - (n_chunks - 1 - i)
        for length in range(1, top + 1):
            yield from walk(prefix + [length], left - length, prob / top)
    yield from walk([], train_length, 1.0)


def _skip_configurations(train_length: int, target_length: int, n_chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """Every skip vector ``(u_0 … u_{N-1})`` the sampler can draw, ``[M, N]``, with probabilities ``[M]``."""
    top = target_length - train_length
    rows, probs = [[0]], [1.0]
    for _ in range(1, n_chunks):
        new_rows, new_probs = [], []
        for row, prob in zip(rows, probs):
            choices = top - row[-1] + 1
            for u in range(row[-1], top + 1):
                new_rows.append(row + [u])
                new_probs.append(prob / choices)
        rows, probs = new_rows, new_probs
    return np.array(rows, dtype=np.int64), np.array(probs)


def _count_length_configurations(train_length: int, n_chunks: int) -> int:
    # the sequential scheme reaches every composition of L_c into N positive parts exactly once
    return math.comb(train_length - 1, n_chunks - 1)


def _pose_enumerated(train_length: int, target_length: int, n_chunks: int) -> np.ndarray:
    """Exact coverage by summing over every (lengths, skips) configuration of the sampler."""
    skips, skip_probs = _skip_configurations(train_length, target_length, n_chunks)
    d = np.arange(target_length)
    result = np.zeros(target_length)
    for lengths, prob in _length_configurations(train_length, n_chunks):
        starts = np.cumsum([0] + lengths[:-1])
        firsts = skips + starts[None, :]
        lasts = firsts + np.array(lengths)[None, :] - 1
        covered = np.broadcast_to(d < max(lengths), (len(skips), target_length)).copy()
        for j in range(n_chunks):
            for i in range(j):
                lo = (firsts[:, j] - lasts[:, i])[:, None]
                hi = (lasts[:, j] - firsts[:, i])[:, None]
                covered |= (d[None, :] >= lo) & (d[None, :] <= hi)
        result += prob * (skip_probs @ covered)
    return result


def _poly_mul(a: list[int], b: list[int], degree: int) -> list[int]:
    out = [0] * min(len(a) + len(b) - 1, degree + 1)
    for i, x in enumerate(a):
        if x == 0 or i > degree:
            continue
        for j, y in enumerate(b[: degree + 1 - i]):
            out[i + j] += x * y
    return out


def _poly_pow(a: list[int], exponent: int, degree: int) -> list[int]:
    result, base = [1], a
    while exponent:
        if exponent & 1:
            result = _poly_mul(result, base, degree)
        exponent >>= 1
        if exponent:
            base = _poly_mul(base, base, degree)
    return result


def _randpos_exact(train_length: int, target_length: int) -> np.ndarray:
    """Exact RandPos coverage: ``P(d) = 1 − #{L_c-subsets with no two elements d apart} / C(L_t, L_c)``.

    For a fixed ``d`` the positions ``{0 … L_t−1}`` split into ``d`` residue classes mod ``d``, each a chain
    in which "d apart" means "adjacent"; choosing ``j`` pairwise non-adjacent elements of a chain of ``m``
    can be done in ``C(m − j + 1, j)`` ways, so the count is the ``x^{L_c}`` coefficient of the product of
    the chains' generating polynomials (two chain lengths occur: ``⌊L_t/d⌋`` and ``⌊L_t/d⌋ + 1``).
    """
    lc, lt = train_length, target_length
    total = math.comb(lt, lc)
    out = np.ones(lt)
    for d in range(1, lt):
        q, r = divmod(lt, d)

        def chain(m):
            return [math.comb(m - j + 1, j) for j in range(min(lc, (m + 1) // 2) + 1)]

        poly = _poly_mul(_poly_pow(chain(q + 1), r, lc), _poly_pow(chain(q), d - r, lc), lc)
        avoid = poly[lc] if len(poly) > lc else 0
        out[d] = float(1 - Fraction(avoid, total))
    return out


def exact_work(train_length: int, target_length: int, n_chunks: int = 2, method: str = "pose") -> int:
    """How much work :func:`exact_coverage` would take (compared with :data:`MAX_EXACT_WORK`); 0 = closed form."""
    if method == "pose":
        if n_chunks <= 2:
            return 0
        skips = math.comb(target_length - train_length + n_chunks - 1, n_chunks - 1)
        pairs = n_chunks * (n_chunks - 1) // 2
        return _count_length_configurations(train_length, n_chunks) * skips * target_length * pairs
    if method == "randpos":
        return target_length * train_length * train_length * max(1, target_length.bit_length())
    return 0


def exact_coverage(train_length: int, target_length: int, n_chunks: int = 2, method: str = "pose") -> np.ndarray:
    """Exact probability that each distance ``d ∈ [0, L_t)`` is covered by one example (see module doc).

    PoSE with ≤ 2 chunks and ``"original"`` are closed forms for any size; PoSE with more chunks and
    RandPos are exact sums whose cost grows quickly (:func:`exact_work`): beyond :data:`MAX_EXACT_WORK`
    this raises :class:`RopekitError` — use :func:`coverage` (sampling) there.
    """
    _check_lengths(train_length, target_length, n_chunks if method == "pose" else None)
    if _check_method(method) == "original":
        return (np.arange(target_length) < train_length).astype(float)
    work = exact_work(train_length, target_length, n_chunks, method)
    if work > MAX_EXACT_WORK:
        raise RopekitError(
            f"exact {method} coverage for {train_length}→{target_length} tokens is too large to enumerate (~{work:.1e} operations)",
            "use the sampled coverage (steps=N) at this size")
    if method == "randpos":
        return _randpos_exact(train_length, target_length)
    if n_chunks == 1:
        return (np.arange(target_length) < train_length).astype(float)
    if n_chunks == 2:
        return _pose2_exact(train_length, target_length)
    return _pose_enumerated(train_length, target_length, n_chunks)


# ---- report and plot ---------------------------------------------------------------------------------
def _curve_summary(train_length: int, values: np.ndarray) -> dict:
    beyond = values[train_length:]
    inside = values[1:train_length]
    return {
        "mean_within_train": float(inside.mean()) if inside.size else None,
        "mean_beyond_train": float(beyond.mean()) if beyond.size else None,
        "min_beyond_train": float(beyond.min()) if beyond.size else None,
        "never_covered": int((values[1:] == 0).sum()),
    }


def pose_coverage_report(train_length: int, target_length: int, chunks=2, steps: int = 10_000, seed: int = 0,
                         randpos: bool = True, exact: bool | str = "auto", pose: bool = True) -> dict:
    """Coverage of every relative distance for the unextended window, PoSE with each chunk count, RandPos.

    ``chunks`` is a chunk count or a list of them (the paper's Fig. 5 shows 2 and 3); ``pose=False`` leaves
    the PoSE curves out (``chunks`` is then ignored), ``randpos=False`` the RandPos one. Each curve has the
    sampled estimate (``steps`` examples; RandPos too unless ``randpos=False``) and, where feasible, the
    exact probability (``exact="auto"``: when within :data:`MAX_EXACT_WORK`; ``True``: always, raising if
    too large; ``False``: never). Returns a JSON-friendly dict::

        {"train_length", "target_length", "steps", "seed",
         "curves": [{"name", "method", "chunks", "empirical": [..L_t], "exact": [..L_t] | None,
                     "max_abs_error": float | None, "summary": {...}}, ...]}

    where ``summary`` holds the mean coverage inside/beyond the training length, the smallest coverage
    beyond it and how many distances in ``[1, L_t)`` were never covered (by the exact curve if present).
    """
    chunk_list = ([chunks] if isinstance(chunks, int) else list(chunks)) if pose else []
    if pose and not chunk_list:
        raise RopekitError("no chunk count given", "pass chunks=2 (or a list such as [2, 3])")
    _check_lengths(train_length, target_length)
    for n in chunk_list:
        _check_lengths(train_length, target_length, n)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise RopekitError(f"steps {steps!r} is not a positive integer", "pass the number of sampled examples, e.g. 10000")
    if exact not in (True, False, "auto"):
        raise RopekitError(f"exact={exact!r} is not true, false or 'auto'", "pass exact='auto'")
    specs = [("original", None)] + [("pose", n) for n in chunk_list] + ([("randpos", None)] if randpos else [])
    if exact is True:  # refuse an infeasible exact curve before spending time on the sampled ones
        for method, n in specs[1:]:
            if exact_work(train_length, target_length, n or 2, method) > MAX_EXACT_WORK:
                exact_coverage(train_length, target_length, n or 2, method=method)
    curves = []
    for method, n in specs:
        name = {"original": "original window", "randpos": "RandPos"}.get(method, f"PoSE ({n} chunks)")
        exact_values = None
        if method == "original":
            exact_values = exact_coverage(train_length, target_length, method="original")
            empirical = exact_values
        else:
            empirical = coverage(train_length, target_length, n or 2, steps, seed, method=method)
            feasible = exact_work(train_length, target_length, n or 2, method) <= MAX_EXACT_WORK
            if exact is True or (exact == "auto" and feasible):
                exact_values = exact_coverage(train_length, target_length, n or 2, method=method)
        reference = exact_values if exact_values is not None else empirical
        curves.append({
            "name": name,
            "method": method,
            "chunks": n,
            "empirical": [float(x) for x in empirical],
            "exact": None if exact_values is None else [float(x) for x in exact_values],
            "max_abs_error": None if exact_values is None or method == "original"
            else float(np.abs(np.asarray(empirical) - exact_values).max()),
            "summary": _curve_summary(train_length, np.asarray(reference)),
        })
    return {"train_length": train_length, "target_length": target_length, "steps": steps, "seed": seed,
            "curves": curves}


def plot_coverage(report: dict, path: str | Path, title: str | None = None) -> str:
    """Draw a :func:`pose_coverage_report` as the paper's Fig. 5 (coverage probability vs relative
    distance; exact curves solid, sampled ones dotted where no exact curve exists) into a PNG at ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = check_figure_target(path, what="plot path")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(8, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    distances = np.arange(report["target_length"])
    for curve in report["curves"]:
        if curve["exact"] is not None:
            ax.plot(distances, curve["exact"], label=curve["name"], linewidth=1.4)
        else:
            ax.plot(distances, curve["empirical"], label=f"{curve['name']} (sampled)", linewidth=1.0, linestyle=":")
    ax.axvline(report["train_length"], color="grey", linestyle="--", linewidth=0.8,
               label=f"training length ({report['train_length']})")
    ax.set_xlim(0, report["target_length"])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("relative position")
    ax.set_ylabel("probability of coverage")
    ax.set_title(title or f"Coverage of relative positions per example, {report['train_length']} → "
                          f"{report['target_length']} ({report['steps']} sampled examples)")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    return str(path)
