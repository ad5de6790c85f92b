"""The ledger's composer: counted event keys → user-level ε at δ, fast enough for every charge.

Each charge stores its accounting events as canonical JSON keys (:func:`event_key`) with
counts, so a session's ε is recomputed from the same facts after a restart, on SQLite and
PostgreSQL alike. This module turns those counts into numbers:

* **Pure sequential ε** is summed exactly in integer micro-ε (each event's pure ε rounded up),
  so no sequence of tiny releases can creep past a cap through floating-point rounding.
* **ε at δ** comes from the accountant (:func:`gazeguard.privacy.accounting.compose`: PLD, the exact
  Gaussian closed form, RDP beyond the PLD's reach), never above the pure sum.
* **Whether a release fits** a cap: first the exact pure sum (if that is within the cap, so is
  every tighter bound); then the report-grid figure of the counts after it (below), which
  bounds the exact one because more releases never lose less, and which a charge composes for
  its figures anyway; only when that figure is over the cap (a release near it) does the exact
  :func:`gazeguard.privacy.accounting.capacity` decide, whose cache makes the same chunk cost
  charged again cost a dictionary lookup. A capacity search takes a PLD composition per probe
  (tenths of a second to seconds for a new history); the figure takes one.

Reported figures (:meth:`LedgerComposer.epsilon`) round each count *up* to a grid with at most
1/64 relative step (exact up to 64 releases), so consecutive reports reuse one composition: by
monotonicity in the counts the figure stays an upper bound, at most ~1.6 % more releases than
were made. Admission (:meth:`LedgerComposer.fits`) refuses only on exact counts.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from typing import TypeVar

from gazeguard.core.errors import ConfigError
from gazeguard.ledger._model import UNITS_PER_EPSILON, LedgerError, to_units_down, to_units_up
from gazeguard.ledger.policy import merged
from gazeguard.privacy.accounting import Event, PrivacyLoss, capacity, compose, event_from_dict

Counts = Mapping[str, int]
T = TypeVar("T")

#: Counts up to this are composed exactly in reports; above, rounded up to 1/64 relative steps.
EXACT_REPORT_COUNTS = 64

#: How many :meth:`LedgerComposer.fits` (and :meth:`LedgerComposer.epsilon`) answers are
#: remembered (then forgotten all at once).
FITS_MEMO = 4096


def report_count(n: int) -> int:
    """``n`` rounded up to the report grid: exact to 64, then steps of ``2^(⌊log2 n⌋ − 6)``."""
    if n <= EXACT_REPORT_COUNTS:
        return n
    step = 1 << (n.bit_length() - 7)
    return -(-n // step) * step


class LedgerComposer:
    """Composition for the ledger (:class:`gazeguard.ledger.policy.Composer`)."""

    def __init__(self) -> None:
        self._events: dict[str, tuple[Event, int | None]] = {}
        self._fits: dict[tuple[object, ...], bool] = {}
        self._epsilon: dict[tuple[object, ...], float] = {}
        self._lock = threading.Lock()
        #: compositions under way (by rounded events and δ) → set when they are done
        self._composing: dict[tuple[object, ...], threading.Event] = {}

    def event(self, key: str) -> Event:
        """The accounting event behind a stored key.

        Raises:
            LedgerError: the key is not an event this gazeguard knows (a damaged ledger, or one
                written by a newer release).
        """
        return self._entry(key)[0]

    def _entry(self, key: str) -> tuple[Event, int | None]:
        with self._lock:
            hit = self._events.get(key)
        if hit is not None:
            return hit
        try:
            event = event_from_dict(json.loads(key))
        except (ValueError, ConfigError) as exc:
            raise LedgerError(
                f"the ledger holds an accounting event this gazeguard cannot read: {key[:200]!r} "
                f"({type(exc).__name__}); use the gazeguard release that wrote it"
            ) from None
        pure = event.pure_epsilon
        units = None if math.isinf(pure) else to_units_up(pure, "epsilon", math.inf)
        with self._lock:
            self._events[key] = (event, units)
        return event, units

    def events(self, counts: Counts, *, rounded: bool = False) -> dict[Event, int]:
        """The counts keyed by event (optionally rounded up to the report grid)."""
        out: dict[Event, int] = {}
        for key, n in counts.items():
            if n:
                e = self.event(key)
                out[e] = out.get(e, 0) + int(n)
        return {e: report_count(n) for e, n in out.items()} if rounded else out

    def pure_units(self, counts: Counts) -> int | None:
        """Exact sequential pure spend in micro-ε, or ``None`` when unbounded (a Gaussian)."""
        total = 0
        for key, n in counts.items():
            units = self._entry(key)[1]
            if units is None:
                return None
            total += units * int(n)
        return total

    def pure(self, counts: Counts) -> float:
        """Sequential pure ε (``inf`` without a pure bound)."""
        units = self.pure_units(counts)
        return math.inf if units is None else units / UNITS_PER_EPSILON

    def epsilon(self, counts: Counts, delta: float, *, exact: bool = False) -> float:
        """ε at ``delta`` of all releases in ``counts`` (an upper bound; never above pure ε);
        counts rounded up to the report grid unless ``exact``. Remembered for the last
        :data:`FITS_MEMO` questions (a preview and its charge report the same figures)."""
        if not any(counts.values()):
            return 0.0
        memo = (tuple(sorted(counts.items())), delta, exact)
        hit = self._epsilon.get(memo)
        if hit is None:
            composed = self._composed(self.events(counts, rounded=not exact), delta)
            hit = min(composed, self.pure(counts))
            self._remember(self._epsilon, memo, hit)
        return hit

    def _composed(self, events: dict[Event, int], delta: float) -> float:
        """``compose(events, delta).epsilon``, computed once when several threads ask at once
        (the prefetch thread and a release's preview): a later caller waits for the first one's
        composition, which then is in the accountant's cache, instead of running the same FFTs
        beside it on a shared core."""
        key = (frozenset(events.items()), delta)
        with self._lock:
            running = self._composing.get(key)
            if running is None:
                self._composing[key] = threading.Event()
        if running is not None:
            running.wait()
            return compose(events, delta).epsilon  # cached by now (or computed, if it failed)
        try:
            return compose(events, delta).epsilon
        finally:
            with self._lock:
                self._composing.pop(key).set()

    def warm(self, before: Counts, cost: Counts, cap: float, delta: float) -> None:
        """Compute (and cache) what :meth:`fits` will need for ``cost`` after ``before``: the
        report-grid figure of both, and, when that does not decide (near the cap), the
        capacity search (see :func:`gazeguard.privacy.accounting.capacity`)."""
        self.fits(before, cost, cap, delta)

    def fits(self, before: Counts, cost: Counts, cap: float, delta: float) -> bool:
        """Whether ``before + cost`` stays within ``cap`` (ε at ``delta``), on exact counts.

        A pure function of its arguments, remembered for the last :data:`FITS_MEMO` questions:
        a release's preview and its charge (and the gaze and wall-clock windows, which hold the
        same charges in a steady stream) ask the same one."""
        memo = (tuple(sorted(before.items())), tuple(sorted(cost.items())), cap, delta)
        hit = self._fits.get(memo)
        if hit is None:
            hit = self._fits_exact(before, cost, cap, delta)
            self._remember(self._fits, memo, hit)
        return hit

    def _remember(
        self, memo: dict[tuple[object, ...], T], key: tuple[object, ...], value: T
    ) -> None:
        """Store an answer in ``memo`` (emptied when it holds :data:`FITS_MEMO`), under the lock."""
        with self._lock:
            if len(memo) >= FITS_MEMO:
                memo.clear()
            memo[key] = value

    def _fits_exact(self, before: Counts, cost: Counts, cap: float, delta: float) -> bool:
        total = merged(before, cost)
        units = self.pure_units(total)
        if units is not None and units <= to_units_down(cap, "cap"):
            return True
        step = self.events(cost)
        if not step:
            return True
        if self.epsilon(total, delta) <= cap:
            # The report-grid figure: its counts are ``total``'s rounded up, so it bounds the
            # loss of ``total`` (more releases never lose less), and a charge composes it for
            # its figures anyway. Only near the cap does the exact search below decide.
            return True
        limit = PrivacyLoss.approx(cap, delta)
        return capacity(step, limit, self.events(before)) >= 1
