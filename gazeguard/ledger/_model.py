"""The ledger's records, units and storage protocol (shared by every backend)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any, Literal, Protocol

from gazeguard.errors import ConfigError, GazeguardError

UNITS_PER_EPSILON = 1_000_000
"""Integer units per ε (micro-ε): the ledger's exact unit of account."""
MAX_EPSILON = 1e4
"""Largest ε accepted for one feature of one chunk."""
MAX_CAP = 1e9
"""Largest cap (or withheld request) accepted: 10¹⁵ units, far inside SQLite's 64-bit integers."""
SCHEMA_VERSION = "1"
Synchronous = Literal["NORMAL", "FULL", "EXTRA"]
Payload = bytes | Callable[["LedgerState"], bytes]


class LedgerError(GazeguardError):
    """The ledger cannot be used as asked: not a ledger file, locked too long, misuse."""


class DuplicateChargeError(LedgerError):
    """A (session, chunk index) was charged or withheld before: a bug or a replay.

    Attributes:
        session: session identifier.
        chunk_index: the chunk number.
    """

    def __init__(self, session: str, chunk_index: int, what: str) -> None:
        self.session = session
        self.chunk_index = chunk_index
        super().__init__(
            f"chunk_index={chunk_index} of session {session!r} was already {what}; a chunk is "
            "charged at most once. Use the next chunk index (a restart continues after "
            "LedgerState.last_chunk)."
        )


def to_units_up(epsilon: float, field: str = "epsilon", limit: float = MAX_EPSILON) -> int:
    """ε → integer micro-ε, rounded up (a charge never costs less than asked)."""
    return _to_units(epsilon, field, ROUND_CEILING, limit)


def to_units_down(epsilon: float, field: str = "cap", limit: float = MAX_CAP) -> int:
    """ε → integer micro-ε, rounded down (a cap never allows more than configured)."""
    return _to_units(epsilon, field, ROUND_FLOOR, limit)


def _to_units(epsilon: float, field: str, rounding: str, limit: float) -> int:
    value = float(epsilon)
    if not (math.isfinite(value) and 0 < value <= limit):
        raise ConfigError(field, epsilon, f"must be a finite number in (0, {limit:g}]")
    scaled = Decimal(repr(value)) * UNITS_PER_EPSILON
    return int(scaled.to_integral_value(rounding=rounding))


def eps_of(units: int | None) -> float | None:
    return None if units is None else units / UNITS_PER_EPSILON


@dataclass(frozen=True, slots=True)
class LedgerState:
    """One session's account (ε is dimensionless; counts are chunks).

    Attributes:
        session: session identifier.
        spent: ε of all charged chunks (sequential composition): the honest user-level figure.
        remaining: ``session_cap − spent`` (never below 0), or ``None`` without a session cap.
        chunks: number of charged (released) chunks.
        withheld: number of chunks refused or dropped and recorded with :meth:`Ledger.withhold`.
        max_chunk_eps: largest single-chunk ε: the per-chunk (parallel composition) view.
        last_chunk: highest charged chunk index, or ``None`` before the first charge.
        pending: charged chunks whose payload the broker has not acknowledged yet.
        session_cap: the binding per-session cap, or ``None``.
        w_event: ``w`` of the w-event cap (chunks), or ``None``.
        w_event_cap: ε allowed over any ``w`` consecutive chunk indexes, or ``None``.
        window_spent: ε of chunks ``last_chunk−w+1 … last_chunk``, or ``None`` without a w-event
            cap.
        window_remaining: ε the next chunk (``last_chunk+1``) may spend under the w-event cap,
            or ``None`` without one.
    """

    session: str
    spent: float
    remaining: float | None
    chunks: int
    withheld: int
    max_chunk_eps: float
    last_chunk: int | None
    pending: int
    session_cap: float | None
    w_event: int | None
    w_event_cap: float | None
    window_spent: float | None
    window_remaining: float | None

    @property
    def available(self) -> float | None:
        """ε the next chunk may spend under every cap, or ``None`` when nothing caps it."""
        limits = [x for x in (self.remaining, self.window_remaining) if x is not None]
        return min(limits) if limits else None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of all fields."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Charge:
    """A committed charge: its chunk's payload is in the outbox under ``outbox_id``.

    Attributes:
        session: session identifier.
        chunk_index: the chunk number.
        total: ε charged for the chunk (sum over features, after rounding up to micro-ε).
        state: the session's state right after this charge.
        outbox_id: id of the enqueued payload (outbox order).
    """

    session: str
    chunk_index: int
    total: float
    state: LedgerState
    outbox_id: int


@dataclass(frozen=True, slots=True)
class OutboxItem:
    """A charged payload waiting for the broker's acknowledgement.

    Attributes:
        id: outbox position (increasing; delivery order within a session).
        session: session identifier.
        chunk_index: the chunk number.
        topic: MQTT topic to publish on.
        payload: the privatized message, exactly as enqueued.
        created: enqueue time, Unix seconds.
    """

    id: int
    session: str
    chunk_index: int
    topic: str
    payload: bytes
    created: float


@dataclass(frozen=True, slots=True)
class ChargeRecord:
    """One row of a session's charge history (``epsilon`` is ε per released feature)."""

    chunk_index: int
    total: float
    epsilon: dict[str, float]
    created: float


class Sql(Protocol):
    """Statements inside one open transaction; SQL uses ``?`` placeholders."""

    def one(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        """Execute and return the first row (or ``None``)."""
        ...

    def all(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """Execute and return all rows."""
        ...

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        """Execute and return the number of rows changed."""
        ...


class LedgerBackend(Protocol):
    """Storage of a ledger: the tables of :data:`SQLITE_SCHEMA` (or their PostgreSQL twins).

    ``write()`` opens a transaction that, together with ``lock_clause`` appended to the
    session-row ``SELECT``, serialises every writer of the same session; ``read()`` a snapshot.
    The accounting itself lives in :class:`Ledger`, once for all backends.
    """

    kind: str
    location: str
    lock_clause: str

    def write(self) -> AbstractContextManager[Sql]:
        """A write transaction (committed on normal exit, rolled back on an exception)."""
        ...

    def read(self) -> AbstractContextManager[Sql]:
        """A consistent read-only snapshot."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


def check_schema(sql: Sql, location: str) -> None:
    """Stamp a new ledger with :data:`SCHEMA_VERSION`, or refuse one written by another."""
    row = sql.one("SELECT value FROM meta WHERE key = 'schema'")
    if row is None:
        sql.run("INSERT INTO meta (key, value) VALUES ('schema', ?)", (SCHEMA_VERSION,))
    elif row[0] != SCHEMA_VERSION:
        raise LedgerError(
            f"ledger {location!r} has schema version {row[0]}, this gazeguard reads version "
            f"{SCHEMA_VERSION}; use the gazeguard release that wrote it"
        )
