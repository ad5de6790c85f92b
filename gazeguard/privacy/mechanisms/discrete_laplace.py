"""The discrete Laplace sampler: integer noise drawn exactly (up to a bounded, charged error)
from the OS CSPRNG, vectorised over a whole chunk.

Why not ``numpy.random.laplace``
    Textbook floating-point Laplace ``x + λ·(−log U)`` leaks through its low-order bits: the set
    of doubles it can output depends on ``x``, so an observer can tell neighbouring inputs apart
    with certainty for many outputs (Mironov, CCS 2012). numpy's generators are also predictable.

What we do instead (the approach of OpenDP and Google's DP library)
    Every released coefficient ``c`` (already a function of clipped data with known L1
    sensitivity ``Δ1``) is *rounded to a power-of-two grid* ``γ = 2^g``: ``u = rint(c/γ)``, an
    integer. We add an integer ``Z`` from the *discrete Laplace* distribution
    ``P(Z = z) ∝ exp(−|z|/t)`` and release ``γ·(u + Z)``. Arithmetic is exact on integers, so the
    output set never depends on the input: the attack has nothing to read. The grid, the scale
    and their cost are :func:`gazeguard.privacy.mechanisms.calibration.calibrate_laplace`'s.

The sampler's inexactness, charged
    Our sampler is exact up to floating-point error in ``log`` and in the 64-bit uniforms; we
    bound the relative error of every integer's probability by :data:`ETA` ``= 2^-21``
    (derivation in :class:`DiscreteLaplace`), which adds at most
    :data:`SAMPLER_LOSS_PER_COORDINATE` ``= ln((1+ETA)/(1−ETA)) ≈ 9.5e-7`` per coordinate to the
    privacy loss; :func:`laplace_slack` is the discrete Laplace's distance from the continuous
    pair an accountant composes.

Cost (``bench/bench_mechanisms.py`` on the shared 2-core VM, load ≈ 4.6; one 52×64 chunk, 3328
draws): ≈ 105 µs, of which ≈ 75 µs is ``os.urandom`` itself (8 bytes per draw); OpenDP's float
Laplace sampler takes ≈ 96 ms for the same draws, numpy's unsafe one ≈ 77 µs.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting import discrete_laplace_slack
from gazeguard.privacy.mechanisms.randomness import RandomSource

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Bound on the relative error of the probability of any single integer under our sampler.
ETA = 2.0**-21
#: Privacy loss added per noised coordinate by the sampler's inexactness, ``ln((1+η)/(1−η))``.
SAMPLER_LOSS_PER_COORDINATE = math.log((1.0 + ETA) / (1.0 - ETA))
#: The sampler's error analysis holds for ``1 ≤ t < T_MAX``.
T_MAX = 2.0**22
#: Stage length of the geometric sampler in units of E ~ Exp(1) (see :class:`DiscreteLaplace`).
STAGE_LENGTH = 11.0

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


def laplace_slack(t: FloatArray) -> FloatArray:
    """Per coordinate, the discrete Laplace's slack against the continuous Laplace pair at
    parameter ``t`` (:func:`gazeguard.privacy.accounting.discrete_laplace_slack`), (F,)."""
    return np.array([discrete_laplace_slack(float(x)) for x in np.atleast_1d(t)])
