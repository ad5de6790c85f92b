"""Before/after the re-layering, same run: mechanism, charge, message and fleet cost of two trees.

"Before" is a git worktree of ``--base`` (default 3a735ec, the code before the package was
re-layered), created with ``git worktree add --detach`` at ``--before`` (default ``../before``
next to this checkout) if it is not there, reused if it is; "after" is this checkout (or
``--after``) as it is on disk. Every measurement runs in a child process with
``PYTHONPATH=<tree>`` and ``cwd=<tree>``, so each tree imports its own ``gazeguard`` (the child
reports ``gazeguard.__file__``, and the driver refuses a child that imported the other tree's
code). Per repeat, every area runs before then after (the order alternates from one repeat to
the next, so slow drift of the shared machine cancels); the table gives, per tree, the median and
the min–max over the repeats, and the ratio of the medians, after / before (> 1: after is
slower; every metric here is lower-is-better).

What is measured, and in which units:

- **mechanism**: ``Mechanism.release`` of one chunk at the default shape (48 shipped features ×
  n = 32 steps, ``feature_bounds()``, dft, k = 4, ε = 1, secure noise from ``os.urandom``) for
  LPA, FPA, CFPA and DCFPA, built with ``make_mechanism`` (same signature in both trees). Each
  release is timed alone (``perf_counter_ns``) in rounds that interleave the four mechanisms;
  p50 and p99 in µs per chunk, and DCFPA's mean CPU time (``process_time``) in µs per chunk.
- **charge**: ``Ledger.charge`` (cap checks, charge row, the outbox payload, one durable
  transaction) of a 52-feature ε map and a ~17 kB payload (as ``bench_ledger.py``), caps as the
  sidecar's (a window cap over the hour of gaze and wall-clock time, default (ε, δ)
  composition), SQLite (WAL, ``synchronous=FULL``) and, if the server binaries and psycopg are
  there, PostgreSQL (synchronous commit; one throwaway server for the whole run, a fresh database
  per child). Sessions of ``--charges`` charges each, all within one hour; the first session only
  fills the accountant's caches. p50 and p99 latency in ms over the other sessions, and the
  median of positions 1–25 and of the last 25 positions (the 1st vs the 600th chunk of an hour,
  as ``bench_ledger.py --position``).
- **message**: building one chunk message and its payload, as a release does after its
  charge preview (``ChunkMessage.build`` from a DCFPA release of the 48 × 32 chunk above, that
  mechanism's ``MechanismParams``, a ``LedgerSnapshot``; then ``to_payload``): p50 and p99 in
  µs per chunk, and the payload's bytes. Same signature in both trees. A fleet worker builds
  the chunks that fall due in one batch one after another, so this is on every chunk's
  block → chunk latency.
- **fleet**: each tree's own ``bench/bench_fleet.py`` (the two differ only in import paths and
  one chunk topic pattern) at FIXED levels (``--levels``, default 400 and 600 simulated 120 Hz
  sessions; 1-s blocks), one worker, one run per child: the worker's CPU in % of one core
  (psutil, all threads) over ``--fleet-seconds`` − 3 s of steady state, the same per session
  (ms of CPU per session-second), and block → privatized-chunk latency p50/p99 in ms (through
  NATS JetStream and Mosquitto). Its result file goes to a temporary directory (an absolute
  ``--name``), never to a tree's ``bench/results/``; the driver checks that the trees'
  committed ``fleet.json``, ``ledger.json`` and ``mechanisms.json`` are byte-identical
  afterwards and puts them back if not.

    python bench/bench_compare.py                # full: 3 repeats (~30 min on 2 cores, alone)
    python bench/bench_compare.py --quick        # smoke: 1 repeat, short runs (~3 min)
    python bench/bench_compare.py --areas mechanism,charge --repeats 5

prints the table and writes ``bench/results/compare.json`` (``--out`` to write elsewhere).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

from _harness import machine

ROOT = Path(__file__).resolve().parents[1]  # the "after" checkout by default
RESULTS = ROOT / "bench" / "results" / "compare.json"
DEFAULT_BASE = "3a735ec"
AREAS = ("mechanism", "charge", "message", "fleet")
#: committed result files a child could in principle write (guarded, restored if changed)
GUARDED = ("fleet.json", "ledger.json", "mechanisms.json")
MECHANISMS = ("lpa", "fpa", "cfpa", "dcfpa")
N_STEPS, K, EPSILON = 32, 4, 1.0
CHARGE_FEATURES = 52  # as bench_ledger.py: a 52 × 32 JSON payload, ε per feature
BAND = 25  # charge positions 1–25 and the last 25 of a session
RESULT_PREFIX = "BENCH_COMPARE_RESULT "


# ================================================================== children (run in each tree)
def _gazeguard_file() -> str:
    import gazeguard  # noqa: PLC0415 - whichever tree PYTHONPATH selects

    return str(Path(gazeguard.__file__).resolve())


def child_mechanism(opts: dict[str, Any]) -> dict[str, Any]:
    """µs per ``release`` of a (48, 32) chunk, per mechanism (see the module docstring)."""
    import numpy as np  # noqa: PLC0415

    try:  # after the re-layering
        from gazeguard.privacy.mechanisms import Bounds, make_mechanism  # noqa: PLC0415
        from gazeguard.signal.features import feature_bounds  # noqa: PLC0415
    except ImportError:  # before: top-level modules
        from gazeguard.features import feature_bounds  # type: ignore[import-not-found,no-redef]  # noqa: PLC0415
        from gazeguard.mechanisms import Bounds, make_mechanism  # type: ignore[import-not-found,no-redef]  # noqa: PLC0415

    lo, hi, step = feature_bounds()
    bounds = Bounds(lo, hi, step)
    span = (hi - lo)[:, None]
    rng = np.random.default_rng(42)
    x = rng.uniform(lo[:, None] - 0.05 * span, hi[:, None] + 0.05 * span, (len(lo), N_STEPS))
    mechs = {
        name: make_mechanism(name, n=N_STEPS, k=K, epsilon=EPSILON, bounds=bounds)
        for name in MECHANISMS
    }
    for mech in mechs.values():
        assert mech.secure
        for _ in range(opts["warmup"]):
            mech.release(x)
    ns: dict[str, list[int]] = {name: [] for name in mechs}
    cpu: dict[str, float] = dict.fromkeys(mechs, 0.0)
    clock = time.perf_counter_ns
    for _ in range(opts["rounds"]):
        for name, mech in mechs.items():  # interleaved: the machine's noise on all alike
            c0 = time.process_time()
            for _ in range(opts["batch"]):
                t0 = clock()
                mech.release(x)
                ns[name].append(clock() - t0)
            cpu[name] += time.process_time() - c0
    out: dict[str, Any] = {"features": len(lo), "n": N_STEPS, "k": K, "epsilon": EPSILON}
    for name, values in ns.items():
        us = np.asarray(values) / 1e3
        out[name] = {
            "calls": len(values),
            "p50_us": float(np.percentile(us, 50)),
            "p99_us": float(np.percentile(us, 99)),
            "mean_us": float(us.mean()),
            "cpu_mean_us": cpu[name] / len(values) * 1e6,
        }
    return out


def child_message(opts: dict[str, Any]) -> dict[str, Any]:
    """µs per chunk message built and serialised (see the module docstring)."""
    import types  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    try:  # after the re-layering
        from gazeguard.privacy.mechanisms import Bounds, make_mechanism  # noqa: PLC0415
        from gazeguard.signal.features import FEATURES, feature_bounds  # noqa: PLC0415
        from gazeguard.wire.message import (  # noqa: PLC0415
            ChunkMessage,
            LedgerSnapshot,
            MechanismParams,
        )
    except ImportError:  # before: top-level modules
        from gazeguard.features import FEATURES, feature_bounds  # type: ignore[import-not-found,no-redef]  # noqa: PLC0415
        from gazeguard.mechanisms import Bounds, make_mechanism  # type: ignore[import-not-found,no-redef]  # noqa: PLC0415
        from gazeguard.message import (  # type: ignore[import-not-found,no-redef]  # noqa: PLC0415
            ChunkMessage,
            LedgerSnapshot,
            MechanismParams,
        )

    lo, hi, step = feature_bounds()
    rng = np.random.default_rng(42)
    x = rng.uniform(lo[:, None], hi[:, None], (len(lo), N_STEPS))
    mech = make_mechanism("dcfpa", n=N_STEPS, k=K, epsilon=EPSILON, bounds=Bounds(lo, hi, step))
    values = mech.release(x)
    params = MechanismParams.from_mechanism(mech)
    chunk_eps = params.pure_total
    state = types.SimpleNamespace(
        epsilon=3.0, delta=1e-6, epsilon_window=2.0, window_s=3700.0, spent=10 * chunk_eps,
        remaining=None, max_chunk_eps=chunk_eps, session_cap=None, window_cap=10.0,
    )  # fmt: skip
    names, units = [f.name for f in FEATURES], [f.unit for f in FEATURES]
    t = 100.0 + 0.5 * np.arange(N_STEPS)

    def once(index: int) -> bytes:
        msg = ChunkMessage.build(
            session="s1", device="hmd-01", chunk_index=index, timestamps=t, features=names,
            units=units, values=values, mechanism=params,
            ledger=LedgerSnapshot.from_state(chunk_eps, state), unix_offset=1.7e9,
        )  # fmt: skip
        return bytes(msg.to_payload())

    for i in range(opts["warmup"]):
        once(i)
    ns: list[int] = []
    clock = time.perf_counter_ns
    for i in range(opts["rounds"] * opts["batch"] // 10):
        t0 = clock()
        payload = once(i)
        ns.append(clock() - t0)
    us = np.asarray(ns) / 1e3
    return {
        "calls": len(ns),
        "p50_us": float(np.percentile(us, 50)),
        "p99_us": float(np.percentile(us, 99)),
        "payload_bytes": len(payload),
    }


def _charge_payload() -> bytes:
    import numpy as np  # noqa: PLC0415

    values = np.random.default_rng(42).normal(size=(CHARGE_FEATURES, N_STEPS)).round(6).tolist()
    return json.dumps({"session": "bench", "values": values}).encode()


@contextmanager
def _fresh_database(url: str, name: str) -> Iterator[str]:
    """A new database ``name`` on the server at ``url`` (dropped afterwards): the two trees'
    ledger schemas differ, so each child gets its own."""
    import psycopg  # noqa: PLC0415 - the fleet extra, present in both trees' environment

    with psycopg.connect(url, autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{name}"')
        db.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(url, autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def child_charge(opts: dict[str, Any]) -> dict[str, Any]:
    """ms per ``Ledger.charge`` per backend, overall and by position in the hour."""
    import numpy as np  # noqa: PLC0415

    from gazeguard.ledger import Ledger  # noqa: PLC0415 - same path in both trees

    n, sessions = opts["charges"], opts["sessions"]
    band = min(BAND, n // 4)
    payload = _charge_payload()
    eps = {f"feature_{k:02d}": 0.05 for k in range(CHARGE_FEATURES)}
    lat: dict[str, list[list[float]]] = {}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp, ExitStack() as stack:
        locations: dict[str, str | Path] = {"sqlite FULL": Path(tmp) / "charge.sqlite"}
        if opts.get("postgres"):
            db = f"gg_compare_{os.getpid()}"
            locations["postgresql sync commit"] = stack.enter_context(
                _fresh_database(opts["postgres"], db)
            )
        ledgers = {
            name: stack.enter_context(
                Ledger(loc, synchronous="FULL", session_cap=1e9, window_cap=1e9, wall_clock=True)
            )
            for name, loc in locations.items()
        }
        lat = {name: [] for name in ledgers}
        for s in range(sessions):
            for runs in lat.values():
                runs.append([])
            for i in range(n):
                for name, ledger in ledgers.items():  # interleaved charge by charge
                    t0 = time.perf_counter()
                    ledger.charge(f"s{s}", i, eps, "gazeguard/v1/d/s/chunks", payload)
                    lat[name][s].append(time.perf_counter() - t0)
    out: dict[str, Any] = {
        "charges_per_session": n,
        "sessions": sessions,
        "sessions_measured": max(1, sessions - 1),
        "positions": band,
        "payload_bytes": len(payload),
    }
    for name, runs in lat.items():
        measured = runs[1:] or runs  # the first session fills the accountant's caches
        ms = np.asarray([v for r in measured for v in r]) * 1e3
        first = statistics.median(r[i] for r in measured for i in range(band)) * 1e3
        last = statistics.median(r[i] for r in measured for i in range(n - band, n)) * 1e3
        out[name] = {
            "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()),
            "first_ms": first,
            "last_ms": last,
            "last_over_first": last / first,
        }
    return out


def child_main(area: str, opts_json: str, out: Path) -> None:
    """``--child AREA``: measure in this process's tree and write the JSON to ``out``."""
    opts = json.loads(opts_json)
    doc: dict[str, Any] = {"gazeguard_file": _gazeguard_file(), "load_before": os.getloadavg()}
    child = {"mechanism": child_mechanism, "charge": child_charge, "message": child_message}
    doc["metrics"] = child[area](opts)
    doc["load_after"] = os.getloadavg()
    out.write_text(json.dumps(doc, indent=1) + "\n")


# ================================================================================ the driver
def git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.rstrip()


def ensure_worktree(repo: Path, ref: str, path: Path, *, move: bool = False) -> str:
    """The worktree of ``ref`` at ``path``: created (detached) if absent; if present and at
    another commit, an error, or with ``move`` (the --after-ref worktree, which is ours) checked
    out at ``ref`` if it has no changes. Returns the commit."""
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}", cwd=repo)
    path = path.resolve()
    if path == repo.resolve() or repo.resolve() in path.parents:
        raise SystemExit(f"worktree {path} must be outside the checkout {repo}")
    if not path.exists():
        print(f"creating worktree {path} at {ref} ({commit[:10]})", flush=True)
        git("worktree", "add", "--detach", str(path), commit, cwd=repo)
    elif (head := git("rev-parse", "HEAD", cwd=path)) != commit:
        if not move or git("status", "--porcelain", "--untracked-files=no", cwd=path):
            raise SystemExit(f"{path} is at {head[:10]}, not {ref} ({commit[:10]}): move it aside")
        print(f"worktree {path}: {head[:10]} -> {ref} ({commit[:10]})", flush=True)
        git("checkout", "--quiet", "--detach", commit, cwd=path)
    return commit


def child_env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def tree_info(name: str, tree: Path) -> dict[str, Any]:
    """Commit, uncommitted changes under gazeguard/, and what ``import gazeguard`` finds there
    (with the environment and working directory the children and fleet workers get)."""
    found = subprocess.run(
        [sys.executable, "-c", "import gazeguard; print(gazeguard.__file__)"],
        env=child_env(tree), cwd=tree, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    if not Path(found).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"{name}: PYTHONPATH={tree} imports gazeguard from {found}")
    dirty = git("status", "--porcelain", "--", "gazeguard", "bench", cwd=tree).splitlines()
    return {
        "path": str(tree),
        "commit": git("rev-parse", "HEAD", cwd=tree),
        "subject": git("log", "-1", "--format=%s", cwd=tree)[:120],
        "uncommitted": dirty,
        "gazeguard_file": found,
    }


class Guard:
    """The trees' committed result files a bench child could write: their bytes taken just
    before each child (:meth:`snapshot`) and compared just after (:meth:`check`); a file the
    child changed is put back, with a warning."""

    def __init__(self, trees: list[Path]) -> None:
        self.paths = [tree / "bench" / "results" / name for tree in trees for name in GUARDED]
        self.saved: dict[Path, bytes | None] = {}
        self.restored: list[str] = []

    @staticmethod
    def _read(p: Path) -> bytes | None:
        return p.read_bytes() if p.is_file() else None

    def snapshot(self) -> None:
        self.saved = {p: self._read(p) for p in self.paths}

    def check(self) -> None:
        for p, data in self.saved.items():
            if self._read(p) == data:
                continue
            print(f"WARNING: {p} changed during a child: restored", flush=True)
            self.restored.append(str(p))
            if data is None:
                p.unlink()
            else:
                p.write_bytes(data)


def run_child(area: str, tree: Path, opts: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """One mechanism or charge measurement in ``tree`` (this script as a child)."""
    out = tmp / f"{area}-{time.monotonic_ns()}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", area,
           "--child-opts", json.dumps(opts), "--child-out", str(out)]  # fmt: skip
    proc = subprocess.run(
        cmd, check=False, env=child_env(tree), cwd=tree, capture_output=True, text=True,
        timeout=1800,
    )  # fmt: skip
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"{area} child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(out.read_text())
    if not Path(doc["gazeguard_file"]).is_relative_to(tree.resolve()):
        raise RuntimeError(f"{area} child in {tree} imported {doc['gazeguard_file']}")
    return doc


def run_fleet(tree: Path, sessions: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One fixed-level run of ``tree``'s own bench_fleet.py with ``tree``'s gazeguard."""
    stem = tmp / f"fleet-{tree.name}-{sessions}-{time.monotonic_ns()}"
    cmd = [sys.executable, str(tree / "bench" / "bench_fleet.py"),
           "--levels", str(sessions), "--workers", "1", "--repeats", "1",
           "--window", f"{args.fleet_window:g}", "--seconds", f"{args.fleet_seconds:g}",
           "--block-samples", str(args.block_samples),
           "--name", str(stem)]  # fmt: skip  # absolute: bench/results/ is not touched
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=child_env(tree), cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    tail: list[str] = []
    for line in proc.stdout:
        tail = [*tail[-40:], line.rstrip()]
        if line.startswith("["):  # the bench's one line per run
            print(f"    {line.rstrip()}", flush=True)
    code = proc.wait()
    path = stem.with_suffix(".json")
    if code != 0 or not path.is_file():
        raise RuntimeError(f"bench_fleet in {tree} failed ({code}):\n" + "\n".join(tail))
    doc = json.loads(path.read_text())
    run, level = doc["runs"][0], doc["summary"][0]
    if not Path(run["code"]).resolve() == tree.resolve():
        raise RuntimeError(f"bench_fleet in {tree} ran the worker of {run['code']}")
    cpu = float(level["worker_cpu_pct_total"])
    return {
        "gazeguard_file": str(tree / "gazeguard" / "__init__.py"),  # the worker: cwd and PYTHONPATH
        "seconds": time.monotonic() - t0,
        "metrics": {
            "sessions": sessions,
            "worker_cpu_pct": cpu,
            "cpu_ms_per_session_s": cpu / 100.0 * 1e3 / sessions,
            "p50_ms": float(level["p50_ms"]),
            "p99_ms": float(level["p99_ms"]),
            "max_ms": float(level["max_ms"]),
            "worker_rss_max_mb": float(level["worker_rss_max_mb"]),
            "chunks_received": run["latency"]["n"],
            "chunks_missing": run["chunks_missing"],
            "cpu_window_s": run["cpu_window_s"],
            "generator_lag_p99_ms": float(level["generator_lag_p99_ms"]),
            "generator_cpu_pct": run["generator_cpu_pct"],
            "nats_cpu_pct": run["nats_cpu_pct"],
            "broker_cpu_pct": run["broker_cpu_pct"],
            "no_loss": bool(level["no_loss"]),
            "sustained": bool(level["sustained"]),
        },
    }


# -------------------------------------------------------------------------------- the table
#: (area, label, unit, path into a run's metrics); every one is lower-is-better
Metric = tuple[str, str, str, tuple[str, ...]]


def metric_list(areas: list[str], levels: list[int], postgres: bool) -> list[Metric]:
    rows: list[Metric] = []
    if "mechanism" in areas:
        for m in MECHANISMS:
            rows.append(("mechanism", f"{m} 48×32 release p50", "µs", (m, "p50_us")))
            rows.append(("mechanism", f"{m} 48×32 release p99", "µs", (m, "p99_us")))
        rows.append(("mechanism", "dcfpa 48×32 release CPU mean", "µs", ("dcfpa", "cpu_mean_us")))
    if "charge" in areas:
        for backend in ["sqlite FULL"] + (["postgresql sync commit"] if postgres else []):
            short = "sqlite" if backend.startswith("sqlite") else "postgres"
            rows.append(("charge", f"{short} charge p50", "ms", (backend, "p50_ms")))
            rows.append(("charge", f"{short} charge p99", "ms", (backend, "p99_ms")))
            rows.append(("charge", f"{short} first 25 of hour", "ms", (backend, "first_ms")))
            rows.append(("charge", f"{short} last 25 of hour", "ms", (backend, "last_ms")))
    if "message" in areas:
        rows.append(("message", "chunk message build + payload p50", "µs", ("p50_us",)))
        rows.append(("message", "chunk message build + payload p99", "µs", ("p99_us",)))
        rows.append(("message", "chunk payload", "bytes", ("payload_bytes",)))
    if "fleet" in areas:
        for n in levels:
            rows.append(("fleet", f"{n} sessions worker CPU", "% core", (str(n), "worker_cpu_pct")))
            rows.append(
                ("fleet", f"{n} sessions CPU/session", "ms/s", (str(n), "cpu_ms_per_session_s"))
            )
            rows.append(("fleet", f"{n} sessions p50", "ms", (str(n), "p50_ms")))
            rows.append(("fleet", f"{n} sessions p99", "ms", (str(n), "p99_ms")))
    return rows


def values_of(runs: list[dict[str, Any]], tree: str, metric: Metric) -> list[float]:
    area, _, _, path = metric
    out = []
    for r in runs:
        if r["area"] != area or r["tree"] != tree or "metrics" not in r:
            continue
        if area == "fleet":
            if str(r["sessions"]) != path[0]:
                continue
            v: Any = r["metrics"][path[1]]
        else:
            v = r["metrics"]
            for key in path:
                v = v.get(key, {}) if isinstance(v, dict) else math.nan
        if isinstance(v, int | float):
            out.append(float(v))
    return out


def spread(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "values": []}
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": values,
    }


def verdict(before: dict[str, Any], after: dict[str, Any]) -> str:
    """slower / faster only when the ranges over repeats do not overlap."""
    if not before["values"] or not after["values"]:
        return "missing"
    if len(before["values"]) < 2 or len(after["values"]) < 2:
        return "1 run"
    if after["min"] > before["max"]:
        return "SLOWER"
    if after["max"] < before["min"]:
        return "faster"
    return "overlap"


def summarize(runs: list[dict[str, Any]], metrics: list[Metric]) -> list[dict[str, Any]]:
    rows = []
    for metric in metrics:
        b, a = spread(values_of(runs, "before", metric)), spread(values_of(runs, "after", metric))
        ratio = a["median"] / b["median"] if b["median"] else math.nan
        rows.append(
            {
                "area": metric[0],
                "metric": metric[1],
                "unit": metric[2],
                "before": b,
                "after": a,
                "ratio_after_over_before": ratio,
                "verdict": verdict(b, a),
            }
        )
    return rows


def fmt(x: float) -> str:
    if math.isnan(x):
        return "—"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"\n{'area':9} {'metric':32} {'unit':>6} {'before':>8} {'(min–max)':>17} "
        f"{'after':>8} {'(min–max)':>17} {'after/before':>12}  verdict"
    )
    for r in rows:
        b, a = r["before"], r["after"]
        print(
            f"{r['area']:9} {r['metric']:32} {r['unit']:>6} {fmt(b['median']):>8} "
            f"{'(' + fmt(b['min']) + '–' + fmt(b['max']) + ')':>17} {fmt(a['median']):>8} "
            f"{'(' + fmt(a['min']) + '–' + fmt(a['max']) + ')':>17} "
            f"{r['ratio_after_over_before']:12.3f}  {r['verdict']}"
        )


# ---------------------------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--base", default=DEFAULT_BASE, help="the 'before' revision (default 3a735ec)")
    ap.add_argument(
        "--before", type=Path, default=ROOT.parent / "before",
        help="worktree of --base: created if absent, reused if present (default ../before)",
    )  # fmt: skip
    ap.add_argument(
        "--after", type=Path,
        help="the 'after' checkout (default: this one, as on disk; with --after-ref: ../after)",
    )  # fmt: skip
    ap.add_argument(
        "--after-ref",
        help="measure this revision (e.g. HEAD) in a worktree at --after, not this checkout's "
        "working tree (which others may be editing)",
    )
    ap.add_argument(
        "--areas", default=",".join(AREAS), help="mechanism,charge,message,fleet (default all)"
    )
    ap.add_argument("--repeats", type=int, help="before/after pairs per area (default 3; quick 1)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 repeat, short runs")
    ap.add_argument("--rounds", type=int, help="mechanism: rounds (default 40; quick 8)")
    ap.add_argument("--batch", type=int, help="mechanism: releases per round (default 250; 100)")
    ap.add_argument("--charges", type=int, help="charge: per session (default 600; quick 150)")
    ap.add_argument("--sessions", type=int, help="charge: sessions, the 1st warms (default 3; 2)")
    ap.add_argument("--no-postgres", action="store_true", help="charge: SQLite only")
    ap.add_argument("--levels", help="fleet: fixed session counts (default 400,600; quick 200)")
    ap.add_argument(
        "--fleet-seconds", type=float,
        help="fleet: gaze after the first chunk, s; CPU is measured over this − 3 s "
        "(default 63; quick 16)",
    )  # fmt: skip
    ap.add_argument(
        "--fleet-window", type=float, help="fleet: feature window W, s (default 30; quick 10)"
    )
    ap.add_argument("--block-samples", type=int, default=120, help="fleet: samples per block")
    ap.add_argument("--out", type=Path, default=RESULTS, help="default bench/results/compare.json")
    ap.add_argument("--child", choices=("mechanism", "charge", "message"), help=argparse.SUPPRESS)
    ap.add_argument("--child-opts", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    quick = args.quick
    defaults = {
        "repeats": (3, 1),
        "rounds": (40, 8),
        "batch": (250, 100),
        "charges": (600, 150),
        "sessions": (3, 2),
        "levels": ("400,600", "200"),
        "fleet_seconds": (63.0, 16.0),
        "fleet_window": (30.0, 10.0),
    }
    for key, (full, short) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, short if quick else full)
    return args


def main() -> None:
    args = parse_args()
    if args.child is not None:
        child_main(args.child, args.child_opts, args.child_out)
        return
    areas = [a.strip() for a in args.areas.split(",") if a.strip()]
    if unknown := set(areas) - set(AREAS):
        raise SystemExit(f"unknown areas {sorted(unknown)}: choose from {AREAS}")
    levels = [int(x) for x in str(args.levels).split(",")]
    if args.after_ref is not None:
        after = (args.after or ROOT.parent / "after").resolve()
        ensure_worktree(ROOT, args.after_ref, after, move=True)
    else:
        after = (args.after or ROOT).resolve()
    base_commit = ensure_worktree(ROOT, args.base, args.before)
    trees = {"before": args.before.resolve(), "after": after}
    info = {name: tree_info(name, tree) for name, tree in trees.items()}
    for name, t in info.items():
        print(f"{name:6}: {t['path']} at {t['commit'][:10]} imports {t['gazeguard_file']}")
        if t["uncommitted"]:
            print(f"        uncommitted (measured as on disk): {', '.join(t['uncommitted'])}")
    guard = Guard(list(trees.values()))
    started, t_start = datetime.datetime.now(datetime.UTC), time.monotonic()
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    mech_opts = {"rounds": args.rounds, "batch": args.batch, "warmup": 200}
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmpdir, ExitStack() as stack:
        tmp = Path(tmpdir)
        postgres = None
        if "charge" in areas and not args.no_postgres:
            postgres = stack.enter_context(postgres_server())
            if postgres is None:
                print("PostgreSQL rows skipped: no server binaries or no psycopg")
        charge_opts = {"charges": args.charges, "sessions": args.sessions, "postgres": postgres}
        for rep in range(args.repeats):
            order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
            print(f"\n--- repeat {rep + 1}/{args.repeats}: {' then '.join(order)}", flush=True)
            for area in areas:
                for sessions in levels if area == "fleet" else [0]:
                    for name in order:
                        tree = trees[name]
                        entry: dict[str, Any] = {"area": area, "tree": name, "repeat": rep}
                        if area == "fleet":
                            entry["sessions"] = sessions
                        entry["load_before"] = os.getloadavg()
                        t0 = time.monotonic()
                        guard.snapshot()
                        try:
                            if area == "fleet":
                                entry.update(run_fleet(tree, sessions, args, tmp))
                            else:
                                opts = charge_opts if area == "charge" else mech_opts
                                entry.update(run_child(area, tree, opts, tmp))
                        except (RuntimeError, subprocess.TimeoutExpired, KeyError) as exc:
                            entry["error"] = f"{type(exc).__name__}: {exc}"
                            print(f"  {area} {name}: FAILED {entry['error'][:2000]}", flush=True)
                        entry["seconds"] = time.monotonic() - t0
                        guard.check()
                        runs.append(entry)
                        if "metrics" in entry:
                            print(f"  {progress(entry)}", flush=True)
    metrics = metric_list(areas, levels, postgres is not None)
    rows = summarize(runs, metrics)
    print_table(rows)
    doc = {
        "benchmark": "bench/bench_compare.py",
        "what": "before/after the re-layering, same run, interleaved; ratio = after / before "
        "of the medians over repeats (> 1: after is slower); every metric lower-is-better",
        "quick": args.quick,
        "started_utc": started.isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - t_start, 1),
        "machine": machine(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "base": {"ref": args.base, "commit": base_commit},
        "after_ref": args.after_ref,
        "trees": info,
        "settings": {
            "repeats": args.repeats,
            "areas": areas,
            "mechanism": {"n": N_STEPS, "k": K, "epsilon": EPSILON, **mech_opts},
            "charge": {**charge_opts, "postgres": postgres is not None, "band": BAND},
            "fleet": {
                "levels": levels,
                "workers": 1,
                "window_s": args.fleet_window,
                "seconds": args.fleet_seconds,
                "cpu_measured_s": args.fleet_seconds - 3.0,
                "block_samples": args.block_samples,
            },
        },
        "summary": rows,
        "runs": runs,
        "restored_result_files": guard.restored,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {args.out} ({doc['wall_s']:.0f} s)")


def progress(entry: dict[str, Any]) -> str:
    """One line per child: its headline numbers."""
    m, head = entry["metrics"], f"{entry['area']:9} {entry['tree']:6}"
    if entry["area"] == "mechanism":
        return f"{head} dcfpa p50 {m['dcfpa']['p50_us']:.1f} µs ({entry['seconds']:.0f} s)"
    if entry["area"] == "message":
        return f"{head} build + payload p50 {m['p50_us']:.1f} µs ({entry['seconds']:.0f} s)"
    if entry["area"] == "charge":
        parts = [
            f"{k.split()[0]} p50 {v['p50_ms']:.2f} ms" for k, v in m.items() if isinstance(v, dict)
        ]
        return f"{head} {', '.join(parts)} ({entry['seconds']:.0f} s)"
    return (
        f"{head} {m['sessions']} sessions: worker {m['worker_cpu_pct']:.1f} % of a core, "
        f"p99 {m['p99_ms']:.1f} ms, {'sustained' if m['sustained'] else 'NOT sustained'} "
        f"({entry['seconds']:.0f} s)"
    )


def postgres_server() -> AbstractContextManager[str | None]:
    """``bench_ledger.postgres_server``: a throwaway server on a free loopback port, or None."""
    from bench_ledger import postgres_server as server  # noqa: PLC0415 - only for the charge area

    return server()


if __name__ == "__main__":
    main()
