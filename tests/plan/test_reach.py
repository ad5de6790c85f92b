"""How far one raw gaze sample reaches: brute force on adversarial streams (Hypothesis).

The release plan (:mod:`gazeguard.plan`) declares that changing, removing or re-timing one sample
at time τ changes only feature vectors stamped in ``(τ − A, τ + E + W + H]`` and so at most
``plan.chunks.per_sample`` chunks at every chunk alignment. These tests perturb one sample of
streams built to stretch that — long slowly drifting fixations, blink storms, NaN runs, dropouts,
fast sweeps — extract the features of both versions, and check every changed vector against
the declared interval and every one of the ``n`` chunk alignments against the declared count.
The audit's two findings are pinned as examples: a timestamp moved by 1.1 µs at 300 Hz, and
one invalid sample inside a 100 s drifting fixation.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazeguard.config import FeatureSettings, MechanismSettings
from gazeguard.core.samples import GazeSamples
from gazeguard.plan import ReleasePlan
from gazeguard.signal.events import EVENT_REACH_S, LOOKBEHIND_S, RATE_RANGE_HZ, reach_s
from gazeguard.signal.features import extract_features

WINDOW_S, STEP_S, N = 10.0, 0.5, 8  # small, so that the reach spans several chunks quickly
FEATURES = FeatureSettings(window_s=WINDOW_S, step_s=STEP_S)

PIECES = st.sampled_from(["drift", "drift", "fix", "sac", "blink", "storm", "nan", "gap", "sweep"])


def _plan() -> ReleasePlan:
    return ReleasePlan.build(
        features=FEATURES, mechanism=MechanismSettings(chunk_steps=N), budget=10.0, delta=1e-6
    )


PLAN = _plan()


def stream(kinds: list[str], durations: list[float], rate: float, seed: int) -> GazeSamples:
    """Concatenated pieces at ``rate`` Hz: slow drifts (long fixations for I-VT), fixations with
    tremor, saccades, single blinks, blink storms (many short invalid runs), long NaN runs,
    dropouts (no samples) and fast sweeps."""
    rng = np.random.default_rng(seed)
    ts, xs, ys = [], [], []
    k, x0, y0 = 0, 0.0, 0.0
    for kind, dur in zip(kinds, durations, strict=True):
        n = max(2, round(dur * rate))
        if kind == "gap":
            k += n
            continue
        i = np.arange(n)
        if kind == "drift":  # 0.5 deg/s: far below the saccade threshold for its whole length
            x, y = x0 + 0.5 * i / rate, y0 + 0.2 * i / rate
        elif kind == "sweep":  # 60 deg/s: a saccade candidate for its whole length
            x, y = x0 + 60.0 * i / rate, np.full(n, y0)
        elif kind == "sac":
            x, y = x0 + np.linspace(0, 8.0, n), y0 + np.linspace(0, -3.0, n)
        else:
            x = x0 + rng.normal(0, 0.02, n)
            y = y0 + rng.normal(0, 0.02, n)
        if kind == "blink":
            x[n // 4 : n // 2] = np.nan
        elif kind == "storm":  # an invalid sample every few samples
            x[rng.random(n) < 0.3] = np.nan
        elif kind == "nan":
            x[:] = np.nan
        ts.append((k + i) / rate)
        xs.append(x)
        ys.append(np.where(np.isnan(x), np.nan, y))
        k += n
        last = np.flatnonzero(np.isfinite(x))
        if last.size:
            x0, y0 = float(x[last[-1]]), float(y[last[-1]])
    t = np.concatenate(ts) + 1000.0  # an arbitrary origin, as LSL clocks have
    return GazeSamples.from_arrays(t, np.concatenate(xs), np.concatenate(ys), np.full(t.size, 3.5))


def perturbed(s: GazeSamples, i: int, how: str, rate: float) -> tuple[GazeSamples, float]:
    """``s`` with sample ``i`` changed; and the time τ of the change."""
    t, x, y, p = s.timestamps.copy(), s.x_deg.copy(), s.y_deg.copy(), s.pupil_mm.copy()
    tau = float(t[i])
    if how == "value":
        x[i] = (x[i] if np.isfinite(x[i]) else 0.0) + 40.0
        y[i] = (y[i] if np.isfinite(y[i]) else 0.0) + 20.0
    elif how == "invalid":
        x[i] = y[i] = np.nan
    elif how == "valid":
        x[i], y[i] = (x[i], y[i]) if np.isfinite(x[i]) else (1.0, 1.0)
    elif how in ("time", "time_late"):
        room = (t[i + 1] - t[i]) if how == "time_late" else (t[i] - t[i - 1])
        t[i] += (1 if how == "time_late" else -1) * min(1.1e-6, room / 2)
    elif how == "remove":
        keep = np.arange(t.size) != i
        return GazeSamples.from_arrays(t[keep], x[keep], y[keep], p[keep]), tau
    return GazeSamples.from_arrays(t, x, y, p), tau


def changed_stamps(a: GazeSamples, b: GazeSamples, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """The stamps of all vectors and of those that differ between ``a`` and ``b``."""
    kw = {"window_s": WINDOW_S, "step_s": STEP_S, "rate_hz": rate}
    Xa, ta = extract_features(a.timestamps, a.x_deg, a.y_deg, a.pupil_mm, **kw)
    Xb, tb = extract_features(b.timestamps, b.x_deg, b.y_deg, b.pupil_mm, **kw)
    assert np.array_equal(ta, tb), "the step grid is anchored at the first sample, kept here"
    differs = np.any(Xa != Xb, axis=1)
    return ta, ta[differs]


def check_reach(all_t: np.ndarray, changed: np.ndarray, tau: float) -> None:
    """Every changed vector within the declared interval; at most the declared chunks at every
    alignment of chunks on the step grid."""
    r = PLAN.reach
    hi = tau + float(r.event_reach_s + r.window_s + r.hold_s)
    assert np.all(changed > tau - LOOKBEHIND_S), (tau, changed.min())
    assert np.all(changed <= hi + 1e-9), (tau, changed.max(), hi)
    steps = np.round((changed - all_t[0]) / STEP_S).astype(int)
    for offset in range(N):  # every alignment of the chunk grid
        chunks = np.unique((steps + offset) // N)
        assert chunks.size <= PLAN.chunks.per_sample, (offset, chunks)


@settings(max_examples=40, deadline=None)
@given(
    kinds=st.lists(PIECES, min_size=4, max_size=10),
    durations=st.lists(st.floats(0.05, 25.0), min_size=10, max_size=10),
    rate=st.sampled_from([30.0, 120.0, 300.0, 500.0]),
    seed=st.integers(0, 2**16),
    where=st.floats(0.05, 0.95),
    how=st.sampled_from(["value", "invalid", "valid", "time", "time_late", "remove"]),
)
def test_one_sample_reaches_at_most_the_declared_chunks(
    kinds: list[str], durations: list[float], rate: float, seed: int, where: float, how: str
) -> None:
    s = stream([*kinds, "fix"], [*durations[: len(kinds)], 12.0], rate, seed)
    i = 1 + int(where * (len(s) - 3))  # never the first sample: it anchors the public grid
    b, tau = perturbed(s, i, how, rate)
    all_t, changed = changed_stamps(s, b, rate)
    check_reach(all_t, changed, tau)


@pytest.mark.slow
def test_a_timestamp_moved_by_a_microsecond_at_300_hz_changes_only_its_windows() -> None:
    """The audit: moving the 17th timestamp of a 300 Hz stream by 1.1 µs changed every vector
    of a 10-minute stream (the detector measured its rate from the first 16 intervals)."""
    rate = 300.0
    kinds = ["fix", "sac", "drift", "blink", "fix", "sac", "storm", "fix"] * 42
    s = stream(kinds, [4.0, 0.05, 3.0, 0.4, 2.0, 0.05, 1.0, 2.0] * 42, rate, 1)  # 10 min
    t = s.timestamps.copy()
    t[16] += 1.1e-6
    b = GazeSamples.from_arrays(t, s.x_deg, s.y_deg, s.pupil_mm)
    all_t, changed = changed_stamps(s, b, rate)
    assert all_t.size > 1000
    check_reach(all_t, changed, float(s.timestamps[16]))


def test_one_invalid_sample_in_a_100_s_drifting_fixation_reaches_the_declared_chunks() -> None:
    """The audit: one invalid sample inside a 100 s slowly drifting fixation changed 180
    vectors over 129 s (8 chunks at every alignment); events are now cut under 2 s."""
    rate = 120.0
    s = stream(["fix", "drift", "fix"], [12.0, 100.0, 12.0], rate, 2)
    i = int(60.0 * rate)
    b, tau = perturbed(s, i, "invalid", rate)
    all_t, changed = changed_stamps(s, b, rate)
    assert changed.size > 0
    check_reach(all_t, changed, tau)


def test_declared_constants_cover_every_accepted_rate() -> None:
    for rate in np.geomspace(*RATE_RANGE_HZ, 200):
        for hw in (0.001, 0.005, 0.02):
            look, reach = reach_s(float(rate), hw)
            assert look <= LOOKBEHIND_S
            assert reach <= EVENT_REACH_S
