"""The accounting: caps, w-event windows, charge + enqueue in one transaction, state, audit.

Written once against the :class:`~gazeguard.ledger.Sql` protocol; the backends only store.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Self

from gazeguard.config import LedgerSettings
from gazeguard.errors import BudgetExhaustedError, ConfigError
from gazeguard.ledger._model import (
    MAX_CAP,
    UNITS_PER_EPSILON,
    Charge,
    ChargeRecord,
    DuplicateChargeError,
    LedgerBackend,
    LedgerState,
    OutboxItem,
    Payload,
    Sql,
    Synchronous,
    eps_of,
    to_units_down,
    to_units_up,
)
from gazeguard.ledger._sqlite import SqliteBackend

log = logging.getLogger("gazeguard.ledger")


def is_url(location: object) -> bool:
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


@dataclass(frozen=True, slots=True)
class _Caps:
    """Caps in micro-ε (``w`` in chunks)."""

    session: int | None
    w: int | None
    w_cap: int | None

    def describe(self) -> str:
        s = "none" if self.session is None else f"{eps_of(self.session):g}"
        w = "none" if self.w is None else f"{eps_of(self.w_cap):g} over {self.w} chunks"
        return f"session_cap={s}, w-event cap={w}"


class Ledger:
    """The per-session ε ledger with its outbox (see the module docstring for the policies).

    Args:
        location: an SQLite file path, or a ``postgresql://`` URL (needs ``gazeguard[fleet]``).
        synchronous: SQLite durability (``FULL`` default); for PostgreSQL ``NORMAL`` turns
            ``synchronous_commit`` off.
        session_cap: ε cap per session, or ``None``.
        w_event: w of the w-event cap (chunks), or ``None``; set with ``w_event_cap``.
        w_event_cap: ε allowed over any w consecutive chunks, or ``None``.
        allow_cap_increase: accept caps looser than those recorded with a session (refills!).
        create: create a missing SQLite file (``False``: a missing file is a ConfigError).
        timeout_s: how long a writer waits for the lock, s.
    """

    def __init__(
        self,
        location: str | os.PathLike[str],
        synchronous: Synchronous = "FULL",
        session_cap: float | None = None,
        w_event: int | None = None,
        w_event_cap: float | None = None,
        *,
        allow_cap_increase: bool = False,
        create: bool = True,
        timeout_s: float = 30.0,
    ) -> None:
        if (w_event is None) != (w_event_cap is None):
            raise ConfigError(
                "ledger.w_event", (w_event, w_event_cap), "set w_event and w_event_cap together"
            )
        if w_event is not None and (isinstance(w_event, bool) or w_event < 1):
            raise ConfigError("ledger.w_event", w_event, "must be an integer >= 1 (chunks)")
        self._caps = _Caps(
            None if session_cap is None else to_units_down(session_cap, "ledger.session_cap"),
            w_event,
            None if w_event_cap is None else to_units_down(w_event_cap, "ledger.w_event_cap"),
        )
        self._allow_increase = allow_cap_increase
        self._backend: LedgerBackend
        if is_url(location):
            try:
                from gazeguard.ledger._postgres import PostgresBackend  # noqa: PLC0415 - optional extra
            except ImportError as exc:
                raise ConfigError(
                    "ledger.url",
                    "postgresql://…",
                    f"the PostgreSQL ledger needs psycopg 3 ({exc}): "
                    "pip install 'gazeguard[fleet]'",
                ) from exc
            self._backend = PostgresBackend(str(location), synchronous, timeout_s=timeout_s)
        else:
            self._backend = SqliteBackend(location, synchronous, create=create, timeout_s=timeout_s)

    @classmethod
    def open(cls, location: str | os.PathLike[str], **kwargs: Any) -> Ledger:
        """Open an SQLite file or a ``postgresql://`` URL (same arguments as the constructor)."""
        return cls(location, **kwargs)

    @classmethod
    def from_settings(cls, settings: LedgerSettings, **kwargs: Any) -> Ledger:
        """Open the ledger ``settings`` describe (``url`` when set, else ``path``)."""
        return cls(
            settings.url if settings.url is not None else settings.path,
            settings.synchronous,
            settings.session_cap,
            settings.w_event,
            settings.w_event_cap,
            **kwargs,
        )

    @property
    def backend(self) -> LedgerBackend:
        """The storage backend (``.kind`` is ``"sqlite"`` or ``"postgresql"``)."""
        return self._backend

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the database connection."""
        self._backend.close()

    # ---- writes -------------------------------------------------------------------------

    def charge(
        self,
        session: str,
        chunk_index: int,
        epsilon: Mapping[str, float],
        topic: str,
        payload: Payload,
    ) -> Charge:
        """Charge one chunk and enqueue its privatized payload, atomically and durably.

        Args:
            session: session identifier.
            chunk_index: the chunk number (>= 0); each is charged at most once.
            epsilon: ε per released feature (finite, > 0); the chunk costs their sum.
            topic: MQTT topic for the payload.
            payload: the bytes, or a callable that receives the post-charge
                :class:`LedgerState` inside the transaction and returns them (keep it fast: it
                runs under the write lock; if it raises, nothing is charged).

        Returns:
            The committed :class:`Charge`.

        Raises:
            BudgetExhaustedError: the chunk would exceed a cap; nothing was written.
            DuplicateChargeError: the chunk was charged or withheld before.
            ConfigError: bad ε, or the configured caps are looser than the recorded ones.
        """
        _check_chunk(session, chunk_index)
        if not epsilon:
            raise ConfigError("epsilon", dict(epsilon), "a chunk releases at least one feature")
        units = {str(k): to_units_up(v, f"epsilon[{k!r}]") for k, v in epsilon.items()}
        total = sum(units.values())
        detail = json.dumps({str(k): float(v) for k, v in epsilon.items()})
        with self._backend.write() as sql:
            now = time.time()
            caps, spent, chunks, max_chunk, last = self._lock_session(sql, session, now)
            _refuse_duplicate(sql, session, chunk_index)
            if caps.session is not None and spent + total > caps.session:
                raise BudgetExhaustedError(
                    session, eps_of(total) or 0.0, eps_of(caps.session - spent) or 0.0, "session"
                )
            if caps.w is not None and caps.w_cap is not None:
                used = _max_window(sql, session, chunk_index, caps.w)
                if used + total > caps.w_cap:
                    raise BudgetExhaustedError(
                        session, eps_of(total) or 0.0, eps_of(caps.w_cap - used) or 0.0, "w-event"
                    )
            sql.run(
                "INSERT INTO charges (session, chunk_index, total, epsilon, created) "
                "VALUES (?, ?, ?, ?, ?)",
                (session, chunk_index, total, detail, now),
            )
            sql.run(
                "UPDATE sessions SET spent = ?, chunks = ?, max_chunk = ?, last_chunk = ? "
                "WHERE session = ?",
                (
                    spent + total,
                    chunks + 1,
                    max(max_chunk, total),
                    chunk_index if last is None else max(last, chunk_index),
                    session,
                ),
            )
            state = _read_state(sql, session)
            state = replace(state, pending=state.pending + 1)
            body = payload(state) if callable(payload) else payload
            if not isinstance(body, bytes | bytearray | memoryview):
                msg = f"payload must be bytes, got {type(body).__name__}"
                raise TypeError(msg)
            row = sql.one(
                "INSERT INTO outbox (session, chunk_index, topic, payload, created) "
                "VALUES (?, ?, ?, ?, ?) RETURNING id",
                (session, chunk_index, topic, bytes(body), now),
            )
            assert row is not None
        return Charge(session, chunk_index, total / UNITS_PER_EPSILON, state, int(row[0]))

    def withhold(
        self, session: str, chunk_index: int, requested: float | Mapping[str, float], reason: str
    ) -> LedgerState:
        """Record that a chunk was withheld (refused by a cap, or dropped on an error).

        Nothing is charged and nothing is enqueued; ``state().withheld`` counts it. Recording
        the same chunk twice counts it once.

        Args:
            session: session identifier.
            chunk_index: the chunk number.
            requested: ε the chunk would have cost (a number, or ε per feature).
            reason: one line for status and ``gazeguard ledger show``.

        Raises:
            DuplicateChargeError: the chunk was charged (it cannot also be withheld).
        """
        _check_chunk(session, chunk_index)
        asked = sum(requested.values()) if isinstance(requested, Mapping) else float(requested)
        units = 0 if asked == 0 else to_units_up(asked, "requested", MAX_CAP)
        with self._backend.write() as sql:
            now = time.time()
            self._lock_session(sql, session, now)
            if sql.one(
                "SELECT 1 FROM charges WHERE session = ? AND chunk_index = ?",
                (session, chunk_index),
            ):
                raise DuplicateChargeError(session, chunk_index, "charged")
            added = sql.run(
                "INSERT INTO withheld (session, chunk_index, requested, reason, created) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (session, chunk_index) DO NOTHING",
                (session, chunk_index, units, reason, now),
            )
            if added:
                sql.run("UPDATE sessions SET withheld = withheld + 1 WHERE session = ?", (session,))
            return _read_state(sql, session)

    def open_session(self, session: str) -> LedgerState:
        """Register a session with the configured caps, or check them against the recorded ones.

        Call it when a session starts, so that a configuration looser than the caps recorded
        with the session is refused (ConfigError) before any work, not at its first charge.
        """
        _check_chunk(session, 0)
        with self._backend.write() as sql:
            self._lock_session(sql, session, time.time())
            return _read_state(sql, session)

    def mark_delivered(self, outbox_id: int) -> bool:
        """Mark an outbox item delivered (after the broker's PUBACK) and drop its payload.

        Returns:
            ``True`` if the item was pending, ``False`` if unknown or already delivered.
        """
        with self._backend.write() as sql:
            changed = sql.run(
                "UPDATE outbox SET delivered = ?, payload = NULL "
                "WHERE id = ? AND delivered IS NULL",
                (time.time(), int(outbox_id)),
            )
        return changed > 0

    def _lock_session(self, sql: Sql, session: str, now: float) -> tuple[_Caps, int, int, int, Any]:
        """Create the session if new, lock its row, reconcile caps; return its account."""
        c = self._caps
        sql.run(
            "INSERT INTO sessions (session, session_cap, w_event, w_event_cap, created) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (session) DO NOTHING",
            (session, c.session, c.w, c.w_cap, now),
        )
        row = sql.one(
            "SELECT session_cap, w_event, w_event_cap, spent, chunks, max_chunk, last_chunk "
            "FROM sessions WHERE session = ?" + self._backend.lock_clause,
            (session,),
        )
        assert row is not None
        stored = _Caps(row[0], row[1], row[2])
        caps = self._reconcile(session, stored)
        if caps != stored:
            sql.run(
                "UPDATE sessions SET session_cap = ?, w_event = ?, w_event_cap = ? "
                "WHERE session = ?",
                (caps.session, caps.w, caps.w_cap, session),
            )
        return caps, int(row[3]), int(row[4]), int(row[5]), row[6]

    def _reconcile(self, session: str, stored: _Caps) -> _Caps:
        """The caps that bind from now on: stricter configured caps win; looser are refused."""
        want = self._caps
        if want == stored:
            return stored
        session_ok = stored.session is None or (
            want.session is not None and want.session <= stored.session
        )
        window_ok = stored.w is None or (
            want.w is not None
            and want.w_cap is not None
            and stored.w_cap is not None
            and want.w >= stored.w
            and want.w_cap <= stored.w_cap
        )
        new = _Caps(
            want.session if session_ok else stored.session,
            want.w if window_ok else stored.w,
            want.w_cap if window_ok else stored.w_cap,
        )
        if session_ok and window_ok:
            return new
        if self._allow_increase:
            log.warning(
                "ledger %s: session %r: caps raised from (%s) to (%s) by allow_cap_increase; "
                "spent ε is kept",
                self._backend.location,
                session,
                stored.describe(),
                want.describe(),
            )
            return want
        field, value = (
            ("ledger.session_cap", eps_of(want.session))
            if not session_ok
            else ("ledger.w_event_cap", (want.w, eps_of(want.w_cap)))
        )
        raise ConfigError(
            field,
            value,
            f"session {session!r} is recorded in {self._backend.location} with "
            f"{stored.describe()}; a looser cap would refill its budget. Configure caps at "
            "least as strict, use a new session id, or open the ledger with "
            "allow_cap_increase=True to raise them deliberately",
        )

    # ---- reads --------------------------------------------------------------------------

    def state(self, session: str) -> LedgerState:
        """The session's account; an unknown session reads as empty with the configured caps."""
        with self._backend.read() as sql:
            if sql.one("SELECT 1 FROM sessions WHERE session = ?", (session,)) is None:
                c = self._caps
                return LedgerState(
                    session, 0.0, eps_of(c.session), 0, 0, 0.0, None, 0,
                    eps_of(c.session), c.w, eps_of(c.w_cap),
                    None if c.w is None else 0.0, eps_of(c.w_cap),
                )  # fmt: skip
            return _read_state(sql, session)

    def pending(self, limit: int | None = None, session: str | None = None) -> list[OutboxItem]:
        """Undelivered payloads in outbox order (optionally of one session, at most ``limit``)."""
        query = "SELECT id, session, chunk_index, topic, payload, created FROM outbox "
        query += "WHERE delivered IS NULL" + (" AND session = ?" if session is not None else "")
        query += " ORDER BY id" + (" LIMIT ?" if limit is not None else "")
        params: list[object] = [] if session is None else [session]
        if limit is not None:
            params.append(int(limit))
        with self._backend.read() as sql:
            rows = sql.all(query, params)
        return [OutboxItem(int(r[0]), r[1], int(r[2]), r[3], bytes(r[4]), r[5]) for r in rows]

    def sessions(self) -> list[str]:
        """All sessions the ledger has seen, oldest first."""
        with self._backend.read() as sql:
            return [r[0] for r in sql.all("SELECT session FROM sessions ORDER BY created, session")]

    def charges(self, session: str) -> list[ChargeRecord]:
        """The session's charge history in chunk order."""
        with self._backend.read() as sql:
            rows = sql.all(
                "SELECT chunk_index, total, epsilon, created FROM charges WHERE session = ? "
                "ORDER BY chunk_index",
                (session,),
            )
        return [
            ChargeRecord(int(r[0]), int(r[1]) / UNITS_PER_EPSILON, json.loads(r[2]), r[3])
            for r in rows
        ]

    def withheld(self, session: str) -> list[tuple[int, float, str]]:
        """The session's withheld chunks: (chunk index, requested ε, reason), in chunk order."""
        with self._backend.read() as sql:
            rows = sql.all(
                "SELECT chunk_index, requested, reason FROM withheld WHERE session = ? "
                "ORDER BY chunk_index",
                (session,),
            )
        return [(int(r[0]), int(r[1]) / UNITS_PER_EPSILON, r[2]) for r in rows]

    def verify(self) -> list[str]:
        """Audit the ledger: the problems found (an empty list means consistent).

        Checks that each session's spent/chunks/max/withheld match its rows, that every charge
        has exactly one outbox item and every outbox item a charge, and that no chunk is both
        charged and withheld.
        """
        problems: list[str] = []
        with self._backend.read() as sql:
            for s, spent, chunks, mx, wh in sql.all(
                "SELECT session, spent, chunks, max_chunk, withheld FROM sessions"
            ):
                row = sql.one(
                    "SELECT COALESCE(SUM(total), 0), COUNT(*), COALESCE(MAX(total), 0) "
                    "FROM charges WHERE session = ?",
                    (s,),
                )
                assert row is not None
                n_wh = sql.one("SELECT COUNT(*) FROM withheld WHERE session = ?", (s,))
                assert n_wh is not None
                if (int(spent), int(chunks), int(mx), int(wh)) != (
                    int(row[0]), int(row[1]), int(row[2]), int(n_wh[0]),
                ):  # fmt: skip
                    problems.append(
                        f"session {s!r}: totals (spent, chunks, max, withheld) = "
                        f"{(spent, chunks, mx, wh)} but rows give "
                        f"{(int(row[0]), int(row[1]), int(row[2]), int(n_wh[0]))}"
                    )
            problems += [
                f"charge without outbox item: session {s!r} chunk {i}"
                for s, i in sql.all(
                    "SELECT c.session, c.chunk_index FROM charges c LEFT JOIN outbox o "
                    "ON o.session = c.session AND o.chunk_index = c.chunk_index WHERE o.id IS NULL"
                )
            ]
            problems += [
                f"outbox item without charge: session {s!r} chunk {i}"
                for s, i in sql.all(
                    "SELECT o.session, o.chunk_index FROM outbox o LEFT JOIN charges c "
                    "ON o.session = c.session AND o.chunk_index = c.chunk_index "
                    "WHERE c.session IS NULL"
                )
            ]
            problems += [
                f"chunk both charged and withheld: session {s!r} chunk {i}"
                for s, i in sql.all(
                    "SELECT w.session, w.chunk_index FROM withheld w JOIN charges c "
                    "ON w.session = c.session AND w.chunk_index = c.chunk_index"
                )
            ]
        return problems


def _check_chunk(session: str, chunk_index: int) -> None:
    if not isinstance(session, str) or not session:
        raise ConfigError("session", session, "must be a non-empty string")
    if isinstance(chunk_index, bool) or not isinstance(chunk_index, int) or chunk_index < 0:
        raise ConfigError("chunk_index", chunk_index, "must be an integer >= 0")


def _refuse_duplicate(sql: Sql, session: str, chunk_index: int) -> None:
    key = (session, chunk_index)
    if sql.one("SELECT 1 FROM charges WHERE session = ? AND chunk_index = ?", key):
        raise DuplicateChargeError(session, chunk_index, "charged")
    if sql.one("SELECT 1 FROM withheld WHERE session = ? AND chunk_index = ?", key):
        raise DuplicateChargeError(session, chunk_index, "withheld")


def _window_totals(sql: Sql, session: str, lo: int, hi: int) -> dict[int, int]:
    rows = sql.all(
        "SELECT chunk_index, total FROM charges WHERE session = ? AND chunk_index BETWEEN ? AND ?",
        (session, lo, hi),
    )
    return {int(i): int(t) for i, t in rows}


def _max_window(sql: Sql, session: str, chunk_index: int, w: int) -> int:
    """Largest spend of any w-window of chunk indexes that contains ``chunk_index`` (micro-ε).

    Chunks are usually charged in order, but a fleet may charge them out of order, so every
    window ``[j, j+w−1]`` with ``chunk_index−w < j ≤ chunk_index`` is checked (O(w)).
    """
    lo = chunk_index - w + 1
    totals = _window_totals(sql, session, lo, chunk_index + w - 1)
    window = sum(totals.get(i, 0) for i in range(lo, chunk_index + 1))
    best = window
    for start in range(lo + 1, chunk_index + 1):
        window += totals.get(start + w - 1, 0) - totals.get(start - 1, 0)
        best = max(best, window)
    return best


def _read_state(sql: Sql, session: str) -> LedgerState:
    row = sql.one(
        "SELECT session_cap, w_event, w_event_cap, spent, chunks, withheld, max_chunk, "
        "last_chunk FROM sessions WHERE session = ?",
        (session,),
    )
    assert row is not None
    cap, w, w_cap, spent, chunks, withheld, max_chunk, last = row
    pending = sql.one(
        "SELECT COUNT(*) FROM outbox WHERE session = ? AND delivered IS NULL", (session,)
    )
    assert pending is not None
    window_spent = window_remaining = None
    if w is not None:
        totals = {} if last is None else _window_totals(sql, session, last - w + 1, last)
        window_spent = sum(totals.values())
        next_window = sum(t for i, t in totals.items() if last is not None and i > last - w + 1)
        window_remaining = max(int(w_cap) - next_window, 0)
    return LedgerState(
        session=session,
        spent=int(spent) / UNITS_PER_EPSILON,
        remaining=None if cap is None else max(int(cap) - int(spent), 0) / UNITS_PER_EPSILON,
        chunks=int(chunks),
        withheld=int(withheld),
        max_chunk_eps=int(max_chunk) / UNITS_PER_EPSILON,
        last_chunk=None if last is None else int(last),
        pending=int(pending[0]),
        session_cap=eps_of(cap),
        w_event=None if w is None else int(w),
        w_event_cap=eps_of(w_cap),
        window_spent=eps_of(window_spent),
        window_remaining=eps_of(window_remaining),
    )
