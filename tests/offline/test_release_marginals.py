"""Task-based Marginals with the (k, γ) plausible-deniability test."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from gazeguard.core.errors import ConfigError
from gazeguard.offline.release import RELEASE_MECHANISMS
from gazeguard.offline.release._common import ReleaseRandom
from gazeguard.offline.release.marginals import TaskModel, pd_test, to_bins
from gazeguard.signal.dataset import FeatureTable


def brute_force_prob(model: TaskModel, y: np.ndarray, seed: int) -> float:
    """Pr{y = M(d)} by enumerating every set S of omega re-drawn features."""
    f, omega = model.n_features, model.omega
    d = model.bins[seed]
    total = 0.0
    for S in itertools.combinations(range(f), omega):
        kept = [j for j in range(f) if j not in S]
        if any(y[j] != d[j] for j in kept):
            continue
        total += math.prod(model.probs[j, y[j]] for j in S)
    return total / math.comb(f, omega)


@pytest.mark.parametrize("omega", [1, 2, 3, 4, 5])
def test_candidate_probability_matches_enumeration(omega: int) -> None:
    rng = np.random.default_rng(omega)
    bins = rng.integers(0, 3, size=(12, 5)).astype(np.int32)
    model = TaskModel.fit(bins, 3, omega)
    Y = model.candidates(np.arange(12, dtype=np.intp), ReleaseRandom(omega))
    ci, ni = (a.ravel().astype(np.intp) for a in np.meshgrid(np.arange(12), np.arange(12)))
    got = np.exp(model.log_prob_pairs(Y, ci, ni))
    want = [brute_force_prob(model, Y[c], int(n)) for c, n in zip(ci, ni, strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-300)
    own = np.exp(
        model.log_prob_pairs(Y, np.arange(12, dtype=np.intp), np.arange(12, dtype=np.intp))
    )
    assert np.all(own > 0)  # a candidate can always come from its own seed


def _crowd_and_loner() -> TaskModel:
    """Five identical records (bins 0,0,0,0) and one loner (bins 2,2,2,2); omega = 1."""
    bins = np.array([[0, 0, 0, 0]] * 5 + [[2, 2, 2, 2]], dtype=np.int32)
    return TaskModel.fit(bins, 3, 1)


def test_pd_test_rejects_a_candidate_fewer_than_k_inputs_could_have_produced() -> None:
    model = _crowd_and_loner()
    y = np.array([0, 2, 2, 2], dtype=np.int32)  # the loner with feature 0 re-drawn
    # Only the loner itself could produce y (the crowd differs in 3 features, omega = 1).
    assert model.plausible_seeds(y[None], np.array([5]), 2.0)[0] == 1
    assert not pd_test(model, y, seed=5, k=2, gamma=2.0)
    assert pd_test(model, y, seed=5, k=1, gamma=2.0)


def test_pd_test_passes_a_candidate_k_inputs_produce_equally_likely() -> None:
    model = _crowd_and_loner()
    y = np.array([0, 0, 0, 0], dtype=np.int32)
    assert model.plausible_seeds(y[None], np.array([0]), 2.0)[0] == 5
    assert pd_test(model, y, seed=0, k=5, gamma=2.0)
    assert not pd_test(model, y, seed=0, k=6, gamma=2.0)


def test_gamma_decides_how_different_plausible_probabilities_may_be() -> None:
    # Seeds A = (0,0,0) ×4 and B = (0,0,1) ×4; candidate y = (0,0,0) made from A.
    bins = np.array([[0, 0, 0]] * 4 + [[0, 0, 1]] * 4, dtype=np.int32)
    model = TaskModel.fit(bins, 2, 1)
    y = np.array([0, 0, 0], dtype=np.int32)
    p_a = brute_force_prob(model, y, 0)
    p_b = brute_force_prob(model, y, 4)
    assert p_a / p_b == pytest.approx(5.0)  # (1 + 1 + 0.5)/3 vs 0.5/3
    assert model.plausible_seeds(y[None], np.array([0]), 1e6)[0] == 8  # all within γ
    assert model.plausible_seeds(y[None], np.array([0]), 1.5)[0] == 4  # B is 5× less likely


def test_release_is_stratified_synthetic_and_inside_occupied_bins() -> None:
    rng = np.random.default_rng(3)
    n = 60
    X = np.column_stack([rng.uniform(0, 10, n), rng.integers(0, 3, n).astype(float)])
    task = np.array(["a"] * 30 + ["b"] * 30)
    person = np.array([f"p{i % 5}" for i in range(n)])
    table = FeatureTable(X, np.arange(n) * 0.5, person, task, person, ("u", "c"))
    bounds = {"u": (0.0, 10.0), "c": (0.0, 3.0)}
    rel = RELEASE_MECHANISMS["marginals"](table, {"k": 3, "bins": 10, "bounds": bounds})
    out = rel.table
    assert out.n_rows == n  # omega = F: every record is an equally likely seed
    np.testing.assert_array_equal(out.person, person)
    np.testing.assert_array_equal(out.task, task)
    assert not np.array_equal(out.X, X)
    lo, hi = np.array([0.0, 0.0]), np.array([10.0, 3.0])
    for t in ("a", "b"):
        occupied = to_bins(X[task == t], lo, hi, 10)
        released = to_bins(out.X[out.task == t], lo, hi, 10)
        for j in range(2):
            assert set(released[:, j]) <= set(occupied[:, j])
    assert np.all((lo <= out.X) & (hi >= out.X))
    numbers = rel.manifest["guarantee"]["numbers"]
    assert numbers["k"] == 3
    assert numbers["gamma"] == 2.0
    assert rel.manifest["parameters"]["omega"] == 2
    assert rel.manifest["parameters"]["bins"] == 10


def test_rows_whose_candidates_all_fail_are_not_released() -> None:
    # Every record unique in every feature; with omega = 1 nobody else can produce a candidate.
    X = np.arange(24, dtype=float).reshape(8, 3) * np.array([1.0, 2.0, 3.0])
    labels = np.array(["p"] * 8)
    table = FeatureTable(X, np.arange(8.0), labels, labels, labels, ("a", "b", "c"))
    rel = RELEASE_MECHANISMS["marginals"](
        table, {"k": 2, "omega": 1, "bins": 30, "range": "data", "max_attempts": 3}, seed=1
    )
    assert rel.table.n_rows == 0
    assert rel.manifest["guarantee"]["numbers"]["rows_dropped"] == 8
    assert rel.manifest["guarantee"]["numbers"]["candidates_tested"] == 24
    assert "range" in rel.manifest["parameters"]


def _table() -> FeatureTable:
    X = np.linspace(0, 1, 20).reshape(10, 2)
    labels = np.array(["p"] * 5 + ["q"] * 5)
    return FeatureTable(X, np.arange(10.0), labels, labels, labels, ("a", "b"))


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"gamma": 1.0}, "gamma", "greater than 1"),
        ({"gamma": 0.5}, "gamma", "greater than 1"),
        ({"gamma": float("nan")}, "gamma", "finite"),
        ({"k": 6}, "k", "task 'p' has only 5 records"),
        ({"omega": 3}, "omega", "more features than the table has"),
        ({"bins": 1}, "bins", "at least 2"),
        ({"range": "public", "bounds": {"a": (0, 1)}}, "bounds", "no entry for features"),
        ({"range": "public", "bounds": {"a": (1, 0), "b": (0, 1)}}, "bounds", "lo must be below"),
        ({"epsilon": 1.0}, "epsilon", "not a parameter of marginals"),
    ],
)
def test_bad_parameters_name_the_parameter(
    params: dict[str, object], field: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        RELEASE_MECHANISMS["marginals"](_table(), {"range": "data", **params})
    assert info.value.field == field
