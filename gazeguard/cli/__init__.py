"""The ``gazeguard`` command line: a thin layer over the domain modules.

:data:`COMMANDS` is the explicit table of subcommands. Each names its entry points as
``"module:function"`` strings — ``configure(parser)`` declares the arguments, ``run(args) -> int``
executes — and the modules are imported only when their subcommand is used, so ``gazeguard
--help`` stays instant and a command's optional dependencies are needed only by that command.
One module per command lives in this package (``gazeguard.cli.run``, ``.demo``, …); they parse,
print and choose the exit status, and call the domain's functions
(:func:`gazeguard.runtime.service.serve`, :func:`gazeguard.runtime.preflight.check_settings`,
:func:`gazeguard.offline.release.output.write_release`, …).

Flags every command accepts before or after its name: ``-v/--verbose``, ``-q/--quiet``,
``--log-format text|json``, ``--log-level LEVEL``. Exit statuses: :class:`ExitCode`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple, cast

from gazeguard import __version__
from gazeguard.cli._common import (
    Console,
    ExitCode,
    LogFormat,
    MissingExtraError,
    common_flags,
    configure_logging,
    exit_code_table,
    extra_for,
    find_command,
    log_settings,
    require,
    set_console,
)
from gazeguard.core.errors import ConfigError, GazeguardError

__all__ = ["COMMANDS", "Command", "ExitCode", "build_parser", "main"]


class Command(NamedTuple):
    """A subcommand: one line of help, its entry points, the optional modules it needs.

    Attributes:
        help: one line for ``gazeguard --help``.
        configure: ``"module:function"`` declaring the arguments on an ``ArgumentParser``.
        run: ``"module:function"`` taking the parsed arguments, returning the exit status.
        needs: modules of an extra (see :data:`gazeguard.cli._common.EXTRAS`) without which the
            command cannot work; checked before its module is imported.
    """

    help: str
    configure: str
    run: str
    needs: tuple[str, ...] = ()


COMMANDS: dict[str, Command] = {
    "run": Command(
        "run the privacy sidecar: LSL gaze in, privatized feature chunks out over MQTT",
        "gazeguard.cli.run:configure",
        "gazeguard.cli.run:run",
    ),
    "demo": Command(
        "simulated headset + sidecar + embedded broker + live view; writes a comparison PNG",
        "gazeguard.cli.demo:configure",
        "gazeguard.cli.demo:run",
    ),
    "simulate": Command(
        "stream a simulated person's gaze as a real LSL outlet",
        "gazeguard.cli.simulate:configure",
        "gazeguard.cli.simulate:run",
    ),
    "replay": Command(
        "stream a recorded CSV or XDF file as an LSL outlet at its timing",
        "gazeguard.cli.replay:configure",
        "gazeguard.cli.replay:run",
    ),
    "forward": Command(
        "device side of a fleet: publish this headset's LSL gaze to the fleet's NATS JetStream",
        "gazeguard.cli.forward:configure",
        "gazeguard.cli.forward:run",
        needs=("nats",),
    ),
    "watch": Command(
        "show what a gazeguard publishes (chunks, labels, status), validated, as it arrives",
        "gazeguard.cli.watch:configure",
        "gazeguard.cli.watch:run",
    ),
    "dashboard": Command(
        "serve a live page of a fleet's cohort aggregates (with their noise bands) from the broker",
        "gazeguard.cli.dashboard:configure",
        "gazeguard.cli.dashboard:run",
    ),
    "ledger": Command(
        "inspect the durable privacy-budget ledger",
        "gazeguard.cli.ledger:configure",
        "gazeguard.cli.ledger:run",
    ),
    "plan": Command(
        "the release plan of a configuration: every privacy figure (per release, sample, hour)",
        "gazeguard.cli.plan:configure",
        "gazeguard.cli.plan:run",
    ),
    "schemas": Command(
        "the JSON Schemas of every published payload (list, --write, --check)",
        "gazeguard.cli.schemas:configure",
        "gazeguard.cli.schemas:run",
    ),
    "mechanisms": Command(
        "the public prior and the k auto picks; --budget-per-hour ranks the mechanisms",
        "gazeguard.cli.mechanisms:configure",
        "gazeguard.cli.mechanisms:run",
    ),
    "config": Command(
        "check a configuration: every problem `run` would refuse, with a suggestion",
        "gazeguard.cli.config:configure",
        "gazeguard.cli.config:run",
    ),
    "eval": Command(
        "privacy-utility evaluation on recorded and simulated data (extra 'eval')",
        "gazeguard.cli.eval:configure",
        "gazeguard.cli.eval:run",
        needs=("sklearn", "scipy", "matplotlib"),
    ),
    "release": Command(
        "privatize a recorded feature dataset (k-same, marginals, exponential DP, DCFPA, ...)",
        "gazeguard.cli.release:configure",
        "gazeguard.cli.release:run",
    ),
    "profile": Command(
        "release profiles (features for a task) and private-label models: build, show, train",
        "gazeguard.cli.profile:configure",
        "gazeguard.cli.profile:run",
    ),
}

Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


def _entry(spec: str) -> object:
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported (to declare its arguments).

    Raises:
        MissingExtraError: ``command`` needs an extra that is not installed.
    """
    common = common_flags()
    parser = argparse.ArgumentParser(
        prog="gazeguard",
        description=(
            "gazeguard privatizes eye-tracking streams with differential privacy. "
            "Run `gazeguard demo` to see it work end to end, `gazeguard run` to serve a headset."
        ),
        epilog=exit_code_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"gazeguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help, parents=[common])
        if name == command:
            require(f"gazeguard {name}", *cmd.needs)
            cast("Configure", _entry(cmd.configure))(p)
    return parser


def _format_hint(argv: Sequence[str]) -> LogFormat:
    """``--log-format`` as given on the command line, before it is parsed."""
    for i, arg in enumerate(argv):
        if arg == "--log-format=json" or (
            arg == "--log-format" and argv[i + 1 : i + 2] == ["json"]
        ):
            return "json"
    return "text"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gazeguard`` console script; returns the exit status
    (:class:`ExitCode`). ``--help`` and usage errors exit through ``SystemExit`` as argparse
    does (status 0 and 2)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = find_command(args_list)
    try:
        parser = build_parser(command if command in COMMANDS else None)
    except MissingExtraError as exc:
        Console(fmt=_format_hint(args_list)).fail(str(exc), extra=exc.extra)
        return ExitCode.ERROR
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return ExitCode.USAGE
    level, fmt, quiet = log_settings(args)
    configure_logging(level, fmt)
    console = Console(f"gazeguard {args.command}", fmt, quiet=quiet)
    set_console(console)
    run = cast("Run", _entry(COMMANDS[args.command].run))
    try:
        return int(run(args))
    except MissingExtraError as exc:
        console.fail(str(exc), extra=exc.extra)
    except ImportError as exc:
        extra = extra_for(exc)
        if extra is None:
            raise
        console.fail(str(MissingExtraError(f"gazeguard {args.command}", extra)), extra=extra)
    except ConfigError as exc:
        console.error(str(exc), field=exc.field, value=exc.value, source=exc.source)
    except GazeguardError as exc:
        console.error(str(exc), error=type(exc).__name__)
    except KeyboardInterrupt:  # before a command's own handler is in place (or without one)
        console.say("interrupted", f"gazeguard {args.command}: interrupted (Ctrl-C)")
        return ExitCode.INTERRUPTED
    except Exception:
        logging.getLogger("gazeguard").exception("gazeguard %s: unexpected error", args.command)
    return ExitCode.ERROR
