"""The device side of JetStream raw-gaze ingest: publish gaze blocks with JetStream
acknowledgements, retried until stored (see :mod:`gazeguard.runtime.jetstream`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import TYPE_CHECKING, Self

import nats
import nats.errors
import nats.js.errors

from gazeguard.core.closing import AsyncClosing
from gazeguard.core.errors import PublishError
from gazeguard.core.samples import GazeSamples
from gazeguard.runtime.jetstream.wire import (
    NOW_HEADER,
    RATE_HEADER,
    UNIX_OFFSET_HEADER,
    connect_options,
    gaze_subject,
)
from gazeguard.signal.rawgaze import encode_gaze

if TYPE_CHECKING:
    from collections.abc import Callable

    from nats.aio.client import Client
    from nats.js.client import JetStreamContext

    from gazeguard.config import NatsSettings


log = logging.getLogger(__name__)

#: A JetStream publish that failed with one of these may succeed later: send it again.
#: ``NoStreamResponseError`` is nats-py's "no responders" on a JetStream publish (nobody serves
#: the stream's subjects right now), ``ServiceUnavailableError`` a 503 answer (no stream leader).
_PUBLISH_AGAIN = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    TimeoutError,
)


class JetStreamSender(AsyncClosing):
    """Device side of JetStream raw-gaze ingest: publish blocks with JetStream acknowledgements.

    ``async with JetStreamSender(nats_settings, "hmd-7", "s1") as sender:
    await sender.send(block)``. There is no claim: the server's partitioning and pinning decide
    which worker reads the session. nats-py reconnects (forever) and buffers what is published
    meanwhile; a publish whose acknowledgement does not come within ``ack_timeout_s``, or that
    nobody answers or JetStream refuses as unavailable for now (the stream has no leader: a
    cluster electing one after its leader's server died), is retried (same ``Nats-Msg-Id``: the
    stream keeps one copy) until it is acknowledged, unless the server refused it for this
    credential (a permissions violation): then :meth:`send` raises.

    Its replies (the stream's acknowledgements) come on ``_INBOX.{device}.…``, so a device's
    credential needs no more than: publish ``{prefix}.{device}.>``, subscribe
    ``_INBOX.{device}.>`` — not ``_INBOX.>``, through which it could read the gaze of every
    session delivered to the workers (docs/fleet.md, Trust boundary).

    Args:
        nats_settings: servers, login, TLS, stream and subject prefix (``fleet.nats``).
        device, session: identity of the session (one subject token each).
        ack_timeout_s: wait this long for the stream's acknowledgement before retrying, s.
        unix_offset: returns Unix time minus the blocks' timestamps, s (sent as a header so a
            worker on another host dates the gaze correctly); ``None``: not sent.
        clock: returns the blocks' clock now, s (header; workers drop gaze stamped ahead of
            it); ``None``: not sent.
        rate_hz: the stream's declared sampling rate, Hz (header; workers build the session's
            event detector for it); ``None``: not sent (workers then need ``ingest.rate_hz``).

    Raises:
        StreamError: ``device`` or ``session`` is not one subject token.
    """

    def __init__(
        self,
        nats_settings: NatsSettings,
        device: str,
        session: str,
        *,
        ack_timeout_s: float = 2.0,
        unix_offset: Callable[[], float] | None = None,
        clock: Callable[[], float] | None = None,
        rate_hz: float | None = None,
    ) -> None:
        self.subject = gaze_subject(nats_settings.subject_prefix, device, session)
        self.nats = nats_settings
        self.ack_timeout_s = ack_timeout_s
        self.unix_offset = unix_offset
        self.clock = clock
        self.rate_hz = rate_hz
        self.reconnects = 0
        self.retries = 0  # publishes sent again after a missing acknowledgement
        self.inbox_prefix = f"_INBOX.{device}"
        self._name = f"gazeguard-device-{device}-{session}"
        self._refused: str | None = None  # the server's permissions violation for our subject
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None

    async def __aenter__(self) -> Self:
        opts = connect_options(self.nats, self._name)
        logged, log_error = opts["reconnected_cb"], opts["error_cb"]

        async def reconnected() -> None:
            self.reconnects += 1
            await logged()

        async def error(exc: Exception) -> None:
            text = str(exc)
            said = text.lower()  # nats-py lowers the server's message
            if "permissions violation" in said and f'"{self.subject.lower()}"' in said:
                self._refused = text
            await log_error(exc)

        try:
            self._nc = await nats.connect(
                **{**opts, "reconnected_cb": reconnected, "error_cb": error},
                inbox_prefix=self.inbox_prefix,
            )
        except (nats.errors.Error, OSError) as exc:
            msg = f"cannot reach NATS at {', '.join(self.nats.servers)}: {exc}"
            raise PublishError(msg) from exc
        self._js = self._nc.jetstream()
        return self

    async def send(self, block: GazeSamples) -> None:
        """Publish one block and wait for the stream to acknowledge it (retrying meanwhile).

        Raises:
            PublishError: the server refused publishing on this session's subject for this
                credential.
        """
        js = self._js
        assert js is not None, "use JetStreamSender as an async context manager"
        last = float(block.timestamps[-1]) if len(block) else -math.inf
        headers = {"Nats-Msg-Id": f"{self.subject}@{last!r}"}
        if self.unix_offset is not None:
            headers[UNIX_OFFSET_HEADER] = repr(self.unix_offset())
        if self.clock is not None:
            headers[NOW_HEADER] = repr(self.clock())
        if self.rate_hz is not None:
            headers[RATE_HEADER] = repr(float(self.rate_hz))
        payload = encode_gaze(block)
        attempt = 0
        while True:
            if self._refused is not None:
                msg = (
                    f"NATS refused this device's publish on {self.subject} ({self._refused}): "
                    f"its credential must allow publishing on {self.subject}"
                )
                raise PublishError(msg)
            try:
                await js.publish(self.subject, payload, timeout=self.ack_timeout_s, headers=headers)
                return
            except _PUBLISH_AGAIN as exc:
                attempt += 1
                self.retries += 1
                log.debug("%s: publish not acknowledged (%s); retrying", self.subject, exc)
                await asyncio.sleep(min(2.0, 0.05 * 2**attempt))

    async def aclose(self) -> None:
        """Drain and close the NATS connection."""
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await nc.drain()
