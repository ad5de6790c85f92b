"""Fleet mode: LSL discovery against real parts (worker processes, a real Mosquitto, real LSL
outlets), and the refusal of the retired MQTT raw-gaze path. Raw gaze from devices on other hosts
(NATS JetStream) is tested in test_jetstream.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MosquittoBroker

from gazeguard.config import check_settings, load_settings, validate_settings
from gazeguard.errors import ConfigError
from gazeguard.ledger import Ledger
from gazeguard.simulate import SimulatedHeadset

REPO = Path(__file__).resolve().parent.parent
FAST = ["--window-s", "2", "--step-s", "0.05", "--chunk-steps", "32", "--epsilon", "0.5",
        "--budget-per-hour", "none",
        "--features", "fixation_rate,saccade_rate,pupil_mean"]  # fmt: skip


def start_worker(tmp_path: Path, broker: MosquittoBroker, *extra: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable, "-m", "gazeguard", "-v", "run", "--fleet", "--device", "fleet",
        "--broker", f"{broker.host}:{broker.port}", "--ledger", str(tmp_path / "ledger.sqlite"),
        *FAST, *extra,
    ]  # fmt: skip
    return subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=tmp_path)


def stop_workers(*procs: subprocess.Popen[str]) -> list[str]:
    """SIGTERM every worker, reap each (SIGKILL after 30 s), then check that all exited 0.

    All are stopped before any is judged: one failing worker must not leave the others running
    (an orphan keeps its broker connection, port and CPU for the rest of the suite)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    errs = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err += "\n[the worker did not stop within 30 s of SIGTERM: killed]"
        errs.append(err)
    codes = [proc.returncode for proc in procs]
    assert codes == [0] * len(procs), f"worker exit codes {codes}\n" + "\n---\n".join(errs)
    return errs


def stop_worker(proc: subprocess.Popen[str]) -> str:
    return stop_workers(proc)[0]


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


def gazeguard(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m gazeguard ARGS`` with this checkout first on the path, no GAZEGUARD_* env."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAZEGUARD_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "gazeguard", *args],
        capture_output=True, text=True, cwd=cwd, timeout=90, check=False, env=env,
    )  # fmt: skip


def test_the_retired_mqtt_source_is_refused_at_startup_in_one_line(tmp_path: Path) -> None:
    """Issue 17, step 2: `--source mqtt` (the MQTT claim protocol) is gone; a fleet configured
    for it fails at once, in one line that says what to use instead, without a traceback."""
    out = gazeguard(
        "run", "--fleet", "--source", "mqtt", "--broker", "127.0.0.1:1", "--ledger", "l.sqlite",
        "--duration", "3", *FAST, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    (line,) = [ln for ln in out.stderr.splitlines() if "ingest.source" in ln]
    assert "MQTT raw-gaze fleet path was retired" in line
    assert "ingest.source = 'jetstream'" in line
    assert "pip install 'gazeguard[fleet]'" in line
    assert not (tmp_path / "l.sqlite").exists(), "refused before anything was opened"
    # in a file too, fleet mode or not: one problem, the same advice
    (tmp_path / "old.toml").write_text('[ingest]\nsource = "mqtt"\n[fleet]\nenabled = true\n')
    _, problems = check_settings(tmp_path / "old.toml")
    assert [(p.field, "retired" in p.reason) for p in problems] == [("ingest.source", True)]
    alone = load_settings(None, ingest={"source": "mqtt"})
    assert [p.field for p in validate_settings(alone)] == ["ingest.source"]


def test_settings_of_the_retired_mqtt_path_are_refused_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fleet.raw_broker, fleet.raw_prefix and fleet.share_group are gone: refused, from a file
    or the environment, as retired (not as a typo with a "did you mean")."""
    for key in list(os.environ):
        if key.startswith("GAZEGUARD_"):
            monkeypatch.delenv(key)
    (tmp_path / "old.toml").write_text(
        '[fleet]\nraw_prefix = "gazeguard/raw/v1"\nshare_group = "g"\n'
        '[fleet.raw_broker]\nhost = "raw.lab"\n'
    )
    settings, problems = check_settings(tmp_path / "old.toml")
    assert settings is None
    assert sorted(p.field for p in problems) == [
        "fleet.raw_broker", "fleet.raw_prefix", "fleet.share_group",
    ]  # fmt: skip
    for p in problems:
        assert "which was retired" in p.reason, p
        assert "ingest.source = 'jetstream'" in p.reason, p
        assert p.suggestion is None
    monkeypatch.setenv("GAZEGUARD_FLEET__RAW_PREFIX", "gazeguard/raw/v1")
    with pytest.raises(ConfigError, match="which was retired") as info:
        load_settings(None)
    assert info.value.field == "fleet.raw_prefix"
    assert info.value.source == "environment variable GAZEGUARD_FLEET__RAW_PREFIX"


def test_forward_refuses_the_retired_mqtt_flags_with_advice(tmp_path: Path) -> None:
    """`gazeguard forward` sends to NATS JetStream only; `--to mqtt` or `--broker` (old scripts)
    fail in one line that says so, before any stream is resolved."""
    for args in (["--to", "mqtt"], ["--broker", "fleet-broker.lab:1883"]):
        out = gazeguard("forward", *args, "--device", "hmd", "--duration", "1", cwd=tmp_path)
        assert out.returncode == 1, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, out.stderr
        assert "sends raw gaze to NATS JetStream only" in lines[0]
        assert "--nats URL" in lines[0]
