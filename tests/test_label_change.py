"""Labels released on change: exact samplers, the sparse vector technique, and the label stream
under adversarial flapping (real SQLite ledger with the plan's caps).

- The exact discrete Laplace and Bernoulli(exp(−γ)) samplers match their pmfs (chi-square).
- AboveThreshold says "above" at once for a query far above the threshold and almost never
  for one far below; a round ends at its first "above".
- A session whose activity flips every block for hours: labels are at least
  ``min_interval_s`` apart, no ledger window holds more than the plan's count, the ledger never
  refuses one, and every window's ε stays within the budget.
- A steady activity releases one label (the first) and then asks, without releasing.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from test_label_stream import MODEL_FEATURES, fast_model

from gazeguard.config import FeatureSettings, LabelSettings, MechanismSettings
from gazeguard.ledger import Ledger
from gazeguard.plan import ReleasePlan
from gazeguard.privacy.mechanisms.exact import bernoulli_exp, discrete_laplace
from gazeguard.privacy.mechanisms.randomness import InsecureSeededRandom, OsRandom
from gazeguard.privacy.mechanisms.svt import AboveThreshold
from gazeguard.runtime.labels import LabelStream
from gazeguard.wire.label import LabelMessage

FAST = FeatureSettings(window_s=2.0, step_s=0.05)


def test_discrete_laplace_matches_its_pmf() -> None:
    src = InsecureSeededRandom(7)
    scale = Fraction(3, 2)
    draws = np.array([discrete_laplace(scale, src) for _ in range(20_000)])
    zs = np.arange(-8, 9)
    pmf = np.exp(-np.abs(zs) / float(scale))
    pmf /= np.exp(-np.abs(np.arange(-200, 201)) / float(scale)).sum()
    observed = np.array([(draws == z).sum() for z in zs])
    tail = len(draws) - observed.sum()
    expected = np.append(pmf * len(draws), len(draws) * (1 - pmf.sum()))
    assert stats.chisquare(np.append(observed, tail), expected).pvalue > 1e-4


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(7, 3)])
def test_bernoulli_exp_matches_exp_minus_gamma(gamma: Fraction) -> None:
    src = InsecureSeededRandom(3)
    n = 20_000
    hits = sum(bernoulli_exp(gamma, src) for _ in range(n))
    p = math.exp(-float(gamma))
    assert abs(hits - n * p) < 5 * math.sqrt(n * p * (1 - p)) + 1


def test_above_threshold_ends_a_round_at_the_first_above() -> None:
    svt = AboveThreshold(20.0, 2.0, 0.1, OsRandom())
    hits = 0
    for _ in range(400):  # noise of scale 4Δ/ε = 0.4 (query), 0.2 (threshold): ~3 % lift −1
        if not svt.active:
            svt.start()
        hits += svt.query(-1.0)
    assert hits <= 40
    svt.start()
    assert any(svt.query(50.0) for _ in range(3))
    assert not svt.active
    with pytest.raises(RuntimeError):
        svt.query(0.0)


def _vectors(model_classes: int, cls: int, n: int) -> np.ndarray:
    """(n, 3) feature vectors the fast model puts firmly in class ``cls`` (its coef is the
    identity over standardised features: one feature high, the others low)."""
    mean, scale = np.array([3.0, 3.0, 5.0]), np.array([1.0, 1.0, 3.0])
    z = np.full(3, -3.0)
    z[cls] = 3.0
    return np.tile(mean + scale * z, (n, 1))


def _stream(
    tmp_path: Path, model: Path, epsilon: float | None = None, seed: int | None = None
) -> tuple[ReleasePlan, Ledger, LabelStream]:
    labels = LabelSettings(
        enabled=True, model=str(model), decision_s=1.0, min_interval_s=5.0, threshold=0.1,
        epsilon=epsilon, svt_fraction=0.25 if epsilon is None else 0.5,
    )  # fmt: skip
    plan = ReleasePlan.build(
        features=FAST,
        mechanism=MechanismSettings(
            features=MODEL_FEATURES, epsilon=None if epsilon is None else 1.0
        ),
        budget=10.0 if epsilon is None else None,
        delta=1e-6,
        labels=labels,
    )
    assert plan.label_plan is not None
    ledger = Ledger(tmp_path / "l.sqlite", **plan.ledger_caps())
    ledger.open_session("s")
    stream = LabelStream(
        ledger, plan.label_plan, session="s", device="d", input_features=MODEL_FEATURES,
        insecure_seed=seed,
    )  # fmt: skip
    return plan, ledger, stream


@pytest.mark.slow
def test_flapping_activity_never_spends_more_than_the_plan(tmp_path: Path) -> None:
    plan, ledger, stream = _stream(tmp_path, fast_model(tmp_path / "m.json"))
    assert plan.labels is not None
    steps = stream.plan.steps  # 20 vectors of 0.05 s per 1 s block
    released: list[LabelMessage] = []
    t0 = 1000.0
    with ledger:
        for b in range(3 * 3600):  # three hours of 1 s blocks, the activity flipping each one
            X = _vectors(3, b % 3, steps)
            t = t0 + b + np.arange(1, steps + 1) * 0.05
            for block, times in stream.add(X, t):
                out = stream.release(block, times, offset=0.0)
                if out is not None:
                    released.append(out.message)
        state = ledger.state("s")
    assert stream.stats.withheld == 0  # the plan's rate bound keeps within the cap
    ends = np.array([m.window_end for m in released])
    assert np.all(np.diff(ends) >= 5.0 - 1e-9)  # min_interval_s apart
    window = plan.window_s
    for e in ends:  # no ledger window of release ends holds more than the plan's count
        assert np.count_nonzero((ends > e - window) & (ends <= e)) <= plan.labels.per_hour
    assert state.epsilon_window <= 10.0
    assert all(m.release == "change" and m.epsilon_change is not None for m in released)
    assert len(released) > 3 * 3600 / 5.0 * 0.5  # flapping: it does release on change


def test_a_steady_activity_releases_the_first_label_and_then_only_asks(tmp_path: Path) -> None:
    # ε 60 per label, 30 per detection round: query noise of scale 4Δ/ε ≈ 0.27 (Δ = 2). Seeded
    # noise: with fresh noise 4 of 40 runs released 4 or more labels in these 120 checks (the
    # bound below is not a rare event), so one fixed draw keeps the test from flaking.
    _plan, ledger, stream = _stream(
        tmp_path, fast_model(tmp_path / "m.json"), epsilon=60.0, seed=20261128
    )
    steps = stream.plan.steps
    released = 0
    with ledger:
        for b in range(120):
            X = _vectors(3, 1, steps)
            t = 1000.0 + b + np.arange(1, steps + 1) * 0.05
            for block, times in stream.add(X, t):
                released += stream.release(block, times, offset=0.0) is not None
    assert released <= 3  # the first, and rare false alarms of the noisy detector
    assert stream.stats.checks >= 100  # a check per block once min_interval_s has passed
