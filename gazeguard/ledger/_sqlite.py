"""SQLite storage for the ε ledger: one file in WAL mode, shared by threads and processes."""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

if sys.platform != "win32":  # the user database (POSIX only)
    import pwd

from gazeguard.core.errors import ConfigError, GazeguardError
from gazeguard.ledger._model import (
    SCHEMA_VERSION,
    LedgerError,
    Sql,
    Synchronous,
    check_schema,
    schema_mismatch,
)
from gazeguard.ledger._store import ensure_indexes
from gazeguard.ledger.policy import Caps

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    session TEXT PRIMARY KEY, caps TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 0,
    chunks INTEGER NOT NULL DEFAULT 0, withheld INTEGER NOT NULL DEFAULT 0,
    refused INTEGER NOT NULL DEFAULT 0,
    spent INTEGER NOT NULL DEFAULT 0, pure_finite INTEGER NOT NULL DEFAULT 1,   -- micro-ε
    max_chunk INTEGER NOT NULL DEFAULT 0, last_chunk INTEGER, last_gaze_end REAL,
    created REAL NOT NULL,
    -- the counters (gazeguard.ledger._store.Counters), kept by every charge and outbox change
    gaze_lo REAL, wall_lo REAL,                                 -- Unix s, NULL: no bound
    gaze_counts TEXT NOT NULL DEFAULT '{}', wall_counts TEXT NOT NULL DEFAULT '{}',  -- JSON
    pending INTEGER NOT NULL DEFAULT 0,
    gaze_first REAL, wall_first REAL,                           -- Unix s, NULL: none counted
    counts TEXT NOT NULL DEFAULT '{}');      -- JSON: event key -> releases charged (session)
CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS charges (
    session TEXT NOT NULL, stream TEXT NOT NULL,
    idx INTEGER NOT NULL, total INTEGER, epsilon TEXT NOT NULL,
    gaze_start REAL NOT NULL, gaze_end REAL NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (session, stream, idx));
CREATE INDEX IF NOT EXISTS charges_gaze ON charges(session, gaze_end);
CREATE TABLE IF NOT EXISTS charge_events (
    session TEXT NOT NULL, stream TEXT NOT NULL, idx INTEGER NOT NULL,
    event_id INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (session, stream, idx, event_id));
CREATE TABLE IF NOT EXISTS withheld (
    session TEXT NOT NULL, stream TEXT NOT NULL,
    idx INTEGER NOT NULL, requested INTEGER NOT NULL, reason TEXT NOT NULL,
    created REAL NOT NULL, PRIMARY KEY (session, stream, idx));
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL, stream TEXT NOT NULL, idx INTEGER NOT NULL, topic TEXT NOT NULL,
    payload BLOB, created REAL NOT NULL, delivered REAL,
    state TEXT NOT NULL DEFAULT 'pending', reason TEXT, UNIQUE (session, stream, idx));
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox(id) WHERE state = 'pending';
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

    def send(self, sql: str, params: Sequence[object] = ()) -> Callable[[], list[tuple[Any, ...]]]:
        rows = self.all(sql, params)
        return lambda: rows

    def pipeline(self) -> AbstractContextManager[None]:
        return nullcontext()


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite refused for another connection's lock (retry), not for a broken file."""
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class SqliteBackend:
    """A ledger in one SQLite file (WAL mode), shared safely by threads and processes.

    Args:
        path: the database file; created with its tables unless ``create`` is false.
        synchronous: ``FULL`` (default, survives power loss), ``EXTRA``, or ``NORMAL``
            (survives a process crash only; for benchmarks).
        create: create a missing file; otherwise a missing file is a ConfigError.
        timeout_s: how long a writer waits for another writer's lock, s.
        read_only: only read (``gazeguard ledger show``): nothing is written, not even the
            switch to WAL, so a ledger in a directory this user may not write opens too
            (:func:`connect_read_only`).
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
        read_only: bool = False,
    ) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        if synchronous not in ("NORMAL", "FULL", "EXTRA"):
            raise ConfigError("ledger.synchronous", synchronous, "use FULL, EXTRA or NORMAL")
        if (read_only or not create) and not self.path.is_file():
            raise ConfigError(
                "ledger.path",
                str(self.path),
                "ledger file not found; pass --path (or set ledger.path / GAZEGUARD_LEDGER__PATH)"
                " to the file `gazeguard run` writes",
            )
        self._lock = threading.RLock()
        if read_only:
            self._conn = connect_read_only(self.path, timeout_s)
            try:
                self._check_read_only()
            except BaseException:
                self._conn.close()
                raise
            return
        # SQLite would open a read-only file read-only, and fail at the first charge. (Not its
        # -wal and -shm here: other processes' connections create and delete those meanwhile.)
        blocked = not_writable(self.path, companions=False)
        if blocked is not None:
            raise LedgerError(f"cannot open ledger {self.location!r}: {blocked}")
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            why = not_writable(self.path) or str(exc)
            raise LedgerError(f"cannot open ledger {self.location!r}: {why}") from exc
        try:
            self._open(synchronous, create, time.monotonic() + timeout_s)
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            blocked = not_writable(self.path)
            if blocked is not None:  # SQLite says "unable to open database file", "readonly"
                msg = f"cannot open ledger {self.location!r}: {blocked} ({exc})"
                raise LedgerError(msg) from exc
            raise LedgerError(
                f"{self.location!r} is not a usable gazeguard ledger ({exc}); point ledger.path "
                "at a ledger file or at a new path"
            ) from exc
        except GazeguardError:
            self._conn.close()
            raise

    def _open(self, synchronous: Synchronous, create: bool, deadline: float) -> None:
        """Switch to WAL, set durability, create or check the schema; retry while locked.

        Two processes opening one fresh file race on the switch to WAL, which needs an
        exclusive lock and (unlike a write) answers ``SQLITE_BUSY`` at once instead of calling
        the busy handler; so does a connection that meets another one's WAL recovery. Every
        step here is idempotent, so the open is retried with a short backoff until
        ``deadline`` (``time.monotonic()`` seconds), the writer's ``timeout_s``.
        """
        pause = 0.005
        while True:
            try:
                mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    msg = f"journal_mode is {mode!r}, WAL is required (is it on a local disk?)"
                    raise LedgerError(f"ledger {self.location!r}: {msg}")
                self._conn.execute(f"PRAGMA synchronous={synchronous}")
                self._init_schema(create)
                return
            except (sqlite3.OperationalError, LedgerError) as exc:
                cause = exc.__cause__ if isinstance(exc, LedgerError) else exc
                busy = isinstance(cause, sqlite3.OperationalError) and _is_busy(cause)
                if not busy or time.monotonic() + pause > deadline:
                    raise
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                time.sleep(pause)
                pause = min(pause * 2, 0.2)

    def _check_read_only(self) -> None:
        """A read-only ledger's schema: a gazeguard ledger of this version (nothing written).

        Raises:
            LedgerError: not a gazeguard ledger, or another schema version.
        """
        try:
            with self.read() as sql:
                has_meta = sql.one("SELECT name FROM sqlite_master WHERE name = 'meta'")
                row = (
                    None
                    if has_meta is None
                    else sql.one("SELECT value FROM meta WHERE key = 'schema'")
                )
                if row is None:
                    msg = f"{self.location!r} is an SQLite file but not a gazeguard ledger"
                    raise LedgerError(msg)
                check_schema(sql, self.location)  # (compares: the version is there)
        except sqlite3.DatabaseError as exc:
            msg = f"{self.location!r} is not a readable gazeguard ledger ({exc})"
            raise LedgerError(msg) from exc

    def _init_schema(self, create: bool) -> None:
        with self.write() as sql:
            has_meta = sql.one("SELECT name FROM sqlite_master WHERE name = 'meta'") is not None
            if not has_meta and not create:
                raise LedgerError(f"{self.location!r} is an SQLite file but not a gazeguard ledger")
            if has_meta:
                check_schema(sql, self.location)  # before any DDL: another schema is refused
            else:
                for statement in SQLITE_SCHEMA.split(";"):
                    if statement.strip():
                        sql.run(statement)
                check_schema(sql, self.location)
            ensure_indexes(sql)

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


def not_writable(path: Path, *, companions: bool = True) -> str | None:
    """Why this process cannot create or write the SQLite ledger at ``path`` — its directory
    missing or not writable (SQLite creates the ``-wal`` and ``-shm`` files next to the
    ledger), or the file (or, with ``companions``, one of those) not writable — with what to
    do; ``None`` when nothing is in the way."""
    directory = path.parent
    user = _user()
    change = "or point ledger.path (--ledger) at a directory this user may write"
    if not directory.is_dir():
        return f"directory {directory} does not exist: create it, {change}"
    if not os.access(directory, os.W_OK | os.X_OK):
        return (
            f"directory {directory} is not writable by user {user}, and SQLite creates the "
            f"ledger's -wal and -shm files next to it: make it writable for {user} (chown or "
            f"chmod), {change}"
            + (f". To only read it: gazeguard ledger show --path {path}" if path.exists() else "")
        )
    files = [path]
    if companions:
        files += [path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]
    for file in files:
        if file.exists() and not os.access(file, os.R_OK | os.W_OK):
            return (
                f"file {file} is not readable and writable by user {user}: give {user} read "
                f"and write access to it (chown or chmod), {change}"
            )
    return None


def _user() -> str:
    """The name of the user this process runs as (its uid if it has none)."""
    if sys.platform == "win32":  # no pwd, no uid
        return "this user"
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def connect_read_only(path: Path, timeout_s: float = 30.0) -> sqlite3.Connection:
    """A connection that only reads the SQLite ledger at ``path`` and writes nothing.

    A WAL database opens read-only when its ``-shm`` file exists or can be created; in a
    directory this user may not write, a ledger closed cleanly has none, so it is then opened
    as immutable — safe because there is no ``-wal`` content to miss, and a writer holding it
    open would have made the ``-shm``.

    Raises:
        LedgerError: it cannot be read (with why, from :func:`not_writable` where that explains
            it).
    """
    uri = path.resolve().as_uri()

    def connect(mode: str) -> sqlite3.Connection:
        conn = sqlite3.connect(
            f"{uri}?{mode}", uri=True, timeout=timeout_s, isolation_level=None,
            check_same_thread=False,
        )  # fmt: skip
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except BaseException:
            conn.close()
            raise
        return conn

    try:
        try:
            return connect("mode=ro")
        except sqlite3.OperationalError:
            wal = path.with_name(path.name + "-wal")
            if wal.exists() and wal.stat().st_size > 0:
                raise
            return connect("immutable=1")
    except sqlite3.Error as exc:
        why = f"{exc}; {not_writable(path) or 'check that this user may read it'}"
        raise LedgerError(f"cannot read the ledger {path}: {why}") from exc


def stored_caps(path: Path, session: str) -> Caps | None:
    """The caps stored with ``session`` in the SQLite ledger at ``path``, read without opening
    the ledger for writing (no lock); ``None`` for a missing file or a session the ledger does
    not know.

    Raises:
        LedgerError: the file is not a readable ledger, or one of another schema version.
    """
    if not path.is_file():
        return None
    try:
        conn = connect_read_only(path)  # (a LedgerError saying why, when it cannot)
        try:
            version = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if version is not None and str(version[0]) != SCHEMA_VERSION:
                raise LedgerError(schema_mismatch(str(path), str(version[0])))
            row = conn.execute("SELECT caps FROM sessions WHERE session = ?", (session,)).fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise LedgerError(f"cannot read the ledger {path}: {exc}") from exc
    return None if row is None else Caps.from_json(row[0])
