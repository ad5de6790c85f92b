"""Event detection: hand-built scanpaths with known events, edge cases, errors, and the real
hand-labelled irf excerpt (tests/data, MIT) so the detector is checked against a human coder
even where ../shared/data is absent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gazeguard.core.errors import ConfigError, GazeguardError, StreamError
from gazeguard.core.samples import GazeSamples
from gazeguard.signal.events import (
    RATE_RANGE_HZ,
    EventDetector,
    EventKind,
    Events,
    detect_events,
    sample_labels,
)

EXCERPT = Path(__file__).resolve().parents[1] / "data" / "irf_lookAtPoint_EL_excerpt.npz"

F, S, B, L, U = (
    EventKind.FIXATION,
    EventKind.SACCADE,
    EventKind.BLINK,
    EventKind.LOSS,
    EventKind.UNDEFINED,
)


def scanpath(
    rate: float,
    segments: list[tuple[str, float, float, float]],
    noise: float = 0.005,
    seed: int = 0,
) -> GazeSamples:
    """Samples at ``rate`` Hz for segments ``(kind, duration_s, x, y)``:

    - ``fix``: hold (x, y) deg (plus Gaussian noise of ``noise`` deg);
    - ``sac``: move linearly from the current point to (x, y) deg within the duration;
    - ``blink``: invalid samples (NaN gaze);
    - ``gap``: no samples at all (a dropout); the eye may move to (x, y) meanwhile.
    """
    rng = np.random.default_rng(seed)
    ts, xs, ys = [], [], []
    t, px, py = 0.0, 0.0, 0.0
    dt = 1.0 / rate
    for kind, dur, x, y in segments:
        n = round(dur * rate)
        if kind == "gap":
            t += n * dt
            px, py = x, y
            continue
        tt = t + dt * np.arange(n)
        if kind == "fix":
            px, py = x, y
            xx, yy = np.full(n, x), np.full(n, y)
        elif kind == "sac":
            f = np.arange(1, n + 1) / n
            xx, yy = px + (x - px) * f, py + (y - py) * f
            px, py = x, y
        else:  # blink
            xx, yy = np.full(n, np.nan), np.full(n, np.nan)
        ts.append(tt)
        xs.append(xx + rng.normal(0, noise, n))
        ys.append(yy + rng.normal(0, noise, n))
        t += n * dt
    return GazeSamples.from_arrays(np.concatenate(ts), np.concatenate(xs), np.concatenate(ys))


def run(block: GazeSamples, rate: float, **kw: float) -> tuple[Events, EventDetector]:
    """All events of ``block``, detected at its declared ``rate`` (Hz)."""
    det = EventDetector(rate_hz=rate, **kw)
    return Events.concat([det.push(block), det.finish()]), det


def kinds(ev: Events) -> list[EventKind]:
    return [EventKind(k) for k in ev.kind.tolist()]


def core(ev: Events) -> list[EventKind]:
    """Event kinds without the UNDEFINED slivers at run edges."""
    return [k for k in kinds(ev) if k != U]


def test_fixation_saccade_fixation_at_500_hz() -> None:
    block = scanpath(500, [("fix", 0.3, 0, 0), ("sac", 0.04, 10, 0), ("fix", 0.3, 10, 0)])
    ev, det = run(block, 500)
    assert core(ev) == [F, S, F]
    sac = ev.kind == S
    assert ev.amplitude[sac][0] == pytest.approx(10.0, abs=0.5)
    assert ev.dx[sac][0] > 9.5
    assert abs(ev.dy[sac][0]) < 0.5
    assert ev.peak_velocity[sac][0] == pytest.approx(250.0, rel=0.15)  # 10 deg in 40 ms
    assert ev.duration[sac][0] == pytest.approx(0.04, abs=0.012)
    fix = ev.kind == F
    assert ev.x[fix].tolist() == pytest.approx([0.0, 10.0], abs=0.05)
    assert np.all(ev.dispersion[fix] < 0.1)
    assert det.h == 3  # 5 ms half-width at 500 Hz
    assert det.dt == pytest.approx(0.002)


def test_event_times_tile_the_recording() -> None:
    block = scanpath(250, [("fix", 0.5, 0, 0), ("sac", 0.04, 5, 5), ("fix", 0.5, 5, 5)])
    ev, _ = run(block, 250)
    assert ev.start[0] == 0
    assert ev.stop[-1] == len(block)
    assert np.array_equal(ev.start[1:], ev.stop[:-1])
    assert np.allclose(ev.t_start[1:], ev.t_end[:-1])
    assert np.allclose(ev.duration, ev.t_end - ev.t_start)


@pytest.mark.parametrize(
    ("rate", "h"),
    [(30, 1), (120, 1), (250, 1), (300, 2), (500, 3), (1000, 5), (1200, 6), (2000, 10)],
)
def test_velocity_halfwidth_follows_the_declared_rate(rate: float, h: int) -> None:
    # h = max(1, floor(5 ms * rate + 1/2)) on the decimal values, exactly: 300 Hz * 5 ms = 1.5
    # rounds half up to 2 (in floats 0.005 / (1 / 300) is 1.4999999999999998 and would give 1).
    det = EventDetector(rate_hz=rate)
    assert det.h == h  # known before any sample: nothing is estimated from the stream
    assert det.dt == 1.0 / rate
    assert det.max_gap_s == 4.0 / rate
    det.push(scanpath(rate, [("fix", 1.0, 0, 0)]))
    assert (det.h, det.dt, det.max_gap_s) == (h, 1.0 / rate, 4.0 / rate)


def test_halfwidth_rounds_exactly_on_the_decimal_values() -> None:
    # 0.0125 s * 200 Hz = 2.5 -> 3 and 0.0075 s * 300 Hz = 2.25 -> 2, on every machine.
    assert EventDetector(rate_hz=200, velocity_halfwidth_s=0.0125).h == 3
    assert EventDetector(rate_hz=300, velocity_halfwidth_s=0.0075).h == 2
    assert EventDetector(rate_hz=20, velocity_halfwidth_s=0.001).h == 1  # at least 1


def test_declared_rate_is_used_not_the_measured_one() -> None:
    # Samples arrive at 500 Hz on a stream declared at 1000 Hz: the parameters are the
    # declaration's (a detector whose parameters depended on the samples would let one
    # timestamp change every event of the stream).
    det = EventDetector(rate_hz=1000.0)
    det.push(scanpath(500, [("fix", 0.2, 0, 0)]))
    assert det.dt == pytest.approx(0.001)
    assert det.h == 5
    assert det.max_gap_s == pytest.approx(0.004)
    # Irregular first intervals (what used to set the estimate) change nothing either.
    jittered = scanpath(250, [("fix", 0.5, 0, 0)])
    t = jittered.timestamps.copy()
    t[1:16] += 0.0015
    det = EventDetector(rate_hz=250.0)
    det.push(GazeSamples.from_arrays(t, jittered.x_deg, jittered.y_deg))
    assert (det.h, det.dt, det.max_gap_s) == (1, 1.0 / 250.0, 4.0 / 250.0)


def test_blink_between_fixations() -> None:
    block = scanpath(250, [("fix", 0.4, 0, 0), ("blink", 0.15, 0, 0), ("fix", 0.4, 0, 0)])
    ev, det = run(block, 250)
    assert core(ev) == [F, B, F]
    blink = ev.kind == B
    assert ev.duration[blink][0] == pytest.approx(0.15, abs=0.005)
    assert np.isnan(ev.amplitude[blink][0])
    assert det.stats.invalid_samples == round(0.15 * 250)


@pytest.mark.parametrize("dur", [0.02, 1.5])
def test_implausible_invalid_runs_are_data_loss_not_blinks(dur: float) -> None:
    block = scanpath(250, [("fix", 0.4, 0, 0), ("blink", dur, 0, 0), ("fix", 0.4, 0, 0)])
    ev, _ = run(block, 250)
    assert core(ev) == [F, L, F]


def test_invalid_run_at_stream_start_is_loss() -> None:
    ev, _ = run(scanpath(250, [("blink", 0.2, 0, 0), ("fix", 0.4, 0, 0)]), 250)
    assert core(ev) == [L, F]


def test_dropout_is_not_a_saccade_nor_a_blink() -> None:
    # 200 ms without samples while the eye moves 10 deg: two fixations, a counted gap, nothing else.
    block = scanpath(250, [("fix", 0.5, 0, 0), ("gap", 0.2, 10, 0), ("fix", 0.5, 10, 0)])
    ev, det = run(block, 250)
    assert S not in kinds(ev)
    assert B not in kinds(ev)
    assert core(ev) == [F, F]
    assert det.stats.gaps == 1
    # The run before the dropout (an UNDEFINED sliver: its velocity window spans the gap) ends
    # at its last sample + dt, not when the data resumes.
    before = np.flatnonzero(ev.t_start < 0.5)[-1]
    assert ev.kind[before] == U
    assert ev.t_end[before] == pytest.approx(0.5, abs=1e-9)
    assert ev.t_start[before + 1] == pytest.approx(0.7, abs=1e-9)


def test_dropout_inside_invalid_run_is_loss() -> None:
    segs = [("fix", 0.4, 0, 0), ("blink", 0.1, 0, 0), ("gap", 0.1, 0, 0), ("blink", 0.1, 0, 0)]
    ev, _ = run(scanpath(250, [*segs, ("fix", 0.4, 0, 0)]), 250)
    assert B not in kinds(ev)
    assert core(ev) == [F, L, L, F]


def test_fast_run_touching_a_blink_is_not_a_saccade() -> None:
    # Eyelid artefact: gaze sweeps down into the blink; humans call it part of the blink.
    segs = [("fix", 0.4, 0, 0), ("sac", 0.03, 0, -8), ("blink", 0.12, 0, 0), ("fix", 0.4, 0, -8)]
    ev, _ = run(scanpath(500, segs), 500)
    assert S not in kinds(ev)
    assert B in kinds(ev)


def test_short_fixations_and_short_saccades_are_undefined() -> None:
    segs = [
        ("fix", 0.3, 0, 0),
        ("sac", 0.03, 6, 0),
        ("fix", 0.02, 6, 0),  # 20 ms < 40 ms minimum fixation
        ("sac", 0.03, 12, 0),
        ("fix", 0.3, 12, 0),
        ("sac", 0.004, 12.4, 0),  # 4 ms blip < 10 ms minimum saccade
        ("fix", 0.3, 12.4, 0),
    ]
    ev, _ = run(scanpath(1000, segs), 1000)
    assert core(ev) == [F, S, S, F, F]
    short = np.flatnonzero((ev.kind == U) & (ev.duration > 0.015))
    assert len(short) == 1
    assert ev.duration[short[0]] == pytest.approx(0.02, abs=0.012)


def test_threshold_is_configurable() -> None:
    block = scanpath(500, [("fix", 0.3, 0, 0), ("sac", 0.04, 10, 0), ("fix", 0.3, 10, 0)])
    assert S in kinds(run(block, 500)[0])
    assert S not in kinds(run(block, 500, velocity_threshold_deg_s=1000.0)[0])
    assert core(run(block, 500, velocity_threshold_deg_s=1000.0)[0]) == [F]


def test_any_block_split_gives_identical_events() -> None:
    block = scanpath(
        500,
        [
            ("fix", 0.3, 0, 0),
            ("sac", 0.04, 10, 0),
            ("fix", 0.2, 10, 0),
            ("blink", 0.1, 0, 0),
            ("fix", 0.3, 10, 0),
            ("gap", 0.1, 3, 3),
            ("fix", 0.3, 3, 3),
            ("sac", 0.03, 0, 0),
            ("fix", 0.3, 0, 0),
            ("fix", 2.4, 0, 0),  # a long fixation: cut at the grid points 2 s and 3 s
            ("blink", 1.3, 0, 0),  # a long invalid run: cut at 5 s
            ("fix", 0.5, 0, 0),
        ],
        noise=0.05,
    )
    whole = EventDetector(rate_hz=500).push(block)
    det = EventDetector(rate_hz=500)
    one_by_one = Events.concat([det.push(block.slice(i, i + 1)) for i in range(len(block))])
    for name in Events.__dataclass_fields__:
        assert np.array_equal(getattr(whole, name), getattr(one_by_one, name), equal_nan=True)
    assert len(whole) > 8
    assert np.any(np.isin(whole.t_end, [2.0, 3.0, 5.0]))  # the cuts are among them


def test_samples_are_classified_from_the_first_block() -> None:
    # The rate is declared: no samples are held back to estimate it, only the h = 1 samples of
    # velocity look-ahead.
    det = EventDetector(rate_hz=250)
    block = scanpath(250, [("fix", 0.06, 0, 0)])  # 15 samples
    ev = det.push(block)
    assert det.dt == 1.0 / 250
    assert det.last_classified_t == block.timestamps[13]
    assert kinds(ev) == [U]  # the first sample (no look-behind); the fixation is still open
    assert ev.stop.tolist() == [1]


def _grid_cuts(rate: float, segments: list[tuple[str, float, float, float]], **kw: float) -> Events:
    return run(scanpath(rate, segments), rate, **kw)[0]


def test_long_fixation_is_cut_at_the_grid() -> None:
    # A 3.5 s fixation from t = 0 at 250 Hz. Its slow run starts at 4 ms (sample 0 has no
    # look-behind: UNDEFINED), lasts less than 1 s at 1 s (no cut), and is cut at 2 s and 3 s.
    ev = _grid_cuts(250, [("fix", 3.5, 0, 0)])
    fix = ev.kind == F
    assert fix.sum() == 3
    assert ev.t_start[fix].tolist() == pytest.approx([0.004, 2.0, 3.0], abs=1e-9)
    assert ev.t_end[fix].tolist() == pytest.approx([2.0, 3.0, 3.496], abs=1e-9)
    assert ev.t_end[fix][:2].tolist() == [2.0, 3.0]  # exactly the grid points
    assert ev.x[fix].tolist() == pytest.approx([0.0, 0.0, 0.0], abs=0.01)
    # The samples are still tiled: each cut part starts where the one before stopped.
    assert ev.start[0] == 0
    assert ev.stop[-1] == 875
    assert np.array_equal(ev.start[1:], ev.stop[:-1])
    assert np.all(ev.duration < 2.0)


def test_cut_invalid_run_is_loss_even_if_plausible_as_a_blink() -> None:
    # With max_blink_s = 3 an uncut 2.5 s invalid run between fixations would be a blink; cut
    # at 2 s (it started at 0.4 s), both parts count as next to a gap: data loss.
    segs = [("fix", 0.4, 0, 0), ("blink", 2.5, 0, 0), ("fix", 0.4, 0, 0)]
    short = [segs[0], ("blink", 0.4, 0, 0), segs[2]]
    assert core(_grid_cuts(250, short, max_blink_s=3.0)) == [F, B, F]
    ev = _grid_cuts(250, segs, max_blink_s=3.0)
    assert core(ev) == [F, L, L, F]
    loss = ev.kind == L
    assert ev.t_start[loss].tolist() == pytest.approx([0.4, 2.0], abs=1e-9)
    assert ev.t_end[loss].tolist() == pytest.approx([2.0, 2.9], abs=1e-9)


def test_cut_fast_run_is_not_a_saccade() -> None:
    # A 2.3 s sweep at 50 deg/s between fixations: one fast run flanked by slow ones, a
    # saccade before the cut rule; cut at 2 s, neither part is flanked: both UNDEFINED.
    segs = [("fix", 0.3, 0, 0), ("sac", 2.3, 115, 0), ("fix", 0.4, 115, 0)]
    ev = _grid_cuts(250, segs)
    assert S not in kinds(ev)
    assert core(ev) == [F, F]
    long_u = (ev.kind == U) & (ev.duration > 0.5)
    assert ev.t_start[long_u].tolist() == pytest.approx([0.3, 2.0], abs=0.01)
    assert ev.t_end[long_u][0] == 2.0
    # A sweep that crosses no grid point 1 s after its start is one saccade, as before.
    short = _grid_cuts(250, [("fix", 0.3, 0, 0), ("sac", 0.6, 30, 0), ("fix", 0.4, 30, 0)])
    assert core(short) == [F, S, F]


def test_no_event_lasts_two_grid_intervals() -> None:
    # Long fixations, long invalid runs and a long sweep, at rates that put samples on and off
    # the grid points: every event is shorter than 2 s, and every cut lies on the grid.
    for rate in (30, 120, 300, 1000):
        segs = [
            ("fix", 4.7, 0, 0),
            ("blink", 3.3, 0, 0),
            ("fix", 1.9, 2, 2),
            ("sac", 2.6, 117, 2),  # 44 deg/s
            ("fix", 0.3, 117, 2),
        ]
        s = scanpath(rate, segs, seed=rate)
        block = GazeSamples.from_arrays(s.timestamps + 0.0137, s.x_deg, s.y_deg)  # off the grid
        ev, _ = run(block, rate)
        assert np.all(ev.duration < 2.0), rate
        assert np.array_equal(ev.start[1:], ev.stop[:-1])
        # Where the next event does not start at the end time (no gaps here): a cut, on the grid.
        off_sample = ev.t_end[:-1] != ev.t_start[1:]
        cuts = ev.t_end[:-1][off_sample]
        # fixation [0, 4.7): cut at 2, 3, 4; invalid [4.7, 8.0): 6, 7 and, where an invalid
        # sample lies in [8, 8.0137), 8; sweep [9.9, 12.5): 11, 12 (UNDEFINED parts).
        expected = [2.0, 3.0, 4.0, 6.0, 7.0, *([8.0] if rate > 1 / 0.0137 else []), 11.0, 12.0]
        assert cuts.tolist() == expected, rate
        assert [EventKind(k) for k in ev.kind[:-1][off_sample]] == [F, F, F, L, L] + [L] * (
            len(expected) - 7
        ) + [U, U]


def test_sample_labels_cover_the_events() -> None:
    block = scanpath(250, [("fix", 0.4, 0, 0), ("sac", 0.04, 8, 0), ("fix", 0.4, 8, 0)])
    ev, labels = detect_events(block.timestamps, block.x_deg, block.y_deg, rate_hz=250)
    assert labels.shape == (len(block),)
    assert labels.dtype == np.int8
    assert np.array_equal(labels, sample_labels(ev, len(block)))
    for k, s, e in zip(ev.kind.tolist(), ev.start.tolist(), ev.stop.tolist(), strict=True):
        assert np.all(labels[s:e] == k)
    assert np.count_nonzero(labels == F) > 0.85 * len(block)
    # A window of labels starting later in the stream.
    assert np.array_equal(sample_labels(ev, 10, first_index=50), labels[50:60])


def test_detect_events_respects_an_explicit_validity_mask() -> None:
    block = scanpath(250, [("fix", 1.0, 0, 0)])
    valid = np.ones(len(block), dtype=bool)
    valid[100:130] = False  # 120 ms flagged invalid by the tracker although x, y are finite
    ev, labels = detect_events(block.timestamps, block.x_deg, block.y_deg, valid=valid, rate_hz=250)
    assert core(ev) == [F, B, F]
    assert np.all(labels[100:130] == B)


def test_non_increasing_timestamps_are_refused_with_the_value() -> None:
    det = EventDetector(rate_hz=250)
    det.push(scanpath(250, [("fix", 0.2, 0, 0)]))
    bad = GazeSamples.from_arrays([0.1, 0.2], [0.0, 0.0], [0.0, 0.0])
    with pytest.raises(StreamError, match=r"strictly increasing.*t=0\.1 after t=0\.19"):
        det.push(bad)
    dup = GazeSamples.from_arrays([1.0, 1.0], [0.0, 0.0], [0.0, 0.0])
    with pytest.raises(StreamError, match="strictly increasing"):
        EventDetector(rate_hz=250).push(dup)
    nan_t = GazeSamples.from_arrays([1.0, np.nan], [0.0, 0.0], [0.0, 0.0])
    with pytest.raises(StreamError, match="1 non-finite"):
        EventDetector(rate_hz=250).push(nan_t)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"velocity_threshold_deg_s": 0.0}, "velocity_threshold_deg_s"),
        ({"min_fixation_s": -1.0}, "min_fixation_s"),
        ({"velocity_halfwidth_s": float("nan")}, "velocity_halfwidth_s"),
        ({"velocity_halfwidth_s": 0.05}, "velocity_halfwidth_s"),
        ({"rate_hz": float("inf")}, "rate_hz"),
        ({"rate_hz": float("nan")}, "rate_hz"),
        ({"rate_hz": 0.0}, "rate_hz"),
        ({"rate_hz": 19.9}, "rate_hz"),
        ({"rate_hz": 2001.0}, "rate_hz"),
        ({"rate_hz": None}, "rate_hz"),
        ({"min_blink_s": 0.3, "max_blink_s": 0.2}, "max_blink_s"),
    ],
)
def test_bad_parameters_name_the_field(kwargs: dict[str, float], field: str) -> None:
    kwargs = {"rate_hz": 250.0, **kwargs}
    with pytest.raises(ConfigError, match=field) as exc:
        EventDetector(**kwargs)  # type: ignore[arg-type]
    assert exc.value.field == field


def test_the_rate_is_required_and_bounded() -> None:
    with pytest.raises(TypeError, match="rate_hz"):
        EventDetector()  # type: ignore[call-arg]
    block = scanpath(250, [("fix", 0.2, 0, 0)])
    with pytest.raises(ConfigError, match="rate_hz") as exc:
        detect_events(block.timestamps, block.x_deg, block.y_deg)
    assert exc.value.field == "rate_hz"
    lo, hi = RATE_RANGE_HZ
    assert (lo, hi) == (20.0, 2000.0)
    assert EventDetector(rate_hz=lo).h == 1
    assert EventDetector(rate_hz=hi).h == 10
    with pytest.raises(ConfigError, match=r"rate_hz.*\[20, 2000\]"):
        EventDetector(rate_hz=10_000)


def test_push_after_finish_is_refused() -> None:
    det = EventDetector(rate_hz=250)
    det.push(scanpath(250, [("fix", 0.2, 0, 0)]))
    det.finish()
    assert len(det.finish()) == 0
    with pytest.raises(GazeguardError, match="after finish"):
        det.push(scanpath(250, [("fix", 0.2, 0, 0)]))


def test_empty_block_and_tiny_recordings() -> None:
    det = EventDetector(rate_hz=250)
    assert len(det.push(GazeSamples.from_arrays([], [], []))) == 0
    # One sample: with the rate declared (nothing to estimate) it still gets its event, an
    # UNDEFINED one (no velocity) lasting one nominal interval.
    ev, labels = detect_events([0.0], [1.0], [1.0], rate_hz=250)
    assert kinds(ev) == [U]
    assert ev.duration.tolist() == [1.0 / 250]
    assert labels.tolist() == [0]


def test_agrees_with_the_human_coder_on_the_irf_excerpt() -> None:
    """Real EyeLink data (1000 Hz) with a human coder's labels: sample-level Cohen's kappa."""
    data = np.load(EXCERPT)
    for name, floor in (("S1", 0.75), ("S4", 0.75)):
        a = data[name]
        x = np.where(a["status"], a["x"], np.nan)
        y = np.where(a["status"], a["y"], np.nan)
        _, labels = detect_events(a["t"], x, y, rate_hz=1000)
        for code in (F, S):
            ours, human = labels == code, a["evt"] == code
            po = np.mean(ours == human)
            pe = ours.mean() * human.mean() + (1 - ours.mean()) * (1 - human.mean())
            kappa = (po - pe) / (1 - pe)
            assert kappa > floor, (name, code.name, kappa)
    s1 = data["S1"]
    x = np.where(s1["status"], s1["x"], np.nan)
    y = np.where(s1["status"], s1["y"], np.nan)
    ev, _ = detect_events(s1["t"], x, y, rate_hz=1000)
    assert np.count_nonzero(ev.kind == B) == 2  # the coder marks two blinks in this excerpt
    assert np.all(ev.duration[ev.kind == B] < 0.5)
