"""Replay: a recorded gaze file streamed as a real LSL outlet at the recording's own timing.

- Recordings (gazeguard's CSV, Pupil Player exports, Tobii Pro Lab TSV, EyeLink ASC) are read by
  :mod:`gazeguard.recordings` into :class:`~gazeguard.samples.GazeSamples`; :func:`load_csv` is
  the shortcut for gazeguard's CSV.
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
import logging
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType

import numpy as np
import numpy.typing as npt
import pylsl

from gazeguard.errors import ConfigError, DatasetError
from gazeguard.presets import gazeguard_stream_info
from gazeguard.recordings import (
    FORMAT_HELP,
    FORMATS,
    GAZE_UNITS,
    TIME_UNITS,
    ReadOptions,
    parse_pair,
    read_recording,
)
from gazeguard.samples import FloatArray, GazeSamples
from gazeguard.simulate import _Pusher

logger = logging.getLogger(__name__)


def load_csv(
    path: str | Path,
    *,
    columns: list[str] | None = None,
    rate_hz: float | None = None,
    fov_deg: tuple[float, float] | None = None,
    options: ReadOptions | None = None,
) -> GazeSamples:
    """Read a recording in gazeguard's CSV format (``FORMAT_HELP`` in :mod:`gazeguard.recordings`).

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
REPLAY_EPILOG = f"""\
{FORMAT_HELP}
XDF: a .xdf file's gaze stream (of type Gaze or Eyetracker, or --stream NAME) is replayed with its
own name, type and channel metadata, so ingest's presets apply to it as to the live device.

examples:
  gazeguard replay rec.csv                                   # t, x, y in degrees
  gazeguard replay rec.csv --units norm --fov 90,70          # normalised scene-camera gaze
  gazeguard replay 000/exports/000 --fov 99,53               # a Pupil Player export
  gazeguard replay export.tsv --screen 527,296 --distance 650 --recording Recording1
  gazeguard replay s01.asc --screen 533,301 --distance 565 --pupil-scale 0.05
  gazeguard replay session.xdf
"""


class _PairAction(argparse.Action):
    """``--fov H,V`` (also the older ``--fov H V``): stores (H, V). Tokens after the pair that
    argparse handed over (``--fov 90,70 rec.csv``) are kept in ``namespace.extra_files``."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        tokens = [str(v) for v in (values if isinstance(values, list) else [values])]
        take = 1 if "," in tokens[0] else 2
        try:
            pair = parse_pair(" ".join(tokens[:take]).replace(",", " "))
        except ValueError as exc:
            raise argparse.ArgumentError(self, f"{exc} (H,V)") from None
        setattr(namespace, self.dest, pair)
        extra = list(getattr(namespace, "extra_files", None) or [])
        namespace.extra_files = extra + tokens[take:]


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows ``--fov H,V`` (not ``H,V [H,V ...]``) for the pair that also takes ``H V``."""

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if isinstance(action, _PairAction):
            return str(action.metavar)
        return super()._format_args(action, default_metavar)


def _pair(text: str) -> tuple[float, float]:
    try:
        return parse_pair(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def configure_replay(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``gazeguard replay``."""
    parser.description = (
        "Stream a recorded gaze file as a real LSL outlet at its own timing (stream type Gaze,\n"
        "gazeguard's channel layout: gaze in degrees, pupil in mm, validity), so `gazeguard run`\n"
        "or any LSL consumer receives it as it would from a headset."
    )
    parser.epilog = REPLAY_EPILOG
    parser.formatter_class = _HelpFormatter
    parser.add_argument(
        "file",
        type=Path,
        nargs="?",
        help="the recording: gazeguard CSV, a Pupil Player export, a Tobii Pro Lab .tsv, an "
        "EyeLink .asc or an .xdf",
    )
    r = parser.add_argument_group("reading the recording (see below)")
    r.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="auto (default: from the content), csv, pupil, tobii or eyelink",
    )
    r.add_argument("--recording", metavar="ID", help="which recording of a file that holds several")
    r.add_argument(
        "--units",
        choices=GAZE_UNITS,
        help="gaze units where the header does not state them (default deg)",
    )
    r.add_argument(
        "--time-unit",
        choices=TIME_UNITS,
        help="time unit where the header does not state it (default s)",
    )
    r.add_argument(
        "--fov",
        action=_PairAction,
        nargs="+",
        metavar="H,V",
        help="field of view of the scene camera for normalised or pixel gaze, degrees "
        "(H V also accepted)",
    )
    r.add_argument(
        "--screen", type=_pair, metavar="W,H", help="screen width, height for screen gaze, mm"
    )
    r.add_argument("--distance", type=float, metavar="MM", help="eye-to-screen distance, mm")
    r.add_argument(
        "--resolution",
        type=_pair,
        metavar="W,H",
        help="screen width, height in pixels (pixel gaze, where the file does not say)",
    )
    r.add_argument(
        "--min-confidence",
        type=float,
        default=0.6,
        help="samples below this confidence are invalid (default 0.6)",
    )
    r.add_argument(
        "--pupil-scale",
        type=float,
        metavar="MM",
        help="EyeLink: mm per sqrt(area unit) (PUPIL AREA) or per unit (PUPIL DIAMETER)",
    )
    r.add_argument(
        "--columns",
        default=None,
        help="CSV without a header line: the column names, comma-separated (e.g. t,x,y)",
    )
    r.add_argument("--rate", type=float, default=None, help="CSV without a time column: Hz")
    r.add_argument("--stream", default=None, help="XDF: name of the stream to replay")
    o = parser.add_argument_group("the LSL outlet")
    o.add_argument("--name", default=None, help="LSL stream name")
    o.add_argument("--source-id", default=None, help="LSL source_id (default: unique)")
    o.add_argument("--speed", type=float, default=1.0, help="push speed vs real time")
    o.add_argument("--wait", type=float, default=60.0, help="wait for a consumer, s")


def _read_options(args: argparse.Namespace) -> ReadOptions:
    columns = (
        tuple(c.strip() for c in args.columns.split(",") if c.strip()) if args.columns else None
    )
    return ReadOptions(
        format=args.format,
        units=args.units,
        time_unit=args.time_unit,
        fov_deg=args.fov,
        screen_mm=args.screen,
        distance_mm=args.distance,
        resolution_px=args.resolution,
        min_confidence=args.min_confidence,
        pupil_scale=args.pupil_scale,
        columns=columns,
        rate_hz=args.rate,
    )


def run_replay(args: argparse.Namespace) -> int:
    """``gazeguard replay FILE``: stream the recording once at its timing, then exit."""
    files = ([args.file] if args.file is not None else []) + [
        Path(f) for f in getattr(args, "extra_files", None) or []
    ]
    if len(files) != 1:
        raise ConfigError(
            "file",
            [str(f) for f in files],
            "give exactly one recording: gazeguard replay FILE [--fov H,V ...]",
            "argument",
        )
    file = files[0]
    rec: GazeSamples | XdfStream
    what = ""
    if file.suffix.lower() in {".xdf", ".xdfz"}:
        rec = load_xdf(file, args.stream)
    else:
        recording = read_recording(file, _read_options(args), args.recording)
        rec = recording.samples
        if len(rec) < 2:
            raise DatasetError(file, f"only {len(rec)} sample: nothing to replay")
        what = f"{recording.format} recording {recording.recording!r}, "
        for note in recording.notes:
            print(f"gazeguard replay: note: {note}", file=sys.stderr)  # noqa: T201
    with Replay(
        rec, source_id=args.source_id, name=args.name, speed=args.speed, wait_s=args.wait
    ) as rp:
        print(  # noqa: T201
            f"replaying {file} ({what}{rp.rows.shape[0]} samples, {rp.rel_t[-1]:.1f} s) as LSL "
            f"stream {rp.name!r}, source_id {rp.source_id!r}",
            flush=True,
        )
        rp.wait()
        time.sleep(0.5)  # let the last samples reach the inlets before the outlet goes away
    print(f"sent {rp.samples_sent} samples", flush=True)  # noqa: T201
    return 0
