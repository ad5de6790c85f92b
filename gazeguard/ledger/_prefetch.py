"""Composing a session's next release's figures on a background thread, off the release's path
(:class:`Prefetch`; the package docstring's "Prefetch").
"""

from __future__ import annotations

import logging
import threading
import time

from gazeguard.ledger import policy
from gazeguard.ledger._compose import LedgerComposer
from gazeguard.ledger.policy import Caps, Composer, Counts

log = logging.getLogger("gazeguard.ledger")


class Prefetch:
    """Composes, on one background thread, what a session's next release will need.

    A release's preview and charge report the session's ε at δ after it (and that of its
    trailing window): a privacy-loss composition that, for a new count, costs milliseconds to
    tens of milliseconds of FFTs; and the first time a release shape no longer fits a cap by its
    exact pure sum, admission runs a capacity search (a second or more, once per shape and cap).
    Chunks of one session carry the same accounting events, so the next chunk's counts are this
    one's plus the same events: composing them after this charge, off the release's path, leaves
    the next release cache lookups (the accountant's caches are process-wide and thread-safe).
    A guess that turns out wrong (another stream's release came first, the window moved) only
    costs the CPU: the figures reported and the admission are always computed from the ledger's
    counts. At most one job runs; a newer request while it runs replaces the one waiting.
    """

    #: How long, s, the thread waits for the next request before it ends (a steady stream of
    #: charges keeps one thread instead of starting one per charge: ~0.1 ms each).
    IDLE_S = 0.5

    def __init__(self, composer: Composer) -> None:
        self._composer = composer
        self._cond = threading.Condition(threading.Lock())
        self._waiting: tuple[Caps, Counts, Counts, Counts] | None = None
        self._thread: threading.Thread | None = None
        self._busy = False
        self._closed = False

    def submit(self, caps: Caps, session: Counts, window: Counts, cost: Counts) -> None:
        """After a charge: the session's and its window's counts now, and the release's own."""
        with self._cond:
            if self._closed:
                return
            self._waiting = (caps, session, window, cost)
            if self._thread is None:
                # not a daemon: one killed at interpreter exit inside the FFT's C++ code
                # aborts the process ("terminate called without an active exception")
                self._thread = threading.Thread(target=self._run, name="gazeguard-ledger-prefetch")
                self._thread.start()
            else:
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()  # (wait())
                if self._waiting is None and not self._closed:
                    self._cond.wait(self.IDLE_S)
                job, self._waiting = self._waiting, None
                if job is None or self._closed:
                    self._thread = None
                    self._cond.notify_all()
                    return
                self._busy = True
            caps, session, window, cost = job
            try:
                self._prepare(caps, session, window, cost)
            except Exception:  # a guess, never a figure: the release path computes it again
                log.debug("prefetching the next release's figures failed", exc_info=True)

    def _prepare(self, caps: Caps, session: Counts, window: Counts, cost: Counts) -> None:
        composer = self._composer
        if isinstance(composer, LedgerComposer):
            for cap in (caps.session, caps.window):
                if cap is not None:
                    composer.warm(session, cost, cap, caps.delta)
        policy.figures(composer, caps, policy.merged(session, cost), policy.merged(window, cost))

    def wait(self, timeout_s: float) -> bool:
        """Wait until no job runs or waits (``False``: still busy after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._thread is not None and (self._busy or self._waiting is not None):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Drop the waiting request and wait for the one running (a composition or a capacity
        search: milliseconds to a few seconds), and for the thread to end."""
        with self._cond:
            self._closed, self._waiting = True, None
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning(
                    "the ledger's prefetch thread is still composing after %.0f s", timeout_s
                )
