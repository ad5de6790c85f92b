"""Fleet mode: LSL discovery against real parts (worker processes, a real Mosquitto, real LSL
outlets). Raw gaze from devices on other hosts (NATS JetStream) is tested in test_jetstream.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gazeguard.ledger import Ledger
from gazeguard.runtime.simulate import SimulatedHeadset
from tests.conftest import MosquittoBroker

REPO = Path(__file__).resolve().parents[2]
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


@pytest.mark.slow
@pytest.mark.network
def test_lsl_fleet_serves_every_discovered_stream(
    tmp_path: Path, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    name = (
        f"fleet-{unique_id}"  # --stream-name is a prefix: each headset's name only starts with it
    )
    heads = [
        SimulatedHeadset(250, seed=i, name=f"{name}-hmd{i}", source_id=f"{name}-{i}")
        for i in range(3)
    ]
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
