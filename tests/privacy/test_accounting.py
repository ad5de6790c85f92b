"""The user-level accountant against exact references: the Gaussian closed form, the exact Laplace
and randomized-response curves, dp-accounting's optimistic (lower-bound) PLDs, the analytic
Gaussian mechanism of dp-accounting; capacity, calibration, serialisation and validation."""

from __future__ import annotations

import importlib
import json
import logging
import math
from collections.abc import Callable
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from dp_accounting import get_sigma_gaussian
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting import (
    GaussianEvent,
    LaplaceEvent,
    Measure,
    PrivacyLoss,
    PureEvent,
    RandomizedResponseEvent,
    analytic_gaussian_sigma,
    cache_clear,
    calibrate,
    capacity,
    compose,
    discrete_laplace_slack,
    epsilon_to_rho,
    event_from_dict,
    gaussian_delta,
    gaussian_epsilon,
    releases_within,
    rho_to_epsilon,
)
from gazeguard.privacy.mechanisms.discrete_laplace import ETA, SAMPLER_LOSS_PER_COORDINATE

DELTA = 1e-6


# ----------------------------------------------------------------------- exact reference curves
def laplace_delta(eps: float, shift: float) -> float:
    """Exact δ(ε) of (Lap(0, 1), Lap(shift, 1))."""
    if eps >= shift:
        return 0.0
    if eps >= -shift:
        return -math.expm1((eps - shift) / 2)
    return -math.expm1(eps)


def rr_delta(eps: float, epsilon: float, k: int, count: int) -> float:
    """Exact δ(ε) of ``count`` compositions of k-ary randomized response (trinomial sum)."""
    z = math.exp(epsilon) + k - 1
    lp, lm = epsilon - math.log(z), -math.log(z)
    l0 = math.log(k - 2) - math.log(z) if k > 2 else -math.inf
    total = 0.0
    for plus in range(count + 1):
        for minus in range(count - plus + 1):
            zero = count - plus - minus
            loss = epsilon * (plus - minus)
            if loss <= eps or (zero and k == 2):
                continue
            logp = (
                math.lgamma(count + 1)
                - math.lgamma(plus + 1)
                - math.lgamma(minus + 1)
                - math.lgamma(zero + 1)
                + plus * lp
                + minus * lm
                + (zero * l0 if zero else 0.0)
            )
            total += math.exp(logp) * -math.expm1(eps - loss)
    return total


def invert(delta_of: Callable[[float], float], delta: float, hi: float) -> float:
    """Smallest ε in [0, hi] with ``delta_of(ε) ≤ δ`` (δ decreasing in ε)."""
    lo = 0.0
    if delta_of(0.0) <= delta:
        return 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if delta_of(mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def gaussian_delta_reference(eps: float, mu: float) -> float:
    """Balle & Wang's δ(ε) with scipy.stats.norm, straight from the formula."""
    return float(
        stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
    )


# ---------------------------------------------------------------------------------- PrivacyLoss
def test_privacy_loss_constructors_and_str() -> None:
    assert str(PrivacyLoss.approx(10, 1e-6)) == "ε=10 at δ=1e-06"
    assert str(PrivacyLoss.pure(2.5)) == "ε=2.5 (pure)"
    assert str(PrivacyLoss.zcdp(0.5)) == "ρ=0.5 (zCDP)"
    loss = PrivacyLoss.approx(3, 0)
    assert loss.measure is Measure.APPROX
    assert (loss.epsilon, loss.delta, loss.rho) == (3.0, 0.0, None)
    assert PrivacyLoss.pure(1).delta == 0.0
    for x in (PrivacyLoss.approx(1, 1e-9), PrivacyLoss.pure(4), PrivacyLoss.zcdp(0.1)):
        assert PrivacyLoss.from_dict(x.to_dict()) == x
        assert hash(PrivacyLoss.from_dict(x.to_dict())) == hash(x)


def assert_refused_naming(build: Callable[[], object], field: str, value: object) -> ConfigError:
    """``build()`` raises a :class:`ConfigError` naming ``field`` and quoting ``value``; it is
    returned."""
    with pytest.raises(ConfigError) as info:
        build()
    assert info.value.field == field
    assert repr(value) in str(info.value)
    return info.value


@pytest.mark.parametrize(
    ("build", "field", "value"),
    [
        (lambda: PrivacyLoss.approx(0, 1e-6), "epsilon", 0),
        (lambda: PrivacyLoss.approx(math.inf, 1e-6), "epsilon", math.inf),
        (lambda: PrivacyLoss.approx(1, 1.0), "delta", 1.0),
        (lambda: PrivacyLoss.approx(1, -1e-9), "delta", -1e-9),
        (lambda: PrivacyLoss.approx(1, math.nan), "delta", math.nan),
        (lambda: PrivacyLoss.pure(-2), "epsilon", -2),
        (lambda: PrivacyLoss.pure(True), "epsilon", True),  # type: ignore[arg-type]
        (lambda: PrivacyLoss.zcdp(math.nan), "rho", math.nan),
        (lambda: PrivacyLoss.approx(-1, 1e-6, field="ledger.budget_per_hour"),
         "ledger.budget_per_hour", -1),
        (lambda: PrivacyLoss(Measure.PURE, 1.0, 0.5), "delta", 0.5),
        (lambda: PrivacyLoss(Measure.ZCDP, 1.0), "measure", "zcdp"),
        (lambda: PrivacyLoss.from_dict({"measure": "renyi"}), "measure", "renyi"),
    ],
)  # fmt: skip
def test_privacy_loss_validation_names_field_and_value(
    build: Callable[[], object], field: str, value: object
) -> None:
    error = assert_refused_naming(build, field, value)
    if isinstance(value, float) and math.isnan(value):
        assert math.isnan(error.value)  # type: ignore[arg-type]
    else:
        assert error.value == value


# ---------------------------------------------------------------------------------------- events
def test_event_properties() -> None:
    lap = LaplaceEvent(4.0, 1e-6)
    assert lap.pure_epsilon == pytest.approx(0.25 + 1e-6, rel=1e-15)
    assert lap.rho == pytest.approx((0.25 + 1e-6) ** 2 / 2, rel=1e-15)
    gau = GaussianEvent(2.0)
    assert gau.pure_epsilon == math.inf
    assert gau.rho == 0.125
    assert GaussianEvent(2.0, 1e-6).rho is None  # slack breaks zCDP
    rr = RandomizedResponseEvent(1.5, 4)
    assert rr.pure_epsilon == 1.5
    assert rr.rho == 1.125
    # dp-accounting's p: the true class with prob. 1 − p + p/k = e^ε/(e^ε + k − 1)
    p = rr.noise_parameter
    assert 1 - p + p / 4 == pytest.approx(math.exp(1.5) / (math.exp(1.5) + 3), rel=1e-14)
    assert PureEvent(2.0).rho == 2.0
    assert RandomizedResponseEvent(600.0, 3).noise_parameter > 0  # no overflow of e^ε
    # hashable, equal by value; -0.0 and 0.0 slack are one key
    assert {LaplaceEvent(1.0): 1, LaplaceEvent(1.0, -0.0): 2} == {LaplaceEvent(1.0): 2}
    assert LaplaceEvent(2) == LaplaceEvent(2.0)
    assert str(LaplaceEvent(56.0)) == "Laplace(λ/Δ1=56)"


@pytest.mark.parametrize(
    "event",
    [LaplaceEvent(56.0), LaplaceEvent(0.1, 9.5e-7), GaussianEvent(59.25, 1e-7),
     RandomizedResponseEvent(2.0, 7), PureEvent(0.3)],
)  # fmt: skip
def test_event_serialisation_round_trip(event: object) -> None:
    data = json.loads(json.dumps(event.to_dict()))  # type: ignore[attr-defined]
    back = event_from_dict(data)
    assert back == event
    assert hash(back) == hash(event)
    assert type(back) is type(event)


@pytest.mark.parametrize(
    ("build", "field", "value"),
    [
        (lambda: LaplaceEvent(0.0), "LaplaceEvent.ratio", 0.0),
        (lambda: LaplaceEvent(math.nan), "LaplaceEvent.ratio", math.nan),
        (lambda: LaplaceEvent(1.0, -1e-9), "LaplaceEvent.slack", -1e-9),
        (lambda: GaussianEvent(-3.0), "GaussianEvent.ratio", -3.0),
        (lambda: GaussianEvent(1.0, math.inf), "GaussianEvent.slack", math.inf),
        (lambda: RandomizedResponseEvent(1.0, 1), "RandomizedResponseEvent.classes", 1),
        (lambda: RandomizedResponseEvent(1.0, True), "RandomizedResponseEvent.classes", True),  # type: ignore[arg-type]
        (lambda: RandomizedResponseEvent(0.0, 3), "RandomizedResponseEvent.epsilon", 0.0),
        (lambda: PureEvent(math.inf), "PureEvent.epsilon", math.inf),
        (lambda: event_from_dict({"kind": "exponential", "epsilon": 1}), "event.kind",
         "exponential"),
        (lambda: event_from_dict({"kind": "laplace"}), "event['laplace']", {"kind": "laplace"}),
        (lambda: event_from_dict({"kind": "pure", "epsilon": 1, "x": 2}), "event['pure']",
         {"kind": "pure", "epsilon": 1, "x": 2}),
        (lambda: event_from_dict({"kind": "laplace", "ratio": "56"}), "LaplaceEvent.ratio", "56"),
    ],
)  # fmt: skip
def test_event_validation_names_field_and_value(
    build: Callable[[], object], field: str, value: object
) -> None:
    assert_refused_naming(build, field, value)


# ------------------------------------------------------------------------------------ compose
def test_empty_composition_is_free() -> None:
    c = compose({}, DELTA)
    assert (c.epsilon, c.pure_epsilon, c.rho, c.method, c.releases) == (0.0, 0.0, 0.0, "none", 0)
    assert c.delta_at(0.0) == 0.0
    assert compose({LaplaceEvent(1.0): 0}, DELTA).method == "none"


@pytest.mark.parametrize(
    "ratios", [[(2.0, 3), (1.0, 1)], [(59.0, 10800)], [(0.3, 1)], [(8.0, 225), (3.0, 7)]]
)
def test_gaussian_composition_is_the_closed_form(ratios: list[tuple[float, int]]) -> None:
    counts = {GaussianEvent(r): c for r, c in ratios}
    mu = math.sqrt(sum(c / r**2 for r, c in ratios))
    c = compose(counts, DELTA)
    assert c.method == "gaussian"
    assert c.pure_epsilon == math.inf
    assert c.rho == pytest.approx(mu**2 / 2, rel=1e-12)
    # δ at the reported ε is at most the target, and a hair less ε would not do
    assert gaussian_delta_reference(c.epsilon, mu) <= DELTA * (1 + 1e-9)
    assert gaussian_delta_reference(c.epsilon * (1 - 1e-6), mu) > DELTA
    for eps in (0.0, 0.5, 2.0, c.epsilon):
        assert c.delta_at(eps) == pytest.approx(
            gaussian_delta_reference(eps, mu), rel=1e-9, abs=1e-300
        )
    # PLD and RDP of the same releases are upper bounds; PLD within 1 %
    pld = compose(counts, DELTA, method="pld")
    rdp = compose(counts, DELTA, method="rdp")
    assert (pld.method, rdp.method) == ("pld", "rdp")
    assert c.epsilon <= pld.epsilon <= c.epsilon * 1.01
    assert c.epsilon <= rdp.epsilon


def test_gaussian_delta_keeps_tiny_deltas() -> None:
    # far in the tail the naive difference cancels to 0 or goes negative; the log form does not
    mu = 0.5
    for eps in (5.0, 10.0, 20.0):
        exact = float(
            mpmath.ncdf(-eps / mu + mu / 2) - mpmath.exp(eps) * mpmath.ncdf(-eps / mu - mu / 2)
        )
        assert gaussian_delta(eps, mu) == pytest.approx(exact, rel=1e-8)
    assert gaussian_epsilon(1e-12, mu) > gaussian_epsilon(1e-6, mu)


@pytest.mark.parametrize("ratio", [0.1, 0.7, 1.0, 3.0, 17.0])
def test_laplace_single_release_matches_exact_curve(ratio: float) -> None:
    c = compose({LaplaceEvent(ratio): 1}, DELTA)
    assert c.method == "pld"
    e0 = 1 / ratio
    exact = max(e0 + 2 * math.log1p(-DELTA), 0.0)  # solves 1 − e^{(ε−ε0)/2} = δ
    assert exact - 1e-12 <= c.epsilon <= exact * 1.01
    for frac in (0.0, 0.1, 0.5, 0.9, 0.999):
        eps = frac * e0
        want = laplace_delta(eps, e0)  # scale-free: noise scale 1, shift 1/ratio
        got = c.delta_at(eps)
        assert want - 1e-12 <= got <= want + 0.01 * max(want, 1e-3)


@settings(max_examples=60, deadline=None)
@given(
    ratio=st.floats(0.05, 500.0),
    points=st.sampled_from([32, 64, 128, 256, 512, 1024, 4096]),
    shrink=st.floats(1.0, 1.9),
)
def test_laplace_pmf_is_dp_accountings_connect_the_dots(
    ratio: float, points: int, shrink: float
) -> None:
    """The Laplace PMF built in NumPy (no dp-accounting import on a Laplace plan) is
    dp-accounting's ``from_laplace_mechanism`` PMF: the same grid, and masses equal to its and to
    the exact connect-the-dots masses (mpmath, 40 digits) within round-off — a few ulps of δ,
    amplified by ``1/(e^d − 1)`` where the masses are differences of δ over a grid of step
    ``d`` (measured: ≤ 2e-15/d from the exact masses, dp-accounting's ≤ 4e-15/d)."""
    from gazeguard.privacy.accounting import accountant  # noqa: PLC0415

    interval = 1.0 / ratio / points * shrink  # aligned and unaligned grids
    mine = accountant._laplace_pmf(ratio, interval)
    ref = accountant._Pmf.of(
        pld_lib.from_laplace_mechanism(ratio, 1.0, value_discretization_interval=interval)
    )
    assert (mine.interval, mine.lower, mine.size) == (ref.interval, ref.lower, ref.size)
    assert mine.infinity == 0.0  # exact: δ(ε0) = 0 (dp-accounting's CDFs leave ≤ 1e-16)
    assert ref.infinity <= 1e-15
    roundoff = 1e-14 / interval
    assert float(np.max(np.abs(mine.probs - ref.probs))) <= roundoff
    assert math.fsum(mine.probs) == pytest.approx(1.0, abs=1e-12)

    with mpmath.workdps(40):
        e0, d = mpmath.mpf(1) / ratio, mpmath.mpf(interval)
        ks = range(mine.lower, mine.lower + mine.size)
        dl = [1 - mpmath.exp(min((k * d - e0) / 2, k * d)) if k * d < e0 else 0 for k in ks]
        exact = [1 - dl[0] + (dl[1] - dl[0]) / mpmath.expm1(d)]
        exact += [
            ((dl[i + 1] - dl[i]) - mpmath.exp(d) * (dl[i] - dl[i - 1])) / mpmath.expm1(d)
            for i in range(1, len(dl) - 1)
        ]
        exact.append((dl[-1] - dl[-2]) / mpmath.expm1(-d))
        want = np.array([float(max(x, 0)) for x in exact])
    assert float(np.max(np.abs(mine.probs - want))) <= roundoff


@settings(max_examples=40, deadline=None)
@given(
    a=st.integers(1, 3000),
    b=st.integers(1, 3000),
    seed=st.integers(0, 2**32 - 1),
)
def test_pmf_convolution_is_scipys_fftconvolve(a: int, b: int, seed: int) -> None:
    """The composition's FFT convolution (NumPy) agrees with ``scipy.signal.fftconvolve`` to
    round-off, on PMF-like inputs with masses over many decades."""
    from scipy import signal  # noqa: PLC0415

    from gazeguard.privacy.accounting import accountant  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    x = np.exp(-rng.uniform(0.0, 40.0, a))
    y = np.exp(-rng.uniform(0.0, 40.0, b))
    x /= x.sum()
    y /= y.sum()
    got = accountant._convolve(x, y)
    assert got.shape == (a + b - 1,)
    np.testing.assert_allclose(got, signal.fftconvolve(x, y), rtol=0.0, atol=1e-15)


@pytest.mark.parametrize(("ratio", "count"), [(2.0, 50), (10.0, 100), (7.9, 225), (0.5, 3)])
def test_laplace_composition_is_bracketed_by_optimistic_pld(ratio: float, count: int) -> None:
    c = compose({LaplaceEvent(ratio): count}, DELTA)
    logging.disable(logging.WARNING)  # dp-accounting logs that optimistic has no connect-the-dots
    try:
        low = pld_lib.from_laplace_mechanism(
            ratio,
            1.0,
            pessimistic_estimate=False,
            value_discretization_interval=2e-4 / ratio,
            use_connect_dots=False,
        ).self_compose(count)
    finally:
        logging.disable(logging.NOTSET)
    lower = low.get_epsilon_for_delta(DELTA)  # ≤ the exact ε
    assert lower <= c.epsilon <= c.pure_epsilon
    assert c.epsilon <= lower * 1.01 + 1e-9


@pytest.mark.parametrize(
    ("epsilon", "k", "count"), [(1.0, 2, 1), (1.0, 2, 12), (0.5, 5, 30), (2.0, 10, 7), (0.1, 3, 40)]
)
def test_randomized_response_matches_closed_form(epsilon: float, k: int, count: int) -> None:
    c = compose({RandomizedResponseEvent(epsilon, k): count}, DELTA)
    exact = invert(lambda e: rr_delta(e, epsilon, k, count), DELTA, count * epsilon)
    assert exact - 1e-9 <= c.epsilon <= exact * 1.01 + 1e-9
    for eps in (0.0, 0.3 * count * epsilon, 0.7 * count * epsilon):
        want = rr_delta(eps, epsilon, k, count)
        assert want - 1e-12 <= c.delta_at(eps) <= want * 1.01 + 1e-12
    # a pure ε event is binary randomized response: same composition
    if k == 2:
        assert compose({PureEvent(epsilon): count}, DELTA).epsilon == c.epsilon


def test_mixed_events_compose_and_report_pld() -> None:
    counts = {LaplaceEvent(20.0): 225, GaussianEvent(30.0): 100, RandomizedResponseEvent(0.5, 4): 3}
    c = compose(counts, DELTA)
    assert c.method == "pld"
    assert c.rho is not None
    assert c.pure_epsilon == math.inf
    alone = compose({LaplaceEvent(20.0): 225}, DELTA).epsilon
    assert c.epsilon > alone
    assert c.interval is not None
    assert c.epsilon_at(1e-3) < c.epsilon < c.epsilon_at(1e-9)
    assert c.epsilon_at(0.0) == math.inf
    assert c.delta_at(c.epsilon) <= DELTA * (1 + 1e-9)


def test_epsilon_never_exceeds_pure_sequential() -> None:
    # incommensurate events in the nearly pure regime: the PLD's grid rounding would overshoot,
    # the pure sum is exact there and bounds ε
    counts = {LaplaceEvent(0.7): 3, LaplaceEvent(1.0): 2}
    c = compose(counts, 1e-12)
    assert c.pure_epsilon == pytest.approx(3 / 0.7 + 2, rel=1e-15)
    assert c.epsilon <= c.pure_epsilon


def test_slack_shifts_epsilon_and_scales_delta() -> None:
    s, n = SAMPLER_LOSS_PER_COORDINATE * 3, 10800
    ideal = compose({LaplaceEvent(56.0): n}, DELTA)
    real = compose({LaplaceEvent(56.0, s): n}, DELTA)
    total = n * s
    assert real.slack == pytest.approx(total, rel=1e-12)
    assert real.epsilon == pytest.approx(
        ideal.epsilon_at(DELTA * math.exp(-total)) + total, rel=1e-12
    )
    assert real.pure_epsilon == pytest.approx(ideal.pure_epsilon + total, rel=1e-12)
    assert real.delta_at(5.0) == pytest.approx(
        math.exp(total) * ideal.delta_at(5.0 - total), rel=1e-9
    )
    g = compose({GaussianEvent(56.0, s): n}, DELTA)
    mu = math.sqrt(n) / 56.0
    assert g.epsilon == pytest.approx(
        gaussian_epsilon(DELTA * math.exp(-total), mu) + total, rel=1e-12
    )
    assert g.rho is None


def test_rdp_fallback_when_the_pld_would_be_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = {LaplaceEvent(20.0): 2000}
    pld = compose(counts, DELTA)
    assert pld.method == "pld"
    accountant = importlib.import_module("gazeguard.privacy.accounting.accountant")
    monkeypatch.setattr(accountant, "PLD_TARGET_POINTS", 100)
    cache_clear()
    try:
        rdp = compose(counts, DELTA)
        assert rdp.method == "rdp"
        assert pld.epsilon <= rdp.epsilon <= pld.epsilon * 1.5
        with pytest.raises(ConfigError, match="cannot resolve these releases"):
            compose(counts, DELTA, method="pld")
    finally:
        cache_clear()


def test_compose_is_cached_by_multiset() -> None:
    a = compose({LaplaceEvent(30.0): 100, GaussianEvent(9.0): 5}, DELTA)
    b = compose({GaussianEvent(9.0): 5, LaplaceEvent(30.0): 100, PureEvent(1.0): 0}, DELTA)
    assert a is b


@pytest.mark.parametrize(
    ("call", "field", "value"),
    [
        (lambda: compose({LaplaceEvent(1.0): -1}, DELTA), "counts[Laplace(λ/Δ1=1)]", -1),
        (lambda: compose({LaplaceEvent(1.0): 1.5}, DELTA), "counts[Laplace(λ/Δ1=1)]", 1.5),  # type: ignore[dict-item]
        (lambda: compose({"laplace": 1}, DELTA), "counts", "laplace"),  # type: ignore[dict-item]
        (lambda: compose({LaplaceEvent(1.0): 1}, 1.0), "delta", 1.0),
        (lambda: compose({LaplaceEvent(1.0): 1}, DELTA, method="fft"), "method", "fft"),  # type: ignore[arg-type]
        (lambda: compose({LaplaceEvent(1.0): 1}, DELTA).delta_at(-1.0), "epsilon", -1.0),
        (lambda: capacity({}, PrivacyLoss.pure(1.0)), "step", {}),
        (lambda: capacity(LaplaceEvent(1.0), 3.0), "cap", 3.0),  # type: ignore[arg-type]
    ],
)  # fmt: skip
def test_compose_validation_names_field_and_value(
    call: Callable[[], object], field: str, value: object
) -> None:
    assert_refused_naming(call, field, value)


# ----------------------------------------------------------------------------------- capacity
def test_capacity_is_consistent_with_compose_and_cached() -> None:
    cap = PrivacyLoss.approx(10.0, DELTA)
    chunk = {LaplaceEvent(56.0): 48}
    c = capacity(chunk, cap)
    assert 200 < c < 225  # λ = 56 is a little below what 225 chunks need (56.05)
    assert compose({LaplaceEvent(56.0): 48 * c}, DELTA).within(cap)
    assert not compose({LaplaceEvent(56.0): 48 * (c + 1)}, DELTA).within(cap)
    for used in (1, 10, c - 1, c, c + 5):
        assert capacity(chunk, cap, {LaplaceEvent(56.0): 48 * used}) == max(c - used, 0)
    # a partial chunk already released (e.g. a restart mid-way) counts too
    got = capacity(chunk, cap, {LaplaceEvent(56.0): 48 * 10 + 7})
    assert compose({LaplaceEvent(56.0): 48 * (10 + got) + 7}, DELTA).within(cap)
    assert not compose({LaplaceEvent(56.0): 48 * (11 + got) + 7}, DELTA).within(cap)


def test_capacity_other_caps() -> None:
    assert capacity(LaplaceEvent(2.0), PrivacyLoss.pure(10.0)) == 20
    assert capacity(LaplaceEvent(2.0), PrivacyLoss.pure(10.0), {PureEvent(1.0): 3}) == 14
    assert capacity(GaussianEvent(1.0), PrivacyLoss.pure(10.0)) == 0
    assert capacity(GaussianEvent(1.0), PrivacyLoss.zcdp(5.0)) == 10  # ρ = 1/2 each
    assert capacity(GaussianEvent(1.0, 1e-6), PrivacyLoss.zcdp(5.0)) == 0  # no ρ with slack
    g = capacity(GaussianEvent(10.0), PrivacyLoss.approx(1.0, DELTA))
    mu = math.sqrt(g) / 10.0
    assert gaussian_epsilon(DELTA, mu) <= 1.0 < gaussian_epsilon(DELTA, math.sqrt(g + 1) / 10.0)
    # already over the cap: nothing more
    assert capacity(LaplaceEvent(1.0), PrivacyLoss.approx(1.0, DELTA), {PureEvent(5.0): 1}) == 0


# ---------------------------------------------------------------------------------- calibrate
BUDGET = PrivacyLoss.approx(10.0, DELTA)


def test_calibrate_issue_13_figures() -> None:
    """The noise user-level (ε = 10, δ = 1e-6) per hour needs (issue 13): 225 chunks/hour."""
    n48, n1 = 225 * 48, 225
    assert calibrate("sequential", n48, BUDGET) == pytest.approx(1080.0, rel=1e-12)
    assert calibrate("sequential", n1, BUDGET) == pytest.approx(22.5, rel=1e-12)
    assert calibrate("laplace", n48, BUDGET) == pytest.approx(56.05, rel=2e-3)
    assert calibrate("laplace", n1, BUDGET) == pytest.approx(7.87, rel=2e-3)
    # exact Gaussian (the issue's 59 is what the zCDP conversion gives)
    assert calibrate("gaussian", n48, BUDGET) == pytest.approx(56.23, rel=1e-3)
    assert calibrate("gaussian", n1, BUDGET) == pytest.approx(8.116, rel=1e-3)
    rho = epsilon_to_rho(10.0, DELTA)
    assert calibrate("gaussian", n48, PrivacyLoss.zcdp(rho)) == pytest.approx(59.2, rel=2e-3)


@pytest.mark.parametrize("family", ["sequential", "laplace", "gaussian"])
@pytest.mark.parametrize(
    ("releases", "eps", "delta", "slack"),
    [(1, 1.0, 1e-6, 0.0), (48, 4.0, 1e-5, 1e-6), (500, 10.0, 1e-9, 0.0)],
)
def test_calibrate_round_trips(
    family: str, releases: int, eps: float, delta: float, slack: float
) -> None:
    budget = PrivacyLoss.approx(eps, delta)
    r = calibrate(family, releases, budget, slack)  # type: ignore[arg-type]
    event = GaussianEvent(r, slack) if family == "gaussian" else LaplaceEvent(r, slack)
    c = compose({event: releases}, delta)
    assert c.epsilon <= eps
    if family == "sequential":
        assert c.pure_epsilon <= eps
        assert releases * LaplaceEvent(r * (1 - 1e-12), slack).pure_epsilon > eps
    else:  # tight: a little less noise breaks the budget
        less = type(event)(r * (1 - (3e-4 if family == "laplace" else 1e-9)), slack)
        assert compose({less: releases}, delta).epsilon > eps


def test_calibrate_refusals_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="slack alone") as info:
        calibrate("laplace", 2 * 10**7, BUDGET, SAMPLER_LOSS_PER_COORDINATE)
    assert info.value.field == "budget"
    with pytest.raises(ConfigError) as info:
        calibrate("gaussian", 10, PrivacyLoss.pure(1.0))
    assert "'gaussian' needs an approx or zcdp budget" in str(info.value)
    with pytest.raises(ConfigError) as info:
        calibrate("gaussian", 10, PrivacyLoss.approx(1.0, 0.0))
    assert info.value.field == "budget.delta"
    with pytest.raises(ConfigError) as info:
        calibrate("laplace", 0, BUDGET)
    assert (info.value.field, info.value.value) == ("releases", 0)
    with pytest.raises(ConfigError) as info:
        calibrate("staircase", 1, BUDGET)  # type: ignore[arg-type]
    assert (info.value.field, info.value.value) == ("family", "staircase")
    # a pure budget for Laplace is sequential composition
    assert calibrate("laplace", 10, PrivacyLoss.pure(2.0)) == calibrate(
        "sequential", 10, PrivacyLoss.pure(2.0)
    )


@pytest.mark.parametrize(("eps", "delta"), [(0.1, 1e-5), (1.0, 1e-6), (10.0, 1e-6), (40.0, 1e-12)])
def test_analytic_gaussian_against_dp_accounting(eps: float, delta: float) -> None:
    sigma = analytic_gaussian_sigma(eps, delta, sensitivity=2.0)
    assert gaussian_delta(eps, 2.0 / sigma) <= delta
    assert gaussian_delta(eps, 2.0 / (sigma * (1 - 1e-9))) > delta  # smallest
    assert sigma == pytest.approx(2.0 * get_sigma_gaussian(eps, delta), rel=1e-3)
    classical = 2.0 * math.sqrt(2 * math.log(1.25 / delta)) / eps
    if eps < 1:
        assert sigma < classical


@pytest.mark.parametrize(("rho", "delta"), [(0.01, 1e-6), (0.5, 1e-6), (1.539, 1e-6), (20.0, 1e-9)])
def test_rho_to_epsilon_is_tight_and_inverts(rho: float, delta: float) -> None:
    eps = rho_to_epsilon(rho, delta)
    exact_gaussian = gaussian_epsilon(delta, math.sqrt(2 * rho))  # a ρ-zCDP mechanism
    assert exact_gaussian <= eps < rho + 2 * math.sqrt(rho * math.log(1 / delta))
    back = epsilon_to_rho(eps, delta)
    assert back == pytest.approx(rho, rel=1e-6)
    assert rho_to_epsilon(back, delta) <= eps


# ------------------------------------------------------------------------------ unit of privacy
def test_releases_within() -> None:
    assert releases_within(3679, 16) == 230  # the default plan's hour of chunks
    assert releases_within(79, 16) == 5  # ... and one raw sample's reach
    assert releases_within(80, 16) == 6  # a closed interval holds both ends
    assert releases_within(Fraction(3600), Fraction(16)) == 226
    assert releases_within(0.9, 0.3) == 4  # decimal values: 0.9/0.3 is exactly 3, not 2.99…
    assert releases_within(0, 1) == 1
    with pytest.raises(ConfigError) as info:
        releases_within(10, 0)
    assert (info.value.field, info.value.value) == ("period_s", 0)
    with pytest.raises(ConfigError) as info:
        releases_within(-1.0, 1)
    assert (info.value.field, info.value.value) == ("length_s", -1.0)


def log_ratio_dlap_to_rounded_laplace(z: int, t: float) -> mpmath.mpf:
    """ln of P(discrete Laplace(t) = z) / P(round(Lap(0, t)) = z), in high precision."""
    h = mpmath.mpf(1) / (2 * t)
    q = mpmath.exp(-1 / mpmath.mpf(t))
    dlap = (1 - q) / (1 + q) * q ** abs(z)
    rounded = (1 - mpmath.exp(-h)) if z == 0 else q ** abs(z) * mpmath.sinh(h)
    return mpmath.log(dlap / rounded)


def test_discrete_laplace_slack_against_high_precision_pmfs() -> None:
    with mpmath.workdps(60):
        for t in (2.0**10, 2.0**20, 3.5):
            logs = [log_ratio_dlap_to_rounded_laplace(z, t) for z in range(-3, 4)]
            want = float(max(logs) - min(logs))  # a + b of the slack model
            got = discrete_laplace_slack(t)
            assert want <= got <= want * (1 + 1e-8)
    assert discrete_laplace_slack(2.0**20) == pytest.approx(1 / (4 * 2.0**20), rel=1e-5)
    # the sampler's own slack is ln((1+η)/(1−η)): a = ln(1+η), b = −ln(1−η)
    assert (
        pytest.approx(math.log1p(ETA) - math.log1p(-ETA), rel=1e-12) == SAMPLER_LOSS_PER_COORDINATE
    )


def test_cached_squarings_give_the_composition_of_fresh_squaring() -> None:
    """The shared squarings (``_power``) change no bit of a count's composition, whatever
    counts were composed before at the same discretisation."""
    from gazeguard.privacy.accounting import accountant  # noqa: PLC0415

    event = LaplaceEvent(40.0)
    interval = 1e-3

    def fresh(count: int) -> accountant._Pmf:  # the squaring loop before the cache
        base, out = accountant._base_pmf(event, interval), None
        while True:
            if count & 1:
                out = base if out is None else out.compose(base)
            count >>= 1
            if not count:
                break
            base = base.compose(base)
        assert out is not None
        return out

    for counts in ((1, 52, 104, 4095, 4096, 6000), (6000, 4096, 52, 1)):
        cache_clear()
        for count in counts:
            got, want = accountant._self_composed(event, count, interval), fresh(count)
            assert (got.lower, got.infinity) == (want.lower, want.infinity)
            np.testing.assert_array_equal(got.probs, want.probs)
