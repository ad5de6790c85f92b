"""gazeguard's own DP mechanisms — LPA, FPA, CFPA, DCFPA (Bozkir et al. 2021) — applied to a
recorded dataset, one recording at a time.

Each recording's feature time series (F features × T steps) is cut into consecutive chunks of
``n`` steps and every chunk is released with :func:`gazeguard.privacy.mechanisms.make_mechanism`,
exactly
as the live service releases its chunks (same public bounds, same sampler, same accounting):

``cfpa``, ``dcfpa``
    chunks of ``n`` steps, n a power of two (default 32); ``keep`` frequencies per chunk
    (an int or ``"auto"``, chosen from the shipped public prior) on the ``dft`` or ``dct`` basis.
``lpa``
    Laplace noise on every value of each chunk of ``n`` steps (any n ≥ 2).
``fpa``
    one release of the whole recording (``n = T``, offline only); ``n`` and ``tail`` do not apply.

Tail handling. A recording of T steps has ``T mod n`` steps after its last full chunk. With
``tail="drop"`` (default, as the live service does) they are not released. With ``tail="pad"``
they are padded to a full chunk by repeating the last feature vector (a padded chunk stays within
the bounds, with zero steps), the chunk is released and only its real steps are kept — nothing
is lost, at the cost of one more chunk of ε for that recording.

Accounting. ε is per feature per chunk (the papers' convention). One chunk costs ``F · ε``
(sequential composition over features); a person's honest user-level ε is ``F · ε`` times the
number of chunks released from all of their recordings (sequential composition over chunks).
The manifest reports the per-chunk figure and the largest per-person figure. Bounds are public
(the gazeguard feature registry or a ``bounds`` mapping); data-derived ranges are refused here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gazeguard.core.chunking import chunk_rows
from gazeguard.core.errors import ConfigError
from gazeguard.offline.release._common import (
    FloatArray,
    Params,
    Progress,
    Release,
    feature_ranges,
    no_progress,
    require_finite,
    seed_policy,
)
from gazeguard.privacy.accounting import Event, compose
from gazeguard.privacy.mechanisms import Bounds, Mechanism, make_mechanism
from gazeguard.privacy.mechanisms.registry import MECHANISMS, mechanism_kind
from gazeguard.signal.dataset import FeatureTable

DP_MECHANISMS = tuple(MECHANISMS)
TAIL_POLICIES = ("drop", "pad")
#: make_mechanism's argument names → this module's parameter names (for error messages).
#: δ of the user-level (ε, δ) statement (as the live ledger's default).
USER_DELTA = 1e-6
_PARAM_NAMES = {"k": "keep", "n": "n", "epsilon": "epsilon", "transform": "transform"}


def recording_release(
    name: str,
    table: FeatureTable,
    params: Mapping[str, object],
    seed: int | None = None,
    progress: Progress = no_progress,
) -> Release:
    """Release ``table`` with gazeguard's mechanism ``name``, chunk by chunk per recording.

    Args:
        name: ``"lpa"``, ``"fpa"``, ``"cfpa"`` or ``"dcfpa"``.
        table: N labelled feature vectors; rows of a recording consecutive and in time order.
        params: ``epsilon`` (per feature per chunk, required), ``n`` (chunk steps, default 32;
            not for fpa), ``keep`` (kept frequencies or ``"auto"``, default; not for lpa),
            ``transform`` (``"dft"`` default or ``"dct"``; not for lpa), ``tail`` (``"drop"``
            default or ``"pad"``; not for fpa), ``bounds`` (``{name: (lo, hi, max_step)}``;
            default: the gazeguard feature registry at ``window_s``/``step_s``, 30 s / 0.5 s).
        seed: ``None`` for the OS CSPRNG; an int only for reproducible experiments (insecure).
        progress: called once per recording.

    Raises:
        ConfigError: naming the parameter that is invalid (``epsilon`` ≤ 0, ``n`` not a power of
            two for cfpa/dcfpa, ``keep`` > n/2, missing bounds, ...).
    """
    setup = _setup(name, table, params)
    mechanisms = _Mechanisms(setup, seed)
    done = _release_recordings(setup, table, mechanisms, progress)
    keep_rows = np.flatnonzero(done.released)
    out_table = table.take(keep_rows).with_values(done.X[keep_rows])
    return Release(out_table, _manifest(setup, table, done, mechanisms, seed))


@dataclass(frozen=True, slots=True)
class _Setup:
    """One release's checked parameters (``n`` 0 and ``whole`` for FPA: a recording at once)."""

    name: str
    whole: bool
    transformed: bool
    params: Params
    epsilon: float
    n: int
    keep: int | str
    transform: str
    tail: str
    effective: dict[str, Any]
    public: Bounds
    f: int


def _setup(name: str, table: FeatureTable, params: Mapping[str, object]) -> _Setup:
    """Check ``params`` for mechanism ``name`` (see :func:`recording_release`)."""

    kind = mechanism_kind(name, field="mechanism")
    whole = not kind.online  # FPA: one release per recording
    p = Params(name, params)
    epsilon = p.number("epsilon", None, greater_than=0.0)
    n = 0 if whole else p.integer("n", 32, minimum=2)
    keep: int | str = "auto"
    transform = "dft"
    if kind.transformed:
        if p.optional("keep") not in (None, "auto"):
            keep = p.integer("keep", 1, minimum=1)
        transform = p.choice("transform", "dft", ("dft", "dct"))
    tail = "drop" if whole else p.choice("tail", "drop", TAIL_POLICIES)
    ranges = feature_ranges(table, "public", p)
    effective = p.finish()
    effective.pop("bounds", None)
    require_finite(table, p)
    if kind.difference and ranges.max_step is None:
        raise p.error("bounds", "(lo, hi)", f"{name} needs max_step for every feature")
    public = Bounds(ranges.lo, ranges.hi, ranges.max_step)
    return _Setup(
        name, whole, kind.transformed, p, epsilon, n, keep, transform, tail, effective, public,
        len(table.feature_names),
    )  # fmt: skip


class _Mechanisms:
    """One mechanism per chunk length (a padded tail or an FPA recording has its own)."""

    def __init__(self, setup: _Setup, seed: int | None) -> None:
        self.setup = setup
        self.seed = seed
        self.cache: dict[int, Mechanism] = {}

    def __call__(self, length: int) -> Mechanism:
        s = self.setup
        if length not in self.cache:
            try:
                self.cache[length] = make_mechanism(
                    s.name,
                    n=length,
                    k=s.keep,
                    epsilon=s.epsilon,
                    bounds=s.public,
                    transform=s.transform,
                    seed=None if self.seed is None else self.seed + length,
                    n_features=s.f,
                )
            except ConfigError as exc:
                field = _PARAM_NAMES.get(exc.field, exc.field)
                raise s.params.error(field, exc.value, exc.reason) from exc
        return self.cache[length]


@dataclass(frozen=True, slots=True)
class _Released:
    """The released values (NaN where not released), which rows were, and the accounting."""

    X: FloatArray
    released: npt.NDArray[np.bool_]
    chunks_per_person: dict[str, int]
    events_per_person: dict[str, dict[Event, int]]
    per_recording: dict[str, dict[str, int]]


def _release_recordings(
    setup: _Setup, table: FeatureTable, mechanism: _Mechanisms, progress: Progress
) -> _Released:
    """Release every recording chunk by chunk (FPA: whole), counting each person's events."""
    n = setup.n
    X = np.full(table.X.shape, np.nan)
    released = np.zeros(table.n_rows, dtype=bool)
    chunks_per_person: dict[str, int] = {}
    events_per_person: dict[str, dict[Event, int]] = {}
    per_recording: dict[str, dict[str, int]] = {}
    recordings = list(table.recordings())
    for done, (rec, rows) in enumerate(recordings, start=1):
        size = rows.size
        plan = chunk_rows(rows, n, whole=setup.whole, pad=setup.tail == "pad")
        for part, real in plan:
            mech = mechanism(part.size)
            out: FloatArray = mech.release(np.ascontiguousarray(table.X[part].T))
            X[part[:real]] = out.T[:real]
            released[part[:real]] = True
        person = str(table.person[rows[0]])
        chunks_per_person[person] = chunks_per_person.get(person, 0) + len(plan)
        counts = events_per_person.setdefault(person, {})
        for part, _ in plan:
            for e, c in mechanism(part.size).events().items():
                counts[e] = counts.get(e, 0) + c
        per_recording[rec] = {
            "steps": int(size),
            "chunks": len(plan),
            "steps_released": int(released[rows].sum()),
        }
        progress(done, len(recordings), f"recording {rec!r}: {len(plan)} chunks")
    return _Released(X, released, chunks_per_person, events_per_person, per_recording)


def _manifest(
    setup: _Setup,
    table: FeatureTable,
    done: _Released,
    mechanisms: _Mechanisms,
    seed: int | None,
) -> dict[str, Any]:
    """The release manifest: parameters, the user-level guarantee (pure and at δ), details."""
    name, epsilon, f, n, whole = setup.name, setup.epsilon, setup.f, setup.n, setup.whole
    cache = mechanisms.cache
    per_chunk = f * epsilon
    max_chunks = max(done.chunks_per_person.values(), default=0)
    # The accountant's user-level ε at δ: each person's releases composed (PLD), the worst one.
    composed = (compose(c, USER_DELTA).epsilon for c in done.events_per_person.values())
    at_delta = max(composed, default=0.0)
    resolved_keep: Any = sorted({m.k for m in cache.values()}) if setup.transformed else None
    unit, units = ("recording", "recordings") if whole else (f"chunk of {n} steps", "chunks")
    statement = (
        f"{name.upper()} (Bozkir et al. 2021) with epsilon={epsilon:g} per feature per {unit} "
        f"from public bounds: epsilon={per_chunk:g} per {unit} over all {f} features; a "
        f"person's whole release (up to {max_chunks} {units}) is "
        f"epsilon={per_chunk * max_chunks:g}-DP at the user level (sequential composition), "
        f"and (epsilon={at_delta:.4g}, delta={USER_DELTA:g})-DP by the accountant's composition "
        "(privacy loss distributions)."
    )
    if not whole:
        dropped = table.n_rows - int(done.released.sum())
        statement += (
            f" Tails shorter than a chunk were {'padded' if setup.tail == 'pad' else 'dropped'}"
            f" ({dropped} steps not released)."
        )
    return {
        "mechanism": name,
        "parameters": setup.effective,
        "guarantee": {
            "kind": "epsilon-DP",
            "statement": statement,
            "numbers": {
                "epsilon_per_feature_per_chunk": epsilon,
                "epsilon_per_chunk": per_chunk,
                "epsilon_per_person": per_chunk * max_chunks,
                "epsilon_per_person_at_delta": at_delta,
                "delta": USER_DELTA,
                "max_chunks_per_person": max_chunks,
            },
        },
        "seed_policy": seed_policy(
            seed,
            "os.urandom for gazeguard.privacy.mechanisms' discrete Laplace",
            "gazeguard.privacy.mechanisms.InsecureSeededRandom, seed + chunk length",
        ),
        "details": {
            "kept_frequencies": resolved_keep,
            "noise_scale": {
                str(length): m.noise_scale.tolist() for length, m in sorted(cache.items())
            },
            "recordings": done.per_recording,
        },
    }
