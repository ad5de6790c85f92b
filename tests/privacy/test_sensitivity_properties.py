"""Hypothesis properties of the tight sensitivities: the chain dynamic programme against brute
force for arbitrary weights, the sensitivity against brute force for random bounds, random input
pairs never exceeding it, monotonicity in k, invariance under shift and scale."""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gazeguard.privacy.mechanisms import Bounds
from gazeguard.privacy.mechanisms import sensitivity as sens
from gazeguard.privacy.mechanisms.registry import kept_coefficients, max_k
from gazeguard.privacy.mechanisms.sensitivity import coefficient_basis, kept_coefficient_sensitivity
from gazeguard.privacy.mechanisms.transforms import OrthonormalTransform

FloatArray = npt.NDArray[np.float64]
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def chain_objective(w: FloatArray, y: FloatArray) -> FloatArray:
    """f(y) = w_1·y_1 + Σ_t w_t·clip(y_t − y_{t−1}, −1, 1) for each row of y (N, n)."""
    return np.asarray(
        y[:, 0] * w[0] + np.clip(np.diff(y, axis=1), -1.0, 1.0) @ w[1:], dtype=np.float64
    )


def all_points(v: FloatArray, n: int) -> FloatArray:
    """Every point of v^n, (|v|^n, n)."""
    return np.stack(np.meshgrid(*([v] * n), indexing="ij"), axis=-1).reshape(-1, n)


@SETTINGS
@given(
    n=st.integers(1, 6),
    q=st.floats(1.0, 3.9),
    data=st.data(),
)
def test_chain_dynamic_programme_is_the_grid_maximum(n: int, q: float, data: st.DataObject) -> None:
    """For any weights, the DP's maximum equals the maximum of f over every point of V^n."""
    w = data.draw(arrays(np.float64, (3, n), elements=st.floats(-10.0, 10.0)))
    v = sens._grid(q, n)
    points = all_points(v, n)
    got = sens._chain_maximum(w, v, sens._transitions(v))
    for row in range(3):
        brute = float(chain_objective(w[row], points).max())
        assert abs(got[row] - brute) <= 1e-9 * (1.0 + abs(brute))


@SETTINGS
@given(
    n=st.integers(1, 5),
    q=st.floats(1.0, 4.0),
    data=st.data(),
)
def test_grid_lemma_no_box_point_beats_the_grid(n: int, q: float, data: st.DataObject) -> None:
    """Random points of the box [0, q]^n (and a finer grid) never beat the maximum over V^n."""
    w = data.draw(arrays(np.float64, n, elements=st.floats(-10.0, 10.0)))
    v = sens._grid(q, n)
    best = float(sens._chain_maximum(w[None, :], v, sens._transitions(v))[0])
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    random_points = rng.uniform(0.0, q, (4000, n))
    fine = np.unique(np.concatenate([np.linspace(0.0, q, 23), np.minimum(np.arange(0, q, 0.5), q)]))
    fine_points = all_points(fine, min(n, 3))
    if n > 3:
        fine_points = np.concatenate([fine_points, np.zeros((fine_points.shape[0], n - 3))], 1)
    for pts in (random_points, fine_points):
        assert float(chain_objective(w, pts).max()) <= best + 1e-9 * (1.0 + abs(best))


@st.composite
def configs(draw: st.DrawFn) -> tuple[str, str, int, int, Bounds]:
    name = draw(st.sampled_from(["cfpa", "dcfpa"]))
    transform = draw(st.sampled_from(["dft", "dct"]))
    n = draw(st.sampled_from([2, 4]))
    k = draw(st.integers(1, max_k(transform, n)))
    lo = draw(st.floats(-100.0, 100.0))
    width = draw(st.floats(0.01, 100.0))
    ratio = draw(st.floats(0.2, 1.5))
    return name, transform, n, k, Bounds(lo, lo + width, ratio * width)


@pytest.mark.slow
@SETTINGS
@given(config=configs())
def test_sensitivity_equals_brute_force_for_random_bounds(
    config: tuple[str, str, int, int, Bounds],
) -> None:
    """Exhaustive over the grid of the lemma (difference) or the vertices (raw), with the
    mechanisms' own transform."""
    name, transform, n, k, bounds = config
    lo, hi = float(bounds.lo), float(bounds.hi)
    d = float(bounds.effective_step())
    m = kept_coefficients(transform, k)
    if name == "cfpa":
        signal = np.array(list(itertools.product([0.0, hi - lo], repeat=n)))
    else:
        v = sens._grid((hi - lo) / d, n) * d + lo
        x = np.clip(np.array(list(itertools.product(v, repeat=n))), lo, hi)
        signal = np.concatenate([x[:, :1] - lo, np.clip(np.diff(x, axis=1), -d, d)], axis=1)
    c = OrthonormalTransform(transform, signal.shape[0], n, m).analyze(signal)  # type: ignore[arg-type]
    brute = float(np.abs(c[:, None, :] - c[None, :, :]).sum(axis=2).max())
    got = kept_coefficient_sensitivity(name, bounds, n, k, transform)
    assert got.exact
    assert got.l1[0] >= brute * (1 - 1e-12)
    assert got.l1[0] <= brute * (1 + 1e-8) + 1e-12 * (hi - lo)


@SETTINGS
@given(
    n=st.sampled_from([8, 16, 32]),
    transform=st.sampled_from(["dft", "dct"]),
    k=st.integers(1, 4),
    ratio=st.floats(0.01, 1.2),
    data=st.data(),
)
def test_random_pairs_stay_within_the_bound(
    n: int, transform: str, k: int, ratio: float, data: st.DataObject
) -> None:
    """Inputs anywhere in (and beyond: the mechanism clips) the box, biased towards the extreme
    values, never move the kept coefficients by more than the tight L1."""
    lo, hi = 1.0, 4.0
    d = ratio * (hi - lo)
    values = st.floats(lo - 1, hi + 1) | st.sampled_from([lo, hi, lo + d, hi - d, lo + 2 * d])
    x = data.draw(arrays(np.float64, (2, n), elements=values))
    m = kept_coefficients(transform, k)
    basis = coefficient_basis(transform, n, m)
    c = np.clip(x, lo, hi)
    diff = np.concatenate([c[:, :1] - lo, np.clip(np.diff(c, axis=1), -d, d)], axis=1)
    raw = kept_coefficient_sensitivity("cfpa", Bounds(lo, hi, d), n, k, transform)
    dif = kept_coefficient_sensitivity("dcfpa", Bounds(lo, hi, d), n, k, transform)
    assert float(np.abs(basis @ (c[0] - c[1])).sum()) <= raw.l1[0] * (1 + 1e-12)
    assert float(np.abs(basis @ (diff[0] - diff[1])).sum()) <= dif.l1[0] * (1 + 1e-12)


@SETTINGS
@given(
    name=st.sampled_from(["cfpa", "dcfpa"]),
    transform=st.sampled_from(["dft", "dct"]),
    n=st.sampled_from([8, 32, 64]),
    ratio=st.floats(0.01, 1.0),
    shift=st.floats(-1e3, 1e3),
    scale=st.floats(1e-3, 1e3),
)
def test_monotone_in_k_and_invariant_under_shift_and_scale(
    name: str, transform: str, n: int, ratio: float, shift: float, scale: float
) -> None:
    """More kept coefficients can only increase the L1 supremum (‖·‖₁ over more coordinates);
    the bound never exceeds √m·Δ2; shifting the bounds changes nothing, scaling scales it."""
    base = Bounds(0.0, 1.0, ratio)
    moved = Bounds(shift, shift + scale, ratio * scale)
    previous = 0.0
    for k in range(1, 5):
        got = kept_coefficient_sensitivity(name, base, n, k, transform)
        assert got.l1[0] >= previous * (1 - 1e-9)
        assert got.l1[0] <= got.l1_loose[0]
        assert got.l2[0] <= got.l2_loose[0]
        previous = float(got.l1[0])
        other = kept_coefficient_sensitivity(name, moved, n, k, transform)
        assert (
            other.l1[0] == np.float64(scale * got.l1[0])
            or abs(other.l1[0] / (scale * got.l1[0]) - 1) < 1e-9
        )
