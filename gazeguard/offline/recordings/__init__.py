"""Recorded gaze files: one documented CSV format and the vendor exports people have.

:func:`read_recordings` reads a file (or a Pupil Player export folder) into
:class:`GazeRecording` s in gazeguard's units (seconds; degrees of visual angle, x right, y up;
pupil diameter in mm; NaN + invalid where the eye was lost), whatever it came from. The format is
detected from the content (:func:`detect_format`) or forced with ``ReadOptions(format=...)``:

``csv``
    gazeguard's own CSV (:mod:`~gazeguard.offline.recordings.gazeguard_csv`; :data:`FORMAT_HELP` is
    its
    documentation, shown by ``gazeguard replay --help`` and ``gazeguard eval --help``).
``pupil``
    Pupil Player's ``exports/NNN/gaze_positions.csv``
    (:mod:`~gazeguard.offline.recordings.pupil_player`).
``tobii``
    Tobii Pro Lab's Data Export TSV (:mod:`~gazeguard.offline.recordings.tobii`).
``eyelink``
    EyeLink ASC from ``edf2asc`` (:mod:`~gazeguard.offline.recordings.eyelink`).
``mpiidpeye``
    A ``Data_P*_R*.csv`` file of the MPIIDPEye dataset (eye-camera pupil positions, Pupil Labs in
    VR; :mod:`~gazeguard.offline.recordings.mpiidpeye`).

``gazeguard replay`` streams a recording as an LSL outlet, ``gazeguard eval --dataset csv:PATH``
evaluates a folder of them; both read through this module. Every error is a
:class:`RecordingError` naming the file, the line and the column, and saying what to do.
"""

from __future__ import annotations

import re
from pathlib import Path

from gazeguard.offline.recordings._common import (
    FORMATS,
    GAZE_UNITS,
    TIME_UNITS,
    GazeRecording,
    ReadOptions,
    RecordingError,
    split_unit,
)
from gazeguard.offline.recordings.eyelink import looks_like_asc, read_eyelink
from gazeguard.offline.recordings.gazeguard_csv import read_csv
from gazeguard.offline.recordings.mpiidpeye import looks_like_mpiidpeye, read_mpiidpeye
from gazeguard.offline.recordings.pupil_player import GAZE_FILE, read_pupil_player
from gazeguard.offline.recordings.tobii import looks_like_tobii, read_tobii

__all__ = [
    "FORMATS",
    "FORMAT_HELP",
    "GAZE_UNITS",
    "TIME_UNITS",
    "GazeRecording",
    "ReadOptions",
    "RecordingError",
    "detect_format",
    "parse_pair",
    "read_recording",
    "read_recordings",
]

FORMAT_HELP = """\
recordings: one CSV format, three vendor exports and one dataset read as they are (the format
is detected from the content; --format csv|pupil|tobii|eyelink|mpiidpeye forces one)

gazeguard CSV: a header line, then one sample per line. Column names are case-insensitive,
unknown columns are ignored, '#' lines are comments, an empty cell or nan is a missing value.
A unit may follow a name (time_ms, x_deg, x_px, x_norm, or "x [px]"); --units and --time-unit
give the units a header does not state.
  t | time | timestamp        time, s (or ms, us, ns); strictly increasing       required
  x,y | gaze_x,gaze_y        gaze: deg (x right, y up; the default), or          required
                             norm (0..1, origin top-left) or px (origin top-left),
                             which need --fov H,V (head-mounted scene camera) or
                             --screen W,H --distance MM (screen, mm); px also
                             --resolution W,H
  pupil | pupil_diameter     pupil diameter, mm                                  optional
  valid | validity           1 = valid, 0 = invalid                              optional
  confidence                 0..1; below --min-confidence (0.6) is invalid       optional
  person | participant       who (eval: needed, or --labels)                     optional
  task | label | activity    what they did (eval: needed, or --labels)           optional
  recording | session        recording id, for several recordings in one file    optional
example:
  t,x_deg,y_deg,pupil_mm,person,task
  0.000,1.20,-0.40,3.10,p01,reading
  0.004,1.22,-0.41,3.11,p01,reading

Pupil Player (Pupil Core): exports/NNN/gaze_positions.csv, or the recording or export folder;
  3D gaze is used as is, 2D norm_pos needs --fov; pupil size from pupil_positions.csv next to it.
Tobii Pro Lab: the Data Export .tsv (Recording timestamp [us or ms], Gaze point X/Y [DACS px],
  Pupil diameter left/right [mm], Validity left/right, Participant name); needs --screen and
  --distance (the resolution comes from the file).
EyeLink: the .asc written by edf2asc (samples, MSG GAZE_COORDS, PUPIL AREA|DIAMETER, blinks);
  needs --screen and --distance, or a file made with edf2asc -res; pupil in mm only with
  --pupil-scale (mm per unit, from a calibration with an artificial pupil).
MPIIDPEye: a Data_P<n>_R<m>.csv file (x;y;timestamp;confidence;diameter, no header): eye-camera
  pupil positions turned into degrees by Pupil Labs' public eye-camera and eye-model defaults,
  30 Hz, person and document (R1 comic, R2 newspaper, R3 textbook) from the file name.
"""

_READERS = {
    "csv": read_csv,
    "pupil": read_pupil_player,
    "tobii": read_tobii,
    "eyelink": read_eyelink,
    "mpiidpeye": read_mpiidpeye,
}


def parse_pair(text: str) -> tuple[float, float]:
    """``"90,70"`` or ``"90 70"`` → (90.0, 70.0).

    Raises:
        ValueError: not exactly two numbers (the message says what is expected).
    """
    parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
    try:
        a, b = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"{text!r}: expected two numbers like 90,70") from None
    return a, b


def detect_format(path: Path) -> str:
    """Which reader fits ``path``, from its content (not its name).

    Raises:
        RecordingError: a folder that is no Pupil export, a binary file, an unreadable file.
    """
    path = Path(path)
    if path.is_dir():
        if (path / GAZE_FILE).is_file() or any((path / "exports").glob(f"*/{GAZE_FILE}")):
            return "pupil"
        raise RecordingError(
            path,
            "a folder, not a recording: pass a file (or a Pupil Player recording or export "
            "folder, which holds gaze_positions.csv)",
        )
    if path.suffix.lower() == ".edf":
        raise RecordingError(
            path,
            "EyeLink EDF files are binary: convert it with SR Research's edf2asc (edf2asc -y "
            "FILE.edf) and pass the .asc",
        )
    try:
        with path.open("rb") as fh:
            raw = fh.read(16384)
    except OSError as exc:
        raise RecordingError(path, f"cannot read: {exc.strerror}") from exc
    if b"\x00" in raw:
        raise RecordingError(
            path,
            "a binary file, not text: export the recording as CSV/TSV (or ASC for EyeLink); "
            "XDF files are replayed with `gazeguard replay FILE.xdf`",
        )
    text = raw.decode("utf-8-sig", errors="replace")
    lines = text.splitlines()[:-1] if len(raw) == 16384 else text.splitlines()
    if looks_like_asc(lines[:200]):
        return "eyelink"
    header = next((ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")), "")
    if looks_like_mpiidpeye(header):
        return "mpiidpeye"
    if looks_like_tobii(header):
        return "tobii"
    names = {split_unit(h)[0] for h in re.split(r"[,\t;]", header)}
    if "gaze_timestamp" in names or ("pupil_timestamp" in names and "eye_id" in names):
        return "pupil"
    return "csv"


def read_recordings(path: str | Path, options: ReadOptions | None = None) -> list[GazeRecording]:
    """Every recording in ``path`` (usually one; a CSV or Tobii export may hold several).

    Raises:
        RecordingError: naming file, line and column, and what to do.
    """
    opts = options or ReadOptions()
    path = Path(path)
    if not path.exists():
        raise RecordingError(path, "no such file or folder")
    fmt = opts.format if opts.format != "auto" else detect_format(path)
    if fmt == "mpiidpeye" and opts.format == "auto" and opts.columns is not None:
        fmt = "csv"  # a headerless CSV whose columns were named (--columns)
    if path.is_dir() and fmt != "pupil":
        raise RecordingError(path, f"a folder, not a {fmt} file: pass the file itself")
    return _READERS[fmt](path, opts)


def read_recording(
    path: str | Path, options: ReadOptions | None = None, recording: str | None = None
) -> GazeRecording:
    """The one recording in ``path``, or the one whose id is ``recording``.

    Raises:
        RecordingError: the file holds several recordings and none was chosen, or no such id.
    """
    recs = read_recordings(path, options)
    ids = [r.recording for r in recs]
    if recording is not None:
        for r in recs:
            if r.recording == recording:
                return r
        raise RecordingError(path, f"no recording {recording!r}; it holds {', '.join(ids)}")
    if len(recs) > 1:
        raise RecordingError(
            path,
            f"holds {len(recs)} recordings ({', '.join(ids[:10])}"
            f"{', …' if len(ids) > 10 else ''}): choose one with --recording ID",
        )
    return recs[0]
