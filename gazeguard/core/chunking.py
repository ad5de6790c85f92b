"""Chunks: consecutive feature vectors of one session, buffered into power-of-two blocks.

A chunk is ``n`` consecutive steps of ``F`` features: a float64 array ``[F, n]`` (features ×
steps) with the ``n`` step timestamps. It is handed on only when full; what remains when the
session ends is dropped and reported (:attr:`Chunker.pending_steps`), never padded with made-up
values — a padded step would be a value that was never observed but still costs ε.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]


@dataclass(frozen=True, slots=True)
class Chunk:
    """One full chunk.

    Attributes:
        index: 0-based chunk number within the session (continues across restarts).
        values: float64 (F, n), feature values (raw: never leaves the process).
        timestamps: float64 (n,), end time of each step's window, s.
    """

    index: int
    values: FloatArray
    timestamps: FloatArray


class Chunker:
    """Buffer feature vectors into chunks of ``n`` steps (``n`` a power of two).

    The buffer is allocated once; each full chunk is copied out, so the caller owns it.

    Args:
        n_features: F.
        n_steps: n, a power of two ≥ 2.
        first_index: index of the next chunk (a resumed session continues its numbering).
    """

    def __init__(self, n_features: int, n_steps: int, first_index: int = 0) -> None:
        if n_steps < 2 or n_steps & (n_steps - 1):
            msg = f"n_steps must be a power of two >= 2, got {n_steps!r}"
            raise ValueError(msg)
        if n_features < 1:
            msg = f"n_features must be >= 1, got {n_features!r}"
            raise ValueError(msg)
        self.n_features = n_features
        self.n_steps = n_steps
        self.next_index = first_index
        self._values = np.empty((n_features, n_steps), dtype=np.float64)
        self._times = np.empty(n_steps, dtype=np.float64)
        self._fill = 0

    @property
    def pending_steps(self) -> int:
        """Steps buffered towards the next chunk (dropped if the session ends now)."""
        return self._fill

    def add(self, X: FloatArray, t: FloatArray) -> list[Chunk]:
        """Append k feature vectors; return the chunks they complete (possibly none).

        Args:
            X: float64 (k, F), one row per step, in time order.
            t: float64 (k,), step times, s.
        """
        k = X.shape[0]
        if X.ndim != 2 or X.shape[1] != self.n_features or t.shape != (k,):
            msg = (
                f"expected X of shape (k, {self.n_features}) and t of shape (k,), "
                f"got {X.shape} and {t.shape}"
            )
            raise ValueError(msg)
        out: list[Chunk] = []
        i = 0
        while i < k:
            take = min(self.n_steps - self._fill, k - i)
            self._values[:, self._fill : self._fill + take] = X[i : i + take].T
            self._times[self._fill : self._fill + take] = t[i : i + take]
            self._fill += take
            i += take
            if self._fill == self.n_steps:
                out.append(Chunk(self.next_index, self._values.copy(), self._times.copy()))
                self.next_index += 1
                self._fill = 0
        return out


def chunk_rows(
    rows: IntArray, n: int, *, whole: bool = False, pad: bool = False
) -> list[tuple[IntArray, int]]:
    """How a recorded session's rows are released (offline: ``gazeguard release`` and ``eval``).

    Args:
        rows: (T,) the session's row indices, in time order.
        n: steps per chunk.
        whole: one release of every row (FPA; none for fewer than 2 rows) instead of chunks.
        pad: a last partial chunk is filled up by repeating its last row (only its real rows
            are kept); otherwise it is dropped, as :class:`Chunker` drops it live.

    Returns:
        (the rows of each release, how many of them are real), in order.
    """
    if whole:
        return [(rows, int(rows.size))] if rows.size >= 2 else []
    full, rest = divmod(int(rows.size), n)
    plan = [(rows[c * n : (c + 1) * n], n) for c in range(full)]
    if pad and rest:
        last = rows[full * n :]
        plan.append((last[np.minimum(np.arange(n), last.size - 1)], int(last.size)))
    return plan
