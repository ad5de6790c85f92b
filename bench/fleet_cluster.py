"""JetStream fleet on a 3-node NATS cluster on loopback: what a killed worker and a killed
server cost, at a larger scale than ``tests/runtime/test_jetstream_cluster.py``.

Same scenario as the test (``tests/_nats_cluster.py``, :func:`cluster_scenario`): three
``nats-server`` processes clustered on loopback (JetStream, R3 stream and consumers), W
``gazeguard run --fleet --source jetstream`` workers sharing one SQLite ledger, a local
Mosquitto for the privatized output, and S simulated headsets in this process
(``JetStreamSender``, 12-sample blocks of ``simulate_gaze``, faster than real time) sending G
seconds of gaze each in four phases:

1. all up; every session has two chunks charged;
2. SIGKILL the worker pinned on session s0's partition, phase 2 sent meanwhile. *Worker
   failover*: kill → every session of the partitions it held has a chunk charged again
   (``fleet.nats.pin_timeout_s`` + the takeover replay);
3. SIGKILL the server leading the stream and s0's partition's consumer (the stream's leadership
   is moved there first), phase 3 sent meanwhile. *Node failover*: kill → every session has a
   chunk charged of gaze sent after the kill (elections + the replay the forgotten pin costs);
4. restart the server and the worker; once the server is current again, phase 4 is sent.

Then every block acknowledged, workers stopped, and the ledger and worker logs audited: samples
sent and read (the last owner's pipeline of each session), lost, chunks charged twice (ledger
rows; and charges the ledger refused as a second charge of an index), whether the feature window
survived (every session's chunk indices 0…n−1 and consecutive chunks one feature step apart).
Timings are wall-clock on this machine: pessimistic on a loaded one (``machine.load_avg``).

    python bench/fleet_cluster.py [--workers 3] [--sessions 30] [--partitions 6] [--gaze-s 30]

prints the report and writes ``bench/results/fleet_cluster.json``; worker and server logs go to
``bench/results/logs/fleet_cluster/`` (not versioned).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _harness import RESULTS, load_now, machine, mosquitto, write_results
from _nats_cluster import cluster_scenario

LOGS = RESULTS / "logs" / "fleet_cluster"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    ap.add_argument("--sessions", type=int, default=30, help="simulated headsets (default 30)")
    ap.add_argument("--partitions", type=int, default=6, help="fleet.nats.partitions (default 6)")
    ap.add_argument(
        "--gaze-s", type=float, default=30.0, help="gaze per session, s (default 30; ≥ 24)"
    )
    ap.add_argument(
        "--pace-s",
        type=float,
        default=0.01,
        help="pause between a device's blocks, s (default 0.01: 100 ms of gaze per 10 ms + ack)",
    )
    ap.add_argument("--name", default="fleet_cluster", help="results file bench/results/NAME.json")
    args = ap.parse_args(argv)
    if args.workers < 2 or args.sessions < 1 or args.gaze_s < 24:
        ap.error(
            "needs --workers ≥ 2, --sessions ≥ 1 and --gaze-s ≥ 24 (a quarter holds two chunks)"
        )

    def say(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    say(f"load {load_now()}; {args.workers} workers, {args.sessions} sessions, "
        f"{args.partitions} partitions, {args.gaze_s:g} s of gaze each")  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="gg-cluster-"))
    failed = False
    try:
        with mosquitto(tmp) as broker:
            outcome = cluster_scenario(
                tmp,
                broker.address,
                workers=args.workers,
                sessions=args.sessions,
                partitions=args.partitions,
                gaze_s=args.gaze_s,
                pace_s=args.pace_s,
                say=say,
            )
    except AssertionError as exc:  # the scenario could not go on: its logs say why
        failed = True
        say(f"scenario failed: {str(exc)[:2000]}")
        raise
    finally:
        LOGS.mkdir(parents=True, exist_ok=True)
        for log in [*tmp.glob("worker-*.log"), *tmp.glob("n*/nats-server.log")]:
            name = log.name if log.name.startswith("worker") else f"{log.parent.name}.log"
            shutil.copy(log, LOGS / name)
        shutil.rmtree(tmp, ignore_errors=True)
        if failed:
            say(f"logs in {LOGS}")
    report = outcome.report
    headline = {
        "samples_sent": report["samples_sent"],
        "samples_read": report["samples_read"],
        "samples_lost": report["samples_lost"],
        "chunks_charged_twice": report["chunks_charged_twice"],
        "double_charges_refused": report["double_charges_refused"],
        "worker_failover_s": report["worker_failover_s"],
        "node_failover_s": report["node_failover_s"],
        "window_survived": report["window_survived"],
    }
    print(json.dumps(headline, indent=1))
    doc = {
        "machine": machine(),
        "parameters": vars(args),
        "headline": headline,
        "report": report,
        "note": (
            "failover times are wall-clock on this machine (see machine.load_avg): worker = "
            "SIGKILL to every session of its partitions charged again (pin_timeout_s 5 s + "
            "replay); node = SIGKILL of the stream and consumer leader's server to every session "
            "charged gaze sent after it (elections + the replay the forgotten pin costs)"
        ),
    }
    path = write_results(args.name, doc)
    say(f"wrote {path}; logs in {LOGS}")
    ok = (
        report["samples_lost"] == 0
        and report["chunks_charged_twice"] == 0
        and report["double_charges_refused"] == 0
        and report["window_survived"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
