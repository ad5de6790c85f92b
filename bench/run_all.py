"""Run every benchmark in ``bench/`` and write ``bench/results/SUMMARY.md``.

Runs, in this order (each as ``python bench/<script>``, one after the other, a failure does not
stop the rest): the mechanism, front-end, ledger and publish micro-benchmarks, the event
validation, then the service, end-to-end and fleet benchmarks (``bench_e2e.py`` reads the
mechanism results). Any other ``bench/bench_*.py`` runs last with its defaults, except
``bench_compare.py`` (it compares two commits). Each writes its
``bench/results/*.json``; the console output of each goes to ``bench/results/logs/``. Then the
headline numbers of every result file — with targets and pass/fail where the project set one —
go into a Markdown table in ``bench/results/SUMMARY.md``, with the machine they were measured
on.

    python bench/run_all.py             # everything, defaults (about an hour on 2 cores)
    python bench/run_all.py --quick     # short runs (about 15 minutes)
    python bench/run_all.py --only service,e2e
    python bench/run_all.py --summary-only   # rebuild SUMMARY.md from the JSON files
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import RESULTS, load_now, machine

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

#: not benchmarks of this checkout alone: ``bench_compare.py`` measures two commits (~30 min)
NOT_RUN = frozenset({"bench_compare.py"})

Row = tuple[str, str, str, str, str]  # benchmark, metric, value, target, result


def scripts() -> list[str]:
    """The known benchmarks present, in order, then any other ``bench_*.py``."""
    known = [s for s in KNOWN if (BENCH / s).is_file()]
    extra = sorted(
        p.name for p in BENCH.glob("bench_*.py") if p.name not in KNOWN and p.name not in NOT_RUN
    )
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


# ------------------------------------------------------------------------------ summary rows
def _load(stem: str) -> dict[str, Any] | None:
    path = RESULTS / f"{stem}.json"
    if not path.is_file():
        return None
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return doc


def _verdict(met: bool | None) -> str:
    return "—" if met is None else ("pass" if met else "**FAIL**")


def _ms(v: float) -> str:
    return f"{v:.2f} ms"


def rows_service(d: dict[str, Any]) -> list[Row]:
    b = "service (issue 4)"
    lat = d["latency_median"]["completion_to_puback"]
    t = d["targets"]
    fp = d["footprint_median"]
    return [
        (b, "chunk completion → PUBACK, p50", _ms(lat["p50_ms"]), "", "—"),
        (
            b,
            "chunk completion → PUBACK, p99",
            _ms(lat["p99_ms"]),
            "< 5 ms",
            _verdict(t["p99_ms"]["met"]),
        ),
        (b, "chunk completion → PUBACK, max", _ms(lat["max_ms"]), "", "—"),
        (
            b,
            "CPU, one 120 Hz session, defaults",
            f"{fp['cpu_pct']:.2f} % of a core",
            "< 2 %",
            _verdict(t["cpu_pct"]["met"]),
        ),
        (
            b,
            "RSS (max), same run",
            f"{fp['rss_max_mb']:.0f} MB",
            "< 120 MB",
            _verdict(t["rss_max_mb"]["met"]),
        ),
    ]


def rows_e2e(d: dict[str, Any]) -> list[Row]:
    b = "end to end (issue 7)"
    out: list[Row] = []
    lat = d["latency_median"]
    for loop in ("asyncio", "uvloop"):
        r = lat[loop]["completion_to_receipt"]
        out.append(
            (
                b,
                f"completion → subscriber, {loop}: p50 / p99 / max",
                f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} / {r['max_ms']:.2f} ms",
                "",
                "—",
            )
        )
    r = lat["naive"]["completion_to_receipt"]
    out.append(
        (
            b,
            "naive sidecar (no ledger), same: p50 / p99 / max",
            f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} / {r['max_ms']:.2f} ms",
            "",
            "—",
        )
    )
    for f in d["footprint_median"]:
        g, n = f["gazeguard"], f["naive"]
        out.append(
            (
                b,
                f"footprint {f['rate_hz']:.0f} Hz: CPU / RSS (naive: CPU ×, RSS)",
                f"{g['cpu_pct']:.2f} % / {g['rss_max_mb']:.0f} MB "
                f"(naive {f['cpu_naive_over_gazeguard']:.2f}×, {n['rss_max_mb']:.0f} MB)",
                "",
                "—",
            )
        )
    ratios = d["ratios"]
    out.append(
        (
            b,
            "publish: paho loop / outbox publisher, p50 · p99",
            f"{ratios['publish_paho_loop_over_outbox_publisher_p50']:.2f}× · "
            f"{ratios['publish_paho_loop_over_outbox_publisher_p99']:.2f}×",
            "",
            "—",
        )
    )
    mech = d.get("mechanism")
    if mech:
        out.append(
            (
                b,
                "mechanism: numpy.fft / planned FFTW (52×32 DCFPA)",
                f"{mech['numpy_over_gazeguard']:.2f}×",
                "",
                "—",
            )
        )
    return out


def rows_fleet(d: dict[str, Any]) -> list[Row]:
    b = "fleet (issue 7)"
    best = d["targets"]["max_sustained_sessions"]
    out: list[Row] = [
        (
            b,
            f"{s['workers']} worker(s), {s['sessions']} sessions: p99 (run median) / worker CPU",
            f"{s['p99_ms']:.1f} ms / {s['worker_cpu_pct_total']:.0f} %",
            "p99 < 50 ms, no loss",
            _verdict(s["sustained"]),
        )
        for s in d["summary"]
    ]
    for w, n in sorted(best.items()):
        out.append((b, f"max sustained sessions, {w} worker(s)", str(n), "", "—"))
    one = d["targets"].get("sessions_one_process")
    if one is not None:
        out.append(
            (b, "max sustained sessions, one worker process", str(one["value"]), ">= 200",
             _verdict(one["met"]))
        )  # fmt: skip
    t = d["targets"]["sessions_per_core"]
    out.append(
        (
            b,
            "CPU efficiency: sessions per busy worker core (largest sustained 1-worker level)",
            f"{t['value']:.0f}",
            ">= 200",
            _verdict(t["met"]),
        )
    )
    return out


def rows_mechanisms(d: dict[str, Any]) -> list[Row]:
    b = "mechanisms"
    t = d["targets"]
    out: list[Row] = [
        (
            b,
            "DCFPA dft release, 52×64",
            f"{t['dcfpa_dft_52x64_us']:.0f} µs",
            "≤ 150 µs",
            _verdict(t.get("at_most_150_us")),
        )
    ]
    for key, met in t.items():
        if isinstance(met, bool) and key != "at_most_150_us":
            out.append((b, key.replace("_", " "), "", "", _verdict(met)))
    return out


def rows_frontend(d: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    for s in d["summary"]:
        target = "" if s.get("target_pct") is None else f"< {s['target_pct']:g} %"
        out.append(
            (
                "front end (ingest+features)",
                f"{s['outlet']} outlet {s['rate_hz']:.0f} Hz: CPU (naive pull_sample ×)",
                f"{s['gazeguard_pct']:.2f} % ({s['naive_over_gazeguard']:.2f}×)",
                target,
                _verdict(s.get("target_met")),
            )
        )
    return out


def rows_features_cpu(d: dict[str, Any]) -> list[Row]:
    return [
        (
            "events + features CPU",
            f"{r['rate_hz']:.0f} Hz {r['task']}: ms CPU per session-second, after (before ×)",
            f"{r['ms_per_session_s']['after']:.3f} ms ({r['ratio_before_over_after']:.2f}×), "
            f"{r['sessions_per_core']['after']:.0f} sessions/core",
            "",
            "—",
        )
        for r in d["rows"]
    ]


def rows_ledger(d: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    for name, r in d["results"].items():
        out.append(
            (
                "ledger charge",
                f"{name}: p50 / p99",
                f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} ms",
                "",
                "—",
            )
        )
    return out


def rows_publish(d: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    for name, r in d["rows"].items():
        out.append(
            ("publish", f"{name}: p50 / p99", f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} ms", "", "—")
        )
    return out


def rows_events(d: dict[str, Any]) -> list[Row]:
    return [
        (
            "event validation",
            f"κ vs coder {k['coder']}, {k['detector']}, {k['event']}",
            f"{k['kappa']:.3f}",
            "",
            "—",
        )
        for k in d["kappa"]
        if k.get("category") == "all"
    ]


EXTRACTORS: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "service": rows_service,
    "e2e": rows_e2e,
    "fleet": rows_fleet,
    "mechanisms": rows_mechanisms,
    "frontend": rows_frontend,
    "features_cpu": rows_features_cpu,
    "ledger": rows_ledger,
    "publish": rows_publish,
    "event_validation": rows_events,
}


def summary(runs: list[dict[str, Any]], quick: bool) -> str:
    """SUMMARY.md: the machine, then one row per headline number."""
    m = machine()
    lines = [
        "# Benchmark summary",
        "",
        f"Written by `python bench/run_all.py{' --quick' if quick else ''}` on "
        f"{datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')} from the JSON "
        "files in this directory (the latest run of each script); medians over repeated runs "
        "where the benchmark repeats. The machine is shared with other work: note the load "
        "averages.",
        "",
        f"**Machine:** {m['nproc']} CPUs ({m['cpu_model']}), Python {m['python']}, "
        f"{m['platform']}; load average now {' '.join(str(x) for x in m['load_avg'])} "
        "(1, 5, 15 min).  ",
        "**Versions:** " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        "",
    ]
    if runs:
        lines += ["Latest run of each script:", ""]
        lines += ["| script | exit | seconds | finished |", "|---|---|---|---|"]
        lines += [
            f"| {r['script']} {' '.join(r['args'])} | {r['exit']} | {r['seconds']:.0f} | "
            f"{r.get('finished', '')} |"
            for r in runs
        ]
        lines.append("")
    lines += ["| benchmark | metric | value | target | result |", "|---|---|---|---|---|"]
    for stem, extract in EXTRACTORS.items():
        doc = _load(stem)
        if doc is None:
            lines.append(f"| {stem} | (no `results/{stem}.json`) | | | |")
            continue
        try:
            rows = extract(doc)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            lines.append(f"| {stem} | (unexpected `results/{stem}.json`: {exc!r}) | | | |")
            continue
        loads = doc.get("load_before"), doc.get("load_after")
        if loads[0]:
            rows.append(
                (
                    rows[0][0] if rows else stem,
                    "load average before → after",
                    f"{loads[0]} → {loads[1]}",
                    "",
                    "—",
                )
            )
        lines += [f"| {' | '.join(r)} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs of every benchmark")
    ap.add_argument("--only", help="comma-separated script stems, e.g. service,e2e")
    ap.add_argument("--summary-only", action="store_true", help="only rebuild SUMMARY.md")
    args = ap.parse_args()
    todo = scripts()
    if args.only:
        wanted = {w.strip().removeprefix("bench_") for w in args.only.split(",")}
        todo = [s for s in todo if Path(s).stem.removeprefix("bench_") in wanted]
    runs = [] if args.summary_only else [run(s, args.quick) for s in todo]
    path = RESULTS / "SUMMARY.md"
    path.write_text(summary(remember(runs), args.quick))
    print(f"\nwrote {path}")
    return max((r["exit"] for r in runs), default=0)


if __name__ == "__main__":
    sys.exit(main())
