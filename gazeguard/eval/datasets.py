"""Datasets for the evaluation: recorded or simulated gaze, one interface, cached features.

A :class:`Dataset` yields :class:`Recording` s — one person doing one task, as a
:class:`~gazeguard.samples.GazeSamples` block in degrees — and :meth:`Dataset.features` turns them
into a :class:`~gazeguard.dataset.FeatureTable` with the same ``extract_features`` the live
service runs. Extraction is the slow part, so tables are cached as NPZ under a cache directory,
keyed by the dataset's content fingerprint, the window and step, and a hash of the feature code.

Built in (``open_dataset(spec)``):

``gazegraph``
    GazeGraph DesktopActivity (Lan et al., SenSys 2020): 8 people × 6 desktop activities × 5 min,
    Pupil Core at 30 Hz, read straight from ``DesktopActivity.zip``. Gaze is normalised to the
    screen (0..1, origin bottom-left, y up); the upstream README gives a 34-inch screen at about
    50 cm. We assume the common 21:9 panel (797 × 333 mm) and convert by perspective projection
    from the screen centre: azimuth ``atan(x_mm / D)``, elevation ``atan(y_mm / hypot(x_mm, D))``.
    The screen thus spans ±38.6° × ±18.4°. If the coordinates were in fact scene-camera
    coordinates (Pupil Core wide lens, about 99° × 53° at 720p) all angles would be ~25 % larger;
    ``screen_mm``/``distance_mm`` make the assumption explicit and changeable. No pupil size.
``irf``
    IRF lookAtPoint_EL (Zemblys et al. 2018): 6 people, EyeLink 1000 Hz, 81 s, degrees; one task
    (so task recognition is not defined; re-identification is). ``status == False`` → invalid.
``synthetic``
    ``gazeguard.simulate.simulate_gaze`` for ``people`` simulated people × tasks.
``csv:PATH``
    Any recorded dataset as CSV (a file or a directory of ``*.csv``): a header line, then one
    sample per line with columns ``t`` (s), ``x``, ``y`` (degrees, or normalised 0..1 with
    ``units="norm"`` and a field of view), optional ``pupil`` (mm), ``person``, ``task`` and
    optional ``recording``. ``#`` lines are comments; empty or ``nan`` gaze marks an invalid
    sample. A malformed line raises :class:`~gazeguard.errors.DatasetError` naming file and line.
``table:PATH``
    A precomputed :class:`~gazeguard.dataset.FeatureTable` (CSV, NPZ or Parquet).
"""

from __future__ import annotations

import csv
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gazeguard import __version__
from gazeguard.dataset import FeatureTable
from gazeguard.errors import DatasetError
from gazeguard.samples import GazeSamples

Progress = Callable[[str], None]

#: 34-inch 21:9 monitor (3440 × 1440 panel): width, height in mm.
GAZEGRAPH_SCREEN_MM = (797.0, 333.0)
GAZEGRAPH_DISTANCE_MM = 500.0
GAZEGRAPH_RATE_HZ = 30.0


@dataclass(frozen=True)
class Recording:
    """One person doing one task.

    Attributes:
        person: person id (the re-identification target).
        task: task id (the utility target).
        recording: unique recording id within the dataset.
        samples: the gaze, degrees and seconds.
    """

    person: str
    task: str
    recording: str
    samples: GazeSamples


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
    for mod in ("gazeguard.events", "gazeguard.features", "gazeguard.eval.datasets"):
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
    """Run ``gazeguard.features.extract_features`` on each recording and stack the rows."""
    from gazeguard.features import FEATURES, extract_features  # noqa: PLC0415 - heavy import

    blocks: list[npt.NDArray[np.float64]] = []
    times: list[npt.NDArray[np.float64]] = []
    labels: list[tuple[str, str, str, int]] = []
    for i, rec in enumerate(recordings, start=1):
        s = rec.samples
        pupil = s.pupil_mm if np.isfinite(s.pupil_mm).any() else None
        X, t = extract_features(
            s.timestamps, s.x_deg, s.y_deg, pupil_mm=pupil, window_s=window_s, step_s=step_s
        )
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
    """GazeGraph DesktopActivity, read from its zip (see the module docstring for the geometry)."""

    name = "gazegraph"
    _MEMBER = re.compile(r"(?:.*/)?(P\d+)/(P\d+)_([A-Za-z]+)\.csv$")

    def __init__(
        self,
        path: Path,
        screen_mm: tuple[float, float] = GAZEGRAPH_SCREEN_MM,
        distance_mm: float = GAZEGRAPH_DISTANCE_MM,
    ) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            self.path = self.path / "DesktopActivity.zip"
        if not self.path.is_file():
            raise DatasetError(self.path, "GazeGraph zip not found; pass --data-dir")
        self.screen_mm = screen_mm
        self.distance_mm = distance_mm

    def fingerprint(self) -> str:
        """Zip content hash plus the screen geometry."""
        return f"{_sha256_files([self.path])}:{self.screen_mm}:{self.distance_mm}"

    def recordings(self) -> Iterator[Recording]:
        """48 recordings, person P1..P8 × task BROWSE..WRITE, 9000 samples at 30 Hz each."""
        with zipfile.ZipFile(self.path) as z:
            members = sorted(
                (m for m in z.namelist() if self._MEMBER.match(m)),
                key=lambda m: (int(self._MEMBER.match(m).group(1)[1:]), m),  # type: ignore[union-attr]
            )
            if not members:
                raise DatasetError(self.path, "no P<i>/P<i>_<TASK>.csv members in the zip")
            for m in members:
                match = self._MEMBER.match(m)
                assert match is not None
                person, task = match.group(1), match.group(3).lower()
                with z.open(m) as fh:
                    xy = _parse_xy_lines(io.TextIOWrapper(fh, "utf-8"), f"{self.path}!{m}")
                t = np.arange(xy.shape[0], dtype=np.float64) / GAZEGRAPH_RATE_HZ
                x, y = screen_to_degrees(xy[:, 0], xy[:, 1], self.screen_mm, self.distance_mm)
                yield Recording(person, task, f"{person}_{task}", GazeSamples.from_arrays(t, x, y))


# --------------------------------------------------------------------------- IRF
class Irf(Dataset):
    """IRF lookAtPoint_EL: six EyeLink 1000 Hz recordings in degrees, one task."""

    name = "irf"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.files = sorted(self.path.glob("lookAtPoint_EL_S*.npy"))
        if not self.files:
            raise DatasetError(self.path, "no lookAtPoint_EL_S*.npy files; pass --data-dir")

    def fingerprint(self) -> str:
        """Hash of the .npy files."""
        return _sha256_files(self.files)

    def recordings(self) -> Iterator[Recording]:
        """One recording per person S1..S6, task ``lookAtPoint``."""
        for f in self.files:
            try:
                a = np.load(f, allow_pickle=False)
                t, x, y, ok = (a[c] for c in ("t", "x", "y", "status"))
            except (ValueError, KeyError, OSError) as exc:
                raise DatasetError(
                    f, f"not an IRF structured array (t, x, y, status): {exc}"
                ) from exc
            x = np.where(ok, x, np.nan)
            y = np.where(ok, y, np.nan)
            person = f.stem.rsplit("_", 1)[-1]
            yield Recording(
                person, "lookAtPoint", person, GazeSamples.from_arrays(t.astype(np.float64), x, y)
            )


# --------------------------------------------------------------------------- synthetic
class Synthetic(Dataset):
    """Simulated people × tasks from ``gazeguard.simulate.simulate_gaze``.

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
        spec = importlib.util.find_spec("gazeguard.simulate")
        src = b""
        if spec is not None and spec.origin and Path(spec.origin).is_file():
            src = Path(spec.origin).read_bytes()
        params = (self.people, self.tasks, self.duration_s, self.rate_hz, self.seed)
        return f"{params}:{hashlib.sha256(src).hexdigest()}"

    def recordings(self) -> Iterator[Recording]:
        """``people × tasks`` recordings of ``duration_s`` at ``rate_hz``."""
        from gazeguard.simulate import simulate_gaze  # noqa: PLC0415 - heavy import

        for p in range(self.people):
            for task in self.tasks:
                s = simulate_gaze(self.duration_s, self.rate_hz, self.seed + p, task=task)
                person = f"sim{p + 1:02d}"
                yield Recording(person, task, f"{person}_{task}", s)


def _simulator_tasks() -> tuple[str, ...]:
    import gazeguard.simulate as sim  # noqa: PLC0415 - heavy import

    tasks = getattr(sim, "TASKS", None)
    if not tasks:
        raise DatasetError("synthetic", "gazeguard.simulate exposes no TASKS; pass tasks=")
    return tuple(str(t) for t in tasks)


# --------------------------------------------------------------------------- generic CSV
_ALIASES: dict[str, tuple[str, ...]] = {
    "t": ("t", "time", "timestamp", "timestamp_s", "time_s"),
    "x": ("x", "x_deg", "gaze_x"),
    "y": ("y", "y_deg", "gaze_y"),
    "pupil": ("pupil", "pupil_mm", "pupil_diameter"),
    "person": ("person", "participant", "subject"),
    "task": ("task", "activity", "stimulus"),
    "recording": ("recording", "trial", "session"),
}


class CsvGaze(Dataset):
    """Recorded gaze in CSV files; see the module docstring for the layout.

    Args:
        path: a CSV file, or a directory whose ``*.csv`` files are all read.
        units: ``"deg"`` (degrees of visual angle) or ``"norm"`` (0..1 with centre 0.5, y up).
        fov_deg: horizontal, vertical field of view for ``units="norm"``, degrees.
    """

    name = "csv"

    def __init__(
        self, path: Path, units: str = "deg", fov_deg: tuple[float, float] | None = None
    ) -> None:
        self.path = Path(path)
        if units not in ("deg", "norm"):
            raise DatasetError(self.path, f"units={units!r}: use 'deg' or 'norm'")
        if units == "norm" and fov_deg is None:
            raise DatasetError(self.path, "units='norm' needs a field of view (--fov H,V degrees)")
        self.units = units
        self.fov_deg = fov_deg
        if self.path.is_dir():
            self.files = sorted(self.path.glob("*.csv"))
        elif self.path.is_file():
            self.files = [self.path]
        else:
            raise DatasetError(self.path, "no such file or directory")
        if not self.files:
            raise DatasetError(self.path, "directory holds no *.csv files")
        self.name = f"csv-{self.path.stem}"

    def fingerprint(self) -> str:
        """Hash of the files plus units and field of view."""
        return f"{_sha256_files(self.files)}:{self.units}:{self.fov_deg}"

    def recordings(self) -> Iterator[Recording]:
        """One recording per (person, task, recording) group, in order of first appearance."""
        for f in self.files:
            yield from self._read(f)

    def _read(self, path: Path) -> Iterator[Recording]:
        groups: dict[tuple[str, str, str], list[list[float]]] = {}
        last_t: dict[tuple[str, str, str], float] = {}
        col: dict[str, int] = {}
        with path.open(newline="") as fh:
            for lineno, row in enumerate(csv.reader(fh), start=1):
                if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                    continue
                if not col:
                    col = self._header(path, [c.strip().lower() for c in row], lineno)
                    ncols = len(row)
                    continue
                if len(row) != ncols:
                    raise DatasetError(path, f"expected {ncols} fields, found {len(row)}", lineno)
                key = (
                    row[col["person"]].strip(),
                    row[col["task"]].strip(),
                    row[col["recording"]].strip() if "recording" in col else "",
                )
                if not key[0] or not key[1]:
                    raise DatasetError(path, "empty person or task label", lineno)
                t = _number(row[col["t"]], path, lineno, "t", allow_missing=False)
                if key in last_t and not t > last_t[key]:
                    raise DatasetError(
                        path, f"timestamp {t!r} is not after the previous {last_t[key]!r}", lineno
                    )
                last_t[key] = t
                vals = [
                    t,
                    _number(row[col["x"]], path, lineno, "x"),
                    _number(row[col["y"]], path, lineno, "y"),
                    _number(row[col["pupil"]], path, lineno, "pupil")
                    if "pupil" in col
                    else math.nan,
                ]
                groups.setdefault(key, []).append(vals)
        if not col:
            raise DatasetError(path, "no header line")
        if not groups:
            raise DatasetError(path, "no data rows")
        for (person, task, rec), rows in groups.items():
            a = np.array(rows, dtype=np.float64)
            x, y = a[:, 1], a[:, 2]
            if self.units == "norm":
                assert self.fov_deg is not None
                x, y = fov_to_degrees(x, y, self.fov_deg)
            rid = rec or f"{person}_{task}"
            yield Recording(person, task, rid, GazeSamples.from_arrays(a[:, 0], x, y, a[:, 3]))

    @staticmethod
    def _header(path: Path, header: list[str], lineno: int) -> dict[str, int]:
        col: dict[str, int] = {}
        for key, names in _ALIASES.items():
            for i, h in enumerate(header):
                if h in names:
                    col[key] = i
                    break
        missing = [k for k in ("t", "x", "y", "person", "task") if k not in col]
        if missing:
            raise DatasetError(
                path,
                f"header {','.join(header)!r} lacks column(s) {', '.join(missing)}; need t,x,y,"
                "person,task (optional pupil, recording)",
                lineno,
            )
        return col


def _number(text: str, path: Path, lineno: int, name: str, allow_missing: bool = True) -> float:
    s = text.strip()
    if allow_missing and s.lower() in ("", "nan", "na"):
        return math.nan
    try:
        v = float(s)
    except ValueError as exc:
        raise DatasetError(path, f"column {name!r}: {text!r} is not a number", lineno) from exc
    if not allow_missing and not math.isfinite(v):
        raise DatasetError(path, f"column {name!r}: {text!r} must be a finite number", lineno)
    return v


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
def default_data_dir() -> Path | None:
    """``$GAZEGUARD_DATA``, else the first of ``./data``, ``../shared/data`` that exists."""
    env = os.environ.get("GAZEGUARD_DATA")
    if env:
        return Path(env)
    for cand in (Path("data"), Path("..") / "shared" / "data"):
        if cand.is_dir():
            return cand.resolve()
    return None


def open_dataset(
    spec: str,
    data_dir: Path | None = None,
    *,
    synthetic_people: int = 8,
    synthetic_duration_s: float = 300.0,
    synthetic_rate_hz: float = 60.0,
    csv_units: str = "deg",
    fov_deg: tuple[float, float] | None = None,
) -> Dataset:
    """Open a dataset by name: ``gazegraph``, ``irf``, ``synthetic``, ``csv:PATH``, ``table:PATH``.

    Raises:
        DatasetError: unknown name, or recorded data not found (naming where it looked).
    """
    if spec.startswith("csv:"):
        return CsvGaze(Path(spec[4:]), csv_units, fov_deg)
    if spec.startswith("table:"):
        return TableDataset(Path(spec[6:]))
    if spec == "synthetic":
        return Synthetic(synthetic_people, None, synthetic_duration_s, synthetic_rate_hz)
    if spec in ("gazegraph", "irf"):
        root = data_dir or default_data_dir()
        if root is None:
            raise DatasetError(
                "data", f"recordings for {spec!r} not found: set GAZEGUARD_DATA or pass --data-dir"
            )
        if spec == "gazegraph":
            return GazeGraph(Path(root) / "gazegraph_desktop_activity")
        return Irf(Path(root) / "irf_lookAtPoint_EL")
    raise DatasetError(
        spec, "unknown dataset; use gazegraph, irf, synthetic, csv:PATH or table:PATH"
    )
