"""A release's arguments, checked before any transaction: the session and its index, its
:data:`Cost` (validated once per shape and remembered: a fleet charges the same few shapes again
and again), the gaze span and the payload.

A release's cost is typed: the accounting event of each released item
(:mod:`gazeguard.privacy.accounting`). The ledger's stored forms are derived from it here, at the
storage edge, and nowhere else: the event counts under their keys (:func:`event_key`), and the
pure ε of each item (the sequential record, ``charges.epsilon``).

No clock and no storage here: :mod:`gazeguard.ledger._ledger` passes the time it read and runs
the transactions.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias, get_args

from gazeguard.core.errors import ConfigError
from gazeguard.ledger._model import event_key, to_units_up
from gazeguard.privacy.accounting import Event, PrivacyLoss, PureEvent

Cost: TypeAlias = Mapping[str, Event]
"""What one release costs one person: the accounting event of each released item by its name
(a feature, ``label``, a cohort part's stream). The event counts and the pure ε per item the
ledger records are derived from it."""

_EVENT_TYPES = get_args(Event)


def pure_cost(epsilon: Mapping[str, float]) -> dict[str, Event]:
    """The cost of a release that states only a pure ε per item (dimensionless, finite and
    > 0): one :class:`~gazeguard.privacy.accounting.PureEvent` each (ConfigError otherwise)."""
    out: dict[str, Event] = {}
    for name, value in epsilon.items():
        PrivacyLoss.pure(value, field=f"epsilon[{name!r}]")  # the error names the item
        out[str(name)] = PureEvent(value)
    return out


@dataclass(frozen=True, slots=True)
class Release:
    """A release's cost in its stored forms: pure ε per item (``inf`` without a pure
    guarantee), their micro-ε total (``None`` then), the event counts by key, and the ε per item
    as stored (JSON)."""

    epsilon: dict[str, float]
    units: int | None
    events: dict[str, int]
    epsilon_json: str


@dataclass(frozen=True, slots=True)
class ChargeRequest:
    """One release for :meth:`~gazeguard.ledger.Ledger.charge_many` (the arguments of
    :meth:`~gazeguard.ledger.Ledger.charge`)."""

    session: str
    chunk_index: int
    cost: Cost
    topic: str
    payload: bytes
    gaze: tuple[float, float] | None = None
    stream: str = "chunks"
    version: int | None = None


def check_release(session: str, index: int) -> None:
    """A session name (non-empty) and a release index (int >= 0), or ConfigError."""
    if not isinstance(session, str) or not session:
        raise ConfigError("session", session, "must be a non-empty string")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ConfigError("chunk_index", index, "must be an integer >= 0")


def validated_request(request: ChargeRequest, now: float) -> tuple[Release, tuple[float, float]]:
    """A charge request's release and gaze span (Unix s; ``now`` when it names none), checked
    (ConfigError, TypeError)."""
    check_release(request.session, request.chunk_index)
    release = checked_release(request.cost)
    span = gaze_span(request.gaze, now)
    if not isinstance(request.payload, bytes | bytearray | memoryview):
        msg = f"payload must be bytes, got {type(request.payload).__name__}"
        raise TypeError(msg)
    return release, span


#: Validated releases by their costs: a fleet's pipelines charge the same few shapes again and
#: again (48 events keyed and their ε converted to micro-ε each).
_RELEASES: dict[tuple[tuple[str, Event], ...], Release] = {}
_RELEASES_MAX = 1024
_releases_lock = threading.Lock()


def checked_release(cost: Cost) -> Release:
    """A release's cost in its stored forms, validated (ConfigError), remembered for an equal
    cost."""
    memo: tuple[tuple[str, Event], ...] | None = None
    hit = None
    # Only plain str names and known events are remembered: equal keys then mean equal releases.
    if isinstance(cost, Mapping) and all(
        type(k) is str and isinstance(e, _EVENT_TYPES) for k, e in cost.items()
    ):
        memo = tuple(cost.items())
        hit = _RELEASES.get(memo)
    if hit is not None:
        return hit
    out = _validated_release(cost)
    if memo is not None:
        with _releases_lock:
            if len(_RELEASES) >= _RELEASES_MAX:
                _RELEASES.clear()
            _RELEASES[memo] = out
    return out


def _validated_release(cost: Cost) -> Release:
    """The stored forms of ``cost``: each item's pure ε and the events counted by key, checked
    (ConfigError)."""
    if not isinstance(cost, Mapping) or not cost:
        raise ConfigError("cost", cost, "a release covers at least one feature")
    eps: dict[str, float] = {}
    units: int | None = 0
    counted: dict[str, int] = {}
    for name, event in cost.items():
        if not isinstance(event, _EVENT_TYPES):
            what = "must be an accounting event (gazeguard.privacy.accounting)"
            raise ConfigError(f"cost[{name!r}]", event, what)
        v = event.pure_epsilon
        if v == math.inf:
            units = None
        else:
            u = to_units_up(v, f"epsilon[{name!r}]")
            units = None if units is None else units + u
        eps[str(name)] = v
        key = event_key(event)
        counted[key] = counted.get(key, 0) + 1
    return Release(eps, units, counted, json.dumps(eps))


def gaze_span(gaze: tuple[float, float] | None, now: float) -> tuple[float, float]:
    """The release's gaze ``(start, end)``, Unix s, checked (ConfigError); ``(now, now)`` for
    ``None``."""
    if gaze is None:
        return now, now
    start, end = float(gaze[0]), float(gaze[1])
    if not (math.isfinite(start) and math.isfinite(end) and start <= end):
        raise ConfigError("gaze", gaze, "must be finite Unix times (start, end) with start <= end")
    return start, end
