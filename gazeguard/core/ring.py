"""Hand-off from the LSL pull thread to asyncio: a bounded queue whose overflow is counted.

The pull thread must never block on a slow consumer (liblsl keeps buffering meanwhile, and a
blocked thread cannot notice that it should stop), so blocks are offered with
``loop.call_soon_threadsafe`` and, when the queue is full, the newest block is dropped and its
samples are counted as overflow. End-of-stream and errors are never dropped: they make room by
evicting the oldest block (counted too), so the consumer always learns why iteration stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)


class _End:
    """Marker put on the queue when the producer ends normally."""


_END = _End()


class BlockQueue(Generic[T]):
    """A bounded asyncio queue of blocks fed from another thread.

    Args:
        loop: the event loop the consumer runs on.
        maxsize: most blocks held at once (>= 1).
        size_of: number of samples in a block, for the overflow counter.
        what: name used in log lines (e.g. the stream name).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        maxsize: int,
        size_of: Callable[[T], int],
        what: str,
    ) -> None:
        if maxsize < 1:
            msg = f"BlockQueue maxsize must be >= 1, got {maxsize}"
            raise ValueError(msg)
        self._loop = loop
        self._queue: asyncio.Queue[T | _End | BaseException] = asyncio.Queue(maxsize)
        self._size_of = size_of
        self._what = what
        self.overflow_samples = 0
        self.overflow_blocks = 0

    # -- producer side (any thread) -------------------------------------------------------
    def offer(self, block: T) -> bool:
        """Offer ``block`` from the producer thread; False if the loop is already closed."""
        try:
            self._loop.call_soon_threadsafe(self._put_block, block)
        except RuntimeError:  # event loop closed: nobody is listening any more
            return False
        return True

    def finish(self, error: BaseException | None = None) -> bool:
        """Tell the consumer the stream ended (normally, or with ``error``)."""
        item: _End | BaseException = _END if error is None else error
        try:
            self._loop.call_soon_threadsafe(self._put_final, item)
        except RuntimeError:
            return False
        return True

    # -- loop side ------------------------------------------------------------------------
    def _put_block(self, block: T) -> None:
        try:
            self._queue.put_nowait(block)
        except asyncio.QueueFull:
            n = self._size_of(block)
            self.overflow_samples += n
            self.overflow_blocks += 1
            # Log the first overflow and then every 100th, so a stuck consumer is visible
            # without flooding the log.
            if self.overflow_blocks == 1 or self.overflow_blocks % 100 == 0:
                logger.warning(
                    "%s: consumer too slow, queue of %d blocks full; dropped %d samples so far",
                    self._what,
                    self._queue.maxsize,
                    self.overflow_samples,
                )

    def _put_final(self, item: _End | BaseException) -> None:
        if self._queue.full():
            dropped = self._queue.get_nowait()
            if not isinstance(dropped, _End | BaseException):
                self.overflow_samples += self._size_of(dropped)
                self.overflow_blocks += 1
        self._queue.put_nowait(item)

    async def get(self) -> T:
        """The next block; raises the producer's error, or StopAsyncIteration at the end."""
        item = await self._queue.get()
        if isinstance(item, _End):
            self._queue.put_nowait(item)  # stay ended for later calls
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._queue.put_nowait(item)
            raise item
        return item
