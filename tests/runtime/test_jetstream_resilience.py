"""Fleet workers on NATS JetStream when things go wrong around them, against real parts: real
``nats-server`` processes (restartable, with real authorization), worker processes (or a worker
in-process where a component is slowed), a real Mosquitto, one SQLite ledger.

* a worker that heartbeats but whose pulls the server refuses: the others take its partitions;
* a worker started before any server (then before a JetStream meta leader): it waits, then
  serves;
* a session silent past the idle timeout that resumes: its feature window is rebuilt;
* a worker always behind (sustained overload): a dead session is still closed, in stream time;
* the server gone for longer than 3 heartbeats: no partition moves because of the outage;
* a worker joining live workers pulls as soon as they have answered its hello.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest

from gazeguard.config import NatsSettings
from gazeguard.ledger import Ledger
from gazeguard.runtime.fleet import Fleet
from gazeguard.runtime.jetstream import JetStreamSender
from gazeguard.runtime.pipeline import Chunk, Pipeline, ReleasedChunk
from gazeguard.runtime.service import serve_fleet
from gazeguard.runtime.simulate import simulate_gaze
from tests._nats_cluster import (
    Devices,
    NatsNode,
    WorkerProc,
    admin,
    audit,
    balance_report,
    balanced,
    charges,
    closed_counts,
    cluster,
    drained,
    expected_chunks,
    first_charges_after,
    fleet_settings,
    free_ports,
    partitions_of,
    poll,
    single_node,
    stop_all,
    worker_env,
)
from tests.conftest import MosquittoBroker

#: Fast balance: heartbeats every 0.5 s (a worker is dropped after 1.5 s unheard: a loaded
#: 2-core machine delays heartbeats by more than 3 × 0.3 s at times), a pin moves after 2 s
#: without pulls (3 × hb ≤ it); an untended partition is anyone's after 2 + 2 × 0.5 = 3 s.
FAST_BALANCE = {"GAZEGUARD_FLEET__NATS__HEARTBEAT_S": "0.5",
                "GAZEGUARD_FLEET__NATS__PIN_TIMEOUT_S": "2"}  # fmt: skip


def broker_of(mosquitto: MosquittoBroker) -> str:
    return f"{mosquitto.host}:{mosquitto.port}"


def joined(workers: Sequence[WorkerProc]) -> str:
    return "\n=====\n".join(w.text() for w in workers)


def run_then_stop(
    run: Callable[[], Coroutine[Any, Any, None]],
    workers: Sequence[WorkerProc],
    nodes: Sequence[NatsNode],
) -> list[int]:
    """``asyncio.run(run())``, then, whatever happened, stop ``workers`` (read when it ended: a
    list ``run`` appended to counts) and SIGTERM ``nodes``; the workers' exit codes."""
    try:
        asyncio.run(run())
    finally:
        codes = stop_all(workers)
        for node in nodes:
            node.kill(signal.SIGTERM)
    return codes


def assert_clean(report: dict[str, object]) -> None:
    """No sample lost, every chunk charged once, consecutive chunks one step apart."""
    assert report["samples_lost"] == 0, report
    assert report["chunks_charged_twice"] == 0, report
    assert report["double_charges_refused"] == 0, report
    assert report["wrong_chunk_indices"] == {}, report
    assert report["window_gaps"] == [], report


# ------------------------------------------------------------------ a worker that cannot pull
@pytest.mark.slow
@pytest.mark.network
def test_a_worker_that_heartbeats_but_cannot_pull_loses_its_partitions_to_the_others(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """Worker 1's NATS user may heartbeat but not pull (``$JS.API.CONSUMER.MSG.NEXT`` denied
    by the server's authorization). Balance still assigns it half of the partitions; worker 0
    must find them untended (nobody's pulls answered for pin_timeout + 2 heartbeats) and pull
    them too, and must not hand anything back to worker 1: every session is read, no sample
    lost, every chunk charged once."""
    port, http_port = free_ports(2)
    node = NatsNode(tmp_path, "n0", (port, http_port))
    worker_perms = (
        'publish: ["$JS.API.>", "$JS.ACK.>", "gazeguard.workers.>"], '
        'subscribe: ["_INBOX.>", "gazeguard.workers.>"]'
    )
    deaf_perms = (
        'publish: { allow: ["$JS.API.>", "$JS.ACK.>", "gazeguard.workers.>"], '
        'deny: ["$JS.API.CONSUMER.MSG.NEXT.>"] }, subscribe: ["_INBOX.>", "gazeguard.workers.>"]'
    )
    node.conf.write_text(
        node.conf.read_text()
        + "authorization {\n  users = [\n"
        + f'    {{ user: "w0", password: "pw0", permissions: {{ {worker_perms} }} }}\n'
        + f'    {{ user: "w1", password: "pw1", permissions: {{ {deaf_perms} }} }}\n'
        + '    { user: "devices" }\n  ]\n}\nno_auth_user: devices\n'
    )
    node.start()
    urls = [node.url]
    gaze_s = 10.0
    devices = Devices(urls, 8, gaze_s=gaze_s, phases=1)
    workers: list[WorkerProc] = []
    ledger_path = tmp_path / "ledger.sqlite"
    for n in range(2):
        env = {**worker_env(urls, 4, 1), **FAST_BALANCE}
        env.update(GAZEGUARD_FLEET__NATS__USER=f"w{n}", GAZEGUARD_FLEET__NATS__PASSWORD=f"pw{n}")
        workers.append(WorkerProc(tmp_path, n, broker_of(mosquitto), env))
    good, deaf = workers

    async def run() -> float:
        await poll(lambda: balanced([w.text() for w in workers], 4), 30, "both workers settled")
        report = balance_report(deaf.text())
        assert report is not None
        assert len(report[1]) == 2, "balance assigns the deaf worker its share"
        started = time.time()
        await devices.run()
        async with admin(urls) as nc:
            where = await partitions_of(nc)
            assert set(where.values()) == {0, 1, 2, 3}, where  # (the server's fixed hash)
            theirs = [s for s, p in where.items() if p in report[1]]
            await poll(lambda: drained(nc, 4), 30, "every block read (by worker 0)")
        firsts = first_charges_after(ledger_path, theirs, 0.0)
        # the deaf worker says why once its pulls have gone unanswered for the grace period,
        # which can outlast a fast run: wait for it rather than stop the workers first
        unanswered = lambda: "pulls of partitions" in deaf.text()  # noqa: E731
        await poll(unanswered, 30, "the deaf worker logs its unanswered pulls")
        running.extend(w.text() for w in workers)  # (before the stop: see `alone` below)
        return max(firsts.values()) - started

    running: list[str] = []
    try:
        took = asyncio.run(run())
    except BaseException as exc:
        stop_all(workers)
        node.kill(signal.SIGTERM)
        raise AssertionError(joined(workers)) from exc
    codes = stop_all(workers)
    node.kill(signal.SIGTERM)
    logs = [w.text() for w in workers]
    assert codes == [0, 0], joined(workers)
    # (unless worker 0 counted itself alone a while, pulled everything and holds on to it: a
    # start-up skew or a heartbeat delayed by load; then no partition was left untended. Its
    # log up to the stop only: once the deaf worker stops, worker 0 is alone anyway.)
    alone = "balance: 1 live workers" in running[0]
    assert alone or "not pulled by any live worker" in logs[0], logs[0]
    assert "pulls of partitions" in logs[1], logs[1]  # the deaf worker says why
    assert "pinned on partition" not in logs[1], logs[1]
    assert "handed to worker" not in logs[0], "nothing handed back to a worker whose pulls fail"
    assert good.pinned() == {0, 1, 2, 3}, logs[0]
    report = audit(ledger_path, logs, devices.samples(), gaze_s)
    assert_clean(report)
    print(f"the deaf worker's sessions first charged {took:.2f} s after the devices started")


# ------------------------------------------------------------------ started before the server
@pytest.mark.slow
@pytest.mark.network
def test_a_worker_started_before_the_servers_waits_for_jetstream_then_serves(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """A worker started before any of the three servers of its cluster runs: it keeps trying
    (saying so), then, with one server of three up (no JetStream meta leader: the stream cannot
    be created), keeps retrying (saying so); once a majority runs it sets the stream up and
    serves a session normally."""
    nodes = cluster(tmp_path, 3, start=False)
    urls = [n.url for n in nodes]
    env = worker_env(urls, 2, 3)
    worker = WorkerProc(tmp_path, 0, broker_of(mosquitto), env)
    gaze_s = 8.0
    devices = Devices(urls, 1, gaze_s=gaze_s, phases=1)
    ledger_path = tmp_path / "ledger.sqlite"

    def alive() -> None:
        assert worker.proc.poll() is None, f"the worker exited:\n{worker.text()}"

    async def run() -> None:
        await poll(lambda: alive() or "no NATS server reachable" in worker.text(), 30, "says")
        nodes[0].start()
        await poll(lambda: alive() or "JetStream not ready" in worker.text(), 30, "not ready")
        assert not worker.ready()
        nodes[1].start()
        nodes[2].start()
        await poll(lambda: alive() or worker.ready(), 60, "the worker set the stream up")
        await devices.run()
        async with admin(urls) as nc:
            await poll(lambda: drained(nc, 2), 30, "every block read")

    codes = run_then_stop(run, [worker], nodes)
    text = worker.text()
    assert codes == [0], text
    assert_clean(audit(ledger_path, [text], devices.samples(), gaze_s))
    assert len(charges(ledger_path, devices.devices[0].key)) == expected_chunks(
        gaze_s, devices.devices[0].key
    ), text


# ------------------------------------------------------------------ a session that resumes
@pytest.mark.slow
@pytest.mark.network
def test_a_session_idle_closed_then_resuming_keeps_its_feature_window(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """A device goes silent longer than ``fleet.idle_timeout_s`` (its session is closed, its
    incomplete chunk dropped), then sends the rest of its gaze: the reopened session rebuilds
    its window from the stream's retained gaze of that session, so chunks continue one step
    apart (no window-long gap) and none is charged twice."""
    node = single_node(tmp_path)
    urls = [node.url]
    env = {**worker_env(urls, 2, 1), "GAZEGUARD_FLEET__IDLE_TIMEOUT_S": "1"}
    worker = WorkerProc(tmp_path, 0, broker_of(mosquitto), env)
    gaze_s = 12.0
    devices = Devices(urls, 1, gaze_s=gaze_s, phases=2, pace_s=0.002)
    key = devices.devices[0].key
    ledger_path = tmp_path / "ledger.sqlite"

    async def run() -> None:
        await poll(worker.ready, 30, "worker ready")
        sending = asyncio.create_task(devices.run())
        await poll(lambda: f"session {key!r} closed" in worker.text(), 30, "idle", sending)
        devices.go[1].set()
        await sending
        async with admin(urls) as nc:
            await poll(lambda: drained(nc, 2), 30, "every block read")
        await poll(lambda: len(closed_counts(worker.text())[key]) == 2, 30, "idle again")

    codes = run_then_stop(run, [worker], [node])
    text = worker.text()
    assert codes == [0], text
    assert_clean(audit(ledger_path, [text], devices.samples(), gaze_s))
    assert re.search(rf"session {key!r} opened mid-stream: rebuilt its window from \d+ ", text)


# ------------------------------------------------------------------ sustained overload
@pytest.mark.slow
@pytest.mark.network
def test_a_worker_always_behind_still_closes_a_dead_session_in_stream_time(
    tmp_path: Path,
    mosquitto: MosquittoBroker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One partition, two sessions; every charge lasts until device "busy" has sent 2 s more of
    gaze (a disk slower than the devices: 1.6 s of gaze per chunk), so the worker's queue is
    never empty. Session "quiet" stops after 6 s of gaze, "busy" keeps sending: "quiet" must be
    closed while "busy" still sends — once the worker has processed "busy"'s blocks received
    more than the idle timeout after "quiet"'s last — with every sample read and each chunk
    charged once; "busy" is not closed early."""
    node = single_node(tmp_path)
    ledger_path = tmp_path / "ledger.sqlite"
    settings = fleet_settings(node.url, 1, ledger_path, (mosquitto.host, mosquitto.port))
    # The charges in worker threads (the setting for such a disk): on the event loop, a charge
    # that waits for the devices (run on the same loop here) would never end.
    settings = settings.model_copy(
        update={"fleet": settings.fleet.model_copy(update={"ledger_calls": "thread"})}
    )
    release = Pipeline.release
    slow = threading.Event()
    slow.set()

    def slow_release(self: Pipeline, chunk: Chunk) -> ReleasedChunk | None:
        target = blocks["busy"] + 20  # (in the worker's thread: the disk, syncing)
        while slow.is_set() and blocks["busy"] < target:
            time.sleep(0.01)
        return release(self, chunk)

    monkeypatch.setattr(Pipeline, "release", slow_release)
    gaze = {"quiet": simulate_gaze(6.0, 120.0, seed=5), "busy": simulate_gaze(40.0, 120.0, seed=6)}
    sent = {"quiet": 0, "busy": 0}
    blocks = {"quiet": 0, "busy": 0}
    fleets: list[Fleet] = []

    def closed(session: str) -> bool:
        return bool(fleets) and f"hmd.{session}" in fleets[0].closed

    async def device(session: str) -> None:
        g = gaze[session]
        nats_settings = NatsSettings(servers=[node.url])
        async with JetStreamSender(nats_settings, "hmd", session, rate_hz=120.0) as sender:
            for start in range(0, len(g), 12):
                if session == "busy" and closed("quiet"):
                    return
                await sender.send(g.slice(start, start + 12))
                sent[session] += len(g.slice(start, start + 12))
                blocks[session] += 1
                await asyncio.sleep(0.02)
        assert session == "quiet", '"busy" sent all its gaze: "quiet" was never closed'

    async def main() -> None:
        stop = asyncio.Event()
        worker = asyncio.create_task(serve_fleet(settings, stop=stop, ready=fleets.append))
        try:
            await poll(lambda: "partitions of JetStream stream" in caplog.text, 30, "ready")
            await asyncio.gather(device("quiet"), device("busy"))
            assert not closed("busy"), caplog.text
            slow.clear()  # the disk recovers: the backlog drains, then "busy" goes silent
            await poll(lambda: closed("busy"), 60, '"busy" closed once silent')
        finally:
            slow.clear()
            stop.set()
            await worker

    try:
        with caplog.at_level(logging.INFO):
            asyncio.run(main())
    finally:
        node.kill(signal.SIGTERM)
    counts = closed_counts(caplog.text)
    assert counts["hmd.quiet"] == [(sent["quiet"], 0)], caplog.text
    assert counts["hmd.busy"] == [(sent["busy"], 0)], caplog.text
    with Ledger(ledger_path, create=False) as ledger:
        for session in ("quiet", "busy"):
            indices = [c.chunk_index for c in ledger.charges(f"hmd.{session}")]
            assert indices == list(range(len(indices))), (session, indices)
        assert len(ledger.charges("hmd.quiet")) == expected_chunks(6.0, "hmd.quiet")


# ------------------------------------------------------------------ an outage
@pytest.mark.slow
@pytest.mark.network
def test_a_server_outage_longer_than_three_heartbeats_moves_no_partition(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """Two workers hold two partitions each; the server is stopped for 7 heartbeats and
    started again (same store). Neither worker could hear the other meanwhile, which is not
    the other's silence: nobody is dropped from the live set, the assignment stays, and each
    worker takes its own partitions over again (the restarted server forgot the pins). Nothing
    is lost or charged twice."""
    node = single_node(tmp_path)
    urls = [node.url]
    env = {**worker_env(urls, 4, 1), **FAST_BALANCE}
    workers = [WorkerProc(tmp_path, n, broker_of(mosquitto), env) for n in range(2)]
    texts = lambda: [w.text() for w in workers]  # noqa: E731
    gaze_s = 16.0
    devices = Devices(urls, 8, gaze_s=gaze_s, phases=2)
    ledger_path = tmp_path / "ledger.sqlite"
    marks: list[int] = []
    ends: list[int] = []  # the logs' lengths before the workers are stopped

    async def run() -> None:
        await poll(lambda: balanced(texts(), 4), 30, "both workers settled")
        sending = asyncio.create_task(devices.run())
        await poll(lambda: devices.done(0), 60, "phase 1 sent", sending)
        async with admin(urls) as nc:
            await poll(lambda: drained(nc, 4), 30, "phase 1 read", sending)
        await poll(lambda: balanced(texts(), 4, held=True), 20, "each holds its share", sending)
        marks.extend(len(t) for t in texts())
        node.kill(signal.SIGTERM)
        await asyncio.sleep(3.5)  # the outage itself: 7 heartbeats of 0.5 s
        node.start()
        await poll(lambda: all("reconnected to NATS" in t for t in texts()), 30, "reconnected")
        devices.go[1].set()
        await sending
        async with admin(urls) as nc:
            await poll(lambda: drained(nc, 4), 30, "phase 2 read")
        await poll(lambda: balanced(texts(), 4, held=True), 20, "each holds its share again")
        ends.extend(len(t) for t in texts())

    codes = run_then_stop(run, workers, [node])
    logs = texts()
    assert codes == [0, 0], joined(workers)
    before = [balance_report(t[:m]) for t, m in zip(logs, marks, strict=True)]
    # (up to the stop: the first worker to stop says goodbye, and the other is then alone)
    after = [balance_report(t[:e]) for t, e in zip(logs, ends, strict=True)]
    assert before == after, (before, after)
    for t, m, e in zip(logs, marks, ends, strict=True):
        since = t[m:e]
        assert "balance: 1 live workers" not in since, since
        assert "handed to worker" not in since, since
    assert_clean(audit(ledger_path, logs, devices.samples(), gaze_s))


# ------------------------------------------------------------------ joining without waiting
@pytest.mark.slow
@pytest.mark.network
def test_a_joining_worker_pulls_once_the_live_workers_have_answered_its_hello(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """Two workers hold four partitions, their devices sending; a third joins. The live workers
    answer its hello at once, so it pulls well within a heartbeat (1 s here; it waited 2.5
    before) with the right live set (3 workers) from its first assignment, and gets its
    partitions only by hand-back: it grabs none another worker holds. Nothing is lost or
    charged twice."""
    node = single_node(tmp_path)
    urls = [node.url]
    env = worker_env(urls, 4, 1)  # heartbeat 1 s: the default
    workers = [WorkerProc(tmp_path, n, broker_of(mosquitto), env) for n in range(2)]
    texts = lambda: [w.text() for w in workers]  # noqa: E731
    gaze_s = 14.0
    devices = Devices(urls, 8, gaze_s=gaze_s, phases=2)
    ledger_path = tmp_path / "ledger.sqlite"

    async def run() -> None:
        await poll(lambda: balanced(texts(), 4), 30, "two workers settled")
        sending = asyncio.create_task(devices.run())
        await poll(lambda: devices.done(0), 60, "phase 1 sent", sending)
        await poll(lambda: balanced(texts(), 4, held=True), 20, "each holds its share", sending)
        workers.append(WorkerProc(tmp_path, 2, broker_of(mosquitto), env))
        await poll(lambda: "heard" in workers[2].text(), 30, "the third settled", sending)
        await poll(lambda: balanced(texts(), 4), 30, "hand-backs done", sending)
        devices.go[1].set()
        await sending
        async with admin(urls) as nc:
            await poll(lambda: drained(nc, 4), 30, "every block read")
        await poll(lambda: balanced(texts(), 4, held=True), 30, "three workers balanced")

    codes = run_then_stop(run, workers, [node])
    logs = texts()
    assert codes == [0, 0, 0], joined(workers)
    settled = re.search(r"heard (\d+) other live workers in ([\d.]+) s", logs[2])
    assert settled is not None, logs[2]
    assert int(settled[1]) == 2, logs[2]
    # by the answers, not the fallback of 2.5 heartbeats (2.5 s here; typically 0.3 s)
    assert float(settled[2]) < 2.5, logs[2]
    pinned = workers[2].pinned()
    assert pinned, logs[2]
    handed = {
        int(p) for p, _ in re.findall(r"partition (\d+) handed to worker (\S+) ", logs[0] + logs[1])
    }
    assert pinned <= handed, (pinned, handed, joined(workers))
    assert_clean(audit(ledger_path, logs, devices.samples(), gaze_s))
    print(f"the joining worker pulled {settled[2]} s after it started balancing")
