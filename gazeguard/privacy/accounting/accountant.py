"""Composition of accounting events: user-level (ε, δ) from a multiset of releases.

:func:`compose` takes ``Mapping[Event, int]`` (event → number of releases) and returns a
:class:`Composition`: ε at the requested δ, the pure sequential ε beside it, ρ where every event
has one, and ``epsilon_at``/``delta_at`` for other points of the same curve. Every number is an
*upper bound* on the true privacy loss of the (adaptive) composition:

Methods (``Composition.method``)
    * ``"gaussian"`` — only Gaussian events: exact closed form. The composition is the Gaussian
      pair with ``μ = √(Σ count/ratio²)``
      (:func:`~gazeguard.privacy.accounting.calibrate.gaussian_delta`),
      no discretisation.
    * ``"pld"`` — privacy loss distributions (pessimistic estimates, connect-the-dots for Laplace
      and Gaussian, Koskela et al. / Doroshenko et al. 2022): per event a ``count``-fold
      self-composition, then composed across events; the Gaussian events are merged into one
      exact Gaussian pair first.
    * ``"rdp"`` — Rényi DP (``dp_accounting.rdp``) with the improved conversion to (ε, δ)
      (Canonne–Kamath–Steinke 2020 / Asoodeh et al. 2021). Used when the PLD would be too large
      (a grid coarse enough for :data:`PLD_TARGET_POINTS` points would no longer resolve one
      release) or fails.
    * ``"none"`` — no releases: ε = 0.

    Always also: ``pure_epsilon`` = ``Σ count·(pure ε + slack)`` (sequential composition; ∞ with
    any Gaussian), and ``epsilon = min(PLD/RDP/closed-form ε, pure_epsilon)`` — both are upper
    bounds, so their minimum is one. Sampler slack is applied after the ideal composition as
    derived in :mod:`gazeguard.privacy.accounting.loss`: ``ε(δ) = ε_ideal(δ·e^{−S}) + S`` and
    ``δ(ε) = min(1, e^{S}·δ_ideal(ε − S))`` with ``S = Σ count·slack``.

Discretisation (PLD)
    The value discretisation interval is ``d = scale_min/N``: ``scale`` is an event's ideal
    pure ε (``1/ratio`` for Laplace, ε for randomized response and pure events) or ``1/ratio``
    for a Gaussian, and ``N`` points per smallest scale, a power of two (so ``N·d`` is exactly
    ``scale_min``), shrink with the number of releases — 256 up to 16 releases, 128 up to 256,
    64 up to 4096, 32 beyond — so that a single release's δ(ε) is accurate and an hour of 48
    features (10800 releases) stays fast. If some non-Gaussian event's ε is not an exact
    multiple of ``d`` (incommensurate events), ``N`` is 4× larger. Laplace and Gaussian PMFs
    are connect-the-dots (exact at grid points, rounded outwards: pessimistic wherever the loss
    range falls): the Gaussian's is Google's ``dp-accounting``'s, the Laplace one is built here
    in NumPy from its closed-form hockey-stick curve, the same grid and masses as dp-accounting's
    ``from_laplace_mechanism`` (both within round-off of the exact masses; tested), so
    that a plan of Laplace releases never imports dp-accounting or ``scipy.signal`` (~50 MB of
    a headset's memory); randomized-response and pure PMFs are built here with every
    loss rounded up to the grid in exact rational arithmetic (dp-accounting rounds a loss of
    exactly ``k·d``, computed as a difference of logarithms a few ulps above it, to
    ``(k + 1)·d``, overstating ε by ``1/N``).

    Size: if the composed PMF would need more than :data:`PLD_TARGET_POINTS` points (a
    generous estimate from the composition's mean and spread), ``d`` is doubled until it does
    not — only in the composed regime, where the spread is many grid steps wide — and if that
    needs ``d > scale_min/4`` the RDP accountant is used instead. Every step of 10800 Laplace
    releases (an hour of 48 features) uses ~5·10⁴ points; a week of them ~10⁶.

    Monotone in the counts: for a fixed set of events the grids are nested powers of two, and
    a pessimistic PMF on a coarser nested grid has a pointwise larger hockey-stick curve (the
    connect-the-dots curve interpolates the same convex curve through fewer points; privacy
    buckets round further up); composition preserves pointwise order (``δ_{A⊗B}(ε) =
    Σ_a p_a·δ_B(ε − a)`` is monotone in ``δ_B``). So one more release never lowers ε.

    Accuracy, measured against a 64× finer grid and against exact curves (tests, bench): ε at δ
    within 1e-5 (relative) in the composed regime, within 0.5 % for a single Laplace release at
    any δ; in the nearly pure regime of incommensurate events up to ``1/(4N)``, where
    ``min(…, pure ε)`` usually takes over.

Caching
    Results are cached by the canonical multiset (events sorted, zero counts dropped) and δ;
    PLDs per event and discretisation, and the composed curve of the last few multisets, are
    kept in small LRU caches (a PLD can hold 10⁶ doubles). :func:`capacity` results are cached
    by (step, cap, the part of ``already`` that is not a whole multiple of the step), so a ledger
    that calls it before every charge pays one PLD search per session configuration and then a
    dictionary lookup.

    Each composed ε is also kept on disk (:mod:`~gazeguard.privacy.accounting.cache`): a
    restart with the same settings reads it and computes nothing. dp-accounting (with SciPy's
    signal and optimize modules under it) is imported only where a Gaussian enters a PLD or the
    RDP fallback is used. ``epsilon_at``/``delta_at`` of a :class:`Composition` read from disk
    compute its curve when first asked.

Thread safety: the caches are ``functools.lru_cache`` (safe under concurrent calls; a result may
be computed twice). The only I/O is the composition cache's file.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, cast

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting import cache as disk
from gazeguard.privacy.accounting._gaussian import gaussian_delta, gaussian_epsilon
from gazeguard.privacy.accounting.loss import (
    Event,
    GaussianEvent,
    LaplaceEvent,
    Measure,
    PrivacyLoss,
    PureEvent,
    RandomizedResponseEvent,
)

if TYPE_CHECKING:
    from dp_accounting import dp_event  # type: ignore[import-untyped]
    from dp_accounting.pld import privacy_loss_distribution as pld_lib  # type: ignore[import-untyped]

__all__ = [
    "PLD_TARGET_POINTS",
    "Composition",
    "Counts",
    "Method",
    "cache_clear",
    "capacity",
    "compose",
]

log = logging.getLogger("gazeguard.privacy.accounting")

#: event → number of releases.
Counts: TypeAlias = Mapping[Event, int]
#: How a composition was computed.
Method: TypeAlias = Literal["none", "gaussian", "pld", "rdp"]
#: The grid is coarsened (by powers of two) until the composed PLD needs at most this many points.
PLD_TARGET_POINTS = 1 << 20
#: RDP orders: dp-accounting's defaults (``rdp_privacy_accountant.DEFAULT_RDP_ORDERS``, written
#: out so that importing this module does not import dp-accounting) plus large orders for nearly
#: pure compositions.
RDP_ORDERS = (
    *(i / 10.0 for i in range(11, 110)),
    *(float(i) for i in range(11, 64)),
    128.0,
    256.0,
    512.0,
    1024.0,
    2048.0,
    4096.0,
    8192.0,
    16384.0,
    65536.0,
)
#: Probability mass a PLD composition may truncate (moved to the infinite loss: pessimistic).
TAIL_MASS = 1e-15
#: Largest count :func:`capacity` searches up to.
MAX_CAPACITY = 1 << 40

_Key: TypeAlias = tuple[tuple[Event, int], ...]
FloatArray: TypeAlias = npt.NDArray[np.float64]


# --------------------------------------------------------------------------- canonical multiset
def _sort_key(event: Event) -> tuple[str, tuple[tuple[str, float], ...]]:
    return event.kind, tuple(
        sorted((k, float(v)) for k, v in event.to_dict().items() if k != "kind")
    )


def _canonical(counts: Counts, field: str = "counts") -> _Key:
    """Validated ``(event, count)`` pairs, zero counts dropped, in a canonical order."""
    if not isinstance(counts, Mapping):
        raise ConfigError(field, counts, "must be a mapping event -> number of releases")
    items: list[tuple[Event, int]] = []
    for event, count in counts.items():
        if not isinstance(
            event, LaplaceEvent | GaussianEvent | RandomizedResponseEvent | PureEvent
        ):
            raise ConfigError(
                field, event, "keys must be accounting events (LaplaceEvent, GaussianEvent, …)"
            )
        if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 0:
            raise ConfigError(f"{field}[{event}]", count, "must be an integer >= 0 (releases)")
        if count:
            items.append((event, int(count)))
    items.sort(key=lambda ec: _sort_key(ec[0]))
    return tuple(items)


def _pure(key: _Key) -> float:
    return math.fsum(c * e.pure_epsilon for e, c in key)


def _slack(key: _Key) -> float:
    return math.fsum(c * e.slack for e, c in key)


def _rho(key: _Key) -> float | None:
    rhos = [e.rho for e, _ in key]
    if any(r is None for r in rhos):
        return None
    return math.fsum(c * r for (_, c), r in zip(key, rhos, strict=True) if r is not None)


# ------------------------------------------------------------------------------------- curves
class _Curve(Protocol):
    """The ideal (slack-free) hockey-stick curve of a composition."""

    def epsilon(self, delta: float) -> float: ...

    def delta(self, epsilon: float) -> float: ...


class _ZeroCurve:
    def epsilon(self, delta: float) -> float:
        return 0.0

    def delta(self, epsilon: float) -> float:
        return 0.0 if epsilon >= 0 else -math.expm1(epsilon)


@dataclass(frozen=True, slots=True)
class _GaussianCurve:
    mu: float

    def epsilon(self, delta: float) -> float:
        return math.inf if delta <= 0.0 else gaussian_epsilon(delta, self.mu)

    def delta(self, epsilon: float) -> float:
        return gaussian_delta(epsilon, self.mu)


@dataclass(frozen=True, slots=True, eq=False)
class _Pmf:
    """A pessimistic privacy-loss PMF on the grid ``interval·(lower + i)``, plus mass at +∞.

    Per-event PMFs are connect-the-dots (module docstring); composition (FFT convolution) and
    the (ε, δ) queries are done here, vectorised: dp-accounting's own
    composition truncates tails and inverts δ(ε) in Python loops over every grid point.
    """

    interval: float
    lower: int
    probs: FloatArray
    infinity: float

    @classmethod
    def of(cls, pld: pld_lib.PrivacyLossDistribution) -> _Pmf:
        """The (symmetric) PMF of a dp-accounting PLD."""
        dense = pld._pmf_remove.to_dense_pmf()
        probs = np.maximum(np.asarray(dense._probs, dtype=np.float64), 0.0)
        return cls(
            float(dense._discretization),
            int(dense._lower_loss),
            probs,
            float(dense._infinity_mass),
        )

    @property
    def size(self) -> int:
        return int(self.probs.size)

    def compose(self, other: _Pmf) -> _Pmf:
        """The PMF of the sum of the two losses (FFT convolution), tails truncated
        pessimistically: at most :data:`TAIL_MASS`/2 of the lowest losses is moved up onto the
        first kept point, at most :data:`TAIL_MASS`/2 of the highest to +∞."""
        assert self.interval == other.interval
        probs = _convolve(self.probs, other.probs)
        np.maximum(probs, 0.0, out=probs)  # FFT round-off below 0 (~1e-17)
        infinity = self.infinity + other.infinity - self.infinity * other.infinity
        left_mass = np.cumsum(probs)
        right_mass = np.cumsum(probs[::-1])
        left = int(np.searchsorted(left_mass, TAIL_MASS / 2, side="right"))
        right = int(np.searchsorted(right_mass, TAIL_MASS / 2, side="right"))
        right = min(right, probs.size - left - 1)
        kept = probs[left : probs.size - right].copy()
        if left:
            kept[0] += left_mass[left - 1]
        if right:
            infinity += float(right_mass[right - 1])
        return _Pmf(self.interval, self.lower + other.lower + left, kept, infinity)

    def losses(self) -> FloatArray:
        return (self.lower + np.arange(self.size, dtype=np.float64)) * self.interval

    def delta(self, epsilon: float) -> float:
        """``δ(ε) = P[L = ∞] + Σ_{L > ε} p_L·(1 − e^{ε − L})``."""
        losses = self.losses()
        above = losses > epsilon
        gap = epsilon - losses[above]
        return min(self.infinity + float(np.dot(-np.expm1(gap), self.probs[above])), 1.0)

    def epsilon(self, delta: float) -> float:
        """The smallest ``ε ≥ 0`` with :meth:`delta` ``(ε) ≤ δ`` (exact on this PMF: between
        grid points ``δ(ε) = A − e^ε·B`` with A, B the mass and ``Σ p·e^{−L}`` above)."""
        if self.infinity > delta:
            return math.inf
        losses = self.losses()
        pos = losses > 0.0
        lp, pp = losses[pos], self.probs[pos]
        # suffix sums A[j] = P[L = ∞] + Σ_{k≥j} p_k and, in log space (losses reach hundreds),
        # log B[j] = log Σ_{k≥j} p_k e^{−L_k}
        a = self.infinity + np.concatenate((np.cumsum(pp[::-1])[::-1], [0.0]))
        with np.errstate(divide="ignore"):
            terms = np.log(pp) - lp
        log_b = np.concatenate((np.logaddexp.accumulate(terms[::-1])[::-1], [-np.inf]))
        if a[0] - math.exp(log_b[0]) <= delta:
            return 0.0
        at_grid = a[1:] - np.exp(lp + log_b[1:])  # δ(L_j), non-increasing in j; exponent ≤ 0
        j = int(np.argmax(at_grid <= delta))  # exists: the last value is P[L = ∞] ≤ δ
        lo = lp[j - 1] if j else 0.0
        eps = math.log(a[j] - delta) - float(log_b[j]) if a[j] > delta else float(lp[j])
        return float(min(max(eps, lo), lp[j]))


@dataclass(frozen=True, slots=True)
class _PldCurve:
    pmf: _Pmf

    @property
    def interval(self) -> float:
        return self.pmf.interval

    def epsilon(self, delta: float) -> float:
        return self.pmf.epsilon(delta)

    def delta(self, epsilon: float) -> float:
        return self.pmf.delta(epsilon)


@dataclass(frozen=True, slots=True)
class _RdpCurve:
    orders: tuple[float, ...]
    rdp: tuple[float, ...]

    def epsilon(self, delta: float) -> float:
        if delta <= 0.0:
            return math.inf
        return float(_rdp_lib().compute_epsilon(self.orders, self.rdp, delta)[0])

    def delta(self, epsilon: float) -> float:
        if epsilon < 0.0:
            return 1.0
        return float(_rdp_lib().compute_delta(self.orders, self.rdp, epsilon)[0])


# dp-accounting (and SciPy's signal and optimize modules under it) costs ~0.6 s and ~50 MB to
# import: imported only for a Gaussian inside a PLD and for RDP, never for Laplace, randomized
# response or pure events, and never on a restart that finds its compositions on disk (``cache``).
def _rdp_lib() -> Any:
    from dp_accounting.rdp import rdp_privacy_accountant  # type: ignore[import-untyped]  # noqa: PLC0415 - heavy, see above

    return rdp_privacy_accountant


def _pld_lib() -> Any:
    from dp_accounting.pld import privacy_loss_distribution  # noqa: PLC0415 - heavy

    return privacy_loss_distribution


def _gaussian_mu(key: _Key) -> float:
    return math.sqrt(math.fsum(c / e.ratio**2 for e, c in key if isinstance(e, GaussianEvent)))


def _scale(event: Event) -> float:
    """The natural privacy-loss scale of one release (pure ε; ``1/ratio`` for a Gaussian)."""
    return 1.0 / event.ratio if isinstance(event, GaussianEvent) else event.ideal_epsilon


def pld_points_per_scale(releases: int, aligned: bool) -> int:
    """``N`` of the discretisation (module docstring), a power of two non-increasing in
    ``releases``."""
    n = 256 if releases <= 16 else 128 if releases <= 256 else 64 if releases <= 4096 else 32
    return n if aligned else 4 * n


def _multiple(value: float, interval: float) -> bool:
    """Whether ``value`` is exactly an integer multiple of ``interval`` (rational arithmetic)."""
    q = Fraction(value) / Fraction(interval)
    return q.denominator == 1


def pld_interval(key: _Key) -> float | None:
    """The PLD value discretisation interval for a canonical multiset, ``None`` where the RDP
    accountant must be used (module docstring)."""
    releases = sum(c for _, c in key)
    smallest = min(_scale(e) for e, _ in key)
    aligned = smallest / pld_points_per_scale(releases, aligned=True)
    others = [e.ideal_epsilon for e, _ in key if not isinstance(e, GaussianEvent)]
    aligned_ok = all(_multiple(x, aligned) for x in others)
    interval = aligned if aligned_ok else smallest / pld_points_per_scale(releases, False)
    while _pld_points(key, interval) > PLD_TARGET_POINTS:
        interval *= 2.0
        if interval > smallest / 4.0:
            return None
    return interval


def _round_up(loss: float, interval: float) -> int:
    """The smallest ``i`` with ``i·interval ≥ loss``, exactly."""
    q = Fraction(loss) / Fraction(interval)
    return -((-q.numerator) // q.denominator)


def _rr_pmf(epsilon: float, classes: int, interval: float) -> _Pmf:
    """k-ary randomized response (REPLACE_ONE): losses +ε, −ε, 0 with probabilities
    ``e^ε/Z``, ``1/Z``, ``(k−2)/Z`` (``Z = e^ε + k − 1``), each loss rounded up to the grid."""
    x = math.exp(-epsilon)
    z = 1.0 + (classes - 1) * x  # Z·e^{−ε}
    points = {_round_up(epsilon, interval): 1.0 / z}
    minus = _round_up(-epsilon, interval)
    points[minus] = points.get(minus, 0.0) + x / z
    if classes > 2:
        points[0] = points.get(0, 0.0) + (classes - 2) * x / z
    lower = min(points)
    probs = np.zeros(max(points) - lower + 1)
    for i, p in points.items():
        probs[i - lower] += p
    return _Pmf(interval, lower, probs, 0.0)


def _laplace_pmf(ratio: float, interval: float) -> _Pmf:
    """The Laplace mechanism's pessimistic connect-the-dots PMF (noise scale ``ratio`` ×
    sensitivity), as dp-accounting's ``from_laplace_mechanism`` builds it (Doroshenko et al.
    2022, Algorithm 1 on the contiguous grid ``k·interval``, ``k`` from ``⌊−ε0/interval⌋`` to
    ``⌈ε0/interval⌉``, ``ε0 = 1/ratio``), from the closed-form hockey-stick curve

        δ(ε) = 1 − e^{min((ε − ε0)/2, ε)}   for ε ≤ ε0, and 0 above

    (the privacy loss is ε0 on x ≤ 0, −ε0 on x ≥ 1 and linear between, so for |ε| ≤ ε0 the
    region L > ε is x < (1 − ε·ratio)/2). Built here, in NumPy, so that composing Laplace
    releases imports neither dp-accounting nor SciPy's signal module (~50 MB); a test holds it
    to dp-accounting's PMF.
    """
    e0 = 1.0 / ratio
    lower, upper = math.floor(-e0 / interval), math.ceil(e0 / interval)
    eps = np.arange(lower, upper + 1, dtype=np.float64) * interval
    deltas = np.clip(-np.expm1(np.minimum((eps - e0) / 2.0, eps)), 0.0, 1.0)
    deltas = np.minimum.accumulate(deltas)
    steps = np.diff(deltas)
    em1 = math.expm1(interval)
    probs = np.empty_like(deltas)
    probs[0] = 1.0 - deltas[0] + steps[0] / em1
    probs[1:-1] = (steps[1:] - steps[:-1] * math.exp(interval)) / em1
    probs[-1] = steps[-1] / math.expm1(-interval)
    np.maximum(probs, 0.0, out=probs)
    return _Pmf(interval, lower, probs, float(deltas[-1]) + 0.0)  # + 0.0: never −0.0


def _fast_length(n: int) -> int:
    """The smallest 5-smooth integer ≥ ``n`` (a length pocketfft transforms fast)."""
    best = 1 << max(n - 1, 0).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            # the smallest power of two that lifts p35 to at least n
            m = p35 << max(0, (-(-n // p35) - 1).bit_length())
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


def _convolve(a: FloatArray, b: FloatArray) -> FloatArray:
    """The full linear convolution of two PMFs by real FFTs (NumPy's pocketfft), length
    ``a.size + b.size − 1``; round-off ~1e-17 absolute, as ``scipy.signal.fftconvolve``."""
    n = a.size + b.size - 1
    if min(a.size, b.size) <= 32:  # a short kernel: the direct sum is cheaper and more accurate
        return np.convolve(a, b)
    size = _fast_length(n)
    out = np.fft.irfft(np.fft.rfft(a, size) * np.fft.rfft(b, size), size)
    return out[:n]


def _pld_points(key: _Key, interval: float) -> float:
    """A generous estimate of the composed PLD's support size (points)."""
    pure = mean = var = 0.0
    for e, c in key:
        s = _scale(e)
        pure += c * (math.inf if isinstance(e, GaussianEvent) else s)
        mean += c * s * s / 2.0  # KL ≤ ε²/2 for ε-DP; = μ²/2 for a Gaussian
        var += c * s * s
    extent = min(pure, mean + 12.0 * math.sqrt(var) + 40.0 * max(_scale(e) for e, _ in key))
    return 2.0 * extent / interval


def _binary_noise(epsilon: float) -> float:
    """dp-accounting's ``p`` of binary randomized response with parameter ε."""
    return RandomizedResponseEvent(epsilon, 2).noise_parameter


@functools.lru_cache(maxsize=64)
def _base_pmf(event: Event, interval: float) -> _Pmf:
    """The pessimistic PMF of one release (a Gaussian here stands for all merged ones)."""
    if isinstance(event, RandomizedResponseEvent):
        return _rr_pmf(event.epsilon, event.classes, interval)
    if isinstance(event, PureEvent):  # the canonical ε-DP pair is binary randomized response
        return _rr_pmf(event.epsilon, 2, interval)
    if isinstance(event, LaplaceEvent):
        return _laplace_pmf(event.ratio, interval)
    pld = _pld_lib().from_gaussian_mechanism(
        event.ratio, sensitivity=1.0, value_discretization_interval=interval
    )
    return _Pmf.of(pld)


@functools.lru_cache(maxsize=24)
def _power(event: Event, j: int, interval: float) -> _Pmf:
    """The ``2**j``-fold composition of ``event``'s PLD by repeated squaring (cached: every
    count's composition reuses the squarings of the counts before it, unchanged)."""
    if j == 0:
        return _base_pmf(event, interval)
    half = _power(event, j - 1, interval)
    return half.compose(half)


@functools.lru_cache(maxsize=8)
def _self_composed(event: Event, count: int, interval: float) -> _Pmf:
    """``count``-fold composition by repeated squaring.

    dp-accounting's ``self_compose`` sizes one FFT from a Chernoff bound whose orders are tied
    to the input's support, which for many releases approaches ``count × support`` points
    (7·10⁷ for 10⁷ releases). Squaring truncates after every step instead, so supports stay
    near the composed distribution's spread: ~2.7·10⁴ points for 10800 Laplace releases at 16
    points per ε0, ~3.5·10⁵ for 1.8·10⁶ (a week of 48 features). Every truncation moves at most
    :data:`TAIL_MASS` upwards or to +∞ (pessimistic: δ can only grow); over a composition that
    adds at most about ``count·TAIL_MASS`` to δ.

    The squarings (:func:`_power`) are shared by every count at one discretisation, so a
    session's next count costs only the products of its set bits; the result is the same,
    operation for operation, as squaring afresh.
    """
    out: _Pmf | None = None
    j = 0
    while count:
        if count & 1:
            base = _power(event, j, interval)
            out = base if out is None else out.compose(base)
        count >>= 1
        j += 1
    assert out is not None
    return out


def _pld_curve(key: _Key) -> _PldCurve | None:
    """The composed PLD, or ``None`` if no grid both fits and resolves the releases."""
    interval = pld_interval(key)
    if interval is None:
        log.info("PLD grid would be too coarse for %s: using RDP", key)
        return None
    parts = [_self_composed(e, c, interval) for e, c in key if not isinstance(e, GaussianEvent)]
    if any(isinstance(e, GaussianEvent) for e, _ in key):  # one exact Gaussian for all of them
        parts.append(_base_pmf(GaussianEvent(1.0 / _gaussian_mu(key)), interval))
    out = parts[0]
    for p in parts[1:]:
        out = out.compose(p)
    return _PldCurve(out)


def _dp_event(event: Event) -> dp_event.DpEvent:
    from dp_accounting import dp_event  # noqa: PLC0415 - heavy

    if isinstance(event, LaplaceEvent):
        return dp_event.LaplaceDpEvent(event.ratio)
    if isinstance(event, GaussianEvent):
        return dp_event.GaussianDpEvent(event.ratio)
    if isinstance(event, RandomizedResponseEvent):
        return dp_event.RandomizedResponseDpEvent(event.noise_parameter, event.classes)
    return dp_event.RandomizedResponseDpEvent(_binary_noise(event.epsilon), 2)


def _rdp_curve(key: _Key) -> _RdpCurve:
    rdp_lib = _rdp_lib()
    acc = rdp_lib.RdpAccountant(
        list(RDP_ORDERS), neighboring_relation=rdp_lib.NeighborRel.REPLACE_ONE
    )
    for e, c in key:
        acc.compose(_dp_event(e), c)
    return _RdpCurve(RDP_ORDERS, tuple(float(x) for x in acc.rdp))


MethodRequest: TypeAlias = Literal["auto", "pld", "rdp"]


@functools.lru_cache(maxsize=8)
def _curve(key: _Key, method: MethodRequest) -> tuple[_Curve, Method, float | None]:
    """(ideal curve, method used, PLD interval) for a canonical multiset."""
    if not key:
        return _ZeroCurve(), "none", None
    if method == "auto" and all(isinstance(e, GaussianEvent) for e, _ in key):
        return _GaussianCurve(_gaussian_mu(key)), "gaussian", None
    if method != "rdp":
        try:
            curve = _pld_curve(key)
        except (ValueError, ArithmeticError, MemoryError) as exc:
            if method == "pld":
                raise
            log.warning("PLD composition failed (%s: %s); using RDP", type(exc).__name__, exc)
            curve = None
        if curve is not None:
            return curve, "pld", curve.interval
        if method == "pld":
            raise ConfigError(
                "method",
                method,
                f"a PLD grid of at most {PLD_TARGET_POINTS} points cannot resolve these "
                "releases; use 'auto' (RDP)",
            )
    return _rdp_curve(key), "rdp", None


# -------------------------------------------------------------------------------- composition
@dataclass(frozen=True, slots=True)
class Composition:
    """The privacy loss of a multiset of releases (see the module docstring).

    Attributes:
        counts: the canonical multiset ``((event, count), …)``.
        delta: the δ at which :attr:`epsilon` is given.
        epsilon: ε at :attr:`delta` (upper bound; ``min`` of the method's ε and pure ε).
        pure_epsilon: sequential composition ``Σ count·pure ε`` (``inf`` with a Gaussian).
        rho: ``Σ count·ρ`` if every event has a ρ, else ``None``.
        slack: total sampler slack ``S = Σ count·slack`` (already included in the numbers).
        method: ``"none"``, ``"gaussian"``, ``"pld"`` or ``"rdp"``.
        interval: the PLD value discretisation interval (``None`` unless ``method == "pld"``).
    """

    counts: _Key
    delta: float
    epsilon: float
    pure_epsilon: float
    rho: float | None
    slack: float
    method: Method
    interval: float | None
    _request: MethodRequest = "auto"

    @property
    def releases(self) -> int:
        """Total number of releases."""
        return sum(c for _, c in self.counts)

    def _ideal(self) -> _Curve:
        return _curve(self.counts, self._request)[0]

    def epsilon_at(self, delta: float) -> float:
        """ε at another δ ∈ [0, 1) on the same composition (δ = 0 gives the pure ε)."""
        d = _check_delta(delta)
        return _epsilon_at(self._ideal(), d, self.slack, self.pure_epsilon)

    def delta_at(self, epsilon: float) -> float:
        """The smallest δ this composition is (ε, δ)-DP for (an upper bound), ε >= 0."""
        e = float(epsilon)
        if not (e >= 0.0):  # also NaN
            raise ConfigError("epsilon", epsilon, "must be >= 0")
        if e >= self.pure_epsilon:
            return 0.0
        if e - self.slack < 0.0:
            return 1.0
        return min(1.0, math.exp(self.slack) * self._ideal().delta(e - self.slack))

    def within(self, cap: PrivacyLoss) -> bool:
        """Whether the composition stays within ``cap`` (pure: pure ε; approx: ε at the cap's δ;
        zCDP: ρ, ``False`` if there is none)."""
        return _within(self.counts, cap, self._request)

    def __str__(self) -> str:
        rho = "" if self.rho is None else f", ρ={self.rho:.6g}"
        return (
            f"ε={self.epsilon:.6g} at δ={self.delta:.3g} ({self.method}), "
            f"pure ε={self.pure_epsilon:.6g}{rho}, {self.releases} releases"
        )


def _check_delta(delta: float) -> float:
    d = float(delta)
    if not (0.0 <= d < 1.0):
        raise ConfigError("delta", delta, "δ must be in [0, 1), e.g. 1e-6")
    return d


def _epsilon_at(curve: _Curve, delta: float, slack: float, pure: float) -> float:
    if delta == 0.0:
        return pure
    ideal = curve.epsilon(delta * math.exp(-slack))
    return min(max(ideal, 0.0) + slack, pure)


@functools.lru_cache(maxsize=8192)
def _compose(key: _Key, delta: float, method: MethodRequest) -> Composition:
    pure, slack = _pure(key), _slack(key)
    hit = disk.lookup(key, delta, method) if key else None
    if hit is not None:
        epsilon, used, interval = hit
    else:
        curve, used, interval = _curve(key, method)
        epsilon = _epsilon_at(curve, delta, slack, pure)
        if key:
            disk.store(key, delta, method, epsilon=epsilon, used=used, interval=interval)
    return Composition(
        counts=key,
        delta=delta,
        epsilon=epsilon,
        pure_epsilon=pure,
        rho=_rho(key),
        slack=slack,
        method=cast(Method, used),  # the cache holds only Method values (checked on load)
        interval=interval,
        _request=method,
    )


def compose(counts: Counts, delta: float, *, method: MethodRequest = "auto") -> Composition:
    """Compose ``counts`` (event → number of releases) into a :class:`Composition` at ``delta``.

    Args:
        counts: releases per event; counts are integers >= 0 (0 is ignored).
        delta: δ ∈ [0, 1) at which :attr:`Composition.epsilon` is reported.
        method: ``"auto"`` (closed form for Gaussians only, else PLD, RDP if the PLD is too
            large), or force ``"pld"`` / ``"rdp"`` (for comparisons).

    Raises:
        ConfigError: a key that is not an event, a negative or non-integer count, δ outside
            [0, 1), or ``method="pld"`` where the PLD would be too large.
    """
    if method not in ("auto", "pld", "rdp"):
        raise ConfigError("method", method, "must be 'auto', 'pld' or 'rdp'")
    return _compose(_canonical(counts), _check_delta(delta), method)


# ----------------------------------------------------------------------------------- capacity
def _within(key: _Key, cap: PrivacyLoss, method: MethodRequest) -> bool:
    if cap.measure is Measure.PURE:
        assert cap.epsilon is not None
        return _pure(key) <= cap.epsilon
    if cap.measure is Measure.ZCDP:
        assert cap.rho is not None
        rho = _rho(key)
        return rho is not None and rho <= cap.rho
    assert cap.epsilon is not None
    assert cap.delta is not None
    if _pure(key) <= cap.epsilon:  # cheap and exact: no curve needed
        return True
    return _compose(key, cap.delta, method).epsilon <= cap.epsilon


def _add(base: _Key, step: _Key, times: int) -> _Key:
    total: dict[Event, int] = dict(base)
    for e, c in step:
        total[e] = total.get(e, 0) + c * times
    return _canonical(total)


@functools.lru_cache(maxsize=4096)
def _capacity_from(step: _Key, cap: PrivacyLoss, base: _Key, method: MethodRequest) -> int:
    """Largest c >= 0 with ``base + c·step`` within ``cap``; -1 if ``base`` itself is not."""
    if not _within(base, cap, method):
        return -1
    lo, hi = 0, 1
    while _within(_add(base, step, hi), cap, method):
        lo, hi = hi, hi * 2
        if hi > MAX_CAPACITY:
            return MAX_CAPACITY
    while hi - lo > 1:  # invariant: lo fits, hi does not
        mid = (lo + hi) // 2
        if _within(_add(base, step, mid), cap, method):
            lo = mid
        else:
            hi = mid
    return lo


def capacity(
    step: Event | Counts,
    cap: PrivacyLoss,
    already: Counts | None = None,
    *,
    method: MethodRequest = "auto",
) -> int:
    """The largest number ``c`` of further ``step``\\s such that ``already + c·step`` stays
    within ``cap`` (0 if none fits, or if ``already`` alone exceeds the cap).

    ``step`` is one event (one release) or a multiset (e.g. everything one chunk releases). The
    answer is consistent with :func:`compose`: ``compose(already + c·step).within(cap)`` holds
    and ``compose(already + (c+1)·step).within(cap)`` does not (binary search on exactly that
    predicate). Results are cached by ``(step, cap, base)`` where ``already = base + k·step``
    with ``k`` as large as possible, so ``capacity(step, cap, already + step)`` is
    ``capacity(step, cap, already) − 1`` from the cache. Searches stop at
    :data:`MAX_CAPACITY`.

    Raises:
        ConfigError: an invalid step, count or method.
    """
    if method not in ("auto", "pld", "rdp"):
        raise ConfigError("method", method, "must be 'auto', 'pld' or 'rdp'")
    if not isinstance(cap, PrivacyLoss):
        raise ConfigError("cap", cap, "must be a PrivacyLoss (PrivacyLoss.approx(10, 1e-6), …)")
    if isinstance(step, LaplaceEvent | GaussianEvent | RandomizedResponseEvent | PureEvent):
        step_key: _Key = ((step, 1),)
    else:
        step_key = _canonical(step, "step")
    if not step_key:
        raise ConfigError("step", step, "must release at least one event")
    key = _canonical({} if already is None else already, "already")
    have = dict(key)
    k = min(have.get(e, 0) // c for e, c in step_key)
    base = _add(key, step_key, -k) if k else key
    return max(0, _capacity_from(step_key, cap, base, method) - k)


def cache_clear(*, disk_too: bool = True) -> None:
    """Empty every cache of this module and (``disk_too``) the composition cache on disk (for
    cold-cache benchmarks and tests; ``disk_too=False``: as a new process finds them)."""
    for f in (_compose, _curve, _capacity_from, _self_composed, _power, _base_pmf):
        f.cache_clear()
    if disk_too:
        disk.clear()
    else:
        disk.forget()
