"""Cohort aggregates on recorded people (``gazeguard eval --frontier``; ``bench/eval_cohort.py``).

A cohort aggregate answers a question about a *group*, not a person. The one measured here:
**which activity are most of the cohort's N people doing in this bucket?** — the argmax of the
aggregate's private class shares (:mod:`gazeguard.runtime.cohort`, exactly the worker's
mechanism: clipped contributions, one discrete Gaussian on their sum, calibrated so that the
buckets one hour of gaze can change cost the budget).

**Units.** Every dataset — GazeGraph, ``csv:PATH``, ``table:PATH``, the synthetic one — is a
:class:`~gazeguard.signal.dataset.FeatureTable` of feature windows labelled with person, task and
recording. A recording's windows are grouped into buckets of ``bucket_s`` seconds of its own
time (``⌊t / bucket_s⌋``, ``t`` = window end, s since the recording's first sample); a
*unit* is one (person, recording, bucket) with at least half as many windows as the
recording's fullest bucket (a recording's ragged last bucket is left out; a bucket longer than
the recording is the whole recording). A unit's contribution is computed once, by the worker's
own :func:`gazeguard.runtime.cohort.contribution`, from its windows' features and class
probabilities. The probabilities come from a label model (logistic regression on the shipped
``activity`` model's features, :func:`gazeguard.signal.labels.lopo_probabilities`) trained on the
dataset's *other* people: a person's contributions never come from a model that saw them.

**Cohorts.** Per simulated bucket a dominant activity ``d`` is drawn; each of the N members does
``d`` with probability ``dominance`` and otherwise a uniformly drawn activity; each member is
then a unit of its activity. A dataset has few people (GazeGraph: 8) and a cohort may be larger
than the head count, so members are drawn per activity in this order: one unit of each
distinct person (random order), then more units of the people already drawn (their other
buckets or recordings) — all distinct units, i.e. **without replacement while the activity's
units last** — and beyond that the pool again, **with replacement** (a unit can then appear
more than once, as if two sessions had the same gaze). The result states per size the mean
number of distinct people and the share of repeated units. The truth is the activity most
members do (any of the tied ones counts); task accuracy = how often the argmax of the released
shares names it; clean = the same without noise (the label model's own errors, on the same
cohorts); chance = 1/C; **kept** = ``(task − chance)/(clean − chance)``.

**Re-identification** from one recording (H buckets of one person doing one activity): which
of the K candidate people (those with a recording of that activity, K ≤ the dataset's people)
contributed it. The target is in the cohort **exactly once** per bucket (a person is one
session: its other units are never among the others of that bucket).

* **informed** — the strongest attacker DP allows for: it knows every other member's
  contribution (subtracts them) and each candidate's contribution in each bucket; the maximum
  likelihood guess for Gaussian noise (least squares over the H buckets and every released
  coordinate) is optimal, so no attack on the aggregates does better. The others cancel: it
  does not depend on N, nor on how the others were formed.
* **realistic** — knows the candidates' contributions and the population's mean contribution,
  not the other people's data: the others' deviation from ``(N − 1)·mean`` is noise to it.

What repetition does to the attacks. The informed attacker subtracts the others exactly, so
repeated people change nothing for it: its figure is what N distinct people would give. For the
realistic attacker the others' sum is noise; drawn with replacement, its variance is
``(N − 1)·Var(unit)`` — that of independent people — while draws without replacement from a
pool of M units have less (the finite-population factor ``(M − N + 1)/(M − 1)``). Neither echoes
the target (its person is excluded). So forming large cohorts by repetition does not make
re-identification harder than distinct people would; small cohorts drawn without replacement
make it slightly *easier* (conservative); and a real population, more diverse than a dataset's
handful of people, gives the realistic attacker more noise than the repeated units do. For the
task, repetition correlates members (one person's model errors count several times): clean
accuracy varies more between cohorts than with distinct people, for clean and released alike.

**The mode** (``release = ("mode",)``, the runtime's default): the worker's ``mode`` part, the
group's dominant activity chosen by permute-and-flip at the plan's ε per bucket — the same
contributions (:func:`gazeguard.runtime.cohort.mode_contribution`), the same rounded scores and
the same exact sampler (:func:`gazeguard.runtime.cohort.choose_mode`), calibrated by the same
:func:`gazeguard.plan.cohort.plan_cohort`. Its attackers see only the chosen class per bucket;
their likelihood of each candidate is the mechanism's exact output probability
(:func:`gazeguard.privacy.mechanisms.selection.probabilities`) of the observed choices given
the candidate's scores plus the others' (informed: their actual sum; realistic: ``(N − 1)·mean``).
The informed attacker's DP bound: with ``H`` buckets of ε each composing to ``ε_H`` (pure,
sequential), telling K candidates apart is a replace-one question (``2ε_H`` between any two),
so its accuracy is at most ``e^{2ε_H}/(e^{2ε_H} + K − 1)``.

**Levers** (:func:`evaluate_levers`), each through the plan's calibration at the same user-level
ε per hour: what is released (``shares`` alone: Δ2 = 1; ``means`` + ``shares``: Δ2 = √3; the
mode) and the bucket length (the release plan counts ``releases_per_hour`` buckets an hour
of gaze can change: 63 of 60 s, 14 of 300 s, 8 of 600 s, 2 of 3600 s).
:func:`running_aggregates` measures continual release of running totals with a binary tree
against summing the per-bucket releases, at user level.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gazeguard.config import FeatureSettings
from gazeguard.core.errors import ConfigError
from gazeguard.core.samples import FloatArray
from gazeguard.plan import releases_per_hour
from gazeguard.plan.cohort import MODE_GRID, MODE_SENSITIVITY, CohortPlan, plan_cohort
from gazeguard.privacy.accounting import GaussianEvent, PrivacyLoss, calibrate, compose
from gazeguard.privacy.mechanisms.randomness import random_source
from gazeguard.privacy.mechanisms.selection import probabilities as pf_probabilities
from gazeguard.runtime.cohort import (
    choose_mode,
    contribution,
    exact_sum,
    mode_contribution,
    privatize_sum,
)
from gazeguard.signal.dataset import FeatureTable
from gazeguard.signal.features import FEATURES, feature_bounds
from gazeguard.signal.labels import lopo_probabilities

IntArray = npt.NDArray[np.intp]

#: Cohort sizes measured by default (``--quick``: the first two).
SIZES = (10, 30, 100, 1000)
#: Bucket lengths the levers compare, s.
BUCKETS_S = (60.0, 300.0, 600.0, 1800.0, 3600.0)
#: Only the group's dominant activity: the runtime's ``mode`` part (permute-and-flip).
MODE = ("mode",)
#: What a cohort may release for the group's activity: the shares alone, means beside them,
#: or only the dominant activity.
RELEASES: tuple[tuple[str, ...], ...] = (("shares",), ("means", "shares"), MODE)
#: The frontier's default cohort configuration, the runtime's default (``cohort.release``,
#: ``cohort.bucket_s``): the mode alone, 300 s buckets (``bench/results/eval_cohort.md``).
DEFAULT_BUCKET_S = 300.0
DEFAULT_RELEASE: tuple[str, ...] = MODE
#: How cohorts are formed, as the results state it.
FORMATION = (
    "each member one (person, recording, bucket) unit of its activity: distinct people first, "
    "then the same people's other units (no unit twice while the activity's units last), then "
    "units again with replacement; a re-identified person is in the cohort once per bucket"
)
_NAMES = tuple(f.name for f in FEATURES)


def _quiet(_msg: str) -> None:
    """No progress output."""


# ------------------------------------------------------------------------------ the data
@dataclass(frozen=True)
class CohortData:
    """One dataset's labelled windows with out-of-person class probabilities.

    Attributes:
        name: the dataset's name.
        table: its feature windows (person, task, recording labels; ``t`` s since the
            recording's first sample).
        probs: (N, C) each window's class probabilities from a model trained without its person.
        classes: the C classes (the dataset's tasks, sorted).
        model_features: the model's features.
    """

    name: str
    table: FeatureTable
    probs: FloatArray
    classes: tuple[str, ...]
    model_features: tuple[str, ...]

    @property
    def people(self) -> int:
        """Distinct people."""
        return len(set(self.table.person.tolist()))


def check_table(name: str, table: FeatureTable, model_features: Sequence[str]) -> None:
    """Refuse a dataset that cannot hold cohorts (cheap: before any evaluation runs).

    Raises:
        ConfigError: fewer than two people or two tasks, or a feature the table lacks.
    """
    tasks = sorted(set(table.task.tolist()))
    people = sorted(set(table.person.tolist()))
    if len(tasks) < 2:
        raise ConfigError(
            "cohort-sessions", name,
            f"cohort aggregates answer 'which activity is the group doing': {name} has "
            f"{len(tasks)} task(s), it needs at least 2",
        )  # fmt: skip
    if len(people) < 2:
        raise ConfigError(
            "cohort-sessions", name,
            f"{name} has one person: the label model is trained on the other people",
        )  # fmt: skip
    missing = [f for f in model_features if f not in table.feature_names]
    if missing:
        raise ConfigError(
            "cohort-sessions", name, f"the feature table lacks {', '.join(missing[:5])}"
        )


def prepare(
    name: str,
    table: FeatureTable,
    model_features: Sequence[str],
    progress: Callable[[str], None] = _quiet,
) -> CohortData:
    """:func:`check_table`, then the out-of-person class probabilities of every window.

    Raises:
        ConfigError: as :func:`check_table`.
    """
    check_table(name, table, model_features)
    tasks = sorted(set(table.task.tolist()))
    people = sorted(set(table.person.tolist()))
    progress(f"{name}: label model trained leaving each of {len(people)} people out")
    probs = lopo_probabilities(table, list(model_features), every=2)
    return CohortData(name, table, probs, tuple(tasks), tuple(model_features))


@dataclass(frozen=True)
class CohortUnits:
    """Bucket contributions of recorded people: one row per (person, recording, bucket) unit.

    Attributes:
        contribs: (U, D) each unit's contribution at the plan's layout, contribution units.
        person, recording: (U,) labels.
        activity: (U,) index of the unit's task in ``classes``.
        bucket: (U,) bucket number within its recording (from its start).
        windows: (U,) feature windows in the unit.
        classes: the C classes.
        shares_at: the index of the first class share in a contribution (F).
    """

    contribs: FloatArray
    person: npt.NDArray[np.str_]
    recording: npt.NDArray[np.str_]
    activity: IntArray
    bucket: IntArray
    windows: IntArray
    classes: tuple[str, ...]
    shares_at: int

    @property
    def size(self) -> int:
        """U."""
        return int(self.contribs.shape[0])


def bucket_units(
    data: CohortData, plan: CohortPlan, profile_features: Sequence[str] = ()
) -> CohortUnits:
    """Group every recording's windows into buckets of ``plan.bucket_s`` and compute each
    unit's contribution under ``plan`` (module docstring: which buckets are units)."""
    table, b = data.table, plan.bucket_s
    pcols = np.array([table.feature_names.index(f) for f in profile_features], dtype=np.intp)
    rows_of: list[IntArray] = []
    labels: list[tuple[str, str, int, int]] = []
    for rec, rows in table.recordings():
        buckets = np.floor(table.t[rows] / b).astype(np.intp)
        kept = [(int(k), rows[buckets == k]) for k in np.unique(buckets)]
        most = max(len(r) for _, r in kept)
        for k, r in kept:
            if 2 * len(r) < most:
                continue
            rows_of.append(r)
            labels.append((str(table.person[r[0]]), rec, k, len(r)))
    if plan.part("mode") is not None and plan.part("aggregates") is None:
        contribs = np.stack([mode_contribution(data.probs[r], len(data.classes)) for r in rows_of])
    else:
        contribs = np.stack(
            [
                contribution(
                    plan, table.X[np.ix_(r, pcols)] if len(pcols) else np.zeros((len(r), 0)),
                    data.probs[r] if plan.classes else None,
                )
                for r in rows_of
            ]
        )  # fmt: skip
    return CohortUnits(
        contribs,
        np.array([lab[0] for lab in labels]),
        np.array([lab[1] for lab in labels]),
        np.array([data.classes.index(str(table.task[r[0]])) for r in rows_of], dtype=np.intp),
        np.array([lab[2] for lab in labels], dtype=np.intp),
        np.array([lab[3] for lab in labels], dtype=np.intp),
        data.classes,
        len(plan.features),
    )


def cohort_plans(
    classes: Sequence[str],
    budgets: Sequence[float],
    *,
    bucket_s: float,
    release: Sequence[str] = DEFAULT_RELEASE,
    profile_features: Sequence[str] = (),
    window_s: float = 30.0,
    step_s: float = 0.5,
    delta: float = 1e-6,
) -> list[CohortPlan]:
    """One cohort plan per budget (user-level ε per hour at ``delta``, all of it on the cohort):
    ``release`` ⊆ {means, shares}; the buckets an hour of gaze can change counted as the release
    plan counts them (:func:`gazeguard.plan.releases_per_hour`); ``("mode",)``: the mode part
    alone, as the runtime's default plans it."""
    per_hour = releases_per_hour(
        FeatureSettings(window_s=window_s, step_s=step_s), bucket_s, bucket_s
    )
    if tuple(release) == MODE:
        return [
            plan_cohort([], [], [], [], (), bucket_s=bucket_s, per_hour=per_hour,
                        budget=float(b), delta=delta, mode_classes=tuple(classes))
            for b in budgets
        ]  # fmt: skip
    unknown = set(release) - {"means", "shares"}
    if unknown or "shares" not in release:
        raise ConfigError("cohort.release", list(release), "the group's activity needs 'shares'")
    features = list(profile_features) if "means" in release else []
    if "means" in release and not features:
        raise ConfigError("cohort.release", list(release), "'means' needs profile features")
    lo, hi, _ = feature_bounds(features, window_s, step_s)
    units = [FEATURES[_NAMES.index(f)].unit for f in features]
    return [
        plan_cohort(features, lo, hi, units, tuple(classes), bucket_s=bucket_s,
                    per_hour=per_hour, budget=float(b), delta=delta)
        for b in budgets
    ]  # fmt: skip


# ------------------------------------------------------------------------------ cohorts
def _tasks(
    rng: np.random.Generator, n: int, classes: int, dominance: float, d: int | None = None
) -> IntArray:
    """One bucket's activities of ``n`` people around the dominant one ``d`` (random if
    ``None``)."""
    d = int(rng.integers(classes)) if d is None else d
    other = rng.integers(classes, size=n)
    return np.where(rng.random(n) < dominance, d, other).astype(np.intp)


class Members:
    """Draws cohort members (units) for given activities (module docstring: distinct people
    first, then distinct units, then with replacement)."""

    def __init__(self, units: CohortUnits, rng: np.random.Generator) -> None:
        self.units, self.rng = units, rng
        self._people = {p: i for i, p in enumerate(sorted(set(units.person.tolist())))}
        self._pidx = np.array([self._people[p] for p in units.person], dtype=np.intp)
        self._pools = [np.flatnonzero(units.activity == a) for a in range(len(units.classes))]

    def _order(self, pool: IntArray) -> IntArray:
        """``pool`` in drawing order: rank within person (random), then people in random
        order."""
        rng = self.rng
        person = self._pidx[pool]
        within = np.lexsort((rng.random(pool.size), person))  # by person, random inside
        rank = np.empty(pool.size, dtype=np.intp)
        sorted_person = person[within]
        starts = np.r_[0, np.flatnonzero(np.diff(sorted_person)) + 1]
        counts = np.diff(np.r_[starts, pool.size])
        rank[within] = np.arange(pool.size) - np.repeat(starts, counts)
        key = rng.random(len(self._people))[person]
        return pool[np.lexsort((key, rank))]

    def draw(self, activities: IntArray, exclude_person: str | None = None) -> IntArray:
        """(N,) unit indices, one per member of the given activity (an activity without units —
        e.g. all the excluded person's — falls back to any activity's units)."""
        out = np.empty(activities.size, dtype=np.intp)
        skip = None if exclude_person is None else self._people[exclude_person]
        for a in np.unique(activities):
            at = np.flatnonzero(activities == a)
            pool = self._pools[int(a)]
            if skip is not None:
                pool = pool[self._pidx[pool] != skip]
            if pool.size == 0:
                pool = np.flatnonzero(self._pidx != skip)
            picks: list[IntArray] = []
            need = at.size
            while need > 0:
                order = self._order(pool)[:need]
                picks.append(order)
                need -= order.size
            out[at] = np.concatenate(picks)
        return out


def _names_plurality(hist: FloatArray, truth: IntArray) -> bool:
    """Whether the histogram's argmax is one of the most frequent true activities."""
    counts = np.bincount(truth, minlength=hist.size)
    return bool(counts[int(np.argmax(hist))] == counts.max())


def group_activity(
    units: CohortUnits,
    plans: Sequence[CohortPlan],
    sizes: Sequence[int],
    *,
    buckets: int,
    dominance: float,
    rng: np.random.Generator,
    noise_seed: int | None,
) -> list[dict[str, Any]]:
    """Per cohort size: clean and released accuracy of the group's dominant activity, and the
    class shares' total-variation error, over ``buckets`` simulated buckets (one release per
    plan), with how many distinct people and repeated units the cohorts held."""
    c, f = len(units.classes), units.shares_at
    src = random_source(noise_seed)
    members = Members(units, rng)
    chance = 1.0 / c
    rows = []
    for n in sizes:
        clean_hits = 0
        hits = np.zeros(len(plans))
        tv = np.zeros(len(plans))
        people = repeated = 0.0
        for _ in range(buckets):
            truth = _tasks(rng, n, c, dominance)
            who = members.draw(truth)
            people += len(set(units.person[who].tolist()))
            repeated += 1.0 - np.unique(who).size / n
            total = exact_sum(units.contribs[who])
            hist = total[f : f + c]
            clean_hits += _names_plurality(hist, truth)
            share = hist / hist.sum()
            for j, plan in enumerate(plans):
                mode = plan.part("mode")
                if mode is not None:
                    one = np.zeros(c)
                    one[choose_mode(mode, hist, src)] = 1.0
                    hits[j] += _names_plurality(one, truth)
                    tv[j] += 0.5 * float(np.abs(one - share).sum())
                    continue
                noisy = privatize_sum(plan, total, src)[f : f + c]
                hits[j] += _names_plurality(noisy, truth)
                pos = np.maximum(noisy, 0.0)
                released = pos / pos.sum() if pos.sum() > 0 else np.full(c, chance)
                tv[j] += 0.5 * float(np.abs(released - share).sum())
        clean = clean_hits / buckets
        rows.append(
            {
                "sessions": n,
                "clean_accuracy": clean,
                "distinct_people": people / buckets,
                "repeated_units": repeated / buckets,
                "released": [
                    {
                        "budget_per_hour": plan.budget,
                        "sigma": plan.sigma,
                        "mode_epsilon": plan.mode_epsilon,
                        "accuracy": float(hits[j] / buckets),
                        "kept_above_chance": _kept(float(hits[j] / buckets), clean, chance),
                        "share_tv": float(tv[j] / buckets),
                    }
                    for j, plan in enumerate(plans)
                ],
            }
        )
    return rows


def _informed_bound(plan: CohortPlan, buckets: float, candidates: int) -> float:
    """The DP bound on the informed attacker's accuracy against a mode plan: ``H`` choices of
    ε (sequential: ``ε_H = H·ε``, capped by the hour's composition per hour of buckets), two
    candidates differ by replacing one session (``2ε_H``): ``e^{2ε_H}/(e^{2ε_H} + K − 1)``."""
    eps = plan.mode_epsilon or 0.0
    total = 2.0 * math.ceil(buckets) * eps
    return 1.0 / (1.0 + (candidates - 1) * math.exp(-min(total, 700.0)))


def _kept(task: float, clean: float, chance: float) -> float | None:
    """``(task − chance)/(clean − chance)``, ``None`` when clean is no better than chance."""
    room = clean - chance
    return (task - chance) / room if room > 0 else None


# ------------------------------------------------------------------------------ attacks
@dataclass(frozen=True)
class _Recordings:
    """Each recording's units in bucket order, by activity and person."""

    units: list[IntArray]  # per recording: unit indices in bucket order
    person: list[str]
    activity: list[int]

    @classmethod
    def of(cls, units: CohortUnits) -> _Recordings:
        recs = list(dict.fromkeys(units.recording.tolist()))
        out = [np.flatnonzero(units.recording == r) for r in recs]
        out = [u[np.argsort(units.bucket[u], kind="stable")] for u in out]
        return cls(out, [str(units.person[u[0]]) for u in out],
                   [int(units.activity[u[0]]) for u in out])  # fmt: skip

    def of_activity(self, a: int) -> dict[str, list[int]]:
        """Person → their recordings (indices) of activity ``a``."""
        out: dict[str, list[int]] = {}
        for i, (p, act) in enumerate(zip(self.person, self.activity, strict=True)):
            if act == a:
                out.setdefault(p, []).append(i)
        return out


def reidentification(
    units: CohortUnits,
    plan: CohortPlan,
    *,
    candidates: int,
    trials: int,
    rng: np.random.Generator,
    noise_seed: int | None,
    others: int | None = None,
    dominance: float = 0.5,
    knows_others: bool = False,
    dominant_only: bool = False,
    draws: int = 300,
) -> dict[str, float]:
    """Accuracy of a maximum-likelihood attacker: which of up to ``candidates`` people (those
    with a recording of the target's activity) contributed one recording's buckets.

    ``others=None``: the informed attacker (knows every other contribution: they cancel).
    ``others=N − 1``: N − 1 others (drawn as in :class:`Members`, never the target's person;
    activities around each bucket's dominant one) are in every bucket; the realistic attacker
    subtracts their expected sum ``(N − 1)·mean`` (the population's mean contribution), the
    informed one (``knows_others``) their actual sum.

    ``dominant_only``: the release is only the mode (the plan's ``mode`` part: the runtime's
    permute-and-flip choice); the attacker's likelihood of each candidate is the mechanism's
    exact probability of the observed choice per bucket given the others' sum (as the
    attacker takes it) plus the candidate's vote share.

    Returns ``{"accuracy", "chance", "candidates", "buckets"}`` (means over trials of the
    chance ``1/K`` and the buckets compared ``H``).
    """
    recs = _Recordings.of(units)
    c = len(units.classes)
    acts = [a for a in range(c) if len(recs.of_activity(a)) >= 2]
    if not acts:
        raise ConfigError("cohort-sessions", None, "no activity has recordings of two people")
    src = random_source(noise_seed)
    mode = plan.part("mode") if dominant_only else None
    if dominant_only and mode is None:
        raise ConfigError("cohort.release", None, "dominant_only needs a plan with a mode")
    members = Members(units, rng) if others else None
    mean = units.contribs.mean(axis=0)
    hits = chance = seen = 0.0
    for _ in range(trials):
        a = acts[int(rng.integers(len(acts)))]
        by_person = recs.of_activity(a)
        people = list(by_person)
        k = min(candidates, len(people))
        chosen = [people[i] for i in rng.choice(len(people), size=k, replace=False)]
        rec = [by_person[p][int(rng.integers(len(by_person[p])))] for p in chosen]
        h = min(len(recs.units[r]) for r in rec)
        cand = np.stack([units.contribs[recs.units[r][:h]] for r in rec])  # (K, H, D)
        target = int(rng.integers(k))
        y = np.empty((h, cand.shape[2]))
        base = np.zeros((h, cand.shape[2]))  # what the attacker takes the others' sum to be
        for b in range(h):
            signal = cand[target, b]
            if members is not None and others:
                d = int(rng.integers(c))
                who = members.draw(_tasks(rng, others, c, dominance, d), chosen[target])
                rest = units.contribs[who].sum(axis=0)
                signal = signal + rest
                base[b] = rest if knows_others else others * mean
            if mode is not None:
                y[b] = 0.0
                y[b, choose_mode(mode, signal, src)] = 1.0
            else:
                y[b] = privatize_sum(plan, signal, src)
        if mode is not None:
            score = _mode_loglik(y, base + cand, float(mode.epsilon or 0))
        else:
            score = -(((y - base)[None, :, :] - cand) ** 2).sum(axis=(1, 2))
        best = np.flatnonzero(score == score.max())  # ties: a random one of them
        hits += int(best[int(rng.integers(best.size))]) == target
        chance += 1.0 / k
        seen += h
    return {
        "accuracy": hits / trials,
        "chance": chance / trials,
        "candidates": float(candidates),
        "buckets": seen / trials,
    }


def _mode_loglik(chosen: FloatArray, scores: FloatArray, epsilon: float) -> FloatArray:
    """(K,) log-likelihood of the observed choices ``chosen`` (H, C) one-hot under each
    candidate's scores ``scores`` (K, H, C): permute-and-flip's exact output probabilities at
    ``epsilon`` with the runtime's sensitivity (:data:`MODE_SENSITIVITY` grid steps)."""
    k, h, _ = scores.shape
    delta = float(MODE_SENSITIVITY * MODE_GRID)
    seen = np.argmax(chosen, axis=1)
    out = np.zeros(k)
    for i in range(k):
        for b in range(h):
            p = pf_probabilities(scores[i, b], epsilon, delta)[seen[b]]
            out[i] += math.log(max(float(p), 1e-300))
    return out


def _argmax_loglik(
    y: FloatArray,
    means: FloatArray,
    *,
    sigma: float,
    at: int,
    c: int,
    draws: int,
    rng: np.random.Generator,
) -> FloatArray:
    """(K,) log-likelihood of the observed argmax of each bucket's shares ``y`` (H, D) under
    each candidate's expected noisy sum ``means`` (K, H, D), Gaussian noise of ``sigma``."""
    seen = np.argmax(y[:, at : at + c], axis=1)  # (H,)
    z = rng.normal(0.0, sigma, (draws, c))
    won = np.argmax(means[:, :, None, at : at + c] + z, axis=3)  # (K, H, draws)
    hits = (won == seen[None, :, None]).sum(axis=2)  # (K, H)
    out: FloatArray = np.log((hits + 0.5) / (draws + 0.5 * c)).sum(axis=1)
    return out


# ------------------------------------------------------------------------------ evaluation
def evaluate_config(
    data: CohortData,
    budgets: Sequence[float],
    *,
    sizes: Sequence[int] = SIZES,
    bucket_s: float = DEFAULT_BUCKET_S,
    release: Sequence[str] = DEFAULT_RELEASE,
    profile_features: Sequence[str] = (),
    candidates: int | None = None,
    window_s: float = 30.0,
    step_s: float = 0.5,
    delta: float = 1e-6,
    buckets: int = 2000,
    trials: int = 10_000,
    realistic_trials: int = 1000,
    dominance: float = 0.5,
    seed: int | None = None,
    progress: Callable[[str], None] = _quiet,
) -> dict[str, Any]:
    """Measure one cohort configuration (bucket length, what is released) at each budget.

    Args:
        data: the dataset's windows and out-of-person probabilities (:func:`prepare`).
        budgets: user-level ε per hour of gaze at ``delta``, all of it on the cohort.
        sizes: cohort sizes N.
        bucket_s: bucket length, s.
        release: ``("shares",)`` or ``("means", "shares")``.
        profile_features: the means' features (with ``means``).
        candidates: the attacker's candidates K (default: every person; fewer where fewer
            people have a recording of the activity).
        buckets, trials, realistic_trials: simulated buckets per size; informed attack trials
            per budget; realistic attack trials per size and budget.
        dominance: probability a member does the bucket's dominant activity.
        seed: INSECURE seed for scenario and noise (``None``: scenario seed 0, noise from the
            OS CSPRNG).

    Returns:
        JSON-ready: ``rows`` (per size: clean, per budget accuracy, kept, realistic re-id),
        ``reid`` (informed accuracy per budget), chances, σ, the formation, the units.
    """
    t0 = time.perf_counter()
    plans = cohort_plans(
        data.classes, budgets, bucket_s=bucket_s, release=release,
        profile_features=profile_features, window_s=window_s, step_s=step_s, delta=delta,
    )  # fmt: skip
    units = bucket_units(data, plans[0], profile_features if "means" in release else ())
    k = candidates or data.people
    rng = np.random.default_rng(0 if seed is None else seed)
    rows = group_activity(
        units, plans, sizes, buckets=buckets, dominance=dominance, rng=rng, noise_seed=seed
    )
    dominant = tuple(release) == MODE
    reid: dict[str, float] = {}
    chance_reid = h = 0.0
    informed_trials = max(realistic_trials, trials // 4) if dominant else trials
    for plan in plans:
        found = reidentification(
            units, plan, candidates=k, trials=informed_trials, rng=rng,
            noise_seed=None if seed is None else seed + 1, dominant_only=dominant,
        )  # fmt: skip
        reid[f"{plan.budget:g}"] = found["accuracy"]
        chance_reid, h = found["chance"], found["buckets"]
    for row, n in zip(rows, sizes, strict=True):
        for cell, plan in zip(row["released"], plans, strict=True):
            attack = functools.partial(
                reidentification, units, plan, candidates=k, rng=rng, others=n - 1,
                dominance=dominance, dominant_only=dominant,
            )  # fmt: skip
            realistic = attack(
                trials=realistic_trials, noise_seed=None if seed is None else seed + 2
            )
            cell["reid_realistic"] = realistic["accuracy"]
            # the informed attacker: the others cancel, unless only the argmax is released
            cell["reid_informed"] = reid[f"{plan.budget:g}"]
            if dominant:
                informed = attack(
                    trials=informed_trials, knows_others=True,
                    noise_seed=None if seed is None else seed + 3,
                )  # fmt: skip
                cell["reid_informed"] = informed["accuracy"]
        row["reid_realistic"] = {
            f"{c['budget_per_hour']:g}": c["reid_realistic"] for c in row["released"]
        }
    if dominant:  # the frontier's one figure per budget: the worst size
        for j, plan in enumerate(plans):
            reid[f"{plan.budget:g}"] = max(r["released"][j]["reid_informed"] for r in rows)
    result = {
        "dataset": data.name,
        "question": "the activity most of the cohort does in a bucket (argmax of the private "
        "class shares)",
        "classes": list(data.classes),
        "people": data.people,
        "release": list(release),
        "profile_features": list(profile_features) if "means" in release else [],
        "bucket_s": bucket_s,
        "buckets_per_hour": plans[0].buckets_per_hour,
        "delta": delta,
        "dominance": dominance,
        "formation": FORMATION,
        "units": units.size,
        "units_per_activity": {
            c: int((units.activity == i).sum()) for i, c in enumerate(data.classes)
        },
        "windows_per_unit": float(units.windows.mean()),
        "buckets": buckets,
        "trials": trials,
        "realistic_trials": realistic_trials,
        "candidates": k,
        "buckets_per_recording": h,
        "chance_task": 1.0 / len(data.classes),
        "chance_reid": chance_reid,
        "sensitivity_l2": plans[0].sensitivity_l2,
        "sigma": {f"{p.budget:g}": p.sigma for p in plans},
        "mode_epsilon": {f"{p.budget:g}": p.mode_epsilon for p in plans},
        "dp_bound_informed": {
            f"{p.budget:g}": _informed_bound(p, h, k) for p in plans if p.mode_epsilon
        },
        "epsilon_per_hour": {f"{p.budget:g}": p.epsilon_per_hour for p in plans},
        "rows": rows,
        "reid": reid,
        "seconds": time.perf_counter() - t0,
    }
    for line in result_lines(result):
        progress(line)
    return result


def evaluate_levers(
    data: CohortData,
    budgets: Sequence[float],
    *,
    profile_features: Sequence[str],
    bucket_lengths: Sequence[float] = BUCKETS_S,
    releases: Sequence[Sequence[str]] = RELEASES,
    progress: Callable[[str], None] = _quiet,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """:func:`evaluate_config` for every bucket length × release (keyword arguments as
    there): the levers at the same user-level budgets."""
    out = []
    for bucket_s in bucket_lengths:
        for release in releases:
            progress(f"{data.name}: {'+'.join(release)}, {bucket_s:g} s buckets")
            result = evaluate_config(
                data, budgets, bucket_s=bucket_s, release=release,
                profile_features=profile_features, progress=progress, **kwargs,
            )  # fmt: skip
            out.append(result)
    return out


def result_lines(result: dict[str, Any]) -> list[str]:
    """Progress lines of one :func:`evaluate_config` result."""
    head = f"{result['dataset']} {'+'.join(result['release'])} {result['bucket_s']:g} s"
    lines = [
        f"{head}, cohort of {row['sessions']} ({row['distinct_people']:.1f} people, "
        f"{100 * row['repeated_units']:.0f} % repeated units): clean "
        f"{row['clean_accuracy']:.3f}; "
        + ", ".join(
            f"ε {c['budget_per_hour']:g}/h {c['accuracy']:.3f} (kept "
            f"{_pct(c['kept_above_chance'])}, realistic re-id {c['reid_realistic']:.3f})"
            for c in row["released"]
        )
        for row in result["rows"]
    ]
    lines.append(
        f"{head}: informed re-identification ({result['candidates']} candidates, "
        f"{result['buckets_per_recording']:.1f} buckets, chance {result['chance_reid']:.3f}): "
        + ", ".join(f"ε {b}/h {a:.3f}" for b, a in result["reid"].items())
        + f" ({result['seconds']:.0f} s)"
    )
    return lines


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.0f} %"


def cohort_kind(sessions: int) -> str:
    """The frontier's kind label of a cohort of ``sessions`` people."""
    return f"cohort of {sessions}: group's activity"


# ------------------------------------------------------------------------------ running totals
def dyadic(t: int) -> list[tuple[int, int]]:
    """The binary mechanism's nodes ``(level, index)`` whose sums add up to the first ``t``
    buckets (one per set bit of ``t``; node ``(k, i)`` covers buckets ``[i·2^k, (i+1)·2^k)``)."""
    out = []
    start = 0
    for k in range(t.bit_length() - 1, -1, -1):
        if t >> k & 1:
            out.append((k, start >> k))
            start += 1 << k
    return out


def running_aggregates(
    budget: float,
    *,
    bucket_s: float,
    horizon: int,
    window_s: float = 30.0,
    step_s: float = 0.5,
    delta: float = 1e-6,
    reps: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Continual release of running totals (the class histogram summed over the first ``t``
    buckets, ``t = 1 … horizon``) at user level, one coordinate (the noise is data-independent):

    * **per bucket**: the cohort's releases (σ = r·Δ2 each, ``Δ2 = 1``), summed by the consumer
      — post-processing, no extra cost; error ``σ·√t``;
    * **binary tree** (the binary mechanism / tree aggregation): node ``(k, i)`` holds the sum
      of ``2^k`` buckets; a person in every one of them moves it by up to ``2^k``, so it gets
      ``σ_k = r'·2^k`` (one Gaussian event ``G(r')`` per node); an hour of gaze touches
      ``⌈n/2^k⌉ + 1`` nodes of level ``k`` (``n`` = buckets per hour); ``r'`` is calibrated so
      that all of them compose to ``budget``; a running total sums the ``popcount(t)`` nodes
      of :func:`dyadic`.

    Returns RMSE per ``t`` of both (measured over ``reps`` Gaussian draws, and in closed form),
    both noise multipliers and the events per hour.
    """
    n = releases_per_hour(FeatureSettings(window_s=window_s, step_s=step_s), bucket_s, bucket_s)
    limit = PrivacyLoss.approx(budget, delta, field="budget")
    r_bucket = calibrate("gaussian", n, limit, 0.0)
    levels = max(1, horizon.bit_length())
    touched = sum(min(-(-n // 2**k) + 1, -(-horizon // 2**k)) for k in range(levels))
    r_tree = calibrate("gaussian", touched, limit, 0.0)
    assert compose({GaussianEvent(r_tree, 0.0): touched}, delta).epsilon <= budget * (1 + 1e-6)
    rng = np.random.default_rng(seed)
    ts = np.arange(1, horizon + 1)
    per_bucket = np.cumsum(rng.normal(0.0, r_bucket, (reps, horizon)), axis=1)
    tree_noise = {
        (k, i): rng.normal(0.0, r_tree * 2**k, reps)
        for k in range(levels)
        for i in range(-(-horizon // 2**k))
    }
    tree = np.stack([sum(tree_noise[node] for node in dyadic(int(t))) for t in ts], axis=1)
    theory_tree = [
        r_tree * math.sqrt(sum(4**k for k, _ in dyadic(int(t)))) for t in ts
    ]  # fmt: skip
    return {
        "budget_per_hour": budget,
        "bucket_s": bucket_s,
        "buckets_per_hour": n,
        "tree_nodes_per_hour": touched,
        "noise_multiplier": {"per_bucket": r_bucket, "tree": r_tree},
        "t": ts.tolist(),
        "rmse_per_bucket": np.sqrt((per_bucket**2).mean(axis=0)).tolist(),
        "rmse_tree": np.sqrt((tree**2).mean(axis=0)).tolist(),
        "theory_per_bucket": (r_bucket * np.sqrt(ts)).tolist(),
        "theory_tree": theory_tree,
    }
