"""Laplace noise that is safe on real computers: discrete Laplace on a power-of-two grid, drawn
from the operating system's CSPRNG, vectorised over a whole chunk.

Why not ``numpy.random.laplace``
    Textbook floating-point Laplace ``x + λ·(−log U)`` leaks through its low-order bits: the set
    of doubles it can output depends on ``x``, so an observer can tell neighbouring inputs apart
    with certainty for many outputs (Mironov, CCS 2012). numpy's generators are also predictable.

What we do instead (the approach of OpenDP and Google's DP library)
    Every released coefficient ``c`` (already a function of clipped data with known L1
    sensitivity ``Δ1``) is *rounded to a power-of-two grid* ``γ = 2^g``: ``u = rint(c/γ)``, an
    integer. We add an integer ``Z`` from the *discrete Laplace* distribution
    ``P(Z = z) ∝ exp(−|z|/t)`` and release ``γ·(u + Z)``. Arithmetic is exact on integers, so the
    output set never depends on the input: the attack has nothing to read.

The grid and its cost, charged honestly (:func:`calibrate`)
    * Rounding moves each coordinate by at most ``γ/2``; the floating-point transform moves it by
      at most ``δ`` (a public bound on FFT rounding error, see ``transforms.fft_error_bound``). We
      require ``δ ≤ γ/2``, so between neighbours ``|u_i − u'_i| ≤ |c_i − c'_i|/γ + 2`` and
      ``‖u − u'‖₁ ≤ Δ1/γ + 2m`` for ``m`` coefficients.
    * Discrete Laplace with parameter ``t`` on integers is ``(‖u − u'‖₁/t)``-DP, so with
      ``λ = t·γ`` the loss is ``(Δ1 + 2mγ)/λ``.
    * Our sampler is exact up to floating-point error in ``log`` and in the 64-bit uniforms; we
      bound the relative error of every integer's probability by ``ETA = 2^-21`` (derivation in
      :class:`DiscreteLaplace`), which adds at most ``ln((1+ETA)/(1−ETA)) ≈ 9.5e-7`` per
      coordinate to the privacy loss.
    * Hence ``λ = (Δ1 + 2mγ) / (ε − m·ln((1+ETA)/(1−ETA)))``: slightly larger than the ideal
      ``Δ1/ε``; the stated ε is the true bound. ``γ`` is the largest power of two ``≤ λ·2^-20``
      (so ``t ≈ 2^20``: the grid is a millionth of the noise scale, the inflation of λ is about
      ``2m/(ε·2^20)``, e.g. 6e-5 for m = 15, ε = 0.48).

Randomness
    :class:`OsRandom` reads ``os.urandom`` (the kernel CSPRNG, ``getrandom(2)``). A reproducible
    generator exists only as :class:`InsecureSeededRandom`, selected by an explicit ``seed``; it is
    for tests and experiments and must never serve a real user.

Cost (``bench/bench_mechanisms.py`` on the shared 2-core VM, load ≈ 4.6; one 52×64 chunk, 3328
draws): ≈ 105 µs, of which ≈ 75 µs is ``os.urandom`` itself (8 bytes per draw); OpenDP's float
Laplace sampler takes ≈ 96 ms for the same draws, numpy's unsafe one ≈ 77 µs.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from gazeguard.errors import ConfigError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Bound on the relative error of the probability of any single integer under our sampler.
ETA = 2.0**-21
#: Privacy loss added per noised coordinate by the sampler's inexactness, ``ln((1+η)/(1−η))``.
SAMPLER_LOSS_PER_COORDINATE = math.log((1.0 + ETA) / (1.0 - ETA))
#: ``log2`` of the target ratio noise scale / grid (``t ≈ 2^20``).
GRID_LOG2_BELOW_SCALE = 20
#: The sampler's error analysis holds for ``1 ≤ t < T_MAX``.
T_MAX = 2.0**22
#: Stage length of the geometric sampler in units of E ~ Exp(1) (see :class:`DiscreteLaplace`).
STAGE_LENGTH = 11.0
#: Below this ``t`` the grid is too coarse for the noise to be Laplace-like; refused.
T_MIN = 2.0**10


class RandomSource(Protocol):
    """Where random bytes come from."""

    @property
    def secure(self) -> bool:
        """True only for a cryptographically secure, unpredictable source."""
        ...

    def bytes(self, n: int) -> bytes:
        """``n`` uniformly random bytes."""
        ...


class OsRandom:
    """The operating system's CSPRNG (``os.urandom``): the default, and the only choice for
    production."""

    @property
    def secure(self) -> bool:
        """Always True."""
        return True

    def bytes(self, n: int) -> bytes:
        """``n`` bytes from ``os.urandom``."""
        return os.urandom(n)


class InsecureSeededRandom:
    """INSECURE reproducible bytes from numpy's PCG64 seeded with ``seed``.

    Anyone who knows or guesses the seed can subtract the noise. For tests and experiments only.
    The generator advances with every draw, so successive releases get fresh, independent noise
    and the whole sequence is reproducible.
    """

    def __init__(self, seed: int) -> None:
        self._gen = np.random.Generator(np.random.PCG64(seed))

    @property
    def secure(self) -> bool:
        """Always False."""
        return False

    def bytes(self, n: int) -> bytes:
        """``n`` bytes from the seeded generator."""
        return self._gen.bytes(n)


def random_source(seed: int | None) -> RandomSource:
    """:class:`OsRandom` for ``seed=None``, else :class:`InsecureSeededRandom` (``seed`` int)."""
    if seed is None:
        return OsRandom()
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError("seed", seed, "must be an integer (or None for the secure OS CSPRNG)")
    return InsecureSeededRandom(seed)


_TOP_BIT = np.uint64(1 << 63)
_LOW_BITS = np.uint64((1 << 63) - 1)


def _uniforms(source: RandomSource, n: int) -> tuple[FloatArray, npt.NDArray[np.uint64]]:
    """``n`` uniforms in (0, 1) from the low 63 bits of ``n`` random words, and the words (their
    top bit is an independent fair sign)."""
    words = np.frombuffer(source.bytes(8 * n), dtype="<u8")
    u = np.bitwise_and(words, _LOW_BITS).astype(np.float64)
    u += 0.5
    u *= 2.0**-63
    return u, words


class DiscreteLaplace:
    """Vectorised sampler of ``P(Z = z) = (1−q)/(1+q) · q^|z|``, ``q = e^{−1/t}``, one parameter
    ``t`` per draw (an array of any shape; every call returns int64 of that shape).

    Construction
        ``Z = ±G`` with a fair sign, rejecting (−, 0) so that zero is not counted twice; ``G`` is
        geometric, ``P(G ≥ g) = e^{−g/t}``. We draw ``G = ⌊t·E⌋`` for ``E ~ Exp(1)`` in stages
        of length ``c = K/t`` with the integer ``K = ⌈11·t⌉`` (so ``c ∈ [11, 12]``): for a
        uniform ``U ≥ e^{−c}``, ``G = K·J + ⌊−t·log U⌋``; ``U < e^{−c}`` (probability
        ``≤ e^{−11} ≈ 1.7e-5``, so about one chunk in 75 of 780 draws) means ``E > c`` and, by
        memorylessness, restarts with ``J += 1``. The offset ``K·J`` is exact integer arithmetic,
        so precision never degrades in the tail. One 64-bit word per draw: 63 bits for ``U``, the
        top bit for the sign.

    Error analysis (relative error of any integer's probability, for ``1 ≤ t < 2^22``)
        * Granularity: ``U = fl(w + ½)·2^-63`` for a uniform 63-bit word ``w``; ``U`` is monotone
          in ``w`` and within relative ``2^-53`` of ``(w + ½)·2^-63``. The ``U``-interval
          ``(e^{−(r+1)/t}, e^{−r/t}]`` of one integer has length ``ℓ ≥ U/(2t)`` (``U`` its upper
          end, ``U ≥ e^{−c}``, ``c ≤ 11 + 1/t``); it holds ``ℓ·2^63`` words up to
          ``±2(2^10·U + 1)``: relative ``≤ 2^12·t·2^-63 + 4t·e^c·2^-63 ≤ 2^-23.0``.
        * Rounding: ``t·(−log U) < K < 2^25.5`` is computed with absolute error
          ``≤ t·2^-47 + 2^-28 ≤ 2^-24.8`` (four ulps of numpy's ``log``, half an ulp of the
          product). That moves each integer's end points (and the stage boundary, which is
          ``fl(e^{−K/t})``, another ``t·2^-51``) by at most that much; the density varies by
          ``e^{1/t}`` over one integer, so the relative mass error is ``≤ 2^-23.7``. A draw at
          the very end of a stage may round up to ``K``, the first integer of the next stage:
          that is the same boundary shift, not an error of its own.
        * Stages: the continuation probability is realised up to relative ``2^-46`` per stage,
          ``≤ 2^-36`` over ``J ≤ 2^10`` stages; ``J > 2^10`` has probability ``< e^{−11264}``,
          zero in double precision, so no δ term arises in practice.
        * Hence ``η_G ≤ 2^-22.3`` for ``G``; the sign is an exact fair bit and the rejection
          normaliser adds at most another ``η_G``: every probability of ``Z`` is within relative
          :data:`ETA` ``= 2^-21`` of the exact discrete Laplace (``2^-22.4`` for the
          ``t < 2^21`` that the mechanisms normally use).
    """

    def __init__(self, t: npt.ArrayLike, stage_length: float = STAGE_LENGTH) -> None:
        """``t``: parameters (any shape); ``stage_length``: ``c`` in [0.5, 12], shorter stages
        restart more often (tests use 1 to exercise the restart path)."""
        if not 0.5 <= stage_length <= 12.0:
            raise ConfigError("stage_length", stage_length, "must lie in [0.5, 12]")
        t_arr = np.asarray(t, dtype=np.float64)
        if not np.all(np.isfinite(t_arr)) or np.any(t_arr < 1.0) or np.any(t_arr >= T_MAX):
            raise ConfigError(
                "t", t, f"the discrete Laplace parameter must lie in [1, 2^22) (got {t_arr!r})"
            )
        self.shape: tuple[int, ...] = t_arr.shape
        self._t = np.ascontiguousarray(t_arr.reshape(-1))
        self._neg_t = -self._t
        self._K = np.ceil(stage_length * self._t)
        self._thr = np.exp(-self._K / self._t)
        self._thr_max = float(self._thr.max()) if self._t.size else 0.0

    @property
    def t(self) -> FloatArray:
        """The parameter per draw, shape :attr:`shape`."""
        return self._t.reshape(self.shape)

    def sample(self, source: RandomSource) -> IntArray:
        """One draw per parameter, int64 of shape :attr:`shape`."""
        return self.sample_float(source).astype(np.int64)

    def sample_float(self, source: RandomSource) -> FloatArray:
        """One draw per parameter as integer-valued float64 of shape :attr:`shape`.

        Exact: every value is below 2^40 (outside an event of probability < e^{−11264}), so it
        adds to other integers in float64 without rounding. The hot path: about ten numpy
        operations on the whole chunk and one ``os.urandom`` call.
        """
        if not self._t.size:
            return np.zeros(self.shape)
        return self._draw(source, None).reshape(self.shape)

    def _draw(self, source: RandomSource, idx: npt.NDArray[np.intp] | None) -> FloatArray:
        """Discrete Laplace draws for all parameters (``idx`` None) or the flat indices ``idx``."""
        if idx is None:
            neg_t, thr, thr_max = self._neg_t, self._thr, self._thr_max
        else:
            neg_t, thr = self._neg_t[idx], self._thr[idx]
            thr_max = float(thr.max())
        u, words = _uniforms(source, neg_t.size)
        # E beyond the first stage (probability ≤ e^-11 per draw): found before u is overwritten.
        more = np.flatnonzero(u < thr) if u.min() < thr_max else None
        g = np.log(u, out=u)
        g *= neg_t
        np.floor(g, out=g)
        if more is not None and more.size:
            sub = more if idx is None else idx[more]
            g[more] = self._K[sub] + self._geometric_tail(source, sub)
        # The word's top bit is the sign: viewing the word as a double puts that bit in the sign
        # position, and copysign reads nothing else.
        np.copysign(g, words.view(np.float64), out=g)
        if np.count_nonzero(g) < g.size:  # reject (−, 0): zero must not be counted twice
            redo = np.flatnonzero((g == 0) & np.signbit(g))
            if redo.size:
                g[redo] = self._draw(source, redo if idx is None else idx[redo])
        return g

    def _geometric_tail(self, source: RandomSource, idx: npt.NDArray[np.intp]) -> FloatArray:
        """``G`` (integer-valued float) for the flat parameter indices ``idx``: stages until one
        ends inside (memorylessness of the exponential), ``G = K·J + ⌊t·E'⌋``."""
        neg_t, K, thr = self._neg_t[idx], self._K[idx], self._thr[idx]
        g = np.zeros(idx.size)
        offset = np.zeros(idx.size)
        todo = np.arange(idx.size)
        while todo.size:
            u, _ = _uniforms(source, todo.size)
            g[todo] = np.floor(np.log(u) * neg_t[todo])
            again = todo[u < thr[todo]]
            offset[again] += K[again]
            todo = again
        return offset + g


@dataclass(frozen=True)
class GridCalibration:
    """Noise parameters per feature for ``m`` coefficients at privacy ``epsilon``.

    Attributes:
        epsilon: float64 (F,) the ε these parameters guarantee per feature.
        scale: float64 (F,) λ, the Laplace scale of every noised coefficient (coefficient units);
            its standard deviation is ``√2·λ`` up to ``γ²/12``.
        grid: float64 (F,) γ, a power of two; every released coefficient is an integer times γ.
        t: float64 (F,) ``λ/γ``, the discrete Laplace parameter in grid steps.
        m: number of noised coefficients per feature.
    """

    epsilon: FloatArray
    scale: FloatArray
    grid: FloatArray
    t: FloatArray
    m: int


def calibrate(
    l1_sensitivity: FloatArray, m: int, epsilon: FloatArray, input_error: FloatArray
) -> GridCalibration:
    """Grid and scale per feature so that the released integers are ε-DP (derivation above).

    Args:
        l1_sensitivity: float64 (F,) ``Δ1``, L1 sensitivity of the exact coefficients.
        m: coefficients noised per feature.
        epsilon: float64 (F,) privacy parameter per feature, finite and > 0.
        input_error: float64 (F,) public bound on the absolute floating-point error of each
            computed coefficient (``δ``); the grid is never finer than ``2δ``.

    Raises:
        ConfigError: if ε is too small to pay for the sampler's inexactness over ``m``
            coefficients, or so large that the grid would be coarser than ``λ·2^-10``.
    """
    budget = epsilon - m * SAMPLER_LOSS_PER_COORDINATE
    if np.any(budget < epsilon / 2) or np.any(2.0 * m / budget >= T_MAX / 4):
        i = int(np.argmin(budget / epsilon))
        raise ConfigError(
            "epsilon",
            float(epsilon[i]),
            f"too small for {m} noised coefficients per feature; use a smaller k "
            "(fewer coefficients) or a larger epsilon",
        )
    lam0 = l1_sensitivity / budget
    grid = np.exp2(np.floor(np.log2(lam0)) - GRID_LOG2_BELOW_SCALE)
    grid = np.maximum(grid, np.exp2(np.ceil(np.log2(2.0 * input_error))))
    scale = (l1_sensitivity + 2.0 * m * grid) / budget
    while np.any(scale / grid >= T_MAX):  # only when 2m/budget is large: coarsen the grid
        grid = np.where(scale / grid >= T_MAX, 2.0 * grid, grid)
        scale = (l1_sensitivity + 2.0 * m * grid) / budget
    t = scale / grid
    if np.any(t < T_MIN):
        i = int(np.argmin(t))
        raise ConfigError(
            "epsilon",
            float(epsilon[i]),
            "too large: the noise would be smaller than the transform's rounding error allows; "
            "use a smaller epsilon",
        )
    return GridCalibration(epsilon=epsilon, scale=scale, grid=grid, t=t, m=m)
