"""Publish: drain the ledger's durable outbox to an MQTT broker, in order, at least once.

The service charges a chunk and enqueues its privatized payload into the ledger's outbox in one
SQLite transaction (:mod:`gazeguard.ledger`), then calls :meth:`Publisher.notify`. The publisher
sends the outbox's undelivered items oldest first, one at a time: publish with QoS 1, wait for
the broker's PUBACK, then ``ledger.mark_delivered(id)``. Item ``i + 1`` is published only after
item ``i`` was acknowledged, so the broker receives them in outbox order even across reconnects
and restarts; the bytes on the wire are exactly the bytes that were charged.

**Delivery is at least once.** If the connection (or the process) dies after the broker received
an item but before its PUBACK was recorded, the item is sent again. The window is one in-flight
message per publisher: items whose PUBACK arrived are never re-sent by a running publisher (they
are remembered until ``mark_delivered`` has committed), so a duplicate needs a lost PUBACK or a
crash between PUBACK and the commit. Consumers deduplicate by ``(session, chunk_index)``, which
every chunk message carries.

Status messages (:class:`~gazeguard.message.StatusMessage`) are retained and not durable: only
the latest per session is kept (in memory), sent after the outbox is drained, and sent again
after every reconnect, so a broker that lost its retained messages gets them back.

Connection handling (aiomqtt, which wraps paho-mqtt): MQTT v5 when ``broker.protocol`` is ``5`` or
``auto`` (``auto`` falls back to 3.1.1 when the broker refuses v5, and remembers that), TLS with
``broker.ca_file`` and optional client certificate, username/password. An unreachable broker is
logged (host:port, reason, next retry) and retried with jittered backoff
``uniform(0, min(broker.reconnect_max_s, 1.5 ** attempt))``; charged chunks wait in the outbox.
With ``connect_timeout``, entering the publisher fails fast with :class:`PublishError` when no
connection is made in time or the broker refuses the login or the TLS handshake fails.

aiomqtt 2.5's ``Client.publish(qos=1)`` returns only when paho's ``on_publish`` fired, which for
QoS 1 is the PUBACK (paho ``_handle_pubackcomp``); but it drops the PUBACK reason code, so an MQTT
v5 broker's refusal (e.g. 0x87 "Not authorized" from an ACL) would look like success.
:class:`MqttClient` records it; a refused item stays in the outbox and is retried after a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Protocol, Self

import aiomqtt
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.reasoncodes import ReasonCode

from gazeguard.config import BrokerSettings
from gazeguard.errors import ConfigError, PublishError
from gazeguard.message import StatusMessage, status_topic
from gazeguard.mqtt.client import MqttClient

log = logging.getLogger(__name__)

# How long to wait for the broker's CONNACK after the TCP (and TLS) connection is up, s.
_CONNACK_TIMEOUT_S = 10.0
# CONNACK codes meaning "this protocol version is not spoken here" (3.1.1: 1; v5: 0x84).
_UNSUPPORTED_PROTOCOL = {1, 0x84}
# CONNACK codes meaning "your credentials are wrong": retrying will not help until they change.
_LOGIN_REFUSED = {4, 5, 0x86, 0x87, 0x8C}


class OutboxEntry(Protocol):
    """One charged, undelivered payload (``gazeguard.ledger.OutboxItem``)."""

    @property
    def id(self) -> int: ...
    @property
    def session(self) -> str: ...
    @property
    def chunk_index(self) -> int: ...
    @property
    def topic(self) -> str: ...
    @property
    def payload(self) -> bytes: ...


class Outbox(Protocol):
    """The part of :class:`gazeguard.ledger.Ledger` the publisher uses (thread-safe)."""

    def pending(self, limit: int | None = None) -> Sequence[OutboxEntry]: ...
    def mark_delivered(self, outbox_id: int) -> object: ...
    def mark_refused(self, outbox_id: int, reason: str) -> object: ...


class _ItemRefusedError(Exception):
    """The broker answered one publish with a failure reason code (e.g. 0x87 "Not authorized"
    from an ACL): that payload will never be accepted; the connection is fine."""


class _RefusedError(Exception):
    """The broker refused something that retrying with the same configuration will not fix."""


class Publisher:
    """Deliver the ledger's outbox and the sessions' retained status to an MQTT broker.

    An async context manager owning one named task (``{name}.connection``, which runs
    ``{name}.drain`` and ``{name}.watch`` per connection) in a TaskGroup.

    Args:
        settings: broker address, TLS, credentials, protocol, keepalive, backoff cap, prefix.
        outbox: the ledger; ``pending`` and ``mark_delivered`` run in worker threads.
        connect_timeout: if set, entering waits up to this many seconds for the first
            connection and raises :class:`PublishError` if there is none (fail fast at startup).
        poll_interval_s: look at the outbox at least this often even without :meth:`notify`
            (picks up items charged by another process or before a restart), s.
        batch: outbox items fetched per query.
        on_acked: called on the event loop with each outbox item right after its positive
            PUBACK (before ``mark_delivered`` commits), e.g. to measure latency; must not raise.
        name: prefix of the task names.

    Raises:
        ConfigError: inconsistent TLS or credential settings, unreadable certificate files.
    """

    def __init__(
        self,
        settings: BrokerSettings,
        outbox: Outbox,
        *,
        connect_timeout: float | None = None,
        poll_interval_s: float = 1.0,
        batch: int = 64,
        on_acked: Callable[[OutboxEntry], None] | None = None,
        name: str = "gazeguard.publish",
    ) -> None:
        if settings.host is None:
            raise ConfigError(
                "broker.host",
                None,
                "the publisher needs a broker; start gazeguard.mqtt.broker.EmbeddedBroker and use "
                "its settings(), or set broker.host",
            )
        self.settings = settings
        self.host: str = settings.host
        self.port = settings.port
        self._outbox = outbox
        self._connect_timeout = connect_timeout
        self._poll_interval_s = poll_interval_s
        self._batch = batch
        self._on_acked = on_acked
        self._name = name
        self._tls = tls_context(settings)
        self._credentials = credentials(settings)
        self._protocol = (
            aiomqtt.ProtocolVersion.V311
            if settings.protocol == "3.1.1"
            else aiomqtt.ProtocolVersion.V5
        )
        self._publish_timeout_s = 2.0 * settings.keepalive_s

        self._wake = asyncio.Event()
        self._idle = asyncio.Condition()
        self._passes_started = 0
        self._last_idle_pass = -1
        self._connected = asyncio.Event()
        self._refused = asyncio.Event()
        self._no_311: str | None = None  # why an MQTT 3.1.1 fallback was refused
        self._acked: set[int] = set()  # PUBACK received, mark_delivered not yet committed
        self._handed: dict[int, OutboxEntry] = {}  # charged here, handed over by notify()
        self._read_table = True  # the next pass reads the outbox table
        self._table_read_at = -float("inf")  # time.monotonic() of the latest table read
        self._status_latest: dict[str, bytes] = {}
        self._status_unsent: set[str] = set()
        self._tg: asyncio.TaskGroup | None = None
        self._task: asyncio.Task[None] | None = None

        self.delivered = 0
        """Outbox items delivered (PUBACK received) by this publisher."""
        self.connections = 0
        """Successful connections so far (1 + reconnects)."""
        self.refusals = 0
        """Times the broker refused the login, the protocol, the TLS handshake or an item."""
        self.refused_items = 0
        """Outbox items the broker permanently refused (moved aside in the ledger, not retried)."""
        self.last_error: str | None = None
        """Why the latest connection attempt or connection failed, or ``None``."""

    # -- public API ------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """``host:port`` of the broker."""
        return f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        """Whether a broker connection is up right now."""
        return self._connected.is_set()

    def notify(self, charged: Sequence[OutboxEntry] = ()) -> None:
        """Wake the publisher: chunks were charged into the outbox. Call from the event loop.

        Args:
            charged: the outbox items just committed by this process (e.g. the
                :class:`~gazeguard.pipeline.ReleasedChunk` objects a pipeline returned). They are
                sent straight from memory, skipping a read of the outbox table; without them
                the publisher reads the table. Either way the table stays the source of truth:
                it is read after every (re)connection, on :meth:`flush`, and at least every
                ``poll_interval_s`` (items charged by other processes, backlog). At most
                ``batch`` items are held in memory; beyond that (a broker outage) the
                publisher forgets them and reads the table.
        """
        for item in charged:
            self._handed[item.id] = item
        if len(self._handed) > self._batch:
            self._handed.clear()
            self._read_table = True
        self._wake.set()

    def publish_status(self, status: StatusMessage) -> None:
        """Queue ``status`` as the retained status of its session; a newer one replaces it.

        Not durable: it is sent after the outbox is drained, and again after each reconnect.
        """
        topic = status_topic(self.settings.topic_prefix, status.device, status.session)
        self._status_latest[topic] = status.to_payload()
        self._status_unsent.add(topic)
        self._wake.set()

    async def flush(self, within_s: float) -> None:
        """Wait until everything in the outbox now, and every queued status, was delivered.

        Raises:
            PublishError: not done within ``within_s`` seconds (the items stay in the outbox).
        """
        async with self._idle:
            target = self._passes_started + 1
            self._read_table = True
            self._wake.set()
            try:
                async with asyncio.timeout(within_s):
                    await self._idle.wait_for(lambda: self._last_idle_pass >= target)
            except TimeoutError:
                why = f" (last error: {self.last_error})" if self.last_error else ""
                msg = (
                    f"MQTT broker {self.endpoint}: outbox not delivered within {within_s:g} s"
                    f"{why}; the chunks stay in the ledger outbox and are sent later"
                )
                raise PublishError(msg) from None

    async def __aenter__(self) -> Self:
        tg = asyncio.TaskGroup()
        await tg.__aenter__()
        self._tg = tg
        self._task = tg.create_task(self._connection_loop(), name=f"{self._name}.connection")
        if self._connect_timeout is not None:
            try:
                await self._wait_first_connection(self._connect_timeout)
            except BaseException:
                await self.__aexit__(None, None, None)
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the connection task; undelivered items stay in the outbox for the next run.

        The body's own exception propagates unchanged; a failure of the publisher's task
        (e.g. the ledger's database failing) is raised as an exception group.
        """
        if self._task is not None:
            self._task.cancel()
        tg, self._tg, self._task = self._tg, None, None
        if tg is not None:
            await tg.__aexit__(None, None, None)

    # -- connection ------------------------------------------------------------------------------

    async def _wait_first_connection(self, limit_s: float) -> None:
        connected = asyncio.ensure_future(self._connected.wait())
        refused = asyncio.ensure_future(self._refused.wait())
        try:
            done, _ = await asyncio.wait(
                {connected, refused}, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            connected.cancel()
            refused.cancel()
        if self.connections:
            return
        if refused in done:
            msg = f"MQTT broker {self.endpoint} refused gazeguard: {self.last_error}"
        else:
            msg = (
                f"could not connect to the MQTT broker at {self.endpoint} within {limit_s:g} s "
                f"({self.last_error or 'no answer'}); check that the broker is running and "
                "reachable, and broker.host, broker.port, broker.tls and the credentials"
            )
        raise PublishError(msg)

    def _client(self) -> MqttClient:
        username, password = self._credentials
        return MqttClient(
            self.host,
            self.port,
            username=username,
            password=password,
            identifier=self.settings.client_id,
            protocol=self._protocol,
            keepalive=self.settings.keepalive_s,
            tls_context=self._tls,
            timeout=_CONNACK_TIMEOUT_S,
        )

    async def _connection_loop(self) -> None:
        attempt = 0
        while True:
            failure: BaseException | None = None
            try:
                async with self._client() as client:
                    self._on_connected(attempt)
                    attempt = 0
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(self._watch(client), name=f"{self._name}.watch")
                        tg.create_task(self._drain(client), name=f"{self._name}.drain")
            except* (aiomqtt.MqttError, _RefusedError, OSError) as group:
                failure = _first(group)
            finally:
                self._connected.clear()
            if isinstance(failure, MqttConnectError) and self._fall_back_to_311(failure):
                continue
            attempt += 1
            self.last_error, refused = _explain(failure, self.settings)
            if self._no_311 is not None:
                self.last_error, refused = self._no_311, True
            if refused:
                self.refusals += 1
                self._refused.set()
            delay = random.uniform(0, min(self.settings.reconnect_max_s, 1.5**attempt))
            log.log(
                logging.ERROR if refused else logging.WARNING,
                "MQTT broker %s: %s. Charged chunks wait in the outbox; next retry in %.1f s",
                self.endpoint,
                self.last_error,
                delay,
            )
            await asyncio.sleep(delay)

    def _on_connected(self, failed_attempts: int) -> None:
        self.connections += 1
        self._connected.set()
        self._refused.clear()
        # A (re)connected broker may have lost retained messages: send every latest status.
        self._status_unsent.update(self._status_latest)
        self._wake.set()
        version = "5" if self._protocol == aiomqtt.ProtocolVersion.V5 else "3.1.1"
        tls = ", TLS" if self._tls is not None else ""
        level = logging.WARNING if failed_attempts else logging.INFO
        log.log(level, "connected to MQTT broker %s (MQTT %s%s)", self.endpoint, version, tls)

    def _fall_back_to_311(self, exc: MqttConnectError) -> bool:
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

    async def _watch(self, client: MqttClient) -> None:
        """Raise when the connection drops (aiomqtt ends its message iterator with MqttError)."""
        async for _ in client.messages:  # we subscribe to nothing; this only ends by raising
            pass

    # -- delivery --------------------------------------------------------------------------------

    async def _next_items(self) -> tuple[Sequence[OutboxEntry], bool]:
        """The next items to send, oldest first, and whether more may wait in the table.

        Reads the outbox table when due (after a connection, on flush, every
        ``poll_interval_s``, while a backlog lasts); otherwise takes the items handed over by
        :meth:`notify`, which are all this process charged since the last table read.
        """
        due = time.monotonic() - self._table_read_at >= self._poll_interval_s
        if self._read_table or due or not self._handed:
            self._read_table = False
            self._table_read_at = time.monotonic()
            items = await asyncio.to_thread(self._outbox.pending, self._batch)
            self._read_table = len(items) == self._batch
            return items, self._read_table
        ids = sorted(self._handed)[: self._batch]
        return [self._handed[i] for i in ids], len(ids) == self._batch

    async def _drain(self, client: MqttClient) -> None:
        """Deliver outbox items oldest first, then the latest statuses; sleep until notified."""
        self._read_table = True  # what happened while disconnected is only in the table
        while True:
            self._wake.clear()
            self._passes_started += 1
            this_pass = self._passes_started
            items, more = await self._next_items()
            for item in items:
                if item.id not in self._acked:
                    try:
                        await self._send(client, item.topic, item.payload, retain=False, what=item)
                    except _ItemRefusedError as exc:
                        # Never retried, never blocking the queue: kept in the ledger as refused
                        # (its ε stays spent), counted, logged once; the next item goes on.
                        await asyncio.to_thread(self._outbox.mark_refused, item.id, str(exc))
                        self._handed.pop(item.id, None)
                        self.refused_items += 1
                        self.refusals += 1
                        self.last_error = str(exc)
                        log.error("%s; moved aside, the queue goes on", exc)
                        continue
                    self._acked.add(item.id)
                    if self._on_acked is not None:
                        self._on_acked(item)
                await asyncio.to_thread(self._outbox.mark_delivered, item.id)
                self._acked.discard(item.id)
                self._handed.pop(item.id, None)
                self.delivered += 1
            if more:
                continue
            for topic in list(self._status_unsent):
                payload = self._status_latest[topic]
                try:
                    await self._send(client, topic, payload, retain=True, what=None)
                except _ItemRefusedError as exc:
                    self._status_unsent.discard(topic)  # a newer status may be allowed; not this
                    self.refusals += 1
                    self.last_error = str(exc)
                    log.error("%s", exc)
                    continue
                if self._status_latest[topic] is payload:
                    self._status_unsent.discard(topic)
            if items or self._status_unsent or self._handed:
                continue
            async with self._idle:
                self._last_idle_pass = this_pass
                self._idle.notify_all()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval_s):
                    await self._wake.wait()

    async def _send(
        self,
        client: MqttClient,
        topic: str,
        payload: bytes,
        *,
        retain: bool,
        what: OutboxEntry | None,
    ) -> None:
        """Publish with QoS 1 and return after a positive PUBACK."""
        client.puback_reason = None
        started = time.monotonic()
        await client.publish(topic, payload, qos=1, retain=retain, timeout=self._publish_timeout_s)
        reason = client.puback_reason
        if reason is not None and reason.is_failure:
            item = f"chunk {what.chunk_index} of session {what.session!r}" if what else "status"
            msg = (
                f"broker refused {item} on topic {topic!r}: {reason} (0x{reason.value:02X}); "
                f"check that the broker's ACL lets this client publish under "
                f"'{self.settings.topic_prefix}/#'"
            )
            raise _ItemRefusedError(msg)
        log.debug("PUBACK for %s after %.2f ms", topic, 1e3 * (time.monotonic() - started))


# ---------------------------------------------------------------------------------------------
# Configuration and error helpers


class _ClosingSSLSocket(ssl.SSLSocket):
    """An SSL socket that closes itself when its handshake fails.

    paho-mqtt 2.2 wraps the TCP socket and calls ``do_handshake()`` without closing the socket
    when the handshake fails (e.g. an untrusted broker certificate), leaking one file descriptor
    per attempt until the garbage collector finds it. Installed via the documented
    ``SSLContext.sslsocket_class`` hook.
    """

    def do_handshake(self, block: bool = False) -> None:
        try:
            super().do_handshake(block)
        except BaseException:
            self.close()
            raise


def tls_context(settings: BrokerSettings) -> ssl.SSLContext | None:
    """The TLS context from ``broker.tls/ca_file/cert_file/key_file`` (``None`` without TLS)."""
    files = {"ca_file": settings.ca_file, "cert_file": settings.cert_file}
    files["key_file"] = settings.key_file
    if not settings.tls:
        for field, path in files.items():
            if path is not None:
                raise ConfigError(
                    f"broker.{field}", str(path), "is set but broker.tls is false; set broker.tls"
                )
        return None
    for field, path in files.items():
        if path is not None and not path.is_file():
            raise ConfigError(f"broker.{field}", str(path), "file not found")
    if settings.key_file is not None and settings.cert_file is None:
        raise ConfigError(
            "broker.key_file", str(settings.key_file), "needs broker.cert_file (mutual TLS)"
        )
    try:
        context = ssl.create_default_context(
            cafile=str(settings.ca_file) if settings.ca_file else None
        )
        if settings.cert_file is not None:
            context.load_cert_chain(
                settings.cert_file, settings.key_file if settings.key_file else None
            )
        context.sslsocket_class = _ClosingSSLSocket
    except (ssl.SSLError, ValueError) as exc:
        field = "broker.cert_file" if settings.cert_file else "broker.ca_file"
        value = settings.cert_file or settings.ca_file
        raise ConfigError(field, str(value), f"cannot be loaded as PEM: {exc}") from exc
    return context


def credentials(settings: BrokerSettings) -> tuple[str | None, str | None]:
    """``(username, password)`` from ``broker.username/password`` (password revealed here only)."""
    if settings.password is not None and settings.username is None:
        raise ConfigError("broker.username", None, "broker.password is set; set the username too")
    password = settings.password.get_secret_value() if settings.password else None
    return settings.username, password


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf exception of a (possibly nested) exception group."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


def _code(exc: aiomqtt.MqttCodeError) -> int | None:
    rc = exc.rc
    return rc.value if isinstance(rc, ReasonCode) else rc


def _explain(exc: BaseException | None, settings: BrokerSettings) -> tuple[str, bool]:  # noqa: PLR0911 - one return per kind of failure
    """A one-line reason with what to check, and whether retrying alone cannot help."""
    if exc is None:
        return "connection closed", False
    if isinstance(exc, _RefusedError):
        return str(exc), True
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
