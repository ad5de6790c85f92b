"""Replay: a recorded gaze file streamed as a real LSL outlet at the recording's own timing.

- :func:`load_csv` reads a CSV recording (time in s or ms, or a given rate; gaze in degrees or
  normalized image coordinates, converted through a field of view; optional pupil in mm and
  validity) into :class:`~gazeguard.samples.GazeSamples`.
- :func:`load_xdf` reads the gaze stream of an XDF file (its samples, timestamps, name, type
  and channel metadata) into an :class:`XdfStream`.
- :class:`Replay` pushes either from a background thread on a real-time schedule (``speed``
  times real time): a CSV recording in the ``gazeguard`` layout
  (:func:`~gazeguard.presets.gazeguard_stream_info`), an XDF stream with its own name, type,
  channels and metadata, so ingest's presets apply to it as to the live device.

``gazeguard replay FILE`` (:func:`configure_replay` / :func:`run_replay`) streams a file once
from the command line.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np
import numpy.typing as npt
import pylsl

from gazeguard.errors import DatasetError
from gazeguard.presets import gazeguard_stream_info, normalized_to_deg
from gazeguard.samples import FloatArray, GazeSamples
from gazeguard.simulate import _Pusher

logger = logging.getLogger(__name__)


_TIME_COLUMNS = {"t": 1.0, "time": 1.0, "timestamp": 1.0, "time_s": 1.0, "timestamp_s": 1.0}
_TIME_COLUMNS |= {"time_ms": 1e-3, "timestamp_ms": 1e-3}
_XY_COLUMNS = (
    ("x_deg", "y_deg", "deg"),
    ("norm_pos_x", "norm_pos_y", "norm_up"),  # Pupil Capture: origin bottom-left
    ("x_norm", "y_norm", "norm_down"),  # image convention: origin top-left
)


def load_csv(
    path: str | Path,
    *,
    columns: list[str] | None = None,
    rate_hz: float | None = None,
    fov_deg: tuple[float, float] = (100.0, 90.0),
) -> GazeSamples:
    """Read a gaze recording from CSV.

    Columns (header line, ``#`` comments allowed; or name them with ``columns`` if the file has
    no header): time ``t``/``time``/``timestamp`` (s) or ``time_ms``/``timestamp_ms`` (ms), or
    none and ``rate_hz``; gaze ``x_deg,y_deg`` (deg, y up), ``norm_pos_x,norm_pos_y`` (0..1,
    origin bottom-left, as Pupil Capture) or ``x_norm,y_norm`` (0..1, origin top-left), the
    normalized ones converted with ``fov_deg``; optional ``pupil_mm``; optional ``valid`` (0/1).

    Raises:
        DatasetError: naming the file, the line and what is wrong.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise DatasetError(path, f"cannot read: {exc.strerror}") from exc
    lines = [
        (i + 1, ln)
        for i, ln in enumerate(text.splitlines())
        if ln.strip() and not ln.startswith("#")
    ]
    if not lines:
        raise DatasetError(path, "no data rows")
    first = next(csv.reader([lines[0][1]]))
    if columns is None:
        if _all_numeric(first):
            raise DatasetError(
                path, "no header line; name the columns (--columns x_norm,y_norm)", lines[0][0]
            )
        columns, lines = [c.strip().lower() for c in first], lines[1:]
    values = np.full((len(lines), len(columns)), np.nan)
    for r, (lineno, ln) in enumerate(lines):
        fields = next(csv.reader([ln]))
        if len(fields) != len(columns):
            raise DatasetError(
                path, f"{len(fields)} fields, expected {len(columns)} ({','.join(columns)})", lineno
            )
        try:
            values[r] = [float(f) if f.strip() else math.nan for f in fields]
        except ValueError as exc:
            raise DatasetError(path, f"not a number: {exc}", lineno) from exc
    col = {c: i for i, c in enumerate(columns)}
    tcol = next((c for c in columns if c in _TIME_COLUMNS), None)
    if tcol is not None:
        t = values[:, col[tcol]] * _TIME_COLUMNS[tcol]
    elif rate_hz is not None:
        t = np.arange(len(values)) / rate_hz
    else:
        raise DatasetError(
            path, f"no time column ({', '.join(_TIME_COLUMNS)}) and no rate given (--rate)"
        )
    bad = np.flatnonzero(~(np.diff(t) > 0))
    if bad.size:
        raise DatasetError(
            path, f"time does not increase ({t[bad[0]]} then {t[bad[0] + 1]})", lines[bad[0] + 1][0]
        )
    xy = next(((a, b, kind) for a, b, kind in _XY_COLUMNS if a in col and b in col), None)
    if xy is None:
        pairs = ", ".join(f"{a},{b}" for a, b, _ in _XY_COLUMNS)
        raise DatasetError(
            path, f"no gaze columns: expected one of {pairs}; found {','.join(columns)}"
        )
    x, y = values[:, col[xy[0]]], values[:, col[xy[1]]]
    if xy[2] != "deg":
        x, y = normalized_to_deg(x, y, fov_deg, y_up=xy[2] == "norm_up")
    pupil = values[:, col["pupil_mm"]] if "pupil_mm" in col else None
    samples = GazeSamples.from_arrays(t, x, y, pupil)
    if "valid" in col:
        ok = samples.valid & (values[:, col["valid"]] > 0.5)
        samples = GazeSamples.from_arrays(
            t, np.where(ok, x, np.nan), np.where(ok, y, np.nan), pupil
        )
    return samples


def _all_numeric(fields: list[str]) -> bool:
    try:
        [float(f) for f in fields]
    except ValueError:
        return False
    return True


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
    import pyxdf  # noqa: PLC0415 - only replay of XDF needs it

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


class _ReplayPusher(_Pusher):
    def __init__(self, replay: Replay, outlet: pylsl.StreamOutlet) -> None:
        super().__init__(outlet, f"gazeguard.replay[{replay.name}]", 0.01)
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


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def configure_replay(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard replay``."""
    parser.add_argument("file", type=Path, help="recording: .csv or .xdf")
    parser.add_argument("--stream", default=None, help="XDF: name of the stream to replay")
    parser.add_argument(
        "--columns", default=None, help="CSV without header: column names, comma-separated"
    )
    parser.add_argument("--rate", type=float, default=None, help="CSV without time column: Hz")
    parser.add_argument(
        "--fov",
        type=float,
        nargs=2,
        default=(100.0, 90.0),
        metavar=("H", "V"),
        help="field of view for normalized CSV coordinates, deg (default 100 90)",
    )
    parser.add_argument("--name", default=None, help="LSL stream name")
    parser.add_argument("--source-id", default=None, help="LSL source_id (default: unique)")
    parser.add_argument("--speed", type=float, default=1.0, help="push speed vs real time")
    parser.add_argument("--wait", type=float, default=60.0, help="wait for a consumer, s")


def run_replay(args: argparse.Namespace) -> int:
    """``gazeguard replay FILE``: stream the recording once at its timing, then exit."""
    rec: GazeSamples | XdfStream
    if args.file.suffix.lower() in {".xdf", ".xdfz"}:
        rec = load_xdf(args.file, args.stream)
    else:
        cols = [c.strip().lower() for c in args.columns.split(",")] if args.columns else None
        rec = load_csv(args.file, columns=cols, rate_hz=args.rate, fov_deg=tuple(args.fov))
    with Replay(
        rec, source_id=args.source_id, name=args.name, speed=args.speed, wait_s=args.wait
    ) as rp:
        print(  # noqa: T201
            f"replaying {args.file} ({rp.rows.shape[0]} samples, {rp.rel_t[-1]:.1f} s) as LSL "
            f"stream {rp.name!r}, source_id {rp.source_id!r}",
            flush=True,
        )
        rp.wait()
        time.sleep(0.5)  # let the last samples reach the inlets before the outlet goes away
    print(f"sent {rp.samples_sent} samples", flush=True)  # noqa: T201
    return 0
