"""Private selection: the permute-and-flip mechanism, sampled exactly on a score grid.

:func:`permute_and_flip` returns one index of a score vector (McKenna & Sheldon 2020,
"Permute-and-Flip: a new mechanism for differentially private selection"): visit the
candidates in a uniformly random order and stop at the first ``r`` whose coin
``Bernoulli(exp(−ε·(q* − q_r)/Δ))`` comes up (``q*`` the largest score, whose coin always does).
It pays for one choice, whatever the number of candidates, and its expected score is never
below the exponential mechanism's.

**Privacy, monotone scores.** Ding, Zhang, Wang, Kifer et al. (2021, "The permute-and-flip
mechanism is identical to report-noisy-max with exponential noise") show that this output has
the distribution of ``argmax_r (q_r + Z_r)`` with ``Z_r`` i.i.d. exponential of scale ``Δ/ε``.
Let neighbouring inputs be a dataset and the same with one more contributor whose scores
``q'_r = q_r + a_r`` move by ``a_r ∈ [0, Δ]`` (the *same direction* for every candidate: a
monotone score such as a sum of non-negative votes). Fix the other noises; ``r`` wins iff
``Z_r > t − q_r`` with ``t = max_{j≠r}(q_j + Z_j)``. On the neighbour ``t' ∈ [t, t + Δ]`` and
``q'_r ∈ [q_r, q_r + Δ]``, so the threshold ``t' − q'_r`` differs from ``t − q_r`` by at most
``Δ`` either way; the exponential's survival function ``S(z) = exp(−max(z, 0)·ε/Δ)`` changes
by a factor of at most ``e^ε`` under such a shift, in both directions. Integrating over the
other noises: ``P(r | D) ≤ e^ε·P(r | D')`` and back, i.e. **ε-DP** with ``exp(−ε·gap/Δ)``. (For
scores that may move in both directions, as under replace-one neighbours, the shift is up to
``2Δ`` and the same coins give 2ε.)

**Exact sampling, no floating point in the choice.** The scores arrive as integers on a grid
(multiples of a public ``γ``, the caller's rounding) and the coin's parameter
``ε·(K* − K_r)/Δ_grid`` is a rational (``ε`` a :class:`~fractions.Fraction`, ``Δ_grid`` the
sensitivity in grid steps, an integer); the order is a Fisher–Yates shuffle from
:func:`~gazeguard.privacy.mechanisms.exact.uniform_below` and each coin is
:func:`~gazeguard.privacy.mechanisms.exact.bernoulli_exp` (Canonne, Kamath & Steinke 2020). So
every output probability is exactly the ideal one given uniform random bytes: no sampler slack
to charge, and no floating-point artefact (Mironov 2012's attack on textbook Laplace) can leak
through the low bits of a noisy score, because no noisy score exists — only an index. The
rounding onto the grid is part of the score: the caller states the sensitivity of the *rounded*
scores (``Δ + γ`` and the sum's float error, see :mod:`gazeguard.runtime.cohort`), and rounding
is monotone, so rounded scores stay monotone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from gazeguard.privacy.mechanisms.exact import bernoulli_exp, uniform_below
from gazeguard.privacy.mechanisms.randomness import RandomSource

__all__ = [
    "flip_exponent",
    "lead_for",
    "permute_and_flip",
    "probabilities",
    "shuffled",
]


def shuffled(n: int, source: RandomSource) -> list[int]:
    """A uniformly random permutation of ``range(n)`` (Fisher–Yates on exact uniform draws)."""
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = uniform_below(i + 1, source)
        order[i], order[j] = order[j], order[i]
    return order


def _check(scores: Sequence[int], epsilon: Fraction, sensitivity: int) -> None:
    if not scores:
        msg = "permute_and_flip: no candidates"
        raise ValueError(msg)
    if any(isinstance(s, bool) or not isinstance(s, int) for s in scores):
        msg = "permute_and_flip: scores must be integers (grid steps)"
        raise TypeError(msg)
    if not (isinstance(epsilon, Fraction) and epsilon > 0):
        msg = f"permute_and_flip: epsilon={epsilon!r} must be a Fraction > 0"
        raise ValueError(msg)
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, int) or sensitivity < 1:
        msg = f"permute_and_flip: sensitivity={sensitivity!r} must be an integer >= 1 (steps)"
        raise ValueError(msg)


def flip_exponent(gap: int, epsilon: Fraction, sensitivity: int) -> Fraction:
    """The coin's exponent ``ε·gap/Δ`` (a rational; the coin is ``exp(−exponent)``) of a
    candidate ``gap`` grid steps below the best."""
    return epsilon * gap / sensitivity


def permute_and_flip(
    scores: Sequence[int], epsilon: Fraction, sensitivity: int, source: RandomSource
) -> int:
    """Permute-and-flip: the index of one candidate, ε-DP for scores that move monotonically
    by at most ``sensitivity`` between neighbours (module docstring).

    Args:
        scores: (C,) the candidates' scores in grid steps (integers; any sign).
        epsilon: ε of the choice, a rational > 0 (a float converts exactly:
            ``Fraction(0.75)``).
        sensitivity: how far one contributor moves any score, in grid steps (integer ≥ 1).
        source: the random bytes (:func:`~gazeguard.privacy.mechanisms.randomness.
            random_source`; the OS CSPRNG in production).

    Returns:
        The chosen index in ``range(C)``.
    """
    _check(scores, epsilon, sensitivity)
    best = max(scores)
    for r in shuffled(len(scores), source):
        if bernoulli_exp(flip_exponent(best - scores[r], epsilon, sensitivity), source):
            return r
    raise AssertionError("unreachable: the best candidate's coin is exp(0) = 1")  # pragma: no cover


def probabilities(
    scores: npt.ArrayLike, epsilon: float, sensitivity: float = 1.0
) -> npt.NDArray[np.float64]:
    """(C,) permute-and-flip's output distribution for ``scores`` (C,), in floating point (for
    tests and attack models, never for a release): with ``p_j = exp(−ε·(q* − q_j)/Δ)``, ``r``
    is chosen when it comes at position ``k`` of the random order behind ``k`` candidates that
    all failed, so ``P(r) = p_r·Σ_k e_k·k!(C−1−k)!/C!`` with ``e_k`` the elementary symmetric
    polynomials of ``(1 − p_j)`` over ``j ≠ r``."""
    q = np.asarray(scores, dtype=np.float64).reshape(-1)
    c = q.size
    p = np.exp(-epsilon * (q.max() - q) / sensitivity)
    weights = np.array(
        [math.factorial(k) * math.factorial(c - 1 - k) / math.factorial(c) for k in range(c)]
    )
    out = np.empty(c)
    for r in range(c):
        e = np.zeros(c)
        e[0] = 1.0
        for j in range(c):
            if j != r:
                e[1:] = e[1:] + e[:-1] * (1.0 - p[j])
        out[r] = p[r] * float(e @ weights)
    return out


def lead_for(probability: float, epsilon: float, classes: int, sensitivity: float = 1.0) -> float:
    """How far (score units) the best candidate must lead every other of ``classes`` for
    permute-and-flip to choose it with at least ``probability``: the worst case, all others
    at the same gap ``g``, where ``P = (1/C)·Σ_{k<C} (1 − e^{−ε·g/Δ})^k`` (increasing in
    ``g``; a larger gap for any other only raises it). ``probability`` in ``(1/C, 1)``."""
    if not 1.0 / classes < probability < 1.0:
        msg = f"lead_for: probability={probability} must lie in (1/{classes}, 1)"
        raise ValueError(msg)

    def chosen(x: float) -> float:
        fail = 1.0 - math.exp(-x)
        return sum(fail**k for k in range(classes)) / classes

    lo, hi = 0.0, 1.0
    while chosen(hi) < probability:
        hi *= 2.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if chosen(mid) < probability else (lo, mid)
    return hi * sensitivity / epsilon
