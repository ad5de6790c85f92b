"""The public prior over feature signals that ``k="auto"`` optimises against.

``k`` must never be chosen from the data being released (that would leak), so it is chosen from a
*prior*: a stationary model of feature signals normalised by their declared bounds,
``z_t = (x_t − lo)/R ∈ [0, 1]``, with

* ``mean``: ``E[z_t]``,
* ``variance``: ``Var[z_t]``,
* ``autocorrelation``: ``r(h) = Corr(z_t, z_{t+h})`` for lags ``h = 0..H−1`` (zero beyond),

so the second-moment matrix of a chunk is ``S = mean² + variance·Toeplitz(r)``, in units of ``R²``.
From ``S`` follow the expected energy of every orthonormal coefficient of a raw chunk,
``diag(B S Bᵀ)``, and the full covariance ``B A S Aᵀ Bᵀ`` of a difference chunk (``A`` the first
difference with ``D_1 = z_1``) — everything ``auto_k`` needs, for any n and transform.

The shipped prior (``gazeguard/data/prior_spectrum.json``) is :func:`model_prior`: a feature is a
30 s sliding-window statistic stepped every 0.5 s, so half of its variance is modelled as a moving
average over the 60 steps of the window (triangular autocorrelation ``1 − h/60``) and half as a
slow drift of state (AR(1) with a 2-minute time constant, correlation ``e^{−h/240}``). Values sit
around 0.35 of the declared range with a standard deviation of 0.17 of it (bounds are declared
generously, as physiological extremes, so typical values use only part of them).
These are public modelling assumptions, not anybody's data. When the simulator and the feature
extractor are in place, regenerate it from simulated (or public) features::

    gazeguard mechanisms estimate features.npz --bounds bounds.json
    gazeguard mechanisms show        # the k that auto picks, per n and ε
    gazeguard mechanisms model       # rewrite the shipped model prior

(:mod:`gazeguard.cli.mechanisms` is that command line; :func:`estimate_prior` does the same from
arrays.) The file also lists, for n = 32, 64, 128, the
resulting expected energy per coefficient (raw and difference) for people to read; they are derived
from the model and checked by the tests.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError, DatasetError
from gazeguard.privacy.mechanisms.registry import TRANSFORMS, TransformName
from gazeguard.privacy.mechanisms.transforms import forward

FloatArray = npt.NDArray[np.float64]
DEFAULT_PATH = Path(str(resources.files("gazeguard"))) / "data" / "prior_spectrum.json"
TABLE_SIZES = (32, 64, 128)
#: Largest n for which the O(n²)-memory difference-chunk covariance is computed.
MAX_N_DIFFERENCE = 2048
#: Largest n for raw-chunk coefficient energies (O(n² log n) time).
MAX_N_RAW = 16384


@dataclass(frozen=True, eq=False)
class PriorSpectrum:
    """A stationary model of normalised feature signals (see the module docstring).

    Attributes:
        mean: ``E[(x − lo)/R]``.
        variance: ``Var[(x − lo)/R]``.
        autocorrelation: float64 (H,) ``r(0..H−1)``, ``r(0) = 1``, a positive semi-definite
            sequence; ``r(h) = 0`` for ``h ≥ H``.
        source: where the numbers come from (model parameters or data files).
    """

    mean: float
    variance: float
    autocorrelation: FloatArray
    source: str = ""

    def __post_init__(self) -> None:
        r = np.asarray(self.autocorrelation, dtype=np.float64)
        if r.ndim != 1 or r.size < 1 or not np.all(np.isfinite(r)) or abs(r[0] - 1.0) > 1e-9:
            raise ConfigError("prior.autocorrelation", r[:4], "must be finite with r(0) = 1")
        if not (math.isfinite(self.variance) and self.variance >= 0):
            raise ConfigError("prior.variance", self.variance, "must be finite and >= 0")
        if not math.isfinite(self.mean):
            raise ConfigError("prior.mean", self.mean, "must be finite")
        object.__setattr__(self, "autocorrelation", r)

    def covariance_rows(self, n: int, rows: slice) -> FloatArray:
        """Rows ``rows`` of ``variance·Toeplitz(r)`` for chunk length ``n`` (no mean term)."""
        r = np.zeros(n)
        h = min(n, self.autocorrelation.size)
        r[:h] = self.autocorrelation[:h]
        i = np.arange(rows.start, rows.stop)[:, None]
        return self.variance * r[np.abs(i - np.arange(n)[None, :])]

    def second_moment(self, n: int) -> FloatArray:
        """``S = mean² + variance·Toeplitz(r)``, (n, n), in units of ``R²``."""
        return self.mean**2 + self.covariance_rows(n, slice(0, n))

    def raw_energy(self, n: int, transform: TransformName) -> FloatArray:
        """Expected squared orthonormal coefficient of a raw chunk, ``diag(B S Bᵀ)``, (n,), R²."""
        return _raw_energy(self, n, transform).copy()

    def difference_covariance(self, n: int, transform: TransformName) -> FloatArray:
        """``B A S Aᵀ Bᵀ`` (n, n) for the difference chunk ``D_1 = z_1, D_t = z_t − z_{t−1}``."""
        return _difference_covariance(self, n, transform).copy()

    def to_json(self) -> dict[str, object]:
        """The JSON document (with the readable per-coefficient tables)."""
        spectra: dict[str, dict[str, dict[str, list[float]]]] = {}
        for tr in TRANSFORMS:
            spectra[tr] = {}
            for n in TABLE_SIZES:
                spectra[tr][str(n)] = {
                    "raw": _rounded(self.raw_energy(n, tr)),
                    "difference": _rounded(np.diag(self.difference_covariance(n, tr))),
                }
        return {
            "format": "gazeguard prior spectrum v1",
            "units": "normalised signal z = (x - lo) / (hi - lo); energies in units of R^2",
            "source": self.source,
            "mean": self.mean,
            "variance": self.variance,
            "autocorrelation": [float(v) for v in self.autocorrelation],
            "spectra_note": "expected squared orthonormal coefficient per index (coefficient "
            "order as in gazeguard.privacy.mechanisms.transforms), derived from the model above; "
            "for reading only",
            "spectra": spectra,
        }

    def save(self, path: str | Path) -> Path:
        """Write :meth:`to_json` to ``path``."""
        path = Path(path)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path = DEFAULT_PATH) -> PriorSpectrum:
        """Read a prior written by :meth:`save`.

        Raises:
            DatasetError: if the file is missing or malformed.
        """
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
            return cls(
                mean=float(doc["mean"]),
                variance=float(doc["variance"]),
                autocorrelation=np.asarray(doc["autocorrelation"], dtype=np.float64),
                source=str(doc.get("source", "")),
            )
        except FileNotFoundError as exc:
            raise DatasetError(path, "prior spectrum file not found") from exc
        except (ValueError, KeyError, TypeError, ConfigError) as exc:
            raise DatasetError(path, f"not a gazeguard prior spectrum: {exc}") from exc


def _rounded(a: FloatArray) -> list[float]:
    return [float(f"{v:.6g}") for v in a]


@functools.lru_cache(maxsize=64)
def _raw_energy(prior: PriorSpectrum, n: int, transform: TransformName) -> FloatArray:
    if n > MAX_N_RAW:
        raise ConfigError("n", n, f"k='auto' supports n <= {MAX_N_RAW}; pass an integer k")
    # diag(B S Bᵀ)_j = Σ_l Bᵀ[l, j]·(S Bᵀ)[l, j], accumulated over blocks of rows l: row l of Bᵀ
    # is the transform of e_l and row l of S Bᵀ is the transform of row l of S (S symmetric).
    energy = np.zeros(n)
    block = max(1, min(n, 2**20 // n))
    for start in range(0, n, block):
        rows = slice(start, min(n, start + block))
        eye = np.zeros((rows.stop - rows.start, n))
        eye[np.arange(eye.shape[0]), np.arange(rows.start, rows.stop)] = 1.0
        energy += np.sum(
            forward(eye, transform) * forward(prior.covariance_rows(n, rows), transform), axis=0
        )
    energy[0] += prior.mean**2 * n  # the constant vector is √n times the first basis vector
    return energy


def _basis(n: int, transform: TransformName) -> FloatArray:
    """``B`` (n, n): row j is the j-th orthonormal basis vector."""
    return forward(np.eye(n), transform).T.copy()


@functools.lru_cache(maxsize=32)
def _difference_covariance(prior: PriorSpectrum, n: int, transform: TransformName) -> FloatArray:
    if n > MAX_N_DIFFERENCE:
        raise ConfigError(
            "n", n, f"k='auto' for dcfpa supports n <= {MAX_N_DIFFERENCE}; pass an integer k"
        )
    s = prior.second_moment(n)
    a = np.eye(n) - np.eye(n, k=-1)  # D = A z
    b = _basis(n, transform)
    g = b @ a @ s @ a.T @ b.T
    return np.asarray((g + g.T) / 2)


@functools.lru_cache(maxsize=32)
def cumsum_gain(n: int, transform: TransformName) -> FloatArray:
    """``B Lᵀ L Bᵀ`` (n, n), ``L`` the cumulative sum: how coefficient-domain errors of a
    difference chunk grow through DCFPA's reconstruction (``(Lᵀ L)_{ij} = n − max(i, j)``)."""
    i = np.arange(n)
    ltl = (n - np.maximum(i[:, None], i[None, :])).astype(np.float64)
    b = _basis(n, transform)
    h = b @ ltl @ b.T
    return np.asarray((h + h.T) / 2)


def model_prior(
    *,
    window_steps: float = 60.0,
    drift_steps: float = 240.0,
    drift_share: float = 0.5,
    mean: float = 0.35,
    std: float = 0.17,
    max_lag: int = 2048,
) -> PriorSpectrum:
    """The documented public model (module docstring): triangular + exponential correlation.

    Args:
        window_steps: window length in steps (W/s = 30 s / 0.5 s).
        drift_steps: time constant of the slow drift, steps (240 = 2 minutes).
        drift_share: fraction of the variance in the slow drift.
        mean: mean of ``(x − lo)/R``.
        std: standard deviation of ``(x − lo)/R``.
        max_lag: H, lags tabulated.
    """
    h = np.arange(max_lag, dtype=np.float64)
    r = (1 - drift_share) * np.maximum(0.0, 1.0 - h / window_steps) + drift_share * np.exp(
        -h / drift_steps
    )
    return PriorSpectrum(
        mean=mean,
        variance=std**2,
        autocorrelation=r,
        source=(
            f"model: mean {mean}, std {std}; correlation {1 - drift_share:g}*max(0, 1 - h/"
            f"{window_steps:g}) + {drift_share:g}*exp(-h/{drift_steps:g}) (sliding-window "
            "statistic plus slow drift; public assumptions, no user data)"
        ),
    )


def estimate_prior(
    recordings: Iterable[npt.ArrayLike],
    lo: npt.ArrayLike,
    hi: npt.ArrayLike,
    max_lag: int = 2048,
    source: str = "estimated from feature arrays",
) -> PriorSpectrum:
    """Pool a prior from public or simulated feature recordings.

    Args:
        recordings: arrays (F, T) of consecutive feature vectors (one per recording), in the
            features' units; any (feature, recording) series containing NaN is skipped.
        lo, hi: float64 (F,) or scalars, the declared bounds used for normalisation.
        max_lag: H; autocovariances beyond it are dropped after a Parzen taper (which keeps the
            sequence positive semi-definite and barely touches short lags).
        source: provenance text stored in the file.

    Raises:
        ConfigError: if no usable series remains.
    """
    lo_a = np.asarray(lo, dtype=np.float64)
    hi_a = np.asarray(hi, dtype=np.float64)
    series: list[FloatArray] = []
    skipped = 0
    for rec in recordings:
        x = np.asarray(rec, dtype=np.float64)
        if x.ndim != 2:
            raise ConfigError("recordings", f"array of shape {x.shape}", "must be (F, T) each")
        z = np.clip((x - lo_a.reshape(-1, 1)) / (hi_a - lo_a).reshape(-1, 1), 0.0, 1.0)
        ok = ~np.any(np.isnan(x), axis=1) & (x.shape[1] >= 2)
        skipped += int(np.count_nonzero(~ok))
        series.extend(z[ok])
    if not series:
        raise ConfigError("recordings", "no usable series", "need NaN-free series of >= 2 steps")
    total = sum(s.size for s in series)
    mean = float(sum(float(s.sum()) for s in series) / total)
    longest = max(s.size for s in series)
    lags = min(max_lag, longest)
    acov = np.zeros(lags)
    for s in series:
        y = s - mean
        spec = np.fft.rfft(y, 2 * y.size)
        ac = np.fft.irfft(np.abs(spec) ** 2, 2 * y.size)[: min(lags, y.size)]
        acov[: ac.size] += ac
    acov /= total  # biased estimator: a positive semi-definite sequence
    if longest > lags:  # Parzen taper: flat near lag 0 and keeps the sequence PSD
        u = np.arange(lags) / lags
        acov *= np.where(u <= 0.5, 1 - 6 * u**2 + 6 * u**3, 2 * (1 - u) ** 3)
    variance = float(acov[0])
    r = acov / variance if variance > 0 else np.eye(1, lags)[0]
    note = f"{source}: {len(series)} series, {total} steps"
    if skipped:
        note += f", {skipped} series with NaN skipped"
    return PriorSpectrum(mean=mean, variance=variance, autocorrelation=r, source=note)


@functools.lru_cache(maxsize=1)
def default_prior() -> PriorSpectrum:
    """The prior shipped with the package."""
    return PriorSpectrum.load(DEFAULT_PATH)
