"""Private labels, measured: clean and released accuracy, and re-identification from label
sequences (issue 14, point 2).

For the ``activity`` release profile, on GazeGraph and on the simulated headset:

1. **Clean accuracy** of the label model (standardiser + multinomial logistic regression on the
   profile's features): leave one person out (the shipped model is trained on everyone, so its
   accuracy on a new person is measured by retraining without them), per window and per decision
   — a decision averages the class probabilities of the ``decision_s / step_s`` consecutive
   windows of a block (non-overlapping blocks, incomplete tail dropped) and takes the argmax.
2. **Released accuracy** after randomized response at ε ∈ {0.5, 1, 2, 3, 5} per decision
   (``gazeguard.labels.RandomizedResponse``, exact sampler, OS CSPRNG), mean over repetitions,
   next to the prediction ``p·acc + (1 − p)(1 − acc)/(C − 1)``.
3. **Re-identification from label sequences** (nobody has measured it): the attacker sees the
   released labels of every recording. Each recording's decisions are cut in half; a half becomes
   one sample — its label histogram (C) and its label-transition frequencies (C²). The attacker
   trains on first halves (label: person) and identifies the second halves (1-NN, RBF SVM and a
   100-tree random forest, features standardised; the best classifier is reported, as in
   ``gazeguard eval``). Clean labels (the LOPO model's decisions: what a person's labels look like
   to a model that never saw them) and privatized ones. Chance is 1/people. For reference the
   same attack on the true task labels (a person-free sequence) sits at chance by construction.

Synthetic recordings are 660 s long (8 people × 4 tasks) so that a 300 s cadence gives two
decisions per recording; GazeGraph's are 5 min (540 feature vectors = 270 s), too short for one
300 s decision: that cell is reported as unavailable.

    python bench/eval_labels.py                       # both datasets, ~5 min on 2 cores
    python bench/eval_labels.py --dataset gazegraph --reps 50

Writes ``bench/results/labels/labels.json`` and ``labels.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.ensemble import RandomForestClassifier
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

from gazeguard import __version__
from gazeguard.accounting import RandomizedResponseEvent, compose
from gazeguard.budget import chunks_per_window
from gazeguard.dataset import FeatureTable
from gazeguard.eval.datasets import Synthetic, open_dataset
from gazeguard.eval.runner import select_features
from gazeguard.labels import (
    MAX_EPSILON,
    RandomizedResponse,
    load_model,
    lopo_probabilities,
    released_accuracy,
    survival_probability,
)
from gazeguard.mechanisms.noise import OsRandom, RandomSource, random_source

RESULTS = Path(__file__).resolve().parent / "results" / "labels"
#: User-level budgets per hour of gaze (ε at DELTA), all of it spent on labels.
BUDGETS = (1.0, 10.0, 100.0)
DELTA = 1e-6
DECISIONS_S = {"gazegraph": (10.0, 30.0, 60.0, 120.0), "synthetic": (10.0, 30.0, 60.0, 300.0)}


def epsilon_per_decision(budget: float, decision_s: float, classes: int) -> tuple[float, int]:
    """The largest ε per decision whose ``D = ⌈3600/decision_s⌉ + 1`` randomized-response
    releases (what one hour of gaze can hold, as the ledger counts them) compose to at most
    ``budget`` at ``DELTA`` (the PLD accountant, bisection to 1e-4 relative); and ``D``."""
    per_hour = chunks_per_window(3600.0, decision_s)

    def cost(eps: float) -> float:
        return compose({RandomizedResponseEvent(eps, classes): per_hour}, DELTA).epsilon

    lo, hi = budget / per_hour, min(budget, MAX_EPSILON)  # pure sequential ≤ … ≤ one release
    if cost(hi) <= budget:
        return hi, per_hour
    while hi - lo > 1e-4 * lo:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid)
    return lo, per_hour


IntArray = npt.NDArray[np.intp]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- decisions
def decisions(
    table: FeatureTable, probs: npt.NDArray[np.float64], steps: int
) -> dict[str, tuple[IntArray, str, str]]:
    """Per recording: clean decision indices (argmax of the mean probability over each block of
    ``steps`` consecutive windows), its person and task."""
    out: dict[str, tuple[IntArray, str, str]] = {}
    for rec, rows in table.recordings():
        n = rows.size // steps
        if n == 0:
            continue
        blocks = probs[rows[: n * steps]].reshape(n, steps, -1).mean(axis=1)
        out[rec] = (
            np.argmax(blocks, axis=1).astype(np.intp),
            str(table.person[rows[0]]),
            str(table.task[rows[0]]),
        )
    return out


# ----------------------------------------------------------------------------- the attack
def sequence_features(labels: IntArray, classes: int) -> npt.NDArray[np.float64]:
    """Label histogram (C) and transition frequencies (C²) of one half-sequence."""
    hist = np.bincount(labels, minlength=classes) / max(labels.size, 1)
    trans = np.zeros((classes, classes))
    if labels.size > 1:
        np.add.at(trans, (labels[:-1], labels[1:]), 1.0)
        trans /= labels.size - 1
    return np.concatenate([hist, trans.ravel()])


ATTACKERS = ("1nn", "svm", "rf")


def attack(
    seqs: dict[str, tuple[IntArray, str, str]], classes: int, seed: int
) -> dict[str, float] | None:
    """Re-identification accuracy per attacker: train on first halves, test on second halves."""
    Xtr, ytr, Xte, yte = [], [], [], []
    for labels, person, _ in seqs.values():
        if labels.size < 2:
            return None
        cut = labels.size // 2
        Xtr.append(sequence_features(labels[:cut], classes))
        Xte.append(sequence_features(labels[cut:], classes))
        ytr.append(person)
        yte.append(person)
    Xa, Xb = np.array(Xtr), np.array(Xte)
    out: dict[str, float] = {}
    for name in ATTACKERS:
        if name == "1nn":
            clf: Any = make_pipeline(StandardScaler(), KNeighborsClassifier(n_neighbors=1))
        elif name == "svm":
            clf = make_pipeline(StandardScaler(), SVC(C=1.0, gamma="scale"))
        else:
            clf = RandomForestClassifier(n_estimators=100, random_state=seed, n_jobs=1)
        clf.fit(Xa, ytr)
        out[name] = float(np.mean(clf.predict(Xb) == np.array(yte)))
    return out


def privatize(
    seqs: dict[str, tuple[IntArray, str, str]], rr: RandomizedResponse, source: RandomSource
) -> dict[str, tuple[IntArray, str, str]]:
    """The same sequences after randomized response on every decision."""
    return {
        rec: (np.array([rr.release(int(v), source) for v in labels], np.intp), p, t)
        for rec, (labels, p, t) in seqs.items()
    }


def _mean_best(runs: list[dict[str, float]]) -> dict[str, Any]:
    means = {a: float(np.mean([r[a] for r in runs])) for a in ATTACKERS}
    best = max(means, key=lambda a: means[a])
    return {
        "best": best,
        "accuracy": round(means[best], 4),
        "sd": round(float(np.std([r[best] for r in runs])), 4),
        "per_attacker": {a: round(v, 4) for a, v in means.items()},
        "reps": len(runs),
    }


# ----------------------------------------------------------------------------- one dataset
def evaluate(
    name: str,
    table: FeatureTable,
    features: list[str],
    cadences: tuple[float, ...],
    reps: int,
    attack_reps: int,
    seed: int | None,
    every: int,
) -> dict[str, Any]:
    classes = sorted(set(table.task.tolist()))
    C = len(classes)
    people = sorted(set(table.person.tolist()))
    step_s = float(np.median(np.diff(table.t[: min(50, table.n_rows)])))
    source: RandomSource = OsRandom() if seed is None else random_source(seed)
    t0 = time.perf_counter()
    usable = [f for f in features if f in table.feature_names]
    cols, _ = select_features(table)
    varying = {table.feature_names[int(c)] for c in cols}
    usable = [f for f in usable if f in varying]
    probs = lopo_probabilities(table, usable, every=every)
    truth = np.array([classes.index(t) for t in table.task])
    window_acc = float(np.mean(np.argmax(probs, axis=1) == truth))
    log(
        f"{name}: LOPO per-window accuracy {window_acc:.3f} with {len(usable)} features "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    res: dict[str, Any] = {
        "dataset": name,
        "people": len(people),
        "classes": classes,
        "features": usable,
        "step_s": step_s,
        "delta": DELTA,
        "chance": {"task": 1 / C, "reid": 1 / len(people)},
        "clean_window_accuracy": round(window_acc, 4),
        "cadences": [],
    }
    att_seed = 0 if seed is None else seed
    for decision_s in cadences:
        steps = round(decision_s / step_s)
        seqs = decisions(table, probs, steps)
        row: dict[str, Any] = {
            "decision_s": decision_s,
            "windows_per_decision": steps,
            "decisions_per_hour": round(3600.0 / decision_s, 2),
        }
        if not seqs or min(v[0].size for v in seqs.values()) < 2:
            row["unavailable"] = (
                f"recordings hold fewer than two decisions of {steps} feature vectors "
                f"({decision_s:g} s)"
            )
            res["cadences"].append(row)
            log(f"{name}: {decision_s:g} s decisions: unavailable")
            continue
        n_dec = sum(v[0].size for v in seqs.values())
        correct = np.concatenate(
            [labels == classes.index(task) for labels, _, task in seqs.values()]
        )
        clean_acc = float(np.mean(correct))
        clean_att = attack(seqs, C, att_seed)
        row.update(
            decisions=n_dec,
            decisions_per_recording=round(n_dec / len(seqs), 2),
            clean_decision_accuracy=round(clean_acc, 4),
            reid_clean_labels=None if clean_att is None else _mean_best([clean_att]),
            released=[],
        )
        for budget in BUDGETS:
            eps, per_hour = epsilon_per_decision(budget, decision_s, C)
            rr = RandomizedResponse(C, eps)
            accs, runs = [], []
            for r in range(max(reps, attack_reps)):
                priv = privatize(seqs, rr, source)
                if r < reps:
                    hits = np.concatenate(
                        [labels == classes.index(task) for labels, _, task in priv.values()]
                    )
                    accs.append(float(np.mean(hits)))
                if r < attack_reps:
                    a = attack(priv, C, att_seed + r)
                    if a is not None:
                        runs.append(a)
            p = survival_probability(eps, C)
            acc = float(np.mean(accs))
            row["released"].append(
                {
                    "budget_per_hour": budget,
                    "decisions_in_an_hour": per_hour,
                    "epsilon_per_decision": round(eps, 5),
                    "hour_epsilon_at_delta": round(
                        compose({RandomizedResponseEvent(eps, C): per_hour}, DELTA).epsilon, 4
                    ),
                    "survival": round(p, 4),
                    "accuracy": round(acc, 4),
                    "accuracy_sd": round(float(np.std(accs)), 4),
                    "predicted": round(released_accuracy(clean_acc, p, C), 4),
                    "kept_fraction_of_clean": round(acc / clean_acc, 4) if clean_acc else None,
                    "reid": _mean_best(runs) if runs else None,
                }
            )
        res["cadences"].append(row)
        log(
            f"{name}: {decision_s:g} s decisions: clean {clean_acc:.3f}, re-id on clean labels "
            f"{(row['reid_clean_labels'] or {}).get('accuracy')}; "
            + ", ".join(
                f"B{d['budget_per_hour']:g}: ε {d['epsilon_per_decision']:.3g} → "
                f"{d['accuracy']:.3f} (re-id {(d['reid'] or {}).get('accuracy')})"
                for d in row["released"]
            )
            + f" [{time.perf_counter() - t0:.0f} s]"
        )
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    return res


# ----------------------------------------------------------------------------- report
def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["# Private labels: accuracy kept and re-identification from label sequences", ""]
    for res in results:
        ch = res["chance"]
        lines += [
            f"## {res['dataset']} ({res['people']} people, {len(res['classes'])} classes: "
            f"{', '.join(res['classes'])})",
            "",
            f"Label model: standardiser + logistic regression on {len(res['features'])} features, "
            f"leave one person out; accuracy per window **{res['clean_window_accuracy']:.3f}**; "
            f"chance task {ch['task']:.3f}, re-identification {ch['reid']:.3f}. The whole "
            f"user-level budget B per hour (ε at δ {res['delta']:g}) goes to labels.",
            "",
            "| decision | per hour | clean acc | re-id clean labels | B | ε/decision | p | "
            "released acc (pred.) | % of clean | re-id released |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in res["cadences"]:
            if "unavailable" in row:
                lines.append(
                    f"| {row['decision_s']:g} s | {row['decisions_per_hour']:g} | "
                    f"n/a: {row['unavailable']} | | | | | | | |"
                )
                continue
            rc = row["reid_clean_labels"]
            for i, d in enumerate(row["released"]):
                head = (
                    f"| {row['decision_s']:g} s | {row['decisions_per_hour']:g} | "
                    f"{row['clean_decision_accuracy']:.3f} | {rc['accuracy']:.3f} ({rc['best']}) "
                    if i == 0
                    else "| | | | "
                )
                kept = d["kept_fraction_of_clean"]
                reid = d["reid"]
                lines.append(
                    head + f"| {d['budget_per_hour']:g} | {d['epsilon_per_decision']:.3g} | "
                    f"{d['survival']:.3f} | {d['accuracy']:.3f} ({d['predicted']:.3f}) | "
                    f"{100 * kept:.0f} % | "
                    + (f"{reid['accuracy']:.3f} ({reid['best']})" if reid else "—")
                    + " |"
                )
        lines += [
            "",
            "ε per decision: the largest whose D = ⌈3600/decision⌉ + 1 randomized-response "
            "releases compose (PLD) to ≤ B at δ. Released accuracy: measured (predicted "
            "p·acc + (1−p)(1−acc)/(C−1)). Re-identification: the best of 1-NN/SVM/RF on label "
            "histograms + transitions, first half → second half of each recording's decisions.",
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dataset", action="append", help="gazegraph and/or synthetic (default both)")
    ap.add_argument("--model", default="activity", help="label model whose features are used")
    ap.add_argument("--reps", type=int, default=200, help="randomized-response repetitions (200)")
    ap.add_argument("--attack-reps", type=int, default=20, help="repetitions of the attack (20)")
    ap.add_argument("--every", type=int, default=2, help="train on every n-th window (2)")
    ap.add_argument("--synthetic-duration", type=float, default=660.0)
    ap.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "gazeguard" / "eval")
    ap.add_argument("--insecure-seed", type=int, help="INSECURE reproducible randomized response")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    model = load_model(args.model)
    results = []
    for spec in args.dataset or ["gazegraph", "synthetic"]:
        ds = (
            Synthetic(8, None, args.synthetic_duration, 60.0)
            if spec == "synthetic"
            else open_dataset(spec)
        )
        table = ds.features(30.0, 0.5, args.cache_dir, log)
        results.append(
            evaluate(
                ds.name,
                table,
                list(model.features),
                DECISIONS_S.get(spec, DECISIONS_S["synthetic"]),
                args.reps,
                args.attack_reps,
                args.insecure_seed,
                args.every,
            )
        )
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": f"{model.name} v{model.version}",
        "budgets_per_hour": list(BUDGETS),
        "delta": DELTA,
        "gazeguard_version": __version__,
        "noise": "os-csprng" if args.insecure_seed is None else "INSECURE-seeded",
        "reps": args.reps,
        "attack_reps": args.attack_reps,
        "command": "python bench/eval_labels.py " + " ".join(argv or sys.argv[1:]),
        "results": results,
    }
    (args.out / "labels.json").write_text(json.dumps(payload, indent=1) + "\n")
    md = markdown(results)
    (args.out / "labels.md").write_text(md + "\n")
    print(md)
    print(f"wrote {args.out / 'labels.json'} and {args.out / 'labels.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
