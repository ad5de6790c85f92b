"""The cohort path on the frontier plane (issue 14.3; ``gazeguard eval --frontier`` on synthetic).

A cohort aggregate answers a question about a *group*, not a person. The one measured here:
**which activity are most of the cohort's N people doing in this bucket?** — the argmax of the
aggregate's private label histogram (:mod:`gazeguard.runtime.cohort`, exactly the worker's
mechanism:
clipped contributions, one discrete Gaussian on their sum, calibrated so an hour of buckets
costs the budget). It sits on the frontier beside the per-person releases with the same axes,
and the table says that its task is the group's:

* **Population.** ``max(sizes)`` simulated people (:func:`gazeguard.runtime.simulate.simulate_gaze`,
  seeds disjoint from the dataset's), each simulated in every task for one bucket
  (``window_s + bucket_s`` seconds, so every feature window ending in the bucket is complete).
  A person's bucket contribution per task is computed once (:func:`gazeguard.runtime.cohort.
  contribution`) from the profile's features and a label model trained on the *dataset's*
  labelled recordings (public data; the population is never trained on).
* **Task.** Per bucket a dominant activity ``d`` is drawn; each of the N people does ``d`` with
  probability ``dominance`` and otherwise a uniformly drawn activity. The truth is the activity
  most people actually do (any of the tied ones counts). Task accuracy = how often the argmax of
  the released histogram names it; clean = the same with no noise (the label model's own
  errors); chance = 1/C.
* **Re-identification** — the strongest attacker DP allows for: it knows every other person's
  contribution exactly (subtracts them) and the contributions of K candidates in each of the
  ``H`` buckets of a recording, and must say which candidate is in the cohort. For Gaussian noise
  the maximum-likelihood guess (least squares over the ``H`` buckets) is optimal, so this is an
  upper bound on what any attack on the aggregates learns. K = 1/chance of the dataset's
  re-identification, so chance lines coincide. It does not depend on N (the others cancel).
  Beside it, per N, the attacker the per-person releases face: the candidates' data and the
  population's mean contribution, but not the other N − 1 people's data.

A person's contribution per task is the same in every bucket (one simulated bucket per person
and task): that makes the attacker's job easier than real gaze would, never harder.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from gazeguard.config import FeatureSettings
from gazeguard.plan import releases_per_hour
from gazeguard.plan.cohort import CohortPlan, plan_cohort
from gazeguard.privacy.mechanisms.randomness import random_source
from gazeguard.runtime.cohort import contribution, exact_sum, privatize_sum
from gazeguard.signal.dataset import FeatureTable
from gazeguard.signal.features import FEATURES, FeatureExtractor, feature_bounds
from gazeguard.signal.labels import train_model

FloatArray = npt.NDArray[np.float64]

#: Cohort sizes measured by default (``--quick``: the first two).
SIZES = (10, 100, 1000)
#: Seed offset of the simulated population: far from any dataset's people (seeds 1…people).
POPULATION_SEED = 100_000
_NAMES = tuple(f.name for f in FEATURES)


def _quiet(_msg: str) -> None:
    """No progress output."""


def population(
    people: int,
    classes: Sequence[str],
    contribute: Callable[[FloatArray], FloatArray],
    *,
    rate_hz: float,
    window_s: float,
    step_s: float,
    bucket_s: float,
    progress: Callable[[str], None] = _quiet,
) -> FloatArray:
    """(people, C, D) bucket contributions of ``people`` simulated people in every activity.

    ``contribute`` maps one person-activity's (T, 48) clean feature vectors (the windows ending
    in the bucket) to its (D,) contribution.
    """
    from gazeguard.runtime.simulate import simulate_gaze  # noqa: PLC0415 - heavy import

    out: list[list[FloatArray]] = []
    t0 = time.perf_counter()
    for p in range(people):
        row = []
        for task in classes:
            gaze = simulate_gaze(window_s + bucket_s, rate_hz, POPULATION_SEED + p, task=task)
            X, _ = FeatureExtractor(window_s=window_s, step_s=step_s, rate_hz=rate_hz).push(gaze)
            row.append(contribute(X))
        out.append(row)
        if (p + 1) % 50 == 0 or p + 1 == people:
            progress(f"simulated {p + 1}/{people} people × {len(classes)} activities "
                     f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    return np.asarray(out, dtype=np.float64)


def _tasks(
    rng: np.random.Generator, n: int, classes: int, dominance: float, d: int | None = None
) -> npt.NDArray[np.intp]:
    """One bucket's activities of ``n`` people around the dominant one ``d`` (random if
    ``None``)."""
    d = int(rng.integers(classes)) if d is None else d
    other = rng.integers(classes, size=n)
    return np.where(rng.random(n) < dominance, d, other).astype(np.intp)


def _names_plurality(hist: FloatArray, truth: npt.NDArray[np.intp]) -> bool:
    """Whether the histogram's argmax is one of the most frequent true activities."""
    counts = np.bincount(truth, minlength=hist.size)
    return bool(counts[int(np.argmax(hist))] == counts.max())


def dominant_activity(
    contribs: FloatArray,
    plans: Sequence[CohortPlan],
    sizes: Sequence[int],
    *,
    buckets: int,
    dominance: float,
    rng: np.random.Generator,
    noise_seed: int | None,
) -> list[dict[str, Any]]:
    """Per cohort size: clean and released accuracy of the dominant activity, and the class
    shares' total-variation error, over ``buckets`` simulated buckets (one release per plan)."""
    n_people, n_classes, _ = contribs.shape
    f = len(plans[0].features)
    src = random_source(noise_seed)
    rows = []
    for n in sizes:
        if n > n_people:
            raise ValueError(f"cohort of {n}: the population has only {n_people} people")
        clean_hits = 0
        hits = np.zeros(len(plans))
        tv = np.zeros(len(plans))
        for _ in range(buckets):
            truth = _tasks(rng, n, n_classes, dominance)
            total = exact_sum(contribs[np.arange(n), truth])
            hist = total[f : f + n_classes]
            clean_hits += _names_plurality(hist, truth)
            share = hist / hist.sum()
            for j, plan in enumerate(plans):
                noisy = privatize_sum(plan, total, src)[f : f + n_classes]
                hits[j] += _names_plurality(noisy, truth)
                pos = np.maximum(noisy, 0.0)
                released = pos / pos.sum() if pos.sum() > 0 else np.full(n_classes, 1 / n_classes)
                tv[j] += 0.5 * float(np.abs(released - share).sum())
        rows.append(
            {
                "sessions": n,
                "clean_accuracy": clean_hits / buckets,
                "released": [
                    {
                        "budget_per_hour": plan.budget,
                        "sigma": plan.sigma,
                        "accuracy": float(hits[j] / buckets),
                        "share_tv": float(tv[j] / buckets),
                    }
                    for j, plan in enumerate(plans)
                ],
            }
        )
    return rows


def reidentification(
    contribs: FloatArray,
    plan: CohortPlan,
    *,
    candidates: int,
    buckets_per_recording: int,
    trials: int,
    dominance: float,
    rng: np.random.Generator,
    noise_seed: int | None,
    others: int | None = None,
) -> float:
    """Accuracy of a maximum-likelihood attacker: which of ``candidates`` people is in the
    cohort, from ``buckets_per_recording`` released buckets.

    ``others=None``: the informed attacker of the module docstring (knows every other
    contribution, so they cancel: the bound DP speaks to). ``others=N − 1``: the attacker the
    per-person releases face — it knows the candidates' contributions and the population's
    mean contribution, not the other people's data; N − 1 others (drawn from the population,
    activities around the bucket's dominant one) are in every bucket and it subtracts their
    expected sum.
    """
    n_people, n_classes, _ = contribs.shape
    if candidates > n_people:
        raise ValueError(f"{candidates} candidates: the population has only {n_people} people")
    src = random_source(noise_seed)
    mean = contribs.mean(axis=(0, 1))
    hits = 0
    for _ in range(trials):
        who = rng.choice(n_people, size=candidates, replace=False)
        dominant = rng.integers(n_classes, size=buckets_per_recording)
        tasks = np.stack([_tasks(rng, candidates, n_classes, dominance, int(d)) for d in dominant])
        c = contribs[who[None, :], tasks]  # (H, K, D)
        target = int(rng.integers(candidates))
        rest = np.zeros_like(c[:, 0])  # (H, D): what the attacker cannot subtract exactly
        if others:
            for h in range(len(c)):
                ids = rng.choice(n_people, size=others, replace=others > n_people)
                act = _tasks(rng, others, n_classes, dominance, int(dominant[h]))
                rest[h] = exact_sum(contribs[ids, act]) - others * mean
        y = np.stack([privatize_sum(plan, c[h, target] + rest[h], src) for h in range(len(c))])
        score = ((y[:, None, :] - c) ** 2).sum(axis=(0, 2))
        hits += int(np.argmin(score)) == target
    return hits / trials


def evaluate_cohort(
    table: FeatureTable,
    profile_features: Sequence[str],
    model_features: Sequence[str],
    budgets: Sequence[float],
    *,
    sizes: Sequence[int] = SIZES,
    rate_hz: float,
    recording_s: float,
    candidates: int,
    window_s: float = 30.0,
    step_s: float = 0.5,
    bucket_s: float = 60.0,
    delta: float = 1e-6,
    buckets: int = 200,
    trials: int = 400,
    dominance: float = 0.5,
    seed: int | None = None,
    progress: Callable[[str], None] = _quiet,
) -> dict[str, Any]:
    """Measure the cohort path (module docstring) at each budget (all of it on the cohort).

    Args:
        table: the dataset's labelled public recordings, to train the label model on.
        profile_features: features whose cohort means are released.
        model_features: the label model's features (trained here on ``table``).
        budgets: user-level ε per hour of gaze at ``delta``.
        sizes: cohort sizes N.
        rate_hz: the simulated population's sampling rate, Hz.
        recording_s: a person's recording length, s: the attacker sees
            ``max(1, recording_s // bucket_s)`` buckets.
        candidates: K, the attacker's candidate people.
        buckets, trials: simulated buckets per size; attack trials per budget.
        dominance: probability a person does the bucket's dominant activity.
        seed: INSECURE seed for scenario and noise (``None``: scenario seed 0, noise from the
            OS CSPRNG).

    Returns:
        JSON-ready ``{"classes", "sizes", "rows", "reid", "chance_task", ...}``.
    """
    t0 = time.perf_counter()
    model = train_model(table, model_features, name="cohort", window_s=window_s, step_s=step_s)
    classes = model.classes
    lo, hi, _ = feature_bounds(profile_features, window_s, step_s)
    units = [FEATURES[_NAMES.index(f)].unit for f in profile_features]
    buckets = releases_per_hour(
        FeatureSettings(window_s=window_s, step_s=step_s), bucket_s, bucket_s
    )
    plans = [
        plan_cohort(profile_features, lo, hi, units, classes, bucket_s=bucket_s,
                    per_hour=buckets, budget=float(b), delta=delta)
        for b in budgets
    ]  # fmt: skip
    pcols = [_NAMES.index(f) for f in profile_features]
    mcols = [_NAMES.index(f) for f in model.features]

    def contribute(X: FloatArray) -> FloatArray:
        return contribution(plans[0], X[:, pcols], model.predict_proba(X[:, mcols]))

    contribs = population(
        max(*sizes, candidates), classes, contribute, rate_hz=rate_hz, window_s=window_s,
        step_s=step_s, bucket_s=bucket_s, progress=progress,
    )  # fmt: skip
    rng = np.random.default_rng(0 if seed is None else seed)
    rows = dominant_activity(
        contribs, plans, sizes, buckets=buckets, dominance=dominance, rng=rng, noise_seed=seed
    )
    h = max(1, int(recording_s // bucket_s))
    attack = functools.partial(
        reidentification, contribs, candidates=candidates, buckets_per_recording=h,
        dominance=dominance, rng=rng, noise_seed=None if seed is None else seed + 1,
    )  # fmt: skip
    reid = {f"{plan.budget:g}": attack(plan, trials=trials) for plan in plans}
    for row in rows:  # the attacker without the others' data; fewer trials: it is slower
        row["reid_uninformed"] = {
            f"{plan.budget:g}": attack(
                plan, trials=max(1, trials // 10), others=row["sessions"] - 1
            )
            for plan in plans
        }
    _say_results(rows, reid, f"{candidates} candidates, {h} buckets", t0, progress)
    return {
        "question": "the activity most of the cohort does in a bucket (argmax of the private "
        "label histogram)",
        "classes": list(classes),
        "profile_features": list(profile_features),
        "bucket_s": bucket_s,
        "delta": delta,
        "dominance": dominance,
        "buckets": buckets,
        "trials": trials,
        "candidates": candidates,
        "buckets_per_recording": h,
        "chance_task": 1.0 / len(classes),
        "chance_reid": 1.0 / candidates,
        "sensitivity_l2": plans[0].sensitivity_l2,
        "sigma": {f"{p.budget:g}": p.sigma for p in plans},
        "rows": rows,
        "reid": reid,
        "seconds": time.perf_counter() - t0,
    }


def _say_results(
    rows: list[dict[str, Any]],
    reid: dict[str, float],
    attacker: str,
    t0: float,
    progress: Callable[[str], None],
) -> None:
    """Progress lines of :func:`evaluate_cohort`'s results (``t0``: its start, perf_counter)."""
    for row in rows:
        progress(
            f"cohort of {row['sessions']}: dominant activity clean {row['clean_accuracy']:.3f}, "
            + ", ".join(
                f"ε {r['budget_per_hour']:g}/h {r['accuracy']:.3f}" for r in row["released"]
            )
        )
        progress(
            f"cohort of {row['sessions']}: re-identification without the others' data "
            + ", ".join(f"ε {b}/h {a:.3f}" for b, a in row["reid_uninformed"].items())
        )
    progress(
        f"cohort re-identification (informed attacker, {attacker}): "
        + ", ".join(f"ε {b}/h {a:.3f}" for b, a in reid.items())
        + f" ({time.perf_counter() - t0:.0f} s)"
    )


def cohort_kind(sessions: int) -> str:
    """The frontier's kind label of a cohort of ``sessions`` people."""
    return f"cohort of {sessions}: group's activity"
