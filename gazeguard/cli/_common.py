"""What every command shares: exit codes, the common flags, logging, console output, the loop.

Console output (banners, progress, summaries, errors) goes to **stderr**; stdout carries only a
command's result (JSON where a command offers it), so ``gazeguard … > out.json`` stays parseable.
With ``--log-format json`` every stderr line — log records and console lines alike — is one
JSON object (``time``, ``level``, ``logger``, ``message``, and for console lines ``event`` plus the
line's facts as fields).
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import importlib
import json
import logging
import signal
import sys
import textwrap
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from gazeguard.core.errors import GazeguardError

if sys.platform != "win32":  # uvloop is a dependency everywhere but on Windows (pyproject.toml)
    import uvloop

_T = TypeVar("_T")

LogFormat = Literal["text", "json"]
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ExitCode(enum.IntEnum):
    """Exit status of every ``gazeguard`` command (the README and ``gazeguard --help`` list them,
    from :attr:`meaning`).

    ``run`` derives 3–5 from its summary at exit; when several apply, the highest wins (a broker
    that refused chunks is reported over one that was unreachable, which is reported over a spent
    budget).
    """

    OK = 0
    ERROR = 1
    USAGE = 2
    BUDGET = 3
    UNDELIVERED = 4
    REFUSED = 5
    INTERRUPTED = 130

    @property
    def meaning(self) -> str:
        """What the status means, in one line."""
        return _MEANINGS[self]


_MEANINGS = {
    ExitCode.OK: "done; for `run`: every charged chunk delivered, none withheld",
    ExitCode.ERROR: "error: invalid configuration or argument (named with its source; "
    "`gazeguard config check` lists every problem), stream not found, unusable ledger, …",
    ExitCode.USAGE: "command line not understood (unknown command or flag, missing argument)",
    ExitCode.BUDGET: "`run`: chunks withheld because a privacy-budget cap was reached",
    ExitCode.UNDELIVERED: "`run`: broker unreachable for the whole run, or charged chunks still "
    "in the outbox at exit (sent on the next start)",
    ExitCode.REFUSED: "`run`: the broker refused the login or the chunks (ACL, credentials, TLS); "
    "they stay in the outbox",
    ExitCode.INTERRUPTED: "stopped by Ctrl-C (SIGINT), in every command",
}


def exit_code_table() -> str:
    """The exit codes as plain text, for ``gazeguard --help``."""
    lines = ["exit status:"]
    for code in ExitCode:
        text = textwrap.wrap(code.meaning, 78)
        lines.append(f"  {int(code):>3}  {code.name:<11}  {text[0]}")
        lines += [f"{'':20}{more}" for more in text[1:]]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- common flags


def common_flags() -> argparse.ArgumentParser:
    """The flags every command accepts before *or* after its name (``gazeguard -v run`` and
    ``gazeguard run -v``). Defaults are suppressed so that a flag given after the command does
    not reset one given before it; read them with :func:`log_settings`."""
    parent = argparse.ArgumentParser(add_help=False)
    g = parent.add_argument_group("output and logging (before or after COMMAND)")
    g.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="more log output (-v info, -vv debug)",
    )
    g.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="no progress lines; log errors only",
    )
    g.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=argparse.SUPPRESS,
        help="text (default) or json: one JSON object per stderr line",
    )
    g.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS,
        metavar="LEVEL",
        help="DEBUG, INFO, WARNING (default), ERROR; overrides -v/-q",
    )
    return parent


#: Common flags that take a value (so ``gazeguard --log-format json run`` finds ``run``).
VALUE_FLAGS = ("--log-format", "--log-level")


def find_command(argv: Sequence[str]) -> str | None:
    """The subcommand: the first argument that is neither a flag nor a common flag's value."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in VALUE_FLAGS:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def log_settings(args: argparse.Namespace) -> tuple[int, LogFormat, bool]:
    """``(logging level, format, quiet)`` from the common flags."""
    verbose = int(getattr(args, "verbose", 0) or 0)
    quiet = bool(getattr(args, "quiet", False))
    fmt: LogFormat = getattr(args, "log_format", "text")
    name = getattr(args, "log_level", None)
    if name is not None:
        level = int(getattr(logging, name))
    elif quiet and not verbose:
        level = logging.ERROR
    else:
        level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    return level, fmt, quiet


# ---------------------------------------------------------------------------- logging and output


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            doc |= {k: v for k, v in fields.items() if k not in doc}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _StderrHandler(logging.Handler):
    """Writes each record to the *current* ``sys.stderr`` (which tests and wrappers may swap)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # logging must never raise
            self.handleError(record)


def configure_logging(level: int, fmt: LogFormat) -> None:
    """Route every logger to stderr in ``fmt``, at ``level`` (replacing the handler an earlier
    call installed; other handlers, e.g. a test runner's, are left alone)."""
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        if isinstance(old, _StderrHandler) or (
            isinstance(old, logging.StreamHandler) and old.stream in (sys.stderr, sys.__stderr__)
        ):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


class Console:
    """The human lines of a command (banner, progress, summary, errors), on stderr.

    In ``json`` format each line is a JSON object like a log record, with ``event`` (``banner``,
    ``chunk``, ``summary``, ``error``, …) and the line's facts as fields, so a log shipper gets
    one format. Progress lines are dropped when ``quiet``.
    """

    def __init__(self, command: str = "gazeguard", fmt: LogFormat = "text", *, quiet: bool = False):
        self.command = command
        self.fmt: LogFormat = fmt
        self.quiet = quiet

    def say(self, event: str, text: str, /, **fields: Any) -> None:
        """Write one line (always shown)."""
        self._write("INFO", event, text, fields)

    def progress(self, event: str, text: str, /, **fields: Any) -> None:
        """Write one progress line (not when quiet)."""
        if not self.quiet:
            self._write("INFO", event, text, fields)

    def warn(self, text: str, /, **fields: Any) -> None:
        """Write a warning line."""
        self._write("WARNING", "warning", text, fields)

    def error(self, text: str, /, **fields: Any) -> None:
        """Write ``gazeguard COMMAND: error: text``."""
        self._write("ERROR", "error", f"{self.command}: error: {text}", fields)

    def fail(self, text: str, /, **fields: Any) -> None:
        """Write an error line exactly as given."""
        self._write("ERROR", "error", text, fields)

    def _write(self, level: str, event: str, text: str, fields: dict[str, Any]) -> None:
        if self.fmt == "json":
            doc: dict[str, Any] = {
                "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "level": level,
                "logger": "gazeguard.cli",
                "event": event,
                "message": text,
            }
            doc |= {k: v for k, v in fields.items() if k not in doc}
            line = json.dumps(doc, ensure_ascii=False, default=str)
        else:
            line = text
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


#: The console of the command being run (set by :func:`gazeguard.cli.main`).
console = Console()


def set_console(new: Console) -> None:
    """Make ``new`` the console every command module writes to."""
    global console  # noqa: PLW0603 - one process-wide console, set once per main()
    console = new


def get_console() -> Console:
    """The current console."""
    return console


def stdout(text: str) -> None:
    """A command's result (JSON or the text a script reads) on stdout."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------------------- extras

#: Optional packages → the extra that installs them.
EXTRAS = {
    "sklearn": "eval",
    "scipy": "eval",
    "matplotlib": "eval",
    "pyarrow": "parquet",
    "psycopg": "fleet",
    "nats": "fleet",
}


class MissingExtraError(GazeguardError):
    """A command needs an optional dependency that is not installed."""

    def __init__(self, what: str, extra: str) -> None:
        self.extra = extra
        super().__init__(
            f"{what} needs the '{extra}' extra: "
            f"pip install -e '.[{extra}]' (in the gazeguard checkout)"
        )


def extra_for(exc: ImportError) -> str | None:
    """The extra that provides the module ``exc`` failed to import, if it is one of ours."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    return EXTRAS.get(name)


def require(what: str, *modules: str) -> None:
    """Import ``modules`` or raise :class:`MissingExtraError` naming the extra for ``what``."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            extra = extra_for(exc) or EXTRAS.get(module.split(".")[0])
            if extra is None:
                raise
            raise MissingExtraError(what, extra) from exc


def available(*modules: str) -> bool:
    """Whether all ``modules`` import."""
    try:
        for module in modules:
            importlib.import_module(module)
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------------- event loop


def run_loop(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` on uvloop (the plain asyncio loop on Windows, where uvloop does not exist)."""
    if sys.platform == "win32":  # pragma: no cover - Windows
        return asyncio.run(coro)
    return uvloop.run(coro)


class Signals:
    """Which stop signals arrived (:func:`stop_on_signals`)."""

    def __init__(self) -> None:
        self.received: list[int] = []

    @property
    def interrupted(self) -> bool:
        """Ctrl-C (SIGINT) arrived: the command exits with :attr:`ExitCode.INTERRUPTED`.
        SIGTERM (a service manager's stop) is a normal stop."""
        return signal.SIGINT in self.received


def stop_on_signals(stop: asyncio.Event) -> Signals:
    """SIGINT and SIGTERM set ``stop`` (call inside the running loop); the returned
    :class:`Signals` records which arrived."""
    loop = asyncio.get_running_loop()
    seen = Signals()

    def on_signal(sig: int) -> None:
        seen.received.append(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    return seen


def interrupted_line(command: str) -> None:
    """The one line a command writes when Ctrl-C stops it before it could finish."""
    console.say("interrupted", f"{command}: interrupted (Ctrl-C)")


def gaze_window(window_s: float) -> str:
    """A ledger window in words a user can place, after "last" or "any": ``3679`` → ``"hour
    of gaze + 79 s of reach"`` (the releases one hour of gaze can change end within an hour
    plus their reach), ``3600`` → ``"hour of gaze"``, ``600`` → ``"600 s of gaze"``."""
    hour = 3600.0
    if window_s < hour:
        return f"{window_s:g} s of gaze"
    if window_s == hour:
        return "hour of gaze"
    return f"hour of gaze + {window_s - hour:.0f} s of reach"


def epsilon_list(example: str) -> Callable[[str], list[float]]:
    """An argparse type: comma-separated ε, each finite and > 0 (``example`` for the message)."""

    def epsilons(text: str) -> list[float]:
        try:
            vals = [float(v) for v in text.split(",") if v.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: expected numbers like {example}") from exc
        if not vals or any(not (0 < v < float("inf")) for v in vals):
            raise argparse.ArgumentTypeError(f"{text!r}: every epsilon must be a finite number > 0")
        return vals

    return epsilons


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        v = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 1") from exc
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 1")
    return v


def kept_coefficients(text: str) -> int | str:
    """The argparse type of ``--k``: ``auto`` or a whole number >= 1 of kept coefficients."""
    if text == "auto":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 'auto' or an integer >= 1") from exc


def add_feature_arguments(group: argparse._ArgumentGroup, cache: str) -> None:
    """``--window`` and ``--step`` (s) of the feature extraction and ``--cache-dir`` and
    ``--no-cache`` of its cache, shared by ``eval`` and ``profile`` (``cache``: the cache's
    help, before its default)."""
    group.add_argument("--window", type=float, default=30.0, help="feature window W, s (30)")
    group.add_argument("--step", type=float, default=0.5, help="feature step, s (0.5)")
    group.add_argument(
        "--cache-dir",
        type=Path,
        default=Path.home() / ".cache" / "gazeguard" / "eval",
        help=f"{cache} (default ~/.cache/gazeguard/eval)",
    )
    group.add_argument("--no-cache", action="store_true", help="always extract features afresh")
