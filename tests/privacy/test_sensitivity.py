"""Tight sensitivities of the kept coefficients against brute force over the input box, computed
with the mechanisms' own transform (``OrthonormalTransform``) on every vertex / grid point."""

from __future__ import annotations

import itertools
import math

import numpy as np
import numpy.typing as npt
import pytest

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.mechanisms import Bounds, forward
from gazeguard.privacy.mechanisms import sensitivity as sens
from gazeguard.privacy.mechanisms.bounds import difference_sensitivity_l2, raw_sensitivity_l2
from gazeguard.privacy.mechanisms.registry import kept_coefficients, max_k
from gazeguard.privacy.mechanisms.sensitivity import (
    coefficient_basis,
    kept_coefficient_sensitivity,
    lpa_l1_sensitivity,
)
from gazeguard.privacy.mechanisms.transforms import OrthonormalTransform
from gazeguard.signal.features import feature_bounds

FloatArray = npt.NDArray[np.float64]


def coefficients(points: FloatArray, transform: str, m: int) -> FloatArray:
    """The mechanisms' own kept coefficients of each row of ``points`` (N, n)."""
    n = points.shape[1]
    return OrthonormalTransform(transform, points.shape[0], n, m).analyze(points)  # type: ignore[arg-type]


def difference_signal(x: FloatArray, lo: float, hi: float, d: float) -> FloatArray:
    """D_1 = x_1 − lo, D_t = clip(x_t − x_{t−1}, −d, d) of the clipped chunk, as fpa.py does."""
    c = np.clip(x, lo, hi)
    out = np.empty_like(c)
    out[:, 0] = c[:, 0] - lo
    out[:, 1:] = np.clip(np.diff(c, axis=1), -d, d)
    return out


def max_l1_distance(c: FloatArray) -> float:
    """max over pairs of rows of ‖c_i − c_j‖₁, by the identity ‖v‖₁ = max_σ σᵀv (all σ)."""
    m = c.shape[1]
    best = 0.0
    for signs in itertools.product([-1.0, 1.0], repeat=m):
        p = c @ np.array(signs)
        best = max(best, float(p.max() - p.min()))
    return best


def pairwise_max_l1(c: FloatArray) -> float:
    """The same maximum by explicit enumeration of all pairs (small N only)."""
    return float(np.abs(c[:, None, :] - c[None, :, :]).sum(axis=2).max())


@pytest.mark.parametrize("transform", ["dft", "dct"])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16, 64])
def test_basis_is_the_transforms_basis(transform: str, n: int) -> None:
    """Row j of B_m is the coefficient j of each unit vector, exactly as ``transforms`` computes
    it (all n rows, including the Nyquist row of the dft at even n)."""
    full = forward(np.eye(n), transform).T  # type: ignore[arg-type]
    np.testing.assert_allclose(coefficient_basis(transform, n, n), full, atol=1e-14)
    np.testing.assert_allclose(coefficient_basis(transform, n, n) @ full.T, np.eye(n), atol=1e-13)


@pytest.mark.parametrize("transform", ["dft", "dct"])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_raw_chunk_matches_brute_force_over_all_vertex_pairs(transform: str, n: int) -> None:
    """‖B_m(s − s')‖₁ is convex in (s, s'), so its supremum over the box is at vertices: all
    2^n × 2^n pairs of {lo, hi}^n, coefficients from the mechanisms' transform."""
    lo, hi = -1.5, 2.25
    vertices = np.array(list(itertools.product([lo, hi], repeat=n))) - lo
    for k in range(1, max_k(transform, n) + 1):
        m = kept_coefficients(transform, k)
        brute = pairwise_max_l1(coefficients(vertices, transform, m))
        got = kept_coefficient_sensitivity("fpa", Bounds(lo, hi), n, k, transform)
        assert got.exact
        assert got.l1[0] >= brute * (1 - 1e-13)  # brute force has its own rounding
        assert got.l1[0] == pytest.approx(brute, rel=1e-11)


def grid_points(lo: float, hi: float, d: float, n: int, refine: int) -> FloatArray:
    """Every x ∈ G^n for G = {lo + j·d/refine} ∪ {hi − j·d/refine} within [lo, hi] (contains
    the lemma's grid V for any refine ≥ 1)."""
    step = d / refine
    count = math.floor((hi - lo) / step + 1e-9)
    j = np.arange(count + 1)
    values = np.unique(np.concatenate([lo + j * step, hi - j * step]))
    return np.array(list(itertools.product(values, repeat=n)))


@pytest.mark.parametrize(
    ("n", "ratio", "refine"),
    [(2, 1.0, 4), (2, 0.3, 2), (4, 0.4, 2), (4, 1.0, 2), (4, 0.7, 1), (4, 0.15, 1)],
)
@pytest.mark.parametrize("transform", ["dft", "dct"])
def test_difference_chunk_matches_brute_force_on_a_grid(
    n: int, ratio: float, refine: int, transform: str
) -> None:
    """The dynamic programme equals the maximum over every pair of grid points (a grid finer than
    the lemma's where affordable), coefficients from the mechanisms' own transform and
    difference signal. ratio = max_step / R."""
    lo, hi = 2.0, 7.0
    d = ratio * (hi - lo)
    points = grid_points(lo, hi, d, n, refine)
    signal = difference_signal(points, lo, hi, d)
    for k in range(1, max_k(transform, n) + 1):
        m = kept_coefficients(transform, k)
        c = coefficients(signal, transform, m)
        brute = max_l1_distance(c)
        got = kept_coefficient_sensitivity("dcfpa", Bounds(lo, hi, d), n, k, transform)
        assert got.exact
        assert got.l1[0] >= brute * (1 - 1e-13)  # brute force has its own rounding
        assert got.l1[0] == pytest.approx(brute, rel=1e-11), (k, got.l1[0], brute)
        if points.shape[0] <= 400:  # all pairs explicitly, no sign identity involved
            assert pairwise_max_l1(c) == pytest.approx(brute, rel=1e-12)


@pytest.mark.parametrize(("n", "q"), [(3, 2.5), (5, 1.7), (6, 1.0), (6, 2.2), (5, 9.0)])
@pytest.mark.parametrize("transform", ["dft", "dct"])
def test_difference_dynamic_programme_on_odd_lengths(n: int, q: float, transform: str) -> None:
    """The unit computation (d = 1, R = q) on lengths the chunked mechanisms do not use, against
    all points of the lemma's grid for n ≤ 6."""
    v = sens._grid(q, n)
    points = np.array(list(itertools.product(v, repeat=n)))
    signal = difference_signal(points, 0.0, q, 1.0)
    for k in range(1, max_k(transform, n) + 1):
        m = kept_coefficients(transform, k)
        brute = max_l1_distance(coefficients(signal, transform, m))
        unit, exact = sens._unit_difference(transform, n, m, q)
        assert exact
        assert unit >= brute * (1 - 1e-13)
        assert unit == pytest.approx(brute, rel=1e-11)


def milp_chain_maximum(w: FloatArray, q: float) -> float:
    """``max_{y ∈ [0, q]^n} w_1·y_1 + Σ_t w_t·clip(y_t − y_{t−1}, −1, 1)`` as a mixed-integer
    programme (scipy's HiGHS), without the grid lemma: per step, binaries a_t (step ≥ 1, clip
    value 1) and b_t (step ≤ −1, clip value −1); otherwise the clip value equals the step."""
    from scipy.optimize import Bounds as VarBounds  # noqa: PLC0415
    from scipy.optimize import LinearConstraint, milp  # noqa: PLC0415

    n = w.size
    big = q + 2.0
    nv = n + 3 * (n - 1)  # y (n), c (n−1), a (n−1), b (n−1)
    rows, lower, upper = [], [], []

    def add(coef: dict[int, float], lo: float, hi: float) -> None:
        r = np.zeros(nv)
        for i, value in coef.items():
            r[i] = value
        rows.append(r)
        lower.append(lo)
        upper.append(hi)

    for t in range(n - 1):
        y1, y0, c, a, b = t + 1, t, n + t, 2 * n - 1 + t, 3 * n - 2 + t
        add({c: 1, y1: -1, y0: 1, a: -big, b: -big}, -np.inf, 0.0)  # c ≤ step unless a or b
        add({c: 1, y1: -1, y0: 1, a: big, b: big}, 0.0, np.inf)  # c ≥ step unless a or b
        add({c: 1, a: -big}, 1.0 - big, np.inf)  # a ⇒ c = 1
        add({c: 1, b: big}, -np.inf, big - 1.0)  # b ⇒ c = −1
        add({a: 1, b: 1}, -np.inf, 1.0)
        add({y1: 1, y0: -1, a: -big}, 1.0 - big, np.inf)  # a ⇒ step ≥ 1
        add({y1: 1, y0: -1, b: big}, -np.inf, big - 1.0)  # b ⇒ step ≤ −1
    objective = np.zeros(nv)
    objective[0] = -w[0]
    objective[n : 2 * n - 1] = -w[1:]
    lb = np.concatenate([np.zeros(n), -np.ones(n - 1), np.zeros(2 * (n - 1))])
    ub = np.concatenate([np.full(n, q), np.ones(n - 1), np.ones(2 * (n - 1))])
    integrality = np.concatenate([np.zeros(2 * n - 1), np.ones(2 * (n - 1))])
    res = milp(
        objective,
        constraints=LinearConstraint(np.array(rows), lower, upper),
        integrality=integrality,
        bounds=VarBounds(lb, ub),
        options={"mip_rel_gap": 1e-12},
    )
    assert res.success, res.message
    return float(-res.fun)


@pytest.mark.parametrize(("transform", "m"), [("dft", 3), ("dct", 3)])
def test_difference_dynamic_programme_against_an_independent_milp(transform: str, m: int) -> None:
    """At n = 32 and max_step/R = 0.02 (no brute force possible), every sign vector's bracket
    M(w) + M(−w) from the dynamic programme equals the optimum of a mixed-integer programme that
    does not use the grid lemma."""
    n, q = 32, 50.0
    basis = coefficient_basis(transform, n, m)
    v = sens._grid(q, n)
    steps = sens._transitions(v)
    best = 0.0
    for signs in itertools.product([-1.0, 1.0], repeat=m - 1):
        w = np.array((1.0, *signs)) @ basis
        dp = sens._chain_maximum(np.stack([w, -w]), v, steps)
        for value, weights in zip(dp, (w, -w), strict=True):
            assert value == pytest.approx(milp_chain_maximum(weights, q), rel=1e-9, abs=1e-9)
        best = max(best, float(dp.sum()))
    unit, exact = sens._unit_difference(transform, n, m, q)
    assert exact
    assert unit == pytest.approx(best, rel=1e-9)


def test_one_coefficient_raw_is_the_l2_sensitivity() -> None:
    """m = 1 (dft k = 1 or dct k = 1): the DC coefficient's range is √n·R = Δ2, so the tight
    bound equals the old one and L2 = L1 exactly."""
    b = Bounds(np.array([0.0, -3.0]), np.array([1.0, 5.0]))
    for transform in ("dft", "dct"):
        got = kept_coefficient_sensitivity("cfpa", b, 64, 1, transform)
        np.testing.assert_allclose(got.l1, raw_sensitivity_l2(b, 64), rtol=1e-12)
        np.testing.assert_allclose(got.ratio, 1.0, rtol=1e-12)
        np.testing.assert_array_equal(got.l2, np.minimum(got.l2_loose, got.l1))


def test_difference_with_unclipped_steps_is_the_last_value() -> None:
    """max_step ≥ R: no step is ever clipped, Σ_t D_t = x_n − lo ∈ [0, R], so the DC coefficient
    moves by at most R/√n — a 2n-fold smaller bound than √(R² + 4(n−1)R²)."""
    got = kept_coefficient_sensitivity("dcfpa", Bounds(0.0, 3.0, 10.0), 128, 1, "dct")
    assert got.l1[0] >= 3.0 / math.sqrt(128)
    assert got.l1[0] == pytest.approx(3.0 / math.sqrt(128), rel=1e-9)  # the rounding margin
    assert got.l2[0] == got.l1[0]
    assert got.ratio[0] < 1 / 200


def test_scaling_and_shift() -> None:
    """The supremum scales with the bounds and ignores a common shift (cached per R/d)."""
    base = kept_coefficient_sensitivity("dcfpa", Bounds(0.0, 1.0, 0.05), 32, 3, "dft")
    moved = kept_coefficient_sensitivity("dcfpa", Bounds(100.0, 107.0, 0.35), 32, 3, "dft")
    assert moved.l1[0] == pytest.approx(7.0 * base.l1[0], rel=1e-12)
    per_feature = kept_coefficient_sensitivity(
        "dcfpa", Bounds([0.0, 100.0], [1.0, 107.0], [0.05, 0.35]), 32, 3, "dft"
    )
    np.testing.assert_allclose(per_feature.l1, [base.l1[0], moved.l1[0]], rtol=1e-15)


def test_lpa() -> None:
    b = Bounds(np.array([0.0, 1.0]), np.array([2.0, 1.5]))
    np.testing.assert_array_equal(lpa_l1_sensitivity(b, 16), [32.0, 8.0])
    got = kept_coefficient_sensitivity("lpa", b, 16, 1, "dft")
    np.testing.assert_array_equal(got.l1, [32.0, 8.0])
    np.testing.assert_allclose(got.l2, [8.0, 2.0])
    assert got.exact


def test_fallback_is_a_valid_upper_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the enumeration limits lowered, the per-coefficient-range bound is reported as
    inexact and lies between the exact value and √m·Δ2."""
    exact_raw = kept_coefficient_sensitivity("cfpa", Bounds(0.0, 1.0, 0.1), 32, 4, "dft")
    exact_diff = kept_coefficient_sensitivity("dcfpa", Bounds(0.0, 1.0, 0.1), 32, 4, "dft")
    monkeypatch.setattr(sens, "MAX_SIGN_VECTORS", 2)
    monkeypatch.setattr(sens, "MAX_DP_WORK", 2)
    sens._unit_raw.cache_clear()
    sens._unit_difference.cache_clear()
    try:
        for name, exact in (("cfpa", exact_raw), ("dcfpa", exact_diff)):
            loose = kept_coefficient_sensitivity(name, Bounds(0.0, 1.0, 0.1), 32, 4, "dft")
            assert exact.exact
            assert not loose.exact
            assert exact.l1[0] <= loose.l1[0] <= loose.l1_loose[0]
    finally:
        sens._unit_raw.cache_clear()
        sens._unit_difference.cache_clear()


def test_blocked_fallback_is_between_exact_and_per_coefficient(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Blocks of several coefficients give a bound no worse than single coefficients."""
    b = Bounds(0.0, 1.0, 0.05)
    exact = kept_coefficient_sensitivity("dcfpa", b, 16, 4, "dft")  # m = 7
    values = []
    try:
        grid_steps = sens._grid(20.0, 16).size * 16  # q = R/d = 20, n = 16
        for budget in (3 * 2**2 * grid_steps, 2):  # three blocks of ≤ 3 rows, then single rows
            monkeypatch.setattr(sens, "MAX_DP_WORK", budget)
            sens._unit_difference.cache_clear()
            got = kept_coefficient_sensitivity("dcfpa", b, 16, 4, "dft")
            assert not got.exact
            values.append(float(got.l1[0]))
    finally:
        sens._unit_difference.cache_clear()
    assert exact.l1[0] <= values[0] <= values[1]
    assert values[0] < values[1]


def test_large_m_falls_back_without_enumerating() -> None:
    """dft k = 16 at n = 128 (m = 31, 2^30 sign vectors) is not enumerated."""
    got = kept_coefficient_sensitivity("dcfpa", Bounds(0.0, 1.0, 0.02), 128, 16, "dft")
    assert not got.exact
    assert np.all(got.l1 <= got.l1_loose)
    d2 = difference_sensitivity_l2(Bounds(0.0, 1.0, 0.02), 128)
    np.testing.assert_allclose(got.l1_loose, math.sqrt(31) * d2)


def test_shipped_feature_bounds_are_tighter() -> None:
    """For the shipped feature bounds the tight L1 is never above √m·Δ2, strictly below it for
    DCFPA, and in the measured range at max_step/R = 0.02."""
    lo, hi, step = feature_bounds()
    b = Bounds(lo, hi, step)
    at_002 = np.abs(np.minimum(step, hi - lo) / (hi - lo) - 0.02) < 1e-3
    for transform in ("dft", "dct"):
        got = kept_coefficient_sensitivity("dcfpa", b, 64, 2, transform)
        assert got.exact
        assert np.all(got.ratio < 1.0)
        assert np.all((got.ratio[at_002] > 0.3) & (got.ratio[at_002] < 0.75))
        assert np.all(got.l2 <= got.l2_loose)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "xpa"}, "name"),
        ({"n": 48}, "n"),
        ({"n": 1}, "n"),
        ({"k": 0}, "k"),
        ({"k": 33}, "k"),
        ({"transform": "wavelet"}, "transform"),
    ],
)
def test_errors_name_the_argument(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {
        "name": "cfpa",
        "bounds": Bounds(0.0, 1.0, 0.1),
        "n": 64,
        "k": 2,
        "transform": "dft",
    }
    args.update(kwargs)
    with pytest.raises(ConfigError, match=f"'{field}'"):
        kept_coefficient_sensitivity(**args)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_step"):
        kept_coefficient_sensitivity("dcfpa", Bounds(0.0, 1.0), 64, 2, "dft")
