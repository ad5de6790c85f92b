"""``gazeguard forward``: :func:`gazeguard.runtime.forward.forward` from the command line."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from gazeguard.cli._common import (
    ExitCode,
    Signals,
    get_console,
    interrupted_line,
    stop_on_signals,
)
from gazeguard.config import Settings, load_settings
from gazeguard.core.words import counted
from gazeguard.runtime.forward import ForwardSummary, forward
from gazeguard.runtime.ingest import GazeStreamInfo
from gazeguard.wire.topics import chunk_topic


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard forward``."""
    parser.description = (
        "Device side of a fleet: read this headset's LSL gaze stream (same presets and "
        "normalisation as `gazeguard run`) and publish it to the fleet's NATS JetStream stream, "
        "where the worker pinned on its partition (`gazeguard run --fleet --source jetstream`) "
        "privatizes it. Raw gaze goes on the wire: use TLS and a credential of this device "
        "only ([fleet.nats] in --config). Rides out NATS outages (the client reconnects and "
        "buffers; unacknowledged blocks are sent again). Stops on Ctrl-C / SIGTERM."
    )
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    g = parser.add_argument_group("configuration (flags override GAZEGUARD_* env and --config)")
    g.add_argument("--config", type=Path, help="TOML configuration file")
    g.add_argument(
        "--nats",
        action="append",
        metavar="URL",
        help="NATS server URL, nats:// or tls:// (repeatable; default fleet.nats.servers)",
    )
    g.add_argument("--creds", type=Path, metavar="FILE", help="this device's NATS credentials file")
    g.add_argument("--device", help="device id (default: host name)")
    g.add_argument("--session", help="session id (default: derived from the stream source_id)")
    g.add_argument("--stream-type", help="LSL stream type to resolve (default Gaze)")
    g.add_argument("--stream-name", help="LSL stream name to resolve")
    g.add_argument("--source-id", help="LSL source_id to resolve")
    g.add_argument("--preset", help="channel preset (default auto)")
    g.add_argument(
        "--block-s",
        type=float,
        metavar="S",
        help="seconds of gaze per raw block (default fleet.nats.block_s, 1 s): larger blocks "
        "cost the workers less per session, each sample waits up to this long here",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """``--config``, the environment, then the flags given; the stream is always real LSL.

    Raises:
        ConfigError: a bad setting.
    """
    o: dict[str, Any] = {"ingest": {"source": "lsl"}}
    for key in ("device", "session"):
        if getattr(args, key) is not None:
            o[key] = getattr(args, key)
    for key in ("stream_type", "stream_name", "source_id", "preset"):
        if getattr(args, key) is not None:
            o["ingest"][key] = getattr(args, key)
    nats: dict[str, Any] = {}
    if args.nats:
        nats["servers"] = list(args.nats)
    if args.creds is not None:
        nats["creds_file"] = args.creds
    if args.block_s is not None:
        nats["block_s"] = args.block_s
    if nats:
        o["fleet"] = {"nats": nats}
    return load_settings(args.config, **o)


def run(args: argparse.Namespace) -> int:
    """``gazeguard forward``."""
    settings = settings_from_args(args)
    servers = ", ".join(settings.fleet.nats.servers)
    console = get_console()

    def banner(summary: ForwardSummary, info: GazeStreamInfo) -> None:
        session = f"{settings.device}.{summary.session}"
        topic = chunk_topic(settings.broker.topic_prefix, settings.device, session)
        console.say(
            "banner",
            f"gazeguard forward: LSL {info.name!r} ({info.preset}, {info.nominal_srate:g} Hz) → "
            f"session {session} on NATS JetStream {servers}; the fleet publishes its "
            f"privatized chunks on {topic}",
            stream=info.name,
            session=session,
            servers=list(settings.fleet.nats.servers),
            topic=topic,
        )

    async def main() -> tuple[ForwardSummary, Signals]:
        stop = asyncio.Event()
        signals = stop_on_signals(stop)
        summary = await forward(settings, duration_s=args.duration, stop=stop, ready=banner)
        return summary, signals

    s, signals = asyncio.run(main())
    if signals.interrupted:
        interrupted_line("gazeguard forward")
    console.say(
        "summary",
        f"gazeguard forward: session {settings.device}.{s.session}: {counted(s.blocks, 'block')}"
        f", {counted(s.samples, 'sample')} acknowledged by the stream; "
        f"{counted(s.reconnects, 'reconnect')}, {counted(s.retries, 'block')} sent again",
        blocks=s.blocks,
        samples=s.samples,
        reconnects=s.reconnects,
        retries=s.retries,
    )
    return ExitCode.INTERRUPTED if signals.interrupted else ExitCode.OK
