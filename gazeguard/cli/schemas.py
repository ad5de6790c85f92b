"""Write the shipped payload JSON Schemas (default: ``gazeguard/data`` next to the modules):

* ``python -m gazeguard.message --write-schemas [DIR]``: chunk and status
  (:func:`gazeguard.message.write_schemas`);
* ``python -m gazeguard.label_message --write-schema [DIR]``: the private label;
* ``python -m gazeguard.cohort_message --write-schema [DIR]``: the cohort aggregate and the
  cohort attention message.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from gazeguard import message
from gazeguard.cli._common import ExitCode, stdout

DATA = Path(message.__file__).resolve().parent / "data"


def _write(
    module: str,
    flag: str,
    what: str,
    write: Callable[[Path], list[Path]],
    argv: Sequence[str] | None,
) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=__doc__)
    parser.add_argument(
        flag,
        nargs="?",
        const=DATA,
        type=Path,
        metavar="DIR",
        help=f"write {what} (default: gazeguard/data in the source tree)",
        dest="directory",
    )
    args = parser.parse_args(argv)
    if args.directory is None:
        parser.print_help()
        return ExitCode.USAGE
    for path in write(args.directory):
        stdout(f"wrote {path}")
    return ExitCode.OK


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gazeguard.message --write-schemas [DIR]``."""
    what = "the payload JSON Schemas"
    return _write("gazeguard.message", "--write-schemas", what, message.write_schemas, argv)


def label_main(argv: Sequence[str] | None = None) -> int:
    """``python -m gazeguard.label_message --write-schema [DIR]``."""
    from gazeguard.label_message import write_schema  # noqa: PLC0415 - imports gazeguard.message

    def write(directory: Path) -> list[Path]:
        return [write_schema(directory)]

    return _write("gazeguard.label_message", "--write-schema", "label.schema.json", write, argv)


def cohort_main(argv: Sequence[str] | None = None) -> int:
    """``python -m gazeguard.cohort_message --write-schema [DIR]``."""
    from gazeguard.cohort_message import (  # noqa: PLC0415
        ATTENTION_SCHEMA_FILE,
        SCHEMA_FILE,
        AttentionMessage,
        CohortMessage,
    )

    def write(directory: Path) -> list[Path]:
        return message.write_schemas(
            directory, {SCHEMA_FILE: CohortMessage, ATTENTION_SCHEMA_FILE: AttentionMessage}
        )

    what = f"{SCHEMA_FILE} and {ATTENTION_SCHEMA_FILE}"
    return _write("gazeguard.cohort_message", "--write-schema", what, write, argv)
