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
  (:func:`gazeguard.privacy.mechanisms.noise.calibrate`), so the stated ε holds exactly.
* ``ratio``: a noise multiplier chosen by the accountant for a budget per hour
  (:mod:`gazeguard.privacy.accounting`): ``scale = ratio·(Δ + 2mγ)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.mechanisms.noise import (
    GRID_LOG2_BELOW_SCALE,
    SAMPLER_LOSS_PER_COORDINATE,
    T_MAX,
    T_MIN,
    DiscreteGaussian,
    DiscreteLaplace,
    RandomSource,
    calibrate,
    calibrate_gaussian,
    calibrate_gaussian_epsilon_delta,
    laplace_slack,
)

FloatArray = npt.NDArray[np.float64]


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
        cal = calibrate(sensitivity_l1, m, epsilon, input_error)
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
    """Discrete Gaussian noise (:func:`gazeguard.privacy.mechanisms.noise.calibrate_gaussian`): its
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
