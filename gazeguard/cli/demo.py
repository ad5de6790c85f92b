"""``gazeguard demo``: :func:`gazeguard.offline.demo.demo` with a live terminal view and a PNG.

The view (stdout) is the demo's output: a banner saying exactly what the demo changes from
``gazeguard run``'s defaults and why (:func:`gazeguard.offline.demo.demo_changes`), one line per
chunk
as it arrives over MQTT (sparklines on each feature's public scale), the statuses, and a summary.
The PNG carries the same changes as its caption. Without matplotlib (the ``eval`` extra) the
live view still runs and the PNG is skipped with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import uuid
from pathlib import Path
from typing import Any

from gazeguard.cli._common import (
    ExitCode,
    Signals,
    available,
    get_console,
    interrupted_line,
    run_loop,
    stdout,
    stop_on_signals,
)
from gazeguard.cli.flags import add_settings_arguments, settings_overrides
from gazeguard.core.words import counted
from gazeguard.offline.demo import (
    DEMO_DEFAULTS,
    SHOWN,
    Trace,
    caption,
    demo,
    demo_changes,
    plot,
    sparkline,
)
from gazeguard.runtime.preflight import check_settings
from gazeguard.wire.message import ChunkMessage, StatusMessage


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard demo``."""
    parser.description = (
        "The whole product on one machine: a simulated headset, the sidecar, an embedded MQTT "
        "broker and this live view of the privatized chunks as they arrive; then a PNG "
        "comparing raw and privatized traces. It is `gazeguard run` with a shorter window and "
        "step, four features at ε = 24 and a throw-away ledger, so that chunks arrive within "
        "seconds (the banner lists every change and why; flags override them)."
    )
    parser.add_argument("--duration", type=float, default=45.0, help="seconds to run (45)")
    parser.add_argument("--rate", type=float, default=120.0, help="simulated headset rate, Hz")
    parser.add_argument(
        "--out", type=Path, default=Path("gazeguard-demo.png"), help="comparison plot (PNG)"
    )
    add_settings_arguments(parser)


def _dotted(nested: dict[str, Any], prefix: str = "") -> set[str]:
    names: set[str] = set()
    for key, value in nested.items():
        if isinstance(value, dict):
            names |= _dotted(value, f"{prefix}{key}.")
        else:
            names.add(f"{prefix}{key}")
    return names


def _put(nested: dict[str, Any], dotted: str, value: object) -> None:
    *sections, key = dotted.split(".")
    node = nested
    for section in sections:
        node = node.setdefault(section, {})
    node.setdefault(key, value)


def _banner(changes: list[Any], rate: float, duration: float) -> str:
    lines = [
        f"gazeguard demo: simulated headset at {rate:g} Hz → sidecar → embedded broker → this "
        f"view, for {duration:g} s. This is `gazeguard run` with these changes, so that "
        "privatized chunks arrive within seconds:"
    ]
    for c in changes:
        by = " (your flag)" if c.by == "flag" else ""
        lines.append(f"  {c.setting:<18} {c.value}{by} (run: {c.run_value}) — {c.why}")
    lines.append(
        "Everything else (mechanism, k, noise from os.urandom, the ledger charge before every "
        "publish) is what `gazeguard run` does."
    )
    return "\n".join(lines)


def _chunk_line(chunk: ChunkMessage, trace: Trace) -> None:
    values = chunk.values_array()
    cells = []
    for name in SHOWN:
        if name in chunk.features:
            i = chunk.features.index(name)
            lo, hi = trace.bounds[name]
            cells.append(f"{name[:14]:>14} {sparkline(values[i], lo, hi)}")
    led = chunk.ledger
    stdout(
        f"chunk {chunk.chunk_index:>3} ε={led.chunk_epsilon:g} "
        f"(session {led.session_spent:g}) {chunk.mechanism.name}/"
        f"{chunk.mechanism.transform} k={chunk.mechanism.k} | " + " | ".join(cells)
    )


def _status_line(status: StatusMessage) -> None:
    why = f" — {status.reason}" if status.reason else ""
    stdout(f"  status: {status.state}{why}")


def run(args: argparse.Namespace) -> int:
    """``gazeguard demo``."""
    console = get_console()
    plotting = available("matplotlib")
    with tempfile.TemporaryDirectory(prefix="gazeguard-demo-") as tmp:
        overrides = settings_overrides(args)
        flags = frozenset(_dotted(overrides))
        for name, value in DEMO_DEFAULTS.items():
            _put(overrides, name, value)
        if "ledger.url" not in flags:  # --ledger postgresql://… keeps the budget there
            _put(overrides, "ledger.path", Path(tmp) / "demo-ledger.sqlite")
        _put(overrides, "ingest.source_id", f"gazeguard-demo-{uuid.uuid4().hex[:8]}")
        _put(overrides, "ingest.simulated_rate_hz", args.rate)
        settings, problems = check_settings(args.config, **overrides)
        for problem in problems:
            console.error(str(problem), **problem.as_dict())
        if settings is None or problems:
            return ExitCode.ERROR
        embedded = settings.broker.host is None
        if embedded:  # a free port: never clash with a broker on 1883
            broker = settings.broker.model_copy(update={"port": 0})
            settings = settings.model_copy(update={"broker": broker})
        changes = demo_changes(settings, flags=flags, embedded_port=embedded)
        stdout(_banner(changes, args.rate, args.duration))
        if not plotting:
            console.warn(
                "gazeguard demo: no PNG at the end: plotting needs the 'eval' extra "
                "(pip install -e '.[eval]' in the gazeguard checkout); the live view runs as usual"
            )
        trace = Trace()

        async def main() -> Signals:
            stop = asyncio.Event()
            signals = stop_on_signals(stop)
            await demo(
                settings, args.duration, trace,
                on_chunk=_chunk_line, on_status=_status_line, stop=stop,
            )  # fmt: skip
            return signals

        signals = run_loop(main())
        if signals.interrupted:  # the run stopped as at its end: the PNG of what was shown
            interrupted_line("gazeguard demo")
        if not trace.t:
            stdout("gazeguard demo: no chunk completed; run longer (--duration).")
            return ExitCode.INTERRUPTED if signals.interrupted else ExitCode.ERROR
        where = "no plot (matplotlib missing)"
        if plotting:
            where = f"plot written to {plot(trace, args.out, caption(changes))}"
        stdout(
            f"gazeguard demo: {counted(len(trace.t), 'chunk')} privatized and charged, "
            f"{trace.received} received over MQTT; {where}"
        )
    return ExitCode.INTERRUPTED if signals.interrupted else ExitCode.OK
