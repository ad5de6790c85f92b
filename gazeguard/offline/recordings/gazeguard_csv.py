"""gazeguard's own CSV recording format (``csv``): the one documented layout, see ``FORMAT_HELP``.

A header line names the columns (case-insensitive, unknown ones ignored); a unit may be part of
the name (``time_ms``, ``x_deg``, ``x [px]``) or given by option. Rows may interleave several
recordings, told apart by the ``person``/``task``/``recording`` columns.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gazeguard.core.samples import BoolArray, FloatArray
from gazeguard.offline.recordings._common import (
    GAZE_UNITS,
    TIME_SCALE_S,
    TIME_UNITS,
    GazeRecording,
    ReadOptions,
    RecordingError,
    Table,
    build_samples,
    check_time,
    did_you_mean,
    is_number,
    median_step,
    open_text,
    read_table,
    sniff_delimiter,
    split_unit,
    to_degrees,
)

logger = logging.getLogger(__name__)

#: Accepted column names per role (after a unit suffix such as ``_ms`` or `` [px]`` is removed).
TIME_NAMES = ("t", "time", "timestamp", "time_stamp", "ts")
#: Gaze column pairs in order of preference; a pair stated in degrees wins over the others.
XY_NAMES = (
    ("x", "y"),
    ("gaze_x", "gaze_y"),
    ("gaze x", "gaze y"),
    ("gaze_point_x", "gaze_point_y"),
    ("gaze point x", "gaze point y"),
    ("gazex", "gazey"),
    ("azimuth", "elevation"),
    ("norm_pos_x", "norm_pos_y"),  # Pupil Labs: normalised, origin bottom-left
)
_Y_UP_PAIRS = {"norm_pos_x": "norm", "azimuth": "deg"}
PUPIL_NAMES = ("pupil", "pupil_diameter", "pupil diameter", "pupil_size", "diameter")
VALID_NAMES = ("valid", "validity", "is_valid")
CONFIDENCE_NAMES = ("confidence", "conf")
LABEL_NAMES: dict[str, tuple[str, ...]] = {
    "person": ("person", "participant", "subject", "participant_id", "participant name"),
    "task": ("task", "label", "activity", "stimulus", "condition"),
    "recording": ("recording", "recording_id", "recording name", "recording_name", "session"),
}
_TRUE = frozenset({"1", "1.0", "true", "t", "yes", "y", "valid"})
_FALSE = frozenset({"0", "0.0", "false", "f", "no", "n", "invalid"})


def _find(bases: dict[str, int], names: tuple[str, ...]) -> int | None:
    return next((bases[n] for n in names if n in bases), None)


def read_csv(path: Path, opts: ReadOptions) -> list[GazeRecording]:
    """Read a gazeguard CSV recording (see ``FORMAT_HELP``); one recording per label group.

    Raises:
        RecordingError: naming file, line and column, and what to do.
    """
    header: tuple[str, ...] | None = opts.columns
    lines = open_text(path)
    first = next(((n, t) for n, t in lines if t.strip() and not t.lstrip().startswith("#")), None)
    if first is None:
        raise RecordingError(path, "the file is empty (no header line, no samples)")
    if header is None:
        fields = [f.strip() for f in first[1].split(sniff_delimiter(first[1]))]
        if all(is_number(f) for f in fields):
            raise RecordingError(
                path,
                "no header line; name the columns in a first line such as t,x,y (or pass "
                "--columns t,x,y for a file without one)",
                first[0],
            )
    table = read_table(path, header=header, first=first, lines=lines)
    return _recordings(table, opts)


@dataclass(frozen=True, slots=True)
class _Columns:
    """Where a table's columns are: header names split from their units, and the first column
    of each base name."""

    parsed: list[tuple[str, str | None]]
    bases: dict[str, int]

    @classmethod
    def of(cls, header: Sequence[str]) -> _Columns:
        parsed = [split_unit(h) for h in header]
        bases: dict[str, int] = {}
        for i, (base, _) in enumerate(parsed):
            bases.setdefault(base, i)
        return cls(parsed, bases)


def _gaze_columns(
    table: Table, cols: _Columns, opts: ReadOptions
) -> tuple[int, int, str | None, str, bool]:
    """The x and y columns, the unit their header states (``None``: none), the gaze unit (the
    stated one, else ``opts.units``, else degrees) and whether y points up.

    Raises:
        RecordingError: no gaze columns, x and y in different units, an unknown unit, or a
            unit stated both by the header and by an option.
    """
    path, header, parsed, bases = table.path, table.header, cols.parsed, cols.bases
    pairs = [(bases[a], bases[b], a) for a, b in XY_NAMES if a in bases and b in bases]
    if not pairs:
        expected = " / ".join(f"{a},{b}" for a, b in (("x_deg", "y_deg"), *XY_NAMES))
        raise RecordingError(
            path,
            f"no gaze columns: expected one of {expected} (a unit may follow: x_deg, x_px, "
            f"x [norm]); found {','.join(header)}"
            + did_you_mean(["x", "gaze_x", "x_deg", "y", "gaze_y"], header),
            table.header_line or None,
        )
    ix, iy, first_name = next((p for p in pairs if parsed[p[0]][1] == "deg"), pairs[0])
    stated = {u for u in (parsed[ix][1], parsed[iy][1]) if u is not None}
    implied = _Y_UP_PAIRS.get(first_name)
    if implied == "norm":
        stated.add("norm")
    if len(stated) > 1:
        raise RecordingError(
            path,
            f"columns {header[ix]!r} and {header[iy]!r} state different units "
            f"({' and '.join(sorted(stated))}); x and y must share one",
            table.header_line or None,
            header[iy],
        )
    unit = stated.pop() if stated else None
    _check_stated_unit(
        table, ix, unit, kind="gaze", supported=GAZE_UNITS, flag="--units", given=opts.units
    )
    gaze_unit = unit or opts.units or "deg"
    return ix, iy, unit, gaze_unit, implied is not None or gaze_unit == "deg"


def _time_column(table: Table, cols: _Columns, opts: ReadOptions) -> tuple[int | None, str | None]:
    """The time column (``None``: none, the rate is given) and the time unit its header states.

    Raises:
        RecordingError: an unknown time unit, one stated both by the header and by an option,
            or neither a time column nor a rate.
    """
    path, header = table.path, table.header
    it = _find(cols.bases, TIME_NAMES)
    if it is None:
        if opts.rate_hz is None:
            raise RecordingError(
                path,
                f"no time column ({', '.join(TIME_NAMES)}; a unit may follow: time_ms) and no "
                "rate given (--rate HZ for a regularly sampled file)"
                + did_you_mean(["t", "time", "timestamp"], header),
                table.header_line or None,
            )
        return None, None
    time_unit = cols.parsed[it][1]
    _check_stated_unit(
        table,
        it,
        time_unit,
        kind="time",
        supported=TIME_UNITS,
        flag="--time-unit",
        given=opts.time_unit,
    )
    return it, time_unit


def _check_stated_unit(
    table: Table,
    column: int,
    unit: str | None,
    *,
    kind: str,
    supported: tuple[str, ...],
    flag: str,
    given: str | None,
) -> None:
    """Check the unit ``unit`` that the header of ``column`` (an index) states (``None``: none)
    for a ``kind`` (gaze or time) column against ``supported`` and the option ``flag``'s value
    ``given`` (``None``: not given).

    Raises:
        RecordingError: an unknown unit, or one that the option states otherwise.
    """
    if unit is None:
        return
    name = table.header[column]
    if unit not in supported:
        use = f"{', '.join(supported[:-1])} or {supported[-1]}"
        raise RecordingError(
            table.path,
            f"column {name!r}: {kind} unit {unit!r} is not supported; use {use}",
            table.header_line or None,
            name,
        )
    if given is not None and unit != given:
        raise RecordingError(
            table.path,
            f"column {name!r} states the unit {unit} but {flag} {given} was given; drop one of "
            "them",
            table.header_line or None,
            name,
        )


def _validity(table: Table, cols: _Columns, opts: ReadOptions) -> BoolArray:
    """Per row: valid by the validity column (if any) and at least ``opts.min_confidence`` by
    the confidence column (if any)."""
    valid = np.ones(len(table), bool)
    iv = _find(cols.bases, VALID_NAMES)
    if iv is not None:
        valid &= _flags(table, table.header[iv])
    ic = _find(cols.bases, CONFIDENCE_NAMES)
    if ic is not None:
        conf = table.numbers(table.header[ic])
        with np.errstate(invalid="ignore"):
            valid &= conf >= opts.min_confidence
    return valid


def _pupil(table: Table, cols: _Columns, notes: list[str]) -> FloatArray | None:
    """Pupil size in mm per row, or ``None`` (no column, or not in mm: said in ``notes``)."""
    ip = _find(cols.bases, PUPIL_NAMES)
    if ip is None:
        return None
    punit = cols.parsed[ip][1]
    if punit in (None, "mm"):
        return table.numbers(table.header[ip])
    notes.append(f"column {table.header[ip]!r} is not in mm ({punit}); pupil size left out")
    return None


def _groups(table: Table, cols: _Columns) -> dict[tuple[str, str, str], list[int]]:
    """Rows per (person, task, recording) label, in order of first appearance (one group of
    every row when the table has no label column)."""
    n = len(table)
    labels = {
        role: _labels(table, table.header[k])
        for role, names in LABEL_NAMES.items()
        if (k := _find(cols.bases, names)) is not None
    }
    if not labels:
        return {("", "", ""): list(range(n))}
    groups: dict[tuple[str, str, str], list[int]] = {}
    columns = [labels.get(r, [""] * n) for r in ("person", "task", "recording")]
    for i, key in enumerate(zip(*columns, strict=True)):
        groups.setdefault(key, []).append(i)
    return groups


def _recordings(table: Table, opts: ReadOptions) -> list[GazeRecording]:
    path, header = table.path, table.header
    cols = _Columns.of(header)
    notes: list[str] = []
    ix, iy, unit, gaze_unit, y_up = _gaze_columns(table, cols, opts)
    it, time_unit = _time_column(table, cols, opts)
    if len(table) == 0:
        raise RecordingError(
            path,
            "a header line but no samples: the file holds no data rows; check that the export "
            "finished and that this is the right file",
            table.header_line or None,
        )
    x = table.numbers(header[ix])
    y = table.numbers(header[iy])
    valid = _validity(table, cols, opts)
    pupil = _pupil(table, cols, notes)
    groups = _groups(table, cols)
    if gaze_unit == "deg" and unit is None and opts.units is None:
        _check_degrees(
            x, y, valid, xname=header[ix], yname=header[iy], path=path,
            header_line=table.header_line, notes=notes,
        )  # fmt: skip
    xd, yd = to_degrees(x, y, gaze_unit, opts, path, y_up=y_up)
    t_all = table.numbers(header[it], required=True) if it is not None else None
    out: list[GazeRecording] = []
    for (person, task, rec), rows in groups.items():
        idx = np.asarray(rows)
        if t_all is None:
            assert opts.rate_hz is not None
            t = np.arange(idx.size, dtype=np.float64) / opts.rate_hz
        else:
            assert it is not None
            unit_t = time_unit or opts.time_unit
            t = t_all[idx] * TIME_SCALE_S[unit_t or "s"]
            if unit_t is None:
                _check_seconds(t_all[idx], header[it], path, table.header_line)
            check_time(t, path, [table.lines[i] for i in rows], header[it])
        samples = build_samples(
            t, xd[idx], yd[idx], None if pupil is None else pupil[idx], valid[idx]
        )
        rid = rec or (f"{person}_{task}" if person and task else person or task or path.stem)
        recording = GazeRecording(
            samples, path, "csv", rid, person or None, task or None, notes=tuple(notes),
            rate_hz=opts.rate_hz,
        )  # fmt: skip
        out.append(recording)
    return out


def _flags(table: Table, name: str) -> BoolArray:
    out = np.empty(len(table), bool)
    for i, cell in enumerate(table.cells[name]):
        s = cell.lower()
        if s in _TRUE:
            out[i] = True
        elif s in _FALSE or s in ("", "nan"):
            out[i] = False
        else:
            raise RecordingError(
                table.path,
                f"column {name!r}: {cell!r} is not a validity flag; write 1 (valid) or 0 "
                "(invalid), or true/false",
                table.lines[i],
                name,
            )
    return out


def _labels(table: Table, name: str) -> list[str]:
    cells = table.cells[name]
    for i, cell in enumerate(cells):
        if not cell:
            raise RecordingError(
                table.path,
                f"empty {name!r} cell: every row needs a label in this column (or drop the column)",
                table.lines[i],
                name,
            )
    return cells


def _check_seconds(t: FloatArray, column: str, path: Path, header_line: int) -> None:
    """Time without a stated unit is taken as seconds; refuse steps no tracker makes in s."""
    dt = median_step(t)
    if math.isfinite(dt) and dt >= 0.5:
        guess = "ms" if dt < 200 else "us" if dt < 2e5 else "ns"
        raise RecordingError(
            path,
            f"time steps of {dt:g} (median) in column {column!r} are too long for seconds (a "
            f"tracker samples faster than 2 Hz); it looks like {guess}: state the unit in the "
            f"header ({column}_{guess}) or with --time-unit {guess}",
            header_line or None,
            column,
        )


def _check_degrees(
    x: FloatArray,
    y: FloatArray,
    valid: BoolArray,
    *,
    xname: str,
    yname: str,
    path: Path,
    header_line: int,
    notes: list[str],
) -> None:
    """Gaze without a stated unit is taken as degrees; refuse values no eye can turn to."""
    ok = valid & np.isfinite(x) & np.isfinite(y)
    if not ok.any():
        return
    big = (np.abs(x[ok]) > 90) | (np.abs(y[ok]) > 90)
    if np.mean(big) > 0.5:
        top = float(np.max(np.abs(np.concatenate([x[ok], y[ok]]))))
        raise RecordingError(
            path,
            f"gaze values up to {top:g} in columns {xname!r}/{yname!r} cannot be degrees: state "
            f"the unit in the header ({xname}_px, {xname}_norm) or with --units px|norm, with "
            "the geometry that turns it into degrees",
            header_line or None,
            xname,
        )
    inside = (x[ok] >= 0) & (x[ok] <= 1) & (y[ok] >= 0) & (y[ok] <= 1)
    if ok.sum() > 10 and inside.all():
        msg = (
            f"all gaze values in {xname!r}/{yname!r} lie in 0..1, read as degrees; if they are "
            "normalised, say so (x_norm or --units norm)"
        )
        logger.warning("%s: %s", path, msg)
        notes.append(msg)
