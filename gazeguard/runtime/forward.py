"""The device side of a fleet: ``gazeguard forward`` (:mod:`gazeguard.cli.forward`).

Runs next to a headset. It reads the headset's LSL stream with the same ingest as ``gazeguard
run`` — presets, normalisation to degrees and mm, validity, clock synchronisation — and publishes
it, one raw block (:mod:`gazeguard.signal.rawgaze`) per LSL pull every ``fleet.nats.block_s`` (1
s), to
the fleet's NATS JetStream stream (``fleet.nats``) with
:class:`~gazeguard.runtime.jetstream.JetStreamSender`. There is no claim: the server's partitioning
and
pinning decide which worker reads the session. Flow control and buffering are the engine's and
the client's: each block waits for the stream's acknowledgement before the next is read (the LSL
inlet buffers meanwhile), nats-py reconnects and buffers through an outage, and a block whose
acknowledgement does not come is sent again under the same ``Nats-Msg-Id`` (the stream keeps
one copy). This command never privatizes anything and never
publishes on the privatized topics.

Raw gaze is on this wire: use TLS and one NATS credential per device, allowed to publish on its
own subjects only (docs/fleet.md, Trust boundary).

    gazeguard forward --nats tls://nats.lab:4222 --device hmd-07 --stream-name "Pupil Capture"
    # on the workers:
    gazeguard run --fleet --source jetstream --ledger postgresql://… --broker mqtt.lab:1883

The session id is ``--session``, else derived from the stream's source_id, exactly as
``gazeguard run`` derives it, so a restarted forwarder continues the same session (and budget).
Needs nats-py (``pip install 'gazeguard[fleet]'``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import pylsl

from gazeguard.config import Settings
from gazeguard.core.errors import PublishError
from gazeguard.core.samples import lsl_unix_offset
from gazeguard.runtime.ingest import GazeStream, GazeStreamInfo, declared_rate
from gazeguard.runtime.jetstream import JetStreamSender
from gazeguard.runtime.jetstream.wire import cancel_connect
from gazeguard.wire.topics import session_id_for

log = logging.getLogger(__name__)

#: Say that NATS does not answer (once) after this long, s.
SAY_WAITING_S = 2.0


@dataclass
class ForwardSummary:
    """What one ``forward`` run did.

    Attributes:
        session: the session id (without the device prefix the workers add).
        blocks, samples: acknowledged by the stream.
        reconnects: to the NATS servers (nats-py reconnects by itself).
        retries: blocks sent again after a missing acknowledgement (kept once by the stream).
    """

    session: str = ""
    blocks: int = 0
    samples: int = 0
    reconnects: int = 0
    retries: int = 0


#: ``ready(summary, stream info)``, called once connected to NATS and the stream is resolved.
Ready = Callable[[ForwardSummary, GazeStreamInfo], None]


async def forward(
    settings: Settings,
    *,
    duration_s: float | None = None,
    stop: asyncio.Event | None = None,
    ready: Ready | None = None,
) -> ForwardSummary:
    """Forward the configured LSL gaze stream to the NATS JetStream stream of ``fleet.nats``
    until ``stop``, ``duration_s`` or the stream ends.

    Raises:
        PublishError: NATS cannot be reached, or refuses this credential's publishes.
    """
    stop = stop or asyncio.Event()
    summary = ForwardSummary()
    async with GazeStream(settings.ingest, poll_interval_s=settings.fleet.nats.block_s) as stream:
        info = stream.info
        summary.session = settings.session or session_id_for(info.source_id, info.name)
        sender = JetStreamSender(
            settings.fleet.nats,
            settings.device,
            summary.session,
            unix_offset=lsl_unix_offset,  # this host's clock: workers run elsewhere
            clock=pylsl.local_clock,
            rate_hz=declared_rate(settings.ingest.rate_hz, info.nominal_srate, info.name),
        )
        if not await _connect(sender, stop, settings):
            return summary  # stopped before NATS answered
        try:
            if ready is not None:
                ready(summary, info)

            async def pump() -> None:
                async for block in stream:
                    await sender.send(block)
                    summary.blocks += 1
                    summary.samples += len(block)

            try:
                async with asyncio.TaskGroup() as tg:  # as serve(): the first of stop/time/end
                    pumping = tg.create_task(pump(), name="gazeguard.runtime.forward.pump")
                    waiter = tg.create_task(stop.wait(), name="gazeguard.runtime.forward.stop")
                    await asyncio.wait(
                        {pumping, waiter}, timeout=duration_s, return_when=asyncio.FIRST_COMPLETED
                    )
                    pumping.cancel()
                    waiter.cancel()
            except* PublishError as group:  # refused: one error, not a group
                raise group.exceptions[0] from None
            finally:
                summary.reconnects = sender.reconnects
                summary.retries = sender.retries
        finally:
            await sender.__aexit__(None, None, None)
    return summary


async def _connect(sender: JetStreamSender, stop: asyncio.Event, settings: Settings) -> bool:
    """Connect ``sender``, however long NATS takes to answer (nats-py tries for ever), saying
    so once after :data:`SAY_WAITING_S`; ``False``: ``stop`` came first.

    Raises:
        PublishError: NATS refused the connection.
    """
    entering = asyncio.ensure_future(sender.__aenter__())
    stopped = asyncio.ensure_future(stop.wait())
    said = False
    try:
        while True:
            done, _ = await asyncio.wait(
                {entering, stopped}, timeout=SAY_WAITING_S, return_when=asyncio.FIRST_COMPLETED
            )
            if entering in done:
                entering.result()
                return True
            if stopped in done:
                return False
            if not said:
                log.warning(
                    "no NATS server answers at %s yet; still trying (start nats-server, or "
                    "correct --nats / fleet.nats.servers; Ctrl-C to stop)",
                    ", ".join(settings.fleet.nats.servers),
                )
                said = True
    finally:
        stopped.cancel()
        if not entering.done():
            await cancel_connect(entering)
            await sender.__aexit__(None, None, None)  # (had it connected meanwhile)
