"""CPU per session-second of a fleet worker's per-block path (decode + events + features +
chunking), numba's compiled passes against the per-session numpy reference, in one process.

Tracks: ms of CPU (``time.process_time``) per session-second of 120 Hz gaze, and the implied
sessions per core for this path (1000 / that). ``--sessions`` sessions (20 distinct simulated
recordings, reused) are fed round-robin as a worker feeds them: every round, one GGR1 payload per
session (``--block`` samples, 100 ms at the default 12) is decoded in one
:func:`~gazeguard.signal.rawgaze.decode_many` call, each block pushed to its session's
:class:`~gazeguard.signal.features.FeatureExtractor` in turn (W = 30 s, s = 0.5 s) and the vectors
handed to the session's :class:`~gazeguard.core.chunking.Chunker` (DCFPA-32 chunks). "numpy" runs
the reference (what a worker runs without numba or with ``fleet.compiled = false``),
"compiled" the same with ``load_kernels()`` handed to the decoder, detectors and extractors.
Repetitions alternate the order; every repetition checks that both give the same chunks bit for
bit. The rest of a worker's work (NATS, the ledger, noise, publishing) is the same for both
paths, so the worker's own ratio is at most this one.

Run: ``python bench/bench_fastpath.py [--sessions 300] [--seconds 60] [--reps 5] [--block 12]``;
prints the medians and minima and the ratio numpy / compiled, and writes
``bench/results/fastpath-<block>.json``. The fleet's own ratio, same run: ``bench_fleet.py
--baseline`` against a checkout with ``fleet.compiled`` off.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _harness import load_now, machine, write_results

from gazeguard.core.chunking import Chunker
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal.compiled import Kernels, load_kernels
from gazeguard.signal.events import EventDetector
from gazeguard.signal.features import FEATURES, FeatureExtractor
from gazeguard.signal.rawgaze import decode_many, encode_gaze

RATE = 120.0


def payloads(sessions: int, seconds: float, block: int) -> list[list[bytes]]:
    """Per session its gaze as GGR1 payloads of ``block`` samples (20 recordings, reused)."""
    out = []
    for s in range(min(sessions, 20)):
        g = simulate_gaze(seconds, RATE, seed=s + 1)
        out.append([encode_gaze(g.slice(i, i + block)) for i in range(0, len(g), block)])
    return [out[s % len(out)] for s in range(sessions)]


def run(kernels: Kernels | None, data: list[list[bytes]]) -> tuple[float, int]:
    """CPU seconds to decode, push and chunk all sessions' payloads round-robin (``kernels``:
    the compiled passes, or ``None``: the numpy reference), and a hash of every chunk's rows."""
    fxs = [
        FeatureExtractor(30.0, 0.5, detector=EventDetector(rate_hz=RATE, kernels=kernels),
                         kernels=kernels)
        for _ in data
    ]  # fmt: skip
    chunkers = [Chunker(len(FEATURES), 32) for _ in data]
    digest: list[bytes] = []
    rounds = max(len(p) for p in data)
    c0 = time.process_time()
    for j in range(rounds):
        due = [s for s in range(len(data)) if j < len(data[s])]
        decoded = decode_many([data[s][j] for s in due], kernels)
        for s, block in zip(due, decoded.blocks, strict=True):
            assert not isinstance(block, Exception)
            X, t = fxs[s].push(block)
            if len(X):
                digest.extend(c.values.tobytes() for c in chunkers[s].add(X, t))
    cpu = time.process_time() - c0
    return cpu, hash(b"".join(digest))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=60.0, help="gaze per session, s")
    ap.add_argument("--block", type=int, default=12, help="samples per payload")
    ap.add_argument("--reps", type=int, default=5, help="alternating repetitions")
    args = ap.parse_args()
    kernels = load_kernels()
    assert kernels is not None, "numba is not installed"
    data = payloads(args.sessions, args.seconds, args.block)
    run(kernels, data[:20])  # warm both paths
    run(None, data[:20])
    impls: dict[str, Kernels | None] = {"numpy": None, "compiled": kernels}
    cpu: dict[str, list[float]] = {k: [] for k in impls}
    for r in range(args.reps):
        sums = {}
        for name in impls if r % 2 == 0 else reversed(impls):
            seconds, sums[name] = run(impls[name], data)
            cpu[name].append(seconds)
        if sums["numpy"] != sums["compiled"]:
            raise SystemExit("chunks differ: not the same computation")
    session_s = args.sessions * args.seconds
    load = load_now()
    med = {k: 1e3 * statistics.median(v) / session_s for k, v in cpu.items()}
    low = {k: 1e3 * min(v) / session_s for k, v in cpu.items()}
    print(f"load {load}; {args.sessions} sessions x {args.seconds:g} s, block {args.block}")
    for k in impls:
        print(f"{k:>9}: median {med[k]:.3f} ms/session-s ({1e3 / med[k]:.0f} sessions/core), "
              f"min {low[k]:.3f}")  # fmt: skip
    print(f"ratio numpy/compiled: median {med['numpy'] / med['compiled']:.3f}, "
          f"minima {low['numpy'] / low['compiled']:.3f}")  # fmt: skip
    doc = {
        "benchmark": "bench/bench_fastpath.py",
        "numpy_path": "per-session reference: FeatureExtractor.push per session, no kernels",
        "machine": machine(),
        "load": load,
        "settings": vars(args),
        "cpu_s": cpu,
        "ms_per_session_s": med,
        "ms_per_session_s_min": low,
        "ratio_numpy_over_compiled": med["numpy"] / med["compiled"],
        "ratio_of_minima": low["numpy"] / low["compiled"],
        "identical_chunks": True,
    }
    print(f"wrote {write_results(f'fastpath-{args.block}', doc)}")


if __name__ == "__main__":
    main()
