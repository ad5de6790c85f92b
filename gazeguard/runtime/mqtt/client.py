"""The MQTT client every gazeguard connection uses: aiomqtt's, with its socket kept watched.

aiomqtt (2.5) lets paho-mqtt drive the socket from the asyncio loop. paho asks for the socket to
be watched (``on_socket_open``, ``on_socket_register_write``), and aiomqtt registers it with
``loop.add_reader``/``add_writer``, by *file-descriptor number* and deferred with
``call_soon_threadsafe`` (paho may ask from its connect thread). On uvloop, which
``gazeguard run`` uses, a connection can then go deaf without a sign:

* **uvloop stops watching a socket that reports an error (POLLERR), silently.** Its poll handle
  is closed, so the reader is never called again. The data, the end of stream and the error all
  sit unread. One way to get there: a worker that was stopped while its broker went down writes
  PUBACKs on resuming; the closed peer answers with an RST; the connection then looks alive
  until the keepalive runs out (30 s). The one visible trace is the next write registration.
  uvloop keeps the closed handle under that descriptor number, and every later ``add_writer`` or
  ``add_reader`` for the number raises ``RuntimeError: ... UVPoll closed=True ... the handler is
  closed`` inside an event-loop callback. asyncio logs it; nothing else happens. This was seen in
  a fleet worker, whose device then waited in vain for it after a broker restart (reproduced
  with plain sockets: on uvloop the reader is never called after the RST; on asyncio it reads
  on to the end).
* A deferred registration by number can run after its socket was closed, when the number already
  belongs to another socket. A number with a closed handle refuses every later socket.

:class:`MqttClient`:

* looks at its socket once a second, in paho's housekeeping tick: anything to read (data, end of
  stream, an error) is read then, so a dropped watch costs at most a second. paho then sees the
  reset or the end of stream and the connection is reconnected as after any outage;
* when a registration fails, clears whatever the loop holds for that number, registers again and
  reads what is pending. If registering fails once more, the connection is declared lost;
* registers the socket *object* (uvloop holds the descriptor open until it is unregistered),
  skips a deferred registration whose socket is no longer paho's, and unregisters both
  directions when the socket closes (aiomqtt removed only the reader).

It also returns each QoS 1 publish's own PUBACK reason code (aiomqtt discards it), closes
paho's socket when a connect attempt is cancelled or fails (aiomqtt leaves it open), and turns
off the TCP delays that made several publishes in flight wait about 40 ms for their PUBACKs
(:func:`no_delay`, :func:`quick_ack`).

:class:`ClientFactory` builds them from :class:`~gazeguard.config.BrokerSettings`, with the TLS
context (:func:`tls_context`) and the login (:func:`credentials`) those settings describe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
import ssl
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import aiomqtt
import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from gazeguard.config import BrokerSettings
from gazeguard.core.errors import ConfigError

log = logging.getLogger(__name__)


#: Linux's ``TCP_QUICKACK`` (``None`` elsewhere).
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


def no_delay(sock: Any) -> None:
    """Send each MQTT packet at once (``TCP_NODELAY``): no Nagle wait behind an unacknowledged
    packet. A socket without the option (a websocket wrapper) is left as it is."""
    with contextlib.suppress(AttributeError, OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def quick_ack(sock: Any) -> None:
    """Acknowledge what was just read at once (Linux ``TCP_QUICKACK``, which the kernel turns
    off again by itself: set after every read).

    A broker with Nagle's algorithm on (Mosquitto's default, ``set_tcp_nodelay false``) holds
    its second PUBACK until the first one's TCP acknowledgement arrives, and a client that
    delays its acknowledgements (Linux: 40 ms) holds that: a pass of several QoS 1 publishes
    waited about 43 ms for its answers instead of about 1 ms (measured on loopback, 2 to 16
    publishes, Mosquitto 2.0 with its defaults).
    """
    if _QUICKACK is not None:
        with contextlib.suppress(AttributeError, OSError):
            sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)


class MqttClient(aiomqtt.Client):
    """aiomqtt's client whose socket stays watched (see the module docstring), and whose QoS 1
    publishes return their own PUBACK's reason code (:meth:`publish_acked`), several in flight
    at once."""

    socket_opened = False  # paho created the socket (set from paho's connect thread)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loop_thread = threading.get_ident()  # constructed on the loop's thread
        self._reader: tuple[Any, Callable[[], None]] | None = None  # (socket, callback)
        self._acks: dict[int, asyncio.Future[ReasonCode]] = {}  # message id -> its PUBACK

    async def publish_acked(
        self,
        topic: str,
        payload: bytes,
        *,
        retain: bool,
        timeout: float,  # noqa: ASYNC109
    ) -> ReasonCode:
        """Publish ``payload`` with QoS 1 and return its PUBACK's reason code (aiomqtt's
        ``publish`` discards it).

        Several may be in flight at once: each waits for the PUBACK of its own message id, and
        the messages go out in the order of the calls (paho queues the packet before this
        returns to the loop; the PUBACK can only be read after that).

        Raises:
            aiomqtt.MqttCodeError: paho could not queue the message (e.g. not connected).
            aiomqtt.MqttError: no PUBACK within ``timeout`` seconds.
        """
        info = self._client.publish(topic, payload, 1, retain)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            msg = "Could not publish message"
            raise aiomqtt.MqttCodeError(info.rc, msg)
        ack: asyncio.Future[ReasonCode] = asyncio.get_running_loop().create_future()
        self._acks[info.mid] = ack
        try:
            async with asyncio.timeout(timeout):
                return await ack
        except TimeoutError:
            msg = "Operation timed out"
            raise aiomqtt.MqttError(msg) from None
        finally:
            self._acks.pop(info.mid, None)

    async def __aenter__(self) -> Self:
        connect = asyncio.ensure_future(super().__aenter__())
        try:
            return await asyncio.shield(connect)
        except BaseException:
            # aiomqtt 2.5 leaves paho's socket open when a connect attempt is cancelled or ends
            # after the TCP connection was made (refused login, CONNACK timeout). While paho
            # connects (TCP + TLS, in a worker thread, bounded by its 5 s connect timeout) let
            # it finish, so no socket appears after we closed; once the socket exists, stop the
            # attempt. Then close whatever it opened.
            while not connect.done():
                if self.socket_opened:
                    connect.cancel()
                await asyncio.wait({connect}, timeout=0.05)
            if not connect.cancelled():
                connect.exception()  # retrieved: it is reported by the caller's exception
            self._close_socket()
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await super().__aexit__(exc_type, exc, tb)
        finally:
            self._close_socket()  # a cancelled graceful disconnect leaves it open, too

    def _close_socket(self) -> None:
        if self._misc_task is not None and not self._misc_task.done():
            self._misc_task.cancel()
        if self._client.socket() is not None:
            # paho's own close: unregisters the socket from the event loop, then closes it.
            self._client._sock_close()

    def _on_publish(
        self,
        client: Any,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties,
    ) -> None:
        ack = self._acks.pop(mid, None)
        if ack is not None and not ack.done():
            ack.set_result(reason_code)
        super()._on_publish(client, userdata, mid, reason_code, properties)

    # -- the socket in the event loop ------------------------------------------------------------

    async def _misc_loop(self) -> None:
        """paho's housekeeping (keepalive pings, retries) once a second, as aiomqtt does, plus a
        look at the socket: anything to read (data, end of stream, an error) is read now."""
        while self._client.loop_misc() == mqtt.MQTT_ERR_SUCCESS:
            self._read_if_ready()
            await asyncio.sleep(1)

    def _read_if_ready(self) -> None:
        """Run the reader if the socket has something to read or an error pending.

        Normally the loop has just done so. But uvloop drops its watch of a socket silently
        when the socket reports an error (POLLERR), e.g. the RST that follows a PUBACK written
        to a broker that had already closed: data, the end of stream and the error then sit
        unread, and the connection looked alive until the keepalive ran out (30 s).
        """
        sock = self._client.socket()
        if sock is None or self._reader is None or self._reader[0] is not sock:
            return
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLPRI)  # errors and hang-ups: always
        if poller.poll(0):
            self._reader[1]()

    def _on_socket_open(self, client: Any, userdata: Any, sock: Any) -> None:
        self.socket_opened = True

        no_delay(sock)

        def read() -> None:
            try:
                while True:
                    client.loop_read()
                    # loop_read does not always consume every decoded byte of an SSL socket
                    # (paho-mqtt issue 131)
                    if isinstance(sock, ssl.SSLSocket) and sock.pending() > 0:
                        continue
                    break
                quick_ack(sock)
            except Exception as exc:  # e.g. a broken pipe: the connection is gone
                self._lost(exc)

        def start() -> None:
            if client.socket() is not sock:
                return  # closed before this ran: its number may be another socket's by now
            self._reader = (sock, read)
            self._watch(sock, read, write=False)
            self._misc_task = self._loop.create_task(self._misc_loop())

        self._in_loop(start)

    def _on_socket_close(self, client: Any, userdata: Any, sock: Any) -> None:
        if self._reader is not None and self._reader[0] is sock:
            self._reader = None
        self._in_loop(lambda: self._forget(sock))
        if self._misc_task is not None and not self._misc_task.done():
            self._loop.call_soon_threadsafe(self._misc_task.cancel)

    def _on_socket_register_write(self, client: Any, userdata: Any, sock: Any) -> None:
        def write() -> None:
            try:
                client.loop_write()
            except Exception as exc:  # e.g. a broken pipe: the connection is gone
                self._lost(exc)

        def start() -> None:
            if client.socket() is sock:  # else: closed before this ran
                self._watch(sock, write, write=True)

        self._in_loop(start)

    def _on_socket_unregister_write(self, client: Any, userdata: Any, sock: Any) -> None:
        def stop() -> None:
            with contextlib.suppress(ValueError, RuntimeError, OSError):
                self._loop.remove_writer(sock)

        self._in_loop(stop)

    def _in_loop(self, call: Callable[[], None]) -> None:
        """Run ``call`` now on the loop's thread, or soon on it from paho's connect thread."""
        if threading.get_ident() == self._loop_thread:
            call()
        else:
            self._loop.call_soon_threadsafe(call)

    def _watch(self, sock: Any, callback: Callable[[], None], *, write: bool) -> None:
        """Register ``sock`` for reading or writing; clear and retry once; else the connection
        is lost (never silently unwatched)."""
        add = self._loop.add_writer if write else self._loop.add_reader
        try:
            add(sock, callback)
            return
        except (RuntimeError, OSError, ValueError) as exc:
            first = exc
        log.warning(
            "MQTT %s: the event loop refused to watch socket %d (%s); clearing it and retrying",
            self.identifier,
            sock.fileno(),
            first,
        )
        self._forget(sock)
        try:
            if self._reader is not None and self._reader[0] is sock:
                self._loop.add_reader(sock, self._reader[1])
            if write:
                add(sock, callback)
        except (RuntimeError, OSError, ValueError) as exc:
            self._lost(aiomqtt.MqttError(f"the event loop cannot watch the connection: {exc}"))
            return
        self._read_if_ready()  # an error the loop dropped the socket for surfaces now

    def _forget(self, sock: Any) -> None:
        """Whatever the loop holds for this socket's number, reading and writing, goes (a
        failed uvloop poll handle is only dropped once neither direction is registered)."""
        for remove in (self._loop.remove_reader, self._loop.remove_writer):
            with contextlib.suppress(ValueError, RuntimeError, OSError):
                remove(sock)

    def _lost(self, exc: BaseException) -> None:
        if not self._disconnected.done():
            self._disconnected.set_exception(exc)


# ---------------------------------------------------------------------------------------------
# Building a client from the broker settings


class ClientFactory:
    """Builds :class:`MqttClient` objects for one broker's settings: host and port, login, TLS,
    keepalive. The TLS context and the login are made (and checked) once, here.

    Args:
        settings: ``broker.*``; a missing ``host`` means ``127.0.0.1``.

    Raises:
        ConfigError: inconsistent TLS or credential settings, unreadable certificate files.
    """

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.tls = tls_context(settings)
        self._username, self._password = credentials(settings)

    def __call__(
        self,
        identifier: str | None,
        *,
        protocol: aiomqtt.ProtocolVersion = aiomqtt.ProtocolVersion.V5,
        **kwargs: Any,
    ) -> MqttClient:
        """A new client with the MQTT client id ``identifier`` (``None``: the broker picks one)
        speaking ``protocol``; ``kwargs`` are further ``aiomqtt.Client`` arguments (``timeout``,
        ``will``, ...)."""
        return MqttClient(
            self.settings.host or "127.0.0.1",
            self.settings.port,
            username=self._username,
            password=self._password,
            identifier=identifier,
            protocol=protocol,
            keepalive=self.settings.keepalive_s,
            tls_context=self.tls,
            **kwargs,
        )


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
