"""The dashboard's HTTP server: the page (static files shipped in ``gazeguard/data/dashboard/``)
and its live feed as Server-Sent Events, on asyncio streams (no web framework).

Routes (``GET`` and ``HEAD``; anything else is 405):

* ``/`` — the page; ``/dashboard.js``, ``/dashboard.css`` — its script and style;
* ``/events`` — ``text/event-stream``: a ``snapshot`` event with everything the
  :class:`~gazeguard.runtime.dashboard.board.Board` holds, then every change (``aggregate``,
  ``attention``, ``mode``, ``broker``, ``invalid``) and a comment every :data:`KEEPALIVE_S` seconds.
  The browser's ``EventSource`` reconnects by itself (after ``retry`` ms) and gets a new
  snapshot;
* ``/state.json`` — the snapshot, for scripts.

Read-only and small on purpose: one request per connection (``Connection: close``) except the
event stream; requests are read with a size and time limit; every response carries a
Content-Security-Policy allowing only this origin's script and style (the page sets every value
as text, never as markup). Bound to a loopback address (the default), it answers only requests
whose ``Host`` is a loopback name, so a web page elsewhere cannot reach it through DNS
rebinding.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Final
from urllib.parse import urlsplit

from gazeguard.config import BrokerSettings
from gazeguard.core.errors import GazeguardError
from gazeguard.runtime.dashboard.board import Board
from gazeguard.runtime.dashboard.feed import follow
from gazeguard.runtime.mqtt.client import ClientFactory

log = logging.getLogger(__name__)

#: Default port of ``gazeguard dashboard``.
DEFAULT_PORT: Final = 8383
#: Seconds between keep-alive comments on an event stream (finds closed pages).
KEEPALIVE_S: Final = 15.0
#: Limits on a request: its head's size and the time to send it.
MAX_HEAD: Final = 16_384
HEAD_TIMEOUT_S: Final = 10.0

STATIC: Final = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
SECURITY_HEADERS: Final = (
    "Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'\r\n"
    "X-Content-Type-Options: nosniff\r\n"
    "Referrer-Policy: no-referrer\r\n"
    "Cache-Control: no-store\r\n"
)
LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})


def static_file(name: str) -> bytes:
    """A file of the page as shipped (``gazeguard/data/dashboard/NAME``)."""
    return resources.files("gazeguard").joinpath("data", "dashboard", name).read_bytes()


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or a ``Host`` header's name) is this machine only."""
    if host.lower() in LOOPBACK_NAMES or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port (``[::1]:8383`` → ``::1``)."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def page_url(sockname: tuple[str, int] | tuple[str, int, int, int]) -> str:
    """The URL to open for a listening socket's address (this host's name for a wildcard)."""
    address, port = sockname[0], sockname[1]
    if address in ("0.0.0.0", "::"):  # noqa: S104 - naming the wildcard, not binding it
        address = socket.gethostname()
    return f"http://[{address}]:{port}/" if ":" in address else f"http://{address}:{port}/"


@dataclass
class Request:
    """The head of one HTTP request."""

    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)


class BadRequestError(GazeguardError):
    """The client sent something that is not an HTTP/1.x request head we take."""


async def read_request(reader: asyncio.StreamReader) -> Request:
    """Read one request head (the body, if any, is ignored).

    Raises:
        BadRequestError: malformed, too large, or not sent within :data:`HEAD_TIMEOUT_S`.
    """
    try:
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            head = await reader.readuntil(b"\r\n\r\n")
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise BadRequestError(type(exc).__name__) from exc
    if len(head) > MAX_HEAD:
        raise BadRequestError("request head too large")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequestError(f"not an HTTP/1.x request line: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return Request(parts[0], urlsplit(parts[1]).path, headers)


def response_head(status: str, content_type: str | None = None, length: int | None = None) -> bytes:
    """A response's status line and headers (``Connection: close`` unless streaming)."""
    lines = f"HTTP/1.1 {status}\r\n{SECURITY_HEADERS}"
    if content_type is not None:
        lines += f"Content-Type: {content_type}\r\n"
    if length is not None:
        lines += f"Content-Length: {length}\r\nConnection: close\r\n"
    return (lines + "\r\n").encode("latin-1")


class DashboardServer:
    """The HTTP side: serves the page and streams ``board``'s events to each page.

    Args:
        board: the state to show.
        host: the address listened on; a loopback one limits the accepted ``Host`` headers.
    """

    def __init__(self, board: Board, host: str) -> None:
        self.board = board
        self.loopback_only = is_loopback(host)
        self._tasks: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: one request (or one event stream) and close."""
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._respond(reader, writer)
        except (ConnectionError, BadRequestError) as exc:
            log.debug("dashboard: connection ended: %s", exc)
        except asyncio.CancelledError:
            # close_connections() ends it on shutdown. The task must not end cancelled: asyncio's
            # streams would log the CancelledError of a connection callback as an error.
            log.debug("dashboard: connection closed on shutdown")
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def close_connections(self) -> None:
        """End every open connection (event streams run until the page goes away)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _respond(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await read_request(reader)
        except BadRequestError:
            await self._send(writer, "400 Bad Request", b"bad request\n")
            raise
        if request.method not in ("GET", "HEAD"):
            await self._send(writer, "405 Method Not Allowed", b"read-only: GET only\n")
            return
        if self.loopback_only and not is_loopback(_host_name(request.headers.get("host", ""))):
            await self._send(writer, "421 Misdirected Request", b"open the page at localhost\n")
            return
        head = request.method == "HEAD"
        if request.path in STATIC:
            name, content_type = STATIC[request.path]
            await self._send(writer, "200 OK", static_file(name), content_type, head=head)
        elif request.path == "/events":
            await self._stream(writer, head=head)
        elif request.path == "/state.json":
            body = json.dumps(self.board.snapshot().data, allow_nan=False).encode()
            await self._send(writer, "200 OK", body, "application/json", head=head)
        elif request.path == "/favicon.ico":
            await self._send(writer, "204 No Content", b"", head=True)
        else:
            await self._send(writer, "404 Not Found", b"not found\n")

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        status: str,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        *,
        head: bool = False,
    ) -> None:
        writer.write(response_head(status, content_type, len(body)))
        if not head:
            writer.write(body)
        await writer.drain()

    async def _stream(self, writer: asyncio.StreamWriter, *, head: bool) -> None:
        writer.write(response_head("200 OK", "text/event-stream; charset=utf-8"))
        if head:
            await writer.drain()
            return
        queue = self.board.listen()
        try:
            writer.write(b"retry: 2000\n\n" + self.board.snapshot().encode())
            await writer.drain()
            while True:
                try:
                    async with asyncio.timeout(KEEPALIVE_S):
                        event = await queue.get()
                except TimeoutError:
                    writer.write(b": keepalive\n\n")
                else:
                    if event is None:
                        return  # the page fell behind; its EventSource reconnects
                    writer.write(event.encode())
                await writer.drain()
        finally:
            self.board.unlisten(queue)


async def serve_dashboard(
    settings: BrokerSettings,
    host: str,
    port: int,
    stop: asyncio.Event,
    *,
    ready: Callable[[str], None],
    notice: Callable[[str], None],
    history: int | None = None,
) -> None:
    """Serve the dashboard until ``stop`` is set.

    Args:
        settings: the broker to subscribe to, with its TLS, login and ``topic_prefix``.
        host, port: where to listen (port 0: any free port).
        stop: set to stop.
        ready: called with the page's URL once listening.
        notice: called with one line on the broker's state (see
            :func:`gazeguard.runtime.dashboard.feed.follow`).
        history: aggregates kept and drawn per (cohort, worker).

    Raises:
        OSError: the address cannot be listened on (in use, not this machine's).
        ConfigError: inconsistent broker TLS or login settings.
    """
    factory = ClientFactory(settings)  # a TLS or login problem stops us before we listen
    board = Board(settings.topic_prefix, **({} if history is None else {"history": history}))
    web = DashboardServer(board, host)
    server = await asyncio.start_server(web.handle, host, port, limit=MAX_HEAD)
    feed = asyncio.create_task(follow(board, settings, notice, factory))
    try:
        ready(page_url(server.sockets[0].getsockname()))
        stopping = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({feed, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if feed in done:
            feed.result()  # follow() ends only by raising
    finally:
        feed.cancel()
        server.close()
        await web.close_connections()
        await server.wait_closed()
        with contextlib.suppress(asyncio.CancelledError):
            await feed
