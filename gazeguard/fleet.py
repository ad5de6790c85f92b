"""Fleet mode: one process serving many sessions, many processes sharing one ledger.

Two ways in:

* **LSL** (``ingest.source = "lsl"``): every ``fleet.discover_every_s`` the worker resolves all
  streams of ``ingest.stream_type`` (whose name starts with ``ingest.stream_name``, if set);
  each new ``source_id`` becomes a session with its own
  :class:`~gazeguard.ingest.GazeStream` and :class:`~gazeguard.pipeline.Pipeline`. A stream
  silent for ``fleet.idle_timeout_s`` ends its session.
* **MQTT raw gaze** (``ingest.source = "mqtt"``, inside a trusted network only: raw gaze is on
  the wire): devices publish gaze blocks in the compact binary format below. Sessions are spread
  over worker processes with an MQTT v5 **shared subscription** — but a session's feature window
  must live in one worker, and a shared subscription hands out *messages*, not sessions
  (Mosquitto round-robins them). So sessions are *claimed*: a device publishes a hello on
  ``{raw}/hello``; the workers share-subscribe ``$share/{group}/{raw}/hello``, so exactly one of
  them receives it, subscribes to the session's gaze topic and publishes the retained owner
  ``{raw}/{device}/{session}/owner``, echoing the hello's nonce; the device starts sending
  gaze once it sees an owner for *its* hello (:class:`RawGazeSender`), so a stale retained
  owner left by a dead worker is never mistaken for a live one. Should two workers ever both
  serve a session, the ledger is the arbiter: a chunk index is charged once, so nothing is
  released twice or overspent.

**Failover.** Each worker keeps a retained ``{raw}/workers/{worker}`` = ``online`` and leaves
an MQTT will that sets it to ``offline``: the broker publishes it when the worker's connection
dies (at once for a killed process, after 1.5 keepalives for a vanished host). A device watches
its owner's liveness topic and its session's owner topic; when the owner goes offline or lets
the session go, the device buffers its blocks (bounded) and says hello again until another
worker claims the session, then sends the buffer in order. The new worker's feature window
starts empty (the first vector comes W seconds later); the ledger continues the chunk numbering
and the spent budget, and any chunk the dead worker had charged but not delivered is published
from the shared outbox by the surviving workers. Blocks the device sent between the death and
the will are lost (with a killed process, that window is one round trip).

**Broker outage.** Workers and devices reconnect with jittered backoff. A worker that reconnects
subscribes to its sessions' gaze topics again and republishes their owner messages with the
nonces it answered (a broker without persistence has forgotten them); a reconnected device waits
for that renewed claim (``resume_timeout_s``) before saying hello to anyone else, and meanwhile
buffers. A broker that shuts down first publishes every client's will, so a device treats an
``offline`` owner as dead only if its own connection survives ``OFFLINE_GRACE_S``. A broker
without persistence also forgets the blocks it had acknowledged (QoS 1) but not yet delivered to
the worker: the renewed claim says ``through`` which sample time the worker holds, and the device
sends again, from the blocks it keeps after sending (``max_buffered``), every block after it. The
session keeps its worker, its feature window and every sample.

Topics (raw side): ``{raw}/hello`` (JSON ``{"device", "session", "nonce"}`` and, from
``gazeguard forward``, ``"unix_offset"``: Unix time minus the blocks' timestamps on the device's
host, so that a worker on another host dates the gaze correctly, and ``"now"``: the blocks' clock
when the hello left, so that the worker knows how far the device's gaze may run without trusting
the two hosts' Unix clocks to agree),
``{raw}/{device}/{session}/gaze`` (binary blocks, QoS 1), ``{raw}/{device}/{session}/owner``
(retained JSON ``{"worker", "time", "nonce", "through"}``, ``through``: the newest sample time
the worker holds, absent before the first; emptied when the worker closes the session),
``{raw}/workers/{worker}`` (retained ``online``/``offline``).

Raw block format (little-endian): ``b"GGR1"``, ``uint32`` N, then four float64 arrays of N:
timestamps (s), x (deg), y (deg), pupil (mm; NaN if absent). NaN gaze marks invalid samples.
Samples whose timestamp does not increase are dropped and counted, as LSL ingest does.

For fleets, point ``ledger.url`` at PostgreSQL so that every worker charges one ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Self

import aiomqtt
import numpy as np
import pylsl

from gazeguard._threads import to_thread_to_the_end
from gazeguard.config import BrokerSettings, Settings
from gazeguard.errors import ConfigError, PublishError, StreamError
from gazeguard.ingest import GazeStream
from gazeguard.ledger import Ledger
from gazeguard.mqtt_client import MqttClient
from gazeguard.pipeline import Pipeline
from gazeguard.publish import Publisher, credentials, tls_context
from gazeguard.rawgaze import decode_gaze, encode_gaze
from gazeguard.samples import GazeSamples, lsl_unix_offset
from gazeguard.topics import session_id_for

if TYPE_CHECKING:
    from gazeguard.cohort import CohortAggregator
    from gazeguard.labels import LabelModel

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RawTopics:
    """The raw-gaze topics of one session."""

    gaze: str
    owner: str

    @classmethod
    def of(cls, prefix: str, device: str, session: str) -> RawTopics:
        """Topics under ``prefix`` for ``device``/``session``."""
        for name, value in (("device", device), ("session", session)):
            if not value or any(c in value for c in "/+#\0"):
                msg = f"{name} {value!r} is not a valid topic level"
                raise StreamError(msg)
        base = f"{prefix}/{device}/{session}"
        return cls(f"{base}/gaze", f"{base}/owner")


def worker_topic(prefix: str, worker: str) -> str:
    """The retained liveness topic of ``worker`` (``online``/``offline``) under ``prefix``."""
    return f"{prefix}/workers/{worker}"


def _client(
    settings: BrokerSettings, identifier: str, will: aiomqtt.Will | None = None
) -> MqttClient:
    username, password = credentials(settings)
    return MqttClient(
        settings.host or "127.0.0.1",
        settings.port,
        username=username,
        password=password,
        identifier=identifier,
        protocol=aiomqtt.ProtocolVersion.V5,
        keepalive=settings.keepalive_s,
        tls_context=tls_context(settings),
        will=will,
    )


@dataclass
class _Session:
    pipeline: Pipeline
    topics: RawTopics | None
    last_t: float = -np.inf
    last_seen: float = field(default_factory=time.monotonic)
    samples: int = 0  # accepted (timestamps increasing)
    future_samples: int = 0  # stamped ahead of the clock: dropped, never adopted as "last"
    # The device's clock (the blocks' timestamps) as its hello stated it, and this host's
    # monotonic time when the hello arrived: (device "now", monotonic), s.
    clock_ref: tuple[float, float] | None = None
    dropped_samples: int = 0
    bad_blocks: int = 0
    nonce: str = ""  # of the hello this worker answered: its retained claim echoes it

    def owner_payload(self, worker: str) -> bytes:
        """The retained owner message of this session when served by ``worker``: with
        ``through``, the newest sample time it holds (absent before the first sample)."""
        said: dict[str, object] = {"worker": worker, "time": time.time(), "nonce": self.nonce}
        if math.isfinite(self.last_t):
            said["through"] = self.last_t
        return json.dumps(said).encode()


@dataclass
class CohortWiring:
    """A worker's cohort aggregator and what feeds it from each session's clean features."""

    aggregator: CohortAggregator
    columns: np.ndarray  # the profile's columns among the 48 registry features
    model: LabelModel | None
    model_columns: np.ndarray | None

    @classmethod
    def build(cls, settings: Settings, ledger: Ledger, worker: str, prefix: str) -> CohortWiring:
        """The plan for the release profile (and model) at the cohort's share of the budget.

        Raises:
            ConfigError: no per-hour budget, or a model for another window or step.
        """
        from gazeguard.cohort import CohortAggregator, plan_cohort  # noqa: PLC0415
        from gazeguard.features import FEATURES, feature_bounds  # noqa: PLC0415
        from gazeguard.labels import load_model  # noqa: PLC0415

        c, f = settings.cohort, settings.features
        budget = settings.ledger.budget_per_hour
        if budget is None:
            why = "cohort aggregates are calibrated to ledger.budget_per_hour; set one"
            raise ConfigError("cohort.enabled", True, why)
        all_names = [x.name for x in FEATURES]
        names = list(settings.mechanism.features or all_names)
        lo, hi, _ = feature_bounds(names, f.window_s, f.step_s)
        units = [FEATURES[all_names.index(n)].unit for n in names]
        model = load_model(c.model) if c.model is not None else None
        if model is not None and (
            model.spec.window_s != f.window_s or model.spec.step_s != f.step_s
        ):
            why = (
                f"model {model.name!r} was trained on {model.spec.window_s:g} s windows every "
                f"{model.spec.step_s:g} s; features here are {f.window_s:g} s every {f.step_s:g} s"
            )
            raise ConfigError("cohort.model", c.model, why)
        plan = plan_cohort(
            names, lo, hi, units, model.classes if model else (),
            bucket_s=c.bucket_s, budget=c.budget_share * budget, delta=settings.ledger.delta / 2,
        )  # fmt: skip
        log.info("worker %s: %s", worker, plan.text())
        agg = CohortAggregator(
            plan, ledger, cohort=c.name, worker=worker, topic_prefix=prefix,
            profile=settings.mechanism.profile or "custom",
            model=model.name if model else None, grace_s=c.grace_s,
            insecure_seed=settings.mechanism.insecure_seed,
        )  # fmt: skip
        cols = np.array([all_names.index(n) for n in names], dtype=np.intp)
        mcols = (
            None
            if model is None
            else np.array([all_names.index(n) for n in model.features], dtype=np.intp)
        )
        return cls(agg, cols, model, mcols)

    def observer(
        self, device: str, session: str, pipeline: Pipeline
    ) -> Callable[[np.ndarray, np.ndarray], None]:
        """The :attr:`Pipeline.on_features` hook of one session (sample times → Unix with the
        pipeline's clock offset: the device's when its hello stated one, else this host's)."""

        def observe(X: np.ndarray, t: np.ndarray) -> None:
            ok = np.all(np.isfinite(X[:, self.columns]), axis=1)
            if not ok.any():
                return
            rows = X[ok]
            probs = None
            if self.model is not None and self.model_columns is not None:
                probs = self.model.predict_proba(np.nan_to_num(rows[:, self.model_columns]))
            offset = pipeline.clock_offset_s
            t_unix = t[ok] + (lsl_unix_offset() if offset is None else offset)
            self.aggregator.add(device, session, rows[:, self.columns], t_unix, probs)

        return observe


class Fleet:
    """Many sessions in one process, all charging one ledger and draining one publisher.

    Args:
        settings: the service settings (``fleet`` section, ``ingest.source`` "lsl" or "mqtt").
        ledger: shared ledger (PostgreSQL for several processes).
        publisher: shared publisher of privatized chunks.
    """

    def __init__(self, settings: Settings, ledger: Ledger, publisher: Publisher) -> None:
        self.settings = settings
        self.ledger = ledger
        self.publisher = publisher
        self.worker_id = settings.fleet.worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.sessions: dict[str, _Session] = {}
        self.refused = 0
        self.late_blocks = 0  # blocks of sessions already closed, dropped
        self._late_said: set[str] = set()
        self.closed: list[str] = []
        self._attempt = 0  # failed raw-broker connections in a row
        self.cohort: CohortWiring | None = (
            CohortWiring.build(settings, ledger, self.worker_id, publisher.settings.topic_prefix)
            if settings.cohort.enabled
            else None
        )

    def _open_session(self, session: str, topics: RawTopics | None) -> _Session | None:
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
        pipeline = Pipeline(
            self.ledger,
            session=session,
            device=self.settings.device,
            features=self.settings.features,
            mechanism=self.settings.mechanism,
            topic_prefix=self.publisher.settings.topic_prefix,
            cohort_share=self.settings.cohort.budget_share if self.cohort else None,
        )
        if self.cohort is not None:
            pipeline.on_features = self.cohort.observer(self.settings.device, session, pipeline)
        self.sessions[session] = _Session(pipeline, topics)
        self.publisher.publish_status(pipeline.status("starting"))
        log.info("worker %s: session %r opened", self.worker_id, session)
        return self.sessions[session]

    def _close_session(self, session: str) -> None:
        entry = self.sessions.pop(session, None)
        if entry is None:
            return
        entry.pipeline.close()
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

    async def _process(self, entry: _Session, block: GazeSamples) -> None:
        """Features inline (cheap), privatize + durable charge in a worker thread."""
        chunks = entry.pipeline.feed(block)
        if not chunks:
            return
        released = [await to_thread_to_the_end(entry.pipeline.release, c) for c in chunks]
        self.publisher.notify([out for out in released if out is not None])
        self.publisher.publish_status(entry.pipeline.status())

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
                    "worker %s: cohort %r bucket %d released over %d sessions (%d left out)",
                    self.worker_id, r.message.cohort, r.message.bucket, len(r.sessions),
                    len(r.left_out),
                )  # fmt: skip
            if released:
                self.publisher.notify()

    # ------------------------------------------------------------------ MQTT raw gaze
    async def run_mqtt(self, stop: asyncio.Event) -> None:
        """Claim sessions from the shared hello subscription and serve their gaze topics.

        Reconnects with jittered backoff when the raw broker goes away; sessions keep their
        state and their gaze subscriptions are renewed.
        """
        while not stop.is_set():
            try:
                await self._run_mqtt_once(stop)
            except* aiomqtt.MqttError as group:
                self._attempt += 1
                cap = (self.settings.fleet.raw_broker or self.publisher.settings).reconnect_max_s
                delay = random.uniform(0, min(cap, 1.5**self._attempt))
                log.warning(
                    "worker %s: raw gaze broker: %s; reconnecting in %.1f s",
                    self.worker_id,
                    group.exceptions[0],
                    delay,
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await stop.wait()
            else:
                return

    async def _run_mqtt_once(self, stop: asyncio.Event) -> None:
        fleet = self.settings.fleet
        raw = fleet.raw_broker or self.publisher.settings
        hello = f"{fleet.raw_prefix}/hello"
        alive = worker_topic(fleet.raw_prefix, self.worker_id)
        will = aiomqtt.Will(alive, b"offline", qos=1, retain=True)
        async with _client(raw, f"gazeguard-worker-{self.worker_id}", will) as client:
            self._attempt = 0  # connected: the next outage starts its backoff afresh
            # Subscribed first, then "online": a retained online means this worker can claim.
            await client.subscribe(f"$share/{fleet.share_group}/{hello}", qos=1)
            await client.publish(alive, b"online", qos=1, retain=True)
            now = time.monotonic()
            for session, entry in self.sessions.items():  # resume after a reconnect
                entry.last_seen = now  # the outage is not the device's silence
                if entry.topics is not None:
                    await client.subscribe(entry.topics.gaze, qos=1)
                    # Claim it again: a broker without persistence forgot the retained owner,
                    # and the device waits for this (its last nonce) before asking anyone else.
                    payload = entry.owner_payload(self.worker_id)
                    await client.publish(entry.topics.owner, payload, qos=1, retain=True)
                    log.debug("resumed %s", session)
            log.info("worker %s: waiting for sessions on %s", self.worker_id, hello)
            async with asyncio.TaskGroup() as tg:
                reader = tg.create_task(self._read(client, hello), name="gazeguard.fleet.read")
                sweeper = tg.create_task(self._sweep(client), name="gazeguard.fleet.sweep")
                await stop.wait()
                reader.cancel()
                sweeper.cancel()
            for session in list(self.sessions):
                await self._release_claim(client, session)
            with contextlib.suppress(aiomqtt.MqttError):
                await client.publish(alive, b"offline", qos=1, retain=True)

    async def _read(self, client: aiomqtt.Client, hello: str) -> None:
        async for message in client.messages:
            payload = message.payload
            if not isinstance(payload, bytes | bytearray):
                continue
            topic = str(message.topic)
            if topic == hello:
                await self._claim(client, bytes(payload))
            elif topic.endswith("/gaze"):
                await self._on_gaze(topic, bytes(payload))

    async def _claim(self, client: aiomqtt.Client, payload: bytes) -> None:
        try:
            hello = json.loads(payload)
            device, session = str(hello["device"]), str(hello["session"])
            nonce = str(hello.get("nonce", ""))
            topics = RawTopics.of(self.settings.fleet.raw_prefix, device, session)
            offset, device_now = hello.get("unix_offset"), hello.get("now")
            for name, value in (("unix_offset", offset), ("now", device_now)):
                if value is not None and not (
                    isinstance(value, int | float) and math.isfinite(value)
                ):
                    raise ValueError(f"{name} must be a finite number, got {value!r}")
        except (ValueError, KeyError, TypeError, StreamError) as exc:
            log.warning("worker %s: ignoring malformed hello %r: %s", self.worker_id, payload, exc)
            return
        entry = self._open_session(f"{device}.{session}", topics)
        if entry is None:
            return
        if offset is not None:  # the device's clock, not ours: its samples → Unix time
            entry.pipeline.clock_offset_s = float(offset)
        if device_now is not None:
            entry.clock_ref = (float(device_now), time.monotonic())
        entry.nonce = nonce
        await client.subscribe(topics.gaze, qos=1)
        await client.publish(topics.owner, entry.owner_payload(self.worker_id), qos=1, retain=True)

    async def _release_claim(self, client: aiomqtt.Client, session: str) -> None:
        entry = self.sessions.get(session)
        self._close_session(session)
        if entry is not None and entry.topics is not None:
            with contextlib.suppress(aiomqtt.MqttError):
                await client.unsubscribe(entry.topics.gaze)
                await client.publish(entry.topics.owner, b"", qos=1, retain=True)

    async def _on_gaze(self, topic: str, payload: bytes) -> None:
        parts = topic.split("/")
        key = f"{parts[-3]}.{parts[-2]}"
        entry = self.sessions.get(key)
        if entry is None:  # a late block of a closed session: nothing to attach it to
            self.late_blocks += 1
            if key not in self._late_said:
                self._late_said.add(key)
                log.warning(
                    "worker %s: block of closed session %r dropped (its device was silent for "
                    "fleet.idle_timeout_s; its next hello opens the session again)",
                    self.worker_id,
                    key,
                )
            return
        entry.last_seen = time.monotonic()
        try:
            block = decode_gaze(payload)
        except StreamError as exc:
            entry.bad_blocks += 1
            log.warning("session %r: malformed gaze block dropped: %s", key, exc)
            return
        # Samples stamped ahead of the clock are dropped first, so one never becomes the "last"
        # that every later sample would have to beat (LSL ingest's rule,
        # ingest.future_tolerance_s). "Now" on the device's clock: from its hello's "now" and the
        # time since, or from the Unix clocks; the later of the two, so that neither a slow hello
        # nor a device whose Unix clock runs ahead of ours makes its fresh gaze look early.
        offset = entry.pipeline.clock_offset_s
        now = time.time() - (lsl_unix_offset() if offset is None else offset)
        if entry.clock_ref is not None:
            now = max(now, entry.clock_ref[0] + time.monotonic() - entry.clock_ref[1])
        ts = block.timestamps
        ahead = ts > now + self.settings.ingest.future_tolerance_s
        if ahead.any():
            if entry.future_samples == 0:
                log.warning(
                    "session %r: gaze stamped ahead of the clock dropped (first %.3g s ahead)",
                    key,
                    float(ts[ahead][0] - now),
                )
            entry.future_samples += int(ahead.sum())
            idx = np.flatnonzero(~ahead)
            block = GazeSamples(
                block.timestamps[idx], block.x_deg[idx], block.y_deg[idx], block.pupil_mm[idx],
                block.valid[idx],
            )  # fmt: skip
        # Keep strictly increasing time across blocks (drop and count the rest).
        t = block.timestamps
        keep = t > np.maximum.accumulate(np.concatenate(([entry.last_t], t[:-1])))
        if not keep.all():
            entry.dropped_samples += int((~keep).sum())
            idx = np.flatnonzero(keep)
            block = GazeSamples(
                t[idx], block.x_deg[idx], block.y_deg[idx], block.pupil_mm[idx], block.valid[idx]
            )
        if len(block) == 0:
            return
        entry.last_t = float(block.timestamps[-1])
        entry.samples += len(block)
        await self._process(entry, block)

    async def _sweep(self, client: aiomqtt.Client) -> None:
        """Let go of every session whose device sent nothing for ``fleet.idle_timeout_s``.

        Time this worker did not keep up is not the devices' silence, so it is added to every
        session's ``last_seen``:

        * time it did not run (frozen, suspended, starved of CPU: its sweep woke late by that
          much), while their blocks waited at the broker. Without that, a worker resuming after
          a freeze longer than the timeout let every session go before reading what was queued;
        * every interval in which received blocks were still waiting to be read (a slow disk
          held the charges up). Without that, a worker 10 s behind let sessions go with their
          blocks in its own queue and then dropped them as blocks of closed sessions (seen
          under load: 67 of 90 blocks per session read, every one acknowledged to the broker).
        """
        idle = self.settings.fleet.idle_timeout_s
        every = min(1.0, idle / 2)
        tick = time.monotonic()
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            # Behind (blocks received, waiting to be read): the whole interval is ours, not the
            # devices' silence; otherwise only the time the sweep woke late.
            behind = len(client.messages) > 0
            absent, tick = (now - tick) if behind else (now - tick - every), now
            if absent > 0:
                for entry in self.sessions.values():
                    entry.last_seen = min(now, entry.last_seen + absent)
            for session, entry in list(self.sessions.items()):
                if now - entry.last_seen > idle:
                    await self._release_claim(client, session)

    # ------------------------------------------------------------------ NATS JetStream
    async def run_jetstream(self, stop: asyncio.Event) -> None:
        """Serve the partitions NATS JetStream pins on this worker (:mod:`gazeguard.jetstream`)."""
        from gazeguard.jetstream import JetStreamIngest  # noqa: PLC0415 - optional: nats-py

        await JetStreamIngest(self).run(stop)

    # ------------------------------------------------------------------ LSL
    async def run_lsl(self, stop: asyncio.Event) -> None:
        """Discover LSL gaze streams and serve each as its own session until ``stop``."""
        fleet = self.settings.fleet
        ingest = self.settings.ingest
        pred = f"type='{ingest.stream_type}'"
        if ingest.stream_name:  # narrows discovery to streams whose name starts with it
            pred += f" and starts-with(name,'{ingest.stream_name}')"
        tasks: dict[str, asyncio.Task[None]] = {}
        async with asyncio.TaskGroup() as tg:
            while not stop.is_set():
                found = await asyncio.to_thread(pylsl.resolve_bypred, pred, 0, 1.0)
                for info in found:
                    sid = info.source_id() or info.name()
                    if sid in tasks and not tasks[sid].done():
                        continue
                    tasks[sid] = tg.create_task(
                        self._serve_lsl(sid, stop), name=f"gazeguard.fleet[{sid}]"
                    )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(fleet.discover_every_s):
                        await stop.wait()
            for task in tasks.values():
                task.cancel()

    async def _serve_lsl(self, source_id: str, stop: asyncio.Event) -> None:

        ingest = self.settings.ingest.model_copy(update={"source_id": source_id})
        session = session_id_for(source_id, "")
        try:
            async with GazeStream(ingest, end_after_s=self.settings.fleet.idle_timeout_s) as s:
                entry = self._open_session(session, None)
                if entry is None:
                    return
                async for block in s:
                    entry.last_seen = time.monotonic()
                    await self._process(entry, block)
                    if stop.is_set():
                        break
        except StreamError as exc:
            log.warning("worker %s: stream %r: %s", self.worker_id, source_id, exc)
        finally:
            self._close_session(session)


#: After an owner's ``offline``, how long a device waits before asking for a new owner, s.
OFFLINE_GRACE_S = 1.0


class RawGazeSender:
    """Device side of MQTT raw-gaze ingest (trusted network): hello, await owner, send blocks.

    ``async with RawGazeSender(broker, "hmd-7", "s1") as sender: await sender.send(block)``.

    Entering connects and waits until a worker claims the session (or raises
    :class:`PublishError` after ``claim_timeout_s``; an unreachable broker raises at once).
    Afterwards :meth:`send` never fails for an outage; blocks are buffered (at most
    ``max_buffered``; the oldest are dropped and counted in :attr:`dropped_blocks`) and sent in
    order once the session is owned again:

    * **Failover.** When the owner's liveness topic turns ``offline`` (its will, or a clean
      stop) or the owner lets the session go, the sender says hello again until another worker
      claims the session.
    * **Broker outage.** The sender reconnects with jittered backoff (counted in
      :attr:`reconnects`), then waits up to ``resume_timeout_s`` for its owner to renew the
      claim (workers republish their claims when they reconnect) before asking anyone else, so
      the session keeps its worker and its feature window. The renewal says through which
      sample time the worker holds; the blocks after it that the broker had acknowledged but
      lost with its restart are sent again from the last ``max_buffered`` blocks sent.

    :attr:`owners` lists the worker of every claim, in order (a claim renewed after an outage
    is not a new one).

    Args:
        settings: the raw broker.
        device, session: identity of the session.
        prefix: raw topic prefix (``fleet.raw_prefix``).
        claim_timeout_s: give up if no worker claims the session within this on entry, s
            (later re-claims keep trying).
        max_buffered: blocks kept while no worker owns the session (and, as many, of the
            blocks sent, to send again what a restarted broker lost).
        resume_timeout_s: after a reconnect, wait this long for the owner before saying hello, s.
        unix_offset: returns Unix time minus the blocks' timestamps, s (``gazeguard forward``:
            this host's ``time.time() − local_clock()``); sent with every hello so the worker
            dates the session's gaze on *this* host's clock. ``None``: the worker assumes its
            own LSL clock (blocks from the same host).
        clock: returns the blocks' clock now, s (``gazeguard forward``: ``local_clock``); sent
            with every hello so the worker knows the device's "now" without comparing the
            hosts' Unix clocks (it drops gaze stamped ahead of it). ``None``: not sent.
    """

    def __init__(
        self,
        settings: BrokerSettings,
        device: str,
        session: str,
        *,
        prefix: str = "gazeguard/raw/v1",
        claim_timeout_s: float = 15.0,
        max_buffered: int = 600,
        resume_timeout_s: float = 10.0,
        unix_offset: Callable[[], float] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.topics = RawTopics.of(prefix, device, session)
        self.prefix = prefix
        self.hello = f"{prefix}/hello"
        self.identity = {"device": device, "session": session}
        self.claim_timeout_s = claim_timeout_s
        self.resume_timeout_s = resume_timeout_s
        self.unix_offset = unix_offset
        self.clock = clock
        self.owner: str | None = None
        self.owners: list[str] = []
        self.dropped_blocks = 0
        self.resent_blocks = 0  # acknowledged by a broker that lost them in a restart
        self.reconnects = 0
        self._settings = settings
        self._identifier = f"gazeguard-device-{device}-{session}"
        # Blocks to send, and blocks sent (the owner's renewal says which it holds): (newest
        # sample time, payload).
        self._buffer: deque[tuple[float, bytes]] = deque(maxlen=max_buffered)
        self._sent: deque[tuple[float, bytes]] = deque(maxlen=max_buffered)
        self._nonce = ""  # of the latest hello
        self._owned_nonce = ""  # of the hello the current (or last) owner answered
        self._claimed = asyncio.Event()
        self._ready = False  # claimed and the buffer sent: blocks go straight out
        self._resuming = False  # reconnected, waiting for the owner to renew its claim
        self._client: aiomqtt.Client | None = None
        self._dead = asyncio.Event()  # set when the current connection is known lost
        self._conn: contextlib.AsyncExitStack | None = None
        self._reclaim: asyncio.Task[None] | None = None
        self._recover: asyncio.Task[None] | None = None
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Self:
        # Closed last-in first-out: stop the background tasks, then the connection.
        self._stack.push_async_callback(self._disconnect)
        self._stack.push_async_callback(lambda: self._cancel(self._reclaim))
        self._stack.push_async_callback(lambda: self._cancel(self._recover))
        try:
            client = await self._connect()
            async with asyncio.timeout(self.claim_timeout_s):
                await self._claim(client)
        except TimeoutError:
            await self._stack.aclose()
            msg = (
                f"no gazeguard worker claimed session {self.identity} within "
                f"{self.claim_timeout_s:g} s; is `gazeguard run` running in fleet mode with "
                "ingest.source = 'mqtt' on this broker?"
            )
            raise PublishError(msg) from None
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def _connect(self) -> aiomqtt.Client:
        """A new connection that watches the session's owner topic."""
        conn = contextlib.AsyncExitStack()
        client = _client(self._settings, self._identifier)
        try:
            await conn.enter_async_context(client)
            await client.subscribe(self.topics.owner, qos=1)
            watcher = asyncio.create_task(self._watch(client), name="gazeguard.sender.watch")
            conn.push_async_callback(self._cancel, watcher)
        except BaseException:
            with contextlib.suppress(aiomqtt.MqttError):
                await conn.aclose()
            raise
        self._conn, self._client, self._dead = conn, client, asyncio.Event()
        return client

    async def _disconnect(self) -> None:
        conn, self._conn, self._client = self._conn, None, None
        self._dead.set()  # publishes still waiting on it give up
        if conn is not None:
            with contextlib.suppress(aiomqtt.MqttError):
                await conn.aclose()

    async def _publish(self, client: aiomqtt.Client, topic: str, payload: bytes) -> None:
        """Publish at QoS 1 and wait for the broker's PUBACK — or give up (:class:`MqttError`)
        as soon as the connection is known lost. aiomqtt would wait out its whole timeout
        (10 s) for a PUBACK that cannot come: the device stalled, the broker's restart was
        held back, and its owner's claim timed out (CI: "the owner renewed its claim")."""
        dead = self._dead
        if client is not self._client or dead.is_set():
            raise aiomqtt.MqttError("the connection to the raw gaze broker is lost")
        publish = asyncio.ensure_future(client.publish(topic, payload, qos=1))
        lost = asyncio.ensure_future(dead.wait())
        try:
            await asyncio.wait((publish, lost), return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not publish.done():
                publish.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                    await publish
        if publish.cancelled():
            raise aiomqtt.MqttError("the connection to the raw gaze broker was lost")
        publish.result()  # a failure of the publish itself

    @staticmethod
    async def _cancel(task: asyncio.Task[None] | None) -> None:
        """Cancel ``task`` and wait until it has ended, cancelling it again while it runs on.

        Python 3.11's ``asyncio.wait_for`` (inside aiomqtt's subscribe and unsubscribe) can
        swallow a cancellation that lands as what it waits for completes. The watcher, in the
        middle of an unsubscribe, then went back to waiting for messages, and the device's exit
        waited for it for good (seen twice in 40 runs of the restarted-broker test). A
        cancellation of the caller itself is not swallowed here.
        """
        if task is None:
            return
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
        if not task.cancelled():
            with contextlib.suppress(aiomqtt.MqttError):
                task.result()

    async def _claim(self, client: aiomqtt.Client) -> None:
        """Unless claimed already, say hello (again every 2 s, same nonce) until a worker claims
        the session; then flush the buffer. Start over with a new nonce if the owner is lost
        during the flush."""
        while True:
            if not self._claimed.is_set():
                self._nonce = secrets.token_hex(8)
                log.debug("session %s: hello (nonce %s)", self.identity, self._nonce)
                while not self._claimed.is_set():
                    await self._publish(client, self.hello, self._hello())
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(2.0):
                            await self._claimed.wait()
            while self._buffer and self._claimed.is_set():  # blocks sent meanwhile join the end
                item = self._buffer.popleft()
                try:
                    await self._publish(client, self.topics.gaze, item[1])
                except aiomqtt.MqttError:
                    self._buffer.appendleft(item)  # resent after the reconnect
                    raise
                self._sent.append(item)
            if self._claimed.is_set():
                self._ready = True
                return

    async def _claim_in_background(self, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        client = self._client
        if client is None or (self._recover is not None and not self._recover.done()):
            return  # an outage, not a dead owner: the recovery resumes the claim
        try:
            await self._claim(client)
        except aiomqtt.MqttError as exc:
            self._connection_lost(exc, client)

    async def _watch(self, client: aiomqtt.Client) -> None:
        """Follow the owner topic and the owner's liveness topic; notice a dead connection."""
        try:
            async for message in client.messages:
                await self._on_message(client, message)
        except aiomqtt.MqttError as exc:
            self._connection_lost(exc, client)

    async def _on_message(self, client: aiomqtt.Client, message: aiomqtt.Message) -> None:
        payload = message.payload
        if not isinstance(payload, bytes | bytearray):
            return
        topic = str(message.topic)
        if topic == self.topics.owner and payload:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                owner = json.loads(payload)
                nonce = owner.get("nonce")
                # After a reconnect the owner renews its claim with the nonce it answered, even
                # if a later hello was minted meanwhile but could not be sent (the connection
                # died between the owner's will and our noticing): that is still our owner.
                renewed = self._resuming and bool(nonce) and nonce == self._owned_nonce
                log.debug(
                    "session %s: owner message %s (hello %s, owned %s, resuming %s, claimed %s)",
                    self.identity,
                    owner,
                    self._nonce,
                    self._owned_nonce,
                    self._resuming,
                    self._claimed.is_set(),
                )
                if not self._claimed.is_set() and (nonce == self._nonce or renewed):
                    self.owner = str(owner["worker"])
                    self._owned_nonce = str(nonce)
                    if not self._resuming:  # a renewed claim is not a new owner
                        self.owners.append(self.owner)
                    # renewed: resend what the worker lacks (all if it holds no sample yet)
                    self._resend_after(owner.get("through", -math.inf) if renewed else None)
                    await client.subscribe(worker_topic(self.prefix, self.owner), qos=1)
                    self._claimed.set()
        elif self.owner is not None and (
            (topic == self.topics.owner and not payload)
            or (topic == worker_topic(self.prefix, self.owner) and payload == b"offline")
        ):
            await self._lost(client, offline=bool(payload))

    def _hello(self) -> bytes:
        """The hello for the current nonce, with the clocks as they are now (it is resent)."""
        said: dict[str, object] = {**self.identity, "nonce": self._nonce}
        if self.unix_offset is not None:
            said["unix_offset"] = self.unix_offset()
        if self.clock is not None:
            said["now"] = self.clock()
        return json.dumps(said).encode()

    def _resend_after(self, through: object) -> None:
        """Queue again, before the buffer, the blocks sent after sample time ``through`` (the
        owner renewing its claim after an outage holds no later sample: the broker lost them);
        forget the rest. ``None`` (a new claim): forget every block sent."""
        sent, self._sent = self._sent, deque(maxlen=self._sent.maxlen)
        if not isinstance(through, int | float) or math.isnan(through):
            return
        again = [item for item in sent if item[0] > through]
        if not again:
            return
        keep = [*again, *self._buffer]
        overflow = max(0, len(keep) - (self._buffer.maxlen or len(keep)))
        self.dropped_blocks += overflow  # the oldest go, as when the buffer overflows
        self._buffer = deque(keep[overflow:], maxlen=self._buffer.maxlen)
        self.resent_blocks += len(again)
        log.info(
            "session %s: %d blocks the broker lost in its restart sent again",
            self.identity,
            len(again),
        )

    async def _lost(self, client: aiomqtt.Client, *, offline: bool) -> None:
        """The owner died (re-claim at once) or let the session go (re-claim on the next send:
        an idle device is not re-claimed just to be released again)."""
        old, self.owner = self.owner, None
        self._ready = False
        self._claimed.clear()
        why = "is offline" if offline else "released the session"
        log.warning("session %s: worker %s %s; asking for a new one", self.identity, old, why)
        with contextlib.suppress(aiomqtt.MqttError):  # short: the connection may be dying
            await client.unsubscribe(worker_topic(self.prefix, str(old)), timeout=1.0)
        if offline:
            # A broker that shuts down publishes every client's will first: wait a moment, and
            # if our own connection dies too, resume the claim after the outage instead.
            self._start_claim(delay=OFFLINE_GRACE_S)

    def _start_claim(self, delay: float = 0.0) -> None:
        if self._recover is not None and not self._recover.done():
            return  # reconnecting: the recovery claims when it is connected
        if self._reclaim is None or self._reclaim.done():
            self._reclaim = asyncio.create_task(
                self._claim_in_background(delay), name="gazeguard.sender.claim"
            )

    def _connection_lost(self, exc: BaseException, client: aiomqtt.Client) -> None:
        """The broker went away: keep the claim's nonce, buffer, reconnect in the background.

        A failure on a connection that is no longer the current one (a publish that waited out
        its timeout on the old socket while the recovery had already reconnected) is not news:
        it must not tear down the healthy new connection.
        """
        if client is not self._client:
            return
        self._dead.set()
        self._ready = False
        self._claimed.clear()
        self.owner = None
        if self._recover is None or self._recover.done():
            log.warning("session %s: raw gaze broker lost (%s); reconnecting", self.identity, exc)
            self._recover = asyncio.create_task(self._reconnect(), name="gazeguard.sender.recover")

    async def _reconnect(self) -> None:
        """Reconnect with jittered backoff; resume the old claim (the owner renews it with the
        same nonce when it reconnects) or, after ``resume_timeout_s``, ask for a new owner."""
        attempt = 0
        while True:
            await self._disconnect()
            try:
                client = await self._connect()
            except aiomqtt.MqttError as exc:
                log.debug("session %s: reconnect failed: %s", self.identity, exc)
                attempt += 1
                await asyncio.sleep(random.uniform(0, min(5.0, 0.2 * 1.5**attempt)))
                continue
            self.reconnects += 1
            self._resuming = True
            log.debug("session %s: reconnected; waiting for the owner's renewal", self.identity)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.resume_timeout_s):
                    await self._claimed.wait()  # the watcher accepts the old nonce
            self._resuming = False
            if not self._claimed.is_set():
                log.debug(
                    "session %s: no renewal within %g s", self.identity, self.resume_timeout_s
                )
            try:
                await self._claim(client)
            except aiomqtt.MqttError:
                continue  # lost again while claiming or flushing
            return

    async def send(self, block: GazeSamples) -> None:
        """Publish one block (QoS 1), or buffer it while no worker owns the session or the
        broker is away."""
        item = (float(block.timestamps[-1]) if len(block) else -math.inf, encode_gaze(block))
        client = self._client
        if self._ready and client is not None:
            try:
                await self._publish(client, self.topics.gaze, item[1])
            except aiomqtt.MqttError as exc:
                # buffered below and resent after recovery (a duplicate is dropped by the
                # worker: timestamps must increase)
                self._connection_lost(exc, client)
            else:
                self._sent.append(item)
                return
        if len(self._buffer) == self._buffer.maxlen:
            self.dropped_blocks += 1
        self._buffer.append(item)
        self._start_claim()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.aclose()
