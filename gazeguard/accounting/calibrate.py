"""Noise from a budget, Gaussian conversions, and the unit of privacy in gaze time.

* :func:`calibrate` — the smallest noise-to-sensitivity ratio such that ``releases`` identical
  releases compose to at most a given (ε, δ) (or pure ε, or ρ).
* :func:`analytic_gaussian_sigma`, :func:`gaussian_delta`, :func:`gaussian_epsilon` — the exact
  Gaussian pair (Balle & Wang 2018); :func:`rho_to_epsilon` / :func:`epsilon_to_rho` — the tight
  zCDP → (ε, δ) conversion and its inverse.
* :func:`chunks_per_hour`, :func:`chunks_reached` — how many releases an hour of gaze holds and
  how many chunks one raw gaze sample can change (the raw-gaze unit of privacy).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Literal, TypeAlias

from gazeguard.accounting._gaussian import (
    _mu_for,
    analytic_gaussian_sigma,
    epsilon_to_rho,
    gaussian_delta,
    gaussian_epsilon,
    rho_to_epsilon,
)
from gazeguard.accounting.accountant import compose
from gazeguard.accounting.loss import GaussianEvent, LaplaceEvent, Measure, PrivacyLoss
from gazeguard.errors import ConfigError

__all__ = [
    "Family",
    "analytic_gaussian_sigma",
    "calibrate",
    "chunks_per_hour",
    "chunks_reached",
    "epsilon_to_rho",
    "gaussian_delta",
    "gaussian_epsilon",
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


def calibrate(family: Family, releases: int, budget: PrivacyLoss, slack: float = 0.0) -> float:
    """The smallest noise-to-sensitivity ratio such that ``releases`` identical releases compose
    to at most ``budget``.

    The ratio is ``λ/Δ1`` for Laplace (``"laplace"``, ``"sequential"``) and ``σ/Δ2`` for
    ``"gaussian"``; build the event as ``LaplaceEvent(ratio, slack)`` /
    ``GaussianEvent(ratio, slack)``. Guarantee: ``compose({event: releases}, δ)`` reports at most
    the budget (``tests/test_accounting.py`` round-trips every family).

    * ``"gaussian"`` — exact. ``releases`` Gaussians of ratio ``r`` compose to the Gaussian pair
      with ``μ = √releases/r``, so ``r = √releases·σ_AG(ε − S, δ·e^{−S}, Δ = 1)`` with the
      analytic Gaussian mechanism ``σ_AG`` and the total slack ``S = releases·slack``
      (:mod:`gazeguard.accounting.loss`). A zCDP budget ρ gives ``r = √(releases/(2ρ))``
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
    if family == "sequential" or (family == "laplace" and budget.measure is Measure.PURE):
        _need(budget, family, Measure.PURE, Measure.APPROX)
        return _sequential(n, budget, s)
    if family == "gaussian":
        _need(budget, family, Measure.APPROX, Measure.ZCDP)
        return _gaussian(n, budget, s)
    if family == "laplace":
        _need(budget, family, Measure.APPROX)
        return _laplace(n, budget, s)
    raise ConfigError("family", family, "must be 'laplace', 'gaussian' or 'sequential'")


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
    mu = _mu_for(budget.epsilon - total, budget.delta * math.exp(-total))
    r = math.sqrt(n) / mu
    while not _fits(GaussianEvent(r, s), n, budget):  # rounding of √n/μ
        r = math.nextafter(r, math.inf) * (1.0 + 1e-15)
    return r


def _laplace(n: int, budget: PrivacyLoss, s: float) -> float:
    assert budget.epsilon is not None
    assert budget.delta is not None
    hi = _sequential(n, budget, s)  # always fits: ε ≤ pure ε ≤ budget
    if budget.delta == 0.0:
        return hi

    def fits(r: float) -> bool:
        return _fits(LaplaceEvent(r, s), n, budget)

    # Lower end: the Laplace ratio is not far below the Gaussian one for the same budget.
    try:
        guess = _gaussian(n, budget, s) / 2.0
    except ConfigError:
        guess = hi / 2.0
    lo = min(guess, hi / 2.0)
    while fits(lo):
        hi, lo = lo, lo / 2.0
    # Bisection in log space between lo (does not fit) and hi (fits); regula falsi would be
    # faster but the PLD ε is piecewise smooth only, and the invariant is what matters.
    while hi / lo - 1.0 > LAPLACE_RTOL:
        mid = math.sqrt(lo * hi)
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


# ----------------------------------------------------------------------------- unit of privacy
def _seconds(field: str, value: float, *, positive: bool) -> Fraction:
    """A duration as the exact fraction of its shortest decimal form (0.1 -> 1/10)."""
    v = float(value)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        op = "> 0" if positive else ">= 0"
        raise ConfigError(field, value, f"must be a finite duration {op}, in seconds")
    return Fraction(repr(v))


def _steps(field: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(field, value, "must be an integer >= 1 (steps per chunk)")
    return value


def _ceil(x: Fraction) -> int:
    return -((-x.numerator) // x.denominator)


def chunks_per_hour(chunk_steps: int, step_s: float) -> int:
    """The most chunks released in any hour of gaze time.

    Chunks of ``n = chunk_steps`` feature vectors ``step_s`` apart are released back to back,
    one every ``T = n·step_s`` seconds of gaze, so any half-open hour of gaze time holds at most
    ``⌈3600/T⌉`` release instants (225 for 32 steps of 0.5 s). Durations are taken at their
    shortest decimal value (``0.1`` is 1/10), as a configuration states them.

    Args:
        chunk_steps: steps per chunk, >= 1.
        step_s: the feature step, s, > 0.
    """
    n = _steps("chunk_steps", chunk_steps)
    s = _seconds("step_s", step_s, positive=True)
    return _ceil(Fraction(3600) / (n * s))


def chunks_reached(
    window_s: float,
    step_s: float,
    chunk_steps: int,
    hold_limit_s: float,
    *,
    lookahead_s: float = 0.0,
    event_span_s: float = 0.0,
) -> int:
    """How many chunks one raw gaze sample can change: the raw-gaze unit of privacy.

    Argument. Feature vectors are computed on the step grid ``τ_k = τ_0 + k·s``; vector ``k``
    summarises the window of length ``W`` that ends at ``τ_k`` (gazeguard's windows are
    ``[τ_k − W, τ_k)``; ``(τ_k − W, τ_k]`` gives the same count). A sample at time ``t`` can
    change vector ``k`` only if

    * it lies in the window (``τ_k ∈ (t, t + W]``), or it changes an event that belongs to the
      window — events belong to the window that contains their end time, and an event whose
      statistics the sample changes ends in ``(t − A, t + E]`` (``A = lookahead_s``: a velocity
      filter's look-ahead lets a sample change the class of earlier samples; ``E =
      event_span_s``: how long after the sample such an event can end, e.g. the longest event
      plus the look-ahead), so ``τ_k ∈ (t − A, t + E + W]``;
    * or vector ``k`` repeats ("holds") the value of an earlier changed vector ``k'`` with
      ``0 < τ_k − τ_k' ≤ H`` (``H = hold_limit_s``; after ``H`` a public default is released),
      i.e. ``k − k' ≤ ⌊H/s⌋`` on the grid.

    The directly changed vectors have ``τ_k`` in a half-open interval of length
    ``L = A + E + W``, which contains at most ``⌈L/s⌉`` grid points, consecutive step indexes;
    holding extends that run by at most ``⌊H/s⌋`` steps, so at most
    ``K = ⌈L/s⌉ + ⌊H/s⌋`` consecutive steps change. Chunks are consecutive blocks of ``n``
    steps; ``K`` consecutive indexes meet at most ``⌈(K − 1)/n⌉ + 1`` blocks, and all three
    maxima are attained together for some sample time (a brute-force simulation of windows,
    event ends and holds in ``tests/properties/test_accounting_properties.py`` checks both the
    bound and that it is reached). At the defaults (W = 30 s, s = 0.5 s, n = 32, no hold,
    A = E = 0) that is 3 chunks.

    The count is only finite if the pipeline bounds ``H`` and ``E``: holding the previous value
    indefinitely, or an event of unbounded duration (one long fixation split by the sample moves
    the start of an event that ends arbitrarily later), makes the reach unbounded. Durations are
    taken at their shortest decimal value.

    Args:
        window_s: the feature window ``W``, s, > 0.
        step_s: the feature step ``s``, s, > 0.
        chunk_steps: steps per chunk ``n``, >= 1.
        hold_limit_s: the longest a held value may repeat, ``H``, s, >= 0.
        lookahead_s: ``A``, s, >= 0.
        event_span_s: ``E``, s, >= 0.
    """
    w = _seconds("window_s", window_s, positive=True)
    s = _seconds("step_s", step_s, positive=True)
    n = _steps("chunk_steps", chunk_steps)
    h = _seconds("hold_limit_s", hold_limit_s, positive=False)
    a = _seconds("lookahead_s", lookahead_s, positive=False)
    e = _seconds("event_span_s", event_span_s, positive=False)
    hold = h / s
    k = _ceil((a + e + w) / s) + hold.numerator // hold.denominator
    return -(-(k - 1) // n) + 1
