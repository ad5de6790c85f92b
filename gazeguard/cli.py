"""The ``gazeguard`` command line.

Each subcommand lives next to the stage it drives: the module named in :data:`COMMANDS` provides
``configure_<name>(parser)`` to declare its arguments and ``run_<name>(args) -> int`` to execute.
Modules are imported only when their subcommand is used, so ``gazeguard --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple, cast

from gazeguard import __version__
from gazeguard.errors import GazeguardError


class Command(NamedTuple):
    """A subcommand: the module that implements it and one line of help."""

    module: str
    help: str


COMMANDS: dict[str, Command] = {
    "run": Command(
        "gazeguard.service",
        "run the privacy sidecar: LSL gaze in, privatized feature chunks out over MQTT",
    ),
    "demo": Command(
        "gazeguard.demo",
        "simulated headset + service + embedded broker + live view; writes a comparison PNG",
    ),
    "simulate": Command(
        "gazeguard.simulate", "stream a simulated person's gaze as a real LSL outlet"
    ),
    "replay": Command(
        "gazeguard.replay", "stream a recorded CSV or XDF file as an LSL outlet at its timing"
    ),
    "forward": Command(
        "gazeguard.forward",
        "device side of an MQTT fleet: send this headset's LSL gaze to the fleet's workers",
    ),
    "ledger": Command("gazeguard.ledger", "inspect the durable privacy-budget ledger"),
    "config": Command("gazeguard.config", "validate a configuration file"),
    "eval": Command(
        "gazeguard.eval.cli", "privacy-utility evaluation on recorded and simulated data"
    ),
    "release": Command(
        "gazeguard.release.cli",
        "privatize a recorded feature dataset (k-same, marginals, exponential DP, DCFPA, ...)",
    ),
    "profile": Command(
        "gazeguard.profile_cli",
        "release profiles (build from labelled public data, show) and private-label models",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Build the parser; only ``command``'s module is imported to declare its arguments."""
    parser = argparse.ArgumentParser(
        prog="gazeguard",
        description=(
            "gazeguard privatizes eye-tracking streams with differential privacy. "
            "Run `gazeguard demo` to see it work end to end, `gazeguard run` to serve a headset."
        ),
    )
    parser.add_argument("--version", action="version", version=f"gazeguard {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        if name == command:
            module = importlib.import_module(cmd.module)
            configure = cast(
                "Callable[[argparse.ArgumentParser], None]", getattr(module, f"configure_{name}")
            )
            configure(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gazeguard`` console script; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    # Global options take no values, so the first positional argument is the subcommand.
    command = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return 2
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    module = importlib.import_module(COMMANDS[args.command].module)
    run = cast("Callable[[argparse.Namespace], int]", getattr(module, f"run_{args.command}"))
    try:
        return run(args)
    except GazeguardError as exc:
        print(f"gazeguard {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
