"""The release plan: ``mechanism.name = "auto"`` and ``show --budget-per-hour`` (public prior)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gazeguard.cli.mechanisms import main
from gazeguard.config import FeatureSettings, MechanismSettings
from gazeguard.ledger import Ledger
from gazeguard.plan import ReleasePlan, chunk_counter, chunks_per_hour
from gazeguard.plan.chunks import rank_mechanisms
from gazeguard.privacy.mechanisms import Bounds, make_mechanism
from gazeguard.runtime.pipeline import Pipeline
from gazeguard.signal.features import feature_bounds

NAMES = ["fixation_rate", "saccade_rate", "pupil_mean"]
#: The chunks an hour of gaze can change, for chunks of at most 64 steps (the plan's count).
COUNTER = chunk_counter(FeatureSettings(), 64)


def bounds(window_s: float = 30.0, step_s: float = 0.5) -> Bounds:
    lo, hi, max_step = feature_bounds(NAMES, window_s, step_s)
    return Bounds(lo=lo, hi=hi, max_step=max_step)


@pytest.mark.slow
def test_ranking_is_sorted_calibrated_and_respects_the_longest_chunk() -> None:
    ranked = rank_mechanisms(
        MechanismSettings(features=NAMES), NAMES, bounds(), 0.5,
        budget=10.0, chunks_for=COUNTER, delta=1e-6, max_chunk_steps=64,
    )  # fmt: skip
    errors = [c.error for c in ranked]
    assert errors == sorted(errors)
    assert all(np.isfinite(errors))
    assert {c.name for c in ranked} == {"lpa", "cfpa", "dcfpa"}
    assert {c.noise for c in ranked} == {"laplace", "gaussian"}
    assert max(c.chunk_steps for c in ranked) == 64
    # more budget, less error for the same configuration
    richer = rank_mechanisms(
        MechanismSettings(features=NAMES), NAMES, bounds(), 0.5,
        budget=100.0, chunks_for=COUNTER, delta=1e-6, max_chunk_steps=64,
    )  # fmt: skip
    by = {(c.name, c.transform, c.chunk_steps, c.noise): c.error for c in ranked}
    for c in richer:
        assert c.error < by[c.name, c.transform, c.chunk_steps, c.noise]


def test_expected_error_of_lpa_is_its_noise_over_the_range() -> None:
    b = Bounds(lo=np.zeros(2), hi=np.array([1.0, 4.0]), max_step=np.full(2, 0.1))
    mech = make_mechanism("lpa", n=16, noise_multiplier=3.0, bounds=b)
    np.testing.assert_allclose(
        mech.expected_error(), np.sqrt(2.0) * mech.noise_scale / np.array([1.0, 4.0])
    )


def test_auto_takes_the_best_ranked_configuration(tmp_path: Path) -> None:
    features = FeatureSettings(window_s=30.0, step_s=0.5)
    mechanism = MechanismSettings(name="auto", features=NAMES, chunk_steps=64)
    plan = ReleasePlan.build(features=features, mechanism=mechanism, budget=10.0, delta=1e-6)
    with Ledger(tmp_path / "l.sqlite", caps=plan.ledger_caps()) as ledger:
        pipe = Pipeline(
            ledger, session="s", device="d", rate_hz=120.0, features=features, mechanism=mechanism
        )
    best = rank_mechanisms(
        MechanismSettings(features=NAMES), NAMES, bounds(), 0.5,
        budget=10.0, chunks_for=COUNTER, delta=1e-6, max_chunk_steps=64,
    )[0]  # fmt: skip
    mech = pipe.mechanism
    assert (mech.name, mech.n, mech.noise, mech.k) == (
        best.name, best.chunk_steps, best.noise, best.k
    )  # fmt: skip
    assert pipe.chunker.n_steps == mech.n
    assert pipe.plan.per_hour <= 10.0


def test_auto_without_a_budget_is_refused(tmp_path: Path) -> None:
    from gazeguard.core.errors import ConfigError  # noqa: PLC0415

    with Ledger(tmp_path / "l.sqlite") as ledger, pytest.raises(ConfigError, match="auto"):
        Pipeline(
            ledger, session="s", device="d", rate_hz=120.0, mechanism=MechanismSettings(name="auto")
        )


def test_show_budget_prints_the_ranking(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["show", "--budget-per-hour", "10", "--features", ",".join(NAMES), "--top", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert "user-level ε 10 per hour of gaze at δ 1e-06, 3 features" in out[0]
    assert out[1].startswith("auto →")
    assert len(out) == 4


@pytest.mark.parametrize("name", ["lpa", "cfpa", "dcfpa"])
def test_value_noise_sd_is_what_the_released_values_carry(name: str) -> None:
    """Mid-range constant input and noise far inside the range (no clipping): the empirical
    spread of released values matches the analytic per-value noise."""
    b = Bounds(lo=np.zeros(1), hi=np.ones(1), max_step=np.full(1, 0.05))
    mech = make_mechanism(name, n=16, k=2, noise_multiplier=0.002, bounds=b, seed=7)
    x = np.full((1, 16), 0.5)
    ys = np.array([mech.release(x)[0] for _ in range(4000)])
    rms = float(np.sqrt(((ys - ys.mean(axis=0)) ** 2).mean()))
    assert rms == pytest.approx(float(mech.value_noise_sd()[0]), rel=0.05)


def test_eval_budget_factory_spends_at_most_the_hour_and_orders_the_noise() -> None:
    """`gazeguard eval --per-hour`: each mechanism's noise is what the sidecar calibrates, so an
    hour of its chunks composes to at most the budget; a larger budget, less noise."""
    from gazeguard.offline.eval.grid import MechanismSpec  # noqa: PLC0415
    from gazeguard.offline.eval.harness import FeatureBounds, budget_factory  # noqa: PLC0415
    from gazeguard.privacy.accounting import compose  # noqa: PLC0415

    b = bounds()
    factory = budget_factory(FeatureBounds(b.lo, b.hi, b.max_step), "auto", 0.5)
    spec = MechanismSpec("dcfpa", 32, "dct")
    scales = []
    for budget in (1.0, 10.0, 100.0):
        mech = factory(spec, 32, budget, None)
        events = mech.events()  # type: ignore[attr-defined]
        hour = chunks_per_hour(FeatureSettings(), 32)
        assert compose({e: c * hour for e, c in events.items()}, 1e-6).epsilon <= budget
        scales.append(float(mech.noise_scale.max()))  # type: ignore[attr-defined]
    assert scales[0] > scales[1] > scales[2]
