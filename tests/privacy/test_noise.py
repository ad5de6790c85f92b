"""The discrete Laplace sampler: its distribution (exact pmf, OpenDP's sampler, the continuous
Laplace it approximates), its randomness sources and the grid calibration."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting import discrete_laplace_slack
from gazeguard.privacy.mechanisms import (
    DiscreteLaplace,
    InsecureSeededRandom,
    OsRandom,
    random_source,
)
from gazeguard.privacy.mechanisms.calibration import calibrate_laplace
from gazeguard.privacy.mechanisms.discrete_laplace import ETA, SAMPLER_LOSS_PER_COORDINATE, T_MAX
from tests.privacy._sampling import opendp_measurement, pooled_chi2, two_sample_p

IntArray = npt.NDArray[np.int64]


def exact_pmf(z: npt.NDArray[np.int64], t: float) -> npt.NDArray[np.float64]:
    q = math.exp(-1 / t)
    return (1 - q) / (1 + q) * q ** np.abs(z)


def chi2_against_pmf(draws: IntArray, t: float) -> float:
    """p-value of a χ² goodness-of-fit test of ``draws`` against the exact pmf (tails pooled)."""
    half = int(np.ceil(t * math.log(draws.size / 5)))  # keep cells with expected count ≥ ~5
    z = np.arange(-half, half + 1)
    return pooled_chi2(draws, z, exact_pmf(z, t))


@pytest.mark.parametrize("stage_length", [11.0, 1.0])
@pytest.mark.parametrize("t", [1.0, 1.7, 3.7, 12.5])
def test_sampler_matches_the_exact_discrete_laplace(t: float, stage_length: float) -> None:
    """Small t makes the rejection of (−, 0) frequent; stages of length 1 make the restart
    (E beyond the stage, J += 1) happen for 37% of the draws instead of 0.002%."""
    sampler = DiscreteLaplace(np.full(200_000, t), stage_length=stage_length)
    draws = sampler.sample(InsecureSeededRandom(1))
    assert draws.dtype == np.int64
    assert chi2_against_pmf(draws, t) > 1e-3
    assert abs(float(np.mean(draws))) < 6 * math.sqrt(2) * t / math.sqrt(draws.size) + 0.01


def test_sampler_matches_opendp() -> None:
    """Two-sample χ² against OpenDP's discrete Laplace (OpenDP draws with its own entropy, so
    this test is random: it fails with probability about 1e-4 when both samplers are right)."""
    t = 3.7
    opendp_draws = np.array(opendp_measurement("laplace", t)([0] * 20_000), dtype=np.int64)
    ours = DiscreteLaplace(np.full(20_000, t)).sample(OsRandom())
    assert two_sample_p(ours, opendp_draws) > 1e-4


def test_large_scale_is_laplace_on_a_fine_grid() -> None:
    """At the scales the mechanisms use (t ≈ 2^20) the draws are Laplace(t) to KS precision."""
    t = 1.5 * 2.0**20
    draws = DiscreteLaplace(np.full(100_000, t)).sample(InsecureSeededRandom(2))
    p = stats.kstest(draws / t, stats.laplace.cdf).pvalue
    assert p > 1e-3
    assert np.all(draws == np.rint(draws))


def test_per_draw_parameters_and_shapes() -> None:
    t = np.array([[2.0, 2.0**20], [50.0, 1.0]])
    sampler = DiscreteLaplace(np.repeat(t[..., None], 20_000, axis=2))
    draws = sampler.sample(InsecureSeededRandom(3))
    assert draws.shape == (2, 2, 20_000)
    scale = np.mean(np.abs(draws), axis=2)  # ≈ t for large t
    assert scale[0, 1] == pytest.approx(2.0**20, rel=0.03)
    assert scale[1, 0] == pytest.approx(50.0, rel=0.03)
    floats = sampler.sample_float(InsecureSeededRandom(3))
    np.testing.assert_array_equal(floats, draws)  # same stream, same values
    assert DiscreteLaplace(np.ones((0, 3))).sample(OsRandom()).shape == (0, 3)


@pytest.mark.parametrize("bad", [0.5, 0.0, -1.0, math.nan, T_MAX])
def test_sampler_refuses_parameters_outside_its_analysis(bad: float) -> None:
    with pytest.raises(ConfigError, match="'t'"):
        DiscreteLaplace(np.array([bad]))


@pytest.mark.parametrize("bad", [0.4, 12.5, math.nan])
def test_sampler_refuses_stages_outside_its_analysis(bad: float) -> None:
    with pytest.raises(ConfigError, match="'stage_length'"):
        DiscreteLaplace(np.array([2.0]), stage_length=bad)


def test_sources() -> None:
    assert OsRandom().secure
    assert len(OsRandom().bytes(33)) == 33
    assert OsRandom().bytes(16) != OsRandom().bytes(16)
    insecure = random_source(7)
    assert not insecure.secure
    assert insecure.bytes(8) != insecure.bytes(8)  # the generator advances
    assert random_source(7).bytes(8) == InsecureSeededRandom(7).bytes(8)
    assert random_source(None).secure
    with pytest.raises(ConfigError, match="'seed'"):
        random_source(1.5)  # type: ignore[arg-type]


def test_calibration_charges_grid_and_sampler_honestly() -> None:
    l1 = np.array([10.0, 0.001, 4000.0])
    eps = np.array([1.0, 0.48, 48.0])
    m = 15
    cal = calibrate_laplace(l1, m, eps, input_error=np.full(3, 1e-14))
    budget = eps - m * cal.slack
    np.testing.assert_allclose(cal.scale, (l1 + 2 * m * cal.grid) / budget, rtol=1e-15)
    # The privacy loss of the integers, (Δ1/γ + 2m)/t, plus the sampler's and the discrete
    # Laplace's charge (loss.py), is exactly ε; the charge covers the final t.
    loss = (l1 / cal.grid + 2 * m) / cal.t + m * cal.slack
    np.testing.assert_allclose(loss, eps, rtol=1e-12)
    actual = SAMPLER_LOSS_PER_COORDINATE + np.array([discrete_laplace_slack(t) for t in cal.t])
    assert np.all(cal.slack >= actual)
    assert np.all(cal.slack <= actual * 1.01)
    assert np.all(cal.t >= 2.0**20)
    assert np.all(cal.t < 2.0**21 * 1.01)
    np.testing.assert_array_equal(np.log2(cal.grid), np.rint(np.log2(cal.grid)))
    assert pytest.approx(2 * ETA, rel=1e-6) == SAMPLER_LOSS_PER_COORDINATE


def test_calibration_keeps_the_grid_above_rounding_error() -> None:
    cal = calibrate_laplace(np.array([1.0]), 1, np.array([1.0]), input_error=np.array([1e-9]))
    assert cal.grid[0] >= 2e-9
    with pytest.raises(ConfigError, match=r"'epsilon'.*too large"):
        calibrate_laplace(np.array([1.0]), 1, np.array([1e9]), input_error=np.array([1e-9]))
    with pytest.raises(ConfigError, match=r"'epsilon'.*too small"):
        calibrate_laplace(np.array([1.0]), 10_000, np.array([1e-3]), input_error=np.array([1e-15]))
