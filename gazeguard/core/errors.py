"""The one exception hierarchy of gazeguard.

Every error a user can meet derives from :class:`GazeguardError`. Messages quote the offending
argument and repeat the bad value, and say what to do next. Exceptions carry their facts as
attributes so callers (and tests) need not parse messages.
"""

from __future__ import annotations

from pathlib import Path


class GazeguardError(Exception):
    """Base class of all gazeguard errors."""


class ConfigError(GazeguardError, ValueError):
    """A configuration value is invalid.

    Attributes:
        field: dotted name of the setting, e.g. ``"mechanism.epsilon"``.
        value: the rejected value, as given.
        source: where it came from (``"file config.toml"``, ``"environment"``, ``"argument"``).
    """

    def __init__(self, field: str, value: object, reason: str, source: str | None = None) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        self.source = source
        where = f" (from {source})" if source else ""
        shown = repr(value)
        if len(shown) > 120:  # a 10 kB value would bury the reason
            shown = f"{shown[:100]}… ({len(shown)} characters)"
        super().__init__(f"invalid value for {field!r}{where}: {shown}: {reason}")


class StreamError(GazeguardError):
    """The LSL gaze stream is missing, malformed or cannot be interpreted."""


class StreamNotFoundError(StreamError):
    """No LSL stream matching the configuration appeared within the resolve timeout."""


class BudgetExhaustedError(GazeguardError):
    """A privacy charge was refused because it would exceed a cap.

    Attributes:
        session: session identifier.
        requested: ε the chunk would cost.
        remaining: ε still available under the binding cap.
        cap: which cap refused the charge (``"session"``, ``"per-3600-s-of-gaze"`` or
            ``"per-3600-s-of-wall-clock"``).
    """

    def __init__(
        self, session: str, requested: float, remaining: float, cap: str = "session"
    ) -> None:
        self.session = session
        self.requested = requested
        self.remaining = remaining
        self.cap = cap
        super().__init__(
            f"Session {session!r} requested epsilon={requested:.6g} but only "
            f"{max(remaining, 0.0):.6g} remains under the {cap} cap; the chunk is withheld."
        )


class PublishError(GazeguardError):
    """The MQTT broker is unreachable or refused us."""


class DatasetError(GazeguardError, ValueError):
    """A recorded dataset file is malformed.

    Attributes:
        path: the file.
        line: 1-based line number, when known.
    """

    def __init__(self, path: str | Path, reason: str, line: int | None = None) -> None:
        self.path = Path(path)
        self.line = line
        self.reason = reason
        at = f", line {line}" if line is not None else ""
        super().__init__(f"{self.path}{at}: {reason}")
