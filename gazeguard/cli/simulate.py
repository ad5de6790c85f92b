"""``gazeguard simulate``: stream a simulated person as a real LSL outlet
(:class:`gazeguard.runtime.simulate.SimulatedHeadset`) until ``--duration`` or Ctrl-C."""

from __future__ import annotations

import argparse
import signal

from gazeguard.cli._common import ExitCode, interrupted_line, stdout
from gazeguard.core.words import counted
from gazeguard.runtime.simulate import TASKS, SimulatedHeadset


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard simulate``."""
    parser.add_argument("--rate", type=float, default=120.0, help="sampling rate, Hz (default 120)")
    parser.add_argument("--seed", type=int, default=1, help="which simulated person (default 1)")
    parser.add_argument("--task", choices=TASKS, default="free", help="what the person does")
    parser.add_argument("--session", type=int, default=0, help="which recording of that person")
    parser.add_argument("--duration", type=float, default=None, help="seconds (default: forever)")
    parser.add_argument("--name", default="gazeguard-sim", help="LSL stream name")
    parser.add_argument("--source-id", default=None, help="LSL source_id (default: unique)")
    parser.add_argument(
        "--push-interval",
        type=float,
        default=0.01,
        help="push due samples every this many s (default 0.01; 0: one push per sample, as "
        "vendor bridges do)",
    )


def run(args: argparse.Namespace) -> int:
    """``gazeguard simulate``: stream a simulated person until --duration, Ctrl-C (exit 130) or
    SIGTERM (exit 0)."""
    headset = SimulatedHeadset(
        args.rate,
        args.seed,
        task=args.task,
        session=args.session,
        source_id=args.source_id,
        name=args.name,
        duration_s=args.duration,
        push_interval_s=args.push_interval or 1.0 / args.rate,
    )
    stopped: list[int] = []  # the signals that came

    def on_signal(sig: int, _frame: object) -> None:
        stopped.append(sig)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with headset:
            stdout(
                f"streaming simulated person {args.seed} ({args.task}) at {args.rate:g} Hz as "
                f"LSL stream {headset.name!r}, source_id {headset.source_id!r}; Ctrl-C to stop"
            )
            while not stopped and not headset.done.wait(0.1):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    interrupted = signal.SIGINT in stopped
    if interrupted:
        interrupted_line("gazeguard simulate")
    stdout(f"sent {counted(headset.samples_sent, 'sample')}")
    return ExitCode.INTERRUPTED if interrupted else ExitCode.OK
