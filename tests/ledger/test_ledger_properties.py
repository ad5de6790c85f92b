"""The ledger never exceeds its budget, whatever the sequence of charges, withholds, deliveries
and restarts: a model-based (stateful) Hypothesis test against a real SQLite file. The window cap
counts gaze time; chunk i's gaze ends at T0 + i s, so a window of w s holds w chunk indexes."""

from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from gazeguard.core.errors import BudgetExhaustedError
from gazeguard.ledger import (
    UNITS_PER_EPSILON,
    Charge,
    ChargeRequest,
    DuplicateChargeError,
    Ledger,
    StaleStateError,
    pure_cost,
)
from gazeguard.ledger import _ledger as _ledger_module
from gazeguard.ledger._model import to_units_down, to_units_up
from gazeguard.ledger._store import Store
from gazeguard.ledger._view import WindowView

SESSIONS = ("a", "b")
MILLI = UNITS_PER_EPSILON // 1000  # model ε in integer milli-ε: exact in decimal and in units
T0 = 1.7e9  # Unix time of chunk 0's gaze


class LedgerMachine(RuleBasedStateMachine):
    """Model: per session, the charged chunks with their cost in units, withheld chunks, outbox."""

    def __init__(self) -> None:
        super().__init__()
        self._dir = tempfile.TemporaryDirectory()
        self.path = Path(self._dir.name) / "ledger.sqlite"
        self.charged: dict[str, dict[int, int]] = {s: {} for s in SESSIONS}
        self.withheld: dict[str, set[int]] = {s: set() for s in SESSIONS}
        self.outbox: list[tuple[int, str, int]] = []  # (id, session, chunk), undelivered

    @initialize(
        cap=st.none() | st.integers(1, 8000),
        window=st.none() | st.tuples(st.integers(1, 6), st.integers(1, 4000)),
    )
    def open(self, cap: int | None, window: tuple[int, int] | None) -> None:
        self.cap = None if cap is None else cap * MILLI
        self.w, self.w_cap = (None, None) if window is None else (window[0], window[1] * MILLI)
        self.ledger = self._open()

    def _open(self) -> Ledger:
        return Ledger(
            self.path,
            synchronous="NORMAL",
            session_cap=None if self.cap is None else self.cap / UNITS_PER_EPSILON,
            window_cap=None if self.w_cap is None else self.w_cap / UNITS_PER_EPSILON,
            window_s=float(self.w or 3600),
        )

    def _worst_window_with(self, session: str, index: int, cost: int) -> int:
        assert self.w is not None
        spent = self.charged[session]
        return max(
            sum(spent.get(i, 0) for i in range(start, start + self.w)) + cost
            for start in range(index - self.w + 1, index + 1)
        )

    @rule(
        session=st.sampled_from(SESSIONS),
        index=st.integers(0, 25),
        costs=st.lists(st.integers(1, 1500), min_size=1, max_size=4),
    )
    def charge(self, session: str, index: int, costs: list[int]) -> None:
        eps = {f"f{k}": c / 1000 for k, c in enumerate(costs)}
        total = sum(costs) * MILLI
        if index in self.charged[session] or index in self.withheld[session]:
            expected: str | None = "duplicate"
        elif self.cap is not None and sum(self.charged[session].values()) + total > self.cap:
            expected = "session"
        elif self.w_cap is not None and self._worst_window_with(session, index, total) > self.w_cap:
            expected = f"per-{self.w}-s-of-gaze"
        else:
            expected = None
        outcome: str | None = None
        try:
            # Chunk i's gaze ends at T0 + i s: a window of w s of gaze holds w consecutive chunks.
            gaze = (T0 + index - 0.5, T0 + index)
            payload = f"{session}{index}".encode()
            charge = self.ledger.charge(session, index, pure_cost(eps), "t", payload, gaze=gaze)
        except DuplicateChargeError:
            outcome = "duplicate"
        except BudgetExhaustedError as exc:
            outcome = exc.cap
        assert outcome == expected
        if outcome is None:
            assert round(charge.total * UNITS_PER_EPSILON) == total
            self.charged[session][index] = total
            self.outbox.append((charge.outbox_id, session, index))

    @rule(session=st.sampled_from(SESSIONS), index=st.integers(0, 25))
    def withhold(self, session: str, index: int) -> None:
        try:
            self.ledger.withhold(session, index, 0.5, "test")
        except DuplicateChargeError:
            assert index in self.charged[session]
        else:
            assert index not in self.charged[session]
            self.withheld[session].add(index)

    @rule()
    def deliver_first(self) -> None:
        pending = self.ledger.pending(limit=1)
        assert [(p.id, p.session, p.chunk_index) for p in pending] == self.outbox[:1]
        if pending:
            assert self.ledger.mark_delivered(pending[0].id)
            self.outbox.pop(0)

    @rule()
    def restart(self) -> None:
        self.ledger.close()
        self.ledger = self._open()

    @invariant()
    def never_exceeds_the_budget_and_matches_the_model(self) -> None:
        for s in SESSIONS:
            spent = self.charged[s]
            state = self.ledger.state(s)
            assert round(state.spent * UNITS_PER_EPSILON) == sum(spent.values())
            assert (state.chunks, state.withheld) == (len(spent), len(self.withheld[s]))
            if self.cap is not None:
                assert round(state.spent * UNITS_PER_EPSILON) <= self.cap
            if self.w is not None and self.w_cap is not None and spent:
                for start in range(min(spent) - self.w + 1, max(spent) + 1):
                    assert sum(spent.get(i, 0) for i in range(start, start + self.w)) <= self.w_cap
        pending = self.ledger.pending()
        assert [(p.id, p.session, p.chunk_index) for p in pending] == self.outbox

    def teardown(self) -> None:
        if hasattr(self, "ledger"):
            assert self.ledger.verify() == []
            self.ledger.close()
        self._dir.cleanup()


LedgerMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_ledger_never_exceeds_its_budget = LedgerMachine.TestCase
test_ledger_never_exceeds_its_budget.pytestmark = [pytest.mark.slow]  # ~6 s of stateful runs


@given(st.floats(min_value=1e-12, max_value=1e4, allow_nan=False, allow_infinity=False))
def test_charges_round_up_and_caps_round_down(epsilon: float) -> None:
    up, down = to_units_up(epsilon), to_units_down(epsilon)
    assert up / UNITS_PER_EPSILON >= epsilon  # a charge never costs less than asked
    assert down / UNITS_PER_EPSILON <= epsilon  # a cap never allows more than configured
    assert 0 <= up - down <= 1


# ---- the counters a ledger stores per session (session_counters) ---------------------------------

RECENT_W = 20.0  # window, s of gaze (and of wall clock): small, so that windows slide and refuse


class _Clock:
    """The ledger's wall clock (``time`` in gazeguard.ledger._ledger), moved by the test."""

    def __init__(self) -> None:
        self.now = T0

    def time(self) -> float:
        return self.now

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()


_SHAPES = ({"f0": 0.25, "f1": 0.25}, {"f0": 0.5}, {"f0": 0.25, "f1": 0.5})

_op = st.one_of(
    st.tuples(  # one charge: by worker, session, index, gaze end (s after T0), clock step (s),
        st.just("charge"),  # shape, stale
        st.integers(0, 1),
        st.sampled_from(SESSIONS),
        st.integers(0, 12),
        st.integers(0, 60),
        st.integers(-3, 12),
        st.integers(0, len(_SHAPES) - 1),
        st.booleans(),
    ),
    st.tuples(  # a group commit by a worker: several (session, index, gaze end, shape)
        st.just("group"),
        st.integers(0, 1),
        st.lists(
            st.tuples(
                st.sampled_from(SESSIONS),
                st.integers(0, 12),
                st.integers(0, 60),
                st.integers(0, len(_SHAPES) - 1),
            ),
            min_size=1,
            max_size=4,
        ),
        st.integers(-3, 12),
    ),
    st.tuples(st.just("withhold"), st.sampled_from(SESSIONS), st.integers(0, 12)),
    st.tuples(  # the publisher: the k-th pending item delivered (or refused) through a worker
        st.just("deliver"), st.integers(0, 1), st.integers(0, 5), st.booleans()
    ),
    st.tuples(st.just("reopen")),
)


def _outcome(result: object) -> object:
    if isinstance(result, Exception):
        return type(result).__name__
    assert isinstance(result, Charge)
    return (result.chunk_index, result.total, result.state)


def _counters_agree_with_rows(ledger: Ledger, session: str, probes: list[float]) -> None:
    """The session's stored counters are what its rows give for their bounds, and the windows
    they answer (every start at or after their bounds) are the rows' counts."""
    with ledger.backend.read() as sql:
        store = Store(sql)
        row = store.session(session)
        if row is None:
            return
        stored = store.counters(session)
        assert stored is not None
        assert stored == store.recount(session, stored.gaze_lo, stored.wall_lo)
        view = WindowView(store, session, stored)
        for a in probes:
            assert view.gaze_since(a) == store.gaze_between(session, a, None)
            assert view.wall_since(a) == store.wall_between(session, a, None)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(_op, min_size=1, max_size=25),
    window_cap=st.sampled_from([1.0, 1.5, 3.0]),
    wall_clock=st.booleans(),
)
def test_the_stored_counters_decide_as_a_recount_does(
    ops: list[tuple[Any, ...]], window_cap: float, wall_clock: bool
) -> None:
    """Two workers sharing one ledger file, answering window checks, trailing figures and
    pending counts from the stored counters, and a ledger that recounts the rows every time
    (``counters=False``) make the same decisions and report the same states, whatever the
    sequence: the workers taking turns on a session, out-of-order gaze, a wall clock that steps
    back, duplicates, refusals (a savepoint rolled back in a group), stale versions, withholds,
    deliveries and refusals by the broker, reopens; and after each step the counters equal a
    recount of the rows and answer every window from their bounds on as the rows do."""
    clock = _Clock()
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(_ledger_module, "time", clock):
        kwargs: dict[str, Any] = {
            "synchronous": "NORMAL", "window_cap": window_cap, "window_s": RECENT_W,
            "composition": "sequential", "wall_clock": wall_clock, "prefetch": False,
        }  # fmt: skip
        # two workers charging one ledger file, with the counters
        workers = [Ledger(Path(tmp) / "held.sqlite", **kwargs) for _ in range(2)]
        plain = Ledger(Path(tmp) / "plain.sqlite", counters=False, **kwargs)  # recounts
        try:
            for op in ops:
                if op[0] == "charge":
                    _, worker, session, index, end, step, shape, stale = op
                    clock.now += step
                    gaze = (T0 + end - 1.0, T0 + end)
                    got = []
                    for ledger in (workers[worker], plain):
                        version: int | None = None
                        try:
                            p = ledger.preview(session, pure_cost(_SHAPES[shape]), gaze=gaze)
                            version = p.version - (1 if stale and p.version else 0)
                            got.append(("preview", p.state))
                        except BudgetExhaustedError as exc:
                            got.append(("preview", type(exc).__name__))
                        try:
                            result: object = ledger.charge(
                                session, index, pure_cost(_SHAPES[shape]), "t", b"x", gaze=gaze,
                                version=version,
                            )  # fmt: skip
                        except (BudgetExhaustedError, DuplicateChargeError, StaleStateError) as e:
                            result = e
                        else:  # the state a charge reports is the one the tables then hold
                            assert isinstance(result, Charge)
                            assert result.state == ledger.state(session)
                        got.append(_outcome(result))
                    assert got[:2] == got[2:]
                elif op[0] == "group":
                    _, worker, items, step = op
                    clock.now += step
                    requests = [
                        ChargeRequest(
                            s, i, pure_cost(_SHAPES[k]), "t", b"x", gaze=(T0 + e - 1.0, T0 + e)
                        )
                        for s, i, e, k in items
                    ]
                    a, b = workers[worker].charge_many(requests), plain.charge_many(requests)
                    assert [_outcome(r) for r in a] == [_outcome(r) for r in b]
                elif op[0] == "withhold":
                    _, session, index = op
                    for ledger in (workers[0], plain):
                        with contextlib.suppress(DuplicateChargeError):  # (charged already)
                            ledger.withhold(session, index, 0.5, "test")
                elif op[0] == "deliver":
                    _, worker, k, refuse = op
                    marked = []
                    for ledger in (workers[worker], plain):
                        items = ledger.pending()
                        if k < len(items):
                            item = items[k]
                            marked.append((item.session, item.chunk_index))
                            if refuse:
                                assert ledger.mark_refused(item.id, "test")
                            else:
                                assert ledger.mark_delivered(item.id)
                    assert marked[:1] == marked[1:]
                else:
                    workers[0].close()
                    workers[0] = Ledger(Path(tmp) / "held.sqlite", **kwargs)
                probes = [T0 + x for x in (-30.0, -1.0, 0.0, 5.5, 19.0, 20.0, 41.0, 61.0)]
                probes += [clock.now - RECENT_W, clock.now - 3.0]
                for session in SESSIONS:
                    for ledger in workers:
                        assert ledger.state(session) == plain.state(session)
                        _counters_agree_with_rows(ledger, session, probes)
            assert workers[0].verify() == []
            assert plain.verify() == []
        finally:
            for ledger in (*workers, plain):
                ledger.close()
