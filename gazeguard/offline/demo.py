"""``gazeguard demo``: the whole product on one machine, in one command.

A simulated headset (a real LSL outlet) → the sidecar (:func:`gazeguard.runtime.service.serve`) → an
embedded MQTT broker → a subscriber that hands each privatized chunk to the caller as it arrives
(``gazeguard demo`` prints a live terminal view with sparklines: :mod:`gazeguard.cli.demo`). At
the end :func:`plot` writes a PNG comparing raw and privatized traces of a few features. The raw
traces come from an in-process tap for this plot only; they are never published.

The demo is ``gazeguard run`` with the settings of :data:`DEMO_DEFAULTS` changed, so that chunks
arrive every few seconds and the privatized trace is visible: a 10 s window and a 0.1 s step
(one 32-step chunk per 3.2 s after the first window, instead of 46 s then every 16 s) released
1 s after it ends on the clock (run: 3 s), a release
profile of the four plotted features (not all 48) at ε = 24 each (a value from the paper's grid:
weaker privacy than run's ε = 1, at which a chunk is mostly noise), the simulated headset, a
throw-away ledger in a temporary directory (no real budget is spent) and a free port for the
embedded broker.
:func:`demo_changes` lists what differs from ``run``'s defaults and why; the banner and the PNG
caption show it. Everything else — mechanism, k, noise from ``os.urandom``, the charge before
publishing — is what ``run`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt
import numpy as np
import numpy.typing as npt

from gazeguard.config import (
    BrokerSettings,
    FeatureSettings,
    IngestSettings,
    LedgerSettings,
    MechanismSettings,
    Settings,
)
from gazeguard.core.chunking import Chunk
from gazeguard.core.words import counted
from gazeguard.runtime.mqtt.client import ClientFactory
from gazeguard.runtime.pipeline import Pipeline, ReleasedChunk
from gazeguard.runtime.service import serve
from gazeguard.signal.features import FEATURES, feature_bounds
from gazeguard.wire.message import ChunkMessage, StatusMessage

log = logging.getLogger(__name__)

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
class Trace:
    """Raw and privatized values of the plotted features, chunk by chunk (in-process only).

    ``t`` (s, LSL clock), ``raw`` and ``released`` hold one entry per chunk: (n,) and (F, n)
    arrays; ``epsilon`` is the ε one chunk costs; ``bounds`` the public (lo, hi) per feature.
    """

    names: list[str] = field(default_factory=list)
    units: list[str] = field(default_factory=list)
    t: list[npt.NDArray[np.float64]] = field(default_factory=list)
    raw: list[npt.NDArray[np.float64]] = field(default_factory=list)
    released: list[npt.NDArray[np.float64]] = field(default_factory=list)
    epsilon: float = 0.0
    mechanism: str = ""
    received: int = 0
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)
    carries: str = ""  # what a chunk carries per feature, in words (the mechanism's)


#: Settings the demo changes from ``gazeguard run``'s defaults (dotted names), unless a flag sets
#: them. It also uses a throw-away ledger, a fresh simulated source_id and a free broker port.
DEMO_DEFAULTS: dict[str, object] = {
    "ingest.source": "simulated",
    "features.window_s": 10.0,
    "features.step_s": 0.1,
    "mechanism.chunk_steps": 32,
    "mechanism.features": list(SHOWN),
    "mechanism.epsilon": 24.0,
    "ledger.budget_per_hour": None,
    "ingest.pull_every_s": 0.25,
    "ingest.late_after_s": 1.0,
    "session": "demo",
}


@dataclass(frozen=True, slots=True)
class Change:
    """One setting in which the demo differs from ``gazeguard run``.

    Attributes:
        setting: dotted name, e.g. ``"features.window_s"``.
        value: the demo's value, for people (with its unit).
        run_value: ``run``'s default, for people.
        why: what the change buys (and costs).
        by: ``"demo"`` (the demo's default) or ``"flag"`` (given on the command line).
    """

    setting: str
    value: str
    run_value: str
    why: str
    by: str = "demo"


def demo_changes(
    settings: Settings, *, flags: frozenset[str] = frozenset(), embedded_port: bool = True
) -> list[Change]:
    """What ``settings`` (the demo's effective configuration) changes from ``run``'s defaults.

    Args:
        settings: the demo's settings.
        flags: dotted names set by command-line flags (reported as ``by="flag"``).
        embedded_port: the embedded broker was moved to a free port.
    """
    f, m = settings.features, settings.mechanism
    run_f, run_m = FeatureSettings(), MechanismSettings()  # run's defaults
    run_w, run_s, run_n = run_f.window_s, run_f.step_s, run_m.chunk_steps
    run_budget = LedgerSettings().budget_per_hour
    every, run_every = m.chunk_steps * f.step_s, run_n * run_s
    n_features = len(m.features) if m.features is not None else len(FEATURES)
    out = []

    def add(setting: str, value: str, run_value: str, why: str) -> None:
        out.append(Change(setting, value, run_value, why, "flag" if setting in flags else "demo"))

    if settings.ingest.source != IngestSettings().source:
        add(
            "ingest.source",
            settings.ingest.source,
            IngestSettings().source,
            "no headset needed: a simulated person streams real LSL gaze",
        )
    if f.window_s != run_w:
        add(
            "features.window_s",
            f"{f.window_s:g} s",
            f"{run_w:g} s",
            f"first chunk after {f.window_s + every:g} s of gaze "
            f"instead of {run_w + run_every:g} s",
        )
    run_i = IngestSettings()
    if settings.ingest.late_after_s != run_i.late_after_s:
        add(
            "ingest.late_after_s",
            f"{settings.ingest.late_after_s:g} s (pulls every {settings.ingest.pull_every_s:g} s)",
            f"{run_i.late_after_s:g} s (pulls every {run_i.pull_every_s:g} s)",
            "a chunk is released this long after its last window ends, not 3 s; a sample "
            "arriving later is dropped (a real stream on a loaded host can be that late)",
        )
    if f.step_s != run_s or m.chunk_steps != run_n:
        add(
            "features.step_s",
            f"{f.step_s:g} s × {m.chunk_steps} steps",
            f"{run_s:g} s × {run_n} steps",
            f"one chunk every {every:g} s instead of every {run_every:g} s",
        )
    if m.features is not None:
        add(
            "mechanism.features",
            f"{n_features} features",
            f"all {len(FEATURES)}",
            f"release (and pay for) only the plotted ones: {', '.join(m.features)}",
        )
    if m.epsilon is not None:
        chunk_eps = n_features * m.epsilon
        add(
            "mechanism.epsilon",
            f"{m.epsilon:g} per feature per chunk",
            f"noise calibrated to ε {run_budget:g} per hour of gaze",
            f"from the paper's grid: far weaker privacy than run's, at which a chunk is mostly "
            f"noise, so that there is signal to look at. A chunk costs pure ε {chunk_eps:g}, "
            f"{chunk_eps * 3600.0 / every:.4g} per hour of gaze: the figure to judge it by",
        )
    if settings.ledger.budget_per_hour != run_budget:
        value = settings.ledger.budget_per_hour
        add(
            "ledger.budget_per_hour",
            "none" if value is None else f"{value:g}",
            f"{run_budget:g}",
            "no hourly cap, or the demo's weak per-chunk ε would be withheld after one chunk",
        )
    if settings.ledger.path != LedgerSettings().path:
        add(
            "ledger.path",
            str(settings.ledger.path) if "ledger.path" in flags else "a temporary file",
            str(LedgerSettings().path),
            "a throw-away ledger: the demo spends no real budget (--ledger keeps it)",
        )
    if embedded_port:
        add(
            "broker.port",
            "a free port",
            str(BrokerSettings().port),
            "the embedded broker never clashes with one already running",
        )
    return out


def caption(changes: list[Change]) -> str:
    """The PNG caption: what the demo changes from ``gazeguard run`` and why, in brief."""
    parts = [f"{c.setting} {c.value} (run: {c.run_value}): {c.why}" for c in changes]
    return (
        "Differs from `gazeguard run` so that chunks arrive within seconds and the trace is "
        "visible — " + "; ".join(parts) + ". Everything else is what `gazeguard run` does."
    )


#: Called with each chunk message as it arrives over MQTT (``trace.received`` counts them).
OnChunk = Callable[[ChunkMessage, Trace], None]
#: Called with each status message as it arrives over MQTT.
OnStatus = Callable[[StatusMessage], None]


#: Between the live view's attempts to reach the broker, s.
VIEW_RETRY_S = 1.0


async def _subscribe(
    endpoint: asyncio.Future[tuple[BrokerSettings, str]],
    trace: Trace,
    on_chunk: OnChunk,
    on_status: OnStatus,
    ending: asyncio.Event,
) -> None:
    """Hand every chunk and status arriving on the broker to the callbacks; while the broker
    does not answer (not up yet, or gone), say so once and try again every
    :data:`VIEW_RETRY_S`. Once ``ending`` is set (the run is stopping and its embedded broker
    with it), a lost connection ends the view quietly."""
    broker, prefix = await endpoint
    clients = ClientFactory(broker)
    where = f"{broker.host}:{broker.port}"
    protocol = (
        aiomqtt.ProtocolVersion.V311 if broker.protocol == "3.1.1" else aiomqtt.ProtocolVersion.V5
    )
    outage = False
    while True:
        try:
            async with clients(f"gazeguard-demo-view-{broker.port}", protocol=protocol) as client:
                await client.subscribe(f"{prefix}/#", qos=1)
                if outage:
                    log.warning("live view: broker %s answers again", where)
                outage = False
                async for message in client.messages:
                    _hand_over(message, trace, on_chunk, on_status)
        except (aiomqtt.MqttError, OSError) as exc:
            if ending.is_set():
                return
            if not outage:
                log.warning(
                    "live view: broker %s does not answer (%s); trying again every %g s",
                    where, str(exc) or type(exc).__name__, VIEW_RETRY_S,
                )  # fmt: skip
            outage = True
        await asyncio.sleep(VIEW_RETRY_S)


def _hand_over(
    message: aiomqtt.Message, trace: Trace, on_chunk: OnChunk, on_status: OnStatus
) -> None:
    """One message to the callbacks (a chunk counted in ``trace.received``); one that does not
    parse is logged and skipped."""
    payload = message.payload
    if not isinstance(payload, bytes | bytearray):
        return
    topic = str(message.topic)
    try:
        if topic.endswith("/status"):
            on_status(StatusMessage.from_payload(payload))
        elif topic.endswith("/chunks"):
            chunk = ChunkMessage.from_payload(payload)
            trace.received += 1
            on_chunk(chunk, trace)
    except ValueError as exc:
        log.warning("live view: %s does not validate: %s", topic, str(exc).splitlines()[0])


def how_to_read(trace: Trace) -> str:
    """The PNG's first caption paragraph: what the red line is, and which of its points carry
    information (with DCFPA at k = 1, only each ramp's end)."""
    raw = "The grey line is the raw value, never published."
    if trace.carries.startswith("one number per feature per chunk"):  # DCFPA, one coefficient
        return (
            "How to read it: each red ramp is one chunk. DCFPA at k = 1 releases one number per "
            "feature per chunk, the chunk's net change from the feature's public lower bound, "
            "and draws it as a straight ramp from that bound: only the ramp's end carries "
            "information; its slope and the points along it are drawing, not data. " + raw
        )
    what = f" Each chunk carries {trace.carries}." if trace.carries else ""
    return f"How to read it: the red line is what is published.{what} {raw}"


def plot(trace: Trace, out: Path, note: str = "") -> Path:
    """Write the raw-vs-privatized PNG of ``trace`` to ``out``, captioned with how to read it
    (:func:`how_to_read`) and ``note``.

    Needs matplotlib (the ``eval`` extra).
    """
    import matplotlib as mpl  # noqa: PLC0415 - the eval extra

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - the eval extra

    t = np.concatenate(trace.t)
    raw = np.concatenate(trace.raw, axis=1)
    rel = np.concatenate(trace.released, axis=1)
    lines = textwrap.wrap(how_to_read(trace), 150) + (textwrap.wrap(note, 150) if note else [])
    height = 2.2 * len(trace.names) + 0.16 * len(lines)
    fig, axes = plt.subplots(len(trace.names), 1, figsize=(10, height), sharex=True)
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
        f"per chunk; {counted(len(trace.t), 'chunk')}: user-level ε = "
        f"{trace.epsilon * len(trace.t):g})"
    )
    bottom = 0.0
    if lines:
        fig.text(0.01, 0.005, "\n".join(lines), fontsize=7, va="bottom", ha="left")
        bottom = (0.16 * len(lines) + 0.1) / height
    fig.tight_layout(rect=(0.0, bottom, 1.0, 1.0))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


async def demo(
    settings: Settings,
    duration_s: float,
    trace: Trace,
    *,
    on_chunk: OnChunk,
    on_status: OnStatus,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve ``settings`` for ``duration_s`` of gaze from the moment it is up (or until ``stop``
    is set) while a subscriber on the same broker hands each message to the callbacks; the tap
    fills ``trace`` with raw and released values of the plotted features (in-process only)."""
    loop = asyncio.get_running_loop()
    endpoint: asyncio.Future[tuple[BrokerSettings, str]] = loop.create_future()
    ending = asyncio.Event()  # the run stops: the view may lose the broker now

    def ready(pipeline: Pipeline, where: str) -> None:
        host, _, port = where.rpartition(":")
        trace.names = [n for n in SHOWN if n in pipeline.feature_names]
        trace.units = [pipeline.units[pipeline.feature_names.index(n)] for n in trace.names]
        trace.epsilon = pipeline.chunk_epsilon
        trace.mechanism = f"{pipeline.mechanism.name}/{pipeline.mechanism.transform}"
        trace.carries = pipeline.carries
        lo, hi, _ = feature_bounds(
            trace.names, settings.features.window_s, settings.features.step_s
        )
        trace.bounds = {
            n: (float(a), float(b)) for n, a, b in zip(trace.names, lo, hi, strict=True)
        }
        if settings.broker.host is None:  # the embedded broker: MQTT 3.1.1, no login
            broker = settings.broker.model_copy(
                update={"host": host, "port": int(port), "protocol": "3.1.1", "tls": False,
                        "username": None, "password": None}
            )  # fmt: skip
        else:
            broker = settings.broker
        endpoint.set_result((broker, settings.broker.topic_prefix))
        loop.call_later(duration_s, ending.set)  # (ready runs on the loop, once all is up)

    def tap(raw: Chunk, out: ReleasedChunk) -> None:
        names = [f.name for f in FEATURES]
        msg = out.message
        trace.t.append(raw.timestamps.copy())
        trace.raw.append(raw.values[[names.index(n) for n in trace.names]])
        rel = msg.values_array()
        trace.released.append(rel[[msg.features.index(n) for n in trace.names]])

    async def stopped() -> None:
        if stop is not None:
            await stop.wait()
            ending.set()

    view = asyncio.create_task(
        _subscribe(endpoint, trace, on_chunk, on_status, ending), name="gazeguard.offline.demo.view"
    )
    asked = asyncio.create_task(stopped(), name="gazeguard.offline.demo.stop")
    try:
        # The embedded broker lives inside serve(), so the view must catch up before it returns.
        await serve(settings, tap=tap, ready=ready, stop=ending)
    finally:
        ending.set()
        for task in (view, asked):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
