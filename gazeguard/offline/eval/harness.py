"""The evaluation harness: privatize a feature table per recording, then score utility and attacks.

For one configuration (mechanism, ε) and one noisy repetition:

1. **Release.** Each recording's feature time series ``(T, F)`` is privatized the way the live
   service would: LPA/CFPA/DCFPA cut it into consecutive chunks of ``n`` steps with the service's
   own :class:`~gazeguard.core.chunking.Chunker` (the incomplete tail is dropped, not padded) and
   release every chunk ``(F, n)``; FPA releases the whole recording at once (``n = T``, offline
   only). Only *released* rows take part in what follows; the clean baseline (``none``) uses all
   rows.
2. **Utility.** NMSE of each feature in each recording against its clean values (eq. 4) and
   ``1/|NMSE|`` (eq. 6), averaged per feature over recordings and repetitions, then over
   features — as in the paper. Also reported: the median NMSE and RMSE as a fraction of each
   feature's public range, which are robust where ``x̄·x̃̄`` is near zero.
3. **Attacks and task.** :func:`~gazeguard.offline.eval.attacks.task_recognition` and
   :func:`~gazeguard.offline.eval.attacks.reidentification` on the released rows, each tested on the
   release itself (Bozkir et al.'s protocol) and on the raw values of the same rows (David-John
   et al.'s: train on the release, attack raw data). The first-half/second-half cut of a
   recording falls between released chunks (:func:`~gazeguard.offline.eval.metrics.split_point`),
   so no
   noise draw is on both sides — except for FPA, whose one release spans the recording; such
   rows carry ``split_inside_chunk`` and the tables mark them.

ε is per feature per chunk; each row also carries the honest user-level ε of a whole released
recording, ``ε · F · chunks`` (sequential composition; see
:func:`~gazeguard.offline.eval.metrics.user_level_epsilon`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from gazeguard.core.chunking import chunk_rows
from gazeguard.offline.eval.attacks import (
    CLASSIFIERS,
    Scores,
    half_split_protocol,
    reidentification,
    task_recognition,
)
from gazeguard.offline.eval.grid import MechanismSpec
from gazeguard.offline.eval.metrics import nmse, user_level_epsilon, utility
from gazeguard.signal.dataset import FeatureTable

if TYPE_CHECKING:
    from gazeguard.privacy.mechanisms import Bounds

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]


class Releaser(Protocol):
    """Anything that privatizes one chunk: ``(F, n)`` float64 in, ``(F, n)`` out."""

    def release(self, x: FloatArray) -> FloatArray:
        """Privatize one chunk."""
        ...


@dataclass(frozen=True)
class FeatureBounds:
    """Public bounds of the released features (subset of the registry), each (F,)."""

    lo: FloatArray
    hi: FloatArray
    max_step: FloatArray


#: ``factory(spec, n, epsilon, seed) -> Releaser`` builds the mechanism for chunks of n steps.
MechanismFactory = Callable[[MechanismSpec, int, float, "int | None"], Releaser]


@dataclass(frozen=True)
class BudgetFactory:
    """The production mechanisms with the noise the sidecar would calibrate for a user-level
    budget of ``epsilon`` per hour of gaze at ``delta`` (:mod:`gazeguard.plan.chunks`): F released
    features, ⌈3600/(n·s)⌉ + 1 chunks per hour. ``epsilon`` is the per-hour budget here.

    A picklable :data:`MechanismFactory` (the evaluation's worker processes are started fresh,
    see :func:`gazeguard.offline.eval.runner.run_jobs`).
    """

    bounds: FeatureBounds
    k: int | str
    step_s: float
    noise: str = "laplace"
    delta: float = 1e-6
    window_s: float = 30.0

    def __call__(self, spec: MechanismSpec, n: int, epsilon: float, seed: int | None) -> Releaser:
        from gazeguard.config import FeatureSettings  # noqa: PLC0415
        from gazeguard.plan import chunks_per_hour  # noqa: PLC0415
        from gazeguard.plan.chunks import calibrated  # noqa: PLC0415

        features = FeatureSettings(window_s=self.window_s, step_s=self.step_s)
        kw: dict[str, Any] = {
            "n": n, "bounds": _bounds(self.bounds), "seed": seed, "noise": self.noise,
        }  # fmt: skip
        transformed = spec.kind is not None and spec.kind.transformed
        if transformed:
            kw["transform"] = spec.transform or "dft"
        mech: Releaser = calibrated(
            spec.family, kw, k=self.k if transformed else None,
            features=int(np.asarray(self.bounds.lo).size),
            chunks=1 if spec.whole else chunks_per_hour(features, n),
            budget=epsilon, delta=self.delta,
        )  # fmt: skip
        return mech


def budget_factory(
    bounds: FeatureBounds,
    k: int | str,
    step_s: float,
    noise: str = "laplace",
    delta: float = 1e-6,
    *,
    window_s: float = 30.0,
) -> MechanismFactory:
    """:class:`BudgetFactory` (the noise for a user-level budget per hour, counted as the
    release plan counts the chunks an hour of gaze can change)."""
    return BudgetFactory(bounds, k, step_s, noise, delta, window_s)


@dataclass(frozen=True)
class GazeguardFactory:
    """The production mechanisms (``gazeguard.privacy.mechanisms.make_mechanism``) for these bounds,
    ``epsilon`` per chunk and feature; picklable like :class:`BudgetFactory`."""

    bounds: FeatureBounds
    k: int | str

    def __call__(self, spec: MechanismSpec, n: int, epsilon: float, seed: int | None) -> Releaser:
        kw: dict[str, Any] = {
            "n": n, "epsilon": epsilon, "bounds": _bounds(self.bounds), "seed": seed,
        }  # fmt: skip
        return _make(spec, self.k, kw)


def _make(spec: MechanismSpec, k: int | str, kw: dict[str, Any]) -> Releaser:
    """``make_mechanism(spec.family, **kw)``, with ``k`` and the transform where it keeps
    frequencies."""
    from gazeguard.privacy.mechanisms import make_mechanism  # noqa: PLC0415 - heavy import

    if spec.kind is not None and spec.kind.transformed:
        kw = {**kw, "k": k, "transform": spec.transform or "dft"}
    mech: Releaser = make_mechanism(spec.family, **kw)
    return mech


def gazeguard_factory(bounds: FeatureBounds, k: int | str) -> MechanismFactory:
    """:class:`GazeguardFactory` (the production mechanisms at ε per chunk and feature)."""
    return GazeguardFactory(bounds, k)


def _bounds(bounds: FeatureBounds) -> Bounds:
    """The mechanisms' :class:`~gazeguard.privacy.mechanisms.Bounds` of these feature bounds."""
    from gazeguard.privacy.mechanisms import Bounds  # noqa: PLC0415 - heavy import

    return Bounds(lo=bounds.lo, hi=bounds.hi, max_step=bounds.max_step)


@dataclass
class Released:
    """One noisy release of a table.

    Attributes:
        rows: (M,) indices of the released rows in the table.
        values: (M, F) privatized values of the released features.
        chunks: chunks per recording, in recording order (0 for the clean baseline).
    """

    rows: IntArray
    values: FloatArray
    chunks: list[int]


class MechanismCache:
    """Mechanisms of one configuration, built once per chunk length and reused.

    Every ``release`` call draws fresh noise, so one mechanism per chunk length serves every
    recording and repetition; with an insecure seed, chunk length ``n`` gets seed ``seed + n``
    and its generator advances across calls (reproducible run to run).
    """

    def __init__(
        self, spec: MechanismSpec, epsilon: float, factory: MechanismFactory, seed: int | None
    ) -> None:
        self.spec = spec
        self.epsilon = epsilon
        self.factory = factory
        self.seed = seed
        self._by_n: dict[int, Releaser] = {}

    def get(self, n: int) -> Releaser:
        """The mechanism for chunks of ``n`` steps."""
        if n not in self._by_n:
            seed = None if self.seed is None else self.seed + n
            self._by_n[n] = self.factory(self.spec, n, self.epsilon, seed)
        return self._by_n[n]

    def k(self) -> dict[int, Any]:
        """Kept coefficients per chunk length, where the mechanism exposes ``k``."""
        out: dict[int, Any] = {}
        for n, mech in self._by_n.items():
            k = getattr(mech, "k", None)
            if k is not None:
                arr = np.asarray(k)
                out[n] = arr.tolist() if arr.ndim else int(arr)
        return out


def release_table(
    table: FeatureTable, cols: IntArray, spec: MechanismSpec, mechanisms: MechanismCache | None
) -> Released:
    """Privatize the ``cols`` features of every recording of ``table`` once.

    Args:
        table: clean features.
        cols: (F,) feature columns to release.
        spec: the mechanism; ``none`` releases every row unchanged (``mechanisms`` unused).
        mechanisms: builds and caches the mechanism per chunk length.
    """
    rows: list[IntArray] = []
    vals: list[FloatArray] = []
    chunks: list[int] = []
    for _, idx in table.recordings():
        if spec.family == "none" or mechanisms is None:
            rows.append(idx)
            vals.append(table.X[np.ix_(idx, cols)])
            chunks.append(0)
            continue
        plan = chunk_rows(idx, int(spec.n or 0), whole=spec.whole)
        if not spec.whole:  # built (its k reported) even for a recording shorter than a chunk
            mechanisms.get(int(spec.n or 0))
        out = [
            mechanisms.get(r.size).release(np.ascontiguousarray(table.X[np.ix_(r, cols)].T))
            for r, _ in plan
        ]
        chunks.append(len(out))
        if out:
            rows.append(np.concatenate([r for r, _ in plan]))
            vals.append(np.concatenate([o.T for o in out], axis=0))
    if not rows:
        return Released(np.empty(0, np.intp), np.empty((0, cols.size)), chunks)
    return Released(np.concatenate(rows), np.concatenate(vals), chunks)


def _stat(values: Sequence[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return {"mean": float("nan"), "std": float("nan")}
    return {"mean": float(a.mean()), "std": float(a.std())}


#: Accumulated accuracies: ``{view: {classifier: {"window" | "vote": [one per repetition]}}}``.
ScoreLists = dict[str, dict[str, dict[str, list[float]]]]


def collect_scores(acc: ScoreLists, scores: Mapping[str, Mapping[str, Scores]]) -> None:
    """Append one repetition's ``{view: {classifier: Scores}}`` to ``acc``."""
    for view, per_clf in scores.items():
        for clf, s in per_clf.items():
            slot = acc.setdefault(view, {}).setdefault(clf, {"window": [], "vote": []})
            slot["window"].append(s.window)
            slot["vote"].append(s.vote)


def summarise_scores(acc: ScoreLists) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """Mean and standard deviation over repetitions of every accumulated accuracy."""
    return {
        view: {clf: {m: _stat(v) for m, v in d.items()} for clf, d in per.items()}
        for view, per in acc.items()
    }


@dataclass(frozen=True)
class EvalSettings:
    """Repetitions and protocol knobs of one evaluation run.

    Attributes:
        utility_reps: noisy repetitions for NMSE/utility (paper: 100).
        clf_reps: noisy repetitions for the classification protocols (each re-fits 4 models
            per fold; fewer than the utility repetitions where the cost is too high).
        classifiers: which of :data:`~gazeguard.offline.eval.attacks.CLASSIFIERS`.
        every_task: task recognition uses every n-th window (paper: 10).
        every_reid: re-identification uses every n-th window (paper: 5).
        insecure_seed: reproducible (INSECURE) noise seed, or None for the OS CSPRNG.
    """

    utility_reps: int = 100
    clf_reps: int = 5
    classifiers: tuple[str, ...] = CLASSIFIERS
    every_task: int = 10
    every_reid: int = 5
    insecure_seed: int | None = None


def _utility_summary(
    nmse_reps: list[FloatArray], rmse_reps: list[FloatArray], names: Sequence[str]
) -> dict[str, Any]:
    """Paper-style utility: 1/|NMSE| averaged per feature over recordings and repetitions, then
    over features. Undefined values (``x̄·x̃̄ = 0`` or NMSE exactly 0) are left out and counted."""
    N = np.stack(nmse_reps)  # (reps, R, F)
    U = utility(N)
    ok = np.isfinite(U)
    count = ok.sum(axis=(0, 1))
    total = np.where(ok, U, 0.0).sum(axis=(0, 1))
    per_feature = [float(t / c) if c else None for t, c in zip(total, count, strict=True)]
    defined = [v for v in per_feature if v is not None]
    per_rep = [float(U[i][ok[i]].mean()) for i in range(U.shape[0]) if ok[i].any()]
    absn = np.abs(N[np.isfinite(N)])
    return {
        "mean": float(np.mean(defined)) if defined else None,
        "std_over_reps": float(np.std(per_rep)) if per_rep else None,
        "nmse_median": float(np.median(absn)) if absn.size else None,
        "rmse_over_range": float(np.mean(np.stack(rmse_reps))),
        "undefined_fraction": float(1.0 - ok.mean()),
        "per_feature": dict(zip(names, per_feature, strict=True)),
    }


@dataclass
class _RepResults:
    """What the repetitions of one configuration accumulate.

    Attributes:
        nmse_reps: per utility repetition, (R, F) NMSE per recording and feature.
        rmse_reps: per utility repetition, (R, F) RMSE per recording and feature, as a fraction
            of each feature's public range.
        task_acc: task-recognition scores, per view and classifier.
        reid_acc: re-identification scores, per view and classifier.
        half_acc: first-half/second-half task scores (only with more than one task).
        chunks: chunks per recording of the last release, in recording order.
        released_rows: rows in the last release.
    """

    nmse_reps: list[FloatArray]
    rmse_reps: list[FloatArray]
    task_acc: ScoreLists
    reid_acc: ScoreLists
    half_acc: ScoreLists
    chunks: list[int]
    released_rows: int = 0


def _recording_errors(
    raw: FloatArray, released: FloatArray, recs: npt.NDArray[Any], span: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Per-recording utility errors of one release.

    ``raw`` and ``released`` are (M, F) values of the released rows, ``recs`` their (M,)
    recording ids, ``span`` the (F,) public range of each feature (1 where it is empty).
    Returns (R, F) NMSE and (R, F) RMSE as a fraction of ``span``, one row per recording in
    sorted id order.
    """
    nm, rm = [], []
    for rid in np.unique(recs):
        m = recs == rid
        nm.append(nmse(raw[m].T, released[m].T))
        rm.append(np.sqrt(np.mean((raw[m] - released[m]) ** 2, axis=0)) / span)
    return np.stack(nm), np.stack(rm)


@dataclass(frozen=True, slots=True)
class _Attacked:
    """One release as the classification protocols attack it.

    Attributes:
        values: (M, F) the release: what every model is trained on.
        views: what the models are tested on: the release, and the clean values of the same
            rows unless the release is the clean baseline.
        person, task, recording: (M,) of each released row.
        block: rows per released chunk: train/test cuts fall between chunks. FPA's chunk is the
            whole recording (longer than any cut allows), so its cut falls inside the one chunk
            (see :func:`gazeguard.offline.eval.metrics.split_point`).
    """

    values: FloatArray
    views: dict[str, FloatArray]
    person: npt.NDArray[Any]
    task: npt.NDArray[Any]
    recording: npt.NDArray[Any]
    block: int

    @classmethod
    def of(
        cls, table: FeatureTable, rel: Released, raw: FloatArray, spec: MechanismSpec, clean: bool
    ) -> _Attacked:
        """``rel`` of ``table`` released with ``spec``; ``raw``: the clean values of its rows."""
        views = {"release": rel.values} if clean else {"release": rel.values, "raw": raw}
        return cls(
            rel.values,
            views,
            table.person[rel.rows],
            table.task[rel.rows],
            table.recording[rel.rows],
            table.n_rows if spec.whole else int(spec.n or 1),
        )


def _classify_rep(
    acc: _RepResults,
    table: FeatureTable,
    rel: Released,
    raw: FloatArray,
    *,
    spec: MechanismSpec,
    clean: bool,
    settings: EvalSettings,
    seed: int,
    has_tasks: bool,
) -> None:
    """Run the classification protocols on one release and add their scores to ``acc``.

    ``raw`` is the (M, F) clean values of the released rows (attacked besides the release
    itself unless ``clean``); ``seed`` is this repetition's classifier seed.
    """
    a = _Attacked.of(table, rel, raw, spec, clean)
    clfs = settings.classifiers
    task_scores = task_recognition(
        a.values, a.views, a.task, a.person, a.recording,
        classifiers=clfs, every=settings.every_task, seed=seed,
    )  # fmt: skip
    collect_scores(acc.task_acc, task_scores)
    reid_scores = reidentification(
        a.values, a.views, a.person, a.recording,
        classifiers=clfs, every=settings.every_reid, seed=seed, block=a.block,
    )  # fmt: skip
    collect_scores(acc.reid_acc, reid_scores)
    if has_tasks:
        half_scores = half_split_protocol(
            a.values, a.views, a.task, a.recording,
            classifiers=clfs, every=settings.every_reid, seed=seed, block=a.block,
        )  # fmt: skip
        collect_scores(acc.half_acc, half_scores)


def _run_reps(
    table: FeatureTable,
    cols: IntArray,
    spec: MechanismSpec,
    mechanisms: MechanismCache | None,
    *,
    reps: int,
    settings: EvalSettings,
    bounds: FeatureBounds,
    job_seed: int,
) -> _RepResults:
    """Release the table ``reps`` times and score each release (utility, then classification).

    Stops early if a release keeps no rows. ``mechanisms`` is None for the clean baseline,
    which has no utility repetitions.
    """
    clean = mechanisms is None
    span = np.where(bounds.hi > bounds.lo, bounds.hi - bounds.lo, 1.0)
    acc = _RepResults([], [], {}, {}, {}, [])
    has_tasks = np.unique(table.task).size > 1
    for rep in range(reps):
        rel = release_table(table, cols, spec, mechanisms)
        acc.chunks, acc.released_rows = rel.chunks, int(rel.rows.size)
        if rel.rows.size == 0:
            break
        raw = table.X[np.ix_(rel.rows, cols)]
        if not clean and rep < settings.utility_reps:
            nm, rm = _recording_errors(raw, rel.values, table.recording[rel.rows], span)
            acc.nmse_reps.append(nm)
            acc.rmse_reps.append(rm)
        if rep < settings.clf_reps:
            _classify_rep(
                acc,
                table,
                rel,
                raw,
                spec=spec,
                clean=clean,
                settings=settings,
                seed=job_seed * 1000 + rep,
                has_tasks=has_tasks,
            )
    return acc


def user_epsilon(
    mechanisms: MechanismCache, eps: float, n_feat: int, chunks: list[int]
) -> dict[str, Any]:
    """User-level ε at δ 1e-6 of a whole released recording (its max and mean over
    recordings): the accountant's composition of every chunk's accounting events, as the
    ledger composes a session (``eps``, the configured axis value, only scales
    ``multiplier_max``: the largest recording's ε over it). A mechanism without accounting
    events (the paper's data-derived sensitivities) is composed sequentially."""
    from gazeguard.privacy.accounting import compose  # noqa: PLC0415

    mech = next(iter(mechanisms._by_n.values()), None)
    events = getattr(mech, "events", None)
    per_chunk = events() if callable(events) else None
    cache: dict[int, float] = {}

    def of(c: int) -> float:
        if c not in cache:
            cache[c] = (
                compose({e: k * c for e, k in per_chunk.items()}, 1e-6).epsilon
                if per_chunk
                else user_level_epsilon(eps, n_feat, c)
            )
        return cache[c]

    per_rec_eps = [of(c) for c in chunks if c > 0]
    top = max(per_rec_eps, default=0.0)
    return {
        "max": top,
        "mean": float(np.mean(per_rec_eps)) if per_rec_eps else 0.0,
        "multiplier_max": top / eps if eps > 0 else 0.0,
    }


def configuration_mechanisms(
    spec: MechanismSpec,
    epsilon: float | None,
    factory: MechanismFactory,
    settings: EvalSettings,
    job_seed: int,
) -> tuple[float, MechanismCache | None]:
    """ε as a number (0 for the clean release) and the mechanisms of one (mechanism, ε)
    configuration: None for the clean release (``none``, or ``epsilon`` None). ``job_seed``
    makes the insecure noise seeds differ between configurations."""
    eps = 0.0 if epsilon is None else float(epsilon)
    if spec.family == "none" or epsilon is None:
        return eps, None
    seed = None if settings.insecure_seed is None else settings.insecure_seed + 1_000_003 * job_seed
    return eps, MechanismCache(spec, eps, factory, seed)


def configuration_head(
    spec: MechanismSpec,
    eps: float,
    mechanisms: MechanismCache | None,
    n_feat: int,
    chunks: list[int],
) -> dict[str, Any]:
    """The first fields of a configuration's JSON row: the mechanism, ε (None for the clean
    release), the user-level ε of a recording (:func:`user_epsilon`) and the features
    released."""
    return {
        "mechanism": spec.key,
        "label": spec.label,
        "family": spec.family,
        "n": spec.n,
        "transform": spec.transform,
        "epsilon": None if mechanisms is None else eps,
        "epsilon_user": None
        if mechanisms is None
        else user_epsilon(mechanisms, eps, n_feat, chunks),
        "features_released": n_feat,
    }


def evaluate_configuration(
    table: FeatureTable,
    cols: IntArray,
    spec: MechanismSpec,
    epsilon: float | None,
    *,
    factory: MechanismFactory,
    settings: EvalSettings,
    bounds: FeatureBounds,
    job_seed: int = 0,
) -> dict[str, Any]:
    """Utility and classification results of one (mechanism, ε), JSON-ready.

    ``epsilon`` is None for ``none``. Utility averages ``settings.utility_reps`` releases;
    classification uses the first ``settings.clf_reps`` of them (one release serves both).
    ``job_seed`` makes classifier seeds (and insecure noise seeds) differ between configurations.
    """
    t0 = time.perf_counter()
    eps, mechanisms = configuration_mechanisms(spec, epsilon, factory, settings, job_seed)
    clean = mechanisms is None
    reps = settings.clf_reps if clean else max(settings.utility_reps, settings.clf_reps)
    acc = _run_reps(
        table,
        cols,
        spec,
        mechanisms,
        reps=reps,
        settings=settings,
        bounds=bounds,
        job_seed=job_seed,
    )
    chunks = acc.chunks
    return {
        **configuration_head(spec, eps, mechanisms, int(cols.size), chunks),
        "rows_released": acc.released_rows,
        "rows_dropped": int(table.n_rows - acc.released_rows),
        "chunks_per_recording": {"min": min(chunks, default=0), "max": max(chunks, default=0)},
        # Recordings whose train/test cut falls inside one released chunk (a single chunk, e.g.
        # FPA): one noise draw on both sides, so "re-identification" links two halves of it.
        "split_inside_chunk": 0 if clean else sum(1 for c in chunks if c == 1),
        "k": None if mechanisms is None else mechanisms.k(),
        "reps": {"utility": len(acc.nmse_reps), "clf": min(reps, settings.clf_reps)},
        "utility": _utility_summary(
            acc.nmse_reps, acc.rmse_reps, [table.feature_names[int(c)] for c in cols]
        )
        if acc.nmse_reps
        else None,
        "task": summarise_scores(acc.task_acc),
        "task_half": summarise_scores(acc.half_acc),
        "reid": summarise_scores(acc.reid_acc),
        "elapsed_s": time.perf_counter() - t0,
    }
