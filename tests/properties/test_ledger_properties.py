"""The ledger never exceeds its budget, whatever the sequence of charges, withholds, deliveries
and restarts: a model-based (stateful) Hypothesis test against a real SQLite file. The window cap
counts gaze time; chunk i's gaze ends at T0 + i s, so a window of w s holds w chunk indexes."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from gazeguard.errors import BudgetExhaustedError
from gazeguard.ledger import UNITS_PER_EPSILON, DuplicateChargeError, Ledger
from gazeguard.ledger._model import to_units_down, to_units_up

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
            charge = self.ledger.charge(session, index, eps, "t", payload, gaze=gaze)
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


@given(st.floats(min_value=1e-12, max_value=1e4, allow_nan=False, allow_infinity=False))
def test_charges_round_up_and_caps_round_down(epsilon: float) -> None:
    up, down = to_units_up(epsilon), to_units_down(epsilon)
    assert up / UNITS_PER_EPSILON >= epsilon  # a charge never costs less than asked
    assert down / UNITS_PER_EPSILON <= epsilon  # a cap never allows more than configured
    assert 0 <= up - down <= 1
