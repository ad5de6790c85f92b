"""The frontier across release kinds (`gazeguard eval --frontier`) and the label evaluation it
uses: Pareto arithmetic, the labels' theory limit against the accountant, the sequence attack,
and the command end to end on simulated people."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazeguard.cli import main
from gazeguard.config import FeatureSettings
from gazeguard.core.errors import ConfigError
from gazeguard.offline.eval.cohort import (
    CohortUnits,
    Members,
    check_table,
    cohort_plans,
    dyadic,
    group_activity,
    reidentification,
    running_aggregates,
)
from gazeguard.offline.eval.frontier import (
    ReleasePoint,
    best_near_chance,
    cohort_points,
    frontier_table,
    label_limit,
    pareto,
    session_points,
    stream_points,
)
from gazeguard.offline.eval.labels import MODES, attack, epsilon_per_decision, sequence_features
from gazeguard.plan import releases_per_hour
from gazeguard.plan.cohort import CohortPlan
from gazeguard.privacy.accounting import RandomizedResponseEvent, compose
from gazeguard.signal.dataset import FeatureTable
from gazeguard.signal.labels import released_accuracy, survival_probability

unit = st.floats(0.0, 1.0, allow_nan=False)
points = st.lists(
    st.builds(
        ReleasePoint,
        st.sampled_from(["a", "b"]),
        st.just("x"),
        st.sampled_from([1.0, 10.0]),
        unit,
        unit,
        st.just(0.7),
        st.just(0.25),
    ),
    min_size=1,
    max_size=30,
)


@given(points)
def test_the_pareto_front_is_undominated_and_dominates_the_rest(pts: list[ReleasePoint]) -> None:
    front = pareto(pts)
    assert [p.reid for p in front] == sorted(p.reid for p in front)
    for f in front:  # nothing is strictly better on both axes than a front point
        assert not any(q.reid < f.reid and q.task > f.task for q in pts)
    for q in pts:  # every point is matched or beaten by a front point
        assert any(f.reid <= q.reid and f.task >= q.task for f in front)


@given(points, st.floats(0.0, 0.5), st.floats(0.0, 0.1))
def test_best_near_chance_is_the_top_task_within_the_band(
    pts: list[ReleasePoint], chance: float, tol: float
) -> None:
    best = best_near_chance(pts, chance, tol)
    for (kind, budget), p in best.items():
        band = [q for q in pts if q.kind == kind and q.budget == budget and q.reid <= chance + tol]
        assert p.task == max(q.task for q in band)
    for q in pts:
        if q.reid <= chance + tol:
            assert (q.kind, q.budget) in best


@settings(max_examples=25, deadline=None)
@given(
    budget=st.sampled_from([3.0, 10.0, 100.0]),
    classes=st.integers(2, 8),
    acc=st.floats(0.4, 0.95),
)
def test_label_limit_is_the_accountants_edge(budget: float, classes: int, acc: float) -> None:
    lim = label_limit(budget, classes, acc)
    if acc <= 1.0 / classes:
        assert lim is None
        return
    if lim is None:  # then even two decisions at the needed ε overspend the hour
        return
    eps, d = lim["epsilon_per_decision"], int(lim["decisions_per_hour"])
    p = survival_probability(eps, classes)
    assert p == pytest.approx(lim["survival"], rel=1e-9)
    assert released_accuracy(acc, p, classes) >= 0.8 * acc * (1 - 1e-9)
    event = RandomizedResponseEvent(eps, classes)
    assert compose({event: d}, 1e-6).epsilon <= budget
    most = releases_per_hour(FeatureSettings(), 1.0, 0.5)  # decisions of two steps
    if d < most:
        assert compose({event: d + 1}, 1e-6).epsilon > budget  # the largest count that fits
    cadence = lim["cadence_s"]
    assert releases_per_hour(FeatureSettings(), cadence, cadence - 0.5) <= d


def test_label_limit_six_classes_at_ten_per_hour() -> None:
    """The issue's arithmetic: ε ≈ 3 keeps ~80 % for 6 classes; 10 per hour allows a few."""
    lim = label_limit(10.0, 6, 0.6)
    assert lim is not None
    assert 2.0 < lim["epsilon_per_decision"] < 3.5
    assert 3 <= lim["decisions_per_hour"] <= 6
    assert lim["cadence_s"] >= 600.0


def test_epsilon_per_decision_fills_the_hour_and_no_more() -> None:
    eps, per_hour = epsilon_per_decision(10.0, 60.0, 6)
    assert per_hour == 63  # ⌊(3600 + 63.5 + 59.5)/60⌋ + 1: the decisions an hour can change
    assert compose({RandomizedResponseEvent(eps, 6): per_hour}, 1e-6).epsilon <= 10.0
    assert compose({RandomizedResponseEvent(eps * 1.01, 6): per_hour}, 1e-6).epsilon > 10.0


def test_sequence_features_are_histogram_and_transitions() -> None:
    f = sequence_features(np.array([0, 1, 1, 2]), 3)
    assert f[:3] == pytest.approx([0.25, 0.5, 0.25])
    trans = f[3:].reshape(3, 3)
    assert trans[0, 1] == pytest.approx(1 / 3)
    assert trans[1, 1] == pytest.approx(1 / 3)
    assert trans[1, 2] == pytest.approx(1 / 3)
    assert trans.sum() == pytest.approx(1.0)


def test_the_sequence_attack_finds_people_with_habits_and_not_without() -> None:
    rng = np.random.default_rng(3)
    habits = {f"p{i}": rng.dirichlet(np.ones(4) * 0.3) for i in range(6)}
    seqs = {
        f"{p}-{r}": (rng.choice(4, size=60, p=w).astype(np.intp), p, "t")
        for p, w in habits.items()
        for r in range(2)
    }
    found = attack(seqs, 4, seed=0)
    assert found is not None
    assert max(found.values()) >= 0.6  # chance is 1/6
    same = {k: (rng.integers(0, 4, size=60).astype(np.intp), p, t) for k, (_, p, t) in seqs.items()}
    blind = attack(same, 4, seed=0)
    assert blind is not None
    assert max(blind.values()) < 0.6


def test_stream_points_refuse_the_per_chunk_axis() -> None:
    with pytest.raises(ValueError, match="per-hour"):
        stream_points({"meta": {"axis": "per-chunk"}, "rows": []}, "x")


def _units(people: int, classes: int, buckets: int, seed: int) -> CohortUnits:
    """A perfect label model's units: every (person, activity) one recording of ``buckets``
    buckets; contributions a one-hot class share (shares only, Δ2 = 1) nudged by a person's own
    habit (what an attacker can find), as the worker forms them."""
    rng = np.random.default_rng(seed)
    habit = rng.dirichlet(np.ones(classes), size=people) * 0.4
    rows, person, recording, activity, bucket = [], [], [], [], []
    for p in range(people):
        for a in range(classes):
            for b in range(buckets):
                h = 0.6 * np.eye(classes)[a] + habit[p]
                rows.append(h / h.sum())
                person.append(f"p{p}")
                recording.append(f"p{p}_{a}")
                activity.append(a)
                bucket.append(b)
    return CohortUnits(
        np.array(rows), np.array(person), np.array(recording), np.array(activity),
        np.array(bucket), np.full(len(rows), 100), tuple(str(c) for c in range(classes)), 0,
    )  # fmt: skip


def _plans(
    budgets: list[float],
    classes: int,
    bucket_s: float = 60.0,
    release: tuple[str, ...] = ("shares",),
) -> list[CohortPlan]:
    return cohort_plans(
        [str(c) for c in range(classes)], budgets, bucket_s=bucket_s, release=release
    )


@settings(max_examples=40, deadline=None)
@given(
    people=st.integers(2, 6),
    buckets=st.integers(1, 4),
    n=st.integers(1, 80),
    seed=st.integers(0, 2**16),
)
def test_members_are_distinct_people_then_distinct_units_then_repeated(
    people: int, buckets: int, n: int, seed: int
) -> None:
    units = _units(people, 2, buckets, seed=1)
    draw = Members(units, np.random.default_rng(seed))
    who = draw.draw(np.zeros(n, dtype=np.intp))
    pool = people * buckets  # activity 0's units
    assert np.all(units.activity[who] == 0)
    assert len(set(units.person[who[: min(n, people)]].tolist())) == min(n, people)
    assert len(set(who[: min(n, pool)].tolist())) == min(n, pool)  # no repeat while units last
    if n > pool:  # beyond: every unit, then again
        assert set(who.tolist()) == set(np.flatnonzero(units.activity == 0).tolist())
    other = draw.draw(np.zeros(n, dtype=np.intp), exclude_person="p0")
    assert "p0" not in set(units.person[other].tolist())


def test_the_cohorts_dominant_activity_survives_where_theory_says() -> None:
    units = _units(8, 4, 5, seed=1)
    plans = _plans([1.0, 10.0, 1e5], 4)
    rows = group_activity(
        units, plans, [10, 200], buckets=300, dominance=0.5,
        rng=np.random.default_rng(2), noise_seed=3,
    )  # fmt: skip
    by_n = {r["sessions"]: r for r in rows}
    for row in rows:  # habits blur near-ties only: clean names the plurality almost always
        assert row["clean_accuracy"] > 0.9
        acc = {c["budget_per_hour"]: c["accuracy"] for c in row["released"]}
        assert acc[1e5] == pytest.approx(row["clean_accuracy"])  # σ ≪ one member
    assert by_n[10]["distinct_people"] <= 8
    assert by_n[10]["repeated_units"] == 0.0  # 10 members from 40 units per activity
    assert by_n[200]["repeated_units"] > 0.3  # ~112 of the dominant activity from its 40 units
    # σ ≈ 4.3 counts at 10 ε/hour, 60 s buckets: drowns a cohort of 10, not one of 200
    small = {c["budget_per_hour"]: c for c in by_n[10]["released"]}
    large = {c["budget_per_hour"]: c for c in by_n[200]["released"]}
    assert small[10.0]["accuracy"] < 0.8 < 0.95 < large[10.0]["accuracy"]
    assert large[10.0]["share_tv"] < small[10.0]["share_tv"]
    assert small[1.0]["accuracy"] < 0.45  # σ ≈ 34: near chance 0.25
    kept = small[10.0]["kept_above_chance"]
    assert kept == pytest.approx(
        (small[10.0]["accuracy"] - 0.25) / (by_n[10]["clean_accuracy"] - 0.25)
    )


@pytest.mark.slow
def test_the_informed_attacker_finds_people_only_when_the_noise_lets_it() -> None:
    units = _units(8, 4, 5, seed=4)
    weak, strong = _plans([1.0, 1e5], 4)
    kwargs = {"candidates": 8, "trials": 2000}
    # σ ≈ 34 against people < 0.4 apart: chance (1/8 = 0.125) within sampling error (±0.02)
    at_chance = reidentification(units, weak, rng=np.random.default_rng(5), noise_seed=6, **kwargs)
    assert at_chance["chance"] == pytest.approx(0.125)
    assert at_chance["buckets"] == 5
    assert abs(at_chance["accuracy"] - 0.125) < 0.03
    # σ ≪ the distance between people: found every time
    found = reidentification(units, strong, rng=np.random.default_rng(7), noise_seed=8, **kwargs)
    assert found["accuracy"] > 0.99
    # without the other 29 people's data the same attacker is back near chance
    blind = reidentification(
        units, strong, rng=np.random.default_rng(9), noise_seed=10, others=29,
        candidates=8, trials=400,
    )  # fmt: skip
    assert blind["accuracy"] < 0.35


def test_releasing_only_the_dominant_activity_leaves_the_informed_attacker_little() -> None:
    """The mode (permute-and-flip, the runtime's default). At a budget where the full shares
    give everyone away (σ ≈ 0.11 counts), the mode over 30 people (ε ≈ 48 per bucket: nearly
    the argmax) still names the group's activity and tells the attacker who knows the other 29
    almost nothing."""
    units = _units(8, 4, 5, seed=4)
    (plan,) = _plans([3000.0], 4)  # σ ≈ 0.11 counts
    (mode,) = _plans([3000.0], 4, release=("mode",))
    kwargs = {"candidates": 8, "trials": 300, "others": 29}
    full = reidentification(
        units, plan, rng=np.random.default_rng(1), noise_seed=2, knows_others=True, **kwargs
    )
    assert full["accuracy"] > 0.6
    argmax = reidentification(
        units, mode, rng=np.random.default_rng(3), noise_seed=4, knows_others=True,
        dominant_only=True, **kwargs,
    )  # fmt: skip
    assert argmax["accuracy"] < 0.3  # chance 0.125


def test_cohort_plans_count_buckets_as_the_release_plan_and_spend_the_budget() -> None:
    for bucket_s, per_hour in ((60.0, 63), (300.0, 14), (600.0, 8)):
        (plan,) = cohort_plans(["a", "b", "c"], [10.0], bucket_s=bucket_s)
        assert plan.buckets_per_hour == per_hour
        assert releases_per_hour(FeatureSettings(), bucket_s, bucket_s) == per_hour
        assert 9.7 < plan.epsilon_per_hour <= 10.0
        assert plan.sensitivity_l2 == 1.0  # shares alone: one block
    (both,) = cohort_plans(
        ["a", "b"], [10.0], bucket_s=60, release=("means", "shares"),
        profile_features=["fixation_rate", "saccade_rate"],
    )  # fmt: skip
    assert both.sensitivity_l2 == pytest.approx(math.sqrt(3))
    with pytest.raises(ConfigError, match="needs 'shares'"):
        cohort_plans(["a", "b"], [10.0], bucket_s=60, release=("means",))


def test_a_table_with_one_task_or_one_person_holds_no_cohort() -> None:
    x = np.zeros((4, 2))
    one_task = FeatureTable(
        x, np.arange(4.0), np.array(["a", "a", "b", "b"]), np.array(["t"] * 4),
        np.array(["a1", "a1", "b1", "b1"]), ("fixation_rate", "saccade_rate"),
    )  # fmt: skip
    with pytest.raises(ConfigError, match="needs at least 2"):
        check_table("one-task", one_task, ["fixation_rate"])
    one_person = FeatureTable(
        x, np.arange(4.0), np.array(["a"] * 4), np.array(["t", "t", "u", "u"]),
        np.array(["a1", "a1", "a2", "a2"]), ("fixation_rate", "saccade_rate"),
    )  # fmt: skip
    with pytest.raises(ConfigError, match="one person"):
        check_table("one-person", one_person, ["fixation_rate"])
    with pytest.raises(ConfigError, match="lacks pupil_mean"):
        check_table("x", replace(one_task, task=one_person.task), ["pupil_mean"])


@given(st.integers(1, 5000))
def test_the_binary_mechanisms_nodes_cover_the_first_t_buckets(t: int) -> None:
    nodes = dyadic(t)
    assert len(nodes) == bin(t).count("1")
    covered = [b for k, i in nodes for b in range(i * 2**k, (i + 1) * 2**k)]
    assert covered == list(range(t))


def test_at_user_level_the_tree_loses_to_summing_the_bucket_releases() -> None:
    """A person in every bucket moves a level-k node by 2^k: the tree's running totals carry
    more noise than the per-bucket releases summed (which are free post-processing)."""
    r = running_aggregates(10.0, bucket_s=60.0, horizon=64, reps=3000)
    assert r["buckets_per_hour"] == 63
    assert r["tree_nodes_per_hour"] > r["buckets_per_hour"]
    per, tree = np.array(r["rmse_per_bucket"]), np.array(r["rmse_tree"])
    assert np.allclose(per, r["theory_per_bucket"], rtol=0.06)
    assert np.allclose(tree, r["theory_tree"], rtol=0.06)
    assert np.all(tree[1:] > per[1:])  # every running total past the first


def test_session_points_are_one_kind_per_block_length() -> None:
    result = {
        "chance": 0.25,
        "modes": [
            {"mode": m.name, "settings": {"decision_s": m.decision_s}, "clean": 0.6,
             "released": [
                {"budget_per_hour": 10.0, "accuracy": 0.3, "reid": {"accuracy": 0.14}},
                {"budget_per_hour": 100.0, "accuracy": 0.5, "reid": None},  # no attack: left out
             ]}
            for m in MODES
        ],
    }  # fmt: skip
    pts = session_points(result, "activity")
    assert [(p.kind, p.detail) for p in pts] == [
        ("labels on a 120 s clock, held (activity model)", "hour sessions, every 120 s"),
        ("labels on a 30 s clock, held (activity model)", "hour sessions, every 30 s"),
    ]
    assert all((p.budget, p.reid, p.task, p.clean_task) == (10.0, 0.14, 0.3, 0.6) for p in pts)


def test_cohort_points_are_one_kind_per_size() -> None:
    result = {
        "bucket_s": 60.0,
        "chance_task": 1 / 6,
        "chance_reid": 0.049999999999999295,  # a mean of 1/20 over trials
        "reid": {"1": 0.13, "10": 0.14},
        "rows": [
            {"sessions": n, "clean_accuracy": 0.9, "released": [
                {"budget_per_hour": 1.0, "accuracy": 0.3},
                {"budget_per_hour": 10.0, "accuracy": 0.8},
            ]}
            for n in (10, 100)
        ],
    }  # fmt: skip
    pts = cohort_points(result)
    assert len({p.kind for p in pts}) == 2
    assert {(p.budget, p.reid) for p in pts} == {(1.0, 0.13), (10.0, 0.14)}
    assert all(p.clean_task == 0.9 for p in pts)
    assert all(p.kept == pytest.approx((p.task - 1 / 6) / (0.9 - 1 / 6)) for p in pts)
    assert all(p.chance_reid == 0.05 for p in pts)


def test_a_gender_cohort_is_near_its_own_attackers_chance() -> None:
    # 20 readers, 10 of each gender: the cohort's informed attacker picks among the target's
    # gender (chance 0.10); the stream attacker among all 20 (the dataset's 0.05).
    cohort = ReleasePoint("cohort of 30", "x", 10.0, 0.108, 0.85, 0.92, 0.5, chance_reid=0.1)
    stream = ReleasePoint("stream", "y", 10.0, 0.108, 0.60, 0.72, 0.5)
    best = best_near_chance([cohort, stream], 0.05, 0.02)
    assert best == {("cohort of 30", 10.0): cohort}  # 0.108 ≤ 0.10 + 0.02, not ≤ 0.05 + 0.02
    assert not replace(cohort, reid=0.121).near_chance(0.05, 0.02)
    lines = frontier_table(
        "mpiidpeye-gender", [cohort, stream], chance_task=0.5, chance_reid=0.05, tolerance=0.02
    )
    text = "\n".join(lines)
    assert "| cohort of 30 | 10 | x | 0.850 | 0.920 |" in text
    assert "| stream | 10 | none near chance |" in text
    assert "cohort of 30: chance 0.100, re-id ≤ 0.120" in text
    assert "stream: chance" not in text  # the dataset's chance is the header's


@pytest.mark.slow
def test_frontier_command_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    args = [
        "eval", "--frontier", "--quick", "--dataset", "synthetic", "--synthetic-people", "3",
        "--synthetic-duration", "94", "--mechanisms", "cfpa-32", "--utility-reps", "1",
        "--insecure-seed", "5", "--cache-dir", str(tmp_path / "cache"), "--out", str(out),
        "--cohort-sessions", "10",
    ]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "best task accuracy with re-identification" in text
    assert "Theory for labels" in text
    (res,) = json.loads((out / "frontier.json").read_text())
    assert res["meta"]["budgets_per_hour"] == [1.0, 10.0, 100.0]
    kinds = {p["kind"] for p in res["points"]}
    assert kinds == {
        "stream: all features",
        "stream: activity profile",
        "labels on a clock (activity model)",
        "labels on a 120 s clock, held (activity model)",
        "labels on a 30 s clock, held (activity model)",
        "cohort of 10: group's activity",
    }
    held = res["label_sessions"]  # the same sessions on both clocks, the sidecar's LabelStream
    assert [m["mode"] for m in held["modes"]] == ["clock", "clock-30"]
    assert held["sessions"] == 3
    assert held["changes_per_session"] >= 5
    assert all(c["withheld"] == 0 for m in held["modes"] for c in m["released"])
    cohort = res["cohort"]
    assert cohort["candidates"] == 3  # 1 / the dataset's re-identification chance
    assert [r["sessions"] for r in cohort["rows"]] == [10]
    assert set(cohort["rows"][0]["reid_realistic"]) == {"1", "10", "100"}
    assert cohort["release"] == ["mode"]  # the runtime's default release
    assert cohort["bucket_s"] == 300.0
    assert cohort["people"] == 3
    assert cohort["units"] == 3 * 4  # 94 s recordings: one 300 s bucket each, 3 people × 4 tasks
    assert "Cohort rows answer a question about the group" in text
    for p in res["points"]:
        assert p["budget"] in (1.0, 10.0, 100.0)
        assert 0.0 <= p["reid"] <= 1.0
        assert 0.0 <= p["task"] <= 1.0
        chance = p["chance_task"]
        if p["kept_above_chance"] is not None:  # share of clean above chance, not a raw ratio
            want = (p["task"] - chance) / (p["clean_task"] - chance)
            assert math.isclose(p["kept_above_chance"], want, rel_tol=1e-3, abs_tol=1e-4)
    # the profile's stream releases only the profile's features
    prof = res["streams"]["activity"]["meta"]
    assert prof["profile"] == "activity"
    assert sorted(prof["features_released"]) == ["saccade_right_ratio", "wordbook2_mean"]
    assert len(res["streams"]["all"]["meta"]["features_released"]) > 20
    assert (out / "synthetic-frontier.png").stat().st_size > 10_000
    md = (out / "frontier.md").read_text()
    assert "| labels on a clock (activity model) |" in md
    assert "| labels on a 120 s clock, held (activity model) |" in md


def test_cohort_flags_that_cannot_apply_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "out")
    assert main(["eval", "--quick", "--dataset", "synthetic", "--cohort-sessions", "10",
                 "--out", out]) != 0  # fmt: skip
    assert "needs --frontier" in capsys.readouterr().err
    assert main(["eval", "--quick", "--dataset", "synthetic", "--cohort-bucket-s", "60",
                 "--out", out]) != 0  # fmt: skip
    assert "needs --frontier" in capsys.readouterr().err
    # one task: the group's activity is undefined; asked for by size, refused before any work
    names = ("fixation_rate", "saccade_rate")
    rng = np.random.default_rng(0)
    table = FeatureTable(
        rng.random((8, 2)), np.arange(8.0), np.array(["a"] * 4 + ["b"] * 4),
        np.array(["t"] * 8), np.array(["a1"] * 4 + ["b1"] * 4), names,
    )  # fmt: skip
    path = table.save(tmp_path / "one-task.npz")
    code = main(["eval", "--frontier", "--quick", "--dataset", f"table:{path}",
                 "--cohort-sessions", "10", "--out", out])  # fmt: skip
    assert code != 0
    assert "it needs at least 2" in capsys.readouterr().err
