"""The worker side of JetStream raw-gaze ingest: pull the partitions pinned on this worker, take
them over by a replay, balance them over live workers (see :mod:`gazeguard.jetstream`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
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

from gazeguard.errors import StreamError
from gazeguard.jetstream.balance import Member, assign_partitions, members_subject
from gazeguard.jetstream.wire import (
    NOW_HEADER,
    UNIX_OFFSET_HEADER,
    connect_options,
    consumer_name,
    ensure_consumers,
    ensure_stream,
    header_float,
    partition_subject,
)
from gazeguard.rawgaze import decode_many
from gazeguard.samples import GazeSamples, lsl_unix_offset

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

    from gazeguard.config import NatsSettings, Settings
    from gazeguard.fleet import Fleet, _Session


log = logging.getLogger(__name__)

#: A pull request: at most this many blocks, expiring after this long (ns).
PULL_BATCH = 64


PULL_EXPIRES_NS = 500_000_000


@dataclass
class _Partition:
    """What one worker knows of one partition."""

    index: int
    pin: str | None = None  # the Nats-Pin-Id the server gave us (pulls send it); None: none
    served: str | None = None  # the pin whose sessions we hold (the takeover is done)
    replayed_through: int = 0  # stream sequence the takeover's replay read up to
    sessions: set[str] = field(default_factory=set)
    blocks: int = 0  # processed from the durable consumer
    skipped: int = 0  # delivered by the durable consumer, already read by the replay
    queue: asyncio.Queue[Msg | None] | None = None  # pulled, waiting to be processed
    busy: bool = False  # a block (or a takeover's replay) is being processed
    pulling: bool = False  # a pull request of ours is open at the server
    handing_back: bool = False  # balance: no new pulls; the pin goes once the blocks are done

    @property
    def behind(self) -> bool:
        """Blocks of this partition are in the worker's hands, not yet processed."""
        return self.busy or (self.queue is not None and not self.queue.empty())


class JetStreamIngest:
    """The worker side: serve every partition the server pins on this worker, until ``stop``.

    Args:
        fleet: the worker's :class:`~gazeguard.fleet.Fleet` (sessions, ledger, publisher).
    """

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.settings: Settings = fleet.settings
        self.nats: NatsSettings = fleet.settings.fleet.nats
        self.partitions = [_Partition(p) for p in range(self.nats.partitions)]
        self.duplicate_blocks = 0  # delivered again, every sample already held
        self.handed_back = 0  # partitions handed to their assigned worker (balance)
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._stopping = False  # every loop ends at its next turn (see _pull)
        # balance: the other workers heard, the live set, its assignment (partition → worker)
        self._members: dict[str, Member] = {}
        self._view: tuple[str, ...] = (self.fleet.worker_id,)
        self._view_at = time.monotonic()  # when the live set last changed
        self._owner: dict[int, str] = {}
        self._settled = not self.nats.balance  # pulls wait until the others have been heard
        self._changed = asyncio.Event()  # set (and replaced) when a pull's gate may have opened
        self._handing: asyncio.Task[None] | None = None
        self._reported: tuple[object, ...] | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Connect, set up the stream and consumers, pull every partition until ``stop``; then
        close every session (their incomplete chunks are dropped, as at any stop)."""
        worker = self.fleet.worker_id
        opts = connect_options(self.nats, f"gazeguard-worker-{worker}")
        logged = opts["reconnected_cb"]

        async def reconnected() -> None:
            now = time.monotonic()  # an outage is nobody's silence: we could not hear them
            for member in self._members.values():
                member.last = max(member.last, now)
            await logged()

        nc = await nats.connect(**{**opts, "reconnected_cb": reconnected})
        self._nc, self._js = nc, nc.jetstream()
        try:
            await ensure_stream(self._js, self.nats)
            await ensure_consumers(nc, self.nats)
            if self.nats.balance:
                await nc.subscribe(members_subject(self.nats.stream), cb=self._heard)
            log.info(
                "worker %s: pulling %d partitions of JetStream stream %s (group %s; balance %s)",
                worker, self.nats.partitions, self.nats.stream, self.nats.group,
                "on" if self.nats.balance else "off",
            )  # fmt: skip
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(self._serve(part), name=f"gazeguard.jetstream[{part.index}]")
                    for part in self.partitions
                ]
                tasks.append(tg.create_task(self._sweep(), name="gazeguard.jetstream.sweep"))
                if self.nats.balance:
                    balance = tg.create_task(self._balance(tg), name="gazeguard.jetstream.balance")
                    tasks.append(balance)
                await stop.wait()
                self._stopping = True
                if self._handing is not None:
                    tasks.append(self._handing)
                for task in tasks:
                    task.cancel()
        finally:
            for session in list(self.fleet.sessions):
                self.fleet._close_session(session)
            if self.nats.balance and nc.is_connected:
                await self._leave()
            for part in self.partitions:
                log.info(
                    "worker %s: partition %d: %d blocks processed, %d already replayed",
                    worker, part.index, part.blocks, part.skipped,
                )  # fmt: skip
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await nc.close()

    # ------------------------------------------------------------------ pulling
    async def _serve(self, part: _Partition) -> None:
        """Pull the partition's durable consumer (keeping any pin alive) and process what
        arrives, concurrently: a long takeover replay must not stop the pulls, or the server
        would hand the pin on after ``pin_timeout_s``."""
        queue: asyncio.Queue[Msg | None] = asyncio.Queue()
        part.queue = queue
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._pull(part, queue), name=f"gazeguard.jetstream.pull[{part.index}]")
            tg.create_task(self._work(part, queue), name=f"gazeguard.jetstream.work[{part.index}]")

    async def _pull(self, part: _Partition, queue: asyncio.Queue[Msg | None]) -> None:
        """Pull for ever, with the current pin's id once pinned; queue the blocks, and ``None``
        when the server says the pin is another worker's (status 423)."""
        nc = self._nc
        assert nc is not None
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.nats.stream}.{consumer_name(part.index)}"
        inbox = nc.new_inbox()
        answers: asyncio.Queue[Msg] = asyncio.Queue()

        async def answer(msg: Msg) -> None:
            answers.put_nowait(msg)

        # A callback and asyncio.timeout, not Subscription.next_msg: next_msg waits with
        # asyncio.wait_for, which on Python 3.11 can swallow a cancellation that lands as a
        # message arrives; the worker then never stopped (seen: 1 stop in 6 hung).
        sub = await nc.subscribe(inbox, cb=answer)
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
                try:
                    await nc.publish(subject, json.dumps(request).encode(), reply=inbox)
                except nats.errors.Error as exc:  # closed or stale: nats-py reconnects
                    log.debug("partition %d: pull request failed: %s", part.index, exc)
                    part.pulling = False
                    await asyncio.sleep(0.2)
                    continue
                try:
                    await self._read_batch(part, answers, queue)
                finally:
                    part.pulling = False
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

    async def _read_batch(
        self, part: _Partition, answers: asyncio.Queue[Msg], queue: asyncio.Queue[Msg | None]
    ) -> None:
        """The answers to one pull request: blocks (queued) or a status (the request is over)."""
        deadline = time.monotonic() + PULL_EXPIRES_NS / 1e9 + 0.2
        got = 0
        while got < PULL_BATCH:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if answers.empty():
                try:
                    async with asyncio.timeout(left):
                        msg = await answers.get()
                except TimeoutError:
                    return
            else:
                msg = answers.get_nowait()
            headers = msg.headers or {}
            status = headers.get("Status")
            if status:
                if status == "423":  # pinned on another worker: ours (if any) is gone
                    part.pin = None
                    queue.put_nowait(None)
                if status in ("404", "408", "409", "423"):
                    return
                continue  # 100: heartbeat
            got += 1
            part.pin = headers.get("Nats-Pin-Id", part.pin)
            queue.put_nowait(msg)

    async def _work(self, part: _Partition, queue: asyncio.Queue[Msg | None]) -> None:
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

    async def _handle(self, part: _Partition, msgs: list[Msg]) -> None:
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
            fresh = [m for m in run if m.metadata.sequence.stream > part.replayed_through]
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

    def _unpin(self, part: _Partition, why: str, level: int = logging.WARNING) -> None:
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
            self.fleet._close_session(session)
        part.sessions = set()

    async def _take_over(self, part: _Partition) -> None:
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
        js = self._js
        assert js is not None
        for session in sorted(part.sessions):  # stale state of an earlier pin
            self.fleet._close_session(session)
        part.sessions = set()
        part.replayed_through = 0  # what the replay fed the new sessions: nothing yet
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
                config = ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=part.replayed_through + 1,
                    ack_policy=AckPolicy.NONE,
                    inactive_threshold=30.0,
                    mem_storage=True,
                    num_replicas=1,
                )
                psub = await js.pull_subscribe(filt, stream=self.nats.stream, config=config)
                try:
                    done = (await psub.consumer_info()).num_pending == 0  # aged out meanwhile
                    while not done:
                        for msg in await psub.fetch(256, timeout=5):
                            seq = msg.metadata.sequence.stream
                            if seq > through:
                                done = True
                                break
                            await self._on_block(part, msg)
                            part.replayed_through = seq
                            replayed += 1
                            done = seq == through or msg.metadata.num_pending == 0
                            if done:
                                break
                finally:
                    with contextlib.suppress(nats.errors.Error):
                        await psub.unsubscribe()
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

    # ------------------------------------------------------------------ balance
    def _may_pull(self, part: _Partition) -> bool:
        """Balance: pull the partitions assigned to this worker and those it holds a pin on
        (until it hands them back); none until the other workers have been heard."""
        if not self.nats.balance:
            return True
        if not self._settled or part.handing_back:
            return False
        return part.pin is not None or self._owner.get(part.index) == self.fleet.worker_id

    def _notify(self) -> None:
        """Wake the pulls waiting on their gate (:meth:`_may_pull`)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def _heard(self, msg: Msg) -> None:
        """A heartbeat (or a goodbye) of a worker on :func:`members_subject`."""
        try:
            data = json.loads(msg.data)
            worker = str(data["worker"])
        except (ValueError, TypeError, KeyError):
            return
        if worker == self.fleet.worker_id or self._stopping:
            return
        now = time.monotonic()
        if data.get("leaving"):
            self._members.pop(worker, None)
        else:
            member = self._members.get(worker)
            if member is None or now - member.last > self._expiry:
                member = self._members[worker] = Member(now)
            else:
                member.last = now
                member.beats += 1
            member.pulling = bool(data.get("pulling"))
        self._update_view()

    @property
    def _expiry(self) -> float:
        """A worker not heard for this long is gone (s)."""
        return 3 * self.nats.heartbeat_s

    def _update_view(self) -> None:
        """Recompute the live workers (this one; others heard twice, the last time within
        :attr:`_expiry`; none dropped while this worker is cut off from NATS) and, when they
        changed, the assignment."""
        nc = self._nc
        now = time.monotonic()
        connected = nc is not None and nc.is_connected
        live = {self.fleet.worker_id}
        for worker, member in list(self._members.items()):
            fresh = now - member.last <= self._expiry or not connected
            if fresh and member.beats >= 2:
                live.add(worker)
            elif not fresh:
                del self._members[worker]
        view = tuple(sorted(live))
        if view == self._view and self._owner:
            return
        self._view, self._view_at = view, now
        self._owner = assign_partitions(self.nats.partitions, view, self.nats.stream)
        mine = sorted(p for p, w in self._owner.items() if w == self.fleet.worker_id)
        log.info(
            "worker %s: balance: %d live workers (%s); assigned partitions %s",
            self.fleet.worker_id, len(view), ", ".join(view), mine,
        )  # fmt: skip
        self._notify()

    async def _balance(self, tg: asyncio.TaskGroup) -> None:
        """Announce this worker every ``heartbeat_s``, keep the live set, and hand back (one at a
        time) a partition this worker holds that is assigned to another live worker."""
        nc = self._nc
        assert nc is not None
        me = self.fleet.worker_id
        hb = self.nats.heartbeat_s
        # Heartbeats come every hb: after 2.5 hb every running worker has been heard twice.
        settle_at = time.monotonic() + 2.5 * hb
        while not self._stopping:
            if not self._settled and time.monotonic() >= settle_at:
                self._settled = True  # (announced at once: the others may hand back now)
                self._update_view()
                self._notify()
            holds = [part.index for part in self.partitions if part.pin is not None]
            beat = {"worker": me, "holds": holds, "pulling": self._settled}
            with contextlib.suppress(nats.errors.Error):
                await nc.publish(members_subject(self.nats.stream), json.dumps(beat).encode())
            self._update_view()
            # hand back only under a live set stable for 2 heartbeats: a worker that stalls
            # past the expiry and comes back (heard twice) moves nothing among the others
            stable = time.monotonic() - self._view_at >= 2 * hb
            if self._settled and stable and (self._handing is None or self._handing.done()):
                for part in self.partitions:
                    owner = self._owner.get(part.index, me)
                    target = self._members.get(owner)
                    # to a worker that pulls already: its pull is there to take the pin
                    if part.pin is not None and target is not None and target.pulling:
                        self._handing = tg.create_task(
                            self._hand_back(part, owner),
                            name=f"gazeguard.jetstream.hand_back[{part.index}]",
                        )
                        break
            self._report()
            wait = hb if self._settled else min(hb, settle_at - time.monotonic())
            await asyncio.sleep(max(wait, 0.0))

    async def _hand_back(self, part: _Partition, to: str) -> None:
        """Stop pulling ``part``, finish (and acknowledge) the blocks in hand, let its sessions
        go, and ask the server to unpin it: the next pull served — the assigned worker's, the
        only one left pulling it — gets the pin and takes the partition over."""
        me = self.fleet.worker_id
        started = time.monotonic()
        part.handing_back = True
        try:
            # the open pull ends within PULL_EXPIRES_NS; its blocks are then processed
            while (part.pulling or part.behind) and not self._stopping:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            if self._stopping or part.pin is None or self._owner.get(part.index, me) == me:
                return  # moved meanwhile (refused), or the membership changed: keep it
            why = (
                f"balance: {len(self._view)} workers, {self.nats.partitions} partitions; "
                f"assigned to worker {to}"
            )
            self._unpin(part, f"handed back ({why})", logging.INFO)
            part.pin = None
            unpinned = await self._request_unpin(part)
            self.handed_back += 1
            log.info(
                "worker %s: partition %d handed to worker %s (%s) in %.2f s%s",
                me, part.index, to, why, time.monotonic() - started,
                "" if unpinned else "; the server kept the pin: it moves after pin_timeout_s",
            )  # fmt: skip
        finally:
            part.handing_back = False
            self._notify()
            self._report()

    async def _request_unpin(self, part: _Partition, wait_s: float = 2.0) -> bool:
        """``$JS.API.CONSUMER.UNPIN`` (nats-server ≥ 2.11) for ``part``'s group: the server
        forgets the pin, and serves the next pull request without one. ``False``: refused or
        unanswered (the pin then moves after ``pin_timeout_s`` without pulls)."""
        nc = self._nc
        assert nc is not None
        subject = f"$JS.API.CONSUMER.UNPIN.{self.nats.stream}.{consumer_name(part.index)}"
        try:
            reply = await nc.request(
                subject, json.dumps({"group": self.nats.group}).encode(), timeout=wait_s
            )
            answer = json.loads(reply.data)
        except (nats.errors.Error, TimeoutError, ValueError) as exc:
            log.warning(
                "worker %s: unpinning partition %d failed: %s",
                self.fleet.worker_id, part.index, str(exc) or type(exc).__name__,
            )  # fmt: skip
            return False
        if "error" in answer:
            log.warning(
                "worker %s: the server refused to unpin partition %d: %s",
                self.fleet.worker_id, part.index, answer["error"],
            )  # fmt: skip
            return False
        return True

    async def _leave(self) -> None:
        """A graceful stop: say goodbye (the others drop this worker at once) and unpin the
        partitions this worker held (their sessions are closed), so that their assigned
        workers take them over now rather than after ``pin_timeout_s``."""
        nc = self._nc
        assert nc is not None
        bye = json.dumps({"worker": self.fleet.worker_id, "leaving": True}).encode()
        held = [part for part in self.partitions if part.pin is not None]
        for part in held:
            part.pin = None
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await nc.publish(members_subject(self.nats.stream), bye)
            await asyncio.wait_for(
                asyncio.gather(*(self._request_unpin(part, 1.0) for part in held)), 2.0
            )

    def _why_mine(self, part: _Partition) -> str:
        """Why this worker was pinned on ``part`` (the take-over's log line)."""
        if not self.nats.balance:
            return "first puller served; balance off"
        owner = self._owner.get(part.index)
        if owner == self.fleet.worker_id:
            return (
                f"balance: assigned to this worker, {len(self._view)} workers, "
                f"{self.nats.partitions} partitions"
            )
        return f"held on; balance assigns it to worker {owner}"

    def _report(self) -> None:
        """Log the partitions held (taken over) and assigned, when they change and the pulls
        agree with the assignment (no pull open on a partition this worker may not pull)."""
        if not self.nats.balance:
            return
        me = self.fleet.worker_id
        steady = self._settled and not any(
            part.handing_back or (part.pulling and not self._may_pull(part))
            for part in self.partitions
        )
        held = sorted(part.index for part in self.partitions if part.served is not None)
        mine = sorted(p for p, w in self._owner.items() if w == me)
        state = (tuple(held), tuple(mine), self._view)
        if not steady or state == self._reported:
            return
        self._reported = state
        log.info(
            "worker %s: holds partitions %s; assigned %s (balance: %d workers, %d partitions)",
            me, held, mine, len(self._view), self.nats.partitions,
        )  # fmt: skip

    # ------------------------------------------------------------------ blocks
    def _session_of(self, part: _Partition, msg: Msg) -> tuple[str, _Session | None]:
        """The session a stored block belongs to, opened (and resumed) on first sight."""
        tokens = msg.subject.split(".")
        key = f"{tokens[-2]}.{tokens[-1]}"
        entry = self.fleet.sessions.get(key)
        if entry is not None:
            return key, entry
        entry = self.fleet._open_session(key)
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
        return key, entry

    async def _on_block(self, part: _Partition, msg: Msg) -> None:
        """Decode one block and feed its new samples to its session."""
        await self._on_blocks(part, [msg])

    async def _on_blocks(self, part: _Partition, msgs: list[Msg]) -> None:
        """Decode the blocks (at once), keep each session's new samples in order, and feed
        every session its samples of the batch in one step (:meth:`Fleet._process_many`)."""
        seen = time.monotonic()
        fresh: dict[str, tuple[_Session, list[GazeSamples]]] = {}
        for msg, decoded in zip(msgs, decode_many([m.data for m in msgs]), strict=True):
            key, entry = self._session_of(part, msg)
            if entry is None:
                continue  # refused: fleet.max_sessions reached (logged)
            entry.last_seen = seen
            if isinstance(decoded, StreamError):
                entry.bad_blocks += 1
                log.warning("session %r: malformed gaze block dropped: %s", key, decoded)
                continue
            block = self._new_samples(entry, key, decoded, msg)
            if block is not None:
                fresh.setdefault(key, (entry, []))[1].append(block)
        items = [
            (entry, blocks[0] if len(blocks) == 1 else GazeSamples.concat(blocks))
            for entry, blocks in fresh.values()
        ]
        if items:
            await self.fleet._process_many(items)

    def _new_samples(
        self, entry: _Session, key: str, block: GazeSamples, msg: Msg
    ) -> GazeSamples | None:
        """The block's samples newer than the session's newest and not ahead of the clock
        (counted in the session), or ``None``: nothing new."""
        if len(block) and block.timestamps[-1] <= entry.last_t:
            self.duplicate_blocks += 1  # delivered again: every sample is held already
            return None
        block = self._drop_future(entry, key, block, header_float(msg, NOW_HEADER))
        t = block.timestamps
        if len(t) > 1 and t[0] > entry.last_t and bool(np.all(t[1:] > t[:-1])):
            pass  # the usual block: increasing, after the newest held
        else:
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
        self, entry: _Session, key: str, block: GazeSamples, device_now: float | None
    ) -> GazeSamples:
        """Drop samples stamped ahead of the device's clock (``ingest.future_tolerance_s``), as
        LSL ingest does: "now" is the later of this host's Unix clock less the offset and
        the block's ``Gazeguard-Now``."""
        offset = entry.pipeline.clock_offset_s
        now = time.time() - (lsl_unix_offset() if offset is None else offset)
        if device_now is not None:
            now = max(now, device_now)
        ahead = block.timestamps > now + self.settings.ingest.future_tolerance_s
        if not ahead.any():
            return block
        if entry.future_samples == 0:
            log.warning(
                "session %r: gaze stamped ahead of the clock dropped (first %.3g s ahead)",
                key,
                float(block.timestamps[ahead][0] - now),
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
            for session, entry in list(self.fleet.sessions.items()):
                if now - entry.last_seen > idle:
                    self.fleet._close_session(session)
                    for part in self.partitions:
                        part.sessions.discard(session)


def _select(block: GazeSamples, idx: np.ndarray) -> GazeSamples:
    return GazeSamples(
        block.timestamps[idx], block.x_deg[idx], block.y_deg[idx], block.pupil_mm[idx],
        block.valid[idx],
    )  # fmt: skip
