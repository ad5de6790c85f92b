"""The cohort's mode release: permute-and-flip's distribution and privacy, its exact sampler,
its calibration, the aggregator releasing a mode message through a real ledger, its schema and
egress classification."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from fractions import Fraction
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazeguard.ledger import Ledger
from gazeguard.plan.cohort import (
    MODE_GRID,
    MODE_MAX_EPSILON,
    MODE_SENSITIVITY,
    MODE_STREAM,
    mode_epsilon,
    plan_cohort,
)
from gazeguard.privacy.accounting import PureEvent, compose
from gazeguard.privacy.mechanisms.randomness import random_source
from gazeguard.privacy.mechanisms.selection import (
    lead_for,
    permute_and_flip,
    probabilities,
    shuffled,
)
from gazeguard.runtime.cohort import mode_contribution, mode_scores
from gazeguard.wire.cohort import CohortReceipt, ModeMessage
from gazeguard.wire.egress import MASK, field_paths, public_view, released_paths
from gazeguard.wire.kinds import MODE
from tests.runtime.test_cohort import lab_aggregator

CLASSES = ("read", "watch", "browse", "search")


def _chi2_ok(counts: np.ndarray, p: np.ndarray, *, crit: float) -> bool:
    n = counts.sum()
    expected = n * p
    keep = expected > 0
    assert np.all(counts[~keep] == 0), "a choice the mechanism never makes"
    stat = float((((counts - expected) ** 2)[keep] / expected[keep]).sum())
    return stat < crit


def test_the_choices_follow_the_mechanisms_distribution() -> None:
    """20,000 exact draws against the closed form (χ², 3 degrees of freedom, p ≈ 1e-5)."""
    src = random_source(7)
    scores = [4096 * 9, 4096 * 8, 4096 * 6, 0]  # grid steps: 9, 8, 6 and 0 sessions
    eps = Fraction(3, 4)
    n = 20_000
    counts = np.bincount(
        [permute_and_flip(scores, eps, 4096, src) for _ in range(n)], minlength=4
    ).astype(float)
    p = probabilities(np.array(scores) / 4096, 0.75, 1.0)
    assert _chi2_ok(counts, p, crit=25.0)


def test_the_sampler_is_exact_on_the_grid() -> None:
    """Gaps whose coins are exactly e^-1 and 1: the probabilities are closed-form rationals of
    e^-1, and the best is always chosen when the others' coins are exp(−large)."""
    src = random_source(3)
    assert {permute_and_flip([10**9, 0, 0], Fraction(1), 1, src) for _ in range(200)} == {0}
    # ties: uniform among the tied best
    counts = Counter(permute_and_flip([5, 5, 5], Fraction(1), 1, src) for _ in range(6000))
    assert _chi2_ok(np.array([counts[i] for i in range(3)], float), np.full(3, 1 / 3), crit=23.0)


def test_successive_draws_are_independent() -> None:
    """Consecutive choices of the OS CSPRNG sampler (a fair 3-way choice): the table of pairs
    is the product of its margins (χ², 4 degrees of freedom, p ≈ 1e-4)."""
    src = random_source(None)
    draws = [permute_and_flip([1, 1, 1], Fraction(1, 2), 1, src) for _ in range(9001)]
    table = np.zeros((3, 3))
    for a, b in itertools.pairwise(draws):
        table[a, b] += 1
    expected = np.outer(table.sum(1), table.sum(0)) / table.sum()
    assert float(((table - expected) ** 2 / expected).sum()) < 23.5
    perms = Counter(tuple(shuffled(3, src)) for _ in range(6000))
    assert len(perms) == 6
    assert _chi2_ok(np.array(list(perms.values()), float), np.full(6, 1 / 6), crit=30.0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 40.0), min_size=2, max_size=7),
    st.data(),
    st.floats(0.05, 3.0),
)
def test_monotone_neighbours_are_within_e_to_the_epsilon(
    q: list[float], data: st.DataObject, eps: float
) -> None:
    """The privacy claim, exactly: adding one session raises every score by a_r ∈ [0, Δ];
    every output's probability changes by at most a factor e^ε (both ways)."""
    a = data.draw(st.lists(st.floats(0.0, 1.0), min_size=len(q), max_size=len(q)))
    p = probabilities(q, eps, 1.0)
    p2 = probabilities(np.array(q) + np.array(a), eps, 1.0)
    assert p.sum() == pytest.approx(1.0)
    bound = math.exp(eps) * (1 + 1e-9) + 1e-12
    assert np.all(p <= bound * p2 + 1e-300)
    assert np.all(p2 <= bound * p + 1e-300)


def test_scores_round_monotonically_within_the_stated_sensitivity() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        base = rng.random(4) * 50
        h = mode_contribution(rng.random((7, 4)), 4)
        assert np.all(h >= 0.0)
        assert np.all(h <= 1.0)
        assert h.sum() <= 1.0 + 1e-12
        before, after = np.array(mode_scores(base)), np.array(mode_scores(base + h))
        assert np.all(after >= before)
        assert np.all(after - before <= MODE_SENSITIVITY)
    assert MODE_SENSITIVITY * MODE_GRID >= 1 + MODE_GRID + 2 * 2.0**-33


def test_an_hour_of_modes_composes_to_the_budget() -> None:
    for per_hour, budget in ((14, 10.0), (8, 10.0), (2, 10.0), (63, 1.0)):
        eps = mode_epsilon(per_hour, budget, 1e-6)
        assert (eps / Fraction(1, 2**20)).denominator == 1
        assert compose({PureEvent(float(eps)): per_hour}, 1e-6).epsilon <= budget
        more = float(eps + Fraction(1, 2**20))
        assert compose({PureEvent(more): per_hour}, 1e-6).epsilon > budget
        assert float(eps) >= budget / per_hour
    plan = plan_cohort(
        [], [], [], [], (), bucket_s=300.0, per_hour=14, budget=10.0, delta=1e-6,
        mode_classes=CLASSES,
    )  # fmt: skip
    (part,) = plan.parts
    assert part.stream == MODE_STREAM
    assert isinstance(part.event, PureEvent)
    assert part.event.epsilon == float(part.epsilon or 0)
    assert plan.epsilon_per_hour <= 10.0
    assert "permute-and-flip" in plan.text()
    # beside a Gaussian part: both fit the budget together
    both = plan_cohort(
        [], [], [], [], CLASSES, bucket_s=300.0, per_hour=14, budget=10.0, delta=1e-6,
        mode_classes=CLASSES,
    )  # fmt: skip
    assert [p.name for p in both.parts] == ["aggregates", "mode"]
    assert both.epsilon_per_hour <= 10.0 * (1 + 1e-9)
    assert both.mode_epsilon is not None
    assert both.mode_epsilon < (plan.mode_epsilon or 0)


def test_the_mode_spends_at_most_its_cap_per_bucket() -> None:
    """A budget that would buy more than MODE_MAX_EPSILON per choice buys the cap (the rest
    goes to the other kinds); the cap still composes within the budget."""
    eps = mode_epsilon(14, 30_000.0, 1e-6)
    assert eps == MODE_MAX_EPSILON
    assert mode_epsilon(1, 10.0, 1e-6) == 10  # one choice an hour: the whole budget
    assert compose({PureEvent(float(eps)): 14}, 1e-6).epsilon <= 30_000.0


def test_lead_for_is_where_the_best_wins_that_often() -> None:
    for eps, c in ((0.7, 6), (5.0, 4), (0.25, 2)):
        g = lead_for(0.9, eps, c)
        q = np.zeros(c)
        q[0] = g
        assert probabilities(q, eps)[0] == pytest.approx(0.9, abs=1e-6)


def test_the_aggregator_releases_a_mode_through_a_real_ledger(tmp_path: Path) -> None:
    plan = plan_cohort(
        [], [], [], [], (), bucket_s=60.0, per_hour=63, budget=10.0, delta=1e-6,
        mode_classes=CLASSES,
    )  # fmt: skip
    n, bucket = 40, 29_000_000
    t0 = bucket * 60.0
    rng = np.random.default_rng(5)
    with lab_aggregator(tmp_path, plan, insecure_seed=2) as (ledger, agg):
        for i in range(n):
            probs = np.full((10, 4), 0.05)
            probs[:, 1 if i % 4 else 2] = 0.85  # 30 sessions watch, 10 browse
            agg.add("dev", f"s{i}", np.zeros((10, 0)), t0 + 1 + rng.random(10) * 50, probs)
        agg.open_session("dev", "idle", t0 + 1)  # open, no data: charged, contributes zero
        (rel,) = agg.release_due(t0 + 66.0)
        msg = rel.message
        assert isinstance(msg, ModeMessage)
        assert msg.mode == "watch"  # a lead of ~18 sessions at ε 0.24: e^-4 per rival, at most
        assert len(rel.sessions) == n + 1
        for s in rel.sessions:
            (c,) = ledger.charges(s, MODE_STREAM)
            assert c.chunk_index == bucket
        pending = ledger.pending()
        assert len(pending) == n + 1
        carried = [p for p in pending if p.topic == "gazeguard/v1/cohort/lab/mode"]
        assert len(carried) == 1
        payload = json.loads(carried[0].payload)
        jsonschema.validate(payload, MODE.shipped_schema())
        assert ModeMessage.model_validate(payload) == msg
        receipts = [
            CohortReceipt.from_payload(p.payload) for p in pending if p.topic.endswith("/cohort")
        ]
        assert len(receipts) == n
        assert {(r.release, r.mechanism) for r in receipts} == {("mode", "permute-and-flip")}
        assert receipts[0].noise_multiplier == pytest.approx(1 / msg.epsilon)
        assert ledger.verify() == []
        state = ledger.state("idle")
        # one pure-ε choice: ε at δ is at most ε (the accountant's exact RR composition)
        assert 0.99 * msg.epsilon <= state.epsilon <= msg.epsilon
    assert msg.epsilon == plan.mode_epsilon
    assert msg.epsilon_per_hour <= 10.0


def test_mode_schema_is_shipped_and_classified() -> None:
    assert MODE.shipped_schema() == MODE.json_schema()
    paths = field_paths(MODE.shipped_schema())
    assert released_paths("gazeguard.mode/1") == {"mode", "mode_index"}
    assert "classes" in paths
    msg = ModeMessage(
        cohort="lab", worker="w", bucket=3, bucket_start=180.0, bucket_end=240.0,
        classes=list(CLASSES), mode="search", mode_index=3, epsilon=0.5, lead_for_90=6.0,
        epsilon_per_hour=10.0, delta=1e-6, profile="activity", model="activity",
        noise="os-csprng",
    )  # fmt: skip
    view = json.loads(public_view(msg.to_payload()))
    assert view["mode"] == MASK
    assert view["mode_index"] == MASK
    assert view["classes"] == list(CLASSES)
    with pytest.raises(ValueError, match="classes"):
        ModeMessage.model_validate({**json.loads(msg.to_payload()), "mode": "read"})


def test_a_fleet_workers_default_cohort_releases_the_mode(tmp_path: Path) -> None:
    """`gazeguard run --fleet` with the default cohort settings: the plan's cohort is the mode
    alone, over the default label model's classes, per 300 s bucket, at the cohort's share; the
    worker's wiring feeds it the sessions' features and publishes on …/mode."""
    from gazeguard.config import load_settings  # noqa: PLC0415
    from gazeguard.plan import ReleasePlan  # noqa: PLC0415
    from gazeguard.runtime.fleet import CohortWiring  # noqa: PLC0415
    from gazeguard.signal.labels import load_model  # noqa: PLC0415

    settings = load_settings(
        None, fleet={"enabled": True}, ingest={"source": "lsl"},
        ledger={"budget_per_hour": 10.0}, cohort={"enabled": True, "name": "lab"},
    )  # fmt: skip
    plan = ReleasePlan.from_settings(settings)
    cohort = plan.cohort_plan
    assert cohort is not None
    assert [p.name for p in cohort.parts] == ["mode"]
    assert cohort.mode_classes == load_model(settings.cohort.model or "").classes
    assert settings.cohort.model == "activity-portable"
    assert cohort.bucket_s == 300.0
    assert plan.figures()["cohort"]["release"] == ["mode"]
    assert cohort.epsilon_per_hour <= settings.cohort.budget_share * 10.0
    with Ledger(tmp_path / "ledger.sqlite", caps=plan.ledger_caps()) as ledger:
        wiring = CohortWiring.build(settings, plan, ledger, "w1", "gazeguard/v1")
        assert wiring.model is not None
        assert wiring.aggregator.mode_topic == "gazeguard/v1/cohort/lab/mode"
