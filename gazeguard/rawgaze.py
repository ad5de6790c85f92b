"""GGR1, the wire format of raw gaze blocks: what devices publish on the fleet's NATS JetStream
stream (:class:`~gazeguard.jetstream.JetStreamSender`, ``gazeguard forward``) and workers read.

A block (little-endian): ``b"GGR1"``, ``uint32`` N, then four float64 arrays of N: timestamps (s,
on the device's clock), x (deg), y (deg), pupil (mm; NaN if absent). NaN gaze marks invalid
samples. At most :data:`MAX_BLOCK_SAMPLES` samples.
"""

from __future__ import annotations

import struct

import numpy as np

from gazeguard.errors import StreamError
from gazeguard.samples import GazeSamples

RAW_MAGIC = b"GGR1"
_HEADER = struct.Struct("<4sI")
MAX_BLOCK_SAMPLES = 1 << 20


def encode_gaze(block: GazeSamples) -> bytes:
    """The raw wire format of a block (see the module docstring)."""
    body = np.stack([block.timestamps, block.x_deg, block.y_deg, block.pupil_mm]).astype("<f8")
    return _HEADER.pack(RAW_MAGIC, len(block)) + body.tobytes()


def decode_gaze(payload: bytes) -> GazeSamples:
    """Parse a raw block; invalid where x or y is not finite.

    Raises:
        StreamError: wrong magic, a length that does not match, non-finite timestamps.
    """
    if len(payload) < _HEADER.size:
        msg = f"raw gaze block of {len(payload)} bytes is shorter than its header"
        raise StreamError(msg)
    magic, n = _HEADER.unpack_from(payload)
    if magic != RAW_MAGIC:
        msg = f"raw gaze block starts with {magic!r}, expected {RAW_MAGIC!r}"
        raise StreamError(msg)
    if n > MAX_BLOCK_SAMPLES or len(payload) != _HEADER.size + 32 * n:
        msg = f"raw gaze block says {n} samples but carries {len(payload) - _HEADER.size} bytes"
        raise StreamError(msg)
    a = np.frombuffer(payload, dtype="<f8", offset=_HEADER.size).reshape(4, n)
    if not np.all(np.isfinite(a[0])):
        msg = "raw gaze block has non-finite timestamps"
        raise StreamError(msg)
    return GazeSamples.from_arrays(a[0], a[1], a[2], a[3])
