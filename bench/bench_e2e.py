"""End to end: simulated headset (real LSL) → gazeguard → Mosquitto → subscriber.

1. **Latency**, per event loop (asyncio's default loop and uvloop): the real service
   (``gazeguard.runtime.service.serve``) reads ``gazeguard simulate`` (a real 120 Hz LSL outlet in
   another
   process) and publishes to a local Mosquitto; a paho-mqtt subscriber thread *in the same
   process* stamps each chunk's arrival with ``perf_counter``, so completion
   (``ReleasedChunk.completed_at``) → receipt needs no cross-process clock. The broker's PUBACK is
   stamped too. Fast settings as in ``bench_service.py`` (window 2 s, step 0.01 s, n = 32).
2. **Footprint** at 120, 250 and 1200 Hz: ``gazeguard run`` with default settings as a
   subprocess; psutil CPU% of one core and RSS from its first chunk on, for ``--seconds``.
3. **The obvious alternative**, in the same run: a *naive sidecar* a user would write — pylsl
   ``pull_sample`` one sample at a time, the same feature extractor and chunking, the same
   DCFPA written plainly with ``numpy.fft`` and numpy's (unsafe) floating-point Laplace noise
   (``PlainMechanism`` from ``bench_mechanisms.py``), ``json.dumps`` and a plain paho-mqtt
   publish loop (QoS 1, ``wait_for_publish``), and *no* ledger. Its latency is measured like the
   service's (in this process), its footprint as a subprocess running next to ``gazeguard run``
   against the same outlet. Ratios are alternative / gazeguard (> 1: gazeguard is cheaper).
   The mechanism alone (planned FFTW vs numpy.fft) comes from ``bench_mechanisms.py``'s JSON.

Each part runs ``--repeats`` times; medians of the runs are the headline. Run::

    python bench/bench_e2e.py [--chunks 300] [--seconds 64] [--repeats 2] [--quick]

prints tables and writes ``bench/results/e2e.json``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as paho
import pylsl
from _harness import (
    RESULTS,
    Broker,
    Subscriber,
    latency_stats,
    load_now,
    machine,
    median_of,
    mosquitto,
    simulated_headset,
    write_results,
)
from bench_mechanisms import PlainMechanism, numpy_laplace
from bench_service import (
    FAST_FEATURES,
    WARMUP_CHUNKS,
    gazeguard_run_cmd,
    latency_run,
    measure_footprint,
)
from paho.mqtt.enums import CallbackAPIVersion

from gazeguard.core.chunking import Chunker
from gazeguard.core.samples import GazeSamples
from gazeguard.privacy.mechanisms import Bounds, make_mechanism
from gazeguard.runtime.ingest import PROCESSING_FLAGS
from gazeguard.signal.features import FEATURES, NAMES, FeatureExtractor, feature_bounds

RATES = (120.0, 250.0, 1200.0)
N_STEPS = 32


# ------------------------------------------------------------------------------ naive sidecar
class NaiveSidecar:
    """What a user would write without gazeguard (see the module docstring). No ledger.

    Args:
        sid: LSL source_id of the gaze outlet (``gazeguard simulate`` channel layout).
        broker: where to publish.
        window_s, step_s: feature window and step, s.
        topic: MQTT topic of the chunks.
    """

    def __init__(
        self, sid: str, host: str, port: int, window_s: float, step_s: float, topic: str
    ) -> None:
        info = pylsl.resolve_byprop("source_id", sid, 1, 10.0)
        if not info:
            raise RuntimeError(f"no LSL stream with source_id {sid!r}")
        self.inlet = pylsl.StreamInlet(
            info[0], max_buflen=60, recover=True, processing_flags=PROCESSING_FLAGS
        )
        self.inlet.open_stream(10.0)
        self.topic = topic
        # the detector is built for the rate the outlet declares, as gazeguard run does
        self.fx = FeatureExtractor(window_s, step_s, rate_hz=info[0].nominal_srate())
        self.chunker = Chunker(len(FEATURES), N_STEPS, 0)
        lo, hi, max_step = feature_bounds(None, window_s, step_s)
        bounds = Bounds(lo, hi, max_step)
        ref = make_mechanism(
            "dcfpa", n=N_STEPS, k="auto", epsilon=1.0, bounds=bounds, transform="dft"
        )
        self.mechanism = PlainMechanism(
            "dcfpa",
            "dft",
            int(ref.k),
            bounds,
            ref.noise_scale,
            backend="numpy",
            noise=numpy_laplace,
        )
        self.client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self.client.connect(host, port)
        self.client.loop_start()
        self.rows: list[tuple[float, float, float, float, float]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        #: per chunk: index, completed, payload built (= publish called), PUBACK; perf_counter
        self.records: list[tuple[int, float, float, float]] = []

    def _pull(self) -> None:
        while not self.stop.is_set():
            sample, ts = self.inlet.pull_sample(timeout=0.1)
            if ts is None:
                continue
            row = (ts, sample[1], sample[2], sample[3], sample[4])
            with self.lock:
                self.rows.append(row)

    def run(self, progress: bool = False) -> None:
        """Pull, compute and publish until :attr:`stop` is set."""
        puller = threading.Thread(target=self._pull, daemon=True)
        puller.start()
        try:
            while not self.stop.wait(0.05):
                with self.lock:
                    got, self.rows = self.rows, []
                if not got:
                    continue
                a = np.array(got)
                x = np.where(a[:, 4] >= 0.5, a[:, 1], np.nan)
                X, t = self.fx.push(GazeSamples.from_arrays(a[:, 0], x, a[:, 2], a[:, 3]))
                for chunk in self.chunker.add(X, t):
                    self._publish(chunk.index, chunk.timestamps, chunk.values, progress)
        finally:
            self.stop.set()
            puller.join()
            self.inlet.close_stream()
            self.client.disconnect()
            self.client.loop_stop()

    def _publish(
        self, index: int, timestamps: np.ndarray, values: np.ndarray, progress: bool
    ) -> None:
        completed = time.perf_counter()
        private = self.mechanism.release(values)
        payload = json.dumps(
            {
                "chunk_index": index,
                "timestamps": timestamps.tolist(),
                "features": list(NAMES),
                "values": private.tolist(),
            }
        ).encode()
        built = time.perf_counter()
        info = self.client.publish(self.topic, payload, qos=1)
        info.wait_for_publish(10)
        self.records.append((index, completed, built, time.perf_counter()))
        if progress:
            print(f"chunk {index} published", file=sys.stderr, flush=True)


def naive_latency_run(sid: str, broker: Broker, chunks: int) -> dict[str, Any]:
    """The naive sidecar in this process, fast settings, until ``chunks`` (+ warm-up) arrived."""
    topic = f"gazeguard/v1/bench/naive-{time.monotonic_ns()}/chunks"
    sidecar = NaiveSidecar(
        sid, broker.host, broker.port, FAST_FEATURES["window_s"], FAST_FEATURES["step_s"], topic
    )
    received: dict[int, float] = {}
    want = chunks + WARMUP_CHUNKS

    def on_message(_topic: str, payload: bytes, perf: float, _wall: float) -> None:
        received[int(json.loads(payload)["chunk_index"])] = perf
        if len(received) >= want:
            sidecar.stop.set()

    sub = Subscriber(broker.host, broker.port, [topic], on_message)
    timer = threading.Timer(120 + 2 * want, sidecar.stop.set)
    timer.start()
    try:
        sidecar.run()
    finally:
        timer.cancel()
        sub.close()
    recs = [r for r in sidecar.records if r[0] >= WARMUP_CHUNKS]
    return {
        "loop": "paho thread",
        "chunks": len(recs),
        "completion_to_payload": latency_stats([b - c for _, c, b, _ in recs]),
        "publish_to_puback": latency_stats([a - b for _, _, b, a in recs]),
        "completion_to_puback": latency_stats([a - c for _, c, _, a in recs]),
        "completion_to_receipt": latency_stats(
            [received[i] - c for i, c, _, _ in recs if i in received]
        ),
    }


def naive_cmd(sid: str, broker: Broker) -> list[str]:
    """The naive sidecar as a subprocess with default settings (W = 30 s, s = 0.5 s)."""
    return [sys.executable, __file__, "--naive-sidecar", sid, broker.host, str(broker.port)]


def run_naive_subprocess(sid: str, host: str, port: int) -> None:
    """``--naive-sidecar``: run until SIGTERM, one ``chunk …`` line per published chunk."""
    sidecar = NaiveSidecar(sid, host, port, 30.0, 0.5, f"gazeguard/v1/bench/naive-{sid}/chunks")
    signal.signal(signal.SIGTERM, lambda *_: sidecar.stop.set())
    sidecar.run(progress=True)


# ------------------------------------------------------------------------------ mechanism JSON
def mechanism_ratio() -> dict[str, Any] | None:
    """gazeguard vs plain numpy.fft release of a (52, 32) DCFPA dft chunk, from mechanisms.json."""
    path = RESULTS / "mechanisms.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    for row in doc.get("releases", []):
        if (row.get("mechanism"), row.get("transform"), row.get("n")) == ("dcfpa", "dft", N_STEPS):
            return {
                "source": "bench/results/mechanisms.json",
                "gazeguard_us": row["gazeguard_us"],
                "numpy_fft_us": row["numpy_unsafe_noise_us"],
                "numpy_over_gazeguard": row["numpy_unsafe_noise_us"] / row["gazeguard_us"],
                "numpy_opendp_noise_us": row.get("numpy_opendp_noise_us"),
            }
    return None


# ------------------------------------------------------------------------------ main
def footprint_pair(rate: float, broker: Broker, work: Path, seconds: float) -> dict[str, Any]:
    """``gazeguard run`` and the naive sidecar side by side on one outlet at ``rate`` Hz."""
    with simulated_headset(rate) as sid, ThreadPoolExecutor(2) as pool:
        ledger = work / f"fp-{int(rate)}-{time.monotonic_ns()}.sqlite"
        gg = pool.submit(measure_footprint, gazeguard_run_cmd(sid, broker, ledger), seconds, 150)
        nv = pool.submit(measure_footprint, naive_cmd(sid, broker), seconds, 150)
        return {"rate_hz": rate, "gazeguard": gg.result(), "naive": nv.result()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=300, help="chunks per latency run")
    ap.add_argument(
        "--seconds", type=float, default=64.0, help="measured seconds per footprint run"
    )
    ap.add_argument("--repeats", type=int, default=2, help="runs of each part (medians reported)")
    ap.add_argument("--quick", action="store_true", help="60 chunks, 20 s, one run")
    ap.add_argument(
        "--naive-sidecar", nargs=3, metavar=("SID", "HOST", "PORT"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.naive_sidecar:
        sid, host, port = args.naive_sidecar
        run_naive_subprocess(sid, host, int(port))
        return
    if args.quick:
        args.chunks, args.seconds, args.repeats = 60, 20.0, 1
    load_before = load_now()
    print(f"load average before: {load_before}")
    latency: dict[str, list[dict[str, Any]]] = {"asyncio": [], "uvloop": [], "naive": []}
    footprint: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, mosquitto(Path(tmp)) as broker:
        work = Path(tmp)
        with simulated_headset(120.0) as sid:
            for r in range(args.repeats):
                for loop in ("asyncio", "uvloop"):
                    latency[loop].append(
                        latency_run(sid, broker, work, args.chunks, loop, subscribe=True)
                    )
                latency["naive"].append(naive_latency_run(sid, broker, args.chunks))
                for name, runs in latency.items():
                    s, p = runs[-1]["completion_to_receipt"], runs[-1]["completion_to_puback"]
                    print(
                        f"run {r + 1} {name:8s}: completion→receipt p50 {s['p50_ms']:.2f} "
                        f"p99 {s['p99_ms']:.2f} max {s['max_ms']:.2f} ms; →PUBACK p50 "
                        f"{p['p50_ms']:.2f} p99 {p['p99_ms']:.2f} ms (load {load_now()})",
                        flush=True,
                    )
        for r in range(args.repeats):
            for rate in RATES:
                row = footprint_pair(rate, broker, work, args.seconds)
                footprint.append(row)
                g, n = row["gazeguard"], row["naive"]
                print(
                    f"run {r + 1} {rate:6.0f} Hz: gazeguard {g['cpu_pct']:.2f}% RSS "
                    f"{g['rss_max_mb']:.0f} MB; naive {n['cpu_pct']:.2f}% RSS "
                    f"{n['rss_max_mb']:.0f} MB "
                    f"(load {load_now()})",
                    flush=True,
                )
    keys = ("p50_ms", "p99_ms", "max_ms")
    lat_median = {
        name: {
            part: median_of([run[part] for run in runs], keys)
            for part in runs[0]
            if isinstance(runs[0][part], dict)
        }
        for name, runs in latency.items()
    }
    fp_median: list[dict[str, Any]] = []
    for rate in RATES:
        rows = [f for f in footprint if f["rate_hz"] == rate]
        g = median_of([f["gazeguard"] for f in rows], ("cpu_pct", "rss_max_mb"))
        n = median_of([f["naive"] for f in rows], ("cpu_pct", "rss_max_mb"))
        fp_median.append(
            {
                "rate_hz": rate,
                "gazeguard": g,
                "naive": n,
                "cpu_naive_over_gazeguard": n["cpu_pct"] / g["cpu_pct"],
                "rss_naive_over_gazeguard": n["rss_max_mb"] / g["rss_max_mb"],
            }
        )
    gg = lat_median["uvloop"]
    nv = lat_median["naive"]
    ratios = {
        "latency_completion_to_receipt_p50": nv["completion_to_receipt"]["p50_ms"]
        / gg["completion_to_receipt"]["p50_ms"],
        "latency_completion_to_receipt_p99": nv["completion_to_receipt"]["p99_ms"]
        / gg["completion_to_receipt"]["p99_ms"],
        "publish_paho_loop_over_outbox_publisher_p50": nv["publish_to_puback"]["p50_ms"]
        / gg["charged_to_puback"]["p50_ms"],
        "publish_paho_loop_over_outbox_publisher_p99": nv["publish_to_puback"]["p99_ms"]
        / gg["charged_to_puback"]["p99_ms"],
        "asyncio_over_uvloop_receipt_p50": lat_median["asyncio"]["completion_to_receipt"]["p50_ms"]
        / gg["completion_to_receipt"]["p50_ms"],
        "asyncio_over_uvloop_receipt_p99": lat_median["asyncio"]["completion_to_receipt"]["p99_ms"]
        / gg["completion_to_receipt"]["p99_ms"],
    }
    mech = mechanism_ratio()

    print("\nlatency from chunk completion, ms (median of runs; 120 Hz, window 2 s, step 0.01 s)")
    print(f"{'pipeline':10s} {'part':24s} {'p50':>8s} {'p99':>8s} {'max':>8s}")
    for name, parts in lat_median.items():
        for part, m in parts.items():
            print(f"{name:10s} {part:24s} {m['p50_ms']:8.3f} {m['p99_ms']:8.3f} {m['max_ms']:8.2f}")
    print("\nfootprint (defaults: W 30 s, s 0.5 s, n 32, all features), median of runs")
    print(
        f"{'rate':>6s} {'gazeguard CPU%':>15s} {'RSS MB':>7s} {'naive CPU%':>11s} {'RSS MB':>7s} "
        f"{'CPU ×':>6s}"
    )
    for f in fp_median:
        g, n = f["gazeguard"], f["naive"]
        print(
            f"{f['rate_hz']:6.0f} {g['cpu_pct']:15.2f} {g['rss_max_mb']:7.1f} {n['cpu_pct']:11.2f} "
            f"{n['rss_max_mb']:7.1f} {f['cpu_naive_over_gazeguard']:6.2f}"
        )
    print("\nratios (alternative / gazeguard; > 1: gazeguard cheaper or faster)")
    for k, v in ratios.items():
        print(f"  {k:48s} {v:6.2f}")
    if mech is not None:
        print(
            f"  {'mechanism numpy.fft / planned FFTW (52×32)':48s} "
            f"{mech['numpy_over_gazeguard']:6.2f}"
            f"  ({mech['gazeguard_us']:.0f} vs {mech['numpy_fft_us']:.0f} µs, from mechanisms.json)"
        )
    path = write_results(
        "e2e",
        {
            "benchmark": "bench/bench_e2e.py",
            "machine": machine(),
            "load_before": load_before,
            "load_after": load_now(),
            "settings": {
                "latency": {
                    "rate_hz": 120.0,
                    **FAST_FEATURES,
                    "chunk_steps": N_STEPS,
                    "chunks_per_run": args.chunks,
                    "warmup_chunks": WARMUP_CHUNKS,
                },
                "footprint": {"rates_hz": RATES, "settings": "defaults", "seconds": args.seconds},
                "repeats": args.repeats,
            },
            "latency_runs": latency,
            "latency_median": lat_median,
            "footprint_runs": footprint,
            "footprint_median": fp_median,
            "ratios": ratios,
            "mechanism": mech,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
