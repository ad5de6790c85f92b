"""Cohort aggregates (`gazeguard.runtime.cohort`): a person's contribution is bounded whatever the
gaze,
an hour of buckets composes within the cohort's budget, the noise has the stated σ, and a bucket
is charged to every contributing session's ledger entry (real SQLite) before its aggregate is
enqueued."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
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
from gazeguard.plan.cohort import STREAM, CohortPlan, plan_cohort
from gazeguard.privacy.accounting import compose
from gazeguard.privacy.mechanisms.randomness import random_source
from gazeguard.runtime.cohort import CohortAggregator, contribution, exact_sum, privatize_sum
from gazeguard.wire.cohort import CohortMessage
from gazeguard.wire.kinds import AGGREGATES

CLASSES = ("read", "watch", "browse")


def small_plan(budget: float = 5.0, classes: tuple[str, ...] = CLASSES, bucket_s: float = 60.0):  # type: ignore[no-untyped-def]
    return plan_cohort(
        ["fixation_rate", "pupil_mean"], [0.0, 2.0], [5.0, 8.0], ["1/s", "mm"], classes,
        bucket_s=bucket_s, per_hour=per_hour(bucket_s), budget=budget, delta=5e-7,
    )  # fmt: skip


@contextmanager
def lab_aggregator(
    tmp_path: Path, plan: CohortPlan, insecure_seed: int
) -> Iterator[tuple[Ledger, CohortAggregator]]:
    """A ledger in ``tmp_path`` and, charging it, cohort ``lab``'s aggregator on worker ``w1``
    (profile and label model ``activity``, noise seeded with ``insecure_seed``)."""
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        yield ledger, CohortAggregator(
            plan, ledger, cohort="lab", worker="w1", profile="activity", model="activity",
            insecure_seed=insecure_seed,
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
    assert AGGREGATES.shipped_schema() == json.loads(
        json.dumps(AGGREGATES.json_schema(), sort_keys=True)
    ), "cohort.schema.json is stale: gazeguard schemas --write gazeguard/data"


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
    with lab_aggregator(tmp_path, plan, insecure_seed=11) as (ledger, agg):
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
        assert cohort_items[0].id == min(p.id for p in pending), "the aggregate goes first"
        handed = rel.enqueued  # what the worker hands its drain: the table's item, to the byte
        assert handed is not None
        assert (handed.id, handed.session, handed.chunk_index, handed.topic, handed.payload) == (
            cohort_items[0].id, cohort_items[0].session, cohort_items[0].chunk_index,
            cohort_items[0].topic, cohort_items[0].payload,
        )  # fmt: skip
        receipts = [json.loads(p.payload) for p in pending if p.topic.endswith("/cohort")]
        assert len(receipts) == n - 1
        assert {r["bucket"] for r in receipts} == {bucket}
        payload = json.loads(cohort_items[0].payload)
        jsonschema.validate(payload, AGGREGATES.shipped_schema())
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


# -- issue 46, finding 6: who is charged is public ---------------------------------------------
def _open_sessions_run(tmp_path: Path, with_gaze: set[str]) -> dict[str, object]:
    """Sessions ``s-a``, ``s-b`` and ``s-z`` open through bucket 2 of a means + attention plan;
    those in ``with_gaze`` send valid gaze and feature vectors, the others only invalid samples
    (NaN gaze, as a closed eye sends). What reaches the ledger and the outbox."""
    from gazeguard.config import CohortSettings  # noqa: PLC0415
    from gazeguard.plan import ReleasePlan  # noqa: PLC0415
    from gazeguard.plan.cohort import ATTENTION_STREAM  # noqa: PLC0415
    from gazeguard.runtime.simulate import simulate_scene_gaze  # noqa: PLC0415

    cohort = CohortSettings(enabled=True, release=["means", "attention"])
    plan = ReleasePlan.build(budget=10.0, delta=1e-6, cohort=cohort)
    c = plan.cohort_plan
    assert c is not None
    bucket_s = c.bucket_s
    t0 = 2 * bucket_s
    sessions = ("s-a", "s-b", "s-z")
    with Ledger(tmp_path / f"{'-'.join(sorted(with_gaze))}.sqlite", caps=plan.ledger_caps()) as led:
        agg = CohortAggregator(c, led, cohort="lab", worker="w1", insecure_seed=3)
        for s in sessions:
            agg.open_session("hmd", s, t0 + 0.5)
        for i, s in enumerate(sessions):
            g = simulate_scene_gaze(20, 60, seed=i, task="reading")
            t = t0 + 5 + g.timestamps
            if s in with_gaze:
                agg.add_gaze("hmd", s, t_unix=t, x_deg=g.x_deg, y_deg=g.y_deg, valid=g.valid)
                x = np.random.default_rng(i).uniform(0, 1, (8, len(c.features)))
                agg.add("hmd", s, x, t0 + 10 + np.arange(8))
            else:
                nan = np.full(len(t), np.nan)
                agg.add_gaze("hmd", s, t_unix=t, x_deg=nan, y_deg=nan, valid=np.zeros(len(t)))
        for s in sessions:
            agg.close_session("hmd", s, t0 + bucket_s - 1)
        released = agg.release_due(t0 + bucket_s + 30)
        assert agg.release_due(t0 + 10 * bucket_s) == [], "closed: no later bucket"
        charges = {
            (s, stream): [(r.chunk_index, r.total, r.epsilon, r.gaze_start, r.gaze_end)
                          for r in led.charges(s, stream)]
            for s in sessions for stream in (STREAM, ATTENTION_STREAM)
        }  # fmt: skip
        states = {
            s: {k: v for k, v in dataclasses.asdict(led.state(s)).items() if k != "session"}
            for s in sessions
        }
        outbox = [(p.session, p.topic, p.payload) for p in led.pending()]
    return {"released": released, "charges": charges, "states": states, "outbox": outbox}


def test_every_open_session_is_charged_alike_valid_gaze_or_not(tmp_path: Path) -> None:
    """Finding 6 of issue 46: a session without valid gaze in a bucket (its samples all invalid)
    is charged and receipted exactly as one with valid gaze, so the ledger's ε that every chunk
    and status quotes says nothing about whose gaze was valid; and everything published, the
    aggregates' public fields included, is byte-identical whoever had valid gaze, but for the
    fields the egress contract classifies released."""
    from gazeguard.wire.egress import MASK, public_view  # noqa: PLC0415

    one = _open_sessions_run(tmp_path, {"s-a", "s-z"})  # s-b: no valid gaze
    released = one["released"]
    assert isinstance(released, list)
    assert [r.sessions for r in released] == [("s-a", "s-b", "s-z")] * 2  # means, attention
    charges = one["charges"]
    assert isinstance(charges, dict)
    for stream in (STREAM, "attention"):
        assert charges["s-a", stream] == charges["s-b", stream] != []
    states = one["states"]
    assert isinstance(states, dict)
    assert states["s-a"] == states["s-b"] == states["s-z"]
    outbox = one["outbox"]
    assert isinstance(outbox, list)
    receipts = {s: [p for who, t, p in outbox if who == s and t.endswith("/cohort")]
                for s in ("s-a", "s-b")}  # fmt: skip
    assert len(receipts["s-a"]) == 2  # one per part; s-z carries the messages
    assert [p.replace(b'"s-a"', b'"s-b"') for p in receipts["s-a"]] == receipts["s-b"]

    # the neighbour: s-a's gaze invalid too, s-b's valid instead
    for other in ({"s-b", "s-z"}, {"s-z"}):
        two = _open_sessions_run(tmp_path, other)
        assert two["charges"] == charges
        assert two["states"] == states
        a = [(s, t, public_view(p)) for s, t, p in outbox]
        b = [(s, t, public_view(p)) for s, t, p in two["outbox"]]  # type: ignore[union-attr]
        assert a == b
        assert any(MASK.encode() in p for _, _, p in a)  # the aggregates' released fields
        assert [p for *_, p in outbox] != [p for *_, p in two["outbox"]]  # type: ignore[union-attr]


def test_open_sessions_are_charged_for_buckets_without_any_data(tmp_path: Path) -> None:
    """A bucket in which sessions are open is released on schedule, each charged, even when
    none of them handed the aggregator anything; a closed session is charged no more."""
    plan = small_plan(budget=5.0)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        agg = CohortAggregator(plan, ledger, cohort="lab", worker="w1", insecure_seed=4)
        agg.open_session("hmd", "s1", 600.0)  # buckets 10 …
        agg.open_session("hmd", "s2", 659.0)
        agg.close_session("hmd", "s2", 700.0)  # … bucket 11 for s2
        released = agg.release_due(60.0 * 13 + 5.0)  # buckets 10, 11, 12 are due
        assert [(r.message.bucket, r.sessions) for r in released] == [
            (10, ("s1", "s2")), (11, ("s1", "s2")), (12, ("s1",)),
        ]  # fmt: skip
        assert all(isinstance(r.message, CohortMessage) for r in released)
        assert [c.chunk_index for c in ledger.charges("s2", STREAM)] == [10, 11]
        assert [c.chunk_index for c in ledger.charges("s1", STREAM)] == [10, 11, 12]
        assert agg.release_due(60.0 * 13 + 5.0) == []
        agg.close_session("hmd", "s1", 60.0 * 13 + 6.0)
        assert [r.message.bucket for r in agg.release_due(1e4)] == [13]
        assert agg.release_due(1e5) == []
