"""A release's arguments, checked before any transaction: the session and its index, the pure ε
per feature and the accounting events (validated once per shape and remembered: a fleet charges
the same few shapes again and again), the gaze span and the payload.

No clock and no storage here: :mod:`gazeguard.ledger._ledger` passes the time it read and runs
the transactions.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from gazeguard.core.errors import ConfigError
from gazeguard.ledger._model import pure_event_key, to_units_up
from gazeguard.ledger.policy import Counts


@dataclass(frozen=True, slots=True)
class Release:
    """A release's cost, validated: pure ε per feature, its micro-ε total, its events, and the
    ε per feature as stored (JSON)."""

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
    epsilon: Mapping[str, float]
    topic: str
    payload: bytes
    events: Counts | None = None
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
    release = checked_release(request.epsilon, request.events)
    span = gaze_span(request.gaze, now)
    if not isinstance(request.payload, bytes | bytearray | memoryview):
        msg = f"payload must be bytes, got {type(request.payload).__name__}"
        raise TypeError(msg)
    return release, span


#: Validated releases by their arguments (types included: ``True`` is no count): a fleet's
#: pipelines charge the same few shapes again and again (48 ε converted to micro-ε each).
_RELEASES: dict[tuple[object, object], Release] = {}
_RELEASES_MAX = 1024
_releases_lock = threading.Lock()


def checked_release(epsilon: Mapping[str, float], events: Counts | None) -> Release:
    """A release's cost, validated (ConfigError), remembered for the same arguments."""
    memo: tuple[object, object] | None = None
    hit = None
    # Only plain str names and int counts are remembered: equal keys then mean equal releases
    # (1, 1.0 and True are equal keys with different names; True is no count).
    plain_events = events is None or (
        set(map(type, events)) == {str} and set(map(type, events.values())) == {int}
    )
    if plain_events and set(map(type, epsilon)) == {str}:
        try:
            memo = (tuple(epsilon.items()), None if events is None else tuple(events.items()))
            hit = _RELEASES.get(memo)
        except TypeError:  # an unhashable value: validate it plainly
            memo = None
    if hit is not None:
        return hit
    out = _validated_release(epsilon, events)
    if memo is not None:
        with _releases_lock:
            if len(_RELEASES) >= _RELEASES_MAX:
                _RELEASES.clear()
            _RELEASES[memo] = out
    return out


def _validated_release(epsilon: Mapping[str, float], events: Counts | None) -> Release:
    """The release of pure ε per feature ``epsilon`` and accounting ``events`` (default: one
    pure-ε event per feature), checked (ConfigError)."""
    if not epsilon:
        raise ConfigError("epsilon", dict(epsilon), "a release covers at least one feature")
    eps: dict[str, float] = {}
    units: int | None = 0
    for name, value in epsilon.items():
        v = float(value)
        if v == math.inf:
            units = None
        else:
            u = to_units_up(v, f"epsilon[{name!r}]")
            units = None if units is None else units + u
        eps[str(name)] = v
    if events is None:
        counted: dict[str, int] = {}
        for v in eps.values():
            if v == math.inf:
                raise ConfigError("events", None, "a release without a pure ε must name its events")
            key = pure_event_key(v)
            counted[key] = counted.get(key, 0) + 1
        events = counted
    bad = [k for k, n in events.items() if isinstance(n, bool) or not isinstance(n, int) or n < 1]
    if not events or bad:
        raise ConfigError("events", dict(events), "must map event keys to counts >= 1")
    return Release(eps, units, dict(events), json.dumps(eps))


def gaze_span(gaze: tuple[float, float] | None, now: float) -> tuple[float, float]:
    """The release's gaze ``(start, end)``, Unix s, checked (ConfigError); ``(now, now)`` for
    ``None``."""
    if gaze is None:
        return now, now
    start, end = float(gaze[0]), float(gaze[1])
    if not (math.isfinite(start) and math.isfinite(end) and start <= end):
        raise ConfigError("gaze", gaze, "must be finite Unix times (start, end) with start <= end")
    return start, end
