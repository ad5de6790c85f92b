"""CPU cost of the front half: LSL ingest + event detection + sliding-window features.

Tracks: CPU time of the consuming process per second of gaze (= % of one core), at 120, 250 and
1200 Hz, for one stream coming from a real LSL outlet in another process (``gazeguard simulate``),
and the process's peak RSS. Process CPU time includes every thread: liblsl's receiver threads,
gazeguard's pull thread and the asyncio loop running events + features.

Compared in the same run with the naive alternative a user would otherwise write: a thread
calling pylsl's ``pull_sample`` once per sample (Python lists, per-sample conversion), handing
the same blocks to the same event detector and feature extractor every 250 ms. A third mode,
``ingest``, runs GazeStream alone (no events/features) to show what ingest itself costs.

Each (rate, mode) runs in a fresh subprocess (clean peak RSS). Features use ``--window`` s
(default 10 s, so the per-step statistics are exercised after a short warm-up of window + 1 s)
and the default 0.5 s step; measurement starts after the warm-up and lasts ``--seconds``.

Run: ``python bench/bench_frontend.py [--seconds 20] [--window 10]`` (about 10 minutes); prints
a table and writes ``bench/results/frontend.json``. Targets: < 1% of a core at 120 Hz, < 5% at
1200 Hz. The machine's load average is recorded with every row: on a shared machine the numbers
move by ±0.2 percentage points between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pylsl

from gazeguard.config import IngestSettings
from gazeguard.core.samples import GazeSamples
from gazeguard.runtime.ingest import PROCESSING_FLAGS, GazeStream
from gazeguard.signal.features import FeatureExtractor

RESULTS = Path(__file__).resolve().parent / "results" / "frontend.json"
RATES = (120.0, 250.0, 1200.0)
MODES = ("liblsl", "ingest", "gazeguard", "naive")
CADENCES = {"chunked": 0.01, "per-sample": 0.0}  # outlet push interval, s (0: every sample)
TARGET_PCT = {120.0: 1.0, 1200.0: 5.0}
POLL_S = 0.25  # every mode drains its inlet at this interval (the default pull is 1 s)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


async def run_gazeguard(
    sid: str, warm: float, seconds: float, window: float, features: bool
) -> dict[str, Any]:
    n = vectors = 0
    cpu0 = wall0 = 0.0
    measuring = False
    start = time.monotonic()
    async with GazeStream(IngestSettings(source_id=sid), poll_interval_s=POLL_S) as stream:
        fx = FeatureExtractor(window, 0.5, rate_hz=stream.info.nominal_srate)  # declared rate
        async for block in stream:
            if features:
                vectors += fx.push(block)[0].shape[0]
            now = time.monotonic()
            if not measuring and now - start >= warm:
                measuring, n, cpu0, wall0 = True, 0, time.process_time(), now
                vectors = 0
            elif measuring:
                n += len(block)
                if now - wall0 >= seconds:
                    break
        stats = stream.stats
    return {
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.monotonic() - wall0,
        "samples": n,
        "vectors": vectors,
        "overflow": stats.overflow,
        "lost": stats.lost,
    }


async def run_naive(sid: str, warm: float, seconds: float, window: float) -> dict[str, Any]:
    """What one writes with pylsl's tutorial: pull_sample in a loop, lists, periodic blocks."""
    info = pylsl.resolve_byprop("source_id", sid, 1, 10.0)[0]
    inlet = pylsl.StreamInlet(info, max_buflen=60, recover=True, processing_flags=PROCESSING_FLAGS)
    inlet.open_stream(10.0)
    rows: list[tuple[float, float, float, float, float]] = []
    lock, stop = threading.Lock(), threading.Event()

    def pull() -> None:
        while not stop.is_set():
            sample, ts = inlet.pull_sample(timeout=0.1)
            if ts is None:
                continue
            valid = sample[4] >= 0.5
            row = (ts, sample[1], sample[2], sample[3], 1.0 if valid else 0.0)
            with lock:
                rows.append(row)

    thread = threading.Thread(target=pull, daemon=True)
    thread.start()
    fx = FeatureExtractor(window, 0.5, rate_hz=info.nominal_srate())  # the declared rate
    n = vectors = 0
    cpu0 = wall0 = 0.0
    measuring = False
    start = time.monotonic()
    while True:
        await asyncio.sleep(POLL_S)
        with lock:
            got, rows[:] = list(rows), []
        if got:
            a = np.array(got)
            x = np.where(a[:, 4] > 0, a[:, 1], np.nan)
            block = GazeSamples.from_arrays(a[:, 0], x, a[:, 2], a[:, 3])
            vectors += fx.push(block)[0].shape[0]
        now = time.monotonic()
        if not measuring and now - start >= warm:
            measuring, n, cpu0, wall0, vectors = True, 0, time.process_time(), now, 0
        elif measuring:
            n += len(got)
            if now - wall0 >= seconds:
                break
    result = {"cpu_s": time.process_time() - cpu0, "wall_s": time.monotonic() - wall0}
    stop.set()
    thread.join()
    return {**result, "samples": n, "vectors": vectors, "overflow": 0, "lost": 0}


def run_liblsl(sid: str, warm: float, seconds: float) -> dict[str, Any]:
    """The floor: a bare pylsl inlet draining whole chunks every POLL_S, no processing."""
    info = pylsl.resolve_byprop("source_id", sid, 1, 10.0)[0]
    inlet = pylsl.StreamInlet(info, max_buflen=60, recover=True, processing_flags=PROCESSING_FLAGS)
    inlet.open_stream(10.0)
    buf = np.zeros((8192, 5))
    time.sleep(warm)
    inlet.pull_chunk(0.0, 8192, dest_obj=buf, as_numpy=True)
    cpu0, wall0, n = time.process_time(), time.monotonic(), 0
    while time.monotonic() - wall0 < seconds:
        time.sleep(POLL_S)
        n += inlet.pull_chunk(0.0, 8192, dest_obj=buf, as_numpy=True)[1].shape[0]
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    return {"cpu_s": cpu, "wall_s": wall, "samples": n, "vectors": 0, "overflow": 0, "lost": 0}


def one(rate: float, mode: str, cadence: str, seconds: float, window: float) -> dict[str, Any]:
    """Run one configuration against a `gazeguard simulate` outlet in another process."""
    sid = f"bench-frontend-{uuid.uuid4().hex[:10]}"
    outlet = subprocess.Popen(
        [sys.executable, "-m", "gazeguard", "simulate", "--rate", str(rate), "--seed", "42",
         "--source-id", sid, "--push-interval", str(CADENCES[cadence])],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert outlet.stdout is not None
        outlet.stdout.readline()
        warm = window + 1.0 if mode in {"gazeguard", "naive"} else 2.0
        if mode == "liblsl":
            res = run_liblsl(sid, warm, seconds)
        elif mode == "naive":
            res = asyncio.run(run_naive(sid, warm, seconds, window))
        else:
            res = asyncio.run(run_gazeguard(sid, warm, seconds, window, mode == "gazeguard"))
    finally:
        outlet.kill()
        outlet.wait()
        if outlet.stdout is not None:
            outlet.stdout.close()
    gaze_s = res["samples"] / rate
    return {
        "rate_hz": rate,
        "mode": mode,
        "outlet": cadence,
        **res,
        "gaze_s": gaze_s,
        "cpu_pct_of_core": 100.0 * res["cpu_s"] / gaze_s if gaze_s else float("nan"),
        "peak_rss_mb": peak_rss_mb(),
        "load_avg_1min": os.getloadavg()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    ap.add_argument("--window", type=float, default=10.0, help="feature window W, s")
    ap.add_argument("--one", nargs=3, metavar=("RATE", "MODE", "CADENCE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        rate, mode, cadence = float(args.one[0]), args.one[1], args.one[2]
        print(json.dumps(one(rate, mode, cadence, args.seconds, args.window)))
        return
    rows = []
    for cadence in CADENCES:
        for rate in RATES:
            for mode in MODES:
                if cadence == "per-sample" and mode == "ingest":
                    continue  # the split is shown once, with the chunked outlet
                out = subprocess.run(
                    [sys.executable, __file__, "--one", str(rate), mode, cadence,
                     "--seconds", str(args.seconds), "--window", str(args.window)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
                r = rows[-1]
                print(
                    f"{cadence:10s} {rate:6.0f} Hz  {mode:9s}  {r['cpu_pct_of_core']:6.2f}% "
                    f"of a core  peak RSS {r['peak_rss_mb']:5.1f} MB  samples {r['samples']:6d}  "
                    f"vectors {r['vectors']:3d}  overflow {r['overflow']}",
                    flush=True,
                )
    summary = []
    for cadence in CADENCES:
        for rate in RATES:
            by = {
                r["mode"]: r["cpu_pct_of_core"]
                for r in rows
                if (r["outlet"], r["rate_hz"]) == (cadence, rate)
            }
            target = TARGET_PCT.get(rate)
            summary.append(
                {
                    "outlet": cadence,
                    "rate_hz": rate,
                    "gazeguard_pct": by["gazeguard"],
                    "liblsl_floor_pct": by["liblsl"],
                    "gazeguard_over_floor_pct": by["gazeguard"] - by["liblsl"],
                    "naive_over_gazeguard": by["naive"] / by["gazeguard"],
                    "target_pct": target,
                    "target_met": None if target is None else by["gazeguard"] < target,
                }
            )
    print("\noutlet      rate  gazeguard  liblsl floor  added  naive/gazeguard  target")
    for m in summary:
        tgt = (
            ""
            if m["target_pct"] is None
            else f"< {m['target_pct']:g}%: {'met' if m['target_met'] else 'MISSED'}"
        )
        print(
            f"{m['outlet']:10s} {m['rate_hz']:5.0f}  {m['gazeguard_pct']:8.2f}%  "
            f"{m['liblsl_floor_pct']:11.2f}%  {m['gazeguard_over_floor_pct']:5.2f}%  "
            f"{m['naive_over_gazeguard']:15.2f}x  {tgt}"
        )
    RESULTS.parent.mkdir(exist_ok=True)
    machine = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "liblsl": pylsl.library_version(),
        "load_avg": os.getloadavg(),
    }
    settings = {"seconds": args.seconds, "window_s": args.window, "step_s": 0.5}
    doc = {
        "bench": "frontend",
        "machine": machine,
        "settings": settings,
        "summary": summary,
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(doc, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
