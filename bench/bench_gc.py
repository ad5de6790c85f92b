"""Full garbage collections in a fleet worker's heap: how long one takes for N sessions.

A fleet worker's loop stalls while Python's collector makes a full (generation-2) pass, and
with 650 sessions those passes were the only loop stalls over 30 ms (29–57 ms each, every
13–17 s; docs/design.md, "Fleet"; docs/benchmarks.md). This reproduces the heap
offline, in one process: N :class:`~gazeguard.runtime.pipeline.Pipeline` (a SQLite ledger in a
temporary directory, the default features and DCFPA) fed ``--seconds`` of simulated 120 Hz
gaze in 1-s blocks through :func:`~gazeguard.runtime.pipeline.feed_many`, their chunks released with
:func:`~gazeguard.runtime.pipeline.release_group`, after :func:`gazeguard.runtime.service.
freeze_startup_objects` (as the worker does) and with the compiled passes on where numba is
installed (as the worker runs). Then it times full collections by hand (``gc.collect()``,
``--collections`` of them) and counts what the collector walks: tracked objects and the
references they hold, by type. The same for N bare
:class:`~gazeguard.signal.features.FeatureExtractor` (no pipeline around them), the part of a
session the feature work needs, for comparison: the difference is what the pipeline's other
objects cost each collection.

    python bench/bench_gc.py [--sessions 650] [--seconds 60] [--collections 5]

prints a table and writes ``bench/results/gc.json``. Target: a full collection well under the
50-ms p99 budget of a chunk at the worker's session count (it is not: that is the finding).
"""

from __future__ import annotations

import argparse
import collections
import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import load_now, machine, write_results

from gazeguard.config import Settings
from gazeguard.core.samples import GazeSamples
from gazeguard.plan import ReleasePlan
from gazeguard.runtime.pipeline import Pipeline, feed_many, release_group
from gazeguard.runtime.service import freeze_startup_objects, open_ledger
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal.compiled import Kernels, load_kernels
from gazeguard.signal.features import FeatureExtractor

RATE = 120.0
DISTINCT = 20  # distinct simulated recordings, reused round-robin over the sessions


def census(top: int = 8) -> dict[str, Any]:
    """Tracked objects (outside the frozen generation) and the references they hold, by type."""
    objs = gc.get_objects()
    count: collections.Counter[str] = collections.Counter()
    refs: collections.Counter[str] = collections.Counter()
    for o in objs:
        name = type(o).__qualname__
        count[name] += 1
        refs[name] += len(gc.get_referents(o))
    doc = {
        "tracked": len(objs),
        "references": sum(refs.values()),
        "frozen": gc.get_freeze_count(),
        "top_by_references": refs.most_common(top),
        "top_by_count": count.most_common(top),
    }
    del objs
    return doc


def time_collections(n: int) -> list[float]:
    """``n`` full collections by hand, ms each."""
    out = []
    for _ in range(n):
        t = time.perf_counter()
        gc.collect()
        out.append(1e3 * (time.perf_counter() - t))
    return out


def run(
    kind: str, sessions: int, seconds: int, collections_n: int, kernels: Kernels | None
) -> dict[str, Any]:
    """Build the heap of ``sessions`` (``kind``: "pipelines" or "extractors") running
    ``kernels``, feed it, time."""
    gazes = [simulate_gaze(seconds + 2.0, RATE, seed=i + 1) for i in range(DISTINCT)]
    blocks: list[list[GazeSamples]] = [
        [g.slice(int(RATE) * j, int(RATE) * (j + 1)) for j in range(seconds)] for g in gazes
    ]
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.model_validate({"ledger": {"path": str(Path(tmp) / "l.sqlite")}})
        ledger = open_ledger(settings.ledger, ReleasePlan.from_settings(settings))
        freeze_startup_objects()
        auto: list[float] = []

        def timer(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                timer.t0 = time.perf_counter()  # type: ignore[attr-defined]
            elif info["generation"] == 2:
                auto.append(1e3 * (time.perf_counter() - timer.t0))  # type: ignore[attr-defined]

        gc.callbacks.append(timer)
        try:
            if kind == "pipelines":
                pipes = [
                    Pipeline(ledger, session=f"s{i}", device="bench", rate_hz=RATE,
                             features=settings.features, mechanism=settings.mechanism,
                             kernels=kernels)
                    for i in range(sessions)
                ]  # fmt: skip
                for j in range(seconds):
                    jobs, _ = feed_many([(p, blocks[i % DISTINCT][j]) for i, p in enumerate(pipes)])
                    if jobs:
                        release_group(jobs)
            else:
                fxs = [
                    FeatureExtractor(30.0, 0.5, rate_hz=RATE, kernels=kernels)
                    for _ in range(sessions)
                ]
                for j in range(seconds):
                    for i, fx in enumerate(fxs):
                        fx.push(blocks[i % DISTINCT][j])
        finally:
            gc.callbacks.remove(timer)
        manual = time_collections(collections_n)
        doc = {
            "kind": kind,
            "sessions": sessions,
            "automatic_full_ms": [round(x, 2) for x in auto],
            "manual_full_ms": [round(x, 2) for x in manual],
            "manual_median_ms": statistics.median(manual),
            **census(),
        }
        ledger.close()
    gc.unfreeze()
    gc.collect()
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=650, help="sessions (default 650)")
    ap.add_argument("--seconds", type=int, default=60, help="seconds of gaze fed (default 60)")
    ap.add_argument("--collections", type=int, default=5, help="timed full collections")
    args = ap.parse_args()
    kernels = load_kernels()
    load = load_now()
    rows = []
    for kind in ("extractors", "pipelines"):
        print(f"{kind}: {args.sessions} sessions, {args.seconds} s of gaze ...", flush=True)
        rows.append(run(kind, args.sessions, args.seconds, args.collections, kernels))
    print(f"\n{'heap':>11} {'tracked':>8} {'references':>10} {'full gc ms (median)':>20}")
    for r in rows:
        print(
            f"{r['kind']:>11} {r['tracked']:8d} {r['references']:10d} {r['manual_median_ms']:20.1f}"
        )
    print("largest holders of references, pipelines:", rows[1]["top_by_references"][:5])
    path = write_results(
        "gc",
        {
            "benchmark": "bench_gc",
            "machine": machine(),
            "load_before": load,
            "compiled": kernels is not None,
            "settings": vars(args),
            "rows": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
