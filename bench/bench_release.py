"""Cost of ``gazeguard release`` on the GazeGraph feature dataset (8 people × 6 tasks × 5 min).

Tracks the wall time of each release mechanism over the whole table (features extracted once,
cached in the temp directory), against the papers' pseudocode written plainly — Python
loops over tasks, steps and groups (k-same) or rows (Exponential-DP) with numpy's generator —
and, for the Marginals privacy test, gazeguard's test run one candidate at a time against the
same test vectorised over all pending candidates. Medians of ``--repeat`` runs, one process.

    python bench/bench_release.py            # table on stdout, bench/results/release.json
    python bench/bench_release.py --slow     # also Marginals with omega=40 (minutes)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine, write_results

from gazeguard.offline.eval.datasets import open_dataset
from gazeguard.offline.release import RELEASE_MECHANISMS
from gazeguard.offline.release._common import ReleaseRandom, task_sequences
from gazeguard.offline.release.marginals import TaskModel, pd_test, to_bins
from gazeguard.signal.dataset import FeatureTable


def plain_ksame(table: FeatureTable, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The paper's k-same-select sequence pseudocode, literally: loops over tasks, steps, groups."""
    out = []
    for seqs in task_sequences(table).values():
        people = list(seqs)
        order = rng.permutation(len(people))
        groups = [order[g * k : (g + 1) * k] for g in range(len(people) // k)]
        t_max = max(r.size for r in seqs.values())
        for i in range(t_max):
            cur = np.array([table.X[seqs[p][min(i, seqs[p].size - 1)]] for p in people])
            out.extend(cur[g].mean(axis=0) for g in groups)
    return out


def plain_expdp(table: FeatureTable, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """The paper's Exponential-DP pseudocode, literally: one draw per feature vector.

    A feature that is constant in the data (δ = 0) comes out NaN here (0/0); gazeguard gives it
    the formula's limit, no noise. The errstate only silences those warnings.
    """
    X = table.X.copy()
    delta = X.max(axis=0) - X.min(axis=0)
    for seqs in task_sequences(table).values():
        t_max = max(r.size for r in seqs.values())
        with np.errstate(divide="ignore", invalid="ignore"):
            lam = epsilon / (2 * t_max * delta)
            for rows in seqs.values():
                for i in rows:
                    y = rng.exponential(1 / lam)
                    r = np.log(y) / (lam * t_max)
                    X[i] += np.where(rng.random(lam.size) < 0.5, -r, r)
    return X


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``repeat`` calls, s."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--slow", action="store_true", help="include Marginals omega=40")
    args = parser.parse_args()

    cache = Path(tempfile.gettempdir()) / "gazeguard-bench-cache"
    table = open_dataset("gazegraph").features(cache_dir=cache)
    f = len(table.feature_names)
    print(f"GazeGraph features: {table.n_rows} rows × {f} features", flush=True)
    rows: list[dict[str, Any]] = []

    def add(name: str, seconds: float, baseline: float | None = None, note: str = "") -> None:
        ratio = None if baseline is None else baseline / seconds
        rows.append({"case": name, "s": seconds, "baseline_s": baseline, "speedup": ratio})
        base = "" if baseline is None else f"{baseline:10.3f} {ratio:8.1f}x"
        print(f"{name:38s} {seconds:9.3f} {base:20s} {note}", flush=True)

    print(f"{'case':38s} {'gazeguard s':>9s} {'plain s':>10s} {'speedup':>8s}")
    gen = np.random.default_rng(42)
    for k in (2, 4, 8):
        ours = timed(lambda k=k: RELEASE_MECHANISMS["ksame"](table, {"k": k}), args.repeat)
        plain = timed(lambda k=k: plain_ksame(table, k, gen), args.repeat)
        add(f"ksame k={k}", ours, plain)
    for range_source in ("public", "data"):
        params = {"epsilon": 2.0, "range": range_source}
        ours = timed(lambda p=params: RELEASE_MECHANISMS["expdp"](table, p), args.repeat)
        plain = timed(lambda: plain_expdp(table, 2.0, gen), 1) if range_source == "data" else None
        add(f"expdp eps=2 range={range_source}", ours, plain)
    ours = timed(lambda: RELEASE_MECHANISMS["marginals"](table, {"k": 4}), args.repeat)
    add(f"marginals k=4 gamma=2 omega=F={f}", ours)
    for name, params in (
        ("dcfpa", {"epsilon": 1.0, "n": 32}),
        ("cfpa", {"epsilon": 1.0, "n": 64}),
        ("fpa", {"epsilon": 1.0}),
        ("lpa", {"epsilon": 1.0, "n": 32}),
    ):
        ours = timed(lambda n=name, p=params: RELEASE_MECHANISMS[n](table, p), args.repeat)
        add(f"{name} {params}", ours)

    # The (k, γ) test: one candidate at a time vs all pending candidates at once (one task).
    task_rows = np.flatnonzero(table.task == table.task[0])
    lo, hi = table.X.min(axis=0), table.X.max(axis=0)
    model = TaskModel.fit(to_bins(table.X[task_rows], lo, hi, 30), 30, 40)
    seeds = np.arange(200, dtype=np.intp)
    cand = model.candidates(seeds, ReleaseRandom(1))
    batch = timed(lambda: model.plausible_seeds(cand, seeds, 2.0, 4), args.repeat) / seeds.size
    one = timed(
        lambda: [pd_test(model, y, int(s), 4, 2.0) for y, s in zip(cand, seeds, strict=True)], 1
    )
    add("PD test per candidate (omega=40, k=4)", batch, one / seeds.size, "vectorised vs 1 by 1")
    if args.slow:
        params = {"k": 4, "omega": 40, "max_attempts": 2}
        ours = timed(lambda: RELEASE_MECHANISMS["marginals"](table, params), 1)
        add("marginals k=4 gamma=2 omega=40", ours)

    path = write_results(
        "release",
        {"machine": machine(), "rows": table.n_rows, "features": f, "results": rows},
    )
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
