"""Event detection: fixations, saccades and blinks from the gaze sample stream, incrementally.

The detector is an I-VT (velocity-threshold identification, Salvucci & Goldberg 2000) on angular
velocity, plus blink detection from runs of invalid samples. It is fed blocks of
:class:`~gazeguard.core.samples.GazeSamples` as they are pulled from the stream and carries its
state
between blocks, so that the events of a recording do not depend on how it was cut into blocks.

Per sample (all vectorised with shifted slices and masks; Python loops run over events only):

1. **Declared rate.** The nominal interval ``dt = 1/rate_hz``, the velocity half-width ``h`` and
   the gap threshold ``max_gap_s = 4·dt`` come from the stream's *declared* rate (LSL
   ``nominal_srate``, a preset or a setting), never from measured intervals: a detector whose
   parameters depended on the samples would let one timestamp change every event of a stream.
   The rate must lie in :data:`RATE_RANGE_HZ`.
2. **Velocity** (deg/s), smoothed over ``h = max(1, ⌊velocity_halfwidth_s·rate_hz + ½⌋)`` samples
   each side (computed exactly on the decimal values: the same ``h`` on every machine), as in
   Engbert's "smooth" differentiator generalised to h samples::

       v_i = |sum_j (p[i+j] - p[i-j])| / sum_j (t[i+j] - t[i-j]),   j = 1..h,  p = (x, y) deg

   ``x``/``y`` are gaze angles in degrees, so the Euclidean distance is the angular distance up to
   small-angle error. ``v_i`` is undefined if any sample in ``[i-h, i+h]`` is invalid or if the
   neighbourhood spans a time gap (an interval longer than ``max_gap_s``): a stream dropout is never
   read as a fast eye movement. With the default 5 ms half-width, h is 1 up to 300 Hz, 3 at 500 Hz,
   5 at 1000 Hz and 6 at 1200 Hz; a sample is classified once its h look-ahead samples arrived.
3. **Class per sample:** invalid (blink candidate), velocity undefined, below the threshold
   (fixation candidate) or at/above it (saccade candidate).
4. **Runs** of one class, also split at every time gap, become events when the next run starts:

   - fixation candidate lasting at least ``min_fixation_s`` → ``FIXATION``, else ``UNDEFINED``;
   - saccade candidate lasting at least ``min_saccade_s``, directly between two
     fixation-candidate runs with no gap → ``SACCADE`` (amplitude from the last sample before to
     the first sample after the run); a shorter one (a noise blip) or one that touches invalid
     data or a gap (e.g. eyelid artefacts at a blink) → ``UNDEFINED``;
   - invalid run between valid samples, with no gap, lasting ``min_blink_s..max_blink_s`` →
     ``BLINK``; shorter, longer or gap-adjacent invalid runs → ``LOSS`` (data loss, not a blink);
   - runs of undefined velocity → ``UNDEFINED``.

5. **Bounded events.** A run that has lasted at least :data:`SPLIT_GRID_S` since its start (or
   since its last cut) is cut at every multiple of :data:`SPLIT_GRID_S` of stream time it
   crosses: the part before the cut is closed as an event of its own (``t_end`` = the cut time;
   treated as followed by a gap: a cut fast run is ``UNDEFINED``, a cut invalid run ``LOSS``) and
   the rest continues as a new run (treated as preceded by a gap). Every event is therefore
   shorter than ``2·SPLIT_GRID_S`` and, more importantly, the cuts do not depend on anything
   more than ``2·SPLIT_GRID_S`` in the past: a cut at grid point ``b`` happens whenever the run
   continued across ``b − SPLIT_GRID_S`` too.

**How far one sample reaches** (the detector's part of the raw-gaze unit of privacy). Changing,
adding or removing one sample at time τ (or moving its timestamp by less than the gap threshold)
changes only events that end in ``(τ − A, τ + E]`` with ``A = (h + 1)·max_gap_s`` (velocity
look-behind) and ``E = 2·SPLIT_GRID_S + (h + 2)·max_gap_s`` (the run it joins or splits ends at
the second grid point after its changed samples at the latest; every later cut happens either
way). Over :data:`RATE_RANGE_HZ` these are at most :data:`LOOKBEHIND_S` and
:data:`EVENT_REACH_S`, the constants the release plan declares
(``tests/plan/test_reach.py`` perturbs single samples of adversarial streams — long
drifting fixations, blink storms, NaN runs — and checks it).

Event times: ``t_start`` is the first sample's time, ``t_end`` the next run's first sample time
(``last sample + dt`` when a gap follows); ``duration = t_end - t_start`` (s).

Cost: per block, the vectorised steps are a few dozen numpy calls on its samples, and for the
small blocks of a live stream their per-call overhead, not the arithmetic, is most of it; a
worker holding many streams runs the same pass compiled instead (``kernels``,
:mod:`gazeguard.signal.compiled`).

Determinism: run statistics use only order-independent reductions (min, max, integer sums of
positions quantised to 1e-6 deg), so the events are bit-identical however the stream is split.
Sample-level labels (for validation) come from :func:`sample_labels` or :func:`detect_events`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError, GazeguardError, StreamError
from gazeguard.core.samples import FloatArray, GazeSamples
from gazeguard.signal import compiled

__all__ = [
    "EVENT_REACH_S",
    "LOOKBEHIND_S",
    "RATE_RANGE_HZ",
    "SPLIT_GRID_S",
    "DetectorStats",
    "EventDetector",
    "EventKind",
    "Events",
    "detect_events",
    "sample_labels",
]

IntArray = npt.NDArray[np.int64]
Row = tuple[float, ...]  # one event: the fields of Events.from_rows, in order
Int8Array = npt.NDArray[np.int8]

_QUANTUM = 1e6  # positions summed as integers of 1e-6 deg: exact, order-independent sums

#: Declared sampling rates the detector accepts, Hz (the reach bounds below hold over it).
RATE_RANGE_HZ = (20.0, 2000.0)
#: Runs are cut at multiples of this many seconds of stream time (module docstring, step 5).
SPLIT_GRID_S = 1.0
#: Longest velocity half-width accepted, s (the reach bounds below hold up to it).
MAX_HALFWIDTH_S = 0.02
#: Declared look-behind: a changed sample changes no event that ended more than this before it, s.
LOOKBEHIND_S = 0.5
#: Declared event reach: a changed sample changes no event that ends more than this after it, s.
EVENT_REACH_S = 3.0
#: Intervals longer than this many nominal intervals are dropouts (gaps).
GAP_INTERVALS = 4

# Sample classes (internal); run kinds are EventKind.
_C_UNDEF, _C_SLOW, _C_FAST, _C_INVALID = 0, 1, 2, 3


class EventKind(IntEnum):
    """What a run of samples was: the value of :attr:`Events.kind` and of sample labels."""

    UNDEFINED = 0
    FIXATION = 1
    SACCADE = 2
    BLINK = 3
    LOSS = 4


_K_UNDEFINED, _K_FIXATION, _K_SACCADE, _K_BLINK, _K_LOSS = EventKind  # no class lookups per event
_KINDS = tuple(EventKind)

_EVENT_FIELDS = (
    "t_start",
    "t_end",
    "duration",
    "x",
    "y",
    "dx",
    "dy",
    "amplitude",
    "peak_velocity",
    "dispersion",
)


@dataclass(frozen=True, slots=True)
class Events:
    """A batch of E completed events in time order; every array has shape (E,).

    Attributes:
        kind: :class:`EventKind` values (int8).
        start, stop: global sample indices of the run, ``stop`` exclusive (int64).
        t_start, t_end, duration: s (see the module docstring for the definitions).
        x, y: fixation centroid (mean gaze), deg; for saccades the landing point; NaN otherwise.
        dx, dy: saccade displacement (landing minus launch point), deg; NaN for other kinds.
        amplitude: saccade amplitude ``hypot(dx, dy)``, deg; NaN for other kinds.
        peak_velocity: largest sample velocity in a fixation or saccade, deg/s; NaN otherwise.
        dispersion: fixation dispersion ``(max x - min x) + (max y - min y)``, deg; NaN otherwise.
    """

    kind: Int8Array
    start: IntArray
    stop: IntArray
    t_start: FloatArray
    t_end: FloatArray
    duration: FloatArray
    x: FloatArray
    y: FloatArray
    dx: FloatArray
    dy: FloatArray
    amplitude: FloatArray
    peak_velocity: FloatArray
    dispersion: FloatArray

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    @classmethod
    def from_rows(cls, rows: list[Row]) -> Events:
        """Build from rows ``(kind, start, stop, t_start, t_end, duration, x, y, dx, dy,
        amplitude, peak_velocity, dispersion)``."""
        a = np.array(rows, dtype=np.float64).reshape(len(rows), 3 + len(_EVENT_FIELDS))
        cols = {name: np.ascontiguousarray(a[:, 3 + i]) for i, name in enumerate(_EVENT_FIELDS)}
        return cls(
            kind=a[:, 0].astype(np.int8),
            start=a[:, 1].astype(np.int64),
            stop=a[:, 2].astype(np.int64),
            **cols,
        )

    @classmethod
    def concat(cls, parts: list[Events]) -> Events:
        """Concatenate batches (in order)."""
        if not parts:
            return _EMPTY
        return cls(
            **{
                name: np.concatenate([getattr(p, name) for p in parts])
                for name in ("kind", "start", "stop", *_EVENT_FIELDS)
            }
        )


_EMPTY = Events.from_rows([])


@dataclass(slots=True)
class DetectorStats:
    """Counters of an :class:`EventDetector` (read them, don't write them)."""

    samples: int = 0
    invalid_samples: int = 0
    gaps: int = 0  # intervals longer than max_gap_s (stream dropouts)
    events: dict[EventKind, int] = field(default_factory=lambda: dict.fromkeys(EventKind, 0))


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
    anchor: float  # cuts happen at grid points at least SPLIT_GRID_S after it (t_start or a cut)
    n: int = 0
    sx: int = 0  # sum of x, in 1e-6 deg
    sy: int = 0
    xmin: float = np.inf
    xmax: float = -np.inf
    ymin: float = np.inf
    ymax: float = -np.inf
    vmax: float = -np.inf


class _Segments(NamedTuple):
    """Runs of equal class (split at gaps) in the samples classified by one pass; positions
    are relative to the pass's first sample; one entry per segment in each list."""

    starts: list[int]
    ends: list[int]  # exclusive
    cls: list[int]
    gap_before: list[bool]  # a gap separates the segment from the sample before it
    cell: list[float]  # grid cell of its first sample; NaN: the sample before is in the same
    q: list[list[int]]  # [Σx, Σy] in 1e-6 deg (valid samples)
    lo: list[list[float]]  # [min x, min y], deg (NaN: no valid sample)
    hi: list[list[float]]  # [max x, max y], deg
    vmax: list[float]  # largest velocity, deg/s (NaN: none defined)


def _quantise(a: FloatArray) -> IntArray:
    """Degrees → integers of 1e-6 deg (clipped to ±1e5 deg so that sums cannot overflow)."""
    q = np.maximum(a, -1e5)  # np.clip's result, without its Python-level wrapper
    np.minimum(q, 1e5, out=q)
    q *= _QUANTUM
    return np.rint(q, out=q).astype(np.int64)


def _cells(t: FloatArray, a: int, stop: int) -> FloatArray:
    """Per sample ``a .. stop - 1`` of ``t``: the grid point (s, a multiple of
    :data:`SPLIT_GRID_S`) crossed since the sample before it, NaN where none was (or for the
    stream's first sample)."""
    c0 = a - 1 if a else 0
    cell = np.floor(t[c0:stop] / SPLIT_GRID_S)
    out = np.full(stop - a, np.nan)
    crossed = cell[1:] != cell[:-1]
    tail = out[1:] if not a else out
    tail[crossed] = cell[1:][crossed] * SPLIT_GRID_S
    return out


def _check_positive(name: str, value: float | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or not np.isfinite(value) or value <= 0:
        raise ConfigError(name, value, "must be a finite number > 0", "argument")


def _exact(value: float) -> Fraction:
    """A parameter at its shortest decimal value (0.005 is 1/200), as a configuration states it."""
    return Fraction(repr(float(value)))


def half_width(rate_hz: float, velocity_halfwidth_s: float) -> int:
    """The velocity half-width in samples, ``max(1, ⌊halfwidth·rate + ½⌋)``, computed exactly on
    the parameters' decimal values (``300 Hz × 5 ms = 1.5`` gives 2 on every machine)."""
    x = _exact(velocity_halfwidth_s) * _exact(rate_hz)
    return max(1, math.floor(x + Fraction(1, 2)))


def reach_s(rate_hz: float, velocity_halfwidth_s: float = 0.005) -> tuple[float, float]:
    """``(A, E)``: a changed sample at τ changes only events ending in ``(τ − A, τ + E]``, s
    (module docstring), for a detector at this declared rate and half-width."""
    h = half_width(rate_hz, velocity_halfwidth_s)
    g = GAP_INTERVALS / float(rate_hz)
    return (h + 1) * g, 2.0 * SPLIT_GRID_S + (h + 2) * g


def check_rate(rate_hz: object, field: str = "rate_hz") -> float:
    """The declared sampling rate, validated (finite, within :data:`RATE_RANGE_HZ`), Hz.

    Raises:
        ConfigError: naming ``field``, the value, and what to do.
    """
    lo, hi = RATE_RANGE_HZ
    try:
        r = float(rate_hz)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        r = math.nan
    if not (math.isfinite(r) and lo <= r <= hi):
        raise ConfigError(
            field,
            rate_hz,
            f"the stream's declared (nominal) sampling rate must be a number of Hz in "
            f"[{lo:g}, {hi:g}]; the event detector's parameters come from it, never from the "
            "measured timestamps",
        )
    return r


def check_timestamps(t: FloatArray, after: float | None) -> None:
    """Refuse a block whose timestamps ``t`` (s, shape (N,), N >= 1) are not finite or not
    strictly increasing, within the block and after ``after`` (the previous block's last).

    Raises:
        StreamError: naming the problem and the times involved.
    """
    # Fast path (one comparison over the block): strictly increasing between finite ends
    # implies finite throughout (a NaN compares False); anything else falls through to the
    # checks that name it.
    first, last = float(t[0]), float(t[-1])
    n = len(t)
    if (
        math.isfinite(first)
        and math.isfinite(last)
        and (after is None or first > after)
        and (n == 1 or np.count_nonzero(t[1:] > t[:-1]) == n - 1)
    ):
        return
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


class EventDetector:
    """Incremental I-VT fixation/saccade detector with blink detection (see the module docstring).

    Args:
        velocity_threshold_deg_s: saccade threshold on angular velocity, deg/s (default 30).
        min_fixation_s: shorter fixation candidates become UNDEFINED, s.
        min_saccade_s: shorter saccade candidates (noise blips) become UNDEFINED, s.
        min_blink_s, max_blink_s: invalid runs of this duration are blinks; others are LOSS, s.
        velocity_halfwidth_s: velocity smoothing half-width, s (h samples each side, h >= 1;
            at most :data:`MAX_HALFWIDTH_S`).
        rate_hz: the stream's declared sampling rate, Hz (:data:`RATE_RANGE_HZ`): the nominal
            interval ``dt = 1/rate_hz``, ``h`` and the gap threshold ``4·dt`` come from it.
        kernels: the compiled passes to classify with
            (:func:`gazeguard.signal.compiled.load_kernels`; the same rows bit for bit, less CPU
            per small block), or ``None``: numpy, the reference.
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
        kernels: compiled.Kernels | None = None,
    ) -> None:
        rate = check_rate(rate_hz)
        _check_positive("velocity_threshold_deg_s", velocity_threshold_deg_s)
        _check_positive("min_fixation_s", min_fixation_s)
        _check_positive("min_saccade_s", min_saccade_s)
        _check_positive("min_blink_s", min_blink_s)
        _check_positive("max_blink_s", max_blink_s)
        _check_positive("velocity_halfwidth_s", velocity_halfwidth_s)
        if velocity_halfwidth_s > MAX_HALFWIDTH_S:
            raise ConfigError(
                "velocity_halfwidth_s", velocity_halfwidth_s,
                f"must be at most {MAX_HALFWIDTH_S:g} s (the declared reach holds up to it)",
                "argument",
            )  # fmt: skip
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
        self.rate_hz = rate
        self.kernels = kernels  # the compiled passes (None: numpy)
        self.dt = 1.0 / rate  # nominal sampling interval, s
        self.h = half_width(rate, velocity_halfwidth_s)  # velocity half-width, samples
        self.max_gap_s = GAP_INTERVALS * self.dt
        # The declared reach covers this detector (RATE_RANGE_HZ, MAX_HALFWIDTH_S: always).
        look, span = reach_s(rate, velocity_halfwidth_s)
        assert look <= LOOKBEHIND_S, look
        assert span <= EVENT_REACH_S, span
        self._limits = np.array([min_fixation_s, min_saccade_s, min_blink_s, max_blink_s], float)
        self.stats = DetectorStats()
        # Sample buffer: lookback (h + 1 samples) + samples not yet classified.
        cap = 1024
        self._t = np.empty(cap)
        self._xy = np.empty((cap, 2))  # gaze x, y (deg)
        self._ok = np.empty(cap, dtype=bool)
        self._n = 0  # samples in the buffer
        self._g0 = 0  # global index of buffer[0]
        self._next = 0  # buffer index of the first unclassified sample
        self._last_invalid = -1  # global index of the newest invalid sample (-1: none yet)
        self._open: _OpenRun | None = None  # numpy; the compiled pass keeps it packed:
        self._ri = np.zeros(compiled.RUN_I, dtype=np.int64)  # (ri[0] = 1: a run is open)
        self._rf = np.empty(compiled.RUN_F)
        self._counts = np.zeros(6, dtype=np.int64)  # the compiled pass's gaps, events by kind
        self._finished = False
        self.last_classified_t: float | None = None  # time of the newest classified sample, s

    # ---------------------------------------------------------------------------------------
    def push(self, block: GazeSamples) -> Events:
        """Feed the next block; return the events completed by it (possibly none).

        Raises:
            StreamError: timestamps not strictly increasing (within the block or after the last).
        """
        rows = self._push_rows(block)
        return Events.from_rows(rows) if rows else _EMPTY

    def _push_rows(self, block: GazeSamples, checked: bool = False) -> list[Row]:
        """:meth:`push`, returning the completed events as rows (the fields of
        :meth:`Events.from_rows`, in order): what
        :class:`~gazeguard.signal.features.FeatureExtractor`
        consumes, without building arrays for a few events. ``checked``: the caller has already
        validated the block's timestamps (finite, strictly increasing) against its own newest
        sample; only their order after this detector's newest sample is checked again."""
        if self._finished:
            raise GazeguardError("EventDetector.push after finish(): create a new detector")
        n_new = len(block)
        if n_new == 0:
            return []
        ts = block.timestamps
        if self._n:
            after: float | None = float(self._t[self._n - 1])
            if not checked or not ts[0] > after:
                check_timestamps(ts, after)
        elif not checked:
            check_timestamps(ts, None)
        self._append(block)
        stats = self.stats
        stats.samples += n_new
        valid = block.valid
        n_valid = int(np.count_nonzero(valid))
        if n_valid < n_new:
            stats.invalid_samples += n_new - n_valid
            self._last_invalid = self._g0 + self._n - n_new + int(np.flatnonzero(~valid)[-1])
        return self._classify(self._n - self.h)

    def finish(self) -> Events:
        """End of stream, or of the samples before a gap: classify the held samples (look-ahead
        missing: velocity undefined) and close the open run. The detector accepts no more
        samples; :meth:`resumed` continues after a gap."""
        return Events.from_rows(self._finish_rows())

    def _finish_rows(self) -> list[Row]:
        """:meth:`finish`, returning the events as rows (see :meth:`_push_rows`)."""
        if self._finished:
            return []
        rows = self._classify(self._n, final=True)
        run = self._open_run()
        if run is not None:  # the end of the stream follows it
            self._close(rows, run, -1, True, None, np.nan, np.nan)
            self._open = None
        self._finished = True
        return rows

    @property
    def finished(self) -> bool:
        """:meth:`finish` was called: :meth:`resumed` continues the stream."""
        return self._finished

    @property
    def newest_t(self) -> float | None:
        """Timestamp of the newest sample pushed, s (None before the first)."""
        return float(self._t[self._n - 1]) if self._n else None

    def resumed(self, next_t: float) -> EventDetector:
        """A detector that continues this finished one after a gap (an interval longer than
        ``max_gap_s``) before its first sample, at ``next_t`` (s): the same events as if this
        one had gone on, because nothing crosses a gap (the look-ahead, the open run and the
        long-run cuts all stop at one). Sample numbering, counters and the newest invalid
        sample carry over; everything before ``next_t`` counts as classified."""
        if not self._finished:
            raise GazeguardError("EventDetector.resumed: finish() it first")
        new = EventDetector(
            rate_hz=self.rate_hz,
            velocity_threshold_deg_s=self.velocity_threshold_deg_s,
            min_fixation_s=self.min_fixation_s,
            min_saccade_s=self.min_saccade_s,
            min_blink_s=self.min_blink_s,
            max_blink_s=self.max_blink_s,
            velocity_halfwidth_s=self.velocity_halfwidth_s,
            kernels=self.kernels,
        )
        new.stats = self.stats
        new.stats.gaps += 1  # the interval before next_t
        new._g0 = self._g0 + self._n
        new._last_invalid = self._last_invalid
        new.last_classified_t = next_t
        return new

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

    def _classify(self, stop: int, final: bool = False) -> list[Row]:  # noqa: PLR0915 - numeric: one pass's vectorised classification, read top to bottom
        """Classify buffer samples [self._next, stop) and close the runs they complete."""
        a = self._next
        if stop <= a:
            return []
        if self.kernels is not None:
            return self._classify_compiled(self.kernels.ivt_pass, stop, final)
        h, n, g = self.h, self._n, self.max_gap_s
        t, xy, ok = self._t, self._xy, self._ok
        # Context region [r0, r1) = [a - h, stop + h) within the buffer. "clean": no invalid
        # sample in it (none since global index g0 + r0) and no gap (an interval longer than g)
        # before any of its samples, the one before r0 included: the common case, which skips
        # the masking below. gap[k] (not clean only): the interval before sample r0 + k is one.
        r0, r1 = max(0, a - h), min(n, stop + h)
        m_all = stop - a
        e0 = r0 - 1 if r0 else 0
        clean = self._last_invalid < self._g0 + r0 and (
            r1 - e0 < 2 or not float(np.maximum.reduce(t[e0 + 1 : r1] - t[e0 : r1 - 1])) > g
        )
        if not clean:
            gap = np.empty(r1 - r0, dtype=bool)
            gap[0] = r0 > 0 and float(t[r0]) - float(t[r0 - 1]) > g
            np.greater(t[r0 + 1 : r1] - t[r0 : r1 - 1], g, out=gap[1:])
        # Samples whose whole window [i - h, i + h] lies in the region get a velocity (in a
        # stream: all of them; the others are undefined, 0, with velocity NaN).
        i0, i1 = max(a, r0 + h), min(stop, r1 - h)
        whole = i0 == a and i1 == stop
        if not whole:
            cls = np.zeros(m_all, dtype=np.int8)  # _C_UNDEF
            v = np.full(m_all, np.nan)
        if i1 > i0:
            d = xy[i0 + 1 : i1 + 1] - xy[i0 - 1 : i1 - 1]
            dt = t[i0 + 1 : i1 + 1] - t[i0 - 1 : i1 - 1]
            for j in range(2, h + 1):  # loop over the h shifts, not over samples
                d += xy[i0 + j : i1 + j] - xy[i0 - j : i1 - j]
                dt += t[i0 + j : i1 + j] - t[i0 - j : i1 - j]
            vv = np.hypot(d[:, 0], d[:, 1])
            vv /= dt
            if not clean:
                # Window clean iff no invalid sample in it and no gap inside it (gap[lo], the
                # interval before its first sample, is outside). c: cumulative count of gaps +
                # invalid samples over the region.
                c = np.zeros(r1 - r0 + 1, dtype=np.int64)
                np.cumsum(gap.astype(np.int64) + ~ok[r0:r1], out=c[1:])
                m, lo = i1 - i0, i0 - h - r0
                dirty = c[lo + 2 * h + 1 : lo + 2 * h + 1 + m] - c[lo : lo + m] - gap[lo : lo + m]
                vv[dirty > 0] = np.nan
            # below the threshold: slow (1); at or above: fast (2); NaN: undefined (0)
            fast = vv >= self.velocity_threshold_deg_s
            if whole:
                v = vv
                cls = np.add(fast, np.equal(vv, vv), dtype=np.int8)
            else:
                v[i0 - a : i1 - a] = vv
                np.add(fast, np.equal(vv, vv), out=cls[i0 - a : i1 - a], dtype=np.int8)
        pos = xy[a:stop]
        if not clean:
            okc = ok[a:stop]
            gap_a = gap[a - r0 : stop - r0]
            cls[~okc] = _C_INVALID
            self.stats.gaps += int(np.count_nonzero(gap_a))
            q = _quantise(np.where(okc[:, None], pos, 0.0))
            pos = np.where(okc[:, None], pos, np.nan)
        else:
            q = _quantise(pos)
        # Runs: split where the class changes or at a gap; segment 0 may continue the open run.
        split = np.empty(m_all, dtype=bool)  # split[i]: a run starts at sample a + i
        split[0] = True
        np.not_equal(cls[1:], cls[:-1], out=split[1:])
        if not clean:
            split[1:] |= gap_a[1:]
        cells = _cells(t, a, stop)
        np.logical_or(split[1:], np.isfinite(cells[1:]), out=split[1:])
        starts = split.nonzero()[0]
        seg_starts = starts.tolist()
        seg_end = [*seg_starts[1:], m_all]
        # Per-segment order-independent reductions (integer sums, min, max).
        seg_q = np.add.reduceat(q, starts, axis=0).tolist()
        seg_min = np.fmin.reduceat(pos, starts, axis=0).tolist()
        seg_max = np.fmax.reduceat(pos, starts, axis=0).tolist()
        seg_v = np.fmax.reduceat(v, starts).tolist()
        seg_cls = cls[starts].tolist()
        seg_gap = [False] * len(seg_starts) if clean else gap_a[starts].tolist()
        seg_cell = cells[starts].tolist()
        return self._runs(
            stop,
            n if final else stop,
            _Segments(
                seg_starts, seg_end, seg_cls, seg_gap, seg_cell, seg_q, seg_min, seg_max, seg_v
            ),
        )

    def _classify_compiled(self, kernel: Callable[..., Any], stop: int, final: bool) -> list[Row]:
        """:meth:`_classify` by the compiled pass (:mod:`gazeguard.signal.compiled`): the same
        rows, bit for bit. The open run stays packed between calls in ``_ri``/``_rf``, where
        the kernel reads and leaves it (:meth:`_open_run` unpacks it)."""
        assert self.dt is not None
        counts = self._counts
        counts.fill(0)
        out = kernel(
            self._t, self._xy, self._ok, self._n, self._next, stop, self.h,
            self.velocity_threshold_deg_s, self.max_gap_s, self._g0, self.dt, SPLIT_GRID_S,
            self._limits, self._ri, self._rf, counts,
        )  # fmt: skip
        gaps, *per_kind = counts.tolist()
        stats = self.stats
        stats.gaps += gaps
        for kind, c in zip(_KINDS, per_kind, strict=True):
            if c:
                stats.events[kind] += c
        self._next = self._n if final else stop
        self.last_classified_t = float(self._t[stop - 1])
        return [tuple(row) for row in out.tolist()]

    def _open_run(self) -> _OpenRun | None:
        """The open run (``None``: none yet), unpacked where the compiled pass keeps it."""
        if self.kernels is None or not self._ri[0]:
            return self._open
        _, cls, start, prev_cls, gap_before, n, sx, sy = self._ri.tolist()
        t_start, t_last, x_before, y_before, *stat, anchor = self._rf.tolist()
        return _OpenRun(
            cls, start, t_start, t_last, prev_cls, bool(gap_before), x_before, y_before, anchor,
            n, sx, sy, *stat,
        )  # fmt: skip

    def _runs(self, stop: int, next_: int, segs: _Segments) -> list[Row]:
        """Extend or open runs from the segments of classified samples [self._next, stop) and
        close the runs they complete (cutting long runs at grid points, module docstring step
        5); then ``self._next = next_``."""
        a, t, xy = self._next, self._t, self._xy
        seg_starts, seg_end, seg_cls, seg_gap, seg_cell, seg_q, seg_min, seg_max, seg_v = segs
        run = self._open
        rows: list[Row] = []
        inf = np.inf
        for si, s0 in enumerate(seg_starts):  # loop over runs (events), not samples
            e = seg_end[si]
            c = seg_cls[si]
            moving = c in (_C_SLOW, _C_FAST)  # valid samples only: no NaN below
            gap_b = seg_gap[si]
            cut = seg_cell[si]  # the grid point crossed before this segment, or NaN
            same = run is not None and run.cls == c and not gap_b
            # The run goes on unless a grid point at least SPLIT_GRID_S after its anchor was
            # crossed (a NaN cut compares False: no grid point crossed).
            if run is not None and same and not cut - run.anchor >= SPLIT_GRID_S:
                run.n += e - s0
                run.t_last = float(t[a + e - 1])
                if moving:
                    (sx, sy), (xmin, ymin), (xmax, ymax) = seg_q[si], seg_min[si], seg_max[si]
                    run.sx += sx
                    run.sy += sy
                    run.xmin = min(run.xmin, xmin)
                    run.ymin = min(run.ymin, ymin)
                    run.xmax = max(run.xmax, xmax)
                    run.ymax = max(run.ymax, ymax)
                    run.vmax = max(run.vmax, seg_v[si])
                continue
            b = a + s0
            tb = float(t[b])
            xb, yb = xy[b].tolist()
            prev = run
            if prev is not None:
                if same:  # a long run cut at a grid point: closed there, continued after it
                    self._close(rows, prev, c, True, cut, xb, yb, cut_at=cut)
                else:
                    self._close(rows, prev, c, gap_b, tb, xb, yb)
            xp, yp = xy[b - 1].tolist() if b > 0 else (np.nan, np.nan)
            args = (
                c,
                self._g0 + b,
                tb,
                float(t[a + e - 1]),
                prev.cls if prev is not None else -1,
                gap_b or same or prev is None,
                xp,
                yp,
                cut if same else tb,
                e - s0,
            )
            if moving:  # the run's statistics so far: this segment's (as min/max with ±inf)
                (sx, sy), (xmin, ymin), (xmax, ymax) = seg_q[si], seg_min[si], seg_max[si]
                vmax = seg_v[si]
                run = _OpenRun(
                    *args, sx, sy, xmin if xmin < inf else inf, xmax if xmax > -inf else -inf,
                    ymin if ymin < inf else inf, ymax if ymax > -inf else -inf,
                    vmax if vmax > -inf else -inf,
                )  # fmt: skip
            else:
                run = _OpenRun(*args)
            self._open = run
        self._next = next_
        self.last_classified_t = float(t[stop - 1])
        return rows

    def _close(  # noqa: PLR0917 - what follows the run, unpacked: called once per event
        self,
        rows: list[Row],
        run: _OpenRun,
        next_cls: int,
        next_gap: bool,
        next_t: float | None,
        next_x: float,
        next_y: float,
        cut_at: float | None = None,
    ) -> None:
        """Turn a completed run into an event row (see the module docstring for the rules).
        ``next_*``: the next run's class and first sample (class -1, time None: end of stream);
        ``next_gap``: a gap separates the run from it; ``cut_at``: the grid point a long run is
        cut at (its end time; pass ``next_gap`` True)."""
        if cut_at is not None:
            t_end = cut_at
        elif next_gap or next_t is None:
            t_end = run.t_last + self.dt
        else:
            t_end = next_t
        duration = t_end - run.t_start
        nan = math.nan
        x = y = dx = dy = amp = vpk = disp = nan
        cls = run.cls
        if cls == _C_SLOW:
            if duration >= self.min_fixation_s:
                kind = _K_FIXATION
                x, y = run.sx / _QUANTUM / run.n, run.sy / _QUANTUM / run.n
                vpk = run.vmax
                disp = (run.xmax - run.xmin) + (run.ymax - run.ymin)
            else:
                kind = _K_UNDEFINED
        elif cls == _C_FAST:
            flanked = run.prev_cls == _C_SLOW and not run.gap_before
            flanked = flanked and next_cls == _C_SLOW and not next_gap
            if flanked and duration >= self.min_saccade_s:
                kind = _K_SACCADE
                x, y = next_x, next_y
                dx, dy = next_x - run.x_before, next_y - run.y_before
                amp = float(np.hypot(dx, dy))
                vpk = run.vmax
            else:
                kind = _K_UNDEFINED
        elif cls == _C_INVALID:
            bounded = run.prev_cls >= 0 and not run.gap_before
            bounded = bounded and not next_gap and next_t is not None
            plausible = self.min_blink_s <= duration <= self.max_blink_s
            kind = _K_BLINK if bounded and plausible else _K_LOSS
        else:
            kind = _K_UNDEFINED
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


def sample_labels(events: Events, n_samples: int, first_index: int = 0) -> Int8Array:
    """Per-sample :class:`EventKind` labels, int8 (n_samples,), for samples
    ``first_index .. first_index + n_samples - 1``; samples in no event are UNDEFINED."""
    labels = np.zeros(n_samples, dtype=np.int8)
    for kind, s, e in zip(
        events.kind.tolist(), events.start.tolist(), events.stop.tolist(), strict=True
    ):
        labels[max(0, s - first_index) : max(0, e - first_index)] = kind
    return labels


def detect_events(
    timestamps: npt.ArrayLike,
    x_deg: npt.ArrayLike,
    y_deg: npt.ArrayLike,
    valid: npt.ArrayLike | None = None,
    detector: EventDetector | None = None,
    *,
    rate_hz: float | None = None,
) -> tuple[Events, Int8Array]:
    """Offline: all events of a recording and its per-sample labels (int8 (N,) EventKind).

    ``valid`` defaults to "x and y finite". The recording is pushed as one block and then
    :meth:`EventDetector.finish` closes the last run, so every sample gets a label. Give the
    recording's declared ``rate_hz`` or a ``detector``.
    """
    block = GazeSamples.from_arrays(timestamps, x_deg, y_deg)
    if valid is not None:
        ok = np.asarray(valid, dtype=bool) & block.valid
        block = GazeSamples(block.timestamps, block.x_deg, block.y_deg, block.pupil_mm, ok)
    if detector is None:
        if rate_hz is None:
            raise ConfigError("rate_hz", None, "give the recording's declared rate", "argument")
        detector = EventDetector(rate_hz=rate_hz)
    det = detector
    events = Events.concat([det.push(block), det.finish()])
    return events, sample_labels(events, len(block))
