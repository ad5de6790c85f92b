"""The embedded amqtt broker with plain aiomqtt clients and with the publisher."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from pathlib import Path

import aiomqtt
import pytest

from gazeguard.config import BrokerSettings
from gazeguard.core.errors import PublishError
from gazeguard.ledger import Ledger, pure_cost
from gazeguard.runtime.mqtt.broker import EmbeddedBroker
from gazeguard.runtime.publish import Publisher
from gazeguard.wire.message import StatusMessage
from gazeguard.wire.topics import status_topic
from tests.conftest import MosquittoBroker

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]


def _ledger_with_chunk_0(path: Path, session: str, payload: bytes) -> Ledger:
    """A ledger at ``path`` with chunk 0 of ``session`` (ε 0.5, device ``d``) charged and its
    ``payload`` pending in the outbox."""
    ledger = Ledger(path)
    topic = f"gazeguard/v1/d/{session}/chunks"
    ledger.charge(session, 0, pure_cost({"a": 0.5}), topic=topic, payload=payload)
    return ledger


def test_plain_aiomqtt_clients_get_qos1_and_retained_messages(unique_id: str) -> None:
    async def scenario() -> tuple[int, list[aiomqtt.Message]]:
        async with EmbeddedBroker(port=0) as broker:
            assert broker.port > 0
            async with aiomqtt.Client(broker.host, broker.port) as pub:
                await pub.publish(f"t/{unique_id}/status", b"retained", qos=1, retain=True)
            got: list[aiomqtt.Message] = []
            async with aiomqtt.Client(broker.host, broker.port) as sub:
                await sub.subscribe(f"t/{unique_id}/#", qos=1)
                async with aiomqtt.Client(broker.host, broker.port) as pub:
                    await pub.publish(f"t/{unique_id}/chunks", b"chunk", qos=1)
                async with asyncio.timeout(5):
                    async for message in sub.messages:
                        got.append(message)
                        if len(got) == 2:
                            break
            return broker.port, got

    port, got = asyncio.run(scenario())
    by_payload = {m.payload: m for m in got}
    assert set(by_payload) == {b"retained", b"chunk"}
    assert by_payload[b"retained"].retain
    assert by_payload[b"chunk"].qos == 1
    # The port is released on exit.
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_publisher_falls_back_to_mqtt_311_and_delivers(
    tmp_path: Path, unique_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    """amqtt refuses MQTT 5; a publisher on protocol 'auto' falls back to 3.1.1 and delivers."""
    ledger = _ledger_with_chunk_0(tmp_path / "ledger.sqlite", unique_id, b"c0")
    status = StatusMessage(
        session=unique_id,
        device="d",
        state="running",
        time=time.time(),
        spent=0.5,
        remaining=None,
        session_cap=None,
        chunks_charged=1,
        chunks_withheld=0,
        chunks_dropped=0,
    )

    async def scenario() -> list[aiomqtt.Message]:
        async with EmbeddedBroker(port=0) as broker:
            settings = BrokerSettings(host=broker.host, port=broker.port, protocol="auto")
            async with Publisher(settings, ledger, connect_timeout=5) as pub:
                pub.publish_status(status)
                await pub.flush(5)
            got: list[aiomqtt.Message] = []
            async with aiomqtt.Client(broker.host, broker.port) as sub:
                await sub.subscribe(status_topic("gazeguard/v1", "d", unique_id), qos=1)
                async with asyncio.timeout(5):
                    async for message in sub.messages:
                        got.append(message)
                        break
            return got

    with caplog.at_level(logging.INFO):
        got = asyncio.run(scenario())
    assert ledger.pending() == []
    assert got[0].retain
    assert StatusMessage.from_payload(bytes(got[0].payload)) == status  # type: ignore[arg-type]
    messages = [r.getMessage() for r in caplog.records]
    assert any("does not speak MQTT 5; using 3.1.1" in m for m in messages), messages
    assert any("embedded MQTT broker" in m and "Mosquitto" in m for m in messages), messages
    ledger.close()


def test_settings_point_at_the_embedded_broker() -> None:
    async def scenario() -> BrokerSettings:
        async with EmbeddedBroker(port=0) as broker:
            return broker.settings(BrokerSettings(topic_prefix="acme/gg", tls=False))

    s = asyncio.run(scenario())
    assert (s.host, s.protocol, s.tls, s.topic_prefix) == ("127.0.0.1", "3.1.1", False, "acme/gg")
    assert s.port > 0


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        async def scenario() -> None:
            async with EmbeddedBroker(port=port):
                pytest.fail("bound a port that is in use")

        with pytest.raises(PublishError, match=rf"127\.0\.0\.1:{port}.*set broker\.port"):
            asyncio.run(scenario())
    with pytest.raises(RuntimeError, match="not running"):
        _ = EmbeddedBroker().port


def test_a_login_over_mqtt_311_is_refused_unless_allowed(tmp_path: Path, unique_id: str) -> None:
    """Issue 15.4: a 3.1.1 broker cannot report a refused publish, so an ACL'd login there could
    mark dropped chunks delivered. Explicit 3.1.1 with a login is a config error; 'auto' falling
    back to 3.1.1 with a login refuses to start, naming the setting that accepts it."""
    with pytest.raises(ValueError, match="allow_311_with_login"):
        BrokerSettings(host="127.0.0.1", protocol="3.1.1", username="hmd-01")
    ledger = _ledger_with_chunk_0(tmp_path / "ledger.sqlite", unique_id, b"c")

    async def scenario(allow: bool) -> int:
        async with EmbeddedBroker(port=0) as broker:
            settings = BrokerSettings(
                host=broker.host, port=broker.port, protocol="auto", username="hmd-01",
                allow_311_with_login=allow,
            )  # fmt: skip
            async with Publisher(settings, ledger, connect_timeout=5) as pub:
                await pub.flush(5)
                return pub.delivered

    with pytest.raises(PublishError, match=r"speaks only MQTT 3\.1\.1.*allow_311_with_login"):
        asyncio.run(scenario(allow=False))
    assert [i.chunk_index for i in ledger.pending()] == [0]  # nothing marked delivered
    assert asyncio.run(scenario(allow=True)) == 1  # accepted deliberately
    ledger.close()


@pytest.mark.network
def test_with_no_broker_configured_a_running_one_is_used_and_a_squatter_avoided(
    mosquitto: MosquittoBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 16.4: port 1883 taken by a Mosquitto (use it) or by something else (embedded broker
    on a free port, said in one line, no foreign traceback)."""
    from gazeguard.runtime.service import _broker  # noqa: PLC0415 - the run's broker choice

    async def chosen(port: int) -> tuple[str | None, int]:
        async with _broker(BrokerSettings(port=port)) as s:
            return s.host, s.port

    assert asyncio.run(chosen(mosquitto.port)) == ("127.0.0.1", mosquitto.port)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        with caplog.at_level(logging.WARNING):
            host, port = asyncio.run(chosen(taken))
    assert host == "127.0.0.1"
    assert port != taken
    assert any(
        f"port {taken} on 127.0.0.1 is taken by something that does not speak MQTT" in r.message
        for r in caplog.records
    )


def test_an_mqtt5_client_at_the_embedded_broker_is_one_clear_line(
    caplog: pytest.LogCaptureFixture, unique_id: str
) -> None:
    """A real MQTT 5 client (paho, which retries) knocking on the embedded 3.1.1 broker: amqtt's
    two warnings per attempt ("Invalid connection", "Failed to initialize client session:
    Invalid protocol …: 5") become one line that says what happened and what to do."""
    import paho.mqtt.client as mqtt  # noqa: PLC0415

    async def main() -> tuple[list[object], int]:
        async with EmbeddedBroker(port=0) as broker:

            def knock() -> list[object]:
                codes: list[object] = []
                client = mqtt.Client(
                    mqtt.CallbackAPIVersion.VERSION2, client_id=unique_id, protocol=mqtt.MQTTv5
                )
                client.on_connect = lambda _c, _u, _f, rc, _p: codes.append(rc)
                client.reconnect_delay_set(0.1, 0.2)
                client.connect("127.0.0.1", broker.port)
                client.loop_start()
                deadline = time.monotonic() + 10
                while len(codes) < 3 and time.monotonic() < deadline:
                    time.sleep(0.05)
                client.loop_stop()
                client.disconnect()
                return codes

            codes = await asyncio.to_thread(knock)
            # a 3.1.1 client still connects, and a well-formed broker error still passes
            async with aiomqtt.Client(
                "127.0.0.1", broker.port, protocol=aiomqtt.ProtocolVersion.V311
            ) as c:
                await c.publish(f"t/{unique_id}", b"x", qos=1)
            return codes, broker._knocks.knocks

    with caplog.at_level(logging.INFO):
        codes, knocks = asyncio.run(main())
    assert len(codes) >= 3, codes
    assert knocks >= 3, knocks
    assert all(str(rc) == "Unsupported protocol version" for rc in codes), codes
    amqtt_noise = [
        r.getMessage() for r in caplog.records
        if "Invalid protocol" in r.getMessage() or "Invalid connection" in r.getMessage()
    ]  # fmt: skip
    assert amqtt_noise == []
    said = [r.getMessage() for r in caplog.records if "tried MQTT 5" in r.getMessage()]
    assert len(said) == 1, said
    assert "speaks MQTT 3.1.1 only" in said[0]
    assert "broker.host" in said[0]
    assert "Mosquitto" in said[0]
    # the filter goes with the broker
    assert not logging.getLogger("amqtt.broker").filters
