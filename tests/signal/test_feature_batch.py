"""``push_many`` (many sessions' pushes with one shared event-detector step) against each
session's own :meth:`FeatureExtractor.push` calls: bit-identical vectors, times and counters for
random recordings (blinks, dropouts, noise; long fixations, invalid runs and sweeps cut at the
grid; 30-500 Hz, so several velocity half-widths in one call), random block splits per session
and sessions that start, stall and end at different rounds; bad blocks give the error that push
raises, for that session only.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazeguard.core.errors import StreamError
from gazeguard.core.samples import GazeSamples
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal.events import EventDetector, EventKind
from gazeguard.signal.features import FeatureExtractor, push_many
from tests.signal.test_feature_properties import (
    SIZES,
    WINDOWS,
    Recorded,
    Windows,
    long_runs,
    pieces,
    recordings,
)

# Detector settings; without "rate_hz" the stream's declared rate (200 Hz: a 20 ms gap threshold).
DETECTORS = st.sampled_from([{}, {"rate_hz": 200.0}, {"velocity_threshold_deg_s": 80.0}])


def make(
    ws: Windows, rate: float, det_kw: dict[str, float], coalesce: bool = True
) -> FeatureExtractor:
    det = EventDetector(**{"rate_hz": rate, **det_kw})  # type: ignore[arg-type]
    return FeatureExtractor(ws[0], ws[1], hold_limit_s=ws[2], detector=det, coalesce=coalesce)


def assert_same(a: FeatureExtractor, b: FeatureExtractor) -> None:
    assert dataclasses.asdict(a.stats) == dataclasses.asdict(b.stats)
    assert dataclasses.asdict(a.detector.stats) == dataclasses.asdict(b.detector.stats)


@settings(max_examples=80, deadline=None)
@given(
    sessions=st.lists(
        st.tuples(recordings(), SIZES, DETECTORS, st.integers(0, 3)), min_size=1, max_size=5
    ),
    ws=WINDOWS,
    coalesce=st.booleans(),
)
def test_push_many_equals_each_session_pushed_on_its_own(
    sessions: list[tuple[Recorded, list[int], dict[str, float], int]],
    ws: Windows,
    coalesce: bool,
) -> None:
    # Session s starts at round `delay`.
    feeds = [[None] * delay + pieces(rec[0], sizes) for rec, sizes, _, delay in sessions]
    alone = [make(ws, rec[1], kw, coalesce) for rec, _, kw, _ in sessions]
    together = [make(ws, rec[1], kw, coalesce) for rec, _, kw, _ in sessions]
    for j in range(max(map(len, feeds))):
        due = [s for s, f in enumerate(feeds) if j < len(f) and f[j] is not None]
        got = push_many([(together[s], feeds[s][j]) for s in due])  # type: ignore[misc]
        for s, res in zip(due, got, strict=True):
            X, t = alone[s].push(feeds[s][j])  # type: ignore[arg-type]
            assert not isinstance(res, Exception)
            assert X.dtype == res[0].dtype
            assert X.shape == res[0].shape
            assert X.tobytes() == res[0].tobytes()
            assert t.tobytes() == res[1].tobytes()
    for a, b in zip(alone, together, strict=True):
        assert_same(a, b)


def test_push_many_at_the_deployed_window_and_a_bad_block() -> None:
    """60 s sessions at W = 30 s, 12- and 36-sample blocks at 120 Hz; one session's block goes
    back in time: its entry is the StreamError push raises, and every session carries on as
    with push."""
    gazes = [simulate_gaze(60.0, 120.0, seed) for seed in (1, 2, 3)]
    feeds = [pieces(g, [12, 12, 36]) for g in gazes]
    bad = feeds[1][200]
    feeds[1][200] = GazeSamples(bad.timestamps - 1.0, bad.x_deg, bad.y_deg, bad.pupil_mm, bad.valid)
    ws: Windows = (30.0, 0.5, None)
    alone = [make(ws, 120.0, {}) for _ in feeds]
    together = [make(ws, 120.0, {}) for _ in feeds]
    steps = 0
    for j in range(max(map(len, feeds))):
        due = [s for s in range(3) if j < len(feeds[s])]
        got = push_many([(together[s], feeds[s][j]) for s in due])
        for s, res in zip(due, got, strict=True):
            if (s, j) == (1, 200):
                with pytest.raises(StreamError) as refused:
                    alone[s].push(feeds[s][j])
                assert isinstance(res, StreamError)
                assert str(res) == str(refused.value)
                continue
            X, t = alone[s].push(feeds[s][j])
            assert not isinstance(res, Exception)
            np.testing.assert_array_equal(res[0], X)
            np.testing.assert_array_equal(res[1], t)
            steps += len(X)
    assert steps > 100
    for a, b in zip(alone, together, strict=True):
        assert_same(a, b)


@pytest.mark.parametrize("sizes", [[1], [7, 1, 50], [120]])
def test_push_many_cuts_long_runs_like_push(sizes: list[int]) -> None:
    """Sessions with long fixations, invalid runs and sweeps cut at the grid (samples on and
    off the grid points, at 120, 300 and 1000 Hz: several half-widths), pushed together in
    the batched path (clean contexts) and alone: the same vectors, times and counters."""
    recs = [(long_runs(rate, t0, i), rate) for i, (rate, t0) in enumerate(
        [(120.0, 100.0), (120.0, 100.0137), (120.0, 99.5), (300.0, 100.0), (1000.0, 100.0137)]
    )]  # fmt: skip
    feeds = [pieces(block, sizes) for block, _ in recs]
    ws: Windows = (2.0, 0.5, None)
    alone = [make(ws, rate, {}) for _, rate in recs]
    together = [make(ws, rate, {}) for _, rate in recs]
    for j in range(max(map(len, feeds))):
        due = [s for s in range(len(feeds)) if j < len(feeds[s])]
        got = push_many([(together[s], feeds[s][j]) for s in due])
        for s, res in zip(due, got, strict=True):
            X, t = alone[s].push(feeds[s][j])
            assert not isinstance(res, Exception)
            assert X.tobytes() == res[0].tobytes()
            assert t.tobytes() == res[1].tobytes()
    for a, b in zip(alone, together, strict=True):
        assert_same(a, b)
        assert a.detector.stats.events[EventKind.FIXATION] >= 6  # the long ones, cut


def test_push_many_refuses_an_extractor_twice() -> None:
    fx = FeatureExtractor(rate_hz=120.0)
    g = simulate_gaze(1.0, 120.0, 1)
    with pytest.raises(ValueError, match="once"):
        push_many([(fx, g.slice(0, 12)), (fx, g.slice(12, 24))])
