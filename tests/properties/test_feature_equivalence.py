"""The incremental extractor and detector against the frozen reference they replaced
(``tests/_reference_extraction.py``, main's per-step recomputation): bit-identical vectors,
times, events and counters, and the same timestamp errors.

Exactness argument (why ``assert_array_equal`` and not a tolerance): counts, ratios, rates and the
wordbook statistics are integer arithmetic followed by the same single division; means and
variances are the same numpy pairwise sums over the same values in the same order (a window's
events of one kind are a contiguous row of a ring, reduced along its contiguous axis, which numpy
sums exactly like the reference's 1-D column); maxima, minima and the pupil's integer bin sums are
order-independent; saccade directions use numpy's arctan2 like the reference (libm's atan2 differs
from numpy's SIMD one in the last bit on AVX-512 machines, which can move a direction across a
sector edge).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from _reference_extraction import RefEventDetector, RefFeatureExtractor
from _reference_extraction import check_timestamps as ref_check_timestamps
from hypothesis import given, settings
from hypothesis import strategies as st
from test_feature_properties import SIZES, WINDOWS, Windows, pieces, recordings

from gazeguard.errors import StreamError
from gazeguard.events import EventDetector, Events, check_timestamps
from gazeguard.features import FeatureExtractor
from gazeguard.samples import GazeSamples
from gazeguard.simulate import simulate_gaze

DETECTORS = st.sampled_from(
    [{}, {"sampling_rate_hz": 120.0}, {"max_gap_s": 0.02}, {"velocity_threshold_deg_s": 80.0}]
)


def assert_same_run(
    block: GazeSamples,
    ws: Windows,
    sizes: list[int],
    det_kw: dict[str, float],
    min_valid_fraction: float = 0.5,
    coalesce: bool = True,
) -> None:
    kw = {"hold_limit_s": ws[2], "min_valid_fraction": min_valid_fraction, "coalesce": coalesce}
    new = FeatureExtractor(ws[0], ws[1], detector=EventDetector(**det_kw), **kw)  # type: ignore[arg-type]
    ref = RefFeatureExtractor(ws[0], ws[1], detector=RefEventDetector(**det_kw), **kw)  # type: ignore[arg-type]
    for p in pieces(block, sizes):
        Xn, tn = new.push(p)
        Xr, tr = ref.push(p)
        np.testing.assert_array_equal(Xn, Xr)
        np.testing.assert_array_equal(tn, tr)
        assert Xn.dtype == Xr.dtype
    assert dataclasses.asdict(new.stats) == dataclasses.asdict(ref.stats)
    assert dataclasses.asdict(new.detector.stats) == dataclasses.asdict(ref.detector.stats)
    assert new.detector.dt == ref.detector.dt


@settings(max_examples=150, deadline=None)
@given(
    block=recordings(),
    ws=WINDOWS,
    sizes=SIZES,
    det_kw=DETECTORS,
    mvf=st.sampled_from([0.0, 0.5, 0.9]),
    coalesce=st.booleans(),
)
def test_vectors_equal_the_reference_bit_for_bit(
    block: GazeSamples,
    ws: Windows,
    sizes: list[int],
    det_kw: dict[str, float],
    mvf: float,
    coalesce: bool,
) -> None:
    assert_same_run(block, ws, sizes, det_kw, mvf, coalesce)


@settings(max_examples=100, deadline=None)
@given(block=recordings(), sizes=SIZES, det_kw=DETECTORS)
def test_events_equal_the_reference_bit_for_bit(
    block: GazeSamples, sizes: list[int], det_kw: dict[str, float]
) -> None:
    new, ref = EventDetector(**det_kw), RefEventDetector(**det_kw)  # type: ignore[arg-type]
    for p in pieces(block, sizes):
        a, b = new.push(p), ref.push(p)
        for name in Events.__dataclass_fields__:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
            assert getattr(a, name).dtype == getattr(b, name).dtype
        assert new.last_classified_t == ref.last_classified_t
    a, b = new.finish(), ref.finish()
    for name in Events.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert dataclasses.asdict(new.stats) == dataclasses.asdict(ref.stats)


@pytest.mark.parametrize(
    ("seed", "task", "rate", "block"),
    [(1, "free", 120.0, 12), (2, "reading", 120.0, 12), (3, "search", 250.0, 25),
     (4, "watching", 60.0, 7), (5, "free", 120.0, 1000)],
)  # fmt: skip
def test_simulated_sessions_equal_the_reference_at_the_default_window(
    seed: int, task: str, rate: float, block: int
) -> None:
    """The deployed configuration (W = 30 s, s = 0.5 s) on 100 s of simulated people."""
    g = simulate_gaze(100.0, rate, seed, task)
    assert_same_run(g, (30.0, 0.5, None), [block], {})


TIMES = st.lists(
    st.one_of(
        st.floats(-5, 5),
        st.sampled_from([0.0, 1.0, math.nan, math.inf, -math.inf]),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=500, deadline=None)
@given(
    times=TIMES,
    after=st.one_of(st.none(), st.floats(-5, 5)),
    increasing=st.booleans(),
)
def test_check_timestamps_refuses_exactly_what_the_reference_refuses(
    times: list[float], after: float | None, increasing: bool
) -> None:
    t = np.array(sorted(times) if increasing else times)
    errors = []
    for check in (check_timestamps, ref_check_timestamps):
        try:
            check(t, after)
            errors.append(None)
        except StreamError as e:
            errors.append(str(e))
    assert errors[0] == errors[1]


@pytest.mark.parametrize(("window", "step"), [(30.0, 0.5), (7.3, 0.5), (10.0, 0.1)])
def test_a_whole_recording_in_one_push_equals_the_reference(window: float, step: float) -> None:
    """Offline extraction (one block, walked in pieces of several step intervals) with and
    without a sub-interval window edge (r = 0.3 s for W = 7.3 s)."""
    g = simulate_gaze(120.0, 250.0, 7, "reading")
    assert_same_run(g, (window, step, None), [len(g)], {})
