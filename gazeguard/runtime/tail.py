"""What makes a worker's latency tail: its batches, the garbage collector and event-loop stalls,
as Prometheus histograms on the operator endpoint (:mod:`gazeguard.runtime.metrics`).

Figures of the process's own work, served only with ``metrics.tail`` (off by default): how
long a batch takes depends on how much gaze it carried, so they are a timing side channel on
the gaze, for a trusted operator diagnosing the tail, never for export:

* ``gazeguard_batch_seconds``: how long one batch of blocks took a fleet worker, from its decode
  to its chunks handed to the publisher (:meth:`Fleet.process_many
  <gazeguard.runtime.fleet.Fleet.process_many>`): the unit of work every block waits behind;
* ``gazeguard_gc_pause_seconds{generation}``: every collection of the cyclic garbage collector,
  by generation (``gc.callbacks``), which stops the loop for its duration; one of
  :data:`GC_WARN_S` or more is also said in the local log, with what it freed and what is
  frozen, so that when it came can be read beside the sessions' opens and closes;
* ``gazeguard_loop_stall_seconds``: how late a 50 ms timer of the event loop fires (a stall of
  the loop: a long batch, a collection, a blocking call);
* ``gazeguard_outbox_wait_seconds`` and ``gazeguard_broker_ack_seconds``: the path after the
  charge in two halves, a chunk's charge committed → its send starting (the outbox drain's
  queue: the sends before it, their acknowledgements and delivery marks, a busy loop) and that
  send → its acknowledgement as the drain takes it (the broker, the connection).

Read them beside ``gazeguard_release_seconds``: a p99 that moves with the batch or the pauses is
the worker's own; one that does not is the broker's or the machine's. ``bench/bench_fleet.py``
scrapes them at the end of every level into its results.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram

if TYPE_CHECKING:
    from gazeguard.ledger.outbox import OutboxEntry

log = logging.getLogger(__name__)

#: Histogram buckets of the figures, s.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
#: A collection at least this long, s, is said in the local log.
GC_WARN_S = 0.05
#: The loop-stall probe's period, s.
PROBE_S = 0.05
#: Sends awaiting their acknowledgement kept for ``gazeguard_broker_ack_seconds``; beyond this
#: many (an outage) the oldest are forgotten, not timed.
SENT_KEPT = 4096


class TailProfile:
    """The histograms, registered in ``registry``; :meth:`install` starts the garbage
    collector's timing, :meth:`probe_loop` the loop's (run it as a task), :meth:`sent` and
    :meth:`acked` take the publisher's sends and acknowledgements."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.batch_seconds = Histogram(
            "gazeguard_batch_seconds",
            "A fleet worker's batch of blocks: decode, events, features, release and charge, s",
            buckets=BUCKETS,
            registry=registry,
        )
        self.gc_seconds = Histogram(
            "gazeguard_gc_pause_seconds",
            "One collection of Python's cyclic garbage collector, by generation, s",
            ["generation"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.loop_stall_seconds = Histogram(
            "gazeguard_loop_stall_seconds",
            f"How late a {PROBE_S * 1000:g} ms timer of the event loop fired (a stall), s",
            buckets=BUCKETS,
            registry=registry,
        )
        self.outbox_wait_seconds = Histogram(
            "gazeguard_outbox_wait_seconds",
            "From a chunk's charge committed to its send to the broker starting (the outbox "
            "drain's queue), s",
            buckets=BUCKETS,
            registry=registry,
        )
        self.broker_ack_seconds = Histogram(
            "gazeguard_broker_ack_seconds",
            "From a send to the broker starting to its acknowledgement, as the drain takes it, s",
            buckets=BUCKETS,
            registry=registry,
        )
        self._sent: dict[int, float] = {}  # outbox id → time.perf_counter() of its send
        self._gc_started = 0.0
        self._by_generation = [self.gc_seconds.labels(generation=str(g)) for g in range(3)]

    def sent(self, item: OutboxEntry) -> None:
        """An outbox item's send started: a chunk charged in this run (it carries
        ``charged_at``) is timed from its charge; every item's acknowledgement from now."""
        now = time.perf_counter()
        charged = getattr(item, "charged_at", None)
        if isinstance(charged, float):
            self.outbox_wait_seconds.observe(max(now - charged, 0.0))
        self._sent[item.id] = now
        while len(self._sent) > SENT_KEPT:
            del self._sent[next(iter(self._sent))]

    def acked(self, item: OutboxEntry) -> None:
        """An outbox item's acknowledgement, timed from its send."""
        sent = self._sent.pop(item.id, None)
        if sent is not None:
            self.broker_ack_seconds.observe(max(time.perf_counter() - sent, 0.0))

    def install(self) -> None:
        """Time every collection from now on (until :meth:`uninstall`)."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def uninstall(self) -> None:
        """Stop timing collections."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            took = time.perf_counter() - self._gc_started
            generation = min(int(info["generation"]), 2)
            self._by_generation[generation].observe(took)
            if took >= GC_WARN_S:
                log.warning(
                    "a generation-%d garbage collection stopped the loop for %.0f ms "
                    "(%d objects freed; %d frozen; generation counts %s)",
                    generation,
                    1e3 * took,
                    int(info.get("collected", 0)),
                    gc.get_freeze_count(),
                    gc.get_count(),
                )

    async def probe_loop(self) -> None:
        """Observe the loop's stall every :data:`PROBE_S` until cancelled."""
        while True:
            due = time.perf_counter() + PROBE_S
            await asyncio.sleep(PROBE_S)
            self.loop_stall_seconds.observe(max(0.0, time.perf_counter() - due))
