"""Balance: which live worker each partition is assigned to (see :mod:`gazeguard.runtime.jetstream`,
**Balance**): the membership subject, a bounded-load rendezvous assignment, and a worker's side
of it (:class:`Balancing`: heartbeats, the live set, which partitions it may pull, hand-backs)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import nats.errors

from gazeguard.runtime.jetstream.wire import PULL_EXPIRES_NS, consumer_name

if TYPE_CHECKING:
    from collections.abc import Iterable

    from nats.aio.client import Client
    from nats.aio.msg import Msg

    from gazeguard.config import NatsSettings
    from gazeguard.runtime.fleet import SessionHost

log = logging.getLogger("gazeguard.runtime.jetstream.worker")  # (one logger for the worker's lines)

#: Balance: a starting worker pulls once no heartbeat has come for this long after its hello
#: (the live workers answer a hello at once), and at the latest after 2.5 heartbeats.
SETTLE_QUIET_S = 0.3


def members_subject(stream: str) -> str:
    """The core NATS subject the workers of ``stream`` announce themselves on (balance)."""
    return f"gazeguard.workers.{stream}"


def _weight(salt: str, partition: int, worker: str) -> int:
    digest = hashlib.blake2b(f"{salt}\0{partition}\0{worker}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign_partitions(partitions: int, workers: Iterable[str], salt: str = "") -> dict[int, str]:
    """Partition → its assigned worker: rendezvous hashing with bounded loads.

    Every (partition, worker) pair gets a pseudo-random weight (a hash of ``salt``, the partition
    and the worker id); pairs are taken heaviest first, a partition going to the worker of its
    heaviest pair that still has room: first ``P // N`` partitions each, then one more for the
    ``P % N`` partitions left. So every worker gets ``P // N`` or ``P // N + 1`` partitions (plain
    rendezvous hashing spreads 4 partitions 2–2 over 2 workers only 6 times in 16), every worker
    computes the same map from the same set of ids, and a worker joining or leaving moves few
    partitions besides its own share (the heaviest pairs keep their partitions).
    """
    live = sorted(set(workers))
    if not live:
        return {}
    pairs = sorted(
        ((_weight(salt, p, w), p, w) for p in range(partitions) for w in live), reverse=True
    )
    base = partitions // len(live)
    owner: dict[int, str] = {}
    load = dict.fromkeys(live, 0)
    for room in (base, base + 1):
        for _, p, w in pairs:
            if p not in owner and load[w] < room:
                owner[p] = w
                load[w] += 1
    return owner


@dataclass
class Partition:
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
    answered_at: float = -math.inf  # monotonic time a pull of ours was last answered (any way)
    tended_at: float = -math.inf  # balance: a live worker last pulled it with answers (monotonic)
    replaying: bool = False  # a takeover's replay is feeding the partition's sessions
    stamp: float = -math.inf  # server receipt time (Unix s) of the newest block processed

    @property
    def behind(self) -> bool:
        """Blocks of this partition are in the worker's hands, not yet processed."""
        return self.busy or (self.queue is not None and not self.queue.empty())


@dataclass
class Member:
    """Another worker, as heard on :func:`members_subject` (balance)."""

    last: float  # monotonic time of its last heartbeat
    beats: int = 1  # heartbeats heard since it was last absent
    pulling: bool = False  # it pulls its assigned partitions (it has heard the others)
    holds: frozenset[int] = field(default_factory=frozenset)  # partitions it holds a pin on
    answered: frozenset[int] = frozenset()  # partitions whose pulls the server answered lately


def _ints(value: object) -> list[int]:
    """The integers of a heartbeat's list (anything else: none)."""
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]


class Balancing:
    """A worker's side of the balance, mixed into the worker
    (:class:`~gazeguard.runtime.jetstream.worker.JetStreamIngest`, whose attributes listed below it
    uses): announce this worker, keep the live set and the assignment, gate the pulls
    (:meth:`_may_pull`), find untended partitions, hand back partitions assigned to another
    live worker, say goodbye at a graceful stop."""

    # the worker's (see JetStreamIngest)
    fleet: SessionHost
    nats: NatsSettings
    partitions: list[Partition]
    handed_back: int
    _nc: Client | None
    _stopping: bool
    _cut_off: bool
    _deaf_at: float

    def _init_balance(self) -> None:
        """The balance's state: the other workers heard, the live set, its assignment."""
        self._members: dict[str, Member] = {}
        self._view: tuple[str, ...] = (self.fleet.worker_id,)
        self._view_at = time.monotonic()  # when the live set last changed
        self._owner: dict[int, str] = {}  # partition → its assigned worker
        self._settled = not self.nats.balance  # pulls wait until the others have been heard
        self._changed = asyncio.Event()  # set (and replaced) when a pull's gate may have opened
        self._handing: asyncio.Task[None] | None = None
        self._reported: tuple[object, ...] | None = None
        self._deaf_at = -math.inf  # last seen cut off from NATS (or frozen; monotonic)
        self._cut_off = False  # between nats-py's disconnected and reconnected callbacks
        self._settled_at = -math.inf  # when this worker started pulling (monotonic)
        self._heard_at = -math.inf  # last heartbeat heard before settling (monotonic)
        self._hello = asyncio.Event()  # a starting worker said hello: answer with a heartbeat
        self._orphans: set[int] = set()  # untended partitions anyone may pull
        self._unanswered_logged = -math.inf  # when "my pulls are not answered" was last logged

    def _unpin(self, part: Partition, why: str, level: int = logging.WARNING) -> None:
        raise NotImplementedError  # the worker's: let the partition's sessions go

    def _may_pull(self, part: Partition) -> bool:
        """Balance: pull the partitions assigned to this worker, those it holds a pin on (until
        it hands them back) and those no live worker tends (:meth:`_tend`); none until the other
        workers have been heard."""
        if not self.nats.balance:
            return True
        if not self._settled or part.handing_back:
            return False
        return (
            part.pin is not None
            or self._owner.get(part.index) == self.fleet.worker_id
            or part.index in self._orphans
        )

    def _notify(self) -> None:
        """Wake the pulls waiting on their gate (:meth:`_may_pull`)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def _heard(self, msg: Msg) -> None:
        """A heartbeat (or a goodbye) of a worker on :func:`members_subject`.

        Another worker counts once heard twice; but while this worker is starting, a worker
        answering its hello, or starting too (saying hello), counts at once.
        """
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
            if member is None or self._silence(member, now) > self._expiry:
                member = self._members[worker] = Member(now)
                self._heard_at = now  # (starting: the answers are still coming)
            else:
                member.last = now
                member.beats += 1
            member.pulling = bool(data.get("pulling"))
            member.holds = frozenset(_ints(data.get("holds")))
            member.answered = frozenset(_ints(data.get("answered")))
            if not self._settled and (data.get("reply") or data.get("hello")):
                self._heard_at = now
                member.beats = max(member.beats, 2)
            if data.get("hello"):
                self._hello.set()  # answered by the balance loop with a heartbeat, at once
        self._update_view()

    @property
    def _expiry(self) -> float:
        """A worker not heard for this long is gone (s)."""
        return 3 * self.nats.heartbeat_s

    @property
    def _grace(self) -> float:
        """A partition no live worker has tended for this long is anyone's to pull (s)."""
        return self.nats.pin_timeout_s + 2 * self.nats.heartbeat_s

    def _silence(self, member: Member, now: float) -> float:
        """How long ``member`` has been silent while this worker could hear it (s)."""
        nc = self._nc
        if nc is None or not nc.is_connected or self._cut_off:
            self._deaf_at = now
        return now - max(member.last, self._deaf_at)

    def _update_view(self) -> None:
        """Recompute the live workers (this one; others heard twice, the last time within
        :attr:`_expiry` of the later of their last heartbeat and the last moment this worker
        was cut off from NATS, or frozen: an outage is nobody's silence) and, when they changed,
        the assignment."""
        now = time.monotonic()
        live = {self.fleet.worker_id}
        for worker, member in list(self._members.items()):
            fresh = self._silence(member, now) <= self._expiry
            if fresh and member.beats >= 2:
                live.add(worker)
            elif not fresh:
                del self._members[worker]
        view = tuple(sorted(live))
        if view == self._view and self._owner:
            return
        self._view, self._view_at = view, now
        self._owner = assign_partitions(self.nats.partitions, view, self.nats.stream)
        if self._settled:  # (while starting: the settle line says it)
            log.info(
                "worker %s: balance: %d live workers (%s); assigned partitions %s",
                self.fleet.worker_id, len(view), ", ".join(view), self._mine(),
            )  # fmt: skip
        self._notify()

    def _mine(self) -> list[int]:
        """The partitions assigned to this worker."""
        return sorted(p for p, w in self._owner.items() if w == self.fleet.worker_id)

    def _answered(self, now: float) -> list[int]:
        """The partitions whose pulls of this worker were answered lately (a block or a status:
        the server serves its pull requests)."""
        recent = max(2 * self.nats.heartbeat_s, 2.5 * PULL_EXPIRES_NS / 1e9)
        return [part.index for part in self.partitions if now - part.answered_at <= recent]

    def _tends(self, worker: str, member: Member | None, p: int, answered: list[int]) -> bool:
        """``worker`` (``member``; ``None``: this one, whose ``answered`` partitions are given)
        pulls ``p`` with answers, as its pin holder or as its assigned worker."""
        if member is None:
            holds, served = self.partitions[p].pin is not None, p in answered
        else:
            holds, served = p in member.holds, p in member.answered
        return served and (holds or self._owner.get(p) == worker)

    def _tend(self) -> None:
        """Find the partitions no live worker has tended (pulled with answers, as its pin holder
        or assigned worker) for :attr:`_grace`: their assigned worker heartbeats but its pulls
        fail (permissions, a broken connection). Anyone may pull those (the server still pins
        one puller); they stop being anyone's once their new holder says it tends them."""
        now = time.monotonic()
        me = self.fleet.worker_id
        live = [(w, self._members.get(w)) for w in self._view if w != me]
        answered = self._answered(now)
        orphans = set()
        for part in self.partitions:
            p = part.index
            if self._tends(me, None, p, answered) or any(
                m is not None and self._tends(w, m, p, answered) for w, m in live
            ):
                part.tended_at = now
            elif self._owner.get(p) == me:
                continue  # (pulled here anyway)
            elif now - max(part.tended_at, self._deaf_at, self._settled_at) > self._grace:
                orphans.add(p)
        if orphans != self._orphans:
            new = sorted(orphans - self._orphans)
            if new:
                log.warning(
                    "worker %s: partitions %s not pulled by any live worker for %.1f s (their "
                    "assigned worker's pulls are not answered: check its NATS permissions and "
                    "connection); pulling them here too until a worker holds them",
                    me, new, self._grace,
                )  # fmt: skip
            self._orphans = orphans
            self._notify()
        # this worker's own pulls unanswered: say so (its partitions go to the others)
        stuck = [
            part.index
            for part in self.partitions
            if self._may_pull(part)
            and now - max(part.answered_at, self._deaf_at, self._settled_at) > self._grace
        ]
        if stuck and now - self._unanswered_logged >= 30.0:
            self._unanswered_logged = now
            log.warning(
                "worker %s: pulls of partitions %s unanswered for %.1f s: the server does not "
                "serve this worker's pull requests (check its NATS permissions for "
                "$JS.API.CONSUMER.MSG.NEXT and its connection); other workers take them over",
                me, stuck, self._grace,
            )  # fmt: skip

    async def _balance(self, tg: asyncio.TaskGroup) -> None:
        """Announce this worker every ``heartbeat_s`` (the first time with a hello the live
        workers answer at once), keep the live set, pull once the answers stop coming, find the
        untended partitions, and hand back (one at a time) a partition this worker holds that is
        assigned to another live worker whose pulls are answered."""
        nc = self._nc
        assert nc is not None
        me = self.fleet.worker_id
        hb = self.nats.heartbeat_s
        started = time.monotonic()
        quiet = min(SETTLE_QUIET_S, hb / 2)
        latest = started + 2.5 * hb  # (the answers of busy workers may keep coming: settle)
        next_beat, hello, reply = started, True, False
        while not self._stopping:
            now = time.monotonic()
            if not self._settled and now >= min(latest, max(started, self._heard_at) + quiet):
                self._settled = True  # (announced at once: the others may hand back now)
                self._settled_at = now
                self._update_view()
                log.info(
                    "worker %s: heard %d other live workers in %.2f s; balance: %d live workers "
                    "(%s); assigned partitions %s; pulling from now on",
                    me, len(self._view) - 1, now - started, len(self._view),
                    ", ".join(self._view), self._mine(),
                )  # fmt: skip
                self._notify()
                next_beat = now  # say we pull
            if now >= next_beat or reply:
                answered = self._answered(now) if self._settled else []
                beat: dict[str, Any] = {
                    "worker": me,
                    "holds": [part.index for part in self.partitions if part.pin is not None],
                    "pulling": self._settled,
                    "answered": answered,
                }
                if hello:
                    beat["hello"] = True
                if reply:
                    beat["reply"] = True
                with contextlib.suppress(nats.errors.Error):
                    await nc.publish(members_subject(self.nats.stream), json.dumps(beat).encode())
                hello = reply = False
                if now >= next_beat:
                    next_beat = now + hb
                    self._update_view()
                    if self._settled:
                        self._tend()
                        self._hand_back_one(tg)
                    self._report()
            wake = next_beat
            if not self._settled:
                wake = min(wake, latest, max(started, self._heard_at) + quiet)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wake - time.monotonic(), 0.0)):
                    await self._hello.wait()
            if time.monotonic() - wake > hb + 1.0:  # frozen (suspended, starved): deaf meanwhile
                self._deaf_at = time.monotonic()
            if self._hello.is_set():
                self._hello.clear()
                reply = True  # answer a starting worker's hello with a heartbeat, now

    def _hand_back_one(self, tg: asyncio.TaskGroup) -> None:
        """Hand back a partition this worker holds that is assigned to another live worker whose
        pulls of it are answered (it waits, pulling, for the pin): only under a live set stable
        for 2 heartbeats (a worker that stalls past the expiry and comes back, heard twice,
        moves nothing among the others), one at a time."""
        me = self.fleet.worker_id
        stable = time.monotonic() - self._view_at >= 2 * self.nats.heartbeat_s
        if not stable or (self._handing is not None and not self._handing.done()):
            return
        for part in self.partitions:
            owner = self._owner.get(part.index, me)
            target = self._members.get(owner)
            if part.pin is None or owner == me or target is None:
                continue
            ready = target.pulling if target.answered is None else part.index in target.answered
            if ready:
                self._handing = tg.create_task(
                    self._hand_back(part, owner),
                    name=f"gazeguard.runtime.jetstream.hand_back[{part.index}]",
                )
                return

    async def _hand_back(self, part: Partition, to: str) -> None:
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

    async def _request_unpin(self, part: Partition, wait_s: float = 2.0) -> bool:
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

    def _why_mine(self, part: Partition) -> str:
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
