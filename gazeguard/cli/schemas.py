"""``gazeguard schemas``: the JSON Schemas of every payload gazeguard publishes.

``gazeguard schemas`` lists them; ``--write [DIR]`` writes them (default: ``gazeguard/data``, the
files the package ships and the tests compare the models with); ``--check`` exits 1 when a
shipped file differs from its model (a stale schema after a model change).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

from gazeguard.cli._common import ExitCode, get_console, stdout
from gazeguard.wire import kinds, message

DATA = Path(str(resources.files("gazeguard"))) / "data"

#: Every shipped payload schema: file name → model (one per release kind).
SCHEMAS: Mapping[str, type[message.WireModel]] = kinds.SCHEMA_FILES


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard schemas``."""
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--write",
        nargs="?",
        const=DATA,
        type=Path,
        metavar="DIR",
        help="write every schema into DIR (default: gazeguard/data in the source tree)",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a shipped schema differs from its model"
    )


def run(args: argparse.Namespace) -> int:
    """``gazeguard schemas [--write [DIR]] [--check]``."""
    if args.write is not None:
        for path in message.write_schemas(args.write, SCHEMAS):
            stdout(f"wrote {path}")
        return ExitCode.OK
    stale = [
        name
        for name, model in SCHEMAS.items()
        if json.loads((DATA / name).read_text(encoding="utf-8")) != message.json_schema(model)
    ]
    for name, model in SCHEMAS.items():
        stdout(f"{name}: {model.__name__} ({DATA / name})")
    if args.check and stale:
        get_console().fail(f"stale: {', '.join(stale)}: run gazeguard schemas --write", stale=stale)
        return ExitCode.ERROR
    return ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    """``gazeguard schemas`` with its own parser (tests and scripts)."""
    parser = argparse.ArgumentParser(prog="gazeguard schemas")
    configure(parser)
    return run(parser.parse_args(argv))
