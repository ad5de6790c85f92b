"""``gazeguard config``: check a configuration; list the features a release profile can name.

``gazeguard config check FILE`` runs :func:`gazeguard.runtime.preflight.check_settings` on the file
plus the ``GAZEGUARD_*`` environment — the configuration ``gazeguard run --config FILE`` would start
with — and reports **every** problem (field, value, where it came from, "did you mean"), exiting 1
if there is any. stdout carries JSON only: the effective settings when the configuration is good, or
with ``--json`` a report ``{"file", "valid", "problems": [...], "settings", "plan"}`` either way
(``plan``: the release plan's figures, :mod:`gazeguard.plan`); human lines go to stderr. The ledger,
when the file exists, is only read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gazeguard.cli._common import ExitCode, get_console, stdout
from gazeguard.config import FeatureSettings
from gazeguard.plan import ReleasePlan
from gazeguard.runtime.preflight import check_settings
from gazeguard.signal.features import FEATURES


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard config``."""
    sub = parser.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = sub.add_parser(
        "check",
        help="every problem `gazeguard run --config FILE` would refuse; the effective settings",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("file", type=Path, help="configuration file (TOML)")
    check.add_argument(
        "--json", action="store_true", help="stdout: a JSON report, also when there are problems"
    )
    features = sub.add_parser(
        "features", help="the feature names a release profile (mechanism.features) can use"
    )
    features.add_argument("--window-s", type=float, default=FeatureSettings().window_s)
    features.add_argument("--step-s", type=float, default=FeatureSettings().step_s)
    features.add_argument("--json", action="store_true", help="machine-readable JSON")


def run(args: argparse.Namespace) -> int:
    """``gazeguard config check FILE`` / ``gazeguard config features``."""
    if args.config_command == "features":
        return _features(args.window_s, args.step_s, as_json=args.json)
    console = get_console()
    settings, problems = check_settings(args.file)
    effective = None if settings is None else settings.model_dump(mode="json")
    plan = None if settings is None or problems else ReleasePlan.from_settings(settings)
    if args.json:
        report = {
            "file": str(args.file),
            "valid": not problems,
            "problems": [p.as_dict() for p in problems],
            "settings": effective,
            "plan": None if plan is None else plan.figures(),
        }
        stdout(json.dumps(report, indent=2))
    elif not problems:
        stdout(json.dumps(effective, indent=2))
    for problem in problems:
        console.fail(f"{args.file}: {problem}", **problem.as_dict())
    if problems:
        n = len(problems)
        console.fail(
            f"{args.file}: {n} problem{'s' if n > 1 else ''}: `gazeguard run` would refuse this "
            "configuration",
            problems=n,
        )
        return ExitCode.ERROR
    assert plan is not None
    console.say("plan", plan.text(), **plan.figures())
    console.say("ok", f"{args.file}: OK", file=str(args.file))
    return ExitCode.OK


def _features(window_s: float, step_s: float, *, as_json: bool) -> int:
    rows = [(f, *f.bounds(window_s, step_s)) for f in FEATURES]
    if as_json:
        doc = [
            {"name": f.name, "unit": f.unit, "lo": lo, "hi": hi, "max_step": st,
             "description": f.description}
            for f, lo, hi, st in rows
        ]  # fmt: skip
        stdout(json.dumps(doc, indent=2))
        return ExitCode.OK
    lines = [f"{'name':<28} {'unit':<8} {'lo':>9} {'hi':>9} {'max_step':>9}  description"]
    lines += [
        f"{f.name:<28} {f.unit:<8} {lo:>9.4g} {hi:>9.4g} {st:>9.4g}  {f.description}"
        for f, lo, hi, st in rows
    ]
    stdout("\n".join(lines))
    return ExitCode.OK
