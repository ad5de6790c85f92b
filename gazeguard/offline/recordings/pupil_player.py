"""Pupil Player exports (``pupil``): ``exports/NNN/gaze_positions.csv`` of Pupil Core recordings.

Pupil Player's Raw Data Exporter writes one row per gaze datum: ``gaze_timestamp`` (s, Pupil
time), ``world_index``, ``confidence`` (0..1), ``norm_pos_x``/``norm_pos_y`` (the gaze point in
the world camera image, 0..1, origin bottom-left), ``base_data`` (the pupil data it was mapped
from, ``"<timestamp>-<eye id>"`` separated by blanks) and, from 3D gaze mappers,
``gaze_point_3d_x/y/z`` (mm, world camera coordinates: x right, y down, z forward) with eye
centres and gaze normals. Its sibling ``pupil_positions.csv`` has one row per eye image and
detector: ``pupil_timestamp``, ``eye_id``, ``confidence``, ``method`` and, from 3D detectors,
``diameter_3d`` (mm).

Gaze direction: from ``gaze_point_3d`` where the 3D mapper gave one (azimuth
``atan2(x, z)``, elevation ``atan2(−y, √(x²+z²))``, as ingest's ``pupil_capture`` preset),
else from ``norm_pos`` through the world camera's field of view (``--fov``). Samples below
``min_confidence`` are invalid. Pupil diameter: the mean ``diameter_3d`` of the pupil data in
``base_data`` whose confidence is at least ``min_confidence``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gazeguard.core.samples import FloatArray
from gazeguard.offline.recordings._common import (
    GazeRecording,
    ReadOptions,
    RecordingError,
    build_samples,
    check_time,
    did_you_mean,
    read_table,
    to_degrees,
)

GAZE_FILE = "gaze_positions.csv"
PUPIL_FILE = "pupil_positions.csv"
REQUIRED = ("gaze_timestamp", "confidence", "norm_pos_x", "norm_pos_y")
GAZE_3D = ("gaze_point_3d_x", "gaze_point_3d_y", "gaze_point_3d_z")


def find_export(path: Path) -> tuple[Path, list[str]]:
    """The ``gaze_positions.csv`` of a Pupil Player export, given the file, an export folder
    (``exports/000``) or the recording folder (the newest export is taken); plus notes."""
    if path.is_file():
        return path, []
    if (path / GAZE_FILE).is_file():
        return path / GAZE_FILE, []
    exports = sorted(
        (p for p in (path / "exports").glob(f"*/{GAZE_FILE}")),
        key=lambda p: (len(p.parent.name), p.parent.name),
    )
    if exports:
        notes = []
        if len(exports) > 1:
            notes.append(
                f"{len(exports)} Pupil Player exports; read the newest, {exports[-1].parent.name}"
            )
        return exports[-1], notes
    raise RecordingError(
        path,
        f"no {GAZE_FILE} here or in exports/*/: export the recording with Pupil Player's Raw "
        "Data Exporter (it writes exports/NNN/gaze_positions.csv)",
    )


def read_pupil_player(path: Path, opts: ReadOptions) -> list[GazeRecording]:
    """Read a Pupil Player export (see the module docstring); one recording.

    Raises:
        RecordingError: naming file, line and column, and what to do.
    """
    gaze_file, notes = find_export(path)
    table = read_table(gaze_file, comments=False)
    header = table.header
    lower = {h.lower(): h for h in header}
    if "pupil_timestamp" in lower and "gaze_timestamp" not in lower:
        raise RecordingError(
            gaze_file,
            f"this is Pupil Player's {PUPIL_FILE} (pupil size per eye image), not gaze: pass "
            f"the {GAZE_FILE} next to it, or the export folder",
            table.header_line,
        )
    missing = [c for c in REQUIRED if c not in lower]
    if missing:
        raise RecordingError(
            gaze_file,
            f"column {missing[0]!r} missing from this Pupil Player gaze export (needs "
            f"{', '.join(REQUIRED)}){did_you_mean(missing, header, REQUIRED + GAZE_3D)}; export "
            "again with Pupil Player's Raw Data Exporter, or pass --format csv to read it as "
            "gazeguard CSV",
            table.header_line,
            missing[0],
        )
    if len(table) == 0:
        raise RecordingError(
            gaze_file,
            "a header line but no samples: this export holds no gaze (was the recording "
            "trimmed to nothing, or low-confidence data excluded?)",
            table.header_line,
        )
    t = table.numbers(lower["gaze_timestamp"], required=True)
    conf = table.numbers(lower["confidence"])
    nx = table.numbers(lower["norm_pos_x"])
    ny = table.numbers(lower["norm_pos_y"])
    with np.errstate(invalid="ignore"):
        valid = conf >= opts.min_confidence
    x = np.full(t.shape, np.nan)
    y = np.full(t.shape, np.nan)
    use3d = np.zeros(t.shape, bool)
    if all(c in lower for c in GAZE_3D):
        gx, gy, gz = (table.numbers(lower[c]) for c in GAZE_3D)
        with np.errstate(invalid="ignore"):
            use3d = np.isfinite(gx) & np.isfinite(gy) & (gz > 0)
        x[use3d] = np.degrees(np.arctan2(gx[use3d], gz[use3d]))
        y[use3d] = np.degrees(np.arctan2(-gy[use3d], np.hypot(gx[use3d], gz[use3d])))
    need2d = valid & ~use3d & np.isfinite(nx) & np.isfinite(ny)
    if need2d.any():
        if opts.fov_deg is None and opts.screen_mm is None:
            raise RecordingError(
                gaze_file,
                f"{int(need2d.sum())} gaze samples have no 3D gaze point (2D gaze mapper), only "
                "norm_pos in the world camera image: give the world camera's field of view "
                "with --fov H,V (degrees; see your camera's specification)",
                table.lines[int(np.flatnonzero(need2d)[0])],
                lower["norm_pos_x"],
            )
        x2, y2 = to_degrees(nx[need2d], ny[need2d], "norm", opts, gaze_file, y_up=True)
        x[need2d], y[need2d] = x2, y2
        if use3d.any():
            notes.append(
                f"{int(need2d.sum())} samples without a 3D gaze point converted from norm_pos"
            )
    keep, repeats = check_time(
        t, gaze_file, table.lines, lower["gaze_timestamp"], drop_repeats=True
    )
    if repeats:
        notes.append(f"{repeats} gaze rows repeating the previous timestamp dropped")
    pupil = _pupil_sizes(gaze_file, table.cells.get(lower.get("base_data", ""), []), opts, notes)
    if pupil is None:
        pupil = np.full(t.shape, np.nan)
    samples = build_samples(t[keep], x[keep], y[keep], pupil[keep], valid[keep])
    root = gaze_file.parent
    if root.parent.name == "exports":  # <recording>/exports/NNN/gaze_positions.csv
        root = root.parent.parent
    return [
        GazeRecording(
            samples, gaze_file, "pupil", root.name, notes=tuple(notes), rate_hz=opts.rate_hz
        )
    ]


def _pupil_sizes(
    gaze_file: Path, base_data: list[str], opts: ReadOptions, notes: list[str]
) -> FloatArray | None:
    """Per gaze row, the mean 3D pupil diameter (mm) of its base pupil data; None if unknown."""
    pupil_file = gaze_file.with_name(PUPIL_FILE)
    if not pupil_file.is_file():
        notes.append(f"no {PUPIL_FILE} next to {GAZE_FILE}: no pupil size")
        return None
    if not base_data:
        notes.append(f"{GAZE_FILE} has no base_data column: pupil size not matched")
        return None
    table = read_table(pupil_file, comments=False)
    lower = {h.lower(): h for h in table.header}
    need = ("pupil_timestamp", "eye_id", "confidence", "diameter_3d")
    missing = [c for c in need if c not in lower]
    if missing:
        notes.append(
            f"{PUPIL_FILE} lacks {', '.join(missing)} (no 3D pupil detector): no pupil size"
        )
        return None
    conf = table.numbers(lower["confidence"])
    diam = table.numbers(lower["diameter_3d"])
    by_key: dict[tuple[float, str], float] = {}
    for ts, eye, c, d in zip(
        table.cells[lower["pupil_timestamp"]], table.cells[lower["eye_id"]], conf, diam, strict=True
    ):
        if math.isfinite(d) and c >= opts.min_confidence:
            try:
                by_key[(float(ts), eye.strip())] = float(d)
            except ValueError:
                continue
    out = np.full(len(base_data), np.nan)
    for i, cell in enumerate(base_data):
        vals = []
        for token in cell.split():
            ts, _, eye = token.rpartition("-")
            try:
                d = by_key.get((float(ts), eye))
            except ValueError:
                d = None
            if d is not None:
                vals.append(d)
        if vals:
            out[i] = sum(vals) / len(vals)
    if not np.isfinite(out).any():
        notes.append(f"no confident 3D pupil diameter in {PUPIL_FILE}: no pupil size")
    return out
