"""SQLite storage for the ε ledger: one file in WAL mode, shared by threads and processes."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gazeguard.errors import ConfigError, GazeguardError
from gazeguard.ledger._model import LedgerError, Sql, Synchronous, check_schema

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    session TEXT PRIMARY KEY,
    session_cap INTEGER, w_event INTEGER, w_event_cap INTEGER,   -- caps, micro-ε
    spent INTEGER NOT NULL DEFAULT 0, chunks INTEGER NOT NULL DEFAULT 0,
    withheld INTEGER NOT NULL DEFAULT 0, max_chunk INTEGER NOT NULL DEFAULT 0,
    last_chunk INTEGER, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS charges (
    session TEXT NOT NULL REFERENCES sessions(session),
    chunk_index INTEGER NOT NULL, total INTEGER NOT NULL, epsilon TEXT NOT NULL,
    created REAL NOT NULL, PRIMARY KEY (session, chunk_index));
CREATE TABLE IF NOT EXISTS withheld (
    session TEXT NOT NULL REFERENCES sessions(session),
    chunk_index INTEGER NOT NULL, requested INTEGER NOT NULL, reason TEXT NOT NULL,
    created REAL NOT NULL, PRIMARY KEY (session, chunk_index));
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL, chunk_index INTEGER NOT NULL, topic TEXT NOT NULL, payload BLOB,
    created REAL NOT NULL, delivered REAL, UNIQUE (session, chunk_index),
    FOREIGN KEY (session, chunk_index) REFERENCES charges(session, chunk_index));
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox(id) WHERE delivered IS NULL;
"""


class _SqliteSql:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def one(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        rows = self._conn.execute(sql, params).fetchall()
        return tuple(rows[0]) if rows else None

    def all(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._conn.execute(sql, params).fetchall()]

    def run(self, sql: str, params: Sequence[object] = ()) -> int:
        return self._conn.execute(sql, params).rowcount


class SqliteBackend:
    """A ledger in one SQLite file (WAL mode), shared safely by threads and processes.

    Args:
        path: the database file; created with its tables unless ``create`` is false.
        synchronous: ``FULL`` (default, survives power loss), ``EXTRA``, or ``NORMAL``
            (survives a process crash only; for benchmarks).
        create: create a missing file; otherwise a missing file is a ConfigError.
        timeout_s: how long a writer waits for another writer's lock, s.
    """

    kind = "sqlite"
    lock_clause = ""  # BEGIN IMMEDIATE already holds the database's write lock

    def __init__(
        self,
        path: str | os.PathLike[str],
        synchronous: Synchronous = "FULL",
        *,
        create: bool = True,
        timeout_s: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        if synchronous not in ("NORMAL", "FULL", "EXTRA"):
            raise ConfigError("ledger.synchronous", synchronous, "use FULL, EXTRA or NORMAL")
        if not create and not self.path.is_file():
            raise ConfigError(
                "ledger.path",
                str(self.path),
                "ledger file not found; pass --path (or set ledger.path / GAZEGUARD_LEDGER__PATH)"
                " to the file `gazeguard run` writes",
            )
        self._lock = threading.RLock()
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open ledger {self.location!r}: {exc}") from exc
        try:
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                msg = f"journal_mode is {mode!r}, WAL is required (is the file on a local disk?)"
                raise LedgerError(f"ledger {self.location!r}: {msg}")
            self._conn.execute(f"PRAGMA synchronous={synchronous}")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._init_schema(create)
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise LedgerError(
                f"{self.location!r} is not a usable gazeguard ledger ({exc}); point ledger.path "
                "at a ledger file or at a new path"
            ) from exc
        except GazeguardError:
            self._conn.close()
            raise

    def _init_schema(self, create: bool) -> None:
        with self.write() as sql:
            has_meta = sql.one("SELECT name FROM sqlite_master WHERE name = 'meta'") is not None
            if not has_meta and not create:
                raise LedgerError(f"{self.location!r} is an SQLite file but not a gazeguard ledger")
            if not has_meta:
                for statement in SQLITE_SCHEMA.split(";"):
                    if statement.strip():
                        sql.run(statement)
            check_schema(sql, self.location)

    @contextmanager
    def write(self) -> Iterator[Sql]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``: holds the database write lock throughout."""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise LedgerError(
                    f"ledger {self.location!r} stayed locked by another writer: {exc}"
                ) from exc
            try:
                yield _SqliteSql(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[Sql]:
        """A snapshot (``BEGIN`` … ``COMMIT``), or the open transaction when nested."""
        with self._lock:
            if self._conn.in_transaction:
                yield _SqliteSql(self._conn)
                return
            self._conn.execute("BEGIN")
            try:
                yield _SqliteSql(self._conn)
            finally:
                self._conn.execute("COMMIT")

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()
