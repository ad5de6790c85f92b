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
``bench/results/ledger.json``.

Charge cost by position in the hour (also ``--position`` alone): the charge at the
1st and at the 600th chunk of an hour (the sidecar's caps: a window cap over the hour of gaze
and of wall-clock time, every chunk undelivered), with the session's counters (default) and
with ``Ledger(counters=False)``, which recounts the window's charges and the pending outbox
items with queries at every charge (the baseline), interleaved chunk by chunk in the same run.
Several sessions of 600 charges each; the first only fills the accountant's caches (a
composition per new count is the same at any position and is not what is measured here);
medians over the others of the charges at positions 1–25 and 576–600, and their ratio (the
target: within 20 %). PostgreSQL rows need ``gazeguard[fleet]`` and the server binaries
(``apt-get install -y postgresql``); the bench starts its own server on a free loopback port.

Fleet pattern (``--fleet``): the CPU a fleet worker spends per chunk in
:func:`gazeguard.runtime.pipeline.release_group` (mechanism, preview, message, group-committed
charge),
with N sessions on one SQLite ledger (``synchronous=FULL``, the sidecar's default caps: 10 ε per
hour of gaze and of wall-clock time), each with an hour of history (225 chunks of 16 s, written
straight into the tables as the ledger writes them), chunks due in gaze order in groups of 1–8
from different sessions, the ledger's wall clock following the simulated fleet. Each
configuration runs in its own process (``--before PATH``: the same rounds against the gazeguard
at PATH, e.g. a checkout of the previous commit of the same ledger schema, interleaved round by
round; the seed is written in this checkout's schema); the rounds after a
warm-up (every session once) are timed with the worker thread's CPU time (``thread`` ms/chunk),
the process's (``process``: with the prefetch thread) and wall time; medians of the
rounds. ``python bench/bench_ledger.py --fleet --sessions 200,1000 [--before ../main]`` writes
``bench/results/ledger_fleet.json``.

Batched charges (``--batch``): session-charges per second, batched against sequential, in the
same run and on the same history. Two populations of ``--batch-sessions`` sessions with the
same seeded history (a few chunk ticks and cohort buckets each, of varying length, so that
their accounting counts differ as in a fleet), on a PostgreSQL ledger (``synchronous_commit``
on) and an SQLite one (``FULL``), with a fleet plan's caps (10 ε per hour of gaze, (ε, δ)
composition). Each round charges every session of each population once for a chunk tick
(pure ε per feature, the ~17 kB chunk payload) and once for a cohort bucket (the cohort's
Gaussian event, a receipt payload): the sequential population one ``Ledger.charge`` per session
(its own transaction; the cohort step also previews each session first, as the cohort did),
the batched one ``Ledger.charge_many`` (chunk tick) and ``Ledger.charge_admitted`` (cohort
bucket: the rows read and locked once, the admitted told to the cohort, all charged), each one
transaction. A third population with the same
history is charged first in each round, untimed: it pays the accountant's compositions for the
round's new counts (milliseconds of FFTs per new count, the same for either way of charging;
in a running fleet the ledger's prefetch composes them ahead), so the rows time the ledger.
Which timed population goes first alternates by round; the slowest round of each is reported.
``python bench/bench_ledger.py --batch`` writes
``bench/results/ledger_batch.json``.
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
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from gazeguard.ledger import Ledger, pure_cost
from gazeguard.plan import ReleasePlan

RESULTS = Path(__file__).resolve().parent / "results" / "ledger.json"
N_FEATURES, N_STEPS = 52, 32
EPS = pure_cost({f"feature_{k:02d}": 0.05 for k in range(N_FEATURES)})


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


# ---- the fleet pattern -----------------------------------------------------------------------

FLEET_RESULTS = Path(__file__).resolve().parent / "results" / "ledger_fleet.json"
CHUNK_S = 16.0  # a 120 Hz session completes a 32-step chunk every 16 s of gaze
HISTORY = 225  # one hour of chunks
BASE = 1.7e9  # Unix time of the first chunk's gaze end (history starts here)


def _fleet_pipeline(ledger: Ledger, session: str) -> Any:
    from gazeguard.config import Settings  # noqa: PLC0415
    from gazeguard.runtime.pipeline import Pipeline  # noqa: PLC0415

    s = Settings()
    return Pipeline(
        ledger, session=session, device="d", rate_hz=120.0, features=s.features,
        mechanism=s.mechanism, clock_offset_s=0.0,
    )  # fmt: skip


def _gaze_end(session: int, index: int, sessions: int) -> float:
    """Chunk ``index`` of session ``session``: sessions staggered evenly over 16 s."""
    return BASE + index * CHUNK_S + session * CHUNK_S / sessions


def fleet_seed(path: Path, sessions: int, history: int) -> None:
    """A ledger with ``history`` delivered chunks per session, as the ledger writes them (rows
    straight into the tables: seconds instead of minutes of charges)."""
    from gazeguard.config import Settings  # noqa: PLC0415
    from gazeguard.ledger._request import checked_release  # noqa: PLC0415

    settings = Settings()
    caps = ReleasePlan.from_settings(settings).ledger_caps(settings.ledger)
    with tempfile.TemporaryDirectory() as tmp, Ledger(Path(tmp) / "x.sqlite", caps=caps) as scratch:
        release = checked_release(_fleet_pipeline(scratch, "probe")._cost)
    with Ledger(path, caps=caps):
        pass  # the tables
    caps_json = caps.to_json()
    events, units, eps_json = release.events, release.units, release.epsilon_json
    with closing(sqlite3.connect(path)) as db, db:
        # a ledger as written before the per-session pending index (the "before" code lacks it;
        # the code under test creates it on open)
        db.execute("DROP INDEX IF EXISTS outbox_session_pending")
        ids = {}
        for key in events:
            db.execute("INSERT INTO events (key) VALUES (?)", (key,))
            ids[key] = db.execute("SELECT id FROM events WHERE key = ?", (key,)).fetchone()[0]
        for i in range(sessions):
            name = f"s{i:04d}"
            ends = [_gaze_end(i, j, sessions) for j in range(history)]
            counts = json.dumps({k: n * history for k, n in events.items()}, sort_keys=True)
            db.execute(  # its counters count all its charges (no bounds yet)
                "INSERT INTO sessions (session, caps, version, chunks, spent, pure_finite, "
                "max_chunk, last_chunk, last_gaze_end, created, gaze_counts, wall_counts, "
                "gaze_first, wall_first, counts) VALUES (?,?,?,?,?,1,?,?,?,?,?,?,?,?,?)",
                (name, caps_json, history, history, units * history, units, history - 1,
                 ends[-1], ends[0], counts, counts, ends[0], ends[0], counts),
            )  # fmt: skip
            for key, n in events.items():
                db.executemany(
                    "INSERT INTO charge_events VALUES (?, 'chunks', ?, ?, ?)",
                    [(name, j, ids[key], n) for j in range(history)],
                )
            db.executemany(
                "INSERT INTO charges VALUES (?, 'chunks', ?, ?, ?, ?, ?, ?)",
                [(name, j, units, eps_json, e - 15.5, e, e) for j, e in enumerate(ends)],
            )
            db.executemany(
                "INSERT INTO outbox (session, stream, idx, topic, payload, created, delivered, "
                "state) VALUES (?, 'chunks', ?, 't', NULL, ?, ?, 'delivered')",
                [(name, j, e, e + 0.1) for j, e in enumerate(ends)],
            )


class _FleetClock:
    """The ledger module's ``time``, with the wall clock at the simulated fleet's now."""

    now = 0.0
    monotonic = staticmethod(time.monotonic)
    perf_counter = staticmethod(time.perf_counter)

    def time(self) -> float:
        return self.now


def fleet_worker(path: Path, sessions: int, history: int) -> None:
    """Serve rounds asked for on stdin (JSON ``{"chunks": n}``), answering each with its CPU and
    wall time on stdout; the publisher's deliveries after each round are not timed."""
    import random  # noqa: PLC0415

    import gazeguard.ledger._ledger as ledger_module  # noqa: PLC0415
    from gazeguard.config import Settings  # noqa: PLC0415
    from gazeguard.core.chunking import Chunk  # noqa: PLC0415
    from gazeguard.runtime.pipeline import release_group  # noqa: PLC0415

    clock = _FleetClock()
    clock.now = _gaze_end(0, history, sessions)
    ledger_module.time = clock  # type: ignore[assignment]
    settings = Settings()
    ledger = Ledger(path, caps=ReleasePlan.from_settings(settings).ledger_caps(settings.ledger))
    pipes = [_fleet_pipeline(ledger, f"s{i:04d}") for i in range(sessions)]
    rng = np.random.default_rng(7)
    sizes = random.Random(7)
    order = 0  # chunks come due round-robin: session order % N, each at its next index
    values = rng.normal(size=(48, 32))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        want = int(json.loads(line)["chunks"])
        groups = []
        while want > 0:
            jobs = []
            for _ in range(min(sizes.randint(1, 8), want)):
                i, j = order % sessions, history + order // sessions
                order += 1
                end = _gaze_end(i, j, sessions)
                steps = end - 15.5 + 0.5 * np.arange(32)
                jobs.append((pipes[i], Chunk(j, values + rng.normal(size=values.shape), steps)))
            groups.append((end, jobs))
            want -= len(jobs)
        released = 0
        c0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
        for end, jobs in groups:
            clock.now = end + 0.05
            released += sum(r is not None for r in release_group(jobs))
        c1, p1, w1 = time.thread_time(), time.process_time(), time.perf_counter()
        for item in ledger.pending():
            ledger.mark_delivered(item.id)
        out = {"thread": c1 - c0, "process": p1 - p0, "wall": w1 - w0, "released": released}
        print(json.dumps(out), flush=True)
    ledger.close()


def fleet(sessions_list: list[int], before: Path | None, rounds: int, chunks: int) -> None:
    """The fleet rows: per N, this code (and ``before``'s) interleaved round by round."""
    here = Path(__file__).resolve().parent.parent
    roots = {"after": here} if before is None else {"before": before.resolve(), "after": here}
    rows = []
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        for n in sessions_list:
            seed = Path(tmp) / f"seed{n}.sqlite"
            fleet_seed(seed, n, HISTORY)
            procs = {}
            for name, root in roots.items():
                path = Path(tmp) / f"{name}{n}.sqlite"
                shutil.copy(seed, path)
                procs[name] = subprocess.Popen(
                    [sys.executable, __file__, "--fleet-worker", str(path), "--sessions", str(n)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                    env={**os.environ, "PYTHONPATH": str(root)},
                )  # fmt: skip
            seed.unlink()

            def ask(proc: subprocess.Popen[str], k: int) -> dict[str, float]:
                assert proc.stdin is not None
                assert proc.stdout is not None
                proc.stdin.write(json.dumps({"chunks": k}) + "\n")
                proc.stdin.flush()
                return dict(json.loads(proc.stdout.readline()))

            for proc in procs.values():
                assert proc.stdout is not None
                json.loads(proc.stdout.readline())  # ready
                ask(proc, n)  # warm-up: every session once
            got: dict[str, list[dict[str, float]]] = {name: [] for name in procs}
            for _ in range(rounds):
                for name, proc in procs.items():
                    got[name].append(ask(proc, chunks))
            for name, proc in procs.items():
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(60)
                row: dict[str, Any] = {"sessions": n, "code": name, "root": str(roots[name])}
                for key in ("thread", "process", "wall"):
                    row[f"{key}_ms_per_chunk"] = statistics.median(
                        r[key] / chunks * 1e3 for r in got[name]
                    )
                row["released"] = sum(int(r["released"]) for r in got[name])
                row["chunks"] = rounds * chunks
                rows.append(row)
    print(f"release_group, fleet pattern: {rounds} rounds of {chunks} chunks, groups of 1-8")
    head = f"{'sessions':>8} {'code':7} {'thread ms':>10} {'process ms':>11} {'wall ms':>8}"
    print(head + " released (ms per chunk, medians of the rounds)")
    for r in rows:
        print(
            f"{r['sessions']:8d} {r['code']:7} {r['thread_ms_per_chunk']:10.3f} "
            f"{r['process_ms_per_chunk']:11.3f} {r['wall_ms_per_chunk']:8.3f} "
            f"{r['released']}/{r['chunks']}"
        )
    doc = {
        "benchmark": "ledger_fleet",
        "history_chunks": HISTORY,
        "rounds": rounds,
        "chunks_per_round": chunks,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "sqlite_version": sqlite3.sqlite_version,
        "results": rows,
    }
    FLEET_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    FLEET_RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {FLEET_RESULTS}")


def by_position(
    locations: dict[str, tuple[str | Path, str]], n: int, sessions: int, payload: bytes
) -> dict[str, dict[str, float]]:
    """Per configuration and mode, median charge latency (ms) at the first and the last 25
    positions of ``n`` charges of a session within one hour (see the module docstring)."""
    band = min(25, n // 4)
    rows: dict[str, dict[str, float]] = {}
    with ExitStack() as stack:
        ledgers: dict[tuple[str, str], Ledger] = {}
        for name, (loc, sync) in locations.items():
            for mode in ("counters", "recount"):
                ledgers[name, mode] = stack.enter_context(
                    Ledger(
                        loc, synchronous=sync, session_cap=1e9, window_cap=1e9,  # type: ignore[arg-type]
                        wall_clock=True, counters=mode == "counters",
                    )
                )  # fmt: skip
        lat: dict[tuple[str, str], list[list[float]]] = {k: [] for k in ledgers}
        for s in range(sessions):
            for key in ledgers:
                lat[key].append([])
            for i in range(n):
                for key, ledger in ledgers.items():  # interleaved: the machine's noise alike
                    t0 = time.perf_counter()
                    ledger.charge(f"pos-{key[1]}-{s}", i, EPS, "t", payload)
                    lat[key][s].append(time.perf_counter() - t0)
    for (name, mode), runs in lat.items():
        measured = runs[1:] or runs  # the first session fills the accountant's caches
        first = statistics.median(r[i] for r in measured for i in range(band)) * 1e3
        last = statistics.median(r[i] for r in measured for i in range(n - band, n)) * 1e3
        rows[f"{name}, {mode}"] = {
            "first_ms": first, "last_ms": last, "last_over_first": last / first,
            "positions": band, "charges": n, "sessions_measured": len(measured),
        }  # fmt: skip
    return rows


def print_by_position(rows: dict[str, dict[str, float]]) -> None:
    any_row = next(iter(rows.values()))
    band, n = int(any_row["positions"]), int(any_row["charges"])
    print(
        f"charge by position in the hour: median ms of charges 1-{band} and "
        f"{n - band + 1}-{n}, {int(any_row['sessions_measured'])} sessions"
    )
    print(f"{'configuration, mode':44} {'first':>8} {'last':>8} {'last/first':>10}")
    for name, r in rows.items():
        print(f"{name:44} {r['first_ms']:8.3f} {r['last_ms']:8.3f} {r['last_over_first']:10.2f}")


# ---- batched charges ----------------------------------------------------------------------

BATCH_RESULTS = Path(__file__).resolve().parent / "results" / "ledger_batch.json"
BATCH_EPS = pure_cost({f"feature_{k:02d}": 0.0005 for k in range(N_FEATURES)})  # 0.026 ε per chunk


def _batch_plan() -> Any:
    from gazeguard.plan.cohort import plan_cohort  # noqa: PLC0415

    return plan_cohort(
        ["fixation_rate", "pupil_mean"], [0.0, 2.0], [5.0, 8.0], ["1/s", "mm"],
        ("read", "watch", "browse"), bucket_s=60.0, per_hour=63, budget=5.0, delta=5e-7,
    )  # fmt: skip


class _Population:
    """``n`` sessions named ``{tag}-{i}`` with their next chunk index and cohort bucket."""

    def __init__(self, tag: str, n: int, t0: float) -> None:
        self.names = [f"{tag}-{i:05d}" for i in range(n)]
        self.chunk = 0
        self.bucket = int(t0 // 60.0)

    def chunk_requests(self, payload: bytes) -> list[Any]:
        from gazeguard.ledger import ChargeRequest  # noqa: PLC0415

        k = self.chunk
        end = (self.bucket + 1) * 60.0  # (in gaze order with the cohort's buckets)
        return [
            ChargeRequest(s, k, BATCH_EPS, f"gazeguard/v1/hmd/{s}/chunks", payload,
                          gaze=(end - 16.0, end))
            for s in self.names
        ]  # fmt: skip

    def cohort_requests(self, cost: Any, receipt: bytes) -> list[Any]:
        from gazeguard.ledger import ChargeRequest  # noqa: PLC0415

        b = self.bucket
        return [
            ChargeRequest(s, b, cost, f"gazeguard/v1/hmd/{s}/cohort", receipt,
                          gaze=(b * 60.0, b * 60.0 + 60.0), stream="cohort")
            for s in self.names
        ]  # fmt: skip


def batch_bench(location: str | Path, sync: str, n: int, rounds: int) -> dict[str, Any]:
    """Sequential against batched charges on one ledger (see the module docstring)."""
    from gazeguard.ledger import Charge  # noqa: PLC0415

    plan = _batch_plan()
    events = {"cohort": plan.event}
    payload, receipt = make_payload(), json.dumps({"receipt": "x" * 200}).encode()
    t0 = time.time() - 3600.0
    pops = {
        "sequential": _Population("seq", n, t0),
        "batched": _Population("bat", n, t0),
        "warm": _Population("warm", n, t0),  # pays each round's new compositions, untimed
    }
    caps = {"window_cap": 10.0, "window_s": 3600.0 + 64.0, "delta": 1e-6}
    out: dict[str, Any] = {"sessions": n, "rounds": rounds}
    with Ledger(location, synchronous=sync, **caps) as ledger:  # type: ignore[arg-type]
        # the seeded history: 2-9 chunk ticks and cohort buckets per session (counts differ)
        for pop in pops.values():
            for h in range(9):
                keep = [s for i, s in enumerate(pop.names) if h < 2 + i % 8]
                for reqs in (pop.chunk_requests(payload), pop.cohort_requests(events, receipt)):
                    got = ledger.charge_many([r for r in reqs if r.session in keep])
                    assert all(isinstance(c, Charge) for c in got), got[:1]
                pop.chunk += 1
                pop.bucket += 1
        steps: dict[str, dict[str, list[float]]] = {
            name: {"chunk": [], "cohort": []} for name in ("sequential", "batched")
        }
        for r in range(rounds):
            warm = pops["warm"]
            for reqs in (warm.chunk_requests(payload), warm.cohort_requests(events, receipt)):
                ledger.charge_many(reqs)
            warm.chunk += 1
            warm.bucket += 1
            order = ["sequential", "batched"] if r % 2 else ["batched", "sequential"]
            for name in order:
                pop = pops[name]
                chunks = pop.chunk_requests(payload)
                cohort = pop.cohort_requests(events, receipt)
                t = time.perf_counter()
                if name == "batched":
                    got = ledger.charge_many(chunks)
                    assert all(isinstance(c, Charge) for c in got), got[:1]
                else:
                    for q in chunks:
                        ledger.charge(q.session, q.chunk_index, q.cost, q.topic, q.payload,
                                      gaze=q.gaze)  # fmt: skip
                steps[name]["chunk"].append(time.perf_counter() - t)
                t = time.perf_counter()
                if name == "batched":
                    messages = [(q.topic, q.payload) for q in cohort]
                    got = ledger.charge_admitted(  # as the cohort does: one read, one write
                        cohort, lambda positions, m=messages: [m[i] for i in positions]
                    )
                    assert all(isinstance(c, Charge) for c in got), got[:1]
                else:
                    for q in cohort:
                        ledger.preview(q.session, q.cost, gaze=q.gaze)
                        ledger.charge(q.session, q.chunk_index, q.cost, q.topic, q.payload,
                                      gaze=q.gaze, stream="cohort")  # fmt: skip
                steps[name]["cohort"].append(time.perf_counter() - t)
                pop.chunk += 1
                pop.bucket += 1
        problems = ledger.verify()
    for name, by_step in steps.items():
        out[name] = {
            step: {
                "seconds": [round(x, 4) for x in secs],
                "slowest_s": max(secs),
                "session_charges_per_s_slowest": n / max(secs),
                "session_charges_per_s_median": n / statistics.median(secs),
            }
            for step, secs in by_step.items()
        }
    for step in ("chunk", "cohort"):
        out[f"speedup_{step}_slowest"] = (
            out["sequential"][step]["slowest_s"] / out["batched"][step]["slowest_s"]
        )
    out["ledger_verify"] = problems
    return out


def batch(n: int, rounds: int) -> None:
    """``--batch``: sequential against batched charges, PostgreSQL and SQLite."""
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp, postgres_server() as url:
        if url is not None:
            results["postgresql sync commit"] = batch_bench(url, "FULL", n, rounds)
        else:
            print("PostgreSQL skipped: needs gazeguard[fleet] and apt-get install postgresql")
        results["sqlite FULL"] = batch_bench(Path(tmp) / "b.sqlite", "FULL", n, rounds)
    print(f"session-charges per second, {n} sessions per step, slowest of {rounds} rounds")
    print(f"{'ledger':24} {'step':7} {'sequential':>11} {'batched':>9} {'speedup':>8}")
    for name, r in results.items():
        for step in ("chunk", "cohort"):
            seq = r["sequential"][step]["session_charges_per_s_slowest"]
            bat = r["batched"][step]["session_charges_per_s_slowest"]
            print(f"{name:24} {step:7} {seq:11.0f} {bat:9.0f} {bat / seq:7.1f}x")
    doc = {
        "benchmark": "ledger_batch",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_avg": list(os.getloadavg())},
        "sqlite_version": sqlite3.sqlite_version,
        "payload_bytes": len(make_payload()),
        "results": results,
    }  # fmt: skip
    BATCH_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    BATCH_RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {BATCH_RESULTS}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=600, help="charges per configuration")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds (noise)")
    parser.add_argument("--fleet", action="store_true", help="the fleet pattern instead")
    parser.add_argument("--sessions", default="200,1000", help="fleet: session counts")
    parser.add_argument("--chunks", type=int, default=200, help="fleet: chunks per round")
    parser.add_argument("--before", type=Path, help="fleet: also run the gazeguard at PATH")
    parser.add_argument("--fleet-worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--batch", action="store_true", help="batched against sequential")
    parser.add_argument("--batch-sessions", type=int, default=1000, help="batch: sessions")
    parser.add_argument("--batch-rounds", type=int, default=4, help="batch: rounds")
    parser.add_argument(
        "--position", action="store_true", help="only the charge cost by position in the hour"
    )
    parser.add_argument(
        "--position-sessions", type=int, default=4, help="sessions of --charges each (position)"
    )
    args = parser.parse_args()
    if args.fleet_worker is not None:
        fleet_worker(args.fleet_worker, int(args.sessions), HISTORY)
        return
    if args.batch:
        batch(args.batch_sessions, args.batch_rounds)
        return
    if args.fleet:
        sessions = [int(x) for x in args.sessions.split(",")]
        fleet(sessions, args.before, args.rounds, args.chunks)
        return
    n, rounds = args.charges, args.rounds
    payload = make_payload()
    if args.position:
        with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp, postgres_server() as url:
            locs: dict[str, tuple[str | Path, str]] = {
                "sqlite FULL": (Path(tmp) / "p.sqlite", "FULL")
            }
            if url is not None:
                locs["postgresql sync commit"] = (url, "FULL")
            position = by_position(locs, n, args.position_sessions, payload)
        print_by_position(position)
        doc = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {"benchmark": "ledger"}
        doc["by_position"] = position
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {RESULTS}")
        return
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
        position_at = {"sqlite FULL": (d / "pos.sqlite", "FULL")}
        if url is not None:
            position_at["postgresql sync commit"] = (url, "FULL")
        position = by_position(position_at, n, args.position_sessions, payload)
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
    print_by_position(position)
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
        "by_position": position,
    }
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
