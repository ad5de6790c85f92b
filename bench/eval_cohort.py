"""Cohort aggregates: on recorded people (the product's question, its levers, its attacks) and
against averaging local releases.

**Part 1 — recorded people** (:mod:`gazeguard.offline.eval.cohort`; its docstring states the
units, how cohorts larger than a dataset's head count are formed and what that does to the
attacks). Datasets: GazeGraph (``/work/shared/data`` or ``--data-dir``; skipped with a note when
absent), a ``csv:`` folder of gazeguard CSV recordings this script writes from simulated 120 Hz
headsets (``--csv-people`` people × 4 tasks × ``--csv-seconds``, read back through
:mod:`gazeguard.offline.recordings` at the declared 120 Hz; Andersson 2017's per-person trials,
9–29 s, are shorter than one 30 s feature window and hold no bucket), and the synthetic dataset
(8 simulated people × 4 tasks × 300 s at 60 Hz). Per dataset, at user-level ε per hour of gaze
``--budgets`` (δ 1e-6, all of it on the cohort) and cohort sizes ``--sizes``:

* the question — the group's dominant activity from the released class shares: accuracy, clean,
  the share of clean above chance ``(acc − chance)/(clean − chance)``;
* re-identification of one recording's person by the informed attacker (knows every other
  member's contribution) and the realistic one (knows the population mean only);
* the levers, each through the plan's calibration at the same ε: release ``shares`` alone
  against ``means+shares``; buckets of 60, 300 and 600 s;
* continual release of running totals: the binary tree (tree aggregation) against summing the
  per-bucket releases, calibrated at user level (:func:`~gazeguard.offline.eval.cohort.
  running_aggregates`).

**Part 2 — cohort vs local releases** (``--local``; otherwise its rows are carried over from the
previous results file, with the date they were measured). Every session is a simulated person
(``gazeguard.runtime.simulate``, its own seed and one of the four tasks) with 62 s of gaze: 64
clean feature vectors (30 s window, 0.5 s step) in one 60 s bucket. The consumer wants, per
bucket, the mean of each ``activity``-profile feature and the share of each activity class (the
shipped ``activity`` label model on the clean vectors) over the sessions. Three ways to give it
at the same user-level budget per hour of gaze (δ = 1e-6):

* **cohort** — :mod:`gazeguard.runtime.cohort`: a worker adds discrete Gaussian noise once to the
  sum of the clipped contributions (the cohort's whole budget here), charged to every session in
  a real SQLite ledger; error ∝ σ/N.
* **local Gaussian** — each session releases its own contribution with the same Gaussian
  (same σ: the local L2 diameter of a contribution is also √3) and the consumer averages; the
  count is exact; error ∝ σ/√N. The best a per-session release of this vector can do.
* **local stream** — what a consumer of today's per-session chunk streams can do: every
  session's DCFPA-32 release of its two profile features with noise calibrated to the hour, as
  the sidecar does (``gazeguard.offline.eval.harness.BudgetFactory``), averaged over sessions (no
  labels: a stream carries none).

Errors are measured against the clean cohort values (the mean of the clipped, per-session
means), as RMSE over repetitions in units of each feature's public range (features) and as the
total-variation distance of the class shares (labels).

Output: tables, ``bench/results/eval_cohort.json`` and ``bench/results/eval_cohort.md``.

Usage: ``python bench/eval_cohort.py [--quick] [--datasets gazegraph,csv,synthetic]
[--sizes 10,30,100,1000] [--budgets 1,10,100] [--bucket-lengths 300,600,3600]
[--realistic-trials 4000] [--local [--sessions 10,100,1000] [--reps 20]]``
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import RESULTS, machine, write_results

from gazeguard.config import FeatureSettings
from gazeguard.core.samples import GazeSamples
from gazeguard.ledger import Ledger
from gazeguard.offline.eval import cohort as ev
from gazeguard.offline.eval.datasets import DataNotFoundError, open_dataset
from gazeguard.offline.eval.grid import parse_mechanism
from gazeguard.offline.eval.harness import BudgetFactory, FeatureBounds
from gazeguard.offline.recordings import ReadOptions
from gazeguard.plan import releases_per_hour
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


def local_comparison(args: argparse.Namespace) -> dict[str, Any]:
    """Part 1 (the module docstring's first part): cohort against averaging local releases on
    simulated sessions; the JSON rows (also printed as a table)."""
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
            bucket_s=BUCKET_S, per_hour=releases_per_hour(FeatureSettings(), BUCKET_S, BUCKET_S),
            budget=budget, delta=DELTA,
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
    return {"reps": args.reps, "profile": profile.features, "classes": list(model.classes),
            "rows": rows}  # fmt: skip


FEATURES_NAMES = tuple(f.name for f in FEATURES)
CSV_RATE_HZ = 120.0
CSV_TASKS = TASKS  # the simulator's: free, reading, search, watching


# ------------------------------------------------------------------------------ part 1: recorded
def write_csv_dataset(folder: Path, people: int, seconds: float) -> Path:
    """``people`` simulated 120 Hz headsets × 4 tasks of ``seconds`` each, one gazeguard CSV per
    recording (``t,x_deg,y_deg,pupil_mm,valid,person,task``), seeds far from the synthetic
    dataset's; returns the folder (reused when already written with these parameters)."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = folder / "MADE"
    made = f"{people} {seconds:g} {CSV_RATE_HZ:g}"
    if stamp.is_file() and stamp.read_text() == made:
        return folder
    for p in range(people):
        for task in CSV_TASKS:
            gaze: GazeSamples = simulate_gaze(seconds, CSV_RATE_HZ, 50_000 + p, task=task)
            person = f"hmd{p + 1:02d}"
            body = np.column_stack(
                [gaze.timestamps, gaze.x_deg, gaze.y_deg, gaze.pupil_mm, gaze.valid]
            )
            with (folder / f"{person}_{task}.csv").open("w") as f:
                f.write("t,x_deg,y_deg,pupil_mm,valid,person,task\n")
                for row in body:
                    f.write(
                        f"{row[0]:.6f},{row[1]:.5f},{row[2]:.5f},{row[3]:.4f},{int(row[4])},"
                        f"{person},{task}\n"
                    )
    stamp.write_text(made)
    return folder


def recorded(args: argparse.Namespace) -> dict[str, Any]:
    """Part 1: per dataset the main table (the kept configuration), the levers and the theory
    of running totals; JSON-ready."""
    sizes = [int(v) for v in args.sizes.split(",")]
    budgets = [float(v) for v in args.budgets.split(",")]
    profile = load_profile("activity")
    model = load_model("activity")
    cache = Path.home() / ".cache" / "gazeguard" / "eval"
    knobs = {
        "sizes": sizes,
        "buckets": 300 if args.quick else 2000,
        "trials": 2000 if args.quick else 10_000,
        "realistic_trials": 200 if args.quick else args.realistic_trials,
        "seed": args.seed,
    }
    out: dict[str, Any] = {}
    for spec in args.datasets.split(","):
        try:
            if spec == "csv":
                folder = write_csv_dataset(
                    Path(args.csv_dir), args.csv_people, 120.0 if args.quick else args.csv_seconds
                )
                ds = open_dataset(f"csv:{folder}", read_options=ReadOptions(rate_hz=CSV_RATE_HZ))
            else:
                ds = open_dataset(
                    spec, args.data_dir, synthetic_duration_s=150.0 if args.quick else 300.0
                )
        except DataNotFoundError as exc:
            print(f"{spec}: skipped: {exc}", file=sys.stderr)
            continue
        table = ds.features(30.0, STEP_S, cache, lambda m: print(m, file=sys.stderr))
        data = ev.prepare(ds.name, table, model.features, lambda m: print(m, file=sys.stderr))
        levers = ev.evaluate_levers(
            data, budgets, profile_features=profile.features,
            bucket_lengths=[float(b) for b in args.bucket_lengths.split(",")],
            progress=lambda m: print(m, file=sys.stderr, flush=True), **knobs,
        )  # fmt: skip
        out[spec] = {"name": ds.name, "people": data.people, "classes": list(data.classes),
                     "windows": table.n_rows, "configs": levers}  # fmt: skip
    return out


def running(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Binary tree against summed per-bucket releases at 10 ε per hour, one hour of buckets."""
    out = []
    for bucket_s in (60.0, 300.0):
        n = releases_per_hour(FeatureSettings(), bucket_s, bucket_s)
        r = ev.running_aggregates(10.0, bucket_s=bucket_s, horizon=n, reps=4000, seed=args.seed)
        out.append(r)
    return out


def _config(res: dict[str, Any], bucket_s: float, release: tuple[str, ...]) -> dict[str, Any]:
    return next(
        c for c in res["configs"] if c["bucket_s"] == bucket_s and tuple(c["release"]) == release
    )


def markdown(doc: dict[str, Any]) -> list[str]:
    """The results file's tables (``eval_cohort.md``)."""
    lines = ["# Cohort aggregates on recorded people", "",
             f"Generated by `python bench/eval_cohort.py` ({doc['seconds']:.0f} s on "
             f"{doc['machine']['nproc']} cores). δ {doc['delta']:g}; ε is user-level per hour of "
             "gaze, all of it on the cohort; the question is the activity most of the cohort's "
             "members do in a bucket (each does the bucket's dominant one with probability 0.5), "
             "from the released class shares. Units, cohort formation and the attackers: "
             "`gazeguard/offline/eval/cohort.py`.", ""]  # fmt: skip
    kept = (doc["kept"]["bucket_s"], tuple(doc["kept"]["release"]))
    for res in doc["datasets"].values():
        main_cfg = _config(res, *kept)
        lines += [
            f"## {res['name']} ({res['people']} people, {len(res['classes'])} activities, "
            f"{main_cfg['units']} units of {kept[0]:g} s)",
            "",
            f"Kept configuration: {'+'.join(kept[1])}, {kept[0]:g} s buckets "
            f"({main_cfg['buckets_per_hour']} per hour, Δ2 = {main_cfg['sensitivity_l2']:.3g}). "
            f"Chance: task {main_cfg['chance_task']:.3f}, re-identification "
            f"{main_cfg['chance_reid']:.3f} ({main_cfg['candidates']} candidates, "
            f"{main_cfg['buckets_per_recording']:.3g} buckets of a recording).",
            "",
            "| cohort | people (mean) | repeated units | ε/h | noise | task acc | clean | kept "
            "above chance | re-id informed | re-id realistic |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in main_cfg["rows"]:
            for cell in row["released"]:
                b = f"{cell['budget_per_hour']:g}"
                kept_v = cell["kept_above_chance"]
                lines.append(
                    f"| {row['sessions']} | {row['distinct_people']:.1f} | "
                    f"{100 * row['repeated_units']:.0f} % | {b} | {_noise(cell)} | "
                    f"{cell['accuracy']:.3f} | {row['clean_accuracy']:.3f} | "
                    f"{'n/a' if kept_v is None else f'{100 * kept_v:.0f} %'} | "
                    f"{cell['reid_informed']:.3f} | {cell['reid_realistic']:.3f} |"
                )
        lines += ["", f"Levers on {res['name']} at a cohort of {doc['lever_size']} (kept above "
                  "chance; informed re-identification; same ε per hour everywhere):", "",
                  "| release | bucket | per hour | Δ2 | " + " | ".join(
                      f"ε {b:g}/h kept | ε {b:g}/h re-id" for b in doc["budgets"]) + " |",
                  "|---|---:|---:|---:|" + "---:|---:|" * len(doc["budgets"])]  # fmt: skip
        for cfg in res["configs"]:
            row = next(r for r in cfg["rows"] if r["sessions"] == doc["lever_size"])
            cells = []
            for cell in row["released"]:
                k = cell["kept_above_chance"]
                cells.append(f"{'n/a' if k is None else f'{100 * k:.0f} %'}")
                cells.append(f"{cell['reid_informed']:.3f}")
            lines.append(
                f"| {'+'.join(cfg['release'])} | {cfg['bucket_s']:g} s | "
                f"{cfg['buckets_per_hour']} | {cfg['sensitivity_l2']:.3g} | "
                + " | ".join(cells)
                + " |"
            )
        lines.append("")
    lines += goal_lines(doc)
    lines += ["## Running totals: binary tree vs summed bucket releases (user level, 10 ε/h)", "",
              "RMSE of the running total after t buckets, in counts (one class coordinate; "
              "measured over Gaussian draws, theory in brackets).", "",
              "| bucket | t | summed releases | binary tree |",
              "|---:|---:|---:|---:|"]  # fmt: skip
    for r in doc["running"]:
        for t in sorted({1, 2, 8, 30, r["buckets_per_hour"]} & set(r["t"])):
            i = t - 1
            lines.append(
                f"| {r['bucket_s']:g} s | {t} | {r['rmse_per_bucket'][i]:.2f} "
                f"({r['theory_per_bucket'][i]:.2f}) | {r['rmse_tree'][i]:.2f} "
                f"({r['theory_tree'][i]:.2f}) |"
            )
    return lines


def _committed(path: Path) -> str:
    """Where part 2's carried-over rows were measured: the commit that last wrote ``path``."""
    got = subprocess.run(
        ["git", "log", "-1", "--format=%h %cs", "--", str(path)],
        capture_output=True, text=True, check=False, cwd=path.parent,
    )  # fmt: skip
    return f"commit {got.stdout.strip() or 'unknown'} (part 2 not re-run)"


def goal_lines(doc: dict[str, Any]) -> list[str]:
    """The goals at 10 ε/h — a cohort of 30 keeps ≥ 80 % of clean above chance with buckets of
    at most 5 min, a cohort of 10 with buckets of at most 1 h, the realistic attacker within 2
    points of chance — per dataset and configuration; the informed attacker beside its DP
    bound (mode only)."""
    budget = 10.0
    if budget not in doc["budgets"]:
        return []
    j = doc["budgets"].index(budget)
    lines = [f"## The goals at {budget:g} ε/h: ≥ 80 % of clean above chance (a cohort of 30 with "
             "buckets ≤ 5 min, a cohort of 10 with buckets ≤ 1 h), realistic re-identification "
             "≤ chance + 0.02; the informed attacker beside its DP bound", "",
             "| dataset | cohort | release | bucket | noise | kept above chance | re-id realistic "
             "| re-id informed | its DP bound | chance | goal |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for res in doc["datasets"].values():
        for n, longest in ((30, 300.0), (10, 3600.0)):
            for cfg in res["configs"]:
                row = next((r for r in cfg["rows"] if r["sessions"] == n), None)
                if row is None or cfg["bucket_s"] > longest:
                    continue
                cell = row["released"][j]
                kept, real = cell["kept_above_chance"], cell["reid_realistic"]
                bound = (cfg.get("dp_bound_informed") or {}).get(f"{budget:g}")
                met = kept is not None and kept >= 0.8 and real <= cfg["chance_reid"] + 0.02
                lines.append(
                    f"| {res['name']} | {n} | {'+'.join(cfg['release'])} | {cfg['bucket_s']:g} s "
                    f"| {_noise(cell)} | {_pct(kept)} | {real:.3f} | {cell['reid_informed']:.3f} "
                    f"| {'—' if bound is None else f'{bound:.3f}'} | {cfg['chance_reid']:.3f} | "
                    f"{'**met**' if met else '—'} |"
                )
    lines += ["", THEORY, ""]
    return lines


def _noise(cell: dict[str, Any]) -> str:
    """A cell's noise: the mode's ε per bucket, or the Gaussian σ."""
    eps = cell.get("mode_epsilon")
    return f"ε {eps:.3g}/bucket" if eps else f"σ {cell['sigma']:.3g}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.0f} %"


THEORY = """Why. *Release only what is asked:* the shares alone are one block (Δ2 = 1), means beside
them three (Δ2 = √3): the same ε buys √3 less noise on the shares. *Longer buckets:* a person
moves a bucket's sum by at most Δ2 however long the bucket is, and the plan composes the
buckets one hour of gaze can change (63 of 60 s, 14 of 300 s, 8 of 600 s): σ grows like the
square root of that count, while the signal — N members' mean class probabilities — does not
shrink with the bucket (and averages more windows, so the label model errs less). Summing k
60 s releases instead costs √k·σ₆₀, far above one k-times-longer bucket's σ. *The informed
attacker* knows every other member and the target's exact contribution: its accuracy depends on
the ε spent on the recording it sees and on how far apart people's contributions are, never on N;
at 10 ε/h a 5-minute recording's shares carry a few points of identity whatever the bucket.
Releasing *only the group's dominant activity* (the ``mode`` part: permute-and-flip over the
members' vote shares, one ε-DP choice per bucket) answers the same question and pays for one
choice, not for noise on every share: each session moves each class score by at most 1, so a
mode that leads by a few sessions is chosen almost always at ε ≈ 0.7 per bucket (300 s), and
the attacker learns only whether the target tipped the choice, which among 30 members it rarely
does (its DP bound, ``e^{2Hε}/(e^{2Hε} + K − 1)`` for H buckets, is loose: it assumes the
target alone decides the choice). *Continual
release:* the binary mechanism wins at event level because one event is in one leaf; at user
level a person is in every bucket, a level-k node moves by up to 2^k, and the running total
after t buckets moves by t — no mechanism can release it with less noise than about t/μ, which
the consumer already gets by summing the per-bucket releases (free post-processing). The tree
pays more (below), so it is not implemented."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer buckets and trials, shorter data")
    ap.add_argument("--datasets", default="gazegraph,csv,synthetic", help="comma-separated")
    ap.add_argument("--data-dir", type=Path, default=Path("/work/shared/data"))
    ap.add_argument("--csv-dir", default=str(Path(tempfile.gettempdir()) / "gazeguard-cohort-csv"))
    ap.add_argument("--csv-people", type=int, default=12)
    ap.add_argument("--csv-seconds", type=float, default=300.0)
    ap.add_argument("--sizes", default="10,30,100,1000", help="cohort sizes (comma-separated)")
    ap.add_argument("--budgets", default="1,10,100", help="user-level ε per hour (comma-separated)")
    ap.add_argument("--bucket-lengths", default="300,600,3600", help="bucket lengths, s (levers)")
    ap.add_argument("--kept-bucket-s", type=float, default=ev.DEFAULT_BUCKET_S)
    ap.add_argument(
        "--realistic-trials", type=int, default=4000,
        help="realistic re-identification trials per size and budget (sd ≈ 0.005 at 4000)",
    )  # fmt: skip
    ap.add_argument("--local", action="store_true", help="also run part 2 (simulated sessions)")
    ap.add_argument("--sessions", default="10,100,1000", help="part 2: cohort sizes")
    ap.add_argument("--reps", type=int, default=20, help="part 2: noise repetitions")
    ap.add_argument("--seed", type=int, default=0, help="INSECURE seed for reproducible noise")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    doc: dict[str, Any] = {"machine": machine(), "delta": DELTA}
    doc["budgets"] = [float(v) for v in args.budgets.split(",")]
    sizes = [int(v) for v in args.sizes.split(",")]
    doc["lever_size"] = 30 if 30 in sizes else sizes[0]
    doc["kept"] = {"bucket_s": args.kept_bucket_s, "release": list(ev.DEFAULT_RELEASE)}
    doc["formation"] = ev.FORMATION
    doc["datasets"] = recorded(args)
    doc["running"] = running(args)
    previous = RESULTS / "eval_cohort.json"
    if args.local:
        doc["bucket_s"] = BUCKET_S
        doc |= local_comparison(args)
    elif previous.is_file():  # part 2 as last measured
        old = json.loads(previous.read_text())
        for key in ("bucket_s", "reps", "profile", "classes", "rows"):
            if key in old:
                doc[key] = old[key]
        doc["local_from"] = old.get("local_from") or _committed(previous)
    doc["seconds"] = time.perf_counter() - t0
    path = write_results("eval_cohort", doc)
    md = markdown(doc)
    path.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
