"""What a fleet worker killed in the middle of a cohort bucket does to that bucket, against real
parts: a real ``nats-server -js`` (raw gaze, one partition), two ``gazeguard run --fleet --source
jetstream --cohort`` worker processes, a real Mosquitto for the aggregates and receipts, one
SQLite ledger shared by the workers (the semantics are stated in ``gazeguard/runtime/cohort.py``).
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import socket
import time
from pathlib import Path

import pylsl
import pytest

from gazeguard.config import NatsSettings
from gazeguard.core.samples import GazeSamples
from gazeguard.ledger import Ledger
from gazeguard.runtime.jetstream import JetStreamSender
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.wire.cohort import CohortMessage
from tests._nats_cluster import NatsNode, WorkerProc, balanced, stop_all, worker_env
from tests.conftest import MosquittoBroker, Subscriber, until
from tests.runtime.test_jetstream import kill_the_one, wait_for

BUCKET_S = 4.0
ARGS = ["--window-s", "2", "--step-s", "0.05", "--chunk-steps", "32", "--budget-per-hour", "200",
        "--features", "fixation_rate,saccade_rate,pupil_mean", "--cohort", "lab",
        "--bucket-s", f"{BUCKET_S:g}", "--cohort-release", "means"]  # fmt: skip
TOPIC = "gazeguard/v1/cohort/lab/aggregates"


@pytest.mark.slow
@pytest.mark.network
def test_a_worker_killed_mid_bucket_leaves_the_bucket_to_the_survivor_charged_once_each(
    tmp_path: Path, nats_server: NatsNode, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    """Three devices stream gaze in real time into one partition; the worker it is pinned on is
    killed (SIGKILL) in the middle of a 4 s bucket, after it released earlier buckets. The
    bucket in progress is released by the surviving worker, each of its sessions charged once
    (receipts + the carrier = the ledger's charges), the killed worker charged no one for it,
    no bucket is released twice, and every charged (session, bucket) went out in an aggregate: a
    bucket is either released with each of its sessions charged once, or charged to no one."""
    env = worker_env([nats_server.url], 1)
    env.update(GAZEGUARD_COHORT__GRACE_S="1", GAZEGUARD_FLEET__IDLE_TIMEOUT_S="3")
    workers = [WorkerProc(tmp_path, n, mosquitto.address, env, ARGS) for n in range(2)]
    sub = Subscriber(mosquitto, f"sub-{unique_id}")
    sessions = [f"hmd.k{i}" for i in range(3)]
    ledger_path = tmp_path / "ledger.sqlite"
    logs = lambda: "\n=====\n".join(w.text() for w in workers)  # noqa: E731

    def aggregates() -> list[CohortMessage]:
        with sub.lock:
            got = [p for t, p, _ in sub.messages if t == TOPIC]
        return [CohortMessage.model_validate(json.loads(p)) for p in got]

    killed_bucket = -1
    try:
        wait_for(lambda: balanced([w.text() for w in workers], 1), 30, logs)

        async def device(session: str, seed: int) -> None:
            gaze = simulate_gaze(26.0, 120.0, seed)
            now = pylsl.local_clock()  # no offset header: the worker reads this host's clock
            gaze = GazeSamples(
                gaze.timestamps + now, gaze.x_deg, gaze.y_deg, gaze.pupil_mm, gaze.valid
            )
            settings = NatsSettings(servers=[nats_server.url])
            async with JetStreamSender(settings, "hmd", session.split(".")[1], rate_hz=120.0) as s:
                start = time.monotonic()
                for i, a in enumerate(range(0, len(gaze), 12)):
                    await s.send(gaze.slice(a, a + 12))
                    await asyncio.sleep(max(0.0, start + 0.1 * (i + 1) - time.monotonic()))

        async def devices_and_kill() -> int:
            nonlocal killed_bucket
            tasks = [asyncio.create_task(device(s, 30 + i)) for i, s in enumerate(sessions)]
            await until(lambda: len(aggregates()) >= 1, 20)  # a bucket released before
            # the middle of a bucket: its start + 2 s
            await asyncio.sleep((2.0 - time.time() % BUCKET_S) % BUCKET_S)
            killed_bucket = math.floor(time.time() / BUCKET_S)
            killed = kill_the_one(workers, lambda w: w.pinned() == {0}, logs)
            await asyncio.gather(*tasks)
            return killed

        killed = asyncio.run(asyncio.wait_for(devices_and_kill(), 60))
        other = workers[1 - killed]
        wait_for(lambda: 0 in other.pinned(), 30, logs)
        wait_for(lambda: any(m.bucket == killed_bucket for m in aggregates()), 30, logs)
        closed = lambda: all(f"session {s!r} closed" in other.text() for s in sessions)  # noqa: E731
        wait_for(closed, 30, logs)
        time.sleep(BUCKET_S + 2)  # the last buckets released and delivered
    finally:
        codes = stop_all(workers)
        with sub.lock:
            messages = list(sub.messages)
        sub.close()
    assert codes[killed] == -signal.SIGKILL
    assert codes[1 - killed] == 0, logs()
    ids = {f"{socket.gethostname()}-{w.proc.pid}": n for n, w in enumerate(workers)}
    published = [CohortMessage.model_validate(json.loads(p)) for t, p, _ in messages if t == TOPIC]
    buckets = [m.bucket for m in published]
    assert len(buckets) == len(set(buckets)), f"a bucket released twice: {sorted(buckets)}"
    by_bucket = {m.bucket: m for m in published}
    assert ids[by_bucket[killed_bucket].worker] == 1 - killed, "the survivor released it"
    assert any(ids[m.worker] == killed for m in published), "the killed worker released before"
    receipts: dict[int, list[str]] = {}
    for t, p, _ in messages:
        if t.endswith("/cohort"):
            receipts.setdefault(int(json.loads(p)["bucket"]), []).append(t.split("/")[3])
    with Ledger(ledger_path, create=False) as ledger:
        charged: dict[int, list[str]] = {}
        for s in sessions:
            for c in ledger.charges(s, "cohort"):
                charged.setdefault(c.chunk_index, []).append(s)
        assert ledger.verify() == []
        assert ledger.pending() == [], "every charged aggregate and receipt was delivered"
    assert sorted(charged[killed_bucket]) == sessions, "every session in it, charged once"
    for bucket, who in charged.items():
        assert bucket in by_bucket, f"bucket {bucket} charged to {who} but never released"
        # each charged session but the carrier got a receipt: charges = receipts + 1, once each
        assert len(who) == len(receipts.get(bucket, [])) + 1, (bucket, who, receipts.get(bucket))
    assert set(by_bucket) <= set(charged)
    # a bucket between the first and the last released that went out in no aggregate (ended
    # before the crash, not yet released, its vectors all before the cut) is charged to no one
    for bucket in range(min(by_bucket), max(by_bucket)):
        assert (bucket in by_bucket) == (bucket in charged), bucket
    text = other.text()
    assert "resumes after chunk" in text or "replayed" in text, text
