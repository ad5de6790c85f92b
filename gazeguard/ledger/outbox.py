"""The outbox drain: deliver the ledger's charged payloads through a sink, in order, at least once.

The service charges a chunk and enqueues its privatized payload into the ledger's outbox in one
SQLite transaction (:mod:`gazeguard.ledger`), then calls :meth:`Drain.notify`. The drain sends
the outbox's undelivered items oldest first, a pass (at most ``batch`` items) at a time: every
item of the pass is handed to the :class:`Sink` at once, in order (one connection keeps that
order on the wire: MQTT delivers a connection's QoS 1 messages in the order sent), then their
acknowledgements (MQTT: the broker's PUBACKs) are taken in order, and the pass's acknowledged
items are marked delivered in one ledger transaction (``ledger.mark_delivered_many(ids)``). So a
group of chunks charged on one tick waits for one round trip and one commit, not one each; the
bytes sent are exactly the bytes that were charged.

**Delivery is at least once.** If the connection (or the process) dies after the receiver got
an item but before its acknowledgement was recorded, the item is sent again, after the
reconnect, from the outbox table in order. The window is one pass: items whose acknowledgement
arrived are never re-sent by a running drain (they are remembered until their mark has
committed), so a duplicate needs a lost acknowledgement or a crash between it and the commit.
The first copy of each item still arrives in outbox order. Consumers deduplicate by
``(session, chunk_index)``, which every chunk message carries.

**Refused items are moved aside.** A sink that answers an item with a refusal (MQTT 5: a
negative PUBACK such as 0x87 "Not authorized" from an ACL) means it will never be accepted: the
item is marked refused in the ledger with the reason (its ε stays spent), counted, logged once,
and the queue goes on.

**Lost connections are retried.** A sink that cannot take items now (unreachable, connection
lost, login refused) raises :class:`SinkUnavailableError`; the drain reconnects after a jittered
backoff ``uniform(0, min(reconnect_max_s, 1.5 ** attempt))`` and starts again from the outbox
table, so nothing is skipped. Charged items wait in the outbox meanwhile.

**Latest values** (:meth:`Drain.put_latest`, e.g. the sessions' retained status messages) are
not durable: only the latest per topic is kept (in memory), sent after the outbox is drained, and
sent again after every reconnect, so a receiver that lost its retained messages gets them back.

The transport lives behind :class:`Sink`: :class:`gazeguard.runtime.mqtt.sink.MqttSink` for MQTT
(:class:`gazeguard.runtime.publish.Publisher` puts the two together).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import ParamSpec, Protocol, Self, TypeVar

from gazeguard.core.closing import AsyncClosing
from gazeguard.core.errors import GazeguardError, PublishError
from gazeguard.core.words import ended

P = ParamSpec("P")
T = TypeVar("T")

_log = logging.getLogger(__name__)


class OutboxEntry(Protocol):
    """One charged, undelivered payload (``gazeguard.ledger.OutboxItem``)."""

    @property
    def id(self) -> int: ...
    @property
    def session(self) -> str: ...
    @property
    def chunk_index(self) -> int: ...
    @property
    def topic(self) -> str: ...
    @property
    def payload(self) -> bytes: ...


class PendingEntry(OutboxEntry, Protocol):
    """An item read from the outbox table (``gazeguard.ledger.OutboxItem``)."""

    @property
    def created(self) -> float: ...


class Outbox(Protocol):
    """The part of :class:`gazeguard.ledger.Ledger` the drain uses (thread-safe)."""

    def pending(self, limit: int | None = None) -> Sequence[PendingEntry]: ...
    def enqueued_here(self, outbox_id: int) -> bool: ...
    def mark_delivered_many(self, outbox_ids: Sequence[int]) -> object: ...
    def mark_refused(self, outbox_id: int, reason: str) -> object: ...


@dataclass(frozen=True, slots=True)
class Delivery:
    """A sink's answer to one message: acknowledged, or refused for good with a reason."""

    refused: str | None = None
    """Why the sink will never accept this message (with what to check), or ``None``."""

    @property
    def delivered(self) -> bool:
        """Whether the sink acknowledged the message."""
        return self.refused is None


DELIVERED = Delivery()
"""The answer of a sink that acknowledged a message."""


class SinkUnavailableError(GazeguardError):
    """The sink cannot take messages now: no connection could be made, or it was lost.

    The drain reconnects after a backoff and sends again what was not acknowledged.

    Args:
        reason: one line saying why, with what to check.
        permanent: retrying with the same configuration will not help (e.g. a refused login or
            TLS handshake). Still retried, but logged as an error, counted in
            :attr:`Drain.refusals`, and entering a drain with ``connect_timeout`` fails at once.
    """

    def __init__(self, reason: str, *, permanent: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.permanent = permanent


class SinkConnection(Protocol):
    """One connection of a :class:`Sink`, used by one drain task at a time."""

    @property
    def label(self) -> str:
        """What is connected, for the log (e.g. ``MQTT broker host:port (MQTT 5, TLS)``)."""
        ...

    async def deliver(self, topic: str, payload: bytes, *, retain: bool) -> Delivery:
        """Send one message and return once the receiver answered it.

        The drain has several in flight at once, started in order: the message must be handed
        to the transport before the first suspension, so that messages go out in the order of
        the calls.

        ``retain``: keep it as the topic's latest value for later consumers (MQTT: retained).

        Raises:
            SinkUnavailableError: the connection is gone; the message may or may not have
                arrived (it is sent again after the reconnect).
        """
        ...

    async def wait_lost(self) -> None:
        """Raise :class:`SinkUnavailableError` once the connection is lost (never returns)."""
        ...


class Sink(Protocol):
    """Where the drain delivers: something it can connect to, send to, and name in messages."""

    @property
    def name(self) -> str:
        """What the sink is, for log lines and errors (e.g. ``MQTT broker host:port``)."""
        ...

    @property
    def advice(self) -> str:
        """What to check when no connection can be made (appended to the error)."""
        ...

    def connect(self) -> AbstractAsyncContextManager[SinkConnection]:
        """A connection, open while the ``async with`` block runs.

        Raises:
            SinkUnavailableError: on entering (no connection) or leaving (closing failed).
        """
        ...


class Drain(AsyncClosing):
    """Deliver the ledger's outbox and the latest values of some topics through a sink.

    An async context manager owning one named task (``{name}.connection``, which runs
    ``{name}.drain`` and ``{name}.watch`` per connection) in a TaskGroup.

    Args:
        outbox: the ledger; ``pending``, ``mark_delivered_many`` and ``mark_refused`` run in worker
            threads, or on the event loop with ``inline``.
        sink: where to deliver.
        connect_timeout: if set, entering waits up to this many seconds for the first
            connection and raises :class:`PublishError` if there is none (fail fast at startup).
        poll_interval_s: look at the outbox at least this often even without :meth:`notify`
            (picks up items charged by another process or before a restart), s.
        batch: outbox items fetched per query.
        reconnect_max_s: cap of the jittered backoff between connection attempts, s.
        on_acked: called on the event loop with each outbox item right after the sink
            acknowledged it (before its mark commits), e.g. to measure latency; must
            not raise.
        on_sent: called on the event loop with each outbox item as its send starts (after
            waiting in the drain's queue); must not raise.
        name: prefix of the task names.
        logger: where connections, retries and refusals are logged.
        inline: make the outbox calls on the event loop: for a local ledger
            (:attr:`~gazeguard.ledger.Ledger.local`) on a loop busy with other work, where a
            worker thread would wait for the GIL after each call (a fleet worker).
    """

    def __init__(
        self,
        outbox: Outbox,
        sink: Sink,
        *,
        connect_timeout: float | None = None,
        poll_interval_s: float = 1.0,
        batch: int = 64,
        reconnect_max_s: float = 30.0,
        on_acked: Callable[[OutboxEntry], None] | None = None,
        on_sent: Callable[[OutboxEntry], None] | None = None,
        name: str = "gazeguard.ledger.outbox",
        logger: logging.Logger = _log,
        inline: bool = False,
    ) -> None:
        self._outbox = outbox
        self._inline = inline
        self._sink = sink
        self._connect_timeout = connect_timeout
        self._poll_interval_s = poll_interval_s
        self._batch = batch
        self._reconnect_max_s = reconnect_max_s
        self._on_acked = on_acked
        self._on_sent = on_sent
        self._name = name
        self._log = logger

        self._wake = asyncio.Event()
        self._idle = asyncio.Condition()
        self._passes_started = 0
        self._last_idle_pass = -1
        self._connected = asyncio.Event()
        self._refused = asyncio.Event()
        self._acked: set[int] = set()  # acknowledged, the mark not yet committed
        self._handed: dict[int, OutboxEntry] = {}  # charged here, handed over by notify()
        # Delivered lately (oldest first, at most 2 × batch): a table read can deliver an item
        # between its charge's commit and the notify() that hands it over (a push that charges
        # two chunks returns after both), and the late hand-over must not send it again.
        self._done: dict[int, None] = {}
        self._read_table = True  # the next pass reads the outbox table
        self._table_read_at = -float("inf")  # time.monotonic() of the latest table read
        self._latest: dict[str, bytes] = {}
        self._latest_unsent: set[str] = set()
        self._tg: asyncio.TaskGroup | None = None
        self._task: asyncio.Task[None] | None = None

        self.delivered = 0
        """Outbox items delivered (acknowledged by the sink) by this drain."""
        self.connections = 0
        """Successful connections so far (1 + reconnects)."""
        self.refusals = 0
        """Times the sink refused the connection (permanently: login, protocol, TLS) or an item."""
        self.refused_items = 0
        """Outbox items the sink permanently refused (moved aside in the ledger, not retried)."""
        self.last_error: str | None = None
        """Why the latest connection attempt or connection failed, or ``None``."""
        self._said: str | None = None  # the failure logged for the outage going on

    # -- public API ------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether a sink connection is up right now."""
        return self._connected.is_set()

    def notify(self, charged: Sequence[OutboxEntry] = ()) -> None:
        """Wake the drain: chunks were charged into the outbox. Call from the event loop.

        Args:
            charged: the outbox items just committed by this process (e.g. the
                :class:`~gazeguard.runtime.pipeline.ReleasedChunk` objects a pipeline returned).
                They are
                sent straight from memory, skipping a read of the outbox table; without them
                the drain reads the table. Either way the table stays the source of truth:
                it is read after every (re)connection, on :meth:`flush`, and at least every
                ``poll_interval_s`` (items charged by other processes, backlog). At most
                ``batch`` items are held in memory; beyond that (an outage) the drain forgets
                them and reads the table.
        """
        for item in charged:
            if item.id not in self._done:
                self._handed[item.id] = item
        if len(self._handed) > self._batch:
            self._handed.clear()
            self._read_table = True
        self._wake.set()

    def put_latest(self, topic: str, payload: bytes) -> None:
        """Queue ``payload`` as the latest (retained) value of ``topic``; a newer one replaces it.

        Not durable: it is sent after the outbox is drained, and again after each reconnect.
        """
        self._latest[topic] = payload
        self._latest_unsent.add(topic)
        self._wake.set()

    async def flush(self, within_s: float) -> None:
        """Wait until everything in the outbox now, and every queued latest value, was delivered.

        Raises:
            PublishError: not done within ``within_s`` seconds (the items stay in the outbox).
        """
        async with self._idle:
            target = self._passes_started + 1
            self._read_table = True
            self._wake.set()
            try:
                async with asyncio.timeout(within_s):
                    await self._idle.wait_for(lambda: self._last_idle_pass >= target)
            except TimeoutError:
                why = f" (last error: {self.last_error})" if self.last_error else ""
                msg = (
                    f"{self._sink.name}: outbox not delivered within {within_s:g} s{why}; the "
                    "chunks stay in the ledger outbox and are sent later"
                )
                raise PublishError(msg) from None

    async def __aenter__(self) -> Self:
        tg = asyncio.TaskGroup()
        await tg.__aenter__()
        self._tg = tg
        self._task = tg.create_task(self._connection_loop(), name=f"{self._name}.connection")
        if self._connect_timeout is not None:
            try:
                await self._wait_first_connection(self._connect_timeout)
            except BaseException:
                await self.aclose()
                raise
        return self

    async def aclose(self) -> None:
        """Stop the connection task; undelivered items stay in the outbox for the next run.

        The body's own exception propagates unchanged; a failure of the drain's task
        (e.g. the ledger's database failing) is raised as an exception group.
        """
        if self._task is not None:
            self._task.cancel()
        tg, self._tg, self._task = self._tg, None, None
        if tg is not None:
            await tg.__aexit__(None, None, None)

    # -- connection ------------------------------------------------------------------------------

    async def _wait_first_connection(self, limit_s: float) -> None:
        connected = asyncio.ensure_future(self._connected.wait())
        refused = asyncio.ensure_future(self._refused.wait())
        try:
            done, _ = await asyncio.wait(
                {connected, refused}, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            connected.cancel()
            refused.cancel()
        if self.connections:
            return
        if refused in done:
            msg = f"{self._sink.name} refused gazeguard: {self.last_error}"
        else:
            msg = (
                f"could not connect to the {self._sink.name} within {limit_s:g} s "
                f"({self.last_error or 'no answer'}); {self._sink.advice}"
            )
        raise PublishError(msg)

    async def _connection_loop(self) -> None:
        attempt = 0
        while True:
            try:
                async with self._sink.connect() as connection:
                    self._on_connected(connection, attempt)
                    attempt = 0
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(connection.wait_lost(), name=f"{self._name}.watch")
                        tg.create_task(self._drain(connection), name=f"{self._name}.drain")
                failure = SinkUnavailableError("connection closed")
            except* SinkUnavailableError as group:
                failure = _first(group)
            finally:
                self._connected.clear()
            attempt += 1
            self.last_error = failure.reason
            if failure.permanent:
                self.refusals += 1
                self._refused.set()
            delay = random.uniform(0, min(self._reconnect_max_s, 1.5**attempt))
            # One line per outage (and per new reason): the same failure again is DEBUG.
            said, self._said = self._said, self.last_error
            self._log.log(
                logging.DEBUG
                if said == self.last_error
                else (logging.ERROR if failure.permanent else logging.WARNING),
                "%s: %s Charged chunks wait in the outbox; next retry in %.1f s%s",
                self._sink.name,
                ended(self.last_error),
                delay,
                "" if said is not None else " (the next attempts are logged with -vv)",
            )
            await asyncio.sleep(delay)

    def _on_connected(self, connection: SinkConnection, failed_attempts: int) -> None:
        self._said = None
        self.connections += 1
        self._connected.set()
        self._refused.clear()
        # A (re)connected receiver may have lost retained messages: send every latest value.
        self._latest_unsent.update(self._latest)
        self._wake.set()
        level = logging.WARNING if failed_attempts else logging.INFO
        self._log.log(level, "connected to %s", connection.label)

    # -- delivery --------------------------------------------------------------------------------
    async def _call(self, func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``func(*args, **kwargs)``: an outbox call, in a worker thread unless ``inline``."""
        if self._inline:
            return func(*args, **kwargs)
        return await asyncio.to_thread(func, *args, **kwargs)

    async def _next_items(self) -> tuple[Sequence[OutboxEntry], bool]:
        """The next items to send, oldest first, and whether more may wait in the table.

        Reads the outbox table when due (after a connection, on flush, every
        ``poll_interval_s``, while a backlog lasts); otherwise takes the items handed over by
        :meth:`notify`, which are all this process charged since the last table read.
        """
        due = time.monotonic() - self._table_read_at >= self._poll_interval_s
        if self._read_table or due or not self._handed:
            self._read_table = False
            self._table_read_at = time.monotonic()
            items = await self._call(self._outbox.pending, self._batch)
            kept = self._not_in_flight_elsewhere(items)
            # a full batch: read again at once, unless all of it waits (then: the next poll)
            self._read_table = len(items) == self._batch and bool(kept)
            return kept, self._read_table
        ids = sorted(self._handed)[: self._batch]
        return [self._handed[i] for i in ids], len(ids) == self._batch

    def _not_in_flight_elsewhere(self, items: Sequence[PendingEntry]) -> list[PendingEntry]:
        """The table's items without those another live process may be sending right now:
        enqueued by another ledger object (another process sharing the ledger) less than two
        poll intervals ago, and the later items of their sessions (order within a session).
        That process delivers them within milliseconds; were it to die, they are old enough
        at a later read. Without this, two fleet workers polling one ledger could both send an
        item one of them has in flight. Items of an earlier run are older and go at once."""
        now = time.time()
        held: set[str] = set()
        out: list[PendingEntry] = []
        for item in items:
            if item.session in held:
                continue
            young = 0.0 <= now - item.created < 2 * self._poll_interval_s
            if young and item.id not in self._handed and not self._outbox.enqueued_here(item.id):
                held.add(item.session)
                continue
            out.append(item)
        return out

    async def _drain(self, connection: SinkConnection) -> None:
        """Deliver outbox items oldest first, then the latest values; sleep until notified."""
        self._read_table = True  # what happened while disconnected is only in the table
        while True:
            self._wake.clear()
            self._passes_started += 1
            this_pass = self._passes_started
            items, more = await self._next_items()
            await self._deliver_items(connection, items)
            if more:
                continue
            await self._deliver_latest(connection)
            if items or self._latest_unsent or self._handed:
                continue
            async with self._idle:
                self._last_idle_pass = this_pass
                self._idle.notify_all()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval_s):
                    await self._wake.wait()

    async def _deliver_items(
        self, connection: SinkConnection, items: Sequence[OutboxEntry]
    ) -> None:
        """Send ``items`` (those not acknowledged already) all at once, in order, then take their
        answers in order, and mark the acknowledged ones delivered in one ledger transaction
        (one refused by the sink is moved aside at its turn).

        A pass's items are in flight together (the sink sends them in the order they were
        started), so a group of chunks charged on one tick waits for one round trip and one
        commit, not one each. If the connection is lost, the answers not yet taken are dropped
        and their items sent again after the reconnect (at least once, as for a single lost
        acknowledgement); those acknowledged are remembered and marked by the next pass."""
        sends: list[asyncio.Future[Delivery] | None] = []
        for item in items:
            if item.id in self._acked:
                sends.append(None)
                continue
            sent = asyncio.ensure_future(connection.deliver(item.topic, item.payload, retain=False))
            sent.add_done_callback(functools.partial(self._note_ack, item.id))
            sends.append(sent)
            if self._on_sent is not None:
                self._on_sent(item)
        try:
            acked: list[OutboxEntry] = []
            for item, send in zip(items, sends, strict=True):
                delivery = None if send is None else await send
                if delivery is not None and delivery.refused is not None:
                    await self._refuse(item, delivery.refused)
                    continue
                if delivery is not None:
                    self._acked.add(item.id)
                    if self._on_acked is not None:
                        self._on_acked(item)
                acked.append(item)
            await self._mark_delivered(acked)
        finally:
            _settle(sends)

    def _note_ack(self, outbox_id: int, send: asyncio.Future[Delivery]) -> None:
        """Remember an acknowledgement as it arrives, before its turn to be marked: should the
        connection drop meanwhile, that item is not sent again."""
        if not send.cancelled() and send.exception() is None and send.result().delivered:
            self._acked.add(outbox_id)

    async def _refuse(self, item: OutboxEntry, refused: str) -> None:
        """Move an item the sink refused aside: never retried, never blocking the queue; kept in
        the ledger as refused (its ε stays spent), counted, logged once."""
        reason = (
            f"broker refused chunk {item.chunk_index} of session {item.session!r} on "
            f"topic {item.topic!r}: {refused}"
        )
        await self._call(self._outbox.mark_refused, item.id, reason)
        self._handed.pop(item.id, None)
        self.refused_items += 1
        self.refusals += 1
        self.last_error = reason
        self._log.error("%s; moved aside, the queue goes on", reason)

    async def _mark_delivered(self, items: Sequence[OutboxEntry]) -> None:
        """Mark acknowledged items delivered, in one ledger transaction."""
        if not items:
            return
        await self._call(self._outbox.mark_delivered_many, [item.id for item in items])
        for item in items:
            self._acked.discard(item.id)
            self._handed.pop(item.id, None)
            self._done[item.id] = None
        while len(self._done) > 2 * self._batch:
            del self._done[next(iter(self._done))]
        self.delivered += len(items)

    async def _deliver_latest(self, connection: SinkConnection) -> None:
        """Send the latest value of every topic not sent since it changed or since connecting."""
        latest = [(topic, self._latest[topic]) for topic in self._latest_unsent]
        sends = [
            asyncio.ensure_future(connection.deliver(topic, payload, retain=True))
            for topic, payload in latest
        ]  # all in flight at once, as the outbox items
        try:
            for (topic, payload), send in zip(latest, sends, strict=True):
                delivery = await send
                if delivery.refused is not None:
                    self._latest_unsent.discard(topic)  # a newer value may be allowed; not this
                    self.refusals += 1
                    self.last_error = (
                        f"broker refused status on topic {topic!r}: {delivery.refused}"
                    )
                    self._log.error("%s", self.last_error)
                    continue
                if self._latest[topic] is payload:
                    self._latest_unsent.discard(topic)
        finally:
            _settle(sends)


def _settle(sends: Sequence[asyncio.Future[Delivery] | None]) -> None:
    """Cancel the sends still waiting for an answer and retrieve the failures of those done
    (the first failure awaited is the one that propagates)."""
    for send in sends:
        if send is None:
            continue
        if not send.done():
            send.cancel()
        elif not send.cancelled():
            send.exception()


def _first(group: BaseExceptionGroup[SinkUnavailableError]) -> SinkUnavailableError:
    """The first leaf exception of a (possibly nested) exception group."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first
