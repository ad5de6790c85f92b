"""Evaluation metrics against values computed by hand on tiny examples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gazeguard.core.errors import ConfigError
from gazeguard.offline.eval.grid import MechanismSpec, parse_mechanism
from gazeguard.offline.eval.metrics import (
    accuracy,
    half_split,
    lopo_splits,
    majority_vote_accuracy,
    nmse,
    split_point,
    user_level_epsilon,
    utility,
)
from gazeguard.signal.dataset import subsample


def test_nmse_matches_paper_equation_by_hand() -> None:
    # x̄ = 2, ȳ = 8/3, MSE = 4/3  →  NMSE = (4/3) / (2 · 8/3) = 0.25, utility 4.
    assert nmse([1.0, 2.0, 3.0], [1.0, 2.0, 5.0]) == pytest.approx(0.25)
    assert utility(nmse([1.0, 2.0, 3.0], [1.0, 2.0, 5.0])) == pytest.approx(4.0)


def test_nmse_is_signed_vectorised_and_undefined_at_zero_mean() -> None:
    x = np.array([[1.0, 2.0, 3.0], [1.0, -1.0, 0.0], [2.0, 2.0, 2.0]])
    y = np.array([[1.0, 2.0, 5.0], [0.0, 0.0, 0.0], [-2.0, -2.0, -2.0]])
    out = nmse(x, y)
    assert out.shape == (3,)
    assert out[0] == pytest.approx(0.25)
    assert math.isnan(out[1])  # x̄ = 0: undefined, not a division error
    # x̄ = 2, ȳ = −2, MSE = 16 → NMSE = −4; utility uses |NMSE|.
    assert out[2] == pytest.approx(-4.0)
    assert utility(out)[2] == pytest.approx(0.25)
    assert utility([0.0])[0] == math.inf


def test_nmse_refuses_mismatched_shapes() -> None:
    with pytest.raises(
        ValueError, match=r"clean shape \(3,\) differs from privatized shape \(2,\)"
    ):
        nmse([1.0, 2.0, 3.0], [1.0, 2.0])


def test_accuracy_and_majority_vote_by_hand() -> None:
    truth = np.array(["A", "A", "A", "B", "B", "C", "C", "C"])
    pred = np.array(["A", "A", "B", "A", "B", "A", "A", "B"])
    rec = np.array(["r1", "r1", "r1", "r2", "r2", "r3", "r3", "r3"])
    assert accuracy(truth, pred) == pytest.approx(3 / 8)
    # r1: A wins → 1; r2: A/B tie including B → 1/2; r3: A wins, truth C → 0. Mean 1.5/3.
    assert majority_vote_accuracy(truth, pred, rec) == pytest.approx(0.5)


def test_majority_vote_refuses_a_group_with_two_truths() -> None:
    with pytest.raises(ValueError, match="group 'r1' has 2 different true labels"):
        majority_vote_accuracy(["A", "B"], ["A", "A"], ["r1", "r1"])


def test_lopo_splits_hold_out_each_person_once() -> None:
    folds = list(lopo_splits(["p1", "p2", "p1", "p3"]))
    assert [f[0] for f in folds] == ["p1", "p2", "p3"]
    _, train, test = folds[0]
    assert test.tolist() == [0, 2]
    assert train.tolist() == [1, 3]
    covered = np.sort(np.concatenate([f[2] for f in folds]))
    assert covered.tolist() == [0, 1, 2, 3]


def test_half_split_and_subsample_per_recording() -> None:
    rec = ["a", "a", "a", "b", "b", "b", "b"]
    train, test = half_split(rec)
    assert train.tolist() == [0, 3, 4]
    assert test.tolist() == [1, 2, 5, 6]
    assert subsample(np.arange(7), rec, 2).tolist() == [0, 2, 3, 5]
    assert subsample(test, rec, 2).tolist() == [1, 5]
    with pytest.raises(ValueError, match="every=0"):
        subsample(test, rec, 0)


def test_split_point_never_cuts_a_released_chunk() -> None:
    assert split_point(512, 32) == 256  # 16 chunks: 8 train, 8 test
    assert split_point(96, 32) == 64  # 3 chunks: the nearest chunk boundary to 48, rounded up
    assert split_point(540, 1) == 270
    assert split_point(540, 540) == 270  # a single chunk (FPA) cannot be cut between chunks
    train, test = half_split(["a"] * 96 + ["b"] * 64, block=32)
    assert train.tolist() == [*range(64), *range(96, 128)]
    assert test.tolist() == [*range(64, 96), *range(128, 160)]


def test_user_level_epsilon_composes_over_features_and_chunks() -> None:
    # 52 features × 16 chunks at ε = 0.48 each: 0.48 · 832.
    assert user_level_epsilon(0.48, 52, 16) == pytest.approx(399.36)
    assert user_level_epsilon(2.0, 10, 1) == pytest.approx(20.0)


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("none", MechanismSpec("none")),
        ("lpa", MechanismSpec("lpa", 32)),
        ("LPA-64", MechanismSpec("lpa", 64)),
        ("fpa", MechanismSpec("fpa", None, "dft")),
        ("fpa-dct", MechanismSpec("fpa", None, "dct")),
        ("cfpa-32", MechanismSpec("cfpa", 32, "dft")),
        ("dcfpa-128-dct", MechanismSpec("dcfpa", 128, "dct")),
    ],
)
def test_parse_mechanism(text: str, spec: MechanismSpec) -> None:
    assert parse_mechanism(text) == spec
    assert parse_mechanism(spec.key) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dcfpa", "dcfpa needs a chunk size"),
        ("cfpa-48", "chunk size 48 is not a power of two"),
        ("fpa-64", "FPA works on the whole recording"),
        ("lpa-32-dct", "LPA has no transform"),
        ("laplace", "expected none, lpa"),
    ],
)
def test_parse_mechanism_errors_name_the_text(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_mechanism(text)
    assert info.value.field == "mechanisms"
    assert info.value.value == text
