"""Chunking then unchunking is the identity on every full chunk, however the input is split."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gazeguard.core.chunking import Chunker


@given(
    n_features=st.integers(1, 6),
    log2_n=st.integers(1, 6),
    splits=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    first_index=st.integers(0, 1000),
)
def test_chunking_is_lossless_and_ordered(
    n_features: int, log2_n: int, splits: list[int], first_index: int
) -> None:
    n = 2**log2_n
    total = sum(splits)
    X = np.arange(total * n_features, dtype=np.float64).reshape(total, n_features)
    t = np.arange(total, dtype=np.float64) * 0.5
    chunker = Chunker(n_features, n, first_index=first_index)
    chunks = []
    start = 0
    for k in splits:
        chunks += chunker.add(X[start : start + k], t[start : start + k])
        start += k
    assert len(chunks) == total // n
    assert chunker.pending_steps == total % n
    assert [c.index for c in chunks] == list(range(first_index, first_index + len(chunks)))
    if chunks:
        rebuilt = np.concatenate([c.values.T for c in chunks])
        np.testing.assert_array_equal(rebuilt, X[: len(chunks) * n])
        np.testing.assert_array_equal(
            np.concatenate([c.timestamps for c in chunks]), t[: len(chunks) * n]
        )
