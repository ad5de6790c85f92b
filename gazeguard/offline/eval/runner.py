"""Run a whole evaluation grid on one dataset: features → jobs (in parallel) → one result dict.

:func:`evaluate_dataset` extracts (or loads cached) features, picks the features to release,
analyses their temporal correlation, runs every (mechanism, ε) configuration — in worker
processes with ``jobs > 1`` — reporting progress with elapsed time and ETA, and finally selects
the best configuration by the criterion "re-identification at chance (within ``tolerance`` of
1/people) with the highest task accuracy".
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from gazeguard import __version__
from gazeguard.core.errors import ConfigError, GazeguardError
from gazeguard.offline.eval.correlation import correlation_analysis
from gazeguard.offline.eval.datasets import Dataset
from gazeguard.offline.eval.grid import RELEASE_FAMILIES, MechanismSpec
from gazeguard.offline.eval.harness import (
    EvalSettings,
    FeatureBounds,
    MechanismFactory,
    budget_factory,
    evaluate_configuration,
    gazeguard_factory,
)
from gazeguard.offline.eval.paper import NOT_PRIVATE, paper_factory
from gazeguard.offline.eval.releases import evaluate_release_configuration
from gazeguard.signal.dataset import FeatureTable

IntArray = npt.NDArray[np.intp]
Progress = Callable[[str], None]


def print_progress(msg: str) -> None:
    print(msg, flush=True)  # noqa: T201 - progress output of a CLI command


@dataclass(frozen=True)
class GridConfig:
    """What to evaluate on a dataset.

    Attributes:
        mechanisms: mechanism grid (``none`` is always evaluated once, as the baseline).
        epsilons: ε per feature per chunk.
        k: kept coefficients, an int or ``"auto"`` (from the public prior; never from the data).
        settings: repetitions and protocol knobs.
        window_s, step_s: feature window and step, s.
        jobs: worker processes (1: run in this process).
        cache_dir: feature cache (None: no cache).
        tolerance: "at chance" means re-identification ≤ 1/people + tolerance.
        correlation_lag: largest lag of the correlation analysis, steps.
        per_hour_noise: ``"laplace"`` or ``"gaussian"`` when ``epsilons`` are user-level ε per
            hour of gaze (budget mode: the noise the sidecar would calibrate), else ``None``
            (ε per feature per chunk, the paper's axis).
        sensitivity: ``"public"`` (the registry's bounds: the product's guarantee) or
            ``"paper"`` (Bozkir et al.'s data-dependent eq. 7, CFPA/DCFPA only; NOT private,
            to reproduce the paper: :mod:`gazeguard.offline.eval.paper`).
        features: release only these features (a release profile's list, in any order);
            ``None``: every feature that varies in the dataset.
        profile: the name of that profile, for the report (``None``: all features).
    """

    mechanisms: Sequence[MechanismSpec]
    epsilons: Sequence[float]
    k: int | str = "auto"
    settings: EvalSettings = field(default_factory=EvalSettings)
    window_s: float = 30.0
    step_s: float = 0.5
    jobs: int = 1
    cache_dir: Path | None = None
    tolerance: float = 0.02
    correlation_lag: int = 40
    sensitivity: Literal["public", "paper"] = "public"
    per_hour_noise: str | None = None
    features: Sequence[str] | None = None
    profile: str | None = None


def public_bounds(names: Sequence[str], window_s: float, step_s: float) -> FeatureBounds:
    """The registry's public bounds of ``names`` at this window and step
    (``gazeguard.signal.features.feature_bounds``); never derived from the data.

    Raises:
        ConfigError: a feature the registry does not know (e.g. a foreign feature table).
    """
    from gazeguard.signal.features import feature_bounds  # noqa: PLC0415 - heavy import

    lo, hi, max_step = feature_bounds(names, window_s, step_s)
    return FeatureBounds(
        np.asarray(lo, np.float64), np.asarray(hi, np.float64), np.asarray(max_step, np.float64)
    )


def select_features(table: FeatureTable) -> tuple[IntArray, dict[str, str]]:
    """Columns to release: finite everywhere and not constant over the whole dataset.

    A constant feature (e.g. blink rate in a recording without blinks or invalid samples)
    carries nothing for either side and its NMSE is undefined; releasing it would still cost
    ε. Returns the kept column indices and ``{excluded name: reason}``.
    """
    keep: list[int] = []
    excluded: dict[str, str] = {}
    for j, name in enumerate(table.feature_names):
        col = table.X[:, j]
        if not np.isfinite(col).all():
            excluded[name] = f"{int((~np.isfinite(col)).sum())} non-finite values"
        elif col.size == 0 or np.ptp(col) == 0.0:
            excluded[name] = "constant in this dataset"
        else:
            keep.append(j)
    return np.asarray(keep, dtype=np.intp), excluded


# ------------------------------------------------------------------ worker processes
_STATE: dict[str, Any] = {}


#: ``evaluate(table, cols, spec, epsilon, *, factory, settings, bounds, job_seed, **extra)``:
#: scores one stream configuration (default
#: :func:`~gazeguard.offline.eval.harness.evaluate_configuration`); a module-level function, so
#: that it pickles into the worker processes.
Evaluate = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class _Shared:
    """What every job of one dataset needs (pickled once into each worker)."""

    table: FeatureTable
    cols: IntArray
    bounds: FeatureBounds
    settings: EvalSettings
    factory: MechanismFactory
    evaluate: Evaluate = evaluate_configuration
    extra: dict[str, Any] = field(default_factory=dict)


def _init(shared: _Shared) -> None:
    _STATE["shared"] = shared


def _job(index: int, spec: MechanismSpec, epsilon: float | None) -> dict[str, Any]:
    sh: _Shared = _STATE["shared"]
    t0 = time.perf_counter()
    try:
        evaluate: Evaluate = sh.evaluate
        extra: dict[str, Any] = {"factory": sh.factory, **sh.extra}
        if spec.is_release:  # a dataset release takes no mechanism factory, no extra arguments
            evaluate, extra = evaluate_release_configuration, {}
        return evaluate(
            sh.table,
            sh.cols,
            spec,
            epsilon,
            settings=sh.settings,
            bounds=sh.bounds,
            job_seed=index,
            **extra,
        )
    except GazeguardError as exc:  # e.g. k-same with k above the number of people
        return {
            "mechanism": spec.key,
            "label": spec.label,
            "family": spec.family,
            "epsilon": epsilon,
            "error": str(exc),
            "elapsed_s": time.perf_counter() - t0,
        }


def _fmt_time(seconds: float) -> str:
    s = int(max(seconds, 0.0))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def headline(row: dict[str, Any]) -> str:
    """One line: utility, best task accuracy, strongest re-identification of a result row."""
    util = (row.get("utility") or {}).get("mean")
    parts = [f"utility {util:.3g}" if util is not None else "utility –"]
    for what in ("task", "reid"):
        best = best_accuracy(row, what, "release", "window")
        parts.append(f"{what} {best[1]:.2f} ({best[0]})" if best else f"{what} –")
    return ", ".join(parts)


def best_accuracy(row: dict[str, Any], what: str, view: str, mode: str) -> tuple[str, float] | None:
    """``(classifier, accuracy)`` of the best classifier for ``what`` (task/reid) in ``view``."""
    per = (row.get(what) or {}).get(view, {})
    vals = [(c, d[mode]["mean"]) for c, d in per.items() if np.isfinite(d[mode]["mean"])]
    return max(vals, key=lambda cv: cv[1]) if vals else None


def run_jobs(
    table: FeatureTable,
    cols: IntArray,
    bounds: FeatureBounds,
    grid: GridConfig,
    *,
    progress: Progress = print_progress,
    factory: MechanismFactory | None = None,
    label: str = "",
    evaluate: Evaluate = evaluate_configuration,
    extra: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Evaluate the clean baseline and every (mechanism, ε) of ``grid``; rows in grid order.

    ``evaluate`` scores each stream configuration (keyword arguments ``extra`` passed on);
    dataset releases always go to
    :func:`~gazeguard.offline.eval.releases.evaluate_release_configuration`."""
    jobs: list[tuple[MechanismSpec, float | None]] = [(MechanismSpec("none"), None)]
    for spec in grid.mechanisms:
        if spec.family == "none":
            continue
        if spec.family in ("ksame", "marginals"):  # no ε: one row each
            jobs.append((spec, None))
        else:
            jobs += [(spec, float(e)) for e in grid.epsilons]
    results: list[dict[str, Any] | None] = [None] * len(jobs)
    t0 = time.perf_counter()
    done = 0

    def report(i: int, row: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        results[i] = row
        elapsed = time.perf_counter() - t0
        eta = elapsed / done * (len(jobs) - done)
        eps = "" if row["epsilon"] is None else f" ε={row['epsilon']:g}"
        what = f"SKIPPED: {row['error']}" if "error" in row else headline(row)
        progress(
            f"[{done}/{len(jobs)}] {label}{row['label']}{eps}: {what} "
            f"({row['elapsed_s']:.0f}s; elapsed {_fmt_time(elapsed)}, ETA {_fmt_time(eta)})"
        )

    shared = _Shared(
        table, cols, bounds, grid.settings, factory or gazeguard_factory(bounds, grid.k),
        evaluate, dict(extra or {}),
    )  # fmt: skip
    init_args = (shared,)
    if grid.jobs <= 1:
        _init(shared)
        for i, (spec, eps) in enumerate(jobs):
            report(i, _job(i, spec, eps))
    else:
        # Fresh workers, not forks: a fork of a process whose OpenMP pool is running (any
        # scikit-learn k-NN before, e.g. the label evaluation of a previous dataset) deadlocks
        # in the child. The shared state travels pickled, once per worker.
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["gazeguard.offline.eval.runner"])
        with cf.ProcessPoolExecutor(grid.jobs, ctx, initializer=_init, initargs=init_args) as ex:
            futures = {ex.submit(_job, i, s, e): i for i, (s, e) in enumerate(jobs)}
            for fut in cf.as_completed(futures):
                report(futures[fut], fut.result())
    return [r for r in results if r is not None]


#: A task accuracy within this of chance is called at chance: never the best configuration.
TASK_MARGIN = 0.05


def best_configuration(
    rows: Sequence[dict[str, Any]],
    n_people: int,
    tolerance: float = 0.02,
    protocol: str = "bozkir",
    with_vote: bool = False,
    *,
    n_tasks: int | None = None,
) -> dict[str, Any] | None:
    """The private row with the highest task accuracy among those whose re-identification is at
    chance: the strongest classifier's accuracy (per window, and also after the majority vote
    when ``with_vote``) is at most ``1/n_people + tolerance``. With ``n_tasks``, a row whose
    task accuracy is not above ``1/n_tasks`` by more than :data:`TASK_MARGIN` (or
    ``tolerance``, if larger) is at chance itself and never chosen.

    Protocols:

    * ``"bozkir"`` — re-identification and task (leave one person out) trained and tested on
      the release. Dataset-release rows are left out: their release mixes the held-out person
      into the training data (k-same averages, Marginals' task marginals), so leave-one-person-out
      on the release is not a held-out test for them.
    * ``"david-john"`` — train on the release of the first halves, test on the raw second halves,
      for re-identification and for the task (``task_half``, raw view); every row takes part.

    Returns:
        ``{mechanism, label, epsilon, epsilon_user, task: (clf, acc), reid: (clf, acc),
        reid_vote: (clf, acc)}`` or None when no row qualifies (or no task is defined).
    """
    view, task_key = ("release", "task") if protocol == "bozkir" else ("raw", "task_half")
    limit = 1.0 / n_people + tolerance
    useful = -1.0 if n_tasks is None else 1.0 / n_tasks + max(tolerance, TASK_MARGIN)
    best: dict[str, Any] | None = None
    for row in rows:
        if row["family"] == "none" or "error" in row:
            continue
        if protocol == "bozkir" and row["family"] in RELEASE_FAMILIES:
            continue
        reid = best_accuracy(row, "reid", view, "window")
        vote = best_accuracy(row, "reid", view, "vote")
        task = best_accuracy(row, task_key, view, "window")
        if reid is None or task is None or reid[1] > limit or task[1] <= useful:
            continue
        if with_vote and (vote is None or vote[1] > limit):
            continue
        if best is None or task[1] > best["task"][1]:
            best = {
                "mechanism": row["mechanism"],
                "label": row["label"],
                "epsilon": row["epsilon"],
                "epsilon_user": row["epsilon_user"],
                "task": task,
                "reid": reid,
                "reid_vote": vote,
            }
    return best


def evaluate_dataset(
    dataset: Dataset,
    grid: GridConfig,
    progress: Progress = print_progress,
    factory: MechanismFactory | None = None,
    bounds: FeatureBounds | None = None,
) -> dict[str, Any]:
    """The whole evaluation of one dataset, JSON-ready (see
    :mod:`gazeguard.offline.eval.report`)."""
    t0 = time.perf_counter()
    progress(f"{dataset.name}: extracting features (W={grid.window_s:g} s, step {grid.step_s:g} s)")
    table = dataset.features(grid.window_s, grid.step_s, grid.cache_dir, progress)
    bounds = bounds or public_bounds(table.feature_names, grid.window_s, grid.step_s)
    cols, excluded = select_features(table)
    if grid.features is not None:
        wanted = set(grid.features)
        unknown = sorted(wanted - set(table.feature_names))
        if unknown:
            raise ConfigError(
                "features", ",".join(unknown), f"not in {dataset.name}'s feature table", "argument"
            )
        for j in cols.tolist():
            if table.feature_names[j] not in wanted:
                excluded[table.feature_names[j]] = f"not in the {grid.profile or 'given'} profile"
        cols = np.asarray([j for j in cols.tolist() if table.feature_names[j] in wanted], np.intp)
    sub = FeatureBounds(bounds.lo[cols], bounds.hi[cols], bounds.max_step[cols])
    people = sorted(set(table.person.tolist()))
    tasks = sorted(set(table.task.tolist()))
    recs = [r for r, _ in table.recordings()]
    progress(
        f"{dataset.name}: {len(people)} people, {len(tasks)} tasks, {len(recs)} recordings, "
        f"{table.n_rows} windows; releasing {cols.size} of {len(table.feature_names)} features"
        + (f" (excluded: {', '.join(excluded)})" if excluded else "")
    )
    correlation = correlation_analysis(table, cols.tolist(), grid.correlation_lag)
    if grid.sensitivity == "paper" and factory is None:
        progress(f"{dataset.name}: {NOT_PRIVATE}")
        factory = paper_factory(table, cols, sub, grid.k)
    elif grid.per_hour_noise is not None and factory is None:
        progress(
            f"{dataset.name}: ε axis = user-level ε per hour of gaze at δ 1e-6 "
            f"({grid.per_hour_noise} noise calibrated by the accountant)"
        )
        factory = budget_factory(
            sub, grid.k, grid.step_s, grid.per_hour_noise, window_s=grid.window_s
        )
    rows = run_jobs(
        table, cols, sub, grid, progress=progress, factory=factory, label=f"{dataset.name}: "
    )
    n, n_tasks = len(people), len(tasks) if len(tasks) > 1 else None
    best = {
        "bozkir": best_configuration(rows, n, grid.tolerance, n_tasks=n_tasks),
        "bozkir_with_vote": best_configuration(
            rows, n, grid.tolerance, with_vote=True, n_tasks=n_tasks
        ),
        "david_john": best_configuration(
            rows, n, grid.tolerance, protocol="david-john", n_tasks=n_tasks
        ),
    }
    s = grid.settings
    return {
        "dataset": dataset.name,
        "meta": {
            "gazeguard_version": __version__,
            "fingerprint": dataset.fingerprint(),
            "people": people,
            "tasks": tasks,
            "recordings": len(recs),
            "windows": table.n_rows,
            "window_s": grid.window_s,
            "step_s": grid.step_s,
            "chance_reid": 1.0 / len(people),
            "chance_task": 1.0 / len(tasks) if len(tasks) > 1 else None,
            "features_released": [table.feature_names[int(c)] for c in cols],
            "profile": grid.profile,
            "features_excluded": excluded,
            "k": grid.k,
            "epsilons": list(grid.epsilons),
            "mechanisms": [m.key for m in grid.mechanisms],
            "utility_reps": s.utility_reps,
            "clf_reps": s.clf_reps,
            "classifiers": list(s.classifiers),
            "every_task": s.every_task,
            "every_reid": s.every_reid,
            "noise": "OS CSPRNG"
            if s.insecure_seed is None
            else f"INSECURE reproducible seed {s.insecure_seed}",
            "tolerance": grid.tolerance,
            "sensitivity": "public" if grid.sensitivity == "public" else NOT_PRIVATE,
            "axis": "per-hour" if grid.per_hour_noise is not None else "per-chunk",
            "noise_family": grid.per_hour_noise or "laplace",
            "elapsed_s": time.perf_counter() - t0,
        },
        "correlation": correlation,
        "rows": rows,
        "best": best,
    }
