"""One processing step for the blocks of every partition: what the partitions' tasks hand in
meanwhile is processed together, at most once per period.

A fleet worker's cost is per call, not per sample: a block processed alone pays the decoder's,
the event detector's and the feature extractor's per-call work for a few samples. Processed
together, the sessions of *all* partitions share one decode, one event and feature step
(:func:`~gazeguard.features.push_many`) and one charge transaction; how many blocks a step holds
grows with the load (a step runs as soon as the previous one started ``period_s`` ago).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Ticks(Generic[T]):
    """Collect items handed in by many tasks; run ``step`` over all of them at most once per
    ``period_s`` (the first after a quiet spell at once, at the loop's next turn).

    :meth:`submit` returns once the step that took its items is over (or raises what that step
    raised), so a caller that waits before it submits again never has items in two steps:
    each step holds at most one hand-in per caller. Steps may overlap (the next one starts
    while an earlier one awaits, e.g. its charges in a worker thread); their items are
    distinct callers'.

    Args:
        step: processes one step's items, in the order they were handed in.
        period_s: at most one step starts per this many seconds; 0: whenever the loop is free.
    """

    def __init__(self, step: Callable[[list[T]], Awaitable[None]], period_s: float) -> None:
        self._step = step
        self.period_s = period_s
        self.steps = 0  # steps started
        self.items = 0  # items they took
        self._pending: list[T] = []
        self._done: asyncio.Future[None] | None = None  # the next step's: set when it is over
        self._ready = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()

    async def submit(self, items: list[T]) -> None:
        """Hand ``items`` to the next step and wait until it is over.

        Raises:
            Exception: what the step raised (every caller of that step sees it).
        """
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
        done = self._done
        self._pending.extend(items)
        self._ready.set()
        await asyncio.shield(done)  # a caller cancelled does not cancel the others' step

    async def run(self) -> None:
        """Start the steps, until cancelled (then the steps in progress are cancelled too)."""
        started = -math.inf
        try:
            while True:
                await self._ready.wait()
                await asyncio.sleep(max(0.0, started + self.period_s - time.monotonic()))
                started = time.monotonic()
                items, done = self._pending, self._done
                self._pending, self._done = [], None
                self._ready.clear()
                assert done is not None
                self.steps += 1
                self.items += len(items)
                task = asyncio.create_task(self._run_step(items, done))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
        finally:
            for task in list(self._running):
                task.cancel()
            for task in list(self._running):
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _run_step(self, items: list[T], done: asyncio.Future[None]) -> None:
        try:
            await self._step(items)
        except asyncio.CancelledError:
            done.cancel()
            raise
        except Exception as exc:
            log.debug("a step of %d items failed: %r", len(items), exc)
            done.set_exception(exc)
            done.exception()  # (retrieved here: a caller may be gone; the others still raise)
        else:
            done.set_result(None)
