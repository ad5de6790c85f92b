"""One privacy–utility frontier per dataset across release kinds (``gazeguard eval --frontier``).

Every release kind a consumer can ask for is measured at the same honest axis — user-level ε per
hour of gaze at δ (the ledger's figure) — and placed on one plane: task accuracy (what the
consumer keeps) against re-identification accuracy (what an attacker learns about *who*):

* **feature streams** of all features and of a release profile (e.g. ``activity``), per stream
  mechanism, noise calibrated to the hourly budget as ``gazeguard run`` does; task and
  re-identification are the strongest classifier's per-window accuracy on the release
  (:func:`gazeguard.offline.eval.report.tradeoff_points`);
* **private labels** (:mod:`gazeguard.offline.eval.labels`): on a clock, randomized response per
  decision at the ε the hourly budget allows at that cadence; task accuracy is the released
  decisions' accuracy, re-identification the strongest attack on the released label sequences;
  and held by the consumer over hour-long sessions whose activity changes every 5–10 min, on
  the shipped clock and a 30 s one (one kind per block length): task accuracy is per feature
  window (:func:`gazeguard.offline.eval.labels.evaluate_sessions`);
* **cohort aggregates** (:mod:`gazeguard.offline.eval.cohort`, on every dataset with two or
  more people and tasks: cohorts of the recorded people's buckets): the worker's private class
  shares per bucket over N people; its task is the *group's* dominant activity (the table says
  so), re-identification the informed maximum-likelihood attacker on a recording's buckets
  (the realistic one beside it in the text).

The goal the product is measured against: at re-identification within ``tolerance``
of chance, task accuracy ≥ 80 % of clean at ε ≤ 10 per hour (δ 1e-6). Each kind's clean task
accuracy is its own (the per-window classifier for streams, the label model's decisions for
labels), so "% of clean" compares a release with what the same consumer gets without privacy.

:func:`label_limit` is the theory side for labels: from the survival probability
``p = e^ε / (e^ε + C − 1)`` and the PLD accountant, the fewest seconds between decisions that
can keep a fraction of clean accuracy at a budget — no measurement can beat it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from gazeguard.config import FeatureSettings
from gazeguard.core.errors import ConfigError
from gazeguard.offline.eval.cohort import (
    DEFAULT_BUCKET_S,
    DEFAULT_RELEASE,
    SIZES,
    CohortData,
    check_table,
    cohort_kind,
    evaluate_config,
    prepare,
)
from gazeguard.offline.eval.datasets import Dataset
from gazeguard.offline.eval.labels import evaluate as evaluate_labels
from gazeguard.offline.eval.labels import frontier_sessions
from gazeguard.offline.eval.report import clean_row, reid_and_task, tradeoff_points
from gazeguard.offline.eval.runner import GridConfig, evaluate_dataset, print_progress
from gazeguard.plan import label_cadence
from gazeguard.signal.labels import MAX_EPSILON, epsilon_for_survival, load_model, shipped_models
from gazeguard.signal.profiles import load_profile

#: The goal: task accuracy kept, as a fraction of clean, at re-identification near chance.
GOAL_FRACTION = 0.8
#: ... at this user-level budget per hour of gaze or less.
GOAL_BUDGET = 10.0


@dataclass(frozen=True)
class ReleasePoint:
    """One measured release on the frontier plane.

    Attributes:
        kind: release kind, e.g. ``"stream: all features"``, ``"stream: activity"``,
            ``"labels"``.
        detail: the configuration within the kind (mechanism key, decision cadence).
        budget: user-level ε per hour of gaze at the run's δ.
        reid: re-identification accuracy of the strongest attacker, in [0, 1].
        task: task accuracy on the release, in [0, 1].
        clean_task: the same kind's task accuracy without privacy, in [0, 1].
        chance_task: that task's chance accuracy, in [0, 1].
        chance_reid: the chance of this point's attacker, 1/its candidates, where it is not
            the dataset's 1/people (``None``: the dataset's). A cohort's informed attacker picks
            among the people with a recording of the target's task: for gender, the readers of
            one gender, so 1/10 of 20 readers, not 1/20.
    """

    kind: str
    detail: str
    budget: float
    reid: float
    task: float
    clean_task: float
    chance_task: float
    chance_reid: float | None = None

    def near_chance(self, chance_reid: float, tolerance: float) -> bool:
        """Whether the re-identification is within ``tolerance`` of its attacker's chance (its
        own :attr:`chance_reid`, else the dataset's ``chance_reid``)."""
        own = chance_reid if self.chance_reid is None else self.chance_reid
        return self.reid <= own + tolerance

    @property
    def kept(self) -> float:
        """Task accuracy kept above chance, as a fraction of clean's above chance:
        ``(task − chance)/(clean − chance)`` (``nan`` when clean is no better than chance; a
        raw ratio would credit a release with chance itself, 41 % of clean on some data)."""
        room = self.clean_task - self.chance_task
        return (self.task - self.chance_task) / room if room > 0 else math.nan


def stream_points(result: Mapping[str, Any], kind: str) -> list[ReleasePoint]:
    """The stream-mechanism rows of one ``gazeguard eval --per-hour`` result as points."""
    if result["meta"].get("axis") != "per-hour":
        msg = f"{kind}: the frontier needs a per-hour run (gazeguard eval --per-hour …)"
        raise ValueError(msg)
    clean = clean_row(result)  # type: ignore[arg-type]
    scores = None if clean is None else reid_and_task(clean)
    clean_task = math.nan if scores is None else scores[1]
    chance = result["meta"]["chance_task"]
    chance = math.nan if chance is None else float(chance)
    return [
        ReleasePoint(kind, key, float(eps), reid, task, clean_task, chance)
        for key, eps, reid, task in tradeoff_points(result)  # type: ignore[arg-type]
        if eps is not None
    ]


def label_points(result: Mapping[str, Any], kind: str = "labels") -> list[ReleasePoint]:
    """The released cells of one :func:`gazeguard.offline.eval.labels.evaluate` result as points
    (cadences whose recordings are too short, or without an attack result, are left out)."""
    points = []
    for row in result["cadences"]:
        if "unavailable" in row:
            continue
        for cell in row["released"]:
            if cell.get("reid") is None:
                continue
            points.append(
                ReleasePoint(
                    kind,
                    f"{row['decision_s']:g} s decisions",
                    float(cell["budget_per_hour"]),
                    float(cell["reid"]["accuracy"]),
                    float(cell["accuracy"]),
                    float(row["clean_decision_accuracy"]),
                    float(result["chance"]["task"]),
                    _chance(result["chance"].get("reid")),
                )
            )
    return points


def session_points(result: Mapping[str, Any], model: str) -> list[ReleasePoint]:
    """The attacked cells of one :func:`gazeguard.offline.eval.labels.evaluate_sessions` result
    as points: per-window accuracy of the held label, one kind per block length."""
    points = []
    for row in result["modes"]:
        decision_s = row["settings"]["decision_s"]
        kind = f"labels on a {decision_s:g} s clock, held ({model} model)"
        detail = f"hour sessions, every {decision_s:g} s"
        for cell in row["released"]:
            if cell.get("reid") is None:
                continue
            points.append(
                ReleasePoint(
                    kind, detail, float(cell["budget_per_hour"]), float(cell["reid"]["accuracy"]),
                    float(cell["accuracy"]), float(row["clean"]), float(result["chance"]),
                )
            )  # fmt: skip
    return points


def cohort_points(result: Mapping[str, Any]) -> list[ReleasePoint]:
    """The cohort result of :func:`gazeguard.offline.eval.cohort.evaluate_config` as points, one
    kind per cohort size (the informed attacker's re-identification does not depend on it), each
    with the informed attacker's own chance (``chance_reid``: the mean of 1/its candidates)."""
    points = []
    for row in result["rows"]:
        n = int(row["sessions"])
        for cell in row["released"]:
            budget = float(cell["budget_per_hour"])
            points.append(
                ReleasePoint(
                    cohort_kind(n),
                    f"{n} sessions, {result['bucket_s']:g} s buckets",
                    budget,
                    float(cell.get("reid_informed", result["reid"][f"{budget:g}"])),
                    float(cell["accuracy"]),
                    float(row["clean_accuracy"]),
                    float(result["chance_task"]),
                    _chance(result["chance_reid"]),
                )
            )
    return points


def _chance(value: float | None) -> float | None:
    """A result's re-identification chance as a point carries it: rounded to 12 digits, so a
    mean of 1/K over trials (0.049999999999999295) is the 1/K it is."""
    return None if value is None else round(float(value), 12)


def pareto(points: Sequence[ReleasePoint]) -> list[ReleasePoint]:
    """The points no other point beats on both axes (lower re-identification, higher task),
    by increasing re-identification."""
    front: list[ReleasePoint] = []
    for p in sorted(points, key=lambda q: (q.reid, -q.task)):
        if not front or p.task > front[-1].task:
            front.append(p)
    return front


def best_near_chance(
    points: Sequence[ReleasePoint], chance_reid: float, tolerance: float
) -> dict[tuple[str, float], ReleasePoint]:
    """Per (kind, budget): the point of highest task accuracy among those whose
    re-identification is at most its attacker's chance + ``tolerance``
    (:meth:`ReleasePoint.near_chance`; ``chance_reid``: the dataset's, for points without their
    own)."""
    best: dict[tuple[str, float], ReleasePoint] = {}
    for p in points:
        if not p.near_chance(chance_reid, tolerance):
            continue
        key = (p.kind, p.budget)
        if key not in best or p.task > best[key].task:
            best[key] = p
    return best


def label_limit(
    budget: float,
    classes: int,
    clean_accuracy: float,
    fraction: float = GOAL_FRACTION,
    delta: float = 1e-6,
) -> dict[str, float] | None:
    """Theory for private labels: what keeping ``fraction`` of clean accuracy costs.

    A label that survives randomized response with probability ``p`` is right with probability
    ``p·a + (1 − p)(1 − a)/(C − 1)`` (``a`` = clean accuracy); keeping ``fraction·a`` needs
    ``p ≥ (fraction·a − b)/(a − b)`` with ``b = (1 − a)/(C − 1)``, i.e. ε per decision
    ``≥ ln(p(C − 1)/(1 − p))``. The release plan counts the decisions one hour of gaze can
    change for a cadence (:func:`gazeguard.plan.label_cadence`); the largest count whose
    randomized-response releases compose (PLD, at ``delta``) within ``budget`` gives the
    shortest cadence.

    Returns ``{"epsilon_per_decision", "survival", "decisions_per_hour", "cadence_s"}``, or
    ``None`` when no cadence can (the needed ε exceeds one hour's budget or the model is no
    better than chance).
    """
    b = (1.0 - clean_accuracy) / (classes - 1)
    if clean_accuracy <= b:
        return None
    p = (fraction * clean_accuracy - b) / (clean_accuracy - b)
    if p <= 1.0 / classes:
        p = 1.0 / classes + 1e-9
    if p >= 1.0:
        return None
    eps = epsilon_for_survival(p, classes)
    if eps > MAX_EPSILON:
        return None
    cadence = label_cadence(budget, classes, eps, delta=delta, features=FeatureSettings())
    if cadence is None:
        return None
    lo, cadence_s = cadence
    return {
        "epsilon_per_decision": eps,
        "survival": p,
        "decisions_per_hour": float(lo),
        "cadence_s": cadence_s,
    }


def frontier_table(
    dataset: str,
    points: Sequence[ReleasePoint],
    *,
    chance_task: float,
    chance_reid: float,
    tolerance: float,
    limits: Mapping[float, dict[str, float] | None] | None = None,
    cohort: Mapping[str, Any] | None = None,
) -> list[str]:
    """Markdown: per release kind and budget, the best task accuracy at re-identification
    near chance, as a fraction of clean, and whether the goal is met; then the theory line."""
    best = best_near_chance(points, chance_reid, tolerance)
    kinds = list(dict.fromkeys(p.kind for p in points))
    budgets = sorted({p.budget for p in points})
    lines = [
        f"### {dataset}: best task accuracy with re-identification ≤ chance + {tolerance:g} "
        f"({chance_reid + tolerance:.3f})",
        "",
        f"Chance: task {chance_task:.3f}, re-identification {chance_reid:.3f}. Goal: ≥ "
        f"{GOAL_FRACTION:.0%} of clean at ≤ {GOAL_BUDGET:g} ε per hour.",
        *_own_chances(points, chance_reid, tolerance),
        "",
        "| release | ε/hour | best configuration | task | clean | % of clean above chance "
        "| re-id | goal |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for kind in kinds:
        for budget in budgets:
            p = best.get((kind, budget))
            if p is None:
                lines.append(
                    f"| {kind} | {budget:g} | none near chance | | | | | |"
                )  # fmt: skip
                continue
            kept = p.kept
            met = budget <= GOAL_BUDGET and kept >= GOAL_FRACTION
            lines.append(
                f"| {kind} | {budget:g} | {p.detail} | {p.task:.3f} | {p.clean_task:.3f} | "
                f"{100 * kept:.0f} % | {p.reid:.3f} | {'**met**' if met else '—'} |"
            )
    if cohort is not None:
        lines += ["", *cohort_text(cohort)]
    if limits:
        lines += ["", "Theory for labels (randomized response, PLD accountant): to keep "
                  f"{GOAL_FRACTION:.0%} of clean,"]  # fmt: skip
        for budget, lim in sorted(limits.items()):
            if lim is None:
                lines.append(f"- at {budget:g} ε/hour: no cadence can.")
            else:
                lines.append(
                    f"- at {budget:g} ε/hour: ε {lim['epsilon_per_decision']:.2f} per decision "
                    f"(survival {lim['survival']:.2f}), at most "
                    f"{lim['decisions_per_hour']:.0f} decisions in any hour: one every "
                    f"{lim['cadence_s'] / 60:.1f} min or slower."
                )
    return lines


def _own_chances(points: Sequence[ReleasePoint], chance_reid: float, tolerance: float) -> list[str]:
    """The table's note on kinds whose attacker has another chance than the dataset's."""
    own: dict[str, float] = {}
    for p in points:
        if p.chance_reid is not None and not math.isclose(p.chance_reid, chance_reid):
            own.setdefault(p.kind, p.chance_reid)
    if not own:
        return []
    return [
        "Rows whose attacker has other candidates than the dataset's people are near chance "
        f"within their own chance + {tolerance:g}: "
        + "; ".join(f"{k}: chance {c:.3f}, re-id ≤ {c + tolerance:.3f}" for k, c in own.items())
        + "."
    ]


def cohort_text(cohort: Mapping[str, Any]) -> list[str]:
    """What the cohort rows of :func:`frontier_table` measure, how their cohorts were formed and
    what the realistic attacker gets (one paragraph)."""
    return [
        "Cohort rows answer a question about the group, not a person: the activity most of N "
        f"people do in a {cohort['bucket_s']:g} s bucket (each does the bucket's dominant "
        + (
            "activity with probability {dominance:g}), as the worker's mode release (permute-"
            "and-flip over the sessions' vote shares, {per_hour} buckets per hour of gaze; ε "
            "per bucket ".format(dominance=cohort["dominance"], per_hour=cohort["buckets_per_hour"])
            + ", ".join(
                f"{v:.3g} at {b} ε/h" for b, v in cohort.get("mode_epsilon", {}).items() if v
            )
            if "mode" in cohort["release"]
            else f"activity with probability {cohort['dominance']:g}), from the worker's private "
            f"class shares (release {'+'.join(cohort['release'])}: Δ2 = "
            f"{cohort['sensitivity_l2']:.3g}, {cohort['buckets_per_hour']} buckets per hour of "
            "gaze; σ per class "
            + ", ".join(f"{v:.2g} at {b} ε/h" for b, v in cohort["sigma"].items())
        )
        + "); clean is the label model's own accuracy (trained without the person) on the same "
        f"cohorts. Cohorts are the recorded people's buckets ({cohort['people']} people, "
        f"{cohort['units']} person-recording-buckets): {cohort['formation']}; per size "
        + ", ".join(
            f"{r['sessions']}: {r['distinct_people']:.1f} people, "
            f"{100 * r['repeated_units']:.0f} % repeated units"
            for r in cohort["rows"]
        )
        + ". Their re-identification is an informed attacker who knows everyone else's data "
        f"and up to {cohort['candidates']} candidates' contributions in "
        f"{cohort['buckets_per_recording']:.3g} buckets of a recording (maximum likelihood: no "
        "attack on the aggregates does better; repeated others cancel for it). The realistic "
        "attacker — the candidates' data and the population's mean, not the other people's "
        "data — gets "
        + "; ".join(
            f"{row['sessions']} sessions: "
            + ", ".join(f"{a:.3f} at {b} ε/h" for b, a in row["reid_realistic"].items())
            for row in cohort["rows"]
        )
        + f" (chance {cohort['chance_reid']:.3f})."
        + (
            " With the mode, the informed attacker's DP bound (H choices of ε, two candidates a "
            "replaced session apart) is "
            + ", ".join(f"{v:.3f} at {b} ε/h" for b, v in cohort["dp_bound_informed"].items())
            + "."
            if cohort.get("dp_bound_informed")
            else ""
        ),
    ]


def frontier_figure(
    dataset: str,
    points: Sequence[ReleasePoint],
    *,
    chance_task: float,
    chance_reid: float,
    tolerance: float,
    path: Path,
) -> Path:
    """PNG: every point by kind (colour) and budget (size, annotated), each kind's Pareto
    frontier, each kind's clean task accuracy (dotted), chance, and the goal region."""
    import matplotlib as mpl  # noqa: PLC0415

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(10.5, 6.5))
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
    kinds = list(dict.fromkeys(p.kind for p in points))
    budgets = sorted({p.budget for p in points})
    size = {b: 20 + 50 * i for i, b in enumerate(budgets)}
    best_clean = max((p.clean_task for p in points if math.isfinite(p.clean_task)), default=1.0)
    for i, kind in enumerate(kinds):
        color = colors[i % len(colors)]
        mine = [p for p in points if p.kind == kind]
        ax.scatter(
            [p.reid for p in mine],
            [p.task for p in mine],
            s=[size[p.budget] for p in mine],
            color=color,
            alpha=0.55,
            label=kind,
        )
        front = pareto(mine)
        if front:
            ax.step([p.reid for p in front], [p.task for p in front], where="post", color=color)
        clean = mine[0].clean_task
        if math.isfinite(clean):
            ax.axhline(clean, color=color, lw=0.8, ls=":")
    for b in budgets:
        ax.scatter([], [], s=size[b], color="0.5", label=f"{b:g} ε/hour")
    ax.axvline(chance_reid, color="black", lw=1)
    ax.axhline(chance_task, color="black", lw=1)
    ax.axvspan(0, chance_reid + tolerance, color="0.92", zorder=0)
    for cut in sorted({p.chance_reid + tolerance for p in points if p.chance_reid is not None}):
        if not math.isclose(cut, chance_reid + tolerance):  # a kind whose attacker has its own
            ax.axvline(cut, color="0.5", lw=0.8, ls="--", label=f"a kind's own band ≤ {cut:.3f}")
    goal_y = GOAL_FRACTION * best_clean
    ax.add_patch(
        mpl.patches.Rectangle(
            (0, goal_y), chance_reid + tolerance, 1 - goal_y, fill=False, hatch="//",
            edgecolor="tab:green", lw=0.8, label=f"goal (≥ {GOAL_FRACTION:.0%} of best clean)",
        )
    )  # fmt: skip
    ax.set(
        xlim=(0, max(0.5, max((p.reid for p in points), default=0) + 0.05)),
        ylim=(0, 1),
        xlabel="re-identification accuracy (strongest attacker)",
        ylabel="task accuracy on the release",
        title=f"{dataset}: every release kind at user-level ε per hour of gaze\n"
        "(black: chance; dotted: each kind's clean accuracy; grey band: re-id near chance)",
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # no point hidden
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def points_json(points: Sequence[ReleasePoint]) -> list[dict[str, Any]]:
    """JSON-ready points (with the fraction of clean kept above chance)."""
    return [
        {**asdict(p), "kept_above_chance": None if math.isnan(p.kept) else round(p.kept, 4)}
        for p in points
    ]


#: Decision cadences (s) tried for labels; those a dataset's recordings are too short for
#: (fewer than two decisions each) are reported as unavailable.
LABEL_CADENCES = (10.0, 30.0, 60.0, 120.0, 300.0)
QUICK_LABEL_CADENCES = (30.0, 60.0, 120.0)


def evaluate_frontier(
    dataset: Dataset,
    grid: GridConfig,
    profile: str,
    *,
    quick: bool = False,
    cohort_sizes: Sequence[int] | None = None,
    cohort_bucket_s: float = DEFAULT_BUCKET_S,
    progress: Callable[[str], None] = print_progress,
) -> dict[str, Any]:
    """Measure every release kind of one dataset at the grid's user-level budgets per hour.

    Feature streams of all features and of ``profile``'s features (``grid`` with
    ``per_hour_noise`` set: the noise the sidecar calibrates), and private labels from the
    label model of the same name when one is shipped (its own feature list; randomized
    response at the ε each budget allows per decision); and cohort aggregates of the dataset's
    recorded people's buckets (``cohort_bucket_s`` long) over ``cohort_sizes`` members
    (default 10, 30, 100 and 1,000; quick: 10 and 30) where the dataset has two or more people
    and tasks (:mod:`gazeguard.offline.eval.cohort`). Returns the JSON-ready result: ``points``
    (:func:`points_json`), ``meta`` (chance, tolerance, budgets), the two stream results, the
    labels result, the held-label sessions (``label_sessions``), the labels' theory limits per
    budget and the cohort result (``None`` where the dataset cannot hold cohorts).

    Raises:
        ConfigError: ``cohort_sizes`` given for a dataset that cannot hold cohorts (one task or
            one person), or without a shipped label model named ``profile``.
    """
    if grid.per_hour_noise is None:
        msg = "the frontier needs per-hour budgets (GridConfig.per_hour_noise)"
        raise ValueError(msg)
    prof = load_profile(profile)
    cohort_data = _frontier_cohort_data(dataset, grid, prof.name, cohort_sizes, progress)
    streams_all = evaluate_dataset(dataset, replace(grid, features=None, profile=None), progress)
    streams_prof = evaluate_dataset(
        dataset, replace(grid, features=tuple(prof.features), profile=prof.name), progress
    )
    points = stream_points(streams_all, "stream: all features") + stream_points(
        streams_prof, f"stream: {prof.name} profile"
    )
    meta = streams_all["meta"]
    labels_result: dict[str, Any] | None = None
    sessions_result: dict[str, Any] | None = None
    limits: dict[str, dict[str, float] | None] = {}
    if prof.name in shipped_models():
        labels_result, limits = _frontier_labels(dataset, grid, prof.name, quick, progress)
        points += label_points(labels_result, f"labels on a clock ({prof.name} model)")
        sessions_result = frontier_sessions(
            dataset,
            dataset.features(grid.window_s, grid.step_s, grid.cache_dir, progress),
            load_model(prof.name).features,
            budgets=tuple(float(e) for e in grid.epsilons),
            quick=quick,
            seed=grid.settings.insecure_seed,
            progress=lambda m: progress(f"held labels: {m}"),
        )
        if sessions_result is not None:
            points += session_points(sessions_result, prof.name)
    else:
        progress(f"{dataset.name}: no shipped label model named {prof.name!r}: no label points")
    cohort_result: dict[str, Any] | None = None
    if cohort_data is not None:
        cohort_result = evaluate_config(
            cohort_data,
            tuple(float(e) for e in grid.epsilons),
            sizes=tuple(cohort_sizes or (SIZES[:2] if quick else SIZES)),
            bucket_s=cohort_bucket_s,
            release=DEFAULT_RELEASE,  # the group's activity needs the shares only: Δ2 = 1
            window_s=grid.window_s,
            step_s=grid.step_s,
            # sampling error of an accuracy ≤ 0.5/√n: ≤ 0.011 for the task, ≤ 0.004 for the
            # informed attack (its figure is compared with chance + tolerance)
            buckets=500 if quick else 2000,
            trials=4000 if quick else 20_000,
            realistic_trials=300 if quick else 1000,
            seed=grid.settings.insecure_seed,
            progress=lambda m: progress(f"cohort: {m}"),
        )
        points += cohort_points(cohort_result)
    return {
        "dataset": dataset.name,
        "meta": {
            "chance_task": meta["chance_task"],
            "chance_reid": meta["chance_reid"],
            "tolerance": meta["tolerance"],
            "budgets_per_hour": [float(e) for e in grid.epsilons],
            "noise": grid.per_hour_noise,
            "profile": prof.name,
            "goal": {"fraction_of_clean": GOAL_FRACTION, "budget_per_hour": GOAL_BUDGET},
        },
        "points": points_json(points),
        "label_limits": limits,
        "streams": {"all": streams_all, prof.name: streams_prof},
        "labels": labels_result,
        "label_sessions": sessions_result,
        "cohort": cohort_result,
    }


def _frontier_cohort_data(
    dataset: Dataset,
    grid: GridConfig,
    model_name: str,
    cohort_sizes: Sequence[int] | None,
    progress: Callable[[str], None],
) -> CohortData | None:
    """The dataset's cohort data (:func:`gazeguard.offline.eval.cohort.prepare`), or ``None``
    with a note where it cannot hold cohorts; asked for by size (``cohort_sizes``), a dataset
    that cannot is refused, not skipped."""
    if model_name not in shipped_models():
        if cohort_sizes:
            raise ConfigError(
                "cohort-sessions", list(cohort_sizes),
                f"cohorts need the features of a shipped label model; none is named "
                f"{model_name!r} (--profile)", "argument",
            )  # fmt: skip
        return None
    table = dataset.features(grid.window_s, grid.step_s, grid.cache_dir, progress)
    features = load_model(model_name).features
    try:
        check_table(dataset.name, table, features)
    except ConfigError as exc:
        if cohort_sizes:
            raise
        progress(f"{dataset.name}: no cohort points: {exc.reason}")
        return None
    return prepare(dataset.name, table, features, lambda m: progress(f"cohort: {m}"))


def _frontier_labels(
    dataset: Dataset,
    grid: GridConfig,
    model_name: str,
    quick: bool,
    progress: Callable[[str], None],
) -> tuple[dict[str, Any], dict[str, dict[str, float] | None]]:
    """:func:`evaluate_frontier`'s private labels (the shipped model ``model_name``) and their
    theory limit per budget (from the best clean decision accuracy of the cadences)."""
    model = load_model(model_name)
    table = dataset.features(grid.window_s, grid.step_s, grid.cache_dir, progress)
    result = evaluate_labels(
        dataset.name,
        table,
        list(model.features),
        QUICK_LABEL_CADENCES if quick else LABEL_CADENCES,
        reps=50 if quick else 200,
        attack_reps=5 if quick else 20,
        seed=grid.settings.insecure_seed,
        every=2,
        budgets=tuple(float(e) for e in grid.epsilons),
        progress=lambda m: progress(f"labels: {m}"),
    )
    cleans = [
        row["clean_decision_accuracy"] for row in result["cadences"] if "unavailable" not in row
    ]
    limits: dict[str, dict[str, float] | None] = {}
    if cleans:
        classes = len(result["classes"])
        for b in grid.epsilons:
            limits[f"{float(b):g}"] = label_limit(float(b), classes, max(cleans))
    return result, limits
