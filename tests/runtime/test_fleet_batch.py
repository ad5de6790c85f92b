"""The fleet worker's batch path (issue 17, item 4) against real parts: a real nats-server, a
real Mosquitto, a real SQLite ledger; and the batch decoder against the one-block decoder."""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import nats
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazeguard.config import LabelSettings, Settings
from gazeguard.core.errors import StreamError
from gazeguard.core.samples import GazeSamples
from gazeguard.ledger import Ledger
from gazeguard.runtime.fleet import INGEST_SLICE, Fleet, FleetSession
from gazeguard.runtime.jetstream import consumer_name
from gazeguard.runtime.jetstream.wire import ensure_consumers, ensure_stream
from gazeguard.runtime.service import serve_fleet
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal.rawgaze import decode_gaze, decode_many, encode_gaze
from tests._nats_cluster import NatsNode, expected_chunks, fleet_settings
from tests.conftest import MosquittoBroker, Subscriber, until
from tests.runtime.test_jetstream import blocks_of, send_blocks
from tests.runtime.test_label_stream import fast_model


async def serve_backlog(
    nats_server: NatsNode,
    settings: Settings,
    gaze: dict[str, GazeSamples],
    then: Callable[[], Awaitable[None]] | None = None,
) -> Fleet:
    """Each session's gaze waiting in JetStream (stream and consumers made as a worker makes
    them) before an in-process worker starts; the worker runs until it closed every session (or
    failed), then ``then()`` runs, then the worker stops; its Fleet."""
    nc = await nats.connect(nats_server.url)
    try:
        await ensure_stream(nc.jetstream(), settings.fleet.nats)
        await ensure_consumers(nc, settings.fleet.nats)
    finally:
        await nc.close()
    await asyncio.gather(*(send_blocks(nats_server, s, blocks_of(g), 0) for s, g in gaze.items()))
    stop = asyncio.Event()
    fleets: list[Fleet] = []
    worker = asyncio.create_task(serve_fleet(settings, stop=stop, ready=fleets.append))
    try:
        await until(
            lambda: worker.done() or (bool(fleets) and len(fleets[0].closed) == len(gaze)), 60
        )
        if then is not None and not worker.done():
            await then()
    finally:
        stop.set()
    return await worker


@pytest.mark.network
def test_a_backlog_is_processed_in_batches_each_chunk_charged_once_in_order(
    tmp_path: Path,
    nats_server: NatsNode,
    mosquitto: MosquittoBroker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Six sessions' blocks wait in one partition before the worker starts: it reads them in
    batches of many sessions (one feature step per session per batch, the chunks due charged
    in one group), and each session ends with every sample read once, its chunks charged once
    and in order, every block acknowledged and the ledger consistent."""
    ledger_path = tmp_path / "ledger.sqlite"
    settings = fleet_settings(nats_server.url, 1, ledger_path, (mosquitto.host, mosquitto.port))
    sessions = [f"b{i}" for i in range(6)]
    gaze = {s: simulate_gaze(8.0, 120.0, seed=40 + i) for i, s in enumerate(sessions)}
    sizes: list[int] = []
    process_many = Fleet.process_many

    async def observed(self: Fleet, items: Sequence[tuple[FleetSession, GazeSamples]]) -> None:
        sizes.append(len(items))  # the real step, observed
        await process_many(self, items)

    monkeypatch.setattr(Fleet, "process_many", observed)

    async def main() -> Fleet:
        async def drained() -> None:
            nc = await nats.connect(nats_server.url)
            try:
                info = await nc.jetstream().consumer_info("GAZE", consumer_name(0))
            finally:
                await nc.close()
            assert (info.num_pending, info.num_ack_pending) == (0, 0)

        return await serve_backlog(nats_server, settings, gaze, then=drained)

    with caplog.at_level(logging.INFO):
        fleet = asyncio.run(main())
    assert sorted(fleet.closed) == sorted(f"hmd.{s}" for s in sessions)
    assert max(sizes) > 1  # several sessions' samples in one step
    for s in sessions:
        closed = re.findall(rf"session 'hmd\.{s}' closed \((\d+) samples", caplog.text)
        assert closed == [str(len(gaze[s]))], caplog.text
    with Ledger(ledger_path, create=False) as ledger:  # 8 s, 2 s window, 1.6 s chunks: 2-3
        for s in sessions:
            want = list(range(expected_chunks(8.0, f"hmd.{s}")))  # on the session's grid
            assert len(want) >= 2
            assert [c.chunk_index for c in ledger.charges(f"hmd.{s}")] == want
            assert ledger.withheld(f"hmd.{s}") == []
        assert ledger.verify() == []


@pytest.mark.network
def test_a_burst_is_fed_a_slice_at_a_time_and_the_loop_runs_between_slices(
    tmp_path: Path,
    nats_server: NatsNode,
    mosquitto: MosquittoBroker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forty sessions' blocks wait in one partition (a burst, as when headsets on one clock send
    at the same moment): the worker feeds them at most INGEST_SLICE sessions at a time, never
    two slices at once, and other tasks of the loop (a due release, the publisher) run between
    two slices of one batch; every session's gaze is still read whole."""
    ledger_path = tmp_path / "ledger.sqlite"
    settings = fleet_settings(nats_server.url, 1, ledger_path, (mosquitto.host, mosquitto.port))
    gaze = {f"s{i}": simulate_gaze(3.0, 120.0, seed=200 + i) for i in range(40)}
    ticks = 0
    slices: list[tuple[int, int, int]] = []  # (sessions, ticks before, ticks after)
    inside = 0
    step = Fleet._process_many

    async def observed(self: Fleet, items: Sequence[tuple[FleetSession, GazeSamples]]) -> None:
        nonlocal inside
        inside += 1
        assert inside == 1, "two ingest slices at once"
        before = ticks
        try:
            await step(self, items)
        finally:
            inside -= 1
        slices.append((len(items), before, ticks))

    monkeypatch.setattr(Fleet, "_process_many", observed)

    async def main() -> Fleet:
        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        tick = asyncio.create_task(ticker())
        try:
            return await serve_backlog(nats_server, settings, gaze)
        finally:
            tick.cancel()

    fleet = asyncio.run(main())
    assert sorted(fleet.closed) == sorted(f"hmd.{s}" for s in gaze)
    assert max(n for n, _, _ in slices) == INGEST_SLICE, slices  # a batch was sliced
    assert sum(n for n, _, _ in slices) >= len(gaze)
    # the loop turned between consecutive slices (the ticker ran), not only within them
    gaps = [b2 - a1 for (_, _, a1), (_, b2, _) in itertools.pairwise(slices)]
    assert all(g >= 1 for g in gaps), slices


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 20), st.sampled_from(["ok", "nan_t", "short", "magic", "back"])),
        max_size=10,
    ),
    st.integers(0, 2**31),
)
def test_decode_many_equals_decode_gaze_block_by_block(
    blocks: list[tuple[int, str]], seed: int
) -> None:
    """Each payload decodes as :func:`decode_gaze` decodes it alone: the same arrays, or a
    :class:`StreamError` where it raises one (invalid gaze, NaN times, bad sizes, bad magic);
    the first and last timestamps and "strictly increasing" stated per block are the block's."""
    rng = np.random.default_rng(seed)
    payloads = []
    for n, kind in blocks:
        t = np.cumsum(rng.uniform(0.001, 0.02, n))
        if kind == "back" and n > 1:  # a sample not newer than the one before it
            t[rng.integers(1, n)] = t[0]
        x, y = rng.normal(0, 5, n), rng.normal(0, 5, n)
        x[rng.random(n) < 0.2] = np.nan
        payload = encode_gaze(GazeSamples.from_arrays(t, x, y, rng.uniform(2, 6, n)))
        if kind == "nan_t" and n:
            t[0] = np.nan
            payload = encode_gaze(GazeSamples(t, x, y, np.full(n, 3.0), np.isfinite(x)))
        elif kind == "short":
            payload = payload[:-8]
        elif kind == "magic":
            payload = b"XXXX" + payload[4:]
        payloads.append(payload)
    decoded = decode_many(payloads)
    for i, (payload, got) in enumerate(zip(payloads, decoded.blocks, strict=True)):
        try:
            want = decode_gaze(payload)
        except StreamError:
            assert isinstance(got, StreamError)
            assert not decoded.increasing[i]
            continue
        assert isinstance(got, GazeSamples)
        for name in ("timestamps", "x_deg", "y_deg", "pupil_mm", "valid"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
        t = want.timestamps
        assert decoded.increasing[i] == bool(np.all(np.diff(t) > 0))
        if len(t):
            assert (decoded.first[i], decoded.last[i]) == (t[0], t[-1])
        else:
            assert np.isnan(decoded.first[i])
            assert np.isnan(decoded.last[i])


@pytest.mark.slow
@pytest.mark.network
def test_a_fleet_worker_releases_private_labels(
    tmp_path: Path,
    nats_server: NatsNode,
    mosquitto: MosquittoBroker,
) -> None:
    """With labels enabled, a JetStream worker decides, charges and publishes each session's
    labels as the sidecar does (before, the plan reserved their share and none was released):
    every decision block of every session charged once in the ledger's label stream, in order,
    and each one on the broker under the headset's device."""
    ledger_path = tmp_path / "ledger.sqlite"
    base = fleet_settings(nats_server.url, 1, ledger_path, (mosquitto.host, mosquitto.port))
    model = fast_model(tmp_path / "fast.json")
    settings = base.model_copy(
        update={
            "labels": LabelSettings(
                enabled=True, model=str(model), release="clock", decision_s=1.0, epsilon=1.0
            ),
            "ledger": base.ledger.model_copy(update={"budget_per_hour": 10_000.0}),
            "mechanism": base.mechanism.model_copy(update={"epsilon": None}),
        }
    )
    sessions = ["l0", "l1"]
    gaze = {s: simulate_gaze(8.0, 120.0, seed=70 + i) for i, s in enumerate(sessions)}
    sub = Subscriber(mosquitto, "fleet-labels-test")

    try:
        asyncio.run(serve_backlog(nats_server, settings, gaze))
        with Ledger(ledger_path, create=False) as ledger:
            charged = {
                s: [c.chunk_index for c in ledger.charges(f"hmd.{s}", "labels")] for s in sessions
            }
            assert ledger.verify() == []
        for s in sessions:  # 8 s of gaze, a 2 s window: 1 s decisions from 2 s on
            assert len(charged[s]) >= 4, charged
            assert charged[s] == list(range(len(charged[s])))
        deadline = time.monotonic() + 10  # the worker drained its outbox before it stopped
        while len(sub.labels()) < sum(map(len, charged.values())) and time.monotonic() < deadline:
            time.sleep(0.05)
        got = {(m.device, m.session, m.decision_index) for m in sub.labels()}
        assert got == {("hmd", f"hmd.{s}", i) for s in sessions for i in charged[s]}
    finally:
        sub.close()
