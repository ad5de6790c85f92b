"""Cohort aggregates at fleet scale: simulated 120 Hz headsets → NATS JetStream → fleet workers
with a PostgreSQL ledger, one cohort aggregate per worker per bucket.

Everything fresh and on loopback: a ``nats-server -js`` (the raw gaze stream, ``--partitions``
partitions), a Mosquitto (the aggregates, receipts and chunks), a PostgreSQL server (Debian's
``initdb``; the ledger every worker charges), ``--workers`` × ``gazeguard run --fleet --source
jetstream --cohort bench --cohort-model activity --cohort-release shares --bucket-s B
--budget-per-hour 10`` (chunks as the defaults release them; ``--worker-args`` adds more), one
load generator process per 500 headsets (this script with ``--generator``) running
``--headsets`` :class:`~gazeguard.runtime.jetstream.JetStreamSender` devices in real time — a
``--block-samples`` block (default 120: 1 s) every block period per headset, each acknowledged
before the next, headset starts spread over ``--stagger`` s — dated on the Unix clock (the
``unix_offset`` header) so that buckets are the real ones, and a paho-mqtt subscriber (this
process) on ``gazeguard/v1/cohort/bench/aggregates``.

Measured over ``--buckets`` whole buckets after every headset's first feature window (30 s):

* **release latency** of each aggregate: from its bucket's end (Unix) to its arrival at the
  subscriber (p50/p99; it includes the ``cohort.grace_s`` wait, 5 s, reported apart, and the
  once-a-second release loop); beside it, when the worker's log says the part was charged and
  enqueued (the rest is the outbox's delivery);
* **charges per session per bucket**: read back from the PostgreSQL ledger (stream ``cohort``):
  how many (headset, bucket) pairs hold exactly one charge (the goal: all), none, or more; and
  the sessions each worker's log says it released per bucket (their sum should be the headsets);
* **late vectors**: feature vectors and gaze samples dropped because their bucket had been
  released (each worker logs its running total);
* **worker CPU** (% of one core, psutil, all threads) over the measured buckets, and the
  generators' send lag (are they keeping real time?).

    python bench/bench_cohort.py [--headsets 1000] [--workers 2] [--buckets 3] [--bucket-s 60]

writes ``bench/results/cohort.json``. On a 2-core machine run it alone; verify small first
(``--headsets 50 --buckets 2``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
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
from bench_ledger import postgres_server

from gazeguard.config import NatsSettings
from gazeguard.ledger import Ledger
from gazeguard.runtime.jetstream import JetStreamSender
from gazeguard.runtime.simulate import TASKS, simulate_gaze

ROOT = Path(__file__).resolve().parent.parent
RATE_HZ = 120.0
DEVICE = "hmd"
COHORT = "bench"
WINDOW_S = 30.0  # the default feature window: the first vector of a headset comes after it
PERSONS = 24  # distinct simulated people (the headsets reuse them, each task in turn)
PER_GENERATOR = 500
RELEASED = re.compile(
    r"worker (\S+): cohort '" + COHORT + r"' bucket (\d+) aggregate released over (\d+) "
    r"sessions \((\d+) left out\)"
)
LATE = re.compile(r"cohort " + COHORT + r": (\d+) feature vectors and (\d+) gaze samples")


# ------------------------------------------------------------------------------ load generator
async def generate(args: argparse.Namespace) -> None:
    """``--generator``: headsets ``first … first+count-1`` in real time; saves send times."""
    block, block_s = args.block_samples, args.block_samples / RATE_HZ
    blocks = math.ceil(args.gaze_s / block_s)
    gaze = {
        p: simulate_gaze(args.gaze_s + block_s, RATE_HZ, 1000 + p, task=TASKS[p % len(TASKS)])
        for p in sorted({(args.first + i) % PERSONS for i in range(args.count)})
    }
    rng = np.random.default_rng(args.first)
    starts = args.start_at + rng.uniform(0.0, args.stagger, args.count)
    lags = np.full((args.count, blocks), np.nan)
    errors: list[str] = []
    nats = NatsSettings(servers=[args.nats], partitions=args.partitions)

    async def headset(i: int) -> None:
        idx = args.first + i
        g, t0 = gaze[idx % PERSONS], float(starts[i])
        try:
            async with JetStreamSender(
                nats, DEVICE, f"h{idx}", unix_offset=lambda: t0, rate_hz=RATE_HZ
            ) as sender:
                for b in range(blocks):
                    due = t0 + (b + 1) * block_s  # the block's last sample is then in the past
                    delay = due - time.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    lags[i, b] = time.time() - due
                    await sender.send(g.slice(block * b, block * (b + 1)))
        except Exception as exc:  # reported in the results
            errors.append(f"headset {idx}: {type(exc).__name__}: {exc}")

    await asyncio.gather(*(headset(i) for i in range(args.count)))
    np.savez(args.out, lags=lags, errors=np.array(json.dumps(errors)))


# ------------------------------------------------------------------------------ the fleet
class Worker:
    """A ``gazeguard -v run --fleet --source jetstream --cohort`` process; its log is read by a
    thread (released buckets, late vectors)."""

    def __init__(
        self, broker: Broker, nats: NatsServer, ledger: str, args: argparse.Namespace
    ) -> None:
        cmd = [
            sys.executable, "-m", "gazeguard", "-v", "run", "--fleet", "--source", "jetstream",
            "--device", "fleet", "--broker", broker.address, "--ledger", ledger,
            "--budget-per-hour", "10", "--cohort", COHORT, "--bucket-s", f"{args.bucket_s:g}",
            "--cohort-model", "activity", "--cohort-release", "shares",
            *args.worker_args.split(),
        ]  # fmt: skip
        env = {
            **os.environ,
            "GAZEGUARD_FLEET__NATS__SERVERS": json.dumps([nats.url]),
            "GAZEGUARD_FLEET__NATS__PARTITIONS": str(args.partitions),
            "GAZEGUARD_FLEET__IDLE_TIMEOUT_S": "20",
            "PYTHONPATH": str(ROOT),
        }
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )
        self.ready = threading.Event()
        #: (bucket, sessions, left out, when its log line was read: charged and enqueued, Unix s)
        self.released: list[tuple[int, int, int, float]] = []
        self.late = (0, 0)
        self.warnings: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if "partitions of JetStream stream" in line:
                self.ready.set()
            if (m := RELEASED.search(line)) is not None:
                self.released.append((int(m[2]), int(m[3]), int(m[4]), time.time()))
            if (m := LATE.search(line)) is not None:
                self.late = (int(m[1]), int(m[2]))
            if ("WARNING" in line or "ERROR" in line) and len(self.warnings) < 20:
                self.warnings.append(line.rstrip()[:300])

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start_generators(
    args: argparse.Namespace, nats: str, start_at: float, gaze_s: float, tmp: Path
) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """One load generator per :data:`PER_GENERATOR` headsets."""
    n = max(1, math.ceil(args.headsets / PER_GENERATOR))
    out = []
    for g in range(n):
        first, stop = g * args.headsets // n, (g + 1) * args.headsets // n
        path = tmp / f"gen{g}.npz"
        cmd = [sys.executable, __file__, "--generator", "--nats", nats,
               "--partitions", str(args.partitions), "--first", str(first),
               "--count", str(stop - first), "--gaze-s", f"{gaze_s:.3f}",
               "--stagger", f"{args.stagger:g}", "--start-at", repr(start_at), "--out", str(path),
               "--block-samples", str(args.block_samples)]  # fmt: skip
        out.append((subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}), path))
    return out


def charges_per_bucket(url: str, headsets: int, buckets: list[int]) -> dict[str, Any]:
    """From the ledger: per (headset, measured bucket), its charges in the ``cohort`` stream."""
    tally: Counter[int] = Counter()
    with Ledger.open(url) as ledger:
        for i in range(headsets):
            got = Counter(c.chunk_index for c in ledger.charges(f"{DEVICE}.h{i}", "cohort"))
            for b in buckets:
                tally[got.get(b, 0)] += 1
        problems = ledger.verify()
    return {
        "pairs": headsets * len(buckets),
        "exactly_one": tally.get(1, 0),
        "none": tally.get(0, 0),
        "more": sum(v for k, v in tally.items() if k > 1),
        "ledger_verify": problems[:10],
    }


def _last_arrived(pool: list[Worker], received: list[tuple[int, str, float]], bucket: int) -> bool:
    """Every aggregate of ``bucket`` a worker logged as released has reached the subscriber."""
    logged = sum(1 for w in pool if any(r[0] == bucket for r in w.released))
    return logged > 0 and sum(1 for b, _, _ in received if b == bucket) >= logged


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One run (module docstring); the JSON-ready result."""
    bucket_s, grace_s = args.bucket_s, 5.0
    received: list[tuple[int, str, float]] = []  # (bucket, worker, wall time)

    def on_message(_topic: str, payload: bytes, _perf: float, wall: float) -> None:
        msg = json.loads(payload)
        received.append((int(msg["bucket"]), str(msg["worker"]), wall))

    with (
        tempfile.TemporaryDirectory() as tmp,
        mosquitto(Path(tmp)) as broker,
        nats_server(Path(tmp)) as nats,
        postgres_server() as url,
    ):
        if url is None:
            raise SystemExit(
                "PostgreSQL not found: apt-get install postgresql; pip install psycopg"
            )
        sub = Subscriber(broker.host, broker.port, [f"gazeguard/v1/cohort/{COHORT}/aggregates"],
                         on_message)  # fmt: skip
        pool = [Worker(broker, nats, url, args) for _ in range(args.workers)]
        try:
            for w in pool:
                if not w.ready.wait(90):
                    raise RuntimeError(f"a worker did not start: {w.warnings}")
            start_at = time.time() + 5.0 + args.headsets / 200  # time to connect every headset
            first = math.ceil((start_at + args.stagger + WINDOW_S + 1.0) / bucket_s)
            measured = list(range(first, first + args.buckets))
            end = (first + args.buckets) * bucket_s
            # gaze goes on past the last measured bucket's release: when every stream stops
            # at once, every session's last chunk comes due together (on the clock) just as
            # that bucket is released, a burst a fleet in steady state does not see
            gaze_s = end + grace_s + 10.0 - start_at
            print(f"{args.headsets} headsets from {time.ctime(start_at)}, measuring buckets "
                  f"{measured[0]}..{measured[-1]} (until {time.ctime(end)}; load {load_now()})",
                  flush=True)  # fmt: skip
            gens = start_generators(args, nats.url, start_at, gaze_s, Path(tmp))
            time.sleep(max(0.0, first * bucket_s - time.time()))
            meters = [ProcessMeter(w.proc.pid) for w in pool]
            for m in meters:
                m.start()
            time.sleep(max(0.0, end - time.time()))
            cpu = [m.stop().row() for m in meters]
            for proc, _ in gens:
                proc.wait(timeout=args.headsets / 10 + 120)
            time.sleep(max(0.0, end + grace_s + 3.0 - time.time()))
            deadline = time.time() + 60.0
            while time.time() < deadline and not _last_arrived(pool, received, measured[-1]):
                time.sleep(0.5)
        finally:
            codes = [w.stop() for w in pool]
            sub.close()
        charges = charges_per_bucket(url, args.headsets, measured)
        gen = [np.load(p) for _, p in gens]
    lags = np.concatenate([g["lags"].ravel() for g in gen])
    latency = [wall - (b + 1) * bucket_s for b, _, wall in received if b in measured]
    per_bucket = {b: sum(r[1] for w in pool for r in w.released if r[0] == b) for b in measured}
    charged = [t - (b + 1) * bucket_s - grace_s for w in pool for b, _, _, t in w.released
               if b in measured]  # fmt: skip
    return {
        "headsets": args.headsets,
        "workers": args.workers,
        "partitions": args.partitions,
        "bucket_s": bucket_s,
        "grace_s": grace_s,
        "buckets": measured,
        "block_samples": args.block_samples,
        "release_latency": latency_stats(latency),
        "release_latency_beyond_grace": latency_stats([x - grace_s for x in latency]),
        # the worker's log line: the part charged and enqueued (the rest is delivery)
        "charged_beyond_grace": latency_stats(charged),
        "aggregates": {
            "received": len([1 for b, _, _ in received if b in measured]),
            "expected_at_most": args.workers * len(measured),
        },
        "charges_per_session_per_bucket": charges,
        "sessions_released_per_bucket": per_bucket,
        "late": {
            "feature_vectors": sum(w.late[0] for w in pool),
            "gaze_samples": sum(w.late[1] for w in pool),
        },
        "worker_cpu": cpu,
        "send_lag": latency_stats(lags[np.isfinite(lags)].tolist()),
        "generator_errors": [e for g in gen for e in json.loads(str(g["errors"]))][:10],
        "worker_exit_codes": codes,
        "worker_warnings": [w.warnings for w in pool],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--headsets", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--buckets", type=int, default=3, help="whole buckets measured")
    ap.add_argument("--bucket-s", type=float, default=60.0)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--stagger", type=float, default=5.0, help="headset starts spread over, s")
    ap.add_argument("--block-samples", type=int, default=120)
    ap.add_argument("--worker-args", default="", help="more `gazeguard run` arguments")
    ap.add_argument("--out-name", default="cohort", help="bench/results/NAME.json")
    ap.add_argument("--generator", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--nats", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--gaze-s", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generator:
        asyncio.run(generate(args))
        return
    t0 = time.perf_counter()
    res = run(args)
    lat, beyond = res["release_latency"], res["release_latency_beyond_grace"]
    ch, ch_at = res["charges_per_session_per_bucket"], res["charged_beyond_grace"]
    print(
        f"{res['headsets']} headsets, {res['workers']} workers, buckets of {res['bucket_s']:g} s: "
        f"release latency p50 {lat['p50_ms'] / 1e3:.2f} s, p99 {lat['p99_ms'] / 1e3:.2f} s "
        f"(beyond the {res['grace_s']:g} s grace: p50 {beyond['p50_ms'] / 1e3:.2f} s, p99 "
        f"{beyond['p99_ms'] / 1e3:.2f} s; {res['aggregates']['received']} aggregates; charged "
        f"and enqueued p50 {ch_at['p50_ms'] / 1e3:.2f} s, p99 {ch_at['p99_ms'] / 1e3:.2f} s); "
        f"charges per (headset, bucket): {ch['exactly_one']}/{ch['pairs']} exactly one, "
        f"{ch['none']} none, {ch['more']} more; late vectors {res['late']['feature_vectors']}, "
        f"samples {res['late']['gaze_samples']}; worker CPU "
        + ", ".join(f"{c['cpu_pct']:.0f} %" for c in res["worker_cpu"])
        + f"; send lag p99 {res['send_lag']['p99_ms']:.0f} ms",
        flush=True,
    )
    path = write_results(
        args.out_name,
        {"machine": machine(), "seconds": time.perf_counter() - t0, "run": res},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
