"""Held labels over hour-long sessions (``gazeguard.offline.eval.labels.evaluate_sessions``): the
session arithmetic (Hypothesis), the noise-free reference against the sidecar's own
``LabelStream`` on a real session (simulated gaze through the real extractor, the shipped
model, a real SQLite ledger), and the plan of labels alone against the release plan."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazeguard.config import FeatureSettings, LabelSettings
from gazeguard.offline.eval.datasets import Dataset, Recording, Synthetic
from gazeguard.offline.eval.labels import (
    COMMON_ACTIVITY,
    SEGMENT_S,
    SESSION_S,
    GazeSource,
    Mode,
    build_session,
    clean_releases,
    evaluate_sessions,
    held_accuracy,
    plan_segments,
    recipe_of,
)
from gazeguard.plan import ReleasePlan, labels_alone
from gazeguard.runtime.simulate import simulate_gaze
from gazeguard.signal.labels import load_model, model_from_dict


@given(st.integers(2, 6), st.integers(0, 2**32 - 1))
def test_segments_fill_the_hour_and_never_repeat_an_activity(n: int, seed: int) -> None:
    acts = [f"a{i}" for i in range(n)]
    segs = plan_segments(acts, np.random.default_rng(seed))
    assert math.isclose(sum(d for _, d in segs), SESSION_S)
    assert all(a != b for (a, _), (b, _) in itertools.pairwise(segs))
    lo, hi = SEGMENT_S
    assert all(lo <= d <= hi for _, d in segs[:-1])
    assert 0 < segs[-1][1] <= hi


@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=40),
    st.lists(st.tuples(st.integers(0, 45), st.integers(0, 3)), max_size=10),
)
def test_held_accuracy_is_the_share_of_windows_holding_the_truth(
    truth: list[int], releases: list[tuple[int, int]]
) -> None:
    t = np.arange(len(truth), dtype=np.float64)
    rel = sorted(releases)
    rt = np.array([float(a) for a, _ in rel])
    rl = np.array([b for _, b in rel], dtype=np.intp)
    held = []  # brute force: the last label released at or before each window
    for ti in t:
        before = [b for a, b in rel if a <= ti]
        held.append(before[-1] if before else -1)
    want = float(np.mean(np.array(held) == np.array(truth)))
    assert held_accuracy(t, np.array(truth, dtype=np.intp), rt, rl) == pytest.approx(want)


@pytest.mark.slow
@pytest.mark.parametrize(("decision_s", "share"), [(30.0, 10.0), (120.0, 10.0), (120.0, 1.0)])
def test_labels_alone_is_the_release_plans_label_plan(decision_s: float, share: float) -> None:
    labels = LabelSettings(enabled=True, model="activity-portable", decision_s=decision_s)
    alone, window = labels_alone(labels, FeatureSettings(), share=share, delta=1e-6)
    # the sidecar at budget 2·share gives labels the default half; its chunks summarise less
    # gaze than a 30 s label block, so both count the same labels in the same window
    full = ReleasePlan.build(budget=2 * share, delta=1e-6, labels=labels)
    assert full.label_plan is not None
    assert window == full.window_s
    assert alone.per_window == full.label_plan.per_window
    assert alone.epsilon == pytest.approx(full.label_plan.epsilon, rel=1e-9)
    assert alone.hour_epsilon <= share * (1 + 1e-9)


def test_the_portable_recipe_is_read_from_the_model() -> None:
    r = recipe_of(load_model("activity-portable"))
    assert len(r["features"]) == 40
    assert "saccade_rate" in r["log_features"]
    assert "saccade_left_ratio" not in r["log_features"]
    assert (r["log_offset"], r["regularization"], r["balance"]) == (0.01, 1.0, True)
    assert r["hidden_layers"] == []  # logistic regression
    # a perceptron's recipe carries its hidden widths and its C (alpha = 1/C)
    mlp = load_model("activity-portable").spec.model_dump()
    mlp["classifier"] = {
        "kind": "mlp-softmax",
        "hidden": [{"coef": [[0.0] * 40] * 3, "intercept": [0.0] * 3}],
        "coef": [[0.0] * 3] * 4,
        "intercept": [0.0] * 4,
    }
    mlp["trained"]["regularization_C"] = 2.5
    r = recipe_of(model_from_dict(mlp))
    assert (r["hidden_layers"], r["regularization"]) == ([3], 2.5)


class _Recorded(Dataset):
    """Two recorded people (simulated gaze under recorded-dataset names): the looping path."""

    name = "recorded"

    def fingerprint(self) -> str:
        return "recorded-test"

    def recordings(self) -> Iterator[Recording]:
        for p, who in enumerate(("P1", "P2")):
            for task in ("reading", "free", "watching"):
                s = simulate_gaze(120.0, 30.0, 40 + p, task=task)
                yield Recording(who, task, f"{who}_{task}", s, 30.0)


def test_a_recorded_session_loops_the_persons_recordings_and_marks_each_change() -> None:
    model = load_model("activity-portable")
    source = GazeSource(_Recorded())
    assert source.rate_hz == 30.0
    assert source.tasks("P1") == {"reading", "free", "watching"}
    s = build_session(
        source, "P1", 0, model=model, activity=COMMON_ACTIVITY["synthetic"],
        rng=np.random.default_rng(3),
    )  # fmt: skip
    assert s.segments[-1][2] == pytest.approx(SESSION_S, abs=0.5)  # whole samples per segment
    assert {a for a, _, _ in s.segments} <= {"browse", "read", "watch"}
    assert s.X.shape == (s.t.size, len(model.features))
    assert s.t[0] == pytest.approx(30.0)
    assert s.t[-1] == pytest.approx(SESSION_S, abs=0.5)
    for act, start, end in s.segments:  # each window's truth: the activity at its end
        inside = (s.t > start) & (s.t <= end)
        assert np.all(s.truth[inside] == model.classes.index(act))


def test_clean_releases_are_one_label_per_block() -> None:
    model = load_model("activity-portable")
    s = build_session(
        GazeSource(Synthetic(2, None, 60.0, 60.0)), "sim01", 0, model=model,
        activity=COMMON_ACTIVITY["synthetic"], rng=np.random.default_rng(1),
    )  # fmt: skip
    for d in (30.0, 120.0):
        ct, cl = clean_releases(s, Mode(f"clock-{d:g}", decision_s=d))
        assert np.allclose(np.diff(ct), d)
        assert ct.size == cl.size == s.t.size // round(d / 0.5)


@pytest.mark.slow
def test_sessions_run_the_sidecars_stream_and_the_clock_at_no_noise_is_clean() -> None:
    model = load_model("activity-portable")
    res = evaluate_sessions(
        "synthetic", Synthetic(8, None, 300.0, 60.0), model,
        activity=COMMON_ACTIVITY["synthetic"], sessions=1, reps=2, people=["sim01", "sim02"],
        modes=(Mode("clock-120", decision_s=120.0), Mode("clock-30", decision_s=30.0)),
        budgets=(1.0, 1e5), seed=11,
    )  # fmt: skip
    assert res["sessions"] == 2
    assert res["changes_per_session"] >= 5
    for row in res["modes"]:
        low, high = row["released"]
        assert low["withheld"] == high["withheld"] == 0  # the ledger's hourly cap never bit
        assert abs(low["accuracy"] - 0.25) < 0.1  # 1 ε/h: about chance
        assert low["hour_epsilon_at_delta"] <= 1.0 + 1e-9
        # randomized response at ε 50 keeps every label: the stream's labels are the clean ones
        assert high["epsilon_per_label"] == 50.0
        assert high["accuracy"] == pytest.approx(row["clean"], abs=1e-9)
        assert high["labels_per_session"] == row["clean_labels_per_session"]
