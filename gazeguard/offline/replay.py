"""Replay: a recorded gaze file streamed as a real LSL outlet at the recording's own timing.

- Recordings (gazeguard's CSV, Pupil Player exports, Tobii Pro Lab TSV, EyeLink ASC) are read by
  :mod:`gazeguard.offline.recordings` into :class:`~gazeguard.core.samples.GazeSamples`;
  :func:`load_csv` is
  the shortcut for gazeguard's CSV.
- :func:`load_xdf` reads the gaze stream of an XDF file (its samples, timestamps, name, type
  and channel metadata) into an :class:`XdfStream`.
- :class:`Replay` pushes either from a background thread on a real-time schedule (``speed``
  times real time): a CSV recording in the ``gazeguard`` layout
  (:func:`~gazeguard.runtime.presets.gazeguard_stream_info`), an XDF stream with its own name, type,
  channels and metadata, so ingest's presets apply to it as to the live device.

``gazeguard replay FILE`` (:mod:`gazeguard.cli.replay`) streams a file once from the command
line.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType

import numpy as np
import numpy.typing as npt
import pylsl
import pyxdf

from gazeguard.core.errors import DatasetError
from gazeguard.core.samples import FloatArray, GazeSamples
from gazeguard.offline.recordings import (
    ReadOptions,
    read_recording,
)
from gazeguard.runtime.presets import gazeguard_stream_info
from gazeguard.runtime.simulate import Pusher

logger = logging.getLogger(__name__)


def load_csv(
    path: str | Path,
    *,
    columns: list[str] | None = None,
    rate_hz: float | None = None,
    fov_deg: tuple[float, float] | None = None,
    options: ReadOptions | None = None,
) -> GazeSamples:
    """Read a recording in gazeguard's CSV format (``FORMAT_HELP`` in
    :mod:`gazeguard.offline.recordings`).

    ``columns`` names the columns of a file without a header line, ``rate_hz`` gives the time of
    a file without a time column, ``fov_deg`` the field of view for normalised or pixel gaze;
    ``options`` sets everything else (units, screen geometry, …). The file must hold a single
    recording.

    Raises:
        DatasetError: naming the file, the line and the column, and what to do.
    """
    base = options or ReadOptions()
    opts = replace(
        base,
        format="csv",
        columns=tuple(columns) if columns is not None else base.columns,
        rate_hz=rate_hz if rate_hz is not None else base.rate_hz,
        fov_deg=fov_deg if fov_deg is not None else base.fov_deg,
    )
    return read_recording(path, opts).samples


@dataclass(frozen=True)
class XdfStream:
    """One stream of an XDF file: its header fields and samples (N, C) with timestamps (N,)."""

    name: str
    type: str
    nominal_srate: float
    channels: list[dict[str, str]]
    manufacturer: str
    data: npt.NDArray[np.float64]
    timestamps: FloatArray


def load_xdf(path: str | Path, stream: str | None = None) -> XdfStream:
    """The gaze stream of an XDF file (by name, else the first of type Gaze/Eyetracker)."""

    path = Path(path)
    try:
        streams, _ = pyxdf.load_xdf(str(path), dejitter_timestamps=False)
    except Exception as exc:  # pyxdf raises bare Exceptions on malformed files
        raise DatasetError(path, f"not a readable XDF file: {exc}") from exc
    info_of = [s["info"] for s in streams]
    names = [str(i["name"][0]) for i in info_of]
    if stream is not None:
        pick = names.index(stream) if stream in names else None
    else:
        types = [str(i["type"][0]).lower() for i in info_of]
        pick = next((k for k, tp in enumerate(types) if tp in {"gaze", "eyetracker"}), None)
    if pick is None:
        want = f"named {stream!r}" if stream else "of type Gaze or Eyetracker"
        raise DatasetError(path, f"no stream {want}; streams: {names}")
    s, info = streams[pick], info_of[pick]
    data = np.asarray(s["time_series"], dtype=np.float64)
    if data.ndim != 2 or data.shape[0] == 0:
        raise DatasetError(path, f"stream {names[pick]!r} has no numeric samples")
    desc = (info.get("desc") or [None])[0] or {}
    chans = [
        {k: str((ch.get(k) or [""])[0] or "") for k in ("label", "eye", "type", "unit")}
        for ch in ((desc.get("channels") or [{}])[0] or {}).get("channel", [])
    ]
    acq = (desc.get("acquisition") or [{}])[0] or {}
    return XdfStream(
        name=names[pick],
        type=str(info["type"][0]),
        nominal_srate=float(info["nominal_srate"][0]),
        channels=chans,
        manufacturer=str((acq.get("manufacturer") or [""])[0] or ""),
        data=data,
        timestamps=np.asarray(s["time_stamps"], dtype=np.float64),
    )


class Replay:
    """Stream a recording as an LSL outlet at its original timing (a context manager).

    ``GazeSamples`` (from CSV) go out in the ``gazeguard`` layout; an :class:`XdfStream` goes out
    with its own name, type, channels and metadata, so ingest's presets apply to it as to the
    live device. ``speed`` > 1 pushes faster than real time; timestamps keep the recording's
    spacing and start ``duration·(1 − 1/speed)`` s in the past, so none lies ahead of the LSL
    clock when it is pushed. ``wait_s``: wait that long for a consumer before starting.
    """

    def __init__(
        self,
        recording: GazeSamples | XdfStream,
        *,
        source_id: str | None = None,
        name: str | None = None,
        speed: float = 1.0,
        wait_s: float = 0.0,
    ) -> None:
        self.source_id = source_id or f"gazeguard-replay-{uuid.uuid4().hex[:12]}"
        if isinstance(recording, GazeSamples):
            t = recording.timestamps
            self.name = name or "gazeguard-replay"
            # Declare a nominal rate only for a regularly sampled recording: liblsl dejitters
            # regular streams, which would smooth a jittery recording's own timing.
            dt = np.diff(t)
            regular = dt.size > 0 and bool(
                np.all(np.abs(dt - np.median(dt)) < 0.01 * np.median(dt))
            )
            rate = 1.0 / float(np.median(dt)) if regular else 0.0
            self.info = gazeguard_stream_info(self.name, self.source_id, rate)
            self.rows = np.column_stack(
                [
                    np.arange(len(t)),
                    recording.x_deg,
                    recording.y_deg,
                    recording.pupil_mm,
                    recording.valid,
                ]
            ).astype(np.float64)
        else:
            t = recording.timestamps
            self.name = name or recording.name
            c = recording.data.shape[1]
            self.info = pylsl.StreamInfo(
                self.name,
                recording.type,
                c,
                recording.nominal_srate,
                pylsl.cf_double64,
                self.source_id,
            )
            if recording.manufacturer:
                self.info.desc().append_child("acquisition").append_child_value(
                    "manufacturer", recording.manufacturer
                )
            if recording.channels:
                chans = self.info.desc().append_child("channels")
                for ch in recording.channels:
                    node = chans.append_child("channel")
                    for k, v in ch.items():
                        if v:
                            node.append_child_value(k, v)
            self.rows = np.ascontiguousarray(recording.data)
        self.rel_t = np.asarray(t - t[0], dtype=np.float64)
        self.speed = speed
        self.wait_s = wait_s
        self._pusher: _ReplayPusher | None = None
        self._sent = 0

    @property
    def samples_sent(self) -> int:
        """Samples pushed so far."""
        return self._sent + (self._pusher.samples_sent if self._pusher is not None else 0)

    def __enter__(self) -> Replay:
        outlet = pylsl.StreamOutlet(self.info, 0, 360)
        self._pusher = _ReplayPusher(self, outlet)
        self._pusher.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the whole recording has been pushed; False on timeout."""
        return self._pusher is not None and self._pusher.done.wait(timeout)

    def __exit__(
        self, tp: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._pusher is not None:
            pusher, self._pusher = self._pusher, None
            self._sent += pusher.samples_sent
            pusher.stop()


class _ReplayPusher(Pusher):
    def __init__(self, replay: Replay, outlet: pylsl.StreamOutlet) -> None:
        super().__init__(outlet, f"gazeguard.offline.replay[{replay.name}]", 0.01)
        self.replay = replay

    def run(self) -> None:
        rp = self.replay
        if rp.wait_s > 0 and not self.outlet.wait_for_consumers(rp.wait_s):
            logger.warning("replay %r: no consumer after %g s; starting anyway", rp.name, rp.wait_s)
        t_start = pylsl.local_clock()
        n = rp.rows.shape[0]
        # Timestamps keep the recording's own spacing (also when speed != 1). Faster than real
        # time, the timeline starts earlier, so that no sample is stamped after it is pushed
        # (ingest refuses samples stamped ahead of the clock).
        t_origin = t_start - float(rp.rel_t[-1]) * max(0.0, 1.0 - 1.0 / rp.speed) if n else t_start
        while not self._stop.is_set() and self.samples_sent < n:
            elapsed = (pylsl.local_clock() - t_start) * rp.speed
            due = int(np.searchsorted(rp.rel_t, elapsed, side="right"))
            if due > self.samples_sent:
                sl = slice(self.samples_sent, due)
                self.outlet.push_chunk(rp.rows[sl], list(t_origin + rp.rel_t[sl]))
                self.samples_sent = due
            self._stop.wait(self.push_interval_s)
