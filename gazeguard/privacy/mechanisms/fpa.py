"""The perturbation mechanisms — LPA, FPA, CFPA and DCFPA — over a batch of F features.

Each row of a chunk ``x`` (F, n) is one feature; ε is per feature per chunk, and every row is
privatized independently with its own bounds. Pipeline of one release::

    clip x to [lo, hi] → s = x − lo  (DCFPA: difference chunk D of s, steps clipped to ±d)
    → m orthonormal coefficients c → γ·(rint(c/γ) + Z), Z discrete Laplace   ← the only private step
    → zero the other n − m coefficients, invert → (DCFPA: cumulative sum) → + lo → clip [lo, hi]

Why ``λ = √m·Δ2/ε`` (FPA on a vector of length n)
    1. The kept coefficients are ``c = B_m s`` with ``B_m`` the first m rows of an orthonormal
       basis (``transforms``). For neighbours, ``‖B_m(s − s')‖₂ ≤ ‖s − s'‖₂ ≤ Δ2``: an orthonormal
       basis preserves L2 distances (Parseval) and dropping coefficients can only shrink them
       (Bessel). So the projection's L2 sensitivity is at most the signal's.
    2. For ``v ∈ ℝ^m``, ``‖v‖₁ = Σ|v_i|·1 ≤ ‖v‖₂·‖(1,…,1)‖₂ = √m·‖v‖₂`` (Cauchy–Schwarz), so the
       coefficients' L1 sensitivity is at most ``√m·Δ2``.
    3. i.i.d. Laplace noise of scale ``λ`` on the m coordinates changes the output density by at
       most ``exp(‖c − c'‖₁/λ) ≤ exp(√m·Δ2/λ)`` between neighbours: ``λ = √m·Δ2/ε`` gives ε-DP.
    4. Zero-padding, inversion, cumulative sum and clipping never look at the data again: they
       are post-processing and cost no privacy.
    This is Bozkir et al.'s corrected scaling ``λ = √n·√k·Δ2/ε`` written in orthonormal units
    (their DFT is unnormalised, ``F = √n·c``); noising the real *and* imaginary part of each kept
    frequency is what makes ``m = 2k − 1`` (the DC term is real) rather than k. The discrete
    sampler adds a tiny, honestly charged inflation of λ (see ``calibration.calibrate_laplace``).

Sensitivities (``bounds``)
    Raw chunk (FPA over a whole recording, CFPA per chunk): ``Δ2 = √n·R``. LPA is the same
    mechanism with the identity basis, ``m = n``, so ``λ = √n·√n·R/ε = Δ1/ε`` with ``Δ1 = n·R``.
    DCFPA: the difference chunk ``D_1 = x_1 − lo``, ``D_t = clip(x_t − x_{t−1}, −d, d)`` has
    ``Δ2 = √(R² + (n−1)(2d)²)`` (``|D_1 − D'_1| ≤ R``, ``|D_t − D'_t| ≤ 2d``); FPA on ``D``, then
    the cumulative sum inside the chunk rebuilds the signal (the paper's Algorithm 1, step 3).

Chunked mechanisms (CFPA, DCFPA) need ``n`` a power of two; FPA and LPA take any length.

Testing without noise
    :meth:`Mechanism.nonprivate_projection` returns the noise-free reconstruction for tests and
    evaluation. It is a separate method with a loud name, not a flag: no configuration value or
    argument can turn :meth:`Mechanism.release` into a non-private release.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.accounting.loss import Event
from gazeguard.privacy.mechanisms.auto_k import choose_k_for, expected_mse_for, noise_gain
from gazeguard.privacy.mechanisms.bounds import Bounds, check_finite_positive
from gazeguard.privacy.mechanisms.calibration import NoiseCalibration, calibrate_noise
from gazeguard.privacy.mechanisms.prior import PriorSpectrum
from gazeguard.privacy.mechanisms.randomness import random_source
from gazeguard.privacy.mechanisms.registry import (
    MechanismKind,
    Sensitivity,
    TransformName,
    mechanism_kind,
    noise_kind,
)
from gazeguard.privacy.mechanisms.sensitivity import sensitivity_of
from gazeguard.privacy.mechanisms.transforms import (
    CoefficientTransform,
    IdentityTransform,
    OrthonormalTransform,
    fft_error_bound,
)

FloatArray = npt.NDArray[np.float64]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Prepared:
    """Everything a release for F features needs, computed once.

    Per-feature constants are stored expanded to the full shape they meet in the hot path:
    numpy's binary operations on two (52, 64) arrays are about twice as fast as with a (52, 1)
    column broadcast along rows (1.5 µs vs 3.7 µs, measured).
    """

    bounds: Bounds
    sensitivity: Sensitivity
    noise: NoiseCalibration
    transform: CoefficientTransform
    lo: FloatArray  # (F, n)
    hi: FloatArray  # (F, n)
    step: FloatArray  # (F, n − 1), d per feature
    neg_step: FloatArray  # (F, n − 1), −d
    grid: FloatArray  # (F, m), γ
    inv_grid: FloatArray  # (F, m), 1/γ


class Mechanism:
    """One configured mechanism; build it with :func:`make_mechanism`.

    Attributes:
        kind: what the mechanism is (:data:`gazeguard.privacy.mechanisms.registry.MECHANISMS`).
        name: ``"lpa"``, ``"fpa"``, ``"cfpa"`` or ``"dcfpa"``.
        noise: the noise family, ``"laplace"`` or ``"gaussian"``.
        transform: ``"dft"``, ``"dct"``, or ``"identity"`` for LPA.
        n: values per feature per release.
        k: kept frequencies (resolved when ``k="auto"``; ``n`` for LPA).
        kept_coefficients: m, real coefficients noised per feature.
        secure: False when an insecure seeded generator was selected.
    """

    def __init__(
        self,
        name: str,
        *,
        n: int,
        k: int | str,
        epsilon: float | npt.ArrayLike | None,
        bounds: Bounds,
        transform: str,
        seed: int | None,
        n_features: int | None,
        prior: PriorSpectrum | None,
        noise: str = "laplace",
        noise_multiplier: float | npt.ArrayLike | None = None,
        delta: float | None = None,
    ) -> None:
        kind = mechanism_kind(name)
        self.noise: str = noise_kind(noise).name
        tr = kind.transform_of(transform)
        n = kind.check_n(n)
        if not isinstance(bounds, Bounds):
            raise ConfigError("bounds", bounds, "must be a gazeguard.privacy.mechanisms.Bounds")
        if (epsilon is None) == (noise_multiplier is None):
            raise ConfigError("epsilon", epsilon, "give exactly one of epsilon or noise_multiplier")
        if epsilon is not None:
            level = check_finite_positive("epsilon", epsilon)
        else:
            assert noise_multiplier is not None
            level = check_finite_positive("noise_multiplier", noise_multiplier)
        if kind.difference:
            bounds.effective_step()  # ConfigError if max_step is missing
        sizes = {
            s for s in (bounds.n_features, level.size if level.ndim else None) if s is not None
        }
        if n_features is not None:
            sizes.add(int(n_features))
        if len(sizes) > 1:
            raise ConfigError(
                "n_features", sorted(sizes), "bounds, epsilon and n_features disagree on F"
            )
        self.kind: MechanismKind = kind
        self.name: str = kind.name
        self.n = n
        self.n_features: int | None = sizes.pop() if sizes else None
        self._by_epsilon = epsilon is not None
        self.delta = delta
        self._level = level
        self._bounds = bounds
        self._source = random_source(seed)
        self.secure = self._source.secure
        if not self.secure:
            log.warning(
                "%s: INSECURE reproducible noise (seed=%r): for tests and experiments only",
                name,
                seed,
            )
        self.transform: str = tr
        if kind.transformed:
            assert tr != "identity"
            self.k = self._resolve_k(k, tr, prior)
        else:  # every value is perturbed; k does not apply
            self.k = n
        self.kept_coefficients = kind.kept(tr, self.k, n)
        self._prepared: dict[int, _Prepared] = {}
        self._reference = self._prepare(self.n_features or 1)

    def _calibrate(
        self, b: Bounds, k: int, level: FloatArray
    ) -> tuple[Sensitivity, NoiseCalibration]:
        sens = sensitivity_of(self.kind, b, self.n, k, self.transform)
        cal = calibrate_noise(
            self.noise,
            sensitivity_l1=sens.l1,
            sensitivity_l2=sens.l2,
            m=self.kind.kept(self.transform, k, self.n),
            input_error=fft_error_bound(self.n, sens.signal_norm),
            delta=self.delta,
            **{("epsilon" if self._by_epsilon else "ratio"): level},
        )
        return sens, cal

    def _resolve_k(self, k: int | str, tr: TransformName, prior: PriorSpectrum | None) -> int:
        if k != "auto":
            return self.kind.check_k(k, tr, self.n)
        f = self.n_features or 1
        b = self._bounds.broadcast(f)
        level = np.broadcast_to(self._level, (f,)).copy()

        def variance(kk: int, m: int) -> FloatArray | None:
            try:
                _, cal = self._calibrate(b, kk, level)
            except ConfigError:
                return None
            scale2 = cal.scale**2
            return np.asarray(2.0 * scale2 if cal.family == "laplace" else scale2)

        return choose_k_for(self.kind, self.n, tr, b, variance, prior=prior)

    def _prepare(self, n_features: int) -> _Prepared:
        """Parameters, FFTW plans and sampler for F features (cached; never in the hot path once
        F has been seen)."""
        p = self._prepared.get(n_features)
        if p is not None:
            return p
        b = self._bounds.broadcast(n_features)
        if self._level.ndim and self._level.size != n_features:
            raise ConfigError("x", f"{n_features} rows", f"epsilon has {self._level.size}")
        level = np.broadcast_to(self._level, (n_features,)).copy()
        sens, cal = self._calibrate(b, self.k, level)
        m = self.kept_coefficients
        transform: CoefficientTransform
        if self.transform == "identity":
            transform = IdentityTransform(n_features, self.n)
        else:
            tr: TransformName = "dft" if self.transform == "dft" else "dct"
            transform = OrthonormalTransform(tr, n_features, self.n, m)
        step = b.effective_step() if self.kind.difference else b.range
        p = _Prepared(
            bounds=b,
            sensitivity=sens,
            noise=cal,
            transform=transform,
            lo=_expand(b.lo, self.n),
            hi=_expand(b.hi, self.n),
            step=_expand(step, self.n - 1),
            neg_step=_expand(-step, self.n - 1),
            grid=_expand(cal.grid, m),
            inv_grid=_expand(1.0 / cal.grid, m),
        )
        self._prepared[n_features] = p
        return p

    # ------------------------------------------------------------------ reported parameters
    @property
    def epsilon(self) -> FloatArray:
        """float64 (F,): pure ε per feature per release (shape (1,) while F is not fixed);
        ``inf`` for Gaussian noise, which has no pure guarantee."""
        return self._reference.noise.epsilon.copy()

    @property
    def noise_scale(self) -> FloatArray:
        """float64 (F,): λ (Laplace) or σ (Gaussian) of each noised coefficient, in the
        feature's units."""
        return self._reference.noise.scale.copy()

    @property
    def sensitivity_l2(self) -> FloatArray:
        """float64 (F,): Δ2 of the noised coefficients (raw or difference chunk)."""
        return self._reference.sensitivity.l2.copy()

    @property
    def sensitivity(self) -> FloatArray:
        """float64 (F,): the sensitivity the noise family pays (L1 for Laplace, L2 for
        Gaussian) of the noised coefficients, from the public bounds."""
        sens = self._reference.sensitivity
        return (sens.l1 if noise_kind(self.noise).norm == "l1" else sens.l2).copy()

    @property
    def grid(self) -> FloatArray:
        """float64 (F,): γ, the power-of-two grid of the released coefficients."""
        return self._reference.noise.grid.copy()

    @property
    def noise_multiplier(self) -> FloatArray:
        """float64 (F,): noise scale / effective sensitivity, what an accountant composes."""
        return self._reference.noise.ratio.copy()

    @property
    def sampler_slack(self) -> FloatArray:
        """float64 (F,): additive privacy loss per release for the sampler's inexactness."""
        return self._reference.noise.slack.copy()

    def value_noise_sd(self) -> FloatArray:
        """float64 (F,): ``value_noise_sd``, the standard deviation of the noise on each
        published value, in the feature's units (root mean square over the chunk's n values,
        before clipping to ``[lo, hi]``): what a consumer sees of the noise.

        From public settings only (noise scale, n, k, transform), never from the data. The one
        figure the banner, ``gazeguard watch`` and the chunk message show.
        """
        scale = self._reference.noise.scale
        var = 2.0 * scale**2 if self.noise == "laplace" else scale**2
        if not self.kind.transformed:
            return np.asarray(np.sqrt(var), dtype=np.float64)
        tr = self.kind.transform_of(self.transform)
        assert tr != "identity"
        gain = noise_gain(self.kind, self.n, tr, self.kept_coefficients)
        return np.asarray(np.sqrt(var * gain / self.n), dtype=np.float64)

    def value_noise_range(self) -> FloatArray:
        """float64 (F,): :meth:`value_noise_sd` as a multiple of each feature's public range
        ``hi − lo`` (dimensionless)."""
        b = self._reference.bounds
        return np.asarray(self.value_noise_sd() / b.range, dtype=np.float64)

    @property
    def lower(self) -> FloatArray:
        """float64 (F,): each feature's public lower bound ``lo``, in its units."""
        return np.asarray(self._reference.bounds.lo, dtype=np.float64).copy()

    @property
    def upper(self) -> FloatArray:
        """float64 (F,): each feature's public upper bound ``hi``, in its units."""
        return np.asarray(self._reference.bounds.hi, dtype=np.float64).copy()

    def expected_error(self, prior: PriorSpectrum | None = None) -> FloatArray:
        """float64 (F,): expected root-mean-square error per released value as a fraction of
        each feature's range ``hi − lo``, under the public prior (never the user's data): the
        truncation of the frequencies not kept plus the noise carried into the values."""
        p = self._reference
        b = self._bounds.broadcast(p.noise.scale.size)
        var = 2.0 * p.noise.scale**2 if self.noise == "laplace" else p.noise.scale**2
        if not self.kind.transformed:
            return np.asarray(np.sqrt(var) / b.range, dtype=np.float64)
        tr = self.kind.transform_of(self.transform)
        assert tr != "identity"

        def variance(k: int, m: int) -> FloatArray:
            return np.asarray(var, dtype=np.float64)

        ks, mse = expected_mse_for(self.kind, self.n, tr, b, variance, prior=prior)
        row = mse[int(np.flatnonzero(ks == self.k)[0])]
        return np.asarray(np.sqrt(row) / b.range, dtype=np.float64)

    def feature_events(self) -> list[Event]:
        """The accounting event of each released feature of one release (one chunk), in feature
        order: ``LaplaceEvent(λ/Δ1, slack)`` or ``GaussianEvent(σ/Δ2, slack)`` with Δ the
        effective sensitivity of that feature's whole chunk (all kept coefficients together)."""
        event = noise_kind(self.noise).event
        return [
            event(float(ratio), float(slack))
            for ratio, slack in zip(self.noise_multiplier, self.sampler_slack, strict=True)
        ]

    def events(self) -> dict[Event, int]:
        """The accounting events of one release (one chunk), counted: :meth:`feature_events`
        (features with equal noise multipliers share one event, counted once per feature)."""
        out: dict[Event, int] = {}
        for e in self.feature_events():
            out[e] = out.get(e, 0) + 1
        return out

    def carries(self) -> str:
        """What a consumer receives per feature per release, in words."""
        return self.kind.carries(self.transform, self.k, self.n)

    def parameters(self) -> dict[str, object]:
        """The mechanism's public parameters as JSON-ready values (for payloads and logs)."""
        return {
            "name": self.name,
            "noise": self.noise,
            "transform": self.transform,
            "n": self.n,
            "k": self.k,
            "kept_coefficients": self.kept_coefficients,
            "epsilon": self.epsilon.tolist(),
            "noise_scale": self.noise_scale.tolist(),
            "sensitivity_l2": self.sensitivity_l2.tolist(),
            "sensitivity": self.sensitivity.tolist(),
            "noise_multiplier": self.noise_multiplier.tolist(),
            "grid": self.grid.tolist(),
            "value_noise_sd": self.value_noise_sd().tolist(),
            "value_noise_range": self.value_noise_range().tolist(),
            "lower": self.lower.tolist(),
            "upper": self.upper.tolist(),
            "secure": self.secure,
        }

    def __repr__(self) -> str:
        f = self.n_features if self.n_features is not None else "any"
        return (
            f"Mechanism({self.name!r}, transform={self.transform!r}, n={self.n}, k={self.k}, "
            f"m={self.kept_coefficients}, F={f}, secure={self.secure})"
        )

    # --------------------------------------------------------------------------- releases
    def release(self, x: npt.ArrayLike) -> FloatArray:
        """The ε-DP release of ``x``: float64 (F, n) → new float64 (F, n) within the bounds.

        Raises:
            ConfigError: ``x`` has the wrong shape or contains NaN (±inf is clipped to bounds).
        """
        arr = self._check_x(x)
        p = self._prepare(arr.shape[0])
        return self._synthesize(p, self._perturb(p, self._analyze(p, arr)))

    def release_coefficients(self, x: npt.ArrayLike) -> FloatArray:
        """The ε-DP noisy coefficients of ``x``: (F, m), each an integer multiple of :attr:`grid`.

        :meth:`release` is ``reconstruct(release_coefficients(x))``: both are the same release,
        so use one or the other for a chunk, never both (that would spend ε twice).
        """
        arr = self._check_x(x)
        p = self._prepare(arr.shape[0])
        return self._perturb(p, self._analyze(p, arr))

    def reconstruct(self, coefficients: npt.ArrayLike) -> FloatArray:
        """Post-processing of noisy coefficients (F, m) into a signal (F, n) within the bounds."""
        c = np.ascontiguousarray(coefficients, dtype=np.float64)
        if c.ndim != 2 or c.shape[1] != self.kept_coefficients:
            raise ConfigError(
                "coefficients",
                f"array of shape {c.shape}",
                f"must have shape (F, {self.kept_coefficients})",
            )
        return self._synthesize(self._prepare(c.shape[0]), c)

    def nonprivate_projection(self, x: npt.ArrayLike) -> FloatArray:
        """NOT PRIVATE: the noise-free reconstruction (clip, project on the kept coefficients,
        invert, cumulative sum for DCFPA, clip). For tests and utility evaluation only; never
        publish its output."""
        arr = self._check_x(x)
        p = self._prepare(arr.shape[0])
        return self._synthesize(p, self._analyze(p, arr))

    def _check_x(self, x: npt.ArrayLike) -> FloatArray:
        try:
            arr = np.ascontiguousarray(x, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ConfigError("x", type(x).__name__, "must be a float array (F, n)") from exc
        if arr.ndim != 2 or arr.shape[1] != self.n or arr.shape[0] < 1:
            raise ConfigError("x", f"array of shape {arr.shape}", f"must have shape (F, {self.n})")
        if self.n_features is not None and arr.shape[0] != self.n_features:
            raise ConfigError(
                "x", f"array of shape {arr.shape}", f"must have F = {self.n_features} rows"
            )
        if np.isnan(arr).any():
            bad = np.argwhere(np.isnan(arr))
            raise ConfigError(
                "x",
                f"{len(bad)} NaN, first at (feature {bad[0][0]}, step {bad[0][1]})",
                "NaN has no place within the bounds; impute it or drop the chunk",
            )
        return arr

    def _analyze(self, p: _Prepared, x: FloatArray) -> FloatArray:
        """Clip, shift by lo (DCFPA: clipped difference chunk), project: (F, n) → (F, m)."""
        if not self.kind.difference:

            def fill(s: FloatArray) -> None:  # s = clip(x, lo, hi) − lo, written in place
                np.maximum(x, p.lo, out=s)
                np.minimum(s, p.hi, out=s)
                s -= p.lo

            return p.transform.analyze_with(fill)

        def fill_difference(d: FloatArray) -> None:  # D_1 = x_1 − lo, D_t = clip(Δx_t, ±d)
            clipped = np.maximum(x, p.lo)
            np.minimum(clipped, p.hi, out=clipped)
            steps = d[:, 1:]
            np.subtract(clipped[:, 1:], clipped[:, :-1], out=steps)
            np.subtract(clipped[:, 0], p.lo[:, 0], out=d[:, 0])
            np.maximum(steps, p.neg_step, out=steps)
            np.minimum(steps, p.step, out=steps)

        return p.transform.analyze_with(fill_difference)

    def _perturb(self, p: _Prepared, c: FloatArray) -> FloatArray:
        """The private step: coefficients → integers on the grid + discrete Laplace, × γ."""
        v = np.multiply(c, p.inv_grid, out=c)  # exact: γ is a power of two
        np.rint(v, out=v)  # |v| ≤ ‖s‖₂/γ < 2^46 since γ ≥ 2δ (calibrate_laplace): exact integers
        v += p.noise.sample(self._source)  # integer + integer: exact in float64
        v *= p.grid  # exact again; every output is an integer multiple of γ
        return v

    def _synthesize(self, p: _Prepared, c: FloatArray) -> FloatArray:
        """Post-processing: (F, m) coefficients → (F, n) signal, cumulative sum, + lo, clip."""
        y = p.transform.synthesize(c, cumulative=self.kind.difference)
        y += p.lo
        np.maximum(y, p.lo, out=y)
        np.minimum(y, p.hi, out=y)
        return y


def _expand(values: FloatArray, width: int) -> FloatArray:
    """(F,) per-feature values as a contiguous (F, width) array."""
    return np.ascontiguousarray(np.repeat(values[:, None], width, axis=1))


def make_mechanism(
    name: str,
    *,
    n: int,
    k: int | str = "auto",
    epsilon: float | npt.ArrayLike | None = None,
    bounds: Bounds,
    transform: str = "dft",
    noise: str = "laplace",
    noise_multiplier: float | npt.ArrayLike | None = None,
    delta: float | None = None,
    seed: int | None = None,
    n_features: int | None = None,
    prior: PriorSpectrum | None = None,
) -> Mechanism:
    """Build a mechanism; plans, grid and sampler are prepared here, not in :meth:`release`.

    Args:
        name: a key of :data:`gazeguard.privacy.mechanisms.registry.MECHANISMS`: ``"lpa"``,
        ``"fpa"``
            (whole recording, offline), ``"cfpa"`` or ``"dcfpa"``.
        n: values per feature per release; a power of two for cfpa and dcfpa.
        k: kept frequencies, ``1 ≤ k ≤ n/2`` (dft) or ``≤ n`` (dct), or ``"auto"`` (chosen from
            the public prior, :mod:`gazeguard.privacy.mechanisms.auto_k`). Ignored by LPA.
        epsilon: pure ε per feature per release, scalar or (F,), finite and > 0.
        bounds: public bounds (``max_step`` required for dcfpa).
        transform: ``"dft"`` or ``"dct"`` (LPA reports ``"identity"``).
        noise: the noise family (:data:`gazeguard.privacy.mechanisms.registry.NOISE`): ``"laplace"``
            (pure ε-DP, pays the L1 sensitivity) or ``"gaussian"`` (pays the L2 sensitivity).
        delta: with ``noise="gaussian"`` and ``epsilon``: the per-release δ (the analytic
            Gaussian mechanism of Balle & Wang 2018 sets σ).
        noise_multiplier: instead of ``epsilon``: noise scale / effective sensitivity per
            feature, scalar or (F,), as an accountant calibrates it for a budget per hour.
        seed: None (default) for the OS CSPRNG. An integer selects an INSECURE reproducible
            generator for tests and experiments: every release draws fresh noise from it.
        n_features: F, if neither bounds nor epsilon are given per feature; otherwise plans for
            each new F are built on its first release.
        prior: the prior for ``k="auto"`` (default: the shipped one).

    Raises:
        ConfigError: naming the argument and value that are invalid.
    """
    return Mechanism(
        name,
        n=n,
        k=k,
        epsilon=epsilon,
        bounds=bounds,
        transform=transform,
        seed=seed,
        n_features=n_features,
        prior=prior,
        noise=noise,
        noise_multiplier=noise_multiplier,
        delta=delta,
    )
