"""The device side of a fleet: ``gazeguard forward`` (:mod:`gazeguard.cli.forward`).

Runs next to a headset (inside the trusted network: raw gaze goes on the wire). It reads the
headset's LSL stream with the same ingest as ``gazeguard run`` — presets, normalisation to
degrees and mm, validity, clock synchronisation — and sends it in blocks to the fleet's raw
topics with :class:`~gazeguard.fleet.RawGazeSender`: hello, wait for a worker to claim the
session, then one binary block per LSL pull. Failover and broker outages are the sender's
business (buffer, re-claim or resume; see :mod:`gazeguard.fleet`); this command never
privatizes anything and never publishes on the privatized topics.

    gazeguard forward --broker fleet-broker.lab:1883 --device hmd-07 --stream-name "Pupil Capture"
    # on the workers:
    gazeguard run --fleet --source mqtt --broker fleet-broker.lab:1883 --ledger ...

With ``--to jetstream`` the blocks go to the NATS JetStream stream of ``fleet.nats`` instead
(:class:`~gazeguard.jetstream.JetStreamSender`; no claim, workers run
``gazeguard run --fleet --source jetstream``):

    gazeguard forward --to jetstream --nats tls://nats.lab:4222 --device hmd-07

The session id is ``--session``, else derived from the stream's source_id, exactly as
``gazeguard run`` derives it, so a restarted forwarder continues the same session (and budget).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import pylsl

from gazeguard.config import BrokerSettings, Settings
from gazeguard.errors import ConfigError
from gazeguard.fleet import RawGazeSender
from gazeguard.ingest import GazeStream, GazeStreamInfo
from gazeguard.samples import lsl_unix_offset
from gazeguard.topics import session_id_for

if TYPE_CHECKING:
    from gazeguard.jetstream import JetStreamSender


@dataclass
class ForwardSummary:
    """What one ``forward`` run did.

    Attributes:
        session: the session id (without the device prefix the workers add).
        blocks, samples: forwarded (or buffered while no worker owned the session).
        owners: the worker of every claim, in order.
        reconnects, dropped_blocks: the sender's counters (see :class:`RawGazeSender`).
    """

    session: str = ""
    blocks: int = 0
    samples: int = 0
    owners: list[str] = field(default_factory=list)
    reconnects: int = 0
    dropped_blocks: int = 0


def raw_broker(settings: Settings) -> BrokerSettings:
    """The broker carrying raw gaze: ``fleet.raw_broker``, else ``broker``; it must be named."""
    raw = settings.fleet.raw_broker or settings.broker
    if raw.host is None:
        raise ConfigError(
            "broker.host",
            None,
            "gazeguard forward needs the fleet's broker: pass --broker HOST[:PORT] (or set "
            "fleet.raw_broker / broker.host); it never starts an embedded one",
        )
    return raw


#: ``ready(summary, stream info, owning worker)``, called once the session is claimed.
Ready = Callable[[ForwardSummary, GazeStreamInfo, "str | None"], None]


async def forward(
    settings: Settings,
    *,
    duration_s: float | None = None,
    stop: asyncio.Event | None = None,
    ready: Ready | None = None,
    to: Literal["mqtt", "jetstream"] = "mqtt",
) -> ForwardSummary:
    """Forward the configured LSL gaze stream to the fleet until ``stop``, ``duration_s`` or the
    stream ends: to the MQTT raw topics (claimed by a worker), or with ``to="jetstream"`` to the
    NATS JetStream stream of ``fleet.nats`` (no claim: the server's partitioning decides)."""
    stop = stop or asyncio.Event()
    raw = raw_broker(settings) if to == "mqtt" else None
    summary = ForwardSummary()
    async with GazeStream(settings.ingest) as stream:
        info = stream.info
        summary.session = settings.session or session_id_for(info.source_id, info.name)
        sender: RawGazeSender | JetStreamSender
        if raw is not None:
            sender = RawGazeSender(
                raw,
                settings.device,
                summary.session,
                prefix=settings.fleet.raw_prefix,
                unix_offset=lsl_unix_offset,  # this host's clock: workers may run elsewhere
                clock=pylsl.local_clock,
            )
        else:
            from gazeguard.jetstream import JetStreamSender  # noqa: PLC0415 - optional: nats-py

            sender = JetStreamSender(
                settings.fleet.nats,
                settings.device,
                summary.session,
                unix_offset=lsl_unix_offset,
                clock=pylsl.local_clock,
            )
        async with sender:
            if ready is not None:
                ready(summary, info, sender.owner)

            async def pump() -> None:
                async for block in stream:
                    await sender.send(block)
                    summary.blocks += 1
                    summary.samples += len(block)

            async with asyncio.TaskGroup() as tg:  # as serve(): the first of stop/time/end
                pumping = tg.create_task(pump(), name="gazeguard.forward.pump")
                waiter = tg.create_task(stop.wait(), name="gazeguard.forward.stop")
                await asyncio.wait(
                    {pumping, waiter}, timeout=duration_s, return_when=asyncio.FIRST_COMPLETED
                )
                pumping.cancel()
                waiter.cancel()
            summary.owners = list(sender.owners)
            summary.reconnects = sender.reconnects
            summary.dropped_blocks = sender.dropped_blocks
    return summary
