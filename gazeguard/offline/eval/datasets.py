"""Datasets for the evaluation: recorded or simulated gaze, one interface, cached features.

A :class:`Dataset` yields :class:`Recording` s — one person doing one task, as a
:class:`~gazeguard.core.samples.GazeSamples` block in degrees — and :meth:`Dataset.features` turns
them
into a :class:`~gazeguard.signal.dataset.FeatureTable` with the same ``extract_features`` the live
service runs. Extraction is the slow part, so tables are cached as NPZ under a cache directory,
keyed by the dataset's content fingerprint, the window and step, and a hash of the feature code.

Built in (``open_dataset(spec)``; where the public ones come from: :data:`PUBLIC_DATASETS`):

``gazegraph``
    GazeGraph DesktopActivity (Lan et al., SenSys 2020): 8 people × 6 desktop activities × 5 min,
    Pupil Core at 30 Hz, read straight from ``DesktopActivity.zip`` as downloaded (or from the
    repository's zip, a clone, or the unpacked folder). Gaze is normalised to the
    screen (0..1, origin bottom-left, y up); the upstream README gives a 34-inch screen at about
    50 cm. We assume the common 21:9 panel (797 × 333 mm) and convert by perspective projection
    from the screen centre: azimuth ``atan(x_mm / D)``, elevation ``atan(y_mm / hypot(x_mm, D))``.
    The screen thus spans ±38.6° × ±18.4°. If the coordinates were in fact scene-camera
    coordinates (Pupil Core wide lens, about 99° × 53° at 720p) all angles would be ~25 % larger;
    ``screen_mm``/``distance_mm`` make the assumption explicit and changeable. No pupil size.
``irf``
    IRF lookAtPoint_EL (Zemblys et al. 2018): 6 people, EyeLink 1000 Hz, 81 s, degrees; one task
    (so task recognition is not defined; re-identification is). ``status == False`` → invalid.
    Read from ``etdata/lookAtPoint_EL`` of the repository (a clone, or its zip as downloaded).
``mpiidpeye`` (``mpiidpeye:PATH``; ``mpiidpeye-gender``, ``mpiidpeye-gender:PATH``)
    MPIIDPEye (Steil et al., ETRA 2019), the dataset of Bozkir et al. 2021's tables: 20 people
    (10 female, 10 male) reading a comic, a newspaper and a textbook in VR, Pupil Labs add-on in
    an HTC Vive, 30 Hz; the folder of ``Data_P*_R*.csv`` files and ``Ground_Truth.csv``. Each
    file is read by :mod:`gazeguard.offline.recordings.mpiidpeye` (eye-camera pupil positions
    turned into eye rotation by Pupil Labs' public camera and eye-model defaults; confidence
    below 0.6 invalid). The task is the document type; with ``mpiidpeye-gender`` it is the
    reader's gender from ``Ground_Truth.csv`` (the same features, relabelled).
``synthetic``
    ``gazeguard.runtime.simulate.simulate_gaze`` for ``people`` simulated people × tasks.
``csv:PATH``
    Your own recordings: a file, or a folder searched for ``*.csv``, ``*.tsv``, ``*.asc`` and
    Pupil Player exports, each read by :mod:`gazeguard.offline.recordings` (gazeguard's CSV format,
    Pupil
    Player, Tobii Pro Lab, EyeLink ASC; see ``FORMAT_HELP`` there). Each recording needs a person
    and a task: from its columns, or from its path with ``labels="{person}/{task}"``. A
    malformed file raises :class:`~gazeguard.core.errors.DatasetError` naming file, line and column.
``table:PATH``
    A precomputed :class:`~gazeguard.signal.dataset.FeatureTable` (CSV, NPZ or Parquet).

Recorded datasets are looked for in ``--data-dir``, else ``$GAZEGUARD_DATA``, else ``.``,
``./data`` and ``../shared/data``; :class:`DataNotFoundError` says where it looked and where to
download them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import math
import os
import re
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gazeguard import __version__
from gazeguard.core.errors import DatasetError
from gazeguard.core.samples import GazeSamples
from gazeguard.offline.recordings import GazeRecording, ReadOptions, read_recordings
from gazeguard.offline.recordings import mpiidpeye as mpii
from gazeguard.signal.dataset import FeatureTable

Progress = Callable[[str], None]

#: 34-inch 21:9 monitor (3440 × 1440 panel): width, height in mm.
GAZEGRAPH_SCREEN_MM = (797.0, 333.0)
GAZEGRAPH_DISTANCE_MM = 500.0
#: The trackers' declared rates (the datasets' documentation), Hz.
GAZEGRAPH_RATE_HZ = 30.0
IRF_RATE_HZ = 1000.0
MPIIDPEYE_RATE_HZ = mpii.RATE_HZ


@dataclass(frozen=True)
class PublicDataset:
    """Where a public dataset comes from and on what terms.

    Attributes:
        name: the ``--dataset`` name.
        title: what it is, with its paper.
        url: where to download it.
        download: which file or folder to get from there.
        licence: the licence it is published under (or what upstream says about reuse).
    """

    name: str
    title: str
    url: str
    download: str
    licence: str


#: The public datasets gazeguard reads (``andersson2017`` is for bench/validate_events.py).
PUBLIC_DATASETS: dict[str, PublicDataset] = {
    d.name: d
    for d in (
        PublicDataset(
            "gazegraph",
            "GazeGraph DesktopActivity (Lan et al., GazeGraph, ACM SenSys 2020): 8 people x 6 "
            "desktop activities, Pupil Core 30 Hz",
            "https://github.com/GazeGraphResource/GazeGraph",
            "DesktopActivity.zip (or the repository's zip, as downloaded)",
            "no licence file upstream; its README asks you to cite the SenSys 2020 paper",
        ),
        PublicDataset(
            "irf",
            "IRF lookAtPoint_EL (Zemblys et al., Behavior Research Methods 2018): 6 people, "
            "EyeLink 1000 Hz, hand-labelled events",
            "https://github.com/r-zemblys/irf",
            "etdata/lookAtPoint_EL/ (or the repository's zip, as downloaded)",
            "MIT",
        ),
        PublicDataset(
            "mpiidpeye",
            "MPIIDPEye (Steil et al., Privacy-Aware Eye Tracking Using Differential Privacy, "
            "ETRA 2019; the dataset of Bozkir et al. 2021's tables): 20 people reading a comic, "
            "a newspaper and a textbook in VR, Pupil Labs add-on in an HTC Vive, 30 Hz, "
            "eye-camera coordinates",
            "https://www.perceptualui.org/research/datasets/MPIIDPEye/",
            "the raw eye data, unpacked: a folder of Data_P<n>_R<m>.csv files and "
            "Ground_Truth.csv (e.g. mpiidpeye_vr_reading/)",
            "for non-commercial scientific use only (the authors' terms); cite Steil et al., "
            "ETRA 2019; do not redistribute it",
        ),
        PublicDataset(
            "andersson2017",
            "Andersson et al. 2017, hand-labelled eye movements (SMI 500 Hz); used by "
            "bench/validate_events.py, not by gazeguard eval",
            "https://github.com/richardandersson/EyeMovementDetectorEvaluation",
            "annotated_data/",
            "GPL-3.0",
        ),
    )
}


class DataNotFoundError(DatasetError):
    """A public dataset's files are in none of the places looked at.

    Attributes:
        dataset: the dataset name.
        looked: the folders searched.
    """

    def __init__(self, dataset: str, looked: Sequence[Path]) -> None:
        self.dataset = dataset
        self.looked = list(looked)
        info = PUBLIC_DATASETS[dataset]
        where = ", ".join(str(p) for p in looked) or "nowhere (no data folder exists)"
        super().__init__(
            "data",
            f"recordings for {dataset!r} not found (looked in {where}): download "
            f"{info.download} from {info.url} ({info.licence}) into a folder and pass "
            "--data-dir FOLDER, or set GAZEGUARD_DATA",
        )


@dataclass(frozen=True)
class Recording:
    """One person doing one task.

    Attributes:
        person: person id (the re-identification target).
        task: task id (the utility target).
        recording: unique recording id within the dataset.
        samples: the gaze, degrees and seconds.
        rate_hz: the tracker's declared sampling rate, Hz (the event detector is built for
            it; never measured from the samples).
    """

    person: str
    task: str
    recording: str
    samples: GazeSamples
    rate_hz: float


def _noop(_: str) -> None:
    return None


class Dataset(ABC):
    """A source of recordings with a content fingerprint (the cache key)."""

    name: str = "dataset"

    @abstractmethod
    def recordings(self) -> Iterator[Recording]:
        """Yield every recording, in a fixed order."""

    @abstractmethod
    def fingerprint(self) -> str:
        """A string that changes whenever the recordings would change (content and parameters)."""

    def features(
        self,
        window_s: float = 30.0,
        step_s: float = 0.5,
        cache_dir: Path | None = None,
        progress: Progress = _noop,
    ) -> FeatureTable:
        """Extract (or load cached) sliding-window features of every recording.

        Args:
            window_s: feature window W, s.
            step_s: step between feature vectors, s.
            cache_dir: where cached tables live (None: no cache).
            progress: receives one line per recording extracted.

        Returns:
            A table with one row per window; rows of a recording are consecutive.
        """
        key = hashlib.sha256(
            json.dumps([self.fingerprint(), window_s, step_s, code_version()]).encode()
        ).hexdigest()[:20]
        cached = None if cache_dir is None else Path(cache_dir) / f"{self.name}-{key}.npz"
        if cached is not None and cached.is_file():
            progress(f"{self.name}: features from cache {cached}")
            return FeatureTable.load(cached)
        table = extract_table(self.recordings(), window_s, step_s, progress, self.name)
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_name(f"{cached.stem}.tmp{os.getpid()}.npz")
            table.save(tmp)
            tmp.replace(cached)
            progress(f"{self.name}: features cached in {cached}")
        return table


def code_version() -> str:
    """Hash of the package version and the source of the feature pipeline (cache invalidation)."""
    h = hashlib.sha256(__version__.encode())
    for mod in (
        "gazeguard.signal.events",
        "gazeguard.signal.features",
        "gazeguard.offline.eval.datasets",
    ):
        spec = importlib.util.find_spec(mod)
        if spec is not None and spec.origin and Path(spec.origin).is_file():
            h.update(Path(spec.origin).read_bytes())
    return h.hexdigest()[:16]


def extract_table(
    recordings: Iterator[Recording],
    window_s: float,
    step_s: float,
    progress: Progress = _noop,
    label: str = "dataset",
) -> FeatureTable:
    """Run ``gazeguard.signal.features.extract_features`` on each recording and stack the rows."""
    from gazeguard.signal.features import FEATURES, extract_features  # noqa: PLC0415 - heavy import

    blocks: list[npt.NDArray[np.float64]] = []
    times: list[npt.NDArray[np.float64]] = []
    labels: list[tuple[str, str, str, int]] = []
    for i, rec in enumerate(recordings, start=1):
        s = rec.samples
        pupil = s.pupil_mm if np.isfinite(s.pupil_mm).any() else None
        X, t = extract_features(
            s.timestamps, s.x_deg, s.y_deg, pupil_mm=pupil, window_s=window_s, step_s=step_s,
            rate_hz=rec.rate_hz,
        )  # fmt: skip
        blocks.append(np.asarray(X, np.float64))
        times.append(np.asarray(t, np.float64) - float(s.timestamps[0]))
        labels.append((rec.person, rec.task, rec.recording, int(X.shape[0])))
        progress(f"{label}: features of {rec.recording} ({i}): {X.shape[0]} windows")
    names = tuple(str(f.name) for f in FEATURES)
    units = tuple(str(f.unit) for f in FEATURES)
    if not blocks:
        return FeatureTable(
            np.empty((0, len(names))),
            np.empty(0),
            np.empty(0, str),
            np.empty(0, str),
            np.empty(0, str),
            names,
            units,
        )

    def col(j: int) -> npt.NDArray[np.str_]:
        return np.concatenate([np.full(lab[3], lab[j]) for lab in labels]).astype(str)

    return FeatureTable(
        np.concatenate(blocks), np.concatenate(times), col(0), col(1), col(2), names, units
    )


def _sha256_files(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


# --------------------------------------------------------------------------- GazeGraph
def screen_to_degrees(
    x_norm: npt.ArrayLike, y_norm: npt.ArrayLike, screen_mm: tuple[float, float], distance_mm: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Screen-normalised gaze (0..1, origin bottom-left, y up) → degrees from the screen centre.

    Perspective projection for an eye ``distance_mm`` in front of the screen centre:
    azimuth ``atan(x_mm / D)``, elevation ``atan(y_mm / hypot(x_mm, D))``, with
    ``x_mm = (x − 0.5)·width`` and ``y_mm = (y − 0.5)·height``. Returns (x_deg, y_deg).
    """
    x_mm = (np.asarray(x_norm, np.float64) - 0.5) * screen_mm[0]
    y_mm = (np.asarray(y_norm, np.float64) - 0.5) * screen_mm[1]
    az = np.degrees(np.arctan2(x_mm, distance_mm))
    el = np.degrees(np.arctan2(y_mm, np.hypot(x_mm, distance_mm)))
    return az, el


def fov_to_degrees(
    x_norm: npt.ArrayLike, y_norm: npt.ArrayLike, fov_deg: tuple[float, float]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Normalised image coordinates (0..1, centre 0.5, y up) of a pinhole view → degrees.

    A view of horizontal/vertical field of view ``fov_deg`` maps ``x`` to
    ``atan((x − 0.5) · 2·tan(h/2))`` and ``y`` likewise with ``v``.
    """
    tx = 2.0 * math.tan(math.radians(fov_deg[0]) / 2.0)
    ty = 2.0 * math.tan(math.radians(fov_deg[1]) / 2.0)
    x = np.degrees(np.arctan((np.asarray(x_norm, np.float64) - 0.5) * tx))
    y = np.degrees(np.arctan((np.asarray(y_norm, np.float64) - 0.5) * ty))
    return x, y


def _parse_xy_lines(lines: Iterator[str], where: str) -> npt.NDArray[np.float64]:
    rows: list[tuple[float, float]] = []
    for lineno, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        parts = text.split(",")
        if len(parts) != 2:
            raise DatasetError(
                where, f"expected 2 comma-separated values (x,y), got {text!r}", lineno
            )
        try:
            rows.append((float(parts[0]), float(parts[1])))
        except ValueError as exc:
            raise DatasetError(where, f"not a number in {text!r}", lineno) from exc
    if not rows:
        raise DatasetError(where, "no gaze samples")
    return np.array(rows, dtype=np.float64)


class GazeGraph(Dataset):
    """GazeGraph DesktopActivity (see the module docstring for the geometry).

    ``path`` is ``DesktopActivity.zip`` as downloaded, the repository's zip (which holds it),
    the unpacked ``DesktopActivity`` folder, or a folder holding any of them
    (:func:`locate_gazegraph`).
    """

    name = "gazegraph"
    _MEMBER = re.compile(r"(?:.*/)?(P\d+)/(P\d+)_([A-Za-z]+)\.csv$")

    def __init__(
        self,
        path: Path,
        screen_mm: tuple[float, float] = GAZEGRAPH_SCREEN_MM,
        distance_mm: float = GAZEGRAPH_DISTANCE_MM,
    ) -> None:
        found = locate_gazegraph([Path(path)])
        if found is None:
            raise DatasetError(
                path,
                "GazeGraph's DesktopActivity.zip not found here: download it from "
                f"{PUBLIC_DATASETS['gazegraph'].url} and pass --data-dir",
            )
        self.path = found
        self.screen_mm = screen_mm
        self.distance_mm = distance_mm

    def fingerprint(self) -> str:
        """Content hash plus the screen geometry."""
        files = sorted(self.path.rglob("*.csv")) if self.path.is_dir() else [self.path]
        return f"{_sha256_files(files)}:{self.screen_mm}:{self.distance_mm}"

    def _key(self, name: str) -> tuple[int, str]:
        match = self._MEMBER.match(name)
        assert match is not None
        return int(match.group(1)[1:]), name

    def recordings(self) -> Iterator[Recording]:
        """48 recordings, person P1..P8 × task BROWSE..WRITE, 9000 samples at 30 Hz each."""
        if self.path.is_dir():
            files = sorted(
                (p for p in self.path.rglob("*.csv") if self._MEMBER.match(p.as_posix())),
                key=lambda p: self._key(p.as_posix()),
            )
            if not files:
                raise DatasetError(self.path, "no P<i>/P<i>_<TASK>.csv files in this folder")
            for f in files:
                with f.open(encoding="utf-8") as fh:
                    yield self._recording(f.as_posix(), _parse_xy_lines(fh, str(f)))
            return
        with zipfile.ZipFile(self.path) as outer:
            z = outer
            inner = [m for m in outer.namelist() if m.endswith("DesktopActivity.zip")]
            if not any(self._MEMBER.match(m) for m in outer.namelist()) and inner:
                z = zipfile.ZipFile(io.BytesIO(outer.read(inner[0])))  # the repository's zip
            members = sorted((m for m in z.namelist() if self._MEMBER.match(m)), key=self._key)
            if not members:
                raise DatasetError(
                    self.path,
                    "no P<i>/P<i>_<TASK>.csv members in the zip: is this GazeGraph's "
                    "DesktopActivity.zip?",
                )
            for m in members:
                with z.open(m) as fh:
                    xy = _parse_xy_lines(io.TextIOWrapper(fh, "utf-8"), f"{self.path}!{m}")
                yield self._recording(m, xy)

    def _recording(self, name: str, xy: npt.NDArray[np.float64]) -> Recording:
        match = self._MEMBER.match(name)
        assert match is not None
        person, task = match.group(1), match.group(3).lower()
        t = np.arange(xy.shape[0], dtype=np.float64) / GAZEGRAPH_RATE_HZ
        x, y = screen_to_degrees(xy[:, 0], xy[:, 1], self.screen_mm, self.distance_mm)
        return Recording(
            person, task, f"{person}_{task}", GazeSamples.from_arrays(t, x, y), GAZEGRAPH_RATE_HZ
        )


def locate_gazegraph(roots: Sequence[Path]) -> Path | None:
    """The first GazeGraph source in ``roots``: a zip (``DesktopActivity.zip`` or the
    repository's ``GazeGraph-*.zip``), or an unpacked ``DesktopActivity`` folder; each root may
    be the source itself or hold it (also as ``gazegraph_desktop_activity/`` or a clone
    ``GazeGraph/``)."""
    for root in roots:
        cands = [root]
        for sub in ("", "gazegraph_desktop_activity", "GazeGraph", "GazeGraph-master"):
            base = root / sub if sub else root
            cands += [base / "DesktopActivity.zip", base / "DesktopActivity"]
        cands += sorted(root.glob("GazeGraph-*.zip")) if root.is_dir() else []
        for c in cands:
            if c.is_file() and zipfile.is_zipfile(c):
                with zipfile.ZipFile(c) as z:
                    names = z.namelist()
                if any(
                    GazeGraph._MEMBER.match(n) or n.endswith("DesktopActivity.zip") for n in names
                ):
                    return c
            elif c.is_dir() and any(
                GazeGraph._MEMBER.match(p.as_posix()) for p in c.glob("P*/P*_*.csv")
            ):
                return c
    return None


# --------------------------------------------------------------------------- IRF
class Irf(Dataset):
    """IRF lookAtPoint_EL: six EyeLink 1000 Hz recordings in degrees, one task.

    ``path`` is the ``lookAtPoint_EL`` folder (``etdata/lookAtPoint_EL`` of a clone), the
    repository's zip as downloaded, or a folder holding either (:func:`locate_irf`).
    """

    name = "irf"
    _MEMBER = re.compile(r"(?:.*/)?lookAtPoint_EL_(S\d+)\.npy$")

    def __init__(self, path: Path) -> None:
        found = locate_irf([Path(path)])
        if found is None:
            raise DatasetError(
                path,
                "no lookAtPoint_EL_S*.npy files (nor the IRF repository's zip) here: download "
                f"them from {PUBLIC_DATASETS['irf'].url} and pass --data-dir",
            )
        self.path = found
        if found.is_dir():
            self.files = sorted(found.glob("lookAtPoint_EL_S*.npy"))

    def fingerprint(self) -> str:
        """Hash of the .npy files (or of the zip)."""
        return _sha256_files(self.files if self.path.is_dir() else [self.path])

    def recordings(self) -> Iterator[Recording]:
        """One recording per person S1..S6, task ``lookAtPoint``."""
        if self.path.is_dir():
            for f in self.files:
                yield self._recording(f, f.read_bytes())
            return
        with zipfile.ZipFile(self.path) as z:
            for m in sorted(n for n in z.namelist() if self._MEMBER.match(n)):
                yield self._recording(Path(f"{self.path}!{m}"), z.read(m))

    def _recording(self, where: Path, raw: bytes) -> Recording:
        try:
            a = np.load(io.BytesIO(raw), allow_pickle=False)
            t, x, y, ok = (a[c] for c in ("t", "x", "y", "status"))
        except (ValueError, KeyError, OSError) as exc:
            raise DatasetError(
                where, f"not an IRF structured array (t, x, y, status): {exc}"
            ) from exc
        match = self._MEMBER.match(where.as_posix())
        assert match is not None
        person = match.group(1)
        x = np.where(ok, x, np.nan)
        y = np.where(ok, y, np.nan)
        return Recording(
            person, "lookAtPoint", person, GazeSamples.from_arrays(t.astype(np.float64), x, y),
            IRF_RATE_HZ,
        )  # fmt: skip


def locate_irf(roots: Sequence[Path]) -> Path | None:
    """The first IRF source in ``roots``: a folder of ``lookAtPoint_EL_S*.npy`` (the root, or
    ``irf_lookAtPoint_EL/``, ``lookAtPoint_EL/``, ``irf*/etdata/lookAtPoint_EL/`` below it) or
    the repository's zip (``irf-master.zip``, ``irf-main.zip``, ``irf.zip``)."""
    for root in roots:
        cands = [root, root / "irf_lookAtPoint_EL", root / "lookAtPoint_EL"]
        if root.is_dir():
            cands += sorted(root.glob("irf*/etdata/lookAtPoint_EL"))
            cands += sorted(root.glob("irf*.zip"))
        for c in cands:
            if c.is_dir() and any(c.glob("lookAtPoint_EL_S*.npy")):
                return c
            if c.is_file() and zipfile.is_zipfile(c):
                with zipfile.ZipFile(c) as z:
                    if any(Irf._MEMBER.match(n) for n in z.namelist()):
                        return c
    return None


# --------------------------------------------------------------------------- MPIIDPEye
MPIIDPEYE_FOLDERS = ("mpiidpeye_vr_reading", "MPIIDPEye", "mpiidpeye")
MPIIDPEYE_TARGETS = ("document", "gender")
_MPII_FILE = re.compile(r"^Data_P(\d+)_R(\d+)\.csv$", re.IGNORECASE)
_GROUND_TRUTH = "Ground_Truth.csv"


class MpiiDpEye(Dataset):
    """MPIIDPEye's raw eye data: 60 recordings, person × document, and each person's gender.

    Args:
        path: the folder of ``Data_P<n>_R<m>.csv`` files and ``Ground_Truth.csv``, or a folder
            holding it (:func:`locate_mpiidpeye`).
        target: what the ``task`` column holds: ``document`` (comic, newspaper, textbook) or
            ``gender`` (female, male; from ``Ground_Truth.csv``).
        options: ``min_confidence`` (default 0.6: Pupil's cut) and ``rate_hz`` (default 30 Hz,
            the dataset's rate); the other reading options do not apply.
    """

    name = "mpiidpeye"

    def __init__(
        self, path: Path, target: str = "document", options: ReadOptions | None = None
    ) -> None:
        found = locate_mpiidpeye([Path(path)])
        if found is None:
            raise DatasetError(
                path,
                "no Data_P<n>_R<m>.csv files (MPIIDPEye's raw eye data) here: get them from "
                f"{PUBLIC_DATASETS['mpiidpeye'].url}, unpack them and pass the folder",
            )
        if target not in MPIIDPEYE_TARGETS:
            raise DatasetError(
                "mpiidpeye", f"target {target!r}: use {' or '.join(MPIIDPEYE_TARGETS)}"
            )
        self.path = found
        self.target = target
        opts = options or ReadOptions()
        self.options = ReadOptions(
            format="mpiidpeye", min_confidence=opts.min_confidence, rate_hz=opts.rate_hz
        )
        self.files = sorted((p for p in found.iterdir() if _MPII_FILE.match(p.name)), key=_mpii_key)
        self.genders = read_ground_truth(found / _GROUND_TRUTH)
        missing = sorted({mpii.labels_of(f)[0] or f.name for f in self.files} - set(self.genders))
        if missing:
            raise DatasetError(
                found / _GROUND_TRUTH,
                f"no gender for {', '.join(missing)}: every participant of a Data_P<n>_R<m>.csv "
                "file needs a row 'n,female' or 'n,male'",
            )
        self.name = "mpiidpeye" if target == "document" else f"mpiidpeye-{target}"

    def fingerprint(self) -> str:
        """Hash of the files and the ground truth, the reading options and the geometry (the
        same for every target: the features do not depend on it)."""
        geometry = (mpii.DEG_PER_UNIT, mpii.MM_PER_PX)
        return (
            f"{_sha256_files([*self.files, self.path / _GROUND_TRUTH])}:"
            f"{self.options.min_confidence}:{self.options.rate_hz}:{geometry}"
        )

    def recordings(self) -> Iterator[Recording]:
        """One recording per file, person P1..P20 × document, in person then document order;
        ``task`` is the document type or, with ``target="gender"``, the person's gender."""
        for f in self.files:
            (rec,) = read_recordings(f, self.options)
            assert rec.person is not None
            assert rec.task is not None
            task = rec.task if self.target == "document" else self.genders[rec.person]
            rate = rec.rate_hz or MPIIDPEYE_RATE_HZ
            yield Recording(rec.person, task, f"{rec.person}_{rec.task}", rec.samples, rate)

    def features(
        self,
        window_s: float = 30.0,
        step_s: float = 0.5,
        cache_dir: Path | None = None,
        progress: Progress = _noop,
    ) -> FeatureTable:
        """The document-type table (extracted once, cached), relabelled for other targets."""
        if self.target == "document":
            return super().features(window_s, step_s, cache_dir, progress)
        doc = MpiiDpEye(self.path, "document", self.options)
        table = doc.features(window_s, step_s, cache_dir, progress)
        task = np.array([self.genders[str(p)] for p in table.person.tolist()], dtype=str)
        return replace(table, task=task)


def _mpii_key(p: Path) -> tuple[int, int]:
    m = _MPII_FILE.match(p.name)
    assert m is not None
    return int(m.group(1)), int(m.group(2))


def read_ground_truth(path: Path) -> dict[str, str]:
    """``Ground_Truth.csv`` (``Participant,Gender`` then ``n,female|male``) → ``{"Pn": gender}``.

    Raises:
        DatasetError: a missing file or a malformed line, naming file and line.
    """
    if not path.is_file():
        raise DatasetError(
            path, "MPIIDPEye's Ground_Truth.csv (participant, gender) is missing next to the data"
        )
    out: dict[str, str] = {}
    with path.open(encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, start=1):
            text = line.strip()
            if not text or (lineno == 1 and not text[:1].isdigit()):
                continue  # the header line
            parts = [c.strip() for c in text.replace(";", ",").split(",")]
            if (
                len(parts) != 2
                or not parts[0].isdigit()
                or parts[1].lower()
                not in (
                    "female",
                    "male",
                )
            ):
                raise DatasetError(
                    path, f"expected 'participant,gender' (e.g. 3,male), got {text!r}", lineno
                )
            out[f"P{int(parts[0])}"] = parts[1].lower()
    return out


def locate_mpiidpeye(roots: Sequence[Path]) -> Path | None:
    """The first folder in ``roots`` (or ``mpiidpeye_vr_reading/``, ``MPIIDPEye/`` below one)
    that holds ``Data_P<n>_R<m>.csv`` files."""
    for root in roots:
        for c in [root, *(root / sub for sub in MPIIDPEYE_FOLDERS)]:
            if c.is_dir() and any(_MPII_FILE.match(p.name) for p in c.glob("Data_P*_R*.csv")):
                return c
    return None


# --------------------------------------------------------------------------- synthetic
class Synthetic(Dataset):
    """Simulated people × tasks from ``gazeguard.runtime.simulate.simulate_gaze``.

    Person ``p`` (0-based) is simulated with seed ``seed + p`` in every task, so each simulated
    person keeps the same oculomotor traits across tasks.
    """

    name = "synthetic"

    def __init__(
        self,
        people: int = 8,
        tasks: Sequence[str] | None = None,
        duration_s: float = 300.0,
        rate_hz: float = 60.0,
        seed: int = 1,
    ) -> None:
        if people < 2:
            raise DatasetError("synthetic", f"people={people!r}: need at least 2 people")
        self.people = people
        self.tasks = tuple(tasks) if tasks is not None else _simulator_tasks()
        self.duration_s = duration_s
        self.rate_hz = rate_hz
        self.seed = seed

    def fingerprint(self) -> str:
        """Parameters plus a hash of the simulator's source."""
        spec = importlib.util.find_spec("gazeguard.runtime.simulate")
        src = b""
        if spec is not None and spec.origin and Path(spec.origin).is_file():
            src = Path(spec.origin).read_bytes()
        params = (self.people, self.tasks, self.duration_s, self.rate_hz, self.seed)
        return f"{params}:{hashlib.sha256(src).hexdigest()}"

    def recordings(self) -> Iterator[Recording]:
        """``people × tasks`` recordings of ``duration_s`` at ``rate_hz``."""
        from gazeguard.runtime.simulate import simulate_gaze  # noqa: PLC0415 - heavy import

        for p in range(self.people):
            for task in self.tasks:
                s = simulate_gaze(self.duration_s, self.rate_hz, self.seed + p, task=task)
                person = f"sim{p + 1:02d}"
                yield Recording(person, task, f"{person}_{task}", s, self.rate_hz)


def _simulator_tasks() -> tuple[str, ...]:
    import gazeguard.runtime.simulate as sim  # noqa: PLC0415 - heavy import

    tasks = getattr(sim, "TASKS", None)
    if not tasks:
        raise DatasetError("synthetic", "gazeguard.runtime.simulate exposes no TASKS; pass tasks=")
    return tuple(str(t) for t in tasks)


# --------------------------------------------------------------------------- your recordings
_RECORDING_SUFFIXES = {".csv", ".tsv", ".asc"}
_PUPIL_GAZE = "gaze_positions.csv"


class CsvGaze(Dataset):
    """Your recordings, read by :mod:`gazeguard.offline.recordings` (``csv:PATH``).

    Args:
        path: a recording (gazeguard CSV, Tobii Pro Lab TSV, EyeLink ASC, a Pupil Player export
            folder), or a folder searched recursively for ``*.csv``, ``*.tsv``, ``*.asc`` files
            and Pupil Player exports.
        units: gaze units where a file does not state them (``deg``, ``norm``, ``px``); kept for
            compatibility, same as ``options.units``.
        fov_deg: field of view for normalised gaze; same as ``options.fov_deg``.
        options: everything else about reading (screen geometry, time unit, format, ...).
        labels: where person and task come from when a file does not say: a pattern matched
            against the end of the recording's path (relative to ``path``, without suffix), with
            ``{person}``, ``{task}`` and ``{recording}`` standing for one path component or part
            of one, e.g. ``"{person}/{task}"`` or ``"{person}_{task}"``.
    """

    name = "csv"

    def __init__(
        self,
        path: Path,
        units: str | None = None,
        fov_deg: tuple[float, float] | None = None,
        *,
        options: ReadOptions | None = None,
        labels: str | None = None,
    ) -> None:
        self.path = Path(path)
        opts = options or ReadOptions()
        if units is not None and units != "deg":
            if units not in ("norm", "px"):
                raise DatasetError(self.path, f"units={units!r}: use 'deg', 'norm' or 'px'")
            opts = replace(opts, units=units)  # type: ignore[arg-type]
        if fov_deg is not None:
            opts = replace(opts, fov_deg=fov_deg)
        if opts.units in ("norm", "px") and opts.fov_deg is None and opts.screen_mm is None:
            raise DatasetError(
                self.path,
                f"units {opts.units!r} needs a field of view (--fov H,V degrees) or a screen "
                "(--screen W,H mm and --distance MM) to turn gaze into degrees",
            )
        self.options = opts
        self.labels = labels
        self._pattern = _label_pattern(labels) if labels else None
        if self.path.is_dir():
            self.sources = _find_recordings(self.path)
        elif self.path.is_file():
            self.sources = [self.path]
        else:
            raise DatasetError(self.path, "no such file or directory")
        if not self.sources:
            raise DatasetError(
                self.path,
                "folder holds no recordings (*.csv, *.tsv, *.asc or Pupil Player exports)",
            )
        self.name = f"csv-{self.path.stem}"

    def fingerprint(self) -> str:
        """Hash of the files plus the reading options and the label pattern."""
        files: list[Path] = []
        for u in self.sources:
            files += sorted(u.rglob("*_positions.csv")) if u.is_dir() else [u]
        return f"{_sha256_files(files)}:{self.options}:{self.labels}"

    def recordings(self) -> Iterator[Recording]:
        """One recording per file (or per person/task/recording group of a file)."""
        seen: set[str] = set()
        for unit in self.sources:
            rel = (
                unit.relative_to(self.path).with_suffix("").as_posix()
                if unit != self.path
                else unit.with_suffix("").name
            )
            for rec in read_recordings(unit, self.options):
                person, task = self._labels(rec, rel)
                rid = rec.recording
                if rid in seen:
                    rid = f"{rel}:{rid}"
                seen.add(rid)
                if rec.rate_hz is None:
                    raise DatasetError(
                        rec.source,
                        "declares no sampling rate: give the tracker's nominal rate with "
                        "--rate HZ (the event detector's parameters come from a declared rate, "
                        "never from the measured timestamps)",
                    )
                yield Recording(person, task, rid, rec.samples, rec.rate_hz)

    def _labels(self, rec: GazeRecording, rel: str) -> tuple[str, str]:
        person, task = rec.person, rec.task
        if (person is None or task is None) and self._pattern is not None:
            m = self._pattern.search(rel)
            if m is None:
                raise DatasetError(
                    rec.source,
                    f"its path {rel!r} does not match --labels {self.labels!r}; rename it, or "
                    "change the pattern",
                )
            got = m.groupdict()
            person = person or got.get("person")
            task = task or got.get("task")
        missing = [n for n, v in (("person", person), ("task", task)) if not v]
        if missing:
            raise DatasetError(
                rec.source,
                f"recording {rec.recording!r} has no {' and no '.join(missing)} label: add a "
                f"{missing[0]!r} column (gazeguard CSV), or take labels from file names with "
                "--labels '{person}_{task}' (or '{person}/{task}' for folders)",
            )
        assert person is not None
        assert task is not None
        return person, task


def _find_recordings(root: Path) -> list[Path]:
    """Recording files and Pupil Player recordings below ``root`` (sorted, each once)."""
    pupil: set[Path] = set()
    for g in root.rglob(_PUPIL_GAZE):
        export = g.parent
        pupil.add(export.parent.parent if export.parent.name == "exports" else export)
    out = set(pupil)
    for f in root.rglob("*"):
        if (
            f.is_file()
            and f.suffix.lower() in _RECORDING_SUFFIXES
            and not any(p in pupil for p in f.parents)
        ):
            out.add(f)
    return sorted(out)


def _label_pattern(pattern: str) -> re.Pattern[str]:
    """``"{person}_{task}"`` → a regex matching the end of a relative path."""
    parts = re.split(r"(\{person\}|\{task\}|\{recording\})", pattern)
    fields = [p[1:-1] for p in parts if p in ("{person}", "{task}", "{recording}")]
    if not fields or len(set(fields)) != len(fields):
        raise DatasetError(
            "labels",
            f"--labels {pattern!r}: use each of {{person}}, {{task}} (and {{recording}}) at most "
            "once, e.g. '{person}_{task}' or '{person}/{task}'",
        )
    body = "".join(
        f"(?P<{p[1:-1]}>[^/]+?)" if p in ("{person}", "{task}", "{recording}") else re.escape(p)
        for p in parts
    )
    return re.compile(rf"(?:^|/){body}$")


# --------------------------------------------------------------------------- precomputed table
class TableDataset(Dataset):
    """A precomputed feature table; :meth:`features` returns it as is."""

    name = "table"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.table = FeatureTable.load(self.path)
        self.name = f"table-{self.path.stem}"

    def fingerprint(self) -> str:
        """Hash of the file."""
        return _sha256_files([self.path])

    def recordings(self) -> Iterator[Recording]:
        """A feature table has no raw gaze."""
        raise DatasetError(self.path, "a feature table holds no gaze samples")

    def features(
        self,
        window_s: float = 30.0,
        step_s: float = 0.5,
        cache_dir: Path | None = None,
        progress: Progress = _noop,
    ) -> FeatureTable:
        """The table as loaded (window and step are whatever it was computed with)."""
        progress(f"{self.name}: {self.table.n_rows} precomputed feature rows from {self.path}")
        return self.table


# --------------------------------------------------------------------------- registry
def data_roots(data_dir: Path | None = None) -> list[Path]:
    """Where recorded datasets are looked for: ``data_dir`` if given, else
    ``$GAZEGUARD_DATA`` if set, else those of ``.``, ``./data`` and ``../shared/data`` that
    exist."""
    if data_dir is not None:
        return [Path(data_dir)]
    env = os.environ.get("GAZEGUARD_DATA")
    if env:
        return [Path(env)]
    return [c for c in (Path(), Path("data"), Path("..") / "shared" / "data") if c.is_dir()]


def open_dataset(
    spec: str,
    data_dir: Path | None = None,
    *,
    synthetic_people: int = 8,
    synthetic_duration_s: float = 300.0,
    synthetic_rate_hz: float = 60.0,
    csv_units: str | None = None,
    fov_deg: tuple[float, float] | None = None,
    read_options: ReadOptions | None = None,
    labels: str | None = None,
) -> Dataset:
    """Open a dataset by name: ``gazegraph``, ``irf``, ``mpiidpeye[:PATH]``,
    ``mpiidpeye-gender[:PATH]``, ``synthetic``, ``csv:PATH``, ``table:PATH``.

    ``csv_units``, ``fov_deg``, ``read_options`` and ``labels`` apply to ``csv:PATH`` (see
    :class:`CsvGaze`).

    Raises:
        DataNotFoundError: a public dataset is in none of :func:`data_roots`.
        DatasetError: unknown name, malformed data.
    """
    if spec.startswith("csv:"):
        return CsvGaze(Path(spec[4:]), csv_units, fov_deg, options=read_options, labels=labels)
    if spec.startswith("table:"):
        return TableDataset(Path(spec[6:]))
    if spec == "synthetic":
        return Synthetic(synthetic_people, None, synthetic_duration_s, synthetic_rate_hz)
    mpii_spec = re.match(r"^mpiidpeye(?:-(document|gender))?(?::(.*))?$", spec)
    if mpii_spec is not None:
        target = mpii_spec.group(1) or "document"
        if mpii_spec.group(2) is not None:
            return MpiiDpEye(Path(mpii_spec.group(2)), target, read_options)
        roots = data_roots(data_dir)
        found_mpii = locate_mpiidpeye(roots)
        if found_mpii is None:
            raise DataNotFoundError("mpiidpeye", [r.resolve() for r in roots])
        return MpiiDpEye(found_mpii, target, read_options)
    if spec in ("gazegraph", "irf"):
        roots = data_roots(data_dir)
        found = locate_gazegraph(roots) if spec == "gazegraph" else locate_irf(roots)
        if found is None:
            raise DataNotFoundError(spec, [r.resolve() for r in roots])
        return GazeGraph(found) if spec == "gazegraph" else Irf(found)
    raise DatasetError(
        spec,
        "unknown dataset; use gazegraph, irf, mpiidpeye[:PATH], mpiidpeye-gender[:PATH], "
        "synthetic, csv:PATH or table:PATH",
    )
