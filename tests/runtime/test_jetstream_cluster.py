"""The JetStream fleet when NATS servers die (issue 17, step 3): one ``nats-server`` stopped and
killed mid-stream and started again on its port and store; three servers clustered on loopback
(R3 stream and consumers) losing the pinned worker and then the stream leader's server. Real
processes throughout (see ``_nats_cluster.py``, shared with ``bench/fleet_cluster.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests._nats_cluster import (
    STREAM,
    Devices,
    OneWorker,
    admin,
    audit,
    charges,
    cluster_scenario,
    drained,
    first_charges_after,
    js_api,
    poll,
    single_worker,
)
from tests.conftest import MosquittoBroker


@pytest.fixture
def one_worker(tmp_path: Path, mosquitto: MosquittoBroker) -> Iterator[Callable[..., OneWorker]]:
    """``one_worker(partitions, **env)``: :func:`_nats_cluster.single_worker`, stopped at the end of
    the test if the test has not stopped it."""
    with contextlib.ExitStack() as stack:
        yield lambda partitions, **env: stack.enter_context(
            single_worker(tmp_path, mosquitto.address, partitions, **env)
        )


def assert_nothing_lost_nor_charged_twice(report: dict[str, object], logs: str) -> None:
    assert report["samples_lost"] == 0, (report, logs)
    assert report["samples_read"] == report["samples_sent"], (report, logs)
    assert report["samples_dropped_as_not_newer"] == 0, (report, logs)
    assert report["chunks_charged"] == report["chunks_expected"], (report, logs)
    assert report["chunks_charged_twice"] == 0, (report, logs)
    assert report["double_charges_refused"] == 0, (report, logs)
    assert report["chunks_dropped"] == 0, (report, logs)
    assert report["window_survived"], (report, logs)


@pytest.mark.network
@pytest.mark.slow
def test_a_restarted_nats_server_loses_no_sample_and_charges_each_chunk_once(
    tmp_path: Path, one_worker: Callable[..., OneWorker]
) -> None:
    """One server, one worker, three devices. Phase 1 is charged; the server is stopped
    (SIGTERM) while phase 2 is sent, and started again once every device has retried a publish;
    then killed (SIGKILL) while phase 3 is sent, and started again the same way. Every block
    is stored once, every sample read, each chunk charged once, no feature step lost."""
    partitions = 2
    run = one_worker(partitions)
    node, worker = run.node, run.worker
    ledger_path = tmp_path / "ledger.sqlite"
    devices = Devices([node.url], 3, gaze_s=30.0, phases=3, pace_s=0.005)
    keys = [d.key for d in devices.devices]
    blocks_stored = -1

    def charged_from(phase: int) -> bool:
        """Every session has a chunk charged of gaze sent in ``phase`` or later."""
        gaze_from = devices.offset + devices.phase_start_t(phase)
        return len(first_charges_after(ledger_path, keys, 0.0, gaze_from)) == len(keys)

    async def scenario() -> None:
        nonlocal blocks_stored
        await poll(worker.ready, 60, "worker ready")
        sending = asyncio.create_task(devices.run())
        try:
            await poll(
                lambda: devices.done(0) and all(len(charges(ledger_path, k)) >= 2 for k in keys),
                60,
                "phase 1 sent and charged",
                watch=sending,
            )
            for phase, sig in ((1, signal.SIGTERM), (2, signal.SIGKILL)):
                retried = {d.key: d.sender.retries if d.sender else 0 for d in devices.devices}
                node.kill(sig)
                devices.go[phase].set()
                # every device has sent a block into the outage and retried it: restart
                await poll(
                    lambda: all(
                        d.sender is not None and d.sender.retries > retried[d.key]  # noqa: B023
                        for d in devices.devices
                    ),
                    30,
                    f"every device retrying (outage {phase})",
                    watch=sending,
                )
                node.start()
                await poll(node.healthy, 30, "server healthy again", watch=sending)
                await poll(
                    lambda: charged_from(phase),  # noqa: B023 - awaited in this iteration
                    60,
                    f"phase {phase + 1} charged",
                    watch=sending,
                )
            await sending
            async with admin([node.url]) as nc:
                await poll(lambda: drained(nc, partitions), 60, "every block acknowledged")
                state = (await js_api(nc, f"STREAM.INFO.{STREAM}")).get("state") or {}
                blocks_stored = int(state.get("messages", -1))
        finally:
            sending.cancel()

    asyncio.run(scenario())
    codes, text, logs = run.stop(), worker.text(), run.logs()
    assert codes == [0], logs
    assert blocks_stored == devices.blocks * len(keys), "every block stored once"
    report = audit(ledger_path, [text], devices.samples(), 30.0)
    print(report, "retries", devices.retries(), "reconnects", devices.reconnects())
    assert_nothing_lost_nor_charged_twice(report, logs)
    # every device lived through both outages on one connection that reconnected
    assert devices.reconnects() >= 2 * len(keys), devices.reconnects()


@pytest.mark.network
@pytest.mark.slow
def test_a_three_node_cluster_survives_a_killed_worker_and_a_killed_stream_leader(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    """Three servers (R3), two workers, four devices: kill -9 the pinned worker, then the
    server leading the stream, then restart both. Nothing is lost, nothing charged twice, the
    other worker takes over with its feature windows rebuilt, and the failover times are
    printed."""
    outcome = cluster_scenario(tmp_path, mosquitto.address, workers=2, sessions=4, partitions=1)
    report, logs = outcome.report, outcome.all_logs()
    print(report)
    assert_nothing_lost_nor_charged_twice(report, logs)
    assert report["blocks_stored"] == report["blocks_sent"], (report, logs)
    killed = outcome.codes.index(-signal.SIGKILL)
    assert [c for i, c in enumerate(outcome.codes) if i != killed] == [0, 0], (report, logs)
    survivor = outcome.logs[1 - killed]
    assert "pinned on partition 0" in survivor, logs
    assert "resumes after chunk" in survivor, logs
    # no publish is acknowledged while the stream has no leader: every device retried
    assert report["publish_retries_node_kill"] >= report["sessions"], (report, logs)


@pytest.mark.network
@pytest.mark.slow
def test_a_takeover_replay_stalled_by_the_server_resumes_and_completes(
    tmp_path: Path, one_worker: Callable[..., OneWorker]
) -> None:
    """A takeover replay the server stops answering mid-way (SIGSTOP: a stall, a leader
    election) is resumed where it stopped once the server answers again, not cut short: the
    acknowledged gaze it had not replayed yet would never come again, so the rebuilt sessions
    would miss it. The takeover: the server's restart forgot the worker's pin, so the worker is
    pinned anew on the next block and replays everything retained."""
    # the stall must not move the pin
    run = one_worker(1, GAZEGUARD_FLEET__NATS__PIN_TIMEOUT_S="60")
    node, worker = run.node, run.worker
    ledger_path = tmp_path / "ledger.sqlite"
    devices = Devices([node.url], 5, gaze_s=30.0, phases=10, pace_s=0.0)
    for go in devices.go[:-1]:
        go.set()  # 27 s of gaze per session now, the last 3 s after the restart

    def replay_started() -> bool:
        return worker.text().count("resumes after chunk") > 0

    def replay_stalled() -> bool:
        text = worker.text()
        return (
            "replay of partition 0 interrupted" in text
            or "replayed" in text.split("partition 0 lost", 1)[-1]
        )

    async def scenario() -> None:
        await poll(worker.ready, 60, "worker ready")
        sending = asyncio.create_task(devices.run())
        try:
            async with admin([node.url]) as nc:
                await poll(lambda: devices.done(8), 60, "27 s sent", watch=sending)
                await poll(lambda: drained(nc, 1), 60, "27 s read", watch=sending)
            node.kill(signal.SIGTERM)
            node.start()
            await poll(node.healthy, 30, "server healthy again", watch=sending)
            devices.go[-1].set()  # the next block pins the worker anew: a takeover replay
            await poll(replay_started, 30, "takeover replay started", watch=sending)
            assert node.proc is not None
            node.proc.send_signal(signal.SIGSTOP)
            try:
                await poll(replay_stalled, 30, "the worker noticed the stall", watch=sending)
            finally:
                node.proc.send_signal(signal.SIGCONT)
            await sending
            async with admin([node.url]) as nc:
                await poll(lambda: drained(nc, 1), 60, "every block acknowledged")
        finally:
            sending.cancel()

    asyncio.run(scenario())
    codes, text, logs = run.stop(), worker.text(), run.logs()
    assert codes == [0], logs
    assert "replay of partition 0 interrupted" in text, "the stall hit the replay: " + logs
    report = audit(ledger_path, [text], devices.samples(), 30.0)
    print(report)
    assert_nothing_lost_nor_charged_twice(report, logs)
