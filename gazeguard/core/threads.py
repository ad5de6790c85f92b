"""Worker-thread calls that charge the ledger, awaited to the end even when cancelled."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


async def to_thread_to_the_end(func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``func(*args, **kwargs)`` in a worker thread, waited for even if the caller is cancelled.

    A worker thread cannot be stopped: cancelling :func:`asyncio.to_thread` only stops the
    waiting. For a call that charges the ledger and fills the outbox (``Pipeline.push``,
    ``Pipeline.release``) the caller's shutdown — the final flush, the run's summary,
    ``Pipeline.close`` — must come after it; otherwise a chunk charged a moment later stays in
    the outbox, undelivered, while the run reports nothing pending (seen under load: the broker
    outage test's last chunk). The cancellation is re-raised once the call has returned; the
    call itself is bounded (one block's features and one ledger transaction).
    """
    call = asyncio.ensure_future(asyncio.to_thread(func, *args, **kwargs))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        while not call.done():
            try:
                await asyncio.wait({call})
            except asyncio.CancelledError:
                continue  # cancelled again: the thread still runs; keep waiting for it
        if not call.cancelled() and (exc := call.exception()) is not None:
            # Nobody awaits the result any more: say what failed instead of losing it.
            name = getattr(func, "__qualname__", repr(func))
            log.error("%s failed while its caller was stopping: %r", name, exc)
        raise
