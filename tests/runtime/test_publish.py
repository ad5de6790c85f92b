"""The publisher against a real Mosquitto: ordered at-least-once delivery of the ledger outbox.

Every test uses a real broker process (``mosquitto`` fixture or a configured
:class:`MosquittoBroker`), a real SQLite ledger in ``tmp_path`` and plain aiomqtt subscribers.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiomqtt
import jsonschema
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from gazeguard.config import BrokerSettings
from gazeguard.core.errors import ConfigError, PublishError
from gazeguard.ledger import Charge, Ledger, pure_cost
from gazeguard.ledger.outbox import OutboxEntry
from gazeguard.runtime.publish import Publisher
from gazeguard.runtime.tail import TailProfile
from gazeguard.wire.message import (
    ChunkMessage,
    LedgerSnapshot,
    StatusMessage,
    shipped_schema,
)
from gazeguard.wire.topics import chunk_topic, status_topic
from tests.conftest import MosquittoBroker, free_port
from tests.wire._params import mechanism_params, status_message

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]

PREFIX = "gazeguard/v1"
DEVICE = "hmd"
F, N = 3, 8
EPS = {f"feature_{i}": 0.25 for i in range(F)}


def charge_chunk(ledger: Ledger, session: str, index: int) -> Charge:
    """Charge chunk ``index`` of ``session`` with a schema-valid chunk message as payload."""
    rng = np.random.default_rng(index)
    mechanism = mechanism_params(
        F,
        N,
        k=2,
        m=3,
        epsilon=list(EPS.values()),
        noise_scale=[2.0] * F,
        sensitivity=[1.5] * F,
        randomness="INSECURE-seeded",
    )

    preview = ledger.preview(session, pure_cost(EPS))
    body = ChunkMessage.build(
        session=session,
        device=DEVICE,
        chunk_index=index,
        timestamps=10.0 + 0.5 * (index * N + np.arange(N)),
        features=list(EPS),
        units=["1/s"] * F,
        values=rng.normal(size=(F, N)),
        mechanism=mechanism,
        ledger=LedgerSnapshot.from_state(sum(EPS.values()), preview.state),
        unix_offset=1.7e9,
    ).to_payload()
    topic = chunk_topic(PREFIX, DEVICE, session)
    return ledger.charge(session, index, pure_cost(EPS), topic, body, version=preview.version)


def settings_for(broker: MosquittoBroker, **kw: Any) -> BrokerSettings:
    return BrokerSettings(host=broker.host, port=broker.port, reconnect_max_s=0.5, **kw)


class Subscriber:
    """A plain aiomqtt consumer that collects messages, reconnecting if the broker restarts."""

    def __init__(self, port: int, topic: str, *, identifier: str | None = None, **kw: Any) -> None:
        self.port, self.topic, self.identifier, self.kw = port, topic, identifier, kw
        self.messages: list[aiomqtt.Message] = []
        self.subscribed = asyncio.Event()
        self.arrived = asyncio.Condition()

    async def run(self) -> None:
        while True:
            try:
                async with aiomqtt.Client(
                    "127.0.0.1",
                    self.port,
                    identifier=self.identifier,
                    clean_session=self.identifier is None,
                    **self.kw,
                ) as client:
                    await client.subscribe(self.topic, qos=1)
                    self.subscribed.set()
                    async for message in client.messages:
                        async with self.arrived:
                            self.messages.append(message)
                            self.arrived.notify_all()
            except aiomqtt.MqttError:
                await asyncio.sleep(0.05)

    @property
    def payloads(self) -> list[bytes]:
        return [bytes(m.payload) for m in self.messages if isinstance(m.payload, bytes)]

    async def wait_for(self, count: int, within: float = 10.0) -> None:
        async with asyncio.timeout(within), self.arrived:
            await self.arrived.wait_for(lambda: len(self.messages) >= count)


@asynccontextmanager
async def subscribed(port: int, topic: str, **kw: Any) -> AsyncIterator[Subscriber]:
    sub = Subscriber(port, topic, **kw)
    task = asyncio.create_task(sub.run())
    try:
        async with asyncio.timeout(10):
            await sub.subscribed.wait()
        yield sub
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def chunk_indexes(payloads: list[bytes]) -> list[int]:
    return [ChunkMessage.from_payload(p).chunk_index for p in payloads]


# ---------------------------------------------------------------------------------------------


def test_delivers_outbox_in_order_after_puback(
    mosquitto: MosquittoBroker, tmp_path: Path, unique_id: str
) -> None:
    """Items charged before and while running arrive once each, in order, byte for byte."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    charged = [charge_chunk(ledger, unique_id, i) for i in range(10)]
    schema = shipped_schema("chunk.schema.json")

    async def scenario() -> None:
        topic = chunk_topic(PREFIX, DEVICE, unique_id)
        acked: list[int] = []
        sent: list[int] = []

        def on_sent(item: OutboxEntry) -> None:
            sent.append(item.id)
            tail.sent(item)

        def on_acked(item: OutboxEntry) -> None:
            assert item.id in sent  # each acknowledgement after its send
            acked.append(item.id)
            tail.acked(item)

        async with (
            subscribed(mosquitto.port, topic) as sub,
            Publisher(
                settings_for(mosquitto), ledger, connect_timeout=5, on_sent=on_sent,
                on_acked=on_acked,
            ) as pub,
        ):  # fmt: skip
            await pub.flush(10)
            assert acked == [c.outbox_id for c in charged]
            assert sent == acked
            assert ledger.pending() == []
            assert pub.delivered == 10
            for i in range(10, 15):
                charged.append(charge_chunk(ledger, unique_id, i))
                pub.notify()
            await pub.flush(10)
            await sub.wait_for(15)
            assert pub.connected
        assert chunk_indexes(sub.payloads) == list(range(15))
        assert all(m.qos == 1 and not m.retain for m in sub.messages)
        state = ledger.state(unique_id)
        for msg_bytes in sub.payloads:
            jsonschema.validate(json.loads(msg_bytes), schema)
        last = ChunkMessage.from_payload(sub.payloads[-1])
        assert last.ledger.session_spent == pytest.approx(state.spent)
        assert last.ledger.chunk_epsilon == pytest.approx(sum(EPS.values()))

    tail = TailProfile(registry := CollectorRegistry())
    asyncio.run(scenario())
    assert ledger.pending() == []
    assert ledger.state(unique_id).pending == 0
    assert [c.chunk_index for c in charged] == list(range(15))
    # the tail profile timed every acknowledgement from its send; these items were read from
    # the table (no charge time in hand), so none was timed from its charge
    assert registry.get_sample_value("gazeguard_broker_ack_seconds_count") == 15
    assert registry.get_sample_value("gazeguard_outbox_wait_seconds_count") == 0
    ledger.close()


@pytest.mark.slow
def test_handed_over_items_and_other_writers_both_arrive_in_order(
    mosquitto: MosquittoBroker, tmp_path: Path, unique_id: str
) -> None:
    """notify(items) sends from memory, yet items charged elsewhere still arrive while it streams.

    Session A is charged here and handed over on every notify (every 50 ms); session B is charged
    without a notify, as another process sharing the ledger would. B must be delivered within the
    poll interval although the publisher is never idle, and each session arrives in order, once.
    """
    ledger = Ledger(tmp_path / "ledger.sqlite")
    a, b = f"{unique_id}-a", f"{unique_id}-b"

    async def scenario() -> None:
        acked: dict[int, float] = {}
        async with (
            subscribed(mosquitto.port, f"{PREFIX}/{DEVICE}/+/chunks") as sub,
            Publisher(
                settings_for(mosquitto),
                ledger,
                connect_timeout=5,
                poll_interval_s=0.3,
                on_acked=lambda item: acked.setdefault(item.id, time.monotonic()),
            ) as pub,
        ):
            other: list[Charge] = []
            for i in range(30):
                charge = charge_chunk(ledger, a, i)
                (item,) = [it for it in ledger.pending() if it.id == charge.outbox_id]
                pub.notify([item])
                if i in (3, 4, 5):
                    other.append(charge_chunk(ledger, b, i - 3))
                await asyncio.sleep(0.05)
            streaming_ended = time.monotonic()
            assert all(acked.get(c.outbox_id, float("inf")) < streaming_ended for c in other)
            await pub.flush(10)
            await sub.wait_for(33)
            await asyncio.sleep(0.2)  # a duplicate would arrive now
        by_session: dict[str, list[int]] = {a: [], b: []}
        for payload in sub.payloads:
            message = ChunkMessage.from_payload(payload)
            by_session[message.session].append(message.chunk_index)
        assert by_session == {a: list(range(30)), b: [0, 1, 2]}

    asyncio.run(scenario())
    assert ledger.pending() == []
    ledger.close()


@pytest.mark.slow
@pytest.mark.parametrize("batch", [64, 2])  # 2: more handed-over items than it keeps in memory
def test_broker_restart_loses_nothing_duplicates_nothing(
    tmp_path: Path, unique_id: str, caplog: pytest.LogCaptureFixture, batch: int
) -> None:
    """Broker stopped mid-stream, chunks charged meanwhile, broker restarted: all arrive once."""
    broker = MosquittoBroker(
        tmp_path,
        f"allow_anonymous true\npersistence true\npersistence_location {tmp_path}/\n",
    )
    broker.start()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    topic = chunk_topic(PREFIX, DEVICE, unique_id)
    status = status_message(unique_id, DEVICE)

    async def scenario() -> None:
        # A persistent subscriber session: the broker keeps its queue across the restart.
        async with (
            subscribed(broker.port, topic, identifier=f"sub-{unique_id}") as sub,
            Publisher(settings_for(broker), ledger, connect_timeout=5, batch=batch) as pub,
        ):
            for i in range(5):
                charge_chunk(ledger, unique_id, i)
                pub.notify()
            pub.publish_status(status)
            await pub.flush(10)
            await sub.wait_for(5)
            await asyncio.sleep(0.2)  # let the subscriber's PUBACKs reach the broker
            broker.stop()
            for i in range(5, 10):
                charge = charge_chunk(ledger, unique_id, i)
                pub.notify([it for it in ledger.pending() if it.id == charge.outbox_id])
            await asyncio.sleep(1.0)  # retries fail and are logged meanwhile
            assert not pub.connected
            assert len(ledger.pending()) == 5
            broker.start()
            await pub.flush(15)
            await sub.wait_for(10, within=15)
            await asyncio.sleep(0.3)  # a duplicate would arrive now
            assert pub.connections == 2
        assert chunk_indexes(sub.payloads) == list(range(10))

    with caplog.at_level(logging.WARNING, logger="gazeguard.runtime.publish"):
        asyncio.run(scenario())
    broker.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "gazeguard.runtime.publish"]
    assert any(
        f"127.0.0.1:{broker.port}" in line and "next retry in" in line and "unreachable" in line
        for line in lines
    ), lines
    assert ledger.pending() == []
    ledger.close()


_CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from gazeguard.config import BrokerSettings
    from gazeguard.ledger import Ledger
    from gazeguard.runtime.publish import Publisher

    class SlowDisk:
        # The real ledger, with a slow commit after each pass's PUBACKs (as on a busy SD card).
        def __init__(self, ledger):
            self.ledger = ledger
        def pending(self, limit=None):
            return self.ledger.pending(limit)
        def enqueued_here(self, outbox_id):
            return self.ledger.enqueued_here(outbox_id)
        def mark_delivered_many(self, outbox_ids):
            time.sleep(0.2)
            return self.ledger.mark_delivered_many(outbox_ids)

    async def main():
        ledger = Ledger(sys.argv[1])
        settings = BrokerSettings(host="127.0.0.1", port=int(sys.argv[2]))
        async with Publisher(settings, SlowDisk(ledger), batch=4):
            await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_sigkilled_publisher_restarts_and_delivers_pending(
    mosquitto: MosquittoBroker, tmp_path: Path, unique_id: str
) -> None:
    """SIGKILL mid-drain; a new publisher on the same ledger delivers the rest, in order."""
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    for i in range(30):
        charge_chunk(ledger, unique_id, i)
    topic = chunk_topic(PREFIX, DEVICE, unique_id)

    async def scenario() -> list[bytes]:
        async with subscribed(mosquitto.port, topic) as sub:
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _CHILD, str(path), str(mosquitto.port)
            )
            try:
                await sub.wait_for(5, within=20)
            finally:
                os.kill(child.pid, signal.SIGKILL)
                await child.wait()
            left = ledger.pending()
            assert 0 < len(left) < 30
            async with Publisher(settings_for(mosquitto), ledger, connect_timeout=5) as pub:
                await pub.flush(15)
            await sub.wait_for(30, within=10)
            await asyncio.sleep(0.2)
            return sub.payloads

    payloads = asyncio.run(scenario())
    indexes = chunk_indexes(payloads)
    # At least once: only the chunks in flight when the process died may come twice, one pass
    # of the drain (the child's batch of 4), consecutive, each twice at most.
    deduped = list(dict.fromkeys(indexes))
    assert deduped == list(range(30))
    twice = sorted(i for i in deduped if indexes.count(i) > 1)
    assert len(indexes) - len(deduped) == len(twice) <= 4, indexes
    assert twice == list(range(twice[0], twice[0] + len(twice))) if twice else True, indexes
    assert ledger.pending() == []
    ledger.close()


def test_retained_status_latest_wins(
    mosquitto: MosquittoBroker, tmp_path: Path, unique_id: str
) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")

    def status(state: str, reason: str | None = None) -> StatusMessage:
        return StatusMessage.model_validate(
            {
                "session": unique_id,
                "device": DEVICE,
                "state": state,
                "time": time.time(),
                "spent": 2.0,
                "remaining": 0.1,
                "session_cap": 2.1,
                "chunks_charged": 8,
                "chunks_withheld": 1,
                "chunks_dropped": 0,
                "reason": reason,
            }
        )

    async def scenario() -> list[aiomqtt.Message]:
        async with Publisher(settings_for(mosquitto), ledger, connect_timeout=5) as pub:
            pub.publish_status(status("running"))
            pub.publish_status(status("budget_exhausted", "session cap 2.1 reached"))
            await pub.flush(5)
        # A consumer arriving later gets the latest status, retained.
        topic = status_topic(PREFIX, DEVICE, unique_id)
        async with subscribed(mosquitto.port, topic) as sub:
            await sub.wait_for(1)
            await asyncio.sleep(0.2)
            return sub.messages

    messages = asyncio.run(scenario())
    assert len(messages) == 1
    assert messages[0].retain
    got = StatusMessage.from_payload(bytes(messages[0].payload))  # type: ignore[arg-type]
    assert got.state == "budget_exhausted"
    jsonschema.validate(
        got.model_dump(mode="json", by_alias=True), shipped_schema("status.schema.json")
    )
    ledger.close()


def assert_refused(
    settings: BrokerSettings, ledger: Ledger, timeout_s: float, match: str, connected: str
) -> None:
    """A publisher with ``settings`` fails to connect within ``timeout_s`` seconds with a
    :class:`PublishError` matching ``match``; had it connected, the test fails saying
    ``connected``."""

    async def scenario() -> None:
        async with Publisher(settings, ledger, connect_timeout=timeout_s):
            pytest.fail(connected)

    with pytest.raises(PublishError, match=match):
        asyncio.run(scenario())


def test_unreachable_broker_fails_fast_naming_host_port(tmp_path: Path) -> None:
    port = free_port()  # nothing listens here
    ledger = Ledger(tmp_path / "ledger.sqlite")
    settings = BrokerSettings(host="127.0.0.1", port=port, reconnect_max_s=0.2)
    assert_refused(
        settings,
        ledger,
        1.0,
        rf"127\.0\.0\.1:{port} within 1 s .*refused",
        "connected to a port where nothing listens",
    )
    ledger.close()


# ---------------------------------------------------------------------------------------------
# TLS and authentication


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey | None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
    )
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
    else:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            False,
        )
    return builder.sign(issuer_key or key, hashes.SHA256())


def _pem(path: Path, obj: x509.Certificate | ec.EllipticCurvePrivateKey) -> Path:
    if isinstance(obj, x509.Certificate):
        path.write_bytes(obj.public_bytes(serialization.Encoding.PEM))
    else:
        path.write_bytes(
            obj.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return path


@pytest.fixture
def tls_broker(tmp_path: Path) -> Any:
    """Mosquitto with TLS (self-signed CA), a password file and an ACL; yields (broker, files).

    A second listener (``files["mtls_port"]``) requires a client certificate signed by the CA
    and takes the certificate's common name as the user name (mutual TLS, no password).
    """
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("gazeguard test CA", ca_key, None, None)
    server_key = ec.generate_private_key(ec.SECP256R1())
    client_key = ec.generate_private_key(ec.SECP256R1())
    other_key = ec.generate_private_key(ec.SECP256R1())
    files: dict[str, Any] = {
        "ca": _pem(tmp_path / "ca.pem", ca),
        "other_ca": _pem(tmp_path / "other-ca.pem", _cert("someone else", other_key, None, None)),
        "cert": _pem(tmp_path / "server.pem", _cert("localhost", server_key, ca, ca_key)),
        "key": _pem(tmp_path / "server.key", server_key),
        "client_cert": _pem(tmp_path / "client.pem", _cert("alice", client_key, ca, ca_key)),
        "client_key": _pem(tmp_path / "client.key", client_key),
        "mtls_port": free_port(),
    }
    passwd = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwd), "alice", "s3cret"], check=True)
    acl = tmp_path / "acl"
    acl.write_text(f"user alice\ntopic readwrite {PREFIX}/#\ntopic read denied/#\n")
    tls = f"cafile {files['ca']}\ncertfile {files['cert']}\nkeyfile {files['key']}\n"
    broker = MosquittoBroker(
        tmp_path,
        f"{tls}allow_anonymous false\npassword_file {passwd}\nacl_file {acl}\n"
        f"listener {files['mtls_port']} 127.0.0.1\n{tls}"
        "require_certificate true\nuse_identity_as_username true\n",
    )
    broker.start()
    yield broker, files
    broker.stop()


def test_tls_and_password_deliver(tls_broker: Any, tmp_path: Path, unique_id: str) -> None:
    broker, files = tls_broker
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for i in range(3):
        charge_chunk(ledger, unique_id, i)
    settings = settings_for(
        broker, tls=True, ca_file=files["ca"], username="alice", password=SecretStr("s3cret")
    )
    consumer_tls = ssl.create_default_context(cafile=str(files["ca"]))

    async def scenario() -> list[bytes]:
        topic = chunk_topic(PREFIX, DEVICE, unique_id)
        async with (
            subscribed(
                broker.port, topic, tls_context=consumer_tls, username="alice", password="s3cret"
            ) as sub,
            Publisher(settings, ledger, connect_timeout=5) as pub,
        ):
            await pub.flush(10)
            await sub.wait_for(3)
            return sub.payloads

    assert chunk_indexes(asyncio.run(scenario())) == [0, 1, 2]
    ledger.close()


@pytest.mark.slow
def test_client_certificate_delivers(tls_broker: Any, tmp_path: Path, unique_id: str) -> None:
    """Mutual TLS: the broker requires our certificate; without it there is no connection."""
    _, files = tls_broker
    ledger = Ledger(tmp_path / "ledger.sqlite")
    charge_chunk(ledger, unique_id, 0)
    settings = BrokerSettings(
        host="127.0.0.1",
        port=files["mtls_port"],
        tls=True,
        ca_file=files["ca"],
        cert_file=files["client_cert"],
        key_file=files["client_key"],
    )

    async def deliver() -> None:
        async with Publisher(settings, ledger, connect_timeout=5) as pub:
            await pub.flush(10)

    asyncio.run(deliver())
    assert ledger.pending() == []
    assert ledger.state(unique_id).chunks == 1
    assert_refused(
        settings.model_copy(update={"cert_file": None, "key_file": None}),
        ledger,
        2,
        rf"127\.0\.0\.1:{files['mtls_port']}",
        "connected without the required client certificate",
    )
    ledger.close()


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_wrong_password_is_a_clear_error(tls_broker: Any, tmp_path: Path, protocol: str) -> None:
    broker, files = tls_broker
    ledger = Ledger(tmp_path / "ledger.sqlite")
    settings = settings_for(
        broker,
        tls=True,
        ca_file=files["ca"],
        username="alice",
        password=SecretStr("wrong"),
        protocol=protocol,
        allow_311_with_login=True,  # the login is refused anyway: that is what is tested
    )
    started = time.monotonic()
    assert_refused(
        settings,
        ledger,
        5,
        rf"127\.0\.0\.1:{broker.port} refused gazeguard: login refused for user 'alice'"
        r".*check broker\.username and broker\.password",
        "logged in with a wrong password",
    )
    assert time.monotonic() - started < 4  # refused at once, not after the timeout
    ledger.close()


def test_untrusted_broker_certificate_is_a_clear_error(tls_broker: Any, tmp_path: Path) -> None:
    broker, files = tls_broker
    ledger = Ledger(tmp_path / "ledger.sqlite")
    settings = settings_for(
        broker, tls=True, ca_file=files["other_ca"], username="alice", password=SecretStr("s3cret")
    )
    assert_refused(
        settings,
        ledger,
        5,
        r"TLS handshake failed.*check broker\.ca_file",
        "trusted a certificate from an unknown CA",
    )
    ledger.close()


def test_an_acl_refused_chunk_is_moved_aside_and_the_queue_goes_on(
    tls_broker: Any, tmp_path: Path, unique_id: str
) -> None:
    """An MQTT 5 negative PUBACK (0x87 from the ACL) is not a delivery and not a reason to stop:
    the chunk is kept in the ledger as refused (its ε stays spent), counted, and the chunks
    behind it are delivered (issue 15.1: one undeliverable chunk used to block every later one)."""
    broker, files = tls_broker
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.charge(unique_id, 0, pure_cost({"a": 0.1}), topic=f"denied/{unique_id}", payload=b"{}")
    ledger.charge(
        unique_id, 1, pure_cost({"a": 0.1}), topic=f"{PREFIX}/hmd/{unique_id}/chunks", payload=b"1"
    )
    settings = settings_for(
        broker, tls=True, ca_file=files["ca"], username="alice", password=SecretStr("s3cret")
    )

    async def scenario() -> Publisher:
        async with Publisher(settings, ledger, connect_timeout=5) as pub:
            await pub.flush(10.0)
            return pub

    pub = asyncio.run(scenario())
    assert (pub.delivered, pub.refused_items) == (1, 1)
    assert pub.last_error is not None
    assert "Not authorized" in pub.last_error
    assert "ACL" in pub.last_error
    assert ledger.pending() == []
    refused = ledger.refused(unique_id)
    assert [r.chunk_index for r in refused] == [0]
    assert "0x87" in refused[0].reason
    state = ledger.state(unique_id)
    assert (state.chunks, state.refused) == (2, 1)  # both charged: the ε of a refused one is spent
    ledger.close()


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"ca_file": Path("ca.pem")}, "broker.ca_file"),
        ({"tls": True, "ca_file": Path("/nonexistent/ca.pem")}, "broker.ca_file"),
        ({"tls": True, "key_file": Path(__file__)}, "broker.key_file"),
        ({"password": SecretStr("x")}, "broker.username"),
    ],
)
def test_inconsistent_settings_refused(tmp_path: Path, kw: dict[str, Any], field: str) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    settings = BrokerSettings(host="127.0.0.1", **kw)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        Publisher(settings, ledger)
    ledger.close()
