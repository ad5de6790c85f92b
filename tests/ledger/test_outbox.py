"""The outbox drain on its own: a real SQLite ledger in ``tmp_path`` drained through an in-process
sink that keeps what it accepts in a list (no broker): order, refused items moved aside, retries
after a lost connection, latest values."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from gazeguard.ledger import Ledger, pure_cost
from gazeguard.ledger.outbox import DELIVERED, Delivery, Drain, SinkUnavailableError

pytestmark = pytest.mark.timeout(30)

SESSION = "s"


class ListSink:
    """A sink that appends what it accepts to :attr:`received`, ``(topic, payload, retain)``.

    Refuses the topics in ``refuse`` for good. Loses its connection once at each topic in
    ``fail_once``: before the message arrives, or (``ack_lost``) after it arrived but before
    the drain heard back, as when a PUBACK is lost with the connection.
    """

    name = "list sink"
    advice = "check the list"
    label = "list sink (test)"

    def __init__(
        self, *, refuse: Iterable[str] = (), fail_once: Iterable[str] = (), ack_lost: bool = False
    ) -> None:
        self.received: list[tuple[str, bytes, bool]] = []
        self.attempts: list[str] = []
        self.connects = 0
        self._refuse = set(refuse)
        self._fail_once = set(fail_once)
        self._ack_lost = ack_lost
        self._lost = False

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[ListSink]:
        self.connects += 1
        self._lost = False
        yield self

    async def deliver(self, topic: str, payload: bytes, *, retain: bool) -> Delivery:
        await asyncio.sleep(0)  # a real sink waits for the other side
        self.attempts.append(topic)
        if self._lost:  # as on a real connection: what was sent after the loss is lost too
            raise SinkUnavailableError(f"connection lost before {topic}")
        if topic in self._refuse:
            return Delivery(f"{topic} is not for this list")
        if topic in self._fail_once:
            self._fail_once.discard(topic)
            self._lost = True
            if self._ack_lost:
                self.received.append((topic, payload, retain))
            raise SinkUnavailableError(f"connection lost at {topic}")
        self.received.append((topic, payload, retain))
        return DELIVERED

    async def wait_lost(self) -> None:
        await asyncio.Event().wait()  # never lost by itself


class ThreadNotingLedger(Ledger):
    """A real SQLite ledger that notes which threads make the drain's calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.threads: set[str] = set()

    def pending(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.add(threading.current_thread().name)
        return super().pending(*args, **kwargs)

    def mark_delivered_many(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.add(threading.current_thread().name)
        return super().mark_delivered_many(*args, **kwargs)


def charge(ledger: Ledger, index: int, session: str = SESSION) -> int:
    """Charge item ``index`` of ``session``, published on topic ``t/{index}`` (the default
    session) or ``{session}/{index}``; its outbox id."""
    payload = f"payload {index}".encode()
    topic = f"t/{index}" if session == SESSION else f"{session}/{index}"
    return ledger.charge(
        session, index, pure_cost({"a": 0.1}), topic=topic, payload=payload
    ).outbox_id


class GatedSink(ListSink):
    """A list sink whose receiver answers only once :attr:`gate` is set (a slow round trip);
    :attr:`in_flight` is set once ``expect`` messages were handed to it."""

    def __init__(self, expect: int) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.in_flight = asyncio.Event()
        self._expect = expect

    async def deliver(self, topic: str, payload: bytes, *, retain: bool) -> Delivery:
        self.attempts.append(topic)  # handed to the transport before the first suspension
        if len(self.attempts) >= self._expect:
            self.in_flight.set()
        await self.gate.wait()
        self.received.append((topic, payload, retain))
        return DELIVERED


def test_a_pass_is_in_flight_together_and_arrives_in_order(tmp_path: Path) -> None:
    """Five items charged together are all handed to the sink before the first answer comes
    back (one round trip for the group, not one each), in outbox order, and are marked
    delivered in that order, in one ledger transaction, once the answers come."""
    marks: list[list[int]] = []

    class MarkNotingLedger(Ledger):
        def mark_delivered_many(self, outbox_ids: Sequence[int]) -> int:
            marks.append(list(outbox_ids))
            return super().mark_delivered_many(outbox_ids)

    ledger = MarkNotingLedger(tmp_path / "ledger.sqlite")
    ids = [charge(ledger, i) for i in range(5)]
    sink = GatedSink(expect=5)
    acked: list[int] = []

    async def scenario() -> None:
        async with Drain(
            ledger, sink, connect_timeout=5, on_acked=lambda item: acked.append(item.id)
        ) as drain:
            async with asyncio.timeout(5):
                await sink.in_flight.wait()
            assert sink.received == [], "no answer yet: all five were in flight together"
            sink.gate.set()
            await drain.flush(5)

    asyncio.run(scenario())
    assert sink.attempts == [f"t/{i}" for i in range(5)]
    assert [t for t, _, _ in sink.received] == [f"t/{i}" for i in range(5)]
    assert acked == ids
    assert marks == [ids], "the pass is marked delivered in one ledger transaction"
    assert ledger.pending() == []
    ledger.close()


@pytest.mark.parametrize("inline", [False, True])
def test_drains_in_order_moves_a_refused_item_aside_and_retries_a_lost_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, inline: bool
) -> None:
    """Item 2 is refused for good, the connection is lost once at item 3: 0, 1, 3, 4 arrive in
    this order, once each; 2 is kept in the ledger as refused with the sink's reason; the drain
    reconnected once and went on from item 3 (items are in flight together: 4, sent on the lost
    connection after 3, is sent again too). The same with the outbox calls made on the event
    loop (``inline``, a fleet worker's local ledger) as in worker threads."""
    ledger = ThreadNotingLedger(tmp_path / "ledger.sqlite")
    ids = [charge(ledger, i) for i in range(5)]
    sink = ListSink(refuse={"t/2"}, fail_once={"t/3"})
    acked: list[int] = []

    async def scenario() -> Drain:
        drain = Drain(
            ledger,
            sink,
            connect_timeout=5,
            reconnect_max_s=0.05,
            on_acked=lambda item: acked.append(item.id),
            inline=inline,
        )
        async with drain:
            await drain.flush(10)
            assert drain.connected
        return drain

    with caplog.at_level(logging.WARNING, logger="gazeguard.ledger.outbox"):
        drain = asyncio.run(scenario())
    threads = set(ledger.threads)  # (the checks below read the ledger on this thread)
    assert [(t, p) for t, p, _ in sink.received] == [
        (f"t/{i}", f"payload {i}".encode()) for i in (0, 1, 3, 4)
    ]
    assert not any(retain for *_, retain in sink.received)
    # all five in flight at once; 4, sent after the loss at 3, is lost with it and sent again
    assert sink.attempts == ["t/0", "t/1", "t/2", "t/3", "t/4", "t/3", "t/4"]
    assert acked == [ids[i] for i in (0, 1, 3, 4)]
    assert (drain.delivered, drain.refused_items, drain.connections, sink.connects) == (4, 1, 2, 2)
    assert drain.refusals == 1  # the refused item; the lost connection is no refusal
    assert ledger.pending() == []
    (refused,) = ledger.refused(SESSION)
    assert (refused.id, refused.chunk_index, refused.topic) == (ids[2], 2, "t/2")
    assert "t/2 is not for this list" in refused.reason
    state = ledger.state(SESSION)
    assert (state.chunks, state.refused) == (5, 1)  # a refused item's ε stays spent
    retries = [r.getMessage() for r in caplog.records if "next retry in" in r.getMessage()]
    assert len(retries) == 1
    assert retries[0].startswith("list sink: connection lost at t/3.")
    if inline:
        assert threads == {threading.current_thread().name}, threads
    else:
        assert threading.current_thread().name not in threads, threads
    ledger.close()


def test_an_acknowledgement_lost_with_the_connection_means_the_item_comes_again(
    tmp_path: Path,
) -> None:
    """At least once: item 1 arrived but the connection went before the answer; after the
    reconnect it is sent again, and the order holds (deduplicated: 0, 1, 2)."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for i in range(3):
        charge(ledger, i)
    sink = ListSink(fail_once={"t/1"}, ack_lost=True)

    async def scenario() -> Drain:
        async with Drain(ledger, sink, connect_timeout=5, reconnect_max_s=0.05) as drain:
            await drain.flush(10)
        return drain

    drain = asyncio.run(scenario())
    assert [t for t, *_ in sink.received] == ["t/0", "t/1", "t/1", "t/2"]
    assert (drain.delivered, drain.connections) == (3, 2)
    assert ledger.pending() == []
    ledger.close()


def test_an_item_the_table_delivered_before_its_notify_is_not_sent_again(tmp_path: Path) -> None:
    """A push that charges two chunks commits the first, then the second, then returns and
    notify() hands both over; a table read in between delivers them first. The late hand-over
    sent the first again (CI: a subscriber got chunks 0, 1, 2, 3, 2). Each item arrives once."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    sink = ListSink()

    async def scenario() -> Drain:
        async with Drain(ledger, sink, connect_timeout=5, reconnect_max_s=0.05) as drain:
            charge(ledger, 0)
            charge(ledger, 1)
            committed = ledger.pending()
            await drain.flush(10)  # a table read delivers both
            drain.notify(committed)  # the push returns now
            charge(ledger, 2)
            drain.notify([item for item in ledger.pending() if item.chunk_index == 2])
            await drain.flush(10)
        return drain

    drain = asyncio.run(scenario())
    assert [t for t, *_ in sink.received] == ["t/0", "t/1", "t/2"]
    assert drain.delivered == 3
    assert ledger.pending() == []
    ledger.close()


def test_latest_values_follow_the_outbox_and_are_sent_again_after_a_reconnect(
    tmp_path: Path,
) -> None:
    """Only the newest value of a topic is sent, retained, after the outbox items; after a
    reconnect (lost at item 1, charged later and handed over by notify) it is sent again."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    charge(ledger, 0)
    sink = ListSink(fail_once={"t/1"})

    async def scenario() -> None:
        async with Drain(ledger, sink, connect_timeout=5, reconnect_max_s=0.05) as drain:
            drain.put_latest("status", b"old")
            drain.put_latest("status", b"new")
            await drain.flush(10)
            oid = charge(ledger, 1)
            drain.notify([item for item in ledger.pending() if item.id == oid])
            await drain.flush(10)
            assert drain.connections == 2

    asyncio.run(scenario())
    assert sink.received == [
        ("t/0", b"payload 0", False),
        ("status", b"new", True),
        ("t/1", b"payload 1", False),
        ("status", b"new", True),
    ]
    ledger.close()


@pytest.mark.slow
def test_an_item_another_process_has_in_flight_is_left_to_it_then_taken_over(
    tmp_path: Path,
) -> None:
    """Two workers share a ledger and both read its outbox table. An item the other one has
    just charged (and is sending) is not sent by this drain as well (CI: a cohort bucket
    published twice by two fleet workers), nor are that session's later items; once it is two
    poll intervals old (its process died) this drain delivers them, in order. Its own items
    and other sessions' go at once."""
    path = tmp_path / "ledger.sqlite"
    here, other = Ledger(path), Ledger(path)  # another process's connection to the same file
    sink = ListSink()

    async def scenario() -> tuple[list[str], list[str]]:
        async with Drain(here, sink, connect_timeout=5, poll_interval_s=1.0) as drain:
            charge(other, 0, session="busy")
            charge(other, 1, session="busy")
            charge(here, 0)
            drain.notify()
            await drain.flush(10)
            early = [t for t, *_ in sink.received]
            await asyncio.sleep(2.2)  # two poll intervals: the other process is taken as gone
            await drain.flush(10)  # (a table read)
        return early, [t for t, *_ in sink.received]

    early, late = asyncio.run(scenario())
    assert early == ["t/0"]  # this ledger's own item; the other's wait for it
    assert late == ["t/0", "busy/0", "busy/1"]  # taken over once old enough, in order
    assert here.pending() == []
    here.close()
    other.close()
