"""``gazeguard watch``: see what a gazeguard publishes — chunks, labels, status, cohort
receipts, and a fleet's cohort aggregates and attention heatmaps — as they arrive, each
validated against the message schema (the pydantic models the shipped JSON Schemas are generated
from), with each feature's values beside the noise they carry.

Cohort messages (``{prefix}/cohort/NAME/aggregates``, ``…/attention`` and ``…/mode``) are
shown when every device is watched (no ``--device``), each figure with its 95 % noise band and
whether that band makes it readable (:mod:`gazeguard.runtime.dashboard.readability`, as the
dashboard marks it).

Works against any gazeguard: the embedded broker of ``gazeguard run`` or a Mosquitto. A message
that does not validate is reported (topic and the first error) and watching goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiomqtt
from pydantic import ValidationError

from gazeguard.cli._common import ExitCode, get_console, run_loop, stdout, stop_on_signals
from gazeguard.config import broker_address, load_settings
from gazeguard.core.errors import GazeguardError
from gazeguard.core.words import counted
from gazeguard.runtime.dashboard.readability import (
    Z95,
    aggregate_readability,
    attention_readability,
    count_sd,
    mode_readability,
)
from gazeguard.runtime.mqtt.client import ClientFactory
from gazeguard.runtime.mqtt.sink import explain_failure
from gazeguard.wire.cohort import AttentionMessage, CohortMessage, CohortReceipt, ModeMessage
from gazeguard.wire.glossary import glossary_markdown, glossary_text
from gazeguard.wire.kinds import kind_of_topic
from gazeguard.wire.label import LabelMessage
from gazeguard.wire.message import (
    VALUE_NOISE_LABEL,
    ChunkMessage,
    StatusMessage,
    value_noise_text,
)

#: Sparkline blocks, lowest to highest.
BARS = "▁▂▃▄▅▆▇█"

#: Marks after a value that sits at its feature's public lower / upper bound.
AT_LOWER, AT_UPPER = "⊥", "⊤"

#: What the chunk lines mean, said once before the first message.
LEGEND = (
    f"each chunk line: feature, its values on the public range [lower, upper], their least and "
    f"greatest ({AT_LOWER}/{AT_UPPER}: at the public lower/upper bound, where clipping put it), "
    f"summary (mean and last value of the chunk) and {VALUE_NOISE_LABEL}: the standard "
    "deviation of the noise on each published value, in the feature's units and as a multiple "
    "of its public range (upper − lower). gazeguard watch --explain defines every term"
)


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
    parser.add_argument(
        "--explain",
        nargs="?",
        const="text",
        choices=("text", "markdown"),
        help="print the glossary (every term watch, run and demo print, each feature's meaning, "
        "unit and public range) and exit; 'markdown' prints docs/glossary.md",
    )


def sparkline(values: Sequence[float], lo: float, hi: float) -> str:
    """``values`` as block characters on the public range ``[lo, hi]``."""
    span = hi - lo if hi > lo else 1.0
    out = []
    for v in values:
        x = min(max((v - lo) / span, 0.0), 1.0)
        out.append(BARS[min(int(x * len(BARS)), len(BARS) - 1)])
    return "".join(out)


def at_bound(value: float, lower: float | None, upper: float | None) -> str:
    """``value`` to 3 significant digits, marked :data:`AT_LOWER` or :data:`AT_UPPER` when it
    sits at the public bound (``None``: not stated by the sender)."""
    mark = ""
    if lower is not None and value <= lower:
        mark = AT_LOWER
    elif upper is not None and value >= upper:
        mark = AT_UPPER
    return f"{value:.3g}{mark}"


def describe_chunk(m: ChunkMessage, shown: int) -> list[str]:
    """A chunk for people: what it costs, what it carries, each feature beside its noise
    (``value_noise_sd``) and its values marked where they sit at a public bound."""
    led = m.ledger
    hour = "" if led.window_cap is None else f" of {led.window_cap:g}"
    lines = [
        f"chunk {m.chunk_index} {m.device}/{m.session} ({m.unix_end - m.unix_start:.3g} s of "
        f"gaze; {m.mechanism.name}/{m.mechanism.transform} k={m.mechanism.k} "
        f"{m.mechanism.noise}): user-level ε {led.epsilon:.3g} at δ {led.delta:g}, last hour "
        f"{led.epsilon_window:.3g}{hour}",
        f"  carries {m.carries}" if m.carries else "  carries: (not stated)",
    ]
    mech = m.mechanism
    for i, name in enumerate(m.features[:shown]):
        vals = m.values[i]
        lo, hi = min(vals), max(vals)
        lower, upper = mech.lower[i], mech.upper[i]
        spark = sparkline(vals, lower, upper)
        sd, frac = mech.value_noise_sd[i], mech.value_noise_range[i]
        noise = f"{VALUE_NOISE_LABEL} {value_noise_text(sd, frac, m.units[i])}"
        summary = (
            ""
            if m.summary is None
            else f"  mean {m.summary.mean[i]:.3g}, last {m.summary.last[i]:.3g}"
        )
        lines.append(
            f"  {name:<26} {spark}  {at_bound(lo, lower, upper)}..{at_bound(hi, lower, upper)} "
            f"{m.units[i]}{summary}  ({noise})"
        )
    if len(m.features) > shown:
        lines.append(f"  … {len(m.features) - shown} more features")
    return lines


def span(seconds: float) -> str:
    """A duration for people: ``45 s``, ``6 min 40 s``, ``1 h 02 min``."""
    s = max(round(seconds), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def clock(unix: float) -> str:
    """A Unix time as local wall-clock time, ``HH:MM:SS``."""
    return time.strftime("%H:%M:%S", time.localtime(unix))


#: Per (device, session): the label a consumer holds now.
Holds = dict[tuple[str, str], LabelMessage]


def describe_label(m: LabelMessage, previous: LabelMessage | None = None) -> list[str]:
    """A label for people: what it says, since when it holds, the probability that it is right
    (as the plan states it: randomized response's survival with the model's clean accuracy)
    and how long the label it replaces held."""
    since = "" if m.unix_end is None else f" since {clock(m.unix_end)}"
    right = m.right_probability
    p, c = m.survival_probability, len(m.classes)
    eps = f"ε {m.epsilon:.3g}"
    lines = [
        f"label {m.decision_index} {m.device}/{m.session}: {m.label!r}{since} (on a clock) — "
        + (
            f"right with probability {right:.2f}"
            if right is not None
            else f"the model's label with probability {p:.2f}"
        )
    ]
    if right is not None and m.clean_accuracy is not None:
        acc = m.clean_accuracy
        lines.append(
            f"  randomized response over {c} classes at {eps} keeps the model's label with p = "
            f"{p:.2f}; the model is right {acc:.2f} of the time (its file, leave one person "
            f"out): p·acc + (1−p)(1−acc)/(C−1) = {right:.2f} (chance {1 / c:.2f})"
        )
    else:
        lines.append(
            f"  randomized response over {c} classes at {eps}: the model's label with p = "
            f"{p:.2f} (the message states no clean accuracy)"
        )
    if previous is not None:
        held = (
            f" for {span(m.unix_end - previous.unix_end)} (since {clock(previous.unix_end)})"
            if m.unix_end is not None and previous.unix_end is not None
            else ""
        )
        lines.append(f"  replaces {previous.label!r}, held{held}")
    return lines


def readable_text(figure: dict[str, object] | None) -> str:
    """A figure's readability (:func:`aggregate_readability`) in a few words."""
    if figure is None:
        return "—"
    if figure["readable"]:
        return "readable"
    return f"too noisy, needs ≥ {figure['sessions']:,} sessions"


def _bucket_head(kind: str, m: CohortMessage | AttentionMessage, gaze: str) -> str:
    """``{kind} 'cohort' bucket N (worker W, {gaze}to HH:MM:SS): about N sessions``: how a
    cohort or attention message's description starts (``gaze``: the span of gaze, or "")."""
    about = max(round(m.noisy_count), 0)
    return (
        f"{kind} {m.cohort!r} bucket {m.bucket} (worker {m.worker}, {gaze}to "
        f"{clock(m.bucket_end)}): about {about} sessions"
    )


def _noise_words(m: CohortMessage | AttentionMessage) -> str:
    """The Gaussian σ of a cohort or attention message and its ε per hour at δ, in words."""
    return (
        f"Gaussian σ {m.sigma:.3g}, {m.epsilon_per_hour:.3g} ε per hour of buckets at δ {m.delta:g}"
    )


def describe_aggregate(m: CohortMessage, shown: int) -> list[str]:
    """A cohort aggregate for people: the bucket, about how many sessions, each figure with its
    95 % noise band (± 1.96 sd, as the dashboard draws it) and whether it is readable."""
    read = aggregate_readability(m)
    lines = [
        _bucket_head("cohort", m, f"{span(m.bucket_end - m.bucket_start)} of gaze ")
        + f" (noisy count {m.noisy_count:.3g} ± {Z95 * count_sd(m):.3g}, "
        f"{readable_text(read['count'])}); {_noise_words(m)}"
        + ("" if m.noise == "os-csprng" else " — " + m.noise)
    ]
    if m.features:
        lines.append(f"  feature means, ± 95 % band ({readable_text(read['means'])}):")
        lines.extend(
            f"  {f.name:<26} {f.mean:.3g} ± {Z95 * f.sd:.3g} {f.unit}" for f in m.features[:shown]
        )
        if len(m.features) > shown:
            lines.append(f"  … {len(m.features) - shown} more features")
    if m.classes:
        total = sum(max(h, 0.0) for h in m.noisy_histogram)
        band = f"± {100 * Z95 * m.sigma / total:.3g} points" if total > 0 else "no positive class"
        lines.append(
            f"  class shares ({band}, {readable_text(read['shares'])}): "
            + ", ".join(f"{c} {100 * s:.1f} %" for c, s in zip(m.classes, m.shares, strict=True))
        )
    return lines


#: Shades of a heatmap cell, least to most dwell.
SHADES = " ░▒▓█"


def describe_attention(m: AttentionMessage) -> list[str]:
    """An attention message for people: the heatmap as rows of shades (row 0 on top, scaled to
    the hottest cell), its hottest cell, the AOI shares, each with whether it is readable."""
    read = attention_readability(m)
    lines = [_bucket_head("attention", m, "") + f"' gaze on the field; {_noise_words(m)}"]
    if m.heatmap is not None and m.fov_deg is not None:
        top = max(max(row) for row in m.heatmap)
        r, c = max(
            ((i, j) for i, row in enumerate(m.heatmap) for j in range(len(row))),
            key=lambda ij: m.heatmap[ij[0]][ij[1]] if m.heatmap is not None else 0.0,
        )
        width, height = m.fov_deg
        x = -width / 2 + (c + 0.5) * width / len(m.heatmap[0])
        y = height / 2 - (r + 0.5) * height / len(m.heatmap)
        lines.append(
            f"  dwell heatmap {m.rows}×{m.cols} over {width:g}×{height:g}° "
            f"({readable_text(read['heatmap'])}); hottest cell {100 * top:.1f} % of the dwell "
            f"at x {x:+.1f}°, y {y:+.1f}°"
        )
        for row in m.heatmap:
            cells = (
                SHADES[min(int(v / top * len(SHADES)), len(SHADES) - 1)] if top > 0 else " "
                for v in row
            )
            lines.append("  │" + "".join(ch * 2 for ch in cells) + "│")
    if m.aois is not None:
        lines.append(
            f"  areas ({m.aoi_file}; {readable_text(read['aois'])}): "
            + ", ".join(f"{a.name} {100 * a.share:.1f} %" for a in m.aois)
        )
    return lines


def describe_mode(m: ModeMessage) -> list[str]:
    """A mode for people: the group's dominant activity in the bucket and what it takes to be
    right (the lead at which permute-and-flip names the true mode 9 times in 10)."""
    need = mode_readability(m)["sessions"]
    return [
        f"mode {m.cohort!r} bucket {m.bucket} (worker {m.worker}, to {clock(m.bucket_end)}): "
        f"{m.mode!r} of {len(m.classes)} classes ({m.model}; permute-and-flip, ε {m.epsilon:.3g} "
        f"per bucket) — right 9 times in 10 when it leads every other class by "
        f"{m.lead_for_90:.3g} sessions' votes (a 10-point lead from {need:,} sessions); "
        f"{m.epsilon_per_hour:.3g} ε per hour of buckets at δ {m.delta:g}"
    ]


def describe_receipt(m: CohortReceipt) -> list[str]:
    """A cohort receipt for people: the bucket the session was charged for, and how much."""
    return [
        f"receipt {m.session}: charged for cohort {m.cohort!r} bucket {m.bucket} ({m.release}, "
        f"worker {m.worker}): {m.epsilon_per_hour:.3g} ε per hour of buckets at δ {m.delta:g}"
    ]


def describe_held_label(m: LabelMessage, holds: Holds | None) -> list[str]:
    """A label beside the one it replaces (:func:`describe_label`); ``holds`` is updated."""
    key = (m.device, m.session)
    previous = None if holds is None else holds.get(key)
    if holds is not None:
        holds[key] = m
    return describe_label(m, previous)


def describe_status(m: StatusMessage, holds: Holds | None) -> list[str]:
    """A status for people, with the label its session holds (from ``holds``)."""
    eps = "" if m.epsilon is None else f", user-level ε {m.epsilon:.3g}"
    held = None if holds is None else holds.get((m.device, m.session))
    if held is not None:
        since = held.unix_end
        eps += f"; holds label {held.label!r}" + (
            "" if since is None else f" since {clock(since)} ({span(m.time - since)})"
        )
    return [
        f"status {m.device}/{m.session}: {m.state}{eps}; chunks charged "
        f"{m.chunks_charged}, delivered {m.chunks_delivered}, refused "
        f"{m.chunks_refused}, withheld {m.chunks_withheld}, dropped "
        f"{m.chunks_dropped}" + (f" — {m.reason}" if m.reason else "")
    ]


#: How ``watch`` shows each release kind (:data:`gazeguard.wire.kinds.KINDS`), by kind name:
#: ``(message, features shown, labels held) → lines``.
RENDER: dict[str, Callable[[Any, int, Holds | None], list[str]]] = {
    "chunks": lambda m, shown, _: describe_chunk(m, shown),
    "status": lambda m, _, holds: describe_status(m, holds),
    "labels": lambda m, _, holds: describe_held_label(m, holds),
    "aggregates": lambda m, shown, _: describe_aggregate(m, shown),
    "attention": lambda m, _, __: describe_attention(m),
    "receipts": lambda m, _, __: describe_receipt(m),
    "mode": lambda m, _, __: describe_mode(m),
}


def describe(
    topic: str, payload: bytes, shown: int, holds: Holds | None = None
) -> tuple[str, list[str], object | None]:
    """``(kind, lines, model)`` for one message: its kind's name (by its topic's last level,
    :func:`gazeguard.wire.kinds.kind_of_topic`), or ``invalid`` with the first error, or
    ``other``. ``holds``: the labels held so far, updated by a label and shown with a status."""
    kind = kind_of_topic(topic)
    if kind is None:
        return "other", [f"{topic}: not a gazeguard topic (ignored)"], None
    try:
        model = kind.model.from_payload(payload)
    except (ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0:3]
        return "invalid", [f"INVALID message on {topic}: {' '.join(first)}"], None
    return kind.name, RENDER[kind.name](model, shown, holds), model


#: Between attempts to reach the broker, s.
RETRY_S = 1.0


class _Watcher:
    """One ``gazeguard watch``: the broker, the topic, and what was seen."""

    def __init__(self, args: argparse.Namespace) -> None:
        settings = load_settings(args.config).broker
        host, port = settings.host or "127.0.0.1", settings.port
        if args.broker:
            addr = broker_address(args.broker)
            host, port = addr["host"], int(addr.get("port", port))
        self.args = args
        self.broker = settings.model_copy(update={"host": host, "port": port})
        self.where = f"{host}:{port}"
        self.clients = ClientFactory(self.broker)  # the login and TLS of --config
        prefix = args.prefix or settings.topic_prefix
        self.topic = f"{prefix}/{args.device}/{args.session}/+"
        self.seen = self.invalid = 0
        self.holds: Holds = {}
        self.statuses: dict[str, object] = {}  # per status topic: the last one shown

    def show(self, message: aiomqtt.Message) -> bool:
        """Print one message; whether ``--count`` is reached."""
        payload = message.payload
        if not isinstance(payload, bytes | bytearray):
            return False
        kind, lines, model = describe(
            str(message.topic), bytes(payload), self.args.features, self.holds
        )
        self.invalid += kind == "invalid"
        if self.args.json:
            doc = {"topic": str(message.topic), "kind": kind}
            if model is not None and hasattr(model, "model_dump"):
                doc["message"] = model.model_dump(mode="json", by_alias=True)
            else:
                doc["error"] = lines[0]
            stdout(json.dumps(doc))
        elif not self.repeated(str(message.topic), model):
            for line in lines:
                stdout(line)
        if kind in ("chunks", "labels"):
            self.seen += 1
            return self.args.count is not None and self.seen >= self.args.count
        return False

    def repeated(self, topic: str, model: object) -> bool:
        """Whether ``model`` is a status that says what the last one on its topic said (a
        sidecar republishes its status every few seconds; only a change is shown)."""
        if not isinstance(model, StatusMessage):
            return False
        said = model.model_dump(exclude={"time"})
        if self.statuses.get(topic) == said:
            return True
        self.statuses[topic] = said
        return False

    async def consume(self) -> None:
        """Watch until ``--count``; reconnect, saying so once per outage, while the broker is
        away.

        Raises:
            WatchError: the broker refused the login, the TLS handshake or the subscription.
        """
        console = get_console()
        connected_once = False
        outage: str | None = None
        while True:
            try:
                async with self.clients(None, protocol=aiomqtt.ProtocolVersion.V311) as client:
                    granted = await client.subscribe(self.topic, qos=1)
                    if any(getattr(g, "is_failure", False) or g == 0x80 for g in granted):
                        msg = (
                            f"broker {self.where} refused the subscription to {self.topic} (an "
                            "ACL: this login may not read it)"
                        )
                        raise WatchError(msg)
                    if connected_once:
                        if outage is not None:
                            console.say("watch", f"gazeguard watch: broker {self.where} is back")
                    elif not self.args.json:
                        stdout(f"watching {self.topic} on {self.where} (Ctrl-C to stop)")
                        stdout(LEGEND)
                    connected_once, outage = True, None
                    async for message in client.messages:
                        if self.show(message):
                            return
            except (aiomqtt.MqttError, OSError) as exc:
                reason, permanent = explain_failure(exc, self.broker)
                if permanent:
                    raise WatchError(f"broker {self.where}: {reason}") from None
                if outage is None:
                    what = (
                        f"lost broker {self.where} ({reason}): has the run whose embedded "
                        "broker it was ended?"
                        if connected_once
                        else f"no MQTT broker answers at {self.where} yet ({reason})"
                    )
                    console.warn(
                        f"gazeguard watch: {what}; trying again every {RETRY_S:g} s "
                        "(Ctrl-C to stop)",
                        broker=self.where,
                        reason=reason,
                    )
                    outage = reason
            await asyncio.sleep(RETRY_S)


async def watch(args: argparse.Namespace) -> int:
    """Subscribe and print until ``--count`` messages, ``--duration`` or a signal.

    A broker that does not answer yet, or goes away (the embedded broker of a run that ended),
    is said in one line and tried again every :data:`RETRY_S` until it answers; a refused login
    or subscription ends the watch (:class:`WatchError`). Returns 130 after Ctrl-C, 1 when an
    invalid message was seen, else 0.
    """
    watcher = _Watcher(args)
    stop = asyncio.Event()
    signals = stop_on_signals(stop)
    task = asyncio.create_task(watcher.consume())
    waiter = asyncio.create_task(stop.wait())
    timeout = None if args.duration is None else max(args.duration, 0.0)
    await asyncio.wait({task, waiter}, timeout=timeout, return_when="FIRST_COMPLETED")
    for t in (task, waiter):
        t.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task  # a WatchError is raised here
    if not args.json:
        stdout(f"{counted(watcher.seen, 'chunk and label message')}, {watcher.invalid} invalid")
    if signals.interrupted:
        return ExitCode.INTERRUPTED
    return ExitCode.ERROR if watcher.invalid else ExitCode.OK


class WatchError(GazeguardError):
    """Watching cannot go on: the broker refused the login, TLS or the subscription."""


def run(args: argparse.Namespace) -> int:
    """``gazeguard watch``: exit 0, 1 when an invalid message was seen (or the broker refused
    this client), 130 on Ctrl-C."""
    if explain := getattr(args, "explain", None):
        stdout(glossary_markdown() if explain == "markdown" else glossary_text())
        return ExitCode.OK
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
