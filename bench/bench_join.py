"""How long a fleet worker joining live workers waits before it pulls (balance settling).

A real ``nats-server`` and Mosquitto, two ``gazeguard run --fleet --source jetstream`` workers
(default heartbeat, 1 s), then a third started ``--rounds`` times (stopped each time). Reported
per round, from the joining worker's log: *settle*, from its "pulling N partitions" line (the
balance task starts) to its first balance report (logged when it starts pulling), and *start*,
from spawning the process to that report (Python and gazeguard start-up included).

    PYTHONPATH=. python3 bench/bench_join.py --rounds 5
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _nats_cluster import WorkerProc, balanced, single_node, stop_all, worker_env
from conftest import MosquittoBroker

READY = "partitions of JetStream stream"
REPORT = "holds partitions"


def stamp_of(text: str, needle: str) -> float | None:
    """Unix time of the first log line containing ``needle`` (``%(asctime)s``, local time)."""
    for line in text.splitlines():
        if needle in line:
            t = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return t.timestamp()
    return None


def wait(check: object, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            msg = f"{what}: not within {within_s} s"
            raise RuntimeError(msg)
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-join-"))
    node = single_node(workdir)
    broker = MosquittoBroker(workdir)
    broker.start()
    env = worker_env([node.url], args.partitions, 1)
    addr = f"{broker.host}:{broker.port}"
    live = [WorkerProc(workdir, n, addr, env) for n in range(2)]
    rounds = []
    try:
        wait(lambda: balanced([w.text() for w in live], args.partitions), 60, "two workers")
        for r in range(args.rounds):
            spawned = time.time()
            joiner = WorkerProc(workdir, 10 + r, addr, env)
            try:
                wait(lambda: REPORT in joiner.text(), 60, "the joining worker pulls")  # noqa: B023
            finally:
                stop_all([joiner])
            text = joiner.text()
            ready, report = stamp_of(text, READY), stamp_of(text, REPORT)
            assert ready is not None
            assert report is not None
            rounds.append(
                {"settle_s": round(report - ready, 3), "start_s": round(report - spawned, 3)}
            )
            print(json.dumps(rounds[-1]), flush=True)
            wait(lambda: balanced([w.text() for w in live], args.partitions), 60, "two again")
    finally:
        stop_all(live)
        broker.stop()
        node.kill(signal.SIGTERM)
        shutil.rmtree(workdir, ignore_errors=True)
    settle = sorted(r["settle_s"] for r in rounds)
    print(json.dumps({"rounds": len(rounds), "settle_s": [settle[0], settle[-1]]}))


if __name__ == "__main__":
    main()
