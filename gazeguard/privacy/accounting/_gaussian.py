"""Exact (ε, δ) of the Gaussian pair, the analytic Gaussian mechanism, and zCDP conversions.

Shared by :mod:`~gazeguard.privacy.accounting.accountant` (closed-form composition of Gaussians) and
:mod:`~gazeguard.privacy.accounting.calibrate`; re-exported from the latter.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from gazeguard.core.errors import ConfigError

__all__ = [
    "analytic_gaussian_sigma",
    "epsilon_to_rho",
    "gaussian_delta",
    "gaussian_epsilon",
    "rho_to_epsilon",
]


@functools.cache
def _special() -> Any:
    """SciPy's ``special`` (``log_ndtr``, ``ndtri``), imported where a Gaussian's (ε, δ) is first
    computed (Gaussian noise, zCDP caps, and the starting point of a Laplace calibration): ~25 MB
    that a sidecar restarting with its compositions on disk never loads."""
    from scipy import special  # noqa: PLC0415 - heavy: only where Gaussian math runs (docstring)

    return special


_BISECT = 200  # bisection steps: far more than needed to reach adjacent doubles


def _largest_within(
    f: Callable[[float], float],
    limit: float,
    *,
    start: tuple[float, float],
    factors: tuple[float, float],
    midpoint: Callable[[float, float], float | None],
    too_small: Callable[[], ConfigError],
) -> float:
    """The largest ``x > 0`` found with ``f(x) ≤ limit``, for ``f`` increasing: the bracket
    ``start = (lo, hi)`` is widened (``lo`` divided by ``factors[0]`` while ``f(lo) > limit``,
    raising ``too_small()`` below 1e-300; ``hi`` multiplied by ``factors[1]`` while
    ``f(hi) ≤ limit``), then bisected at ``midpoint(lo, hi)`` (``None``: close enough) until
    adjacent doubles. Returns the bracket's ``lo``, which satisfies the bound as evaluated."""
    lo, hi = start
    while f(lo) > limit:
        lo /= factors[0]
        if lo < 1e-300:
            raise too_small()
    while f(hi) <= limit:
        lo, hi = hi, hi * factors[1]
    return _bisect(lo, hi, lambda x: f(x) <= limit, midpoint)[0]


def _bisect(
    lo: float,
    hi: float,
    goes_low: Callable[[float], bool],
    midpoint: Callable[[float, float], float | None] = lambda lo, hi: 0.5 * (lo + hi),
) -> tuple[float, float]:
    """The bracket ``(lo, hi)`` narrowed: ``midpoint(lo, hi)`` replaces ``lo`` where
    ``goes_low`` holds there, else ``hi``; at most :data:`_BISECT` steps, until the midpoint is
    ``None`` (close enough) or no longer strictly inside (adjacent doubles)."""
    for _ in range(_BISECT):
        mid = midpoint(lo, hi)
        if mid is None or mid <= lo or mid >= hi:
            break
        if goes_low(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def _check(field: str, value: float, *, lo: float = 0.0, strict: bool = True) -> float:
    v = float(value)
    ok = math.isfinite(v) and (v > lo if strict else v >= lo)
    if not ok:
        op = ">" if strict else ">="
        raise ConfigError(field, value, f"must be finite and {op} {lo:g}")
    return v


def _check_delta(value: float, field: str = "delta") -> float:
    v = float(value)
    if not (0.0 < v < 1.0):
        raise ConfigError(field, value, "δ must be in (0, 1), e.g. 1e-6")
    return v


def gaussian_delta(epsilon: float, mu: float) -> float:
    """Hockey-stick divergence ``δ(ε)`` of the pair ``(N(0,1), N(μ,1))`` (exact).

    ``δ(ε) = Φ(μ/2 − ε/μ) − e^ε·Φ(−μ/2 − ε/μ)`` (Balle & Wang 2018, Thm. 8), evaluated in log
    space (``log Φ`` via ``scipy.special.log_ndtr``) so that tiny δ keep their digits. A
    composition of Gaussian releases with ratios ``r_i`` (``σ_i = r_i·Δ2``) is exactly this pair
    with ``μ = √(Σ 1/r_i²)`` (the product of Gaussian pairs is a rotated 1-D pair). ``ε`` may be
    negative.

    Args:
        epsilon: ε (any finite real).
        mu: ``Δ/σ`` of the (composed) pair, finite and > 0.
    """
    mu = _check("mu", mu)
    eps = float(epsilon)
    if math.isnan(eps):
        raise ConfigError("epsilon", epsilon, "must be a number")
    if eps == math.inf:
        return 0.0
    la = float(_special().log_ndtr(mu / 2.0 - eps / mu))
    lb = float(_special().log_ndtr(-mu / 2.0 - eps / mu))
    x = min(eps + lb - la, 0.0)  # ≤ 0 in exact arithmetic (δ ≥ 0)
    return max(math.exp(la) * -math.expm1(x), 0.0)


def gaussian_epsilon(delta: float, mu: float) -> float:
    """Smallest ``ε ≥ 0`` with :func:`gaussian_delta` ``(ε, μ) ≤ δ`` (bisection to adjacent
    doubles; the returned ε satisfies the inequality as evaluated).

    Args:
        delta: δ in (0, 1).
        mu: as in :func:`gaussian_delta`.
    """
    delta = _check_delta(delta)
    mu = _check("mu", mu)
    if gaussian_delta(0.0, mu) <= delta:
        return 0.0
    # δ(ε) ≤ Φ(μ/2 − ε/μ), so ε = μ²/2 + μ·z_{1−δ} is feasible.
    hi = mu * mu / 2.0 + mu * float(-_special().ndtri(delta))
    while gaussian_delta(hi, mu) > delta:  # guard against rounding in the bound
        hi = hi * 1.0625 + 1e-12
    return _bisect(0.0, hi, lambda eps: gaussian_delta(eps, mu) > delta)[1]


def mu_for(epsilon: float, delta: float) -> float:
    """Largest ``μ`` with ``gaussian_delta(ε, μ) ≤ δ`` (δ increases with μ)."""
    return _largest_within(
        lambda mu: gaussian_delta(epsilon, mu),
        delta,
        start=(1e-3, 1.0),
        factors=(16.0, 16.0),
        midpoint=lambda lo, hi: math.sqrt(lo * hi) if hi / lo > 1.5 else 0.5 * (lo + hi),
        too_small=lambda: ConfigError("delta", delta, "too small to be met by any Gaussian noise"),
    )


def _log_phi(x: float) -> float:
    """``ln Φ(x)`` (standard normal CDF), accurate in both tails (scipy's ``log_ndtr``)."""
    return float(_special().log_ndtr(x))


def _analytic_delta_upper(s: float, epsilon: float) -> float:
    """A certified upper bound on the analytic Gaussian's ``δ(ε)`` at noise multiplier ``s``:
    ``δ = Φ(1/(2s) − εs) − e^ε·Φ(−1/(2s) − εs)`` (Balle & Wang 2018, Theorem 8), evaluated as
    ``Φ(a)·(−expm1(ε + lnΦ(b) − lnΦ(a)))`` with every log-probability moved by a generous bound
    on its floating-point error in the direction that enlarges δ."""
    a = 0.5 / s - epsilon * s
    b = -0.5 / s - epsilon * s
    # Error of a, b (a few ulps of their terms) moves lnΦ by ≤ |d lnΦ/dx|·err ≤ (|x| + 1)·err;
    # scipy's log_ndtr is accurate to well within 2^-46 relative (absolute in lnΦ).
    arg_err = 4.0 * 2.0**-52 * (0.5 / s + epsilon * s)
    la = _log_phi(a)
    lb = _log_phi(b)
    e_a = 2.0**-46 * (1.0 + abs(la)) + (abs(a) + 1.0) * arg_err
    e_b = 2.0**-46 * (1.0 + abs(lb)) + (abs(b) + 1.0) * arg_err + 2.0**-52 * epsilon
    x = epsilon + lb - la - e_a - e_b
    if x >= 0.0:  # the error bounds cannot certify δ > 0 here: refuse to certify anything
        return math.inf
    return math.exp(la + e_a) * -math.expm1(x) * (1.0 + 2.0**-50)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest σ (to within a relative 2^-45) for which the Gaussian mechanism with L2
    sensitivity ``sensitivity`` is (ε, δ)-DP — the analytic Gaussian mechanism of Balle & Wang
    (ICML 2018, Theorem 8): ``N(0, σ²)`` noise is (ε, δ)-DP iff
    ``Φ(Δ/(2σ) − εσ/Δ) − e^ε·Φ(−Δ/(2σ) − εσ/Δ) ≤ δ``.

    The left side depends on ``s = σ/Δ`` only and decreases in ``s``; we double ``s`` until a
    certified upper bound on it (:func:`_analytic_delta_upper`) is ≤ δ and then bisect, always
    returning the upper end: the returned σ satisfies the condition even with the evaluation's
    rounding error counted against it. Valid in any dimension (the worst pair of neighbours
    reduces to one dimension along ``u − u'``).

    Args:
        epsilon: ε > 0, finite.
        delta: δ in (0, 1).
        sensitivity: L2 sensitivity Δ > 0, finite (any unit; σ comes out in the same unit).

    Raises:
        ConfigError: naming the invalid argument.
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError("epsilon", epsilon, "must be finite and > 0")
    if not 0.0 < delta < 1.0:
        raise ConfigError("delta", delta, "must lie strictly between 0 and 1")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ConfigError("sensitivity", sensitivity, "must be finite and > 0")
    lo, hi = 0.0, 1.0
    while _analytic_delta_upper(hi, epsilon) > delta:
        lo, hi = hi, 2.0 * hi
        if hi > 2.0**60:  # unreachable for δ > 0: δ(s) ≤ 1/(s·√(2π)) → 0
            raise ConfigError("delta", delta, "too small to calibrate")
    if lo == 0.0:
        lo = hi / 2.0
        while lo > 2.0**-60 and _analytic_delta_upper(lo, epsilon) <= delta:
            hi, lo = lo, lo / 2.0
    while hi - lo > 2.0**-45 * hi:
        mid = 0.5 * (lo + hi)
        if _analytic_delta_upper(mid, epsilon) <= delta:
            hi = mid
        else:
            lo = mid
    return hi * sensitivity


def _rho_eps_at(alpha: float, rho: float, log_inv_delta: float) -> float:
    """ε bound from RDP ``αρ`` at order α (Canonne–Kamath–Steinke 2020 Prop. 12; Asoodeh et al.
    2021): ``αρ + (log(1/δ) + (α−1)·log(1−1/α) − log α)/(α−1)``."""
    am1 = alpha - 1.0
    return alpha * rho + (log_inv_delta + am1 * math.log1p(-1.0 / alpha) - math.log(alpha)) / am1


def rho_to_epsilon(rho: float, delta: float) -> float:
    """ε such that ρ-zCDP implies (ε, δ)-DP, with the tight conversion.

    ``ε = inf_{α>1} αρ + (log(1/δ) + (α−1)·log(1 − 1/α) − log α)/(α − 1)`` (Canonne, Kamath &
    Steinke 2020, Prop. 12 / Cor. 13; Asoodeh, Liao, Calmon, Kosut & Sankar 2021), which beats
    the classical ``ρ + 2√(ρ log(1/δ))``. The infimum is found on a log-spaced grid of ``α − 1``
    refined by golden-section search; any α gives a valid bound, so the result is one.

    Args:
        rho: ρ, finite and > 0.
        delta: δ in (0, 1).
    """
    rho = _check("rho", rho)
    delta = _check_delta(delta)
    lid = -math.log(delta)
    xs = np.linspace(-12.0, 25.0, 371)  # x = ln(α − 1)
    vals = [_rho_eps_at(1.0 + math.exp(x), rho, lid) for x in xs]
    i = int(np.argmin(vals))
    a, b = float(xs[max(i - 1, 0)]), float(xs[min(i + 1, len(xs) - 1)])
    g = (math.sqrt(5.0) - 1.0) / 2.0
    best = vals[i]
    for _ in range(80):
        c, d = b - g * (b - a), a + g * (b - a)
        fc = _rho_eps_at(1.0 + math.exp(c), rho, lid)
        fd = _rho_eps_at(1.0 + math.exp(d), rho, lid)
        best = min(best, fc, fd)
        if fc < fd:
            b = d
        else:
            a = c
    return max(best, 0.0)


def epsilon_to_rho(epsilon: float, delta: float) -> float:
    """The largest ρ such that ρ-zCDP implies (ε, δ)-DP under :func:`rho_to_epsilon`
    (its inverse; bisection, returns a ρ with ``rho_to_epsilon(ρ, δ) ≤ ε``).

    Args:
        epsilon: ε, finite and > 0.
        delta: δ in (0, 1).
    """
    epsilon = _check("epsilon", epsilon)
    delta = _check_delta(delta)
    return _largest_within(
        lambda rho: rho_to_epsilon(rho, delta),
        epsilon,
        start=(1e-12, 1.0),
        factors=(1e3, 4.0),
        midpoint=lambda lo, hi: None if hi / lo - 1.0 < 1e-13 else math.sqrt(lo * hi),
        too_small=lambda: ConfigError("epsilon", epsilon, "too small for any ρ at this δ"),
    )
