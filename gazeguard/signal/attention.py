"""Attention: where a session looked during a cohort bucket, as a bounded contribution.

A fleet worker's cohort release (:mod:`gazeguard.runtime.cohort`) can carry, per bucket, the
cohort's
**dwell-time distribution** over a public grid of the gaze field (a heatmap) and over named
areas of interest (AOIs) that the app supplies in a public file. This module holds the public
geometry and turns one session's gaze samples into its contribution blocks; the noise, the
budget and the ledger stay with the cohort release.

**Dwell from valid samples, time-weighted at the declared rate.** Every valid sample of the
bucket (``GazeSamples.valid``) counts ``1/rate_hz`` seconds at its gaze position; invalid
samples (blinks, tracking loss) count nowhere. Not from fixations, because (1) a sample's
position is the measurement itself, while fixation centroids depend on the detector's threshold
and minimum duration (which differ by device rate), (2) a sample falls in exactly one bucket,
whereas a fixation can straddle a bucket's edge, and (3) the per-bucket distribution then
depends only on that bucket's samples, well inside the reach the release plan counts. The cost:
saccade samples (~10 % of the time) smear a little dwell along saccade paths, which a 3° cell
hardly sees. The weights are the declared rate's, never the timestamps' intervals, and as every
sample of a session weighs the same, the normalized distribution is the share of its valid
samples per cell.

**Grid** (:class:`AttentionGrid`). ``rows × cols`` cells (default 9 × 16) covering a field of
``width × height`` degrees of gaze angle centred on straight ahead (default 48° × 27°: a 16:9
screen seen at about 60 cm, 3° cells). Gaze angles follow :class:`~gazeguard.core.samples.
GazeSamples`: ``x`` positive right, ``y`` positive up. Row 0 is the **top** row (as an image is
drawn), column 0 the **left** one; a cell holds ``left ≤ x < right`` and ``bottom < y ≤ top``.
Samples outside the field count in no cell: the heatmap is the distribution of the gaze that
fell on the field.

**AOIs** (:class:`AoiSet`, :func:`load_aois`). Named rectangles or polygons in the same frame
(degrees of gaze angle), from a JSON file the app supplies (public: it describes the scene, not
the person)::

    {"frame": "gaze-deg",
     "aois": [
       {"name": "video",  "rect": [-20.0, -5.0, 4.0, 11.0]},
       {"name": "cta",    "polygon": [[8, -10], [20, -10], [20, -4], [8, -4]]}
     ]}

``rect`` is ``[x_min, y_min, x_max, y_max]`` (deg, ``x_min < x_max``, ``y_min < y_max``);
``polygon`` at least three ``[x, y]`` vertices (deg; even-odd rule, no need to close it);
``frame`` is optional and must be ``"gaze-deg"`` when given. Names are unique, non-empty, at
most 64 characters. AOIs may overlap: a sample counts in the **first** AOI (in file order) that
contains it, so the AOI dwell is a partition; samples in none count as ``elsewhere``. At most
:data:`MAX_AOIS` AOIs.

**Contribution blocks.** A session's grid block is its valid in-field sample counts divided by
their total (all zeros when none fell on the field: no gaze, no attention); its AOI block the
counts of each AOI and of ``elsewhere`` divided by all its valid samples. Each is a probability
vector (or zero), so its L2 norm is at most its L1 norm, 1, whatever the gaze
(``tests/signal/test_attention.py`` checks it with Hypothesis over arbitrary, NaN-ridden gaze); a
block's total over the sessions is the number of sessions that contributed to it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError

__all__ = [
    "DEFAULT_FOV_DEG",
    "DEFAULT_GRID",
    "MAX_AOIS",
    "Aoi",
    "AoiSet",
    "AttentionGrid",
    "AttentionLayout",
    "load_aois",
    "parse_aois",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Default grid, (rows, cols).
DEFAULT_GRID = (9, 16)
#: Default field the grid covers, (width, height), degrees of gaze angle.
DEFAULT_FOV_DEG = (48.0, 27.0)
#: Most AOIs a file may name; most vertices of one polygon.
MAX_AOIS = 64
MAX_VERTICES = 256
#: Largest grid (cells).
MAX_CELLS = 4096
#: Largest absolute coordinate accepted, deg (gaze angles; anything past it is a unit mistake).
MAX_DEG = 360.0
#: Contributions are shrunk by this factor so that float rounding cannot push a block's L2
#: norm past 1 (as in :mod:`gazeguard.runtime.cohort`).
_SHRINK = 1.0 - 2.0**-40
_FIELD = "cohort.attention_aois"


@dataclass(frozen=True, slots=True)
class AttentionGrid:
    """The public heatmap grid: ``rows × cols`` cells over a ``width × height`` field, deg.

    Attributes:
        rows, cols: cells per column and per row (each ≥ 1, ``rows·cols ≤`` :data:`MAX_CELLS`).
        width_deg, height_deg: the field's extent, degrees of gaze angle (> 0), centred on
            straight ahead (x = y = 0).
    """

    rows: int = DEFAULT_GRID[0]
    cols: int = DEFAULT_GRID[1]
    width_deg: float = DEFAULT_FOV_DEG[0]
    height_deg: float = DEFAULT_FOV_DEG[1]

    def __post_init__(self) -> None:
        if not (self.rows >= 1 and self.cols >= 1 and self.rows * self.cols <= MAX_CELLS):
            raise ConfigError(
                "cohort.attention_grid", [self.rows, self.cols],
                f"needs rows >= 1 and cols >= 1 with rows × cols <= {MAX_CELLS}",
            )  # fmt: skip
        for name, v in (("width", self.width_deg), ("height", self.height_deg)):
            if not (math.isfinite(v) and 0 < v <= MAX_DEG):
                raise ConfigError(
                    "cohort.attention_fov_deg", [self.width_deg, self.height_deg],
                    f"the field's {name} must be in (0, {MAX_DEG:g}] degrees",
                )  # fmt: skip

    @property
    def cells(self) -> int:
        """``rows · cols``."""
        return self.rows * self.cols

    def cell_of(self, x_deg: npt.ArrayLike, y_deg: npt.ArrayLike) -> IntArray:
        """(N,) the cell ``row·cols + col`` of each gaze point (deg), ``-1`` off the field or
        not finite."""
        x = np.asarray(x_deg, dtype=np.float64).reshape(-1)
        y = np.asarray(y_deg, dtype=np.float64).reshape(-1)
        left, top = -self.width_deg / 2, self.height_deg / 2
        with np.errstate(invalid="ignore", over="ignore"):
            col = np.floor((x - left) / (self.width_deg / self.cols))
            row = np.floor((top - y) / (self.height_deg / self.rows))
            ok = (col >= 0) & (col < self.cols) & (row >= 0) & (row < self.rows)
        out = np.full(x.shape, -1, dtype=np.int64)
        out[ok] = (row[ok] * self.cols + col[ok]).astype(np.int64)
        return out


@dataclass(frozen=True, slots=True)
class Aoi:
    """One area of interest: a polygon in degrees of gaze angle (a rectangle is one too).

    Attributes:
        name: unique within its set.
        vertices: (V, 2) ``[x, y]`` deg, V ≥ 3, in order (either orientation).
    """

    name: str
    vertices: tuple[tuple[float, float], ...]

    def contains(self, x: FloatArray, y: FloatArray) -> npt.NDArray[np.bool_]:
        """(N,) whether each point lies inside (even-odd rule; NaN: never)."""
        inside = np.zeros(x.shape, dtype=bool)
        v = self.vertices
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            for (x1, y1), (x2, y2) in zip(v, (*v[1:], v[0]), strict=True):
                if y1 == y2:
                    continue  # a horizontal edge never crosses a horizontal ray
                crosses = (y1 > y) != (y2 > y)
                x_at = x1 + (y - y1) * (x2 - x1) / (y2 - y1)
                inside ^= crosses & (x < x_at)
        return inside


@dataclass(frozen=True, slots=True)
class AoiSet:
    """The AOIs of a scene, in priority order (a sample counts in the first that holds it).

    Attributes:
        aois: the areas (1 ≤ A ≤ :data:`MAX_AOIS`).
        source: where they were read from (for messages and errors).
    """

    aois: tuple[Aoi, ...]
    source: str = "<aois>"

    @property
    def names(self) -> tuple[str, ...]:
        """The AOI names, in order."""
        return tuple(a.name for a in self.aois)

    def assign(self, x_deg: npt.ArrayLike, y_deg: npt.ArrayLike) -> IntArray:
        """(N,) the index of the first AOI holding each point, ``A`` (elsewhere) for none,
        ``-1`` for a point that is not finite."""
        x = np.asarray(x_deg, dtype=np.float64).reshape(-1)
        y = np.asarray(y_deg, dtype=np.float64).reshape(-1)
        out = np.full(x.shape, len(self.aois), dtype=np.int64)
        out[~(np.isfinite(x) & np.isfinite(y))] = -1
        todo = out == len(self.aois)
        for i, aoi in enumerate(self.aois):
            if not todo.any():
                break
            hit = todo & aoi.contains(x, y)
            out[hit] = i
            todo &= ~hit
        return out


def _problem(source: str, reason: str, where: str = "") -> ConfigError:
    at = f" ({where})" if where else ""
    return ConfigError(_FIELD, source, f"AOI file {source}{at}: {reason}")


def _point(value: object, source: str, where: str) -> tuple[float, float]:
    if not (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(c, int | float) and not isinstance(c, bool) for c in value)
    ):
        raise _problem(source, f"a vertex must be [x, y] (two numbers, deg), got {value!r}", where)
    x, y = float(value[0]), float(value[1])
    if not (math.isfinite(x) and math.isfinite(y) and abs(x) <= MAX_DEG and abs(y) <= MAX_DEG):
        raise _problem(
            source, f"vertex {value!r} must be finite degrees within ±{MAX_DEG:g}", where
        )
    return x, y


def _aoi(entry: object, i: int, source: str) -> Aoi:
    where = f"aois[{i}]"
    if not isinstance(entry, Mapping):
        raise _problem(source, f"each AOI must be an object, got {type(entry).__name__}", where)
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 64:
        raise _problem(source, "'name' must be a non-empty string of at most 64 characters", where)
    where = f"aois[{i}] {name!r}"
    unknown = sorted(set(entry) - {"name", "rect", "polygon"})
    if unknown:
        raise _problem(source, f"unknown key(s) {', '.join(map(repr, unknown))}", where)
    shapes = [k for k in ("rect", "polygon") if k in entry]
    if len(shapes) != 1:
        raise _problem(source, "give exactly one of 'rect' or 'polygon'", where)
    if shapes[0] == "rect":
        rect = entry["rect"]
        if not (isinstance(rect, list | tuple) and len(rect) == 4):
            raise _problem(source, "'rect' must be [x_min, y_min, x_max, y_max] (deg)", where)
        (x0, y0), (x1, y1) = _point(rect[:2], source, where), _point(rect[2:], source, where)
        if not (x0 < x1 and y0 < y1):
            raise _problem(
                source, f"'rect' {list(rect)} needs x_min < x_max and y_min < y_max", where
            )
        return Aoi(name, ((x0, y0), (x1, y0), (x1, y1), (x0, y1)))
    poly = entry["polygon"]
    if not isinstance(poly, list | tuple) or not 3 <= len(poly) <= MAX_VERTICES:
        raise _problem(
            source, f"'polygon' must list 3 to {MAX_VERTICES} [x, y] vertices (deg)", where
        )
    vertices = tuple(_point(p, source, f"{where} vertex {k}") for k, p in enumerate(poly))
    area2 = sum(
        xa * yb - xb * ya
        for (xa, ya), (xb, yb) in zip(vertices, (*vertices[1:], vertices[0]), strict=True)
    )
    if area2 == 0:
        raise _problem(source, "'polygon' encloses no area (its vertices are collinear)", where)
    return Aoi(name, vertices)


def parse_aois(doc: object, source: str = "<aois>") -> AoiSet:
    """The AOIs of a parsed AOI document (the module docstring's format).

    Raises:
        ConfigError: on ``cohort.attention_aois``, naming the file, the AOI (index and name)
            and what is wrong with it.
    """
    if not isinstance(doc, Mapping):
        raise _problem(source, 'must be a JSON object {"aois": [...]}')
    unknown = sorted(set(doc) - {"frame", "aois"})
    if unknown:
        raise _problem(source, f"unknown key(s) {', '.join(map(repr, unknown))}")
    if doc.get("frame", "gaze-deg") != "gaze-deg":
        raise _problem(
            source, f"frame {doc.get('frame')!r} is not supported: coordinates are degrees of "
            "gaze angle ('gaze-deg')",
        )  # fmt: skip
    entries = doc.get("aois")
    if not isinstance(entries, list) or not entries:
        raise _problem(source, "'aois' must be a non-empty list")
    if len(entries) > MAX_AOIS:
        raise _problem(source, f"{len(entries)} AOIs; at most {MAX_AOIS}")
    aois = [_aoi(e, i, source) for i, e in enumerate(entries)]
    seen: set[str] = set()
    for i, a in enumerate(aois):
        if a.name in seen or a.name == "elsewhere":
            why = "is reserved" if a.name == "elsewhere" else "appears twice"
            raise _problem(source, f"the name {a.name!r} {why}", f"aois[{i}]")
        seen.add(a.name)
    return AoiSet(tuple(aois), source)


def load_aois(path: str | Path) -> AoiSet:
    """Read an AOI file (JSON, the module docstring's format).

    Raises:
        ConfigError: on ``cohort.attention_aois``: the file is missing or unreadable, not JSON
            (with its line and column), or not a valid AOI document (:func:`parse_aois`).
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _problem(source, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _problem(source, f"cannot be read: {exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _problem(
            source, f"is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    return parse_aois(doc, source)


@dataclass(frozen=True, slots=True)
class AttentionLayout:
    """What the attention part of a cohort release holds: a grid block, an AOI block, or both.

    A session's **tally** in a bucket is an int64 vector of sample counts, ``[grid cells
    (R·C), off the field (1)]`` when there is a grid, then ``[each AOI (A), elsewhere (1)]``
    when there are AOIs (:attr:`tally_size`); its **contribution** (:meth:`contribution`) is
    ``[grid block (R·C)]`` then ``[AOI block (A + 1)]`` (:attr:`dimension`), each block a
    probability vector or zero.

    Attributes:
        grid: the heatmap grid, or ``None``.
        aois: the AOIs, or ``None``.
    """

    grid: AttentionGrid | None
    aois: AoiSet | None

    def __post_init__(self) -> None:
        if self.grid is None and self.aois is None:
            raise ConfigError("cohort.release", None, "attention needs a grid or AOIs")

    @property
    def blocks(self) -> int:
        """Blocks of L2 norm ≤ 1: one per grid, one per AOI set."""
        return (self.grid is not None) + (self.aois is not None)

    @property
    def grid_cells(self) -> int:
        """``R·C`` (0 without a grid)."""
        return 0 if self.grid is None else self.grid.cells

    @property
    def aoi_slots(self) -> int:
        """``A + 1`` (0 without AOIs)."""
        return 0 if self.aois is None else len(self.aois.aois) + 1

    @property
    def dimension(self) -> int:
        """Noised coordinates: ``R·C + (A + 1)`` (of what is present)."""
        return self.grid_cells + self.aoi_slots

    @property
    def tally_size(self) -> int:
        """Length of a tally (the class docstring)."""
        return (self.grid_cells + 1 if self.grid is not None else 0) + self.aoi_slots

    def tally(self, x_deg: npt.ArrayLike, y_deg: npt.ArrayLike, valid: npt.ArrayLike) -> IntArray:
        """(:attr:`tally_size`,) sample counts of one block of gaze (x, y deg, valid: (N,))."""
        x = np.asarray(x_deg, dtype=np.float64).reshape(-1)
        y = np.asarray(y_deg, dtype=np.float64).reshape(-1)
        ok = np.asarray(valid, dtype=bool).reshape(-1) & np.isfinite(x) & np.isfinite(y)
        x, y = x[ok], y[ok]
        parts: list[IntArray] = []
        if self.grid is not None:
            cells = self.grid.cell_of(x, y)
            cells[cells < 0] = self.grid.cells  # off the field
            parts.append(np.bincount(cells, minlength=self.grid.cells + 1).astype(np.int64))
        if self.aois is not None:
            idx = self.aois.assign(x, y)
            parts.append(np.bincount(idx, minlength=self.aoi_slots).astype(np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def valid_samples(self, tally: npt.ArrayLike) -> int:
        """How many valid samples a tally counts."""
        t = np.asarray(tally, dtype=np.int64)
        if self.grid is not None:
            return int(t[: self.grid.cells + 1].sum())
        return int(t.sum())

    def contribution(self, tally: npt.ArrayLike) -> FloatArray:
        """(:attr:`dimension`,) the session's blocks from its tally: each normalized to sum to 1
        (times a shrink of 1 − 2⁻⁴⁰), or zero without samples; L2 norm ≤ √:attr:`blocks`.

        Raises:
            ValueError: a tally of the wrong length or with negative counts.
        """
        t = np.asarray(tally, dtype=np.float64).reshape(-1)
        if t.shape != (self.tally_size,) or np.any(t < 0) or not np.all(np.isfinite(t)):
            raise ValueError(f"a tally is {self.tally_size} non-negative counts, got {t.shape}")
        out: list[FloatArray] = []
        at = 0
        if self.grid is not None:
            cells = t[: self.grid.cells]
            out.append(_normalized(cells))
            at = self.grid.cells + 1
        if self.aois is not None:
            out.append(_normalized(t[at : at + self.aoi_slots]))
        return np.concatenate(out)

    def describe(self) -> dict[str, Any]:
        """The public geometry as JSON-ready values (the plan's figures)."""
        out: dict[str, Any] = {"dwell": "valid samples, time-weighted at the declared rate"}
        if self.grid is not None:
            g = self.grid
            out |= {"rows": g.rows, "cols": g.cols, "fov_deg": [g.width_deg, g.height_deg]}
        if self.aois is not None:
            out |= {"aois": list(self.aois.names), "aoi_file": self.aois.source}
        return out


def _normalized(counts: FloatArray) -> FloatArray:
    total = math.fsum(counts.tolist())
    if total <= 0:
        return np.zeros(counts.shape)
    out: FloatArray = np.clip(counts / total, 0.0, 1.0) * _SHRINK
    return out


def shares(noisy: Sequence[float] | FloatArray, total: float | None = None) -> FloatArray:
    """The normalised positive part of a noisy block (post-processing): sums to 1, or all 0.

    With ``total`` (the noisy number of contributors, itself a release): the positive part of
    ``noisy − τ``, with the least ``τ ≥ 0`` that brings its sum down to ``total`` — the
    Euclidean projection of the noisy block onto the scaled simplex ``{v ≥ 0, Σv = total}``
    (the least-squares distribution), normalised; ``total ≤ 0``: all 0. Not what the messages
    publish: ``bench/eval_attention.py`` measured it no better in earth mover's distance than
    the plain positive part (equal where the signal is strong, worse where it is weak: it puts
    the mass on the few largest noise peaks), so it stays a comparison.
    """
    v = np.asarray(noisy, dtype=np.float64).reshape(-1)
    pos = np.maximum(v, 0.0)
    if total is not None:
        if not total > 0:
            return np.zeros(v.shape)
        if pos.sum() > total:  # τ: sorted descending, the largest k with Σ_{≤k} − k·v_k < total
            u = np.sort(v)[::-1]
            c = np.cumsum(u) - total
            k = int(np.flatnonzero(u - c / np.arange(1, u.size + 1) > 0)[-1])
            pos = np.maximum(v - c[k] / (k + 1), 0.0)
    s = float(pos.sum())
    out: FloatArray = pos / s if s > 0 else pos
    return out
