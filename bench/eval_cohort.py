"""Cohort aggregates against averaging local releases, at 10, 100 and 1,000 sessions (issue 14.3).

Every session is a simulated person (``gazeguard.runtime.simulate``, its own seed and one of the
four
tasks) with 62 s of gaze: 64 clean feature vectors (30 s window, 0.5 s step) in one 60 s bucket.
The consumer wants, per bucket, the mean of each ``activity``-profile feature and the share of
each activity class (the shipped ``activity`` label model on the clean vectors) over the
sessions. Three ways to give it at the same user-level budget per hour of gaze (δ = 1e-6):

* **cohort** — :mod:`gazeguard.runtime.cohort`: a worker adds discrete Gaussian noise once to the
sum of
  the clipped contributions (the cohort's whole budget here), charged to every session in a real
  SQLite ledger; error ∝ σ/N.
* **local Gaussian** — each session releases its own contribution with the same Gaussian
  (same σ: the local L2 diameter of a contribution is also √3) and the consumer averages; the
  count is exact; error ∝ σ/√N. The best a per-session release of this vector can do.
* **local stream** — what a consumer of today's per-session chunk streams can do: every
  session's DCFPA-32 release of its two profile features with noise calibrated to the hour, as
  the sidecar does (``gazeguard.offline.eval.harness.BudgetFactory``), averaged over sessions (no
  labels: a stream carries none).

Errors are measured against the clean cohort values (the mean of the clipped, per-session
means), as RMSE over repetitions in units of each feature's public range (features) and as the
total-variation distance of the class shares (labels). Output: a table, and
``bench/results/eval_cohort.json``.

Usage: ``python bench/eval_cohort.py [--sessions 10,100,1000] [--budgets 1,10] [--reps 30]``
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine, write_results

from gazeguard.ledger import Ledger
from gazeguard.offline.eval.grid import parse_mechanism
from gazeguard.offline.eval.harness import BudgetFactory, FeatureBounds
from gazeguard.plan.cohort import plan_cohort
from gazeguard.privacy.mechanisms.randomness import random_source
from gazeguard.runtime.cohort import CohortAggregator, contribution
from gazeguard.runtime.simulate import TASKS, simulate_gaze
from gazeguard.signal.features import FEATURES, FeatureExtractor, feature_bounds
from gazeguard.signal.labels import load_model
from gazeguard.signal.profiles import load_profile

DELTA = 1e-6
BUCKET_S = 60.0
STEP_S = 0.5


def sessions(n: int, progress: bool) -> list[np.ndarray]:
    """``n`` simulated people: (64, 48) clean feature vectors each."""
    out = []
    t0 = time.perf_counter()
    for i in range(n):
        gaze = simulate_gaze(62.0, 120.0, seed=1000 + i, task=TASKS[i % len(TASKS)])
        X, _ = FeatureExtractor(window_s=30.0, step_s=STEP_S, rate_hz=120.0).push(gaze)
        out.append(X[:64])
        if progress and (i + 1) % 100 == 0:
            el = time.perf_counter() - t0
            print(f"  simulated {i + 1}/{n} people ({el:.0f} s)", file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", default="10,100,1000", help="cohort sizes (comma-separated)")
    ap.add_argument("--budgets", default="1,10", help="user-level ε per hour (comma-separated)")
    ap.add_argument("--reps", type=int, default=30, help="noise repetitions per configuration")
    ap.add_argument("--seed", type=int, default=0, help="INSECURE seed for reproducible noise")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sessions.split(",")]
    budgets = [float(b) for b in args.budgets.split(",")]
    profile = load_profile("activity")
    model = load_model("activity")
    names = list(FEATURES_NAMES)
    prof = [names.index(f) for f in profile.features]
    mcols = [names.index(f) for f in model.features]
    lo, hi, max_step = feature_bounds(profile.features, 30.0, STEP_S)
    units = [FEATURES[i].unit for i in prof]
    rng_seed = args.seed
    people = sessions(max(sizes), progress=True)
    rows: list[dict[str, Any]] = []
    for budget in budgets:
        plan = plan_cohort(
            profile.features, lo, hi, units, model.classes,
            bucket_s=BUCKET_S, budget=budget, delta=DELTA,
        )  # fmt: skip
        print(plan.text(), file=sys.stderr)
        factory = BudgetFactory(FeatureBounds(lo, hi, max_step), "auto", STEP_S, "laplace")
        stream = factory(parse_mechanism("dcfpa-32"), 32, budget, rng_seed)
        for n in sizes:
            group = people[:n]
            probs = [model.predict_proba(X[:, mcols]) for X in group]
            contribs = np.stack(
                [contribution(plan, X[:, prof], p) for X, p in zip(group, probs, strict=True)]
            )
            f = len(profile.features)
            true_u = contribs[:, :f].mean(axis=0)  # clipped means / √F, as released
            true_mean = lo + (hi - lo) * math.sqrt(f) * true_u
            true_h = contribs[:, f:-1].mean(axis=0)
            true_share = true_h / true_h.sum()
            err: dict[str, list[float]] = {"cohort": [], "local": [], "stream": []}
            tv: dict[str, list[float]] = {"cohort": [], "local": []}
            t_release = 0.0
            for rep in range(args.reps):
                # cohort: the real aggregator, a real ledger
                with tempfile.TemporaryDirectory() as tmp, Ledger(Path(tmp) / "l.sqlite") as led:
                    agg = CohortAggregator(
                        plan, led, cohort="bench", worker="w", insecure_seed=rng_seed + rep
                    )
                    t = 29_000_000 * BUCKET_S + np.linspace(1, 59, 64)
                    for i, (X, p) in enumerate(zip(group, probs, strict=True)):
                        agg.add("hmd", f"s{i}", X[:, prof], t, p)
                    t1 = time.perf_counter()
                    (rel,) = agg.release_due(math.inf)
                    t_release += time.perf_counter() - t1
                msg = rel.message
                means = np.array([x.mean for x in msg.features])
                err["cohort"].append(
                    float(np.sqrt(np.mean(((means - true_mean) / (hi - lo)) ** 2)))
                )
                tv["cohort"].append(0.5 * float(np.abs(np.array(msg.shares) - true_share).sum()))
                # local Gaussian: each session noises its own vector; the consumer averages
                src = random_source(rng_seed + 10_000 + rep)
                noise = np.stack([plan.noise.sample(src).reshape(-1) for _ in range(n)])
                grid = float(plan.noise.grid[0])
                local = (np.rint(contribs / grid) + noise) * grid
                lu = local[:, :f].mean(axis=0)
                lmean = np.clip(lo + (hi - lo) * math.sqrt(f) * lu, lo, hi)
                err["local"].append(float(np.sqrt(np.mean(((lmean - true_mean) / (hi - lo)) ** 2))))
                lh = np.maximum(local[:, f:-1].mean(axis=0), 0.0)
                lshare = lh / lh.sum() if lh.sum() > 0 else lh
                tv["local"].append(0.5 * float(np.abs(lshare - true_share).sum()))
                # local stream: each session's DCFPA-32 chunks (2 × 32 steps) of the profile
                rel_means = []
                for X in group:
                    x = np.clip(X[:, prof], lo, hi).T  # (F, 64)
                    y = np.concatenate([stream.release(x[:, :32]), stream.release(x[:, 32:])], 1)
                    rel_means.append(y.mean(axis=1))
                smean = np.mean(rel_means, axis=0)
                err["stream"].append(
                    float(np.sqrt(np.mean(((smean - true_mean) / (hi - lo)) ** 2)))
                )
            row = {
                "budget_per_hour": budget,
                "sessions": n,
                "sigma": plan.sigma,
                "feature_rmse_over_range": {
                    k: float(np.sqrt(np.mean(np.square(v)))) for k, v in err.items()
                },
                "share_tv": {k: float(np.mean(v)) for k, v in tv.items()},
                "cohort_release_s": t_release / args.reps,
            }
            rows.append(row)
            fr, st = row["feature_rmse_over_range"], row["share_tv"]
            print(
                f"ε {budget:g}/h, {n:5d} sessions: feature RMSE/range cohort {fr['cohort']:.4f}, "
                f"local Gaussian {fr['local']:.4f}, local stream {fr['stream']:.4f} | share TV "
                f"cohort {st['cohort']:.3f}, local {st['local']:.3f} | release "
                f"{row['cohort_release_s'] * 1000:.0f} ms",
                flush=True,
            )
    print(
        "\n| ε/hour | sessions | feature RMSE / range: cohort | local Gaussian | local stream "
        "| class shares TV: cohort | local |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        fr, st = r["feature_rmse_over_range"], r["share_tv"]
        print(
            f"| {r['budget_per_hour']:g} | {r['sessions']} | {fr['cohort']:.4f} "
            f"| {fr['local']:.4f} | {fr['stream']:.4f} | {st['cohort']:.3f} | {st['local']:.3f} |"
        )
    path = write_results(
        "eval_cohort",
        {"machine": machine(), "delta": DELTA, "bucket_s": BUCKET_S, "reps": args.reps,
         "profile": profile.features, "classes": list(model.classes), "rows": rows},
    )  # fmt: skip
    print(f"wrote {path}")
    return 0


FEATURES_NAMES = tuple(f.name for f in FEATURES)

if __name__ == "__main__":
    raise SystemExit(main())
