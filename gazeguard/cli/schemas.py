"""``python -m gazeguard.message --write-schemas [DIR]``: write the payload JSON Schemas
(:func:`gazeguard.message.write_schemas`; default: ``gazeguard/data`` next to the module)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from gazeguard import message
from gazeguard.cli._common import ExitCode, stdout


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gazeguard.message --write-schemas [DIR]``."""
    parser = argparse.ArgumentParser(prog="python -m gazeguard.message", description=__doc__)
    parser.add_argument(
        "--write-schemas",
        nargs="?",
        const=Path(message.__file__).resolve().parent / "data",
        type=Path,
        metavar="DIR",
        help="write the payload JSON Schemas (default: gazeguard/data in the source tree)",
    )
    args = parser.parse_args(argv)
    if args.write_schemas is None:
        parser.print_help()
        return ExitCode.USAGE
    for path in message.write_schemas(args.write_schemas):
        stdout(f"wrote {path}")
    return ExitCode.OK
