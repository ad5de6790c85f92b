"""``gazeguard run``: the sidecar. LSL gaze in, charged privatized chunks out over MQTT.

Wiring (asyncio; ``gazeguard run`` (:mod:`gazeguard.cli.run`) runs it on uvloop; one session per
headset stream)::

    GazeStream ──blocks──> Pipeline.push (worker thread: events, features, chunks,
    (ingest thread)                       mechanism, ledger charge + outbox, one transaction)
                                  │ notify
                                  ▼
                           Publisher (drains the ledger outbox in order, QoS 1, PUBACK)

The configuration is checked first (:func:`gazeguard.runtime.preflight.require_valid`: the checks
``gazeguard config check`` runs). Resources are async context managers entered in order and left in
reverse: ledger, broker (embedded when ``broker.host`` is unset), publisher, simulated headset (when
the ingest source resolves to it), LSL stream. The ingest loop runs as a named task; SIGINT/SIGTERM,
``duration_s`` or the end of the stream stop it; the incomplete last chunk is dropped, a final
retained status says ``stopped`` and the publisher gets a few seconds to drain the outbox (what it
cannot send stays in the ledger and goes out on the next start). :class:`RunSummary` says what
happened, including how delivery went, so that the command line can choose its exit status.

Session id: ``settings.session`` if set, else derived from the stream's ``source_id`` (or name)
so that a restarted sidecar continues the same ledger account: budgets are never refilled by a
restart. The simulated headset's default ``source_id`` is unique to the process
(``gazeguard-sim-SEED-TAG``, :data:`PROCESS_TAG`), so two runs on one host never become one
session by accident; a simulated person has no real budget, and ``ingest.source_id`` names one
to continue.

A session is served by one process: before anything of it is published, :func:`serve` reads the
session's retained status on the broker and refuses to start (:class:`SessionInUseError`) when it
says another process is serving it (a live state, republished within :data:`LIVE_STATUS_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pylsl

from gazeguard.config import BrokerSettings, IngestSettings, LedgerSettings, Settings
from gazeguard.core.chunking import Chunk
from gazeguard.core.errors import GazeguardError, PublishError
from gazeguard.core.threads import to_thread_to_the_end
from gazeguard.ledger import Ledger
from gazeguard.plan import ReleasePlan
from gazeguard.runtime.fleet import Fleet, ledger_calls_on_loop
from gazeguard.runtime.ingest import (
    GazeStream,
    GazeStreamInfo,
    LslFleetIngest,
    declared_rate,
    select_auto,
)
from gazeguard.runtime.metrics import Metrics, SessionMetrics, metrics_for, serving
from gazeguard.runtime.mqtt.broker import EmbeddedBroker, probe_mqtt
from gazeguard.runtime.mqtt.retained import read_retained
from gazeguard.runtime.pipeline import Pipeline, PipelineStats, ReleasedChunk
from gazeguard.runtime.preflight import (
    require_valid,
    simulated_source_id,
)
from gazeguard.runtime.presets import IngestStats
from gazeguard.runtime.publish import Publisher
from gazeguard.runtime.simulate import SimulatedHeadset
from gazeguard.runtime.tail import TailProfile
from gazeguard.signal.compiled import load_kernels
from gazeguard.wire.message import SessionState, StatusMessage
from gazeguard.wire.topics import session_id_for, status_topic

if TYPE_CHECKING:
    from gazeguard.runtime.labels import LabelStats, ReleasedLabel

log = logging.getLogger(__name__)

#: In ``source = "auto"`` with nothing configured, wait this long for a real headset, s.
AUTO_RESOLVE_S = 2.0
#: Seconds the publisher gets at shutdown to drain the outbox.
FLUSH_AT_EXIT_S = 5.0
#: Republish the retained status at least this often while running, s.
STATUS_EVERY_S = 5.0
#: A retained status in a live state (not ``stopped``) made less than this long ago means
#: another process serves its session (it republishes at least every ``STATUS_EVERY_S``); an
#: older one was left by a process that died, s.
LIVE_STATUS_S = 3 * STATUS_EVERY_S


class SessionInUseError(GazeguardError):
    """The session is being served by another process (its retained status says so)."""


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What one ``gazeguard run`` did.

    Attributes:
        session, device: the ledger account and the device id in topics.
        stats: the pipeline's counters (chunks released, withheld, dropped; tail steps).
        spent, remaining: the session's user-level ε at the ledger's δ after the run (the
            accountant's composition), and what is left under the session cap (``None``: no
            cap).
        pending: charged chunks of the session still in the outbox after the final flush.
        broker: ``host:port`` published to.
        ledger: the ledger's path or URL.
        delivered: outbox items the broker acknowledged during this run.
        broker_connections: successful connections to the broker (0: unreachable throughout).
        broker_refusals: times the broker refused the login or a chunk (ACL, credentials, TLS).
        broker_error: the last connection or delivery problem, or ``None``.
        refused: charged chunks of the session the broker permanently refused (moved aside in
            the ledger; ``gazeguard ledger show`` lists them).
        labels: the label stream's counters (``None``: labels not enabled).
        label_release: ``change`` or ``clock`` (with labels).
        label_epsilon: ε at δ of this run's labels alone (the accountant's composition of
            their randomized responses and detection rounds; within :attr:`spent`).
        backlog, backlog_sent: releases an earlier run had left in the outbox when this one
            started (any session of the ledger), and how many of them left the outbox during
            this run (delivered, or refused by the broker).
    """

    session: str
    device: str
    stats: PipelineStats
    spent: float
    remaining: float | None
    pending: int
    broker: str
    ledger: str
    delivered: int = 0
    broker_connections: int = 0
    broker_refusals: int = 0
    broker_error: str | None = None
    refused: int = 0
    labels: LabelStats | None = None
    label_release: str | None = None
    label_epsilon: float | None = None
    backlog: int = 0
    backlog_sent: int = 0


@contextlib.asynccontextmanager
async def _broker(settings: BrokerSettings) -> AsyncIterator[BrokerSettings]:
    if settings.host is not None:
        yield settings
        return
    # No broker configured: use the one already answering on the port (a local Mosquitto, very
    # common for MQTT users), else start the embedded one — on a free port if the configured
    # one is taken by something that is not an open MQTT broker, and say which.
    port = settings.port
    found = await asyncio.to_thread(probe_mqtt, "127.0.0.1", port) if port else "none"
    if found == "mqtt":
        log.warning(
            "no broker.host configured and another process's MQTT broker already answers on "
            "127.0.0.1:%d (a local Mosquitto, or the embedded broker of another gazeguard run): "
            "publishing to it; while it is down, chunks wait in the outbox (set broker.host to "
            "choose a broker explicitly)",
            port,
        )
        yield settings.model_copy(update={"host": "127.0.0.1"})
        return
    if found != "none":
        what = (
            "an MQTT broker that refuses anonymous clients"
            if found == "mqtt-refused"
            else ("something that does not speak MQTT")
        )
        log.warning(
            "port %d on 127.0.0.1 is taken by %s: starting the embedded broker on a free port",
            port,
            what,
        )
        port = 0
    async with EmbeddedBroker("127.0.0.1", port) as broker:
        yield broker.settings(settings)


@dataclass(slots=True)
class _Outbound:
    ledger: Ledger
    publisher: Publisher
    backlog: frozenset[int] = frozenset()  # outbox ids an earlier run left pending
    flushed: bool = False

    def backlog_sent(self) -> int:
        """How many of :attr:`backlog` are no longer pending (delivered, or refused)."""
        if not self.backlog:
            return 0
        still = {item.id for item in self.ledger.pending()} & self.backlog
        return len(self.backlog) - len(still)

    async def flush(self) -> None:
        """Give the publisher ``FLUSH_AT_EXIT_S`` to deliver the outbox (once)."""
        if self.flushed:
            return
        self.flushed = True
        try:
            await self.publisher.flush(FLUSH_AT_EXIT_S)
        except PublishError as exc:  # reported; the outbox keeps the chunks
            log.warning("%s", exc)


@contextlib.asynccontextmanager
async def _outbound(
    settings: Settings, plan: ReleasePlan, *, fleet: bool = False, metrics: Metrics | None = None
) -> AsyncIterator[_Outbound]:
    """The ledger, the broker (embedded if none is configured) and the publisher draining the
    ledger's outbox; on the way out the publisher gets ``FLUSH_AT_EXIT_S`` to deliver what is
    left (what it cannot send stays in the outbox for the next start). A ``fleet`` worker on a
    local ledger drains on its event loop (see
    :meth:`gazeguard.runtime.fleet.Fleet.process_many`). ``metrics``: the operator metrics,
    given the ledger and the publisher to read (and the publisher's acknowledgements)."""
    with open_ledger(settings.ledger, plan) as ledger:
        left = frozenset(item.id for item in ledger.pending())  # before the publisher sends them
        backlog = len(left)
        if backlog:
            log.warning(
                "sending %d chunk%s left from the last run first (charged then, still in the "
                "outbox of ledger %s)",
                backlog, "" if backlog == 1 else "s", ledger.backend.location,
            )  # fmt: skip
        inline = fleet and ledger_calls_on_loop(settings, ledger)
        async with (
            _broker(settings.broker) as broker,
            Publisher(
                broker, ledger, name="gazeguard.runtime.publish", inline=inline,
                on_acked=None if metrics is None else metrics.acked,
                on_sent=None if metrics is None else metrics.sent,
            ) as publisher,
        ):  # fmt: skip
            if metrics is not None:
                metrics.bind(ledger, publisher)
            out = _Outbound(ledger, publisher, left)
            try:
                yield out
            finally:
                await out.flush()


@contextlib.asynccontextmanager
async def _gaze(settings: IngestSettings) -> AsyncIterator[GazeStream]:
    """Open the configured gaze stream, or the simulated headset (see ``ingest.source``)."""
    explicit = settings.source_id is not None or settings.stream_name is not None
    if settings.source == "lsl" or (settings.source == "auto" and explicit):
        # (with source = "simulated", a configured source_id names the simulated outlet)
        async with GazeStream(settings) as stream:
            yield stream
        return
    if settings.source == "auto":
        # Only a stream of this host (or ingest.stream_host) that is no gazeguard simulated
        # headset; more than one candidate is refused with a list (AmbiguousStreamError).
        timeout_s = min(settings.resolve_timeout_s, AUTO_RESOLVE_S)
        picked = await asyncio.to_thread(select_auto, settings, timeout_s)
        if picked is None:
            log.warning(
                "no LSL stream of type %r on %s found within %g s (gazeguard simulated headsets "
                "of other processes are never used; -v lists what was skipped): starting this "
                "run's own SIMULATED headset (set ingest.source = 'lsl' to wait for a real one)",
                settings.stream_type,
                "this host" if settings.stream_host is None else repr(settings.stream_host),
                timeout_s,
            )
        else:
            key = picked.source_id()
            one = settings.model_copy(
                update={"source_id": key} if key else {"stream_name": picked.name()}
            )
            async with GazeStream(one) as stream:
                _say_attached(stream.info)
                yield stream
            return
    source_id = simulated_source_id(settings)
    with SimulatedHeadset.from_settings(settings, source_id=source_id):
        sim = settings.model_copy(update={"source_id": source_id, "preset": "gazeguard"})
        async with GazeStream(sim) as stream:
            yield stream


def _say_attached(info: GazeStreamInfo) -> None:
    """The one line of ``ingest.source = "auto"`` when it found a stream: another process's."""
    log.warning(
        "ingest.source auto: using LSL stream %r (type %r, source_id %r) of another process on "
        "this host %r, the only one of its type; this run's gaze ends when that stream does "
        "(--source-id %s names it)",
        info.name, info.type, info.source_id, info.hostname, info.source_id or "ID",
    )  # fmt: skip


async def check_session_free(broker: BrokerSettings, device: str, session: str) -> None:
    """Refuse a session another process is serving: its retained status on the broker is in a
    live state and was made less than :data:`LIVE_STATUS_S` ago.

    A status that cannot be read (no connection, an ACL that lets this client read nothing) or
    does not parse lets the session start.

    Raises:
        SessionInUseError: the status says another process serves the session.
    """
    topic = status_topic(broker.topic_prefix, device, session)
    payload = await read_retained(broker, topic)
    if payload is None:
        return
    try:
        status = StatusMessage.from_payload(payload)
    except ValueError as exc:
        log.debug("retained status on %s does not parse (%s); starting", topic, exc)
        return
    age = time.time() - status.time
    if status.state == "stopped" or age > LIVE_STATUS_S:
        if status.state != "stopped":
            log.info(
                "session %r: its retained status says %r but is %.0f s old (its process is "
                "gone); starting", session, status.state, age,
            )  # fmt: skip
        return
    where = f"{broker.host}:{broker.port}"
    msg = (
        f"session {session!r} of device {device!r} is being served by another process: its "
        f"retained status on broker {where} says {status.state!r}, {max(age, 0.0):.0f} s ago "
        f"({topic}). Stop that process, or give this run a session of its own: --session NAME, "
        "or --source simulated for a simulated headset of its own"
    )
    raise SessionInUseError(msg)


def open_ledger(settings: LedgerSettings, plan: ReleasePlan, **kwargs: Any) -> Ledger:
    """The ledger ``settings`` describe (``url`` when set, else ``path``), with the plan's caps
    (the hourly budget over every release one hour of gaze can change)."""
    return Ledger(
        settings.url if settings.url is not None else settings.path,
        settings.synchronous,
        caps=plan.ledger_caps(settings),
        **kwargs,
    )


async def serve(
    settings: Settings,
    *,
    duration_s: float | None = None,
    stop: asyncio.Event | None = None,
    on_release: Callable[[ReleasedChunk], None] | None = None,
    tap: Callable[[Chunk, ReleasedChunk], None] | None = None,
    ready: Callable[[Pipeline, str], None] | None = None,
    on_progress: Callable[[ReleasedChunk, bool], None] | None = None,
    on_label: Callable[[ReleasedLabel, bool], None] | None = None,
) -> RunSummary:
    """Run the sidecar until ``stop`` is set, ``duration_s`` passes or the stream ends.

    Args:
        settings: the validated configuration.
        duration_s: stop after this long (None: until stopped).
        stop: set it to stop (``gazeguard run`` sets it on SIGINT/SIGTERM).
        on_release: called (in a worker thread) for each charged chunk.
        tap: in-process raw-vs-released hook for diagnostics (``gazeguard demo``).
        ready: called with the pipeline and the broker ``host:port`` once everything is up.
        on_progress: like ``on_release``, with whether the broker connection is up at that
            moment (``False``: the chunk waits in the outbox).
        on_label: called on the event loop with each charged label (``labels.enabled``) and
            whether the broker connection is up at that moment.

    Raises:
        ConfigError: :func:`~gazeguard.runtime.preflight.validate_settings` found a problem
            (before anything is opened), or the ledger refused the caps.
        SessionInUseError: another process serves the session (:func:`check_session_free`);
            nothing of the session was published.
    """
    plan = require_valid(settings)
    stop = stop or asyncio.Event()
    metrics = metrics_for(settings.metrics, "sidecar", settings.device)
    hooks = metrics or SessionMetrics()
    async with (
        serving(metrics, settings.metrics),
        _outbound(settings, plan, metrics=metrics) as out,
        _gaze(settings.ingest) as stream,
    ):
        ledger, publisher = out.ledger, out.publisher
        info = stream.info
        session = settings.session or session_id_for(info.source_id, info.name)
        await check_session_free(publisher.settings, settings.device, session)
        released = on_release
        if on_progress is not None:
            report = on_progress

            def released(out: ReleasedChunk) -> None:
                if on_release is not None:
                    on_release(out)
                report(out, publisher.connected)

        pipeline = Pipeline(
            ledger,
            session=session,
            device=settings.device,
            rate_hz=declared_rate(settings.ingest.rate_hz, info.nominal_srate, info.name),
            plan=plan,
            topic_prefix=publisher.settings.topic_prefix,
            on_release=released,
            tap=tap,
            opens_at=float(pylsl.local_clock()),  # the session opens now: a public time
        )
        hooks.opened(pipeline)
        _log_start(pipeline, publisher.endpoint)
        publisher.publish_status(pipeline.status("starting"))
        freeze_startup_objects()
        if ready is not None:
            ready(pipeline, publisher.endpoint)
        failure: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                ingest = tg.create_task(
                    _ingest(stream, pipeline, publisher, on_label),
                    name=f"gazeguard[{session}].ingest",
                )
                waiter = tg.create_task(stop.wait(), name=f"gazeguard[{session}].stop")
                await asyncio.wait(
                    {ingest, waiter}, timeout=duration_s, return_when=asyncio.FIRST_COMPLETED
                )
                ingest.cancel()
                waiter.cancel()
        except* Exception as group:
            failure = group.exceptions[0]
        finally:
            pipeline.close()
            hooks.closed(pipeline)
            final: SessionState = "stream_lost" if failure is not None else "stopped"
            # Fixed words on the (retained, shared) status topic: an exception's text or type
            # may depend on the stream's values; the full error is in the local log, and so
            # are the ingest's sample counters (never on the broker: they count the gaze).
            reason = (
                None
                if failure is None
                else "the gaze stream ended with an error (see the sidecar log)"
            )
            log_ingest_counters(session, stream.stats)
            publisher.publish_status(pipeline.status(final, reason))
        if failure is not None:
            raise failure
        await out.flush()
        return _summary(settings, pipeline, out)
    raise AssertionError("unreachable")  # pragma: no cover


def _log_start(pipeline: Pipeline, endpoint: str) -> None:
    """The sidecar's start line: mechanism, features, ε per chunk, broker (and the label plan)."""
    session, mech = pipeline.session, pipeline.mechanism
    if pipeline.label_plan is not None:
        log.info("session %r: %s", session, pipeline.label_plan.text())
    log.info(
        "session %r: %s %s n=%d k=%s %s, %d features; broker %s; %s",
        session, mech.name, mech.transform, mech.n, mech.k, mech.noise,
        len(pipeline.feature_names), endpoint, pipeline.plan.text(),
    )  # fmt: skip


def _summary(settings: Settings, pipeline: Pipeline, out: _Outbound) -> RunSummary:
    """What a finished sidecar run did, from the pipeline, the ledger and the publisher."""
    ledger, publisher = out.ledger, out.publisher
    session = pipeline.session
    state = ledger.state(session)
    labels = pipeline.labels
    return RunSummary(
        session,
        settings.device,
        pipeline.stats,
        state.epsilon,
        state.remaining,
        len(ledger.pending(session=session)),
        publisher.endpoint,
        ledger.backend.location,  # a URL's password masked
        delivered=publisher.delivered,
        broker_connections=publisher.connections,
        broker_refusals=publisher.refusals,
        broker_error=publisher.last_error,
        refused=state.refused,
        labels=None if labels is None else labels.stats,
        label_release=None if labels is None else labels.plan.release,
        label_epsilon=None if labels is None else labels.epsilon,
        backlog=len(out.backlog),
        backlog_sent=out.backlog_sent(),
    )


async def serve_fleet(
    settings: Settings,
    *,
    duration_s: float | None = None,
    stop: asyncio.Event | None = None,
    ready: Callable[[Fleet], None] | None = None,
) -> Fleet:
    """Fleet mode: serve every session that appears (LSL streams or JetStream raw gaze).

    Returns the :class:`~gazeguard.runtime.fleet.Fleet` (its ``closed`` sessions and counters).

    Raises:
        ConfigError: :func:`~gazeguard.runtime.preflight.validate_settings` found a problem (e.g.
            a source other than 'lsl' or 'jetstream', or 'jetstream' without nats-py).
    """
    settings = settings.model_copy(
        update={"fleet": settings.fleet.model_copy(update={"enabled": True})}
    )
    plan = require_valid(settings)
    stop = stop or asyncio.Event()
    metrics = metrics_for(settings.metrics, "fleet", settings.fleet.worker_id or "")
    async with (
        serving(metrics, settings.metrics),
        _outbound(settings, plan, fleet=True, metrics=metrics) as out,
    ):
        ledger, publisher = out.ledger, out.publisher
        # The one switch between the numpy passes and the compiled ones: chosen here, once, and
        # handed to every session's detector and extractor and to the block decoder.
        kernels = load_kernels(settings.fleet.compiled)
        if settings.fleet.compiled:
            log.info(
                "fleet worker: block decode, detector passes, sample bins and window statistics %s",
                "compiled (numba)"
                if kernels is not None
                else "by numpy (numba not installed, or GAZEGUARD_COMPILED=0)",
            )
        fleet = Fleet(settings, plan, ledger, publisher, kernels)
        if metrics is not None:
            fleet.metrics, metrics.worker = metrics, fleet.worker_id
            metrics.bind(ledger, publisher, lambda: fleet.refused)
            if settings.metrics.tail:
                fleet.tail = metrics.tail = TailProfile(metrics.registry)
        freeze_startup_objects()
        log.info(
            "fleet worker %s: %s sessions, publishing to %s",
            fleet.worker_id,
            settings.ingest.source,
            publisher.endpoint,
        )
        if ready is not None:
            ready(fleet)
        if settings.ingest.source == "jetstream":
            from gazeguard.runtime.jetstream import JetStreamIngest  # noqa: PLC0415 - the fleet extra (nats-py)

            ingest: JetStreamIngest | LslFleetIngest = JetStreamIngest(fleet)
        else:
            ingest = LslFleetIngest(fleet)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(ingest.run(stop), name="gazeguard.runtime.fleet")
                tg.create_task(fleet.run_cohort(stop), name="gazeguard.runtime.fleet.cohort")
                tg.create_task(fleet.run_due(stop), name="gazeguard.runtime.fleet.due")
                probe = None
                if fleet.tail is not None:
                    fleet.tail.install()
                    probe = tg.create_task(fleet.tail.probe_loop(), name="gazeguard.tail")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(duration_s):
                        await stop.wait()
                stop.set()
                if probe is not None:
                    probe.cancel()
            await fleet.release_held()  # the gaze completed them: charged and sent, as ever
        finally:
            if fleet.tail is not None:
                fleet.tail.uninstall()
        return fleet
    raise AssertionError("unreachable")  # pragma: no cover


def freeze_startup_objects() -> None:
    """Collect once, then exempt everything alive from later collections (``gc.freeze``).

    The ~70,000 objects of the imported libraries and the service's setup never die, yet every
    full (generation-2) collection walks them: ~17 ms on the benchmark machine, a stall that hit
    every session at once every 12-18 s in fleet runs. Frozen, a full collection only walks what
    was allocated since. Process-wide; the service calls it once everything is set up.
    """
    gc.collect()
    gc.freeze()


def log_ingest_counters(session: str, stats: IngestStats) -> None:
    """The gaze ingest's sample counters (``IngestStats``: samples delivered, invalid, dropped
    and why, lost, resyncs), in one line of the local log: a debugging view that stays on the
    device. They count the gaze (``invalid`` is the blink signal), so they never go to the
    broker (:mod:`gazeguard.wire.egress`)."""
    names = (
        "samples", "invalid", "dropped", "duplicates", "out_of_order", "implausible", "future",
        "nonfinite", "overflow", "lost", "resyncs", "stalls", "reconnects",
    )  # fmt: skip
    counts = ", ".join(f"{n} {getattr(stats, n)}" for n in names)
    log.info("session %r: gaze ingest (local only): %s", session, counts)


async def _ingest(
    stream: GazeStream,
    pipeline: Pipeline,
    publisher: Publisher,
    on_label: Callable[[ReleasedLabel, bool], None] | None = None,
) -> None:
    """Feed blocks through the pipeline (in a worker thread) and wake the publisher.

    Keeps the retained status current: the pipeline's state (from the ledger and the release
    schedule), republished at least every ``STATUS_EVERY_S``. Whether samples arrive is the
    gaze's business: a stream with no usable sample for ``ingest.stream_lost_after_s`` (it is
    watched even while it sends nothing) is said in the local log only, never in the status.
    """
    lost_after = stream.settings.stream_lost_after_s
    late_after = stream.settings.late_after_s
    tick = min(1.0, lost_after / 4)
    last_status = time.monotonic()
    last_state: SessionState = pipeline.stats.state
    quiet = False  # no usable sample for lost_after (local log only)
    blocks = aiter(stream)
    pending = asyncio.ensure_future(anext(blocks))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=tick)
            if done:
                try:
                    block = pending.result()
                except StopAsyncIteration:
                    return
                pending = asyncio.ensure_future(anext(blocks))
                await to_thread_to_the_end(pipeline.queue, block)
            # Releases follow the clock: every window that ended late_after_s ago, gaze or not.
            watermark = float(pylsl.local_clock()) - late_after
            released = await to_thread_to_the_end(pipeline.advance, watermark)
            _hand_on(pipeline, publisher, released, on_label)
            idle = stream.idle_s
            if (idle > lost_after) != quiet:
                quiet = not quiet
                if quiet:
                    log.warning(
                        "session %r: no usable gaze sample for %.0f s (ingest.stream_lost_after_s"
                        " = %g); waiting for the stream (local log only)",
                        pipeline.session, idle, lost_after,
                    )  # fmt: skip
                else:
                    log.warning("session %r: gaze samples resumed", pipeline.session)
                    log_ingest_counters(pipeline.session, stream.stats)
            state = pipeline.stats.state
            now = time.monotonic()
            if state == last_state and now - last_status <= STATUS_EVERY_S:
                continue
            publisher.publish_status(pipeline.status(state))
            last_status, last_state = now, state
    finally:
        pending.cancel()
        # A stop that lands while ``advance`` runs waits for it (to_thread_to_the_end) but
        # skips the hand-off above: the labels it charged are said and handed on here.
        _hand_on(pipeline, publisher, [], on_label)


def _hand_on(
    pipeline: Pipeline,
    publisher: Publisher,
    released: list[ReleasedChunk],
    on_label: Callable[[ReleasedLabel, bool], None] | None,
) -> None:
    """Say the labels charged since the last call; wake the publisher for them and ``released``."""
    labels = pipeline.take_labels()
    if on_label is not None:
        for label in labels:
            on_label(label, publisher.connected)
    if released or labels:
        publisher.notify([*released, *labels])
