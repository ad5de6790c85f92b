"""The PostgreSQL ledger backend, against a real PostgreSQL server started on a free loopback port.

The server comes from the Debian binaries (``apt-get install -y postgresql``): ``initdb`` into a
temporary directory, run as the ``postgres`` user when we are root. Without the binaries or
psycopg 3 (``pip install -e '.[fleet]'``) the tests skip, saying which is missing.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from gazeguard.cli import main
from gazeguard.core.errors import BudgetExhaustedError, ConfigError
from gazeguard.ledger import (
    Charge,
    ChargeRequest,
    DuplicateChargeError,
    Ledger,
    LedgerError,
    StaleStateError,
    pure_cost,
)
from gazeguard.ledger import _ledger as ledger_module
from tests._postgres import pg_server, pg_url  # noqa: F401 - fixtures
from tests.conftest import free_port
from tests.ledger.test_ledger import V1_SCHEMA

psycopg = pytest.importorskip(
    "psycopg", reason="psycopg 3 is not installed: pip install -e '.[fleet]'"
)

EPS = {"fix_rate": 0.25, "sacc_amp": 0.25}  # 0.5 per chunk


@pytest.fixture
def url(pg_url: str) -> str:  # noqa: F811 - the imported fixture
    """A fresh database on the module's server."""
    return pg_url


def test_same_interface_persists_and_refuses_like_sqlite(url: str) -> None:
    with Ledger(
        url, session_cap=1.7, window_cap=1.0, window_s=4.0, composition="sequential"
    ) as ledger:
        assert ledger.backend.kind == "postgresql"
        for i in range(2):
            ledger.charge(
                "s", i, pure_cost(EPS), "t", f"p{i}".encode(), gaze=(100.0 + i, 100.5 + i)
            )
        with pytest.raises(BudgetExhaustedError, match="under the per-4-s-of-gaze cap"):
            ledger.charge("s", 2, pure_cost(EPS), "t", b"x", gaze=(102.0, 102.5))
        ledger.withhold("s", 2, 0.5, "window cap")
        with pytest.raises(DuplicateChargeError, match="already withheld"):
            ledger.charge("s", 2, pure_cost(EPS), "t", b"x")
    with Ledger.open(
        url, session_cap=1.7, window_cap=1.0, window_s=4.0, composition="sequential"
    ) as ledger:
        state = ledger.state("s")
        assert (state.spent, state.chunks, state.withheld, state.remaining) == (1.0, 2, 1, 0.7)
        assert [(p.chunk_index, p.payload) for p in ledger.pending()] == [(0, b"p0"), (1, b"p1")]
        assert ledger.mark_delivered(ledger.pending()[0].id) is True
        assert [p.chunk_index for p in ledger.pending()] == [1]
        with pytest.raises(DuplicateChargeError):
            ledger.charge("s", 1, pure_cost(EPS), "t", b"x")
        assert (
            ledger.charge("s", 9, pure_cost(EPS), "t", b"x", gaze=(200.0, 200.5)).state.remaining
            == 0.2
        )
        with pytest.raises(BudgetExhaustedError, match="under the session cap"):
            ledger.charge("s", 20, pure_cost(EPS), "t", b"x", gaze=(300.0, 300.5))
        last = ledger.charge("s", 20, pure_cost({"f": 0.2}), "t", b"x", gaze=(300.0, 300.5))
        assert last.state.remaining == 0.0
        assert ledger.mark_refused(last.outbox_id, "MQTT reason 0x87") is True
        assert [r.chunk_index for r in ledger.refused("s")] == [20]
        assert ledger.verify() == []
    with (
        Ledger(
            url, session_cap=2.0, window_cap=1.0, window_s=4.0, composition="sequential"
        ) as ledger,
        pytest.raises(ConfigError, match="would refill"),
    ):
        ledger.open_session("s")


def test_cli_reads_a_postgresql_ledger(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Ledger(url, session_cap=3.0, composition="sequential") as ledger:
        ledger.charge("fleet-1", 0, pure_cost(EPS), "t", b"x")
    assert main(["ledger", "show", "--path", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(s["session"], s["spent"], s["remaining"]) for s in doc["sessions"]] == [
        ("fleet-1", 0.5, 2.5)
    ]


def test_a_stale_preview_charges_nothing(url: str) -> None:
    with (
        Ledger(url, session_cap=5.0, composition="sequential") as ledger,
        Ledger(url, session_cap=5.0, composition="sequential") as other,
    ):
        preview = ledger.preview("s", pure_cost(EPS))
        other.charge("s", 0, pure_cost(EPS), "t", b"other worker")
        with pytest.raises(StaleStateError, match="preview again"):
            ledger.charge("s", 1, pure_cost(EPS), "t", b"stale", version=preview.version)
        assert (ledger.state("s").chunks, len(ledger.pending())) == (1, 1)
        fresh = ledger.preview("s", pure_cost(EPS))
        assert fresh.state.spent == 1.0
        assert (
            ledger.charge("s", 1, pure_cost(EPS), "t", b"ok", version=fresh.version).state.spent
            == 1.0
        )


def test_a_schema_1_postgresql_ledger_is_refused_not_upgraded(url: str) -> None:
    ddl = V1_SCHEMA.replace(
        "INTEGER PRIMARY KEY AUTOINCREMENT", "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"
    )
    ddl = ddl.replace("BLOB", "BYTEA").replace("x'31'", "'\\x31'").replace("x'33'", "'\\x33'")
    with psycopg.connect(url, autocommit=True) as db:
        for statement in ddl.split(";"):
            if statement.strip():
                db.execute(statement)
    with pytest.raises(LedgerError, match=r"schema version 1.*start a new ledger") as info:
        Ledger(url, session_cap=3.0)
    assert "127.0.0.1" in str(info.value)  # names the database (without a password)
    with psycopg.connect(url, autocommit=True) as db:
        tables = {
            r[0] for r in db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
        assert tables == {"meta", "sessions", "charges", "withheld", "outbox"}  # untouched


def test_concurrent_workers_on_one_session_never_overspend(url: str) -> None:
    """Threads with their own connections, all charging one session: the row lock serialises."""
    cap, n_workers, per_worker = 20.0, 6, 15
    accepted: list[int] = []
    lock = threading.Lock()
    Ledger(url).close()  # create the tables once

    def work(w: int) -> None:
        with Ledger(url, session_cap=cap, composition="sequential") as ledger:
            for j in range(per_worker):
                # Workers overlap on chunk indexes too: each index may be charged only once.
                index = (w % 3) * per_worker + j
                try:
                    ledger.charge("s", index, pure_cost(EPS), "t", str(index).encode())
                    with lock:
                        accepted.append(index)
                except (BudgetExhaustedError, DuplicateChargeError):
                    pass

    threads = [threading.Thread(target=work, args=(w,)) for w in range(n_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(accepted) == len(set(accepted)) == 40  # 20 ε / 0.5, out of 45 distinct indexes
    with Ledger(url) as ledger:
        assert ledger.state("s").spent == cap
        assert sorted(c.chunk_index for c in ledger.charges("s")) == sorted(accepted)
        assert ledger.verify() == []


def test_unreachable_server_is_a_clear_error_without_the_password() -> None:
    port = free_port()
    with pytest.raises(LedgerError, match=r"cannot connect.*:\*\*\*@127.0.0.1") as info:
        Ledger(f"postgresql://gaze:secret@127.0.0.1:{port}/none", timeout_s=2)
    assert "secret" not in str(info.value)


def test_two_workers_on_the_stored_counters_decide_as_a_recount_alone(
    url: str, tmp_path: Path
) -> None:
    """Two workers on one PostgreSQL ledger, answering window checks from the session's stored
    counters, taking turns on the same sessions in single charges, group commits and
    deliveries, decide and report exactly as an SQLite ledger that recounts every window from
    its rows; a stale preview is refused by either; the counters equal a recount."""
    rng = random.Random(5)

    class Clock:  # the ledger's wall clock, moved by the test (back too)
        now = 1.7e9
        monotonic = staticmethod(time.monotonic)

        def time(self) -> float:
            return self.now

    clock = Clock()
    shapes = ({"f0": 0.25, "f1": 0.25}, {"f0": 0.5})
    kwargs: dict[str, Any] = {
        "window_cap": 1.5, "window_s": 20.0, "composition": "sequential", "wall_clock": True,
        "prefetch": False,
    }  # fmt: skip

    def outcome(result: object) -> object:
        if isinstance(result, Exception):
            return type(result).__name__
        assert isinstance(result, Charge)
        return (result.chunk_index, result.total, result.state)

    with mock.patch.object(ledger_module, "time", clock):
        workers = [Ledger(url, **kwargs) for _ in range(2)]
        plain = Ledger(tmp_path / "plain.sqlite", counters=False, **kwargs)  # recounts
        try:
            for _ in range(120):
                clock.now += rng.randint(-3, 12)
                worker = workers[rng.randint(0, 1)]
                if rng.random() < 0.3:
                    picks = [(rng.choice("ab"), 1.7e9 + rng.randint(0, 200)) for _ in range(4)]
                    requests = [
                        ChargeRequest(
                            s, rng.randint(0, 40), pure_cost(shapes[rng.randint(0, 1)]), "t", b"x",
                            gaze=(e - 1.0, e),
                        )
                        for s, e in picks[: rng.randint(1, 4)]
                    ]  # fmt: skip
                    got = [outcome(r) for r in worker.charge_many(requests)]
                    assert got == [outcome(r) for r in plain.charge_many(requests)]
                    continue
                if rng.random() < 0.15:  # the publisher delivers the oldest pending item
                    for ledger in (worker, plain):
                        items = ledger.pending(limit=1)
                        if items:
                            assert ledger.mark_delivered(items[0].id)
                    continue
                session, index = rng.choice("ab"), rng.randint(0, 40)
                end, shape = 1.7e9 + rng.randint(0, 200), shapes[rng.randint(0, 1)]
                stale = rng.random() < 0.1
                got = []
                for ledger in (worker, plain):
                    try:
                        version = ledger.preview(
                            session, pure_cost(shape), gaze=(end - 1, end)
                        ).version
                        result: object = ledger.charge(
                            session, index, pure_cost(shape), "t", b"x", gaze=(end - 1, end),
                            version=version - 1 if stale and version else version,
                        )  # fmt: skip
                    except (BudgetExhaustedError, DuplicateChargeError, StaleStateError) as exc:
                        result = exc
                    got.append(outcome(result))
                assert got[0] == got[1]
                for s in "ab":
                    assert workers[0].state(s) == workers[1].state(s) == plain.state(s)
            assert workers[0].verify() == []
            assert plain.verify() == []
        finally:
            for ledger in (*workers, plain):
                ledger.close()
