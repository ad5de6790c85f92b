"""The incremental extractor and detector against the frozen reference they replaced
(``tests/_reference_extraction.py``, main's per-step recomputation, amended for the declared rate
and the cut of long runs at the grid): bit-identical vectors, times, events and counters, and the
same timestamp errors; the streams include runs long enough to be cut.

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
from hypothesis import given, settings
from hypothesis import strategies as st

import tests._reference_extraction as _reference_extraction
from gazeguard.core.errors import ConfigError, StreamError
from gazeguard.core.samples import GazeSamples
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal import events
from gazeguard.signal.events import EventDetector, Events, check_timestamps
from gazeguard.signal.features import FeatureExtractor
from tests._reference_extraction import RefEventDetector, RefFeatureExtractor
from tests._reference_extraction import check_timestamps as ref_check_timestamps
from tests.signal.test_feature_properties import (
    SIZES,
    WINDOWS,
    Recorded,
    Windows,
    long_runs,
    pieces,
    recordings,
)

# Detector settings; without "rate_hz" the stream's declared rate. 120 Hz: another rate than
# the samples' (mostly); 200 Hz: a 20 ms gap threshold.
DETECTORS = st.sampled_from(
    [{}, {"rate_hz": 120.0}, {"rate_hz": 200.0}, {"velocity_threshold_deg_s": 80.0}]
)


def assert_same_run(
    block: GazeSamples,
    rate: float,
    ws: Windows,
    sizes: list[int],
    det_kw: dict[str, float],
    min_valid_fraction: float = 0.5,
    coalesce: bool = True,
) -> None:
    kw = {"hold_limit_s": ws[2], "min_valid_fraction": min_valid_fraction, "coalesce": coalesce}
    det_kw = {"rate_hz": rate, **det_kw}
    new = FeatureExtractor(ws[0], ws[1], detector=EventDetector(**det_kw), **kw)  # type: ignore[arg-type]
    ref = RefFeatureExtractor(ws[0], ws[1], detector=RefEventDetector(**det_kw), **kw)  # type: ignore[arg-type]
    # The same vectors in the same order; the package's may come sooner (what lies before a
    # gap in the samples is final at once: its detector is finished there and resumed), so
    # the counters are compared where both emitted as many.
    got: list[np.ndarray] = []
    want: list[np.ndarray] = []
    n_got = n_want = 0
    for p in pieces(block, sizes):
        Xn, tn = new.push(p)
        Xr, tr = ref.push(p)
        assert Xn.dtype == Xr.dtype
        got.append(np.column_stack([tn, Xn]))
        want.append(np.column_stack([tr, Xr]))
        n_got, n_want = n_got + len(tn), n_want + len(tr)
        assert n_got >= n_want
    if got:
        a, b = np.vstack(got), np.vstack(want)
        np.testing.assert_array_equal(a[: len(b)], b)
    if n_got == n_want:
        assert dataclasses.asdict(new.stats) == dataclasses.asdict(ref.stats)
    assert new.stats.late_samples == 0  # (no samples before the grid, no watermark here)
    assert new.detector.dt == ref.detector.dt
    assert (new.detector.h, new.detector.max_gap_s) == (ref.detector.h, ref.detector.max_gap_s)


@settings(max_examples=150, deadline=None)
@given(
    rec=recordings(),
    ws=WINDOWS,
    sizes=SIZES,
    det_kw=DETECTORS,
    mvf=st.sampled_from([0.0, 0.5, 0.9]),
    coalesce=st.booleans(),
)
@pytest.mark.slow
def test_vectors_equal_the_reference_bit_for_bit(
    rec: Recorded,
    ws: Windows,
    sizes: list[int],
    det_kw: dict[str, float],
    mvf: float,
    coalesce: bool,
) -> None:
    assert_same_run(*rec, ws, sizes, det_kw, mvf, coalesce)


def assert_same_events(block: GazeSamples, sizes: list[int], det_kw: dict[str, float]) -> None:
    """Per push and at finish, the package's detector and the reference's give the same events
    (bit for bit), classify as far, and count the same."""
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


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(rec=recordings(), sizes=SIZES, det_kw=DETECTORS)
def test_events_equal_the_reference_bit_for_bit(
    rec: Recorded, sizes: list[int], det_kw: dict[str, float]
) -> None:
    block, rate = rec
    assert_same_events(block, sizes, {"rate_hz": rate, **det_kw})


@pytest.mark.slow
@pytest.mark.parametrize("rate", [20.0, 30.0, 120.0, 300.0, 500.0, 1000.0])
@pytest.mark.parametrize("t0", [100.0, 100.0137, 99.5])
@pytest.mark.parametrize("sizes", [[1], [7, 1, 50], [100000]])
def test_long_runs_are_cut_like_the_reference(rate: float, t0: float, sizes: list[int]) -> None:
    """Runs cut at the grid (every sample on the grid points, none, and half a grid interval
    ahead), one sample per push, odd pushes and one push: the same events as the reference."""
    block = long_runs(rate, t0, int(rate))
    assert_same_events(block, sizes, {"rate_hz": rate})
    det = EventDetector(rate_hz=rate)
    ev = Events.concat([det.push(block), det.finish()])
    assert np.all(ev.duration < 2 * events.SPLIT_GRID_S)
    assert np.count_nonzero((ev.t_end % 1.0 == 0) & (ev.duration > 0.9)) >= 5  # cut: 5 or more


def test_the_reference_follows_the_rate_contract() -> None:
    """The reference's own rate handling (the amendment) agrees with the package's: the same
    grid, rate range, half-widths (computed exactly: 300 Hz x 5 ms = 1.5 -> 2) and gap
    threshold, and a ConfigError naming rate_hz for a missing or out-of-range rate."""
    assert _reference_extraction.SPLIT_GRID_S == events.SPLIT_GRID_S
    assert _reference_extraction._RATE_RANGE_HZ == events.RATE_RANGE_HZ
    for rate, h in ((20, 1), (300, 2), (500, 3), (1000, 5), (2000, 10)):
        new, ref = EventDetector(rate_hz=rate), RefEventDetector(rate_hz=rate)
        assert (new.h, new.dt, new.max_gap_s) == (ref.h, ref.dt, ref.max_gap_s) == (
            h, 1.0 / rate, 4.0 / rate,
        )  # fmt: skip
    for bad in (None, 0.0, 19.99, 2000.5, math.nan, math.inf):
        for make in (EventDetector, RefEventDetector):
            with pytest.raises(ConfigError, match="rate_hz") as exc:
                make(rate_hz=bad)  # type: ignore[arg-type, operator]
            assert exc.value.field == "rate_hz"


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
    assert_same_run(g, rate, (30.0, 0.5, None), [block], {})


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
    assert_same_run(g, 250.0, (window, step, None), [len(g)], {})
