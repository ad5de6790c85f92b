"""Frozen reference: event detection and per-step feature computation as they were before the
incremental rewrite (``main`` at 0e3eb61: ``gazeguard/signal/events.py`` EventDetector and
``gazeguard/signal/features.py`` FeatureExtractor, copied verbatim apart from the imports below).

The equivalence tests (``tests/signal/test_feature_equivalence.py``) and
``bench/bench_features_cpu.py`` compare the package's extractor against this copy: same vectors,
bit for bit, and same stats. Do not "fix" or speed up this file; it is the specification the
faster code is held to. The public data types (Events, EventKind, GazeSamples) and the feature
registry (names, bounds, defaults) are imported from the package: they are not what changed.

Amended once since (the release plan: data-independent detector parameters and bounded events,
so that one sample's reach over the events, and hence over the released features, is bounded),
in ``RefEventDetector`` only, written here on its own rather than copied from the package:

- **Declared rate.** ``rate_hz`` is required (finite, in [20, 2000] Hz; ``ConfigError`` naming
  ``rate_hz`` otherwise) and replaces the estimate from the first 17 samples (gone, and with it
  the holding back of those samples) and the ``sampling_rate_hz`` / ``max_gap_s`` hints:
  ``dt = 1/rate_hz``, ``h = max(1, floor(velocity_halfwidth_s * rate_hz + 1/2))`` computed exactly
  on the decimal values (``fractions.Fraction`` of their ``repr``), gap threshold ``4 * dt``.
- **Cuts at the grid.** A run that has lasted at least ``SPLIT_GRID_S`` (1 s) since its anchor
  (its first sample's time, or the grid point it was last cut at) is cut where it crosses a
  multiple of ``SPLIT_GRID_S``: the part before is closed with ``t_end`` = the grid point, as if a
  gap followed it; the rest goes on as a new run anchored at the grid point, as if a gap preceded
  it (``_classify``: the grid crossings are extra split points; the segment loop decides).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError, GazeguardError, StreamError
from gazeguard.core.samples import FloatArray, GazeSamples
from gazeguard.signal.events import DetectorStats, EventKind, Events
from gazeguard.signal.features import (
    BLINK_DURATION_S,
    FEATURES,
    FIXATION_DISPERSION_MAX_DEG,
    FIXATION_DURATION_MAX_S,
    LARGE_SACCADE_DEG,
    NAMES,
    PUPIL_MIN_COVERAGE,
    PUPIL_MM,
    SACCADE_AMPLITUDE_MAX_DEG,
    SACCADE_DURATION_MAX_S,
    SACCADE_PEAK_VELOCITY_MAX,
    SMALL_SACCADE_DEG,
    WORD_SPLIT_DEG,
    WORDBOOK_LETTERS,
    WORDBOOK_NS,
    FeatureStats,
    feature_bounds,
    feature_defaults,
)

IntArray = npt.NDArray[np.int64]
_WORD_STATS = ("distinct", "max", "min", "range", "mean")
_EMPTY = Events.from_rows([])


_RATE_RANGE_HZ = (20.0, 2000.0)  # declared rates accepted (amendment)
SPLIT_GRID_S = 1.0  # long runs are cut at multiples of this, s (amendment)
_QUANTUM = 1e6  # positions summed as integers of 1e-6 deg: exact, order-independent sums

# Sample classes (internal); run kinds are EventKind.
_C_UNDEF, _C_SLOW, _C_FAST, _C_INVALID = 0, 1, 2, 3


def check_timestamps(t: FloatArray, after: float | None) -> None:
    """main's check_timestamps (the package's has a fast path in front of these checks)."""
    if not np.all(np.isfinite(t)):
        raise StreamError(
            f"gaze timestamps must be finite; block of {len(t)} samples has "
            f"{int(np.count_nonzero(~np.isfinite(t)))} non-finite; drop them before this stage"
        )
    if (after is not None and t[0] <= after) or (len(t) > 1 and np.any(t[1:] <= t[:-1])):
        raise StreamError(
            "gaze timestamps must be strictly increasing across blocks; got a block starting "
            f"at t={float(t[0])!r} after t={after!r}"
            "; repair the recording (sort, drop duplicates) before feature extraction"
        )


class _Next(NamedTuple):
    """What follows a run: the next run's class and first sample (or the end of the stream)."""

    cls: int  # -1: end of stream
    gap: bool  # a gap separates the run from it
    t: float | None
    x: float
    y: float
    cut: float | None = None  # the run is cut at this grid point (its end time), s (amendment)


@dataclass(slots=True)
class _OpenRun:
    """The run still growing at the end of what has been classified so far."""

    cls: int
    start: int  # global sample index
    t_start: float
    t_last: float
    prev_cls: int  # class of the run before; -1 at stream start
    gap_before: bool  # a gap separates it from the previous sample
    x_before: float  # the previous sample's gaze (saccade launch point), NaN if none
    y_before: float
    anchor: float  # t_start, or the grid point the run was cut at (amendment)
    n: int = 0
    sx: int = 0  # sum of x, in 1e-6 deg
    sy: int = 0
    xmin: float = np.inf
    xmax: float = -np.inf
    ymin: float = np.inf
    ymax: float = -np.inf
    vmax: float = -np.inf


def _quantise(a: FloatArray) -> IntArray:
    """Degrees → integers of 1e-6 deg (clipped to ±1e5 deg so that sums cannot overflow)."""
    return np.rint(np.clip(a, -1e5, 1e5) * _QUANTUM).astype(np.int64)


def _check_positive(name: str, value: float | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or not np.isfinite(value) or value <= 0:
        raise ConfigError(name, value, "must be a finite number > 0", "argument")


class RefEventDetector:
    """Incremental I-VT fixation/saccade detector with blink detection (see the module docstring).

    Args:
        velocity_threshold_deg_s: saccade threshold on angular velocity, deg/s (default 30).
        min_fixation_s: shorter fixation candidates become UNDEFINED, s.
        min_saccade_s: shorter saccade candidates (noise blips) become UNDEFINED, s.
        min_blink_s, max_blink_s: invalid runs of this duration are blinks; others are LOSS, s.
        velocity_halfwidth_s: velocity smoothing half-width, s (h samples each side, h >= 1).
        rate_hz: the stream's declared sampling rate, Hz (amendment: required; replaces the
            estimate and the ``sampling_rate_hz`` / ``max_gap_s`` hints).
    """

    def __init__(
        self,
        *,
        rate_hz: float,
        velocity_threshold_deg_s: float = 30.0,
        min_fixation_s: float = 0.04,
        min_saccade_s: float = 0.01,
        min_blink_s: float = 0.05,
        max_blink_s: float = 0.5,
        velocity_halfwidth_s: float = 0.005,
    ) -> None:
        lo, hi = _RATE_RANGE_HZ
        try:
            rate = float(rate_hz)
        except (TypeError, ValueError):
            rate = math.nan
        if not lo <= rate <= hi:  # NaN compares False
            raise ConfigError("rate_hz", rate_hz, f"must be a declared rate in [{lo}, {hi}] Hz")
        _check_positive("velocity_threshold_deg_s", velocity_threshold_deg_s)
        _check_positive("min_fixation_s", min_fixation_s)
        _check_positive("min_saccade_s", min_saccade_s)
        _check_positive("min_blink_s", min_blink_s)
        _check_positive("max_blink_s", max_blink_s)
        _check_positive("velocity_halfwidth_s", velocity_halfwidth_s)
        if max_blink_s <= min_blink_s:
            raise ConfigError(
                "max_blink_s", max_blink_s, f"must exceed min_blink_s={min_blink_s}", "argument"
            )
        self.velocity_threshold_deg_s = float(velocity_threshold_deg_s)
        self.min_fixation_s = float(min_fixation_s)
        self.min_saccade_s = float(min_saccade_s)
        self.min_blink_s = float(min_blink_s)
        self.max_blink_s = float(max_blink_s)
        self.velocity_halfwidth_s = float(velocity_halfwidth_s)
        self.dt: float | None = 1.0 / rate  # nominal sampling interval, s
        exact = Fraction(repr(float(velocity_halfwidth_s))) * Fraction(repr(rate))
        self.h = max(1, math.floor(exact + Fraction(1, 2)))  # velocity half-width in samples
        self.max_gap_s = 4.0 * self.dt
        self.stats = DetectorStats()
        # Sample buffer: lookback (h + 1 samples) + samples not yet classified.
        cap = 1024
        self._t = np.empty(cap)
        self._xy = np.empty((cap, 2))  # gaze x, y (deg)
        self._ok = np.empty(cap, dtype=bool)
        self._n = 0  # samples in the buffer
        self._g0 = 0  # global index of buffer[0]
        self._next = 0  # buffer index of the first unclassified sample
        self._open: _OpenRun | None = None
        self._finished = False
        self.last_classified_t: float | None = None  # time of the newest classified sample, s

    # ---------------------------------------------------------------------------------------
    def push(self, block: GazeSamples) -> Events:
        """Feed the next block; return the events completed by it (possibly none).

        Raises:
            StreamError: timestamps not strictly increasing (within the block or after the last).
        """
        if self._finished:
            raise GazeguardError("EventDetector.push after finish(): create a new detector")
        n_new = len(block)
        if n_new == 0:
            return _EMPTY
        check_timestamps(block.timestamps, float(self._t[self._n - 1]) if self._n else None)
        self._append(block)
        self.stats.samples += n_new
        self.stats.invalid_samples += int(n_new - np.count_nonzero(block.valid))
        return self._classify(self._n - self.h)

    def finish(self) -> Events:
        """End of stream: classify the held samples (look-ahead missing: velocity undefined) and
        close the open run. For offline labelling; the detector accepts no more samples."""
        if self._finished:
            return _EMPTY
        events = [self._classify(self._n, final=True)]
        rows: list[tuple[float, ...]] = []
        end = _Next(cls=-1, gap=True, t=None, x=np.nan, y=np.nan)
        if self._open is not None:
            self._close(rows, self._open, end)
            self._open = None
        events.append(Events.from_rows(rows))
        self._finished = True
        return Events.concat(events)

    # ---------------------------------------------------------------------------------------
    def _append(self, block: GazeSamples) -> None:
        n_new = len(block)
        keep = self._n - self._compact_from()
        need = keep + n_new
        if self._n + n_new > self._t.shape[0]:
            drop = self._n - keep
            cap = max(self._t.shape[0], 2 * need)
            for name in ("_t", "_xy", "_ok"):
                old = getattr(self, name)
                new = np.empty((cap, *old.shape[1:]), dtype=old.dtype) if cap != len(old) else old
                new[:keep] = old[drop : self._n]
                setattr(self, name, new)
            self._g0 += drop
            self._next -= drop
            self._n = keep
        s = slice(self._n, self._n + n_new)
        self._t[s] = block.timestamps
        self._xy[s, 0] = block.x_deg
        self._xy[s, 1] = block.y_deg
        self._ok[s] = block.valid
        self._n += n_new

    def _compact_from(self) -> int:
        """First buffer index still needed: h + 1 samples of lookback before the next sample."""
        return max(0, self._next - self.h - 1)

    def _classify(self, stop: int, final: bool = False) -> Events:
        """Classify buffer samples [self._next, stop) and close the runs they complete."""
        a = self._next
        if stop <= a:
            return _EMPTY
        h, n, g = self.h, self._n, self.max_gap_s
        t, xy, ok = self._t, self._xy, self._ok
        # Context region [r0, r1) = [a - h, stop + h) within the buffer. gap[k]: the interval
        # before sample r0 + k is a dropout; c: cumulative count of gaps + invalid samples.
        r0, r1 = max(0, a - h), min(n, stop + h)
        gap = np.empty(r1 - r0, dtype=bool)
        gap[0] = r0 > 0 and t[r0] - t[r0 - 1] > g
        np.greater(t[r0 + 1 : r1] - t[r0 : r1 - 1], g, out=gap[1:])
        c = np.zeros(r1 - r0 + 1, dtype=np.int64)
        np.cumsum(gap.astype(np.int64) + ~ok[r0:r1], out=c[1:])
        cls = np.full(stop - a, _C_UNDEF, dtype=np.int8)
        v = np.full(stop - a, np.nan)
        # Samples whose whole window [i - h, i + h] lies in the region get a velocity.
        i0, i1 = max(a, r0 + h), min(stop, r1 - h)
        if i1 > i0:
            m, lo = i1 - i0, i0 - h - r0
            # Window clean iff no invalid sample in it and no gap inside it (gap[lo] is outside).
            dirty = c[lo + 2 * h + 1 : lo + 2 * h + 1 + m] - c[lo : lo + m] - gap[lo : lo + m]
            d = xy[i0 + 1 : i1 + 1] - xy[i0 - 1 : i1 - 1]
            dt = t[i0 + 1 : i1 + 1] - t[i0 - 1 : i1 - 1]
            for j in range(2, h + 1):  # loop over the h shifts, not over samples
                d += xy[i0 + j : i1 + j] - xy[i0 - j : i1 - j]
                dt += t[i0 + j : i1 + j] - t[i0 - j : i1 - j]
            vv = np.hypot(d[:, 0], d[:, 1]) / dt
            vv[dirty > 0] = np.nan
            v[i0 - a : i1 - a] = vv
            thr = self.velocity_threshold_deg_s
            cls[i0 - a : i1 - a] = (vv < thr) * np.int8(_C_SLOW) + (vv >= thr) * np.int8(_C_FAST)
        okc = ok[a:stop]
        cls[~okc] = _C_INVALID
        gap_a = gap[a - r0 : stop - r0]
        self.stats.gaps += int(np.count_nonzero(gap_a))
        # Grid points crossed between each sample and the one before it (NaN: none; the
        # stream's first sample has no sample before it).
        t_cls = t[a:stop]
        t_before = t[a - 1 : stop - 1] if a > 0 else np.concatenate(([t[0]], t[: stop - 1]))
        grid_now = np.floor(t_cls / SPLIT_GRID_S)
        crossed = np.where(grid_now > np.floor(t_before / SPLIT_GRID_S), grid_now, np.nan)
        crossed *= SPLIT_GRID_S
        # Runs: split where the class changes, at a gap or at a grid point; the segment loop
        # decides whether a segment continues the open run.
        split = (cls[1:] != cls[:-1]) | gap_a[1:] | ~np.isnan(crossed[1:])
        starts = np.flatnonzero(split) + 1
        seg_starts = np.concatenate(([0], starts))
        # Per-segment order-independent reductions (integer sums, min, max).
        pos = xy[a:stop]
        q = _quantise(np.where(okc[:, None], pos, 0.0))
        pos = np.where(okc[:, None], pos, np.nan)
        seg_q = np.add.reduceat(q, seg_starts, axis=0).tolist()
        seg_min = np.fmin.reduceat(pos, seg_starts, axis=0).tolist()
        seg_max = np.fmax.reduceat(pos, seg_starts, axis=0).tolist()
        seg_v = np.fmax.reduceat(v, seg_starts).tolist()
        seg_end = [*starts.tolist(), stop - a]
        rows: list[tuple[float, ...]] = []
        for si, s0 in enumerate(seg_starts.tolist()):  # loop over runs (events), not samples
            b = a + s0
            prev = self._open
            grid = float(crossed[s0])  # NaN unless a grid point lies just before sample b
            same = prev is not None and prev.cls == int(cls[s0]) and not gap_a[s0]
            # A run that has lasted at least SPLIT_GRID_S since its anchor is cut at the grid.
            cut = same and prev is not None and grid - prev.anchor >= SPLIT_GRID_S
            if not same or cut:
                if cut:  # closed at the grid point as if a gap followed; the rest is a new run
                    nxt = _Next(int(cls[s0]), True, grid, *xy[b].tolist(), cut=grid)
                else:
                    nxt = _Next(int(cls[s0]), bool(gap_a[s0]), float(t[b]), *xy[b].tolist())
                if prev is not None:
                    self._close(rows, prev, nxt)
                has_prev = b > 0
                self._open = _OpenRun(
                    cls=nxt.cls,
                    start=self._g0 + b,
                    t_start=float(t[b]),
                    t_last=float(t[b]),
                    prev_cls=prev.cls if prev is not None else -1,
                    gap_before=nxt.gap or prev is None,
                    x_before=float(xy[b - 1, 0]) if has_prev else np.nan,
                    y_before=float(xy[b - 1, 1]) if has_prev else np.nan,
                    anchor=grid if cut else float(t[b]),
                )
            run = self._open
            assert run is not None
            e = seg_end[si]
            run.n += e - s0
            run.t_last = float(t[a + e - 1])
            if run.cls in (_C_SLOW, _C_FAST):  # valid samples only: no NaN below
                run.sx += seg_q[si][0]
                run.sy += seg_q[si][1]
                run.xmin = min(run.xmin, seg_min[si][0])
                run.ymin = min(run.ymin, seg_min[si][1])
                run.xmax = max(run.xmax, seg_max[si][0])
                run.ymax = max(run.ymax, seg_max[si][1])
                run.vmax = max(run.vmax, seg_v[si])
        self._next = n if final else stop
        self.last_classified_t = float(t[stop - 1])
        return Events.from_rows(rows) if rows else _EMPTY

    def _t_end(self, run: _OpenRun, nxt: _Next) -> float:
        assert self.dt is not None
        if nxt.cut is not None:  # cut at a grid point (amendment)
            return nxt.cut
        return run.t_last + self.dt if (nxt.gap or nxt.t is None) else nxt.t

    def _close(self, rows: list[tuple[float, ...]], run: _OpenRun, nxt: _Next) -> None:
        """Turn a completed run into an event row (see the module docstring for the rules)."""
        t_end = self._t_end(run, nxt)
        duration = t_end - run.t_start
        nan = np.nan
        x = y = dx = dy = amp = vpk = disp = nan
        if run.cls == _C_SLOW:
            kind = EventKind.FIXATION if duration >= self.min_fixation_s else EventKind.UNDEFINED
            x, y = run.sx / _QUANTUM / run.n, run.sy / _QUANTUM / run.n
            vpk = run.vmax
            disp = (run.xmax - run.xmin) + (run.ymax - run.ymin)
        elif run.cls == _C_FAST:
            flanked = run.prev_cls == _C_SLOW and not run.gap_before
            flanked = flanked and nxt.cls == _C_SLOW and not nxt.gap
            long_enough = duration >= self.min_saccade_s
            kind = EventKind.SACCADE if flanked and long_enough else EventKind.UNDEFINED
            x, y = nxt.x, nxt.y
            dx, dy = nxt.x - run.x_before, nxt.y - run.y_before
            amp = float(np.hypot(dx, dy))
            vpk = run.vmax
        elif run.cls == _C_INVALID:
            bounded = run.prev_cls >= 0 and not run.gap_before
            bounded = bounded and not nxt.gap and nxt.t is not None
            plausible = self.min_blink_s <= duration <= self.max_blink_s
            kind = EventKind.BLINK if bounded and plausible else EventKind.LOSS
        else:
            kind = EventKind.UNDEFINED
        if kind not in (EventKind.SACCADE, EventKind.FIXATION):
            x = y = dx = dy = amp = vpk = disp = nan
        self.stats.events[kind] += 1
        rows.append(
            (
                float(kind),
                float(run.start),
                float(run.start + run.n),
                run.t_start,
                t_end,
                duration,
                x,
                y,
                dx,
                dy,
                amp,
                vpk,
                disp,
            )
        )


# --- Extraction --------------------------------------------------------------------------------
_BEHAVIOUR = np.array([f.behaviour for f in FEATURES])
# Event ring columns.
_K, _TEND, _DUR, _AMP, _DX, _DY, _VPK, _DISP, _SYM = range(9)
_EV_COLS = 9
_FIX, _SAC, _BLINK = int(EventKind.FIXATION), int(EventKind.SACCADE), int(EventKind.BLINK)
_PUPIL_Q = 1e4  # pupil summed as integers of 0.1 µm: exact, order-independent window sums
# Sample-bin columns: valid samples, pupil samples, Σ pupil, Σ pupil² (pupil in 0.1 µm).
_NV, _NP, _S1, _S2 = range(4)


class RefFeatureExtractor:
    """Turns gaze blocks into feature vectors, incrementally (see the module docstring).

    Args:
        window_s: window length W, s.
        step_s: step s between vectors, s (<= W).
        min_valid_fraction: windows with less valid data hold their behaviour features.
        hold_limit_s: a held value repeats for at most this long (s; None: ``window_s``); after
            that, and before a feature's first defined value, its public default is released.
        rate_hz: the stream's declared rate, for the default detector (amendment).
        detector: the event detector to use (default: ``EventDetector(rate_hz=rate_hz)``),
            owned afterwards.
        coalesce: hold (copies of) blocks that cannot complete a step and process them with
            the next block that can, or that enters a new step interval: the same vectors,
            returned by the same :meth:`push` calls, for fewer detector passes (small blocks).
    """

    def __init__(
        self,
        window_s: float = 30.0,
        step_s: float = 0.5,
        *,
        min_valid_fraction: float = 0.5,
        hold_limit_s: float | None = None,
        rate_hz: float | None = None,
        detector: RefEventDetector | None = None,
        coalesce: bool = True,
    ) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise ConfigError("features.window_s", window_s, "must be a finite number > 0")
        if not (math.isfinite(step_s) and 0 < step_s <= window_s):
            raise ConfigError("features.step_s", step_s, f"must be > 0 and <= window_s={window_s}")
        if not 0.0 <= min_valid_fraction <= 1.0:
            raise ConfigError("min_valid_fraction", min_valid_fraction, "must be in [0, 1]")
        hold = window_s if hold_limit_s is None else hold_limit_s
        if not (math.isfinite(hold) and hold >= 0):
            raise ConfigError(
                "features.hold_limit_s", hold_limit_s, "must be a finite number >= 0 (or unset)"
            )
        self.window_s = float(window_s)
        self.step_s = float(step_s)
        self.min_valid_fraction = float(min_valid_fraction)
        self.detector = detector if detector is not None else RefEventDetector(rate_hz=rate_hz)
        self.names = NAMES
        self.lo, self.hi, self.max_step = feature_bounds(None, self.window_s, self.step_s)
        self.default = feature_defaults(None, self.window_s, self.step_s)
        self.hold_limit_s = float(hold)
        self.stats = FeatureStats()
        self._last = self.default.copy()  # the previous vector (what a held value repeats)
        # A value may be repeated by this many consecutive steps (the last one at most
        # hold_limit_s after the step that defined it); _repeats counts the current repeats and
        # starts past the limit, so a feature without any defined value yet takes its default.
        self._max_repeats = math.floor(self.hold_limit_s / self.step_s + 1e-9)
        self._repeats = np.full(len(FEATURES), self._max_repeats + 1, dtype=np.int64)
        # Window = whole step intervals [k, k+q) plus the first r seconds of interval k+q.
        q = math.floor(self.window_s / self.step_s + 1e-9)
        r = self.window_s - q * self.step_s
        self._q = q
        self._r = r if r > 1e-9 * self.step_s else 0.0
        self._t0: float | None = None
        self._k = 0  # next step to emit
        self._ev = np.empty((256, _EV_COLS))
        self._ev_lo = self._ev_hi = 0  # live rows
        self._bins = np.zeros((64, 4), dtype=np.int64)
        self._bmin = np.full(64, np.inf)
        self._bmax = np.full(64, -np.inf)
        self._bin_base = 0  # bin id of row 0
        self._bin_top = -1  # highest bin id written
        # Coalescing: blocks that cannot complete a step wait here (copied) until one can.
        self._coalesce = coalesce
        self._held: list[GazeSamples] = []
        self._held_until = -math.inf  # a block whose last sample is at or after this is processed
        self._last_t: float | None = None  # newest timestamp accepted, s

    def push(self, block: GazeSamples) -> tuple[FloatArray, FloatArray]:
        """Feed a block; return ``X`` float64 (k, F) and ``t`` float64 (k,) for the k steps it
        completed (k may be 0). Blocks of any size give the same vectors."""
        if len(block) == 0:
            return np.empty((0, len(FEATURES))), np.empty(0)
        ts = block.timestamps
        if self._t0 is None:
            if not math.isfinite(ts[0]):
                raise StreamError(f"first gaze timestamp is {ts[0]!r}; timestamps must be finite")
            self._t0 = (
                math.floor(float(ts[0]) / self.step_s) * self.step_s
            )  # the grid (a step multiple)
        # Coalesce: a block that ends before the next possible vector and inside the step
        # interval of the held samples is only validated and held (no vector can depend on it
        # yet), so a stream of small blocks costs one detector pass per step interval or so.
        check_timestamps(ts, self._last_t)
        self._last_t = float(ts[-1])
        if self._last_t < self._held_until:
            self._held.append(GazeSamples.concat([block]))  # a copy: blocks may be borrowed
            return np.empty((0, len(FEATURES))), np.empty(0)
        if self._held:
            block = GazeSamples.concat([*self._held, block])
            ts = block.timestamps
            self._held.clear()
        xs, times = self._process(block)
        if self._coalesce:
            step = math.floor((self._last_t - self._t0) / self.step_s)
            self._held_until = min(self._edge(step + 1), self._edge(self._k + self._q, sub=True))
        return xs, times

    def _process(self, block: GazeSamples) -> tuple[FloatArray, FloatArray]:
        """Detector, bins, events and vectors for ``block`` (validated, not held)."""
        assert self._t0 is not None
        ts = block.timestamps
        # Walk the block one step interval at a time so buffers stay bounded for long blocks.
        j = np.floor((ts - self._t0) / self.step_s)
        cuts = np.flatnonzero(j[1:] != j[:-1]) + 1
        xs: list[FloatArray] = []
        times: list[float] = []
        for a, b in zip(
            [0, *cuts.tolist()], [*cuts.tolist(), len(block)], strict=True
        ):  # loop over step intervals
            piece = block.slice(a, b)
            events = self.detector.push(piece)  # validates the timestamps first
            self._bin_samples(piece)
            self._add_events(events)
            self._emit(xs, times)
        if not xs:
            return np.empty((0, len(FEATURES))), np.empty(0)
        return np.vstack(xs), np.array(times)

    # --- sample bins ---------------------------------------------------------------------------
    def _edge(self, j: float, sub: bool = False) -> float:
        """Bin edge: start of step interval ``j`` (+ r for its second half). Window k spans
        ``[edge(k), edge(k + q, sub=True))``; samples and events are compared against these
        same floats, so nothing at an edge can fall into two windows or none."""
        assert self._t0 is not None
        return self._t0 + j * self.step_s + (self._r if sub else 0.0)

    def _bin_ids(self, ts: FloatArray) -> npt.NDArray[np.int64]:
        assert self._t0 is not None
        t0, s = self._t0, self.step_s
        j = np.floor((ts - t0) / s)
        j -= ts < t0 + j * s  # the division may round across an edge: compare with the edge
        j += ts >= t0 + (j + 1) * s
        sub = ts >= t0 + j * s + self._r  # False: the first r s of the interval
        return (2 * j + sub).astype(np.int64)

    def _bin_samples(self, piece: GazeSamples) -> None:
        ids = self._bin_ids(piece.timestamps)
        top = int(ids[-1])
        if top > self._bin_top:
            self._ensure_bins(top)
        p = piece.pupil_mm
        in_range = np.isfinite(p) & (p >= PUPIL_MM[0]) & (p <= PUPIL_MM[1])
        n_pupil = int(np.count_nonzero(in_range))
        self.stats.pupil_out_of_range += int(np.count_nonzero(np.isfinite(p))) - n_pupil
        single = ids[0] == top  # the common case: the whole piece falls into one bin
        starts = np.zeros(1, np.int64) if single else _run_starts(ids)
        rows = ids[starts] - self._bin_base
        self._bins[rows, _NV] += np.add.reduceat(piece.valid, starts, dtype=np.int64)
        if n_pupil == 0:
            return
        pq = np.rint(np.where(in_range, p, 0.0) * _PUPIL_Q).astype(np.int64)
        self._bins[rows, _NP] += np.add.reduceat(in_range, starts, dtype=np.int64)
        self._bins[rows, _S1] += np.add.reduceat(pq, starts)
        self._bins[rows, _S2] += np.add.reduceat(pq * pq, starts)
        pn = np.where(in_range, p, np.nan)
        self._bmin[rows] = np.fmin(self._bmin[rows], np.fmin.reduceat(pn, starts))
        self._bmax[rows] = np.fmax(self._bmax[rows], np.fmax.reduceat(pn, starts))

    def _ensure_bins(self, top: int) -> None:
        """Make rows for bin ids up to ``top``, dropping bins older than the next window."""
        keep_from = 2 * self._k  # first bin of the oldest window not yet emitted
        shift = max(0, keep_from - self._bin_base)
        need = top - (self._bin_base + shift) + 1
        cap = self._bins.shape[0]
        if shift or need > cap:
            live = max(0, self._bin_top - (self._bin_base + shift) + 1)
            new_cap = max(cap, 2 * need)
            bins = np.zeros((new_cap, 4), dtype=np.int64)
            bmin = np.full(new_cap, np.inf)
            bmax = np.full(new_cap, -np.inf)
            if live:
                bins[:live] = self._bins[shift : shift + live]
                bmin[:live] = self._bmin[shift : shift + live]
                bmax[:live] = self._bmax[shift : shift + live]
            self._bins, self._bmin, self._bmax = bins, bmin, bmax
            self._bin_base += shift
        self._bin_top = top

    # --- event ring ----------------------------------------------------------------------------
    def _add_events(self, ev: Events) -> None:
        if len(ev) == 0:
            return
        keep = (ev.kind == _FIX) | (ev.kind == _SAC) | (ev.kind == _BLINK)
        n = int(np.count_nonzero(keep))
        if n == 0:
            return
        kind = ev.kind[keep]
        sac = kind == _SAC
        # Per-event values clipped to their plausible ranges before any aggregation.
        dur_hi = np.where(kind == _FIX, FIXATION_DURATION_MAX_S, SACCADE_DURATION_MAX_S)
        dur_hi[kind == _BLINK] = BLINK_DURATION_S[1]
        amp = np.minimum(ev.amplitude[keep], SACCADE_AMPLITUDE_MAX_DEG)
        theta = np.degrees(np.arctan2(ev.dy[keep], ev.dx[keep]))  # NaN for non-saccades
        sector8 = np.floor((np.where(sac, theta, 0.0) + 22.5) / 45.0) % 8
        rows = np.empty((n, _EV_COLS))
        rows[:, _K] = kind
        rows[:, _TEND] = ev.t_end[keep]
        rows[:, _DUR] = np.minimum(ev.duration[keep], dur_hi)
        rows[:, _AMP] = amp
        rows[:, _DX] = ev.dx[keep]
        rows[:, _DY] = ev.dy[keep]
        rows[:, _VPK] = np.minimum(ev.peak_velocity[keep], SACCADE_PEAK_VELOCITY_MAX)
        rows[:, _DISP] = np.minimum(ev.dispersion[keep], FIXATION_DISPERSION_MAX_DEG)
        rows[:, _SYM] = sector8 + 8 * (np.where(sac, amp, 0.0) >= WORD_SPLIT_DEG)
        # Append, compacting the ring when full.
        if self._ev_hi + n > self._ev.shape[0]:
            live = self._ev_hi - self._ev_lo
            cap = max(self._ev.shape[0], 2 * (live + n))
            new = np.empty((cap, _EV_COLS))
            new[:live] = self._ev[self._ev_lo : self._ev_hi]
            self._ev, self._ev_lo, self._ev_hi = new, 0, live
        self._ev[self._ev_hi : self._ev_hi + n] = rows
        self._ev_hi += n

    # --- steps ---------------------------------------------------------------------------------
    def _emit(self, xs: list[FloatArray], times: list[float]) -> None:
        t_done = self.detector.last_classified_t
        if t_done is None or self._t0 is None:
            return
        while True:
            start = self._edge(self._k)
            end = self._edge(self._k + self._q, sub=True)
            if t_done < end:
                return
            xs.append(self._vector(start, end)[None, :])
            times.append(end)
            self._k += 1

    def _vector(self, start: float, end: float) -> FloatArray:
        """The clipped, hold-filled feature vector of window [start, end)."""
        dt = self.detector.dt
        assert dt is not None
        w = self.window_s
        # Drop events that ended before this window, then take those ending inside it.
        tend = self._ev[self._ev_lo : self._ev_hi, _TEND]
        self._ev_lo += int(np.searchsorted(tend, start, side="left"))
        tend = self._ev[self._ev_lo : self._ev_hi, _TEND]
        ev = self._ev[self._ev_lo : self._ev_lo + int(np.searchsorted(tend, end, side="left"))]
        b0 = 2 * self._k - self._bin_base
        b1 = b0 + 2 * self._q + (1 if self._r > 0 else 0)
        b1 = min(b1, self._bin_top - self._bin_base + 1)
        sums = self._bins[b0:b1].sum(axis=0)
        valid_fraction = min(1.0, float(sums[_NV]) * dt / w)
        v = _window_values(ev, w)
        if sums[_NP] * dt >= PUPIL_MIN_COVERAGE * w:
            n = float(sums[_NP])
            s1, s2 = float(sums[_S1]), float(sums[_S2])  # exact: below 2**53
            v["pupil_mean"] = s1 / n / _PUPIL_Q
            v["pupil_var"] = max(0.0, (s2 - s1 * s1 / n) / n) / _PUPIL_Q**2
            v["pupil_min"] = float(self._bmin[b0:b1].min())
            v["pupil_max"] = float(self._bmax[b0:b1].max())
        else:
            v["pupil_mean"] = v["pupil_var"] = v["pupil_min"] = v["pupil_max"] = math.nan
        v["valid_fraction"] = valid_fraction
        raw = np.array([v[name] for name in NAMES])
        held = np.isnan(raw)
        if valid_fraction < self.min_valid_fraction:
            held |= _BEHAVIOUR
            self.stats.low_quality_windows += 1
        self._repeats = np.where(held, np.minimum(self._repeats + 1, self._max_repeats + 1), 0)
        repeat = held & (self._repeats <= self._max_repeats)
        x = np.where(repeat, self._last, np.where(held, self.default, raw))
        out = np.minimum(np.maximum(x, self.lo), self.hi)
        self.stats.held_values += int(np.count_nonzero(repeat))
        self.stats.defaulted_values += int(np.count_nonzero(held & ~repeat))
        self.stats.clipped_values += int(np.count_nonzero(out != x))
        self.stats.steps += 1
        self._last = out
        return out


def _run_starts(ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Start index of each run of equal values in a sorted array."""
    return np.concatenate(([0], np.flatnonzero(ids[1:] != ids[:-1]) + 1))


def _window_values(ev: FloatArray, w: float) -> dict[str, float]:
    """Event statistics of one window (rows of the event ring); NaN where undefined."""
    v = dict.fromkeys(NAMES, math.nan)
    kind = ev[:, _K]
    fix = ev[kind == _FIX]
    sac = ev[kind == _SAC]
    blk = ev[kind == _BLINK]
    nf, ns, nb = len(fix), len(sac), len(blk)
    v["fixation_rate"], v["saccade_rate"], v["blink_rate"] = nf / w, ns / w, nb / w
    if nf:
        d = fix[:, _DUR]
        v["fixation_duration_mean"] = float(d.mean())
        v["fixation_duration_var"] = float(d.var())
        v["fixation_duration_max"] = float(d.max())
        v["fixation_dispersion_mean"] = float(fix[:, _DISP].mean())
        v["saccade_fixation_ratio"] = ns / nf
    if ns:
        amp = sac[:, _AMP]
        theta = np.degrees(np.arctan2(sac[:, _DY], sac[:, _DX]))  # (-180, 180], 0 = right
        v |= {
            "saccade_amplitude_mean": float(amp.mean()),
            "saccade_amplitude_var": float(amp.var()),
            "saccade_amplitude_max": float(amp.max()),
            "saccade_peak_velocity_mean": float(sac[:, _VPK].mean()),
            "saccade_peak_velocity_max": float(sac[:, _VPK].max()),
            "saccade_duration_mean": float(sac[:, _DUR].mean()),
            "saccade_small_ratio": float(np.mean(amp < SMALL_SACCADE_DEG)),
            "saccade_large_ratio": float(np.mean(amp >= LARGE_SACCADE_DEG)),
            "saccade_right_ratio": float(np.mean((theta > -45) & (theta <= 45))),
            "saccade_up_ratio": float(np.mean((theta > 45) & (theta <= 135))),
            "saccade_left_ratio": float(np.mean((theta > 135) | (theta <= -135))),
            "saccade_down_ratio": float(np.mean((theta > -135) & (theta <= -45))),
            "saccade_diagonal_ratio": float(np.mean(sac[:, _SYM] % 2 == 1)),
        }
    if nb:
        v["blink_duration_mean"] = float(blk[:, _DUR].mean())
        v["blink_duration_var"] = float(blk[:, _DUR].var())
    sym = sac[:, _SYM].astype(np.int64)
    for n in WORDBOOK_NS:
        p = f"wordbook{n}"
        if ns < n:  # an empty wordbook is defined: all its statistics are 0
            v |= dict.fromkeys((f"{p}_{stat}" for stat in _WORD_STATS), 0.0)
            continue
        codes = np.zeros(ns - n + 1, dtype=np.int64)
        for j in range(n):  # n-gram code: base-16 digits of consecutive letters
            codes = codes * WORDBOOK_LETTERS + sym[j : ns - n + 1 + j]
        _, counts = np.unique(codes, return_counts=True)
        c = counts.astype(np.float64)
        v |= {
            f"{p}_distinct": float(c.size),
            f"{p}_max": float(c.max()),
            f"{p}_min": float(c.min()),
            f"{p}_range": float(c.max() - c.min()),
            f"{p}_mean": float(c.mean()),
        }
    return v


def ref_extract_features(
    timestamps: npt.ArrayLike,
    gaze_x_deg: npt.ArrayLike,
    gaze_y_deg: npt.ArrayLike,
    pupil_mm: npt.ArrayLike | None = None,
    window_s: float = 30.0,
    step_s: float = 0.5,
    *,
    min_valid_fraction: float = 0.5,
    hold_limit_s: float | None = None,
    detector: RefEventDetector | None = None,
) -> tuple[FloatArray, FloatArray]:
    """The reference's extract_features: one push of the whole recording."""
    fx = RefFeatureExtractor(
        window_s,
        step_s,
        min_valid_fraction=min_valid_fraction,
        hold_limit_s=hold_limit_s,
        detector=detector,
    )
    return fx.push(GazeSamples.from_arrays(timestamps, gaze_x_deg, gaze_y_deg, pupil_mm))
