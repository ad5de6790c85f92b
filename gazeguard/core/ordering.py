"""Sample order: one routine that decides which gaze samples are in time order and plausible.

Every LSL gaze source ends here before events and features (which need timestamps that are finite
and strictly increasing, also across blocks): the LSL ingest
(:class:`gazeguard.runtime.presets.Normalizer`), the sidecar's and a fleet's alike, and ``gazeguard
forward``, which runs it on the headset's host before the gaze goes to a fleet's JetStream stream.
A fleet worker reading that stream (:mod:`gazeguard.runtime.jetstream`) keeps only a guard: samples
ahead
of the device's clock are dropped, then every sample not newer than the session's newest one (a
block delivered again after a failover or a retried publish). It does not run a second
:class:`SampleOrder`: a resynchronisation shifts timestamps by an offset that lives in one
worker's memory, and a worker taking a partition over must date the replayed gaze exactly as the
devices sent it, or the ledger's cut between charged and uncharged chunks would move. Neither
rule can stop a session: a refused sample never becomes the newest.
:class:`SampleOrder` keeps the state of one stream across blocks and, for each block, says which
samples to keep and what their timestamps are. What it refuses it counts (:class:`OrderStats`);
nothing it refuses ever changes its state, so one bad sample cannot stop a stream.

A sample is **dropped** when

- its timestamp is not finite (``nonfinite``);
- its timestamp equals the last kept one, or its sample index the last kept index
  (``duplicates``), or either is smaller (``out_of_order``);
- it is **implausible** (``implausible``): its timestamp lies more than ``future_tolerance_s``
  ahead of the receiver's clock ``now`` (``future``; only when the timestamps are on that clock,
  as LSL timestamps are after the inlet's clock synchronisation), or more than ``max_age_s``
  behind it (when set; a live LSL stream cannot deliver samples that old), or its sample index
  advanced
  further than the stream's rate allows for the time that passed (more than
  ``MAX_RATE_FACTOR × nominal rate × (Δt + future_tolerance_s) + 1`` samples; an index of 1e15
  after 100 is implausible at any rate).

A sample whose *index* is not finite (NaN, ±inf) is kept if its timestamp is in order; its index
is ignored (``nonfinite_index``), so it never becomes the last index.

**Resynchronisation.** A sender whose clock really jumps (or whose sample counter restarts
without a new outlet) produces only rejections. After a *run* of rejected samples that are
consistent among themselves (timestamps and indices increasing, index jumps plausible) and with
real time (their timestamps advance no faster than the receiver's clock, within the tolerance
plus ``resync_after_s / 2``),
lasting at least ``resync_after_s`` of receiver time and ``resync_after_s / 2`` of sample time
(and 3 samples), the order follows the new timeline: from then on timestamps are shifted by a
constant offset so that they continue *after* the last kept sample with the stream's previous
latency, and the index restarts from the new value (``resyncs``). A single absurd sample cannot
do this (the next good sample is kept and ends the run), and neither can a burst: samples that
run ahead of real time break the run. The output stays strictly increasing in time on every path.

**Dejittering** (``dejitter=True``, regular-rate streams; off by default): kept timestamps are
replaced by the lower envelope of a line of slope ``1 / nominal_rate`` through them (a sample
is re-anchored when it lies more than a small tolerance before the line or ``MAX_JITTER_S``
after it, and at its first sample in every ``DEJITTER_CELL_S`` cell of the stream's clock; at
each block end the line is lifted to the earliest sample of its segment). The cells bound what
one sample can move: the output timestamps of its own cell (and, through the strictly
increasing floor, at most the next cell's first one), which the release plan adds to the reach
when dejittering is on. Output timestamps are
strictly increasing and never later than the raw ones by more than ``JITTER_EARLY_TOL`` of a
sample interval. liblsl's own dejitter and monotonize are not used: one NaN timestamp turns all
later timestamps NaN in them, and one +1e6 s timestamp freezes them (measured with liblsl 1.18;
see ``gazeguard.runtime.ingest``).

Cost: a block in order (the usual case) is checked with a few vectorised numpy calls; a Python
loop runs only over blocks that contain a refused sample.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gazeguard.core.samples import BoolArray, FloatArray

__all__ = [
    "DEJITTER_CELL_S",
    "MAX_RATE_FACTOR",
    "MAX_SAMPLE_AGE_S",
    "MAX_TRACKER_RATE_HZ",
    "OrderStats",
    "SampleOrder",
]

logger = logging.getLogger(__name__)

#: A sample index never advances faster than this multiple of the nominal rate.
MAX_RATE_FACTOR = 2.0
#: Rate bound for index jumps of streams without a nominal rate (irregular streams), Hz: no eye
#: tracker samples faster (EyeLink 2 kHz, Tobii Spectrum 1.2 kHz).
MAX_TRACKER_RATE_HZ = 10_000.0
#: Older timestamps are implausible on the receiver's clock, s. A live LSL stream never delivers
#: samples older than its inlet buffer (60 s); a faster-than-real-time replay stamps its start in
#: the past (``duration·(1 − 1/speed)``), up to an hour of that passes. What it refuses is an
#: absurd stamp: one first sample 1e6 s old would make feature extraction emit every step since.
MAX_SAMPLE_AGE_S = 3600.0
#: Dejitter: samples stamped more than this after the line are taken as they are (a pause), s.
MAX_JITTER_S = 0.1
#: Dejitter: a sample up to this fraction of a sample interval before the line keeps the line.
JITTER_EARLY_TOL = 0.02
_MIN_RUN = 3  # samples in a run before it may resynchronise
_DEJITTER_WINDOW = 256  # samples predicted at once between re-anchors
#: Dejitter: the line is re-anchored at the first sample of every cell of this many seconds of
#: the stream's clock (multiples of it), so a sample moves at most the timestamps of its cell.
DEJITTER_CELL_S = 1.0


@dataclass(slots=True)
class OrderStats:
    """What :class:`SampleOrder` refused or noticed (samples unless said otherwise)."""

    duplicates: int = 0  # dropped: timestamp (or sample index) equal to the last kept one
    out_of_order: int = 0  # dropped: timestamp (or sample index) before the last kept one
    implausible: int = 0  # dropped: ahead of (or far behind) the clock, or an index jump the
    # rate cannot make
    future: int = 0  # of those: timestamp more than the tolerance ahead of the receiver's clock
    nonfinite: int = 0  # dropped: timestamp NaN or ±inf
    nonfinite_index: int = 0  # kept on their timestamp, but their sample index was not finite
    lost: int = 0  # index numbers that never reached the consumer (streams with an index)
    resyncs: int = 0  # times the order followed a new timeline after a run of rejections

    @property
    def refused(self) -> int:
        """Samples dropped by the order (duplicates, out of order, implausible, non-finite)."""
        return self.duplicates + self.out_of_order + self.implausible + self.nonfinite


@dataclass(slots=True)
class _Run:
    """Consecutive rejected samples that agree with each other (a candidate new timeline)."""

    first_t: float  # raw (unshifted) timestamp of its first sample, s
    first_now: float  # receiver clock when its first sample was seen, s
    last_t: float
    last_index: float | None
    count: int = 1


class SampleOrder:
    """Order, plausibility, resynchronisation and dejittering of one stream's samples.

    Args:
        nominal_rate_hz: the stream's nominal rate (0: irregular), Hz; bounds index jumps and
            sets the dejitter slope.
        future_tolerance_s: how far ahead of ``now`` a timestamp may lie, s; ``None`` when the
            timestamps are on another clock than ``now`` (then nothing is "future"). Also the
            slack of the index-jump and real-time checks.
        resync_after_s: how long a consistent run of rejections must last before it becomes the
            new timeline, s (receiver time).
        max_age_s: a timestamp older than ``now - max_age_s`` is implausible (``None``: no
            limit; only meaningful on the receiver's clock). Without it, one first sample stamped
            far in the past would make feature extraction emit every step since then at once.
        dejitter: smooth the kept timestamps (regular-rate streams only).
        stats: counters to update (default: a new :class:`OrderStats`).
        name: used in log lines.
    """

    def __init__(
        self,
        *,
        nominal_rate_hz: float = 0.0,
        future_tolerance_s: float | None = 0.5,
        resync_after_s: float = 2.0,
        max_age_s: float | None = None,
        dejitter: bool = False,
        stats: OrderStats | None = None,
        name: str = "gaze stream",
    ) -> None:
        if not (math.isfinite(nominal_rate_hz) and nominal_rate_hz >= 0):
            msg = f"nominal_rate_hz must be a finite number >= 0, got {nominal_rate_hz!r}"
            raise ValueError(msg)
        if future_tolerance_s is not None and not (
            math.isfinite(future_tolerance_s) and future_tolerance_s > 0
        ):
            msg = (
                "future_tolerance_s must be a finite number > 0 or None, "
                f"got {future_tolerance_s!r}"
            )
            raise ValueError(msg)
        if not (math.isfinite(resync_after_s) and resync_after_s > 0):
            msg = f"resync_after_s must be a finite number > 0, got {resync_after_s!r}"
            raise ValueError(msg)
        self.nominal_rate_hz = float(nominal_rate_hz)
        self.future_tolerance_s = future_tolerance_s
        self.resync_after_s = float(resync_after_s)
        if max_age_s is not None and not (math.isfinite(max_age_s) and max_age_s > 0):
            msg = f"max_age_s must be a finite number > 0 or None, got {max_age_s!r}"
            raise ValueError(msg)
        self.max_age_s = max_age_s
        self.stats = stats if stats is not None else OrderStats()
        self.name = name
        self._tol = 0.5 if future_tolerance_s is None else float(future_tolerance_s)
        # How far a run's timestamps may get ahead of the receiver's clock since its start and
        # still count as keeping pace (pulls are late by up to a poll interval, more under load);
        # a burst runs ahead by its whole length at once.
        self._pace_slack = self._tol + self.resync_after_s / 2
        rate = self.nominal_rate_hz if self.nominal_rate_hz > 0 else MAX_TRACKER_RATE_HZ
        self._max_rate = MAX_RATE_FACTOR * rate if self.nominal_rate_hz > 0 else rate
        self.offset = 0.0  # added to incoming timestamps (changes only at a resync), s
        self.last_t = -math.inf  # last kept timestamp (shifted, before dejitter), s
        self.last_index = -math.inf  # last kept finite sample index
        self._last_index_t = -math.inf  # timestamp of the sample that set last_index
        # Samples kept since last_index without a finite index: they reached the consumer, so
        # they account for index numbers in the next gap.
        self._unplaced = 0
        self._lag = 0.0  # receiver clock minus the newest kept timestamp, s
        self._run: _Run | None = None
        self._dejitter = _Dejitter(1.0 / nominal_rate_hz) if dejitter and nominal_rate_hz else None

    def reset_index(self) -> None:
        """Forget the last sample index (a new outlet took over and counts from 0 again)."""
        self.last_index = -math.inf
        self._last_index_t = -math.inf
        self._unplaced = 0

    def __call__(
        self, t: FloatArray, index: FloatArray | None, now: float
    ) -> tuple[BoolArray, FloatArray]:
        """Decide on one block.

        Args:
            t: (N,) timestamps as received, s.
            index: (N,) sample indices, or None for streams without an index channel.
            now: the receiver's clock when the block was pulled, s (``pylsl.local_clock()``).

        Returns:
            ``keep`` bool (N,) and the timestamps of the kept samples, float64 (K,), strictly
            increasing and after every timestamp returned before.
        """
        n = t.shape[0]
        if n == 0:
            return np.zeros(0, bool), np.zeros(0)
        if self._in_order(t, index, now):
            keep = np.ones(n, bool)
            ts = t + self.offset
            if index is not None:
                self._count_lost(index)
                self.last_index = float(index[-1])
                self._last_index_t = float(ts[-1])
                self._unplaced = 0
            self.last_t = float(ts[-1])
        else:
            keep, ts = self._slow(t, index, now)
        if ts.shape[0]:
            self._lag = max(0.0, now - float(ts[-1]))
        if self._dejitter is not None and ts.shape[0]:
            ts = self._dejitter(ts)
        return keep, ts

    # -- the usual case: the whole block is in order and plausible ------------------------------
    def _in_order(self, t: FloatArray, index: FloatArray | None, now: float) -> bool:
        if self._run is not None:
            return False
        ts0, ts1 = float(t[0]) + self.offset, float(t[-1]) + self.offset
        with np.errstate(invalid="ignore"):  # inf - inf: refused below as not increasing
            dt = np.diff(t)
            di = np.diff(index) if index is not None else dt
        ok = bool(
            ts0 > self.last_t  # NaN compares False
            and math.isfinite(ts1)
            and np.all(dt > 0)
            and (self.future_tolerance_s is None or ts1 <= now + self.future_tolerance_s)
            and (self.max_age_s is None or ts0 >= now - self.max_age_s)
        )
        if not ok or index is None:
            return ok
        i0, i1 = float(index[0]), float(index[-1])
        return bool(
            i0 > self.last_index
            and math.isfinite(i1)
            and np.all(di > 0)
            and (
                not math.isfinite(self.last_index)
                or self._plausible(i0 - self.last_index, ts0 - self._last_index_t)
            )
            and np.all(di <= self._max_rate * (dt + self._tol) + 1.0)
        )

    def _plausible(self, di: float, dt: float) -> bool:
        """Can the sample index advance by ``di`` in ``dt`` seconds?"""
        return di <= self._max_rate * (max(dt, 0.0) + self._tol) + 1.0

    def _count_lost(self, index: FloatArray) -> None:
        """Index gaps of an in-order block, minus the samples kept without an index in them."""
        if math.isfinite(self.last_index):
            gap = float(index[0]) - self.last_index - 1.0 - self._unplaced
            self.stats.lost += max(0, round(gap))
        steps = np.diff(index) - 1.0
        self.stats.lost += int(steps[steps > 0].sum())

    # -- a block with something to refuse: one sample at a time -------------------------------
    def _slow(  # noqa: PLR0912, PLR0915 - numeric: the per-sample plausibility and resync state machine
        self, t: FloatArray, index: FloatArray | None, now: float
    ) -> tuple[BoolArray, FloatArray]:
        st = self.stats
        n = t.shape[0]
        keep = np.zeros(n, bool)
        out = np.empty(n)
        k_out = 0
        fut = self.future_tolerance_s
        t_list = t.tolist()
        i_list = index.tolist() if index is not None else [math.nan] * n
        for k in range(n):
            raw_t, raw_i = t_list[k], i_list[k]
            ik: float | None = raw_i if math.isfinite(raw_i) else None
            if not math.isfinite(raw_t):
                st.nonfinite += 1
                continue
            tk = raw_t + self.offset
            if fut is not None and tk > now + fut:
                verdict = "future"
            elif self.max_age_s is not None and tk < now - self.max_age_s:
                verdict = "past"
            elif tk == self.last_t or (ik is not None and ik == self.last_index):
                verdict = "duplicate"
            elif tk < self.last_t or (ik is not None and ik < self.last_index):
                verdict = "out_of_order"
            elif (
                ik is not None
                and math.isfinite(self.last_index)
                and not self._plausible(ik - self.last_index, tk - self._last_index_t)
            ):
                verdict = "jump"
            else:
                verdict = "keep"
            if verdict == "duplicate":
                st.duplicates += 1
                continue
            if verdict != "keep":
                if self._extend_run(raw_t, ik, now):  # the run qualifies: follow it from here
                    tk = self._resync(raw_t, ik, now)
                else:
                    if verdict == "out_of_order":
                        st.out_of_order += 1
                    else:
                        st.implausible += 1
                        st.future += verdict == "future"
                    continue
            self._run = None
            if index is not None and ik is None:
                st.nonfinite_index += 1
                self._unplaced += 1
            elif ik is not None:
                if math.isfinite(self.last_index) and verdict == "keep":
                    gap = ik - self.last_index - 1.0 - self._unplaced
                    st.lost += max(0, round(gap))
                self.last_index, self._last_index_t, self._unplaced = ik, tk, 0
            self.last_t = tk
            keep[k] = True
            out[k_out] = tk
            k_out += 1
        return keep, out[:k_out].copy()

    def _extend_run(self, raw_t: float, ik: float | None, now: float) -> bool:
        """Add a rejected sample to the current run (or start a new one); True when the run
        qualifies as a new timeline."""
        run = self._run
        if run is not None:
            consistent = (
                raw_t > run.last_t
                and (ik is None or run.last_index is None or ik > run.last_index)
                and (
                    ik is None
                    or run.last_index is None
                    or self._plausible(ik - run.last_index, raw_t - run.last_t)
                )
                and raw_t - run.first_t <= (now - run.first_now) + self._pace_slack
            )
            if consistent:
                run.last_t, run.count = raw_t, run.count + 1
                if ik is not None:
                    run.last_index = ik
            else:
                run = None
        if run is None:
            self._run = _Run(raw_t, now, raw_t, ik)
            return False
        return (
            run.count >= _MIN_RUN
            and now - run.first_now >= self.resync_after_s
            and run.last_t - run.first_t >= self.resync_after_s / 2
        )

    def _resync(self, raw_t: float, ik: float | None, now: float) -> float:
        """Follow the run's timeline from ``raw_t`` on; returns its new (shifted) timestamp."""
        target = now - self._lag
        if not target > self.last_t:
            target = float(np.nextafter(self.last_t, math.inf))
        shift = target - (raw_t + self.offset)
        self.offset += shift
        self.stats.resyncs += 1
        self.reset_index()
        if self._dejitter is not None:
            self._dejitter.reset()
        logger.warning(
            "%s: timestamps jumped by %+.6g s (or the sample index restarted) and stayed "
            "consistent for %.1f s: following the new timeline (resync %d)",
            self.name,
            -shift,
            self.resync_after_s,
            self.stats.resyncs,
        )
        return target


class _Dejitter:
    """Lower-envelope line fit of the kept timestamps (see the module docstring)."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.early = JITTER_EARLY_TOL * period
        self.last_out = -math.inf
        self.reset()

    def reset(self) -> None:
        """Forget the line (after a resync); the last output stays the floor of the next."""
        self.anchor_t: float | None = None
        self.anchor_n = 0
        self.anchor_cell = -math.inf  # the public cell of the anchor's raw timestamp
        self.n = 0  # samples seen since the reset

    def __call__(self, s: FloatArray) -> FloatArray:
        m = s.shape[0]
        out = np.empty(m)
        nums = self.n + np.arange(m, dtype=np.int64)
        self.n += m
        cells = np.floor(s / DEJITTER_CELL_S)
        i = seg = 0
        while i < m:
            if self.anchor_t is None or cells[i] != self.anchor_cell:
                self._anchor(out, s, nums, i)
                self.anchor_cell = float(cells[i])
                seg, i = i, i + 1
                continue
            stop = min(m, i + _DEJITTER_WINDOW)
            stop = i + int(np.searchsorted(cells[i:stop], self.anchor_cell, side="right"))
            pred = self.anchor_t + (nums[i:stop] - self.anchor_n) * self.period
            e = s[i:stop] - pred
            bad = (e < -self.early) | (e > MAX_JITTER_S)
            j = int(np.argmax(bad)) if bad.any() else stop - i
            out[i : i + j] = pred[:j]
            i += j
            if i < stop:
                self._anchor(out, s, nums, i)
                seg, i = i, i + 1
        if self.anchor_t is not None:  # lift the line to the lower envelope of its segment
            e = s[seg:] - (self.anchor_t + (nums[seg:] - self.anchor_n) * self.period)
            lift = float(e.min())
            if lift > 0:
                self.anchor_t += lift
        self.last_out = float(out[-1])
        return out

    def _anchor(self, out: FloatArray, s: FloatArray, nums: npt.NDArray[np.int64], i: int) -> None:
        prev = out[i - 1] if i > 0 else self.last_out
        v = float(s[i]) if s[i] > prev else float(np.nextafter(prev, math.inf))
        self.anchor_t, self.anchor_n = v, int(nums[i])
        out[i] = v
