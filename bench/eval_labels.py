"""Private labels, measured: clean and released accuracy, and re-identification from label
sequences (issue 14, point 2).

For the ``activity`` release profile, on GazeGraph and on the simulated headset:

1. **Clean accuracy** of the label model (standardiser + multinomial logistic regression on the
   profile's features): leave one person out (the shipped model is trained on everyone, so its
   accuracy on a new person is measured by retraining without them), per window and per decision
   — a decision averages the class probabilities of the ``decision_s / step_s`` consecutive
   windows of a block (non-overlapping blocks, incomplete tail dropped) and takes the argmax.
2. **Released accuracy** after randomized response at ε ∈ {0.5, 1, 2, 3, 5} per decision
   (``gazeguard.signal.labels.RandomizedResponse``, exact sampler, OS CSPRNG), mean over
   repetitions,
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
from pathlib import Path
from typing import Any

from gazeguard import __version__
from gazeguard.offline.eval.datasets import Synthetic, open_dataset
from gazeguard.offline.eval.labels import BUDGETS, DELTA, evaluate
from gazeguard.signal.labels import load_model

RESULTS = Path(__file__).resolve().parent / "results" / "labels"
DECISIONS_S = {"gazegraph": (10.0, 30.0, 60.0, 120.0), "synthetic": (10.0, 30.0, 60.0, 300.0)}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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
                reps=args.reps,
                attack_reps=args.attack_reps,
                seed=args.insecure_seed,
                every=args.every,
                progress=log,
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
