"""The ledger's SQL, written once for SQLite and PostgreSQL (``?`` placeholders, :class:`Sql`).

Storage only: rows in, rows out. What the rows mean (composition, caps, windows) is
:mod:`gazeguard.ledger.policy`; when to write them is :class:`gazeguard.ledger.Ledger`.

Tables (schema version 5; DDL in the backends):

* ``sessions`` — one row per session: its caps (JSON), counts, the sequential pure spend in
  integer micro-ε, the last chunk index and the latest gaze time charged, ``version``
  (incremented by every charge: a :meth:`~gazeguard.ledger.Ledger.preview` is valid while the
  version is unchanged), its event counts (how many releases of each accounting event were
  charged: the session's composition, recomputed exactly after any restart; JSON, written by
  the charge's one ``UPDATE`` of the row), and its *counters* (:class:`Counters`), kept in the
  transaction of every charge (and of every outbox state change) so that a charge needs no
  query over the window's rows: the event counts of the charges whose gaze ends after
  ``gaze_lo`` and of those made after ``wall_lo`` (both Unix s, advanced to the start of the
  trailing window by each charge), the earliest gaze end and charge time among those counted
  (while a window's start stays before them, no charge leaves it and nothing is read), and the
  number of pending outbox items. Derived data: :meth:`Store.recount` gives the same from the
  rows, :meth:`Store.verify` compares them.
* ``events`` — accounting-event keys (canonical JSON) → small integer ids.
* ``charges`` — one row per charged release (session, stream, index): pure ε per feature (JSON),
  its pure total in micro-ε (NULL when it has no pure bound), its gaze time span (Unix s).
* ``charge_events`` — the events of each charge (for windows over gaze time).
* ``withheld`` — releases refused by a cap or dropped on an error.
* ``outbox`` — charged payloads waiting for the sink's acknowledgement; ``state`` is
  ``pending``, ``delivered`` (payload dropped) or ``refused`` (the broker permanently refused it:
  payload kept, reason recorded, the queue goes on). Its pending items are indexed per session
  (:data:`INDEXES`, created on every open, so older ledger files get them too).

The tables declare no foreign keys: a charge's rows are written together, in one transaction,
and :meth:`Store.verify` reports any row whose parent is missing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gazeguard.ledger._model import LedgerError, Sql


@dataclass(slots=True)
class SessionRow:
    """A session's stored account (micro-ε for ``spent_units``/``max_units``)."""

    caps: str
    version: int
    chunks: int
    withheld: int
    refused: int
    spent_units: int
    pure_finite: bool
    max_units: int
    last_chunk: int | None
    last_gaze_end: float | None
    counts: dict[str, int] = field(default_factory=dict)  # event key -> releases charged
    counters: Counters | None = None  # read with the row (None: a row computed, not read)


@dataclass(frozen=True, slots=True)
class Counters:
    """A session's stored counters (columns of its ``sessions`` row).

    Attributes:
        gaze_lo: the gaze counts are of the charges whose gaze ends after this (Unix s;
            ``None``: of all charges).
        wall_lo: the wall counts are of the charges made after this (Unix s, wall clock;
            ``None``: of all charges).
        gaze: accounting-event key → releases, over the charges after ``gaze_lo`` in gaze time.
        wall: the same over the charges made after ``wall_lo``.
        pending: the session's pending outbox items.
        gaze_first: the earliest gaze end of the charges ``gaze`` counts (Unix s; ``None``:
            it counts none). A window starting before it loses no charge.
        wall_first: the earliest charge time of those ``wall`` counts (Unix s; ``None``: none).
    """

    gaze_lo: float | None
    wall_lo: float | None
    gaze: dict[str, int]
    wall: dict[str, int]
    pending: int
    gaze_first: float | None = None
    wall_first: float | None = None


_SORTED_JSON = json.JSONEncoder(sort_keys=True).encode  # (json.dumps builds one per call)


def _counts_json(counts: Mapping[str, int]) -> str:
    return _SORTED_JSON({k: int(n) for k, n in counts.items() if n})


#: Which time a range of charges is selected by: their gaze end, or when they were made.
Clock = Literal["gaze", "wall"]


def _counts_of(text: str) -> dict[str, int]:
    return {str(k): int(n) for k, n in json.loads(text).items()}


#: The ``sessions`` columns of its counters, in the order :func:`_counters_of` reads them.
COUNTER_COLUMNS = ("gaze_lo", "wall_lo", "gaze_counts", "wall_counts", "pending", "gaze_first",
                   "wall_first")  # fmt: skip


def _float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


class _BatchTexts:
    """Event counts to and from their JSON texts for one batch of sessions, each distinct text
    parsed (and each distinct counts written) once: a batch's sessions share few distinct
    counts, and the keys are long. A parsed text is handed out as a fresh dict each time."""

    def __init__(self) -> None:
        self._parsed: dict[str, dict[str, int]] = {}
        self._written: dict[tuple[tuple[str, int], ...], str] = {}

    def parse(self, text: str) -> dict[str, int]:
        got = self._parsed.get(text)
        if got is None:
            got = self._parsed[text] = _counts_of(text)
        return dict(got)

    def dump(self, counts: Mapping[str, int]) -> str:
        key = tuple(counts.items())
        got = self._written.get(key)
        if got is None:
            got = self._written[key] = _counts_json(counts)
        return got


def _counters_of(row: Sequence[Any], texts: _BatchTexts | None = None) -> Counters:
    """Counters from the :data:`COUNTER_COLUMNS` of a row."""
    parse = _counts_of if texts is None else texts.parse
    return Counters(
        _float(row[0]), _float(row[1]), parse(row[2]), parse(row[3]), int(row[4]),
        _float(row[5]), _float(row[6]),
    )  # fmt: skip


def after_charge(
    row: SessionRow,
    *,
    units: int | None,
    idx: int,
    stream: str,
    gaze_end: float,
    counts: Mapping[str, int],
) -> SessionRow:
    """The session's row as a charge leaves it (:meth:`Store.update_after_charge`): counts,
    spend, last index and gaze time, version + 1, its event counts ``counts``."""
    last = row.last_chunk
    if stream == "chunks":
        last = idx if last is None else max(last, idx)
    return SessionRow(
        row.caps,
        row.version + 1,
        row.chunks + (1 if stream == "chunks" else 0),
        row.withheld,
        row.refused,
        row.spent_units + (units or 0),
        row.pure_finite and units is not None,
        max(row.max_units, units or 0),
        last,
        gaze_end if row.last_gaze_end is None else max(row.last_gaze_end, gaze_end),
        {k: int(n) for k, n in counts.items() if n},
    )


#: At most this many parameters in one batched statement (SQLite's default limit is 32,766
#: since 3.32, PostgreSQL's 65,535), and at most :data:`BATCH_ROWS` rows.
BATCH_PARAMS = 30_000
BATCH_ROWS = 1_000

#: A release's key in the ledger: (session, stream, index).
ReleaseKey = tuple[str, str, int]


def _batches(
    rows: Sequence[Sequence[object]], columns: int
) -> Iterator[Sequence[Sequence[object]]]:
    """``rows`` in slices small enough for one statement each (:data:`BATCH_PARAMS`)."""
    size = max(1, min(BATCH_ROWS, BATCH_PARAMS // max(columns, 1)))
    for at in range(0, len(rows), size):
        yield rows[at : at + size]


def _values(rows: int, row: str) -> str:
    """``row`` (a parenthesised tuple of placeholders) ``rows`` times, comma-separated."""
    return ", ".join([row] * rows)


_OUTBOX_ROW = "(?, ?, ?, ?, ?, ?, 'pending')"


def _flat(rows: Sequence[Sequence[object]]) -> list[object]:
    return [value for row in rows for value in row]


@dataclass(frozen=True, slots=True)
class ChargeRow:
    """One charge of a batch (:meth:`Store.send_charges`): the rows :meth:`Store.insert_charge`,
    :meth:`Store.enqueue` and :meth:`Store.update_after_charge` write for it.

    ``epsilon_json``: pure ε per feature (JSON); ``units`` its total in micro-ε (``None``: no
    pure bound); ``gaze`` (start, end), Unix s; ``before``/``after``: the session's row before
    and after; ``caps``: the caps JSON to store with the session (``after.caps`` unless
    stricter ones are adopted); ``counters``: its counters after the charge."""

    session: str
    stream: str
    idx: int
    epsilon_json: str
    units: int | None
    events: Mapping[str, int]
    gaze: tuple[float, float]
    topic: str
    payload: bytes
    before: SessionRow
    after: SessionRow
    caps: str
    counters: Counters


class Store:
    """SQL statements inside one open transaction ``sql``.

    Args:
        sql: the open transaction.
        lock_clause: appended to the session-row ``SELECT`` by writers (PostgreSQL
            ``FOR UPDATE``; SQLite holds the database lock already).
        arrays: batches (:meth:`rows`) pass one array per column (PostgreSQL), not ``VALUES``.
    """

    def __init__(self, sql: Sql, lock_clause: str = "", *, arrays: bool = False) -> None:
        self.sql = sql
        self.lock_clause = lock_clause
        self.arrays = arrays

    # ---- sessions -------------------------------------------------------------------------
    def session(self, session: str, *, lock: bool = False) -> SessionRow | None:
        """The session's row (locked for this transaction with ``lock``), or ``None``.

        The row carries the session's event counts and counters, read by the same statement
        (no other read per charge)."""
        row = self.sql.one(
            "SELECT caps, version, chunks, withheld, refused, spent, pure_finite, max_chunk, "  # noqa: S608 - fixed names; the lock clause is the backend's constant
            f"last_chunk, last_gaze_end, counts, {', '.join(COUNTER_COLUMNS)} FROM sessions "
            "WHERE session = ?" + (self.lock_clause if lock else ""),
            (session,),
        )
        if row is None:
            return None
        return SessionRow(
            str(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4]), int(row[5]),
            bool(row[6]), int(row[7]), None if row[8] is None else int(row[8]),
            None if row[9] is None else float(row[9]), _counts_of(row[10]),
            _counters_of(row[11:]),
        )  # fmt: skip

    def create_session(self, session: str, caps: str, now: float) -> None:
        """Insert the session, its counters empty (a concurrent insert by another writer is
        not an error)."""
        self.sql.run(
            "INSERT INTO sessions (session, caps, created) VALUES (?, ?, ?) "
            "ON CONFLICT (session) DO NOTHING",
            (session, caps, now),
        )

    def set_caps(self, session: str, caps: str) -> None:
        """Store new (stricter) caps."""
        self.sql.run("UPDATE sessions SET caps = ? WHERE session = ?", (caps, session))

    def sessions(self) -> list[str]:
        """All sessions, oldest first."""
        return [
            r[0] for r in self.sql.all("SELECT session FROM sessions ORDER BY created, session")
        ]

    def rows(
        self, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[object]]
    ) -> Iterator[tuple[str, list[object]]]:
        """``rows`` as relations to select from: ``(sql, params)`` per statement to run, the
        ``sql`` a parenthesised subquery whose columns are named as ``columns`` (name, SQL
        type). With :attr:`arrays` (PostgreSQL) one relation of every row, ``unnest`` of one
        array parameter per column: a statement whose text does not grow with the rows (parsed
        and planned once, prepared after a few uses); otherwise (SQLite) a ``VALUES`` list of
        at most :data:`BATCH_ROWS` rows (:data:`BATCH_PARAMS` parameters) each."""
        names = ", ".join(name for name, _ in columns)
        if self.arrays:
            # (``%b``: psycopg's binary parameter, which the backend leaves as it is: arrays of
            # payloads are sent as they are, not escaped into text)
            arrays = ", ".join(f"CAST(%b AS {kind}[])" for _, kind in columns)
            yield (
                f"(SELECT * FROM unnest({arrays}) AS u ({names}))",  # noqa: S608 - fixed names
                [list(column) for column in zip(*rows, strict=True)],
            )
            return
        renamed = ", ".join(f"column{k + 1} AS {name}" for k, (name, _) in enumerate(columns))
        row = "(" + ", ".join("?" * len(columns)) + ")"
        for part in _batches(rows, len(columns)):
            yield (
                f"(SELECT {renamed} FROM (VALUES {_values(len(part), row)}) AS t)",  # noqa: S608
                _flat(part),
            )

    def sessions_many(
        self, sessions: Sequence[str], *, lock: bool = False
    ) -> dict[str, SessionRow]:
        """The rows of ``sessions`` that exist (locked for this transaction with ``lock``, in
        session order, so that two writers locking overlapping sets cannot deadlock on them);
        one statement (SQLite: per :data:`BATCH_ROWS` sessions)."""
        out: dict[str, SessionRow] = {}
        texts = _BatchTexts()
        for rel, params in self.rows(
            [("k_session", "TEXT")], [(n,) for n in sorted(set(sessions))]
        ):
            rows = self.sql.all(
                "SELECT session, caps, version, chunks, withheld, refused, spent, pure_finite, "  # noqa: S608 - fixed names and placeholders
                f"max_chunk, last_chunk, last_gaze_end, counts, {', '.join(COUNTER_COLUMNS)} "
                f"FROM sessions WHERE session IN (SELECT k_session FROM {rel} AS k) "
                "ORDER BY session" + (self.lock_clause if lock else ""),
                params,
            )
            for row in rows:
                out[str(row[0])] = SessionRow(
                    str(row[1]), int(row[2]), int(row[3]), int(row[4]), int(row[5]),
                    int(row[6]), bool(row[7]), int(row[8]),
                    None if row[9] is None else int(row[9]),
                    None if row[10] is None else float(row[10]), texts.parse(row[11]),
                    _counters_of(row[12:], texts),
                )  # fmt: skip
        return out

    def create_sessions(self, sessions: Sequence[str], caps: str, now: float) -> set[str]:
        """Insert the sessions missing (as :meth:`create_session`); the ones this statement
        inserted (not those another writer did meanwhile)."""
        created: set[str] = set()
        for rel, params in self.rows(
            [("k_session", "TEXT")], [(n,) for n in sorted(set(sessions))]
        ):
            rows = self.sql.all(
                "INSERT INTO sessions (session, caps, created) SELECT k_session, ?, ? "  # noqa: S608 - fixed names and placeholders
                f"FROM {rel} AS k WHERE true ON CONFLICT (session) DO NOTHING RETURNING session",
                [caps, now, *params],
            )
            created.update(str(r[0]) for r in rows)
        return created

    def delete_sessions(self, sessions: Sequence[str]) -> None:
        """Delete session rows that hold nothing (created by this transaction for releases
        that were all refused: as if the transaction had never seen them)."""
        for rel, params in self.rows(
            [("k_session", "TEXT")], [(n,) for n in sorted(set(sessions))]
        ):
            self.sql.run(
                f"DELETE FROM sessions WHERE session IN (SELECT k_session FROM {rel} AS k)",  # noqa: S608
                params,
            )

    def done_many(self, keys: Sequence[ReleaseKey]) -> dict[ReleaseKey, str]:
        """Of these releases, those charged (``"charged"``) or withheld (``"withheld"``) before;
        one statement (a join on the primary keys; SQLite: per :data:`BATCH_ROWS` keys)."""
        out: dict[ReleaseKey, str] = {}
        columns = [("k_session", "TEXT"), ("k_stream", "TEXT"), ("k_idx", "BIGINT")]
        for rel, params in self.rows(columns, sorted(set(keys))):
            rows = self.sql.all(
                f"SELECT c.session, c.stream, c.idx, 'charged' FROM charges c JOIN {rel} AS k "  # noqa: S608 - fixed names and placeholders
                "ON c.session = k.k_session AND c.stream = k.k_stream AND c.idx = k.k_idx "
                f"UNION ALL SELECT w.session, w.stream, w.idx, 'withheld' FROM withheld w "
                f"JOIN {rel} AS k ON w.session = k.k_session AND w.stream = k.k_stream "
                "AND w.idx = k.k_idx",
                [*params, *params],
            )
            for session, stream, idx, what in rows:
                key = (str(session), str(stream), int(idx))
                if out.get(key) != "charged":
                    out[key] = str(what)
        return out

    def send_charges(self, charges: Sequence[ChargeRow], now: float) -> Callable[[], list[int]]:
        """Write a batch of charges (each of a different session, all checked): their charge
        rows, their events, their outbox items and their sessions' rows, a statement per table
        (:meth:`rows`), sent with :meth:`Sql.send`: inside the caller's :meth:`Sql.pipeline`
        the server writes them while the caller goes on. Returns a function that gives the
        outbox ids, in order (allocated in that order), once the statements have run."""
        if not charges:
            return list
        if len({c.session for c in charges}) != len(charges):
            raise LedgerError("a batch of charges holds one session twice")
        ids = self.event_ids(sorted({k for c in charges for k in c.events}))  # (before any send)
        key = [("v_session", "TEXT"), ("v_stream", "TEXT"), ("v_idx", "BIGINT")]
        columns = [
            *key, ("v_total", "BIGINT"), ("v_epsilon", "TEXT"),
            ("v_gaze_start", "DOUBLE PRECISION"), ("v_gaze_end", "DOUBLE PRECISION"),
        ]  # fmt: skip
        rows = [
            (c.session, c.stream, c.idx, c.units, c.epsilon_json, c.gaze[0], c.gaze[1])
            for c in charges
        ]
        for rel, params in self.rows(columns, rows):
            self.sql.send(
                "INSERT INTO charges (session, stream, idx, total, epsilon, gaze_start, "  # noqa: S608 - fixed names and placeholders
                "gaze_end, created) SELECT v_session, v_stream, v_idx, v_total, v_epsilon, "
                f"v_gaze_start, v_gaze_end, ? FROM {rel} AS v",
                [now, *params],
            )
        events = [
            (c.session, c.stream, c.idx, ids[k], int(c.events[k]))
            for c in charges
            for k in sorted(c.events)
        ]
        for rel, params in self.rows([*key, ("v_event", "BIGINT"), ("v_count", "BIGINT")], events):
            self.sql.send(
                "INSERT INTO charge_events (session, stream, idx, event_id, count) "  # noqa: S608
                f"SELECT v_session, v_stream, v_idx, v_event, v_count FROM {rel} AS v",
                params,
            )
        items = [(c.session, c.stream, c.idx, c.topic, c.payload) for c in charges]
        inserted = [
            self.sql.send(
                "INSERT INTO outbox (session, stream, idx, topic, payload, created, state) "  # noqa: S608
                f"SELECT v_session, v_stream, v_idx, v_topic, v_payload, ?, 'pending' FROM {rel} "
                "AS v RETURNING id, session, stream, idx",
                [now, *params],
            )
            for rel, params in self.rows([*key, ("v_topic", "TEXT"), ("v_payload", "BYTEA")], items)
        ]
        texts = _BatchTexts()
        updates = [
            (
                c.session, c.after.chunks - c.before.chunks, c.after.spent_units,
                c.after.pure_finite, c.after.max_units, c.after.last_chunk,
                c.after.last_gaze_end, texts.dump(c.after.counts), c.counters.gaze_lo,
                c.counters.wall_lo, texts.dump(c.counters.gaze), texts.dump(c.counters.wall),
                c.counters.gaze_first, c.counters.wall_first, c.caps,
            )
            for c in charges
        ]  # fmt: skip
        columns = [
            ("v_session", "TEXT"), ("v_chunks", "BIGINT"), ("v_spent", "BIGINT"),
            ("v_pure", "BOOLEAN"), ("v_max", "BIGINT"), ("v_last", "BIGINT"),
            ("v_gaze_end", "DOUBLE PRECISION"), ("v_counts", "TEXT"),
            ("v_gaze_lo", "DOUBLE PRECISION"), ("v_wall_lo", "DOUBLE PRECISION"),
            ("v_gaze_counts", "TEXT"), ("v_wall_counts", "TEXT"),
            ("v_gaze_first", "DOUBLE PRECISION"), ("v_wall_first", "DOUBLE PRECISION"),
            ("v_caps", "TEXT"),
        ]  # fmt: skip
        for rel, params in self.rows(columns, updates):
            # one pending item each (relative: another connection may deliver meanwhile)
            self.sql.send(
                "UPDATE sessions SET version = version + 1, chunks = chunks + v_chunks, "  # noqa: S608 - fixed names and placeholders
                "spent = v_spent, pure_finite = v_pure, max_chunk = v_max, last_chunk = v_last, "
                "last_gaze_end = v_gaze_end, counts = v_counts, gaze_lo = v_gaze_lo, "
                "wall_lo = v_wall_lo, gaze_counts = v_gaze_counts, wall_counts = v_wall_counts, "
                "pending = pending + 1, gaze_first = v_gaze_first, wall_first = v_wall_first, "
                f"caps = v_caps FROM {rel} AS v WHERE session = v_session",
                params,
            )

        def outbox_ids() -> list[int]:
            outbox = {
                (str(session), str(stream), int(idx)): int(oid)
                for rows_of in inserted
                for oid, session, stream, idx in rows_of()
            }
            return [outbox[c.session, c.stream, c.idx] for c in charges]

        return outbox_ids

    # ---- events ---------------------------------------------------------------------------
    def event_ids(self, keys: list[str]) -> dict[str, int]:
        """Ids of event keys, inserting new ones."""
        out: dict[str, int] = {}
        for key in keys:
            row = self.sql.one("SELECT id FROM events WHERE key = ?", (key,))
            if row is None:
                self.sql.run(
                    "INSERT INTO events (key) VALUES (?) ON CONFLICT (key) DO NOTHING", (key,)
                )
                row = self.sql.one("SELECT id FROM events WHERE key = ?", (key,))
            assert row is not None
            out[key] = int(row[0])
        return out

    def gaze_between(self, session: str, start: float | None, end: float | None) -> dict[str, int]:
        """Event counts of the session's charges whose gaze ends in ``(start, end]`` (Unix s;
        ``None``: unbounded on that side). Reads those charges only (index on gaze end)."""
        return self.events_between(session, [("gaze", start, end)])[0][0]

    def wall_between(self, session: str, start: float | None, end: float | None) -> dict[str, int]:
        """Event counts of the session's charges made in ``(start, end]`` (Unix s, wall clock;
        ``None``: unbounded on that side). Reads those charges only (index on charge time)."""
        return self.events_between(session, [("wall", start, end)])[0][0]

    def events_between(
        self,
        session: str,
        ranges: Sequence[tuple[Clock, float | None, float | None]],
        *,
        firsts: bool = False,
    ) -> list[tuple[dict[str, int], float | None]]:
        """Per ``(clock, start, end)``: the event counts of the session's charges whose gaze
        ends (``"gaze"``) or that were made (``"wall"``) in ``(start, end]`` (Unix s; ``None``:
        unbounded on that side); and, with ``firsts``, the earliest such time of its charges
        after ``end`` (those a window starting at ``end`` keeps), or in the range if ``end`` is
        ``None`` (``None``: no such charge, and always without ``firsts``). One statement."""
        parts: list[str] = []
        params: list[object] = []
        for n, (clock, start, end) in enumerate(ranges):
            column = "gaze_end" if clock == "gaze" else "created"
            after = "" if start is None else f" AND c.{column} > ?"
            params += [session] + ([] if start is None else [start])
            if end is not None:
                params.append(end)
            # CROSS JOIN: SQLite then reads the range of ``charges`` first (its index on the
            # column), not every ``charge_events`` row of the session (its guess without
            # ANALYZE); PostgreSQL plans it as the inner join it is.
            parts.append(
                f"SELECT {n}, e.key, SUM(ce.count), NULL FROM charges c "  # noqa: S608 - fixed names
                "CROSS JOIN charge_events ce CROSS JOIN events e WHERE ce.session = c.session "
                "AND ce.stream = c.stream AND ce.idx = c.idx AND e.id = ce.event_id "
                f"AND c.session = ?{after}{'' if end is None else f' AND c.{column} <= ?'} "
                "GROUP BY e.key"
            )
            if firsts:  # (an index on (session, column) answers it)
                bound = start if end is None else end
                parts.append(
                    f"SELECT {n}, NULL, NULL, MIN(c.{column}) FROM charges c "  # noqa: S608
                    f"WHERE c.session = ?{'' if bound is None else f' AND c.{column} > ?'}"
                )
                params += [session] + ([] if bound is None else [bound])
        out: list[tuple[dict[str, int], float | None]] = [({}, None) for _ in ranges]
        for n, key, count, first in self.sql.all(" UNION ALL ".join(parts), params):
            if key is not None:
                out[int(n)][0][str(key)] = int(count)
            elif first is not None:
                out[int(n)] = (out[int(n)][0], float(first))
        return out

    def gaze_ends(self, session: str, start: float, end: float) -> list[float]:
        """Gaze end times of the session's charges in ``[start, end)``."""
        rows = self.sql.all(
            "SELECT DISTINCT gaze_end FROM charges WHERE session = ? AND gaze_end >= ? "
            "AND gaze_end < ?",
            (session, start, end),
        )
        return [float(r[0]) for r in rows]

    # ---- charges --------------------------------------------------------------------------
    def charged_or_withheld(self, session: str, stream: str, idx: int) -> str | None:
        """``"charged"``, ``"withheld"`` or ``None`` for a release index."""
        found = {
            str(r[0])
            for r in self.sql.all(
                "SELECT 'charged' FROM charges WHERE session = ? AND stream = ? AND idx = ? "
                "UNION ALL SELECT 'withheld' FROM withheld WHERE session = ? AND stream = ? "
                "AND idx = ?",
                (session, stream, idx) * 2,
            )
        }
        return "charged" if "charged" in found else "withheld" if found else None

    def insert_charge(
        self,
        session: str,
        stream: str,
        idx: int,
        *,
        epsilon_json: str,
        units: int | None,
        events: Mapping[str, int],
        gaze: tuple[float, float],
        now: float,
    ) -> None:
        """One charge row with its events (the session's event counts are the row's,
        written by :meth:`update_after_charge`).

        ``epsilon_json``: pure ε per feature, ``json.dumps`` of a dict; ``units`` its total in
        micro-ε; ``gaze`` (start, end) and ``now``: Unix s."""
        self.sql.run(
            "INSERT INTO charges (session, stream, idx, total, epsilon, gaze_start, gaze_end, "
            "created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (session, stream, idx, units, epsilon_json, gaze[0], gaze[1], now),
        )
        for key in sorted(events):
            n = int(events[key])
            # the event's id is looked up inside the INSERT (one statement per known key); a
            # key new to the ledger is inserted into ``events`` first
            for attempt in range(2):
                if self.sql.run(
                    "INSERT INTO charge_events (session, stream, idx, event_id, count) "
                    "SELECT ?, ?, ?, id, ? FROM events WHERE key = ?",
                    (session, stream, idx, n, key),
                ):
                    break
                if attempt:
                    raise LedgerError(f"event {key!r} has no id after inserting it")
                self.event_ids([key])

    def update_after_charge(
        self,
        session: str,
        row: SessionRow,
        *,
        units: int | None,
        idx: int,
        stream: str,
        gaze_end: float,
        counts: Mapping[str, int],
        counters: Counters,
        pending_added: int,
    ) -> SessionRow:
        """Counts, spend, last index and gaze time, version + 1; the session's event counts
        ``counts`` (its row's with this charge's events added), the window counters and bounds
        from ``counters``, and ``pending_added`` added to its pending count (relative: an outbox
        item may be delivered by another connection meanwhile, which decrements the stored
        count). One statement; returns the row as written (``row``: the session's row, locked
        by this transaction)."""
        after = after_charge(
            row, units=units, idx=idx, stream=stream, gaze_end=gaze_end, counts=counts
        )
        self.sql.run(
            "UPDATE sessions SET version = version + 1, chunks = chunks + ?, spent = ?, "
            "pure_finite = ?, max_chunk = ?, last_chunk = ?, last_gaze_end = ?, counts = ?, "
            "gaze_lo = ?, wall_lo = ?, gaze_counts = ?, wall_counts = ?, pending = pending + ?, "
            "gaze_first = ?, wall_first = ? WHERE session = ?",
            (
                after.chunks - row.chunks, after.spent_units, after.pure_finite, after.max_units,
                after.last_chunk, after.last_gaze_end, _counts_json(after.counts),
                counters.gaze_lo, counters.wall_lo,
                _counts_json(counters.gaze), _counts_json(counters.wall), pending_added,
                counters.gaze_first, counters.wall_first, session,
            ),
        )  # fmt: skip
        return after

    def history(self, session: str, stream: str = "chunks") -> list[tuple[Any, ...]]:
        """``(idx, total units | None, epsilon JSON, gaze_start, gaze_end, created)`` in order."""
        return self.sql.all(
            "SELECT idx, total, epsilon, gaze_start, gaze_end, created FROM charges "
            "WHERE session = ? AND stream = ? ORDER BY idx",
            (session, stream),
        )

    def last_index(self, session: str, stream: str) -> int | None:
        """Highest index charged or withheld in ``stream``, or ``None``."""
        row = self.sql.one(
            "SELECT MAX(i) FROM (SELECT MAX(idx) AS i FROM charges WHERE session = ? "
            "AND stream = ? UNION ALL SELECT MAX(idx) FROM withheld WHERE session = ? "
            "AND stream = ?) AS m",
            (session, stream, session, stream),
        )
        return None if row is None or row[0] is None else int(row[0])

    # ---- withheld -------------------------------------------------------------------------
    def withhold(
        self, session: str, stream: str, idx: int, *, units: int, reason: str, now: float
    ) -> bool:
        """Record a withheld release; ``False`` if it was recorded before."""
        added = self.sql.run(
            "INSERT INTO withheld (session, stream, idx, requested, reason, created) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session, stream, idx) DO NOTHING",
            (session, stream, idx, units, reason, now),
        )
        if added:
            self.sql.run(
                "UPDATE sessions SET withheld = withheld + 1 WHERE session = ?", (session,)
            )
        return bool(added)

    def withheld(self, session: str, stream: str = "chunks") -> list[tuple[Any, ...]]:
        """``(idx, requested units, reason)`` in order."""
        return self.sql.all(
            "SELECT idx, requested, reason FROM withheld WHERE session = ? AND stream = ? "
            "ORDER BY idx",
            (session, stream),
        )

    # ---- outbox ---------------------------------------------------------------------------
    def enqueue(
        self, session: str, stream: str, idx: int, *, topic: str, payload: bytes, now: float
    ) -> int:
        """Append a charged payload; returns its outbox id."""
        row = self.sql.one(
            "INSERT INTO outbox (session, stream, idx, topic, payload, created, state) "
            "VALUES (?, ?, ?, ?, ?, ?, 'pending') RETURNING id",
            (session, stream, idx, topic, payload, now),
        )
        assert row is not None
        return int(row[0])

    def pending(self, limit: int | None, session: str | None) -> list[tuple[Any, ...]]:
        """``(id, session, stream, idx, topic, payload, created)`` of pending items, in order."""
        query = (
            "SELECT id, session, stream, idx, topic, payload, created FROM outbox "
            "WHERE state = 'pending'"
        )
        params: list[object] = []
        if session is not None:
            query += " AND session = ?"
            params.append(session)
        query += " ORDER BY id"
        if limit is not None:
            query += " LIMIT ?"
            params.append(int(limit))
        return self.sql.all(query, params)

    def outbox_backlog(self) -> tuple[int, float | None]:
        """Pending outbox items of every session, and the ``created`` time (Unix s) of the
        oldest, ``None`` when there is none."""
        row = self.sql.one("SELECT COUNT(*), MIN(created) FROM outbox WHERE state = 'pending'")
        assert row is not None
        return int(row[0]), None if row[1] is None else float(row[1])

    def pending_count(self, session: str) -> int:
        """Number of the session's pending outbox items."""
        row = self.sql.one(
            "SELECT COUNT(*) FROM outbox WHERE session = ? AND state = 'pending'", (session,)
        )
        assert row is not None
        return int(row[0])

    def lock_sessions(self, sessions: Sequence[str]) -> None:
        """Lock the rows of ``sessions`` for this transaction (PostgreSQL), in session order:
        every writer of several sessions locks them so, before any other row, so two writers
        of overlapping sessions cannot deadlock. (SQLite holds the database lock already.)"""
        if not self.lock_clause:
            return
        for rel, params in self.rows(
            [("k_session", "TEXT")], [(n,) for n in sorted(set(sessions))]
        ):
            self.sql.all(
                "SELECT session FROM sessions WHERE session IN (SELECT k_session FROM "  # noqa: S608 - fixed names; the lock clause is the backend's constant
                f"{rel} AS k) ORDER BY session{self.lock_clause}",
                params,
            )

    def mark_delivered_many(self, outbox_ids: Sequence[int], now: float) -> int:
        """Each pending item of ``outbox_ids``: pending → delivered, payload dropped, its
        session's pending counter decremented (its session's row locked first,
        :meth:`lock_sessions`); a statement per table whatever their number. Returns how many
        were pending."""
        ids = [(i,) for i in sorted(set(outbox_ids))]
        sessions: set[str] = set()
        for rel, params in self.rows([("k_id", "BIGINT")], ids):
            sessions.update(
                str(row[0])
                for row in self.sql.all(
                    "SELECT DISTINCT session FROM outbox WHERE id IN (SELECT k_id FROM "  # noqa: S608 - fixed names
                    f"{rel} AS k) AND state = 'pending'",
                    params,
                )
            )
        if not sessions:
            return 0
        self.lock_sessions(sorted(sessions))
        marked: dict[str, int] = {}
        for rel, params in self.rows([("k_id", "BIGINT")], ids):
            for (session,) in self.sql.all(
                "UPDATE outbox SET state = 'delivered', delivered = ?, payload = NULL WHERE id IN "  # noqa: S608 - fixed names
                f"(SELECT k_id FROM {rel} AS k) AND state = 'pending' RETURNING session",
                [now, *params],
            ):
                marked[str(session)] = marked.get(str(session), 0) + 1
        if not marked:
            return 0
        for rel, params in self.rows(
            [("v_session", "TEXT"), ("v_n", "BIGINT")], sorted(marked.items())
        ):
            self.sql.run(
                "UPDATE sessions SET pending = pending - v_n FROM "  # noqa: S608 - fixed names
                f"{rel} AS v WHERE session = v_session",
                params,
            )
        return sum(marked.values())

    def mark_refused(self, outbox_id: int, reason: str, now: float) -> str | None:
        """Pending → refused (payload kept; its session's row locked first,
        :meth:`lock_sessions`); returns the item's session, or ``None`` if it was not
        pending."""
        row = self.sql.one(
            "SELECT session FROM outbox WHERE id = ? AND state = 'pending'", (outbox_id,)
        )
        if row is None:
            return None
        self.lock_sessions([str(row[0])])
        row = self.sql.one(
            "UPDATE outbox SET state = 'refused', delivered = ?, reason = ? "
            "WHERE id = ? AND state = 'pending' RETURNING session",
            (now, reason, outbox_id),
        )
        if row is None:
            return None
        self.sql.run(
            "UPDATE sessions SET refused = refused + 1, pending = pending - 1 WHERE session = ?",
            (row[0],),
        )
        return str(row[0])

    def refused(self, session: str | None) -> list[tuple[Any, ...]]:
        """``(id, session, stream, idx, topic, reason, refused_at)`` of refused items."""
        query = (
            "SELECT id, session, stream, idx, topic, reason, delivered FROM outbox "
            "WHERE state = 'refused'"
        )
        params: list[object] = []
        if session is not None:
            query += " AND session = ?"
            params.append(session)
        return self.sql.all(query + " ORDER BY id", params)

    # ---- counters -------------------------------------------------------------------------
    def counters(self, session: str) -> Counters | None:
        """The session's stored counters, or ``None`` (no row: an unknown session)."""
        row = self.sql.one(
            f"SELECT {', '.join(COUNTER_COLUMNS)} FROM sessions WHERE session = ?",  # noqa: S608 - fixed names
            (session,),
        )
        return None if row is None else _counters_of(row)

    def recount(self, session: str, gaze_lo: float | None, wall_lo: float | None) -> Counters:
        """What the session's counters with these bounds must hold, counted from its rows."""
        (gaze, gaze_first), (wall, wall_first) = self.events_between(
            session, [("gaze", gaze_lo, None), ("wall", wall_lo, None)], firsts=True
        )
        return Counters(
            gaze_lo, wall_lo, gaze, wall, self.pending_count(session), gaze_first, wall_first
        )

    def verify(self) -> list[str]:
        """Consistency problems (see :meth:`gazeguard.ledger.Ledger.verify`)."""
        problems: list[str] = []
        for s, spent, chunks, _max, wh, refused in self.sql.all(
            "SELECT session, spent, chunks, max_chunk, withheld, refused FROM sessions"
        ):
            row = self.sql.one(
                "SELECT COALESCE(SUM(total), 0), COUNT(*), COALESCE(MAX(total), 0) FROM charges "
                "WHERE session = ? AND stream = 'chunks'",
                (s,),
            )
            other = self.sql.one(
                "SELECT COALESCE(SUM(total), 0) FROM charges WHERE session = ? AND "
                "stream <> 'chunks'",
                (s,),
            )
            n_wh = self.sql.one("SELECT COUNT(*) FROM withheld WHERE session = ?", (s,))
            n_ref = self.sql.one(
                "SELECT COUNT(*) FROM outbox WHERE session = ? AND state = 'refused'", (s,)
            )
            assert row is not None
            assert other is not None
            assert n_wh is not None
            assert n_ref is not None
            got = (int(spent), int(chunks), int(wh), int(refused))
            want = (int(row[0]) + int(other[0]), int(row[1]), int(n_wh[0]), int(n_ref[0]))
            if got != want:
                problems.append(
                    f"session {s!r}: totals (spent, chunks, withheld, refused) = {got} but rows "
                    f"give {want}"
                )
            stored_row = self.session(s)
            assert stored_row is not None
            assert stored_row.counters is not None
            ((summed, _),) = self.events_between(s, [("gaze", None, None)])
            if stored_row.counts != summed:
                problems.append(
                    f"session {s!r}: event counts {stored_row.counts} but charges hold {summed}"
                )
            stored = stored_row.counters
            if stored != (recount := self.recount(s, stored.gaze_lo, stored.wall_lo)):
                problems.append(f"session {s!r}: counters {stored} but rows give {recount}")
        problems += [
            f"charge without outbox item: session {s!r} {st} {i}"
            for s, st, i in self.sql.all(
                "SELECT c.session, c.stream, c.idx FROM charges c LEFT JOIN outbox o "
                "ON o.session = c.session AND o.stream = c.stream AND o.idx = c.idx "
                "WHERE o.id IS NULL"
            )
        ]
        problems += [
            f"outbox item without charge: session {s!r} {st} {i}"
            for s, st, i in self.sql.all(
                "SELECT o.session, o.stream, o.idx FROM outbox o LEFT JOIN charges c "
                "ON o.session = c.session AND o.stream = c.stream AND o.idx = c.idx "
                "WHERE c.session IS NULL"
            )
        ]
        problems += [
            f"{what} without its {parent}: session {s!r} {st} {i}"
            for what, parent, query in _ORPHANS
            for s, st, i in self.sql.all(query)
        ]
        problems += [
            f"release both charged and withheld: session {s!r} {st} {i}"
            for s, st, i in self.sql.all(
                "SELECT w.session, w.stream, w.idx FROM withheld w JOIN charges c "
                "ON w.session = c.session AND w.stream = c.stream AND w.idx = c.idx"
            )
        ]
        return problems


#: Rows whose parent is missing, as (what, parent, query of their keys): the tables hold no
#: foreign keys (a charge's rows are written together in one transaction, and on PostgreSQL the
#: per-row checks of foreign keys took a third of a batch's insert time), so :meth:`Store.verify`
#: checks what they would have.
_ORPHANS = (
    ("charge", "session", "SELECT c.session, c.stream, c.idx FROM charges c LEFT JOIN sessions s "
     "ON s.session = c.session WHERE s.session IS NULL"),
    ("withheld release", "session", "SELECT w.session, w.stream, w.idx FROM withheld w LEFT JOIN "
     "sessions s ON s.session = w.session WHERE s.session IS NULL"),
    ("charge event", "charge", "SELECT e.session, e.stream, e.idx FROM charge_events e LEFT JOIN "
     "charges c ON c.session = e.session AND c.stream = e.stream AND c.idx = e.idx "
     "WHERE c.session IS NULL"),
    ("charge event", "event key", "SELECT e.session, e.stream, e.idx FROM charge_events e LEFT "
     "JOIN events k ON k.id = e.event_id WHERE k.id IS NULL"),
)  # fmt: skip

#: Indexes a charge's queries use, created on every open (a ledger written before they existed
#: gets them then; they hold no data of their own): a session's pending outbox items (for a
#: recount of them), and its charges by charge time (a charge reads those that leave the
#: trailing wall-clock window, to take them off the counters; gaze time: ``charges_gaze``).
INDEXES = (
    "CREATE INDEX IF NOT EXISTS outbox_session_pending ON outbox(session) WHERE state = 'pending'",
    "CREATE INDEX IF NOT EXISTS charges_created ON charges(session, created)",
)


def ensure_indexes(sql: Sql) -> None:
    """Create the :data:`INDEXES` that are missing."""
    for statement in INDEXES:
        sql.run(statement)
