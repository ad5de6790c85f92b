"""Dataset-release mechanisms as rows of the evaluation (David-John et al., ETRA 2022).

``gazeguard.offline.release`` privatizes a whole recorded feature dataset at once (k-same-select
sequence, task-based Marginals with plausible deniability, Exponential-DP of Steil et al.).
Their output rows need not line up with the input (k-same pads and drops, Marginals is
synthetic), so utility is measured by classification only (no NMSE), and each repetition makes
two releases:

* **release view** — the mechanism on the whole table; every protocol (task leave-one-person-out,
  task across halves, re-identification across halves) is trained *and* tested on the release,
  like the stream mechanisms' Bozkir protocol;
* **raw view** — David-John et al.'s protocol: the mechanism on the *first half* of every
  recording only; the attacker (and the task model) trains on that release and is tested on the
  raw second halves. No row of the test data was ever part of the release.

The released features are the same columns the stream mechanisms release, with the same public
bounds (passed to the mechanisms as ``bounds``, ``range="public"``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from gazeguard.offline.eval.attacks import (
    Scores,
    fit_and_score,
    half_split_protocol,
    task_recognition,
)
from gazeguard.offline.eval.grid import MechanismSpec
from gazeguard.offline.eval.harness import (
    EvalSettings,
    FeatureBounds,
    ScoreLists,
    collect_scores,
    summarise_scores,
)
from gazeguard.offline.eval.metrics import half_split
from gazeguard.signal.dataset import FeatureTable, StrArray, subsample

if TYPE_CHECKING:
    from gazeguard.offline.release import ReleaseMechanism

IntArray = npt.NDArray[np.intp]


def _columns(table: FeatureTable, cols: IntArray) -> FeatureTable:
    return FeatureTable(
        table.X[:, cols],
        table.t,
        table.person,
        table.task,
        table.recording,
        tuple(table.feature_names[int(c)] for c in cols),
        tuple(table.feature_units[int(c)] for c in cols),
    )


def release_params(
    spec: MechanismSpec, epsilon: float | None, names: tuple[str, ...], bounds: FeatureBounds
) -> dict[str, object]:
    """Parameters of ``gazeguard.offline.release`` for ``spec`` (public bounds of the released
    features)."""
    public = {
        n: (float(lo), float(hi), float(st))
        for n, lo, hi, st in zip(names, bounds.lo, bounds.hi, bounds.max_step, strict=True)
    }
    if spec.family == "ksame":
        return {"k": spec.k}
    if spec.family == "marginals":
        return {"k": spec.k, "gamma": spec.gamma, "bounds": public, "range": "public"}
    if spec.family == "expdp":
        return {"epsilon": epsilon, "bounds": public, "range": "public"}
    msg = f"{spec.key!r} is not a dataset-release mechanism"
    raise ValueError(msg)


@dataclass
class _Reps:
    """What the repetitions of one dataset-release configuration accumulate.

    Attributes:
        task_acc: task recognition (leave-one-person-out) scores, per view and classifier.
        half_acc: task scores across recording halves, per view and classifier.
        reid_acc: re-identification scores across recording halves, per view and classifier.
        manifest: the manifest of the first whole-table release.
        released_rows: rows in the last whole-table release.
    """

    task_acc: ScoreLists = field(default_factory=dict)
    half_acc: ScoreLists = field(default_factory=dict)
    reid_acc: ScoreLists = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    released_rows: int = 0


def _score_release_view(
    acc: _Reps, R: FeatureTable, *, settings: EvalSettings, has_tasks: bool, seed: int
) -> None:
    """Train and test every protocol on the whole-table release ``R`` (real labels put back).

    ``seed`` is this repetition's classifier seed.
    """
    clfs = settings.classifiers
    view = {"release": R.X}

    def halves(labels: npt.ArrayLike) -> dict[str, dict[str, Scores]]:
        """Predict ``labels`` ((N,), per row of ``R``): each recording's first half trains, its
        second half tests."""
        return half_split_protocol(
            R.X, view, labels, R.recording, classifiers=clfs, every=settings.every_reid, seed=seed
        )

    if has_tasks:
        collect_scores(
            acc.task_acc,
            task_recognition(
                R.X,
                view,
                R.task,
                R.person,
                R.recording,
                classifiers=clfs,
                every=settings.every_task,
                seed=seed,
            ),
        )
        collect_scores(acc.half_acc, halves(R.task))
    collect_scores(acc.reid_acc, halves(R.person))


def _score_raw_view(
    acc: _Reps,
    H: FeatureTable,
    sub: FeatureTable,
    te: IntArray,
    *,
    settings: EvalSettings,
    has_tasks: bool,
    seed: int,
) -> None:
    """David-John protocol: train on the release ``H`` of the first halves, test on raw rows.

    ``sub`` is the table of released columns, ``te`` the (M,) indices of its subsampled
    second-half rows; ``seed`` is this repetition's classifier seed.
    """
    clfs = settings.classifiers
    tr = subsample(np.arange(H.n_rows), H.recording, settings.every_reid)
    raw = sub.X[te]

    def score(into: ScoreLists, released: StrArray, truth: StrArray) -> None:
        """Train on ``H`` with ``released`` (one label per row of ``H``), test on the raw rows
        with ``truth`` (one per row of ``sub``); add the scores to ``into``."""
        tests = {"raw": (raw, truth[te], sub.recording[te])}
        collect_scores(
            into, fit_and_score(H.X[tr], released[tr], tests, classifiers=clfs, seed=seed)
        )

    score(acc.reid_acc, H.person, sub.person)
    if has_tasks:
        score(acc.half_acc, H.task, sub.task)


def _run_reps(
    mechanism: ReleaseMechanism,
    table: FeatureTable,
    sub: FeatureTable,
    params: dict[str, object],
    *,
    settings: EvalSettings,
    job_seed: int,
) -> _Reps:
    """``settings.clf_reps`` repetitions, each with a whole-table and a first-halves release.

    ``table`` is the full feature table, ``sub`` its released columns.
    """
    train_rows, test_rows = half_split(table.recording)
    first = sub.take(train_rows)
    te = subsample(test_rows, table.recording, settings.every_reid)
    has_tasks = np.unique(table.task).size > 1
    acc = _Reps()
    for rep in range(settings.clf_reps):
        seed = (
            None
            if settings.insecure_seed is None
            else settings.insecure_seed + 1_000_003 * job_seed + 2 * rep
        )
        full = mechanism(sub, params, seed=seed)
        acc.manifest = acc.manifest or full.manifest
        # The attacks are scored against who really is who (k-same releases group ids only).
        R = full.oracle_table()
        acc.released_rows = R.n_rows
        cseed = job_seed * 1000 + rep
        _score_release_view(acc, R, settings=settings, has_tasks=has_tasks, seed=cseed)
        # David-John protocol: release the first halves only, test on raw second halves.
        H = mechanism(first, params, seed=None if seed is None else seed + 1).oracle_table()
        _score_raw_view(acc, H, sub, te, settings=settings, has_tasks=has_tasks, seed=cseed)
    return acc


def evaluate_release_configuration(
    table: FeatureTable,
    cols: IntArray,
    spec: MechanismSpec,
    epsilon: float | None,
    *,
    settings: EvalSettings,
    bounds: FeatureBounds,
    job_seed: int = 0,
) -> dict[str, Any]:
    """Classification results of one dataset-release configuration, JSON-ready.

    Same keys as :func:`gazeguard.offline.eval.harness.evaluate_configuration` (``utility`` is
    None),
    plus ``guarantee`` (the mechanism's own statement in words and numbers).
    """
    from gazeguard.offline.release import RELEASE_MECHANISMS  # noqa: PLC0415 - optional stage

    t0 = time.perf_counter()
    mechanism = RELEASE_MECHANISMS[spec.family]
    sub = _columns(table, cols)
    params = release_params(spec, epsilon, sub.feature_names, bounds)
    acc = _run_reps(mechanism, table, sub, params, settings=settings, job_seed=job_seed)
    manifest, released_rows = acc.manifest, acc.released_rows
    numbers = manifest.get("guarantee", {}).get("numbers", {})
    eps_user = numbers.get("epsilon_per_person_task")
    return {
        "mechanism": spec.key,
        "label": spec.label,
        "family": spec.family,
        "n": None,
        "transform": None,
        "epsilon": epsilon if spec.family == "expdp" else None,
        "epsilon_user": None
        if eps_user is None
        else {"max": float(eps_user), "mean": float(eps_user), "multiplier_max": int(cols.size)},
        "guarantee": manifest.get("guarantee"),
        "features_released": int(cols.size),
        "rows_released": int(released_rows),
        "rows_dropped": int(table.n_rows - released_rows),
        "chunks_per_recording": None,
        "k": None,
        "reps": {"utility": 0, "clf": settings.clf_reps},
        "utility": None,
        "task": summarise_scores(acc.task_acc),
        "task_half": summarise_scores(acc.half_acc),
        "reid": summarise_scores(acc.reid_acc),
        "elapsed_s": time.perf_counter() - t0,
    }
