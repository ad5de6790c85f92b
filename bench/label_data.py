"""Public activity-labelled gaze for the portable label model: readers, the common activity
mapping, device augmentation and the feature table.

Every recording goes through the real pipeline: raw gaze (degrees, seconds) →
:func:`gazeguard.signal.features.extract_features` at the recording's **declared** rate (30 s
window,
0.5 s step). Augmented copies are re-extracted the same way from perturbed raw gaze, never made
by editing feature vectors.

Sources (nothing here is committed; each is read from where it was fetched, see ``SOURCES``):

``gazegraph``
    GazeGraph DesktopActivity (Lan et al., SenSys 2020): Pupil Core, 30 Hz, desktop 34-inch
    screen, 8 people × 6 activities × 5 min (read through :mod:`gazeguard.offline.eval.datasets`).
``andersson2017``
    Andersson et al. 2017 (Behav. Res. Methods), SMI Hi-Speed 1250 at 500 Hz, 38 × 30 cm
    screen at 67 cm: free viewing of photographs (``images``, ~9 s per trial) and of video
    clips (``videos``, ~29 s per trial). Trials are shorter than the 30 s window, so each
    stimulus type becomes one *pseudo-session*: its trials back to back (one sample interval
    apart), people mixed. Moving-dot trials (smooth pursuit of a target) map onto no activity
    and are left out. Coordinates: pixels → degrees with each file's screen geometry.
``toyreading``
    pymovements' toy dataset (aeye-lab): one reader, EyeLink 1000 at 1000 Hz, 4 texts × 5
    screens, 1280 × 1024 px on 38 × 30.2 cm at 68 cm; the 20 pages back to back.

Common activities (``ACTIVITY``): ``read``, ``browse`` (web browsing, web search and free
viewing of pictures: gaze that explores a static page), ``watch`` (video), ``write``
(typing an essay), ``play`` (video games).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from validate_events import andersson_gaze

from gazeguard.core.samples import GazeSamples
from gazeguard.offline.eval.datasets import Recording, code_version, open_dataset

FloatArray = npt.NDArray[np.float64]

#: The common activities, in the model's class order.
CLASSES: tuple[str, ...] = ("browse", "play", "read", "watch", "write")

#: (dataset, its task) → common activity; tasks not listed are left out.
ACTIVITY: dict[tuple[str, str], str] = {
    ("gazegraph", "read"): "read",
    ("gazegraph", "browse"): "browse",
    ("gazegraph", "search"): "browse",
    ("gazegraph", "watch"): "watch",
    ("gazegraph", "write"): "write",
    ("gazegraph", "play"): "play",
    ("andersson2017", "images"): "browse",
    ("andersson2017", "videos"): "watch",
    ("toyreading", "read"): "read",
}


@dataclass(frozen=True)
class Source:
    """Where a training dataset comes from and on what terms."""

    name: str
    title: str
    url: str
    licence: str
    device: str
    rate_hz: float
    tasks: str
    fetched: str


SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            "gazegraph",
            "GazeGraph DesktopActivity (Lan et al., ACM SenSys 2020)",
            "https://github.com/GazeGraphResource/GazeGraph",
            "no licence file upstream; its README asks to cite the SenSys 2020 paper",
            "Pupil Core (head-mounted), desktop 34-inch screen at ~50 cm",
            30.0,
            "browse, play, read, search, watch, write (5 min each, 8 people)",
            "../shared/data/gazegraph_desktop_activity (DesktopActivity.zip)",
        ),
        Source(
            "andersson2017",
            "Andersson, Larsson, Holmqvist, Stridh, Nyström 2017, 'One algorithm to rule them "
            "all?' (Behav. Res. Methods), hand-labelled eye movements",
            "https://github.com/richardandersson/EyeMovementDetectorEvaluation",
            "GPL-3.0 (the repository's LICENSE)",
            "SMI Hi-Speed 1250 (tower-mounted), 38 x 30 cm screen at 67 cm",
            500.0,
            "images 20 trials (~9 s), videos 19 trials (~29 s); dots left out",
            "annotated_data/originally uploaded data/{images,videos} of the repository "
            "(one coder's file per trial)",
        ),
        Source(
            "toyreading",
            "pymovements toy dataset (aeye-lab): one reader, 4 texts x 5 screens",
            "https://github.com/aeye-lab/pymovements-toy-dataset",
            "no licence file upstream (pymovements itself is MIT)",
            "EyeLink 1000, 1280 x 1024 px on 38 x 30.2 cm at 68 cm",
            1000.0,
            "read (20 pages, ~7 min)",
            "data/trial_*_*.csv of the repository",
        ),
    )
}


# ----------------------------------------------------------------------------- readers
def gazegraph(data_dir: Path | None = None) -> list[Recording]:
    """GazeGraph's 48 recordings (degrees via the dataset's screen geometry), 30 Hz."""
    return list(open_dataset("gazegraph", data_dir=data_dir).recordings())


def andersson2017(root: Path) -> list[Recording]:
    """Two pseudo-sessions (``images``, ``videos``): each stimulus type's trials back to back.

    ``root`` holds ``annotated_data/originally uploaded data/``; of the trials coded by two
    people (``_MN`` and ``_RA`` files hold the same gaze) one file is read.
    """
    base = root / "annotated_data" / "originally uploaded data"
    out = []
    for task in ("images", "videos"):
        files = sorted((base / task).glob("*.mat"))
        seen: dict[str, Path] = {}
        for f in files:
            seen.setdefault(f.stem.rsplit("_labelled_", 1)[0], f)
        xs, ys = [], []
        rate = 0.0
        for _key, f in sorted(seen.items()):
            _, x, y, rate = andersson_gaze(f)
            xs.append(x)
            ys.append(y)
        x, y = np.concatenate(xs), np.concatenate(ys)
        t = np.arange(x.size, dtype=np.float64) / rate
        out.append(
            Recording(
                "andersson-mixed", task, f"andersson_{task}", GazeSamples.from_arrays(t, x, y), rate
            )
        )
    return out


def toyreading(root: Path) -> list[Recording]:
    """The toy dataset's 20 reading pages back to back, degrees from the stated geometry."""
    files = sorted((root / "data").glob("trial_*_*.csv"))
    xs, ys = [], []
    for f in files:
        a = np.genfromtxt(f, delimiter="\t", names=True)
        x_px, y_px = a["x"], a["y"]
        bad = ~np.isfinite(x_px) | ~np.isfinite(y_px) | (x_px <= 0) | (y_px <= 0)
        x = np.degrees(np.arctan((x_px - 640.0) * (380.0 / 1280.0) / 680.0))
        y = np.degrees(np.arctan((y_px - 512.0) * (302.0 / 1024.0) / 680.0))  # origin lower left
        x[bad] = np.nan
        y[bad] = np.nan
        xs.append(x)
        ys.append(y)
    x, y = np.concatenate(xs), np.concatenate(ys)
    t = np.arange(x.size, dtype=np.float64) / 1000.0
    return [Recording("toy-reader", "read", "toy_read", GazeSamples.from_arrays(t, x, y), 1000.0)]


def export_tree(mirror: Path, treeish: str, dest: Path) -> Path:
    """Unpack ``treeish`` (``HEAD:path``-style paths) of a fetched bare mirror into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    rev, _, sub = treeish.partition(":")
    archive = subprocess.run(
        ["git", "--git-dir", str(mirror), "archive", rev, sub],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


# ----------------------------------------------------------------------------- augmentation
@dataclass(frozen=True)
class Device:
    """A simulated tracker: how raw gaze of a session is turned into another device's stream.

    Attributes:
        rate_hz: the declared output rate, Hz (the extractor is built for it).
        gain_x, gain_y: multiplicative scale of the angles (units, field of view, calibration
            gain): reported angle = gain · true angle.
        noise_deg: SD of white Gaussian noise added to each output sample, deg.
        offset_deg: constant calibration offset added to x and y, deg.
    """

    rate_hz: float
    gain_x: float = 1.0
    gain_y: float = 1.0
    noise_deg: float = 0.0
    offset_deg: tuple[float, float] = (0.0, 0.0)

    def key(self) -> str:
        """A short id for tables."""
        return (
            f"{self.rate_hz:g}Hz-g{self.gain_x:.2f}x{self.gain_y:.2f}-n{self.noise_deg:.2f}"
            f"-o{self.offset_deg[0]:.1f},{self.offset_deg[1]:.1f}"
        )


NATIVE = "native"
#: Output rates the augmentation draws from, Hz.
RATES = (30.0, 60.0, 90.0, 120.0, 200.0, 250.0, 500.0, 1000.0)


def noise_ceiling(rate_hz: float) -> float:
    """Largest white-noise SD drawn at ``rate_hz``, deg: 0.5 at 30 Hz, shrinking as 1/√rate
    (head-mounted trackers at 30–120 Hz are noisier than tower trackers at 500–1000 Hz)."""
    return float(0.5 * np.sqrt(30.0 / rate_hz))


def random_device(rng: np.random.Generator, source_rate: float) -> Device:
    """A device drawn for one session: rate from :data:`RATES` (up to 8× the source rate),
    gain log-uniform in [1/4, 4] with ±15 % anisotropy, noise uniform in [0, ceiling(rate)],
    offset uniform ±3°."""
    rates = [r for r in RATES if r <= 8.0 * source_rate]
    rate = float(rng.choice(rates))
    g = float(np.exp(rng.uniform(np.log(0.25), np.log(4.0))))
    aniso = float(np.exp(rng.uniform(-0.15, 0.15)))
    return Device(
        rate,
        g * aniso,
        g / aniso,
        float(rng.uniform(0.0, noise_ceiling(rate))),
        (float(rng.uniform(-3, 3)), float(rng.uniform(-3, 3))),
    )


def _boxcar(v: FloatArray, n: int) -> FloatArray:
    """Moving mean over ``n`` samples (NaN-aware: a mean of the valid ones, NaN if none)."""
    if n <= 1:
        return v
    ok = np.isfinite(v)
    k = np.ones(n) / n
    num = np.convolve(np.where(ok, v, 0.0), k, mode="same")
    den = np.convolve(ok.astype(np.float64), k, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0.5 / n, num / np.maximum(den, 1e-12), np.nan)


def apply_device(rec: Recording, dev: Device, rng: np.random.Generator) -> Recording:
    """Resample ``rec`` to ``dev.rate_hz`` and perturb it (see :class:`Device`).

    Down-sampling first averages over one output interval (a camera integrates over its
    frame), then interpolates linearly; up-sampling interpolates linearly between the source
    samples. A target sample is invalid when the nearest source sample is. Noise is added after
    resampling, at the output rate.
    """
    s = rec.samples
    t0, t1 = float(s.timestamps[0]), float(s.timestamps[-1])
    t = t0 + np.arange(int(np.floor((t1 - t0) * dev.rate_hz)) + 1) / dev.rate_hz
    ratio = rec.rate_hz / dev.rate_hz
    x, y = s.x_deg, s.y_deg
    if ratio > 1.0:
        n = round(ratio)
        x, y = _boxcar(x, n), _boxcar(y, n)
    ok = np.isfinite(x) & np.isfinite(y)
    xi = np.interp(t, s.timestamps[ok], x[ok])
    yi = np.interp(t, s.timestamps[ok], y[ok])
    nearest = np.clip(np.searchsorted(s.timestamps, t), 0, s.timestamps.size - 1)
    bad = ~ok[nearest]
    xi = dev.gain_x * xi + dev.offset_deg[0] + rng.normal(0.0, dev.noise_deg, t.size)
    yi = dev.gain_y * yi + dev.offset_deg[1] + rng.normal(0.0, dev.noise_deg, t.size)
    xi[bad] = np.nan
    yi[bad] = np.nan
    return Recording(
        rec.person, rec.task, rec.recording, GazeSamples.from_arrays(t, xi, yi), dev.rate_hz
    )


# ----------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Table:
    """Feature rows of every (augmented) recording.

    Attributes:
        X: (N, 48) features in :data:`gazeguard.signal.features.FEATURES` order.
        activity: (N,) common activity (:data:`CLASSES`).
        dataset, person, task, recording: (N,) source labels.
        variant: (N,) ``"native"`` or the device key of an augmented copy.
        session: (N,) session id: one person on one device (every activity of that person, or
            of the pseudo-session's dataset, under the same simulated device).
        t: (N,) window end time within its recording, s.
    """

    X: FloatArray
    activity: npt.NDArray[np.str_]
    dataset: npt.NDArray[np.str_]
    person: npt.NDArray[np.str_]
    task: npt.NDArray[np.str_]
    recording: npt.NDArray[np.str_]
    variant: npt.NDArray[np.str_]
    session: npt.NDArray[np.str_]
    t: FloatArray

    def rows(self, mask: npt.NDArray[np.bool_]) -> Table:
        """The rows where ``mask`` holds."""
        return Table(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))

    def save(self, path: Path) -> None:
        """NPZ."""
        np.savez_compressed(path, **{f: getattr(self, f) for f in self.__dataclass_fields__})

    @classmethod
    def load(cls, path: Path) -> Table:
        """From :meth:`save`."""
        with np.load(path) as z:
            return cls(*(z[f] for f in cls.__dataclass_fields__))


def _features(rec: Recording) -> tuple[FloatArray, FloatArray]:
    from gazeguard.signal.features import extract_features  # noqa: PLC0415

    s = rec.samples
    X, t = extract_features(s.timestamps, s.x_deg, s.y_deg, rate_hz=rec.rate_hz)
    return np.asarray(X, np.float64), np.asarray(t, np.float64) - float(s.timestamps[0])


def build_table(
    sources: dict[str, list[Recording]],
    variants: int,
    seed: int,
    cache: Path | None = None,
    log: object = print,
) -> Table:
    """Extract the native rows of every recording and ``variants`` augmented copies per
    session (one :func:`random_device` per person and copy, shared by all of that person's
    activities). Cached under ``cache`` by content (source recording ids and sample hashes,
    variants, seed, feature code)."""
    h = hashlib.sha256(json.dumps([variants, seed, code_version()]).encode())
    h.update(Path(__file__).read_bytes())  # the readers and the augmentation
    for name in sorted(sources):
        for r in sources[name]:
            h.update(f"{name}/{r.recording}/{r.rate_hz}".encode())
            h.update(np.ascontiguousarray(r.samples.x_deg).tobytes()[:4096])
            h.update(str(r.samples.timestamps.size).encode())
    path = None if cache is None else cache / f"label-table-{h.hexdigest()[:16]}.npz"
    if path is not None and path.is_file():
        log(f"features from cache {path}")  # type: ignore[operator]
        return Table.load(path)
    rng = np.random.default_rng(seed)
    cols: dict[str, list[npt.NDArray[np.generic]]] = {f: [] for f in Table.__dataclass_fields__}

    def add(name: str, rec: Recording, variant: str, session: str) -> None:
        act = ACTIVITY.get((name, rec.task))
        if act is None:
            return
        X, t = _features(rec)
        n = X.shape[0]
        for f, v in (
            ("activity", act), ("dataset", name), ("person", rec.person), ("task", rec.task),
            ("recording", rec.recording), ("variant", variant), ("session", session),
        ):  # fmt: skip
            cols[f].append(np.full(n, v))
        cols["X"].append(X)
        cols["t"].append(t)

    for name in sorted(sources):
        recs = sources[name]
        people = sorted({r.person for r in recs})
        for who in people:
            mine = [r for r in recs if r.person == who]
            for r in mine:
                add(name, r, NATIVE, f"{name}/{who}/{NATIVE}")
            for k in range(variants):
                dev = random_device(rng, mine[0].rate_hz)
                for r in mine:
                    add(name, apply_device(r, dev, rng), dev.key(), f"{name}/{who}/v{k}")
            log(f"{name}/{who}: {len(mine)} recordings, {variants} devices")  # type: ignore[operator]
    table = Table(
        np.concatenate(cols["X"]),
        *(np.concatenate(cols[f]).astype(str) for f in list(Table.__dataclass_fields__)[1:-1]),
        np.concatenate(cols["t"]),
    )
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        table.save(path)
    return table


def iter_sessions(session: Sequence[str] | npt.NDArray[np.str_]) -> Iterator[npt.NDArray[np.intp]]:
    """Row indices of each session, in first-appearance order."""
    s = np.asarray(session)
    _, first = np.unique(s, return_index=True)
    for sid in s[np.sort(first)]:
        yield np.flatnonzero(s == sid)
