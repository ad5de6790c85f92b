"""The discrete Gaussian sampler (Canonne, Kamath & Steinke 2020) and the slack an accountant
adds for it, vectorised over a whole chunk.

The grid construction of :mod:`~gazeguard.privacy.mechanisms.discrete_laplace` (release
``γ·(u + Z)`` for the integers ``u = rint(c/γ)``) with the discrete Gaussian
``P(Z = z) ∝ e^{−z²/(2σ_int²)}``, sampled exactly up to a relative error
:data:`GAUSS_ETA` ``= 2^-21`` of every probability. Rounding to the grid costs
``‖u − u'‖₂ ≤ Δ2/γ + 2√m`` in L2, paid by inflating σ
(:func:`gazeguard.privacy.mechanisms.calibration.calibrate_gaussian`). With an exact discrete
Gaussian the integers ``u + Z`` are ``ρ``-zCDP with ``ρ = (Δ2/γ + 2√m)²/(2σ_int²)`` — no
correction term — and the continuous Gaussian's PLD at the same noise multiplier may be used for
them; the real sampler adds the slack of :func:`gaussian_slack` (about ``9.5e-7`` in ε per noised
coordinate). σ comes either from a noise multiplier an accountant chose or from a per-release
(ε, δ) through the analytic Gaussian mechanism (Balle & Wang 2018,
:func:`gazeguard.privacy.accounting.analytic_gaussian_sigma`).

Cost (``bench/bench_mechanisms.py --part gaussian``, load ≈ 6): one 48×64 chunk takes ≈ 250 µs of
CPU, 4× the discrete Laplace at that shape (it draws 1.6 candidates and 16 bytes per value),
against ≈ 24 ms for OpenDP's discrete Gaussian and ≈ 30 µs for numpy's unsafe normal.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.mechanisms.discrete_laplace import DiscreteLaplace
from gazeguard.privacy.mechanisms.randomness import RandomSource

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Bound on the relative error of the probability of any integer ``|z| ≤ 2^11·σ`` under
#: :class:`DiscreteGaussian` (derivation in its docstring).
GAUSS_ETA = 2.0**-21
#: Privacy loss added per noised coordinate by the Gaussian sampler's inexactness,
#: ``ln((1+η)/(1−η))`` (same form as the discrete Laplace's
#: :data:`~gazeguard.privacy.mechanisms.discrete_laplace.SAMPLER_LOSS_PER_COORDINATE`).
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
_LOW_47 = np.uint64((1 << 47) - 1)


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
