"""PostgreSQL storage for the ε ledger, for fleets of workers that share sessions.

Same tables and the same accounting as the SQLite ledger (:mod:`gazeguard.ledger` holds the logic
once; this module only stores). Install with ``pip install -e '.[fleet]' (in the gazeguard
checkout)`` (psycopg 3) and open with ``Ledger("postgresql://user@host/db")``.

Atomic charges across workers: every write runs in one transaction that takes the session's row
lock (``SELECT … FOR UPDATE``) before it reads the account, so concurrent charges of one session
are serialised and can never overspend; different sessions proceed in parallel. The session row
is created with ``INSERT … ON CONFLICT DO NOTHING`` first, so two workers meeting a new session
race only for the insert, never for the budget. Outbox ids come from an identity column and are
allocated under the row lock, so they are in commit order *within a session* (which is the order
that matters for delivery); across sessions, ids of concurrent transactions may commit out of
order.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from gazeguard.core.errors import ConfigError, GazeguardError
from gazeguard.ledger._model import LedgerError, Sql, Synchronous, check_schema
from gazeguard.ledger._store import ensure_indexes

__all__ = ["PostgresBackend"]

POSTGRES_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    session TEXT PRIMARY KEY, caps TEXT NOT NULL, version BIGINT NOT NULL DEFAULT 0,
    chunks BIGINT NOT NULL DEFAULT 0, withheld BIGINT NOT NULL DEFAULT 0,
    refused BIGINT NOT NULL DEFAULT 0,
    spent BIGINT NOT NULL DEFAULT 0, pure_finite BOOLEAN NOT NULL DEFAULT TRUE,
    max_chunk BIGINT NOT NULL DEFAULT 0, last_chunk BIGINT, last_gaze_end DOUBLE PRECISION,
    created DOUBLE PRECISION NOT NULL,
    gaze_lo DOUBLE PRECISION, wall_lo DOUBLE PRECISION,
    gaze_counts TEXT NOT NULL DEFAULT '{}', wall_counts TEXT NOT NULL DEFAULT '{}',
    pending BIGINT NOT NULL DEFAULT 0, gaze_first DOUBLE PRECISION, wall_first DOUBLE PRECISION,
    counts TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS events (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS charges (
    session TEXT NOT NULL, stream TEXT NOT NULL,
    idx BIGINT NOT NULL, total BIGINT, epsilon TEXT NOT NULL,
    gaze_start DOUBLE PRECISION NOT NULL, gaze_end DOUBLE PRECISION NOT NULL,
    created DOUBLE PRECISION NOT NULL, PRIMARY KEY (session, stream, idx));
CREATE INDEX IF NOT EXISTS charges_gaze ON charges(session, gaze_end);
CREATE TABLE IF NOT EXISTS charge_events (
    session TEXT NOT NULL, stream TEXT NOT NULL, idx BIGINT NOT NULL,
    event_id BIGINT NOT NULL, count BIGINT NOT NULL,
    PRIMARY KEY (session, stream, idx, event_id));
CREATE TABLE IF NOT EXISTS withheld (
    session TEXT NOT NULL, stream TEXT NOT NULL,
    idx BIGINT NOT NULL, requested BIGINT NOT NULL, reason TEXT NOT NULL,
    created DOUBLE PRECISION NOT NULL, PRIMARY KEY (session, stream, idx));
CREATE TABLE IF NOT EXISTS outbox (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session TEXT NOT NULL, stream TEXT NOT NULL, idx BIGINT NOT NULL, topic TEXT NOT NULL,
    payload BYTEA, created DOUBLE PRECISION NOT NULL, delivered DOUBLE PRECISION,
    state TEXT NOT NULL DEFAULT 'pending', reason TEXT, UNIQUE (session, stream, idx));
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox(id) WHERE state = 'pending';
"""
# Serialises schema creation by concurrent workers (CREATE TABLE IF NOT EXISTS is not atomic).
_SCHEMA_LOCK_KEY = 0x67617A65  # "gaze"


def _mask(url: str) -> str:
    """The URL without its password, for messages."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


def _store_payloads_plain(sql: Sql) -> None:
    """Outbox payloads stored out of line but not compressed (``STORAGE EXTERNAL``): they
    live until delivered (then dropped), and compressing each (a chunk's ~17 kB of JSON) was
    most of the server's time in a batch of charges. Changed once (the check reads the
    catalogue); the data and the schema version are the same either way."""
    row = sql.one(
        "SELECT attstorage FROM pg_attribute WHERE attrelid = 'outbox'::regclass "
        "AND attname = 'payload'"
    )
    if row is not None and str(row[0]) != "e":
        sql.run("ALTER TABLE outbox ALTER COLUMN payload SET STORAGE EXTERNAL")


class _PgSql:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._pipeline: psycopg.Pipeline | None = None

    def _execute(self, sql: str, params: Sequence[object]) -> psycopg.Cursor[Any]:
        """Run a statement and wait for it (in a pipeline too: ``one``/``all``/``run`` block)."""
        cur = self._conn.execute(sql.replace("?", "%s"), params)
        if self._pipeline is not None:
            self._pipeline.sync()
        return cur

    def one(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        cur = self._execute(sql, params)
        row = cur.fetchone() if cur.description is not None else None
        return None if row is None else tuple(row)

    def all(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._execute(sql, params).fetchall()]

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        return int(self._execute(sql, params).rowcount)

    def send(self, sql: str, params: Sequence[object] = ()) -> Callable[[], list[tuple[Any, ...]]]:
        cur = self._conn.execute(sql.replace("?", "%s"), params)

        def rows() -> list[tuple[Any, ...]]:
            return [] if cur.description is None else [tuple(r) for r in cur.fetchall()]

        return rows

    @contextmanager
    def pipeline(self) -> Iterator[None]:
        with self._conn.pipeline() as pipeline:
            self._pipeline = pipeline
            try:
                yield
            finally:
                self._pipeline = None


class PostgresBackend:
    """A ledger in a PostgreSQL database (tables are created on first use).

    Args:
        url: ``postgresql://user[:password]@host[:port]/dbname`` (libpq syntax).
        synchronous: ``FULL``/``EXTRA``: ``synchronous_commit=on`` (a committed charge is on the
            server's disk); ``NORMAL``: ``synchronous_commit=off`` (benchmarks only).
        timeout_s: connect timeout and ``lock_timeout`` of a writer waiting for a session, s.
    """

    kind = "postgresql"
    lock_clause = " FOR UPDATE"  # the session row lock serialises writers of one session

    def __init__(
        self, url: str, synchronous: Synchronous = "FULL", *, timeout_s: float = 30.0
    ) -> None:
        self.location = _mask(url)
        if synchronous not in ("NORMAL", "FULL", "EXTRA"):
            raise ConfigError("ledger.synchronous", synchronous, "use FULL, EXTRA or NORMAL")
        self._lock = threading.RLock()
        try:
            self._conn = psycopg.connect(
                url, autocommit=True, connect_timeout=max(1, round(timeout_s))
            )
        except psycopg.Error as exc:
            raise LedgerError(
                f"cannot connect to the ledger database {self.location}: {exc}; check "
                "ledger.url and that the server is reachable"
            ) from exc
        try:
            commit = "off" if synchronous == "NORMAL" else "on"
            self._conn.execute(f"SET synchronous_commit = {commit}")
            self._conn.execute(f"SET lock_timeout = {max(1, round(timeout_s * 1000))}")
            with self.write() as sql:
                sql.run("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK_KEY,))
                has_meta = sql.one("SELECT to_regclass('meta')")
                if has_meta is not None and has_meta[0] is not None:
                    check_schema(sql, self.location)  # before any DDL: another schema is refused
                for statement in POSTGRES_SCHEMA.split(";"):
                    if statement.strip():
                        sql.run(statement)
                check_schema(sql, self.location)
                ensure_indexes(sql)
                _store_payloads_plain(sql)
        except BaseException:
            self._conn.close()
            raise

    @contextmanager
    def write(self) -> Iterator[Sql]:
        """One transaction; the session row lock is taken by the caller's ``FOR UPDATE``."""
        with self._lock:
            try:
                with self._conn.transaction():
                    yield _PgSql(self._conn)
            except GazeguardError:
                raise
            except psycopg.Error as exc:
                raise LedgerError(f"ledger {self.location}: {exc}") from exc

    @contextmanager
    def read(self) -> Iterator[Sql]:
        """A REPEATABLE READ snapshot (or the open transaction when nested)."""
        with self._lock:
            if self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                yield _PgSql(self._conn)
                return
            try:
                with self._conn.transaction():
                    self._conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    yield _PgSql(self._conn)
            except psycopg.Error as exc:
                raise LedgerError(f"ledger {self.location}: {exc}") from exc

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()
