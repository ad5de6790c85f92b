"""The durable privacy ledger and its outbox: every release is paid for before it can be published.

A release (a privatized chunk, a private label, a cohort contribution) costs a :data:`Cost`:
the *accounting event* (:mod:`gazeguard.privacy.accounting`) of each released item by name, for
example 48 features × one Laplace release of noise multiplier r. :meth:`Ledger.charge` checks
the caps, records the charge with its events (and each item's pure ε, derived from its event)
and its gaze time, and enqueues the privatized payload in the outbox **in one transaction**: a
crash can never leave a charged release without its payload, nor a payload without its charge.
The publisher drains :meth:`Ledger.pending` and calls :meth:`Ledger.mark_delivered` after the
broker's PUBACK (or :meth:`Ledger.mark_refused` when the broker permanently refuses an item), so
a charged release survives broker outages and restarts and is delivered afterwards, in order.

Accounting per session (:mod:`gazeguard.ledger.policy`):

* ``epsilon`` — the user-level ε at ``delta`` of everything charged: the accountant's composition
  (privacy loss distributions), never above pure sequential composition; recomputed exactly from
  the stored event counts after any restart, on SQLite and PostgreSQL alike.
* ``epsilon_window`` — the same over the trailing ``window_s`` seconds of gaze (one hour by
  default: ε per hour of gaze).
* ``spent`` — sequential pure ε, exact in integer micro-ε (each item's pure ε, samplers' slack
  included, rounded up): the conservative view;
  ``max_chunk_eps`` — the paper's per-chunk (parallel composition) view, which is *not* a
  user-level guarantee.
* a session cap and a window cap over any ``window_s`` seconds of gaze time, both ε at ``delta``.
  A release that would exceed a cap is refused with
  :class:`~gazeguard.core.errors.BudgetExhaustedError` and nothing is written;
  :meth:`Ledger.withhold`
  then records it for status.

No callback: the payload quotes the post-charge state, so a writer first calls
:meth:`Ledger.preview` (the state after the release, and the session's version), builds the
payload from it, and charges with that version; if another writer charged the session in between,
:class:`StaleStateError` says "preview again" and nothing is written.

Cap policy on restart. The caps a session was first seen with are stored with it. A stricter
configuration is adopted; a looser one (a higher cap, a removed cap, a shorter window, a larger
δ) would refill the budget and is refused with a :class:`~gazeguard.core.errors.ConfigError` by
:meth:`Ledger.open_session` (call it at session start) or at the session's next charge, unless
the ledger was opened with ``allow_cap_increase=True``. Spent ε never resets.

Group commit. :meth:`Ledger.charge_many` charges several releases in one durable transaction,
each with every check :meth:`Ledger.charge` makes against its own session's caps; a refused one
writes nothing and is reported in its place (a fleet worker charges the chunks a tick completes
so). The statements are batched: the sessions' rows are read and locked (in session order) by
one statement, their duplicates looked up by one, the checks run in memory, and each table is
written by one multi-row statement (PostgreSQL: ``unnest`` of one array per column; SQLite:
``VALUES`` lists), so a group of hundreds of sessions costs a handful of round trips, not
several per session. :meth:`Ledger.charge_admitted` reads and checks a group, lets the caller
write its messages knowing who was admitted, and charges those, in one transaction with their
rows locked (a cohort bucket: its sum holds exactly the sessions charged for it);
:meth:`Ledger.preview_many` previews a group in one snapshot, naming the releases already
charged.

Prefetch. Reporting ε at δ composes the session's counts (milliseconds to tens of milliseconds
of FFTs for a new count), and admission near a cap runs a capacity search the first time a
release shape no longer fits by its figure (a second or more). After each charge a background
thread (not a daemon; :meth:`Ledger.close` waits for it; it ends after 0.5 s without a request)
composes what the session's next identical release will need, so the release path finds cache
lookups; the composer also remembers its last answers (a preview and its charge ask the same),
and a figure being composed by one thread is waited for by another that asks for it, not
composed twice.
Figures and admission are always computed from the ledger's counts; the prefetch only warms
the accountant's caches.

Cost of a charge: the same at the first and the 600th chunk of an hour. A preview and its
charge each read the session row with its *counters* and its event counts, and check the
windows the release falls in: the hourly window(s) of gaze time, the trailing hour of
wall-clock time (``wall_clock``), and the trailing window's figure. The counters hold the event
counts of the session's charges whose gaze ends after ``gaze_lo`` and of those made after
``wall_lo`` (the starts of its trailing windows, Unix s), the earliest gaze end and charge time
among them, and its pending outbox items. Each charge, in its own transaction, moves both
starts up to its windows' and takes off the charges that left them (reading those rows only,
and only once the start has passed the earliest: each charge leaves once), adds itself and
counts its outbox item, in the same statement that updates the session row;
:meth:`Ledger.mark_delivered` and :meth:`Ledger.mark_refused` count theirs off in theirs. So a
crash or a rollback (a refused release in a group commit) leaves counters that agree with the
rows, which :meth:`Ledger.verify` checks. A release charged out of gaze order (an old backlog)
checks each window it falls in with queries over those windows' rows, as does
``Ledger(counters=False)`` for every charge (the reference for tests and benchmarks; it keeps
the counters up to date too).

Concurrency. Each write is one transaction that serialises all writers of a session: SQLite
``BEGIN IMMEDIATE`` (threads and processes on one file), PostgreSQL ``SELECT … FOR UPDATE`` on
the session row (workers of a fleet; ``Ledger("postgresql://…")``, needs ``gazeguard[fleet]``).

Durability. SQLite runs in WAL mode with ``synchronous=FULL`` by default (a committed charge
survives power loss). Outbox payloads are dropped once delivered; charge rows stay. The schema
is version 5 (``_model.SCHEMA_VERSION``); a ledger of any other version is refused, never
upgraded: start a new ledger.

Layout: ``policy`` (composition, caps, windows: plain code), ``_store`` (the SQL, once),
``_sqlite`` and ``_postgres`` (storage only), ``_compose`` (the accountant adapter),
``_request`` (a release's arguments, checked before any transaction), ``_view`` (a session's
window counts, from its counters or its rows), ``_prefetch`` (the next release's figures, composed
in the background), ``_ledger`` (the transactions). ``gazeguard ledger show``
(:mod:`gazeguard.cli.ledger`) prints the accounts.
"""

from __future__ import annotations

from gazeguard.ledger._compose import LedgerComposer
from gazeguard.ledger._ledger import Ledger, LedgerRefusal, Preview, is_url
from gazeguard.ledger._model import (
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
    event_key,
    to_units_down,
    to_units_up,
)
from gazeguard.ledger._request import ChargeRequest, Cost, pure_cost
from gazeguard.ledger._sqlite import SqliteBackend, not_writable, stored_caps
from gazeguard.ledger.policy import Caps

__all__ = [
    "UNITS_PER_EPSILON",
    "Caps",
    "Charge",
    "ChargeRecord",
    "ChargeRequest",
    "Cost",
    "DuplicateChargeError",
    "Ledger",
    "LedgerBackend",
    "LedgerComposer",
    "LedgerError",
    "LedgerRefusal",
    "LedgerState",
    "OutboxItem",
    "Preview",
    "RefusedItem",
    "Sql",
    "SqliteBackend",
    "StaleStateError",
    "event_key",
    "is_url",
    "not_writable",
    "pure_cost",
    "stored_caps",
    "to_units_down",
    "to_units_up",
]
