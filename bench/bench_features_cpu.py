"""CPU cost of event detection + sliding-window features per session, before vs after (issue 17).

Tracks: ms of CPU (``time.process_time``) per second of gaze for one session's
``FeatureExtractor.push`` (event detection included), fed in the blocks a fleet worker sees
(12 samples at 120 Hz, 25 at 250 Hz), at the deployed window (W = 30 s, s = 0.5 s); and the
implied sessions per core for events + features alone (1000 / that). "before" is the frozen
per-step recomputation the incremental extractor replaced (``tests/_reference_extraction.py``,
main's EventDetector and FeatureExtractor), "after" the package's; both run in this process on
the same pre-sliced blocks, in interleaved rounds (before, after, before, ...) so that load from
other processes hits both alike, and the reported numbers are medians over the rounds (the
ratio of the per-implementation minima is printed too: on a loaded machine the minimum is the
steadier estimate of the uncontended cost). Every round also checks that both give the same
vectors, bit for bit.

Run: ``python bench/bench_features_cpu.py [--seconds 300] [--rounds 7]`` (about a minute per
configuration at the defaults); prints a table and writes ``bench/results/features_cpu.json``.
Target (issue 17, item 4): >= 1,000 sessions of 120 Hz per core for the whole worker, so events
+ features must cost well under 1 ms per session-second.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from _harness import load_now, machine, write_results

from gazeguard.events import EventDetector
from gazeguard.features import FeatureExtractor
from gazeguard.samples import GazeSamples
from gazeguard.simulate import simulate_gaze

REFERENCE = Path(__file__).resolve().parent.parent / "tests" / "_reference_extraction.py"
#: (rate Hz, samples per block, task, seed)
CONFIGS = ((120.0, 12, "free", 1), (120.0, 12, "reading", 2), (250.0, 25, "search", 3))


def load_reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_reference_extraction", REFERENCE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_session(
    make: Any, blocks: list[GazeSamples], window: float
) -> tuple[float, np.ndarray[Any, Any]]:
    """CPU seconds for one session fed ``blocks``, and its vectors."""
    fx = make(window)
    out = []
    c0 = time.process_time()
    for b in blocks:
        X, _ = fx.push(b)
        if len(X):
            out.append(X)
    cpu = time.process_time() - c0
    return cpu, np.vstack(out) if out else np.empty((0, 48))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=300.0, help="gaze per session, s")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds per configuration")
    ap.add_argument("--window", type=float, default=30.0, help="feature window W, s")
    args = ap.parse_args()
    ref = load_reference()
    impls = {
        "before": lambda w: ref.RefFeatureExtractor(w, 0.5, detector=ref.RefEventDetector()),
        "after": lambda w: FeatureExtractor(w, 0.5, detector=EventDetector()),
    }
    rows = []
    print(
        f"events + features, W = {args.window:g} s, s = 0.5 s, {args.seconds:g} s of simulated "
        f"gaze per session, median of {args.rounds} interleaved rounds (load {load_now()})"
    )
    header = (
        f"{'rate':>6} {'block':>5} {'task':>8} | {'before ms/s':>11} {'after ms/s':>10} "
        f"{'ratio':>6} | {'sessions/core before':>20} {'after':>7} | {'ratio of minima':>15}"
    )
    print(header)
    print("-" * len(header))
    for rate, block, task, seed in CONFIGS:
        g = simulate_gaze(args.seconds, rate, seed, task)
        blocks = [g.slice(i, i + block) for i in range(0, len(g), block)]
        cpu: dict[str, list[float]] = {name: [] for name in impls}
        for _ in range(args.rounds):
            vectors = {}
            for name, make in impls.items():
                seconds, vectors[name] = run_session(make, blocks, args.window)
                cpu[name].append(seconds)
            if not np.array_equal(vectors["before"], vectors["after"]):
                raise SystemExit(f"vectors differ at {rate} Hz, {task}: not the same computation")
        ms = {name: 1e3 * statistics.median(v) / args.seconds for name, v in cpu.items()}
        ms_min = {name: 1e3 * min(v) / args.seconds for name, v in cpu.items()}
        row = {
            "rate_hz": rate,
            "block_samples": block,
            "task": task,
            "seed": seed,
            "gaze_s": args.seconds,
            "steps": int(vectors["after"].shape[0]),
            "cpu_s": cpu,
            "ms_per_session_s": ms,
            "sessions_per_core": {name: 1e3 / v for name, v in ms.items()},
            "ratio_before_over_after": ms["before"] / ms["after"],
            "ms_per_session_s_min": ms_min,
            "ratio_of_minima": ms_min["before"] / ms_min["after"],
            "identical_vectors": True,
            "load_avg_1min": load_now(),
        }
        rows.append(row)
        print(
            f"{rate:>6.0f} {block:>5} {task:>8} | {ms['before']:>11.3f} {ms['after']:>10.3f} "
            f"{row['ratio_before_over_after']:>5.2f}× | {1e3 / ms['before']:>20.0f} "
            f"{1e3 / ms['after']:>7.0f} | {row['ratio_of_minima']:>14.2f}×"
        )
    doc = {
        "what": __doc__.splitlines()[0],
        "window_s": args.window,
        "step_s": 0.5,
        "rounds": args.rounds,
        "rows": rows,
        "machine": machine(),
    }
    print(f"wrote {write_results('features_cpu', doc)}")


if __name__ == "__main__":
    main()
