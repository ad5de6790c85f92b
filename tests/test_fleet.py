"""Fleet mode against real parts: worker processes (`gazeguard run --fleet`), a real Mosquitto
with MQTT v5 shared subscriptions, real LSL outlets, one SQLite ledger shared by the workers."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import MosquittoBroker

from gazeguard.config import BrokerSettings
from gazeguard.errors import StreamError
from gazeguard.fleet import RawGazeSender, decode_gaze, encode_gaze
from gazeguard.ledger import Ledger
from gazeguard.samples import GazeSamples
from gazeguard.simulate import SimulatedHeadset, simulate_gaze

FAST = ["--window-s", "2", "--step-s", "0.05", "--chunk-steps", "32", "--epsilon", "0.5",
        "--features", "fixation_rate,saccade_rate,pupil_mean"]  # fmt: skip


def start_worker(tmp_path: Path, broker: MosquittoBroker, *extra: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable, "-m", "gazeguard", "-v", "run", "--fleet", "--device", "fleet",
        "--broker", f"{broker.host}:{broker.port}", "--ledger", str(tmp_path / "ledger.sqlite"),
        *FAST, *extra,
    ]  # fmt: skip
    return subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=tmp_path)


def stop_worker(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


def test_raw_block_codec_round_trip_and_rejects_garbage() -> None:
    block = GazeSamples.from_arrays([0.0, 0.01, 0.02], [1.0, np.nan, 3.0], [0.5, 0.5, 0.5])
    back = decode_gaze(encode_gaze(block))
    np.testing.assert_array_equal(back.timestamps, block.timestamps)
    np.testing.assert_array_equal(back.valid, [True, False, True])
    with pytest.raises(StreamError, match="expected b'GGR1'"):
        decode_gaze(b"XXXX" + encode_gaze(block)[4:])
    with pytest.raises(StreamError, match="says 3 samples but carries"):
        decode_gaze(encode_gaze(block)[:-8])
    bad = GazeSamples.from_arrays([0.0, np.inf], [1.0, 1.0], [1.0, 1.0])
    with pytest.raises(StreamError, match="non-finite timestamps"):
        decode_gaze(encode_gaze(bad))


async def _device(broker: BrokerSettings, session: str, seed: int) -> str:
    """30 s of one simulated person's gaze, sent in 100 ms blocks (faster than real time)."""
    gaze = simulate_gaze(30.0, 120.0, seed)
    async with RawGazeSender(broker, "hmd", session) as sender:
        for start in range(0, len(gaze), 12):
            await sender.send(gaze.slice(start, start + 12))
            await asyncio.sleep(0.002)
        assert sender.owner is not None
        return sender.owner


@pytest.mark.network
def test_mqtt_fleet_spreads_sessions_over_workers_and_charges_each_once(
    tmp_path: Path, mosquitto: MosquittoBroker
) -> None:
    workers = [start_worker(tmp_path, mosquitto, "--source", "mqtt") for _ in range(2)]
    try:
        time.sleep(2.5)  # both workers import and subscribe
        broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)

        async def devices() -> list[str]:
            return await asyncio.gather(*(_device(broker, f"s{i}", i) for i in range(6)))

        owners = asyncio.run(devices())
        time.sleep(1.5)  # the last chunks are charged and published
    finally:
        errs = [stop_worker(w) for w in workers]
    assert len(set(owners)) == 2, f"both workers should serve sessions: {owners}"
    with Ledger(tmp_path / "ledger.sqlite", create=False) as ledger:
        for i in range(6):
            indices = [c.chunk_index for c in ledger.charges(f"hmd.s{i}")]
            # 30 s at a 2 s window and 32 × 0.05 s chunks: 17 full chunks (minus the window)
            assert len(indices) >= 15, (i, indices, errs)
            assert indices == list(range(len(indices))), "contiguous, each charged once"
            assert ledger.pending(session=f"hmd.s{i}") == []


@pytest.mark.network
def test_sender_without_worker_fails_with_advice(mosquitto: MosquittoBroker) -> None:
    broker = BrokerSettings(host=mosquitto.host, port=mosquitto.port)

    async def lonely() -> None:
        async with RawGazeSender(broker, "hmd", "nobody", claim_timeout_s=1.0):
            pass

    with pytest.raises(Exception, match="no gazeguard worker claimed session"):
        asyncio.run(lonely())


@pytest.mark.network
def test_lsl_fleet_serves_every_discovered_stream(
    tmp_path: Path, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    name = f"fleet-{unique_id}"
    heads = [SimulatedHeadset(250, seed=i, name=name, source_id=f"{name}-{i}") for i in range(3)]
    for h in heads:
        h.start()
    try:
        worker = start_worker(tmp_path, mosquitto, "--source", "lsl", "--stream-name", name)
        deadline = time.monotonic() + 40
        done: set[str] = set()
        while time.monotonic() < deadline and len(done) < 3:
            time.sleep(0.5)
            if (tmp_path / "ledger.sqlite").exists():
                with Ledger(tmp_path / "ledger.sqlite", create=False) as ledger:
                    done = {s for s in ledger.sessions() if ledger.state(s).chunks >= 1}
        err = stop_worker(worker)
    finally:
        for h in heads:
            h.stop()
    assert done == {f"{name}-{i}" for i in range(3)}, err  # one session per outlet
