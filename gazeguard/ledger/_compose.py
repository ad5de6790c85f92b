"""The ledger's composer: event keys → ε at δ, fast enough for every charge.

Pure sequential ε is summed exactly in integer micro-ε (each event's pure ε rounded up), so no
sequence of tiny releases can creep past a cap through floating-point rounding. The (ε, δ) view
comes from the accountant (:mod:`gazeguard.accounting`) when it knows the events.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping

from gazeguard.ledger._model import UNITS_PER_EPSILON, to_units_up

Counts = Mapping[str, int]


def pure_units(key: str) -> int | None:
    """Micro-ε of one release of the event ``key`` (rounded up), ``None`` without a pure bound."""
    doc = json.loads(key)
    eps = doc.get("pure_epsilon", doc.get("epsilon")) if doc.get("family") == "pure" else None
    if eps is None:
        return None
    return to_units_up(float(eps), "epsilon", math.inf)


class LedgerComposer:
    """Composition for the ledger (:class:`gazeguard.ledger.policy.Composer`)."""

    def __init__(self) -> None:
        self._units: dict[str, int | None] = {}
        self._lock = threading.Lock()

    def _unit(self, key: str) -> int | None:
        with self._lock:
            if key not in self._units:
                self._units[key] = pure_units(key)
            return self._units[key]

    def pure_units(self, counts: Counts) -> int | None:
        """Exact sequential pure spend in micro-ε, or ``None`` when unbounded."""
        total = 0
        for key, n in counts.items():
            u = self._unit(key)
            if u is None:
                return None
            total += u * int(n)
        return total

    def pure(self, counts: Counts) -> float:
        """Sequential pure ε (``inf`` without a pure bound)."""
        units = self.pure_units(counts)
        return math.inf if units is None else units / UNITS_PER_EPSILON

    def epsilon(self, counts: Counts, delta: float) -> float:
        """ε at ``delta`` (pure events only: their sequential sum)."""
        del delta
        return self.pure(counts)

    def fits(self, before: Counts, cost: Counts, cap: float, delta: float) -> bool:
        """Whether ``before + cost`` stays within ``cap``."""
        del delta
        total = {k: before.get(k, 0) + cost.get(k, 0) for k in {*before, *cost}}
        units = self.pure_units(total)
        cap_units = round(cap * UNITS_PER_EPSILON)
        return units is not None and units <= cap_units
