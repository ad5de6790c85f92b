"""``gazeguard dashboard``: serve a live page of the cohort releases a fleet publishes (mode,
aggregates, attention; :mod:`gazeguard.runtime.dashboard`).

Prints one line naming the URL to open; says in one line when the broker cannot be reached (and
keeps retrying) and when it is subscribed; Ctrl-C stops it with one line (exit 130), SIGTERM
likewise (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from gazeguard.cli._common import ExitCode, get_console, run_loop
from gazeguard.config import BrokerSettings, broker_address, load_settings
from gazeguard.runtime.dashboard import DEFAULT_PORT, serve_dashboard

#: Most buckets ``--history`` keeps per cohort and worker (memory and the page's snapshot).
MAX_HISTORY = 1000

DESCRIPTION = """\
Serve a live page of the differentially private cohort releases that fleet workers
(`gazeguard run --fleet --cohort NAME`) publish on {prefix}/cohort/NAME/…: per cohort and
worker, the group's dominant activity per bucket over time (…/mode), the latest bucket's noisy
session count, class shares and feature means (…/aggregates), each with its 95 % noise band
(value ± 1.96 × the noise sd the message states), and the attention heatmap (…/attention).
Every figure is marked readable or too noisy: readable when its band is within 10 % of its
scale (a mean's public range, the count, the share scale; a heatmap cell within an even
spread's share), else with the sessions per bucket it would need at that noise. A worker that
releases no attention or mode is told what to set. Also the ε per hour the messages state and
a short history.

The dashboard subscribes to the broker itself and pushes what arrives to the page (Server-Sent
Events); it never publishes. It listens on 127.0.0.1 only unless --host says otherwise: the
aggregates are private releases, but the page has no login, so expose it to a network only
behind your own access control (or reach it through an SSH tunnel).
"""

EPILOG = """\
examples:
  gazeguard dashboard                               broker of `gazeguard run` (127.0.0.1:1883)
  gazeguard dashboard --broker mqtt.lab:1883 --port 9000
  gazeguard dashboard --config fleet.toml           broker, TLS, login and prefix from the file

exit status: 0 stopped by SIGTERM, 1 error (address in use, bad configuration), 130 Ctrl-C
"""


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard dashboard``."""
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every "
        "interface)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port to listen on (default {DEFAULT_PORT}; 0: any free port, named on start)",
    )
    parser.add_argument(
        "--broker",
        metavar="HOST[:PORT]",
        help="MQTT broker to subscribe to (default: broker.host/port of --config or "
        "GAZEGUARD_BROKER__*, else 127.0.0.1:1883, where `gazeguard run` puts its broker)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="configuration file (TOML): the broker, its TLS and login, the topic prefix",
    )
    parser.add_argument("--prefix", help="topic prefix (default: broker.topic_prefix)")
    parser.add_argument(
        "--history",
        type=int,
        default=60,
        metavar="N",
        help=f"buckets kept and drawn per cohort and worker (default 60, at most {MAX_HISTORY})",
    )


def broker_settings(args: argparse.Namespace) -> BrokerSettings:
    """``broker.*`` from ``--config`` and the environment, with ``--broker``/``--prefix``."""
    overrides: dict[str, object] = {}
    if args.broker:
        overrides |= broker_address(args.broker)
    if args.prefix:
        overrides["topic_prefix"] = args.prefix
    settings = load_settings(args.config, **({"broker": overrides} if overrides else {}))
    return settings.broker


async def dashboard(args: argparse.Namespace, settings: BrokerSettings) -> int:
    """Serve until SIGINT (exit 130) or SIGTERM (exit 0)."""
    console = get_console()
    stop = asyncio.Event()
    received: list[signal.Signals] = []
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)

    def ready(url: str) -> None:
        console.say("url", f"gazeguard dashboard: open {url}  (Ctrl-C to stop)", url=url)

    def notice(text: str) -> None:
        console.progress("broker", f"gazeguard dashboard: {text}")

    try:
        await serve_dashboard(
            settings, args.host, args.port, stop, ready=ready, notice=notice, history=args.history
        )
    except OSError as exc:
        console.error(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; choose another "
            "address with --host/--port"
        )
        return ExitCode.ERROR
    interrupted = signal.SIGINT in received
    console.say("stopped", "gazeguard dashboard: stopped" + (" (Ctrl-C)" if interrupted else ""))
    return ExitCode.INTERRUPTED if interrupted else ExitCode.OK


def run(args: argparse.Namespace) -> int:
    """``gazeguard dashboard``."""
    if not 0 <= args.port <= 65535:
        get_console().error(f"--port {args.port}: expected 0-65535")
        return ExitCode.USAGE
    if not 1 <= args.history <= MAX_HISTORY:
        get_console().error(f"--history {args.history}: expected 1-{MAX_HISTORY}")
        return ExitCode.USAGE
    return run_loop(dashboard(args, broker_settings(args)))
