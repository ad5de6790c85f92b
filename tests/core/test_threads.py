"""gazeguard.core.threads: a charge running in a worker thread outlives its caller's
cancellation."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from gazeguard.core.threads import to_thread_to_the_end


def test_a_cancelled_caller_waits_for_the_thread_and_then_is_cancelled() -> None:
    finished = threading.Event()

    def charge() -> int:
        time.sleep(0.3)
        finished.set()
        return 1

    async def main() -> bool:
        task = asyncio.create_task(to_thread_to_the_end(charge))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.sleep(0)
        task.cancel()  # a second cancellation does not cut the wait short either
        with pytest.raises(asyncio.CancelledError):
            await task
        return finished.is_set()

    assert asyncio.run(main())  # the task ended only after the thread had finished


def test_a_failure_after_the_caller_was_cancelled_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def charge() -> int:
        time.sleep(0.1)
        raise RuntimeError("ledger closed")

    async def main() -> None:
        task = asyncio.create_task(to_thread_to_the_end(charge))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.ERROR, logger="gazeguard.core.threads"):
        asyncio.run(main())
    assert any("ledger closed" in r.getMessage() for r in caplog.records)


def test_without_cancellation_it_is_to_thread() -> None:
    assert asyncio.run(to_thread_to_the_end(lambda a, b=0: a + b, 2, b=3)) == 5

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(to_thread_to_the_end(fail))
