"""GGR1, the wire format of raw gaze blocks: what devices publish on the fleet's NATS JetStream
stream (:class:`~gazeguard.runtime.jetstream.JetStreamSender`, ``gazeguard forward``) and workers
read.

A block (little-endian): ``b"GGR1"``, ``uint32`` N, then four float64 arrays of N: timestamps (s,
on the device's clock), x (deg), y (deg), pupil (mm; NaN if absent). NaN gaze marks invalid
samples. At most :data:`MAX_BLOCK_SAMPLES` samples.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from gazeguard.core.errors import StreamError
from gazeguard.core.samples import GazeSamples
from gazeguard.signal import compiled

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
    a = _arrays(payload)
    if not np.all(np.isfinite(a[0])):
        raise StreamError(_NONFINITE)
    return GazeSamples.from_arrays(a[0], a[1], a[2], a[3])


_NONFINITE = "raw gaze block has non-finite timestamps"


def _arrays(payload: bytes) -> np.ndarray:
    """The four arrays of a raw block, float64 (4, N) read-only views of ``payload``.

    Raises:
        StreamError: wrong magic, a length that does not match.
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
    return np.frombuffer(payload, dtype="<f8", offset=_HEADER.size).reshape(4, n)


class Decoded(NamedTuple):
    """Blocks decoded by :func:`decode_many`, per payload in order (parallel lists).

    Attributes:
        blocks: the block, or the :class:`StreamError` :func:`decode_gaze` raises for it.
        first: the block's first timestamp, s (``nan``: an error or an empty block).
        last: its last timestamp, s (``nan`` likewise).
        increasing: its timestamps strictly increase (``False`` for errors; ``True`` if empty).
    """

    blocks: list[GazeSamples | StreamError]
    first: list[float]
    last: list[float]
    increasing: list[bool]


def decode_many(payloads: Sequence[bytes], kernels: compiled.Kernels | None = None) -> Decoded:
    """:func:`decode_gaze` of many blocks at once, with each block's first and last timestamp
    and whether its timestamps strictly increase (what the fleet worker checks per block,
    without a numpy call per block). Blocks of one size are decoded with one set of array
    operations (the fleet worker's batch of a partition), each returned as views of them;
    with ``kernels``, the compiled passes (:func:`gazeguard.signal.compiled.load_kernels`), each
    block in one compiled pass instead (the same arrays)."""
    nan = math.nan
    out = Decoded(
        [StreamError("not decoded")] * len(payloads),
        [nan] * len(payloads),
        [nan] * len(payloads),
        [False] * len(payloads),
    )
    if kernels is not None:
        for i in range(len(payloads)):
            _decode_compiled(kernels.decode, payloads, i, out)
        return out
    by_size: dict[int, list[int]] = {}
    for i, payload in enumerate(payloads):
        if len(payload) > _HEADER.size and payload[:4] == RAW_MAGIC:
            by_size.setdefault(len(payload), []).append(i)
        else:
            _decode_one(payloads, i, out)
    for size, idx in by_size.items():
        n = (size - _HEADER.size) // 32
        stated = {_HEADER.unpack_from(payloads[i])[1] for i in idx}
        if len(idx) == 1 or stated != {n} or size != _HEADER.size + 32 * n:
            for i in idx:  # one block, or the sizes do not add up: the one-block path says why
                _decode_one(payloads, i, out)
            continue
        rows = np.frombuffer(b"".join(payloads[i] for i in idx), dtype="<f8")
        a = rows.reshape(len(idx), 1 + 4 * n)[:, 1:].reshape(len(idx), 4, n)
        t = np.ascontiguousarray(a[:, 0])
        x, y, p = a[:, 1].copy(), a[:, 2].copy(), a[:, 3].copy()
        valid = np.isfinite(x) & np.isfinite(y)
        x[~valid] = np.nan
        y[~valid] = np.nan
        p[~valid] = np.nan
        finite: list[bool] = np.all(np.isfinite(t), axis=1).tolist()
        increasing: list[bool] = np.all(t[:, 1:] > t[:, :-1], axis=1).tolist()
        first: list[float] = t[:, 0].tolist()
        last: list[float] = t[:, -1].tolist()
        for row, i in enumerate(idx):
            if finite[row]:
                out.blocks[i] = GazeSamples(t[row], x[row], y[row], p[row], valid[row])
                out.first[i], out.last[i] = first[row], last[row]
                out.increasing[i] = increasing[row]
            else:
                out.blocks[i] = StreamError(_NONFINITE)
    return out


def _decode_one(payloads: Sequence[bytes], i: int, out: Decoded) -> None:
    """:func:`decode_gaze` of ``payloads[i]`` into ``out``'s lists at ``i``."""
    try:
        block = decode_gaze(payloads[i])
    except StreamError as exc:
        out.blocks[i] = exc
        return
    out.blocks[i] = block
    t = block.timestamps
    if len(t):
        out.first[i], out.last[i] = float(t[0]), float(t[-1])
    out.increasing[i] = bool(np.all(t[1:] > t[:-1]))


def _decode_compiled(
    kernel: Callable[..., int], payloads: Sequence[bytes], i: int, out: Decoded
) -> None:
    """:func:`_decode_one` by the compiled pass (:func:`gazeguard.signal.compiled._decode`)."""
    try:
        a = _arrays(payloads[i])
    except StreamError as exc:
        out.blocks[i] = exc
        return
    n = a.shape[1]
    xyp = np.empty((3, n))
    valid = np.empty(n, dtype=np.bool_)
    flags = kernel(a, xyp, valid)
    if not flags & compiled.DECODED_FINITE:
        out.blocks[i] = StreamError(_NONFINITE)
        return
    t = a[0]
    out.blocks[i] = GazeSamples(t, xyp[0], xyp[1], xyp[2], valid)
    if n:
        out.first[i], out.last[i] = float(t[0]), float(t[-1])
    out.increasing[i] = bool(flags & compiled.DECODED_INCREASING)
