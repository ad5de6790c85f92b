"""Tobii Pro Lab data exports (``tobii``): the tab-separated file of Pro Lab's Data Export.

One row per sensor sample or event, columns named in English with the unit in brackets in
recent versions (``Recording timestamp [μs]`` or ``[ms]``, ``Gaze point X [DACS px]``,
``Pupil diameter left [mm]``) and without it in older ones (``Recording timestamp``,
``Gaze point X``, ``Pupil diameter left``); ``Sensor`` says which sensor a row is from (``Eye
Tracker``, ``Gyroscope``, ``Accelerometer`` on Glasses; event rows carry ``Event``); ``Validity
left``/``Validity right`` are ``Valid``/``Invalid``; ``Participant name`` and ``Recording name``
identify the recording, ``Recording resolution width``/``height`` the screen in pixels. Numbers
may use a decimal comma (Pro Lab follows the computer's locale).

Read: the eye-tracker rows only; time from ``Recording timestamp`` (unit from its header, else
``--time-unit``, else inferred from the sampling step: a median step below 200 is ms, above is
µs, and a note says so); gaze from ``Gaze point X/Y`` (the average of both eyes, display-area
pixels, origin top-left; or the mean of the valid eyes' ``Gaze point left/right X/Y``) through
the resolution and the screen geometry; pupil the mean of the valid eyes' diameters (mm). A
sample is valid when its gaze point is present and at least one eye is ``Valid``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gazeguard.core.samples import BoolArray, FloatArray
from gazeguard.offline.recordings._common import (
    TIME_SCALE_S,
    GazeRecording,
    ReadOptions,
    RecordingError,
    Table,
    build_samples,
    check_time,
    did_you_mean,
    median_step,
    read_table,
    split_unit,
    to_degrees,
)

TIME_NAMES = ("recording timestamp", "eyetracker timestamp")


def looks_like_tobii(header_line: str) -> bool:
    """A Pro Lab export's header: tab-separated with a recording timestamp and gaze points."""
    names = {split_unit(h)[0] for h in header_line.split("\t")}
    return "recording timestamp" in names or (
        "eyetracker timestamp" in names and "gaze point x" in names
    )


def read_tobii(path: Path, opts: ReadOptions) -> list[GazeRecording]:  # noqa: PLR0912, PLR0915 - vendor format parser, one branch per export column
    """Read a Tobii Pro Lab data export (see the module docstring); one recording per
    (participant, recording name).

    Raises:
        RecordingError: naming file, line and column, and what to do.
    """
    table = read_table(path, comments=False)
    header = table.header
    col: dict[str, str] = {}
    units: dict[str, str | None] = {}
    for h in header:
        base, unit = split_unit(h)
        if base not in col or (unit == "px" and units[base] != "px"):  # DACS px over MCS norm
            col[base], units[base] = h, unit
    tname = next((n for n in TIME_NAMES if n in col), None)
    if tname is None:
        raise RecordingError(
            path,
            "no 'Recording timestamp' column: include it in Pro Lab's Data Export (or pass "
            "--format csv to read the file as gazeguard CSV)"
            + did_you_mean(["recording timestamp"], header),
            table.header_line,
        )
    combined = "gaze point x" in col and "gaze point y" in col
    per_eye = all(f"gaze point {e} {a}" in col for e in ("left", "right") for a in "xy")
    if not (combined or per_eye):
        raise RecordingError(
            path,
            "no 'Gaze point X'/'Gaze point Y' columns (nor per eye): include the gaze point in "
            "Pro Lab's Data Export" + did_you_mean(["gaze point x", "gaze point y"], header),
            table.header_line,
        )
    rows = _eye_tracker_rows(table, col)
    if rows.size == 0:
        raise RecordingError(
            path,
            "no eye-tracker samples (only a header, events or other sensors): export with "
            "gaze data included",
            table.header_line,
        )
    notes: list[str] = []
    sub = _subset(table, rows)
    t_raw = sub.numbers(col[tname], required=True)
    tunit = units[tname]
    if tunit not in (None, "ms", "us", "s", "ns"):
        raise RecordingError(
            path,
            f"column {col[tname]!r}: unknown time unit {tunit!r}; expected μs or ms",
            table.header_line,
            col[tname],
        )
    if tunit is None:
        tunit = opts.time_unit
    if tunit is None:
        step = median_step(t_raw)
        tunit = "ms" if math.isfinite(step) and step < 200 else "us"
        notes.append(
            f"{col[tname]!r} states no unit; read as {tunit} from its median step {step:g} "
            "(override with --time-unit)"
        )
    t = t_raw * TIME_SCALE_S[tunit]

    valid_l = _validity(sub, col.get("validity left"))
    valid_r = _validity(sub, col.get("validity right"))
    if combined:
        gx = sub.numbers(col["gaze point x"])
        gy = sub.numbers(col["gaze point y"])
        gunit = units["gaze point x"]
    else:
        lx, ly = sub.numbers(col["gaze point left x"]), sub.numbers(col["gaze point left y"])
        rx, ry = sub.numbers(col["gaze point right x"]), sub.numbers(col["gaze point right y"])
        gx, gy = _mean_eyes(lx, rx, valid_l, valid_r), _mean_eyes(ly, ry, valid_l, valid_r)
        gunit = units["gaze point left x"]
    if gunit not in (None, "px"):
        raise RecordingError(
            path,
            f"gaze point unit {gunit!r} is not supported: include Gaze point X/Y in display "
            "pixels (DACS px) in Pro Lab's Data Export",
            table.header_line,
        )
    any_eye = (valid_l | valid_r) if (valid_l is not None and valid_r is not None) else None
    valid = np.isfinite(gx) & np.isfinite(gy)
    if any_eye is not None:
        valid &= any_eye
    resolution = _resolution(sub, col)
    x, y = to_degrees(gx, gy, gunit or "px", opts, path, resolution_px=resolution)

    pl = sub.numbers(col["pupil diameter left"]) if "pupil diameter left" in col else None
    pr = sub.numbers(col["pupil diameter right"]) if "pupil diameter right" in col else None
    pupil: FloatArray | None = None
    if pl is not None and pr is not None:
        pupil = _mean_eyes(pl, pr, valid_l, valid_r)
    elif pl is not None or pr is not None:
        pupil = pl if pl is not None else pr

    person = sub.cells.get(col.get("participant name", ""), [""] * len(sub))
    recname = sub.cells.get(col.get("recording name", ""), [""] * len(sub))
    groups: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(person, recname, strict=True)):
        groups.setdefault(key, []).append(i)
    out = []
    for (who, rec), idx_list in groups.items():
        idx = np.asarray(idx_list)
        keep, repeats = check_time(
            t[idx], path, [sub.lines[i] for i in idx_list], col[tname], drop_repeats=True
        )
        rec_notes = list(notes)
        if repeats:
            rec_notes.append(f"{repeats} eye-tracker rows repeating the previous timestamp dropped")
        k = idx[keep]
        samples = build_samples(t[k], x[k], y[k], None if pupil is None else pupil[k], valid[k])
        out.append(
            GazeRecording(
                samples,
                path,
                "tobii",
                rec or path.stem,
                who or None,
                notes=tuple(rec_notes),
                rate_hz=opts.rate_hz,
            )
        )
    return out


def _eye_tracker_rows(table: Table, col: dict[str, str]) -> npt.NDArray[np.intp]:
    n = len(table)
    if "sensor" in col:
        sensor = table.cells[col["sensor"]]
        keep = [i for i in range(n) if sensor[i].lower() == "eye tracker"]
        if keep or any(s for s in sensor):
            return np.asarray(keep, dtype=np.intp)
    if "event" in col:
        event = table.cells[col["event"]]
        return np.asarray([i for i in range(n) if not event[i]], dtype=np.intp)
    return np.arange(n, dtype=np.intp)


def _subset(table: Table, rows: npt.NDArray[np.intp]) -> Table:
    pick = rows.tolist()
    return Table(
        table.path,
        table.header,
        table.header_line,
        {k: [v[i] for i in pick] for k, v in table.cells.items()},
        [table.lines[i] for i in pick],
        table.decimal_comma,
    )


def _validity(table: Table, name: str | None) -> BoolArray | None:
    if name is None:
        return None
    out = np.empty(len(table), bool)
    for i, cell in enumerate(table.cells[name]):
        s = cell.lower()
        if s in ("valid", "1", "true"):
            out[i] = True
        elif s in ("invalid", "0", "false", ""):
            out[i] = False
        else:
            raise RecordingError(
                table.path,
                f"column {name!r}: {cell!r} is neither Valid nor Invalid",
                table.lines[i],
                name,
            )
    return out


def _mean_eyes(
    left: FloatArray,
    right: FloatArray,
    valid_l: BoolArray | None,
    valid_r: BoolArray | None,
) -> FloatArray:
    """Mean of the eyes that are valid and present (NaN where neither is)."""
    lv = np.isfinite(left) & (True if valid_l is None else valid_l)
    rv = np.isfinite(right) & (True if valid_r is None else valid_r)
    total = np.where(lv, left, 0.0) + np.where(rv, right, 0.0)
    count = lv.astype(np.float64) + rv.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)


def _resolution(table: Table, col: dict[str, str]) -> tuple[float, float] | None:
    names = ("recording resolution width", "recording resolution height")
    if not all(n in col for n in names):
        return None
    w, h = (table.numbers(col[n]) for n in names)
    w, h = w[np.isfinite(w)], h[np.isfinite(h)]
    if w.size == 0 or h.size == 0:
        return None
    return float(w[0]), float(h[0])
