"""Per-session standardisation of label models (issue 34): the running statistics' math, online
equals offline, the format's extension (log transform, session flag), the release carrying one
session's state, and the shipped portable model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gazeguard.core.errors import ConfigError
from gazeguard.privacy.mechanisms.randomness import InsecureSeededRandom
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal.dataset import FeatureTable
from gazeguard.signal.features import NAMES, extract_features
from gazeguard.signal.labels import (
    LabelModel,
    LabelRelease,
    SessionSpec,
    SessionStandardizer,
    load_model,
    model_from_dict,
    session_standardize,
    shipped_models,
    train_model,
)

FEATS = ("fixation_rate", "saccade_amplitude_mean", "saccade_right_ratio")


def _by_hand(U: np.ndarray, mean: np.ndarray, scale: np.ndarray, n0: float) -> np.ndarray:
    """The module docstring's formula, one row at a time, from scratch."""
    out = np.empty_like(U)
    for n in range(1, len(U) + 1):
        d = U[:n] - mean
        m = d.sum(0) / (n0 + n)
        v = (n0 * scale**2 + (d**2).sum(0)) / (n0 + n) - m**2
        out[n - 1] = (d[-1] - m) / np.sqrt(v)
    return out


def test_session_standardize_is_the_documented_formula() -> None:
    rng = np.random.default_rng(0)
    U = rng.normal([3.0, -1.0, 0.5], [2.0, 0.1, 1.0], (50, 3))
    mean, scale = np.array([0.0, 0.0, 1.0]), np.array([1.0, 2.0, 0.5])
    for n0 in (0.5, 10.0, 1e6):
        assert np.allclose(session_standardize(U, mean, scale, n0), _by_hand(U, mean, scale, n0))


def test_prior_windows_shrink_towards_the_population_and_fade() -> None:
    rng = np.random.default_rng(1)
    U = rng.normal(5.0, 3.0, (4000, 2))
    mean, scale = np.zeros(2), np.ones(2)
    # An enormous prior: the session's statistics are the population's (z = (u − mean)/scale).
    z = session_standardize(U, mean, scale, 1e12)
    assert np.allclose(z, (U - mean) / scale, rtol=1e-5)
    # A small prior and a long session: the last rows are standardised by the session itself.
    s = session_standardize(U, mean, scale, 1.0)
    ref = (U[-1] - U.mean(0)) / U.std(0)
    assert np.allclose(s[-1], ref, atol=1e-3)
    # A session shifted and scaled as a whole (another device) ends up where it started.
    s2 = session_standardize(10.0 + 4.0 * U, mean, scale, 1.0)
    assert np.allclose(s2[-1], s[-1], atol=2e-3)


def test_online_in_blocks_equals_offline() -> None:
    rng = np.random.default_rng(2)
    U = rng.normal(0.0, 1.0, (301, 3))
    mean, scale = np.array([0.1, 0.2, 0.3]), np.array([1.0, 0.5, 2.0])
    whole = session_standardize(U, mean, scale, 120.0)
    state = SessionStandardizer(mean, scale, 120.0)
    cuts = np.sort(rng.choice(np.arange(1, 301), 20, replace=False))
    parts = [state.update(b) for b in np.split(U, cuts)]
    assert state.windows == 301
    assert np.allclose(np.vstack(parts), whole, rtol=1e-12, atol=1e-12)
    assert state.update(np.empty((0, 3))).shape == (0, 3)
    assert state.windows == 301


def _table(seed: int = 0, steps: int = 60) -> FeatureTable:
    """Two tasks; each person's features are scaled by a person-specific gain (a 'device')."""
    rng = np.random.default_rng(seed)
    X, person, task = [], [], []
    for p in range(6):
        gain = np.exp(rng.uniform(-1, 1))
        for j, t in enumerate(("read", "watch")):
            base = np.full(len(NAMES), 1.0)
            base[NAMES.index(FEATS[0])] = (2.0 + 2.0 * j) * gain
            base[NAMES.index(FEATS[1])] = (3.0 - 1.5 * j) * gain
            base[NAMES.index(FEATS[2])] = 0.6 - 0.3 * j
            X.append(base * np.exp(rng.normal(0, 0.1, (steps, len(NAMES)))))
            person += [f"p{p}"] * steps
            task += [t] * steps
    person_a, task_a = np.array(person), np.array(task)
    return FeatureTable(
        np.vstack(X),
        np.tile(np.arange(steps) * 0.5, 12),
        person_a,
        task_a,
        np.char.add(np.char.add(person_a, "_"), task_a),
        tuple(NAMES),
    )


@pytest.fixture(scope="module")
def session_model() -> LabelModel:
    t = _table()
    return train_model(
        t,
        FEATS,
        name="sess",
        log_features=FEATS[:2],
        session=SessionSpec(prior_windows=30.0),
        sessions=t.person,
    )


def test_session_model_round_trips_and_predicts_online_as_offline(
    session_model: LabelModel, tmp_path: Path
) -> None:
    data = json.loads(session_model.save(tmp_path / "s.json").read_text())
    assert data["standardizer"]["transform"] == ["log", "log", "identity"]
    assert data["standardizer"]["session"] == {"prior_windows": 30.0, "combine": "append"}
    assert np.array(data["classifier"]["coef"]).shape == (2, 6)  # [population, session]
    loaded = load_model(tmp_path / "s.json")
    assert loaded.per_session
    t = _table(seed=5)
    X = t.X[np.ix_(np.flatnonzero(t.person == "p0"), [NAMES.index(f) for f in FEATS])]
    whole = loaded.predict_proba(X)
    state = loaded.new_session()
    parts = [loaded.predict_proba(b, session=state) for b in np.array_split(X, 7)]
    assert np.allclose(np.vstack(parts), whole, rtol=1e-12, atol=1e-12)
    # The inputs are what the docstring says: [g, s] with g population-, s session-standardised.
    u = np.log(X + 0.01) * [1, 1, 0] + X * [0, 0, 1]
    mean = np.array(data["standardizer"]["mean"])
    scale = np.array(data["standardizer"]["scale"])
    s = session_standardize(u, mean, scale, 30.0)
    assert np.allclose(loaded.inputs(X), np.hstack([(u - mean) / scale, s]))
    acc = np.mean(np.asarray(loaded.classes)[whole.argmax(1)] == t.task[t.person == "p0"])
    assert acc > 0.9


def test_release_carries_the_session_through_its_decisions(session_model: LabelModel) -> None:
    t = _table(seed=6)
    X = t.X[t.person == "p1"]  # all 48 features, the stream's columns
    lr = LabelRelease(session_model, 3.0, input_features=NAMES, source=InsecureSeededRandom(1))
    assert lr.session is not None
    for block in np.array_split(X, 4):
        lr.release(block)
    assert lr.session.windows == len(X)
    # The state after the stream is the state of the whole session at once.
    cols = [NAMES.index(f) for f in FEATS]
    fresh = session_model.new_session()
    assert fresh is not None
    session_model.predict_proba(X[:, cols], session=fresh)
    probe = X[:3, cols]
    assert np.allclose(
        session_model.predict_proba(probe, session=lr.session),
        session_model.predict_proba(probe, session=fresh),
    )


def _spec(session_model: LabelModel) -> dict[str, object]:
    return json.loads(session_model.to_json())  # type: ignore[no-any-return]


def test_malformed_session_models_are_refused(session_model: LabelModel) -> None:
    d = _spec(session_model)
    d["classifier"]["coef"] = [row[:3] for row in d["classifier"]["coef"]]  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"\[C\]\[2F\] = \[2\]\[6\]"):
        model_from_dict(d)
    d = _spec(session_model)
    d["standardizer"]["transform"] = ["log"]  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"transform.*has 1 entries, expected F = 3"):
        model_from_dict(d)
    d = _spec(session_model)
    d["standardizer"]["session"]["prior_windows"] = 0  # type: ignore[index]
    with pytest.raises(ConfigError, match="prior_windows"):
        model_from_dict(d)
    d = _spec(session_model)
    d["standardizer"]["transform"] = ["sqrt", "log", "identity"]  # type: ignore[index]
    with pytest.raises(ConfigError, match="transform"):
        model_from_dict(d)
    m = model_from_dict(_spec(session_model))
    with pytest.raises(ValueError, match="at or below -log_offset"):
        m.predict_proba(np.array([[-1.0, 1.0, 0.5]]))


def test_population_models_are_unchanged_by_the_extension() -> None:
    m = load_model("activity")
    assert not m.per_session
    assert m.new_session() is None
    X = np.ones((4, len(m.features)))
    assert np.array_equal(m.predict_proba(X), m.predict_proba(X, session=None))


def test_shipped_portable_model_loads_and_labels_simulated_gaze() -> None:
    assert "activity-portable" in shipped_models()
    m = load_model("activity-portable")
    assert m.spec.format == "gazeguard.label-model/1"
    assert set(m.classes) == {"browse", "read", "watch", "write"}
    assert set(m.features) <= set(NAMES)
    assert not any(f.startswith(("blink", "pupil")) for f in m.features)
    trained = m.spec.trained
    assert set(trained["datasets"]) >= {"gazegraph"}
    assert 0.0 < trained["lopo_window_accuracy"] <= 1.0
    # The deployed path: simulated gaze at a declared 60 Hz through the real extractor.
    s = simulate_gaze(45.0, 60.0, seed=3, task="reading")
    X, _ = extract_features(s.timestamps, s.x_deg, s.y_deg, rate_hz=60.0)
    cols = [NAMES.index(f) for f in m.features]
    p = m.predict_proba(X[:, cols], session=m.new_session())
    assert p.shape == (X.shape[0], len(m.classes))
    assert np.allclose(p.sum(1), 1.0)
