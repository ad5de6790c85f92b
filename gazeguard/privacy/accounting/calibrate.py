"""Noise from a budget, Gaussian conversions, and the unit of privacy in gaze time.

* :func:`calibrate` — the smallest noise-to-sensitivity ratio such that ``releases`` identical
  releases compose to at most a given (ε, δ) (or pure ε, or ρ).
* :func:`analytic_gaussian_sigma`, :func:`gaussian_delta`, :func:`gaussian_epsilon` — the exact
  Gaussian pair (Balle & Wang 2018); :func:`rho_to_epsilon` / :func:`epsilon_to_rho` — the tight
  zCDP → (ε, δ) conversion and its inverse.
* :func:`releases_within` — how many releases fit in a stretch of gaze time (the release plan's
  one counting function).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Literal, TypeAlias

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting import cache as disk
from gazeguard.privacy.accounting._gaussian import (
    analytic_gaussian_sigma,
    epsilon_to_rho,
    gaussian_delta,
    gaussian_epsilon,
    mu_for,
    rho_to_epsilon,
)
from gazeguard.privacy.accounting.accountant import compose
from gazeguard.privacy.accounting.loss import (
    Event,
    GaussianEvent,
    LaplaceEvent,
    Measure,
    PrivacyLoss,
)

__all__ = [
    "Family",
    "analytic_gaussian_sigma",
    "calibrate",
    "epsilon_to_rho",
    "gaussian_delta",
    "gaussian_epsilon",
    "releases_within",
    "rho_to_epsilon",
]

#: Noise family to calibrate: Laplace accounted with PLD, Gaussian (exact), or Laplace accounted
#: by pure sequential composition.
Family: TypeAlias = Literal["laplace", "gaussian", "sequential"]

#: Relative precision of the Laplace search (the returned ratio is at most this much too large).
LAPLACE_RTOL = 1e-4


def _releases(releases: int) -> int:
    if isinstance(releases, bool) or not isinstance(releases, int) or releases < 1:
        raise ConfigError("releases", releases, "must be an integer >= 1")
    return releases


def _slack(slack: float) -> float:
    s = float(slack)
    if not (math.isfinite(s) and s >= 0.0):
        raise ConfigError("slack", slack, "must be finite and >= 0 (ε per release)")
    return s


def _need(budget: PrivacyLoss, family: str, *measures: Measure) -> None:
    if budget.measure not in measures:
        names = " or ".join(str(m) for m in measures)
        raise ConfigError("budget", str(budget), f"family {family!r} needs an {names} budget")


def calibrate(
    family: Family,
    releases: int,
    budget: PrivacyLoss,
    slack: float = 0.0,
    fixed: Mapping[Event, int] | None = None,
) -> float:
    """The smallest noise-to-sensitivity ratio such that ``releases`` identical releases compose
    to at most ``budget`` — together with the ``fixed`` releases, when given (an (ε, δ) budget:
    the release plan calibrates chunks last, so that every release kind of an hour of gaze
    composes to the budget jointly, not only by the basic composition of their shares).

    The ratio is ``λ/Δ1`` for Laplace (``"laplace"``, ``"sequential"``) and ``σ/Δ2`` for
    ``"gaussian"``; build the event as ``LaplaceEvent(ratio, slack)`` /
    ``GaussianEvent(ratio, slack)``. Guarantee: ``compose({event: releases}, δ)`` reports at most
    the budget (``tests/privacy/test_accounting.py`` round-trips every family).

    * ``"gaussian"`` — exact. ``releases`` Gaussians of ratio ``r`` compose to the Gaussian pair
      with ``μ = √releases/r``, so ``r = √releases·σ_AG(ε − S, δ·e^{−S}, Δ = 1)`` with the
      analytic Gaussian mechanism ``σ_AG`` and the total slack ``S = releases·slack``
      (:mod:`gazeguard.privacy.accounting.loss`). A zCDP budget ρ gives ``r = √(releases/(2ρ))``
      (slack must be 0).
    * ``"laplace"`` — PLD: Brent's method on ``log r`` over the pessimistic PLD ε, then the
      smallest ``r`` found that satisfies the budget, within :data:`LAPLACE_RTOL` of the
      crossing. Starts between the Gaussian ratio and the sequential one.
    * ``"sequential"`` — pure sequential composition: ``r = releases/(ε − S)``; δ is ignored.

    Args:
        family: ``"laplace"``, ``"gaussian"`` or ``"sequential"``.
        releases: number of identical releases the budget must cover, >= 1.
        budget: :class:`PrivacyLoss` (approx for ``laplace``/``gaussian``; pure or approx for
            ``sequential``; approx or zCDP for ``gaussian``; pure for ``laplace`` means
            ``sequential``).
        slack: per-release sampler slack (ε), >= 0.
        fixed: other releases (event → count) composed with these, whose noise is set; their
            (ε, δ) composition must leave room in ``budget``.

    Raises:
        ConfigError: a budget of the wrong measure, δ = 0 for Gaussian noise, or a budget the
            slack alone already exceeds.
    """
    n = _releases(releases)
    s = _slack(slack)
    if not isinstance(budget, PrivacyLoss):
        raise ConfigError(
            "budget", budget, "must be a PrivacyLoss, e.g. PrivacyLoss.approx(10, 1e-6)"
        )
    if fixed:
        joint = lambda: _joint(family, n, budget, s, fixed)  # noqa: E731
        return _kept(family, n, budget, s, fixed, search=joint)
    if family == "sequential" or (family == "laplace" and budget.measure is Measure.PURE):
        _need(budget, family, Measure.PURE, Measure.APPROX)
        return _sequential(n, budget, s)
    if family == "gaussian":
        _need(budget, family, Measure.APPROX, Measure.ZCDP)
        return _gaussian(n, budget, s)
    if family == "laplace":
        _need(budget, family, Measure.APPROX)
        return _kept(family, n, budget, s, {}, search=lambda: _laplace(n, budget, s))
    raise ConfigError("family", family, "must be 'laplace', 'gaussian' or 'sequential'")


def _kept(
    family: Family,
    n: int,
    budget: PrivacyLoss,
    s: float,
    fixed: Mapping[Event, int],
    *,
    search: Callable[[], float],
) -> float:
    """A searched ratio through the composition cache on disk: a kept ratio is returned only
    if its composition (itself cached) is within the budget, so a restart neither searches nor
    trusts the file blindly; otherwise ``search()`` runs and its result is kept."""
    others = sorted(disk.events_form((e, c) for e, c in fixed.items() if c))
    key = disk.ratio_key(family, n, budget.to_dict(), s, others)
    kept = disk.lookup_ratio(key)
    if kept is not None and budget.delta is not None and budget.epsilon is not None:
        events = dict(fixed)
        e = (LaplaceEvent if family == "laplace" else GaussianEvent)(kept, s)
        events[e] = events.get(e, 0) + n
        if compose(events, budget.delta).epsilon <= budget.epsilon:
            return kept
    ratio = search()
    disk.store_ratio(key, ratio)
    return ratio


def _spend(n: int, budget: PrivacyLoss, s: float) -> float:
    assert budget.epsilon is not None
    total = n * s
    if total >= budget.epsilon:
        raise ConfigError(
            "budget",
            str(budget),
            f"the samplers' slack alone ({n} × {s:.3g} = {total:.3g}) exceeds ε; "
            "use fewer releases or a larger ε",
        )
    return total


def _sequential(n: int, budget: PrivacyLoss, s: float) -> float:
    assert budget.epsilon is not None
    total = _spend(n, budget, s)
    r = n / (budget.epsilon - total)
    event = LaplaceEvent(r, s)
    while n * event.pure_epsilon > budget.epsilon:  # rounding
        r = math.nextafter(r, math.inf)
        event = LaplaceEvent(r, s)
    return r


def _fits(event: LaplaceEvent | GaussianEvent, n: int, budget: PrivacyLoss) -> bool:
    assert budget.epsilon is not None
    assert budget.delta is not None
    return compose({event: n}, budget.delta).epsilon <= budget.epsilon


def _gaussian(n: int, budget: PrivacyLoss, s: float) -> float:
    if budget.measure is Measure.ZCDP:
        assert budget.rho is not None
        if s:
            raise ConfigError("slack", s, "a zCDP budget needs slack = 0 (slack breaks zCDP)")
        r = math.sqrt(n / (2.0 * budget.rho))
        while n * 0.5 / r**2 > budget.rho:
            r = math.nextafter(r, math.inf)
        return r
    assert budget.epsilon is not None
    assert budget.delta is not None
    if budget.delta == 0.0:
        raise ConfigError("budget.delta", 0.0, "Gaussian noise needs δ > 0, e.g. 1e-6")
    total = _spend(n, budget, s)
    mu = mu_for(budget.epsilon - total, budget.delta * math.exp(-total))
    r = math.sqrt(n) / mu
    while not _fits(GaussianEvent(r, s), n, budget):  # rounding of √n/μ
        r = math.nextafter(r, math.inf) * (1.0 + 1e-15)
    return r


def _laplace(n: int, budget: PrivacyLoss, s: float) -> float:
    assert budget.epsilon is not None
    assert budget.delta is not None
    eps, delta = budget.epsilon, budget.delta
    hi = _sequential(n, budget, s)  # always fits: ε ≤ pure ε ≤ budget
    if delta == 0.0:
        return hi

    def excess(r: float) -> float:  # log(ε(r)/budget): decreasing in r, <= 0 where r fits
        return math.log(max(compose({LaplaceEvent(r, s): n}, delta).epsilon, 1e-300) / eps)

    # Lower end: the Laplace ratio is not far below the Gaussian one for the same budget.
    try:
        guess = _gaussian(n, budget, s) / 2.0
    except ConfigError:
        guess = hi / 2.0
    lo = min(guess, hi / 2.0)
    while excess(lo) <= 0:
        hi, lo = lo, lo / 2.0
    return _search(excess, lo, hi)


def _joint(
    family: Family, n: int, budget: PrivacyLoss, s: float, fixed: Mapping[Event, int]
) -> float:
    """:func:`calibrate` with ``fixed`` releases beside: bisection in log space between a ratio
    that fits by basic composition (the fixed releases' ε at δ/2, the rest for these at δ/2)
    and one that cannot (these alone at the whole budget)."""
    if budget.measure is not Measure.APPROX or family == "sequential":
        raise ConfigError("budget", str(budget), "a joint calibration needs an (ε, δ) budget")
    assert budget.epsilon is not None
    assert budget.delta is not None
    eps, delta = budget.epsilon, budget.delta
    half = delta / 2.0
    taken = compose(dict(fixed), half).epsilon
    if taken >= eps:
        raise ConfigError(
            "budget", str(budget), f"the other releases alone cost ε {taken:.4g}: no room left"
        )
    hi = calibrate(family, n, PrivacyLoss.approx(eps - taken, half), s)
    lo = calibrate(family, n, budget, s)
    make = LaplaceEvent if family == "laplace" else GaussianEvent

    def excess(r: float) -> float:  # log(ε(r)/budget): decreasing in r, <= 0 where r fits
        events = dict(fixed)
        e = make(r, s)
        events[e] = events.get(e, 0) + n
        return math.log(max(compose(events, delta).epsilon, 1e-300) / eps)

    return _search(excess, lo, hi)


def _search(excess: Callable[[float], float], lo: float, hi: float) -> float:
    """The smallest ratio in ``[lo, hi]`` (within :data:`LAPLACE_RTOL`) where the decreasing
    ``excess`` is ``<= 0``, ``hi`` fitting: regula falsi in log space (Illinois variant), with a
    bisection step whenever a step did not halve the bracket — a few evaluations where
    bisection alone takes a dozen, and never more than twice bisection's. The invariant: ``hi``
    always fits."""
    f_lo = excess(lo)
    if f_lo <= 0:
        return lo
    f_hi = excess(hi)
    assert f_hi <= 0, "the upper end must fit"
    side, width = 0, math.log(hi / lo)
    bisect = False
    while hi / lo - 1.0 > LAPLACE_RTOL:
        a, b = math.log(lo), math.log(hi)
        if bisect or f_hi == f_lo:
            x = 0.5 * (a + b)
        else:
            x = b - f_hi * (b - a) / (f_hi - f_lo)
            x = min(max(x, a + 1e-3 * (b - a)), b - 1e-3 * (b - a))
        mid = math.exp(x)
        f_mid = excess(mid)
        if f_mid <= 0:
            hi, f_hi = mid, f_mid
            if side == 1:
                f_lo /= 2.0
            side = 1
        else:
            lo, f_lo = mid, f_mid
            if side == -1:
                f_hi /= 2.0
            side = -1
        new_width = math.log(hi / lo)
        bisect = new_width > 0.5 * width
        width = new_width
    return hi


# ----------------------------------------------------------------------------- unit of privacy
def _duration(field: str, value: float | Fraction, *, positive: bool) -> Fraction:
    """A duration as an exact fraction: a Fraction as is, a float at its shortest decimal value
    (0.1 is 1/10, as a configuration states it)."""
    if isinstance(value, Fraction):
        v = value
    else:
        f = float(value)
        if not math.isfinite(f):
            raise ConfigError(field, value, "must be a finite duration, in seconds")
        v = Fraction(repr(f))
    if v < 0 or (positive and v == 0):
        op = "> 0" if positive else ">= 0"
        raise ConfigError(field, value, f"must be a finite duration {op}, in seconds")
    return v


def releases_within(length_s: float | Fraction, period_s: float | Fraction) -> int:
    """The most releases whose (gaze-time) ends lie at least ``period_s`` apart that fit in one
    interval of ``length_s``: ``⌊length/period⌋ + 1`` (a closed interval, so ends spaced a
    hair under ``period_s`` by float rounding cannot add one).

    The one counting function of gazeguard's privacy figures: the release plan
    (:mod:`gazeguard.plan`) calls it with the length of gaze time whose release ends one raw
    sample, or one hour of gaze, can change, and each release kind's period (a chunk's ``n·s``,
    a label decision's, a cohort bucket's).

    Args:
        length_s: the interval, s, >= 0 (a Fraction is used exactly; a float at its shortest
            decimal value).
        period_s: the least spacing of release ends, s, > 0.
    """
    length = _duration("length_s", length_s, positive=False)
    period = _duration("period_s", period_s, positive=True)
    return int(length // period) + 1
