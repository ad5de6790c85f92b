"""Properties of the dataset release mechanisms over generated tables."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gazeguard.core.errors import ConfigError
from gazeguard.offline.release import RELEASE_MECHANISMS
from gazeguard.offline.release._common import ReleaseRandom, padded, task_sequences
from gazeguard.offline.release.marginals import TaskModel
from gazeguard.signal.dataset import FeatureTable

FAST = settings(max_examples=40, deadline=None)


@st.composite
def tables(draw: st.DrawFn) -> FeatureTable:
    """1–2 tasks, 2–7 people each, sequences of 1–6 steps, 1–3 features."""
    n_features = draw(st.integers(1, 3))
    X, person, task, rec = [], [], [], []
    for t in range(draw(st.integers(1, 2))):
        for p in range(draw(st.integers(2, 7))):
            n = draw(st.integers(1, 6))
            X.append(draw(arrays(np.float64, (n, n_features), elements=st.floats(-1e3, 1e3))))
            person += [f"p{p}"] * n
            task += [f"t{t}"] * n
            rec += [f"p{p}t{t}"] * n
    values = np.concatenate(X)
    return FeatureTable(
        values,
        np.arange(values.shape[0], dtype=np.float64),
        np.array(person),
        np.array(task),
        np.array(rec),
        tuple(f"f{j}" for j in range(n_features)),
    )


@FAST
@given(tables(), st.integers(2, 4), st.sampled_from(["drop", "merge"]), st.integers(0, 2**32))
def test_ksame_vectors_are_means_of_k_people(
    table: FeatureTable, k: int, leftover: str, seed: int
) -> None:
    seqs = task_sequences(table)
    if any(len(people) < k for people in seqs.values()):
        with pytest.raises(ConfigError) as info:
            RELEASE_MECHANISMS["ksame"](table, {"k": k, "leftover": leftover}, seed=seed)
        assert info.value.field == "k"
        return
    rel = RELEASE_MECHANISMS["ksame"](table, {"k": k, "leftover": leftover}, seed=seed)
    for task, info in rel.manifest["details"]["tasks"].items():
        people = seqs[task]
        n = len(people)
        groups = list(rel.private["tasks"][task]["groups"].values())  # real ids: not released
        sizes = sorted(len(g) for g in groups)
        assert sum(sizes) == (n - n % k if leftover == "drop" else n)
        assert all(k <= s <= (k if leftover == "drop" else 2 * k - 1) for s in sizes)
        t_max = info["t_max"]
        out_seqs = task_sequences(rel.oracle_table())[task]
        for group in groups:
            mean = np.mean([table.X[padded(people[p], t_max)] for p in group], axis=0)
            for p in group:
                np.testing.assert_allclose(rel.table.X[out_seqs[p]], mean, rtol=1e-12, atol=1e-9)


@st.composite
def binned(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    """2–8 records of 2–5 features in 3 bins, and omega in 1..F."""
    f = draw(st.integers(2, 5))
    n = draw(st.integers(2, 8))
    bins = draw(arrays(np.int32, (n, f), elements=st.integers(0, 2)))
    return bins, draw(st.integers(1, f))


@FAST
@given(binned(), st.integers(0, 2**32))
def test_candidate_probabilities_match_enumeration(
    model_args: tuple[np.ndarray, int], seed: int
) -> None:
    bins, omega = model_args
    model = TaskModel.fit(bins, 3, omega)
    n, f = bins.shape
    Y = model.candidates(np.arange(n, dtype=np.intp), ReleaseRandom(seed))
    c = np.repeat(np.arange(n, dtype=np.intp), n)
    d = np.tile(np.arange(n, dtype=np.intp), n)
    got = np.exp(model.log_prob_pairs(Y, c, d))
    for ci, di, g in zip(c, d, got, strict=True):
        want = sum(
            math.prod(model.probs[j, Y[ci, j]] for j in S)
            for S in itertools.combinations(range(f), omega)
            if all(Y[ci, j] == bins[di, j] for j in range(f) if j not in S)
        ) / math.comb(f, omega)
        assert math.isclose(g, want, rel_tol=1e-9, abs_tol=1e-300)


@FAST
@given(tables(), st.floats(0.01, 100.0), st.integers(0, 2**32))
def test_expdp_keeps_every_row_and_label(table: FeatureTable, epsilon: float, seed: int) -> None:
    rel = RELEASE_MECHANISMS["expdp"](table, {"epsilon": epsilon, "range": "data"}, seed=seed)
    assert rel.table.X.shape == table.X.shape
    assert np.all(np.isfinite(rel.table.X))
    for name in ("t", "person", "task", "recording"):
        np.testing.assert_array_equal(getattr(rel.table, name), getattr(table, name))


@FAST
@given(st.one_of(st.floats(max_value=1.0), st.just(float("nan")), st.just(float("inf"))))
def test_gamma_at_most_one_or_not_finite_is_refused(gamma: float) -> None:
    X = np.zeros((4, 1))
    labels = np.array(["a", "a", "b", "b"])
    table = FeatureTable(X, np.arange(4.0), labels, labels, labels, ("f",))
    with pytest.raises(ConfigError) as info:
        RELEASE_MECHANISMS["marginals"](table, {"gamma": gamma, "range": "data"})
    assert info.value.field == "gamma"
