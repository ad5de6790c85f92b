"""Properties of event detection and feature extraction on random recordings (Hypothesis).

- However the stream is cut into blocks, events and feature vectors are identical (recorded and
  live data give the same features).
- Events tile the recording; feature vectors are finite, within the public bounds, one per step
  from exactly one window after the first sample.
- ``valid_fraction`` never moves by more than its declared ``max_step`` (an exact bound).
- No event lasts two grid intervals (``events.SPLIT_GRID_S``): long runs are cut at the grid.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazeguard.core.samples import GazeSamples
from gazeguard.signal.events import SPLIT_GRID_S, EventDetector, EventKind, Events
from gazeguard.signal.features import FEATURES, FeatureExtractor, extract_features, feature_bounds

SEGMENT = st.tuples(
    st.sampled_from(["fix", "fix", "fix", "sac", "blink", "gap", "noise", "sweep"]),
    # duration, s; one in four longer than the grid interval, so that runs cross grid points
    # long after they start and are cut there (long fixations, invalid runs, sweeps)
    st.floats(0.005, 1.5) | st.floats(0.005, 1.5) | st.floats(0.005, 1.5) | st.floats(1.5, 4.5),
    st.floats(-20, 20),  # target x, deg (sweep: speed along x, 4 deg/s per unit: fast if > 7.5)
    st.floats(-15, 15),  # target y, deg
)

#: A generated recording and its declared (nominal) sampling rate, Hz.
Recorded = tuple[GazeSamples, float]


@st.composite
def recordings(draw: st.DrawFn) -> Recorded:
    """Fixations, saccades, sweeps (smooth motion, slow or fast), blinks (invalid samples),
    dropouts (no samples) and bursts of noise, at 30-500 Hz, with or without pupil, with or
    without timestamp jitter; with the rate the stream declares."""
    rate = draw(st.sampled_from([30.0, 60.0, 120.0, 250.0, 500.0]))
    segments = [("fix", 0.1, 0.0, 0.0), *draw(st.lists(SEGMENT, min_size=3, max_size=30))]
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    jitter = draw(st.sampled_from([0.0, 0.2]))  # fraction of a sample interval
    ts, xs, ys = [], [], []
    k, px, py = 0, 0.0, 0.0
    for kind, dur, x, y in segments:  # loop over segments (events), not samples
        n = max(1, round(dur * rate))
        if kind == "gap":
            k += n
            px, py = x, y
            continue
        if kind == "sac":
            f = np.arange(1, n + 1) / n
            xx, yy = px + (x - px) * f, py + (y - py) * f
            px, py = x, y
        elif kind == "sweep":
            xx, yy = px + 4.0 * x * np.arange(1, n + 1) / rate, np.full(n, py)
            px = float(xx[-1])
        elif kind == "noise":
            xx, yy = px + rng.normal(0, 2, n), py + rng.normal(0, 2, n)
        elif kind == "blink":
            xx, yy = np.full(n, np.nan), np.full(n, np.nan)
        else:
            xx, yy = np.full(n, x) + rng.normal(0, 0.02, n), np.full(n, y)
            px, py = x, y
        ts.append((k + np.arange(n) + jitter * rng.uniform(0, 1, n)) / rate)
        xs.append(xx)
        ys.append(yy)
        k += n
    t = np.concatenate(ts) + 100.0
    pupil = None if draw(st.booleans()) else rng.uniform(2.0, 8.0, len(t))
    return GazeSamples.from_arrays(t, np.concatenate(xs), np.concatenate(ys), pupil), rate


def long_runs(rate: float, t0: float, seed: int) -> GazeSamples:
    """Runs longer than the grid interval on and off the grid: a 3.2 s fixation, a 2.2 s
    invalid run, a 1.9 s fixation, a 2.4 s sweep at 45 deg/s and a 2.2 s fixation with a
    dropout in it, from ``t0`` on (samples k/rate apart: on the grid points for a whole t0)."""
    rng = np.random.default_rng(seed)
    n = [round(d * rate) for d in (3.2, 2.2, 1.9, 2.4, 2.2)]
    x = np.concatenate(
        [
            np.zeros(n[0]),
            np.full(n[1], np.nan),
            np.full(n[2], 3.0),
            3.0 + 45.0 * np.arange(1, n[3] + 1) / rate,
            np.full(n[4], 1.0),
        ]
    )
    x += rng.normal(0, 0.01, len(x))
    k = np.arange(len(x), dtype=np.float64)
    k[len(x) - n[4] // 2 :] += 0.02 * rate + 4  # a gap (4 intervals + 20 ms) in the last one
    return GazeSamples.from_arrays(t0 + k / rate, x, rng.normal(0, 0.01, len(x)))


def pieces(block: GazeSamples, sizes: list[int]) -> list[GazeSamples]:
    out, i, j = [], 0, 0
    while i < len(block):
        n = sizes[j % len(sizes)]
        out.append(block.slice(i, i + n))
        i += n
        j += 1
    return out


# (window W, step s, hold limit): None holds for W; 0 releases the default at once.
WINDOWS = st.sampled_from(
    [(1.0, 0.25, None), (2.5, 0.5, 0.0), (3.7, 0.5, 1.0), (3.0, 1.0, None), (2.0, 0.5, 0.75)]
)
Windows = tuple[float, float, float | None]


def extractor(ws: Windows, rate: float, **kw: bool) -> FeatureExtractor:
    return FeatureExtractor(ws[0], ws[1], hold_limit_s=ws[2], rate_hz=rate, **kw)


SIZES = st.lists(st.integers(1, 300), min_size=1, max_size=20)


@settings(max_examples=60, deadline=None)
@given(rec=recordings(), ws=WINDOWS, sizes=SIZES)
def test_features_do_not_depend_on_block_boundaries(
    rec: Recorded, ws: Windows, sizes: list[int]
) -> None:
    block, rate = rec
    whole = extractor(ws, rate)
    X, t = whole.push(block)
    split = extractor(ws, rate)
    parts = [split.push(p) for p in pieces(block, sizes)]
    np.testing.assert_array_equal(np.vstack([p[0] for p in parts]), X)
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), t)
    assert whole.stats == split.stats


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(rec=recordings(), ws=WINDOWS, sizes=SIZES)
def test_coalescing_never_delays_a_vector(rec: Recorded, ws: Windows, sizes: list[int]) -> None:
    """Holding blocks that cannot complete a step returns every vector from the same push."""
    block, rate = rec
    held = extractor(ws, rate)
    eager = extractor(ws, rate, coalesce=False)
    for p in pieces(block, sizes):
        a, b = held.push(p), eager.push(p)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


@settings(max_examples=60, deadline=None)
@given(rec=recordings(), sizes=SIZES)
def test_events_do_not_depend_on_block_boundaries_and_tile_the_stream(
    rec: Recorded, sizes: list[int]
) -> None:
    block, rate = rec
    det = EventDetector(rate_hz=rate)
    whole = Events.concat([det.push(block), det.finish()])
    det2 = EventDetector(rate_hz=rate)
    split = Events.concat([*(det2.push(p) for p in pieces(block, sizes)), det2.finish()])
    for name in Events.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(whole, name), getattr(split, name))
    # The rate is declared (nothing to estimate first): every sample is in an event.
    assert len(whole) > 0
    assert whole.start[0] == 0
    assert whole.stop[-1] == len(block)
    np.testing.assert_array_equal(whole.start[1:], whole.stop[:-1])
    assert np.all(whole.stop > whole.start)
    assert np.all(whole.duration > 0)
    sac = whole.kind == EventKind.SACCADE
    assert np.all(np.isfinite(whole.amplitude[sac]))
    assert np.all(whole.peak_velocity[sac] >= det.velocity_threshold_deg_s)
    other = (whole.kind != EventKind.SACCADE) & (whole.kind != EventKind.FIXATION)
    assert np.all(np.isnan(whole.amplitude[other]))
    blink = whole.kind == EventKind.BLINK
    assert np.all((whole.duration[blink] >= 0.05) & (whole.duration[blink] <= 0.5))
    # Bounded events: none lasts two grid intervals. An event that ends before the next one
    # starts ends at a gap (last sample + dt) or was cut at a grid point between its last
    # sample and the next one.
    assert np.all(whole.duration < 2 * SPLIT_GRID_S)
    t, nxt, t_end = block.timestamps, whole.stop[:-1], whole.t_end[:-1]
    apart = t_end != whole.t_start[1:]
    gap = t[nxt] - t[nxt - 1] > det.max_gap_s
    cut = (t_end % SPLIT_GRID_S == 0) & (t[nxt - 1] < t_end) & (t_end <= t[nxt])
    assert np.all(~apart | gap | cut)
    assert np.all(t_end <= t[nxt])


@settings(max_examples=60, deadline=None)
@given(rec=recordings(), ws=WINDOWS)
def test_vectors_are_finite_bounded_and_on_the_step_grid(rec: Recorded, ws: Windows) -> None:
    block, rate = rec
    window, step, _ = ws
    fx = extractor(ws, rate)
    X, t = fx.push(block)
    lo, hi, max_step = feature_bounds(None, window, step)
    assert X.shape == (len(t), len(FEATURES))
    assert np.all(np.isfinite(X))
    assert np.all(lo <= X)
    assert np.all(hi >= X)
    if len(t):
        t0 = math.floor(float(block.timestamps[0]) / step) * step  # the grid: multiples of s
        np.testing.assert_allclose(t, t0 + window + step * np.arange(len(t)), atol=1e-9)
        assert t[-1] <= block.timestamps[-1]
        assert fx.stats.steps == len(t)
        # valid_fraction = valid samples × dt / W with dt the detector's declared interval: at
        # most s/dt_min + 1 samples enter or leave per step, so this bound is exact for the
        # computation. The declared public max_step, (s + 1/30 s)/W, assumes samples s·rate
        # apart at most (regular sampling at the declared rate); jittered timestamps can bring
        # more into a step, and DCFPA then clips that step (utility, never privacy: the bounds,
        # not the data, set the noise).
        i = [f.name for f in FEATURES].index("valid_fraction")
        dt_hat = fx.detector.dt
        assert dt_hat == 1.0 / rate
        dt_min = float(np.min(np.diff(block.timestamps)))
        exact = (step / dt_min + 1) * dt_hat / window
        assert np.all(np.abs(np.diff(X[:, i])) <= exact * (1 + 1e-9))
        regular = np.allclose(np.diff(block.timestamps), np.diff(block.timestamps)[0], rtol=1e-9)
        if regular:  # the declared bound holds for regular sampling at 30 Hz or faster
            assert np.all(np.abs(np.diff(X[:, i])) <= max_step[i] * (1 + 1e-9))


@settings(max_examples=60, deadline=None)
@given(rec=recordings(), ws=WINDOWS, sizes=SIZES)
def test_offline_extract_features_equals_the_live_extractor(
    rec: Recorded, ws: Windows, sizes: list[int]
) -> None:
    """extract_features (offline, one block) and FeatureExtractor.push (live, any blocks) give
    bit-identical vectors, hold limit included."""
    block, rate = rec
    X, t = extract_features(
        block.timestamps, block.x_deg, block.y_deg, block.pupil_mm, ws[0], ws[1],
        hold_limit_s=ws[2], rate_hz=rate,
    )  # fmt: skip
    live = extractor(ws, rate)
    parts = [live.push(p) for p in pieces(block, sizes)]
    np.testing.assert_array_equal(np.vstack([X[:0], *(p[0] for p in parts)]), X)
    np.testing.assert_array_equal(np.concatenate([t[:0], *(p[1] for p in parts)]), t)


@settings(max_examples=60, deadline=None)
@given(rec=recordings(), ws=WINDOWS)
def test_the_hold_limit_only_replaces_long_repeats_by_the_default(
    rec: Recorded, ws: Windows
) -> None:
    """Against unbounded holding (the old rule): a vector value differs only where the unbounded
    version had repeated it for more than the hold limit, and there it is the public default."""
    block, rate = rec
    window, step, hold = ws
    limited = extractor(ws, rate)
    Xh, _ = limited.push(block)
    Xu, _ = FeatureExtractor(window, step, hold_limit_s=1e9, rate_hz=rate).push(block)
    limit = math.floor((window if hold is None else hold) / step + 1e-9)
    run = np.zeros(len(FEATURES), dtype=np.int64)
    for k in range(len(Xu)):
        if k:
            run = np.where(Xu[k] == Xu[k - 1], run + 1, 0)
        differs = Xh[k] != Xu[k]
        assert np.all(run[differs] > limit)
        assert np.all(Xh[k][differs] == limited.default[differs])
