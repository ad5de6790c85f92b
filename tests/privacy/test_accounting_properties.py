"""Hypothesis properties of the accountant: the multi-dimensional Laplace domination (quadrature
and dp-accounting's own PLDs), PLD ≤ pure ε and monotone in the counts, capacity consistent with
compose, calibration round trips, serialisation, the Gaussian closed form, the zCDP conversion,
and the raw-gaze unit of privacy against a brute-force simulation of windows, events and holds."""

from __future__ import annotations

import bisect
import json
import logging
import math
from fractions import Fraction

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scipy import integrate

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting import (
    Event,
    GaussianEvent,
    LaplaceEvent,
    PrivacyLoss,
    PureEvent,
    RandomizedResponseEvent,
    calibrate,
    capacity,
    compose,
    epsilon_to_rho,
    event_from_dict,
    gaussian_delta,
    gaussian_epsilon,
    releases_within,
    rho_to_epsilon,
)
from tests.privacy.test_accounting import laplace_delta

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DELTA = 1e-6


# --------------------------------------------------------------- multi-dimensional Laplace
def split_delta_quadrature(eps: float, s1: float, s2: float) -> float:
    """δ(ε) of (Lap(0)⊗Lap(0), Lap(s1)⊗Lap(s2)) by conditioning on the first coordinate.

    Under P the first coordinate's loss is s1 (X ≤ 0, prob ½), −s1 (X ≥ s1, prob e^{−s1}/2) or
    s1 − 2x for X = x ∈ (0, s1) (density e^{−x}/2); given it, the second coordinate contributes
    its own exact 1-D curve at ε minus that loss.
    """
    atoms = 0.5 * laplace_delta(eps - s1, s2) + 0.5 * math.exp(-s1) * laplace_delta(eps + s1, s2)
    kinks = sorted({min(max((s1 - eps + c) / 2, 0.0), s1) for c in (s2, -s2)})
    body, _ = integrate.quad(
        lambda x: 0.5 * math.exp(-x) * laplace_delta(eps - s1 + 2 * x, s2),
        0.0,
        s1,
        points=kinks,
        epsabs=1e-14,
        epsrel=1e-12,
        limit=200,
    )
    return atoms + body


def split_delta_formula(eps: float, s1: float, s2: float) -> float:
    """The closed form derived in gazeguard.privacy.accounting.loss: 1 − e^{−w}(1 + min(w, a,
    s−w)/2)."""
    s, a = s1 + s2, min(s1, s2)
    w = (s - eps) / 2
    if w <= 0:
        return 0.0
    if w >= s:
        return -math.expm1(eps)
    return 1.0 - math.exp(-w) * (1.0 + min(w, a, s - w) / 2)


shifts = st.floats(0.01, 4.0)


@SETTINGS
@given(s1=shifts, s2=shifts, frac=st.floats(-1.3, 1.1))
def test_split_laplace_never_exceeds_one_pair(s1: float, s2: float, frac: float) -> None:
    s = s1 + s2
    eps = frac * s
    quad = split_delta_quadrature(eps, s1, s2)
    assert quad <= laplace_delta(eps, s) + 1e-12
    assert math.isclose(quad, split_delta_formula(eps, s1, s2), rel_tol=1e-8, abs_tol=1e-12)


@SLOW
@given(parts=st.lists(st.floats(0.05, 1.5), min_size=2, max_size=4), frac=st.floats(0.0, 0.95))
def test_split_laplace_with_dp_accounting(parts: list[float], frac: float) -> None:
    """dp-accounting's optimistic PLD of the split pairs is a lower bound on their true δ(ε),
    which must stay below the single pair's exact δ(ε); its pessimistic PLD of the single pair
    is an upper bound on that."""
    total = sum(parts)
    eps = frac * total
    interval = 1e-3
    logging.disable(logging.WARNING)  # optimistic PLDs log that connect-the-dots is off
    try:
        split = None
        for p in parts:
            one = pld_lib.from_laplace_mechanism(
                1.0,
                sensitivity=p,
                pessimistic_estimate=False,
                value_discretization_interval=interval,
                use_connect_dots=False,
            )
            split = one if split is None else split.compose(one)
    finally:
        logging.disable(logging.NOTSET)
    assert split is not None
    single = pld_lib.from_laplace_mechanism(
        1.0, sensitivity=total, value_discretization_interval=interval
    )
    exact = laplace_delta(eps, total)
    assert split.get_delta_for_epsilon(eps) <= exact + 1e-12
    assert exact <= single.get_delta_for_epsilon(eps) + 1e-12


# ------------------------------------------------------------------------------ compose
laplace_events = st.builds(LaplaceEvent, st.floats(0.3, 40.0), st.sampled_from([0.0, 1e-6]))
events = st.one_of(
    laplace_events,
    st.builds(GaussianEvent, st.floats(0.5, 40.0)),
    st.builds(RandomizedResponseEvent, st.floats(0.05, 3.0), st.integers(2, 12)),
    st.builds(PureEvent, st.floats(0.05, 3.0)),
)
multisets = st.dictionaries(events, st.integers(1, 300), min_size=1, max_size=3)
deltas = st.sampled_from([1e-9, 1e-6, 1e-3])


@pytest.mark.slow
@SLOW
@given(counts=multisets, delta=deltas)
def test_epsilon_at_most_pure_and_monotone_in_counts(
    counts: dict[Event, int], delta: float
) -> None:
    c = compose(counts, delta)
    assert 0.0 <= c.epsilon <= c.pure_epsilon
    assert c.delta_at(c.epsilon) <= delta * (1 + 1e-9) + 1e-15
    for event, count in counts.items():  # one more release of an event already there
        more = compose({**counts, event: count + 1}, delta)
        # monotone up to floating-point rounding of the hockey-stick sum (seen: 1e-13 relative)
        assert more.epsilon >= c.epsilon * (1 - 1e-12)
        assert more.pure_epsilon >= c.pure_epsilon
    # insertion order does not matter: one cached result
    assert compose(dict(reversed(list(counts.items()))), delta) is c


@SLOW
@given(ratios=st.dictionaries(st.floats(0.3, 60.0), st.integers(1, 5000), min_size=1, max_size=4))
def test_gaussian_closed_form_and_pld_bound(ratios: dict[float, int]) -> None:
    counts = {GaussianEvent(r): n for r, n in ratios.items()}
    mu = math.sqrt(sum(n / r**2 for r, n in ratios.items()))
    exact = compose(counts, DELTA)
    assert exact.method == "gaussian"
    assert math.isclose(exact.epsilon, gaussian_epsilon(DELTA, mu), rel_tol=1e-12)
    try:
        pld = compose(counts, DELTA, method="pld")
    except ConfigError:
        # μ in the hundreds: no grid of PLD_TARGET_POINTS points resolves one release (the
        # closed form is what the accountant uses for Gaussians anyway)
        assert mu > 50.0
        return
    assert exact.epsilon <= pld.epsilon <= exact.epsilon * 1.01 + 1e-6


@pytest.mark.slow
@SLOW
@given(
    step=st.dictionaries(laplace_events, st.integers(1, 6), min_size=1, max_size=2),
    cap_eps=st.floats(0.5, 15.0),
    delta=deltas,
    used=st.integers(0, 30),
)
def test_capacity_consistent_with_compose(
    step: dict[Event, int], cap_eps: float, delta: float, used: int
) -> None:
    cap = PrivacyLoss.approx(cap_eps, delta)
    already = {e: c * used for e, c in step.items()}
    got = capacity(step, cap, already)
    assume(got < 2000)  # keep examples fast
    fits = compose({e: c * (used + got) for e, c in step.items()}, delta).within(cap)
    over = compose({e: c * (used + got + 1) for e, c in step.items()}, delta).within(cap)
    if got > 0 or fits:
        assert fits
    assert not over
    assert capacity(step, cap, {e: c * (used + 1) for e, c in step.items()}) == max(got - 1, 0)


@SLOW
@given(
    family=st.sampled_from(["laplace", "gaussian", "sequential"]),
    releases=st.integers(1, 3000),
    eps=st.floats(0.5, 30.0),
    delta=deltas,
)
def test_calibrate_round_trip(family: str, releases: int, eps: float, delta: float) -> None:
    budget = PrivacyLoss.approx(eps, delta)
    r = calibrate(family, releases, budget)  # type: ignore[arg-type]
    event = GaussianEvent(r) if family == "gaussian" else LaplaceEvent(r)
    assert compose({event: releases}, delta).epsilon <= eps
    smaller = type(event)(r * (1 - 3e-4))
    assert compose({smaller: releases}, delta).epsilon > eps or family == "sequential"


@SETTINGS
@given(event=events)
def test_event_serialisation_round_trip(event: Event) -> None:
    back = event_from_dict(json.loads(json.dumps(event.to_dict())))
    assert back == event
    assert hash(back) == hash(event)


@SETTINGS
@given(
    loss=st.one_of(
        st.builds(PrivacyLoss.pure, st.floats(1e-6, 1e6)),
        st.builds(PrivacyLoss.approx, st.floats(1e-6, 1e6), st.floats(0.0, 0.999)),
        st.builds(PrivacyLoss.zcdp, st.floats(1e-6, 1e6)),
    )
)
def test_privacy_loss_round_trip(loss: PrivacyLoss) -> None:
    assert PrivacyLoss.from_dict(json.loads(json.dumps(loss.to_dict()))) == loss


# ------------------------------------------------------------------------- conversions
@SETTINGS
@given(rho=st.floats(1e-4, 50.0), delta=st.sampled_from([1e-12, 1e-9, 1e-6, 1e-3]))
def test_rho_to_epsilon_bounds_and_inverse(rho: float, delta: float) -> None:
    eps = rho_to_epsilon(rho, delta)
    # no zCDP conversion can beat the exact Gaussian, which is ρ-zCDP with μ = √(2ρ)
    assert gaussian_epsilon(delta, math.sqrt(2 * rho)) <= eps * (1 + 1e-12)
    assert eps <= rho + 2 * math.sqrt(rho * math.log(1 / delta))
    back = epsilon_to_rho(eps, delta)
    assert rho_to_epsilon(back, delta) <= eps
    assert math.isclose(back, rho, rel_tol=1e-5)


@SETTINGS
@given(mu=st.floats(0.01, 30.0), delta=st.sampled_from([1e-12, 1e-9, 1e-6, 1e-3, 0.1]))
def test_gaussian_epsilon_inverts_delta(mu: float, delta: float) -> None:
    eps = gaussian_epsilon(delta, mu)
    assert gaussian_delta(eps, mu) <= delta
    if eps > 0:
        assert gaussian_delta(eps * (1 - 1e-9), mu) > delta


# ---------------------------------------------------------------------- unit of privacy
quarter = st.integers(1, 80).map(lambda q: Fraction(q, 4))  # 0.25 s .. 20 s, exact in binary
quarter0 = st.integers(0, 40).map(lambda q: Fraction(q, 4))


def brute_force_chunks(
    t: Fraction, phase: Fraction, w: Fraction, s: Fraction, n: int, h: Fraction,
    a: Fraction, e: Fraction, chunk_phase: int,
) -> int:  # fmt: skip
    """Chunks changed by a sample at ``t``: feature windows ``[τ_k − W, τ_k)`` on the grid
    ``τ_k = phase + k·s`` that contain the sample or the end time of an event it changes (any
    end in ``(t − A, t + E]``: a split fixation changes several events), then holds of up to
    ``H``, then chunks of ``n`` steps starting at step ``chunk_phase``. Event ends are tried at
    every critical point (the ends of ``(t − A, t + E]`` and of every window), so a window is
    reached exactly when some end in the interval lies in it."""
    lo_k = math.floor((t - a - phase) / s) - 2
    hi_k = math.ceil((t + e + w + h - phase) / s) + 2
    taus = {k: phase + k * s for k in range(lo_k, hi_k + 1)}
    tiny = Fraction(1, 10**9)
    candidates = {t, t - a + tiny, t + e}
    for tau in taus.values():
        candidates |= {tau - w, tau - tiny}
    ends = sorted(x for x in candidates if t - a < x <= t + e or x == t)
    changed = set()
    for k, tau in taus.items():
        i = bisect.bisect_left(ends, tau - w)  # first end >= τ − W
        if i < len(ends) and ends[i] < tau:
            changed.add(k)
    ks = sorted(taus)
    times = [taus[k] for k in ks]
    held = set()
    for k in changed:  # later vectors with 0 < τ' − τ_k ≤ H repeat vector k
        first = bisect.bisect_right(times, taus[k])
        last = bisect.bisect_right(times, taus[k] + h)
        held.update(ks[first:last])
    return len({(k - chunk_phase) // n for k in changed | held})


@pytest.mark.slow
@SLOW
@given(
    w=quarter,
    s=st.sampled_from([Fraction(1, 4), Fraction(1, 2), Fraction(1)]),
    n=st.sampled_from([1, 2, 4, 8, 32]),
    h=quarter0,
    a=st.sampled_from([Fraction(0), Fraction(1, 4)]),
    e=quarter0,
    phase=st.integers(0, 7),
)
def test_the_plans_chunk_count_bounds_brute_force(
    w: Fraction, s: Fraction, n: int, h: Fraction, a: Fraction, e: Fraction, phase: int
) -> None:
    """The release plan's count of the chunks one sample can change (``releases_within`` of
    ``A + E + W + H + (n − 1)·s`` at a period of ``n·s``) is never exceeded, at any sample time
    and chunk alignment, and is attained or exceeded by at most one (closed intervals)."""
    want = releases_within(a + e + w + h + (n - 1) * s, n * s)
    tau0 = Fraction(phase, 8) * s
    # sample times over one chunk period, at offsets that include the worst alignment
    offsets = [Fraction(j, 8) * s + Fraction(1, 10**6) for j in range(8)]
    seen = 0
    for k in range(n):
        for off in offsets:
            t = tau0 + k * s + off
            got = brute_force_chunks(t, tau0, w, s, n, h, a, e, chunk_phase=0)
            assert got <= want
            seen = max(seen, got)
    assert want - 1 <= seen
