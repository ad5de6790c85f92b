"""Batched charges (multi-row statements: ``Ledger.charge_many``, ``Ledger.charge_admitted``,
``Ledger.preview_many``) on real SQLite files and a real PostgreSQL
server: they charge exactly what the same requests charged one ``Ledger.charge`` at a time do
(same rows, same figures, same refusals), a session over its cap is left out alone, and a
(session, stream, index) is charged at most once when two ledgers on one PostgreSQL database
race for it (cohort aggregators too).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

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
from gazeguard.plan.cohort import STREAM
from gazeguard.privacy.accounting import Event
from gazeguard.runtime.cohort import CohortAggregator
from tests._postgres import pg_server, pg_url  # noqa: F401 - fixtures
from tests.runtime.test_cohort import _feed, small_plan

EPS = {"fix_rate": 0.25, "sacc_amp": 0.25}  # 0.5 per chunk
T0 = 1.7e9


def chunk(session: str, i: int, **kw: object) -> ChargeRequest:
    gaze = (T0 + 16.0 * i, T0 + 16.0 * (i + 1))
    kw.setdefault("gaze", gaze)
    return ChargeRequest(
        session, i, pure_cost(EPS), f"gv1/d/{session}/chunks", f"{session}:{i}".encode(), **kw
    )  # type: ignore[arg-type]


def cohort(session: str, bucket: int, events: dict[str, Event]) -> ChargeRequest:
    return ChargeRequest(
        session, bucket, events, f"gv1/d/{session}/cohort", b"receipt",
        gaze=(bucket * 60.0, bucket * 60.0 + 60.0), stream=STREAM,
    )  # fmt: skip


def snapshot(ledger: Ledger) -> dict[str, object]:
    """Everything the ledger holds about its sessions but wall-clock times and outbox ids."""
    out: dict[str, object] = {}
    for s in sorted(ledger.sessions()):
        st = ledger.state(s)
        out[s] = (
            {
                stream: [
                    (c.chunk_index, c.epsilon, c.gaze_start, c.gaze_end)
                    for c in ledger.charges(s, stream)
                ]
                for stream in ("chunks", STREAM)
            },
            [(w[0], w[1]) for w in ledger.withheld(s)],
            (st.epsilon, st.epsilon_window, st.spent, st.chunks, st.withheld, st.remaining,
             st.window_remaining, st.last_chunk, st.last_gaze_end, st.version, st.pending),
        )  # fmt: skip
    out["pending"] = [(p.session, p.stream, p.chunk_index, p.payload) for p in ledger.pending()]
    out["verify"] = ledger.verify()
    return out


def sequential(ledger: Ledger, requests: list[ChargeRequest]) -> list[object]:
    """Each request charged alone (``Ledger.charge``): its Charge or the refusal's type."""
    out: list[object] = []
    for q in requests:
        try:
            out.append(
                ledger.charge(
                    q.session,
                    q.chunk_index,
                    q.cost,
                    q.topic,
                    q.payload,
                    gaze=q.gaze,
                    stream=q.stream,
                    version=q.version,
                )
            )
        except (BudgetExhaustedError, DuplicateChargeError, StaleStateError, ConfigError) as exc:
            out.append(exc)
    return out


def outcome(results: list[object]) -> list[object]:
    """What each result says, but outbox ids: the state a charge reports, or the refusal."""
    return [
        (r.session, r.chunk_index, r.total, r.state) if isinstance(r, Charge) else type(r)
        for r in results
    ]


@pytest.fixture(params=["sqlite", "postgresql"])
def locations(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], str]]:
    """A factory of fresh ledger locations: SQLite files, or databases on one PostgreSQL."""
    if request.param == "sqlite":
        n = iter(range(100))
        yield lambda: str(tmp_path / f"l{next(n)}.sqlite")
        return
    server = request.getfixturevalue("pg_server")
    psycopg = pytest.importorskip("psycopg")
    made: list[str] = []

    def fresh() -> str:
        name = f"batched_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        made.append(name)
        return server.rsplit("/", 1)[0] + f"/{name}"

    yield fresh
    with psycopg.connect(server, autocommit=True) as admin:
        for name in made:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


def _history(ledger: Ledger, events: dict[str, Event]) -> None:
    """Sessions a (2 chunks), b (3 chunks, at its cap), c (1 chunk, a cohort bucket)."""
    for q in [chunk("a", 0), chunk("a", 1), chunk("b", 0), chunk("b", 1), chunk("b", 2),
              chunk("c", 0), cohort("c", 28_333_333, events)]:  # fmt: skip
        ledger.charge(
            q.session, q.chunk_index, q.cost, q.topic, q.payload,
            gaze=q.gaze, stream=q.stream,
        )  # fmt: skip


def test_batched_charges_equal_sequential_ones(locations: Callable[[], str]) -> None:
    """The same history and the same group of requests — new and known sessions, one over its
    cap, a duplicate, a stale version, a session twice, an out-of-order release, cohort events —
    charged one at a time and as one batch: the same results, rows, figures and outbox."""
    plan = small_plan(budget=5.0)
    events: dict[str, Event] = {STREAM: plan.event}
    b = 28_333_334
    requests = [
        chunk("a", 2), chunk("b", 3),  # b: over its session cap, left out alone
        chunk("n1", 0), cohort("n2", b, events), chunk("c", 1),
        chunk("a", 1),  # a duplicate
        chunk("c", 2, version=0),  # stale
        cohort("a", b, events), cohort("b", b, events), cohort("c", b, events),
        chunk("a", 3), chunk("n1", 1),  # a session twice: after its first
        chunk("n3", 5, gaze=(T0, T0 + 16.0)), chunk("n3", 4, gaze=(T0 - 40.0, T0 - 24.0)),
        cohort("c", b - 5, events),  # before the session's latest gaze: out of order
    ]  # fmt: skip
    kw = {"session_cap": 1.6, "window_cap": 10.0, "window_s": 3664.0, "delta": 1e-6}
    results = {}
    snaps = {}
    for how in ("sequential", "charge_many"):
        with Ledger(locations(), **kw) as ledger:  # type: ignore[arg-type]
            _history(ledger, events)
            got = (
                sequential(ledger, requests) if how == "sequential"
                else ledger.charge_many(requests)
            )  # fmt: skip
            results[how] = outcome(got)
            snaps[how] = snapshot(ledger)
    assert results["charge_many"] == results["sequential"]
    assert snaps["charge_many"] == snaps["sequential"]
    seq = results["sequential"]
    assert isinstance(seq[0], tuple)
    assert seq[1] is BudgetExhaustedError, "b alone left out"
    assert seq[5] is DuplicateChargeError
    assert seq[6] is StaleStateError
    assert snaps["sequential"]["verify"] == []


def test_mark_delivered_many_marks_the_pending_ones_in_one_transaction(
    locations: Callable[[], str],
) -> None:
    """A drain's pass is marked in one call: the pending items become delivered (payloads
    dropped), ids already delivered, refused or unknown are skipped, and every session's
    pending counter follows (verify recounts them from the rows)."""
    plan = small_plan(budget=5.0)
    events: dict[str, Event] = {STREAM: plan.event}
    with Ledger(locations(), session_cap=1.6) as ledger:
        _history(ledger, events)
        items = ledger.pending()
        assert len(items) == 7
        assert ledger.mark_delivered(items[0].id) is True
        assert ledger.mark_refused(items[1].id, "not authorised") is True
        asked = [items[k].id for k in (0, 1, 2, 4, 6)] + [10_000]
        assert ledger.mark_delivered_many(asked) == 3
        assert [p.id for p in ledger.pending()] == [items[k].id for k in (3, 5)]
        assert ledger.mark_delivered_many(asked) == 0
        assert {s: ledger.state(s).pending for s in "abc"} == {"a": 0, "b": 1, "c": 1}
        assert ledger.verify() == []


def test_charge_admitted_charges_what_it_told_decide_with_decides_messages(
    locations: Callable[[], str],
) -> None:
    """``charge_admitted``: ``decide`` is told exactly the requests that ``charge_many`` would
    admit (a session over its cap and one charged before are left out, with the refusal
    ``charge_many`` gives), and those are charged with the messages it returns, in its order:
    the same rows and figures as ``charge_many`` of the admitted ones with those messages."""
    plan = small_plan(budget=5.0)
    events: dict[str, Event] = {STREAM: plan.event}
    b = 28_333_333
    asked = [cohort("a", b + 1, events), chunk("b", 3), chunk("new", 0), cohort("c", b, events),
             cohort("n2", b + 1, events)]  # fmt: skip
    told: list[list[int]] = []

    def decide(positions: list[int]) -> list[tuple[str, bytes]]:
        told.append(positions)
        return [(f"t/{i}", f"message {i}".encode()) for i in positions]

    with Ledger(locations(), session_cap=1.6) as ledger:
        _history(ledger, events)
        got = ledger.charge_admitted(asked, decide)
        admitted = snapshot(ledger)
    assert told == [[0, 2, 4]]
    assert isinstance(got[1], BudgetExhaustedError)
    assert isinstance(got[3], DuplicateChargeError)
    assert got[3].what == "charged"
    with Ledger(locations(), session_cap=1.6) as ledger:
        _history(ledger, events)
        same = [replace(asked[i], topic=f"t/{i}", payload=f"message {i}".encode())
                for i in (0, 2, 4)]  # fmt: skip
        many = ledger.charge_many(same)
        assert snapshot(ledger) == admitted
    assert outcome([got[i] for i in (0, 2, 4)]) == outcome(many)
    assert admitted["verify"] == []


def test_charge_admitted_writes_nothing_when_decide_fails_or_miscounts(
    locations: Callable[[], str],
) -> None:
    plan = small_plan(budget=5.0)
    events: dict[str, Event] = {STREAM: plan.event}
    asked = [cohort("a", 28_333_334, events), cohort("new", 28_333_334, events)]

    def fails(positions: list[int]) -> list[tuple[str, bytes]]:
        raise ConfigError("fleet.max_sessions", len(positions), "at most 1")

    with Ledger(locations(), session_cap=1.6) as ledger:
        _history(ledger, events)
        before = snapshot(ledger)
        with pytest.raises(ConfigError, match="max_sessions"):
            ledger.charge_admitted(asked, fails)
        assert snapshot(ledger) == before
        with pytest.raises(LedgerError, match="1 messages for 2"):
            ledger.charge_admitted(asked, lambda positions: [("t", b"one")])
        assert snapshot(ledger) == before
        with pytest.raises(ConfigError, match="each session once"):
            ledger.charge_admitted([*asked, cohort("a", 28_333_335, events)], fails)
        assert snapshot(ledger) == before


def test_preview_many_equals_previews_and_names_what_was_charged(
    locations: Callable[[], str],
) -> None:
    plan = small_plan(budget=5.0)
    events: dict[str, Event] = {STREAM: plan.event}
    with Ledger(locations(), session_cap=1.6) as ledger:
        _history(ledger, events)
        asked = [chunk("a", 2), chunk("b", 3), chunk("new", 0), cohort("c", 28_333_333, events),
                 cohort("a", 28_333_333, events)]  # fmt: skip
        got = ledger.preview_many(asked)
        assert isinstance(got[1], BudgetExhaustedError)
        assert isinstance(got[3], DuplicateChargeError)
        assert got[3].what == "charged"
        for q, p in zip(asked, got, strict=True):
            if isinstance(p, Exception):
                continue
            one = ledger.preview(q.session, q.cost, gaze=q.gaze)
            assert p == one


def test_two_ledgers_racing_charge_a_release_once(pg_url: str) -> None:  # noqa: F811
    """Two workers (two ledgers, two connections) charge overlapping groups of one PostgreSQL
    database at once, again and again (``charge_many``): each (session, index) is charged
    exactly once, and a group that lost the race for one of its releases is refused just that
    release."""
    sessions = [f"s{i:03d}" for i in range(60)]
    with Ledger(pg_url) as one, Ledger(pg_url) as two:
        won: dict[str, list[tuple[str, int]]] = {"one": [], "two": []}
        errors: list[BaseException] = []

        def work(name: str, ledger: Ledger, mine: list[str]) -> None:
            try:
                for i in range(8):
                    got = ledger.charge_many([chunk(s, i) for s in mine])
                    won[name] += [(c.session, c.chunk_index) for c in got if isinstance(c, Charge)]
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=work, args=("one", one, sessions[:40])),
            threading.Thread(target=work, args=("two", two, sessions[20:][::-1])),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        both = won["one"] + won["two"]
        assert len(both) == len(set(both)), "a release charged twice"
        # every release was charged by one of them
        assert sorted(both) == sorted((s, i) for s in sessions for i in range(8))
        for s in one.sessions():
            assert [c.chunk_index for c in one.charges(s)] == sorted(
                {c.chunk_index for c in one.charges(s)}
            )
        assert one.verify() == []


def test_two_cohort_workers_racing_on_a_moved_session_charge_it_once(
    pg_url: str,  # noqa: F811
) -> None:
    """Two aggregators (two ledgers on one PostgreSQL database) release the same bucket at the
    same moment, both holding a session that moved from one to the other: it is charged once,
    and every charged (session, bucket) went out in exactly one aggregate."""
    plan = small_plan(budget=5.0)
    for attempt in range(4):
        rng = np.random.default_rng(attempt)
        bucket = 10 + attempt
        with Ledger(pg_url) as l1, Ledger(pg_url) as l2:
            first = CohortAggregator(plan, l1, cohort="lab", worker="w1", insecure_seed=1)
            second = CohortAggregator(plan, l2, cohort="lab", worker="w2", insecure_seed=2)
            _feed(first, 200, rng, bucket * 60.0)  # s0000 … s0199
            x = np.column_stack([rng.uniform(0, 5, 20), rng.uniform(2, 8, 20)])
            p = rng.dirichlet(np.ones(3), 20)
            t = bucket * 60.0 + np.linspace(1, 59, 20)
            for s in ["s0199", *(f"s{k:04d}" for k in range(1000, 1150))]:
                second.add("hmd", s, x, t, p)  # s0199 moved: both hold it
            out: dict[str, list[object]] = {}
            go = threading.Barrier(2)

            def release(
                name: str,
                agg: CohortAggregator,
                go: threading.Barrier = go,
                out: dict[str, list[object]] = out,
            ) -> None:
                go.wait()
                out[name] = list(agg.release_due(1e9))

            threads = [threading.Thread(target=release, args=a) for a in
                       (("w1", first), ("w2", second))]  # fmt: skip
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            released = [r for rs in out.values() for r in rs]
            assert 1 <= len(released) <= 2
            in_aggregates = [s for r in released for s in r.sessions]  # type: ignore[attr-defined]
            assert len(in_aggregates) == len(set(in_aggregates)), "a session in two aggregates"
            charged = [
                s for s in l1.sessions() for c in l1.charges(s, STREAM) if c.chunk_index == bucket
            ]
            assert sorted(charged) == sorted(in_aggregates), "charged = released, once each"
            assert "s0199" in charged
            carried = [
                q for q in l1.pending()
                if q.topic.endswith("/aggregates") and q.chunk_index == bucket
            ]  # fmt: skip
            assert len(carried) == len(released)
            assert l1.verify() == []
