"""A base for async context managers whose leaving does not depend on how the body ended."""

from __future__ import annotations


class AsyncClosing:
    """An async context manager that leaves by awaiting :meth:`aclose`.

    A subclass writes ``__aenter__`` (returning itself) and ``aclose``. Leaving never
    suppresses the body's exception: ``aclose`` is not told of it.
    """

    async def aclose(self) -> None:
        """Release what entering took; a second call, or one without entering, does nothing."""
        raise NotImplementedError

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
