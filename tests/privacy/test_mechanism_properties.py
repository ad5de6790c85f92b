"""Hypothesis properties of the mechanisms over shapes, bounds and ε: outputs stay in bounds with
their shape, the transforms are orthonormal, seeds reproduce, releases are independent."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gazeguard.privacy.mechanisms import Bounds, forward, inverse, make_mechanism

FloatArray = npt.NDArray[np.float64]
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.sampled_from(["lpa", "fpa", "cfpa", "dcfpa"])
transforms = st.sampled_from(["dft", "dct"])
epsilons = st.floats(0.05, 50.0)


@st.composite
def bounds_per_feature(draw: st.DrawFn, f: int) -> Bounds:
    lo = draw(arrays(np.float64, f, elements=st.floats(-1e3, 1e3)))
    width = draw(arrays(np.float64, f, elements=st.floats(1e-3, 1e3)))
    step_frac = draw(arrays(np.float64, f, elements=st.floats(1e-3, 2.0)))
    return Bounds(lo, lo + width, width * step_frac)


@st.composite
def setups(draw: st.DrawFn) -> tuple[str, int, int, str, Bounds, FloatArray]:
    name = draw(names)
    f = draw(st.integers(1, 6))
    n = 2 ** draw(st.integers(1, 7)) if name in ("cfpa", "dcfpa") else draw(st.integers(2, 70))
    transform = draw(transforms)
    top = n // 2 if transform == "dft" else n
    k = draw(st.integers(1, top))
    eps = draw(arrays(np.float64, f, elements=epsilons))
    return name, n, k, transform, draw(bounds_per_feature(f)), eps


@SETTINGS
@given(setup=setups(), data=st.data())
def test_release_keeps_shape_and_bounds(
    setup: tuple[str, int, int, str, Bounds, FloatArray], data: st.DataObject
) -> None:
    name, n, k, transform, bounds, eps = setup
    f = eps.size
    x = data.draw(
        arrays(
            np.float64, (f, n), elements=st.floats(-1e4, 1e4) | st.sampled_from([-np.inf, np.inf])
        )
    )
    mech = make_mechanism(
        name,
        n=n,
        k=k,
        epsilon=eps,
        bounds=bounds,
        transform=transform,
        seed=data.draw(st.integers(0, 2**32)),
    )
    y = mech.release(x)
    assert y.shape == (f, n)
    assert y.dtype == np.float64
    assert np.all(np.isfinite(y))
    assert np.all(y >= bounds.lo[:, None])
    assert np.all(y <= bounds.hi[:, None])
    p = mech.nonprivate_projection(x)
    assert np.all(p >= bounds.lo[:, None])
    assert np.all(p <= bounds.hi[:, None])
    assert mech.noise_scale.shape == mech.sensitivity_l2.shape == mech.epsilon.shape == (f,)
    # λ pays the L1 sensitivity of the kept coefficients (tight where computed), never more
    # than the Cauchy–Schwarz bound √m·Δ2 and never less than the L2 sensitivity.
    assert np.all(mech.noise_scale >= mech.sensitivity / eps)
    loose = np.sqrt(mech.kept_coefficients) * mech.sensitivity_l2
    assert np.all(mech.sensitivity <= loose * (1 + 1e-12))
    assert np.all(mech.sensitivity >= mech.sensitivity_l2 * (1 - 1e-12))


@SETTINGS
@given(
    x=arrays(
        np.float64,
        st.tuples(st.integers(1, 5), st.integers(1, 80)),
        elements=st.floats(-1e6, 1e6),
    ),
    transform=transforms,
)
def test_transforms_are_orthonormal(x: FloatArray, transform: str) -> None:
    c = forward(x, transform)  # type: ignore[arg-type]
    scale = max(1.0, float(np.max(np.abs(x))))
    norm_x = np.sum(x**2, axis=1)
    np.testing.assert_allclose(np.sum(c**2, axis=1), norm_x, rtol=1e-10, atol=1e-18 * scale**2)
    np.testing.assert_allclose(inverse(c, transform), x, atol=1e-9 * scale)  # type: ignore[arg-type]


@SETTINGS
@given(setup=setups(), seed=st.integers(0, 2**63 - 1))
def test_a_seed_reproduces_the_whole_sequence(
    setup: tuple[str, int, int, str, Bounds, FloatArray], seed: int
) -> None:
    name, n, k, transform, bounds, eps = setup
    x = np.broadcast_to((bounds.lo + bounds.hi)[:, None] / 2, (eps.size, n))
    kw = {"n": n, "k": k, "epsilon": eps, "bounds": bounds, "transform": transform}
    a = make_mechanism(name, seed=seed, **kw)
    b = make_mechanism(name, seed=seed, **kw)
    for _ in range(3):
        np.testing.assert_array_equal(a.release_coefficients(x), b.release_coefficients(x))


@SETTINGS
@given(setup=setups(), seed=st.integers(0, 2**32))
def test_releases_draw_fresh_noise(
    setup: tuple[str, int, int, str, Bounds, FloatArray], seed: int
) -> None:
    """Two releases of the same chunk share no noise: the coefficient noise of consecutive
    releases differs in (almost surely) every coordinate, and so does a second mechanism's."""
    name, n, k, transform, bounds, eps = setup
    x = np.broadcast_to(bounds.lo[:, None], (eps.size, n))
    kw = {"n": n, "k": k, "epsilon": eps, "bounds": bounds, "transform": transform}
    mech = make_mechanism(name, seed=seed, **kw)
    first, second = mech.release_coefficients(x), mech.release_coefficients(x)
    other = make_mechanism(name, seed=seed + 1, **kw).release_coefficients(x)
    # With t ≈ 2^20 grid steps per λ, two equal draws have probability ≈ 1e-6 per coordinate.
    assert np.mean(first == second) < 0.5
    assert np.mean(first == other) < 0.5
