"""``k="auto"``: the number of kept frequencies that minimises the expected error under a public
prior — never chosen from the data being released.

For each candidate ``k`` (``m`` kept coefficients) and feature ``f`` the expected mean squared
error per value is

``MSE_f(k) = (R_f²·recon(k) + v_f(k)·gain(k)) / n``

* ``recon(k)``: expected energy the reconstruction misses, from the prior
  (:mod:`gazeguard.privacy.mechanisms.prior`, units of ``R²``). Raw chunks (FPA, CFPA): the summed
  prior energy of the dropped coefficients. Difference chunks (DCFPA): the dropped part of the
  difference signal is pushed through the cumulative sum, ``trace(H_dd·G_dd)`` over the dropped
  index set ``d``, with ``G = B A S Aᵀ Bᵀ`` (prior covariance of the difference coefficients) and
  ``H = B Lᵀ L Bᵀ`` (``L`` the cumulative sum).
* ``v(k)·gain(k)``: the perturbation error, noise of variance ``v(k)`` on each of the ``m`` kept
  coefficients, exactly as the mechanism will calibrate it (Laplace: ``v = 2λ²``; Gaussian:
  ``v = σ²``). For FPA/CFPA the
  basis is orthonormal, so ``gain = m`` — docs/design.md's ``2·m·λ²/n``. **DCFPA departs from that
  formula on purpose:** its noise is integrated by the cumulative sum, so
  ``gain = Σ_{i<m} H_ii``, which for the lowest frequencies is of order ``n²/π²`` per
  coefficient rather than 1 (the noise becomes a random walk inside the chunk). Using ``m`` there
  would underestimate DCFPA's error by one to two orders of magnitude and pick a far too large k.

The objective is the average over features of ``MSE_f(k)/R_f²`` (each feature in units of its own
range, so no unit dominates); the output clipping to ``[lo, hi]``, which can only lower the error,
is ignored. Ties go to the smaller k.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.mechanisms.bounds import Bounds
from gazeguard.privacy.mechanisms.calibration import calibrate_laplace
from gazeguard.privacy.mechanisms.prior import PriorSpectrum, cumsum_gain, default_prior
from gazeguard.privacy.mechanisms.registry import MechanismKind, TransformName, mechanism_kind
from gazeguard.privacy.mechanisms.sensitivity import sensitivity_of
from gazeguard.privacy.mechanisms.transforms import fft_error_bound

FloatArray = npt.NDArray[np.float64]


#: ``variance(k, m) -> (F,)``: noise variance of each noised coefficient when ``k`` frequencies
#: (``m`` coefficients) are kept, or ``None`` when that ``k`` is infeasible.
NoiseVariance = Callable[[int, int], "FloatArray | None"]


def expected_mse_for(
    kind: MechanismKind,
    n: int,
    transform: TransformName,
    bounds: Bounds,
    noise_variance: NoiseVariance,
    *,
    prior: PriorSpectrum | None = None,
) -> tuple[npt.NDArray[np.int64], FloatArray]:
    """Expected MSE per value for every admissible k, for any noise family.

    Args:
        kind: the mechanism (FPA, CFPA or DCFPA: a transformed kind).
        n: chunk (or recording) length.
        transform: ``"dft"`` or ``"dct"``.
        bounds: bounds broadcast to (F,).
        noise_variance: the per-coefficient noise variance for each candidate k (see
            :data:`NoiseVariance`), exactly as the mechanism will calibrate it.
        prior: defaults to the shipped prior.

    Returns:
        ``(ks, mse)``: int64 (K,) candidate k and float64 (K, F) expected MSE per value in each
        feature's squared unit; ``inf`` where the noise cannot be calibrated for that k.
    """
    prior = default_prior() if prior is None else prior
    r2 = bounds.range**2
    ks = np.arange(1, kind.max_k(transform, n) + 1, dtype=np.int64)
    ms = np.array([kind.kept(transform, int(k), n) for k in ks])
    if kind.difference:
        g = prior.difference_covariance(n, transform)
        h = cumsum_gain(n, transform)
        # tail[m] = Σ_{i,j ≥ m} H_ij·G_ij: reversed 2-D cumulative sums of the elementwise product
        tail = np.cumsum(np.cumsum((h * g)[::-1, ::-1], axis=0), axis=1)[::-1, ::-1]
        recon = np.append(np.diag(tail), 0.0)[ms]
        gain = np.cumsum(np.diag(h))[ms - 1]
    else:
        energy = prior.raw_energy(n, transform)
        recon = np.append(np.cumsum(energy[::-1])[::-1], 0.0)[ms]
        gain = ms.astype(np.float64)
    mse = np.full((ks.size, r2.size), np.inf)
    for i, (k, m) in enumerate(zip(ks, ms, strict=True)):
        var = noise_variance(int(k), int(m))
        if var is None:
            continue  # the noise cannot be calibrated for m coefficients: infeasible candidate
        mse[i] = (r2 * max(recon[i], 0.0) + var * gain[i]) / n
    return ks, mse


def noise_gain(kind: MechanismKind, n: int, transform: TransformName, m: int) -> float:
    """Total noise energy in the ``n`` released values per unit of per-coefficient noise
    variance, for ``m`` kept coefficients: ``m`` (orthonormal inverse transform) or, for
    DCFPA, the cumulative sum's gain on those coefficients. Per-value noise variance is
    ``variance · gain / n``."""
    if kind.difference:
        return float(np.cumsum(np.diag(cumsum_gain(n, transform)))[m - 1])
    return float(m)


def choose_k_for(
    kind: MechanismKind,
    n: int,
    transform: TransformName,
    bounds: Bounds,
    noise_variance: NoiseVariance,
    *,
    prior: PriorSpectrum | None = None,
) -> int:
    """The k minimising the range-normalised expected MSE averaged over features (see module).

    Raises:
        ConfigError: if no k is feasible for this noise.
    """
    ks, mse = expected_mse_for(kind, n, transform, bounds, noise_variance, prior=prior)
    objective = np.mean(mse / (bounds.range**2), axis=1)
    if not np.any(np.isfinite(objective)):
        raise ConfigError("epsilon", None, "too small for any k; raise epsilon")
    return int(ks[int(np.argmin(objective))])


def _laplace_variance(
    kind: MechanismKind, n: int, transform: TransformName, bounds: Bounds, epsilon: FloatArray
) -> NoiseVariance:
    def variance(k: int, m: int) -> FloatArray | None:
        sens = sensitivity_of(kind, bounds, n, k, transform)
        try:
            cal = calibrate_laplace(sens.l1, m, epsilon, fft_error_bound(n, sens.signal_norm))
        except ConfigError:
            return None
        return np.asarray(2.0 * cal.scale**2, dtype=np.float64)

    return variance


def expected_mse(
    name: str,
    n: int,
    transform: TransformName,
    bounds: Bounds,
    epsilon: FloatArray,
    *,
    prior: PriorSpectrum | None = None,
) -> tuple[npt.NDArray[np.int64], FloatArray]:
    """:func:`expected_mse_for` with Laplace noise at ε per feature (float64 (F,))."""
    kind = mechanism_kind(name)
    variance = _laplace_variance(kind, n, transform, bounds, epsilon)
    return expected_mse_for(kind, n, transform, bounds, variance, prior=prior)


def choose_k(
    name: str,
    n: int,
    transform: TransformName,
    bounds: Bounds,
    epsilon: FloatArray,
    *,
    prior: PriorSpectrum | None = None,
) -> int:
    """The k Laplace noise at ε per feature (float64 (F,)) calls for (see module).

    Raises:
        ConfigError: if no k is feasible for this ε.
    """
    f = bounds.n_features or int(np.size(epsilon))
    b = bounds.broadcast(f)
    eps = np.broadcast_to(np.asarray(epsilon, dtype=np.float64), (f,))
    kind = mechanism_kind(name)
    try:
        return choose_k_for(
            kind, n, transform, b, _laplace_variance(kind, n, transform, b, eps), prior=prior
        )
    except ConfigError as exc:
        raise ConfigError(
            "epsilon", float(np.min(eps)), "too small for any k; raise epsilon"
        ) from exc
