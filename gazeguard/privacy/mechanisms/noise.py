"""Laplace and Gaussian noise that is safe on real computers: discrete Laplace and discrete Gaussian
on a power-of-two grid, drawn from the operating system's CSPRNG, vectorised over a whole chunk.

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

Gaussian noise (:class:`DiscreteGaussian`, :func:`calibrate_gaussian`)
    The same construction with the discrete Gaussian ``P(Z = z) ∝ e^{−z²/(2σ_int²)}`` (Canonne,
    Kamath & Steinke 2020), sampled exactly up to a relative error :data:`GAUSS_ETA` ``= 2^-21``
    of every probability. Rounding costs ``‖u − u'‖₂ ≤ Δ2/γ + 2√m`` in L2, paid by inflating σ.
    With an exact discrete Gaussian the integers ``u + Z`` are ``ρ``-zCDP with
    ``ρ = (Δ2/γ + 2√m)²/(2σ_int²)`` — no correction term — and the continuous Gaussian's PLD at
    the same noise multiplier may be used for them; the real sampler adds the slack of
    :func:`gaussian_slack` (about ``9.5e-7`` in ε per noised coordinate). σ comes either from a
    noise multiplier an accountant chose or from a per-release (ε, δ) through the analytic
    Gaussian mechanism (Balle & Wang 2018, :func:`analytic_gaussian_sigma`).

Randomness
    :class:`OsRandom` reads ``os.urandom`` (the kernel CSPRNG, ``getrandom(2)``). A reproducible
    generator exists only as :class:`InsecureSeededRandom`, selected by an explicit ``seed``; it is
    for tests and experiments and must never serve a real user.

Cost (``bench/bench_mechanisms.py`` on the shared 2-core VM, load ≈ 4.6; one 52×64 chunk, 3328
draws): ≈ 105 µs, of which ≈ 75 µs is ``os.urandom`` itself (8 bytes per draw); OpenDP's float
Laplace sampler takes ≈ 96 ms for the same draws, numpy's unsafe one ≈ 77 µs. The discrete
Gaussian for one 48×64 chunk (``--part gaussian``, load ≈ 6): ≈ 250 µs of CPU, 4× the discrete
Laplace at that shape (it draws 1.6 candidates and 16 bytes per value), against ≈ 24 ms for
OpenDP's discrete Gaussian and ≈ 30 µs for numpy's unsafe normal.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting import analytic_gaussian_sigma, discrete_laplace_slack

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


_LOW_BITS = np.uint64((1 << 63) - 1)
_LOW_47 = np.uint64((1 << 47) - 1)


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
        slack: float64 (F,) privacy loss charged per coordinate beside the integers' own: the
            sampler's inexactness and the discrete Laplace's distance from the continuous pair
            (at a ``t`` no larger than the final one, so it covers it).
    """

    epsilon: FloatArray
    scale: FloatArray
    grid: FloatArray
    t: FloatArray
    m: int
    slack: FloatArray


def laplace_slack(t: FloatArray) -> FloatArray:
    """Per coordinate, the discrete Laplace's slack against the continuous Laplace pair at
    parameter ``t`` (:func:`gazeguard.privacy.accounting.discrete_laplace_slack`), (F,)."""
    return np.array([discrete_laplace_slack(float(x)) for x in np.atleast_1d(t)])


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
    # The discrete Laplace is within a factor of the continuous pair the accountant composes
    # (gazeguard.privacy.accounting.discrete_laplace_slack): pay that slack too, for the parameter t
    # the grid gives at this budget (paying it only makes t, and so the slack, larger).
    t0 = (l1_sensitivity + 2.0 * m * grid) / budget / grid
    slack = SAMPLER_LOSS_PER_COORDINATE + laplace_slack(np.maximum(t0, 1.0))
    budget = epsilon - m * slack
    if np.any(budget < epsilon / 2) or np.any(2.0 * m / budget >= T_MAX / 4):
        i = int(np.argmin(budget / epsilon))
        raise ConfigError(
            "epsilon",
            float(epsilon[i]),
            f"too small for {m} noised coefficients per feature; use a smaller k "
            "(fewer coefficients) or a larger epsilon",
        )
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
    return GridCalibration(epsilon=epsilon, scale=scale, grid=grid, t=t, m=m, slack=slack)


# ================================================================================================
# Discrete Gaussian noise (Canonne, Kamath & Steinke 2020)
# ================================================================================================

#: Bound on the relative error of the probability of any integer ``|z| ≤ 2^11·σ`` under
#: :class:`DiscreteGaussian` (derivation in its docstring).
GAUSS_ETA = 2.0**-21
#: Privacy loss added per noised coordinate by the Gaussian sampler's inexactness,
#: ``ln((1+η)/(1−η))`` (same form as :data:`SAMPLER_LOSS_PER_COORDINATE`).
GAUSS_SAMPLER_LOSS_PER_COORDINATE = math.log((1.0 + GAUSS_ETA) / (1.0 - GAUSS_ETA))
#: The Gaussian sampler's error analysis holds for ``1 ≤ σ < GAUSS_SIGMA_MAX``.
GAUSS_SIGMA_MAX = 2.0**21
#: The relative-error bound :data:`GAUSS_ETA` is claimed for ``|z| ≤ GAUSS_EXACT_RANGE·σ``.
GAUSS_EXACT_RANGE = 2.0**11
#: Natural log of a bound on the mass, per noised coordinate, that lies outside the window
#: ``|z| ≤ 64σ`` under the sampler, the exact discrete Gaussian and the rounded Gaussian alike:
#: ``< e^{−2000}`` (about 10^-869; zero in double precision). It is the additive δ per
#: coordinate of :func:`gaussian_slack` — formally present, numerically nothing.
GAUSS_TAIL_LOG_DELTA = -2000.0
#: ``log2`` of the target ratio σ / grid for Gaussian noise (``σ_int ≈ 2^20``).
GAUSS_GRID_LOG2_BELOW_SCALE = 20
#: Below this ``σ_int`` the grid is too coarse; refused (and :data:`GAUSS_KAPPA_MAX` holds above).
GAUSS_SIGMA_INT_MIN = 2.0**19
#: Largest ``κ = 512/σ_int² + 3e^{−2π²σ_int²}`` at ``σ_int ≥`` :data:`GAUSS_SIGMA_INT_MIN`:
#: the log-ratio between the discrete and the rounded Gaussian on the window ``|z| ≤ 64σ``.
GAUSS_KAPPA_MAX = 512.0 / GAUSS_SIGMA_INT_MIN**2
#: Stage length (in units of the exponent ``b``) of the acceptance test's product of
#: Bernoulli(e^{−c}) trials; a power of two, so ``b/c`` and ``b − c·J`` are exact.
_ACCEPT_STAGE = 8.0
#: ``⌊fl(e^{−8})·2^63⌋``: a 63-bit word below it is a Bernoulli(e^{−8}) success.
_ACCEPT_STAGE_THRESHOLD = np.uint64(int(math.exp(-_ACCEPT_STAGE) * 2.0**63))


def gaussian_kappa(sigma_int: npt.ArrayLike) -> FloatArray:
    """``κ(σ) = 512/σ² + 3·e^{−2π²σ²}``: bound on ``|ln(P_DG(z)/P_RG(z))|`` for ``|z| ≤ 64σ``,
    where DG is the discrete Gaussian and RG the continuous Gaussian rounded to the nearest
    integer, both of parameter σ (derivation in :class:`DiscreteGaussian`). float64, shape of
    ``sigma_int``."""
    s = np.asarray(sigma_int, dtype=np.float64)
    return np.asarray(512.0 / s**2 + 3.0 * np.exp(-2.0 * math.pi**2 * s**2), dtype=np.float64)


class _Prefetched:
    """Serves ``bytes(n)`` from one block read ahead from ``source``, in order and never twice;
    when the block runs short, reads straight from ``source`` (what is left of the block is
    discarded). One ``getrandom`` call instead of about eight per chunk: each system call is a
    point where a busy machine can preempt the sampler."""

    def __init__(self, source: RandomSource, size: int) -> None:
        self._source = source
        self._block = memoryview(source.bytes(size))
        self._pos = 0

    @property
    def secure(self) -> bool:
        """As the underlying source."""
        return self._source.secure

    def bytes(self, n: int) -> bytes:
        """The next ``n`` bytes of the block, or ``n`` fresh bytes from the source."""
        end = self._pos + n
        if end <= len(self._block):
            out = self._block[self._pos : end].tobytes()
            self._pos = end
            return out
        self._pos = len(self._block)
        return self._source.bytes(n)


class DiscreteGaussian:
    """Vectorised sampler of the discrete Gaussian ``P(Z = z) = e^{−z²/(2σ²)} / Σ_y e^{−y²/(2σ²)}``
    on the integers, one ``σ`` per draw (an array of any shape; calls return that shape).

    Construction (Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential
    Privacy", Algorithm 3, with the discrete Laplace parameter ``t = σ``)
        Draw ``Y`` from the discrete Laplace ``P(Y = y) ∝ e^{−|y|/σ}`` (:class:`DiscreteLaplace`)
        and accept it with probability ``e^{−b}``, ``b = (|y| − σ)²/(2σ²)``; otherwise draw again.
        Since ``e^{−|y|/σ}·e^{−b} = e^{−1/2}·e^{−y²/(2σ²)}``, an accepted ``Y`` is exactly
        discrete Gaussian; a candidate is accepted with probability ≥ 0.70 (0.76 for large σ).
        The loop is batched over the whole chunk: the first round draws one candidate per
        coordinate, the second two per coordinate still open, later rounds eight, and each
        coordinate takes its first accepted candidate in drawing order — the same distribution
        as drawing one at a time. A 48×64 chunk needs three rounds.

        The acceptance ``Bernoulli(e^{−b})`` is realised without underflow or loss of relative
        precision: with ``J = ⌊b/8⌋`` and ``r = b − 8J ∈ [0, 8)`` (both exact: 8 is a power of
        two and ``b − 8J`` is exact by Sterbenz's lemma), it is the conjunction of one
        ``Bernoulli(e^{−r})`` and ``J`` independent ``Bernoulli(e^{−8})``. Each Bernoulli(p)
        is ``w < ⌊p·2^63⌋`` for a uniform 63-bit integer ``w`` (exact integer comparison), whose
        top 16 bits are drawn first and whose low 47 bits are drawn only on a tie (probability
        2^-16). Only about 0.7% of candidates have ``J ≥ 1``. Randomness: ≈ 16 bytes per draw
        (1.6 candidates of 8 + 2 bytes), read ahead in one block per call (one ``getrandom``
        for three chunks in four).

    Error analysis (relative error of any integer's probability, for ``1 ≤ σ < 2^21`` and
    ``|z| ≤ 2^11·σ``)
        * Proposal: the discrete Laplace with ``t = σ < 2^21`` has every probability within
          relative ``η_L = 2^-22.4`` (see :class:`DiscreteLaplace`), for ``|y|`` far beyond
          ``2^11·σ`` (its bound covers ``|y| < 2^10·⌈11σ⌉``).
        * Exponent: ``b̂ = fl(fl(fl(|y| − σ)/σ)²)/2`` (``|y|`` is an exact integer); three
          correctly rounded operations give ``b̂ = b(1 + θ)``, ``|θ| ≤ 5.01·2^-53``. For
          ``|y| ≤ 2^11σ`` we have ``b ≤ 2^21``, so ``|b̂ − b| ≤ 2^-29.7``: a relative error of
          ``e^{−b}`` of at most ``2^-29.7``.
        * Bernoulli trials: ``⌊p·2^63⌋/2^63`` is within ``2^-63`` of ``fl(p)``, a relative error
          ``≤ 2^-63·e^8 = 2^-51.5`` for ``p ≥ e^{−8}``; numpy's ``exp`` (≤ 4 ulp) adds ``2^-50``
          for ``e^{−r}``, ``math.exp(−8)`` (≤ 1 ulp) adds ``2^-52`` to the stage threshold. With
          ``J ≤ 2^18`` stages: ``≤ 2^-49.5 + 2^18·2^-50.7 ≤ 2^-32.6``.
        * Hence the realised acceptance is within relative ``η_A ≤ 2^-29.5`` of ``e^{−b}``, and
          the output probability ``P̂(z) = L̂(z)Â(z) / Σ_y L̂(y)Â(y)`` satisfies
          ``(1−η_L)(1−η_A)/((1+η_L)(1+η_A)) ≤ P̂(z)/P(z) ≤ (1+η_L)(1+η_A)/((1−η_L)(1−η_A))``,
          i.e. ``|P̂(z)/P(z) − 1| ≤ 2(η_L + η_A) + O(η²) ≤ 2^-21.3 <`` :data:`GAUSS_ETA`. (The
          candidates with ``|y| > 2^11σ`` contribute less than ``e^{−2^21+9}`` to the normaliser:
          nothing at this precision.)
        * Outside ``|z| ≤ 2^11σ`` no relative bound is claimed; the sampler's mass there is below
          ``e^{−2^21+9}`` (acceptance ``≤ e^{−b̂+8}·(1+2^-50)^J``), far inside the per-coordinate
          tail :data:`GAUSS_TAIL_LOG_DELTA` that :func:`gaussian_slack` charges.

    Privacy of ``u + Z`` for an integer vector ``u`` (``Z`` i.i.d. discrete Gaussian, parameter σ)
        *Exact discrete Gaussian.* For integer vectors ``u, u'`` with ``‖u − u'‖₂ ≤ Δ``, every
        Rényi divergence satisfies ``D_α(u + Z ‖ u' + Z) ≤ α·Δ²/(2σ²)``: it is additive over
        independent coordinates, and in one dimension with integer shift ``v`` the exponent
        ``αy² + (1−α)(y−v)² = (y − (1−α)v)² + α(1−α)v²`` gives ``D_α = αv²/(2σ²) +
        ln(θ((1−α)v)/θ(0))/(α−1)`` with ``θ(c) = Σ_y e^{−(y−c)²/(2σ²)} ≤ θ(0)`` (Poisson
        summation: ``θ(c) = √(2π)σ·Σ_k e^{−2π²σ²k²}cos(2πkc)``). So the mechanism is
        ``ρ``-zCDP with ``ρ = Δ²/(2σ²)`` **with no correction term**, exactly as the continuous
        Gaussian (CKS20 state the multivariate case with independent coordinates the same way;
        equality holds at integer α for a shift along one axis). The correction
        ``τ = 10·Σ_{k=1}^{N−1} e^{−2π²σ²·k/(k+1)}`` (RDP ``α·Δ²/(2σ²) + τ·d``) of Kairouz, Liu &
        Steinke 2021 ("The Distributed Discrete Gaussian Mechanism") belongs to *sums* of N
        discrete Gaussians (distributed noise) and is 0 for N = 1, i.e. here; for completeness,
        at N = 2 and ``σ_int = 2^20`` it would be ``10·e^{−π²·2^40} = e^{−1.085·10^13}`` per
        coordinate. OpenDP's integer ``make_gaussian`` reports the same ``ρ = Δ²/(2σ²)``.

        *Continuous-Gaussian PLD.* Let ``RG`` be ``rint(X)``, ``X ~ N(0, σ²)`` per coordinate.
        ``u + RG = rint(u + X)`` is post-processing of the continuous Gaussian mechanism with L2
        sensitivity ``Δ``, so its privacy profile is dominated by the continuous Gaussian's,
        under any composition. Pointwise, ``P_RG(z)/P_DG(z) = (1+ξ)∫_{−½}^{½}
        e^{−(2zs+s²)/(2σ²)}ds ∈ [e^{−1/(8σ²)}, (1+ξ)cosh(z/(2σ²))]`` with ``0 ≤ ξ ≤
        3e^{−2π²σ²}`` (Poisson summation of the normaliser), so ``|ln(P_DG/P_RG)| ≤ κ =
        512/σ² + ξ`` on the window ``|z| ≤ 64σ`` (:func:`gaussian_kappa`; ``κ ≤ 2^-29`` for
        ``σ ≥ 2^19``, ``2^-31`` at ``σ = 2^20``), and every one of the three distributions puts
        less than ``e^{−2000}`` outside the window. Therefore an accountant may use the
        *continuous* Gaussian's PLD (or analytic (ε, δ), or RDP ``α/(2r²)``) at noise multiplier
        ``r = σ/Δ`` for the real sampler, provided it adds the slack of :func:`gaussian_slack`:
        ``ln((1+η)/(1−η)) + 2κ`` to ε per noised coordinate and multiplies δ by
        ``((1+η)e^κ)^N`` (plus ``N·e^{−2000}``-sized terms). The zCDP route needs no ``κ`` but
        the same sampler slack, applied after conversion to (ε, δ).
    """

    def __init__(self, sigma: npt.ArrayLike) -> None:
        """``sigma``: the parameter σ per draw (any shape), ``1 ≤ σ < 2^21``."""
        s = np.asarray(sigma, dtype=np.float64)
        if not np.all(np.isfinite(s)) or np.any(s < 1.0) or np.any(s >= GAUSS_SIGMA_MAX):
            raise ConfigError(
                "sigma",
                sigma,
                f"the discrete Gaussian parameter must lie in [1, 2^21) (got {s!r})",
            )
        self.shape: tuple[int, ...] = s.shape
        self._sigma = np.ascontiguousarray(s.reshape(-1))
        self._laplace = DiscreteLaplace(self._sigma)

    @property
    def sigma(self) -> FloatArray:
        """The parameter σ per draw, shape :attr:`shape`."""
        return self._sigma.reshape(self.shape)

    def sample(self, source: RandomSource) -> IntArray:
        """One draw per parameter, int64 of shape :attr:`shape`."""
        return self.sample_float(source).astype(np.int64)

    def sample_float(self, source: RandomSource) -> FloatArray:
        """One draw per parameter as integer-valued float64 of shape :attr:`shape`.

        Exact integers (below 2^40 outside an event of probability < e^{−11264}), so they add
        to other integers in float64 without rounding.
        """
        if not self._sigma.size:
            return np.zeros(self.shape)
        source = _Prefetched(source, 16 * self._sigma.size + 256)  # ≈ what one call reads
        out = self._laplace._draw(source, None)
        rejected = np.flatnonzero(~self._accept(source, out, self._sigma))
        per = 2  # later rounds draw several candidates per open coordinate: fewer rounds
        while rejected.size:
            idx = np.repeat(rejected, per)
            y = self._laplace._draw(source, idx).reshape(rejected.size, per)
            ok = self._accept(source, y.reshape(-1), self._sigma[idx]).reshape(rejected.size, per)
            done = ok.any(axis=1)
            first = ok.argmax(axis=1)  # the first accepted candidate, in drawing order
            out[rejected[done]] = y[done, first[done]]
            rejected = rejected[~done]
            per = 8
        return out.reshape(self.shape)

    @staticmethod
    def _bernoulli(
        source: RandomSource, threshold: npt.NDArray[np.uint64]
    ) -> npt.NDArray[np.bool_]:
        """``w < threshold`` for independent uniform 63-bit words ``w`` (``threshold ≤ 2^63``):
        exactly ``Bernoulli(threshold/2^63)``. The top 16 bits of ``w`` are drawn first and
        decide unless they equal the threshold's (probability 2^-16); only then are the low 47
        bits drawn. Same distribution as drawing all 63 bits, a quarter of the randomness."""
        high = np.frombuffer(source.bytes(2 * threshold.size), dtype="<u2")
        t_high = threshold >> np.uint64(47)
        result: npt.NDArray[np.bool_] = high < t_high
        tie = np.flatnonzero(high == t_high)
        if tie.size:
            low = np.frombuffer(source.bytes(8 * tie.size), dtype="<u8") & _LOW_47
            result[tie] = low < (threshold[tie] & _LOW_47)
        return result

    @classmethod
    def _accept(
        cls, source: RandomSource, y: FloatArray, sigma: FloatArray
    ) -> npt.NDArray[np.bool_]:
        """Bernoulli(e^{−(|y|−σ)²/(2σ²)}) per candidate (see the class docstring)."""
        b = np.abs(y)
        b -= sigma
        b /= sigma
        b *= b
        b *= -0.5
        # b = −(exponent). Candidates with exponent ≥ 8 (≈ 0.7%) split off J = ⌊exponent/8⌋
        # stages; r = exponent − 8J ∈ [0, 8) is exact (8 is a power of two; Sterbenz).
        long = np.flatnonzero(b <= -_ACCEPT_STAGE)
        stages = np.floor(b[long] * (-1.0 / _ACCEPT_STAGE))
        b[long] += stages * _ACCEPT_STAGE
        np.exp(b, out=b)
        b *= 2.0**63
        accept = cls._bernoulli(source, b.astype(np.uint64))  # ⌊e^{−r}·2^63⌋ ≤ 2^63
        keep = accept[long]
        chain, stages = long[keep], stages[keep]
        while chain.size:  # J more independent Bernoulli(e^{−8}) trials, all must succeed
            passed = cls._bernoulli(source, np.full(chain.size, _ACCEPT_STAGE_THRESHOLD))
            accept[chain[~passed]] = False
            stages -= 1.0
            more = passed & (stages > 0)
            chain, stages = chain[more], stages[more]
        return accept


@dataclass(frozen=True)
class GaussianCalibration:
    """Discrete Gaussian noise parameters per feature for ``m`` coefficients.

    The released coefficients are ``γ·(u + Z)`` with ``u = rint(c/γ)`` and ``Z`` i.i.d. discrete
    Gaussian of parameter ``σ_int`` (:class:`DiscreteGaussian`).

    Attributes:
        noise_multiplier: float64 (F,) ``r = σ_int / Δ_int``: the ratio the accountant composes
            (ideal mechanism: ``ρ = 1/(2r²)``-zCDP per release, or the Gaussian PLD at ``r``).
        sigma: float64 (F,) ``σ = γ·σ_int`` in coefficient units (≥ ``r·Δ2``; the inflation pays
            for the grid). Each noised coefficient has standard deviation ``< σ``.
        grid: float64 (F,) γ, a power of two; every released coefficient is an integer times γ.
        sigma_int: float64 (F,) ``σ/γ``, the discrete Gaussian parameter in grid steps.
        sensitivity_l2: float64 (F,) ``Δ2`` of the exact coefficients (as given).
        integer_sensitivity: float64 (F,) ``Δ_int = Δ2/γ + 2√m``, the L2 sensitivity of the
            integers ``u`` (grid steps).
        rho: float64 (F,) ``1/(2r²)``, zCDP of the ideal discrete Gaussian per release.
        m: noised coefficients per feature.
        slack_epsilon_per_coordinate: float64 (F,) additive ε per noised coordinate for using the
            *continuous* Gaussian's PLD / (ε, δ) / RDP at ``r`` for the real sampler:
            ``ln((1+η)/(1−η)) + 2κ(σ_int)`` (see :func:`gaussian_slack`).
        epsilon: float64 (F,) the per-release ε this calibration guarantees with :attr:`delta`
            when built by :func:`calibrate_gaussian_epsilon_delta` (slack included), else None.
        delta: the per-release δ that goes with :attr:`epsilon`, else None.
    """

    noise_multiplier: FloatArray
    sigma: FloatArray
    grid: FloatArray
    sigma_int: FloatArray
    sensitivity_l2: FloatArray
    integer_sensitivity: FloatArray
    rho: FloatArray
    m: int
    slack_epsilon_per_coordinate: FloatArray
    epsilon: FloatArray | None = None
    delta: float | None = None


def calibrate_gaussian(
    l2_sensitivity: npt.ArrayLike,
    m: int,
    noise_multiplier: npt.ArrayLike,
    input_error: npt.ArrayLike,
) -> GaussianCalibration:
    """Grid and discrete Gaussian parameter per feature for a requested noise multiplier.

    The accountant asked for ``σ = r·Δ2`` (``r`` = ``noise_multiplier``). What the integers see
    (the derivation of :func:`calibrate`, in L2): rounding moves each coordinate by at most
    ``γ/2`` and the floating-point transform by at most ``δ ≤ γ/2`` (``input_error``), so
    ``|u_i − u'_i| ≤ |c_i − c'_i|/γ + 2`` and, by the triangle inequality in ℝ^m,
    ``‖u − u'‖₂ ≤ Δ2/γ + 2√m =: Δ_int``. We set ``σ_int = r·Δ_int`` — the integer mechanism
    then has noise multiplier exactly ``r`` — and report ``σ = γ·σ_int = r·(Δ2 + 2√m·γ)``,
    slightly above ``r·Δ2``: the grid's cost is charged by inflating σ, never by hiding it.
    ``γ`` is the largest power of two ``≤ r·Δ2·2^-20`` (so ``σ_int ∈ [2^20, 2^21)`` up to the
    inflation ``2√m·r``, relative ``2√m·r/σ_int``, e.g. 4e-4 at m = 15, r = 56), never finer
    than ``2δ``, doubled while ``σ_int ≥ 2^21`` (the sampler's range).

    Args:
        l2_sensitivity: float64 (F,) ``Δ2``, L2 sensitivity of the exact coefficients
            (coefficient units), finite and > 0.
        m: coefficients noised per feature.
        noise_multiplier: float64 (F,) or scalar ``r`` > 0.
        input_error: float64 (F,) or scalar, public bound on the absolute floating-point error
            of each computed coefficient (``transforms.fft_error_bound``).

    Raises:
        ConfigError: if ``r`` is so large that ``2√m·r`` alone would push ``σ_int`` past the
            sampler's range, or so small that ``σ_int < 2^19`` (the grid would have to be finer
            than the transform's rounding error).
    """
    delta2 = np.atleast_1d(np.asarray(l2_sensitivity, dtype=np.float64))
    r = np.broadcast_to(np.asarray(noise_multiplier, dtype=np.float64), delta2.shape).copy()
    err = np.broadcast_to(np.asarray(input_error, dtype=np.float64), delta2.shape)
    if isinstance(m, bool) or not isinstance(m, int | np.integer) or m < 1:
        raise ConfigError("m", m, "the number of noised coefficients must be an integer >= 1")
    for name, arr in (("sensitivity_l2", delta2), ("noise_multiplier", r)):
        if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            i = int(np.flatnonzero(~(np.isfinite(arr) & (arr > 0)))[0])
            raise ConfigError(name, float(arr[i]), f"must be finite and > 0 (feature index {i})")
    root_m = math.sqrt(m)
    if np.any(2.0 * root_m * r >= GAUSS_SIGMA_MAX / 4):
        i = int(np.argmax(r))
        raise ConfigError(
            "noise_multiplier",
            float(r[i]),
            f"too large for {m} coefficients: the discrete Gaussian parameter would leave the "
            "sampler's range; use a larger epsilon (budget) or fewer coefficients",
        )
    sigma0 = r * delta2
    grid = np.exp2(np.floor(np.log2(sigma0)) - GAUSS_GRID_LOG2_BELOW_SCALE)
    grid = np.maximum(grid, np.exp2(np.ceil(np.log2(2.0 * np.maximum(err, 2.0**-1074)))))
    integer_sensitivity = delta2 / grid + 2.0 * root_m
    sigma_int = r * integer_sensitivity
    while np.any(sigma_int >= GAUSS_SIGMA_MAX):
        grid = np.where(sigma_int >= GAUSS_SIGMA_MAX, 2.0 * grid, grid)
        integer_sensitivity = delta2 / grid + 2.0 * root_m
        sigma_int = r * integer_sensitivity
    if np.any(sigma_int < GAUSS_SIGMA_INT_MIN):
        i = int(np.argmin(sigma_int))
        raise ConfigError(
            "noise_multiplier",
            float(r[i]),
            "too small: the noise would be finer than the transform's rounding error allows "
            f"(feature index {i}); use a larger noise multiplier (smaller epsilon)",
        )
    return GaussianCalibration(
        noise_multiplier=r,
        sigma=grid * sigma_int,
        grid=grid,
        sigma_int=sigma_int,
        sensitivity_l2=delta2,
        integer_sensitivity=integer_sensitivity,
        rho=1.0 / (2.0 * r**2),
        m=int(m),
        slack_epsilon_per_coordinate=GAUSS_SAMPLER_LOSS_PER_COORDINATE
        + 2.0 * gaussian_kappa(sigma_int),
    )


def gaussian_slack(
    epsilon: float, delta: float, coordinates: int, *, kappa: float = GAUSS_KAPPA_MAX
) -> tuple[float, float]:
    """The (ε, δ) of the real sampler, from the (ε, δ) an accountant computed for the ideal
    continuous Gaussian mechanism (PLD, analytic, or RDP/zCDP conversion) over ``coordinates``
    noised coordinates in total (every coordinate of every release it composed).

    With ``η`` = :data:`GAUSS_ETA`, ``β = e^{−2000}`` (:data:`GAUSS_TAIL_LOG_DELTA`) and ``N`` =
    ``coordinates``: on the window where every coordinate lies within ``64σ`` of its mean, the
    realised output distribution ``R`` and the rounded Gaussian ``G`` (dominated by the
    continuous Gaussian; see :class:`DiscreteGaussian`) satisfy ``R ≤ A·G`` and ``G ≤ B·R``
    pointwise with ``A = ((1+η)e^κ)^N``, ``B = (e^κ/(1−η))^N``; outside it each puts mass
    ``≤ Nβ``. For any event S and neighbours u, u':
    ``R_u(S) ≤ A·G_u(S) + Nβ ≤ A(e^ε·G_u'(S) + δ) + Nβ ≤ A·B·e^ε·R_u'(S) + A·δ + Nβ(1 + A·e^ε)``.

    Args:
        epsilon: the accountant's ε for the ideal mechanism (≥ 0).
        delta: the accountant's δ at that ε, in [0, 1).
        coordinates: N, the number of noised coordinates the accountant composed.
        kappa: ``κ``, the discrete-vs-rounded-Gaussian distance. Keep the default
            (:data:`GAUSS_KAPPA_MAX`, valid for every calibration) when the accountant used the
            *continuous* Gaussian (PLD, analytic (ε, δ), its RDP); pass 0 when it used the
            discrete Gaussian's own guarantee (zCDP ``ρ = 1/(2r²)`` converted to (ε, δ)).

    Returns:
        ``(ε + N·(ln((1+η)/(1−η)) + 2κ), min(1, A·δ + Nβ(1 + A·e^ε)))`` — the δ tail term is
        rounded up to the next double (it is ~10^-860 for any ε < 1000, far below any δ anyone
        reports; for ε beyond about 2000 it is no longer small and δ = 1 is returned).

    Raises:
        ConfigError: on a negative or non-integer count, or ε, δ outside their ranges.
    """
    if isinstance(coordinates, bool) or not isinstance(coordinates, int) or coordinates < 0:
        raise ConfigError("coordinates", coordinates, "must be an integer >= 0")
    if not math.isfinite(epsilon) or epsilon < 0:
        raise ConfigError("epsilon", epsilon, "must be finite and >= 0")
    if not 0.0 <= delta < 1.0:
        raise ConfigError("delta", delta, "must lie in [0, 1)")
    n = float(coordinates)
    log_a = n * (math.log1p(GAUSS_ETA) + kappa)
    eps_out = epsilon + n * (GAUSS_SAMPLER_LOSS_PER_COORDINATE + 2.0 * kappa)
    x = log_a + epsilon  # ln(1 + e^x) without overflow for large ε
    log_one_plus = x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))
    log_tail = math.log(max(n, 1.0)) + GAUSS_TAIL_LOG_DELTA + log_one_plus
    if not coordinates:
        return eps_out, delta
    if log_tail >= 0.0:  # ε beyond ~2000: e^ε·β is no longer small and the bound is vacuous
        return eps_out, 1.0
    return eps_out, min(1.0, math.exp(log_a) * delta + math.nextafter(math.exp(log_tail), 1.0))


def calibrate_gaussian_epsilon_delta(
    l2_sensitivity: npt.ArrayLike,
    m: int,
    epsilon: npt.ArrayLike,
    delta: float,
    input_error: npt.ArrayLike,
) -> GaussianCalibration:
    """Discrete Gaussian parameters per feature so that one release of ``m`` coefficients is
    (ε, δ)-DP per feature, sampler and grid included.

    The analytic Gaussian (:func:`analytic_gaussian_sigma`) is applied to the *integers* ``u``
    (L2 sensitivity ``Δ_int``, see :func:`calibrate_gaussian`) at a reduced target
    ``ε' = ε − m·(ln((1+η)/(1−η)) + 2κ_max)`` and ``δ' = (δ/((1+η)e^{κ_max})^m)·(1 − 2^-40)``
    (the last factor swallows the ``m·e^{ε−2000}`` tail terms, as ε ≤ 1000);
    :func:`gaussian_slack` with ``N = m`` then gives back at most (ε, δ). ``κ_max`` =
    :data:`GAUSS_KAPPA_MAX` holds because :func:`calibrate_gaussian` never returns
    ``σ_int < 2^19``.

    Args:
        l2_sensitivity: float64 (F,) ``Δ2`` of the exact coefficients.
        m: coefficients noised per feature.
        epsilon: float64 (F,) or scalar per-release ε > 0.
        delta: per-release δ in (0, 1).
        input_error: float64 (F,) or scalar FFT error bound.

    Raises:
        ConfigError: if ε cannot pay for the sampler's slack over ``m`` coordinates, or as
            :func:`calibrate_gaussian`.
    """
    delta2 = np.atleast_1d(np.asarray(l2_sensitivity, dtype=np.float64))
    eps = np.broadcast_to(np.asarray(epsilon, dtype=np.float64), delta2.shape).copy()
    if not 0.0 < delta < 1.0:
        raise ConfigError("delta", delta, "must lie strictly between 0 and 1")
    slack = m * (GAUSS_SAMPLER_LOSS_PER_COORDINATE + 2.0 * GAUSS_KAPPA_MAX)
    budget = eps - slack
    if not np.all(np.isfinite(eps)) or np.any(budget < eps / 2):
        i = int(np.argmin(np.where(np.isfinite(eps), budget / eps, -np.inf)))
        raise ConfigError(
            "epsilon",
            float(eps[i]),
            f"too small for {m} noised coefficients per feature (the sampler alone costs "
            f"{slack:.3g}); use a smaller k or a larger epsilon",
        )
    if np.any(eps > 1000.0):  # beyond, the e^ε·e^{−2000} tail terms would no longer vanish
        raise ConfigError(
            "epsilon", float(np.max(eps)), "per-release epsilon above 1000 is not supported"
        )
    reduced_delta = delta * math.exp(-m * (math.log1p(GAUSS_ETA) + GAUSS_KAPPA_MAX)) * (1 - 2**-40)
    r = np.array([analytic_gaussian_sigma(float(b), reduced_delta, 1.0) for b in budget])
    cal = calibrate_gaussian(delta2, m, r, input_error)
    return GaussianCalibration(
        noise_multiplier=cal.noise_multiplier,
        sigma=cal.sigma,
        grid=cal.grid,
        sigma_int=cal.sigma_int,
        sensitivity_l2=cal.sensitivity_l2,
        integer_sensitivity=cal.integer_sensitivity,
        rho=cal.rho,
        m=cal.m,
        slack_epsilon_per_coordinate=cal.slack_epsilon_per_coordinate,
        epsilon=eps,
        delta=float(delta),
    )
