"""EyeLink ASC files (``eyelink``): the text form of an EDF file written by SR Research's
``edf2asc``.

Lines that start with a digit are samples: ``time xL yL pL [xR yR pR] [velocities] [resolution]
[input] flags`` (time in ms of the tracker clock; gaze in screen pixels, origin top-left; pupil
in arbitrary camera units; ``.`` where the eye was lost). Which eyes and extra columns a sample
has is declared by the ``SAMPLES GAZE LEFT RIGHT RATE 1000.00 ... [VEL] [RES] [INPUT]`` line at
the start of each recording block, the pupil measure by ``PUPIL AREA`` or ``PUPIL DIAMETER``, the
screen by the message ``MSG <t> GAZE_COORDS 0.00 0.00 1919.00 1079.00`` (or ``DISPLAY_COORDS``).
Event lines (``SFIX``/``EFIX``, ``SSACC``/``ESACC``, ``SBLINK``/``EBLINK``, ``MSG``, ``INPUT``,
``START``/``END``) and the ``**`` preamble are read for what they say about samples and
otherwise skipped.

Read: gaze invalid where it is ``.``, the pupil is 0 or the eye is inside an ``SBLINK``…``EBLINK``
blink; both eyes averaged where both are valid. Pixels become degrees through the screen
geometry (``--screen``/``--distance``, or ``--fov`` for the screen's angular size), or, without
it, through the per-sample resolution (pixels per degree) of files converted with
``edf2asc -res``. Pupil: EyeLink measures area or diameter in uncalibrated units; with
``--pupil-scale`` (mm per √area unit, or per diameter unit) it becomes a diameter in mm (as
``ingest.pupil_area_scale_mm``), else it is left out.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gazeguard.core.samples import FloatArray
from gazeguard.offline.recordings._common import (
    GazeRecording,
    ReadOptions,
    RecordingError,
    build_samples,
    check_time,
    is_number,
    open_text,
    to_degrees,
)
from gazeguard.runtime.presets import EYELINK_MISSING

_MARKERS = ("MSG\t", "START\t", "SAMPLES\t", "EVENTS\t", "PUPIL\t", "EFIX ", "ESACC ", "SBLINK ")


def looks_like_asc(head: list[str]) -> bool:
    """The first lines of an ``edf2asc`` file: its ``**`` preamble or its keyword lines."""
    if any(ln.startswith("** CONVERTED FROM") for ln in head):
        return True
    return sum(ln.startswith(_MARKERS) for ln in head) >= 2


@dataclass
class _Layout:
    eyes: tuple[str, ...] = ()
    vel: bool = False
    res: bool = False
    declared: bool = False
    kind: str = "GAZE"


@dataclass
class _Columns:
    t: list[float] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    eye: dict[str, tuple[list[float], list[float], list[float]]] = field(
        default_factory=lambda: {e: ([], [], []) for e in "LR"}
    )
    res: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))


def read_eyelink(path: Path, opts: ReadOptions) -> list[GazeRecording]:  # noqa: PLR0912, PLR0915 - vendor format parser, one branch per record type
    """Read an EyeLink ASC file (see the module docstring); one recording.

    Raises:
        RecordingError: naming file, line and column, and what to do.
    """
    lay = _Layout()
    cols = _Columns()
    pupil_kind: str | None = None
    coords: tuple[float, float, float, float] | None = None
    coords_src = ""
    blink = {"L": False, "R": False}
    notes: list[str] = []
    inferred = False
    rate: float | None = None
    for lineno, line in open_text(path):
        if not line:
            continue
        if line[0].isdigit():
            fields = line.split()
            if not lay.declared:
                lay = _infer_layout(fields)
                inferred = True
            _sample(fields, lay, cols, blink, path=path, lineno=lineno)
            continue
        head, _, rest = line.partition("\t") if "\t" in line[:9] else line.partition(" ")
        words = rest.split()
        if head == "SAMPLES":
            lay = _declared_layout(words, path, lineno)
            upper = [w.upper() for w in words]
            if "RATE" in upper and upper.index("RATE") + 1 < len(words):
                with contextlib.suppress(ValueError):
                    rate = float(words[upper.index("RATE") + 1])
        elif head == "PUPIL" and words:
            pupil_kind = words[0].upper()
        elif head == "MSG" and len(words) >= 6 and words[1] in ("GAZE_COORDS", "DISPLAY_COORDS"):
            if coords_src != "GAZE_COORDS" or words[1] == "GAZE_COORDS":
                try:
                    left, top, right, bottom = (float(w) for w in words[2:6])
                except ValueError:
                    continue
                coords, coords_src = (left, top, right, bottom), words[1]
        elif head in ("SBLINK", "EBLINK") and words:
            for e in words[0].upper():
                if e in blink:
                    blink[e] = head == "SBLINK"
        elif head == "START":
            blink = {"L": False, "R": False}
    if inferred:
        notes.append("no SAMPLES line before the first sample: eyes inferred from the columns")
    if not cols.t:
        raise RecordingError(
            path,
            "no samples in this ASC file (only events): convert the EDF again with samples "
            "(edf2asc without -ne/-ns options, e.g. `edf2asc -y file.edf`)",
        )
    t = np.asarray(cols.t) * 1e-3
    keep, repeats = check_time(t, path, cols.lines, "time", drop_repeats=True)
    if repeats:
        notes.append(f"{repeats} samples repeating the previous timestamp dropped")

    xs, ys, ps = [], [], []
    for e in "LR":
        ex, ey, ep = (np.asarray(v, dtype=np.float64) for v in cols.eye[e])
        if np.isfinite(ex).any():
            xs.append(ex)
            ys.append(ey)
            ps.append(ep)
    if not xs:
        raise RecordingError(path, "no eye has a single valid gaze sample in this file")
    x = _nanmean(xs)
    y = _nanmean(ys)
    pupil = _pupil_mm(_nanmean(ps), pupil_kind, opts, notes)

    resolution = origin = None
    if coords is not None:
        origin = (coords[0], coords[1])
        resolution = (coords[2] - coords[0] + 1.0, coords[3] - coords[1] + 1.0)
    res_x = np.asarray(cols.res[0], dtype=np.float64)
    if opts.screen_mm is None and opts.fov_deg is None and np.isfinite(res_x).any():
        res = opts.resolution_px or resolution
        if res is None:
            raise RecordingError(
                path,
                "no GAZE_COORDS/DISPLAY_COORDS message: give the screen resolution with "
                "--resolution W,H",
            )
        o = origin or (0.0, 0.0)
        rx, ry = res_x, np.asarray(cols.res[1], dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            xd = (x - (o[0] + res[0] / 2)) / rx
            yd = ((o[1] + res[1] / 2) - y) / ry
        notes.append("pixels converted with the per-sample resolution (pixels per degree)")
    else:
        xd, yd = to_degrees(
            x,
            y,
            "px",
            opts,
            path,
            resolution_px=resolution,
            origin_px=origin or (0.0, 0.0),
        )
    samples = build_samples(t[keep], xd[keep], yd[keep], pupil[keep], np.isfinite(xd[keep]))
    declared = rate if rate is not None and rate > 0 else opts.rate_hz
    return [
        GazeRecording(samples, path, "eyelink", path.stem, notes=tuple(notes), rate_hz=declared)
    ]


def _declared_layout(words: list[str], path: Path, lineno: int) -> _Layout:
    up = [w.upper() for w in words]
    kind = up[0] if up else ""
    if kind != "GAZE":
        raise RecordingError(
            path,
            f"samples are in {kind or 'unknown'} coordinates, not screen GAZE: convert the EDF "
            "with edf2asc -sg (gaze samples)",
            lineno,
        )
    eyes = tuple(e[0] for e in ("LEFT", "RIGHT") if e in up)
    if not eyes:
        raise RecordingError(path, "SAMPLES line names no eye (LEFT or RIGHT)", lineno)
    return _Layout(eyes, vel="VEL" in up, res="RES" in up, declared=True, kind=kind)


def _infer_layout(fields: list[str]) -> _Layout:
    numeric = 0
    for f in fields[1:]:
        if f == "." or is_number(f):
            numeric += 1
        else:
            break
    return _Layout(("L", "R") if numeric >= 6 else ("L",), declared=False)


_EYE_NAMES = {"L": "left", "R": "right"}


def _sample(
    fields: list[str],
    lay: _Layout,
    cols: _Columns,
    blink: dict[str, bool],
    *,
    path: Path,
    lineno: int,
) -> None:
    def num(k: int, what: str) -> float:
        if k >= len(fields):
            raise RecordingError(
                path,
                f"sample has {len(fields)} fields, too few for the declared layout "
                f"({'/'.join(lay.eyes)} eye(s){', VEL' if lay.vel else ''}"
                f"{', RES' if lay.res else ''}); is the file cut short?",
                lineno,
                what,
            )
        tok = fields[k]
        if tok == ".":
            return math.nan
        try:
            v = float(tok)
        except ValueError:
            raise RecordingError(
                path, f"not a number in the {what} field: {tok!r}", lineno, what
            ) from None
        return math.nan if abs(v) >= EYELINK_MISSING else v

    t = num(0, "time")
    if not math.isfinite(t):
        raise RecordingError(path, "sample without a time", lineno, "time")
    cols.t.append(t)
    cols.lines.append(lineno)
    k = 1
    for e in "LR":
        ex, ey, ep = cols.eye[e]
        if e not in lay.eyes:
            ex.append(math.nan)
            ey.append(math.nan)
            ep.append(math.nan)
            continue
        name = _EYE_NAMES[e]
        x, y, p = num(k, f"{name} x"), num(k + 1, f"{name} y"), num(k + 2, f"{name} pupil")
        k += 3
        if blink[e] or not (p > 0):  # a blink, or pupil lost (0 or .)
            x = y = p = math.nan
        ex.append(x)
        ey.append(y)
        ep.append(p)
    if lay.vel:
        k += 2 * len(lay.eyes)
    if lay.res:
        cols.res[0].append(num(k, "x resolution"))
        cols.res[1].append(num(k + 1, "y resolution"))
    else:
        cols.res[0].append(math.nan)
        cols.res[1].append(math.nan)


def _nanmean(arrays: list[FloatArray]) -> FloatArray:
    if len(arrays) == 1:
        return arrays[0]
    stack = np.vstack(arrays)
    ok = np.isfinite(stack)
    count = ok.sum(axis=0)
    total = np.where(ok, stack, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)


def _pupil_mm(raw: FloatArray, kind: str | None, opts: ReadOptions, notes: list[str]) -> FloatArray:
    if opts.pupil_scale is None:
        notes.append(
            f"pupil {'area' if kind != 'DIAMETER' else 'diameter'} is in uncalibrated EyeLink "
            "units: left out (give --pupil-scale, mm per unit, from a calibration with an "
            "artificial pupil)"
        )
        return np.full(raw.shape, np.nan)
    if kind == "DIAMETER":
        return raw * opts.pupil_scale
    return np.sqrt(raw) * opts.pupil_scale
