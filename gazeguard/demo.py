"""``gazeguard demo``: the whole product on one machine, in one command.

A simulated headset (a real LSL outlet) → the sidecar (:func:`gazeguard.service.serve`) → an
embedded MQTT broker → a subscriber that prints each privatized chunk as it arrives (a live
terminal view with sparklines). At the end it writes a PNG comparing raw and privatized traces
of a few features. The raw traces come from an in-process tap for this plot only; they are never
published.

Defaults differ from ``gazeguard run`` so that chunks arrive every few seconds: a 10 s window, a
0.1 s step, 32-step chunks (one chunk per 3.2 s after the first window), a release profile of
the four plotted features at ε = 24 each (a value from the paper's grid), a throw-away ledger in
a temporary directory (``--ledger`` to keep it), and a free port for the embedded broker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt
import numpy as np
import numpy.typing as npt

from gazeguard.chunking import Chunk
from gazeguard.config import Settings
from gazeguard.features import FEATURES, feature_bounds
from gazeguard.message import ChunkMessage, StatusMessage
from gazeguard.pipeline import Pipeline, ReleasedChunk
from gazeguard.service import add_settings_arguments, run_loop, serve, settings_from_args

SPARK = "▁▂▃▄▅▆▇█"
SHOWN = ("fixation_rate", "saccade_amplitude_mean", "pupil_mean", "blink_rate")


def sparkline(values: npt.NDArray[np.float64], lo: float, hi: float, width: int = 16) -> str:
    """Unicode sparkline of ``values`` on the scale ``[lo, hi]`` (the feature's public bounds),
    resampled to ``width`` cells."""
    idx = np.linspace(0, len(values) - 1, width).round().astype(int)
    span = hi - lo if hi > lo else 1.0
    level = np.clip((values[idx] - lo) / span, 0, 1) * (len(SPARK) - 1)
    return "".join(SPARK[int(v)] for v in level.round())


@dataclass
class _Trace:
    """Raw and privatized values of the plotted features, chunk by chunk (in-process only)."""

    names: list[str] = field(default_factory=list)
    units: list[str] = field(default_factory=list)
    t: list[npt.NDArray[np.float64]] = field(default_factory=list)
    raw: list[npt.NDArray[np.float64]] = field(default_factory=list)
    released: list[npt.NDArray[np.float64]] = field(default_factory=list)
    epsilon: float = 0.0
    mechanism: str = ""
    received: int = 0
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)


def _demo_settings(args: argparse.Namespace, ledger_dir: Path) -> Settings:
    defaults = {
        "window_s": 10.0, "step_s": 0.1, "chunk_steps": 32, "source": "simulated",
        "ledger": ledger_dir / "demo-ledger.sqlite",
        "source_id": f"gazeguard-demo-{uuid.uuid4().hex[:8]}",
        "session": "demo",
        # Release only the plotted features, at an ε from the paper's grid: the default profile
        # (all features at ε 1) is mostly noise at the chunk level (see the README).
        "features": ",".join(SHOWN), "epsilon": 24.0,
    }  # fmt: skip
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    settings = settings_from_args(args)
    broker = settings.broker
    if broker.host is None and args.broker is None:
        broker = broker.model_copy(update={"port": 0})  # a free port: never clash with 1883
    ingest = settings.ingest.model_copy(update={"simulated_rate_hz": args.rate})
    return settings.model_copy(update={"broker": broker, "ingest": ingest})


async def _subscribe(endpoint: asyncio.Future[tuple[str, int, str]], trace: _Trace) -> None:
    """Print every chunk and status arriving on the broker (counted in ``trace.received``)."""
    host, port, prefix = await endpoint
    async with aiomqtt.Client(host, port, identifier=f"gazeguard-demo-view-{port}") as client:
        await client.subscribe(f"{prefix}/#", qos=1)
        async for message in client.messages:
            topic = str(message.topic)
            payload = message.payload
            if not isinstance(payload, bytes | bytearray):
                continue
            if topic.endswith("/status"):
                status = StatusMessage.from_payload(payload)
                why = f" — {status.reason}" if status.reason else ""
                print(f"  status: {status.state}{why}", flush=True)  # noqa: T201
                continue
            chunk = ChunkMessage.from_payload(payload)
            trace.received += 1
            values = chunk.values_array()
            cells = []
            for name in SHOWN:
                if name in chunk.features:
                    i = chunk.features.index(name)
                    lo, hi = trace.bounds[name]
                    cells.append(f"{name[:14]:>14} {sparkline(values[i], lo, hi)}")
            led = chunk.ledger
            print(  # noqa: T201
                f"chunk {chunk.chunk_index:>3} ε={led.chunk_epsilon:g} "
                f"(session {led.session_spent:g}) {chunk.mechanism.name}/"
                f"{chunk.mechanism.transform} k={chunk.mechanism.k} | " + " | ".join(cells),
                flush=True,
            )


def _plot(trace: _Trace, out: Path) -> Path:
    import matplotlib as mpl  # noqa: PLC0415 - plotting only at the end

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    t = np.concatenate(trace.t)
    raw = np.concatenate(trace.raw, axis=1)
    rel = np.concatenate(trace.released, axis=1)
    fig, axes = plt.subplots(len(trace.names), 1, figsize=(10, 2.2 * len(trace.names)), sharex=True)
    for ax, name, unit, r, p in zip(
        np.atleast_1d(axes), trace.names, trace.units, raw, rel, strict=True
    ):
        ax.plot(t - t[0], r, color="0.35", lw=1.4, label="raw (never published)")
        ax.plot(t - t[0], p, color="tab:red", lw=1.0, label="privatized (published)")
        ax.set_ylabel(f"{name}\n[{unit}]", fontsize=8)
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].legend(loc="upper right", fontsize=8)
    np.atleast_1d(axes)[-1].set_xlabel("time since first released step [s]")
    fig.suptitle(
        f"gazeguard demo: raw vs privatized features ({trace.mechanism}, ε = {trace.epsilon:g} "
        f"per chunk; {len(trace.t)} chunks: user-level ε = {trace.epsilon * len(trace.t):g})"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def configure_demo(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard demo``."""
    parser.add_argument("--duration", type=float, default=45.0, help="seconds to run (45)")
    parser.add_argument("--rate", type=float, default=120.0, help="simulated headset rate, Hz")
    parser.add_argument(
        "--out", type=Path, default=Path("gazeguard-demo.png"), help="comparison plot (PNG)"
    )
    add_settings_arguments(parser)


def run_demo(args: argparse.Namespace) -> int:
    """``gazeguard demo``."""
    with tempfile.TemporaryDirectory(prefix="gazeguard-demo-") as tmp:
        settings = _demo_settings(args, Path(tmp))
        trace = _Trace()
        print(  # noqa: T201
            f"gazeguard demo: simulated headset at {args.rate:g} Hz → sidecar → embedded broker "
            f"→ this view, for {args.duration:g} s. First chunk after the "
            f"{settings.features.window_s:g} s window fills plus one chunk "
            f"({settings.mechanism.chunk_steps} × {settings.features.step_s:g} s).",
            flush=True,
        )
        run_loop(_demo(settings, args.duration, trace))
        if not trace.t:
            print("gazeguard demo: no chunk completed; run longer (--duration).")  # noqa: T201
            return 1
        png = _plot(trace, args.out)
        print(  # noqa: T201
            f"gazeguard demo: {len(trace.t)} chunks privatized and charged, "
            f"{trace.received} received over MQTT; plot written to {png}",
            flush=True,
        )
    return 0


async def _demo(settings: Settings, duration_s: float, trace: _Trace) -> None:
    loop = asyncio.get_running_loop()
    endpoint: asyncio.Future[tuple[str, int, str]] = loop.create_future()

    def ready(pipeline: Pipeline, where: str) -> None:
        host, _, port = where.rpartition(":")
        trace.names = [n for n in SHOWN if n in pipeline.feature_names]
        trace.units = [pipeline.units[pipeline.feature_names.index(n)] for n in trace.names]
        trace.epsilon = pipeline.chunk_epsilon
        trace.mechanism = f"{pipeline.mechanism.name}/{pipeline.mechanism.transform}"
        lo, hi, _ = feature_bounds(
            trace.names, settings.features.window_s, settings.features.step_s
        )
        trace.bounds = {
            n: (float(a), float(b)) for n, a, b in zip(trace.names, lo, hi, strict=True)
        }
        loop.call_soon_threadsafe(
            endpoint.set_result, (host, int(port), settings.broker.topic_prefix)
        )

    def tap(raw: Chunk, out: ReleasedChunk) -> None:
        names = [f.name for f in FEATURES]
        msg = out.message
        trace.t.append(raw.timestamps.copy())
        trace.raw.append(raw.values[[names.index(n) for n in trace.names]])
        rel = msg.values_array()
        trace.released.append(rel[[msg.features.index(n) for n in trace.names]])

    view = asyncio.create_task(_subscribe(endpoint, trace), name="gazeguard.demo.view")
    # The embedded broker lives inside serve(), so the view must catch up before it returns.
    await serve(settings, duration_s=duration_s, tap=tap, ready=ready)
    view.cancel()
    with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
        await view
