"""Fleet mode against real parts: worker processes (`gazeguard run --fleet`), a real Mosquitto
with MQTT v5 shared subscriptions, real LSL outlets, one SQLite ledger shared by the workers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.publish as publish
import pylsl
import pytest
from conftest import MosquittoBroker, Subscriber, until

from gazeguard.config import BrokerSettings, load_settings
from gazeguard.fleet import Fleet, RawGazeSender
from gazeguard.ledger import Ledger
from gazeguard.pipeline import Chunk, Pipeline, ReleasedChunk
from gazeguard.samples import GazeSamples
from gazeguard.service import serve_fleet
from gazeguard.simulate import SimulatedHeadset, simulate_gaze

FEATURES = ["fixation_rate", "saccade_rate", "pupil_mean"]
FAST = ["--window-s", "2", "--step-s", "0.05", "--chunk-steps", "32", "--epsilon", "0.5",
        "--budget-per-hour", "none",
        "--features", "fixation_rate,saccade_rate,pupil_mean"]  # fmt: skip


def start_worker(tmp_path: Path, broker: MosquittoBroker, *extra: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable, "-m", "gazeguard", "-v", "run", "--fleet", "--device", "fleet",
        "--broker", f"{broker.host}:{broker.port}", "--ledger", str(tmp_path / "ledger.sqlite"),
        *FAST, *extra,
    ]  # fmt: skip
    return subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=tmp_path)


def stop_workers(*procs: subprocess.Popen[str]) -> list[str]:
    """SIGTERM every worker, reap each (SIGKILL after 30 s), then check that all exited 0.

    All are stopped before any is judged: one failing worker must not leave the others running
    (an orphan keeps its broker connection, port and CPU for the rest of the suite)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    errs = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err += "\n[the worker did not stop within 30 s of SIGTERM: killed]"
        errs.append(err)
    codes = [proc.returncode for proc in procs]
    assert codes == [0] * len(procs), f"worker exit codes {codes}\n" + "\n---\n".join(errs)
    return errs


def stop_worker(proc: subprocess.Popen[str]) -> str:
    return stop_workers(proc)[0]


async def _device(broker: BrokerSettings, session: str, seed: int) -> str:
    """30 s of one simulated person's gaze, sent in 100 ms blocks (faster than real time)."""
    gaze = simulate_gaze(30.0, 120.0, seed)
    async with RawGazeSender(broker, "hmd", session) as sender:
        for start in range(0, len(gaze), 12):
            await sender.send(gaze.slice(start, start + 12))
            await asyncio.sleep(0.002)
        assert sender.owner is not None
        return sender.owner


@pytest.mark.network
def test_mqtt_fleet_spreads_sessions_over_workers_and_charges_each_once(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    workers = [start_worker(tmp_path, mosquitto, "--source", "mqtt") for _ in range(2)]
    try:
        wait_online(mosquitto, 2)
        broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)
        # A stale retained owner (a worker that died long ago) must not pass for a claim.
        ghost = json.dumps({"worker": "ghost", "time": 0.0, "nonce": "old"})
        publish.single(
            "gazeguard/raw/v1/hmd/s0/owner", ghost, qos=1, retain=True,
            hostname=mosquitto.host, port=mosquitto.port,
        )  # fmt: skip

        async def devices() -> list[str]:
            return await asyncio.gather(*(_device(broker, f"s{i}", i) for i in range(6)))

        owners = asyncio.run(devices())
        deadline = time.monotonic() + 30  # the last chunks are charged
        while time.monotonic() < deadline:
            if min(charges(tmp_path / "ledger.sqlite", f"hmd.s{i}") for i in range(6)) >= 15:
                break
            time.sleep(0.2)
    finally:
        errs = stop_workers(*workers)
    assert len(set(owners)) == 2, f"both workers should serve sessions: {owners}"
    assert "ghost" not in owners
    with Ledger(tmp_path / "ledger.sqlite", create=False) as ledger:
        for i in range(6):
            indices = [c.chunk_index for c in ledger.charges(f"hmd.s{i}")]
            # 30 s at a 2 s window and 32 × 0.05 s chunks: 17 full chunks (minus the window)
            assert len(indices) >= 15, (i, indices, errs)
            assert indices == list(range(len(indices))), "contiguous, each charged once"
            assert ledger.pending(session=f"hmd.s{i}") == []


@pytest.mark.network
def test_sender_without_worker_fails_with_advice(mosquitto: MosquittoBroker) -> None:
    broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)

    async def lonely() -> None:
        async with RawGazeSender(broker, "hmd", "nobody", claim_timeout_s=1.0):
            pass

    with pytest.raises(Exception, match="no gazeguard worker claimed session"):
        asyncio.run(lonely())


@pytest.mark.network
def test_lsl_fleet_serves_every_discovered_stream(
    tmp_path: Path, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    name = f"fleet-{unique_id}"
    heads = [SimulatedHeadset(250, seed=i, name=name, source_id=f"{name}-{i}") for i in range(3)]
    for h in heads:
        h.start()
    try:
        worker = start_worker(tmp_path, mosquitto, "--source", "lsl", "--stream-name", name)
        deadline = time.monotonic() + 40
        done: set[str] = set()
        while time.monotonic() < deadline and len(done) < 3:
            time.sleep(0.5)
            if (tmp_path / "ledger.sqlite").exists():
                with Ledger(tmp_path / "ledger.sqlite", create=False) as ledger:
                    done = {s for s in ledger.sessions() if ledger.state(s).chunks >= 1}
        err = stop_worker(worker)
    finally:
        for h in heads:
            h.stop()
    assert done == {f"{name}-{i}" for i in range(3)}, err  # one session per outlet


def charges(ledger_path: Path, session: str) -> int:
    """Chunks charged to ``session`` so far (0 before the workers created the ledger)."""
    if not ledger_path.exists():
        return 0
    with Ledger(ledger_path, create=False) as ledger:
        return len(ledger.charges(session))


def liveness(sub: Subscriber) -> dict[str, bytes]:
    """The last liveness message of every worker the subscriber saw."""
    with sub.lock:
        return {t.rsplit("/", 1)[1]: p for t, p, _ in sub.messages if "/workers/" in t}


def blocks_of(gaze: GazeSamples) -> list[GazeSamples]:
    """``gaze`` cut into the 12-sample blocks a device sends (100 ms at 120 Hz)."""
    return [gaze.slice(start, start + 12) for start in range(0, len(gaze), 12)]


@contextlib.contextmanager
def frozen(worker: subprocess.Popen[str]) -> Iterator[None]:
    """The worker does not run inside the block (SIGSTOP, then SIGCONT whatever happens)."""
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(worker.pid, signal.SIGCONT)


async def send_paced(sender: RawGazeSender, blocks: list[GazeSamples], pause_s: float) -> None:
    """Send ``blocks`` in order, ``pause_s`` apart (a headset's pace, compressed)."""
    for block in blocks:
        await sender.send(block)
        await asyncio.sleep(pause_s)


async def until_released(sender: RawGazeSender) -> None:
    """Until every block is sent (an owner, nothing buffered) and then, the device silent, the
    worker lets the session go: it has read every block, and its closing count is final."""
    await until(lambda: sender.owner is not None and not sender._buffer, 20)
    await until(lambda: sender.owner is None, 30)


def wait_online(broker: MosquittoBroker, n: int) -> None:
    """Block until ``n`` workers say ``online`` (retained; a worker says so once subscribed)."""
    sub = Subscriber(broker, f"ready-{time.monotonic_ns()}")
    try:
        online = lambda: sum(v == b"online" for v in liveness(sub).values()) >= n  # noqa: E731
        assert sub.wait_for(online, 60), f"{n} workers did not come online: {liveness(sub)}"
    finally:
        sub.close()


@pytest.mark.network
def test_a_killed_workers_session_moves_to_another_worker(
    tmp_path: Path, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    """SIGKILL the worker serving a session: its will marks it offline, the device buffers and is
    claimed by the other worker, chunk numbering and the spent budget continue, and every
    charged chunk reaches a subscriber."""
    workers = [start_worker(tmp_path, mosquitto, "--source", "mqtt") for _ in "ab"]
    procs = {w.pid: w for w in workers}
    sub = Subscriber(mosquitto, f"sub-{unique_id}")
    ledger_path = tmp_path / "ledger.sqlite"
    session = "hmd.failover"
    gaze = simulate_gaze(40.0, 120.0, seed=5)
    blocks = blocks_of(gaze)
    before_kill = 0

    def charged() -> int:
        return charges(ledger_path, session)

    async def device() -> RawGazeSender:
        nonlocal before_kill
        broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)
        async with RawGazeSender(broker, "hmd", "failover") as sender:
            # 12 s of gaze: ~6 chunks at a 2 s window, 1.6 s chunks
            await send_paced(sender, blocks[:120], 0.005)
            await until(lambda: charged() >= 4, 20)
            before_kill = charged()
            owner = procs[int(str(sender.owner).rsplit("-", 1)[1])]
            owner.send_signal(signal.SIGKILL)
            owner.communicate(timeout=10)  # reap it and close its stderr pipe
            await until(lambda: sender.owner != sender.owners[0], 10)  # the will arrives
            # buffered until the other worker claims, then in order
            await send_paced(sender, blocks[120:], 0.005)
            await until(lambda: sender.owner is not None, 10)
            return sender

    try:
        wait_online(mosquitto, 2)
        sender = asyncio.run(device())
        # 28 s more gaze on the new worker: its window starts empty, then ~16 more chunks.
        assert sub.wait_for(lambda: charged() >= before_kill + 12, timeout=30), charged()
        assert sub.wait_for(  # (the live worker may still be charging the last chunks)
            lambda: (
                {c.chunk_index for c in sub.chunks() if c.session == session}
                == set(range(charged()))
            ),
            timeout=15,
        ), "every charged chunk, the dead worker's included, reaches the subscriber"
    finally:
        errs = stop_workers(*(p for p in procs.values() if p.poll() is None))
        sub.wait_for(
            lambda: len(liveness(sub)) == 2 and set(liveness(sub).values()) == {b"offline"}, 5
        )
        sub.close()
    assert len(sender.owners) == 2, sender.owners
    a, b = sender.owners
    assert a != b
    assert sender.dropped_blocks == 0
    assert before_kill >= 4
    with Ledger(ledger_path, create=False) as ledger:
        records = ledger.charges(session)
        assert [c.chunk_index for c in records] == list(range(len(records))), errs
        assert ledger.pending(session=session) == []
        per_chunk = {round(c.total, 6) for c in records}
        assert len(per_chunk) == 1, "the new worker charges what the old one did"
        assert ledger.state(session).spent == pytest.approx(sum(c.total for c in records))
    alive = liveness(sub)
    assert alive[a] == b"offline", "the killed worker's will was published"
    assert alive[b] == b"offline", "a clean stop says so too"


@pytest.mark.network
def test_a_released_session_is_claimed_again_when_the_device_resumes(
    tmp_path: Path, mosquitto: MosquittoBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device silent past fleet.idle_timeout_s is let go; its next block re-claims it."""
    monkeypatch.setenv("GAZEGUARD_FLEET__IDLE_TIMEOUT_S", "1")
    worker = start_worker(tmp_path, mosquitto, "--source", "mqtt")
    gaze = simulate_gaze(12.0, 120.0, seed=2)
    broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)

    async def device() -> tuple[RawGazeSender, str | None]:
        async with RawGazeSender(broker, "hmd", "pause") as sender:
            await sender.send(gaze.slice(0, 12))
            await until(lambda: sender.owner is None, 5)  # idle: the worker lets go
            during_pause = sender.owner
            for start in range(12, len(gaze), 12):
                await sender.send(gaze.slice(start, start + 12))
                await asyncio.sleep(0.005)
            await until(lambda: sender.owner is not None, 5)
            return sender, during_pause

    try:
        wait_online(mosquitto, 1)
        sender, during_pause = asyncio.run(device())
        deadline = time.monotonic() + 30  # the last chunks are charged
        while charges(tmp_path / "ledger.sqlite", "hmd.pause") < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        err = stop_worker(worker)
    assert during_pause is None
    assert len(sender.owners) == 2, (sender.owners, err)
    assert sender.dropped_blocks == 0
    with Ledger(tmp_path / "ledger.sqlite", create=False) as ledger:
        indices = [c.chunk_index for c in ledger.charges("hmd.pause")]
    # ~11.9 s after the pause at a 2 s window and 1.6 s chunks: 6 chunks
    assert len(indices) >= 5, (indices, err)
    assert indices == list(range(len(indices)))


@pytest.mark.network
def test_a_broker_restart_loses_no_block_and_keeps_the_sessions_worker(
    tmp_path: Path, mosquitto: MosquittoBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mosquitto (no persistence: it forgets every retained claim) stops mid-stream and comes
    back on the same port: the device buffers, reconnects, the owner renews its claim, and every
    block reaches the worker — the feature window is never interrupted. The device then falls
    silent until its worker lets the session go, so the worker's count is final (stopping it
    as soon as the last chunk is charged left the blocks after it unread: 4740 of 4800)."""
    monkeypatch.setenv("GAZEGUARD_FLEET__IDLE_TIMEOUT_S", "5")
    workers = [start_worker(tmp_path, mosquitto, "--source", "mqtt") for _ in "ab"]
    gaze = simulate_gaze(40.0, 120.0, seed=8)
    blocks = blocks_of(gaze)
    ledger_path = tmp_path / "ledger.sqlite"
    session = "hmd.outage"

    def charged() -> int:
        return charges(ledger_path, session)

    async def device() -> RawGazeSender:
        broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)
        async with RawGazeSender(broker, "hmd", "outage") as sender:
            await send_paced(sender, blocks[:100], 0.005)
            await until(lambda: charged() >= 3, 20)
            mosquitto.stop()
            # 10 s of gaze while the broker is away: buffered
            await send_paced(sender, blocks[100:200], 0.005)
            mosquitto.start()
            await send_paced(sender, blocks[200:], 0.005)
            await until_released(sender)
            return sender

    try:
        wait_online(mosquitto, 2)
        sender = asyncio.run(device())
    finally:
        errs = stop_workers(*workers)
    assert sender.reconnects == 1
    assert len(sender.owners) == 1, f"the owner renewed its claim: {sender.owners}\n{errs}"
    assert sender.dropped_blocks == 0
    with Ledger(ledger_path, create=False) as ledger:
        records = ledger.charges(session)
    # 40 s of uninterrupted gaze, a 2 s window and 1.6 s chunks: 23 chunks.
    assert [c.chunk_index for c in records] == list(range(23)), errs
    # Every sample reached the owner, once: nothing lost in the outage.
    closed = re.search(r"session 'hmd\.outage' closed \((\d+) samples", "".join(errs))
    assert closed is not None, errs
    assert int(closed.group(1)) == len(gaze)


@pytest.mark.network
def test_a_worker_behind_on_its_charges_keeps_sessions_whose_blocks_wait_in_its_queue(
    tmp_path: Path,
    mosquitto: MosquittoBroker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A slow disk held a worker's charges up for longer than the idle timeout. The worker let
    sessions go while their blocks, received and acknowledged to the broker, still waited in its
    own queue, then dropped them as blocks of closed sessions (seen under load: 67 of 90 blocks
    per session read). Here the first charge takes 3 s and the idle timeout is 1 s: the session
    keeps its one owner, every sample is read once, and no block is dropped."""
    ledger_path = tmp_path / "ledger.sqlite"
    settings = load_settings(
        None,
        device="fleet",
        fleet={"enabled": True, "idle_timeout_s": 1.0},
        ingest={"source": "mqtt"},
        features={"window_s": 2.0, "step_s": 0.05},
        mechanism={"chunk_steps": 32, "epsilon": 0.5, "features": FEATURES},
        ledger={"path": str(ledger_path), "budget_per_hour": None},
        broker={"host": mosquitto.host, "port": mosquitto.port},
    )
    release = Pipeline.release
    slowed = threading.Event()

    def slow_release(self: Pipeline, chunk: Chunk) -> ReleasedChunk | None:
        if not slowed.is_set():  # the first charge: a disk that takes 3 s to sync
            slowed.set()
            time.sleep(3.0)
        return release(self, chunk)

    monkeypatch.setattr(Pipeline, "release", slow_release)
    gaze = simulate_gaze(8.0, 120.0, seed=31)

    async def main() -> tuple[Fleet, RawGazeSender]:
        stop = asyncio.Event()
        worker = asyncio.create_task(serve_fleet(settings, stop=stop))
        broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)
        try:
            async with RawGazeSender(broker, "hmd", "behind") as sender:
                await send_paced(sender, blocks_of(gaze), 0.02)
                await until_released(sender)
        finally:
            stop.set()
        return await worker, sender

    with caplog.at_level(logging.INFO, logger="gazeguard.fleet"):
        fleet, sender = asyncio.run(main())
    assert slowed.is_set()
    assert fleet.late_blocks == 0, caplog.text
    assert fleet.closed == ["hmd.behind"], caplog.text
    assert len(sender.owners) == 1, sender.owners
    closed = re.search(r"session 'hmd\.behind' closed \((\d+) samples", caplog.text)
    assert closed is not None, caplog.text
    assert int(closed.group(1)) == len(gaze)
    with Ledger(ledger_path, create=False) as ledger:  # 8 s, 2 s window, 1.6 s chunks: 3
        assert [c.chunk_index for c in ledger.charges("hmd.behind")] == [0, 1, 2]


@pytest.mark.network
def test_a_worker_frozen_longer_than_the_idle_timeout_keeps_its_session(
    tmp_path: Path, mosquitto: MosquittoBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that does not run for a while (SIGSTOP here; a VM pause or a starved CPU in the
    field) hears nothing meanwhile, but its device's blocks wait at the broker. Its idle sweep
    used to count that time as the device's silence: resuming after a freeze longer than
    ``fleet.idle_timeout_s`` it let the session go before reading what was queued (seen in the
    CI-like soak: the restarted-broker test below, frozen past its 5 s timeout under load)."""
    monkeypatch.setenv("GAZEGUARD_FLEET__IDLE_TIMEOUT_S", "2")
    worker = start_worker(tmp_path, mosquitto, "--source", "mqtt")
    gaze = simulate_gaze(16.0, 120.0, seed=13)
    blocks = blocks_of(gaze)
    ledger_path, session = tmp_path / "ledger.sqlite", "hmd.frozen"

    async def device() -> RawGazeSender:
        broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)
        async with RawGazeSender(broker, "hmd", "frozen") as sender:
            await send_paced(sender, blocks[:50], 0.002)
            await until(lambda: charges(ledger_path, session) >= 1, 20)
            with frozen(worker):
                await send_paced(sender, blocks[50:100], 0.002)  # queued for it at the broker
                await asyncio.sleep(4.0)  # the freeze: twice the idle timeout
            await send_paced(sender, blocks[100:], 0.002)
            await until_released(sender)
            return sender

    try:
        wait_online(mosquitto, 1)
        sender = asyncio.run(device())
    finally:
        err = stop_worker(worker)
    assert len(sender.owners) == 1, (sender.owners, err)
    closed = re.findall(r"session 'hmd\.frozen' closed \((\d+) samples", err)
    assert closed == [str(len(gaze))], err  # closed once, every sample read


@pytest.mark.network
def test_blocks_a_restarted_broker_acknowledged_but_lost_are_sent_again(
    tmp_path: Path,
    mosquitto: MosquittoBroker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker without persistence acknowledges a block (QoS 1) and queues it for the worker;
    if it dies before delivering it, the block is gone, though the device saw it acknowledged
    (CI: 4740 of 4800 samples after a restart). The worker is stopped (SIGSTOP) so the broker
    queues 100 blocks for it, then the broker restarts: the owner's renewed claim says through
    which sample time it holds, and the device sends every later block again. Also: the first
    send after the restart went out on the dead socket and waited aiomqtt's 10 s for a PUBACK,
    so the worker let the silent session go and the device claimed it again (two owners)."""
    monkeypatch.setenv("GAZEGUARD_FLEET__IDLE_TIMEOUT_S", "5")
    caplog.set_level(logging.DEBUG, logger="gazeguard.fleet")  # the device's side, on failure
    worker = start_worker(tmp_path, mosquitto, "--source", "mqtt")
    gaze = simulate_gaze(24.0, 120.0, seed=12)
    blocks = blocks_of(gaze)
    ledger_path, session = tmp_path / "ledger.sqlite", "hmd.queued"

    async def device() -> RawGazeSender:
        broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)
        async with RawGazeSender(broker, "hmd", "queued") as sender:
            await send_paced(sender, blocks[:50], 0.002)
            await until(lambda: charges(ledger_path, session) >= 1, 20)
            with frozen(worker):  # the broker queues what follows for it
                for block in blocks[50:150]:
                    await sender.send(block)  # acknowledged by the broker: not buffered
                assert not sender._buffer
                mosquitto.stop()  # ... and forgotten with it
            mosquitto.start()
            await send_paced(sender, blocks[150:], 0.002)
            await until_released(sender)
            return sender

    failure: BaseException | None = None
    try:
        wait_online(mosquitto, 1)
        sender = asyncio.run(device())
    except BaseException as exc:
        failure = exc
        raise
    finally:
        err = stop_worker(worker)
        if failure is not None:  # the worker's side of a device that waited in vain
            failure.add_note(f"worker log (tail):\n{err[-6000:]}")
    assert len(sender.owners) == 1, (sender.owners, err)
    assert sender.resent_blocks > 0, err
    closed = re.search(r"session 'hmd\.queued' closed \((\d+) samples", err)
    assert closed is not None, err
    assert int(closed.group(1)) == len(gaze), err
    with Ledger(ledger_path, create=False) as ledger:  # 24 s, 2 s window, 1.6 s chunks: 13
        assert [c.chunk_index for c in ledger.charges(session)] == list(range(13)), err


def test_a_renewed_claim_resends_the_blocks_after_through_and_keeps_the_buffer_bound() -> None:
    """The resend rule on its own: blocks sent after the renewal's ``through`` go back in front
    of the buffer, in order; a renewal without ``through`` (the worker holds no sample yet)
    resends all; a new claim (``None``) resends none; the buffer keeps its bound, the oldest
    going first, counted as dropped."""
    broker = BrokerSettings(host="127.0.0.1", port=1)
    sender = RawGazeSender(broker, "hmd", "rule", max_buffered=4)
    blocks = [(float(i), f"b{i}".encode()) for i in range(4)]

    def sent(*items: tuple[float, bytes]) -> None:
        sender._sent.clear()
        sender._sent.extend(items)

    sent(*blocks[:3])
    sender._buffer.append(blocks[3])
    sender._resend_after(0.0)
    assert list(sender._buffer) == [blocks[1], blocks[2], blocks[3]]
    assert (sender.resent_blocks, sender.dropped_blocks, len(sender._sent)) == (2, 0, 0)
    sent(*blocks[:3])
    sender._resend_after(-math.inf)  # no "through": everything sent, and the bound holds
    assert list(sender._buffer) == [blocks[2], blocks[1], blocks[2], blocks[3]]
    assert sender.dropped_blocks == 2
    sent(*blocks[:3])
    sender._resend_after(None)
    assert len(sender._buffer) == 4
    assert not sender._sent


@pytest.mark.network
def test_a_hello_minted_as_the_broker_died_does_not_cost_the_session_its_worker(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """The race behind CI's "the owner renewed its claim: [a, b]": the owner's will arrives as
    the broker shuts down, the device's grace period ends before it has noticed its own
    connection is dead, and it mints a hello (a new nonce) that never leaves. After the restart
    the owner renews its claim with the nonce it answered; the device must take that renewal,
    not wait it out and ask the other worker. The state is set directly (the nonce of an unsent
    hello); before the fix the session moved or was claimed twice."""
    workers = [start_worker(tmp_path, mosquitto, "--source", "mqtt") for _ in "ab"]
    gaze = simulate_gaze(20.0, 120.0, seed=9)
    blocks = blocks_of(gaze)

    async def device() -> tuple[RawGazeSender, str | None]:
        broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)
        async with RawGazeSender(broker, "hmd", "lost-hello") as sender:
            await send_paced(sender, blocks[:40], 0.005)
            first = sender.owner
            mosquitto.stop()
            sender._nonce = "unsent-hello"  # the state the race leaves
            mosquitto.start()
            await send_paced(sender, blocks[40:], 0.005)
            await until(lambda: sender.owner is not None and not sender._buffer, 20)
            return sender, first

    try:
        wait_online(mosquitto, 2)
        sender, first = asyncio.run(device())
    finally:
        errs = stop_workers(*workers)
    assert first is not None
    assert sender.reconnects == 1
    assert sender.owners == [first], errs
    assert sender.owner == first


@pytest.mark.network
def test_a_worker_dates_gaze_on_the_devices_clock(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """Blocks carry the device host's clock. A device that states its Unix offset in the hello
    (``gazeguard forward`` does) has its gaze dated on *its* clock by a worker on any host; before,
    the worker added its own LSL offset, so hosts with different uptimes shifted the session's
    gaze times (cohort buckets misaligned, windows moved on failover)."""
    worker = start_worker(tmp_path, mosquitto, "--source", "mqtt")
    gaze = simulate_gaze(12.0, 120.0, seed=5)  # stamped 0 … 12 s on the "device's" clock
    blocks = blocks_of(gaze)
    offset = 1_600_000_000.0  # the device's Unix time minus its sample clock
    ledger_path, session = tmp_path / "ledger.sqlite", "hmd.dated"

    async def device() -> None:
        broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)
        async with RawGazeSender(broker, "hmd", "dated", unix_offset=lambda: offset) as sender:
            for block in blocks:
                await sender.send(block)
                await asyncio.sleep(0.002)
            await until(lambda: charges(ledger_path, session) >= 3, 20)

    try:
        wait_online(mosquitto, 1)
        asyncio.run(device())
    finally:
        err = stop_worker(worker)
    with Ledger(ledger_path, create=False) as ledger:
        records = ledger.charges(session)
    assert len(records) >= 3, err
    for r in records:
        assert offset <= r.gaze_start < r.gaze_end <= offset + 12.0


@pytest.mark.network
def test_one_block_stamped_ahead_of_the_clock_does_not_stop_a_raw_session(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """Issue 15.2 on the fleet's raw path: a block stamped 1e6 s ahead used to become the
    session's "last" time, so every later sample was dropped as not newer and the session
    released nothing more. It is now dropped as ahead of the clock, counted, and the rest
    flows."""
    worker = start_worker(tmp_path, mosquitto, "--source", "mqtt")
    gaze = simulate_gaze(12.0, 120.0, seed=6)
    blocks = blocks_of(gaze)
    poison = GazeSamples.from_arrays([1e6, 1e6 + 0.01], [0.0, 0.0], [0.0, 0.0])
    offset = time.time() - 30.0  # the gaze ended 18 s ago on the device's clock
    ledger_path, session = tmp_path / "ledger.sqlite", "hmd.poison"

    async def device() -> None:
        broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)
        async with RawGazeSender(broker, "hmd", "poison", unix_offset=lambda: offset) as sender:
            for i, block in enumerate(blocks):
                if i == 40:
                    await sender.send(poison)
                await sender.send(block)
                await asyncio.sleep(0.002)
            await until(lambda: charges(ledger_path, session) >= 5, 20)

    try:
        wait_online(mosquitto, 1)
        asyncio.run(device())
    finally:
        err = stop_worker(worker)
    # 12 s of gaze, a 2 s window, 1.6 s chunks: 6 chunks (before: 1, all before the poison)
    assert charges(ledger_path, session) >= 5, err
    assert "gaze stamped ahead of the clock dropped" in err
    closed = re.search(r"(\d+) dropped as not newer, (\d+) as ahead of the clock", err)
    assert closed is not None, err
    assert (int(closed.group(1)), int(closed.group(2))) == (0, 2)


@pytest.mark.network
def test_a_device_whose_unix_clock_runs_ahead_keeps_its_fresh_gaze(
    tmp_path: Path, mosquitto: MosquittoBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The future rule must not trust two hosts' Unix clocks to agree: a headset whose wall clock
    runs 5 s ahead of the worker's states a Unix offset 5 s too large, so by the Unix clocks its
    freshest 5 s of gaze looked early and were dropped. Its hello also says "now" on the
    blocks' own clock, and the worker measures from that."""
    monkeypatch.setenv("GAZEGUARD_FLEET__IDLE_TIMEOUT_S", "3")
    worker = start_worker(tmp_path, mosquitto, "--source", "mqtt")
    gaze = simulate_gaze(12.0, 120.0, seed=7)
    m0 = time.monotonic()

    def clock() -> float:  # the headset's LSL clock: 30 s since it booted
        return 30.0 + time.monotonic() - m0

    fresh = GazeSamples(gaze.timestamps + 18.0, gaze.x_deg, gaze.y_deg, gaze.pupil_mm, gaze.valid)
    blocks = blocks_of(fresh)

    async def device() -> None:
        broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)
        async with RawGazeSender(
            broker, "hmd", "skewed", clock=clock, unix_offset=lambda: time.time() + 5.0 - clock()
        ) as sender:
            for block in blocks:  # stamped 18-30 s: all of it already past on its clock
                await sender.send(block)
            await until(lambda: sender.owner is None, 30)  # silent: closed, every block read

    try:
        wait_online(mosquitto, 1)
        asyncio.run(device())
    finally:
        err = stop_worker(worker)
    closed = re.search(r"closed \((\d+) samples, (\d+) dropped as not newer, (\d+) as ahead", err)
    assert closed is not None, err
    assert tuple(map(int, closed.groups())) == (len(gaze), 0, 0), err
    assert charges(tmp_path / "ledger.sqlite", "hmd.skewed") >= 5, err


@pytest.mark.network
def test_forward_sends_a_headsets_lsl_stream_to_a_fleet_worker(
    tmp_path: Path, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    """`gazeguard forward` (real LSL outlet → raw MQTT) feeds `gazeguard run --fleet`."""
    name = f"fwd-{unique_id}"
    head = SimulatedHeadset(120, seed=3, name=name, source_id=f"{name}-src")
    head.start()
    worker = start_worker(tmp_path, mosquitto, "--source", "mqtt")
    try:
        wait_online(mosquitto, 1)
        cmd = [
            sys.executable, "-m", "gazeguard", "forward", "--broker",
            f"{mosquitto.host}:{mosquitto.port}", "--device", "hmd", "--stream-name", name,
            "--duration", "9",
        ]  # fmt: skip
        fwd = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        deadline = time.monotonic() + 30  # the last chunks are charged
        path, session = tmp_path / "ledger.sqlite", f"hmd.{name}-src"
        while charges(path, session) < 3 and time.monotonic() < deadline and fwd.returncode == 0:
            time.sleep(0.2)
    finally:
        err = stop_worker(worker)
        head.stop()
    assert fwd.returncode == 0, fwd.stderr
    assert f"session hmd.{name}-src" in fwd.stderr
    assert "claimed by worker" in fwd.stderr
    with Ledger(tmp_path / "ledger.sqlite", create=False) as ledger:
        indices = [c.chunk_index for c in ledger.charges(f"hmd.{name}-src")]
    # ~9 s of gaze, a 2 s window and 1.6 s chunks: 4 chunks (minus stream start-up).
    assert len(indices) >= 3, (indices, fwd.stderr, err)
    assert indices == list(range(len(indices)))


@pytest.mark.network
def test_a_fleet_worker_publishes_cohort_aggregates_charged_to_every_session(
    tmp_path: Path, mosquitto: MosquittoBroker, unique_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`gazeguard run --fleet --cohort lab`: three devices stream 9 s of gaze in real time; every
    2 s bucket's aggregate reaches a subscriber (schema-valid), each contributing session is
    charged once per bucket in its own ledger entry, and the chunks still flow. (The label
    histogram is covered in test_cohort: the shipped model needs 30 s windows.)"""
    import jsonschema  # noqa: PLC0415

    from gazeguard.cohort_message import CohortMessage, shipped_schema  # noqa: PLC0415

    caplog.set_level(logging.DEBUG, logger="gazeguard.fleet")  # the devices' side, on failure

    cmd = [
        sys.executable, "-m", "gazeguard", "-v", "run", "--fleet", "--device", "fleet",
        "--broker", f"{mosquitto.host}:{mosquitto.port}",
        "--ledger", str(tmp_path / "ledger.sqlite"),
        "--source", "mqtt", "--window-s", "2", "--step-s", "0.05", "--chunk-steps", "32",
        "--budget-per-hour", "200", "--features", "fixation_rate,saccade_rate,pupil_mean",
        "--cohort", "lab", "--bucket-s", "2",
    ]  # fmt: skip
    sub = Subscriber(mosquitto, f"sub-{unique_id}")
    worker = subprocess.Popen(
        cmd,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={
            **os.environ,
            "GAZEGUARD_COHORT__GRACE_S": "1",
            "GAZEGUARD_FLEET__IDLE_TIMEOUT_S": "2",
        },
    )
    broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)

    def closed() -> set[str]:  # sessions the worker let go: it read all their blocks first
        return {m.session for m in sub.statuses() if m.state == "stopped"}

    async def device(session: str, seed: int) -> None:
        gaze = simulate_gaze(9.0, 120.0, seed)
        now = pylsl.local_clock()  # the worker reads sample times on this host's LSL clock
        gaze = GazeSamples(gaze.timestamps + now, gaze.x_deg, gaze.y_deg, gaze.pupil_mm, gaze.valid)
        async with RawGazeSender(broker, "hmd", session) as sender:
            for start in range(0, len(gaze), 12):  # real time: 0.1 s of gaze per 0.1 s
                await sender.send(gaze.slice(start, start + 12))
                await asyncio.sleep(0.1)

    topic = "gazeguard/v1/cohort/lab/aggregates"
    failure: BaseException | None = None
    try:
        wait_online(mosquitto, 1)

        async def devices() -> None:
            await asyncio.gather(*(device(f"c{i}", 20 + i) for i in range(3)))

        asyncio.run(devices())
        # A loaded machine's worker can be seconds behind the devices (slow fsyncs): stopping it
        # then cut the sessions short (2 of 4 chunks). It lets each go once its device is silent
        # and every block it received is read.
        sessions = {f"hmd.c{i}" for i in range(3)}
        assert sub.wait_for(lambda: closed() >= sessions, 60), ("sessions let go", closed())
        assert sub.wait_for(lambda: len([m for m in sub.messages if m[0] == topic]) >= 3, 20), (
            "aggregates of the closed buckets arrive"
        )
    except BaseException as exc:
        failure = exc
        raise
    finally:
        err = stop_worker(worker)
        if failure is not None:  # the worker's side of aggregates that did not come
            failure.add_note(f"worker log (tail):\n{err[-8000:]}")
        with sub.lock:
            messages = list(sub.messages)
        sub.close()
    aggregates = [json.loads(p) for t, p, _ in messages if t == topic]
    for a in aggregates:
        jsonschema.validate(a, shipped_schema())
    parsed = [CohortMessage.model_validate(a) for a in aggregates]
    assert {m.cohort for m in parsed} == {"lab"}
    assert parsed[0].classes == []  # no --cohort-model: features and count only
    assert [f.name for f in parsed[0].features] == ["fixation_rate", "saccade_rate", "pupil_mean"]
    assert all(m.epsilon_per_hour <= 100.0 + 1e-9 for m in parsed)  # half of 200
    buckets = {m.bucket for m in parsed}
    with Ledger(tmp_path / "ledger.sqlite", create=False) as ledger:
        for i in range(3):
            charged = [c.chunk_index for c in ledger.charges(f"hmd.c{i}", "cohort")]
            assert len(charged) == len(set(charged)), "a bucket is charged once per session"
            assert len(ledger.charges(f"hmd.c{i}")) >= 3, ("the chunks still flow", err)
        assert ledger.verify() == []
        # every published aggregate's bucket was charged to at least one session
        all_charged = {
            c.chunk_index for i in range(3) for c in ledger.charges(f"hmd.c{i}", "cohort")
        }
        assert buckets <= all_charged
    receipts = [t for t, _, _ in messages if t.endswith("/cohort")]
    assert receipts, "contributing sessions get a receipt on their own topic"
    assert {t.split("/")[3] for t in receipts} <= {"hmd.c0", "hmd.c1", "hmd.c2"}
