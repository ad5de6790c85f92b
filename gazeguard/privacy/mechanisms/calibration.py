"""Noise calibration per noise family: from ε (or a noise multiplier) to a grid, a scale and a
sampler, with every cost of the discrete, grid-based sampling charged honestly.

A release noises ``m`` coefficients per feature. Between neighbours the exact coefficients differ
by at most the family's sensitivity ``Δ`` (L1 for Laplace, L2 for Gaussian; see
:class:`~gazeguard.privacy.mechanisms.registry.Sensitivity`). Rounding to the power-of-two grid
``γ``
moves each coordinate by at most ``γ/2`` and the transform's floating-point error is kept below
``γ/2``, so the integers that are actually noised differ by at most ``Δ + 2mγ`` (L1) — that is the
*effective sensitivity*. The **noise multiplier** (``ratio``) is ``scale / effective sensitivity``:
the number an accountant composes. A sampler whose probabilities are exact only up to a relative
error ``η`` adds ``ln((1+η)/(1−η))`` of privacy loss per coordinate: the ``slack``, reported
separately so that an accountant adds it to ε (pure loss, composes by addition).

Two ways in:

* ``epsilon`` (Laplace): the classic per-release ε, ``λ = (Δ1 + 2mγ)/(ε − m·slack_coord)``
  (:func:`calibrate_laplace`), so the stated ε holds exactly.
* ``ratio``: a noise multiplier chosen by the accountant for a budget per hour
  (:mod:`gazeguard.privacy.accounting`): ``scale = ratio·(Δ + 2mγ)``.

The grid and its cost, charged honestly (:func:`calibrate_laplace`; the samplers are
:mod:`~gazeguard.privacy.mechanisms.discrete_laplace` and
:mod:`~gazeguard.privacy.mechanisms.discrete_gaussian`)
    * Rounding moves each coordinate by at most ``γ/2``; the floating-point transform moves it by
      at most ``δ`` (a public bound on FFT rounding error, see ``transforms.fft_error_bound``). We
      require ``δ ≤ γ/2``, so between neighbours ``|u_i − u'_i| ≤ |c_i − c'_i|/γ + 2`` and
      ``‖u − u'‖₁ ≤ Δ1/γ + 2m`` for ``m`` coefficients.
    * Discrete Laplace with parameter ``t`` on integers is ``(‖u − u'‖₁/t)``-DP, so with
      ``λ = t·γ`` the loss is ``(Δ1 + 2mγ)/λ``.
    * Our sampler is exact up to floating-point error in ``log`` and in the 64-bit uniforms; we
      bound the relative error of every integer's probability by ``ETA = 2^-21`` (derivation in
      :class:`~gazeguard.privacy.mechanisms.discrete_laplace.DiscreteLaplace`), which adds at
      most ``ln((1+ETA)/(1−ETA)) ≈ 9.5e-7`` per coordinate to the privacy loss.
    * Hence ``λ = (Δ1 + 2mγ) / (ε − m·ln((1+ETA)/(1−ETA)))``: slightly larger than the ideal
      ``Δ1/ε``; the stated ε is the true bound. ``γ`` is the largest power of two ``≤ λ·2^-20``
      (so ``t ≈ 2^20``: the grid is a millionth of the noise scale, the inflation of λ is about
      ``2m/(ε·2^20)``, e.g. 6e-5 for m = 15, ε = 0.48).
    * Gaussian noise is gridded the same way, paid in L2 by inflating σ
      (:func:`calibrate_gaussian`, :func:`calibrate_gaussian_epsilon_delta`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NoReturn

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting import analytic_gaussian_sigma
from gazeguard.privacy.mechanisms.discrete_gaussian import (
    GAUSS_ETA,
    GAUSS_KAPPA_MAX,
    GAUSS_SAMPLER_LOSS_PER_COORDINATE,
    GAUSS_SIGMA_INT_MIN,
    GAUSS_SIGMA_MAX,
    DiscreteGaussian,
    gaussian_kappa,
)
from gazeguard.privacy.mechanisms.discrete_laplace import (
    SAMPLER_LOSS_PER_COORDINATE,
    T_MAX,
    DiscreteLaplace,
    laplace_slack,
)
from gazeguard.privacy.mechanisms.randomness import RandomSource

FloatArray = npt.NDArray[np.float64]

#: ``log2`` of the target ratio noise scale / grid (``t ≈ 2^20``).
GRID_LOG2_BELOW_SCALE = 20
#: Below this ``t`` the grid is too coarse for the noise to be Laplace-like; refused.
T_MIN = 2.0**10
#: ``log2`` of the target ratio σ / grid for Gaussian noise (``σ_int ≈ 2^20``).
GAUSS_GRID_LOG2_BELOW_SCALE = 20


@dataclass(frozen=True)
class NoiseCalibration:
    """Noise parameters of one release, per feature (arrays of shape (F,)).

    Attributes:
        family: ``laplace`` or ``gaussian``.
        scale: λ (Laplace scale) or σ (Gaussian standard deviation) of every noised coefficient,
            in the feature's (coefficient) units.
        grid: γ, a power of two; every released coefficient is an integer multiple of it.
        ratio: noise multiplier, ``scale / (Δ + 2mγ)``: what the accountant composes.
        slack: additive privacy loss per release for the sampler's inexactness (``m`` coordinates).
        epsilon: pure ε per feature per release (``1/ratio + slack`` for Laplace; ``inf`` for
            Gaussian, which has no pure guarantee).
        m: noised coefficients per feature.
        sampler: draws the integer noise, shape (F, m).
        delta: the per-release δ that goes with a Gaussian's per-release ε (``epsilon``
            calibration only; the accountant states (ε, δ) otherwise), 0 for Laplace.
    """

    family: str
    scale: FloatArray
    grid: FloatArray
    ratio: FloatArray
    slack: FloatArray
    epsilon: FloatArray
    m: int
    sampler: DiscreteLaplace | DiscreteGaussian
    delta: float = 0.0

    def sample(self, source: RandomSource) -> FloatArray:
        """Integer-valued float64 (F, m) noise in grid steps."""
        return self.sampler.sample_float(source)


def _laplace_from_ratio(
    l1: FloatArray, m: int, ratio: FloatArray, input_error: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """``(scale, grid)`` with ``scale = ratio·(l1 + 2mγ)``, γ ≈ scale·2^-20 (≥ 2·input_error)."""
    grid = np.exp2(np.floor(np.log2(ratio * l1)) - GRID_LOG2_BELOW_SCALE)
    grid = np.maximum(grid, np.exp2(np.ceil(np.log2(2.0 * input_error))))
    scale = ratio * (l1 + 2.0 * m * grid)
    while np.any(scale / grid >= T_MAX):
        grid = np.where(scale / grid >= T_MAX, 2.0 * grid, grid)
        scale = ratio * (l1 + 2.0 * m * grid)
    return scale, grid


def calibrate_noise(
    family: str,
    *,
    sensitivity_l1: FloatArray,
    sensitivity_l2: FloatArray,
    m: int,
    input_error: FloatArray,
    epsilon: FloatArray | None = None,
    ratio: FloatArray | None = None,
    delta: float | None = None,
) -> NoiseCalibration:
    """Calibrate ``family`` noise for ``m`` coefficients per feature (all arrays (F,)).

    Exactly one of ``epsilon`` (per-release ε; with ``delta`` for Gaussian noise, through the
    analytic Gaussian mechanism) or ``ratio`` (noise multiplier, as the accountant chose it).

    Raises:
        ConfigError: an unknown family, both or neither of ``epsilon``/``ratio``, a Gaussian
            ``epsilon`` without ``delta``, or values the grid cannot serve (ε too small for
            ``m`` coefficients, or noise below the transform's rounding error).
    """
    if (epsilon is None) == (ratio is None):
        raise ConfigError("epsilon", epsilon, "give exactly one of epsilon or a noise multiplier")
    if ratio is not None and (not np.all(np.isfinite(ratio)) or np.any(np.asarray(ratio) <= 0)):
        raise ConfigError("noise_multiplier", ratio, "must be finite and > 0")
    if family == "gaussian":
        return _gaussian(
            sensitivity_l2, m, input_error=input_error, epsilon=epsilon, ratio=ratio, delta=delta
        )
    if family != "laplace":
        raise ConfigError("noise", family, "must be 'laplace' or 'gaussian'")
    # Per release: the sampler's inexactness and the discrete Laplace's distance from the
    # continuous pair the accountant composes, per coordinate (loss.py, "Sampler slack").
    if epsilon is not None:
        cal = calibrate_laplace(sensitivity_l1, m, epsilon, input_error)
        grid = cal.grid
        r = cal.scale / (sensitivity_l1 + 2.0 * m * grid)
        slack = m * cal.slack  # what the calibration paid for, within ε
        eps = np.asarray(epsilon, dtype=np.float64)
        # the accountant charges 1/r + slack: never a hair above the stated ε (float rounding)
        while np.any(over := 1.0 / r + slack > eps):
            r = np.where(over, np.nextafter(r, np.inf), r)
        scale = r * (sensitivity_l1 + 2.0 * m * grid)
        t = scale / grid
    else:
        r = np.asarray(ratio, dtype=np.float64)
        scale, grid = _laplace_from_ratio(sensitivity_l1, m, r, input_error)
        t = scale / grid
        # charged at t ≤ 2^GRID_LOG2_BELOW_SCALE, where the grid puts every t but for coarse
        # input error: the slack decreases in t, so it is a bound that does not move with the
        # noise; one noise multiplier for all features, one slack too (the largest), so that
        # the features share one accounting event
        per = SAMPLER_LOSS_PER_COORDINATE + laplace_slack(
            np.clip(t, 1.0, 2.0**GRID_LOG2_BELOW_SCALE)
        )
        slack = np.full_like(per, m * per.max())
        eps = 1.0 / r + slack
    if np.any(t < T_MIN):
        raise ConfigError(
            "epsilon",
            float(np.max(eps)),
            "too large: the noise would be smaller than the transform's rounding error allows; "
            "use a smaller epsilon (more noise)",
        )
    return NoiseCalibration(
        family="laplace",
        scale=scale,
        grid=grid,
        ratio=r,
        slack=slack,
        epsilon=eps,
        m=m,
        sampler=DiscreteLaplace(np.repeat(t[:, None], m, axis=1)),
    )


def _gaussian(
    l2: FloatArray,
    m: int,
    *,
    input_error: FloatArray,
    epsilon: FloatArray | None,
    ratio: FloatArray | None,
    delta: float | None,
) -> NoiseCalibration:
    """Discrete Gaussian noise (:func:`calibrate_gaussian`): its
    pure ε is infinite; the accountant composes its noise multiplier (Gaussian PLD) and adds the
    sampler's per-coordinate slack."""
    if epsilon is not None:
        if delta is None:
            raise ConfigError(
                "delta", None, "Gaussian noise from a per-release epsilon needs a delta"
            )
        cal = calibrate_gaussian_epsilon_delta(l2, m, epsilon, delta, input_error)
    else:
        assert ratio is not None
        cal = calibrate_gaussian(l2, m, ratio, input_error)
    return NoiseCalibration(
        family="gaussian",
        scale=cal.sigma,
        grid=cal.grid,
        ratio=cal.noise_multiplier,
        slack=m * cal.slack_epsilon_per_coordinate,
        epsilon=np.full_like(cal.sigma, np.inf),
        m=m,
        sampler=DiscreteGaussian(np.repeat(cal.sigma_int[:, None], m, axis=1)),
        delta=0.0 if delta is None or epsilon is None else float(delta),
    )


# ---- the grid per family ------------------------------------------------------------------------


@dataclass(frozen=True)
class GridCalibration:
    """Noise parameters per feature for ``m`` coefficients at privacy ``epsilon``.

    Attributes:
        epsilon: float64 (F,) the ε these parameters guarantee per feature.
        scale: float64 (F,) λ, the Laplace scale of every noised coefficient (coefficient units);
            its standard deviation is ``√2·λ`` up to ``γ²/12``.
        grid: float64 (F,) γ, a power of two; every released coefficient is an integer times γ.
        t: float64 (F,) ``λ/γ``, the discrete Laplace parameter in grid steps.
        m: number of noised coefficients per feature.
        slack: float64 (F,) privacy loss charged per coordinate beside the integers' own: the
            sampler's inexactness and the discrete Laplace's distance from the continuous pair
            (at a ``t`` no larger than the final one, so it covers it).
    """

    epsilon: FloatArray
    scale: FloatArray
    grid: FloatArray
    t: FloatArray
    m: int
    slack: FloatArray


def _refuse_least(field: str, given: FloatArray, least: FloatArray, reason: str) -> NoReturn:
    """Refuse ``field``, naming the ``given`` value (F,) of the feature whose ``least`` (F,) is
    smallest: the one furthest out of range."""
    i = int(np.argmin(least))
    raise ConfigError(field, float(given[i]), reason)


def _check_budget(budget: FloatArray, epsilon: FloatArray, m: int) -> None:
    """Refuse an ε whose ``budget`` (ε less the slack of ``m`` coordinates) is under half of it
    or too small for the sampler's parameter range (``2m/budget ≥ T_MAX/4``)."""
    if np.any(budget < epsilon / 2) or np.any(2.0 * m / budget >= T_MAX / 4):
        _refuse_least(
            "epsilon",
            epsilon,
            budget / epsilon,
            f"too small for {m} noised coefficients per feature; use a smaller k "
            "(fewer coefficients) or a larger epsilon",
        )


def calibrate_laplace(
    l1_sensitivity: FloatArray, m: int, epsilon: FloatArray, input_error: FloatArray
) -> GridCalibration:
    """Grid and scale per feature so that the released integers are ε-DP (derivation above).

    Args:
        l1_sensitivity: float64 (F,) ``Δ1``, L1 sensitivity of the exact coefficients.
        m: coefficients noised per feature.
        epsilon: float64 (F,) privacy parameter per feature, finite and > 0.
        input_error: float64 (F,) public bound on the absolute floating-point error of each
            computed coefficient (``δ``); the grid is never finer than ``2δ``.

    Raises:
        ConfigError: if ε is too small to pay for the sampler's inexactness over ``m``
            coefficients, or so large that the grid would be coarser than ``λ·2^-10``.
    """
    budget = epsilon - m * SAMPLER_LOSS_PER_COORDINATE
    _check_budget(budget, epsilon, m)
    lam0 = l1_sensitivity / budget
    grid = np.exp2(np.floor(np.log2(lam0)) - GRID_LOG2_BELOW_SCALE)
    grid = np.maximum(grid, np.exp2(np.ceil(np.log2(2.0 * input_error))))
    # The discrete Laplace is within a factor of the continuous pair the accountant composes
    # (gazeguard.privacy.accounting.discrete_laplace_slack): pay that slack too, for the parameter t
    # the grid gives at this budget (paying it only makes t, and so the slack, larger).
    t0 = (l1_sensitivity + 2.0 * m * grid) / budget / grid
    slack = SAMPLER_LOSS_PER_COORDINATE + laplace_slack(np.maximum(t0, 1.0))
    budget = epsilon - m * slack
    _check_budget(budget, epsilon, m)
    scale = (l1_sensitivity + 2.0 * m * grid) / budget
    while np.any(scale / grid >= T_MAX):  # only when 2m/budget is large: coarsen the grid
        grid = np.where(scale / grid >= T_MAX, 2.0 * grid, grid)
        scale = (l1_sensitivity + 2.0 * m * grid) / budget
    t = scale / grid
    if np.any(t < T_MIN):
        _refuse_least(
            "epsilon",
            epsilon,
            t,
            "too large: the noise would be smaller than the transform's rounding error allows; "
            "use a smaller epsilon",
        )
    return GridCalibration(epsilon=epsilon, scale=scale, grid=grid, t=t, m=m, slack=slack)


@dataclass(frozen=True)
class GaussianCalibration:
    """Discrete Gaussian noise parameters per feature for ``m`` coefficients.

    The released coefficients are ``γ·(u + Z)`` with ``u = rint(c/γ)`` and ``Z`` i.i.d. discrete
    Gaussian of parameter ``σ_int`` (:class:`DiscreteGaussian`).

    Attributes:
        noise_multiplier: float64 (F,) ``r = σ_int / Δ_int``: the ratio the accountant composes
            (ideal mechanism: ``ρ = 1/(2r²)``-zCDP per release, or the Gaussian PLD at ``r``).
        sigma: float64 (F,) ``σ = γ·σ_int`` in coefficient units (≥ ``r·Δ2``; the inflation pays
            for the grid). Each noised coefficient has standard deviation ``< σ``.
        grid: float64 (F,) γ, a power of two; every released coefficient is an integer times γ.
        sigma_int: float64 (F,) ``σ/γ``, the discrete Gaussian parameter in grid steps.
        sensitivity_l2: float64 (F,) ``Δ2`` of the exact coefficients (as given).
        integer_sensitivity: float64 (F,) ``Δ_int = Δ2/γ + 2√m``, the L2 sensitivity of the
            integers ``u`` (grid steps).
        rho: float64 (F,) ``1/(2r²)``, zCDP of the ideal discrete Gaussian per release.
        m: noised coefficients per feature.
        slack_epsilon_per_coordinate: float64 (F,) additive ε per noised coordinate for using the
            *continuous* Gaussian's PLD / (ε, δ) / RDP at ``r`` for the real sampler:
            ``ln((1+η)/(1−η)) + 2κ(σ_int)`` (see
            :func:`~gazeguard.privacy.mechanisms.discrete_gaussian.gaussian_slack`).
        epsilon: float64 (F,) the per-release ε this calibration guarantees with :attr:`delta`
            when built by :func:`calibrate_gaussian_epsilon_delta` (slack included), else None.
        delta: the per-release δ that goes with :attr:`epsilon`, else None.
    """

    noise_multiplier: FloatArray
    sigma: FloatArray
    grid: FloatArray
    sigma_int: FloatArray
    sensitivity_l2: FloatArray
    integer_sensitivity: FloatArray
    rho: FloatArray
    m: int
    slack_epsilon_per_coordinate: FloatArray
    epsilon: FloatArray | None = None
    delta: float | None = None


def calibrate_gaussian(
    l2_sensitivity: npt.ArrayLike,
    m: int,
    noise_multiplier: npt.ArrayLike,
    input_error: npt.ArrayLike,
) -> GaussianCalibration:
    """Grid and discrete Gaussian parameter per feature for a requested noise multiplier.

    The accountant asked for ``σ = r·Δ2`` (``r`` = ``noise_multiplier``). What the integers see
    (the derivation of :func:`calibrate_laplace`, in L2): rounding moves each coordinate by at most
    ``γ/2`` and the floating-point transform by at most ``δ ≤ γ/2`` (``input_error``), so
    ``|u_i − u'_i| ≤ |c_i − c'_i|/γ + 2`` and, by the triangle inequality in ℝ^m,
    ``‖u − u'‖₂ ≤ Δ2/γ + 2√m =: Δ_int``. We set ``σ_int = r·Δ_int`` — the integer mechanism
    then has noise multiplier exactly ``r`` — and report ``σ = γ·σ_int = r·(Δ2 + 2√m·γ)``,
    slightly above ``r·Δ2``: the grid's cost is charged by inflating σ, never by hiding it.
    ``γ`` is the largest power of two ``≤ r·Δ2·2^-20`` (so ``σ_int ∈ [2^20, 2^21)`` up to the
    inflation ``2√m·r``, relative ``2√m·r/σ_int``, e.g. 4e-4 at m = 15, r = 56), never finer
    than ``2δ``, doubled while ``σ_int ≥ 2^21`` (the sampler's range).

    Args:
        l2_sensitivity: float64 (F,) ``Δ2``, L2 sensitivity of the exact coefficients
            (coefficient units), finite and > 0.
        m: coefficients noised per feature.
        noise_multiplier: float64 (F,) or scalar ``r`` > 0.
        input_error: float64 (F,) or scalar, public bound on the absolute floating-point error
            of each computed coefficient (``transforms.fft_error_bound``).

    Raises:
        ConfigError: if ``r`` is so large that ``2√m·r`` alone would push ``σ_int`` past the
            sampler's range, or so small that ``σ_int < 2^19`` (the grid would have to be finer
            than the transform's rounding error).
    """
    delta2 = np.atleast_1d(np.asarray(l2_sensitivity, dtype=np.float64))
    r = np.broadcast_to(np.asarray(noise_multiplier, dtype=np.float64), delta2.shape).copy()
    err = np.broadcast_to(np.asarray(input_error, dtype=np.float64), delta2.shape)
    if isinstance(m, bool) or not isinstance(m, int | np.integer) or m < 1:
        raise ConfigError("m", m, "the number of noised coefficients must be an integer >= 1")
    for name, arr in (("sensitivity_l2", delta2), ("noise_multiplier", r)):
        if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            i = int(np.flatnonzero(~(np.isfinite(arr) & (arr > 0)))[0])
            raise ConfigError(name, float(arr[i]), f"must be finite and > 0 (feature index {i})")
    root_m = math.sqrt(m)
    if np.any(2.0 * root_m * r >= GAUSS_SIGMA_MAX / 4):
        i = int(np.argmax(r))
        raise ConfigError(
            "noise_multiplier",
            float(r[i]),
            f"too large for {m} coefficients: the discrete Gaussian parameter would leave the "
            "sampler's range; use a larger epsilon (budget) or fewer coefficients",
        )
    sigma0 = r * delta2
    grid = np.exp2(np.floor(np.log2(sigma0)) - GAUSS_GRID_LOG2_BELOW_SCALE)
    grid = np.maximum(grid, np.exp2(np.ceil(np.log2(2.0 * np.maximum(err, 2.0**-1074)))))
    integer_sensitivity = delta2 / grid + 2.0 * root_m
    sigma_int = r * integer_sensitivity
    while np.any(sigma_int >= GAUSS_SIGMA_MAX):
        grid = np.where(sigma_int >= GAUSS_SIGMA_MAX, 2.0 * grid, grid)
        integer_sensitivity = delta2 / grid + 2.0 * root_m
        sigma_int = r * integer_sensitivity
    if np.any(sigma_int < GAUSS_SIGMA_INT_MIN):
        i = int(np.argmin(sigma_int))
        raise ConfigError(
            "noise_multiplier",
            float(r[i]),
            "too small: the noise would be finer than the transform's rounding error allows "
            f"(feature index {i}); use a larger noise multiplier (smaller epsilon)",
        )
    return GaussianCalibration(
        noise_multiplier=r,
        sigma=grid * sigma_int,
        grid=grid,
        sigma_int=sigma_int,
        sensitivity_l2=delta2,
        integer_sensitivity=integer_sensitivity,
        rho=1.0 / (2.0 * r**2),
        m=int(m),
        slack_epsilon_per_coordinate=GAUSS_SAMPLER_LOSS_PER_COORDINATE
        + 2.0 * gaussian_kappa(sigma_int),
    )


def calibrate_gaussian_epsilon_delta(
    l2_sensitivity: npt.ArrayLike,
    m: int,
    epsilon: npt.ArrayLike,
    delta: float,
    input_error: npt.ArrayLike,
) -> GaussianCalibration:
    """Discrete Gaussian parameters per feature so that one release of ``m`` coefficients is
    (ε, δ)-DP per feature, sampler and grid included.

    The analytic Gaussian (:func:`analytic_gaussian_sigma`) is applied to the *integers* ``u``
    (L2 sensitivity ``Δ_int``, see :func:`calibrate_gaussian`) at a reduced target
    ``ε' = ε − m·(ln((1+η)/(1−η)) + 2κ_max)`` and ``δ' = (δ/((1+η)e^{κ_max})^m)·(1 − 2^-40)``
    (the last factor swallows the ``m·e^{ε−2000}`` tail terms, as ε ≤ 1000);
    :func:`~gazeguard.privacy.mechanisms.discrete_gaussian.gaussian_slack` with ``N = m`` then
    gives back at most (ε, δ). ``κ_max`` =
    :data:`GAUSS_KAPPA_MAX` holds because :func:`calibrate_gaussian` never returns
    ``σ_int < 2^19``.

    Args:
        l2_sensitivity: float64 (F,) ``Δ2`` of the exact coefficients.
        m: coefficients noised per feature.
        epsilon: float64 (F,) or scalar per-release ε > 0.
        delta: per-release δ in (0, 1).
        input_error: float64 (F,) or scalar FFT error bound.

    Raises:
        ConfigError: if ε cannot pay for the sampler's slack over ``m`` coordinates, or as
            :func:`calibrate_gaussian`.
    """
    delta2 = np.atleast_1d(np.asarray(l2_sensitivity, dtype=np.float64))
    eps = np.broadcast_to(np.asarray(epsilon, dtype=np.float64), delta2.shape).copy()
    if not 0.0 < delta < 1.0:
        raise ConfigError("delta", delta, "must lie strictly between 0 and 1")
    slack = m * (GAUSS_SAMPLER_LOSS_PER_COORDINATE + 2.0 * GAUSS_KAPPA_MAX)
    budget = eps - slack
    if not np.all(np.isfinite(eps)) or np.any(budget < eps / 2):
        _refuse_least(
            "epsilon",
            eps,
            np.where(np.isfinite(eps), budget / eps, -np.inf),
            f"too small for {m} noised coefficients per feature (the sampler alone costs "
            f"{slack:.3g}); use a smaller k or a larger epsilon",
        )
    if np.any(eps > 1000.0):  # beyond, the e^ε·e^{−2000} tail terms would no longer vanish
        raise ConfigError(
            "epsilon", float(np.max(eps)), "per-release epsilon above 1000 is not supported"
        )
    reduced_delta = delta * math.exp(-m * (math.log1p(GAUSS_ETA) + GAUSS_KAPPA_MAX)) * (1 - 2**-40)
    r = np.array([analytic_gaussian_sigma(float(b), reduced_delta, 1.0) for b in budget])
    cal = calibrate_gaussian(delta2, m, r, input_error)
    return replace(cal, epsilon=eps, delta=float(delta))
