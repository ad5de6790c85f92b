"""Dataset-release mechanisms as rows of the evaluation (David-John et al., ETRA 2022).

``gazeguard.release`` privatizes a whole recorded feature dataset at once (k-same-select
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
from typing import Any

import numpy as np
import numpy.typing as npt

from gazeguard.dataset import FeatureTable
from gazeguard.eval.attacks import fit_and_score, half_split_protocol, task_recognition
from gazeguard.eval.grid import MechanismSpec
from gazeguard.eval.harness import (
    EvalSettings,
    FeatureBounds,
    ScoreLists,
    collect_scores,
    summarise_scores,
)
from gazeguard.eval.metrics import half_split, subsample

IntArray = npt.NDArray[np.intp]


def _rows(table: FeatureTable, rows: IntArray) -> FeatureTable:
    return FeatureTable(
        table.X[rows],
        table.t[rows],
        table.person[rows],
        table.task[rows],
        table.recording[rows],
        table.feature_names,
        table.feature_units,
    )


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
    """Parameters of ``gazeguard.release`` for ``spec`` (public bounds of the released features)."""
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

    Same keys as :func:`gazeguard.eval.harness.evaluate_configuration` (``utility`` is None),
    plus ``guarantee`` (the mechanism's own statement in words and numbers).
    """
    from gazeguard.release import RELEASE_MECHANISMS  # noqa: PLC0415 - optional stage

    t0 = time.perf_counter()
    mechanism = RELEASE_MECHANISMS[spec.family]
    sub = _columns(table, cols)
    params = release_params(spec, epsilon, sub.feature_names, bounds)
    train_rows, test_rows = half_split(table.recording)
    first = _rows(sub, train_rows)
    te = subsample(test_rows, table.recording, settings.every_reid)
    has_tasks = np.unique(table.task).size > 1
    task_acc: ScoreLists = {}
    half_acc: ScoreLists = {}
    reid_acc: ScoreLists = {}
    manifest: dict[str, Any] = {}
    released_rows = 0
    clfs = settings.classifiers
    for rep in range(settings.clf_reps):
        seed = (
            None
            if settings.insecure_seed is None
            else settings.insecure_seed + 1_000_003 * job_seed + 2 * rep
        )
        full = mechanism(sub, params, seed=seed)
        manifest = manifest or full.manifest
        # The attacks are scored against who really is who (k-same releases group ids only).
        R = full.oracle_table()
        released_rows = R.n_rows
        cseed = job_seed * 1000 + rep
        view = {"release": R.X}
        if has_tasks:
            collect_scores(
                task_acc,
                task_recognition(
                    R.X,
                    view,
                    R.task,
                    R.person,
                    R.recording,
                    classifiers=clfs,
                    every=settings.every_task,
                    seed=cseed,
                ),
            )
            collect_scores(
                half_acc,
                half_split_protocol(
                    R.X,
                    view,
                    R.task,
                    R.recording,
                    classifiers=clfs,
                    every=settings.every_reid,
                    seed=cseed,
                ),
            )
        collect_scores(
            reid_acc,
            half_split_protocol(
                R.X,
                view,
                R.person,
                R.recording,
                classifiers=clfs,
                every=settings.every_reid,
                seed=cseed,
            ),
        )
        # David-John protocol: release the first halves only, test on raw second halves.
        H = mechanism(first, params, seed=None if seed is None else seed + 1).oracle_table()
        tr = subsample(np.arange(H.n_rows), H.recording, settings.every_reid)
        raw = sub.X[te]
        collect_scores(
            reid_acc,
            fit_and_score(
                H.X[tr],
                H.person[tr],
                {"raw": (raw, sub.person[te], sub.recording[te])},
                classifiers=clfs,
                seed=cseed,
            ),
        )
        if has_tasks:
            collect_scores(
                half_acc,
                fit_and_score(
                    H.X[tr],
                    H.task[tr],
                    {"raw": (raw, sub.task[te], sub.recording[te])},
                    classifiers=clfs,
                    seed=cseed,
                ),
            )
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
        "task": summarise_scores(task_acc),
        "task_half": summarise_scores(half_acc),
        "reid": summarise_scores(reid_acc),
        "elapsed_s": time.perf_counter() - t0,
    }
