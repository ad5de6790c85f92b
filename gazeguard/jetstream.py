"""Fleet raw-gaze ingest on NATS JetStream (issue 17): the engine decides ownership.

``ingest.source = "jetstream"`` (fleet mode; nats-py, the ``fleet`` extra), the fleet's one way
in for raw gaze from devices on other hosts (the MQTT claim protocol it replaced was retired in
step 2). Raw gaze is on this wire: trusted network, TLS, one credential per device (publish on
its own subjects, replies on its own inbox: :class:`JetStreamSender`) and per worker.

**Devices** (:class:`JetStreamSender`) publish gaze blocks in the GGR1 format
(:mod:`gazeguard.rawgaze`) on ``{prefix}.{device}.{session}`` with JetStream
acknowledgements; a ``Nats-Msg-Id`` per block lets the server drop a block sent twice (a publish
retried after a lost acknowledgement). Optional headers: ``Gazeguard-Unix-Offset`` (Unix time
minus the blocks' timestamps on the device's host, s) and ``Gazeguard-Now`` (the blocks' clock
when the block left, s: workers measure "ahead of the clock" from it, not from the two hosts'
Unix clocks).

**The stream** (``fleet.nats.stream``, file storage) captures ``{prefix}.*.*`` and keeps the
last ``fleet.nats.max_age_s`` seconds. Its ``subject_transform`` partitions the sessions:
``{prefix}.D.S`` is stored as ``{prefix}.part.{p}.D.S`` with ``p = partition(P, 1, 2)``, the
server's own deterministic hash of the device and session tokens. Why the server's mapping and not
per-partition filters computed by a hash here: every client (workers of any version, other
languages, ``nats`` CLI) then agrees on the partition of a session by construction, devices need
not know P, and the server (≥ 2.10; the installed one is tested) does it on the ingest path.
Changing P re-maps the *new* blocks of live sessions: change it between runs only.

**Partitions → workers.** Each partition ``p`` has a durable pull consumer ``part-{p}`` with a
priority group (``fleet.nats.group``) under ``priority_policy = "pinned_client"``: the server
pins one pulling worker per partition and, when that worker has not pulled for
``fleet.nats.pin_timeout_s`` (dead, or stalled), hands the pin to another puller (the next pull
of the old one is refused with status 423). A SIGKILLed worker's pin moved after that timeout on
the installed server (measured: 5.5 s between the dead worker's last charge and the new one's
first at the default 5 s), not at the disconnect: the timeout is the failover time, traded
against spurious moves when a worker stalls (harmless, if costly: a replay). nats-py (2.16) has
no API for priority groups, so the consumers are created with ``$JS.API.CONSUMER.CREATE`` and
pulled with ``$JS.API.CONSUMER.MSG.NEXT`` requests carrying ``group`` and, once pinned, the
``Nats-Pin-Id`` the server handed out as ``id`` (as ``bench/spike_jetstream_pinned.py``).

**Worker.** For each block of a partition it is pinned on, the worker opens the session
``{device}.{session}`` (a :class:`~gazeguard.pipeline.Pipeline` of its
:class:`~gazeguard.fleet.Fleet`), drops samples stamped ahead of the clock or not after the
session's newest one, feeds and releases, then acknowledges the block. The ledger stays the
arbiter: a chunk index is charged once.

**Takeover.** When a worker is newly pinned on a partition it first *replays* the partition's
retained blocks (an ephemeral, unacknowledged consumer over everything the stream still holds
for it, to the end at that moment), then pulls from the durable consumer; blocks the durable
consumer delivers that the replay already covered (stream sequence ≤ the replay's end) are
acknowledged unread. Each session re-opened by the replay continues the ledger's chunk numbering
and sets :attr:`Pipeline.resume_after` to the sample time of its last charged chunk (plus half a
step): the replayed gaze up to there only rebuilds the feature window, and the feature vectors
after it — including those of the incomplete chunk the dead worker never charged — are chunked
and charged. What is rebuilt: the feature window and the incomplete chunk, from the last
``max_age_s`` seconds of gaze (so ``max_age_s`` ≥ the feature window). What is not: gaze older
than ``max_age_s`` (a partition unowned longer than that loses it), the old grid's alignment
(the new feature steps start at the first replayed sample: at the cut, at most half a step of
vectors is skipped), cohort aggregates and private labels of replayed gaze (not re-fed), and
the step counters of the dead worker. A worker that was paused rather than dead and still holds
sessions of a partition whose pin moved closes them on its next (refused) pull; any chunk it
charged meanwhile is refused to the other by the ledger's one-charge-per-index rule.

**Servers that die.** Pins live in the memory of the consumer's leader: a restarted server, or
a new consumer leader after its server died, has forgotten them. The pinned worker's next pull is
refused (423); it lets the partition go (closes its sessions: their incomplete chunks are
dropped), is pinned again on a later pull and takes the partition over through a replay, as
above. A replay the server stops answering mid-way (a stall, a restart, an election) resumes
after its last block. Devices retry a publish until the stream acknowledges it, including while
a cluster elects a new stream leader. On a cluster, list every server in ``fleet.nats.servers``
and set ``fleet.nats.replicas = 3`` (stream and consumers).

A session silent for ``fleet.idle_timeout_s`` is closed; if its device resumes, the session is
opened again without a replay (its window starts empty). Time the worker itself was behind
(frozen, or with the partition's blocks still in its hands) is not silence (:meth:`_sweep`).

**Balance** (``fleet.nats.balance``, on by default). The server alone pins a partition on
whichever worker's pull request it serves first and never moves a pin while its worker keeps
pulling: with two workers started together, one was pinned on all 4 partitions in 2 of 3
trials, and a worker that joined later got nothing. So the workers spread the partitions
themselves, and the server still decides exclusivity (one pin per partition):

* *Membership.* Every worker publishes a heartbeat on core NATS subject
  ``gazeguard.workers.{stream}`` every ``fleet.nats.heartbeat_s`` (1 s): its id, the partitions
  it holds, and whether it pulls yet. Another worker counts once heard twice (a worker that
  flaps does not move partitions at its first beat) and is dropped after 3 heartbeats unheard,
  or at once when it says goodbye (a graceful stop). Nobody is dropped while this worker is cut
  off from NATS, and an outage (a server restart, a reconnect to another node) restarts the
  clocks: every worker was as deaf as this one. Core NATS rather than a KV bucket: nothing is
  stored, so nothing to repair after a restart or on a cluster (subscriptions follow routes).
* *Assignment.* Every worker computes the same map from the same live set
  (:func:`assign_partitions`): rendezvous (highest-random-weight) hashing with bounded loads,
  ``P // N`` or ``P // N + 1`` partitions each (plain rendezvous spreads 4 partitions 2–2 over 2
  workers 6 times in 16). It is stable while the set is; a join moves the newcomer's share
  plus, the loads being bounded, some partitions among the others: 1.2–1.5 times the share on
  average (500 random id sets: 4 partitions, 2 → 3 workers, 1.77 moves for a share of 1.32; 8
  partitions 3.48 for 2.91; 16 partitions, 4 → 5 workers, 4.82 for 3.24; seen in the tests: 1–3
  moves for a share of 1–2). Each move is a hand-back and a replay; a history-free map keeps
  every worker's view consistent, which a map minimising moves against the current pins would
  not.
* *Pulling.* A worker pulls only the partitions assigned to it and those it still holds a pin
  on, and none until it has heard the others (2.5 heartbeats after it starts: a worker starting
  next to others does not grab what they are assigned). A pull without the pin's id never takes
  a held pin (verified: it expires unserved), so an assigned worker waits, pulling, until the
  pin is free.
* *Hand-back.* A worker holding the pin of a partition assigned to another live worker that
  pulls already — one partition at a time, one per heartbeat, and only once the live set has
  not changed for 2 heartbeats (a worker stalled past the expiry that comes back within that
  moves nothing among the others) — stops pulling it, processes and
  acknowledges the blocks in its hands, lets its sessions go (:meth:`_unpin`: the incomplete
  chunks are the next owner's) and asks the server to unpin it
  (``$JS.API.CONSUMER.UNPIN.{stream}.part-{p}``, body ``{"group": …}``, nats-server ≥ 2.11;
  verified on 2.15.1: the pin is cleared, the old id's next pull is refused with 423, the
  waiting pull of the assigned worker is served the next block and pinned). If the server
  refuses or does not answer, the pin moves after ``pin_timeout_s`` without pulls instead. The
  assigned worker takes the partition over by the replay above. Measured (the join tests, 5
  runs each, a loaded 2-core machine): hand-back decision to unpin 0.02–0.48 s (an open pull
  runs out first: ≤ 0.5 s), unpin to the new owner's take-over done 0.46–1.08 s (the replay of
  300–390 retained blocks, 10–13 s of gaze of 2 sessions). ``bench/bench_fleet.py`` with 2
  workers, 8 partitions and 16 sessions: 4 partitions and 8 sessions per worker (before
  balancing: sessions per worker [0, 10]).
* *Failover.* A dead worker is dropped after 3 heartbeats; its partitions are then assigned to
  the survivors, whose pulls get the pins when ``pin_timeout_s`` expires (keep
  ``3 × heartbeat_s ≤ pin_timeout_s``: the failover time is unchanged). A worker stopped
  gracefully says goodbye and unpins its partitions: they move at once.

What it does not do: weigh partitions by their sessions (a partition is the unit; more
partitions than workers spread sessions better), or notice a worker that heartbeats but cannot
pull (its partitions wait for it); a worker with ``balance`` off (or of an older version)
pulls everything and is not counted: mixing them spreads nothing.

Tested (``tests/test_jetstream.py``, one ``nats-server``): one worker with several devices and
partitions; two workers on two partitions; two workers started together on four (2–2); a worker
joining one (2–2) and two (2–1–1) mid-stream; the pinned worker SIGKILLed mid-stream; a worker
frozen past the idle timeout, and one behind on its charges; gaze dated on the device's clock;
gaze ahead of the clock; cohort aggregates; ``gazeguard forward``; TLS with per-device
credentials that may not read other sessions' gaze. ``tests/test_jetstream_cluster.py``: the
server stopped (SIGTERM) and killed (SIGKILL) mid-stream and started again on its store; a
takeover replay stalled by the server (SIGSTOP); a 3-node cluster on loopback (R3) losing the
pinned worker, then the server leading the stream and the pinned partition's consumer, both
restarted: no sample lost, no chunk charged twice, no feature step lost. Failover there (and
``bench/fleet_cluster.py``; a loaded 2-core machine): a killed worker 5.3–7.6 s
(``pin_timeout_s`` plus the replay); a killed server that led the stream and the consumer
5.7–10.8 s until every session was charged gaze sent after the kill (the consumer's election,
~4 s, then its refused pin; the replay's consumer is created by the JetStream meta leader, so
when that server led the meta group too the replay also waits for that election; then the
replay; publishes waited 5.1–9.2 s). Not tested yet: throughput beyond a dozen sessions, a
worker started while the cluster has no JetStream leader (creating the stream fails: it exits).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import re
import ssl
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import nats
import nats.errors
import nats.js.errors
import numpy as np
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    StorageType,
    StreamConfig,
    SubjectTransform,
)

from gazeguard.errors import ConfigError, PublishError, StreamError
from gazeguard.rawgaze import decode_gaze, encode_gaze
from gazeguard.samples import GazeSamples, lsl_unix_offset

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

    from gazeguard.config import NatsSettings, Settings
    from gazeguard.fleet import Fleet, _Session

log = logging.getLogger(__name__)

#: Headers a device may set on a block (see the module docstring).
UNIX_OFFSET_HEADER = "Gazeguard-Unix-Offset"
NOW_HEADER = "Gazeguard-Now"
#: One subject token: a device or session id.
_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")
#: A pull request: at most this many blocks, expiring after this long (ns).
PULL_BATCH = 64
PULL_EXPIRES_NS = 500_000_000


def gaze_subject(prefix: str, device: str, session: str) -> str:
    """The subject a device publishes ``session``'s gaze on.

    Raises:
        StreamError: ``device`` or ``session`` is not one subject token (letters, digits,
            ``_``, ``-``).
    """
    for name, value in (("device", device), ("session", session)):
        if not _TOKEN.match(value):
            msg = f"{name} {value!r} is not one NATS subject token (letters, digits, _ and -)"
            raise StreamError(msg)
    return f"{prefix}.{device}.{session}"


def partition_subject(prefix: str, partition: int | str) -> str:
    """The stored subjects of one partition (``"*"``: of all), as consumers filter them."""
    return f"{prefix}.part.{partition}.>"


def stream_config(nats_settings: NatsSettings) -> StreamConfig:
    """The raw gaze stream: ``{prefix}.*.*`` kept ``max_age_s``, partitioned by the server."""
    prefix, p = nats_settings.subject_prefix, nats_settings.partitions
    return StreamConfig(
        name=nats_settings.stream,
        subjects=[f"{prefix}.*.*"],
        storage=StorageType.FILE,
        max_age=nats_settings.max_age_s,
        num_replicas=nats_settings.replicas,
        subject_transform=SubjectTransform(
            src=f"{prefix}.*.*",
            dest=f"{prefix}.part.{{{{partition({p},1,2)}}}}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}",
        ),
    )


def consumer_name(partition: int) -> str:
    """The durable consumer of ``partition``."""
    return f"part-{partition}"


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


def connect_options(nats_settings: NatsSettings, name: str) -> dict[str, Any]:
    """Keyword arguments of :func:`nats.connect` for ``fleet.nats`` (login, TLS, reconnects).

    Raises:
        ConfigError: a TLS file that cannot be loaded.
    """

    async def on_error(exc: Exception) -> None:
        # nats-py's default logs every error with its traceback at ERROR: a server outage wrote
        # one per reconnect attempt (two a second). One line each; failed attempts at DEBUG.
        attempt = isinstance(exc, ConnectionRefusedError | TimeoutError)
        level = logging.DEBUG if attempt else logging.WARNING
        log.log(level, "%s: NATS: %s", name, str(exc) or type(exc).__name__)

    async def on_reconnect() -> None:
        log.info("%s: reconnected to NATS", name)

    opts: dict[str, Any] = {
        "servers": list(nats_settings.servers),
        "name": name,
        "max_reconnect_attempts": -1,  # forever: an outage is waited out, blocks buffered
        "reconnect_time_wait": 0.5,
        "connect_timeout": 2,
        "error_cb": on_error,
        "reconnected_cb": on_reconnect,
    }
    if nats_settings.creds_file is not None:
        opts["user_credentials"] = str(nats_settings.creds_file)
    if nats_settings.user is not None:
        opts["user"] = nats_settings.user
        if nats_settings.password is not None:
            opts["password"] = nats_settings.password.get_secret_value()
    tls_wanted = nats_settings.tls_ca_file is not None or nats_settings.tls_cert_file is not None
    if tls_wanted or any(s.startswith("tls://") for s in nats_settings.servers):
        try:
            ctx = ssl.create_default_context(
                cafile=None if nats_settings.tls_ca_file is None else str(nats_settings.tls_ca_file)
            )
            if nats_settings.tls_cert_file is not None:
                ctx.load_cert_chain(
                    str(nats_settings.tls_cert_file),
                    None if nats_settings.tls_key_file is None else str(nats_settings.tls_key_file),
                )
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                "fleet.nats.tls_ca_file", None, f"cannot load TLS files: {exc}"
            ) from exc
        opts["tls"] = ctx
    return opts


async def ensure_stream(js: JetStreamContext, nats_settings: NatsSettings) -> None:
    """Create the raw gaze stream, or bring an existing one to this configuration."""
    config = stream_config(nats_settings)
    try:
        await js.add_stream(config)
    except nats.js.errors.BadRequestError:  # exists with another configuration
        await js.update_stream(config)


async def ensure_consumers(nc: Client, nats_settings: NatsSettings) -> None:
    """Create (or update) the durable pinned-client consumer of every partition.

    Raises:
        StreamError: the server refused one (e.g. older than 2.11: no priority groups).
    """
    for p in range(nats_settings.partitions):
        name = consumer_name(p)
        config = {
            "durable_name": name,
            "filter_subject": partition_subject(nats_settings.subject_prefix, p),
            "ack_policy": "explicit",
            "ack_wait": int(nats_settings.ack_wait_s * 1e9),
            "max_ack_pending": 1000,
            "deliver_policy": "all",
            "num_replicas": nats_settings.replicas,
            "priority_groups": [nats_settings.group],
            "priority_policy": "pinned_client",
            "priority_timeout": int(nats_settings.pin_timeout_s * 1e9),
        }
        reply = await nc.request(
            f"$JS.API.CONSUMER.CREATE.{nats_settings.stream}.{name}",
            json.dumps({"stream_name": nats_settings.stream, "config": config}).encode(),
            timeout=5,
        )
        answer = json.loads(reply.data)
        if "error" in answer:
            msg = f"JetStream refused consumer {name}: {answer['error']}"
            raise StreamError(msg)
        if answer.get("config", {}).get("priority_policy") != "pinned_client":
            msg = f"consumer {name}: the server ignores priority groups (needs nats-server ≥ 2.11)"
            raise StreamError(msg)


@dataclass
class _Member:
    """Another worker, as heard on :func:`members_subject` (balance)."""

    last: float  # monotonic time of its last heartbeat
    beats: int = 1  # heartbeats heard since it was last absent
    pulling: bool = False  # it pulls its assigned partitions (it has heard the others)


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
        self._members: dict[str, _Member] = {}
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
            try:
                async with asyncio.timeout(left):
                    msg = await answers.get()
            except TimeoutError:
                return
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
        """Process the queued blocks in order (a new pin: take over first), acknowledge each."""
        while not self._stopping:
            msg = await queue.get()
            if msg is None:
                self._unpin(part, "pin refused: another worker has it, or the server forgot ours")
                self._report()
                continue
            part.busy = True
            try:
                await self._handle(part, msg)
            finally:
                part.busy = False

    async def _handle(self, part: _Partition, msg: Msg) -> None:
        """One block of the durable consumer (a new pin: take over first); acknowledge it."""
        pin = (msg.headers or {}).get("Nats-Pin-Id")
        if pin and pin != part.served:
            if part.served is not None:
                self._unpin(part, "pinned again under a new id")
            part.served = pin
            await self._take_over(part)
        if msg.metadata.sequence.stream <= part.replayed_through:
            part.skipped += 1
        else:
            await self._on_block(part, msg)
            part.blocks += 1
        with contextlib.suppress(nats.errors.Error):
            await msg.respond(b"+ACK")

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
                member = self._members[worker] = _Member(now)
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
        offset = _header_float(msg, UNIX_OFFSET_HEADER)
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
        key, entry = self._session_of(part, msg)
        if entry is None:
            return  # refused: fleet.max_sessions reached (logged)
        entry.last_seen = time.monotonic()
        try:
            block = decode_gaze(msg.data)
        except StreamError as exc:
            entry.bad_blocks += 1
            log.warning("session %r: malformed gaze block dropped: %s", key, exc)
            return
        if len(block) and block.timestamps[-1] <= entry.last_t:
            self.duplicate_blocks += 1  # delivered again: every sample is held already
            return
        block = self._drop_future(entry, key, block, _header_float(msg, NOW_HEADER))
        t = block.timestamps
        keep = t > np.maximum.accumulate(np.concatenate(([entry.last_t], t[:-1])))
        if not keep.all():
            entry.dropped_samples += int((~keep).sum())
            block = _select(block, np.flatnonzero(keep))
        if len(block) == 0:
            return
        entry.last_t = float(block.timestamps[-1])
        entry.samples += len(block)
        await self.fleet._process(entry, block)

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


def _header_float(msg: Msg, name: str) -> float | None:
    """A finite float header, else ``None`` (absent or malformed: ignored)."""
    raw = (msg.headers or {}).get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


#: A JetStream publish that failed with one of these may succeed later: send it again.
#: ``NoStreamResponseError`` is nats-py's "no responders" on a JetStream publish (nobody serves
#: the stream's subjects right now), ``ServiceUnavailableError`` a 503 answer (no stream leader).
_PUBLISH_AGAIN = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    TimeoutError,
)


class JetStreamSender:
    """Device side of JetStream raw-gaze ingest: publish blocks with JetStream acknowledgements.

    ``async with JetStreamSender(nats_settings, "hmd-7", "s1") as sender:
    await sender.send(block)``. There is no claim: the server's partitioning and pinning decide
    which worker reads the session. nats-py reconnects (forever) and buffers what is published
    meanwhile; a publish whose acknowledgement does not come within ``ack_timeout_s``, or that
    nobody answers or JetStream refuses as unavailable for now (the stream has no leader: a
    cluster electing one after its leader's server died), is retried (same ``Nats-Msg-Id``: the
    stream keeps one copy) until it is acknowledged, unless the server refused it for this
    credential (a permissions violation): then :meth:`send` raises.

    Its replies (the stream's acknowledgements) come on ``_INBOX.{device}.…``, so a device's
    credential needs no more than: publish ``{prefix}.{device}.>``, subscribe
    ``_INBOX.{device}.>`` — not ``_INBOX.>``, through which it could read the gaze of every
    session delivered to the workers (README: Fleets, trust boundary).

    Args:
        nats_settings: servers, login, TLS, stream and subject prefix (``fleet.nats``).
        device, session: identity of the session (one subject token each).
        ack_timeout_s: wait this long for the stream's acknowledgement before retrying, s.
        unix_offset: returns Unix time minus the blocks' timestamps, s (sent as a header so a
            worker on another host dates the gaze correctly); ``None``: not sent.
        clock: returns the blocks' clock now, s (header; workers drop gaze stamped ahead of
            it); ``None``: not sent.

    Raises:
        StreamError: ``device`` or ``session`` is not one subject token.
    """

    def __init__(
        self,
        nats_settings: NatsSettings,
        device: str,
        session: str,
        *,
        ack_timeout_s: float = 2.0,
        unix_offset: Callable[[], float] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.subject = gaze_subject(nats_settings.subject_prefix, device, session)
        self.nats = nats_settings
        self.ack_timeout_s = ack_timeout_s
        self.unix_offset = unix_offset
        self.clock = clock
        self.reconnects = 0
        self.retries = 0  # publishes sent again after a missing acknowledgement
        self.inbox_prefix = f"_INBOX.{device}"
        self._name = f"gazeguard-device-{device}-{session}"
        self._refused: str | None = None  # the server's permissions violation for our subject
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None

    async def __aenter__(self) -> Self:
        opts = connect_options(self.nats, self._name)
        logged, log_error = opts["reconnected_cb"], opts["error_cb"]

        async def reconnected() -> None:
            self.reconnects += 1
            await logged()

        async def error(exc: Exception) -> None:
            text = str(exc)
            said = text.lower()  # nats-py lowers the server's message
            if "permissions violation" in said and f'"{self.subject.lower()}"' in said:
                self._refused = text
            await log_error(exc)

        try:
            self._nc = await nats.connect(
                **{**opts, "reconnected_cb": reconnected, "error_cb": error},
                inbox_prefix=self.inbox_prefix,
            )
        except (nats.errors.Error, OSError) as exc:
            msg = f"cannot reach NATS at {', '.join(self.nats.servers)}: {exc}"
            raise PublishError(msg) from exc
        self._js = self._nc.jetstream()
        return self

    async def send(self, block: GazeSamples) -> None:
        """Publish one block and wait for the stream to acknowledge it (retrying meanwhile).

        Raises:
            PublishError: the server refused publishing on this session's subject for this
                credential.
        """
        js = self._js
        assert js is not None, "use JetStreamSender as an async context manager"
        last = float(block.timestamps[-1]) if len(block) else -math.inf
        headers = {"Nats-Msg-Id": f"{self.subject}@{last!r}"}
        if self.unix_offset is not None:
            headers[UNIX_OFFSET_HEADER] = repr(self.unix_offset())
        if self.clock is not None:
            headers[NOW_HEADER] = repr(self.clock())
        payload = encode_gaze(block)
        attempt = 0
        while True:
            if self._refused is not None:
                msg = (
                    f"NATS refused this device's publish on {self.subject} ({self._refused}): "
                    f"its credential must allow publishing on {self.subject}"
                )
                raise PublishError(msg)
            try:
                await js.publish(self.subject, payload, timeout=self.ack_timeout_s, headers=headers)
                return
            except _PUBLISH_AGAIN as exc:
                attempt += 1
                self.retries += 1
                log.debug("%s: publish not acknowledged (%s); retrying", self.subject, exc)
                await asyncio.sleep(min(2.0, 0.05 * 2**attempt))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await nc.drain()
