"""Per-session standardisation of label models (issue 34): the running statistics' math and
online equals offline, for offline model selection; the format's extension (log transform,
session flag); and (issue 46, point 7) why the sidecar refuses per-session state — changing a few
blocks of a stream changes decisions long after them — and that it does, for labels and cohorts
alike, naming ``standardizer.session``; and the shipped portable model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gazeguard.config import CohortSettings, LabelSettings
from gazeguard.core.errors import ConfigError
from gazeguard.plan import ReleasePlan
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


def test_session_model_predicts_online_as_offline(session_model: LabelModel) -> None:
    """The offline selection path (bench/train_label_model.py): blocks fed in order give the
    whole session's values, and the inputs are what the docstring says."""
    data = json.loads(session_model.to_json())
    assert data["standardizer"]["transform"] == ["log", "log", "identity"]
    assert data["standardizer"]["session"] == {"prior_windows": 30.0, "combine": "append"}
    assert np.array(data["classifier"]["coef"]).shape == (2, 6)  # [population, session]
    assert session_model.per_session
    t = _table(seed=5)
    X = t.X[np.ix_(np.flatnonzero(t.person == "p0"), [NAMES.index(f) for f in FEATS])]
    whole = session_model.predict_proba(X)
    state = session_model.new_session()
    parts = [session_model.predict_proba(b, session=state) for b in np.array_split(X, 7)]
    assert np.allclose(np.vstack(parts), whole, rtol=1e-12, atol=1e-12)
    # The inputs are what the docstring says: [g, s] with g population-, s session-standardised.
    u = np.log(X + 0.01) * [1, 1, 0] + X * [0, 0, 1]
    mean = np.array(data["standardizer"]["mean"])
    scale = np.array(data["standardizer"]["scale"])
    s = session_standardize(u, mean, scale, 30.0)
    assert np.allclose(session_model.inputs(X), np.hstack([(u - mean) / scale, s]))
    acc = np.mean(np.asarray(session_model.classes)[whole.argmax(1)] == t.task[t.person == "p0"])
    assert acc > 0.9


def _decisions(model: LabelModel, blocks: list[np.ndarray]) -> np.ndarray:
    """One decision per block (argmax of the mean class probability), the blocks fed in order
    through one session's state."""
    state = model.new_session()
    return np.array([int(np.argmax(model.predict_proba(b, state).mean(axis=0))) for b in blocks])


def test_per_session_state_carries_a_change_far_beyond_its_blocks() -> None:
    """Why the sidecar refuses it: scale 3 blocks of a stream (another headset for a minute) and
    a per-session model's decisions change many blocks later; a population model's change only
    inside those 3 blocks."""
    train = _table()
    spec = SessionSpec(prior_windows=30.0, combine="replace")
    per_session = train_model(
        train, FEATS, name="sess", log_features=FEATS[:2], session=spec, sessions=train.person
    )
    population = train_model(train, FEATS, name="pop", log_features=FEATS[:2])
    t = _table(seed=7)
    cols = [NAMES.index(f) for f in FEATS]
    stream = np.vstack([t.X[t.recording == r][:, cols] for r in ("p2_read", "p2_watch")] * 4)
    blocks = np.array_split(stream, len(stream) // 20)  # 24 blocks of 20 windows
    changed = [b * 0.05 if i < 3 else b for i, b in enumerate(blocks)]
    a, b = _decisions(per_session, blocks), _decisions(per_session, changed)
    assert np.flatnonzero(a != b).max() >= 15  # 12 or more blocks after the change
    a, b = _decisions(population, blocks), _decisions(population, changed)
    assert set(np.flatnonzero(a != b)) <= {0, 1, 2}


def test_a_per_session_model_is_refused_for_labels_and_cohorts(
    session_model: LabelModel, tmp_path: Path
) -> None:
    path = session_model.save(tmp_path / "s.json")
    with pytest.raises(ConfigError) as err:
        load_model(path)
    assert err.value.field == "standardizer.session"
    assert "per-session running statistics" in err.value.reason
    assert "s.json" in str(err.value.source)
    for kw in (
        {"labels": LabelSettings(enabled=True, model=str(path))},
        {"cohort": CohortSettings(enabled=True, model=str(path))},
    ):
        with pytest.raises(ConfigError, match=r"standardizer\.session"):
            ReleasePlan.build(budget=10.0, delta=1e-6, **kw)  # type: ignore[arg-type]
    # and a model built in memory cannot reach a label release either
    with pytest.raises(ConfigError, match=r"standardizer\.session") as err:
        LabelRelease(session_model, 1.0, source=InsecureSeededRandom(1))
    assert err.value.field == "labels.model"


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
    with pytest.raises(ValueError, match="at or below -log_offset"):
        session_model.predict_proba(np.array([[-1.0, 1.0, 0.5]]))


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
    p = m.predict_proba(X[:, cols])
    assert p.shape == (X.shape[0], len(m.classes))
    assert np.allclose(p.sum(1), 1.0)
