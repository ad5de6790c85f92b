"""The sidecar's own numbers: chunk-completion → PUBACK latency, CPU% and RSS.

1. **Latency.** The real service (``gazeguard.runtime.service.serve``, on uvloop as ``gazeguard
run``
   runs it) reads a simulated headset (``gazeguard simulate``: a real LSL outlet at 120 Hz in
   another process) and publishes to a local Mosquitto. For every chunk: from
   ``ReleasedChunk.completed_at`` (``perf_counter`` when its last feature vector existed) to the
   broker's PUBACK (``Publisher(on_acked=...)``, called on the event loop right after the PUBACK),
   split at ``charged_at`` (mechanism + durable SQLite charge, synchronous=FULL) and the publish.
   A short feature step (window 2 s, step 0.01 s, n = 32: a chunk every 0.32 s; pulls every
   0.1 s) gives many
   chunks; all 48 features are released. The first ``WARMUP_CHUNKS`` chunks are not counted.
2. **Footprint.** ``gazeguard run`` with default settings (W = 30 s, s = 0.5 s, n = 32, all
   features, DCFPA dft) as a subprocess against a 120 Hz ``gazeguard simulate`` process and a
   local Mosquitto; psutil measures its CPU time (all threads) and RSS from its first chunk on,
   for ``--seconds`` (≥ 60 s: four chunks at the default 16 s per chunk). In the same run, in
   alternating order: the sidecar pulling every 0.25 s (``ingest.pull_every_s`` before it became
   1 s), and the floor any LSL consumer pays: a bare pylsl inlet on the same outlet (same
   processing flags, a pull into a preallocated buffer every 1 s, nothing else). On a virtual
   machine the CPU a wake-up costs varies with the host's load from hour to hour; the sidecar's
   own share (sidecar − bare inlet, measured minutes apart) is the figure that carries over.
   With ``--baseline PATH`` (a checkout of earlier code, e.g. a git worktree), that code runs as
   a fourth kind in every round, and its own first start beside this code's, each with its own
   empty composition cache (``PYTHONPATH=PATH``): the before and after of a change in one run.
   Its latency is measured too: after each latency run of this code, one of the baseline's
   (this file's ``latency_run`` in a child process with ``PYTHONPATH=PATH``, against the same
   outlet and broker).

3. **Where the latency goes** (context, offline, same process): the same ``Pipeline`` fed
   ``simulate_gaze`` with the fast settings; per chunk, ``Pipeline.release`` in total, the
   mechanism alone, the ledger charge alone (a second ledger, the finished payload bytes), the
   rest being message building; and a bare append + ``fsync`` of the payload to a log file in the
   same directory (the disk's own durability cost).

Targets: p99 < 5 ms; < 1 % of one core; RSS < 120 MB (the footprint runs once with an empty
composition cache, a device's first start, then ``--repeats`` restarts that read it). Each part
runs ``--repeats`` times (the machine is shared: medians of the runs are the headline). Run::

    python bench/bench_service.py [--chunks 500] [--seconds 64] [--repeats 2] [--quick]
                                  [--baseline ../before]

prints a table and writes ``bench/results/service.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import uvloop
from _harness import (
    Broker,
    ProcessMeter,
    Subscriber,
    latency_stats,
    load_now,
    machine,
    median_of,
    mosquitto,
    simulated_headset,
    write_results,
)

import gazeguard.runtime.service
from gazeguard.config import FeatureSettings, LedgerSettings, Settings, load_settings
from gazeguard.ledger import Ledger
from gazeguard.ledger.outbox import OutboxEntry
from gazeguard.plan import ReleasePlan
from gazeguard.runtime.pipeline import Pipeline, ReleasedChunk
from gazeguard.runtime.publish import Publisher
from gazeguard.runtime.simulate import simulate_gaze

TARGETS = {"p99_ms": 5.0, "cpu_pct": 1.0, "rss_max_mb": 120.0}
#: The pull interval before ``ingest.pull_every_s`` became 1 s, s.
BEFORE_PULL_EVERY_S = 0.25
#: A bare pylsl consumer of the same outlet: what any LSL client pays, nothing of gazeguard.
BARE_INLET = """
import sys, time
import numpy as np, pylsl
sid, every = sys.argv[1], float(sys.argv[2])
info = pylsl.resolve_byprop("source_id", sid, 1, 30.0)[0]
inlet = pylsl.StreamInlet(info, max_buflen=360, processing_flags=pylsl.proc_clocksync)
inlet.open_stream(30.0)
buf = np.zeros((1024, info.channel_count()), dtype=inlet.np_dtype)
said = False
while True:
    _, ts = inlet.pull_chunk(0.0, 1024, dest_obj=buf, as_numpy=True)
    if ts.shape[0] and not said:
        print("pulling", file=sys.stderr, flush=True)
        said = True
    time.sleep(every)
"""

FAST_FEATURES = {"window_s": 2.0, "step_s": 0.01}
#: The latency runs' pull interval: well under their chunk period (32 × 0.01 s), s.
FAST_PULL_EVERY_S = 0.1
WARMUP_CHUNKS = 3
LoopRunner = Callable[[Coroutine[Any, Any, Any]], Any]
LOOPS: dict[str, LoopRunner] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


# ------------------------------------------------------------------------------ latency
@contextlib.contextmanager
def publisher_hook(on_acked_bench: Callable[[OutboxEntry], None]) -> Iterator[None]:
    """Make ``serve()`` build its (real) Publisher with ``on_acked`` — the PUBACK timestamp.

    ``serve`` constructs ``Publisher(broker, ledger, on_acked=..., ...)`` itself (its own
    ``on_acked`` feeds the operator metrics); this swaps in the same class with an ``on_acked``
    that calls serve's and then ``on_acked_bench``, for the duration of the block. (Binding
    ``on_acked`` with ``functools.partial`` let serve's keyword replace it: the bench never saw a
    PUBACK and timed out.)
    """
    namespace = vars(gazeguard.runtime.service)
    original = namespace["Publisher"]

    def hooked(*args: Any, on_acked: Callable[[OutboxEntry], None] | None = None, **kw: Any) -> Any:
        def both(item: OutboxEntry) -> None:  # serve's own (its operator metrics), then ours
            if on_acked is not None:
                on_acked(item)
            timed(item)

        return Publisher(*args, on_acked=both, **kw)

    timed = on_acked_bench
    namespace["Publisher"] = hooked
    try:
        yield
    finally:
        namespace["Publisher"] = original


def fast_settings(sid: str, broker: Broker, ledger: Path, session: str) -> Settings:
    """Service settings for the latency runs: the LSL outlet ``sid``, many chunks quickly.

    Pulls every :data:`FAST_PULL_EVERY_S`: at 50× a real stream's chunk rate a 1 s pull (the
    default) hands the pipeline three chunks at once, and the figure would measure them queueing
    behind each other; at the default cadence (a chunk per 16 s) no pull holds two chunks.
    """
    return load_settings(
        session=session,
        device="bench",
        ingest={"source": "lsl", "source_id": sid, "pull_every_s": FAST_PULL_EVERY_S},
        features=FAST_FEATURES,
        broker={"host": broker.host, "port": broker.port},
        ledger={"path": ledger},
    )


def latency_run(
    sid: str,
    broker: Broker,
    workdir: Path,
    chunks: int,
    loop: str = "uvloop",
    subscribe: bool = False,
) -> dict[str, Any]:
    """Run ``serve()`` until ``chunks`` (+ warm-up) were acknowledged (and received).

    Returns latency statistics (ms) from chunk completion to charge, to PUBACK, and (with
    ``subscribe``) to receipt by a paho-mqtt subscriber thread in this process.
    """
    session = f"lat-{loop}-{time.monotonic_ns()}"
    settings = fast_settings(sid, broker, workdir / f"{session}.sqlite", session)
    released: dict[int, ReleasedChunk] = {}  # outbox id → chunk
    acked: dict[int, float] = {}  # outbox id → perf_counter at PUBACK
    received: dict[int, float] = {}  # chunk index → perf_counter at receipt
    want = chunks + WARMUP_CHUNKS

    def on_release(out: ReleasedChunk) -> None:
        released[out.outbox_id] = out

    wake: list[Callable[[], None]] = []  # set inside main(): wakes the stop check on the loop

    def on_acked(item: OutboxEntry) -> None:
        acked[item.id] = time.perf_counter()
        for w in wake:
            w()

    def on_message(topic: str, payload: bytes, perf: float, _wall: float) -> None:
        if topic.endswith("/chunks"):
            received[int(json.loads(payload)["chunk_index"])] = perf
            for w in wake:
                w()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def check() -> None:
            if len(acked) >= want and (not subscribe or len(received) >= want):
                stop.set()

        def threadsafe_check() -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to stop
                loop.call_soon_threadsafe(check)

        wake.append(threadsafe_check)
        try:
            await gazeguard.runtime.service.serve(settings, stop=stop, on_release=on_release)
        finally:
            wake.clear()

    sub = None
    if subscribe:
        sub = Subscriber(
            broker.host, broker.port, [f"gazeguard/v1/bench/{session}/chunks"], on_message
        )
    try:
        with publisher_hook(on_acked):
            LOOPS[loop](asyncio.wait_for(main(), timeout=120 + 2 * want))
    finally:
        if sub is not None:
            sub.close()
    rows = [
        (out, acked[oid])
        for oid, out in sorted(released.items())
        if oid in acked and out.message.chunk_index >= WARMUP_CHUNKS
    ]
    out: dict[str, Any] = {
        "loop": loop,
        "chunks": len(rows),
        "payload_bytes": len(rows[0][0].payload) if rows else 0,
        "features": len(rows[0][0].message.features) if rows else 0,
        "completion_to_charged": latency_stats([c.charged_at - c.completed_at for c, _ in rows]),
        "charged_to_puback": latency_stats([a - c.charged_at for c, a in rows]),
        "completion_to_puback": latency_stats([a - c.completed_at for c, a in rows]),
    }
    if subscribe:
        recv = [
            received[c.message.chunk_index] - c.completed_at
            for c, _ in rows
            if c.message.chunk_index in received
        ]
        out["completion_to_receipt"] = latency_stats(recv)
    return out


def latency_line(res: dict[str, Any]) -> str:
    """One latency run in words: its chunks and completion → PUBACK p50, p99 and max."""
    s = res["completion_to_puback"]
    return (
        f"{res['chunks']} chunks, completion→PUBACK "
        f"p50 {s['p50_ms']:.2f} p99 {s['p99_ms']:.2f} max {s['max_ms']:.2f} ms"
    )


def baseline_latency_run(
    baseline: Path, sid: str, broker: Broker, workdir: Path, chunks: int
) -> dict[str, Any]:
    """:func:`latency_run` of the code at ``baseline``: this file in a child process with
    ``PYTHONPATH=baseline`` (and its working directory there), on the same outlet and broker."""
    out = workdir / f"baseline-latency-{time.monotonic_ns()}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--chunks", str(chunks)]
    cmd += ["--latency-child", sid, broker.address, str(out)]
    env = {**os.environ, "PYTHONPATH": str(baseline)}
    subprocess.run(cmd, env=env, cwd=baseline, check=True)
    res: dict[str, Any] = json.loads(out.read_text())
    return res


def latency_child(sid: str, address: str, out: Path, chunks: int) -> None:
    """One :func:`latency_run` (``--latency-child``) with whatever ``gazeguard`` this process
    imports, against the running outlet ``sid`` and broker ``address``; written to ``out``."""
    import gazeguard  # noqa: PLC0415 - which code runs is the point

    host, port = address.rsplit(":", 1)
    broker = Broker(host, int(port), None)  # type: ignore[arg-type] - not ours to account
    with tempfile.TemporaryDirectory() as tmp:
        res = latency_run(sid, broker, Path(tmp), chunks)
    res["code"] = str(Path(gazeguard.__file__).resolve().parent.parent)
    out.write_text(json.dumps(res))


# ------------------------------------------------------------------------------ breakdown
def breakdown(workdir: Path, chunks: int) -> dict[str, dict[str, float]]:
    """Per chunk, offline: release in total, mechanism, ledger charge, bare append + fsync."""
    fast = FeatureSettings(**FAST_FEATURES)
    gaze = simulate_gaze(FAST_FEATURES["window_s"] + 0.32 * (chunks + 2), 120.0, 7)
    times: dict[str, list[float]] = {k: [] for k in ("release", "mechanism", "charge", "fsync")}
    with (
        # the service's ledger (its default hourly budget, to which the noise is calibrated)
        gazeguard.runtime.service.open_ledger(
            LedgerSettings(path=str(workdir / "breakdown.sqlite")),
            ReleasePlan.build(features=fast, budget=LedgerSettings().budget_per_hour, delta=1e-6),
        ) as ledger,
        Ledger(workdir / "breakdown-charge.sqlite") as bare,
        (workdir / "append.log").open("ab") as log,
    ):
        pipe = Pipeline(ledger, session="breakdown", device="bench", rate_hz=120.0, features=fast)
        # (imported here: a --baseline's latency child imports this file with older code)
        from gazeguard.ledger import pure_cost  # noqa: PLC0415

        cost = pure_cost(dict.fromkeys(pipe.feature_names, 1.0))
        for chunk in pipe.feed(gaze)[:chunks]:
            t0 = time.perf_counter()
            out = pipe.release(chunk)
            t1 = time.perf_counter()
            pipe.mechanism.release(chunk.values)
            t2 = time.perf_counter()
            bare.charge(
                "bare", chunk.index, cost, out.topic if out else "t", out.payload if out else b""
            )
            t3 = time.perf_counter()
            log.write(out.payload if out else b"")
            log.flush()
            os.fsync(log.fileno())
            t4 = time.perf_counter()
            for key, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                times[key].append(dt)
    return {k: latency_stats(v) for k, v in times.items()}


# ------------------------------------------------------------------------------ footprint
def gazeguard_run_cmd(sid: str, broker: Broker, ledger: Path, *extra: str) -> list[str]:
    """``gazeguard run`` on LSL stream ``sid`` with default settings (plus ``extra`` flags)."""
    return [
        sys.executable, "-m", "gazeguard", "run", "--source", "lsl", "--source-id", sid,
        "--broker", broker.address, "--ledger", str(ledger), "--session", ledger.stem,
        "--device", "bench", *extra,
    ]  # fmt: skip


def peak_rss_mb(pid: int) -> float:
    """The process's peak RSS so far (``VmHWM``), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bare_inlet_cmd(sid: str, every_s: float) -> list[str]:
    """A bare pylsl inlet on LSL stream ``sid``, pulling every ``every_s`` (:data:`BARE_INLET`)."""
    return [sys.executable, "-c", BARE_INLET, sid, f"{every_s:g}"]


def measure_footprint(
    cmd: Sequence[str],
    seconds: float,
    first_chunk_within_s: float,
    cache_dir: Path,
    env: dict[str, str] | None = None,
    ready: str = "chunk ",
) -> dict[str, Any]:
    """Start ``cmd`` (its composition cache in ``cache_dir``, ``env`` added to the environment);
    from its first stderr line starting with ``ready`` on, measure CPU%/RSS for ``seconds``; and
    from its start to the same end (startup included: CPU over the whole life, peak RSS).

    Returns the footprint row plus the chunks it reported during the measured interval.
    """
    env = {**os.environ, "GAZEGUARD_CACHE_DIR": str(cache_dir), **(env or {})}
    started = time.monotonic()
    # run outside any checkout: ``python -m`` puts the working directory first on sys.path,
    # which would shadow a --baseline's PYTHONPATH when the bench is started from a checkout
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cache_dir.parent,
    )
    chunk_times: list[float] = []
    first = threading.Event()
    tail: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith(ready):
                chunk_times.append(time.monotonic())
                first.set()
            else:
                tail.append(line.rstrip())
                del tail[:-20]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not first.wait(first_chunk_within_s):
            raise RuntimeError(
                f"{cmd[2:4]} printed no {ready.strip()!r} line within {first_chunk_within_s:g} s:\n"
                + "\n".join(tail)
            )
        meter = ProcessMeter(proc.pid)
        t0 = time.monotonic()
        meter.start()
        time.sleep(seconds)
        fp = meter.stop()
        t1 = time.monotonic()
        times = psutil.Process(proc.pid).cpu_times()
        whole = {
            "with_startup_cpu_pct": 100.0 * (times.user + times.system) / (t1 - started),
            "with_startup_rss_peak_mb": peak_rss_mb(proc.pid),
            "with_startup_wall_s": t1 - started,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
    return {**fp.row(), **whole, "chunks_in_window": sum(t0 <= t <= t1 for t in chunk_times)}


def git_commit(path: Path) -> str | None:
    """The commit checked out at ``path`` (``None`` if it is not a git checkout)."""
    out = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or None


def footprint_run(
    kind: str,
    r: int,
    sid: str,
    broker: Broker,
    work: Path,
    cache: Path,
    seconds: float,
    baseline: Path | None = None,
) -> dict[str, Any]:
    """One footprint run of ``kind``: ``gazeguard`` (defaults), ``before`` (pulls every
    :data:`BEFORE_PULL_EVERY_S`), ``baseline`` (the code at ``baseline``, defaults, its own
    composition cache) or ``bare`` (a bare pylsl inlet); printed and returned."""
    if kind == "bare":
        row = measure_footprint(
            bare_inlet_cmd(sid, 1.0), seconds, 60, cache_dir=cache, ready="pulling"
        )
    else:
        env = {
            "gazeguard": {},
            "before": {"GAZEGUARD_INGEST__PULL_EVERY_S": f"{BEFORE_PULL_EVERY_S:g}"},
            "baseline": {"PYTHONPATH": str(baseline)},
        }[kind]
        ledger = work / f"footprint-{kind}-{r}.sqlite"
        cmd = gazeguard_run_cmd(sid, broker, ledger)
        own_cache = cache.with_name(cache.name + "-baseline") if kind == "baseline" else cache
        row = measure_footprint(cmd, seconds, 120, cache_dir=own_cache, env=env)
    row["kind"] = kind
    row["start"] = "cold" if r == 0 else "warm"
    label = {
        "gazeguard": f"gazeguard ({row['start']} cache)",
        "before": f"gazeguard pulling every {BEFORE_PULL_EVERY_S:g} s",
        "baseline": f"baseline {baseline} ({row['start']} cache)",
        "bare": "bare pylsl inlet",
    }[kind]
    print(
        f"footprint run {r + 1}, {label}: {row['cpu_pct']:.2f}% of a core, RSS max "
        f"{row['rss_max_mb']:.1f} MB in {row['wall_s']:.0f} s; startup included "
        f"{row['with_startup_cpu_pct']:.2f}%, peak {row['with_startup_rss_peak_mb']:.1f} MB "
        f"(load {load_now()})",
        flush=True,
    )
    return row


# ------------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=500, help="chunks per latency run")
    ap.add_argument(
        "--seconds", type=float, default=64.0, help="measured seconds per footprint run"
    )
    ap.add_argument("--repeats", type=int, default=2, help="runs of each part (medians reported)")
    ap.add_argument("--quick", action="store_true", help="100 chunks, 20 s, one run")
    ap.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a checkout of earlier code (e.g. a git worktree) whose sidecar footprint and "
        "latency are measured in the same rounds as this code's",
    )
    ap.add_argument(
        "--latency-child", nargs=3, metavar=("SID", "BROKER", "OUT"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.latency_child:
        sid, address, out = args.latency_child
        latency_child(sid, address, Path(out), args.chunks)
        return
    baseline: Path | None = args.baseline.resolve() if args.baseline else None
    if baseline is not None and not (baseline / "gazeguard" / "__init__.py").is_file():
        ap.error(f"--baseline {args.baseline}: no gazeguard/ package there")
    if args.quick:
        args.chunks, args.seconds, args.repeats = 100, 20.0, 1
    load_before = load_now()
    print(f"load average before: {load_before}")
    latency: list[dict[str, Any]] = []
    base_latency: list[dict[str, Any]] = []
    footprint: list[dict[str, Any]] = []
    cold: list[dict[str, Any]] = []
    before: list[dict[str, Any]] = []
    bare: list[dict[str, Any]] = []
    base_runs: list[dict[str, Any]] = []
    base_cold: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, mosquitto(Path(tmp)) as broker:
        work = Path(tmp)
        with simulated_headset(120.0) as sid:
            for r in range(args.repeats):
                res = latency_run(sid, broker, work, args.chunks)
                latency.append(res)
                print(f"latency run {r + 1}: {latency_line(res)} (load {load_now()})", flush=True)
                if baseline is not None:
                    res = baseline_latency_run(baseline, sid, broker, work, args.chunks)
                    base_latency.append(res)
                    print(f"  baseline {r + 1}: {latency_line(res)}", flush=True)
            parts_offline = breakdown(work, args.chunks)
            # the first run starts with an empty composition cache (a device's first start
            # ever), the others with what it kept (every restart after)
            cache = work / "composition-cache"
            for r in range(args.repeats + 1):
                # r = 0: a device's first start (and the baseline's); then every kind in an
                # order that alternates, so a drifting machine favours none of them
                kinds = ["gazeguard"] if r == 0 else ["gazeguard", "before", "bare"]
                if baseline is not None:
                    kinds.insert(1, "baseline")
                for kind in kinds if r % 2 else kinds[::-1]:
                    row = footprint_run(kind, r, sid, broker, work, cache, args.seconds, baseline)
                    {
                        "gazeguard": footprint if r else cold,
                        "baseline": base_runs if r else base_cold,
                        "before": before,
                        "bare": bare,
                    }[kind].append(row)
    parts = ("completion_to_charged", "charged_to_puback", "completion_to_puback")
    lat_median = {
        p: median_of([r[p] for r in latency], ("p50_ms", "p99_ms", "max_ms")) for p in parts
    }
    fp_keys = (
        "cpu_pct",
        "rss_max_mb",
        "rss_mean_mb",
        "with_startup_cpu_pct",
        "with_startup_rss_peak_mb",
    )
    fp_median = median_of(footprint, fp_keys)
    before_median = median_of(before, fp_keys)
    bare_median = median_of(bare, ("cpu_pct", "rss_max_mb", "rss_mean_mb"))
    # gazeguard's own share: each restart minus the bare inlet run of the same round
    own = [g["cpu_pct"] - b["cpu_pct"] for g, b in zip(footprint, bare, strict=True)]
    own_before = [g["cpu_pct"] - b["cpu_pct"] for g, b in zip(before, bare, strict=True)]
    comparison = {
        "bare_inlet_cpu_pct": [b["cpu_pct"] for b in bare],
        "gazeguard_cpu_pct": [g["cpu_pct"] for g in footprint],
        "before_cpu_pct": [g["cpu_pct"] for g in before],
        "gazeguard_minus_bare_pct": own,
        "before_minus_bare_pct": own_before,
        "gazeguard_over_bare": [
            g["cpu_pct"] / b["cpu_pct"] for g, b in zip(footprint, bare, strict=True)
        ],
        "before_over_bare": [
            g["cpu_pct"] / b["cpu_pct"] for g, b in zip(before, bare, strict=True)
        ],
    }
    base_median = median_of(base_runs, fp_keys) if base_runs else None
    base_lat_median = (
        {p: median_of([r[p] for r in base_latency], ("p50_ms", "p99_ms", "max_ms")) for p in parts}
        if base_latency
        else None
    )
    if base_runs:
        comparison["baseline_cpu_pct"] = [g["cpu_pct"] for g in base_runs]
        comparison["gazeguard_over_baseline"] = [
            g["cpu_pct"] / b["cpu_pct"] for g, b in zip(footprint, base_runs, strict=True)
        ]
    checks = {
        "p99_ms": lat_median["completion_to_puback"]["p99_ms"],
        "cpu_pct": fp_median["cpu_pct"],
        "rss_max_mb": fp_median["rss_max_mb"],
    }
    targets = {
        k: {"value": v, "target": f"< {TARGETS[k]:g}", "met": v < TARGETS[k]}
        for k, v in checks.items()
    }
    print(f"\n{'path (ms, median of runs)':28s} {'p50':>8s} {'p99':>8s} {'max':>8s}")
    for p in parts:
        m = lat_median[p]
        print(f"{p:28s} {m['p50_ms']:8.3f} {m['p99_ms']:8.3f} {m['max_ms']:8.2f}")
    print("\nwhere it goes (offline, same components, one chunk at a time)")
    for name, m in parts_offline.items():
        print(f"{name:28s} {m['p50_ms']:8.3f} {m['p99_ms']:8.3f} {m['max_ms']:8.2f}")
    print(
        f"\nfootprint (120 Hz, defaults, median of {len(footprint)} restarts): "
        f"{fp_median['cpu_pct']:.2f}% of one core, RSS max {fp_median['rss_max_mb']:.1f} MB "
        f"(mean {fp_median['rss_mean_mb']:.1f} MB); startup included "
        f"{fp_median['with_startup_cpu_pct']:.2f}%, peak "
        f"{fp_median['with_startup_rss_peak_mb']:.1f} MB; first start (cold cache): "
        f"{cold[0]['cpu_pct']:.2f}%, RSS max "
        f"{cold[0]['rss_max_mb']:.1f} MB, startup included {cold[0]['with_startup_cpu_pct']:.2f}%,"
        f" peak {cold[0]['with_startup_rss_peak_mb']:.1f} MB"
    )
    print(
        f"\n{'CPU % of a core, per round':34s} "
        + " ".join(f"{r + 2:>7d}" for r in range(len(bare)))
    )
    for name, vals in comparison.items():
        print(f"{name:34s} " + " ".join(f"{v:7.2f}" for v in vals))
    print(
        f"pulling every {BEFORE_PULL_EVERY_S:g} s (before): {before_median['cpu_pct']:.2f}% "
        f"(RSS {before_median['rss_max_mb']:.1f} MB); bare pylsl inlet: "
        f"{bare_median['cpu_pct']:.2f}% (RSS {bare_median['rss_max_mb']:.1f} MB)"
    )
    if base_median is not None:
        print(
            f"baseline {baseline}: restarts {base_median['cpu_pct']:.2f}% (RSS "
            f"{base_median['rss_max_mb']:.1f} MB); first start {base_cold[0]['cpu_pct']:.2f}%, "
            f"RSS max {base_cold[0]['rss_max_mb']:.1f} MB, peak "
            f"{base_cold[0]['with_startup_rss_peak_mb']:.1f} MB"
        )
    if base_lat_median is not None:
        b, m = base_lat_median["completion_to_puback"], lat_median["completion_to_puback"]
        print(
            f"latency completion→PUBACK (median of runs): this code p50 {m['p50_ms']:.2f} / "
            f"p99 {m['p99_ms']:.2f} ms, baseline p50 {b['p50_ms']:.2f} / p99 {b['p99_ms']:.2f} ms"
        )
    for k, t in targets.items():
        print(f"target {k} {t['target']}: {t['value']:.2f} → {'met' if t['met'] else 'MISSED'}")
    path = write_results(
        "service",
        {
            "benchmark": "bench/bench_service.py",
            "machine": machine(),
            "load_before": load_before,
            "load_after": load_now(),
            "settings": {
                "latency": {
                    "rate_hz": 120.0,
                    **FAST_FEATURES,
                    "pull_every_s": FAST_PULL_EVERY_S,
                    "chunk_steps": 32,
                    "loop": "uvloop",
                    "chunks_per_run": args.chunks,
                    "warmup_chunks": WARMUP_CHUNKS,
                },
                "footprint": {
                    "rate_hz": 120.0,
                    "settings": "defaults",
                    "seconds": args.seconds,
                    "before_pull_every_s": BEFORE_PULL_EVERY_S,
                    "bare_inlet_pull_every_s": 1.0,
                },
                "repeats": args.repeats,
            },
            "latency_runs": latency,
            "latency_median": lat_median,
            "breakdown_offline": parts_offline,
            "footprint_cold_start": cold[0],
            "footprint_runs": footprint,
            "footprint_median": fp_median,
            "footprint_before_runs": before,
            "footprint_before_median": before_median,
            "bare_inlet_runs": bare,
            "bare_inlet_median": bare_median,
            "footprint_comparison": comparison,
            "baseline": None
            if baseline is None
            else {
                "path": str(baseline),
                "commit": git_commit(baseline),
                "cold_start": base_cold[0],
                "runs": base_runs,
                "median": base_median,
                "latency_runs": base_latency,
                "latency_median": base_lat_median,
            },
            "targets": targets,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
