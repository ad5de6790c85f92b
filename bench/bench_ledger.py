"""Cost of paying for a release: one ``Ledger.charge`` (cap checks + charge row + outbox payload,
committed durably in one transaction), per backend and durability mode.

Tracks: charge+enqueue latency p50/p99 (ms) and charges/s, one writer and four writer threads;
``mark_delivered`` latency. Compared in the same run with what a user would otherwise write:
a bare SQLite INSERT of the payload with Python's defaults (rollback journal, no accounting) and
an fsync'ed JSON-lines append log (no accounting, no atomic outbox). The payload is a realistic
chunk message (52 features × 32 steps of JSON floats, ~17 kB) and ε is given per feature.
Every charge goes to one session (its 600th charge composes 31,200 releases); the ledgers use
the default (ε, δ) composition (a PLD per report-grid step of the counts, cached), and one row
uses pure sequential caps, the accounting of every charge before the (ε, δ) accountant.

Run: ``python bench/bench_ledger.py [--charges N]``; prints a table and writes
``bench/results/ledger.json``. PostgreSQL rows need ``gazeguard[fleet]`` and the server binaries
(``apt-get install -y postgresql``); the bench starts its own server on a free loopback port.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import pwd
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from gazeguard.ledger import Ledger

RESULTS = Path(__file__).resolve().parent / "results" / "ledger.json"
N_FEATURES, N_STEPS = 52, 32
EPS = {f"feature_{k:02d}": 0.05 for k in range(N_FEATURES)}


def make_payload() -> bytes:
    rng = np.random.default_rng(42)
    values = rng.normal(size=(N_FEATURES, N_STEPS)).round(6).tolist()
    return json.dumps({"session": "bench", "values": values}).encode()


def percentiles(lat_s: list[float]) -> dict[str, float]:
    ms = np.asarray(lat_s) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "per_s": float(len(ms) / ms.sum() * 1e3),
    }


Charger = Callable[[int], object]


def timed(indexes: range, fn: Charger) -> list[float]:
    out = []
    for i in indexes:
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def open_ledger(
    stack: ExitStack, location: str | Path, sync: str, payload: bytes, composition: str = "pld"
) -> Charger:
    ledger = stack.enter_context(
        Ledger(location, synchronous=sync, session_cap=1e9, composition=composition)  # type: ignore[arg-type]
    )
    return lambda i: ledger.charge(sync, i, EPS, "gazeguard/v1/d/s/chunks", payload)


def open_plain_sqlite(stack: ExitStack, path: Path, payload: bytes) -> Charger:
    db = sqlite3.connect(path)  # Python defaults: rollback journal, synchronous=FULL
    stack.callback(db.close)
    db.execute("CREATE TABLE out (session TEXT, chunk INTEGER, payload BLOB)")

    def insert(i: int) -> None:
        with db:
            db.execute("INSERT INTO out VALUES (?, ?, ?)", ("s", i, payload))

    return insert


def open_jsonl_fsync(stack: ExitStack, path: Path, payload: bytes) -> Charger:
    f = stack.enter_context(path.open("ab"))

    def append(i: int) -> None:
        f.write(json.dumps({"chunk": i, "eps": 2.6}).encode() + b" " + payload + b"\n")
        f.flush()
        os.fsync(f.fileno())

    return append


def ledger_extras(location: str | Path, sync: str, n: int, payload: bytes) -> dict[str, float]:
    """mark_delivered latency, and throughput of four writer threads (own connections)."""
    with Ledger(location, synchronous=sync) as ledger:  # type: ignore[arg-type]
        ids = [p.id for p in ledger.pending(session=sync)]
        deliver = percentiles(timed(range(len(ids)), lambda i: ledger.mark_delivered(ids[i])))
        done = []

        def worker(t: int) -> None:
            with Ledger(location, synchronous=sync) as own:  # type: ignore[arg-type]
                for i in range(n // 4):
                    own.charge(f"{sync}-t{t}", i, EPS, "t", payload)
            done.append(t)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        per_s = (n // 4) * 4 / (time.perf_counter() - t0)
        assert len(done) == 4
        assert ledger.verify() == []
    return {"deliver_p50_ms": deliver["p50_ms"], "threads4_per_s": per_s}


@contextmanager
def postgres_server() -> Iterator[str | None]:
    """A throwaway PostgreSQL server on a free loopback port (``None`` if unavailable)."""
    found = shutil.which("initdb")
    cands = [found] if found else sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))[::-1]
    try:
        import psycopg  # noqa: F401, PLC0415
    except ImportError:
        cands = []
    if not cands:
        yield None
        return
    bindir = Path(os.path.realpath(cands[0])).parent
    work = Path(tempfile.mkdtemp(prefix="gazeguard-bench-pg-", dir="/var/tmp"))
    prefix: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(work, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctl = [*prefix, str(bindir / "pg_ctl"), "-D", str(work / "data")]
    subprocess.run(
        [
            *prefix,
            str(bindir / "initdb"),
            "-D",
            str(work / "data"),
            "-A",
            "trust",
            "-U",
            "postgres",
        ],
        check=True,
        capture_output=True,
    )
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={work}"
    subprocess.run([*ctl, "-o", opts, "-l", str(work / "log"), "-w", "start"], check=True)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*ctl, "-m", "fast", "-w", "stop"], check=False, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=600, help="charges per configuration")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds (noise)")
    args = parser.parse_args()
    n, rounds = args.charges, args.rounds
    payload = make_payload()
    with (
        tempfile.TemporaryDirectory(dir="/var/tmp") as tmp,
        postgres_server() as url,
        ExitStack() as stack,
    ):
        d = Path(tmp)
        ledgers: dict[str, tuple[str | Path, str]] = {
            "sqlite FULL (default)": (d / "full.sqlite", "FULL"),
            "sqlite NORMAL": (d / "normal.sqlite", "NORMAL"),
        }
        # The same ledger with pure sequential caps: the accounting every charge did before
        # the user-level (ε, δ) accountant, so the row compares with older runs of this bench.
        sequential = {"sqlite FULL, sequential caps": (d / "seq.sqlite", "FULL")}
        if url is None:
            print("PostgreSQL rows skipped: needs gazeguard[fleet] and apt-get install postgresql")
        else:
            ledgers["postgresql sync commit"] = (url, "FULL")
            ledgers["postgresql async commit"] = (url, "NORMAL")
        chargers = {
            name: open_ledger(stack, loc, sync, payload) for name, (loc, sync) in ledgers.items()
        }
        for name, (loc, sync) in sequential.items():
            chargers[name] = open_ledger(stack, loc, sync, payload, "sequential")
        chargers["baseline: plain sqlite INSERT"] = open_plain_sqlite(stack, d / "p.db", payload)
        chargers["baseline: JSONL + fsync"] = open_jsonl_fsync(stack, d / "log.jsonl", payload)
        # Interleave the configurations in rounds so that the shared machine's noise (other
        # processes' disk flushes) falls on all of them alike.
        lat: dict[str, list[float]] = {name: [] for name in chargers}
        per_round = n // rounds
        for r in range(rounds):
            for name, charge in chargers.items():
                lat[name] += timed(range(r * per_round, (r + 1) * per_round), charge)
        stack.close()
        rows = {name: percentiles(v) for name, v in lat.items()}
        for name, (loc, sync) in ledgers.items():
            rows[name].update(ledger_extras(loc, sync, n, payload))
    ref = rows["sqlite FULL (default)"]["p50_ms"]
    print(
        f"charge + enqueue of a {len(payload) / 1e3:.0f} kB chunk, {N_FEATURES} ε; "
        f"n={n}, {rounds} rounds"
    )
    head = f"{'configuration':32} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'charges/s':>10} "
    print(head + f"{'4 thr /s':>9} {'deliver':>8} {'p50 vs FULL':>11}")
    for name, r in rows.items():
        r["p50_ratio_to_sqlite_full"] = r["p50_ms"] / ref
        extra = (
            f"{r['threads4_per_s']:9.0f} {r['deliver_p50_ms']:8.3f}"
            if "threads4_per_s" in r
            else f"{'-':>9} {'-':>8}"
        )
        print(
            f"{name:32} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} {r['max_ms']:8.2f} "
            f"{r['per_s']:10.0f} {extra} {r['p50_ratio_to_sqlite_full']:10.2f}x"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "ledger",
        "charges": n,
        "rounds": rounds,
        "payload_bytes": len(payload),
        "features": N_FEATURES,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "sqlite_version": sqlite3.sqlite_version,
        "results": rows,
    }
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
