"""A session's window aggregates inside one transaction (:class:`WindowView`): answered from its
stored counters (columns of its ``sessions`` row) moved up to the window asked about, or
counted from its charge rows; the answers are the same either way
(:meth:`gazeguard.ledger.Ledger.verify` checks the counters against the rows).
"""

from __future__ import annotations

import logging

from gazeguard.ledger._store import Clock, Counters, Store
from gazeguard.ledger.policy import Counts

log = logging.getLogger("gazeguard.ledger")

#: Event counts over a window, and the earliest gaze end (or charge time) among them (Unix s;
#: ``None``: no charge).
Window = tuple[Counts, float | None]

#: The counters of a session without charges.
EMPTY_COUNTERS = Counters(None, None, {}, {}, 0)


class WindowView:
    """A session's window aggregates inside one transaction: from its stored counters (moved
    up to the window asked about by taking off the charges that left it: those rows only), or,
    for a window they do not hold or with ``counters`` ``None``, counted from the rows. The
    answers are the same either way."""

    __slots__ = ("counters", "session", "store")

    def __init__(self, store: Store, session: str, counters: Counters | None) -> None:
        self.store = store
        self.session = session
        self.counters = counters

    def gaze_since(self, start: float) -> Counts:
        """Event counts of the session's charges whose gaze ends after ``start`` (Unix s)."""
        return self.since(start, None)[0][0]

    def wall_since(self, since: float) -> Counts:
        """Event counts of the session's charges made after ``since`` (Unix s, wall clock)."""
        return self.since(None, since)[1][0]

    def since(self, gaze_start: float | None, wall_since: float | None) -> tuple[Window, Window]:
        """:meth:`gaze_since` and :meth:`wall_since` together, each with the earliest gaze end
        (charge time) among the charges it counts (``None``: none); ``None`` asks nothing and
        gets ``({}, None)``. Counters whose earliest charge is after the asked start answer
        without reading anything; otherwise whatever must be read is read in one statement."""
        c = self.counters
        asked: list[tuple[int, Clock, float, float | None, Counts, float | None]] = []
        if gaze_start is not None:
            kept = (c.gaze_lo, c.gaze, c.gaze_first) if c else (None, {}, None)
            asked.append((0, "gaze", gaze_start, *kept))
        if wall_since is not None:
            kept = (c.wall_lo, c.wall, c.wall_first) if c else (None, {}, None)
            asked.append((1, "wall", wall_since, *kept))
        out: list[Window] = [({}, None), ({}, None)]
        ranges: list[tuple[Clock, float | None, float | None]] = []
        held_of: list[tuple[int, Counts | None]] = []  # per range: asked index, counts it moves
        for n, clock, start, lo, counts, first in asked:
            if c is not None and (lo is None or start >= lo):
                if first is None or first > start:  # no charge left the window
                    out[n] = (counts, first)
                    continue
                ranges.append((clock, lo, start))  # the charges that left it
                held_of.append((n, counts))
            else:
                ranges.append((clock, start, None))  # no counters for it: count the window
                held_of.append((n, None))
        read = self.store.events_between(self.session, ranges, firsts=True) if ranges else []
        for (n, held), (clock, _, new_lo), (counted, first) in zip(
            held_of, ranges, read, strict=True
        ):
            if held is None:
                out[n] = (counted, first)
                continue
            rest = counts_without(held, counted)
            if rest is None:
                self._damaged(clock, held, counted)
                out[n] = self.store.events_between(
                    self.session, [(clock, new_lo, None)], firsts=True
                )[0]
            else:
                out[n] = (rest, first)
        return out[0], out[1]

    def window(self, start: float, end: float) -> Counts:
        """Event counts of the session's charges whose gaze ends in ``(start, end]`` (Unix s)."""
        return self.store.gaze_between(self.session, start, end)

    def gaze_ends(self, start: float, end: float) -> list[float]:
        """Distinct gaze ends (Unix s) of the session's charges in ``[start, end)``."""
        return self.store.gaze_ends(self.session, start, end)

    def pending(self) -> int:
        """The session's pending outbox items."""
        c = self.counters
        return self.store.pending_count(self.session) if c is None else c.pending

    def _damaged(self, which: str, held: Counts, left: Counts) -> None:
        log.error(
            "session %r: its %s counters %s cannot lose the charges %s that left the window; "
            "counting from the rows (Ledger.verify() reports the difference)",
            self.session, which, dict(held), dict(left),
        )  # fmt: skip


def counts_without(held: Counts, left: Counts) -> dict[str, int] | None:
    """``held`` minus ``left`` (zeros dropped), or ``None`` if ``left`` is not part of it."""
    out = dict(held)
    for key, n in left.items():
        rest = out.get(key, 0) - n
        if rest < 0:
            return None
        if rest:
            out[key] = rest
        else:
            del out[key]
    return out
