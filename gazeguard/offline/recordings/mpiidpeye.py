"""MPIIDPEye raw eye data (``mpiidpeye``): one ``Data_P{person}_R{document}.csv`` per recording.

MPIIDPEye (Steil, Hagestedt, Huang, Bulling, ETRA 2019; the dataset of Bozkir et al. 2021's
document-type, gender and person-identification tables): 20 people reading three documents in
VR with a Pupil Labs add-on in an HTC Vive. Each file is semicolon-separated, without a header
line, one sample per line::

    pupil x ; pupil y ; timestamp (s, Pupil clock) ; confidence (0..1) ; pupil diameter (px)

Read:

* **Labels** from the file name: person ``P{n}``, document ``R1`` comic, ``R2`` newspaper,
  ``R3`` textbook (:data:`DOCUMENTS`). Gender is in the dataset's ``Ground_Truth.csv``, read by
  :class:`gazeguard.offline.eval.datasets.MpiiDpEye`.
* **Rate**: the stream declares none; the dataset's is 30 Hz (median step 32.9 ms, 30.4 Hz), so
  :data:`RATE_HZ` unless ``--rate`` says otherwise.
* **Validity**: confidence below ``--min-confidence`` (Pupil's usual cut, 0.6) is invalid.
* **Degrees.** The coordinates are the pupil's centre in the *eye camera's* image, normalised to
  0..1 (x by the image width, y by its height, y up): the tracker was never calibrated, so there
  is no gaze point. They are turned into eye-rotation angles by a stated geometry made only of
  public numbers from Pupil Labs' open-source software (:func:`eye_image_to_degrees`): a
  640 × 480 eye image (:data:`EYE_IMAGE_PX`) with the focal length Pupil ships for its 120 Hz
  eye camera at that size (:data:`EYE_FOCAL_PX`, 670.8 px, ``camera_models.py``), and pye3d's
  default eye: the eyeball's centre 35 mm in front of the camera (:data:`EYE_CENTRE_MM`) and the
  pupil 10.39 mm from it (:data:`EYE_RADIUS_MM`, ``pye3d/constants.py``). In the small-angle
  limit a rotation θ moves the pupil's image by ``f·R·θ/(C − R)`` pixels, so one unit of the
  normalised image is :data:`DEG_PER_UNIT` = (129.4°, 97.1°) in x and y, measured from the
  image centre. The same geometry turns the pupil diameter into mm (``px·(C − R)/f``: the
  dataset's median of about 87 px becomes 3.2 mm). What it leaves out: the camera looks at the
  eye from below and aside (foreshortening shrinks movements along that tilt by its cosine),
  the eye's true position differs per person and per fit of the headset, and the straight-ahead
  pupil is not at the image centre. Velocities, amplitudes and dispersions — the features that
  need degrees — scale with :data:`DEG_PER_UNIT`; a person's or document's *relative*
  differences do not depend on it. Saccade *directions* (the right/left/up/down ratios, the
  wordbooks) are in the eye image's axes, not the scene's.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from gazeguard.core.samples import FloatArray
from gazeguard.offline.recordings._common import (
    GazeRecording,
    ReadOptions,
    RecordingError,
    build_samples,
    check_time,
    read_table,
)

#: The columns of a ``Data_P*_R*.csv`` file (no header line).
COLUMNS = ("pupil_x", "pupil_y", "timestamp", "confidence", "pupil_diameter_px")
#: The dataset's rate, Hz (SOURCE.md: about 30 Hz, median 30.4 Hz; the stream declares none).
RATE_HZ = 30.0
#: ``R{n}`` of a file name → the document read.
DOCUMENTS: dict[str, str] = {"R1": "comic", "R2": "newspaper", "R3": "textbook"}
#: Eye-camera image, width × height, px (Pupil Labs' 120 Hz eye camera of the HTC Vive add-on).
EYE_IMAGE_PX = (640.0, 480.0)
#: Focal length of that camera at 640 × 480, px (Pupil's default intrinsics of "Pupil Cam1 ID0").
EYE_FOCAL_PX = 670.8
#: Distance of the eyeball's centre from the eye camera, mm (pye3d's default sphere centre).
EYE_CENTRE_MM = 35.0
#: Distance of the pupil from the eye's centre of rotation, mm (pye3d's default eye radius).
EYE_RADIUS_MM = 10.392
#: Image scale at the pupil, mm per px: ``(C − R) / f``.
MM_PER_PX = (EYE_CENTRE_MM - EYE_RADIUS_MM) / EYE_FOCAL_PX
#: Degrees of eye rotation per unit of the normalised eye image, (x, y), small-angle limit.
DEG_PER_UNIT = (
    math.degrees(EYE_IMAGE_PX[0] * MM_PER_PX / EYE_RADIUS_MM),
    math.degrees(EYE_IMAGE_PX[1] * MM_PER_PX / EYE_RADIUS_MM),
)

_NAME = re.compile(r"^Data_(P\d+)_(R\d+)$", re.IGNORECASE)
_NUMBER = r"\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*"
_ROW = re.compile(rf"^{_NUMBER}(?:;{_NUMBER}){{4}};?$")


def looks_like_mpiidpeye(first_line: str) -> bool:
    """A headerless line of five semicolon-separated numbers (an MPIIDPEye sample)."""
    return bool(_ROW.match(first_line.strip()))


def labels_of(path: Path) -> tuple[str | None, str | None]:
    """(person, document) from a ``Data_P{n}_R{m}.csv`` name; (None, None) for another name."""
    m = _NAME.match(path.stem)
    if m is None:
        return None, None
    person, doc = m.group(1).upper(), m.group(2).upper()
    return person, DOCUMENTS.get(doc, doc.lower())


def eye_image_to_degrees(
    x_norm: FloatArray, y_norm: FloatArray, deg_per_unit: tuple[float, float] = DEG_PER_UNIT
) -> tuple[FloatArray, FloatArray]:
    """Normalised eye-camera pupil position (0..1, y up) → eye rotation, degrees from the image
    centre: ``(x − 0.5)·deg_per_unit[0]``, ``(y − 0.5)·deg_per_unit[1]`` (see the module doc)."""
    x = (np.asarray(x_norm, np.float64) - 0.5) * deg_per_unit[0]
    y = (np.asarray(y_norm, np.float64) - 0.5) * deg_per_unit[1]
    return x, y


def read_mpiidpeye(path: Path, opts: ReadOptions) -> list[GazeRecording]:
    """Read one MPIIDPEye ``Data_P*_R*.csv`` file (see the module docstring); one recording.

    Raises:
        RecordingError: naming file, line and column, and what to do.
    """
    table = read_table(path, header=COLUMNS, comments=False)
    if len(table) == 0:
        raise RecordingError(path, "no samples: an MPIIDPEye file has one sample per line")
    t = table.numbers("timestamp", required=True)
    nx = table.numbers("pupil_x")
    ny = table.numbers("pupil_y")
    conf = table.numbers("confidence")
    diam = table.numbers("pupil_diameter_px")
    with np.errstate(invalid="ignore"):
        valid = conf >= opts.min_confidence
    keep, repeats = check_time(t, path, table.lines, "timestamp", drop_repeats=True)
    x, y = eye_image_to_degrees(nx, ny)
    pupil = diam * MM_PER_PX
    person, task = labels_of(path)
    notes = [
        "eye-camera pupil positions (uncalibrated) turned into eye rotation at "
        f"{DEG_PER_UNIT[0]:.1f} deg per image width and {DEG_PER_UNIT[1]:.1f} deg per image "
        f"height, pupil diameter at {MM_PER_PX:.4f} mm per px (Pupil Labs' public eye-camera "
        "and eye-model defaults; see gazeguard.offline.recordings.mpiidpeye)",
    ]
    if opts.rate_hz is None:
        notes.append(f"no declared rate in the file: the dataset's {RATE_HZ:g} Hz assumed")
    if repeats:
        notes.append(f"{repeats} rows repeating the previous timestamp dropped")
    if person is None:
        notes.append(
            f"file name {path.name!r} is not Data_P<n>_R<m>.csv: no person or document label"
        )
    samples = build_samples(t[keep], x[keep], y[keep], pupil[keep], valid[keep])
    return [
        GazeRecording(
            samples,
            path,
            "mpiidpeye",
            path.stem,
            person=person,
            task=task,
            notes=tuple(notes),
            rate_hz=opts.rate_hz or RATE_HZ,
        )
    ]
