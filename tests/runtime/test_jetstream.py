"""Fleet raw-gaze ingest on NATS JetStream against real parts: a real ``nats-server -js`` on a
free loopback port, worker processes (``gazeguard run --fleet --source jetstream``), a real
Mosquitto for the privatized output, one SQLite ledger shared by the workers."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import paho.mqtt.client as mqtt
import pylsl
import pytest
from nats.aio.msg import Msg

from gazeguard.config import NatsSettings, Settings
from gazeguard.core.errors import PublishError, StreamError
from gazeguard.core.samples import GazeSamples
from gazeguard.ledger import Ledger
from gazeguard.runtime.fleet import Fleet
from gazeguard.runtime.jetstream import (
    JetStreamSender,
    assign_partitions,
    cancel_connect,
    connect_options,
    consumer_name,
    gaze_subject,
    stream_config,
)
from gazeguard.runtime.pipeline import Chunk, Pipeline, ReleasedChunk
from gazeguard.runtime.preflight import validate_settings
from gazeguard.runtime.service import serve_fleet
from gazeguard.runtime.simulate import SimulatedHeadset, simulate_gaze
from gazeguard.signal.events import LOOKBEHIND_S
from gazeguard.wire.message import ChunkMessage
from tests._nats_cluster import (
    NatsNode,
    WorkerProc,
    balance_report,
    balanced,
    closed_counts,
    expected_chunks,
    fleet_settings,
    single_node,
    stop_all,
    worker_env,
)
from tests._nats_cluster import drained as acknowledged
from tests.conftest import MosquittoBroker, Subscriber, until

REPO = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], bool], within_s: float, what: Callable[[], str]) -> None:
    """Poll ``predicate`` every 50 ms; fail with ``what()`` after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within_s:g} s\n{what()}")
        time.sleep(0.05)


def kill_the_one(
    workers: list[WorkerProc], chosen: Callable[[WorkerProc], bool], what: Callable[[], str]
) -> int:
    """SIGKILL the one worker ``chosen`` picks (failing with ``what()`` unless exactly one is) and
    reap it; returns its index in ``workers``."""
    picked = [w for w in workers if chosen(w)]
    assert len(picked) == 1, what()
    picked[0].proc.send_signal(signal.SIGKILL)
    picked[0].proc.wait()
    return workers.index(picked[0])


async def is_drained(server: NatsNode, partitions: int, login: NatsSettings | None = None) -> bool:
    """:func:`_nats_cluster.drained` over a connection of its own (``login``: with it)."""
    opts = {"servers": [server.url]} if login is None else connect_options(login, "check")
    nc = await nats.connect(**opts)
    try:
        return await acknowledged(nc, partitions)
    finally:
        await nc.close()


def drained(server: NatsNode, partitions: int, login: NatsSettings | None = None) -> bool:
    """:func:`is_drained`, outside an event loop."""
    return asyncio.run(is_drained(server, partitions, login))


def charge_indices(ledger_path: Path, session: str) -> list[int]:
    if not ledger_path.exists():
        return []
    with Ledger(ledger_path, create=False) as ledger:
        return [c.chunk_index for c in ledger.charges(session)]


async def send(server: NatsNode, session: str, seed: int, seconds: float, pause: float) -> int:
    """``seconds`` of simulated gaze in 12-sample blocks (100 ms at 120 Hz), ``pause`` apart."""
    gaze = simulate_gaze(seconds, 120.0, seed)
    nats_settings = NatsSettings(servers=[server.url])
    async with JetStreamSender(nats_settings, "hmd", session, rate_hz=120.0) as sender:
        for start in range(0, len(gaze), 12):
            await sender.send(gaze.slice(start, start + 12))
            await asyncio.sleep(pause)
    return len(gaze)


def charged_30s(session: str) -> list[int]:
    """The chunk indices a worker charges for 30 s of ``session``'s gaze (a 2 s window, 0.05 s
    steps, 32-step chunks: at phase 0, (30 − 2) / 0.05 + 1 = 561 steps, 17 chunks)."""
    return list(range(expected_chunks(30.0, session)))


@pytest.mark.slow
@pytest.mark.network
def test_one_worker_reads_every_sample_once_and_charges_each_chunk_once(
    tmp_path: Path, nats_server: NatsNode, mosquitto: MosquittoBroker
) -> None:
    env = worker_env([nats_server.url], 4)
    workers = [WorkerProc(tmp_path, 0, mosquitto.address, env)]
    sessions = [f"s{i}" for i in range(5)]
    ledger_path = tmp_path / "ledger.sqlite"
    try:
        wait_for(workers[0].ready, 30, workers[0].text)

        async def devices() -> list[int]:
            return await asyncio.gather(
                *(send(nats_server, s, i, 30.0, 0.002) for i, s in enumerate(sessions))
            )

        sent = asyncio.run(devices())
        wait_for(lambda: drained(nats_server, 4), 30, workers[0].text)
    finally:
        codes = stop_all(workers)
    text = workers[0].text()
    assert codes == [0], text
    closed = closed_counts(text)
    for s, n in zip(sessions, sent, strict=True):
        assert closed[f"hmd.{s}"] == [(n, 0)], (s, closed.get(f"hmd.{s}"), text)
        assert charge_indices(ledger_path, f"hmd.{s}") == charged_30s(f"hmd.{s}")
    pinned = set(re.findall(r"pinned on partition (\d+)", text))
    assert len(pinned) >= 2, f"5 sessions in 4 partitions use more than one: {pinned}"


@pytest.mark.slow
@pytest.mark.network
def test_a_killed_pinned_workers_partition_moves_and_nothing_is_lost_or_charged_twice(
    tmp_path: Path, nats_server: NatsNode, mosquitto: MosquittoBroker
) -> None:
    """One partition, two workers: the server pins one. SIGKILL it mid-stream: the other is
    pinned, replays the retained gaze, continues each session's chunk numbering, and the
    sessions end with every chunk a single worker would have charged, each charged once."""
    env = worker_env([nats_server.url], 1)
    workers = [WorkerProc(tmp_path, n, mosquitto.address, env) for n in range(2)]
    sessions = ["k0", "k1", "k2"]
    ledger_path = tmp_path / "ledger.sqlite"
    logs = lambda: "\n=====\n".join(w.text() for w in workers)  # noqa: E731

    def charged(s: str) -> int:
        return len(charge_indices(ledger_path, f"hmd.{s}"))

    try:
        # settled: only the worker the partition is assigned to pulls it (balance)
        wait_for(lambda: balanced([w.text() for w in workers], 1), 30, logs)

        async def device(s: str, seed: int) -> None:
            gaze = simulate_gaze(30.0, 120.0, seed)
            blocks = [gaze.slice(a, a + 12) for a in range(0, len(gaze), 12)]
            settings = NatsSettings(servers=[nats_server.url])
            async with JetStreamSender(settings, "hmd", s, rate_hz=120.0) as sender:
                for i, block in enumerate(blocks):
                    await sender.send(block)
                    await asyncio.sleep(0.004)
                    if i == 120:  # 12 s of gaze sent: wait until chunks are charged
                        await until(lambda: charged(s) >= 3, 30)

        async def devices_and_kill() -> int:
            tasks = [asyncio.create_task(device(s, i)) for i, s in enumerate(sessions)]
            await until(lambda: min(charged(s) for s in sessions) >= 3, 30)
            killed = kill_the_one(workers, lambda w: "pinned on partition 0" in w.text(), logs)
            await asyncio.gather(*tasks)
            return killed

        killed = asyncio.run(asyncio.wait_for(devices_and_kill(), 40))
        other = workers[1 - killed]
        wait_for(lambda: "pinned on partition 0" in other.text(), 20, logs)
        wait_for(lambda: drained(nats_server, 1), 30, logs)
        # the survivor dropped the dead worker (balance: 1 worker) and holds its partition
        wait_for(lambda: balanced([other.text()], 1, held=True), 10, logs)
    finally:
        codes = stop_all(workers)
    assert codes[1 - killed] == 0, logs()
    assert codes[killed] == -signal.SIGKILL
    for s in sessions:
        assert charge_indices(ledger_path, f"hmd.{s}") == charged_30s(f"hmd.{s}"), (
            s,
            logs(),
        )
        with Ledger(ledger_path, create=False) as ledger:
            records = ledger.charges(f"hmd.{s}")
            assert ledger.pending(session=f"hmd.{s}") == []
        # no gap in gaze time between consecutive chunks: the takeover lost no feature step
        for a, b in itertools.pairwise(records):
            assert b.gaze_start - a.gaze_end == pytest.approx(0.05, abs=0.03), (s, a, b)
    text = other.text()
    closed = closed_counts(text)
    for s in sessions:  # the survivor replayed the whole session (retained 120 s): every sample
        assert closed[f"hmd.{s}"] == [(3600, 0)], (s, closed.get(f"hmd.{s}"), text)
    assert "resumes after chunk" in text, text
    assert re.search(r"pinned on partition 0; replayed [1-9]\d* retained blocks", text), text


@pytest.mark.slow
@pytest.mark.network
def test_forward_to_jetstream_feeds_a_jetstream_worker(
    tmp_path: Path, nats_server: NatsNode, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    """`gazeguard forward` (real LSL outlet → JetStream) feeds a worker, which dates the gaze
    on the forwarder's clock (its Gazeguard-Unix-Offset header), in blocks of ``--block-s``."""
    name = f"fwdjs-{unique_id}"
    head = SimulatedHeadset(120, seed=3, name=name, source_id=f"{name}-src")
    head.start()
    workers = [WorkerProc(tmp_path, 0, mosquitto.address, worker_env([nats_server.url], 2))]
    ledger_path, session = tmp_path / "ledger.sqlite", f"hmd.{name}-src"
    try:
        wait_for(workers[0].ready, 30, workers[0].text)
        # 9 s: the session's grid starts up to a chunk after its first sample; 2 chunks or more
        cmd = [
            sys.executable, "-m", "gazeguard", "forward", "--nats", nats_server.url,
            "--device", "hmd", "--stream-name", name, "--duration", "9", "--block-s", "0.8",
        ]  # fmt: skip
        fwd = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        assert fwd.returncode == 0, fwd.stderr
        wait_for(lambda: drained(nats_server, 2), 30, workers[0].text)
    finally:
        codes = stop_all(workers)
        head.stop()
    assert codes == [0], workers[0].text()
    assert f"session {session} on NATS JetStream {nats_server.url}" in fwd.stderr
    # One block per 0.8-s pull (96 samples at 120 Hz; a late pull only makes it longer, the
    # first may be short): the old 250-ms pulls would make ~30.
    got = re.search(r": (\d+) blocks, (\d+) samples acknowledged", fwd.stderr)
    assert got is not None, fwd.stderr
    blocks, samples = int(got[1]), int(got[2])
    assert blocks >= 3, (blocks, samples)
    assert samples / blocks > 70, (blocks, samples)
    indices = charge_indices(ledger_path, session)
    # ~7 s of gaze, a 2 s window and 1.6 s chunks: 3 chunks (minus stream start-up).
    assert len(indices) >= 2, (indices, fwd.stderr, workers[0].text())
    assert indices == list(range(len(indices)))
    with Ledger(ledger_path, create=False) as ledger:
        first = ledger.charges(session)[0]
    assert abs(first.gaze_start - time.time()) < 60, "dated on the forwarder's Unix clock"


def test_a_connect_that_loses_one_cancellation_is_still_ended() -> None:
    """nats-py's connect can lose a cancellation (Python 3.11's wait_for drops one that lands as
    an attempt fails) and try again: `forward` stopped by Ctrl-C while NATS was down then never
    exited. cancel_connect cancels until the task has ended."""
    lost = []

    async def connecting() -> None:  # as nats-py's retry loop with the cancellation lost once
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost.append(True)

    async def scenario() -> bool:
        task = asyncio.ensure_future(connecting())
        await asyncio.sleep(0.01)
        async with asyncio.timeout(5):
            await cancel_connect(task)
        return task.cancelled()

    assert asyncio.run(scenario())
    assert lost == [True]


def test_jetstream_source_needs_fleet_mode_and_a_window_long_retention() -> None:
    base = {"ingest": {"source": "jetstream"}}
    problems = validate_settings(Settings(**base))  # type: ignore[arg-type]
    assert any(p.field == "ingest.source" and "fleet mode only" in p.reason for p in problems)
    ok = Settings(ingest={"source": "jetstream"}, fleet={"enabled": True})  # type: ignore[arg-type]
    assert not [p for p in validate_settings(ok) if p.field.startswith(("ingest", "fleet"))]
    short = Settings(
        ingest={"source": "jetstream"},  # type: ignore[arg-type]
        fleet={"enabled": True, "nats": {"max_age_s": 1.0}},  # type: ignore[arg-type]
        features={"window_s": 2.0},  # type: ignore[arg-type]
    )
    assert [p.field for p in validate_settings(short)] == ["fleet.nats.max_age_s"]
    half_tls = Settings(
        ingest={"source": "jetstream"},  # type: ignore[arg-type]
        fleet={"enabled": True, "nats": {"tls_cert_file": "c.pem"}},  # type: ignore[arg-type]
    )
    assert "fleet.nats.tls_cert_file" in [p.field for p in validate_settings(half_tls)]


def test_nats_settings_reject_bad_names_and_subject_tokens() -> None:
    for bad in ({"partitions": 0}, {"stream": "a.b"}, {"subject_prefix": "gaze.*"},
                {"servers": []}, {"max_age_s": 0}):  # fmt: skip
        with pytest.raises(ValueError, match="validation error"):
            NatsSettings(**bad)  # type: ignore[arg-type]
    assert gaze_subject("gaze.raw", "hmd-7", "s_1") == "gaze.raw.hmd-7.s_1"
    for device in ("a.b", "a*", ">", "", "a b"):
        with pytest.raises(StreamError, match="subject token"):
            gaze_subject("gaze.raw", device, "s")


def test_the_partition_assignment_is_even_deterministic_and_moves_little() -> None:
    """Every worker gets P // N or P // N + 1 partitions, the map depends on the set of ids only
    (not their order), and a join moves the newcomer's share plus a few (bounded loads)."""
    for p, n in [(1, 2), (4, 2), (4, 3), (8, 3), (16, 5), (3, 8)]:
        ids = [f"host-{i}" for i in range(n)]
        owner = assign_partitions(p, ids, "GAZE")
        assert sorted(owner) == list(range(p))
        loads = [list(owner.values()).count(w) for w in ids]
        assert set(loads) <= {p // n, p // n + 1}, (p, n, loads)
        assert assign_partitions(p, reversed(ids), "GAZE") == owner
    assert assign_partitions(4, [], "GAZE") == {}
    moved = share = 0
    for trial in range(50):
        ids = [f"w{trial}-{i}" for i in range(2)]
        before = assign_partitions(8, ids, "GAZE")
        after = assign_partitions(8, [*ids, "new"], "GAZE")
        moved += sum(before[q] != after[q] for q in range(8))
        share += list(after.values()).count("new")
    assert share <= moved <= 2 * share, (moved, share)


# ------------------------------------------------------------------ ported from the MQTT fleet
# Behaviours the retired MQTT claim path was tested for, on the JetStream path.


def blocks_of(gaze: GazeSamples) -> list[GazeSamples]:
    """``gaze`` cut into the 12-sample blocks a device sends (100 ms at 120 Hz)."""
    return [gaze.slice(start, start + 12) for start in range(0, len(gaze), 12)]


def partitions_of(server: NatsNode, device: str, sessions: list[str], p: int) -> dict[str, int]:
    """The partition the server's subject transform puts each session in: asked of the server
    itself, through a scratch stream with the same transform under another prefix (the
    partition hashes the device and session tokens only)."""

    async def probe() -> dict[str, int]:
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            scratch = NatsSettings(stream="PROBE", subject_prefix="probe", partitions=p)
            await js.add_stream(stream_config(scratch))
            out = {}
            for s in sessions:
                ack = await js.publish(gaze_subject("probe", device, s), b"")
                stored = await js.get_msg("PROBE", ack.seq)
                out[s] = int(str(stored.subject).split(".")[2])
            await js.delete_stream("PROBE")
            return out
        finally:
            await nc.close()

    return asyncio.run(probe())


def waiting_pulls(server: NatsNode, partition: int) -> int:
    """Pull requests waiting at the server on ``partition``'s consumer."""

    async def check() -> int:
        nc = await nats.connect(server.url)
        try:
            info = await nc.jetstream().consumer_info("GAZE", consumer_name(partition))
            return int(info.num_waiting or 0)
        finally:
            await nc.close()

    return asyncio.run(check())


async def send_blocks(
    server: NatsNode, session: str, blocks: list[GazeSamples], pause: float, **kw: Any
) -> None:
    """Send ``blocks`` of ``hmd``/``session`` in order, ``pause`` apart (declared at 120 Hz, the
    rate of the simulated gaze every caller sends, unless ``kw`` says otherwise)."""
    kw = {"rate_hz": 120.0, **kw}
    async with JetStreamSender(NatsSettings(servers=[server.url]), "hmd", session, **kw) as sender:
        for block in blocks:
            await sender.send(block)
            await asyncio.sleep(pause)


def sessions_by_partition(server: NatsNode, partitions: int, per: int) -> dict[int, list[str]]:
    """``per`` session names of device ``hmd`` in each partition (by the server's hash)."""
    where = partitions_of(server, "hmd", [f"s{i}" for i in range(12 * partitions)], partitions)
    out = {p: [s for s, q in where.items() if q == p][:per] for p in range(partitions)}
    assert all(len(v) == per for v in out.values()), where
    return out


def holder(workers: list[WorkerProc], partition: int) -> int:
    """The index of the worker whose last balance report says it holds ``partition``."""
    found = [i for i, w in enumerate(workers) if partition in (balance_report(w.text()) or [()])[0]]
    assert len(found) == 1, (partition, found)
    return found[0]


def assert_each_chunk_charged_once_without_a_gap(ledger_path: Path, sessions: list[str]) -> None:
    """Every chunk of 30 s of gaze charged once, nothing pending, and no gap in gaze time
    between consecutive chunks (a take-over lost no feature step)."""
    for s in sessions:
        assert charge_indices(ledger_path, f"hmd.{s}") == charged_30s(f"hmd.{s}"), s
        with Ledger(ledger_path, create=False) as ledger:
            records = ledger.charges(f"hmd.{s}")
            assert ledger.pending(session=f"hmd.{s}") == [], s
        for a, b in itertools.pairwise(records):
            assert b.gaze_start - a.gaze_end == pytest.approx(0.05, abs=0.03), (s, a, b)


def assert_every_sample_read_once(
    workers: list[WorkerProc], part: dict[int, list[str]], sent: dict[str, int]
) -> None:
    """The worker holding each partition at the end closed its sessions with every sample sent,
    none dropped as not newer (each held once); no worker ever dropped one."""
    texts = [w.text() for w in workers]
    for p, sessions in part.items():
        closed = closed_counts(texts[holder(workers, p)])
        for s in sessions:
            assert closed[f"hmd.{s}"][-1] == (sent[s], 0), (s, closed.get(f"hmd.{s}"))
    for text in texts:
        for s, counts in closed_counts(text).items():
            assert all(dropped == 0 for _, dropped in counts), (s, counts)


@pytest.mark.slow
@pytest.mark.network
def test_two_workers_share_the_partitions_each_session_read_by_one_and_charged_once(
    tmp_path: Path, nats_server: NatsNode, mosquitto: MosquittoBroker
) -> None:
    """Two workers, two partitions: once they have heard each other (balance), each is assigned
    one and only it pulls that one; every session is read by the worker of its partition only,
    every sample once, every chunk charged once. (Before balancing, the server pinned every
    partition on whichever worker's pull it served first: this test had to freeze one worker
    with SIGSTOP to get a spread.)"""
    env = worker_env([nats_server.url], 2)
    part = sessions_by_partition(nats_server, 2, 3)
    gaze = {s: simulate_gaze(30.0, 120.0, i) for i, s in enumerate(part[0] + part[1])}
    blocks = {s: blocks_of(g) for s, g in gaze.items()}
    workers = [WorkerProc(tmp_path, n, mosquitto.address, env) for n in range(2)]
    logs = lambda: "\n=====\n".join(w.text() for w in workers)  # noqa: E731
    ledger_path = tmp_path / "ledger.sqlite"

    async def devices() -> None:
        await asyncio.gather(*(send_blocks(nats_server, s, blocks[s], 0.002) for s in gaze))

    try:
        wait_for(lambda: balanced([w.text() for w in workers], 2), 30, logs)
        asyncio.run(devices())
        wait_for(lambda: drained(nats_server, 2), 40, logs)
        wait_for(lambda: balanced([w.text() for w in workers], 2, held=True), 10, logs)
    finally:
        codes = stop_all(workers)
    assert codes == [0, 0], logs()
    texts = [w.text() for w in workers]
    assert "handed to worker" not in logs(), "settled before the first block: nothing to move"
    for p in (0, 1):
        mine = holder(workers, p)
        assert f"pinned on partition {p}" not in texts[1 - mine], logs()
        closed = closed_counts(texts[mine])
        for s in part[p]:  # read by its partition's worker, every sample once
            assert closed[f"hmd.{s}"] == [(len(gaze[s]), 0)], (s, logs())
            assert f"hmd.{s}" not in closed_counts(texts[1 - mine]), (s, logs())
    for s in gaze:
        assert charge_indices(ledger_path, f"hmd.{s}") == charged_30s(f"hmd.{s}"), (
            s,
            logs(),
        )


@pytest.mark.slow
@pytest.mark.network
def test_two_workers_started_together_each_get_half_of_the_partitions(
    tmp_path: Path, nats_server: NatsNode, mosquitto: MosquittoBroker
) -> None:
    """Two workers started together, four partitions, two sessions on each. The devices start
    as soon as both workers are up, before they have heard each other (without balancing, the
    server pinned all four partitions on one worker in 2 of 3 trials). A worker pulls nothing
    until it has heard the others (2.5 heartbeats), so each is pinned on the two partitions
    assigned to it; whatever did land elsewhere is handed back mid-session. Every sample is read
    once in the end, every chunk charged once, and no feature step is lost (chunks continue
    without a gap)."""
    env = worker_env([nats_server.url], 4)
    part = sessions_by_partition(nats_server, 4, 2)
    sessions = [s for p in range(4) for s in part[p]]
    gaze = {s: simulate_gaze(30.0, 120.0, 50 + i) for i, s in enumerate(sessions)}
    blocks = {s: blocks_of(g) for s, g in gaze.items()}
    workers = [WorkerProc(tmp_path, n, mosquitto.address, env) for n in range(2)]
    logs = lambda: "\n=====\n".join(w.text() for w in workers)  # noqa: E731
    texts = lambda: [w.text() for w in workers]  # noqa: E731
    ledger_path = tmp_path / "ledger.sqlite"

    def charged(s: str) -> int:
        return len(charge_indices(ledger_path, f"hmd.{s}"))

    async def send_all(a: int, b: int) -> None:
        await asyncio.gather(*(send_blocks(nats_server, s, blocks[s][a:b], 0.002) for s in gaze))

    async def devices() -> None:
        await send_all(0, 100)  # 10 s of gaze, charged by whoever was pinned
        await until(lambda: min(charged(s) for s in sessions) >= 2, 40)
        await until(lambda: balanced(texts(), 4), 40)  # hand-backs done: held ⊆ assigned
        await send_all(100, 300)

    try:
        wait_for(lambda: all(w.ready() for w in workers), 30, logs)
        asyncio.run(asyncio.wait_for(devices(), 120))
        wait_for(lambda: drained(nats_server, 4), 40, logs)
        wait_for(lambda: balanced(texts(), 4, held=True), 20, logs)
    finally:
        codes = stop_all(workers)
    assert codes == [0, 0], logs()
    for w in workers:
        report = balance_report(w.text())
        assert report is not None, logs()
        assert len(report[0]) == 2, (report, logs())
    assert_every_sample_read_once(workers, part, {s: len(g) for s, g in gaze.items()})
    assert_each_chunk_charged_once_without_a_gap(ledger_path, sessions)


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize(("before", "spread"), [(1, [2, 2]), (2, [1, 1, 2])])
def test_a_worker_joining_later_gets_its_share_without_losing_or_double_charging(
    tmp_path: Path,
    nats_server: NatsNode,
    mosquitto: MosquittoBroker,
    before: int,
    spread: list[int],
) -> None:
    """One (two) workers hold four partitions (two sessions on each) mid-stream; another joins
    while the devices keep sending: the others hand it its share (two partitions, handed back
    one at a time; of three workers, at least one: 2–1–1) and it takes each over from the
    retained gaze. No sample lost, every chunk charged once, no feature step lost."""
    env = worker_env([nats_server.url], 4)
    part = sessions_by_partition(nats_server, 4, 2)
    sessions = [s for p in range(4) for s in part[p]]
    gaze = {s: simulate_gaze(30.0, 120.0, 70 + i) for i, s in enumerate(sessions)}
    blocks = {s: blocks_of(g) for s, g in gaze.items()}
    workers = [WorkerProc(tmp_path, n, mosquitto.address, env) for n in range(before)]
    logs = lambda: "\n=====\n".join(w.text() for w in workers)  # noqa: E731
    texts = lambda: [w.text() for w in workers]  # noqa: E731
    ledger_path = tmp_path / "ledger.sqlite"

    async def send_all(a: int, b: int, pause: float) -> None:
        await asyncio.gather(*(send_blocks(nats_server, s, blocks[s][a:b], pause) for s in gaze))

    async def devices() -> None:
        await send_all(0, 100, 0.002)  # 10 s of gaze, on the first workers
        await until(lambda: balanced(texts(), 4, held=True), 40)
        workers.append(WorkerProc(tmp_path, before, mosquitto.address, env))
        # the next 12 s of gaze in about real time, while the third worker joins
        sending = asyncio.create_task(send_all(100, 220, 0.1))
        await until(lambda: balanced(texts(), 4), 60)  # hand-backs done: held ⊆ assigned
        await sending
        await send_all(220, 300, 0.002)

    try:
        wait_for(lambda: balanced(texts(), 4), 30, logs)
        asyncio.run(asyncio.wait_for(devices(), 150))
        wait_for(lambda: drained(nats_server, 4), 40, logs)
        wait_for(lambda: balanced(texts(), 4, held=True), 20, logs)
    finally:
        codes = stop_all(workers)
    assert codes == [0] * (before + 1), logs()
    report = balance_report(workers[-1].text())
    assert report is not None, logs()
    assert len(report[0]) >= 1, (report, logs())
    assert sorted(len((balance_report(t) or [()])[0]) for t in texts()) == spread, logs()
    # each hand-back went to the partition's assigned worker, each partition moved at most once
    # (not only to the newcomer: the bounded-load assignment may also move one between the
    # others, e.g. 2 moves instead of 1 for 2 → 3 workers on 4 partitions)
    handed = re.findall(r"partition (\d+) handed to worker (\S+) ", logs())
    assert len(handed) == len({p for p, _ in handed}) >= len(report[0]), (handed, logs())
    for p, to in handed:
        assert f"worker {to}: pinned on partition {p};" in logs(), (p, to, logs())
    assert_every_sample_read_once(workers, part, {s: len(g) for s, g in gaze.items()})
    assert_each_chunk_charged_once_without_a_gap(ledger_path, sessions)


@pytest.mark.slow
@pytest.mark.network
def test_a_worker_dates_gaze_on_the_devices_clock(
    tmp_path: Path, nats_server: NatsNode, mosquitto: MosquittoBroker
) -> None:
    """Blocks carry the device host's clock; the ``Gazeguard-Unix-Offset`` header (``gazeguard
    forward`` sets it) makes a worker on any host date the session's gaze on *that* clock, not
    on its own LSL offset (hosts with different uptimes would shift the session's gaze times:
    cohort buckets misaligned, windows moved on failover)."""
    workers = [WorkerProc(tmp_path, 0, mosquitto.address, worker_env([nats_server.url], 2))]
    blocks = blocks_of(simulate_gaze(12.0, 120.0, seed=5))  # stamped 0 … 12 s on its clock
    offset = 1_600_000_000.0  # the device's Unix time minus its sample clock
    ledger_path = tmp_path / "ledger.sqlite"
    try:
        wait_for(workers[0].ready, 30, workers[0].text)
        asyncio.run(send_blocks(nats_server, "dated", blocks, 0.002, unix_offset=lambda: offset))
        wait_for(lambda: drained(nats_server, 2), 30, workers[0].text)
    finally:
        codes = stop_all(workers)
    assert codes == [0], workers[0].text()
    with Ledger(ledger_path, create=False) as ledger:
        records = ledger.charges("hmd.dated")
    # 12 s of gaze, a 2 s window, 1.6 s chunks: 6 chunks at phase 0
    assert len(records) == expected_chunks(12.0, "hmd.dated"), workers[0].text()
    for r in records:
        assert offset <= r.gaze_start < r.gaze_end <= offset + 12.0, r


@pytest.mark.slow
@pytest.mark.network
def test_a_fleet_chunk_goes_out_when_it_comes_due_not_when_its_gaze_completes_it(
    tmp_path: Path, nats_server: NatsNode, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    """Gaze streamed in real time on the device's clock: each chunk is published at its due
    time — its last window's end + the look-behind + ``ingest.late_after_s`` (1.5 s here) —
    never when its last sample came (about 1.4 s earlier), so when a fleet chunk goes out is
    the grid's, not the samples'."""
    late_after = 1.5
    env = {**worker_env([nats_server.url], 2), "GAZEGUARD_INGEST__LATE_AFTER_S": str(late_after)}
    worker = WorkerProc(tmp_path, 0, mosquitto.address, env)
    got: list[tuple[float, ChunkMessage]] = []

    def on_message(_c: object, _u: object, msg: mqtt.MQTTMessage) -> None:
        if msg.topic.endswith("/chunks"):
            got.append((time.time(), ChunkMessage.from_payload(bytes(msg.payload))))

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"due-{unique_id}")
    client.on_connect = lambda c, *_: c.subscribe("gazeguard/v1/+/+/chunks", qos=1)
    client.on_message = on_message
    client.connect(mosquitto.host, mosquitto.port)
    client.loop_start()
    gaze = simulate_gaze(9.0, 120.0, seed=5)
    session = "hmd.ontime"
    want = expected_chunks(9.0, session)

    async def stream() -> None:
        start = time.time()
        async with JetStreamSender(
            NatsSettings(servers=[nats_server.url]), "hmd", "ontime", rate_hz=120.0,
            unix_offset=lambda: start, clock=lambda: time.time() - start,
        ) as sender:  # fmt: skip
            for block in blocks_of(gaze):
                await asyncio.sleep(max(0.0, start + float(block.timestamps[-1]) - time.time()))
                await sender.send(block)

    try:
        wait_for(worker.ready, 30, worker.text)
        asyncio.run(stream())
        wait_for(lambda: len(got) >= want, 30, worker.text)
    finally:
        client.loop_stop()
        client.disconnect()
        codes = stop_all([worker])
    assert codes == [0], worker.text()
    assert want >= 3
    assert [m.chunk_index for _, m in got] == list(range(want))
    for received, message in got:
        due = message.unix_end + LOOKBEHIND_S + late_after
        assert received >= due - 0.05, (received - due, message.chunk_index)
        assert received <= due + 3.0, (received - due, message.chunk_index)


@pytest.mark.network
def test_one_block_stamped_ahead_of_the_clock_does_not_stop_a_session(
    tmp_path: Path, nats_server: NatsNode, mosquitto: MosquittoBroker
) -> None:
    """Issue 15.2 on the fleet's raw path: a block stamped 1e6 s ahead must not become the
    session's "last" time (every later sample would be dropped as not newer). It is dropped as
    ahead of the clock, counted, and the rest flows."""
    workers = [WorkerProc(tmp_path, 0, mosquitto.address, worker_env([nats_server.url], 2))]
    blocks = blocks_of(simulate_gaze(12.0, 120.0, seed=6))
    poison = GazeSamples.from_arrays([1e6, 1e6 + 0.01], [0.0, 0.0], [0.0, 0.0])
    offset = time.time() - 30.0  # the gaze ended 18 s ago on the device's clock
    try:
        wait_for(workers[0].ready, 30, workers[0].text)
        sent = [*blocks[:40], poison, *blocks[40:]]
        asyncio.run(send_blocks(nats_server, "poison", sent, 0.002, unix_offset=lambda: offset))
        wait_for(lambda: drained(nats_server, 2), 30, workers[0].text)
    finally:
        codes = stop_all(workers)
    text = workers[0].text()
    assert codes == [0], text
    # 12 s of gaze, a 2 s window, 1.6 s chunks: 6 chunks at phase 0 (without the rule: 2)
    assert charge_indices(tmp_path / "ledger.sqlite", "hmd.poison") == list(
        range(expected_chunks(12.0, "hmd.poison"))
    ), text
    assert "gaze stamped ahead of the clock dropped" in text
    closed = re.search(r"'hmd\.poison' closed \((\d+) samples, (\d+) dropped as not newer, "
                       r"(\d+) as ahead of the clock", text)  # fmt: skip
    assert closed is not None, text
    assert tuple(map(int, closed.groups())) == (1440, 0, 2), text


@pytest.mark.network
def test_a_device_whose_unix_clock_runs_ahead_keeps_its_fresh_gaze(
    tmp_path: Path, nats_server: NatsNode, mosquitto: MosquittoBroker
) -> None:
    """The future rule must not trust two hosts' Unix clocks to agree: a headset whose wall clock
    runs 5 s ahead of the worker's states a Unix offset 5 s too large, so by the Unix clocks its
    freshest 5 s of gaze look early. Its blocks also say "now" on their own clock
    (``Gazeguard-Now``), and the worker measures from that."""
    workers = [WorkerProc(tmp_path, 0, mosquitto.address, worker_env([nats_server.url], 2))]
    gaze = simulate_gaze(12.0, 120.0, seed=7)
    m0 = time.monotonic()

    def clock() -> float:  # the headset's LSL clock: 30 s since it booted
        return 30.0 + time.monotonic() - m0

    fresh = GazeSamples(gaze.timestamps + 18.0, gaze.x_deg, gaze.y_deg, gaze.pupil_mm, gaze.valid)
    try:
        wait_for(workers[0].ready, 30, workers[0].text)
        asyncio.run(  # stamped 18-30 s: all of it already past on its clock
            send_blocks(
                nats_server,
                "skewed",
                blocks_of(fresh),
                0,
                clock=clock,
                unix_offset=lambda: time.time() + 5.0 - clock(),
            )
        )
        wait_for(lambda: drained(nats_server, 2), 30, workers[0].text)
    finally:
        codes = stop_all(workers)
    text = workers[0].text()
    assert codes == [0], text
    closed = re.search(r"closed \((\d+) samples, (\d+) dropped as not newer, (\d+) as ahead", text)
    assert closed is not None, text
    assert tuple(map(int, closed.groups())) == (len(gaze), 0, 0), text
    # The session's grid starts at the first multiple of a chunk's length at or after its first
    # sample (up to a chunk after it): 5 chunks of the 12 s of gaze
    assert charge_indices(tmp_path / "ledger.sqlite", "hmd.skewed") == list(range(5)), text


@pytest.mark.slow
@pytest.mark.network
def test_a_fleet_worker_publishes_cohort_aggregates_charged_to_every_session(
    tmp_path: Path, nats_server: NatsNode, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    """`gazeguard run --fleet --source jetstream --cohort lab`: three devices stream 9 s of gaze
    in real time; every 2 s bucket's aggregate reaches a subscriber (schema-valid), each
    contributing session is charged once per bucket in its own ledger entry, and the chunks
    still flow. (The label histogram is covered in test_cohort: the shipped model needs 30 s
    windows.)"""
    import jsonschema  # noqa: PLC0415

    from gazeguard.wire.cohort import CohortMessage  # noqa: PLC0415
    from gazeguard.wire.kinds import AGGREGATES  # noqa: PLC0415

    env = worker_env([nats_server.url], 2)
    env.update(GAZEGUARD_COHORT__GRACE_S="1", GAZEGUARD_FLEET__IDLE_TIMEOUT_S="2")
    args = ["--window-s", "2", "--step-s", "0.05", "--chunk-steps", "32",
            "--budget-per-hour", "200", "--features", "fixation_rate,saccade_rate,pupil_mean",
            "--cohort", "lab", "--bucket-s", "2", "--cohort-release", "means"]  # fmt: skip
    sub = Subscriber(mosquitto, f"sub-{unique_id}")
    workers = [WorkerProc(tmp_path, 0, mosquitto.address, env, args)]
    sessions = {f"hmd.c{i}" for i in range(3)}
    topic = "gazeguard/v1/cohort/lab/aggregates"

    def closed() -> set[str]:  # sessions the worker let go (silent for 2 s, every block read)
        return {m.session for m in sub.statuses() if m.state == "stopped"}

    async def device(session: str, seed: int) -> None:
        gaze = simulate_gaze(9.0, 120.0, seed)
        now = pylsl.local_clock()  # no offset header: the worker reads this host's LSL clock
        gaze = GazeSamples(gaze.timestamps + now, gaze.x_deg, gaze.y_deg, gaze.pupil_mm, gaze.valid)
        await send_blocks(nats_server, session, blocks_of(gaze), 0.1)  # real time

    async def devices() -> None:
        await asyncio.gather(*(device(f"c{i}", 20 + i) for i in range(3)))

    try:
        wait_for(workers[0].ready, 30, workers[0].text)
        asyncio.run(devices())
        wait_for(lambda: closed() >= sessions, 60, workers[0].text)
        aggregates_arrived = lambda: len([m for m in sub.messages if m[0] == topic]) >= 3  # noqa: E731
        wait_for(aggregates_arrived, 20, workers[0].text)
    finally:
        codes = stop_all(workers)
        with sub.lock:
            messages = list(sub.messages)
        sub.close()
    text = workers[0].text()
    assert codes == [0], text
    aggregates = [json.loads(p) for t, p, _ in messages if t == topic]
    for a in aggregates:
        jsonschema.validate(a, AGGREGATES.shipped_schema())
    parsed = [CohortMessage.model_validate(a) for a in aggregates]
    assert {m.cohort for m in parsed} == {"lab"}
    assert parsed[0].classes == []  # no --cohort-model: features and count only
    assert [f.name for f in parsed[0].features] == ["fixation_rate", "saccade_rate", "pupil_mean"]
    assert all(m.epsilon_per_hour <= 100.0 + 1e-9 for m in parsed)  # half of 200
    with Ledger(tmp_path / "ledger.sqlite", create=False) as ledger:
        for s in sorted(sessions):
            charged = [c.chunk_index for c in ledger.charges(s, "cohort")]
            assert charged, (s, "contributed to a bucket", text)
            assert len(charged) == len(set(charged)), "a bucket is charged once per session"
            assert len(ledger.charges(s)) >= 3, ("the chunks still flow", text)
        assert ledger.verify() == []
        all_charged = {c.chunk_index for s in sessions for c in ledger.charges(s, "cohort")}
    assert {m.bucket for m in parsed} <= all_charged, "every aggregate's bucket was charged"
    receipts = [t for t, _, _ in messages if t.endswith("/cohort")]
    assert receipts, "contributing sessions get a receipt on their own topic"
    assert {t.split("/")[3] for t in receipts} <= sessions


@pytest.mark.slow
@pytest.mark.network
def test_a_worker_behind_on_its_charges_keeps_sessions_whose_blocks_wait(
    tmp_path: Path,
    nats_server: NatsNode,
    mosquitto: MosquittoBroker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A slow disk holds a worker's charges up for longer than the idle timeout: the session's
    blocks wait in the worker's queue (and at the server), and its silence is the worker's, not
    the device's. The first charge takes 3 s and the idle timeout is 1 s: the session must stay
    open (the MQTT fleet once let such sessions go and dropped their queued blocks), read every
    sample once, and close once, when its device has been silent."""
    ledger_path = tmp_path / "ledger.sqlite"
    settings = fleet_settings(nats_server.url, 2, ledger_path, (mosquitto.host, mosquitto.port))
    release = Pipeline.release
    slowed = threading.Event()

    def slow_release(self: Pipeline, chunk: Chunk) -> ReleasedChunk | None:
        if not slowed.is_set():  # the first charge: a disk that takes 3 s to sync
            slowed.set()
            time.sleep(3.0)
        return release(self, chunk)

    monkeypatch.setattr(Pipeline, "release", slow_release)
    gaze = simulate_gaze(8.0, 120.0, seed=31)

    async def main() -> Fleet:
        stop = asyncio.Event()
        fleets: list[Fleet] = []
        worker = asyncio.create_task(serve_fleet(settings, stop=stop, ready=fleets.append))
        try:
            await until(lambda: "partitions of JetStream stream" in caplog.text, 30)
            await send_blocks(nats_server, "behind", blocks_of(gaze), 0.02)
            await until(lambda: bool(fleets[0].closed), 30)  # silent for 1 s: let go
        finally:
            stop.set()
        return await worker

    with caplog.at_level(logging.INFO):
        fleet = asyncio.run(main())
    assert slowed.is_set()
    assert fleet.closed == ["hmd.behind"], caplog.text
    closed = re.findall(r"session 'hmd\.behind' closed \((\d+) samples", caplog.text)
    assert closed == [str(len(gaze))], caplog.text
    with Ledger(ledger_path, create=False) as ledger:  # 8 s, 2 s window, 1.6 s chunks: 3
        assert [c.chunk_index for c in ledger.charges("hmd.behind")] == [0, 1, 2]


@pytest.mark.slow
@pytest.mark.network
def test_a_worker_frozen_longer_than_the_idle_timeout_keeps_its_session(
    tmp_path: Path, nats_server: NatsNode, mosquitto: MosquittoBroker
) -> None:
    """A worker that does not run for a while (SIGSTOP here; a VM pause or a starved CPU in the
    field) hears nothing meanwhile, but its device's blocks wait in the stream. Its idle sweep
    must not count that time as the device's silence: resuming after a freeze longer than
    ``fleet.idle_timeout_s`` it would let the session go before reading what waited. (The pin
    timeout is longer than the freeze: this is not a failover.)"""
    env = worker_env([nats_server.url], 2)
    env.update(GAZEGUARD_FLEET__IDLE_TIMEOUT_S="2", GAZEGUARD_FLEET__NATS__PIN_TIMEOUT_S="30")
    workers = [WorkerProc(tmp_path, 0, mosquitto.address, env)]
    worker = workers[0]
    gaze = simulate_gaze(16.0, 120.0, seed=13)
    blocks = blocks_of(gaze)
    ledger_path = tmp_path / "ledger.sqlite"

    async def device() -> None:
        settings = NatsSettings(servers=[nats_server.url])
        async with JetStreamSender(settings, "hmd", "frozen", rate_hz=120.0) as sender:
            for block in blocks[:50]:
                await sender.send(block)
            await until(lambda: len(charge_indices(ledger_path, "hmd.frozen")) >= 1, 20)
            # caught up (nothing in its hands): only the freeze can make the session look silent
            deadline = time.monotonic() + 20
            while not await is_drained(nats_server, 2):
                assert time.monotonic() < deadline, worker.text()
                await asyncio.sleep(0.05)
            os.kill(worker.proc.pid, signal.SIGSTOP)
            try:
                for block in blocks[50:100]:  # acknowledged by the stream, waiting for the worker
                    await sender.send(block)
                await asyncio.sleep(4.0)  # the freeze: twice the idle timeout
            finally:
                os.kill(worker.proc.pid, signal.SIGCONT)
            for block in blocks[100:]:
                await sender.send(block)
                await asyncio.sleep(0.002)

    try:
        wait_for(worker.ready, 30, worker.text)
        asyncio.run(device())
        # silent for 2 s after its last block: let go, every block read
        wait_for(lambda: "'hmd.frozen' closed" in worker.text(), 30, worker.text)
    finally:
        codes = stop_all(workers)
    text = worker.text()
    assert codes == [0], text
    assert closed_counts(text)["hmd.frozen"] == [(len(gaze), 0)], text  # closed once, all read
    # 16 s of gaze, a 2 s window, 1.6 s chunks: 8 chunks
    assert charge_indices(ledger_path, "hmd.frozen") == list(range(8)), text


# ------------------------------------------------------------------ trust boundary
# Raw gaze is on the NATS wire: TLS, and one credential per device that may publish its own
# gaze and read its own replies only. The permissions are read from the example in
# docs/fleet.md (Trust boundary), so that what it recommends is what is tested.


def docs_permissions() -> dict[str, str]:
    """User → the permissions of docs/fleet.md's nats-server ``authorization`` example."""
    text = (REPO / "docs" / "fleet.md").read_text()
    found = re.findall(r'\{ user: "([^"]+)",\s+password: "…", permissions: \{ (.*) \} \}', text)
    assert {u for u, _ in found} == {"worker-1", "hmd-07"}, found
    return dict(found)


def worker_permissions() -> str:
    return docs_permissions()["worker-1"]


def device_permissions(device: str) -> str:
    return docs_permissions()["hmd-07"].replace("hmd-07", device)


@pytest.mark.slow
@pytest.mark.network
def test_raw_gaze_over_tls_with_per_device_credentials_that_cannot_read_others_gaze(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """A nats-server that requires TLS and a login: a worker and a device, each with its own
    credential, carry a session end to end; a plain connection is refused; a device may not
    publish as another device (its sender fails instead of retrying for ever), nor subscribe to
    anyone's gaze — neither the gaze subjects nor the inboxes the workers' deliveries arrive on."""
    certs = tmp_path / "certs"
    script = REPO / "deploy" / "mosquitto" / "make-dev-certs.sh"
    subprocess.run([str(script), str(certs)], check=True, capture_output=True)
    password = {u: secrets.token_urlsafe(12) for u in ("worker", "hmd-1", "hmd-2")}
    users = [f'{{user: "worker", password: "{password["worker"]}", '
             f"permissions: {{{worker_permissions()}}}}}"]  # fmt: skip
    users += [
        f'{{user: "{d}", password: "{password[d]}", permissions: {{{device_permissions(d)}}}}}'
        for d in ("hmd-1", "hmd-2")
    ]
    config = (
        f'tls {{\n  cert_file: "{certs / "server.crt"}"\n  key_file: "{certs / "server.key"}"\n}}\n'
        "authorization {\n  users = [\n    " + "\n    ".join(users) + "\n  ]\n}\n"
    )
    server = single_node(tmp_path, config)

    def login(user: str) -> NatsSettings:
        return NatsSettings(servers=[server.url], user=user, password=password[user],
                            tls_ca_file=certs / "ca.crt")  # type: ignore[arg-type]  # fmt: skip

    env = worker_env([server.url], 2)
    env.update(
        GAZEGUARD_FLEET__NATS__USER="worker",
        GAZEGUARD_FLEET__NATS__PASSWORD=password["worker"],
        GAZEGUARD_FLEET__NATS__TLS_CA_FILE=str(certs / "ca.crt"),
    )
    workers = [WorkerProc(tmp_path, 0, mosquitto.address, env)]
    blocks = blocks_of(simulate_gaze(12.0, 120.0, seed=41))
    errors: list[str] = []
    seen: list[str] = []

    async def device(settings: NatsSettings, name: str, session: str) -> None:
        async with JetStreamSender(settings, name, session, rate_hz=120.0) as sender:
            for block in blocks:
                await sender.send(block)

    def plaintext_reply() -> tuple[bytes, bytes]:
        """A client that logs in without TLS: the server's INFO, and its answer to a PING."""
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            stream = sock.makefile("rwb")
            info = stream.readline()
            login = {"verbose": False, "user": "hmd-1", "pass": password["hmd-1"]}
            stream.write(b"CONNECT " + json.dumps(login).encode() + b"\r\nPING\r\n")
            stream.flush()
            try:
                return info, stream.readline()
            except OSError:  # reset
                return info, b""

    async def snoop() -> None:
        """hmd-1 tries to read the gaze hmd-2 sends while the worker reads it."""

        async def error(exc: Exception) -> None:
            errors.append(str(exc))

        async def got(msg: Msg) -> None:
            seen.append(msg.subject)

        opts = connect_options(login("hmd-1"), "snoop")
        nc = await nats.connect(**{**opts, "error_cb": error}, inbox_prefix="_INBOX.hmd-1")
        try:
            for subject in ("gaze.raw.>", "gaze.raw.part.>", "_INBOX.>"):
                await nc.subscribe(subject, cb=got)
            await until(lambda: len(errors) >= 3, 10)
            await device(login("hmd-2"), "hmd-2", "s2")  # acknowledged: stored and routed
            await nc.flush()  # anything routed to hmd-1 came before the flush's PONG
        finally:
            await nc.close()

    async def impersonate() -> None:
        async with JetStreamSender(login("hmd-1"), "hmd-2", "fake", rate_hz=120.0) as sender:
            await sender.send(blocks[0])

    try:
        wait_for(workers[0].ready, 30, workers[0].text)
        asyncio.run(asyncio.wait_for(device(login("hmd-1"), "hmd-1", "s1"), 60))
        info, answer = plaintext_reply()
        assert b'"tls_required":true' in info, info
        assert not answer.startswith((b"PONG", b"+OK")), answer
        asyncio.run(asyncio.wait_for(snoop(), 60))
        with pytest.raises(PublishError, match=r"refused this device's publish on gaze\.raw"):
            asyncio.run(asyncio.wait_for(impersonate(), 30))
        wait_for(lambda: drained(server, 2, login("worker")), 30, workers[0].text)
    finally:
        codes = stop_all(workers)
        server.stop()
    text = workers[0].text()
    assert codes == [0], text
    assert "permissions violation" not in text.lower(), "the worker credential lacks something"
    assert seen == [], "a device credential read gaze it must not"
    for subject in ("gaze.raw.>", "gaze.raw.part.>", "_INBOX.>"):  # (nats-py lowers them)
        said = f'permissions violation for subscription to "{subject.lower()}"'
        assert any(said in e.lower() for e in errors), (subject, errors)
    ledger_path = tmp_path / "ledger.sqlite"
    for session in ("hmd-1.s1", "hmd-2.s2"):  # 12 s of gaze, 2 s window, 1.6 s chunks
        want = list(range(expected_chunks(12.0, session)))
        assert charge_indices(ledger_path, session) == want, (session, text)
    assert charge_indices(ledger_path, "hmd-2.fake") == []
