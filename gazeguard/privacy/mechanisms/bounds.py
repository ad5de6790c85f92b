"""Public bounds per feature and the sensitivities they imply.

The bounds are the only thing a mechanism's sensitivity may depend on: they are declared in the
feature registry, ship with the package and are part of the privacy guarantee. The user's data
never enters a sensitivity.

Notation for one feature in one chunk of ``n`` steps: values ``x ∈ [lo, hi]^n`` (after clipping),
range ``R = hi − lo``, step bound ``d = max_step``. Two chunks are *neighbours* when both satisfy
the bounds (replace-one at the user level within the chunk: every value may change).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError

FloatArray = npt.NDArray[np.float64]
ArrayLike = float | int | npt.ArrayLike


def _as_vector(name: str, value: ArrayLike | None) -> FloatArray | None:
    """``value`` as a float64 array of shape () or (F,); ConfigError if not finite or 2-D."""
    if value is None:
        return None
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ConfigError(name, value, "must be a number or a 1-D array of numbers") from exc
    if arr.ndim > 1:
        raise ConfigError(name, value, f"must be a scalar or of shape (F,), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ConfigError(name, value, "must be finite (no NaN or infinity)")
    return arr


@dataclass(frozen=True, eq=False)  # arrays have no single truth value: compare fields instead
class Bounds:
    """Declared public bounds of F features.

    Each attribute is a float64 array of shape () (one value for every feature) or (F,).

    Attributes:
        lo: smallest plausible value, in the feature's unit.
        hi: largest plausible value, in the feature's unit; ``hi > lo``.
        max_step: largest plausible change between consecutive steps, in the feature's unit per
            step, ``> 0``; needed by DCFPA only (``None`` otherwise).
    """

    lo: FloatArray
    hi: FloatArray
    max_step: FloatArray | None = None

    def __init__(self, lo: ArrayLike, hi: ArrayLike, max_step: ArrayLike | None = None) -> None:
        lo_a = _as_vector("bounds.lo", lo)
        hi_a = _as_vector("bounds.hi", hi)
        assert lo_a is not None
        assert hi_a is not None
        step_a = _as_vector("bounds.max_step", max_step)
        try:
            shape = np.broadcast_shapes(
                lo_a.shape, hi_a.shape, () if step_a is None else step_a.shape
            )
        except ValueError as exc:
            shapes = (lo_a.shape, hi_a.shape, None if step_a is None else step_a.shape)
            raise ConfigError(
                "bounds", shapes, "lo, hi and max_step must have the same length F"
            ) from exc
        bad = np.flatnonzero(np.broadcast_to(lo_a >= hi_a, shape).reshape(-1))
        if bad.size:
            i = int(bad[0])
            lo_i = float(np.broadcast_to(lo_a, shape).reshape(-1)[i])
            hi_i = float(np.broadcast_to(hi_a, shape).reshape(-1)[i])
            raise ConfigError(
                "bounds.lo",
                lo_i,
                f"must be < bounds.hi = {hi_i!r} (feature index {i}); swap or widen the bounds",
            )
        if step_a is not None and np.any(step_a <= 0):
            i = int(np.flatnonzero(step_a.reshape(-1) <= 0)[0])
            raise ConfigError(
                "bounds.max_step",
                float(step_a.reshape(-1)[i]),
                f"must be > 0 (feature index {i}): the largest change per step",
            )
        object.__setattr__(self, "lo", lo_a)
        object.__setattr__(self, "hi", hi_a)
        object.__setattr__(self, "max_step", step_a)

    @property
    def n_features(self) -> int | None:
        """F if any bound is given per feature, else ``None`` (the bounds apply to any F)."""
        shapes = [self.lo.shape, self.hi.shape]
        if self.max_step is not None:
            shapes.append(self.max_step.shape)
        shape = np.broadcast_shapes(*shapes)
        return int(shape[0]) if shape else None

    def broadcast(self, n_features: int) -> Bounds:
        """The same bounds with every attribute of shape (F,) for ``F = n_features``.

        Raises:
            ConfigError: if the bounds are per feature for a different F.
        """
        own = self.n_features
        if own is not None and own != n_features:
            raise ConfigError(
                "bounds", f"{own} features", f"the data has {n_features} features (rows)"
            )
        step = None if self.max_step is None else np.broadcast_to(self.max_step, (n_features,))
        return Bounds(
            np.broadcast_to(self.lo, (n_features,)).copy(),
            np.broadcast_to(self.hi, (n_features,)).copy(),
            None if step is None else step.copy(),
        )

    @property
    def range(self) -> FloatArray:
        """``R = hi − lo``, same shape as the bounds."""
        return np.asarray(self.hi - self.lo, dtype=np.float64)

    def effective_step(self) -> FloatArray:
        """``min(max_step, R)``: no step between two values in ``[lo, hi]`` exceeds ``R``.

        Clipping differences to ``±min(d, R)`` instead of ``±d`` changes nothing for valid data
        and can only lower the sensitivity, so it is always sound.

        Raises:
            ConfigError: if ``max_step`` was not declared.
        """
        if self.max_step is None:
            raise ConfigError(
                "bounds.max_step", None, "is required for the difference mechanism (dcfpa)"
            )
        return np.minimum(self.max_step, self.range)


def raw_sensitivity_l2(bounds: Bounds, n: int) -> FloatArray:
    """L2 sensitivity of a raw chunk of ``n`` values: ``Δ2 = √n · R``.

    Neighbouring chunks may differ in every one of the ``n`` values by at most ``R`` (both lie in
    ``[lo, hi]``), so ``‖x − x'‖₂ ≤ √(n·R²)``; the bound is reached by all-``lo`` versus all-``hi``.
    The L1 sensitivity is ``Δ1 = n · R`` by the same argument.
    """
    return np.asarray(np.sqrt(float(n)) * bounds.range, dtype=np.float64)


def difference_sensitivity_l2(bounds: Bounds, n: int) -> FloatArray:
    """L2 sensitivity of a clipped difference chunk: ``Δ2 = √(R² + (n−1)(2d)²)``.

    The difference chunk is ``D_1 = x_1 − lo`` and ``D_t = clip(x_t − x_{t−1}, −d, d)`` for
    ``t = 2..n`` with ``d = min(max_step, R)`` (see :meth:`Bounds.effective_step`). Between
    neighbours ``|D_1 − D'_1| ≤ R`` (both first values lie in ``[lo, hi]``) and every later
    component lies in ``[−d, d]``, so ``|D_t − D'_t| ≤ 2d``. Summing squares gives the bound,
    whatever the data; the clipping is what makes it hold for every input, not only for inputs that
    respect ``max_step``.
    """
    d = bounds.effective_step()
    return np.sqrt(bounds.range**2 + (n - 1) * (2.0 * d) ** 2)


def chunk_sensitivity(difference: bool, bounds: Bounds, n: int) -> tuple[FloatArray, FloatArray]:
    """``(Δ2, largest ‖s‖₂)`` of the signal a mechanism transforms, per feature.

    ``s`` is the raw chunk shifted by ``lo`` (``x − lo ∈ [0, R]^n``, so ``‖s‖₂ ≤ √n·R``) or, with
    ``difference``, the clipped difference chunk (``‖D‖₂ ≤ √(R² + (n−1)d²)``). Shifting by the
    public ``lo`` changes no distance, so sensitivities are those of :func:`raw_sensitivity_l2`
    and :func:`difference_sensitivity_l2`; the norm bound feeds the floating-point error bound.
    """
    if difference:
        d = bounds.effective_step()
        return difference_sensitivity_l2(bounds, n), np.sqrt(bounds.range**2 + (n - 1) * d**2)
    delta = raw_sensitivity_l2(bounds, n)
    return delta, delta


def check_finite_positive(name: str, value: ArrayLike) -> FloatArray:
    """``value`` as float64 of shape () or (F,), every entry finite and > 0, else ConfigError."""
    arr = _as_vector(name, value)
    assert arr is not None
    bad = arr.reshape(-1) <= 0
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        v = float(arr.reshape(-1)[i])
        where = f" (feature index {i})" if arr.ndim else ""
        raise ConfigError(name, v, f"must be a finite number > 0{where}")
    return arr


def is_power_of_two(n: int) -> bool:
    """True for 1, 2, 4, 8, ..."""
    return n >= 1 and (n & (n - 1)) == 0
