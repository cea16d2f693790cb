"""LongRoPE's evolutionary search over per-pair rescale factors, as pure functions of a seeded RNG.

LongRoPE (Ding et al. 2024, arXiv 2402.13753, §3.2 and Algorithm 1) searches the vector λ of rotary rescale
factors — pair ``i`` rotates at ``θ_i/λ_i`` — under the constraints of its Eq. 4–5, ``λ_i ≥ 1`` and
``λ_i ≤ λ_{i+1}`` (lower frequencies are interpolated at least as much), in the search space of its Table 1:
``λ_i`` from 1.0 to ``1.25·s`` on a 0.01 grid (:data:`PAPER_CEILING`; microsoft/LongRoPE's ``dim_mono`` search
reaches ``1 + s``, the same bound at s = 4). Factors above ``s`` are real choices: Phi-3.5-mini's shipped
``long_factor`` (s = 32) ends above 50. Optionally the pairs below a critical pair are kept at 1 (LongRoPE2's
"critical dimension"; the reference code's ``dim_piece_mono``).

* **Initial population** (Algorithm 1, line 1): the three closed forms — PI ``λ_i = s``, NTK-aware
  ``λ_i = s^(2i/(d−2))`` (the base ``b·s^(d/(d−2))`` written per pair) and YaRN's NTK-by-parts
  ``λ_i = 1/((1 − γ_i)/s + γ_i)`` — then mutations of them until the population is full.
* **Each iteration** (lines 3–9): the best ``parents`` candidates evaluated so far breed ``mutations``
  children (each factor moves with probability ``p`` by ``±k·(s − 1)/32``, ``k`` uniform in 1…8) and ``crossovers``
  children (each factor from one of two random parents). A child that breaks monotonicity is repaired by a
  running maximum, every value is rounded to the search grid (0.01) and clipped to ``[1, ceiling]`` (``1.25·s``
  unless a search sets its own), and a child already evaluated is drawn again: nothing is evaluated twice.

* **Start tokens** (§3.2, ``I(λ_i, n̂)``): the number ``n̂`` of first positions kept un-interpolated is searched
  jointly when a candidate set is given (``starts``; the paper's is :data:`PAPER_START_TOKENS`): it is then the
  candidate's last gene, mutated (with the same probability, to another value of the set) and crossed over like a
  factor. The closed-form seeds start at the smallest ``n̂`` of the set. Without ``starts`` a candidate is the
  factors alone and the random stream is the one of a search without start tokens.

The functions here only propose candidates (and compute the closed-form seeds of a model, :func:`seed_factors`);
evaluating them (perplexity at the target length, which needs a model and data) and keeping them across crashes is
:mod:`ropekit.search.longrope`'s job. HARPE's search is :mod:`ropekit.methods.harpe_search` by the same pattern: a
method's search algorithm is ``methods/<method>_search.py``, beside its unit.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from ..core.base_rope import base_frequencies
from ..core.rope_info import RopeInfo
from .base import registered

#: The search grid of the factors (LongRoPE Table 1's step).
STEP = 0.01
#: The largest factor the search tries, as a multiple of the extension ratio s (LongRoPE Table 1: "1.0 to s×1.25").
PAPER_CEILING = 1.25
#: The start-token counts n̂ LongRoPE's search chooses from (Ding et al. 2024, §3.2).
PAPER_START_TOKENS = (0, 1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 64, 128, 256)
#: The factors λ_0 … λ_{d/2−1}, followed by n̂ (as a float) when the start tokens are searched.
Candidate = tuple[float, ...]


def split(c: Candidate, starts: Sequence[int] | None) -> tuple[Candidate, int | None]:
    """``(factors, n̂)`` of a candidate (``n̂`` ``None`` when the start tokens are not part of it)."""
    return (c[:-1], int(c[-1])) if starts else (c, None)


def ceiling_of(factor: float, ceiling: float | None = None) -> float:
    """The largest factor a search tries: ``ceiling`` when given, else LongRoPE's ``1.25·s``."""
    return PAPER_CEILING * factor if ceiling is None else float(ceiling)


def snap(values: Sequence[float], factor: float, fixed_pairs: int = 0, starts: Sequence[int] | None = None,
         ceiling: float | None = None) -> Candidate:
    """A valid candidate near ``values``: on the 0.01 grid, in ``[1, ceiling]`` (default ``1.25·s``),
    non-decreasing, the first ``fixed_pairs`` at 1 (and, with ``starts``, the last value the nearest start-token
    count of the set)."""
    if starts:
        n_hat = min(starts, key=lambda n: (abs(n - float(values[-1])), n))
        return snap(values[:-1], factor, fixed_pairs, ceiling=ceiling) + (float(n_hat),)
    top = math.floor(ceiling_of(factor, ceiling) / STEP + 1e-9) * STEP  # the largest grid value inside the space
    out, running = [], 1.0
    for i, value in enumerate(values):
        v = 1.0 if i < fixed_pairs else min(max(round(float(value) / STEP) * STEP, 1.0), top)
        running = max(running, round(v, 2))  # monotone repair: a pair never interpolates less than the one before
        out.append(running)
    return tuple(out)


def closed_forms(pairs: int, factor: float, yarn_gamma: Sequence[float] | None = None) -> dict[str, list[float]]:
    """PI, NTK-aware and (given its keep-fractions γ) NTK-by-parts factors for ``pairs`` rotary pairs."""
    d = 2 * pairs
    forms = {
        "pi": [factor] * pairs,
        "ntk": [factor ** (2 * i / (d - 2)) if d > 2 else factor for i in range(pairs)],
    }
    if yarn_gamma is not None:
        forms["yarn"] = [1.0 / ((1.0 - g) / factor + g) for g in yarn_gamma]
    return forms


def mutate(parent: Candidate, rng: random.Random, factor: float, fixed_pairs: int, probability: float,
           starts: Sequence[int] | None = None, ceiling: float | None = None) -> Candidate:
    """Each factor moves with probability ``probability`` by ``±k·(s − 1)/32``, ``k`` uniform in 1…8; with
    ``starts``, n̂ moves with the same probability to another value of the set."""
    scale = max(factor - 1.0, STEP)
    values = list(parent)
    pairs = len(values) - (1 if starts else 0)
    for i in range(fixed_pairs, pairs):
        if rng.random() < probability:
            values[i] += rng.choice((-1, 1)) * rng.randint(1, 8) * scale / 32
    if starts and len(starts) > 1 and rng.random() < probability:
        values[-1] = float(rng.choice([n for n in starts if n != int(values[-1])]))
    return snap(values, factor, fixed_pairs, starts, ceiling)


def crossover(a: Candidate, b: Candidate, rng: random.Random, factor: float, fixed_pairs: int,
              starts: Sequence[int] | None = None, ceiling: float | None = None) -> Candidate:
    """Each factor (and n̂, when it is searched) from ``a`` or ``b`` with equal odds."""
    return snap([x if rng.random() < 0.5 else y for x, y in zip(a, b)], factor, fixed_pairs, starts, ceiling)


def fresh(make: Callable[[], Candidate], seen: set[Candidate], tries: int = 64) -> Candidate | None:
    """A candidate from ``make`` that is not in ``seen`` (``None`` when ``tries`` draws all repeat one)."""
    for _ in range(tries):
        child = make()
        if child not in seen:
            return child
    return None


def seed_candidate(values: Sequence[float], factor: float, fixed_pairs: int,
                   starts: Sequence[int] | None = None, ceiling: float | None = None) -> Candidate:
    """A closed form as a candidate (at the smallest n̂ of ``starts`` when the start tokens are searched)."""
    return snap([*values, *([min(starts)] if starts else [])], factor, fixed_pairs, starts, ceiling)


def initial_population(forms: dict[str, list[float]], size: int, rng: random.Random, factor: float,
                       fixed_pairs: int, probability: float, starts: Sequence[int] | None = None,
                       ceiling: float | None = None) -> list[Candidate]:
    """The closed forms, then their mutations up to ``size`` distinct candidates."""
    population: list[Candidate] = []
    for values in forms.values():
        c = seed_candidate(values, factor, fixed_pairs, starts, ceiling)
        if c not in population:
            population.append(c)
    seeds = list(population)
    while len(population) < size:
        child = fresh(lambda: mutate(rng.choice(seeds), rng, factor, fixed_pairs, probability, starts, ceiling),
                      set(population))
        if child is None:
            break
        population.append(child)
    return population[:size]


def next_generation(scored: dict[Candidate, float], rng: random.Random, *, parents: int, mutations: int,
                    crossovers: int, factor: float, fixed_pairs: int, probability: float,
                    starts: Sequence[int] | None = None, ceiling: float | None = None) -> list[Candidate]:
    """Children of the best ``parents`` of everything evaluated so far (lowest objective first, ties by value)."""
    best = sorted(scored, key=lambda c: (scored[c], c))[:parents]
    seen = set(scored)
    children: list[Candidate] = []
    for _ in range(mutations):
        child = fresh(lambda: mutate(rng.choice(best), rng, factor, fixed_pairs, probability, starts, ceiling), seen)
        if child is not None:
            seen.add(child)
            children.append(child)
    for _ in range(crossovers):
        if len(best) < 2:
            break
        child = fresh(lambda: crossover(*rng.sample(best, 2), rng, factor, fixed_pairs, starts, ceiling), seen)
        if child is not None:
            seen.add(child)
            children.append(child)
    return children


def seed_factors(info: RopeInfo, factor: float, target_length: int) -> dict[str, list[float]]:
    """PI, NTK and YaRN (NTK-by-parts, the dim ramp) as rescale factors ``θ^eff_i/θ'_i`` of a model with RoPE
    ``info``: the initial population's closed forms (Algorithm 1, line 1) on the model's effective frequencies."""
    base, _ = base_frequencies(info, target_length)
    by_parts_method = registered()["ntk_by_parts"]
    params = by_parts_method.resolve(info, {"factor": factor, "ramp": "dim"})
    by_parts, _ = by_parts_method.inv_freq(info, params, seq_len=target_length)
    forms = closed_forms(info.rotary_dim // 2, factor)
    forms["yarn"] = (base.double() / by_parts.double()).tolist()
    return forms
