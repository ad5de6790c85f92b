"""Fleet scaling: concurrent 120 Hz sessions per worker process, raw gaze on JetStream.

Per *level* (L sessions, W worker processes), everything fresh: a local ``nats-server -js`` (the
raw gaze stream, ``--partitions`` partitions), a local Mosquitto for the privatized chunks ($SYS
every second), W × ``gazeguard run --fleet --source jetstream`` (default features: W = 30 s,
s = 0.5 s, n = 32, all 48 features, DCFPA; one SQLite ledger shared by the workers), one or two
load-generator processes (this script with ``--generator``) running L ``JetStreamSender``
devices in real time — a 120-sample block (1 s of 120 Hz gaze from ``simulate_gaze``) every
second per session, what ``gazeguard forward`` sends by default (``fleet.nats.block_s``; other
sizes with ``--block-samples``, e.g. 12 for 100 ms), each acknowledged by the stream before the
next, session starts spread uniformly over one chunk period (16 s; ``--starts lattice``: on the
0.5 s step lattice, so that half the sessions send each block at one instant) — and a paho-mqtt
subscriber
(this process) on every privatized chunk topic. With 2 workers the
workers balance the partitions (``fleet.nats.balance``): the partitions each holds at the end
(its last balance report) and the sessions it opened are reported.

Device clocks: every generator session stamps its gaze on one clock (seconds since the level's
start, sent with that Unix offset, as NTP-synced headsets agree), so without the workers'
per-session public phase every session's chunks would come due on the same ticks.

Latency of a chunk: from the moment it came due — its last window's end on the device clock plus
the detector's look-behind (0.5 s) and ``ingest.late_after_s`` (3 s), when a worker releases a
chunk the gaze completed earlier, or the send of the block that completed it if that was later
(computed offline by running the same blocks through the same ``FeatureExtractor`` and
``Chunker`` on the worker's grid) — to the subscriber's receipt of the privatized chunk. This
includes the stream, the ledger's commit and the MQTT broker: "due → delivered".

A level is **sustained** when: no sample loss (Mosquitto's ``$SYS/broker/publish/messages/dropped``
did not grow, and every chunk the sent blocks complete was received), p99 ≤ 50 ms, and the load
generators kept real time (p99 send lag ≤ 50 ms; otherwise the level is marked generator-limited).
Worker CPU% (of one core, psutil, all threads) is measured while every session emits feature
vectors. Levels ramp (``--levels``) until one fails, first with 1 worker, then 2. Each level
runs ``--repeats`` times (3) and reports its slowest run (highest p99, fewest sessions per busy
core) with the spread; it is sustained only if every run was.

``--modes``: ``pinned`` puts the one worker alone on CPU 0 and NATS, Mosquitto, the generators
and this process on CPU 1 (it measures the worker, not the contention; the targets are stated
on it); ``unpinned`` lets them all share both cores. Every worker serves its operator metrics
with the tail profile (``metrics.tail``): each run's result keeps its batch, GC-pause,
loop-stall, charge and release histograms. ``--profile`` runs py-spy on worker 0 of the
largest level (``pip install py-spy``).

``--baseline PATH`` compares against another checkout of gazeguard in the same run: each level
runs the baseline's workers (``PYTHONPATH=PATH``) and this checkout's, interleaved (the load
generators, broker and subscriber are this checkout's); each ramps until it fails, and the table
gives both and the ratio of sessions per busy core (sessions / worker CPU cores, robust to other
load on the machine as long as the worker keeps up; p99 is not).

    python bench/bench_fleet.py [--levels 50,100,200,300,400,600,800] [--repeats 3] [--quick]
        [--modes pinned,unpinned] [--baseline /path/to/checkout]

prints a table and writes ``bench/results/fleet.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import uvloop
from _harness import (
    RESULTS,
    Broker,
    NatsServer,
    ProcessMeter,
    Subscriber,
    latency_stats,
    load_now,
    machine,
    mosquitto,
    nats_server,
    write_results,
)

from gazeguard.config import IngestSettings, NatsSettings
from gazeguard.core.chunking import Chunker
from gazeguard.core.samples import GazeSamples
from gazeguard.runtime.jetstream import JetStreamSender
from gazeguard.runtime.pipeline import on_grid, session_phase
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal.events import LOOKBEHIND_S
from gazeguard.signal.features import FEATURES, FeatureExtractor

RATE_HZ = 120.0
# samples per raw block (--block-samples): what `gazeguard forward` sends, 1 s at 120 Hz
BLOCK = round(NatsSettings().block_s * RATE_HZ)
N_STEPS = 32
PERSONS = 16  # distinct simulated people; session i is person i % PERSONS
P99_TARGET_MS = 50.0
#: A chunk comes due this long after its last window's end plus the look-behind (the workers'
#: default ingest.late_after_s): its latency counts from then.
LATE_AFTER_S = IngestSettings().late_after_s
LAG_LIMIT_MS = 50.0
TARGET_SESSIONS = 900  # sustained by one worker, in every run
TARGET_PER_CORE = 1500  # sessions per busy core, in the slowest run
MOONSHOT_PER_CORE = 2000
ROOT = Path(__file__).resolve().parents[1]  # this checkout
LOGS = RESULTS / "logs"  # raw py-spy profiles (collapsed stacks, for flame graphs)
WARNINGS_KEPT = 20  # a worker's first warning lines kept in its run's result
DEVICE = "gen"
OPENED = re.compile(r"session '([^']+)' opened")
REFUSED = re.compile(r"refusing session '([^']+)'")
METRICS_URL = re.compile(r"operator metrics .* on (http://\S+/metrics)")
#: A worker's balance report: the partitions it holds (logged when that changes).
HOLDS = re.compile(r"holds partitions \[([\d, ]*)\]; assigned")


# ------------------------------------------------------------------------------ gaze and chunks
def person_gaze(person: int, seconds: float) -> GazeSamples:
    """``seconds`` of simulated person ``person`` at 120 Hz (deterministic)."""
    return simulate_gaze(seconds + 1.0, RATE_HZ, 1000 + person)


@functools.cache
def completing_blocks(
    person: int, seconds: float, window_s: float, step_s: float, block: int, start_s: float
) -> list[int]:
    """For chunk c = 0, 1, …: the index of the ``block``-sample block whose arrival completes
    it, for a session whose release grid starts ``start_s`` after its first sample."""
    gaze = person_gaze(person, seconds)
    blocks = round(seconds * RATE_HZ / block)
    start = float(gaze.timestamps[0]) + start_s
    fx = FeatureExtractor(window_s, step_s, rate_hz=RATE_HZ, start_s=start)
    chunker = Chunker(len(FEATURES), N_STEPS, 0)
    out: list[int] = []
    for b in range(blocks):
        X, t = fx.push(gaze.slice(block * b, block * (b + 1)))
        out.extend(b for _ in chunker.add(X, t))
    return out


# ------------------------------------------------------------------------------ pinning
#: ``--modes pinned``: the worker on this CPU, everything else (NATS, Mosquitto, the load
#: generators, this process's subscriber) on the other.
WORKER_CPU, OTHER_CPU = 0, 1


def pin_process(pid: int, cpu: int) -> None:
    """Every thread of process ``pid`` onto ``cpu`` (a mask is per thread: setting the process's
    leaves the threads it already started where they were)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), {cpu})


# ------------------------------------------------------------------------------ load generator
async def generate(args: argparse.Namespace) -> None:
    """``--generator``: run sessions ``first … first+count-1`` in real time, save send times."""
    block, block_s = args.block_samples, args.block_samples / RATE_HZ
    count, blocks = args.count, round(args.gaze_s / block_s)
    persons = sorted({(args.first + i) % PERSONS for i in range(count)})
    gaze = {p: person_gaze(p, args.gaze_s) for p in persons}
    rng = np.random.default_rng(args.first)
    # Start times spread over the stagger (headsets start at any moment; with --starts lattice
    # on the step lattice, so that half the sessions send their blocks at the same instant: a
    # burst); every device's clock reads the same (s since the level's start, as NTP-synced
    # headsets agree), so a session's first sample is stamped with its start: without a
    # per-session phase, every session's chunks would end on the same ticks.
    offsets = rng.uniform(0.0, args.stagger, count)
    if args.starts == "lattice":
        offsets = np.round(offsets / args.step) * args.step
    sends = np.full((count, blocks), np.nan)
    lags = np.full((count, blocks), np.nan)
    connected = np.full(count, np.nan)
    errors: list[str] = []
    nats = NatsSettings(servers=[args.nats], partitions=args.partitions)
    base = args.start_at

    async def session(i: int) -> None:
        idx = args.first + i
        g = gaze[idx % PERSONS]
        await asyncio.sleep(max(0.0, base + offsets[i] - time.time()))
        try:
            name = f"{args.tag}s{idx}"
            async with JetStreamSender(
                nats, DEVICE, name, rate_hz=RATE_HZ,
                unix_offset=lambda: base, clock=lambda: time.time() - base,
            ) as sender:  # fmt: skip
                t0 = connected[i] = time.time()
                for b in range(blocks):
                    due = t0 + (b + 1) * block_s
                    delay = due - time.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    now = time.time()
                    sends[i, b], lags[i, b] = now, now - due
                    part = g.slice(block * b, block * (b + 1))
                    await sender.send(
                        GazeSamples(
                            part.timestamps + offsets[i],
                            part.x_deg,
                            part.y_deg,
                            part.pupil_mm,
                            part.valid,
                        )
                    )
        except Exception as exc:  # reported in the results, the level fails
            errors.append(f"session {idx}: {type(exc).__name__}: {exc}")

    await asyncio.gather(*(session(i) for i in range(count)))
    np.savez(
        args.out,
        index=np.arange(args.first, args.first + count),
        sends=sends,
        lags=lags,
        connected=connected,
        base=np.array(base),
        clocks=offsets
        + np.array([gaze[(args.first + i) % PERSONS].timestamps[0] for i in range(count)]),
        errors=np.array(json.dumps(errors)),
    )


# ------------------------------------------------------------------------------ one level
class Worker:
    """A ``gazeguard run --fleet --source jetstream`` process; stderr drained by a thread."""

    def __init__(
        self, broker: Broker, nats: NatsServer, partitions: int, ledger: Path, extra: list[str],
        code: Path = ROOT, cpu: int | None = None, max_sessions: int = 1000,
    ) -> None:  # fmt: skip
        cmd = [
            sys.executable, "-m", "gazeguard", "-v", "run", "--fleet", "--source", "jetstream",
            "--device", "fleet", "--broker", broker.address, "--ledger", str(ledger), *extra,
        ]  # fmt: skip
        env = {
            **os.environ,
            "GAZEGUARD_FLEET__NATS__SERVERS": json.dumps([nats.url]),
            "GAZEGUARD_FLEET__NATS__PARTITIONS": str(partitions),
            "PYTHONPATH": str(code),  # the checkout whose worker runs
            # the operator endpoint with the tail profile (batches, GC pauses, loop stalls)
            "GAZEGUARD_METRICS__PORT": "0",
            "GAZEGUARD_METRICS__TAIL": "true",
            # every session of the level may land on this worker: none refused by the cap
            # (fleet.max_sessions, 1,000 by default, refused 200 of 1,200 sessions: their
            # chunks were counted missing before 12-08)
            "GAZEGUARD_FLEET__MAX_SESSIONS": str(max_sessions),
        }
        # cwd=code as well: `python -m` puts the working directory first on sys.path, before
        # PYTHONPATH, so a worker started from another checkout ran that checkout's code (every
        # --baseline comparison before 11-27 08:30 UTC compared one checkout with itself).
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=code
        )
        if cpu is not None:  # at once: the threads it starts later inherit the mask
            pin_process(self.proc.pid, cpu)
        self.ready = threading.Event()
        self.tail: collections.deque[str] = collections.deque(maxlen=30)
        self.warnings = 0
        self.warning_lines: list[str] = []  # the first few, each with its Unix time
        self.sessions: set[str] = set()  # sessions this worker opened
        self.refused: set[str] = set()  # sessions it refused (fleet.max_sessions reached)
        self.partitions: set[int] = set()  # partitions it holds (its last balance report)
        self.metrics_url: str | None = None  # its operator endpoint (a --baseline may have none)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.tail.append(line.rstrip())
            if "partitions of JetStream stream" in line:
                self.ready.set()
            if (m := METRICS_URL.search(line)) is not None:
                self.metrics_url = m[1]
            if (m := OPENED.search(line)) is not None:
                self.sessions.add(m[1])
            if (m := HOLDS.search(line)) is not None:
                self.partitions = {int(x) for x in m[1].split(",") if x.strip()}
            if (m := REFUSED.search(line)) is not None:
                self.refused.add(m[1])
            if "WARNING" in line or "ERROR" in line:
                self.warnings += 1
                if len(self.warning_lines) < WARNINGS_KEPT:
                    self.warning_lines.append(f"{time.time():.1f} {line.rstrip()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_generators(
    nats: str, partitions: int, sessions: int, gaze_s: float, stagger: float, start_at: float,
    tag: str, tmp: Path, block: int, step: float, cpu: int | None = None, starts: str = "spread",
) -> list[tuple[subprocess.Popen[bytes], Path]]:  # fmt: skip
    """One load generator up to 100 sessions, else two, splitting the sessions between them."""
    n = 1 if sessions <= 100 else 2
    out = []
    for g in range(n):
        first, stop = g * sessions // n, (g + 1) * sessions // n
        path = tmp / f"gen{g}.npz"
        cmd = [sys.executable, __file__, "--generator", "--nats", nats,
               "--partitions", str(partitions), "--first", str(first),
               "--count", str(stop - first), "--gaze-s", f"{gaze_s:g}", "--stagger", f"{stagger:g}",
               "--start-at", repr(start_at), "--tag", tag, "--out", str(path),
               "--block-samples", str(block), "--step", f"{step:g}",
               "--starts", starts]  # fmt: skip
        proc = subprocess.Popen(cmd)
        if cpu is not None:
            pin_process(proc.pid, cpu)
        out.append((proc, path))
    return out


def chunk_latencies(
    files: list[Path], received: dict[tuple[str, int], float], tag: str, gaze_s: float,
    args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    """Send → receipt per chunk, chunks never received, generator lag and errors."""
    gen = [np.load(f) for f in files]
    sends = np.concatenate([g["sends"] for g in gen])
    lags = np.concatenate([g["lags"] for g in gen])
    clocks = np.concatenate([g["clocks"] for g in gen])
    base = float(gen[0]["base"])
    latencies: list[float] = []
    worst: list[tuple[float, float, str, int]] = []  # (latency ms, received at, session, chunk)
    missing = 0
    for row, idx in enumerate(np.concatenate([g["index"] for g in gen])):
        key = f"{DEVICE}.{tag}s{idx}"
        # the worker's grid: the session's public phase, from its first sample (its clock)
        first, period = float(clocks[row]), N_STEPS * args.step
        start = on_grid(first, period, session_phase(key, period)) - first
        for c, b in enumerate(
            completing_blocks(
                idx % PERSONS, gaze_s, args.window, args.step, args.block_samples, start
            )
        ):
            if not np.isfinite(sends[row, b]):
                continue  # the block that would complete it was never sent
            got = received.get((key, c))
            if got is None:
                missing += 1
                continue
            # due: its last window's end on the device clock (the level's start + its sample
            # time) + the look-behind + ingest.late_after_s; never before its gaze was sent
            end = base + first + start + args.window + (N_STEPS * (c + 1) - 1) * args.step
            since = max(end + LOOKBEHIND_S + LATE_AFTER_S, sends[row, b])
            latencies.append(got - since)
            worst.append((1e3 * (got - since), got, key, c))
    return {
        "latency": latency_stats(latencies),
        "worst": sorted(worst, reverse=True)[:10],
        "missing": missing,
        "lag": latency_stats(lags[np.isfinite(lags)].tolist()),
        "errors": [e for g in gen for e in json.loads(str(g["errors"]))],
    }


def run_level(
    sessions: int, workers: int, args: argparse.Namespace, tag: str, profile: bool,
    code: Path = ROOT, pinned: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """One level: ``sessions`` devices against ``workers`` worker processes (see docstring);
    ``pinned``: the (one) worker alone on :data:`WORKER_CPU`, the rest on :data:`OTHER_CPU`."""
    own = os.sched_getaffinity(0)
    if pinned:
        os.sched_setaffinity(0, {OTHER_CPU})  # this thread, and the subscriber it starts
    try:
        return _run_level(sessions, workers, args, tag, profile, code, pinned)
    finally:
        os.sched_setaffinity(0, own)


def _run_level(
    sessions: int, workers: int, args: argparse.Namespace, tag: str, profile: bool,
    code: Path, pinned: bool,
) -> dict[str, Any]:  # fmt: skip
    period = N_STEPS * args.step
    gaze_s = args.window + period + args.seconds
    received: dict[tuple[str, int], float] = {}
    dropped: list[float] = []

    def on_message(topic: str, payload: bytes, _perf: float, wall: float) -> None:
        if topic.startswith("$SYS"):
            dropped.append(float(payload))
        else:
            received[(topic.split("/")[3], int(json.loads(payload)["chunk_index"]))] = wall

    extra = ["--window-s", f"{args.window:g}", "--step-s", f"{args.step:g}"]
    with (
        tempfile.TemporaryDirectory() as tmp,
        mosquitto(Path(tmp)) as broker,
        nats_server(Path(tmp)) as nats,
    ):
        ledger = Path(tmp) / "ledger.sqlite"
        cpu = WORKER_CPU if pinned else None
        if pinned:
            pin_process(broker.proc.pid, OTHER_CPU)
            pin_process(nats.proc.pid, OTHER_CPU)
        pool = [
            Worker(broker, nats, args.partitions, ledger, extra, code, cpu, max(1000, sessions))
            for _ in range(workers)
        ]
        try:
            for w in pool:
                if not w.ready.wait(60):
                    raise RuntimeError("fleet worker did not start:\n" + "\n".join(w.tail))
            # chunks are published under each headset's device id: every device's topic
            topics = ["gazeguard/v1/+/+/chunks", "$SYS/broker/publish/messages/dropped"]
            sub = Subscriber(broker.host, broker.port, topics, on_message)
            time.sleep(1.5)  # a first $SYS sample
            dropped_before = dropped[-1] if dropped else 0.0
            start_at = time.time() + 3.0  # generators import and build their gaze first
            gens = start_generators(
                nats.url,
                args.partitions,
                sessions,
                gaze_s,
                period,
                start_at,
                tag,
                Path(tmp),
                args.block_samples,
                args.step,
                OTHER_CPU if pinned else None,
                args.starts,
            )
            # Every session emits feature vectors from stagger + window on; measure
            # until the first sessions stop sending.
            time.sleep(max(0.0, start_at + period + args.window + 3.0 - time.time()))
            meters = [ProcessMeter(w.proc.pid) for w in pool]
            others = [ProcessMeter(broker.proc.pid), ProcessMeter(nats.proc.pid)]
            others += [ProcessMeter(g.pid) for g, _ in gens]
            for m in meters + others:
                m.start()
            spy = Path(tmp) / "profile.txt"
            spying = None
            if profile and shutil.which("py-spy"):
                spying = subprocess.Popen(
                    ["py-spy", "record", "-p", str(pool[0].proc.pid), "-d", "25", "-r", "100",
                     "-f", "raw", "-o", str(spy)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            time.sleep(max(1.0, start_at + gaze_s - time.time()))
            worker_fp = [m.stop() for m in meters]
            other_fp = [m.stop() for m in others]
            for g, _ in gens:
                g.wait(timeout=period + 120)
            # the last chunks come due (up to the look-behind + late_after_s after the last
            # sample), are charged, published and received
            time.sleep(3.0 + LOOKBEHIND_S + LATE_AFTER_S)
            sub.close()
            lost = (dropped[-1] - dropped_before) if dropped else float("nan")
            if spying is not None:
                spying.wait(60)
            profile_top = summarize_profile(spy) if spy.is_file() else None
            tail = [scrape_tail(w.metrics_url) for w in pool]
        finally:
            for w in pool:
                w.stop()
        # plain SQL on the two tables every ledger schema has: a --baseline checkout may write
        # a schema this checkout's Ledger refuses to open
        with contextlib.closing(sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)) as db:
            charged = db.execute("SELECT COUNT(*) FROM charges").fetchone()[0]
            withheld = db.execute("SELECT COUNT(*) FROM withheld").fetchone()[0]
        res = chunk_latencies([f for _, f in gens], received, tag, gaze_s, args)
        if spy.is_file():
            LOGS.mkdir(parents=True, exist_ok=True)
            shutil.copy(spy, LOGS / f"fleet-profile-{sessions}.raw.txt")
    lat, lag = res["latency"], res["lag"]
    no_loss = res["missing"] == 0 and lost == 0 and not res["errors"] and withheld == 0
    kept_up = lag["p99_ms"] <= LAG_LIMIT_MS
    return {
        "sessions": sessions,
        "workers": workers,
        "code": str(code),
        "generators": len(gens),
        "chunks_received": lat["n"],
        "chunks_missing": res["missing"],
        "chunks_charged": charged,
        "chunks_withheld": withheld,
        "broker_dropped": lost,
        "sender_errors": res["errors"][:5],
        "worst_chunks": [
            {"ms": round(ms, 1), "at_s": round(at - start_at, 1), "session": k, "chunk": c}
            for ms, at, k, c in res["worst"]
        ],
        "sessions_per_worker": [len(w.sessions) for w in pool],
        "partitions_per_worker": [sorted(w.partitions) for w in pool],
        "latency": lat,
        "generator_lag": lag,
        "worker_cpu_pct": [f.cpu_pct for f in worker_fp],
        "worker_rss_max_mb": [f.rss_max_mb for f in worker_fp],
        "broker_cpu_pct": other_fp[0].cpu_pct,
        "nats_cpu_pct": other_fp[1].cpu_pct,
        "generator_cpu_pct": [f.cpu_pct for f in other_fp[2:]],
        "cpu_window_s": worker_fp[0].wall_s,
        "worker_warnings": sum(w.warnings for w in pool),
        "sessions_refused": len(set().union(*(w.refused for w in pool))),
        # the first warnings, as Unix time and line (a long collection says when it came)
        "worker_warning_lines": [x for w in pool for x in w.warning_lines],
        "gaze_from": start_at,  # Unix s: the generators' first block
        "no_loss": no_loss,
        "generator_kept_up": kept_up,
        "sustained": no_loss and kept_up and lat["p99_ms"] <= P99_TARGET_MS,
        "load_after": load_now(),
        "profile_top": profile_top,
        "tail": tail,
    }


#: The worker's histograms the tail profile keeps (gazeguard.runtime.tail, .metrics).
TAIL = (
    "gazeguard_batch_seconds",
    "gazeguard_gc_pause_seconds",
    "gazeguard_loop_stall_seconds",
    "gazeguard_chunk_charge_seconds",
    "gazeguard_release_seconds",
    "gazeguard_outbox_wait_seconds",
    "gazeguard_broker_ack_seconds",
)


def scrape_tail(url: str | None) -> dict[str, Any] | None:
    """The worker's tail profile from its operator endpoint: per histogram (and label set) the
    count, the mean, and the upper bounds of the buckets holding the median, the 99th
    percentile and the largest observation, s."""
    if url is None:
        return None
    import urllib.request  # noqa: PLC0415

    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in TAIL:
            continue
        groups: dict[str, dict[str, Any]] = {}
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            key = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "all"
            g = groups.setdefault(key, {"buckets": []})
            if sample.name.endswith("_bucket"):
                g["buckets"].append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_count"):
                g["count"] = sample.value
            elif sample.name.endswith("_sum"):
                g["sum"] = sample.value
        for key, g in groups.items():
            n, buckets = g.get("count", 0.0), sorted(g.pop("buckets"))

            def upper(
                q: float, n: float = n, buckets: list[tuple[float, float]] = buckets
            ) -> float:
                return next((le for le, c in buckets if c >= q * n), float("inf"))

            g.update(
                mean=g.get("sum", 0.0) / n if n else None,
                p50_le=upper(0.5) if n else None,
                p99_le=upper(0.99) if n else None,
                max_le=upper(1.0) if n else None,
            )
            out[f"{family.name}{{{key}}}" if key != "all" else family.name] = g
    return out


FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
#: Where a profile sample's time goes: the innermost frame whose file matches (numpy and other
#: unlisted frames count towards the nearest listed caller).
COMPONENTS = (
    ("gazeguard/signal/events.py", "event detection"),
    ("gazeguard/signal/features.py", "features"),
    ("gazeguard/core/samples.py", "features"),
    ("gazeguard/core/chunking.py", "chunking"),
    ("gazeguard/privacy/mechanisms/", "mechanism (FFTW, noise)"),
    ("gazeguard/ledger/", "ledger (SQLite charge)"),
    ("sqlite3", "ledger (SQLite charge)"),
    ("gazeguard/wire/message.py", "chunk message (pydantic, JSON)"),
    ("pydantic", "chunk message (pydantic, JSON)"),
    ("json/", "chunk message (pydantic, JSON)"),
    ("gazeguard/runtime/fleet.py", "fleet: raw block decode, dispatch"),
    ("gazeguard/runtime/jetstream/", "fleet: raw block decode, dispatch"),
    ("gazeguard/signal/rawgaze.py", "fleet: raw block decode, dispatch"),
    ("nats/", "NATS client (nats-py)"),
    ("gazeguard/runtime/pipeline.py", "pipeline glue"),
    ("gazeguard/runtime/publish.py", "publisher"),
    ("gazeguard/ledger/outbox.py", "publisher"),
    ("gazeguard/runtime/mqtt/", "publisher"),
    ("paho/", "MQTT client (paho, aiomqtt)"),
    ("aiomqtt/", "MQTT client (paho, aiomqtt)"),
    ("concurrent/futures/", "worker threads (to_thread)"),
    ("threading.py", "worker threads (to_thread)"),
    ("asyncio/", "event loop (uvloop, socket I/O)"),
)


def _component(paths: list[str]) -> str:
    for path in reversed(paths):
        for pattern, name in COMPONENTS:
            if pattern in path:
                return name
    return "other"


def summarize_profile(path: Path, top: int = 15) -> dict[str, Any]:
    """Where the worker's busy time goes, from py-spy's raw (collapsed stack) output.

    Each raw line is ``frame;frame;… count`` with frames ``function (file:line)``. py-spy
    samples only threads that are not idle, so shares are of busy samples. Returns the share
    per component (see :data:`COMPONENTS`) and per function (self time, leaf frame).
    """
    self_t: collections.Counter[str] = collections.Counter()
    parts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        matches = [FRAME.match(f) for f in stack.split(";")]
        paths = [m["file"] if m else "" for m in matches]
        leaf = matches[-1]
        n = int(count)
        total += n
        self_t[f"{leaf['func']} ({Path(leaf['file']).name})" if leaf else "?"] += n
        parts[_component(paths)] += n

    def share(c: collections.Counter[str], k: int | None = None) -> list[tuple[str, float]]:
        return [(f, round(100.0 * v / total, 1)) for f, v in c.most_common(k)]

    return {"samples": total, "components_pct": share(parts), "self_pct": share(self_t, top)}


# ------------------------------------------------------------------------------ main
def level_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One level over its runs: the slowest run's figures (highest p99, fewest sessions per
    busy core) as the result, the spread beside them; sustained only if every run sustained
    it."""
    p99s = [r["latency"]["p99_ms"] for r in runs]
    cpu = [sum(r["worker_cpu_pct"]) for r in runs]
    sessions = runs[0]["sessions"]
    per_core = [sessions / (c / 100.0) if c > 0 else float("nan") for c in cpu]
    return {
        "variant": runs[0].get("variant", "new"),
        "mode": runs[0].get("mode", "unpinned"),
        "sessions": sessions,
        "workers": runs[0]["workers"],
        "runs": len(runs),
        "sessions_per_busy_core": min(per_core),
        "sessions_per_busy_core_runs": per_core,
        "p50_ms": max(r["latency"]["p50_ms"] for r in runs),
        "p99_ms": max(p99s),
        "p99_ms_runs": p99s,
        "max_ms": max(r["latency"]["max_ms"] for r in runs),
        "worker_cpu_pct_total": max(cpu),
        "worker_cpu_pct_runs": cpu,
        # % of one core per session, and CPU ms per session-second (the same figure x10)
        "worker_cpu_ms_per_session_s": 10.0 * max(cpu) / sessions,
        "worker_rss_max_mb": max(max(r["worker_rss_max_mb"]) for r in runs),
        "generator_lag_p99_ms": max(r["generator_lag"]["p99_ms"] for r in runs),
        "load_after_runs": [r["load_after"] for r in runs],
        "chunks_missing": sum(r["chunks_missing"] for r in runs),
        "broker_dropped": sum(r["broker_dropped"] for r in runs),
        "no_loss": all(r["no_loss"] for r in runs),
        "generator_kept_up": all(r["generator_kept_up"] for r in runs),
        "sustained_runs": sum(bool(r["sustained"]) for r in runs),
        "sustained": all(r["sustained"] for r in runs),
    }


def run_line(res: dict[str, Any], rep: int) -> str:
    """One progress line for a level run."""
    lat, cpu = res["latency"], "+".join(f"{c:.0f}" for c in res["worker_cpu_pct"])
    gens = "+".join(f"{c:.0f}" for c in res["generator_cpu_pct"])
    verdict = "sustained" if res["sustained"] else "NOT sustained"
    return (
        f"[{res.get('variant', 'new')}, {res.get('mode', 'unpinned')}] {res['workers']} "
        f"worker(s) {res['sessions']:4d} "
        f"sessions run {rep + 1}: "
        f"p50 {lat['p50_ms']:.1f} p99 {lat['p99_ms']:.1f} max {lat['max_ms']:.1f} ms over "
        f"{lat['n']} chunks; CPU% worker {cpu}, broker {res['broker_cpu_pct']:.0f}, nats "
        f"{res['nats_cpu_pct']:.0f}, generators {gens}; sessions per worker "
        f"{res['sessions_per_worker']}; send lag p99 {res['generator_lag']['p99_ms']:.0f} ms; "
        f"missing {res['chunks_missing']}, dropped {res['broker_dropped']:g} → {verdict} "
        f"(load {res['load_after']})"
    )


def profile_run(summary: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any] | None:
    """The last 1-worker level once more, under py-spy (its sampling perturbs the worker)."""
    one_worker = [s["sessions"] for s in summary if s["workers"] == 1]
    if not one_worker or not shutil.which("py-spy"):
        return None
    at = one_worker[-1]
    res = run_level(at, 1, args, f"profile{at}", profile=True)
    prof = {"sessions": at, "latency": res["latency"], "worker_cpu_pct": res["worker_cpu_pct"]}
    prof.update(res["profile_top"] or {})
    print(f"\npy-spy on the worker at {at} sessions (share of busy samples, %):")
    for kind in ("components", "self"):
        for name, pct in prof.get(f"{kind}_pct", []):
            print(f"  {kind:10s} {pct:5.1f}  {name}")
    return prof


def level(
    sessions: int, workers: int, args: argparse.Namespace, runs: list[dict[str, Any]],
    variant: str = "new", code: Path = ROOT, mode: str = "unpinned",
) -> dict[str, Any]:  # fmt: skip
    """``--repeats`` runs of one level, each printed and appended to ``runs``; their summary."""
    level_runs = []
    for rep in range(args.repeats):
        tag = f"{variant[0]}{mode[0]}w{workers}l{sessions}r{rep}"
        level_runs.append(
            run_level(sessions, workers, args, tag, False, code, pinned=mode == "pinned")
        )
        level_runs[-1]["variant"] = variant
        level_runs[-1]["mode"] = mode
        print(run_line(level_runs[-1], rep), flush=True)
    runs.extend(level_runs)
    return level_summary(level_runs)


def ramp(
    workers: int, levels: list[int], args: argparse.Namespace, runs: list[dict[str, Any]],
    variants: dict[str, Path], mode: str = "unpinned",
) -> list[dict[str, Any]]:  # fmt: skip
    """Levels in order, each variant (checkout) in turn, a variant until one of its levels is
    not sustained; then once the midpoint (to 25 sessions) between its last sustained level
    and the failed one."""
    out: list[dict[str, Any]] = []
    active = dict(variants)
    for sessions in levels:
        for variant, code in list(active.items()):
            out.append(level(sessions, workers, args, runs, variant, code, mode))
            if out[-1]["sustained"]:
                continue
            del active[variant]
            ok = [s["sessions"] for s in out if s["sustained"] and s["variant"] == variant]
            mid = 25 * round((ok[-1] + sessions) / 50) if ok else 0
            if ok and ok[-1] < mid < sessions:
                out.insert(-1, level(mid, workers, args, runs, variant, code, mode))
        if not active:
            break
    return out


def compare(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (workers, sessions) both variants ran: sessions per busy core and p99 of each, and
    the ratio of sessions per busy core (new / baseline)."""
    by = {(s["variant"], s["mode"], s["workers"], s["sessions"]): s for s in summary}
    rows = []
    for (variant, mode, workers, sessions), new in sorted(by.items(), key=lambda kv: kv[0][1:]):
        base = by.get(("baseline", mode, workers, sessions))
        if variant != "new" or base is None:
            continue
        rows.append(
            {
                "mode": mode,
                "workers": workers,
                "sessions": sessions,
                "sessions_per_busy_core": {
                    "new": new["sessions_per_busy_core"],
                    "baseline": base["sessions_per_busy_core"],
                },
                "p99_ms": {"new": new["p99_ms"], "baseline": base["p99_ms"]},
                "sustained": {"new": new["sustained"], "baseline": base["sustained"]},
                "ratio": new["sessions_per_busy_core"] / base["sessions_per_busy_core"],
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", help="session counts to ramp (default 50,100,200,300,400,600,800)")
    ap.add_argument("--workers", help="worker process counts (default 1,2)")
    ap.add_argument(
        "--repeats", type=int, default=3, help="runs per level (the slowest reported; default 3)"
    )
    ap.add_argument(
        "--modes", default="pinned,unpinned",
        help="pinned: the one worker alone on CPU 0, NATS, Mosquitto and the generators on CPU "
        "1 (measures the worker); unpinned: all share both (default: both, pinned first)",
    )  # fmt: skip
    ap.add_argument("--window", type=float, default=30.0, help="feature window W, s")
    ap.add_argument("--step", type=float, default=0.5, help="feature step s, s")
    ap.add_argument("--seconds", type=float, default=32.0, help="gaze after the first chunk, s")
    ap.add_argument("--partitions", type=int, default=8, help="JetStream partitions (default 8)")
    ap.add_argument("--profile", action="store_true", help="py-spy the last 1-worker level")
    ap.add_argument("--quick", action="store_true", help="levels 25,50; W 10 s; 1 run, 1 worker")
    ap.add_argument("--baseline", type=Path, help="a checkout to compare with, same run")
    ap.add_argument(
        "--block-samples", type=int, default=BLOCK,
        help="samples per raw block a device sends (default 120: 1 s at 120 Hz, what "
        "`gazeguard forward` sends by default, fleet.nats.block_s)",
    )  # fmt: skip

    ap.add_argument(
        "--starts", choices=("spread", "lattice"), default="spread",
        help="session starts over the first chunk period: spread (any moment, as headsets "
        "start; default) or lattice (on the 0.5 s step lattice: half the sessions send each "
        "block at the same instant, a burst on both cores)",
    )  # fmt: skip
    ap.add_argument("--name", default="fleet", help="results file stem (default fleet)")
    ap.add_argument("--generator", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--nats", help=argparse.SUPPRESS)
    for name in ("--first", "--count"):
        ap.add_argument(name, type=int, help=argparse.SUPPRESS)
    for name in ("--gaze-s", "--stagger", "--start-at"):
        ap.add_argument(name, type=float, help=argparse.SUPPRESS)
    ap.add_argument("--tag", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generator:
        uvloop.run(generate(args))
        return
    if args.quick:
        args.levels, args.workers = args.levels or "25,50", args.workers or "1"
        args.window, args.repeats, args.seconds = 10.0, 1, 16.0
    args.levels, args.workers = args.levels or "50,100,200,300,400,600,800", args.workers or "1,2"
    levels = [int(x) for x in args.levels.split(",")]
    load_before = load_now()
    print(f"load average before: {load_before}")
    runs: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    variants = {"new": ROOT}
    if args.baseline is not None:
        variants["baseline"] = args.baseline.resolve()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(modes) <= {"pinned", "unpinned"} or (
        "pinned" in modes and len(os.sched_getaffinity(0)) < 2
    ):
        ap.error("--modes: pinned and/or unpinned (pinned needs CPUs 0 and 1)")
    for mode in modes:
        floor = 0  # more workers start at the largest level fewer workers sustained
        for workers in [int(x) for x in args.workers.split(",")]:
            if mode == "pinned" and workers != 1:
                continue  # one core for the worker, one for the rest
            todo = [n for n in levels if n >= floor] or levels[-1:]
            done = ramp(workers, todo, args, runs, variants, mode)
            summary.extend(done)
            floor = max([s["sessions"] for s in done if s["sustained"]], default=floor)
    profile = profile_run(summary, args) if args.profile else None
    print(
        f"\n{'variant':>8s} {'mode':>8s} {'workers':>7s} {'sessions':>8s} {'p50 ms':>7s} "
        f"{'p99 ms (runs)':>24s} {'CPU%':>5s} {'ms/sess·s':>9s} {'sess/core':>9s} "
        f"{'lag p99':>7s} {'loss':>4s}  result (slowest of the runs)"
    )
    for s in summary:
        runs_p99 = "/".join(f"{x:.0f}" for x in s["p99_ms_runs"])
        print(
            f"{s['variant']:>8s} {s['mode']:>8s} {s['workers']:7d} {s['sessions']:8d} "
            f"{s['p50_ms']:7.1f} {s['p99_ms']:8.1f} ({runs_p99:>13s}) "
            f"{s['worker_cpu_pct_total']:5.0f} {s['worker_cpu_ms_per_session_s']:9.3f} "
            f"{s['sessions_per_busy_core']:9.0f} {s['generator_lag_p99_ms']:7.0f} "
            f"{'no' if s['no_loss'] else 'YES':>4s}  "
            f"{s['sustained_runs']}/{s['runs']} runs sustained"
        )
    comparison = compare(summary)
    for row in comparison:
        spc, p99 = row["sessions_per_busy_core"], row["p99_ms"]
        print(
            f"{row['mode']}, {row['workers']} worker(s) {row['sessions']} sessions: sessions per "
            f"busy core {spc['new']:.0f} vs baseline {spc['baseline']:.0f} ({row['ratio']:.2f}x);"
            f" p99 {p99['new']:.1f} vs {p99['baseline']:.1f} ms"
        )
    targets: dict[str, Any] = {}
    for mode in modes:
        one = [
            s for s in summary
            if s["workers"] == 1 and s["variant"] == "new" and s["mode"] == mode
        ]  # fmt: skip
        held = [s for s in one if s["sustained"]]
        top = held[-1] if held else None
        targets[mode] = {
            "max_sustained_sessions_one_worker": top["sessions"] if top else 0,
            "sessions_per_busy_core_slowest_run": top["sessions_per_busy_core"] if top else None,
            "target_sessions": f">= {TARGET_SESSIONS} in {args.repeats} of {args.repeats} runs",
            "target_per_core": f">= {TARGET_PER_CORE} (moonshot {MOONSHOT_PER_CORE})",
            "met": bool(
                top is not None
                and top["sessions"] >= TARGET_SESSIONS
                and top["sessions_per_busy_core"] >= TARGET_PER_CORE
            ),
        }
        print(
            f"{mode}: one worker sustained {targets[mode]['max_sustained_sessions_one_worker']} "
            f"sessions in every run; slowest run's sessions per busy core there: "
            f"{targets[mode]['sessions_per_busy_core_slowest_run']} (targets {TARGET_SESSIONS} "
            f"sessions, {TARGET_PER_CORE} per core)"
        )
    settings = {
        "rate_hz": RATE_HZ,
        "block_samples": args.block_samples,
        "window_s": args.window,
        "step_s": args.step,
        "chunk_steps": N_STEPS,
        "features": len(FEATURES),
        "levels": levels,
        "repeats": args.repeats,
        "p99_target_ms": P99_TARGET_MS,
        "generator_lag_limit_ms": LAG_LIMIT_MS,
        "partitions": args.partitions,
        "modes": modes,
        "starts": args.starts,
    }
    path = write_results(
        args.name,
        {
            "benchmark": "bench/bench_fleet.py",
            "machine": machine(),
            "load_before": load_before,
            "load_after": load_now(),
            "settings": settings,
            "baseline": None if args.baseline is None else str(args.baseline.resolve()),
            "summary": summary,
            "comparison": comparison,
            "runs": runs,
            "targets": targets,
            "profile": profile,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
