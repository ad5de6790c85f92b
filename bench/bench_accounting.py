"""What a user-level budget buys, and what the accountant costs per charge.

1. **Noise per budget.** The noise multiplier (noise scale / sensitivity of one feature's chunk)
   that keeps one hour of gaze (225 chunks of 16 s) within user-level (ε = 10, δ = 1e-6) when
   F ∈ {48, 12, 5, 1} features are released per chunk, under pure sequential composition of
   Laplace noise (what the ledger knew before), the PLD accountant with Laplace noise, and
   Gaussian noise (exact zCDP closed form). Also computed in the same run with Google's
   ``dp-accounting`` directly (``PLDAccountant`` over ``LaplaceDpEvent`` / ``GaussianDpEvent``,
   what a user would otherwise pick), as ratios to ours.
2. **Accounting step.** Latency of one ``Ledger.charge`` (SQLite, synchronous=FULL) over one
   hour of 48-feature chunks with the window cap on, for the accountant-backed ledger (PLD, the
   default) against the same ledger on pure sequential composition (integer sums only), p50/p99.

Run: ``python bench/bench_accounting.py [--chunks 225]``; prints tables and writes
``bench/results/accounting.json``.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import latency_stats, machine, write_results
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from gazeguard.ledger import Ledger
from gazeguard.privacy.accounting import LaplaceEvent, PrivacyLoss, calibrate

BUDGET, DELTA, CHUNKS = 10.0, 1e-6, 225
FEATURES = (48, 12, 5, 1)


def dp_accounting_ratio(family: str, releases: int) -> float:
    """Smallest noise multiplier (bisection to 0.1 %) that dp-accounting's PLD accountant says
    keeps ``releases`` releases within (BUDGET, DELTA)."""

    def epsilon(r: float) -> float:
        acc = pld_privacy_accountant.PLDAccountant()
        event: dp_event.DpEvent = (
            dp_event.LaplaceDpEvent(r) if family == "laplace" else dp_event.GaussianDpEvent(r)
        )
        acc.compose(event, releases)
        return float(acc.get_epsilon(DELTA))

    lo, hi = 0.1, 1e4
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if epsilon(mid) <= BUDGET else (mid, hi)
    return hi


def noise_table() -> list[dict[str, Any]]:
    rows = []
    limit = PrivacyLoss.approx(BUDGET, DELTA)
    for f in FEATURES:
        n = f * CHUNKS
        t0 = time.perf_counter()
        row = {
            "features": f,
            "releases_per_hour": n,
            "sequential_laplace": calibrate("sequential", n, limit),
            "pld_laplace": calibrate("laplace", n, limit),
            "gaussian": calibrate("gaussian", n, limit),
        }
        row["calibrate_s"] = time.perf_counter() - t0
        row["dp_accounting_laplace"] = dp_accounting_ratio("laplace", n)
        row["dp_accounting_gaussian"] = dp_accounting_ratio("gaussian", n)
        rows.append(row)
    return rows


def charge_latency(composition: str, chunks: int) -> dict[str, float]:
    ratio = calibrate("laplace", 48 * CHUNKS, PrivacyLoss.approx(BUDGET, DELTA))
    cost = {f"f{i}": LaplaceEvent(ratio) for i in range(48)}
    cap = BUDGET if composition == "pld" else 48 * CHUNKS / ratio * 1.001  # + micro-ε rounding
    lat = []
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp) / "l.sqlite", window_cap=cap, composition=composition)
        with ledger:
            for i in range(chunks):
                t0 = time.perf_counter()
                ledger.charge(
                    "s", i, cost, "t", b"x" * 17_000,
                    gaze=(1.7e9 + 16 * i, 1.7e9 + 16 * i + 15.5),
                )  # fmt: skip
                lat.append(time.perf_counter() - t0)
    return latency_stats(lat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=CHUNKS, help="charges per latency run")
    args = parser.parse_args()
    rows = noise_table()
    print(f"noise multiplier for user-level ε {BUDGET:g} per hour at δ {DELTA:g} ({CHUNKS} chunks)")
    print(f"{'F':>3} {'sequential':>11} {'PLD Laplace':>12} {'Gaussian':>9}  "
          f"{'ours/dp-acc L':>13} {'ours/dp-acc G':>13}")  # fmt: skip
    for r in rows:
        print(
            f"{r['features']:>3} {r['sequential_laplace']:>11.1f} {r['pld_laplace']:>12.2f} "
            f"{r['gaussian']:>9.2f}  {r['pld_laplace'] / r['dp_accounting_laplace']:>13.3f} "
            f"{r['gaussian'] / r['dp_accounting_gaussian']:>13.3f}"
        )
    latency = {c: charge_latency(c, args.chunks) for c in ("sequential", "pld")}
    print(f"\nLedger.charge over {args.chunks} chunks of 48 features, window cap on (ms)")
    for c, s in latency.items():
        print(f"  {c:<10} p50 {s['p50_ms']:.2f}  p99 {s['p99_ms']:.2f}  max {s['max_ms']:.2f}")
    ratio = latency["pld"]["p99_ms"] / latency["sequential"]["p99_ms"]
    print(f"  p99 ratio pld/sequential: {ratio:.2f}")
    path = write_results(
        "accounting",
        {"machine": machine(), "noise": rows, "charge_latency": latency, "p99_ratio": ratio},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
