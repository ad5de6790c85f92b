"""Exact samplers on integers from random bytes: no floating point, no slack.

* :func:`uniform_below` — an integer uniform on ``[0, n)`` by rejection on whole bytes.
* :func:`bernoulli` — ``Bernoulli(p)`` for a rational ``p``.
* :func:`bernoulli_exp` — ``Bernoulli(exp(−γ))`` for a rational ``γ ≥ 0`` (Canonne, Kamath &
  Steinke 2020, "The discrete Gaussian for differential privacy", Algorithm 1).
* :func:`discrete_laplace` — ``P(z) ∝ exp(−|z|/scale)`` on the integers for a rational scale
  (ibid., Algorithm 2).

Every probability these produce is exactly the ideal one given uniform random bytes, so a
mechanism built on them charges no sampler slack (unlike the vectorised float samplers of
:mod:`gazeguard.privacy.mechanisms.discrete_laplace` and
:mod:`gazeguard.privacy.mechanisms.discrete_gaussian`, whose bounded inexactness is charged).
They cost a few dozen random bytes and big-integer operations per draw: for mechanisms that draw
rarely (the sparse vector technique of private labels draws once per check, every few seconds of
gaze).
"""

from __future__ import annotations

from fractions import Fraction

from gazeguard.privacy.mechanisms.randomness import RandomSource

__all__ = ["bernoulli", "bernoulli_exp", "discrete_laplace", "uniform_below"]


def uniform_below(n: int, source: RandomSource) -> int:
    """An integer uniform on ``[0, n)``, exactly: rejection sampling on ``⌈log2 n⌉`` random bits.

    Each try reads whole bytes from ``source``, keeps the low ``k = (n − 1).bit_length()`` bits
    and accepts a value below ``n`` (probability > 1/2), so every accepted value has probability
    exactly ``1/n`` given uniform bytes. The number of tries does not depend on anything but
    the random bits.
    """
    if n < 1:
        msg = f"uniform_below: n={n!r} must be >= 1"
        raise ValueError(msg)
    k = (n - 1).bit_length()
    if k == 0:
        return 0
    nbytes = (k + 7) // 8
    mask = (1 << k) - 1
    while True:
        v = int.from_bytes(source.bytes(nbytes), "little") & mask
        if v < n:
            return v


def bernoulli(p: Fraction, source: RandomSource) -> bool:
    """``True`` with probability exactly ``p`` (a rational in ``[0, 1]``)."""
    if not 0 <= p <= 1:
        msg = f"bernoulli: p={p} must lie in [0, 1]"
        raise ValueError(msg)
    return uniform_below(p.denominator, source) < p.numerator


def bernoulli_exp(gamma: Fraction, source: RandomSource) -> bool:
    """``True`` with probability exactly ``exp(−γ)`` for a rational ``γ ≥ 0``.

    For ``γ ≤ 1``: draw ``A_k ~ Bernoulli(γ/k)`` for ``k = 1, 2, …`` until the first 0; the
    index ``K`` of that 0 is odd with probability ``exp(−γ)``. For ``γ > 1``: ``⌊γ⌋`` draws of
    ``exp(−1)`` and one of ``exp(−(γ − ⌊γ⌋))``, all of which must come out ``True``.
    """
    if gamma < 0:
        msg = f"bernoulli_exp: gamma={gamma} must be >= 0"
        raise ValueError(msg)
    while gamma > 1:
        if not bernoulli_exp(Fraction(1), source):
            return False
        gamma -= 1
    k = 1
    while bernoulli(gamma / k, source):
        k += 1
    return k % 2 == 1


def discrete_laplace(scale: Fraction, source: RandomSource) -> int:
    """An integer ``Z`` with ``P(Z = z) ∝ exp(−|z|/scale)``, exactly (``scale`` rational > 0).

    With ``scale = t/s``: draw ``X = U + t·V`` (``U`` uniform on ``[0, t)`` kept with
    probability ``exp(−U/t)``, ``V`` geometric with ratio ``exp(−1)``), so ``X`` is geometric
    with ratio ``exp(−1/t)``; ``Y = ⌊X/s⌋`` is geometric with ratio ``exp(−s/t)``; a fair sign,
    rejecting ``−0`` so that 0 is not counted twice.
    """
    if scale <= 0:
        msg = f"discrete_laplace: scale={scale} must be > 0"
        raise ValueError(msg)
    t, s = scale.numerator, scale.denominator
    while True:
        u = uniform_below(t, source)
        if not bernoulli_exp(Fraction(u, t), source):
            continue
        v = 0
        while bernoulli_exp(Fraction(1), source):
            v += 1
        y = (u + t * v) // s
        negative = uniform_below(2, source) == 1
        if negative and y == 0:
            continue
        return -y if negative else y
