"""What the dashboard knows: the recent aggregates of every (cohort, worker), the latest
attention message of every cohort, the broker's state, and the pages listening.

:class:`Board` is fed by :mod:`gazeguard.runtime.dashboard.feed` (one call per MQTT message) and
read by
:mod:`gazeguard.runtime.dashboard.server`: a page that connects gets :meth:`Board.snapshot` first,
then
every change as an :class:`Event`. Everything it keeps is bounded (aggregates per stream, streams,
cohorts, listeners' queues), whatever the broker sends.

An aggregate is accepted only if it validates as :class:`~gazeguard.wire.cohort.CohortMessage`
(what the workers of this gazeguard version publish); one that does not is counted and its first
error shown. Delivery is at least once: a second copy of ``(cohort, worker, bucket)`` is dropped.

The attention message is being designed elsewhere, so it is read generically
(:func:`attention_view`): a JSON object whose ``grid`` is a 2-D array of numbers, with ``rows``
and ``cols`` as axis labels (lists) or sizes (integers) when present, and its other scalar fields
shown as they are.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from gazeguard.wire.cohort import CohortMessage

log = logging.getLogger(__name__)

#: Aggregates kept per (cohort, worker): the page draws their history.
HISTORY: Final = 60
#: Most (cohort, worker) streams and cohorts with attention data kept; later ones are dropped.
MAX_STREAMS: Final = 256
#: Largest attention grid drawn (cells), and most of its other fields shown.
MAX_CELLS: Final = 65_536
MAX_FIELDS: Final = 24
MAX_PAYLOAD: Final = 4 * 2**20
#: Events queued for one page before it is dropped (its browser reconnects and gets a snapshot).
QUEUE: Final = 1_000


@dataclass(frozen=True)
class Event:
    """One change for the pages: ``name`` is the Server-Sent Events ``event:`` field (``snapshot``,
    ``aggregate``, ``attention``, ``broker``, ``invalid``); ``data`` its JSON."""

    name: str
    data: dict[str, Any]

    def encode(self) -> bytes:
        """The event as Server-Sent Events lines."""
        return f"event: {self.name}\ndata: {json.dumps(self.data, allow_nan=False)}\n\n".encode()


def _topic_parts(topic: str, prefix: str) -> tuple[str, str] | None:
    """``(cohort, kind)`` of ``{prefix}/cohort/{cohort}/{kind}``, else ``None``."""
    head = f"{prefix}/cohort/"
    if not topic.startswith(head):
        return None
    cohort, sep, kind = topic[len(head) :].partition("/")
    return (cohort, kind) if sep and cohort and "/" not in kind else None


def _first(exc: ValidationError) -> str:
    """The first error of a validation, in one line (``field: message``), and how many more."""
    errors = exc.errors(include_url=False, include_input=False)
    where = ".".join(str(p) for p in errors[0]["loc"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where + ': ' if where else ''}{errors[0]['msg']}{more}"


def _number(value: object) -> float | None:
    """A finite number, else ``None`` (a missing or unusable cell)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        v = float(value)
    except OverflowError:  # an integer beyond float
        return None
    return v if math.isfinite(v) else None


def _labels(value: object, size: int, axis: str, problems: list[str]) -> list[str] | None:
    """Axis labels from ``rows``/``cols``: a list of ``size`` labels, or an integer that must be
    ``size``; anything else is reported in ``problems`` and ignored."""
    if value is None:
        return None
    if isinstance(value, list):
        if len(value) == size:
            return [str(v)[:40] for v in value]
        problems.append(f"{axis} lists {len(value)} labels for {size} {axis} of the grid")
    elif isinstance(value, int) and not isinstance(value, bool):
        if value != size:
            problems.append(f"{axis} = {value}, but the grid has {size}")
    else:
        problems.append(f"{axis} is neither a list of labels nor a count")
    return None


def attention_view(cohort: str, doc: object) -> dict[str, Any]:
    """An attention message as the page draws it: ``grid`` (rows of numbers or ``None``) or
    ``None`` with ``problem`` saying why, ``rows``/``cols`` labels or ``None``, and ``fields``
    (the message's other scalar fields, as given)."""
    view: dict[str, Any] = {"cohort": cohort, "grid": None, "rows": None, "cols": None}
    problems: list[str] = []
    if not isinstance(doc, dict):
        view |= {"problem": "the message is not a JSON object", "fields": {}}
        return view
    fields: dict[str, Any] = {}
    for key, value in doc.items():
        if key in ("grid", "rows", "cols") or len(fields) >= MAX_FIELDS:
            continue
        if isinstance(value, str):
            fields[str(key)[:60]] = value[:200]
        elif value is None or isinstance(value, bool):
            fields[str(key)[:60]] = value
        elif isinstance(value, int | float):
            fields[str(key)[:60]] = _number(value)
    view["fields"] = fields
    grid = doc.get("grid")
    if (
        not isinstance(grid, list)
        or not grid
        or not all(isinstance(row, list) and row for row in grid)
    ):
        problems.append("no 'grid' (a non-empty 2-D array of numbers)")
    elif len({len(row) for row in grid}) != 1:
        problems.append("the rows of 'grid' differ in length")
    elif len(grid) * len(grid[0]) > MAX_CELLS:
        problems.append(f"'grid' has more than {MAX_CELLS} cells")
    else:
        view["grid"] = [[_number(v) for v in row] for row in grid]
        view["rows"] = _labels(doc.get("rows"), len(grid), "rows", problems)
        view["cols"] = _labels(doc.get("cols"), len(grid[0]), "cols", problems)
    view["problem"] = "; ".join(problems) or None
    return view


class Board:
    """The dashboard's state and its listeners (one asyncio loop; not thread-safe).

    Args:
        prefix: the topic prefix (``broker.topic_prefix``).
        history: aggregates kept per (cohort, worker).
    """

    def __init__(self, prefix: str, history: int = HISTORY) -> None:
        self.prefix = prefix
        self.history = max(1, history)
        self.aggregates: dict[tuple[str, str], deque[dict[str, Any]]] = {}
        self.attention: dict[str, dict[str, Any]] = {}
        self.broker: dict[str, Any] = {"state": "connecting", "address": "", "detail": None}
        self.invalid = 0
        self.last_invalid: str | None = None
        self.dropped = 0  # messages of streams or cohorts beyond MAX_STREAMS
        self._listeners: set[asyncio.Queue[Event | None]] = set()

    # ---------------------------------------------------------------------------- the feed

    def receive(self, topic: str, payload: bytes) -> None:
        """One MQTT message on ``{prefix}/cohort/+/aggregates`` or ``…/attention``."""
        parts = _topic_parts(topic, self.prefix)
        if parts is None:
            return
        cohort, kind = parts
        if kind == "aggregates":
            self._aggregate(topic, payload)
        elif kind == "attention":
            self._attention(cohort, topic, payload)

    def _aggregate(self, topic: str, payload: bytes) -> None:
        try:
            message = CohortMessage.model_validate_json(payload)
        except ValidationError as exc:
            self._invalid(topic, f"not a valid gazeguard.cohort/1 aggregate: {_first(exc)}")
            return
        key = (message.cohort, message.worker)
        kept = self.aggregates.get(key)
        if kept is None:
            if len(self.aggregates) >= MAX_STREAMS:
                self.dropped += 1
                return
            kept = self.aggregates[key] = deque(maxlen=self.history)
        if any(a["bucket"] == message.bucket for a in kept):
            return  # a second delivery (QoS 1 is at least once)
        doc = message.model_dump(mode="json", by_alias=True)
        doc["received_at"] = time.time()
        doc["topic"] = topic
        if len(kept) == kept.maxlen and message.bucket < kept[0]["bucket"]:
            return  # older than every bucket kept: nothing to draw
        kept.append(doc)
        if len(kept) > 1 and kept[-2]["bucket"] > message.bucket:  # late: keep buckets in order
            ordered = sorted(kept, key=lambda a: int(a["bucket"]))
            kept.clear()
            kept.extend(ordered)
        self._emit(Event("aggregate", doc))

    def _attention(self, cohort: str, topic: str, payload: bytes) -> None:
        if len(payload) > MAX_PAYLOAD:
            self._invalid(topic, f"{len(payload)} bytes: more than the {MAX_PAYLOAD} drawn")
            return
        try:
            doc = json.loads(payload)
        except (ValueError, RecursionError) as exc:
            self._invalid(topic, f"not JSON: {exc}")
            return
        if cohort not in self.attention and len(self.attention) >= MAX_STREAMS:
            self.dropped += 1
            return
        view = attention_view(cohort, doc)
        view["received_at"] = time.time()
        view["topic"] = topic
        self.attention[cohort] = view
        self._emit(Event("attention", view))

    def _invalid(self, topic: str, why: str) -> None:
        self.invalid += 1
        self.last_invalid = f"{topic}: {why}"[:500]
        log.warning("dashboard: %s", self.last_invalid)
        self._emit(Event("invalid", {"count": self.invalid, "last": self.last_invalid}))

    def set_broker(self, state: str, address: str, detail: str | None = None) -> None:
        """The broker connection's state (``connecting``, ``connected``, ``waiting``)."""
        self.broker = {"state": state, "address": address, "detail": detail}
        self._emit(Event("broker", dict(self.broker)))

    # ---------------------------------------------------------------------------- the pages

    def snapshot(self) -> Event:
        """Everything kept, as the first event a page receives."""
        return Event(
            "snapshot",
            {
                "prefix": self.prefix,
                "history": self.history,
                "broker": dict(self.broker),
                "aggregates": [a for kept in self.aggregates.values() for a in kept],
                "attention": list(self.attention.values()),
                "invalid": {"count": self.invalid, "last": self.last_invalid},
            },
        )

    def listen(self) -> asyncio.Queue[Event | None]:
        """A queue of the events from now on; ``None`` in it means "you were too slow: close"."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue(QUEUE + 1)
        self._listeners.add(queue)
        return queue

    def unlisten(self, queue: asyncio.Queue[Event | None]) -> None:
        """Stop queueing events for ``queue``."""
        self._listeners.discard(queue)

    @property
    def listeners(self) -> int:
        """Pages connected now."""
        return len(self._listeners)

    def _emit(self, event: Event) -> None:
        for queue in list(self._listeners):
            if queue.qsize() >= QUEUE:  # a stalled page: drop it rather than grow without bound
                self._listeners.discard(queue)
                queue.put_nowait(None)
            else:
                queue.put_nowait(event)
