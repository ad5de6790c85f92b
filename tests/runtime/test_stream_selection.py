"""Issue 49.1: explicit, safe stream selection on a host where other gazeguard processes and LSL
streams run. Real LSL outlets (simulated headsets), real gazeguard processes, a real Mosquitto.

Every stream here has a stream type unique to the test (``ingest.stream_type``, which the
sidecar's own simulated headset also takes), so parallel tests never see each other's streams;
everything else is the product's default selection."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pylsl
import pytest

from gazeguard.cli._common import ExitCode
from gazeguard.config import load_settings
from gazeguard.ledger import Ledger
from gazeguard.runtime.fleet import Fleet
from gazeguard.runtime.service import serve_fleet
from gazeguard.runtime.simulate import SimulatedHeadset
from tests.conftest import MosquittoBroker, Subscriber

FAST = ["--window-s", "2", "--step-s", "0.02", "--chunk-steps", "32", "--epsilon", "0.5",
        "--budget-per-hour", "none",
        "--features", "fixation_rate,saccade_rate,pupil_mean"]  # fmt: skip


def _env(broker: MosquittoBroker, stream_type: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAZEGUARD_")}
    env["GAZEGUARD_BROKER__PORT"] = str(broker.port)  # no host: the local broker is found
    env["GAZEGUARD_INGEST__STREAM_TYPE"] = stream_type
    return env


@contextmanager
def headsets(stream_type: str, *source_ids: str | None) -> Iterator[list[SimulatedHeadset]]:
    """Simulated headsets as LSL outlets of ``stream_type`` (``None``: a default simulator, its
    source_id ``gazeguard-sim-…``)."""
    heads = [
        SimulatedHeadset(120.0, seed=i + 1, stream_type=stream_type, source_id=sid,
                         **({} if sid is None else {"name": sid}))
        for i, sid in enumerate(source_ids)
    ]  # fmt: skip
    with ExitStack() as stack:
        for h in heads:
            stack.enter_context(h)
        yield heads


def gazeguard(
    tmp_path: Path, env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gazeguard", *args],
        capture_output=True, text=True, cwd=tmp_path, timeout=timeout, check=False, env=env,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.network
def test_readme_first_command_serves_its_own_simulator_beside_two_simulators_and_a_gazeguard(
    tmp_path: Path, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    """Found 1: `gazeguard run --duration 90` (source auto) attached to another process's
    simulated stream and exited 1 ("… is being served by another process"). With two simulators
    and another gazeguard on the host it now starts a simulated headset of its own, first try."""
    env = _env(mosquitto, unique_id)
    sub = Subscriber(mosquitto, f"sub-{unique_id}")
    other: subprocess.Popen[str] | None = None
    try:
        with headsets(unique_id, None, None) as heads:
            other = subprocess.Popen(
                [sys.executable, "-m", "gazeguard", "run", "--source", "simulated",
                 "--ledger", "other.sqlite", *FAST],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
            )  # fmt: skip
            sessions = lambda: {c.session for c in sub.chunks()}  # noqa: E731
            assert sub.wait_for(lambda: len(sessions()) == 1, 40), sub.statuses()
            (theirs,) = sessions()
            out = gazeguard(tmp_path, env, "run", "--duration", "8", *FAST)
            others = {h.source_id for h in heads}
    finally:
        if other is not None:
            other.terminate()
            other.communicate(timeout=30)
        sub.close()
    assert out.returncode == ExitCode.OK, out.stderr
    assert "being served by another process" not in out.stderr
    assert "starting this run's own SIMULATED headset" in out.stderr, out.stderr
    assert "ingest.source auto: using" not in out.stderr
    ours = sessions() - {theirs}
    assert len(ours) == 1, (sessions(), out.stderr)
    (mine,) = ours
    assert mine.startswith("gazeguard-sim-1-")
    assert mine not in others
    assert theirs not in others
    with Ledger(tmp_path / "gazeguard-ledger.sqlite", create=False) as ledger:
        assert ledger.sessions() == [mine]
        assert ledger.state(mine).chunks >= 1


@pytest.mark.slow
@pytest.mark.network
def test_auto_with_several_candidates_lists_them_and_exits(
    tmp_path: Path, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    """`auto` with two streams it could serve (and a simulator it never takes) stops before
    anything is charged, lists them with the flag that selects one; that flag then works."""
    env = _env(mosquitto, unique_id)
    a, b = f"{unique_id}-a", f"{unique_id}-b"
    with headsets(unique_id, a, b, None) as heads:
        out = gazeguard(tmp_path, env, "run", "--duration", "5", "--ledger", "l.sqlite", *FAST)
        chosen = gazeguard(
            tmp_path, env, "run", "--duration", "4", "--ledger", "c.sqlite", "--source-id", a,
            *FAST,
        )  # fmt: skip
        sim = heads[2].source_id
    assert out.returncode == ExitCode.ERROR, out.stderr
    assert "Traceback" not in out.stderr
    errors = [ln for ln in out.stderr.splitlines() if "will not guess" in ln]
    assert len(errors) == 1, out.stderr
    assert f"--source-id {a!r}" in errors[0]
    assert f"--source-id {b!r}" in errors[0]
    assert sim not in errors[0]  # a simulated headset of another process is no candidate
    assert "Choose one with --source-id ID" in errors[0]
    if (tmp_path / "l.sqlite").exists():
        with Ledger(tmp_path / "l.sqlite", create=False) as ledger:
            assert ledger.sessions() == []  # refused before anything was charged
    assert chosen.returncode == ExitCode.OK, chosen.stderr
    with Ledger(tmp_path / "c.sqlite", create=False) as ledger:
        assert ledger.sessions() == [a]


@pytest.mark.slow
@pytest.mark.network
def test_auto_never_takes_another_hosts_stream_and_stream_host_selects_it(
    tmp_path: Path, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    """A lab LAN shows every host's streams: `auto` serves this host's only. The host is judged
    by ingest.stream_host, so naming a host that is not this one makes this host's stream
    "another host's" (the same rule as a stream published elsewhere)."""
    env = _env(mosquitto, unique_id)
    a = f"{unique_id}-a"
    with headsets(unique_id, a):
        out = gazeguard(
            tmp_path, env, "-v", "run", "--duration", "3", "--ledger", "l.sqlite",
            "--stream-host", "lab-pc-*", *FAST,
        )  # fmt: skip
    assert out.returncode == ExitCode.OK, out.stderr
    skipped = [ln for ln in out.stderr.splitlines() if f"skipping LSL stream {a!r}" in ln]
    assert len(skipped) == 1, out.stderr
    assert "does not match ingest.stream_host 'lab-pc-*'" in skipped[0]
    assert "starting this run's own SIMULATED headset" in out.stderr


@pytest.mark.slow
@pytest.mark.network
def test_fleet_lsl_worker_serves_only_its_selection_and_logs_each_stream(
    tmp_path: Path, mosquitto: MosquittoBroker, unique_id: str
) -> None:
    """Found 1: a fleet worker with --source lsl silently served streams other processes had
    started. It serves what --source-id (a pattern) names, and says for each stream why."""
    env = _env(mosquitto, unique_id)
    lab = [f"{unique_id}-lab-1", f"{unique_id}-lab-2"]
    other = f"{unique_id}-other"
    ledger_path = tmp_path / "w.sqlite"
    with headsets(unique_id, *lab, other, None) as heads:
        worker = subprocess.Popen(
            [sys.executable, "-m", "gazeguard", "run", "--fleet", "--source", "lsl",
             "--source-id", f"{unique_id}-lab-*", "--broker", mosquitto.address,
             "--ledger", str(ledger_path), *FAST],
            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
        )  # fmt: skip
        deadline = time.monotonic() + 40
        done: set[str] = set()
        try:
            while time.monotonic() < deadline and len(done) < 2:
                time.sleep(0.5)
                if ledger_path.exists():
                    with Ledger(ledger_path, create=False) as ledger:
                        done = {s for s in ledger.sessions() if ledger.state(s).chunks >= 1}
            time.sleep(2)  # another discovery round: nothing else is taken
        finally:
            worker.terminate()
            _, err = worker.communicate(timeout=30)
        sim = heads[3].source_id
    assert worker.returncode == 0, err
    assert done == set(lab), err
    with Ledger(ledger_path, create=False) as ledger:
        assert sorted(ledger.sessions()) == lab
    lines = err.splitlines()
    for sid in lab:
        taken = [ln for ln in lines if "taking LSL stream" in ln and repr(sid) in ln]
        assert len(taken) == 1, err
    for sid in (other, sim):
        skipped = [ln for ln in lines if "skipping LSL stream" in ln and f"source_id {sid!r}" in ln]
        assert len(skipped) == 1, err  # once, however many discovery rounds
        assert f"does not match ingest.source_id '{unique_id}-lab-*'" in skipped[0]


@pytest.mark.slow
@pytest.mark.network
def test_a_stop_while_discovery_resolves_takes_no_stream_again(
    tmp_path: Path,
    mosquitto: MosquittoBroker,
    unique_id: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stop that lands while a discovery round resolves ends the streams' sessions; that round
    must take no stream again (CI, 12-08: a stopped worker said "taking LSL stream" twice for
    one stream). The resolve is the real one: once a session is fed, the next round sets the
    stop and returns only after the session closed, the order that raced."""
    settings = load_settings(
        None,
        device="fleet",
        fleet={"enabled": True, "discover_every_s": 0.2},
        ingest={"source": "lsl", "stream_type": unique_id},
        features={"window_s": 2.0, "step_s": 0.05},
        mechanism={"chunk_steps": 32, "epsilon": 0.5, "features": ["fixation_rate"]},
        ledger={"path": str(tmp_path / "l.sqlite"), "budget_per_hour": None},
        broker={"host": mosquitto.host, "port": mosquitto.port},
    )
    closed = threading.Event()
    fleets: list[Fleet] = []
    real_resolve = pylsl.resolve_bypred

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def resolve(*args: Any) -> list[pylsl.StreamInfo]:
            found: list[pylsl.StreamInfo] = real_resolve(*args)
            fed = fleets and any(e.samples for e in list(fleets[0].sessions.values()))
            if fed and not stop.is_set():
                loop.call_soon_threadsafe(stop.set)
                assert closed.wait(30), "the session did not close after the stop"
            return found

        def ready(fleet: Fleet) -> None:
            fleets.append(fleet)
            fleet.on_session = lambda e: closed.set() if e.event == "closed" else None

        monkeypatch.setattr(pylsl, "resolve_bypred", resolve)
        await asyncio.wait_for(serve_fleet(settings, stop=stop, ready=ready), 90)

    with headsets(unique_id, f"{unique_id}-1"), caplog.at_level(logging.WARNING):
        asyncio.run(main())
    taken = [m for m in caplog.messages if m.startswith(f"worker {fleets[0].worker_id}: taking")]
    assert len(taken) == 1, caplog.messages
    assert fleets[0].closed == [f"{unique_id}-1"]
