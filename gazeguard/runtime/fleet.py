"""Fleet mode: one process serving many sessions, many processes sharing one ledger.

Two ways in:

* **LSL** (``ingest.source = "lsl"``, :class:`gazeguard.runtime.ingest.LslFleetIngest`): every
  ``fleet.discover_every_s`` the worker resolves all streams of ``ingest.stream_type`` (whose
  name starts with ``ingest.stream_name``, if set); each new ``source_id`` becomes a session
  with its own :class:`~gazeguard.runtime.ingest.GazeStream` and
  :class:`~gazeguard.runtime.pipeline.Pipeline`.
  A stream silent for ``fleet.idle_timeout_s`` ends its session.
* **NATS JetStream** (``ingest.source = "jetstream"``, :mod:`gazeguard.runtime.jetstream`; needs the
  ``fleet`` extra): devices publish raw gaze blocks (:mod:`gazeguard.signal.rawgaze`) to one stream
  whose sessions the server hashes into partitions; the server pins each partition on one
  worker and moves the pin when that worker stops pulling. Raw gaze is on that wire: TLS and
  one NATS credential per device and per worker (docs/fleet.md, Trust boundary).

Either way the ledger is the arbiter: a chunk index is charged once, so should two workers ever
serve one session, nothing is released twice or overspent. For fleets, point ``ledger.url`` at
PostgreSQL so that every worker charges one ledger.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import heapq
import itertools
import logging
import math
import os
import socket
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from gazeguard.config import Settings
from gazeguard.core.samples import GazeSamples
from gazeguard.core.threads import to_thread_to_the_end
from gazeguard.ledger import Ledger, LedgerState
from gazeguard.plan import ReleasePlan
from gazeguard.runtime.metrics import SessionMetrics
from gazeguard.runtime.pipeline import (
    Pipeline,
    ReleasedChunk,
    feed_many,
    release_group,
    session_phase,
)
from gazeguard.runtime.publish import Publisher
from gazeguard.signal.events import LOOKBEHIND_S

if TYPE_CHECKING:
    from gazeguard.core.chunking import Chunk
    from gazeguard.runtime.cohort import CohortAggregator
    from gazeguard.runtime.labels import ReleasedLabel
    from gazeguard.runtime.tail import TailProfile
    from gazeguard.signal.compiled import Kernels
    from gazeguard.signal.labels import LabelModel
    from gazeguard.wire.message import StatusMessage

log = logging.getLogger(__name__)

#: Sessions fed per step of :meth:`Fleet.process_many` (a few ms of features at most) before the
#: loop lets due releases and the publisher run.
INGEST_SLICE = 16


@dataclass
class FleetSession:
    """One session a worker serves (:meth:`SessionHost.open_session`): its pipeline, and what
    the ingest adapter serving it keeps about its gaze.

    Attributes:
        pipeline: the session's events → features → chunks → ledger pipeline.
        last_t: sample time of its newest accepted sample, s (``-inf``: none yet); the adapter
            drops samples not after it.
        last_seen: when its stream last delivered, s of ``time.monotonic()`` (idleness).
        samples: gaze samples accepted (timestamps increasing).
        future_samples: samples stamped ahead of the clock: dropped, never adopted as "last".
        dropped_samples: samples dropped for not being newer than ``last_t``.
        bad_blocks: blocks dropped whole (malformed on the wire, or refused by the feature
            extractor).
    """

    pipeline: Pipeline
    last_t: float = -np.inf
    last_seen: float = field(default_factory=time.monotonic)
    samples: int = 0
    future_samples: int = 0
    dropped_samples: int = 0
    bad_blocks: int = 0


class SessionHost(Protocol):
    """What an ingest adapter (:class:`~gazeguard.runtime.ingest.LslFleetIngest`,
    :class:`~gazeguard.runtime.jetstream.JetStreamIngest`) needs of the worker whose sessions it
    feeds: open a session on its first gaze, hand it new samples, close it when its stream ends.
    :class:`Fleet` is the implementation; the adapters type against this.

    Everything is called on the worker's event loop.
    """

    @property
    def settings(self) -> Settings:
        """The worker's settings (``ingest``, ``fleet``, ``features``)."""
        ...

    @property
    def worker_id(self) -> str:
        """This worker's id (logs; the JetStream balance)."""
        ...

    @property
    def ledger(self) -> Ledger:
        """The ledger every session charges (a session taken over resumes after its charges)."""
        ...

    @property
    def kernels(self) -> Kernels | None:
        """The compiled passes the worker's sessions run, chosen once where it started (``None``:
        numpy); the adapter decodes its blocks with them."""
        ...

    @property
    def sessions(self) -> Mapping[str, FleetSession]:
        """The open sessions by session id (read-only: open and close them by the methods)."""
        ...

    def open_session(
        self, session: str, rate_hz: float, device: str | None = None
    ) -> FleetSession | None:
        """The entry of ``session`` (gaze declared at ``rate_hz`` Hz), opened now if new, its
        chunks published under ``device`` (``None``: the worker's ``device`` setting); ``None``
        when refused (``fleet.max_sessions``)."""
        ...

    def close_session(self, session: str) -> None:
        """End ``session`` (its incomplete chunk is dropped); nothing if it is not open."""
        ...

    async def process_many(self, items: Sequence[tuple[FleetSession, GazeSamples]]) -> None:
        """Feed every ``(session, new samples)`` (each session at most once; samples strictly
        after its ``last_t``, shape (N,) per column) and release the chunks that fall due."""
        ...


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """A session a worker opened or closed (:attr:`Fleet.on_session`).

    Attributes:
        event: ``"opened"`` or ``"closed"``.
        device: the headset's device id (its chunks and status are published under it).
        session: the session id (the ledger's account).
        topic: where its privatized chunks go.
        samples: gaze samples this worker accepted for it (0 when opened).
        released: chunks this worker released for it (0 when opened).
    """

    event: Literal["opened", "closed"]
    device: str
    session: str
    topic: str
    samples: int = 0
    released: int = 0


#: The word a released cohort part's log line uses, by its message's schema.
_PART_WORDS = {
    "gazeguard.cohort/1": "aggregate",
    "gazeguard.attention/1": "attention",
    "gazeguard.mode/1": "mode",
}


@dataclass
class CohortWiring:
    """A worker's cohort aggregator and what feeds it from each session's clean features and
    gaze samples."""

    aggregator: CohortAggregator
    columns: np.ndarray  # the profile's columns among the 48 registry features
    model: LabelModel | None
    model_columns: np.ndarray | None

    @classmethod
    def build(
        cls, settings: Settings, plan: ReleasePlan, ledger: Ledger, worker: str, prefix: str
    ) -> CohortWiring:
        """The aggregator of the plan's cohort release (its calibration is the plan's)."""
        from gazeguard.runtime.cohort import CohortAggregator  # noqa: PLC0415
        from gazeguard.signal.features import FEATURES  # noqa: PLC0415
        from gazeguard.signal.labels import load_model  # noqa: PLC0415

        c = settings.cohort
        cohort = plan.cohort_plan
        assert cohort is not None, "the plan has no cohort release (fleet mode, cohort.enabled)"
        all_names = [x.name for x in FEATURES]
        classes = cohort.classes or cohort.mode_classes  # the default model may go unused
        model = load_model(c.model) if c.model is not None and classes else None
        log.info("worker %s: %s", worker, cohort.text())
        agg = CohortAggregator(
            cohort, ledger, cohort=c.name, worker=worker, topic_prefix=prefix,
            profile=settings.mechanism.profile or "custom",
            model=model.name if model else None, grace_s=c.grace_s,
            insecure_seed=settings.mechanism.insecure_seed,
        )  # fmt: skip
        cols = np.array([all_names.index(n) for n in plan.names], dtype=np.intp)
        mcols = (
            None
            if model is None
            else np.array([all_names.index(n) for n in model.features], dtype=np.intp)
        )
        return cls(agg, cols, model, mcols)

    def attach(self, device: str, session: str, pipeline: Pipeline) -> None:
        """Feed the aggregator from ``pipeline``: the session open from now on (every bucket
        of its lifetime is charged to it, valid gaze or not), its clean features when the plan
        releases means or shares (:meth:`observer`), its gaze samples when it releases
        attention (:meth:`gaze_observer`)."""
        self.aggregator.open_session(device, session, time.time())
        plan = self.aggregator.plan
        if plan.part("aggregates") is not None or plan.part("mode") is not None:
            pipeline.on_features = self.observer(device, session, pipeline)
        if plan.part("attention") is not None:
            pipeline.on_samples = self.gaze_observer(device, session, pipeline)

    def gaze_observer(
        self, device: str, session: str, pipeline: Pipeline
    ) -> Callable[[GazeSamples], None]:
        """The :attr:`Pipeline.on_samples` hook of one session: its samples' dwell tallied per
        bucket (sample times → Unix with the pipeline's clock offset)."""

        def observe(block: GazeSamples) -> None:
            self.aggregator.add_gaze(
                device, session, t_unix=block.timestamps + pipeline.clock_offset_s,
                x_deg=block.x_deg, y_deg=block.y_deg, valid=block.valid,
            )  # fmt: skip

        return observe

    def observer(
        self, device: str, session: str, pipeline: Pipeline
    ) -> Callable[[np.ndarray, np.ndarray], None]:
        """The :attr:`Pipeline.on_features` hook of one session (sample times → Unix with the
        pipeline's clock offset: the device's when its blocks state one, else this host's).
        The label model's class probabilities are a function of each window alone (a model
        with per-session state is refused when it is loaded)."""

        def observe(X: np.ndarray, t: np.ndarray) -> None:
            ok = np.all(np.isfinite(X[:, self.columns]), axis=1)
            if not ok.any():
                return
            rows = X[ok]
            probs = None
            if self.model is not None and self.model_columns is not None:
                probs = self.model.predict_proba(np.nan_to_num(rows[:, self.model_columns]))
            t_unix = t[ok] + pipeline.clock_offset_s
            self.aggregator.add(device, session, rows[:, self.columns], t_unix, probs)

        return observe


def _release_labels(pipelines: Sequence[Pipeline]) -> list[ReleasedLabel]:
    """The labels of every decision block the pipelines' features completed, each charged
    (outbox entries for the publisher)."""
    out: list[ReleasedLabel] = []
    for pipe in pipelines:
        pipe.release_labels()
        out += pipe.take_labels()
    return out


def _release(
    jobs: list[tuple[Pipeline, Chunk]],
) -> tuple[list[ReleasedChunk | None], list[StatusMessage]]:
    """:func:`release_group` of ``jobs``, and the status of every session they belong to (from
    its last charge's state, else read from the ledger)."""
    released = release_group(jobs)
    states: dict[Pipeline, LedgerState | None] = {}
    for (pipe, _), out in zip(jobs, released, strict=True):
        states[pipe] = out.state if out is not None else None
    return released, [pipe.status(ledger_state=state) for pipe, state in states.items()]


def ledger_calls_on_loop(settings: Settings, ledger: Ledger) -> bool:
    """A worker makes its chunks' ledger calls (their charges, the outbox) on its event loop
    (``fleet.ledger_calls``; ``auto``: for a local SQLite ledger, :attr:`Ledger.local`), else in
    worker threads. A cohort bucket (:meth:`Fleet.run_cohort`) is charged in a thread either way."""
    mode = settings.fleet.ledger_calls
    return mode == "loop" or (mode == "auto" and ledger.local)


#: A thaw (:class:`LongLived`) at the latest after this many session closes, or 8 × the open
#: sessions if more: a backstop for cyclic garbage that is not a session's pipeline.
THAW_BACKSTOP = 1024
#: A closed pipeline still alive this long after its close, s, is held by something other than
#: its closer (a reference cycle): :class:`LongLived` thaws for the collector.
OUTLIVED_AFTER_S = 5.0


class LongLived:
    """Keeps the garbage collector off the sessions' long-lived objects.

    A session's pipeline (its detector, extractor, chunker, ledger views) lives as long as the
    session, and a full collection walks every such object: ~45 ms at 600 sessions (the tail
    profile, ``bench_fleet.py``), a stall every chunk due meanwhile waits behind. So what is
    alive when a session has opened is frozen (``gc.freeze``: exempt from collections).

    Frozen objects are still freed by reference counting, and a closed session's pipeline is
    (``test_closed_sessions_are_freed_without_the_collector``). Only cyclic garbage would wait.
    A thaw (``gc.unfreeze``) hands everything frozen back to the next full collection, which
    then walks every open session's objects too: > 100 ms at 900 sessions. So the pipelines
    closed are watched (weak references) and each is judged once :data:`OUTLIVED_AFTER_S` has
    passed since its close: whoever closed it (a sweep closing many sessions holds them all
    until it ends) has let it go by then. After closes adding up to a quarter of the open
    sessions (at least 16), it thaws only if one of them outlived its close, or as a backstop
    after :data:`THAW_BACKSTOP` closes (or 8 × the open sessions); the next session opened
    freezes again.

    Args:
        clock: monotonic seconds (``time.monotonic``; a test's own clock).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # pipelines closed and not judged yet: (when, s of clock; a weak reference), oldest first
        self._closed: collections.deque[tuple[float, weakref.ref[object]]] = collections.deque()
        self._outlived = False  # a judged pipeline was alive: thaw at the next check
        self._since_thaw = 0

    def opened(self) -> None:
        """A session opened: freeze what is alive."""
        gc.freeze()

    def closed(self, pipeline: object, still_open: int) -> None:
        """``pipeline``'s session closed (``still_open`` remain; the caller may still hold
        ``pipeline``: it is judged :data:`OUTLIVED_AFTER_S` later, at a later close)."""
        now = self._clock()
        while self._closed and now - self._closed[0][0] >= OUTLIVED_AFTER_S:
            _, ref = self._closed.popleft()
            self._outlived = self._outlived or ref() is not None
        self._closed.append((now, weakref.ref(pipeline)))
        self._since_thaw += 1
        if self._since_thaw >= max(16, still_open // 4) and (
            self._outlived or self._since_thaw >= max(THAW_BACKSTOP, 8 * still_open)
        ):
            self._since_thaw = 0
            self._outlived = False
            gc.unfreeze()


class Fleet:
    """Many sessions in one process, all charging one ledger and draining one publisher: the
    :class:`SessionHost` the worker's ingest adapter feeds.

    Args:
        settings: the service settings (``fleet`` section, ``ingest.source`` "lsl" or
            "jetstream").
        plan: the release plan every session follows (and the cohort's, when enabled).
        ledger: shared ledger (PostgreSQL for several processes), with the plan's caps.
        publisher: shared publisher of privatized chunks.
        kernels: the compiled passes every session runs
            (:func:`gazeguard.signal.compiled.load_kernels`, ``fleet.compiled``), or ``None``:
            numpy. The same chunks either way, bit for bit.
    """

    def __init__(
        self,
        settings: Settings,
        plan: ReleasePlan,
        ledger: Ledger,
        publisher: Publisher,
        kernels: Kernels | None = None,
    ) -> None:
        self.settings = settings
        self.kernels = kernels
        self.plan = plan
        self.ledger = ledger
        self.publisher = publisher
        self._on_loop = ledger_calls_on_loop(settings, ledger)
        self.worker_id = settings.fleet.worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.sessions: dict[str, FleetSession] = {}
        self.refused = 0
        self.closed: list[str] = []
        self.on_session: Callable[[SessionEvent], None] | None = None
        """Called on the event loop with each session opened and closed (``gazeguard run
        --fleet`` prints one line each)."""
        self.metrics = SessionMetrics()  # the operator metrics (metrics.port), else no-op
        #: The batch, GC and loop-lag histograms (with the operator metrics), else ``None``.
        self.tail: TailProfile | None = None
        # Chunks the gaze completed before they came due: (due, Unix s; order; pipeline, chunk),
        # a heap, released by run_due when the clock reaches them (the schedule is the clock's).
        self._held: list[tuple[float, int, Pipeline, Chunk]] = []
        self._order = itertools.count()
        self._wake = asyncio.Event()  # a new chunk is held: run_due looks at the heap again
        self._releasing = asyncio.Lock()  # one release at a time (in order, one thread)
        self._ingest = asyncio.Lock()  # one ingest slice at a time (process_many)
        self._heap = LongLived()
        self.cohort: CohortWiring | None = (
            CohortWiring.build(
                settings, plan, ledger, self.worker_id, publisher.settings.topic_prefix
            )
            if plan.cohort_plan is not None
            else None
        )

    def open_session(
        self, session: str, rate_hz: float, device: str | None = None
    ) -> FleetSession | None:
        """The session's entry, opened now if new with its stream's declared ``rate_hz``
        (``None`` when refused: ``fleet.max_sessions``): its chunks and status are published
        under ``device`` (the headset's id, as the deployment's broker ACL expects: device =
        username; ``None``: this worker's ``device`` setting, e.g. for LSL streams)."""
        if session in self.sessions:
            return self.sessions[session]
        if len(self.sessions) >= self.settings.fleet.max_sessions:
            self.refused += 1
            log.warning(
                "worker %s: refusing session %r: fleet.max_sessions=%d reached",
                self.worker_id,
                session,
                self.settings.fleet.max_sessions,
            )
            return None
        device = device or self.settings.device
        pipeline = Pipeline(
            self.ledger,
            session=session,
            device=device,
            rate_hz=rate_hz,
            plan=self.plan,
            topic_prefix=self.publisher.settings.topic_prefix,
            kernels=self.kernels,
            phase_s=session_phase(session, self.plan.grid_s),
        )
        if self.cohort is not None:
            self.cohort.attach(device, session, pipeline)
        self.sessions[session] = FleetSession(pipeline)
        self._heap.opened()
        self.metrics.opened(pipeline)
        self.publisher.publish_status(pipeline.status("starting"))
        log.info("worker %s: session %r opened (device %r)", self.worker_id, session, device)
        if self.on_session is not None:
            self.on_session(SessionEvent("opened", device, session, pipeline.topic))
        return self.sessions[session]

    def close_session(self, session: str) -> None:
        """End ``session``: its pipeline closed (the incomplete chunk dropped), its status
        "stopped" published; nothing if it is not open."""
        entry = self.sessions.pop(session, None)
        if entry is None:
            return
        self._release_held_of(entry.pipeline)
        entry.pipeline.close()
        self._heap.closed(entry.pipeline, len(self.sessions))
        self.metrics.closed(entry.pipeline)
        if self.cohort is not None:
            self.cohort.aggregator.close_session(entry.pipeline.device, session, time.time())
        self.publisher.publish_status(entry.pipeline.status("stopped"))
        self.closed.append(session)
        log.info(
            "worker %s: session %r closed (%d samples, %d dropped as not newer, %d as ahead of "
            "the clock, %d bad blocks; %d chunks released)",
            self.worker_id,
            session,
            entry.samples,
            entry.dropped_samples,
            entry.future_samples,
            entry.bad_blocks,
            entry.pipeline.stats.released,
        )
        if self.on_session is not None:
            pipe = entry.pipeline
            self.on_session(
                SessionEvent(
                    "closed", pipe.device, session, pipe.topic, entry.samples, pipe.stats.released
                )
            )

    async def process_many(self, items: Sequence[tuple[FleetSession, GazeSamples]]) -> None:
        """:meth:`_process_many` of ``items`` in slices of :data:`INGEST_SLICE` sessions, one
        ingest at a time, yielding to the loop after each slice; each slice is timed into
        ``gazeguard_batch_seconds`` when the operator metrics are on (:attr:`tail`).

        The worker's partitions pull concurrently, and blocks sent at the same moment (headsets
        on one clock) arrive as one burst: processed as they came, the partitions' batches
        would run back to back in one turn of the event loop, and a chunk coming due meanwhile
        (:meth:`run_due`), or charged and waiting for the publisher, would wait for all of
        them. One ingest at a time, a slice at a time, it waits for at most one slice."""
        async with self._ingest:
            for start in range(0, len(items), INGEST_SLICE):
                # a session closed while an earlier slice yielded takes no more gaze
                part = [
                    (entry, block)
                    for entry, block in items[start : start + INGEST_SLICE]
                    if self.sessions.get(entry.pipeline.session) is entry
                ]
                if not part:
                    continue
                started = time.perf_counter()
                try:
                    await self._process_many(part)
                finally:
                    if self.tail is not None:
                        self.tail.batch_seconds.observe(time.perf_counter() - started)
                await asyncio.sleep(0)  # the due releases and the publisher go first

    async def _process_many(self, items: Sequence[tuple[FleetSession, GazeSamples]]) -> None:
        """Events and features inline for every ``(session, new samples)`` (each session once),
        session by session (:func:`~gazeguard.runtime.pipeline.feed_many`). The
        chunks they complete are held until they come due (:meth:`due`, :meth:`run_due`); those
        due already are privatized and charged in ONE call (group commit,
        :func:`~gazeguard.runtime.pipeline.release_group`), then one publisher wake-up. A block
        the feature extractor refuses is dropped and counted (its session's ``bad_blocks``).

        The release call runs on the event loop for a local SQLite ledger (:attr:`Ledger.local`)
        and in a worker thread otherwise (PostgreSQL: network round trips; any ledger with
        ``fleet.ledger_calls = "thread"``, e.g. on a disk whose fsync can stall). In a thread,
        each of its ~20 SQLite calls gives the GIL up and then waits up to the switch interval
        (5 ms) to get it back from a loop busy with other sessions' features: at 500 sessions
        (bench_fleet, one same-run pair) the loop sustained p50 6.4 / p99 32.6 ms and threads
        did not (12.8 / 66.9 ms). The outbox calls are on the loop too
        (:class:`~gazeguard.ledger.outbox.Drain` ``inline``)."""
        jobs, refused = feed_many([(entry.pipeline, block) for entry, block in items])
        for pipe, exc in refused:
            entry = self.sessions.get(pipe.session)
            if entry is not None:
                entry.bad_blocks += 1
            log.warning("session %r: gaze block dropped: %s", pipe.session, exc)
        for pipe, chunk in jobs:
            heapq.heappush(self._held, (self.due(pipe, chunk), next(self._order), pipe, chunk))
        if jobs:
            self._wake.set()
        now = time.time()
        if self._held and self._held[0][0] <= now:  # a backlog, a lag, or came due
            await self._release_due(now)
        labeled = [entry.pipeline for entry, _ in items if entry.pipeline.labels is not None]
        if labeled:  # private labels (labels.enabled): decided, charged, then published
            if self._on_loop:
                labels = _release_labels(labeled)
            else:
                labels = await to_thread_to_the_end(_release_labels, labeled)
            self.publisher.notify(labels)

    def due(self, pipeline: Pipeline, chunk: Chunk) -> float:
        """When ``chunk`` of ``pipeline`` comes due, Unix s: its last window's end plus the
        detector's look-behind and ``ingest.late_after_s``, a time on the public grid."""
        end = float(chunk.timestamps[-1]) + pipeline.clock_offset_s
        return end + LOOKBEHIND_S + self.settings.ingest.late_after_s

    def _release_held_of(self, pipeline: Pipeline) -> None:
        """A closing session's held chunks (complete, not yet due) go now, before its last
        status; while another release is charging in a thread they are made due at once
        instead (the next release takes them first, in order)."""
        mine = sorted(h for h in self._held if h[2] is pipeline)
        if not mine:
            return
        self._held = [h for h in self._held if h[2] is not pipeline]
        if self._releasing.locked():  # a release in a worker thread: never two at once
            self._held += [(-math.inf, order, pipe, chunk) for _, order, pipe, chunk in mine]
            heapq.heapify(self._held)
            self._wake.set()
            return
        heapq.heapify(self._held)
        self._publish(*_release([(pipe, chunk) for _, _, pipe, chunk in mine]))

    def _publish(self, released: list[ReleasedChunk | None], statuses: list[StatusMessage]) -> None:
        """Hand charged chunks to the publisher, then their sessions' statuses (a session
        closed meanwhile keeps "stopped" as its last word)."""
        self.publisher.notify([out for out in released if out is not None])
        for status in statuses:
            closed = status.session not in self.sessions and status.state != "stopped"
            self.publisher.publish_status(
                status.model_copy(update={"state": "stopped"}) if closed else status
            )

    async def release_held(self) -> None:
        """Release every held chunk now, due or not (the worker stops: what the gaze completed
        is charged and published, as before a stop)."""
        await self._release_due(math.inf)

    async def _release_due(self, now: float) -> None:
        """Release every held chunk due by ``now`` (Unix s) as one group: charged (on the loop
        or in a thread, :func:`ledger_calls_on_loop`), handed to the publisher, each session's
        status after."""
        async with self._releasing:
            jobs: list[tuple[Pipeline, Chunk]] = []
            while self._held and self._held[0][0] <= now:
                due, _, pipe, chunk = heapq.heappop(self._held)
                jobs.append((pipe, chunk))
                # its latency counts from when it came due (the hold is the schedule's)
                pipe._completed_at = time.perf_counter() - max(0.0, time.time() - due)
            if not jobs:
                return
            if self._on_loop:  # not cancellable midway either: charged chunks reach the outbox
                released, statuses = _release(jobs)
            else:
                released, statuses = await to_thread_to_the_end(_release, jobs)
        self._publish(released, statuses)

    async def run_due(self, stop: asyncio.Event) -> None:
        """Release held chunks as they come due (:meth:`due`), until ``stop``.

        A chunk the gaze completed early waits for its due time, so that when a chunk is
        published is a function of the public grid and the clock, not of when its last sample
        came; one completed after it (a backlog, a worker behind) goes at once."""

        async def wake_on_stop() -> None:
            await stop.wait()
            self._wake.set()

        waker = asyncio.create_task(wake_on_stop())
        try:
            while not stop.is_set():
                now = time.time()
                if self._held and self._held[0][0] <= now:
                    await self._release_due(now)
                    continue
                delay = min(1.0, self._held[0][0] - now) if self._held else 1.0
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
        finally:
            waker.cancel()

    async def run_cohort(self, stop: asyncio.Event) -> None:
        """Release every closed cohort bucket (ledger commits in a worker thread), once a second,
        until ``stop``; the bucket in progress at the stop is not released."""
        if self.cohort is None:
            return
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            released = await to_thread_to_the_end(self.cohort.aggregator.release_due, time.time())
            for r in released:
                log.info(
                    "worker %s: cohort %r bucket %d %s released over %d sessions (%d left out)",
                    self.worker_id, r.message.cohort, r.message.bucket,
                    _PART_WORDS[r.message.schema_],
                    len(r.sessions), len(r.left_out),
                )  # fmt: skip
            if released:
                self.metrics.cohort_released(released)
                self.publisher.notify([r.enqueued for r in released if r.enqueued is not None])
