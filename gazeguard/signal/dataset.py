"""Recorded feature datasets: the table that ``gazeguard eval`` produces and ``gazeguard release``
privatizes.

A :class:`FeatureTable` holds N feature vectors (rows) of F features, each row labelled with the
person, the task and the recording it came from and the end time ``t`` (s) of its window. Rows of
one recording are consecutive and in time order.

On disk it is CSV (``person,task,recording,t,<feature>...``, one header line, ``#`` comment lines
allowed before it), NPZ (arrays ``X, t, person, task, recording, feature_names``) or Parquet (same
columns as CSV; needs ``pyarrow``).
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import DatasetError

LABEL_COLUMNS = ("person", "task", "recording", "t")
StrArray = npt.NDArray[np.str_]


@dataclass(frozen=True)
class FeatureTable:
    """N labelled feature vectors.

    Attributes:
        X: float64 (N, F) feature values, units as in ``feature_units``.
        t: float64 (N,) window end time within its recording, s.
        person, task, recording: str (N,) labels.
        feature_names: F names (``gazeguard.signal.features.FEATURES`` order when extracted by
        gazeguard).
        feature_units: F units ("" where unknown).
    """

    X: npt.NDArray[np.float64]
    t: npt.NDArray[np.float64]
    person: StrArray
    task: StrArray
    recording: StrArray
    feature_names: tuple[str, ...]
    feature_units: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        n, f = self.X.shape
        if len(self.feature_names) != f:
            msg = f"{f} feature columns but {len(self.feature_names)} feature names"
            raise ValueError(msg)
        for name in ("t", "person", "task", "recording"):
            if getattr(self, name).shape != (n,):
                msg = f"FeatureTable.{name} has shape {getattr(self, name).shape}, expected ({n},)"
                raise ValueError(msg)
        if not self.feature_units:
            object.__setattr__(self, "feature_units", ("",) * f)

    @property
    def n_rows(self) -> int:
        """N."""
        return int(self.X.shape[0])

    def recordings(self) -> Iterator[tuple[str, npt.NDArray[np.intp]]]:
        """Yield ``(recording id, row indices)`` in first-appearance order."""
        _, first = np.unique(self.recording, return_index=True)
        for rec in self.recording[np.sort(first)]:
            yield str(rec), np.flatnonzero(self.recording == rec)

    def take(self, rows: npt.NDArray[np.intp]) -> FeatureTable:
        """The rows at the indices ``rows``, in that order."""
        return FeatureTable(
            self.X[rows],
            self.t[rows],
            self.person[rows],
            self.task[rows],
            self.recording[rows],
            self.feature_names,
            self.feature_units,
        )

    def with_values(self, X: npt.NDArray[np.float64]) -> FeatureTable:
        """The same labels with new values (e.g. privatized), shape (N, F)."""
        if X.shape != self.X.shape:
            msg = f"new values have shape {X.shape}, expected {self.X.shape}"
            raise ValueError(msg)
        return FeatureTable(
            np.asarray(X, np.float64),
            self.t,
            self.person,
            self.task,
            self.recording,
            self.feature_names,
            self.feature_units,
        )

    # ------------------------------------------------------------------ I/O
    def save(self, path: str | Path) -> Path:
        """Write as CSV, NPZ or Parquet by the file suffix; returns the path."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix == ".npz":
            np.savez_compressed(
                path,
                X=self.X,
                t=self.t,
                person=self.person,
                task=self.task,
                recording=self.recording,
                feature_names=np.array(self.feature_names),
                feature_units=np.array(self.feature_units),
            )
        elif suffix == ".csv":
            with path.open("w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow([*LABEL_COLUMNS, *self.feature_names])
                for i in range(self.n_rows):
                    w.writerow(
                        [
                            self.person[i],
                            self.task[i],
                            self.recording[i],
                            repr(float(self.t[i])),
                            *(repr(float(v)) for v in self.X[i]),
                        ]
                    )
        elif suffix == ".parquet":
            pa, pq = _pyarrow(path)
            cols = {c: getattr(self, c).tolist() for c in LABEL_COLUMNS}
            cols.update({n: self.X[:, j] for j, n in enumerate(self.feature_names)})
            pq.write_table(pa.table(cols), path)
        else:
            raise DatasetError(path, f"unknown format {suffix!r}; use .csv, .npz or .parquet")
        return path

    @classmethod
    def load(cls, path: str | Path) -> FeatureTable:
        """Read a table written by :meth:`save` (or by hand in the CSV layout).

        Raises:
            DatasetError: naming the file (and the line, for CSV) that is malformed.
        """
        path = Path(path)
        if not path.is_file():
            raise DatasetError(path, "file not found")
        suffix = path.suffix.lower()
        if suffix == ".npz":
            try:
                with np.load(path, allow_pickle=False) as z:
                    return cls(
                        np.asarray(z["X"], np.float64),
                        np.asarray(z["t"], np.float64),
                        z["person"].astype(str),
                        z["task"].astype(str),
                        z["recording"].astype(str),
                        tuple(z["feature_names"].astype(str)),
                        tuple(z["feature_units"].astype(str)) if "feature_units" in z else (),
                    )
            except (KeyError, ValueError, OSError) as exc:
                raise DatasetError(path, f"not a gazeguard feature table: {exc}") from exc
        if suffix == ".parquet":
            _, pq = _pyarrow(path)
            tbl = pq.read_table(path).to_pydict()
            missing = [c for c in LABEL_COLUMNS if c not in tbl]
            if missing:
                raise DatasetError(path, f"missing columns {missing}")
            names = tuple(c for c in tbl if c not in LABEL_COLUMNS)
            X = np.column_stack([np.asarray(tbl[n], np.float64) for n in names])
            return cls(
                X,
                np.asarray(tbl["t"], np.float64),
                np.asarray(tbl["person"], str),
                np.asarray(tbl["task"], str),
                np.asarray(tbl["recording"], str),
                names,
            )
        if suffix == ".csv":
            return cls._load_csv(path)
        raise DatasetError(path, f"unknown format {suffix!r}; use .csv, .npz or .parquet")

    @classmethod
    def _load_csv(cls, path: Path) -> FeatureTable:
        with path.open(newline="") as fh:
            rows = csv.reader(fh)
            header: list[str] | None = None
            labels: list[list[str]] = []
            values: list[list[float]] = []
            for lineno, row in enumerate(rows, start=1):
                if not row or row[0].startswith("#"):
                    continue
                if header is None:
                    header = [c.strip() for c in row]
                    if tuple(header[:4]) != LABEL_COLUMNS or len(header) < 5:
                        raise DatasetError(
                            path,
                            f"header must start with {','.join(LABEL_COLUMNS)} followed by "
                            f"feature columns; got {','.join(header[:5])}",
                            lineno,
                        )
                    continue
                if len(row) != len(header):
                    raise DatasetError(
                        path, f"expected {len(header)} fields, found {len(row)}", lineno
                    )
                try:
                    nums = [float(v) for v in row[3:]]
                except ValueError as exc:
                    raise DatasetError(path, f"not a number: {exc}", lineno) from exc
                labels.append(row[:3])
                values.append(nums)
        if header is None or not values:
            raise DatasetError(path, "no header or no data rows")
        lab = np.array(labels, dtype=str)
        arr = np.array(values, dtype=np.float64)
        return cls(arr[:, 1:], arr[:, 0], lab[:, 0], lab[:, 1], lab[:, 2], tuple(header[4:]))


def subsample(rows: npt.ArrayLike, recording: npt.ArrayLike, every: int) -> npt.NDArray[np.intp]:
    """Keep every ``every``-th of ``rows`` within each recording (first one kept).

    The paper trains and tests on every 5th (re-identification) or 10th (task) window so that
    consecutive, nearly identical sliding windows do not dominate; ``every=1`` keeps all.
    """
    if every < 1:
        msg = f"subsample: every={every!r} must be >= 1"
        raise ValueError(msg)
    r = np.asarray(rows, dtype=np.intp)
    if every == 1:
        return r
    rec = np.asarray(recording).astype(str)[r]
    keep = np.zeros(r.shape, dtype=bool)
    for rid in np.unique(rec):
        pos = np.flatnonzero(rec == rid)
        keep[pos[::every]] = True
    return r[keep]


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file (for release manifests)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pyarrow(path: Path) -> tuple[Any, Any]:  # pragma: no cover - optional dependency
    try:
        import pyarrow as pa  # noqa: PLC0415 - the parquet extra
        import pyarrow.parquet as pq  # noqa: PLC0415 - the parquet extra
    except ImportError as exc:
        raise DatasetError(path, "Parquet needs pyarrow: pip install pyarrow") from exc
    return pa, pq
