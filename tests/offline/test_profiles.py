"""Release profiles: loading and validation, the ranking criterion, and ``gazeguard profile``
end to end on simulated data (build → show → train-model → labels-budget)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gazeguard.cli import main
from gazeguard.core.errors import ConfigError
from gazeguard.offline.profiles import rank_features, variance_components
from gazeguard.privacy.accounting import LaplaceEvent, compose
from gazeguard.signal.dataset import FeatureTable
from gazeguard.signal.features import NAMES
from gazeguard.signal.labels import load_model
from gazeguard.signal.profiles import (
    PROFILE_SCHEMA,
    load_profile,
    profile_from_dict,
    shipped_profiles,
)


# ----------------------------------------------------------------------------- loading
def test_shipped_activity_profile_loads() -> None:
    assert "activity" in shipped_profiles()
    p = load_profile("activity")
    assert p.name == "activity"
    assert p.task == "activity"
    assert set(p.features) <= set(NAMES)
    assert p.classes == ["browse", "play", "read", "search", "watch", "write"]
    assert p.suggested_budget is not None
    sb = p.suggested_budget
    # user-level ε at δ per hour (the accountant), at most the pure sequential sum beside it
    assert sb.delta == 1e-6
    # every chunk an hour of gaze can change, as the release plan counts them (not the 226
    # that end inside it)
    assert sb.chunks_per_hour == 230
    assert sb.pure_per_hour == pytest.approx(
        sb.epsilon_per_feature_per_chunk * len(p.features) * sb.chunks_per_hour
    )
    releases = {LaplaceEvent(1 / sb.epsilon_per_feature_per_chunk): 2 * 230}
    assert sb.per_hour == pytest.approx(compose(releases, 1e-6).epsilon)
    assert sb.per_hour < sb.pure_per_hour
    b = p.built
    assert b["dataset"] == "gazegraph"
    assert b["criterion"] == "info-ratio"
    assert b["command"].startswith("gazeguard profile build ")
    assert b["confirmation"]["reid"] <= b["chance"]["reid"] + 0.02
    assert load_profile(Path(p.source.split("(")[-1].rstrip(")"))).features == p.features


def _valid() -> dict[str, object]:
    return {
        "schema": PROFILE_SCHEMA,
        "name": "mine",
        "task": "reading",
        "features": ["saccade_right_ratio", "fixation_rate"],
    }


@pytest.mark.parametrize(
    ("edit", "field", "reason"),
    [
        (lambda d: d["features"].__setitem__(0, "saccade_rigth_ratio"), "features[0]",
         "did you mean 'saccade_right_ratio'"),
        (lambda d: d["features"].append("fixation_rate"), "features", "listed more than once"),
        (lambda d: d.__setitem__("features", []), "features", "at least 1"),
        (lambda d: d.__setitem__("schema", "gazeguard.profile/9"), "schema", "gazeguard.profile/1"),
        (lambda d: d.__setitem__("name", "../etc"), "name", "letters, digits"),
        (lambda d: d.__setitem__("budget", 3), "budget", "Extra inputs"),
        (lambda d: d.__setitem__("suggested_budget", {"per_hour": -1}), "suggested_budget.per_hour",
         "greater than 0"),
    ],
)  # fmt: skip
def test_bad_profiles_are_refused_naming_field_and_file(
    tmp_path: Path, edit: object, field: str, reason: str
) -> None:
    d = _valid()
    edit(d)  # type: ignore[operator]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ConfigError) as err:
        load_profile(path)
    assert err.value.field == field, err.value
    assert reason in str(err.value)
    assert str(path) in str(err.value)


def test_profile_lookup_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="did you mean 'activity'"):
        load_profile("activitty")
    with pytest.raises(ConfigError, match="file not found"):
        load_profile(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "schema": "gazeguard.profile/1",\n  "name": "x",,\n}')
    with pytest.raises(ConfigError, match=r"line 3, column 15.*not JSON"):
        load_profile(bad)


def test_profile_round_trip(tmp_path: Path) -> None:
    p = profile_from_dict(_valid())
    path = p.save(tmp_path / "mine.json")
    q = load_profile(str(path))
    assert q.model_dump() == p.model_dump()
    assert q.source == f"profile file {path}"
    assert json.loads(path.read_text())["schema"] == PROFILE_SCHEMA


# ----------------------------------------------------------------------------- ranking
def _ranking_table() -> FeatureTable:
    """Column 0 carries the task, 1 the person, 2 a small task signal (0.1 % of its public range),
    3 nothing."""
    rng = np.random.default_rng(0)
    people, tasks, steps = 5, 3, 30
    rows = []
    who, what = [], []
    for p in range(people):
        for t in range(tasks):
            x = rng.normal(0, 0.02, (steps, 4))
            x[:, 0] += 0.3 * t
            x[:, 1] += 0.3 * p
            x[:, 2] = 5.0 + 0.01 * t + rng.normal(0, 0.001, steps)
            x[:, 3] = 1.0
            rows.append(x)
            who += [f"p{p}"] * steps
            what += [f"t{t}"] * steps
    person = np.array(who)
    task = np.array(what)
    return FeatureTable(
        np.vstack(rows),
        np.zeros(len(who)),
        person,
        task,
        np.char.add(np.char.add(person, "_"), task),
        ("task_signal", "person_signal", "small_task_signal", "constant"),
    )


def test_ranking_puts_task_before_identity_and_accounts_for_noise() -> None:
    t = _ranking_table()
    cols = np.arange(4)
    rng = np.array([1.0, 1.0, 10.0, 1.0])
    clean = rank_features(t, cols, np.zeros(4), "info-ratio", rng)
    assert {s.name for s in clean[:2]} == {"small_task_signal", "task_signal"}
    assert clean[-1].name in ("person_signal", "constant")
    by = {s.name: s for s in clean}
    assert by["constant"].score == 0.0
    assert by["task_signal"].score > 10 * by["person_signal"].score
    # Release noise of sd 0.5 (5 % of a range of 10): the small task signal is gone, the big one
    # is not. The clean F ratio (the measure) still ranks the small signal highly.
    noisy = rank_features(t, cols, np.full(4, 0.25), "info-ratio", rng)
    nby = {s.name: s for s in noisy}
    assert noisy[0].name == "task_signal"
    assert nby["small_task_signal"].task_info < 1e-2 * nby["task_signal"].task_info
    f = rank_features(t, cols, np.full(4, 0.25), "f-ratio", rng)
    fby = {s.name: s for s in f}
    assert fby["small_task_signal"].score > fby["person_signal"].score
    with pytest.raises(ConfigError, match="choose from"):
        rank_features(t, cols, np.zeros(4), "anova", rng)


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, (24, 2), elements=st.floats(-1e3, 1e3)))
def test_variance_components_add_up(X: np.ndarray) -> None:
    task = np.repeat(["a", "b"], 12)
    rec = np.repeat(["a1", "a2", "b1", "b2"], 6)
    vt, vwt, vpt, vwr = variance_components(X, task, rec)
    total = X.var(axis=0)
    assert np.allclose(vt + vwt, total, rtol=1e-9, atol=1e-6)
    assert np.allclose(vt + vpt + vwr, total, rtol=1e-9, atol=1e-6)
    assert (np.array([vt, vwt, vpt, vwr]) >= -1e-9).all()


# ----------------------------------------------------------------------------- CLI end to end
SYNTH = [
    "--dataset",
    "synthetic",
    "--synthetic-people",
    "4",
    "--synthetic-duration",
    "120",
    "--synthetic-rate",
    "60",
]


@pytest.mark.slow
def test_profile_build_show_train_budget_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = ["--cache-dir", str(tmp_path / "cache")]
    out = tmp_path / "reading.json"
    rc = main(
        [
            "profile", "build", "--name", "reading", "--task", "activity", *SYNTH, *cache,
            "--mechanism", "cfpa-32-dct", "--epsilons", "0.5,2", "--max-size", "3",
            "--reps", "1", "--confirm-reps", "1", "--classifiers", "knn,dt",
            "--tolerance", "0.1", "--insecure-seed", "11", "--out", str(out),
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "size  3" in captured.err  # every size was evaluated
    assert "NOT private" in captured.err
    profile = load_profile(out)
    b = profile.built
    assert profile.classes == ["free", "reading", "search", "watching"]
    assert 1 <= len(profile.features) <= 3
    assert len(b["frontier"]) == 6  # 2 noise levels × sizes 1..3
    assert b["chosen"]["size"] == len(profile.features)
    assert b["chosen"]["reid"] <= 0.25 + 0.1
    assert b["noise_source"] == "INSECURE-seeded"
    assert b["dataset"] == "synthetic"
    assert "--insecure-seed 11" in b["command"]
    assert set(b["scores"]) == {"0.5", "2"}
    assert (
        profile.features
        == [s["feature"] for s in b["scores"][f"{b['chosen']['epsilon']:g}"]][
            : len(profile.features)
        ]
    )
    sb = profile.suggested_budget
    assert sb is not None
    assert sb.chunks_per_hour == 230  # the plan's count for 32 steps of 0.5 s, W = 30 s
    assert f"wrote {out}" in captured.out

    # Deterministic with an insecure seed: the same command gives the same choice.
    out2 = tmp_path / "again.json"
    args = json.loads(out.read_text())["built"]["command"].split()[1:]
    args = [a if a != str(out) else str(out2) for a in args]
    assert main([*args, *cache, "--tolerance", "0.1", "--out", str(out2)]) == 0
    again = load_profile(out2)
    assert again.features == profile.features
    assert again.built["frontier"] == b["frontier"]
    capsys.readouterr()

    assert main(["profile", "show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "profile 'reading' for task 'activity'" in shown
    assert "per hour of gaze" in shown

    model_path = tmp_path / "model.json"
    assert (
        main(
            [
                "profile",
                "train-model",
                "--profile",
                str(out),
                *SYNTH,
                *cache,
                "--out",
                str(model_path),
            ]
        )
        == 0
    )
    trained = capsys.readouterr().out
    assert "leave-one-person-out accuracy per window" in trained
    model = load_model(model_path, profile=profile)
    assert model.classes == ("free", "reading", "search", "watching")
    assert model.spec.trained["lopo_window_accuracy"] > 0.25  # better than chance (4 tasks)

    assert (
        main(
            [
                "profile",
                "labels-budget",
                "--model",
                str(model_path),
                "--budget",
                "10",
                "--decision-s",
                "300",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "4 classes (free, reading, search, watching)" in text
    assert "one hour of gaze can change 14 labels" in text  # the plan: 300 s apart at most
    assert "of clean" in text


def test_profile_build_reports_when_nothing_is_at_chance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        [
            "profile", "build", "--name", "x", *SYNTH, "--cache-dir", str(tmp_path),
            "--mechanism", "none", "--max-size", "2", "--reps", "1", "--classifiers", "knn",
            "--tolerance", "0", "--out", str(tmp_path / "x.json"),
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 1
    assert "no profile size keeps re-identification within 0 of chance (0.250)" in err
    assert "use a smaller ε or a stronger mechanism" in err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mechanism", "fpa-dft"], "a profile is built for a live stream mechanism"),
        (["--classifiers", "knn,xgboost"], "choose from knn,svm,dt,rf"),
        (["--tolerance", "2"], "must be in [0, 1)"),
    ],
)
def test_profile_build_refuses_bad_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    rc = main(["profile", "build", "--name", "x", *SYNTH, "--cache-dir", str(tmp_path), *args])
    assert rc == 1
    assert message in capsys.readouterr().err


def test_profile_without_subcommand_says_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile"]) == 2
    assert "build, show, train-model, labels-budget" in capsys.readouterr().err
