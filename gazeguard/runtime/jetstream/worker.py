"""The worker side of JetStream raw-gaze ingest: pull the partitions pinned on this worker, take
them over by a replay, balance them over live workers (see :mod:`gazeguard.runtime.jetstream`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import nats
import nats.errors
import nats.js.errors
import numpy as np
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
)

from gazeguard.core.errors import ConfigError, StreamError
from gazeguard.core.samples import GazeSamples, lsl_unix_offset
from gazeguard.runtime.ingest import declared_rate
from gazeguard.runtime.jetstream.balance import Balancing, Partition, members_subject
from gazeguard.runtime.jetstream.wire import (
    NOW_HEADER,
    PULL_BATCH,
    PULL_EXPIRES_NS,
    RATE_HEADER,
    UNIX_OFFSET_HEADER,
    JetStreamNotReadyError,
    cancel_connect,
    connect_options,
    consumer_name,
    ensure_consumers,
    ensure_stream,
    header_float,
    partition_subject,
    stream_position,
)
from gazeguard.signal.rawgaze import decode_many

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

    from gazeguard.config import NatsSettings, Settings
    from gazeguard.runtime.fleet import FleetSession, SessionHost


log = logging.getLogger(__name__)


#: Startup: waits between attempts to reach NATS / set up JetStream, s (doubling up to the last).
RETRY_S = (0.5, 1.0, 2.0, 4.0, 8.0)


class _Answers:
    """The answers to a partition's pull requests, sorted as nats-py delivers them (the inbox
    subscription's callback): a block is queued at once, and ``None`` when the server says the
    pin is another worker's (status 423); a status or the batch's last block sets :attr:`over`
    (the open request is done)."""

    def __init__(self, part: Partition, queue: asyncio.Queue[Msg | None]) -> None:
        self.part = part
        self.queue = queue
        self.over = asyncio.Event()
        self.got = 0  # blocks the open request brought

    def open(self) -> None:
        """A new request is sent."""
        self.over.clear()
        self.got = 0

    async def take(self, msg: Msg) -> None:
        """(The callback: nats-py wants a coroutine function.) Sort one answer."""
        part = self.part
        part.answered_at = time.monotonic()  # balance: evidence that our pulls are served
        headers = msg.headers or {}
        status = headers.get("Status")
        if status:
            if status == "423":  # pinned on another worker: ours (if any) is gone
                part.pin = None
                self.queue.put_nowait(None)
            if status in ("404", "408", "409", "423"):
                self.over.set()
            return  # 100: heartbeat
        part.pin = headers.get("Nats-Pin-Id", part.pin)
        self.queue.put_nowait(msg)
        self.got += 1
        if self.got >= PULL_BATCH:
            self.over.set()


class JetStreamIngest(Balancing):
    """The worker side: serve every partition the server pins on this worker, until ``stop``.

    Args:
        fleet: the worker's sessions and ledger (a :class:`~gazeguard.runtime.fleet.SessionHost`:
            its :class:`~gazeguard.runtime.fleet.Fleet`).
    """

    def __init__(self, fleet: SessionHost) -> None:
        self.fleet = fleet
        self.settings: Settings = fleet.settings
        self.nats: NatsSettings = fleet.settings.fleet.nats
        self.partitions = [Partition(p) for p in range(self.nats.partitions)]
        self.duplicate_blocks = 0  # delivered again, every sample already held
        self.handed_back = 0  # partitions handed to their assigned worker (balance)
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._stopping = False  # every loop ends at its next turn (see _pull)
        self._init_balance()
        # idleness: the server receipt time of each session's newest block (stream time), and
        # the sessions closed for idleness lately (reopened: their window is rebuilt)
        self._stamps: dict[str, float] = {}
        self._no_rate: set[str] = set()  # sessions refused for declaring no rate (logged once)
        self._idle_closed: dict[str, float] = {}

    async def run(self, stop: asyncio.Event) -> None:
        """Connect, set up the stream and consumers, pull every partition until ``stop``; then
        close every session (their incomplete chunks are dropped, as at any stop).

        Until NATS is reachable and JetStream answers (a server not started yet, a cluster
        without a JetStream meta leader), the worker retries with backoff, saying so
        periodically, until ``stop``.
        """
        worker = self.fleet.worker_id
        nc = await self._connect(stop)
        if nc is None:
            return
        self._nc, self._js = nc, nc.jetstream()
        try:
            if not await self._set_up(stop):
                return
            if self.nats.balance:
                await nc.subscribe(members_subject(self.nats.stream), cb=self._heard)
            log.info(
                "worker %s: pulling %d partitions of JetStream stream %s (group %s; balance %s)",
                worker, self.nats.partitions, self.nats.stream, self.nats.group,
                "on" if self.nats.balance else "off",
            )  # fmt: skip
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(
                        self._serve(part), name=f"gazeguard.runtime.jetstream[{part.index}]"
                    )
                    for part in self.partitions
                ]
                tasks.append(
                    tg.create_task(self._sweep(), name="gazeguard.runtime.jetstream.sweep")
                )
                if self.nats.balance:
                    balance = tg.create_task(
                        self._balance(tg), name="gazeguard.runtime.jetstream.balance"
                    )
                    tasks.append(balance)
                await stop.wait()
                self._stopping = True
                if self._handing is not None:
                    tasks.append(self._handing)
                for task in tasks:
                    task.cancel()
        finally:
            for session in list(self.fleet.sessions):
                self.fleet.close_session(session)
            if self.nats.balance and nc.is_connected:
                await self._leave()
            for part in self.partitions:
                log.info(
                    "worker %s: partition %d: %d blocks processed, %d already replayed",
                    worker, part.index, part.blocks, part.skipped,
                )  # fmt: skip
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await nc.close()

    async def _connect(self, stop: asyncio.Event) -> Client | None:
        """Connect to NATS, however long it takes (nats-py retries for ever), saying so at
        growing intervals; ``None``: ``stop`` came first."""
        worker = self.fleet.worker_id
        opts = connect_options(self.nats, f"gazeguard-worker-{worker}")
        logged_error, logged_reconnect = opts["error_cb"], opts["reconnected_cb"]
        last_error: list[str] = []

        async def error(exc: Exception) -> None:
            last_error[:] = [str(exc) or type(exc).__name__]
            await logged_error(exc)

        async def disconnected() -> None:
            self._cut_off = True
            self._deaf_at = time.monotonic()

        async def reconnected() -> None:
            now = time.monotonic()  # an outage is nobody's silence: we could not hear them
            self._cut_off = False  # (nats-py says "connected" before this: flushes come first)
            self._deaf_at = now
            for member in self._members.values():
                member.last = max(member.last, now)
            await logged_reconnect()

        opts.update(error_cb=error, disconnected_cb=disconnected, reconnected_cb=reconnected)
        connecting = asyncio.ensure_future(nats.connect(**opts))
        stopped = asyncio.ensure_future(stop.wait())
        started = time.monotonic()
        try:
            for wait in itertools.chain(RETRY_S[1:], itertools.repeat(30.0)):
                done, _ = await asyncio.wait(
                    {connecting, stopped}, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                )
                if connecting in done:
                    return connecting.result()
                if stopped in done:
                    return None
                log.warning(
                    "worker %s: no NATS server reachable at %s for %.0f s (%s); still trying: "
                    "start nats-server or correct fleet.nats.servers",
                    worker, ", ".join(self.nats.servers), time.monotonic() - started,
                    last_error[0] if last_error else "no answer",
                )  # fmt: skip
            raise AssertionError  # pragma: no cover - the loop above never ends
        finally:
            stopped.cancel()
            if not connecting.done():
                await cancel_connect(connecting)

    async def _set_up(self, stop: asyncio.Event) -> bool:
        """Create (or update) the stream and the partition consumers, retrying with backoff
        while JetStream is not ready (:class:`JetStreamNotReadyError`); ``False``: ``stop`` came
        first. Other refusals (a configuration the server rejects) are raised."""
        assert self._nc is not None
        assert self._js is not None
        waits = itertools.chain(RETRY_S, itertools.repeat(RETRY_S[-1]))
        started = time.monotonic()
        while True:
            try:
                await ensure_stream(self._js, self.nats)
                await ensure_consumers(self._nc, self.nats)
            except JetStreamNotReadyError as exc:
                wait = next(waits)
                log.warning(
                    "worker %s: JetStream not ready for %.0f s (%s); retrying in %.1f s: is "
                    "nats-server running with JetStream enabled and, on a cluster, do a majority "
                    "of the servers run (a JetStream meta leader)?",
                    self.fleet.worker_id, time.monotonic() - started, exc, wait,
                )  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await stop.wait()
                if stop.is_set():
                    return False
                continue
            return True

    # ------------------------------------------------------------------ pulling
    async def _serve(self, part: Partition) -> None:
        """Pull the partition's durable consumer (keeping any pin alive) and process what
        arrives, concurrently: a long takeover replay must not stop the pulls, or the server
        would hand the pin on after ``pin_timeout_s``."""
        queue: asyncio.Queue[Msg | None] = asyncio.Queue()
        part.queue = queue
        async with asyncio.TaskGroup() as tg:
            tg.create_task(
                self._pull(part, queue), name=f"gazeguard.runtime.jetstream.pull[{part.index}]"
            )
            tg.create_task(
                self._work(part, queue), name=f"gazeguard.runtime.jetstream.work[{part.index}]"
            )

    async def _pull(self, part: Partition, queue: asyncio.Queue[Msg | None]) -> None:
        """Pull for ever, with the current pin's id once pinned; queue the blocks, and ``None``
        when the server says the pin is another worker's (status 423).

        The answers are sorted as they arrive (nats-py's callback): a block is queued at once,
        a status or the batch's last block ends the request, and the next is sent; a request
        also ends when it expires unanswered."""
        nc = self._nc
        assert nc is not None
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.nats.stream}.{consumer_name(part.index)}"
        inbox = nc.new_inbox()
        answers = _Answers(part, queue)

        # A callback and asyncio.timeout, not Subscription.next_msg: next_msg waits with
        # asyncio.wait_for, which on Python 3.11 can swallow a cancellation that lands as a
        # message arrives; the worker then never stopped (seen: 1 stop in 6 hung).
        sub = await nc.subscribe(inbox, cb=answers.take)
        try:
            while not self._stopping:
                if not self._may_pull(part):
                    await self._changed.wait()  # (a new Event after each change: see _notify)
                    continue
                request: dict[str, Any] = {
                    "batch": PULL_BATCH,
                    "expires": PULL_EXPIRES_NS,
                    "group": self.nats.group,
                }
                if part.pin is not None:
                    request["id"] = part.pin
                part.pulling = True
                answers.open()
                try:
                    await nc.publish(subject, json.dumps(request).encode(), reply=inbox)
                except nats.errors.Error as exc:  # closed or stale: nats-py reconnects
                    log.debug("partition %d: pull request failed: %s", part.index, exc)
                    part.pulling = False
                    await asyncio.sleep(0.2)
                    continue
                try:
                    async with asyncio.timeout(PULL_EXPIRES_NS / 1e9 + 0.2):
                        await answers.over.wait()
                except TimeoutError:
                    pass  # expired without the server saying so: ask again
                finally:
                    part.pulling = False
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def _work(self, part: Partition, queue: asyncio.Queue[Msg | None]) -> None:
        """Process the queued blocks in order, everything queued at once: one batch (a new pin:
        take over first), acknowledged after it is processed."""
        while not self._stopping:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            part.busy = True
            try:
                start = 0
                for i, msg in enumerate([*batch, None]):
                    if msg is not None:
                        continue
                    if i > start:
                        await self._handle(part, [m for m in batch[start:i] if m is not None])
                    start = i + 1
                    if i < len(batch):  # a None queued by _read_batch: the pin is gone
                        self._unpin(
                            part, "pin refused: another worker has it, or the server forgot ours"
                        )
                        self._report()
            finally:
                part.busy = False

    async def _handle(self, part: Partition, msgs: list[Msg]) -> None:
        """Blocks of the durable consumer in order (a new pin: take over first, then the blocks
        after it); each acknowledged once processed."""
        start = 0
        while start < len(msgs):
            pin = (msgs[start].headers or {}).get("Nats-Pin-Id")
            if pin and pin != part.served:
                if part.served is not None:
                    self._unpin(part, "pinned again under a new id")
                part.served = pin
                await self._take_over(part)
            stop = start + 1
            while stop < len(msgs) and (msgs[stop].headers or {}).get("Nats-Pin-Id") in (
                None,
                "",
                part.served,
            ):
                stop += 1
            run = msgs[start:stop]
            fresh = [m for m in run if stream_position(m)[0] > part.replayed_through]
            part.skipped += len(run) - len(fresh)
            if fresh:
                await self._on_blocks(part, fresh)
                part.blocks += len(fresh)
            await self._ack(run)
            start = stop

    async def _ack(self, msgs: list[Msg]) -> None:
        """Acknowledge ``msgs`` (``+ACK`` each, without the blocks' headers: one flush)."""
        nc = self._nc
        assert nc is not None
        for msg in msgs:
            if msg.reply:
                with contextlib.suppress(nats.errors.Error):
                    await nc.publish(msg.reply, b"+ACK")

    def _unpin(self, part: Partition, why: str, level: int = logging.WARNING) -> None:
        """Let the partition's sessions go (their incomplete chunks are the next owner's)."""
        part.served = None
        if not part.sessions:
            return
        log.log(
            level,
            "worker %s: partition %d lost (%s); closing its %d sessions",
            self.fleet.worker_id, part.index, why, len(part.sessions),
        )  # fmt: skip
        for session in sorted(part.sessions):
            self.fleet.close_session(session)
            self._stamps.pop(session, None)
        part.sessions = set()

    async def _take_over(self, part: Partition) -> None:
        """Newly pinned: rebuild the partition's sessions from the stream's retained gaze.

        The replay reads, unacknowledged, every retained block of the partition up to the last
        one the durable consumer had delivered (to anyone) when we were pinned: those it had
        delivered to a dead worker without an acknowledgement are processed here in order, the
        acknowledged ones only rebuild windows (the ledger's cut, see :meth:`_session_of`). What
        it had not delivered yet comes from the durable consumer afterwards, in order.

        A replay the server stops answering (a stall, a restart, a leader election) is resumed
        after the last block it read, with a new replay consumer, until it reaches that end: the
        acknowledged blocks it has not read yet will not come again from the durable consumer.
        """
        for session in sorted(part.sessions):  # stale state of an earlier pin
            self.fleet.close_session(session)
            self._stamps.pop(session, None)
        part.sessions = set()
        part.stamp = -math.inf  # stream time starts again with the replay (it reads in order)
        part.replayed_through = 0  # what the replay fed the new sessions: nothing yet
        part.replaying = True  # (sessions it opens need no replay of their own)
        try:
            await self._replay_partition(part)
        finally:
            part.replaying = False

    async def _replay_partition(self, part: Partition) -> None:
        """The replay of :meth:`_take_over`."""
        js = self._js
        assert js is not None
        started = time.monotonic()
        filt = partition_subject(self.nats.subject_prefix, part.index)
        through: int | None = None
        replayed, done = 0, False
        while not done and not self._stopping:
            try:
                if through is None:
                    durable = await js.consumer_info(self.nats.stream, consumer_name(part.index))
                    delivered = durable.delivered
                    through = int((delivered.stream_seq or 0) if delivered is not None else 0)
                    done = through == 0
                    continue
                retained = self._retained(filt, part.replayed_through + 1, through)
                async with contextlib.aclosing(retained) as batches:
                    async for batch in batches:
                        await self._on_blocks(part, batch)
                        part.replayed_through = stream_position(batch[-1])[0]
                        replayed += len(batch)
                done = True
            except (nats.errors.Error, TimeoutError) as exc:  # nats.js.errors.Error as well
                log.warning(
                    "worker %s: replay of partition %d interrupted (%s); resuming after stream "
                    "sequence %d",
                    self.fleet.worker_id, part.index, str(exc) or type(exc).__name__,
                    part.replayed_through,
                )  # fmt: skip
                await asyncio.sleep(0.5)
        log.info(
            "worker %s: pinned on partition %d; replayed %d retained blocks (through stream "
            "sequence %d) in %.2f s: %d sessions (%s)",
            self.fleet.worker_id, part.index, replayed, part.replayed_through,
            time.monotonic() - started, len(part.sessions), self._why_mine(part),
        )  # fmt: skip
        self._report()

    # ------------------------------------------------------------------ blocks
    async def _session_of(self, part: Partition, msg: Msg) -> tuple[str, FleetSession | None]:
        """The session a stored block belongs to, opened (and resumed) on first sight.

        A session opened again mid-stream — closed for idleness earlier, or with chunks
        charged already (by another worker, or by this one before it lost the partition) —
        outside a takeover's replay gets its feature window rebuilt from the stream's retained
        gaze of that session (:meth:`_rebuild`) before ``msg`` is processed."""
        tokens = msg.subject.split(".")
        key = f"{tokens[-2]}.{tokens[-1]}"
        entry = self.fleet.sessions.get(key)
        if entry is not None:
            return key, entry
        try:
            rate = declared_rate(
                self.settings.ingest.rate_hz, header_float(msg, RATE_HEADER) or 0.0, key
            )
        except ConfigError as exc:
            if key not in self._no_rate:
                self._no_rate.add(key)
                log.warning("worker %s: session %r refused: %s", self.fleet.worker_id, key, exc)
            return key, None
        entry = self.fleet.open_session(key, rate, device=tokens[-2])  # the headset's id: ACLs
        if entry is None:
            return key, None
        part.sessions.add(key)
        offset = header_float(msg, UNIX_OFFSET_HEADER)
        if offset is not None:
            entry.pipeline.clock_offset_s = offset
        charged = self.fleet.ledger.charges(key)
        if charged:
            used = lsl_unix_offset() if offset is None else offset
            half_step = self.settings.features.step_s / 2
            entry.pipeline.resume_after = charged[-1].gaze_end - used + half_step
            log.info(
                "worker %s: session %r resumes after chunk %d (gaze up to %.3f s rebuilds the "
                "window only)",
                self.fleet.worker_id, key, charged[-1].chunk_index, entry.pipeline.resume_after,
            )  # fmt: skip
        reopened = self._idle_closed.pop(key, None) is not None
        if (charged or reopened) and not part.replaying:
            # (not idle while its older blocks are fed)
            self._stamp(part, key, stream_position(msg)[1])
            await self._rebuild(part, key, msg)
        return key, entry

    async def _rebuild(self, part: Partition, key: str, msg: Msg) -> None:
        """Feed a session opened mid-stream the stream's retained gaze of that session before
        ``msg`` (an ephemeral unacknowledged consumer filtered on its subject): its feature
        window and incomplete chunk are rebuilt; the ledger's cut (``resume_after``) keeps the
        gaze of charged chunks from being charged again. A replay that fails leaves the window
        as far as it got (logged)."""
        upto = stream_position(msg)[0]
        started = time.monotonic()
        replayed = 0
        try:
            async with contextlib.aclosing(self._retained(msg.subject, 1, upto - 1)) as batches:
                async for old in batches:
                    await self._on_blocks(part, old)
                    replayed += len(old)
        except (nats.errors.Error, TimeoutError) as exc:  # nats.js.errors.Error as well
            log.warning(
                "worker %s: session %r: rebuilding its feature window from the stream failed "
                "after %d blocks (%s); it continues from there",
                self.fleet.worker_id, key, replayed, str(exc) or type(exc).__name__,
            )  # fmt: skip
            return
        log.info(
            "worker %s: session %r opened mid-stream: rebuilt its window from %d retained blocks "
            "in %.2f s",
            self.fleet.worker_id, key, replayed, time.monotonic() - started,
        )  # fmt: skip

    async def _retained(
        self, subject: str, first: int, last: int
    ) -> AsyncGenerator[list[Msg], None]:
        """The stream's retained messages on ``subject`` with stream sequence ``first`` to
        ``last`` (both included), in order and in batches (as fetched, up to 256), read by an
        ephemeral unacknowledged consumer that is deleted afterwards; fewer where they have aged
        out, or when the worker stops. Errors of the server (a stall, a restart, an election)
        are the caller's to handle."""
        js = self._js
        assert js is not None
        if last < first:
            return
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=first,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
            mem_storage=True,
            num_replicas=1,
        )
        psub = await js.pull_subscribe(subject, stream=self.nats.stream, config=config)
        try:
            done = (await psub.consumer_info()).num_pending == 0  # aged out meanwhile
            while not done and not self._stopping:
                batch: list[Msg] = []
                for msg in await psub.fetch(256, timeout=5):
                    seq = msg.metadata.sequence.stream
                    if seq > last:
                        done = True
                        break
                    batch.append(msg)
                    done = seq == last or msg.metadata.num_pending == 0
                    if done:
                        break
                if batch:
                    yield batch
        finally:
            with contextlib.suppress(nats.errors.Error):
                await psub.unsubscribe()

    def _stamp(self, part: Partition, key: str, stamp: float) -> None:
        """Note the server's receipt time (Unix s) of ``key``'s newest block (idleness in stream
        time; an older block, read again or rebuilding a window, changes nothing)."""
        if stamp > self._stamps.get(key, -math.inf):
            self._stamps[key] = stamp
        part.stamp = max(part.stamp, stamp)

    async def _on_blocks(self, part: Partition, msgs: list[Msg]) -> None:
        """Decode the blocks (at once), keep each session's new samples in order, and feed
        every session its samples of the batch in one step
        (:meth:`~gazeguard.runtime.fleet.SessionHost.process_many`).

        The usual block — timestamps increasing, after the session's newest, none ahead of the
        clock — is recognised from the decoder's first/last timestamps with no numpy call of
        its own; any other goes through :meth:`_new_samples`, sample by sample."""
        seen = time.monotonic()
        decoded = decode_many([m.data for m in msgs], self.fleet.kernels)
        clock = _Clock(self.settings.ingest.future_tolerance_s)
        fresh: dict[str, tuple[FleetSession, list[GazeSamples]]] = {}
        for i, msg in enumerate(msgs):
            key, entry = await self._session_of(part, msg)
            if entry is None:
                continue  # refused: fleet.max_sessions reached (logged)
            entry.last_seen = seen
            self._stamp(part, key, stream_position(msg)[1])
            block = decoded.blocks[i]
            if isinstance(block, StreamError):
                entry.bad_blocks += 1
                log.warning("session %r: malformed gaze block dropped: %s", key, block)
                continue
            last = decoded.last[i]
            if (
                decoded.increasing[i]
                and decoded.first[i] > entry.last_t
                and last <= clock.limit(entry.pipeline.clock_offset_s)
            ):
                entry.last_t = last
                entry.samples += len(block)
            else:
                new = self._new_samples(entry, key, block, msg, clock)
                if new is None:
                    continue
                block = new
            fresh.setdefault(key, (entry, []))[1].append(block)
        items = [
            (entry, blocks[0] if len(blocks) == 1 else GazeSamples.concat(blocks))
            for entry, blocks in fresh.values()
        ]
        if items:
            await self.fleet.process_many(items)

    def _new_samples(
        self, entry: FleetSession, key: str, block: GazeSamples, msg: Msg, clock: _Clock
    ) -> GazeSamples | None:
        """The block's samples newer than the session's newest and not ahead of the clock
        (counted in the session), or ``None``: nothing new."""
        if len(block) and block.timestamps[-1] <= entry.last_t:
            self.duplicate_blocks += 1  # delivered again: every sample is held already
            return None
        block = self._drop_future(entry, key, block, header_float(msg, NOW_HEADER), clock)
        t = block.timestamps
        keep = t > np.maximum.accumulate(np.concatenate(([entry.last_t], t[:-1])))
        if not keep.all():
            entry.dropped_samples += int((~keep).sum())
            block = _select(block, np.flatnonzero(keep))
        if len(block) == 0:
            return None
        entry.last_t = float(block.timestamps[-1])
        entry.samples += len(block)
        return block

    def _drop_future(
        self,
        entry: FleetSession,
        key: str,
        block: GazeSamples,
        device_now: float | None,
        clock: _Clock,
    ) -> GazeSamples:
        """Drop samples stamped ahead of the device's clock (``ingest.future_tolerance_s``), as
        LSL ingest does: "now" is the later of this host's Unix clock less the offset and
        the block's ``Gazeguard-Now``."""
        limit = clock.limit(entry.pipeline.clock_offset_s)
        if device_now is not None:
            limit = max(limit, device_now + clock.tolerance_s)
        ahead = block.timestamps > limit
        if not ahead.any():
            return block
        if entry.future_samples == 0:
            log.warning(
                "session %r: gaze stamped ahead of the clock dropped (first %.3g s ahead)",
                key,
                float(block.timestamps[ahead][0] - (limit - clock.tolerance_s)),
            )
        entry.future_samples += int(ahead.sum())
        return _select(block, np.flatnonzero(~ahead))

    async def _sweep(self) -> None:
        """Close every session silent for ``fleet.idle_timeout_s``.

        Time this worker did not keep up is not the devices' silence, so it is added to the
        sessions' ``last_seen``:

        * time it did not run (frozen, suspended, starved of CPU: its sweep woke late by that
          much), while their blocks waited in the stream. Without that, a worker resuming after
          a freeze longer than the timeout let every session go before reading what waited;
        * for the sessions of a partition with blocks in the worker's hands (queued after a
          pull, or being processed: a slow disk holding a charge up, a takeover's replay), the
          whole interval. Without that, a worker behind by more than the timeout let such
          sessions go and opened them again on their next block with an empty feature window
          (their incomplete chunk lost), as the retired MQTT fleet once did under load.

        A worker that is always behind (sustained overload) would then never close a dead
        session; so a session is also idle in *stream time*: when the partition's blocks this
        worker has processed were received by the server more than the timeout after the
        session's newest block (blocks are processed in the order received, so none of its
        blocks is still to come from before then).
        """
        idle = self.settings.fleet.idle_timeout_s
        every = min(1.0, idle / 2)
        tick = time.monotonic()
        while not self._stopping:
            await asyncio.sleep(every)
            now = time.monotonic()
            interval, tick = now - tick, now
            for part in self.partitions:
                absent = interval if part.behind else interval - every
                if absent <= 0:
                    continue
                for session in part.sessions:
                    entry = self.fleet.sessions.get(session)
                    if entry is not None:
                        entry.last_seen = min(now, entry.last_seen + absent)
            silent = {
                session
                for part in self.partitions
                for session in part.sessions
                if part.stamp - self._stamps.get(session, part.stamp) > idle
            }
            for session, entry in list(self.fleet.sessions.items()):
                if now - entry.last_seen > idle or session in silent:
                    self.fleet.close_session(session)
                    self._stamps.pop(session, None)
                    self._idle_closed[session] = now
                    for part in self.partitions:
                        part.sessions.discard(session)
            retained = self.nats.max_age_s  # older: nothing left in the stream to rebuild from
            for session, closed in list(self._idle_closed.items()):
                if now - closed > retained:
                    del self._idle_closed[session]


def _select(block: GazeSamples, idx: np.ndarray) -> GazeSamples:
    return GazeSamples(
        block.timestamps[idx], block.x_deg[idx], block.y_deg[idx], block.pupil_mm[idx],
        block.valid[idx],
    )  # fmt: skip


class _Clock:
    """ "Now" for one batch of blocks, read once: this host's Unix time (and the LSL clock's
    offset, for sessions whose blocks state none), and the future tolerance, s."""

    def __init__(self, tolerance_s: float) -> None:
        self.tolerance_s = tolerance_s
        self._unix = time.time()
        self._lsl_offset: float | None = None

    def limit(self, offset: float | None) -> float:
        """The newest sample time not ahead of the clock, on a session's clock (``offset``:
        Unix time − sample time, s; ``None``: this host's LSL clock)."""
        if offset is None:
            if self._lsl_offset is None:
                self._lsl_offset = lsl_unix_offset()
            offset = self._lsl_offset
        return self._unix - offset + self.tolerance_s
