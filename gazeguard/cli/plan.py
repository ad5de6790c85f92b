"""``gazeguard plan``: the release plan of a configuration — every privacy figure, from one place.

It builds the :class:`~gazeguard.plan.ReleasePlan` exactly as ``gazeguard run`` (or ``run
--fleet``) would from the same flags, ``--config`` file and ``GAZEGUARD_*`` environment, and
prints what one release of each kind, one raw gaze sample, one hour of gaze and an 8-hour
session cost (user-level ε at δ), how many releases each can change, and the budget split.
Nothing is opened or started. ``--json`` prints the figures as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json

from gazeguard.cli._common import ExitCode, get_console, stdout
from gazeguard.cli.flags import add_settings_arguments
from gazeguard.cli.run import settings_from_args
from gazeguard.core.errors import ConfigError
from gazeguard.plan import ReleasePlan


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard plan``: ``run``'s settings flags and ``--json``."""
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--json", action="store_true", help="stdout: the figures as JSON")
    add_settings_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """``gazeguard plan``: print the plan (exit 1 with the problem when it cannot be built)."""
    settings = settings_from_args(args)
    if settings is None:
        return ExitCode.ERROR
    try:
        plan = ReleasePlan.from_settings(settings)
    except ConfigError as exc:
        get_console().error(str(exc), field=exc.field)
        return ExitCode.ERROR
    if args.json:
        stdout(json.dumps(plan.figures(), indent=2))
    else:
        stdout(plan.text())
    return ExitCode.OK
