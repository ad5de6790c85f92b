"""Attention heatmaps and AOI dwell shares of the cohort release: error per cohort size and
budget, and the informed attacker's re-identification (:mod:`gazeguard.offline.eval.attention`).

Writes one JSON result (default ``bench/results/attention/attention.json``)::

    PYTHONPATH=$PWD python3 bench/eval_attention.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gazeguard.offline.eval.attention import BUDGETS, SIZES, evaluate_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, few trials")
    parser.add_argument("--out", type=Path, default=Path("bench/results/attention/attention.json"))
    args = parser.parse_args()
    if args.quick:
        result = evaluate_attention((10, 30), BUDGETS, trials=3, reid_trials=20, candidates=4)
    else:
        result = evaluate_attention(SIZES, BUDGETS)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
