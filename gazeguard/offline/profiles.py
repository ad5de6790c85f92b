"""Building release profiles from labelled public recordings (``gazeguard profile build``).

The profile format and its loading are :mod:`gazeguard.signal.profiles`; this module chooses a
profile's features, size and noise with the offline evaluation (:mod:`gazeguard.offline.eval`).

How a profile is built (:func:`build_profile`)
    1. **Features** come from the service's own extraction (``extract_features`` through the
       evaluation datasets' feature cache). Features that are non-finite or constant on the build
       data carry nothing and are not candidates.
    2. **Noise.** The profile is built *for a noise level*: a stream mechanism and an ε per
       feature per chunk (e.g. CFPA-32 (dct) at ε 4.8), with the production mechanisms and
       public bounds. The release noise variance ``σ²_j`` of each feature is measured by
       releasing the public table once.
    3. **Ranking** (``criterion``). The default ``info-ratio`` ranks feature ``j`` by

       ``I_task / I_id``, with ``I_task = ½ ln(1 + v_task / (v_within-task + σ²_j))`` and
       ``I_id = ½ ln(1 + v_person|task / (v_within-recording + σ²_j))``,

       the Gaussian-channel information (nats per window) a single released window carries about
       the task, and about *who* is doing a given task. ``v_task`` is the variance of the task
       means, ``v_within-task`` everything else (people, their task-specific habits, time,
       …); ``v_person|task`` the variance of recording means around their task's mean and
       ``v_within-recording`` the variance inside a recording. These are exactly the two
       problems the evaluation poses: leave-one-person-out task recognition must separate tasks
       across people, and the re-identification attack (first half of each recording trains,
       second half tests) separates people *within* a task by the stable offsets of their
       recordings. Why not the raw ANOVA F ratio (``f-ratio``, also available)? It ignores the
       noise: on gazegraph ``wordbook3_mean`` has task F 2332 vs person F 208, but its whole
       spread is 0.16 % of its public range, far below any DP noise calibrated to that range —
       released, it carries nothing while costing ε. With ``σ²`` in
       both denominators a feature counts only with what survives the noise. A ratio rather
       than a difference because the frontier's constraint is on identity: a feature that adds
       little task information but almost no identity is worth more than one that adds much of
       both. Degenerate features (spread below ``1e-9`` of the public range) score 0.
    4. **Size by the frontier.** For each ε and each size ``k = 1 … F`` the top-``k`` features
       are released (the production mechanism, per recording, tail dropped) and scored as
       ``gazeguard eval`` does: task accuracy leave-one-person-out, re-identification first half
       → second half (cut between chunks), k-NN/SVM/DT/RF on every 10th/5th window, best
       classifier per window, mean over ``reps`` noisy releases. The chosen ``(k, ε)`` has the
       best task accuracy among those whose re-identification is within ``tolerance`` (2
       points) of chance ``1/people``: re-identification at chance is the privacy requirement
       (the attacker does no better than guessing, up to the estimate's noise), and within it
       utility is what a consumer buys. Among points within ``margin`` (1 point) of that best
       task accuracy, the cheapest (fewest ``k × ε``) wins: equal utility for less budget. The
       pick is then **confirmed** on ``confirm_reps`` fresh releases (the maximum over a noisy
       frontier is optimistic); if re-identification is no longer within the tolerance the next
       candidate is tried.
    5. **Suggested budget.** ``ε × k × chunks per hour`` (pure ε, sequential composition over
       features and chunks: the honest user-level figure per hour of gaze).

:mod:`gazeguard.offline.eval` is imported inside the functions that score candidates: that
package imports scikit-learn (the ``eval`` extra), which reading profiles and their budgets does
not need.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from gazeguard import __version__
from gazeguard.config import FeatureSettings
from gazeguard.core.errors import ConfigError
from gazeguard.plan import chunks_per_hour as plan_chunks_per_hour
from gazeguard.plan.chunks import laplace_releases_epsilon
from gazeguard.signal.profiles import Profile, SuggestedBudget

if TYPE_CHECKING:
    from gazeguard.offline.eval.grid import MechanismSpec
    from gazeguard.signal.dataset import FeatureTable

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]
Progress = Callable[[str], None]

CRITERIA: Final = ("info-ratio", "f-ratio")
#: Spread below this fraction of a feature's public range counts as none (degenerate features).
DEGENERATE_FRACTION: Final = 1e-9


def _noop(_: str) -> None:
    return None


@dataclass(frozen=True)
class FeatureScore:
    """How much task and how much identity one feature carries under the release noise.

    Attributes:
        name: feature name.
        score: the ranking score (higher: more task, less identity).
        task_info, identity_info: ``I_task`` and ``I_id``, nats per window (see module doc).
        f_task, f_person: clean one-way ANOVA F statistics of task and of person (windows).
        noise_sd: release noise standard deviation, feature unit.
    """

    name: str
    score: float
    task_info: float
    identity_info: float
    f_task: float
    f_person: float
    noise_sd: float


def _anova_f(X: FloatArray, groups: npt.NDArray[np.str_], floor: FloatArray) -> FloatArray:
    """One-way ANOVA F per column of X (N, F) for ``groups`` (N,); ``floor`` (F,) regularises."""
    labels = np.unique(groups)
    n, k = X.shape[0], labels.size
    grand = X.mean(axis=0)
    ssb = np.zeros(X.shape[1])
    ssw = np.zeros(X.shape[1])
    for g in labels:
        m = groups == g
        mu = X[m].mean(axis=0)
        ssb += m.sum() * (mu - grand) ** 2
        ssw += ((X[m] - mu) ** 2).sum(axis=0)
    return np.asarray((ssb / max(k - 1, 1)) / (ssw / max(n - k, 1) + floor), np.float64)


def variance_components(
    X: FloatArray, task: npt.ArrayLike, recording: npt.ArrayLike
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Per-column variance components of windows X (N, F), each (F,), summing in pairs to the
    total variance: ``v_task + v_within_task`` and ``v_task + v_person_task + v_within_rec``.

    Returns:
        ``(v_task, v_within_task, v_person_task, v_within_rec)``: variance of the task means,
        within tasks, of recording means around their task's mean, and within recordings.
    """
    t = np.asarray(task).astype(str)
    r = np.asarray(recording).astype(str)
    n = X.shape[0]
    grand = X.mean(axis=0)
    vt, vwt, vpt, vwr = (np.zeros(X.shape[1]) for _ in range(4))
    for g in np.unique(t):
        m = t == g
        mt = X[m].mean(axis=0)
        vt += m.sum() * (mt - grand) ** 2
        vwt += ((X[m] - mt) ** 2).sum(axis=0)
        for rec in np.unique(r[m]):
            mr = m & (r == rec)
            mu = X[mr].mean(axis=0)
            vpt += mr.sum() * (mu - mt) ** 2
            vwr += ((X[mr] - mu) ** 2).sum(axis=0)
    return vt / n, vwt / n, vpt / n, vwr / n


def rank_features(
    table: FeatureTable,
    cols: IntArray,
    noise_var: FloatArray,
    criterion: str = "info-ratio",
    public_range: FloatArray | None = None,
) -> list[FeatureScore]:
    """Score and rank the ``cols`` features of ``table`` (best first).

    Args:
        table: labelled public windows (task, person, recording).
        cols: (F,) candidate columns.
        noise_var: (F,) release noise variance of each candidate, feature unit² (zeros: clean).
        criterion: ``info-ratio`` (default, noise-aware; see the module docstring) or
            ``f-ratio`` (clean ANOVA F of task over F of person).
        public_range: (F,) ``hi − lo`` of each candidate, for the degenerate-feature floor.

    Returns:
        One :class:`FeatureScore` per candidate, highest score first (stable for ties).
    """
    if criterion not in CRITERIA:
        raise ConfigError("criterion", criterion, f"choose from {', '.join(CRITERIA)}")
    X = table.X[:, cols]
    rng = np.ones(cols.size) if public_range is None else np.asarray(public_range, np.float64)
    floor = (DEGENERATE_FRACTION * rng) ** 2
    s2 = np.asarray(noise_var, np.float64)
    vt, vwt, vpt, vwr = variance_components(X, table.task, table.recording)
    degenerate = np.sqrt(vt + vwt) <= DEGENERATE_FRACTION * rng
    i_task = 0.5 * np.log1p(vt / (vwt + s2 + floor))
    i_id = 0.5 * np.log1p(vpt / (vwr + s2 + floor))
    f_task = _anova_f(X, table.task, floor)
    f_person = _anova_f(X, table.person, floor)
    if criterion == "info-ratio":
        score = i_task / np.maximum(i_id, 1e-12)
    else:
        score = f_task / np.maximum(f_person, 1e-12)
    score = np.where(degenerate | ~np.isfinite(score), 0.0, score)
    names = [table.feature_names[int(c)] for c in cols]
    out = [
        FeatureScore(
            names[j],
            float(score[j]),
            float(i_task[j]),
            float(i_id[j]),
            float(f_task[j]),
            float(f_person[j]),
            float(math.sqrt(max(s2[j], 0.0))),
        )
        for j in range(cols.size)
    ]
    order = sorted(range(len(out)), key=lambda j: -out[j].score)
    return [out[j] for j in order]


# ------------------------------------------------------------------------------ frontier
@dataclass(frozen=True)
class FrontierPoint:
    """Task and re-identification of the top-``size`` features at one noise level.

    Accuracies are the best classifier's, per window, mean over repetitions; ``*_vote`` after a
    majority vote per recording.
    """

    size: int
    epsilon: float | None
    task: float
    task_classifier: str
    task_vote: float
    reid: float
    reid_classifier: str
    reid_vote: float
    reps: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, rounded to 4 decimals."""
        return {
            "size": self.size,
            "epsilon": self.epsilon,
            "task": round(self.task, 4),
            "task_classifier": self.task_classifier,
            "task_vote": round(self.task_vote, 4),
            "reid": round(self.reid, 4),
            "reid_classifier": self.reid_classifier,
            "reid_vote": round(self.reid_vote, 4),
            "reps": self.reps,
        }


def check_stream_mechanism(spec: MechanismSpec) -> None:
    """Refuse mechanisms a live profile cannot be built for (FPA, dataset releases)."""
    if spec.family != "none" and (spec.kind is None or not spec.kind.online):
        raise ConfigError(
            "mechanism",
            spec.key,
            "a profile is built for a live stream mechanism: none, lpa-N, cfpa-N-dft|dct or "
            "dcfpa-N-dft|dct (FPA needs the whole recording; dataset releases are offline)",
            "argument",
        )


def _bounds(names: Sequence[str], window_s: float, step_s: float) -> Any:
    from gazeguard.offline.eval.runner import public_bounds  # noqa: PLC0415 - the eval extra

    return public_bounds(names, window_s, step_s)


def noise_variance(
    table: FeatureTable,
    cols: IntArray,
    spec: MechanismSpec,
    epsilon: float | None,
    *,
    k: int | str = "auto",
    window_s: float = 30.0,
    step_s: float = 0.5,
    seed: int | None = None,
) -> FloatArray:
    """Per-window release noise variance of each ``cols`` feature, (F,), feature unit²: the mean
    squared difference between one production release of the public table and its clean values
    (zeros for ``none``)."""
    from gazeguard.offline.eval.harness import (  # noqa: PLC0415 - the eval extra
        MechanismCache,
        gazeguard_factory,
        release_table,
    )

    if spec.family == "none" or epsilon is None:
        return np.zeros(cols.size)
    names = [table.feature_names[int(c)] for c in cols]
    cache = MechanismCache(
        spec, float(epsilon), gazeguard_factory(_bounds(names, window_s, step_s), k), seed
    )
    rel = release_table(table, cols, spec, cache)
    diff = rel.values - table.X[np.ix_(rel.rows, cols)]
    return np.asarray(np.mean(diff**2, axis=0), np.float64)


def evaluate_point(
    table: FeatureTable,
    cols: IntArray,
    spec: MechanismSpec,
    epsilon: float | None,
    *,
    reps: int = 3,
    classifiers: Sequence[str] = ("knn", "svm", "dt", "rf"),
    every_task: int = 10,
    every_reid: int = 5,
    k: int | str = "auto",
    window_s: float = 30.0,
    step_s: float = 0.5,
    seed: int | None = None,
    job_seed: int = 0,
) -> FrontierPoint:
    """Release the ``cols`` features of every recording ``reps`` times with ``spec`` at
    ``epsilon`` and score task recognition (leave one person out) and re-identification (first
    half → second half, cut between chunks), as ``gazeguard eval`` does."""
    from gazeguard.offline.eval.attacks import (  # noqa: PLC0415 - the eval extra
        reidentification,
        task_recognition,
    )
    from gazeguard.offline.eval.harness import (  # noqa: PLC0415 - the eval extra
        MechanismCache,
        gazeguard_factory,
        release_table,
    )

    clean = spec.family == "none" or epsilon is None
    names = [table.feature_names[int(c)] for c in cols]
    cache = (
        None
        if clean
        else MechanismCache(
            spec,
            float(epsilon),  # type: ignore[arg-type]
            gazeguard_factory(_bounds(names, window_s, step_s), k),
            None if seed is None else seed + 7919 * job_seed,
        )
    )
    acc: dict[str, dict[str, list[float]]] = {}
    n_reps = 1 if clean else reps
    for rep in range(n_reps):
        rel = release_table(table, cols, spec, cache)
        who, task, rec = table.person[rel.rows], table.task[rel.rows], table.recording[rel.rows]
        cseed = 1000 * job_seed + rep
        view = {"release": rel.values}
        t = task_recognition(
            rel.values, view, task, who, rec, classifiers=classifiers, every=every_task, seed=cseed
        )
        r = reidentification(
            rel.values,
            view,
            who,
            rec,
            classifiers=classifiers,
            every=every_reid,
            seed=cseed,
            block=int(spec.n or 1),
        )
        for what, res in (("task", t), ("reid", r)):
            for clf, s in res.get("release", {}).items():
                acc.setdefault(f"{what}:window:{clf}", {}).setdefault("v", []).append(s.window)
                acc.setdefault(f"{what}:vote:{clf}", {}).setdefault("v", []).append(s.vote)

    def best(what: str, mode: str) -> tuple[str, float]:
        vals = [
            (key.rsplit(":", 1)[1], float(np.mean(d["v"])))
            for key, d in acc.items()
            if key.startswith(f"{what}:{mode}:")
        ]
        return max(vals, key=lambda cv: cv[1]) if vals else ("", float("nan"))

    tc, ta = best("task", "window")
    rc, ra = best("reid", "window")
    return FrontierPoint(
        size=int(cols.size),
        epsilon=None if clean else float(epsilon),  # type: ignore[arg-type]
        task=ta,
        task_classifier=tc,
        task_vote=best("task", "vote")[1],
        reid=ra,
        reid_classifier=rc,
        reid_vote=best("reid", "vote")[1],
        reps=n_reps,
    )


def candidate_columns(table: FeatureTable) -> tuple[IntArray, dict[str, str]]:
    """Columns that can be ranked: finite and not constant (``gazeguard eval``'s rule)."""
    from gazeguard.offline.eval.runner import select_features  # noqa: PLC0415 - the eval extra

    return select_features(table)


def suggested_budget(
    spec: MechanismSpec, size: int, epsilon: float, step_s: float, delta: float = 1e-6
) -> SuggestedBudget:
    """What releasing ``size`` features with ``spec`` at ``epsilon`` per feature per chunk costs
    per hour of gaze, user-level at ``delta``: the PLD accountant's composition of
    ``size ×`` :func:`gazeguard.plan.chunks_per_hour` (a 30 s window) Laplace releases of noise
    multiplier ``1/epsilon`` (:func:`gazeguard.plan.chunks.laplace_releases_epsilon`), with the
    pure sequential sum beside it."""

    cph = plan_chunks_per_hour(FeatureSettings(window_s=30.0, step_s=step_s), int(spec.n or 1))
    releases = size * cph
    return SuggestedBudget(
        per_hour=laplace_releases_epsilon(epsilon, releases, delta),
        epsilon_per_feature_per_chunk=epsilon,
        mechanism=spec.key,
        chunk_steps=int(spec.n or 1),
        step_s=step_s,
        chunks_per_hour=float(cph),
        delta=delta,
        pure_per_hour=epsilon * releases,
        composition=f"user-level ε at δ {delta:g} per hour of gaze (PLD accountant over "
        f"{size} features × {cph} chunks); pure sequential in pure_per_hour",
    )


@dataclass(frozen=True)
class BuildSettings:
    """Knobs of :func:`build_profile`.

    Attributes:
        criterion: ranking criterion (:data:`CRITERIA`).
        max_size: largest profile size evaluated (None: every candidate feature).
        reps: noisy releases per frontier point.
        confirm_reps: fresh releases that confirm the pick.
        tolerance: "at chance" means re-identification ≤ 1/people + tolerance.
        margin: task accuracies within this of the best count as equal (cheapest wins).
        classifiers: which of k-NN/SVM/DT/RF.
        every_task, every_reid: every n-th window for task / re-identification.
        k: kept coefficients (``auto``: from the public prior).
        window_s, step_s: the feature window and step of the table.
        insecure_seed: reproducible (INSECURE) noise for tests; None: the OS CSPRNG.
    """

    criterion: str = "info-ratio"
    max_size: int | None = None
    reps: int = 3
    confirm_reps: int = 5
    tolerance: float = 0.02
    margin: float = 0.01
    classifiers: tuple[str, ...] = ("knn", "svm", "dt", "rf")
    every_task: int = 10
    every_reid: int = 5
    k: int | str = "auto"
    window_s: float = 30.0
    step_s: float = 0.5
    insecure_seed: int | None = None


def build_profile(
    table: FeatureTable,
    *,
    name: str,
    task: str,
    spec: MechanismSpec,
    epsilons: Sequence[float],
    settings: BuildSettings | None = None,
    provenance: dict[str, Any] | None = None,
    progress: Progress = _noop,
) -> Profile:
    """Select a release profile for ``task`` from a labelled public feature table.

    Args:
        table: labelled public windows (``table.task`` is the task, ``table.person`` the
            identity); never a user's data.
        name: the profile's name; task: what it is for.
        spec: the stream mechanism the profile is built for (``none``, LPA, CFPA, DCFPA).
        epsilons: ε per feature per chunk to consider (the noise levels).
        settings: see :class:`BuildSettings`.
        provenance: merged into ``built`` (dataset name, fingerprint, command line…).
        progress: receives one line per evaluated point.

    Raises:
        ConfigError: bad arguments, fewer than two people or tasks, or no size keeps
            re-identification at chance at any of the noise levels (lower ε or a stronger
            mechanism, then).
    """
    st = settings or BuildSettings()
    eps_list, people, classes = _check_build(table, spec, epsilons, st)
    job = _Job(table, spec, eps_list, st, people, classes, progress)
    t0 = time.perf_counter()
    sweep = _sweep(job)
    chosen, confirmed, confirmations = _choose(job, sweep)
    key = "clean" if chosen.epsilon is None else f"{chosen.epsilon:g}"
    features = [table.feature_names[int(c)] for c in sweep.ordered_cols[key][: chosen.size]]
    budget = None
    if chosen.epsilon is not None:
        budget = suggested_budget(spec, chosen.size, chosen.epsilon, st.step_s)
    built = _built_record(job, sweep, chosen, confirmed, confirmations)
    built["elapsed_s"] = round(time.perf_counter() - t0, 1)
    built.update(provenance or {})
    return Profile(
        name=name,
        task=task,
        classes=classes,
        features=features,
        suggested_budget=budget,
        built=built,
    )


def _check_build(
    table: FeatureTable, spec: MechanismSpec, epsilons: Sequence[float], st: BuildSettings
) -> tuple[list[float | None], list[str], list[str]]:
    """The noise levels to sweep (``[None]``: clean), the people and the task classes.

    Raises:
        ConfigError: see :func:`build_profile`.
    """
    check_stream_mechanism(spec)
    if st.criterion not in CRITERIA:
        raise ConfigError("criterion", st.criterion, f"choose from {', '.join(CRITERIA)}")
    eps_list: list[float | None] = [None] if spec.family == "none" else [float(e) for e in epsilons]
    if not eps_list or any(e is not None and not (math.isfinite(e) and e > 0) for e in eps_list):
        raise ConfigError("epsilons", list(epsilons), "give one or more finite numbers > 0")
    people = sorted(set(table.person.tolist()))
    classes = sorted(set(table.task.tolist()))
    if len(people) < 2 or len(classes) < 2:
        raise ConfigError(
            "dataset",
            f"{len(people)} people, {len(classes)} tasks",
            "a profile needs labelled recordings of at least 2 people and 2 tasks",
        )
    return eps_list, people, classes


@dataclass(frozen=True, slots=True)
class _Job:
    """One :func:`build_profile` call's inputs, checked (``eps_list``: ``[None]`` is clean)."""

    table: FeatureTable
    spec: MechanismSpec
    eps_list: list[float | None]
    st: BuildSettings
    people: list[str]
    classes: list[str]
    progress: Progress


@dataclass(frozen=True, slots=True)
class _Sweep:
    """What :func:`_sweep` measured: per noise level (key ``clean`` or ``f"{ε:g}"``) the
    feature ranking and the candidate columns in that order, and every frontier point."""

    names_all: list[str]
    excluded: dict[str, str]  # feature → why it was not a candidate
    rankings: dict[str, list[FeatureScore]]
    ordered_cols: dict[str, IntArray]
    frontier: list[FrontierPoint]
    limit: float  # re-identification accuracy counted as "at chance" (1/people + tolerance)
    chance: float  # 1/people


# The BuildSettings fields every evaluate_point call of a build passes on as they are.
_POINT_SETTINGS = ("classifiers", "every_task", "every_reid", "k", "window_s", "step_s")


def _evaluate(
    job: _Job, cols: IntArray, epsilon: float | None, *, reps: int, seed: int | None, job_seed: int
) -> FrontierPoint:
    """:func:`evaluate_point` of the ``cols`` features at ``epsilon`` (per feature per chunk),
    ``reps`` releases, with the job's :data:`_POINT_SETTINGS`."""
    same = {name: getattr(job.st, name) for name in _POINT_SETTINGS}
    return evaluate_point(
        job.table, cols, job.spec, epsilon, reps=reps, seed=seed, job_seed=job_seed, **same
    )


def _sweep(job: _Job) -> _Sweep:
    """Rank the candidate features at each noise level and evaluate every profile size."""
    table, spec, st, progress = job.table, job.spec, job.st, job.progress
    chance = 1.0 / len(job.people)
    cols, excluded = candidate_columns(table)
    names_all = [table.feature_names[int(c)] for c in cols]
    b = _bounds(names_all, st.window_s, st.step_s)
    prange = np.asarray(b.hi - b.lo, np.float64)
    max_size = cols.size if st.max_size is None else max(1, min(st.max_size, cols.size))
    limit = chance + st.tolerance
    seed = st.insecure_seed
    t0 = time.perf_counter()

    rankings: dict[str, list[FeatureScore]] = {}
    frontier: list[FrontierPoint] = []
    ordered_cols: dict[str, IntArray] = {}
    for i, eps in enumerate(job.eps_list):
        key = "clean" if eps is None else f"{eps:g}"
        nv = noise_variance(
            table,
            cols,
            spec,
            eps,
            k=st.k,
            window_s=st.window_s,
            step_s=st.step_s,
            seed=None if seed is None else seed + 104729 * i,
        )
        ranking = rank_features(table, cols, nv, st.criterion, prange)
        rankings[key] = ranking
        order = np.array([cols[names_all.index(s.name)] for s in ranking], dtype=np.intp)
        ordered_cols[key] = order
        progress(
            f"ε={key}: ranking ({st.criterion}) "
            + ", ".join(f"{s.name} {s.score:.3g}" for s in ranking[:6])
            + (" …" if len(ranking) > 6 else "")
        )
        for size in range(1, max_size + 1):
            pt = _evaluate(
                job, order[:size], eps, reps=st.reps, seed=seed, job_seed=1 + 100 * i + size
            )
            frontier.append(pt)
            ok = "at chance" if pt.reid <= limit else ""
            progress(
                f"ε={key} size {size:2d}: task {pt.task:.3f} ({pt.task_classifier}), "
                f"re-id {pt.reid:.3f} ({pt.reid_classifier}) {ok} "
                f"[{time.perf_counter() - t0:.0f} s]"
            )
    return _Sweep(names_all, excluded, rankings, ordered_cols, frontier, limit, chance)


def _choose(job: _Job, sweep: _Sweep) -> tuple[FrontierPoint, FrontierPoint, list[dict[str, Any]]]:
    """The chosen frontier point, its confirmation on fresh releases, and every confirmation
    tried: the best task accuracy at chance re-identification, near-ties broken by cost.

    Raises:
        ConfigError: no point keeps re-identification at chance, or none is confirmed.
    """
    spec, st, eps_list, progress = job.spec, job.st, job.eps_list, job.progress
    frontier, limit, seed = sweep.frontier, sweep.limit, st.insecure_seed

    def cost(p: FrontierPoint) -> float:
        return p.size * (p.epsilon if p.epsilon is not None else 0.0)

    qualifying = [p for p in frontier if p.reid <= limit]
    if not qualifying:
        best_reid = min(frontier, key=lambda p: p.reid)
        raise ConfigError(
            "epsilons",
            [e for e in eps_list if e is not None] or "clean",
            f"no profile size keeps re-identification within {st.tolerance:g} of chance "
            f"({sweep.chance:.3f}) with {spec.key}; the lowest was {best_reid.reid:.3f} (size "
            f"{best_reid.size}, ε {best_reid.epsilon}); use a smaller ε or a stronger mechanism",
        )
    # Candidates: by task accuracy, near-ties (within margin) broken by cost, then size.
    top = max(p.task for p in qualifying)
    near = sorted(
        (p for p in qualifying if p.task >= top - st.margin),
        key=lambda p: (cost(p), p.size, -p.task),
    )
    rest = sorted((p for p in qualifying if p.task < top - st.margin), key=lambda p: -p.task)
    candidates = near + rest
    confirmations: list[dict[str, Any]] = []
    for j, cand in enumerate(candidates[:3]):
        key = "clean" if cand.epsilon is None else f"{cand.epsilon:g}"
        confirm = _evaluate(
            job,
            sweep.ordered_cols[key][: cand.size],
            cand.epsilon,
            reps=st.confirm_reps,
            seed=None if seed is None else seed + 31337,
            job_seed=9000 + j,
        )
        confirmations.append({"candidate": cand.as_dict(), "confirmation": confirm.as_dict()})
        progress(
            f"confirm size {cand.size} ε {key}: task {confirm.task:.3f}, re-id "
            f"{confirm.reid:.3f} ({'ok' if confirm.reid <= limit else 'above chance'})"
        )
        if confirm.reid <= limit:
            return cand, confirm, confirmations
    raise ConfigError(
        "epsilons",
        [e for e in eps_list if e is not None],
        f"the best frontier points did not keep re-identification within {st.tolerance:g} "
        f"of chance on {st.confirm_reps} fresh releases; use a smaller ε",
    )


def _built_record(
    job: _Job,
    sweep: _Sweep,
    chosen: FrontierPoint,
    confirmed: FrontierPoint,
    confirmations: list[dict[str, Any]],
) -> dict[str, Any]:
    """The profile file's ``built`` record: how it was chosen, from what, and every score."""
    st, eps_list = job.st, job.eps_list
    return {
        "criterion": st.criterion,
        "noise": {
            "mechanism": job.spec.key,
            "epsilons": [e for e in eps_list if e is not None],
            "k": st.k,
        },
        "window_s": st.window_s,
        "step_s": st.step_s,
        "people": len(job.people),
        "rows": job.table.n_rows,
        "candidates": len(sweep.names_all),
        "excluded": sweep.excluded,
        "chance": {"task": 1.0 / len(job.classes), "reid": sweep.chance},
        "rule": (
            f"highest task accuracy (best classifier, per window, leave-one-person-out) among "
            f"(size, ε) whose re-identification (best classifier, per window, first half → "
            f"second half) is ≤ 1/people + {st.tolerance:g}; within {st.margin:g} of that "
            "accuracy the fewest size × ε; confirmed on fresh releases"
        ),
        "protocol": {
            "reps": st.reps,
            "confirm_reps": st.confirm_reps,
            "classifiers": list(st.classifiers),
            "every_task": st.every_task,
            "every_reid": st.every_reid,
        },
        "chosen": chosen.as_dict(),
        "confirmation": confirmed.as_dict(),
        "confirmations_tried": confirmations,
        "scores": {
            k_: [
                {
                    "feature": s.name,
                    "score": round(s.score, 6),
                    "task_info": round(s.task_info, 6),
                    "identity_info": round(s.identity_info, 6),
                    "f_task": round(s.f_task, 3),
                    "f_person": round(s.f_person, 3),
                    "noise_sd": float(f"{s.noise_sd:.4g}"),
                }
                for s in ranking
            ]
            for k_, ranking in sweep.rankings.items()
        },
        "frontier": [p.as_dict() for p in sweep.frontier],
        "noise_source": "INSECURE-seeded" if st.insecure_seed is not None else "os-csprng",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "gazeguard_version": __version__,
    }
