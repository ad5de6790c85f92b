"""``gazeguard watch``: see what a gazeguard publishes — chunks, labels and status — as they
arrive, each validated against the message schema (the pydantic models the shipped JSON Schemas
are generated from), with each feature's values beside the noise they carry.

Works against any gazeguard: the embedded broker of ``gazeguard run`` or a Mosquitto. A message
that does not validate is reported (topic and the first error) and watching goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from collections.abc import Sequence
from pathlib import Path

import aiomqtt
from pydantic import ValidationError

from gazeguard.cli._common import ExitCode, run_loop, stdout, stop_on_signals
from gazeguard.config import broker_address, load_settings
from gazeguard.label_message import LabelMessage
from gazeguard.message import ChunkMessage, StatusMessage

#: Sparkline blocks, lowest to highest.
BARS = "▁▂▃▄▅▆▇█"


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard watch``."""
    parser.add_argument(
        "--broker", help="HOST[:PORT] (default: broker.host/port of --config, else 127.0.0.1:1883)"
    )
    parser.add_argument("--config", type=Path, help="configuration file (TOML) naming the broker")
    parser.add_argument("--device", default="+", help="only this device (default: every device)")
    parser.add_argument("--session", default="+", help="only this session (default: every one)")
    parser.add_argument("--prefix", help="topic prefix (default: broker.topic_prefix)")
    parser.add_argument(
        "--count", type=int, help="exit after this many chunk and label messages (default: never)"
    )
    parser.add_argument("--duration", type=float, help="exit after this many seconds")
    parser.add_argument("--features", type=int, default=8, help="features shown per chunk (8)")
    parser.add_argument("--json", action="store_true", help="one validated message per line")


def sparkline(values: Sequence[float], lo: float, hi: float) -> str:
    """``values`` as block characters on the public range ``[lo, hi]``."""
    span = hi - lo if hi > lo else 1.0
    out = []
    for v in values:
        x = min(max((v - lo) / span, 0.0), 1.0)
        out.append(BARS[min(int(x * len(BARS)), len(BARS) - 1)])
    return "".join(out)


def describe_chunk(m: ChunkMessage, shown: int) -> list[str]:
    """A chunk for people: what it costs, what it carries, each feature beside its noise."""
    led = m.ledger
    hour = "" if led.window_cap is None else f" of {led.window_cap:g}"
    lines = [
        f"chunk {m.chunk_index} {m.device}/{m.session} ({m.unix_end - m.unix_start:.3g} s of "
        f"gaze; {m.mechanism.name}/{m.mechanism.transform} k={m.mechanism.k} "
        f"{m.mechanism.noise}): user-level ε {led.epsilon:.3g} at δ {led.delta:g}, last hour "
        f"{led.epsilon_window:.3g}{hour}",
        f"  carries {m.carries}" if m.carries else "  carries: (not stated)",
    ]
    for i, name in enumerate(m.features[:shown]):
        vals = m.values[i]
        lo, hi = min(vals), max(vals)
        lines.append(
            f"  {name:<26} {sparkline(vals, lo, hi) if hi > lo else '─' * min(len(vals), 32)}"
            f"  {lo:.3g}..{hi:.3g} {m.units[i]}  (noise scale {m.mechanism.noise_scale[i]:.3g})"
        )
    if len(m.features) > shown:
        lines.append(f"  … {len(m.features) - shown} more features")
    return lines


def describe(topic: str, payload: bytes, shown: int) -> tuple[str, list[str], object | None]:
    """``(kind, lines, model)`` for one message; kind ``invalid`` with the first error."""
    kind = topic.rsplit("/", 1)[-1]
    models: dict[str, type[ChunkMessage] | type[LabelMessage] | type[StatusMessage]] = {
        "chunks": ChunkMessage, "labels": LabelMessage, "status": StatusMessage,
    }  # fmt: skip
    parse = models.get(kind)
    if parse is None:
        return "other", [f"{topic}: not a gazeguard topic (ignored)"], None
    try:
        model: ChunkMessage | LabelMessage | StatusMessage = parse.from_payload(payload)
    except (ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0:3]
        return "invalid", [f"INVALID message on {topic}: {' '.join(first)}"], None
    if isinstance(model, ChunkMessage):
        return "chunks", describe_chunk(model, shown), model
    if isinstance(model, LabelMessage):
        return (
            "labels",
            [
                f"label {model.decision_index} {model.device}/{model.session}: {model.label!r} "
                f"(randomized response over {len(model.classes)} classes at ε {model.epsilon:.3g}:"
                f" true with probability {model.survival_probability:.2f})"
            ],
            model,
        )
    assert isinstance(model, StatusMessage)
    eps = "" if model.epsilon is None else f", user-level ε {model.epsilon:.3g}"
    return (
        "status",
        [
            f"status {model.device}/{model.session}: {model.state}{eps}; chunks charged "
            f"{model.chunks_charged}, delivered {model.chunks_delivered}, refused "
            f"{model.chunks_refused}, withheld {model.chunks_withheld}"
            + (f" — {model.reason}" if model.reason else "")
        ],
        model,
    )


async def watch(args: argparse.Namespace) -> int:
    """Subscribe and print until ``--count`` messages, ``--duration`` or a signal."""
    settings = load_settings(args.config).broker
    host, port = settings.host or "127.0.0.1", settings.port
    if args.broker:
        addr = broker_address(args.broker)
        host, port = addr["host"], int(addr.get("port", port))
    prefix = args.prefix or settings.topic_prefix
    stop = asyncio.Event()
    stop_on_signals(stop)
    seen = invalid = 0
    topic = f"{prefix}/{args.device}/{args.session}/+"

    async def consume() -> None:
        nonlocal seen, invalid
        async with aiomqtt.Client(host, port, identifier=None) as client:
            await client.subscribe(topic, qos=1)
            if not args.json:
                stdout(f"watching {topic} on {host}:{port} (Ctrl-C to stop)")
            async for message in client.messages:
                payload = message.payload
                if not isinstance(payload, bytes | bytearray):
                    continue
                kind, lines, model = describe(str(message.topic), bytes(payload), args.features)
                invalid += kind == "invalid"
                if args.json:
                    doc = {"topic": str(message.topic), "kind": kind}
                    if model is not None and hasattr(model, "model_dump"):
                        doc["message"] = model.model_dump(mode="json", by_alias=True)
                    else:
                        doc["error"] = lines[0]
                    stdout(json.dumps(doc))
                else:
                    for line in lines:
                        stdout(line)
                if kind in ("chunks", "labels"):
                    seen += 1
                    if args.count is not None and seen >= args.count:
                        return

    task = asyncio.create_task(consume())
    waiter = asyncio.create_task(stop.wait())
    timeout = None if args.duration is None else max(args.duration, 0.0)
    done, _ = await asyncio.wait({task, waiter}, timeout=timeout, return_when="FIRST_COMPLETED")
    for t in (task, waiter):
        t.cancel()
    if task in done and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]
    if not args.json:
        stdout(f"{seen} chunk and label messages, {invalid} invalid")
    return ExitCode.ERROR if invalid else ExitCode.OK


def run(args: argparse.Namespace) -> int:
    """``gazeguard watch``: exit 0, or 1 when an invalid message was seen."""
    if args.count is not None and args.count < 1:
        args.count = None
    if args.duration is not None and not math.isfinite(args.duration):
        args.duration = None
    return run_loop(watch(args))


def watch_hint(host: str, port: int, prefix: str, device: str, session: str) -> str:
    """The lines ``gazeguard run`` prints so a newcomer can see what it publishes."""
    return (
        f"see what is published: gazeguard watch --broker {host}:{port} --device {device} "
        f"--session {session}   (or: mosquitto_sub -h {host} -p {port} -t "
        f"'{prefix}/{device}/{session}/#' -v)"
    )
