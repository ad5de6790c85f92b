"""The ledger: one transaction per write, the policy decides, the store stores.

Written once against the storage protocol (:class:`~gazeguard.ledger.LedgerBackend` +
:class:`~gazeguard.ledger._store.Store`); the accounting is :mod:`gazeguard.ledger.policy`. A
release's arguments are checked before the transaction (:mod:`gazeguard.ledger._request`), its
windows are read through :mod:`gazeguard.ledger._view`, and the next release's figures are
composed off the release's path (:mod:`gazeguard.ledger._prefetch`). This module reads the wall
clock (``time``) for every transaction.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

from gazeguard.core.errors import BudgetExhaustedError, ConfigError
from gazeguard.ledger import policy
from gazeguard.ledger._compose import LedgerComposer
from gazeguard.ledger._model import (
    MAX_CAP,
    UNITS_PER_EPSILON,
    Charge,
    ChargeRecord,
    DuplicateChargeError,
    LedgerBackend,
    LedgerError,
    LedgerState,
    OutboxItem,
    RefusedItem,
    Sql,
    StaleStateError,
    Synchronous,
    to_units_down,
    to_units_up,
)
from gazeguard.ledger._prefetch import Prefetch
from gazeguard.ledger._request import (
    ChargeRequest,
    Cost,
    Release,
    check_release,
    checked_release,
    gaze_span,
    validated_request,
)
from gazeguard.ledger._sqlite import SqliteBackend
from gazeguard.ledger._store import ChargeRow, Counters, SessionRow, Store, after_charge
from gazeguard.ledger._view import EMPTY_COUNTERS, WindowView
from gazeguard.ledger.policy import Caps, Composer, Counts

log = logging.getLogger("gazeguard.ledger")


def is_url(location: object) -> bool:
    """True for a ``postgresql://`` (or ``postgres://``) URL."""
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


@dataclass(frozen=True, slots=True)
class Preview:
    """What a release would leave the session at, if charged now.

    Attributes:
        state: the session's state right after the release.
        version: the session's version the preview was made at; pass it to
            :meth:`Ledger.charge` (a :class:`StaleStateError` there means: preview again).
    """

    state: LedgerState
    version: int


#: Why :meth:`Ledger.charge_many` refused one request (nothing of it was written).
LedgerRefusal = (
    BudgetExhaustedError | DuplicateChargeError | StaleStateError | ConfigError | TypeError
)

#: A release :meth:`Ledger._check_batch` admitted: its position, request, release, gaze span,
#: session row, binding caps and the counters after it.
_Admitted = tuple[int, ChargeRequest, Release, tuple[float, float], SessionRow, Caps, Counters]

#: :meth:`Ledger.charge_admitted`'s callback: the positions admitted → one (topic, payload) each.
Decide = Callable[[list[int]], Sequence[tuple[str, bytes]]]

#: How many of its latest outbox ids a :class:`Ledger` remembers as its own
#: (:meth:`Ledger.enqueued_here`).
ENQUEUED_KEPT = 4096


class Ledger:
    """The per-session privacy ledger with its outbox (module docstring of the package).

    Args:
        location: an SQLite file path, or a ``postgresql://`` URL (needs ``gazeguard[fleet]``).
        synchronous: SQLite durability (``FULL`` default); for PostgreSQL ``NORMAL`` turns
            ``synchronous_commit`` off.
        session_cap: cap on a session's ε at ``delta``, or ``None``.
        window_cap: cap on the ε at ``delta`` of any ``window_s`` seconds of gaze, or ``None``.
        window_s: the window of ``window_cap`` (and of the ``epsilon_window`` figure), seconds of
            gaze time; default one hour.
        delta: the δ of every (ε, δ) figure and cap (default 1e-6).
        allow_cap_increase: accept caps looser than those recorded with a session (refills!).
        create: create a missing SQLite file (``False``: a missing file is a ConfigError).
        timeout_s: how long a writer waits for the lock, s.
        composer: the accountant (default: :class:`gazeguard.ledger.LedgerComposer`).
        composition: ``"pld"`` (default: caps bound the accountant's ε at ``delta``) or
            ``"sequential"`` (caps bound pure sequential ε, the conservative view; a session
            opened so refuses a later ``"pld"`` as looser).
        wall_clock: ``window_cap`` also binds any ``window_s`` of wall-clock time (when the
            releases were charged), not only of gaze time: a backlog or replay stamped in the
            past cannot spend more than the cap per real hour. A session opened so refuses a
            later ``False`` as looser.
        prefetch: after each charge, compose the figures the session's next identical release
            will report, in a background thread (:class:`Prefetch`), so that its preview and
            charge find them cached instead of composing on the release's path.
        counters: answer a charge's window checks, its trailing window's figure and its pending
            count from the session's stored counters (default). ``False`` recounts them with
            queries over the rows at every charge (cost growing with the charges in the
            window): the reference the counters are tested and benchmarked against. The
            counters are kept up to date either way.
        read_only: an SQLite ledger that is only read (reports): nothing is written, so one in a
            directory this user may not write opens too.
        caps: the caps as a typed :class:`Caps` (:meth:`Caps.of`; what
            :meth:`gazeguard.plan.ReleasePlan.ledger_caps` gives), instead of the numbers
            ``session_cap`` … ``wall_clock`` (ConfigError if both are given).
    """

    def __init__(
        self,
        location: str | os.PathLike[str],
        synchronous: Synchronous = "FULL",
        session_cap: float | None = None,
        window_cap: float | None = None,
        *,
        window_s: float = policy.HOUR_S,
        delta: float = policy.DEFAULT_DELTA,
        allow_cap_increase: bool = False,
        create: bool = True,
        timeout_s: float = 30.0,
        composer: Composer | None = None,
        composition: str = "pld",
        wall_clock: bool = False,
        prefetch: bool = True,
        counters: bool = True,
        read_only: bool = False,
        caps: Caps | None = None,
    ) -> None:
        numbers = (session_cap, window_cap, window_s, delta, composition, wall_clock)
        if caps is not None and numbers != (None, None, policy.HOUR_S, policy.DEFAULT_DELTA,
                                            "pld", False):  # fmt: skip
            raise ConfigError("caps", caps.describe(), "give caps or the cap numbers, not both")
        self._caps = caps if caps is not None else Caps(
            _cap(session_cap, "ledger.session_cap"),
            _cap(window_cap, "ledger.window_cap"),
            float(window_s),
            float(delta),
            composition,
            bool(wall_clock),
        )  # fmt: skip
        self._allow_increase = allow_cap_increase
        self._caps_json = self._caps.to_json()
        self._accepted: set[str] = set()  # stored caps the configured ones may bind (JSON)
        # outbox ids this object enqueued lately, oldest first (ENQUEUED_KEPT at most)
        self._enqueued: dict[int, None] = {}
        self._enqueued_lock = threading.Lock()
        self._composer: Composer = composer if composer is not None else LedgerComposer()
        self._prefetch = Prefetch(self._composer) if prefetch else None
        self._counted = bool(counters)
        self._backend: LedgerBackend
        if is_url(location):
            try:
                from gazeguard.ledger._postgres import PostgresBackend  # noqa: PLC0415 - the fleet extra (psycopg)
            except ImportError as exc:
                raise ConfigError(
                    "ledger.url",
                    "postgresql://…",
                    f"the PostgreSQL ledger needs psycopg 3 ({exc}): "
                    "pip install -e '.[fleet]' (in the gazeguard checkout)",
                ) from exc
            self._backend = PostgresBackend(str(location), synchronous, timeout_s=timeout_s)
        else:
            self._backend = SqliteBackend(
                location, synchronous, create=create, timeout_s=timeout_s, read_only=read_only
            )

    @classmethod
    def open(cls, location: str | os.PathLike[str], **kwargs: Any) -> Ledger:
        """Open an SQLite file or a ``postgresql://`` URL (same arguments as the constructor)."""
        return cls(location, **kwargs)

    @property
    def backend(self) -> LedgerBackend:
        """The storage backend (``.kind`` is ``"sqlite"`` or ``"postgresql"``)."""
        return self._backend

    @property
    def local(self) -> bool:
        """True for an SQLite file: no call waits on a network round trip (a transaction is a
        few hundred µs of CPU and one fsync), so a busy event loop may make the calls itself
        rather than hand them to a worker thread, which would wait for the GIL after each of its
        SQLite calls while the loop computes (see
        :meth:`gazeguard.runtime.fleet.Fleet.process_many`)."""
        return self._backend.kind == "sqlite"

    @property
    def caps(self) -> Caps:
        """The configured caps (a session's stored caps may be stricter)."""
        return self._caps

    @property
    def composer(self) -> Composer:
        """The accountant the ledger composes with."""
        return self._composer

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the database connection (after a figure being prefetched is finished)."""
        if self._prefetch is not None:
            self._prefetch.close()
        self._backend.close()

    # ---- writes -------------------------------------------------------------------------

    def open_session(self, session: str) -> LedgerState:
        """Register a session with the configured caps, or check them against the recorded ones.

        Call it when a session starts, so that a configuration looser than the caps recorded
        with the session is refused (ConfigError naming both) before any work.
        """
        check_release(session, 0)
        with self._backend.write() as sql:
            store = Store(sql, self._backend.lock_clause)
            row, caps = self._lock(store, session, time.time())
            return self._state(store, session, row, caps)

    def preview(
        self,
        session: str,
        cost: Cost,
        *,
        gaze: tuple[float, float] | None = None,
    ) -> Preview:
        """The state the session would be in after charging this release now.

        Same arguments as :meth:`charge`. Reads only.

        Raises:
            BudgetExhaustedError: the release would exceed a cap.
            ConfigError: bad ε, or configured caps looser than the recorded ones.
        """
        check_release(session, 0)
        release = checked_release(cost)
        span = gaze_span(gaze, time.time())
        with self._backend.read() as sql:
            now = time.time()
            store = Store(sql)
            row = store.session(session)
            caps = self._caps if row is None else self._binding(session, row)
            view = self._view(store, session, row)
            row = row or _empty_row(caps)
            after = self._windows(view, caps=caps, row=row, counts=row.counts, release=release,
                                  span=span, now=now)  # fmt: skip
            charged = _charged(row, release, span, "chunks", 0)
            state = self._figures(
                session, row=charged, caps=caps, counts=charged.counts, window=after.gaze,
                pending=view.pending() + 1,
            )  # fmt: skip
            return Preview(state, row.version)

    def charge(
        self,
        session: str,
        chunk_index: int,
        cost: Cost,
        topic: str,
        payload: bytes,
        *,
        gaze: tuple[float, float] | None = None,
        stream: str = "chunks",
        version: int | None = None,
    ) -> Charge:
        """Charge one release and enqueue its privatized payload, atomically and durably.

        Args:
            session: session identifier.
            chunk_index: the release's index in ``stream`` (>= 0); each is charged at most once.
            cost: the accounting event of each released item (:data:`Cost`; :func:`pure_cost`
                for a release that states only a pure ε per item). The caps compose the events;
                each item's pure ε (``inf`` for noise without a pure guarantee) is recorded and
                summed for the sequential view.
            topic: where the payload is to be published.
            payload: the bytes, exactly as they will be published.
            gaze: Unix times of the release's first and last gaze, s (default: now, now); the
                window cap counts in this time.
            stream: ``chunks`` (default), ``labels``, …: independent index spaces of one session.
            version: the :attr:`Preview.version` the payload was built from; a different current
                version raises :class:`StaleStateError` (nothing is written). ``None`` skips the
                check (the payload then cannot quote the post-charge state).

        Returns:
            The committed :class:`Charge`.

        Raises:
            BudgetExhaustedError: the release would exceed a cap; nothing was written.
            DuplicateChargeError: the release was charged or withheld before.
            StaleStateError: another writer charged the session since the preview.
            ConfigError: bad arguments, or configured caps looser than the recorded ones.
        """
        request = ChargeRequest(
            session, chunk_index, cost, topic, payload, gaze=gaze, stream=stream, version=version
        )
        release, span = validated_request(request, time.time())
        with self._backend.write() as sql:
            return self._charge_in(Store(sql, self._backend.lock_clause), request, release, span)

    def charge_many(self, requests: Sequence[ChargeRequest]) -> list[Charge | LedgerRefusal]:
        """Charge several releases in ONE durable transaction (group commit), each as
        :meth:`charge` would, in order.

        Every request gets every check :meth:`charge` makes (caps, duplicates, stale version,
        the atomic outbox enqueue), against the state the requests before it left. A request
        refused by a check writes nothing and is reported in its place; the others are
        committed all the same. Batched: each run of requests in which no session comes twice
        is read, checked and written with a few multi-row statements, whatever its length
        (package docstring, "Group commit"). Two requests of one session: the second's
        ``version`` must be the one the first leaves (else it is stale), so previews made
        before the first charge should wait for the next group.

        Returns:
            Per request, in order: its committed :class:`Charge`, or the refusal
            (:class:`BudgetExhaustedError`, :class:`DuplicateChargeError`,
            :class:`StaleStateError`, :class:`ConfigError`, :class:`TypeError`) — nothing of
            that request was written.

        Raises:
            LedgerError: the transaction failed (locked too long, …): nothing was written.
        """
        checked = _validated(requests)
        out: list[Charge | LedgerRefusal | None] = [
            c if isinstance(c, Exception) else None for c in checked
        ]
        if all(isinstance(c, Exception) for c in checked):
            return [c for c in checked if isinstance(c, Exception)]  # (no transaction)
        with self._backend.write() as sql:
            store = self._batch_store(sql)
            for segment in _segments(requests, checked):
                for i, result in self._charge_batch(store, segment):
                    out[i] = result
        assert all(r is not None for r in out)
        return [r for r in out if r is not None]

    def charge_admitted(
        self, requests: Sequence[ChargeRequest], decide: Decide
    ) -> list[Charge | LedgerRefusal]:
        """Check releases of distinct sessions, let ``decide`` write their messages knowing
        which were admitted, and charge those, in ONE durable transaction (a release whose
        value depends on who pays for it: a cohort bucket, whose sum holds exactly the
        sessions charged for it).

        The sessions' rows are read and locked, every check :meth:`charge` makes is made (the
        requests' ``topic`` and ``payload`` are not used), then ``decide(positions)`` is called
        with the positions of the admitted requests, in order, and returns one
        ``(topic, payload)`` per position; those releases are written with them. Nobody else
        can charge these sessions in between (their rows are locked), so what ``decide`` is
        told is what is charged. ``decide`` raising writes nothing. A preview and a separate
        charge read every row twice; this reads it once.

        Returns:
            Per request, in order: its committed :class:`Charge`, or why it was left out
            (:class:`BudgetExhaustedError`, :class:`DuplicateChargeError` — ``.what`` says
            whether it was charged or withheld before —, :class:`StaleStateError`,
            :class:`ConfigError`, :class:`TypeError`).

        Raises:
            ConfigError: a session comes twice.
            LedgerError: ``decide`` answered for a different number of releases, or the
                transaction failed: nothing was written.
        """
        checked = _validated(requests)
        out: list[Charge | LedgerRefusal | None] = [
            c if isinstance(c, Exception) else None for c in checked
        ]
        segments = _segments(requests, checked)
        if len(segments) > 1:
            raise ConfigError("requests", len(requests), "must name each session once")
        with self._backend.write() as sql:
            store = self._batch_store(sql)
            items = segments[0] if segments else []
            if not items:
                decide([])
            for i, result in self._charge_batch(store, items, decide=decide):
                out[i] = result
        assert all(r is not None for r in out)
        return [r for r in out if r is not None]

    def preview_many(self, requests: Sequence[ChargeRequest]) -> list[Preview | LedgerRefusal]:
        """:meth:`preview` of each request (its ``topic``, ``payload`` and ``version`` are not
        used), all read in one snapshot with a few statements whatever their number; and a
        release already charged or withheld is refused with :class:`DuplicateChargeError`
        (``.what`` says which) as its charge would be. Each preview is of that release alone,
        now (two of one session do not see each other). Reads only.

        Returns:
            Per request, in order: its :class:`Preview`, or why its charge would be refused
            (:class:`BudgetExhaustedError`, :class:`DuplicateChargeError`,
            :class:`ConfigError`, :class:`TypeError`).
        """
        out: list[Preview | LedgerRefusal | None] = []
        checked: list[tuple[int, ChargeRequest, Release, tuple[float, float]]] = []
        for i, request in enumerate(requests):
            try:
                release, span = validated_request(request, time.time())
            except (ConfigError, TypeError) as exc:
                out.append(exc)
                continue
            out.append(None)
            checked.append((i, request, release, span))
        if not checked:
            return [r for r in out if r is not None]
        with self._backend.read() as sql:
            now = time.time()
            store = self._batch_store(sql)
            rows = store.sessions_many([r.session for _, r, _, _ in checked])
            done = store.done_many([(r.session, r.stream, r.chunk_index) for _, r, _, _ in checked])
            for i, request, release, span in checked:
                session = request.session
                try:
                    what = done.get((session, request.stream, request.chunk_index))
                    if what is not None:
                        raise DuplicateChargeError(session, request.chunk_index, what)
                    row = rows.get(session)
                    caps = self._caps if row is None else self._binding(session, row)
                    view = self._view(store, session, row)
                    row = row or _empty_row(caps)
                    after = self._windows(view, caps=caps, row=row, counts=row.counts,
                                          release=release, span=span, now=now)  # fmt: skip
                except (BudgetExhaustedError, DuplicateChargeError, ConfigError) as exc:
                    out[i] = exc
                    continue
                charged = _charged(row, release, span, request.stream, request.chunk_index)
                state = self._figures(
                    session, row=charged, caps=caps, counts=charged.counts, window=after.gaze,
                    pending=view.pending() + 1,
                )  # fmt: skip
                out[i] = Preview(state, row.version)
        return [r for r in out if r is not None]

    def _batch_store(self, sql: Sql) -> Store:
        """A store for batches: arrays on PostgreSQL (:meth:`Store.rows`)."""
        return Store(sql, self._backend.lock_clause, arrays=self._backend.kind == "postgresql")

    def _charge_batch(
        self,
        store: Store,
        items: Sequence[tuple[int, ChargeRequest, Release, tuple[float, float]]],
        *,
        decide: Decide | None = None,
    ) -> list[tuple[int, Charge | LedgerRefusal]]:
        """Charge releases of distinct sessions inside the caller's write transaction, each
        with every check :meth:`charge` makes, with a few multi-row statements whatever their
        number: their session rows read (and locked) together, their duplicates looked up
        together, the checks in memory, then every table written with multi-row statements.
        A refused release writes nothing. ``decide``: called with the positions admitted, after the
        checks and before any write, for their (topic, payload)s (:meth:`charge_admitted`).
        Returns ``(position, Charge or refusal)`` per item."""
        if not items:
            return []
        now = time.time()
        out, admitted, created = self._check_batch(store, items, now)
        carried = [(r.topic, bytes(r.payload)) for _, r, *_ in admitted]
        if decide is not None:
            carried = list(decide([i for i, *_ in admitted]))
            if len(carried) != len(admitted):
                raise LedgerError(
                    f"decide returned {len(carried)} messages for {len(admitted)} admitted releases"
                )
        accepted: list[tuple[int, ChargeRow, Caps, Counts, Release]] = []
        for (i, request, release, span, row, caps, counters), (topic, payload) in zip(
            admitted, carried, strict=True
        ):
            session, index, stream = request.session, request.chunk_index, request.stream
            stored = self._adopt(session, row, caps)
            after_counts = policy.merged(row.counts, release.events)
            after = after_charge(
                row, units=release.units, idx=index, stream=stream, gaze_end=span[1],
                counts=after_counts,
            )  # fmt: skip
            after.caps = stored
            charge = ChargeRow(
                session, stream, index, release.epsilon_json, release.units, release.events,
                span, topic, payload, row, after, stored, counters,
            )  # fmt: skip
            accepted.append((i, charge, caps, after_counts, release))
        unused = created - {a[1].session for a in accepted}
        if unused:  # rows this transaction created for releases all refused: none, as before
            store.delete_sessions(sorted(unused))
        with store.sql.pipeline():  # (PostgreSQL writes the rows while the figures are made)
            outbox_ids = store.send_charges([a[1] for a in accepted], now)
            states: list[LedgerState] = []
            for _, charge, caps, counted, release in accepted:
                state = self._figures(
                    charge.session, row=charge.after, caps=caps, counts=counted,
                    window=charge.counters.gaze, pending=charge.counters.pending,
                )  # fmt: skip
                states.append(state)
                if self._prefetch is not None and not caps.sequential:
                    self._prefetch.submit(caps, counted, charge.counters.gaze, release.events)
        ids = outbox_ids()
        with self._enqueued_lock:
            for outbox_id in ids:
                self._enqueued[outbox_id] = None
            while len(self._enqueued) > ENQUEUED_KEPT:
                del self._enqueued[next(iter(self._enqueued))]
        for (i, charge, _, _, release), state, outbox_id in zip(accepted, states, ids, strict=True):
            total = math.inf if release.units is None else release.units / UNITS_PER_EPSILON
            out.append((i, Charge(charge.session, charge.idx, total, state, outbox_id)))
        return out

    def _check_batch(
        self,
        store: Store,
        items: Sequence[tuple[int, ChargeRequest, Release, tuple[float, float]]],
        now: float,
    ) -> tuple[list[tuple[int, Charge | LedgerRefusal]], list[_Admitted], set[str]]:
        """:meth:`_charge_batch`'s reads and checks: the refusals, the admitted releases with
        their rows, caps and counters after them, and the sessions whose rows this transaction
        created."""
        sessions = [r.session for _, r, _, _ in items]
        rows = store.sessions_many(sessions, lock=True)
        missing = [s for s in sessions if s not in rows]
        created: set[str] = set()
        if missing:  # (as _lock: created first, then locked: another writer may have won)
            created = store.create_sessions(missing, self._caps_json, now)
            rows.update(store.sessions_many(missing, lock=True))
        done = store.done_many([(r.session, r.stream, r.chunk_index) for _, r, _, _ in items])
        refused: list[tuple[int, Charge | LedgerRefusal]] = []
        admitted: list[_Admitted] = []
        for i, request, release, span in items:
            session, index, stream = request.session, request.chunk_index, request.stream
            row = rows[session]
            try:
                caps = self._binding(session, row)
                _check_unchanged(request, row, done.get((session, stream, index)))
                view = self._view(store, session, row)
                counters = self._windows(
                    view, caps=caps, row=row, counts=row.counts, release=release, span=span,
                    now=now,
                )  # fmt: skip
            except (BudgetExhaustedError, DuplicateChargeError, StaleStateError, ConfigError) as e:
                refused.append((i, e))
                continue
            admitted.append((i, request, release, span, row, caps, counters))
        return refused, admitted, created

    def _charge_in(
        self, store: Store, request: ChargeRequest, release: Release, span: tuple[float, float]
    ) -> Charge:
        """:meth:`charge`'s writes inside the caller's write transaction: the checks, the charge
        with its outbox item, and the session's counters as the charge leaves them."""
        session, chunk_index, stream = request.session, request.chunk_index, request.stream
        now = time.time()
        row, caps = self._lock(store, session, now)
        _check_unchanged(request, row, store.charged_or_withheld(session, stream, chunk_index))
        view = self._view(store, session, row)
        counts = row.counts
        after_counters = self._windows(
            view, caps=caps, row=row, counts=counts, release=release, span=span, now=now
        )  # the checks; and the counters after the charge, computed before its rows exist
        store.insert_charge(
            session, stream, chunk_index, epsilon_json=release.epsilon_json, units=release.units,
            events=release.events, gaze=span, now=now,
        )  # fmt: skip
        outbox_id = store.enqueue(
            session, stream, chunk_index, topic=request.topic, payload=bytes(request.payload),
            now=now,
        )  # fmt: skip
        with self._enqueued_lock:
            self._enqueued[outbox_id] = None
            if len(self._enqueued) > ENQUEUED_KEPT:
                del self._enqueued[next(iter(self._enqueued))]
        after_counts = policy.merged(counts, release.events)
        after = store.update_after_charge(
            session, row, units=release.units, idx=chunk_index, stream=stream, gaze_end=span[1],
            counts=after_counts, counters=after_counters, pending_added=1,
        )  # fmt: skip
        state = self._figures(
            session, row=after, caps=caps, counts=after_counts, window=after_counters.gaze,
            pending=after_counters.pending,
        )  # fmt: skip
        if self._prefetch is not None and not caps.sequential:
            self._prefetch.submit(caps, after_counts, after_counters.gaze, release.events)
        total = math.inf if release.units is None else release.units / UNITS_PER_EPSILON
        return Charge(session, chunk_index, total, state, outbox_id)

    def withhold(
        self,
        session: str,
        chunk_index: int,
        requested: float | Cost,
        reason: str,
        *,
        stream: str = "chunks",
    ) -> LedgerState:
        """Record that a release was withheld (refused by a cap, or dropped on an error).

        Nothing is charged and nothing is enqueued; ``state().withheld`` counts it. Recording
        the same release twice counts it once. ``requested``: the release's :data:`Cost` (its
        items' pure ε are recorded, summed), or the ε a
        :class:`~gazeguard.core.errors.BudgetExhaustedError` reported for it.

        Raises:
            DuplicateChargeError: the release was charged (it cannot also be withheld).
        """
        check_release(session, chunk_index)
        asked = (
            sum(e.pure_epsilon for e in requested.values())
            if isinstance(requested, Mapping)
            else float(requested)
        )
        units = (
            0
            if asked == 0 or not math.isfinite(asked)
            else to_units_up(asked, "requested", MAX_CAP)
        )
        with self._backend.write() as sql:
            now = time.time()
            store = Store(sql, self._backend.lock_clause)
            row, caps = self._lock(store, session, now, reconcile=False)
            if store.charged_or_withheld(session, stream, chunk_index) == "charged":
                raise DuplicateChargeError(session, chunk_index, "charged")
            store.withhold(session, stream, chunk_index, units=units, reason=reason, now=now)
            row = store.session(session) or row
            return self._state(store, session, row, caps)

    # ---- the outbox ---------------------------------------------------------------------

    def pending(self, limit: int | None = None, session: str | None = None) -> list[OutboxItem]:
        """Undelivered payloads in outbox order (optionally of one session, at most ``limit``)."""
        with self._backend.read() as sql:
            rows = Store(sql).pending(limit, session)
        return [OutboxItem(int(r[0]), r[1], int(r[3]), r[4], bytes(r[5]), r[6], r[2]) for r in rows]

    def outbox_backlog(self) -> tuple[int, float | None]:
        """How many charged releases of any session wait in the outbox, and when the oldest
        of them was charged (Unix s; ``None``: the outbox is empty). One indexed query."""
        with self._backend.read() as sql:
            return Store(sql).outbox_backlog()

    def enqueued_here(self, outbox_id: int) -> bool:
        """Whether this object enqueued the outbox item (among its last :data:`ENQUEUED_KEPT`
        charges): an item it did not is another process's (or an earlier run's)."""
        return outbox_id in self._enqueued

    def mark_delivered(self, outbox_id: int) -> bool:
        """Mark an outbox item delivered (after the broker's PUBACK) and drop its payload.

        Returns ``False`` if it was not pending (already delivered, refused or unknown).
        """
        return self.mark_delivered_many([outbox_id]) == 1

    def mark_delivered_many(self, outbox_ids: Sequence[int]) -> int:
        """:meth:`mark_delivered` of several items in one transaction (a drain's pass); ids not
        pending are skipped. Returns how many were marked."""
        if not outbox_ids:
            return 0
        with self._backend.write() as sql:
            return self._batch_store(sql).mark_delivered_many(outbox_ids, time.time())

    def mark_refused(self, outbox_id: int, reason: str) -> bool:
        """Move a pending item aside: the broker permanently refused it (kept, never retried).

        Its charge stays (the ε was spent); ``state().refused`` counts it and
        :meth:`refused` lists it. Returns ``False`` if it was not pending.
        """
        with self._backend.write() as sql:
            session = self._batch_store(sql).mark_refused(outbox_id, reason, time.time())
        if session is not None:
            log.warning(
                "session %r: outbox item %d refused by the broker: %s", session, outbox_id, reason
            )
        return session is not None

    def refused(self, session: str | None = None) -> list[RefusedItem]:
        """Charged payloads the broker refused, in outbox order."""
        with self._backend.read() as sql:
            rows = Store(sql).refused(session)
        return [
            RefusedItem(int(r[0]), r[1], r[2], int(r[3]), r[4], str(r[5]), float(r[6]))
            for r in rows
        ]

    # ---- reads --------------------------------------------------------------------------

    def state(self, session: str) -> LedgerState:
        """The session's account; an unknown session reads as empty with the configured caps."""
        with self._backend.read() as sql:
            store = Store(sql)
            row = store.session(session)
            return self._state(
                store, session, row, self._caps if row is None else Caps.from_json(row.caps)
            )

    def next_index(self, session: str, stream: str = "chunks") -> int:
        """The first index not yet charged or withheld in ``stream`` (restarts continue there)."""
        with self._backend.read() as sql:
            last = Store(sql).last_index(session, stream)
        return 0 if last is None else last + 1

    def sessions(self) -> list[str]:
        """All sessions the ledger has seen, oldest first."""
        with self._backend.read() as sql:
            return Store(sql).sessions()

    def charges(self, session: str, stream: str = "chunks") -> list[ChargeRecord]:
        """The session's charge history of ``stream`` in index order."""
        with self._backend.read() as sql:
            rows = Store(sql).history(session, stream)
        return [
            ChargeRecord(
                int(r[0]), math.inf if r[1] is None else int(r[1]) / UNITS_PER_EPSILON,
                json.loads(r[2]), float(r[5]), float(r[3]), float(r[4]),
            )
            for r in rows
        ]  # fmt: skip

    def withheld(self, session: str, stream: str = "chunks") -> list[tuple[int, float, str]]:
        """The session's withheld releases: (index, requested pure ε, reason), in order."""
        with self._backend.read() as sql:
            rows = Store(sql).withheld(session, stream)
        return [(int(r[0]), int(r[1]) / UNITS_PER_EPSILON, r[2]) for r in rows]

    def verify(self) -> list[str]:
        """Audit the ledger: the problems found (an empty list means consistent).

        Checks that each session's totals and event counts match its rows, that every charge has
        exactly one outbox item and every outbox item a charge, and that no release is both
        charged and withheld.
        """
        with self._backend.read() as sql:
            return Store(sql).verify()

    # ---- internals ------------------------------------------------------------------------

    def _view(self, store: Store, session: str, row: SessionRow | None) -> WindowView:
        """The session's window aggregates in this transaction (``row``: its row, ``None`` for
        an unknown session): from its stored counters, or recounted (``counters=False``)."""
        if row is None:
            return WindowView(store, session, EMPTY_COUNTERS if self._counted else None)
        return WindowView(store, session, row.counters if self._counted else None)

    def _binding(self, session: str, row: SessionRow) -> Caps:
        """The caps that bind the session (ConfigError: the configured ones are looser than
        those stored with it); stored caps found acceptable before are not parsed again."""
        if row.caps in self._accepted:
            return self._caps
        stored = Caps.from_json(row.caps)
        caps = policy.reconcile(
            stored,
            self._caps,
            allow_increase=self._allow_increase,
            where=f"session {session!r} in {self._backend.location}",
        )
        if caps is self._caps and len(self._accepted) < 256:
            self._accepted.add(row.caps)
        return caps

    def _lock(
        self, store: Store, session: str, now: float, *, reconcile: bool = True
    ) -> tuple[SessionRow, Caps]:
        """Lock (creating) the session row; the caps that bind from now on (stored if changed)."""
        row = store.session(session, lock=True)
        if row is None:
            store.create_session(session, self._caps.to_json(), now)
            row = store.session(session, lock=True)
            assert row is not None
        if not reconcile:
            return row, Caps.from_json(row.caps)
        caps = self._binding(session, row)
        stored = self._adopt(session, row, caps)
        if stored != row.caps:
            store.set_caps(session, stored)
            row.caps = stored
        return row, caps

    def _adopt(self, session: str, row: SessionRow, caps: Caps) -> str:
        """The caps JSON to store with the session from now on (``row.caps`` unless ``caps``,
        those that bind, differ: stricter ones, or looser by ``allow_cap_increase``, logged)."""
        wanted = self._caps_json if caps is self._caps else caps.to_json()
        if wanted != row.caps and not Caps.from_json(row.caps).at_least_as_strict_as(caps):
            log.warning(
                "ledger %s: session %r: caps raised from (%s) to (%s) by allow_cap_increase; "
                "spent ε is kept",
                self._backend.location, session, Caps.from_json(row.caps).describe(),
                caps.describe(),
            )  # fmt: skip
        return wanted

    def _windows(
        self,
        view: WindowView,
        *,
        caps: Caps,
        row: SessionRow,
        counts: Counts,
        release: Release,
        span: tuple[float, float],
        now: float,
    ) -> Counters:
        """Check the release against the caps; the session's counters as charging it leaves
        them (computed before its rows are written; ``now``: its charge time, Unix s).

        Which gaze windows: a release ending at or after the session's latest gaze (the normal
        case) can only overfill the window that ends at its own gaze end
        (:func:`~gazeguard.ledger.policy.windows_to_check`), and those counts are the trailing
        window's, which the counters hold; one charged out of order (or any release when
        recounting) checks every window :func:`policy.windows_to_check` names, counted from
        the rows.

        Raises:
            BudgetExhaustedError: the release does not fit; nothing about it may be written.
        """
        end, last, w = span[1], row.last_gaze_end, caps.window_s
        gaze_lo = (end if last is None else max(last, end)) - w  # the trailing window after it
        wall_lo = now - w
        (trailing, gaze_first), (wall, wall_first) = view.since(gaze_lo, wall_lo)
        windows: list[Counts] = []
        if caps.window is not None:
            if view.counters is not None and (last is None or end >= last):
                windows = [trailing]
            else:
                later = view.gaze_ends(end, end + w)
                windows = [view.window(a, e) for a, e in policy.windows_to_check(end, w, later)]
        policy.check(
            self._composer, caps, view.session, session=counts, windows=windows,
            cost=release.events, wall=wall,
        )  # fmt: skip
        counted = end > gaze_lo  # (a release older than the trailing window is not in it)
        return Counters(
            gaze_lo, wall_lo,
            policy.merged(trailing, release.events) if counted else dict(trailing),
            policy.merged(wall, release.events), view.pending() + 1,
            _earliest(gaze_first, end) if counted else gaze_first, _earliest(wall_first, now),
        )  # fmt: skip

    def _figures(
        self,
        session: str,
        *,
        row: SessionRow,
        caps: Caps,
        counts: Counts,
        window: Counts,
        pending: int,
    ) -> LedgerState:
        fig = policy.figures(self._composer, caps, counts, window)
        return _make_state(session, row, caps, fig, pending)

    def _state(self, store: Store, session: str, row: SessionRow | None, caps: Caps) -> LedgerState:
        """The state of a session (``row``: its row, ``None`` for an unknown session)."""
        view = self._view(store, session, row)
        row = row or _empty_row(caps)
        last = row.last_gaze_end
        return self._figures(
            session, row=row, caps=caps, counts=row.counts,
            window={} if last is None else view.gaze_since(last - caps.window_s),
            pending=view.pending(),
        )  # fmt: skip


def _earliest(first: float | None, t: float) -> float:
    return t if first is None else min(first, t)


def _cap(value: float | None, field: str) -> float | None:
    """A cap rounded down to whole micro-ε (a cap never allows more than configured)."""
    return None if value is None else to_units_down(value, field) / UNITS_PER_EPSILON


def _check_unchanged(request: ChargeRequest, row: SessionRow, done: str | None) -> None:
    """Raise if ``request``'s release was recorded before (``done``: ``"charged"`` or
    ``"withheld"``, ``None`` if not), or if its session's ``row`` changed since the preview
    ``request.version`` was read from.

    Raises:
        DuplicateChargeError: ``done`` is set.
        StaleStateError: the session's version is no longer the request's.
    """
    if done is not None:
        raise DuplicateChargeError(request.session, request.chunk_index, done)
    if request.version is not None and request.version != row.version:
        raise StaleStateError(
            f"session {request.session!r} changed since the preview (version "
            f"{request.version} → {row.version}); preview again"
        )


def _empty_row(caps: Caps) -> SessionRow:
    return SessionRow(caps.to_json(), 0, 0, 0, 0, 0, True, 0, None, None)


def _charged(
    row: SessionRow, release: Release, span: tuple[float, float], stream: str, index: int
) -> SessionRow:
    """The row as a charge of ``release`` would leave it (for previews)."""
    del stream, index
    return SessionRow(
        row.caps,
        row.version + 1,
        row.chunks + 1,
        row.withheld,
        row.refused,
        row.spent_units + (release.units or 0),
        row.pure_finite and release.units is not None,
        max(row.max_units, release.units or 0),
        row.last_chunk,
        span[1] if row.last_gaze_end is None else max(row.last_gaze_end, span[1]),
        policy.merged(row.counts, release.events),
    )


def _headroom(cap: float, spent: float) -> float:
    """``cap − spent`` to the ledger's micro-ε resolution (never below 0)."""
    return max(round(cap - spent, 6), 0.0)


def _make_state(
    session: str, row: SessionRow, caps: Caps, fig: policy.Figures, pending: int
) -> LedgerState:
    # Pure sequential ε: the per-feature ε recorded, or more where the accounting events say so
    # (they carry the samplers' slack), so that no figure shows less than the caps count.
    spent = max(row.spent_units / UNITS_PER_EPSILON, fig.pure) if row.pure_finite else math.inf
    return LedgerState(
        session=session,
        epsilon=fig.epsilon,
        delta=caps.delta,
        epsilon_window=fig.window,
        window_s=caps.window_s,
        spent=spent,
        remaining=None if caps.session is None else _headroom(caps.session, fig.epsilon),
        window_remaining=None if caps.window is None else _headroom(caps.window, fig.window),
        chunks=row.chunks,
        withheld=row.withheld,
        refused=row.refused,
        max_chunk_eps=row.max_units / UNITS_PER_EPSILON,
        last_chunk=row.last_chunk,
        last_gaze_end=row.last_gaze_end,
        pending=pending,
        session_cap=caps.session,
        window_cap=caps.window,
        version=row.version,
    )


def _validated(
    requests: Sequence[ChargeRequest],
) -> list[tuple[Release, tuple[float, float]] | LedgerRefusal]:
    """Each request's release and gaze span, or why it is invalid (ConfigError, TypeError)."""
    checked: list[tuple[Release, tuple[float, float]] | LedgerRefusal] = []
    for request in requests:
        try:
            checked.append(validated_request(request, time.time()))
        except (ConfigError, TypeError) as exc:
            checked.append(exc)
    return checked


def _segments(
    requests: Sequence[ChargeRequest],
    checked: Sequence[tuple[Release, tuple[float, float]] | LedgerRefusal],
) -> list[list[tuple[int, ChargeRequest, Release, tuple[float, float]]]]:
    """The valid requests in order, cut into consecutive runs in which no session comes twice
    (each run is charged as one batch, and sees the runs before it written)."""
    out: list[list[tuple[int, ChargeRequest, Release, tuple[float, float]]]] = [[]]
    seen: set[str] = set()
    for i, (request, item) in enumerate(zip(requests, checked, strict=True)):
        if isinstance(item, Exception):
            continue
        if request.session in seen:
            out.append([])
            seen = set()
        seen.add(request.session)
        out[-1].append((i, request, item[0], item[1]))
    return [run for run in out if run]
