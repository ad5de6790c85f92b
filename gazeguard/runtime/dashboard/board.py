"""What the dashboard knows: the recent aggregates and modes of every (cohort, worker), the
latest attention message of every (cohort, worker), the broker's state, and the pages listening.

:class:`Board` is fed by :mod:`gazeguard.runtime.dashboard.feed` (one call per MQTT message) and
read by
:mod:`gazeguard.runtime.dashboard.server`: a page that connects gets :meth:`Board.snapshot` first,
then
every change as an :class:`Event`. Everything it keeps is bounded (aggregates per stream, streams,
cohorts, listeners' queues), whatever the broker sends.

An aggregate is accepted only if it validates as :class:`~gazeguard.wire.cohort.CohortMessage`
(what the workers of this gazeguard version publish), an attention message only as
:class:`~gazeguard.wire.cohort.AttentionMessage`, a mode only as
:class:`~gazeguard.wire.cohort.ModeMessage`; one that does not is counted and its first
error shown. Delivery is at least once: a second copy of ``(cohort, worker, bucket)`` is dropped.
Each kept message carries, beside its own fields, ``readability``: whether each figure's noise
band lets a reader read it and the sessions it would need
(:mod:`~gazeguard.runtime.dashboard.readability`), ``received_at`` and ``topic``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from pydantic import ValidationError

from gazeguard.runtime.dashboard.readability import (
    aggregate_readability,
    attention_readability,
    mode_readability,
)
from gazeguard.wire.cohort import AttentionMessage, CohortMessage, ModeMessage

log = logging.getLogger(__name__)

#: Aggregates kept per (cohort, worker): the page draws their history.
HISTORY: Final = 60
#: Most (cohort, worker) streams and cohorts with attention data kept; later ones are dropped.
MAX_STREAMS: Final = 256
#: Largest attention message read, bytes.
MAX_PAYLOAD: Final = 4 * 2**20
#: Events queued for one page before it is dropped (its browser reconnects and gets a snapshot).
QUEUE: Final = 1_000


@dataclass(frozen=True)
class Event:
    """One change for the pages: ``name`` is the Server-Sent Events ``event:`` field (``snapshot``,
    ``aggregate``, ``attention``, ``mode``, ``broker``, ``invalid``); ``data`` its JSON."""

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


_Message = TypeVar("_Message", CohortMessage, AttentionMessage, ModeMessage)
_Bucketed = TypeVar("_Bucketed", CohortMessage, ModeMessage)


@dataclass(frozen=True)
class _BucketedKind(Generic[_Bucketed]):
    """A message kind of which the board keeps the recent buckets per (cohort, worker): its
    model, what an invalid one is called, its readability and its event's name."""

    model: type[_Bucketed]
    what: str
    readability: Callable[[_Bucketed], dict[str, Any]]
    event: str


_AGGREGATE: Final = _BucketedKind(
    CohortMessage, "gazeguard.cohort/1 aggregate", aggregate_readability, "aggregate"
)
_MODE: Final = _BucketedKind(ModeMessage, "gazeguard.mode/1 message", mode_readability, "mode")


def _document(
    message: CohortMessage | AttentionMessage | ModeMessage, readability: dict[str, Any], topic: str
) -> dict[str, Any]:
    """What the page gets of a message: its JSON fields, ``readability``, ``received_at`` (Unix
    seconds) and ``topic``."""
    doc = message.model_dump(mode="json", by_alias=True)
    doc["readability"] = readability
    doc["received_at"] = time.time()
    doc["topic"] = topic
    return doc


def _keep_in_order(kept: deque[dict[str, Any]], doc: dict[str, Any]) -> None:
    """Append ``doc`` to ``kept``, keeping the buckets in order when it arrives late."""
    kept.append(doc)
    if len(kept) > 1 and kept[-2]["bucket"] > doc["bucket"]:
        ordered = sorted(kept, key=lambda d: int(d["bucket"]))
        kept.clear()
        kept.extend(ordered)


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
        self.attention: dict[tuple[str, str], dict[str, Any]] = {}  # the latest per stream
        self.modes: dict[tuple[str, str], deque[dict[str, Any]]] = {}
        self.broker: dict[str, Any] = {"state": "connecting", "address": "", "detail": None}
        self.invalid = 0
        self.last_invalid: str | None = None
        self.dropped = 0  # messages of streams or cohorts beyond MAX_STREAMS
        self._listeners: set[asyncio.Queue[Event | None]] = set()

    # ---------------------------------------------------------------------------- the feed

    def receive(self, topic: str, payload: bytes) -> None:
        """One MQTT message on ``{prefix}/cohort/+/aggregates``, ``…/attention`` or ``…/mode``."""
        parts = _topic_parts(topic, self.prefix)
        if parts is None:
            return
        if parts[1] == "aggregates":
            self._aggregate(topic, payload)
        elif parts[1] == "attention":
            self._attention(topic, payload)
        elif parts[1] == "mode":
            self._mode(topic, payload)

    def _aggregate(self, topic: str, payload: bytes) -> None:
        self._bucketed(topic, payload, _AGGREGATE, self.aggregates)

    def _attention(self, topic: str, payload: bytes) -> None:
        if len(payload) > MAX_PAYLOAD:
            self._invalid(topic, f"{len(payload)} bytes: more than the {MAX_PAYLOAD} drawn")
            return
        message = self._parse(AttentionMessage, topic, payload, "gazeguard.attention/1 message")
        if message is None:
            return
        key = (message.cohort, message.worker)
        kept = self.attention.get(key)
        if kept is None and len(self.attention) >= MAX_STREAMS:
            self.dropped += 1
            return
        if kept is not None and kept["bucket"] >= message.bucket:
            return  # a second delivery, or older than the one drawn
        doc = _document(message, attention_readability(message), topic)
        self.attention[key] = doc
        self._emit(Event("attention", doc))

    def _mode(self, topic: str, payload: bytes) -> None:
        self._bucketed(topic, payload, _MODE, self.modes)

    def _bucketed(
        self,
        topic: str,
        payload: bytes,
        kind: _BucketedKind[_Bucketed],
        store: dict[tuple[str, str], deque[dict[str, Any]]],
    ) -> None:
        """Keep in ``store`` a message of which the page draws the recent buckets and emit it,
        unless it is invalid or there is nothing to draw (see :meth:`_history`)."""
        message = self._parse(kind.model, topic, payload, kind.what)
        if message is None:
            return
        kept = self._history(store, message)
        if kept is None:
            return
        doc = _document(message, kind.readability(message), topic)
        _keep_in_order(kept, doc)
        self._emit(Event(kind.event, doc))

    def _parse(
        self, model: type[_Message], topic: str, payload: bytes, what: str
    ) -> _Message | None:
        """``payload`` validated as ``model``; ``None``, counted and logged as invalid, if not."""
        try:
            return model.model_validate_json(payload)
        except ValidationError as exc:
            self._invalid(topic, f"not a valid {what}: {_first(exc)}")
            return None

    def _history(
        self,
        store: dict[tuple[str, str], deque[dict[str, Any]]],
        message: CohortMessage | ModeMessage,
    ) -> deque[dict[str, Any]] | None:
        """The kept buckets of ``message``'s (cohort, worker) in ``store``, made if new; ``None``
        when there is nothing to draw: a new stream beyond :data:`MAX_STREAMS` (counted in
        ``dropped``), a second delivery (QoS 1 is at least once), or a bucket older than every
        bucket kept."""
        key = (message.cohort, message.worker)
        kept = store.get(key)
        if kept is None:
            if len(store) >= MAX_STREAMS:
                self.dropped += 1
                return None
            kept = store[key] = deque(maxlen=self.history)
        if any(d["bucket"] == message.bucket for d in kept) or (
            len(kept) == kept.maxlen and message.bucket < kept[0]["bucket"]
        ):
            return None
        return kept

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
                "modes": [m for kept in self.modes.values() for m in kept],
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
