"""An embedded, in-process MQTT broker, so that ``gazeguard run`` works with no broker configured.

It is `amqtt <https://github.com/Yakifo/amqtt>`_ running on the service's own event loop, bound to
loopback by default. amqtt speaks MQTT 3.1.1 only and keeps everything in memory (retained
messages and sessions are lost when the process exits), so it is a convenience for demos and
single-machine trials. Production deployments point ``broker.host`` at Mosquitto (or a clustered
broker such as EMQX for fleets) and get persistence, TLS and access control from there.

Example::

    async with EmbeddedBroker(port=0) as broker:
        settings = broker.settings(BrokerSettings())  # host/port/protocol of this broker
        async with Publisher(settings, ledger) as publisher:
            ...
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import sys
from typing import Any, Self

from amqtt.broker import Broker

from gazeguard.config import BrokerSettings
from gazeguard.core.closing import AsyncClosing
from gazeguard.core.errors import PublishError

log = logging.getLogger(__name__)

# Only the anonymous-auth plugin, given explicitly: amqtt's default plugin set adds $SYS
# publishing and per-packet logging, and leaving "plugins" unset makes amqtt fall back to its
# deprecated entry-point loading (a DeprecationWarning).
_PLUGINS: dict[str, dict[str, Any]] = {
    "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True},
}


#: amqtt's record of a CONNECT at another protocol level: "Invalid protocol from (client
#: @=HOST:PORT): LEVEL" (4 is MQTT 3.1.1, 5 is MQTT 5).
_OTHER_PROTOCOL = re.compile(r"Invalid protocol from \(client @=(?P<peer>[^)]*)\): (?P<level>\d+)")
#: Protocol levels by name.
_PROTOCOLS = {3: "MQTT 3.1", 5: "MQTT 5"}


class ProtocolKnockFilter(logging.Filter):
    """On amqtt's broker logger: a client that knocks at another protocol level than 3.1.1
    (amqtt logs two warnings per attempt, "Invalid connection from …" and "Failed to initialize
    client session: Invalid protocol from …: 5", and an MQTT 5 client retries every few
    seconds) becomes one line of this module's logger, said once per broker, naming the way
    out; the rest are dropped. Any other amqtt record passes."""

    def __init__(self) -> None:
        super().__init__()
        self.said = False
        self.knocks = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """False for amqtt's records of a refused protocol level (said once, here)."""
        text = record.getMessage()
        found = _OTHER_PROTOCOL.search(text)
        if found is None and text.startswith("Invalid connection from"):
            # amqtt logs this inside its ``except MQTTError``: the error names the cause
            found = _OTHER_PROTOCOL.search(str(sys.exc_info()[1] or ""))
            if found is not None:
                return False  # the "Failed to initialize" record that follows is counted
        if found is None:
            return True
        self.knocks += 1
        if not self.said:
            self.said = True
            level = int(found["level"])
            log.warning(
                "a client at %s tried %s; the embedded broker (amqtt) speaks MQTT 3.1.1 only and "
                "refused it. A client that falls back to 3.1.1 (gazeguard's own do) connects; "
                "for MQTT 5 clients run Mosquitto and set broker.host (deploy/mosquitto). "
                "Further refusals of this kind are not logged",
                found["peer"], _PROTOCOLS.get(level, f"MQTT protocol level {level}"),
            )  # fmt: skip
        return False


class EmbeddedBroker(AsyncClosing):
    """An in-process MQTT 3.1.1 broker (amqtt) on ``host:port``; an async context manager.

    Args:
        host: address to bind, default loopback only. Binding another address exposes an
            unauthenticated broker to that network.
        port: TCP port; 0 picks a free one (read it from :attr:`port` after entering).

    Raises:
        PublishError: on entering, when the broker cannot start (e.g. the port is taken).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 1883) -> None:
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._broker: Broker | None = None
        self._knocks = ProtocolKnockFilter()

    @property
    def port(self) -> int:
        """The bound TCP port (the real one when 0 was requested)."""
        if self._port is None:
            msg = "the embedded broker is not running; use it inside `async with`"
            raise RuntimeError(msg)
        return self._port

    def settings(self, base: BrokerSettings) -> BrokerSettings:
        """``base`` pointed at this broker: its host and port, MQTT 3.1.1, no TLS or login."""
        return base.model_copy(
            update={
                "host": self.host,
                "port": self.port,
                "protocol": "3.1.1",
                "tls": False,
                "username": None,
                "password": None,
            }
        )

    async def __aenter__(self) -> Self:
        bind_host = f"[{self.host}]" if ":" in self.host else self.host
        config = {
            "listeners": {
                "default": {"type": "tcp", "bind": f"{bind_host}:{self._requested_port}"},
            },
            "plugins": dict(_PLUGINS),
        }
        broker = Broker(config)
        logging.getLogger("amqtt.broker").addFilter(self._knocks)
        try:
            await broker.start()
        except Exception as exc:
            msg = (
                f"could not start the embedded MQTT broker on {self.host}:{self._requested_port}: "
                f"{exc.__cause__ or exc}; set broker.port to a free port (or 0), or set "
                "broker.host to an existing broker such as Mosquitto"
            )
            logging.getLogger("amqtt.broker").removeFilter(self._knocks)
            raise PublishError(msg) from exc
        try:
            self._port = _bound_port(broker, self._requested_port)
        except PublishError:
            await broker.shutdown()
            logging.getLogger("amqtt.broker").removeFilter(self._knocks)
            raise
        self._broker = broker
        log.warning(
            "no broker.host configured: started an embedded MQTT broker (amqtt, in memory, "
            "MQTT 3.1.1) on %s:%d; for production set broker.host to a Mosquitto broker",
            self.host,
            self._port,
        )
        return self

    async def aclose(self) -> None:
        """Shut the broker down and free its port."""
        broker, self._broker = self._broker, None
        if broker is not None:
            # Shutdown closes client sessions and waits for amqtt's broadcast loop; shield it so
            # a cancelled service still releases the port.
            await asyncio.shield(broker.shutdown())
        logging.getLogger("amqtt.broker").removeFilter(self._knocks)
        self._port = None


def _bound_port(broker: Broker, requested: int) -> int:
    """The port the default listener is bound to.

    amqtt has no public accessor for it; the listener's asyncio server lives in
    ``Broker._servers`` (amqtt 0.11–0.12). When that changes, a requested non-zero port is
    still known; port 0 then cannot be resolved and is refused with a clear message.
    """
    servers = getattr(broker, "_servers", {})
    server = servers.get("default") if isinstance(servers, dict) else None
    sockets = getattr(getattr(server, "instance", None), "sockets", None)
    if sockets:
        return int(sockets[0].getsockname()[1])
    if requested:
        return requested
    msg = "this amqtt version does not reveal the bound port; set broker.port to a fixed port"
    raise PublishError(msg)


def _connect_packet(client_id: str) -> bytes:
    """An MQTT 3.1.1 CONNECT (clean session, 10 s keepalive, no login)."""
    cid = client_id.encode()
    body = b"\x00\x04MQTT\x04\x02\x00\x0a" + len(cid).to_bytes(2, "big") + cid
    return bytes([0x10, len(body)]) + body


def probe_mqtt(host: str, port: int, timeout_s: float = 1.0) -> str:
    """What listens on ``host:port``: ``"none"`` (nothing), ``"mqtt"`` (an MQTT broker that
    accepts an anonymous MQTT 3.1.1 connection), ``"mqtt-refused"`` (an MQTT broker that
    refuses it, e.g. it needs a login) or ``"other"`` (something that does not speak MQTT).
    Blocking; at most about ``2·timeout_s``."""

    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return "none"
    with sock:
        try:
            sock.sendall(_connect_packet(f"gazeguard-probe-{port}"))
            reply = sock.recv(4)
        except OSError:
            return "other"
        if len(reply) >= 4 and reply[0] == 0x20 and reply[1] == 0x02:
            if reply[3] == 0:
                sock.sendall(b"\xe0\x00")  # DISCONNECT
                return "mqtt"
            return "mqtt-refused"
        return "other"
