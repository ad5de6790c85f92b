"""Cost of getting a charged chunk onto the broker: charge → PUBACK latency, against Mosquitto.

Tracks, over many chunks sent one at a time (as the service does: a chunk every n·s seconds):

- ``gazeguard charge→PUBACK``: ``Ledger.charge`` (SQLite WAL, synchronous=FULL, in a worker
  thread as the service calls it) + ``Publisher.notify`` + outbox query + QoS 1 publish until the
  broker's PUBACK (``Publisher(on_acked=...)``).
- ``gazeguard notify→PUBACK``: the same without the charge (items already in the outbox): the
  publisher's own overhead.
- ``chunk message build``: validating and serialising one ``ChunkMessage`` (part of the charge:
  the ledger calls the payload builder inside its transaction).
- ``paho-mqtt publish→PUBACK``: what a user would otherwise write: a plain paho-mqtt client with
  its network thread, ``publish(qos=1).wait_for_publish()``, same payload, same broker, same run.

The payload is a real ``gazeguard.chunk/2`` message of 52 features × 32 steps (~40 kB of JSON).
Mosquitto runs on a free loopback port, MQTT 5 for both clients. Each run has its own broker and
ledger; runs alternate the default (ε, δ) accountant with an empty composition cache (a device's
first session: each new count is composed inline, as charges come back to back here instead of
16 s apart), the same with the cache that run left (every later session of the same settings),
and pure sequential caps, ``--repeats`` times each; the spread is reported. Run
``python bench/bench_publish.py [--chunks N] [--repeats R]``; prints a table and writes
``bench/results/publish.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from gazeguard.config import BrokerSettings
from gazeguard.ledger import Ledger, LedgerState, pure_cost
from gazeguard.ledger.outbox import OutboxEntry
from gazeguard.privacy.accounting import cache_clear
from gazeguard.privacy.accounting.cache import flush
from gazeguard.runtime.publish import Publisher
from gazeguard.wire.message import ChunkMessage, LedgerSnapshot
from gazeguard.wire.topics import chunk_topic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "wire"))
from _params import mechanism_params

RESULTS = Path(__file__).resolve().parent / "results" / "publish.json"
N_FEATURES, N_STEPS = 52, 32
EPS = {f"feature_{k:02d}": 0.05 for k in range(N_FEATURES)}
PREFIX, DEVICE, SESSION = "gazeguard/v1", "bench", "bench-session"
#: Chunks charged before timing starts (as bench_service): the first charge imports the
#: accountant's libraries, which the service has done at startup (or needs not, its plan's
#: compositions on disk).
WARMUP_CHUNKS = 3
#: What each run measures: the ledger's composition and whether the composition cache holds an
#: earlier session's counts.
CONFIG_OF = {
    "pld, cold cache": ("pld", False),
    "pld, warm cache": ("pld", True),
    "sequential": ("sequential", False),
}
CONFIGS = tuple(CONFIG_OF)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def mosquitto(workdir: Path) -> Iterator[int]:
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nuser root\n"
        "log_type none\n"
    )
    proc = subprocess.Popen([exe, "-c", str(conf)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait()


def chunk_payload(index: int, state: LedgerState, rng: np.random.Generator) -> bytes:
    mechanism = mechanism_params(
        N_FEATURES,
        N_STEPS,
        k=8,
        m=15,
        epsilon=list(EPS.values()),
        noise_scale=[3.0] * N_FEATURES,
        sensitivity=[0.7] * N_FEATURES,
    )
    return ChunkMessage.build(
        session=SESSION,
        device=DEVICE,
        chunk_index=index,
        timestamps=0.5 * (index * N_STEPS + np.arange(N_STEPS)),
        features=list(EPS),
        units=["1"] * N_FEATURES,
        values=rng.normal(size=(N_FEATURES, N_STEPS)),
        mechanism=mechanism,
        ledger=LedgerSnapshot.from_state(sum(EPS.values()), state),
        unix_offset=1.7e9,
    ).to_payload()


def stats(lat_s: list[float]) -> dict[str, float]:
    ms = np.asarray(lat_s) * 1e3
    return {
        "n": len(ms),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }


async def bench_gazeguard(
    port: int, workdir: Path, chunks: int, composition: str = "pld"
) -> dict[str, list[float]]:
    """Charge → PUBACK, one chunk at a time; then notify → PUBACK for pre-charged chunks."""
    rng = np.random.default_rng(42)
    ledger = Ledger(workdir / "ledger.sqlite", synchronous="FULL", composition=composition)
    topic = chunk_topic(PREFIX, DEVICE, SESSION)
    acked: dict[int, float] = {}
    arrived = asyncio.Event()

    def on_acked(item: OutboxEntry) -> None:
        acked[item.id] = time.perf_counter()
        arrived.set()

    async def wait_acked(outbox_id: int) -> float:
        while outbox_id not in acked:
            arrived.clear()
            await arrived.wait()
        return acked[outbox_id]

    def charge_now(index: int) -> int:
        preview = ledger.preview(SESSION, pure_cost(EPS))
        body = chunk_payload(index, preview.state, rng)
        cost = pure_cost(EPS)
        return ledger.charge(SESSION, index, cost, topic, body, version=preview.version).outbox_id

    charge_lat: list[float] = []
    e2e: list[float] = []
    notify_lat: list[float] = []
    settings = BrokerSettings(host="127.0.0.1", port=port, protocol="5")
    async with Publisher(settings, ledger, connect_timeout=5, on_acked=on_acked) as pub:
        await pub.flush(5)
        for i in range(chunks):
            t0 = time.perf_counter()
            outbox_id = await asyncio.to_thread(charge_now, i)
            t1 = time.perf_counter()
            pub.notify()
            done = await wait_acked(outbox_id)
            if i >= WARMUP_CHUNKS:
                charge_lat.append(t1 - t0)
                e2e.append(done - t0)
            await pub.flush(5)  # mark_delivered committed: chunks come seconds apart in service
        await pub.flush(10)

    # A backlog charged while no publisher ran (an outage), drained at once on start; then the
    # publisher's own overhead: chunks charged beforehand, timed from notify() to PUBACK.
    ids = [charge_now(chunks + i) for i in range(chunks)]
    t0 = time.perf_counter()
    async with Publisher(settings, ledger, on_acked=on_acked, poll_interval_s=3600) as pub:
        await pub.flush(60)
        drain_s = time.perf_counter() - t0
        for i in range(chunks):
            outbox_id = charge_now(2 * chunks + i)
            t0 = time.perf_counter()
            pub.notify()
            notify_lat.append(await wait_acked(outbox_id) - t0)
            await pub.flush(5)
        await pub.flush(10)
    assert all(i in acked for i in ids)
    ledger.close()
    return {"charge": charge_lat, "e2e": e2e, "notify": notify_lat, "drain_s": [drain_s]}


def bench_paho(port: int, payload: bytes, chunks: int) -> list[float]:
    """A plain paho-mqtt publisher: network thread, publish(qos=1), wait for the PUBACK."""
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    connected = threading.Event()
    client.on_connect = lambda *_: connected.set()
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        if not connected.wait(5):
            msg = "paho did not connect"
            raise RuntimeError(msg)
        topic = chunk_topic(PREFIX, DEVICE, "paho-baseline")
        lat = []
        for _ in range(chunks):
            t0 = time.perf_counter()
            client.publish(topic, payload, qos=1).wait_for_publish(5)
            lat.append(time.perf_counter() - t0)
        return lat
    finally:
        client.disconnect()
        client.loop_stop()


def one_run(
    composition: str, chunks: int, runner: Callable[[Any], Any], cache: Path, *, warm: bool
) -> dict[str, Any]:
    """One measurement in a fresh directory: a new broker and ledger; the composition cache on
    disk in ``cache``: ``warm``, as an earlier session with the same releases left it (a
    device's later sessions), else emptied, memory and disk (its first session: every new count
    composed)."""
    with tempfile.TemporaryDirectory() as tmp, mosquitto(Path(tmp)) as port:
        os.environ["GAZEGUARD_CACHE_DIR"] = str(cache)
        cache_clear(disk_too=not warm)
        gg = runner(bench_gazeguard(port, Path(tmp), chunks, composition))
        with Ledger(Path(tmp) / "ledger.sqlite") as ledger:
            state = ledger.state(SESSION)
        rng = np.random.default_rng(0)
        build = []
        for i in range(chunks):
            t0 = time.perf_counter()
            payload = chunk_payload(i, state, rng)
            build.append(time.perf_counter() - t0)
        baseline = bench_paho(port, payload, chunks)
    rows = {
        "paho-mqtt publish→PUBACK (baseline)": stats(baseline),
        "gazeguard notify→PUBACK": stats(gg["notify"]),
        "chunk message build (pydantic+JSON)": stats(build),
        "gazeguard charge (SQLite FULL)": stats(gg["charge"]),
        "gazeguard charge→PUBACK": stats(gg["e2e"]),
    }
    base = rows["paho-mqtt publish→PUBACK (baseline)"]
    flush()
    return {
        "composition": composition,
        "cache": "warm" if warm else "cold",
        "payload_bytes": len(payload),
        "rows": rows,
        "backlog_drain_chunks_per_s": chunks / gg["drain_s"][0],
        "ratios_vs_paho": {
            name: {"p50": row["p50_ms"] / base["p50_ms"], "p99": row["p99_ms"] / base["p99_ms"]}
            for name, row in rows.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=500, help="chunks per measurement")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each composition (spread reported)"
    )
    args = parser.parse_args()
    try:
        import uvloop  # noqa: PLC0415 - optional, as in the service

        loop_name = "uvloop"
        runner: Callable[[Any], Any] = uvloop.run
    except ImportError:
        loop_name, runner = "asyncio", asyncio.run

    runs: list[dict[str, Any]] = []
    # interleaved: the default accountant with an empty composition cache (a device's first
    # session), again with the cache that session left (every later one), then sequential caps
    for r in range(args.repeats):
        with tempfile.TemporaryDirectory() as kept:
            for config in CONFIGS:
                composition, warm = CONFIG_OF[config]
                run = one_run(composition, args.chunks, runner, Path(kept), warm=warm)
                run["config"] = config
                runs.append(run)
                print(f"run {r + 1}, {config}, {loop_name}")
                print(f"  {'path':40s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} {'p99 ×':>7s}")
                for name, row in run["rows"].items():
                    print(
                        f"  {name:40s} {row['p50_ms']:8.3f} {row['p99_ms']:8.3f} "
                        f"{row['max_ms']:8.2f} {run['ratios_vs_paho'][name]['p99']:7.2f}",
                        flush=True,
                    )
    spread: dict[str, dict[str, dict[str, float]]] = {}
    for config in CONFIGS:
        mine = [run for run in runs if run["config"] == config]
        spread[config] = {
            name: {
                f"{q}_{k}": f([run["rows"][name][f"{q}_ms"] for run in mine])
                for q in ("p50", "p99")
                for k, f in (("min", min), ("median", statistics.median), ("max", max))
            }
            for name in mine[0]["rows"]
        }
    e2e = "gazeguard charge→PUBACK"
    for config, rows in spread.items():
        s = rows[e2e]
        print(
            f"{config}: charge→PUBACK p99 median {s['p99_median']:.2f} ms "
            f"(min {s['p99_min']:.2f}, max {s['p99_max']:.2f}) over {args.repeats} runs"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "publish",
                "chunks": args.chunks,
                "repeats": args.repeats,
                "features": N_FEATURES,
                "steps": N_STEPS,
                "event_loop": loop_name,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "target": {"charge_to_puback_p99_ms": 5.0, "composition": "pld"},
                "configs": {
                    c: {"composition": v[0], "cache": "warm" if v[1] else "cold"}
                    for c, v in CONFIG_OF.items()
                },
                "spread": spread,
                "runs": runs,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
