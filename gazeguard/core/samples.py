"""The normalized gaze sample block that flows from ``ingest`` (or a recording) into ``events``.

Units are fixed here once so that every later stage can rely on them: time in seconds on the LSL
clock (or the recording's clock), gaze direction in degrees of visual angle, pupil diameter in mm.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pylsl

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class GazeSamples:
    """A block of N consecutive gaze samples, all arrays of shape (N,).

    Attributes:
        timestamps: sample times, s, strictly increasing within and across blocks.
        x_deg: horizontal gaze direction, degrees of visual angle (positive right); NaN if invalid.
        y_deg: vertical gaze direction, degrees of visual angle (positive up); NaN if invalid.
        pupil_mm: pupil diameter, mm; NaN where unavailable or invalid.
        valid: True where the sample carries usable gaze.
    """

    timestamps: FloatArray
    x_deg: FloatArray
    y_deg: FloatArray
    pupil_mm: FloatArray
    valid: BoolArray

    def __post_init__(self) -> None:
        n = self.timestamps.shape[0]
        for name in ("x_deg", "y_deg", "pupil_mm", "valid"):
            arr = getattr(self, name)
            if arr.shape != (n,):
                msg = f"GazeSamples.{name} has shape {arr.shape}, expected ({n},)"
                raise ValueError(msg)

    def __len__(self) -> int:
        return int(self.timestamps.shape[0])

    @classmethod
    def from_arrays(
        cls,
        timestamps: npt.ArrayLike,
        x_deg: npt.ArrayLike,
        y_deg: npt.ArrayLike,
        pupil_mm: npt.ArrayLike | None = None,
    ) -> GazeSamples:
        """Build a block from array-likes; validity is "x, y finite" (and pupil finite if given).

        Non-finite gaze becomes NaN + invalid (never zeros).
        """
        t = np.ascontiguousarray(timestamps, dtype=np.float64)
        x = np.array(x_deg, dtype=np.float64)
        y = np.array(y_deg, dtype=np.float64)
        p = np.full(t.shape, np.nan) if pupil_mm is None else np.array(pupil_mm, dtype=np.float64)
        valid = np.isfinite(x) & np.isfinite(y)
        x[~valid] = np.nan
        y[~valid] = np.nan
        p[~valid] = np.nan
        return cls(t, x, y, p, valid)

    @classmethod
    def concat(cls, blocks: Sequence[GazeSamples]) -> GazeSamples:
        """One block holding ``blocks`` back to back (copied; at least one block)."""
        return cls(
            np.concatenate([b.timestamps for b in blocks]),
            np.concatenate([b.x_deg for b in blocks]),
            np.concatenate([b.y_deg for b in blocks]),
            np.concatenate([b.pupil_mm for b in blocks]),
            np.concatenate([b.valid for b in blocks]),
        )

    def slice(self, start: int, stop: int) -> GazeSamples:
        """Samples ``start:stop`` as views (borrowed: copy before the source is overwritten)."""
        return GazeSamples(
            self.timestamps[start:stop],
            self.x_deg[start:stop],
            self.y_deg[start:stop],
            self.pupil_mm[start:stop],
            self.valid[start:stop],
        )


def lsl_unix_offset() -> float:
    """``time.time() − pylsl.local_clock()``, s: add it to an LSL timestamp of this host (samples
    are clock-synchronised to it on ingest) to get Unix time. Read afresh on every call (two clock
    reads, well under a microsecond apart), so it follows NTP corrections of the wall clock."""

    return time.time() - float(pylsl.local_clock())
