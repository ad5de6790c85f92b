"""Overlay the task / re-identification trade-off of several ``gazeguard eval`` runs.

Each run is ``LABEL=results.json``; every dataset present in the first run gets one PNG with
every (mechanism, ε) row of every run as a point and each run's frontier (the best task
accuracy at or below each re-identification level). Used to compare the product's public
sensitivities with the paper's data-dependent ones (``gazeguard eval --sensitivity paper``)::

    python bench/plot_tradeoff.py public=bench/results/eval/results.json \\
        paper=bench/results/eval/paper-sensitivity/results.json --out bench/results/eval

writes ``bench/results/eval/<dataset>-tradeoff-public-vs-paper.png`` and prints, per run, the
best task accuracy with re-identification at chance.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gazeguard.offline.eval.report import read_json, tradeoff_figure, tradeoff_points


def main() -> int:
    """Parse ``LABEL=PATH`` runs, draw one trade-off PNG per dataset, print the frontiers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="LABEL=results.json")
    parser.add_argument("--out", type=Path, default=Path("bench/results/eval"))
    args = parser.parse_args()
    runs = []
    for item in args.runs:
        label, _, path = item.partition("=")
        if not path:
            parser.error(f"{item!r}: expected LABEL=results.json")
        runs.append((label, {r["dataset"]: r for r in read_json(Path(path))}))
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "-vs-".join(label for label, _ in runs)
    for dataset in runs[0][1]:
        present = [(label, by[dataset]) for label, by in runs if dataset in by]
        path = tradeoff_figure(present, args.out / f"{dataset}-tradeoff-{suffix}.png")
        print(f"{dataset}: wrote {path}")
        for label, result in present:
            meta = result["meta"]
            limit = meta["chance_reid"] + meta["tolerance"]
            at_chance = [p for p in tradeoff_points(result) if p[2] <= limit]
            best = max(at_chance, key=lambda p: p[3], default=None)
            what = "none"
            if best is not None:
                what = f"{best[0]} ε={best[1]:g}: task {best[3]:.3f}, re-id {best[2]:.3f}"
            print(f"  {label}: best task with re-identification ≤ {limit:.3f}: {what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
