"""CPU cost of event detection + sliding-window features per session, before vs after.

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

Fleet access pattern (``fleet_rows`` in the JSON): a fleet worker holds hundreds of sessions and
hands each its new samples in turn, so the extractors' state is cold in the caches at every push.
``--fleet-sessions`` (default 300) extractors are fed round-robin (every session one block, then
the next round) with 12-sample blocks (100 ms at 120 Hz) and, in a second row, with blocks of 24,
36, 48 or 60 samples (the worker sometimes hands a session several blocks at once). "baseline" is
the package's ``gazeguard/signal/events.py`` and ``gazeguard/signal/features.py`` at git revision
``--baseline-rev`` (loaded from git into renamed modules), "after" the package's
``FeatureExtractor.push`` per session (the numpy reference: what a fleet worker runs without
numba; ``bench_fastpath.py`` measures the compiled passes against it); rounds alternate the
order (baseline first in even rounds, last in odd ones) and the numbers are medians over the
rounds. The baseline predates the cut of long runs at the grid (``events.SPLIT_GRID_S``; it is
given the same declared rate): the same work, but its vectors differ where a run is cut (one
session in 20 of the simulated minutes); ``baseline_identical_vectors`` records whether they
matched.

Run: ``python bench/bench_features_cpu.py [--seconds 300] [--rounds 7] [--fleet-rounds 7]``
(about a minute per configuration at the defaults); prints tables and writes
``bench/results/features_cpu.json``.
Target: >= 1,000 sessions of 120 Hz per core for the whole worker, so events
+ features must cost well under 1 ms per session-second.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from _harness import load_now, machine, write_results

from gazeguard.core.samples import GazeSamples
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal.events import EventDetector
from gazeguard.signal.features import FeatureExtractor

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "_reference_extraction.py"
#: the events + features code before the fleet-pattern work
BASELINE_REV = "773d176"
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


def load_baseline(rev: str) -> ModuleType:
    """``gazeguard/signal/features.py`` (and the ``events.py`` it imports) at git revision ``rev``,
    as
    modules ``_baseline_features`` and ``_baseline_events`` (the rest of the package is shared)."""
    modules = {}
    for name in ("events", "features"):
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:gazeguard/{name}.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        source = source.replace(
            "from gazeguard.signal.events import", "from _baseline_events import"
        )
        module = ModuleType(f"_baseline_{name}")
        module.__file__ = f"{rev}:gazeguard/{name}.py"
        sys.modules[module.__name__] = module
        exec(
            compile(source, module.__file__, "exec"), module.__dict__
        )  # our own code, at a git revision
        modules[name] = module
    return modules["features"]


def fleet_blocks(sessions: int, seconds: float, sizes: tuple[int, ...]) -> list[list[GazeSamples]]:
    """Per session (20 distinct simulated recordings, reused), its 120 Hz gaze cut into blocks of
    the ``sizes`` in turn (a fixed pseudo-random choice per block when there are several)."""
    rng = np.random.default_rng(0)
    out = []
    for s in range(min(sessions, 20)):
        g = simulate_gaze(seconds, 120.0, seed=s + 1)
        blocks, i = [], 0
        while i < len(g):
            size = int(rng.choice(sizes))
            blocks.append(g.slice(i, i + size))
            i += size
        out.append(blocks)
    return [out[s % len(out)] for s in range(sessions)]


def run_fleet(make: Any, blocks: list[list[GazeSamples]]) -> tuple[float, list[int]]:
    """CPU seconds for all sessions fed round-robin (one block each per round), and a checksum
    per session: the hash of its vectors."""
    fxs = [make() for _ in blocks]
    outs: list[list[bytes]] = [[] for _ in blocks]
    rounds = max(len(b) for b in blocks)
    sessions = list(zip(fxs, blocks, outs, strict=True))
    c0 = time.process_time()
    for j in range(rounds):
        for fx, bl, out in sessions:
            if j < len(bl):
                X, _ = fx.push(bl[j])
                if len(X):
                    out.append(X.tobytes())
    cpu = time.process_time() - c0
    return cpu, [hash(b"".join(o)) for o in outs]


def fleet(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The fleet access pattern: baseline and after (see the module docstring)."""
    base = load_baseline(args.baseline_rev)

    impls = {  # name: make an extractor
        "baseline": lambda: base.FeatureExtractor(
            30.0, 0.5, detector=base.EventDetector(sampling_rate_hz=120.0)
        ),
        "after": lambda: FeatureExtractor(30.0, 0.5, detector=EventDetector(rate_hz=120.0)),
    }
    n, secs = args.fleet_sessions, args.fleet_seconds
    print(
        f"\nfleet pattern: {n} sessions fed round-robin, {secs:g} s of 120 Hz gaze each, W = 30 s, "
        f"s = 0.5 s; median of {args.fleet_rounds} alternating rounds (load {load_now()})"
    )
    header = (
        f"{'block samples':>14} | {'baseline ms/s':>13} {'after ms/s':>10} {'ratio':>6} | "
        f"{'sessions/core after':>19} | {'ratio of minima':>15}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for sizes in ((12,), (24, 36, 48, 60)):
        blocks = fleet_blocks(n, secs, sizes)
        cpu: dict[str, list[float]] = {name: [] for name in impls}
        baseline_same = True
        for r in range(args.fleet_rounds):
            sums = {}
            for name in impls if r % 2 == 0 else reversed(impls):
                seconds, sums[name] = run_fleet(impls[name], blocks)
                cpu[name].append(seconds)
            baseline_same = baseline_same and sums["baseline"] == sums["after"]
        ms = {k: 1e3 * statistics.median(v) / (n * secs) for k, v in cpu.items()}
        ms_min = {k: 1e3 * min(v) / (n * secs) for k, v in cpu.items()}
        row = {
            "sessions": n,
            "rate_hz": 120.0,
            "block_samples": list(sizes),
            "gaze_s": secs,
            "baseline_rev": args.baseline_rev,
            "cpu_s": cpu,
            "ms_per_session_s": ms,
            "sessions_per_core": {k: 1e3 / v for k, v in ms.items()},
            "ratio_baseline_over_after": ms["baseline"] / ms["after"],
            "ms_per_session_s_min": ms_min,
            "ratio_of_minima": {"after": ms_min["baseline"] / ms_min["after"]},
            "baseline_identical_vectors": baseline_same,
            "load_avg_1min": load_now(),
        }
        rows.append(row)
        label = "/".join(map(str, sizes))
        mins = row["ratio_of_minima"]
        print(
            f"{label:>14} | {ms['baseline']:>13.3f} {ms['after']:>10.3f} "
            f"{row['ratio_baseline_over_after']:>5.2f}× | {1e3 / ms['after']:>19.0f} | "
            f"{mins['after']:>14.2f}×"
        )
        if not baseline_same:
            print(f"{'':>14}   (baseline vectors differ: it does not cut long runs at the grid)")
    return rows


def run_session(
    make: Any, blocks: list[GazeSamples], window: float, rate: float
) -> tuple[float, np.ndarray[Any, Any]]:
    """CPU seconds for one session fed ``blocks`` (a stream declared at ``rate`` Hz), and its
    vectors."""
    fx = make(window, rate)
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
    ap.add_argument("--fleet-sessions", type=int, default=300, help="fleet pattern: sessions")
    ap.add_argument("--fleet-seconds", type=float, default=60.0, help="fleet: gaze per session")
    ap.add_argument("--fleet-rounds", type=int, default=7, help="fleet: alternating rounds")
    ap.add_argument("--baseline-rev", default=BASELINE_REV, help="fleet: git revision compared")
    ap.add_argument("--fleet-only", action="store_true", help="skip the single-session table")
    args = ap.parse_args()
    fleet_rows = fleet(args)
    ref = load_reference()
    impls = {  # make(window, declared rate)
        "before": lambda w, r: ref.RefFeatureExtractor(
            w, 0.5, detector=ref.RefEventDetector(rate_hz=r)
        ),
        "after": lambda w, r: FeatureExtractor(w, 0.5, detector=EventDetector(rate_hz=r)),
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
    for rate, block, task, seed in () if args.fleet_only else CONFIGS:
        g = simulate_gaze(args.seconds, rate, seed, task)
        blocks = [g.slice(i, i + block) for i in range(0, len(g), block)]
        cpu: dict[str, list[float]] = {name: [] for name in impls}
        for _ in range(args.rounds):
            vectors = {}
            for name, make in impls.items():
                seconds, vectors[name] = run_session(make, blocks, args.window, rate)
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
        "fleet_rounds": args.fleet_rounds,
        "fleet_rows": fleet_rows,
        "machine": machine(),
    }
    print(f"wrote {write_results('features_cpu', doc)}")


if __name__ == "__main__":
    main()
