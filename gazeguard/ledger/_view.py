"""A session's window aggregates inside one transaction (:class:`WindowView`): answered from its
stored counters (``session_counters``) moved up to the window asked about, or counted from its
charge rows; the answers are the same either way (:meth:`gazeguard.ledger.Ledger.verify` checks
the counters against the rows).
"""

from __future__ import annotations

import logging

from gazeguard.ledger._store import Counters, Store
from gazeguard.ledger.policy import Counts

log = logging.getLogger("gazeguard.ledger")

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
        c = self.counters
        if c is not None and (c.gaze_lo is None or start >= c.gaze_lo):
            if start == c.gaze_lo:
                return c.gaze
            left = self.store.gaze_between(self.session, c.gaze_lo, start)
            out = counts_without(c.gaze, left)
            if out is not None:
                return out
            self._damaged("gaze", c.gaze, left)
        return self.store.gaze_between(self.session, start, None)

    def wall_since(self, since: float) -> Counts:
        """Event counts of the session's charges made after ``since`` (Unix s, wall clock)."""
        c = self.counters
        if c is not None and (c.wall_lo is None or since >= c.wall_lo):
            if since == c.wall_lo:
                return c.wall
            left = self.store.wall_between(self.session, c.wall_lo, since)
            out = counts_without(c.wall, left)
            if out is not None:
                return out
            self._damaged("wall", c.wall, left)
        return self.store.wall_between(self.session, since, None)

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
