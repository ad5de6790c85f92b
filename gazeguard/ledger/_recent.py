"""A session's recent charges in memory, so that a charge's window checks need no SQL.

Every charge checks the hourly window(s) of gaze time its release falls in, the trailing hour
of wall-clock time (``wall_clock`` caps), and reports the trailing window's ε: aggregates over the
session's charges of the last hour (a JOIN of ``charges``, ``charge_events`` and ``events`` that
reads every charge row in the window: ~0.5 ms each at one hour of 16-s chunks, six per chunk
between its preview and its charge). :class:`Recent` holds the same rows — each charge's gaze end,
charge time and events — for the span the checks ask about, and answers the same three questions
(:meth:`Recent.gaze_ends`, :meth:`Recent.window_counts`, :meth:`Recent.charged_since`) from them.

Validity. A :class:`Recent` is *exact* for the session's committed charges at one ``key``: the
session row's (version, spent micro-ε, chunks, last gaze end). Every charge changes the version
in the transaction that inserts it, so a writer that reads the session row in its transaction
(locked) and finds the same key finds the same charges. It answers only windows inside what it
holds (``gaze_lo``, ``wall_lo``); anything else (an old backlog's window) goes to SQL. One is
kept (:class:`RecentCache`) only from a write transaction, and only after its ``COMMIT``, so an
uncommitted or rolled-back charge is never remembered (a preview that finds none reads one in its
snapshot for its own checks and drops it); another worker's charge to the session (a shared
PostgreSQL ledger) changes the version and the next use reloads from SQL. It is a cache of the
ledger's rows, never a source: a restart starts empty and the ledger's tables decide.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from gazeguard.ledger._store import SessionRow, Store

#: A session row's identity for the cache: (version, spent micro-ε, chunks, last gaze end s).
RowKey = tuple[int, int, int, float | None]

#: One charge's events: ((event key, count), …), shared between charges of the same shape.
EventItems = tuple[tuple[str, int], ...]

#: How far beyond the trailing window of gaze and of wall-clock time a session's charges are
#: held, as a fraction of ``window_s`` (0.25: 15 min of gaze and of wall clock past the hour);
#: out-of-order chunks up to this much before the latest gaze time are answered from memory too.
MARGIN = 0.25

#: At most this many sessions are held (least recently used dropped first).
MAX_SESSIONS = 4096


def row_key(row: SessionRow) -> RowKey:
    """The identity of a session row's charges (see the module docstring)."""
    return row.version, row.spent_units, row.chunks, row.last_gaze_end


@dataclass(slots=True)
class Recent:
    """The session's charges with gaze end > ``gaze_lo`` or charge time > ``wall_lo`` (Unix s).

    Held twice, each sorted for :mod:`bisect`: by gaze end (the charges with gaze end >
    ``gaze_lo``) and by charge time (those made after ``wall_lo``), each time with the charge's
    events; a window's counts are then the events of one slice.

    Attributes:
        key: the session row's :func:`row_key` these charges are exact for.
        gaze_lo: every charge whose gaze ends after this (Unix s) is held.
        wall_lo: every charge made after this (Unix s, wall clock) is held.
        gaze: gaze end of each charge held by gaze, Unix s, ascending.
        gaze_events: their events, in the same order.
        created: charge time of each charge held by charge time, Unix s, ascending.
        created_events: their events, in the same order.
    """

    key: RowKey
    gaze_lo: float
    wall_lo: float
    gaze: list[float] = field(default_factory=list)
    gaze_events: list[EventItems] = field(default_factory=list)
    created: list[float] = field(default_factory=list)
    created_events: list[EventItems] = field(default_factory=list)

    @classmethod
    def load(
        cls, store: Store, session: str, key: RowKey, gaze_lo: float, wall_lo: float
    ) -> Recent:
        """Read the session's charges since ``gaze_lo`` (gaze) or ``wall_lo`` (wall clock)."""
        charges: dict[tuple[str, int], tuple[float, float, list[tuple[str, int]]]] = {}
        for stream, idx, gaze_end, created, event, count in store.recent_charges(
            session, gaze_lo, wall_lo
        ):
            entry = charges.get((stream, int(idx)))
            if entry is None:
                entry = charges[stream, int(idx)] = (float(gaze_end), float(created), [])
            entry[2].append((str(event), int(count)))
        out = cls(key, gaze_lo, wall_lo)
        rows = [(g, c, intern(tuple(sorted(items)))) for g, c, items in charges.values()]
        for g, _, ev in sorted((r for r in rows if r[0] > gaze_lo), key=lambda r: r[0]):
            out.gaze.append(g)
            out.gaze_events.append(ev)
        for _, c, ev in sorted((r for r in rows if r[1] > wall_lo), key=lambda r: r[1]):
            out.created.append(c)
            out.created_events.append(ev)
        return out

    def covers_gaze(self, start: float) -> bool:
        """Whether every charge with gaze end > ``start`` (Unix s) is held."""
        return start >= self.gaze_lo

    def covers_wall(self, since: float) -> bool:
        """Whether every charge made after ``since`` (Unix s) is held."""
        return since >= self.wall_lo

    def gaze_ends(self, start: float, end: float) -> list[float]:
        """As :meth:`Store.gaze_ends`: distinct gaze ends in ``[start, end)`` (needs every
        charge with gaze end >= ``start``: ``start > gaze_lo``)."""
        i = bisect.bisect_left(self.gaze, start)
        j = bisect.bisect_left(self.gaze, end, i)
        return list(dict.fromkeys(self.gaze[i:j]))

    def window_counts(self, start: float, end: float) -> dict[str, int]:
        """As :meth:`Store.window_counts`: event counts of the charges whose gaze ends in
        ``(start, end]`` (needs :meth:`covers_gaze` of ``start``)."""
        i = bisect.bisect_right(self.gaze, start)
        j = bisect.bisect_right(self.gaze, end, i)
        return _summed(self.gaze_events[i:j])

    def charged_since(self, since: float) -> dict[str, int]:
        """As :meth:`Store.charged_since`: event counts of the charges made after ``since``
        (needs :meth:`covers_wall` of ``since``)."""
        return _summed(self.created_events[bisect.bisect_right(self.created, since) :])

    def extended(
        self, key: RowKey, gaze_end: float, created: float, events: Mapping[str, int]
    ) -> Recent:
        """A copy with one more charge, exact for the row ``key`` it left (this one unchanged)."""
        ev = intern(tuple(sorted((k, int(n)) for k, n in events.items())))
        out = Recent(
            key, self.gaze_lo, self.wall_lo, self.gaze.copy(), self.gaze_events.copy(),
            self.created.copy(), self.created_events.copy(),
        )  # fmt: skip
        if gaze_end > self.gaze_lo:
            i = bisect.bisect_right(out.gaze, gaze_end)
            out.gaze.insert(i, gaze_end)
            out.gaze_events.insert(i, ev)
        if created > self.wall_lo:
            i = bisect.bisect_right(out.created, created)
            out.created.insert(i, created)
            out.created_events.insert(i, ev)
        return out

    def prune(self, gaze_lo: float, wall_lo: float) -> None:
        """Raise the horizons (never lower them) and drop the charges they no longer hold."""
        self.gaze_lo = max(self.gaze_lo, gaze_lo)
        self.wall_lo = max(self.wall_lo, wall_lo)
        k = bisect.bisect_right(self.gaze, self.gaze_lo)
        if k:
            del self.gaze[:k], self.gaze_events[:k]
        k = bisect.bisect_right(self.created, self.wall_lo)
        if k:
            del self.created[:k], self.created_events[:k]


def _summed(parts: list[EventItems]) -> dict[str, int]:
    """The events of ``parts`` added up (counted per shared tuple first: C speed)."""
    if not parts:
        return {}
    first = parts[0]
    if parts.count(first) == len(parts):  # one shape throughout (a session's chunks)
        times = len(parts)
        return {key: n * times for key, n in first}
    out: dict[str, int] = {}
    for items, times in Counter(parts).items():
        for key, n in items:
            out[key] = out.get(key, 0) + n * times
    return out


_interned: dict[EventItems, EventItems] = {}
_intern_lock = threading.Lock()


def intern(items: EventItems) -> EventItems:
    """One shared tuple per distinct events (a fleet's chunks share a handful of shapes)."""
    with _intern_lock:
        if len(_interned) > 65536:
            _interned.clear()
        return _interned.setdefault(items, items)


class RecentCache:
    """Per session, the :class:`Recent` charges of its last committed state (LRU, thread-safe)."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self._max = max_sessions
        self._lock = threading.Lock()
        self._by_session: OrderedDict[str, Recent] = OrderedDict()

    def get(self, session: str, key: RowKey) -> Recent | None:
        """The session's charges if they are exact for the row ``key``, else ``None``."""
        with self._lock:
            recent = self._by_session.get(session)
            if recent is None or recent.key != key:
                return None
            self._by_session.move_to_end(session)
            return recent

    def install(self, session: str, recent: Recent) -> None:
        """After a COMMIT: ``recent`` is exact for the committed session row."""
        with self._lock:
            self._by_session[session] = recent
            self._by_session.move_to_end(session)
            while len(self._by_session) > self._max:
                self._by_session.popitem(last=False)

    def drop(self, session: str) -> None:
        """Forget the session (its committed state is unknown)."""
        with self._lock:
            self._by_session.pop(session, None)
