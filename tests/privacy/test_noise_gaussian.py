"""The discrete Gaussian sampler and its calibration: the distribution (exact pmf, tails, moments,
OpenDP's sampler, the continuous Gaussian it approximates), the acceptance test's rare paths, the
privacy claims of the docstring checked numerically, the grid calibration and the analytic
Gaussian mechanism."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting import analytic_gaussian_sigma
from gazeguard.privacy.mechanisms.calibration import (
    calibrate_gaussian,
    calibrate_gaussian_epsilon_delta,
)
from gazeguard.privacy.mechanisms.discrete_gaussian import (
    GAUSS_ETA,
    GAUSS_KAPPA_MAX,
    GAUSS_SAMPLER_LOSS_PER_COORDINATE,
    GAUSS_SIGMA_INT_MIN,
    GAUSS_SIGMA_MAX,
    DiscreteGaussian,
    gaussian_kappa,
    gaussian_slack,
)
from gazeguard.privacy.mechanisms.randomness import InsecureSeededRandom, OsRandom
from tests.privacy._sampling import opendp_measurement, pooled_chi2, two_sample_p

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def exact_pmf(z: IntArray, sigma: float) -> FloatArray:
    """The discrete Gaussian pmf, normalised over ±(60σ + 10) (the rest is < e^{-1800})."""
    half = int(60 * sigma) + 10
    norm = float(np.sum(np.exp(-(np.arange(-half, half + 1) ** 2) / (2 * sigma**2))))
    return np.exp(-(z.astype(np.float64) ** 2) / (2 * sigma**2)) / norm


def chi2_against_pmf(draws: IntArray, sigma: float) -> float:
    """p-value of a χ² goodness-of-fit test of ``draws`` against the exact pmf (tails pooled)."""
    z = np.arange(-int(8 * sigma) - 2, int(8 * sigma) + 3)
    pmf = exact_pmf(z, sigma)
    keep = pmf * draws.size >= 5
    return pooled_chi2(draws, z[keep], pmf[keep])


@pytest.mark.parametrize("sigma", [1.0, 1.7, 3.7, 12.5])
def test_sampler_matches_the_exact_discrete_gaussian(sigma: float) -> None:
    """σ = 1 exercises the long acceptance path (exponent ≥ 8 for |y| ≥ 5: 0.7% of candidates)
    and the discrete Laplace's rejection of (−, 0) often."""
    draws = DiscreteGaussian(np.full(200_000, sigma)).sample(InsecureSeededRandom(11))
    assert draws.dtype == np.int64
    assert chi2_against_pmf(draws, sigma) > 1e-3


@pytest.mark.parametrize("sigma", [1.0, 3.7])
def test_tails_match_the_exact_discrete_gaussian(sigma: float) -> None:
    """P(|Z| ≥ k) for k at 2σ, 3σ and 4σ against the exact pmf (binomial tests)."""
    n = 1_000_000
    draws = np.abs(DiscreteGaussian(np.full(n, sigma)).sample(InsecureSeededRandom(12)))
    support = np.arange(0, int(60 * sigma) + 10)
    pmf = exact_pmf(support, sigma) * np.where(support == 0, 1.0, 2.0)  # of |Z|
    for mult in (2, 3, 4):
        k = math.ceil(mult * sigma)
        p = float(pmf[k:].sum())
        hits = int(np.count_nonzero(draws >= k))
        assert stats.binomtest(hits, n, p).pvalue > 1e-4, (k, hits, n * p)
    assert draws.max() < 12 * sigma  # P(|Z| ≥ 12σ) < 1e-30


def test_mean_and_variance_at_mechanism_scale() -> None:
    """At σ ≈ 2^20 the draws have mean 0 and variance σ² (the discrete Gaussian's variance is
    σ²·(1 − O(σ²e^{−2π²σ²})), i.e. σ² here), and are normal to KS precision."""
    sigma = 1.5 * 2.0**20
    n = 200_000
    draws = DiscreteGaussian(np.full(n, sigma)).sample_float(InsecureSeededRandom(13))
    assert np.all(draws == np.rint(draws))
    assert abs(float(draws.mean())) < 5 * sigma / math.sqrt(n)
    var = float(draws.var())
    assert abs(var / sigma**2 - 1) < 5 * math.sqrt(2 / n)
    assert stats.kstest(draws / sigma, stats.norm.cdf).pvalue > 1e-3


def test_sampler_matches_opendp() -> None:
    """Two-sample χ² against OpenDP's discrete Gaussian (OpenDP draws with its own entropy, so
    this test is random: it fails with probability about 1e-4 when both samplers are right)."""
    sigma = 3.7
    meas = opendp_measurement("gaussian", sigma)
    opendp_draws = np.array(meas([0] * 20_000), dtype=np.int64)
    ours = DiscreteGaussian(np.full(20_000, sigma)).sample(OsRandom())
    assert two_sample_p(ours, opendp_draws) > 1e-4
    # OpenDP's accounting for the same mechanism: ρ = Δ²/(2σ²), no correction term.
    assert meas.map(1) == pytest.approx(1 / (2 * sigma**2), rel=1e-12)


def test_determinism_with_the_insecure_seeded_source() -> None:
    sigma = np.array([[1.0, 2.0**20], [7.3, 1000.0]])
    sampler = DiscreteGaussian(np.repeat(sigma[..., None], 500, axis=2))
    a = sampler.sample(InsecureSeededRandom(99))
    b = sampler.sample(InsecureSeededRandom(99))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, sampler.sample(InsecureSeededRandom(100)))
    source = InsecureSeededRandom(99)
    first, second = sampler.sample(source), sampler.sample(source)
    assert not np.array_equal(first, second)  # the generator advances: fresh noise per call
    np.testing.assert_array_equal(sampler.sample_float(InsecureSeededRandom(99)), a)


def test_per_draw_parameters_and_shapes() -> None:
    sigma = np.array([[2.0, 2.0**20], [50.0, 1.0]])
    draws = DiscreteGaussian(np.repeat(sigma[..., None], 20_000, axis=2)).sample(
        InsecureSeededRandom(3)
    )
    assert draws.shape == (2, 2, 20_000)
    std = draws.std(axis=2)
    np.testing.assert_allclose(std[0, 1], 2.0**20, rtol=0.03)
    np.testing.assert_allclose(std[1, 0], 50.0, rtol=0.03)
    assert DiscreteGaussian(np.ones((0, 3))).sample(OsRandom()).shape == (0, 3)
    assert DiscreteGaussian(3.0).sample(OsRandom()).shape == ()


@pytest.mark.parametrize("bad", [0.99, 0.0, -1.0, math.nan, math.inf, GAUSS_SIGMA_MAX])
def test_sampler_refuses_parameters_outside_its_analysis(bad: float) -> None:
    with pytest.raises(ConfigError, match="'sigma'"):
        DiscreteGaussian(np.array([1.0, bad]))


@pytest.mark.parametrize("exponent", [0.3, 5.0, 8.0, 9.5])
def test_acceptance_probability_including_the_staged_path(exponent: float) -> None:
    """``_accept`` is Bernoulli(e^{−b}): exponents ≥ 8 go through one Bernoulli(e^{−8}) stage
    on top of Bernoulli(e^{−(b−8)})."""
    sigma = 3.0
    y = np.full(2_000_000 if exponent > 6 else 200_000, sigma + sigma * math.sqrt(2 * exponent))
    b = ((np.abs(y[0]) - sigma) / sigma) ** 2 / 2
    accepted = DiscreteGaussian._accept(InsecureSeededRandom(5), y, np.full(y.size, sigma))
    hits = int(np.count_nonzero(accepted))
    assert stats.binomtest(hits, y.size, math.exp(-b)).pvalue > 1e-4


class ScriptedBytes:
    """A RandomSource that returns prescribed bytes (to drive the 2^-16 tie path of the
    Bernoulli trial deterministically); raises if asked for more than it holds."""

    secure = False

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    def bytes(self, n: int) -> bytes:
        chunk = self.chunks.pop(0)
        assert len(chunk) == n, (len(chunk), n)
        return chunk


def test_bernoulli_decides_ties_on_the_low_bits() -> None:
    """``w < T`` with ``w = high·2^47 + low``: the high 16 bits decide unless they tie with T's,
    then the low 47 bits do — exactly the 63-bit comparison."""
    t = np.array([3 << 47 | 5, 3 << 47 | 5, 3 << 47 | 5, 1 << 63, 0], dtype=np.uint64)
    high = np.array([3, 3, 2, 65535, 0], dtype="<u2").tobytes()
    # ties: entries 0, 1 and 4 (T = 0 has top bits 0); the low word's top 17 bits are ignored
    low = np.array([4 | 0xFFFF8 << 44, 5, 0], dtype="<u8").tobytes()
    got = DiscreteGaussian._bernoulli(ScriptedBytes([high, low]), t)
    expected = [4 < 5, 5 < 5, True, True, False]
    assert got.tolist() == expected
    # Tie of the top bits on the threshold 2^63 is impossible: high ≤ 65535 < 65536.
    assert DiscreteGaussian._bernoulli(ScriptedBytes([high]), np.full(5, 1 << 63, np.uint64)).all()


def test_sampling_cost_is_three_rounds_of_randomness() -> None:
    """Counts the bytes a 48×64 chunk consumes: ≈ 16 per draw (8 for the discrete Laplace
    candidate and 2 for the acceptance, × 1.6 candidates: 1 in the first round, 2 per rejection
    in the second, 8 per rejection after that), read ahead in one block (one system call for
    most chunks); a regression to 63-bit acceptance words or unbatched loops would show here."""

    class Counting(InsecureSeededRandom):
        def __init__(self, seed: int) -> None:
            super().__init__(seed)
            self.total = 0
            self.calls = 0

        def bytes(self, n: int) -> bytes:
            self.total += n
            self.calls += 1
            return super().bytes(n)

    source = Counting(1)
    DiscreteGaussian(np.full((48, 64), 2.0**20)).sample_float(source)
    assert 14 * 3072 < source.total < 18 * 3072
    assert source.calls <= 6


# ------------------------------------------------------------------ the docstring's privacy claims
@settings(max_examples=60, deadline=None)
@given(
    sigma=st.floats(0.6, 4.0),
    shift=st.integers(1, 4),
    alpha=st.integers(2, 12) | st.floats(1.05, 12.0),
)
def test_renyi_divergence_of_integer_shift_is_at_most_the_continuous_one(
    sigma: float, shift: int, alpha: float
) -> None:
    """``D_α(N_Z(0,σ²) ‖ N_Z(v,σ²)) ≤ αv²/(2σ²)`` for integer v — with equality at integer α —
    summed exactly over the support: the discrete Gaussian needs no zCDP correction."""
    half = int(80 * sigma) + 20
    y = np.arange(-half, half + 1, dtype=np.float64)
    log_p = -(y**2) / (2 * sigma**2)
    log_q = -((y - shift) ** 2) / (2 * sigma**2)
    log_norm = special.logsumexp(log_p)  # the same for q: integer shift
    d_alpha = special.logsumexp(alpha * log_p + (1 - alpha) * log_q - log_norm) / (alpha - 1)
    bound = alpha * shift**2 / (2 * sigma**2)
    assert d_alpha <= bound * (1 + 1e-12) + 1e-12
    if float(alpha).is_integer():
        assert d_alpha == pytest.approx(bound, rel=1e-9)


@pytest.mark.parametrize("sigma", [1.0, 2.5, 8.0, 40.0])
def test_discrete_and_rounded_gaussian_agree_within_kappa(sigma: float) -> None:
    """``|ln(P_DG(z)/P_RG(z))| ≤ κ(σ)`` on ``|z| ≤ 64σ``, P_RG = P(rint(X) = z), X ~ N(0, σ²)."""
    z = np.arange(0, int(64 * sigma) + 1, dtype=np.float64)
    half = int(80 * sigma) + 20
    support = np.arange(-half, half + 1, dtype=np.float64)
    log_dg = -(z**2) / (2 * sigma**2) - special.logsumexp(-(support**2) / (2 * sigma**2))
    # P(z−½ < X < z+½) for z ≥ 0 = Φ(−(z−½)/σ) − Φ(−(z+½)/σ), in logs (accurate in the tail)
    upper = special.log_ndtr(-(z - 0.5) / sigma)
    lower = special.log_ndtr(-(z + 0.5) / sigma)
    log_rg = upper + np.log(-np.expm1(lower - upper))
    gap = np.abs(log_dg - log_rg)
    assert np.all(gap <= gaussian_kappa(sigma) * (1 + 1e-6) + 1e-13)
    assert float(gap.max()) > 0.01 * float(gaussian_kappa(sigma))  # the bound is not vacuous


def test_kappa_at_mechanism_scale() -> None:
    assert float(gaussian_kappa(GAUSS_SIGMA_INT_MIN)) <= GAUSS_KAPPA_MAX * (1 + 1e-12)
    assert float(gaussian_kappa(2.0**20)) == pytest.approx(2.0**-31)
    assert pytest.approx(2 * GAUSS_ETA, rel=1e-6) == GAUSS_SAMPLER_LOSS_PER_COORDINATE


# --------------------------------------------------------------------------------- calibration
@settings(max_examples=200, deadline=None)
@given(
    delta2=st.floats(1e-6, 1e6),
    r=st.floats(0.05, 2000.0),
    m=st.integers(1, 64),
    error_fraction=st.floats(0.0, 1.0),
)
def test_grid_calibration_charges_the_rounding(
    delta2: float, r: float, m: int, error_fraction: float
) -> None:
    """σ_int = r·(Δ2/γ + 2√m) exactly; σ = γσ_int ≥ r·Δ2 (inflation charged, and small);
    γ a power of two ≥ 2·input_error; σ_int within the sampler's analysed range. (The FFT
    error bound is drawn up to the largest that still allows σ_int ≥ 2^19; the refusal beyond
    is tested below.)"""
    input_error = error_fraction * r * delta2 * 2.0**-21
    cal = calibrate_gaussian(np.array([delta2]), m, r, input_error)
    grid = float(cal.grid[0])
    assert grid == 2.0 ** round(math.log2(grid))
    assert grid >= 2 * input_error
    assert cal.integer_sensitivity[0] == delta2 / grid + 2 * math.sqrt(m)
    assert cal.sigma_int[0] == pytest.approx(r * cal.integer_sensitivity[0], rel=1e-15)
    assert cal.sigma_int[0] >= r * (delta2 / grid + 2 * math.sqrt(m)) * (1 - 2**-52)
    assert cal.sigma[0] == cal.sigma_int[0] * grid
    assert cal.sigma[0] >= r * delta2
    assert cal.sigma[0] <= r * delta2 * (1 + 4 * math.sqrt(m) * r * 2**-19)
    assert GAUSS_SIGMA_INT_MIN <= cal.sigma_int[0] < GAUSS_SIGMA_MAX
    assert cal.rho[0] == pytest.approx(1 / (2 * r**2))
    assert cal.slack_epsilon_per_coordinate[0] <= GAUSS_SAMPLER_LOSS_PER_COORDINATE + (
        2 * GAUSS_KAPPA_MAX
    )
    DiscreteGaussian(cal.sigma_int)  # in the sampler's range


@settings(max_examples=200, deadline=None)
@given(
    m=st.integers(1, 12),
    data=st.data(),
)
def test_rounded_integers_respect_the_integer_sensitivity(m: int, data: st.DataObject) -> None:
    """For any coefficients c, c' with ‖c − c'‖₂ ≤ Δ2, computed with errors ≤ δ ≤ γ/2, the
    integers rint(ĉ/γ) differ by at most Δ_int = Δ2/γ + 2√m in L2 — the inequality the
    calibration charges for."""
    delta2 = data.draw(st.floats(1e-3, 1e3))
    cal = calibrate_gaussian(np.array([delta2]), m, 1.0, 0.0)
    grid = float(cal.grid[0])
    err = grid / 2
    c = np.array(data.draw(st.lists(st.floats(-1e4, 1e4), min_size=m, max_size=m)))
    direction = np.array(data.draw(st.lists(st.floats(-1, 1), min_size=m, max_size=m)))
    norm = float(np.linalg.norm(direction))
    step = direction / norm * delta2 * data.draw(st.floats(0, 1)) if norm > 0 else direction
    e1 = np.array(data.draw(st.lists(st.floats(-err, err), min_size=m, max_size=m)))
    e2 = np.array(data.draw(st.lists(st.floats(-err, err), min_size=m, max_size=m)))
    u = np.rint((c + e1) / grid)
    v = np.rint((c + step + e2) / grid)
    assert float(np.linalg.norm(u - v)) <= cal.integer_sensitivity[0] * (1 + 1e-12)


def test_calibration_refuses_out_of_range_multipliers() -> None:
    with pytest.raises(ConfigError, match=r"'noise_multiplier'.*too large"):
        calibrate_gaussian(np.array([1.0]), 16, 2.0**17, 0.0)
    with pytest.raises(ConfigError, match=r"'noise_multiplier'.*too small"):
        calibrate_gaussian(np.array([1.0]), 1, 1e-3, 1e-9)
    with pytest.raises(ConfigError, match="'noise_multiplier'"):
        calibrate_gaussian(np.array([1.0, 2.0]), 1, np.array([1.0, -1.0]), 0.0)
    with pytest.raises(ConfigError, match="'sensitivity_l2'"):
        calibrate_gaussian(np.array([math.nan]), 1, 1.0, 0.0)
    with pytest.raises(ConfigError, match="'m'"):
        calibrate_gaussian(np.array([1.0]), 0, 1.0, 0.0)


# ------------------------------------------------------------------------- analytic Gaussian
def reference_delta(s: float, epsilon: float) -> float:
    """Balle & Wang's δ(ε) at noise multiplier s, in 60-digit arithmetic."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(60):
        s_, e_ = mpmath.mpf(s), mpmath.mpf(epsilon)
        a = 1 / (2 * s_) - e_ * s_
        b = -1 / (2 * s_) - e_ * s_
        return float(mpmath.ncdf(a) - mpmath.exp(e_) * mpmath.ncdf(b))


def test_analytic_gaussian_known_value() -> None:
    """Balle & Wang 2018: ε = 1, δ = 1e-5, Δ = 1 needs σ ≈ 3.73 (the classical bound
    √(2 ln(1.25/δ))/ε = 4.84)."""
    assert analytic_gaussian_sigma(1.0, 1e-5, 1.0) == pytest.approx(3.7306, abs=2e-4)
    assert analytic_gaussian_sigma(1.0, 1e-5, 2.5) == pytest.approx(
        2.5 * analytic_gaussian_sigma(1.0, 1e-5, 1.0), rel=1e-12
    )


@settings(max_examples=80, deadline=None)
@given(epsilon=st.floats(0.01, 60.0), log_delta=st.floats(-30.0, -1.0))
def test_analytic_gaussian_is_tight_and_safe(epsilon: float, log_delta: float) -> None:
    """The returned σ satisfies Balle–Wang's condition in 60-digit arithmetic, and 1e-6 less
    noise would not (the bisection is exact up to its certified rounding margin)."""
    delta = 10.0**log_delta
    s = analytic_gaussian_sigma(epsilon, delta, 1.0)
    assert reference_delta(s, epsilon) <= delta
    assert reference_delta(s * (1 - 1e-6), epsilon) > delta


@pytest.mark.parametrize(
    ("epsilon", "delta", "field"),
    [(0.0, 1e-6, "epsilon"), (math.inf, 1e-6, "epsilon"), (1.0, 0.0, "delta"), (1.0, 1.0, "delta")],
)
def test_analytic_gaussian_refuses_bad_arguments(epsilon: float, delta: float, field: str) -> None:
    with pytest.raises(ConfigError, match=f"'{field}'"):
        analytic_gaussian_sigma(epsilon, delta, 1.0)
    with pytest.raises(ConfigError, match="'sensitivity'"):
        analytic_gaussian_sigma(1.0, 1e-6, 0.0)


@pytest.mark.parametrize("m", [1, 7, 64])
def test_calibration_from_epsilon_delta_delivers_it(m: int) -> None:
    """Per release: the ideal Gaussian at the calibrated r is (ε', δ')-DP, and the sampler and
    discretisation slack over m coordinates brings it back to at most (ε, δ)."""
    eps = np.array([0.3, 1.0, 8.0])
    delta = 1e-7
    delta2 = np.array([2.0, 0.01, 300.0])
    cal = calibrate_gaussian_epsilon_delta(delta2, m, eps, delta, 1e-13)
    assert cal.epsilon is not None
    assert cal.delta == delta
    assert np.all(cal.sigma >= cal.noise_multiplier * delta2)
    for i in range(3):
        budget = float(eps[i]) - m * (GAUSS_SAMPLER_LOSS_PER_COORDINATE + 2 * GAUSS_KAPPA_MAX)
        ideal_delta = reference_delta(float(cal.noise_multiplier[i]), budget)
        got_eps, got_delta = gaussian_slack(budget, ideal_delta, m)
        assert got_eps <= eps[i] * (1 + 1e-12)
        assert got_delta <= delta
        # and not wastefully: the ideal mechanism alone sits just below the target δ
        assert ideal_delta > 0.99 * delta


def test_calibration_from_epsilon_delta_refuses_tiny_epsilon() -> None:
    with pytest.raises(ConfigError, match=r"'epsilon'.*too small"):
        calibrate_gaussian_epsilon_delta(np.array([1.0]), 100, 1e-4, 1e-6, 0.0)
    with pytest.raises(ConfigError, match="'delta'"):
        calibrate_gaussian_epsilon_delta(np.array([1.0]), 1, 1.0, 0.0, 0.0)
    with pytest.raises(ConfigError, match=r"'epsilon'.*above 1000"):
        calibrate_gaussian_epsilon_delta(np.array([1.0]), 1, 2000.0, 1e-6, 0.0)


def test_gaussian_slack() -> None:
    assert gaussian_slack(1.0, 1e-6, 0) == (1.0, 1e-6)
    eps, delta = gaussian_slack(1.0, 1e-6, 10_800, kappa=0.0)
    assert eps == pytest.approx(1.0 + 10_800 * GAUSS_SAMPLER_LOSS_PER_COORDINATE)
    assert delta == pytest.approx(1e-6 * (1 + GAUSS_ETA) ** 10_800, rel=1e-9)
    assert delta > 1e-6
    # a huge ε (low-privacy accounting) does not overflow; the tail term stays negligible
    eps, delta = gaussian_slack(700.0, 1e-6, 100)
    assert eps == pytest.approx(700.0 + 100 * (GAUSS_SAMPLER_LOSS_PER_COORDINATE + 2**-28))
    assert 1e-6 < delta < 1e-6 * (1 + 1e-4)
    assert gaussian_slack(5000.0, 1e-6, 100)[1] == 1.0  # e^ε·e^-2000: the bound says nothing
    with pytest.raises(ConfigError, match="'coordinates'"):
        gaussian_slack(1.0, 1e-6, -1)
    with pytest.raises(ConfigError, match="'delta'"):
        gaussian_slack(1.0, 1.0, 1)
