"""``gazeguard forward``: :func:`gazeguard.forward.forward` from the command line."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any, Literal

from gazeguard.cli._common import ExitCode, get_console, stop_on_signals
from gazeguard.config import Settings, broker_address, load_settings
from gazeguard.forward import ForwardSummary, forward, raw_broker
from gazeguard.ingest import GazeStreamInfo


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard forward``."""
    parser.description = (
        "Device side of a fleet: read this headset's LSL gaze stream (same presets and "
        "normalisation as `gazeguard run`) and send it to the fleet's raw topics, where one "
        "`gazeguard run --fleet --source mqtt` worker claims and privatizes it (or, with --to "
        "jetstream, to the NATS JetStream stream read by `--source jetstream` workers). Raw "
        "gaze goes on the wire: use it inside a trusted network only. Buffers through worker "
        "failover and broker restarts. Stops on Ctrl-C / SIGTERM."
    )
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    g = parser.add_argument_group("configuration (flags override GAZEGUARD_* env and --config)")
    g.add_argument("--config", type=Path, help="TOML configuration file")
    g.add_argument(
        "--to",
        choices=["mqtt", "jetstream"],
        default="mqtt",
        help="the fleet's raw gaze transport: MQTT claim protocol (default) or NATS JetStream",
    )
    g.add_argument(
        "--broker", help="HOST[:PORT] of the fleet's MQTT broker (required with --to mqtt)"
    )
    g.add_argument(
        "--nats",
        action="append",
        metavar="URL",
        help="NATS server URL for --to jetstream (repeatable; default fleet.nats.servers)",
    )
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
    if getattr(args, "nats", None):
        o["fleet"] = {"nats": {"servers": list(args.nats)}}
    return load_settings(args.config, **o)


def run(args: argparse.Namespace) -> int:
    """``gazeguard forward``."""
    settings = settings_from_args(args)
    to: Literal["mqtt", "jetstream"] = "jetstream" if args.to == "jetstream" else "mqtt"
    if to == "mqtt":
        raw = raw_broker(settings)  # fail before resolving the stream
        where = f"on {raw.host}:{raw.port}, claimed by worker"
    else:
        where = f"on NATS JetStream {', '.join(settings.fleet.nats.servers)}"
    console = get_console()

    def banner(summary: ForwardSummary, info: GazeStreamInfo, owner: str | None) -> None:
        console.say(
            "banner",
            f"gazeguard forward: LSL {info.name!r} ({info.preset}, {info.nominal_srate:g} Hz) → "
            f"session {settings.device}.{summary.session} {where}"
            + (f" {owner}" if to == "mqtt" else ""),
            stream=info.name,
            session=f"{settings.device}.{summary.session}",
            worker=owner,
        )

    async def main() -> ForwardSummary:
        stop = asyncio.Event()
        stop_on_signals(stop)
        return await forward(settings, duration_s=args.duration, stop=stop, ready=banner, to=to)

    s = asyncio.run(main())
    console.say(
        "summary",
        f"gazeguard forward: session {settings.device}.{s.session}: {s.blocks} blocks, "
        f"{s.samples} samples; workers {', '.join(s.owners) or 'none'}; "
        f"{s.reconnects} reconnects, {s.dropped_blocks} blocks dropped from a full buffer",
        blocks=s.blocks,
        samples=s.samples,
        workers=s.owners,
        reconnects=s.reconnects,
        dropped_blocks=s.dropped_blocks,
    )
    return ExitCode.OK
