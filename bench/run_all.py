"""Run every benchmark in ``bench/``, one after the other.

Runs, in this order (each as ``python bench/<script>``; a failure does not stop the rest): the
mechanism, front-end, ledger and publish micro-benchmarks, the event validation, then the
service, end-to-end and fleet benchmarks (``bench_e2e.py`` reads the mechanism results). Any
other ``bench/bench_*.py`` runs last with its defaults. Each writes its ``bench/results/*.json``;
the console output of each goes to ``bench/results/logs/``, and ``bench/results/run_all.json``
records the latest run of each script (arguments, exit status, seconds). The figures, their
targets and what each is compared with are read from the result files into
``docs/benchmarks.md``.

    python bench/run_all.py             # everything, defaults (about an hour on 2 cores)
    python bench/run_all.py --quick     # short runs (about 15 minutes)
    python bench/run_all.py --only service,e2e
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _harness import RESULTS, load_now

BENCH = Path(__file__).resolve().parent
LOGS = RESULTS / "logs"

#: script → (arguments of the full run, arguments of --quick)
KNOWN: dict[str, tuple[list[str], list[str]]] = {
    "bench_mechanisms.py": ([], []),
    "bench_frontend.py": ([], ["--seconds", "4", "--window", "5"]),
    "bench_features_cpu.py": ([], ["--seconds", "90", "--rounds", "3"]),
    "bench_ledger.py": ([], ["--charges", "120", "--rounds", "2"]),
    "bench_publish.py": ([], ["--chunks", "100"]),
    "validate_events.py": ([], ["--no-bounds"]),
    "bench_service.py": ([], ["--quick"]),
    "bench_e2e.py": ([], ["--quick"]),
    "bench_fleet.py": (["--profile"], ["--quick"]),
}


def scripts() -> list[str]:
    """The known benchmarks present, in order, then any other ``bench_*.py``."""
    known = [s for s in KNOWN if (BENCH / s).is_file()]
    extra = sorted(p.name for p in BENCH.glob("bench_*.py") if p.name not in KNOWN)
    return known + extra


def run(script: str, quick: bool) -> dict[str, Any]:
    """Run one benchmark, its output to the console and ``results/logs/<script>.log``."""
    args = KNOWN.get(script, ([], []))[1 if quick else 0]
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{Path(script).stem}.log"
    print(f"\n=== {script} {' '.join(args)} (load {load_now()})", flush=True)
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(BENCH / script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=BENCH.parent,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if " INFO| " not in line:  # liblsl's own log lines stay in the log file
                print(line, end="", flush=True)
        code = proc.wait()
    seconds = time.monotonic() - t0
    print(f"=== {script}: exit {code} after {seconds:.0f} s", flush=True)
    finished = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    row = {"script": script, "args": args, "exit": code, "seconds": round(seconds, 1)}
    return {**row, "finished": finished}


def remember(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge ``runs`` into ``results/run_all.json`` (the latest run of each script); return all."""
    path = RESULTS / "run_all.json"
    known: dict[str, dict[str, Any]] = {}
    if path.is_file():
        known = {r["script"]: r for r in json.loads(path.read_text())}
    known.update({r["script"]: r for r in runs})
    order = {s: i for i, s in enumerate(KNOWN)}
    rows = sorted(known.values(), key=lambda r: (order.get(r["script"], len(order)), r["script"]))
    path.write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs of every benchmark")
    ap.add_argument("--only", help="comma-separated script stems, e.g. service,e2e")
    args = ap.parse_args()
    todo = scripts()
    if args.only:
        wanted = {w.strip().removeprefix("bench_") for w in args.only.split(",")}
        todo = [s for s in todo if Path(s).stem.removeprefix("bench_") in wanted]
    runs = [run(s, args.quick) for s in todo]
    remember(runs)
    print(f"\nwrote {RESULTS / 'run_all.json'}; the figures: docs/benchmarks.md")
    return max((r["exit"] for r in runs), default=0)


if __name__ == "__main__":
    sys.exit(main())
