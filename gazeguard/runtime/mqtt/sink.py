"""The outbox's sink over MQTT: QoS 1 publishes, each answered by the broker's PUBACK.

:class:`MqttSink` is a :class:`gazeguard.ledger.outbox.Sink`;
:class:`gazeguard.runtime.publish.Publisher` puts
it behind the ordered outbox drain (:class:`gazeguard.ledger.outbox.Drain`).

Connecting (aiomqtt, which wraps paho-mqtt): MQTT v5 when ``broker.protocol`` is ``5`` or
``auto`` (``auto`` falls back to 3.1.1 when the broker refuses v5, and remembers that), TLS with
``broker.ca_file`` and optional client certificate, username/password. A failed or lost
connection becomes a :class:`~gazeguard.ledger.outbox.SinkUnavailableError` with a one-line reason
saying what to check (host:port, login, TLS, protocol), marked permanent when retrying alone
cannot help; the drain retries with its backoff.

**MQTT 3.1.1 cannot report a refused publish**: a 3.1.1 broker whose ACL denies a topic answers
with an ordinary PUBACK and drops the message. So ``auto`` does not fall back to 3.1.1 when a
login is configured (and so, likely, an ACL) unless ``broker.allow_311_with_login`` accepts it.

aiomqtt 2.5's ``Client.publish(qos=1)`` returns only when paho's ``on_publish`` fired, which for
QoS 1 is the PUBACK (paho ``_handle_pubackcomp``); but it drops the PUBACK reason code, so an MQTT
v5 broker's refusal (e.g. 0x87 "Not authorized" from an ACL) would look like success.
:class:`~gazeguard.runtime.mqtt.client.MqttClient` records it, and a failure code is answered as a
refused delivery (the drain moves the item aside). One publish is in flight per connection, so
the latest PUBACK is the one for that publish.
"""

from __future__ import annotations

import logging
import time
from typing import Self

import aiomqtt
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.reasoncodes import ReasonCode

from gazeguard.config import BrokerSettings
from gazeguard.core.closing import AsyncClosing
from gazeguard.ledger.outbox import DELIVERED, Delivery, SinkUnavailableError
from gazeguard.runtime.mqtt.client import ClientFactory, MqttClient

log = logging.getLogger(__name__)

# How long to wait for the broker's CONNACK after the TCP (and TLS) connection is up, s.
_CONNACK_TIMEOUT_S = 10.0
# CONNACK codes meaning "this protocol version is not spoken here" (3.1.1: 1; v5: 0x84).
_UNSUPPORTED_PROTOCOL = {1, 0x84}
# CONNACK codes meaning "your credentials are wrong": retrying will not help until they change.
_LOGIN_REFUSED = {4, 5, 0x86, 0x87, 0x8C}
# Failures of an MQTT connection (aiomqtt's, and the socket's).
_CONNECTION_ERRORS = (aiomqtt.MqttError, OSError)


class MqttSink:
    """Publish to the MQTT broker of ``settings``, QoS 1, one message in flight.

    Args:
        settings: broker address, TLS, credentials, protocol, keepalive, client id, prefix.

    Raises:
        ConfigError: inconsistent TLS or credential settings, unreadable certificate files.
    """

    advice = (
        "check that the broker is running and reachable, and broker.host, broker.port, "
        "broker.tls and the credentials"
    )

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.endpoint = f"{settings.host}:{settings.port}"
        self._clients = ClientFactory(settings)
        self._protocol = (
            aiomqtt.ProtocolVersion.V311
            if settings.protocol == "3.1.1"
            else aiomqtt.ProtocolVersion.V5
        )
        self.publish_timeout_s = 2.0 * settings.keepalive_s
        self._no_311: str | None = None  # why an MQTT 3.1.1 fallback was refused

    @property
    def name(self) -> str:
        """``MQTT broker host:port``."""
        return f"MQTT broker {self.endpoint}"

    def connect(self) -> MqttConnection:
        """A connection to the broker, made on entering (see :class:`MqttConnection`)."""
        return MqttConnection(self)

    def client(self) -> MqttClient:
        """A new client for the broker, speaking the protocol chosen so far."""
        return self._clients(
            self.settings.client_id, protocol=self._protocol, timeout=_CONNACK_TIMEOUT_S
        )

    def fall_back_to_311(self, exc: MqttConnectError) -> bool:
        """Whether to connect again at once with MQTT 3.1.1 after the broker refused v5."""
        if (
            self.settings.protocol == "auto"
            and self._protocol == aiomqtt.ProtocolVersion.V5
            and _code(exc) in _UNSUPPORTED_PROTOCOL
        ):
            if self.settings.username is not None and not self.settings.allow_311_with_login:
                self._no_311 = (
                    f"broker {self.endpoint} speaks only MQTT 3.1.1, which cannot report a refused "
                    "publish: with a login (and so, likely, an ACL) chunks could be dropped and "
                    "marked delivered. Enable MQTT 5 on the broker, or set "
                    "broker.allow_311_with_login = true to accept that"
                )
                return False
            log.info("MQTT broker %s does not speak MQTT 5; using 3.1.1", self.endpoint)
            self._protocol = aiomqtt.ProtocolVersion.V311
            return True
        return False

    def unavailable(self, exc: BaseException | None) -> SinkUnavailableError:
        """``exc`` (a failure of the connection, ``None``: it just closed) explained."""
        reason, permanent = explain_failure(exc, self.settings)
        if self._no_311 is not None:
            reason, permanent = self._no_311, True
        return SinkUnavailableError(reason, permanent=permanent)

    def label(self) -> str:
        """``MQTT broker host:port (MQTT version[, TLS])``."""
        version = "5" if self._protocol == aiomqtt.ProtocolVersion.V5 else "3.1.1"
        tls = ", TLS" if self._clients.tls is not None else ""
        return f"{self.name} (MQTT {version}{tls})"


class MqttConnection(AsyncClosing):
    """One connection of an :class:`MqttSink`: an async context manager that connects on
    entering (falling back to 3.1.1 at once when allowed) and disconnects on leaving.

    Raises:
        SinkUnavailableError: no connection, or it failed; explained by the sink.
    """

    def __init__(self, sink: MqttSink) -> None:
        self._sink = sink
        self._client: MqttClient | None = None
        self.label = ""

    @property
    def client(self) -> MqttClient:
        """The connected client."""
        if self._client is None:
            msg = "the MQTT connection is not open; use it inside `async with`"
            raise RuntimeError(msg)
        return self._client

    async def __aenter__(self) -> Self:
        while True:
            client = self._sink.client()
            try:
                await client.__aenter__()
            except MqttConnectError as exc:
                if self._sink.fall_back_to_311(exc):
                    continue
                raise self._sink.unavailable(exc) from exc
            except _CONNECTION_ERRORS as exc:
                raise self._sink.unavailable(exc) from exc
            self._client = client
            self.label = self._sink.label()
            return self

    async def aclose(self) -> None:
        """Disconnect the client (aiomqtt's leaving does not look at the body's exception)."""
        client, self._client = self._client, None
        if client is None:
            return
        try:
            await client.__aexit__(None, None, None)
        except _CONNECTION_ERRORS as failure:
            raise self._sink.unavailable(failure) from failure

    async def deliver(self, topic: str, payload: bytes, *, retain: bool) -> Delivery:
        """Publish with QoS 1 and return after its PUBACK: delivered, or refused with the
        broker's reason code (e.g. 0x87 "Not authorized" from an ACL). Several may be in
        flight; they go out in the order of the calls."""
        started = time.monotonic()
        try:
            reason = await self.client.publish_acked(
                topic, payload, retain=retain, timeout=self._sink.publish_timeout_s
            )
        except _CONNECTION_ERRORS as exc:
            raise self._sink.unavailable(exc) from exc
        if reason.is_failure:
            return Delivery(
                f"{reason} (0x{reason.value:02X}); check that the broker's ACL lets this client "
                f"publish under '{self._sink.settings.topic_prefix}/#'"
            )
        log.debug("PUBACK for %s after %.2f ms", topic, 1e3 * (time.monotonic() - started))
        return DELIVERED

    async def wait_lost(self) -> None:
        """Raise when the connection drops (aiomqtt ends its message iterator with MqttError)."""
        try:
            async for _ in self.client.messages:  # we subscribe to nothing: this only ends
                pass
        except _CONNECTION_ERRORS as exc:
            raise self._sink.unavailable(exc) from exc
        raise self._sink.unavailable(None)


# ---------------------------------------------------------------------------------------------
# Failures explained


def _code(exc: aiomqtt.MqttCodeError) -> int | None:
    rc = exc.rc
    return rc.value if isinstance(rc, ReasonCode) else rc


def explain_failure(exc: BaseException | None, settings: BrokerSettings) -> tuple[str, bool]:  # noqa: PLR0911 - one return per kind of failure
    """A one-line reason with what to check, and whether retrying alone cannot help."""
    if exc is None:
        return "connection closed", False
    if isinstance(exc, MqttConnectError):
        code = _code(exc)
        if code in _LOGIN_REFUSED:
            who = f"user {settings.username!r}" if settings.username else "anonymous login"
            return (
                f"login refused for {who} ({exc}); check broker.username and broker.password "
                "(GAZEGUARD_BROKER__PASSWORD)",
                True,
            )
        if code in _UNSUPPORTED_PROTOCOL:
            return f"broker refused MQTT {settings.protocol} ({exc}); set broker.protocol", True
        return f"connection refused by the broker ({exc})", False
    text = str(exc.__cause__ or exc) or type(exc).__name__
    if "CERTIFICATE_VERIFY_FAILED" in text or "SSL" in text or "TLS" in text:
        return (
            f"TLS handshake failed ({text}); check broker.ca_file (the CA that signed the "
            "broker's certificate) and that the certificate names broker.host",
            True,
        )
    if text == "Operation timed out":  # aiomqtt: no CONNACK (or PUBACK) in time
        return (
            "connected, but the broker did not answer in time; check that the port speaks "
            "MQTT, and broker.tls / broker.cert_file if it requires TLS or a client certificate",
            False,
        )
    if "Connection refused" in text:
        return f"unreachable ({text}); is the broker running on that host and port?", False
    return text, False
