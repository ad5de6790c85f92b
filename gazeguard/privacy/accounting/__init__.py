"""User-level privacy accounting: (ε, δ) of everything a person's session released.

A pure library (no I/O, no SQL, no configuration): the ledger, the mechanisms and the messages
call it.

* :mod:`~gazeguard.privacy.accounting.loss` — :class:`PrivacyLoss` (pure ε, (ε, δ), ρ-zCDP;
validated
  once) and the accounting events a ledger counts releases under: :class:`LaplaceEvent`,
  :class:`GaussianEvent`, :class:`RandomizedResponseEvent`, :class:`PureEvent` (frozen,
  hashable, JSON-serialisable). The module docstring proves that the 1-D Laplace pair with shift
  ``Δ1`` dominates multi-dimensional Laplace noise, and how sampler slack composes.
* :mod:`~gazeguard.privacy.accounting.accountant` — :func:`compose` (PLD, connect-the-dots
  PMFs — Laplace built in NumPy, Gaussian from Google's ``dp-accounting`` — exact closed form
  for Gaussians alone, RDP fallback; pure sequential ε beside it) and
  :func:`capacity` (how many more releases fit under a cap: the ledger's integer comparison).
* :mod:`~gazeguard.privacy.accounting.calibrate` — :func:`calibrate` (noise from a budget),
  the analytic Gaussian mechanism, the tight zCDP conversion, and :func:`releases_within` (how
  many releases fit in a stretch of gaze: the release plan's one counting function).

Example::

    from gazeguard.privacy.accounting import LaplaceEvent, PrivacyLoss, calibrate, capacity, compose

    budget = PrivacyLoss.approx(10.0, 1e-6)             # per hour of gaze
    r = calibrate("laplace", 230 * 48, budget)          # ≈ 57: λ = 57·Δ1 per feature
    chunk = {LaplaceEvent(r): 48}                       # one chunk releases 48 features
    compose({LaplaceEvent(r): 230 * 48}, 1e-6).epsilon  # ≤ 10
    capacity(chunk, budget)                             # 230 chunks fit
"""

from __future__ import annotations

from gazeguard.privacy.accounting.accountant import (
    Composition,
    Counts,
    Method,
    cache_clear,
    capacity,
    compose,
)
from gazeguard.privacy.accounting.calibrate import (
    Family,
    analytic_gaussian_sigma,
    calibrate,
    epsilon_to_rho,
    gaussian_delta,
    gaussian_epsilon,
    releases_within,
    rho_to_epsilon,
)
from gazeguard.privacy.accounting.loss import (
    Event,
    GaussianEvent,
    LaplaceEvent,
    Measure,
    PrivacyLoss,
    PureEvent,
    RandomizedResponseEvent,
    discrete_laplace_slack,
    event_from_dict,
)

__all__ = [
    "Composition",
    "Counts",
    "Event",
    "Family",
    "GaussianEvent",
    "LaplaceEvent",
    "Measure",
    "Method",
    "PrivacyLoss",
    "PureEvent",
    "RandomizedResponseEvent",
    "analytic_gaussian_sigma",
    "cache_clear",
    "calibrate",
    "capacity",
    "compose",
    "discrete_laplace_slack",
    "epsilon_to_rho",
    "event_from_dict",
    "gaussian_delta",
    "gaussian_epsilon",
    "releases_within",
    "rho_to_epsilon",
]
