"""Exponential-DP of Steil et al. (ETRA 2019), as David-John et al. (ETRA 2022, Sec. 3.3) describe
and re-implement it for comparison.

For each feature i take its range ``δ_i`` (max − min). For each task take ``t_max``, the largest
number of feature vectors any person has in it (shorter sequences count as padded to ``t_max`` by
repeating their last vector). Then for every released feature value:

    λ_i = ε / (2 · t_max · δ_i)
    y   ~ Exponential(scale 1/λ_i)           (mean 1/λ_i)
    r   = ± ln(y) / (λ_i · t_max)            (sign + or − with probability ½ each)
    released value = value + r

Since ``λ_i · t_max = ε / (2 δ_i)``, ``r = ±(2 δ_i / ε) · ln(y)``: the noise is a log-exponential
variable whose location grows with ``ln(2 t_max δ_i / ε)``. gazeguard reproduces this formula
exactly as printed so that the evaluation compares against the published mechanism; it does not
re-derive Steil et al.'s ε-DP proof (the draws are continuous floating-point samples, not the
snapped sampler gazeguard's own mechanisms use).

ε convention. Like the papers, ``epsilon`` is the per-feature noise parameter. By sequential
composition the guarantee for one person's whole sequence in one task is ``F · ε`` (F features),
and ``F · ε · (number of tasks)`` over all of a person's tasks; the manifest reports all three.

Ranges. ``range="public"`` (default) takes ``δ_i = hi − lo`` from declared public bounds — the
only choice compatible with a DP claim. ``range="data"`` is the paper's convention (the input's
own max − min); the manifest flags that the range itself then depends on the data. Padded rows
are never released: the output has exactly the input's rows.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gazeguard.offline.release._common import (
    RANGE_SOURCES,
    FloatArray,
    Params,
    Progress,
    Release,
    ReleaseRandom,
    feature_ranges,
    no_progress,
    require_finite,
    task_sequences,
)
from gazeguard.signal.dataset import FeatureTable

NAME = "expdp"


def expdp_lambda(epsilon: float, t_max: int, delta: FloatArray) -> FloatArray:
    """The rate ``λ = ε / (2 · t_max · δ)`` of the Exponential draw, per feature, shape of δ.

    Features with δ = 0 get λ = inf (their noise is 0: see :func:`expdp_noise`).
    """
    with np.errstate(divide="ignore"):
        return np.asarray(epsilon / (2.0 * t_max * np.asarray(delta, np.float64)), np.float64)


def expdp_noise(
    epsilon: float, t_max: int, delta: FloatArray, n_rows: int, rng: ReleaseRandom
) -> FloatArray:
    """Additive Exponential-DP noise, float64 (n_rows, F).

    ``y = −ln(V)/λ`` (an Exponential draw of mean 1/λ by inversion, V uniform in (0, 1): the
    53-bit uniform shifted by half a grid step so that y > 0 and ln(y) is finite),
    ``r = ±ln(y)/(λ · t_max)``. A feature with δ = 0 gets r = 0, the limit of the formula as δ → 0.
    """
    delta = np.asarray(delta, np.float64)
    lam = expdp_lambda(epsilon, t_max, delta)
    shape = (n_rows, delta.size)
    safe_lam = np.where(np.isfinite(lam), lam, 1.0)
    y = -np.log(rng.uniform(shape) + 2.0**-54) / safe_lam
    r = rng.signs(shape) * np.log(y) / (safe_lam * t_max)
    return np.where(np.isfinite(lam), r, 0.0)


def expdp_release(
    table: FeatureTable,
    params: Mapping[str, object],
    seed: int | None = None,
    progress: Progress = no_progress,
) -> Release:
    """Release ``table`` with Exponential-DP.

    Args:
        table: N labelled feature vectors.
        params: ``epsilon`` (per-feature ε > 0, required), ``range`` (``"public"`` default or
            ``"data"``), ``bounds`` (``{name: (lo, hi[, max_step])}`` for ``public``; default:
            the gazeguard feature registry).
        seed: ``None`` for the OS CSPRNG; an int only for reproducible experiments (insecure).
        progress: called once per task.

    Raises:
        ConfigError: naming ``epsilon`` (≤ 0 or not finite), ``range`` or ``bounds``.
    """
    p = Params(NAME, params)
    epsilon = p.number("epsilon", None, greater_than=0.0)
    range_source = p.choice("range", "public", RANGE_SOURCES)
    ranges = feature_ranges(table, range_source, p)
    effective = p.finish()
    effective.pop("bounds", None)  # recorded below as numbers, not as the caller's object
    require_finite(table, p)
    rng = ReleaseRandom(seed)

    delta = ranges.width
    X = table.X.copy()
    sequences = task_sequences(table)
    t_max_per_task: dict[str, int] = {}
    tasks_per_person: dict[str, int] = {}
    for n_done, (task, seqs) in enumerate(sequences.items()):
        t_max = max(rows.size for rows in seqs.values())
        t_max_per_task[task] = int(t_max)
        rows = np.concatenate(list(seqs.values()))
        X[rows] += expdp_noise(epsilon, t_max, delta, rows.size, rng)
        for person in seqs:
            tasks_per_person[person] = tasks_per_person.get(person, 0) + 1
        progress(n_done + 1, len(sequences), f"task {task!r}: t_max={t_max}")

    n_features = len(table.feature_names)
    max_tasks = max(tasks_per_person.values(), default=0)
    per_task_eps = n_features * epsilon
    statement = (
        f"Exponential-DP of Steil et al. 2019 with per-feature epsilon={epsilon:g} (the papers' "
        f"convention); composed over the {n_features} features of one person's sequence in one "
        f"task: epsilon={per_task_eps:g}; over all of a person's tasks (up to {max_tasks}): "
        f"epsilon={per_task_eps * max_tasks:g}. ε-DP as claimed by Steil et al.; gazeguard "
        "reproduces the published formula for comparison and does not re-prove it."
    )
    if range_source == "data":
        statement += (
            " Feature ranges were taken from the data itself (the papers' convention), so the "
            "ranges are not private and the DP claim does not strictly hold."
        )
    return Release(
        table.with_values(X),
        {
            "mechanism": NAME,
            "parameters": effective,
            "guarantee": {
                "kind": "epsilon-DP (Steil et al. 2019)",
                "statement": statement,
                "numbers": {
                    "epsilon_per_feature": epsilon,
                    "features": n_features,
                    "epsilon_per_person_task": per_task_eps,
                    "epsilon_per_person": per_task_eps * max_tasks,
                    "max_tasks_per_person": max_tasks,
                },
            },
            "seed_policy": rng.policy,
            "details": {
                "range_source": ranges.source,
                "delta": dict(zip(table.feature_names, map(float, delta), strict=True)),
                "t_max": t_max_per_task,
            },
        },
    )
