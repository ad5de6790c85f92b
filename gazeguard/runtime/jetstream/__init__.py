"""Fleet raw-gaze ingest on NATS JetStream (issue 17): the engine decides ownership.

``ingest.source = "jetstream"`` (fleet mode; nats-py, the ``fleet`` extra), the fleet's one way
in for raw gaze from devices on other hosts (the MQTT claim protocol it replaced was retired in
step 2). Raw gaze is on this wire: trusted network, TLS, one credential per device (publish on
its own subjects, replies on its own inbox: :class:`JetStreamSender`) and per worker.

**Devices** (:class:`JetStreamSender`) publish gaze blocks in the GGR1 format
(:mod:`gazeguard.signal.rawgaze`) on ``{prefix}.{device}.{session}`` with JetStream
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
``Nats-Pin-Id`` the server handed out as ``id``.

**Worker.** For each block of a partition it is pinned on, the worker opens the session
``{device}.{session}`` (a :class:`~gazeguard.runtime.pipeline.Pipeline` of its
:class:`~gazeguard.runtime.fleet.Fleet`), drops samples stamped ahead of the clock or not after the
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

A session silent for ``fleet.idle_timeout_s`` is closed. Time the worker itself was behind
(frozen, or with the partition's blocks still in its hands) is not silence; but a worker that is
always behind (sustained overload: its queue never empties) also judges silence in *stream
time*: a session is idle once the partition's blocks it has processed were received by the
server more than the timeout after the session's newest block (:meth:`_sweep`). If its device
resumes, the session is opened again and, like any session opened mid-stream with chunks charged
already, first *rebuilds* its feature window from the stream's retained gaze of that session (an
ephemeral unacknowledged consumer filtered on its subject, up to the block that reopened it;
the ledger's cut keeps charged gaze from being charged again): chunks continue one feature step
apart, none charged twice.

**Startup.** A worker started before any server answers, or while JetStream cannot create the
stream (still starting; a cluster without a JetStream meta leader: a majority of its servers
down), keeps trying with backoff and says so periodically (``no NATS server reachable``,
``JetStream not ready``) until it is stopped; then it serves normally. A configuration the server
refuses (e.g. priority groups on a server older than 2.11) still stops it at once.

**Balance** (``fleet.nats.balance``, on by default). The server alone pins a partition on
whichever worker's pull request it serves first and never moves a pin while its worker keeps
pulling: with two workers started together, one was pinned on all 4 partitions in 2 of 3
trials, and a worker that joined later got nothing. So the workers spread the partitions
themselves, and the server still decides exclusivity (one pin per partition):

* *Membership.* Every worker publishes a heartbeat on core NATS subject
  ``gazeguard.workers.{stream}`` every ``fleet.nats.heartbeat_s`` (1 s): its id, the partitions
  it holds, whether it pulls yet, and the partitions whose pull requests the server *answered*
  lately (a block or a status: evidence that it can pull, not only talk). Another worker counts
  once heard twice (a worker that flaps does not move partitions at its first beat) and is
  dropped after 3 heartbeats unheard, or at once when it says goodbye (a graceful stop). Nobody
  is dropped while this worker is cut off from NATS (or frozen): a worker's silence is counted
  from the later of its last heartbeat and the last moment this one could not hear (an outage,
  a server restart, a reconnect to another node: every worker was as deaf as this one). Core
  NATS rather than a KV bucket: nothing is stored, so nothing to repair after a restart or on a
  cluster (subscriptions follow routes).
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
  on, and none until it has heard the others: its first heartbeat is a *hello*, which the live
  workers answer at once with a heartbeat (counted at once; so is the hello of a worker starting
  at the same time), and it starts pulling when no answer has come for ``SETTLE_QUIET_S`` (0.3 s,
  at most half a heartbeat), 2.5 heartbeats at the latest (it waited 2.5 heartbeats always
  before: 2.5 s at the default; ``bench/bench_join.py``, a worker joining two, 5 joins each:
  2.50 s before, 0.30–0.31 s now). A worker starting next to others
  thus does not grab what they are assigned. A pull without the pin's id never takes a held
  pin (verified: it expires unserved), so an assigned worker waits, pulling, until the pin is
  free.
* *Untended partitions.* A partition that no live worker has *tended* — pulled with answers as
  its pin holder or its assigned worker — for ``pin_timeout_s`` plus 2 heartbeats (since this
  worker started pulling, or last could not hear) may be pulled by any worker: its assigned
  worker heartbeats but its pulls fail (permissions, a broken connection), and would starve it.
  The server still pins one puller; the others stop pulling it once that one's heartbeat says
  it tends it. The worker whose pulls are unanswered says so (``pulls of partitions … unanswered``).
* *Hand-back.* A worker holding the pin of a partition assigned to another live worker whose
  pulls of that partition are answered (it is waiting, pulling, for the pin) — one partition at
  a time, one per heartbeat, and only once the live set has
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
partitions than workers spread sessions better); a worker with ``balance`` off (or of a version
before balance) pulls everything and is not counted: mixing them spreads nothing. A worker of a
version before the answered-pull evidence is trusted on what it says it holds and pulls, and
does not answer hellos (a worker starting next to it alone may pull before hearing it: a
partition it then takes moves back by hand-back).

Tested (``tests/test_jetstream.py``, one ``nats-server``): one worker with several devices and
partitions; two workers on two partitions; two workers started together on four (2–2); a worker
joining one (2–2) and two (2–1–1) mid-stream; the pinned worker SIGKILLed mid-stream; a worker
frozen past the idle timeout, and one behind on its charges; gaze dated on the device's clock;
gaze ahead of the clock; cohort aggregates; ``gazeguard forward``; TLS with per-device
credentials that may not read other sessions' gaze. ``tests/test_jetstream_resilience.py``: a
worker that heartbeats but may not pull (its partitions taken by the other ``pin_timeout_s`` +
2 heartbeats after it starts pulling); a worker started before its three servers, then with one
of three (no meta leader); an idle-closed session resuming with its window; a worker always
behind closing a dead session in stream time; the server down for 7 heartbeats (no partition
moved);
a worker joining two live ones pulling 0.3 s after it starts balancing (each test run 5 times
or more on a loaded 2-core machine; the outage test found heartbeats flushed at a reconnect
resetting their worker as new, since fixed). ``tests/test_jetstream_cluster.py``: the
server stopped (SIGTERM) and killed (SIGKILL) mid-stream and started again on its store; a
takeover replay stalled by the server (SIGSTOP); a 3-node cluster on loopback (R3) losing the
pinned worker, then the server leading the stream and the pinned partition's consumer, both
restarted: no sample lost, no chunk charged twice, no feature step lost. Failover there (and
``bench/fleet_cluster.py``; a loaded 2-core machine): a killed worker 5.3–7.6 s
(``pin_timeout_s`` plus the replay); a killed server that led the stream and the consumer
5.7–10.8 s until every session was charged gaze sent after the kill (the consumer's election,
~4 s, then its refused pin; the replay's consumer is created by the JetStream meta leader, so
when that server led the meta group too the replay also waits for that election; then the
replay; publishes waited 5.1–9.2 s). Not tested yet: throughput beyond a dozen sessions.

Modules: :mod:`~gazeguard.runtime.jetstream.wire` (subjects, the stream, the partition consumers,
connection options, headers), :mod:`~gazeguard.runtime.jetstream.balance` (which live worker each
partition is assigned to), :mod:`~gazeguard.runtime.jetstream.worker` (:class:`JetStreamIngest`),
:mod:`~gazeguard.runtime.jetstream.sender` (:class:`JetStreamSender`).
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
