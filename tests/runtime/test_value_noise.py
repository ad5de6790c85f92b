"""The consumer sees the noise honestly: one noise figure per feature (``value_noise_sd``, in
the feature's units and × its public range) that the banner of ``gazeguard run``,
``gazeguard watch`` and the chunk message all state alike; ``watch`` marks values at a public
bound; a chunk's ``summary`` is a function of its published values only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from pydantic import ValidationError

from gazeguard.cli.run import _banner
from gazeguard.cli.watch import AT_LOWER, AT_UPPER, LEGEND, describe, describe_chunk
from gazeguard.config import FeatureSettings, MechanismSettings, Settings
from gazeguard.ledger import Ledger
from gazeguard.plan import ReleasePlan
from gazeguard.runtime.pipeline import Pipeline, ReleasedChunk
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.wire.message import (
    VALUE_NOISE_LABEL,
    ChunkMessage,
    ChunkSummary,
    LedgerSnapshot,
    MechanismParams,
    value_noise_text,
)
from tests.wire._params import mechanism_params

FEATURES = ["fixation_rate", "saccade_rate", "pupil_mean"]
F, N = 3, 8


def test_one_noise_figure_in_the_banner_watch_and_the_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    features = FeatureSettings(window_s=2.0, step_s=0.05)
    mechanism = MechanismSettings(features=FEATURES)
    plan = ReleasePlan.build(features=features, mechanism=mechanism, budget=10.0, delta=1e-6)
    got: list[ReleasedChunk] = []
    with Ledger(tmp_path / "l.sqlite", caps=plan.ledger_caps()) as ledger:
        pipe = Pipeline(
            ledger, session="s", device="d", rate_hz=120.0, plan=plan, on_release=got.append
        )
        capsys.readouterr()
        _banner(pipe, "127.0.0.1:1883", Settings(features=features, mechanism=mechanism))
        banner = capsys.readouterr().err
        g = simulate_gaze(8.0, 120.0, seed=5)
        for start in range(0, len(g), 60):
            pipe.push(g.slice(start, start + 60))
    assert got
    mech = pipe.mechanism
    sd, frac = mech.value_noise_sd(), mech.value_noise_range()
    np.testing.assert_allclose(frac, sd / (mech.upper - mech.lower), rtol=1e-12)
    # the message: the same figures, read back from its payload
    message = ChunkMessage.from_payload(got[-1].payload)
    assert message.mechanism.value_noise_sd == sd.tolist()
    assert message.mechanism.value_noise_range == frac.tolist()
    assert message.mechanism.lower == mech.lower.tolist()
    assert message.mechanism.upper == mech.upper.tolist()
    # the banner and watch: the same words for each feature
    kind, lines, _ = describe("gazeguard/v1/d/s/chunks", got[-1].payload, F)
    assert kind == "chunks"
    assert f"{VALUE_NOISE_LABEL} per published value (value_noise_sd" in banner
    assert "noise per released value" not in banner
    assert "noise scale" not in "\n".join(lines)
    for i, (name, unit) in enumerate(zip(pipe.feature_names, pipe.units, strict=True)):
        text = value_noise_text(float(sd[i]), float(frac[i]), unit)
        assert f"{name} {text}" in banner
        line = next(x for x in lines if x.lstrip().startswith(name))
        assert line.endswith(f"({VALUE_NOISE_LABEL} {text})")


def params(**over: Any) -> MechanismParams:
    fields: dict[str, Any] = {
        "k": 1,
        "m": 1,
        "value_noise_sd": [2.0, 4.0, 0.5],
        "value_noise_range": [0.2, 0.4, 0.25],
        "lower": [0.0, 0.0, 1.0],
        "upper": [10.0, 10.0, 3.0],
    }
    return mechanism_params(F, N, **{**fields, **over})


def chunk(values: Any, mechanism: MechanismParams | None = None, index: int = 0) -> ChunkMessage:
    mech = params() if mechanism is None else mechanism
    ledger = LedgerSnapshot(
        epsilon=1.5, delta=1e-6, epsilon_window=1.5, window_s=3600.0, chunk_epsilon=F * 0.5,
        session_spent=1.5, per_chunk_max=1.5, remaining=None, session_cap=None, window_cap=10.0,
    )  # fmt: skip
    return ChunkMessage.build(
        session="s", device="d", chunk_index=index, timestamps=10.0 + 0.5 * np.arange(N),
        features=FEATURES, units=["1/s", "1/s", "mm"], values=values, mechanism=mech,
        ledger=ledger, unix_offset=1.7e9,
    )  # fmt: skip


def test_watch_marks_values_at_a_public_bound_and_says_what_the_marks_mean() -> None:
    values = np.array([np.zeros(N), np.linspace(2.0, 10.0, N), np.full(N, 2.0)])
    lines = describe_chunk(chunk(values), F)
    rows = {line.split()[0]: line for line in lines[2:]}
    assert f" 0{AT_LOWER}..0{AT_LOWER} 1/s" in rows["fixation_rate"]
    assert f" 2..10{AT_UPPER} 1/s" in rows["saccade_rate"]
    assert " 2..2 mm" in rows["pupil_mean"]  # inside its bounds: no mark
    assert AT_LOWER not in rows["pupil_mean"]
    assert AT_UPPER not in rows["pupil_mean"]
    assert "mean 6, last 10" in rows["saccade_rate"]
    assert rows["saccade_rate"].endswith(f"({VALUE_NOISE_LABEL} 4 1/s (0.4× range))")
    assert AT_LOWER in LEGEND
    assert AT_UPPER in LEGEND
    assert VALUE_NOISE_LABEL in LEGEND


def test_a_message_without_the_noise_figure_or_the_bounds_is_refused() -> None:
    doc = json.loads(chunk(np.ones((F, N))).to_payload())
    for key in ("value_noise_sd", "value_noise_range", "lower", "upper"):
        partial = json.loads(json.dumps(doc))
        del partial["mechanism"][key]
        with pytest.raises(ValidationError, match=key):
            ChunkMessage.model_validate(partial)
    del doc["summary"]
    assert ChunkMessage.model_validate(doc).summary is None  # the summary is optional (lpa)


def test_inconsistent_noise_figures_and_bounds_are_refused() -> None:
    with pytest.raises(ValidationError, match="value_noise_range"):
        params(value_noise_range=[0.3, 0.4, 0.25])
    with pytest.raises(ValidationError, match="upper"):
        params(lower=[0.0, 0.0, 3.0], upper=[10.0, 10.0, 1.0])
    with pytest.raises(ValidationError, match="one entry per feature"):
        params(value_noise_sd=[2.0, 4.0])
    with pytest.raises(ValidationError, match="value_noise_range"):
        params(value_noise_range=None)  # the figures and the bounds are never left out


finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(
    values=arrays(np.float64, (F, N), elements=finite),
    scale=st.floats(0.01, 100.0),
    index=st.integers(0, 1000),
)
def test_the_summary_is_a_function_of_the_published_values_only(
    values: np.ndarray, scale: float, index: int
) -> None:
    # the same published values under other noise, ε, bounds and chunk index: the same summary
    other = params(
        noise_scale=[scale] * F, value_noise_sd=[scale] * F,
        value_noise_range=[scale / 2e6] * F, lower=[-1e6] * F, upper=[1e6] * F,
    )  # fmt: skip
    a, b = chunk(values), chunk(values, other, index)
    assert a.summary is not None
    assert a.summary == b.summary
    assert a.summary == ChunkSummary.of(a.values_array())
    np.testing.assert_allclose(a.summary.mean, values.mean(axis=1), rtol=0, atol=1e-9)
    np.testing.assert_array_equal(a.summary.last, values[:, -1])
    # and it survives the wire: a summary that is not the values' is refused
    back = ChunkMessage.from_payload(a.to_payload())
    assert back.summary == a.summary
    doc = json.loads(a.to_payload())
    doc["summary"]["last"][0] += 1.0 + abs(doc["summary"]["last"][0])
    with pytest.raises(ValidationError, match="summary"):
        ChunkMessage.model_validate(doc)


@settings(max_examples=200, deadline=None)
@given(
    values=arrays(
        np.float64, (F, N),
        elements=st.floats(-1.7e308, 1.7e308, allow_nan=False, allow_infinity=False),
    ),
)  # fmt: skip
def test_the_summary_holds_for_any_finite_values_up_to_the_largest_floats(
    values: np.ndarray,
) -> None:
    # a row's sum can overflow: its mean is then taken scaled, never inf, within the row's range
    s = ChunkSummary.of(values)
    mean = np.asarray(s.mean)
    assert np.isfinite(mean).all()
    assert (values.min(axis=1) <= mean).all()
    assert (mean <= values.max(axis=1)).all()
    scale = np.abs(values).max(axis=1)
    exact = [
        float(np.mean([v / m for v in row]) * m) if m else 0.0
        for row, m in zip(values, scale, strict=True)
    ]
    # within 1e-12 of each row's own largest value (not of the chunk's largest)
    assert (np.abs(mean - np.asarray(exact)) <= 1e-12 * np.maximum(1.0, scale)).all()
    # a built message carries it, and a receiver validating the payload agrees
    built = chunk(values)
    assert built.summary == s
    assert ChunkMessage.from_payload(built.to_payload()) == built


def test_lpa_carries_no_summary() -> None:
    lpa = params(name="lpa", transform=None, k=None, m=N)
    assert chunk(np.ones((F, N)), lpa).summary is None
