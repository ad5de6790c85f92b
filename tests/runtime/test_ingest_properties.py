"""Ingest normalization and the simulator, for any input and however it is cut into blocks."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gazeguard.runtime.presets import EyeChannels, Layout, Normalizer
from gazeguard.runtime.simulate import GazeGenerator, simulate_gaze

GG = Layout("gazeguard", 5, (EyeChannels(1, 2, 3),), "deg", y_up=True, validity=4, index=0)
BINOCULAR = Layout("b", 6, (EyeChannels(0, 1, 2), EyeChannels(3, 4, 5)), "deg", y_up=True)


def split(n: int, cuts: list[int]) -> list[slice]:
    edges = sorted({0, n, *(c % (n + 1) for c in cuts)})
    return [slice(a, b) for a, b in itertools.pairwise(edges)]


@given(
    steps=st.lists(st.sampled_from([-2, -1, 0, 0, 1, 1, 1, 3]), min_size=1, max_size=80),
    cuts=st.lists(st.integers(0, 80), max_size=6),
    with_index=st.booleans(),
)
def test_output_is_strictly_increasing_and_split_invariant(
    steps: list[int], cuts: list[int], with_index: bool
) -> None:
    """Timestamps and sample indices that repeat or go back are dropped, counted, and the same
    samples survive however the stream is cut."""
    n = len(steps)
    t = np.cumsum(steps).astype(float) * 0.01
    index = np.cumsum(np.array(steps[::-1])).astype(float)  # an independent order
    raw = np.column_stack([index, np.arange(n), np.zeros(n), np.full(n, 3.0), np.ones(n)])

    def run(parts: list[slice]) -> tuple[np.ndarray, Normalizer]:
        norm = Normalizer(GG if with_index else replace(GG, index=None))
        out = [norm(raw[p], t[p]) for p in parts]
        kept = [o.x_deg for o in out if o is not None]
        return (np.concatenate(kept) if kept else np.zeros(0)), norm

    whole, norm = run([slice(0, n)])
    pieces, norm2 = run(split(n, cuts))
    np.testing.assert_array_equal(whole, pieces)
    assert norm.stats == norm2.stats
    kept_t, kept_i = t[whole.astype(int)], index[whole.astype(int)]
    assert np.all(np.diff(kept_t) > 0)
    st_ = norm.stats
    assert st_.samples + st_.duplicates + st_.out_of_order == n
    if with_index:
        assert np.all(np.diff(kept_i) > 0)
        assert st_.lost == (int(kept_i[-1] - kept_i[0]) - len(kept_i) + 1 if len(kept_i) else 0)
    else:  # timestamps alone: exactly the samples that exceed every earlier timestamp
        expect = [k for k in range(n) if t[k] > max(t[:k], default=-np.inf)]
        np.testing.assert_array_equal(whole, expect)


finite_or_nan = st.one_of(st.floats(-120, 120), st.just(np.nan), st.floats(0, 12))


@given(raw=arrays(np.float64, st.tuples(st.integers(1, 30), st.just(6)), elements=finite_or_nan))
def test_invalid_is_nan_never_zero(raw: np.ndarray) -> None:
    norm = Normalizer(BINOCULAR)
    out = norm(raw, np.arange(raw.shape[0], dtype=float))
    assert out is not None
    assert np.isfinite(out.x_deg[out.valid]).all()
    assert np.isfinite(out.y_deg[out.valid]).all()
    assert np.isnan(out.x_deg[~out.valid]).all()
    assert np.isnan(out.pupil_mm[~out.valid]).all()
    assert (np.abs(out.x_deg[out.valid]) <= 90).all()
    pupil = out.pupil_mm[out.valid]
    assert ((pupil >= 0.5) & (pupil <= 10) | np.isnan(pupil)).all()
    # a sample is valid iff some eye has finite gaze and nothing in it is absurd or lost
    some_eye = (np.isfinite(raw[:, [0, 3]]) & np.isfinite(raw[:, [1, 4]])).any(axis=1)
    assert not out.valid[~some_eye].any()


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    rate=st.sampled_from([60.0, 120.0, 250.0, 1000.0]),
    task=st.sampled_from(["free", "reading", "search", "watching"]),
    cuts=st.lists(st.integers(0, 3000), max_size=5),
)
def test_simulator_is_chunk_invariant(seed: int, rate: float, task: str, cuts: list[int]) -> None:
    whole = simulate_gaze(3.0, rate, seed, task)
    gen = GazeGenerator(rate, seed, task)
    parts = [gen.take(p.stop - p.start) for p in split(len(whole), cuts)]
    for f in ("timestamps", "x_deg", "y_deg", "pupil_mm", "valid"):
        np.testing.assert_array_equal(
            np.concatenate([getattr(p, f) for p in parts]), getattr(whole, f)
        )
