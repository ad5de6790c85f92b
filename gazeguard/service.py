"""``gazeguard run``: the sidecar. LSL gaze in, charged privatized chunks out over MQTT.

Wiring (asyncio on uvloop, one session per headset stream)::

    GazeStream ──blocks──> Pipeline.push (worker thread: events, features, chunks,
    (ingest thread)                       mechanism, ledger charge + outbox, one transaction)
                                  │ notify
                                  ▼
                           Publisher (drains the ledger outbox in order, QoS 1, PUBACK)

Resources are async context managers entered in order and left in reverse: ledger, broker
(embedded when ``broker.host`` is unset), publisher, simulated headset (when the ingest source
resolves to it), LSL stream. The ingest loop runs as a named task; SIGINT/SIGTERM, ``duration_s``
or the end of the stream stop it; the incomplete last chunk is dropped, a final retained status
says ``stopped`` and the publisher gets a few seconds to drain the outbox (what it cannot send
stays in the ledger and goes out on the next start).

Session id: ``settings.session`` if set, else derived from the stream's ``source_id`` (or name)
so that a restarted sidecar continues the same ledger account: budgets are never refilled by a
restart. The simulated headset has a stable ``source_id`` per simulated person for the same
reason.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gazeguard.broker import EmbeddedBroker
from gazeguard.chunking import Chunk
from gazeguard.config import (
    BrokerSettings,
    IngestSettings,
    Settings,
    broker_address,
    load_settings,
)
from gazeguard.errors import ConfigError, StreamNotFoundError
from gazeguard.fleet import Fleet
from gazeguard.ingest import GazeStream
from gazeguard.ledger import Ledger
from gazeguard.message import IngestCounters, SessionState
from gazeguard.pipeline import Pipeline, PipelineStats, ReleasedChunk
from gazeguard.presets import IngestStats
from gazeguard.publish import Publisher
from gazeguard.simulate import SimulatedHeadset

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: In ``source = "auto"`` with nothing configured, wait this long for a real headset, s.
AUTO_RESOLVE_S = 2.0
#: Seconds the publisher gets at shutdown to drain the outbox.
FLUSH_AT_EXIT_S = 5.0
#: Republish the retained status at least this often while running, s.
STATUS_EVERY_S = 5.0


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What one ``gazeguard run`` did."""

    session: str
    device: str
    stats: PipelineStats
    spent: float
    remaining: float | None
    pending: int
    broker: str
    ledger: str


def session_id_for(source_id: str, name: str) -> str:
    """A topic-safe session id derived from the stream identity (stable across restarts)."""
    raw = source_id or name or "gaze"
    return re.sub(r"[^A-Za-z0-9_.:-]+", "_", raw)[:120]


@contextlib.asynccontextmanager
async def _broker(settings: BrokerSettings) -> AsyncIterator[BrokerSettings]:
    if settings.host is not None:
        yield settings
        return
    async with EmbeddedBroker("127.0.0.1", settings.port) as broker:
        yield broker.settings(settings)


@contextlib.asynccontextmanager
async def _outbound(settings: Settings) -> AsyncIterator[tuple[Ledger, Publisher]]:
    """The ledger, the broker (embedded if none is configured) and the publisher draining the
    ledger's outbox; on the way out the publisher gets ``FLUSH_AT_EXIT_S`` to deliver what is
    left (what it cannot send stays in the outbox for the next start)."""
    with Ledger.from_settings(settings.ledger) as ledger:
        async with (
            _broker(settings.broker) as broker,
            Publisher(broker, ledger, name="gazeguard.publish") as publisher,
        ):
            try:
                yield ledger, publisher
            finally:
                try:
                    await publisher.flush(FLUSH_AT_EXIT_S)
                except Exception as exc:  # reported; the outbox keeps the chunks
                    log.warning("%s", exc)


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
        quick = settings.model_copy(
            update={"resolve_timeout_s": min(settings.resolve_timeout_s, AUTO_RESOLVE_S)}
        )
        found = GazeStream(quick)
        try:
            await found.__aenter__()
        except StreamNotFoundError:
            log.warning(
                "no LSL stream of type %r found within %g s: starting the SIMULATED headset "
                "(set ingest.source = 'lsl' to wait for a real one)",
                settings.stream_type,
                quick.resolve_timeout_s,
            )
        else:
            try:
                yield found
            finally:
                await found.__aexit__(None, None, None)
            return
    source_id = settings.source_id or f"gazeguard-sim-{settings.simulated_seed}"
    with SimulatedHeadset.from_settings(settings, source_id=source_id):
        sim = settings.model_copy(update={"source_id": source_id, "preset": "gazeguard"})
        async with GazeStream(sim) as stream:
            yield stream


async def serve(
    settings: Settings,
    *,
    duration_s: float | None = None,
    stop: asyncio.Event | None = None,
    on_release: Callable[[ReleasedChunk], None] | None = None,
    tap: Callable[[Chunk, ReleasedChunk], None] | None = None,
    ready: Callable[[Pipeline, str], None] | None = None,
) -> RunSummary:
    """Run the sidecar until ``stop`` is set, ``duration_s`` passes or the stream ends.

    Args:
        settings: the validated configuration.
        duration_s: stop after this long (None: until stopped).
        stop: set it to stop (SIGINT/SIGTERM set it in :func:`run_run`).
        on_release: called (in a worker thread) for each charged chunk.
        tap: in-process raw-vs-released hook for diagnostics (``gazeguard demo``).
        ready: called with the pipeline and the broker ``host:port`` once everything is up.
    """
    stop = stop or asyncio.Event()
    async with _outbound(settings) as (ledger, publisher), _gaze(settings.ingest) as stream:
        info = stream.info
        session = settings.session or session_id_for(info.source_id, info.name)
        pipeline = Pipeline(
            ledger,
            session=session,
            device=settings.device,
            features=settings.features,
            mechanism=settings.mechanism,
            topic_prefix=publisher.settings.topic_prefix,
            on_release=on_release,
            tap=tap,
        )
        log.info(
            "session %r: %s %s n=%d k=%s, %d features, ε %.6g per chunk; broker %s",
            session,
            settings.mechanism.name,
            settings.mechanism.transform,
            settings.mechanism.chunk_steps,
            pipeline.mechanism.k,
            len(pipeline.feature_names),
            pipeline.chunk_epsilon,
            publisher.endpoint,
        )
        publisher.publish_status(pipeline.status("starting"))
        freeze_startup_objects()
        if ready is not None:
            ready(pipeline, publisher.endpoint)
        failure: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                ingest = tg.create_task(
                    _ingest(stream, pipeline, publisher), name=f"gazeguard[{session}].ingest"
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
            final: SessionState = "stream_lost" if failure is not None else "stopped"
            reason = None if failure is None else f"ingest failed: {failure}"
            publisher.publish_status(pipeline.status(final, reason, ingest_counters(stream.stats)))
        if failure is not None:
            raise failure
        state = ledger.state(session)
        return RunSummary(
            session,
            settings.device,
            pipeline.stats,
            state.spent,
            state.remaining,
            len(ledger.pending(session=session)),
            publisher.endpoint,
            str(settings.ledger.url or settings.ledger.path),
        )
    raise AssertionError("unreachable")  # pragma: no cover


async def serve_fleet(
    settings: Settings,
    *,
    duration_s: float | None = None,
    stop: asyncio.Event | None = None,
    ready: Callable[[Fleet], None] | None = None,
) -> Fleet:
    """Fleet mode: serve every session that appears (LSL streams or MQTT raw gaze).

    Returns the :class:`~gazeguard.fleet.Fleet` (its ``closed`` sessions and counters).
    """
    if settings.ingest.source not in ("lsl", "mqtt"):
        raise ConfigError(
            "ingest.source",
            settings.ingest.source,
            "fleet mode serves real streams: set ingest.source to 'lsl' or 'mqtt'",
        )
    stop = stop or asyncio.Event()
    async with _outbound(settings) as (ledger, publisher):
        fleet = Fleet(settings, ledger, publisher)
        freeze_startup_objects()
        log.info(
            "fleet worker %s: %s sessions, publishing to %s",
            fleet.worker_id,
            settings.ingest.source,
            publisher.endpoint,
        )
        if ready is not None:
            ready(fleet)
        run = fleet.run_mqtt if settings.ingest.source == "mqtt" else fleet.run_lsl
        async with asyncio.TaskGroup() as tg:
            tg.create_task(run(stop), name="gazeguard.fleet")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(duration_s):
                    await stop.wait()
            stop.set()
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


def ingest_counters(stats: IngestStats) -> IngestCounters:
    """The status message's view of a stream's ingest counters."""
    return IngestCounters.model_validate(
        {name: getattr(stats, name) for name in IngestCounters.model_fields}
    )


async def _ingest(stream: GazeStream, pipeline: Pipeline, publisher: Publisher) -> None:
    """Feed blocks through the pipeline (in a worker thread) and wake the publisher.

    Keeps the retained status current: ``stream_lost`` once no usable sample arrived for
    ``ingest.stream_lost_after_s`` (the stream is watched even while it sends nothing), back to
    the pipeline's own state when samples resume, and republished with the ingest counters at
    least every ``STATUS_EVERY_S``.
    """
    lost_after = stream.settings.stream_lost_after_s
    tick = min(1.0, lost_after / 4)
    last_status = time.monotonic()
    last_state: SessionState = pipeline.stats.state
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
                released = await asyncio.to_thread(pipeline.push, block)
                if released:
                    publisher.notify(released)
            idle = stream.idle_s
            lost = idle > lost_after
            state: SessionState = "stream_lost" if lost else pipeline.stats.state
            now = time.monotonic()
            if state == last_state and now - last_status <= STATUS_EVERY_S:
                continue
            reason = None
            if lost:
                reason = (
                    f"no usable gaze sample for {idle:.0f} s (ingest.stream_lost_after_s = "
                    f"{lost_after:g}); waiting for the stream"
                )
                if last_state != "stream_lost":
                    log.warning("session %r: %s", pipeline.session, reason)
            elif last_state == "stream_lost":
                log.warning("session %r: gaze samples resumed", pipeline.session)
            publisher.publish_status(pipeline.status(state, reason, ingest_counters(stream.stats)))
            last_status, last_state = now, state
    finally:
        pending.cancel()


# ------------------------------------------------------------------------------ CLI


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by ``run`` and ``demo`` (each maps to one setting; flags win over env/file)."""
    g = parser.add_argument_group("configuration (flags override GAZEGUARD_* env and --config)")
    g.add_argument("--config", type=Path, help="TOML configuration file")
    g.add_argument("--device", help="device id in topics (default: host name)")
    g.add_argument("--session", help="session id (default: derived from the stream source_id)")
    g.add_argument(
        "--source",
        choices=["auto", "lsl", "simulated", "mqtt"],
        help="gaze source (default auto: an LSL stream, else the simulated headset; "
        "mqtt: raw gaze over MQTT in fleet mode, trusted networks only)",
    )
    g.add_argument("--stream-type", help="LSL stream type to resolve (default Gaze)")
    g.add_argument("--stream-name", help="LSL stream name to resolve")
    g.add_argument("--source-id", help="LSL source_id to resolve")
    g.add_argument("--mechanism", choices=["lpa", "cfpa", "dcfpa"], help="default dcfpa")
    g.add_argument("--transform", choices=["dft", "dct"], help="default dft")
    g.add_argument("--chunk-steps", type=int, help="n, steps per chunk (power of two; 32)")
    g.add_argument("-k", "--k", dest="k", help="kept frequencies, or 'auto' (default)")
    g.add_argument("--epsilon", type=float, help="ε per feature per chunk (default 1.0)")
    g.add_argument("--features", help="comma-separated release profile (default: all)")
    g.add_argument("--window-s", type=float, help="feature window W, s (default 30)")
    g.add_argument("--step-s", type=float, help="feature step s, s (default 0.5)")
    g.add_argument("--ledger", type=Path, help="ledger SQLite file")
    g.add_argument("--session-cap", type=float, help="max total ε per session")
    g.add_argument("--broker", help="HOST[:PORT] of the MQTT broker (default: embedded)")
    g.add_argument(
        "--fleet",
        action="store_true",
        default=None,
        help="serve every stream found (LSL) or claimed (ingest.source=mqtt), one session each",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Load settings from ``--config``, the environment and the flags that were given."""
    o: dict[str, Any] = {}

    def put(section: str | None, key: str, value: object) -> None:
        if value is not None:
            (o.setdefault(section, {}) if section else o)[key] = value

    put(None, "device", args.device)
    put(None, "session", args.session)
    put("ingest", "source", args.source)
    put("ingest", "stream_type", args.stream_type)
    put("ingest", "stream_name", args.stream_name)
    put("ingest", "source_id", args.source_id)
    put("mechanism", "name", args.mechanism)
    put("mechanism", "transform", args.transform)
    put("mechanism", "chunk_steps", args.chunk_steps)
    put("mechanism", "k", args.k)
    put("mechanism", "epsilon", args.epsilon)
    if args.features:
        put("mechanism", "features", [f.strip() for f in args.features.split(",") if f.strip()])
    put("features", "window_s", args.window_s)
    put("features", "step_s", args.step_s)
    put("fleet", "enabled", args.fleet)
    put("ledger", "path", args.ledger)
    put("ledger", "session_cap", args.session_cap)
    if args.broker:
        o["broker"] = broker_address(args.broker)
    return load_settings(args.config, **o)


def configure_run(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard run``."""
    parser.description = (
        "Run the privacy sidecar: read gaze from an LSL stream (or the simulated headset when "
        "none is configured), compute sliding-window features, privatize each chunk with "
        "DCFPA (or LPA/CFPA), charge it to the durable ε ledger, publish it over MQTT "
        "(an embedded broker when none is configured). Stops on Ctrl-C / SIGTERM."
    )
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    parser.add_argument("--quiet", action="store_true", help="no per-chunk progress lines")
    add_settings_arguments(parser)


def _banner(pipeline: Pipeline, endpoint: str, settings: Settings) -> None:
    first = settings.features.window_s + settings.mechanism.chunk_steps * settings.features.step_s
    cap = settings.ledger.session_cap
    budget = (
        f"session cap {cap:g}"
        if cap is not None
        else "no session cap: the user-level ε grows with every chunk (set ledger.session_cap)"
    )
    print(  # noqa: T201 - startup banner of the CLI
        f"gazeguard: session {pipeline.session!r} → broker {endpoint}; "
        f"{pipeline.mechanism.name}/{pipeline.mechanism.transform} n={pipeline.chunker.n_steps} "
        f"k={pipeline.mechanism.k}, {len(pipeline.feature_names)} features, "
        f"ε {pipeline.chunk_epsilon:g} per chunk; {budget}. "
        f"First chunk after about {first:g} s of gaze, then one every "
        f"{settings.mechanism.chunk_steps * settings.features.step_s:g} s.",
        file=sys.stderr,
        flush=True,
    )


def _progress(out: ReleasedChunk) -> None:
    led = out.message.ledger
    remaining = "uncapped" if led.remaining is None else f"{led.remaining:.6g} left"
    print(  # noqa: T201 - progress output of the CLI
        f"chunk {out.message.chunk_index:>5} charged ε={led.chunk_epsilon:.6g} "
        f"(session total {led.session_spent:.6g}, {remaining}) → {out.topic}",
        file=sys.stderr,
        flush=True,
    )


def run_run(args: argparse.Namespace) -> int:
    """``gazeguard run``."""
    settings = settings_from_args(args)

    async def main() -> RunSummary:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await serve(
            settings,
            duration_s=args.duration,
            stop=stop,
            on_release=None if args.quiet else _progress,
            ready=lambda p, ep: _banner(p, ep, settings),
        )

    if settings.fleet.enabled:
        return _run_fleet(settings, args.duration)
    summary = run_loop(main())
    s = summary.stats
    remaining = "no cap" if summary.remaining is None else f"{summary.remaining:.6g} remaining"
    print(  # noqa: T201
        f"gazeguard: session {summary.session!r}: {s.released} chunks released, "
        f"{s.withheld} withheld, {s.dropped} dropped, {s.tail_steps_dropped} tail steps dropped; "
        f"ε spent {summary.spent:.6g} ({remaining}); {summary.pending} chunks still in the "
        f"outbox; ledger {summary.ledger}",
        file=sys.stderr,
    )
    return 0


def _run_fleet(settings: Settings, duration_s: float | None) -> int:
    async def main() -> Fleet:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await serve_fleet(settings, duration_s=duration_s, stop=stop)

    fleet = run_loop(main())
    print(  # noqa: T201
        f"gazeguard fleet worker {fleet.worker_id}: {len(fleet.closed)} sessions served, "
        f"{len(fleet.sessions)} open at exit, {fleet.refused} refused",
        file=sys.stderr,
    )
    return 0


def run_loop(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` on uvloop (the plain asyncio loop where uvloop is unavailable)."""
    try:
        import uvloop  # noqa: PLC0415

    except ImportError:  # pragma: no cover - Windows
        return asyncio.run(coro)
    return uvloop.run(coro)
