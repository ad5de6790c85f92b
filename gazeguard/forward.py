"""``gazeguard forward``: the device side of an MQTT fleet, from the command line.

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

The session id is ``--session``, else derived from the stream's source_id, exactly as
``gazeguard run`` derives it, so a restarted forwarder continues the same session (and budget).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gazeguard.config import BrokerSettings, Settings, broker_address, load_settings
from gazeguard.errors import ConfigError
from gazeguard.fleet import RawGazeSender
from gazeguard.ingest import GazeStream, GazeStreamInfo
from gazeguard.service import session_id_for


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
) -> ForwardSummary:
    """Forward the configured LSL gaze stream to the fleet until ``stop``, ``duration_s`` or the
    stream ends."""
    stop = stop or asyncio.Event()
    raw = raw_broker(settings)
    summary = ForwardSummary()
    async with GazeStream(settings.ingest) as stream:
        info = stream.info
        summary.session = settings.session or session_id_for(info.source_id, info.name)
        async with RawGazeSender(
            raw, settings.device, summary.session, prefix=settings.fleet.raw_prefix
        ) as sender:
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


def configure_forward(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard forward``."""
    parser.description = (
        "Device side of an MQTT fleet: read this headset's LSL gaze stream (same presets and "
        "normalisation as `gazeguard run`) and send it to the fleet's raw topics, where one "
        "`gazeguard run --fleet --source mqtt` worker claims and privatizes it. Raw gaze goes "
        "on the wire: use it inside a trusted network only. Buffers through worker failover "
        "and broker restarts. Stops on Ctrl-C / SIGTERM."
    )
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    g = parser.add_argument_group("configuration (flags override GAZEGUARD_* env and --config)")
    g.add_argument("--config", type=Path, help="TOML configuration file")
    g.add_argument("--broker", help="HOST[:PORT] of the fleet's MQTT broker (required)")
    g.add_argument("--device", help="device id (default: host name)")
    g.add_argument("--session", help="session id (default: derived from the stream source_id)")
    g.add_argument("--stream-type", help="LSL stream type to resolve (default Gaze)")
    g.add_argument("--stream-name", help="LSL stream name to resolve")
    g.add_argument("--source-id", help="LSL source_id to resolve")
    g.add_argument("--preset", help="channel preset (default auto)")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """``--config``, the environment, then the flags given; the stream is always real LSL."""
    o: dict[str, Any] = {"ingest": {"source": "lsl"}}
    for key in ("device", "session"):
        if getattr(args, key) is not None:
            o[key] = getattr(args, key)
    for key in ("stream_type", "stream_name", "source_id", "preset"):
        if getattr(args, key) is not None:
            o["ingest"][key] = getattr(args, key)
    if args.broker:
        o["broker"] = broker_address(args.broker)
    return load_settings(args.config, **o)


def run_forward(args: argparse.Namespace) -> int:
    """``gazeguard forward``."""
    settings = settings_from_args(args)
    raw_broker(settings)  # fail before resolving the stream

    def banner(summary: ForwardSummary, info: GazeStreamInfo, owner: str | None) -> None:
        print(  # noqa: T201 - startup banner of the CLI
            f"gazeguard forward: LSL {info.name!r} ({info.preset}, {info.nominal_srate:g} Hz) → "
            f"session {settings.device}.{summary.session} on "
            f"{raw_broker(settings).host}:{raw_broker(settings).port}, claimed by worker {owner}",
            file=sys.stderr,
            flush=True,
        )

    async def main() -> ForwardSummary:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await forward(settings, duration_s=args.duration, stop=stop, ready=banner)

    s = asyncio.run(main())
    print(  # noqa: T201 - summary of the CLI
        f"gazeguard forward: session {settings.device}.{s.session}: {s.blocks} blocks, "
        f"{s.samples} samples; workers {', '.join(s.owners) or 'none'}; "
        f"{s.reconnects} reconnects, {s.dropped_blocks} blocks dropped from a full buffer",
        file=sys.stderr,
    )
    return 0
