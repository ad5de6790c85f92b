"""The deployment files in ``deploy/`` do what they say.

The broker tests start the real Mosquitto with ``deploy/mosquitto/mosquitto.conf`` and
``deploy/mosquitto/acl`` as shipped, changing only what cannot be shipped: file paths (into
``tmp_path``) and ports (free loopback ports), plus one test-only user appended to the ACL,
``observer``, who may read everything, so that "nobody received it" can be checked for any topic.
Passwords are made with ``mosquitto_passwd -b``, certificates with
``deploy/mosquitto/make-dev-certs.sh``. Clients are plain paho-mqtt; the sidecar is the real
``gazeguard run`` in a subprocess, configured by ``deploy/config/simulated.toml``.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import queue
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.reasoncodes import ReasonCode
from pydantic import SecretStr

from gazeguard.cli import ExitCode
from gazeguard.cli import main as gazeguard_main
from gazeguard.config import BrokerSettings, load_settings
from gazeguard.core.errors import PublishError
from gazeguard.ledger import Ledger
from gazeguard.runtime.presets import PRESETS, ChannelDesc, StreamMeta, build_layout
from gazeguard.runtime.publish import Publisher
from gazeguard.wire.message import ChunkMessage, StatusMessage
from tests.conftest import REPO, MosquittoBroker, free_port

DEPLOY = REPO / "deploy"
CONFIGS = sorted((DEPLOY / "config").glob("*.toml"))
PREFIX = "gazeguard/v1"
DEVICE, OTHER_DEVICE, CONSUMER, OBSERVER = "hmd-01", "hmd-02", "dashboard", "observer"
WORKER = "fleet-worker-1"  # the fleet worker the shipped ACL names
NOT_AUTHORIZED = 0x87  # MQTT v5 reason code; paho reports 3.1.1's CONNACK 5 as this, too
BAD_LOGIN = {0x86, 0x87}  # "bad user name or password" / "not authorized"
WAIT_S = 10.0

pytestmark = pytest.mark.network


# ---------------------------------------------------------------------------------------------
# The example broker


@dataclass
class ExampleBroker:
    """Mosquitto running the example configuration: plain loopback listener + TLS listener."""

    broker: MosquittoBroker
    tls_port: int
    ca_file: Path
    passwords: dict[str, str]

    @property
    def port(self) -> int:
        """The plain loopback listener (the example's 1883)."""
        return self.broker.port


def adapt_mosquitto_conf(text: str, files: dict[str, Path], tls_port: int) -> str:
    """The example mosquitto.conf with test paths and ports; everything else unchanged.

    The loopback listener line is removed because :class:`MosquittoBroker` writes its own
    ``listener <port> 127.0.0.1`` first; the TLS listener moves to ``tls_port`` on loopback.
    """
    out, seen = [], set()
    for line in text.splitlines():
        words = line.split()
        key = words[0] if words and not line.startswith("#") else None
        if key == "listener" and words[1:] == ["1883", "127.0.0.1"]:
            seen.add("plain listener")
        elif key == "listener" and words[1:] == ["8883"]:
            seen.add("tls listener")
            out.append(f"listener {tls_port} 127.0.0.1")
        elif key in files:
            seen.add(key)
            out.append(f"{key} {files[key]}")
        else:
            out.append(line)
    expected = {"plain listener", "tls listener", *files}
    assert seen == expected, f"deploy/mosquitto/mosquitto.conf lacks {expected - seen}"
    return "\n".join(out) + "\n"


@pytest.fixture
def example_broker(tmp_path: Path) -> Iterator[ExampleBroker]:
    """The example Mosquitto configuration on free loopback ports, with fresh users and certs."""
    certs = tmp_path / "certs"
    subprocess.run(
        [str(DEPLOY / "mosquitto" / "make-dev-certs.sh"), str(certs)],
        check=True,
        capture_output=True,
    )
    users = (DEVICE, OTHER_DEVICE, CONSUMER, OBSERVER, WORKER)
    passwords = {u: secrets.token_urlsafe(12) for u in users}
    passwd = tmp_path / "passwd"
    for i, (user, password) in enumerate(passwords.items()):
        create = ["-c"] if i == 0 else []
        subprocess.run(["mosquitto_passwd", *create, "-b", str(passwd), user, password], check=True)
    acl = tmp_path / "acl"
    acl.write_text(
        (DEPLOY / "mosquitto" / "acl").read_text()
        + f"\n# test only: sees everything\nuser {OBSERVER}\ntopic read #\n"
    )
    tls_port = free_port()
    conf = adapt_mosquitto_conf(
        (DEPLOY / "mosquitto" / "mosquitto.conf").read_text(),
        {
            "password_file": passwd,
            "acl_file": acl,
            "cafile": certs / "ca.crt",
            "certfile": certs / "server.crt",
            "keyfile": certs / "server.key",
        },
        tls_port,
    )
    broker = MosquittoBroker(tmp_path, conf)
    try:
        broker.start()
        yield ExampleBroker(broker, tls_port, certs / "ca.crt", passwords)
    finally:
        broker.stop()


class Client:
    """A paho-mqtt client on its own network thread, recording CONNACK, PUBACKs and messages."""

    def __init__(
        self,
        port: int,
        username: str | None,
        password: str | None,
        *,
        protocol: MQTTProtocolVersion = MQTTProtocolVersion.MQTTv5,
        ca_file: Path | None = None,
    ) -> None:
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connack: ReasonCode | None = None
        self._connected = threading.Event()
        self._acks: dict[int, ReasonCode] = {}
        self._acked = threading.Condition()
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"{username}-{secrets.token_hex(4)}",
            protocol=protocol,
        )
        if username is not None:
            self._client.username_pw_set(username, password)
        if ca_file is not None:
            self._client.tls_set_context(ssl.create_default_context(cafile=str(ca_file)))
        self._client.on_connect = self._on_connect
        self._client.on_message = lambda _c, _u, msg: self.messages.put(msg)
        self._client.on_publish = self._on_publish
        self._client.connect("127.0.0.1", port, keepalive=30)
        self._client.loop_start()
        if not self._connected.wait(WAIT_S):
            self.close()
            pytest.fail(f"no CONNACK from the broker on port {port} within {WAIT_S} s")

    def _on_connect(self, _c: Any, _u: Any, _f: Any, rc: ReasonCode, _p: Any = None) -> None:
        self.connack = rc
        self._connected.set()
        if rc.is_failure:
            self._client.disconnect()  # no automatic reconnect with refused credentials

    def _on_publish(self, _c: Any, _u: Any, mid: int, rc: ReasonCode, _p: Any = None) -> None:
        with self._acked:
            self._acks[mid] = rc
            self._acked.notify_all()

    def subscribe(self, *topics: str) -> None:
        """Subscribe with QoS 1 and wait for the SUBACK."""
        done = threading.Event()
        self._client.on_subscribe = lambda *_a: done.set()
        self._client.subscribe([(t, 1) for t in topics])
        assert done.wait(WAIT_S), f"no SUBACK for {topics}"

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> ReasonCode:
        """Publish with QoS 1 and return the PUBACK's reason code (always success on 3.1.1)."""
        info = self._client.publish(topic, payload, qos=1, retain=retain)
        with self._acked:
            assert self._acked.wait_for(lambda: info.mid in self._acks, WAIT_S), "no PUBACK"
            return self._acks.pop(info.mid)

    def next_message(self, timeout: float = WAIT_S) -> mqtt.MQTTMessage:
        """The next message received, or a test failure after ``timeout`` s."""
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no message within {timeout} s")

    def close(self) -> None:
        """Disconnect and stop the network thread."""
        self._client.disconnect()
        self._client.loop_stop()


@pytest.fixture
def clients() -> Iterator[list[Client]]:
    """Clients created by a test; closed afterwards."""
    made: list[Client] = []
    yield made
    for c in made:
        c.close()


def connect(
    clients: list[Client], broker: ExampleBroker, user: str, *, tls: bool = False, **kw: Any
) -> Client:
    """A connected client of ``user`` (its real password) on the plain or the TLS listener."""
    port, ca = (broker.tls_port, broker.ca_file) if tls else (broker.port, None)
    c = Client(port, user, broker.passwords[user], ca_file=ca, **kw)
    clients.append(c)
    assert c.connack is not None
    assert not c.connack.is_failure, f"{user} refused: {c.connack}"
    return c


def observe_everything(clients: list[Client], broker: ExampleBroker) -> Client:
    """The observer, connected and subscribed to every topic (``#``)."""
    observer = connect(clients, broker, OBSERVER)
    observer.subscribe("#")
    return observer


def assert_only_sentinel_arrives(observer: Client, sentinel: bytes) -> None:
    """The observer's next message is ``sentinel`` and nothing came before it.

    Mosquitto handles one client's PUBLISH completely (routing included) before it sends the
    PUBACK, so anything published and acknowledged before the sentinel would have reached the
    observer before the sentinel did.
    """
    msg = observer.next_message()
    assert msg.payload == sentinel, f"observer received {msg.topic!r}: {msg.payload!r}"
    assert observer.messages.empty()


def assert_only_the_device_arrives(
    clients: list[Client], broker: ExampleBroker, observer: Client, session: str
) -> None:
    """The device, logged in as itself, publishes a sentinel on its session's chunks topic: the
    observer gets it and nothing before it (:func:`assert_only_sentinel_arrives`)."""
    device = connect(clients, broker, DEVICE)
    sentinel = f"sentinel {session}".encode()
    assert not device.publish(f"{PREFIX}/{DEVICE}/{session}/chunks", sentinel).is_failure
    assert_only_sentinel_arrives(observer, sentinel)


#: Each test so marked runs over MQTT 5 and 3.1.1.
PROTOCOLS = pytest.mark.parametrize(
    "protocol", [MQTTProtocolVersion.MQTTv5, MQTTProtocolVersion.MQTTv311], ids=["v5", "v3.1.1"]
)


def forge(client: Client, topics: list[str], protocol: MQTTProtocolVersion) -> None:
    """``client`` publishes ``b"forged"`` on each of ``topics`` (retained on a status topic);
    over MQTT 5 the broker refuses each (not authorized). Over 3.1.1 a refusal is silent: the
    test's observer tells."""
    for topic in topics:
        rc = client.publish(topic, b"forged", retain=topic.endswith("status"))
        if protocol == MQTTProtocolVersion.MQTTv5:
            assert rc.value == NOT_AUTHORIZED, f"{topic}: {rc}"


# ---------------------------------------------------------------------------------------------
# (1) the sidecar publishes with its credentials; a consumer receives privatized chunks over TLS


def _deny_write_execute_then_exec() -> list[str]:
    """A Python prefix that sets PR_SET_MDWE (what MemoryDenyWriteExecute=yes enforces) if the
    kernel has it (Linux >= 6.3) and then executes the rest of the command line."""
    code = (
        "import ctypes, os, sys\n"
        "ctypes.CDLL(None, use_errno=True).prctl(65, 1, 0, 0, 0)\n"
        "os.execv(sys.argv[1], sys.argv[1:])\n"
    )
    return [sys.executable, "-c", code]


def _kernel_has_mdwe() -> bool:
    """Whether prctl(PR_GET_MDWE) works here (Linux >= 6.3)."""
    return bool(ctypes.CDLL(None).prctl(66, 0, 0, 0, 0) >= 0)


class Sidecar:
    """``gazeguard run --config deploy/config/simulated.toml`` in a subprocess against the broker.

    Feature window 2 s, step 0.05 s, 32 steps per chunk: the first chunk after about 4 s. Runs
    under PR_SET_MDWE (no writable+executable memory, as the systemd unit's
    MemoryDenyWriteExecute=yes) where the kernel has it. stderr is collected line by line.
    """

    def __init__(
        self, broker: ExampleBroker, ledger: Path, session: str, username: str = DEVICE
    ) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GAZEGUARD_")}
        env |= {
            "GAZEGUARD_BROKER__PORT": str(broker.port),
            "GAZEGUARD_BROKER__USERNAME": username,
            "GAZEGUARD_BROKER__PASSWORD": broker.passwords[username],
            "GAZEGUARD_LEDGER__PATH": str(ledger),
            # A simulated person (and LSL source_id) no other test on this network uses.
            "GAZEGUARD_INGEST__SIMULATED_SEED": str(secrets.randbelow(10**9) + 10**6),
        }
        command = [sys.executable, "-m", "gazeguard", "run", "--config"]
        command += [str(DEPLOY / "config" / "simulated.toml"), "--session", session, "--quiet"]
        command += ["--window-s", "2", "--step-s", "0.05", "--chunk-steps", "32"]
        prefix = _deny_write_execute_then_exec() if _kernel_has_mdwe() else []
        self.proc = subprocess.Popen(
            prefix + command, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
        self.lines: list[str] = []
        self._new_line = threading.Condition()
        self._reader = threading.Thread(target=self._read, name="sidecar-stderr", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._new_line:
                self.lines.append(line)
                self._new_line.notify_all()

    @property
    def stderr(self) -> str:
        """Everything the service wrote to stderr so far."""
        return "".join(self.lines)

    def alive(self) -> None:
        """Fail the test, with the service's stderr, if it has exited."""
        assert self.proc.poll() is None, f"gazeguard run exited: {self.stderr}"

    def wait_for_line(self, pattern: str, timeout: float) -> str:
        """The first stderr line matching ``pattern``; fails after ``timeout`` s."""
        with self._new_line:
            found = self._new_line.wait_for(
                lambda: any(re.search(pattern, line) for line in self.lines), timeout
            )
        assert found, f"no {pattern!r} in the service's stderr within {timeout} s: {self.stderr}"
        return next(line for line in self.lines if re.search(pattern, line))

    def stop(self) -> int:
        """SIGTERM, as systemd and Docker stop it; the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        status = self.proc.wait(30)
        self._reader.join(WAIT_S)
        return status

    def __enter__(self) -> Sidecar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(WAIT_S)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.mark.slow
def test_sidecar_publishes_with_its_credentials_and_consumer_reads_over_tls(
    example_broker: ExampleBroker, clients: list[Client], tmp_path: Path, unique_id: str
) -> None:
    consumer = connect(clients, example_broker, CONSUMER, tls=True)
    chunks, status = (f"{PREFIX}/{DEVICE}/{unique_id}/{kind}" for kind in ("chunks", "status"))
    consumer.subscribe(chunks, status)
    with Sidecar(example_broker, tmp_path / "ledger.sqlite", unique_id) as sidecar:
        received: list[ChunkMessage] = []
        states: list[str] = []
        deadline = time.monotonic() + 40
        while len(received) < 2:
            sidecar.alive()
            assert time.monotonic() < deadline, f"no chunks within 40 s: {sidecar.stderr}"
            try:
                msg = consumer.messages.get(timeout=0.5)
            except queue.Empty:
                continue
            if msg.topic == chunks:
                received.append(ChunkMessage.model_validate_json(msg.payload))
            else:
                states.append(StatusMessage.model_validate_json(msg.payload).state)
        assert sidecar.stop() == 0, sidecar.stderr
    assert re.search(r"\d+ chunks? released", sidecar.stderr), sidecar.stderr

    assert [c.chunk_index for c in received] == [0, 1]
    for c in received:
        assert (c.device, c.session) == (DEVICE, unique_id)
        assert c.mechanism.name == "dcfpa"
        assert c.mechanism.randomness == "os-csprng"
        # pure ε: each feature's ε rounded up to a whole micro-ε by the ledger
        releases = (c.chunk_index + 1) * len(c.features)
        spent = (c.chunk_index + 1) * c.ledger.chunk_epsilon
        assert spent <= c.ledger.session_spent <= spent + releases * 1e-6
        assert c.ledger.epsilon <= c.ledger.session_spent  # the accountant's ε at δ
        assert c.ledger.window_cap == 10.0  # the shipped config's budget per hour
    assert states
    assert states[0] in {"starting", "running"}

    # After SIGTERM the retained status says "stopped", and every charged chunk was delivered.
    late = connect(clients, example_broker, CONSUMER, tls=True)
    late.subscribe(status)
    final = StatusMessage.model_validate_json(late.next_message().payload)
    assert (final.state, final.session, final.device) == ("stopped", unique_id, DEVICE)
    with Ledger(tmp_path / "ledger.sqlite", create=False) as ledger:
        state = ledger.state(unique_id)
    assert state.pending == 0
    assert state.chunks == final.chunks_charged >= len(received)


@pytest.mark.slow
def test_sidecar_with_another_devices_login_is_refused_and_its_chunks_moved_aside(
    example_broker: ExampleBroker, clients: list[Client], tmp_path: Path, unique_id: str
) -> None:
    """device = hmd-01 but logged in as hmd-02: every publish is refused and says why; each
    refused chunk is moved aside in the ledger (its ε stays spent), never delivered."""
    observer = observe_everything(clients, example_broker)
    ledger_path = tmp_path / "ledger.sqlite"
    with Sidecar(example_broker, ledger_path, unique_id, username=OTHER_DEVICE) as sidecar:
        line = sidecar.wait_for_line(r"broker refused chunk 0 ", 40)
        assert f"'{PREFIX}/{DEVICE}/{unique_id}/chunks'" in line
        assert "Not authorized" in line
        assert sidecar.stop() == ExitCode.REFUSED, sidecar.stderr
    with Ledger(ledger_path, create=False) as ledger:
        state = ledger.state(unique_id)
        refused = ledger.refused(unique_id)
    assert state.chunks >= 1
    assert state.refused + state.pending == state.chunks  # charged; none delivered
    assert state.refused >= 1
    assert all("Not authorized" in r.reason for r in refused)
    assert_only_the_device_arrives(clients, example_broker, observer, unique_id)


# ---------------------------------------------------------------------------------------------
# (2) wrong credentials are refused on both listeners, with a clear CONNACK / error


@PROTOCOLS
@pytest.mark.parametrize("tls", [False, True], ids=["loopback", "tls"])
@pytest.mark.parametrize(
    ("user", "password"),
    [(DEVICE, "wrong-password"), ("nobody", "whatever"), (None, None)],
    ids=["wrong-password", "unknown-user", "anonymous"],
)
def test_wrong_credentials_are_refused(
    example_broker: ExampleBroker,
    clients: list[Client],
    protocol: MQTTProtocolVersion,
    tls: bool,
    user: str | None,
    password: str | None,
) -> None:
    port = example_broker.tls_port if tls else example_broker.port
    c = Client(
        port, user, password, protocol=protocol, ca_file=example_broker.ca_file if tls else None
    )
    clients.append(c)
    assert c.connack is not None
    assert c.connack.is_failure
    assert c.connack.value in BAD_LOGIN, str(c.connack)


def test_sidecar_with_a_wrong_password_says_what_to_check(
    example_broker: ExampleBroker, tmp_path: Path
) -> None:
    settings = BrokerSettings(
        host="127.0.0.1",
        port=example_broker.port,
        username=DEVICE,
        password=SecretStr("wrong-password"),
    )

    async def scenario() -> None:
        with Ledger(tmp_path / "ledger.sqlite") as ledger:
            async with Publisher(settings, ledger, connect_timeout=WAIT_S):
                pass

    with pytest.raises(PublishError, match=r"login refused for user 'hmd-01'.*broker\.password"):
        asyncio.run(scenario())


def test_tls_listener_is_refused_without_the_dev_ca(example_broker: ExampleBroker) -> None:
    context = ssl.create_default_context()  # the system CAs only
    with (
        socket.create_connection(("127.0.0.1", example_broker.tls_port), WAIT_S) as raw,
        pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"),
    ):
        context.wrap_socket(raw, server_hostname="localhost")


# ---------------------------------------------------------------------------------------------
# (3) consumers read only privatized topics and can never write


@PROTOCOLS
def test_consumer_cannot_write(
    example_broker: ExampleBroker,
    clients: list[Client],
    protocol: MQTTProtocolVersion,
    unique_id: str,
) -> None:
    observer = observe_everything(clients, example_broker)
    consumer = connect(clients, example_broker, CONSUMER, tls=True, protocol=protocol)
    targets = [
        f"{PREFIX}/{DEVICE}/{unique_id}/chunks",  # forging a device's chunks
        f"{PREFIX}/{DEVICE}/{unique_id}/status",  # or its retained status
        f"{PREFIX}/{CONSUMER}/{unique_id}/chunks",  # posing as a device named like itself
        f"{PREFIX}/{DEVICE}/{unique_id}/raw",
        f"consumer-notes/{unique_id}",
    ]
    forge(consumer, targets, protocol)
    assert_only_the_device_arrives(clients, example_broker, observer, unique_id)
    # Nothing was retained either: a new subscriber to the status topic gets no message.
    fresh = connect(clients, example_broker, OBSERVER)
    fresh.subscribe(f"{PREFIX}/{DEVICE}/{unique_id}/status")
    with pytest.raises(queue.Empty):
        fresh.messages.get(timeout=0.5)


def test_consumer_reads_only_the_privatized_releases_and_status(
    example_broker: ExampleBroker, clients: list[Client], unique_id: str
) -> None:
    """A consumer reads chunks, status, labels, cohort aggregates and attention; not raw or debug
    topics, nor a session's cohort receipts."""
    consumer = connect(clients, example_broker, CONSUMER, tls=True)
    consumer.subscribe(f"{PREFIX}/#", f"other/{unique_id}/#")
    device = connect(clients, example_broker, DEVICE)
    base = f"{PREFIX}/{DEVICE}/{unique_id}"
    hidden = (f"{base}/raw", f"{base}/chunks/extra", f"{base}/debug", f"{base}/cohort")
    for topic in hidden:
        assert not device.publish(topic, b"not for consumers").is_failure
    assert not device.publish(f"{base}/status", b"status", retain=True).is_failure
    assert not device.publish(f"{base}/chunks", b"chunk").is_failure
    assert not device.publish(f"{base}/labels", b"label").is_failure
    worker = connect(clients, example_broker, WORKER)
    cohort = f"{PREFIX}/cohort/{unique_id}"
    assert not worker.publish(f"{cohort}/aggregates", b"aggregate").is_failure
    assert not worker.publish(f"{cohort}/attention", b"attention").is_failure
    got = sorted((m.topic, m.payload) for m in [consumer.next_message() for _ in range(5)])
    assert got == sorted(
        [
            (f"{base}/status", b"status"),
            (f"{base}/chunks", b"chunk"),
            (f"{base}/labels", b"label"),
            (f"{cohort}/aggregates", b"aggregate"),
            (f"{cohort}/attention", b"attention"),
        ]
    )
    assert consumer.messages.empty()


# ---------------------------------------------------------------------------------------------
# (4) a device writes only its own topics


@PROTOCOLS
def test_device_cannot_write_another_devices_topics(
    example_broker: ExampleBroker,
    clients: list[Client],
    protocol: MQTTProtocolVersion,
    unique_id: str,
) -> None:
    observer = observe_everything(clients, example_broker)
    intruder = connect(clients, example_broker, OTHER_DEVICE, protocol=protocol)
    targets = [
        f"{PREFIX}/{DEVICE}/{unique_id}/chunks",
        f"{PREFIX}/{DEVICE}/{unique_id}/status",
        f"{PREFIX}/{unique_id}/{OTHER_DEVICE}/chunks",  # its name one level too deep
    ]
    forge(intruder, targets, protocol)
    # Its own subtree it may write (the positive control, and the sentinel).
    sentinel = f"sentinel {unique_id}".encode()
    rc = intruder.publish(f"{PREFIX}/{OTHER_DEVICE}/{unique_id}/chunks", sentinel)
    assert not rc.is_failure
    assert_only_sentinel_arrives(observer, sentinel)


# ---------------------------------------------------------------------------------------------
# (4b) a fleet publishes each headset's chunks under its device id; a headset reads only its own


def _received(client: Client, until: set[str] | None = None) -> list[mqtt.MQTTMessage]:
    """Every message the client has received so far (taken from its queue); with ``until``,
    wait for a message on each of those topics (not returned) and return all before them."""
    out: list[mqtt.MQTTMessage] = []
    waiting = set(until or ())
    while True:
        try:
            msg = client.messages.get(timeout=WAIT_S) if waiting else client.messages.get_nowait()
        except queue.Empty:
            assert not waiting, f"no message on {waiting} within {WAIT_S} s"
            return out
        if msg.topic in waiting:
            waiting.discard(msg.topic)
            if not waiting:
                return out
        else:
            out.append(msg)


@pytest.mark.slow
def test_fleet_chunks_go_under_the_headsets_device_which_reads_its_own_and_no_other(
    example_broker: ExampleBroker, clients: list[Client], tmp_path: Path, unique_id: str
) -> None:
    """Issue 35.3: `forward --device hmd-01` ended up as gazeguard/v1/<worker's device>/hmd-01.…,
    outside the ACL model (device = username). A fleet worker (real `gazeguard run --fleet
    --source jetstream`, logging in as the ACL's fleet-worker-1) publishes two headsets' chunks
    under their device ids; on the shipped ACL with per-device credentials, each headset reads
    its own chunks and status and none of the other's. The worker says each session opened and
    closed in one line."""
    pytest.importorskip("nats", reason="nats-py is the 'fleet' extra")
    from gazeguard.config import NatsSettings  # noqa: PLC0415
    from gazeguard.runtime.jetstream import JetStreamSender  # noqa: PLC0415
    from gazeguard.runtime.simulate import simulate_gaze  # noqa: PLC0415
    from tests._nats_cluster import WorkerProc, single_node, stop_all, worker_env  # noqa: PLC0415

    readers = {
        name: connect(clients, example_broker, name) for name in (DEVICE, OTHER_DEVICE, OBSERVER)
    }
    for reader in readers.values():  # each device also asks for the other's topics
        reader.subscribe(*(f"{PREFIX}/{d}/#" for d in (DEVICE, OTHER_DEVICE)))
    server = single_node(tmp_path / "nats")
    env = worker_env([server.url], 2)
    env |= {"GAZEGUARD_BROKER__USERNAME": WORKER, "GAZEGUARD_BROKER__PASSWORD":
            example_broker.passwords[WORKER]}  # fmt: skip
    worker = WorkerProc(tmp_path, 0, f"127.0.0.1:{example_broker.port}", env)
    session = f"s-{unique_id}"[:60]
    keys = {d: f"{d}.{session}" for d in (DEVICE, OTHER_DEVICE)}

    async def headset(device: str, seed: int) -> None:  # as `gazeguard forward` sends
        gaze = simulate_gaze(8.0, 120.0, seed)
        async with JetStreamSender(
            NatsSettings(servers=[server.url]), device, session, rate_hz=120.0
        ) as out:
            for start in range(0, len(gaze), 120):
                await out.send(gaze.slice(start, start + 120))

    async def headsets() -> None:
        await asyncio.gather(headset(DEVICE, 1), headset(OTHER_DEVICE, 2))

    seen: list[mqtt.MQTTMessage] = []
    try:
        deadline = time.monotonic() + 30
        while "partitions of JetStream stream" not in worker.text():
            assert time.monotonic() < deadline, worker.text()
            time.sleep(0.05)
        asyncio.run(headsets())
        deadline = time.monotonic() + 60
        while {m.topic.split("/")[2] for m in seen if m.topic.endswith("/chunks")} != set(keys):
            assert time.monotonic() < deadline, (worker.text(), [m.topic for m in seen])
            seen += _received(readers[OBSERVER])
            time.sleep(0.1)
    finally:
        codes = stop_all([worker])
        server.stop()
    text = worker.text()
    assert codes == [0], text
    # Each device writes a sentinel to its own topics after the worker stopped: Mosquitto routes
    # publishes in order, so what a reader got before the sentinels is all it will ever get.
    sentinels = {d: f"{PREFIX}/{d}/sentinel-{unique_id}" for d in (DEVICE, OTHER_DEVICE)}
    for device, topic in sentinels.items():
        assert not readers[device].publish(topic, b"sentinel").is_failure
    got = {name: _received(readers[name], {sentinels[name]}) for name in sentinels}
    got[OBSERVER] = seen + _received(readers[OBSERVER], set(sentinels.values()))
    for device, key in keys.items():
        topics = {m.topic for m in got[device]}
        assert f"{PREFIX}/{device}/{key}/chunks" in topics, (device, topics, text)
        assert f"{PREFIX}/{device}/{key}/status" in topics, (device, topics)
        assert all(t.startswith(f"{PREFIX}/{device}/") for t in topics), (device, topics)
        chunks = [
            ChunkMessage.model_validate_json(m.payload)
            for m in got[device]
            if m.topic.endswith("/chunks")
        ]
        assert {(c.device, c.session) for c in chunks} == {(device, key)}
        assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
        states = [StatusMessage.model_validate_json(m.payload).state for m in got[device]
                  if m.topic.endswith("/status")]  # fmt: skip
        assert states[-1] == "stopped", states
        topic = f"{PREFIX}/{device}/{key}/chunks"
        opened = f"session {key} of device {device} opened → {topic}"
        assert text.count(opened) == 1, text
        assert len(re.findall(rf"session {key} of device {device} closed \(", text)) == 1, text
    # the observer (reads everything) saw both: the devices' silence about each other is the ACL
    assert {m.topic.split("/")[2] for m in got[OBSERVER]} == {DEVICE, OTHER_DEVICE}
    with Ledger(tmp_path / "ledger.sqlite", create=False) as ledger:
        assert ledger.refused() == []  # the ACL let the worker write every chunk


# ---------------------------------------------------------------------------------------------
# (5) example gazeguard configurations


def _stream_of(preset: str) -> StreamMeta:
    """What that vendor's LSL bridge announces (channel counts and names as in ingest.py)."""
    if preset == "pupil_capture":
        return StreamMeta("pupil_capture", "Gaze", "pc", 200.0, 22)
    if preset == "pupil_neon":
        return StreamMeta("Neon Companion_Neon Gaze", "Gaze", "neon", 200.0, 16)
    if preset == "tobii":
        return StreamMeta("Tobii", "Eyetracker", "tobii", 120.0, 6)
    if preset == "eyelink":
        return StreamMeta("EyeLink", "Gaze", "el", 1000.0, 10)
    assert preset == "generic"
    channels = tuple(
        ChannelDesc(label, "both", kind, unit)
        for label, kind, unit in (
            ("x", "ScreenX", "normalized"),
            ("y", "ScreenY", "normalized"),
            ("pupil", "Diameter", "mm"),
            ("confidence", "Confidence", "normalized"),
        )
    )
    return StreamMeta("tracker", "Gaze", "generic", 250.0, len(channels), channels=channels)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GAZEGUARD_* variables from the caller's environment leak into the settings."""
    for key in list(os.environ):
        if key.startswith("GAZEGUARD_"):
            monkeypatch.delenv(key)


def test_there_is_an_example_config_for_every_preset() -> None:
    names = {p.stem for p in CONFIGS}
    assert names >= {*PRESETS, "simulated"} - {"gazeguard"}


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_example_config_is_valid(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Valid, or (where /var/lib/gazeguard, which the systemd unit's StateDirectory= creates, is
    missing or not writable) refused with only the directory to create, as `run` refuses it."""
    state = Path("/var/lib/gazeguard")
    code = gazeguard_main(["config", "check", "--json", str(path)])
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout is JSON only
    if os.access(state, os.W_OK | os.X_OK):
        assert code == 0, captured.err
        assert report["valid"]
    else:
        assert code == ExitCode.ERROR
        (problem,) = report["problems"]
        assert problem["field"] == "ledger.path"
        assert f"directory {state} " in captured.err
    effective = report["settings"]
    settings = load_settings(path)
    assert effective["device"] == settings.device
    # The ACL lets a device write only gazeguard/v1/<its username>/#.
    assert settings.broker.username == settings.device
    assert settings.broker.topic_prefix == PREFIX
    assert settings.broker.password is None, "passwords belong in the environment, not the file"
    assert settings.ledger.path == Path("/var/lib/gazeguard/ledger.sqlite")
    if settings.ingest.source == "simulated":
        return
    assert settings.ingest.preset == path.stem
    # The preset accepts that vendor's stream with this file's geometry (checked at stream open).
    layout = build_layout(_stream_of(path.stem), settings.ingest)
    assert layout.preset == path.stem


# ---------------------------------------------------------------------------------------------
# systemd unit, container files


def test_systemd_unit_creates_the_shipped_configs_ledger_directory() -> None:
    """Found 2: every shipped config keeps its ledger in /var/lib/gazeguard; the unit creates it
    (StateDirectory=, owned by its dynamic user) before `gazeguard run` checks it."""
    unit = (REPO / "deploy" / "systemd" / "gazeguard.service").read_text()
    assert "\nStateDirectory=gazeguard\n" in unit
    assert "GAZEGUARD_LEDGER__PATH=/var/lib/gazeguard/ledger.sqlite" in unit
    for path in CONFIGS:
        assert load_settings(path).ledger.path.parent == Path("/var/lib/gazeguard"), path


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed: cannot verify deploy/systemd/gazeguard.service")
    exe = shutil.which("gazeguard") or pytest.fail("the gazeguard console script is not on PATH")
    unit = (DEPLOY / "systemd" / "gazeguard.service").read_text()
    assert "ExecStart=/opt/gazeguard/bin/gazeguard run" in unit
    local = tmp_path / "gazeguard.service"
    local.write_text(unit.replace("/opt/gazeguard/bin/gazeguard", exe))
    verify = subprocess.run(
        [analyze, "verify", str(local)], capture_output=True, text=True, check=False
    )
    # Unknown or misspelt directives are only warnings: any output at all is a failure.
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
    security = subprocess.run(
        [analyze, "security", "--offline=true", str(local)],
        capture_output=True,
        text=True,
        check=False,
    )
    score = re.search(r"Overall exposure level for \S+: ([\d.]+)", security.stdout)
    if security.returncode != 0 or score is None:
        pytest.skip(f"systemd-analyze security --offline unavailable: {security.stderr.strip()}")
    assert float(score.group(1)) <= 2.0, security.stdout


def test_compose_and_dockerfile_reference_what_exists() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.replace("${GAZEGUARD_PRESET:-simulated}", "simulated").split(":")[0]
            if source.startswith("./"):
                path = DEPLOY / source
                made_by_user = path.name == "passwd" or path.name == "certs"
                assert made_by_user or path.exists(), f"{name}: {source} does not exist"
    build = services["gazeguard"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    allowed = {
        line[1:]
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    copies = re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile, flags=re.MULTILINE)
    assert copies
    for src in " ".join(copies).split():
        assert (REPO / src).exists(), f"Dockerfile copies {src}, which does not exist"
        assert src in allowed, f"Dockerfile copies {src}, which the .dockerignore excludes"
    assert re.search(r'^ENTRYPOINT \["gazeguard", "run"\]$', dockerfile, flags=re.MULTILINE)
    assert re.search(r"^USER gazeguard$", dockerfile, flags=re.MULTILINE)
