"""Ingest: a headset's LSL gaze stream in, normalized :class:`~gazeguard.core.samples.GazeSamples`
out.

One gaze sample's way through ingest (this module resolves, pulls and hands off; what the
channels mean and how they become degrees and mm is :mod:`gazeguard.runtime.presets`, used in steps
2, 4
and 5):

1. **Resolve** the stream by ``source_id`` and/or ``name`` (or, if neither is configured, by
   ``type``, ``Gaze`` by default; Tobii's bridge uses ``Eyetracker``), within
   ``resolve_timeout_s``; otherwise :class:`~gazeguard.core.errors.StreamError` says what was looked
   for, for how long, which streams were visible instead and what to check.
2. **Interpret** its channels at connect (:func:`~gazeguard.runtime.presets.build_layout`) with a
preset
   (:data:`~gazeguard.runtime.presets.PRESETS`) or the stream's XDF channel metadata
   (``channels/channel/{label,eye,type,unit}``, preset ``generic``); ``auto`` picks from the
   stream's name, type and metadata. A wrong channel count or an unknown unit is a startup error.
3. **Pull** whole chunks in a background thread into a buffer allocated once at connect
   (``pull_chunk(dest_obj=...)``, C order, the stream's own dtype), with LSL clock synchronisation
   (timestamps on this host's ``local_clock()``) and ``recover=True`` so that a stream that
   vanishes and comes back (same ``source_id``) resumes the session.
4. **Normalize** (vectorised, :class:`~gazeguard.runtime.presets.Normalizer`): gaze direction in
degrees
   of visual angle (positive right / up), pupil diameter in mm, a validity flag. Invalid samples
   (NaN, missing-eye codes, confidence below threshold, pupil loss) become NaN + invalid, never
   zeros. Absurd values (|angle| > 90°, pupil outside 0.5–10 mm) become invalid and are counted.
5. **Order** (:class:`~gazeguard.core.ordering.SampleOrder`, stateful across blocks): samples whose
   timestamp (or, with a sample-index channel, whose index) does not increase, whose timestamp is
   not finite, lies more than ``ingest.future_tolerance_s`` ahead of ``local_clock()``, or whose
   index jumps further than the nominal rate allows are dropped and counted, never adopted as the
   new "last"; a consistent run of rejections (a sender's clock jump) is followed after
   ``ingest.resync_after_s``. Kept timestamps are dejittered. Every block handed on is strictly
   increasing in time, also across blocks.
6. **Hand off** to asyncio through a bounded queue (:mod:`gazeguard.core.ring`); overflow is
counted.
   The counters are logged (one line, at most every ``COUNTERS_LOG_EVERY_S`` while they change)
   and :attr:`GazeStream.idle_s` says how long no usable sample arrived (the service turns the
   status ``stream_lost`` after ``ingest.stream_lost_after_s``).

Cost: one wake-up per ``ingest.pull_every_s`` (default 1 s) drains everything liblsl has
buffered, so the per-sample Python cost is zero and the per-wake cost is a few dozen numpy calls
(see ``bench/bench_frontend.py``). On a headset the wake-ups, not the samples, are what costs:
each one wakes the pull thread, the event loop and a worker thread (``bench/bench_service.py``
measures the sidecar beside a bare pylsl inlet).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

import numpy as np
import pylsl

from gazeguard.config import IngestSettings
from gazeguard.core.errors import ConfigError, StreamError, StreamNotFoundError
from gazeguard.core.ring import BlockQueue
from gazeguard.core.samples import GazeSamples
from gazeguard.runtime.presets import IngestStats, Layout, Normalizer, StreamMeta, build_layout
from gazeguard.signal.events import check_rate
from gazeguard.wire.topics import session_id_for

if TYPE_CHECKING:
    from gazeguard.runtime.fleet import SessionHost

logger = logging.getLogger(__name__)

# pylsl >= 1.17 keeps its exceptions in pylsl.util (``pylsl.LostError`` no longer exists there:
# naming it in an ``except`` clause raised AttributeError in the pull thread instead of handling
# the loss, and the consumer waited forever).
try:
    from pylsl.util import LostError as LSLLostError
    from pylsl.util import TimeoutError as LSLTimeoutError
except ImportError:  # pragma: no cover - pylsl < 1.17
    LSLLostError, LSLTimeoutError = pylsl.LostError, pylsl.TimeoutError

#: liblsl post-processing: clock synchronisation only. liblsl's dejitter and monotonize are
#: poisoned by one bad timestamp (measured, liblsl 1.18: after one NaN or inf timestamp every later
#: timestamp is NaN; after one +1e6 s timestamp they stay frozen near it for minutes), so order,
#: plausibility and dejittering are done by :class:`gazeguard.core.ordering.SampleOrder`, which
# refuses
#: such a sample without adopting it.
PROCESSING_FLAGS = pylsl.proc_clocksync
#: At most one log line with the ingest counters per this many seconds (when they changed), s.
COUNTERS_LOG_EVERY_S = 5.0


# ---------------------------------------------------------------------------------------------
# Resolve
# ---------------------------------------------------------------------------------------------
def _xpath_literal(value: str) -> str:
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise StreamError(f"cannot resolve an LSL stream by {value!r}: it contains both quote kinds")


def _query(settings: IngestSettings) -> tuple[str, str]:
    """The XPath predicate to resolve by and a human description of it."""
    terms = []
    if settings.source_id:
        terms.append(("source_id", settings.source_id))
    if settings.stream_name:
        terms.append(("name", settings.stream_name))
    if not terms:  # the type only narrows when nothing more specific was configured
        terms.append(("type", settings.stream_type))
    pred = " and ".join(f"{k}={_xpath_literal(v)}" for k, v in terms)
    what = " and ".join(f"{k}={v!r}" for k, v in terms)
    return pred, what


def resolve_stream(settings: IngestSettings) -> pylsl.StreamInfo:
    """Find the configured stream within ``resolve_timeout_s`` (blocking).

    Raises:
        StreamError: nothing matched; the message lists the streams that were visible.
    """
    pred, what = _query(settings)
    found = pylsl.resolve_bypred(pred, 1, settings.resolve_timeout_s)
    if not found:
        visible = pylsl.resolve_streams(0.5)
        seen = ", ".join(
            f"{i.name()!r} (type {i.type()!r}, source_id {i.source_id()!r})" for i in visible[:10]
        )
        raise StreamNotFoundError(
            f"no LSL stream with {what} appeared within {settings.resolve_timeout_s:g} s. "
            f"Visible streams: {seen or 'none'}. Check that the headset or its LSL bridge is "
            "running on this network (LSL multicast must reach this host; see lsl_api.cfg), "
            "or set ingest.source_id / ingest.stream_name / ingest.stream_type to match it."
        )
    if len(found) > 1:
        logger.warning(
            "%d LSL streams match %s; using %r on %s. Set ingest.source_id to choose.",
            len(found),
            what,
            found[0].name(),
            found[0].hostname(),
        )
    return found[0]


#: The source_id and name prefix of gazeguard's simulated headsets (``gazeguard simulate``, the
#: sidecar's own): ``auto`` never attaches to one, ``ingest.source_id`` selects one.
SIMULATOR_PREFIX = "gazeguard-sim"


class AmbiguousStreamError(StreamError):
    """``ingest.source = "auto"`` saw more than one stream it could serve: it lists them."""


def this_host() -> str:
    """This host's name as LSL reports it in ``StreamInfo.hostname()``."""
    return socket.gethostname()


def describe_stream(info: pylsl.StreamInfo) -> str:
    """One stream in words: name, type, source_id and host."""
    return (
        f"{info.name()!r} (type {info.type()!r}, source_id {info.source_id()!r}, "
        f"host {info.hostname()!r})"
    )


def is_simulator(info: pylsl.StreamInfo) -> bool:
    """Whether the stream is a gazeguard simulated headset (its source_id or name says so)."""
    names: tuple[str, str] = (info.source_id(), info.name())
    return any(n.startswith(SIMULATOR_PREFIX) for n in names)


def skip_reason(info: pylsl.StreamInfo, settings: IngestSettings, *, auto: bool) -> str | None:
    """Why a discovered stream is not served (``None``: it is selected).

    The selection: ``ingest.stream_host`` (a glob on the LSL host name; unset: this host only),
    ``ingest.source_id`` (a glob on the source_id; fleet mode) and, for ``auto``, never a
    gazeguard simulated headset (another process's: this run's own is resolved by its own
    source_id)."""
    host, here = info.hostname(), this_host()
    if settings.stream_host is None:
        if host != here:
            return (
                f"published by host {host!r}, not this host {here!r} (--stream-host {host} or "
                "'*' selects other hosts)"
            )
    elif not fnmatchcase(host, settings.stream_host):
        return f"host {host!r} does not match ingest.stream_host {settings.stream_host!r}"
    if settings.source_id is not None and not fnmatchcase(info.source_id(), settings.source_id):
        return f"source_id does not match ingest.source_id {settings.source_id!r}"
    if auto and is_simulator(info):
        return (
            "a gazeguard simulated headset of another process (auto never attaches to one; "
            f"--source-id {info.source_id()} selects it)"
        )
    return None


def select_auto(settings: IngestSettings, timeout_s: float) -> pylsl.StreamInfo | None:
    """``ingest.source = "auto"`` with no source_id or stream name: the one stream of
    ``ingest.stream_type`` on this host (or ``ingest.stream_host``) that is not a gazeguard
    simulated headset, seen within ``timeout_s`` (blocking); ``None`` when there is none. Every
    stream it skips is logged with the reason.

    Raises:
        AmbiguousStreamError: more than one candidate; the message lists them and the flag that
            selects one.
    """
    found = pylsl.resolve_bypred(f"type={_xpath_literal(settings.stream_type)}", 0, timeout_s)
    taken: list[pylsl.StreamInfo] = []
    for info in found:
        why = skip_reason(info, settings, auto=True)
        if why is None:
            taken.append(info)
        else:
            logger.info(
                "ingest.source auto: skipping LSL stream %s: %s", describe_stream(info), why
            )
    if len(taken) > 1:
        raise AmbiguousStreamError(_ambiguous(taken))
    return taken[0] if taken else None


def _ambiguous(taken: Sequence[pylsl.StreamInfo]) -> str:
    listing = "; ".join(f"--source-id {i.source_id()!r}: {describe_stream(i)}" for i in taken)
    return (
        f"ingest.source auto found {len(taken)} LSL streams it could serve and will not guess "
        f"which is yours: {listing}. Choose one with --source-id ID (ingest.source_id), or "
        "--source simulated for a simulated headset of this run's own"
    )


def declared_rate(configured: float | None, nominal_srate: float, stream: str) -> float:
    """The rate the event detector is built for: ``ingest.rate_hz`` when set, else the stream's
    own declaration (LSL ``nominal_srate``), Hz. Never measured from the samples.

    Raises:
        ConfigError: the stream declares no rate (0: irregular) and none is configured, or the
            rate is outside what the detector accepts.
    """
    if configured is not None:
        return check_rate(configured, "ingest.rate_hz")
    if not nominal_srate > 0:
        raise ConfigError(
            "ingest.rate_hz",
            None,
            f"stream {stream!r} declares no sampling rate (nominal_srate {nominal_srate:g}: "
            "irregular); set the tracker's nominal rate, e.g. --stream-rate 120 or "
            "ingest.rate_hz = 120 (the event detector's parameters come from a declared rate, "
            "never from measured timestamps)",
        )
    return check_rate(nominal_srate, "ingest.rate_hz (the stream's nominal_srate)")


@dataclass(frozen=True, slots=True)
class GazeStreamInfo:
    """What the service reports about the stream it reads."""

    name: str
    type: str
    source_id: str
    nominal_srate: float
    preset: str
    channel_count: int
    hostname: str


class GazeStream:
    """An LSL gaze stream as an async iterator of strictly time-ordered GazeSamples blocks.

    ``async with GazeStream(settings.ingest) as stream:`` resolves the stream, reads its full
    description, checks the channel layout, opens the inlet and starts the pull thread;
    ``async for block in stream`` yields blocks; ``stream.stats`` counts what happened.
    Iteration ends only when the stream has been silent for ``end_after_s`` (if set), or raises
    StreamError if the stream is lost for good.

    Args:
        settings: ingest settings (resolve, preset, geometry, confidence threshold).
        poll_interval_s: how often the pull thread drains liblsl's buffer, s (default:
            ``settings.pull_every_s``).
        queue_blocks: bound of the hand-off queue, blocks (one per poll at most).
        stall_after_s: silence after which a log line says the stream stopped, s (default: 1 s,
            or two pull intervals if longer: one empty pull is not a stall).
        end_after_s: silence after which iteration ends (None: wait for the stream forever).
        processing_flags: liblsl post-processing (clock sync, dejitter, monotonize).
    """

    def __init__(
        self,
        settings: IngestSettings | None = None,
        *,
        poll_interval_s: float | None = None,
        queue_blocks: int = 64,
        stall_after_s: float | None = None,
        end_after_s: float | None = None,
        processing_flags: int = PROCESSING_FLAGS,
    ) -> None:
        self.settings = settings if settings is not None else IngestSettings()
        self.poll_interval_s = (
            self.settings.pull_every_s if poll_interval_s is None else poll_interval_s
        )
        self.queue_blocks = queue_blocks
        self.stall_after_s = (
            max(1.0, 2 * self.poll_interval_s) if stall_after_s is None else stall_after_s
        )
        self.end_after_s = end_after_s
        self.processing_flags = processing_flags
        self._stats = IngestStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._queue: BlockQueue[GazeSamples] | None = None
        self._info: GazeStreamInfo | None = None
        self._inlet: pylsl.StreamInlet | None = None
        self._meta: StreamMeta | None = None
        self._uid = ""
        self._last_uid_check = -math.inf
        self._last_usable = time.monotonic()  # when the pull thread last handed on a sample

    # -- public ---------------------------------------------------------------------------
    @property
    def info(self) -> GazeStreamInfo:
        """Name, type, source_id, nominal rate, preset and channel count of the open stream."""
        if self._info is None:
            raise StreamError("GazeStream is not open; use `async with GazeStream(...)`")
        return self._info

    @property
    def stats(self) -> IngestStats:
        """A snapshot of the counters."""
        snap = replace(self._stats)
        if self._queue is not None:
            snap.overflow = self._queue.overflow_samples
        return snap

    @property
    def idle_s(self) -> float:
        """Seconds since the last usable sample was handed on (or since the stream opened)."""
        return time.monotonic() - self._last_usable

    async def __aenter__(self) -> GazeStream:
        if self._stop.is_set() or self._thread is not None:
            raise StreamError("a GazeStream can be opened once; create a new one to reconnect")
        inlet, meta, layout = await asyncio.to_thread(self._open)
        self._inlet, self._meta, self._uid = inlet, meta, meta.uid
        self._info = GazeStreamInfo(
            meta.name, meta.type, meta.source_id, meta.nominal_srate, layout.preset,
            meta.channel_count, meta.hostname,
        )  # fmt: skip
        norm = Normalizer.for_stream(layout, meta, self.settings, self._stats)
        self._last_usable = time.monotonic()
        self._queue = BlockQueue(
            asyncio.get_running_loop(), self.queue_blocks, len, f"LSL stream {meta.name!r}"
        )
        self._thread = threading.Thread(
            target=self._pull_loop,
            args=(inlet, norm),
            name=f"gazeguard.runtime.ingest[{meta.name}]",
            daemon=True,
        )  # fmt: skip
        self._thread.start()
        logger.info(
            "reading LSL stream %r (type %r, source_id %r, %g Hz, %d channels, preset %r) from %s",
            meta.name, meta.type, meta.source_id, meta.nominal_srate, meta.channel_count,
            layout.preset, meta.hostname,
        )  # fmt: skip
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        if self._inlet is not None:
            self._inlet.close_stream()
            self._inlet = None

    def __aiter__(self) -> AsyncIterator[GazeSamples]:
        return self

    async def __anext__(self) -> GazeSamples:
        if self._queue is None:
            raise StreamError("GazeStream is not open; use `async with GazeStream(...)`")
        return await self._queue.get()

    # -- connect (blocking; runs in a worker thread) --------------------------------------
    def _open(self) -> tuple[pylsl.StreamInlet, StreamMeta, Layout]:
        found = resolve_stream(self.settings)
        inlet = pylsl.StreamInlet(
            found, max_buflen=60, recover=True, processing_flags=self.processing_flags
        )
        try:
            full = inlet.info(timeout=self.settings.resolve_timeout_s)
        except LSLTimeoutError as exc:
            raise StreamError(
                f"LSL stream {found.name()!r} was found but did not send its description within "
                f"{self.settings.resolve_timeout_s:g} s; check the network between this host "
                f"and {found.hostname()!r} (TCP must pass, not only multicast)"
            ) from exc
        meta = StreamMeta.from_lsl(full)
        if full.channel_format() == pylsl.cf_string:
            raise StreamError(f"LSL stream {meta.name!r} carries strings, not gaze samples")
        layout = build_layout(meta, self.settings)
        inlet.open_stream(timeout=self.settings.resolve_timeout_s)
        return inlet, meta, layout

    # -- the pull thread ------------------------------------------------------------------
    def _pull_loop(self, inlet: pylsl.StreamInlet, norm: Normalizer) -> None:  # noqa: PLR0912, PLR0915 - the pull thread's one hot loop (a call per pull is its cost)
        assert self._queue is not None
        assert self._meta is not None
        queue, meta = self._queue, self._meta
        rate = meta.nominal_srate if meta.nominal_srate > 0 else 1200.0
        cap = max(256, math.ceil(rate * self.poll_interval_s * 4))
        # Allocated once, in the stream's own dtype (liblsl writes into it directly).
        buf = np.zeros((cap, meta.channel_count), dtype=inlet.np_dtype)
        last_data = time.monotonic()
        stalled = False
        log_counters = _CountersLog(meta.name)
        try:
            while not self._stop.is_set():
                got = 0
                while True:
                    data, ts = inlet.pull_chunk(0.0, cap, dest_obj=buf, as_numpy=True)
                    n = ts.shape[0]
                    if n == 0:
                        break
                    got += n
                    raw = data if data.dtype == np.float64 else data.astype(np.float64)
                    if (
                        norm.layout.index is not None
                        and raw[0, norm.layout.index] <= norm.last_index
                    ):
                        self._check_new_outlet(norm)
                    # copies out of buf before the next pull
                    block = norm(raw, ts, pylsl.local_clock())
                    if block is not None:
                        self._last_usable = time.monotonic()
                        if not queue.offer(block):
                            return
                    if n < cap:
                        break
                log_counters(self.stats)
                now = time.monotonic()
                if got:
                    if stalled:
                        logger.warning(
                            "LSL stream %r resumed after %.1f s of silence",
                            meta.name,
                            now - last_data,
                        )
                        stalled = False
                        self._check_new_outlet(norm)
                    last_data = now
                elif not stalled and now - last_data > self.stall_after_s:
                    stalled = True
                    self._stats.stalls += 1
                    logger.warning(
                        "LSL stream %r (source_id %r) sent nothing for %.1f s; waiting for it to "
                        "come back (the session continues when it does)",
                        meta.name,
                        meta.source_id,
                        now - last_data,
                    )
                elif self.end_after_s is not None and now - last_data > self.end_after_s:
                    logger.warning(
                        "LSL stream %r silent for %.1f s; ending the stream",
                        meta.name,
                        now - last_data,
                    )
                    queue.finish()
                    return
                self._stop.wait(self.poll_interval_s)
        except LSLLostError as exc:
            err = StreamError(
                f"LSL stream {meta.name!r} was lost and cannot be recovered (it has no "
                "source_id); restart its outlet with a source_id so gazeguard can resume"
            )
            err.__cause__ = exc
            queue.finish(err)
        except Exception as exc:  # fail closed: the consumer learns, nothing half-processed leaks
            logger.exception("ingest thread of LSL stream %r failed", meta.name)
            err = StreamError(f"ingest of LSL stream {meta.name!r} failed: {exc!r}")
            err.__cause__ = exc
            queue.finish(err)

    def _check_new_outlet(self, norm: Normalizer) -> None:
        """After silence or a sample-index restart: did a new outlet (same source_id) take over?"""
        now = time.monotonic()
        sid = self._meta.source_id if self._meta is not None else ""
        if not sid or now - self._last_uid_check < 1.0:
            return
        self._last_uid_check = now
        found = pylsl.resolve_byprop("source_id", sid, 1, 1.0)
        if found and found[0].uid() != self._uid:
            self._uid = found[0].uid()
            self._stats.reconnects += 1
            norm.reset_index()
            logger.warning(
                "LSL stream %r: a new outlet (uid %s) took over source_id %r; session continues",
                found[0].name(),
                self._uid,
                sid,
            )


class _CountersLog:
    """One warning line with the ingest counters, at most every ``COUNTERS_LOG_EVERY_S`` and
    only when a counter of trouble (dropped, non-finite index, lost, resyncs) changed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.last_log = -math.inf
        self.logged: tuple[int, ...] = (0, 0, 0, 0)

    def __call__(self, st: IngestStats) -> None:
        now = time.monotonic()
        if now - self.last_log < COUNTERS_LOG_EVERY_S:
            return
        key = (st.dropped, st.nonfinite_index, st.lost, st.resyncs)
        if key == self.logged or not any(key):
            return
        self.last_log, self.logged = now, key
        logger.warning(
            "LSL stream %r: %d samples delivered (%d invalid), %d dropped: %d duplicate, %d out "
            "of order, %d implausible (%d ahead of the clock), %d with a non-finite timestamp, "
            "%d overflow; %d with a non-finite sample index kept, %d missing from the index, "
            "%d resyncs",
            self.name, st.samples, st.invalid, st.dropped, st.duplicates, st.out_of_order,
            st.implausible, st.future, st.nonfinite, st.overflow, st.nonfinite_index, st.lost,
            st.resyncs,
        )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Fleet: every stream discovered on the network, one session each
# ---------------------------------------------------------------------------------------------
class LslFleetIngest:
    """A fleet worker's LSL side: discover gaze streams and serve each as its own session.

    Every ``fleet.discover_every_s`` it resolves all streams of ``ingest.stream_type`` (whose name
    starts with ``ingest.stream_name``, if set) and serves those :func:`skip_reason` selects
    (``ingest.source_id`` and ``ingest.stream_host`` as globs; by default this host's streams
    only), logging each stream it takes or skips; each new ``source_id`` gets its own
    :class:`GazeStream` and a session of ``fleet`` (a :class:`~gazeguard.runtime.fleet.SessionHost`,
    the worker's :class:`~gazeguard.runtime.fleet.Fleet`), which ends when the stream is silent
    for ``fleet.idle_timeout_s``. The LSL counterpart of
    :class:`gazeguard.runtime.jetstream.JetStreamIngest`.

    Args:
        fleet: the worker's sessions, ledger and publisher.
    """

    def __init__(self, fleet: SessionHost) -> None:
        self.fleet = fleet

    def predicate(self) -> str:
        """The XPath predicate discovery resolves by."""
        ingest = self.fleet.settings.ingest
        pred = f"type={_xpath_literal(ingest.stream_type)}"
        if ingest.stream_name:  # narrows discovery to streams whose name starts with it
            pred += f" and starts-with(name,{_xpath_literal(ingest.stream_name)})"
        return pred

    def selection(self) -> str:
        """The worker's selection in words (for its log)."""
        ingest = self.fleet.settings.ingest
        parts = [f"type {ingest.stream_type!r}"]
        if ingest.stream_name:
            parts.append(f"name starting with {ingest.stream_name!r}")
        if ingest.source_id is not None:
            parts.append(f"source_id matching {ingest.source_id!r}")
        host = ingest.stream_host
        parts.append(f"this host {this_host()!r}" if host is None else f"host matching {host!r}")
        return ", ".join(parts)

    async def run(self, stop: asyncio.Event) -> None:
        """Discover and serve until ``stop``: every stream the selection names (type, name
        prefix, ``ingest.source_id`` glob, ``ingest.stream_host`` glob, by default this host
        only), each logged once as taken or skipped, with the reason."""
        pred = self.predicate()
        ingest = self.fleet.settings.ingest
        every_s = self.fleet.settings.fleet.discover_every_s
        tasks: dict[str, asyncio.Task[None]] = {}
        seen: set[str] = set()  # stream uids already logged as skipped
        worker = self.fleet.worker_id
        logger.info("worker %s: serving LSL streams of %s", worker, self.selection())
        async with asyncio.TaskGroup() as tg:
            while not stop.is_set():
                found = await asyncio.to_thread(pylsl.resolve_bypred, pred, 0, 1.0)
                if stop.is_set():  # it came while resolving: its sessions are ending, take none
                    break
                for info in found:
                    sid = info.source_id() or info.name()
                    if sid in tasks and not tasks[sid].done():
                        continue
                    why = skip_reason(info, ingest, auto=False)
                    if why is not None:
                        if info.uid() not in seen:
                            seen.add(info.uid())
                            logger.warning(
                                "worker %s: skipping LSL stream %s: %s",
                                worker, describe_stream(info), why,
                            )  # fmt: skip
                        continue
                    logger.warning(
                        "worker %s: taking LSL stream %s (selected by %s)",
                        worker, describe_stream(info), self.selection(),
                    )  # fmt: skip
                    tasks[sid] = tg.create_task(
                        self.serve(sid, stop, by_name=not info.source_id()),
                        name=f"gazeguard.runtime.fleet[{sid}]",
                    )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(every_s):
                        await stop.wait()
            for task in tasks.values():
                task.cancel()

    async def serve(self, source_id: str, stop: asyncio.Event, *, by_name: bool = False) -> None:
        """One discovered stream as one session, until it is silent, lost or ``stop``.

        ``source_id`` names the stream: its LSL source_id, or (``by_name``, a stream without
        one) its full name. Either replaces the discovery prefix ``ingest.stream_name``, which
        the stream's own name only starts with."""
        fleet = self.fleet
        key = (
            {"source_id": None, "stream_name": source_id}
            if by_name
            else {"source_id": source_id, "stream_name": None}
        )
        ingest = fleet.settings.ingest.model_copy(update=key)
        session = session_id_for(source_id, "")
        try:
            async with GazeStream(ingest, end_after_s=fleet.settings.fleet.idle_timeout_s) as s:
                rate = declared_rate(ingest.rate_hz, s.info.nominal_srate, s.info.name)
                entry = fleet.open_session(session, rate)
                if entry is None:
                    return
                async for block in s:
                    entry.last_seen = time.monotonic()
                    entry.samples += len(block)  # for the local log: the session's close line
                    await fleet.process_many([(entry, block)])
                    if stop.is_set():
                        break
        except (StreamError, ConfigError) as exc:  # this stream only: the others go on
            logger.warning("worker %s: stream %r: %s", fleet.worker_id, source_id, exc)
        finally:
            fleet.close_session(session)
