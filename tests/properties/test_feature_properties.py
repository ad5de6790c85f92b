"""Properties of event detection and feature extraction on random recordings (Hypothesis).

- However the stream is cut into blocks, events and feature vectors are identical (recorded and
  live data give the same features).
- Events tile the recording; feature vectors are finite, within the public bounds, one per step
  from exactly one window after the first sample.
- ``valid_fraction`` never moves by more than its declared ``max_step`` (an exact bound).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gazeguard.events import EventDetector, EventKind, Events
from gazeguard.features import FEATURES, FeatureExtractor, feature_bounds
from gazeguard.samples import GazeSamples

SEGMENT = st.tuples(
    st.sampled_from(["fix", "fix", "fix", "sac", "blink", "gap", "noise"]),
    st.floats(0.005, 1.5),  # duration, s
    st.floats(-20, 20),  # target x, deg
    st.floats(-15, 15),  # target y, deg
)


@st.composite
def recordings(draw: st.DrawFn) -> GazeSamples:
    """Fixations, saccades, blinks (invalid samples), dropouts (no samples) and bursts of noise,
    at 30-500 Hz, with or without pupil, with or without timestamp jitter."""
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
    return GazeSamples.from_arrays(t, np.concatenate(xs), np.concatenate(ys), pupil)


def pieces(block: GazeSamples, sizes: list[int]) -> list[GazeSamples]:
    out, i, j = [], 0, 0
    while i < len(block):
        n = sizes[j % len(sizes)]
        out.append(block.slice(i, i + n))
        i += n
        j += 1
    return out


WINDOWS = st.sampled_from([(1.0, 0.25), (2.5, 0.5), (3.7, 0.5), (3.0, 1.0)])
SIZES = st.lists(st.integers(1, 300), min_size=1, max_size=20)


@settings(max_examples=60, deadline=None)
@given(block=recordings(), ws=WINDOWS, sizes=SIZES)
def test_features_do_not_depend_on_block_boundaries(
    block: GazeSamples, ws: tuple[float, float], sizes: list[int]
) -> None:
    whole = FeatureExtractor(*ws)
    X, t = whole.push(block)
    split = FeatureExtractor(*ws)
    parts = [split.push(p) for p in pieces(block, sizes)]
    np.testing.assert_array_equal(np.vstack([p[0] for p in parts]), X)
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), t)
    assert whole.stats == split.stats


@settings(max_examples=60, deadline=None)
@given(block=recordings(), ws=WINDOWS, sizes=SIZES)
def test_coalescing_never_delays_a_vector(
    block: GazeSamples, ws: tuple[float, float], sizes: list[int]
) -> None:
    """Holding blocks that cannot complete a step returns every vector from the same push."""
    held = FeatureExtractor(*ws)
    eager = FeatureExtractor(*ws, coalesce=False)
    for p in pieces(block, sizes):
        a, b = held.push(p), eager.push(p)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


@settings(max_examples=60, deadline=None)
@given(block=recordings(), sizes=SIZES)
def test_events_do_not_depend_on_block_boundaries_and_tile_the_stream(
    block: GazeSamples, sizes: list[int]
) -> None:
    det = EventDetector()
    whole = Events.concat([det.push(block), det.finish()])
    det2 = EventDetector()
    split = Events.concat([*(det2.push(p) for p in pieces(block, sizes)), det2.finish()])
    for name in Events.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(whole, name), getattr(split, name))
    if len(block) >= 17:  # the nominal rate needs 17 samples; finish() estimates it from fewer
        assert whole.start[0] == 0
    if len(whole):
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


@settings(max_examples=60, deadline=None)
@given(block=recordings(), ws=WINDOWS)
def test_vectors_are_finite_bounded_and_on_the_step_grid(
    block: GazeSamples, ws: tuple[float, float]
) -> None:
    window, step = ws
    fx = FeatureExtractor(window, step)
    X, t = fx.push(block)
    lo, hi, max_step = feature_bounds(None, window, step)
    assert X.shape == (len(t), len(FEATURES))
    assert np.all(np.isfinite(X))
    assert np.all(lo <= X)
    assert np.all(hi >= X)
    if len(t):
        t0 = float(block.timestamps[0])
        np.testing.assert_allclose(t, t0 + window + step * np.arange(len(t)), atol=1e-9)
        assert t[-1] <= block.timestamps[-1]
        assert fx.stats.steps == len(t)
        # valid_fraction: an exact bound (at most s/dt + 1 samples enter or leave per step).
        i = [f.name for f in FEATURES].index("valid_fraction")
        assert np.all(np.abs(np.diff(X[:, i])) <= max_step[i] * (1 + 1e-9))
