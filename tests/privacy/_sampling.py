"""χ² checks shared by the tests of the discrete Laplace and Gaussian samplers."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def pooled_chi2(draws: IntArray, cells: IntArray, pmf: FloatArray) -> float:
    """p-value of a χ² goodness-of-fit test of the integer ``draws`` against the probabilities
    ``pmf`` of the values ``cells`` (same shape), every other value pooled into one more cell;
    cells of expected count ≤ 0 are left out."""
    n = draws.size
    observed = np.array([np.count_nonzero(draws == v) for v in cells], dtype=np.float64)
    expected = pmf * n
    observed = np.append(observed, n - observed.sum())
    expected = np.append(expected, n - expected.sum())
    keep = expected > 0
    return float(stats.chisquare(observed[keep], expected[keep]).pvalue)


def opendp_measurement(noise: str, scale: float) -> Any:
    """OpenDP's discrete ``noise`` (``"laplace"``: L1, ``"gaussian"``: L2) measurement on vectors of
    integers at ``scale``; skips the test where OpenDP is not installed."""
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    distance = dp.l1_distance if noise == "laplace" else dp.l2_distance
    space = dp.vector_domain(dp.atom_domain(T=int)), distance(T=int)
    return getattr(dp.m, f"make_{noise}")(*space, scale=scale)


def two_sample_p(ours: IntArray, theirs: IntArray) -> float:
    """p-value of a two-sample χ² test that two samplers' integer draws share a distribution
    (cells ``… −12``, each integer of −11 … 11, ``12 …``)."""
    edges = np.concatenate([[-1000], np.arange(-12, 13) + 0.5, [1000]])
    a, _ = np.histogram(ours, edges)
    b, _ = np.histogram(theirs, edges)
    _, p, _, _ = stats.chi2_contingency(np.stack([a, b]))
    return float(p)
