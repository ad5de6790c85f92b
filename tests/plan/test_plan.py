"""The release plan: one source of every privacy figure, and the figures it promises hold.

- At the defaults: the ledger's window, the chunks an hour of gaze and one raw sample can
  change, and the noise multiplier.
- The densest hour composes to at most the budget by dp-accounting's pessimistic PLD (computed
  here, independently of gazeguard's accountant), for chunks alone and with labels and cohort
  aggregates beside them.
- A ledger opened with the plan's caps takes chunks arriving at the densest legal rate for hours
  and never reports more than the budget per hour.
- ``config check`` refuses exactly what ``run`` refuses (the budget split of chunks, labels and
  cohort); the tools print the plan's figures (``gazeguard plan``, ``profile labels-budget``,
  the messages, the per-hour counts of eval and profiles) — a property test over settings.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from hypothesis import given, settings
from hypothesis import strategies as st

from gazeguard.cli import main
from gazeguard.config import (
    CohortSettings,
    FeatureSettings,
    LabelSettings,
    MechanismSettings,
    Settings,
)
from gazeguard.core.errors import ConfigError
from gazeguard.ledger import Ledger
from gazeguard.offline.eval.grid import parse_mechanism
from gazeguard.offline.eval.harness import BudgetFactory, FeatureBounds
from gazeguard.plan import ReleasePlan, chunk_counter, chunks_per_hour
from gazeguard.privacy.accounting import (
    Event,
    GaussianEvent,
    LaplaceEvent,
    PureEvent,
    RandomizedResponseEvent,
    compose,
)
from gazeguard.runtime.pipeline import Pipeline, ReleasedChunk
from gazeguard.runtime.preflight import validate_settings
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal.features import feature_bounds

DELTA = 1e-6


def test_the_default_plan() -> None:
    plan = ReleasePlan.build(budget=10.0, delta=DELTA)
    # A = 0.5, E = 3, W = H = 30 s: one sample reaches 63.5 s of vectors; a chunk spans 15.5 s
    assert plan.window_s == 3600 + 63.5 + 15.5
    assert plan.chunks.per_sample == 5  # ⌊79/16⌋ + 1
    assert plan.chunks.per_hour == 230  # ⌊3679/16⌋ + 1: not the 226 that end in the hour
    assert plan.per_hour <= 10.0
    assert plan.per_hour == pytest.approx(10.0, rel=1e-3)  # the budget is used, not wasted
    assert plan.per_sample < plan.per_hour


def _independent(events: Mapping[Event, int], delta: float) -> float:
    """ε at ``delta`` of ``events`` by dp-accounting's pessimistic PLDs, slack added as
    :mod:`gazeguard.privacy.accounting.loss` proves: ε_real(δ) ≤ ε_ideal(δ·e^{−S}) + S."""
    total, slack = None, 0.0
    logging.disable(logging.WARNING)
    try:
        for e, count in events.items():
            if isinstance(e, LaplaceEvent):
                one = pld_lib.from_laplace_mechanism(
                    e.ratio, 1.0, value_discretization_interval=1e-4
                )
            elif isinstance(e, GaussianEvent):
                one = pld_lib.from_gaussian_mechanism(
                    e.ratio, 1.0, value_discretization_interval=1e-4
                )
            elif isinstance(e, RandomizedResponseEvent):
                k = e.classes
                one = pld_lib.from_randomized_response(k / (math.exp(e.epsilon) + k - 1), k)
            else:  # any ε-DP release: its dominating pair is binary randomized response
                assert isinstance(e, PureEvent)
                one = pld_lib.from_randomized_response(2 / (math.exp(e.epsilon) + 1), 2)
            slack += e.slack * count
            composed = one.self_compose(count)
            total = composed if total is None else total.compose(composed)
    finally:
        logging.disable(logging.NOTSET)
    assert total is not None
    return float(total.get_epsilon_for_delta(delta * math.exp(-slack))) + slack


def _hour(plan: ReleasePlan) -> dict[Event, int]:
    out: dict[Event, int] = {}
    for r in plan.releases:
        for e, c in r.events.items():
            out[e] = out.get(e, 0) + c * r.per_hour
    return out


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"mechanism": MechanismSettings(noise="gaussian")},
        {"mechanism": MechanismSettings(features=["fixation_rate", "saccade_rate"])},
        {"labels": LabelSettings(enabled=True, decision_s=300.0)},
        {
            "labels": LabelSettings(enabled=True, decision_s=120.0, budget_share=0.3),
            "cohort": CohortSettings(enabled=True, budget_share=0.3),
        },
    ],
    ids=["laplace", "gaussian", "profile", "labels", "labels+cohort"],
)
@pytest.mark.slow
def test_the_densest_hour_composes_within_the_budget_by_dp_accounting(
    kw: dict[str, object],
) -> None:
    plan = ReleasePlan.build(budget=10.0, delta=DELTA, **kw)  # type: ignore[arg-type]
    eps = _independent(_hour(plan), DELTA)
    if "mechanism" not in kw or kw["mechanism"].noise == "laplace":  # type: ignore[attr-defined]
        if len(plan.releases) == 1:  # Laplace chunks: dp-accounting's pessimistic PLD agrees
            assert eps <= 10.0
        else:  # several kinds at once: within dp-accounting's discretisation (< 0.1 %)
            assert eps <= 10.0 * (1 + 1e-3)
    else:  # Gaussian: composed in closed form (exact); dp-accounting's discretised PLD is a
        assert eps <= 10.0 * (1 + 1e-5)  # pessimistic bound a few millionths above it
    assert plan.per_hour <= 10.0


@pytest.mark.slow
def test_a_ledger_with_the_plan_caps_takes_the_densest_hours_and_reports_the_budget(
    tmp_path: Path,
) -> None:

    plan = ReleasePlan.build(budget=10.0, delta=DELTA)
    period = float(plan.chunks.period_s)
    per_hour_seen = []
    with Ledger(tmp_path / "l.sqlite", caps=plan.ledger_caps()) as ledger:
        ledger.open_session("s")
        end = 1_000_000.0
        for i in range(3 * plan.chunks.per_hour):  # three hours at the densest legal rate
            ledger.charge(
                "s", i, plan.chunk_cost, "t", b"x",
                gaze=(end - float(plan.chunks.summary_s), end),
            )  # fmt: skip
            ledger.mark_delivered(i + 1)
            end += period
            per_hour_seen.append(ledger.state("s").epsilon_window)
    assert max(per_hour_seen) <= 10.0
    hour = compose(dict.fromkeys(plan.chunks.events, plan.chunks.per_hour * 48), DELTA)
    assert max(per_hour_seen) == pytest.approx(hour.epsilon, rel=1e-6)


def test_a_ledger_shorter_than_the_plan_window_is_refused(tmp_path: Path) -> None:

    with (
        Ledger(tmp_path / "l.sqlite", window_cap=10.0) as ledger,
        pytest.raises(ConfigError, match="window") as err,
    ):
        Pipeline(ledger, session="s", device="d", rate_hz=120.0)
    assert err.value.field == "ledger.window_s"


def _settings(**kw: object) -> Settings:
    return Settings.model_validate(
        {"ledger": {"budget_per_hour": 10.0}, "ingest": {"source": "lsl"}, **kw}
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("labels_share", "cohort_share", "fleet"),
    [(0.6, 0.5, True), (0.5, 0.5, True), (0.3, 0.3, True), (0.99, 0.0, False), (0.5, 0.0, False)],
)
def test_config_check_refuses_exactly_what_run_refuses(
    labels_share: float, cohort_share: float, fleet: bool
) -> None:
    kw: dict[str, object] = {
        "labels": {"enabled": True, "decision_s": 300.0, "budget_share": labels_share},
        "fleet": {"enabled": fleet},
    }
    if cohort_share:
        kw["cohort"] = {"enabled": True, "budget_share": cohort_share}
    s = _settings(**kw)
    problems = [p for p in validate_settings(s) if not p.field.startswith(("ingest", "broker"))]
    try:
        ReleasePlan.from_settings(s)
        refused = None
    except ConfigError as exc:
        refused = exc.field
    assert [p.field for p in problems] == ([] if refused is None else [refused])
    if labels_share + cohort_share >= 1:
        assert refused in {"labels.budget_share", "cohort.budget_share"}


def _flat(d: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(
    window=st.sampled_from([10.0, 20.0, 30.0]),
    step=st.sampled_from([0.25, 0.5, 1.0]),
    n=st.sampled_from([8, 16, 32, 64]),
    budget=st.sampled_from([1.0, 10.0, 100.0]),
    hold=st.sampled_from([None, 5.0]),
    labels=st.booleans(),
)
def test_every_tool_prints_the_plan_figures(
    window: float, step: float, n: int, budget: float, hold: float | None, labels: bool
) -> None:

    features = FeatureSettings(window_s=window, step_s=step, hold_limit_s=hold)
    mech = MechanismSettings(chunk_steps=n, features=["fixation_rate", "pupil_mean"])
    label_settings = LabelSettings(enabled=True, decision_s=150.0) if labels else None
    if labels and (window, step) != (30.0, 0.5):  # the shipped model's window and step
        with pytest.raises(ConfigError, match="window"):
            ReleasePlan.build(
                features=features, mechanism=mech, budget=budget, delta=DELTA,
                labels=label_settings,
            )  # fmt: skip
        return
    plan = ReleasePlan.build(
        features=features, mechanism=mech, budget=budget, delta=DELTA, labels=label_settings
    )
    # gazeguard plan --json: the same figures
    with tempfile.TemporaryDirectory() as d:
        config = Path(d) / "c.toml"
        hold_line = "" if hold is None else f"hold_limit_s = {hold}\n"
        config.write_text(f"[features]\nwindow_s = {window}\nstep_s = {step}\n{hold_line}")
        argv = [
            "plan", "--json", "--config", str(config), "--budget-per-hour", str(budget),
            "--chunk-steps", str(n), "--features", "fixation_rate,pupil_mean",
        ]  # fmt: skip
        if labels:
            argv += ["--labels", "--decision-s", "150"]  # the default model, as the plan above
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(argv) == 0
    printed = _flat(json.loads(out.getvalue()))
    want = _flat(plan.figures())
    assert printed.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, float):
            assert printed[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert printed[key] == value, key
    if labels:
        return
    # chunks alone: the per-hour counts of profiles, eval and `mechanisms show` are the plan's
    assert chunks_per_hour(features, n) == plan.chunks.per_hour
    assert chunk_counter(features, n)(n) == plan.chunks.per_hour
    if hold is None:
        lo, hi, ms = feature_bounds(plan.names, window, step)
        factory = BudgetFactory(FeatureBounds(lo, hi, ms), "auto", step, window_s=window)
        released = factory(parse_mechanism(f"dcfpa-{n}"), n, budget, None)
        assert np.allclose(released.noise_multiplier, plan.mechanism.noise_multiplier, rtol=2e-3)  # type: ignore[attr-defined]


def test_the_messages_state_the_plan_figures(tmp_path: Path) -> None:

    features = FeatureSettings(window_s=2.0, step_s=0.05)
    plan = ReleasePlan.build(
        features=features,
        mechanism=MechanismSettings(features=["fixation_rate", "saccade_rate", "pupil_mean"]),
        budget=10.0,
        delta=DELTA,
    )
    got: list[ReleasedChunk] = []
    with Ledger(tmp_path / "l.sqlite", caps=plan.ledger_caps()) as ledger:
        pipe = Pipeline(
            ledger, session="s", device="d", rate_hz=120.0, plan=plan, on_release=got.append
        )
        g = simulate_gaze(8.0, 120.0, seed=5)
        for start in range(0, len(g), 60):
            pipe.push(g.slice(start, start + 60))
    assert got
    led = got[-1].message.ledger
    assert led.raw_event_epsilon == pytest.approx(plan.per_sample)
    assert led.chunks_reached == plan.chunks.per_sample
    assert led.window_s == plan.window_s
    assert led.chunk_epsilon == pytest.approx(plan.chunk_pure)
