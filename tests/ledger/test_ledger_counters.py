"""The ledger's per-session counters (trailing windows of gaze and wall-clock time, pending
outbox items) against a recount of the rows: after SIGKILLs in the middle of charges on SQLite
and PostgreSQL, on a schema-2 ledger, and in the queries' plans (real files, real servers)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from gazeguard.core.errors import BudgetExhaustedError
from gazeguard.ledger import Ledger, LedgerError, pure_cost
from gazeguard.ledger._store import Store
from tests._postgres import pg_server, pg_url  # noqa: F401 - fixtures

T0 = 1.7e9
#: Caps that slide and refuse: 5 s windows of gaze (a chunk every 0.5 s: 5 ε in order, more
#: with the late ones), also of wall clock (the loop charges far faster than 12 per 5 s).
CAPS: dict[str, Any] = {
    "window_cap": 6.0, "window_s": 5.0, "wall_clock": True, "composition": "sequential",
    "prefetch": False,
}  # fmt: skip
#: The same without the wall clock, for two ledgers that must decide alike at different times.
GAZE_CAPS = {**CAPS, "window_cap": 2.0, "wall_clock": False}

# Charges sessions a and b in a loop (gaze every 0.5 s, one in 7 charged 3 s late, out of
# order), delivers or refuses some pending items; with argv[3] = K >= 0 it stops inside the
# first charge of session a from index K on that fits the caps, after every write of it and
# before its COMMIT, and says which.
CHARGER = """
import json, logging, sys, time
logging.disable(logging.WARNING)  # (the refused items)
from gazeguard.core.errors import BudgetExhaustedError
from gazeguard.ledger import Ledger, _store, pure_cost
location, start, stop_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
caps = json.loads(sys.argv[4])
update = _store.Store.update_after_charge
def update_then_stall(self, session, *args, **kw):
    out = update(self, session, *args, **kw)
    if session == "a" and self._stalling is not None:
        print("inside", self._stalling, flush=True)
        time.sleep(60)  # the parent SIGKILLs us here, inside the open transaction
    return out
_store.Store.update_after_charge = update_then_stall
_store.Store._stalling = None
with Ledger(location, **caps) as ledger:
    print("ready", flush=True)
    for i in range(start, 10**6):
        for session in "ab":
            end = 1.7e9 + 0.5 * i - (3.0 if i % 7 == 3 else 0.0)
            _store.Store._stalling = i if 0 <= stop_at <= i else None
            try:
                ledger.charge(session, i, pure_cost({"f": 0.25, "g": 0.25}), "t", bytes(500),
                              gaze=(end - 0.4, end))
            except BudgetExhaustedError:
                ledger.withhold(session, i, 0.5, "cap")
        if i % 3 == 0:
            for item in ledger.pending(2):
                if item.chunk_index % 5 == 0:
                    ledger.mark_refused(item.id, "test")
                else:
                    ledger.mark_delivered(item.id)
        print("charged", i, flush=True)
"""


def _charger(location: str, start: int, stop_at: int) -> subprocess.Popen[bytes]:
    import json  # noqa: PLC0415

    return subprocess.Popen(
        [sys.executable, "-c", CHARGER, location, str(start), str(stop_at), json.dumps(CAPS)],
        stdout=subprocess.PIPE,
    )


def _counters_are_a_recount(ledger: Ledger) -> int:
    """Assert every session's counters equal a recount of its rows; the sessions checked."""
    with ledger.backend.read() as sql:
        store = Store(sql)
        sessions = store.sessions()
        for session in sessions:
            stored = store.counters(session)
            assert stored is not None
            assert stored == store.recount(session, stored.gaze_lo, stored.wall_lo)
    assert ledger.verify() == []
    return len(sessions)


def _next(ledger: Ledger) -> int:
    return max((ledger.next_index(s) for s in ledger.sessions()), default=0)


@pytest.mark.slow
def test_sigkill_inside_a_charge_leaves_counters_equal_to_a_recount(location: str) -> None:
    """Killed after the charge wrote its rows and its counters, before COMMIT: none of it is
    there, and the counters are a recount of what is; then at random moments of the loop."""
    with _charger(location, 0, 20) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        for line in proc.stdout:
            if line.startswith(b"inside"):
                break
        os.kill(proc.pid, signal.SIGKILL)
    inside = int(line.split()[1])
    assert inside >= 20
    with Ledger(location, **CAPS) as ledger:
        assert _counters_are_a_recount(ledger) == 2
        assert ledger.next_index("a") == inside  # its charge was rolled back, all of it
        start = _next(ledger)
    for delay in (0.07, 0.19, 0.43):
        with _charger(location, start, -1) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"ready\n"
            assert proc.stdout.readline().startswith(b"charged")
            threading.Event().wait(delay)
            os.kill(proc.pid, signal.SIGKILL)
        with Ledger(location, **CAPS) as ledger:
            assert _counters_are_a_recount(ledger) == 2
            start = _next(ledger)
            try:  # one more write on the counters as they were found
                ledger.charge("a", start, pure_cost({"f": 0.25}), "t", b"x", gaze=(T0, T0 + 1e6))
            except BudgetExhaustedError:  # (the wall-clock hour is full)
                ledger.withhold("a", start, 0.25, "cap")
            assert _counters_are_a_recount(ledger) == 2
            start += 1
    assert start > inside + 5  # the loop got on between the kills


def test_a_ledger_of_another_schema_is_refused_naming_both_versions(tmp_path: Path) -> None:
    """Ledgers are not upgraded in place (no schema was ever released before this one): a
    ledger stamped with schema 4 (the one before the session's event counts moved into its row)
    is refused with what to do, and is left as it was."""
    path = tmp_path / "v4.sqlite"
    with Ledger(path, **GAZE_CAPS) as ledger:
        ledger.charge("a", 0, pure_cost({"f": 0.5}), "t", b"x", gaze=(T0 - 0.4, T0))
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE meta SET value = '4' WHERE key = 'schema'")
    with pytest.raises(LedgerError, match=r"schema version 4; this gazeguard reads version 5"):
        Ledger(path, **GAZE_CAPS)
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("4",)


def test_verify_reports_counters_that_disagree_with_the_rows(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with Ledger(path, **CAPS) as ledger:
        for i in range(4):
            ledger.charge("s", i, pure_cost({"f": 0.25}), "t", b"x", gaze=(T0 + i, T0 + i + 0.5))
        assert ledger.verify() == []
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE sessions SET pending = 3")
    with Ledger(path, **CAPS) as ledger:
        (problem,) = ledger.verify()
        assert "session 's': counters" in problem
        assert "pending=3" in problem
        assert "pending=4" in problem


def test_verify_reports_rows_whose_parent_is_missing(tmp_path: Path) -> None:
    """The tables hold no foreign keys; verify names each row that one would have refused."""
    path = tmp_path / "l.sqlite"
    with Ledger(path, **CAPS) as ledger:
        ledger.charge("s", 0, pure_cost({"f": 0.25}), "t", b"x", gaze=(T0, T0 + 0.5))
        assert ledger.verify() == []
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("INSERT INTO charge_events VALUES ('s', 'chunks', 7, 1, 1)")
        db.execute("INSERT INTO charge_events VALUES ('s', 'chunks', 0, 99, 1)")
        db.execute("INSERT INTO withheld VALUES ('ghost', 'chunks', 0, 1, 'cap', 0)")
    with Ledger(path, **CAPS) as ledger:
        problems = ledger.verify()
    assert "charge event without its charge: session 's' chunks 7" in problems
    assert "charge event without its event key: session 's' chunks 0" in problems
    assert "withheld release without its session: session 'ghost' chunks 0" in problems


def test_the_window_queries_read_only_the_charges_in_their_range(tmp_path: Path) -> None:
    """The counters take off the charges that left a window by a range query that starts from
    the charges' index on that time (SQLite would otherwise read every charge_events row of the
    session: a cost growing with the session, not with what left)."""
    path = tmp_path / "l.sqlite"
    Ledger(path).close()
    plans: list[str] = []

    class Explain:
        def __init__(self, db: sqlite3.Connection) -> None:
            self.db = db

        def all(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
            plans.extend(str(r[3]) for r in self.db.execute("EXPLAIN QUERY PLAN " + sql, params))
            return []

    with closing(sqlite3.connect(path)) as db:
        store = Store(Explain(db))  # type: ignore[arg-type]
        store.gaze_between("s", T0, T0 + 1.0)
        assert plans[0].startswith("SEARCH c USING INDEX charges_gaze (session=? AND gaze_end>?")
        plans.clear()
        store.wall_between("s", T0, T0 + 1.0)
        assert plans[0].startswith("SEARCH c USING INDEX charges_created (session=? AND created>?")
