"""What every recording reader shares: options, the result type, errors, text tables, units.

Readers turn a file into :class:`GazeRecording` s whose samples are in gazeguard's units (time in
seconds, gaze direction in degrees of visual angle with x right and y up, pupil diameter in mm;
NaN + invalid where the tracker lost the eye). Everything a reader has to assume or drop is
written into :attr:`GazeRecording.notes` so that a caller can show it.
"""

from __future__ import annotations

import csv
import difflib
import itertools
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError, DatasetError
from gazeguard.core.samples import FloatArray, GazeSamples
from gazeguard.runtime.presets import normalized_to_deg, screen_to_deg

Format = Literal["auto", "csv", "pupil", "tobii", "eyelink", "mpiidpeye"]
GazeUnit = Literal["deg", "norm", "px"]
TimeUnit = Literal["s", "ms", "us", "ns"]
FORMATS: tuple[str, ...] = get_args(Format)
GAZE_UNITS: tuple[str, ...] = get_args(GazeUnit)
TIME_UNITS: tuple[str, ...] = get_args(TimeUnit)
TIME_SCALE_S: dict[str, float] = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}

#: Cells that mean "no value" in any recording format (compared lower-case, stripped).
MISSING = frozenset({"", "nan", "na", "n/a", "null", "none", "."})

_UNIT_WORDS: dict[str, str] = {
    "deg": "deg",
    "degree": "deg",
    "degrees": "deg",
    "norm": "norm",
    "normalized": "norm",
    "normalised": "norm",
    "px": "px",
    "pixel": "px",
    "pixels": "px",
    "s": "s",
    "sec": "s",
    "second": "s",
    "seconds": "s",
    "ms": "ms",
    "msec": "ms",
    "us": "us",
    "µs": "us",  # micro sign U+00B5
    "μs": "us",  # Greek mu U+03BC (what Tobii Pro Lab writes)
    "usec": "us",
    "ns": "ns",
    "mm": "mm",
}
_BRACKET_UNIT = re.compile(r"^(?P<base>.*?)\s*[\[(](?P<unit>[^\])]*)[\])]$")
_SUFFIX_UNIT = re.compile(
    r"^(?P<base>.+?)[_ ](?P<unit>" + "|".join(map(re.escape, _UNIT_WORDS)) + r")$"
)


class RecordingError(DatasetError):
    """A recording cannot be read as it is. The message names file, line and column.

    Attributes:
        path: the file.
        line: 1-based line number, when known.
        column: the column's name as written in the file, when the error is about one.
    """

    def __init__(
        self, path: str | Path, reason: str, line: int | None = None, column: str | None = None
    ) -> None:
        super().__init__(path, reason, line)
        self.column = column


@dataclass(frozen=True)
class ReadOptions:
    """How to read recordings whose files do not say everything themselves.

    Attributes:
        format: ``auto`` (detect from the content), ``csv`` (gazeguard's CSV), ``pupil`` (Pupil
            Player export), ``tobii`` (Tobii Pro Lab data export), ``eyelink`` (EyeLink ASC),
            ``mpiidpeye`` (a ``Data_P*_R*.csv`` file of the MPIIDPEye dataset).
        units: gaze units where the file does not state them: ``deg`` (degrees, y up), ``norm``
            (0..1 over the image or screen, origin top-left) or ``px`` (pixels, origin top-left).
        time_unit: time unit where the file does not state it: ``s``, ``ms``, ``us``, ``ns``.
        fov_deg: horizontal, vertical field of view of the camera whose image the normalised or
            pixel coordinates refer to (head-mounted trackers), degrees.
        screen_mm: width, height of the screen the coordinates refer to (desktop trackers), mm.
        distance_mm: eye-to-screen distance, mm (with ``screen_mm``).
        resolution_px: width, height of the screen or image in pixels (pixel coordinates).
        min_confidence: samples with a confidence below this are invalid (0..1).
        pupil_scale: EyeLink pupil calibration: mm per √(area unit) for ``PUPIL AREA`` files,
            mm per diameter unit for ``PUPIL DIAMETER`` files (as ``ingest.pupil_area_scale_mm``);
            without it EyeLink pupil sizes are left out (NaN).
        columns: names of the columns of a CSV file without a header line.
        rate_hz: the tracker's declared (nominal) sampling rate, Hz: the time base of a CSV
            file without a time column, and the rate the event detector is built for where the
            file declares none (only EyeLink ASC files do; the detector's parameters never
            come from measured timestamps).
    """

    format: Format = "auto"
    units: GazeUnit | None = None
    time_unit: TimeUnit | None = None
    fov_deg: tuple[float, float] | None = None
    screen_mm: tuple[float, float] | None = None
    distance_mm: float | None = None
    resolution_px: tuple[float, float] | None = None
    min_confidence: float = 0.6
    pupil_scale: float | None = None
    columns: tuple[str, ...] | None = None
    rate_hz: float | None = None

    def __post_init__(self) -> None:
        def bad(name: str, value: object, reason: str) -> ConfigError:
            return ConfigError(name, value, reason, "argument")

        if self.format not in FORMATS:
            raise bad("format", self.format, f"choose one of {', '.join(FORMATS)}")
        if self.units is not None and self.units not in GAZE_UNITS:
            raise bad("units", self.units, f"choose one of {', '.join(GAZE_UNITS)}")
        if self.time_unit is not None and self.time_unit not in TIME_UNITS:
            raise bad("time-unit", self.time_unit, f"choose one of {', '.join(TIME_UNITS)}")
        for name in ("fov_deg", "screen_mm", "resolution_px"):
            pair = getattr(self, name)
            if pair is not None and (
                len(pair) != 2 or not all(math.isfinite(v) and v > 0 for v in pair)
            ):
                raise bad(name, pair, "expected two finite numbers > 0")
        if self.fov_deg is not None and not all(v < 180 for v in self.fov_deg):
            raise bad("fov", self.fov_deg, "a field of view is below 180 degrees")
        for name in ("distance_mm", "pupil_scale", "rate_hz"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise bad(name, v, "must be a finite number > 0")
        if not 0.0 <= self.min_confidence <= 1.0:
            raise bad("min-confidence", self.min_confidence, "must be between 0 and 1")
        if (self.screen_mm is None) != (self.distance_mm is None):
            raise bad(
                "screen" if self.screen_mm is None else "distance",
                None,
                "the screen geometry needs both the screen size (--screen W,H in mm) and the "
                "eye-to-screen distance (--distance MM)",
            )
        if self.screen_mm is not None and self.fov_deg is not None:
            raise bad(
                "fov",
                self.fov_deg,
                "give either a screen (--screen and --distance, desktop trackers) or a field of "
                "view (--fov, head-mounted scene cameras), not both",
            )


@dataclass(frozen=True)
class GazeRecording:
    """One recording read from a file, in gazeguard's units.

    Attributes:
        samples: time (s, the recording's own clock), gaze (degrees, x right, y up), pupil
            diameter (mm) and validity; invalid samples are NaN.
        source: the file (or Pupil export folder) it came from.
        format: which reader read it (``csv``, ``pupil``, ``tobii``, ``eyelink``,
            ``mpiidpeye``).
        recording: recording id (unique within the source).
        person: person label, where the file gives one.
        task: task label, where the file gives one.
        notes: what the reader assumed or dropped, one sentence each.
        rate_hz: the declared sampling rate, Hz: the file's own declaration, else
            :attr:`ReadOptions.rate_hz`; ``None`` when neither declares one.
    """

    samples: GazeSamples
    source: Path
    format: str
    recording: str
    person: str | None = None
    task: str | None = None
    notes: tuple[str, ...] = field(default=())
    rate_hz: float | None = None


# --------------------------------------------------------------------------- header names
def split_unit(name: str) -> tuple[str, str | None]:
    """``"Gaze point X [DACS px]"`` → (``"gaze point x"``, ``"px"``); ``"x_deg"`` → (``"x"``,
    ``"deg"``). The base is lower-case with runs of blanks collapsed; unknown units give
    (base, the unit text lower-case) for brackets and no split for suffixes."""
    text = " ".join(name.strip().lower().split())
    m = _BRACKET_UNIT.match(text)
    if m and m.group("base"):
        words = m.group("unit").split()
        unit = next((_UNIT_WORDS[w] for w in reversed(words) if w in _UNIT_WORDS), None)
        return m.group("base"), unit or m.group("unit")
    m = _SUFFIX_UNIT.match(text)
    if m:
        return m.group("base"), _UNIT_WORDS[m.group("unit")]
    return text, None


def did_you_mean(wanted: Iterable[str], header: Sequence[str], known: Iterable[str] = ()) -> str:
    """`` did you mean 'X'?`` for the header name closest to a wanted name, else ``""``.

    Names that already are wanted or ``known`` (columns the reader understands) are no
    suggestion."""
    wanted = [w.lower() for w in wanted]
    skip = set(wanted) | {k.lower() for k in known}
    lowered = {h.strip().lower(): h for h in header if h.strip().lower() not in skip}
    best: tuple[float, str] | None = None
    for w in wanted:
        for cand in difflib.get_close_matches(w, list(lowered), n=1, cutoff=0.6):
            score = difflib.SequenceMatcher(None, w, cand).ratio()
            if best is None or score > best[0]:
                best = (score, lowered[cand])
    return f"; did you mean {best[1]!r}?" if best else ""


# --------------------------------------------------------------------------- delimited text
def open_text(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line without newline) of a UTF-8 text file (a BOM is allowed)."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:
            for lineno, line in enumerate(fh, start=1):
                yield lineno, line.rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise RecordingError(
            path, f"not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8"
        ) from exc
    except OSError as exc:
        raise RecordingError(path, f"cannot read: {exc.strerror}") from exc


def sniff_delimiter(header_line: str) -> str:
    """Tab if the header has one, else semicolon if it has semicolons and no commas, else comma."""
    if "\t" in header_line:
        return "\t"
    if ";" in header_line and "," not in header_line:
        return ";"
    return ","


@dataclass
class Table:
    """The columns a reader asked for, as text, with the file line of every row.

    ``cells[name]`` is the list of cells of that column (as written, stripped); ``lines[i]`` is
    the 1-based file line of row ``i``; ``header`` the names as written; ``decimal_comma``
    whether ``0,5`` means 0.5 (semicolon- or tab-separated files).
    """

    path: Path
    header: list[str]
    header_line: int
    cells: dict[str, list[str]]
    lines: list[int]
    decimal_comma: bool

    def __len__(self) -> int:
        return len(self.lines)

    def numbers(self, name: str, *, required: bool = False) -> FloatArray:
        """Column ``name`` as float64; missing cells are NaN (an error if ``required``)."""
        cells = self.cells[name]
        out: FloatArray | None
        try:  # fast path: numpy parses the text itself
            out = np.array(cells, dtype=np.float64)
        except ValueError:
            try:
                out = np.array(
                    ["nan" if c.lower() in MISSING else c for c in cells], dtype=np.float64
                )
            except ValueError:
                out = None
        if out is None or (required and not np.isfinite(out).all()):
            out = np.empty(len(cells), np.float64)  # slow path: finds and names the bad cell
            for i, cell in enumerate(cells):
                out[i] = parse_number(
                    cell, self.path, self.lines[i], name, self.decimal_comma, required=required
                )
        return out


def parse_number(
    cell: str, path: Path, line: int, column: str, decimal_comma: bool, *, required: bool = False
) -> float:
    """One numeric cell; raises :class:`RecordingError` naming file, line and column."""
    s = cell.strip()
    if s.lower() in MISSING:
        if required:
            raise RecordingError(
                path,
                f"no value in column {column!r}; every row needs one (drop the row or fill it in)",
                line,
                column,
            )
        return math.nan
    try:
        v = float(s)
    except ValueError:
        comma = _decimal_comma(s) if decimal_comma else None
        if comma is None:
            raise RecordingError(
                path,
                f"not a number in column {column!r}: {cell!r}; write numbers with a decimal "
                "point (missing values as an empty cell or nan)",
                line,
                column,
            ) from None
        v = comma
    if required and not math.isfinite(v):
        raise RecordingError(
            path, f"column {column!r} must be a finite number, got {cell!r}", line, column
        )
    return v


def is_number(text: str) -> bool:
    """True when ``float`` reads ``text`` (a header sniff: a first line of numbers is data)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def _decimal_comma(s: str) -> float | None:
    if s.count(",") != 1 or "." in s:
        return None
    try:
        return float(s.replace(",", "."))
    except ValueError:
        return None


def read_table(
    path: Path,
    want: Sequence[str] | None = None,
    *,
    header: Sequence[str] | None = None,
    comments: bool = True,
    first: tuple[int, str] | None = None,
    lines: Iterator[tuple[int, str]] | None = None,
) -> Table:
    """Read a delimited text file: a header line (or ``header`` for headerless files), then rows.

    Args:
        path: the file (named in errors).
        want: header names (as written) of the columns to keep; None keeps all.
        header: column names of a file without a header line.
        comments: skip lines starting with ``#``.
        first, lines: an already opened :func:`open_text` stream and its first line (used when
            the caller had to look at the first line to find the header).

    Raises:
        RecordingError: empty file, a row with the wrong number of fields.
    """
    stream = lines if lines is not None else open_text(path)
    line_of: list[int] = []

    def content() -> Iterator[str]:  # the lines that matter; their numbers go to line_of
        if first is not None:
            line_of.append(first[0])
            yield first[1]
        for lineno, text in stream:
            if not text.strip() or (comments and text.lstrip().startswith("#")):
                continue
            line_of.append(lineno)
            yield text

    it = content()
    head = next(it, None)
    if head is None and header is None:
        raise RecordingError(path, "the file is empty (no header line, no samples)")
    delim = sniff_delimiter(head if head is not None else ",")
    if header is None:
        assert head is not None
        names = [c.strip() for c in next(csv.reader([head], delimiter=delim))]
        header_line = line_of.pop()
        rest: Iterable[str] = it
    else:
        names = list(header)
        header_line = 0
        rest = itertools.chain([head] if head is not None else [], it)
    n = len(names)
    rows: list[list[str]] = []
    for fields in csv.reader(rest, delimiter=delim):
        if len(fields) != n and not (len(fields) > n and not "".join(fields[n:]).strip()):
            raise RecordingError(
                path,
                f"{len(fields)} fields, expected {n} ({delim.join(names)}); "
                "a row must have one field per header column",
                line_of[len(rows)],
            )
        rows.append(fields)
    keep = list(range(n)) if want is None else [names.index(w) for w in want]
    cells = {names[k]: [r[k].strip() for r in rows] for k in keep}
    return Table(path, names, header_line, cells, line_of, decimal_comma=delim in "\t;")


# --------------------------------------------------------------------------- units and geometry
def to_degrees(
    x: FloatArray,
    y: FloatArray,
    unit: str,
    opts: ReadOptions,
    path: Path,
    *,
    y_up: bool = False,
    resolution_px: tuple[float, float] | None = None,
    origin_px: tuple[float, float] = (0.0, 0.0),
) -> tuple[FloatArray, FloatArray]:
    """Gaze in ``unit`` → degrees of visual angle from the centre (x right, y up).

    ``deg`` is returned as is (negated y if ``y_up`` is False). ``px`` is divided by the
    resolution (``opts.resolution_px``, else the file's own ``resolution_px``) after subtracting
    ``origin_px``, giving normalised coordinates; normalised coordinates (origin top-left unless
    ``y_up``) go through the screen geometry (:func:`~gazeguard.runtime.presets.screen_to_deg`:
    azimuth
    ``atan(dx/D)``, elevation ``atan(dy/√(D²+dx²))``) or a pinhole camera's field of view
    (:func:`~gazeguard.runtime.presets.normalized_to_deg`).

    Raises:
        RecordingError: the geometry the conversion needs was not given (says which flags).
    """
    if unit == "deg":
        return x, (y if y_up else -y)
    if unit == "px":
        res = opts.resolution_px or resolution_px
        if res is None:
            raise RecordingError(
                path,
                "gaze is in pixels: give the screen (or image) resolution with --resolution W,H "
                f"and {GEOMETRY_HINT}",
            )
        u, v = (x - origin_px[0]) / res[0], (y - origin_px[1]) / res[1]
    elif unit == "norm":
        u, v = x, y
    else:
        raise RecordingError(path, f"unknown gaze unit {unit!r}; use deg, norm or px")
    if opts.screen_mm is not None and opts.distance_mm is not None:
        return screen_to_deg(u, (1.0 - v) if y_up else v, opts.screen_mm, opts.distance_mm)
    if opts.fov_deg is not None:
        return normalized_to_deg(u, v, opts.fov_deg, y_up=y_up)
    what = "in pixels" if unit == "px" else "normalised (0..1)"
    raise RecordingError(path, f"gaze is {what}: to turn it into degrees give {GEOMETRY_HINT}")


GEOMETRY_HINT = (
    "the screen size and eye distance (--screen W,H in mm and --distance MM) for a screen-based "
    "tracker, or the scene camera's field of view (--fov H,V in degrees) for a head-mounted one"
)


def check_time(
    t: FloatArray,
    path: Path,
    lines: Sequence[int],
    column: str,
    *,
    drop_repeats: bool = False,
) -> tuple[npt.NDArray[np.bool_], int]:
    """Check that time strictly increases; returns (rows to keep, repeated timestamps dropped).

    With ``drop_repeats`` (vendor exports, which may write one sample twice) a timestamp equal
    to the previous one is dropped instead of refused; a decrease is always an error.
    """
    keep = np.ones(t.shape, bool)
    if t.size < 2:
        return keep, 0
    dt = np.diff(t)
    if drop_repeats:
        back = np.flatnonzero(dt < 0)
        if back.size == 0:
            keep[1:] = dt > 0
            return keep, int(np.count_nonzero(dt == 0))
        bad = back
    else:
        bad = np.flatnonzero(~(dt > 0))
    if bad.size:
        i = int(bad[0])
        raise RecordingError(
            path,
            f"time does not increase in column {column!r} ({t[i]:.9g} on line {lines[i]}, then "
            f"{t[i + 1]:.9g}); sort the rows by time, or split interleaved recordings with a "
            "'recording' column",
            lines[i + 1],
            column,
        )
    return keep, 0


def median_step(t: FloatArray) -> float:
    """Median positive time step of ``t`` (NaN if there is none)."""
    dt = np.diff(t)
    dt = dt[dt > 0]
    return float(np.median(dt)) if dt.size else math.nan


def build_samples(
    t: FloatArray, x: FloatArray, y: FloatArray, pupil: FloatArray | None, valid: npt.ArrayLike
) -> GazeSamples:
    """GazeSamples with ``valid`` False (and non-finite gaze) as NaN + invalid."""
    ok = np.asarray(valid, bool) & np.isfinite(x) & np.isfinite(y)
    return GazeSamples.from_arrays(
        t,
        np.where(ok, x, np.nan),
        np.where(ok, y, np.nan),
        None if pupil is None else np.where(ok, pupil, np.nan),
    )
