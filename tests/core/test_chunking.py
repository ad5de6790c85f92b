from __future__ import annotations

import numpy as np
import pytest

from gazeguard.core.chunking import Chunker


def test_chunk_is_features_by_steps_and_owned_by_caller() -> None:
    chunker = Chunker(n_features=2, n_steps=4)
    X = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0], [5.0, 50.0]])
    (chunk,) = chunker.add(X, np.arange(5.0))
    np.testing.assert_array_equal(chunk.values, [[1, 2, 3, 4], [10, 20, 30, 40]])
    assert chunker.pending_steps == 1
    # the next fill must not alter the chunk already handed out
    chunker.add(np.full((3, 2), -1.0), np.arange(5.0, 8.0))
    np.testing.assert_array_equal(chunk.values[0], [1, 2, 3, 4])


@pytest.mark.parametrize("n", [0, 1, 3, 48])
def test_non_power_of_two_is_refused(n: int) -> None:
    with pytest.raises(ValueError, match=f"power of two >= 2, got {n}"):
        Chunker(3, n)


def test_wrong_width_is_refused() -> None:
    with pytest.raises(ValueError, match=r"expected X of shape \(k, 3\)"):
        Chunker(3, 4).add(np.zeros((2, 2)), np.zeros(2))
