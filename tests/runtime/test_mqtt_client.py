"""MqttClient keeps its connection's socket watched on uvloop, where aiomqtt's own client does not.

uvloop stops watching a socket that reports an error (POLLERR), without a sign, and keeps the
closed poll handle under that descriptor number, so every later registration of the number
raises inside an event-loop callback. aiomqtt registers sockets by number. So its connection
goes deaf in two ways: the socket that got the error is never read again, and a later socket
that happens to get the same number is never watched at all. A fleet worker was seen deaf after
a broker restart. These tests cause both states on purpose, against a real Mosquitto, and check
that each hazard is still there with plain aiomqtt (so the guard still earns its place).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any

import aiomqtt
import pytest
import uvloop

from gazeguard.runtime.mqtt.client import MqttClient
from tests.conftest import MosquittoBroker

pytestmark = pytest.mark.network


async def leave_dead_poll_handles(count: int) -> list[int]:
    """Make uvloop hold a failed, closed poll handle for ``count`` descriptor numbers, then free
    the numbers. Returns them.

    Each is a UDP socket "connected" to a port nothing listens on. The ICMP rejection of its
    datagram is a socket error (POLLERR). uvloop's poll for it closes silently and stays under
    that number: from then on, registering the number raises. The socket is then closed without
    being unregistered, as a socket dies under a library that registered it by number.
    """
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()
    socks = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.connect(dead)
        loop.add_reader(sock.fileno(), lambda: None)
        sock.send(b"x")  # answered by ICMP "port unreachable"
        socks.append(sock)

    def refused(fd: int) -> bool:
        try:
            loop.add_writer(fd, lambda: None)
        except RuntimeError:
            return True
        loop.remove_writer(fd)
        return False

    pending = [sock.fileno() for sock in socks]
    async with asyncio.timeout(10):
        while True:  # the loop's state has no event to await: poll it
            pending = [fd for fd in pending if not refused(fd)]
            if not pending:
                break
            await asyncio.sleep(0.01)
    numbers = [sock.detach() for sock in socks]
    for fd in numbers:
        socket.close(fd)
    return numbers


async def round_trip(client: aiomqtt.Client) -> bytes:
    await client.subscribe("gg/echo", qos=1)
    await client.publish("gg/echo", b"ping", qos=1)
    async with asyncio.timeout(5):
        async for message in client.messages:
            assert isinstance(message.payload, bytes)
            return message.payload
    raise AssertionError("unreachable")


class Said(logging.Handler):
    """The messages one logger emitted (attached to it directly: no propagation involved)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


TRIES = 5  # a socket an earlier test leaked can be collected meanwhile and free a lower number


@pytest.mark.slow
def test_aiomqtt_alone_hangs_on_a_descriptor_number_uvloop_holds_a_dead_handle_for(
    mosquitto: MosquittoBroker,
) -> None:
    """The hazard itself, so that the next test means something: aiomqtt's client whose socket
    lands on a poisoned number never reads its CONNACK (it times out) while the loop logs the
    refusal. (Tried again if the socket landed on a number freed meanwhile by someone else.)"""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        refused: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _l, ctx: refused.append(ctx))
        for _ in range(TRIES):
            numbers = set(await leave_dead_poll_handles(24))
            refused.clear()
            client = aiomqtt.Client(mosquitto.host, mosquitto.port, identifier="plain", timeout=2)
            try:
                async with client:
                    sock = client._client.socket()
                    assert sock is None or sock.fileno() not in numbers, "the hazard is gone"
                    continue  # its socket got a number nobody poisoned: again
            except aiomqtt.MqttError as exc:
                failure = str(exc)
                sock = client._client.socket()
                assert sock is not None  # aiomqtt leaves it open
                assert sock.fileno() in numbers
                assert "timed out" in failure
                assert any("closed" in str(ctx.get("exception")) for ctx in refused), refused
                client._client._sock_close()  # not leaked into later tests
                return
        raise AssertionError(f"no socket landed on a poisoned number in {TRIES} tries")

    uvloop.run(main())


def test_mqtt_client_is_watched_on_such_a_number_and_says_so(mosquitto: MosquittoBroker) -> None:
    """MqttClient clears the dead handle, registers its socket again and works: it connects,
    its subscription and publish round-trip through the broker; the clearing is logged."""

    async def main() -> bytes:
        for _ in range(TRIES):
            numbers = set(await leave_dead_poll_handles(24))
            client = MqttClient(mosquitto.host, mosquitto.port, identifier="kept", timeout=5)
            async with client as c:
                sock = c._client.socket()
                assert sock is not None
                if sock.fileno() not in numbers:
                    continue  # a number freed meanwhile by someone else: again
                return await round_trip(c)
        raise AssertionError(f"no socket landed on a poisoned number in {TRIES} tries")

    said = Said()
    logger = logging.getLogger("gazeguard.runtime.mqtt.client")
    logger.addHandler(said)
    try:
        assert uvloop.run(main()) == b"ping"
    finally:
        logger.removeHandler(said)
    assert any("refused to watch socket" in line for line in said.lines), said.lines


@pytest.mark.parametrize("runner", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_mqtt_client_round_trips_and_reconnects_on_either_loop(
    mosquitto: MosquittoBroker, runner: Any
) -> None:
    """The plain path on both loops: connect, round trip, disconnect, connect again with the
    same client id (its socket registered afresh, the old one fully unregistered)."""

    async def main() -> list[bytes]:
        got = []
        for _ in range(2):
            async with MqttClient(mosquitto.host, mosquitto.port, identifier="twice") as c:
                got.append(await round_trip(c))
        return got

    assert runner(main()) == [b"ping", b"ping"]


def test_mqtt_client_sends_without_nagle_and_many_publishes_are_acknowledged(
    mosquitto: MosquittoBroker,
) -> None:
    """The socket sends each packet at once (TCP_NODELAY), and 16 QoS 1 publishes in flight at
    once each get their own PUBACK from a Mosquitto with its default Nagle setting (the stall
    that quick_ack removes is timed in bench/bench_mqtt_burst.py, not here)."""

    async def main() -> tuple[int, list[int]]:
        async with MqttClient(mosquitto.host, mosquitto.port, identifier="burst") as c:
            sock = c._client.socket()
            assert isinstance(sock, socket.socket)
            nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            codes = await asyncio.gather(
                *(
                    c.publish_acked(f"t/burst/{i}", b"x" * 4000, retain=False, timeout=10)
                    for i in range(16)
                )
            )
            return nodelay, [code.value for code in codes]

    nodelay, codes = asyncio.run(main())
    assert nodelay != 0
    assert codes == [0] * 16  # each accepted (reason code 0: success)


@pytest.mark.slow
@pytest.mark.parametrize("client_class", [aiomqtt.Client, MqttClient], ids=["aiomqtt", "ours"])
def test_a_socket_the_loop_stopped_watching_still_notices_its_broker_go(
    mosquitto: MosquittoBroker, client_class: type[aiomqtt.Client]
) -> None:
    """uvloop drops the watch of a socket that reports an error, without a sign (the RST after a
    write to a closed broker). Simulated here by unregistering the connected socket's reader.
    Then the broker stops: aiomqtt's client does not notice within 3 s (it would when its 60 s
    keepalive ran out); MqttClient reads the end of stream on its next once-a-second look."""

    async def main() -> float | None:
        async with client_class(mosquitto.host, mosquitto.port, identifier="deaf") as client:
            asyncio.get_running_loop().remove_reader(client._client.socket())
            mosquitto.stop()
            started = time.monotonic()
            try:
                async with asyncio.timeout(3):
                    async for _ in client.messages:
                        pass
            except aiomqtt.MqttError:
                return time.monotonic() - started
            except TimeoutError:
                return None
        raise AssertionError("unreachable")

    noticed_after_s = uvloop.run(main())
    if client_class is MqttClient:
        assert noticed_after_s is not None
        assert noticed_after_s < 2.5
    else:
        assert noticed_after_s is None, "the hazard this guards against is gone: drop the guard?"


#: What MqttClient overrides or reads of aiomqtt's and paho's private surface, with the
#: parameters it relies on (pyproject.toml pins the versions it was written against).
PRIVATE_METHODS = {
    aiomqtt.Client: {
        "_on_publish": ["self", "client", "userdata", "mid", "reason_code", "properties"],
        "_misc_loop": ["self"],
        "_on_socket_open": ["self", "client", "userdata", "sock"],
        "_on_socket_close": ["self", "client", "userdata", "sock"],
        "_on_socket_register_write": ["self", "client", "userdata", "sock"],
        "_on_socket_unregister_write": ["self", "client", "userdata", "sock"],
    },
}
PRIVATE_ATTRIBUTES = ("_client", "_loop", "_disconnected", "_misc_task")


def test_the_private_names_mqtt_client_patches_still_exist() -> None:
    """MqttClient overrides six private aiomqtt methods and calls paho's ``_sock_close``: an
    upgrade that renames one would silently bypass the guard. This fails first."""
    import inspect  # noqa: PLC0415

    import paho.mqtt.client as paho  # noqa: PLC0415

    for cls, methods in PRIVATE_METHODS.items():
        for name, params in methods.items():
            assert hasattr(cls, name), f"aiomqtt.Client.{name} is gone"
            assert list(inspect.signature(getattr(cls, name)).parameters) == params, name
    assert callable(getattr(paho.Client, "_sock_close", None)), "paho Client._sock_close is gone"

    async def attributes() -> list[str]:
        client = aiomqtt.Client("127.0.0.1", port=1)
        return [a for a in PRIVATE_ATTRIBUTES if not hasattr(client, a)]

    assert asyncio.run(attributes()) == []
