"""Shared fixtures: a real Mosquitto on a free loopback port, the shared recordings, unique ids."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from hypothesis import settings

from gazeguard.privacy.accounting import cache
from gazeguard.wire.label import LabelMessage
from gazeguard.wire.message import ChunkMessage, StatusMessage

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"

# Hypothesis: the test command is deterministic (same examples every run, so a red CI run is a
# reproducible defect, not luck); `GAZEGUARD_HYPOTHESIS=explore` draws fresh examples to hunt bugs.
settings.register_profile("repeatable", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("GAZEGUARD_HYPOTHESIS", "repeatable"))

# Each test process (and the processes its tests start, which inherit the variable) keeps its
# composition cache in a directory of its own: no test reads what another run left on disk.
_CACHE_DIR = tempfile.mkdtemp(prefix="gazeguard-test-cache-")
os.environ["GAZEGUARD_CACHE_DIR"] = _CACHE_DIR


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def until(predicate: Callable[[], bool], within_s: float) -> None:
    """Poll ``predicate`` every 20 ms until it holds; fail after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {within_s:g} s")


class MosquittoBroker:
    """A real Mosquitto process on 127.0.0.1:<port>; can be stopped and restarted on that port."""

    def __init__(self, workdir: Path, extra_config: str = "") -> None:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(exe).exists():
            pytest.fail("mosquitto is not installed: apt-get install -y mosquitto (see .ci/run)")
        self.exe = exe
        self.host = "127.0.0.1"
        self.port = free_port()
        self.workdir = workdir
        self.conf = workdir / "mosquitto.conf"
        self.log = workdir / "mosquitto.log"
        body = extra_config or "allow_anonymous true\n"
        # As root, Mosquitto drops to user "mosquitto", which cannot write the test's tmp dir.
        user = "user root\n" if os.geteuid() == 0 else ""
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n{user}log_dest file {self.log}\n"
            f"log_type all\n{body}" + ("" if "persistence" in body else "persistence false\n")
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.killed = False  # a stop needed SIGKILL (see stop)

    def start(self) -> None:
        """Start (or restart) the broker and wait until every listener of its configuration
        accepts connections (Mosquitto opens them one after another: a test that went on once
        the first answered was refused on the second, its TLS port, under load)."""
        self.proc = subprocess.Popen([self.exe, "-c", str(self.conf)])
        ports = [int(p) for p in re.findall(r"^listener\s+(\d+)", self.conf.read_text(), re.M)]
        waiting = ports or [self.port]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.proc.poll() is None:
            waiting = [port for port in waiting if not self._accepts(port)]
            if not waiting:
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"mosquitto did not open port(s) {waiting}; see {self.log}")

    @property
    def address(self) -> str:
        """``host:port``, as ``--broker`` takes it."""
        return f"{self.host}:{self.port}"

    def _accepts(self, port: int) -> bool:
        try:
            with socket.create_connection((self.host, port), timeout=0.2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """Stop the broker: SIGTERM, and SIGKILL only if it has not exited 30 s later.

        A clean exit saves a persistent broker's state (sessions, queued messages); a SIGKILL
        turns "an outage" into "a crash that lost the last autosave interval", so it is
        recorded in :attr:`killed` for the tests whose scenario needs the clean exit."""
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.killed = True
            self.proc = None


def publish(broker: MosquittoBroker, topic: str, payload: bytes) -> None:
    """Publish one message with QoS 1 and wait for its PUBACK (as a test's own client)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        client.publish(topic, payload, qos=1).wait_for_publish(10)
    finally:
        client.disconnect()  # first: the network thread then ends at once
        client.loop_stop()


class Subscriber:
    """A paho-mqtt client collecting every message on ``#`` (persistent session, QoS 1)."""

    def __init__(self, broker: MosquittoBroker, client_id: str) -> None:
        self.messages: list[tuple[str, bytes, bool]] = []
        self.lock = threading.Lock()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False
        )
        self.client.on_connect = lambda c, *_: c.subscribe("#", qos=1)
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(0.1, 0.5)
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()

    def _on_message(self, _c: object, _u: object, msg: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages.append((msg.topic, bytes(msg.payload), bool(msg.retain)))

    def chunks(self) -> list[ChunkMessage]:
        with self.lock:
            return [
                ChunkMessage.from_payload(p) for t, p, _ in self.messages if t.endswith("/chunks")
            ]

    def labels(self) -> list[LabelMessage]:
        with self.lock:
            return [
                LabelMessage.model_validate_json(p)
                for t, p, _ in self.messages
                if t.endswith("/labels")
            ]

    def statuses(self) -> list[StatusMessage]:
        with self.lock:
            return [
                StatusMessage.from_payload(p) for t, p, _ in self.messages if t.endswith("/status")
            ]

    def wait_for(self, predicate: object, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():  # type: ignore[operator]
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[MosquittoBroker]:
    """A running Mosquitto on a free loopback port, stopped after the test."""
    broker = MosquittoBroker(tmp_path)
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def shared_data() -> Path:
    """``../shared/data``; the test is skipped, naming the path, where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared recordings not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def unique_id(request: pytest.FixtureRequest) -> str:
    """A name unique to this test run: for LSL source ids, MQTT topics and sessions."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:40]
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return out


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that fails with an exception group reports its leaf exceptions first.

    A group's native traceback starts with pytest's own frames and ends with the errors that
    matter; CI logs are cut from the end, so the cause would be lost.
    """
    report = yield
    excinfo = call.excinfo
    if excinfo is not None and isinstance(excinfo.value, BaseExceptionGroup):
        import traceback  # noqa: PLC0415 - only on failure

        leaves = _leaves(excinfo.value)
        text = "".join(
            f"--- leaf {i + 1}/{len(leaves)}: "
            + "".join(traceback.format_exception(leaf, limit=-12))
            for i, leaf in enumerate(leaves)
        )
        report.longrepr = f"{type(excinfo.value).__name__} with {len(leaves)} leaves:\n{text}"
    return report


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove this process's composition cache. Pending entries are written first: the
    cache's own exit-time flush runs after this hook and would create the directory again."""
    cache.flush()
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)
