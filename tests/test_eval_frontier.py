"""The frontier across release kinds (`gazeguard eval --frontier`) and the label evaluation it
uses: Pareto arithmetic, the labels' theory limit against the accountant, the sequence attack,
and the command end to end on simulated people."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazeguard.cli import main
from gazeguard.config import FeatureSettings
from gazeguard.offline.eval.cohort import dominant_activity, reidentification
from gazeguard.offline.eval.frontier import (
    ReleasePoint,
    best_near_chance,
    cohort_points,
    label_limit,
    pareto,
    stream_points,
)
from gazeguard.offline.eval.labels import attack, epsilon_per_decision, sequence_features
from gazeguard.plan import releases_per_hour
from gazeguard.plan.cohort import CohortPlan, plan_cohort
from gazeguard.privacy.accounting import RandomizedResponseEvent, compose
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


def _contributions(people: int, classes: int, seed: int) -> np.ndarray:
    """(people, classes, 2 + classes + 1) contributions as the worker forms them: two feature
    coordinates that differ between people, a one-hot class histogram, the count."""
    rng = np.random.default_rng(seed)
    feats = rng.uniform(0, 0.7, size=(people, 1, 2)).repeat(classes, axis=1)
    onehot = np.broadcast_to(np.eye(classes), (people, classes, classes))
    count = np.ones((people, classes, 1))
    return np.concatenate([feats, onehot, count], axis=2)


def _plans(budgets: list[float], classes: int) -> list[CohortPlan]:
    names = ["saccade_right_ratio", "wordbook2_mean"]
    return [
        plan_cohort(names, [0, 0], [1, 1], ["1", "1"], [str(c) for c in range(classes)],
                    bucket_s=60, per_hour=releases_per_hour(FeatureSettings(), 60, 60),
                    budget=b, delta=1e-6)
        for b in budgets
    ]  # fmt: skip


def test_the_cohorts_dominant_activity_survives_where_theory_says() -> None:
    contribs = _contributions(200, 4, seed=1)
    plans = _plans([1.0, 10.0, 1e5], 4)
    rows = dominant_activity(
        contribs, plans, [10, 200], buckets=300, dominance=0.5,
        rng=np.random.default_rng(2), noise_seed=3,
    )  # fmt: skip
    by_n = {r["sessions"]: r for r in rows}
    for row in rows:  # a perfect label model names the plurality every time
        assert row["clean_accuracy"] == 1.0
        acc = {c["budget_per_hour"]: c["accuracy"] for c in row["released"]}
        assert acc[1e5] == 1.0  # σ ≪ 1 count
    # σ ≈ 7.3 counts at 10 ε/hour: drowns a cohort of 10 (plurality ~5 vs ~2), not one of 200
    small = {c["budget_per_hour"]: c for c in by_n[10]["released"]}
    large = {c["budget_per_hour"]: c for c in by_n[200]["released"]}
    assert small[10.0]["accuracy"] < 0.7 < 0.95 < large[10.0]["accuracy"]
    assert large[10.0]["share_tv"] < small[10.0]["share_tv"]
    assert small[1.0]["accuracy"] < 0.45  # σ ≈ 57: near chance 0.25


def test_the_informed_attacker_finds_people_only_when_the_noise_lets_it() -> None:
    contribs = _contributions(50, 4, seed=4)
    weak, strong = _plans([1.0, 1e5], 4)
    kwargs = {"candidates": 8, "buckets_per_recording": 5, "trials": 2000, "dominance": 0.5}
    # σ ≈ 57 against people ≤ 1 apart: chance (1/8 = 0.125) within sampling error (±0.02)
    at_chance = reidentification(
        contribs, weak, rng=np.random.default_rng(5), noise_seed=6, **kwargs
    )
    assert abs(at_chance - 0.125) < 0.03
    # σ ≪ the distance between people: found every time
    found = reidentification(contribs, strong, rng=np.random.default_rng(7), noise_seed=8, **kwargs)
    assert found > 0.99
    # without the other 49 people's data the same attacker is back near chance (0.125)
    blind = reidentification(
        contribs, strong, rng=np.random.default_rng(9), noise_seed=10, others=49, **kwargs
    )
    assert blind < 0.3


def test_cohort_points_are_one_kind_per_size() -> None:
    result = {
        "bucket_s": 60.0,
        "chance_task": 1 / 6,
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
        "labels on change (activity model)",
        "labels on a clock, held (activity model)",
        "cohort of 10: group's activity",
    }
    held = res["label_sessions"]  # the same sessions both ways, the sidecar's LabelStream
    assert [m["mode"] for m in held["modes"]] == ["change", "clock"]
    assert held["sessions"] == 3
    assert held["changes_per_session"] >= 5
    assert all(c["withheld"] == 0 for m in held["modes"] for c in m["released"])
    cohort = res["cohort"]
    assert cohort["candidates"] == 3  # 1 / the dataset's re-identification chance
    assert [r["sessions"] for r in cohort["rows"]] == [10]
    assert set(cohort["rows"][0]["reid_uninformed"]) == {"1", "10", "100"}
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
    assert "| labels on change (activity model) |" in md
