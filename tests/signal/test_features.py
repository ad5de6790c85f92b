"""Sliding-window features: the registry, timing, hand-computable values on regular scanpaths,
brute-force window recomputation, the always-finite rules, clipping and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gazeguard.core.errors import ConfigError, StreamError
from gazeguard.core.samples import FloatArray, GazeSamples
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal.events import EventDetector, EventKind, detect_events
from gazeguard.signal.features import (
    FEATURES,
    FeatureExtractor,
    extract_features,
    feature_bounds,
    feature_defaults,
)

NAMES = [f.name for f in FEATURES]
IDX = {n: i for i, n in enumerate(NAMES)}


def col(X: FloatArray, name: str) -> FloatArray:
    return X[:, IDX[name]]


def regular(
    rate: float,
    duration: float,
    *,
    fix_s: float = 0.4,
    sac_s: float = 0.03,
    amp: float = 5.0,
    blink_every_s: float | None = None,
    blink_s: float = 0.2,
    pupil: float | None = 4.0,
    seed: int = 0,
) -> GazeSamples:
    """A periodic scanpath: fixate, saccade ``amp`` deg right, fixate, saccade back left, ...;
    optionally a blink (invalid samples) every ``blink_every_s``; constant pupil."""
    rng = np.random.default_rng(seed)
    t = np.arange(round(duration * rate)) / rate
    cycle = 2 * (fix_s + sac_s)
    ph = t % cycle
    x = np.where(ph < fix_s, 0.0, amp)
    up = (ph >= fix_s) & (ph < fix_s + sac_s)
    x[up] = amp * (ph[up] - fix_s) / sac_s
    down = ph >= 2 * fix_s + sac_s
    x[down] = amp * (1 - (ph[down] - 2 * fix_s - sac_s) / sac_s)
    x = x + rng.normal(0, 0.005, t.size)
    y = rng.normal(0, 0.005, t.size)
    if blink_every_s is not None:
        blink = (t % blink_every_s) >= blink_every_s - blink_s
        x[blink] = np.nan
        y[blink] = np.nan
    p = None if pupil is None else np.full(t.size, pupil)
    return GazeSamples.from_arrays(t, x, y, p)


def features_of(
    block: GazeSamples, rate: float, window_s: float = 30.0, step_s: float = 0.5
) -> FloatArray:
    """Features of ``block``, a stream declared at ``rate`` Hz."""
    return extract_features(
        block.timestamps, block.x_deg, block.y_deg, block.pupil_mm, window_s, step_s, rate_hz=rate
    )[0]


# --- registry ----------------------------------------------------------------------------------
def test_registry_declares_each_feature_once_with_sane_bounds() -> None:
    assert 45 <= len(FEATURES) <= 55
    assert len(set(NAMES)) == len(NAMES)
    for f in FEATURES:
        assert f.unit
        assert f.description
        assert f.rationale
        assert f.lo < f.hi, f.name
        assert 0 < f.max_step <= f.hi - f.lo, f.name
        assert f.bounds() == (f.lo, f.hi, f.max_step)
    lo, hi, step = feature_bounds()
    assert lo.dtype == hi.dtype == step.dtype == np.float64
    assert lo.shape == (len(FEATURES),)
    assert np.array_equal(step, [f.max_step for f in FEATURES])


def test_feature_bounds_for_a_subset_keep_its_order() -> None:
    lo, hi, step = feature_bounds(["pupil_mean", "fixation_rate"])
    assert lo.tolist() == [1.5, 0.0]
    assert hi.tolist() == [9.0, 5.0]
    assert step[1] == pytest.approx(3 / 30)  # floor(5/s * 0.5 s) + 1 = 3 fixations per step


def test_unknown_feature_name_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"'saccade_speed'.*unknown feature; known: fix"):
        feature_bounds(["fixation_rate", "saccade_speed"])


def test_bounds_scale_with_window_and_step() -> None:
    lo, hi, step = feature_bounds(["saccade_rate"], 30.0, 0.5)
    assert (lo[0], hi[0]) == (0.0, 5.0)
    assert step[0] == pytest.approx(0.1)  # floor(5/s * 0.5 s) + 1 = 3 saccades per step
    assert feature_bounds(["saccade_rate"], 10.0, 0.5)[2][0] == pytest.approx(0.3)
    assert feature_bounds(["saccade_rate"], 30.0, 1.0)[2][0] == pytest.approx(6 / 30)
    # Count features grow with the window: at most 5 saccades/s (+1) in W seconds.
    assert feature_bounds(["wordbook1_max"], 10.0, 0.5)[1][0] == 51
    assert feature_bounds(["wordbook1_max"], 30.0, 0.5)[1][0] == 151
    for w, s in ((30.0, 0.5), (10.0, 0.5), (0.2, 0.1), (120.0, 2.0)):
        lo, hi, step = feature_bounds(None, w, s)
        assert np.all(lo < hi)
        assert np.all((step > 0) & (step <= hi - lo))


# --- timing ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("window", "step"), [(30.0, 0.5), (10.0, 0.5), (10.3, 0.5), (5.0, 1.0)])
def test_first_vector_after_exactly_one_window_then_every_step(window: float, step: float) -> None:
    block = regular(120, 42.0)
    t0 = 1000.0
    shifted = GazeSamples(block.timestamps + t0, block.x_deg, block.y_deg, block.pupil_mm,
                          block.valid)  # fmt: skip
    X, t = extract_features(
        shifted.timestamps,
        shifted.x_deg,
        shifted.y_deg,
        shifted.pupil_mm,
        window,
        step,
        rate_hz=120,
    )
    assert X.shape[1] == len(FEATURES)
    assert t[0] == pytest.approx(t0 + window)
    assert np.allclose(np.diff(t), step)
    # Step k is emitted once a sample at or after its end has been classified (1 look-ahead).
    last_ok = shifted.timestamps[-2]
    assert t[-1] <= last_ok < t[-1] + step + 1e-9


def test_recording_shorter_than_the_window_gives_no_vectors() -> None:
    X, t = extract_features(*_arrays(regular(120, 9.0)), window_s=10.0, rate_hz=120)
    assert X.shape == (0, len(FEATURES))
    assert t.shape == (0,)


def _arrays(b: GazeSamples) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    return b.timestamps, b.x_deg, b.y_deg, b.pupil_mm


def test_blocks_of_any_size_give_the_same_vectors() -> None:
    block = regular(250, 25.0, blink_every_s=3.0)
    X, t = extract_features(*_arrays(block), window_s=5.0, rate_hz=250)
    fx = FeatureExtractor(5.0, 0.5, rate_hz=250)
    rng = np.random.default_rng(7)
    parts, times, i = [], [], 0
    while i < len(block):
        n = int(rng.integers(1, 400))
        Xb, tb = fx.push(block.slice(i, i + n))
        assert Xb.shape == (len(tb), len(FEATURES))
        parts.append(Xb)
        times.append(tb)
        i += n
    assert np.array_equal(np.vstack(parts), X)
    assert np.array_equal(np.concatenate(times), t)
    assert fx.stats.steps == len(t)


# --- values ------------------------------------------------------------------------------------
def test_regular_scanpath_has_the_hand_computed_features() -> None:
    # Cycle 0.86 s: two 0.4 s fixations and two 5 deg saccades (right, left) of 30 ms.
    X = features_of(regular(250, 60.0, blink_every_s=5.0, blink_s=0.2), 250)
    rate = 2 / 0.86
    assert col(X, "fixation_rate") == pytest.approx(rate * (1 - 0.04), rel=0.08)
    assert col(X, "saccade_rate") == pytest.approx(rate * (1 - 0.04), rel=0.08)
    assert col(X, "saccade_amplitude_mean") == pytest.approx(5.0, abs=0.2)
    assert col(X, "saccade_amplitude_var") == pytest.approx(0.0, abs=0.05)
    assert col(X, "saccade_peak_velocity_mean") == pytest.approx(5 / 0.03, rel=0.1)
    # 0.4 s fixations, less a smoothing sample at each end; blinks cut some fixations in two.
    assert np.all(
        (col(X, "fixation_duration_mean") > 0.34) & (col(X, "fixation_duration_mean") < 0.4)
    )
    assert np.all(col(X, "fixation_dispersion_mean") < 0.1)
    for name, value in (("right", 0.5), ("left", 0.5), ("up", 0.0), ("down", 0.0)):
        assert col(X, f"saccade_{name}_ratio") == pytest.approx(value, abs=0.05)
    assert np.all(col(X, "saccade_diagonal_ratio") == 0)
    assert np.all(col(X, "saccade_small_ratio") == 0)  # 5 deg: neither small (<2) nor large
    assert np.all(col(X, "saccade_large_ratio") == 0)
    assert col(X, "blink_rate") == pytest.approx(0.2, abs=0.034)  # 6 blinks in 30 s (+-1)
    assert col(X, "blink_duration_mean") == pytest.approx(0.2, abs=0.01)
    assert col(X, "valid_fraction") == pytest.approx(1 - 0.2 / 5, abs=0.01)
    assert np.all(col(X, "pupil_mean") == 4.0)
    assert np.all(col(X, "pupil_var") == 0.0)
    assert np.all(col(X, "pupil_min") == 4.0)
    assert np.all(col(X, "pupil_max") == 4.0)
    # Wordbook (without blinks, which may swallow a saccade): two letters alternate, R L R L ...
    X = features_of(regular(250, 45.0), 250)
    for n in (1, 2, 3, 4):
        assert np.all(col(X, f"wordbook{n}_distinct") == 2), n
        assert np.all(col(X, f"wordbook{n}_range") <= 1)
        assert col(X, f"wordbook{n}_mean") == pytest.approx(col(X, "saccade_rate") * 15, abs=2.0)


def test_event_features_equal_a_brute_force_recomputation() -> None:
    """Reference: detect events once, then recompute a few features per window from scratch."""
    rng = np.random.default_rng(3)
    rate, dur, w, s = 200.0, 40.0, 7.3, 0.5
    n = round(dur * rate)
    # Jittered timestamps: no sample sits within float rounding of a window edge.
    t = 0.123 + np.arange(n) / rate + rng.uniform(0, 1e-3, n)
    # Random fixation targets with random dwell; random pupil; random invalid bursts.
    targets = np.cumsum(rng.integers(40, 120, 200))
    pos = rng.uniform(-10, 10, (201, 2))
    k = np.searchsorted(targets, np.arange(n))
    x = pos[k, 0] + rng.normal(0, 0.01, n)
    y = pos[k, 1] + rng.normal(0, 0.01, n)
    for a in rng.integers(0, n - 60, 12):
        x[a : a + rng.integers(2, 60)] = np.nan
    pupil = rng.uniform(1.0, 9.5, n)
    det = EventDetector(rate_hz=rate)
    X, T = extract_features(t, x, y, pupil, w, s, detector=det)
    assert det.dt is not None
    ev, _ = detect_events(t, x, y, rate_hz=rate)
    valid = np.isfinite(x)
    ok_p = valid & (pupil >= 1.5) & (pupil <= 9.0)
    for row, end in zip(X, T, strict=True):
        start = end - w
        inw = (ev.t_end >= start - 1e-9) & (ev.t_end < end - 1e-9)
        fix = inw & (ev.kind == EventKind.FIXATION)
        sac = inw & (ev.kind == EventKind.SACCADE)
        assert row[IDX["fixation_rate"]] == pytest.approx(np.count_nonzero(fix) / w)
        assert row[IDX["saccade_rate"]] == pytest.approx(np.count_nonzero(sac) / w)
        if np.any(sac):
            amp = np.minimum(ev.amplitude[sac], 30.0)
            assert row[IDX["saccade_amplitude_mean"]] == pytest.approx(amp.mean())
        if np.any(fix):
            assert row[IDX["fixation_duration_max"]] == pytest.approx(
                min(2.0, ev.duration[fix].max())
            )
        ins = (t >= start - 1e-9) & (t < end - 1e-9)
        assert row[IDX["valid_fraction"]] == pytest.approx(
            min(1.0, np.count_nonzero(valid & ins) * det.dt / w)
        )
        p = pupil[ins & ok_p]
        assert row[IDX["pupil_mean"]] == pytest.approx(p.mean(), abs=1e-4)
        assert row[IDX["pupil_var"]] == pytest.approx(p.var(), abs=1e-4)
        assert row[IDX["pupil_min"]] == p.min()
        assert row[IDX["pupil_max"]] == p.max()


# --- always finite -----------------------------------------------------------------------------
def test_low_quality_windows_hold_behaviour_for_the_hold_limit_then_release_defaults() -> None:
    block = regular(120, 80.0)
    x = block.x_deg.copy()
    y = block.y_deg.copy()
    lost = (block.timestamps >= 35.0) & (block.timestamps < 60.0)  # headset off for 25 s
    x[lost] = np.nan
    y[lost] = np.nan
    fx = FeatureExtractor(10.0, 0.5, rate_hz=120)  # hold limit: W = 10 s = 20 steps
    X, _ = fx.push(GazeSamples.from_arrays(block.timestamps, x, y, block.pupil_mm))
    assert np.all(np.isfinite(X))
    vf = col(X, "valid_fraction")
    low = np.flatnonzero(vf < 0.5)
    assert fx.stats.low_quality_windows == len(low) > 20
    assert np.all(np.diff(low) == 1)  # one run of low-quality windows
    behaviour = [i for i, f in enumerate(FEATURES) if f.name != "valid_fraction"]
    default = feature_defaults(None, 10.0, 0.5)
    for j, k in enumerate(low, start=1):
        want = X[k - 1, behaviour] if j <= 20 else default[behaviour]
        assert np.array_equal(X[k, behaviour], want), (j, k)
    assert fx.stats.defaulted_values >= (len(low) - 20) * len(behaviour)
    assert vf.min() == 0.0
    assert np.all(np.abs(np.diff(vf)) <= FEATURES[IDX["valid_fraction"]].bounds(10.0, 0.5)[2])
    assert col(X, "saccade_rate")[-1] > 1.0  # recovers after the loss


def test_no_valid_data_gives_the_public_defaults() -> None:
    n = 120 * 40
    t = np.arange(n) / 120
    X, _ = extract_features(t, np.full(n, np.nan), np.full(n, np.nan), None, 30.0, 0.5, rate_hz=120)
    want = feature_defaults()
    want[IDX["valid_fraction"]] = 0.0  # always measured, never held
    assert X.shape[0] > 0
    assert np.array_equal(X, np.broadcast_to(want, X.shape))


def test_pupil_absent_gives_the_default_and_out_of_range_pupil_is_ignored() -> None:
    X = features_of(regular(120, 35.0, pupil=None), 120)
    for name in ("pupil_mean", "pupil_var", "pupil_min", "pupil_max"):
        assert np.all(col(X, name) == FEATURES[IDX[name]].default())
    block = regular(120, 35.0)
    p = block.pupil_mm.copy()
    p[::10] = 0.3  # detector artefacts, not pupils
    fx = FeatureExtractor(rate_hz=120)
    X, _ = fx.push(GazeSamples(block.timestamps, block.x_deg, block.y_deg, p, block.valid))
    assert np.all(col(X, "pupil_min") == 4.0)
    assert fx.stats.pupil_out_of_range == len(p[::10])


@pytest.mark.parametrize("hold_limit_s", [None, 3.0, 0.0])
def test_undefined_values_repeat_for_the_hold_limit_then_take_the_default(
    hold_limit_s: float | None,
) -> None:
    # Saccades only in the first 15 s: later windows have no saccade, so the amplitude mean is
    # undefined there; it repeats its last value for the hold limit (default W = 10 s, 20 steps),
    # then the public default is released, while the rate (always defined) falls to 0.
    block = regular(120, 60.0)
    x = block.x_deg.copy()
    x[block.timestamps >= 15.0] = 0.0
    fx = FeatureExtractor(10.0, 0.5, hold_limit_s=hold_limit_s, rate_hz=120)
    X, _ = fx.push(GazeSamples.from_arrays(block.timestamps, x, block.y_deg, block.pupil_mm))
    rate, amp = col(X, "saccade_rate"), col(X, "saccade_amplitude_mean")
    u = int(np.flatnonzero(rate == 0.0)[0])  # first window without a saccade
    repeats = round((10.0 if hold_limit_s is None else hold_limit_s) / 0.5)
    assert np.all(amp[:u] == pytest.approx(5.0, abs=0.2))
    assert np.all(amp[u : u + repeats] == amp[u - 1])
    assert np.all(amp[u + repeats :] == FEATURES[IDX["saccade_amplitude_mean"]].default())
    assert len(amp) > u + repeats
    assert fx.stats.held_values > 0 or repeats == 0
    assert fx.stats.defaulted_values > 0


def test_defaults_are_public_and_declared_in_the_registry() -> None:
    """Typical rates, 0 for the wordbook (an empty one), the midpoint elsewhere; within the
    bounds at any W and s, and the same whatever the data."""
    for w, s in [(30.0, 0.5), (10.0, 0.25), (3.0, 1.0)]:
        d = feature_defaults(None, w, s)
        lo, hi, _ = feature_bounds(None, w, s)
        assert np.all((lo <= d) & (d <= hi))
        for i, f in enumerate(FEATURES):
            if f.name.startswith("wordbook"):
                assert d[i] == 0.0
            elif f.name not in ("fixation_rate", "saccade_rate", "blink_rate"):
                assert d[i] == (lo[i] + hi[i]) / 2, f.name
    d = feature_defaults(["fixation_rate", "saccade_rate", "blink_rate"])
    np.testing.assert_allclose(d, [3.0, 3.0, 17 / 60])
    a = FeatureExtractor(5.0, 0.5, rate_hz=120)
    b = FeatureExtractor(5.0, 0.5, rate_hz=120)
    a.push(regular(120, 12.0))  # data never moves the defaults
    np.testing.assert_array_equal(a.default, b.default)


def test_values_are_clipped_to_the_public_range() -> None:
    # 16 fixations/s (50 ms fixations, 12 ms saccades of 40 deg): beyond the 5/s and 30 deg bounds.
    X = features_of(regular(1000, 12.0, fix_s=0.05, sac_s=0.012, amp=40.0), 1000, window_s=10.0)
    assert np.all(col(X, "fixation_rate") == 5.0)
    assert np.all(col(X, "saccade_amplitude_max") == 30.0)
    fx = FeatureExtractor(10.0, 0.5, rate_hz=1000)
    fx.push(regular(1000, 12.0, fix_s=0.05, sac_s=0.012, amp=40.0))
    assert fx.stats.clipped_values > 0


def test_dropout_emits_the_skipped_steps_when_data_resumes() -> None:
    block = regular(120, 50.0)
    keep = (block.timestamps < 20.0) | (block.timestamps >= 25.0)  # 5 s without samples
    fx = FeatureExtractor(10.0, 0.5, rate_hz=120)
    _, t1 = fx.push(block.slice(0, int(np.argmin(keep))))
    assert t1[-1] < 20.0
    rest = np.flatnonzero(keep)[np.flatnonzero(keep) >= np.argmin(keep)]
    after = GazeSamples(*(getattr(block, f)[rest] for f in
                          ("timestamps", "x_deg", "y_deg", "pupil_mm", "valid")))  # fmt: skip
    X, t2 = fx.push(after.slice(0, 3))  # the first samples after the gap release the backlog
    assert t2[0] == pytest.approx(t1[-1] + 0.5)
    assert len(t2) == 11  # ends 20.0 .. 25.0: the sample at 25.0 completes the window [15, 25)
    assert col(X, "valid_fraction")[-1] == pytest.approx(0.5, abs=0.02)
    assert fx.detector.stats.gaps == 1


# --- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"window_s": 0.0}, "features.window_s"),
        ({"window_s": math.inf}, "features.window_s"),
        ({"step_s": 40.0}, "features.step_s"),
        ({"step_s": -0.5}, "features.step_s"),
        ({"min_valid_fraction": 1.5}, "min_valid_fraction"),
        ({"hold_limit_s": -1.0}, "features.hold_limit_s"),
        ({"hold_limit_s": math.nan}, "features.hold_limit_s"),
        ({"rate_hz": None}, "rate_hz"),  # the declared rate is required
        ({"rate_hz": 5.0}, "rate_hz"),  # outside events.RATE_RANGE_HZ
        ({"rate_hz": math.inf}, "rate_hz"),
    ],
)
def test_bad_parameters_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as exc:
        FeatureExtractor(**{"rate_hz": 120.0, **kwargs})  # type: ignore[arg-type]
    assert exc.value.field == field


def test_the_declared_rate_or_a_detector_is_required() -> None:
    block = regular(120, 2.0)
    with pytest.raises(ConfigError, match="rate_hz") as exc:
        FeatureExtractor(5.0, 0.5)
    assert exc.value.field == "rate_hz"
    with pytest.raises(ConfigError, match="rate_hz"):
        extract_features(block.timestamps, block.x_deg, block.y_deg, None, 5.0, 0.5)
    # a detector carries its rate; a different rate beside it is refused
    assert FeatureExtractor(5.0, 0.5, detector=EventDetector(rate_hz=120)).detector.h == 1
    assert FeatureExtractor(5.0, 0.5, rate_hz=120, detector=EventDetector(rate_hz=120))
    with pytest.raises(ConfigError, match="rate_hz"):
        FeatureExtractor(5.0, 0.5, rate_hz=250, detector=EventDetector(rate_hz=120))


def test_out_of_order_blocks_are_refused_before_any_state_changes() -> None:
    fx = FeatureExtractor(5.0, 0.5, rate_hz=120)
    block = regular(120, 8.0)
    fx.push(block.slice(0, 600))
    with pytest.raises(StreamError, match="strictly increasing"):
        fx.push(block.slice(100, 200))
    X, _ = fx.push(block.slice(600, len(block)))  # the stream goes on as if nothing happened
    assert np.array_equal(X, features_of(block, 120, 5.0)[-len(X) :])


# --- the unit of privacy: how many chunks one second of gaze reaches ---------------------------
FEATURE_EVENTS = [EventKind.FIXATION, EventKind.SACCADE, EventKind.BLINK]  # what features use


def _changed_chunks(a: FloatArray, b: FloatArray, n: int) -> list[int]:
    """Chunks (n consecutive steps, as the Chunker cuts them) in which ``a`` and ``b`` differ."""
    full = (len(a) // n) * n
    diff = np.any(a[:full] != b[:full], axis=1).reshape(-1, n)
    return np.flatnonzero(diff.any(axis=1)).tolist()


@pytest.mark.parametrize(
    ("window", "step", "n", "hold", "after"),
    [
        (30.0, 0.5, 32, None, "invalid"),  # the defaults, then the headset taken off
        (30.0, 0.5, 32, None, "valid"),
        (10.0, 0.5, 16, 5.0, "invalid"),
        (10.0, 0.25, 8, 0.0, "invalid"),
        (5.0, 0.5, 4, 20.0, "invalid"),
    ],
)
def test_one_second_of_gaze_reaches_a_bounded_number_of_chunks(
    window: float, step: float, n: int, hold: float | None, after: str
) -> None:
    """Replace one second of a simulated person's gaze with another person's; the feature chunks
    that change are at most ⌈(W + H + d + E)/(n·s)⌉ + 1 (d = 1 s changed, H the hold limit, E
    how long after the change the events containing it end), and with d = E = 0 (one sample)
    ⌈(W + H)/(n·s)⌉ + 1, however long invalid data follows. Unbounded holds (the old rule)
    carry the change into every later chunk."""
    rate, total, at, d = 120.0, 200.0, 60.0, 1.0
    base = simulate_gaze(total, rate, seed=5)
    other = simulate_gaze(total, rate, seed=9)
    t = base.timestamps
    seg = (t >= at) & (t < at + d)
    x_b, y_b, p_b = base.x_deg.copy(), base.y_deg.copy(), base.pupil_mm.copy()
    x_b[seg], y_b[seg], p_b[seg] = other.x_deg[seg], other.y_deg[seg], other.pupil_mm[seg]
    x_a, y_a, p_a = base.x_deg.copy(), base.y_deg.copy(), base.pupil_mm.copy()
    if after == "invalid":  # nothing valid from the end of the change on
        for arr in (x_a, y_a, p_a, x_b, y_b, p_b):
            arr[t >= at + d] = np.nan
    h = window if hold is None else hold

    def feats(x: FloatArray, y: FloatArray, p: FloatArray, limit: float | None) -> FloatArray:
        return extract_features(t, x, y, p, window, step, hold_limit_s=limit, rate_hz=rate)[0]

    changed = _changed_chunks(feats(x_a, y_a, p_a, hold), feats(x_b, y_b, p_b, hold), n)
    assert changed, "the change must be visible"
    # E: how long after the change the events that contain changed samples end (either person)
    ends = [at + d]
    for x, y in ((x_a, y_a), (x_b, y_b)):
        ev, _ = detect_events(t, x, y, rate_hz=rate)
        touch = (ev.t_start < at + d) & (ev.t_end >= at) & np.isin(ev.kind, FEATURE_EVENTS)
        ends.extend(ev.t_end[touch].tolist())
    e = max(ends) - (at + d)
    bound = math.ceil((window + h + d + e) / (n * step)) + 1
    assert len(changed) <= bound, (changed, bound, e)
    assert changed == list(range(changed[0], changed[-1] + 1))  # one contiguous stretch
    first_step = changed[0] * n
    assert at <= t[0] + window + step * first_step + n * step  # nothing before the change moves
    if after == "invalid" and h < total:
        # the old "repeat the previous value" rule: the change reaches every later chunk
        forever = _changed_chunks(feats(x_a, y_a, p_a, 1e9), feats(x_b, y_b, p_b, 1e9), n)
        assert len(forever) > bound
        assert forever[-1] == (len(feats(x_a, y_a, p_a, 1e9)) // n) - 1


@pytest.mark.parametrize(("window", "step", "n", "hold"), [(30.0, 0.5, 32, None), (10, 0.25, 8, 2)])
def test_one_gaze_sample_reaches_at_most_the_stated_number_of_chunks(
    window: float, step: float, n: int, hold: float | None
) -> None:
    rate, total = 120.0, 200.0
    base = simulate_gaze(total, rate, seed=6)
    t = base.timestamps
    worst = 0
    h = window if hold is None else hold
    bound = math.ceil((window + h) / (n * step)) + 1
    for at in (40.0, 47.3, 61.9):
        k = int(np.searchsorted(t, at))
        for after in ("valid", "invalid"):
            x_a, y_a = base.x_deg.copy(), base.y_deg.copy()
            if after == "invalid":
                x_a[k + 1 :] = np.nan
                y_a[k + 1 :] = np.nan
            x_b = x_a.copy()
            x_b[k] = np.nan if np.isfinite(x_b[k]) else 0.0  # the sample lost (or found)
            a = extract_features(
                t, x_a, y_a, base.pupil_mm, window, step, hold_limit_s=hold, rate_hz=rate
            )[0]
            b = extract_features(
                t, x_b, y_a, base.pupil_mm, window, step, hold_limit_s=hold, rate_hz=rate
            )[0]
            changed = _changed_chunks(a, b, n)
            worst = max(worst, len(changed))
            ev, _ = detect_events(t, x_a, y_a, rate_hz=rate)
            inside = (ev.t_start <= t[k]) & (ev.t_end > t[k]) & np.isin(ev.kind, FEATURE_EVENTS)
            e = float(ev.t_end[inside].max() - t[k]) if inside.any() else 0.0
            assert len(changed) <= math.ceil((window + h + e) / (n * step)) + 1
    assert 1 <= worst <= bound + 1
