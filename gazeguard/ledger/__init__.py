"""The durable ε ledger and the outbox: every release is paid for before it can be published.

A chunk's cost is the sum of its released features' ε (sequential composition across the
features of one person). :meth:`Ledger.charge` checks the caps, records the charge and enqueues
the privatized payload in the outbox **in one transaction**: a crash can never leave a charged
chunk without its payload, nor a payload without its charge. The publisher drains
:meth:`Ledger.pending` and calls :meth:`Ledger.mark_delivered` after the broker's PUBACK, so a
charged chunk survives broker outages and restarts and is delivered afterwards, in order.

Accounting (per session):

* ``spent`` — the sum over all charged chunks (sequential composition): the honest user-level ε.
* ``max_chunk_eps`` — the largest single-chunk cost: the paper's per-chunk (parallel
  composition) view, which is *not* a user-level guarantee for a whole recording.
* a per-session cap and an optional w-event cap (Kellaris et al. 2014: any ``w`` consecutive
  chunk indexes together spend at most ``ε_w``; withheld or missing chunks spend 0). A chunk that
  would exceed a cap is refused with :class:`~gazeguard.errors.BudgetExhaustedError` and nothing
  is written; :meth:`Ledger.withhold` then records it for status.

Exact arithmetic. ε is stored as integer micro-ε (:data:`UNITS_PER_EPSILON` = 10⁶ units per ε).
A charge is converted from the shortest decimal form of the float (``repr``) and rounded **up**,
a cap is rounded **down**, and all sums and comparisons are integer. So ``0.1`` costs exactly
100 000 units, ten charges of 0.1 exactly fill a cap of 1.0, and no number of tiny charges can
creep past a cap through floating-point rounding (a charge of 1e-12 costs one whole unit).

Cap policy on restart. The caps a session was first seen with are stored with it. A restart
whose configuration is *stricter* (a lower session cap; a w-event cap with ``w' ≥ w`` and
``ε_w' ≤ ε_w``; a cap where there was none) adopts it and stores it. A *looser* configuration
(a higher cap, a removed cap, a shorter window) would refill the budget and is refused with a
:class:`~gazeguard.errors.ConfigError` by :meth:`Ledger.open_session` (call it at session start)
or at the session's next charge, unless the ledger was opened with ``allow_cap_increase=True`` —
a deliberate, logged operator decision. Spent ε never resets.

Concurrency. Each write is one transaction that serialises all writers of a session: SQLite
``BEGIN IMMEDIATE`` (threads and processes on one file), PostgreSQL ``SELECT … FOR UPDATE`` on
the session row (workers of a fleet; ``Ledger("postgresql://…")``, needs ``gazeguard[fleet]``).
Within a :class:`Ledger`, one connection is shared under a lock, so it may be called from
``asyncio.to_thread`` workers.

Durability. SQLite runs in WAL mode with ``synchronous=FULL`` by default (a committed charge
survives power loss); ``NORMAL`` survives a process crash but may lose the last commits on power
loss and exists for benchmarks. Outbox payloads are dropped once delivered; charge rows stay.

``gazeguard ledger show`` (:mod:`gazeguard.cli.ledger`) prints the accounts.
"""

from __future__ import annotations

from gazeguard.ledger._ledger import Ledger
from gazeguard.ledger._model import (
    UNITS_PER_EPSILON,
    Charge,
    ChargeRecord,
    DuplicateChargeError,
    LedgerBackend,
    LedgerError,
    LedgerState,
    OutboxItem,
    Sql,
    to_units_down,
    to_units_up,
)
from gazeguard.ledger._sqlite import SqliteBackend

__all__ = [
    "UNITS_PER_EPSILON",
    "Charge",
    "ChargeRecord",
    "DuplicateChargeError",
    "Ledger",
    "LedgerBackend",
    "LedgerError",
    "LedgerState",
    "OutboxItem",
    "Sql",
    "SqliteBackend",
    "to_units_down",
    "to_units_up",
]
