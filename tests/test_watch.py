"""``gazeguard watch`` against a real Mosquitto and a real ``gazeguard run`` (simulated headset)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MosquittoBroker

from gazeguard.cli import main
from gazeguard.cli.watch import describe, sparkline

FAST = ["--window-s", "2", "--step-s", "0.05", "--chunk-steps", "32"]
FEATURES = "fixation_rate,saccade_rate,pupil_mean"


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
