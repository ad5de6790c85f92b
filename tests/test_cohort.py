"""Cohort aggregates (`gazeguard.runtime.cohort`): a person's contribution is bounded whatever the
gaze,
an hour of buckets composes within the cohort's budget, the noise has the stated σ, and a bucket
is charged to every contributing session's ledger entry (real SQLite) before its aggregate is
enqueued."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gazeguard.config import FeatureSettings
from gazeguard.core.errors import ConfigError
from gazeguard.ledger import Ledger
from gazeguard.plan import releases_per_hour
from gazeguard.plan.cohort import STREAM, plan_cohort
from gazeguard.privacy.accounting import compose
from gazeguard.privacy.mechanisms.randomness import random_source
from gazeguard.runtime.cohort import CohortAggregator, contribution, exact_sum, privatize_sum
from gazeguard.wire.cohort import CohortMessage, json_schema, shipped_schema

CLASSES = ("read", "watch", "browse")


def small_plan(budget: float = 5.0, classes: tuple[str, ...] = CLASSES, bucket_s: float = 60.0):  # type: ignore[no-untyped-def]
    return plan_cohort(
        ["fixation_rate", "pupil_mean"], [0.0, 2.0], [5.0, 8.0], ["1/s", "mm"], classes,
        bucket_s=bucket_s, per_hour=per_hour(bucket_s), budget=budget, delta=5e-7,
    )  # fmt: skip


def per_hour(bucket_s: float) -> int:
    """The buckets one hour of gaze can change (the release plan's count, default features)."""
    return releases_per_hour(FeatureSettings(), bucket_s, bucket_s)


values = st.floats(allow_nan=True, allow_infinity=True, width=64)


@settings(max_examples=200, deadline=None)
@given(
    X=arrays(np.float64, st.tuples(st.integers(1, 20), st.just(2)), elements=values),
    P=arrays(np.float64, st.tuples(st.integers(1, 20), st.just(3)), elements=values),
)
def test_a_contribution_is_bounded_whatever_the_gaze(X: np.ndarray, P: np.ndarray) -> None:
    plan = small_plan()
    P = P[: len(X)] if len(P) >= len(X) else np.resize(P, (len(X), 3))
    v = contribution(plan, X, P)
    assert v.shape == (plan.dimension,)
    assert np.all(np.isfinite(v))
    assert np.linalg.norm(v) <= plan.sensitivity_l2
    assert v[-1] == 1.0  # the count


@settings(max_examples=25, deadline=None)
@given(
    budget=st.floats(0.5, 100.0),
    bucket_s=st.sampled_from([10.0, 60.0, 300.0]),
    classes=st.sampled_from([(), CLASSES]),
)
def test_an_hour_of_buckets_composes_within_the_budget(
    budget: float, bucket_s: float, classes: tuple[str, ...]
) -> None:
    plan = small_plan(budget, classes, bucket_s)
    # every bucket holding a vector an hour of gaze reaches: ⌊(3600 + 63.5 + B)/B⌋ + 1
    assert plan.buckets_per_hour == math.floor((3600 + 63.5 + bucket_s) / bucket_s) + 1
    eps = compose({plan.event: plan.buckets_per_hour}, plan.delta).epsilon
    assert eps <= budget * (1 + 1e-9)
    assert eps >= budget * 0.97  # and the noise is not wastefully large
    assert plan.sensitivity_l2 == pytest.approx(math.sqrt(2 + bool(classes)))
    assert plan.sigma >= plan.event.ratio * plan.sensitivity_l2  # the grid only adds noise


def test_more_budget_less_noise_and_bad_plans_refused() -> None:
    assert small_plan(10.0).sigma < small_plan(5.0).sigma < small_plan(1.0).sigma
    with pytest.raises(ConfigError, match="lo < hi"):
        plan_cohort(["a"], [1.0], [1.0], [""], (), bucket_s=60, per_hour=63, budget=1, delta=1e-6)
    with pytest.raises(ConfigError, match=">= 2 classes"):
        plan_cohort([], [], [], [], ("x",), bucket_s=60, per_hour=63, budget=1, delta=1e-6)
    with pytest.raises(ConfigError, match="at least one feature"):
        plan_cohort([], [], [], [], (), bucket_s=60, per_hour=63, budget=1, delta=1e-6)


def test_the_noise_has_the_stated_sigma_and_lies_on_the_grid() -> None:
    plan = small_plan()
    source = random_source(7)
    draws = np.stack([privatize_sum(plan, np.zeros(plan.dimension), source) for _ in range(600)])
    sd = draws.std()
    assert sd == pytest.approx(plan.sigma, rel=0.05)  # 600 × 6 draws: sd error ≈ 1.2 %
    grid = float(plan.noise.grid[0])
    assert np.all(np.rint(draws / grid) * grid == draws)


def test_exact_sum_is_correctly_rounded() -> None:
    parts = np.array([[1e16], [1.0], [-1e16]] * 3)
    assert exact_sum(parts)[0] == 3.0  # a naive float sum gives 0 or 4


def test_schema_file_is_current() -> None:
    assert shipped_schema() == json.loads(json.dumps(json_schema(), sort_keys=True)), (
        "cohort.schema.json is stale: gazeguard schemas --write gazeguard/data"
    )


def _feed(agg: CohortAggregator, n: int, rng: np.random.Generator, t0: float) -> np.ndarray:
    """``n`` sessions with 20 vectors each in the bucket starting at ``t0``; their true means."""
    truth = []
    for i in range(n):
        x = np.column_stack([rng.uniform(0, 5, 20), rng.uniform(2, 8, 20)])
        p = rng.dirichlet(np.ones(3), 20)
        agg.add("hmd", f"s{i:04d}", x, t0 + np.linspace(1, 59, 20), p)
        truth.append(x.mean(axis=0))
    return np.array(truth)


def test_a_bucket_charges_every_session_then_enqueues_the_aggregate(tmp_path: Path) -> None:
    plan = small_plan(budget=5.0)
    n, bucket = 400, 29_000_000
    t0 = bucket * 60.0
    rng = np.random.default_rng(3)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        agg = CohortAggregator(
            plan, ledger, cohort="lab", worker="w1", profile="activity", model="activity",
            insecure_seed=11,
        )  # fmt: skip
        truth = _feed(agg, n, rng, t0)
        assert agg.release_due(t0 + 60.0) == []  # the grace period has not passed
        (rel,) = agg.release_due(t0 + 66.0)
        assert agg.open_buckets == []
        msg = rel.message
        assert len(rel.sessions) == n
        assert rel.left_out == ()
        for s in rel.sessions:
            (c,) = ledger.charges(s, STREAM)
            assert c.chunk_index == bucket
        pending = ledger.pending()
        assert len(pending) == n
        cohort_items = [p for p in pending if p.topic == "gazeguard/v1/cohort/lab/aggregates"]
        assert len(cohort_items) == 1
        assert cohort_items[0].id == max(p.id for p in pending), "the aggregate goes last"
        receipts = [json.loads(p.payload) for p in pending if p.topic.endswith("/cohort")]
        assert len(receipts) == n - 1
        assert {r["bucket"] for r in receipts} == {bucket}
        payload = json.loads(cohort_items[0].payload)
        jsonschema.validate(payload, shipped_schema())
        assert CohortMessage.model_validate(payload) == msg
        assert ledger.verify() == []
    assert abs(msg.noisy_count - n) < 5 * plan.sigma
    assert msg.epsilon_per_hour <= 5.0 + 1e-9
    means = np.array([f.mean for f in msg.features])
    sds = np.array([f.sd for f in msg.features])
    assert np.all(np.abs(means - truth.mean(axis=0)) < 5 * sds + 1e-9)
    assert sum(msg.shares) == pytest.approx(1.0)


def test_sessions_without_budget_are_left_out_before_the_sum(tmp_path: Path) -> None:
    plan = small_plan(budget=5.0)
    one, two = (compose({plan.event: k}, 1e-6).epsilon for k in (1, 2))
    rng = np.random.default_rng(4)
    with Ledger(tmp_path / "ledger.sqlite", session_cap=(one + two) / 2) as ledger:
        agg = CohortAggregator(plan, ledger, cohort="lab", worker="w1", insecure_seed=1)
        _feed(agg, 5, rng, 60.0)
        (first,) = agg.release_due(1e9)
        assert len(first.sessions) == 5
        _feed(agg, 5, rng, 120.0)
        assert agg.release_due(1e9) == [], "every session's cap is reached: nothing released"
        assert all(len(ledger.charges(s, STREAM)) == 1 for s in first.sessions)
        assert len(ledger.pending()) == 5


def test_histogram_only_plans_and_late_vectors(tmp_path: Path) -> None:
    """Without features the aggregate is a label histogram; vectors for a released bucket are
    dropped and counted, never summed into a bucket released again."""
    plan = plan_cohort(
        [], [], [], [], ("a", "b"), bucket_s=60, per_hour=per_hour(60), budget=10, delta=1e-6
    )
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        agg = CohortAggregator(plan, ledger, cohort="c", worker="w", insecure_seed=2)
        for i in range(5):
            agg.add("d", f"s{i}", np.zeros((3, 0)), [61.0, 62.0, 63.0], [[0.9, 0.1]] * 3)
        (rel,) = agg.release_due(1e9)
        assert rel.message.features == []
        assert len(rel.message.shares) == 2
        # no count coordinate: a person moves the histogram by ≤ 1 in L2, and its total counts
        assert plan.dimension == 2
        assert plan.sensitivity_l2 == 1.0
        assert rel.message.sensitivity_l2 == 1.0
        total = sum(rel.message.noisy_histogram)
        assert rel.message.noisy_count == pytest.approx(total, rel=1e-9)
        assert rel.message.count == max(1, round(rel.message.noisy_count))
        agg.add("d", "s0", np.zeros((1, 0)), [61.0], [[0.5, 0.5]])
        assert agg.late_vectors == 1
        assert agg.open_buckets == []
        assert agg.release_due(1e9) == []


def test_cohort_settings_need_fleet_mode_and_a_budget_per_hour() -> None:
    from gazeguard.config import load_settings  # noqa: PLC0415
    from gazeguard.runtime.preflight import validate_settings  # noqa: PLC0415

    alone = load_settings(None, cohort={"enabled": True})
    assert [p.field for p in validate_settings(alone)] == ["cohort.enabled"]
    assert "--fleet" in validate_settings(alone)[0].reason
    unbounded = load_settings(
        None, cohort={"enabled": True}, fleet={"enabled": True}, ledger={"budget_per_hour": None}
    )
    found = validate_settings(unbounded)
    assert [p.field for p in found if "budget_per_hour" in p.reason] == ["cohort.enabled"]


def test_a_session_another_worker_charged_for_the_bucket_is_left_out_before_the_sum(
    tmp_path: Path,
) -> None:
    """A session that moved to this worker mid-bucket (its vectors replayed here) after the
    other worker released the bucket with it: left out here, charged once, the rest released."""
    plan = small_plan(budget=5.0)
    rng = np.random.default_rng(5)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        first = CohortAggregator(plan, ledger, cohort="lab", worker="w1", insecure_seed=1)
        second = CohortAggregator(plan, ledger, cohort="lab", worker="w2", insecure_seed=2)
        _feed(first, 3, rng, 120.0)  # s0000 … s0002 in bucket 2 on w1
        x = np.column_stack([rng.uniform(0, 5, 20), rng.uniform(2, 8, 20)])
        p = rng.dirichlet(np.ones(3), 20)
        t = 120.0 + np.linspace(1, 59, 20)
        for s in ("s0002", "s0100", "s0101"):  # s0002 moved to w2, whose replay fed it too
            second.add("hmd", s, x, t, p)
        (one,) = first.release_due(1e9)
        (two,) = second.release_due(1e9)
        assert one.sessions == ("s0000", "s0001", "s0002")
        assert two.sessions == ("s0100", "s0101"), "s0002 is in w1's sum: not summed again"
        for s in ("s0000", "s0001", "s0002", "s0100", "s0101"):
            assert [c.chunk_index for c in ledger.charges(s, STREAM)] == [2]
        carried = [q for q in ledger.pending() if q.topic.endswith("/aggregates")]
        assert len(carried) == 2  # both aggregates go out, each carried by its last charge
        assert ledger.verify() == []
