"""Fleet raw-gaze ingest on NATS JetStream: devices publish, the engine decides which worker owns
a partition, the ledger decides what is charged.

``ingest.source = "jetstream"`` (fleet mode; nats-py, the ``fleet`` extra) is the fleet's way in
for raw gaze from devices on other hosts. Raw gaze is on this wire: trusted network, TLS, one
credential per device (publish on its own subjects, replies on its own inbox) and per worker
(``docs/fleet.md``).

**Devices** (:class:`JetStreamSender`) publish GGR1 blocks (:mod:`gazeguard.signal.rawgaze`) on
``{prefix}.{device}.{session}`` with JetStream acknowledgements, a ``Nats-Msg-Id`` per block (a
retried publish is stored once) and optional headers: ``Gazeguard-Unix-Offset`` (Unix time minus
the blocks' clock, s) and ``Gazeguard-Now`` (the blocks' clock when the block left, s).

**The stream** (``fleet.nats.stream``, file storage) keeps the last ``fleet.nats.max_age_s``
seconds. Its ``subject_transform`` stores ``{prefix}.D.S`` as ``{prefix}.part.{p}.D.S`` with the
server's own hash ``p = partition(P, 1, 2)``, so every client agrees on a session's partition and
devices need not know ``P`` (change ``P`` between runs only).

**Ownership.** Each partition has a durable pull consumer ``part-{p}`` in a priority group with
``pinned_client``: the server pins one pulling worker and moves the pin when it has not pulled
for ``fleet.nats.pin_timeout_s`` (the failover time). nats-py has no priority-group API, so the
consumers are created and pulled through ``$JS.API`` requests carrying the group and the pin id.
A pinned worker opens a :class:`~gazeguard.runtime.pipeline.Pipeline` per session of its
:class:`~gazeguard.runtime.fleet.Fleet`, feeds and releases each block, then acknowledges it.

**Takeover.** A worker newly pinned on a partition first replays what the stream retains for it
(an ephemeral, unacknowledged consumer, to the end at that moment), then pulls the durable
consumer and acknowledges unread what the replay covered. A re-opened session continues the
ledger's chunk numbering and skips gaze up to its last charged chunk
(:attr:`Pipeline.resume_after`): the replay rebuilds the feature window and the incomplete chunk
and charges nothing twice. Gaze older than ``max_age_s``, cohort aggregates and labels of
replayed gaze are not rebuilt. A worker whose pin moved (a pause, a restarted server) closes the
partition's sessions on its next refused pull; the ledger's one charge per index refuses any
chunk both would release.

**Silence.** A session silent for ``fleet.idle_timeout_s`` of the worker's time, or of stream
time when the worker is always behind, is closed; if its device resumes, it reopens and first
rebuilds its window from the stream's retained gaze of that session.

**Startup.** Until a server answers and JetStream can create the stream the worker retries with
backoff and says so; a configuration the server refuses (e.g. priority groups before 2.11) stops
it at once.

**Balance** (``fleet.nats.balance``, on by default). The server never spreads pins, so workers
heartbeat on core NATS (``gazeguard.workers.{stream}``, every ``fleet.nats.heartbeat_s``): id,
partitions held, whether pulling, partitions whose pulls the server answered. A worker counts
once heard twice and is dropped after 3 heartbeats unheard (or at its goodbye); nobody is dropped
while this worker cannot hear. Every worker computes the same assignment from the same live set
(:func:`assign_partitions`: rendezvous hashing with bounded loads, ``P // N`` or ``P // N + 1``
each; history-free, so all views agree). A worker pulls its assigned partitions and those it
still holds, starting once the others answered its hello; a partition nobody tends for
``pin_timeout_s`` plus 2 heartbeats may be pulled by any worker. A worker holding a partition
assigned to another live, answered worker hands it back (one per heartbeat, once the live set is
stable): it finishes its blocks, lets its sessions go and asks the server to unpin it
(``$JS.API.CONSUMER.UNPIN``); the assigned worker takes over by the replay above. Keep
``3 × heartbeat_s ≤ pin_timeout_s``. Partitions are not weighed by their sessions.

Modules: :mod:`~gazeguard.runtime.jetstream.wire` (subjects, the stream, the partition consumers,
connection options, headers), :mod:`~gazeguard.runtime.jetstream.balance` (the assignment),
:mod:`~gazeguard.runtime.jetstream.worker` (:class:`JetStreamIngest`),
:mod:`~gazeguard.runtime.jetstream.sender` (:class:`JetStreamSender`). Figures:
``docs/benchmarks.md``; tests: ``tests/runtime/test_jetstream*.py``.
"""

from gazeguard.runtime.jetstream.balance import assign_partitions, members_subject
from gazeguard.runtime.jetstream.sender import JetStreamSender
from gazeguard.runtime.jetstream.wire import (
    NOW_HEADER,
    RATE_HEADER,
    UNIX_OFFSET_HEADER,
    cancel_connect,
    connect_options,
    consumer_name,
    ensure_consumers,
    ensure_stream,
    gaze_subject,
    partition_subject,
    stream_config,
)
from gazeguard.runtime.jetstream.worker import JetStreamIngest

__all__ = [
    "NOW_HEADER",
    "RATE_HEADER",
    "UNIX_OFFSET_HEADER",
    "JetStreamIngest",
    "JetStreamSender",
    "assign_partitions",
    "cancel_connect",
    "connect_options",
    "consumer_name",
    "ensure_consumers",
    "ensure_stream",
    "gaze_subject",
    "members_subject",
    "partition_subject",
    "stream_config",
]
