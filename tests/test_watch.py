"""``gazeguard watch`` against a real Mosquitto and a real ``gazeguard run`` (simulated headset)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from conftest import MosquittoBroker
from test_cli import Proc

from gazeguard.cli import ExitCode, main
from gazeguard.cli.watch import describe, sparkline
from gazeguard.wire.message import StatusMessage

FAST = ["--window-s", "2", "--step-s", "0.05", "--chunk-steps", "32"]
FEATURES = "fixation_rate,saccade_rate,pupil_mean"


@pytest.mark.slow
@pytest.mark.network
def test_watch_shows_validated_chunks_of_a_real_run(
    mosquitto: MosquittoBroker, tmp_path: Path, unique_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"{mosquitto.host}:{mosquitto.port}"
    run = subprocess.Popen(
        [
            sys.executable, "-m", "gazeguard", "run", "--source", "simulated",
            "--source-id", unique_id, "--session", unique_id, "--device", "hmd",
            "--broker", address, "--ledger", str(tmp_path / "l.sqlite"),
            "--features", FEATURES, "--duration", "25", *FAST,
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        code = main(
            ["watch", "--broker", address, "--session", unique_id, "--count", "2",
             "--duration", "60", "--json"]
        )  # fmt: skip
    finally:
        run.terminate()
        _, err = run.communicate(timeout=30)
    assert code == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    chunks = [d["message"] for d in docs if d["kind"] == "chunks"]
    assert len(chunks) == 2
    assert all(c["session"] == unique_id and c["features"] == FEATURES.split(",") for c in chunks)
    assert all(d["kind"] in ("chunks", "status") for d in docs)  # nothing invalid
    # the run told a newcomer how to watch it
    assert f"gazeguard watch --broker {address} --device hmd --session {unique_id}" in err
    assert f"mosquitto_sub -h {mosquitto.host} -p {mosquitto.port}" in err


def test_an_invalid_message_is_reported_not_fatal() -> None:
    kind, lines, model = describe("gazeguard/v1/d/s/chunks", b'{"schema": "nope"}', 8)
    assert (kind, model) == ("invalid", None)
    assert lines[0].startswith("INVALID message on gazeguard/v1/d/s/chunks:")
    kind, _, _ = describe("gazeguard/v1/d/s/status", b"\xff\xfe not json", 8)
    assert kind == "invalid"
    assert describe("elsewhere/x", b"{}", 8)[0] == "other"


def test_sparkline_spans_the_range() -> None:
    assert sparkline([0.0, 0.5, 1.0], 0.0, 1.0) == "▁▅█"
    assert sparkline([-5.0, 5.0], 0.0, 1.0) == "▁█"  # clipped to the range


def _retain(broker: MosquittoBroker, session: str, state: str) -> None:
    """A retained status of ``hmd``/``session`` in ``state``, published as a run would."""
    status = StatusMessage(
        session=session, device="hmd", state=state, time=time.time(), spent=0.0, remaining=None,
        session_cap=None, chunks_charged=0, chunks_withheld=0, chunks_dropped=0,
    )  # type: ignore[arg-type]  # fmt: skip
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        client.publish(
            f"gazeguard/v1/hmd/{session}/status", status.to_payload(), qos=1, retain=True
        ).wait_for_publish(10)
    finally:
        client.loop_stop()
        client.disconnect()


@pytest.mark.slow
@pytest.mark.network
def test_watch_waits_for_the_broker_rides_out_its_end_and_stops_on_ctrl_c(
    tmp_path: Path, unique_id: str
) -> None:
    """Issue 35.4: `watch` ended in a traceback when no broker answered yet and when the run
    (its embedded broker) ended. Now one line each, it keeps trying, and Ctrl-C exits 130."""
    broker = MosquittoBroker(tmp_path)  # its port chosen, not started yet
    watch = Proc(
        "watch", "--broker", broker.address, "--device", "hmd", "--session", unique_id,
        cwd=tmp_path,
    )  # fmt: skip
    try:
        watch.wait_for(f"no MQTT broker answers at {broker.address} yet")
        broker.start()
        watch.wait_for(f"^watching gazeguard/v1/hmd/{unique_id}/\\+ on {broker.address}")
        _retain(broker, unique_id, "running")
        watch.wait_for(f"^status hmd/{unique_id}: running")
        broker.stop()  # as the embedded broker of a run that ends
        watch.wait_for(f"lost broker {broker.address}")
        broker.start()
        watch.wait_for(f"broker {broker.address} is back")
        _retain(broker, unique_id, "stopped")
        watch.wait_for(f"^status hmd/{unique_id}: stopped")
        code, text = watch.finish(signal.SIGINT)
    finally:
        broker.stop()
    assert code == ExitCode.INTERRUPTED, text
    assert "Traceback" not in text
    assert len(re.findall("no MQTT broker answers", text)) == 1, text
    assert len(re.findall("lost broker", text)) == 1, text
    assert "0 chunk and label messages, 0 invalid" in text
