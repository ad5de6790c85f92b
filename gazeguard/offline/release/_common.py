"""Shared pieces of the dataset release mechanisms: the :class:`Release` result, the random source,
parameter validation, per-task sequences and feature ranges.

Randomness. Every mechanism draws from one :class:`ReleaseRandom`. By default it reads the OS
CSPRNG (``os.urandom`` for uniform floats, :class:`secrets.SystemRandom` for shuffles), so no seed
can be recovered or replayed. Only an explicit ``insecure_seed`` switches to numpy's PCG64 and
:class:`random.Random` — reproducible, and therefore unfit for a real release; the manifest says so.
"""

from __future__ import annotations

import math
import os
import random
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from gazeguard.core.errors import ConfigError
from gazeguard.signal.dataset import FeatureTable
from gazeguard.signal.features import feature_bounds

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.intp]
T = TypeVar("T")

#: ``progress(done, total, what)``: called as a mechanism works through its units (tasks, rows).
Progress = Callable[[int, int, str], None]


def no_progress(done: int, total: int, what: str) -> None:
    """The default :data:`Progress`: report nothing."""


@dataclass(frozen=True)
class Release:
    """The result of a release mechanism.

    Attributes:
        table: the privatized dataset, same feature columns as the input.
        manifest: JSON-ready facts about the release: ``mechanism``, ``parameters``,
            ``guarantee`` (``kind``, ``statement`` in words, ``numbers``), ``seed_policy`` and
            mechanism-specific ``details``.
            :func:`gazeguard.offline.release.manifest.build_manifest`
            adds the input checksum, version and timestamps.
        private: JSON-ready facts that identify people and must never leave with the release,
            e.g. k-same's mapping from released group ids to real person and recording ids
            (``{"person": {released: real}, "recording": {released: real}, ...}``); empty for
            mechanisms that have none. ``gazeguard release`` writes it to a separate local file.
    """

    table: FeatureTable
    manifest: dict[str, Any]
    private: dict[str, Any] = field(default_factory=dict)

    def oracle_table(self) -> FeatureTable:
        """The released table with the real ``person`` and ``recording`` labels put back from
        :attr:`private` (the released table itself when there is no mapping).

        For evaluations, which must know who is who to score an attack; never release it.
        """
        person = self.private.get("person")
        recording = self.private.get("recording")
        if not person and not recording:
            return self.table
        t = self.table
        return FeatureTable(
            t.X,
            t.t,
            np.array([person.get(p, p) for p in t.person.tolist()], dtype=str)
            if person
            else t.person,
            t.task,
            np.array([recording.get(r, r) for r in t.recording.tolist()], dtype=str)
            if recording
            else t.recording,
            t.feature_names,
            t.feature_units,
        )


def seed_policy(insecure_seed: int | None, secure_source: str, insecure_source: str) -> str:
    """The manifest's ``seed_policy`` line."""
    if insecure_seed is None:
        return f"OS CSPRNG ({secure_source}); no seed exists that could reproduce the noise"
    return (
        f"INSECURE reproducible seed {insecure_seed} ({insecure_source}): anyone with the seed "
        "can reproduce and remove the randomness; for experiments only, never for a real release"
    )


class ReleaseRandom:
    """Uniform randomness for release mechanisms: OS CSPRNG unless an insecure seed is given.

    Args:
        insecure_seed: ``None`` (default) for the OS CSPRNG; an int for a reproducible,
            NOT cryptographically secure generator (experiments and tests only).
    """

    def __init__(self, insecure_seed: int | None = None) -> None:
        self.insecure_seed = insecure_seed
        self._np: np.random.Generator | None = None
        self._py: random.Random
        if insecure_seed is None:
            self._py = secrets.SystemRandom()
        else:
            self._np = np.random.default_rng(insecure_seed)
            self._py = random.Random(insecure_seed)

    @property
    def policy(self) -> str:
        """One line for the manifest: where the randomness came from."""
        return seed_policy(
            self.insecure_seed,
            "os.urandom uniforms, secrets.SystemRandom shuffles",
            "numpy PCG64 and random.Random",
        )

    def uniform(self, shape: int | tuple[int, ...]) -> FloatArray:
        """Uniform floats in [0, 1) with 53 random bits each, of the given shape."""
        if self._np is not None:
            return self._np.random(shape)
        size = int(np.prod(shape))
        words = np.frombuffer(os.urandom(8 * size), dtype=np.uint64)
        return ((words >> np.uint64(11)).astype(np.float64) * 2.0**-53).reshape(shape)

    def signs(self, shape: int | tuple[int, ...]) -> FloatArray:
        """Independent fair ±1.0 of the given shape."""
        return np.where(self.uniform(shape) < 0.5, -1.0, 1.0)

    def shuffle(self, items: list[T]) -> None:
        """Shuffle ``items`` in place (Fisher–Yates over the chosen source)."""
        self._py.shuffle(items)


# ---------------------------------------------------------------- parameters


class Params:
    """Typed, validated access to a mechanism's parameter mapping.

    Every rejection is a :class:`ConfigError` whose ``field`` is the parameter name, so a caller
    (or the CLI) can say which flag to change. Parameters a mechanism does not know are refused by
    :meth:`finish`.
    """

    def __init__(self, mechanism: str, params: Mapping[str, object]) -> None:
        self.mechanism = mechanism
        # None means "not given" (the CLI passes unset flags as None).
        self._raw = {k: v for k, v in params.items() if v is not None}
        self._used: dict[str, object] = {}

    @property
    def source(self) -> str:
        """The ``source`` quoted in error messages."""
        return f"{self.mechanism} parameters"

    def error(self, name: str, value: object, reason: str) -> ConfigError:
        """A :class:`ConfigError` for parameter ``name``."""
        return ConfigError(name, value, reason, self.source)

    def integer(self, name: str, default: int, *, minimum: int) -> int:
        """An int parameter ≥ ``minimum``."""
        value = self._raw.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise self.error(name, value, "must be an integer")
        if value < minimum:
            raise self.error(name, value, f"must be at least {minimum}")
        self._used[name] = int(value)
        return int(value)

    def number(self, name: str, default: float | None, *, greater_than: float) -> float:
        """A finite float parameter > ``greater_than`` (required when ``default`` is None)."""
        if name not in self._raw and default is None:
            raise self.error(name, None, f"is required by {self.mechanism}")
        value = self._raw.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float | np.number):
            raise self.error(name, value, "must be a number")
        v = float(value)
        if not math.isfinite(v) or v <= greater_than:
            raise self.error(name, value, f"must be a finite number greater than {greater_than:g}")
        self._used[name] = v
        return v

    def choice(self, name: str, default: str, choices: Sequence[str]) -> str:
        """One of ``choices``."""
        value = self._raw.get(name, default)
        if value not in choices:
            raise self.error(name, value, f"must be one of {', '.join(map(repr, choices))}")
        self._used[name] = str(value)
        return str(value)

    def optional(self, name: str) -> object:
        """A parameter passed through unvalidated (validated by its consumer), or None."""
        value = self._raw.get(name)
        if value is not None:
            self._used[name] = value
        return value

    def finish(self) -> dict[str, object]:
        """Refuse unknown parameters; return the effective parameters (defaults filled in)."""
        unknown = sorted(set(self._raw) - set(self._used))
        if unknown:
            raise self.error(
                unknown[0],
                self._raw[unknown[0]],
                f"is not a parameter of {self.mechanism}; it takes {', '.join(sorted(self._used))}",
            )
        return dict(self._used)


# ---------------------------------------------------------------- sequences


def task_sequences(table: FeatureTable) -> dict[str, dict[str, IndexArray]]:
    """Row indices of each person's feature-vector sequence within each task.

    Returns:
        ``{task: {person: rows}}``; tasks and persons in sorted order; ``rows`` (L,) in time
        order — a person with several recordings of one task has them concatenated in the order
        the recordings first appear in the table.
    """
    recs = [rows for _, rows in table.recordings()]
    order: IndexArray = np.concatenate(recs) if recs else np.empty(0, dtype=np.intp)
    out: dict[str, dict[str, list[int]]] = {}
    for i in order:
        out.setdefault(str(table.task[i]), {}).setdefault(str(table.person[i]), []).append(int(i))
    return {
        task: {p: np.asarray(rows[p], dtype=np.intp) for p in sorted(rows)}
        for task, rows in sorted(out.items())
    }


def padded(rows: IndexArray, length: int) -> IndexArray:
    """``rows`` padded to ``length`` by repeating its last index (the papers' padding)."""
    return rows[np.minimum(np.arange(length), rows.size - 1)]


def concat_tables(parts: Sequence[FeatureTable], like: FeatureTable) -> FeatureTable:
    """Stack tables with ``like``'s feature names and units (an empty table if no parts)."""
    if not parts:
        f = len(like.feature_names)
        empty = np.empty(0, dtype=str)
        return FeatureTable(
            np.empty((0, f)),
            np.empty(0),
            empty,
            empty,
            empty,
            like.feature_names,
            like.feature_units,
        )
    return FeatureTable(
        np.concatenate([p.X for p in parts]),
        np.concatenate([p.t for p in parts]),
        np.concatenate([p.person for p in parts]),
        np.concatenate([p.task for p in parts]),
        np.concatenate([p.recording for p in parts]),
        like.feature_names,
        like.feature_units,
    )


# ---------------------------------------------------------------- ranges

#: How a mechanism learns each feature's range: ``public`` declared bounds (the gazeguard feature
#: registry or a bounds mapping the caller passes) or ``data`` (min and max of the input itself,
#: the papers' convention; the range then depends on the data, which a DP proof does not allow).
RANGE_SOURCES = ("public", "data")


@dataclass(frozen=True)
class FeatureRanges:
    """Per-feature ranges, float64 (F,) each, and where they came from."""

    lo: FloatArray
    hi: FloatArray
    max_step: FloatArray | None
    source: str

    @property
    def width(self) -> FloatArray:
        """hi − lo, (F,)."""
        return self.hi - self.lo


def feature_ranges(table: FeatureTable, source: str, params: Params) -> FeatureRanges:
    """Each feature's range for ``table``.

    Args:
        source: ``"public"`` or ``"data"`` (see :data:`RANGE_SOURCES`).
        params: the mechanism's parameters; for ``public`` it reads ``bounds`` — a mapping
            ``{feature name: (lo, hi[, max_step])}`` covering every feature — or, without it,
            asks ``gazeguard.signal.features.feature_bounds`` at the ``window_s``/``step_s`` the
            table
            was extracted with (defaults 30 s and 0.5 s).

    Raises:
        ConfigError: naming ``bounds`` when a feature has no declared bounds or lo ≥ hi.
    """
    names = table.feature_names
    if source == "data":
        if params.optional("bounds") is not None:
            raise params.error("bounds", "(given)", "applies only with range='public'")
        if table.n_rows == 0:
            raise params.error("range", source, "the input has no rows to take ranges from")
        require_finite(table, params)
        return FeatureRanges(table.X.min(axis=0), table.X.max(axis=0), None, "data")
    bounds = params.optional("bounds")
    step: FloatArray | None
    if bounds is None:
        window_s = params.number("window_s", 30.0, greater_than=0.0)
        step_s = params.number("step_s", 0.5, greater_than=0.0)
        lo, hi, step = _registry_bounds(names, window_s, step_s, params)
    else:
        lo, hi, step = _mapping_bounds(names, bounds, params)
    bad = np.flatnonzero(~(lo < hi))
    if bad.size:
        j = int(bad[0])
        raise params.error(
            "bounds",
            (names[j], float(lo[j]), float(hi[j])),
            "lo must be below hi for every feature",
        )
    return FeatureRanges(lo, hi, step, "public")


def require_finite(table: FeatureTable, params: Params) -> None:
    """Refuse a table with NaN or infinite values, naming the first such feature."""
    bad = ~np.isfinite(table.X)
    if bad.any():
        counts = bad.sum(axis=0)
        j = int(np.flatnonzero(counts)[0])
        raise params.error(
            "input",
            f"feature {table.feature_names[j]!r}: {int(counts[j])} non-finite values",
            "release mechanisms need complete rows; drop those rows or features, or impute "
            "them, before releasing",
        )


def _registry_bounds(
    names: tuple[str, ...], window_s: float, step_s: float, params: Params
) -> tuple[FloatArray, FloatArray, FloatArray]:
    try:
        lo, hi, step = feature_bounds(list(names), window_s=window_s, step_s=step_s)
    except (KeyError, ValueError) as exc:
        raise params.error(
            "bounds",
            None,
            f"the gazeguard feature registry does not declare bounds for these features ({exc}); "
            "pass bounds ({name: (lo, hi, max_step)}, CLI --bounds FILE.json) or range='data'",
        ) from exc
    return (
        np.asarray(lo, np.float64),
        np.asarray(hi, np.float64),
        np.asarray(step, np.float64),
    )


def _mapping_bounds(
    names: tuple[str, ...], bounds: object, params: Params
) -> tuple[FloatArray, FloatArray, FloatArray | None]:
    if not isinstance(bounds, Mapping):
        raise params.error("bounds", bounds, "must map feature name -> (lo, hi[, max_step])")
    missing = [n for n in names if n not in bounds]
    if missing:
        raise params.error(
            "bounds", f"{len(bounds)} features", f"has no entry for features {missing[:5]}"
        )
    rows = [tuple(float(v) for v in bounds[n]) for n in names]
    if any(len(r) not in (2, 3) for r in rows):
        raise params.error("bounds", bounds, "each entry must be (lo, hi) or (lo, hi, max_step)")
    lo = np.array([r[0] for r in rows])
    hi = np.array([r[1] for r in rows])
    step = np.array([r[2] for r in rows]) if all(len(r) == 3 for r in rows) else None
    return lo, hi, step
