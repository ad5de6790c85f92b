"""The ledger's records, units and storage protocol (shared by every backend)."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any, Literal, Protocol

from gazeguard.core.errors import ConfigError, GazeguardError
from gazeguard.privacy.accounting import Event

UNITS_PER_EPSILON = 1_000_000
"""Integer units per ε (micro-ε): the ledger's exact unit of account."""
MAX_EPSILON = 1e4
"""Largest ε accepted for one feature of one chunk."""
MAX_CAP = 1e9
"""Largest cap (or withheld request) accepted: 10¹⁵ units, far inside SQLite's 64-bit integers."""
SCHEMA_VERSION = "5"
Synchronous = Literal["NORMAL", "FULL", "EXTRA"]


class LedgerError(GazeguardError):
    """The ledger cannot be used as asked: not a ledger file, locked too long, misuse."""


class StaleStateError(LedgerError):
    """A charge's preview is out of date: another writer charged the session in between.

    Preview again (the new state goes into the payload) and charge with the new version.
    """


class DuplicateChargeError(LedgerError):
    """A (session, chunk index) was charged or withheld before: a bug or a replay.

    Attributes:
        session: session identifier.
        chunk_index: the chunk number.
        what: ``"charged"`` or ``"withheld"``: what the release already was.
    """

    def __init__(self, session: str, chunk_index: int, what: str) -> None:
        self.session = session
        self.chunk_index = chunk_index
        self.what = what
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


@dataclass(frozen=True, slots=True)
class LedgerState:
    """One session's account (ε is dimensionless; counts are releases).

    Attributes:
        session: session identifier.
        epsilon: the session's user-level ε at :attr:`delta`: the best valid bound among the
            accountant's composition of every charged release and pure sequential composition.
        delta: the δ every (ε, δ) figure here is stated at (``ledger.delta``).
        epsilon_window: ε at δ of the releases whose gaze lies in the trailing
            :attr:`window_s` seconds of gaze time (with the default hour: ε per hour of gaze).
        window_s: the window's length, seconds of gaze.
        spent: sequential pure ε of everything charged (the sum of every released item's pure
            ε, samplers' slack included, exact in micro-ε): the conservative view; ``inf`` once
            a release without a pure guarantee (Gaussian noise) was charged.
        remaining: ``session_cap − epsilon`` (never below 0), or ``None`` without a session cap.
        window_remaining: ``window_cap − epsilon_window``, or ``None`` without a window cap.
        chunks: number of charged chunks.
        withheld: releases refused by a cap or dropped on an error.
        refused: charged releases the broker permanently refused (kept in the ledger).
        max_chunk_eps: largest single-chunk pure ε: the per-chunk (parallel composition) view.
        last_chunk: highest charged chunk index, or ``None`` before the first charge.
        last_gaze_end: latest gaze time charged (Unix s), or ``None``.
        pending: charged releases whose payload the sink has not acknowledged yet.
        session_cap: the binding cap on :attr:`epsilon`, or ``None``.
        window_cap: the binding cap on the ε of any window, or ``None``.
        version: incremented by every charge (previews are valid while it is unchanged).
    """

    session: str
    epsilon: float
    delta: float
    epsilon_window: float
    window_s: float
    spent: float
    remaining: float | None
    window_remaining: float | None
    chunks: int
    withheld: int
    refused: int
    max_chunk_eps: float
    last_chunk: int | None
    last_gaze_end: float | None
    pending: int
    session_cap: float | None
    window_cap: float | None
    version: int

    @property
    def available(self) -> float | None:
        """ε headroom under the tightest cap, or ``None`` when nothing caps the session."""
        limits = [x for x in (self.remaining, self.window_remaining) if x is not None]
        return min(limits) if limits else None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of all fields (``inf`` as ``None``)."""
        return {
            k: (None if isinstance(v, float) and math.isinf(v) else v)
            for k, v in asdict(self).items()
        }


@dataclass(frozen=True, slots=True)
class Charge:
    """A committed charge: its chunk's payload is in the outbox under ``outbox_id``.

    Attributes:
        session: session identifier.
        chunk_index: the chunk number.
        total: pure ε charged for the release (sum over its items, each rounded up to
            micro-ε), or ``inf`` without a pure guarantee.
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
    """A charged payload waiting for the sink's acknowledgement.

    Attributes:
        id: outbox position (increasing; delivery order within a session).
        session: session identifier.
        chunk_index: the release's index within its stream.
        topic: where to publish it.
        payload: the privatized message, exactly as enqueued.
        created: enqueue time, Unix seconds.
        stream: ``chunks`` (privatized feature chunks), ``labels`` or another release stream.
    """

    id: int
    session: str
    chunk_index: int
    topic: str
    payload: bytes
    created: float
    stream: str = "chunks"


@dataclass(frozen=True, slots=True)
class RefusedItem:
    """A charged payload the broker permanently refused (kept, never retried).

    Attributes:
        id: outbox position.
        session: session identifier.
        stream: release stream.
        chunk_index: the release's index.
        topic: where it was to be published.
        reason: why (e.g. ``"MQTT reason 0x87 Not authorized"``).
        refused_at: Unix s.
    """

    id: int
    session: str
    stream: str
    chunk_index: int
    topic: str
    reason: str
    refused_at: float


@dataclass(frozen=True, slots=True)
class ChargeRecord:
    """One row of a session's charge history.

    Attributes:
        chunk_index: the release's index.
        total: its pure ε (sum over its items), or ``inf`` without a pure guarantee.
        epsilon: pure ε per released item (from its accounting event; ``inf`` for Gaussian
            noise).
        created: charge time, Unix s.
        gaze_start: Unix time of the release's first gaze (s).
        gaze_end: Unix time of its last gaze (s).
    """

    chunk_index: int
    total: float
    epsilon: dict[str, float]
    created: float
    gaze_start: float = 0.0
    gaze_end: float = 0.0


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

    def send(self, sql: str, params: Sequence[object] = ()) -> Callable[[], list[tuple[Any, ...]]]:
        """Execute, and return a function that gives its rows. Inside :meth:`pipeline` the
        statement may still be running when this returns (PostgreSQL); its rows, or its error,
        come by the end of the pipeline."""
        ...

    def pipeline(self) -> AbstractContextManager[None]:
        """A span in which :meth:`send` does not wait for the server (PostgreSQL's pipeline
        mode: the server runs the statements while the caller goes on); on leaving it every
        statement has run, and the first error is raised. Elsewhere, nothing."""
        ...


class LedgerBackend(Protocol):
    """Storage of a ledger: the tables of :data:`SQLITE_SCHEMA` (or their PostgreSQL twins).

    ``write()`` opens a transaction that, together with ``lock_clause`` appended to the
    session-row ``SELECT``, serialises every writer of the same session; ``read()`` a snapshot.
    Statements live in :mod:`gazeguard.ledger._store`, accounting in
    :mod:`gazeguard.ledger.policy`.
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
    """Stamp a new ledger with :data:`SCHEMA_VERSION`, or refuse one written by another schema.

    Ledgers are never upgraded in place: a file (or database) of another schema version is
    refused with a :class:`LedgerError` that names it and says what to do.
    """
    row = sql.one("SELECT value FROM meta WHERE key = 'schema'")
    if row is None:
        sql.run("INSERT INTO meta (key, value) VALUES ('schema', ?)", (SCHEMA_VERSION,))
    elif row[0] != SCHEMA_VERSION:
        raise LedgerError(schema_mismatch(location, str(row[0])))


def schema_mismatch(location: str, found: str) -> str:
    """The message for a ledger at ``location`` written with schema version ``found``."""
    head = (
        f"ledger {location!r} has schema version {found}; this gazeguard reads version "
        f"{SCHEMA_VERSION} only and does not upgrade ledgers: "
    )
    if found.isdigit() and int(found) > int(SCHEMA_VERSION):
        return head + "use the newer gazeguard release that wrote it"
    return head + (
        "start a new ledger (point ledger.path, or ledger.url, at a new file or database) and "
        "keep this one for its records"
    )


@functools.lru_cache(maxsize=4096)
def event_key(event: Event) -> str:
    """The ledger's key of an accounting event: the canonical JSON of ``event.to_dict()``
    (e.g. ``{"kind": "laplace", "ratio": 56.05, "slack": 3.1e-14}``), which
    :func:`gazeguard.privacy.accounting.event_from_dict` reads back after a restart; cached: a
    fleet charges the same few events every chunk. The storage form only: the ledger's API
    takes the events."""
    return json.dumps(event.to_dict(), sort_keys=True)
